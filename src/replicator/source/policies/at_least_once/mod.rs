//! At-least-once delivery: an idempotent producer on the target, offset syncs on their own
//! producer, and the position of each partition stored about every second
//! ([`crate::kafka::positions`]).
//!
//! The source offset of an acknowledged record is the front of its slot's in-flight queue
//! ([`acks`]). A failed delivery (record or offset sync) faults the partition: after a backoff
//! it is rewound to its last committable position ([`crate::replicator::source::progress`]) and copied again.
//! Records may repeat, never go missing.

pub mod acks;
mod ownership;

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

use self::acks::{Cause, Fault, InFlight, Slot, Tally, opaque, settle};
use crate::kafka::positions::{self, Gap};
use crate::mm2::{OffsetSync, TopicPartition};
use crate::replicator::source::continuity;
use crate::replicator::source::engine::delivery::{CopiesRecords, Delivery, PolledRecords, Source};
use crate::replicator::source::engine::rebalance::{self, Owner};
use crate::replicator::source::engine::send::{
    self, Ack, AckContext, Landed, Offered, SendError, serve_reports,
};
use crate::replicator::source::engine::shared::{GapWrite, Shared};
use crate::replicator::source::engine::slots::SlotTable;
use crate::replicator::source::engine::tracked::{self, CopyMeters};
use crate::replicator::source::limits::{self, Admit, RemoteLimits};
use crate::replicator::source::progress::{Frontier, Progress};

/// How long a rebalance or shutdown waits for outstanding writes before giving up on them
/// (they are then copied again by whoever owns the partition next).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Wait between two attempts to queue a record while the producer's queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(1);

/// The metrics of delivered records ([`CopyMeters`]), with the wall clock of the reports being
/// settled, for record ages.
struct Meters {
    copy: CopyMeters,
    wall_ms: i64,
}

impl Tally for Meters {
    fn delivered(&mut self, sent: &InFlight, landed: Landed) {
        let age_ms = landed.timestamp.map(|ts| self.wall_ms.saturating_sub(ts));
        self.copy.copied(1, sent.bytes, sent.read_at, age_ms);
    }
}

/// Everything the copy thread mutates in at-least-once mode.
pub struct AtLeastOnce {
    shared: Shared,
    producer: BaseProducer<AckContext>,
    syncs: BaseProducer<AckContext>,
    slots: SlotTable<Slot>,
    acks: Vec<Ack>,
    meters: Meters,
    limits: RemoteLimits,
    /// The largest batch the producer builds ([`limits::batch_cap`]).
    batch_cap: usize,
}

pub struct Parts {
    pub shared: Shared,
    pub producer: BaseProducer<AckContext>,
    pub syncs: BaseProducer<AckContext>,
    pub limits: RemoteLimits,
    pub batch_cap: usize,
}

impl Delivery for AtLeastOnce {
    fn copied(&self) -> Vec<crate::replicator::source::engine::delivery::Copied> {
        crate::replicator::source::engine::stall::tracked(&self.slots)
    }

    /// Positions are stored about every second.
    const COMMIT_EVERY: Duration = Duration::from_secs(1);
    const IDLE_CHECK_EVERY: Duration = Duration::from_millis(50);
    type Feed = PolledRecords;

    /// An atomic read in librdkafka: cheap enough for every poll.
    fn busy(&self) -> bool {
        self.producer.in_flight_count() > 0 || self.syncs.in_flight_count() > 0
    }

    fn service(&mut self, consumer: &Source<Self>) {
        serve_reports(&self.producer);
        self.service_acks();
        self.retry_faults(consumer);
        self.meters.copy.flush();
    }

    fn commit(&mut self, consumer: &Source<Self>) {
        self.service(consumer);
        self.persist(&self.slots.indices());
    }

    /// Writes the tail sync of every owned partition that went idle with acknowledged records
    /// after its last sync ([`Progress::idle_sync`]); one cheap check per partition.
    fn idle_syncs(&mut self) {
        for (idx, generation, sync) in tracked::idle_syncs(&self.shared, &mut self.slots) {
            self.write_sync(idx, generation, &sync);
        }
    }

    /// Finds remote partitions that end before the newest acknowledged copy (the remote topic
    /// was deleted, and discovery created it again) among those not written to right now
    /// (written ones notice from their acknowledgements). One ListOffsets per broker.
    fn check_targets(&mut self) {
        let quiet = |s: &Slot| s.in_flight.is_empty();
        for (idx, from, to) in tracked::rewound_targets(&self.shared, &self.slots, quiet) {
            self.target_rewound(idx, from, to);
        }
    }

    /// The copy thread did not run for `stalled` (the process was frozen, or starved), long
    /// enough for the group to give its partitions to another replica before this one hears of
    /// it. Copies acknowledged from now on may have landed among the new owner's, so none may
    /// become an offset sync: every partition forgets what is in flight and is copied again
    /// from its last committable position (only duplicates if it was not taken away).
    fn stalled(&mut self, stalled: Duration) {
        let idxs = self.slots.indices();
        if idxs.is_empty() {
            return;
        }
        tracing::warn!(
            ?stalled,
            partitions = idxs.len(),
            "the copy thread stalled past half the session timeout; copying again from the last committable positions"
        );
        for idx in idxs {
            self.fault(idx, Cause::Stalled);
        }
    }

    /// Finish writes, store every position.
    fn stop(&mut self) {
        self.persist_and_wait(&self.slots.indices());
    }
}

impl CopiesRecords for AtLeastOnce {
    /// Copies one source record.
    fn copy(&mut self, m: &BorrowedMessage<'_>) {
        let Some((idx, slot)) = self.slots.lookup(m.topic(), m.partition()) else {
            // Not ours (any more): a rebalance moved it; its new owner copies it.
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
        let (mut record, bytes) = send::forward(m, &remote, opaque(idx, generation, false));
        loop {
            match send::offer(&self.producer, record) {
                Offered::Queued => break,
                Offered::Full(back) => {
                    // Backpressure: the target is slower than the source (or away). Retried
                    // as soon as an acknowledgement frees room, not after a fixed poll.
                    record = back;
                    if !self.serve_while_waiting(idx, generation) {
                        return;
                    }
                }
                Offered::Refused(SendError::TooLarge) if alone => {
                    // Over the producer's own `message.max.bytes`: no broker will see it.
                    let limit = self.slots.get(idx).and_then(|s| s.limit);
                    self.reject(idx, m.offset(), bytes, limit);
                    return;
                }
                Offered::Refused(error) => {
                    if matches!(error, SendError::TooLarge)
                        && let Some(slot) = self.slots.get_mut(idx)
                    {
                        slot.alone_until = slot.alone_until.max(m.offset());
                    }
                    self.fault(idx, Cause::Produce { remote, error });
                    return;
                }
            }
        }
        if let Some(slot) = self.slots.get_mut(idx)
            && slot.generation == generation
        {
            slot.push_in_flight(InFlight {
                offset: m.offset(),
                bytes: bytes as u64,
                wire,
                alone,
                read_at: Instant::now(),
            });
        }
        if alone {
            // Nothing may join its batch: wait for its answer before reading on.
            self.wait_for(idx, generation, |s| s.in_flight.is_empty());
        }
    }

    /// The consumer stopped on a partition whose next offset is outside its log
    /// (`auto.offset.reset=error`): find which, record the break and go on past it.
    fn offsets_out_of_range(&mut self, consumer: &Source<Self>) {
        // Settle what is in flight first, so each partition's frontier is final.
        self.drain(DRAIN_TIMEOUT);
        let owned: Vec<(String, i32)> = self
            .slots
            .iter()
            .filter(|(_, s)| s.fault.is_none())
            .map(|(_, s)| (s.topic.clone(), s.partition))
            .collect();
        let bounds = self.shared.probe.source(&owned);
        let reading = consumer.position().ok();
        for key in owned {
            let (topic, partition) = (&key.0, key.1);
            let (Some(idx), Some(b)) = (self.slots.index(topic, partition), bounds.get(&key))
            else {
                continue;
            };
            let latest = self.slots.get(idx).and_then(|s| s.progress.latest());
            let reading_at = (reading.as_ref())
                .and_then(|r| r.find_partition(topic, partition))
                .map(|e| e.offset());
            let next = match (reading_at, latest) {
                (Some(Offset::Offset(o)), _) => o,
                (_, Some(f)) => f.next,
                _ => continue,
            };
            let Some(found) = continuity::out_of_range(next, *b) else {
                continue;
            };
            let start = Frontier {
                next: b.start,
                downstream: latest.map_or(-1, |f| f.downstream),
            };
            let gap = continuity::found_now(topic, partition, found);
            self.restart(idx, Some(start), &gap);
        }
        self.retry_faults(consumer);
    }
}

impl AtLeastOnce {
    pub fn new(p: Parts) -> Self {
        let meters = Meters {
            copy: CopyMeters::new(&p.shared.ctx.metrics),
            wall_ms: 0,
        };
        AtLeastOnce {
            shared: p.shared,
            producer: p.producer,
            syncs: p.syncs,
            slots: SlotTable::default(),
            acks: Vec::with_capacity(4096),
            meters,
            limits: p.limits,
            batch_cap: p.batch_cap,
        }
    }

    /// Holds the copy of the record at `offset` (`wire` bytes) until the partition's queue
    /// leaves room for it under the remote topic's limit ([`limits::admit`]). Returns whether
    /// it goes alone, or `None` when the partition was faulted, moved or the loop is stopping
    /// meanwhile (the record is then copied again later, or by the next owner).
    fn make_room(&mut self, idx: usize, generation: u32, offset: i64, wire: usize) -> Option<bool> {
        loop {
            let slot = self.slots.get_mut(idx)?;
            if !slot.live(generation) {
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
            let Some(slot) = self.slots.get(idx).filter(|s| s.live(generation)) else {
                return false;
            };
            if done(slot) {
                return true;
            }
            if !self.serve_while_waiting(idx, generation) {
                return false;
            }
        }
    }

    /// Waits a moment and serves acknowledgements. False when the slot was faulted or moved
    /// meanwhile, or the loop is stopping.
    fn serve_while_waiting(&mut self, idx: usize, generation: u32) -> bool {
        std::thread::sleep(QUEUE_FULL_WAIT);
        serve_reports(&self.producer);
        self.service_acks();
        let live = self.slots.get(idx).is_some_and(|s| s.live(generation));
        live && !self.shared.shutdown.is_cancelled()
    }

    /// The target refused the record at `offset` (`bytes` long) alone as too large: record
    /// the refusal as a gap and copy on after it. Retrying could never succeed, and stopping
    /// the partition would hold every later record back for one the target cannot take;
    /// records deleted before they were copied are handled the same way.
    fn reject(&mut self, idx: usize, offset: i64, bytes: usize, limit: Option<usize>) {
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        slot.progress.skipped(offset);
        // Stored with the gap, so a restart does not refuse the record again; never past an
        // unacknowledged offset sync.
        let start = slot.progress.committable();
        let (topic, partition) = (slot.topic.clone(), slot.partition);
        let rejected = &self.shared.ctx.metrics.records_rejected;
        rejected.with_label_values(&[&topic]).inc();
        let gap = continuity::found_now(
            &topic,
            partition,
            (
                positions::GapKind::rejected(bytes, limit),
                offset,
                offset.saturating_add(1),
            ),
        );
        self.write_gap(&gap, start);
    }

    fn service_acks(&mut self) {
        serve_reports(&self.syncs);
        self.process_sync_acks();
        self.process_acks();
    }

    fn process_acks(&mut self) {
        let mut acks = std::mem::take(&mut self.acks);
        self.producer.context().take(&mut acks);
        if acks.is_empty() {
            self.acks = acks;
            return;
        }
        self.meters.wall_ms = crate::clock::now_ms();
        let now = self.shared.now();
        let settled = settle(&mut acks, &mut self.slots, now, &mut self.meters);
        self.acks = acks;
        for _ in 0..settled.positions_failed {
            self.count_error("positions");
        }
        if settled.delivered {
            self.shared.target_health.ok();
        }
        for (idx, generation, sync) in settled.syncs {
            self.write_sync(idx, generation, &sync);
        }
        for r in settled.rejected {
            let bytes = usize::try_from(r.bytes).unwrap_or(usize::MAX);
            self.reject(r.idx, r.offset, bytes, r.limit);
        }
        for (idx, cause) in settled.faults {
            self.fault(idx, cause);
        }
        for (idx, from, to) in settled.rewound {
            self.target_rewound(idx, from, to);
        }
    }

    /// The target partition went back under the copies: record it and copy the partition
    /// again from the source's earliest record.
    fn target_rewound(&mut self, idx: usize, from: i64, to: i64) {
        let Some(slot) = self.slots.get(idx) else {
            return;
        };
        let key = (slot.topic.clone(), slot.partition);
        let bounds = self.shared.probe.source(std::slice::from_ref(&key));
        let start = bounds.get(&key).map(|b| Frontier {
            next: b.start,
            downstream: -1,
        });
        let gap =
            continuity::found_now(&key.0, key.1, (positions::GapKind::TargetRewound, from, to));
        self.restart(idx, start, &gap);
    }

    /// Forgets what is in flight (later reports carry the old generation and are ignored),
    /// records `gap` with `start`, and copies the partition again from `start` at once (a
    /// failed seek is retried like any rewind).
    fn restart(&mut self, idx: usize, start: Option<Frontier>, gap: &Gap) {
        let generation = self.slots.next_generation();
        let config = self.shared.sync_config;
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        slot.generation = generation;
        slot.clear_in_flight();
        let tp = TopicPartition::new(gap.topic.clone(), gap.partition);
        slot.progress = Progress::new(tp, config, start);
        slot.fault = Some(Fault {
            retry_at: Instant::now(),
            resume_from: start,
        });
        self.write_gap(gap, start);
    }

    fn process_sync_acks(&mut self) {
        for (idx, e) in tracked::settle_syncs(&self.shared, &self.syncs, &mut self.slots) {
            let (topic, error) = (self.shared.syncs_topic.clone(), SendError::Kafka(e));
            self.fault(idx, Cause::Sync { topic, error });
        }
    }

    fn write_sync(&mut self, idx: usize, generation: u32, sync: &OffsetSync) {
        // Record acks are not served while it waits for room, so this cannot recurse.
        let opaque = opaque(idx, generation, false);
        if let Err(error) = self.shared.write_sync(&self.syncs, sync, opaque) {
            let topic = self.shared.syncs_topic.clone();
            self.fault(idx, Cause::Sync { topic, error });
        }
    }

    /// A write of this partition failed: forget what is in flight and, after a backoff, copy
    /// again from the last committable position.
    fn fault(&mut self, idx: usize, cause: Cause) {
        self.count_error(cause.kind());
        let generation = self.slots.next_generation();
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        if slot.fault.is_none() {
            tracing::warn!(topic = %slot.topic, partition = slot.partition, reason = %cause,
                "copy failed; the partition will be copied again from its last safe position");
        }
        slot.generation = generation;
        slot.last_fault = Some(cause.to_string());
        slot.clear_in_flight();
        let resume_from = slot.progress.rewind();
        slot.fault = Some(Fault {
            retry_at: Instant::now() + slot.backoff.next_delay(),
            resume_from,
        });
    }

    fn retry_faults(&mut self, consumer: &Source<Self>) {
        let now = Instant::now();
        for (_, slot) in self.slots.iter_mut() {
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
                    slot.retry_later(now);
                }
            }
        }
    }

    /// Writes the position of each of `idxs` whose committable point moved.
    fn persist(&mut self, idxs: &[usize]) {
        tracked::persist(&self.shared, &self.producer, &mut self.slots, idxs);
    }

    /// Waits until every record and sync written so far is acknowledged (or `timeout`); the
    /// syncs that acknowledgements ask for are written and waited for too.
    fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            self.service_acks();
            if !self.busy() {
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    records = self.producer.in_flight_count(),
                    syncs = self.syncs.in_flight_count(),
                    "writes still unacknowledged after {timeout:?}; their records will be copied again"
                );
                return;
            }
            self.producer.poll(Duration::from_millis(10));
        }
    }

    /// Stores positions of `idxs` and waits for the target to acknowledge them.
    fn persist_and_wait(&mut self, idxs: &[usize]) {
        self.drain(DRAIN_TIMEOUT);
        self.persist(idxs);
        if let Err(e) = self.producer.flush(DRAIN_TIMEOUT) {
            tracing::warn!(error = %e, "flushing source positions failed");
        }
        self.service_acks();
    }

    /// Records a break and, with it, the position copying resumes from (so a restart before
    /// the next stored position does not find the same break again).
    fn write_gap(&mut self, gap: &Gap, start: Option<Frontier>) {
        self.shared
            .record_gap(&self.producer, gap, start, GapWrite::Flush);
    }
}
