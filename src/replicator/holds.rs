//! The refusal record of a flow whose source loop does not run (checkpoints only, beside
//! another copier). The batches its followers cannot read ([`super::reach::Reachability::hold`])
//! reach the operator through the positions topic's refusal record, which the source loop's
//! discovery writes every round otherwise: without it they reached the log and the metric only.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::context::Context;
use super::source::refused::{RefusalRecorder, read_previous};
use super::stops::stops_now;
use crate::kafka::positions::{PositionReader, positions_topic};

/// How often the holds are recorded: about a discovery round's default.
const ROUND_EVERY: Duration = Duration::from_secs(10);

/// Records the flow's holds in its positions topic until `shutdown`.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let flow = &ctx.flow;
    let topic = positions_topic(flow.source_alias());
    let group = super::source::source_group_id(flow);
    let reader = PositionReader::new(&flow.target_client, topic.clone(), &group)
        .context("creating the refusal record's reader")?;
    // What a previous run recorded: a hold fixed meanwhile gets its tombstone.
    let (_, previous) = read_previous(reader).await?;
    let mut recorder = RefusalRecorder::new(&flow.target_client, &topic, previous)
        .context("creating the refusal recorder")?;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(ROUND_EVERY) => {}
        }
        if let Err(e) = recorder.round(&[], stops_now(&ctx.clusters.stops)).await {
            ctx.metrics
                .errors
                .with_label_values(&["checkpoint", "refusal_record"])
                .inc();
            tracing::warn!(error = %e, "could not record the unreadable internal topics for the operator; retrying next round");
        }
    }
}
