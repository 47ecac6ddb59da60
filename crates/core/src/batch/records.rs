//! The records inside a batch (Kafka's record format v2), for readers that need keys and values:
//! the batch's CRC checked, its records inflated with a cap ([`super::inflate`]), then read one
//! by one with every length and count checked against the bytes left.

use std::borrow::Cow;

use thiserror::Error;

use super::inflate::{InflateError, inflate};
use super::{Batch, BatchError, CRC_FROM, HEADER_LEN, LOG_APPEND_TIME, varint};
use crate::wire::MAX_OFFSET;

/// Why the records of a batch cannot be read. Messages name the batch and the class of the
/// failure, never bytes of it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecordsError {
    #[error("batch at offset {base_offset}: its records inflate to more than {limit} bytes")]
    BatchTooLarge { base_offset: i64, limit: usize },
    #[error("batch at offset {base_offset}: {codec} records are corrupt ({what})")]
    CorruptCompression {
        base_offset: i64,
        codec: &'static str,
        what: &'static str,
    },
    #[error("batch at offset {base_offset}: record {index} is corrupt ({what})")]
    CorruptRecord {
        base_offset: i64,
        index: i32,
        what: &'static str,
    },
    #[error(transparent)]
    Batch(#[from] BatchError),
}

impl RecordsError {
    /// A low-cardinality label for metrics and for the reason a status gives.
    pub fn class(&self) -> &'static str {
        match self {
            RecordsError::BatchTooLarge { .. } => "batch_too_large",
            RecordsError::CorruptCompression { .. } => "corrupt_compression",
            RecordsError::CorruptRecord { .. } => "corrupt_record",
            RecordsError::Batch(BatchError::Crc { .. }) => "crc",
            RecordsError::Batch(_) => "corrupt_batch",
        }
    }
}

/// One record of a batch, borrowing from the inflated records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub offset: i64,
    /// The record's own time, or the broker's append time for a batch stamped with it.
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<Header<'a>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header<'a> {
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
}

/// A batch whose records were inflated (at most the cap given to [`open`]).
#[derive(Debug)]
pub struct Opened<'a> {
    batch: Batch<'a>,
    records: Cow<'a, [u8]>,
}

/// Checks `batch`'s CRC and inflates its records to at most `limit` bytes.
pub fn open<'a>(batch: &Batch<'a>, limit: usize) -> Result<Opened<'a>, RecordsError> {
    let h = &batch.header;
    let computed = crc32c::crc32c(&batch.bytes[CRC_FROM..]);
    if computed != h.crc {
        return Err(BatchError::Crc {
            base_offset: h.base_offset,
            stored: h.crc,
            computed,
        }
        .into());
    }
    let codec = h.codec()?;
    let records = inflate(codec, &batch.bytes[HEADER_LEN..], limit).map_err(|e| match e {
        InflateError::TooLarge { limit, .. } => RecordsError::BatchTooLarge {
            base_offset: h.base_offset,
            limit,
        },
        InflateError::Corrupt { codec, what } => RecordsError::CorruptCompression {
            base_offset: h.base_offset,
            codec,
            what,
        },
        // A Vec takes every chunk: only a sink of the caller's own refuses one.
        InflateError::NoMemory { codec } => RecordsError::CorruptCompression {
            base_offset: h.base_offset,
            codec,
            what: "no memory to inflate them into",
        },
    })?;
    Ok(Opened {
        batch: *batch,
        records,
    })
}

impl Opened<'_> {
    /// The batch's records in order; after an error, none.
    pub fn records(&self) -> Records<'_> {
        Records {
            header: self.batch.header,
            rest: &self.records,
            index: 0,
            failed: false,
        }
    }

    /// Bytes the records inflated to.
    pub fn inflated_len(&self) -> usize {
        self.records.len()
    }
}

/// Iterator over a batch's records; see [`Opened::records`].
#[derive(Debug)]
pub struct Records<'a> {
    header: super::BatchHeader,
    rest: &'a [u8],
    index: i32,
    failed: bool,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, RecordsError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.index >= self.header.record_count {
            if self.rest.is_empty() {
                return None;
            }
            self.failed = true;
            return Some(Err(self.corrupt("bytes follow the last record")));
        }
        let read = self.read_one();
        self.index = self.index.saturating_add(1);
        if read.is_err() {
            self.failed = true;
        }
        Some(read)
    }
}

impl<'a> Records<'a> {
    fn corrupt(&self, what: &'static str) -> RecordsError {
        RecordsError::CorruptRecord {
            base_offset: self.header.base_offset,
            index: self.index,
            what,
        }
    }

    fn read_one(&mut self) -> Result<Record<'a>, RecordsError> {
        let mut at = self.rest;
        let len = varint(&mut at).ok_or(self.corrupt("its length does not decode"))?;
        let len = usize::try_from(len).map_err(|_| self.corrupt("negative length"))?;
        let (mut body, rest) = at
            .split_at_checked(len)
            .ok_or(self.corrupt("longer than the bytes left"))?;
        self.rest = rest;
        let record = self.fields(&mut body)?;
        if !body.is_empty() {
            return Err(self.corrupt("bytes follow its headers"));
        }
        Ok(record)
    }

    fn fields(&self, body: &mut &'a [u8]) -> Result<Record<'a>, RecordsError> {
        let h = &self.header;
        let (_attributes, rest) = body.split_first().ok_or(self.corrupt("no attributes"))?;
        *body = rest;
        let ts_delta = varint(body).ok_or(self.corrupt("timestamp delta"))?;
        let offset_delta = varint(body).ok_or(self.corrupt("offset delta"))?;
        let offset = h.base_offset.saturating_add(offset_delta);
        if offset_delta < 0 || offset > MAX_OFFSET {
            return Err(self.corrupt("offset delta out of range"));
        }
        let timestamp = if h.attributes & LOG_APPEND_TIME != 0 {
            h.max_timestamp
        } else {
            h.base_timestamp.saturating_add(ts_delta)
        };
        let key = self.nullable(body, "key")?;
        let value = self.nullable(body, "value")?;
        let count = varint(body).ok_or(self.corrupt("header count"))?;
        let count = usize::try_from(count).map_err(|_| self.corrupt("negative header count"))?;
        // Each header takes at least two bytes: a larger count cannot be right, and no vector
        // is sized from it.
        if count > body.len() / 2 {
            return Err(self.corrupt("more headers than bytes left"));
        }
        let mut headers = Vec::new();
        for _ in 0..count {
            let key = self
                .nullable(body, "header key")?
                .ok_or(self.corrupt("null header key"))?;
            let value = self.nullable(body, "header value")?;
            headers.push(Header { key, value });
        }
        Ok(Record {
            offset,
            timestamp,
            key,
            value,
            headers,
        })
    }

    /// A varint length (-1 for null) and that many bytes.
    fn nullable(
        &self,
        body: &mut &'a [u8],
        what: &'static str,
    ) -> Result<Option<&'a [u8]>, RecordsError> {
        let len = varint(body).ok_or(self.corrupt(what))?;
        if len == -1 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| self.corrupt(what))?;
        let (bytes, rest) = body.split_at_checked(len).ok_or(self.corrupt(what))?;
        *body = rest;
        Ok(Some(bytes))
    }
}

#[cfg(test)]
pub(super) mod tests;
