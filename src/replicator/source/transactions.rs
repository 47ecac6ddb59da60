//! Exactly-once copying (`spec.exactlyOnce: true`): records, offset syncs and the source
//! position of a partition are committed in one producer transaction on the target.
//!
//! # What a transaction holds
//! Per owned source partition and about every [`COMMIT_EVERY`]: the records copied since the
//! last commit, the offset syncs the dense [`SyncPolicy`] asks for (known once the records are
//! acknowledged: the producer is flushed first), and the partition's position (next source
//! offset, target offset of the last record). Consumers of the remote topics, the checkpoint
//! loop (syncs) and the position reader all read `read_committed`, so either all three are
//! visible or none. The syncs are in the transaction only when they live on the target
//! (`sourceLoop.offsetSyncsLocation: Target`): [`crate::flow::validate`] refuses exactly-once
//! otherwise, because a write to the source cluster can never join a target transaction.
//!
//! # Fencing: one transactional id per source partition
//! The id is `mirrorflow.<flow>.<source>-<target>.tx.<topic>-<partition>`
//! ([`transactional_id`]). Whoever copies a partition first calls `init_transactions` with the
//! partition's id, which aborts the previous writer's open transaction and bumps the epoch, so
//! that writer (a replica that lost the partition in a rebalance, a paused process, the old
//! incarnation of a restarted pod) can never commit again; only then does it read the positions
//! topic to its end (waiting for transactions open on it) and start from the stored position.
//! Hence every committed transaction of a partition starts exactly where the previous committed
//! one ended, whoever wrote them, and the consumer group only decides who works (two replicas
//! believing they own a partition fence each other; neither commits a duplicate).
//!
//! Why not one id per replica (the StatefulSet ordinal) and fence the previous owner's id on
//! assignment: a partition moves between replicas, so the previous writer of a partition is not
//! known from the group alone; recording it with the position leaves a window where two
//! claimants both read "owner X", both fence X and both copy (a zombie that missed its session
//! timeout). Kafka's own fencing of a shared id closes it without any protocol of ours. The
//! price is one producer (connections, a thread per broker) per owned partition, the scheme of
//! Kafka Streams' first exactly-once version: fine for tens of partitions per replica, heavy
//! for thousands; the at-least-once mode has no such cost.
//!
//! # Failures
//! A failed record or sync write aborts the partition's transaction and rewinds it to its last
//! committed position. A fatal producer error (fenced: someone else took the partition) drops
//! the producer; the partition is prepared again after a backoff (init, read, seek), which is
//! safe by the argument above, and stops once the group moves the partition away.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use super::continuity::{self, LogProbe};
use super::limits::{self, RemoteLimits};
use super::lock;
use super::reach::ClusterHealth;
use super::rebalance::{self, Owner};
use super::{SYNC_HEADER, SYNC_HEADER_DENSE};
use crate::kafka::positions::{self, Frontier, Gap, PositionReader};
use crate::mm2::{OffsetSync, SyncPolicy, SyncPolicyConfig, TopicPartition};
use crate::replicator::backoff::{Backoff, Retry};
use crate::replicator::{Context, Flow};

/// How often each partition's transaction is committed: the latency of exactly-once copies.
pub const COMMIT_EVERY: Duration = Duration::from_millis(500);
/// The coordinator aborts a transaction open longer than this (a replica that hangs).
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(15);
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const POSITIONS_READ_TIMEOUT: Duration = Duration::from_secs(10);
const IDLE_CHECK_EVERY: Duration = Duration::from_millis(100);
/// How long a fenced partition waits before it is prepared again (see [`TxCopier::end`]).
const FENCED_RETRY: Duration = Duration::from_secs(10);

/// The transactional id of the writer of one source partition (see the module docs).
pub fn transactional_id(flow: &Flow, topic: &str, partition: i32) -> String {
    let group = super::source_group_id(flow);
    let base = group.strip_suffix(".source").unwrap_or(&group);
    format!("{base}.tx.{topic}-{partition}")
}

/// Settings of a partition's transactional producer: the at-least-once producer's, plus the id
/// and timeouts a transaction needs.
/// `limit` is the remote topic's `max.message.bytes`, if known: the partition's producer writes
/// only that topic, so its batches are kept under it (a record larger than `batch.size` still
/// goes, alone in its batch, and a refusal then names it).
pub fn producer_config(
    base: &ClientConfig,
    transactional_id: &str,
    limit: Option<usize>,
) -> ClientConfig {
    let mut c = base.clone();
    if let Some(limit) = limit {
        let cap = limits::batch_cap(c.get("batch.size"), c.get("message.max.bytes"))
            .min(limit.saturating_sub(limits::BATCH_OVERHEAD))
            .max(1);
        c.set("batch.size", cap.to_string());
    }
    let timeout = c
        .get("transaction.timeout.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(TRANSACTION_TIMEOUT.as_millis() as u64);
    c.set("transactional.id", transactional_id)
        .set("transaction.timeout.ms", timeout.to_string())
        // librdkafka requires it not to exceed the transaction timeout.
        .set("message.timeout.ms", timeout.to_string());
    c
}

/// Delivery reports of one partition's producer: (source offset, target offset or error).
pub struct TxContext {
    acks: Mutex<Vec<(i64, Result<i64, KafkaError>)>>,
    health: Arc<ClusterHealth>,
}

impl ClientContext for TxContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.health.unreachable(reason);
        } else {
            tracing::debug!(%error, %reason, "kafka client error");
        }
    }
}

impl ProducerContext for TxContext {
    /// The source offset of a copied record; `usize::MAX` for a sync or position.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let upstream = i64::try_from(opaque).unwrap_or(-1);
        let result = match result {
            Ok(m) => Ok(m.offset()),
            Err((e, _)) => Err(e.clone()),
        };
        lock(&self.acks).push((upstream, result));
    }
}

const NOT_A_RECORD: usize = usize::MAX;
/// How often idle remote partitions are checked for having gone back under the copies.
const TARGET_CHECK_EVERY: Duration = Duration::from_secs(10);

/// How [`absorb`] reports a target partition that went back under the copies.
const TARGET_REWOUND: &str = "the remote partition went back below the copied records";

/// One owned source partition.
struct TxSlot {
    remote: String,
    transactional_id: String,
    producer: Option<BaseProducer<TxContext>>,
    /// Producer initialised, start position read, consumer positioned: records are copied.
    ready: bool,
    retry_at: Instant,
    backoff: Backoff,
    /// The position of the last committed transaction (where a rewind goes).
    committed: Option<Frontier>,
    /// After the newest acknowledged record of the open transaction.
    latest: Option<Frontier>,
    policy: SyncPolicy,
    open: bool,
    records: u64,
    bytes: u64,
    failed: Option<String>,
    /// The target partition went back under the copies: check both logs before going on.
    recheck: bool,
    /// After an aborted transaction: when the partition is copied again from `committed`.
    rewind: Retry,
    /// The limit the producer's batches were capped by ([`producer_config`]).
    capped_by: Option<usize>,
    /// Records of the open transaction that may not fit the limit alone: (offset, bytes).
    large: Vec<(i64, usize)>,
    /// A record the target refused alone: skipped when copied again, recorded as a gap in
    /// the transaction that passes it.
    refused: Option<Refused>,
}

#[derive(Debug, Clone, Copy)]
struct Refused {
    offset: i64,
    bytes: usize,
    limit: Option<usize>,
    /// The open transaction passed it.
    passed: bool,
}

/// What ending a transaction left to do.
enum Ended {
    Committed,
    /// Aborted: copy again from the committed position.
    Rewind,
    /// The producer is unusable (fenced or broken): prepare the partition again.
    Lost,
}

/// The exactly-once copier: what the copy thread mutates.
pub struct TxCopier {
    ctx: Arc<Context>,
    producer_base: ClientConfig,
    syncs_topic: String,
    positions_topic: String,
    positions: PositionReader,
    probe: LogProbe,
    slots: HashMap<String, HashMap<i32, TxSlot>>,
    sync_config: SyncPolicyConfig,
    started: Instant,
    shutdown: CancellationToken,
    source_health: Arc<ClusterHealth>,
    target_health: Arc<ClusterHealth>,
    limits: RemoteLimits,
}

pub struct TxCopierParts {
    pub ctx: Arc<Context>,
    /// The target producer's settings without a transactional id.
    pub producer_base: ClientConfig,
    pub syncs_topic: String,
    pub positions_topic: String,
    pub positions: PositionReader,
    pub probe: LogProbe,
    pub shutdown: CancellationToken,
    pub source_health: Arc<ClusterHealth>,
    pub target_health: Arc<ClusterHealth>,
    pub limits: RemoteLimits,
}

impl Owner for TxCopier {
    fn assigned(&mut self, tpl: &mut TopicPartitionList) {
        TxCopier::assigned(self, tpl);
    }

    fn revoked(&mut self, tpl: &TopicPartitionList, lost: bool) {
        TxCopier::revoked(self, tpl, lost);
    }

    fn owned(&self) -> TopicPartitionList {
        self.all()
    }

    fn count_error(&self, kind: &str) {
        TxCopier::count_error(self, kind);
    }

    const FAILED_REBALANCE_IS_LOST: bool = true;
}

impl TxCopier {
    pub fn new(p: TxCopierParts) -> Self {
        let interval = p
            .ctx
            .flow
            .spec
            .source_loop
            .offset_sync_interval
            .as_duration();
        TxCopier {
            sync_config: SyncPolicyConfig {
                max_interval: Some(interval),
                ..SyncPolicyConfig::default()
            },
            ctx: p.ctx,
            producer_base: p.producer_base,
            syncs_topic: p.syncs_topic,
            positions_topic: p.positions_topic,
            positions: p.positions,
            probe: p.probe,
            slots: HashMap::new(),
            started: Instant::now(),
            shutdown: p.shutdown,
            source_health: p.source_health,
            target_health: p.target_health,
            limits: p.limits,
        }
    }

    fn count_error(&self, kind: &str) {
        self.ctx
            .metrics
            .errors
            .with_label_values(&["source", kind])
            .inc();
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn busy(&self) -> bool {
        self.slots
            .values()
            .flat_map(HashMap::values)
            .any(|s| s.open)
    }

    /// Copies one source record into its partition's open transaction.
    pub fn copy(&mut self, m: &BorrowedMessage<'_>) {
        self.source_health.reachable();
        let Some(slot) = self
            .slots
            .get_mut(m.topic())
            .and_then(|t| t.get_mut(&m.partition()))
        else {
            return;
        };
        if !slot.ready || slot.failed.is_some() || slot.rewind.pending() {
            // Not positioned yet, or the transaction will be aborted and the partition
            // rewound: this record is copied later.
            return;
        }
        let Some(producer) = slot.producer.as_ref() else {
            return;
        };
        if !slot.open {
            if let Err(e) = producer.begin_transaction() {
                // Only a broken producer refuses to begin: replace it (init, read, seek).
                tracing::warn!(topic = %m.topic(), partition = m.partition(), error = %e,
                    "cannot begin a transaction; preparing the partition again");
                slot.producer = None;
                slot.ready = false;
                slot.retry_at = Instant::now() + slot.backoff.next_delay();
                return;
            }
            slot.open = true;
        }
        if let Some(r) = slot.refused.as_mut()
            && r.offset == m.offset()
        {
            // Refused before: this transaction passes it and records the gap (see `end`).
            r.passed = true;
            return;
        }
        let Ok(opaque) = usize::try_from(m.offset()) else {
            return;
        };
        if let Some(limit) = slot.capped_by {
            let wire = limits::message_size(m);
            if wire.saturating_add(limits::BATCH_OVERHEAD) > limit {
                slot.large.push((m.offset(), wire));
            }
        }
        let mut record = BaseRecord::with_opaque_to(&slot.remote, opaque).partition(m.partition());
        let mut bytes = 0;
        if let Some(k) = m.key() {
            bytes += k.len();
            record = record.key(k);
        }
        if let Some(v) = m.payload() {
            bytes += v.len();
            record = record.payload(v);
        }
        if let Some(ts) = m.timestamp().to_millis() {
            record = record.timestamp(ts);
        }
        if let Some(h) = m.headers() {
            record = record.headers(h.detach());
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(20));
                    if self.shutdown.is_cancelled() {
                        slot.failed = Some("shutting down with an unsent record".into());
                        return;
                    }
                }
                Err((e, _)) => {
                    slot.failed = Some(format!("producing to {}: {e}", slot.remote));
                    return;
                }
            }
        }
        slot.records += 1;
        slot.bytes += bytes as u64;
    }

    /// Commits every open transaction; writes tail syncs of idle partitions; prepares
    /// partitions whose producer is not ready.
    pub fn commit_all(&mut self, consumer: &BaseConsumer<TxSourceContext>) {
        let keys = self.keys();
        for (topic, partition) in &keys {
            let open = self
                .slot(topic, *partition)
                .is_some_and(|s| s.ready && s.open);
            if open {
                let ended = self.end(topic, *partition, true);
                self.after(topic, *partition, ended);
            }
        }
        self.rewind_due(consumer);
        self.retry_unready(consumer);
    }

    /// Tail syncs of partitions idle for the sync interval, each in a transaction of its own.
    pub fn idle_syncs(&mut self) {
        let now = self.now();
        let syncs_topic = self.syncs_topic.clone();
        for (topic, partition) in self.keys() {
            let Some(slot) = self.slot_mut(&topic, partition) else {
                continue;
            };
            if !slot.ready || slot.open || slot.policy.records_since_sync() == 0 {
                continue;
            }
            let Some(sync) = slot.policy.idle_sync(now) else {
                continue;
            };
            let Some(producer) = slot.producer.as_ref() else {
                continue;
            };
            if producer.begin_transaction().is_err() {
                continue;
            }
            slot.open = true;
            let written = send_sync(producer, &syncs_topic, &sync);
            if let Err(e) = written {
                slot.failed = Some(e);
            }
            let ended = self.end(&topic, partition, true);
            let config = self.sync_config;
            if !matches!(ended, Ended::Committed)
                && let Some(slot) = self.slot_mut(&topic, partition)
            {
                // Nothing to copy again (the records were committed before); the next record
                // simply gets a fresh first sync.
                slot.policy =
                    SyncPolicy::new(TopicPartition::new(topic.clone(), partition), config);
                if matches!(ended, Ended::Lost) {
                    slot.ready = false;
                }
            }
        }
    }

    fn keys(&self) -> Vec<(String, i32)> {
        self.slots
            .iter()
            .flat_map(|(t, ps)| ps.keys().map(move |p| (t.clone(), *p)))
            .collect()
    }

    fn slot(&self, topic: &str, partition: i32) -> Option<&TxSlot> {
        self.slots.get(topic)?.get(&partition)
    }

    fn slot_mut(&mut self, topic: &str, partition: i32) -> Option<&mut TxSlot> {
        self.slots.get_mut(topic)?.get_mut(&partition)
    }

    /// Ends the open transaction of a partition: commit (after its syncs and position) unless
    /// a write failed or `commit` is false, abort otherwise.
    fn end(&mut self, topic: &str, partition: i32, commit: bool) -> Ended {
        let now = self.now();
        let syncs_topic = self.syncs_topic.clone();
        let positions_topic = self.positions_topic.clone();
        let Some(slot) = self
            .slots
            .get_mut(topic)
            .and_then(|t| t.get_mut(&partition))
        else {
            return Ended::Lost;
        };
        let Some(producer) = slot.producer.as_ref() else {
            return Ended::Lost;
        };
        // Every record's target offset is needed for its offset sync and the position.
        if let Err(e) = producer.flush(CALL_TIMEOUT) {
            slot.failed = Some(format!("flushing records: {e}"));
        }
        let acks = std::mem::take(&mut *lock(&producer.context().acks));
        let delivered = acks.iter().any(|(_, r)| r.is_ok());
        let too_large = acks.iter().find_map(|(upstream, r)| match r {
            Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge))
                if *upstream >= 0 =>
            {
                Some(*upstream)
            }
            _ => None,
        });
        if let Some(offset) = too_large {
            if slot.capped_by.is_some() {
                // Batches are capped under the limit: the refused batch held this record alone.
                let bytes = slot
                    .large
                    .iter()
                    .find(|(o, _)| *o == offset)
                    .map_or(0, |(_, b)| *b);
                slot.refused = Some(Refused {
                    offset,
                    bytes,
                    limit: slot.capped_by,
                    passed: false,
                });
            } else {
                // The limit was unknown when the producer was made: make it again with it.
                slot.failed = Some(format!(
                    "the target refused a batch as too large (offset {offset}); the producer is made again with the remote topic's limit"
                ));
            }
        }
        slot.large.clear();
        if slot.failed.is_none() {
            match absorb(&mut slot.policy, &mut slot.latest, acks, now) {
                Ok(syncs) => {
                    for sync in syncs {
                        if let Err(e) = send_sync(producer, &syncs_topic, &sync) {
                            slot.failed = Some(e);
                            break;
                        }
                    }
                }
                Err(e) => slot.failed = Some(e),
            }
        }
        if delivered {
            self.target_health.reachable();
        }
        let mut rejected = None;
        if let Some(r) = slot.refused.filter(|r| r.passed)
            && commit
            && slot.failed.is_none()
            && slot.committed.is_none_or(|c| c.next <= r.offset)
        {
            // The transaction began at or before it (and passed it): the position moves past
            // it even when it was the transaction's last record.
            if slot.latest.is_none_or(|l| l.next <= r.offset) {
                slot.latest = Some(Frontier {
                    next: r.offset.saturating_add(1),
                    downstream: slot.latest.map_or(-1, |l| l.downstream),
                });
            }
            let gap = continuity::found_now(
                topic,
                partition,
                (
                    positions::GapKind::RecordRejected {
                        size: i64::try_from(r.bytes).unwrap_or(i64::MAX),
                        limit: r.limit.map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)),
                    },
                    r.offset,
                    r.offset.saturating_add(1),
                ),
            );
            let written = continuity::record(&gap, &self.ctx.metrics, |key, value| {
                producer
                    .send(
                        BaseRecord::with_opaque_to(&positions_topic, NOT_A_RECORD)
                            .partition(0)
                            .key(key)
                            .payload(value),
                    )
                    .map_err(|(e, _)| e)
            });
            if written {
                rejected = Some(r);
            } else {
                slot.failed = Some("writing the gap of a refused record".into());
            }
        }
        if commit
            && slot.failed.is_none()
            && slot.latest != slot.committed
            && let Some(position) = slot.latest
        {
            let key = positions::encode_key(topic, partition);
            let value = positions::encode_value(position);
            let record = BaseRecord::with_opaque_to(&positions_topic, NOT_A_RECORD)
                .partition(0)
                .key(&key)
                .payload(&value);
            if let Err((e, _)) = producer.send(record) {
                slot.failed = Some(format!("writing the position: {e}"));
            }
        }
        if slot
            .failed
            .as_deref()
            .is_some_and(|f| f.starts_with(TARGET_REWOUND))
        {
            slot.recheck = true;
        }
        let outcome = match (&slot.failed, commit) {
            (None, true) => match producer.commit_transaction(CALL_TIMEOUT) {
                Ok(()) => Ended::Committed,
                Err(e) => {
                    // A failed call does not mean a failed commit (e.g. a timeout while the
                    // target restarts: the coordinator may still complete it). Rewinding to
                    // the position held here would then copy the committed records again.
                    // Only a new producer's init_transactions settles the transaction; the
                    // positions topic then says where the partition really is.
                    slot.failed = Some(format!("committing: {e}"));
                    Ended::Lost
                }
            },
            _ => match producer.abort_transaction(CALL_TIMEOUT) {
                Ok(()) => Ended::Rewind,
                Err(_) => Ended::Lost,
            },
        };
        slot.open = false;
        // Delivery reports of the syncs and the position.
        lock(&producer.context().acks).clear();
        let m = &self.ctx.metrics;
        match outcome {
            Ended::Committed => {
                m.records_replicated.inc_by(slot.records);
                m.bytes_replicated.inc_by(slot.bytes);
                slot.committed = slot.latest;
                slot.backoff.reset();
                slot.rewind.succeeded();
                if rejected.is_some() {
                    slot.refused = None;
                    m.records_rejected.with_label_values(&[topic]).inc();
                }
            }
            Ended::Rewind | Ended::Lost => {
                if commit {
                    tracing::warn!(%topic, partition, reason = slot.failed.as_deref().unwrap_or("aborted"),
                        "transaction aborted; the partition is copied again from its committed position");
                }
                m.errors.with_label_values(&["source", "transaction"]).inc();
                if let Some(r) = slot.refused.as_mut() {
                    r.passed = false;
                }
                slot.latest = slot.committed;
                slot.policy = SyncPolicy::new(
                    TopicPartition::new(topic.to_string(), partition),
                    self.sync_config,
                );
            }
        }
        slot.records = 0;
        slot.bytes = 0;
        slot.failed = None;
        if matches!(outcome, Ended::Lost) {
            let fenced = slot
                .producer
                .as_ref()
                .and_then(|p| p.client().fatal_error())
                .is_some_and(|(code, _)| {
                    matches!(
                        code,
                        RDKafkaErrorCode::Fenced
                            | RDKafkaErrorCode::ProducerFenced
                            | RDKafkaErrorCode::InvalidProducerEpoch
                    )
                });
            // A fenced producer means another replica took the partition (this one missed a
            // rebalance): give the group time to tell this replica before taking it back,
            // which would be safe but would only fence the rightful owner in turn.
            let wait = if fenced {
                tracing::warn!(%topic, partition,
                    "fenced: another writer took the partition; retrying after {FENCED_RETRY:?}");
                FENCED_RETRY.max(slot.backoff.next_delay())
            } else {
                slot.backoff.next_delay()
            };
            // Dropping a fenced or broken producer; a new one is initialised before the next
            // write, which also fences this one for good.
            slot.producer = None;
            slot.ready = false;
            slot.retry_at = Instant::now() + wait;
        }
        outcome
    }

    /// Positions the consumer after an aborted transaction.
    fn after(&mut self, topic: &str, partition: i32, ended: Ended) {
        if !matches!(ended, Ended::Rewind) {
            return;
        }
        let Some(slot) = self.slot_mut(topic, partition) else {
            return;
        };
        if slot.recheck {
            // Prepared again: the start position is then checked against both logs.
            slot.recheck = false;
            slot.ready = false;
            slot.retry_at = Instant::now();
            return;
        }
        // Not at once: a write the target refuses every time would otherwise abort a
        // transaction every COMMIT_EVERY forever. Reset by the next commit.
        let delay = slot.rewind.failed(Instant::now());
        tracing::debug!(%topic, partition, ?delay, "copying the partition again after a backoff");
    }

    /// Moves partitions whose rewind is due back to their committed position.
    fn rewind_due(&mut self, consumer: &BaseConsumer<TxSourceContext>) {
        let now = Instant::now();
        for slot in self.slots.values_mut().flat_map(HashMap::values_mut) {
            if !slot.rewind.due(now) {
                continue;
            }
            slot.rewind.take();
            let offset = slot
                .committed
                .map_or(Offset::Beginning, |f| Offset::Offset(f.next));
            let tp = slot.policy.topic_partition();
            let (topic, partition) = (tp.topic.clone(), tp.partition);
            if let Err(e) = rebalance::reposition(consumer, &topic, partition, offset) {
                tracing::debug!(%topic, partition, error = %e, "seek failed; preparing the partition again");
                slot.ready = false;
                slot.retry_at = now + slot.backoff.next_delay();
            }
        }
    }

    /// Creates and initialises the producers of `keys` that have none (fencing the previous
    /// writer), then reads the positions topic to its end. Returns the partitions now ready
    /// with the offset to start from.
    fn prepare(&mut self, keys: &[(String, i32)]) -> Vec<(String, i32, Offset)> {
        let mut inited = Vec::new();
        for (topic, partition) in keys {
            let base = self.producer_base.clone();
            let health = self.target_health.clone();
            let limits = self.limits.clone();
            let Some(slot) = self.slot_mut(topic, *partition) else {
                continue;
            };
            if slot.producer.is_none() {
                slot.capped_by = limits.get(&slot.remote);
                let created: Result<BaseProducer<TxContext>, KafkaError> =
                    producer_config(&base, &slot.transactional_id, slot.capped_by)
                        .create_with_context(TxContext {
                            acks: Mutex::new(Vec::new()),
                            health,
                        });
                let producer = match created {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::error!(%topic, partition, error = %e, "cannot create the transactional producer");
                        slot.retry_at = Instant::now() + slot.backoff.next_delay();
                        continue;
                    }
                };
                // Aborts whatever the previous writer left open and fences it.
                if let Err(e) = producer.init_transactions(CALL_TIMEOUT) {
                    tracing::warn!(%topic, partition, error = %e, id = %slot.transactional_id,
                        "initialising transactions failed; retrying");
                    slot.retry_at = Instant::now() + slot.backoff.next_delay();
                    continue;
                }
                slot.producer = Some(producer);
            }
            inited.push((topic.clone(), *partition));
        }
        if inited.is_empty() {
            return Vec::new();
        }
        // After fencing: every position a previous writer committed is in the topic now.
        if let Err(e) = self.positions.read_to_end(POSITIONS_READ_TIMEOUT) {
            self.count_error("positions");
            tracing::warn!(error = %e, "reading the positions topic failed; retrying");
            for (topic, partition) in &inited {
                if let Some(slot) = self.slot_mut(topic, *partition) {
                    slot.retry_at = Instant::now() + slot.backoff.next_delay();
                }
            }
            return Vec::new();
        }
        self.target_health.reachable();
        // Stored positions are checked against both logs before anything is read.
        let stored: Vec<(String, i32)> = inited
            .iter()
            .filter(|(t, p)| self.positions.get(t, *p).is_some())
            .cloned()
            .collect();
        let bounds = self.probe.source(&stored);
        let remotes: Vec<(String, i32)> = stored
            .iter()
            .filter_map(|(t, p)| Some((self.slot(t, *p)?.remote.clone(), *p)))
            .collect();
        let target_ends = self.probe.target_ends(&remotes);
        let mut ready = Vec::new();
        for (topic, partition) in inited {
            let Some(remote) = self.slot(&topic, partition).map(|s| s.remote.clone()) else {
                continue;
            };
            let r = continuity::resume(
                self.positions.get(&topic, partition),
                bounds.get(&(topic.clone(), partition)).copied(),
                target_ends.get(&(remote, partition)).copied(),
            );
            if let Some((kind, from, to)) = r.gap {
                let gap = continuity::found_now(&topic, partition, (kind, from, to));
                if !self.write_gap(&gap, r.start) {
                    // Not copied until the break is on record with the position past it.
                    if let Some(slot) = self.slot_mut(&topic, partition) {
                        slot.producer = None;
                        slot.retry_at = Instant::now() + slot.backoff.next_delay();
                    }
                    continue;
                }
            }
            let start = r.start;
            let config = self.sync_config;
            let Some(slot) = self.slot_mut(&topic, partition) else {
                continue;
            };
            slot.committed = start;
            slot.latest = start;
            slot.policy = SyncPolicy::new(TopicPartition::new(topic.clone(), partition), config);
            slot.ready = true;
            let offset = r.offset;
            tracing::debug!(%topic, partition, ?offset, "partition ready (exactly-once)");
            ready.push((topic, partition, offset));
        }
        ready
    }

    /// Records a break and the position past it in one transaction of the partition's
    /// producer, so neither is visible without the other.
    fn write_gap(&mut self, gap: &Gap, start: Option<Frontier>) -> bool {
        let topic = self.positions_topic.clone();
        let ctx = self.ctx.clone();
        let Some(producer) = self
            .slot(&gap.topic, gap.partition)
            .and_then(|s| s.producer.as_ref())
        else {
            return false;
        };
        let written = continuity::record(gap, &ctx.metrics, |key, value| {
            producer.begin_transaction()?;
            let send = |k: &[u8], v: &[u8]| {
                producer
                    .send(
                        BaseRecord::with_opaque_to(&topic, NOT_A_RECORD)
                            .partition(0)
                            .key(k)
                            .payload(v),
                    )
                    .map_err(|(e, _)| e)
            };
            let sent = send(key, value).and_then(|()| match start {
                Some(f) => send(
                    &positions::encode_key(&gap.topic, gap.partition),
                    &positions::encode_value(f),
                ),
                None => Ok(()),
            });
            match sent {
                Ok(()) => producer.commit_transaction(CALL_TIMEOUT),
                Err(e) => {
                    let _ = producer.abort_transaction(CALL_TIMEOUT);
                    Err(e)
                }
            }
        });
        lock(&producer.context().acks).clear();
        written
    }

    /// Finds remote partitions that end before the last committed copy (the remote topic was
    /// deleted, and discovery created it again) among ready partitions without an open
    /// transaction (open ones notice from their acknowledgements); those are prepared again,
    /// which records the break and copies them again.
    pub fn check_targets(&mut self) {
        let idle: Vec<(String, i32, String, i64)> = self
            .slots
            .iter()
            .flat_map(|(t, parts)| parts.iter().map(move |(p, s)| (t, *p, s)))
            .filter_map(|(t, p, s)| {
                let downstream = s.committed?.downstream;
                (s.ready && !s.open && downstream >= 0)
                    .then(|| (t.clone(), p, s.remote.clone(), downstream))
            })
            .collect();
        if idle.is_empty() {
            return;
        }
        let keys: Vec<(String, i32)> = idle.iter().map(|(_, p, r, _)| (r.clone(), *p)).collect();
        let ends = self.probe.target_ends(&keys);
        for (topic, partition, remote, downstream) in idle {
            if ends
                .get(&(remote, partition))
                .is_some_and(|&end| end <= downstream)
                && let Some(slot) = self.slot_mut(&topic, partition)
            {
                slot.ready = false;
                slot.retry_at = Instant::now();
            }
        }
    }

    /// The consumer stopped on a partition whose next offset is outside its log
    /// (`auto.offset.reset=error`): every owned partition is prepared again, which checks
    /// its committed position against both logs and records the break.
    pub fn offsets_out_of_range(&mut self) {
        for (topic, partition) in self.keys() {
            if self.slot(&topic, partition).is_some_and(|s| s.open) {
                self.end(&topic, partition, false);
            }
            if let Some(slot) = self.slot_mut(&topic, partition) {
                slot.ready = false;
                slot.retry_at = Instant::now();
            }
        }
    }

    fn retry_unready(&mut self, consumer: &BaseConsumer<TxSourceContext>) {
        let now = Instant::now();
        let due: Vec<(String, i32)> = self
            .keys()
            .into_iter()
            .filter(|(t, p)| {
                self.slot(t, *p)
                    .is_some_and(|s| !s.ready && s.retry_at <= now)
            })
            .collect();
        if due.is_empty() || self.shutdown.is_cancelled() {
            return;
        }
        for (topic, partition, offset) in self.prepare(&due) {
            if let Err(e) = rebalance::reposition(consumer, &topic, partition, offset) {
                tracing::debug!(%topic, partition, error = %e, "seek failed; retrying later");
                if let Some(slot) = self.slot_mut(&topic, partition) {
                    slot.ready = false;
                    slot.retry_at = now + slot.backoff.next_delay();
                }
            }
        }
    }

    /// Partitions were given to this replica: fence their previous writers, read their
    /// positions and start each there.
    fn assigned(&mut self, tpl: &mut TopicPartitionList) {
        let keys: Vec<(String, i32)> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_string(), e.partition()))
            .collect();
        for (topic, partition) in &keys {
            if let Some(slot) = self.slot(topic, *partition) {
                // Already ours (an eager assignor hands out the whole set again): restart it
                // from its committed position rather than from wherever the consumer starts.
                if slot.open {
                    self.end(topic, *partition, false);
                }
                if let Some(slot) = self.slot_mut(topic, *partition) {
                    slot.ready = false;
                }
                continue;
            }
            let slot = TxSlot {
                remote: self
                    .ctx
                    .flow
                    .policy
                    .format_remote_topic(self.ctx.flow.source_alias(), topic),
                transactional_id: transactional_id(&self.ctx.flow, topic, *partition),
                producer: None,
                ready: false,
                retry_at: Instant::now(),
                backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
                committed: None,
                latest: None,
                policy: SyncPolicy::new(
                    TopicPartition::new(topic.clone(), *partition),
                    self.sync_config,
                ),
                open: false,
                records: 0,
                bytes: 0,
                failed: None,
                recheck: false,
                rewind: Retry::new(Duration::from_millis(500), Duration::from_secs(30)),
                capped_by: None,
                large: Vec::new(),
                refused: None,
            };
            self.slots
                .entry(topic.clone())
                .or_default()
                .insert(*partition, slot);
        }
        // Every partition gets a start offset: one left unset would fall back to a committed
        // offset (there is none) and stop on `auto.offset.reset=error`. Those not ready yet
        // start at the beginning; their records are skipped until the partition is prepared
        // and moved to its position.
        for (topic, partition) in &keys {
            if let Err(e) = tpl.set_partition_offset(topic, *partition, Offset::Beginning) {
                tracing::error!(%topic, partition, error = %e, "cannot set the start offset");
            }
        }
        for (topic, partition, offset) in self.prepare(&keys) {
            if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
                tracing::error!(%topic, partition, error = %e, "cannot set the start offset");
            }
        }
        self.report_assignment();
    }

    /// Partitions are taken away: commit what was copied (unless the assignment was lost:
    /// then the next owner's fencing aborts it anyway) and drop their producers.
    fn revoked(&mut self, tpl: &TopicPartitionList, lost: bool) {
        for e in tpl.elements() {
            let (topic, partition) = (e.topic().to_string(), e.partition());
            if self.slot(&topic, partition).is_some_and(|s| s.open) {
                self.end(&topic, partition, !lost);
            }
            if let Some(t) = self.slots.get_mut(&topic) {
                t.remove(&partition);
                if t.is_empty() {
                    self.slots.remove(&topic);
                }
            }
        }
        self.report_assignment();
    }

    fn all(&self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in self.keys() {
            tpl.add_partition(&topic, partition);
        }
        tpl
    }

    fn report_assignment(&self) {
        let n = self.slots.values().map(HashMap::len).sum::<usize>();
        self.ctx.metrics.assigned_partitions.set(n as i64);
        tracing::info!(
            partitions = n,
            "source partitions assigned to this replica (exactly-once)"
        );
    }

    /// Graceful stop: commit every open transaction.
    pub fn stop(&mut self) {
        for (topic, partition) in self.keys() {
            if self.slot(&topic, partition).is_some_and(|s| s.open) {
                self.end(&topic, partition, true);
            }
        }
    }
}

/// Folds a transaction's delivery reports (in send order, one partition) into the sync policy
/// and the position after the last acknowledged record. Returns the offset syncs to add to the
/// transaction, or the first failure (the transaction must then be aborted). Reports of syncs
/// and positions (negative source offset) are skipped.
fn absorb(
    policy: &mut SyncPolicy,
    latest: &mut Option<Frontier>,
    acks: Vec<(i64, Result<i64, KafkaError>)>,
    now: Duration,
) -> Result<Vec<OffsetSync>, String> {
    let mut syncs = Vec::new();
    for (upstream, result) in acks {
        let downstream = result.map_err(|e| format!("writing to the target: {e}"))?;
        if upstream < 0 {
            continue;
        }
        if latest.is_some_and(|l| l.downstream >= 0 && downstream <= l.downstream) {
            // Target offsets only grow within a partition's log.
            return Err(format!(
                "{TARGET_REWOUND} (a copy landed at offset {downstream})"
            ));
        }
        syncs.extend(policy.observe(upstream, downstream, now));
        *latest = Some(Frontier {
            next: upstream.saturating_add(1),
            downstream,
        });
    }
    Ok(syncs)
}

fn send_sync(
    producer: &BaseProducer<TxContext>,
    topic: &str,
    sync: &OffsetSync,
) -> Result<(), String> {
    let encoded = sync
        .encode()
        .map_err(|e| format!("encoding an offset sync: {e}"))?;
    let headers = OwnedHeaders::new().insert(Header {
        key: SYNC_HEADER,
        value: Some(SYNC_HEADER_DENSE),
    });
    let mut record = BaseRecord::with_opaque_to(topic, NOT_A_RECORD)
        .partition(0)
        .key(&encoded.key)
        .payload(&encoded.value)
        .headers(headers);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                producer.poll(Duration::from_millis(20));
            }
            Err((e, _)) => return Err(format!("writing an offset sync to {topic}: {e}")),
        }
    }
}

/// The source consumer's context in exactly-once mode: routes rebalances to the [`TxCopier`].
pub struct TxSourceContext {
    pub copier: Arc<Mutex<TxCopier>>,
    pub health: Arc<ClusterHealth>,
}

impl ClientContext for TxSourceContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.health.unreachable(reason);
        } else {
            tracing::debug!(%error, %reason, "kafka client error");
        }
    }
}

impl ConsumerContext for TxSourceContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        rebalance::rebalance(&self.copier, consumer, err, tpl);
    }
}

/// Runs the exactly-once copy loop until `shutdown`; `subscriptions` carries discovery's
/// topic list.
pub fn run(
    consumer: BaseConsumer<TxSourceContext>,
    mut subscriptions: tokio::sync::watch::Receiver<Option<Arc<Vec<String>>>>,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
) -> Result<(), KafkaError> {
    let copier = consumer.context().copier.clone();
    let mut subscribed: Option<Arc<Vec<String>>> = None;
    let mut last_commit = Instant::now();
    let mut last_idle_check = Instant::now();
    let mut last_target_check = Instant::now();
    while !shutdown.is_cancelled() {
        if subscriptions.has_changed().unwrap_or(false) {
            let wanted = subscriptions.borrow_and_update().clone();
            if let Some(topics) = wanted
                && subscribed.as_ref() != Some(&topics)
            {
                if topics.is_empty() {
                    consumer.unsubscribe();
                } else {
                    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
                    consumer.subscribe(&names)?;
                }
                subscribed = Some(topics);
                ctx.readiness
                    .source
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let timeout = if lock(&copier).busy() {
            Duration::from_millis(5)
        } else {
            Duration::from_millis(100)
        };
        ctx.readiness.turned(crate::replicator::Loop::Source);
        match consumer.poll(timeout) {
            Some(Ok(m)) => lock(&copier).copy(&m),
            Some(Err(e)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::AutoOffsetReset) => {
                lock(&copier).offsets_out_of_range();
            }
            Some(Err(e)) => {
                ctx.metrics
                    .errors
                    .with_label_values(&["source", "consume"])
                    .inc();
                tracing::debug!(error = %e, "consumer error");
            }
            None => {}
        }
        if last_commit.elapsed() >= COMMIT_EVERY {
            last_commit = Instant::now();
            lock(&copier).commit_all(&consumer);
        }
        if last_idle_check.elapsed() >= IDLE_CHECK_EVERY {
            last_idle_check = Instant::now();
            lock(&copier).idle_syncs();
        }
        if last_target_check.elapsed() >= TARGET_CHECK_EVERY {
            last_target_check = Instant::now();
            lock(&copier).check_targets();
        }
    }
    tracing::info!("source loop stopping: committing open transactions");
    lock(&copier).stop();
    consumer.unsubscribe();
    for _ in 0..10 {
        if consumer.poll(Duration::from_millis(50)).is_none()
            && consumer.assignment().map(|a| a.count()).unwrap_or(0) == 0
        {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::SecretFiles;

    fn flow() -> Flow {
        let yaml = "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1'}\nexactlyOnce: true\nsourceLoop: {offsetSyncsLocation: Target}\n";
        crate::flow::resolve(
            "ns/f".into(),
            serde_yaml::from_str(yaml).unwrap(),
            &SecretFiles::new("/none"),
        )
        .unwrap()
    }

    #[test]
    fn each_source_partition_has_its_own_stable_transactional_id() {
        let f = flow();
        assert_eq!(
            transactional_id(&f, "orders", 3),
            "mirrorflow.ns_f.a-b.tx.orders-3"
        );
        assert_ne!(
            transactional_id(&f, "orders", 3),
            transactional_id(&f, "orders", 4)
        );
    }

    #[test]
    fn each_transaction_syncs_where_its_markers_shift_the_delta() {
        let mut policy = SyncPolicy::new(
            TopicPartition::new("t", 0),
            SyncPolicyConfig {
                max_records: 0,
                max_interval: None,
            },
        );
        let mut latest = None;
        let t = Duration::ZERO;
        // First transaction: source 0..3 at target 0..3, then its commit marker at 3.
        let first = vec![(0, Ok(0)), (1, Ok(1)), (2, Ok(2)), (-1, Ok(9))];
        let syncs = absorb(&mut policy, &mut latest, first, t).unwrap();
        assert_eq!(syncs.len(), 1, "the first record");
        assert_eq!(
            latest,
            Some(Frontier {
                next: 3,
                downstream: 2
            })
        );
        // Second: source 3.. lands at 4.. (after the marker): one sync, at its first record.
        let second = vec![(3, Ok(4)), (4, Ok(5))];
        let syncs = absorb(&mut policy, &mut latest, second, t).unwrap();
        assert_eq!(
            syncs
                .iter()
                .map(|s| (s.upstream_offset, s.downstream_offset))
                .collect::<Vec<_>>(),
            [(3, 4)]
        );
        assert_eq!(latest.map(|f| f.next), Some(5));
    }

    #[test]
    fn a_failed_record_fails_the_transaction() {
        let mut policy = SyncPolicy::new(TopicPartition::new("t", 0), SyncPolicyConfig::default());
        let mut latest = None;
        let acks = vec![
            (0, Ok(0)),
            (
                1,
                Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::MessageTimedOut,
                )),
            ),
        ];
        let err = absorb(&mut policy, &mut latest, acks, Duration::ZERO).unwrap_err();
        assert!(err.contains("writing to the target"), "{err}");
    }

    #[test]
    fn message_timeout_never_exceeds_the_transaction_timeout() {
        let mut base = ClientConfig::new();
        base.set("message.timeout.ms", "120000");
        let c = producer_config(&base, "id", None);
        assert_eq!(c.get("transactional.id"), Some("id"));
        assert_eq!(c.get("transaction.timeout.ms"), Some("15000"));
        assert_eq!(c.get("message.timeout.ms"), Some("15000"));
        assert_eq!(c.get("batch.size"), None);
        // A remote topic with a small limit: batches stay under it.
        let small = producer_config(&base, "id", Some(65_536));
        assert_eq!(small.get("batch.size"), Some("65475"));
        base.set("transaction.timeout.ms", "60000");
        assert_eq!(
            producer_config(&base, "id", None).get("message.timeout.ms"),
            Some("60000")
        );
    }
}
