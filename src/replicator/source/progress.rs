//! What may be committed for one source partition: [`Progress`].
//!
//! Pure bookkeeping, no I/O. The copy loop feeds it the target's acknowledgements in order and
//! the acknowledgements of the offset syncs it wrote; it answers which position is safe to store
//! ("what to commit"), leaving "how to commit" to the caller. That split is what lets an
//! exactly-once mode later put the same positions and syncs into one producer transaction.
//!
//! A position may only move past a record once
//! - the record and every earlier one of the partition are acknowledged by the target, and
//! - every offset sync the [`SyncPolicy`] asked for up to that record is acknowledged,
//!
//! because a sync lost behind a stored position would never be rewritten after a restart, and
//! the dense sync stream the checkpoint side relies on would silently miss a delta change.

use std::collections::VecDeque;
use std::time::Duration;

use crate::mm2::{OffsetSync, SyncPolicy, SyncPolicyConfig, TopicPartition};

pub use crate::kafka::positions::Frontier;

#[derive(Debug)]
pub struct Progress {
    policy: SyncPolicy,
    config: SyncPolicyConfig,
    /// After the newest acknowledged record (or the stored position we started from).
    latest: Option<Frontier>,
    /// One entry per offset sync written and not yet acknowledged, oldest first: the frontier
    /// just before the record the sync describes.
    pending_syncs: VecDeque<Option<Frontier>>,
    /// The frontier last handed out for storing; `None` forces the next store.
    stored: Option<Frontier>,
}

impl Progress {
    /// `start` is the stored position the partition resumes from, if any.
    pub fn new(tp: TopicPartition, config: SyncPolicyConfig, start: Option<Frontier>) -> Self {
        let mut policy = SyncPolicy::new(tp, config);
        if let Some(start) = start {
            policy.reading_from(start.next, None);
        }
        Progress {
            policy,
            config,
            latest: start,
            pending_syncs: VecDeque::new(),
            stored: start,
        }
    }

    /// The copy reads the partition from source position `position` (a partition that starts
    /// without a stored position: the source's log start). See [`SyncPolicy::reading_from`].
    pub fn reading_from(&mut self, position: i64) {
        self.policy.reading_from(position, None);
    }

    /// The target acknowledged the copy of source offset `upstream` at `downstream`. Returns
    /// the offset sync to write, if the policy wants one.
    pub fn acknowledged(
        &mut self,
        upstream: i64,
        downstream: i64,
        now: Duration,
    ) -> Option<OffsetSync> {
        let sync = self.policy.observe(upstream, downstream, now);
        if sync.is_some() {
            self.pending_syncs.push_back(self.latest);
        }
        self.latest = Some(Frontier {
            next: upstream.saturating_add(1),
            downstream,
        });
        sync
    }

    /// The target acknowledged `count` records copied together (a whole batch): source
    /// offsets from `upstream`, target offsets from `downstream` on, one by one. Returns the
    /// offset sync to write, if the policy wants one (at the first record: within the run
    /// the delta does not change).
    pub fn acknowledged_run(
        &mut self,
        upstream: i64,
        downstream: i64,
        count: i64,
        now: Duration,
    ) -> Option<OffsetSync> {
        let sync = self.policy.observe_run(upstream, downstream, count, now);
        if sync.is_some() {
            self.pending_syncs.push_back(self.latest);
        }
        let rest = count.saturating_sub(1).max(0);
        self.latest = Some(Frontier {
            next: upstream.saturating_add(rest).saturating_add(1),
            downstream: downstream.saturating_add(rest),
        });
        sync
    }

    /// The record at `upstream`, after every one acknowledged so far, will never be on the
    /// target (it was refused): the position moves past it, target offsets stay. The next
    /// acknowledged record changes the offset delta, so the policy writes a sync for it.
    pub fn skipped(&mut self, upstream: i64) {
        let downstream = self.latest.map_or(-1, |l| l.downstream);
        self.latest = Some(Frontier {
            next: upstream.saturating_add(1),
            downstream,
        });
    }

    /// After the newest acknowledged record (or where the partition started).
    pub fn latest(&self) -> Option<Frontier> {
        self.latest
    }

    /// The tail sync of an idle partition ([`SyncPolicy::idle_sync`]): records were
    /// acknowledged after the last sync and none for the sync interval. Cheap when there is
    /// no tail.
    ///
    /// Held like any other sync: until it is acknowledged, nothing past the position before
    /// its record is committable, so a failed tail sync rewinds to that record, which is copied
    /// again and gets a fresh sync. The position already stored is not moved back meanwhile
    /// (see [`Self::take_to_store`]): the stream is dense without the tail sync, it only makes
    /// the tail exact sooner.
    pub fn idle_sync(&mut self, now: Duration) -> Option<OffsetSync> {
        if self.policy.records_since_sync() == 0 {
            return None;
        }
        let sync = self.policy.idle_sync(now)?;
        // The record before it is in the same run (contiguous, same delta).
        self.pending_syncs.push_back(Some(Frontier {
            next: sync.upstream_offset,
            downstream: sync.downstream_offset - 1,
        }));
        Some(sync)
    }

    /// The oldest outstanding sync was acknowledged (syncs of a partition are acknowledged in
    /// the order they were written: one topic partition, idempotent producer).
    pub fn sync_acknowledged(&mut self) {
        self.pending_syncs.pop_front();
    }

    /// Syncs written and not yet acknowledged.
    pub fn pending_syncs(&self) -> usize {
        self.pending_syncs.len()
    }

    /// The newest position that is safe to store.
    pub fn committable(&self) -> Option<Frontier> {
        match self.pending_syncs.front() {
            Some(before_sync) => *before_sync,
            None => self.latest,
        }
    }

    /// The position to store now, if it moved forward since the last one handed out.
    ///
    /// Never backwards: the committable point only goes behind the stored one while a tail
    /// sync for a record already stored past is pending ([`Self::idle_sync`]).
    pub fn take_to_store(&mut self) -> Option<Frontier> {
        let c = self.committable()?;
        if self.stored.is_some_and(|s| s == c || c.next < s.next) {
            return None;
        }
        self.stored = Some(c);
        Some(c)
    }

    /// Storing a position failed: hand it out again next time.
    pub fn store_failed(&mut self) {
        self.stored = None;
    }

    /// Where copying resumes after a failed write (record or sync): the first record not known
    /// to be safely on the target with its syncs. Unacknowledged syncs are forgotten and the
    /// policy restarts, so the first record copied again gets a fresh sync (it may land at a
    /// different target offset).
    pub fn rewind(&mut self) -> Option<Frontier> {
        let to = self.committable();
        self.latest = to;
        self.pending_syncs.clear();
        self.policy = SyncPolicy::new(self.policy.topic_partition().clone(), self.config);
        if let Some(to) = to {
            self.policy.reading_from(to.next, None);
        }
        to
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(start: Option<Frontier>) -> Progress {
        Progress::new(
            TopicPartition::new("t", 0),
            SyncPolicyConfig {
                max_records: 0,
                max_interval: None,
            },
            start,
        )
    }

    const T: Duration = Duration::ZERO;

    fn at(next: i64, downstream: i64) -> Option<Frontier> {
        Some(Frontier { next, downstream })
    }

    #[test]
    fn nothing_is_committable_until_the_first_sync_is_acknowledged() {
        let mut p = progress(None);
        assert!(p.acknowledged(0, 0, T).is_some(), "first record syncs");
        p.acknowledged(1, 1, T);
        assert_eq!(p.committable(), None);
        p.sync_acknowledged();
        assert_eq!(p.committable(), at(2, 1));
    }

    #[test]
    fn the_first_sync_past_where_the_copy_reads_from_says_where_that_was() {
        use crate::mm2::CopyStart;
        let start = |upstream, downstream| {
            Some(CopyStart {
                upstream,
                downstream,
            })
        };
        // Resumed at 21 (a stored position), the next record found at 30: 21..30 map to 11.
        let mut p = progress(at(21, 10));
        assert_eq!(
            p.acknowledged(30, 11, T).and_then(|s| s.start),
            start(21, 11)
        );
        p.sync_acknowledged();
        // A fresh partition read from the source's log start.
        let mut fresh = progress(None);
        fresh.reading_from(0);
        assert_eq!(
            fresh.acknowledged(4, 0, T).and_then(|s| s.start),
            start(0, 0)
        );
        // A rewind reads again from the committable point.
        p.acknowledged(31, 12, T);
        assert_eq!(p.rewind(), at(32, 12));
        assert_eq!(
            p.acknowledged(35, 13, T).and_then(|s| s.start),
            start(32, 13)
        );
        // Nothing between: no start.
        assert_eq!(p.rewind(), at(32, 12), "its sync is not acknowledged");
        assert_eq!(p.acknowledged(32, 13, T).and_then(|s| s.start), None);
    }

    #[test]
    fn a_pending_sync_holds_the_position_before_its_record() {
        let mut p = progress(at(10, 99));
        assert!(p.acknowledged(10, 100, T).is_some());
        p.sync_acknowledged();
        p.acknowledged(11, 101, T);
        assert_eq!(p.committable(), at(12, 101));
        // A delta change at 12 needs a sync; until it is acknowledged, 12 is not past.
        assert!(p.acknowledged(12, 105, T).is_some());
        p.acknowledged(13, 106, T);
        assert_eq!(p.committable(), at(12, 101));
        p.sync_acknowledged();
        assert_eq!(p.committable(), at(14, 106));
    }

    #[test]
    fn stored_positions_are_handed_out_once_and_again_after_a_failure() {
        let mut p = progress(at(5, 4));
        assert_eq!(p.take_to_store(), None, "the start is already stored");
        p.acknowledged(5, 5, T);
        p.sync_acknowledged();
        assert_eq!(p.take_to_store(), at(6, 5));
        assert_eq!(p.take_to_store(), None);
        p.store_failed();
        assert_eq!(p.take_to_store(), at(6, 5));
    }

    /// A partition whose syncs come every 100 records or after 1 s idle, from its start.
    fn tail_synced() -> Progress {
        Progress::new(
            TopicPartition::new("t", 0),
            SyncPolicyConfig {
                max_records: 100,
                max_interval: Some(Duration::from_secs(1)),
            },
            None,
        )
    }

    #[test]
    fn an_idle_tail_sync_is_held_like_any_other_sync() {
        let mut p = tail_synced();
        let ms = Duration::from_millis;
        assert!(p.acknowledged(0, 0, ms(0)).is_some());
        p.sync_acknowledged();
        for i in 1..30 {
            assert!(p.acknowledged(i, i, ms(10)).is_none());
        }
        assert_eq!(p.take_to_store(), at(30, 29));
        assert_eq!(p.idle_sync(ms(500)), None, "not idle yet");
        let tail = p.idle_sync(ms(1010)).unwrap();
        assert_eq!((tail.upstream_offset, tail.downstream_offset), (29, 29));
        assert_eq!(p.idle_sync(ms(5000)), None, "once");
        assert_eq!(p.pending_syncs(), 1);
        assert_eq!(p.committable(), at(29, 28));
        assert_eq!(
            p.take_to_store(),
            None,
            "the stored position does not move back"
        );
        // A record arriving meanwhile is not committable before the tail sync is acknowledged.
        assert!(p.acknowledged(30, 30, ms(1100)).is_none());
        assert_eq!(p.committable(), at(29, 28));
        p.sync_acknowledged();
        assert_eq!(p.take_to_store(), at(31, 30));
    }

    #[test]
    fn a_failed_tail_sync_rewinds_to_its_record() {
        let mut p = tail_synced();
        let ms = Duration::from_millis;
        p.acknowledged(0, 0, ms(0));
        p.sync_acknowledged();
        p.acknowledged(1, 1, ms(0));
        p.acknowledged(2, 2, ms(0));
        assert!(p.idle_sync(ms(1000)).is_some());
        assert_eq!(p.rewind(), at(2, 1));
        assert!(
            p.acknowledged(2, 3, ms(1500)).is_some(),
            "copied again, the tail record gets a fresh sync"
        );
    }

    #[test]
    fn rewind_goes_back_to_the_committable_point_and_resyncs() {
        let mut p = progress(None);
        p.acknowledged(0, 0, T);
        p.sync_acknowledged();
        p.acknowledged(1, 1, T);
        assert!(p.acknowledged(3, 2, T).is_some(), "gap syncs");
        assert_eq!(p.rewind(), at(2, 1));
        assert_eq!(p.pending_syncs(), 0);
        assert!(
            p.acknowledged(3, 7, T).is_some(),
            "the first record after a rewind gets a sync"
        );
    }

    #[test]
    fn a_batch_acknowledged_at_once_moves_past_all_its_records() {
        let mut p = progress(None);
        let sync = p.acknowledged_run(10, 100, 5, Duration::ZERO);
        assert_eq!(
            sync.map(|s| (s.upstream_offset, s.downstream_offset)),
            Some((10, 100))
        );
        assert_eq!(p.latest(), at(15, 104));
        assert_eq!(p.committable(), None, "held by its unacknowledged sync");
        p.sync_acknowledged();
        assert_eq!(p.committable(), at(15, 104));
        assert_eq!(
            p.acknowledged_run(15, 105, 3, Duration::ZERO),
            None,
            "same delta"
        );
        assert_eq!(p.latest(), at(18, 107));
    }
}
