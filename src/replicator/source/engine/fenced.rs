//! The assignment skeleton of the policies that fence a partition's previous writer before they
//! read where it stands (exactly-once, aligned offsets), written once: each partition assigned
//! gets a slot (a partition held already is restarted instead), then the policy prepares them
//! all (fences, reads the committed or remote position) and the consumer starts each one it
//! could prepare there, the others at the beginning until they are prepared and moved.
//! What is settled when a partition goes differs too much between them to share: a
//! transaction committed or left to the next owner's fencing, against plain writes drained.

use rdkafka::{Offset, TopicPartitionList};

use super::rebalance::{self, Owner};
use super::slots::SlotTable;

/// What a fencing policy decides when partitions are assigned.
pub trait FencedPositions: Owner {
    fn table_mut(&mut self) -> &mut SlotTable<Self::Slot>;
    /// A partition held already was assigned again (an eager assignor hands out the whole set
    /// again): restart it from where the policy knows it stands.
    fn assigned_again(&mut self, idx: usize);
    /// The slot of a partition newly assigned, not prepared yet.
    fn take(&mut self, topic: &str, partition: i32) -> Self::Slot;
    /// Fences and reads the position of each of `keys`; the start offset of those it could.
    fn prepare(&mut self, keys: &[(String, i32)]) -> Vec<(String, i32, Offset)>;
}

/// Partitions were given to this replica: fence their previous writers, read their positions
/// and start each there.
pub fn assign<P: FencedPositions>(policy: &mut P, tpl: &mut TopicPartitionList) {
    let keys = rebalance::partitions(tpl);
    for (topic, partition) in &keys {
        match policy.slots().index(topic, *partition) {
            Some(idx) => policy.assigned_again(idx),
            None => {
                let slot = policy.take(topic, *partition);
                policy.table_mut().insert(slot);
            }
        }
    }
    let ready = policy.prepare(&keys);
    rebalance::set_start_offsets(tpl, &keys, ready);
    policy.report_assignment();
}
