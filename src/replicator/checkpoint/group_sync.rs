//! Optional group offset sync: commits each group's latest checkpoints into the same group on
//! the target, under [`super::sync_state::plan`]'s rules (idle groups only, never backwards).
//!
//! Runs beside the checkpoint loop so slow target requests never delay checkpoints. Each pass
//! handles the groups whose checkpoints changed, and every group again after
//! `groupsRefreshInterval` (a group that was active may have become idle). rdkafka has no
//! safe AlterConsumerGroupOffsets, so the commit goes through a short-lived consumer whose
//! `group.id` is that group and which never joins it: the coordinator accepts such a commit
//! only while the group has no members, which backs up the state check. A share group's start
//! offsets are set instead ([`share`]).

mod pass;
mod share;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use self::pass::ShareTarget;
use self::pass::{DueGroup, OwnTarget};
use super::sync_state::{GroupSyncStatus, TargetGroup, active_on_target, before_target, plan};
use crate::mm2::TopicPartition;
use crate::replicator::kafka_io::{Reachability, is_unreachable};

/// The checkpoint loop's view of one group, sent whenever it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupView {
    Update {
        group: String,
        /// Latest checkpoint per target partition.
        checkpoints: BTreeMap<TopicPartition, i64>,
        /// Committed source partitions without a translation.
        uncovered: usize,
        /// A share group (KIP-932): its start offsets are set, not committed.
        share: bool,
    },
    /// The group left this replica or has no commits any more.
    Forget(String),
}

/// What the sync task knows of one group.
#[derive(Debug)]
struct Tracked {
    checkpoints: BTreeMap<TopicPartition, i64>,
    uncovered: usize,
    share: bool,
    /// Not yet synced with the current view (or the last attempt could not ask the target).
    due: bool,
    last_attempt: Option<Instant>,
    status: Option<GroupSyncStatus>,
}

impl Tracked {
    /// A group seen for the first time: synced at the next pass.
    fn new() -> Self {
        Tracked {
            checkpoints: BTreeMap::new(),
            uncovered: 0,
            share: false,
            due: true,
            last_attempt: None,
            status: None,
        }
    }

    /// Takes the loop's new view; due when it differs from the last one.
    fn update(
        &mut self,
        checkpoints: BTreeMap<TopicPartition, i64>,
        uncovered: usize,
        share: bool,
    ) {
        self.due |= self.checkpoints != checkpoints || self.uncovered != uncovered;
        self.checkpoints = checkpoints;
        self.uncovered = uncovered;
        self.share = share;
    }

    /// Whether the pass at `now` syncs the group: when its view changed or the target could
    /// not be asked, and every `refresh` anyway (an active group may have become idle).
    fn is_due(&self, now: Instant, refresh: Duration) -> bool {
        self.due
            || self
                .last_attempt
                .is_none_or(|a| now.saturating_duration_since(a) >= refresh)
    }

    /// Records a sync attempt at `now`; `None` when the target could not be asked. Returns
    /// the new status when its state changed.
    fn attempted(
        &mut self,
        now: Instant,
        status: Option<GroupSyncStatus>,
    ) -> Option<&GroupSyncStatus> {
        self.last_attempt = Some(now);
        // Unanswered: asked again at the next pass, not only after `refresh`.
        let status = status?;
        self.due = false;
        let changed = self.status.as_ref().map(|s| s.state) != Some(status.state);
        self.status = Some(status);
        if changed { self.status.as_ref() } else { None }
    }
}

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one group's sync may go without an answer before the pass is reported stuck: its
/// three requests (describe, read offsets, commit) have [`REQUEST_TIMEOUT`] each, and creating
/// the client takes well under a second.
const STUCK_AFTER: Duration = Duration::from_secs(30);

type PassResults = Vec<(String, Option<GroupSyncStatus>)>;

/// One pass's requests, on a thread of their own. librdkafka's synchronous commit can wait
/// without end for a group's coordinator (a commit in flight while a broker restarted never
/// returned, in the project's chaos test), so the loop never waits on a pass: it takes the
/// results when the thread sends them, reports a pass that finished no group for
/// [`STUCK_AFTER`], and starts no other pass meanwhile, so at most one thread is held.
struct Pass {
    results: oneshot::Receiver<PassResults>,
    started: Instant,
    /// Milliseconds from `started` to the last group the pass finished.
    progress: Arc<AtomicU64>,
    reported_stuck: bool,
}

impl Pass {
    fn start(
        due: Vec<DueGroup>,
        mut sync: impl FnMut(&DueGroup) -> Option<GroupSyncStatus> + Send + 'static,
    ) -> std::io::Result<Pass> {
        let (tx, results) = oneshot::channel();
        let started = Instant::now();
        let progress = Arc::new(AtomicU64::new(0));
        let done = progress.clone();
        std::thread::Builder::new()
            .name("group-sync".into())
            .spawn(move || {
                let results = due
                    .into_iter()
                    .map(|due| {
                        let status = sync(&due);
                        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                        done.store(ms, Ordering::Relaxed);
                        (due.group, status)
                    })
                    .collect();
                let _ = tx.send(results);
            })?;
        Ok(Pass {
            results,
            started,
            progress,
            reported_stuck: false,
        })
    }

    /// How long the pass has gone at `now` without finishing a group.
    fn silent_for(&self, now: Instant) -> Duration {
        let last = self.started + Duration::from_millis(self.progress.load(Ordering::Relaxed));
        now.saturating_duration_since(last)
    }
}

/// The running pass's results; never ready without one.
async fn finished(pass: &mut Option<Pass>) -> PassResults {
    match pass {
        // A thread that ended without sending (a panic) leaves its groups unattempted.
        Some(p) => (&mut p.results).await.unwrap_or_default(),
        None => std::future::pending().await,
    }
}

pub async fn run(
    target: ClientConfig,
    share_target: ShareTarget,
    interval: Duration,
    refresh: Duration,
    reach: Arc<Reachability>,
    mut rx: mpsc::Receiver<GroupView>,
    shutdown: CancellationToken,
) {
    let mut groups: HashMap<String, Tracked> = HashMap::new();
    let mut pass: Option<Pass> = None;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            view = rx.recv() => match view {
                None => return,
                Some(GroupView::Update { group, checkpoints, uncovered, share }) => {
                    groups
                        .entry(group)
                        .or_insert_with(Tracked::new)
                        .update(checkpoints, uncovered, share);
                }
                Some(GroupView::Forget(group)) => {
                    groups.remove(&group);
                }
            },
            results = finished(&mut pass) => {
                if let Some(p) = pass.take().filter(|p| p.reported_stuck) {
                    tracing::info!(after_s = p.started.elapsed().as_secs(),
                        "the stuck group offset sync pass ended; syncing again");
                }
                let now = Instant::now();
                for (group, status) in results {
                    let Some(t) = groups.get_mut(&group) else { continue };
                    if let Some(status) = t.attempted(now, status) {
                        tracing::info!(group = %group, state = status.state.reason(), message = %status.message,
                            "group offset sync state changed");
                    }
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                if let Some(p) = pass.as_mut() {
                    let silent = p.silent_for(now);
                    if silent >= STUCK_AFTER && !p.reported_stuck {
                        p.reported_stuck = true;
                        reach.refused("syncing group offsets", &format!(
                            "a request to the target has not returned for {} s; no group is synced until it does",
                            silent.as_secs()
                        ));
                    }
                    continue;
                }
                let due: Vec<DueGroup> = groups
                    .iter()
                    .filter(|(_, t)| t.is_due(now, refresh))
                    .map(|(g, t)| DueGroup {
                        group: g.clone(),
                        checkpoints: t.checkpoints.clone(),
                        uncovered: t.uncovered,
                        share: t.share,
                    })
                    .collect();
                if due.is_empty() {
                    continue;
                }
                let client = target.clone();
                let mut own = OwnTarget::new(share_target.clone(), REQUEST_TIMEOUT);
                let reach_pass = reach.clone();
                let sync = move |due: &DueGroup| {
                    if due.share {
                        share::sync_one(&mut own, &reach_pass, due)
                    } else {
                        sync_one(&client, &mut own, &reach_pass, &due.group, &due.checkpoints, due.uncovered)
                    }
                };
                match Pass::start(due, sync) {
                    Ok(p) => pass = Some(p),
                    Err(e) => reach.refused("starting a group offset sync thread", &e),
                }
            }
        }
    }
}

/// One group's sync; `None` when the target could not be asked (retried next pass).
fn sync_one(
    target: &ClientConfig,
    own: &mut OwnTarget,
    reach: &Reachability,
    group: &str,
    checkpoints: &BTreeMap<TopicPartition, i64>,
    uncovered: usize,
) -> Option<GroupSyncStatus> {
    if let Some(status) = before_target(true, checkpoints, uncovered) {
        return Some(status);
    }
    let consumer: BaseConsumer = match target
        .clone()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
    {
        Ok(c) => c,
        Err(e) => {
            reach.failed("creating a target group client", &e);
            return None;
        }
    };
    // Both group protocols: the classic description alone calls a running KIP-848 group dead;
    // and streams groups, which neither description sees.
    let own = own.get(reach, "connecting to describe a target group")?;
    let (state, members) = match crate::kafka::groups::describe_any(
        consumer.client(),
        Some(own),
        group,
        REQUEST_TIMEOUT,
    ) {
        Ok(m) => (m.state, m.members),
        Err(e) if is_unreachable(&e) => {
            reach.unreachable("describing a target group", &e);
            return None;
        }
        // Not known to be idle: asked again next pass rather than committed into.
        Err(e) => {
            reach.failed("describing a target group", &e);
            return None;
        }
    };
    let mut tpl = TopicPartitionList::new();
    for tp in checkpoints.keys() {
        tpl.add_partition(&tp.topic, tp.partition);
    }
    let committed = match consumer.committed_offsets(tpl, REQUEST_TIMEOUT) {
        Ok(list) => committed_offsets(&list),
        Err(e) => {
            reach.failed("reading a target group's offsets", &e);
            return None;
        }
    };
    reach.ok();
    let target_group = TargetGroup {
        state,
        members,
        committed,
    };
    let sync = plan(checkpoints, &target_group);
    if sync.commit.is_empty() {
        return Some(sync.status);
    }
    let offsets = match offsets_to_commit(&sync.commit) {
        Ok(offsets) => offsets,
        Err(e) => {
            tracing::warn!(group, error = %e, "cannot build the offsets to commit");
            return None;
        }
    };
    let result = consumer.commit(&offsets, CommitMode::Sync);
    if result.is_ok() {
        tracing::debug!(
            group,
            partitions = sync.commit.len(),
            "committed translated offsets into the target group"
        );
    }
    match after_commit(sync.status, result) {
        Ok(status) => Some(status),
        Err(e) => {
            reach.failed("committing into a target group", &e);
            None
        }
    }
}

/// The target group's committed offsets; a partition without one is absent (the
/// checkpoint is committed there).
fn committed_offsets(list: &TopicPartitionList) -> BTreeMap<TopicPartition, i64> {
    list.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((TopicPartition::new(e.topic(), e.partition()), o)),
            _ => None,
        })
        .collect()
}

fn offsets_to_commit(commit: &BTreeMap<TopicPartition, i64>) -> KafkaResult<TopicPartitionList> {
    let mut offsets = TopicPartitionList::new();
    for (tp, &offset) in commit {
        offsets.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(offset))?;
    }
    Ok(offsets)
}

/// The group's status after the commit the plan promised `planned` for; the error when the
/// commit failed for another reason than members (asked again next pass).
fn after_commit(
    planned: GroupSyncStatus,
    result: KafkaResult<()>,
) -> Result<GroupSyncStatus, KafkaError> {
    match result {
        Ok(()) => Ok(planned),
        Err(e) if refused_for_members(&e) => Ok(active_on_target(&format!(
            "the coordinator refused the commit: {e}"
        ))),
        Err(e) => Err(e),
    }
}

/// Commit errors that mean the group has members (a generation the commit is not part of).
fn refused_for_members(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::RebalanceInProgress
                | RDKafkaErrorCode::StaleMemberEpoch
                | RDKafkaErrorCode::FencedInstanceId
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicator::checkpoint::sync_state::{GroupSyncState, plan};

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("A.t", p)
    }

    fn idle(committed: BTreeMap<TopicPartition, i64>) -> TargetGroup {
        TargetGroup {
            state: "Empty".into(),
            members: 0,
            committed,
        }
    }

    fn synced() -> GroupSyncStatus {
        plan(&BTreeMap::from([(tp(0), 1)]), &idle(BTreeMap::new())).status
    }

    fn commit_error(code: RDKafkaErrorCode) -> KafkaError {
        KafkaError::ConsumerCommit(code)
    }

    #[test]
    fn commits_refused_because_the_group_has_members_are_told_apart() {
        for code in [
            RDKafkaErrorCode::UnknownMemberId,
            RDKafkaErrorCode::IllegalGeneration,
            RDKafkaErrorCode::RebalanceInProgress,
            RDKafkaErrorCode::StaleMemberEpoch,
            RDKafkaErrorCode::FencedInstanceId,
        ] {
            assert!(refused_for_members(&commit_error(code)), "{code:?}");
        }
        for e in [
            commit_error(RDKafkaErrorCode::CoordinatorNotAvailable),
            commit_error(RDKafkaErrorCode::GroupAuthorizationFailed),
            commit_error(RDKafkaErrorCode::RequestTimedOut),
            KafkaError::Canceled,
        ] {
            assert!(!refused_for_members(&e), "{e:?}");
        }
    }

    #[test]
    fn a_commit_refused_for_members_makes_the_group_active_on_target() {
        let status = after_commit(
            synced(),
            Err(commit_error(RDKafkaErrorCode::RebalanceInProgress)),
        )
        .expect("a refusal for members is a state, not a retry");
        assert_eq!(status.state, GroupSyncState::ActiveOnTarget);
        assert!(
            status.message.contains("refused the commit"),
            "{}",
            status.message
        );
    }

    #[test]
    fn an_accepted_commit_keeps_the_plans_status_and_any_other_failure_is_retried() {
        assert_eq!(after_commit(synced(), Ok(())), Ok(synced()));
        assert!(
            after_commit(
                synced(),
                Err(commit_error(RDKafkaErrorCode::CoordinatorNotAvailable))
            )
            .is_err()
        );
    }

    #[test]
    fn a_partition_without_a_committed_offset_on_the_target_gets_the_checkpoint() {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset("A.t", 0, Offset::Offset(9))
            .unwrap();
        list.add_partition("A.t", 1);
        let committed = committed_offsets(&list);
        assert_eq!(committed, BTreeMap::from([(tp(0), 9)]));
        let checkpoints = BTreeMap::from([(tp(0), 5), (tp(1), 7)]);
        let sync = plan(&checkpoints, &idle(committed));
        assert_eq!(
            sync.commit,
            BTreeMap::from([(tp(1), 7)]),
            "the target is past the checkpoint on partition 0"
        );
    }

    #[test]
    fn the_offsets_committed_are_the_planned_ones() {
        let planned = BTreeMap::from([(tp(0), 5), (tp(3), 0), (TopicPartition::new("A.u", 1), 70)]);
        let list = offsets_to_commit(&planned).unwrap();
        assert_eq!(committed_offsets(&list), planned);
    }

    #[test]
    fn a_new_group_is_due_then_only_when_its_view_changes_or_refresh_passes() {
        let refresh = Duration::from_secs(10);
        let t0 = Instant::now();
        let checkpoints = BTreeMap::from([(tp(0), 5)]);
        let mut t = Tracked::new();
        t.update(checkpoints.clone(), 0, false);
        assert!(t.is_due(t0, refresh));
        assert!(t.attempted(t0, Some(synced())).is_some(), "a first state");
        assert!(!t.is_due(t0 + Duration::from_secs(1), refresh));

        t.update(checkpoints.clone(), 0, false);
        assert!(
            !t.is_due(t0 + Duration::from_secs(1), refresh),
            "the same view again"
        );
        assert!(t.is_due(t0 + refresh, refresh), "refreshed");

        t.update(checkpoints.clone(), 1, false);
        assert!(
            t.is_due(t0 + Duration::from_secs(1), refresh),
            "coverage changed"
        );
        assert!(t.attempted(t0, Some(synced())).is_none(), "same state");
        t.update(BTreeMap::from([(tp(0), 6)]), 1, false);
        assert!(
            t.is_due(t0 + Duration::from_secs(1), refresh),
            "a new checkpoint"
        );
    }

    #[test]
    fn a_sync_the_target_did_not_answer_is_retried_at_the_next_pass() {
        let refresh = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut t = Tracked::new();
        t.update(BTreeMap::from([(tp(0), 5)]), 0, false);
        assert!(t.attempted(t0, None).is_none());
        assert!(
            t.is_due(t0 + Duration::from_millis(500), refresh),
            "not only after groupsRefreshInterval"
        );
        assert!(t.attempted(t0, Some(synced())).is_some());
        assert!(!t.is_due(t0 + Duration::from_millis(500), refresh));
    }

    #[tokio::test]
    async fn a_pass_that_hangs_grows_silent_and_its_results_still_arrive() {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let wait = std::sync::Mutex::new(wait);
        let (entered, hanging) = std::sync::mpsc::channel::<()>();
        let due = ["quick", "hangs"].map(|group| DueGroup {
            group: group.into(),
            checkpoints: BTreeMap::from([(tp(0), 1)]),
            uncovered: 0,
            share: false,
        });
        let mut pass = Some(
            Pass::start(due.into(), move |due| {
                if due.group == "hangs" {
                    let _ = entered.send(());
                    // Stands in for a commit librdkafka never answers, until released.
                    let _ = wait.lock().map(|w| w.recv());
                }
                Some(synced())
            })
            .unwrap(),
        );
        hanging.recv_timeout(Duration::from_secs(5)).unwrap();
        let p = pass.as_ref().unwrap();
        assert!(p.silent_for(Instant::now()) < STUCK_AFTER);
        assert!(p.silent_for(Instant::now() + STUCK_AFTER) >= STUCK_AFTER);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), finished(&mut pass))
                .await
                .is_err(),
            "no results while a group hangs"
        );
        release.send(()).unwrap();
        let results = tokio::time::timeout(Duration::from_secs(5), finished(&mut pass))
            .await
            .expect("the results once it returns");
        let groups: Vec<&str> = results.iter().map(|(g, _)| g.as_str()).collect();
        assert_eq!(groups, ["quick", "hangs"]);
    }

    #[tokio::test]
    async fn without_a_pass_nothing_is_finished() {
        let mut none = None;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), finished(&mut none))
                .await
                .is_err()
        );
    }

    #[test]
    fn a_status_change_is_reported_once() {
        let t0 = Instant::now();
        let mut t = Tracked::new();
        let active = active_on_target("1 member(s), state Stable");
        assert_eq!(t.attempted(t0, Some(active.clone())), Some(&active));
        assert_eq!(t.attempted(t0, Some(active.clone())), None);
        assert_eq!(t.attempted(t0, None), None, "unanswered: no state");
        assert_eq!(t.status.as_ref(), Some(&active), "the last answer stays");
        assert_eq!(t.attempted(t0, Some(synced())), Some(&synced()));
    }
}
