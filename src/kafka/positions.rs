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

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rdkafka::{ClientConfig, Message};

pub use super::reader::ReadError;
use super::reader::{Isolation, PartitionReader};
use super::refusals::{self, Refusals};
use super::writers::{self, Claims};

pub const POSITIONS_VERSION: u8 = 0;
pub const GAP_VERSION: u8 = 1;

/// What broke the continuity of a copied partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GapKind {
    /// Source offsets `from..to` were deleted (retention, DeleteRecords) before they were
    /// copied: they are not on the target and never will be.
    SourceTruncated,
    /// The source partition ends at `to`, before the stored position `from`: the topic was
    /// deleted and created again (or an unclean leader election lost records). Copying
    /// restarted at the new log's start.
    SourceRewound,
    /// The target partition ends at `to`, before `from`, where the copied records reach: the
    /// remote topic was deleted (and created again) or lost records. Everything the source
    /// still holds is copied again.
    TargetRewound,
    /// The target refused the record at source offset `from` (`to` = `from + 1`) as too
    /// large: `size` bytes (key, value and headers) against the remote topic's
    /// `max.message.bytes` `limit` (0 when unknown). Copying went on after it.
    RecordRejected { size: i64, limit: i64 },
    /// Aligned copying (`spec.offsets: Aligned`) broke: the record at source offset `from`
    /// landed at target offset `to` (or, when `to` is -1, the remote partition could not be
    /// aligned at all, e.g. it held records of another writer). Nothing was skipped; later
    /// offsets of the partition are translated through offset syncs.
    Misaligned,
    /// Aligned copying: the fillers at target offsets `from..to` that align a new remote
    /// partition's log start with the source's could not be deleted (DeleteRecords refused),
    /// so consumers reading the remote topic from its beginning see them. Offsets are aligned.
    FillersNotDeleted,
    /// Aligned copying: a transaction another producer opened on the remote partition at
    /// TARGET offset `from` (its `read_committed` end) was still open when the replica took
    /// the partition, whose high watermark was `to`. `read_committed` consumers of the remote
    /// partition read nothing past `from` until it ends; the partition is copied on translated.
    OpenTransaction,
}

impl GapKind {
    /// [`GapKind::RecordRejected`] of a record of `size` bytes against `limit`, if known.
    pub fn rejected(size: usize, limit: Option<usize>) -> Self {
        GapKind::RecordRejected {
            size: i64::try_from(size).unwrap_or(i64::MAX),
            limit: limit.map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)),
        }
    }

    fn code(self) -> u8 {
        match self {
            GapKind::SourceTruncated => 0,
            GapKind::SourceRewound => 1,
            GapKind::TargetRewound => 2,
            GapKind::RecordRejected { .. } => 3,
            GapKind::Misaligned => 4,
            GapKind::FillersNotDeleted => 5,
            GapKind::OpenTransaction => 6,
        }
    }

    /// `extra` is what follows `to` in the value (the details some kinds carry).
    fn decode(code: u8, extra: &[u8]) -> Option<Self> {
        Some(match code {
            0 => GapKind::SourceTruncated,
            1 => GapKind::SourceRewound,
            2 => GapKind::TargetRewound,
            3 => GapKind::RecordRejected {
                size: i64::from_be_bytes(extra.get(0..8)?.try_into().ok()?),
                limit: i64::from_be_bytes(extra.get(8..16)?.try_into().ok()?),
            },
            4 => GapKind::Misaligned,
            5 => GapKind::FillersNotDeleted,
            6 => GapKind::OpenTransaction,
            _ => return None,
        })
    }

    /// The condition reason and event reason the operator reports it under.
    pub fn reason(self) -> &'static str {
        match self {
            GapKind::SourceTruncated => "SourceTruncated",
            GapKind::SourceRewound => "SourceTopicRecreated",
            GapKind::TargetRewound => "TargetTopicRecreated",
            GapKind::RecordRejected { .. } => "RecordRejected",
            GapKind::Misaligned => "OffsetsMisaligned",
            GapKind::FillersNotDeleted => "FillersNotDeleted",
            GapKind::OpenTransaction => "OpenTransaction",
        }
    }

    /// Whether the partition's offsets are translated from the break on (the status's
    /// `OffsetsAligned`), rather than records missing (`Gapless`).
    pub fn breaks_alignment(self) -> bool {
        matches!(self, GapKind::Misaligned | GapKind::OpenTransaction)
    }
}

/// A break in a partition's continuity, as the source loop recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gap {
    /// The SOURCE topic and partition.
    pub topic: String,
    pub partition: i32,
    pub kind: GapKind,
    pub from: i64,
    pub to: i64,
    /// When the source loop found it, ms since the epoch.
    pub detected_ms: i64,
}

impl Gap {
    /// What happened, in a sentence for conditions, events and logs.
    pub fn describe(&self) -> String {
        let (t, p, from, to) = (&self.topic, self.partition, self.from, self.to);
        match self.kind {
            GapKind::SourceTruncated => format!(
                "{t}[{p}]: source offsets {from}..{to} were deleted on the source (retention or DeleteRecords) before they were copied; {} records are missing on the target",
                to.saturating_sub(from)
            ),
            GapKind::SourceRewound => format!(
                "{t}[{p}]: the source partition now ends at offset {to}, before the copied position {from}: the topic was deleted and created again (or lost records); copying restarted at its beginning"
            ),
            GapKind::TargetRewound => format!(
                "{t}[{p}]: the remote partition on the target ends at offset {to}, before {from} where the copies reached: the remote topic was deleted (or lost records); the partition is copied again from the source's earliest record"
            ),
            GapKind::RecordRejected { size, limit } => {
                let limit = if limit > 0 {
                    format!("its limit of {limit} bytes (max.message.bytes)")
                } else {
                    "its limit (max.message.bytes)".to_string()
                };
                format!(
                    "{t}[{p}]: the target refused the record at source offset {from} ({size} bytes) as larger than {limit}; it is missing on the target, copying went on after it"
                )
            }
            GapKind::Misaligned if to < 0 => format!(
                "{t}[{p}]: the remote partition cannot be aligned from source offset {from} (it holds records this flow did not write, or the source went back under the copies); its offsets are translated through offset syncs from there"
            ),
            GapKind::Misaligned => format!(
                "{t}[{p}]: the record at source offset {from} landed at target offset {to} (another writer on the remote partition?); offsets from there on are translated through offset syncs"
            ),
            GapKind::FillersNotDeleted => format!(
                "{t}[{p}]: the {} filler records at target offsets {from}..{to} that align the remote partition with the source's log start could not be deleted (DeleteRecords refused), so consumers reading the remote topic from its beginning see them (header mirrorflow.filler); offsets are aligned. Grant the flow's target principal DELETE on the remote topic and delete records before offset {to} (kafka-delete-records.sh), or let retention remove them",
                to.saturating_sub(from)
            ),
            GapKind::OpenTransaction => format!(
                "{t}[{p}]: a transaction another producer opened on the remote partition at target offset {from} is still open (the partition then ended at {to}): read_committed consumers of the remote partition read nothing past offset {from} until it ends, and offsets from there on are translated through offset syncs. Find the other writer; an administrator of the target ends the transaction with: kafka-transactions.sh --bootstrap-server <target> abort --topic <remote topic of {t}> --partition {p} --start-offset {from}"
            ),
        }
    }

    pub fn encode(&self) -> (Vec<u8>, Vec<u8>) {
        let mut key = encode_key(&self.topic, self.partition);
        key.extend_from_slice(&self.detected_ms.to_be_bytes());
        let mut value = Vec::with_capacity(18);
        value.push(GAP_VERSION);
        value.push(self.kind.code());
        value.extend_from_slice(&self.from.to_be_bytes());
        value.extend_from_slice(&self.to.to_be_bytes());
        if let GapKind::RecordRejected { size, limit } = self.kind {
            value.extend_from_slice(&size.to_be_bytes());
            value.extend_from_slice(&limit.to_be_bytes());
        }
        (key, value)
    }

    pub fn decode(key: &[u8], value: &[u8]) -> Option<Gap> {
        if *value.first()? != GAP_VERSION {
            return None;
        }
        let (topic, partition) = decode_key(key)?;
        let at = 6 + topic.len();
        let detected_ms = i64::from_be_bytes(key.get(at..at + 8)?.try_into().ok()?);
        let kind = GapKind::decode(*value.get(1)?, value.get(18..).unwrap_or_default())?;
        let from = i64::from_be_bytes(value.get(2..10)?.try_into().ok()?);
        let to = i64::from_be_bytes(value.get(10..18)?.try_into().ok()?);
        Some(Gap {
            topic,
            partition,
            kind,
            from,
            to,
            detected_ms,
        })
    }
}

/// The gaps read from a positions topic, in the order they were written, each once. A re-read
/// of a gap (a reader that starts over) is found in a set, not by scanning the list: a topic
/// with many gaps costs linear time, not quadratic.
#[derive(Debug, Clone, Default)]
pub struct Gaps {
    list: Vec<Gap>,
    seen: HashSet<Gap>,
}

impl Gaps {
    pub fn push(&mut self, gap: Gap) {
        if self.seen.insert(gap.clone()) {
            self.list.push(gap);
        }
    }

    pub fn as_slice(&self) -> &[Gap] {
        &self.list
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// How far a source partition is copied: every record before `next` is on the target, the
/// one at `next - 1` at target offset `downstream` (-1 when unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frontier {
    pub next: i64,
    pub downstream: i64,
}

/// The positions topic of a flow from `source_alias`, on the target.
pub fn positions_topic(source_alias: &str) -> String {
    format!("mirrorflow-positions.{source_alias}.internal")
}

pub fn encode_key(topic: &str, partition: i32) -> Vec<u8> {
    let bytes = topic.as_bytes();
    // Kafka topic names are at most 249 bytes, far below i16::MAX.
    let len = i16::try_from(bytes.len()).unwrap_or(i16::MAX);
    let mut key = Vec::with_capacity(6 + bytes.len());
    key.extend_from_slice(&len.to_be_bytes());
    key.extend_from_slice(&bytes[..len as usize]);
    key.extend_from_slice(&partition.to_be_bytes());
    key
}

pub fn encode_value(position: Frontier) -> Vec<u8> {
    let mut value = Vec::with_capacity(17);
    value.push(POSITIONS_VERSION);
    value.extend_from_slice(&position.next.to_be_bytes());
    value.extend_from_slice(&position.downstream.to_be_bytes());
    value
}

pub fn decode_key(key: &[u8]) -> Option<(String, i32)> {
    let len = usize::try_from(i16::from_be_bytes(key.get(..2)?.try_into().ok()?)).ok()?;
    let topic = std::str::from_utf8(key.get(2..2 + len)?).ok()?;
    let partition = i32::from_be_bytes(key.get(2 + len..6 + len)?.try_into().ok()?);
    (partition >= 0).then(|| (topic.to_string(), partition))
}

pub fn decode_value(value: &[u8]) -> Option<Frontier> {
    if *value.first()? != POSITIONS_VERSION {
        return None;
    }
    let next = i64::from_be_bytes(value.get(1..9)?.try_into().ok()?);
    let downstream = i64::from_be_bytes(value.get(9..17)?.try_into().ok()?);
    (next >= 0).then_some(Frontier { next, downstream })
}

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
