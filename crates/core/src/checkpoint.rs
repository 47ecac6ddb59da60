//! Which checkpoints to write: [`CheckpointTracker`], MM2's monotonic emission rule.
//!
//! A checkpoint for (group, topic, partition) is written when it is the first one, when the
//! group rewound upstream (its committed offset went back), or when the translated downstream
//! offset advanced. Anything else would either repeat the last checkpoint or move a failed-over
//! consumer backwards for no reason.

use std::collections::HashMap;

use super::records::{Checkpoint, TopicPartition};

/// Last checkpoint written per (group, target topic-partition).
///
/// Rebuild it at start from the checkpoints topic ([`Self::record_at`] for each one read), so the
/// rule holds across restarts.
#[derive(Debug, Clone, Default)]
pub struct CheckpointTracker {
    last: HashMap<String, HashMap<TopicPartition, Last>>,
}

#[derive(Debug, Clone, Copy)]
struct Last {
    upstream: i64,
    downstream: i64,
    /// When it was written (ms since the epoch), if known.
    written_ms: Option<i64>,
}

impl CheckpointTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a checkpoint with these offsets should be written.
    pub fn should_emit(
        &self,
        group: &str,
        topic_partition: &TopicPartition,
        upstream_offset: i64,
        downstream_offset: i64,
    ) -> bool {
        match self.last(group, topic_partition) {
            None => true,
            Some((up, down)) => upstream_offset < up || downstream_offset > down,
        }
    }

    /// Remembers a checkpoint as written (or read back from the checkpoints topic), when
    /// that is not known.
    pub fn record(&mut self, checkpoint: &Checkpoint) {
        self.record_at(checkpoint, None);
    }

    /// Remembers a checkpoint as written at `written_ms` (ms since the epoch): its record's
    /// timestamp when read back.
    pub fn record_at(&mut self, checkpoint: &Checkpoint, written_ms: Option<i64>) {
        let entry = Last {
            upstream: checkpoint.upstream_offset,
            downstream: checkpoint.downstream_offset,
            written_ms,
        };
        match self.last.get_mut(&checkpoint.group) {
            Some(partitions) => {
                partitions.insert(checkpoint.topic_partition.clone(), entry);
            }
            None => {
                let partitions = HashMap::from([(checkpoint.topic_partition.clone(), entry)]);
                self.last.insert(checkpoint.group.clone(), partitions);
            }
        }
    }

    /// [`Self::should_emit`] then [`Self::record`]: true when the caller must write it.
    pub fn offer(&mut self, checkpoint: &Checkpoint) -> bool {
        let emit = self.should_emit(
            &checkpoint.group,
            &checkpoint.topic_partition,
            checkpoint.upstream_offset,
            checkpoint.downstream_offset,
        );
        if emit {
            self.record(checkpoint);
        }
        emit
    }

    /// The last (upstream, downstream) written for this group and partition.
    pub fn last(&self, group: &str, topic_partition: &TopicPartition) -> Option<(i64, i64)> {
        let last = self.last.get(group)?.get(topic_partition)?;
        Some((last.upstream, last.downstream))
    }

    /// When the last checkpoint of this group and partition was written, if known.
    pub fn written_ms(&self, group: &str, topic_partition: &TopicPartition) -> Option<i64> {
        self.last.get(group)?.get(topic_partition)?.written_ms
    }

    /// Whether the last checkpoint of this group and partition is known to have been written
    /// before `ms`: it points into a log that a later event (the remote partition recreated at
    /// `ms`) made void. False when there is none or its time is unknown.
    pub fn written_before(&self, group: &str, topic_partition: &TopicPartition, ms: i64) -> bool {
        self.last
            .get(group)
            .and_then(|partitions| partitions.get(topic_partition))
            .and_then(|last| last.written_ms)
            .is_some_and(|written| written < ms)
    }

    /// Forgets the last checkpoint of one group and partition, so the next one is written
    /// whatever its offsets: only for a checkpoint into a log that is gone, where the rule's
    /// "never backwards" would keep a failover pointing past the new log's records.
    pub fn forget(&mut self, group: &str, topic_partition: &TopicPartition) {
        if let Some(partitions) = self.last.get_mut(group) {
            partitions.remove(topic_partition);
            if partitions.is_empty() {
                self.last.remove(group);
            }
        }
    }

    /// Drops a group that no longer passes the filters or was deleted.
    pub fn forget_group(&mut self, group: &str) {
        self.last.remove(group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(up: i64, down: i64) -> Checkpoint {
        Checkpoint {
            group: "g".into(),
            topic_partition: TopicPartition::new("A.t", 0),
            upstream_offset: up,
            downstream_offset: down,
            metadata: String::new(),
        }
    }

    #[test]
    fn emits_first_then_only_on_downstream_advance_or_upstream_rewind() {
        let mut t = CheckpointTracker::new();
        assert!(t.offer(&cp(100, 50)), "first");
        assert!(!t.offer(&cp(100, 50)), "same");
        assert!(
            !t.offer(&cp(120, 50)),
            "upstream moved but translation did not"
        );
        assert!(
            !t.offer(&cp(110, 40)),
            "downstream would go back without a rewind"
        );
        assert!(t.offer(&cp(130, 60)), "downstream advanced");
        assert!(t.offer(&cp(10, 5)), "group rewound upstream");
        assert_eq!(t.last("g", &TopicPartition::new("A.t", 0)), Some((10, 5)));
    }

    #[test]
    fn groups_and_partitions_are_independent() {
        let mut t = CheckpointTracker::new();
        assert!(t.offer(&cp(100, 50)));
        let other_partition = Checkpoint {
            topic_partition: TopicPartition::new("A.t", 1),
            ..cp(100, 50)
        };
        assert!(t.offer(&other_partition));
        let other_group = Checkpoint {
            group: "h".into(),
            ..cp(100, 50)
        };
        assert!(t.offer(&other_group));
        t.forget_group("g");
        assert!(t.should_emit("g", &TopicPartition::new("A.t", 0), 100, 50));
    }

    #[test]
    fn a_checkpoint_written_before_a_recreation_can_be_forgotten_and_written_lower() {
        let tp = TopicPartition::new("A.t", 0);
        let mut t = CheckpointTracker::new();
        t.record_at(&cp(40, 40), Some(1_000));
        assert!(t.written_before("g", &tp, 1_001));
        assert!(!t.written_before("g", &tp, 1_000), "same ms is not before");
        assert!(!t.written_before("h", &tp, 5_000), "no checkpoint");
        assert!(
            !t.should_emit("g", &tp, 40, 10),
            "the rule alone refuses it"
        );
        t.forget("g", &tp);
        assert_eq!(t.last("g", &tp), None);
        assert!(t.offer(&cp(40, 10)), "the first checkpoint in the new log");
        assert!(!t.written_before("g", &tp, 5_000), "time unknown: kept");
    }
}
