//! MirrorMaker 2 compatibility core: wire formats, topic naming, filters, offset syncs and
//! translation, checkpoint emission rules.
//!
//! Pure: no Kafka client, no async, no files. The replicator and the operator do the I/O and
//! call into this module, so every rule here is testable without a cluster.
//!
//! | concern | items |
//! |---|---|
//! | records on MM2's internal topics | [`Checkpoint`], [`Heartbeat`], [`OffsetSync`] |
//! | offset commits on `__consumer_offsets` | [`consumer_offsets::decode`] |
//! | topic naming, cycles | [`ReplicationPolicy`], [`PrefixPolicy`], [`IdentityPolicy`] |
//! | which topics and groups | [`Filters`], [`NameFilter`] |
//! | when to write an offset sync | [`SyncPolicy`] |
//! | committed source offset -> target offset | [`OffsetSyncStore`], [`Translation`] |
//! | when to write a checkpoint | [`CheckpointTracker`] |
//! | target offset -> source offset (failback) | [`InverseSyncs`] |
//! | record batches copied whole, or written anew when the target cannot take them | [`batch`], [`batch::rewrite`] |
//! | the Kafka requests that copy sends | [`protocol`] |
//! | MirrorFlow's positions topic (positions, gaps, claims, refusals) | [`positions`] |

pub mod batch;
mod checkpoint;
pub mod consumer_offsets;
#[cfg(test)]
mod fields;
mod filter;
mod policy;
pub mod positions;
pub mod protocol;
mod records;
mod sync;
mod wire;

pub use checkpoint::CheckpointTracker;
pub use filter::{
    DEFAULT_GROUPS, DEFAULT_GROUPS_EXCLUDE, DEFAULT_TOPICS, DEFAULT_TOPICS_EXCLUDE, FilterError,
    Filters, NameFilter, SkipReason, TopicDecision, parse_list, topic_decision,
};
pub use policy::{
    DEFAULT_HEARTBEATS_TOPIC, DEFAULT_SEPARATOR, IdentityPolicy, PolicyError, PrefixPolicy,
    ReplicationPolicy,
};
pub use records::{Checkpoint, EncodedRecord, Heartbeat, OffsetSync, TopicPartition};
pub use sync::{
    CopyStart, Coverage, DEFAULT_HISTORY_BYTES, DEFAULT_MAX_RUNS, InvalidSync, InverseSyncs,
    OffsetSyncStore, PartitionSyncs, SYNC_ORIGIN_DENSE, SYNC_ORIGIN_HEADER, SYNC_START_HEADER,
    StoreConfig, SyncOrigin, SyncPolicy, SyncPolicyConfig, SyncReason, Translation, UnknownReason,
};
pub use wire::{DecodeError, EncodeError, MAX_OFFSET, MAX_STRING_LEN};
