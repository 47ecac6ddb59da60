//! What feeds the checkpoint loop its events: followers of the checkpoints, offset-syncs and
//! positions topics, the groups' commits, share groups' start offsets and the verifier thread.

use rdkafka::Offset;
use rdkafka::message::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::events::Event;
use super::{commits, share_groups, verify};
use crate::api::OffsetSyncsLocation;
use crate::kafka::checkpoints::Exactness;
use crate::mm2::{Checkpoint, TopicPartition};
use crate::replicator::context::Context;
use crate::replicator::kafka_io::{EndMarks, Reachability, assign_only_consumer, follow_partition};

/// A cluster's reachability, shared by the followers of its topics.
type Reach = std::sync::Arc<Reachability>;

/// Starts everything that feeds the loop `events`, each stopping with `readers`: the
/// checkpoints, offset-syncs and positions topics' followers, the groups' commits and the
/// verifier thread (returned; `None` when verification is off).
pub(super) fn start(
    ctx: &Context,
    checkpoints_topic: &str,
    mark_requests: std::sync::mpsc::Receiver<u64>,
    events: mpsc::Sender<Event>,
    readers: &CancellationToken,
) -> anyhow::Result<Option<verify::Verifier>> {
    let flow = &ctx.flow;
    let spec = &flow.spec;
    let source_reach = Reachability::new(&ctx.clusters.source, "checkpoint");
    let target_reach = Reachability::new(&ctx.clusters.target, "checkpoint");
    let follower = Follower {
        events: &events,
        readers,
    };
    follower.checkpoints(ctx, checkpoints_topic, mark_requests, &target_reach)?;
    follower.offset_syncs(ctx, (&source_reach, &target_reach))?;
    follower.positions(ctx, target_reach)?;
    commits::follow(
        &flow.source_client,
        // The aliases too, as in the source loop's group: two standalone flows whose files
        // have the same name must not split each other's `__consumer_offsets` partitions.
        &format!(
            "mirrorflow.{}.{}-{}.checkpoints",
            flow.name,
            flow.source_alias(),
            flow.target_alias()
        ),
        flow.groups.clone(),
        source_reach,
        ctx.metrics.clone(),
        events.clone(),
        readers.clone(),
    )?;
    share_groups::Poller::spawn_for(ctx, events.clone(), readers.clone());
    if spec.checkpoints.verify_interval.as_duration().is_zero() {
        tracing::info!("checkpoint verification is off (spec.checkpoints.verifyInterval: 0s)");
        return Ok(None);
    }
    // The verifier reports through the loop's channel without knowing its events.
    let report = move |verified| {
        events
            .blocking_send(Event::Verified(Box::new(verified)))
            .is_ok()
    };
    Ok(verify::spawn(flow, Box::new(report)))
}

/// Where the topic followers send their events, and when they stop.
struct Follower<'a> {
    events: &'a mpsc::Sender<Event>,
    readers: &'a CancellationToken,
}

impl Follower<'_> {
    /// The checkpoints topic, from its beginning: every checkpoint written, by this replica or
    /// another, and the marks the loop waits for before it writes.
    fn checkpoints(
        &self,
        ctx: &Context,
        topic: &str,
        mark_requests: std::sync::mpsc::Receiver<u64>,
        target_reach: &Reach,
    ) -> anyhow::Result<()> {
        follow_partition(
            "the checkpoints topic",
            assign_only_consumer(&ctx.flow.target_client)?,
            topic.to_string(),
            Offset::Beginning,
            target_reach.clone(),
            self.events.clone(),
            Some(Event::CheckpointsLoaded),
            Some(EndMarks {
                requests: mark_requests,
                reached: Event::CheckpointsMark,
            }),
            |m| {
                let cp = Checkpoint::decode(m.key()?, m.payload()?).ok()?;
                Some(Event::CheckpointRead(
                    cp,
                    m.timestamp().to_millis(),
                    Exactness::of_record(m),
                ))
            },
            self.readers.clone(),
        );
        Ok(())
    }

    /// The offset-syncs topic on the side the flow writes it to; a record that is no sync is
    /// counted.
    fn offset_syncs(
        &self,
        ctx: &Context,
        (source_reach, target_reach): (&Reach, &Reach),
    ) -> anyhow::Result<()> {
        let flow = &ctx.flow;
        let (client, topic, reach) = match flow.spec.source_loop.offset_syncs_location {
            OffsetSyncsLocation::Source => (
                &flow.source_client,
                flow.policy.offset_syncs_topic(flow.target_alias()),
                source_reach,
            ),
            OffsetSyncsLocation::Target => (
                &flow.target_client,
                flow.policy.offset_syncs_topic(flow.source_alias()),
                target_reach,
            ),
        };
        let sync_errors = ctx
            .metrics
            .errors
            .with_label_values(&["checkpoint", "bad_sync"]);
        follow_partition(
            "the offset-syncs topic",
            assign_only_consumer(client)?,
            topic,
            Offset::Beginning,
            reach.clone(),
            self.events.clone(),
            Some(Event::SyncsLoaded),
            None,
            move |m| {
                let Some((sync, origin)) = crate::kafka::checkpoints::offset_sync(m) else {
                    sync_errors.inc();
                    return None;
                };
                Some(Event::Sync(sync, origin, m.timestamp().to_millis()))
            },
            self.readers.clone(),
        );
        Ok(())
    }

    /// The positions topic's `TargetRewound` gaps: remote partitions recreated. Not waited
    /// for (`loaded: None`): a gap only ever makes checkpoints be written, and flows whose
    /// records another replicator copies have no positions topic.
    fn positions(&self, ctx: &Context, target_reach: Reach) -> anyhow::Result<()> {
        use crate::kafka::positions::{Gap, GapKind, positions_topic};
        follow_partition(
            "the positions topic",
            assign_only_consumer(&ctx.flow.target_client)?,
            positions_topic(ctx.flow.source_alias()),
            Offset::Beginning,
            target_reach,
            self.events.clone(),
            None,
            None,
            |m| {
                let gap = Gap::decode(m.key()?, m.payload()?)?;
                (gap.kind == GapKind::TargetRewound).then(|| Event::TargetRecreated {
                    tp: TopicPartition::new(gap.topic, gap.partition),
                    detected_ms: gap.detected_ms,
                })
            },
            self.readers.clone(),
        );
        Ok(())
    }
}
