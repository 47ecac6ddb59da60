//! Decoder for the records of Kafka's `__consumer_offsets` topic, limited to offset commits.
//!
//! The group coordinator writes one record per committed (group, topic, partition). Layouts
//! follow the group coordinator's message schemas (`OffsetCommitKey.json`,
//! `OffsetCommitValue.json`):
//! - key: INT16 key version, then for versions 0 and 1 (legacy and current offset commit)
//!   `group: STRING, topic: STRING, partition: INT32`. Every other version is another record
//!   type (2 = classic group metadata, 3+ = the new coordinator's consumer/share/streams group
//!   records) and is reported as [`Record::Other`].
//! - value: INT16 value version, then
//!   - v0: `offset: INT64, metadata: STRING, commitTimestamp: INT64`
//!   - v1: v0 + `expireTimestamp: INT64`
//!   - v2: same as v0
//!   - v3: `offset: INT64, leaderEpoch: INT32, metadata: STRING, commitTimestamp: INT64`
//!   - v4 (flexible): v3 with a COMPACT_STRING metadata, followed by tagged fields.
//!   - a null value (tombstone) means the offset was deleted.
//!
//! Readers ignore trailing bytes (later versions may append), and nothing here panics on
//! arbitrary input: every read is bounds-checked and returns a [`DecodeError`].

use thiserror::Error;

/// One decoded `__consumer_offsets` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A committed offset (`value: Some`) or its deletion (`value: None`, a tombstone).
    OffsetCommit {
        key: OffsetCommitKey,
        value: Option<OffsetCommitValue>,
    },
    /// Group metadata or any other coordinator record: not an offset.
    Other { key_version: i16 },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OffsetCommitKey {
    pub group: String,
    pub topic: String,
    pub partition: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitValue {
    /// The next offset the group will read.
    pub offset: i64,
    /// Versions 3+; `None` when absent or -1.
    pub leader_epoch: Option<i32>,
    /// Commit metadata; a null string reads as "".
    pub metadata: String,
    /// Broker time of the commit, epoch milliseconds.
    pub commit_timestamp_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("field `{field}`: needs {needed} bytes, {remaining} left")]
    Truncated {
        field: &'static str,
        needed: usize,
        remaining: usize,
    },
    #[error("field `{field}`: string is not valid UTF-8")]
    InvalidUtf8 { field: &'static str },
    #[error("field `{field}`: invalid length {len}")]
    InvalidLength { field: &'static str, len: i64 },
    #[error("field `{field}`: malformed varint")]
    BadVarint { field: &'static str },
    #[error("offset commit value version {version} is not known (0 to 4 are)")]
    UnsupportedValueVersion { version: i16 },
}

impl DecodeError {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::InvalidUtf8 { .. } => "invalid_utf8",
            DecodeError::InvalidLength { .. } => "invalid_length",
            DecodeError::BadVarint { .. } => "bad_varint",
            DecodeError::UnsupportedValueVersion { .. } => "unsupported_version",
        }
    }
}

/// Decodes one record of `__consumer_offsets`. `value` is `None` for a tombstone.
pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Record, DecodeError> {
    let mut k = Reader::new(key);
    let key_version = k.i16("keyVersion")?;
    if !(0..=1).contains(&key_version) {
        return Ok(Record::Other { key_version });
    }
    let key = OffsetCommitKey {
        group: k.string("group")?,
        topic: k.string("topic")?,
        partition: k.i32("partition")?,
    };
    let value = match value {
        None => None,
        Some(bytes) => Some(decode_value(bytes)?),
    };
    Ok(Record::OffsetCommit { key, value })
}

fn decode_value(bytes: &[u8]) -> Result<OffsetCommitValue, DecodeError> {
    let mut v = Reader::new(bytes);
    let version = v.i16("version")?;
    if !(0..=4).contains(&version) {
        return Err(DecodeError::UnsupportedValueVersion { version });
    }
    let offset = v.i64("offset")?;
    let leader_epoch = if version >= 3 {
        Some(v.i32("leaderEpoch")?).filter(|e| *e >= 0)
    } else {
        None
    };
    let metadata = if version >= 4 {
        v.compact_string("metadata")?
    } else {
        v.string("metadata")?
    };
    let commit_timestamp_ms = v.i64("commitTimestamp")?;
    if version == 1 {
        v.i64("expireTimestamp")?;
    }
    if version >= 4 {
        v.skip_tagged_fields()?;
    }
    Ok(OffsetCommitValue {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp_ms,
    })
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    fn bytes(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Truncated {
                field,
                needed: n,
                remaining: self.rest.len(),
            });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
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

    fn i16(&mut self, field: &'static str) -> Result<i16, DecodeError> {
        self.array::<2>(field).map(i16::from_be_bytes)
    }

    fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        self.array::<4>(field).map(i32::from_be_bytes)
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.array::<8>(field).map(i64::from_be_bytes)
    }

    fn utf8(&mut self, field: &'static str, len: usize) -> Result<String, DecodeError> {
        let bytes = self.bytes(field, len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::InvalidUtf8 { field })
    }

    /// STRING: INT16 length; -1 (null) reads as "" since callers treat null and empty alike.
    fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let len = self.i16(field)?;
        match len {
            -1 => Ok(String::new()),
            l if l < 0 => Err(DecodeError::InvalidLength {
                field,
                len: i64::from(l),
            }),
            // Non-negative i16 always fits in usize.
            l => self.utf8(field, l.unsigned_abs().into()),
        }
    }

    /// Unsigned LEB128 varint of at most 5 bytes (32 bits), as Kafka writes them.
    fn uvarint(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let [b] = self.array::<1>(field)?;
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

    fn usize_varint(&mut self, field: &'static str) -> Result<usize, DecodeError> {
        let v = self.uvarint(field)?;
        usize::try_from(v).map_err(|_| DecodeError::InvalidLength {
            field,
            len: i64::from(v),
        })
    }

    /// COMPACT_STRING: unsigned varint length + 1; 0 is null (read as "").
    fn compact_string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        match self.usize_varint(field)? {
            0 => Ok(String::new()),
            n => self.utf8(field, n - 1),
        }
    }

    /// Tagged fields: a count, then per field a tag, a size and that many bytes. Skipped:
    /// none are needed for offsets.
    fn skip_tagged_fields(&mut self) -> Result<(), DecodeError> {
        let count = self.uvarint("taggedFields")?;
        for _ in 0..count {
            self.uvarint("tag")?;
            let size = self.usize_varint("tagSize")?;
            self.bytes("tagData", size)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds records field by field as the JSON schemas lay them out.
    #[derive(Default)]
    struct W(Vec<u8>);

    impl W {
        fn i16(mut self, v: i16) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn i32(mut self, v: i32) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn i64(mut self, v: i64) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        fn string(self, s: &str) -> Self {
            let mut w = self.i16(i16::try_from(s.len()).unwrap());
            w.0.extend_from_slice(s.as_bytes());
            w
        }
        fn uvarint(mut self, mut v: u32) -> Self {
            loop {
                let b = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    self.0.push(b);
                    return self;
                }
                self.0.push(b | 0x80);
            }
        }
        fn compact_string(self, s: &str) -> Self {
            let mut w = self.uvarint(u32::try_from(s.len() + 1).unwrap());
            w.0.extend_from_slice(s.as_bytes());
            w
        }
        fn raw(mut self, bytes: &[u8]) -> Self {
            self.0.extend_from_slice(bytes);
            self
        }
    }

    fn key(version: i16) -> Vec<u8> {
        W::default()
            .i16(version)
            .string("g1")
            .string("orders")
            .i32(3)
            .0
    }

    fn expected_key() -> OffsetCommitKey {
        OffsetCommitKey {
            group: "g1".into(),
            topic: "orders".into(),
            partition: 3,
        }
    }

    fn commit(value: &[u8]) -> OffsetCommitValue {
        match decode(&key(1), Some(value)).unwrap() {
            Record::OffsetCommit {
                key,
                value: Some(v),
            } => {
                assert_eq!(key, expected_key());
                v
            }
            other => panic!("not a commit: {other:?}"),
        }
    }

    #[test]
    fn value_versions_0_to_2() {
        let v0 = W::default()
            .i16(0)
            .i64(42)
            .string("meta")
            .i64(1_700_000_000_000)
            .0;
        let v1 = W::default()
            .i16(1)
            .i64(42)
            .string("meta")
            .i64(1_700_000_000_000)
            .i64(1_800_000_000_000)
            .0;
        let v2 = W::default()
            .i16(2)
            .i64(42)
            .string("meta")
            .i64(1_700_000_000_000)
            .0;
        for bytes in [v0, v1, v2] {
            assert_eq!(
                commit(&bytes),
                OffsetCommitValue {
                    offset: 42,
                    leader_epoch: None,
                    metadata: "meta".into(),
                    commit_timestamp_ms: 1_700_000_000_000,
                }
            );
        }
    }

    #[test]
    fn value_version_3_has_a_leader_epoch() {
        let v3 = W::default().i16(3).i64(7).i32(5).string("").i64(123).0;
        let v = commit(&v3);
        assert_eq!(
            (v.offset, v.leader_epoch, v.commit_timestamp_ms),
            (7, Some(5), 123)
        );
        let no_epoch = W::default().i16(3).i64(7).i32(-1).string("").i64(123).0;
        assert_eq!(commit(&no_epoch).leader_epoch, None);
    }

    #[test]
    fn value_version_4_is_flexible_with_compact_strings_and_tags() {
        let long_meta = "m".repeat(300); // a two-byte varint length
        let v4 = W::default()
            .i16(4)
            .i64(99)
            .i32(2)
            .compact_string(&long_meta)
            .i64(555)
            .uvarint(2)
            .uvarint(0)
            .uvarint(3)
            .raw(&[1, 2, 3])
            .uvarint(7)
            .uvarint(0)
            .0;
        let v = commit(&v4);
        assert_eq!(v.offset, 99);
        assert_eq!(v.leader_epoch, Some(2));
        assert_eq!(v.metadata, long_meta);
        assert_eq!(v.commit_timestamp_ms, 555);
        // Null compact string, no tags.
        let null_meta = W::default()
            .i16(4)
            .i64(1)
            .i32(0)
            .uvarint(0)
            .i64(2)
            .uvarint(0)
            .0;
        assert_eq!(commit(&null_meta).metadata, "");
    }

    #[test]
    fn legacy_key_version_0_is_an_offset_commit_too() {
        let value = W::default().i16(3).i64(1).i32(0).string("").i64(2).0;
        assert!(matches!(
            decode(&key(0), Some(&value)),
            Ok(Record::OffsetCommit { value: Some(_), .. })
        ));
    }

    #[test]
    fn tombstone_is_a_deletion() {
        assert_eq!(
            decode(&key(1), None).unwrap(),
            Record::OffsetCommit {
                key: expected_key(),
                value: None
            }
        );
    }

    #[test]
    fn group_metadata_and_new_coordinator_records_are_skipped() {
        for version in [2, 3, 4, 5, 11, 17, -1, i16::MAX] {
            let key = W::default().i16(version).string("g1").0;
            assert_eq!(
                decode(&key, Some(&[0, 0, 1])).unwrap(),
                Record::Other {
                    key_version: version
                }
            );
        }
    }

    #[test]
    fn unknown_value_version_and_truncation_are_errors() {
        let v9 = W::default().i16(9).i64(1).0;
        assert_eq!(
            decode(&key(1), Some(&v9)),
            Err(DecodeError::UnsupportedValueVersion { version: 9 })
        );
        let short = W::default().i16(3).i64(1).0;
        assert!(matches!(
            decode(&key(1), Some(&short)),
            Err(DecodeError::Truncated {
                field: "leaderEpoch",
                ..
            })
        ));
        let bad_len = W::default().i16(1).i16(-2).0;
        assert!(matches!(
            decode(&bad_len, None),
            Err(DecodeError::InvalidLength { field: "group", .. })
        ));
    }

    #[test]
    fn trailing_bytes_are_ignored() {
        let mut value = W::default().i16(2).i64(8).string("").i64(9).0;
        value.extend_from_slice(b"future");
        assert_eq!(commit(&value).offset, 8);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        // Every truncation of a valid record.
        let v4 = W::default()
            .i16(4)
            .i64(99)
            .i32(2)
            .compact_string("abc")
            .i64(555)
            .uvarint(1)
            .uvarint(0)
            .uvarint(2)
            .raw(&[1, 2])
            .0;
        let k = key(1);
        for i in 0..=k.len() {
            assert!(decode(&k[..i], Some(&v4)).is_err() || i == k.len());
        }
        for i in 0..=v4.len() {
            assert_eq!(decode(&k, Some(&v4[..i])).is_ok(), i == v4.len(), "{i}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_random_records(
            key_version in 0i16..3,
            value_version in 0i16..6,
            key_tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48),
            value_tail in proptest::option::of(
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)
            ),
        ) {
            let mut key = key_version.to_be_bytes().to_vec();
            key.extend_from_slice(&key_tail);
            let value = value_tail.map(|tail| {
                let mut v = value_version.to_be_bytes().to_vec();
                v.extend_from_slice(&tail);
                v
            });
            let _ = decode(&key, value.as_deref());
        }
    }
}
