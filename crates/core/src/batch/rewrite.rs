//! A source batch the target cannot take as it is, written anew as batches it can take.
//!
//! A whole-batch copy writes the source's batches unchanged but for the producer stamp
//! ([`super::restamp`]). Three kinds of batch cannot go that way: compaction left gaps in the
//! record offsets (a produce request's batch must have contiguous offset deltas), the source
//! broker stamped it with its append time (the target would keep the producer's times, not the
//! ones the source's readers saw), or it is larger than the target's `max.message.bytes`.
//! [`rewrite`] reads such a batch's records (bounded by an inflate limit) and writes them again:
//!
//! - one output batch per run of contiguous source offsets, and more than one when a run does
//!   not fit the target's limit, so that a batch of `n` records written at target offset `t`
//!   stands for source offsets `base..base + n` at `t..t + n`, as an unchanged batch does;
//! - record fields byte for byte (keys, values, headers, nulls kept), offset deltas `0..n`, each
//!   record's own time for a CreateTime batch and the batch's append time (its max timestamp,
//!   what the source's readers saw) for a LogAppendTime batch, written as CreateTime;
//! - no producer stamp (id, epoch and sequence -1, not transactional): the writer restamps the
//!   batch as it restamps a batch copied whole;
//! - the source's codec, at its fastest level (the copy's CPU per byte is what MirrorFlow keeps
//!   low), in the form Kafka's Java clients write it: gzip, lz4 frames of independent 64 KiB
//!   blocks (Kafka's lz4 reader decodes each block alone), zstd frames without a checksum, and
//!   snappy in xerial-framed 32 KiB blocks, which Kafka's brokers read with snappy-java (its
//!   reader also takes one raw block, as [`super::inflate`] does, but framing is what every Java
//!   producer writes). Records whose compressed form is not smaller, or that take fewer than 64
//!   bytes, are written uncompressed.
//!
//! Each output batch is sized by its records' uncompressed bytes: compression only makes it
//! smaller, so every batch fits the limit in one pass whatever the codec does with the bytes. A
//! record that needs a batch larger than the limit on its own, compressed or not, is an error
//! naming its offset: no target write could take it.
//!
//! Kafka 4.3's own batch reader and produce validation read every codec written here as a
//! producer's batch, kept as written rather than rebuilt (`tests/kafka/ReadRewrites.java`).

use std::io::Write;

use thiserror::Error;

use super::inflate::{XERIAL_HEADER_LEN, XERIAL_MAGIC};
use super::records::{self, Record, RecordsError};
use super::{Batch, BatchHeader, CRC_AT, CRC_FROM, Codec, HEADER_LEN, LOG_OVERHEAD};

/// A batch's length field is an int32: no batch is larger, whatever limit is given.
const MAX_BATCH: usize = i32::MAX as usize;
/// The most bytes a record's batch adds to the record's inflated bytes: a header when it is
/// alone in its batch, 9 more for a time delta of 10 bytes that took 1, and 1 more for its
/// length. An offset delta only shrinks (a batch starts at or after the source batch's base),
/// and compressed records are kept only when smaller.
pub const GROWTH_PER_RECORD: usize = HEADER_LEN + 10;
/// Records shorter than this are written uncompressed: a codec's framing (9 to 20 bytes) takes
/// most of what it could save, and a compressor's state is not set up for a lone small record
/// between compaction gaps.
const COMPRESS_FROM: usize = 64;
/// The uncompressed bytes of each xerial snappy block, as snappy-java writes them.
const SNAPPY_BLOCK: usize = 32 * 1024;
/// xerial's stream version and the oldest version that reads it.
const XERIAL_VERSION: i32 = 1;

/// One batch written by [`rewrite`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The source offset of its first record; its records are at source offsets
    /// `base_offset..base_offset + record_count`.
    pub base_offset: i64,
    pub record_count: i32,
    /// A complete record batch (magic 2), its CRC valid, as a producer writes it: base offset 0
    /// (the target assigns offsets; a broker given another base rebuilds the batch), leader
    /// epoch -1, no producer stamp, CreateTime, offset deltas `0..record_count`.
    pub bytes: Vec<u8>,
}

impl Rewritten {
    /// The source offset after its last record.
    pub fn next_offset(&self) -> i64 {
        self.base_offset
            .saturating_add(i64::from(self.record_count))
    }
}

/// Why a batch cannot be rewritten. Messages name offsets and sizes, never bytes of records.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RewriteError {
    #[error(
        "record at offset {offset} needs a batch of {size} bytes on its own, more than the target takes ({max} bytes, its max.message.bytes)"
    )]
    RecordTooLarge {
        offset: i64,
        size: usize,
        max: usize,
    },
    #[error(
        "batch at offset {base_offset}: record offset {offset} does not follow the one before it within the batch's offsets"
    )]
    Offsets { base_offset: i64, offset: i64 },
    #[error("control batch at offset {base_offset}: a transaction marker is not data to rewrite")]
    Control { base_offset: i64 },
    #[error("batch at offset {base_offset}: {codec} compression of its records failed")]
    Compress {
        base_offset: i64,
        codec: &'static str,
    },
    #[error(transparent)]
    Records(#[from] RecordsError),
}

impl RewriteError {
    /// A low-cardinality label for metrics and for the reason a status gives.
    pub fn class(&self) -> &'static str {
        match self {
            RewriteError::RecordTooLarge { .. } => "record_too_large",
            RewriteError::Offsets { .. } => "corrupt_record",
            RewriteError::Control { .. } => "control_batch",
            RewriteError::Compress { .. } => "compress",
            RewriteError::Records(e) => e.class(),
        }
    }
}

/// `batch`'s records as batches the target takes as they are, in source offset order: one per
/// run of contiguous source offsets, split where a run does not fit `max_batch_bytes` (the
/// target topic's `max.message.bytes`: bytes of one batch, its header included). The records
/// are inflated to at most `inflate_limit` bytes. A batch whose records were all compacted
/// away gives no batch.
///
/// For example, a compacted lz4 batch at offset 100 holding offsets 100-102 and 105 gives two
/// lz4 batches, (100, 3 records) and (105, 1 record); the caller restamps and writes each, and
/// the one written at target offset `t` maps source offsets `100..103` to `t..t + 3`. A batch
/// the source broker stamped with its append time gives the same records in CreateTime
/// batches, each record's time being that append time.
///
/// Memory: the inflated records (at most `inflate_limit` bytes) and the output, which holds at
/// most [`GROWTH_PER_RECORD`] bytes more per record than the inflated records (a header per
/// batch, and a time delta that may take more bytes than it did): about the inflated size for
/// ordinary records, at most 12 times it for minimal records (7 bytes) each alone between gaps.
///
/// Errors: a record that does not fit the limit alone ([`RewriteError::RecordTooLarge`], the
/// partition cannot go on past it), and a batch whose bytes are not a valid batch (CRC,
/// compression, record framing, offsets that go back or past the batch's last offset, a
/// transaction marker).
pub fn rewrite(
    batch: &Batch<'_>,
    inflate_limit: usize,
    max_batch_bytes: usize,
) -> Result<Vec<Rewritten>, RewriteError> {
    rewrite_range(batch, i64::MIN..i64::MAX, inflate_limit, max_batch_bytes)
}

/// [`rewrite`] of the batch's records with offsets in `offsets` only: a copy resuming inside a
/// batch (from a position another copy stored after a record of it) writes the records it
/// has not copied yet, and one that cannot write a record of it ([`RewriteError::RecordTooLarge`])
/// writes the records before that one. The output still stands exactly for their offsets.
/// Every record is read and checked; the others are left out. A range that holds none of the
/// batch's records gives no batch.
pub fn rewrite_range(
    batch: &Batch<'_>,
    offsets: std::ops::Range<i64>,
    inflate_limit: usize,
    max_batch_bytes: usize,
) -> Result<Vec<Rewritten>, RewriteError> {
    rewrite_range_before_refusal(batch, offsets, inflate_limit, max_batch_bytes)
        .map_err(|r| r.error)
}

/// Why [`rewrite_range_before_refusal`] could not write all the records, and what it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub error: RewriteError,
    /// For [`RewriteError::RecordTooLarge`]: the records before the one no batch can hold, as
    /// [`rewrite_range`] writes them (`offsets` cut at that record). Empty for any other error.
    pub before: Vec<Rewritten>,
}

/// [`rewrite_range`], with the records before a record no batch can hold written in the same
/// pass: a copy that writes what it can and stops at that record would otherwise inflate the
/// batch a second time for them.
pub fn rewrite_range_before_refusal(
    batch: &Batch<'_>,
    offsets: std::ops::Range<i64>,
    inflate_limit: usize,
    max_batch_bytes: usize,
) -> Result<Vec<Rewritten>, Refused> {
    let anew = write_anew(
        std::slice::from_ref(batch),
        Options {
            offsets,
            inflate_limit,
            max_batch_bytes,
            keep_codec: false,
        },
    );
    anew.map(|m| m.batches)
}

/// What [`merge`] wrote, and the bytes its input's records inflated to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    pub batches: Vec<Rewritten>,
    pub inflated: usize,
}

/// Consecutive batches of one partition, in offset order, written as few batches as the
/// target takes: their records go into one output batch while their source offsets follow each
/// other and it fits `max_batch_bytes`, exactly as [`rewrite`] writes one batch's records
/// (which is this with one batch). Many small batches (a partition written a record or two at
/// a time) become one, so a copy writes one batch per request where it would have written
/// each of them in a request of its own (a produce request carries one batch per partition).
///
/// The records of all of them inflate to at most `inflate_limit` bytes together. The output
/// keeps the first batch's codec wherever the compressed batch fits the limit (a copy of whole
/// batches keeps the producer's codec; only a merged batch of a few tiny records may grow by
/// it). Errors as [`rewrite`]'s, for any of the batches, and [`RewriteError::Offsets`] when a
/// batch's records do not come after the one before it.
pub fn merge(
    batches: &[Batch<'_>],
    inflate_limit: usize,
    max_batch_bytes: usize,
) -> Result<Merged, RewriteError> {
    let options = Options {
        offsets: i64::MIN..i64::MAX,
        inflate_limit,
        max_batch_bytes,
        keep_codec: true,
    };
    write_anew(batches, options).map_err(|r| r.error)
}

/// How [`write_anew`] writes: records outside `offsets` are left out; `keep_codec` as
/// [`Writer::keep_codec`].
struct Options {
    offsets: std::ops::Range<i64>,
    inflate_limit: usize,
    max_batch_bytes: usize,
    keep_codec: bool,
}

impl From<RewriteError> for Refused {
    fn from(error: RewriteError) -> Self {
        Refused {
            error,
            before: Vec::new(),
        }
    }
}

impl From<RecordsError> for Refused {
    fn from(error: RecordsError) -> Self {
        RewriteError::from(error).into()
    }
}

/// [`merge`], and with one batch [`rewrite_range_before_refusal`].
fn write_anew(batches: &[Batch<'_>], o: Options) -> Result<Merged, Refused> {
    let Options {
        offsets,
        inflate_limit,
        max_batch_bytes,
        keep_codec,
    } = o;
    let mut writer: Option<Writer> = None;
    let mut inflated = 0_usize;
    let mut previous: Option<i64> = None;
    for batch in batches {
        let h = &batch.header;
        if h.is_control() {
            return Err(RewriteError::Control {
                base_offset: h.base_offset,
            }
            .into());
        }
        let opened = records::open(batch, inflate_limit.saturating_sub(inflated))?;
        inflated = inflated.saturating_add(opened.inflated_len());
        let writer = match &mut writer {
            Some(w) => w,
            None => writer.insert(Writer {
                source_base: h.base_offset,
                codec: h.codec().map_err(RecordsError::from)?,
                keep_codec,
                max: max_batch_bytes.min(MAX_BATCH),
                pending: Pending::default(),
                scratch: Vec::new(),
                out: Vec::new(),
            }),
        };
        for record in opened.records() {
            let record = record?;
            check_offset(h, previous, record.offset)?;
            let follows = previous.is_some_and(|p| p.saturating_add(1) == record.offset);
            if offsets.contains(&record.offset)
                && let Err(error) = writer.push(&record, follows)
            {
                return Err(writer.refused(error));
            }
            previous = Some(record.offset);
        }
    }
    let batches = match writer {
        Some(mut w) => match w.seal() {
            Ok(()) => w.out,
            Err(error) => return Err(w.refused(error)),
        },
        None => Vec::new(),
    };
    Ok(Merged { batches, inflated })
}

/// Record offsets rise within a batch (and from one merged batch to the next) and end at its
/// last offset at the latest (compaction keeps a batch's last offset delta): anything else
/// would map source offsets twice.
fn check_offset(h: &BatchHeader, previous: Option<i64>, offset: i64) -> Result<(), RewriteError> {
    let rises = previous.is_none_or(|p| offset > p);
    if rises && offset <= h.last_offset() {
        return Ok(());
    }
    Err(RewriteError::Offsets {
        base_offset: h.base_offset,
        offset,
    })
}

/// The output batches so far and the one being filled.
struct Writer {
    source_base: i64,
    codec: Codec,
    /// Compressed with `codec` wherever that fits `max`, smaller or not; otherwise only when
    /// smaller, and never below [`COMPRESS_FROM`] bytes.
    keep_codec: bool,
    max: usize,
    pending: Pending,
    /// One record's body, before its length prefix.
    scratch: Vec<u8>,
    out: Vec<Rewritten>,
}

/// Records of contiguous source offsets, encoded against the first one's offset and time.
#[derive(Default)]
struct Pending {
    base_offset: i64,
    base_timestamp: i64,
    max_timestamp: i64,
    count: i32,
    plain: Vec<u8>,
}

impl Writer {
    /// Appends `record` to the pending batch when it follows its last record and fits;
    /// otherwise seals the pending batch and starts the next one with it.
    fn push(&mut self, record: &Record<'_>, follows: bool) -> Result<(), RewriteError> {
        let p = &mut self.pending;
        if p.count > 0 && follows {
            let at = p.plain.len();
            put_record(
                record,
                p.base_offset,
                p.base_timestamp,
                &mut self.scratch,
                &mut p.plain,
            );
            if HEADER_LEN.saturating_add(p.plain.len()) <= self.max {
                p.count = p.count.saturating_add(1);
                p.max_timestamp = p.max_timestamp.max(record.timestamp);
                return Ok(());
            }
            p.plain.truncate(at);
        }
        self.seal()?;
        let p = &mut self.pending;
        p.base_offset = record.offset;
        p.base_timestamp = record.timestamp;
        p.max_timestamp = record.timestamp;
        p.count = 1;
        put_record(
            record,
            p.base_offset,
            p.base_timestamp,
            &mut self.scratch,
            &mut p.plain,
        );
        Ok(())
    }

    /// The pending records, if any, as an output batch. Only a batch of one record can be
    /// larger than the limit: a record joins a batch only when the batch still fits.
    fn seal(&mut self) -> Result<(), RewriteError> {
        if self.pending.count == 0 {
            return Ok(());
        }
        let p = std::mem::take(&mut self.pending);
        let (codec, body) = self.smaller(p.plain)?;
        let size = HEADER_LEN.saturating_add(body.len());
        if size > self.max {
            return Err(RewriteError::RecordTooLarge {
                offset: p.base_offset,
                size,
                max: self.max,
            });
        }
        let header = Header {
            base_timestamp: p.base_timestamp,
            max_timestamp: p.max_timestamp,
            count: p.count,
        };
        self.out.push(Rewritten {
            base_offset: p.base_offset,
            record_count: p.count,
            bytes: batch_bytes(&header, codec, &body),
        });
        Ok(())
    }

    /// `plain` compressed with the source's codec, or as it is when that is not smaller (see
    /// [`Self::keep_codec`]).
    fn smaller(&self, plain: Vec<u8>) -> Result<(Codec, Vec<u8>), RewriteError> {
        if self.codec == Codec::None || (!self.keep_codec && plain.len() < COMPRESS_FROM) {
            return Ok((Codec::None, plain));
        }
        let compressed = compress(self.codec, &plain).ok_or(RewriteError::Compress {
            base_offset: self.source_base,
            codec: self.codec.name(),
        })?;
        let fits = HEADER_LEN.saturating_add(compressed.len()) <= self.max;
        if compressed.len() < plain.len() || (self.keep_codec && fits) {
            Ok((self.codec, compressed))
        } else {
            Ok((Codec::None, plain))
        }
    }

    /// `error`, with the batches written before it when it is a record no batch can hold
    /// (they are complete: [`Self::seal`] refuses only a batch of that one record).
    fn refused(&mut self, error: RewriteError) -> Refused {
        let before = match error {
            RewriteError::RecordTooLarge { .. } => std::mem::take(&mut self.out),
            _ => Vec::new(),
        };
        Refused { error, before }
    }
}

/// The fields of an output batch's header that depend on its records.
struct Header {
    base_timestamp: i64,
    max_timestamp: i64,
    count: i32,
}

/// A complete batch around `body` (the records, compressed with `codec`), its CRC computed.
/// `body` is at most `MAX_BATCH - HEADER_LEN` bytes (checked by the caller).
fn batch_bytes(h: &Header, codec: Codec, body: &[u8]) -> Vec<u8> {
    let length = i32::try_from(HEADER_LEN - LOG_OVERHEAD + body.len()).unwrap_or(i32::MAX);
    let mut b = Vec::with_capacity(HEADER_LEN + body.len());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&length.to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes()); // leader epoch: the target's
    b.push(2);
    b.extend_from_slice(&[0; 4]); // the CRC, written last
    b.extend_from_slice(&codec.attribute().to_be_bytes()); // CreateTime, no transaction
    b.extend_from_slice(&h.count.saturating_sub(1).to_be_bytes());
    b.extend_from_slice(&h.base_timestamp.to_be_bytes());
    b.extend_from_slice(&h.max_timestamp.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    b.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    b.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    b.extend_from_slice(&h.count.to_be_bytes());
    b.extend_from_slice(body);
    let crc = crc32c::crc32c(&b[CRC_FROM..]);
    b[CRC_AT..CRC_FROM].copy_from_slice(&crc.to_be_bytes());
    b
}

/// Appends `record` to `out` as record format v2, its offset and time as deltas from the
/// batch's base. `scratch` holds the body while its length is not yet known.
fn put_record(
    record: &Record<'_>,
    base_offset: i64,
    base_timestamp: i64,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) {
    scratch.clear();
    scratch.push(0); // record attributes: none defined
    put_varint(record.timestamp.saturating_sub(base_timestamp), scratch);
    put_varint(record.offset.saturating_sub(base_offset), scratch);
    put_nullable(record.key, scratch);
    put_nullable(record.value, scratch);
    put_len(record.headers.len(), scratch);
    for h in &record.headers {
        put_nullable(Some(h.key), scratch);
        put_nullable(h.value, scratch);
    }
    put_len(scratch.len(), out);
    out.extend_from_slice(scratch);
}

fn put_nullable(bytes: Option<&[u8]>, out: &mut Vec<u8>) {
    match bytes {
        None => put_varint(-1, out),
        Some(b) => {
            put_len(b.len(), out);
            out.extend_from_slice(b);
        }
    }
}

/// A length: bytes read from inflated records, so far below `i64::MAX`.
fn put_len(len: usize, out: &mut Vec<u8>) {
    put_varint(i64::try_from(len).unwrap_or(i64::MAX), out);
}

/// A zigzag varint (records' varlongs and varints alike; a value that fits 32 bits is written
/// the same either way).
fn put_varint(v: i64, out: &mut Vec<u8>) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// `plain` compressed with `codec` as Kafka's Java clients write it; `None` only if an encoder
/// refuses (none does for bytes in memory).
fn compress(codec: Codec, plain: &[u8]) -> Option<Vec<u8>> {
    match codec {
        Codec::None => Some(plain.to_vec()),
        Codec::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(plain).ok()?;
            e.finish().ok()
        }
        Codec::Lz4 => {
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent);
            let mut e = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
            e.write_all(plain).ok()?;
            e.finish().ok()
        }
        // A compressor per frame, not one kept (which is 40% faster for a frame of 1 KB):
        // between frames ruzstd 0.9.1 resets its matcher and Huffman table but keeps its last
        // FSE tables, harmless only while it never repeats one (it does not yet); a frame that
        // repeated an earlier frame's table would be unreadable.
        Codec::Zstd => Some(ruzstd::encoding::compress_to_vec(
            plain,
            ruzstd::encoding::CompressionLevel::Fastest,
        )),
        Codec::Snappy => xerial_snappy(plain),
    }
}

/// snappy-java's stream format: its header, then each block's compressed length (int32) and
/// the block as raw snappy.
fn xerial_snappy(plain: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(XERIAL_HEADER_LEN);
    out.extend_from_slice(&XERIAL_MAGIC);
    out.extend_from_slice(&XERIAL_VERSION.to_be_bytes());
    out.extend_from_slice(&XERIAL_VERSION.to_be_bytes());
    let mut encoder = snap::raw::Encoder::new();
    for block in plain.chunks(SNAPPY_BLOCK) {
        let compressed = encoder.compress_vec(block).ok()?;
        let len = u32::try_from(compressed.len()).ok()?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&compressed);
    }
    Some(out)
}

#[cfg(test)]
mod tests;
