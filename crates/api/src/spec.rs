//! The `MirrorFlow` resource's spec: what to replicate, from where to where, and how.
//!
//! Every field carries a `///` doc because it becomes the CRD's description, which is what
//! `kubectl explain mirrorflow.spec...` prints. Defaults live here, in one place, so the CRD,
//! the operator and a standalone `mirrorflow replicate` agree on them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration, TopologySpreadConstraint};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duration::SpecDuration;
use super::rules::{
    BOOTSTRAP_PATTERN, CLIENT_ID_PATTERN, SCOPE_PATTERN, SECRET_KEY_PATTERN, SECRET_NAME_PATTERN,
    SEPARATOR_PATTERN, TOKEN_ENDPOINT_PATTERN,
};
use super::status::MirrorFlowStatus;

/// A one-way replication flow from a source Kafka cluster to a target Kafka cluster, run the way
/// MirrorMaker 2 runs it (same topic names, checkpoints, heartbeats and offset syncs), with a
/// status that says whether the flow's consumer groups could fail over to the target now.
// kube-derive repeats `printcolumn(type_ = ...)` keys, which the lint mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "mirrorflow.io",
    version = "v1alpha1",
    kind = "MirrorFlow",
    plural = "mirrorflows",
    shortname = "mf",
    category = "mirrorflow",
    namespaced,
    status = "MirrorFlowStatus",
    derive = "PartialEq",
    doc = "A one-way Kafka replication flow, MirrorMaker 2 compatible, with failover readiness in its status.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Failover",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"FailoverReady\")].status"
    ),
    printcolumn(name = "HB-Lag", type_ = "string", json_path = ".status.heartbeat.lag"),
    printcolumn(
        name = "Ckpt-Age",
        type_ = "string",
        json_path = ".status.checkpoints.oldestAge"
    ),
    printcolumn(name = "Topics", type_ = "integer", json_path = ".status.topics"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    // Pods carry `controller-revision-hash: <name>-<10 characters>`, a label value of at most
    // 63: a longer flow name would be accepted and then fail in its StatefulSet.
    validation = Rule::new("size(self.metadata.name) <= 52").message("metadata.name: a MirrorFlow's name has at most 52 characters, so the names of its StatefulSet's pods and their labels fit")
)]
#[x_kube(validation = Rule::new("self.source.alias != self.target.alias")
    .message("source.alias and target.alias must differ: they name the two clusters in topic names")
    .field_path(".target.alias"))]
// A separator inside an alias makes remote topic names ambiguous (`us-east-orders` with
// separator `-`); the default `.` cannot occur in an alias, so only a set separator is checked.
#[x_kube(validation = Rule::new("!has(self.replicationPolicy) || !has(self.replicationPolicy.separator) || !self.source.alias.contains(self.replicationPolicy.separator)")
    .message("source.alias must not contain spec.replicationPolicy.separator: remote topic names <alias><separator><topic> would be ambiguous; choose another separator or alias")
    .field_path(".source.alias"))]
#[x_kube(validation = Rule::new("!has(self.replicationPolicy) || !has(self.replicationPolicy.separator) || !self.target.alias.contains(self.replicationPolicy.separator)")
    .message("target.alias must not contain spec.replicationPolicy.separator: remote topic names <alias><separator><topic> would be ambiguous (the reverse flow prefixes with this alias); choose another separator or alias")
    .field_path(".target.alias"))]
#[x_kube(validation = Rule::new("!has(self.offsets) || self.offsets != 'Aligned' || !has(self.exactlyOnce) || !self.exactlyOnce")
    .message("offsets: Aligned cannot be combined with exactlyOnce: exactly-once commits a transaction per partition about every 500 ms, and each commit marker takes an offset the source record does not have; choose one")
    .field_path(".offsets"))]
#[serde(rename_all = "camelCase")]
pub struct MirrorFlowSpec {
    /// The cluster records are copied from.
    pub source: ClusterSpec,
    /// The cluster records are copied to. Checkpoints and replicated heartbeats are written here.
    pub target: ClusterSpec,
    /// Regular expressions (full match) of the source topics to replicate. Default: all (`.*`).
    #[serde(default = "defaults::topics")]
    #[schemars(length(max = 256))]
    pub topics: Vec<String>,
    /// Regular expressions (full match) of source topics never to replicate. Default: MirrorMaker 2's
    /// (`.*[\-\.]internal`, `.*\.replica`, `__.*`). Internal topics are never replicated anyway.
    #[serde(default = "defaults::topics_exclude")]
    #[schemars(length(max = 256))]
    pub topics_exclude: Vec<String>,
    /// Regular expressions (full match) of the consumer groups whose offsets are checkpointed.
    /// Default: all (`.*`).
    #[serde(default = "defaults::groups")]
    #[schemars(length(max = 256))]
    pub groups: Vec<String>,
    /// Regular expressions (full match) of consumer groups never checkpointed. Default: MirrorMaker
    /// 2's (`console-consumer-.*`, `connect-.*`, `__.*`).
    #[serde(default = "defaults::groups_exclude")]
    #[schemars(length(max = 256))]
    pub groups_exclude: Vec<String>,
    /// How remote topics are named on the target.
    #[serde(default)]
    pub replication_policy: ReplicationPolicySpec,
    /// `Replicate` (default): run replicator pods for this flow. `Observe`: run nothing and only
    /// report the status of a flow another tool replicates (an existing MirrorMaker 2 or
    /// Strimzi `KafkaMirrorMaker2` with the same aliases and naming policy): heartbeat lag,
    /// checkpoint freshness and per-group failover readiness read from its heartbeats and
    /// checkpoints topics on the target.
    #[serde(default)]
    pub mode: FlowMode,
    /// Number of replicator pods. Source partitions are split between them; each partition is
    /// copied by exactly one replica at a time.
    #[serde(default = "defaults::replicas")]
    #[schemars(range(min = 1, max = 64))]
    pub replicas: i32,
    /// The source loop: copies records, creates and configures remote topics, writes offset syncs.
    #[serde(default)]
    pub source_loop: SourceLoopSpec,
    /// The checkpoint loop: translates source group offsets into target offsets.
    #[serde(default)]
    pub checkpoints: CheckpointSpec,
    /// The heartbeat loop: emits heartbeats whose replicated copies measure end-to-end lag.
    #[serde(default)]
    pub heartbeats: HeartbeatSpec,
    /// When the flow counts as ready for its consumers to fail over to the target.
    #[serde(default)]
    pub failover_readiness: FailoverReadinessSpec,
    /// Copy records with a transactional producer, with source positions and offset syncs in the
    /// same transaction, so a crash neither loses nor duplicates records (consumers on the
    /// target read with `isolation.level=read_committed`). Needs
    /// `sourceLoop.offsetSyncsLocation: Target`. Off by default.
    #[serde(default)]
    pub exactly_once: bool,
    /// What offsets remote records get. `Translated` (default): the next free offset of the
    /// remote partition, as MirrorMaker 2 does; consumers fail over through checkpoints.
    /// `Aligned`: the offset the record has on the source, so a consumer resumes on the target
    /// at the same numbers it stored (in Kafka or elsewhere) and never re-reads. Transaction
    /// markers, aborted records, compaction holes and the log start are reproduced with
    /// filler records the target's `read_committed` readers never see. Holds for remote
    /// partitions this flow writes alone from their start; a partition where alignment breaks
    /// (another writer, a source rewound past the copies) is reported by the `OffsetsAligned`
    /// condition and copied on with translated offsets. Not with `exactlyOnce`.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("offsets cannot change on a running flow: aligned and translated remote partitions cannot be converted into each other; create a new flow with new remote topics instead"))]
    pub offsets: OffsetsMode,
    /// CPU and memory for each replicator pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Overrides for the replicator pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodOverrides>,
}

/// One Kafka cluster: its alias (the name topics and checkpoints use for it) and how to reach it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// The cluster's alias, as MirrorMaker 2 uses it: remote topics on the target are named
    /// `<source alias>.<topic>` and checkpoints go to `<source alias>.checkpoints.internal`.
    /// Letters, digits, `_` and `-`; it cannot change once set.
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the alias cannot change: it is part of remote topic names and checkpoints; create a new flow instead"))]
    pub alias: String,
    /// Comma-separated `host:port` list of the cluster's brokers, without spaces (an IPv6
    /// address in brackets: `[2001:db8::1]:9092`; ports 1 to 65535).
    #[schemars(length(min = 1, max = 4096), regex(pattern = BOOTSTRAP_PATTERN))]
    pub bootstrap_servers: String,
    /// TLS for the connection. Absent: plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// SASL authentication. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<SaslSpec>,
    /// Tuning properties passed to the Kafka client (librdkafka names, e.g. `fetch.max.bytes`).
    /// Only the properties listed under "Client properties" in docs/crd-reference.md are
    /// allowed, some within bounds; any other is refused with the field to use instead
    /// (addresses, TLS, SASL and credentials have their own fields). Invalid values are refused
    /// before anything connects.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
}

/// TLS settings for one cluster, and the client certificate for brokers that authenticate
/// clients by TLS (mTLS).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.certSecretRef) == has(self.keySecretRef)").message("certSecretRef and keySecretRef go together: the client certificate and its private key"))]
#[x_kube(validation = Rule::new("has(self.pkcs12SecretRef) == has(self.pkcs12PasswordSecretRef)").message("pkcs12SecretRef and pkcs12PasswordSecretRef go together: the keystore and its password"))]
#[x_kube(validation = Rule::new("!(has(self.certSecretRef) && has(self.pkcs12SecretRef))").message("give the client certificate once: as PEM (certSecretRef, keySecretRef) or as PKCS#12 (pkcs12SecretRef, pkcs12PasswordSecretRef)"))]
pub struct TlsSpec {
    /// The CA certificate (PEM) that signed the brokers' certificates. Absent: the system's CAs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyRef>,
    /// The client certificate (PEM) for brokers that require one (mTLS), e.g. `user.crt` of the
    /// Secret Strimzi makes for a `KafkaUser` with `authentication: tls`. Needs `keySecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_secret_ref: Option<SecretKeyRef>,
    /// The client certificate's private key (PEM, unencrypted), e.g. Strimzi's `user.key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_secret_ref: Option<SecretKeyRef>,
    /// The client certificate and key as a PKCS#12 keystore instead of PEM, e.g. Strimzi's
    /// `user.p12`. Needs `pkcs12PasswordSecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pkcs12_secret_ref: Option<SecretKeyRef>,
    /// The PKCS#12 keystore's password, e.g. Strimzi's `user.password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pkcs12_password_secret_ref: Option<SecretKeyRef>,
}

/// SASL authentication for one cluster. Credentials come from Secrets in the flow's namespace:
/// a user name and password for `PLAIN` and `SCRAM-*`, an OAuth client for `OAUTHBEARER`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mechanism == 'OAUTHBEARER' || (has(self.usernameSecretRef) && has(self.passwordSecretRef))").message("mechanisms PLAIN and SCRAM-* need usernameSecretRef and passwordSecretRef"))]
#[x_kube(validation = Rule::new("self.mechanism == 'OAUTHBEARER' || !has(self.oauthbearer)").message("oauthbearer applies only to mechanism OAUTHBEARER").field_path(".oauthbearer"))]
#[x_kube(validation = Rule::new("self.mechanism != 'OAUTHBEARER' || has(self.oauthbearer)").message("mechanism OAUTHBEARER needs oauthbearer (tokenEndpointUrl, clientId, clientSecretSecretRef)"))]
#[x_kube(validation = Rule::new("self.mechanism != 'OAUTHBEARER' || (!has(self.usernameSecretRef) && !has(self.passwordSecretRef))").message("mechanism OAUTHBEARER takes no usernameSecretRef or passwordSecretRef: the client authenticates with oauthbearer.clientId and oauthbearer.clientSecretSecretRef"))]
pub struct SaslSpec {
    /// The SASL mechanism.
    pub mechanism: SaslMechanism,
    /// The Secret key holding the user name (`PLAIN`, `SCRAM-*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_secret_ref: Option<SecretKeyRef>,
    /// The Secret key holding the password (`PLAIN`, `SCRAM-*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeyRef>,
    /// The OAuth 2.0 client (`OAUTHBEARER`): the Kafka client gets tokens from the token
    /// endpoint with the client credentials grant and gets a new one before each expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauthbearer: Option<OAuthBearerSpec>,
}

/// An OAuth 2.0 / OIDC client for SASL/OAUTHBEARER (client credentials grant), as Confluent
/// Cloud, Strimzi with Keycloak and other identity providers issue them.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OAuthBearerSpec {
    /// The identity provider's token endpoint, e.g.
    /// `https://keycloak.example.com/realms/kafka/protocol/openid-connect/token`. `https://`,
    /// since the client secret travels in the request; `http://` only to a loopback address
    /// (`localhost`, `127.x.x.x`, `[::1]`: a token proxy in the same pod). No user or password
    /// in the URL. The system's CAs verify the endpoint's certificate.
    #[schemars(length(min = 1, max = 2048), regex(pattern = TOKEN_ENDPOINT_PATTERN))]
    pub token_endpoint_url: String,
    /// The OAuth client id (not a secret: it names the client, like a user name).
    #[schemars(length(min = 1, max = 255), regex(pattern = CLIENT_ID_PATTERN))]
    pub client_id: String,
    /// The Secret key holding the OAuth client secret.
    pub client_secret_secret_ref: SecretKeyRef,
    /// The scope to ask for (space-separated OAuth scope tokens). Absent: none, the identity
    /// provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = SCOPE_PATTERN))]
    pub scope: Option<String>,
    /// SASL extensions sent to the brokers with the token (RFC 7628), e.g. Confluent Cloud's
    /// `logicalCluster: lkc-abc123` and `identityPoolId: pool-xyz`. At most 16; keys are
    /// letters only (not `auth`), values printable without spaces or commas.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub extensions: BTreeMap<String, String>,
}

/// A SASL mechanism the replicator speaks.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
    #[serde(rename = "OAUTHBEARER")]
    OAuthBearer,
}

/// A key of a Secret in the flow's namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name (a Kubernetes object name: lower-case letters, digits, `-`, `.`).
    #[schemars(length(min = 1, max = 253), regex(pattern = SECRET_NAME_PATTERN))]
    pub name: String,
    /// The key inside the Secret (letters, digits, `-`, `_`, `.`; not `.` or `..`).
    #[schemars(length(min = 1, max = 253), regex(pattern = SECRET_KEY_PATTERN))]
    pub key: String,
}

/// How topics are named on the target.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type == 'Prefix' || !has(self.separator)").message("separator applies only to type Prefix"))]
pub struct ReplicationPolicySpec {
    /// `Prefix` (MirrorMaker 2's DefaultReplicationPolicy: `<source alias><separator><topic>`,
    /// which also prevents replication cycles) or `Identity` (same names on both sides; only for
    /// one-way flows, since cycles cannot be detected).
    #[serde(rename = "type", default)]
    pub kind: PolicyKind,
    /// The separator between alias and topic for `Prefix`. Default `.`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 8), regex(pattern = SEPARATOR_PATTERN))]
    pub separator: Option<String>,
}

impl Default for ReplicationPolicySpec {
    fn default() -> Self {
        ReplicationPolicySpec {
            kind: PolicyKind::Prefix,
            separator: None,
        }
    }
}

/// Whether the operator runs the flow or only watches it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FlowMode {
    #[default]
    Replicate,
    Observe,
}

/// How remote records are numbered (`spec.offsets`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OffsetsMode {
    #[default]
    Translated,
    Aligned,
}

/// The replication policy's kind.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PolicyKind {
    #[default]
    Prefix,
    Identity,
}

/// What is copied as a unit. Unset (the default): `Batches`, or `Records` when `exactlyOnce`
/// or `offsets: Aligned` is set. `Batches`: the source's record batches are written whole,
/// compressed records neither decompressed nor compressed again (a fraction of the CPU); at
/// least once with translated offsets only. A batch the target could not take as it is
/// (compacted topics, log-append time, larger than the remote topic's max.message.bytes) is
/// written anew, with exact offset syncs; a single record over the remote topic's
/// max.message.bytes stops its partition, named in the `Replicating` condition. `Records`:
/// every record is read and written again by Kafka clients (every mode; a record over the
/// remote limit is skipped and recorded as a gap).
// The schema shows this text for `spec.sourceLoop.copy` (the field is an Option of it); unset,
// the replicator chooses with `mirrorflow::flow::copy_unit`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyUnit {
    /// Each record is read and written again by Kafka clients: every delivery and offsets
    /// mode, at the CPU of decompressing and compressing every record.
    Records,
    /// The source's record batches are written to the target as they are: compressed records
    /// are neither decompressed nor compressed again, which costs a fraction of the CPU. Only
    /// with at-least-once delivery and translated offsets. A batch
    /// the target could not take as it is (records compacted away, log-append time, larger
    /// than the remote topic's max.message.bytes) is written anew by the replicator, one batch
    /// per run of offsets, with exact offset syncs. A record larger than the remote topic's
    /// max.message.bytes on its own stops its partition, named in the `Replicating` condition
    /// (`Records` skips such a record and records the gap).
    Batches,
}

/// Where offset syncs are written.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OffsetSyncsLocation {
    /// `mm2-offset-syncs.<target alias>.internal` on the source cluster (MirrorMaker 2's default).
    #[default]
    Source,
    /// `mm2-offset-syncs.<source alias>.internal` on the target cluster (for a source you may
    /// only read from).
    Target,
}

/// Settings of the source loop.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceLoopSpec {
    /// Copy records. Turning it off leaves checkpoints and heartbeats running (e.g. to watch a
    /// flow whose records another tool copies).
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// How often the source's topic list is re-read to find new topics and partitions.
    #[serde(default = "defaults::topics_refresh")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('24h')").message("topicsRefreshInterval must be between 1s and 24h"))]
    pub topics_refresh_interval: SpecDuration,
    /// Copy topic configs (cleanup.policy, retention...) to remote topics, except those MirrorMaker
    /// 2 never copies.
    #[serde(default = "defaults::yes")]
    pub sync_topic_configs: bool,
    /// Copy the source's ALLOW ACLs on replicated topics (literal names) to their remote topics,
    /// as MirrorMaker 2 does: WRITE is never copied (only the flow writes remote topics) and ALL
    /// becomes READ. Re-read every topicsRefreshInterval. ACLs are only added on the target,
    /// never removed. Needs DESCRIBE on the source's cluster resource, DESCRIBE and ALTER on
    /// the target's, and an authorizer on the target once the source has ACLs to copy.
    #[serde(default = "defaults::yes")]
    pub sync_topic_acls: bool,
    /// Where offset syncs go.
    #[serde(default)]
    pub offset_syncs_location: OffsetSyncsLocation,
    /// Longest time between two offset syncs of a partition that keeps receiving records, so
    /// translation of recent offsets stays exact even when nothing else forces a sync.
    #[serde(default = "defaults::offset_sync_interval")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('100ms') && duration(self) <= duration('1h')").message("offsetSyncInterval must be between 100ms and 1h"))]
    pub offset_sync_interval: SpecDuration,
    /// Replication factor of topics created on the target; -1 uses the target broker's default.
    #[serde(default = "defaults::replication_factor")]
    #[schemars(range(min = -1, max = 32))]
    pub replication_factor: i32,
    /// Source consumers in each replica, each with its own connections to the source brokers
    /// and its share of the replica's partitions. Far from the source one connection carries
    /// about one TCP window per round trip, so more connections copy faster; each costs a
    /// thread and its clients. Unset: one per 25 ms of round trip to the source measured at
    /// start (1 nearby, 2 at 50 ms, at most 4), the fetch window split between them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 8))]
    pub consumers: Option<u8>,
    /// What is copied as a unit ([`CopyUnit`]); unset, whole batches where they can carry the
    /// spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<CopyUnit>,
}

/// Settings of the checkpoint loop.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// Emit checkpoints.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// How often source group offsets are read and translated (MirrorMaker 2: 60s).
    #[serde(default = "defaults::checkpoint_interval")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('100ms') && duration(self) <= duration('1h')").message("interval must be between 100ms and 1h"))]
    pub interval: SpecDuration,
    /// How often the source's group list is re-read.
    #[serde(default = "defaults::groups_refresh")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('24h')").message("groupsRefreshInterval must be between 1s and 24h"))]
    pub groups_refresh_interval: SpecDuration,
    /// How often each group-partition's checkpoint is verified on the records themselves, at
    /// most: the target's record at the checkpoint read and compared with the source's at the
    /// group's commit, read-only, at most 1000 verifications (2000 reads) a minute per flow.
    /// `0s` turns verification off.
    #[serde(default = "defaults::verify_interval")]
    #[x_kube(validation = Rule::new("duration(self) == duration('0s') || (duration(self) >= duration('1s') && duration(self) <= duration('24h'))").message("verifyInterval must be 0s (off) or between 1s and 24h"))]
    pub verify_interval: SpecDuration,
    /// Also commit translated offsets into the target's groups, but only into groups with no
    /// active member there and never backwards.
    #[serde(default)]
    pub sync_group_offsets: bool,
}

/// Settings of the heartbeat loop.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatSpec {
    /// Emit heartbeats.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Time between two heartbeats.
    #[serde(default = "defaults::heartbeat_interval")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('100ms') && duration(self) <= duration('1h')").message("interval must be between 100ms and 1h"))]
    pub interval: SpecDuration,
}

/// Thresholds under which the flow is `FailoverReady`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailoverReadinessSpec {
    /// Oldest acceptable checkpoint of a group with committed offsets.
    #[serde(default = "defaults::max_checkpoint_age")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('24h')").message("maxCheckpointAge must be between 1s and 24h"))]
    pub max_checkpoint_age: SpecDuration,
    /// Largest acceptable age of the newest replicated heartbeat.
    #[serde(default = "defaults::max_heartbeat_lag")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('24h')").message("maxHeartbeatLag must be between 1s and 24h"))]
    pub max_heartbeat_lag: SpecDuration,
    /// Largest acceptable number of source records not yet copied, over all partitions.
    #[serde(default = "defaults::max_replication_lag")]
    #[schemars(range(min = 0))]
    pub max_replication_lag: i64,
}

/// Overrides for the replicator pods.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Extra labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Extra annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Node selector.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// How the replicas spread over failure domains. Default (empty): at most one replica
    /// more on any node than on another (`DoNotSchedule`; only nodes the pod may run on
    /// count, so one node runs every replica), and the same over zones where nodes carry
    /// `topology.kubernetes.io/zone`, preferred (`ScheduleAnyway`). Losing a node then leaves
    /// replicas elsewhere. Constraints given here replace the default; a `labelSelector` left
    /// out selects this flow's replicas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// The replicator image. Default: the operator's own image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

macro_rules! impl_default_from_serde {
    ($($t:ty),*) => {$(
        impl Default for $t {
            fn default() -> Self {
                // Every field has a serde default, so an empty map deserialises to the defaults.
                serde_json::from_value(serde_json::json!({}))
                    .unwrap_or_else(|e| unreachable!("defaults of {} must deserialise: {e}", stringify!($t)))
            }
        }
    )*};
}
impl_default_from_serde!(
    SourceLoopSpec,
    CheckpointSpec,
    HeartbeatSpec,
    FailoverReadinessSpec
);

/// The defaults, named so `kubectl explain`, the docs and the code say the same.
pub mod defaults {
    use super::SpecDuration;

    pub fn topics() -> Vec<String> {
        vec![".*".into()]
    }
    pub fn topics_exclude() -> Vec<String> {
        [r".*[\-\.]internal", r".*\.replica", "__.*"]
            .map(String::from)
            .to_vec()
    }
    pub fn groups() -> Vec<String> {
        vec![".*".into()]
    }
    pub fn groups_exclude() -> Vec<String> {
        ["console-consumer-.*", "connect-.*", "__.*"]
            .map(String::from)
            .to_vec()
    }
    pub fn replicas() -> i32 {
        1
    }
    pub fn yes() -> bool {
        true
    }
    pub fn topics_refresh() -> SpecDuration {
        SpecDuration::from_secs(10)
    }
    pub fn offset_sync_interval() -> SpecDuration {
        SpecDuration::from_secs(1)
    }
    pub fn replication_factor() -> i32 {
        -1
    }
    pub fn checkpoint_interval() -> SpecDuration {
        SpecDuration::from_millis(500)
    }
    pub fn groups_refresh() -> SpecDuration {
        SpecDuration::from_secs(10)
    }
    pub fn verify_interval() -> SpecDuration {
        SpecDuration::from_secs(60)
    }
    pub fn heartbeat_interval() -> SpecDuration {
        SpecDuration::from_secs(1)
    }
    pub fn max_checkpoint_age() -> SpecDuration {
        SpecDuration::from_secs(30)
    }
    pub fn max_heartbeat_lag() -> SpecDuration {
        SpecDuration::from_secs(30)
    }
    pub fn max_replication_lag() -> i64 {
        10_000
    }
}
