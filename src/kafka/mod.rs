//! Kafka client glue shared by the replicator, the operator's status probe and the CLI:
//! client configuration from a cluster spec, and small admin helpers.

pub mod acls;
pub mod admin;
pub mod checkpoints;
pub mod client_cert;
pub mod cluster_id;
pub mod commit;
pub mod config;
pub mod groups;
pub mod log_bounds;
pub mod positions;
pub mod reader;
pub mod refusals;
pub mod secrets;
pub mod writers;

pub use config::{ClientUse, ConfigError, check_cluster, client_config};
pub use secrets::{DEFAULT_SECRETS_DIR, SecretFiles};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Which side of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Source,
    Target,
}

impl Side {
    /// The name in metrics labels, logs and messages.
    pub fn name(self) -> &'static str {
        match self {
            Side::Source => "source",
            Side::Target => "target",
        }
    }
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a consumer cannot read a batch ([`is_unreadable_batch`]): the binary's inflaters keep the
/// reason of the last one they refused; librdkafka's own error says only its class.
pub fn unreadable_reason(e: &KafkaError) -> String {
    match (
        e.rdkafka_error_code(),
        mirrorflow_rdkafka_ext::inflater::refused().1,
    ) {
        (Some(RDKafkaErrorCode::BadCompression), Some(why)) => why.to_string(),
        _ => format!("the consumer reports '{e}'"),
    }
}

/// A consumer's error for a batch it cannot read (one that does not decode, or a batch past
/// the binary's inflate bound): librdkafka reports it without its partition and tries the
/// batch again, so the partition's reading stops there.
pub fn is_unreadable_batch(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::BadCompression
                | RDKafkaErrorCode::BadMessage
                | RDKafkaErrorCode::NotImplemented
        )
    )
}

/// Errors that mean the cluster cannot be reached (as opposed to a refused request).
pub fn is_unreachable(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::Resolve
                | RDKafkaErrorCode::MessageTimedOut
                | RDKafkaErrorCode::OperationTimedOut
                | RDKafkaErrorCode::RequestTimedOut
        )
    )
}
