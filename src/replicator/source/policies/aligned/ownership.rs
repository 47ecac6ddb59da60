//! Partitions coming and going: a new owner fences the previous writer and resumes where the
//! remote partition ends; a partition given up settles its plain writes and stores its
//! position (what is held is read again by the next owner: the target's end is before it).

use super::*;
use crate::replicator::source::engine::fenced::{self, FencedPositions};

impl FencedPositions for Aligned {
    fn table_mut(&mut self) -> &mut SlotTable<AlignedSlot> {
        &mut self.slots
    }

    /// Resumes it where the target ends rather than wherever the consumer starts.
    fn assigned_again(&mut self, idx: usize) {
        self.prepare_again(idx, Duration::ZERO);
    }

    fn take(&mut self, topic: &str, partition: i32) -> AlignedSlot {
        let remote = self.shared.remote_topic(topic);
        let group = crate::replicator::source::source_group_id(&self.shared.ctx.flow);
        let base = group.strip_suffix(".source").unwrap_or(&group);
        let part = AlignedPart::new(
            format!("{base}.aligned.{topic}-{partition}"),
            State::Preparing {
                retry_at: Instant::now(),
            },
            SyncPolicy::new(
                TopicPartition::new(topic.to_string(), partition),
                self.shared.sync_config,
            ),
            Patience::new(WATERMARK_TIMEOUT, CALL_TIMEOUT),
        );
        Slot::new(
            topic.to_string(),
            partition,
            remote.into(),
            self.slots.next_generation(),
            Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
            part,
        )
    }

    fn prepare(&mut self, keys: &[(String, i32)]) -> Vec<(String, i32, Offset)> {
        Aligned::prepare(self, keys)
    }
}

impl Owner for Aligned {
    fn assigned(&mut self, tpl: &mut TopicPartitionList) {
        fenced::assign(self, tpl);
    }

    fn revoked(&mut self, tpl: &TopicPartitionList, _lost: bool) {
        self.drain(DRAIN_TIMEOUT);
        self.persist();
        let _ = self.producer.flush(DRAIN_TIMEOUT);
        for e in tpl.elements() {
            self.slots.remove(e.topic(), e.partition());
        }
        self.report_assignment();
    }

    type Slot = AlignedSlot;

    fn slots(&self) -> &SlotTable<AlignedSlot> {
        &self.slots
    }

    fn shared(&self) -> &Shared {
        &self.shared
    }

    // The next owner fences the partition's transactions and resumes where the target ends.
    const FAILED_REBALANCE_IS_LOST: bool = true;
    const MODE: &str = "aligned";
}
