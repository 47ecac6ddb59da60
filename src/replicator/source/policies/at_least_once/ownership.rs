//! Partitions coming and going: the engine's skeleton for policies that resume from stored
//! positions ([`stored`]), with this policy's slot.

use super::*;
use crate::replicator::source::engine::stored::{self, StoredPositions, Taken};

impl StoredPositions for AtLeastOnce {
    fn table_mut(&mut self) -> &mut SlotTable<Slot> {
        &mut self.slots
    }

    fn read_positions(&mut self) -> bool {
        self.shared.read_positions().is_ok()
    }

    /// Restarts it from its safe point rather than let the consumer fall back to the
    /// beginning.
    fn assigned_again(&mut self, idx: usize) -> Option<Offset> {
        let generation = self.slots.next_generation();
        let slot = self.slots.get_mut(idx)?;
        slot.generation = generation;
        slot.clear_in_flight();
        slot.fault = None;
        Some(
            slot.progress
                .rewind()
                .map_or(Offset::Beginning, |f| Offset::Offset(f.next)),
        )
    }

    fn take(&mut self, t: Taken) -> Slot {
        let limit = self.limits.get(&t.remote);
        acks::new_slot(
            t.topic,
            t.partition,
            t.remote.into(),
            t.generation,
            t.progress,
            limit,
        )
    }

    fn write_gap(&mut self, gap: &Gap, start: Option<Frontier>) {
        AtLeastOnce::write_gap(self, gap, start);
    }

    fn persist_and_wait(&mut self, idxs: &[usize]) {
        AtLeastOnce::persist_and_wait(self, idxs);
    }

    fn drain(&mut self, timeout: Duration) {
        AtLeastOnce::drain(self, timeout);
    }
}

impl Owner for AtLeastOnce {
    fn assigned(&mut self, tpl: &mut TopicPartitionList) {
        stored::assign(self, tpl);
    }

    fn revoked(&mut self, tpl: &TopicPartitionList, lost: bool) {
        stored::revoke(self, tpl, lost);
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
