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
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::acls::TopicAcls;
use super::clients::{Cluster, ProbeClients, ProbeConsumer, TailKind, TailState};
use super::diagnose::{self, Diagnosis};
use super::tails::TailError;
use super::{ClusterFault, Conservative, GroupObservation, Observation, Selected};
use crate::api::FlowMode;
use crate::flow::Flow;
use crate::kafka::Side;
use crate::kafka::checkpoints::{CheckpointIndex, StoredCheckpoint};
use crate::kafka::positions::{self, Gap};
use crate::kafka::refusals::Refusal;
use crate::kafka::writers;
use crate::mm2::{ReplicationPolicy, TopicPartition};

pub const MAX_PROBED_GROUPS: usize = 500;
/// Groups whose committed offsets are asked for at once (one OffsetFetch each, in flight
/// together on the shared client).
const GROUPS_AT_ONCE: usize = 50;
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
    /// What the flow's selection was matched against on the source ([`Selected`]).
    pub selected: Selected,
    /// Source records not yet on the target (end offsets minus the replicator's stored
    /// positions); `None` when the positions topic is absent (source loop off, or MM2).
    pub replication_lag: Option<i64>,
    pub groups: Vec<GroupObservation>,
    /// Share groups the flow's selection matches whose start offsets could not be read, with
    /// why ([`Observation::share_groups`]).
    pub share_groups: Vec<(String, String)>,
    /// Breaks in continuity recorded in the positions topic; `None` when it was not read.
    pub gaps: Option<Vec<Gap>>,
    /// Topic ACL sync as the clusters show it, and the refresh interval; `None` when not
    /// compared.
    pub topic_acls: Option<(TopicAcls, String)>,
    /// An older flow this one yields to ([`writers`]): the message naming it.
    pub conflict: Option<String>,
    /// Topic changes the clusters refused the replicator; `None` when not read.
    pub refusals: Option<Vec<Refusal>>,
    /// A target topic the probe stopped reading because it broke a bound
    /// ([`super::tails`]): the message naming it.
    pub unreadable_topic: Option<String>,
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
        obs.selected = self.selected;
        obs.replication_lag = self.replication_lag;
        obs.groups = self.groups;
        obs.share_groups = self.share_groups;
        obs.gaps = self.gaps;
        obs.topic_acls = self.topic_acls;
        obs.conflict = self.conflict;
        obs.refusals = self.refusals;
        obs.unreadable_topic = self.unreadable_topic;
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
    /// When the listener was last diagnosed and what was found ([`diagnose`]).
    diagnosed: Mutex<Option<(std::time::Instant, Option<Diagnosis>)>>,
}

/// How long a reported cause explains a failed request.
const CAUSE_VALID: Duration = Duration::from_secs(60);
/// How often a client's listener is diagnosed at most.
const DIAGNOSE_EVERY: Duration = Duration::from_secs(60);
/// The longest one diagnosis may take.
const DIAGNOSIS_TIME: Duration = Duration::from_secs(8);

impl ProbeContext {
    pub(super) fn new(oauthbearer: bool) -> Self {
        ProbeContext {
            cause: Mutex::new(None),
            oauthbearer,
            diagnosed: Mutex::new(None),
        }
    }

    fn recent_cause(&self) -> Option<ClusterFault> {
        let cause = self.cause.lock().ok()?;
        cause
            .as_ref()
            .filter(|(at, _)| at.elapsed() <= CAUSE_VALID)
            .map(|(_, f)| f.clone())
    }

    /// What [`diagnose`] finds at the cluster's listener, asked at most once per
    /// [`DIAGNOSE_EVERY`] per client (a client is one spec's cluster and credentials): the probe
    /// repeats every status interval, a diagnosis opens connections of its own. A probe that
    /// finds one under way goes without.
    fn diagnosis(&self, config: &ClientConfig, budget: Budget) -> Option<Diagnosis> {
        {
            let mut last = self.diagnosed.lock().ok()?;
            if let Some((at, found)) = last.as_ref()
                && at.elapsed() < DIAGNOSE_EVERY
            {
                return found.clone();
            }
            *last = Some((std::time::Instant::now(), None));
        }
        let deadline = std::time::Instant::now() + budget.next(DIAGNOSIS_TIME);
        let found = diagnose::diagnose(&diagnose::Expected::from_client_config(config), deadline);
        if let Ok(mut last) = self.diagnosed.lock() {
            *last = Some((std::time::Instant::now(), found.clone()));
        }
        found
    }

    fn clear_cause(&self) {
        if let Ok(mut cause) = self.cause.lock() {
            *cause = None;
        }
    }
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

impl ConsumerContext for ProbeContext {}

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
    cluster_ids_with(&ProbeClients::for_cli(), "", flow)
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
    observe_with(&ProbeClients::for_cli(), "", flow, budget)
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
fn observe_selection<'a>(
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
fn on_target(target: &Cluster, md: &rdkafka::metadata::Metadata, name: &str) -> bool {
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
fn observe_copy(
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
    let written = super::writes::written_topics(flow, mirrored);
    if !written.is_empty() && !budget.spent() {
        let present = super::writes::present(target_md);
        let checked = super::writes::checked(written, |t| present.contains(t));
        let refused =
            super::writes::refused_writes(target.client().client(), &checked, budget.next(TIMEOUT));
        out.refusals.get_or_insert_with(Vec::new).extend(refused);
    }
    positions
}

/// The newest replicated heartbeat into `out`, and the checkpoints (none when their topic is
/// unreadable: absent, or the target just went away; the groups then say so).
fn observe_tails(
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
fn observe_acls(
    flow: &Flow,
    source: &Cluster,
    target: &Cluster,
    budget: Budget,
) -> (TopicAcls, String) {
    let policy = flow.policy.as_ref();
    let seen = super::acls::observe(
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
struct Connected {
    source: std::sync::Arc<Cluster>,
    source_config: ClientConfig,
    target: std::sync::Arc<Cluster>,
    target_config: ClientConfig,
}

/// The flow's clients of both clusters; `None`, with the fault in `out`, for a cluster refused
/// (now or recently) or whose client could not be made.
fn connected(
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
fn follow_positions(
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
    read.map(|r| r.positions)
}

/// The time of the newest replicated heartbeat in `topic`.
fn follow_heartbeat(
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
fn follow_checkpoints(
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
fn plain_names(patterns: &[String]) -> bool {
    !patterns.is_empty()
        && patterns.iter().all(|p| {
            !p.is_empty()
                && !p.contains([
                    '\\', '^', '$', '|', '?', '*', '+', '(', ')', '[', ']', '{', '}',
                ])
        })
}

/// The source's topics (internal ones left out) and the partitions of those the flow copies.
fn selected_topics(flow: &Flow, md: &rdkafka::metadata::Metadata) -> Selected {
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
fn selected_groups(flow: &Flow, source: &Cluster, budget: Budget) -> Option<(usize, usize)> {
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
fn followed<R>(read: Result<R, TailError>, topic: &str, out: &mut ClusterObservation) -> Option<R> {
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

/// What the probe takes from the positions topic.
struct PositionsRead {
    positions: Positions,
    gaps: Vec<Gap>,
    conflict: Option<String>,
    refusals: Vec<Refusal>,
}

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

/// A replication factor the target cannot give refuses every topic the replicator creates
/// there, its positions topic first: the replicator then waits at start and records nothing,
/// so while that topic is missing the probe says it from the spec and the target's broker
/// count (once it exists, the replicator records the refusals itself).
fn replication_factor_refused(flow: &Flow, brokers: usize) -> Option<Refusal> {
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
fn mirrored_topics<'a>(flow: &Flow, topics: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let policy = flow.policy.as_ref();
    topics.filter(|t| replicates(flow, policy, t)).collect()
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

mod faults;
mod groups;

use self::faults::*;
use self::groups::*;

#[cfg(test)]
mod tests;
