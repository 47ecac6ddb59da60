//! Partitions coming and going: a new owner fences the previous writer before it reads where
//! the partition stands; a partition given up commits (or, when lost, leaves its transaction to
//! the next owner's fencing).

use super::*;

impl Owner for ExactlyOnce {
    /// Partitions were given to this replica: fence their previous writers, read their
    /// positions and start each there.
    fn assigned(&mut self, tpl: &mut TopicPartitionList) {
        let keys = rebalance::partitions(tpl);
        for (topic, partition) in &keys {
            if self.slots.find(topic, *partition).is_some() {
                // Already ours (an eager assignor hands out the whole set again): restart it
                // from its committed position rather than from wherever the consumer starts.
                self.end(topic, *partition, false);
                if let Some(slot) = self.slots.find_mut(topic, *partition) {
                    slot.prepare_at(Instant::now());
                }
                continue;
            }
            let slot = TxSlot {
                topic: topic.clone(),
                partition: *partition,
                remote: self.shared.remote_topic(topic),
                transactional_id: transactional_id(&self.shared.ctx.flow, topic, *partition),
                producer: None,
                phase: Phase::Preparing {
                    retry_at: Instant::now(),
                },
                backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
                committed: None,
                latest: None,
                policy: SyncPolicy::new(
                    TopicPartition::new(topic.clone(), *partition),
                    self.shared.sync_config,
                ),
                records: 0,
                bytes: 0,
                failed: None,
                recheck: false,
                rewind: Retry::new(Duration::from_millis(500), Duration::from_secs(30)),
                capped_by: None,
                large: Vec::new(),
                refused: None,
            };
            self.slots.insert(slot);
        }
        let ready = self.prepare(&keys);
        rebalance::set_start_offsets(tpl, &keys, ready);
        self.report_assignment();
    }

    /// Partitions are taken away: commit what was copied (unless the assignment was lost:
    /// then the next owner's fencing aborts it anyway) and drop their producers.
    fn revoked(&mut self, tpl: &TopicPartitionList, lost: bool) {
        for e in tpl.elements() {
            self.end(e.topic(), e.partition(), !lost);
            self.slots.remove(e.topic(), e.partition());
        }
        self.report_assignment();
    }

    type Slot = TxSlot;

    fn slots(&self) -> &SlotTable<TxSlot> {
        &self.slots
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }

    const FAILED_REBALANCE_IS_LOST: bool = true;
    const MODE: &str = "exactly-once";
}
