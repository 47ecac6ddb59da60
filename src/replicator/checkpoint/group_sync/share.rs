//! A share group's sync: its start offsets on the target set to its latest checkpoints
//! (AlterShareGroupOffsets on the project's own connections), by the same rules as a consumer
//! group's commit (never backwards, never into a group in use). The coordinator refuses while
//! the group has members (NON_EMPTY_GROUP): that refusal is the member check, atomic with the
//! change, so no description is read first. On the pass's own connection ([`OwnTarget`]).

use super::super::sync_state::{
    GroupSyncStatus, TargetGroup, active_on_target, before_target, plan,
};
use super::pass::{DueGroup, OwnTarget};
use crate::mm2::TopicPartition;
use crate::replicator::kafka_io::Reachability;

/// `None` when the target could not be asked (retried next pass).
pub(super) fn sync_one(
    own: &mut OwnTarget,
    reach: &Reachability,
    due: &DueGroup,
) -> Option<GroupSyncStatus> {
    if let Some(status) = before_target(true, &due.checkpoints, due.uncovered) {
        return Some(status);
    }
    let cluster = own.get(reach, "connecting for a target share group")?;
    let group = due.group.as_str();
    let committed = match cluster.share_group_offsets(group) {
        // A group not there yet has none: setting its start offsets makes it.
        Ok(answer) => match answer.starts() {
            Ok(starts) => (starts.into_iter())
                .map(|(topic, partition, start)| (TopicPartition::new(topic, partition), start))
                .collect(),
            Err(refused) => {
                reach.refused(
                    "reading a target share group's start offsets",
                    &refused.error,
                );
                return None;
            }
        },
        Err(e) => {
            reach.refused("reading a target share group's start offsets", &e);
            return None;
        }
    };
    reach.ok();
    let sync = plan(
        &due.checkpoints,
        &TargetGroup {
            // Members are the coordinator's to check, with the change itself.
            state: String::new(),
            members: 0,
            committed,
        },
    );
    if sync.commit.is_empty() {
        return Some(sync.status);
    }
    let starts: Vec<(&str, i32, i64)> = (sync.commit.iter())
        .map(|(tp, &offset)| (tp.topic.as_str(), tp.partition, offset))
        .collect();
    let answer = match cluster.alter_share_group_offsets(group, &starts) {
        Ok(answer) => answer,
        Err(e) => {
            reach.refused("setting a target share group's start offsets", &e);
            return None;
        }
    };
    if answer.error.name() == "NON_EMPTY_GROUP" {
        return Some(active_on_target(
            "the share coordinator refused: the group has members",
        ));
    }
    let refused = std::iter::once(answer.error)
        .chain(answer.partitions.iter().map(|p| p.error))
        .find(|e| e.is_error());
    if let Some(error) = refused {
        reach.refused("setting a target share group's start offsets", &error);
        return None;
    }
    tracing::debug!(
        group,
        partitions = starts.len(),
        "set translated start offsets on the target share group"
    );
    Some(sync.status)
}
