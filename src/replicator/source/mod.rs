//! The source loop: discovers topics, keeps remote topics in line, copies records, writes
//! offset syncs and stores source positions.
//!
//! | part | module |
//! |---|---|
//! | which topics, what the target needs (pure) | [`topics`] |
//! | listing, creating, growing, config sync (I/O) | [`discovery`] |
//! | what the clusters refused, recorded for the operator | [`refused`] |
//! | topic ACL sync (I/O; the pure part is [`crate::kafka::acls`]) | [`acl_sync`] |
//! | the copy engine: run loop, slot table, sending, one producer context | [`engine`] |
//! | delivery policies: what is committed and how | [`policies`]: [`policies::at_least_once`], [`policies::exactly_once`], [`policies::aligned`], [`policies::batches`] |
//! | what may be committed per partition (pure) | [`progress`] |
//! | positions topic format and reader | [`crate::kafka::positions`] |
//! | client settings | [`clients`] |
//!
//! # Work split between replicas: a consumer group on the source
//! Every replica of a flow joins the group [`source_group_id`] with the cooperative-sticky
//! assignor, so the group protocol guarantees a partition has one owner at a time and scaling
//! moves only the partitions that change owner. Offsets are never committed to the source:
//! the group is used for assignment only. Before letting go of a partition (revocation,
//! shutdown) a replica waits for its writes and stores its position on the target; the next
//! owner reads the positions topic to its end before starting, so a graceful move neither
//! repeats nor skips records. A crash (or a lost assignment) repeats the records since the
//! last stored position (at most about one second's worth plus what was in flight).
//!
//! # Offset syncs
//! Written in MM2's format to [`crate::mm2::ReplicationPolicy::offset_syncs_topic`] of the
//! target alias on the source (default) or of the source alias on the target, following the
//! dense [`crate::mm2::SyncPolicy`] fed with every acknowledged (upstream, downstream) pair.
//! A partition that goes idle (no record acknowledged for `offsetSyncInterval`) with records
//! after its last sync gets one more, "tail" sync at its last record
//! ([`crate::mm2::SyncPolicy::idle_sync`]), so groups that consumed up to the end of a burst
//! translate exactly instead of waiting for the next record.
//! Each carries the header [`crate::mm2::SYNC_ORIGIN_HEADER`] = [`crate::mm2::SYNC_ORIGIN_DENSE`];
//! MM2's readers ignore headers. A position never moves past a record whose sync is unacknowledged, and a failed
//! sync rewinds its partition (the records are copied again and get fresh syncs), so no sync
//! is dropped silently.
//!
//! # Exactly-once (`spec.exactlyOnce`)
//! The [`policies::exactly_once`] policy runs on the same engine: a transactional producer per owned
//! partition puts records, offset syncs (on the target) and the position in one transaction,
//! and fences the partition's previous writer.

pub mod acl_sync;
pub mod clients;
pub mod continuity;
pub mod discovery;
pub mod engine;
pub mod limits;
pub mod policies;
pub mod progress;
pub mod refused;
pub mod topics;

use continuity::LogProbe;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::ClientConfig;
use rdkafka::producer::BaseProducer;
use tokio_util::sync::CancellationToken;

use self::discovery::{Admin, AdminError, Discovery};
use self::engine::send::AckContext;
use self::engine::stall;
use self::engine::workers::Worker;
use self::engine::{Delivery, Shared};
use self::policies::aligned::{self, Aligned};
use self::policies::at_least_once::{self, AtLeastOnce};
use self::policies::batches;
use self::policies::exactly_once::ExactlyOnce;
use self::refused::RefusalRecorder;
use super::{Context, Flow};
use crate::api::{CopyUnit, OffsetSyncsLocation, OffsetsMode};
use crate::kafka::positions::{self, PositionReader};
use crate::replicator::backoff::Backoff;
use crate::replicator::reach::{Reachability, Side};

/// The source consumer group of a flow; the checkpoint loop leaves it out.
///
/// The aliases are part of it because a standalone flow's name is its file's name, which
/// two unrelated flows may share (`flow.yaml`).
pub fn source_group_id(flow: &Flow) -> String {
    let name: String = flow
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "mirrorflow.{name}.{}-{}.source",
        flow.source_alias(),
        flow.target_alias()
    )
}

/// The offset-syncs topic and the cluster it lives on.
pub fn offset_syncs_topic(flow: &Flow) -> (Side, String) {
    match flow.spec.source_loop.offset_syncs_location {
        OffsetSyncsLocation::Source => (
            Side::Source,
            flow.policy.offset_syncs_topic(flow.target_alias()),
        ),
        OffsetSyncsLocation::Target => (
            Side::Target,
            flow.policy.offset_syncs_topic(flow.source_alias()),
        ),
    }
}

const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How a flow's records are written: one policy of the copy engine each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyMode {
    AtLeastOnce,
    /// `spec.offsets: Aligned` (exactly-once wins when both are set).
    Aligned,
    ExactlyOnce,
    /// `spec.sourceLoop.copy: Batches` (at least once; validation refuses the other modes).
    Batches,
}

impl CopyMode {
    fn of(flow: &Flow) -> Self {
        if flow.spec.source_loop.copy == CopyUnit::Batches {
            CopyMode::Batches
        } else if flow.spec.exactly_once {
            CopyMode::ExactlyOnce
        } else if flow.spec.offsets == OffsetsMode::Aligned {
            CopyMode::Aligned
        } else {
            CopyMode::AtLeastOnce
        }
    }
}

/// How long a batch fetch waits at the leader for records (a consumer's `fetch.max.wait.ms`).
const BATCH_FETCH_WAIT: Duration = Duration::from_millis(100);
/// Produce requests outstanding per target leader (librdkafka's `max.in.flight` for an
/// idempotent producer).
const BATCH_WRITES_IN_FLIGHT: usize = 5;

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let flow = &ctx.flow;
    let spec = &flow.spec.source_loop;
    let source_health = Reachability::new(&ctx.clusters.source, "source");
    let target_health = Reachability::new(&ctx.clusters.target, "source");
    let source_admin = Admin::new(Side::Source, &flow.source_client)?;
    let target_admin = Admin::new(Side::Target, &flow.target_client)?;
    let health = |cluster: Side| match cluster {
        Side::Source => &source_health,
        Side::Target => &target_health,
    };
    let count = |kind: &str| {
        ctx.metrics
            .errors
            .with_label_values(&["source", kind])
            .inc()
    };

    let positions_topic = positions::positions_topic(flow.source_alias());
    let (syncs_cluster, syncs_topic) = offset_syncs_topic(flow);
    let mut backoff = Backoff::new(Duration::from_millis(500), MAX_BACKOFF);
    loop {
        let ensured = async {
            target_admin
                .ensure_compacted(&positions_topic, spec.replication_factor)
                .await?;
            match syncs_cluster {
                // The source is not ours to tune: its default replication factor.
                Side::Source => source_admin.ensure_compacted(&syncs_topic, -1).await,
                Side::Target => {
                    target_admin
                        .ensure_compacted(&syncs_topic, spec.replication_factor)
                        .await
                }
            }
        };
        match ensured.await {
            Ok(()) => break,
            Err(e) => {
                note_admin_error(&e, health(e.cluster()), &count);
                if sleep_or_stop(&shutdown, backoff.next_delay()).await {
                    return Ok(());
                }
            }
        }
    }
    tracing::info!(positions = %positions_topic, offset_syncs = %syncs_topic, on = %syncs_cluster,
        "internal topics ready");

    let group = source_group_id(flow);
    let refresh = spec.topics_refresh_interval.as_duration();
    let source_client = flow.source_client.clone();
    let round_trip = tokio::task::spawn_blocking(move || clients::round_trip(&source_client))
        .await
        .ok()
        .flatten();
    let fetch = clients::SourceFetch::plan(round_trip, spec.consumers);
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
    let mut source_consumer = clients::consumer(&flow.source_client, &group, refresh, fetch.window);
    let mode = CopyMode::of(flow);
    if mode == CopyMode::Aligned {
        // Only visible records are read: everything else is a jump the policy fills.
        source_consumer.set("isolation.level", "read_committed");
    }
    let (subscribe, subscriptions) = tokio::sync::watch::channel(None);
    let limits = limits::RemoteLimits::default();
    let producer_config = clients::producer(&flow.target_client, refresh);
    let batch_cap = limits::batch_cap(
        producer_config.get("batch.size"),
        producer_config.get("message.max.bytes"),
    );
    let positions_reader = || {
        if flow.spec.exactly_once {
            PositionReader::read_committed(&flow.target_client, positions_topic.clone(), &group)
        } else {
            PositionReader::new(&flow.target_client, positions_topic.clone(), &group)
        }
        .context("creating the positions reader")
    };
    // One read serves the recorder (the refusals a previous run left, so those fixed meanwhile
    // get their tombstone) and the first copy loop, whose resume goes on from where it stopped.
    let (positions, previous_refusals) = refused::read_previous(positions_reader()?).await?;
    let mut recorder =
        RefusalRecorder::new(&flow.target_client, &positions_topic, previous_refusals)
            .context("creating the refusal recorder")?;
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
    let stops = stall::no_stops();
    let mut loops = engine::Loops::new();
    let mut first_positions = Some(positions);
    for worker in Worker::crew(fetch.consumers) {
        let positions = match first_positions.take() {
            Some(read) => read,
            None => positions_reader()?,
        };
        let shared = Shared {
            sync_config: Shared::sync_config_of(&ctx),
            started: std::time::Instant::now(),
            ctx: ctx.clone(),
            syncs_topic: syncs_topic.clone(),
            positions_topic: positions_topic.clone(),
            positions,
            probe: LogProbe::new(&flow.source_client, &flow.target_client)
                .context("creating the log probe")?,
            shutdown: shutdown.clone(),
            source_health: source_health.clone(),
            target_health: target_health.clone(),
            worker,
            stops: stops.clone(),
        };
        let copy = engine::CopyLoop {
            subscriptions: subscriptions.clone(),
            ctx: ctx.clone(),
            shutdown: shutdown.clone(),
        };
        // The at-least-once and aligned policies' idempotent producer and offset-sync producer.
        let plain_producers = || {
            producers(
                flow,
                &producer_config,
                (syncs_cluster, health(syncs_cluster)),
                &target_health,
            )
        };
        match mode {
            CopyMode::ExactlyOnce => {
                let policy = ExactlyOnce::new(shared, producer_config.clone(), limits.clone());
                engine::spawn(policy, &source_consumer, &source_health, copy, &mut loops)?;
            }
            CopyMode::Aligned => {
                let (producer, syncs) = plain_producers()?;
                let policy = Aligned::new(aligned::Parts {
                    shared,
                    producer,
                    syncs,
                    producer_base: producer_config.clone(),
                    watermarks: clients::watermarks(&flow.source_client)
                        .create()
                        .context("creating the source watermark client")?,
                    target_watermarks: clients::watermarks(&flow.target_client)
                        .create()
                        .context("creating the target watermark client")?,
                    target_admin: target_admin.clone(),
                    runtime: tokio::runtime::Handle::current(),
                });
                engine::spawn(policy, &source_consumer, &source_health, copy, &mut loops)?;
            }
            CopyMode::Batches => {
                let (producer, syncs) = plain_producers()?;
                let (source, writer) = batch_connections(flow, fetch.window)?;
                let policy = batches::Batches::new(batches::Parts {
                    shared,
                    producer,
                    syncs,
                    writer,
                    source,
                    limits: batch_fetch_limits(fetch.window),
                    stops: stops.clone(),
                })
                .context("starting the batch fetching thread")?;
                engine::spawn(policy, &source_consumer, &source_health, copy, &mut loops)?;
            }
            CopyMode::AtLeastOnce => {
                let (producer, syncs) = plain_producers()?;
                let policy = AtLeastOnce::new(at_least_once::Parts {
                    shared,
                    producer,
                    syncs,
                    limits: limits.clone(),
                    batch_cap,
                });
                engine::spawn(policy, &source_consumer, &source_health, copy, &mut loops)?;
            }
        }
    }

    let mut discovery = Discovery::new(
        flow.clone(),
        source_admin,
        target_admin,
        limits,
        ctx.metrics.clone(),
    );
    let discover = async {
        let mut backoff = Backoff::new(Duration::from_millis(500), MAX_BACKOFF);
        loop {
            let wait = match discovery.round().await {
                Ok(round) => {
                    ctx.metrics.discovery_rounds.inc();
                    source_health.ok();
                    target_health.ok();
                    for e in &round.refused {
                        count("discovery");
                        tracing::warn!(error = %e, "the cluster refused a topic change; retrying next round");
                    }
                    let stopped = stall::stops_now(&stops);
                    if let Err(e) = recorder.round(&round.refused, stopped).await {
                        count("refusal_record");
                        tracing::warn!(error = %e, "could not record the refused topic changes for the operator; retrying next round");
                    }
                    let topics = Arc::new(round.subscription);
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
                    note_admin_error(&e, health(e.cluster()), &count);
                    backoff.next_delay()
                }
            };
            if sleep_or_stop(&shutdown, wait).await {
                return;
            }
        }
    };
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

/// The batch copy's source fetch: the consumer's window ([`clients::SourceFetch`]).
fn batch_fetch_limits(window: clients::FetchWindow) -> mirrorflow_conn::FetchLimits {
    let bytes = |b: usize| i32::try_from(b).unwrap_or(i32::MAX);
    mirrorflow_conn::FetchLimits {
        max_bytes: bytes(window.fetch_bytes),
        partition_max_bytes: bytes(window.partition_bytes),
        max_wait: BATCH_FETCH_WAIT,
    }
}

/// The batch copy's connections: a source cluster for the fetching thread and the writer on
/// the target, with the flow's TLS and SASL ([`crate::flow::BatchSecurity`]).
fn batch_connections(
    flow: &Flow,
    window: clients::FetchWindow,
) -> anyhow::Result<(
    mirrorflow_conn::Cluster,
    mirrorflow_conn::Writer<batches::Token>,
)> {
    let security = (flow.batch_security.clone())
        .context("spec.sourceLoop.copy: Batches without its connections' security")?;
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
    flow: &crate::replicator::Flow,
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

fn note_admin_error(e: &AdminError, health: &Reachability, count: &impl Fn(&str)) {
    if e.is_unreachable() {
        health.unreachable("topic discovery", e);
    } else {
        count("discovery");
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
        assert_eq!(CopyMode::of(&flow("")), CopyMode::AtLeastOnce);
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
