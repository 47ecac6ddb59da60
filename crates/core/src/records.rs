//! The three MirrorMaker 2 record types, byte-identical to MM2's own encoding.
//!
//! Decoding validates the same invariants encoding enforces (version 0, non-negative offsets,
//! partitions and timestamps, valid UTF-8), so anything that decodes re-encodes to the same
//! bytes, minus any trailing bytes, which readers ignore as MM2 does.

use super::sync::CopyStart;
#[cfg(test)]
use super::wire::MAX_OFFSET;
use super::wire::{DecodeError, EncodeError, Reader, Writer};

/// A topic name and partition number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Key and value bytes of one record, ready to produce (always to partition 0 of its topic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRecord {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// A consumer group's translated position, written to `<source>.checkpoints.internal`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub group: String,
    /// The TARGET-side (renamed) topic and its partition.
    pub topic_partition: TopicPartition,
    /// The group's committed offset on the source.
    pub upstream_offset: i64,
    /// The translated offset on the target.
    pub downstream_offset: i64,
    /// The commit metadata; MM2 writes "" for null.
    pub metadata: String,
}

impl Checkpoint {
    pub fn encode(&self) -> Result<EncodedRecord, EncodeError> {
        let key = Writer::with_capacity(8 + self.group.len() + self.topic_partition.topic.len())
            .string("group", &self.group)?
            .string("topic", &self.topic_partition.topic)?
            .non_negative_i32("partition", self.topic_partition.partition)?
            .finish();
        let value = Writer::with_capacity(20 + self.metadata.len())
            .i16(0)
            .offset("upstreamOffset", self.upstream_offset)?
            .offset("offset", self.downstream_offset)?
            .string("metadata", &self.metadata)?
            .finish();
        Ok(EncodedRecord { key, value })
    }

    pub fn decode(key: &[u8], value: &[u8]) -> Result<Self, DecodeError> {
        let mut k = Reader::new(key);
        let group = k.string("group")?;
        let topic = k.string("topic")?;
        let partition = k.non_negative_i32("partition")?;
        let mut v = Reader::new(value);
        v.version("version", 0)?;
        let upstream_offset = v.offset("upstreamOffset")?;
        let downstream_offset = v.offset("offset")?;
        let metadata = v.string("metadata")?;
        Ok(Self {
            group,
            topic_partition: TopicPartition { topic, partition },
            upstream_offset,
            downstream_offset,
            metadata,
        })
    }
}

/// Proof of life of a replication flow, written every second to `heartbeats` on the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub source_alias: String,
    pub target_alias: String,
    /// Epoch milliseconds; also the Kafka record timestamp.
    pub timestamp_ms: i64,
}

impl Heartbeat {
    pub fn encode(&self) -> Result<EncodedRecord, EncodeError> {
        let key = Writer::with_capacity(4 + self.source_alias.len() + self.target_alias.len())
            .string("sourceClusterAlias", &self.source_alias)?
            .string("targetClusterAlias", &self.target_alias)?
            .finish();
        let value = Writer::with_capacity(10)
            .i16(0)
            .non_negative_i64("timestamp", self.timestamp_ms)?
            .finish();
        Ok(EncodedRecord { key, value })
    }

    pub fn decode(key: &[u8], value: &[u8]) -> Result<Self, DecodeError> {
        let mut k = Reader::new(key);
        let source_alias = k.string("sourceClusterAlias")?;
        let target_alias = k.string("targetClusterAlias")?;
        let mut v = Reader::new(value);
        v.version("version", 0)?;
        let timestamp_ms = v.non_negative_i64("timestamp")?;
        Ok(Self {
            source_alias,
            target_alias,
            timestamp_ms,
        })
    }
}

/// One known (source offset, target offset) pair of a replicated record.
///
/// Written to `mm2-offset-syncs.<alias>.internal`; the value has no version field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetSync {
    /// The SOURCE topic and partition.
    pub topic_partition: TopicPartition,
    pub upstream_offset: i64,
    pub downstream_offset: i64,
    /// Where the copy started reading the partition, when below this sync's record: carried
    /// in a header ([`crate::SYNC_START_HEADER`]), outside MM2's key and value.
    pub start: Option<CopyStart>,
}

impl OffsetSync {
    pub fn new(
        topic_partition: TopicPartition,
        upstream_offset: i64,
        downstream_offset: i64,
    ) -> Self {
        Self {
            topic_partition,
            upstream_offset,
            downstream_offset,
            start: None,
        }
    }

    pub fn encode(&self) -> Result<EncodedRecord, EncodeError> {
        let key = Writer::with_capacity(6 + self.topic_partition.topic.len())
            .string("topic", &self.topic_partition.topic)?
            .non_negative_i32("partition", self.topic_partition.partition)?
            .finish();
        let value = Writer::with_capacity(16)
            .offset("upstreamOffset", self.upstream_offset)?
            .offset("offset", self.downstream_offset)?
            .finish();
        Ok(EncodedRecord { key, value })
    }

    pub fn decode(key: &[u8], value: &[u8]) -> Result<Self, DecodeError> {
        let mut k = Reader::new(key);
        let topic = k.string("topic")?;
        let partition = k.non_negative_i32("partition")?;
        let mut v = Reader::new(value);
        let upstream_offset = v.offset("upstreamOffset")?;
        let downstream_offset = v.offset("offset")?;
        Ok(Self {
            topic_partition: TopicPartition { topic, partition },
            upstream_offset,
            downstream_offset,
            start: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn offsets_beyond_any_real_log_are_refused_both_ways() {
        let tp = TopicPartition {
            topic: "t".into(),
            partition: 0,
        };
        let key = OffsetSync::new(tp.clone(), 0, 0).encode().unwrap().key;
        for (up, down) in [(i64::MAX, 1), (1, i64::MAX), (MAX_OFFSET + 1, 0)] {
            assert!(matches!(
                OffsetSync::new(tp.clone(), up, down).encode(),
                Err(EncodeError::OffsetTooLarge { .. })
            ));
            // What another writer could put in the topic: read, and refused.
            let value = [up.to_be_bytes(), down.to_be_bytes()].concat();
            assert!(
                matches!(
                    OffsetSync::decode(&key, &value),
                    Err(DecodeError::OffsetTooLarge { .. })
                ),
                "{up} {down}"
            );
        }
        let edge = OffsetSync::new(tp, MAX_OFFSET, MAX_OFFSET)
            .encode()
            .unwrap();
        assert!(OffsetSync::decode(&edge.key, &edge.value).is_ok());
    }

    // Golden vectors from reference/mm2-compat.md.
    const CHECKPOINT_KEY: &str = "0002673100097072696d6172792e7400000003";
    const CHECKPOINT_VALUE: &str = "000000000000000000fa00000000000000c90000";
    const HEARTBEAT_KEY: &str = "000141000142";
    const HEARTBEAT_VALUE: &str = "00000000018bcfe56800";
    const SYNC_KEY: &str = "00017400000003";
    const SYNC_VALUE: &str = "000000000000006400000000000000c8";

    fn golden_checkpoint() -> Checkpoint {
        Checkpoint {
            group: "g1".into(),
            topic_partition: TopicPartition::new("primary.t", 3),
            upstream_offset: 250,
            downstream_offset: 201,
            metadata: String::new(),
        }
    }

    #[test]
    fn checkpoint_matches_golden_vector() {
        let rec = golden_checkpoint().encode().unwrap();
        assert_eq!(hex(&rec.key), CHECKPOINT_KEY);
        assert_eq!(hex(&rec.value), CHECKPOINT_VALUE);
        let back = Checkpoint::decode(&unhex(CHECKPOINT_KEY), &unhex(CHECKPOINT_VALUE)).unwrap();
        assert_eq!(back, golden_checkpoint());
    }

    #[test]
    fn heartbeat_matches_golden_vector() {
        let hb = Heartbeat {
            source_alias: "A".into(),
            target_alias: "B".into(),
            timestamp_ms: 1_700_000_000_000,
        };
        let rec = hb.encode().unwrap();
        assert_eq!(hex(&rec.key), HEARTBEAT_KEY);
        assert_eq!(hex(&rec.value), HEARTBEAT_VALUE);
        assert_eq!(Heartbeat::decode(&rec.key, &rec.value).unwrap(), hb);
    }

    #[test]
    fn offset_sync_matches_golden_vector() {
        let sync = OffsetSync::new(TopicPartition::new("t", 3), 100, 200);
        let rec = sync.encode().unwrap();
        assert_eq!(hex(&rec.key), SYNC_KEY);
        assert_eq!(hex(&rec.value), SYNC_VALUE);
        assert_eq!(OffsetSync::decode(&rec.key, &rec.value).unwrap(), sync);
    }

    #[test]
    fn trailing_bytes_are_ignored() {
        let mut key = unhex(SYNC_KEY);
        let mut value = unhex(SYNC_VALUE);
        key.extend_from_slice(b"junk");
        value.push(7);
        let sync = OffsetSync::decode(&key, &value).unwrap();
        assert_eq!(sync.upstream_offset, 100);
        assert_eq!(sync.downstream_offset, 200);
    }

    #[test]
    fn metadata_survives_a_round_trip() {
        let cp = Checkpoint {
            metadata: "héllo".into(),
            ..golden_checkpoint()
        };
        let rec = cp.encode().unwrap();
        assert_eq!(Checkpoint::decode(&rec.key, &rec.value).unwrap(), cp);
    }

    #[test]
    fn encoding_refuses_what_mm2_would_crash_on() {
        let negative = Checkpoint {
            downstream_offset: -1,
            ..golden_checkpoint()
        };
        assert_eq!(
            negative.encode(),
            Err(EncodeError::Negative {
                field: "offset",
                value: -1
            })
        );
        let long_group = Checkpoint {
            group: "g".repeat(40_000),
            ..golden_checkpoint()
        };
        assert!(matches!(
            long_group.encode(),
            Err(EncodeError::StringTooLong {
                field: "group",
                len: 40_000
            })
        ));
        let sync = OffsetSync::new(TopicPartition::new("t", 0), -5, 0);
        assert!(matches!(
            sync.encode(),
            Err(EncodeError::Negative {
                field: "upstreamOffset",
                ..
            })
        ));
    }

    #[test]
    fn unknown_value_version_is_refused() {
        let mut value = unhex(CHECKPOINT_VALUE);
        value[1] = 1;
        assert_eq!(
            Checkpoint::decode(&unhex(CHECKPOINT_KEY), &value),
            Err(DecodeError::UnsupportedVersion {
                field: "version",
                version: 1,
                newest: 0
            })
        );
    }

    #[test]
    fn tombstone_value_is_a_truncation_error() {
        assert!(matches!(
            Heartbeat::decode(&unhex(HEARTBEAT_KEY), &[]),
            Err(DecodeError::Truncated {
                field: "version",
                ..
            })
        ));
    }
}
