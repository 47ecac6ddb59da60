//! Writing a partition's plan ([`super::plan`]): plain records through the shared idempotent
//! producer, asynchronously; transactions (a wrapped record, aborted fillers) through the
//! partition's own transactional producer, after its plain writes are acknowledged and until
//! the marker is on the target.

use super::*;

impl Aligned {
    /// Carries out `steps` for the partition's held record and the jump after it; fillers take
    /// `timestamp` (the record after the jump's). False when the partition stopped copying.
    pub(super) fn apply(&mut self, idx: usize, steps: &[Step], timestamp: Option<i64>) -> bool {
        for step in steps {
            let Some(slot) = self.slots.get_mut(idx) else {
                return false;
            };
            let generation = slot.generation;
            let ok = match *step {
                Step::Plain => {
                    let Some(held) = slot.held.take() else {
                        return false;
                    };
                    let (remote, expected) = (slot.remote.clone(), slot.next_target);
                    slot.next_target = expected.saturating_add(1);
                    let (record, bytes) =
                        send::forward(&held, &remote, opaque(idx, generation, false));
                    self.send_plain(
                        idx,
                        generation,
                        record,
                        held.offset(),
                        expected,
                        bytes as u64,
                    )
                }
                Step::Visible(n) => {
                    // A record at the target's end was deleted (compaction) before it was read:
                    // the numbers stay right, a marked filler is visible there.
                    self.shared
                        .ctx
                        .metrics
                        .errors
                        .with_label_values(&["source", "visible_filler"])
                        .inc();
                    let Some(slot) = self.slots.get_mut(idx) else {
                        return false;
                    };
                    let (remote, partition, first) =
                        (slot.remote.clone(), slot.partition, slot.next_target);
                    slot.next_target = first.saturating_add(n);
                    let headers = filler_headers();
                    (0..n).all(|i| {
                        let record = filler(&remote, partition, &headers, timestamp)
                            .set_opaque(idx, generation);
                        self.send_plain(idx, generation, record, -1, first + i, 0)
                    })
                }
                Step::Wrapped | Step::Aborted(_) => self.defer(idx, *step, timestamp),
            };
            if !ok {
                return false;
            }
        }
        true
    }

    /// What a transaction of the partition's own producer ([`pending`]) did: the held record
    /// committed (its marker fills the jump of one after it), or `n` fillers aborted, from
    /// target offset `first`. False when the partition is prepared again.
    pub(super) fn ended_transaction(
        &mut self,
        (idx, generation): (usize, u32),
        (step, held, first): (Step, Option<OwnedMessage>, i64),
        written: Result<i64, Ended>,
    ) -> bool {
        let Some(slot) = self.slots.get_mut(idx) else {
            return false;
        };
        let partition = slot.partition;
        let topic = slot.topic.clone();
        if let Err(Ended::Failed(_)) = written
            && let Some(txn) = slot.txn.as_ref()
        {
            let _ = txn.abort_transaction(CALL_TIMEOUT);
        }
        let wrapped = held.as_ref().map(Message::offset);
        frontier_after(&mut slot.own, step, first, wrapped, &written);
        match written {
            Ok(_) => {
                let now = self.shared.started.elapsed();
                let mut sync = None;
                if let (Step::Wrapped, Some(h)) = (step, &held) {
                    let bytes = h.key().map_or(0, <[u8]>::len) + h.payload().map_or(0, <[u8]>::len);
                    self.shared.ctx.metrics.records_replicated.inc();
                    self.shared
                        .ctx
                        .metrics
                        .bytes_replicated
                        .inc_by(bytes as u64);
                    sync = slot.sync.observe(h.offset(), first, now);
                }
                if let Some(sync) = sync {
                    self.write_sync(idx, generation, &sync);
                }
                self.shared.target_health.ok();
                true
            }
            Err(Ended::MarkerUnseen(reason)) => {
                // Committed: the record is on the target (or, if the marker never comes, in a
                // hanging transaction the resume ends and copies after). Where the partition
                // goes on is read from the target's log once the marker is there; taking the
                // record for failed would copy it again, misaligned, one marker further on.
                tracing::warn!(%topic, partition, %reason,
                    "a transaction of the aligned copy committed but its marker is not on the target yet; the partition is prepared again from the target's end");
                if step == Step::Wrapped {
                    self.shared.ctx.metrics.records_replicated.inc();
                }
                let delay = slot.backoff.next_delay();
                self.count_error("marker_unseen");
                self.prepare_again(idx, delay);
                false
            }
            Err(Ended::Failed(reason)) => {
                tracing::warn!(%topic, partition, %reason,
                    "a transaction of the aligned copy failed; the partition is prepared again");
                let delay = slot.backoff.next_delay();
                self.count_error("transaction");
                self.prepare_again(idx, delay);
                false
            }
        }
    }

    /// Queues a plain write of the partition, waiting for room.
    pub(super) fn send_plain(
        &mut self,
        idx: usize,
        generation: u32,
        mut record: send::Record<'_>,
        source: i64,
        expected: i64,
        bytes: u64,
    ) -> bool {
        loop {
            match send::offer(&self.producer, record) {
                Offered::Queued => break,
                Offered::Full(back) => {
                    record = back;
                    std::thread::sleep(QUEUE_FULL_WAIT);
                    self.service_acks();
                    let live = self
                        .slots
                        .get(idx)
                        .is_some_and(|s| s.generation == generation && s.copying());
                    if !live || self.shared.shutdown.is_cancelled() {
                        return false;
                    }
                }
                Offered::Refused(error) => {
                    let reason = error.to_string();
                    self.fault(idx, &reason);
                    return false;
                }
            }
        }
        if let Some(slot) = self.slots.get_mut(idx) {
            slot.in_flight.push_back(InFlight {
                source,
                expected,
                bytes,
            });
        }
        true
    }
}

pub(super) use crate::replicator::source::engine::hanging::{filler, filler_headers, settle};

/// Opaques of records built without one.
pub(super) trait SetOpaque {
    fn set_opaque(self, idx: usize, generation: u32) -> Self;
    fn set_opaque_log_start(self) -> Self;
}

impl SetOpaque for send::Record<'_> {
    fn set_opaque(mut self, idx: usize, generation: u32) -> Self {
        self.delivery_opaque = opaque(idx, generation, false);
        self
    }
    fn set_opaque_log_start(mut self) -> Self {
        self.delivery_opaque = LOG_START_FILLER;
        self
    }
}

/// One transaction's writes: what it writes, where.
pub(super) struct Writing<'a> {
    pub step: Step,
    pub held: Option<&'a OwnedMessage>,
    pub remote: &'a str,
    pub partition: i32,
    /// The fillers' timestamp.
    pub timestamp: Option<i64>,
    /// The target offset its first record must land at.
    pub first: i64,
}

/// Moves the partition by how its transaction ended: past the marker once it is on the
/// target. Not at all when the marker was not seen: the transaction is committed, and the
/// resume reads where the partition goes on from the target's end (taking the record for
/// failed would copy it again, misaligned, one marker further on). A failed wrap is
/// remembered (`wrapped`: its record's source offset): its record may be aborted on the
/// target, so the resume looks there. Any producer that did not end in a seen marker is in
/// doubt and replaced: the next one's init fences it.
fn frontier_after(
    part: &mut AlignedPart,
    step: Step,
    first: i64,
    wrapped: Option<i64>,
    ended: &Result<i64, Ended>,
) {
    match ended {
        Ok(count) => {
            part.next_target = first.saturating_add(*count).saturating_add(1);
            let downstream = match step {
                Step::Wrapped => first,
                _ => part.latest.map_or(-1, |l| l.downstream),
            };
            part.latest = Some(Frontier {
                next: part.next_target,
                downstream,
            });
            return;
        }
        Err(Ended::MarkerUnseen(_)) => {}
        Err(Ended::Failed(_)) => {
            if step == Step::Wrapped {
                // The earliest record without a visible copy is where copying starts again.
                let at = wrapped.unwrap_or(first);
                part.wrap_failed = Some(part.wrap_failed.map_or(at, |w| w.min(at)));
            }
        }
    }
    part.txn = None;
}

/// How a transaction that did not end in its marker on the target ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// Not committed (or aborted, for fillers): its records may be aborted on the target.
    Failed(String),
    /// Committed, or aborted as planned, but the marker was not seen on the target in time.
    MarkerUnseen(String),
}

impl From<String> for Ended {
    fn from(reason: String) -> Self {
        Ended::Failed(reason)
    }
}

/// Writes `w` in a transaction of `txn`, checks that its records landed where alignment needs
/// them, commits (a wrapped record) or aborts (fillers) it, and waits until the marker is on
/// the target. The records written.
pub(super) fn write_in_transaction(
    txn: &BaseProducer<AckContext>,
    patience: &Patience,
    shutdown: &tokio_util::sync::CancellationToken,
    w: Writing<'_>,
) -> Result<i64, Ended> {
    let count = write_and_end(txn, shutdown, &w)?;
    // The coordinator writes the marker after it answered: a plain write now could land
    // before it. Wait until the partition ends after the marker.
    let after = w.first.saturating_add(count).saturating_add(1);
    marker_written((txn, patience), w.remote, w.partition, after).map_err(Ended::MarkerUnseen)?;
    Ok(count)
}

/// The transaction of `w`, written and ended (committed or aborted as its step says); the
/// records it wrote.
fn write_and_end(
    txn: &BaseProducer<AckContext>,
    shutdown: &tokio_util::sync::CancellationToken,
    w: &Writing<'_>,
) -> Result<i64, String> {
    txn.begin_transaction().map_err(|e| e.to_string())?;
    let count = match (w.step, w.held) {
        (Step::Wrapped, Some(h)) => {
            let (record, _) = send::forward(h, w.remote, 0);
            send::send_waiting(txn, record, shutdown, None).map_err(|e| e.to_string())?;
            1
        }
        (Step::Aborted(n), _) => {
            let headers = filler_headers();
            for _ in 0..n {
                let record = filler(w.remote, w.partition, &headers, w.timestamp);
                send::send_waiting(txn, record, shutdown, None).map_err(|e| e.to_string())?;
            }
            n
        }
        _ => return Err("nothing to write".into()),
    };
    // Reports first: an abort purges what is still queued, and those offsets would then be
    // missing.
    settle(txn, CALL_TIMEOUT)?;
    landed_at(txn, w.first, count)?;
    match w.step {
        Step::Wrapped => txn.commit_transaction(CALL_TIMEOUT),
        _ => txn.abort_transaction(CALL_TIMEOUT),
    }
    .map_err(|e| e.to_string())?;
    Ok(count)
}

/// Whether the transaction's `count` records landed at `first` on, in order.
fn landed_at(txn: &BaseProducer<AckContext>, first: i64, count: i64) -> Result<(), String> {
    let mut acks = Vec::new();
    txn.context().take(&mut acks);
    let landed: Vec<i64> = acks
        .iter()
        .map(|a| {
            a.result
                .as_ref()
                .map(|l| l.offset)
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let expected: Vec<i64> = (first..first.saturating_add(count)).collect();
    if landed != expected {
        return Err(format!(
            "landed at {:?}, expected {first}..{}",
            landed.first(),
            first.saturating_add(count)
        ));
    }
    Ok(())
}

/// Waits until `remote`'s `partition` ends at `after` or later (its marker written), at most
/// [`CALL_TIMEOUT`]; asked by the transaction's own producer (each partition's transaction
/// runs on a thread of its own).
fn marker_written(
    (watermarks, patience): (&BaseProducer<AckContext>, &Patience),
    remote: &str,
    partition: i32,
    after: i64,
) -> Result<(), String> {
    wait_for_end(after, CALL_TIMEOUT, MARKER_POLL, |within| {
        patience
            .ask(within, |limit| {
                watermarks
                    .client()
                    .fetch_watermarks(remote, partition, limit)
            })
            .map(|(_, high)| high)
            .map_err(|e| e.to_string())
    })
}

/// Asks `high` for the partition's end, with the time left, until it reaches `after`, for at
/// most `limit`. A failed ask (a watermark look-up timing out on a loaded broker or machine)
/// is asked again within the limit: the transaction is committed by then, and giving up on it
/// would copy its record a second time, one marker further on.
fn wait_for_end(
    after: i64,
    limit: Duration,
    poll: Duration,
    mut high: impl FnMut(Duration) -> Result<i64, String>,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let last = match high(left) {
            Ok(h) if h >= after => return Ok(()),
            Ok(h) => format!("the partition ended at {h}"),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "the marker at {} was not seen within {limit:?} ({last})",
                after - 1
            ));
        }
        std::thread::sleep(poll);
    }
}

#[cfg(test)]
mod marker_tests {
    use super::*;

    /// Where a partition stands after each way its transaction ends (a record wrapped at 41,
    /// landed at target offset 41, its marker at 42).
    #[test]
    fn a_partition_moves_past_a_seen_marker_only_and_a_committed_record_is_never_taken_for_failed()
    {
        let cases = [
            (Ok(1), Some(43), None),
            (
                Err(Ended::MarkerUnseen("not within 30s".into())),
                Some(41),
                None,
            ),
            (
                Err(Ended::Failed("commit timed out".into())),
                Some(41),
                Some(41),
            ),
        ];
        for (ended, next_target, wrap_failed) in cases {
            let (mut slots, idx, _) = super::super::settle::tests::table(&[]);
            let slot = slots.get_mut(idx).expect("the partition");
            slot.next_target = 41;
            frontier_after(&mut slot.own, Step::Wrapped, 41, Some(41), &ended);
            assert_eq!(Some(slot.next_target), next_target, "{ended:?}");
            assert_eq!(slot.wrap_failed, wrap_failed, "{ended:?}");
            let latest = slot.latest.map(|l| (l.next, l.downstream));
            assert_eq!(latest, ended.is_ok().then_some((43, 41)), "{ended:?}");
        }
        // Aborted fillers move the partition but not its newest copied record.
        let (mut slots, idx, _) = super::super::settle::tests::table(&[]);
        let slot = slots.get_mut(idx).expect("the partition");
        slot.latest = Some(Frontier {
            next: 10,
            downstream: 9,
        });
        frontier_after(&mut slot.own, Step::Aborted(3), 10, None, &Ok(3));
        assert_eq!(slot.next_target, 14);
        assert_eq!(slot.latest.map(|l| (l.next, l.downstream)), Some((14, 9)));
        // A failed abort of fillers leaves no failed wrap behind.
        frontier_after(
            &mut slot.own,
            Step::Aborted(3),
            14,
            None,
            &Err(Ended::Failed("x".into())),
        );
        assert_eq!(slot.wrap_failed, None);
    }

    #[test]
    fn a_failed_look_up_is_asked_again_until_the_end_passes_the_marker() {
        let mut answers = vec![
            Err("Meta data fetch error: OperationTimedOut".to_string()),
            Ok(1101),
            Err("Meta data fetch error: OperationTimedOut".to_string()),
            Ok(1102),
        ]
        .into_iter();
        let mut asked = 0;
        let waited = wait_for_end(1102, Duration::from_secs(5), Duration::ZERO, |_| {
            asked += 1;
            answers.next().unwrap_or(Ok(0))
        });
        assert_eq!(waited, Ok(()));
        assert_eq!(asked, 4);
    }

    #[test]
    fn each_ask_gets_the_time_left_at_most() {
        let mut given = Vec::new();
        let _ = wait_for_end(
            10,
            Duration::from_millis(50),
            Duration::from_millis(5),
            |left| {
                given.push(left);
                Err("slow".to_string())
            },
        );
        assert!(given.len() >= 2, "{given:?}");
        assert!(given.windows(2).all(|w| w[1] < w[0]), "{given:?}");
        assert!(given.iter().all(|g| *g <= Duration::from_millis(50)));
    }

    #[test]
    fn the_wait_ends_at_its_limit_with_the_last_answer() {
        let failing = wait_for_end(
            10,
            Duration::from_millis(20),
            Duration::from_millis(1),
            |_| Err("Meta data fetch error: OperationTimedOut".into()),
        );
        let err = failing.expect_err("never seen");
        assert!(
            err.contains("marker at 9") && err.contains("OperationTimedOut"),
            "{err}"
        );
        let short = wait_for_end(
            10,
            Duration::from_millis(20),
            Duration::from_millis(1),
            |_| Ok(9),
        );
        assert!(short.expect_err("never reached").contains("ended at 9"));
    }
}
