//! The checkpoint loop: source group offsets, translated through offset syncs, written as MM2
//! checkpoints to `<source alias>.checkpoints.internal` on the target.
//!
//! # Following commits instead of polling them
//! MM2 lists every group's offsets every 60 s. Here a consumer group
//! (`mirrorflow.<flow>.<source>-<target>.checkpoints`) follows the source's `__consumer_offsets` with
//! `read_committed` ([`commits`]), so a commit reaches the loop within about one fetch wait
//! (100 ms) and costs nothing while a group is idle, however many groups there are. Because a
//! group's commits always land in one `__consumer_offsets` partition, the group protocol's
//! partition assignment splits the groups across replicas without coordination of our own;
//! on every assignment the partitions are re-read from the beginning (compacted: about one
//! record per committed partition) and nothing is evaluated until they are caught up, so
//! replayed history never produces a checkpoint. The costs: the flow needs read access to
//! `__consumer_offsets`, and a rebalance re-reads it.
//!
//! # Translation
//! Every replica follows the whole offset-syncs topic into an [`OffsetSyncStore`] (syncs that
//! carry [`crate::mm2::SYNC_ORIGIN_HEADER`] are [`SyncOrigin::Dense`] and translate exactly; MM2's are
//! sparse and translate conservatively). A new sync re-evaluates every owned group committed
//! on that partition, so a checkpoint becomes exact as soon as the sync that covers it lands.
//!
//! # Emission
//! MM2's monotonic rule ([`CheckpointTracker`]): first checkpoint, group rewound upstream, or
//! downstream advanced. The tracker is rebuilt from the checkpoints topic before anything is
//! written, and keeps following it for the groups other replicas own, so a restart or a
//! group moving between replicas stays monotonic. After every assignment nothing is written
//! until the follower has read the topic up to its end as of the assignment (a mark), and
//! what it reads meanwhile may advance the tracker even for the groups this replica owns:
//! their previous owner may have written after this replica last looked (a replica frozen
//! past its session timeout comes back owning groups others checkpointed meanwhile, with
//! offset syncs that lag theirs; without this it wrote checkpoints thousands of records
//! behind theirs, found by the chaos test). A checkpoint counts as written once the
//! target acknowledged it; a failed write is retried with backoff.
//!
//! Each checkpoint says in a header whether its translation was exact ([`exactness`]): the
//! offsets of a conservative one look the same as an exact one's, and the operator's probe
//! must not call a group ready to fail over without re-reading when it would re-read.
//!
//! Share groups keep their position as start offsets, not commits; [`share_groups`] reads them
//! and hands them to the loop as commits.
//!
//! Group offset sync into the target is optional and lives in [`group_sync`]; its per-group
//! state and reason in [`sync_state`].
//!
//! The checkpoints written are verified on the records themselves, sampled ([`verify`]); the
//! outcome is written on the checkpoint record it is about ([`crate::verify::header`]).

mod commits;
mod exactness;
mod fault;
mod freeze;
pub mod group_sync;
mod readers;
mod recreated;
pub mod share_groups;
mod shell;
pub mod state;
pub mod sync_state;
pub mod verify;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::exactness::Conservative;
use self::group_sync::GroupView;
use self::recreated::{Recreations, Verdict};
use self::state::{Commit, Commits, Evaluation, Naming, evaluate};
use crate::kafka::checkpoints::Exactness;
use crate::mm2::{
    Checkpoint, CheckpointTracker, Filters, OffsetSync, OffsetSyncStore, StoreConfig, SyncOrigin,
    TopicPartition,
};
use crate::replicator::backoff::Backoff;
use crate::replicator::context::Context;
use crate::replicator::kafka_io;
use crate::replicator::kafka_io::{AckedProducer, Reachability};

/// What the reader threads tell the loop.
#[derive(Debug)]
pub enum Event {
    Assigned(Vec<i32>),
    Revoked(Vec<i32>),
    /// Sent after a revocation; answered when the loop handles it. The loop handles events
    /// only between its turns, once every checkpoint it decided is acknowledged or failed,
    /// and it forgets the revoked groups first: the revocation (and so the group's move to
    /// another replica) waits until none of its writes for them is in flight
    /// ([`commits::hand_over`]).
    Handover(std::sync::mpsc::Sender<()>),
    CaughtUp(i32),
    Commit {
        co_partition: i32,
        group: String,
        tp: TopicPartition,
        commit: Option<Commit>,
    },
    /// An offset sync, with its record timestamp.
    Sync(OffsetSync, SyncOrigin, Option<i64>),
    SyncsLoaded,
    /// The source loop found the remote partition of this SOURCE partition recreated at
    /// `detected_ms` (a `TargetTopicRecreated` gap in the positions topic).
    TargetRecreated {
        tp: TopicPartition,
        detected_ms: i64,
    },
    /// A checkpoint read back from the checkpoints topic, with its record timestamp and what
    /// its writer said of its translation.
    CheckpointRead(Checkpoint, Option<i64>, Exactness),
    CheckpointsLoaded,
    /// The checkpoints follower read everything the topic held when mark N was asked for.
    CheckpointsMark(u64),
    /// The verifier thread judged a checkpoint on its records ([`verify`]).
    Verified(Box<verify::Verified>),
    /// The share groups of the source the flow selects, told before their start offsets come
    /// as commits ([`share_groups`]): checkpointed, never synced into the target as a consumer
    /// group's offsets.
    ShareGroups(HashSet<String>),
}

const EVENT_BUFFER: usize = 4096;

pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let flow = &ctx.flow;
    let spec = &flow.spec;
    let target_reach = Reachability::new(&ctx.clusters.target, "checkpoint");
    let checkpoints_topic = flow.policy.checkpoints_topic(flow.source_alias());
    let rf = spec.source_loop.replication_factor;
    if !kafka_io::ensure_compacted_topic(
        &flow.target_client,
        &checkpoints_topic,
        rf,
        &target_reach,
        &shutdown,
    )
    .await?
    {
        return Ok(());
    }

    // Readers stop with this token, also when the loop ends on an error.
    let readers = shutdown.child_token();
    let _stop_readers = readers.clone().drop_guard();
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let (mark_sender, mark_requests) = std::sync::mpsc::channel();
    let verifier = readers::start(&ctx, &checkpoints_topic, mark_requests, tx, &readers)?;
    let group_views = if spec.checkpoints.sync_group_offsets {
        let (views_tx, views_rx) = mpsc::channel(EVENT_BUFFER);
        tokio::spawn(group_sync::run(
            flow.target_client.clone(),
            group_sync::ShareTarget::of(flow),
            spec.checkpoints.interval.as_duration(),
            spec.checkpoints.groups_refresh_interval.as_duration(),
            target_reach.clone(),
            views_rx,
            readers.clone(),
        ));
        Some(views_tx)
    } else {
        tracing::info!("group offset sync is disabled (spec.checkpoints.syncGroupOffsets)");
        None
    };

    let filters = Filters {
        topics: flow.topics.clone(),
        groups: flow.groups.clone(),
    };
    let deadline = freeze::write_deadline(&flow.source_client);
    let mut shell = shell::Shell {
        ctx: ctx.clone(),
        topic: checkpoints_topic,
        producer: checkpoints_producer(flow, deadline)?,
        target_reach,
        group_views,
        core: Core::new(Naming {
            policy: flow.policy.as_ref(),
            filters: &filters,
            source_alias: flow.source_alias(),
            target_alias: flow.target_alias(),
        })
        .with_write_deadline(deadline),
        verification: verifier.map(|v| {
            let period = spec.checkpoints.verify_interval.as_duration();
            shell::Verification::new(
                v,
                verify::sampler::Sampler::new(
                    period,
                    verify::per_replica(spec.replicas),
                    std::time::Instant::now(),
                )
                .with_byte_budget(verify::bytes_per_replica(spec.replicas)),
                period,
            )
        }),
    };
    shell.core.marks = Some(mark_sender);
    turns(&mut shell, rx, &shutdown).await
}

/// The producer of checkpoints on the target; a write fails after `deadline`.
fn checkpoints_producer(
    flow: &crate::flow::Flow,
    deadline: Duration,
) -> anyhow::Result<AckedProducer> {
    Ok(AckedProducer::new(
        flow.target_client
            .clone()
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            // A write to an unreachable target fails (and is retried with backoff) well before
            // liveness would call the loop wedged (librdkafka's default waits 300 s), and
            // before a frozen replica's groups can have moved ([`freeze::write_deadline`]).
            .set("message.timeout.ms", deadline.as_millis().to_string()),
    )?)
}

/// The loop's turns until `shutdown`: each event read (with what is already queued behind
/// it) or tick handled, then what is dirty flushed, a failed flush retried with backoff.
async fn turns(
    shell: &mut shell::Shell<'_>,
    mut rx: mpsc::Receiver<Event>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut write_backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut last_turn = std::time::Instant::now();
    loop {
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            event = rx.recv() => {
                let Some(event) = event else {
                    anyhow::bail!("the checkpoint loop's readers stopped");
                };
                shell.core.resumed_after(last_turn.elapsed());
                shell.core.handle(event);
                // Drain what is already queued so one flush covers a burst (bounded, so
                // shutdown and ticks still get their turn during a long initial read).
                for _ in 0..EVENT_BUFFER {
                    match rx.try_recv() {
                        Ok(event) => shell.core.handle(event),
                        Err(_) => break,
                    }
                }
                shell.drop_forgotten();
                shell.write_verified().await;
            }
            _ = retry => retry_at = None,
            _ = tick.tick() => {
                shell.core.resumed_after(last_turn.elapsed());
                shell.tick();
            }
        }
        if retry_at.is_none() && !shell.core.dirty.is_empty() {
            if shell.flush().await {
                write_backoff.reset();
            } else {
                retry_at = Some(tokio::time::Instant::now() + write_backoff.next_delay());
            }
        }
        last_turn = std::time::Instant::now();
    }
    Ok(())
}

/// The loop's state and every decision it takes, without I/O: what it knows of groups, syncs
/// and checkpoints, which (group, partition) pairs need evaluating and which checkpoints are
/// due. [`shell::Shell`] writes what it decides.
struct Core<'a> {
    naming: Naming<'a>,
    store: OffsetSyncStore,
    tracker: CheckpointTracker,
    /// The pairs of the tracker whose latest checkpoint was a conservative translation.
    conservative: Conservative,
    recreations: Recreations,
    commits: Commits,
    /// (group, source partition) pairs to evaluate at the next flush.
    dirty: HashSet<(String, TopicPartition)>,
    assigned_once: bool,
    checkpoints_loaded: bool,
    /// Where mark requests go (the checkpoints follower); none in tests without one.
    marks: Option<std::sync::mpsc::Sender<u64>>,
    last_mark: u64,
    /// The mark asked for at the latest assignment, until the follower reaches it.
    awaited_mark: Option<u64>,
    last_checkpoint: HashMap<String, SystemTime>,
    /// Per group, committed source partitions without a translation.
    uncovered: HashMap<String, HashSet<TopicPartition>>,
    /// Groups whose checkpoints or coverage changed since the last group view was sent.
    changed_groups: HashSet<String>,
    /// Share groups: the group sync sets their start offsets, never commits (an OffsetCommit
    /// on the target would make a consumer group of the name, which its share consumers could
    /// then not join).
    share_groups: HashSet<String>,
    /// Groups forgotten since the shell last dropped their metrics.
    forgotten: Vec<String>,
    /// Groups whose `Forget` the group sync task has not taken yet, oldest first. They go out
    /// before any update, so a group that comes back is never forgotten after its new view.
    unsent_forgets: Vec<String>,
    /// Verifications back from the verifier thread, not written yet.
    verified: Vec<verify::Verified>,
    /// When a wait for the loop's next turn, or from a decision to its write, is a freeze.
    freeze: freeze::FreezeLimit,
}

/// A checkpoint [`Core`] decided to write.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Due {
    /// The source partition of the commit it translates.
    tp: TopicPartition,
    checkpoint: Checkpoint,
    exactness: Exactness,
    /// The commit's broker time when it was read live (its latency is worth measuring).
    live_since: Option<i64>,
}

impl<'a> Core<'a> {
    fn new(naming: Naming<'a>) -> Self {
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
    fn with_write_deadline(mut self, deadline: Duration) -> Self {
        self.freeze = freeze::FreezeLimit::within(deadline);
        self
    }
}

impl Core<'_> {
    fn inputs_loaded(&self) -> bool {
        self.checkpoints_loaded && self.store.is_loaded()
    }

    fn ready_to_evaluate(&self) -> bool {
        self.inputs_loaded() && self.awaited_mark.is_none()
    }

    /// Whether everything the loop reads at start is loaded: the readiness the pod reports
    /// (a mark after a later assignment takes a fetch or two; readiness does not flap on it).
    fn loaded(&self) -> bool {
        self.inputs_loaded() && self.assigned_once && self.commits.all_caught_up()
    }

    /// The loop waited `gap` for its next turn, while a tick comes every second: past the
    /// freeze limit, the process was frozen (stopped, starved) and other replicas may have
    /// taken its groups and checkpointed them meanwhile, which it has not read yet. Like after
    /// an assignment, nothing is written (no checkpoint, no verification stated on one) until
    /// the follower has read the checkpoints topic to its end. Returns whether it was frozen.
    fn resumed_after(&mut self, gap: Duration) -> bool {
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
    fn frozen_since(&mut self, started: std::time::Instant) -> bool {
        self.resumed_after(started.elapsed())
    }

    /// Asks the checkpoints follower for a mark; nothing is evaluated until it arrives.
    fn await_checkpoints_mark(&mut self) {
        let Some(marks) = &self.marks else {
            return;
        };
        self.last_mark += 1;
        if marks.send(self.last_mark).is_ok() {
            self.awaited_mark = Some(self.last_mark);
        }
    }

    fn handle(&mut self, event: Event) {
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

    fn assigned(&mut self, partitions: Vec<i32>) {
        tracing::info!(partitions = ?partitions, "assigned __consumer_offsets partitions; reading them from the beginning");
        for p in partitions {
            self.commits.assign(p);
        }
        self.assigned_once = true;
        self.await_checkpoints_mark();
    }

    /// A commit (or its deletion: `None`) of `group` on `tp`, read in `co_partition`.
    fn committed(
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

    fn synced(&mut self, sync: &OffsetSync, origin: SyncOrigin, timestamp_ms: Option<i64>) {
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

    fn checkpoint_read(
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

    fn dirty_partition(&mut self, tp: &TopicPartition) {
        let groups: Vec<String> = self.commits.groups_on(tp).cloned().collect();
        self.dirty
            .extend(groups.into_iter().map(|g| (g, tp.clone())));
    }

    fn forget_group(&mut self, group: &str) {
        self.uncovered.remove(group);
        self.changed_groups.remove(group);
        self.dirty.retain(|(g, _)| g != group);
        self.forgotten.push(group.to_owned());
        self.unsent_forgets.push(group.to_owned());
    }

    /// Evaluates the dirty pairs and returns the checkpoints to write. Nothing (and every
    /// pair stays dirty) until the checkpoints and the offset syncs are loaded.
    fn due_checkpoints(&mut self) -> Vec<Due> {
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
    fn written(
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
    fn write_failed(&mut self, tp: TopicPartition, cp: Checkpoint) {
        self.dirty.insert((cp.group, tp));
    }

    fn has_group_views(&self) -> bool {
        !self.changed_groups.is_empty() || !self.unsent_forgets.is_empty()
    }

    /// The views the group sync task has not seen yet: forgotten groups first, then the new
    /// view of every group that changed and still has commits.
    fn take_group_views(&mut self) -> Vec<GroupView> {
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
    fn unsent_group_views(&mut self, views: impl IntoIterator<Item = GroupView>) {
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
    fn discard_group_views(&mut self) {
        self.changed_groups.clear();
        self.unsent_forgets.clear();
    }

    /// How long ago each owned group's latest checkpoint was written, for those known.
    fn checkpoint_ages(&self, now: SystemTime) -> Vec<(&str, Duration)> {
        self.commits
            .groups()
            .filter_map(|(group, _)| {
                let at = self.last_checkpoint.get(group)?;
                Some((group.as_str(), now.duration_since(*at).unwrap_or_default()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
