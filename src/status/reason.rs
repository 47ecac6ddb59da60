//! Condition reasons, as consts so docs and tests name the same strings.

pub const OK: &str = "AsExpected";
pub const INVALID_SPEC: &str = "InvalidSpec";
/// The Kafka client refuses a property of `spec.<side>.config` (unknown, or a bad value).
pub const INVALID_CLIENT_CONFIG: &str = crate::kafka::config::INVALID_CLIENT_CONFIG;
pub const SECRET_MISSING: &str = "SecretMissing";
pub const SOURCE_UNREACHABLE: &str = "SourceUnreachable";
pub const TARGET_UNREACHABLE: &str = "TargetUnreachable";
pub const SOURCE_AUTHENTICATION_FAILED: &str = "SourceAuthenticationFailed";
pub const TARGET_AUTHENTICATION_FAILED: &str = "TargetAuthenticationFailed";
pub const SOURCE_TLS_FAILED: &str = "SourceTLSFailed";
pub const TARGET_TLS_FAILED: &str = "TargetTLSFailed";
pub const SOURCE_CERTIFICATE_REFUSED: &str = "SourceCertificateRefused";
pub const TARGET_CERTIFICATE_REFUSED: &str = "TargetCertificateRefused";
/// OAUTHBEARER: the token endpoint refused the client id, secret or scope.
pub const SOURCE_CLIENT_CREDENTIALS_REFUSED: &str = "SourceClientCredentialsRefused";
pub const TARGET_CLIENT_CREDENTIALS_REFUSED: &str = "TargetClientCredentialsRefused";
/// OAUTHBEARER: no token from the token endpoint (unreachable, TLS, not an OAuth answer).
pub const SOURCE_TOKEN_ENDPOINT_UNREACHABLE: &str = "SourceTokenEndpointUnreachable";
pub const TARGET_TOKEN_ENDPOINT_UNREACHABLE: &str = "TargetTokenEndpointUnreachable";
/// OAUTHBEARER: the brokers refused the token the endpoint issued.
pub const SOURCE_TOKEN_REFUSED: &str = "SourceTokenRefused";
pub const TARGET_TOKEN_REFUSED: &str = "TargetTokenRefused";
pub const REPLICAS_NOT_READY: &str = "ReplicasNotReady";
/// A replica is on a node the node controller lost; the operator replaces it after a bound.
pub const REPLICA_ON_LOST_NODE: &str = "ReplicaOnLostNode";
/// A replicator pod cannot run, by class (`operator::unready`): killed for its memory limit,
/// exiting with an error of its own, missing a Secret it mounts, its image not pullable, no
/// node able to take it.
pub const REPLICATOR_OUT_OF_MEMORY: &str = "ReplicatorOutOfMemory";
pub const REPLICATOR_CRASHING: &str = "ReplicatorCrashing";
pub const REPLICATOR_CONFIG_MISSING: &str = "ReplicatorConfigMissing";
/// The StatefulSet controller cannot create a replicator pod: a ResourceQuota, a LimitRange,
/// the namespace's Pod Security level or an admission webhook refuses it.
pub const REPLICATOR_NOT_CREATED: &str = "ReplicatorNotCreated";
pub const REPLICATOR_IMAGE_UNAVAILABLE: &str = "ReplicatorImageUnavailable";
pub const REPLICATOR_UNSCHEDULABLE: &str = "ReplicatorUnschedulable";
pub const NO_HEARTBEATS: &str = "NoHeartbeats";
pub const HEARTBEAT_LAG_HIGH: &str = "HeartbeatLagHigh";
pub const NO_CHECKPOINTS: &str = "NoCheckpoints";
/// A selected group of a kind whose position MirrorFlow does not mirror (share groups).
pub const GROUPS_NOT_MIRRORED: &str = "GroupsNotMirrored";
pub const CHECKPOINTS_STALE: &str = "CheckpointsStale";
/// A group's checkpoint points into a remote partition that was recreated since.
pub const CHECKPOINTS_INVALIDATED: &str = "CheckpointsInvalidated";
/// A group's checkpoint is at its commit but was translated conservatively: a failover now
/// would re-read records until the copy's offset sync reaches the commit.
pub const CHECKPOINTS_CONSERVATIVE: &str = "CheckpointsConservative";
/// A verification of a group's checkpoint on the records found that a failover to it would not
/// resume on the record the group reads next (a record another producer wrote, a wrong
/// translation).
pub const RECORDS_MISMATCH: &str = "RecordsMismatch";
pub const REPLICATION_LAG_HIGH: &str = "ReplicationLagHigh";
/// A cluster refused a remote topic's creation, growth or config sync (or the source's configs
/// could not be read), so that topic is not copied, or not as its source is.
pub const TOPIC_CHANGES_REFUSED: &str = "TopicChangesRefused";
/// A group committed past what is copied, so no checkpoint can cover it yet.
pub const REPLICATION_BEHIND: &str = "ReplicationBehind";
pub const HEARTBEATS_DISABLED: &str = "HeartbeatsDisabled";
pub const CHECKPOINTS_DISABLED: &str = "CheckpointsDisabled";
/// Observe mode: another tool replicates; the operator only watches.
pub const OBSERVING: &str = "Observing";
pub const NO_GAPS: &str = "NoGaps";
pub const SOURCE_TRUNCATED: &str = "SourceTruncated";
pub const SOURCE_TOPIC_RECREATED: &str = "SourceTopicRecreated";
pub const TARGET_TOPIC_RECREATED: &str = "TargetTopicRecreated";
/// The target refused a record as too large; the replicator skipped it.
pub const RECORD_REJECTED: &str = "RecordRejected";
/// Aligned mode: fillers below a new remote partition's log start could not be deleted.
pub const FILLERS_NOT_DELETED: &str = "FillersNotDeleted";
/// `spec.offsets: Aligned`: every remote partition holds its records at their source offsets.
pub const OFFSETS_MATCH: &str = "OffsetsMatch";
/// `spec.offsets: Aligned` broke on a partition; its later offsets are translated.
pub const OFFSETS_MISALIGNED: &str = "OffsetsMisaligned";
/// `spec.offsets: Aligned`, but the positions topic could not be read yet.
pub const ALIGNMENT_UNKNOWN: &str = "AlignmentUnknown";
/// The apiserver refused a child object built from the flow (field named in the message).
pub const CHILD_REJECTED: &str = "ChildRejected";
/// The cluster's policy refused to let the operator write a child object (a ResourceQuota, an
/// admission policy, the operator's own RBAC): who refused is named in the message.
pub const CHILD_FORBIDDEN: &str = "ChildForbidden";
/// Source and target are the same Kafka cluster (same cluster id).
pub const SAME_CLUSTER: &str = "SameCluster";
/// Another flow already keeps its internal topics under the same names on the target.
pub const CONFLICTING_FLOW: &str = "ConflictingFlow";
/// An older flow copies the other way between the same clusters and one of the two uses the
/// Identity policy: records would go back and forth forever.
pub const REPLICATION_LOOP: &str = "ReplicationLoop";
/// A ConfigMap, Service, StatefulSet, PodDisruptionBudget or NetworkPolicy of the name this flow's child needs
/// exists and is not this flow's: nothing is applied over it.
pub const CHILD_CONFLICT: &str = "ChildConflict";
/// A partition has copied nothing for a minute while its source holds records beyond it.
pub const PARTITION_STALLED: &str = "PartitionStalled";
/// `spec.pod.labels` or `spec.pod.annotations` has a key the operator's installer did not allow.
pub const POD_METADATA_NOT_ALLOWED: &str = "PodMetadataNotAllowed";
/// `spec.resources` asks for more than the operator's installer allows per replicator container,
/// for a resource it does not bound, for requests without limits where limits are required,
/// or is not a quantity the operator reads.
pub const RESOURCES_NOT_ALLOWED: &str = "ResourcesNotAllowed";
/// A bootstrap server resolves to an address the operator's installer does not let it connect
/// to (chart value `probeAddresses`): the probe does not connect, no replicator runs.
pub const ADDRESS_NOT_ALLOWED: &str = "AddressNotAllowed";
/// A cluster's metadata lists more brokers than the operator's probe follows.
pub const TOO_MANY_BROKERS: &str = "TooManyBrokers";
/// A referenced Secret has not opted in to being used by this flow.
pub const SECRET_NOT_SHARED: &str = "SecretNotShared";
/// `spec.pod.image` is not among the images the operator's installer allowed.
pub const IMAGE_NOT_ALLOWED: &str = "ImageNotAllowed";
/// `spec.sourceLoop.syncTopicAcls`: bindings copied from the source's topic ACLs are not on
/// the target (yet, or the target refuses them).
pub const TOPIC_ACLS_MISSING: &str = "TopicAclsMissing";
/// `spec.sourceLoop.syncTopicAcls`: the flow's principal lacks DESCRIBE (or, on the target,
/// ALTER) on a cluster's cluster resource.
pub const TOPIC_ACLS_FORBIDDEN: &str = "TopicAclsForbidden";
/// `spec.sourceLoop.syncTopicAcls`: a cluster's ACLs could not be read this time.
pub const TOPIC_ACLS_UNKNOWN: &str = "TopicAclsUnknown";
/// The bootstrap address answers, but not as a Kafka broker (an HTTP or SSH server...).
pub const SOURCE_NOT_KAFKA: &str = "SourceNotKafka";
pub const TARGET_NOT_KAFKA: &str = "TargetNotKafka";
/// The listener's security differs from the spec's: TLS expected or not, SASL expected or not.
pub const SOURCE_SECURITY_MISMATCH: &str = "SourceSecurityMismatch";
pub const TARGET_SECURITY_MISMATCH: &str = "TargetSecurityMismatch";
/// The listener does not enable `spec.<side>.sasl.mechanism` (the message lists what it does).
pub const SOURCE_SASL_MECHANISM_NOT_ENABLED: &str = "SourceSaslMechanismNotEnabled";
pub const TARGET_SASL_MECHANISM_NOT_ENABLED: &str = "TargetSaslMechanismNotEnabled";
/// A Secret value larger than a value of its kind may be (refused before it is sent).
pub const SECRET_VALUE_TOO_LARGE: &str = crate::kafka::secrets::SECRET_VALUE_TOO_LARGE;
/// The flow's topic selection matches no topic on the source: it copies nothing.
pub const NO_TOPICS_MATCHED: &str = "NoTopicsMatched";
/// No consumer group the flow selects has committed offsets on the mirrored topics.
pub const NO_GROUPS_MATCHED: &str = "NoGroupsMatched";
/// More replicas than the mirrored topics have partitions: the others idle (`Ready` stays True).
pub const REPLICAS_ABOVE_PARTITIONS: &str = "ReplicasAbovePartitions";
/// A spec change would move the running flow's copies (naming policy, alias, target cluster):
/// held until accepted for its generation.
pub const PLACEMENT_CHANGED: &str = "PlacementChanged";
/// The credentials were accepted but the flow's principal may not read or write what it needs
/// (topic, group or cluster authorization failed).
pub const SOURCE_NOT_AUTHORIZED: &str = "SourceNotAuthorized";
pub const TARGET_NOT_AUTHORIZED: &str = "TargetNotAuthorized";
/// An alias of the flow names another Kafka cluster (by cluster id) in an older flow.
pub const ALIAS_NAMES_TWO_CLUSTERS: &str = "AliasNamesTwoClusters";
/// A target topic the probe follows (positions, checkpoints, heartbeats) holds what the flow's
/// replicators never write (a batch inflating past the probe's cap, too many entries): the
/// probe stopped reading it, so the status it needs from it is unknown. On `Replicating`: a
/// topic a replicator's loop follows (the offset syncs) holds a batch it cannot read on.
pub const INTERNAL_TOPIC_REFUSED: &str = "InternalTopicRefused";
