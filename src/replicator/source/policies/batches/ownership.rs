//! Partitions coming and going: the engine's skeleton for policies that resume from stored
//! positions ([`stored`]), with this policy's slot. The consumer fetches none of them (the
//! engine pauses what this policy is assigned, [`FetchedBatches`]); the fetching thread
//! does, from the slot's first retry.

use rdkafka::{Offset, TopicPartitionList};

use super::*;
use crate::replicator::source::engine::rebalance::Owner;
use crate::replicator::source::engine::stored::{self, StoredPositions, Taken};

impl StoredPositions for Batches {
    fn table_mut(&mut self) -> &mut SlotTable<Slot> {
        &mut self.slots
    }

    fn read_positions(&mut self) -> bool {
        self.shared.read_positions().is_ok()
    }

    /// Left as it is: the consumer's position does not matter, the fetcher keeps its own.
    fn assigned_again(&mut self, _idx: usize) -> Option<Offset> {
        None
    }

    fn take(&mut self, t: Taken) -> Slot {
        // Fetched by the retry, which reads the log start where `offset` is not one.
        let fault = Fault {
            retry_at: Instant::now(),
            resume_from: match t.offset {
                Offset::Offset(next) => Some(Frontier {
                    next,
                    downstream: t.start.map_or(-1, |f| f.downstream),
                }),
                _ => t.start,
            },
        };
        Slot::new(
            t.topic,
            t.partition,
            t.remote.into(),
            t.generation,
            Backoff::new(RETRY_MIN, RETRY_MAX),
            Tracking::new(t.progress, Some(fault), Part::default()),
        )
    }

    fn write_gap(&mut self, gap: &Gap, start: Option<Frontier>) {
        Batches::write_gap(self, gap, start);
    }

    fn persist_and_wait(&mut self, idxs: &[usize]) {
        Batches::persist_and_wait(self, idxs);
    }

    fn drain(&mut self, timeout: Duration) {
        Batches::drain(self, timeout);
    }

    fn released(&mut self, slot: Slot) {
        if slot.stopped.is_some() {
            lock(&self.stops).remove(&(slot.remote.to_string(), slot.partition));
        }
        self.fetch.send(Command::Drop {
            topic: slot.topic,
            partition: slot.partition,
        });
    }

    fn assignment_taken(&mut self) {
        self.retry_faults();
    }
}

impl Owner for Batches {
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
    const MODE: &str = "batches";
}
