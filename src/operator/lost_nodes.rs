//! Replicas stranded on a node that stopped answering, replaced without a person.
//!
//! A StatefulSet never starts a pod while the old one with its name may still run: a pod on a
//! node that stopped answering stays `Terminating` until someone deletes the node or the pod.
//! With `replicas: 1` that stops the flow until a person acts. Kafka already fences the old
//! replica, which is what makes replacing it safe:
//! - every mode: the source consumers are static members named after the pod, so the
//!   replacement's join takes over the old member's identity and the coordinator refuses the
//!   old one (`FENCED_INSTANCE_ID`) from then on; positions written by the old one describe
//!   records it did copy, so at worst the new one copies some again.
//! - exactly-once: each partition's transactional producer has a fixed `transactional.id`;
//!   the replacement's first transaction bumps the epoch, the old one's open transaction is
//!   aborted and its later writes refused (no record twice).
//! - at-least-once, whole batches and aligned offsets: a replica that still runs cut off from
//!   the apiserver (a partition, not a crash) may write records the replacement writes again
//!   before it learns it was fenced: duplicates, never a gap. Aligned offsets report such a
//!   duplicate as a misalignment (condition OffsetsAligned) rather than hide it.
//!
//! The rule: a replica whose node's `Ready` condition has been `Unknown` (the node controller
//! lost it) for longer than the installer's `replicaReplaceAfterSeconds` is deleted with no
//! grace period, and its StatefulSet starts it again on a node that answers. Until then the
//! flow's `Ready` condition says which replica waits on which node, and for how long.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};

use super::Context;
use crate::api::MirrorFlow;

/// A replica on a node the node controller lost.
#[derive(Clone, Debug, PartialEq)]
pub struct Stranded {
    pub pod: String,
    pub uid: String,
    pub node: String,
    /// How long the node has not answered.
    pub lost_for: Duration,
    /// When the operator replaces it; `None`: it never does (replacement off).
    pub replace_in: Option<Duration>,
}

impl Stranded {
    pub fn due(&self) -> bool {
        self.replace_in == Some(Duration::ZERO)
    }

    /// For the flow's `Ready` condition.
    pub fn message(&self) -> String {
        let lost = crate::status::secs(self.lost_for);
        match self.replace_in {
            Some(d) if d.is_zero() => format!(
                "replicator pod {} was on node {}, which has not answered for {lost}: the operator deleted it so its StatefulSet starts it on a node that answers",
                self.pod, self.node
            ),
            Some(d) => format!(
                "replicator pod {} is on node {}, which has not answered for {lost}; the operator replaces it in {} (installer value replicaReplaceAfterSeconds) unless the node comes back",
                self.pod,
                self.node,
                crate::status::secs(d)
            ),
            None => format!(
                "replicator pod {} is on node {}, which has not answered for {lost}; replacing it is off (installer value replicaReplaceAfterSeconds: 0): once the node is known to be down, run kubectl delete pod {} --force --grace-period=0",
                self.pod, self.node, self.pod
            ),
        }
    }
}

/// Since when the node controller has lost `node` (its `Ready` condition `Unknown`).
fn lost_since(node: &Node) -> Option<Timestamp> {
    let ready = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if ready.status != "Unknown" {
        return None;
    }
    // Without a transition time the loss is as old as the newest heartbeat we know of.
    ready
        .last_transition_time
        .as_ref()
        .or(ready.last_heartbeat_time.as_ref())
        .map(|t| t.0)
}

/// Whether the StatefulSet `owner` controls `pod`: the label selector alone would also match
/// a pod someone else made with the same labels.
fn owned_by(pod: &Pod, owner: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|o| o.kind == "StatefulSet" && o.name == owner && o.controller == Some(true))
}

/// The replicas of StatefulSet `owner` on lost nodes, each with when it is replaced.
/// `after: None` = never.
pub fn stranded(
    pods: &[Pod],
    owner: &str,
    nodes: &BTreeMap<String, Node>,
    now: Timestamp,
    after: Option<Duration>,
) -> Vec<Stranded> {
    pods.iter()
        .filter(|pod| owned_by(pod, owner))
        .filter_map(|pod| {
            let node = pod.spec.as_ref()?.node_name.clone()?;
            let since = lost_since(nodes.get(&node)?)?;
            let lost_for = now
                .duration_since(since)
                .try_into()
                .unwrap_or(Duration::ZERO);
            Some(Stranded {
                pod: pod.name_any(),
                uid: pod.uid()?,
                node,
                lost_for,
                replace_in: after.map(|a| a.saturating_sub(lost_for)),
            })
        })
        .collect()
}

/// The flow's replica pods, read by name (`<flow>-<ordinal>`) so the operator needs no right
/// to list pods, only those its StatefulSet controls.
#[derive(Debug, Default)]
pub struct ReplicaPods {
    /// Those that exist and belong to the flow.
    pub found: Vec<Pod>,
    /// The names of the others, in ordinal order.
    pub missing: Vec<String>,
}

/// The flow's replica pods. Read only when a replica is not ready: a ready flow costs no
/// request. A refusal by the apiserver (the installer's RBAC without pods) is returned for
/// the status to name ([`super::unready::not_looked_at`]).
pub async fn replica_pods(
    ctx: &Context,
    ns: &str,
    mf: &MirrorFlow,
) -> Result<ReplicaPods, kube::Error> {
    let pods_api = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    let mut pods = ReplicaPods::default();
    for ordinal in 0..mf.spec.replicas.max(0) {
        let name = format!("{}-{ordinal}", mf.name_any());
        match pods_api.get_opt(&name).await? {
            Some(pod) if owned_by(&pod, &mf.name_any()) => pods.found.push(pod),
            _ => pods.missing.push(name),
        }
    }
    Ok(pods)
}

/// Finds the flow's replicas (of `pods`) on lost nodes and deletes those that waited long
/// enough, with an Event each. A refusal by the apiserver (the installer's RBAC without
/// delete on pods or get on nodes) is returned for the status to name.
pub async fn tend(
    ctx: &Context,
    ns: &str,
    mf: &MirrorFlow,
    pods: &[Pod],
) -> Result<Vec<Stranded>, kube::Error> {
    if pods.is_empty() {
        return Ok(Vec::new());
    }
    find_and_replace(ctx, ns, mf, pods).await
}

async fn find_and_replace(
    ctx: &Context,
    ns: &str,
    mf: &MirrorFlow,
    pods: &[Pod],
) -> Result<Vec<Stranded>, kube::Error> {
    let pods_api = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    let nodes_api = Api::<Node>::all(ctx.client.clone());
    let mut nodes = BTreeMap::new();
    for name in pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
    {
        if nodes.contains_key(&name) {
            continue;
        }
        if let Some(node) = nodes_api.get_opt(&name).await? {
            nodes.insert(name, node);
        }
    }
    let found = stranded(
        pods,
        &mf.name_any(),
        &nodes,
        Timestamp::now(),
        ctx.replace_after,
    );
    for s in found.iter().filter(|s| s.due()) {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            // Never the pod the StatefulSet already started again under the same name.
            preconditions: Some(Preconditions {
                uid: Some(s.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match pods_api.delete(&s.pod, &params).await {
            Ok(_) => {
                tracing::warn!(flow = %mf.name_any(), namespace = ns, pod = %s.pod, node = %s.node,
                    lost_for = ?s.lost_for, "replaced a replica stranded on a lost node");
                ctx.metrics.replicas_replaced.inc();
                let event = Event {
                    type_: EventType::Warning,
                    reason: REPLICA_REPLACED.into(),
                    note: Some(s.message()),
                    action: "Replace".into(),
                    secondary: None,
                };
                if let Err(e) = ctx.recorder.publish(&event, &mf.object_ref(&())).await {
                    tracing::warn!(error = %e, "could not record an event");
                }
            }
            // Gone or replaced meanwhile: nothing left to do.
            Err(kube::Error::Api(r)) if r.code == 404 || r.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(found)
}

/// The Event of a replacement.
pub const REPLICA_REPLACED: &str = "ReplicaReplaced";

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).expect("a valid time")
    }

    fn pod(name: &str, node: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p.metadata.owner_references = Some(vec![OwnerReference {
            kind: "StatefulSet".into(),
            name: "f".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        p.spec = Some(PodSpec {
            node_name: node.map(String::from),
            ..PodSpec::default()
        });
        p
    }

    fn node(name: &str, ready: &str, since: i64) -> (String, Node) {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_transition_time: Some(Time(at(since))),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        (name.into(), n)
    }

    #[test]
    fn only_replicas_on_nodes_the_controller_lost_are_stranded_and_due_after_the_bound() {
        let nodes = BTreeMap::from([
            node("ok", "True", 0),
            node("kubelet-says-not-ready", "False", 0),
            node("lost", "Unknown", 100),
        ]);
        let pods = [
            pod("f-0", Some("ok")),
            pod("f-1", Some("kubelet-says-not-ready")),
            pod("f-2", Some("lost")),
            pod("f-3", None),
            pod("f-4", Some("deleted-node")),
        ];
        let after = Some(Duration::from_secs(60));
        let waiting = stranded(&pods, "f", &nodes, at(130), after);
        assert_eq!(
            waiting,
            [Stranded {
                pod: "f-2".into(),
                uid: "uid-f-2".into(),
                node: "lost".into(),
                lost_for: Duration::from_secs(30),
                replace_in: Some(Duration::from_secs(30)),
            }]
        );
        assert!(!waiting[0].due());
        assert!(waiting[0].message().contains("replaces it in 30s"));

        let due = stranded(&pods, "f", &nodes, at(161), after);
        assert!(due[0].due(), "{due:?}");
        assert!(due[0].message().contains("deleted it"));

        let never = stranded(&pods, "f", &nodes, at(10_000), None);

        let mut foreign = pod("f-9", Some("lost"));
        foreign.metadata.owner_references = None;
        assert!(stranded(&[foreign], "f", &nodes, at(161), after).is_empty());
        assert!(stranded(&pods, "other", &nodes, at(161), after).is_empty());
        assert!(!never[0].due());
        assert!(
            never[0]
                .message()
                .contains("kubectl delete pod f-2 --force --grace-period=0"),
            "{}",
            never[0].message()
        );
    }

    #[test]
    fn a_clock_behind_the_nodes_transition_waits_the_whole_bound() {
        let nodes = BTreeMap::from([node("lost", "Unknown", 100)]);
        let s = stranded(
            &[pod("f-0", Some("lost"))],
            "f",
            &nodes,
            at(90),
            Some(Duration::from_secs(60)),
        );
        assert_eq!(s[0].lost_for, Duration::ZERO);
        assert_eq!(s[0].replace_in, Some(Duration::from_secs(60)));
    }
}
