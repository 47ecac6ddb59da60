//! When the source loop writes an offset sync: [`SyncPolicy`].
//!
//! MM2 writes a sync on the first record, on upstream gaps, on downstream going backwards and
//! every `offset.lag.max` (100) records. This policy also writes one whenever the offset delta
//! (`downstream - upstream`) changes. That makes the sync stream *dense*: between two
//! consecutive syncs every replicated record has the first sync's delta and upstream offsets
//! are contiguous, which is what lets [`super::OffsetSyncStore`] translate exactly.
//!
//! A partition that goes idle would leave the tail of its last run (the records after the
//! newest sync) covered by no sync, so a group that consumed into that tail would translate
//! only conservatively until the next record arrives. [`SyncPolicy::idle_sync`] closes it:
//! once no record was observed for `max_interval`, it returns one sync at the last record
//! (same delta as the run, so the store just extends the run).
//!
//! Contract for the writer (the source loop), without which the store must not be told the
//! syncs are dense: every sync this policy returns is produced, in order, and acknowledged
//! before the replicated position past its record is committed. A dropped sync would hide a
//! delta change and the store could then translate past the true position.

use std::time::Duration;

use super::CopyStart;
use crate::records::{OffsetSync, TopicPartition};

/// Periodic syncs on top of the change-driven ones.
///
/// They bound how stale the newest sync is, which matters for groups reading near the head
/// when the store is not also given [`Coverage`], and keep the syncs topic useful to MM2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncPolicyConfig {
    /// Emit after this many records without a sync; 0 disables. MM2's `offset.lag.max` is 100.
    pub max_records: u64,
    /// Emit when this much time passed since the last sync; `None` disables.
    pub max_interval: Option<Duration>,
}

impl Default for SyncPolicyConfig {
    fn default() -> Self {
        Self {
            max_records: 100,
            max_interval: Some(Duration::from_secs(5)),
        }
    }
}

/// Why a sync was emitted, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncReason {
    /// First record this policy saw for the partition (also after a restart).
    First,
    /// Upstream offset did not follow the previous one (markers, compaction, rewind).
    UpstreamGap,
    /// Downstream offset did not advance (target truncated or recreated).
    DownstreamBackwards,
    /// Same contiguity, but the delta changed (e.g. a marker or foreign write on the target).
    DeltaChanged,
    /// Periodic: `max_records` records or `max_interval` time since the last sync.
    Periodic,
    /// Tail: the partition went idle (`max_interval` without a record) with records after
    /// the last sync; see [`SyncPolicy::idle_sync`].
    Idle,
}

/// What the writer knows beyond its last sync: every record after `last_sync` up to and
/// including `last_record` was replicated with the same delta and no upstream gap.
///
/// Handed to [`super::OffsetSyncStore::report_coverage`] so offsets past the newest sync can
/// still translate exactly (e.g. through the replicator's position store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coverage {
    pub last_sync: (i64, i64),
    pub last_record: (i64, i64),
}

#[derive(Debug, Clone, Copy)]
struct Last {
    upstream: i64,
    downstream: i64,
    sync: (i64, i64),
    records_since_sync: u64,
    sync_time: Duration,
    /// When the last record was observed.
    record_time: Duration,
}

/// Per-partition decision of the source loop: should this replicated record get a sync?
#[derive(Debug, Clone)]
pub struct SyncPolicy {
    topic_partition: TopicPartition,
    config: SyncPolicyConfig,
    last: Option<Last>,
    last_reason: Option<SyncReason>,
    /// Where the copy started reading, until the first record after it is observed:
    /// (source position, its target position when known ahead: aligned offsets).
    reading_from: Option<(i64, Option<i64>)>,
}

impl SyncPolicy {
    /// `topic_partition` is the SOURCE topic-partition, as written in the sync key.
    pub fn new(topic_partition: TopicPartition, config: SyncPolicyConfig) -> Self {
        Self {
            topic_partition,
            config,
            last: None,
            last_reason: None,
            reading_from: None,
        }
    }

    /// The copy (re)starts reading the source partition at `position`: the next record observed
    /// is the first one at or after it, and gets a sync. When that record lies past `position`
    /// (nothing readable between), its sync carries [`CopyStart`]: `position` maps to `target`,
    /// or when `None` to where the record landed. See [`super::start`].
    pub fn reading_from(&mut self, position: i64, target: Option<i64>) {
        self.last = None;
        self.reading_from =
            (position >= 0 && target.is_none_or(|t| t >= 0)).then_some((position, target));
    }

    /// Observes one replicated record: `upstream` its source offset, `downstream` the offset
    /// the target acknowledged, `now` any monotonic clock reading. Returns the sync to write.
    ///
    /// Negative offsets are not real positions: they are ignored and the next valid record
    /// is treated as the first, so it gets a sync.
    pub fn observe(&mut self, upstream: i64, downstream: i64, now: Duration) -> Option<OffsetSync> {
        if upstream < 0 || downstream < 0 {
            self.last = None;
            return None;
        }
        let reason = self.reason(upstream, downstream, now);
        let previous = self.last;
        let last = match reason {
            Some(_) => Last {
                upstream,
                downstream,
                sync: (upstream, downstream),
                records_since_sync: 0,
                sync_time: now,
                record_time: now,
            },
            None => {
                // `reason` returns Some when there is no previous record.
                let p = previous?;
                Last {
                    upstream,
                    downstream,
                    records_since_sync: p.records_since_sync + 1,
                    record_time: now,
                    ..p
                }
            }
        };
        self.last = Some(last);
        let reason = reason?;
        self.last_reason = Some(reason);
        let mut sync = OffsetSync::new(self.topic_partition.clone(), upstream, downstream);
        if let Some((position, target)) = self.reading_from.take() {
            let start = CopyStart {
                upstream: position,
                downstream: target.unwrap_or(downstream),
            };
            sync.start =
                (start.upstream < upstream && start.downstream <= downstream).then_some(start);
        }
        Some(sync)
    }

    /// Observes a run of `count` records copied together, their source offsets from `upstream`
    /// and target offsets from `downstream` on, one by one (a record batch written whole).
    /// Within a run the delta cannot change, so only its first record can need a sync for a
    /// reason other than the count (`max_records`), which is checked at the next run.
    pub fn observe_run(
        &mut self,
        upstream: i64,
        downstream: i64,
        count: i64,
        now: Duration,
    ) -> Option<OffsetSync> {
        let sync = self.observe(upstream, downstream, now);
        let rest = count.saturating_sub(1);
        if rest > 0
            && let Some(last) = self.last.as_mut()
        {
            last.upstream = last.upstream.saturating_add(rest);
            last.downstream = last.downstream.saturating_add(rest);
            last.records_since_sync = last
                .records_since_sync
                .saturating_add(u64::try_from(rest).unwrap_or(0));
        }
        sync
    }

    fn reason(&self, upstream: i64, downstream: i64, now: Duration) -> Option<SyncReason> {
        let Some(last) = self.last else {
            return Some(SyncReason::First);
        };
        if last.upstream.checked_add(1) != Some(upstream) {
            return Some(SyncReason::UpstreamGap);
        }
        if downstream <= last.downstream {
            return Some(SyncReason::DownstreamBackwards);
        }
        if downstream - upstream != last.downstream - last.upstream {
            return Some(SyncReason::DeltaChanged);
        }
        let by_count =
            self.config.max_records > 0 && last.records_since_sync + 1 >= self.config.max_records;
        let by_time = self
            .config
            .max_interval
            .is_some_and(|interval| now.saturating_sub(last.sync_time) >= interval);
        (by_count || by_time).then_some(SyncReason::Periodic)
    }

    /// The tail sync of an idle partition: when records were observed after the last sync
    /// and none for `max_interval` (disabled with it), returns a sync at the last record, once;
    /// the policy then continues as if that record had been synced.
    ///
    /// The sync has the run's delta and follows its records contiguously, so the stream stays
    /// dense and the store extends the run to it. Cheap enough to call on every poll.
    pub fn idle_sync(&mut self, now: Duration) -> Option<OffsetSync> {
        let interval = self.config.max_interval?;
        let last = self.last.as_mut()?;
        if last.records_since_sync == 0 || now.saturating_sub(last.record_time) < interval {
            return None;
        }
        last.sync = (last.upstream, last.downstream);
        last.records_since_sync = 0;
        last.sync_time = now;
        let (upstream, downstream) = last.sync;
        self.last_reason = Some(SyncReason::Idle);
        Some(OffsetSync::new(
            self.topic_partition.clone(),
            upstream,
            downstream,
        ))
    }

    /// Records observed after the last sync (0 before the first record).
    pub fn records_since_sync(&self) -> u64 {
        self.last.map_or(0, |l| l.records_since_sync)
    }

    /// Why the most recent sync was emitted.
    pub fn last_reason(&self) -> Option<SyncReason> {
        self.last_reason
    }

    /// How far the current constant-delta run reaches; `None` before the first record.
    pub fn coverage(&self) -> Option<Coverage> {
        self.last.map(|l| Coverage {
            last_sync: l.sync,
            last_record: (l.upstream, l.downstream),
        })
    }

    pub fn topic_partition(&self) -> &TopicPartition {
        &self.topic_partition
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_records: u64, max_interval: Option<Duration>) -> SyncPolicy {
        SyncPolicy::new(
            TopicPartition::new("t", 0),
            SyncPolicyConfig {
                max_records,
                max_interval,
            },
        )
    }

    fn emitted(p: &mut SyncPolicy, up: i64, down: i64, now_ms: u64) -> Option<SyncReason> {
        p.observe(up, down, Duration::from_millis(now_ms))
            .map(|_| p.last_reason().unwrap())
    }

    #[test]
    fn emits_on_first_gap_delta_change_and_backwards() {
        let mut p = policy(0, None);
        assert_eq!(emitted(&mut p, 10, 0, 0), Some(SyncReason::First));
        assert_eq!(emitted(&mut p, 11, 1, 0), None);
        assert_eq!(emitted(&mut p, 13, 2, 0), Some(SyncReason::UpstreamGap));
        assert_eq!(emitted(&mut p, 14, 3, 0), None);
        assert_eq!(emitted(&mut p, 15, 5, 0), Some(SyncReason::DeltaChanged));
        assert_eq!(
            emitted(&mut p, 16, 1, 0),
            Some(SyncReason::DownstreamBackwards)
        );
        assert_eq!(
            emitted(&mut p, 10, 2, 0),
            Some(SyncReason::UpstreamGap),
            "rewind"
        );
    }

    #[test]
    fn emits_periodically_by_count_and_time() {
        let mut p = policy(3, Some(Duration::from_secs(1)));
        assert!(emitted(&mut p, 0, 0, 0).is_some());
        assert_eq!(emitted(&mut p, 1, 1, 0), None);
        assert_eq!(emitted(&mut p, 2, 2, 0), None);
        assert_eq!(emitted(&mut p, 3, 3, 0), Some(SyncReason::Periodic));
        assert_eq!(emitted(&mut p, 4, 4, 999), None);
        assert_eq!(emitted(&mut p, 5, 5, 1000), Some(SyncReason::Periodic));
    }

    #[test]
    fn coverage_reports_last_sync_and_last_record() {
        let mut p = policy(0, None);
        assert_eq!(p.coverage(), None);
        p.observe(5, 50, Duration::ZERO);
        p.observe(6, 51, Duration::ZERO);
        p.observe(7, 52, Duration::ZERO);
        assert_eq!(
            p.coverage(),
            Some(Coverage {
                last_sync: (5, 50),
                last_record: (7, 52)
            })
        );
    }

    #[test]
    fn an_idle_partition_gets_one_tail_sync_at_its_last_record() {
        let mut p = policy(100, Some(Duration::from_secs(1)));
        assert_eq!(p.idle_sync(Duration::from_secs(10)), None, "no record yet");
        for i in 0..30 {
            p.observe(i, i + 7, Duration::from_millis(10));
        }
        assert_eq!(p.records_since_sync(), 29);
        assert_eq!(
            p.idle_sync(Duration::from_millis(1009)),
            None,
            "not idle long enough"
        );
        let tail = p.idle_sync(Duration::from_millis(1010)).unwrap();
        assert_eq!((tail.upstream_offset, tail.downstream_offset), (29, 36));
        assert_eq!(tail.topic_partition, TopicPartition::new("t", 0));
        assert_eq!(p.last_reason(), Some(SyncReason::Idle));
        assert_eq!(p.records_since_sync(), 0);
        assert_eq!(
            p.coverage(),
            Some(Coverage {
                last_sync: (29, 36),
                last_record: (29, 36)
            })
        );
        assert_eq!(p.idle_sync(Duration::from_secs(60)), None, "only once");
        // The next record continues the run: no sync, and the periodic timer restarted at
        // the tail sync.
        assert_eq!(emitted(&mut p, 30, 37, 1500), None);
        assert_eq!(emitted(&mut p, 31, 38, 2009), None);
        assert_eq!(emitted(&mut p, 32, 39, 2010), Some(SyncReason::Periodic));
        // A synced record leaves no tail.
        assert_eq!(p.idle_sync(Duration::from_secs(60)), None);
    }

    #[test]
    fn idle_syncs_follow_max_interval() {
        let mut p = policy(100, None);
        p.observe(0, 0, Duration::ZERO);
        p.observe(1, 1, Duration::ZERO);
        assert_eq!(p.idle_sync(Duration::from_secs(3600)), None, "disabled");
        let ms = Duration::from_millis;
        let mut p = policy(100, Some(ms(1)));
        p.observe(0, 0, ms(0));
        assert_eq!(p.idle_sync(ms(5)), None, "the last record has its sync");
        p.observe(1, 1, ms(0));
        assert_eq!(p.idle_sync(ms(0)), None);
        assert!(p.idle_sync(ms(1)).is_some());
        // A reset (negative offset) forgets the tail: the next record syncs as the first.
        p.observe(2, 2, ms(1));
        p.observe(3, -1, ms(1));
        assert_eq!(p.idle_sync(ms(5000)), None);
    }

    #[test]
    fn negative_offsets_reset_so_the_next_record_syncs() {
        let mut p = policy(0, None);
        p.observe(0, 0, Duration::ZERO);
        assert_eq!(p.observe(1, -1, Duration::ZERO), None);
        assert_eq!(emitted(&mut p, 2, 1, 0), Some(SyncReason::First));
    }

    proptest::proptest! {
        /// Runs (whole batches: contiguous source offsets, one target offset each) observed at
        /// once give the syncs and coverage their records give one by one, when only the
        /// delta and the clock decide (the dense policy's configuration).
        #[test]
        fn a_run_syncs_like_its_records(runs in proptest::collection::vec((0i64..3, 0i64..3, 1i64..6, 0u64..3), 1..40)) {
            let config = Some(Duration::from_millis(2));
            let (mut by_run, mut by_record) = (policy(0, config), policy(0, config));
            let (mut up, mut down, mut ms) = (0i64, 0i64, 0u64);
            for (skip_up, skip_down, count, tick) in runs {
                up += skip_up;
                down += skip_down;
                ms += tick;
                let now = Duration::from_millis(ms);
                let run_sync = by_run.observe_run(up, down, count, now);
                let first_sync = by_record.observe(up, down, now);
                for i in 1..count {
                    proptest::prop_assert_eq!(by_record.observe(up + i, down + i, now), None);
                }
                proptest::prop_assert_eq!(run_sync, first_sync);
                proptest::prop_assert_eq!(by_run.coverage(), by_record.coverage());
                proptest::prop_assert_eq!(by_run.records_since_sync(), by_record.records_since_sync());
                up += count;
                down += count;
            }
        }
    }
}
