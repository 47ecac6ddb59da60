//! The control plane: watches `MirrorFlow`s, deploys their replicators and writes a status
//! measured on the clusters themselves.
//!
//! - [`desired`]: the child objects, built by pure functions.
//! - [`crate::status`]: conditions and status from an observation (pure), and the probe that
//!   reads what the clusters say (heartbeats, checkpoints, group offsets); shared with the CLI.
//! - [`reconcile`]: the pipeline that ties them together.
//! - [`lease`]: leader election, so the chart can run two operators.
//! - [`triggers`]: which watch events start a reconcile (not the operator's own status writes).

pub mod applied;
pub mod desired;
pub mod failed_creates;
#[cfg(test)]
pub mod fake_apiserver;
pub mod guards;
pub mod lease;
pub mod liveness;
pub mod lost_nodes;
pub mod network;
pub mod owned;
pub mod probes;
pub mod reconcile;
pub mod rejections;
pub mod slim;
pub mod spread;
pub mod triggers;
pub mod unready;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use crate::api::MirrorFlow;

/// The one field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "mirrorflow-operator";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("apiserver: {0}")]
    Kube(#[from] kube::Error),
    #[error("building the flow's objects: {0}")]
    Build(#[source] desired::BuildError),
    #[error("MirrorFlow has no namespace")]
    NotNamespaced,
}

impl Error {
    /// Low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "apiserver",
            Error::Build(_) => "build",
            Error::NotNamespaced => "not_namespaced",
        }
    }
}

#[derive(Clone)]
pub struct OperatorMetrics {
    pub registry: Registry,
    pub reconciles: IntCounter,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_duration: Histogram,
    /// Replicas deleted because their node was lost ([`lost_nodes`]).
    pub replicas_replaced: IntCounter,
    /// Per flow (`namespace`, `flow`): 1 while a condition is True, by `condition`.
    pub flow_condition: IntGaugeVec,
    /// Per flow: age of the newest replicated source heartbeat (absent when none was seen).
    pub flow_heartbeat_lag: GaugeVec,
    /// Per flow: checkpoint age of the least-ready group (+Inf when a group has none).
    pub flow_oldest_checkpoint_age: GaugeVec,
    /// Per flow: source records not yet copied.
    pub flow_replication_lag: IntGaugeVec,
    /// Per flow: groups not ready to fail over.
    pub flow_groups_not_ready: IntGaugeVec,
    /// Flows with series, so those of deleted flows can be dropped.
    recorded_flows: Arc<std::sync::Mutex<std::collections::BTreeSet<(String, String)>>>,
}

const FLOW_LABELS: &[&str] = &["namespace", "flow"];

impl OperatorMetrics {
    /// Publishes a flow's measured state; series of values that are unknown now are removed,
    /// so a dashboard shows a gap instead of a stale number.
    pub fn record_flow(
        &self,
        ns: &str,
        flow: &str,
        obs: &crate::status::Observation,
        status: &crate::api::MirrorFlowStatus,
        max_checkpoint_age: Duration,
    ) {
        if let Ok(mut recorded) = self.recorded_flows.lock() {
            recorded.insert((ns.to_string(), flow.to_string()));
        }
        let labels = [ns, flow];
        for c in &status.conditions {
            self.flow_condition
                .with_label_values(&[ns, flow, c.type_.as_str()])
                .set(i64::from(c.status == "True"));
        }
        match obs.heartbeat_age {
            Some(age) => self
                .flow_heartbeat_lag
                .with_label_values(&labels)
                .set(age.as_secs_f64()),
            None => {
                let _ = self.flow_heartbeat_lag.remove_label_values(&labels);
            }
        }
        let oldest = obs
            .groups
            .iter()
            .map(|g| g.checkpoint_age.map_or(f64::INFINITY, |a| a.as_secs_f64()))
            .fold(None, |m: Option<f64>, a| Some(m.map_or(a, |m| m.max(a))));
        match oldest {
            Some(age) => self
                .flow_oldest_checkpoint_age
                .with_label_values(&labels)
                .set(age),
            None => {
                let _ = self.flow_oldest_checkpoint_age.remove_label_values(&labels);
            }
        }
        match obs.replication_lag {
            Some(lag) => self
                .flow_replication_lag
                .with_label_values(&labels)
                .set(lag),
            None => {
                let _ = self.flow_replication_lag.remove_label_values(&labels);
            }
        }
        // Every probed group counts, not only the (capped) list in the status.
        let not_ready = obs
            .groups
            .iter()
            .filter(|g| g.checkpoint_age.is_none_or(|age| age > max_checkpoint_age))
            .count();
        self.flow_groups_not_ready
            .with_label_values(&labels)
            .set(i64::try_from(not_ready).unwrap_or(i64::MAX));
    }

    /// Drops the series of flows that no longer exist (deleted flows get no reconcile).
    pub fn retain_flows(&self, live: &std::collections::BTreeSet<(String, String)>) {
        let gone: Vec<(String, String)> = match self.recorded_flows.lock() {
            Ok(recorded) => recorded.difference(live).cloned().collect(),
            Err(_) => return,
        };
        for (ns, flow) in gone {
            self.forget_flow(&ns, &flow);
        }
    }

    /// Drops every series of a deleted flow.
    pub fn forget_flow(&self, ns: &str, flow: &str) {
        if let Ok(mut recorded) = self.recorded_flows.lock() {
            recorded.remove(&(ns.to_string(), flow.to_string()));
        }
        let labels = [ns, flow];
        for c in [
            crate::status::READY,
            crate::status::REPLICATING,
            crate::status::CHECKPOINTS_FRESH,
            crate::status::HEARTBEATS_FLOWING,
            crate::status::FAILOVER_READY,
        ] {
            let _ = self.flow_condition.remove_label_values(&[ns, flow, c]);
        }
        let _ = self.flow_heartbeat_lag.remove_label_values(&labels);
        let _ = self.flow_oldest_checkpoint_age.remove_label_values(&labels);
        let _ = self.flow_replication_lag.remove_label_values(&labels);
        let _ = self.flow_groups_not_ready.remove_label_values(&labels);
    }

    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("mirrorflow_operator".into()), None)?;
        let m = OperatorMetrics {
            reconciles: IntCounter::new("reconciles_total", "Reconciles started")?,
            replicas_replaced: IntCounter::new(
                "replicas_replaced_total",
                "Replicator pods deleted because their node stopped answering",
            )?,
            reconcile_errors: IntCounterVec::new(
                Opts::new("reconcile_errors_total", "Reconciles that failed, by kind"),
                &["kind"],
            )?,
            reconcile_duration: Histogram::with_opts(
                HistogramOpts::new("reconcile_duration_seconds", "Time per reconcile")
                    .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            )?,
            flow_condition: IntGaugeVec::new(
                Opts::new("flow_condition", "1 while the flow's condition is True"),
                &["namespace", "flow", "condition"],
            )?,
            flow_heartbeat_lag: GaugeVec::new(
                Opts::new(
                    "flow_heartbeat_lag_seconds",
                    "Age of the newest replicated source heartbeat on the target",
                ),
                FLOW_LABELS,
            )?,
            flow_oldest_checkpoint_age: GaugeVec::new(
                Opts::new(
                    "flow_oldest_checkpoint_age_seconds",
                    "Checkpoint age of the flow's least-ready group (+Inf: a group has none)",
                ),
                FLOW_LABELS,
            )?,
            flow_replication_lag: IntGaugeVec::new(
                Opts::new(
                    "flow_replication_lag_records",
                    "Source records not yet copied to the target",
                ),
                FLOW_LABELS,
            )?,
            recorded_flows: Default::default(),
            flow_groups_not_ready: IntGaugeVec::new(
                Opts::new(
                    "flow_groups_not_ready",
                    "Consumer groups that could not fail over now",
                ),
                FLOW_LABELS,
            )?,
            registry,
        };
        m.registry.register(Box::new(m.flow_condition.clone()))?;
        m.registry
            .register(Box::new(m.flow_heartbeat_lag.clone()))?;
        m.registry
            .register(Box::new(m.flow_oldest_checkpoint_age.clone()))?;
        m.registry
            .register(Box::new(m.flow_replication_lag.clone()))?;
        m.registry
            .register(Box::new(m.flow_groups_not_ready.clone()))?;
        m.registry.register(Box::new(m.reconciles.clone()))?;
        m.registry.register(Box::new(m.replicas_replaced.clone()))?;
        m.registry.register(Box::new(m.reconcile_errors.clone()))?;
        m.registry
            .register(Box::new(m.reconcile_duration.clone()))?;
        Ok(m)
    }
}

pub struct Context {
    pub client: Client,
    /// Beaten by every reconcile; `/healthz` fails when it stops.
    pub liveness: Arc<liveness::Liveness>,
    pub recorder: Recorder,
    pub metrics: OperatorMetrics,
    pub replicator_image: String,
    /// Image prefixes a flow may choose with `spec.pod.image` (besides `replicator_image`).
    pub allowed_image_prefixes: Vec<String>,
    /// Label and annotation keys a flow may put on its pods (`spec.pod.labels`, `.annotations`).
    pub allowed_pod_metadata_keys: Vec<String>,
    /// The installer's defaults and bounds for replicator containers' resources.
    pub resources: guards::ResourcePolicy,
    /// The installer's NetworkPolicy for replicator pods.
    pub network: network::ReplicatorNetwork,
    /// The addresses the probe may connect to (every bootstrap server is checked first).
    pub addresses: guards::addresses::AddressPolicy,
    /// How long a replica's node may be lost before the replica is replaced; `None`: never.
    pub replace_after: Option<Duration>,
    /// The status last written per flow (`namespace/name`).
    pub last_status: Mutex<HashMap<String, crate::api::MirrorFlowStatus>>,
    /// Consecutive failed reconciles per flow (`namespace/name`); reset by a success.
    pub failures: Mutex<HashMap<String, u32>>,
    /// Every flow the operator sees (the controller's watch cache), for checks across flows.
    pub flows: reflector::Store<MirrorFlow>,
    /// The leader lease when leader election is on: no write without holding it.
    pub lease: Option<Arc<lease::LeaseLock>>,
    /// Probes running now, and the slots that bound them per namespace and in all.
    pub probes: probes::Probes,
    /// The probes' Kafka clients, shared per namespace, cluster and credentials.
    pub probe_clients: Arc<crate::status::clients::ProbeClients>,
    /// The clusters' ids per flow and the spec generation they were asked for.
    pub cluster_ids: Mutex<HashMap<String, (Option<i64>, guards::ClusterIds)>>,
    /// The last apply of each flow's children (`namespace/name`), to apply only on change.
    pub applied: Mutex<HashMap<String, applied::Applied>>,
    /// When each flow without replicators last had its children removed.
    pub removed: Mutex<HashMap<String, std::time::Instant>>,
    /// The children this operator manages, as the watches see them.
    pub stateful_sets: reflector::Store<StatefulSet>,
    pub config_maps: reflector::Store<ConfigMap>,
}

impl Context {
    pub fn flow_key(mf: &MirrorFlow) -> String {
        format!("{}/{}", mf.namespace().unwrap_or_default(), mf.name_any())
    }

    /// Counts one more failure of `key` and returns how many in a row.
    fn record_failure(&self, key: String) -> u32 {
        let Ok(mut m) = self.failures.lock() else {
            return 1;
        };
        let n = m.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub fn cluster_ids_of(&self, key: &str) -> Option<(Option<i64>, guards::ClusterIds)> {
        self.cluster_ids.lock().ok()?.get(key).cloned()
    }

    /// The ids last seen for a flow, whatever generation they were asked for.
    pub fn known_cluster_ids(&self, key: &str) -> guards::ClusterIds {
        self.cluster_ids_of(key)
            .map(|(_, ids)| ids)
            .unwrap_or_default()
    }

    pub fn remember_cluster_ids(
        &self,
        key: &str,
        generation: Option<i64>,
        ids: guards::ClusterIds,
    ) {
        if let Ok(mut m) = self.cluster_ids.lock() {
            m.insert(key.to_string(), (generation, ids));
        }
    }

    /// Forgets what is kept per flow once the flow is gone.
    pub fn forget(&self, key: &str) {
        for map in self.per_flow_maps() {
            map.forget(key);
        }
    }

    /// Forgets every flow not in `live` (`namespace/name`) in every map kept per flow, and
    /// gives the maps' room back: a flow that never got a status (failing, or deleted before
    /// its first probe) left its entries in the other maps before.
    pub fn retain_flows(&self, live: &HashSet<String>) {
        for map in self.per_flow_maps() {
            map.retain(live);
        }
    }

    /// Entries kept per flow, by map (for tests).
    #[cfg(test)]
    pub fn per_flow_entries(&self) -> [usize; 5] {
        self.per_flow_maps().map(|m| m.entries())
    }

    /// Every map kept per flow: the one list forgetting and retaining walk.
    fn per_flow_maps(&self) -> [&dyn PerFlow; 5] {
        [
            &self.cluster_ids,
            &self.last_status,
            &self.failures,
            &self.applied,
            &self.removed,
        ]
    }

    /// Whether this operator may write: it holds a renewed lease, or runs without election.
    pub fn leading(&self) -> bool {
        self.lease.as_ref().is_none_or(|l| l.leading())
    }

    pub fn record_success(&self, key: &str) {
        if let Ok(mut m) = self.failures.lock() {
            m.remove(key);
        }
    }
}

/// A map keyed by flow (`namespace/name`), whatever it keeps.
trait PerFlow {
    fn forget(&self, key: &str);
    fn retain(&self, live: &HashSet<String>);
    #[cfg(test)]
    fn entries(&self) -> usize;
}

impl<V> PerFlow for Mutex<HashMap<String, V>> {
    fn forget(&self, key: &str) {
        if let Ok(mut m) = self.lock() {
            m.remove(key);
        }
    }

    fn retain(&self, live: &HashSet<String>) {
        if let Ok(mut m) = self.lock() {
            m.retain(|k, _| live.contains(k));
            m.shrink_to_fit();
        }
    }

    #[cfg(test)]
    fn entries(&self) -> usize {
        self.lock().map(|m| m.len()).unwrap_or(0)
    }
}

/// Retry delay after `failures` consecutive failed reconciles: 5 s, 10 s, 20 s ... capped at
/// 5 min, so an apiserver hiccup is retried fast and a persistent error costs one attempt
/// every few minutes.
pub fn retry_delay(failures: u32) -> Duration {
    const FIRST: Duration = Duration::from_secs(5);
    const CAP: Duration = Duration::from_secs(300);
    let doublings = failures.saturating_sub(1).min(16);
    FIRST.saturating_mul(1 << doublings).min(CAP)
}

/// Threads for blocking work (probes, cluster id look-ups, closing clients): room for every
/// probe slot and as many look-ups. tokio's default allows 512, and a pool that grew at start
/// (every flow's first cluster id look-up at once) never shrank: 50 probes a second reach each
/// idle thread before its keep-alive ends. At 500 flows that kept over a hundred threads, each
/// with its stack and its share of glibc's arenas. Work beyond the cap waits for a thread.
pub const MAX_BLOCKING_THREADS: usize = 2 * probes::MAX_PROBES;

/// The operator's runtime: tokio's defaults but for [`MAX_BLOCKING_THREADS`].
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .build()
}

pub struct Options {
    pub listen: SocketAddr,
    pub replicator_image: String,
    /// Image prefixes a flow may choose with `spec.pod.image`.
    pub allowed_image_prefixes: Vec<String>,
    /// Label and annotation keys a flow may put on its pods.
    pub allowed_pod_metadata_keys: Vec<String>,
    /// Defaults and bounds for replicator containers' resources.
    pub resources: guards::ResourcePolicy,
    /// The NetworkPolicy for replicator pods.
    pub network: network::ReplicatorNetwork,
    /// The addresses the probe may connect to.
    pub addresses: guards::addresses::AddressPolicy,
    /// How long a replica's node may be lost before the replica is replaced; `None`: never.
    pub replace_after: Option<Duration>,
    /// Namespace to watch; `None` = all.
    pub watch_namespace: Option<String>,
    /// (namespace, holder identity) when leader election is on.
    pub leader_election: Option<(String, String)>,
}

/// Backoff for a failing flow: grows with consecutive failures, capped, so a broken flow
/// never hot-loops.
fn error_policy(mf: Arc<MirrorFlow>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[error.metric_label()])
        .inc();
    let failures = ctx.record_failure(Context::flow_key(&mf));
    let delay = retry_delay(failures);
    tracing::warn!(flow = %mf.name_any(), namespace = ?mf.namespace(), error = %error,
        failures, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

pub async fn run(opts: Options) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let metrics = OperatorMetrics::new()?;
    // A standby waiting for the Lease is ready too: readiness gates rollouts and PDBs, and a
    // rollout must be able to start a new pod while the old one still holds the Lease.
    let liveness = Arc::new(liveness::Liveness::default());
    let (store, writer) = reflector::store();
    tokio::spawn(serve(
        opts.listen,
        metrics.clone(),
        liveness.clone(),
        store.clone(),
    ));

    let lease = match &opts.leader_election {
        Some((ns, holder)) => {
            let lock = Arc::new(lease::LeaseLock::new(
                client.clone(),
                ns,
                "mirrorflow-operator",
                holder,
            ));
            lock.acquire().await?;
            let renewing = tokio::spawn(keep_lease(lock.clone()));
            Some((lock, renewing))
        }
        None => None,
    };

    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let (flows, stses, cms) = match &opts.watch_namespace {
        Some(ns) => (
            Api::<MirrorFlow>::namespaced(client.clone(), ns),
            Api::<StatefulSet>::namespaced(client.clone(), ns),
            Api::<ConfigMap>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    let owned =
        watcher::Config::default().labels("app.kubernetes.io/managed-by=mirrorflow-operator");
    tracing::info!("operator running");
    let (stateful_sets, sts_writer) = reflector::store();
    let (config_maps, cm_writer) = reflector::store();
    let probe_clients = Arc::new(
        crate::status::clients::ProbeClients::default()
            .with_address_check(opts.addresses.connect_check()),
    );
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        metrics,
        replicator_image: opts.replicator_image,
        allowed_image_prefixes: opts.allowed_image_prefixes,
        allowed_pod_metadata_keys: opts.allowed_pod_metadata_keys,
        resources: opts.resources,
        network: opts.network,
        addresses: opts.addresses,
        replace_after: opts.replace_after,
        last_status: Default::default(),
        failures: Default::default(),
        flows: store.clone(),
        lease: lease.as_ref().map(|(lock, _)| lock.clone()),
        probes: Default::default(),
        probe_clients,
        cluster_ids: Default::default(),
        applied: Default::default(),
        removed: Default::default(),
        stateful_sets,
        config_maps,
        liveness,
    });
    tokio::spawn(evict_idle_clients(ctx.probe_clients.clone()));
    // The caches keep only what the reconcile reads (`slim`).
    let flow_changes = watcher(flows, watcher::Config::default())
        .default_backoff()
        .modify(slim::flow)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(triggers::flow_change, Default::default());
    let replica_changes = watcher(stses, owned.clone())
        .default_backoff()
        .modify(slim::stateful_set)
        .reflect(sts_writer)
        .applied_objects()
        .predicate_filter(triggers::replicas_change, Default::default());
    let config_changes = watcher(cms, owned)
        .default_backoff()
        .modify(slim::config_map)
        .reflect(cm_writer)
        .applied_objects();
    let controller = Controller::for_stream(flow_changes, store)
        .owns_stream(replica_changes)
        .owns_stream(config_changes)
        .shutdown_on_signal();
    tokio::spawn(prune_gone_flows(controller.store(), ctx.clone()));
    let stopping = ctx.clone();
    controller
        .run(reconcile::reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile result");
            }
        })
        .await;
    tracing::info!("operator stopped");
    if let Some((lock, renewing)) = lease {
        last_statuses(stopping).await;
        // Stop renewing first, or the next renewal would take the released lease back.
        renewing.abort();
        if let Err(e) = lock.release().await {
            tracing::warn!(error = %e, "could not release the leader lease; it expires by itself");
        }
    }
    Ok(())
}

/// How long a stopping leader may spend on [`last_statuses`]: well inside the pod's default
/// 30 s grace period, after the reconciles in flight have finished.
const LAST_STATUS_BUDGET: Duration = Duration::from_secs(12);

/// On a graceful stop (a rollout, a drain), with the lease still held: every flow reconciled
/// once more, all at once, so each status is at most a probe old when the standby takes the
/// released lease. Without it a flow probed just before the stop kept that status for up to
/// another probe interval plus the standby's start, about two intervals in all.
async fn last_statuses(ctx: Arc<Context>) {
    let flows = ctx.flows.state();
    let count = flows.len();
    let pass = futures::future::join_all(
        flows
            .into_iter()
            .map(|mf| reconcile::reconcile(mf, ctx.clone())),
    );
    match tokio::time::timeout(LAST_STATUS_BUDGET, pass).await {
        Ok(_) => tracing::info!(flows = count, "wrote the last statuses before handing over"),
        Err(_) => tracing::warn!(flows = count, budget = ?LAST_STATUS_BUDGET,
            "the last statuses took longer than their budget; handing over with the rest as they were"),
    }
}

/// Every 30 s, drops the metric series and per-flow memory of flows that are gone from the
/// watch cache (a deleted flow gets no reconcile to do it).
async fn prune_gone_flows(store: kube::runtime::reflector::Store<MirrorFlow>, ctx: Arc<Context>) {
    // An empty cache before the first list would look like "every flow deleted".
    if store.wait_until_ready().await.is_err() {
        return;
    }
    loop {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let live: std::collections::BTreeSet<(String, String)> = store
            .state()
            .iter()
            .map(|mf| (mf.namespace().unwrap_or_default(), mf.name_any()))
            .collect();
        ctx.metrics.retain_flows(&live);
        ctx.probes
            .retain_namespaces(&live.iter().map(|(ns, _)| ns.clone()).collect());
        ctx.retain_flows(&live.iter().map(|(ns, n)| format!("{ns}/{n}")).collect());
    }
}

/// Drops the probe clients no flow used lately (deleted flows, changed credentials), then
/// hands the heap's free pages back to the system: glibc keeps memory freed below blocks in
/// use (what deleted flows, finished probes and watch lists left), so without it the resident
/// size never went down after flows were deleted.
async fn evict_idle_clients(clients: Arc<crate::status::clients::ProbeClients>) {
    loop {
        tokio::time::sleep(crate::status::clients::IDLE / 3).await;
        let c = clients.clone();
        // Closing a librdkafka client joins its threads: not on the runtime's workers.
        let _ = tokio::task::spawn_blocking(move || {
            c.evict_idle();
            mirrorflow_rdkafka_ext::heap::release_free_memory();
        })
        .await;
    }
}

/// Renews the lease; a holder that lost it, or could not renew it within the renew deadline
/// (apiserver unreachable or stalled, process frozen), exits at once, so two operators never
/// write at once. Reconciles also check [`lease::LeaseLock::leading`] before they write.
async fn keep_lease(lock: Arc<lease::LeaseLock>) {
    loop {
        tokio::time::sleep(lease::RENEW_EVERY).await;
        // A stalled connection must not hold the loop past the deadline.
        match tokio::time::timeout(lease::RENEW_EVERY, lock.try_acquire_or_renew()).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                tracing::error!("lost the leader lease; exiting so another replica takes over");
                std::process::exit(1);
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "renewing the leader lease failed; retrying"),
            Err(_) => tracing::warn!("renewing the leader lease got no answer; retrying"),
        }
        if !lock.leading() {
            tracing::error!(since_renewed = ?lock.since_renewed(), deadline = ?lease::RENEW_DEADLINE,
                "could not renew the leader lease in time; exiting so another replica takes over");
            std::process::exit(1);
        }
    }
}

async fn serve(
    listen: SocketAddr,
    metrics: OperatorMetrics,
    liveness: Arc<liveness::Liveness>,
    flows: kube::runtime::reflector::Store<MirrorFlow>,
) {
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    let mut out = String::new();
                    let _ = prometheus::TextEncoder::new()
                        .encode_utf8(&metrics.registry.gather(), &mut out);
                    out
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let alive = liveness.alive(flows.state().len(), std::time::Instant::now());
                async move {
                    if alive {
                        (axum::http::StatusCode::OK, "ok")
                    } else {
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            "no reconcile within the liveness window while flows exist",
                        )
                    }
                }
            }),
        )
        .route("/readyz", get(|| async { "ready" }));
    match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => {
            if let Err(e) = axum::serve(l, app).await {
                tracing::error!(error = %e, "health server stopped");
            }
        }
        Err(e) => tracing::error!(error = %e, %listen, "cannot bind the health server"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_threads_are_capped_above_the_probe_slots() {
        const { assert!(MAX_BLOCKING_THREADS > probes::MAX_PROBES) };
        let rt = runtime().expect("a runtime");
        let started = rt.block_on(async {
            let tasks: Vec<_> = (0..3 * MAX_BLOCKING_THREADS)
                .map(|_| tokio::task::spawn_blocking(|| 1))
                .collect();
            let mut n = 0;
            for t in tasks {
                n += t.await.expect("a blocking task");
            }
            n
        });
        assert_eq!(
            started,
            3 * MAX_BLOCKING_THREADS,
            "work past the cap waits, it is not lost"
        );
    }

    #[test]
    fn retries_back_off_exponentially_to_a_cap() {
        let delays: Vec<u64> = (1..=9).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(retry_delay(0).as_secs(), 5);
        assert_eq!(retry_delay(u32::MAX).as_secs(), 300);
    }
}
