//! A replica stranded on a node the node controller lost: named in `Ready` while it waits,
//! deleted (grace period 0, only that pod by uid) once the bound has passed, with an Event.

use super::*;

const PODS: &str = "/api/v1/namespaces/ns/pods";

fn lost_node(name: &str, lost_secs_ago: i64) -> Value {
    let since = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(lost_secs_ago))
        .expect("a time in range");
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown",
            "lastTransitionTime": since.to_string()}]},
    })
}

fn pod(i: i32, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("f-{i}"), "namespace": "ns", "uid": format!("pod-uid-{i}"),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                "name": "f", "uid": "sts-uid", "controller": true}]},
        "spec": {"nodeName": node, "containers": []},
    })
}

/// `f-0` and `f-2` on a healthy node, `f-1` on `lost`.
fn pods(r: &Seen) -> Option<(StatusCode, Value)> {
    let name = r.path.strip_prefix(PODS)?.strip_prefix('/')?;
    let node = if name == "f-1" { "lost" } else { "healthy" };
    let i: i32 = name.strip_prefix("f-")?.parse().ok()?;
    (r.method == "GET").then(|| (StatusCode::OK, pod(i, node)))
}

/// A flow of three replicas, two ready (as the fake StatefulSet says), `f-1` on `lost` whose
/// node controller lost it `lost_secs_ago`.
fn fixture(lost_secs_ago: i64) -> Fixture {
    Fixture::with(
        move |r| match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/api/v1/nodes/lost") => {
                Some((StatusCode::OK, lost_node("lost", lost_secs_ago)))
            }
            ("GET", "/api/v1/nodes/healthy") => Some((
                StatusCode::OK,
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "healthy"},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            )),
            ("DELETE", p) if p == format!("{PODS}/f-1") => Some((
                StatusCode::OK,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            )),
            _ => pods(r),
        },
        |_| {},
    )
}

fn three_replicas() -> MirrorFlow {
    flow_with(|v| v["spec"]["replicas"] = json!(3))
}

fn pod_deletes(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter()
        .filter(|r| r.method == "DELETE" && r.path.starts_with(PODS))
        .collect()
}

#[tokio::test]
async fn a_replica_on_a_lost_node_is_named_while_it_waits_and_left_alone() {
    let fx = fixture(20);
    fx.reconcile(&three_replicas())
        .await
        .expect("the reconcile succeeds");
    let seen = fx.requests();
    let read: Vec<&str> = seen
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with(PODS))
        .map(|r| r.path.as_str())
        .collect();
    assert_eq!(
        read,
        ["f-0", "f-1", "f-2"].map(|p| format!("{PODS}/{p}")),
        "a replica not ready: the flow's pods are read by name, none listed"
    );
    assert!(pod_deletes(&seen).is_empty(), "20 s of 60: no delete yet");
    assert!(
        event_notes(&seen).iter().all(|n| !n.contains("deleted it")),
        "{:?}",
        event_notes(&seen)
    );
}

#[tokio::test]
async fn a_replacement_due_before_the_next_refresh_is_looked_at_when_due() {
    // Lost for 55 s of 60: the next reconcile comes a second after the bound, not 10 s later.
    let action = fixture(55)
        .reconcile(&three_replicas())
        .await
        .expect("the reconcile succeeds");
    assert_eq!(action, Action::requeue(Duration::from_secs(6)));
    // Lost for 20 s: the usual refresh comes first.
    let action = fixture(20)
        .reconcile(&three_replicas())
        .await
        .expect("the reconcile succeeds");
    assert_eq!(action, Action::requeue(STATUS_INTERVAL));
}

#[tokio::test]
async fn a_replica_lost_longer_than_the_bound_is_deleted_by_uid_with_no_grace_and_an_event() {
    let fx = fixture(90);
    fx.reconcile(&three_replicas())
        .await
        .expect("the reconcile succeeds");
    let seen = fx.requests();
    let deletes = pod_deletes(&seen);
    assert_eq!(deletes.len(), 1, "only f-1: {deletes:?}");
    assert_eq!(deletes[0].path, format!("{PODS}/f-1"));
    assert_eq!(deletes[0].body["gracePeriodSeconds"], 0);
    assert_eq!(deletes[0].body["preconditions"]["uid"], "pod-uid-1");
    let (_, events) = written(&seen);
    assert!(
        events.contains(&(
            "Warning".into(),
            crate::operator::lost_nodes::REPLICA_REPLACED.into()
        )),
        "{events:?}"
    );
    assert!(
        event_notes(&seen)
            .iter()
            .any(|n| n.contains("f-1") && n.contains("node lost")),
        "{:?}",
        event_notes(&seen)
    );
}

#[tokio::test]
async fn with_replacement_off_nothing_is_deleted() {
    let fx = Fixture::with(
        |r| match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/api/v1/nodes/lost") => Some((StatusCode::OK, lost_node("lost", 3600))),
            _ => pods(r),
        },
        |ctx| ctx.replace_after = None,
    );
    fx.reconcile(&three_replicas())
        .await
        .expect("the reconcile succeeds");
    assert!(pod_deletes(&fx.requests()).is_empty());
}

fn forbidden() -> (StatusCode, Value) {
    (
        StatusCode::FORBIDDEN,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
            "code": 403, "message": "forbidden: User \"system:serviceaccount:op:mf\" cannot get resource"}),
    )
}

/// What the apiserver refuses the operator is named in `Ready` with the right it lacks,
/// except the look at nodes when the installer turned replacement off (and granted none).
#[tokio::test]
async fn a_refused_look_at_pods_or_nodes_is_named_in_ready_unless_replacement_is_off() {
    let cases: [(&str, bool, Option<&str>); 3] = [
        ("pods", true, Some("get on pods in namespace ns")),
        (
            "nodes",
            true,
            Some("get on nodes and delete on pods in namespace ns"),
        ),
        ("nodes", false, None),
    ];
    for (refused, replacing, named) in cases {
        let fx = Fixture::with(
            move |r| {
                let is_refused = match refused {
                    "pods" => r.path.starts_with(PODS),
                    _ => r.path.starts_with("/api/v1/nodes/"),
                };
                if r.method == "GET" && is_refused {
                    Some(forbidden())
                } else {
                    pods(r)
                }
            },
            move |ctx| {
                if !replacing {
                    ctx.replace_after = None;
                }
            },
        );
        fx.reconcile(&three_replicas())
            .await
            .expect("the reconcile succeeds");
        let (status, _) = written(&fx.requests());
        let ready = condition(&status, status::READY);
        let message = ready["message"].as_str().unwrap_or_default().to_string();
        match named {
            Some(right) => {
                assert_eq!(
                    ready["reason"],
                    reason::REPLICAS_NOT_READY,
                    "{refused}: {ready}"
                );
                assert!(
                    message.contains(right) && message.starts_with("2/3 replicator pods ready"),
                    "{refused}: {message}"
                );
            }
            // The fixture's probe never ends, so `Ready` goes on to the source's fault.
            None => assert!(
                !message.contains("nodes") && ready["reason"] != reason::REPLICAS_NOT_READY,
                "{refused}: {ready}"
            ),
        }
    }
}

/// A replica that cannot run is named by class from the same pod reads: `Ready` False with
/// `ReplicatorOutOfMemory`, the pod and the field, and a Warning Event of that reason.
#[tokio::test]
async fn a_replica_killed_for_its_memory_limit_is_named_in_ready_with_an_event() {
    let fx = Fixture::with(
        |r| {
            let healthy = || {
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "healthy"},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
            };
            match (r.method.as_str(), r.path.as_str()) {
                ("GET", "/api/v1/nodes/healthy") => Some((StatusCode::OK, healthy())),
                ("GET", p) if p == format!("{PODS}/f-1") => {
                    let mut p = pod(1, "healthy");
                    p["status"] = json!({"phase": "Running", "containerStatuses": [{
                        "name": "replicator", "ready": false, "restartCount": 4,
                        "image": "i", "imageID": "",
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]});
                    Some((StatusCode::OK, p))
                }
                _ => pods(r).map(|(c, mut p)| {
                    p["spec"]["nodeName"] = json!("healthy");
                    (c, p)
                }),
            }
        },
        |_| {},
    );
    fx.reconcile(&three_replicas())
        .await
        .expect("the reconcile succeeds");
    let seen = fx.requests();
    let (status, events) = written(&seen);
    let ready = (status["conditions"].as_array().into_iter().flatten())
        .find(|c| c["type"] == "Ready")
        .expect("Ready");
    assert_eq!(ready["reason"], "ReplicatorOutOfMemory", "{ready}");
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("f-1 was killed 4 times")
            && message.contains("spec.resources.limits.memory"),
        "{message}"
    );
    assert!(
        events.contains(&("Warning".into(), "ReplicatorOutOfMemory".into())),
        "{events:?}"
    );
}
