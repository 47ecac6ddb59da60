//! Partitions that stopped making progress, in every mode: a partition whose copy has not
//! moved for [`STALL_AFTER`] while the source holds records beyond it is named (topic,
//! partition, the source offset it waits at, the policy's reason when it knows one) in the log,
//! in the metrics and in the refusal record of the positions topic, which the status shows in
//! `Replicating`. A copy that stops silently is invisible otherwise: its lag grows, but nothing
//! says which partition or why.
//!
//! The judgement is pure ([`StallWatch::observe`]); the copy thread feeds it every
//! [`CHECK_EVERY`] with the policy's copied positions ([`Delivery::copied`]) and
//! the source's ends ([`check`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::delivery::{Copied, Delivery};
use super::shared::Shared;
use crate::kafka::refusals::{Refusal, STALLED_MARK, truncated};
use crate::replicator::stops::{Stops, lock};

/// How long a partition may copy nothing while the source has records beyond it.
pub const STALL_AFTER: Duration = Duration::from_secs(60);
/// How often the copy thread looks.
pub const CHECK_EVERY: Duration = Duration::from_secs(10);

/// A partition that stopped, or started again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Stalled {
        copied: Copied,
        /// Where the source ends (what a `read_committed` reader can reach).
        source_end: i64,
        since: Duration,
    },
    /// Moving again, caught up, or no longer this replica's.
    Cleared { remote: String, partition: i32 },
}

#[derive(Debug)]
struct Watched {
    next: i64,
    since: Instant,
    stalled: Option<String>,
}

/// The partitions' last movements.
#[derive(Debug, Default)]
pub struct StallWatch {
    seen: HashMap<(String, i32), Watched>,
}

impl StallWatch {
    /// `copied`: every partition the policy owns; `ends`: the source's end of those it could
    /// read (a partition without one is not judged this time).
    pub fn observe(
        &mut self,
        copied: &[Copied],
        ends: &HashMap<(String, i32), i64>,
        now: Instant,
    ) -> Vec<Change> {
        self.observe_within(copied, ends, now, STALL_AFTER)
    }

    /// [`Self::observe`], naming a partition once it has not moved for `after`.
    pub fn observe_within(
        &mut self,
        copied: &[Copied],
        ends: &HashMap<(String, i32), i64>,
        now: Instant,
        after: Duration,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        let owned: std::collections::HashSet<(String, i32)> = copied
            .iter()
            .map(|c| (c.topic.clone(), c.partition))
            .collect();
        self.seen.retain(|key, w| {
            let keep = owned.contains(key);
            if !keep && let Some(remote) = w.stalled.take() {
                changes.push(Change::Cleared {
                    remote,
                    partition: key.1,
                });
            }
            keep
        });
        for c in copied {
            let key = (c.topic.clone(), c.partition);
            let w = self.seen.entry(key.clone()).or_insert(Watched {
                next: c.next,
                since: now,
                stalled: None,
            });
            let Some(&end) = ends.get(&key) else {
                continue;
            };
            if w.next != c.next || c.next >= end {
                w.next = c.next;
                w.since = now;
                if let Some(remote) = w.stalled.take() {
                    changes.push(Change::Cleared {
                        remote,
                        partition: c.partition,
                    });
                }
                continue;
            }
            let since = now.saturating_duration_since(w.since);
            if since >= after && w.stalled.is_none() {
                w.stalled = Some(c.remote.clone());
                changes.push(Change::Stalled {
                    copied: c.clone(),
                    source_end: end,
                    since,
                });
            }
        }
        changes
    }
}

/// The sentence the status shows for a stalled partition.
pub fn message(copied: &Copied, source_end: i64, since: Duration) -> String {
    let at = if copied.next >= 0 {
        format!("at source offset {}", copied.next)
    } else {
        "before its first record".to_string()
    };
    let reason = copied
        .reason
        .as_deref()
        .unwrap_or("no reason known to the replicator; its log at debug level may tell more");
    format!(
        "partition {} of {}{STALLED_MARK}{at} for {} s while the source holds records up to offset {source_end} ({reason}); the replicator retries on its own, restarting its pod moves the partition",
        copied.partition,
        copied.topic,
        since.as_secs()
    )
}

/// How soon a partition is named while the source consumer is refused batches
/// ([`Refused`]): it cannot move past such a batch, and the refusal says why.
pub const REFUSED_STALL_AFTER: Duration = Duration::from_secs(15);
/// How long a refused batch explains a partition that does not move: librdkafka tries the
/// batch again every half second or so while its partition is read.
const REFUSED_EXPLAINS_FOR: Duration = Duration::from_secs(60);

/// The last batch the source consumer reported it could not read (librdkafka's error names
/// neither the partition nor why; the binary's inflaters keep the why): librdkafka tries such
/// a batch again and again, so its partition stops there, and the stall watch, which finds
/// the partition, gives it this reason, sooner.
#[derive(Debug, Default)]
pub struct Refused {
    last: Option<(Instant, String)>,
}

impl Refused {
    /// The consumer reported `error`, a batch it cannot read ([`crate::kafka::is_unreadable_batch`]).
    /// Whether it is news: no refusal was noted within [`REFUSED_EXPLAINS_FOR`] (librdkafka
    /// reports the same batch about every half second, for as long as it stays).
    pub fn note(&mut self, error: &rdkafka::error::KafkaError, now: Instant) -> bool {
        let news = self.reason(now).is_none();
        self.last = Some((now, crate::kafka::unreadable_reason(error)));
        news
    }

    /// The reason a partition that does not move is given, while a refusal is recent.
    pub fn reason(&self, now: Instant) -> Option<String> {
        let (at, why) = self.last.as_ref()?;
        (now.saturating_duration_since(*at) < REFUSED_EXPLAINS_FOR).then(|| {
            format!(
                "the source consumer is refused a batch again and again: {why}; librdkafka, which reads records for this copy, holds the partition at it rather than skip its records. Whole batches copy such a batch without inflating it: remove spec.sourceLoop.copy (not with exactlyOnce or offsets: Aligned); or delete the source's records up to past it (kafka-delete-records)"
            )
        })
    }
}

/// `copied` with `refused` as the reason of the partitions whose policy knows none.
pub fn explained(mut copied: Vec<Copied>, refused: Option<&str>) -> Vec<Copied> {
    if let Some(why) = refused {
        for c in copied.iter_mut().filter(|c| c.waits_on_reader) {
            c.reason = Some(why.to_string());
        }
    }
    copied
}

/// One look: the policy's positions against the source's ends; stalls are logged, counted,
/// shown in the metrics and put in `stops` (the refusal record the discovery loop writes),
/// and taken out again when the partition moves. While the source consumer is refused
/// batches (`refused`), a partition is named sooner, with that reason.
pub fn check<P: Delivery>(
    watch: &mut StallWatch,
    policy: &P,
    stops: &Stops,
    read: &HashMap<(String, i32), i64>,
    refused: Option<&str>,
) {
    let copied = explained(caught_up_by_reading(policy.copied(), read), refused);
    let after = if refused.is_some() {
        REFUSED_STALL_AFTER
    } else {
        STALL_AFTER
    };
    if copied.is_empty() && watch.seen.is_empty() {
        return;
    }
    let shared = policy.shared();
    let ends = source_ends(shared, &copied);
    for change in watch.observe_within(&copied, &ends, Instant::now(), after) {
        match change {
            Change::Stalled {
                copied,
                source_end,
                since,
            } => name_stall(shared, stops, &copied, source_end, since),
            Change::Cleared { remote, partition } => {
                clear_stall(shared, stops, &copied, &remote, partition)
            }
        }
    }
}

/// Where the source ends for each of `copied`'s partitions, as far as a quick look tells.
fn source_ends(shared: &Shared, copied: &[Copied]) -> HashMap<(String, i32), i64> {
    if copied.is_empty() {
        return HashMap::new();
    }
    let keys: Vec<(String, i32)> = copied
        .iter()
        .map(|c| (c.topic.clone(), c.partition))
        .collect();
    shared
        .probe
        .source_quick(&keys)
        .into_iter()
        .map(|(k, b)| (k, b.end))
        .collect()
}

/// A stalled partition logged, counted, shown in the metrics and recorded in `stops`, unless a
/// stop of the policy's own already stands for it.
fn name_stall(shared: &Shared, stops: &Stops, copied: &Copied, source_end: i64, since: Duration) {
    let metrics = &shared.ctx.metrics;
    let text = message(copied, source_end, since);
    tracing::error!(topic = %copied.topic, partition = copied.partition,
        offset = copied.next, source_end, "{text}");
    metrics
        .partition_stalled
        .with_label_values(&[&copied.topic, &copied.partition.to_string()])
        .set(copied.next);
    metrics.partition_stalls.inc();
    lock(stops)
        .entry((copied.remote.clone(), copied.partition))
        .or_insert_with(|| Refusal {
            topic: copied.remote.clone(),
            detected_ms: crate::clock::now_ms(),
            message: truncated(text),
        });
}

/// A partition moving again (or no longer owned): its stall's own entry and metric removed.
fn clear_stall(shared: &Shared, stops: &Stops, copied: &[Copied], remote: &str, partition: i32) {
    let metrics = &shared.ctx.metrics;
    let key = (remote.to_string(), partition);
    let mut stops = lock(stops);
    // Only a stall's own entry: a batch stop of the same partition stays.
    if stops
        .get(&key)
        .is_some_and(|r| r.message.contains(STALLED_MARK))
    {
        stops.remove(&key);
    }
    drop(stops);
    tracing::info!(%remote, partition, "the stalled partition moves again");
    let topic = copied
        .iter()
        .find(|c| c.remote == remote && c.partition == partition)
        .map(|c| c.topic.clone());
    if let Some(topic) = topic {
        let _ = metrics
            .partition_stalled
            .remove_label_values(&[&topic, &partition.to_string()]);
    } else {
        clear_metric_of_remote(metrics, remote, partition, shared);
    }
}

/// [`Copied`] of the policies that track progress record by record (at-least-once, batches):
/// the newest acknowledged position, or -1 before the first.
pub fn tracked<P>(slots: &super::slots::SlotTable<super::tracked::TrackedSlot<P>>) -> Vec<Copied> {
    slots
        .iter()
        .map(|(_, s)| {
            let reason = match s.last_fault.as_deref() {
                Some(fault) => Some(format!(
                    "its last write failed ({fault}); it is copied again from its last stored position after a backoff"
                )),
                None => (!s.copying()).then(|| {
                    "a write to the target failed; the partition is copied again from its last stored position after a backoff".to_string()
                }),
            };
            Copied {
                topic: s.topic.clone(),
                partition: s.partition,
                remote: s.remote.to_string(),
                next: s.progress.latest().map_or(-1, |f| f.next),
                waits_on_reader: reason.is_none(),
                reason,
            }
        })
        .collect()
}

/// Where the source consumer has read each partition it reads records of (partitions the
/// whole-batch copy pauses have none).
pub fn read_positions<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
) -> HashMap<(String, i32), i64> {
    use rdkafka::consumer::Consumer;
    let Ok(list) = consumer.position() else {
        return HashMap::new();
    };
    list.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
            _ => None,
        })
        .collect()
}

/// A partition whose copy ends before transaction markers (or aborted records) at the log's
/// end has copied every record there is, yet its next offset stays below the source's end.
/// The source consumer reads past them: where it has read further than the copy without a
/// fault, the copy is taken to be where the consumer is, so a log at rest is no stall.
pub fn caught_up_by_reading(
    mut copied: Vec<Copied>,
    read: &HashMap<(String, i32), i64>,
) -> Vec<Copied> {
    for c in copied.iter_mut().filter(|c| c.waits_on_reader) {
        if let Some(&at) = read.get(&(c.topic.clone(), c.partition)) {
            c.next = c.next.max(at);
        }
    }
    copied
}

/// A partition no longer owned: its topic found back from the remote name by the flow's policy.
fn clear_metric_of_remote(
    metrics: &crate::replicator::metrics::Metrics,
    remote: &str,
    partition: i32,
    shared: &Shared,
) {
    let flow = &shared.ctx.flow;
    if let Some(topic) = flow.policy.upstream_topic(remote) {
        let _ = metrics
            .partition_stalled
            .remove_label_values(&[topic, &partition.to_string()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_that_ends_before_trailing_markers_is_not_a_stall() {
        let copied = |next, reason: Option<&str>| Copied {
            topic: "t".into(),
            partition: 0,
            remote: "a.t".into(),
            next,
            reason: reason.map(String::from),
            waits_on_reader: reason.is_none(),
        };
        let read: HashMap<(String, i32), i64> = [(("t".to_string(), 0), 809)].into();
        // The consumer read past the commit marker at 808: the copy is there too.
        let c = caught_up_by_reading(vec![copied(808, None)], &read);
        assert_eq!(c[0].next, 809);
        let mut watch = StallWatch::default();
        let ends: HashMap<(String, i32), i64> = [(("t".to_string(), 0), 809)].into();
        let t0 = Instant::now();
        watch.observe(&c, &ends, t0);
        assert!(watch.observe(&c, &ends, t0 + STALL_AFTER * 2).is_empty());
        // A faulted partition keeps its own position: the consumer's says nothing of writes.
        let c = caught_up_by_reading(vec![copied(808, Some("a write failed"))], &read);
        assert_eq!(c[0].next, 808);
        // A partition the consumer does not read (paused for whole batches) is left as it is.
        let c = caught_up_by_reading(vec![copied(5, None)], &HashMap::new());
        assert_eq!(c[0].next, 5);
    }

    fn at(next: i64) -> Copied {
        Copied {
            topic: "t".into(),
            partition: 1,
            remote: "a.t".into(),
            next,
            reason: Some("waiting".into()),
            waits_on_reader: false,
        }
    }

    fn end(e: i64) -> HashMap<(String, i32), i64> {
        HashMap::from([(("t".to_string(), 1), e)])
    }

    #[test]
    fn a_partition_that_does_not_move_with_records_beyond_it_is_named_once_after_a_minute() {
        let mut w = StallWatch::default();
        let t0 = Instant::now();
        assert!(w.observe(&[at(573)], &end(4800), t0).is_empty());
        let before = t0 + STALL_AFTER - Duration::from_secs(1);
        assert!(w.observe(&[at(573)], &end(4800), before).is_empty());
        let after = t0 + STALL_AFTER;
        let changes = w.observe(&[at(573)], &end(4800), after);
        assert_eq!(
            changes,
            vec![Change::Stalled {
                copied: at(573),
                source_end: 4800,
                since: STALL_AFTER
            }]
        );
        let text = message(&at(573), 4800, STALL_AFTER);
        assert!(
            text.contains("partition 1 of t") && text.contains("573"),
            "{text}"
        );
        assert!(text.contains("waiting"), "{text}");
        // Named once, not on every look.
        let later = after + CHECK_EVERY;
        assert!(w.observe(&[at(573)], &end(4800), later).is_empty());
        // Moving again clears it.
        assert_eq!(
            w.observe(&[at(600)], &end(4800), later),
            vec![Change::Cleared {
                remote: "a.t".into(),
                partition: 1
            }]
        );
    }

    #[test]
    fn a_caught_up_or_moving_partition_never_stalls() {
        let mut w = StallWatch::default();
        let t0 = Instant::now();
        for i in 0..20 {
            let now = t0 + CHECK_EVERY * i;
            assert!(w.observe(&[at(10)], &end(10), now).is_empty(), "caught up");
        }
        let mut w = StallWatch::default();
        for i in 0..20_i64 {
            let now = t0 + CHECK_EVERY * u32::try_from(i).unwrap_or(0);
            assert!(w.observe(&[at(i)], &end(100), now).is_empty(), "moving");
        }
    }

    #[test]
    fn an_unknown_source_end_is_not_judged_and_a_partition_given_up_is_cleared() {
        let mut w = StallWatch::default();
        let t0 = Instant::now();
        w.observe(&[at(-1)], &HashMap::new(), t0);
        assert!(
            w.observe(&[at(-1)], &HashMap::new(), t0 + STALL_AFTER * 2)
                .is_empty()
        );
        let stalled = w.observe(&[at(-1)], &end(5), t0 + STALL_AFTER * 3);
        assert!(matches!(stalled.as_slice(), [Change::Stalled { .. }]));
        assert!(message(&at(-1), 5, STALL_AFTER).contains("before its first record"));
        assert_eq!(
            w.observe(&[], &HashMap::new(), t0 + STALL_AFTER * 4),
            vec![Change::Cleared {
                remote: "a.t".into(),
                partition: 1
            }]
        );
    }
}

#[cfg(test)]
mod refused_tests {
    use super::*;
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;

    fn held(reason: Option<&str>) -> Copied {
        Copied {
            topic: "t".into(),
            partition: 2,
            remote: "a.t".into(),
            next: 40,
            reason: reason.map(String::from),
            waits_on_reader: reason.is_none(),
        }
    }

    #[test]
    fn a_batch_the_consumer_cannot_read_names_the_partition_it_holds_sooner_and_why() {
        let t0 = Instant::now();
        let mut refused = Refused::default();
        assert_eq!(refused.reason(t0), None);
        let undecodable = KafkaError::MessageConsumption(RDKafkaErrorCode::BadCompression);
        assert!(crate::kafka::is_unreadable_batch(&undecodable));
        assert!(crate::kafka::is_unreadable_batch(
            &KafkaError::MessageConsumption(RDKafkaErrorCode::BadMessage)
        ));
        assert!(!crate::kafka::is_unreadable_batch(
            &KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure)
        ));
        assert!(refused.note(&undecodable, t0), "the first refusal is news");
        // Tried again half a second later: not news (logged once), the reason kept.
        assert!(!refused.note(&undecodable, t0 + Duration::from_millis(500)));
        let why = refused.reason(t0 + Duration::from_secs(5)).expect("recent");
        for part in [
            "refused a batch",
            "spec.sourceLoop.copy",
            "kafka-delete-records",
        ] {
            assert!(why.contains(part), "{part} not in {why}");
        }
        // Only as long as the consumer keeps being refused (it tries every half second).
        let later = t0 + Duration::from_millis(500) + REFUSED_EXPLAINS_FOR;
        assert_eq!(refused.reason(later), None);
        assert!(
            refused.note(&undecodable, later),
            "news again after a quiet minute"
        );

        // The policy's own reason stands; a partition without one gets the refusal.
        let copied = explained(vec![held(None), held(Some("a write failed"))], Some(&why));
        assert_eq!(copied[0].reason.as_deref(), Some(why.as_str()));
        assert_eq!(copied[1].reason.as_deref(), Some("a write failed"));
        assert_eq!(explained(vec![held(None)], None)[0].reason, None);

        // Named after the shorter window, with the reason in the message.
        let mut watch = StallWatch::default();
        let ends: HashMap<(String, i32), i64> = [(("t".to_string(), 2), 90)].into();
        let copied = explained(vec![held(None)], Some(&why));
        assert!(
            watch
                .observe_within(&copied, &ends, t0, REFUSED_STALL_AFTER)
                .is_empty()
        );
        let changes = watch.observe_within(
            &copied,
            &ends,
            t0 + REFUSED_STALL_AFTER,
            REFUSED_STALL_AFTER,
        );
        let [
            Change::Stalled {
                copied,
                source_end,
                since,
            },
        ] = changes.as_slice()
        else {
            panic!("{changes:?}");
        };
        let text = message(copied, *source_end, *since);
        assert!(
            text.contains("partition 2 of t copies nothing: stalled at source offset 40"),
            "{text}"
        );
        assert!(text.contains("refused a batch"), "{text}");
    }
}
