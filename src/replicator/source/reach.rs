//! Whether a cluster can be reached, logged once per change rather than once per retry.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::replicator::Metrics;

pub struct ClusterHealth {
    cluster: &'static str,
    down: AtomicBool,
    metrics: Metrics,
}

impl ClusterHealth {
    pub fn new(cluster: &'static str, metrics: &Metrics) -> Self {
        metrics
            .cluster_unreachable
            .with_label_values(&[cluster])
            .set(0);
        ClusterHealth {
            cluster,
            down: AtomicBool::new(false),
            metrics: metrics.clone(),
        }
    }

    pub fn unreachable(&self, reason: &str) {
        self.metrics
            .errors
            .with_label_values(&["source", "unreachable"])
            .inc();
        if !self.down.swap(true, Ordering::Relaxed) {
            self.metrics
                .cluster_unreachable
                .with_label_values(&[self.cluster])
                .set(1);
            tracing::warn!(cluster = self.cluster, %reason, "cluster unreachable; retrying with backoff");
        }
    }

    pub fn reachable(&self) {
        // Cheap on the hot path: a load, and a swap only on a change.
        if self.down.load(Ordering::Relaxed) && self.down.swap(false, Ordering::Relaxed) {
            self.metrics
                .cluster_unreachable
                .with_label_values(&[self.cluster])
                .set(0);
            tracing::info!(cluster = self.cluster, "cluster reachable again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_flips_the_gauge_and_counts_every_error() {
        let m = Metrics::new().unwrap();
        let h = ClusterHealth::new("target", &m);
        h.unreachable("down");
        h.unreachable("still down");
        let g = || m.cluster_unreachable.with_label_values(&["target"]).get();
        assert_eq!(g(), 1);
        assert_eq!(
            m.errors.with_label_values(&["source", "unreachable"]).get(),
            2
        );
        h.reachable();
        assert_eq!(g(), 0);
    }
}
