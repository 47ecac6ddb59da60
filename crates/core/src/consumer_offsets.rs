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

use crate::wire::{DecodeError, Reader};

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

/// Decodes one record of `__consumer_offsets`. `value` is `None` for a tombstone.
pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Record, DecodeError> {
    let mut k = Reader::new(key);
    let key_version = k.i16("keyVersion")?;
    if !(0..=1).contains(&key_version) {
        return Ok(Record::Other { key_version });
    }
    let key = OffsetCommitKey {
        group: k.nullable_string("group")?,
        topic: k.nullable_string("topic")?,
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
    let version = v.version("valueVersion", 4)?;
    let offset = v.i64("offset")?;
    let leader_epoch = if version >= 3 {
        Some(v.i32("leaderEpoch")?).filter(|e| *e >= 0)
    } else {
        None
    };
    let metadata = if version >= 4 {
        v.compact_nullable_string("metadata")?
    } else {
        v.nullable_string("metadata")?
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fields::Fields as W;

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
            Err(DecodeError::UnsupportedVersion {
                field: "valueVersion",
                version: 9,
                newest: 4
            })
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
        assert_eq!(
            decode(&bad_len, None),
            Err(DecodeError::NegativeLength {
                field: "group",
                len: -2
            })
        );
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
