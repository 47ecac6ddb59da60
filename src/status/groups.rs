//! Per-group failover readiness: a [`GroupState`] per consumer group, worst first.

use std::time::Duration;

use super::{GroupObservation, Observation, reason, secs};
use crate::api::{FailoverReadinessSpec, GroupReadiness};

/// A group's checkpoints that cover its commits only conservatively: no offset sync of the copy
/// reached the commit when they were translated, so they point at the record after the newest
/// one known to be copied, and a failover to them re-reads what lies between.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conservative {
    pub partitions: u32,
    /// The most records a failover to them may re-read, over those partitions.
    pub max_replay: i64,
    /// How long ago the least recently exact of them had an exact checkpoint; `None` when one
    /// never had one the probe read (a new group or flow, or compacted away).
    pub exact_age: Option<Duration>,
}

/// Where a group stands for a failover now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GroupState {
    /// A verification of its checkpoint on the records found that a failover to it would not
    /// resume on the record it reads next ([`super::verified`]).
    RecordsMismatch,
    /// A checkpoint of it points into a remote partition that was recreated since: a failover
    /// now would skip the new log's records up to it.
    CheckpointInvalidated,
    /// It committed past what is copied, so no checkpoint can cover it yet.
    ReplicationBehind,
    /// A share group whose start offsets the source did not give: neither checkpointed nor
    /// judged, and a failover starts it where `share.auto.offset.reset` says.
    NotMirrored,
    /// Committed offsets on the source, no checkpoint on the target.
    NoCheckpoint,
    /// Its checkpoint is older than `failoverReadiness.maxCheckpointAge`.
    CheckpointStale,
    /// A checkpoint at its commit is a conservative translation (its writer said so): a
    /// failover now would re-read records the group processed.
    CheckpointConservative,
    Ready,
}

impl GroupState {
    /// The `reason` of its `leastReadyGroups` row.
    pub fn reason(self) -> &'static str {
        match self {
            GroupState::RecordsMismatch => "RecordsMismatch",
            GroupState::CheckpointInvalidated => "CheckpointInvalidated",
            GroupState::ReplicationBehind => reason::REPLICATION_BEHIND,
            GroupState::NotMirrored => "ShareGroupNotMirrored",
            GroupState::NoCheckpoint => "NoCheckpoint",
            GroupState::CheckpointStale => "CheckpointStale",
            GroupState::CheckpointConservative => "CheckpointConservative",
            GroupState::Ready => "Ready",
        }
    }

    /// The `CheckpointsFresh` reason when this is the worst group.
    pub fn condition_reason(self) -> &'static str {
        match self {
            GroupState::RecordsMismatch => reason::RECORDS_MISMATCH,
            GroupState::CheckpointInvalidated => reason::CHECKPOINTS_INVALIDATED,
            GroupState::ReplicationBehind => reason::REPLICATION_BEHIND,
            GroupState::NotMirrored => reason::GROUPS_NOT_MIRRORED,
            GroupState::NoCheckpoint => reason::NO_CHECKPOINTS,
            GroupState::CheckpointConservative => reason::CHECKPOINTS_CONSERVATIVE,
            GroupState::CheckpointStale | GroupState::Ready => reason::CHECKPOINTS_STALE,
        }
    }
}

/// Per-group readiness with its state, worst first: groups whose checkpoint a verification on
/// the records found wrong, and those whose checkpoints point into a recreated remote log (a
/// failover would skip records), then share groups and groups without any checkpoint,
/// then stale ones (oldest first) and those whose checkpoint at the commit is conservative, then
/// ready ones; ties by records a failover would re-read, then name.
pub fn states(
    obs: &Observation,
    limits: &FailoverReadinessSpec,
) -> Vec<(GroupState, GroupReadiness)> {
    let mut rows: Vec<(u8, Duration, GroupState, GroupReadiness)> = obs
        .groups
        .iter()
        .map(|g| {
            let (rank, state, message) = judge(g, limits);
            let age = g.checkpoint_age.unwrap_or(Duration::MAX);
            let message = match g.kind {
                Some(kind) => format!("a {kind} group: {message}"),
                None => message,
            };
            let row = GroupReadiness {
                group: g.group.clone(),
                checkpoint_age: g.checkpoint_age.map(secs).unwrap_or_else(|| "never".into()),
                estimated_replay_records: g.replay_records.max(0),
                reason: state.reason().into(),
                message,
                last_verified: g.verified.newest_age.map(secs),
                verified_partitions: (g.verified.verified > 0)
                    .then(|| format!("{}/{}", g.verified.verified, g.verified.checkpointed)),
            };
            (rank, age, state, row)
        })
        .collect();
    rows.extend(obs.share_groups.iter().map(|(group, why)| {
        let row = GroupReadiness {
            group: group.clone(),
            checkpoint_age: "never".into(),
            estimated_replay_records: 0,
            reason: GroupState::NotMirrored.reason().into(),
            message: format!("{SHARE_GROUP_UNREAD}{why}{SHARE_GROUP_FIX}"),
            last_verified: None,
            verified_partitions: None,
        };
        (1, Duration::MAX, GroupState::NotMirrored, row)
    }));
    rows.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(b.1.cmp(&a.1))
            .then(
                b.3.estimated_replay_records
                    .cmp(&a.3.estimated_replay_records),
            )
            .then(a.3.group.cmp(&b.3.group))
    });
    rows.into_iter().map(|(_, _, s, r)| (s, r)).collect()
}

/// One group's state, its rank in the list (0 worst) and the sentence that says why.
fn judge(g: &GroupObservation, limits: &FailoverReadinessSpec) -> (u8, GroupState, String) {
    let max_age = limits.max_checkpoint_age.as_duration();
    let behind = |age: &str| {
        format!(
            "the group committed {} records the replicator has not copied to the target yet, so no checkpoint can cover them (checkpoint age {age}): see Replicating and status.replicationLag",
            g.uncopied_records
        )
    };
    match g.checkpoint_age {
        _ if g.verified.mismatches > 0 => (
            0,
            GroupState::RecordsMismatch,
            g.verified.mismatch_message(),
        ),
        _ if g.invalidated_checkpoints > 0 => (
            0,
            GroupState::CheckpointInvalidated,
            format!(
                "the checkpoints of {} partition(s) were written before their remote partition was recreated (see status.gaps, TargetTopicRecreated): they point into a log that is gone, and a failover now would skip records; do not fail over this group until a checkpoint written after the recreation covers it (the checkpoint loop writes one from the new log as soon as its first offset sync is in)",
                g.invalidated_checkpoints
            ),
        ),
        None if g.uncopied_records > 0 => {
            (1, GroupState::ReplicationBehind, behind("never"))
        }
        Some(age) if age > max_age && g.uncopied_records > 0 => {
            (2, GroupState::ReplicationBehind, behind(&secs(age)))
        }
        None => (
            1,
            GroupState::NoCheckpoint,
            "the group has committed offsets on the source but no checkpoint on the target: its topics may not be mirrored yet, or no offset sync covers its position".to_string(),
        ),
        Some(age) if age > max_age => (
            2,
            GroupState::CheckpointStale,
            format!(
                "newest checkpoint is {} old (limit {}): check the replicator's checkpoint loop",
                secs(age),
                limits.max_checkpoint_age
            ),
        ),
        // Conservative at the commit, and not exact within the limit (or never): as
        // stale as a checkpoint that stopped following the commits. A group exact a
        // moment ago is only between a commit and the sync that covers it.
        Some(_)
            if g.conservative.partitions > 0
                && g.conservative.exact_age.is_none_or(|a| a > max_age) =>
        {
            (
                2,
                GroupState::CheckpointConservative,
                format!(
                    "the checkpoint of {} partition(s) is conservative ({}): no offset sync of the copy reached the commit when it was translated, so a failover now would re-read up to {} records the group already processed; the checkpoint loop writes an exact one as soon as the copy's next offset sync covers the commit (within spec.sourceLoop.offsetSyncInterval of the copy reaching it; offset syncs another tool writes may never cover it)",
                    g.conservative.partitions,
                    match g.conservative.exact_age {
                        Some(a) => format!("last exact {} ago", secs(a)),
                        None => "never exact yet".to_string(),
                    },
                    g.conservative.max_replay
                ),
            )
        }
        Some(_) if g.conservative.partitions > 0 => (
            3,
            GroupState::Ready,
            format!(
                "the group can fail over, re-reading up to {} records on {} partition(s) whose checkpoint is conservative until the copy's next offset sync covers the commit{}",
                g.conservative.max_replay,
                g.conservative.partitions,
                g.verified.evidence()
            ),
        ),
        Some(_) => (
            3,
            GroupState::Ready,
            format!("the group can fail over{}", g.verified.evidence()),
        ),
    }
}

/// Why a share group cannot be judged (then its reason, then [`SHARE_GROUP_FIX`]).
const SHARE_GROUP_UNREAD: &str = "a share group (KIP-932) whose start offsets (where its consumers are, kept by the share coordinator instead of committed offsets) the source did not give the flow's principal: ";
const SHARE_GROUP_FIX: &str = "; it can be neither checkpointed nor judged, and after a failover its consumers start on the target where share.auto.offset.reset says (latest by default), skipping what was not acknowledged on the source; grant the flow's principal DESCRIBE on the group and on its topics (Kafka 4.1 or later answers DescribeShareGroupOffsets), or leave the group out with spec.groupsExclude";

/// Per-group readiness, worst first (see [`states`]).
pub fn group_readiness(obs: &Observation, limits: &FailoverReadinessSpec) -> Vec<GroupReadiness> {
    states(obs, limits).into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::GroupObservation;

    fn group(name: &str, age: Option<u64>, uncopied: i64) -> GroupObservation {
        invalidated(name, age, uncopied, 0)
    }

    fn invalidated(
        name: &str,
        age: Option<u64>,
        uncopied: i64,
        partitions: u32,
    ) -> GroupObservation {
        GroupObservation {
            group: name.into(),
            checkpoint_age: age.map(Duration::from_secs),
            replay_records: 0,
            uncopied_records: uncopied,
            invalidated_checkpoints: partitions,
            conservative: Conservative::default(),
            verified: Default::default(),
            kind: None,
        }
    }

    #[test]
    fn each_group_gets_its_state_worst_first() {
        let obs = Observation {
            groups: vec![
                group("fresh", Some(1), 0),
                group("stale", Some(3600), 0),
                group("never", None, 0),
                group("behind", Some(3600), 5),
                invalidated("recreated", Some(0), 0, 2),
            ],
            ..Observation::default()
        };
        let got: Vec<(GroupState, String)> = states(&obs, &FailoverReadinessSpec::default())
            .into_iter()
            .map(|(s, r)| (s, r.group))
            .collect();
        assert_eq!(
            got,
            [
                (GroupState::CheckpointInvalidated, "recreated".to_string()),
                (GroupState::NoCheckpoint, "never".to_string()),
                (GroupState::ReplicationBehind, "behind".to_string()),
                (GroupState::CheckpointStale, "stale".to_string()),
                (GroupState::Ready, "fresh".to_string()),
            ]
        );
        assert_eq!(
            GroupState::NoCheckpoint.condition_reason(),
            reason::NO_CHECKPOINTS
        );
    }

    /// A healthy flow whose one group `g` is in `conservative` at its commit, as the probe saw
    /// it (replay includes the conservative records).
    fn one_group(conservative: Conservative) -> Observation {
        Observation {
            desired_replicas: 1,
            ready_replicas: 1,
            heartbeats_enabled: true,
            checkpoints_enabled: true,
            heartbeat_age: Some(Duration::from_secs(2)),
            topics: Some(2),
            replication_lag: Some(0),
            groups: vec![GroupObservation {
                group: "g".into(),
                checkpoint_age: Some(Duration::ZERO),
                replay_records: conservative.max_replay,
                uncopied_records: 0,
                invalidated_checkpoints: 0,
                conservative,
                verified: Default::default(),
                kind: None,
            }],
            ..Observation::default()
        }
    }

    fn by_59(exact_age: Option<u64>) -> Conservative {
        Conservative {
            partitions: 1,
            max_replay: 59,
            exact_age: exact_age.map(Duration::from_secs),
        }
    }

    #[test]
    fn a_conservative_checkpoint_at_the_commit_holds_failover_back_until_it_is_exact() {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("a time"),
        );
        let limits = FailoverReadinessSpec::default();
        let condition = |s: &crate::api::MirrorFlowStatus, t: &str| {
            s.conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
                .expect("the condition is reported")
        };
        // Never exact (a new flow, a commit the copy has not synced yet): the runbook's case.
        let held = crate::status::status(None, &one_group(by_59(None)), &limits, None, &now);
        let row = &held.least_ready_groups[0];
        assert_eq!(
            (row.reason.as_str(), row.estimated_replay_records),
            ("CheckpointConservative", 59)
        );
        assert!(
            row.message.contains("re-read up to 59 records")
                && row.message.contains("1 partition")
                && row.message.contains("never exact"),
            "{}",
            row.message
        );
        let (status, why, message) = condition(&held, crate::status::FAILOVER_READY);
        assert_eq!(
            (status.as_str(), why.as_str()),
            ("False", reason::CHECKPOINTS_CONSERVATIVE)
        );
        assert!(message.contains("re-read up to 59 records"), "{message}");
        assert_eq!(
            condition(&held, crate::status::CHECKPOINTS_FRESH).0,
            "False"
        );

        let exact = crate::status::status(
            Some(&held),
            &one_group(Conservative::default()),
            &limits,
            None,
            &now,
        );
        let row = &exact.least_ready_groups[0];
        assert_eq!(
            (row.reason.as_str(), row.estimated_replay_records),
            ("Ready", 0)
        );
        assert_eq!(
            condition(&exact, crate::status::FAILOVER_READY).0,
            "True",
            "the exact checkpoint that replaces it makes the group ready"
        );
    }

    #[test]
    fn a_group_exact_within_the_checkpoint_age_limit_is_ready_and_says_what_it_would_re_read() {
        let limits = FailoverReadinessSpec::default();
        let max_age = limits.max_checkpoint_age.as_duration().as_secs();
        // (when the conservative partition was last exact) -> state
        let cases = [
            (None, GroupState::CheckpointConservative),
            (Some(0), GroupState::Ready),
            (Some(max_age), GroupState::Ready),
            (Some(max_age + 1), GroupState::CheckpointConservative),
        ];
        for (exact_age, want) in cases {
            let rows = states(&one_group(by_59(exact_age)), &limits);
            let [(state, row)] = rows.as_slice() else {
                panic!("one group: {rows:?}");
            };
            assert_eq!(*state, want, "last exact {exact_age:?} ago");
            assert_eq!(row.estimated_replay_records, 59, "{exact_age:?}");
            assert!(row.message.contains("up to 59 records"), "{}", row.message);
        }
    }

    #[test]
    fn a_worse_state_wins_over_a_conservative_checkpoint() {
        let mut stale = one_group(by_59(None));
        stale.groups[0].checkpoint_age = Some(Duration::from_secs(3600));
        let states: Vec<GroupState> = states(&stale, &FailoverReadinessSpec::default())
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(states, [GroupState::CheckpointStale]);
    }

    #[test]
    fn a_mismatch_found_on_the_records_holds_failover_back_and_evidence_is_dated() {
        use crate::kafka::checkpoints::{Exactness, StoredCheckpoint};
        use crate::mm2::{Checkpoint, TopicPartition};
        use crate::verify::header::Verification;
        use crate::verify::outcome::{Mismatch, Outcome};
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("a time"),
        );
        let limits = FailoverReadinessSpec::default();
        let verified = |outcome: Outcome| {
            let tp = TopicPartition::new("A.t", 2);
            let mut v = crate::status::verified::Verified::default();
            v.add(
                &tp,
                &StoredCheckpoint {
                    checkpoint: Checkpoint {
                        group: "g".into(),
                        topic_partition: tp.clone(),
                        upstream_offset: 40,
                        downstream_offset: 48,
                        metadata: String::new(),
                    },
                    written_ms: Some(1),
                    exactness: Exactness::Exact,
                    exact_ms: Some(1),
                    verification: Some(Verification {
                        at_ms: 5_000,
                        upstream: 40,
                        downstream: 48,
                        outcome,
                    }),
                    share: false,
                },
            );
            v.aged(|_| Duration::from_secs(5))
        };
        let mut obs = one_group(Conservative::default());
        obs.groups[0].verified = verified(Outcome::Mismatch(Mismatch {
            skipped: Some(1),
            reread: Some(0),
        }));
        let s = crate::status::status(None, &obs, &limits, None, &now);
        let row = &s.least_ready_groups[0];
        assert_eq!(row.reason, "RecordsMismatch");
        assert!(
            row.message
                .contains("partition A.t-2 (source offset 40, target offset 48)")
                && row.message.contains("skip 1 record"),
            "{}",
            row.message
        );
        let failover = s
            .conditions
            .iter()
            .find(|c| c.type_ == crate::status::FAILOVER_READY)
            .expect("reported");
        assert_eq!(
            (failover.status.as_str(), failover.reason.as_str()),
            ("False", reason::RECORDS_MISMATCH)
        );

        obs.groups[0].verified = verified(Outcome::Match);
        let s = crate::status::status(Some(&s), &obs, &limits, None, &now);
        let row = &s.least_ready_groups[0];
        assert_eq!(
            (
                row.reason.as_str(),
                row.last_verified.as_deref(),
                row.verified_partitions.as_deref()
            ),
            ("Ready", Some("5s"), Some("1/1"))
        );
        let failover = s
            .conditions
            .iter()
            .find(|c| c.type_ == crate::status::FAILOVER_READY)
            .expect("reported");
        assert_eq!(failover.status, "True");
        assert!(
            failover
                .message
                .contains("verified on the records on 1/1 group-partition(s), newest 5s ago"),
            "{}",
            failover.message
        );
    }
}
