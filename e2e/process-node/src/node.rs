//! The Node object: registration, Ready heartbeat and the node Lease.
//!
//! The node-lifecycle controller of kube-controller-manager marks a node NotReady (and
//! then taints and evicts) when neither its Lease nor its Ready condition is renewed; both
//! are renewed every [`HEARTBEAT`].

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::kubelet::env::NodeFacts;

pub const FIELD_MANAGER: &str = "mirrorflow-process-node";
pub const HEARTBEAT: Duration = Duration::from_secs(10);
const LEASE_NAMESPACE: &str = "kube-node-lease";
const LEASE_SECONDS: i32 = 40;
pub const MAX_PODS: u32 = 110;

/// The Node object as registered (metadata + spec).
fn node_object(facts: &NodeFacts) -> Node {
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", facts.node_name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", std::env::consts::ARCH),
        ("mirrorflow.io/process-node", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(facts.node_name.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    since: Timestamp,
    now: Timestamp,
) -> NodeCondition {
    NodeCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(since)),
    }
}

/// The node status: always Ready, with the machine's cpu and memory.
pub fn node_status(facts: &NodeFacts, since: Timestamp, now: Timestamp) -> NodeStatus {
    let resources: BTreeMap<String, Quantity> = [
        ("cpu", format!("{}", facts.cpu_cores as u64)),
        (
            "memory",
            format!("{}Ki", (facts.memory_bytes / 1024.0) as u64),
        ),
        ("pods", MAX_PODS.to_string()),
        ("ephemeral-storage", "100Gi".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v)))
    .collect();
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: facts.host_ip.clone(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: facts.node_name.clone(),
            },
        ]),
        conditions: Some(vec![
            condition(
                "MemoryPressure",
                false,
                "KubeletHasSufficientMemory",
                "process node",
                since,
                now,
            ),
            condition(
                "DiskPressure",
                false,
                "KubeletHasNoDiskPressure",
                "process node",
                since,
                now,
            ),
            condition(
                "PIDPressure",
                false,
                "KubeletHasSufficientPID",
                "process node",
                since,
                now,
            ),
            condition(
                "Ready",
                true,
                "KubeletReady",
                "mirrorflow process node is posting ready status",
                since,
                now,
            ),
        ]),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH.into(),
            boot_id: String::new(),
            container_runtime_version: "process://mirrorflow-process-node".into(),
            kernel_version: String::new(),
            kube_proxy_version: String::new(),
            kubelet_version: format!("v1.36.3-process-node-{}", env!("CARGO_PKG_VERSION")),
            machine_id: String::new(),
            operating_system: "linux".into(),
            os_image: "mirrorflow process node".into(),
            system_uuid: String::new(),
            swap: None,
        }),
        ..Default::default()
    }
}

fn lease(facts: &NodeFacts, owner_uid: Option<String>, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(facts.node_name.clone()),
            namespace: Some(LEASE_NAMESPACE.into()),
            owner_references: owner_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: facts.node_name.clone(),
                    uid,
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(facts.node_name.clone()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// Registers (server-side apply) the Node and posts its first status.
pub async fn register(
    client: &Client,
    facts: &NodeFacts,
    since: Timestamp,
) -> kube::Result<Option<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let node = nodes
        .patch(&facts.node_name, &pp, &Patch::Apply(node_object(facts)))
        .await?;
    heartbeat(client, facts, node.metadata.uid.clone(), since).await?;
    info!(node = %facts.node_name, "node registered");
    Ok(node.metadata.uid)
}

async fn heartbeat(
    client: &Client,
    facts: &NodeFacts,
    uid: Option<String>,
    since: Timestamp,
) -> kube::Result<()> {
    let now = Timestamp::now();
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let status = Node {
        metadata: ObjectMeta {
            name: Some(facts.node_name.clone()),
            ..Default::default()
        },
        status: Some(node_status(facts, since, now)),
        ..Default::default()
    };
    nodes
        .patch_status(&facts.node_name, &pp, &Patch::Apply(status))
        .await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    leases
        .patch(&facts.node_name, &pp, &Patch::Apply(lease(facts, uid, now)))
        .await?;
    Ok(())
}

/// Keeps the node alive until `shutdown` flips; re-registers if the Node was deleted.
pub async fn keep_alive(
    client: Client,
    facts: NodeFacts,
    mut uid: Option<String>,
    since: Timestamp,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(HEARTBEAT) => {}
        }
        match heartbeat(&client, &facts, uid.clone(), since).await {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {
                match register(&client, &facts, since).await {
                    Ok(new_uid) => uid = new_uid,
                    Err(e) => warn!(error = %e, "re-registering the node failed"),
                }
            }
            Err(e) => warn!(error = %e, "node heartbeat failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_ready_with_resources() {
        let facts = NodeFacts {
            node_name: "n".into(),
            host_ip: "127.0.0.1".into(),
            apiserver_host: "127.0.0.1".into(),
            apiserver_port: 1,
            cpu_cores: 2.0,
            memory_bytes: 2048.0 * 1024.0,
        };
        let t = Timestamp::UNIX_EPOCH;
        let s = node_status(&facts, t, t);
        let ready = s.conditions.iter().flatten().find(|c| c.type_ == "Ready");
        assert_eq!(ready.map(|c| c.status.as_str()), Some("True"));
        let cap = s.capacity.unwrap_or_default();
        assert_eq!(cap.get("cpu").map(|q| q.0.as_str()), Some("2"));
        assert_eq!(cap.get("memory").map(|q| q.0.as_str()), Some("2048Ki"));
        let json = serde_json::to_value(lease(&facts, Some("u".into()), t)).unwrap_or_default();
        assert_eq!(json["kind"], "Lease");
        assert_eq!(json["spec"]["holderIdentity"], "n");
    }
}
