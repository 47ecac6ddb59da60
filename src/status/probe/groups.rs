//! The flow's consumer groups as the probe sees them: which to probe, and each one's committed
//! offsets against its checkpoints and the copy's positions.

use super::*;
use crate::kafka::groups::{SHARE, STREAMS};

/// `source` and `md` are the probe's own client and metadata of the source cluster. Also
/// counts the groups whose offsets the source refused to the flow's principal, and names the
/// selected share groups whose start offsets could not be read, with why. A share group's
/// start offsets stand for its committed offsets: the checkpoint loop checkpoints them and a
/// failover sets them.
pub(super) fn group_observations(
    flow: &Flow,
    source: &Cluster,
    md: &rdkafka::metadata::Metadata,
    checkpoints: &CheckpointIndex,
    positions: Option<&Positions>,
    recreated: &Recreations,
    budget: Budget,
) -> (Vec<GroupObservation>, usize, Vec<(String, String)>) {
    let policy = flow.policy.as_ref();
    let Ok(list) = source.group_names(budget.next(TIMEOUT)) else {
        return (Vec::new(), 0, Vec::new());
    };
    let mut forbidden = 0usize;
    let mirrored: HashSet<(String, i32)> = md
        .topics()
        .iter()
        .filter(|t| replicates(flow, policy, t.name()))
        .flat_map(|t| {
            t.partitions()
                .iter()
                .map(|p| (t.name().to_string(), p.id()))
        })
        .collect();
    let mut out = Vec::new();
    let kinds = source.group_kinds(budget.next(TIMEOUT));
    let (share, groups): (Vec<String>, Vec<String>) = groups_to_probe(flow, &list, checkpoints)
        .into_iter()
        .partition(|g| kinds.get(g).is_some_and(|k| k == SHARE));
    for chunk in groups.chunks(GROUPS_AT_ONCE) {
        // The groups not probed this time keep no row; the next probe starts again.
        if budget.spent() {
            break;
        }
        let names: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let answers = source.committed(&names, budget.next(TIMEOUT));
        for (group, answer) in chunk.iter().zip(answers) {
            let committed = match answer {
                Ok(c) => c,
                Err(e) => {
                    if e.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed) {
                        forbidden = forbidden.saturating_add(1);
                    }
                    continue;
                }
            };
            let mut committed = listed(&committed);
            committed.retain(|partition, _| mirrored.contains(partition));
            let cps = checkpoints.get(group);
            let observed = observe_group(
                flow,
                group.clone(),
                &committed,
                cps,
                positions,
                recreated,
                age,
            );
            // Streams groups commit like consumer groups; their rows say what they are.
            let kind = (kinds.get(group).map(String::as_str) == Some(STREAMS)).then_some(STREAMS);
            out.extend(observed.map(|g| GroupObservation { kind, ..g }));
        }
    }
    let mut unread = Vec::new();
    for group in share {
        if budget.spent() {
            break;
        }
        match source.share_starts(&group) {
            Ok(starts) => {
                let mut committed: Listed = (starts.into_iter())
                    .map(|(partition, offset)| (partition, Offset::Offset(offset)))
                    .collect();
                committed.retain(|partition, _| mirrored.contains(partition));
                let cps = checkpoints.get(&group);
                let observed =
                    observe_group(flow, group, &committed, cps, positions, recreated, age);
                out.extend(observed.map(|g| GroupObservation {
                    kind: Some(SHARE),
                    ..g
                }));
            }
            Err(why) => unread.push((group, why)),
        }
    }
    (out, forbidden, unread)
}

/// The groups a probe asks about, in order: the flow's groups on the source (not the
/// replicator's own) and every group with checkpoints, by name, at most [`MAX_PROBED_GROUPS`].
pub(super) fn groups_to_probe(
    flow: &Flow,
    listed: &[String],
    checkpoints: &CheckpointIndex,
) -> Vec<String> {
    // A set, not a list scan per checkpointed group: both lists come from the clusters and
    // may be long (N7); sorted, so the first MAX_PROBED_GROUPS are the same every probe.
    let names: std::collections::BTreeSet<&str> = listed
        .iter()
        .filter(|g| flow.groups.matches(g) && !g.starts_with("mirrorflow."))
        .chain(checkpoints.keys())
        .map(String::as_str)
        .collect();
    names
        .into_iter()
        .take(MAX_PROBED_GROUPS)
        .map(str::to_owned)
        .collect()
}

/// What one group's committed source offsets and its checkpoints say about a failover now;
/// `None` when it committed nothing on the mirrored partitions. `age` turns a time (ms since
/// the epoch) into how long ago it was.
pub(super) fn observe_group(
    flow: &Flow,
    group: String,
    committed: &Listed,
    checkpoints: Option<&BTreeMap<TopicPartition, StoredCheckpoint>>,
    positions: Option<&Positions>,
    recreated: &Recreations,
    age: impl Fn(i64) -> Duration,
) -> Option<GroupObservation> {
    let policy = flow.policy.as_ref();
    let mut replay = 0i64;
    let mut uncopied = 0i64;
    let mut any_commit = false;
    let mut stale_since: Option<i64> = None;
    let mut newest_written: Option<i64> = None;
    let mut invalidated = 0u32;
    let mut conservative = Conservative::default();
    let mut verified = crate::status::verified::Verified::default();
    // The oldest time one of the conservative partitions was last exact; `Some(None)`: never.
    let mut exact_since: Option<Option<i64>> = None;
    for ((topic, partition), offset) in committed {
        let Offset::Offset(c) = *offset else {
            continue;
        };
        let source_partition = (topic.clone(), *partition);
        any_commit = true;
        // A commit past what is on the target may have no checkpoint yet because the
        // replicator is behind, not the checkpoint loop. A partition without a stored
        // position has had nothing copied.
        if let Some(copied) = positions {
            let next = copied.get(&source_partition).copied().unwrap_or(0);
            uncopied = uncopied.saturating_add(c.saturating_sub(next).max(0));
        }
        let remote = policy.format_remote_topic(flow.source_alias(), topic);
        match checkpoints.and_then(|m| m.get(&TopicPartition::new(remote, *partition))) {
            Some(stored)
                if recreated
                    .get(&source_partition)
                    .is_some_and(|&at| stored.written_ms.unwrap_or(0) < at) =>
            {
                // Written into the remote log that was deleted: a failover on it would
                // seek past the new log's copies.
                invalidated = invalidated.saturating_add(1);
            }
            Some(stored) => {
                verified.add(&stored.checkpoint.topic_partition, stored);
                let up = stored.checkpoint.upstream_offset;
                let written = stored.written_ms.unwrap_or(0);
                newest_written = Some(newest_written.map_or(written, |n| n.max(written)));
                if up < c {
                    replay = replay.saturating_add(c.saturating_sub(up));
                    stale_since = Some(stale_since.map_or(written, |s| s.min(written)));
                }
                // What its writer said it may re-read besides: a conservative translation
                // points before the commit's true position, which the offsets do not show.
                let imprecise = i64::try_from(stored.exactness.max_replay()).unwrap_or(i64::MAX);
                if imprecise > 0 {
                    replay = replay.saturating_add(imprecise);
                    // At the commit: judged by when it was last exact ([`crate::status::groups`]); a
                    // group that moved on is judged by its checkpoint age, as any commit past
                    // its checkpoint.
                    if up == c {
                        conservative.partitions = conservative.partitions.saturating_add(1);
                        conservative.max_replay = conservative.max_replay.saturating_add(imprecise);
                        exact_since = Some(match exact_since {
                            None => stored.exact_ms,
                            Some(since) => since.zip(stored.exact_ms).map(|(a, b)| a.min(b)),
                        });
                    }
                }
            }
            None => {
                replay = replay.saturating_add(c);
                stale_since = Some(i64::MIN);
            }
        }
    }
    if !any_commit {
        return None;
    }
    let checkpoint_age = match (stale_since, newest_written) {
        (None, _) => Some(Duration::ZERO),
        (Some(i64::MIN), _) | (_, None) => None,
        (Some(since), Some(_)) => Some(age(since)),
    };
    let verified = verified.aged(&age);
    Some(GroupObservation {
        group,
        verified,
        checkpoint_age,
        replay_records: replay,
        uncopied_records: uncopied,
        invalidated_checkpoints: invalidated,
        conservative: Conservative {
            exact_age: exact_since.flatten().map(age),
            ..conservative
        },
        kind: None,
    })
}
