//! What the target answered: written batches move their partitions on (offset syncs, metrics),
//! faults rewind them; positions are stored and writes settled before a partition is let go.

use super::*;

impl Batches {
    /// What the writer brought: acknowledged batches move their partitions on, faults rewind.
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
        let (now, wall_ms) = (self.shared.now(), crate::clock::now_ms());
        let mut syncs = Vec::new();
        for w in &written.written {
            let t = w.token;
            self.pending.answered(&t);
            let Some(slot) = self.slots.get_mut(t.idx).filter(|s| s.live(t.generation)) else {
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
            if slot.stopped {
                slot.stopped = false;
                lock(&self.stops).remove(&(slot.remote.to_string(), slot.partition));
            }
            slot.backoff.reset();
            slot.last_fault = None;
            let age_ms = wall_ms.saturating_sub(t.max_timestamp);
            let records = u64::try_from(t.records).unwrap_or(0);
            self.meters
                .copied(records, t.bytes, t.read_at, Some(age_ms));
            if let Some(sync) = sync {
                syncs.push((t.idx, t.generation, sync));
            }
        }
        if !written.written.is_empty() {
            self.shared.target_health.ok();
        }
        for (idx, generation, sync) in syncs {
            self.write_sync(idx, generation, &sync);
        }
        for f in written.faults {
            for t in &f.tokens {
                self.pending.answered(t);
            }
            let Some(t) = f
                .tokens
                .iter()
                .find(|t| self.slots.get(t.idx).is_some_and(|s| s.live(t.generation)))
            else {
                continue;
            };
            let idx = t.idx;
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
            if f.error.refuses_the_records() {
                self.stop(
                    idx,
                    Stop {
                        offset: t.base,
                        message,
                    },
                );
            } else {
                self.fault(idx, "produce", &message);
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
