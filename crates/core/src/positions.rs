//! The records of MirrorFlow's positions topic on the target
//! (`mirrorflow-positions.<source alias>.internal`): source positions, the gaps beside them, and
//! the value layouts of writers' claims and refused topic changes. Pure encoders and decoders,
//! here so the fuzz targets reach them; the replicator and the operator's probe fold them
//! (`src/kafka/positions.rs`, `writers.rs`, `refusals.rs` describe the layouts).

use std::collections::HashSet;

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

    /// The kind's byte in a gap's value.
    pub fn code(self) -> u8 {
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
    pub fn decode(code: u8, extra: &[u8]) -> Option<Self> {
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

/// The longest topic name Kafka accepts.
pub const MAX_TOPIC_LEN: usize = 249;

/// The source topic and partition of a position (or gap) key. A topic name longer than Kafka
/// allows is not one: such a key was not written by a replicator, and its name would end up
/// in status messages.
pub fn decode_key(key: &[u8]) -> Option<(String, i32)> {
    let len = usize::try_from(i16::from_be_bytes(key.get(..2)?.try_into().ok()?)).ok()?;
    if len > MAX_TOPIC_LEN {
        return None;
    }
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

/// A claim's value as written (`src/kafka/writers.rs`): version 2, the flow's creation time,
/// its renewal time, and its `namespace/name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimValue<'a> {
    pub created_ms: i64,
    pub renewed_ms: i64,
    pub flow: &'a str,
}

pub const CLAIM_VERSION: u8 = 2;

impl<'a> ClaimValue<'a> {
    pub fn encode(&self) -> Vec<u8> {
        let flow = self.flow.as_bytes();
        let len = i16::try_from(flow.len()).unwrap_or(i16::MAX);
        let mut value = Vec::with_capacity(19 + flow.len());
        value.push(CLAIM_VERSION);
        value.extend_from_slice(&self.created_ms.to_be_bytes());
        value.extend_from_slice(&self.renewed_ms.to_be_bytes());
        value.extend_from_slice(&len.to_be_bytes());
        value.extend_from_slice(&flow[..usize::from(len.unsigned_abs())]);
        value
    }

    /// `None` when the value is not a claim of this version; bytes after the flow name are
    /// ignored.
    pub fn decode(value: &'a [u8]) -> Option<Self> {
        if *value.first()? != CLAIM_VERSION {
            return None;
        }
        let created_ms = i64::from_be_bytes(value.get(1..9)?.try_into().ok()?);
        let renewed_ms = i64::from_be_bytes(value.get(9..17)?.try_into().ok()?);
        let len = usize::try_from(i16::from_be_bytes(value.get(17..19)?.try_into().ok()?)).ok()?;
        let flow = std::str::from_utf8(value.get(19..19_usize.saturating_add(len))?).ok()?;
        Some(ClaimValue {
            created_ms,
            renewed_ms,
            flow,
        })
    }
}

pub const REFUSAL_VERSION: u8 = 3;

/// A refused topic change's value (`src/kafka/refusals.rs`): version 3, when it was first
/// refused, then the message to the end of the value.
pub fn encode_refusal_value(detected_ms: i64, message: &str) -> Vec<u8> {
    let mut value = Vec::with_capacity(9 + message.len());
    value.push(REFUSAL_VERSION);
    value.extend_from_slice(&detected_ms.to_be_bytes());
    value.extend_from_slice(message.as_bytes());
    value
}

/// (detected ms, message); `None` when the value is not a refusal of this version.
pub fn decode_refusal_value(value: &[u8]) -> Option<(i64, &str)> {
    if *value.first()? != REFUSAL_VERSION {
        return None;
    }
    let detected_ms = i64::from_be_bytes(value.get(1..9)?.try_into().ok()?);
    let message = std::str::from_utf8(value.get(9..)?).ok()?;
    Some((detected_ms, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_read_twice_are_kept_once_in_linear_time() {
        let gap = |i: i64| Gap {
            topic: "t".into(),
            partition: 0,
            kind: GapKind::SourceTruncated,
            from: i,
            to: i + 1,
            detected_ms: i,
        };
        let mut gaps = Gaps::default();
        let started = std::time::Instant::now();
        // A reader that starts over reads every gap again.
        for _ in 0..2 {
            for i in 0..100_000 {
                gaps.push(gap(i));
            }
        }
        assert_eq!(gaps.len(), 100_000);
        assert_eq!(gaps.as_slice()[7], gap(7), "in the order written");
        // A list scan per push (the old dedup) took minutes here.
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn a_key_with_a_topic_longer_than_kafka_allows_is_not_a_position() {
        let longest = "t".repeat(MAX_TOPIC_LEN);
        assert_eq!(
            decode_key(&encode_key(&longest, 1)),
            Some((longest.clone(), 1))
        );
        assert_eq!(decode_key(&encode_key(&format!("{longest}t"), 1)), None);
    }

    #[test]
    fn claims_and_refusals_round_trip() {
        let claim = ClaimValue {
            created_ms: 1,
            renewed_ms: i64::MAX,
            flow: "ns/f",
        };
        assert_eq!(ClaimValue::decode(&claim.encode()), Some(claim));
        let refusal = encode_refusal_value(5, "refused é");
        assert_eq!(decode_refusal_value(&refusal), Some((5, "refused é")));
        assert_eq!(decode_refusal_value(&refusal[..8]), None);
    }
}
