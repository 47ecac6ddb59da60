//! The source loop: discovers topics, keeps remote topics in line, copies records, writes
//! offset syncs and stores source positions.
//!
//! | part | module |
//! |---|---|
//! | which topics, what the target needs (pure) | [`topics`] |
//! | listing, creating, growing, config sync (I/O) | [`discovery`] |
//! | what the clusters refused, recorded for the operator | [`refused`] |
//! | topic ACL sync (I/O; the pure part is [`crate::kafka::acls`]) | [`acl_sync`] |
//! | starting and ending the loop: internal topics, fetch plan, a copy loop per consumer, discovery | [`start`] |
//! | the copy engine: run loop, the generic partition slot and its table, the ownership skeletons (stored positions, fenced writers), the stall watch, sending | [`engine`] |
//! | delivery policies: what is committed and how | [`policies`]: [`policies::at_least_once`], [`policies::exactly_once`], [`policies::aligned`], [`policies::batches`] |
//! | what may be committed per partition (pure) | [`progress`] |
//! | positions topic format and reader | [`crate::kafka::positions`] |
//! | client settings | [`clients`] |
//!
//! # Work split between replicas: a consumer group on the source
//! Every replica of a flow joins the group [`source_group_id`] with the cooperative-sticky
//! assignor, so the group protocol guarantees a partition has one owner at a time and scaling
//! moves only the partitions that change owner. Offsets are never committed to the source:
//! the group is used for assignment only. Before letting go of a partition (revocation,
//! shutdown) a replica waits for its writes and stores its position on the target; the next
//! owner reads the positions topic to its end before starting, so a graceful move neither
//! repeats nor skips records. A crash (or a lost assignment) repeats the records since the
//! last stored position (at most about one second's worth plus what was in flight).
//!
//! # Offset syncs
//! Written in MM2's format to [`crate::mm2::ReplicationPolicy::offset_syncs_topic`] of the
//! target alias on the source (default) or of the source alias on the target, following the
//! dense [`crate::mm2::SyncPolicy`] fed with every acknowledged (upstream, downstream) pair.
//! A partition that goes idle (no record acknowledged for `offsetSyncInterval`) with records
//! after its last sync gets one more, "tail" sync at its last record
//! ([`crate::mm2::SyncPolicy::idle_sync`]), so groups that consumed up to the end of a burst
//! translate exactly instead of waiting for the next record.
//! Each carries the header [`crate::mm2::SYNC_ORIGIN_HEADER`] = [`crate::mm2::SYNC_ORIGIN_DENSE`];
//! MM2's readers ignore headers. A position never moves past a record whose sync is unacknowledged, and a failed
//! sync rewinds its partition (the records are copied again and get fresh syncs), so no sync
//! is dropped silently.
//!
//! # Exactly-once (`spec.exactlyOnce`)
//! The [`policies::exactly_once`] policy runs on the same engine: a transactional producer per owned
//! partition puts records, offset syncs (on the target) and the position in one transaction,
//! and fences the partition's previous writer.

pub mod acl_sync;
pub mod clients;
pub mod continuity;
pub mod discovery;
pub mod engine;
pub mod limits;
pub mod policies;
pub mod progress;
pub mod refused;
pub mod start;
pub mod topics;

use crate::api::{CopyUnit, OffsetSyncsLocation, OffsetsMode};
use crate::flow::Flow;
use crate::replicator::reach::Side;

/// The source consumer group of a flow; the checkpoint loop leaves it out.
///
/// The aliases are part of it because a standalone flow's name is its file's name, which
/// two unrelated flows may share (`flow.yaml`).
pub fn source_group_id(flow: &Flow) -> String {
    let name: String = flow
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "mirrorflow.{name}.{}-{}.source",
        flow.source_alias(),
        flow.target_alias()
    )
}

/// The offset-syncs topic and the cluster it lives on.
pub fn offset_syncs_topic(flow: &Flow) -> (Side, String) {
    match flow.spec.source_loop.offset_syncs_location {
        OffsetSyncsLocation::Source => (
            Side::Source,
            flow.policy.offset_syncs_topic(flow.target_alias()),
        ),
        OffsetSyncsLocation::Target => (
            Side::Target,
            flow.policy.offset_syncs_topic(flow.source_alias()),
        ),
    }
}

/// How a flow's records are written: one policy of the copy engine each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyMode {
    AtLeastOnce,
    /// `spec.offsets: Aligned` (exactly-once wins when both are set).
    Aligned,
    ExactlyOnce,
    /// Whole batches (`spec.sourceLoop.copy: Batches`, or unset without `exactlyOnce` and
    /// `offsets: Aligned`, which validation refuses with it).
    Batches,
}

impl CopyMode {
    fn of(flow: &Flow) -> Self {
        if crate::flow::copy_unit(&flow.spec) == CopyUnit::Batches {
            CopyMode::Batches
        } else if flow.spec.exactly_once {
            CopyMode::ExactlyOnce
        } else if flow.spec.offsets == OffsetsMode::Aligned {
            CopyMode::Aligned
        } else {
            CopyMode::AtLeastOnce
        }
    }
}
