//! What the source loop starts, and how it ends: the internal topics ensured, the fetch
//! planned from the round trip to the source, one copy loop per consumer of the plan (each with
//! its delivery policy and clients), and the discovery loop that feeds them their topics. The
//! first of them to end ends the rest.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::ClientConfig;
use rdkafka::producer::BaseProducer;
use tokio_util::sync::CancellationToken;

use super::discovery::Discovery;
use super::engine;
use super::engine::delivery::Delivery;
use super::engine::send::AckContext;
use super::engine::shared::{self, Shared};
use super::engine::subscription::{Subscription, Subscriptions};
use super::engine::workers::Worker;
use super::limits::{self, RemoteLimits};
use super::policies::aligned::{self, Aligned};
use super::policies::at_least_once::{self, AtLeastOnce};
use super::policies::batches;
use super::policies::exactly_once::ExactlyOnce;
use super::refused::{self, RefusalRecorder};
use super::{CopyMode, clients, offset_syncs_topic, source_group_id};
use crate::flow::Flow;
use crate::kafka::admin::{Admin, AdminError};
use crate::kafka::positions::{self, PositionReader};
use crate::replicator::backoff::Backoff;
use crate::replicator::context::Context;
use crate::replicator::reach::{Reachability, Side};
use crate::replicator::stops::{self, Stops};

const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How long a batch fetch waits at the leader for records (a consumer's `fetch.max.wait.ms`).
const BATCH_FETCH_WAIT: Duration = Duration::from_millis(100);
/// Produce requests outstanding per target leader (librdkafka's `max.in.flight` for an
/// idempotent producer).
const BATCH_WRITES_IN_FLIGHT: usize = 5;

/// Both clusters' health as the source loop sees it.
struct Health {
    source: Arc<Reachability>,
    target: Arc<Reachability>,
}

impl Health {
    fn of(&self, side: Side) -> &Arc<Reachability> {
        match side {
            Side::Source => &self.source,
            Side::Target => &self.target,
        }
    }
}

/// What every copy loop of the replica is made from.
struct Plan<'a> {
    ctx: &'a Arc<Context>,
    mode: CopyMode,
    health: &'a Health,
    positions_topic: String,
    syncs: (Side, String),
    fetch: clients::SourceFetch,
    source_consumer: ClientConfig,
    producer_config: ClientConfig,
    target_admin: &'a Admin,
    limits: RemoteLimits,
    stops: Stops,
    shutdown: &'a CancellationToken,
}

/// Runs the source loop until `shutdown` or until one of its parts fails.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let flow = &ctx.flow;
    let health = Health {
        source: Reachability::new(&ctx.clusters.source, "source"),
        target: Reachability::new(&ctx.clusters.target, "source"),
    };
    let source_admin = Admin::new(Side::Source, &flow.source_client)?;
    let target_admin = Admin::new(Side::Target, &flow.target_client)?;
    let positions_topic = positions::positions_topic(flow.source_alias());
    let syncs = offset_syncs_topic(flow);
    let admins = (&source_admin, &target_admin);
    if !ensure_internal_topics(&ctx, admins, &health, &positions_topic, &syncs, &shutdown).await {
        return Ok(());
    }
    let fetch = plan_fetch(&ctx).await;
    let group = source_group_id(flow);
    let refresh = flow.spec.source_loop.topics_refresh_interval.as_duration();
    let mode = CopyMode::of(flow);
    let mut source_consumer = clients::consumer(&flow.source_client, &group, refresh, fetch.window);
    if mode == CopyMode::Aligned {
        // Only visible records are read: everything else is a jump the policy fills.
        source_consumer.set("isolation.level", "read_committed");
    }
    announce(mode, &group, syncs.0)?;
    let plan = Plan {
        ctx: &ctx,
        mode,
        health: &health,
        positions_topic,
        syncs,
        fetch,
        source_consumer,
        producer_config: clients::producer(&flow.target_client, refresh),
        target_admin: &target_admin,
        limits: RemoteLimits::default(),
        stops: ctx.clusters.stops.clone(),
        shutdown: &shutdown,
    };
    // One read serves the recorder (the refusals a previous run left, so those fixed meanwhile
    // get their tombstone) and the first copy loop, whose resume goes on from where it stopped.
    let (positions, previous_refusals) = refused::read_previous(plan.positions_reader()?).await?;
    let recorder = RefusalRecorder::new(
        &flow.target_client,
        &plan.positions_topic,
        previous_refusals,
    )
    .context("creating the refusal recorder")?;
    let (subscribe, subscriptions) = tokio::sync::watch::channel(None);
    let mut loops = plan.start_copy_loops(positions, &subscriptions)?;
    let discovery = Discovery::new(
        flow.clone(),
        source_admin.clone(),
        target_admin.clone(),
        plan.limits.clone(),
        ctx.metrics.clone(),
    );
    let discover = discover(&plan, discovery, recorder, subscribe);
    let first = tokio::select! {
        joined = loops.join_next() => joined,
        () = discover => loops.join_next().await,
    };
    // Whatever ended first, the rest has no reason to go on.
    shutdown.cancel();
    let mut result = copy_outcome(first);
    while let Some(joined) = loops.join_next().await {
        result = result.and(copy_outcome(Some(joined)));
    }
    result?;
    tracing::info!("source loop stopped");
    Ok(())
}

impl Plan<'_> {
    /// Starts a copy loop per consumer of the fetch plan, each following discovery's
    /// `subscriptions`; the first resumes from `positions` (read already), the others read
    /// their own.
    fn start_copy_loops(
        &self,
        positions: PositionReader,
        subscriptions: &Subscriptions,
    ) -> anyhow::Result<engine::Loops> {
        let mut loops = engine::Loops::new();
        let mut first_positions = Some(positions);
        for worker in Worker::crew(self.fetch.consumers) {
            let positions = match first_positions.take() {
                Some(read) => read,
                None => self.positions_reader()?,
            };
            let copy = engine::CopyLoop {
                subscriptions: subscriptions.clone(),
                ctx: self.ctx.clone(),
                shutdown: self.shutdown.clone(),
            };
            self.start_copy_loop(worker, positions, copy, &mut loops)?;
        }
        Ok(loops)
    }
}

/// Creates the positions topic (target) and the offset-syncs topic (where the flow keeps it)
/// unless they exist, retrying with backoff; false when shutdown came first.
async fn ensure_internal_topics(
    ctx: &Context,
    (source_admin, target_admin): (&Admin, &Admin),
    health: &Health,
    positions_topic: &str,
    (syncs_cluster, syncs_topic): &(Side, String),
    shutdown: &CancellationToken,
) -> bool {
    let replication_factor = ctx.flow.spec.source_loop.replication_factor;
    let mut backoff = Backoff::new(Duration::from_millis(500), MAX_BACKOFF);
    loop {
        let ensured = async {
            target_admin
                .ensure_compacted(positions_topic, replication_factor)
                .await?;
            match syncs_cluster {
                // The source is not ours to tune: its default replication factor.
                Side::Source => source_admin.ensure_compacted(syncs_topic, -1).await,
                Side::Target => {
                    target_admin
                        .ensure_compacted(syncs_topic, replication_factor)
                        .await
                }
            }
        };
        match ensured.await {
            Ok(()) => break,
            Err(e) => {
                note_admin_error(ctx, &e, health.of(e.cluster()));
                if sleep_or_stop(shutdown, backoff.next_delay()).await {
                    return false;
                }
            }
        }
    }
    tracing::info!(positions = %positions_topic, offset_syncs = %syncs_topic, on = %syncs_cluster,
        "internal topics ready");
    true
}

/// How the replica fetches from the source: its consumers and their window, from the measured
/// round trip ([`clients::SourceFetch::plan`]).
async fn plan_fetch(ctx: &Context) -> clients::SourceFetch {
    let source_client = ctx.flow.source_client.clone();
    let round_trip = tokio::task::spawn_blocking(move || clients::round_trip(&source_client))
        .await
        .ok()
        .flatten();
    let fetch = clients::SourceFetch::plan(round_trip, ctx.flow.spec.source_loop.consumers);
    tracing::info!(
        ?round_trip,
        consumers = fetch.consumers,
        fetch_max_bytes = fetch.window.fetch_bytes,
        queued_max_kbytes = fetch.window.queued_kbytes,
        "source fetch plan"
    );
    ctx.metrics
        .source_consumers
        .set(i64::try_from(fetch.consumers).unwrap_or(i64::MAX));
    fetch
}

/// Says in the log which policy copies the flow; refuses what validation should have.
fn announce(mode: CopyMode, group: &str, syncs_cluster: Side) -> anyhow::Result<()> {
    match mode {
        CopyMode::ExactlyOnce => {
            // `flow::validate` refuses exactly-once with syncs on the source.
            anyhow::ensure!(
                syncs_cluster == Side::Target,
                "spec.exactlyOnce needs spec.sourceLoop.offsetSyncsLocation: Target"
            );
            tracing::info!(%group, commit_every = ?ExactlyOnce::COMMIT_EVERY,
                "source loop starting (exactly-once: a transaction per partition)");
        }
        CopyMode::Aligned => tracing::info!(%group, "source loop starting (aligned offsets)"),
        CopyMode::Batches => tracing::info!(%group, "source loop starting (whole record batches)"),
        CopyMode::AtLeastOnce => tracing::info!(%group, "source loop starting"),
    }
    Ok(())
}

impl Plan<'_> {
    fn flow(&self) -> &Flow {
        &self.ctx.flow
    }

    /// A reader of the positions topic; committed records only under exactly-once.
    fn positions_reader(&self) -> anyhow::Result<PositionReader> {
        let flow = self.flow();
        let (topic, group) = (self.positions_topic.clone(), source_group_id(flow));
        if flow.spec.exactly_once {
            PositionReader::read_committed(&flow.target_client, topic, &group)
        } else {
            PositionReader::new(&flow.target_client, topic, &group)
        }
        .context("creating the positions reader")
    }

    /// What every policy of `worker`'s copy loop shares.
    fn shared(&self, worker: Worker, positions: PositionReader) -> anyhow::Result<Shared> {
        let flow = self.flow();
        Ok(Shared {
            sync_config: Shared::sync_config_of(self.ctx),
            started: std::time::Instant::now(),
            ctx: self.ctx.clone(),
            syncs_topic: self.syncs.1.clone(),
            positions_topic: self.positions_topic.clone(),
            positions,
            probe: super::continuity::LogProbe::new(&flow.source_client, &flow.target_client)
                .context("creating the log probe")?,
            shutdown: self.shutdown.clone(),
            source_health: self.health.source.clone(),
            target_health: self.health.target.clone(),
            worker,
            stops: self.stops.clone(),
        })
    }

    /// The records' producer on the target and the offset syncs' where they live, for the
    /// policies that write records outside transactions.
    fn plain_producers(
        &self,
    ) -> anyhow::Result<(BaseProducer<AckContext>, BaseProducer<AckContext>)> {
        let syncs_cluster = self.syncs.0;
        producers(
            self.flow(),
            &self.producer_config,
            (syncs_cluster, self.health.of(syncs_cluster)),
            &self.health.target,
        )
    }

    /// Starts `worker`'s copy loop with the flow's policy, in `loops`.
    fn start_copy_loop(
        &self,
        worker: Worker,
        positions: PositionReader,
        copy: engine::CopyLoop,
        loops: &mut engine::Loops,
    ) -> anyhow::Result<()> {
        let shared = self.shared(worker, positions)?;
        let (consumer, health) = (&self.source_consumer, &self.health.source);
        match self.mode {
            CopyMode::ExactlyOnce => {
                let target_watermarks = clients::watermarks(&self.flow().target_client)
                    .create()
                    .context("creating the target watermark client")?;
                let policy = ExactlyOnce::new(
                    shared,
                    self.producer_config.clone(),
                    self.limits.clone(),
                    target_watermarks,
                );
                engine::spawn(policy, consumer, health, copy, loops);
            }
            CopyMode::Aligned => {
                let policy = self.aligned(shared)?;
                engine::spawn(policy, consumer, health, copy, loops);
            }
            CopyMode::Batches => {
                let (producer, syncs) = self.plain_producers()?;
                let (source, writer) = batch_connections(self.flow(), self.fetch.batch_window)?;
                let policy = batches::Batches::new(batches::Parts {
                    shared,
                    producer,
                    syncs,
                    writer,
                    source,
                    limits: batch_fetch_limits(self.fetch.batch_window),
                    stops: self.stops.clone(),
                    remote_limits: self.limits.clone(),
                })
                .context("starting the batch fetching thread")?;
                engine::spawn(policy, consumer, health, copy, loops);
            }
            CopyMode::AtLeastOnce => {
                let (producer, syncs) = self.plain_producers()?;
                let batch_cap = limits::batch_cap(
                    self.producer_config.get("batch.size"),
                    self.producer_config.get("message.max.bytes"),
                );
                let policy = AtLeastOnce::new(at_least_once::Parts {
                    shared,
                    producer,
                    syncs,
                    limits: self.limits.clone(),
                    batch_cap,
                });
                engine::spawn(policy, consumer, health, copy, loops);
            }
        }
        Ok(())
    }

    /// The aligned policy with its producers and watermark clients.
    fn aligned(&self, shared: Shared) -> anyhow::Result<Aligned> {
        let flow = self.flow();
        let (producer, syncs) = self.plain_producers()?;
        Ok(Aligned::new(aligned::Parts {
            shared,
            producer,
            syncs,
            producer_base: self.producer_config.clone(),
            watermarks: clients::watermarks(&flow.source_client)
                .create()
                .context("creating the source watermark client")?,
            target_watermarks: clients::watermarks(&flow.target_client)
                .create()
                .context("creating the target watermark client")?,
            target_admin: self.target_admin.clone(),
            runtime: tokio::runtime::Handle::current(),
        }))
    }
}

/// The discovery loop: a round every `topicsRefreshInterval` (a backoff after a failure) lists
/// and keeps the remote topics, records what the clusters refused and the stopped partitions
/// for the operator, and hands the copy loops their subscription. Ends on shutdown.
async fn discover(
    plan: &Plan<'_>,
    mut discovery: Discovery,
    mut recorder: RefusalRecorder,
    subscribe: tokio::sync::watch::Sender<Option<Arc<Subscription>>>,
) {
    let ctx = plan.ctx;
    let refresh = ctx
        .flow
        .spec
        .source_loop
        .topics_refresh_interval
        .as_duration();
    let count = |kind: &str| {
        ctx.metrics
            .errors
            .with_label_values(&["source", kind])
            .inc()
    };
    let mut backoff = Backoff::new(Duration::from_millis(500), MAX_BACKOFF);
    loop {
        let wait = match discovery.round().await {
            Ok(round) => {
                ctx.metrics.discovery_rounds.inc();
                plan.health.source.ok();
                plan.health.target.ok();
                for e in &round.refused {
                    count("discovery");
                    tracing::warn!(error = %e, "the cluster refused a topic change; retrying next round");
                }
                let stopped = stops::stops_now(&plan.stops);
                if let Err(e) = recorder.round(&round.refused, stopped).await {
                    count("refusal_record");
                    tracing::warn!(error = %e, "could not record the refused topic changes for the operator; retrying next round");
                }
                let topics = Arc::new(Subscription::new(round.subscription));
                subscribe.send_if_modified(|current| {
                    let changed = current.as_ref() != Some(&topics);
                    if changed {
                        *current = Some(topics.clone());
                    }
                    changed
                });
                backoff.reset();
                refresh
            }
            Err(e) => {
                note_admin_error(ctx, &e, plan.health.of(e.cluster()));
                backoff.next_delay()
            }
        };
        if sleep_or_stop(plan.shutdown, wait).await {
            return;
        }
    }
}

/// The batch copy's source fetch: its own window ([`clients::SourceFetch::batch_window`]).
fn batch_fetch_limits(window: clients::FetchWindow) -> mirrorflow_conn::FetchLimits {
    let bytes = |b: usize| i32::try_from(b).unwrap_or(i32::MAX);
    mirrorflow_conn::FetchLimits {
        max_bytes: bytes(window.fetch_bytes),
        partition_max_bytes: bytes(window.partition_bytes),
        max_wait: BATCH_FETCH_WAIT,
    }
}

/// The batch copy's connections: a source cluster for the fetching thread and the writer on
/// the target, with the flow's TLS and SASL ([`crate::flow::OwnSecurity`]).
fn batch_connections(
    flow: &Flow,
    window: clients::FetchWindow,
) -> anyhow::Result<(
    mirrorflow_conn::Cluster,
    mirrorflow_conn::Writer<batches::prepare::Token>,
)> {
    let security = flow.own_security.clone();
    let options = |frame: usize| mirrorflow_conn::Options {
        client_id: format!("mirrorflow-{}", flow.name.replace('/', ".")),
        // Longer than a write the target may hold for its replicas.
        timeout: mirrorflow_conn::writer::PRODUCE_TIMEOUT + Duration::from_secs(30),
        max_frame: frame,
        // Replicators run in the flow's namespace; their egress is the NetworkPolicy's.
        address_check: None,
    };
    // A fetch answer is at most its `max_bytes` plus one batch past it; writes answer small.
    let fetch_frame = window.fetch_bytes.saturating_mul(2).max(16 << 20);
    let source = mirrorflow_conn::Cluster::new(
        &flow.spec.source.bootstrap_servers,
        security.source,
        options(fetch_frame),
    )
    .context("spec.source.bootstrapServers")?;
    let target = mirrorflow_conn::Cluster::new(
        &flow.spec.target.bootstrap_servers,
        security.target,
        options(1 << 20),
    )
    .context("spec.target.bootstrapServers")?;
    Ok((
        source,
        mirrorflow_conn::Writer::new(target, BATCH_WRITES_IN_FLIGHT),
    ))
}

/// How a copy loop ended, as the source loop's result.
fn copy_outcome(
    joined: Option<Result<Result<(), rdkafka::error::KafkaError>, tokio::task::JoinError>>,
) -> anyhow::Result<()> {
    match joined {
        None => Ok(()),
        Some(joined) => joined
            .context("the copy thread panicked")?
            .context("the source consumer failed"),
    }
}

/// The producers of the policies that write records outside transactions (at-least-once and
/// aligned): the records' producer on the target, and the offset syncs' where they live.
fn producers(
    flow: &Flow,
    producer_config: &ClientConfig,
    (syncs_cluster, syncs_health): (Side, &Arc<Reachability>),
    target_health: &Arc<Reachability>,
) -> anyhow::Result<(BaseProducer<AckContext>, BaseProducer<AckContext>)> {
    let producer = producer_config
        .create_with_context(AckContext::new(target_health.clone()))
        .context("creating the target producer")?;
    let syncs_client = match syncs_cluster {
        Side::Source => &flow.source_client,
        Side::Target => &flow.target_client,
    };
    let syncs = clients::sync_producer(syncs_client)
        .create_with_context(AckContext::new(syncs_health.clone()))
        .context("creating the offset-sync producer")?;
    Ok((producer, syncs))
}

/// An admin request of discovery failed: the cluster is unreachable, or the error is counted.
fn note_admin_error(ctx: &Context, e: &AdminError, health: &Reachability) {
    if e.is_unreachable() {
        health.unreachable("topic discovery", e);
    } else {
        shared::count_error(ctx, "discovery");
        tracing::warn!(error = %e, "topic discovery failed; retrying");
    }
}

/// Sleeps; true when shutdown came first.
async fn sleep_or_stop(shutdown: &CancellationToken, wait: Duration) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(extra: &str) -> Flow {
        crate::flow::test_flow("ns/my flow", extra)
    }

    #[test]
    fn group_id_is_a_valid_kafka_name_derived_from_the_flow() {
        assert_eq!(
            source_group_id(&flow("")),
            "mirrorflow.ns_my_flow.a-b.source"
        );
    }

    #[test]
    fn offset_syncs_go_where_the_spec_says_with_mm2_names() {
        assert_eq!(
            offset_syncs_topic(&flow("")),
            (Side::Source, "mm2-offset-syncs.b.internal".to_string())
        );
        assert_eq!(
            offset_syncs_topic(&flow("sourceLoop: {offsetSyncsLocation: Target}\n")),
            (Side::Target, "mm2-offset-syncs.a.internal".to_string())
        );
    }

    #[test]
    fn the_copy_mode_follows_the_spec_and_exactly_once_wins() {
        assert_eq!(CopyMode::of(&flow("")), CopyMode::Batches);
        let records = flow("sourceLoop: {copy: Records}\n");
        assert_eq!(CopyMode::of(&records), CopyMode::AtLeastOnce);
        assert_eq!(CopyMode::of(&flow("offsets: Aligned\n")), CopyMode::Aligned);
        assert_eq!(
            CopyMode::of(&flow(
                "exactlyOnce: true\nsourceLoop: {offsetSyncsLocation: Target}\n"
            )),
            CopyMode::ExactlyOnce
        );
        // The CRD refuses both; a flow that has them anyway copies exactly once.
        let mut both = flow("offsets: Aligned\n");
        both.spec.exactly_once = true;
        assert_eq!(CopyMode::of(&both), CopyMode::ExactlyOnce);
    }
}
