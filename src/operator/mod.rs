//! The control plane: watches `MirrorFlow`s, deploys their replicators and writes a status
//! measured on the clusters themselves.
//!
//! - [`desired`]: the child objects, built by pure functions.
//! - [`conditions`]: conditions and status from an observation, pure.
//! - [`probe`]: what the clusters say (heartbeats, checkpoints, group offsets).
//! - [`reconcile`]: the pipeline that ties them together.
//! - [`lease`]: leader election, so the chart can run two operators.

pub mod conditions;
pub mod desired;
pub mod lease;
pub mod probe;
pub mod reconcile;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

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
}

impl OperatorMetrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("mirrorflow_operator".into()), None)?;
        let m = OperatorMetrics {
            reconciles: IntCounter::new("reconciles_total", "Reconciles started")?,
            reconcile_errors: IntCounterVec::new(
                Opts::new("reconcile_errors_total", "Reconciles that failed, by kind"),
                &["kind"],
            )?,
            reconcile_duration: Histogram::with_opts(
                HistogramOpts::new("reconcile_duration_seconds", "Time per reconcile")
                    .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            )?,
            registry,
        };
        m.registry.register(Box::new(m.reconciles.clone()))?;
        m.registry.register(Box::new(m.reconcile_errors.clone()))?;
        m.registry
            .register(Box::new(m.reconcile_duration.clone()))?;
        Ok(m)
    }
}

pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: OperatorMetrics,
    pub replicator_image: String,
    /// The status last written per flow (`namespace/name`).
    pub last_status:
        std::sync::Mutex<std::collections::HashMap<String, crate::api::MirrorFlowStatus>>,
    /// Consecutive failed reconciles per flow (`namespace/name`); reset by a success.
    pub failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
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

    pub fn record_success(&self, key: &str) {
        if let Ok(mut m) = self.failures.lock() {
            m.remove(key);
        }
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

pub struct Options {
    pub listen: SocketAddr,
    pub replicator_image: String,
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
    tokio::spawn(serve(opts.listen, metrics.clone()));

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
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        metrics,
        replicator_image: opts.replicator_image,
        last_status: Default::default(),
        failures: Default::default(),
    });
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
    Controller::new(flows, watcher::Config::default())
        .owns(stses, owned.clone())
        .owns(cms, owned)
        .shutdown_on_signal()
        .run(reconcile::reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile result");
            }
        })
        .await;
    tracing::info!("operator stopped");
    if let Some((lock, renewing)) = lease {
        // Stop renewing first, or the next renewal would take the released lease back.
        renewing.abort();
        if let Err(e) = lock.release().await {
            tracing::warn!(error = %e, "could not release the leader lease; it expires by itself");
        }
    }
    Ok(())
}

/// Renews the lease; a holder that lost it exits at once, so two operators never write at once.
async fn keep_lease(lock: Arc<lease::LeaseLock>) {
    loop {
        tokio::time::sleep(lease::RENEW_EVERY).await;
        match lock.try_acquire_or_renew().await {
            Ok(true) => {}
            Ok(false) => {
                tracing::error!("lost the leader lease; exiting so another replica takes over");
                std::process::exit(1);
            }
            Err(e) => tracing::warn!(error = %e, "renewing the leader lease failed; retrying"),
        }
    }
}

async fn serve(listen: SocketAddr, metrics: OperatorMetrics) {
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
        .route("/healthz", get(|| async { "ok" }))
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
    fn retries_back_off_exponentially_to_a_cap() {
        let delays: Vec<u64> = (1..=9).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(retry_delay(0).as_secs(), 5);
        assert_eq!(retry_delay(u32::MAX).as_secs(), 300);
    }
}
