//! Offset syncs: when the source loop writes them ([`SyncPolicy`]) and how the checkpoint
//! loop translates committed offsets with them ([`OffsetSyncStore`]); failback reads them
//! backwards ([`InverseSyncs`]).

mod history;
mod inverse;
mod policy;
mod start;
mod store;
#[cfg(test)]
mod tests;

pub use inverse::InverseSyncs;
pub use policy::{Coverage, SyncPolicy, SyncPolicyConfig, SyncReason};
pub use start::{CopyStart, SYNC_START_HEADER};
pub use store::{
    DEFAULT_HISTORY_BYTES, DEFAULT_MAX_RUNS, InvalidSync, OffsetSyncStore, PartitionSyncs,
    SYNC_ORIGIN_DENSE, SYNC_ORIGIN_HEADER, StoreConfig, SyncOrigin, Translation, UnknownReason,
};
