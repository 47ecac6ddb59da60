//! Kafka client glue shared by the replicator, the operator's status probe and the CLI:
//! client configuration from a cluster spec, and small admin helpers.

pub mod checkpoints;
pub mod client_cert;
pub mod cluster_id;
pub mod config;
pub mod consumer_offsets;
pub mod log_bounds;
pub mod positions;
pub mod secrets;

pub use config::{ClientUse, ConfigError, check_cluster, client_config};
pub use secrets::{DEFAULT_SECRETS_DIR, SecretFiles};
