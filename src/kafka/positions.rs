//! Source positions, stored on the TARGET cluster in a compacted topic: written by the
//! replicator's source loop, read by it on start and by the operator's probe (replication lag).
//!
//! Topic: [`positions_topic`] = `mirrorflow-positions.<source alias>.internal`, 1 partition,
//! `cleanup.policy=compact`. Its name ends with `.internal`, so no flow ever replicates it.
//!
//! Record layout (all integers big-endian, like MM2's own records):
//! - key: `topic: i16 length + UTF-8 bytes` (the SOURCE topic), `partition: i32`
//! - value: `version: u8 = 0`, `next: i64` (the next source offset to copy: every record
//!   before it is on the target), `downstream: i64` (target offset of the record at
//!   `next - 1`, or -1 when unknown). Readers ignore trailing bytes, so later versions may
//!   append fields.
//!
//! A position is only written after the target acknowledged every record before `next`
//! (and the offset syncs up to there), so a crash repeats records but never skips one.
//!
//! The same topic also keeps the breaks in continuity the source loop found ([`Gap`]), so
//! the operator can surface them long after the replica that saw them is gone:
//! - key: the position key of the partition followed by `detected: i64` (ms since the epoch),
//!   so every break has its own key and compaction keeps them all;
//! - value: `version: u8 = 1`, `kind: u8` ([`GapKind`]), `from: i64`, `to: i64`; a
//!   [`GapKind::RecordRejected`] appends `size: i64`, `limit: i64`. Readers of version 0 skip
//!   these records as undecodable.
//!
//! And each running replicator's claim on the topic ([`super::writers`]): who writes it, so
//! two flows sharing it find each other even when no operator sees both; and the topic changes
//! the clusters refused its discovery ([`super::refusals`]).

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::{ClientConfig, Message};

pub use super::reader::ReadError;
use super::reader::{Isolation, PartitionReader};
use super::refusals::{self, Refusals};
use super::writers::{self, Claims};

pub use mirrorflow_core::positions::{
    Frontier, GAP_VERSION, Gap, GapKind, Gaps, POSITIONS_VERSION, decode_key, decode_value,
    encode_key, encode_value, positions_topic,
};

/// Folds one record of a positions topic into `positions`, `gaps`, `claims` and `refusals`:
/// a position, a tombstone (the partition is no longer tracked), a gap, a writer's claim
/// ([`super::writers`]) or a refused topic change ([`super::refusals`]). False when this
/// version cannot decode it (skipped).
pub fn apply_record(
    positions: &mut HashMap<(String, i32), Frontier>,
    gaps: &mut Gaps,
    claims: &mut Claims,
    refusals: &mut Refusals,
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
) -> bool {
    if let Some(k) = key
        && writers::is_claim_key(k)
    {
        return writers::apply(claims, k, payload);
    }
    if let Some(k) = key
        && refusals::is_refusal_key(k)
    {
        return refusals::apply(refusals, k, payload);
    }
    if let (Some(k), Some(v)) = (key, payload)
        && v.first() == Some(&GAP_VERSION)
    {
        return match Gap::decode(k, v) {
            Some(g) => {
                gaps.push(g);
                true
            }
            None => false,
        };
    }
    match (key.and_then(decode_key), payload) {
        (Some(k), None) => {
            positions.remove(&k);
            true
        }
        (Some(k), Some(v)) => match decode_value(v) {
            Some(p) => {
                positions.insert(k, p);
                true
            }
            None => false,
        },
        (None, _) => false,
    }
}

/// Follows the positions topic; [`Self::read_to_end`] catches up with every position written
/// so far, including those a replica that just gave up a partition persisted before leaving.
pub struct PositionReader {
    reader: PartitionReader,
    positions: HashMap<(String, i32), Frontier>,
    gaps: Gaps,
    claims: Claims,
    refusals: Refusals,
    undecodable: u64,
}

impl PositionReader {
    pub fn new(target: &ClientConfig, topic: String, group: &str) -> Result<Self, ReadError> {
        Self::create(target, topic, group, Isolation::Committed)
    }

    /// A reader that sees committed transactions only (exactly-once mode, where positions are
    /// written in the producer's transactions) and whose [`Self::read_to_end`] waits for every
    /// transaction open on the topic to end, so no position committed so far is missed.
    pub fn read_committed(
        target: &ClientConfig,
        topic: String,
        group: &str,
    ) -> Result<Self, ReadError> {
        Self::create(target, topic, group, Isolation::CommittedAll)
    }

    fn create(
        target: &ClientConfig,
        topic: String,
        group: &str,
        isolation: Isolation,
    ) -> Result<Self, ReadError> {
        // Never used for a group: the partition is assigned, nothing is committed.
        let group = format!("{group}.positions");
        Ok(PositionReader {
            reader: PartitionReader::new(target, "target", topic, &group, isolation)?,
            positions: HashMap::new(),
            gaps: Gaps::default(),
            claims: Claims::new(),
            refusals: Refusals::new(),
            undecodable: 0,
        })
    }

    pub fn get(&self, topic: &str, partition: i32) -> Option<Frontier> {
        self.positions.get(&(topic.to_string(), partition)).copied()
    }

    /// Every position read so far.
    pub fn into_positions(self) -> impl Iterator<Item = ((String, i32), Frontier)> {
        self.positions.into_iter()
    }

    /// Every break in continuity recorded so far, in the order they were written.
    pub fn gaps(&self) -> &[Gap] {
        self.gaps.as_slice()
    }

    /// The writers' claims read so far ([`super::writers`]).
    pub fn claims(&self) -> &Claims {
        &self.claims
    }

    /// The topic changes refused so far and not since undone ([`super::refusals`]).
    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// Records that were not positions this version understands (skipped).
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    pub fn read_to_end(&mut self, timeout: Duration) -> Result<(), ReadError> {
        self.reader.read_to_end(timeout, |m| {
            if !apply_record(
                &mut self.positions,
                &mut self.gaps,
                &mut self.claims,
                &mut self.refusals,
                m.key(),
                m.payload(),
            ) {
                self.undecodable += 1;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_round_trip_with_a_documented_layout() {
        let key = encode_key("orders", 3);
        assert_eq!(key, [0, 6, b'o', b'r', b'd', b'e', b'r', b's', 0, 0, 0, 3]);
        assert_eq!(decode_key(&key), Some(("orders".to_string(), 3)));
        let value = encode_value(Frontier {
            next: 256,
            downstream: -1,
        });
        assert_eq!(value.len(), 17);
        assert_eq!(value[0], POSITIONS_VERSION);
        assert_eq!(&value[1..9], &256_i64.to_be_bytes());
        assert_eq!(
            decode_value(&value),
            Some(Frontier {
                next: 256,
                downstream: -1
            })
        );
    }

    #[test]
    fn undeleted_fillers_round_trip() {
        let gap = Gap {
            topic: "orders".into(),
            partition: 2,
            kind: GapKind::FillersNotDeleted,
            from: 0,
            to: 500,
            detected_ms: 1_800_000_000_000,
        };
        let (key, value) = gap.encode();
        assert_eq!((value.len(), value[1]), (18, 5));
        assert_eq!(Gap::decode(&key, &value), Some(gap.clone()));
        assert_eq!(gap.kind.reason(), "FillersNotDeleted");
    }

    #[test]
    fn an_open_transaction_round_trips_and_names_the_fix() {
        let gap = Gap {
            topic: "orders".into(),
            partition: 3,
            kind: GapKind::OpenTransaction,
            from: 22,
            to: 40,
            detected_ms: 1_800_000_000_000,
        };
        let (key, value) = gap.encode();
        assert_eq!((value.len(), value[1]), (18, 6));
        assert_eq!(Gap::decode(&key, &value), Some(gap.clone()));
        assert_eq!(gap.kind.reason(), "OpenTransaction");
        assert!(gap.kind.breaks_alignment() && GapKind::Misaligned.breaks_alignment());
        assert!(!GapKind::FillersNotDeleted.breaks_alignment());
        let said = gap.describe();
        assert!(
            said.contains("--partition 3 --start-offset 22") && said.contains("past offset 22"),
            "{said}"
        );
    }

    #[test]
    fn a_rejected_record_keeps_its_size_and_limit() {
        let gap = Gap {
            topic: "orders".into(),
            partition: 1,
            kind: GapKind::RecordRejected {
                size: 300_000,
                limit: 100_000,
            },
            from: 42,
            to: 43,
            detected_ms: 1_800_000_000_000,
        };
        let (key, value) = gap.encode();
        assert_eq!(value.len(), 34);
        assert_eq!(Gap::decode(&key, &value), Some(gap.clone()));
        assert_eq!(gap.kind.reason(), "RecordRejected");
        assert!(gap.describe().contains("offset 42 (300000 bytes)"));
        assert!(gap.describe().contains("limit of 100000 bytes"));
        // Without its details the record is refused, not read as zeros.
        assert_eq!(Gap::decode(&key, &value[..26]), None);
    }

    #[test]
    fn trailing_bytes_are_ignored_and_garbage_refused() {
        let mut value = encode_value(Frontier {
            next: 7,
            downstream: 9,
        });
        value.extend_from_slice(b"future");
        assert_eq!(decode_value(&value).map(|f| f.next), Some(7));
        assert_eq!(decode_value(&[1, 0, 0]), None, "unknown version");
        assert_eq!(decode_value(&value[..10]), None, "truncated");
        assert_eq!(decode_key(&[0, 9, b'x']), None, "truncated key");
        let negative = [&[0, 1, b't'][..], &(-1_i32).to_be_bytes()].concat();
        assert_eq!(decode_key(&negative), None);
    }

    #[test]
    fn gaps_round_trip_and_never_pass_for_positions() {
        let gap = Gap {
            topic: "orders".into(),
            partition: 2,
            kind: GapKind::SourceTruncated,
            from: 100,
            to: 250,
            detected_ms: 1_800_000_000_123,
        };
        let (key, value) = gap.encode();
        assert_eq!(&key[..12], &encode_key("orders", 2)[..]);
        assert_eq!(&key[12..], &1_800_000_000_123_i64.to_be_bytes());
        assert_eq!(value.len(), 18);
        assert_eq!(Gap::decode(&key, &value), Some(gap.clone()));
        assert_eq!(decode_value(&value), None, "a gap is not a position");
        assert!(gap.describe().contains("150 records are missing"));
        for kind in [
            GapKind::SourceTruncated,
            GapKind::SourceRewound,
            GapKind::TargetRewound,
        ] {
            assert_eq!(GapKind::decode(kind.code(), &[]), Some(kind));
        }
        assert_eq!(GapKind::decode(9, &[]), None);
        assert_eq!(Gap::decode(&key, &value[..17]), None, "truncated value");
        assert_eq!(Gap::decode(&key[..15], &value), None, "truncated key");
        assert_eq!(
            Gap::decode(
                &key,
                &encode_value(Frontier {
                    next: 1,
                    downstream: 1
                })
            ),
            None,
            "a position is not a gap"
        );
    }

    #[test]
    fn refusals_fold_beside_positions_and_never_pass_for_them() {
        let (mut positions, mut gaps, mut claims, mut refusals) = (
            HashMap::new(),
            Gaps::default(),
            Claims::new(),
            Refusals::new(),
        );
        let refusal = refusals::Refusal {
            topic: "A.orders".into(),
            detected_ms: 1,
            message: "refused".into(),
        };
        let (key, value) = refusal.encode();
        let mut fold = |value: Option<&[u8]>| {
            apply_record(
                &mut positions,
                &mut gaps,
                &mut claims,
                &mut refusals,
                Some(&key),
                value,
            )
        };
        assert!(fold(Some(&value)));
        assert!(fold(None), "its tombstone");
        assert!(fold(Some(&value)));
        assert_eq!(refusals.get("A.orders"), Some(&refusal));
        assert!(positions.is_empty() && gaps.is_empty() && claims.is_empty());
    }

    #[test]
    fn the_topic_is_internal_so_never_replicated() {
        let t = positions_topic("src-1");
        assert_eq!(t, "mirrorflow-positions.src-1.internal");
        use crate::mm2::{PrefixPolicy, ReplicationPolicy};
        assert!(PrefixPolicy::default().is_internal_topic(&t));
    }
}
