//! `/metrics`, `/healthz` (the process is alive and its loops are not wedged) and `/readyz`
//! (every enabled loop has done its first round of work).

use crate::clock::now_ms;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;

/// The replicator's loops, for liveness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loop {
    Source = 0,
    Checkpoint = 1,
    Heartbeat = 2,
}

impl Loop {
    const ALL: [Loop; 3] = [Loop::Source, Loop::Checkpoint, Loop::Heartbeat];

    fn name(self) -> &'static str {
        match self {
            Loop::Source => "source",
            Loop::Checkpoint => "checkpoint",
            Loop::Heartbeat => "heartbeat",
        }
    }
}

/// Readiness flags the loops raise once they are working, and the last time each loop went
/// round its main loop (liveness).
#[derive(Default)]
pub struct Readiness {
    pub source: AtomicBool,
    pub checkpoint: AtomicBool,
    pub heartbeat: AtomicBool,
    /// Per [`Loop`]: ms since the epoch of its last turn; 0 = not in its main loop yet.
    turns: [AtomicI64; 3],
    /// Per [`Loop`]: how long without a turn counts as wedged; `None` = not checked (disabled).
    stall_limits: [Option<Duration>; 3],
}

/// A loop that waits for a cluster still turns (polls time out, ticks fire, writes time out
/// after at most 120 s: `message.timeout.ms` of every producer); this long without a turn is a
/// loop stuck in a call that never returns.
pub const MIN_STALL_LIMIT: Duration = Duration::from_secs(300);

/// A heartbeat older than a few intervals is worthless: the heartbeat loop gives up on a
/// write after this rather than queue it.
pub fn heartbeat_write_timeout(interval: Duration) -> Duration {
    interval.saturating_mul(5).max(Duration::from_secs(5))
}

/// The longest one turn of the heartbeat loop can take: both writes wait at most
/// [`heartbeat_write_timeout`], at once, after a tick of one interval.
pub fn heartbeat_longest_turn(interval: Duration) -> Duration {
    heartbeat_write_timeout(interval).saturating_add(interval)
}

impl Readiness {
    /// Marks loops that are disabled as ready so they do not hold readiness back.
    pub fn with_disabled(source: bool, checkpoint: bool, heartbeat: bool) -> Self {
        Readiness {
            source: AtomicBool::new(!source),
            checkpoint: AtomicBool::new(!checkpoint),
            heartbeat: AtomicBool::new(!heartbeat),
            turns: Default::default(),
            stall_limits: [source, checkpoint, heartbeat].map(|on| on.then_some(MIN_STALL_LIMIT)),
        }
    }

    /// A loop one of whose turns may take longer than [`MIN_STALL_LIMIT`] (the heartbeat loop
    /// waits up to five intervals for a write, and an interval can be an hour) gets that plus a
    /// minute.
    pub fn with_longest_turn(mut self, l: Loop, longest: Duration) -> Self {
        if let Some(limit) = self.stall_limits[l as usize].as_mut() {
            *limit = MIN_STALL_LIMIT.max(longest.saturating_add(Duration::from_secs(60)));
        }
        self
    }

    pub fn all_ready(&self) -> bool {
        self.source.load(Ordering::Relaxed)
            && self.checkpoint.load(Ordering::Relaxed)
            && self.heartbeat.load(Ordering::Relaxed)
    }

    /// Called by a loop each time round its main loop.
    pub fn turned(&self, l: Loop) {
        self.turned_at(l, now_ms());
    }

    /// A loop of several threads ([`crate::replicator::source::engine::workers`]) went round
    /// last at `ms` since the epoch, counting its slowest thread.
    pub fn turned_at(&self, l: Loop, ms: i64) {
        self.turns[l as usize].store(ms, Ordering::Relaxed);
    }

    /// The enabled loops that went round at least once and then not for longer than their
    /// limit, at `now_ms`. A loop still setting up (waiting for a cluster) is not judged.
    pub fn wedged(&self, now_ms: i64) -> Vec<(&'static str, Duration)> {
        Loop::ALL
            .iter()
            .filter_map(|&l| {
                let limit = self.stall_limits[l as usize]?;
                let last = self.turns[l as usize].load(Ordering::Relaxed);
                let since =
                    Duration::from_millis(u64::try_from(now_ms.saturating_sub(last)).unwrap_or(0));
                (last > 0 && since > limit).then_some((l.name(), since))
            })
            .collect()
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
        .route("/healthz", get(alive))
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

/// Liveness: fails while a loop is wedged, so kubelet restarts the pod.
async fn alive(State(state): State<AppState>) -> (StatusCode, String) {
    let wedged = state.readiness.wedged(now_ms());
    if wedged.is_empty() {
        return (StatusCode::OK, "ok".into());
    }
    let list: Vec<String> = wedged
        .iter()
        .map(|(name, since)| format!("{name} loop has not turned for {}s", since.as_secs()))
        .collect();
    tracing::error!(wedged = %list.join(", "), "a loop is wedged; liveness fails");
    (StatusCode::SERVICE_UNAVAILABLE, list.join(", "))
}

async fn ready(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.readiness.all_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_is_wedged_only_after_it_ran_and_then_stopped_turning() {
        let r = Readiness::with_disabled(true, true, false)
            .with_longest_turn(Loop::Checkpoint, Duration::from_secs(1));
        let now = now_ms();
        assert!(
            r.wedged(now + 10_000_000).is_empty(),
            "not started yet: not judged"
        );
        r.turned(Loop::Source);
        r.turned(Loop::Checkpoint);
        assert!(r.wedged(now_ms()).is_empty());
        let later = now_ms() + 301_000;
        let names: Vec<_> = r.wedged(later).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["source", "checkpoint"]);
        // A disabled loop is never judged, even if something calls turned() for it.
        r.turned(Loop::Heartbeat);
        assert!(!r.wedged(later).iter().any(|(n, _)| *n == "heartbeat"));
    }

    #[test]
    fn slow_loops_get_their_longest_turn_and_a_minute() {
        let r = Readiness::with_disabled(false, false, true)
            .with_longest_turn(Loop::Heartbeat, Duration::from_secs(3000));
        r.turned(Loop::Heartbeat);
        assert!(r.wedged(now_ms() + 3_000_000).is_empty());
        assert_eq!(r.wedged(now_ms() + 3_100_000).len(), 1);
    }
}
