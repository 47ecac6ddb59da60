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

pub use crate::kafka::{Side, is_unreachable};

/// One cluster's reachability, shared by every loop.
pub struct Cluster {
    side: Side,
    down: AtomicBool,
    metrics: Metrics,
}

/// Both clusters of the flow.
pub struct Clusters {
    pub source: Arc<Cluster>,
    pub target: Arc<Cluster>,
}

impl Clusters {
    pub fn new(metrics: &Metrics) -> Self {
        let cluster = |side: Side| {
            metrics
                .cluster_unreachable
                .with_label_values(&[side.name()])
                .set(0);
            Arc::new(Cluster {
                side,
                down: AtomicBool::new(false),
                metrics: metrics.clone(),
            })
        };
        Clusters {
            source: cluster(Side::Source),
            target: cluster(Side::Target),
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
