//! The hot path: one blocking thread consumes from the source and produces to the target.
//!
//! Structure (chosen for throughput and a small footprint):
//! - a [`BaseConsumer`] in the source group, polled by this thread only;
//! - a [`BaseProducer`] on the target, polled by this same thread, so delivery callbacks run
//!   here too. A callback only pushes `(opaque, result)` into a vector; the loop drains it.
//!   The opaque is a `usize` naming the partition slot and its generation, no allocation per
//!   record. The source offset of an acknowledged record is the front of the slot's in-flight
//!   queue: the idempotent producer acknowledges a partition's records in send order;
//! - the same thread handles rebalances (librdkafka calls back from inside `poll`), so the
//!   state is behind a mutex that is never contended.
//!
//! A failed delivery (record or offset sync) faults the partition: after a backoff it is
//! rewound to its last committable position and copied again. Records may repeat, never go
//! missing.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus::local::{LocalHistogram, LocalIntCounter};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use super::continuity::{self, LogProbe, Resume};
use super::limits::{self, Admit, RemoteLimits};
use super::lock;
use super::progress::{Frontier, Progress};
use super::reach::ClusterHealth;
use super::rebalance::{self, Owner};
use super::{SYNC_HEADER, SYNC_HEADER_DENSE};
use crate::kafka::positions::{self, Gap, PositionReader};
use crate::mm2::{OffsetSync, SyncPolicyConfig, TopicPartition};
use crate::replicator::Context;
use crate::replicator::backoff::Backoff;

/// How long a rebalance or shutdown waits for outstanding writes before giving up on them
/// (they are then copied again by whoever owns the partition next).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
const POSITIONS_READ_TIMEOUT: Duration = Duration::from_secs(10);
const PERSIST_EVERY: Duration = Duration::from_secs(1);
/// Records between two services of the producer queue while the source has data.
const SERVICE_EVERY: u32 = 512;
/// How often idle partitions are checked for a tail offset sync ([`Copier::idle_syncs`]).
const IDLE_CHECK_EVERY: Duration = Duration::from_millis(50);
/// How often the remote partitions are checked for having gone back under the copies
/// ([`Copier::check_targets`]): an idle partition would otherwise never notice.
const TARGET_CHECK_EVERY: Duration = Duration::from_secs(10);
/// Bound on the delivery-report events one [`serve_reports`] serves, so a steady stream of
/// them cannot keep the loop from consuming.
const MAX_REPORT_EVENTS: usize = 1024;
/// Wait between two attempts to queue a record while the producer's queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(1);

/// Opaque layout: bit 63 = position write, bits 32..63 = slot generation, bits 0..32 = slot.
const POSITION_BIT: usize = 1 << 63;
const GEN_MASK: u32 = 0x7fff_ffff;

fn opaque(slot: usize, generation: u32, position: bool) -> usize {
    let tag = if position { POSITION_BIT } else { 0 };
    tag | ((generation & GEN_MASK) as usize) << 32 | (slot & 0xffff_ffff)
}

fn unpack(opaque: usize) -> (usize, u32, bool) {
    (
        opaque & 0xffff_ffff,
        ((opaque >> 32) as u32) & GEN_MASK,
        opaque & POSITION_BIT != 0,
    )
}

/// A delivery report, as the callback saw it.
pub struct Ack {
    opaque: usize,
    result: Result<(i64, Option<i64>), KafkaError>,
}

/// Producer context shared by the record and the sync producers: collects delivery reports.
pub struct AckContext {
    acks: Mutex<Vec<Ack>>,
    health: Arc<ClusterHealth>,
}

impl AckContext {
    pub fn new(health: Arc<ClusterHealth>) -> Self {
        AckContext {
            acks: Mutex::new(Vec::with_capacity(4096)),
            health,
        }
    }

    fn take(&self, into: &mut Vec<Ack>) {
        into.clear();
        std::mem::swap(&mut *lock(&self.acks), into);
    }

    fn collected(&self) -> usize {
        lock(&self.acks).len()
    }
}

/// Serves every delivery report `producer` has queued. `poll(ZERO)` serves one event, and an
/// event reports one produce batch: served once per loop pass, reports of small batches (a
/// few records per partition at moderate rates) queued up faster than they were served, so
/// acknowledgements, and the offset syncs written on them, trailed the target by tens of
/// seconds. Non-zero timeouts are avoided: rdkafka's poll keeps polling until the whole
/// timeout has passed, and spins through its last millisecond.
fn serve_reports(producer: &BaseProducer<AckContext>) {
    for _ in 0..MAX_REPORT_EVENTS {
        let before = producer.context().collected();
        producer.poll(Duration::ZERO);
        if producer.context().collected() == before {
            break;
        }
    }
}

impl ClientContext for AckContext {
    fn error(&self, error: KafkaError, reason: &str) {
        note_client_error(&self.health, error, reason);
    }
}

impl ProducerContext for AckContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let result = match result {
            Ok(m) => Ok((m.offset(), m.timestamp().to_millis())),
            Err((e, _)) => Err(e.clone()),
        };
        lock(&self.acks).push(Ack { opaque, result });
    }
}

fn note_client_error(health: &ClusterHealth, error: KafkaError, reason: &str) {
    if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
        health.unreachable(reason);
    } else {
        tracing::debug!(%error, %reason, "kafka client error");
    }
}

/// The source consumer's context: routes rebalances to the [`Copier`].
pub struct SourceContext {
    pub copier: Arc<Mutex<Copier>>,
    pub health: Arc<ClusterHealth>,
}

impl ClientContext for SourceContext {
    fn error(&self, error: KafkaError, reason: &str) {
        note_client_error(&self.health, error, reason);
    }
}

impl ConsumerContext for SourceContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        rebalance::rebalance(&self.copier, consumer, err, tpl);
    }
}

struct InFlight {
    offset: i64,
    /// Key, value and header bytes.
    bytes: u64,
    /// Upper bound of its size in a batch ([`limits::wire_size`]).
    wire: usize,
    /// Queued with nothing else of its partition ([`Admit::Alone`]): a refusal as too large
    /// is about this record alone.
    alone: bool,
    read_at: Instant,
}

struct Fault {
    retry_at: Instant,
    resume_from: Option<Frontier>,
}

/// One assigned source partition.
struct Slot {
    topic: String,
    partition: i32,
    remote: Arc<str>,
    generation: u32,
    progress: Progress,
    in_flight: VecDeque<InFlight>,
    fault: Option<Fault>,
    backoff: Backoff,
    /// Sum of `wire` over `in_flight`.
    in_flight_bytes: usize,
    /// The remote topic's `max.message.bytes`, once discovery read it.
    limit: Option<usize>,
    /// Records up to this source offset were in a batch the target refused as too large: each
    /// is written alone, so a second refusal names the record ([`Admit::Alone`]).
    alone_until: i64,
}

impl Slot {
    fn clear_in_flight(&mut self) {
        self.in_flight.clear();
        self.in_flight_bytes = 0;
    }

    fn pop_in_flight(&mut self) -> Option<InFlight> {
        let sent = self.in_flight.pop_front()?;
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(sent.wire);
        Some(sent)
    }
}

/// Everything the copy thread mutates; see the module docs.
pub struct Copier {
    ctx: Arc<Context>,
    producer: BaseProducer<AckContext>,
    syncs: BaseProducer<AckContext>,
    syncs_topic: String,
    positions_topic: String,
    positions: PositionReader,
    probe: LogProbe,
    /// When the last rebalance callback returned (they may block for seconds).
    last_rebalance: Instant,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    by_topic: HashMap<String, Vec<Option<usize>>>,
    next_generation: u32,
    sync_config: SyncPolicyConfig,
    started: Instant,
    shutdown: CancellationToken,
    source_health: Arc<ClusterHealth>,
    target_health: Arc<ClusterHealth>,
    acks: Vec<Ack>,
    records: LocalIntCounter,
    bytes: LocalIntCounter,
    record_age: LocalHistogram,
    latency: LocalHistogram,
    limits: RemoteLimits,
    /// The largest batch the producer builds ([`limits::batch_cap`]).
    batch_cap: usize,
}

pub struct CopierParts {
    pub ctx: Arc<Context>,
    pub producer: BaseProducer<AckContext>,
    pub syncs: BaseProducer<AckContext>,
    pub syncs_topic: String,
    pub positions_topic: String,
    pub positions: PositionReader,
    pub probe: LogProbe,
    pub shutdown: CancellationToken,
    pub source_health: Arc<ClusterHealth>,
    pub target_health: Arc<ClusterHealth>,
    pub limits: RemoteLimits,
    pub batch_cap: usize,
}

impl Owner for Copier {
    fn assigned(&mut self, tpl: &mut TopicPartitionList) {
        Copier::assigned(self, tpl);
    }

    fn revoked(&mut self, tpl: &TopicPartitionList, lost: bool) {
        Copier::revoked(self, tpl, lost);
    }

    fn owned(&self) -> TopicPartitionList {
        self.assignment()
    }

    fn count_error(&self, kind: &str) {
        Copier::count_error(self, kind);
    }

    const FAILED_REBALANCE_IS_LOST: bool = false;
}

impl Copier {
    pub fn new(p: CopierParts) -> Self {
        let interval = p
            .ctx
            .flow
            .spec
            .source_loop
            .offset_sync_interval
            .as_duration();
        let m = &p.ctx.metrics;
        let (records, bytes) = (m.records_replicated.local(), m.bytes_replicated.local());
        let (record_age, latency) = (m.record_age.local(), m.replication_latency.local());
        Copier {
            sync_config: SyncPolicyConfig {
                max_interval: Some(interval),
                ..SyncPolicyConfig::default()
            },
            ctx: p.ctx,
            producer: p.producer,
            syncs: p.syncs,
            syncs_topic: p.syncs_topic,
            positions_topic: p.positions_topic,
            positions: p.positions,
            probe: p.probe,
            last_rebalance: Instant::now(),
            slots: Vec::new(),
            free: Vec::new(),
            by_topic: HashMap::new(),
            next_generation: 0,
            started: Instant::now(),
            shutdown: p.shutdown,
            source_health: p.source_health,
            target_health: p.target_health,
            acks: Vec::with_capacity(4096),
            records,
            bytes,
            record_age,
            latency,
            limits: p.limits,
            batch_cap: p.batch_cap,
        }
    }

    fn count_error(&self, kind: &str) {
        self.ctx
            .metrics
            .errors
            .with_label_values(&["source", kind])
            .inc();
    }

    fn slot_index(&self, topic: &str, partition: i32) -> Option<usize> {
        let by_partition = self.by_topic.get(topic)?;
        *by_partition.get(usize::try_from(partition).ok()?)?
    }

    fn assignment(&self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for s in self.slots.iter().flatten() {
            tpl.add_partition(&s.topic, s.partition);
        }
        tpl
    }

    /// Writes are outstanding (an atomic read in librdkafka: cheap enough for every poll).
    pub fn busy(&self) -> bool {
        self.producer.in_flight_count() > 0 || self.syncs.in_flight_count() > 0
    }

    /// Copies one source record.
    pub fn copy(&mut self, m: &BorrowedMessage<'_>) {
        self.source_health.reachable();
        let Some(idx) = self.slot_index(m.topic(), m.partition()) else {
            // Not ours (any more): a rebalance moved it; its new owner copies it.
            return;
        };
        let Some(slot) = self.slots[idx].as_ref() else {
            return;
        };
        if slot.fault.is_some() {
            // The partition will be rewound before this offset; skip until then.
            return;
        }
        let (remote, generation) = (slot.remote.clone(), slot.generation);
        let wire = limits::message_size(m);
        let Some(alone) = self.make_room(idx, generation, m.offset(), wire) else {
            return;
        };
        let mut record = BaseRecord::with_opaque_to(&remote, opaque(idx, generation, false))
            .partition(m.partition());
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
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // Backpressure: the target is slower than the source (or away). Retried
                    // as soon as an acknowledgement frees room, not after a fixed poll.
                    record = back;
                    std::thread::sleep(QUEUE_FULL_WAIT);
                    serve_reports(&self.producer);
                    self.service_acks();
                    let still_valid = self.slots[idx]
                        .as_ref()
                        .is_some_and(|s| s.generation == generation && s.fault.is_none());
                    if !still_valid || self.shutdown.is_cancelled() {
                        return;
                    }
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _))
                    if alone =>
                {
                    // Over the producer's own `message.max.bytes`: no broker will see it.
                    let limit = self.slots[idx].as_ref().and_then(|s| s.limit);
                    self.reject(idx, m.offset(), bytes, limit);
                    return;
                }
                Err((e, _)) => {
                    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageSizeTooLarge)
                        && let Some(slot) = self.slots[idx].as_mut()
                    {
                        slot.alone_until = slot.alone_until.max(m.offset());
                    }
                    self.fault(idx, &format!("producing to {remote}: {e}"), "produce");
                    return;
                }
            }
        }
        if let Some(slot) = self.slots[idx].as_mut()
            && slot.generation == generation
        {
            slot.in_flight.push_back(InFlight {
                offset: m.offset(),
                bytes: bytes as u64,
                wire,
                alone,
                read_at: Instant::now(),
            });
            slot.in_flight_bytes = slot.in_flight_bytes.saturating_add(wire);
        }
        if alone {
            // Nothing may join its batch: wait for its answer before reading on.
            self.wait_for(idx, generation, |s| s.in_flight.is_empty());
        }
    }

    /// Holds the copy of the record at `offset` (`wire` bytes) until the partition's queue
    /// leaves room for it under the remote topic's limit ([`limits::admit`]). Returns whether
    /// it goes alone, or `None` when the partition was faulted, moved or the loop is stopping
    /// meanwhile (the record is then copied again later, or by the next owner).
    fn make_room(&mut self, idx: usize, generation: u32, offset: i64, wire: usize) -> Option<bool> {
        loop {
            let slot = self.slots[idx].as_mut()?;
            if slot.generation != generation || slot.fault.is_some() {
                return None;
            }
            if slot.limit.is_none() {
                slot.limit = self.limits.get(&slot.remote);
            }
            let decision = limits::admit(
                wire,
                slot.in_flight_bytes,
                slot.in_flight.len(),
                slot.limit,
                self.batch_cap,
                offset <= slot.alone_until,
            );
            match decision {
                Admit::Send => return Some(false),
                Admit::Alone => return Some(true),
                Admit::WaitForRoom => {
                    if !self.wait_for(idx, generation, |s| s.in_flight.is_empty()) {
                        return None;
                    }
                }
            }
        }
    }

    /// Serves acknowledgements until `done` holds for the slot. False when the slot was faulted
    /// or moved meanwhile, or the loop is stopping.
    fn wait_for(&mut self, idx: usize, generation: u32, done: impl Fn(&Slot) -> bool) -> bool {
        loop {
            match self.slots[idx].as_ref() {
                Some(s) if s.generation == generation && s.fault.is_none() => {
                    if done(s) {
                        return true;
                    }
                }
                _ => return false,
            }
            if self.shutdown.is_cancelled() {
                return false;
            }
            std::thread::sleep(QUEUE_FULL_WAIT);
            serve_reports(&self.producer);
            self.service_acks();
        }
    }

    /// The target refused the record at `offset` (`bytes` long) alone as too large: record
    /// the refusal as a gap and copy on after it. Retrying could never succeed, and stopping
    /// the partition would hold every later record back for one the target cannot take;
    /// records deleted before they were copied are handled the same way.
    fn reject(&mut self, idx: usize, offset: i64, bytes: usize, limit: Option<usize>) {
        let Some(slot) = self.slots[idx].as_mut() else {
            return;
        };
        slot.progress.skipped(offset);
        // Stored with the gap, so a restart does not refuse the record again; never past an
        // unacknowledged offset sync.
        let start = slot.progress.committable();
        let topic = slot.topic.clone();
        self.ctx
            .metrics
            .records_rejected
            .with_label_values(&[&topic])
            .inc();
        let kind = positions::GapKind::RecordRejected {
            size: i64::try_from(bytes).unwrap_or(i64::MAX),
            limit: limit.map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)),
        };
        let gap = continuity::found_now(
            &topic,
            slot.partition,
            (kind, offset, offset.saturating_add(1)),
        );
        self.write_gap(&gap, start);
    }

    /// Writes the tail sync of every owned partition that went idle with acknowledged records
    /// after its last sync ([`Progress::idle_sync`]); one cheap check per partition.
    pub fn idle_syncs(&mut self) {
        let now = self.now();
        let mut syncs = Vec::new();
        for (idx, slot) in self.slots.iter_mut().enumerate() {
            let Some(slot) = slot.as_mut() else { continue };
            if slot.fault.is_some() {
                continue;
            }
            if let Some(sync) = slot.progress.idle_sync(now) {
                syncs.push((idx, slot.generation, sync));
            }
        }
        for (idx, generation, sync) in syncs {
            tracing::debug!(topic = %sync.topic_partition.topic, partition = sync.topic_partition.partition,
                upstream = sync.upstream_offset, downstream = sync.downstream_offset,
                "partition idle: offset sync at its last record");
            self.write_sync(idx, generation, &sync);
        }
    }

    /// Serves delivery reports of both producers and retries faulted partitions.
    pub fn service(&mut self, consumer: &BaseConsumer<SourceContext>) {
        serve_reports(&self.producer);
        self.service_acks();
        self.retry_faults(consumer);
        self.records.flush();
        self.bytes.flush();
        self.record_age.flush();
        self.latency.flush();
    }

    fn service_acks(&mut self) {
        serve_reports(&self.syncs);
        self.process_sync_acks();
        self.process_acks();
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn process_acks(&mut self) {
        let mut acks = std::mem::take(&mut self.acks);
        self.producer.context().take(&mut acks);
        if acks.is_empty() {
            self.acks = acks;
            return;
        }
        let now = self.now();
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let mut syncs = Vec::new();
        let mut faults = Vec::new();
        let mut rewound = Vec::new();
        let mut rejected = Vec::new();
        let mut delivered = false;
        for ack in acks.drain(..) {
            let (idx, generation, is_position) = unpack(ack.opaque);
            let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
                if is_position && ack.result.is_err() {
                    self.ctx
                        .metrics
                        .errors
                        .with_label_values(&["source", "positions"])
                        .inc();
                }
                continue;
            };
            if slot.generation != generation {
                continue;
            }
            if is_position {
                if let Err(e) = ack.result {
                    tracing::warn!(topic = %slot.topic, partition = slot.partition, error = %e,
                        "storing a source position failed; retrying");
                    slot.progress.store_failed();
                    self.ctx
                        .metrics
                        .errors
                        .with_label_values(&["source", "positions"])
                        .inc();
                }
                continue;
            }
            let Some(sent) = slot.pop_in_flight() else {
                continue;
            };
            match ack.result {
                Ok((downstream, _))
                    if slot
                        .progress
                        .latest()
                        .is_some_and(|l| l.downstream >= 0 && downstream <= l.downstream) =>
                {
                    // Target offsets only grow within a partition's log: this one is a new
                    // log (the remote topic was deleted and created again) or lost records.
                    let from = slot.progress.latest().map_or(0, |l| l.downstream + 1);
                    rewound.push((idx, from, downstream));
                }
                Ok((downstream, timestamp)) => {
                    delivered = true;
                    // Recovered: the next fault waits the shortest delay again, not the
                    // longest one an earlier outage reached.
                    slot.backoff.reset();
                    self.records.inc();
                    self.bytes.inc_by(sent.bytes);
                    self.latency.observe(sent.read_at.elapsed().as_secs_f64());
                    if let Some(ts) = timestamp {
                        self.record_age
                            .observe(wall_ms.saturating_sub(ts).max(0) as f64 / 1000.0);
                    }
                    if let Some(sync) = slot.progress.acknowledged(sent.offset, downstream, now) {
                        syncs.push((idx, generation, sync));
                    }
                }
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge))
                    if sent.alone =>
                {
                    rejected.push((idx, sent.offset, sent.bytes, slot.limit));
                }
                Err(e) => {
                    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageSizeTooLarge) {
                        // A batch was refused: its records go alone next time, so the one
                        // that cannot fit (if any) is found instead of refused again forever.
                        let last = slot.in_flight.back().map_or(sent.offset, |f| f.offset);
                        slot.alone_until = slot.alone_until.max(last);
                        // The limit may have been lowered since it was read.
                        slot.limit = None;
                    }
                    faults.push((
                        idx,
                        format!("copying offset {} to {}: {e}", sent.offset, slot.remote),
                    ));
                }
            }
        }
        self.acks = acks;
        if delivered {
            self.target_health.reachable();
        }
        for (idx, generation, sync) in syncs {
            self.write_sync(idx, generation, &sync);
        }
        for (idx, offset, bytes, limit) in rejected {
            self.reject(
                idx,
                offset,
                usize::try_from(bytes).unwrap_or(usize::MAX),
                limit,
            );
        }
        for (idx, reason) in faults {
            self.fault(idx, &reason, "produce");
        }
        for (idx, from, to) in rewound {
            self.target_rewound(idx, from, to);
        }
    }

    /// Finds remote partitions that end before the newest acknowledged copy (the remote topic
    /// was deleted, and discovery created it again) among those not written to right now
    /// (written ones notice from their acknowledgements). One ListOffsets per broker.
    pub fn check_targets(&mut self) {
        let idle: Vec<(usize, String, i32, i64)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(idx, s)| {
                let s = s.as_ref()?;
                let latest = s.progress.latest()?;
                (s.fault.is_none() && s.in_flight.is_empty() && latest.downstream >= 0)
                    .then(|| (idx, s.remote.to_string(), s.partition, latest.downstream))
            })
            .collect();
        if idle.is_empty() {
            return;
        }
        let keys: Vec<(String, i32)> = idle.iter().map(|(_, r, p, _)| (r.clone(), *p)).collect();
        let ends = self.probe.target_ends(&keys);
        for (idx, remote, partition, downstream) in idle {
            if let Some(&end) = ends.get(&(remote, partition))
                && end <= downstream
            {
                self.target_rewound(idx, downstream + 1, end);
            }
        }
    }

    /// The target partition went back under the copies: record it and copy the partition
    /// again from the source's earliest record.
    fn target_rewound(&mut self, idx: usize, from: i64, to: i64) {
        let generation = self.bump_generation();
        let config = self.sync_config;
        let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
            return;
        };
        // Later acks of the same batch carry the old generation and are ignored.
        slot.generation = generation;
        slot.clear_in_flight();
        let key = (slot.topic.clone(), slot.partition);
        let bounds = self.probe.source(std::slice::from_ref(&key));
        let start = bounds.get(&key).map(|b| Frontier {
            next: b.start,
            downstream: -1,
        });
        let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
            return;
        };
        slot.progress = Progress::new(TopicPartition::new(key.0.clone(), key.1), config, start);
        slot.fault = Some(Fault {
            retry_at: Instant::now(),
            resume_from: start,
        });
        let gap =
            continuity::found_now(&key.0, key.1, (positions::GapKind::TargetRewound, from, to));
        self.write_gap(&gap, start);
    }

    fn process_sync_acks(&mut self) {
        let mut acks = Vec::new();
        self.syncs.context().take(&mut acks);
        for ack in acks {
            let (idx, generation, _) = unpack(ack.opaque);
            let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
                continue;
            };
            if slot.generation != generation {
                continue;
            }
            match ack.result {
                Ok(_) => {
                    slot.progress.sync_acknowledged();
                    self.ctx.metrics.offset_syncs.inc();
                }
                Err(e) => {
                    let reason = format!("writing an offset sync to {}: {e}", self.syncs_topic);
                    self.fault(idx, &reason, "offset_sync");
                }
            }
        }
    }

    fn write_sync(&mut self, idx: usize, generation: u32, sync: &OffsetSync) {
        let encoded = match sync.encode() {
            Ok(e) => e,
            Err(e) => {
                // Cannot happen for a real Kafka topic name; rewinding would not help either.
                tracing::error!(error = %e, sync = ?sync, "cannot encode an offset sync");
                self.count_error("offset_sync");
                return;
            }
        };
        let headers = OwnedHeaders::new().insert(Header {
            key: SYNC_HEADER,
            value: Some(SYNC_HEADER_DENSE),
        });
        let mut record =
            BaseRecord::with_opaque_to(&self.syncs_topic, opaque(idx, generation, false))
                .partition(0)
                .key(&encoded.key)
                .payload(&encoded.value)
                .headers(headers);
        loop {
            match self.syncs.send(record) {
                Ok(()) => return,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // Never dropped: wait for room. Record acks are not served meanwhile, so
                    // this cannot recurse.
                    record = back;
                    self.syncs.poll(Duration::from_millis(20));
                    if self.shutdown.is_cancelled() {
                        self.fault(
                            idx,
                            "shutting down with an unsent offset sync",
                            "offset_sync",
                        );
                        return;
                    }
                }
                Err((e, _)) => {
                    let reason = format!("writing an offset sync to {}: {e}", self.syncs_topic);
                    self.fault(idx, &reason, "offset_sync");
                    return;
                }
            }
        }
    }

    /// A write of this partition failed: forget what is in flight and, after a backoff, copy
    /// again from the last committable position.
    fn fault(&mut self, idx: usize, reason: &str, kind: &str) {
        self.count_error(kind);
        let generation = self.bump_generation();
        let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
            return;
        };
        if slot.fault.is_none() {
            tracing::warn!(topic = %slot.topic, partition = slot.partition, %reason,
                "copy failed; the partition will be copied again from its last safe position");
        }
        slot.generation = generation;
        slot.clear_in_flight();
        let resume_from = slot.progress.rewind();
        slot.fault = Some(Fault {
            retry_at: Instant::now() + slot.backoff.next_delay(),
            resume_from,
        });
    }

    fn retry_faults(&mut self, consumer: &BaseConsumer<SourceContext>) {
        let now = Instant::now();
        for slot in self.slots.iter_mut().flatten() {
            let Some(fault) = &slot.fault else { continue };
            if fault.retry_at > now {
                continue;
            }
            let offset = fault
                .resume_from
                .map_or(Offset::Beginning, |f| Offset::Offset(f.next));
            match rebalance::reposition(consumer, &slot.topic, slot.partition, offset) {
                Ok(()) => {
                    tracing::info!(topic = %slot.topic, partition = slot.partition, ?offset,
                        "copying the partition again");
                    slot.fault = None;
                }
                Err(e) => {
                    tracing::debug!(topic = %slot.topic, partition = slot.partition, error = %e,
                        "seek failed; retrying later");
                    if let Some(f) = slot.fault.as_mut() {
                        f.retry_at = now + slot.backoff.next_delay();
                    }
                }
            }
        }
    }

    fn bump_generation(&mut self) -> u32 {
        self.next_generation = self.next_generation.wrapping_add(1) & GEN_MASK;
        self.next_generation
    }

    /// Writes the position of every partition whose committable point moved.
    pub fn persist(&mut self) {
        let idxs: Vec<usize> = (0..self.slots.len()).collect();
        self.persist_slots(&idxs);
    }

    fn persist_slots(&mut self, idxs: &[usize]) {
        for &idx in idxs {
            let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
                continue;
            };
            if slot.fault.is_some() {
                continue;
            }
            let Some(position) = slot.progress.take_to_store() else {
                continue;
            };
            let key = positions::encode_key(&slot.topic, slot.partition);
            let value = positions::encode_value(position);
            let mut record = BaseRecord::with_opaque_to(
                &self.positions_topic,
                opaque(idx, slot.generation, true),
            )
            .partition(0)
            .key(&key)
            .payload(&value);
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                        if Instant::now() < deadline =>
                    {
                        record = back;
                        // Serves callbacks, which only queue acks: `slot` stays valid.
                        self.producer.poll(Duration::from_millis(20));
                    }
                    Err((e, _)) => {
                        tracing::warn!(topic = %slot.topic, partition = slot.partition, error = %e,
                            "cannot store the source position now; retrying");
                        slot.progress.store_failed();
                        self.ctx
                            .metrics
                            .errors
                            .with_label_values(&["source", "positions"])
                            .inc();
                        break;
                    }
                }
            }
        }
    }

    /// Waits until every record and sync written so far is acknowledged (or `timeout`).
    fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            self.producer.poll(Duration::from_millis(10));
            self.service_acks();
            if self.producer.in_flight_count() == 0 && self.syncs.in_flight_count() == 0 {
                self.service_acks();
                if self.producer.in_flight_count() == 0 && self.syncs.in_flight_count() == 0 {
                    return;
                }
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    records = self.producer.in_flight_count(),
                    syncs = self.syncs.in_flight_count(),
                    "writes still unacknowledged after {timeout:?}; their records will be copied again"
                );
                return;
            }
        }
    }

    /// Stores positions of `idxs` and waits for the target to acknowledge them.
    fn persist_and_wait(&mut self, idxs: &[usize]) {
        self.drain(DRAIN_TIMEOUT);
        self.persist_slots(idxs);
        if let Err(e) = self.producer.flush(DRAIN_TIMEOUT) {
            tracing::warn!(error = %e, "flushing source positions failed");
        }
        self.service_acks();
    }

    /// Partitions were given to this replica: read the positions topic to its end (the
    /// previous owner stored its positions before letting go) and start each partition there.
    fn assigned(&mut self, tpl: &mut TopicPartitionList) {
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
        loop {
            match self.positions.read_to_end(POSITIONS_READ_TIMEOUT) {
                Ok(()) => {
                    self.target_health.reachable();
                    break;
                }
                Err(e) => {
                    self.count_error("positions");
                    self.target_health.unreachable(&e.to_string());
                    if self.shutdown.is_cancelled() {
                        // Shutting down: nothing will be copied, the offsets do not matter.
                        return;
                    }
                    std::thread::sleep(backoff.next_delay());
                }
            }
        }
        if self.positions.undecodable() > 0 {
            tracing::warn!(count = self.positions.undecodable(), topic = %self.positions_topic,
                "ignored records the positions topic should not hold");
        }
        let assigned: Vec<(String, i32)> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_string(), e.partition()))
            .collect();
        let mut fresh = Vec::new();
        for (topic, partition) in assigned {
            if let Some(idx) = self.slot_index(&topic, partition) {
                // Already ours (not expected from librdkafka): restart it from its safe point
                // rather than let the consumer fall back to the beginning.
                let generation = self.bump_generation();
                if let Some(slot) = self.slots[idx].as_mut() {
                    slot.generation = generation;
                    slot.clear_in_flight();
                    slot.fault = None;
                    let offset = slot
                        .progress
                        .rewind()
                        .map_or(Offset::Beginning, |f| Offset::Offset(f.next));
                    if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
                        tracing::error!(%topic, partition, error = %e, "cannot set the start offset");
                    }
                }
                continue;
            }
            fresh.push((topic, partition));
        }
        // Stored positions are checked against both logs before anything is read.
        let stored: Vec<(String, i32)> = fresh
            .iter()
            .filter(|(t, p)| self.positions.get(t, *p).is_some())
            .cloned()
            .collect();
        let bounds = self.probe.source(&stored);
        let remotes: Vec<(String, i32)> = stored
            .iter()
            .map(|(t, p)| (self.remote_name(t), *p))
            .collect();
        let target_ends = self.probe.target_ends(&remotes);
        for (topic, partition) in fresh {
            let key = (topic.clone(), partition);
            let remote = self.remote_name(&topic);
            let r = continuity::resume(
                self.positions.get(&topic, partition),
                bounds.get(&key).copied(),
                target_ends.get(&(remote.clone(), partition)).copied(),
            );
            if let Some((kind, from, to)) = r.gap {
                let gap = continuity::found_now(&topic, partition, (kind, from, to));
                self.write_gap(&gap, r.start);
            }
            let Resume { offset, start, .. } = r;
            if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
                tracing::error!(%topic, partition, error = %e, "cannot set the start offset");
            }
            tracing::debug!(%topic, partition, ?offset, "partition assigned");
            let generation = self.bump_generation();
            let limit = self.limits.get(&remote);
            let slot = Slot {
                remote: remote.into(),
                progress: Progress::new(
                    TopicPartition::new(topic.clone(), partition),
                    self.sync_config,
                    start,
                ),
                topic,
                partition,
                generation,
                in_flight: VecDeque::new(),
                fault: None,
                backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
                in_flight_bytes: 0,
                limit,
                alone_until: -1,
            };
            self.insert(slot);
        }
        self.report_assignment();
        self.last_rebalance = Instant::now();
    }

    fn remote_name(&self, topic: &str) -> String {
        self.ctx
            .flow
            .policy
            .format_remote_topic(self.ctx.flow.source_alias(), topic)
    }

    /// Records a break and, with it, the position copying resumes from (so a restart before
    /// the next stored position does not find the same break again).
    fn write_gap(&mut self, gap: &Gap, start: Option<Frontier>) {
        let (producer, topic) = (&self.producer, &self.positions_topic);
        // An opaque naming no slot: its acknowledgement is ignored.
        let unowned = opaque(0xffff_ffff, 0, true);
        continuity::record(gap, &self.ctx.metrics, |key, value| {
            let send = |k: &[u8], v: &[u8]| {
                producer
                    .send(
                        BaseRecord::with_opaque_to(topic, unowned)
                            .partition(0)
                            .key(k)
                            .payload(v),
                    )
                    .map_err(|(e, _)| e)
            };
            send(key, value)?;
            if let Some(f) = start {
                send(
                    &positions::encode_key(&gap.topic, gap.partition),
                    &positions::encode_value(f),
                )?;
            }
            producer.flush(Duration::from_secs(10))
        });
    }

    /// The consumer stopped on a partition whose next offset is outside its log
    /// (`auto.offset.reset=error`): find which, record the break and go on past it.
    pub fn offsets_out_of_range(&mut self, consumer: &BaseConsumer<SourceContext>) {
        // Settle what is in flight first, so each partition's frontier is final.
        self.drain(DRAIN_TIMEOUT);
        let owned: Vec<(String, i32)> = self
            .slots
            .iter()
            .flatten()
            .filter(|s| s.fault.is_none())
            .map(|s| (s.topic.clone(), s.partition))
            .collect();
        let bounds = self.probe.source(&owned);
        let reading = consumer.position().ok();
        for (topic, partition) in owned {
            let Some(idx) = self.slot_index(&topic, partition) else {
                continue;
            };
            let Some(b) = bounds.get(&(topic.clone(), partition)).copied() else {
                continue;
            };
            let Some(slot) = self.slots[idx].as_ref() else {
                continue;
            };
            let latest = slot.progress.latest();
            let next = match reading
                .as_ref()
                .and_then(|r| r.find_partition(&topic, partition))
                .map(|e| e.offset())
            {
                Some(Offset::Offset(o)) => o,
                _ => match latest {
                    Some(f) => f.next,
                    None => continue,
                },
            };
            let Some((kind, from, to)) = continuity::out_of_range(next, b) else {
                continue;
            };
            let start = Frontier {
                next: b.start,
                downstream: latest.map_or(-1, |f| f.downstream),
            };
            let gap = continuity::found_now(&topic, partition, (kind, from, to));
            self.write_gap(&gap, Some(start));
            let generation = self.bump_generation();
            let config = self.sync_config;
            if let Some(slot) = self.slots[idx].as_mut() {
                slot.generation = generation;
                slot.clear_in_flight();
                slot.progress = Progress::new(
                    TopicPartition::new(topic.clone(), partition),
                    config,
                    Some(start),
                );
                // A failed seek is retried like any rewind.
                slot.fault = Some(Fault {
                    retry_at: Instant::now(),
                    resume_from: Some(start),
                });
            }
        }
        self.retry_faults(consumer);
    }

    fn insert(&mut self, slot: Slot) {
        let Ok(p) = usize::try_from(slot.partition) else {
            return;
        };
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let by_partition = self.by_topic.entry(slot.topic.clone()).or_default();
        if by_partition.len() <= p {
            by_partition.resize(p + 1, None);
        }
        by_partition[p] = Some(idx);
        self.slots[idx] = Some(slot);
    }

    /// Partitions are taken away: finish their writes and store their positions first, so the
    /// next owner resumes exactly where this one stopped.
    fn revoked(&mut self, tpl: &TopicPartitionList, lost: bool) {
        let idxs: Vec<usize> = tpl
            .elements()
            .iter()
            .filter_map(|e| self.slot_index(e.topic(), e.partition()))
            .collect();
        if !lost {
            self.persist_and_wait(&idxs);
        }
        for &idx in &idxs {
            if let Some(slot) = self.slots.get_mut(idx).and_then(Option::take) {
                if let Some(by_partition) = self.by_topic.get_mut(&slot.topic)
                    && let Some(entry) = usize::try_from(slot.partition)
                        .ok()
                        .and_then(|p| by_partition.get_mut(p))
                {
                    *entry = None;
                }
                self.free.push(idx);
            }
        }
        if lost {
            // Another replica may already own them and copy into the same target partitions.
            // Storing would move its positions back, and an offset sync for a copy landing
            // among its copies could translate a group past records it copied: the slots are
            // gone before the outstanding writes finish, so their acknowledgements are ignored.
            tracing::warn!(
                partitions = idxs.len(),
                "assignment lost (session timed out)"
            );
            self.drain(Duration::from_secs(5));
        }
        self.report_assignment();
        self.last_rebalance = Instant::now();
    }

    /// The copy thread did not run for `stalled` (the process was frozen, or starved), long
    /// enough for the group to give its partitions to another replica before this one hears of
    /// it. Copies acknowledged from now on may have landed among the new owner's, so none may
    /// become an offset sync: every partition forgets what is in flight and is copied again
    /// from its last committable position (only duplicates if it was not taken away).
    pub fn stalled(&mut self, stalled: Duration) {
        let idxs: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].is_some())
            .collect();
        if idxs.is_empty() {
            return;
        }
        tracing::warn!(
            ?stalled,
            partitions = idxs.len(),
            "the copy thread stalled past half the session timeout; copying again from the last committable positions"
        );
        for idx in idxs {
            self.fault(idx, "stalled", "stall");
        }
    }

    fn report_assignment(&self) {
        let n = self.slots.iter().flatten().count();
        self.ctx.metrics.assigned_partitions.set(n as i64);
        tracing::info!(partitions = n, "source partitions assigned to this replica");
    }

    /// Graceful stop: finish writes, store every position.
    pub fn stop(&mut self) {
        let idxs: Vec<usize> = (0..self.slots.len()).collect();
        self.persist_and_wait(&idxs);
    }
}

/// The source consumer's `session.timeout.ms` (librdkafka's default 45 s when not set).
fn session_timeout(source: &rdkafka::ClientConfig) -> Duration {
    let ms = source
        .get("session.timeout.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(45_000);
    Duration::from_millis(ms)
}

/// Runs the copy loop until `shutdown`; `subscriptions` carries discovery's topic list.
pub fn run(
    consumer: BaseConsumer<SourceContext>,
    mut subscriptions: tokio::sync::watch::Receiver<Option<Arc<Vec<String>>>>,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
) -> Result<(), KafkaError> {
    let copier = consumer.context().copier.clone();
    let mut subscribed: Option<Arc<Vec<String>>> = None;
    let mut last_persist = Instant::now();
    let mut last_idle_check = Instant::now();
    let mut last_target_check = Instant::now();
    let mut since_service = 0_u32;
    let stall_limit = session_timeout(&ctx.flow.source_client) / 2;
    let mut last_turn = Instant::now();
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
                tracing::debug!(topics = topics.len(), "subscribed");
                subscribed = Some(topics);
                ctx.readiness
                    .source
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        // Short polls while writes are outstanding keep acknowledgements (and positions) fresh.
        let timeout = if lock(&copier).busy() {
            Duration::from_millis(5)
        } else {
            Duration::from_millis(100)
        };
        ctx.readiness.turned(crate::replicator::Loop::Source);
        let polled = consumer.poll(timeout);
        // Checked before anything polled is handled: nothing acknowledged after a freeze may
        // reach an offset sync. Rebalance callbacks (which may wait seconds) reset the clock.
        let turn = last_turn.max(lock(&copier).last_rebalance);
        if turn.elapsed() > stall_limit + timeout {
            lock(&copier).stalled(turn.elapsed());
        }
        last_turn = Instant::now();
        match polled {
            Some(Ok(m)) => {
                let mut c = lock(&copier);
                c.copy(&m);
                since_service += 1;
                if since_service >= SERVICE_EVERY {
                    since_service = 0;
                    c.service(&consumer);
                }
            }
            Some(Err(e)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::AutoOffsetReset) => {
                lock(&copier).offsets_out_of_range(&consumer);
            }
            Some(Err(e)) => {
                ctx.metrics
                    .errors
                    .with_label_values(&["source", "consume"])
                    .inc();
                tracing::debug!(error = %e, "consumer error");
            }
            None => {
                since_service = 0;
                lock(&copier).service(&consumer);
            }
        }
        if last_idle_check.elapsed() >= IDLE_CHECK_EVERY {
            last_idle_check = Instant::now();
            lock(&copier).idle_syncs();
        }
        if last_target_check.elapsed() >= TARGET_CHECK_EVERY {
            last_target_check = Instant::now();
            lock(&copier).check_targets();
        }
        if last_persist.elapsed() >= PERSIST_EVERY {
            last_persist = Instant::now();
            let mut c = lock(&copier);
            c.service(&consumer);
            c.persist();
        }
    }
    tracing::info!("source loop stopping: flushing records and storing positions");
    lock(&copier).stop();
    // Leaving the group revokes everything through `revoked`, which has little left to do.
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

    #[test]
    fn opaque_round_trips_slot_generation_and_kind() {
        for (slot, generation, position) in
            [(0, 0, false), (7, GEN_MASK, true), (123_456, 42, false)]
        {
            assert_eq!(
                unpack(opaque(slot, generation, position)),
                (slot, generation, position)
            );
        }
    }
}
