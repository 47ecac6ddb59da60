//! The conditions' verdicts from one observation: one function per condition, each naming the
//! first cause it finds (`FailoverReady` is the first other condition that is False).

use super::*;

/// Every evaluated condition's verdict, in [`EVALUATED`]'s order.
pub(super) fn evaluate(obs: &Observation, limits: &FailoverReadinessSpec) -> Vec<Verdict> {
    let all_false = |reason: &'static str, message: &str| {
        EVALUATED.map(|t| verdict(t, false, reason, message)).into()
    };
    if let Some(b) = &obs.blocked {
        return all_false(b.reason, &b.message);
    }
    if let Some(message) = &obs.conflict {
        // The replicators run but write nothing while the older flow does.
        return all_false(reason::CONFLICTING_FLOW, message);
    }
    if let Some(message) = &obs.unreadable_topic {
        // Positions, checkpoints or heartbeats are unknown: nothing can be judged.
        return all_false(reason::INTERNAL_TOPIC_REFUSED, message);
    }
    let unreachable = match (&obs.source_error, &obs.target_error) {
        (Some(e), _) => Some(e.describe("source")),
        (None, Some(e)) => Some(e.describe("target")),
        (None, None) => None,
    };

    let unreachable = unreachable.as_ref();
    let ready = ready(obs, unreachable);
    let replicating = replicating(obs, limits, unreachable);
    let heartbeats = heartbeats(obs, limits, unreachable);
    let checkpoints = checkpoints(obs, limits, unreachable);
    let failover = failover(obs, &ready, &replicating, &heartbeats, &checkpoints);
    vec![ready, replicating, checkpoints, heartbeats, failover]
}

/// `Ready`: whether the replicator pods run, and if not, the first cause found.
fn ready(obs: &Observation, unreachable: Option<&(&'static str, String)>) -> Verdict {
    if obs.observe_only {
        match &unreachable {
            Some((r, m)) => verdict(READY, false, r, m.clone()),
            None => verdict(
                READY,
                true,
                reason::OBSERVING,
                "mode Observe: no replicator pods; watching the heartbeats and checkpoints another replicator writes",
            ),
        }
    } else if let Some((r, m)) = obs
        .unready
        .as_ref()
        .filter(|_| obs.ready_replicas < obs.desired_replicas)
    {
        // A pod that cannot run (killed, exiting, not pullable, not schedulable) fails on its
        // own, whatever the clusters do: its cause comes first.
        verdict(READY, false, r, m.clone())
    } else if let Some((r, m)) = &unreachable {
        // A cluster the replicators cannot use also keeps them unready: name the cause.
        verdict(READY, false, r, m.clone())
    } else if !obs.stranded.is_empty() {
        verdict(
            READY,
            false,
            reason::REPLICA_ON_LOST_NODE,
            obs.stranded.join("; "),
        )
    } else if obs.ready_replicas < obs.desired_replicas {
        verdict(
            READY,
            false,
            reason::REPLICAS_NOT_READY,
            format!(
                "{}/{} replicator pods ready",
                obs.ready_replicas, obs.desired_replicas
            ),
        )
    } else if let Some(idle) = idle_replicas(obs) {
        verdict(
            READY,
            true,
            reason::REPLICAS_ABOVE_PARTITIONS,
            format!("{} replicator pods ready; {idle}", obs.ready_replicas),
        )
    } else {
        verdict(
            READY,
            true,
            reason::OK,
            format!("{} replicator pods ready", obs.ready_replicas),
        )
    }
}

/// `Replicating`: whether records are copied: a refusal the replicators recorded, the lag, or
/// in Observe mode the replicated heartbeats.
fn replicating(
    obs: &Observation,
    limits: &FailoverReadinessSpec,
    unreachable: Option<&(&'static str, String)>,
) -> Verdict {
    let max_hb = limits.max_heartbeat_lag.as_duration();
    let mut refused: Vec<&Refusal> = obs.refusals.iter().flatten().collect();
    refused.sort_by(|a, b| (a.detected_ms, &a.topic).cmp(&(b.detected_ms, &b.topic)));
    match (unreachable, obs.replication_lag) {
        (Some((r, m)), _) => verdict(REPLICATING, false, r, m.clone()),
        // What the replicators wrote after it is invisible: the lag shown stands still.
        (None, _) if obs.held_topic.is_some() => verdict(
            REPLICATING,
            false,
            reason::INTERNAL_TOPIC_REFUSED,
            obs.held_topic.clone().unwrap_or_default(),
        ),
        // Also in Observe mode (and the CLI's measurement): a flow of this project recorded
        // them in the positions topic of this source alias on this target.
        (None, _) if !refused.is_empty() => {
            let says = |mark: &str| refused.first().is_some_and(|r| r.message.contains(mark));
            let why = if says(crate::kafka::refusals::STALLED_MARK) {
                reason::PARTITION_STALLED
            } else if says(crate::kafka::refusals::UNREADABLE_MARK) {
                reason::INTERNAL_TOPIC_REFUSED
            } else {
                reason::TOPIC_CHANGES_REFUSED
            };
            verdict(REPLICATING, false, why, refused_message(&refused))
        }
        // Without our positions, fresh replicated heartbeats are the evidence that the other
        // replicator copies records.
        (None, None) if obs.observe_only => match obs.heartbeat_age {
            Some(age) if age <= max_hb => verdict(
                REPLICATING,
                true,
                reason::OBSERVING,
                format!("mode Observe: replicated heartbeats are {} old", secs(age)),
            ),
            Some(age) => verdict(
                REPLICATING,
                false,
                reason::HEARTBEAT_LAG_HIGH,
                format!(
                    "mode Observe: the newest replicated heartbeat is {} old (limit {}): is the replicator running?",
                    secs(age),
                    limits.max_heartbeat_lag
                ),
            ),
            None => verdict(
                REPLICATING,
                false,
                reason::NO_HEARTBEATS,
                "mode Observe: no replicated source heartbeat on the target: is the replicator running, and does it use this flow's aliases and naming policy?",
            ),
        },
        (None, Some(lag)) if lag > limits.max_replication_lag => verdict(
            REPLICATING,
            false,
            reason::REPLICATION_LAG_HIGH,
            format!(
                "{lag} source records not yet copied (limit {})",
                limits.max_replication_lag
            ),
        ),
        (None, _) if obs.ready_replicas == 0 && !obs.observe_only => match &obs.unready {
            Some((r, m)) => verdict(
                REPLICATING,
                false,
                r,
                format!("no replicator pod is ready: {m}"),
            ),
            None => verdict(
                REPLICATING,
                false,
                reason::REPLICAS_NOT_READY,
                "no replicator pod is ready",
            ),
        },
        (None, lag) => verdict(
            REPLICATING,
            true,
            reason::OK,
            match lag {
                Some(l) => format!("{l} source records not yet copied"),
                None => "replicators are running".to_string(),
            },
        ),
    }
}

/// `HeartbeatsFlowing`: the age of the newest replicated heartbeat.
fn heartbeats(
    obs: &Observation,
    limits: &FailoverReadinessSpec,
    unreachable: Option<&(&'static str, String)>,
) -> Verdict {
    let max_hb = limits.max_heartbeat_lag.as_duration();
    if !obs.heartbeats_enabled {
        verdict(
            HEARTBEATS_FLOWING,
            false,
            reason::HEARTBEATS_DISABLED,
            "spec.heartbeats.enabled is false: end-to-end lag cannot be measured",
        )
    } else {
        match (unreachable, obs.heartbeat_age) {
            // Nothing flows while a cluster is down, however recent the last heartbeat.
            (Some((r, m)), _) => verdict(HEARTBEATS_FLOWING, false, r, m.clone()),
            (None, Some(age)) if age <= max_hb => verdict(
                HEARTBEATS_FLOWING,
                true,
                reason::OK,
                format!("heartbeat lag {}", secs(age)),
            ),
            (None, Some(age)) => verdict(
                HEARTBEATS_FLOWING,
                false,
                reason::HEARTBEAT_LAG_HIGH,
                format!(
                    "newest replicated heartbeat is {} old (limit {})",
                    secs(age),
                    limits.max_heartbeat_lag
                ),
            ),
            (None, None) => verdict(
                HEARTBEATS_FLOWING,
                false,
                reason::NO_HEARTBEATS,
                "no replicated source heartbeat on the target yet: the source loop has not copied the source's heartbeats topic",
            ),
        }
    }
}

/// `CheckpointsFresh`: whether every selected group's checkpoint is fresh, the worst named.
fn checkpoints(
    obs: &Observation,
    limits: &FailoverReadinessSpec,
    unreachable: Option<&(&'static str, String)>,
) -> Verdict {
    let groups = groups::states(obs, limits);
    if !obs.checkpoints_enabled {
        verdict(
            CHECKPOINTS_FRESH,
            false,
            reason::CHECKPOINTS_DISABLED,
            "spec.checkpoints.enabled is false: consumers cannot fail over with translated offsets",
        )
    } else if let Some((r, m)) = unreachable {
        verdict(CHECKPOINTS_FRESH, false, r, m.clone())
    } else if obs.selected.groups_forbidden > 0 {
        verdict(
            CHECKPOINTS_FRESH,
            false,
            reason::SOURCE_NOT_AUTHORIZED,
            format!(
                "the source refused the committed offsets of {} selected consumer group(s) to the flow's principal (group authorization failed), so whether they can fail over is unknown; grant the principal that spec.source.sasl (or spec.source.tls.certSecretRef) authenticates as DESCRIBE on those groups, or leave them out with spec.groupsExclude",
                obs.selected.groups_forbidden
            ),
        )
    } else {
        let not_ready: Vec<&(GroupState, crate::api::GroupReadiness)> = groups
            .iter()
            .filter(|(state, _)| *state != GroupState::Ready)
            .collect();
        match not_ready.first() {
            None if obs.groups.is_empty() => no_groups(obs),
            None => verdict(
                CHECKPOINTS_FRESH,
                true,
                reason::OK,
                format!("all {} groups have fresh checkpoints", obs.groups.len()),
            ),
            Some((state, worst)) => verdict(
                CHECKPOINTS_FRESH,
                false,
                state.condition_reason(),
                format!(
                    "{} of {} groups not ready; worst: {}: {}",
                    not_ready.len(),
                    groups.len(),
                    worst.group,
                    worst.message
                ),
            ),
        }
    }
}

/// `FailoverReady`: the first of the other conditions that is False, or why there is nothing to
/// fail over, or the evidence that consumers can fail over now.
fn failover(
    obs: &Observation,
    ready: &Verdict,
    replicating: &Verdict,
    heartbeats: &Verdict,
    checkpoints: &Verdict,
) -> Verdict {
    let blockers: Vec<&Verdict> = [ready, replicating, heartbeats, checkpoints]
        .into_iter()
        .filter(|v| !v.ok)
        .collect();
    let nothing_copied = no_topics(obs);
    match (&nothing_copied, blockers.first()) {
        // The root cause: without a topic no group has offsets to fail over with.
        (Some(message), _) => verdict(
            FAILOVER_READY,
            false,
            reason::NO_TOPICS_MATCHED,
            message.clone(),
        ),
        // Nothing blocks, but no group is checkpointed: ready, saying there is nothing to
        // fail over (and why, when the selection may be wrong).
        (None, None) if obs.groups.is_empty() && checkpoints.ok => verdict(
            FAILOVER_READY,
            true,
            checkpoints.reason,
            format!(
                "nothing blocks a failover, but no consumer group is checkpointed: {}",
                checkpoints.message
            ),
        ),
        (None, None) => verdict(
            FAILOVER_READY,
            true,
            reason::OK,
            format!(
                "consumers can fail over to the target now{}",
                verified::flow_evidence(&obs.groups)
            ),
        ),
        (None, Some(first)) => verdict(
            FAILOVER_READY,
            false,
            first.reason,
            format!("{} is False: {}", first.type_, first.message),
        ),
    }
}

/// When the flow's topic selection matched no topic on the source: what to say.
fn no_topics(obs: &Observation) -> Option<String> {
    let matched = obs
        .selected
        .topics_matched
        .or(obs.topics.and_then(|t| usize::try_from(t).ok()));
    if matched != Some(0) || obs.source_error.is_some() || obs.selected.topics_named {
        return None;
    }
    let seen = match obs.selected.topics_seen {
        Some(n) => format!("none of the {n} topics"),
        None => "none of the topics".to_string(),
    };
    Some(format!(
        "spec.topics and spec.topicsExclude select {seen} on the source (internal topics are never copied), so the flow copies nothing and no consumer can fail over; check the patterns (regular expressions matched against whole names) against the source's topics, or create the topics"
    ))
}

/// `CheckpointsFresh` when no group has committed offsets on the mirrored topics. False when
/// the selection is wrong: no topic is mirrored, or the source has groups and the selection's
/// patterns match none of them (a consumer the user meant to cover is not covered). True when
/// the selected groups simply have not committed yet (groups named one by one, which the
/// source lists once they commit), or the source has none: nothing needs failing over now,
/// and the message says so, so a flow that mirrors data for consumers still to come is not
/// reported broken.
fn no_groups(obs: &Observation) -> Verdict {
    let no_topic = obs.topics == Some(0) || obs.selected.topics_matched == Some(0);
    if no_topic && !obs.selected.topics_named {
        return verdict(
            CHECKPOINTS_FRESH,
            false,
            reason::NO_TOPICS_MATCHED,
            "no topic is mirrored (see FailoverReady), so no consumer group has offsets to checkpoint",
        );
    }
    match obs.selected.groups {
        // True, since consumers may simply not have committed yet; the reason says so.
        Some((0, listed)) if listed > 0 && !obs.selected.groups_named => verdict(
            CHECKPOINTS_FRESH,
            true,
            reason::NO_GROUPS_MATCHED,
            format!(
                "spec.groups and spec.groupsExclude select none of the {listed} consumer groups on the source, so no group's offsets are checkpointed and no consumer can fail over with them yet; if consumers of the mirrored topics should be covered, check the patterns (regular expressions matched against whole names)"
            ),
        ),
        Some((0, _)) if obs.selected.groups_named => verdict(
            CHECKPOINTS_FRESH,
            true,
            reason::OK,
            "the consumer groups spec.groups names have not committed on the source yet: nothing to fail over now; a group is checkpointed once it commits on a mirrored topic",
        ),
        Some((matched, _)) if matched > 0 => verdict(
            CHECKPOINTS_FRESH,
            true,
            reason::OK,
            format!(
                "{matched} consumer group(s) match spec.groups but none has committed offsets on the mirrored topics yet: nothing to fail over now; a group is checkpointed once it commits on a mirrored topic"
            ),
        ),
        _ => verdict(
            CHECKPOINTS_FRESH,
            true,
            reason::OK,
            "no consumer group on the source has committed offsets on the mirrored topics yet: nothing to fail over now; a group is checkpointed once it commits on a mirrored topic",
        ),
    }
}

/// How many replicas idle because the mirrored topics have fewer partitions (a partition is
/// copied by one replica at a time), as a sentence; `None` when all may work.
fn idle_replicas(obs: &Observation) -> Option<String> {
    let partitions = obs.selected.partitions.filter(|&p| p > 0)?;
    let replicas = usize::try_from(obs.desired_replicas).ok()?;
    let idle = replicas.checked_sub(partitions).filter(|&n| n > 0)?;
    Some(format!(
        "spec.replicas is {replicas} but the mirrored topics have {partitions} partition(s) in all, so {idle} replica(s) idle (a partition is copied by one replica at a time); lower spec.replicas to {partitions}, or keep the others as standbys"
    ))
}

/// `Replicating` while a cluster refuses topic changes: how many, the oldest in full (it
/// names the fix), and the next few topics by name.
fn refused_message(refused: &[&Refusal]) -> String {
    let Some(oldest) = refused.first() else {
        return String::new();
    };
    let count = if refused.len() >= crate::kafka::refusals::MAX_RECORDED {
        format!("{} or more", refused.len())
    } else {
        refused.len().to_string()
    };
    let mut message = format!(
        "{count} topic(s) not copied as they should be (on the target not created, not kept in line with their source or not writable by the flow, or a partition that stopped or stalled), each retried on its own; {}: {}",
        oldest.topic, oldest.message
    );
    let others: Vec<&str> = refused
        .iter()
        .skip(1)
        .take(MAX_LISTED_REFUSALS)
        .map(|r| r.topic.as_str())
        .collect();
    if !others.is_empty() {
        let more = refused.len().saturating_sub(1 + others.len());
        message.push_str(&format!("; also {}", others.join(", ")));
        if more > 0 {
            message.push_str(&format!(" and {more} more"));
        }
    }
    message
}
