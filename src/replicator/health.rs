//! `/metrics`, `/healthz` (the process is alive and its loops are not wedged) and `/readyz`
//! (every enabled loop has done its first round of work).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;

/// Readiness flags the loops raise once they are working.
#[derive(Default)]
pub struct Readiness {
    pub source: AtomicBool,
    pub checkpoint: AtomicBool,
    pub heartbeat: AtomicBool,
}

impl Readiness {
    /// Marks loops that are disabled as ready so they do not hold readiness back.
    pub fn with_disabled(source: bool, checkpoint: bool, heartbeat: bool) -> Self {
        Readiness {
            source: AtomicBool::new(!source),
            checkpoint: AtomicBool::new(!checkpoint),
            heartbeat: AtomicBool::new(!heartbeat),
        }
    }

    pub fn all_ready(&self) -> bool {
        self.source.load(Ordering::Relaxed)
            && self.checkpoint.load(Ordering::Relaxed)
            && self.heartbeat.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    readiness: Arc<Readiness>,
}

pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    readiness: Arc<Readiness>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(AppState { metrics, readiness });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

async fn render_metrics(State(state): State<AppState>) -> String {
    state.metrics.render()
}

async fn ready(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.readiness.all_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}
