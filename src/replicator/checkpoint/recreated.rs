//! Checkpoints of a remote partition that was deleted and created again.
//!
//! MM2's monotonic rule never lets a checkpoint's downstream offset go back, so after the remote
//! topic is recreated the last checkpoints keep pointing into the old log, past the end of the
//! new one, and a failover there would skip what the new log holds. A downstream rewind in the
//! offset syncs alone cannot tell a new log apart from a replay of the syncs topic or two writers
//! interleaved (that mistake once wrote checkpoints that went backwards). The source loop's
//! `TargetTopicRecreated` gap, in the positions topic, can: it is written when the loop found
//! the remote partition shorter than its copies, before it copies the partition again.
//!
//! So a checkpoint is forgotten (and the next one written whatever its offsets) only when it was
//! written before the newest recreation of its partition AND the offset syncs the store holds
//! for that partition began after it: both clocks are the source loop's (the gap's detection
//! time and the syncs' record timestamps), so "after" is well defined. Until the new log's first
//! sync is in, the pair waits: translating through the old log's syncs would write a checkpoint
//! into the gone log once more.

use std::collections::HashMap;

use crate::mm2::{CheckpointTracker, TopicPartition};

/// What to do with a (group, partition) pair before evaluating it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its last checkpoint is not older than the partition's newest recreation (or there is
    /// none): the usual rule.
    Evaluate,
    /// Its last checkpoint points into a gone log, and the syncs are the new log's: forget it,
    /// then evaluate.
    ForgetThenEvaluate,
    /// Its last checkpoint points into a gone log, and no sync of the new log is in yet.
    Wait,
}

/// Per SOURCE partition: the newest recreation of its remote partition, and since when the
/// store's syncs for it run.
#[derive(Debug, Default)]
pub struct Recreations {
    recreated_ms: HashMap<TopicPartition, i64>,
    syncs_since_ms: HashMap<TopicPartition, i64>,
}

impl Recreations {
    /// A `TargetTopicRecreated` gap of `tp`, found at `detected_ms`. True when it is the
    /// partition's newest one (the pairs on it need evaluating again).
    pub fn recreated(&mut self, tp: &TopicPartition, detected_ms: i64) -> bool {
        let newest = self.recreated_ms.entry(tp.clone()).or_insert(i64::MIN);
        if detected_ms > *newest {
            *newest = detected_ms;
            true
        } else {
            false
        }
    }

    /// A sync of `tp` was applied to the store; `begins_history` when the store held none for
    /// the partition before or the sync voided what it held (a downstream rewind).
    pub fn sync_applied(&mut self, tp: &TopicPartition, begins_history: bool, at_ms: Option<i64>) {
        if begins_history || !self.syncs_since_ms.contains_key(tp) {
            // A sync without a timestamp cannot prove it is the new log's.
            self.syncs_since_ms
                .insert(tp.clone(), at_ms.unwrap_or(i64::MIN));
        }
    }

    pub fn verdict(
        &self,
        tracker: &CheckpointTracker,
        group: &str,
        source: &TopicPartition,
        target: &TopicPartition,
    ) -> Verdict {
        let Some(&recreated) = self.recreated_ms.get(source) else {
            return Verdict::Evaluate;
        };
        if !tracker.written_before(group, target, recreated) {
            return Verdict::Evaluate;
        }
        match self.syncs_since_ms.get(source) {
            Some(&since) if since >= recreated => Verdict::ForgetThenEvaluate,
            _ => Verdict::Wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm2::Checkpoint;

    fn source() -> TopicPartition {
        TopicPartition::new("t", 0)
    }

    fn target() -> TopicPartition {
        TopicPartition::new("A.t", 0)
    }

    fn tracker_with(written_ms: i64) -> CheckpointTracker {
        let mut t = CheckpointTracker::new();
        t.record_at(
            &Checkpoint {
                group: "g".into(),
                topic_partition: target(),
                upstream_offset: 40,
                downstream_offset: 40,
                metadata: String::new(),
            },
            Some(written_ms),
        );
        t
    }

    #[test]
    fn without_a_recreation_the_rule_is_unchanged() {
        let mut r = Recreations::default();
        r.sync_applied(&source(), true, Some(5_000));
        let t = tracker_with(1_000);
        assert_eq!(r.verdict(&t, "g", &source(), &target()), Verdict::Evaluate);
    }

    #[test]
    fn an_old_checkpoint_waits_for_the_new_logs_first_sync_then_is_forgotten() {
        let mut r = Recreations::default();
        r.sync_applied(&source(), true, Some(500));
        let t = tracker_with(1_000);
        assert!(r.recreated(&source(), 2_000));
        assert_eq!(
            r.verdict(&t, "g", &source(), &target()),
            Verdict::Wait,
            "the syncs are still the old log's"
        );
        r.sync_applied(&source(), false, Some(1_500));
        assert_eq!(
            r.verdict(&t, "g", &source(), &target()),
            Verdict::Wait,
            "a sync that continues the old history proves nothing"
        );
        r.sync_applied(&source(), true, Some(2_100));
        assert_eq!(
            r.verdict(&t, "g", &source(), &target()),
            Verdict::ForgetThenEvaluate
        );
    }

    #[test]
    fn a_checkpoint_written_after_the_recreation_is_kept_whatever_is_replayed() {
        let mut r = Recreations::default();
        assert!(r.recreated(&source(), 2_000));
        assert!(!r.recreated(&source(), 1_000), "an older gap read later");
        r.sync_applied(&source(), true, Some(2_100));
        let t = tracker_with(3_000);
        assert_eq!(r.verdict(&t, "g", &source(), &target()), Verdict::Evaluate);
    }

    #[test]
    fn syncs_without_timestamps_never_prove_a_new_log() {
        let mut r = Recreations::default();
        assert!(r.recreated(&source(), 2_000));
        r.sync_applied(&source(), true, None);
        let t = tracker_with(1_000);
        assert_eq!(r.verdict(&t, "g", &source(), &target()), Verdict::Wait);
    }
}
