//! What the checkpoint loop's reader threads (and its verifier) tell it, through one channel.

use std::collections::HashSet;

use super::state::Commit;
use super::verify::Verified;
use crate::kafka::checkpoints::Exactness;
use crate::mm2::{Checkpoint, OffsetSync, SyncOrigin, TopicPartition};

/// What the reader threads tell the loop.
#[derive(Debug)]
pub enum Event {
    Assigned(Vec<i32>),
    Revoked(Vec<i32>),
    /// Sent after a revocation; answered when the loop handles it. The loop handles events
    /// only between its turns, once every checkpoint it decided is acknowledged or failed,
    /// and it forgets the revoked groups first: the revocation (and so the group's move to
    /// another replica) waits until none of its writes for them is in flight
    /// ([`commits::hand_over`]).
    Handover(std::sync::mpsc::Sender<()>),
    CaughtUp(i32),
    Commit {
        co_partition: i32,
        group: String,
        tp: TopicPartition,
        commit: Option<Commit>,
    },
    /// An offset sync, with its record timestamp.
    Sync(OffsetSync, SyncOrigin, Option<i64>),
    SyncsLoaded,
    /// The source loop found the remote partition of this SOURCE partition recreated at
    /// `detected_ms` (a `TargetTopicRecreated` gap in the positions topic).
    TargetRecreated {
        tp: TopicPartition,
        detected_ms: i64,
    },
    /// A checkpoint read back from the checkpoints topic, with its record timestamp and what
    /// its writer said of its translation.
    CheckpointRead(Checkpoint, Option<i64>, Exactness),
    CheckpointsLoaded,
    /// The checkpoints follower read everything the topic held when mark N was asked for.
    CheckpointsMark(u64),
    /// The verifier thread judged a checkpoint on its records ([`verify`]).
    Verified(Box<Verified>),
    /// The share groups of the source the flow selects, told before their start offsets come
    /// as commits ([`share_groups`]): checkpointed, never synced into the target as a consumer
    /// group's offsets.
    ShareGroups(HashSet<String>),
}
