//! The flow's claim on its positions topic ([`crate::kafka::writers`]): held before any loop
//! writes, renewed while they run, released when the replicator stops cleanly.
//!
//! A flow that finds an older flow's live claim copies nothing: it waits, renewing its own
//! claim (so the older one knows it is there) until the older claim lapses. One that finds
//! such a claim while its loops run (the older flow started again after this one took over)
//! stops the replicator with an error: the pod restarts and waits here, and no two flows ever
//! write the shared topics at once for longer than a renewal.

use crate::clock::now_ms;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tokio_util::sync::CancellationToken;

use super::context::Context;
use super::reach::Reachability;
use crate::kafka::positions::{PositionReader, positions_topic};
use crate::kafka::writers::{self, Claim, RENEW_EVERY};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a waiting flow looks again (and renews its claim): it goes on within this of the
/// older flow's release.
const WAITING_CHECK_EVERY: Duration = Duration::from_secs(2);

/// The open claim: what renews and releases it.
pub struct Keeper {
    ctx: Arc<Context>,
    topic: String,
    producer: BaseProducer,
    reader: PositionReader,
}

impl Keeper {
    fn new(ctx: Arc<Context>) -> anyhow::Result<Self> {
        let flow = &ctx.flow;
        let topic = positions_topic(flow.source_alias());
        let producer: BaseProducer = flow
            .target_client
            .clone()
            .set("linger.ms", "0")
            .create()
            .context("creating the claim producer")?;
        let group = super::source::source_group_id(flow);
        let reader = PositionReader::new(&flow.target_client, topic.clone(), &group)
            .context("creating the claims reader")?;
        Ok(Keeper {
            ctx,
            topic,
            producer,
            reader,
        })
    }

    /// Writes this flow's claim anew, reads every claim written so far, and returns the older
    /// flow's claim this one must yield to, if any. Blocking.
    fn renew(&mut self) -> anyhow::Result<Option<Claim>> {
        let writer = &self.ctx.flow.writer;
        let key = writers::encode_key(writer);
        let value = writers::encode_value(writer, now_ms());
        self.producer
            .send(
                BaseRecord::<[u8], [u8]>::to(&self.topic)
                    .key(&key[..])
                    .payload(&value[..]),
            )
            .map_err(|(e, _)| e)
            .context("writing the flow's claim")?;
        self.producer
            .flush(CALL_TIMEOUT)
            .context("writing the flow's claim")?;
        self.reader
            .read_to_end(CALL_TIMEOUT)
            .context("reading the claims")?;
        Ok(writers::yields_to(writer, self.reader.claims(), now_ms()).cloned())
    }

    /// A tombstone for the claim, so a flow waiting for this one goes on at once. Blocking.
    fn release(&self) {
        let key = writers::encode_key(&self.ctx.flow.writer);
        let sent = self
            .producer
            .send(BaseRecord::<[u8], [u8]>::to(&self.topic).key(&key[..]))
            .map_err(|(e, _)| e)
            .and_then(|()| self.producer.flush(CALL_TIMEOUT));
        if let Err(e) = sent {
            tracing::warn!(error = %e, topic = %self.topic, "releasing the flow's claim failed; it lapses by itself");
        }
    }
}

/// Runs `renew` on a blocking thread, handing the keeper back.
async fn renew(mut keeper: Keeper) -> anyhow::Result<(Keeper, Option<Claim>)> {
    tokio::task::spawn_blocking(move || {
        let yielded = keeper.renew();
        yielded.map(|y| (keeper, y))
    })
    .await?
}

/// Claims the positions topic, waiting while an older flow's claim is live. `None` when
/// `shutdown` fired first.
pub async fn hold(
    ctx: &Arc<Context>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Keeper>> {
    let topic = positions_topic(ctx.flow.source_alias());
    let reach = Reachability::new(&ctx.clusters.target, "claim");
    let rf = ctx.flow.spec.source_loop.replication_factor;
    if !super::kafka_io::ensure_compacted_topic(
        &ctx.flow.target_client,
        &topic,
        rf,
        &reach,
        shutdown,
    )
    .await?
    {
        return Ok(None);
    }
    let mut keeper = Keeper::new(ctx.clone())?;
    let mut backoff = super::backoff::Backoff::new(Duration::from_millis(500), RENEW_EVERY);
    loop {
        let wait = match renew(keeper).await {
            Ok((k, None)) => {
                ctx.metrics.writer_yielding.set(0);
                return Ok(Some(k));
            }
            Ok((k, Some(older))) => {
                keeper = k;
                if ctx.metrics.writer_yielding.get() == 0 {
                    tracing::warn!(other = %older.writer.flow, topic = %topic,
                        "an older flow writes this flow's internal topics; copying nothing until it stops");
                }
                ctx.metrics.writer_yielding.set(1);
                WAITING_CHECK_EVERY
            }
            Err(e) => {
                // The keeper went with the failed call: make a new one.
                reach.refused("claiming the positions topic (retrying)", &format!("{e:#}"));
                keeper = Keeper::new(ctx.clone())?;
                backoff.next_delay()
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Renews the claim until `shutdown` fires (then releases it once `loops_done` fires), or
/// stops the replicator with an error when an older flow's claim shows up.
pub async fn keep(
    mut keeper: Keeper,
    shutdown: CancellationToken,
    loops_done: CancellationToken,
) -> anyhow::Result<()> {
    let ctx = keeper.ctx.clone();
    let reach = Reachability::new(&ctx.clusters.target, "claim");
    loop {
        tokio::select! {
            () = shutdown.cancelled() => {
                loops_done.cancelled().await;
                tokio::task::spawn_blocking(move || keeper.release()).await?;
                return Ok(());
            }
            () = tokio::time::sleep(RENEW_EVERY) => {}
        }
        match renew(keeper).await {
            Ok((k, None)) => keeper = k,
            Ok((_, Some(older))) => {
                ctx.metrics.writer_yielding.set(1);
                shutdown.cancel();
                anyhow::bail!(
                    "{}",
                    writers::yield_message(&older, ctx.flow.source_alias())
                );
            }
            Err(e) => {
                // A target that cannot be written lets the claim lapse, but then this
                // replicator's own writes do not land either.
                reach.refused("renewing the flow's claim (retrying)", &format!("{e:#}"));
                keeper = Keeper::new(ctx.clone())?;
            }
        }
    }
}
