//! The delivery policies of the copy engine ([`super::engine`]): what each keeps of a partition
//! beyond what the engine holds, what a polled record becomes, and what is committed when.
//!
//! - [`at_least_once`]: an idempotent producer, positions stored about every second;
//! - [`exactly_once`]: a transaction per partition (records, syncs and the position together);
//! - [`aligned`]: every record at its source offset on the target;
//! - [`batches`]: the source's record batches written whole by the project's own writer.

pub mod aligned;
pub mod at_least_once;
pub mod batches;
pub mod exactly_once;
