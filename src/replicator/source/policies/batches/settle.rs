//! What the target answered: written batches move their partitions on (offset syncs, metrics),
//! faults rewind them; positions are stored and writes settled before a partition is let go.

use super::*;

impl Batches {
    /// What the writer brought: acknowledged batches move their partitions on, faults rewind
    /// or stop them ([`settle`] decides, this carries it out).
    pub(super) fn settle(&mut self, written: Written<Token>) {
        if let Some(failure) = &written.failure {
            self.count_error("produce");
            self.shared
                .target_health
                .unreachable("writing record batches", failure);
        }
        for (remote, partition, error) in &written.troubles {
            tracing::debug!(%remote, partition, %error, "write retried");
        }
        let tokens = (written.written.iter().map(|w| &w.token))
            .chain(written.faults.iter().flat_map(|f| f.tokens.iter()));
        for t in tokens {
            self.pending.answered(t);
        }
        let (now, wall_ms) = (self.shared.now(), crate::clock::now_ms());
        let settled = settle(&mut self.slots, &written, now, wall_ms);
        for key in &settled.resumed {
            lock(&self.stops).remove(key);
        }
        for c in &settled.copied {
            self.meters
                .copied(c.records, c.bytes, c.read_at, Some(c.age_ms));
        }
        if !written.written.is_empty() {
            self.shared.target_health.ok();
        }
        for (idx, generation, sync) in settled.syncs {
            self.write_sync(idx, generation, &sync);
        }
        for (idx, failed) in settled.failed {
            match failed {
                Failed::Stop(stop) => self.stop_refused(idx, stop),
                Failed::Fault(message) => self.fault(idx, "produce", &message),
            }
        }
    }

    pub(super) fn serve_acks(&mut self) {
        serve_reports(&self.syncs);
        for (idx, e) in tracked::settle_syncs(&self.shared, &self.syncs, &mut self.slots) {
            let message = format!("writing an offset sync to {}: {e}", self.shared.syncs_topic);
            self.fault(idx, "offset_sync", &message);
        }
        let mut acks = std::mem::take(&mut self.acks);
        serve_reports(&self.producer);
        self.producer.context().take(&mut acks);
        for ack in acks.drain(..) {
            let (idx, generation, position) = unpack(ack.opaque);
            if !position || ack.result.is_ok() {
                continue;
            }
            self.count_error("positions");
            if let Some(slot) = self
                .slots
                .get_mut(idx)
                .filter(|s| s.generation == generation)
            {
                slot.progress.store_failed();
            }
        }
        self.acks = acks;
    }

    pub(super) fn write_sync(&mut self, idx: usize, generation: u32, sync: &OffsetSync) {
        let opaque = opaque(idx, generation, false);
        if let Err(error) = self.shared.write_sync(&self.syncs, sync, opaque) {
            let message = format!(
                "writing an offset sync to {}: {error}",
                self.shared.syncs_topic
            );
            self.fault(idx, "offset_sync", &message);
        }
    }

    /// Writes the position of each of `idxs` whose committable point moved.
    pub(super) fn persist(&mut self, idxs: &[usize]) {
        tracked::persist(&self.shared, &self.producer, &mut self.slots, idxs);
    }

    /// Waits until every batch handed to the writer and every sync is acknowledged (or
    /// `timeout`); nothing new is taken from the fetcher meanwhile.
    pub(super) fn drain(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            self.serve_acks();
            if self.writer.pending() == 0 && self.syncs.in_flight_count() == 0 {
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    batches = self.writer.pending(),
                    syncs = self.syncs.in_flight_count(),
                    "writes still unacknowledged after {timeout:?}; their records will be copied again"
                );
                return;
            }
            if self.writer.pending() > 0 {
                let written = self.writer.pump();
                self.settle(written);
            } else {
                self.syncs.poll(Duration::from_millis(10));
            }
        }
    }

    pub(super) fn persist_and_wait(&mut self, idxs: &[usize]) {
        self.drain(DRAIN_TIMEOUT);
        self.persist(idxs);
        if let Err(e) = self.producer.flush(DRAIN_TIMEOUT) {
            tracing::warn!(error = %e, "flushing source positions failed");
        }
        self.serve_acks();
    }
}

/// Batches the target acknowledged, counted for the metrics.
#[derive(Debug, PartialEq)]
pub(super) struct CopiedBatch {
    records: u64,
    bytes: u64,
    read_at: Instant,
    age_ms: i64,
}

/// A partition whose writes failed for good.
#[derive(Debug, PartialEq)]
pub(super) enum Failed {
    /// The target refuses the records themselves: the flow's owner must hear of it.
    Stop(Stop),
    /// Anything else: copied again from its last written position after a backoff.
    Fault(String),
}

/// What the writer's answers do to the partitions ([`settle`]).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Settled {
    /// Offset syncs to write: (slot, its generation, the sync).
    syncs: Vec<(usize, u32, OffsetSync)>,
    /// Stopped partitions that wrote a batch again, by (remote topic, partition): their stop
    /// is lifted.
    resumed: Vec<(String, i32)>,
    copied: Vec<CopiedBatch>,
    /// The partitions whose writes failed, by slot: one entry per partition, for its oldest
    /// batch of the current generation.
    failed: Vec<(usize, Failed)>,
}

/// The pure step of the batch copy: the writer's answers applied to the owned partitions at
/// `now` (the sync policies' clock) and `wall_ms` (for record ages), with no I/O. Answers for
/// a slot of another generation (its partition was rewound, moved or is another now) are
/// ignored. An acknowledged batch acknowledges its run of source offsets (and may ask for an
/// offset sync); one the broker had already moves the position without a sync, the target
/// offset being unknown; a fault stops the partition when the target refuses the records,
/// and rewinds it otherwise.
pub(super) fn settle(
    slots: &mut SlotTable<Slot>,
    answers: &Written<Token>,
    now: Duration,
    wall_ms: i64,
) -> Settled {
    let mut settled = Settled::default();
    for w in &answers.written {
        let t = w.token;
        let Some(slot) = slots.get_mut(t.idx).filter(|s| s.live(t.generation)) else {
            continue;
        };
        let sync = match w.base_offset {
            Some(downstream) => slot
                .progress
                .acknowledged_run(t.base, downstream, t.records, now),
            // Written before (a resend the broker recognised): where is not known, so no
            // sync; the next batch's sync follows the delta change.
            None => {
                slot.progress
                    .skipped(t.base.saturating_add(t.records).saturating_sub(1));
                None
            }
        };
        // Batches before the stop, written after it was found, do not lift it.
        if slot
            .stopped
            .is_some_and(|at| t.base.saturating_add(t.records) > at)
        {
            slot.stopped = None;
            settled
                .resumed
                .push((slot.remote.to_string(), slot.partition));
        }
        slot.backoff.reset();
        slot.last_fault = None;
        settled.copied.push(CopiedBatch {
            records: u64::try_from(t.records).unwrap_or(0),
            bytes: t.bytes,
            read_at: t.read_at,
            age_ms: wall_ms.saturating_sub(t.max_timestamp),
        });
        if let Some(sync) = sync {
            settled.syncs.push((t.idx, t.generation, sync));
        }
    }
    for f in &answers.faults {
        let live = |t: &&Token| slots.get(t.idx).is_some_and(|s| s.live(t.generation));
        let Some(t) = f.tokens.iter().find(live) else {
            continue;
        };
        let message = match f.waited {
            Some(waited) => format!(
                "no write to {}-{} was acknowledged for {}s (the target's last answer: {}); copying it again from its last written position",
                f.topic,
                f.partition,
                waited.as_secs(),
                f.error
            ),
            None => format!(
                "the target refused writing to {}-{}: {}",
                f.topic, f.partition, f.error
            ),
        };
        let failed = match f.error.refuses_the_records() {
            true => Failed::Stop(Stop {
                offset: t.base,
                message,
            }),
            false => Failed::Fault(message),
        };
        settled.failed.push((t.idx, failed));
    }
    settled
}

#[cfg(test)]
mod tests {
    use mirrorflow_conn::writer::{Fault as Failure, Written as Acknowledged};
    use mirrorflow_core::protocol::ErrorCode;

    use super::*;
    use crate::mm2::SyncPolicyConfig;

    const CORRUPT_MESSAGE: ErrorCode = ErrorCode(2);
    const MESSAGE_TOO_LARGE: ErrorCode = ErrorCode(10);

    /// One partition `t-0` (remote `a.t`) owned in a table, copying from offset 0.
    fn table() -> (SlotTable<Slot>, usize, u32) {
        let mut slots = SlotTable::default();
        let generation = slots.next_generation();
        let config = SyncPolicyConfig {
            max_records: 0,
            max_interval: None,
        };
        let progress = Progress::new(TopicPartition::new("t", 0), config, None);
        let slot = Slot::new(
            "t".into(),
            0,
            "a.t".into(),
            generation,
            Backoff::new(RETRY_MIN, RETRY_MAX),
            Tracking::new(progress, None, Part::default()),
        );
        let idx = slots.insert(slot).expect("a valid partition");
        (slots, idx, generation)
    }

    fn token(idx: usize, generation: u32, base: i64, records: i64) -> Token {
        Token {
            idx,
            generation,
            base,
            records,
            bytes: 100,
            max_timestamp: 1_000,
            read_at: Instant::now(),
        }
    }

    fn written(t: Token, base_offset: Option<i64>) -> Acknowledged<Token> {
        Acknowledged {
            topic: "a.t".into(),
            partition: 0,
            token: t,
            base_offset,
        }
    }

    fn failed(t: Token, error: ErrorCode, waited: Option<Duration>) -> Failure<Token> {
        Failure {
            topic: "a.t".into(),
            partition: 0,
            error,
            waited,
            tokens: vec![t],
        }
    }

    fn answers(written: Vec<Acknowledged<Token>>, faults: Vec<Failure<Token>>) -> Written<Token> {
        Written {
            written,
            faults,
            troubles: Vec::new(),
            failure: None,
        }
    }

    #[test]
    fn a_stop_waits_for_the_batches_before_it_and_no_longer_than_a_write_may_take() {
        let (mut slots, idx, generation) = table();
        let now = Instant::now();
        let slot = slots.get_mut(idx).expect("owned");
        slot.stopped = Some(5);
        assert!(
            !super::super::before_stop_settled(slot, now),
            "0..5 still in flight"
        );
        slot.stop_waits_since = Some(now);
        let got = settle(
            &mut slots,
            &answers(
                vec![written(token(idx, generation, 0, 5), Some(100))],
                vec![],
            ),
            Duration::ZERO,
            2_000,
        );
        assert!(got.resumed.is_empty(), "still stopped at 5");
        let slot = slots.get_mut(idx).expect("owned");
        assert!(
            !super::super::before_stop_settled(slot, now),
            "written, its offset sync not yet"
        );
        slot.progress.sync_acknowledged();
        assert!(
            super::super::before_stop_settled(slot, now),
            "all of 0..5 committable"
        );
        // A write before the stop that is never answered: the stop goes on after the wait.
        let (mut slots, idx, _) = table();
        let slot = slots.get_mut(idx).expect("owned");
        slot.stopped = Some(5);
        slot.stop_waits_since = Some(now);
        assert!(!super::super::before_stop_settled(slot, now));
        let later = now + super::super::STOP_WAITS_AT_MOST;
        assert!(super::super::before_stop_settled(slot, later));
    }

    #[test]
    fn the_writers_answers_move_sync_stop_or_rewind_each_partition() {
        struct Case {
            name: &'static str,
            answers: fn(usize, u32) -> Written<Token>,
            /// Where the slot was stopped before the answers.
            stopped: Option<i64>,
            syncs: Vec<(i64, i64)>,
            next: Option<i64>,
            resumed: bool,
            copied: usize,
            failed: Option<&'static str>,
        }
        let cases = [
            Case {
                name: "a written batch acknowledges its run and asks for the first sync",
                answers: |i, g| answers(vec![written(token(i, g, 0, 5), Some(100))], vec![]),
                stopped: None,
                syncs: vec![(0, 100)],
                next: Some(5),
                resumed: false,
                copied: 1,
                failed: None,
            },
            Case {
                name: "a batch the broker had already moves the position, with no sync",
                answers: |i, g| answers(vec![written(token(i, g, 0, 5), None)], vec![]),
                stopped: None,
                syncs: vec![],
                next: Some(5),
                resumed: false,
                copied: 1,
                failed: None,
            },
            Case {
                name: "an answer for an older generation of the slot moves nothing",
                answers: |i, g| answers(vec![written(token(i, g + 1, 0, 5), Some(100))], vec![]),
                stopped: None,
                syncs: vec![],
                next: None,
                resumed: false,
                copied: 0,
                failed: None,
            },
            Case {
                name: "a stopped partition that writes again has its stop lifted",
                answers: |i, g| answers(vec![written(token(i, g, 0, 1), Some(7))], vec![]),
                stopped: Some(0),
                syncs: vec![(0, 7)],
                next: Some(1),
                resumed: true,
                copied: 1,
                failed: None,
            },
            Case {
                name: "a batch before the stop, written after it was found, leaves it stopped",
                answers: |i, g| answers(vec![written(token(i, g, 0, 5), Some(100))], vec![]),
                stopped: Some(5),
                syncs: vec![(0, 100)],
                next: Some(5),
                resumed: false,
                copied: 1,
                failed: None,
            },
            Case {
                name: "records the target refuses stop the partition at the batch",
                answers: |i, g| {
                    answers(
                        vec![],
                        vec![failed(token(i, g, 40, 3), MESSAGE_TOO_LARGE, None)],
                    )
                },
                stopped: None,
                syncs: vec![],
                next: None,
                resumed: false,
                copied: 0,
                failed: Some("stop at 40: the target refused writing to a.t-0"),
            },
            Case {
                name: "any other failure rewinds the partition",
                answers: |i, g| {
                    answers(
                        vec![],
                        vec![failed(token(i, g, 40, 3), CORRUPT_MESSAGE, None)],
                    )
                },
                stopped: None,
                syncs: vec![],
                next: None,
                resumed: false,
                copied: 0,
                failed: Some("fault: the target refused writing to a.t-0"),
            },
            Case {
                name: "a delivery timeout is told as a wait, not a refusal",
                answers: |i, g| {
                    let waited = Some(Duration::from_secs(120));
                    answers(
                        vec![],
                        vec![failed(token(i, g, 40, 3), MESSAGE_TOO_LARGE, waited)],
                    )
                },
                stopped: None,
                syncs: vec![],
                next: None,
                resumed: false,
                copied: 0,
                failed: Some("stop at 40: no write to a.t-0 was acknowledged for 120s"),
            },
            Case {
                name: "a failure of a slot's older generation is ignored",
                answers: |i, g| {
                    answers(
                        vec![],
                        vec![failed(token(i, g + 1, 40, 3), MESSAGE_TOO_LARGE, None)],
                    )
                },
                stopped: None,
                syncs: vec![],
                next: None,
                resumed: false,
                copied: 0,
                failed: None,
            },
        ];
        for case in cases {
            let (mut slots, idx, generation) = table();
            if let Some(slot) = slots.get_mut(idx) {
                slot.stopped = case.stopped;
            }
            let got = settle(
                &mut slots,
                &(case.answers)(idx, generation),
                Duration::ZERO,
                2_000,
            );
            let syncs: Vec<(i64, i64)> = (got.syncs.iter())
                .map(|(_, _, s)| (s.upstream_offset, s.downstream_offset))
                .collect();
            assert_eq!(syncs, case.syncs, "{}", case.name);
            let slot = slots.get(idx).expect("still owned");
            assert_eq!(
                slot.progress.latest().map(|f| f.next),
                case.next,
                "{}",
                case.name
            );
            assert_eq!(!got.resumed.is_empty(), case.resumed, "{}", case.name);
            let stopped = if case.resumed { None } else { case.stopped };
            assert_eq!(slot.stopped, stopped, "{}", case.name);
            assert_eq!(got.copied.len(), case.copied, "{}", case.name);
            if let Some(c) = got.copied.first() {
                assert_eq!(c.age_ms, 1_000, "{}", case.name);
            }
            let failed = got.failed.first().map(|(i, f)| {
                assert_eq!(*i, idx, "{}", case.name);
                match f {
                    Failed::Stop(s) => format!("stop at {}: {}", s.offset, s.message),
                    Failed::Fault(m) => format!("fault: {m}"),
                }
            });
            match (case.failed, failed) {
                (None, None) => {}
                (Some(want), Some(got)) => assert!(got.starts_with(want), "{}: {got}", case.name),
                (want, got) => panic!("{}: wanted {want:?}, got {got:?}", case.name),
            }
        }
    }
}
