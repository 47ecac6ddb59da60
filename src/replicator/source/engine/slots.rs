//! The owned source partitions of a policy: a slot per partition, found by index (the opaque
//! of a delivery report names one) or by topic and partition (a polled record names one).
//!
//! Pure bookkeeping. A slot index is reused after its partition is given up, so every slot
//! carries a generation: a report for an older generation of the same index is stale (the
//! partition was rewound, moved, or is another partition now) and is ignored.

use std::collections::{HashMap, VecDeque};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use crate::replicator::backoff::Backoff;

/// What a slot knows of the partition it holds: its topic and partition.
pub trait Keyed {
    fn key(&self) -> (&str, i32);
}

/// A partition this replica owns: what the engine keeps of every one, whatever the policy
/// (where it is read from and written to, the generation of its slot, the backoff of its
/// retries), and `own`, what its policy keeps besides. The slot reads as its policy's part too
/// (`Deref`), so a policy names its own fields as if they were the slot's.
#[derive(Debug)]
pub struct Slot<P> {
    pub topic: String,
    pub partition: i32,
    /// The remote topic on the target.
    pub remote: Arc<str>,
    /// Reports of an older generation of the same index are stale ([`SlotTable::next_generation`]).
    pub generation: u32,
    /// Between retries of a faulted or refused partition.
    pub backoff: Backoff,
    pub own: P,
}

impl<P> Slot<P> {
    pub fn new(
        topic: String,
        partition: i32,
        remote: Arc<str>,
        generation: u32,
        backoff: Backoff,
        own: P,
    ) -> Self {
        Slot {
            topic,
            partition,
            remote,
            generation,
            backoff,
            own,
        }
    }
}

impl<P> Keyed for Slot<P> {
    fn key(&self) -> (&str, i32) {
        (&self.topic, self.partition)
    }
}

impl<P> Deref for Slot<P> {
    type Target = P;
    fn deref(&self) -> &P {
        &self.own
    }
}

impl<P> DerefMut for Slot<P> {
    fn deref_mut(&mut self) -> &mut P {
        &mut self.own
    }
}

/// Generations fit 31 bits: the opaque of a report packs a slot, a generation and a kind.
pub const GEN_MASK: u32 = 0x7fff_ffff;

/// Opaque layout: bit 63 = position write, bits 32..63 = slot generation, bits 0..32 = slot.
const POSITION_BIT: usize = 1 << 63;

pub fn opaque(slot: usize, generation: u32, position: bool) -> usize {
    let tag = if position { POSITION_BIT } else { 0 };
    tag | ((generation & GEN_MASK) as usize) << 32 | (slot & 0xffff_ffff)
}

pub fn unpack(opaque: usize) -> (usize, u32, bool) {
    (
        opaque & 0xffff_ffff,
        ((opaque >> 32) as u32) & GEN_MASK,
        opaque & POSITION_BIT != 0,
    )
}

/// An opaque naming no slot: its report is ignored (gap records).
pub const UNOWNED: usize = 0xffff_ffff | POSITION_BIT;

/// Room a drained in-flight queue may keep (a partition with a record or a few in flight at a
/// time should not allocate for each).
const IN_FLIGHT_KEEP: usize = 8;

/// A partition's records sent and not acknowledged yet, oldest first. It gives its room back
/// once drained: a `VecDeque` never shrinks by itself, and a partition whose records arrive as
/// one burst (a whole fetch of it) grew its queue to that burst and kept the room for good,
/// 12 KiB a partition, 20 MiB of the heap at 2,000 partitions although the producer's queue
/// holds at most 20,000 records of all of them (bench/results/2026-12-04-partitions-rss/).
/// Emptied at most once per burst, so regrowing costs a few reallocations per burst. Only
/// `pop_front` and `clear` take records out, and both release.
#[derive(Debug)]
pub struct InFlightQueue<T>(VecDeque<T>);

impl<T> Default for InFlightQueue<T> {
    fn default() -> Self {
        InFlightQueue(VecDeque::new())
    }
}

impl<T> InFlightQueue<T> {
    pub fn push_back(&mut self, sent: T) {
        self.0.push_back(sent);
    }

    pub fn pop_front(&mut self) -> Option<T> {
        let sent = self.0.pop_front();
        self.release_drained();
        sent
    }

    pub fn clear(&mut self) {
        self.0.clear();
        self.release_drained();
    }

    pub fn front(&self) -> Option<&T> {
        self.0.front()
    }

    pub fn back(&self) -> Option<&T> {
        self.0.back()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter()
    }

    fn release_drained(&mut self) {
        if self.0.is_empty() && self.0.capacity() > IN_FLIGHT_KEEP {
            self.0.shrink_to(0);
        }
    }
}

#[derive(Debug)]
pub struct SlotTable<S> {
    slots: Vec<Option<S>>,
    free: Vec<usize>,
    by_topic: HashMap<String, Vec<Option<usize>>>,
    next_generation: u32,
}

impl<S> Default for SlotTable<S> {
    fn default() -> Self {
        SlotTable {
            slots: Vec::new(),
            free: Vec::new(),
            by_topic: HashMap::new(),
            next_generation: 0,
        }
    }
}

impl<S: Keyed> SlotTable<S> {
    /// A generation no slot had before (wrapping after 2^31, by which time no report of the
    /// old one is outstanding).
    pub fn next_generation(&mut self) -> u32 {
        self.next_generation = self.next_generation.wrapping_add(1) & GEN_MASK;
        self.next_generation
    }

    pub fn index(&self, topic: &str, partition: i32) -> Option<usize> {
        let by_partition = self.by_topic.get(topic)?;
        *by_partition.get(usize::try_from(partition).ok()?)?
    }

    pub fn get(&self, idx: usize) -> Option<&S> {
        self.slots.get(idx)?.as_ref()
    }

    pub fn get_mut(&mut self, idx: usize) -> Option<&mut S> {
        self.slots.get_mut(idx)?.as_mut()
    }

    pub fn find(&self, topic: &str, partition: i32) -> Option<&S> {
        self.get(self.index(topic, partition)?)
    }

    /// The slot of a partition with its index (what opaques and later calls name it by).
    pub fn lookup(&self, topic: &str, partition: i32) -> Option<(usize, &S)> {
        let idx = self.index(topic, partition)?;
        Some((idx, self.get(idx)?))
    }

    pub fn find_mut(&mut self, topic: &str, partition: i32) -> Option<&mut S> {
        let idx = self.index(topic, partition)?;
        self.get_mut(idx)
    }

    /// Holds `slot` (replacing a slot of the same partition); its index, or `None` for a
    /// negative partition, which no broker hands out.
    pub fn insert(&mut self, slot: S) -> Option<usize> {
        let (topic, partition) = slot.key();
        let p = usize::try_from(partition).ok()?;
        if let Some(idx) = self.index(topic, partition) {
            self.slots[idx] = Some(slot);
            return Some(idx);
        }
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let by_partition = self.by_topic.entry(topic.to_string()).or_default();
        if by_partition.len() <= p {
            by_partition.resize(p + 1, None);
        }
        by_partition[p] = Some(idx);
        self.slots[idx] = Some(slot);
        Some(idx)
    }

    /// Gives up the slot of a partition.
    pub fn remove(&mut self, topic: &str, partition: i32) -> Option<S> {
        let idx = self.index(topic, partition)?;
        let slot = self.slots.get_mut(idx)?.take()?;
        if let Some(by_partition) = self.by_topic.get_mut(topic) {
            if let Some(entry) = usize::try_from(partition)
                .ok()
                .and_then(|p| by_partition.get_mut(p))
            {
                *entry = None;
            }
            if by_partition.iter().all(Option::is_none) {
                self.by_topic.remove(topic);
            }
        }
        self.free.push(idx);
        Some(slot)
    }

    /// Indices of every slot held now.
    pub fn indices(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].is_some())
            .collect()
    }

    /// Topic and partition of every slot held now.
    pub fn keys(&self) -> Vec<(String, i32)> {
        self.iter()
            .map(|(_, s)| s.key())
            .map(|(t, p)| (t.to_string(), p))
            .collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, &S)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i, s.as_ref()?)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut S)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| Some((i, s.as_mut()?)))
    }

    pub fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every partition held, as a partition list for the consumer.
    pub fn assignment(&self) -> rdkafka::TopicPartitionList {
        let mut tpl = rdkafka::TopicPartitionList::new();
        for (_, s) in self.iter() {
            let (topic, partition) = s.key();
            tpl.add_partition(topic, partition);
        }
        tpl
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, PartialEq)]
    struct P(String, i32);

    impl Keyed for P {
        fn key(&self) -> (&str, i32) {
            (&self.0, self.1)
        }
    }

    #[test]
    fn indices_are_reused_and_lookups_follow_them() {
        let mut t = SlotTable::default();
        let a = t.insert(P("a".into(), 0)).unwrap();
        let b = t.insert(P("b".into(), 3)).unwrap();
        assert_ne!(a, b);
        assert_eq!(t.find("b", 3), Some(&P("b".into(), 3)));
        assert_eq!(t.remove("a", 0), Some(P("a".into(), 0)));
        assert_eq!(t.index("a", 0), None);
        let c = t.insert(P("c".into(), 1)).unwrap();
        assert_eq!(c, a, "a freed index is reused");
        assert_eq!(t.find("c", 1).map(|p| p.1), Some(1));
        assert_eq!(t.insert(P("x".into(), -1)), None);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn inserting_a_held_partition_replaces_its_slot_in_place() {
        let mut t = SlotTable::default();
        let a = t.insert(P("a".into(), 0)).unwrap();
        assert_eq!(t.insert(P("a".into(), 0)), Some(a));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_drained_queue_gives_its_room_back() {
        let mut q = InFlightQueue::default();
        (0..1000_u64).for_each(|i| q.push_back(i));
        assert_eq!(q.pop_front(), Some(0));
        assert!(q.0.capacity() >= 999, "a queue still in use keeps its room");
        q.clear();
        assert_eq!(q.0.capacity(), 0, "cleared");
        (0..1000_u64).for_each(|i| q.push_back(i));
        while q.pop_front().is_some() {}
        assert_eq!(q.0.capacity(), 0, "drained one by one");
        (0..IN_FLIGHT_KEEP as u64).for_each(|i| q.push_back(i));
        let room = q.0.capacity();
        while q.pop_front().is_some() {}
        assert_eq!(q.0.capacity(), room, "a few records' room is kept");
    }

    #[test]
    fn generations_stay_within_31_bits() {
        let mut t: SlotTable<P> = SlotTable {
            next_generation: GEN_MASK - 1,
            ..SlotTable::default()
        };
        assert_eq!(t.next_generation(), GEN_MASK);
        assert_eq!(t.next_generation(), 0);
    }

    proptest! {
        /// Against a map as the model: any sequence of inserts and removes leaves every held
        /// partition findable at a distinct index and nothing else findable.
        #[test]
        fn the_table_agrees_with_a_map(ops in proptest::collection::vec((any::<bool>(), 0..3u8, 0..5i32), 0..200)) {
            let mut t = SlotTable::default();
            let mut model = std::collections::HashMap::new();
            for (insert, topic, partition) in ops {
                let topic = format!("t{topic}");
                if insert {
                    t.insert(P(topic.clone(), partition));
                    model.insert((topic, partition), ());
                } else {
                    prop_assert_eq!(t.remove(&topic, partition).is_some(), model.remove(&(topic, partition)).is_some());
                }
            }
            prop_assert_eq!(t.len(), model.len());
            let mut seen = std::collections::HashSet::new();
            for (topic, partition) in model.keys() {
                let idx = t.index(topic, *partition);
                prop_assert!(idx.is_some());
                prop_assert!(seen.insert(idx));
                prop_assert_eq!(t.find(topic, *partition).map(|p| (p.0.as_str(), p.1)), Some((topic.as_str(), *partition)));
            }
            for (_, s) in t.iter() {
                prop_assert!(model.contains_key(&(s.0.clone(), s.1)));
            }
        }
    }
}
