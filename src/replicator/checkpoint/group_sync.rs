//! Optional group offset sync: commits each group's latest checkpoints into the same group on
//! the target, under [`super::sync_state::plan`]'s rules (idle groups only, never backwards).
//!
//! Runs beside the checkpoint loop so slow target requests never delay checkpoints. Each pass
//! handles the groups whose checkpoints changed, and every group again after
//! `groupsRefreshInterval` (a group that was active may have become idle). rdkafka has no
//! safe AlterConsumerGroupOffsets, so the commit goes through a short-lived consumer whose
//! `group.id` is that group and which never joins it: the coordinator accepts such a commit
//! only while the group has no members, which backs up the state check.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::support::{Reachability, is_unreachable};
use super::sync_state::{GroupSyncStatus, TargetGroup, active_on_target, before_target, plan};
use crate::mm2::TopicPartition;

/// The checkpoint loop's view of one group, sent whenever it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupView {
    Update {
        group: String,
        /// Latest checkpoint per target partition.
        checkpoints: BTreeMap<TopicPartition, i64>,
        /// Committed source partitions without a translation.
        uncovered: usize,
    },
    /// The group left this replica or has no commits any more.
    Forget(String),
}

struct Tracked {
    checkpoints: BTreeMap<TopicPartition, i64>,
    uncovered: usize,
    due: bool,
    last_attempt: Option<Instant>,
    status: Option<GroupSyncStatus>,
}

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn run(
    target: ClientConfig,
    interval: Duration,
    refresh: Duration,
    reach: Arc<Reachability>,
    mut rx: mpsc::Receiver<GroupView>,
    shutdown: CancellationToken,
) {
    let mut groups: HashMap<String, Tracked> = HashMap::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            view = rx.recv() => match view {
                None => return,
                Some(GroupView::Update { group, checkpoints, uncovered }) => {
                    let entry = groups.entry(group).or_insert_with(|| Tracked {
                        checkpoints: BTreeMap::new(),
                        uncovered: 0,
                        due: true,
                        last_attempt: None,
                        status: None,
                    });
                    entry.due |= entry.checkpoints != checkpoints || entry.uncovered != uncovered;
                    entry.checkpoints = checkpoints;
                    entry.uncovered = uncovered;
                }
                Some(GroupView::Forget(group)) => {
                    groups.remove(&group);
                }
            },
            _ = tick.tick() => {
                let due: Vec<(String, BTreeMap<TopicPartition, i64>, usize)> = groups
                    .iter()
                    .filter(|(_, t)| t.due || t.last_attempt.is_none_or(|a| a.elapsed() >= refresh))
                    .map(|(g, t)| (g.clone(), t.checkpoints.clone(), t.uncovered))
                    .collect();
                if due.is_empty() {
                    continue;
                }
                let client = target.clone();
                let reach = reach.clone();
                let results = tokio::task::spawn_blocking(move || {
                    due.into_iter()
                        .map(|(group, checkpoints, uncovered)| {
                            let status = sync_one(&client, &reach, &group, &checkpoints, uncovered);
                            (group, status)
                        })
                        .collect::<Vec<_>>()
                })
                .await
                .unwrap_or_default();
                for (group, status) in results {
                    let Some(t) = groups.get_mut(&group) else { continue };
                    t.due = false;
                    t.last_attempt = Some(Instant::now());
                    let Some(status) = status else { continue };
                    if t.status.as_ref().map(|s| s.state) != Some(status.state) {
                        tracing::info!(group = %group, state = status.state.reason(), message = %status.message,
                            "group offset sync state changed");
                    }
                    t.status = Some(status);
                }
            }
        }
    }
}

/// One group's sync; `None` when the target could not be asked (retried next pass).
fn sync_one(
    target: &ClientConfig,
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
    // Both group protocols: the classic description alone calls a running KIP-848 group dead.
    let (state, members) =
        match crate::kafka::groups::describe(consumer.client(), group, REQUEST_TIMEOUT) {
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
        Ok(list) => list
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((TopicPartition::new(e.topic(), e.partition()), o)),
                _ => None,
            })
            .collect(),
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
    let mut offsets = TopicPartitionList::new();
    for (tp, &offset) in &sync.commit {
        if let Err(e) =
            offsets.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(offset))
        {
            tracing::warn!(group, error = %e, "cannot build the offsets to commit");
            return None;
        }
    }
    match consumer.commit(&offsets, CommitMode::Sync) {
        Ok(()) => {
            tracing::debug!(
                group,
                partitions = sync.commit.len(),
                "committed translated offsets into the target group"
            );
            Some(sync.status)
        }
        Err(e) if refused_for_members(&e) => Some(active_on_target(&format!(
            "the coordinator refused the commit: {e}"
        ))),
        Err(e) => {
            reach.failed("committing into a target group", &e);
            None
        }
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
