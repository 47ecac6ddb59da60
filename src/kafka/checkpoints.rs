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
use crate::mm2::{Checkpoint, OffsetSync, SYNC_ORIGIN_HEADER, SyncOrigin, TopicPartition};

/// Group id the readers are configured with; they never join it nor commit.
const READER_GROUP: &str = "mirrorflow-cli-reader";

/// The offset sync a record of an offset-syncs topic holds, with its origin
/// ([`SYNC_ORIGIN_HEADER`]); `None` when it is not one.
pub fn offset_sync(m: &impl Message) -> Option<(OffsetSync, SyncOrigin)> {
    let sync = OffsetSync::decode(m.key()?, m.payload()?).ok()?;
    let header = m.headers().and_then(|h| {
        h.iter()
            .find(|h| h.key == SYNC_ORIGIN_HEADER)
            .map(|h| h.value.unwrap_or_default())
    });
    Some((sync, SyncOrigin::from_header(header)))
}

/// The newest checkpoint of one group-partition and when it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub checkpoint: Checkpoint,
    /// Record timestamp (ms since the epoch), if the broker gave one.
    pub written_ms: Option<i64>,
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
    index_checkpoint(index, m.key(), m.payload(), m.timestamp().to_millis()).is_some()
}

/// [`index_record`] for a record's key, value and timestamp as any reader gives them:
/// `Some(true)` when the group-partition is new to `index`, `None` when the record is not a
/// checkpoint.
pub fn index_checkpoint(
    index: &mut CheckpointIndex,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    written_ms: Option<i64>,
) -> Option<bool> {
    let cp = key
        .zip(value)
        .and_then(|(k, v)| Checkpoint::decode(k, v).ok())?;
    let stored = StoredCheckpoint {
        written_ms,
        checkpoint: cp,
    };
    let replaced = index
        .entry(stored.checkpoint.group.clone())
        .or_default()
        .insert(stored.checkpoint.topic_partition.clone(), stored);
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
