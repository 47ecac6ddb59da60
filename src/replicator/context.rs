//! What every loop of a replica shares: the flow, the metrics, readiness, the replica's name
//! and both clusters' reachability.

use std::sync::Arc;

use super::health::{self, Loop, Readiness};
use super::metrics::Metrics;
use super::reach;
use crate::flow::Flow;

/// What every loop shares.
pub struct Context {
    pub flow: Flow,
    pub metrics: Metrics,
    pub readiness: Arc<Readiness>,
    /// This replica's name (the pod name in a pod, the host name otherwise), for logs and
    /// client ids.
    pub replica: String,
    /// Whether each cluster answers, as every loop sees it.
    pub clusters: reach::Clusters,
    /// The replica's name is stable and its own (`--replica`, the pod name in a pod): the
    /// source consumers join as static members named after it, so a restart within the
    /// session timeout gets its partitions back without a rebalance, and a second process
    /// under the same name fences the first.
    pub static_membership: bool,
}

impl Context {
    /// A replica's context: fresh metrics, every enabled loop not ready yet.
    pub fn new(flow: Flow, replica: String) -> Result<Self, prometheus::Error> {
        let spec = &flow.spec;
        let readiness = Arc::new(
            Readiness::with_disabled(
                spec.source_loop.enabled,
                spec.checkpoints.enabled,
                spec.heartbeats.enabled,
            )
            .with_longest_turn(
                Loop::Heartbeat,
                health::heartbeat_longest_turn(spec.heartbeats.interval.as_duration()),
            ),
        );
        let metrics = Metrics::new()?;
        Ok(Context {
            clusters: reach::Clusters::new(&metrics),
            metrics,
            flow,
            readiness,
            replica,
            static_membership: false,
        })
    }
}

#[cfg(test)]
pub fn test_context() -> Context {
    Context::new(crate::flow::test_flow("ns/test", ""), "test-0".into())
        .expect("metrics of a fresh registry")
}
