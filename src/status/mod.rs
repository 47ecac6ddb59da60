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
/// The conditions [`evaluate`] judges (the others come from gaps and alignment).
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

/// `text` cut to [`MAX_FOREIGN_TEXT`] bytes on a character boundary, marked when cut.
pub fn bounded_text(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_FOREIGN_TEXT {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = MAX_FOREIGN_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}... ({} bytes cut)",
        &text[..end],
        text.len() - end
    ))
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

fn evaluate(obs: &Observation, limits: &FailoverReadinessSpec) -> Vec<Verdict> {
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

    let ready = if obs.observe_only {
        match &unreachable {
            Some((r, m)) => verdict(READY, false, r, m.clone()),
            None => verdict(
                READY,
                true,
                reason::OBSERVING,
                "mode Observe: no replicator pods; watching the heartbeats and checkpoints another replicator writes",
            ),
        }
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
    };

    let max_hb = limits.max_heartbeat_lag.as_duration();
    let mut refused: Vec<&Refusal> = obs.refusals.iter().flatten().collect();
    refused.sort_by(|a, b| (a.detected_ms, &a.topic).cmp(&(b.detected_ms, &b.topic)));
    let replicating = match (&unreachable, obs.replication_lag) {
        (Some((r, m)), _) => verdict(REPLICATING, false, r, m.clone()),
        // Also in Observe mode (and the CLI's measurement): a flow of this project recorded
        // them in the positions topic of this source alias on this target.
        (None, _) if !refused.is_empty() => {
            let stalled = refused
                .first()
                .is_some_and(|r| r.message.contains(crate::kafka::refusals::STALLED_MARK));
            let why = if stalled {
                reason::PARTITION_STALLED
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
        (None, _) if obs.ready_replicas == 0 && !obs.observe_only => verdict(
            REPLICATING,
            false,
            reason::REPLICAS_NOT_READY,
            "no replicator pod is ready",
        ),
        (None, lag) => verdict(
            REPLICATING,
            true,
            reason::OK,
            match lag {
                Some(l) => format!("{l} source records not yet copied"),
                None => "replicators are running".to_string(),
            },
        ),
    };

    let heartbeats = if !obs.heartbeats_enabled {
        verdict(
            HEARTBEATS_FLOWING,
            false,
            reason::HEARTBEATS_DISABLED,
            "spec.heartbeats.enabled is false: end-to-end lag cannot be measured",
        )
    } else {
        match (&unreachable, obs.heartbeat_age) {
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
    };

    let groups = groups::states(obs, limits);
    let checkpoints = if !obs.checkpoints_enabled {
        verdict(
            CHECKPOINTS_FRESH,
            false,
            reason::CHECKPOINTS_DISABLED,
            "spec.checkpoints.enabled is false: consumers cannot fail over with translated offsets",
        )
    } else if let Some((r, m)) = &unreachable {
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
                    obs.groups.len(),
                    worst.group,
                    worst.message
                ),
            ),
        }
    };

    let blockers: Vec<&Verdict> = [&ready, &replicating, &heartbeats, &checkpoints]
        .into_iter()
        .filter(|v| !v.ok)
        .collect();
    let nothing_copied = no_topics(obs);
    let failover = match (&nothing_copied, blockers.first()) {
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
    };
    vec![ready, replicating, checkpoints, heartbeats, failover]
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
    let mut verdicts = evaluate(obs, limits);
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
