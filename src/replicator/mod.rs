//! The data plane: one process, three loops, no Kubernetes dependency.
//!
//! - [`source`]: copies records, names and configures remote topics, writes offset syncs and
//!   stores source positions on the target.
//! - [`checkpoint`]: translates source group offsets and writes MM2 checkpoints on the target;
//!   optionally commits them into idle target groups.
//! - [`heartbeat`]: emits heartbeats; their replicated copies measure end-to-end lag.
//!
//! Each loop retries on its own with backoff; a loop that fails for good ends the process with
//! an error, so a pod restarts instead of limping.

pub mod backoff;
pub mod checkpoint;
pub mod claim;
pub mod context;
pub mod health;
pub mod heartbeat;
pub mod holds;
pub mod kafka_io;
pub mod last_words;
pub mod metrics;
pub mod patience;
pub mod reach;
pub mod source;
pub mod stops;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use crate::flow::{Flow, FlowError};
pub use context::Context;
#[cfg(test)]
pub use context::test_context;
pub use health::{Loop, Readiness};
pub use metrics::Metrics;

/// Runs the enabled loops and the health server until `shutdown` fires or a loop fails.
pub async fn run(
    ctx: Arc<Context>,
    listen: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let spec = &ctx.flow.spec;
    if spec.mode == crate::api::FlowMode::Observe {
        anyhow::bail!(
            "spec.mode is Observe: another tool replicates this flow and the operator only watches it; set spec.mode to Replicate to run it here"
        );
    }
    tracing::info!(flow = %ctx.flow.name, source = %ctx.flow.source_alias(), target = %ctx.flow.target_alias(),
        replica = %ctx.replica, "replicator starting");
    refuse_own_source_as_target(&ctx).await?;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(serve_health(ctx.clone(), listen, shutdown.clone()));
    // Nothing is written to the target before the flow holds its claim on the internal topics.
    let Some(keeper) = claim::hold(&ctx, &shutdown).await? else {
        shutdown.cancel();
        return join_all(tasks, &shutdown).await;
    };
    // Released only once the loops stopped: their last positions are written by then.
    let loops_done = CancellationToken::new();
    let kept = tokio::spawn(claim::keep(keeper, shutdown.clone(), loops_done.clone()));
    if spec.source_loop.enabled {
        tasks.spawn(source::start::run(ctx.clone(), shutdown.clone()));
    }
    if spec.checkpoints.enabled {
        tasks.spawn(checkpoint::run(ctx.clone(), shutdown.clone()));
        if !spec.source_loop.enabled {
            tasks.spawn(holds::run(ctx.clone(), shutdown.clone()));
        }
    }
    if spec.heartbeats.enabled {
        tasks.spawn(heartbeat::run(ctx.clone(), shutdown.clone()));
    }
    let result = join_all(tasks, &shutdown).await;
    loops_done.cancel();
    let kept = kept.await.map_err(anyhow::Error::from).and_then(|r| r);
    result.and(kept)
}

async fn join_all(
    mut tasks: tokio::task::JoinSet<anyhow::Result<()>>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let mut result = Ok(());
    while let Some(joined) = tasks.join_next().await {
        let outcome = joined.map_err(anyhow::Error::from).and_then(|r| r);
        if let Err(e) = outcome {
            tracing::error!(error = %format!("{e:#}"), "a loop failed; stopping the replicator");
            if result.is_ok() {
                result = Err(e);
            }
        }
        // One loop ending (error or shutdown) ends them all: loops depend on each other's work.
        shutdown.cancel();
    }
    tracing::info!("replicator stopped");
    result
}

/// The operator refuses such a flow before deploying it; a standalone run, or a spec the
/// operator could not check because a cluster was down, is refused here, before any topic is
/// created. A cluster that does not answer leaves the question open: nothing can be created
/// on it either, and the operator decides once it answers.
async fn refuse_own_source_as_target(ctx: &Context) -> anyhow::Result<()> {
    use crate::kafka::cluster_id::{cluster_id, same_cluster_message};
    let (source, target) = (
        ctx.flow.source_client.clone(),
        ctx.flow.target_client.clone(),
    );
    let ids = tokio::task::spawn_blocking(move || {
        let timeout = std::time::Duration::from_secs(10);
        (cluster_id(&source, timeout), cluster_id(&target, timeout))
    })
    .await?;
    if let Some(message) = same_cluster_message(ids.0.as_deref(), ids.1.as_deref()) {
        anyhow::bail!("{message}");
    }
    if ids.0.is_none() || ids.1.is_none() {
        tracing::warn!(source = ?ids.0, target = ?ids.1, "a cluster did not say its id; starting anyway");
    }
    Ok(())
}

async fn serve_health(
    ctx: Arc<Context>,
    listen: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    health::serve(listen, ctx.metrics.clone(), ctx.readiness.clone(), shutdown).await?;
    Ok(())
}
