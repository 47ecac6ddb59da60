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
    /// The positions topic held by a transaction left open at its end: the message naming it
    /// ([`observe::held_message`]).
    pub held_topic: Option<String>,
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
        obs.held_topic = self.held_topic;
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

mod faults;
mod groups;
mod observe;

use self::faults::*;
use self::groups::*;
use self::observe::*;

#[cfg(test)]
mod tests;
