//! The ownership skeleton of the policies that resume a partition from its position stored on
//! the target (at-least-once, whole batches), written once: the policy answers the hooks of
//! [`StoredPositions`], this decides when each runs.
//!
//! - Assigned: the positions topic is read to its end (the previous owner stored its positions
//!   before letting go), each new partition's stored position is checked against both logs
//!   ([`continuity::resume_all`]), a break found is recorded before copying starts, and the
//!   partition starts where the check says.
//! - Revoked in good order: the writes settle and the positions are stored first, so the next
//!   owner resumes exactly where this one stopped.
//! - Lost (the session timed out): another replica may already copy into the same target
//!   partitions. Storing would move its positions back, and an offset sync for a copy landing
//!   among its copies could translate a group past records it copied: the slots go before the
//!   outstanding writes finish, so their acknowledgements are ignored.

use std::time::Duration;

use rdkafka::{Offset, TopicPartitionList};

use super::rebalance::{self, Owner};
use super::slots::SlotTable;
use crate::kafka::positions::Gap;
use crate::mm2::TopicPartition;
use crate::replicator::backoff::Backoff;
use crate::replicator::source::continuity::{self, Resume};
use crate::replicator::source::progress::{Frontier, Progress};

/// How long a lost assignment's writes are drained (their answers move nothing).
const LOST_DRAIN: Duration = Duration::from_secs(5);

/// A partition newly assigned, resumed: what its policy builds its slot from.
pub struct Taken {
    pub topic: String,
    pub partition: i32,
    pub remote: String,
    pub generation: u32,
    pub progress: Progress,
    /// Where the consumer starts it ([`Resume::offset`]).
    pub offset: Offset,
    /// The committable point it resumes from, when one was stored and checked.
    pub start: Option<Frontier>,
}

/// What a policy that resumes from stored positions decides when partitions come and go.
pub trait StoredPositions: Owner {
    fn table_mut(&mut self) -> &mut SlotTable<Self::Slot>;
    /// Reads the positions topic to its end; an error is retried with backoff.
    fn read_positions(&mut self) -> bool;
    /// A partition held already was assigned again (not expected from librdkafka): where the
    /// consumer starts it, or `None` to leave it as it is.
    fn assigned_again(&mut self, idx: usize) -> Option<Offset>;
    /// The slot of a partition newly assigned.
    fn take(&mut self, taken: Taken) -> Self::Slot;
    /// Records a break found at resumption, with the position copying resumes from.
    fn write_gap(&mut self, gap: &Gap, start: Option<Frontier>);
    /// Settles the writes of `idxs`, stores their positions and waits for the target.
    fn persist_and_wait(&mut self, idxs: &[usize]);
    /// Waits up to `timeout` for the writes outstanding.
    fn drain(&mut self, timeout: Duration);
    /// A slot given up (after its positions were stored, or lost).
    fn released(&mut self, _slot: Self::Slot) {}
    /// Every new partition has its slot.
    fn assignment_taken(&mut self) {}
}

/// Partitions were given to this replica: start each where its checked position says.
pub fn assign<P: StoredPositions>(policy: &mut P, tpl: &mut TopicPartitionList) {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    while !policy.read_positions() {
        if policy.shared().shutdown.is_cancelled() {
            // Shutting down: nothing will be copied, the offsets do not matter.
            return;
        }
        std::thread::sleep(backoff.next_delay());
    }
    let mut fresh = Vec::new();
    for (topic, partition) in rebalance::partitions(tpl) {
        let Some(idx) = policy.slots().index(&topic, partition) else {
            let remote = policy.shared().remote_topic(&topic);
            fresh.push((topic, partition, remote));
            continue;
        };
        if let Some(offset) = policy.assigned_again(idx) {
            set_offset(tpl, &topic, partition, offset);
        }
    }
    let shared = policy.shared();
    let resumes = continuity::resume_all(&shared.positions, &shared.probe, &fresh);
    for ((topic, partition, remote), r) in fresh.into_iter().zip(resumes) {
        if let Some(found) = r.gap {
            let gap = continuity::found_now(&topic, partition, found);
            policy.write_gap(&gap, r.start);
        }
        let Resume { offset, start, .. } = r;
        set_offset(tpl, &topic, partition, offset);
        tracing::debug!(%topic, partition, ?offset, "partition assigned");
        let mut progress = Progress::new(
            TopicPartition::new(topic.clone(), partition),
            policy.shared().sync_config,
            start,
        );
        if let Offset::Offset(position) = offset {
            progress.reading_from(position);
        }
        let generation = policy.table_mut().next_generation();
        let slot = policy.take(Taken {
            topic,
            partition,
            remote,
            generation,
            progress,
            offset,
            start,
        });
        policy.table_mut().insert(slot);
    }
    policy.assignment_taken();
    policy.report_assignment();
}

/// Partitions were taken away: their positions stored first, unless the assignment was lost.
pub fn revoke<P: StoredPositions>(policy: &mut P, tpl: &TopicPartitionList, lost: bool) {
    let idxs: Vec<usize> = (tpl.elements().iter())
        .filter_map(|e| policy.slots().index(e.topic(), e.partition()))
        .collect();
    if !lost {
        policy.persist_and_wait(&idxs);
    }
    for e in tpl.elements() {
        if let Some(slot) = policy.table_mut().remove(e.topic(), e.partition()) {
            policy.released(slot);
        }
    }
    if lost {
        tracing::warn!(
            partitions = idxs.len(),
            "assignment lost (session timed out)"
        );
        policy.drain(LOST_DRAIN);
    }
    policy.report_assignment();
}

fn set_offset(tpl: &mut TopicPartitionList, topic: &str, partition: i32, offset: Offset) {
    if let Err(e) = tpl.set_partition_offset(topic, partition, offset) {
        tracing::error!(%topic, partition, error = %e, "cannot set the start offset");
    }
}
