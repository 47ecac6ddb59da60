//! Whether a checkpoint holds on the records themselves: the record a group would read first
//! on the target after a failover against the one it would read next on the source.
//!
//! Shared by `mirrorflow drill` (once, on demand) and the checkpoint loop's continuous,
//! sampled verification ([`crate::replicator::checkpoint`]): [`judge`] places the target's
//! record among the source's, [`outcome`] says what that means for a checkpoint, and
//! [`header`] carries the outcome on the checkpoint record to the operator's probe.

pub mod header;
pub mod judge;
pub mod outcome;
