//! MirrorFlow: MirrorMaker 2 compatible Kafka replication run by a Kubernetes operator.
//!
//! The crate is layered so that the folder names map the architecture:
//! - [`api`]: the `MirrorFlow` resource types, defaults, validation and CRD (crate `mirrorflow-api`).
//! - [`cli`]: the failover CLI (`translate`, `failover`, `failback`), also a kubectl plugin.
//! - [`clock`]: wall-clock milliseconds, the one way every loop and the probe read the time.
//! - [`flow`]: a flow file or resource validated and turned into what the loops and the probe
//!   run on (filters, naming policy, client configs); shared by the replicator and the operator.
//! - [`kafka`]: Kafka client configuration (TLS, SASL from Secret files) and admin helpers.
//! - [`mm2`]: MirrorMaker 2 wire formats, naming policies, filters, offset syncs and translation
//!   (crate `mirrorflow-core`).
//!   Pure: no I/O, shared by the replicator, the operator and the CLI.
//! - [`operator`]: the control plane: reconcile MirrorFlows into replicators, status from the clusters.
//! - [`replicator`]: the data plane: source, checkpoint and heartbeat loops, metrics, health.
//! - [`status`]: a flow's status from the clusters (probe, conditions), shared by the operator
//!   and the CLI.
//! - [`verify`]: checkpoints checked on the records themselves (the drill's and the checkpoint
//!   loop's shared rules, and the header that carries the outcome to the probe).

/// The resource types live in their own crate (no Kafka or Kubernetes client), named here as
/// before.
pub use mirrorflow_api as api;
pub mod cli;
pub mod clock;
pub mod flow;
pub mod kafka;
/// The MirrorMaker 2 core lives in its own crate (no Kafka or Kubernetes client), named here
/// as before.
pub use mirrorflow_core as mm2;
pub mod operator;
pub mod replicator;
pub mod status;
pub mod verify;
