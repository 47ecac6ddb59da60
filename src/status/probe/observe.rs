//! What one probe reads on the two clusters: the flow's selection, the copy's positions, the
//! target's tails (heartbeats, checkpoints) and ACLs, each into the [`ClusterObservation`].

use super::*;

pub(super) fn observe_clusters(
    clients: &ProbeClients,
    namespace: &str,
    flow: &Flow,
    budget: Budget,
) -> ClusterObservation {
    let mut out = ClusterObservation::default();
    let Some(Connected {
        source,
        source_config,
        target,
        target_config,
    }) = connected(clients, namespace, flow, &mut out)
    else {
        return out;
    };
    let source_md = source.metadata(budget.next(TIMEOUT));
    if let Some(f) = (source_md.as_ref().ok())
        .and_then(|md| clients.brokers_refused(namespace, &source_config, md))
    {
        out.source_error = Some(f);
        return out;
    }
    let mirrored = match &source_md {
        Ok(md) => {
            source.client().context().clear_cause();
            observe_selection(flow, md, &mut out)
        }
        Err(e) => {
            out.source_error = Some(fault(&source, e, &source_config, budget));
            Vec::new()
        }
    };
    let target_md = match target.metadata(budget.next(TIMEOUT)) {
        Ok(md) if let Some(f) = clients.brokers_refused(namespace, &target_config, &md) => {
            out.target_error = Some(f);
            return out;
        }
        Ok(md) => {
            target.client().context().clear_cause();
            md
        }
        Err(e) => {
            out.target_error = Some(fault(&target, &e, &target_config, budget));
            return out;
        }
    };
    let positions = observe_copy(flow, &target, &target_md, &mirrored, budget, &mut out);
    let copies = positions_are_the_flows(flow, positions.as_ref());
    if let (Ok(md), Some(copied), true) = (&source_md, &positions, copies) {
        out.replication_lag = replication_lag(flow, source.client(), md, copied, budget);
    }
    let checkpoints = observe_tails(flow, &target, &target_md, budget, &mut out);
    let Ok(md) = &source_md else {
        return out;
    };
    if syncs_topic_acls(flow) && !budget.spent() {
        out.topic_acls = Some(observe_acls(flow, &source, &target, budget));
    }
    let recreated = recreations(out.gaps.as_deref().unwrap_or_default());
    (out.groups, out.selected.groups_forbidden, out.share_groups) = group_observations(
        flow,
        &source,
        md,
        &checkpoints,
        positions.as_ref().filter(|_| copies),
        &recreated,
        budget,
    );
    out.selected.groups = selected_groups(flow, &source, budget);
    out.selected.groups_named = plain_names(&flow.spec.groups);
    out
}

/// The source topics the flow copies, and what its selection matched, into `out`.
pub(super) fn observe_selection<'a>(
    flow: &Flow,
    md: &'a rdkafka::metadata::Metadata,
    out: &mut ClusterObservation,
) -> Vec<&'a str> {
    let policy = flow.policy.as_ref();
    let mirrored = mirrored_topics(flow, md.topics().iter().map(|t| t.name()));
    out.topics = Some(i32::try_from(mirrored.len()).unwrap_or(i32::MAX));
    out.selected = selected_topics(flow, md);
    out.selected.topics_matched = Some(
        mirrored
            .iter()
            .filter(|t| !policy.is_heartbeats_topic(t))
            .count(),
    );
    mirrored
}

/// Whether the target has `name` with partitions. A topic it does not have is never asked
/// for: librdkafka waits out the whole timeout for the offsets of an unknown topic.
pub(super) fn on_target(target: &Cluster, md: &rdkafka::metadata::Metadata, name: &str) -> bool {
    let there = md
        .topics()
        .iter()
        .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty());
    if !there {
        target.forget(name);
    }
    there
}

/// The copy as the target shows it: its stored positions (with their gaps and refusals), the
/// replication factor it would be refused, and the remote topics it could not write.
pub(super) fn observe_copy(
    flow: &Flow,
    target: &Cluster,
    target_md: &rdkafka::metadata::Metadata,
    mirrored: &[&str],
    budget: Budget,
    out: &mut ClusterObservation,
) -> Option<Positions> {
    let positions_topic = positions::positions_topic(flow.source_alias());
    let positions_exist = on_target(target, target_md, &positions_topic);
    let positions = if positions_exist {
        follow_positions(flow, target, &positions_topic, budget, out)
    } else {
        // Nothing copied yet (or another tool replicates): nothing can have been skipped.
        out.gaps = Some(Vec::new());
        out.refusals = Some(Vec::new());
        None
    };
    if !positions_exist && let Some(r) = replication_factor_refused(flow, target_md.brokers().len())
    {
        out.refusals.get_or_insert_with(Vec::new).push(r);
    }
    let written = crate::status::writes::written_topics(flow, mirrored);
    if !written.is_empty() && !budget.spent() {
        let present = crate::status::writes::present(target_md);
        let checked = crate::status::writes::checked(written, |t| present.contains(t));
        let refused = crate::status::writes::refused_writes(
            target.client().client(),
            &checked,
            budget.next(TIMEOUT),
        );
        out.refusals.get_or_insert_with(Vec::new).extend(refused);
    }
    positions
}

/// The newest replicated heartbeat into `out`, and the checkpoints (none when their topic is
/// unreadable: absent, or the target just went away; the groups then say so).
pub(super) fn observe_tails(
    flow: &Flow,
    target: &Cluster,
    target_md: &rdkafka::metadata::Metadata,
    budget: Budget,
    out: &mut ClusterObservation,
) -> std::sync::Arc<CheckpointIndex> {
    let policy = flow.policy.as_ref();
    let hb_topic = policy.format_remote_topic(flow.source_alias(), policy.heartbeats_topic());
    out.heartbeat = on_target(target, target_md, &hb_topic)
        .then(|| follow_heartbeat(target, &hb_topic, budget, out))
        .flatten()
        .map(|ts| (age(ts), ts));
    let checkpoints_topic = policy.checkpoints_topic(flow.source_alias());
    on_target(target, target_md, &checkpoints_topic)
        .then(|| follow_checkpoints(target, &checkpoints_topic, budget, out))
        .flatten()
        .unwrap_or_default()
}

/// The source's topic ACLs against the target's, and the refresh interval that bounds how
/// long a difference may last.
pub(super) fn observe_acls(
    flow: &Flow,
    source: &Cluster,
    target: &Cluster,
    budget: Budget,
) -> (TopicAcls, String) {
    let policy = flow.policy.as_ref();
    let seen = crate::status::acls::observe(
        source.client().client(),
        target.client().client(),
        |topic| {
            replicates(flow, policy, topic)
                .then(|| policy.format_remote_topic(flow.source_alias(), topic))
        },
        || budget.next(TIMEOUT),
    );
    (
        seen,
        flow.spec.source_loop.topics_refresh_interval.to_string(),
    )
}

/// Both clusters' shared probe clients and their settings.
pub(super) struct Connected {
    source: std::sync::Arc<Cluster>,
    source_config: ClientConfig,
    target: std::sync::Arc<Cluster>,
    target_config: ClientConfig,
}

/// The flow's clients of both clusters; `None`, with the fault in `out`, for a cluster refused
/// (now or recently) or whose client could not be made.
pub(super) fn connected(
    clients: &ProbeClients,
    namespace: &str,
    flow: &Flow,
    out: &mut ClusterObservation,
) -> Option<Connected> {
    let target_config = shared_config(&flow.target_probe_client, flow.target_alias());
    let source_config = shared_config(&flow.source_probe_client, flow.source_alias());
    out.source_error = (clients.refused(&source_config))
        .or_else(|| clients.recently_refused(namespace, &source_config));
    out.target_error = (clients.refused(&target_config))
        .or_else(|| clients.recently_refused(namespace, &target_config));
    if out.source_error.is_some() || out.target_error.is_some() {
        return None;
    }
    let target = match clients.cluster(namespace, &target_config) {
        Ok(c) => c,
        Err(e) => {
            out.target_error = Some(ClusterFault::Unreachable(e.to_string()));
            return None;
        }
    };
    let source = match clients.cluster(namespace, &source_config) {
        Ok(c) => c,
        Err(e) => {
            out.source_error = Some(ClusterFault::Unreachable(e.to_string()));
            return None;
        }
    };
    Some(Connected {
        source,
        source_config,
        target,
        target_config,
    })
}

/// The copy's positions in the flow's positions topic on the target; its gaps, refusals and a
/// conflicting older writer go into `out`.
pub(super) fn follow_positions(
    flow: &Flow,
    target: &Cluster,
    topic: &str,
    budget: Budget,
    out: &mut ClusterObservation,
) -> Option<Positions> {
    let read = target.follow(
        topic,
        TailKind::Positions,
        budget.next(2 * TIMEOUT),
        |state| match state {
            TailState::Positions {
                positions,
                gaps,
                claims,
                refusals,
            } => Some(PositionsRead {
                positions: positions
                    .iter()
                    .map(|(k, f)| (k.clone(), f.next))
                    .collect::<Positions>(),
                gaps: gaps.as_slice().to_vec(),
                // Only a flow that writes yields; an Observe flow reads whoever writes.
                conflict: (flow.spec.mode == FlowMode::Replicate)
                    .then(|| writers::yields_to(&flow.writer, claims, now_ms()))
                    .flatten()
                    .map(|older| writers::yield_message(older, flow.source_alias())),
                refusals: refusals.values().cloned().collect(),
            }),
            _ => None,
        },
    );
    let read = followed(read, topic, out).flatten();
    out.gaps = read.as_ref().map(|r| r.gaps.clone());
    out.refusals = read.as_ref().map(|r| r.refusals.clone());
    out.conflict = read.as_ref().and_then(|r| r.conflict.clone());
    out.held_topic = target
        .open_transaction(topic)
        .and_then(|(at, open_for)| held_message(flow, topic, at, open_for));
    read.map(|r| r.positions)
}

/// A transaction open at the positions topic's end at least this long (and twice the flow's
/// own transaction timeout) is taken for one left open for good.
const HELD_AFTER: Duration = Duration::from_secs(60);

/// What the status says of a transaction open at `at` of the positions topic `topic` for
/// `open_for`: `None` while it may still end by itself. Every position, refusal and break
/// written after it is invisible to `read_committed` readers, this probe's included, until it
/// ends: the copy's progress as the status shows it stands still.
pub(super) fn held_message(
    flow: &Flow,
    topic: &str,
    at: i64,
    open_for: Duration,
) -> Option<String> {
    let own_timeout = flow
        .target_client
        .get("transaction.timeout.ms")
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_millis);
    if open_for < HELD_AFTER.max(own_timeout.saturating_mul(2)) {
        return None;
    }
    Some(format!(
        "{topic}{}: a transaction has been open at offset {at} for {}s, so what the replicators wrote there since (positions, breaks, refusals) is not visible and the copy's progress shown here stands still. An exactly-once replicator ends one its own partition left when it prepares that partition again (restart the replicator pods); one no partition of the flow owns stays until ended: kafka-transactions.sh --bootstrap-server <target> abort --topic {topic} --partition 0 --start-offset {at}",
        crate::kafka::refusals::HELD_MARK,
        open_for.as_secs()
    ))
}

/// The time of the newest replicated heartbeat in `topic`.
pub(super) fn follow_heartbeat(
    target: &Cluster,
    topic: &str,
    budget: Budget,
    out: &mut ClusterObservation,
) -> Option<i64> {
    let read = target.follow(
        topic,
        TailKind::Heartbeats,
        budget.next(TIMEOUT),
        |state| match state {
            TailState::Heartbeat(newest) => *newest,
            _ => None,
        },
    );
    followed(read, topic, out).flatten()
}

/// The checkpoints in `topic`, one per group-partition.
pub(super) fn follow_checkpoints(
    target: &Cluster,
    topic: &str,
    budget: Budget,
    out: &mut ClusterObservation,
) -> Option<std::sync::Arc<CheckpointIndex>> {
    let read = target.follow(
        topic,
        TailKind::Checkpoints,
        budget.next(Duration::from_secs(20)),
        |state| match state {
            TailState::Checkpoints(index) => Some(index.clone()),
            _ => None,
        },
    );
    followed(read, topic, out).flatten()
}

/// Whether every pattern is a plain name (no regular expression beyond `.`, which names use).
pub(super) fn plain_names(patterns: &[String]) -> bool {
    !patterns.is_empty()
        && patterns.iter().all(|p| {
            !p.is_empty()
                && !p.contains([
                    '\\', '^', '$', '|', '?', '*', '+', '(', ')', '[', ']', '{', '}',
                ])
        })
}

/// The source's topics (internal ones left out) and the partitions of those the flow copies.
pub(super) fn selected_topics(flow: &Flow, md: &rdkafka::metadata::Metadata) -> Selected {
    let policy = flow.policy.as_ref();
    let seen = md
        .topics()
        .iter()
        .filter(|t| !t.name().starts_with("__"))
        .count();
    let partitions = md
        .topics()
        .iter()
        .filter(|t| replicates(flow, policy, t.name()))
        .map(|t| t.partitions().len())
        .fold(0usize, usize::saturating_add);
    Selected {
        topics_seen: Some(seen),
        partitions: Some(partitions),
        groups: None,
        groups_forbidden: 0,
        topics_matched: None,
        groups_named: false,
        topics_named: plain_names(&flow.spec.topics),
    }
}

/// (groups `spec.groups` selects, groups listed) on the source; the list is the one the
/// group observations just read (shared for a while), so this asks nothing new.
pub(super) fn selected_groups(
    flow: &Flow,
    source: &Cluster,
    budget: Budget,
) -> Option<(usize, usize)> {
    let list = source.group_names(budget.next(TIMEOUT)).ok()?;
    let listed = list
        .iter()
        .filter(|g| !g.starts_with("mirrorflow."))
        .count();
    let matched = list
        .iter()
        .filter(|g| flow.groups.matches(g) && !g.starts_with("mirrorflow."))
        .count();
    Some((matched, listed))
}

/// What a tail gave; a topic that broke a bound is named in `out` (the first one, when
/// several did).
pub(super) fn followed<R>(
    read: Result<R, TailError>,
    topic: &str,
    out: &mut ClusterObservation,
) -> Option<R> {
    match read {
        Ok(r) => Some(r),
        Err(TailError::Unavailable) => None,
        Err(TailError::Refused(why)) => {
            out.unreadable_topic
                .get_or_insert_with(|| why.message(topic));
            None
        }
    }
}

/// When each source partition's remote partition was last found recreated (ms since the
/// epoch), from the gaps the replicator recorded.
pub(super) type Recreations = HashMap<(String, i32), i64>;

pub(super) fn recreations(gaps: &[Gap]) -> Recreations {
    let mut out = Recreations::new();
    for g in gaps
        .iter()
        .filter(|g| g.kind == positions::GapKind::TargetRewound)
    {
        let at = out
            .entry((g.topic.clone(), g.partition))
            .or_insert(g.detected_ms);
        *at = (*at).max(g.detected_ms);
    }
    out
}

/// The replicator's stored positions: per source partition, the next offset to copy.
pub(super) type Positions = HashMap<(String, i32), i64>;

/// What the probe takes from the positions topic.
pub(super) struct PositionsRead {
    positions: Positions,
    gaps: Vec<Gap>,
    conflict: Option<String>,
    refusals: Vec<Refusal>,
}

/// Sum over the mirrored source partitions of the records after the stored position. A
/// partition without a position counts whole (from its log start), since nothing of it is
/// known to be copied; a position behind the log start (retention) counts from the log start.
pub(super) fn replication_lag(
    flow: &Flow,
    source: &ProbeConsumer,
    md: &rdkafka::metadata::Metadata,
    copied: &Positions,
    budget: Budget,
) -> Option<i64> {
    let policy = flow.policy.as_ref();
    let mut ends = TopicPartitionList::new();
    let mut starts = TopicPartitionList::new();
    for t in md
        .topics()
        .iter()
        .filter(|t| replicates(flow, policy, t.name()))
    {
        for p in t.partitions() {
            ends.add_partition_offset(t.name(), p.id(), Offset::End)
                .ok()?;
            starts
                .add_partition_offset(t.name(), p.id(), Offset::Beginning)
                .ok()?;
        }
    }
    if ends.count() == 0 {
        return Some(0);
    }
    // One ListOffsets request per broker for all partitions, instead of one per partition.
    let ends = source.offsets_for_times(ends, budget.next(TIMEOUT)).ok()?;
    let starts = source
        .offsets_for_times(starts, budget.next(TIMEOUT))
        .ok()?;
    lag(&listed(&ends), &listed(&starts), copied)
}

/// Offsets a cluster answered, per (topic, partition).
pub(super) type Listed = HashMap<(String, i32), Offset>;

pub(super) fn listed(tpl: &TopicPartitionList) -> Listed {
    tpl.elements()
        .iter()
        .map(|e| ((e.topic().to_string(), e.partition()), e.offset()))
        .collect()
}

/// [`replication_lag`] from the source's log ends and starts: `None` when a partition's end or
/// start is not an offset (the answer failed for it), since a partial sum would understate.
pub(super) fn lag(ends: &Listed, starts: &Listed, copied: &Positions) -> Option<i64> {
    let mut lag = 0i64;
    for (partition, end) in ends {
        let Offset::Offset(end) = *end else {
            return None;
        };
        let Some(Offset::Offset(start)) = starts.get(partition).copied() else {
            return None;
        };
        let next = copied.get(partition).map_or(start, |n| (*n).max(start));
        lag = lag.saturating_add(end.saturating_sub(next).max(0));
    }
    Some(lag)
}

/// Whether the positions topic tells how far this flow copied (its lag, and what its groups
/// committed that is not copied yet). A flow whose source loop was never on has a positions
/// topic for its claim only: no position in it is no copy of its own (another tool may copy),
/// so no lag from it. Once it copied, its positions say how far, also while copying is off.
pub(super) fn positions_are_the_flows(flow: &Flow, positions: Option<&Positions>) -> bool {
    flow.spec.mode == FlowMode::Observe
        || flow.spec.source_loop.enabled
        || positions.is_some_and(|p| !p.is_empty())
}

/// A replication factor the target cannot give refuses every topic the replicator creates
/// there, its positions topic first: the replicator then waits at start and records nothing,
/// so while that topic is missing the probe says it from the spec and the target's broker
/// count (once it exists, the replicator records the refusals itself).
pub(super) fn replication_factor_refused(flow: &Flow, brokers: usize) -> Option<Refusal> {
    let rf = flow.spec.source_loop.replication_factor;
    let wanted = usize::try_from(rf).ok()?;
    (flow.spec.mode == FlowMode::Replicate && brokers > 0 && wanted > brokers).then(|| Refusal {
        topic: positions::positions_topic(flow.source_alias()),
        detected_ms: 0,
        message: format!(
            "spec.sourceLoop.replicationFactor is {rf} but the target has {brokers} broker(s), so it refuses every topic the replicator creates there (its positions, offset-syncs, checkpoints and heartbeats topics, and the remote topics); set it to at most {brokers}, or -1 for the target's default"
        ),
    })
}

/// The source's topics the flow copies.
pub(super) fn mirrored_topics<'a>(
    flow: &Flow,
    topics: impl Iterator<Item = &'a str>,
) -> Vec<&'a str> {
    let policy = flow.policy.as_ref();
    topics.filter(|t| replicates(flow, policy, t)).collect()
}

/// The replicator's rule for which source topics a flow copies.
pub(super) fn replicates(flow: &Flow, policy: &dyn ReplicationPolicy, topic: &str) -> bool {
    crate::mm2::topic_decision(
        policy,
        &flow.topics,
        topic,
        flow.source_alias(),
        flow.target_alias(),
    ) == crate::mm2::TopicDecision::Replicate
}
