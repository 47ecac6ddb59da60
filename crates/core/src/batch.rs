//! Record batches (magic 2, Kafka 0.11 and later) as a fetch answer holds them, and what a copy
//! that keeps them whole does with them: the compressed records are neither decoded nor
//! compressed again; only the header fields that belong to the source's producer and log are
//! written anew, and the CRC with them.
//!
//! Three questions decide each fetched batch ([`Committed::admit`]): is it part of an aborted
//! transaction or a transaction marker (skipped, as a `read_committed` consumer skips them), can
//! the target take it as it is ([`BatchHeader::whole`]: not when compaction left gaps in its
//! offsets, or when its timestamps are the source broker's), and which producer stamp does the
//! copy carry ([`Stamp`], [`restamp`]). A batch the target cannot take as it is (gaps, the
//! broker's times, or larger than the target allows) is written anew by [`rewrite::rewrite`].

use thiserror::Error;

pub mod inflate;
pub mod records;
pub mod rewrite;
pub mod sequencer;

/// Bytes of a batch header, from its base offset to its record count.
pub const HEADER_LEN: usize = 61;
/// The base offset and batch length, which the batch length does not count.
const LOG_OVERHEAD: usize = 12;
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
/// The CRC covers everything from the attributes on.
const CRC_FROM: usize = 21;

const CODEC_MASK: i16 = 0x07;
const LOG_APPEND_TIME: i16 = 0x08;
const TRANSACTIONAL: i16 = 0x10;
const CONTROL: i16 = 0x20;
/// Control record types (the key's second int16).
const ABORT_MARKER: i16 = 0;

/// The compression codec of a batch (attributes bits 0-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Codec {
    /// The codec's bits in a batch's attributes.
    pub fn attribute(self) -> i16 {
        match self {
            Codec::None => 0,
            Codec::Gzip => 1,
            Codec::Snappy => 2,
            Codec::Lz4 => 3,
            Codec::Zstd => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Gzip => "gzip",
            Codec::Snappy => "snappy",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }
}

/// A batch header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// The whole batch's size in bytes, its base offset and length fields included.
    pub size: usize,
    pub leader_epoch: i32,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

/// Why a batch must be decoded into records rather than copied whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotWhole {
    /// Compaction removed records: the offsets have gaps, which a produce request may not
    /// carry (the target checks that a batch's offset range matches its record count).
    OffsetGaps,
    /// The source broker stamped the batch with its append time; the records' own timestamps
    /// are not the ones its readers see.
    LogAppendTime,
}

impl BatchHeader {
    pub fn codec(&self) -> Result<Codec, BatchError> {
        Ok(match self.attributes & CODEC_MASK {
            0 => Codec::None,
            1 => Codec::Gzip,
            2 => Codec::Snappy,
            3 => Codec::Lz4,
            4 => Codec::Zstd,
            codec => {
                return Err(BatchError::Codec {
                    base_offset: self.base_offset,
                    codec,
                });
            }
        })
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL != 0
    }

    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .saturating_add(i64::from(self.last_offset_delta))
    }

    /// The offset a fetch continues from after this batch.
    pub fn next_offset(&self) -> i64 {
        self.last_offset().saturating_add(1)
    }

    /// Whether the target can take the batch as it is.
    pub fn whole(&self) -> Result<(), NotWhole> {
        if i64::from(self.last_offset_delta) + 1 != i64::from(self.record_count) {
            return Err(NotWhole::OffsetGaps);
        }
        if self.attributes & LOG_APPEND_TIME != 0 {
            return Err(NotWhole::LogAppendTime);
        }
        Ok(())
    }
}

/// A fetched batch that cannot be read: the fetch answer is damaged or not Kafka's.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchError {
    #[error(
        "batch at offset {base_offset}: magic {magic}; only magic 2 (Kafka 0.11 and later) is read"
    )]
    Magic { base_offset: i64, magic: i8 },
    #[error("batch at offset {base_offset}: length {length} cannot hold a batch header")]
    Length { base_offset: i64, length: i32 },
    #[error(
        "batch at offset {base_offset}: offset delta {last_offset_delta} or record count {record_count} is negative, or the base offset is"
    )]
    Range {
        base_offset: i64,
        last_offset_delta: i32,
        record_count: i32,
    },
    #[error("batch at offset {base_offset}: compression codec {codec} is not one Kafka defines")]
    Codec { base_offset: i64, codec: i16 },
    #[error(
        "batch at offset {base_offset}: CRC {stored:#010x} stored, {computed:#010x} computed: its bytes changed after the source broker wrote them"
    )]
    Crc {
        base_offset: i64,
        stored: u32,
        computed: u32,
    },
    #[error("control batch at offset {base_offset}: its record cannot be read")]
    ControlRecord { base_offset: i64 },
}

/// One complete batch of a fetch answer.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub header: BatchHeader,
    /// `header.size` bytes, at least [`HEADER_LEN`].
    bytes: &'a [u8],
}

impl<'a> Batch<'a> {
    /// The batch as fetched.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

/// The complete batches of a fetch answer's records, in order. A fetch answer may end in part
/// of a batch (the broker cuts at the fetch's size limit): iteration stops before it, and
/// [`Batches::partial_len`] tells its size. A malformed batch ends the iteration with its error.
#[derive(Debug)]
pub struct Batches<'a> {
    rest: &'a [u8],
    failed: bool,
}

pub fn batches(records: &[u8]) -> Batches<'_> {
    Batches {
        rest: records,
        failed: false,
    }
}

impl Batches<'_> {
    /// Bytes left after the complete batches (0 once every batch was read).
    pub fn partial_len(&self) -> usize {
        self.rest.len()
    }
}

impl<'a> Iterator for Batches<'a> {
    type Item = Result<Batch<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let fixed = self.rest.first_chunk::<HEADER_LEN>()?;
        let header = match parse_header(fixed) {
            Ok(h) => h,
            Err(e) => {
                self.failed = true;
                return Some(Err(e));
            }
        };
        let (bytes, rest) = self.rest.split_at_checked(header.size)?;
        self.rest = rest;
        Some(Ok(Batch { header, bytes }))
    }
}

fn parse_header(h: &[u8; HEADER_LEN]) -> Result<BatchHeader, BatchError> {
    let base_offset = be_i64(h, 0);
    let length = be_i32(h, 8);
    let magic = i8::from_be_bytes([h[MAGIC_AT]]);
    if magic != 2 {
        return Err(BatchError::Magic { base_offset, magic });
    }
    let size = usize::try_from(length)
        .ok()
        .and_then(|l| l.checked_add(LOG_OVERHEAD))
        .filter(|&s| s >= HEADER_LEN)
        .ok_or(BatchError::Length {
            base_offset,
            length,
        })?;
    let header = BatchHeader {
        base_offset,
        size,
        leader_epoch: be_i32(h, 12),
        crc: u32::from_be_bytes([h[17], h[18], h[19], h[20]]),
        attributes: be_i16(h, 21),
        last_offset_delta: be_i32(h, 23),
        base_timestamp: be_i64(h, 27),
        max_timestamp: be_i64(h, 35),
        producer_id: be_i64(h, 43),
        producer_epoch: be_i16(h, 51),
        base_sequence: be_i32(h, 53),
        record_count: be_i32(h, 57),
    };
    if base_offset < 0 || header.last_offset_delta < 0 || header.record_count < 0 {
        return Err(BatchError::Range {
            base_offset,
            last_offset_delta: header.last_offset_delta,
            record_count: header.record_count,
        });
    }
    Ok(header)
}

/// What a `read_committed` copy does with a fetched batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Committed (or not transactional) data: copy it.
    Copy,
    /// Part of a transaction that was aborted: its readers never see it.
    Aborted,
    /// A transaction marker: the source producer's, not data; the copy's own producer writes
    /// its own markers.
    Marker,
}

/// The aborted transactions a fetch answer lists for one partition, applied to its batches in
/// order, as a `read_committed` consumer applies them: a transactional batch of a producer
/// whose aborted transaction began at or before the batch is aborted, until that producer's
/// abort marker.
#[derive(Debug, Default)]
pub struct Committed {
    /// (first offset, producer id), latest first so the next one to open is at the end.
    pending: Vec<(i64, i64)>,
    aborting: Vec<i64>,
}

impl Committed {
    /// `aborted`: the answer's (producer id, first offset) pairs, in any order.
    pub fn new(aborted: &[(i64, i64)]) -> Self {
        let mut pending: Vec<(i64, i64)> = aborted.iter().map(|&(p, o)| (o, p)).collect();
        pending.sort_unstable_by(|a, b| b.cmp(a));
        Self {
            pending,
            aborting: Vec::new(),
        }
    }

    pub fn admit(&mut self, batch: &Batch<'_>) -> Result<Admission, BatchError> {
        let h = &batch.header;
        if h.has_producer_id() {
            while let Some(&(first, producer)) = self.pending.last() {
                if first > h.last_offset() {
                    break;
                }
                self.pending.pop();
                if !self.aborting.contains(&producer) {
                    self.aborting.push(producer);
                }
            }
            if h.is_control() {
                if control_type(batch)? == ABORT_MARKER {
                    self.aborting.retain(|&p| p != h.producer_id);
                }
                return Ok(Admission::Marker);
            }
            if h.is_transactional() && self.aborting.contains(&h.producer_id) {
                return Ok(Admission::Aborted);
            }
        }
        if h.is_control() {
            return Ok(Admission::Marker);
        }
        Ok(Admission::Copy)
    }
}

/// What a fetch answer's records for one partition give a copy that reads from `offset` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToCopy {
    /// Byte ranges (within the records) of the batches to copy, in offset order.
    pub ranges: Vec<std::ops::Range<usize>>,
    /// The position after the complete batches: past those to copy, and past markers and
    /// aborted batches; `offset` when there was none.
    pub next_offset: i64,
    /// Bytes of a batch cut short at the end (a fetch's size limit).
    pub partial: usize,
}

/// Splits one partition's fetched `records` into the batches to copy ([`Committed`] with the
/// answer's `aborted` list). A broker answers from the start of the batch holding `offset`, so
/// batches that end before it are not copied again; they still go through the filter, so that
/// an aborted transaction that began in one of them is known.
pub fn to_copy(records: &[u8], aborted: &[(i64, i64)], offset: i64) -> Result<ToCopy, BatchError> {
    let mut committed = Committed::new(aborted);
    let (mut ranges, mut next_offset, mut at) = (Vec::new(), offset, 0usize);
    let mut all = batches(records);
    for b in all.by_ref() {
        let b = b?;
        let size = b.bytes().len();
        let fresh = b.header.next_offset() > next_offset;
        let admission = committed.admit(&b)?;
        if fresh {
            next_offset = b.header.next_offset();
            if admission == Admission::Copy {
                ranges.push(at..at + size);
            }
        }
        at += size;
    }
    Ok(ToCopy {
        ranges,
        next_offset,
        partial: all.partial_len(),
    })
}

/// The type of a control batch's one record (its key: int16 version, int16 type). Control
/// batches are never compressed, so the record follows the header as written.
fn control_type(batch: &Batch<'_>) -> Result<i16, BatchError> {
    let bad = BatchError::ControlRecord {
        base_offset: batch.header.base_offset,
    };
    let mut at = &batch.bytes[HEADER_LEN..];
    varint(&mut at).ok_or(bad.clone())?; // record length
    at = at.get(1..).ok_or(bad.clone())?; // attributes
    varint(&mut at).ok_or(bad.clone())?; // timestamp delta
    varint(&mut at).ok_or(bad.clone())?; // offset delta
    let key_len = varint(&mut at).ok_or(bad.clone())?;
    if key_len < 4 {
        return Err(bad);
    }
    match at.get(2..4) {
        Some(&[a, b]) => Ok(i16::from_be_bytes([a, b])),
        _ => Err(bad),
    }
}

/// A zigzag varint of up to 64 bits (records' varlongs and varints alike).
fn varint(at: &mut &[u8]) -> Option<i64> {
    let mut raw: u64 = 0;
    for i in 0..10 {
        let (&b, rest) = at.split_first()?;
        *at = rest;
        raw |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let magnitude = i64::try_from(raw >> 1).ok()?;
            return Some(if raw & 1 == 0 {
                magnitude
            } else {
                -magnitude - 1
            });
        }
    }
    None
}

/// The producer a copied batch is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// -1 for a producer without an id (no idempotence).
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    /// Written inside the copying producer's transaction.
    pub transactional: bool,
}

/// The sequence after `records` records from `sequence`: sequences wrap to 0 after
/// `i32::MAX`, as the brokers expect.
pub fn next_sequence(sequence: i32, records: i32) -> i32 {
    let records = records.max(0);
    if sequence > i32::MAX - records {
        records - (i32::MAX - sequence) - 1
    } else {
        sequence + records
    }
}

/// Appends `batch` to `out` as the target is to receive it: the source broker's CRC checked
/// (a damaged batch is not given a fresh, valid CRC), the records' bytes untouched, base offset
/// and leader epoch left to the target broker, the producer fields and transactional bit
/// those of `stamp`, and the CRC computed for the new header. The records' bytes are read once
/// for both CRCs.
pub fn restamp(batch: &Batch<'_>, stamp: &Stamp, out: &mut Vec<u8>) -> Result<(), BatchError> {
    let h = &batch.header;
    let records = &batch.bytes[HEADER_LEN..];
    let records_crc = crc32c::crc32c(records);
    let source_header = &batch.bytes[CRC_FROM..HEADER_LEN];
    let computed =
        crc32c::crc32c_combine(crc32c::crc32c(source_header), records_crc, records.len());
    if computed != h.crc {
        return Err(BatchError::Crc {
            base_offset: h.base_offset,
            stored: h.crc,
            computed,
        });
    }
    let mut attributes = h.attributes & !TRANSACTIONAL;
    if stamp.transactional {
        attributes |= TRANSACTIONAL;
    }
    let start = out.len();
    out.extend_from_slice(&0i64.to_be_bytes());
    out.extend_from_slice(&batch.bytes[8..MAGIC_AT]);
    out[start + 12..start + 16].copy_from_slice(&(-1i32).to_be_bytes());
    out.push(2);
    out.extend_from_slice(&[0; 4]); // the CRC, written last
    out.extend_from_slice(&attributes.to_be_bytes());
    out.extend_from_slice(&batch.bytes[23..43]); // offset delta and timestamps
    out.extend_from_slice(&stamp.producer_id.to_be_bytes());
    out.extend_from_slice(&stamp.producer_epoch.to_be_bytes());
    out.extend_from_slice(&stamp.base_sequence.to_be_bytes());
    out.extend_from_slice(&h.record_count.to_be_bytes());
    let header_crc = crc32c::crc32c(&out[start + CRC_FROM..]);
    let crc = crc32c::crc32c_combine(header_crc, records_crc, records.len());
    out[start + CRC_AT..start + CRC_FROM].copy_from_slice(&crc.to_be_bytes());
    out.extend_from_slice(records);
    Ok(())
}

fn be_i16(b: &[u8; HEADER_LEN], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}

fn be_i32(b: &[u8; HEADER_LEN], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be_i64(b: &[u8; HEADER_LEN], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

#[cfg(test)]
mod tests;
