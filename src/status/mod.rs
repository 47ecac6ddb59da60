//! A flow's status from what the probe observed, shared by the operator (which writes it) and
//! the CLI (`mirrorflow status`, which prints it without an operator).
//!
//! | concern | module |
//! |---|---|
//! | reading the clusters (I/O) | [`probe`] |
//! | the probe's shared, followed clients | [`clients`] |
//! | why a connection failed, by class | [`diagnose`] |
//! | condition reasons | [`reason`] |
//! | per-group readiness | [`groups`] |
//! | breaks in continuity, `Gapless` | [`gaps`] |
//! | topic ACL sync, `TopicAclsSynced` | [`acls`] |
//! | the other conditions and the whole status (pure) | here |
//!
//! Kubernetes conventions: one condition per `type`, a CamelCase `reason`, a message that says
//! what to do, and `lastTransitionTime` that moves only when `status` flips.

pub mod acls;
pub mod brokers;
pub mod clients;
pub mod diagnose;
pub mod gaps;
pub mod groups;
pub mod probe;
pub mod reason;
pub mod tails;
mod verdicts;
pub mod verified;
pub mod writes;

pub use groups::{Conservative, GroupState, group_readiness};

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::{
    CheckpointsStatus, FailoverReadinessSpec, HeartbeatStatus, MirrorFlowStatus, SpecDuration,
};
use crate::kafka::refusals::Refusal;

pub const READY: &str = "Ready";
pub const REPLICATING: &str = "Replicating";
pub const CHECKPOINTS_FRESH: &str = "CheckpointsFresh";
pub const HEARTBEATS_FLOWING: &str = "HeartbeatsFlowing";
pub const FAILOVER_READY: &str = "FailoverReady";
/// No unacknowledged break in continuity (see `status.gaps`).
pub const GAPLESS: &str = "Gapless";
/// The conditions [`verdicts::evaluate`] judges (the others come from gaps and alignment).
pub(crate) const EVALUATED: [&str; 5] = [
    READY,
    REPLICATING,
    CHECKPOINTS_FRESH,
    HEARTBEATS_FLOWING,
    FAILOVER_READY,
];
/// `spec.offsets: Aligned` holds on every remote partition.
pub const OFFSETS_ALIGNED: &str = "OffsetsAligned";
/// The annotation whose RFC 3339 time acknowledges every gap detected at or before it.
pub const GAPS_ACKNOWLEDGED: &str = "mirrorflow.io/gaps-acknowledged";
/// At most this many gaps are listed in `status.gaps` (the newest).
pub const MAX_LISTED_GAPS: usize = 20;

/// At most this many groups are listed in `leastReadyGroups`.
pub const MAX_LISTED_GROUPS: usize = 10;
/// Refused topics named in `Replicating`'s message besides the oldest one.
const MAX_LISTED_REFUSALS: usize = 5;

/// One group's state as the probe saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupObservation {
    pub group: String,
    /// Age of its newest checkpoint; `None` when it has none.
    pub checkpoint_age: Option<Duration>,
    /// Source records committed past what its checkpoints cover, over all partitions.
    pub replay_records: i64,
    /// Source records the group committed that are not on the target yet (known from the
    /// replicator's stored positions; 0 when unknown).
    pub uncopied_records: i64,
    /// Partitions whose checkpoint was written before their remote partition was recreated
    /// (a `TargetTopicRecreated` gap): it points into a log that is gone.
    pub invalidated_checkpoints: u32,
    /// Partitions whose checkpoint is at the commit but was a conservative translation (its
    /// writer said so), and how many records a failover to them may re-read in all (also in
    /// `replay_records`).
    pub conservative: Conservative,
    /// What the verifications on its checkpoint records say ([`verified`]).
    pub verified: verified::Verified,
    /// `share` or `streams` for those group types (named in its row); `None` for classic and
    /// consumer groups, and where types could not be listed.
    pub kind: Option<&'static str>,
}

/// What the flow's topic and group selection was matched against on the source; `None` where
/// not read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Selected {
    /// Topics on the source, internal ones left out.
    pub topics_seen: Option<usize>,
    /// Partitions of the topics the flow copies.
    pub partitions: Option<usize>,
    /// Topics the selection (`spec.topics`, `spec.topicsExclude`) matches: the copied topics
    /// without the heartbeats topics, which are copied whatever the selection.
    pub topics_matched: Option<usize>,
    /// Groups `spec.groups` selects, and groups listed on the source.
    pub groups: Option<(usize, usize)>,
    /// Every pattern of `spec.groups` is a plain name (no regular expression beyond `.`): a
    /// group named there that the source does not list has not committed yet, rather than a
    /// pattern that matches nothing.
    pub groups_named: bool,
    /// Every pattern of `spec.topics` is a plain name: a topic named there that the source
    /// lacks has not been created yet (a reverse flow waiting for its first topic), rather
    /// than a pattern that matches nothing.
    pub topics_named: bool,
    /// Selected groups whose committed offsets the source refused to the flow's principal
    /// (group authorization failed).
    pub groups_forbidden: usize,
}

/// Why a cluster could not be used, as the probe's clients reported it.
#[derive(Clone, Debug, PartialEq)]
pub enum ClusterFault {
    /// No answer: wrong address, brokers down, network.
    Unreachable(String),
    /// The brokers refused the SASL credentials.
    Authentication(String),
    /// The TLS handshake failed (e.g. the brokers' certificate is not signed by the given CA).
    Tls(String),
    /// The brokers refused our client certificate (mTLS): unknown CA, expired, or none given
    /// where one is required.
    CertificateRefused(String),
    /// OAUTHBEARER: the token endpoint answered with an OAuth error (wrong client id or secret,
    /// a scope it does not grant).
    ClientCredentialsRefused(String),
    /// OAUTHBEARER: the token endpoint gave no token for another reason (no answer, TLS, an
    /// answer that is not OAuth's).
    TokenEndpointUnreachable(String),
    /// OAUTHBEARER: the brokers refused the token (signature, issuer, audience or scope they do
    /// not accept).
    TokenRefused(String),
    /// The credentials were accepted, but the principal may not do what was asked (topic,
    /// group or cluster authorization failed).
    NotAuthorized(String),
    /// The client could not connect and [`diagnose`] found the class: nothing listening, TLS
    /// or SASL expected or not, not Kafka, a certificate, a mechanism not enabled.
    Connection(diagnose::Diagnosis),
    /// The cluster's metadata lists too many brokers, or one the operator may not reach: the
    /// probe did not follow it.
    Brokers(brokers::Refusal),
}

/// The most bytes of a broker's or token endpoint's own words a status message or Event
/// carries: enough for any real error, and a hostile endpoint's answer body cannot fill the
/// status (or the operator's memory, once per flow).
pub const MAX_FOREIGN_TEXT: usize = 512;

/// `text` cut to [`MAX_FOREIGN_TEXT`] bytes on one line ([`one_line`]).
pub fn bounded_text(text: &str) -> std::borrow::Cow<'_, str> {
    one_line(text, MAX_FOREIGN_TEXT)
}

/// Someone else's text (a broker's, an apiserver's, a container's last words) as a condition
/// message or Event may carry it: control characters replaced by spaces, so it cannot break
/// the line it is quoted in, and cut to `max` bytes on a character boundary, marked when cut,
/// so it cannot fill the status. Borrowed when it is already both.
pub fn one_line(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    let clean = !text.chars().any(char::is_control);
    if clean && text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out: String = text[..end]
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if end < text.len() {
        out.push_str(&format!("... ({} bytes cut)", text.len() - end));
    }
    std::borrow::Cow::Owned(out)
}

impl ClusterFault {
    /// The same fault with the cluster's own text cut to [`MAX_FOREIGN_TEXT`].
    fn bounded(&self) -> ClusterFault {
        let cut = |e: &String| bounded_text(e).into_owned();
        match self {
            ClusterFault::Unreachable(e) => ClusterFault::Unreachable(cut(e)),
            ClusterFault::Authentication(e) => ClusterFault::Authentication(cut(e)),
            ClusterFault::Tls(e) => ClusterFault::Tls(cut(e)),
            ClusterFault::CertificateRefused(e) => ClusterFault::CertificateRefused(cut(e)),
            ClusterFault::ClientCredentialsRefused(e) => {
                ClusterFault::ClientCredentialsRefused(cut(e))
            }
            ClusterFault::TokenEndpointUnreachable(e) => {
                ClusterFault::TokenEndpointUnreachable(cut(e))
            }
            ClusterFault::TokenRefused(e) => ClusterFault::TokenRefused(cut(e)),
            ClusterFault::NotAuthorized(e) => ClusterFault::NotAuthorized(cut(e)),
            // A class, never the bytes the address answered.
            ClusterFault::Connection(d) => ClusterFault::Connection(d.clone()),
            // Bounded where it is made.
            ClusterFault::Brokers(r) => ClusterFault::Brokers(r.clone()),
        }
    }

    /// The condition reason and a message naming the field to fix; `side` is `source` or
    /// `target`. The cluster's own text in it is bounded ([`bounded_text`]).
    fn describe(&self, side: &str) -> (&'static str, String) {
        self.bounded().describe_whole(side)
    }

    fn describe_whole(&self, side: &str) -> (&'static str, String) {
        let source = side == "source";
        match self {
            ClusterFault::Connection(d) => diagnose::describe(d, side),
            ClusterFault::Brokers(r) => (
                match r {
                    brokers::Refusal::TooManyBrokers { .. } => reason::TOO_MANY_BROKERS,
                    brokers::Refusal::Address { .. } => reason::ADDRESS_NOT_ALLOWED,
                },
                brokers::describe(r, side),
            ),
            ClusterFault::Unreachable(e) => (
                if source {
                    reason::SOURCE_UNREACHABLE
                } else {
                    reason::TARGET_UNREACHABLE
                },
                format!(
                    "the {side} cluster cannot be reached: {e}; check spec.{side}.bootstrapServers and that its brokers run"
                ),
            ),
            ClusterFault::Authentication(e) => (
                if source {
                    reason::SOURCE_AUTHENTICATION_FAILED
                } else {
                    reason::TARGET_AUTHENTICATION_FAILED
                },
                format!(
                    "the {side} cluster refused the credentials: {e}; check the Secrets named by spec.{side}.sasl.usernameSecretRef and spec.{side}.sasl.passwordSecretRef, and spec.{side}.sasl.mechanism"
                ),
            ),
            ClusterFault::CertificateRefused(e) => (
                if source {
                    reason::SOURCE_CERTIFICATE_REFUSED
                } else {
                    reason::TARGET_CERTIFICATE_REFUSED
                },
                format!(
                    "the {side} cluster refused the client certificate: {e}; check the certificate in the Secret named by spec.{side}.tls.certSecretRef (or pkcs12SecretRef): the brokers' client CA must have signed it, and it must not have expired"
                ),
            ),
            ClusterFault::ClientCredentialsRefused(e) => (
                if source {
                    reason::SOURCE_CLIENT_CREDENTIALS_REFUSED
                } else {
                    reason::TARGET_CLIENT_CREDENTIALS_REFUSED
                },
                format!(
                    "the token endpoint refused the {side} cluster's OAuth client: {e}; check spec.{side}.sasl.oauthbearer.clientId, the client secret in the Secret named by spec.{side}.sasl.oauthbearer.clientSecretSecretRef, and spec.{side}.sasl.oauthbearer.scope"
                ),
            ),
            ClusterFault::TokenEndpointUnreachable(e) => (
                if source {
                    reason::SOURCE_TOKEN_ENDPOINT_UNREACHABLE
                } else {
                    reason::TARGET_TOKEN_ENDPOINT_UNREACHABLE
                },
                format!(
                    "no OAuth token for the {side} cluster: {e}; check spec.{side}.sasl.oauthbearer.tokenEndpointUrl (the identity provider's token endpoint, reachable from the operator and the replicator pods, with a certificate the system CAs trust)"
                ),
            ),
            ClusterFault::TokenRefused(e) => (
                if source {
                    reason::SOURCE_TOKEN_REFUSED
                } else {
                    reason::TARGET_TOKEN_REFUSED
                },
                format!(
                    "the {side} cluster refused the OAuth token: {e}; the token endpoint in spec.{side}.sasl.oauthbearer.tokenEndpointUrl issued it, so check that the brokers trust that issuer and its keys, and the audience and spec.{side}.sasl.oauthbearer.scope they expect"
                ),
            ),
            ClusterFault::NotAuthorized(e) => (
                if source {
                    reason::SOURCE_NOT_AUTHORIZED
                } else {
                    reason::TARGET_NOT_AUTHORIZED
                },
                format!(
                    "the {side} cluster accepted the credentials but does not authorize the flow's principal: {e}; grant the principal that spec.{side}.sasl (or spec.{side}.tls.certSecretRef) authenticates as the ACLs the flow needs on the {side} (DESCRIBE and READ on the topics and groups it copies and checkpoints, see docs/concepts.md)"
                ),
            ),
            ClusterFault::Tls(e) => (
                if source {
                    reason::SOURCE_TLS_FAILED
                } else {
                    reason::TARGET_TLS_FAILED
                },
                format!(
                    "TLS with the {side} cluster failed: {e}; check the CA certificate in the Secret named by spec.{side}.tls.caSecretRef"
                ),
            ),
        }
    }
}

/// A reason the flow is not deployed, and a message naming the field and the fix.
#[derive(Clone, Debug, PartialEq)]
pub struct Blocked {
    pub reason: &'static str,
    pub message: String,
}

impl Blocked {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Blocked {
            reason,
            message: message.into(),
        }
    }
}

/// What the probe saw on the clusters and in the workload; `None` = could not be observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    /// Why the flow is not deployed (a spec problem, a Secret it may not use, a child object
    /// the apiserver refused, a flow that would harm a cluster...): every condition says so.
    pub blocked: Option<Blocked>,
    /// `spec.mode: Observe`: no replicator pods; replication is judged by its heartbeats.
    pub observe_only: bool,
    /// `spec.offsets: Aligned`: the `OffsetsAligned` condition is reported.
    pub aligned: bool,
    pub desired_replicas: i32,
    pub ready_replicas: i32,
    /// Replicas on nodes the node controller lost, one message each (which pod, which node,
    /// when it is replaced).
    pub stranded: Vec<String>,
    /// Replicas that cannot run, read from their pods (`operator::unready`): the worst class's
    /// reason and a message naming the pods, the field and the fix.
    pub unready: Option<(&'static str, String)>,
    /// Error text when the cluster could not be reached.
    pub source_error: Option<ClusterFault>,
    pub target_error: Option<ClusterFault>,
    pub heartbeats_enabled: bool,
    pub checkpoints_enabled: bool,
    /// Age of the newest replicated source heartbeat on the target and its emission time.
    pub heartbeat_age: Option<Duration>,
    pub heartbeat_time: Option<Time>,
    pub topics: Option<i32>,
    /// What the flow's selection was matched against on the source.
    pub selected: Selected,
    pub replication_lag: Option<i64>,
    /// Groups with committed offsets on the source (checkpointed or not).
    pub groups: Vec<GroupObservation>,
    /// Share groups (KIP-932) `spec.groups` selects whose start offsets (their position) the
    /// source did not give, with why: they cannot be judged. The others are in [`Self::groups`].
    pub share_groups: Vec<(String, String)>,
    /// Breaks in continuity the replicator recorded; `None` when they could not be read
    /// (then the previous status's list stands).
    pub gaps: Option<Vec<crate::kafka::positions::Gap>>,
    /// Gaps detected at or before this time (ms since the epoch) are acknowledged; the error
    /// when the annotation is not a time.
    pub gaps_acknowledged: Option<Result<i64, String>>,
    /// The flow's name, for the acknowledge command in messages.
    pub name: String,
    /// `spec.sourceLoop.syncTopicAcls`: the source's topic ACLs against the target's, with
    /// `spec.sourceLoop.topicsRefreshInterval` for messages; `None` when not compared (sync
    /// off, a cluster unreachable).
    pub topic_acls: Option<(acls::TopicAcls, String)>,
    /// An older flow that this operator cannot see writes this flow's internal topics, so
    /// this flow's replicators wait and copy nothing: the message naming it.
    pub conflict: Option<String>,
    /// Remote topics the clusters would not create or keep in line with their source, as the
    /// replicator recorded them; `None` when they could not be read (none is then known).
    pub refusals: Option<Vec<crate::kafka::refusals::Refusal>>,
    /// Where the spec puts the copies ([`crate::flow::placement`]); recorded in the status
    /// once deployed. `None`: keep what the status says.
    pub placement: Option<crate::api::DeployedPlacement>,
    /// A target topic the probe stopped reading because it broke a bound (a batch inflating
    /// past the cap, too many entries): the message naming it and what to do.
    pub unreadable_topic: Option<String>,
    /// The positions topic held by a transaction left open at its end: the message naming it
    /// and what to do.
    pub held_topic: Option<String>,
}

pub(crate) fn secs(d: Duration) -> String {
    SpecDuration(Duration::from_secs(d.as_secs())).to_string()
}

pub(crate) struct Verdict {
    type_: &'static str,
    ok: bool,
    reason: &'static str,
    message: String,
}

pub(crate) fn verdict(
    type_: &'static str,
    ok: bool,
    reason: &'static str,
    message: impl Into<String>,
) -> Verdict {
    Verdict {
        type_,
        ok,
        reason,
        message: message.into(),
    }
}

/// Merges new verdicts into the previous conditions, keeping `lastTransitionTime` unless the
/// status flipped.
fn merge(
    previous: &[Condition],
    verdicts: Vec<Verdict>,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    verdicts
        .into_iter()
        .map(|v| {
            let status = if v.ok { "True" } else { "False" };
            let since = previous
                .iter()
                .find(|c| c.type_ == v.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: v.type_.to_string(),
                status: status.to_string(),
                reason: v.reason.to_string(),
                message: v.message,
                last_transition_time: since,
                observed_generation: generation,
            }
        })
        .collect()
}

/// The placement the replicators run with: the spec's once it was deployed unblocked (an
/// Observe flow deploys no replicator), else the one recorded before.
fn deployed_placement(
    previous: Option<&MirrorFlowStatus>,
    obs: &Observation,
) -> Option<crate::api::DeployedPlacement> {
    match (&obs.blocked, &obs.placement) {
        (None, Some(p)) if !obs.observe_only => Some(p.clone()),
        _ => previous.and_then(|p| p.deployed_placement.clone()),
    }
}

/// The whole status for one observation.
pub fn status(
    previous: Option<&MirrorFlowStatus>,
    obs: &Observation,
    limits: &FailoverReadinessSpec,
    generation: Option<i64>,
    now: &Time,
) -> MirrorFlowStatus {
    let prev_conditions = previous.map(|p| p.conditions.as_slice()).unwrap_or(&[]);
    let (gaps, unacknowledged) = gaps::gap_list(previous, obs);
    let mut verdicts = verdicts::evaluate(obs, limits);
    verdicts.push(gaps::gapless(&gaps, unacknowledged, obs));
    if obs.aligned {
        verdicts.push(gaps::offsets_aligned(obs, prev_conditions));
    }
    if let (None, Some((seen, refresh))) = (&obs.blocked, &obs.topic_acls) {
        verdicts.push(acls::topic_acls_synced(seen, refresh));
    }
    let conditions = merge(prev_conditions, verdicts, generation, now);
    let ages: Vec<Duration> = obs.groups.iter().filter_map(|g| g.checkpoint_age).collect();
    let mut least_ready = group_readiness(obs, limits);
    least_ready.truncate(MAX_LISTED_GROUPS);
    MirrorFlowStatus {
        observed_generation: generation,
        observed_time: Some(now.0.to_string()),
        conditions,
        replicas: Some(obs.desired_replicas),
        ready_replicas: Some(obs.ready_replicas),
        heartbeat: Some(HeartbeatStatus {
            lag: obs.heartbeat_age.map(secs),
            last_heartbeat_time: obs.heartbeat_time.as_ref().map(|t| t.0.to_string()),
        }),
        checkpoints: Some(CheckpointsStatus {
            newest_age: ages.iter().min().copied().map(secs),
            oldest_age: if obs.groups.iter().any(|g| g.checkpoint_age.is_none()) {
                Some("never".into())
            } else {
                ages.iter().max().copied().map(secs)
            },
        }),
        topics: obs.topics,
        groups: Some(obs.groups.len() as i32),
        replication_lag: obs.replication_lag,
        least_ready_groups: least_ready,
        gaps,
        deployed_placement: deployed_placement(previous, obs),
    }
}

#[cfg(test)]
mod tests;
