//! Aligned copying (`spec.offsets: Aligned`): every copied record gets, on the target, the
//! offset it has on the source, so consumers fail over by reusing their numbers.
//!
//! # How the numbers are kept
//! The source consumer reads `read_committed`, so it sees visible records only; every other
//! offset (markers, aborted records, compaction holes) is a jump between two records. The
//! target takes the same number of offsets there with writes its `read_committed` readers
//! never see ([`plan`]): aborted transactions of fillers, and the commit marker of a
//! transaction wrapping the record before a jump of one. That is why the newest record of a
//! partition is held back until the next offset is known (the next record, or the consumer's
//! position once the partition has been quiet for [`HOLD_QUIET`]). A new remote partition
//! starts where the source log starts: fillers, then DeleteRecords.
//!
//! Plain records go through the shared idempotent producer, asynchronously; transactions go
//! through a transactional producer of the partition's own, after the partition's plain
//! writes are acknowledged (order across two producers is only kept by waiting). A planned
//! transaction waits ([`pending`]) while the other partitions are copied on, and the waiting
//! transactions of every partition then run side by side: one after another on the copy
//! thread, a transactional topic was copied at one commit marker per few round trips for the
//! whole replica. The transactional id also fences a previous writer of the partition (a
//! replica that lost it) before the new owner reads where the target ends.
//!
//! # Resume
//! The target's log end IS the next source offset to copy: no stored position is needed to
//! resume, and a stored position never moves a partition backwards. Positions are still
//! stored (the status reads replication lag from them), and offset syncs still written, so
//! MirrorMaker 2's tools and the checkpoint loop keep working.
//!
//! # When alignment breaks
//! Every acknowledgement is compared with the offset the record has on the source. A record
//! that lands elsewhere (another writer on the remote topic), a remote partition that holds
//! records the flow did not write, or a source that went back under the copies: the break is
//! recorded as a [`GapKind::Misaligned`] gap (the status's `OffsetsAligned` condition) and the
//! partition is copied on with translated offsets, its offset syncs carrying the new delta.
//! Never silently misaligned.

mod hanging;
mod held;
mod ownership;
mod pending;
pub mod plan;
mod restart;
mod resume;
mod settle;
mod slot;
mod tail;
mod write;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, OwnedMessage};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use self::held::{Hold, Pending};
use self::plan::Step;
use self::slot::{AlignedPart, AlignedSlot, InFlight, LOG_START_FILLER, State};
use crate::kafka::admin::Admin;
use crate::kafka::positions::{self, Frontier, Gap, GapKind};
use crate::mm2::{OffsetSync, SyncPolicy, TopicPartition};
use crate::replicator::backoff::Backoff;
use crate::replicator::patience::Patience;
use crate::replicator::source::continuity::{self};
use crate::replicator::source::engine::delivery::{CopiesRecords, Delivery, PolledRecords, Source};
use crate::replicator::source::engine::rebalance::{self, Owner};
use crate::replicator::source::engine::send::{self, Ack, AckContext, Offered, serve_reports};
use crate::replicator::source::engine::shared::{GapWrite, Shared};
use crate::replicator::source::engine::slots::{Slot, SlotTable, opaque, unpack};

/// The header every filler carries, for `read_uncommitted` readers (value: empty); also its
/// key.
/// How long a partition's newest record is held back once nothing more arrives, before the
/// consumer's position decides how it is written (once it reached the high watermark). Longer
/// than a fetch round (`fetch.wait.max.ms`, 100 ms by default), so a commit marker right after
/// it has been seen.
pub const HOLD_QUIET: Duration = Duration::from_millis(300);
/// The most fillers written to align a new remote partition with the source's log start;
/// beyond, the partition is copied with translated offsets (writing more would take minutes).
const MAX_LOG_START_FILL: i64 = 20_000_000;
/// The first limit of a watermark look-up ([`Patience`]).
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(2);
const MARKER_POLL: Duration = Duration::from_millis(1);
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(1);

/// The aligned policy: what the copy thread mutates.
pub struct Aligned {
    shared: Shared,
    producer: BaseProducer<AckContext>,
    syncs: BaseProducer<AckContext>,
    producer_base: ClientConfig,
    watermarks: BaseConsumer,
    /// How long the source's look-ups wait.
    source_patience: Patience,
    target_watermarks: BaseConsumer,
    /// How long the target's look-ups wait.
    target_patience: Patience,
    target_admin: Admin,
    runtime: tokio::runtime::Handle,
    slots: SlotTable<AlignedSlot>,
    acks: Vec<Ack>,
    /// Some partition may have a transaction waiting ([`pending`]): polls stay short.
    deferred: bool,
    /// Bytes queued behind waiting transactions (at least; counted again after each run).
    queued: usize,
    /// The waiting transactions are being written ([`Aligned::run_pending`] is not re-entered).
    running: bool,
}

pub struct Parts {
    pub shared: Shared,
    pub producer: BaseProducer<AckContext>,
    pub syncs: BaseProducer<AckContext>,
    /// The target producer's settings, for the partitions' transactional producers.
    pub producer_base: ClientConfig,
    /// A `read_uncommitted` client of the source: its high watermarks include open
    /// transactions (a `read_committed` one answers the last stable offset instead).
    pub watermarks: BaseConsumer,
    /// The same on the target, to see a transaction's marker written.
    pub target_watermarks: BaseConsumer,
    pub target_admin: Admin,
    pub runtime: tokio::runtime::Handle,
}

impl Delivery for Aligned {
    fn copied(&self) -> Vec<crate::replicator::source::engine::delivery::Copied> {
        self.slots.iter().map(|(_, s)| s.copied()).collect()
    }

    const COMMIT_EVERY: Duration = Duration::from_secs(1);
    const IDLE_CHECK_EVERY: Duration = Duration::from_millis(50);
    type Feed = PolledRecords;

    fn busy(&self) -> bool {
        self.deferred || self.producer.in_flight_count() > 0 || self.syncs.in_flight_count() > 0
    }

    fn service(&mut self, consumer: &Source<Self>) {
        self.service_acks();
        self.release_quiet(consumer);
        self.run_pending();
        self.retry_unready(consumer);
    }

    fn commit(&mut self, consumer: &Source<Self>) {
        self.service(consumer);
        self.persist();
    }

    fn idle_syncs(&mut self) {
        let now = self.shared.now();
        let mut due = Vec::new();
        for (idx, slot) in self.slots.iter_mut() {
            if slot.copying()
                && slot.in_flight.is_empty()
                && let Some(sync) = slot.sync.idle_sync(now)
            {
                due.push((idx, slot.generation, sync));
            }
        }
        for (idx, generation, sync) in due {
            self.write_sync(idx, generation, &sync);
        }
    }

    /// A remote partition that ends before the copies (recreated) is prepared again, which
    /// aligns it anew; one that ends after them has another writer.
    fn check_targets(&mut self) {
        let idle = self
            .slots
            .iter()
            .filter(|(_, s)| s.state == State::Aligned && s.in_flight.is_empty())
            .map(|(idx, s)| ((idx, s.next_target), s.remote.to_string(), s.partition))
            .collect();
        for ((idx, next_target), end) in self.shared.probe.remote_ends(idle) {
            if end < next_target {
                let Some(slot) = self.slots.get(idx) else {
                    continue;
                };
                let gap = continuity::found_now(
                    &slot.topic,
                    slot.partition,
                    (GapKind::TargetRewound, next_target, end),
                );
                self.write_gap(&gap);
                self.prepare_again(idx, Duration::ZERO);
            } else if end > next_target {
                self.misaligned(idx, next_target, end);
            }
        }
    }

    fn stop(&mut self) {
        self.drain(DRAIN_TIMEOUT);
        self.persist();
        if let Err(e) = self.producer.flush(DRAIN_TIMEOUT) {
            tracing::warn!(error = %e, "flushing source positions failed");
        }
    }
}

impl CopiesRecords for Aligned {
    fn copy(&mut self, m: &BorrowedMessage<'_>) {
        let Some((idx, _)) = self.slots.lookup(m.topic(), m.partition()) else {
            return;
        };
        self.copy_record(idx, m);
    }

    /// The source deleted records before they were read: prepared again, which aligns the
    /// partition with the new log start and records what was lost.
    fn offsets_out_of_range(&mut self, _consumer: &Source<Self>) {
        for idx in self.slots.indices() {
            self.prepare_again(idx, Duration::ZERO);
        }
    }
}

impl Aligned {
    pub fn new(p: Parts) -> Self {
        Aligned {
            shared: p.shared,
            producer: p.producer,
            syncs: p.syncs,
            producer_base: p.producer_base,
            watermarks: p.watermarks,
            source_patience: Patience::new(WATERMARK_TIMEOUT, CALL_TIMEOUT),
            target_watermarks: p.target_watermarks,
            target_patience: Patience::new(WATERMARK_TIMEOUT, CALL_TIMEOUT),
            target_admin: p.target_admin,
            runtime: p.runtime,
            slots: SlotTable::default(),
            acks: Vec::with_capacity(4096),
            deferred: false,
            queued: 0,
            running: false,
        }
    }

    /// Copies a record of the partition at `idx`: after the partition's waiting transaction
    /// if it has one, held back (aligned), or as it is (translated).
    fn copy_record<M: Hold>(&mut self, idx: usize, m: &M) {
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        if slot.pending.is_some() {
            self.queue_behind(idx, m.hold(), true);
            return;
        }
        match slot.state {
            State::Preparing { .. } => {}
            State::Translated => self.copy_translated(idx, m),
            State::Aligned => {
                let (held, next_target) = (slot.held.is_some(), slot.next_target);
                let Some(steps) = plan::plan(held, next_target, m.offset()) else {
                    // The source went back under the copies (read again after a seek?).
                    self.misaligned(idx, m.offset(), -1);
                    return;
                };
                let applied = self.apply(idx, &steps, m.timestamp().to_millis());
                match self.slots.get_mut(idx) {
                    // Held once the transaction before it is written.
                    Some(slot)
                        if slot.state == State::Aligned && applied && slot.pending.is_some() =>
                    {
                        self.queue_behind(idx, m.hold(), false);
                    }
                    Some(slot) if slot.state == State::Aligned && applied => {
                        slot.held = Some(m.hold());
                        slot.read_at = Instant::now();
                    }
                    // Alignment broke on the way: this record goes on translated.
                    Some(slot) if slot.state == State::Translated => self.copy_translated(idx, m),
                    _ => {}
                }
            }
        }
    }

    fn copy_translated<M: Hold>(&mut self, idx: usize, m: &M) {
        let Some(slot) = self.slots.get(idx) else {
            return;
        };
        let (generation, remote) = (slot.generation, slot.remote.clone());
        let (record, bytes) = send::forward(m, &remote, opaque(idx, generation, false));
        self.send_plain(idx, generation, record, m.offset(), -1, bytes as u64);
    }

    fn service_acks(&mut self) {
        serve_reports(&self.producer);
        serve_reports(&self.syncs);
        self.process_sync_acks();
        self.process_acks();
    }

    fn process_acks(&mut self) {
        let mut acks = std::mem::take(&mut self.acks);
        self.producer.context().take(&mut acks);
        let settled = settle::settle(&mut self.slots, &acks, self.shared.now());
        acks.clear();
        self.acks = acks;
        for kind in settled.errors {
            self.count_error(kind);
        }
        if settled.delivered {
            self.shared.target_health.ok();
        }
        let m = &self.shared.ctx.metrics;
        m.records_replicated.inc_by(settled.copied.0);
        m.bytes_replicated.inc_by(settled.copied.1);
        for (idx, generation, sync) in settled.syncs {
            self.write_sync(idx, generation, &sync);
        }
        for (idx, expected, landed) in settled.misaligned {
            self.misaligned(idx, expected, landed);
        }
        for (idx, reason) in settled.failed {
            self.fault(idx, &reason);
        }
    }

    fn process_sync_acks(&mut self) {
        let mut acks = Vec::new();
        self.syncs.context().take(&mut acks);
        for ack in acks {
            if let Err(e) = ack.result {
                let (idx, _, _) = unpack(ack.opaque);
                tracing::warn!(error = %e, topic = %self.shared.syncs_topic, "an offset sync failed");
                self.fault(idx, "offset sync failed");
            } else {
                self.shared.ctx.metrics.offset_syncs.inc();
            }
        }
    }

    fn write_sync(&mut self, idx: usize, generation: u32, sync: &OffsetSync) {
        let opaque = opaque(idx, generation, false);
        if let Err(e) = self.shared.write_sync(&self.syncs, sync, opaque) {
            self.fault(idx, &format!("offset sync: {e}"));
        }
    }

    /// Serves reports until the partition's plain writes are acknowledged. False when it
    /// stopped copying meanwhile, or the loop is stopping.
    fn wait_drained(&mut self, idx: usize, generation: u32) -> bool {
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        loop {
            match self.slots.get(idx) {
                Some(s) if s.generation == generation && s.copying() => {
                    if s.in_flight.is_empty() {
                        return true;
                    }
                }
                _ => return false,
            }
            if self.shared.shutdown.is_cancelled() {
                return false;
            }
            if Instant::now() >= deadline {
                self.fault(idx, "plain writes unacknowledged before a transaction");
                return false;
            }
            self.producer.poll(QUEUE_FULL_WAIT);
            self.service_acks();
        }
    }

    fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.producer.in_flight_count() > 0 || self.syncs.in_flight_count() > 0 {
            if Instant::now() >= deadline {
                break;
            }
            self.producer.poll(Duration::from_millis(10));
            self.service_acks();
        }
        self.service_acks();
    }

    /// Held records of partitions quiet for [`HOLD_QUIET`] are written once the consumer's
    /// position shows what follows them (nothing yet, or a jump).
    fn release_quiet(&mut self, consumer: &Source<Self>) {
        let quiet: Vec<usize> = self
            .slots
            .iter()
            .filter(|(_, s)| {
                s.state == State::Aligned && s.held.is_some() && s.read_at.elapsed() >= HOLD_QUIET
            })
            .map(|(idx, _)| idx)
            .collect();
        if quiet.is_empty() {
            return;
        }
        let Ok(position) = consumer.position() else {
            return;
        };
        // (slot, the consumer's position) of each quiet partition read past its held record.
        let mut due = Vec::new();
        for idx in quiet {
            let Some(slot) = self.slots.get(idx) else {
                continue;
            };
            let Some(Offset::Offset(next)) = position
                .find_partition(&slot.topic, slot.partition)
                .map(|e| e.offset())
            else {
                continue;
            };
            let Some(held) = slot.held.as_ref().map(Message::offset) else {
                continue;
            };
            // Only once the consumer has everything the partition holds: a position short of
            // the high watermark means an open transaction (or a fetch in progress) lies ahead,
            // and a jump of one after it would then find nothing held to wrap.
            if next > held {
                due.push((idx, next));
            }
        }
        if due.is_empty() {
            return;
        }
        let highs = self.high_watermarks(&due);
        for (idx, next) in due {
            let Some(slot) = self.slots.get_mut(idx) else {
                continue;
            };
            let high = highs
                .get(&(slot.topic.clone(), slot.partition))
                .copied()
                .unwrap_or(i64::MAX);
            if next < high {
                slot.read_at = Instant::now();
                continue;
            }
            let timestamp = slot.held.as_ref().and_then(|h| h.timestamp().to_millis());
            if let Some(steps) = plan::plan(true, slot.next_target, next) {
                self.apply(idx, &steps, timestamp);
            }
        }
    }

    /// The source's high watermarks of the slots `due` names: one ListOffsets request per
    /// broker for all of them, at most once per quiet period of each partition. Partitions
    /// whose answer is missing are left out (their held records wait for the next round).
    fn high_watermarks(&self, due: &[(usize, i64)]) -> HashMap<(String, i32), i64> {
        let mut tpl = TopicPartitionList::new();
        for (idx, _) in due {
            if let Some(slot) = self.slots.get(*idx)
                && tpl
                    .add_partition_offset(&slot.topic, slot.partition, Offset::End)
                    .is_err()
            {
                return HashMap::new();
            }
        }
        let asked = (self.source_patience).ask(CALL_TIMEOUT, |limit| {
            self.watermarks.offsets_for_times(tpl, limit)
        });
        let Ok(answer) = asked else {
            return HashMap::new();
        };
        answer
            .elements()
            .iter()
            .filter(|e| e.error().is_ok())
            .filter_map(|e| match e.offset() {
                Offset::Offset(high) => Some(((e.topic().to_string(), e.partition()), high)),
                _ => None,
            })
            .collect()
    }

    /// The partition's alignment broke at source offset `at` (the record landed at `landed`,
    /// or -1: it cannot be aligned there): recorded, and copied on translated.
    fn misaligned(&mut self, idx: usize, at: i64, landed: i64) {
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        if slot.state != State::Aligned {
            return;
        }
        slot.state = State::Translated;
        let (topic, partition) = (slot.topic.clone(), slot.partition);
        // What is held, or waits for a transaction, is copied plain now; a jump after it can
        // no longer be filled.
        let held = slot.held.take();
        let pending = slot.pending.take();
        tracing::warn!(%topic, partition, source_offset = at, target_offset = landed,
            "offsets of the remote partition no longer match the source; translating from here");
        self.count_error("misaligned");
        let gap = continuity::found_now(&topic, partition, (GapKind::Misaligned, at, landed));
        self.write_gap(&gap);
        if let Some(h) = held
            && let Some(slot) = self.slots.get(idx)
        {
            let (generation, remote) = (slot.generation, slot.remote.clone());
            let (record, bytes) = send::forward(&h, &remote, opaque(idx, generation, false));
            self.send_plain(idx, generation, record, h.offset(), -1, bytes as u64);
        }
        if let Some(pending) = pending {
            for m in pending.into_records() {
                self.copy_translated(idx, &m);
            }
        }
    }

    /// A write failed: forget what is in flight and prepare the partition again after a
    /// backoff (it resumes where the target ends).
    fn fault(&mut self, idx: usize, reason: &str) {
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        if !slot.copying() {
            return;
        }
        tracing::warn!(topic = %slot.topic, partition = slot.partition, %reason,
            "an aligned copy failed; the partition resumes where the target ends");
        let delay = slot.backoff.next_delay();
        self.count_error("produce");
        self.prepare_again(idx, delay);
    }

    fn prepare_again(&mut self, idx: usize, delay: Duration) {
        let generation = self.slots.next_generation();
        if let Some(slot) = self.slots.get_mut(idx) {
            slot.generation = generation;
            slot.in_flight.clear();
            slot.held = None;
            // Read again from where the target ends.
            slot.pending = None;
            slot.state = State::Preparing {
                retry_at: Instant::now() + delay,
            };
        }
    }

    /// Writes the position of every partition whose frontier moved.
    fn persist(&mut self) {
        for idx in self.slots.indices() {
            let Some(slot) = self.slots.get_mut(idx) else {
                continue;
            };
            if !slot.copying() || slot.latest == slot.stored {
                continue;
            }
            let Some(position) = slot.latest else {
                continue;
            };
            let key = positions::encode_key(&slot.topic, slot.partition);
            let value = positions::encode_value(position);
            let record = send::internal(
                &self.shared.positions_topic,
                &key,
                &value,
                opaque(idx, slot.generation, true),
            );
            match send::offer(&self.producer, record) {
                Offered::Queued => slot.stored = Some(position),
                _ => self.count_error("positions"),
            }
        }
    }

    /// Records a break in the positions topic (where the status finds it).
    fn write_gap(&mut self, gap: &Gap) {
        self.shared
            .record_gap(&self.producer, gap, None, GapWrite::Flush);
    }
}

#[cfg(test)]
mod stall_tests {
    use super::*;
    use crate::replicator::source::engine::stall::caught_up_by_reading;

    /// The consumer read past a commit marker at 1339 after the last record, at 1338.
    fn seen_after_the_last_marker(state: State, held: bool) -> i64 {
        let (mut slots, idx, _) = settle::tests::table(&[]);
        let slot = slots.get_mut(idx).expect("the partition");
        slot.state = state;
        slot.latest = Some(Frontier {
            next: 1339,
            downstream: 1339,
        });
        if held {
            slot.held = Some(
                OwnedMessage::new(
                    None,
                    None,
                    "t".into(),
                    rdkafka::Timestamp::NotAvailable,
                    0,
                    1339,
                    None,
                )
                .hold(),
            );
        }
        let read: HashMap<(String, i32), i64> = [(("t".to_string(), 0), 1340)].into();
        caught_up_by_reading(vec![slot.copied()], &read)[0].next
    }

    #[test]
    fn a_copy_with_nothing_in_hand_is_where_the_consumer_read() {
        // Translated after a break, the partition's copy ends before the source's trailing
        // marker: the consumer read past it, so the partition is not stalled.
        assert_eq!(seen_after_the_last_marker(State::Translated, false), 1340);
        assert_eq!(seen_after_the_last_marker(State::Aligned, false), 1340);
        // A record held back is not copied, wherever the consumer read.
        assert_eq!(seen_after_the_last_marker(State::Aligned, true), 1339);
        let preparing = State::Preparing {
            retry_at: Instant::now(),
        };
        assert_eq!(seen_after_the_last_marker(preparing, false), 1339);
    }
}
