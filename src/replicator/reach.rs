//! Whether each cluster can be reached, as every loop of this replicator sees it.
//!
//! One meaning of "unreachable" ([`is_unreachable`]) and one state per cluster ([`Cluster`],
//! held in the [`super::context::Context`]), so the `cluster_unreachable{cluster}` gauge says what the
//! replicator last saw of that cluster, whichever loop saw it, and a change is logged once.
//! Each loop reports through its own [`Reachability`], which counts its errors under its name.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::error::KafkaError;
#[cfg(test)]
use rdkafka::error::RDKafkaErrorCode;

use super::metrics::Metrics;

use super::stops::{Stops, lock, no_stops};
use crate::kafka::refusals::{Refusal, UNREADABLE_MARK, truncated};

pub use crate::kafka::{Side, is_unreachable};

/// One cluster's reachability, shared by every loop.
pub struct Cluster {
    side: Side,
    down: AtomicBool,
    metrics: Metrics,
    stops: Stops,
}

/// Both clusters of the flow.
pub struct Clusters {
    pub source: Arc<Cluster>,
    pub target: Arc<Cluster>,
    /// What stopped, by remote (or followed internal) topic and partition, for the refusal
    /// record the source loop's discovery writes: the copy's stalls and stops, and the
    /// internal topics a loop cannot read on ([`Reachability::hold`]).
    pub stops: Stops,
}

impl Clusters {
    pub fn new(metrics: &Metrics) -> Self {
        let stops = no_stops();
        let cluster = |side: Side| {
            metrics
                .cluster_unreachable
                .with_label_values(&[side.name()])
                .set(0);
            Arc::new(Cluster {
                side,
                down: AtomicBool::new(false),
                metrics: metrics.clone(),
                stops: stops.clone(),
            })
        };
        Clusters {
            source: cluster(Side::Source),
            target: cluster(Side::Target),
            stops,
        }
    }

    pub fn get(&self, side: Side) -> &Arc<Cluster> {
        match side {
            Side::Source => &self.source,
            Side::Target => &self.target,
        }
    }
}

/// One loop's view of one cluster: reports into the shared [`Cluster`] and counts the loop's
/// errors (`errors_total{loop, kind}`).
pub struct Reachability {
    cluster: Arc<Cluster>,
    loop_name: &'static str,
}

impl Reachability {
    pub fn new(cluster: &Arc<Cluster>, loop_name: &'static str) -> Arc<Self> {
        Arc::new(Reachability {
            cluster: cluster.clone(),
            loop_name,
        })
    }

    pub fn side(&self) -> Side {
        self.cluster.side
    }

    pub fn is_down(&self) -> bool {
        self.cluster.down.load(Ordering::Relaxed)
    }

    fn count(&self, kind: &str) {
        self.cluster
            .metrics
            .errors
            .with_label_values(&[self.loop_name, kind])
            .inc();
    }

    /// A request failed; `e` decides whether that means unreachable or just an error.
    pub fn failed(&self, what: &str, e: &KafkaError) {
        if is_unreachable(e) {
            self.unreachable(what, e);
        } else {
            self.refused(what, e);
        }
    }

    /// The cluster answered `what` with a refusal (counted as `kind="kafka"`).
    pub fn refused(&self, what: &str, e: &dyn std::fmt::Display) {
        self.count("kafka");
        tracing::warn!(loop_name = self.loop_name, cluster = %self.side(), error = %e, "{what} failed");
    }

    /// `what` (a loop following partition 0 of `topic`) is refused a batch there again and
    /// again (`why`): librdkafka holds the partition at it, so the loop goes on with what it
    /// read before. Recorded until [`Self::release`], so the status names the topic and the fix.
    pub fn hold(&self, what: &str, topic: &str, why: &str) {
        self.count("refused_batch");
        let message = format!(
            "{topic}{UNREADABLE_MARK} ({why}): {what} waits at it and goes on with what it read before; librdkafka tries the batch again and never skips it. Delete the topic's records up to past the batch (kafka-delete-records on the {} cluster), or have its writer write it again",
            self.side()
        );
        // librdkafka reports the same batch about every half second: logged once per hold.
        if let std::collections::btree_map::Entry::Vacant(entry) =
            lock(&self.cluster.stops).entry((topic.to_string(), 0))
        {
            tracing::error!(loop_name = self.loop_name, cluster = %self.side(), topic, "{message}");
            entry.insert(Refusal {
                topic: topic.to_string(),
                detected_ms: crate::clock::now_ms(),
                message: truncated(message),
            });
        }
    }

    /// `topic` is read on again: its [`Self::hold`] is taken out.
    pub fn release(&self, topic: &str) {
        let mut stops = lock(&self.cluster.stops);
        let key = (topic.to_string(), 0);
        if stops
            .get(&key)
            .is_some_and(|r| r.message.contains(UNREADABLE_MARK))
        {
            stops.remove(&key);
            tracing::info!(
                loop_name = self.loop_name,
                topic,
                "read on past the refused batch"
            );
        }
    }

    /// The cluster could not be reached doing `what`.
    pub fn unreachable(&self, what: &str, e: &dyn std::fmt::Display) {
        self.count("unreachable");
        if !self.cluster.down.swap(true, Ordering::Relaxed) {
            self.cluster
                .metrics
                .cluster_unreachable
                .with_label_values(&[self.side().name()])
                .set(1);
            tracing::warn!(loop_name = self.loop_name, cluster = %self.side(), error = %e,
                "{} cluster unreachable ({what}); retrying with backoff", self.side());
        }
    }

    /// A follower's position left the log (the topic was truncated or deleted and created
    /// again): counted as `errors_total{kind="position_lost"}` and logged at error, since
    /// records between may have been missed.
    pub fn position_lost(&self, topic: &str) {
        self.count("position_lost");
        tracing::error!(
            loop_name = self.loop_name,
            cluster = %self.side(),
            topic,
            "the followed position is no longer in {topic} (truncated, or deleted and created again); following it again from its earliest record"
        );
    }

    /// The cluster answered. Cheap on the hot path: a load, and a swap only on a change.
    pub fn ok(&self) {
        let down = &self.cluster.down;
        if down.load(Ordering::Relaxed) && down.swap(false, Ordering::Relaxed) {
            self.cluster
                .metrics
                .cluster_unreachable
                .with_label_values(&[self.side().name()])
                .set(0);
            tracing::info!(
                loop_name = self.loop_name,
                cluster = %self.side(),
                "{} cluster reachable again",
                self.side()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_recorded_once_until_released_and_leaves_other_stops_alone() {
        let m = Metrics::new().unwrap();
        let clusters = Clusters::new(&m);
        let r = Reachability::new(&clusters.source, "checkpoint");
        r.hold(
            "offset syncs",
            "syncs",
            "gzip records inflate to more than 1 bytes",
        );
        let first = lock(&clusters.stops).clone();
        // Reported again (librdkafka tries every half second): the same record, counted.
        r.hold(
            "offset syncs",
            "syncs",
            "gzip records inflate to more than 1 bytes",
        );
        assert_eq!(*lock(&clusters.stops), first);
        assert_eq!(first.len(), 1);
        assert_eq!(
            m.errors
                .with_label_values(&["checkpoint", "refused_batch"])
                .get(),
            2
        );
        // A stop of the copy under the same key is not the follower's to take out.
        let stalled = Refusal {
            topic: "a.t".into(),
            detected_ms: 1,
            message: "partition 0 of t copies nothing: stalled at 5".into(),
        };
        lock(&clusters.stops).insert(("a.t".into(), 0), stalled);
        r.release("a.t");
        r.release("syncs");
        let left: Vec<String> = lock(&clusters.stops).keys().map(|k| k.0.clone()).collect();
        assert_eq!(left, vec!["a.t".to_string()]);
    }

    #[test]
    fn one_state_per_cluster_whichever_loop_reports() {
        let m = Metrics::new().unwrap();
        let clusters = Clusters::new(&m);
        let source_loop = Reachability::new(&clusters.target, "source");
        let checkpoint_loop = Reachability::new(&clusters.target, "checkpoint");
        let gauge = || m.cluster_unreachable.with_label_values(&["target"]).get();
        source_loop.unreachable("copying", &"down");
        source_loop.unreachable("copying", &"still down");
        assert_eq!(gauge(), 1);
        assert!(
            checkpoint_loop.is_down(),
            "the other loop sees the same cluster"
        );
        assert_eq!(
            m.errors.with_label_values(&["source", "unreachable"]).get(),
            2
        );
        checkpoint_loop.ok();
        assert_eq!(gauge(), 0);
        assert!(!source_loop.is_down());
        assert_eq!(
            m.cluster_unreachable.with_label_values(&["source"]).get(),
            0
        );
    }

    #[test]
    fn refused_requests_are_errors_not_unreachable_clusters() {
        let m = Metrics::new().unwrap();
        let clusters = Clusters::new(&m);
        let r = Reachability::new(&clusters.source, "checkpoint");
        r.failed(
            "reading",
            &KafkaError::MessageConsumption(RDKafkaErrorCode::TopicAuthorizationFailed),
        );
        assert!(!r.is_down());
        assert_eq!(
            m.errors.with_label_values(&["checkpoint", "kafka"]).get(),
            1
        );
        r.failed(
            "reading",
            &KafkaError::MessageConsumption(RDKafkaErrorCode::AllBrokersDown),
        );
        assert!(r.is_down());
    }
}
