//! MirrorFlow: MirrorMaker 2 compatible Kafka replication run by a Kubernetes operator.
//!
//! The crate is layered so that the folder names map the architecture:
//! - [`mm2`]: MirrorMaker 2 wire formats, naming policies, filters, offset syncs and translation.
//!   Pure: no I/O, shared by the replicator, the operator and the CLI.

pub mod mm2;
