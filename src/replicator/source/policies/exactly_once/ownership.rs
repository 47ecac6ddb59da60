//! Partitions coming and going: a new owner fences the previous writer before it reads where
//! the partition stands; a partition given up commits (or, when lost, leaves its transaction to
//! the next owner's fencing).

use super::*;
use crate::replicator::source::engine::fenced::{self, FencedPositions};

impl FencedPositions for ExactlyOnce {
    fn table_mut(&mut self) -> &mut SlotTable<TxSlot> {
        &mut self.slots
    }

    /// Restarts it from its committed position rather than from wherever the consumer starts.
    fn assigned_again(&mut self, idx: usize) {
        let Some((topic, partition)) =
            (self.slots.get(idx)).map(|s| (s.topic.clone(), s.partition))
        else {
            return;
        };
        self.end(&topic, partition, false);
        if let Some(slot) = self.slots.get_mut(idx) {
            slot.prepare_at(Instant::now());
        }
    }

    fn take(&mut self, topic: &str, partition: i32) -> TxSlot {
        let part = TxPart {
            transactional_id: transactional_id(&self.shared.ctx.flow, topic, partition),
            producer: None,
            phase: Phase::Preparing {
                retry_at: Instant::now(),
            },
            committed: None,
            latest: None,
            policy: SyncPolicy::new(
                TopicPartition::new(topic.to_string(), partition),
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
        Slot::new(
            topic.to_string(),
            partition,
            self.shared.remote_topic(topic).into(),
            self.slots.next_generation(),
            Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
            part,
        )
    }

    fn prepare(&mut self, keys: &[(String, i32)]) -> Vec<(String, i32, Offset)> {
        ExactlyOnce::prepare(self, keys)
    }
}

impl Owner for ExactlyOnce {
    /// Partitions were given to this replica: fence their previous writers, read their
    /// positions and start each there.
    fn assigned(&mut self, tpl: &mut TopicPartitionList) {
        fenced::assign(self, tpl);
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
