//! The checkpoint loop's state and every decision it takes, without I/O ([`Core`]);
//! [`super::shell::Shell`] writes what it decides.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::events::Event;
use super::exactness::Conservative;
use super::group_sync::GroupView;
use super::recreated::{Recreations, Verdict};
use super::state::{Commit, Commits, Evaluation, Naming, evaluate};
use super::{freeze, verify};
use crate::kafka::checkpoints::Exactness;
use crate::mm2::{
    Checkpoint, CheckpointTracker, OffsetSync, OffsetSyncStore, StoreConfig, SyncOrigin,
    TopicPartition,
};

/// The loop's state and every decision it takes, without I/O: what it knows of groups, syncs
/// and checkpoints, which (group, partition) pairs need evaluating and which checkpoints are
/// due. [`shell::Shell`] writes what it decides.
pub(super) struct Core<'a> {
    pub(super) naming: Naming<'a>,
    pub(super) store: OffsetSyncStore,
    pub(super) tracker: CheckpointTracker,
    /// The pairs of the tracker whose latest checkpoint was a conservative translation.
    pub(super) conservative: Conservative,
    pub(super) recreations: Recreations,
    pub(super) commits: Commits,
    /// (group, source partition) pairs to evaluate at the next flush.
    pub(super) dirty: HashSet<(String, TopicPartition)>,
    pub(super) assigned_once: bool,
    pub(super) checkpoints_loaded: bool,
    /// Where mark requests go (the checkpoints follower); none in tests without one.
    pub(super) marks: Option<std::sync::mpsc::Sender<u64>>,
    pub(super) last_mark: u64,
    /// The mark asked for at the latest assignment, until the follower reaches it.
    pub(super) awaited_mark: Option<u64>,
    pub(super) last_checkpoint: HashMap<String, SystemTime>,
    /// Per group, committed source partitions without a translation.
    pub(super) uncovered: HashMap<String, HashSet<TopicPartition>>,
    /// Groups whose checkpoints or coverage changed since the last group view was sent.
    pub(super) changed_groups: HashSet<String>,
    /// Share groups: the group sync sets their start offsets, never commits (an OffsetCommit
    /// on the target would make a consumer group of the name, which its share consumers could
    /// then not join).
    pub(super) share_groups: HashSet<String>,
    /// Groups forgotten since the shell last dropped their metrics.
    pub(super) forgotten: Vec<String>,
    /// Groups whose `Forget` the group sync task has not taken yet, oldest first. They go out
    /// before any update, so a group that comes back is never forgotten after its new view.
    pub(super) unsent_forgets: Vec<String>,
    /// Verifications back from the verifier thread, not written yet.
    pub(super) verified: Vec<verify::Verified>,
    /// When a wait for the loop's next turn, or from a decision to its write, is a freeze.
    pub(super) freeze: freeze::FreezeLimit,
}

/// A checkpoint [`Core`] decided to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Due {
    /// The source partition of the commit it translates.
    pub(super) tp: TopicPartition,
    pub(super) checkpoint: Checkpoint,
    pub(super) exactness: Exactness,
    /// The commit's broker time when it was read live (its latency is worth measuring).
    pub(super) live_since: Option<i64>,
}

impl<'a> Core<'a> {
    pub(super) fn new(naming: Naming<'a>) -> Self {
        Core {
            naming,
            store: OffsetSyncStore::new(StoreConfig::default()),
            tracker: CheckpointTracker::new(),
            conservative: Conservative::default(),
            recreations: Recreations::default(),
            commits: Commits::default(),
            dirty: HashSet::new(),
            assigned_once: false,
            checkpoints_loaded: false,
            marks: None,
            last_mark: 0,
            awaited_mark: None,
            last_checkpoint: HashMap::new(),
            uncovered: HashMap::new(),
            changed_groups: HashSet::new(),
            share_groups: HashSet::new(),
            forgotten: Vec::new(),
            unsent_forgets: Vec::new(),
            verified: Vec::new(),
            freeze: freeze::FreezeLimit::default(),
        }
    }

    /// Counts as frozen past the checkpoints' write deadline when that is shorter.
    pub(super) fn with_write_deadline(mut self, deadline: Duration) -> Self {
        self.freeze = freeze::FreezeLimit::within(deadline);
        self
    }
}

impl Core<'_> {
    pub(super) fn inputs_loaded(&self) -> bool {
        self.checkpoints_loaded && self.store.is_loaded()
    }

    pub(super) fn ready_to_evaluate(&self) -> bool {
        self.inputs_loaded() && self.awaited_mark.is_none()
    }

    /// Whether everything the loop reads at start is loaded: the readiness the pod reports
    /// (a mark after a later assignment takes a fetch or two; readiness does not flap on it).
    pub(super) fn loaded(&self) -> bool {
        self.inputs_loaded() && self.assigned_once && self.commits.all_caught_up()
    }

    /// The loop waited `gap` for its next turn, while a tick comes every second: past the
    /// freeze limit, the process was frozen (stopped, starved) and other replicas may have
    /// taken its groups and checkpointed them meanwhile, which it has not read yet. Like after
    /// an assignment, nothing is written (no checkpoint, no verification stated on one) until
    /// the follower has read the checkpoints topic to its end. Returns whether it was frozen.
    pub(super) fn resumed_after(&mut self, gap: Duration) -> bool {
        let frozen = self.freeze.passed_by(gap);
        if frozen {
            tracing::warn!(
                ?gap,
                "the checkpoint loop did not run for a while; reading the checkpoints topic to its end before writing"
            );
            self.await_checkpoints_mark();
        }
        frozen
    }

    /// Whether the process was frozen since `started` (a decision, the start of a run of
    /// writes): what was decided then may be passed by another owner's checkpoints by now.
    pub(super) fn frozen_since(&mut self, started: std::time::Instant) -> bool {
        self.resumed_after(started.elapsed())
    }

    /// Asks the checkpoints follower for a mark; nothing is evaluated until it arrives.
    pub(super) fn await_checkpoints_mark(&mut self) {
        let Some(marks) = &self.marks else {
            return;
        };
        self.last_mark += 1;
        if marks.send(self.last_mark).is_ok() {
            self.awaited_mark = Some(self.last_mark);
        }
    }

    pub(super) fn handle(&mut self, event: Event) {
        match event {
            Event::Assigned(partitions) => self.assigned(partitions),
            Event::Revoked(partitions) => {
                tracing::info!(partitions = ?partitions, "revoked __consumer_offsets partitions");
                for p in partitions {
                    for group in self.commits.revoke(p) {
                        self.forget_group(&group);
                    }
                }
            }
            Event::CaughtUp(p) => {
                let pairs = self.commits.caught_up(p);
                if !pairs.is_empty() {
                    tracing::debug!(
                        partition = p,
                        pairs = pairs.len(),
                        "caught up with a __consumer_offsets partition"
                    );
                }
                self.dirty.extend(pairs);
            }
            Event::Commit {
                co_partition,
                group,
                tp,
                commit,
            } => self.committed(co_partition, group, tp, commit),
            Event::Sync(sync, origin, timestamp_ms) => self.synced(&sync, origin, timestamp_ms),
            Event::TargetRecreated { tp, detected_ms } => {
                if self.recreations.recreated(&tp, detected_ms) && self.store.is_loaded() {
                    tracing::info!(partition = %tp, "the remote partition was recreated; its checkpoints are written again from its new log");
                    self.dirty_partition(&tp);
                }
            }
            Event::SyncsLoaded => {
                self.store.finish_initial_load();
                tracing::info!("offset syncs loaded");
                self.dirty.extend(self.commits.all_pairs());
            }
            Event::CheckpointRead(cp, timestamp_ms, exactness) => {
                self.checkpoint_read(&cp, timestamp_ms, exactness);
            }
            Event::CheckpointsMark(mark) => {
                if self.awaited_mark == Some(mark) {
                    self.awaited_mark = None;
                    tracing::debug!(
                        mark,
                        "checkpoints read up to their end as of the latest assignment"
                    );
                }
            }
            Event::Verified(v) => self.verified.push(*v),
            Event::ShareGroups(groups) => self.share_groups = groups,
            // The follower may be gone (shutdown): nobody waits then.
            Event::Handover(settled) => _ = settled.send(()),
            Event::CheckpointsLoaded => {
                self.checkpoints_loaded = true;
                tracing::info!("last checkpoints loaded");
                self.dirty.extend(self.commits.all_pairs());
            }
        }
    }

    pub(super) fn assigned(&mut self, partitions: Vec<i32>) {
        tracing::info!(partitions = ?partitions, "assigned __consumer_offsets partitions; reading them from the beginning");
        for p in partitions {
            self.commits.assign(p);
        }
        self.assigned_once = true;
        self.await_checkpoints_mark();
    }

    /// A commit (or its deletion: `None`) of `group` on `tp`, read in `co_partition`.
    pub(super) fn committed(
        &mut self,
        co_partition: i32,
        group: String,
        tp: TopicPartition,
        commit: Option<Commit>,
    ) {
        let deleted = commit.is_none();
        if !self.commits.apply(co_partition, &group, tp.clone(), commit) {
            return;
        }
        if !deleted {
            self.dirty.insert((group, tp));
            return;
        }
        if let Some(u) = self.uncovered.get_mut(&group) {
            u.remove(&tp);
        }
        self.changed_groups.insert(group.clone());
        if self.commits.group(&group).is_none() {
            self.forget_group(&group);
        }
    }

    pub(super) fn synced(
        &mut self,
        sync: &OffsetSync,
        origin: SyncOrigin,
        timestamp_ms: Option<i64>,
    ) {
        // A sync whose target offset went back (`Ok(true)`) voids the partition's mappings in
        // the store, as in MM2; the checkpoints already written stay, by MM2's monotonic rule:
        // a replay of the syncs topic from its start (a follower reset) or syncs of two
        // writers interleaved look the same, and forgetting them there wrote checkpoints that
        // went backwards (found by the chaos test). A recreated remote partition is told apart
        // by the source loop's TargetTopicRecreated gap ([`recreated`]).
        let tp = &sync.topic_partition;
        let first = self.store.partition(tp).is_none();
        match self.store.update(sync, origin) {
            Ok(rewound) => self
                .recreations
                .sync_applied(tp, first || rewound, timestamp_ms),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring an invalid offset sync");
                return;
            }
        }
        if self.store.is_loaded() {
            self.dirty_partition(tp);
        }
    }

    pub(super) fn checkpoint_read(
        &mut self,
        cp: &Checkpoint,
        timestamp_ms: Option<i64>,
        exactness: Exactness,
    ) {
        // Groups this replica owns are authoritative in memory: a read-back of its own older
        // write must not roll the tracker back. Until the mark of an assignment, another
        // owner's later writes may still come: taken when they advance.
        let owned = self.checkpoints_loaded && self.commits.is_owned_group(&cp.group);
        let advances = || {
            self.tracker
                .last(&cp.group, &cp.topic_partition)
                .is_none_or(|(_, down)| cp.downstream_offset > down)
        };
        if owned && (self.awaited_mark.is_none() || !advances()) {
            return;
        }
        self.tracker.record_at(cp, timestamp_ms);
        self.conservative.record(cp, exactness);
        if let Some(ms) = timestamp_ms.and_then(|ms| u64::try_from(ms).ok()) {
            let at = UNIX_EPOCH + Duration::from_millis(ms);
            let last = self.last_checkpoint.entry(cp.group.clone()).or_insert(at);
            *last = (*last).max(at);
        }
    }

    pub(super) fn dirty_partition(&mut self, tp: &TopicPartition) {
        let groups: Vec<String> = self.commits.groups_on(tp).cloned().collect();
        self.dirty
            .extend(groups.into_iter().map(|g| (g, tp.clone())));
    }

    pub(super) fn forget_group(&mut self, group: &str) {
        self.uncovered.remove(group);
        self.changed_groups.remove(group);
        self.dirty.retain(|(g, _)| g != group);
        self.forgotten.push(group.to_owned());
        self.unsent_forgets.push(group.to_owned());
    }

    /// Evaluates the dirty pairs and returns the checkpoints to write. Nothing (and every
    /// pair stays dirty) until the checkpoints and the offset syncs are loaded.
    pub(super) fn due_checkpoints(&mut self) -> Vec<Due> {
        if !self.ready_to_evaluate() {
            return Vec::new();
        }
        let mut batch = Vec::new();
        for (group, tp) in std::mem::take(&mut self.dirty) {
            let Some(commit) = self.commits.get(&group, &tp) else {
                continue;
            };
            if let Some(target) = self.naming.target_partition(&tp) {
                match self
                    .recreations
                    .verdict(&self.tracker, &group, &tp, &target)
                {
                    Verdict::Evaluate => {}
                    Verdict::ForgetThenEvaluate => {
                        self.tracker.forget(&group, &target);
                        self.conservative.forget(&group, &target);
                    }
                    // The new log's first sync makes the pair dirty again.
                    Verdict::Wait => continue,
                }
            }
            let evaluation = evaluate(
                &self.naming,
                &self.store,
                &self.tracker,
                &self.conservative,
                &group,
                &tp,
                commit,
            );
            let live_since = commit.live.then_some(commit.commit_timestamp_ms);
            let uncovered = matches!(evaluation, Evaluation::Untranslatable(_));
            let set = self.uncovered.entry(group.clone()).or_default();
            let coverage_changed = if uncovered {
                set.insert(tp.clone())
            } else {
                set.remove(&tp)
            };
            if coverage_changed {
                self.changed_groups.insert(group.clone());
            }
            match evaluation {
                Evaluation::Emit(checkpoint, exactness) => batch.push(Due {
                    tp,
                    checkpoint,
                    exactness,
                    live_since,
                }),
                Evaluation::NotMirrored | Evaluation::Unchanged => {
                    // Nothing new will come of this commit: stop timing it.
                    self.commits.settle(&group, &tp);
                }
                Evaluation::Untranslatable(reason) => {
                    tracing::trace!(group = %group, partition = %tp, ?reason, "no translation");
                }
            }
        }
        batch
    }

    /// The target acknowledged `cp`, of this exactness, at `now`.
    pub(super) fn written(
        &mut self,
        tp: &TopicPartition,
        cp: &Checkpoint,
        exactness: Exactness,
        now: SystemTime,
    ) {
        self.tracker
            .record_at(cp, Some(crate::clock::ms_since_epoch(now)));
        self.conservative.record(cp, exactness);
        self.commits.settle(&cp.group, tp);
        self.last_checkpoint.insert(cp.group.clone(), now);
        self.changed_groups.insert(cp.group.clone());
    }

    /// Writing `cp` failed: evaluated again at the next flush.
    pub(super) fn write_failed(&mut self, tp: TopicPartition, cp: Checkpoint) {
        self.dirty.insert((cp.group, tp));
    }

    pub(super) fn has_group_views(&self) -> bool {
        !self.changed_groups.is_empty() || !self.unsent_forgets.is_empty()
    }

    /// The views the group sync task has not seen yet: forgotten groups first, then the new
    /// view of every group that changed and still has commits.
    pub(super) fn take_group_views(&mut self) -> Vec<GroupView> {
        let mut views: Vec<GroupView> = std::mem::take(&mut self.unsent_forgets)
            .into_iter()
            .map(GroupView::Forget)
            .collect();
        for group in std::mem::take(&mut self.changed_groups) {
            let Some(commits) = self.commits.group(&group) else {
                continue;
            };
            let checkpoints: BTreeMap<TopicPartition, i64> = commits
                .keys()
                .filter_map(|tp| {
                    let target = self.naming.target_partition(tp)?;
                    let (_, down) = self.tracker.last(&group, &target)?;
                    Some((target, down))
                })
                .collect();
            let uncovered = self.uncovered.get(&group).map_or(0, HashSet::len);
            views.push(GroupView::Update {
                share: self.share_groups.contains(&group),
                group,
                checkpoints,
                uncovered,
            });
        }
        views
    }

    /// Takes back views that could not be sent, in the order [`Self::take_group_views`] gave
    /// them, to send with the next ones.
    pub(super) fn unsent_group_views(&mut self, views: impl IntoIterator<Item = GroupView>) {
        for view in views {
            match view {
                GroupView::Forget(group) => self.unsent_forgets.push(group),
                GroupView::Update { group, .. } => {
                    self.changed_groups.insert(group);
                }
            }
        }
    }

    /// Without a group sync task nobody wants the views.
    pub(super) fn discard_group_views(&mut self) {
        self.changed_groups.clear();
        self.unsent_forgets.clear();
    }

    /// How long ago each owned group's latest checkpoint was written, for those known.
    pub(super) fn checkpoint_ages(&self, now: SystemTime) -> Vec<(&str, Duration)> {
        self.commits
            .groups()
            .filter_map(|(group, _)| {
                let at = self.last_checkpoint.get(group)?;
                Some((group.as_str(), now.duration_since(*at).unwrap_or_default()))
            })
            .collect()
    }
}

impl Core<'_> {
    /// The checkpoints that may be verified: this replica's groups' latest checkpoints that
    /// are at the group's commit (one behind it is about to be replaced), as (group, target
    /// partition) with the source partition.
    pub(super) fn verify_candidates(&self) -> Vec<(verify::sampler::Pair, TopicPartition)> {
        let mut out = Vec::new();
        for (group, commits) in self.commits.groups() {
            for (source, commit) in commits {
                let Some(target) = self.naming.target_partition(source) else {
                    continue;
                };
                if self
                    .tracker
                    .last(group, &target)
                    .is_some_and(|(up, _)| up == commit.offset)
                {
                    out.push(((group.clone(), target), source.clone()));
                }
            }
        }
        out
    }

    /// The job that verifies the latest checkpoint of `group` on `target`, if it is still at
    /// the commit on `source`.
    pub(super) fn verify_job(
        &self,
        group: &str,
        target: &TopicPartition,
        source: &TopicPartition,
    ) -> Option<verify::Job> {
        let commit = self.commits.get(group, source)?;
        let (up, down) = self.tracker.last(group, target)?;
        if up != commit.offset {
            return None;
        }
        let exactness = match self.conservative.max_replay(group, target) {
            Some(max_replay) => Exactness::Conservative { max_replay },
            None => Exactness::Exact,
        };
        Some(verify::Job {
            source: source.clone(),
            checkpoint: Checkpoint {
                group: group.to_owned(),
                topic_partition: target.clone(),
                upstream_offset: up,
                downstream_offset: down,
                metadata: commit.metadata.clone(),
            },
            exactness,
        })
    }
}
