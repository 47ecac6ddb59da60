//! Whether a source group's translated offsets were committed into the same group on the
//! target, and if not why: a value the operator can show next to the group.
//!
//! Pure and free of replicator types on purpose (only `mm2::TopicPartition`), so the operator's
//! status code can reuse it; it may move down to `mm2` once the operator needs it.

use std::collections::BTreeMap;

use crate::mm2::TopicPartition;

/// The group offset sync state of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupSyncState {
    /// The target group's offsets are at the latest checkpoints.
    Synced,
    /// The target group has active members: its offsets are theirs, never overwritten.
    ActiveOnTarget,
    /// The group has commits, but no checkpoint was written yet (loading).
    NoCheckpointYet,
    /// The group's committed offsets are not covered by any offset sync (nothing mirrored
    /// yet, or the commits predate the retained syncs).
    NoOffsetSyncCovers,
    /// The target group is already past every checkpoint: never moved backwards.
    TargetAhead,
    /// `spec.checkpoints.syncGroupOffsets` is off.
    Disabled,
}

impl GroupSyncState {
    /// A CamelCase reason, as Kubernetes conditions spell them.
    pub fn reason(self) -> &'static str {
        match self {
            GroupSyncState::Synced => "Synced",
            GroupSyncState::ActiveOnTarget => "ActiveOnTarget",
            GroupSyncState::NoCheckpointYet => "NoCheckpointYet",
            GroupSyncState::NoOffsetSyncCovers => "NoOffsetSyncCovers",
            GroupSyncState::TargetAhead => "TargetAhead",
            GroupSyncState::Disabled => "Disabled",
        }
    }
}

/// A state and a sentence for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSyncStatus {
    pub state: GroupSyncState,
    pub message: String,
}

impl GroupSyncStatus {
    fn new(state: GroupSyncState, message: impl Into<String>) -> Self {
        GroupSyncStatus {
            state,
            message: message.into(),
        }
    }
}

/// The state decided before looking at the target group, if there is nothing to commit.
///
/// `checkpoints`: the group's latest checkpoint per target partition; `uncovered`: how many
/// of its committed source partitions have no translation.
pub fn before_target(
    enabled: bool,
    checkpoints: &BTreeMap<TopicPartition, i64>,
    uncovered: usize,
) -> Option<GroupSyncStatus> {
    if !enabled {
        return Some(GroupSyncStatus::new(
            GroupSyncState::Disabled,
            "spec.checkpoints.syncGroupOffsets is false",
        ));
    }
    if !checkpoints.is_empty() {
        return None;
    }
    Some(if uncovered > 0 {
        GroupSyncStatus::new(
            GroupSyncState::NoOffsetSyncCovers,
            format!(
                "no offset sync covers the committed offsets of {uncovered} partition(s): nothing of them was mirrored yet, or the commits are older than every retained sync"
            ),
        )
    } else {
        GroupSyncStatus::new(
            GroupSyncState::NoCheckpointYet,
            "no checkpoint written for the group yet",
        )
    })
}

/// What the target says about the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetGroup {
    /// The coordinator's group state (`Empty`, `Stable`, `Dead`, ...; "" when unknown).
    pub state: String,
    pub members: usize,
    /// Committed offsets on the target, by target partition.
    pub committed: BTreeMap<TopicPartition, i64>,
}

impl TargetGroup {
    /// Empty, dead or absent groups (no members) may be written; anything else has consumers.
    pub fn is_idle(&self) -> bool {
        self.members == 0 && matches!(self.state.as_str(), "Empty" | "Dead" | "")
    }
}

/// The offsets to commit into the target group and the resulting state if that succeeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncPlan {
    pub commit: BTreeMap<TopicPartition, i64>,
    pub status: GroupSyncStatus,
}

/// MM2's rule: write only into idle groups, never move an offset backwards.
pub fn plan(checkpoints: &BTreeMap<TopicPartition, i64>, target: &TargetGroup) -> SyncPlan {
    if !target.is_idle() {
        return SyncPlan {
            commit: BTreeMap::new(),
            status: active_on_target(&format!(
                "{} member(s), state {}",
                target.members, target.state
            )),
        };
    }
    let mut commit = BTreeMap::new();
    let mut ahead = 0usize;
    for (tp, &downstream) in checkpoints {
        match target.committed.get(tp) {
            Some(&current) if current > downstream => ahead += 1,
            Some(&current) if current == downstream => {}
            _ => {
                commit.insert(tp.clone(), downstream);
            }
        }
    }
    let status = if commit.is_empty() && ahead > 0 {
        GroupSyncStatus::new(
            GroupSyncState::TargetAhead,
            format!(
                "the target group is past the checkpoint on {ahead} partition(s); offsets are never moved backwards"
            ),
        )
    } else if ahead > 0 {
        GroupSyncStatus::new(
            GroupSyncState::Synced,
            format!(
                "{} partition(s) at the checkpoint, {ahead} already past it",
                checkpoints.len() - ahead
            ),
        )
    } else {
        GroupSyncStatus::new(
            GroupSyncState::Synced,
            format!(
                "{} partition(s) at the latest checkpoint",
                checkpoints.len()
            ),
        )
    };
    SyncPlan { commit, status }
}

/// The state when the target refused a commit because the group has members, or when its
/// description says so.
pub fn active_on_target(detail: &str) -> GroupSyncStatus {
    GroupSyncStatus::new(
        GroupSyncState::ActiveOnTarget,
        format!(
            "the target group is in use ({detail}); its offsets belong to its consumers and are left untouched"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("A.t", p)
    }

    fn target(state: &str, members: usize, committed: &[(i32, i64)]) -> TargetGroup {
        TargetGroup {
            state: state.into(),
            members,
            committed: committed.iter().map(|&(p, o)| (tp(p), o)).collect(),
        }
    }

    #[test]
    fn reasons_are_camel_case_names() {
        for (s, r) in [
            (GroupSyncState::Synced, "Synced"),
            (GroupSyncState::ActiveOnTarget, "ActiveOnTarget"),
            (GroupSyncState::NoCheckpointYet, "NoCheckpointYet"),
            (GroupSyncState::NoOffsetSyncCovers, "NoOffsetSyncCovers"),
            (GroupSyncState::TargetAhead, "TargetAhead"),
            (GroupSyncState::Disabled, "Disabled"),
        ] {
            assert_eq!(s.reason(), r);
            assert_eq!(format!("{s:?}"), r);
        }
    }

    #[test]
    fn nothing_to_write_is_explained_before_asking_the_target() {
        let none = BTreeMap::new();
        let some = BTreeMap::from([(tp(0), 5)]);
        assert_eq!(
            before_target(false, &some, 0).map(|s| s.state),
            Some(GroupSyncState::Disabled)
        );
        assert_eq!(
            before_target(true, &none, 2).map(|s| s.state),
            Some(GroupSyncState::NoOffsetSyncCovers)
        );
        assert_eq!(
            before_target(true, &none, 0).map(|s| s.state),
            Some(GroupSyncState::NoCheckpointYet)
        );
        assert_eq!(before_target(true, &some, 1), None);
    }

    #[test]
    fn active_groups_are_never_written() {
        let cps = BTreeMap::from([(tp(0), 5)]);
        for t in [
            target("Stable", 1, &[]),
            target("PreparingRebalance", 0, &[]),
            target("Empty", 2, &[]),
        ] {
            let p = plan(&cps, &t);
            assert!(p.commit.is_empty(), "{t:?}");
            assert_eq!(p.status.state, GroupSyncState::ActiveOnTarget);
        }
    }

    #[test]
    fn idle_groups_move_forward_only() {
        let cps = BTreeMap::from([(tp(0), 5), (tp(1), 10), (tp(2), 7)]);
        let p = plan(&cps, &target("Empty", 0, &[(0, 3), (1, 12), (2, 7)]));
        assert_eq!(p.commit, BTreeMap::from([(tp(0), 5)]));
        assert_eq!(p.status.state, GroupSyncState::Synced);
        assert!(
            p.status.message.contains("1 already past"),
            "{}",
            p.status.message
        );

        let absent = plan(&cps, &target("Dead", 0, &[]));
        assert_eq!(absent.commit, cps);

        let ahead = plan(&cps, &target("", 0, &[(0, 6), (1, 10), (2, 8)]));
        assert!(ahead.commit.is_empty());
        assert_eq!(ahead.status.state, GroupSyncState::TargetAhead);

        let equal = plan(&cps, &target("Empty", 0, &[(0, 5), (1, 10), (2, 7)]));
        assert!(equal.commit.is_empty());
        assert_eq!(equal.status.state, GroupSyncState::Synced);
    }
}
