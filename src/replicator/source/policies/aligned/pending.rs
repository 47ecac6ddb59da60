//! Transactions of several partitions, side by side.
//!
//! A planned transaction (a record wrapped before a commit marker, fillers aborted over a
//! jump) is not written where it is planned: the partition waits with it ([`Pending`]), the
//! records read for the partition meanwhile queued behind it, while the copy thread goes on
//! with the other partitions. When the copy thread next serves its producers (an empty poll,
//! every few hundred records, every second), the waiting transactions are written at once,
//! each partition's on its own producer and thread ([`Aligned::run_pending`]); then each
//! partition copies what it queued, up to its next transaction, which the next round writes
//! (rounds go on for up to [`RUN_FOR`] before the source is polled again). A transaction
//! takes a few round trips (its writes, the commit, its marker seen on the target): one after
//! another, a transactional topic was copied at that pace for the whole replica.
//!
//! What is queued is bounded, per partition ([`super::held::BACKLOG_RECORDS`], [`super::held::BACKLOG_BYTES`]) and for
//! the copy loop ([`QUEUED_BYTES`]): past a bound, the waiting transactions are written at
//! once, so the source consumer is held back as it was when every transaction was written
//! where it was planned.

use std::collections::VecDeque;

use super::held::size;
use super::write::{Ended, Writing, write_in_transaction};
use super::*;

/// The most bytes the copy loop's partitions queue behind their transactions together.
const QUEUED_BYTES: usize = 16 << 20;
/// How long one [`Aligned::run_pending`] goes on writing rounds of transactions before the
/// copy thread polls the source again (the other partitions' records wait meanwhile).
const RUN_FOR: Duration = Duration::from_millis(500);
/// The most transactions written at once (a thread each).
const SIDE_BY_SIDE: usize = 32;

/// One transaction written: its partition (slot, generation), the target offset it started
/// at, and how it ended.
type Written = (usize, u32, i64, Result<i64, Ended>);

impl Aligned {
    /// Queues `m` behind the partition's waiting transaction; past a bound, the waiting
    /// transactions are written (`run`: not while they are being written).
    pub(super) fn queue_behind(&mut self, idx: usize, m: OwnedMessage, run: bool) {
        let bytes = size(&m);
        let Some(pending) = self.slots.get_mut(idx).and_then(|s| s.pending.as_mut()) else {
            return;
        };
        let full = pending.queue(m);
        self.queued = self.queued.saturating_add(bytes);
        if run && (full || self.queued >= QUEUED_BYTES) {
            self.run_pending();
        }
    }

    /// Plans `step` (a transaction) for the partition at `idx`, written by
    /// [`Self::run_pending`]; a wrapped record is taken from the held one.
    pub(super) fn defer(&mut self, idx: usize, step: Step, timestamp: Option<i64>) -> bool {
        let Some(slot) = self.slots.get_mut(idx) else {
            return false;
        };
        let held = match step {
            Step::Wrapped => slot.held.take(),
            _ => None,
        };
        slot.pending = Some(Pending::new(step, held, timestamp));
        self.deferred = true;
        true
    }

    /// Writes every waiting transaction, side by side, then copies what each partition
    /// queued behind its own.
    pub(super) fn run_pending(&mut self) {
        if !self.deferred || self.running {
            return;
        }
        self.running = true;
        // What a partition queued behind its transaction plans its next one: written in the
        // next round at once, without polling the source again, for a while.
        let until = Instant::now() + RUN_FOR;
        while self.deferred && !self.shared.shutdown.is_cancelled() {
            self.round();
            if Instant::now() >= until {
                break;
            }
        }
        self.running = false;
    }

    /// One round: every waiting transaction written, then what each partition queued behind
    /// its own copied, up to its next transaction.
    fn round(&mut self) {
        let waiting: Vec<(usize, u32)> = (self.slots.iter())
            .filter(|(_, s)| s.pending.is_some())
            .map(|(idx, s)| (idx, s.generation))
            .collect();
        // Each partition's plain writes first: order across two producers is only kept by
        // waiting. A partition whose writes fail is prepared again (its transaction dropped).
        for &(idx, generation) in &waiting {
            self.wait_drained(idx, generation);
        }
        for &(idx, generation) in &waiting {
            let unfenced = self
                .slots
                .get(idx)
                .is_some_and(|s| s.generation == generation && s.txn.is_none());
            if unfenced {
                self.prepare_again(idx, Duration::ZERO);
            }
        }
        for (idx, generation, first, ended) in self.write_side_by_side() {
            let Some(slot) = self.slots.get_mut(idx) else {
                continue;
            };
            if slot.generation != generation {
                // Prepared again meanwhile: it resumes where the target ends.
                continue;
            }
            let Some(pending) = slot.pending.take() else {
                continue;
            };
            let Pending {
                step,
                held,
                backlog,
                ..
            } = pending;
            if self.ended_transaction((idx, generation), (step, held, first), ended) {
                self.replay(idx, backlog);
            }
        }
        let (mut waiting, mut queued) = (0_usize, 0_usize);
        for pending in self.slots.iter().filter_map(|(_, s)| s.pending.as_ref()) {
            waiting += 1;
            queued = queued.saturating_add(pending.backlog_bytes);
        }
        self.queued = queued;
        self.deferred = waiting > 0;
    }

    /// The waiting transactions of aligned partitions with a producer and no plain write
    /// outstanding, written at once (at most [`SIDE_BY_SIDE`] at a time), each on a thread of
    /// its own.
    fn write_side_by_side(&mut self) -> Vec<Written> {
        let shutdown = &self.shared.shutdown;
        let mut ready: Vec<(usize, &mut AlignedSlot)> = (self.slots.iter_mut())
            .filter(|(_, s)| {
                s.state == State::Aligned
                    && s.pending.is_some()
                    && s.txn.is_some()
                    // Its plain writes acknowledged (they are unless the loop is stopping).
                    && s.in_flight.is_empty()
            })
            .collect();
        let mut written = Vec::with_capacity(ready.len());
        while !ready.is_empty() {
            let chunk: Vec<_> = ready.drain(..ready.len().min(SIDE_BY_SIDE)).collect();
            std::thread::scope(|scope| {
                let running: Vec<_> = chunk
                    .into_iter()
                    .filter_map(|(idx, slot)| {
                        let (generation, partition) = (slot.generation, slot.partition);
                        let remote = &slot.remote;
                        let part = &mut slot.own;
                        let first = part.next_target;
                        let (pending, txn) = (part.pending.as_ref()?, part.txn.as_ref()?);
                        let patience = &mut part.marker_patience;
                        let w = Writing {
                            step: pending.step,
                            held: pending.held.as_ref(),
                            remote,
                            partition,
                            timestamp: pending.timestamp,
                            first,
                        };
                        let run = move || write_in_transaction(txn, patience, shutdown, w);
                        Some((idx, generation, first, scope.spawn(run)))
                    })
                    .collect();
                for (idx, generation, first, thread) in running {
                    let ended = thread.join().unwrap_or_else(|_| {
                        Err(Ended::Failed("the transaction's thread panicked".into()))
                    });
                    written.push((idx, generation, first, ended));
                }
            });
        }
        written
    }

    /// Copies the records read while the partition's transaction waited, up to one that plans
    /// a transaction again: the rest wait with that one.
    fn replay(&mut self, idx: usize, backlog: VecDeque<OwnedMessage>) {
        let mut records = backlog.into_iter();
        while let Some(m) = records.next() {
            self.copy_record(idx, &m);
            let Some(slot) = self.slots.get_mut(idx) else {
                return;
            };
            if !slot.copying() {
                // Prepared again: read again from where the target ends.
                return;
            }
            if slot.pending.is_some() {
                for m in records.by_ref() {
                    self.queue_behind(idx, m, false);
                }
                return;
            }
        }
    }
}
