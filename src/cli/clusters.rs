//! The few Kafka calls the CLI makes: metadata, a group's committed offsets and members, the
//! flow's offset syncs, and a synchronous offset commit that is read back. Blocking; every call
//! has a timeout.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::metadata::Metadata;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::CliError;
use crate::api::OffsetSyncsLocation;
use crate::flow::Flow;
use crate::kafka::checkpoints::{ReadError, read_offset_syncs};
use crate::kafka::commit::commit_within;
use crate::mm2::{OffsetSync, SyncOrigin};

/// Metadata, group and offset requests.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Reading a whole checkpoints or offset-syncs topic.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// A commit waits for the group's coordinator: longer than one request, bounded all the same.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Groups planned at the same time (each on its own clients).
pub const WORKERS: usize = 8;

/// `f` over `items` on up to `workers` threads; results in the order of `items`.
pub fn par_map<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new(items.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers.clamp(1, items.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    let mut all = results.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(slot) = all.get_mut(i) {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

/// (topic, partition).
pub type Partition = (String, i32);

/// A consumer that never subscribes: used for metadata, offset fetches and commits as `group`.
pub fn consumer(
    client: &ClientConfig,
    cluster: &'static str,
    group: &str,
) -> Result<BaseConsumer, CliError> {
    client
        .clone()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("socket.timeout.ms", "10000")
        .create()
        .map_err(|source| CliError::Kafka {
            what: "creating a client".into(),
            cluster,
            source,
        })
}

/// Metadata of every topic; an error here is how an unreachable cluster shows.
pub fn metadata(consumer: &BaseConsumer, cluster: &'static str) -> Result<Metadata, CliError> {
    consumer
        .fetch_metadata(None, TIMEOUT)
        .map_err(|source| CliError::Unreachable { cluster, source })
}

/// The group's committed offsets on `partitions`; partitions without a commit are absent.
pub fn committed(
    client: &ClientConfig,
    cluster: &'static str,
    group: &str,
    partitions: &[Partition],
) -> Result<BTreeMap<Partition, i64>, CliError> {
    let mut out = BTreeMap::new();
    if partitions.is_empty() {
        return Ok(out);
    }
    let mut tpl = TopicPartitionList::new();
    for (t, p) in partitions {
        tpl.add_partition(t, *p);
    }
    let c = consumer(client, cluster, group)?;
    let got = c
        .committed_offsets(tpl, TIMEOUT)
        .map_err(|source| CliError::Kafka {
            what: format!("reading the committed offsets of group '{group}'"),
            cluster,
            source,
        })?;
    for e in got.elements() {
        if let Offset::Offset(o) = e.offset() {
            out.insert((e.topic().to_string(), e.partition()), o);
        }
    }
    Ok(out)
}

pub use crate::kafka::groups::Membership;

/// A group's state and members as its coordinator reports them (both consumer group
/// protocols, and streams groups: the project's own connection of `side` is required, as the
/// classic description alone calls a running KIP-848 group dead).
pub fn membership(
    side: &super::share_groups::Side<'_>,
    group: &str,
) -> Result<Membership, CliError> {
    let c = consumer(side.client, side.name, group)?;
    side.with(|own| {
        crate::kafka::groups::describe_any(c.client(), Some(own.cluster_mut()), group, TIMEOUT)
            .map_err(|source| CliError::Kafka {
                what: format!("describing group '{group}'"),
                cluster: side.name,
                source,
            })
    })
}

/// The flow's offset syncs, from whichever cluster `offsetSyncsLocation` puts them on; none when
/// the topic does not exist (yet), which costs the callers exactness, not correctness.
pub fn flow_offset_syncs(flow: &Flow) -> Result<Vec<(OffsetSync, SyncOrigin)>, CliError> {
    let (client, cluster, topic) = match flow.spec.source_loop.offset_syncs_location {
        OffsetSyncsLocation::Source => (
            &flow.source_client,
            "source",
            flow.policy.offset_syncs_topic(flow.target_alias()),
        ),
        OffsetSyncsLocation::Target => (
            &flow.target_client,
            "target",
            flow.policy.offset_syncs_topic(flow.source_alias()),
        ),
    };
    match read_offset_syncs(client, cluster, &topic, READ_TIMEOUT) {
        Ok(read) => Ok(read.items),
        Err(ReadError::NoTopic { .. }) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Commits `offsets` (with their metadata) as `group` and reads them back; an offset that did
/// not land is an error naming its partition.
pub fn commit(
    client: &ClientConfig,
    cluster: &'static str,
    group: &str,
    offsets: &[(Partition, i64, String)],
) -> Result<(), CliError> {
    if offsets.is_empty() {
        return Ok(());
    }
    let kafka = |what: String| {
        move |source| CliError::Kafka {
            what,
            cluster,
            source,
        }
    };
    let mut tpl = TopicPartitionList::new();
    for ((t, p), o, metadata) in offsets {
        tpl.add_partition_offset(t, *p, Offset::Offset(*o))
            .map_err(kafka(format!("preparing the commit of {t}-{p}")))?;
        if let Some(mut e) = tpl.find_partition(t, *p) {
            e.set_metadata(metadata.clone());
        }
    }
    let c = consumer(client, cluster, group)?;
    commit_within(c, tpl, COMMIT_TIMEOUT)
        .map_err(kafka(format!("committing offsets of group '{group}'")))?;
    let partitions: Vec<Partition> = offsets.iter().map(|(tp, _, _)| tp.clone()).collect();
    let back = committed(client, cluster, group, &partitions)?;
    for ((t, p), o, _) in offsets {
        let now = back.get(&(t.clone(), *p));
        if now != Some(o) {
            return Err(CliError::Kafka {
                what: format!(
                    "group '{group}' {t}-{p}: committed {o} but the broker now reports {}",
                    now.map_or("no offset".to_string(), i64::to_string)
                ),
                cluster,
                source: rdkafka::error::KafkaError::ConsumerCommit(
                    rdkafka::types::RDKafkaErrorCode::Fail,
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn par_map_keeps_the_order() {
        let items: Vec<u64> = (0..50).collect();
        let out = par_map(&items, 4, |i| {
            std::thread::sleep(std::time::Duration::from_millis(50 - i));
            i * 2
        });
        assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>());
        assert!(par_map(&Vec::<u8>::new(), 4, |i| *i).is_empty());
    }
}
