//! The Kafka requests a copy that keeps record batches whole needs, in their last versions
//! without tagged fields: ApiVersions v0, Metadata v8 ([`metadata`]), ListOffsets v4
//! ([`list_offsets`]), Fetch v11, Produce v8, InitProducerId v1, and SASL's SaslHandshake v1
//! and SaslAuthenticate v1; and what the operator's probe asks besides: ListGroups v2
//! ([`list_groups`]); and a share group's start offsets, found, read and set with
//! FindCoordinator v2, DescribeShareGroupOffsets v0 and AlterShareGroupOffsets v0 (flexible
//! versions: [`share_offsets`]); and a streams group's members, with StreamsGroupDescribe v0
//! ([`streams_groups`]). Requests are
//! encoded into whole frames (size, header v1, body); answers are decoded from a frame's body
//! after the correlation id ([`answer_body`]). Decoding is bounded by the answer's own bytes
//! and never panics; every malformed field is a [`DecodeError`] naming it.
//!
//! No I/O here: the connection that sends these frames lives with the code that uses it.

use crate::wire::{DecodeError, EncodeError, Reader, Writer};

pub mod list_groups;
pub mod list_offsets;
pub mod metadata;
pub mod share_offsets;
pub mod streams_groups;

pub const API_PRODUCE: i16 = 0;
pub const API_FETCH: i16 = 1;
pub const API_LIST_OFFSETS: i16 = 2;
pub const API_METADATA: i16 = 3;
pub const API_LIST_GROUPS: i16 = 16;
pub const API_INIT_PRODUCER_ID: i16 = 22;
pub const API_SASL_HANDSHAKE: i16 = 17;
pub const API_VERSIONS: i16 = 18;
pub const API_SASL_AUTHENTICATE: i16 = 36;
pub const API_FIND_COORDINATOR: i16 = 10;
pub const API_DESCRIBE_SHARE_GROUP_OFFSETS: i16 = 90;
pub const API_ALTER_SHARE_GROUP_OFFSETS: i16 = 91;
pub const FIND_COORDINATOR_VERSION: i16 = 2;
pub const DESCRIBE_SHARE_GROUP_OFFSETS_VERSION: i16 = 0;
pub const ALTER_SHARE_GROUP_OFFSETS_VERSION: i16 = 0;
pub const API_STREAMS_GROUP_DESCRIBE: i16 = 89;
pub const STREAMS_GROUP_DESCRIBE_VERSION: i16 = 0;
pub const FETCH_VERSION: i16 = 11;
pub const LIST_OFFSETS_VERSION: i16 = 4;
pub const METADATA_VERSION: i16 = 8;
pub const LIST_GROUPS_VERSION: i16 = 2;
pub const PRODUCE_VERSION: i16 = 8;
pub const INIT_PRODUCER_ID_VERSION: i16 = 1;
pub const SASL_HANDSHAKE_VERSION: i16 = 1;
pub const SASL_AUTHENTICATE_VERSION: i16 = 1;

/// A Kafka error code, named for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub i16);

impl ErrorCode {
    pub const NONE: Self = Self(0);
    pub const OFFSET_OUT_OF_RANGE: Self = Self(1);
    pub const CORRUPT_MESSAGE: Self = Self(2);
    pub const UNKNOWN_TOPIC_OR_PARTITION: Self = Self(3);
    pub const LEADER_NOT_AVAILABLE: Self = Self(5);
    pub const NOT_LEADER_OR_FOLLOWER: Self = Self(6);
    pub const REQUEST_TIMED_OUT: Self = Self(7);
    /// A client's own code for a connection that failed (no broker answers it).
    pub const NETWORK_EXCEPTION: Self = Self(13);
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: Self = Self(45);
    pub const DUPLICATE_SEQUENCE_NUMBER: Self = Self(46);

    pub fn is_error(self) -> bool {
        self != Self::NONE
    }

    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "NONE",
            1 => "OFFSET_OUT_OF_RANGE",
            2 => "CORRUPT_MESSAGE",
            3 => "UNKNOWN_TOPIC_OR_PARTITION",
            5 => "LEADER_NOT_AVAILABLE",
            6 => "NOT_LEADER_OR_FOLLOWER",
            7 => "REQUEST_TIMED_OUT",
            10 => "MESSAGE_TOO_LARGE",
            13 => "NETWORK_EXCEPTION",
            14 => "COORDINATOR_LOAD_IN_PROGRESS",
            15 => "COORDINATOR_NOT_AVAILABLE",
            16 => "NOT_COORDINATOR",
            17 => "INVALID_TOPIC_EXCEPTION",
            18 => "RECORD_LIST_TOO_LARGE",
            19 => "NOT_ENOUGH_REPLICAS",
            20 => "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
            29 => "TOPIC_AUTHORIZATION_FAILED",
            30 => "GROUP_AUTHORIZATION_FAILED",
            31 => "CLUSTER_AUTHORIZATION_FAILED",
            32 => "INVALID_TIMESTAMP",
            33 => "UNSUPPORTED_SASL_MECHANISM",
            34 => "ILLEGAL_SASL_STATE",
            35 => "UNSUPPORTED_VERSION",
            44 => "POLICY_VIOLATION",
            45 => "OUT_OF_ORDER_SEQUENCE_NUMBER",
            46 => "DUPLICATE_SEQUENCE_NUMBER",
            47 => "INVALID_PRODUCER_EPOCH",
            42 => "INVALID_REQUEST",
            58 => "SASL_AUTHENTICATION_FAILED",
            59 => "UNKNOWN_PRODUCER_ID",
            68 => "NON_EMPTY_GROUP",
            69 => "GROUP_ID_NOT_FOUND",
            74 => "FENCED_LEADER_EPOCH",
            75 => "UNKNOWN_LEADER_EPOCH",
            76 => "UNSUPPORTED_COMPRESSION_TYPE",
            87 => "INVALID_RECORD",
            90 => "PRODUCER_FENCED",
            _ => "error",
        }
    }

    /// Errors that say the partition's leader moved or is not known: ask for metadata again.
    pub fn is_leadership(self) -> bool {
        matches!(self.0, 3 | 5 | 6 | 74 | 75)
    }

    /// Errors a write of the same records gets again until someone changes the target (a
    /// topic's limits or ACLs, a policy): too large, not authorized, invalid records.
    pub fn refuses_the_records(self) -> bool {
        matches!(self.0, 10 | 18 | 29 | 31 | 32 | 44 | 76 | 87)
    }

    /// Errors a client sends the same request again for (after new metadata where the leader
    /// moved), as Kafka's clients do.
    pub fn is_retriable(self) -> bool {
        matches!(self.0, 2 | 3 | 5 | 6 | 7 | 14 | 15 | 16 | 19 | 20 | 74 | 75)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Starts a request frame: size (written by [`finish_frame`]), header v1.
fn frame(
    api: i16,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    capacity: usize,
) -> Result<Writer, EncodeError> {
    let mut w = Writer::with_capacity(capacity.saturating_add(32 + client_id.len()));
    w.i32(0).i16(api).i16(version).i32(correlation_id);
    w.string("client_id", client_id)?;
    Ok(w)
}

/// A flexible request's frame: header v2 is header v1 and its (empty) tagged fields.
fn flexible_frame(
    api: i16,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    capacity: usize,
) -> Result<Writer, EncodeError> {
    let mut w = frame(api, version, correlation_id, client_id, capacity)?;
    w.no_tagged_fields();
    Ok(w)
}

fn finish_frame(mut w: Writer) -> Result<Vec<u8>, EncodeError> {
    let buf = w.buf_mut();
    let size = buf.len() - 4;
    let size = i32::try_from(size).map_err(|_| EncodeError::TooLong {
        field: "request",
        len: size,
    })?;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    Ok(w.finish())
}

/// The body of an answer frame (the bytes after its size), checked to answer `correlation_id`:
/// a broker answers a connection's requests in order.
pub fn answer_body(frame: &[u8], correlation_id: i32) -> Result<&[u8], DecodeError> {
    let mut r = Reader::new(frame);
    let got = r.i32("correlation_id")?;
    if got != correlation_id {
        return Err(DecodeError::Mismatch {
            field: "correlation_id",
            expected: i64::from(correlation_id),
            got: i64::from(got),
        });
    }
    Ok(r.rest())
}

/// ApiVersions v0: what the broker serves.
pub fn api_versions_request(correlation_id: i32, client_id: &str) -> Result<Vec<u8>, EncodeError> {
    finish_frame(frame(API_VERSIONS, 0, correlation_id, client_id, 0)?)
}

/// One API's served versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiRange {
    pub api: i16,
    pub min: i16,
    pub max: i16,
}

pub fn decode_api_versions(body: &[u8]) -> Result<(ErrorCode, Vec<ApiRange>), DecodeError> {
    let mut r = Reader::new(body);
    let error = ErrorCode(r.i16("error_code")?);
    let mut served = Vec::new();
    for _ in 0..r.array_len("api_keys")? {
        served.push(ApiRange {
            api: r.i16("api_key")?,
            min: r.i16("min_version")?,
            max: r.i16("max_version")?,
        });
    }
    Ok((error, served))
}

/// Whether a fetch sees records of open and aborted transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    ReadUncommitted,
    /// Up to the last stable offset, with the aborted transactions listed.
    ReadCommitted,
}

/// One partition to fetch from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchPartition {
    pub partition: i32,
    pub offset: i64,
    pub max_bytes: i32,
}

/// A Fetch v11 request without a fetch session (every partition named every time).
#[derive(Debug, Clone)]
pub struct FetchRequest<'a> {
    pub max_wait_ms: i32,
    pub min_bytes: i32,
    pub max_bytes: i32,
    pub isolation: Isolation,
    pub topics: Vec<(&'a str, Vec<FetchPartition>)>,
}

impl<'a> FetchRequest<'a> {
    /// One topic's `partitions`, `read_committed`, answered as soon as there is a byte or
    /// after 100 ms.
    pub fn committed(topic: &'a str, partitions: Vec<FetchPartition>, max_bytes: i32) -> Self {
        Self {
            max_wait_ms: 100,
            min_bytes: 1,
            max_bytes,
            isolation: Isolation::ReadCommitted,
            topics: vec![(topic, partitions)],
        }
    }
}

pub fn fetch_request(
    correlation_id: i32,
    client_id: &str,
    f: &FetchRequest<'_>,
) -> Result<Vec<u8>, EncodeError> {
    let partitions: usize = f.topics.iter().map(|(_, p)| p.len()).sum();
    let mut w = frame(
        API_FETCH,
        FETCH_VERSION,
        correlation_id,
        client_id,
        64 + 28 * partitions,
    )?;
    w.i32(-1) // replica id: a consumer
        .i32(f.max_wait_ms)
        .i32(f.min_bytes)
        .i32(f.max_bytes)
        .i8(match f.isolation {
            Isolation::ReadUncommitted => 0,
            Isolation::ReadCommitted => 1,
        })
        .i32(0) // no session
        .i32(-1); // session epoch: a full fetch
    w.len("topics", f.topics.len())?;
    for (topic, partitions) in &f.topics {
        w.string("topic", topic)?;
        w.len("partitions", partitions.len())?;
        for p in partitions {
            w.i32(p.partition)
                .i32(-1) // current leader epoch: not checked
                .i64(p.offset)
                .i64(-1) // log start offset: a consumer's
                .i32(p.max_bytes);
        }
    }
    w.i32(0); // forgotten topics
    w.string("rack_id", "")?;
    finish_frame(w)
}

/// One partition of a fetch answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedPartition<'a> {
    pub partition: i32,
    pub error: ErrorCode,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// (producer id, first offset) of the aborted transactions the records overlap
    /// (`read_committed` only).
    pub aborted: Vec<(i64, i64)>,
    /// Record batches, the last possibly cut short ([`crate::batch::batches`]).
    pub records: &'a [u8],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchAnswer<'a> {
    pub throttle_ms: i32,
    pub error: ErrorCode,
    pub topics: Vec<(String, Vec<FetchedPartition<'a>>)>,
}

pub fn decode_fetch(body: &[u8]) -> Result<FetchAnswer<'_>, DecodeError> {
    let mut r = Reader::new(body);
    let throttle_ms = r.i32("throttle_time_ms")?;
    let error = ErrorCode(r.i16("error_code")?);
    r.i32("session_id")?;
    let mut topics = Vec::new();
    for _ in 0..r.array_len("responses")? {
        let topic = r.string("topic")?;
        let mut partitions = Vec::new();
        for _ in 0..r.array_len("partitions")? {
            let partition = r.i32("partition_index")?;
            let error = ErrorCode(r.i16("error_code")?);
            let high_watermark = r.i64("high_watermark")?;
            let last_stable_offset = r.i64("last_stable_offset")?;
            let log_start_offset = r.i64("log_start_offset")?;
            let mut aborted = Vec::new();
            for _ in 0..r.array_len("aborted_transactions")? {
                aborted.push((r.i64("producer_id")?, r.i64("first_offset")?));
            }
            r.i32("preferred_read_replica")?;
            let records = r.nullable_bytes("records")?;
            partitions.push(FetchedPartition {
                partition,
                error,
                high_watermark,
                last_stable_offset,
                log_start_offset,
                aborted,
                records,
            });
        }
        topics.push((topic, partitions));
    }
    Ok(FetchAnswer {
        throttle_ms,
        error,
        topics,
    })
}

/// A Produce v8 request, written as it is built so that record batches go straight into the
/// frame ([`Self::partition`]).
#[derive(Debug)]
pub struct ProduceRequest {
    w: Writer,
    topics: usize,
    topics_at: usize,
    /// Where the current topic's partition count goes, and the count so far.
    partitions_at: Option<(usize, usize)>,
}

impl ProduceRequest {
    /// `acks`: -1 for all in-sync replicas.
    pub fn new(
        correlation_id: i32,
        client_id: &str,
        transactional_id: Option<&str>,
        acks: i16,
        timeout_ms: i32,
        capacity: usize,
    ) -> Result<Self, EncodeError> {
        let mut w = frame(
            API_PRODUCE,
            PRODUCE_VERSION,
            correlation_id,
            client_id,
            capacity,
        )?;
        w.nullable_string("transactional_id", transactional_id)?;
        w.i16(acks).i32(timeout_ms);
        let topics_at = w.buf_mut().len();
        w.i32(0);
        Ok(Self {
            w,
            topics: 0,
            topics_at,
            partitions_at: None,
        })
    }

    /// Starts the next topic's partitions.
    pub fn topic(&mut self, name: &str) -> Result<(), EncodeError> {
        self.close_topic()?;
        self.w.string("topic", name)?;
        let at = self.w.buf_mut().len();
        self.w.i32(0);
        self.partitions_at = Some((at, 0));
        self.topics += 1;
        Ok(())
    }

    /// Adds a partition of the current topic whose record batches `write` appends; when it
    /// fails, the request is left as it was before.
    pub fn partition<E>(
        &mut self,
        partition: i32,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E>
    where
        E: From<EncodeError>,
    {
        let Some((_, count)) = self.partitions_at.as_mut() else {
            return Err(EncodeError::NoTopic { field: "partition" }.into());
        };
        *count += 1;
        let buf = self.w.buf_mut();
        let start = buf.len();
        buf.extend_from_slice(&partition.to_be_bytes());
        buf.extend_from_slice(&[0; 4]);
        if let Err(e) = write(buf) {
            buf.truncate(start);
            if let Some((_, count)) = self.partitions_at.as_mut() {
                *count -= 1;
            }
            return Err(e);
        }
        let len = buf.len() - start - 8;
        let len = i32::try_from(len).map_err(|_| EncodeError::TooLong {
            field: "records",
            len,
        })?;
        buf[start + 4..start + 8].copy_from_slice(&len.to_be_bytes());
        Ok(())
    }

    fn close_topic(&mut self) -> Result<(), EncodeError> {
        if let Some((at, count)) = self.partitions_at.take() {
            patch_len(self.w.buf_mut(), at, "partitions", count)?;
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<Vec<u8>, EncodeError> {
        self.close_topic()?;
        patch_len(self.w.buf_mut(), self.topics_at, "topics", self.topics)?;
        finish_frame(self.w)
    }
}

fn patch_len(buf: &mut [u8], at: usize, field: &'static str, n: usize) -> Result<(), EncodeError> {
    let n = i32::try_from(n).map_err(|_| EncodeError::TooLong { field, len: n })?;
    buf[at..at + 4].copy_from_slice(&n.to_be_bytes());
    Ok(())
}

/// One partition of a produce answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducedPartition {
    pub partition: i32,
    pub error: ErrorCode,
    /// The offset the target gave the first record written.
    pub base_offset: i64,
    pub log_start_offset: i64,
    /// Why the broker refused the request, with the index of each batch it refused.
    pub message: String,
    pub record_errors: Vec<(i32, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceAnswer {
    pub topics: Vec<(String, Vec<ProducedPartition>)>,
    pub throttle_ms: i32,
}

pub fn decode_produce(body: &[u8]) -> Result<ProduceAnswer, DecodeError> {
    let mut r = Reader::new(body);
    let mut topics = Vec::new();
    for _ in 0..r.array_len("responses")? {
        let topic = r.string("name")?;
        let mut partitions = Vec::new();
        for _ in 0..r.array_len("partition_responses")? {
            let partition = r.i32("index")?;
            let error = ErrorCode(r.i16("error_code")?);
            let base_offset = r.i64("base_offset")?;
            r.i64("log_append_time_ms")?;
            let log_start_offset = r.i64("log_start_offset")?;
            let mut record_errors = Vec::new();
            for _ in 0..r.array_len("record_errors")? {
                record_errors.push((
                    r.i32("batch_index")?,
                    r.nullable_string("batch_index_error_message")?,
                ));
            }
            let message = r.nullable_string("error_message")?;
            partitions.push(ProducedPartition {
                partition,
                error,
                base_offset,
                log_start_offset,
                message,
                record_errors,
            });
        }
        topics.push((topic, partitions));
    }
    let throttle_ms = r.i32("throttle_time_ms")?;
    Ok(ProduceAnswer {
        topics,
        throttle_ms,
    })
}

/// InitProducerId v1: a producer id and epoch for idempotent (or, with an id, transactional)
/// writes.
pub fn init_producer_id_request(
    correlation_id: i32,
    client_id: &str,
    transactional_id: Option<&str>,
    transaction_timeout_ms: i32,
) -> Result<Vec<u8>, EncodeError> {
    let mut w = frame(
        API_INIT_PRODUCER_ID,
        INIT_PRODUCER_ID_VERSION,
        correlation_id,
        client_id,
        16,
    )?;
    w.nullable_string("transactional_id", transactional_id)?;
    w.i32(transaction_timeout_ms);
    finish_frame(w)
}

/// (error, producer id, producer epoch).
pub fn decode_init_producer_id(body: &[u8]) -> Result<(ErrorCode, i64, i16), DecodeError> {
    let mut r = Reader::new(body);
    r.i32("throttle_time_ms")?;
    Ok((
        ErrorCode(r.i16("error_code")?),
        r.i64("producer_id")?,
        r.i16("producer_epoch")?,
    ))
}

/// SaslHandshake v1: the mechanism the client will authenticate with (the exchange itself
/// then goes in SaslAuthenticate requests).
pub fn sasl_handshake_request(
    correlation_id: i32,
    client_id: &str,
    mechanism: &str,
) -> Result<Vec<u8>, EncodeError> {
    let mut w = frame(
        API_SASL_HANDSHAKE,
        SASL_HANDSHAKE_VERSION,
        correlation_id,
        client_id,
        16,
    )?;
    w.string("mechanism", mechanism)?;
    finish_frame(w)
}

/// (error, the mechanisms the broker enables).
pub fn decode_sasl_handshake(body: &[u8]) -> Result<(ErrorCode, Vec<String>), DecodeError> {
    let mut r = Reader::new(body);
    let error = ErrorCode(r.i16("error_code")?);
    let mut mechanisms = Vec::new();
    for _ in 0..r.array_len("mechanisms")? {
        mechanisms.push(r.string("mechanism")?);
    }
    Ok((error, mechanisms))
}

/// SaslAuthenticate v1: one message of the mechanism's exchange.
pub fn sasl_authenticate_request(
    correlation_id: i32,
    client_id: &str,
    auth_bytes: &[u8],
) -> Result<Vec<u8>, EncodeError> {
    let mut w = frame(
        API_SASL_AUTHENTICATE,
        SASL_AUTHENTICATE_VERSION,
        correlation_id,
        client_id,
        auth_bytes.len() + 4,
    )?;
    w.len("auth_bytes", auth_bytes.len())?;
    w.buf_mut().extend_from_slice(auth_bytes);
    finish_frame(w)
}

/// A SaslAuthenticate answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslAnswer<'a> {
    pub error: ErrorCode,
    pub message: String,
    pub auth_bytes: &'a [u8],
    /// How long the broker keeps the session before the client must authenticate again (0:
    /// no limit).
    pub session_lifetime_ms: i64,
}

pub fn decode_sasl_authenticate(body: &[u8]) -> Result<SaslAnswer<'_>, DecodeError> {
    let mut r = Reader::new(body);
    Ok(SaslAnswer {
        error: ErrorCode(r.i16("error_code")?),
        message: r.nullable_string("error_message")?,
        auth_bytes: r.nullable_bytes("auth_bytes")?,
        session_lifetime_ms: r.i64("session_lifetime_ms")?,
    })
}

#[cfg(test)]
mod tests;
