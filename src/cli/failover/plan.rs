//! One group's failover plan: its positions on both clusters read once, then each
//! checkpointed partition decided on its own.

use std::collections::{BTreeMap, HashMap, HashSet};

use rdkafka::consumer::Consumer;

use super::{Estimate, PartitionPlan, SourceView, decide_partition, estimate};
use crate::cli::CliError;
use crate::cli::aligned::as_is;
use crate::cli::apply::{Overrides, PartitionAction, membership_or_refuse};
use crate::cli::clusters::{self, Membership, Partition};
use crate::cli::share_groups;
use crate::cli::stale::stale_checkpoint;
use crate::flow::Flow;
use crate::kafka::checkpoints::StoredCheckpoint;
use crate::mm2::{TopicPartition, Translation};

/// What every group's plan reads once.
pub(super) struct Planner<'a> {
    pub flow: &'a Flow,
    /// The source's offset syncs, when the source could be read.
    pub source: Option<&'a SourceView>,
    /// Landing as they are: the partitions whose offsets are not aligned.
    pub misaligned: Option<&'a HashSet<Partition>>,
    pub target: &'a rdkafka::consumer::BaseConsumer,
    /// Both clusters, for the groups' positions (connections kept across groups).
    pub sides: [&'a share_groups::Side<'a>; 2],
    pub rewinds: HashMap<Partition, i64>,
    pub overrides: Overrides,
    pub now: i64,
}

/// A group's positions on both clusters and its members on the target.
pub(super) struct Positions {
    target: BTreeMap<Partition, i64>,
    /// None when the source could not be read.
    source: Option<BTreeMap<Partition, i64>>,
    pub membership: Option<Membership>,
}

impl Planner<'_> {
    fn upstream(&self, topic: &str) -> String {
        (self.flow.policy.upstream_topic(topic))
            .unwrap_or(topic)
            .to_string()
    }

    /// Commits, or a share group's start offsets, on the checkpointed partitions of both
    /// clusters, and who is in the group on the target.
    pub fn positions(
        &self,
        group: &str,
        cps: &BTreeMap<TopicPartition, StoredCheckpoint>,
        share: bool,
    ) -> Result<Positions, CliError> {
        let target_parts: Vec<Partition> = (cps.keys())
            .map(|tp| (tp.topic.clone(), tp.partition))
            .collect();
        let source_parts: Vec<Partition> = (cps.keys())
            .map(|tp| (self.upstream(&tp.topic), tp.partition))
            .collect();
        let [target_side, source_side] = self.sides;
        let target = target_side.positions(group, &target_parts, share)?;
        // A share group's coordinator refuses a change while members are active: that is the
        // membership check, made with the change.
        let membership = match share {
            true => None,
            false => {
                membership_or_refuse(clusters::membership(target_side, group), self.overrides)?
            }
        };
        let source = match self.source {
            Some(_) => Some(source_side.positions(group, &source_parts, share)?),
            None => None,
        };
        Ok(Positions {
            target,
            source,
            membership,
        })
    }

    /// One checkpointed partition: where it lands and whether that may be written.
    pub fn partition(
        &self,
        tp: &TopicPartition,
        stored: &StoredCheckpoint,
        positions: &Positions,
    ) -> PartitionPlan {
        let cp = &stored.checkpoint;
        let upstream_topic = self.upstream(&tp.topic);
        let up_part = (upstream_topic.clone(), tp.partition);
        let up_tp = TopicPartition::new(upstream_topic.clone(), tp.partition);
        let sc = (positions.source.as_ref()).and_then(|c| c.get(&up_part).copied());
        let est = match (self.source, &positions.source) {
            (Some(view), Some(_)) => estimate(
                (cp.upstream_offset, cp.downstream_offset),
                sc,
                sc.map_or(
                    Translation::Unknown(crate::mm2::UnknownReason::NegativeOffset),
                    |c| view.syncs.translate(&up_tp, c),
                ),
                view.syncs.translate(&up_tp, cp.upstream_offset),
            ),
            _ => Estimate {
                reread: None,
                skips: None,
                note: None,
            },
        };
        let tc = (positions.target)
            .get(&(tp.topic.clone(), tp.partition))
            .copied();
        let (offset, est, refusal) = match self.misaligned {
            None => (cp.downstream_offset, est, None),
            Some(broken) => as_is(sc, broken.contains(&up_part)),
        };
        let refusal = refusal.or_else(|| {
            if self.misaligned.is_some() {
                return None;
            }
            let end = (self.target)
                .fetch_watermarks(&tp.topic, tp.partition, clusters::TIMEOUT)
                .ok()
                .map(|(_, high)| high);
            let rewound = self.rewinds.get(&up_part).copied();
            stale_checkpoint(offset, stored.written_ms, end, rewound)
        });
        let (action, reason) = match refusal {
            Some(why) => (PartitionAction::Refused, Some(why)),
            None => decide_partition(offset, tc, est.skips, self.overrides),
        };
        PartitionPlan {
            topic: tp.topic.clone(),
            partition: tp.partition,
            offset,
            upstream_topic,
            upstream_offset: cp.upstream_offset,
            metadata: cp.metadata.clone(),
            checkpoint_age_ms: stored.written_ms.map(|w| (self.now - w).max(0)),
            source_committed: sc,
            target_committed: tc,
            reread: est.reread,
            skips: est.skips,
            note: est.note,
            action,
            reason,
        }
    }
}
