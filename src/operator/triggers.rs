//! Which watch events start a reconcile.
//!
//! Every reconcile writes the flow's status, and the status carries ages that change on every
//! probe; without a filter each write comes back as a watch event and starts the next reconcile
//! at once, so a flow was reconciled as fast as it could be probed instead of every
//! [`STATUS_INTERVAL`](super::reconcile::STATUS_INTERVAL). Periodic refreshes come from the
//! requeue each reconcile returns; the watches only say "something the reconcile reads changed".

use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;

use crate::api::MirrorFlow;

/// The parts of a flow a reconcile acts on: its spec (through `metadata.generation`, which the
/// apiserver bumps on spec changes only) and its annotations (the gaps acknowledgement).
/// A status write changes neither.
pub fn flow_change(mf: &MirrorFlow) -> Option<u64> {
    let mut h = DefaultHasher::new();
    mf.metadata.generation.hash(&mut h);
    mf.annotations().hash(&mut h);
    mf.metadata.deletion_timestamp.is_some().hash(&mut h);
    Some(h.finish())
}

/// The parts of a flow's StatefulSet its status reports: how many replicas are wanted and
/// ready, and the spec generation (someone edited or deleted what the operator applied).
/// The controller-manager's other status bookkeeping (observedGeneration, revisions,
/// collisionCount) does not start a reconcile.
pub fn replicas_change(sts: &StatefulSet) -> Option<u64> {
    let mut h = DefaultHasher::new();
    sts.metadata.generation.hash(&mut h);
    let status = sts.status.as_ref();
    status.map(|s| s.replicas).hash(&mut h);
    status.and_then(|s| s.ready_replicas).hash(&mut h);
    status.and_then(|s| s.available_replicas).hash(&mut h);
    Some(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MirrorFlowStatus;
    use k8s_openapi::api::apps::v1::StatefulSetStatus;

    fn flow() -> MirrorFlow {
        let spec = serde_json::from_value(serde_json::json!({
            "source": {"alias": "a", "bootstrapServers": "a:9092"},
            "target": {"alias": "b", "bootstrapServers": "b:9092"},
        }))
        .expect("a minimal spec");
        let mut mf = MirrorFlow::new("f", spec);
        mf.metadata.generation = Some(1);
        mf
    }

    #[test]
    fn a_status_write_starts_no_reconcile() {
        let before = flow();
        let mut after = before.clone();
        after.status = Some(MirrorFlowStatus {
            topics: Some(3),
            ..Default::default()
        });
        after.metadata.resource_version = Some("42".into());
        assert_eq!(flow_change(&before), flow_change(&after));
    }

    #[test]
    fn spec_and_annotation_changes_start_one() {
        let before = flow();
        let mut edited = before.clone();
        edited.metadata.generation = Some(2);
        assert_ne!(flow_change(&before), flow_change(&edited));
        let mut acknowledged = before.clone();
        acknowledged.annotations_mut().insert(
            "mirrorflow.io/gaps-acknowledged".into(),
            "2026-12-01T00:00:00Z".into(),
        );
        assert_ne!(flow_change(&before), flow_change(&acknowledged));
    }

    #[test]
    fn only_replica_counts_of_a_statefulset_matter() {
        let mut sts = StatefulSet::default();
        sts.metadata.generation = Some(1);
        sts.status = Some(StatefulSetStatus {
            replicas: 1,
            ready_replicas: Some(0),
            observed_generation: Some(1),
            ..Default::default()
        });
        let mut bookkeeping = sts.clone();
        if let Some(s) = bookkeeping.status.as_mut() {
            s.observed_generation = Some(2);
            s.current_revision = Some("r2".into());
        }
        assert_eq!(replicas_change(&sts), replicas_change(&bookkeeping));
        let mut ready = sts.clone();
        if let Some(s) = ready.status.as_mut() {
            s.ready_replicas = Some(1);
        }
        assert_ne!(replicas_change(&sts), replicas_change(&ready));
    }
}
