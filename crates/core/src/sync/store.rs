//! Offset translation from offset syncs: [`OffsetSyncStore`].
//!
//! # Runs instead of points
//! The store keeps, per source partition, a short sorted list of *runs*. A run starts at a
//! sync `(up, down)` and knows an end point `(end_up, end_down)`, another real record mapping:
//! - for a run built from a dense writer's syncs ([`SyncOrigin::Dense`], see
//!   [`super::SyncPolicy`]), every upstream offset in `[up, end_up)` that holds a record maps
//!   to `offset + (down - up)`, so a committed offset inside translates exactly to
//!   `min(c + delta, end_down)` (the `min` covers a gap just before a successor sync whose
//!   delta is smaller). Consecutive dense syncs with the same delta (periodic ones) and
//!   [`Coverage`] reports only move the end of the newest run forward, so a partition whose
//!   delta never changes costs a single run;
//! - for any other run the end is just the next sync seen, which MM2's rule can use (`c` past
//!   it translates to `end_down + 1`) and which bounds how many records may be re-read.
//!
//! # Why the dense flag is per sync, set by the caller
//! The wire format carries no writer identity, and an offset-syncs topic may hold MM2's sparse
//! syncs followed by ours (a migration) or lose syncs to compaction. Exactness is only sound
//! between two syncs that are consecutive output of a dense writer, so the caller passes
//! [`SyncOrigin::Dense`] only for syncs it knows come from our writer (e.g. a record header
//! MM2 ignores) and that it read in order without a hole. Syncs re-read from the compacted
//! topic at start count as such: the topic is keyed by source partition, and compaction keeps,
//! per key, only records newer than everything it removed (the cleaned part holds at most the
//! latest record of a key and precedes the uncleaned part), so the surviving syncs of a
//! partition are always a contiguous suffix of what the writer wrote.
//!
//! # Bounded memory
//! At most `max_runs` runs per partition (64 by default, as MM2 keeps 64 syncs), plus every run
//! that left the head in a byte budget ([`super::history`], 32 KiB by default), so offsets
//! since the oldest run that fits translate as if nothing had been dropped. When full,
//! the run list drops the run whose removal opens the smallest uncovered span *relative to its
//! distance from the head*, never the oldest nor the newest. This keeps runs log-spaced: recent
//! offsets translate finely and old ones still translate, coarsely, as MM2's exponential
//! buckets do. Each new sync drops at most one run.
//!
//! # Compared with MM2
//! Fed the same syncs (and while nothing was dropped for space), the result is never further
//! from the true position than MM2's "newest sync at or before, `down + 1` when past it", is
//! available whenever MM2's is, and never past the true position. Unlike MM2, syncs read
//! during the initial load are kept (as non-exact runs), so groups far behind the head still
//! translate after a restart; checkpoint monotonicity is then [`crate::CheckpointTracker`]'s
//! job rather than the store's.

use std::collections::HashMap;
use std::mem::size_of;

use thiserror::Error;

use super::CopyStart;
use super::history::History;
use super::policy::Coverage;
use crate::records::{OffsetSync, TopicPartition};

/// MM2 keeps 64 syncs per partition; the same budget here holds 64 runs.
pub const DEFAULT_MAX_RUNS: usize = 64;

/// Bytes of exact history per partition ([`StoreConfig::history_bytes`]): about 5,700 runs of
/// irregular transactions or compaction holes, any number of regular ones.
pub const DEFAULT_HISTORY_BYTES: usize = 32 * 1024;

/// Whether a sync comes from a writer that syncs on every delta change (see module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOrigin {
    /// Our [`super::SyncPolicy`], read in order with nothing missed since the previous one.
    Dense,
    /// MM2 or unknown: only MM2's conservative rule is applied.
    Sparse,
}

/// Header on every offset sync a dense writer ([`super::SyncPolicy`]) writes: one sync on every
/// delta change, in order. MM2 writes no headers and its readers ignore them, so a sync without
/// it is [`SyncOrigin::Sparse`].
pub const SYNC_ORIGIN_HEADER: &str = "mirrorflow.sync";
/// The value of [`SYNC_ORIGIN_HEADER`] for [`SyncOrigin::Dense`].
pub const SYNC_ORIGIN_DENSE: &str = "dense";

impl SyncOrigin {
    /// The origin of a sync whose [`SYNC_ORIGIN_HEADER`] header is `value` (`None`: absent).
    pub fn from_header(value: Option<&[u8]>) -> Self {
        if value == Some(SYNC_ORIGIN_DENSE.as_bytes()) {
            SyncOrigin::Dense
        } else {
            SyncOrigin::Sparse
        }
    }
}

/// A committed source offset mapped onto the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Translation {
    /// Seeking here re-reads nothing and skips nothing.
    Exact(i64),
    /// Seeking here skips nothing but may re-read up to `max_replay` records.
    Conservative { offset: i64, max_replay: u64 },
    /// No safe translation.
    Unknown(UnknownReason),
}

impl Translation {
    pub fn offset(&self) -> Option<i64> {
        match *self {
            Translation::Exact(offset) | Translation::Conservative { offset, .. } => Some(offset),
            Translation::Unknown(_) => None,
        }
    }

    /// Records a consumer may re-read after seeking to [`Self::offset`] ("covering"):
    /// 0 when exact, `None` when there is no translation.
    pub fn max_replay(&self) -> Option<u64> {
        match *self {
            Translation::Exact(_) => Some(0),
            Translation::Conservative { max_replay, .. } => Some(max_replay),
            Translation::Unknown(_) => None,
        }
    }

    pub fn is_exact(&self) -> bool {
        matches!(self, Translation::Exact(_))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownReason {
    /// The initial read of the offset-syncs topic is not finished.
    Loading,
    /// No sync was ever seen for the partition.
    NoSyncs,
    /// The committed offset predates every retained sync (MM2 answers -1 here).
    OlderThanOldestSync { oldest: i64 },
    /// Negative committed offset (e.g. -1 for "no commit").
    NegativeOffset,
}

/// A sync with a negative offset cannot describe a record.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("offset sync for {topic_partition} has a negative offset ({upstream} -> {downstream})")]
pub struct InvalidSync {
    pub topic_partition: TopicPartition,
    pub upstream: i64,
    pub downstream: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// Runs kept per partition, at least 2 (the oldest and the newest are always kept).
    pub max_runs: usize,
    /// Bytes per partition for every run since the oldest one that fits, encoded compactly
    /// (see [`super::history`]); offsets older than that translate with the runs above.
    pub history_bytes: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            max_runs: DEFAULT_MAX_RUNS,
            history_bytes: DEFAULT_HISTORY_BYTES,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    pub(super) up: i64,
    pub(super) down: i64,
    pub(super) end_up: i64,
    pub(super) end_down: i64,
    /// Offsets in `(up, end_up]` translate exactly by `min(c + delta, end_down)`.
    pub(super) exact: bool,
    /// The starting sync came from a dense writer (kept to restore exactness after loading).
    pub(super) dense: bool,
}

impl Run {
    fn at(up: i64, down: i64, dense: bool, exact: bool) -> Self {
        Self {
            up,
            down,
            end_up: up,
            end_down: down,
            exact,
            dense,
        }
    }

    fn delta(&self) -> i64 {
        // Both offsets are non-negative, so this cannot overflow.
        self.down - self.up
    }
}

/// Known syncs of one source partition.
#[derive(Debug, Clone, Default)]
pub struct PartitionSyncs {
    /// Sorted by `up`; runs do not overlap (`end_up <= next.up`). Log-spaced once full.
    runs: Vec<Run>,
    /// Every run before the head since the oldest that fits its budget, exactly.
    history: History,
    /// The most recently applied sync, to accept only [`Coverage`] that extends it.
    last_sync: Option<(i64, i64)>,
}

impl PartitionSyncs {
    /// `trusted`: dense and read in order after the initial load, so it may extend exactness.
    /// Returns whether the target log restarted (see [`OffsetSyncStore::update`]).
    fn update(
        &mut self,
        up: i64,
        down: i64,
        dense: bool,
        trusted: bool,
        config: StoreConfig,
    ) -> bool {
        // A writer appends: every copy, repeated ones too, lands after the previous one. A
        // sync whose target offset goes back is most likely about a new remote log (the
        // remote topic was deleted and created again, or truncated), where none of the old
        // mappings hold.
        let restarted = self
            .last_sync
            .is_some_and(|(_, last_down)| down < last_down);
        self.last_sync = Some((up, down));
        let new = Run::at(up, down, dense, trusted);
        let Some(head) = self.runs.last_mut() else {
            self.runs.push(new);
            return false;
        };
        if restarted || up < head.up {
            // A new remote log, or an upstream rewind (topic recreated or truncated on the
            // source): history is void.
            self.runs.clear();
            self.history.clear();
            self.runs.push(new);
            return restarted;
        }
        if up == head.up {
            if down != head.down {
                // Same record, new target position (target reset): the new mapping wins.
                *head = new;
            }
            return false;
        }
        if trusted && head.exact && (up, down) == (head.end_up, head.end_down) {
            // The end of the run is already known (reported coverage, then the writer's tail
            // sync for that same record): nothing new.
            return false;
        }
        if up <= head.end_up {
            // Writer restarted from an earlier position and re-replicated: offsets before `up`
            // keep their first copies. Only exact heads reach past their start, and those are
            // contiguous with one delta up to `end_up`.
            head.end_up = up - 1;
            head.end_down = up - 1 + head.delta();
        } else {
            let forward = down > head.end_down;
            if forward && trusted && head.exact {
                if down - up == head.delta() {
                    head.end_up = up;
                    head.end_down = down;
                    return false;
                }
                head.end_up = up;
                head.end_down = down;
            } else if forward && !head.exact {
                head.end_up = up;
                head.end_down = down;
            }
        }
        self.push(new, config);
        false
    }

    /// A trusted sync whose record is the first the copy read from `start`: every position
    /// from the start up to the record maps as the start says (a run of its own, exact, that
    /// ends at the record), then the record's run. With aligned offsets both have one delta,
    /// so they are one run.
    fn update_after_start(
        &mut self,
        start: CopyStart,
        up: i64,
        down: i64,
        config: StoreConfig,
    ) -> bool {
        let restarted = self.update(start.upstream, start.downstream, true, true, config);
        let record = Run::at(up, down, true, true);
        match self.runs.last_mut() {
            Some(head) if (head.up, head.down) == (start.upstream, start.downstream) => {
                head.end_up = up;
                head.end_down = down;
                head.exact = true;
            }
            _ => {
                // The start was the end of a run already known: a run of its own after it.
                let mut run = Run::at(start.upstream, start.downstream, true, true);
                run.end_up = up;
                run.end_down = down;
                self.push(run, config);
            }
        }
        self.last_sync = Some((up, down));
        if record.delta() != start.downstream - start.upstream {
            self.push(record, config);
        }
        restarted
    }

    fn push(&mut self, run: Run, config: StoreConfig) {
        // The head is final once a run follows it (only the newest run ever changes).
        if let Some(head) = self.runs.last() {
            self.history.push(head, config.history_bytes);
        }
        let max_runs = config.max_runs.max(2);
        if self.runs.len() == self.runs.capacity() && self.runs.len() <= max_runs {
            // Grow in small exact steps so the buffer never exceeds `max_runs + 1`.
            let extra = self
                .runs
                .len()
                .clamp(2, 16)
                .min(max_runs + 1 - self.runs.len());
            self.runs.reserve_exact(extra);
        }
        self.runs.push(run);
        if self.runs.len() > max_runs {
            let victim = self.eviction_candidate();
            self.runs.remove(victim);
        }
    }

    /// The run (never the oldest or newest) whose removal opens the smallest uncovered span
    /// relative to how far that span is from the newest known offset.
    fn eviction_candidate(&self) -> usize {
        let head_end = self.runs.last().map_or(0, |r| r.end_up);
        let cost = |i: usize| {
            let gap = i128::from(self.runs[i + 1].up) - i128::from(self.runs[i - 1].end_up);
            let age = i128::from(head_end) - i128::from(self.runs[i + 1].up) + 1;
            (gap, age.max(1))
        };
        let mut best = 1;
        let (mut best_gap, mut best_age) = cost(1);
        for i in 2..self.runs.len() - 1 {
            let (gap, age) = cost(i);
            // gap/age < best_gap/best_age, without division; ties keep the older candidate.
            if gap * best_age < best_gap * age {
                (best, best_gap, best_age) = (i, gap, age);
            }
        }
        best
    }

    fn report_coverage(&mut self, coverage: Coverage) -> bool {
        let Some(head) = self.runs.last_mut() else {
            return false;
        };
        let (up, down) = coverage.last_record;
        let extends = head.exact
            && self.last_sync == Some(coverage.last_sync)
            && down - up == head.delta()
            && up >= head.end_up
            && down >= head.end_down;
        if extends {
            head.end_up = up;
            head.end_down = down;
        }
        extends
    }

    /// Translates a committed source offset (the next record the group would read).
    pub fn translate(&self, committed: i64) -> Translation {
        if committed < 0 {
            return Translation::Unknown(UnknownReason::NegativeOffset);
        }
        let idx = self.runs.partition_point(|r| r.up <= committed);
        let Some(run) = idx.checked_sub(1).and_then(|i| self.runs.get(i)) else {
            return Translation::Unknown(match self.runs.first() {
                Some(oldest) => UnknownReason::OlderThanOldestSync { oldest: oldest.up },
                None => UnknownReason::NoSyncs,
            });
        };
        if let Some(head) = self.runs.last()
            && committed < head.up
            && let Some((run, next)) = self.history.around(committed)
        {
            return translate_in(&run, next.as_ref().or(Some(head)), committed);
        }
        translate_in(run, self.runs.get(idx), committed)
    }

    /// Runs currently retained.
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Oldest upstream offset that can be translated.
    pub fn oldest_upstream(&self) -> Option<i64> {
        self.runs.first().map(|r| r.up)
    }

    /// Oldest upstream offset that translates as if every run had been kept.
    pub fn exact_history_from(&self) -> Option<i64> {
        self.history
            .first_up()
            .or_else(|| self.runs.last().map(|r| r.up))
    }

    /// Heap plus inline bytes used by this partition's state.
    pub fn memory_bytes(&self) -> usize {
        size_of::<Self>() + self.runs.capacity() * size_of::<Run>() + self.history.heap_bytes()
    }
}

/// Translates `c` with `run`, the newest run starting at or before it, and `next`, the run
/// after it if any.
fn translate_in(run: &Run, next: Option<&Run>, c: i64) -> Translation {
    if c == run.up {
        return Translation::Exact(run.down);
    }
    if c <= run.end_up {
        if c == run.end_up {
            return Translation::Exact(run.end_down);
        }
        if run.exact {
            return Translation::Exact(c.saturating_add(run.delta()).min(run.end_down));
        }
        // MM2's rule from the run start; records before `end` sit below `end_down`.
        return conservative(run.down, c - run.up - 1, Some(run.end_down - run.down - 1));
    }
    let next_bound = next
        .filter(|next| next.down > run.end_down)
        .map(|next| next.down - run.end_down - 1);
    conservative(run.end_down, c - run.end_up - 1, next_bound)
}

/// `down + 1` past a known record, re-reading at most the smaller of the two bounds.
fn conservative(point_down: i64, by_upstream: i64, by_downstream: Option<i64>) -> Translation {
    let offset = point_down.saturating_add(1);
    let bound = by_downstream
        .map_or(by_upstream, |d| d.min(by_upstream))
        .max(0);
    match u64::try_from(bound) {
        Ok(0) | Err(_) => Translation::Exact(offset),
        Ok(max_replay) => Translation::Conservative { offset, max_replay },
    }
}

/// Offset syncs of every source partition of a flow, and translation of committed offsets.
#[derive(Debug, Clone, Default)]
pub struct OffsetSyncStore {
    partitions: HashMap<TopicPartition, PartitionSyncs>,
    config: StoreConfig,
    loaded: bool,
}

impl OffsetSyncStore {
    /// A store in its initial-load state: it accepts syncs but translates nothing until
    /// [`Self::finish_initial_load`], as MM2 does, so no checkpoint comes from half a topic.
    pub fn new(config: StoreConfig) -> Self {
        Self {
            partitions: HashMap::new(),
            config,
            loaded: false,
        }
    }

    /// Call once the offset-syncs topic was read up to its end offset at start.
    pub fn finish_initial_load(&mut self) {
        self.loaded = true;
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded
    }

    /// Applies one sync, in the order read from the offset-syncs topic. `Ok(true)` when the
    /// sync's target offset went back, which voids the partition's mappings as in MM2: a new
    /// remote log (deleted and created again, or truncated), but also the syncs topic read
    /// again from its start or two writers' syncs interleaved, which look the same here; so
    /// this alone never justifies moving a checkpoint back.
    pub fn update(&mut self, sync: &OffsetSync, origin: SyncOrigin) -> Result<bool, InvalidSync> {
        let (up, down) = (sync.upstream_offset, sync.downstream_offset);
        if up < 0 || down < 0 {
            return Err(InvalidSync {
                topic_partition: sync.topic_partition.clone(),
                upstream: up,
                downstream: down,
            });
        }
        let dense = origin == SyncOrigin::Dense;
        // Compaction leaves a contiguous suffix of each partition's syncs (module docs), so
        // dense syncs read during the initial load are as consecutive as live ones.
        let trusted = dense;
        let config = self.config;
        // Only our own writer says where its copy started (a sparse writer's header is noise).
        let start = sync.start.filter(|s| {
            trusted && s.upstream >= 0 && s.upstream < up && (0..=down).contains(&s.downstream)
        });
        let syncs = match self.partitions.get_mut(&sync.topic_partition) {
            Some(syncs) => syncs,
            None => self
                .partitions
                .entry(sync.topic_partition.clone())
                .or_default(),
        };
        let restarted = match start {
            Some(start) => syncs.update_after_start(start, up, down, config),
            None => syncs.update(up, down, dense, trusted, config),
        };
        Ok(restarted)
    }

    /// Extends the newest run with what the writer replicated since its last sync. Returns
    /// whether the store now translates exactly up to `coverage.last_record`: false unless the
    /// writer's last sync is the newest one applied here and its run is exact.
    pub fn report_coverage(
        &mut self,
        topic_partition: &TopicPartition,
        coverage: Coverage,
    ) -> bool {
        self.loaded
            && self
                .partitions
                .get_mut(topic_partition)
                .is_some_and(|p| p.report_coverage(coverage))
    }

    /// Translates `committed` (a group's committed offset on the source partition).
    pub fn translate(&self, topic_partition: &TopicPartition, committed: i64) -> Translation {
        if !self.loaded {
            return Translation::Unknown(UnknownReason::Loading);
        }
        match self.partitions.get(topic_partition) {
            Some(syncs) => syncs.translate(committed),
            None => Translation::Unknown(UnknownReason::NoSyncs),
        }
    }

    pub fn partition(&self, topic_partition: &TopicPartition) -> Option<&PartitionSyncs> {
        self.partitions.get(topic_partition)
    }

    /// Forgets a partition (e.g. its topic is no longer replicated).
    pub fn remove_partition(&mut self, topic_partition: &TopicPartition) {
        self.partitions.remove(topic_partition);
    }

    /// Approximate bytes held, for a memory gauge.
    pub fn memory_bytes(&self) -> usize {
        let per_entry = size_of::<TopicPartition>() + size_of::<u64>();
        size_of::<Self>()
            + self
                .partitions
                .iter()
                .map(|(tp, syncs)| per_entry + tp.topic.capacity() + syncs.memory_bytes())
                .sum::<usize>()
    }
}
