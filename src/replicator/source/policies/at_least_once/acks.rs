//! A partition's slot in at-least-once mode and what delivery reports do to it: [`settle`],
//! a pure function over the slot table (`acks + slots -> actions`), so the rules that decide
//! what may be committed are tested without a broker.
//!
//! The rules: a partition's records are acknowledged in send order (one topic partition,
//! idempotent producer), so a record report is about the front of the slot's in-flight queue;
//! a report of an older generation is stale (the slot was rewound or reused) and ignored; a
//! report whose target offset does not grow is a new remote log; a failed report faults the
//! partition (rewound to its committable position); a record the target refused alone as too
//! large becomes a gap, a batch refused as too large makes its records go alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::mm2::OffsetSync;
use crate::replicator::backoff::Backoff;
use crate::replicator::source::engine::send::{Ack, Landed, SendError};
use crate::replicator::source::engine::slots::{InFlightQueue, SlotTable};
pub use crate::replicator::source::engine::slots::{UNOWNED, opaque, unpack};
pub use crate::replicator::source::engine::tracked::Fault;
use crate::replicator::source::engine::tracked::{TrackedSlot, Tracking};
use crate::replicator::source::progress::Progress;

#[derive(Debug, Clone)]
pub struct InFlight {
    pub offset: i64,
    /// Key and value bytes.
    pub bytes: u64,
    /// Upper bound of its size in a batch ([`crate::replicator::source::limits::wire_size`]).
    pub wire: usize,
    /// Queued with nothing else of its partition ([`crate::replicator::source::limits::Admit::Alone`]): a
    /// refusal as too large is about this record alone.
    pub alone: bool,
    pub read_at: Instant,
}

/// Why a partition faults; each cause counts under its own error kind.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    #[error("copying offset {offset} to {remote}: {error}")]
    Delivery {
        offset: i64,
        remote: Arc<str>,
        error: KafkaError,
    },
    #[error("producing to {remote}: {error}")]
    Produce { remote: Arc<str>, error: SendError },
    #[error("writing an offset sync to {topic}: {error}")]
    Sync { topic: String, error: SendError },
    #[error("the copy thread stalled")]
    Stalled,
}

impl Cause {
    /// The `kind` label of `mirrorflow_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            Cause::Delivery { .. } | Cause::Produce { .. } => "produce",
            Cause::Sync { .. } => "offset_sync",
            Cause::Stalled => "stall",
        }
    }
}

/// What this policy keeps of an owned partition besides the engine's and the tracking's parts.
#[derive(Debug, Default)]
pub struct Part {
    pub in_flight: InFlightQueue<InFlight>,
    /// Sum of `wire` over `in_flight`.
    pub in_flight_bytes: usize,
    /// The remote topic's `max.message.bytes`, once discovery read it.
    pub limit: Option<usize>,
    /// Records up to this source offset were in a batch the target refused as too large: each
    /// is written alone, so a second refusal names the record.
    pub alone_until: i64,
}

/// One assigned source partition.
pub type Slot = TrackedSlot<Part>;

/// The slot of a partition newly assigned: copying from `progress`, writing to `remote` whose
/// `max.message.bytes` is `limit`.
pub fn new_slot(
    topic: String,
    partition: i32,
    remote: Arc<str>,
    generation: u32,
    progress: Progress,
    limit: Option<usize>,
) -> Slot {
    let part = Part {
        limit,
        alone_until: -1,
        ..Part::default()
    };
    Slot::new(
        topic,
        partition,
        remote,
        generation,
        Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
        Tracking::new(progress, None, part),
    )
}

impl Part {
    pub fn push_in_flight(&mut self, sent: InFlight) {
        self.in_flight_bytes = self.in_flight_bytes.saturating_add(sent.wire);
        self.in_flight.push_back(sent);
    }

    pub fn clear_in_flight(&mut self) {
        self.in_flight.clear();
        self.in_flight_bytes = 0;
    }

    fn pop_in_flight(&mut self) -> Option<InFlight> {
        let sent = self.in_flight.pop_front()?;
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(sent.wire);
        Some(sent)
    }
}

/// A record the target refused alone as too large: to be recorded as a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected {
    pub idx: usize,
    pub offset: i64,
    pub bytes: u64,
    pub limit: Option<usize>,
}

/// What a batch of reports asks the policy to do, in this order: write the syncs, record the
/// rejected records, fault the partitions, handle the rewound remote partitions.
#[derive(Debug, Default)]
pub struct Settled {
    pub syncs: Vec<(usize, u32, OffsetSync)>,
    pub rejected: Vec<Rejected>,
    pub faults: Vec<(usize, Cause)>,
    /// (slot, first missing target offset, where the remote partition ends now).
    pub rewound: Vec<(usize, i64, i64)>,
    /// Some record reached the target: it is reachable.
    pub delivered: bool,
    /// Position writes that failed (their partitions store again).
    pub positions_failed: u32,
}

/// Receives every record the target took, for metrics.
pub trait Tally {
    fn delivered(&mut self, sent: &InFlight, landed: Landed);
}

/// Applies delivery reports of record and position writes to the slots (`now`: the policy's
/// clock for the sync interval) and says what follows from them.
pub fn settle(
    acks: &mut Vec<Ack>,
    slots: &mut SlotTable<Slot>,
    now: Duration,
    tally: &mut impl Tally,
) -> Settled {
    let mut out = Settled::default();
    for ack in acks.drain(..) {
        let (idx, generation, is_position) = unpack(ack.opaque);
        let Some(slot) = slots.get_mut(idx) else {
            if is_position && ack.result.is_err() && ack.opaque != UNOWNED {
                out.positions_failed += 1;
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
                out.positions_failed += 1;
            }
            continue;
        }
        let Some(sent) = slot.pop_in_flight() else {
            continue;
        };
        answered(
            &mut out,
            (idx, generation),
            slot,
            sent,
            ack.result,
            (now, tally),
        );
    }
    out
}

/// What the target's answer to one record write (`sent`, of partition `idx` at `generation`)
/// does to its slot.
fn answered(
    out: &mut Settled,
    (idx, generation): (usize, u32),
    slot: &mut Slot,
    sent: InFlight,
    result: Result<Landed, KafkaError>,
    (now, tally): (Duration, &mut impl Tally),
) {
    match result {
        Ok(landed)
            if slot
                .progress
                .latest()
                .is_some_and(|l| l.downstream >= 0 && landed.offset <= l.downstream) =>
        {
            // Target offsets only grow within a partition's log: this one is a new log
            // (the remote topic was deleted and created again) or lost records.
            let from = slot.progress.latest().map_or(0, |l| l.downstream + 1);
            out.rewound.push((idx, from, landed.offset));
        }
        Ok(landed) => {
            out.delivered = true;
            // Recovered: the next fault waits the shortest delay again, not the longest
            // one an earlier outage reached.
            slot.backoff.reset();
            slot.last_fault = None;
            tally.delivered(&sent, landed);
            if let Some(sync) = slot.progress.acknowledged(sent.offset, landed.offset, now) {
                out.syncs.push((idx, generation, sync));
            }
        }
        Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)) if sent.alone => {
            out.rejected.push(Rejected {
                idx,
                offset: sent.offset,
                bytes: sent.bytes,
                limit: slot.limit,
            });
        }
        Err(error) => {
            if error.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageSizeTooLarge) {
                // A batch was refused: its records go alone next time, so the one that
                // cannot fit (if any) is found instead of refused again forever.
                let last = slot.in_flight.back().map_or(sent.offset, |f| f.offset);
                slot.alone_until = slot.alone_until.max(last);
                // The limit may have been lowered since it was read.
                slot.limit = None;
            }
            out.faults.push((
                idx,
                Cause::Delivery {
                    offset: sent.offset,
                    remote: slot.remote.clone(),
                    error,
                },
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm2::{SyncPolicyConfig, TopicPartition};
    use crate::replicator::source::engine::slots::GEN_MASK;
    use proptest::prelude::*;

    #[derive(Default)]
    struct Count(u64);
    impl Tally for Count {
        fn delivered(&mut self, _: &InFlight, _: Landed) {
            self.0 += 1;
        }
    }

    fn table() -> (SlotTable<Slot>, usize, u32) {
        let mut t = SlotTable::default();
        let generation = t.next_generation();
        let config = SyncPolicyConfig {
            max_records: 0,
            max_interval: None,
        };
        let progress = Progress::new(TopicPartition::new("t", 0), config, None);
        let idx = t
            .insert(new_slot(
                "t".into(),
                0,
                "a.t".into(),
                generation,
                progress,
                None,
            ))
            .unwrap();
        (t, idx, generation)
    }

    fn send(t: &mut SlotTable<Slot>, idx: usize, offset: i64, alone: bool) {
        t.get_mut(idx).unwrap().push_in_flight(InFlight {
            offset,
            bytes: 10,
            wire: 100,
            alone,
            read_at: Instant::now(),
        });
    }

    fn ok(idx: usize, generation: u32, downstream: i64) -> Ack {
        Ack {
            opaque: opaque(idx, generation, false),
            result: Ok(Landed {
                offset: downstream,
                timestamp: None,
            }),
        }
    }

    fn err(idx: usize, generation: u32, code: RDKafkaErrorCode) -> Ack {
        Ack {
            opaque: opaque(idx, generation, false),
            result: Err(KafkaError::MessageProduction(code)),
        }
    }

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

    #[test]
    fn a_stall_is_named_with_the_last_failed_write_until_a_write_succeeds() {
        let (mut t, idx, g) = table();
        t.get_mut(idx).unwrap().last_fault = Some("writing to a.t-0: broker down".into());
        let reason = |t: &SlotTable<Slot>| {
            crate::replicator::source::engine::stall::tracked(t)[0]
                .reason
                .clone()
        };
        assert!(
            reason(&t).is_some_and(|r| r.contains("broker down")),
            "{:?}",
            reason(&t)
        );
        send(&mut t, idx, 5, false);
        let mut acks = vec![ok(idx, g, 0)];
        settle(&mut acks, &mut t, Duration::ZERO, &mut Count::default());
        assert_eq!(reason(&t), None, "a written record clears it");
    }

    #[test]
    fn acknowledged_records_move_the_frontier_and_the_first_gets_a_sync() {
        let (mut t, idx, g) = table();
        for o in 5..8 {
            send(&mut t, idx, o, false);
        }
        let mut acks = vec![ok(idx, g, 0), ok(idx, g, 1), ok(idx, g, 2)];
        let mut count = Count::default();
        let s = settle(&mut acks, &mut t, Duration::ZERO, &mut count);
        assert!(s.delivered && s.faults.is_empty() && s.rewound.is_empty());
        assert_eq!(count.0, 3);
        assert_eq!(
            s.syncs
                .iter()
                .map(|(_, _, s)| (s.upstream_offset, s.downstream_offset))
                .collect::<Vec<_>>(),
            [(5, 0)]
        );
        let slot = t.get(idx).unwrap();
        assert_eq!(slot.in_flight_bytes, 0);
        assert_eq!(
            slot.progress.latest().map(|f| (f.next, f.downstream)),
            Some((8, 2))
        );
    }

    #[test]
    fn stale_generations_are_ignored() {
        let (mut t, idx, g) = table();
        send(&mut t, idx, 0, false);
        let mut acks = vec![ok(idx, g.wrapping_add(1), 0)];
        let s = settle(&mut acks, &mut t, Duration::ZERO, &mut Count::default());
        assert!(!s.delivered);
        assert_eq!(t.get(idx).unwrap().in_flight.len(), 1);
    }

    #[test]
    fn a_target_offset_that_does_not_grow_is_a_rewound_remote_log() {
        let (mut t, idx, g) = table();
        send(&mut t, idx, 0, false);
        send(&mut t, idx, 1, false);
        let mut acks = vec![ok(idx, g, 10), ok(idx, g, 3)];
        let s = settle(&mut acks, &mut t, Duration::ZERO, &mut Count::default());
        assert_eq!(s.rewound, [(idx, 11, 3)]);
    }

    #[test]
    fn a_lone_record_refused_as_too_large_is_rejected_a_batch_faults_and_goes_alone() {
        let (mut t, idx, g) = table();
        send(&mut t, idx, 4, true);
        let mut acks = vec![err(idx, g, RDKafkaErrorCode::MessageSizeTooLarge)];
        let s = settle(&mut acks, &mut t, Duration::ZERO, &mut Count::default());
        assert_eq!(
            s.rejected,
            [Rejected {
                idx,
                offset: 4,
                bytes: 10,
                limit: None
            }]
        );
        assert!(s.faults.is_empty());

        send(&mut t, idx, 5, false);
        send(&mut t, idx, 6, false);
        let mut acks = vec![err(idx, g, RDKafkaErrorCode::MessageSizeTooLarge)];
        let s = settle(&mut acks, &mut t, Duration::ZERO, &mut Count::default());
        assert_eq!(s.faults.len(), 1);
        assert_eq!(s.faults[0].1.kind(), "produce");
        assert_eq!(
            t.get(idx).unwrap().alone_until,
            6,
            "the whole batch goes alone"
        );
    }

    #[test]
    fn a_failed_position_write_stores_again() {
        let (mut t, idx, g) = table();
        let mut acks = vec![Ack {
            opaque: opaque(idx, g, true),
            result: Err(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageTimedOut,
            )),
        }];
        let s = settle(&mut acks, &mut t, Duration::ZERO, &mut Count::default());
        assert_eq!(s.positions_failed, 1);
        // Gap records name no slot: their reports count nothing.
        let mut acks = vec![Ack {
            opaque: UNOWNED,
            result: Err(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageTimedOut,
            )),
        }];
        let s = settle(&mut acks, &mut t, Duration::ZERO, &mut Count::default());
        assert_eq!(s.positions_failed, 0);
    }

    /// One step of a random run: send the next record, or acknowledge the front one with a
    /// target offset (growing, or not), or fail it.
    #[derive(Debug, Clone)]
    enum Step {
        Send,
        Ack { gap: u8 },
        Fail,
        SyncAck,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => Just(Step::Send),
            4 => (0..3u8).prop_map(|gap| Step::Ack { gap }),
            1 => Just(Step::Fail),
            2 => Just(Step::SyncAck),
        ]
    }

    proptest! {
        /// Whatever the reports, the committable position never passes a record that is not
        /// acknowledged, nor one whose sync is unacknowledged; and the in-flight byte count is
        /// the sum over the queue.
        #[test]
        fn nothing_unacknowledged_becomes_committable(steps in proptest::collection::vec(step(), 1..300)) {
            let (mut t, idx, g) = table();
            let mut next_source = 100_i64;
            let mut downstream = -1_i64;
            // Source offsets acknowledged in order, from the start or the last rewind.
            let mut acknowledged_to = None::<i64>;
            let mut pending_syncs = std::collections::VecDeque::<i64>::new();
            for s in steps {
                match s {
                    Step::Send => {
                        send(&mut t, idx, next_source, false);
                        next_source += 1;
                    }
                    Step::Ack { gap } => {
                        let Some(front) = t.get(idx).unwrap().in_flight.front().map(|f| f.offset) else { continue };
                        downstream += 1 + i64::from(gap);
                        let mut acks = vec![ok(idx, g, downstream)];
                        let out = settle(&mut acks, &mut t, Duration::ZERO, &mut Count::default());
                        prop_assert!(out.rewound.is_empty());
                        acknowledged_to = Some(front);
                        for (_, _, sync) in out.syncs {
                            prop_assert_eq!(sync.upstream_offset, front);
                            pending_syncs.push_back(front);
                        }
                    }
                    Step::Fail => {
                        if t.get(idx).unwrap().in_flight.is_empty() { continue }
                        let mut acks = vec![err(idx, g, RDKafkaErrorCode::MessageTimedOut)];
                        let out = settle(&mut acks, &mut t, Duration::ZERO, &mut Count::default());
                        prop_assert_eq!(out.faults.len(), 1);
                        // What the policy does on a fault: rewind, forget what is in flight.
                        let slot = t.get_mut(idx).unwrap();
                        slot.clear_in_flight();
                        let to = slot.progress.rewind();
                        pending_syncs.clear();
                        if let Some(f) = to {
                            next_source = f.next;
                            acknowledged_to = Some(f.next - 1);
                        } else {
                            next_source = 100;
                            acknowledged_to = None;
                        }
                    }
                    Step::SyncAck => {
                        if pending_syncs.pop_front().is_some() {
                            t.get_mut(idx).unwrap().progress.sync_acknowledged();
                        }
                    }
                }
                let slot = t.get(idx).unwrap();
                prop_assert_eq!(slot.in_flight_bytes, slot.in_flight.iter().map(|f| f.wire).sum::<usize>());
                if let Some(c) = slot.progress.committable() {
                    let acked = acknowledged_to.unwrap_or(99);
                    prop_assert!(c.next <= acked + 1, "committable {} past acknowledged {}", c.next, acked);
                    if let Some(&first_unacked_sync) = pending_syncs.front() {
                        prop_assert!(c.next <= first_unacked_sync, "committable {} past the unacknowledged sync at {}", c.next, first_unacked_sync);
                    }
                }
            }
        }
    }
}
