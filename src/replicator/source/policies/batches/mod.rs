//! Batch copy (`spec.sourceLoop.copy: Batches`): the source's record batches written to the
//! target whole, at least once, with translated offsets.
//!
//! The source group still decides who copies what: librdkafka's consumer joins it as in the
//! other policies, but every partition it is given is paused at once, so it fetches nothing.
//! A [`FetchThread`] fetches the owned partitions' batches `read_committed` from their
//! leaders ([`mirrorflow_conn::Fetcher`]: aborted transactions and markers left out), and the
//! copy thread hands them to a [`Writer`], which restamps each one for its own idempotent
//! producer and writes it to the remote partition's leader. Compressed records are never
//! decompressed but in small or unwritable batches: that is the CPU this mode saves.
//!
//! Everything else is the at-least-once bookkeeping ([`Progress`]): a written batch of `n`
//! records at target offset `t` acknowledges the run of its source offsets at `t..t+n`, offset
//! syncs follow the dense policy (one per delta change; a batch's records share one delta),
//! positions are stored about every second in the positions topic, and a failed write or sync
//! rewinds its partition to the last committable position.
//!
//! A batch the target could not take as it is (records compacted away leave gaps in its
//! offsets, which a producer's batch may not have; a log-append-time batch carries the source
//! broker's time; one larger than the remote topic's `max.message.bytes`) is written anew
//! ([`prepare`]): one batch per run of contiguous offsets, split under the limit, so nothing
//! stops for the shape of a topic's batches and offset syncs stay exact. What cannot be written
//! at all (a record alone over the limit, records that do not decode) and what the target
//! refuses stops its partition ([`Stop`]): it is named to the operator, which shows it in
//! `Replicating`, and tried again with a growing backoff, so a fixed cause (a larger
//! `max.message.bytes`) resumes it. Runs of small batches are merged ([`merge`]): a produce
//! request carries one batch per partition, so a partition written a record at a time would
//! otherwise cost a request (and an append on the target) per small batch.

mod merge;
mod ownership;
pub mod prepare;
mod settle;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use mirrorflow_conn::fetcher::{PartitionTrouble, Trouble};
use mirrorflow_conn::writer::{Item, Progress as Written};
use mirrorflow_conn::{FetchLimits, Writer};
use mirrorflow_core::protocol::ErrorCode;
use rdkafka::producer::{BaseProducer, Producer};

use self::prepare::{Prepared, Ready, Reason, Stop, Target, Token};
use crate::kafka::log_bounds::LogBounds;
use crate::kafka::positions::{Gap, GapKind};
use crate::kafka::refusals::Refusal;
use crate::mm2::{OffsetSync, TopicPartition};
use crate::replicator::backoff::Backoff;
use crate::replicator::source::continuity;
use crate::replicator::source::engine::delivery::{Delivery, FetchedBatches, Source};
use crate::replicator::source::engine::fetcher::{Command, FetchThread, Tagged};
use crate::replicator::source::engine::send::{Ack, AckContext, serve_reports};
use crate::replicator::source::engine::shared::{GapWrite, Shared};
use crate::replicator::source::engine::slots::{SlotTable, opaque, unpack};
use crate::replicator::source::engine::timing;
use crate::replicator::source::engine::tracked::{self, CopyMeters, Fault, TrackedSlot, Tracking};
use crate::replicator::source::limits::RemoteLimits;
use crate::replicator::source::progress::{Frontier, Progress};
use crate::replicator::stops::Stops;
use crate::replicator::stops::lock;

/// How long one [`Delivery::service`] call moves batches before the consumer is polled again
/// (rebalances wait at most that long).
const SLICE: Duration = Duration::from_millis(50);
/// Bytes of batches handed to the writer and not yet answered: beyond them no fetched round is
/// taken. What the target needs in flight does not grow with the source's distance, so this
/// is a size of its own (four fetches near the source), at least one fetch of a far source's
/// larger window. With the rounds queued behind ([`fetch`]), what a copy holds is a few fetch
/// answers, whatever the partition count.
const PENDING_BYTES: u64 = 16 << 20;
/// How long a rebalance or shutdown waits for outstanding writes.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Backoff of a faulted partition: a stopped one is tried again at most this rarely.
/// How long a partition may get only part of the batch at its offset before it stops.
const TOO_LARGE_FOR: Duration = Duration::from_secs(30);

/// Another round brought only part of the batch at `offset`: since when that has been so at
/// this offset, and whether it has been so for too long.
fn too_large_for_long(
    since: Option<(i64, Instant)>,
    offset: i64,
    now: Instant,
) -> ((i64, Instant), bool) {
    match since {
        Some((at, first)) if at == offset => (
            (at, first),
            now.saturating_duration_since(first) >= TOO_LARGE_FOR,
        ),
        _ => ((offset, now), false),
    }
}
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// What this policy keeps of an owned partition besides the engine's and the tracking's parts.
#[derive(Debug, Default)]
pub struct Part {
    /// Stopped at this source offset, and named in the stops, until a batch reaching it is
    /// written.
    stopped: Option<i64>,
    /// Stopped, and since when it waits for the batches before the stop to be acknowledged
    /// before it faults ([`Batches::settle_stops`]).
    stop_waits_since: Option<Instant>,
    /// Since when the fetcher has answered only part of the batch at this offset: a batch
    /// larger than a fetch may bring, which no later round brings either.
    too_large_since: Option<(i64, Instant)>,
}

/// One owned source partition.
pub type Slot = TrackedSlot<Part>;

pub struct Parts {
    pub shared: Shared,
    /// Positions and breaks (a librdkafka producer on the target).
    pub producer: BaseProducer<AckContext>,
    pub syncs: BaseProducer<AckContext>,
    pub writer: Writer<Token>,
    pub source: mirrorflow_conn::Cluster,
    pub limits: FetchLimits,
    pub stops: Stops,
    /// The remote topics' `max.message.bytes`, as discovery reads them.
    pub remote_limits: RemoteLimits,
}

/// Bytes handed to the writer and not answered yet: every batch comes back once, written or
/// in a fault, whatever its generation.
#[derive(Debug, Default)]
struct Pending {
    bytes: u64,
    limit: u64,
}

impl Pending {
    fn room(&self) -> bool {
        self.bytes < self.limit
    }
    fn add(&mut self, t: &Token) {
        self.bytes = self.bytes.saturating_add(t.bytes);
    }
    fn answered(&mut self, t: &Token) {
        self.bytes = self.bytes.saturating_sub(t.bytes);
    }
}

pub struct Batches {
    shared: Shared,
    producer: BaseProducer<AckContext>,
    syncs: BaseProducer<AckContext>,
    writer: Writer<Token>,
    fetch: FetchThread,
    slots: SlotTable<Slot>,
    acks: Vec<Ack>,
    meters: CopyMeters,
    stops: Stops,
    remote_limits: RemoteLimits,
    pending: Pending,
    timing: timing::TimeSplit,
}

impl Batches {
    pub fn new(p: Parts) -> std::io::Result<Self> {
        let name = format!("fetch-{}", p.shared.worker.index());
        let fetch_bytes = u64::try_from(p.limits.max_bytes.max(1)).unwrap_or(1);
        let pending = Pending {
            bytes: 0,
            limit: fetch_bytes.max(PENDING_BYTES),
        };
        let fetch = FetchThread::spawn(p.source, p.limits, name)?;
        let meters = CopyMeters::new(&p.shared.ctx.metrics);
        Ok(Batches {
            shared: p.shared,
            producer: p.producer,
            syncs: p.syncs,
            writer: p.writer,
            fetch,
            slots: SlotTable::default(),
            acks: Vec::with_capacity(256),
            meters,
            stops: p.stops,
            remote_limits: p.remote_limits,
            pending,
            timing: timing::TimeSplit::new("copy", ["writing", "waiting for rounds"]),
        })
    }
}

impl Delivery for Batches {
    fn copied(&self) -> Vec<crate::replicator::source::engine::delivery::Copied> {
        crate::replicator::source::engine::stall::tracked(&self.slots)
    }

    const COMMIT_EVERY: Duration = Duration::from_secs(1);
    const IDLE_CHECK_EVERY: Duration = Duration::from_millis(50);
    type Feed = FetchedBatches;

    fn busy(&self) -> bool {
        !self.slots.is_empty()
    }

    /// While partitions are owned the consumer only brings rebalances: it is polled without
    /// waiting between slices of batch work, which wait for the fetcher and the target
    /// themselves ([`Delivery::service`]).
    fn poll_timeout(&self) -> Duration {
        if self.busy() {
            Duration::ZERO
        } else {
            crate::replicator::source::engine::delivery::IDLE_POLL
        }
    }

    fn service(&mut self, _consumer: &Source<Self>) {
        let until = Instant::now() + SLICE;
        loop {
            while self.pending.room() {
                match self.fetch.rounds.try_recv() {
                    Ok(round) => self.take(round),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return self.fetching_ended(),
                }
            }
            if self.writer.pending() > 0 {
                let pumping = Instant::now();
                let written = self.writer.pump();
                self.timing.spent(0, pumping);
                self.settle(written);
            }
            self.serve_acks();
            let now = Instant::now();
            if now >= until || self.shared.shutdown.is_cancelled() {
                break;
            }
            if self.writer.pending() == 0 {
                let waiting = Instant::now();
                let next = self.fetch.rounds.recv_timeout(until - now);
                self.timing.spent(1, waiting);
                match next {
                    Ok(round) => self.take(round),
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return self.fetching_ended(),
                }
            }
        }
        self.settle_stops();
        self.retry_faults();
        self.meters.flush();
    }

    fn commit(&mut self, consumer: &Source<Self>) {
        self.service(consumer);
        self.persist(&self.slots.indices());
    }

    fn idle_syncs(&mut self) {
        for (idx, generation, sync) in tracked::idle_syncs(&self.shared, &mut self.slots) {
            self.write_sync(idx, generation, &sync);
        }
    }

    /// Remote partitions that end before the newest written copy (the remote topic was deleted
    /// and created again): copied again from the source's log start. Only partitions with
    /// nothing pending are asked about (the writer's answers tell about the others).
    fn check_targets(&mut self) {
        if self.writer.pending() > 0 {
            return;
        }
        let rewound = tracked::rewound_targets(&self.shared, &self.slots, |_| true);
        let idxs: Vec<usize> = rewound.iter().map(|&(idx, _, _)| idx).collect();
        let starts = self.source_starts(&idxs);
        for (idx, from, to) in rewound {
            let start = starts.get(&idx).map(|&next| Frontier {
                next,
                downstream: -1,
            });
            self.restart(idx, start, (GapKind::TargetRewound, from, to));
        }
    }

    /// See [`super::at_least_once`]: nothing written after a freeze may become an offset sync.
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
            self.fault(idx, "stall", "the copy thread stalled");
        }
    }

    fn stop(&mut self) {
        self.persist_and_wait(&self.slots.indices());
    }
}

impl Batches {
    /// Hands a fetched round's batches to the writer; troubles fault or move their partition.
    fn take(&mut self, round: Tagged) {
        self.timing.round(round.bytes());
        if let Some(failure) = &round.failure {
            self.count_error("consume");
            self.shared
                .source_health
                .unreachable("fetching record batches", failure);
        } else if !round.fetched.is_empty() {
            self.shared.source_health.ok();
        }
        let out_of_range: Vec<(usize, i64)> = (round.troubles.iter())
            .filter_map(|(generation, t)| self.trouble(*generation, t))
            .collect();
        if !out_of_range.is_empty() {
            self.out_of_range(&out_of_range);
        }
        let read_at = Instant::now();
        let mut budget = merge::ROUND_INFLATE_LIMIT;
        for (generation, f) in round.fetched {
            let Some(idx) = self.slots.index(&f.topic, f.partition) else {
                continue;
            };
            let Some(slot) = self.slots.get_mut(idx).filter(|s| s.live(generation)) else {
                continue;
            };
            if slot.stop_waits_since.is_some() {
                // Fetched before the stop: what follows the stopped batch waits for it.
                continue;
            }
            slot.too_large_since = None;
            let remote = slot.remote.clone();
            let target = Target {
                topic: &f.topic,
                partition: f.partition,
                max_bytes: self.remote_limits.get(&remote),
                position: slot.progress.latest().map_or(-1, |l| l.next),
            };
            let like = Token {
                idx,
                generation,
                base: -1,
                records: 0,
                bytes: 0,
                max_timestamp: -1,
                read_at,
            };
            let (ready, stop) = self.prepare(&f.body, &f.batches, &target, like, &mut budget);
            let stop = self.hand_to_writer(&remote, f.partition, ready).or(stop);
            if let Some(stop) = stop {
                self.stop(idx, stop);
            }
        }
    }

    /// A partition's fetched batches as the writer takes them, in order ([`merge::plan`]): runs
    /// of small batches merged (within the round's inflate `budget`), every other batch
    /// [`prepare::prepare`]d; up to the first batch that stops the partition.
    fn prepare(
        &self,
        body: &Arc<Vec<u8>>,
        ranges: &[Range<usize>],
        target: &Target<'_>,
        like: Token,
        budget: &mut usize,
    ) -> (Vec<Ready>, Option<Stop>) {
        let mut ready = Vec::new();
        let rewritten = |reason: Reason, batches: usize| {
            let m = &self.shared.ctx.metrics;
            m.batches_rewritten
                .with_label_values(&[reason.label()])
                .inc_by(u64::try_from(batches).unwrap_or(u64::MAX));
        };
        for unit in merge::plan(body, ranges, target.position) {
            let ones = match unit {
                merge::Unit::Run(run) => {
                    if let Some(merged) = merge::merge_run(body, &run, target, like, budget) {
                        rewritten(Reason::Merged, run.len());
                        ready.extend(merged);
                        continue;
                    }
                    run
                }
                merge::Unit::One(range) => vec![range],
            };
            for range in ones {
                match prepare::prepare(body, range, target, like) {
                    Prepared::Write(batches, reason) => {
                        if let Some(reason) = reason {
                            rewritten(reason, 1);
                        }
                        ready.extend(batches);
                    }
                    Prepared::Stop(before, s) => {
                        ready.extend(before);
                        return (ready, Some(s));
                    }
                }
            }
        }
        (ready, None)
    }

    /// Hands a partition's prepared batches to the writer, in order; a remote topic name the
    /// writer refuses stops the partition.
    fn hand_to_writer(
        &mut self,
        remote: &Arc<str>,
        partition: i32,
        ready: Vec<Ready>,
    ) -> Option<Stop> {
        for r in ready {
            let item = Item {
                body: r.body,
                range: r.range,
                token: r.token,
            };
            self.pending.add(&r.token);
            if let Err(back) = self.writer.push(remote, partition, item) {
                self.pending.answered(&back.token);
                return Some(Stop {
                    offset: back.token.base,
                    message: format!("{remote} is not a topic name Kafka takes"),
                });
            }
        }
        None
    }

    /// A partition's fetch went wrong: anything the fetcher paused for faults the partition,
    /// the rest the fetcher retries by itself. An offset out of range is returned as (slot,
    /// offset), for [`Self::out_of_range`].
    fn trouble(&mut self, generation: u32, t: &PartitionTrouble) -> Option<(usize, i64)> {
        let idx = self.slots.index(&t.topic, t.partition)?;
        if !self.slots.get(idx).is_some_and(|s| s.live(generation)) {
            return None;
        }
        match &t.trouble {
            Trouble::Broker(ErrorCode::OFFSET_OUT_OF_RANGE) => return Some((idx, t.offset)),
            trouble if t.paused => {
                let message = format!(
                    "fetching {}-{} at {}: {trouble:?}",
                    t.topic, t.partition, t.offset
                );
                self.stop(
                    idx,
                    Stop {
                        offset: t.offset,
                        message,
                    },
                );
            }
            Trouble::BatchTooLarge { partial } => {
                let seen = format!("only {partial} bytes of its batch came");
                self.too_large(idx, t, &seen)
            }
            // Reported for the one partition whose answer, fetched alone, is too large to read
            // (the fetcher finds it; the others fetched with it go on).
            Trouble::FrameTooLarge { size, max } => {
                let seen = format!(
                    "the leader's answer for it alone was {size} bytes, over the {max} a connection reads"
                );
                self.too_large(idx, t, &seen)
            }
            trouble => {
                tracing::debug!(topic = %t.topic, partition = t.partition, ?trouble, "fetch retried");
            }
        }
        None
    }

    /// A fetch brought only part of the batch at the partition's offset. A later round may
    /// bring it whole (a broker returns one oversized batch in the first partition of an
    /// answer); one that stays too large for [`TOO_LARGE_FOR`] stops the partition, named in
    /// the status, instead of stalling it silently.
    fn too_large(&mut self, idx: usize, t: &PartitionTrouble, seen: &str) {
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        let (since, stop) = too_large_for_long(slot.too_large_since, t.offset, Instant::now());
        slot.too_large_since = Some(since);
        if !stop {
            return;
        }
        let message = format!(
            "{}-{} has not moved from offset {} for {} s: {seen}; a record batch there is larger than the whole-batch copy fetches, which the topic's max.message.bytes allows; copy such topics with spec.sourceLoop.copy: Records, or exclude them with spec.topicsExclude",
            t.topic,
            t.partition,
            t.offset,
            TOO_LARGE_FOR.as_secs()
        );
        self.stop(
            idx,
            Stop {
                offset: t.offset,
                message,
            },
        );
    }

    /// The partitions' next offsets (slot, offset) left their logs (records deleted before
    /// they were copied): each break is recorded and copying goes on from the log start.
    fn out_of_range(&mut self, hits: &[(usize, i64)]) {
        let idxs: Vec<usize> = hits.iter().map(|&(idx, _)| idx).collect();
        let bounds = self.source_bounds(&idxs);
        for &(idx, next) in hits {
            let Some(b) = bounds.get(&idx) else {
                self.fault(idx, "consume", "the source's log bounds are unknown");
                continue;
            };
            match continuity::out_of_range(next, *b) {
                Some(found) => {
                    let downstream = (self.slots.get(idx))
                        .and_then(|s| s.progress.latest())
                        .map_or(-1, |f| f.downstream);
                    let start = Frontier {
                        next: b.start,
                        downstream,
                    };
                    self.restart(idx, Some(start), found);
                }
                // Back in range by now (a leader that was behind): fetch again.
                None => self.fault(idx, "consume", "offset out of range"),
            }
        }
    }

    /// Forgets the partition's pending writes (their answers carry the old generation) and
    /// stops fetching it; after its backoff it is fetched again from its last committable
    /// position.
    fn fault(&mut self, idx: usize, kind: &str, reason: &str) {
        self.count_error(kind);
        let generation = self.slots.next_generation();
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        if slot.fault.is_none() {
            tracing::warn!(topic = %slot.topic, partition = slot.partition, %reason,
                "copy failed; the partition will be copied again from its last safe position");
        }
        slot.generation = generation;
        slot.last_fault = Some(reason.to_string());
        slot.stop_waits_since = None;
        let resume_from = slot.progress.rewind();
        slot.fault = Some(Fault {
            retry_at: Instant::now() + slot.backoff.next_delay(),
            resume_from,
        });
        let (topic, partition) = (slot.topic.clone(), slot.partition);
        self.fetch.send(Command::Drop { topic, partition });
    }

    /// A fault the flow's owner has to hear of: named in the refusal record, tried again
    /// after the backoff like any fault. Nothing at or after the stop was handed to the
    /// writer, so the batches handed before it are let finish first ([`Self::settle_stops`]):
    /// faulting at once would forget their acknowledgements, and every retry would copy them
    /// again.
    fn stop(&mut self, idx: usize, stop: Stop) {
        if !self.named_stopped(idx, &stop) {
            return;
        }
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        if before_stop_settled(slot, Instant::now()) {
            self.fault(idx, "batch_stopped", &stop.message);
            return;
        }
        slot.stop_waits_since.get_or_insert_with(Instant::now);
        let (topic, partition) = (slot.topic.clone(), slot.partition);
        self.fetch.send(Command::Drop { topic, partition });
    }

    /// A batch the target refused: the batches handed after it fail or are left out by the
    /// fault's new generation, so the partition faults at once.
    fn stop_refused(&mut self, idx: usize, stop: Stop) {
        if self.named_stopped(idx, &stop) {
            self.fault(idx, "batch_stopped", &stop.message);
        }
    }

    /// Marks the slot stopped at `stop` and names it in the refusal record; false for a slot
    /// no longer owned.
    fn named_stopped(&mut self, idx: usize, stop: &Stop) -> bool {
        let Some(slot) = self.slots.get_mut(idx) else {
            return false;
        };
        if slot.stopped.is_none() {
            tracing::warn!(topic = %slot.topic, partition = slot.partition, offset = stop.offset,
                reason = %stop.message, "partition stopped");
        }
        slot.stopped = Some(stop.offset);
        slot.last_fault = Some(stop.message.clone());
        let remote = slot.remote.to_string();
        lock(&self.stops)
            .entry((remote.clone(), slot.partition))
            .or_insert_with(|| Refusal {
                topic: remote,
                detected_ms: crate::clock::now_ms(),
                message: crate::kafka::refusals::truncated(stop.message.clone()),
            });
        true
    }

    /// Faults every stopped partition whose batches before the stop are all acknowledged, or
    /// that waited for them longer than a write may take.
    fn settle_stops(&mut self) {
        let now = Instant::now();
        let settled: Vec<(usize, String)> = (self.slots.iter())
            .filter(|(_, s)| s.stop_waits_since.is_some() && before_stop_settled(s, now))
            .map(|(idx, s)| (idx, s.last_fault.clone().unwrap_or_default()))
            .collect();
        for (idx, message) in settled {
            self.fault(idx, "batch_stopped", &message);
        }
    }

    /// Records a break and copies the partition again from `start` at once.
    fn restart(&mut self, idx: usize, start: Option<Frontier>, found: (GapKind, i64, i64)) {
        let generation = self.slots.next_generation();
        let config = self.shared.sync_config;
        let Some(slot) = self.slots.get_mut(idx) else {
            return;
        };
        let gap = continuity::found_now(&slot.topic, slot.partition, found);
        slot.generation = generation;
        slot.progress = Progress::new(
            TopicPartition::new(gap.topic.clone(), gap.partition),
            config,
            start,
        );
        slot.fault = Some(Fault {
            retry_at: Instant::now(),
            resume_from: start,
        });
        self.write_gap(&gap, start);
        self.retry_faults();
    }

    fn write_gap(&self, gap: &Gap, start: Option<Frontier>) {
        self.shared
            .record_gap(&self.producer, gap, start, GapWrite::Flush);
    }

    /// The source log bounds of the slots `idxs`' partitions that can be read, by slot: one
    /// ListOffsets per source leader for all of them.
    fn source_bounds(&self, idxs: &[usize]) -> HashMap<usize, LogBounds> {
        let keys: Vec<(usize, (String, i32))> = (idxs.iter())
            .filter_map(|&idx| {
                let slot = self.slots.get(idx)?;
                Some((idx, (slot.topic.clone(), slot.partition)))
            })
            .collect();
        if keys.is_empty() {
            return HashMap::new();
        }
        let partitions: Vec<(String, i32)> = keys.iter().map(|(_, k)| k.clone()).collect();
        let bounds = self.shared.probe.source(&partitions);
        (keys.into_iter())
            .filter_map(|(idx, key)| bounds.get(&key).map(|b| (idx, *b)))
            .collect()
    }

    fn source_starts(&self, idxs: &[usize]) -> HashMap<usize, i64> {
        (self.source_bounds(idxs).into_iter())
            .map(|(idx, b)| (idx, b.start))
            .collect()
    }

    /// Fetches every faulted partition whose backoff ran out again, from where it resumes
    /// (the source log start for one with nothing copied yet).
    fn retry_faults(&mut self) {
        let now = Instant::now();
        let due: Vec<(usize, Option<Frontier>)> = (self.slots.iter())
            .filter_map(|(idx, s)| {
                let f = s.fault.as_ref().filter(|f| f.retry_at <= now)?;
                Some((idx, f.resume_from))
            })
            .collect();
        let from_start: Vec<usize> = (due.iter())
            .filter(|(_, resume)| resume.is_none())
            .map(|&(idx, _)| idx)
            .collect();
        let starts = self.source_starts(&from_start);
        for (idx, resume) in due {
            let offset = match resume {
                Some(f) => Some(f.next),
                None => starts.get(&idx).copied(),
            };
            let Some(slot) = self.slots.get_mut(idx) else {
                continue;
            };
            let Some(offset) = offset else {
                // The log start could not be read: later.
                slot.retry_later(now);
                continue;
            };
            slot.fault = None;
            let command = Command::Fetch {
                topic: slot.topic.clone(),
                partition: slot.partition,
                offset,
                generation: slot.generation,
            };
            self.fetch.send(command);
        }
    }

    /// The fetching thread ended, which it only does by panicking: nothing would be copied
    /// again, and polling its channel would spin. The replicator stops (its pod restarts),
    /// settling the writes it has.
    fn fetching_ended(&mut self) {
        self.count_error("fetch_thread");
        tracing::error!("the batch fetching thread ended; stopping the replicator");
        self.shared.shutdown.cancel();
    }

    fn count_error(&self, kind: &str) {
        crate::replicator::source::engine::shared::count_error(&self.shared.ctx, kind);
    }
}

/// How long a stopped partition waits for the batches before the stop: longer than the writer
/// lets a write go unanswered, after which that write faults on its own.
const STOP_WAITS_AT_MOST: Duration = Duration::from_secs(90);

/// Whether `slot`, stopped, may fault now: everything before the stop is committable (written
/// with its offset syncs), or it waited [`STOP_WAITS_AT_MOST`].
fn before_stop_settled(slot: &Slot, now: Instant) -> bool {
    let Some(at) = slot.stopped else {
        return true;
    };
    let committed = slot.progress.committable().is_some_and(|f| f.next >= at);
    let waited = (slot.stop_waits_since)
        .is_some_and(|since| now.saturating_duration_since(since) >= STOP_WAITS_AT_MOST);
    committed || waited
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_too_large_at_one_offset_for_long_stops_its_partition() {
        let t0 = Instant::now();
        let later = |s: u64| t0 + Duration::from_secs(s);
        // First partial answer: remembered, not yet a stop.
        let (since, stop) = too_large_for_long(None, 7, t0);
        assert_eq!((since, stop), ((7, t0), false));
        // The same offset, still within the limit, then past it.
        assert_eq!(
            too_large_for_long(Some(since), 7, later(29)),
            ((7, t0), false)
        );
        assert_eq!(
            too_large_for_long(Some(since), 7, later(30)),
            ((7, t0), true)
        );
        // Progress meanwhile (another offset) starts the clock again.
        assert_eq!(
            too_large_for_long(Some(since), 9, later(45)),
            ((9, later(45)), false)
        );
    }
}
