//! Reading MM2's compacted single-partition topics to their end: the checkpoints topic
//! (newest checkpoint per group-partition, what `RemoteClusterUtils.translateOffsets` returns)
//! and the offset-syncs topic (every sync, in order, with its origin).
//!
//! One [`PartitionReader`] per read. Blocking: call from a CLI or `spawn_blocking`.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{ClientConfig, Message};

pub use super::reader::ReadError;
use super::reader::{Isolation, PartitionReader};
use crate::mm2::{
    Checkpoint, CopyStart, OffsetSync, SYNC_ORIGIN_HEADER, SYNC_START_HEADER, SyncOrigin,
    TopicPartition,
};
use crate::verify::header::{VERIFICATION_HEADER, Verification};

/// Group id the readers are configured with; they never join it nor commit.
const READER_GROUP: &str = "mirrorflow-cli-reader";

/// The offset sync a record of an offset-syncs topic holds, with its origin
/// ([`SYNC_ORIGIN_HEADER`]); `None` when it is not one.
pub fn offset_sync(m: &impl Message) -> Option<(OffsetSync, SyncOrigin)> {
    let mut sync = OffsetSync::decode(m.key()?, m.payload()?).ok()?;
    let header = |key: &str| {
        m.headers().and_then(|h| {
            h.iter()
                .find(|h| h.key == key)
                .map(|h| h.value.unwrap_or_default())
        })
    };
    sync.start = header(SYNC_START_HEADER)
        .and_then(|v| CopyStart::from_header(v, sync.upstream_offset, sync.downstream_offset));
    Some((sync, SyncOrigin::from_header(header(SYNC_ORIGIN_HEADER))))
}

/// Header on every checkpoint the checkpoint loop writes: whether its translation was exact
/// ([`Exactness`]), so the operator's probe can tell a checkpoint that a failover would re-read
/// records from from an exact one (the offsets alone cannot). The key and value stay MM2's:
/// MM2's readers (`Checkpoint.deserializeRecord`, `RemoteClusterUtils`) read only those, as
/// they ignore [`SYNC_ORIGIN_HEADER`] on offset syncs.
pub const TRANSLATION_HEADER: &str = "mirrorflow.translation";
const EXACT: &str = "exact";
const CONSERVATIVE: &str = "conservative:";
/// The longest header value read: `conservative:` and the 20 digits of `u64::MAX`.
const MAX_HEADER: usize = 40;

/// Header on the checkpoints of a share group (KIP-932), value [`SHARE_GROUP`]: its offsets
/// are the group's start offsets, which a failover sets with AlterShareGroupOffsets, never with
/// an OffsetCommit (that would make a consumer group of the name on the target, which the share
/// group's consumers could then not join). Absent on every other group's checkpoints.
pub const GROUP_TYPE_HEADER: &str = "mirrorflow.group.type";
pub const SHARE_GROUP: &str = "share";

/// Whether a record of the checkpoints topic says it is a share group's.
pub fn is_share_group_record(m: &impl Message) -> bool {
    m.headers().is_some_and(|h| {
        h.iter()
            .any(|h| h.key == GROUP_TYPE_HEADER && h.value == Some(SHARE_GROUP.as_bytes()))
    })
}

/// How a checkpoint's downstream offset was found, as its writer recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Exactness {
    /// Its writer did not say (MM2, an older replicator, a header this version cannot read):
    /// no evidence either way.
    #[default]
    Unknown,
    /// Seeking to it re-reads nothing.
    Exact,
    /// Seeking to it skips nothing but re-reads up to `max_replay` records: no offset sync
    /// covered the commit yet (the copy's newest sync is before it), so it points just past
    /// the newest record known.
    Conservative { max_replay: u64 },
}

impl Exactness {
    /// The [`TRANSLATION_HEADER`] value that says it; `None` for [`Exactness::Unknown`].
    pub fn header_value(self) -> Option<String> {
        match self {
            Exactness::Unknown => None,
            Exactness::Exact => Some(EXACT.to_string()),
            Exactness::Conservative { max_replay } => Some(format!("{CONSERVATIVE}{max_replay}")),
        }
    }

    /// What a [`TRANSLATION_HEADER`] value says (`None`: no header). Anyone who can write the
    /// target's checkpoints topic chooses the bytes: anything but the two forms is Unknown.
    pub fn from_header(value: Option<&[u8]>) -> Exactness {
        let Some(text) = value
            .filter(|v| v.len() <= MAX_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())
        else {
            return Exactness::Unknown;
        };
        if text == EXACT {
            return Exactness::Exact;
        }
        text.strip_prefix(CONSERVATIVE)
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse().ok())
            .map_or(Exactness::Unknown, |max_replay| Exactness::Conservative {
                max_replay,
            })
    }

    /// What a record of the checkpoints topic says of its translation.
    pub fn of_record(m: &impl Message) -> Exactness {
        let header = m.headers().and_then(|h| {
            h.iter()
                .find(|h| h.key == TRANSLATION_HEADER)
                .map(|h| h.value.unwrap_or_default())
        });
        Exactness::from_header(header)
    }

    /// Records a failover to it may re-read that are known of: 0 unless conservative.
    pub fn max_replay(self) -> u64 {
        match self {
            Exactness::Conservative { max_replay } => max_replay,
            Exactness::Exact | Exactness::Unknown => 0,
        }
    }
}

/// The newest checkpoint of one group-partition and when it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub checkpoint: Checkpoint,
    /// Record timestamp (ms since the epoch), if the broker gave one.
    pub written_ms: Option<i64>,
    /// What its writer said of its translation ([`TRANSLATION_HEADER`]).
    pub exactness: Exactness,
    /// When the group-partition's checkpoint was last exact, as far as this reader saw: this
    /// one's time when it is, else the one it read before it (`None`: none read, e.g. compacted
    /// away). A group that commits while the copy keeps up gets a conservative checkpoint at
    /// most commits, then the exact one a sync later.
    pub exact_ms: Option<i64>,
    /// The newest verification of this group-partition's checkpoints on their records
    /// ([`crate::verify::header`]): of this checkpoint, or of an earlier one when this one was
    /// not verified yet (its offsets say which). A mismatch stays until a later verification.
    pub verification: Option<Verification>,
    /// A share group's ([`GROUP_TYPE_HEADER`]); only readers of whole records know it.
    pub share: bool,
}

/// Newest checkpoint per group, then per TARGET topic-partition.
pub type CheckpointIndex = BTreeMap<String, BTreeMap<TopicPartition, StoredCheckpoint>>;

/// What was read, plus how many records could not be decoded (reported, not fatal: MM2's
/// readers skip them too).
#[derive(Debug, Default)]
pub struct Read<T> {
    pub items: T,
    pub undecodable: u64,
}

/// Reads partition 0 of the checkpoints topic from its start to its end and keeps the newest
/// checkpoint per (group, partition), the way `RemoteClusterUtils.translateOffsets` does.
pub fn read_checkpoints(
    client: &ClientConfig,
    cluster: &'static str,
    topic: &str,
    timeout: Duration,
) -> Result<Read<CheckpointIndex>, ReadError> {
    let mut out = Read::<CheckpointIndex>::default();
    read_to_end(client, cluster, topic, timeout, |m| {
        if !index_record(&mut out.items, m) {
            out.undecodable += 1;
        }
    })?;
    Ok(out)
}

/// Folds one record of a checkpoints topic into `index` (newer records replace older ones of
/// the same group-partition); false when it is not a checkpoint (skipped).
pub fn index_record(index: &mut CheckpointIndex, m: &impl Message) -> bool {
    let verification = m.headers().and_then(|h| {
        h.iter()
            .find(|h| h.key == VERIFICATION_HEADER)
            .and_then(|h| Verification::from_header(h.value))
    });
    let indexed = index_verified_checkpoint(
        index,
        m.key(),
        m.payload(),
        m.timestamp().to_millis(),
        Exactness::of_record(m),
        verification,
    );
    if indexed.is_some()
        && is_share_group_record(m)
        && let Some(cp) = m
            .key()
            .zip(m.payload())
            .and_then(|(k, v)| Checkpoint::decode(k, v).ok())
        && let Some(stored) = index
            .get_mut(&cp.group)
            .and_then(|p| p.get_mut(&cp.topic_partition))
    {
        stored.share = true;
    }
    indexed.is_some()
}

/// [`index_record`] for a record's key, value, timestamp and [`TRANSLATION_HEADER`] as any
/// reader gives them: `Some(true)` when the group-partition is new to `index`, `None` when the
/// record is not a checkpoint.
pub fn index_checkpoint(
    index: &mut CheckpointIndex,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    written_ms: Option<i64>,
    exactness: Exactness,
) -> Option<bool> {
    index_verified_checkpoint(index, key, value, written_ms, exactness, None)
}

/// [`index_checkpoint`] with the record's [`VERIFICATION_HEADER`], if it had one.
pub fn index_verified_checkpoint(
    index: &mut CheckpointIndex,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    written_ms: Option<i64>,
    exactness: Exactness,
    verification: Option<Verification>,
) -> Option<bool> {
    let cp = key
        .zip(value)
        .and_then(|(k, v)| Checkpoint::decode(k, v).ok())?;
    let partitions = index.entry(cp.group.clone()).or_default();
    let before = partitions.get(&cp.topic_partition);
    let exact_ms = match exactness {
        Exactness::Exact => written_ms,
        Exactness::Conservative { .. } => before.and_then(|b| b.exact_ms),
        // A writer that does not say (MM2): nothing is known of it.
        Exactness::Unknown => None,
    };
    let verification = verification.or_else(|| before.and_then(|b| b.verification));
    let stored = StoredCheckpoint {
        written_ms,
        checkpoint: cp,
        exactness,
        exact_ms,
        verification,
        share: false,
    };
    let replaced = partitions.insert(stored.checkpoint.topic_partition.clone(), stored);
    Some(replaced.is_none())
}

/// Reads every offset sync of partition 0 of `topic`, in order; syncs carrying our dense header
/// are [`SyncOrigin::Dense`].
pub fn read_offset_syncs(
    client: &ClientConfig,
    cluster: &'static str,
    topic: &str,
    timeout: Duration,
) -> Result<Read<Vec<(OffsetSync, SyncOrigin)>>, ReadError> {
    let mut out = Read::<Vec<_>>::default();
    read_to_end(client, cluster, topic, timeout, |m| match offset_sync(m) {
        Some(item) => out.items.push(item),
        None => out.undecodable += 1,
    })?;
    Ok(out)
}

/// Calls `on_record` for every record of partition 0 of `topic`, from its start up to the end
/// a consumer sees now (committed records only).
pub fn read_to_end(
    client: &ClientConfig,
    cluster: &'static str,
    topic: &str,
    timeout: Duration,
    on_record: impl FnMut(&BorrowedMessage<'_>),
) -> Result<(), ReadError> {
    PartitionReader::new(
        client,
        cluster,
        topic.to_string(),
        READER_GROUP,
        Isolation::Committed,
    )?
    .read_to_end(timeout, on_record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_translation_header_says_what_the_writer_knew_and_nothing_else() {
        let cases: [(Option<&[u8]>, Exactness); 10] = [
            (None, Exactness::Unknown),
            (Some(b"exact"), Exactness::Exact),
            (
                Some(b"conservative:59"),
                Exactness::Conservative { max_replay: 59 },
            ),
            (
                Some(b"conservative:18446744073709551615"),
                Exactness::Conservative {
                    max_replay: u64::MAX,
                },
            ),
            (
                Some(b"conservative:18446744073709551616"),
                Exactness::Unknown,
            ),
            (Some(b"conservative:"), Exactness::Unknown),
            (Some(b"conservative:+5"), Exactness::Unknown),
            (Some(b"Exact"), Exactness::Unknown),
            (Some(b"\xff\xfe"), Exactness::Unknown),
            (Some(&[b'0'; 4096]), Exactness::Unknown),
        ];
        for (value, want) in cases {
            assert_eq!(Exactness::from_header(value), want, "{value:?}");
        }
        for e in [
            Exactness::Exact,
            Exactness::Conservative { max_replay: 0 },
            Exactness::Conservative {
                max_replay: u64::MAX,
            },
        ] {
            let value = e.header_value().expect("a known exactness is written");
            assert_eq!(Exactness::from_header(Some(value.as_bytes())), e);
        }
        assert_eq!(Exactness::Unknown.header_value(), None, "nothing to say");
    }

    #[test]
    fn the_index_remembers_when_a_pair_was_last_exact() {
        let conservative = Exactness::Conservative { max_replay: 59 };
        // (record time, exactness) read in order -> the pair's exact_ms after it
        let steps = [
            (10, conservative, None),
            (20, Exactness::Exact, Some(20)),
            (30, conservative, Some(20)),
            (40, conservative, Some(20)),
            (50, Exactness::Exact, Some(50)),
            (60, Exactness::Unknown, None),
            (70, conservative, None),
        ];
        let mut index = CheckpointIndex::new();
        for (i, (ms, exactness, want)) in steps.into_iter().enumerate() {
            let r = Checkpoint {
                group: "g".into(),
                topic_partition: TopicPartition::new("A.t", 0),
                upstream_offset: 60,
                downstream_offset: 8,
                metadata: String::new(),
            }
            .encode()
            .expect("encodes");
            let new = index_checkpoint(
                &mut index,
                Some(&r.key),
                Some(&r.value),
                Some(ms),
                exactness,
            );
            assert_eq!(new, Some(i == 0), "step {i}");
            let stored = &index["g"][&TopicPartition::new("A.t", 0)];
            assert_eq!(
                (stored.exactness, stored.exact_ms),
                (exactness, want),
                "step {i}"
            );
        }
        assert_eq!(conservative.max_replay(), 59);
        assert_eq!(Exactness::Exact.max_replay(), 0);
    }
}
