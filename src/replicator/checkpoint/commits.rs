//! Follows the source's `__consumer_offsets` with a consumer group, so each commit reaches the
//! loop as it happens and the replicas split the groups between them.
//!
//! A group's commits always land in the same `__consumer_offsets` partition, so the group
//! protocol's partition assignment is a group assignment. The follower never commits its own
//! position: on every assignment it re-reads its partitions from the beginning (the topic is
//! compacted, so that is about one record per committed partition), which rebuilds the new
//! owner's state without any hand-over between replicas.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::events::Event;
use super::state::{Commit, group_wanted};
use crate::mm2::consumer_offsets::{self, Record};
use crate::mm2::{NameFilter, TopicPartition};
use crate::replicator::kafka_io::{Reachability, is_unreachable, log_client_error};
use crate::replicator::metrics::Metrics;

pub const CONSUMER_OFFSETS: &str = "__consumer_offsets";

/// Forwards assignment changes to the loop, in order with the records.
struct RebalanceForwarder {
    tx: mpsc::Sender<Event>,
    metrics: Metrics,
}

impl ClientContext for RebalanceForwarder {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(&error, reason);
    }
}

impl ConsumerContext for RebalanceForwarder {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let partitions = tpl.elements().iter().map(|e| e.partition()).collect();
            if hand_over(&self.tx, partitions, HANDOVER_WAIT) == Handover::TimedOut {
                self.metrics
                    .errors
                    .with_label_values(&["checkpoint", "handover_timeout"])
                    .inc();
            }
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let partitions = tpl.elements().iter().map(|e| e.partition()).collect();
                let _ = self.tx.blocking_send(Event::Assigned(partitions));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!(error = %e, "__consumer_offsets rebalance error"),
        }
    }
}

/// The longest a revocation waits for the loop: its writes fail by
/// [`super::freeze::CHECKPOINT_WRITE_TIMEOUT`]. Well under the rebalance timeout
/// (`max.poll.interval.ms`, 300 s), within which the coordinator waits for this member.
const HANDOVER_WAIT: Duration =
    super::freeze::CHECKPOINT_WRITE_TIMEOUT.saturating_add(Duration::from_secs(30));

/// How a revocation's hand-over ended.
#[derive(Debug, PartialEq, Eq)]
enum Handover {
    /// The loop forgot the revoked groups with none of its writes in flight.
    Settled,
    /// The loop is gone: nothing of it can be in flight.
    LoopGone,
    /// The loop did not answer within the wait (a write still in flight is possible).
    TimedOut,
}

/// Tells the loop `partitions` are revoked and waits, at most `wait`, until it handled that.
/// Run in the rebalance callback, before this member rejoins: the coordinator hands the
/// partitions (their groups) to another replica only after that, so a checkpoint this
/// replica decided while it owned a group can never land after the new owner's first one
/// (it did, found by the chaos test: a write waiting out a target restart landed after the
/// new owner, who had read the checkpoints to their end, wrote a later one: a checkpoint
/// going backwards).
fn hand_over(tx: &mpsc::Sender<Event>, partitions: Vec<i32>, wait: Duration) -> Handover {
    let (settled, answer) = std::sync::mpsc::channel();
    let sent = tx.blocking_send(Event::Revoked(partitions)).is_ok()
        && tx.blocking_send(Event::Handover(settled)).is_ok();
    if !sent {
        return Handover::LoopGone;
    }
    let started = Instant::now();
    match answer.recv_timeout(wait) {
        Ok(()) => {
            tracing::debug!(waited = ?started.elapsed(), "revocation handed over");
            Handover::Settled
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Handover::LoopGone,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            tracing::warn!(
                ?wait,
                "the checkpoint loop did not settle its writes before a revocation; the new owner may write before them"
            );
            Handover::TimedOut
        }
    }
}

/// Starts the follower thread. `group_id` is this flow's `mirrorflow.<flow>.<source>-<target>.checkpoints`.
pub fn follow(
    source: &ClientConfig,
    group_id: &str,
    groups: NameFilter,
    reach: Arc<Reachability>,
    metrics: Metrics,
    tx: mpsc::Sender<Event>,
    shutdown: CancellationToken,
) -> Result<std::thread::JoinHandle<()>, KafkaError> {
    let consumer: BaseConsumer<RebalanceForwarder> = source
        .clone()
        .set("group.id", group_id)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // Commits of aborted transactions never count as the group's position.
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        // Freshness: the broker answers a fetch at most this late when nothing is new.
        .set("fetch.wait.max.ms", "100")
        .create_with_context(RebalanceForwarder {
            tx: tx.clone(),
            metrics: metrics.clone(),
        })?;
    consumer.subscribe(&[CONSUMER_OFFSETS])?;
    Ok(std::thread::spawn(move || {
        let mut last_probe = Instant::now();
        while !shutdown.is_cancelled() && !tx.is_closed() {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    reach.ok();
                    let Some(key) = m.key() else { continue };
                    let record = match consumer_offsets::decode(key, m.payload()) {
                        Ok(r) => r,
                        Err(e) => {
                            metrics
                                .errors
                                .with_label_values(&["checkpoint", e.metric_label()])
                                .inc();
                            tracing::debug!(partition = m.partition(), offset = m.offset(), error = %e,
                                "skipping an undecodable __consumer_offsets record");
                            continue;
                        }
                    };
                    let Some(event) = commit_event(m.partition(), record, &groups) else {
                        continue;
                    };
                    if tx.blocking_send(event).is_err() {
                        return;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    reach.ok();
                    if tx.blocking_send(Event::CaughtUp(partition)).is_err() {
                        return;
                    }
                }
                Some(Err(e)) if is_unreachable(&e) => reach.unreachable("following commits", &e),
                Some(Err(e)) => {
                    reach.failed("following __consumer_offsets", &e);
                }
                None => {}
            }
            if reach.is_down() && last_probe.elapsed() > Duration::from_secs(2) {
                last_probe = Instant::now();
                if consumer
                    .fetch_watermarks(CONSUMER_OFFSETS, 0, Duration::from_secs(2))
                    .is_ok()
                {
                    reach.ok();
                }
            }
        }
        // Leave the group at once so another replica takes the groups over without waiting
        // for the session timeout.
        consumer.unsubscribe();
    }))
}

/// The loop's event for one decoded record of `__consumer_offsets` partition `co_partition`:
/// only offset commits (and their deletions) of the groups the flow checkpoints.
fn commit_event(co_partition: i32, record: Record, groups: &NameFilter) -> Option<Event> {
    let Record::OffsetCommit { key, value } = record else {
        return None;
    };
    if !group_wanted(groups, &key.group) {
        return None;
    }
    Some(Event::Commit {
        co_partition,
        group: key.group,
        tp: TopicPartition::new(key.topic, key.partition),
        commit: value.map(|v| Commit {
            offset: v.offset,
            metadata: v.metadata,
            commit_timestamp_ms: v.commit_timestamp_ms,
            // The loop decides whether it was read live.
            live: false,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm2::consumer_offsets::{OffsetCommitKey, OffsetCommitValue};

    fn offset_commit(group: &str, value: Option<i64>) -> Record {
        Record::OffsetCommit {
            key: OffsetCommitKey {
                group: group.into(),
                topic: "t".into(),
                partition: 2,
            },
            value: value.map(|offset| OffsetCommitValue {
                offset,
                leader_epoch: Some(4),
                metadata: "meta".into(),
                commit_timestamp_ms: 1_234,
            }),
        }
    }

    fn filter() -> NameFilter {
        NameFilter::new("groups", &[".*"], "groups.exclude", &["secret.*"]).unwrap()
    }

    #[test]
    fn a_commit_of_a_followed_group_becomes_a_commit_event_not_yet_live() {
        let Some(Event::Commit {
            co_partition,
            group,
            tp,
            commit,
        }) = commit_event(9, offset_commit("payments", Some(42)), &filter())
        else {
            panic!("a followed group's commit is an event");
        };
        assert_eq!((co_partition, group.as_str()), (9, "payments"));
        assert_eq!(tp, TopicPartition::new("t", 2));
        assert_eq!(
            commit,
            Some(Commit {
                offset: 42,
                metadata: "meta".into(),
                commit_timestamp_ms: 1_234,
                live: false,
            })
        );
    }

    #[test]
    fn a_deleted_offset_becomes_a_commit_event_without_a_commit() {
        assert!(matches!(
            commit_event(0, offset_commit("payments", None), &filter()),
            Some(Event::Commit { commit: None, .. })
        ));
    }

    #[test]
    fn commits_of_excluded_or_own_groups_and_other_records_are_not_events() {
        for (record, why) in [
            (
                offset_commit("secret-app", Some(1)),
                "excluded by the filter",
            ),
            (
                offset_commit("mirrorflow.f.A-B.checkpoints", Some(1)),
                "the replicator's own group",
            ),
            (
                offset_commit("secret-app", None),
                "an excluded group's deletion",
            ),
            (Record::Other { key_version: 2 }, "group metadata"),
        ] {
            assert!(commit_event(0, record, &filter()).is_none(), "{why}");
        }
    }

    #[test]
    fn a_revocation_waits_until_the_loop_handled_it() {
        let (tx, mut rx) = mpsc::channel(8);
        let the_loop = std::thread::spawn(move || {
            let Some(Event::Revoked(partitions)) = rx.blocking_recv() else {
                return None;
            };
            // A write still settling.
            std::thread::sleep(Duration::from_millis(300));
            let Some(Event::Handover(settled)) = rx.blocking_recv() else {
                return None;
            };
            settled.send(()).ok()?;
            Some(partitions)
        });
        let started = Instant::now();
        assert_eq!(
            hand_over(&tx, vec![3, 7], Duration::from_secs(10)),
            Handover::Settled
        );
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(the_loop.join().ok().flatten(), Some(vec![3, 7]));
    }

    #[test]
    fn a_revocation_waits_no_longer_than_its_bound_nor_for_a_loop_that_is_gone() {
        let (tx, mut rx) = mpsc::channel(8);
        let started = Instant::now();
        assert_eq!(
            hand_over(&tx, vec![1], Duration::from_millis(200)),
            Handover::TimedOut,
            "nobody answered"
        );
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(matches!(rx.try_recv(), Ok(Event::Revoked(_))));
        // The loop received the hand-over and ended without answering.
        let Ok(Event::Handover(settled)) = rx.try_recv() else {
            panic!("no hand-over sent");
        };
        drop(settled);
        let waiter = std::thread::spawn(move || {
            let Some(Event::Handover(settled)) =
                rx.blocking_recv().and_then(|_| rx.blocking_recv())
            else {
                return;
            };
            drop(settled);
        });
        assert_eq!(
            hand_over(&tx, vec![2], Duration::from_secs(10)),
            Handover::LoopGone
        );
        waiter.join().ok();
        let (closed, rx) = mpsc::channel(1);
        drop(rx);
        assert_eq!(
            hand_over(&closed, vec![1], Duration::from_secs(10)),
            Handover::LoopGone
        );
    }
}
