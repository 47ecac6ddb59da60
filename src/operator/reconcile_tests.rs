//! The reconcile against a fake apiserver: what it reads, writes and publishes per decision.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::StatusCode;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{reflector, watcher};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;
use crate::operator::fake_apiserver::{self, Routes, Seen};
use crate::operator::{OperatorMetrics, guards, lease, probes};

/// A flow in namespace `ns` whose source authenticates with a Secret `creds`.
fn flow() -> MirrorFlow {
    serde_json::from_value(json!({
        "apiVersion": "mirrorflow.io/v1alpha1", "kind": "MirrorFlow",
        "metadata": {"name": "f", "namespace": "ns", "uid": "uid-f", "generation": 1},
        "spec": {
            "source": {"alias": "a", "bootstrapServers": "a.example:9092",
                "sasl": {"mechanism": "SCRAM-SHA-512",
                    "usernameSecretRef": {"name": "creds", "key": "user"},
                    "passwordSecretRef": {"name": "creds", "key": "password"}}},
            "target": {"alias": "b", "bootstrapServers": "b.example:9092"},
        },
    }))
    .expect("a valid MirrorFlow")
}

fn context(client: kube::Client) -> Arc<Context> {
    Arc::new(bare_context(client))
}

fn bare_context(client: kube::Client) -> Context {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: None,
    };
    Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        metrics: OperatorMetrics::new().expect("metrics"),
        replicator_image: "mirrorflow:test".into(),
        allowed_image_prefixes: Vec::new(),
        allowed_pod_metadata_keys: Vec::new(),
        resources: Default::default(),
        network: Default::default(),
        addresses: Default::default(),
        replace_after: Some(Duration::from_secs(60)),
        liveness: Default::default(),
        last_status: Default::default(),
        failures: Default::default(),
        flows: reflector::store().0,
        lease: None,
        probes: Default::default(),
        probe_clients: Default::default(),
        cluster_ids: Default::default(),
        applied: Default::default(),
        removed: Default::default(),
        stateful_sets: reflector::store().0,
        config_maps: reflector::store().0,
    }
}

/// Events and status patches are accepted (echoed); `routes` answers the rest.
fn serve(routes: impl Fn(&Seen) -> Option<(StatusCode, Value)> + Send + 'static) -> Routes {
    Box::new(move |r: &Seen| events_and_status(r).or_else(|| routes(r)))
}

fn events_and_status(r: &Seen) -> Option<(StatusCode, Value)> {
    // The recorder creates an event, then patches the same event for repeats.
    if r.path.starts_with("/apis/events.k8s.io/") {
        return Some((StatusCode::CREATED, r.body.clone()));
    }
    if r.method == "PATCH" && r.path.ends_with("/status") {
        let mut echoed = serde_json::to_value(flow()).unwrap_or_default();
        echoed["status"] = r.body["status"].clone();
        return Some((StatusCode::OK, echoed));
    }
    None
}

async fn run(routes: Routes) -> (Action, Vec<Seen>) {
    let (client, seen) = fake_apiserver::client(routes);
    let ctx = context(client);
    let action = tokio::time::timeout(
        Duration::from_secs(10),
        reconcile(Arc::new(flow()), ctx.clone()),
    )
    .await
    .expect("the reconcile ends")
    .expect("the reconcile succeeds");
    drop(ctx);
    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    (action, seen)
}

/// The status the reconcile wrote, and every event's (type, reason).
fn written(seen: &[Seen]) -> (Value, Vec<(String, String)>) {
    let status = seen
        .iter()
        .rev()
        .find(|r| r.method == "PATCH" && r.path.ends_with("/mirrorflows/f/status"))
        .map(|r| r.body["status"].clone())
        .expect("a status was written");
    let events = seen
        .iter()
        .filter(|r| r.method == "POST" && r.path.contains("/events"))
        .map(|r| {
            (
                r.body["type"].as_str().unwrap_or_default().to_string(),
                r.body["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    (status, events)
}

fn reasons(status: &Value) -> Vec<(String, String)> {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["type"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn wrote_children(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .filter(|r| {
            (r.method == "PATCH" || r.method == "DELETE")
                && !r.path.ends_with("/status")
                && !r.path.starts_with("/apis/events.k8s.io/")
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

#[tokio::test]
async fn a_missing_secret_is_named_in_every_condition_and_an_event_and_nothing_is_deployed() {
    let (action, seen) = run(serve(|_| None)).await;
    let (status, events) = written(&seen);
    let conditions = reasons(&status);
    assert_eq!(conditions.len(), 6, "{conditions:?}");
    assert!(
        conditions
            .iter()
            .filter(|(t, _)| t != status::GAPLESS)
            .all(|(_, r)| r == reason::SECRET_MISSING),
        "{conditions:?}"
    );
    assert!(
        status["conditions"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.source.sasl")),
        "the message names the field: {status}"
    );
    assert!(events.contains(&("Warning".into(), reason::SECRET_MISSING.into())));
    assert_eq!(wrote_children(&seen), Vec::<String>::new());
    // A flow someone has to fix is looked at again slowly.
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
}

#[tokio::test]
async fn a_secret_that_did_not_opt_in_is_not_used_and_stops_the_flows_replicators() {
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "ns"},
        "data": {"user": "dQ==", "password": "cA=="},
    });
    let owned_sts = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "f", "namespace": "ns",
            "ownerReferences": [{"apiVersion": "mirrorflow.io/v1alpha1", "kind": "MirrorFlow",
                "name": "f", "uid": "uid-f"}]},
    });
    let (_, seen) = run(serve(move |r| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/api/v1/namespaces/ns/secrets/creds") => Some((StatusCode::OK, secret.clone())),
        ("GET", "/apis/apps/v1/namespaces/ns/statefulsets/f") => {
            Some((StatusCode::OK, owned_sts.clone()))
        }
        ("DELETE", "/apis/apps/v1/namespaces/ns/statefulsets/f") => {
            Some((StatusCode::OK, owned_sts.clone()))
        }
        _ => None,
    }))
    .await;
    let (status, events) = written(&seen);
    assert!(
        reasons(&status)
            .iter()
            .any(|(t, r)| t == status::READY && r == reason::SECRET_NOT_SHARED),
        "{status}"
    );
    assert!(
        status["conditions"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains(guards::SECRET_ALLOWED_FLOWS)),
        "the message says how to allow it: {status}"
    );
    assert!(events.contains(&("Warning".into(), reason::SECRET_NOT_SHARED.into())));
    // The flow's own StatefulSet goes; nothing is applied.
    assert_eq!(
        wrote_children(&seen),
        ["DELETE /apis/apps/v1/namespaces/ns/statefulsets/f"]
    );
}

#[tokio::test]
async fn an_invalid_spec_is_answered_without_reading_anything() {
    let (client, seen) = fake_apiserver::client(serve(|_| None));
    let ctx = context(client);
    let mut bad = flow();
    bad.spec.target.alias = bad.spec.source.alias.clone();
    reconcile(Arc::new(bad), ctx)
        .await
        .expect("the reconcile succeeds");
    let seen: Vec<Seen> = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert!(
        seen.iter().all(|r| r.method != "GET"),
        "nothing is read for a spec that cannot run: {seen:?}"
    );
    let (status, _) = written(&seen);
    assert!(
        reasons(&status)
            .iter()
            .any(|(t, r)| t == status::READY && r == reason::INVALID_SPEC),
        "{status}"
    );
}

// A world in which the flow can be deployed: `creds` opted in, the clusters' ids known, and
// the children applied against a small store in the fake apiserver.

const CM: &str = "/api/v1/namespaces/ns/configmaps/f-flow";
const SVC: &str = "/api/v1/namespaces/ns/services/f-metrics";
const STS: &str = "/apis/apps/v1/namespaces/ns/statefulsets/f";
const PDB: &str = "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/f";
const NP: &str = "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/f";
const SECRET: &str = "/api/v1/namespaces/ns/secrets/creds";
/// The password in `creds`, plain and as the Secret carries it: no written object may hold it.
const PASSWORD: &str = "hunter2-for-brokers-only";
const PASSWORD_B64: &str = "aHVudGVyMi1mb3ItYnJva2Vycy1vbmx5";
/// Ready replicas of every StatefulSet the fake apiserver answers with.
const READY_PODS: i32 = 2;

fn opted_in_secret() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds", "namespace": "ns", "resourceVersion": "7",
            "annotations": {(guards::SECRET_ALLOWED_FLOWS): "f",
                (guards::SECRET_ALLOWED_DESTINATIONS): "a.example:9092",
                (guards::SECRET_ALLOW_PLAINTEXT): "true"}},
        "data": {"user": "bWlycm9y", "password": PASSWORD_B64},
    })
}

/// `flow()` with its JSON changed by `edit`.
fn flow_with(edit: impl FnOnce(&mut Value)) -> MirrorFlow {
    let mut v = serde_json::to_value(flow()).expect("a flow serialises");
    edit(&mut v);
    serde_json::from_value(v).expect("a valid MirrorFlow")
}

/// A child at `path` (one of the four) owned by the flow with uid `owner`.
fn child(path: &str, owner: &str) -> Value {
    let (api_version, kind) = match path {
        CM => ("v1", "ConfigMap"),
        SVC => ("v1", "Service"),
        STS => ("apps/v1", "StatefulSet"),
        NP => ("networking.k8s.io/v1", "NetworkPolicy"),
        _ => ("policy/v1", "PodDisruptionBudget"),
    };
    json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": path.rsplit('/').next(), "namespace": "ns", "resourceVersion": "1",
            "ownerReferences": [{"apiVersion": "mirrorflow.io/v1alpha1", "kind": "MirrorFlow",
                "name": "f", "uid": owner, "controller": true}]},
    })
}

/// The children as the fake apiserver holds them: an apply is answered with the object sent,
/// a new resourceVersion and (a StatefulSet) [`READY_PODS`] ready replicas; GET and DELETE
/// see what was applied or put.
#[derive(Clone, Default)]
struct Children {
    objects: Arc<Mutex<BTreeMap<String, Value>>>,
    versions: Arc<AtomicU64>,
}

impl Children {
    fn answer(&self, r: &Seen) -> Option<(StatusCode, Value)> {
        if ![CM, SVC, STS, PDB, NP].contains(&r.path.as_str()) {
            return None;
        }
        let mut objects = self.objects.lock().ok()?;
        match r.method.as_str() {
            "PATCH" => {
                let mut object = r.body.clone();
                let version = self.versions.fetch_add(1, Ordering::SeqCst) + 100;
                object["metadata"]["resourceVersion"] = json!(version.to_string());
                if r.path == STS {
                    object["status"] = json!({"replicas": READY_PODS, "readyReplicas": READY_PODS});
                }
                objects.insert(r.path.clone(), object.clone());
                Some((StatusCode::OK, object))
            }
            "GET" => objects.get(&r.path).map(|o| (StatusCode::OK, o.clone())),
            "DELETE" => objects.remove(&r.path).map(|o| (StatusCode::OK, o)),
            _ => None,
        }
    }

    fn put(&self, path: &str, object: Value) {
        if let Ok(mut objects) = self.objects.lock() {
            objects.insert(path.to_string(), object);
        }
    }

    fn get<K: DeserializeOwned>(&self, path: &str) -> K {
        let object = self
            .objects
            .lock()
            .ok()
            .and_then(|o| o.get(path).cloned())
            .expect("the child exists");
        serde_json::from_value(object).expect("a child object")
    }

    fn paths(&self) -> Vec<String> {
        self.objects
            .lock()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// A reconcile's surroundings: the fake apiserver, the watch caches the test feeds, and Kafka
/// stood in for.
struct Fixture {
    ctx: Arc<Context>,
    log: Arc<Mutex<Vec<Seen>>>,
    children: Children,
    stateful_sets: reflector::store::Writer<StatefulSet>,
    config_maps: reflector::store::Writer<ConfigMap>,
    flows: reflector::store::Writer<MirrorFlow>,
    /// The ids the clusters report; known for every generation, so no client asks them.
    ids: guards::ClusterIds,
    /// While held, a probe of flow `f` counts as still running from an earlier reconcile, so
    /// the reconcile reports the source unreachable instead of connecting to a broker.
    probe: Option<probes::Running>,
}

impl Fixture {
    fn new() -> Self {
        Fixture::with(|_| None, |_| {})
    }

    /// `first` answers before the world does (to refuse or fail a request); `adjust` changes
    /// the context before the reconcile sees it.
    fn with(
        first: impl Fn(&Seen) -> Option<(StatusCode, Value)> + Send + 'static,
        adjust: impl FnOnce(&mut Context),
    ) -> Self {
        Fixture::sharing(Children::default(), first, adjust)
    }

    /// [`Fixture::with`] over children an earlier fixture left: an operator started again
    /// against the same apiserver, with nothing remembered.
    fn sharing(
        children: Children,
        first: impl Fn(&Seen) -> Option<(StatusCode, Value)> + Send + 'static,
        adjust: impl FnOnce(&mut Context),
    ) -> Self {
        let store = children.clone();
        let (client, log) = fake_apiserver::client(Box::new(move |r: &Seen| {
            first(r)
                .or_else(|| events_and_status(r))
                .or_else(|| {
                    (r.method == "GET" && r.path == SECRET)
                        .then(|| (StatusCode::OK, opted_in_secret()))
                })
                .or_else(|| store.answer(r))
        }));
        let mut ctx = bare_context(client);
        let (stateful_sets, sts_writer) = reflector::store();
        let (config_maps, cm_writer) = reflector::store();
        let (flows, flows_writer) = reflector::store();
        ctx.stateful_sets = stateful_sets;
        ctx.config_maps = config_maps;
        ctx.flows = flows;
        adjust(&mut ctx);
        let probe = ctx.probes.claim("ns/f");
        Fixture {
            ctx: Arc::new(ctx),
            log,
            children,
            stateful_sets: sts_writer,
            config_maps: cm_writer,
            flows: flows_writer,
            ids: guards::ClusterIds {
                source: Some("source-cluster".into()),
                target: Some("target-cluster".into()),
            },
            probe,
        }
    }

    async fn reconcile(&self, mf: &MirrorFlow) -> Result<Action, Error> {
        self.ctx.remember_cluster_ids(
            &Context::flow_key(mf),
            mf.meta().generation,
            self.ids.clone(),
        );
        tokio::time::timeout(
            Duration::from_secs(30),
            reconcile(Arc::new(mf.clone()), self.ctx.clone()),
        )
        .await
        .expect("the reconcile ends")
    }

    /// What was asked since the last call.
    fn requests(&self) -> Vec<Seen> {
        self.log
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }

    /// The watches catch up: they hold the StatefulSet and ConfigMap as the apiserver has them.
    fn watches_see_the_children(&mut self) {
        let sts: StatefulSet = self.children.get(STS);
        let cm: ConfigMap = self.children.get(CM);
        self.stateful_sets
            .apply_watcher_event(&watcher::Event::Apply(sts));
        self.config_maps
            .apply_watcher_event(&watcher::Event::Apply(cm));
    }
}

fn children_read(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .filter(|r| r.method == "GET" && [CM, SVC, STS, PDB].contains(&r.path.as_str()))
        .map(|r| r.path.clone())
        .collect()
}

fn applies_of_all_four() -> Vec<String> {
    [CM, SVC, STS, PDB]
        .iter()
        .map(|p| format!("PATCH {p}"))
        .collect()
}

/// Every event's note.
fn event_notes(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .filter(|r| r.method == "POST" && r.path.contains("/events"))
        .map(|r| r.body["note"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .unwrap_or(&Value::Null)
}

fn status_writes(seen: &[Seen]) -> usize {
    seen.iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
        .count()
}

fn apiserver_failure() -> (StatusCode, Value) {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "InternalError", "code": 500, "message": "etcdserver: request timed out"}),
    )
}

#[tokio::test]
async fn a_valid_flow_applies_its_four_children_in_order_with_server_side_apply_owner_references_and_one_field_manager()
 {
    let fx = Fixture::new();
    let action = fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    let seen = fx.requests();
    assert_eq!(wrote_children(&seen), applies_of_all_four());
    let patches: Vec<&Seen> = seen
        .iter()
        .filter(|r| r.method == "PATCH" && !r.path.starts_with("/apis/events.k8s.io/"))
        .collect();
    assert_eq!(
        patches.len(),
        5,
        "four children and the status: {patches:?}"
    );
    for p in &patches {
        assert_eq!(p.content_type, "application/apply-patch+yaml", "{}", p.path);
        let query: Vec<&str> = p.query.split('&').collect();
        assert!(
            query.contains(&"fieldManager=mirrorflow-operator") && query.contains(&"force=true"),
            "{}: {}",
            p.path,
            p.query
        );
    }
    for p in patches.iter().filter(|p| !p.path.ends_with("/status")) {
        let owners = &p.body["metadata"]["ownerReferences"];
        assert_eq!(
            owners.as_array().map(Vec::len),
            Some(1),
            "{}: {owners}",
            p.path
        );
        assert_eq!(
            (
                &owners[0]["kind"],
                &owners[0]["name"],
                &owners[0]["uid"],
                &owners[0]["controller"]
            ),
            (
                &json!("MirrorFlow"),
                &json!("f"),
                &json!("uid-f"),
                &json!(true)
            ),
            "{}",
            p.path
        );
    }
    let sts = patches
        .iter()
        .find(|p| p.path == STS)
        .expect("a StatefulSet");
    assert_eq!(sts.body["spec"]["replicas"], 1);
    assert_eq!(
        sts.body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"],
        "512Mi",
        "a flow without spec.resources gets the installer's default memory limit"
    );
    let written_bodies: String = seen
        .iter()
        .filter(|r| r.method != "GET")
        .map(|r| r.body.to_string())
        .collect();
    assert!(
        !written_bodies.contains(PASSWORD) && !written_bodies.contains(PASSWORD_B64),
        "a Secret's value is mounted in pods, never written into an object"
    );
    let (status, _) = written(&seen);
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["replicas"], 1);
    assert_eq!(
        status["readyReplicas"], READY_PODS,
        "as the applied StatefulSet says"
    );
    // No broker in a unit test: the status says so and the flow is looked at again soon.
    assert_eq!(
        condition(&status, status::READY)["reason"],
        reason::SOURCE_UNREACHABLE
    );
    assert_eq!(action, Action::requeue(STATUS_INTERVAL));
}

#[tokio::test]
async fn the_status_has_every_condition_at_the_flows_generation_and_a_flip_is_announced_once() {
    let fx = Fixture::new();
    let mf = flow_with(|v| v["metadata"]["generation"] = json!(3));
    fx.reconcile(&mf).await.expect("the reconcile succeeds");
    let seen = fx.requests();
    let (status, events) = written(&seen);
    let types: Vec<String> = reasons(&status).into_iter().map(|(t, _)| t).collect();
    assert_eq!(
        types,
        [
            status::READY,
            status::REPLICATING,
            status::CHECKPOINTS_FRESH,
            status::HEARTBEATS_FLOWING,
            status::FAILOVER_READY,
            status::GAPLESS
        ]
    );
    assert_eq!(status["observedGeneration"], 3);
    for c in status["conditions"].as_array().into_iter().flatten() {
        assert_eq!(c["observedGeneration"], 3, "{c}");
        assert!(c["lastTransitionTime"].is_string(), "{c}");
    }
    // Five conditions turned False for one cause: the recorder keys events by type, reason
    // and action (not the note), so they make one event, counted five times; Gapless True
    // has its own.
    assert_eq!(
        events,
        [
            (
                "Warning".to_string(),
                reason::SOURCE_UNREACHABLE.to_string()
            ),
            ("Normal".to_string(), status::GAPLESS.to_string())
        ]
    );
    let series = seen
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.starts_with("/apis/events.k8s.io/"))
        .map(|r| r.body["series"]["count"].as_i64())
        .collect::<Vec<_>>();
    assert_eq!(series, [2, 3, 4, 5].map(Some));
    let notes = event_notes(&seen);
    assert!(
        notes[0].starts_with("Ready is False: ")
            && notes[0].contains("check spec.source.bootstrapServers"),
        "the event names the field to fix: {notes:?}"
    );

    // The next refresh finds the same conditions: the status is written, nothing announced.
    let mut seen_before = mf.clone();
    seen_before.status = serde_json::from_value(status.clone()).expect("a status");
    fx.reconcile(&seen_before)
        .await
        .expect("the reconcile succeeds");
    let seen = fx.requests();
    let (again, events) = written(&seen);
    assert_eq!(events, Vec::<(String, String)>::new());
    assert_eq!(
        condition(&again, status::READY)["lastTransitionTime"],
        condition(&status, status::READY)["lastTransitionTime"],
        "nothing flipped"
    );
}

#[tokio::test]
async fn a_missing_secret_is_announced_with_the_field_and_the_fix() {
    let (_, seen) = run(serve(|_| None)).await;
    let notes = event_notes(&seen);
    let warnings: Vec<&String> = notes
        .iter()
        .filter(|n| !n.starts_with(status::GAPLESS))
        .collect();
    assert!(!warnings.is_empty(), "{notes:?}");
    for n in warnings {
        assert!(
            n.contains("spec.source.sasl") && n.contains("create it with key"),
            "{n}"
        );
    }
}

#[tokio::test]
async fn a_reconcile_with_nothing_changed_does_not_apply_the_children_again() {
    let mut fx = Fixture::new();
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    assert_eq!(wrote_children(&fx.requests()), applies_of_all_four());
    fx.watches_see_the_children();

    let action = fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    let seen = fx.requests();
    assert_eq!(wrote_children(&seen), Vec::<String>::new());
    assert_eq!(children_read(&seen), Vec::<String>::new());
    let (status, _) = written(&seen);
    assert_eq!(
        status["readyReplicas"], READY_PODS,
        "the watch cache tells the ready pods"
    );
    assert_eq!(action, Action::requeue(STATUS_INTERVAL));

    // Someone edits the StatefulSet: the watch shows a version the operator did not write.
    let mut edited: StatefulSet = fx.children.get(STS);
    edited.metadata.resource_version = Some("999".into());
    fx.stateful_sets
        .apply_watcher_event(&watcher::Event::Apply(edited));
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    assert_eq!(wrote_children(&fx.requests()), applies_of_all_four());
}

#[tokio::test]
async fn a_changed_spec_is_applied_although_the_children_did_not_move() {
    let mut fx = Fixture::new();
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    fx.watches_see_the_children();
    fx.requests();
    let scaled = flow_with(|v| {
        v["metadata"]["generation"] = json!(2);
        v["spec"]["replicas"] = json!(3);
    });
    fx.reconcile(&scaled).await.expect("the reconcile succeeds");
    let seen = fx.requests();
    assert_eq!(wrote_children(&seen), applies_of_all_four());
    let sts = seen
        .iter()
        .find(|r| r.method == "PATCH" && r.path == STS)
        .expect("the StatefulSet is applied");
    assert_eq!(sts.body["spec"]["replicas"], 3);
    assert_eq!(written(&seen).0["replicas"], 3);
}

#[tokio::test]
async fn observe_mode_deploys_nothing_and_removes_only_the_replicators_this_flow_owns() {
    let fx = Fixture::new();
    // Left from an earlier Replicate spec; the Service of the same name belongs to another
    // flow (recreated under this name), so it stays.
    fx.children.put(STS, child(STS, "uid-f"));
    fx.children.put(CM, child(CM, "uid-f"));
    fx.children.put(SVC, child(SVC, "uid-other"));
    let observe = flow_with(|v| v["spec"]["mode"] = json!("Observe"));
    let action = fx
        .reconcile(&observe)
        .await
        .expect("the reconcile succeeds");
    let seen = fx.requests();
    assert_eq!(
        wrote_children(&seen),
        [format!("DELETE {STS}"), format!("DELETE {CM}")]
    );
    assert_eq!(fx.children.paths(), [SVC]);
    let (status, _) = written(&seen);
    assert_eq!(status["replicas"], 0);
    assert_eq!(action, Action::requeue(STATUS_INTERVAL));

    // Removed a moment ago and none in the watch caches: no need to look again.
    fx.reconcile(&observe)
        .await
        .expect("the reconcile succeeds");
    let seen = fx.requests();
    assert_eq!(children_read(&seen), Vec::<String>::new());
    assert_eq!(wrote_children(&seen), Vec::<String>::new());
}

#[tokio::test]
async fn back_to_replicate_after_observe_applies_again_even_while_the_watches_lag() {
    let mut fx = Fixture::new();
    fx.reconcile(&flow()).await.expect("the reconcile succeeds");
    fx.watches_see_the_children();
    let observe = flow_with(|v| {
        v["metadata"]["generation"] = json!(2);
        v["spec"]["mode"] = json!("Observe");
    });
    fx.requests();
    fx.reconcile(&observe)
        .await
        .expect("the reconcile succeeds");
    assert_eq!(
        wrote_children(&fx.requests()),
        [STS, PDB, SVC, CM]
            .iter()
            .map(|p| format!("DELETE {p}"))
            .collect::<Vec<_>>()
    );
    // The watches still hold the deleted children, at the versions last applied: only the
    // record of that apply being gone makes the reconcile apply them again.
    let replicate = flow_with(|v| v["metadata"]["generation"] = json!(3));
    fx.reconcile(&replicate)
        .await
        .expect("the reconcile succeeds");
    assert_eq!(wrote_children(&fx.requests()), applies_of_all_four());
}

/// Refusals, deletion, apiserver failures, the lease and the probe slots.
#[path = "reconcile_failure_tests.rs"]
mod failures;

/// The NetworkPolicy child in front of the replicator pods.
#[path = "reconcile_network_tests.rs"]
mod network;

/// Replicas stranded on a lost node.
#[path = "reconcile_lost_node_tests.rs"]
mod lost_node;

/// The operator killed between two child writes, and started again; a namespace being deleted.
#[path = "reconcile_crash_tests.rs"]
mod crash;
