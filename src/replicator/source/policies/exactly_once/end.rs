//! Ending a partition's transaction: its records' answers folded into offset syncs and the
//! position, a record the target refused alone passed as a recorded gap, then a commit (unless
//! a write failed or the caller aborts) or an abort, and what the outcome means for the
//! partition: committed, copied again from the committed position, or prepared again with a
//! new producer.

use super::*;

/// A transaction's producer, borrowed for the steps of [`ExactlyOnce::end`].
type TxProducer = BaseProducer<AckContext>;

impl ExactlyOnce {
    /// Ends the open transaction of a partition, if it has one: commit (after its syncs and
    /// position) unless a write failed or `commit` is false, abort otherwise.
    pub(super) fn end(&mut self, topic: &str, partition: i32, commit: bool) -> Option<Ended> {
        let now = self.shared.now();
        let ExactlyOnce { shared, slots, .. } = self;
        let Slot {
            own: slot, backoff, ..
        } = slots.find_mut(topic, partition).filter(|s| s.open())?;
        // Out of the slot while the steps below change the rest of it; put back unless lost.
        let Some(producer) = slot.producer.take() else {
            return Some(Ended::Lost);
        };
        let delivered = settle_answers(slot, &producer, shared, now);
        if delivered {
            shared.target_health.ok();
        }
        let rejected = match commit {
            true => pass_refused(slot, &producer, shared, (topic, partition)),
            false => None,
        };
        if commit {
            write_position(slot, &producer, shared, (topic, partition));
        }
        if slot.failed.as_ref().is_some_and(TxFailure::needs_recheck) {
            slot.recheck = true;
        }
        let outcome = finish(slot, &producer, commit);
        slot.phase = Phase::Ready;
        // Delivery reports of the syncs and the position.
        producer.context().discard();
        match outcome {
            Ended::Committed => {
                // Each committed range, so a record copied twice can be traced to the two
                // transactions (and writers) that committed it.
                tracing::debug!(%topic, partition, from = ?slot.committed, to = ?slot.latest,
                    records = slot.records, "transaction committed");
                committed(slot, shared, topic, rejected.is_some());
                backoff.reset();
            }
            Ended::Rewind | Ended::Lost => {
                aborted(slot, shared, (topic, partition), commit);
            }
        }
        slot.records = 0;
        slot.bytes = 0;
        slot.failed = None;
        match outcome {
            Ended::Lost => {
                let wait = retry_wait(&producer, backoff, (topic, partition));
                // Dropping a fenced or broken producer; a new one is initialised before the
                // next write, which also fences this one for good.
                drop(producer);
                slot.prepare_at(Instant::now() + wait);
            }
            _ => slot.producer = Some(producer),
        }
        Some(outcome)
    }
}

/// Reads the answers of every record of the transaction (flushing first: each record's target
/// offset is needed for its offset sync and the position), notes a record the target refused
/// as too large, and adds the offset syncs the answers call for to the transaction. Whether a
/// record was delivered.
fn settle_answers(
    slot: &mut TxPart,
    producer: &TxProducer,
    shared: &Shared,
    now: Duration,
) -> bool {
    if let Err(e) = producer.flush(CALL_TIMEOUT) {
        slot.failed = Some(TxFailure::Flush(e));
    }
    let mut acks = Vec::new();
    producer.context().take(&mut acks);
    let delivered = acks.iter().any(|a| a.result.is_ok());
    let too_large = acks.iter().find_map(|a| match &a.result {
        Err(KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)) => {
            txn::upstream_of(a)
        }
        _ => None,
    });
    if let Some(offset) = too_large {
        note_too_large(slot, offset);
    }
    slot.large.clear();
    if slot.failed.is_none() {
        match absorb(&mut slot.policy, &mut slot.latest, acks, now) {
            Ok(syncs) => {
                for sync in syncs {
                    if let Err(e) =
                        send_sync(producer, &shared.syncs_topic, &sync, &shared.shutdown)
                    {
                        slot.failed = Some(e);
                        break;
                    }
                }
            }
            Err(e) => slot.failed = Some(e),
        }
    }
    delivered
}

/// The target refused the record at `offset` as too large.
fn note_too_large(slot: &mut TxPart, offset: i64) {
    if slot.capped_by.is_some() {
        // Batches are capped under the limit: the refused batch held this record alone.
        let bytes = (slot.large.iter())
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
        slot.failed = Some(TxFailure::BatchTooLarge { offset });
    }
}

/// A transaction about to commit that passed a record refused before: the position moves past
/// it (even when it was the transaction's last record) and the gap is recorded in the same
/// transaction. The record passed, once its gap is written.
fn pass_refused(
    slot: &mut TxPart,
    producer: &TxProducer,
    shared: &Shared,
    (topic, partition): (&str, i32),
) -> Option<Refused> {
    let r = slot.refused.filter(|r| r.passed)?;
    if slot.failed.is_some() || slot.committed.is_some_and(|c| c.next > r.offset) {
        return None;
    }
    if slot.latest.is_none_or(|l| l.next <= r.offset) {
        slot.latest = Some(Frontier {
            next: r.offset.saturating_add(1),
            downstream: slot.latest.map_or(-1, |l| l.downstream),
        });
    }
    let kind = positions::GapKind::rejected(r.bytes, r.limit);
    let gap = continuity::found_now(
        topic,
        partition,
        (kind, r.offset, r.offset.saturating_add(1)),
    );
    let written = continuity::record(&gap, &shared.ctx.metrics, |key, value| {
        let record = send::internal(&shared.positions_topic, key, value, NOT_A_RECORD);
        producer.send(record).map_err(|(e, _)| e)
    });
    if !written {
        slot.failed = Some(TxFailure::Gap);
        return None;
    }
    Some(r)
}

/// Adds the partition's new position to a transaction about to commit.
fn write_position(
    slot: &mut TxPart,
    producer: &TxProducer,
    shared: &Shared,
    (topic, partition): (&str, i32),
) {
    let Some(position) = slot.latest.filter(|_| slot.failed.is_none()) else {
        return;
    };
    if slot.latest == slot.committed {
        return;
    }
    let key = positions::encode_key(topic, partition);
    let value = positions::encode_value(position);
    let record = send::internal(&shared.positions_topic, &key, &value, NOT_A_RECORD);
    if let Err(e) = send::send_waiting(producer, record, &shared.shutdown, None) {
        slot.failed = Some(TxFailure::Position(e));
    }
}

/// Commits the transaction when nothing failed and `commit`, aborts it otherwise.
fn finish(slot: &mut TxPart, producer: &TxProducer, commit: bool) -> Ended {
    match (&slot.failed, commit) {
        (None, true) => match producer.commit_transaction(CALL_TIMEOUT) {
            Ok(()) => Ended::Committed,
            Err(e) => {
                // A failed call does not mean a failed commit (e.g. a timeout while the target
                // restarts: the coordinator may still complete it). Rewinding to the position
                // held here would then copy the committed records again. Only a new producer's
                // init_transactions settles the transaction; the positions topic then says
                // where the partition really is.
                slot.failed = Some(TxFailure::Commit(e));
                Ended::Lost
            }
        },
        _ => match producer.abort_transaction(CALL_TIMEOUT) {
            Ok(()) => Ended::Rewind,
            Err(_) => Ended::Lost,
        },
    }
}

/// A committed transaction: its records count, its position is the committed one, and a
/// record it passed is counted as rejected.
fn committed(slot: &mut TxPart, shared: &Shared, topic: &str, passed_refused: bool) {
    let m = &shared.ctx.metrics;
    m.records_replicated.inc_by(slot.records);
    m.bytes_replicated.inc_by(slot.bytes);
    slot.committed = slot.latest;
    slot.rewind.succeeded();
    if passed_refused {
        slot.refused = None;
        m.records_rejected.with_label_values(&[topic]).inc();
    }
}

/// An aborted (or lost) transaction: the partition goes back to its committed position with a
/// fresh sync policy; a refused record it passed is passed again by the next one.
fn aborted(slot: &mut TxPart, shared: &Shared, (topic, partition): (&str, i32), commit: bool) {
    if commit {
        let reason =
            (slot.failed.as_ref()).map_or_else(|| "aborted".to_string(), ToString::to_string);
        tracing::warn!(%topic, partition, %reason,
            "transaction aborted; the partition is copied again from its committed position");
    }
    let m = &shared.ctx.metrics;
    m.errors.with_label_values(&["source", "transaction"]).inc();
    if let Some(r) = slot.refused.as_mut() {
        r.passed = false;
    }
    slot.latest = slot.committed;
    slot.policy = SyncPolicy::new(
        TopicPartition::new(topic.to_string(), partition),
        shared.sync_config,
    );
    if let Some(committed) = slot.committed {
        slot.policy.reading_from(committed.next, None);
    }
}

/// How long a partition whose producer is unusable waits before it is prepared again. A
/// fenced producer means another replica took the partition (this one missed a rebalance):
/// the group gets time to tell this replica before it takes the partition back, which would be
/// safe but would only fence the rightful owner in turn.
fn retry_wait(
    producer: &TxProducer,
    backoff: &mut Backoff,
    (topic, partition): (&str, i32),
) -> Duration {
    let fenced = (producer.client().fatal_error()).is_some_and(|(code, _)| {
        matches!(
            code,
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
        )
    });
    if fenced {
        tracing::warn!(%topic, partition,
            "fenced: another writer took the partition; retrying after {FENCED_RETRY:?}");
        FENCED_RETRY.max(backoff.next_delay())
    } else {
        backoff.next_delay()
    }
}
