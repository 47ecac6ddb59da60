//! Partitions coming and going: where each starts (its stored position checked against both
//! logs) and what is settled before one is given up.

use super::*;

impl Owner for AtLeastOnce {
    /// Partitions were given to this replica: read the positions topic to its end (the
    /// previous owner stored its positions before letting go) and start each partition there.
    fn assigned(&mut self, tpl: &mut TopicPartitionList) {
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
        while self.shared.read_positions().is_err() {
            if self.shared.shutdown.is_cancelled() {
                // Shutting down: nothing will be copied, the offsets do not matter.
                return;
            }
            std::thread::sleep(backoff.next_delay());
        }
        let mut fresh = Vec::new();
        for (topic, partition) in rebalance::partitions(tpl) {
            if let Some(idx) = self.slots.index(&topic, partition) {
                // Already ours (not expected from librdkafka): restart it from its safe point
                // rather than let the consumer fall back to the beginning.
                let generation = self.slots.next_generation();
                if let Some(slot) = self.slots.get_mut(idx) {
                    slot.generation = generation;
                    slot.clear_in_flight();
                    slot.fault = None;
                    let offset = slot
                        .progress
                        .rewind()
                        .map_or(Offset::Beginning, |f| Offset::Offset(f.next));
                    if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
                        tracing::error!(%topic, partition, error = %e, "cannot set the start offset");
                    }
                }
                continue;
            }
            fresh.push((topic, partition));
        }
        // Stored positions are checked against both logs before anything is read.
        let fresh: Vec<(String, i32, String)> = fresh
            .into_iter()
            .map(|(t, p)| {
                let remote = self.shared.remote_topic(&t);
                (t, p, remote)
            })
            .collect();
        let resumes = continuity::resume_all(&self.shared.positions, &self.shared.probe, &fresh);
        for ((topic, partition, remote), r) in fresh.into_iter().zip(resumes) {
            if let Some((kind, from, to)) = r.gap {
                let gap = continuity::found_now(&topic, partition, (kind, from, to));
                self.write_gap(&gap, r.start);
            }
            let Resume { offset, start, .. } = r;
            if let Err(e) = tpl.set_partition_offset(&topic, partition, offset) {
                tracing::error!(%topic, partition, error = %e, "cannot set the start offset");
            }
            tracing::debug!(%topic, partition, ?offset, "partition assigned");
            let generation = self.slots.next_generation();
            let limit = self.limits.get(&remote);
            let progress = Progress::new(
                TopicPartition::new(topic.clone(), partition),
                self.shared.sync_config,
                start,
            );
            self.slots.insert(Slot::new(
                topic,
                partition,
                remote.into(),
                generation,
                progress,
                limit,
            ));
        }
        self.report_assignment();
    }

    /// Partitions are taken away: finish their writes and store their positions first, so the
    /// next owner resumes exactly where this one stopped.
    fn revoked(&mut self, tpl: &TopicPartitionList, lost: bool) {
        let idxs: Vec<usize> = (tpl.elements().iter())
            .filter_map(|e| self.slots.index(e.topic(), e.partition()))
            .collect();
        if !lost {
            self.persist_and_wait(&idxs);
        }
        for e in tpl.elements() {
            self.slots.remove(e.topic(), e.partition());
        }
        if lost {
            // Another replica may already own them and copy into the same target partitions.
            // Storing would move its positions back, and an offset sync for a copy landing
            // among its copies could translate a group past records it copied: the slots are
            // gone before the outstanding writes finish, so their acknowledgements are ignored.
            tracing::warn!(
                partitions = idxs.len(),
                "assignment lost (session timed out)"
            );
            self.drain(Duration::from_secs(5));
        }
        self.report_assignment();
    }

    type Slot = Slot;

    fn slots(&self) -> &SlotTable<Slot> {
        &self.slots
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }

    const FAILED_REBALANCE_IS_LOST: bool = false;
    const MODE: &str = "at-least-once";
}
