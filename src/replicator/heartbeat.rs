//! The heartbeat loop, as MM2 runs it in dedicated mode.
//!
//! Every `spec.heartbeats.interval`:
//! - `Heartbeat(source, target, now)` into `heartbeats` on the target, as the A->B heartbeat
//!   connector does;
//! - `Heartbeat(target, source, now)` into `heartbeats` on the source: MM2's reverse emitter
//!   (the B->A herder's heartbeat connector, which dedicated mode runs even when B->A
//!   replication is off). The source loop replicates the source's `heartbeats` as
//!   `<source>.heartbeats` to the target, which lets `MirrorClient.upstreamClusters()` see the
//!   flow and makes end-to-end lag observable.
//!
//! Lag: the loop follows `<source>.heartbeats` on the target and sets `heartbeat_lag` to
//! now minus the newest timestamp of the reverse emitter's heartbeats found there (key
//! `(target, source)`), so it grows when replication stalls. It stays unset until the first
//! one arrives, rather than claim zero lag for a path that never worked.
//! Both `heartbeats` topics are created as MM2 creates them: 1 partition, compacted.

use super::health::heartbeat_write_timeout;
use crate::clock::now_ms;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::Offset;
use rdkafka::message::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::context::Context;
use super::kafka_io::{
    AckedProducer, Reachability, assign_only_consumer, ensure_compacted_topic, follow_partition,
};
use crate::mm2::Heartbeat;

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let flow = &ctx.flow;
    let topic = flow.policy.heartbeats_topic().to_owned();
    let interval = flow.spec.heartbeats.interval.as_duration();
    let rf = flow.spec.source_loop.replication_factor;
    let source_reach = Reachability::new(&ctx.clusters.source, "heartbeat");
    let target_reach = Reachability::new(&ctx.clusters.target, "heartbeat");
    for (client, reach) in [
        (&flow.target_client, &target_reach),
        (&flow.source_client, &source_reach),
    ] {
        if !ensure_compacted_topic(client, &topic, rf, reach, &shutdown).await? {
            return Ok(());
        }
    }
    let emitters = emitters(&ctx, interval, (&source_reach, &target_reach))?;
    let readers = shutdown.child_token();
    let _stop_readers = readers.clone().drop_guard();
    let mut newest = follow_replicated(&ctx, &topic, &target_reach, readers)?;

    let mut newest_ms: Option<i64> = None;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            ts = newest.recv() => {
                if let Some(ts) = ts {
                    newest_ms = newest_ms.max(Some(ts));
                    set_lag(&ctx, newest_ms);
                }
            }
            _ = tick.tick() => {
                ctx.readiness.turned(crate::replicator::health::Loop::Heartbeat);
                set_lag(&ctx, newest_ms);
                let now = now_ms();
                // Both at once: an unreachable source must not delay the target's heartbeat.
                let (to_target, to_source) = tokio::join!(
                    emitters[0].emit(now, &topic),
                    emitters[1].emit(now, &topic),
                );
                for ok in [to_target, to_source] {
                    if ok {
                        ctx.metrics.heartbeats_emitted.inc();
                    }
                }
                if to_target && !ctx.readiness.heartbeat.swap(true, Ordering::Relaxed) {
                    tracing::info!(topic = %topic, "first heartbeat acknowledged by the target");
                }
            }
        }
    }
}

/// The two emitters: heartbeats to the target (this flow's direction) and to the source (the
/// reverse one, as MirrorMaker 2 writes them), each acknowledged within
/// [`heartbeat_write_timeout`] of `interval`.
fn emitters(
    ctx: &Context,
    interval: Duration,
    (source_reach, target_reach): (&Arc<Reachability>, &Arc<Reachability>),
) -> anyhow::Result<[Emitter; 2]> {
    let flow = &ctx.flow;
    let (source, target) = (flow.source_alias(), flow.target_alias());
    let timeout = heartbeat_write_timeout(interval);
    let producer = |client: &rdkafka::ClientConfig| -> anyhow::Result<AckedProducer> {
        Ok(AckedProducer::new(
            client
                .clone()
                .set("acks", "all")
                .set("linger.ms", "0")
                .set("message.timeout.ms", timeout.as_millis().to_string()),
        )?)
    };
    Ok([
        Emitter {
            producer: producer(&flow.target_client)?,
            heartbeat_source: source.to_owned(),
            heartbeat_target: target.to_owned(),
            reach: target_reach.clone(),
        },
        Emitter {
            producer: producer(&flow.source_client)?,
            heartbeat_source: target.to_owned(),
            heartbeat_target: source.to_owned(),
            reach: source_reach.clone(),
        },
    ])
}

/// Follows the source's heartbeats as replicated to the target (`<source alias>.<topic>`):
/// the timestamps of those this flow's direction wrote, newest few first, until `readers` is
/// cancelled.
fn follow_replicated(
    ctx: &Context,
    topic: &str,
    target_reach: &Arc<Reachability>,
    readers: CancellationToken,
) -> anyhow::Result<mpsc::Receiver<i64>> {
    let flow = &ctx.flow;
    let (source, target) = (flow.source_alias(), flow.target_alias());
    let (tx, newest) = mpsc::channel::<i64>(64);
    let (want_source, want_target) = (target.to_owned(), source.to_owned());
    follow_partition(
        "the replicated heartbeats",
        assign_only_consumer(&flow.target_client)?,
        flow.policy.format_remote_topic(source, topic),
        // The newest few are enough to know the lag now.
        Offset::OffsetTail(8),
        target_reach.clone(),
        tx,
        None,
        None,
        move |m| {
            let hb = Heartbeat::decode(m.key()?, m.payload()?).ok()?;
            (hb.source_alias == want_source && hb.target_alias == want_target)
                .then_some(hb.timestamp_ms)
        },
        readers,
    );
    Ok(newest)
}

struct Emitter {
    producer: AckedProducer,
    heartbeat_source: String,
    heartbeat_target: String,
    reach: Arc<Reachability>,
}

impl Emitter {
    /// Writes one heartbeat and waits for its acknowledgement.
    async fn emit(&self, now_ms: i64, topic: &str) -> bool {
        let heartbeat = Heartbeat {
            source_alias: self.heartbeat_source.clone(),
            target_alias: self.heartbeat_target.clone(),
            timestamp_ms: now_ms,
        };
        let record = match heartbeat.encode() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode a heartbeat");
                return false;
            }
        };
        let sent = match self
            .producer
            .send(topic, &record.key, Some(&record.value), Some(now_ms))
        {
            Ok(acked) => self.producer.acknowledged(acked).await,
            Err(e) => Err(e),
        };
        match sent {
            Ok(_) => {
                self.reach.ok();
                true
            }
            Err(e) => {
                self.reach.failed("writing a heartbeat", &e);
                false
            }
        }
    }
}

fn set_lag(ctx: &Context, newest_ms: Option<i64>) {
    if let Some(ts) = newest_ms {
        let lag_ms = (now_ms() - ts).max(0);
        ctx.metrics.heartbeat_lag.set(lag_ms as f64 / 1000.0);
    }
}
