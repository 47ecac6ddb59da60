//! The `MirrorFlow` status: what the operator measured on the clusters themselves.
//!
//! Durations are strings ("3s", "1m2s") so `kubectl get mf` columns read well; the same values
//! as numbers are in the metrics.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state of a flow.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MirrorFlowStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the operator last computed this status from the clusters (RFC 3339): how old its
    /// figures are. It moves on every probe, so a time far in the past means the operator has
    /// stopped measuring this flow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_time: Option<String>,
    /// `Ready`, `Replicating`, `CheckpointsFresh`, `HeartbeatsFlowing`, `FailoverReady`, each with
    /// a reason and a message saying what to do when it is not True.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// Replicator pods that exist / are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// End-to-end lag measured from the source's heartbeats replicated to the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<HeartbeatStatus>,
    /// Freshness of the checkpoints on the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<CheckpointsStatus>,
    /// Source topics mirrored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topics: Option<i32>,
    /// Consumer groups checkpointed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<i32>,
    /// Source records not yet on the target, summed over all mirrored partitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_lag: Option<i64>,
    /// The groups furthest from being able to fail over, worst first (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub least_ready_groups: Vec<GroupReadiness>,
    /// Breaks in continuity the replicator found and did not skip silently (records deleted
    /// on the source before they were copied, a recreated source or remote topic), oldest
    /// first, at most 20; those detected at or before the time in the annotation
    /// `mirrorflow.io/gaps-acknowledged` are left out. Condition `Gapless` sums them up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<GapStatus>,
    /// Where the replicators write, as the operator last deployed them. A spec change that
    /// would move the copies (another naming policy or separator, another alias, another
    /// target cluster) is held, the running replicators kept, until the annotation
    /// `mirrorflow.io/accept-placement-change` names the new `metadata.generation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployed_placement: Option<DeployedPlacement>,
}

/// The spec fields that decide where a flow's copies go: remote topic names, internal topic
/// names, the target cluster.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DeployedPlacement {
    /// `spec.replicationPolicy.type`: `Prefix` or `Identity`.
    pub policy: String,
    /// `spec.replicationPolicy.separator` of a `Prefix` policy (its default `.` written out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub separator: Option<String>,
    /// `spec.source.alias`.
    pub source_alias: String,
    /// `spec.target.alias`.
    pub target_alias: String,
    /// `spec.target.bootstrapServers`, as a sorted, lower-case list.
    pub target_bootstrap_servers: String,
}

/// One break in a partition's continuity.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GapStatus {
    /// The source topic.
    pub topic: String,
    pub partition: i32,
    /// `SourceTruncated` (source offsets `from`..`to` were deleted before they were copied),
    /// `SourceTopicRecreated` (the source log ends at `to`, before the copied position
    /// `from`), `TargetTopicRecreated` (the remote log ends at `to`, before `from` where the
    /// copies reached; the partition was copied again).
    pub reason: String,
    pub from: i64,
    pub to: i64,
    /// When the replicator found it (RFC 3339).
    pub detected_at: String,
    /// What happened, in a sentence.
    pub message: String,
}

/// Heartbeat lag.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatStatus {
    /// Age of the newest source heartbeat seen on the target (e.g. "2s").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<String>,
    /// When that heartbeat was emitted on the source (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<String>,
}

/// Checkpoint freshness.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointsStatus {
    /// Age of the most recent checkpoint of any group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_age: Option<String>,
    /// Age of the stalest group's latest checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_age: Option<String>,
}

/// How ready one consumer group is to fail over.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GroupReadiness {
    /// The consumer group.
    pub group: String,
    /// Age of its newest checkpoint ("never" when it has none).
    pub checkpoint_age: String,
    /// Records the group would read again on the target after a failover now, at most.
    pub estimated_replay_records: i64,
    /// CamelCase reason it is not ready, or `Ready`: `NoCheckpoint` (committed offsets on the
    /// source, no checkpoint on the target), `CheckpointStale` (its checkpoints stopped following
    /// its commits for longer than `maxCheckpointAge`), `ReplicationBehind` (it committed past
    /// what is copied, so no checkpoint can cover it yet), `CheckpointInvalidated` (a checkpoint
    /// points into a remote partition recreated since), `CheckpointConservative` (a checkpoint at
    /// its commit was translated conservatively: a failover now would re-read records until the
    /// copy's offset sync reaches the commit), `RecordsMismatch` (a verification of a
    /// checkpoint on the records found that a failover to it would not resume on the record
    /// the group reads next).
    pub reason: String,
    /// What that means and what to do.
    pub message: String,
    /// How long ago a checkpoint of the group was last verified on the records themselves
    /// (`spec.checkpoints.verifyInterval`); absent before the first verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_verified: Option<String>,
    /// Partitions whose checkpoint was verified on the records, of those with a checkpoint
    /// (`3/4`); absent before the first verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_partitions: Option<String>,
}
