//! The world's SASL_SSL listener (SCRAM-SHA-512 over TLS, `e2e/lib/kafka.sh`): where it is and
//! the credentials that open it.

use anyhow::{Context, Result};

pub struct SecureKafka {
    /// `host:port` of the source cluster's SASL_SSL listener.
    pub source_bootstrap: String,
    /// PEM of the certificate the brokers present (self-signed, so it is its own CA).
    pub ca_pem: String,
    pub user: String,
    pub password: String,
}

impl SecureKafka {
    pub fn from_env() -> Result<SecureKafka> {
        let var = |n: &str| {
            std::env::var(n).with_context(|| {
                format!("{n} is not set: run the tests through e2e/test.sh, which starts the world")
            })
        };
        let ca_path = var("MF_KAFKA_CA_PEM")?;
        let password_path = var("MF_KAFKA_SCRAM_PASSWORD_FILE")?;
        Ok(SecureKafka {
            source_bootstrap: var("MF_SOURCE_SECURE_BOOTSTRAP")?,
            ca_pem: std::fs::read_to_string(&ca_path)
                .with_context(|| format!("reading {ca_path}"))?,
            user: var("MF_KAFKA_SCRAM_USER")?,
            password: std::fs::read_to_string(&password_path)
                .with_context(|| format!("reading {password_path}"))?
                .trim()
                .to_string(),
        })
    }
}
