//! Broker connections for a copy that keeps record batches whole: one blocking connection per
//! broker ([`Cluster`] keeps them, and finds partitions' leaders), plaintext or TLS, authenticated with SASL PLAIN, SCRAM or OAUTHBEARER ([`oauth`]) when the cluster asks for
//! it, sending the requests of [`mirrorflow_core::protocol`] and reading their answers in
//! order.
//!
//! What a flow's cluster spec resolves to (CA, client certificate, SASL credentials) comes in
//! as a [`Security`]; nothing here reads files or Secrets.

mod cluster;
mod conn;
pub mod fetcher;
pub mod oauth;
mod scram;
mod stream;
pub mod writer;

pub use cluster::{Cluster, ListingBounds, MAX_BOOTSTRAP};
pub use conn::{AddressCheck, Conn, Duplex, Options};
pub use fetcher::{FetchLimits, Fetcher};
pub use oauth::OAuth;
pub use scram::{Scram, ScramHash};
pub use writer::Writer;

use mirrorflow_core::protocol::ErrorCode;
use mirrorflow_core::{DecodeError, EncodeError};

/// How to reach a cluster's brokers.
#[derive(Debug, Clone, Default)]
pub struct Security {
    pub tls: Option<Tls>,
    pub sasl: Option<Sasl>,
}

/// TLS to the brokers.
#[derive(Clone, Default)]
pub struct Tls {
    /// PEM certificates to trust; `None` trusts the system's CAs.
    pub ca_pem: Option<String>,
    /// PEM client certificate (with its chain) and private key, for mutual TLS.
    pub client: Option<(String, String)>,
    /// Whether the broker's certificate must name the host connected to (Kafka's default).
    pub verify_hostname: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field("client", &self.client.as_ref().map(|_| "<pem>"))
            .field("verify_hostname", &self.verify_hostname)
            .finish()
    }
}

/// SASL credentials.
#[derive(Clone)]
pub enum Sasl {
    Plain {
        user: String,
        password: String,
    },
    Scram {
        hash: ScramHash,
        user: String,
        password: String,
    },
    /// Tokens from an OAuth token endpoint ([`oauth`]).
    OAuthBearer(OAuth),
}

impl std::fmt::Debug for Sasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sasl::Plain { user, .. } => write!(f, "Plain {{ user: {user:?} }}"),
            Sasl::Scram { hash, user, .. } => write!(f, "Scram {{ {hash:?}, user: {user:?} }}"),
            Sasl::OAuthBearer(oauth) => write!(f, "OAuthBearer {{ {oauth:?} }}"),
        }
    }
}

impl Sasl {
    fn mechanism(&self) -> &'static str {
        match self {
            Sasl::Plain { .. } => "PLAIN",
            Sasl::Scram { hash, .. } => hash.mechanism(),
            Sasl::OAuthBearer(_) => "OAUTHBEARER",
        }
    }
}

/// Why talking to a broker failed. Messages name the broker and never a credential.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("{peer}: {source}")]
    Io {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{peer}: TLS: {message}")]
    Tls { peer: String, message: String },
    #[error("SASL: {message}")]
    Authentication { message: String },
    /// No OAuth token: the class of the failure only, never the endpoint's answer.
    #[error("OAuth token: {message}")]
    Token { message: String },
    #[error("{peer}: {api} answered {error}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Broker {
        peer: String,
        api: &'static str,
        error: ErrorCode,
        message: String,
    },
    #[error("{peer} does not serve {api} version {version}")]
    Unsupported {
        peer: String,
        api: &'static str,
        version: i16,
    },
    #[error("{peer}: answer frame of {size} bytes (at most {max})")]
    FrameSize { peer: String, size: i64, max: usize },
    #[error("{peer}: {source}")]
    Decode {
        peer: String,
        #[source]
        source: DecodeError,
    },
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The address was refused before connecting ([`Options::address_check`]).
    #[error("{peer}: not connected: {why}")]
    AddressRefused { peer: String, why: String },
    #[error("bootstrap: {count} addresses (1 to {max})")]
    Bootstrap { count: usize, max: usize },
    #[error("broker {node_id} is not in the cluster's metadata")]
    UnknownBroker { node_id: i32 },
    #[error("a batch to write: {message}")]
    Batch { message: String },
    #[error("{peer}: the connection a request was sent on is gone")]
    Replaced { peer: String },
    /// An answer, or what several answers add up to, past what the caller allows.
    #[error("{what}: {count}, more than the {max} allowed")]
    Limit {
        what: &'static str,
        count: usize,
        max: usize,
    },
}
