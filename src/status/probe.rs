//! The status probe: what any user could read on the two clusters, read by the operator itself
//! so the status stays true when a replicator is down or wrong.
//!
//! Per probe (every status interval, per flow): metadata of both clusters, the newest record of
//! the target's `<source>.heartbeats`, the target's checkpoints topic (compacted: one record per
//! group-partition), and the committed offsets of the flow's groups on the source (at most
//! [`MAX_PROBED_GROUPS`] per probe, so a flow with thousands of groups costs a bounded amount).
//! The clients are shared and kept between probes ([`super::clients`]): the target's topics are
//! followed, so a probe reads only the records written since the previous one.
//!
//! A group is fresh when its checkpoints cover its committed offsets. Its "checkpoint age" is 0
//! then, whatever the age of the checkpoint record (an idle group needs no new checkpoint);
//! otherwise it is the time since the checkpoint of an uncovered partition last advanced, and the
//! records between the checkpoint and the commit are what a failover now would read again.

use crate::clock::{age, now_ms};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::acls::TopicAcls;
use super::clients::{Cluster, ProbeClients, ProbeConsumer, TailKind, TailState};
use super::{ClusterFault, GroupObservation, Observation};
use crate::api::FlowMode;
use crate::flow::Flow;
use crate::kafka::Side;
use crate::kafka::checkpoints::{CheckpointIndex, StoredCheckpoint};
use crate::kafka::positions::{self, Gap};
use crate::kafka::writers;
use crate::mm2::{ReplicationPolicy, TopicPartition};

pub const MAX_PROBED_GROUPS: usize = 50;
/// The longest a probe of one flow may take, whatever its clusters do.
pub const PROBE_BUDGET: Duration = Duration::from_secs(30);
/// The longest one request to a cluster may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The time a whole probe may take. Every request gets what is left (at most [`TIMEOUT`]), and
/// the probe stops asking once it is spent, so a cluster that accepts connections and never
/// answers costs one blocking thread for at most the budget, not one per request.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    deadline: std::time::Instant,
}

impl Budget {
    pub fn new(total: Duration) -> Self {
        Budget {
            deadline: std::time::Instant::now() + total,
        }
    }

    /// The timeout for the next request: what is left, at most `cap`; zero once spent.
    fn next(&self, cap: Duration) -> Duration {
        self.deadline
            .saturating_duration_since(std::time::Instant::now())
            .min(cap)
    }

    fn spent(&self) -> bool {
        self.next(TIMEOUT).is_zero()
    }
}

/// What the probe read from the clusters.
#[derive(Debug, Default, Clone)]
pub struct ClusterObservation {
    pub source_error: Option<ClusterFault>,
    pub target_error: Option<ClusterFault>,
    /// Age and emission time (ms since the epoch) of the newest replicated source heartbeat.
    pub heartbeat: Option<(Duration, i64)>,
    pub topics: Option<i32>,
    /// Source records not yet on the target (end offsets minus the replicator's stored
    /// positions); `None` when the positions topic is absent (source loop off, or MM2).
    pub replication_lag: Option<i64>,
    pub groups: Vec<GroupObservation>,
    /// Breaks in continuity recorded in the positions topic; `None` when it was not read.
    pub gaps: Option<Vec<Gap>>,
    /// Topic ACL sync as the clusters show it, and the refresh interval; `None` when not
    /// compared.
    pub topic_acls: Option<(TopicAcls, String)>,
    /// An older flow this one yields to ([`writers`]): the message naming it.
    pub conflict: Option<String>,
}

impl ClusterObservation {
    /// Copies what the probe saw into the observation the conditions are computed from.
    pub fn record_into(self, obs: &mut Observation) {
        obs.source_error = self.source_error;
        obs.target_error = self.target_error;
        obs.heartbeat_age = self.heartbeat.map(|(age, _)| age);
        obs.heartbeat_time = self.heartbeat.and_then(|(_, ts)| {
            k8s_openapi::jiff::Timestamp::from_millisecond(ts)
                .ok()
                .map(Time)
        });
        obs.topics = self.topics;
        obs.replication_lag = self.replication_lag;
        obs.groups = self.groups;
        obs.gaps = self.gaps;
        obs.topic_acls = self.topic_acls;
        obs.conflict = self.conflict;
    }
}

/// Keeps the most telling error librdkafka reported: a failed metadata request only says
/// "transport failure", while the client's error callback says why (credentials refused, TLS
/// handshake failed), which is what users need to see in the condition.
/// Shared clients live across probes: a cause is told only while recent (the client retries
/// and reports it again on every attempt), and a request that succeeds clears it.
#[derive(Default)]
pub struct ProbeContext {
    cause: Mutex<Option<(std::time::Instant, ClusterFault)>>,
    /// The client authenticates with SASL/OAUTHBEARER tokens from a token endpoint.
    oauthbearer: bool,
}

/// How long a reported cause explains a failed request.
const CAUSE_VALID: Duration = Duration::from_secs(60);

impl ProbeContext {
    pub(super) fn new(oauthbearer: bool) -> Self {
        ProbeContext {
            cause: Mutex::new(None),
            oauthbearer,
        }
    }

    fn recent_cause(&self) -> Option<ClusterFault> {
        let cause = self.cause.lock().ok()?;
        cause
            .as_ref()
            .filter(|(at, _)| at.elapsed() <= CAUSE_VALID)
            .map(|(_, f)| f.clone())
    }

    fn clear_cause(&self) {
        if let Ok(mut cause) = self.cause.lock() {
            *cause = None;
        }
    }
}

/// librdkafka's words when its OIDC client got no token (the token endpoint's answer or
/// libcurl's error follows).
const NO_TOKEN: &str = "Failed to acquire SASL OAUTHBEARER token";

/// The error codes a token endpoint answers a refused client credentials grant with (RFC 6749
/// section 5.2): librdkafka passes the answer's body on, without the HTTP status.
fn refuses_client_credentials(reason: &str) -> bool {
    [
        "invalid_client",
        "unauthorized_client",
        "invalid_scope",
        "invalid_grant",
        "invalid_request",
        "unsupported_grant_type",
        "access_denied",
    ]
    .iter()
    .any(|code| reason.contains(code))
}

impl ClientContext for ProbeContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let authentication = error.rdkafka_error_code() == Some(RDKafkaErrorCode::Authentication);
        let Some(fault) = classify(self.oauthbearer, authentication, reason) else {
            return;
        };
        if let Ok(mut cause) = self.cause.lock() {
            *cause = Some((std::time::Instant::now(), fault));
        }
    }
}

/// The fault a client error tells, if it tells one (others, like a broker going down, are
/// left to the request's own error). `authentication`: librdkafka's code says so.
fn classify(oauthbearer: bool, authentication: bool, reason: &str) -> Option<ClusterFault> {
    let authentication = authentication || reason.contains("SASL authentication");
    let fault = if oauthbearer && reason.contains(NO_TOKEN) {
        if refuses_client_credentials(reason) {
            ClusterFault::ClientCredentialsRefused(reason.to_string())
        } else {
            ClusterFault::TokenEndpointUnreachable(reason.to_string())
        }
    } else if oauthbearer && authentication {
        ClusterFault::TokenRefused(reason.to_string())
    } else if authentication {
        ClusterFault::Authentication(reason.to_string())
    } else if refuses_client_certificate(reason) {
        ClusterFault::CertificateRefused(reason.to_string())
    } else if reason.contains("SSL handshake failed") {
        ClusterFault::Tls(reason.to_string())
    } else {
        return None;
    };
    Some(fault)
}

impl ConsumerContext for ProbeContext {}

/// The TLS alerts a broker sends when it refuses the client's certificate (OpenSSL's words);
/// our own refusal of the broker's certificate reads "certificate verify failed" instead.
fn refuses_client_certificate(reason: &str) -> bool {
    [
        "alert bad certificate",
        "alert certificate required",
        "alert unknown ca",
        "alert certificate unknown",
        "alert certificate expired",
        "alert handshake failure",
    ]
    .iter()
    .any(|alert| reason.contains(alert))
}

/// The client's own explanation when it has one, else the request's error.
fn fault(cluster: &Cluster, error: &KafkaError) -> ClusterFault {
    // Client errors arrive as events on the consumer's queue: polling hands them to the
    // context (records of followed topics go to their tails).
    cluster.pump(Duration::from_millis(500));
    cluster
        .client()
        .context()
        .recent_cause()
        .unwrap_or_else(|| ClusterFault::Unreachable(error.to_string()))
}

/// The flow's probe client settings, made shareable: the client id the flow's own clients
/// carry (`mirrorflow-<alias>`) would keep apart flows that differ only in alias; a client id
/// the flow set itself stays (it may carry a quota).
fn shared_config(config: &ClientConfig, alias: &str) -> ClientConfig {
    let mut c = config.clone();
    if c.get("client.id") == Some(format!("mirrorflow-{alias}").as_str()) {
        c.set("client.id", "mirrorflow-operator-probe");
    }
    c
}

/// The ids the source and target brokers report (`None` for a side that did not answer);
/// blocking. Two names for one cluster (a load balancer and a broker list) share one id.
pub fn cluster_ids(flow: &Flow) -> (Option<String>, Option<String>) {
    cluster_ids_with(&ProbeClients::default(), "", flow)
}

/// [`cluster_ids`] with the clients `clients` keeps for `namespace`.
pub fn cluster_ids_with(
    clients: &ProbeClients,
    namespace: &str,
    flow: &Flow,
) -> (Option<String>, Option<String>) {
    let id = |config: &ClientConfig, alias: &str| {
        clients
            .cluster(namespace, &shared_config(config, alias))
            .ok()?
            .client()
            .client()
            .fetch_cluster_id(TIMEOUT)
    };
    (
        id(&flow.source_probe_client, flow.source_alias()),
        id(&flow.target_probe_client, flow.target_alias()),
    )
}

/// Runs the whole probe within `budget` with clients of its own; blocking (the CLI's one-off
/// probe).
pub fn observe(flow: &Flow, budget: Budget) -> ClusterObservation {
    observe_with(&ProbeClients::default(), "", flow, budget)
}

/// Runs the whole probe within `budget` with the clients `clients` keeps for `namespace`;
/// blocking (call it from `spawn_blocking`).
pub fn observe_with(
    clients: &ProbeClients,
    namespace: &str,
    flow: &Flow,
    budget: Budget,
) -> ClusterObservation {
    let mut out = observe_clusters(clients, namespace, flow, budget);
    // A flow that syncs ACLs always has the condition: one the probe could not compare says
    // so rather than vanishing from the status until the next probe.
    if syncs_topic_acls(flow) && out.topic_acls.is_none() {
        out.topic_acls = Some((
            acls_not_compared(out.source_error.as_ref(), out.target_error.as_ref()),
            flow.spec.source_loop.topics_refresh_interval.to_string(),
        ));
    }
    out
}

/// Why the probe has no ACL comparison: the cluster that failed (the source when both did), or
/// the budget.
fn acls_not_compared(
    source_error: Option<&ClusterFault>,
    target_error: Option<&ClusterFault>,
) -> TopicAcls {
    let side = match (source_error, target_error) {
        (None, Some(_)) => Side::Target,
        _ => Side::Source,
    };
    let error = if source_error.is_some() || target_error.is_some() {
        "the cluster cannot be used (see the Ready condition)"
    } else {
        "the probe ran out of time before comparing them"
    };
    TopicAcls::Unreadable {
        side,
        error: error.into(),
    }
}

/// `spec.sourceLoop.syncTopicAcls` applies: the flow's own source loop copies ACLs.
fn syncs_topic_acls(flow: &Flow) -> bool {
    let spec = &flow.spec;
    spec.source_loop.enabled
        && spec.source_loop.sync_topic_acls
        && spec.mode == crate::api::FlowMode::Replicate
}

fn observe_clusters(
    clients: &ProbeClients,
    namespace: &str,
    flow: &Flow,
    budget: Budget,
) -> ClusterObservation {
    let mut out = ClusterObservation::default();
    let policy = flow.policy.as_ref();
    let target_config = shared_config(&flow.target_probe_client, flow.target_alias());
    let target = match clients.cluster(namespace, &target_config) {
        Ok(c) => c,
        Err(e) => {
            out.target_error = Some(ClusterFault::Unreachable(e.to_string()));
            return out;
        }
    };
    let source_config = shared_config(&flow.source_probe_client, flow.source_alias());
    let source = match clients.cluster(namespace, &source_config) {
        Ok(c) => c,
        Err(e) => {
            out.source_error = Some(ClusterFault::Unreachable(e.to_string()));
            return out;
        }
    };
    let source_md = source.metadata(budget.next(TIMEOUT));
    match &source_md {
        Ok(md) => {
            source.client().context().clear_cause();
            out.topics = Some(mirrored_topics(flow, md.topics().iter().map(|t| t.name())));
        }
        Err(e) => out.source_error = Some(fault(&source, e)),
    }
    let target_md = match target.metadata(budget.next(TIMEOUT)) {
        Ok(md) => {
            target.client().context().clear_cause();
            md
        }
        Err(e) => {
            out.target_error = Some(fault(&target, &e));
            return out;
        }
    };
    // A topic the target does not have is not asked for: librdkafka waits out the whole
    // timeout for the offsets of an unknown topic.
    let on_target = |name: &str| {
        let there = target_md
            .topics()
            .iter()
            .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty());
        if !there {
            target.forget(name);
        }
        there
    };
    let positions_topic = positions::positions_topic(flow.source_alias());
    let positions = if on_target(&positions_topic) {
        let read = target.follow(
            &positions_topic,
            TailKind::Positions,
            budget.next(2 * TIMEOUT),
            |state| match state {
                TailState::Positions {
                    positions,
                    gaps,
                    claims,
                } => Some((
                    positions
                        .iter()
                        .map(|(k, f)| (k.clone(), f.next))
                        .collect::<Positions>(),
                    gaps.as_ref().clone(),
                    // Only a flow that writes yields; an Observe flow reads whoever writes.
                    (flow.spec.mode == FlowMode::Replicate)
                        .then(|| writers::yields_to(&flow.writer, claims, now_ms()))
                        .flatten()
                        .map(|older| writers::yield_message(older, flow.source_alias())),
                )),
                _ => None,
            },
        );
        let read = read.flatten();
        out.gaps = read.as_ref().map(|(_, gaps, _)| gaps.clone());
        out.conflict = read.as_ref().and_then(|(_, _, conflict)| conflict.clone());
        read.map(|(positions, _, _)| positions)
    } else {
        // Nothing copied yet (or another tool replicates): nothing can have been skipped.
        out.gaps = Some(Vec::new());
        None
    };
    let copies = positions_are_the_flows(flow, positions.as_ref());
    if let (Ok(md), Some(copied), true) = (&source_md, &positions, copies) {
        out.replication_lag = replication_lag(flow, source.client(), md, copied, budget);
    }

    let hb_topic = policy.format_remote_topic(flow.source_alias(), policy.heartbeats_topic());
    out.heartbeat = on_target(&hb_topic)
        .then(|| {
            target.follow(
                &hb_topic,
                TailKind::Heartbeats,
                budget.next(TIMEOUT),
                |state| match state {
                    TailState::Heartbeat(newest) => *newest,
                    _ => None,
                },
            )
        })
        .flatten()
        .flatten()
        .map(|ts| (age(ts), ts));

    // Unreadable (absent, or the target just went away): no checkpoints, and the groups say so.
    let checkpoints_topic = policy.checkpoints_topic(flow.source_alias());
    let checkpoints = on_target(&checkpoints_topic)
        .then(|| {
            target.follow(
                &checkpoints_topic,
                TailKind::Checkpoints,
                budget.next(Duration::from_secs(20)),
                |state| match state {
                    TailState::Checkpoints(index) => Some(index.clone()),
                    _ => None,
                },
            )
        })
        .flatten()
        .flatten()
        .unwrap_or_default();
    if syncs_topic_acls(flow) && source_md.is_ok() && !budget.spent() {
        let seen = super::acls::observe(
            source.client().client(),
            target.client().client(),
            |topic| {
                replicates(flow, policy, topic)
                    .then(|| policy.format_remote_topic(flow.source_alias(), topic))
            },
            || budget.next(TIMEOUT),
        );
        out.topic_acls = Some((
            seen,
            flow.spec.source_loop.topics_refresh_interval.to_string(),
        ));
    }
    let recreated = recreations(out.gaps.as_deref().unwrap_or_default());
    if let Ok(md) = &source_md {
        out.groups = group_observations(
            flow,
            &source,
            md,
            &checkpoints,
            positions.as_ref().filter(|_| copies),
            &recreated,
            budget,
        );
    }
    out
}

/// When each source partition's remote partition was last found recreated (ms since the
/// epoch), from the gaps the replicator recorded.
type Recreations = HashMap<(String, i32), i64>;

fn recreations(gaps: &[Gap]) -> Recreations {
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
type Positions = HashMap<(String, i32), i64>;

/// Sum over the mirrored source partitions of the records after the stored position. A
/// partition without a position counts whole (from its log start), since nothing of it is
/// known to be copied; a position behind the log start (retention) counts from the log start.
fn replication_lag(
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
type Listed = HashMap<(String, i32), Offset>;

fn listed(tpl: &TopicPartitionList) -> Listed {
    tpl.elements()
        .iter()
        .map(|e| ((e.topic().to_string(), e.partition()), e.offset()))
        .collect()
}

/// [`replication_lag`] from the source's log ends and starts: `None` when a partition's end or
/// start is not an offset (the answer failed for it), since a partial sum would understate.
fn lag(ends: &Listed, starts: &Listed, copied: &Positions) -> Option<i64> {
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
fn positions_are_the_flows(flow: &Flow, positions: Option<&Positions>) -> bool {
    flow.spec.mode == FlowMode::Observe
        || flow.spec.source_loop.enabled
        || positions.is_some_and(|p| !p.is_empty())
}

/// How many of the source's topics the flow copies.
fn mirrored_topics<'a>(flow: &Flow, topics: impl Iterator<Item = &'a str>) -> i32 {
    let policy = flow.policy.as_ref();
    let count = topics.filter(|t| replicates(flow, policy, t)).count();
    i32::try_from(count).unwrap_or(i32::MAX)
}

/// The replicator's rule for which source topics a flow copies.
fn replicates(flow: &Flow, policy: &dyn ReplicationPolicy, topic: &str) -> bool {
    crate::mm2::topic_decision(
        policy,
        &flow.topics,
        topic,
        flow.source_alias(),
        flow.target_alias(),
    ) == crate::mm2::TopicDecision::Replicate
}

/// `source` and `md` are the probe's own client and metadata of the source cluster.
fn group_observations(
    flow: &Flow,
    source: &Cluster,
    md: &rdkafka::metadata::Metadata,
    checkpoints: &CheckpointIndex,
    positions: Option<&Positions>,
    recreated: &Recreations,
    budget: Budget,
) -> Vec<GroupObservation> {
    let policy = flow.policy.as_ref();
    let Ok(list) = source.group_names(budget.next(TIMEOUT)) else {
        return Vec::new();
    };
    let mut tpl = TopicPartitionList::new();
    for t in md
        .topics()
        .iter()
        .filter(|t| replicates(flow, policy, t.name()))
    {
        for p in t.partitions() {
            tpl.add_partition(t.name(), p.id());
        }
    }
    let mut out = Vec::new();
    for group in groups_to_probe(flow, &list, checkpoints) {
        // The groups not probed this time keep no row; the next probe starts again.
        if budget.spent() {
            break;
        }
        let Ok(committed) = source.committed(&group, &tpl, budget.next(TIMEOUT)) else {
            continue;
        };
        let cps = checkpoints.get(&group);
        let committed = listed(&committed);
        out.extend(observe_group(
            flow, group, &committed, cps, positions, recreated, age,
        ));
    }
    out
}

/// The groups a probe asks about, in order: the flow's groups on the source (not the
/// replicator's own) and every group with checkpoints, by name, at most [`MAX_PROBED_GROUPS`].
fn groups_to_probe(flow: &Flow, listed: &[String], checkpoints: &CheckpointIndex) -> Vec<String> {
    let mut names: Vec<String> = listed
        .iter()
        .filter(|g| flow.groups.matches(g) && !g.starts_with("mirrorflow."))
        .cloned()
        .collect();
    for g in checkpoints.keys() {
        if !names.contains(g) {
            names.push(g.clone());
        }
    }
    names.sort();
    names.truncate(MAX_PROBED_GROUPS);
    names
}

/// What one group's committed source offsets and its checkpoints say about a failover now;
/// `None` when it committed nothing on the mirrored partitions. `age` turns a time (ms since
/// the epoch) into how long ago it was.
fn observe_group(
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
                let up = stored.checkpoint.upstream_offset;
                let written = stored.written_ms.unwrap_or(0);
                newest_written = Some(newest_written.map_or(written, |n| n.max(written)));
                if up < c {
                    replay = replay.saturating_add(c.saturating_sub(up));
                    stale_since = Some(stale_since.map_or(written, |s| s.min(written)));
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
    Some(GroupObservation {
        group,
        checkpoint_age,
        replay_records: replay,
        uncopied_records: uncopied,
        invalidated_checkpoints: invalidated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm2::Checkpoint;
    use proptest::prelude::*;

    /// A flow from alias `a` to `b` (remote topics `a.<topic>`), with `extra` spec lines.
    fn flow(extra: &str) -> Flow {
        crate::flow::test_flow("ns/f", extra)
    }

    fn offsets(items: &[(&str, i32, Offset)]) -> Listed {
        items
            .iter()
            .map(|(t, p, o)| ((t.to_string(), *p), *o))
            .collect()
    }

    fn positions(items: &[(&str, i32, i64)]) -> Positions {
        items
            .iter()
            .map(|(t, p, o)| ((t.to_string(), *p), *o))
            .collect()
    }

    const NOW: i64 = 1_800_000_000_000;

    fn age_at_now(since: i64) -> Duration {
        Duration::from_millis(u64::try_from(NOW.saturating_sub(since)).unwrap_or(0))
    }

    /// Checkpoints of `group` on the remote topic `a.orders`: (partition, upstream offset,
    /// written ms).
    fn checkpoints(
        group: &str,
        items: &[(i32, i64, Option<i64>)],
    ) -> BTreeMap<TopicPartition, StoredCheckpoint> {
        items
            .iter()
            .map(|&(partition, upstream_offset, written_ms)| {
                let topic_partition = TopicPartition::new("a.orders", partition);
                let checkpoint = Checkpoint {
                    group: group.into(),
                    topic_partition: topic_partition.clone(),
                    upstream_offset,
                    downstream_offset: upstream_offset,
                    metadata: String::new(),
                };
                (
                    topic_partition,
                    StoredCheckpoint {
                        checkpoint,
                        written_ms,
                    },
                )
            })
            .collect()
    }

    fn commits(items: &[(i32, i64)]) -> Listed {
        items
            .iter()
            .map(|&(p, o)| (("orders".to_string(), p), Offset::Offset(o)))
            .collect()
    }

    #[test]
    fn a_budget_caps_each_request_and_is_spent_at_its_deadline() {
        let long = Budget::new(Duration::from_secs(60));
        assert_eq!(long.next(TIMEOUT), TIMEOUT);
        assert!(!long.spent());
        let short = Budget::new(Duration::from_secs(2));
        assert!(short.next(TIMEOUT) <= Duration::from_secs(2));
        assert!(!short.next(TIMEOUT).is_zero());
        let gone = Budget::new(Duration::ZERO);
        assert_eq!(gone.next(TIMEOUT), Duration::ZERO);
        assert!(gone.spent());
    }

    #[test]
    fn the_lag_counts_the_records_after_each_stored_position_within_the_log() {
        let ends = offsets(&[
            ("t", 0, Offset::Offset(100)),
            ("t", 1, Offset::Offset(50)),
            ("u", 0, Offset::Offset(30)),
            ("u", 1, Offset::Offset(70)),
        ]);
        let starts = offsets(&[
            ("t", 0, Offset::Offset(0)),
            ("t", 1, Offset::Offset(40)),
            ("u", 0, Offset::Offset(5)),
            ("u", 1, Offset::Offset(0)),
        ]);
        let copied = positions(&[
            ("t", 0, 90),
            // Behind the log start (retention): counted from the start.
            ("t", 1, 10),
            // Past the end (a recreated source topic): nothing left, not a negative count.
            ("u", 1, 95),
            // A topic no longer mirrored adds nothing.
            ("gone", 0, 0),
        ]);
        // t-0: 10, t-1: 10, u-0 (no position, counted from its start): 25, u-1: 0.
        assert_eq!(lag(&ends, &starts, &copied), Some(45));
        assert_eq!(lag(&Listed::new(), &Listed::new(), &copied), Some(0));
    }

    #[test]
    fn a_partition_whose_offsets_were_not_answered_makes_the_lag_unknown() {
        let starts = offsets(&[("t", 0, Offset::Offset(0)), ("t", 1, Offset::Offset(0))]);
        let copied = positions(&[("t", 0, 1), ("t", 1, 1)]);
        let no_end = offsets(&[("t", 0, Offset::Offset(9)), ("t", 1, Offset::Invalid)]);
        assert_eq!(lag(&no_end, &starts, &copied), None);
        let ends = offsets(&[("t", 0, Offset::Offset(9)), ("t", 1, Offset::Offset(9))]);
        let no_start = offsets(&[("t", 0, Offset::Offset(0))]);
        assert_eq!(lag(&ends, &no_start, &copied), None);
    }

    proptest! {
        #[test]
        fn the_lag_is_never_negative_nor_more_than_the_logs_hold(
            logs in prop::collection::vec((any::<i64>(), any::<i64>(), prop::option::of(any::<i64>())), 0..6),
        ) {
            let mut ends = Listed::new();
            let mut starts = Listed::new();
            let mut copied = Positions::new();
            let mut held = 0i64;
            for (p, (start, end, position)) in (0i32..).zip(&logs) {
                let key = ("t".to_string(), p);
                ends.insert(key.clone(), Offset::Offset(*end));
                starts.insert(key.clone(), Offset::Offset(*start));
                if let Some(n) = position {
                    copied.insert(key, *n);
                }
                held = held.saturating_add(end.saturating_sub(*start).max(0));
            }
            let Some(found) = lag(&ends, &starts, &copied) else {
                return Err(TestCaseError::fail("every offset was answered"));
            };
            prop_assert!(found >= 0);
            prop_assert!(found <= held);
            prop_assert_eq!(lag(&ends, &starts, &Positions::new()), Some(held));
        }
    }

    #[test]
    fn a_group_whose_checkpoints_cover_its_commits_is_fresh_whatever_their_age() {
        let cps = checkpoints("g", &[(0, 10, Some(NOW - 3_600_000)), (1, 7, Some(NOW))]);
        let seen = observe_group(
            &flow(""),
            "g".into(),
            &commits(&[(0, 10), (1, 5)]),
            Some(&cps),
            None,
            &Recreations::new(),
            age_at_now,
        );
        assert_eq!(
            seen,
            Some(GroupObservation {
                group: "g".into(),
                checkpoint_age: Some(Duration::ZERO),
                replay_records: 0,
                uncopied_records: 0,
                invalidated_checkpoints: 0,
            })
        );
    }

    #[test]
    fn a_stale_group_is_as_old_as_its_oldest_uncovered_checkpoint() {
        let cps = checkpoints(
            "g",
            &[
                (0, 10, Some(NOW - 30_000)),
                (1, 5, Some(NOW - 10_000)),
                // Covered: its age does not matter.
                (2, 3, Some(NOW - 90_000)),
            ],
        );
        let seen = observe_group(
            &flow(""),
            "g".into(),
            &commits(&[(0, 20), (1, 15), (2, 3)]),
            Some(&cps),
            None,
            &Recreations::new(),
            age_at_now,
        )
        .unwrap();
        assert_eq!(seen.checkpoint_age, Some(Duration::from_secs(30)));
        assert_eq!(seen.replay_records, 20);
    }

    #[test]
    fn a_committed_partition_without_a_checkpoint_leaves_the_age_unknown_and_replays_whole() {
        let cps = checkpoints("g", &[(0, 10, Some(NOW - 1_000))]);
        let seen = observe_group(
            &flow(""),
            "g".into(),
            &commits(&[(0, 12), (1, 8)]),
            Some(&cps),
            None,
            &Recreations::new(),
            age_at_now,
        )
        .unwrap();
        assert_eq!(seen.checkpoint_age, None);
        assert_eq!(seen.replay_records, 2 + 8);
        let none = observe_group(
            &flow(""),
            "g".into(),
            &commits(&[(0, 12)]),
            None,
            None,
            &Recreations::new(),
            age_at_now,
        )
        .unwrap();
        assert_eq!((none.checkpoint_age, none.replay_records), (None, 12));
    }

    #[test]
    fn a_checkpoint_written_before_its_remote_partition_was_recreated_is_invalidated() {
        let recreated = Recreations::from([
            (("orders".to_string(), 0), NOW - 5_000),
            (("orders".to_string(), 1), NOW - 5_000),
            (("orders".to_string(), 2), NOW - 5_000),
        ]);
        let cps = checkpoints(
            "g",
            &[
                (0, 10, Some(NOW - 10_000)),
                // Written from the new log: valid.
                (1, 10, Some(NOW - 1_000)),
                // When it was written is unknown: it may point into the old log.
                (2, 10, None),
            ],
        );
        let seen = observe_group(
            &flow(""),
            "g".into(),
            &commits(&[(0, 10), (1, 10), (2, 10), (3, 1)]),
            Some(&cps),
            None,
            &recreated,
            age_at_now,
        )
        .unwrap();
        assert_eq!(seen.invalidated_checkpoints, 2);
    }

    #[test]
    fn commits_past_the_stored_positions_count_as_uncopied_only_when_positions_are_known() {
        let cps = checkpoints("g", &[(0, 10, Some(NOW)), (1, 4, Some(NOW))]);
        let copied = positions(&[("orders", 0, 15), ("orders", 1, 9)]);
        let observe = |positions| {
            observe_group(
                &flow(""),
                "g".into(),
                &commits(&[(0, 20), (1, 4), (2, 6)]),
                Some(&cps),
                positions,
                &Recreations::new(),
                age_at_now,
            )
            .unwrap()
        };
        // Partition 2 has no position: nothing of it was copied.
        assert_eq!(observe(Some(&copied)).uncopied_records, 5 + 6);
        assert_eq!(observe(None).uncopied_records, 0);
    }

    #[test]
    fn a_group_without_commits_on_the_mirrored_partitions_has_no_row() {
        let nothing = offsets(&[("orders", 0, Offset::Invalid)]);
        let seen = observe_group(
            &flow(""),
            "g".into(),
            &nothing,
            None,
            None,
            &Recreations::new(),
            age_at_now,
        );
        assert_eq!(seen, None);
    }

    proptest! {
        #[test]
        fn replayed_and_uncopied_records_are_never_negative(
            parts in prop::collection::vec(
                (0..i64::MAX, prop::option::of(any::<i64>()), prop::option::of(any::<i64>())),
                1..5,
            ),
        ) {
            let mut committed = Listed::new();
            let mut cps = Vec::new();
            let mut copied = Positions::new();
            for (p, (commit, upstream, position)) in (0i32..).zip(&parts) {
                committed.insert(("orders".to_string(), p), Offset::Offset(*commit));
                if let Some(up) = upstream {
                    cps.push((p, *up, Some(NOW)));
                }
                if let Some(n) = position {
                    copied.insert(("orders".to_string(), p), *n);
                }
            }
            let cps = checkpoints("g", &cps);
            let seen = observe_group(
                &flow(""),
                "g".into(),
                &committed,
                Some(&cps),
                Some(&copied),
                &Recreations::new(),
                age_at_now,
            );
            let Some(seen) = seen else {
                return Err(TestCaseError::fail("every partition has a commit"));
            };
            prop_assert!(seen.replay_records >= 0);
            prop_assert!(seen.uncopied_records >= 0);
        }
    }

    #[test]
    fn the_probe_asks_about_the_flows_groups_and_every_checkpointed_group_by_name() {
        let listed: Vec<String> = [
            "orders-app",
            "console-consumer-1",
            "mirrorflow.f.source",
            "b-app",
        ]
        .map(String::from)
        .into();
        let index = CheckpointIndex::from([
            ("zz-old".to_string(), BTreeMap::new()),
            ("b-app".to_string(), BTreeMap::new()),
        ]);
        assert_eq!(
            groups_to_probe(&flow(""), &listed, &index),
            ["b-app", "orders-app", "zz-old"]
        );
        let many: Vec<String> = (0..MAX_PROBED_GROUPS + 10)
            .rev()
            .map(|i| format!("g{i:03}"))
            .collect();
        let probed = groups_to_probe(&flow(""), &many, &CheckpointIndex::new());
        assert_eq!(probed.len(), MAX_PROBED_GROUPS);
        assert_eq!(probed.first().map(String::as_str), Some("g000"));
    }

    #[test]
    fn the_probe_counts_the_topics_the_replicator_mirrors() {
        let flow = flow("topics: ['orders', 'payments']\n");
        let names = [
            "orders",
            "payments",
            "other",
            "heartbeats",
            "b.orders",
            "b.heartbeats",
            "__consumer_offsets",
            "mm2-offset-syncs.b.internal",
            "a.checkpoints.internal",
        ];
        let filters = crate::mm2::Filters {
            topics: flow.topics.clone(),
            groups: flow.groups.clone(),
        };
        let listing = names.iter().map(|t| (t.to_string(), 1)).collect();
        let plan = crate::replicator::source::topics::plan(
            &filters,
            flow.policy.as_ref(),
            "a",
            "b",
            &listing,
            &BTreeMap::new(),
        );
        assert_eq!(plan.mirrored.len(), 3);
        assert_eq!(mirrored_topics(&flow, names.into_iter()), 3);
    }

    #[test]
    fn only_a_flow_that_copies_or_copied_is_judged_by_the_positions_topic() {
        let copied = positions(&[("orders", 0, 5)]);
        let empty = Positions::new();
        let off = flow("sourceLoop: {enabled: false}\n");
        assert!(!positions_are_the_flows(&off, Some(&empty)));
        assert!(!positions_are_the_flows(&off, None));
        assert!(positions_are_the_flows(&off, Some(&copied)));
        assert!(positions_are_the_flows(&flow(""), Some(&empty)));
        assert!(positions_are_the_flows(
            &flow("mode: Observe\n"),
            Some(&empty)
        ));
    }

    #[test]
    fn acls_not_compared_name_the_cluster_that_failed_or_the_budget() {
        let down = ClusterFault::Unreachable("down".into());
        let unusable = "the cluster cannot be used (see the Ready condition)".to_string();
        assert_eq!(
            acls_not_compared(None, Some(&down)),
            TopicAcls::Unreadable {
                side: Side::Target,
                error: unusable.clone()
            }
        );
        assert_eq!(
            acls_not_compared(Some(&down), Some(&down)),
            TopicAcls::Unreadable {
                side: Side::Source,
                error: unusable
            }
        );
        assert_eq!(
            acls_not_compared(None, None),
            TopicAcls::Unreadable {
                side: Side::Source,
                error: "the probe ran out of time before comparing them".into()
            }
        );
    }

    #[test]
    fn a_heartbeat_time_out_of_range_is_left_out_rather_than_wrong() {
        let mut obs = Observation::default();
        ClusterObservation {
            heartbeat: Some((Duration::from_secs(3), i64::MAX)),
            ..Default::default()
        }
        .record_into(&mut obs);
        assert_eq!(obs.heartbeat_age, Some(Duration::from_secs(3)));
        assert_eq!(obs.heartbeat_time, None);
        ClusterObservation {
            heartbeat: Some((Duration::ZERO, 1_700_000_000_000)),
            ..Default::default()
        }
        .record_into(&mut obs);
        assert_eq!(
            obs.heartbeat_time.map(|t| t.0.as_millisecond()),
            Some(1_700_000_000_000)
        );
    }

    #[test]
    fn the_flows_default_client_id_is_shared_and_its_own_is_kept() {
        let mut config = ClientConfig::new();
        config.set("client.id", "mirrorflow-a");
        assert_eq!(
            shared_config(&config, "a").get("client.id"),
            Some("mirrorflow-operator-probe")
        );
        config.set("client.id", "quota-holder");
        assert_eq!(
            shared_config(&config, "a").get("client.id"),
            Some("quota-holder")
        );
    }

    #[test]
    fn client_errors_tell_credentials_certificates_and_handshakes_apart() {
        assert!(matches!(
            classify(false, true, "broker: authentication failed"),
            Some(ClusterFault::Authentication(_))
        ));
        assert!(matches!(
            classify(
                false,
                false,
                "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed"
            ),
            Some(ClusterFault::Tls(_))
        ));
        assert!(matches!(
            classify(false, false, "SSL handshake failed: tlsv1 alert unknown ca"),
            Some(ClusterFault::CertificateRefused(_))
        ));
        // Token words mean nothing to a client that uses no tokens.
        assert_eq!(
            classify(false, false, "Failed to acquire SASL OAUTHBEARER token: x"),
            None
        );
    }

    #[test]
    fn the_newest_recreation_of_each_remote_partition_counts() {
        let gap = |topic: &str, kind, at| Gap {
            topic: topic.into(),
            partition: 0,
            kind,
            from: 20,
            to: 0,
            detected_ms: at,
        };
        let found = recreations(&[
            gap("t", positions::GapKind::TargetRewound, 5),
            gap("t", positions::GapKind::TargetRewound, 9),
            gap("u", positions::GapKind::SourceTruncated, 7),
        ]);
        assert_eq!(found, Recreations::from([(("t".to_string(), 0), 9)]));
    }

    #[test]
    fn oauthbearer_errors_tell_the_endpoint_the_credentials_and_the_brokers_apart() {
        // What librdkafka reported against the world's token endpoint and brokers.
        let fault = |auth, reason| classify(true, auth, reason);
        assert!(matches!(
            fault(
                true,
                r#"Failed to acquire SASL OAUTHBEARER token: {"error": "invalid_client", "error_description": "unknown client or wrong secret"}"#
            ),
            Some(ClusterFault::ClientCredentialsRefused(_))
        ));
        assert!(matches!(
            fault(
                true,
                "Failed to acquire SASL OAUTHBEARER token: Failed to connect to 127.0.0.1:39713 after 0 ms: Could not connect to server"
            ),
            Some(ClusterFault::TokenEndpointUnreachable(_))
        ));
        assert!(matches!(
            fault(
                true,
                "Failed to acquire SASL OAUTHBEARER token: Response is not JSON encoded: text/html"
            ),
            Some(ClusterFault::TokenEndpointUnreachable(_))
        ));
        assert!(matches!(
            fault(
                false,
                r#"sasl_plaintext://127.0.0.1:19396/bootstrap: SASL authentication error: {"status":"invalid_token"} (after 303ms in state AUTH_REQ)"#
            ),
            Some(ClusterFault::TokenRefused(_))
        ));
        // The same broker refusal with a password is the credentials' fault.
        assert!(matches!(
            classify(
                false,
                false,
                "SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
            ),
            Some(ClusterFault::Authentication(_))
        ));
        assert_eq!(fault(false, "1/1 brokers are down"), None);
    }

    #[test]
    fn a_refused_client_certificate_is_told_from_a_broker_we_do_not_trust() {
        assert!(refuses_client_certificate(
            "ssl://127.0.0.1:19095/bootstrap: SSL handshake failed: ssl/record/rec_layer_s3.c:1605: error:0A000418:SSL routines::tlsv1 alert unknown ca"
        ));
        assert!(refuses_client_certificate(
            "SSL handshake failed: error:0A00045C:SSL routines::tlsv13 alert certificate required"
        ));
        // What the world's brokers answered to an unknown certificate and to none (TLS 1.3:
        // the alert comes after the handshake, on the first read).
        assert!(refuses_client_certificate(
            "ssl://127.0.0.1:19095/bootstrap: Receive failed: error:0A000412:SSL routines::sslv3 alert bad certificate: SSL alert number 42 (after 6ms in state APIVERSION_QUERY)"
        ));
        assert!(!refuses_client_certificate(
            "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified"
        ));
    }
}
