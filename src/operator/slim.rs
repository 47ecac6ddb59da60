//! What the watch caches keep of each object: only the fields the operator reads.
//!
//! The caches hold every MirrorFlow and every child StatefulSet and ConfigMap for as long as
//! they exist. Whole objects cost the most where the operator reads the least: a StatefulSet's
//! pod template and a ConfigMap's replicator configuration are never read back (the operator
//! builds them), and every object's `managedFields` repeats its whole shape once per field
//! manager. What stays:
//! - a MirrorFlow: everything but `managedFields` (the reconcile reads spec, status and
//!   metadata);
//! - a StatefulSet: its metadata (owner, generation, resource version) and the replica counts
//!   of its status ([`super::triggers::replicas_change`], the status's ready replicas);
//! - a ConfigMap: its metadata (owner, resource version).

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::ConfigMap;

use crate::api::MirrorFlow;

pub fn flow(mf: &mut MirrorFlow) {
    mf.metadata.managed_fields = None;
}

pub fn stateful_set(sts: &mut StatefulSet) {
    sts.metadata.managed_fields = None;
    sts.spec = None;
    sts.status = sts.status.take().map(|s| StatefulSetStatus {
        replicas: s.replicas,
        ready_replicas: s.ready_replicas,
        available_replicas: s.available_replicas,
        ..Default::default()
    });
}

pub fn config_map(cm: &mut ConfigMap) {
    cm.metadata.managed_fields = None;
    cm.data = None;
    cm.binary_data = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn managed() -> serde_json::Value {
        json!([{"manager": "mirrorflow-operator", "operation": "Apply", "apiVersion": "v1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:replicator.yaml": {}}}}])
    }

    #[test]
    fn a_statefulset_keeps_its_owner_version_and_replica_counts_only() {
        let mut sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "f", "namespace": "ns", "resourceVersion": "7", "generation": 2,
                "ownerReferences": [{"apiVersion": "mirrorflow.io/v1alpha1", "kind": "MirrorFlow",
                    "name": "f", "uid": "u", "controller": true}],
                "managedFields": managed()},
            "spec": {"replicas": 3, "serviceName": "f", "selector": {},
                "template": {"spec": {"containers": [{"name": "r", "image": "i"}]}}},
            "status": {"replicas": 3, "readyReplicas": 2, "availableReplicas": 2,
                "observedGeneration": 2, "currentRevision": "f-1", "updateRevision": "f-2"},
        }))
        .expect("a StatefulSet");
        let counts = crate::operator::triggers::replicas_change(&sts);
        stateful_set(&mut sts);
        assert_eq!(sts.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            sts.metadata.owner_references.as_ref().map(Vec::len),
            Some(1)
        );
        assert!(sts.metadata.managed_fields.is_none() && sts.spec.is_none());
        let status = sts.status.as_ref().expect("status");
        assert_eq!((status.replicas, status.ready_replicas), (3, Some(2)));
        assert!(status.current_revision.is_none());
        assert_eq!(crate::operator::triggers::replicas_change(&sts), counts);
    }

    #[test]
    fn a_config_map_keeps_its_metadata_only() {
        let mut cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "f-config", "namespace": "ns", "resourceVersion": "9",
                "ownerReferences": [{"apiVersion": "mirrorflow.io/v1alpha1", "kind": "MirrorFlow",
                    "name": "f", "uid": "u", "controller": true}],
                "managedFields": managed()},
            "data": {"replicator.yaml": "source: {}"},
        }))
        .expect("a ConfigMap");
        config_map(&mut cm);
        assert_eq!(cm.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(cm.metadata.owner_references.as_ref().map(Vec::len), Some(1));
        assert!(cm.metadata.managed_fields.is_none() && cm.data.is_none());
    }

    #[test]
    fn a_flow_keeps_all_but_its_managed_fields() {
        let mut mf: MirrorFlow = serde_json::from_value(json!({
            "apiVersion": "mirrorflow.io/v1alpha1", "kind": "MirrorFlow",
            "metadata": {"name": "f", "namespace": "ns", "generation": 3,
                "annotations": {"mirrorflow.io/gaps-acknowledged": "2026-12-01T00:00:00Z"},
                "managedFields": managed()},
            "spec": {"source": {"alias": "a", "bootstrapServers": "a:9092"},
                "target": {"alias": "b", "bootstrapServers": "b:9092"}},
            "status": {"topics": 3},
        }))
        .expect("a MirrorFlow");
        let mut expected = mf.clone();
        expected.metadata.managed_fields = None;
        let change = crate::operator::triggers::flow_change(&mf);
        flow(&mut mf);
        assert_eq!(
            serde_json::to_value(&mf).expect("json"),
            serde_json::to_value(&expected).expect("json")
        );
        assert_eq!(crate::operator::triggers::flow_change(&mf), change);
    }
}
