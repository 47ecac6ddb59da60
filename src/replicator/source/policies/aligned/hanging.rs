//! A transaction left open at the end of a remote partition after its writer was fenced (a
//! hanging transaction). Seen here when the target broker restarted between a transaction's
//! end and its marker: the coordinator counted the transaction as ended, the partition never
//! got the marker, and its last stable offset stayed before the record for good. Every
//! `read_committed` reader of that partition, the copy's own alignment checks included, is
//! stuck there until something ends it.
//!
//! The partition's own transactional id is the one that wrote there, so its producer id is
//! the hanging transaction's: a transaction of the current (fenced-in) producer that writes one
//! filler to the partition and aborts ends it, the stray record aborted with the filler. The
//! copy then goes on translated from the stray record's offset, its break recorded. An open
//! transaction of another producer cannot be ended that way: after a few tries the partition is
//! copied on translated and the break recorded ([`GapKind::OpenTransaction`]: the status names
//! the administrator's fix).

use super::*;
use crate::replicator::source::engine::hanging::abort_fillers;

/// Closing attempts before the open transaction is taken for someone else's.
const CLOSE_ATTEMPTS: u32 = 3;

impl Aligned {
    /// `stable_end`: where the partition ends for `read_committed` readers (the open
    /// transaction's first offset); `high`: its high watermark. Ends with the partition
    /// prepared again (to see whether it closed) or, when it cannot be closed, copying on
    /// translated: the returned offset.
    pub(super) fn open_at_end(
        &mut self,
        idx: usize,
        bounds: crate::kafka::log_bounds::LogBounds,
        stable_end: i64,
        high: i64,
    ) -> Option<Offset> {
        let slot = self.slots.get_mut(idx)?;
        let (topic, partition, remote) = (slot.topic.clone(), slot.partition, slot.remote.clone());
        // Whatever the open transaction holds, no record from its first offset on is visible:
        // the copy resumes there once it has ended.
        slot.wrap_failed = Some(slot.wrap_failed.unwrap_or(stable_end).min(stable_end));
        slot.open_closes = slot.open_closes.saturating_add(1);
        if slot.open_closes <= CLOSE_ATTEMPTS {
            tracing::warn!(%topic, partition, %remote, stable_end, high,
                "a transaction is still open at the end of the remote partition after its writer was fenced; ending it with an aborted filler of the partition's producer");
            if let Err(e) = self.abort_one_filler(idx) {
                tracing::warn!(%topic, partition, error = %e, "ending the open transaction failed; retrying");
                self.count_error("transaction");
                if let Some(slot) = self.slots.get_mut(idx) {
                    // A producer in doubt is replaced: the next one's init fences it.
                    slot.txn = None;
                }
            }
            let delay = self
                .slots
                .get_mut(idx)
                .map_or(Duration::from_secs(1), |s| s.backoff.next_delay());
            self.prepare_again(idx, delay);
            return None;
        }
        tracing::error!(%topic, partition, %remote, stable_end, high,
            "a transaction of another producer stays open on the remote partition: its read_committed readers cannot read past offset {stable_end} until it ends (an administrator can end it: kafka-transactions.sh abort --topic {remote} --partition {partition} --start-offset {stable_end}); copying on, translated");
        self.count_error("open_transaction");
        // Taken again later (a rebalance), the same transaction is the same break.
        let recorded = self.shared.positions.gaps().iter().any(|g| {
            g.kind == GapKind::OpenTransaction
                && (g.topic.as_str(), g.partition, g.from)
                    == (topic.as_str(), partition, stable_end)
        });
        if !recorded {
            let gap = continuity::found_now(
                &topic,
                partition,
                (GapKind::OpenTransaction, stable_end, high),
            );
            self.write_gap(&gap);
        }
        let from = self.slots.get_mut(idx).and_then(|s| s.wrap_failed.take());
        let stored = self.shared.positions.get(&topic, partition);
        self.resume_translated(idx, stored, bounds, high, from)
    }

    /// One filler in a transaction of the partition's producer, aborted.
    fn abort_one_filler(&mut self, idx: usize) -> Result<(), String> {
        let slot = self.slots.get(idx).ok_or("no partition")?;
        let txn = slot.txn.as_ref().ok_or("no producer")?;
        let remote = [(slot.remote.to_string(), slot.partition)];
        abort_fillers(txn, &remote, &self.shared.shutdown, CALL_TIMEOUT)
    }
}
