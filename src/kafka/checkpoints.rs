//! Reading MM2's compacted single-partition topics to their end: the checkpoints topic
//! (newest checkpoint per group-partition, what `RemoteClusterUtils.translateOffsets` returns)
//! and the offset-syncs topic (every sync, in order, with its origin).
//!
//! One assign-only consumer per read, no group membership and no commits, so reading never
//! disturbs a replicator or a consumer group. Blocking: call from a CLI or `spawn_blocking`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::mm2::{Checkpoint, OffsetSync, SYNC_ORIGIN_HEADER, SyncOrigin, TopicPartition};

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

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

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("topic {topic} does not exist on the {cluster} cluster")]
    NoTopic {
        cluster: &'static str,
        topic: String,
    },
    #[error(
        "cannot reach the {cluster} cluster to read {topic}: {source}; check \
         spec.{cluster}.bootstrapServers and that the cluster is up"
    )]
    Unreachable {
        cluster: &'static str,
        topic: String,
        #[source]
        source: KafkaError,
    },
    #[error(
        "reading {topic} on the {cluster} cluster stopped at offset {at} of {end} after {timeout:?}"
    )]
    Timeout {
        cluster: &'static str,
        topic: String,
        at: i64,
        end: i64,
        timeout: Duration,
    },
}

impl ReadError {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReadError::NoTopic { .. } => "no_topic",
            ReadError::Unreachable { .. } => "unreachable",
            ReadError::Timeout { .. } => "timeout",
        }
    }
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
    let decoded = m
        .key()
        .zip(m.payload())
        .and_then(|(k, v)| Checkpoint::decode(k, v).ok());
    let Some(cp) = decoded else {
        return false;
    };
    let stored = StoredCheckpoint {
        written_ms: m.timestamp().to_millis(),
        checkpoint: cp,
    };
    index
        .entry(stored.checkpoint.group.clone())
        .or_default()
        .insert(stored.checkpoint.topic_partition.clone(), stored);
    true
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

/// Client settings of a reader that assigns partitions itself: `group` is never joined nor
/// committed to, and partition ends are reported so the reader knows it caught up.
pub fn assign_only_config(client: &ClientConfig, group: &str) -> ClientConfig {
    let mut config = client.clone();
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "100")
        // An end reached under read_committed is an end a consumer would see too.
        .set("isolation.level", "read_committed");
    config
}

/// Calls `on_record` for every record of partition 0 of `topic`, from its start up to the end
/// it had when the read began.
pub fn read_to_end(
    client: &ClientConfig,
    cluster: &'static str,
    topic: &str,
    timeout: Duration,
    mut on_record: impl FnMut(&BorrowedMessage<'_>),
) -> Result<(), ReadError> {
    let unreachable = |source| ReadError::Unreachable {
        cluster,
        topic: topic.to_string(),
        source,
    };
    let consumer: BaseConsumer = assign_only_config(client, READER_GROUP)
        .create()
        .map_err(unreachable)?;
    let deadline = Instant::now() + timeout;
    // Metadata first: a missing topic is an answer, not a timeout.
    // A cluster that does not answer metadata within this does not answer at all.
    let md = consumer
        .fetch_metadata(Some(topic), timeout.min(METADATA_TIMEOUT))
        .map_err(unreachable)?;
    let exists = md
        .topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
    if !exists {
        return Err(ReadError::NoTopic {
            cluster,
            topic: topic.to_string(),
        });
    }
    let (low, high) = consumer
        .fetch_watermarks(topic, 0, remaining(deadline))
        .map_err(unreachable)?;
    if high <= low {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .and_then(|_| consumer.assign(&tpl))
        .map_err(unreachable)?;
    let mut next = low;
    while next < high {
        if Instant::now() >= deadline {
            return Err(ReadError::Timeout {
                cluster,
                topic: topic.to_string(),
                at: next,
                end: high,
                timeout,
            });
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                next = m.offset() + 1;
                on_record(&m);
            }
            // The end under read_committed (an open transaction) or after compaction.
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::UnknownTopicOrPartition,
            ))) => {
                return Err(ReadError::NoTopic {
                    cluster,
                    topic: topic.to_string(),
                });
            }
            // Transient errors (a broker reconnect) are retried until the deadline.
            Some(Err(_)) | None => {}
        }
    }
    Ok(())
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100))
}
