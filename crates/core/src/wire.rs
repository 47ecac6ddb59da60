//! Kafka `protocol.types` primitives: those MirrorMaker 2 uses for its internal records, and
//! those the group coordinator's `__consumer_offsets` records add.
//!
//! MM2's records: big-endian integers and `STRING` = int16 byte length + UTF-8 bytes. There are
//! no tags, no struct length prefix and no nullable strings, so a record is just its fields
//! back to back. `__consumer_offsets` adds nullable strings and, in its flexible versions,
//! unsigned varints, `COMPACT_STRING` and tagged fields; only [`Reader`] knows those.

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
    #[error("field `{field}`: negative string length {len} (not a null this field allows)")]
    NegativeLength { field: &'static str, len: i16 },
    #[error("field `{field}`: string is not valid UTF-8")]
    InvalidUtf8 { field: &'static str },
    #[error("field `{field}`: unsupported version {version} (the newest known is {newest})")]
    UnsupportedVersion {
        field: &'static str,
        version: i16,
        newest: i16,
    },
    #[error("field `{field}`: malformed varint")]
    BadVarint { field: &'static str },
    #[error("field `{field}`: negative value {value}")]
    Negative { field: &'static str, value: i64 },
    #[error("field `{field}`: offset {value} is beyond any real log (at most {MAX_OFFSET})")]
    OffsetTooLarge { field: &'static str, value: i64 },
    #[error("field `{field}`: {value} outside {min}..={max}")]
    OutOfRange {
        field: &'static str,
        value: i64,
        min: i64,
        max: i64,
    },
    #[error("field `{field}`: {got} where {expected} was expected")]
    Mismatch {
        field: &'static str,
        expected: i64,
        got: i64,
    },
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
            DecodeError::BadVarint { .. } => "bad_varint",
            DecodeError::Negative { .. } => "negative_value",
            DecodeError::OffsetTooLarge { .. } => "offset_too_large",
            DecodeError::OutOfRange { .. } => "out_of_range",
            DecodeError::Mismatch { .. } => "mismatch",
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
    #[error("field `{field}`: {len} elements or bytes exceed the int32 length limit")]
    TooLong { field: &'static str, len: usize },
    #[error("field `{field}`: written before the topic it belongs to")]
    NoTopic { field: &'static str },
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

    pub(crate) fn i8(&mut self, v: i8) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(crate) fn i16(&mut self, v: i16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(crate) fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(crate) fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// An array's or a byte string's int32 length.
    pub(crate) fn len(&mut self, field: &'static str, n: usize) -> Result<&mut Self, EncodeError> {
        let n = i32::try_from(n).map_err(|_| EncodeError::TooLong { field, len: n })?;
        Ok(self.i32(n))
    }

    /// Nullable `STRING`: `None` is written as length -1.
    pub(crate) fn nullable_string(
        &mut self,
        field: &'static str,
        s: Option<&str>,
    ) -> Result<&mut Self, EncodeError> {
        match s {
            Some(s) => self.string(field, s),
            None => Ok(self.i16(-1)),
        }
    }

    /// The buffer written so far, for fields whose bytes another module writes in place.
    pub(crate) fn buf_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buf
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

    /// Unsigned LEB128 varint, as flexible versions write lengths and counts.
    pub(crate) fn uvarint(&mut self, mut v: u32) -> &mut Self {
        loop {
            let low = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(low);
                return self;
            }
            self.buf.push(low | 0x80);
        }
    }

    /// A `COMPACT_ARRAY`'s length: the count + 1 as an unsigned varint.
    pub(crate) fn compact_len(
        &mut self,
        field: &'static str,
        n: usize,
    ) -> Result<&mut Self, EncodeError> {
        let v = u32::try_from(n)
            .ok()
            .and_then(|n| n.checked_add(1))
            .filter(|&v| v <= i32::MAX as u32)
            .ok_or(EncodeError::TooLong { field, len: n })?;
        Ok(self.uvarint(v))
    }

    /// `COMPACT_STRING`, at most [`MAX_STRING_LEN`] bytes as every string of a request.
    pub(crate) fn compact_string(
        &mut self,
        field: &'static str,
        s: &str,
    ) -> Result<&mut Self, EncodeError> {
        if s.len() > MAX_STRING_LEN {
            return Err(EncodeError::StringTooLong {
                field,
                len: s.len(),
            });
        }
        self.compact_len(field, s.len())?;
        self.buf.extend_from_slice(s.as_bytes());
        Ok(self)
    }

    /// No tagged fields: the single zero byte that ends every flexible structure.
    pub(crate) fn no_tagged_fields(&mut self) -> &mut Self {
        self.buf.push(0);
        self
    }
}

/// Reads fields from the front of a byte slice; trailing bytes are left unread, as MM2 and the
/// group coordinator do.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    fn truncated(&self, field: &'static str, needed: usize) -> DecodeError {
        DecodeError::Truncated {
            field,
            needed,
            remaining: self.rest.len(),
        }
    }

    fn take<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let (head, tail) = self
            .rest
            .split_first_chunk::<N>()
            .ok_or_else(|| self.truncated(field, N))?;
        self.rest = tail;
        Ok(*head)
    }

    fn bytes(&mut self, field: &'static str, len: usize) -> Result<&'a [u8], DecodeError> {
        let (head, tail) = self
            .rest
            .split_at_checked(len)
            .ok_or_else(|| self.truncated(field, len))?;
        self.rest = tail;
        Ok(head)
    }

    pub(crate) fn i8(&mut self, field: &'static str) -> Result<i8, DecodeError> {
        self.take::<1>(field).map(i8::from_be_bytes)
    }

    pub(crate) fn i16(&mut self, field: &'static str) -> Result<i16, DecodeError> {
        self.take::<2>(field).map(i16::from_be_bytes)
    }

    pub(crate) fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        self.take::<4>(field).map(i32::from_be_bytes)
    }

    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.take::<8>(field).map(i64::from_be_bytes)
    }

    /// What is left unread.
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }

    /// An array's element count; a null array (-1) reads as empty. Each element takes at least
    /// one byte, so a count beyond what is left ends in a truncation, not a long loop.
    pub(crate) fn array_len(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        match self.i32(field)? {
            -1 => Ok(0),
            n => {
                let n = usize::try_from(n).map_err(|_| DecodeError::Negative {
                    field,
                    value: i64::from(n),
                })?;
                if n > self.rest.len() {
                    return Err(self.truncated(field, n));
                }
                Ok(n)
            }
        }
    }

    /// Nullable `BYTES` (int32 length); null reads as empty.
    pub(crate) fn nullable_bytes(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        match self.i32(field)? {
            -1 => Ok(&[]),
            n => {
                let n = usize::try_from(n).map_err(|_| DecodeError::Negative {
                    field,
                    value: i64::from(n),
                })?;
                self.bytes(field, n)
            }
        }
    }

    /// A version field: the version when it is 0 to `newest`.
    pub(crate) fn version(&mut self, field: &'static str, newest: i16) -> Result<i16, DecodeError> {
        match self.i16(field)? {
            version if (0..=newest).contains(&version) => Ok(version),
            version => Err(DecodeError::UnsupportedVersion {
                field,
                version,
                newest,
            }),
        }
    }

    pub(crate) fn non_negative_i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        let v = self.i32(field)?;
        if v < 0 {
            return Err(DecodeError::Negative {
                field,
                value: i64::from(v),
            });
        }
        Ok(v)
    }

    pub(crate) fn non_negative_i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        let v = self.i64(field)?;
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

    /// `STRING`; null (length -1) is refused.
    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let len = self.i16(field)?;
        self.string_of_len(field, len)
    }

    /// Nullable `STRING`; null reads as "" since callers treat null and empty alike.
    pub(crate) fn nullable_string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        match self.i16(field)? {
            -1 => Ok(String::new()),
            len => self.string_of_len(field, len),
        }
    }

    fn string_of_len(&mut self, field: &'static str, len: i16) -> Result<String, DecodeError> {
        let len = usize::try_from(len).map_err(|_| DecodeError::NegativeLength { field, len })?;
        self.utf8(field, len)
    }

    fn utf8(&mut self, field: &'static str, len: usize) -> Result<String, DecodeError> {
        let bytes = self.bytes(field, len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::InvalidUtf8 { field })
    }

    /// Unsigned LEB128 varint of at most 5 bytes (32 bits), as Kafka writes them.
    pub(crate) fn uvarint(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let [b] = self.take::<1>(field)?;
            let part = u32::from(b & 0x7f);
            if i == 4 && part > 0x0f {
                return Err(DecodeError::BadVarint { field });
            }
            value |= part << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::BadVarint { field })
    }

    /// A varint length. One beyond `usize` (only where `usize` is under 32 bits) saturates:
    /// no input holds that many bytes, so reading them reports a truncation.
    fn uvarint_len(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let v = self.uvarint(field)?;
        Ok(usize::try_from(v).unwrap_or(usize::MAX))
    }

    /// Nullable `COMPACT_STRING`: unsigned varint length + 1; 0 is null, read as "".
    pub(crate) fn compact_nullable_string(
        &mut self,
        field: &'static str,
    ) -> Result<String, DecodeError> {
        match self.uvarint_len(field)?.checked_sub(1) {
            None => Ok(String::new()),
            Some(len) => self.utf8(field, len),
        }
    }

    /// Non-null `COMPACT_STRING`.
    pub(crate) fn compact_string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        match self.uvarint_len(field)?.checked_sub(1) {
            None => Err(DecodeError::NegativeLength { field, len: -1 }),
            Some(len) => self.utf8(field, len),
        }
    }

    /// A `COMPACT_ARRAY`'s element count (null reads as empty), at most the bytes left: each
    /// element takes at least one, so a forged count ends in a truncation before anything is
    /// allocated for it.
    pub(crate) fn compact_array_len(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        match self.uvarint_len(field)?.checked_sub(1) {
            None => Ok(0),
            Some(n) if n > self.rest.len() => Err(self.truncated(field, n)),
            Some(n) => Ok(n),
        }
    }

    /// A UUID's 16 bytes, skipped (topics are named by the answers that carry one).
    pub(crate) fn skip_uuid(&mut self, field: &'static str) -> Result<(), DecodeError> {
        self.take::<16>(field).map(|_| ())
    }

    /// Tagged fields: a count, then per field a tag, a size and that many bytes. Skipped: no
    /// reader here needs one. Each field takes at least two bytes, so a huge count ends in a
    /// truncation, not a long loop.
    pub(crate) fn skip_tagged_fields(&mut self) -> Result<(), DecodeError> {
        let count = self.uvarint("taggedFields")?;
        for _ in 0..count {
            self.uvarint("tag")?;
            let size = self.uvarint_len("tagSize")?;
            self.bytes("tagData", size)?;
        }
        Ok(())
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
    fn only_minus_one_is_a_null_string_and_only_where_nullable() {
        assert_eq!(
            Reader::new(&[0xff, 0xff]).nullable_string("s"),
            Ok(String::new())
        );
        assert_eq!(
            Reader::new(&[0xff, 0xfe]).nullable_string("s"),
            Err(DecodeError::NegativeLength {
                field: "s",
                len: -2
            })
        );
        assert_eq!(
            Reader::new(&[0x00]).compact_nullable_string("s"),
            Ok(String::new())
        );
    }

    #[test]
    fn a_varint_beyond_32_bits_is_malformed() {
        let max = [0xff, 0xff, 0xff, 0xff, 0x0f];
        assert_eq!(Reader::new(&max).uvarint("n"), Ok(u32::MAX));
        for bytes in [&[0xff, 0xff, 0xff, 0xff, 0x10][..], &[0x80; 6]] {
            assert_eq!(
                Reader::new(bytes).uvarint("n"),
                Err(DecodeError::BadVarint { field: "n" })
            );
        }
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
