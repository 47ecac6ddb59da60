//! Kafka `protocol.types` primitives as MirrorMaker 2 uses them for its internal records.
//!
//! Big-endian integers and `STRING` = int16 byte length + UTF-8 bytes. There are no tags, no
//! struct length prefix and no nullable strings, so a record is just its fields back to back.

use thiserror::Error;

/// Largest byte length a Kafka `STRING` can carry (its length prefix is a signed int16).
pub const MAX_STRING_LEN: usize = i16::MAX as usize;

/// Why bytes read from an MM2 topic could not be turned into a record.
///
/// Every variant names the field, so a bad record in a topic can be reported precisely.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("field `{field}`: needs {needed} more bytes, {remaining} left")]
    Truncated {
        field: &'static str,
        needed: usize,
        remaining: usize,
    },
    #[error("field `{field}`: negative string length {len} (null strings are not valid here)")]
    NegativeLength { field: &'static str, len: i16 },
    #[error("field `{field}`: string is not valid UTF-8")]
    InvalidUtf8 { field: &'static str },
    #[error("field `{field}`: unsupported version {version} (only 0 is known)")]
    UnsupportedVersion { field: &'static str, version: i16 },
    #[error("field `{field}`: negative value {value}")]
    Negative { field: &'static str, value: i64 },
    #[error("field `{field}`: offset {value} is beyond any real log (at most {MAX_OFFSET})")]
    OffsetTooLarge { field: &'static str, value: i64 },
}

/// The largest offset a decoded record may carry: 2^62, far beyond any log Kafka can hold (a
/// billion records a second for 146 years). Bounding offsets where they enter keeps every later
/// `offset + 1` and difference of two offsets in range, whatever a topic holds.
pub const MAX_OFFSET: i64 = 1 << 62;

impl DecodeError {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::NegativeLength { .. } => "negative_length",
            DecodeError::InvalidUtf8 { .. } => "invalid_utf8",
            DecodeError::UnsupportedVersion { .. } => "unsupported_version",
            DecodeError::Negative { .. } => "negative_value",
            DecodeError::OffsetTooLarge { .. } => "offset_too_large",
        }
    }
}

/// Why a record was refused for writing: MM2's readers would crash on it or misread it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    #[error("field `{field}`: string of {len} bytes exceeds the Kafka STRING limit of 32767")]
    StringTooLong { field: &'static str, len: usize },
    #[error("field `{field}`: negative value {value} would crash MirrorMaker 2 readers")]
    Negative { field: &'static str, value: i64 },
    #[error("field `{field}`: offset {value} is beyond any real log (at most {MAX_OFFSET})")]
    OffsetTooLarge { field: &'static str, value: i64 },
}

/// Appends fields to a record buffer, refusing values MM2 cannot read back.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: Vec::with_capacity(capacity),
        }
    }

    pub(crate) fn i16(&mut self, v: i16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// A non-negative int32 (partitions).
    pub(crate) fn non_negative_i32(
        &mut self,
        field: &'static str,
        v: i32,
    ) -> Result<&mut Self, EncodeError> {
        if v < 0 {
            return Err(EncodeError::Negative {
                field,
                value: i64::from(v),
            });
        }
        self.buf.extend_from_slice(&v.to_be_bytes());
        Ok(self)
    }

    /// A non-negative int64 (offsets, timestamps).
    pub(crate) fn non_negative_i64(
        &mut self,
        field: &'static str,
        v: i64,
    ) -> Result<&mut Self, EncodeError> {
        if v < 0 {
            return Err(EncodeError::Negative { field, value: v });
        }
        self.buf.extend_from_slice(&v.to_be_bytes());
        Ok(self)
    }

    /// An offset: what [`Reader::offset`] reads back, nothing it would refuse.
    pub(crate) fn offset(&mut self, field: &'static str, v: i64) -> Result<&mut Self, EncodeError> {
        if v > MAX_OFFSET {
            return Err(EncodeError::OffsetTooLarge { field, value: v });
        }
        self.non_negative_i64(field, v)
    }

    pub(crate) fn string(
        &mut self,
        field: &'static str,
        s: &str,
    ) -> Result<&mut Self, EncodeError> {
        let len = i16::try_from(s.len()).map_err(|_| EncodeError::StringTooLong {
            field,
            len: s.len(),
        })?;
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(s.as_bytes());
        Ok(self)
    }

    pub(crate) fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// Reads fields from the front of a byte slice; trailing bytes are left unread, as MM2 does.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    fn take<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let (head, tail) = self
            .rest
            .split_first_chunk::<N>()
            .ok_or(DecodeError::Truncated {
                field,
                needed: N,
                remaining: self.rest.len(),
            })?;
        self.rest = tail;
        Ok(*head)
    }

    pub(crate) fn i16(&mut self, field: &'static str) -> Result<i16, DecodeError> {
        self.take::<2>(field).map(i16::from_be_bytes)
    }

    pub(crate) fn version0(&mut self, field: &'static str) -> Result<(), DecodeError> {
        match self.i16(field)? {
            0 => Ok(()),
            version => Err(DecodeError::UnsupportedVersion { field, version }),
        }
    }

    pub(crate) fn non_negative_i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        let v = self.take::<4>(field).map(i32::from_be_bytes)?;
        if v < 0 {
            return Err(DecodeError::Negative {
                field,
                value: i64::from(v),
            });
        }
        Ok(v)
    }

    pub(crate) fn non_negative_i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        let v = self.take::<8>(field).map(i64::from_be_bytes)?;
        if v < 0 {
            return Err(DecodeError::Negative { field, value: v });
        }
        Ok(v)
    }

    /// An offset: non-negative and at most [`MAX_OFFSET`].
    pub(crate) fn offset(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        let v = self.non_negative_i64(field)?;
        if v > MAX_OFFSET {
            return Err(DecodeError::OffsetTooLarge { field, value: v });
        }
        Ok(v)
    }

    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let len = self.i16(field)?;
        let len = usize::try_from(len).map_err(|_| DecodeError::NegativeLength { field, len })?;
        if self.rest.len() < len {
            return Err(DecodeError::Truncated {
                field,
                needed: len,
                remaining: self.rest.len(),
            });
        }
        let (bytes, tail) = self.rest.split_at(len);
        self.rest = tail;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::InvalidUtf8 { field })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_length_limit_is_32767_bytes() {
        let ok = "a".repeat(MAX_STRING_LEN);
        let too_long = "a".repeat(MAX_STRING_LEN + 1);
        assert!(Writer::default().string("s", &ok).is_ok());
        assert_eq!(
            Writer::default().string("s", &too_long).err(),
            Some(EncodeError::StringTooLong {
                field: "s",
                len: MAX_STRING_LEN + 1
            })
        );
    }

    #[test]
    fn negative_string_length_is_a_typed_error() {
        let err = Reader::new(&[0xff, 0xff]).string("group").unwrap_err();
        assert_eq!(
            err,
            DecodeError::NegativeLength {
                field: "group",
                len: -1
            }
        );
        assert_eq!(err.metric_label(), "negative_length");
    }

    #[test]
    fn string_longer_than_input_is_truncated_not_a_panic() {
        let err = Reader::new(&[0x00, 0x05, b'a'])
            .string("topic")
            .unwrap_err();
        assert_eq!(
            err,
            DecodeError::Truncated {
                field: "topic",
                needed: 5,
                remaining: 1
            }
        );
    }
}
