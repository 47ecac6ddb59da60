//! How a flow's replicas spread over failure domains.
//!
//! Without constraints of its own a StatefulSet may put every replica on one node, and losing
//! that node stops the flow although its other replicas could have carried it. The default:
//! - at most one replica more on any node than on another, as a rule (`DoNotSchedule`): a
//!   preference lost to the scheduler's other scores on a busy cluster, which put both replicas
//!   of a flow on the emptier node in the world test `node_loss`. One node is one domain, so a
//!   one-node cluster still runs every replica; only nodes the pod may run on count
//!   (`nodeTaintsPolicy: Honor`), so a lost node (tainted unreachable) or a tainted control
//!   plane never holds a replica back. A cluster whose other nodes are full leaves a replica
//!   Pending, which the flow's `Ready` condition reports.
//! - the same over zones (where nodes carry `topology.kubernetes.io/zone`) as a preference
//!   (`ScheduleAnyway`): zones are often uneven.
//!
//! A flow that needs other rules says so in `spec.pod.topologySpreadConstraints`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::api::MirrorFlow;

pub const HOSTNAME_KEY: &str = "kubernetes.io/hostname";
pub const ZONE_KEY: &str = "topology.kubernetes.io/zone";

/// The pod template's constraints: the flow's own, each selecting the flow's replicas when it
/// names no pods itself, or the default over hostname and zone.
pub fn constraints(
    flow: &MirrorFlow,
    selector: &BTreeMap<String, String>,
) -> Vec<TopologySpreadConstraint> {
    let own = flow
        .spec
        .pod
        .as_ref()
        .map(|p| p.topology_spread_constraints.clone())
        .unwrap_or_default();
    let replicas = || LabelSelector {
        match_labels: Some(selector.clone()),
        ..LabelSelector::default()
    };
    if own.is_empty() {
        return [
            (HOSTNAME_KEY, "DoNotSchedule"),
            (ZONE_KEY, "ScheduleAnyway"),
        ]
        .into_iter()
        .map(|(key, when)| TopologySpreadConstraint {
            max_skew: 1,
            topology_key: key.into(),
            when_unsatisfiable: when.into(),
            node_taints_policy: Some("Honor".into()),
            label_selector: Some(replicas()),
            ..TopologySpreadConstraint::default()
        })
        .collect();
    }
    own.into_iter()
        .map(|mut c| {
            if c.label_selector.is_none() {
                c.label_selector = Some(replicas());
            }
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(pod: serde_json::Value) -> MirrorFlow {
        let spec = serde_json::from_value(serde_json::json!({
            "source": {"alias": "a", "bootstrapServers": "a:9092"},
            "target": {"alias": "b", "bootstrapServers": "b:9092"},
            "pod": pod,
        }))
        .expect("a valid spec");
        MirrorFlow::new("f", spec)
    }

    fn selector() -> BTreeMap<String, String> {
        BTreeMap::from([("mirrorflow.io/flow".to_string(), "f".to_string())])
    }

    #[test]
    fn by_default_replicas_keep_to_other_nodes_and_prefer_other_zones() {
        let c = constraints(&flow(serde_json::json!({})), &selector());
        let rules: Vec<_> = c
            .iter()
            .map(|c| (c.topology_key.as_str(), c.when_unsatisfiable.as_str()))
            .collect();
        assert_eq!(
            rules,
            [
                (HOSTNAME_KEY, "DoNotSchedule"),
                (ZONE_KEY, "ScheduleAnyway")
            ]
        );
        for c in &c {
            assert_eq!(c.max_skew, 1);
            // A tainted node (a lost one, a control plane) is no domain to balance against.
            assert_eq!(c.node_taints_policy.as_deref(), Some("Honor"));
            assert_eq!(
                c.label_selector
                    .as_ref()
                    .and_then(|s| s.match_labels.clone()),
                Some(selector())
            );
        }
    }

    #[test]
    fn the_flows_constraints_replace_the_default_and_select_its_replicas_when_silent() {
        let mine = flow(serde_json::json!({"topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule"},
            {"maxSkew": 2, "topologyKey": ZONE_KEY, "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"team": "x"}}},
        ]}));
        let c = constraints(&mine, &selector());
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].topology_key, "rack");
        assert_eq!(c[0].when_unsatisfiable, "DoNotSchedule");
        assert_eq!(
            c[0].label_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone()),
            Some(selector())
        );
        assert_eq!(
            c[1].label_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone()),
            Some(BTreeMap::from([("team".to_string(), "x".to_string())]))
        );
    }
}
