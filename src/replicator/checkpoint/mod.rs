//! The checkpoint loop: source group offsets, translated through offset syncs, written as MM2
//! checkpoints to `<source alias>.checkpoints.internal` on the target.
//!
//! # Following commits instead of polling them
//! MM2 lists every group's offsets every 60 s. Here a consumer group
//! (`mirrorflow.<flow>.<source>-<target>.checkpoints`) follows the source's `__consumer_offsets` with
//! `read_committed` ([`commits`]), so a commit reaches the loop within about one fetch wait
//! (100 ms) and costs nothing while a group is idle, however many groups there are. Because a
//! group's commits always land in one `__consumer_offsets` partition, the group protocol's
//! partition assignment splits the groups across replicas without coordination of our own;
//! on every assignment the partitions are re-read from the beginning (compacted: about one
//! record per committed partition) and nothing is evaluated until they are caught up, so
//! replayed history never produces a checkpoint. The costs: the flow needs read access to
//! `__consumer_offsets`, and a rebalance re-reads it.
//!
//! # Translation
//! Every replica follows the whole offset-syncs topic into an [`OffsetSyncStore`] (syncs that
//! carry [`crate::mm2::SYNC_ORIGIN_HEADER`] are [`SyncOrigin::Dense`] and translate exactly; MM2's are
//! sparse and translate conservatively). A new sync re-evaluates every owned group committed
//! on that partition, so a checkpoint becomes exact as soon as the sync that covers it lands.
//!
//! # Emission
//! MM2's monotonic rule ([`CheckpointTracker`]): first checkpoint, group rewound upstream, or
//! downstream advanced. The tracker is rebuilt from the checkpoints topic before anything is
//! written, and keeps following it for the groups other replicas own, so a restart or a
//! group moving between replicas stays monotonic. After every assignment nothing is written
//! until the follower has read the topic up to its end as of the assignment (a mark), and
//! what it reads meanwhile may advance the tracker even for the groups this replica owns:
//! their previous owner may have written after this replica last looked (a replica frozen
//! past its session timeout comes back owning groups others checkpointed meanwhile, with
//! offset syncs that lag theirs; without this it wrote checkpoints thousands of records
//! behind theirs, found by the chaos test). A checkpoint counts as written once the
//! target acknowledged it; a failed write is retried with backoff.
//!
//! Each checkpoint says in a header whether its translation was exact ([`exactness`]): the
//! offsets of a conservative one look the same as an exact one's, and the operator's probe
//! must not call a group ready to fail over without re-reading when it would re-read.
//!
//! Share groups keep their position as start offsets, not commits; [`share_groups`] reads them
//! and hands them to the loop as commits.
//!
//! Group offset sync into the target is optional and lives in [`group_sync`]; its per-group
//! state and reason in [`sync_state`].
//!
//! The checkpoints written are verified on the records themselves, sampled ([`verify`]); the
//! outcome is written on the checkpoint record it is about ([`crate::verify::header`]).

mod commits;
mod core;
pub mod events;
mod exactness;
mod fault;
mod freeze;
pub mod group_sync;
mod readers;
mod recreated;
pub mod share_groups;
mod shell;
pub mod state;
pub mod sync_state;
pub mod verify;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::core::Core;
use self::events::Event;
use self::state::Naming;
use crate::mm2::Filters;
use crate::replicator::backoff::Backoff;
use crate::replicator::context::Context;
use crate::replicator::kafka_io;
use crate::replicator::kafka_io::{AckedProducer, Reachability};

const EVENT_BUFFER: usize = 4096;

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let flow = &ctx.flow;
    let spec = &flow.spec;
    let target_reach = Reachability::new(&ctx.clusters.target, "checkpoint");
    let checkpoints_topic = flow.policy.checkpoints_topic(flow.source_alias());
    let rf = spec.source_loop.replication_factor;
    if !kafka_io::ensure_compacted_topic(
        &flow.target_client,
        &checkpoints_topic,
        rf,
        &target_reach,
        &shutdown,
    )
    .await?
    {
        return Ok(());
    }

    // Readers stop with this token, also when the loop ends on an error.
    let readers = shutdown.child_token();
    let _stop_readers = readers.clone().drop_guard();
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let (mark_sender, mark_requests) = std::sync::mpsc::channel();
    let verifier = readers::start(&ctx, &checkpoints_topic, mark_requests, tx, &readers)?;
    let group_views = if spec.checkpoints.sync_group_offsets {
        let (views_tx, views_rx) = mpsc::channel(EVENT_BUFFER);
        tokio::spawn(group_sync::run(
            flow.target_client.clone(),
            group_sync::ShareTarget::of(flow),
            spec.checkpoints.interval.as_duration(),
            spec.checkpoints.groups_refresh_interval.as_duration(),
            target_reach.clone(),
            views_rx,
            readers.clone(),
        ));
        Some(views_tx)
    } else {
        tracing::info!("group offset sync is disabled (spec.checkpoints.syncGroupOffsets)");
        None
    };

    let filters = Filters {
        topics: flow.topics.clone(),
        groups: flow.groups.clone(),
    };
    let deadline = freeze::write_deadline(&flow.source_client);
    let mut shell = shell::Shell {
        ctx: ctx.clone(),
        topic: checkpoints_topic,
        producer: checkpoints_producer(flow, deadline)?,
        target_reach,
        group_views,
        core: Core::new(Naming {
            policy: flow.policy.as_ref(),
            filters: &filters,
            source_alias: flow.source_alias(),
            target_alias: flow.target_alias(),
        })
        .with_write_deadline(deadline),
        verification: verifier.map(|v| {
            let period = spec.checkpoints.verify_interval.as_duration();
            shell::Verification::new(
                v,
                verify::sampler::Sampler::new(
                    period,
                    verify::per_replica(spec.replicas),
                    std::time::Instant::now(),
                )
                .with_byte_budget(verify::bytes_per_replica(spec.replicas)),
                period,
            )
        }),
    };
    shell.core.marks = Some(mark_sender);
    turns(&mut shell, rx, &shutdown).await
}

/// The producer of checkpoints on the target; a write fails after `deadline`.
fn checkpoints_producer(
    flow: &crate::flow::Flow,
    deadline: Duration,
) -> anyhow::Result<AckedProducer> {
    Ok(AckedProducer::new(
        flow.target_client
            .clone()
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            // A write to an unreachable target fails (and is retried with backoff) well before
            // liveness would call the loop wedged (librdkafka's default waits 300 s), and
            // before a frozen replica's groups can have moved ([`freeze::write_deadline`]).
            .set("message.timeout.ms", deadline.as_millis().to_string()),
    )?)
}

/// The loop's turns until `shutdown`: each event read (with what is already queued behind
/// it) or tick handled, then what is dirty flushed, a failed flush retried with backoff.
async fn turns(
    shell: &mut shell::Shell<'_>,
    mut rx: mpsc::Receiver<Event>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut write_backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut last_turn = std::time::Instant::now();
    loop {
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            event = rx.recv() => {
                let Some(event) = event else {
                    anyhow::bail!("the checkpoint loop's readers stopped");
                };
                shell.core.resumed_after(last_turn.elapsed());
                shell.core.handle(event);
                // Drain what is already queued so one flush covers a burst (bounded, so
                // shutdown and ticks still get their turn during a long initial read).
                for _ in 0..EVENT_BUFFER {
                    match rx.try_recv() {
                        Ok(event) => shell.core.handle(event),
                        Err(_) => break,
                    }
                }
                shell.drop_forgotten();
                shell.write_verified().await;
            }
            _ = retry => retry_at = None,
            _ = tick.tick() => {
                shell.core.resumed_after(last_turn.elapsed());
                shell.tick();
            }
        }
        if retry_at.is_none() && !shell.core.dirty.is_empty() {
            if shell.flush().await {
                write_backoff.reset();
            } else {
                retry_at = Some(tokio::time::Instant::now() + write_backoff.next_delay());
            }
        }
        last_turn = std::time::Instant::now();
    }
    Ok(())
}

#[cfg(test)]
mod tests;
