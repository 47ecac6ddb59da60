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

/// A self-signed certificate (1 day, RSA 2048) for `/CN=<cn>`, made with openssl in `dir`:
/// (certificate path, key path). Trusted by nothing of the world's: a CA the brokers do not use,
/// or a client certificate their clients CA did not sign.
pub fn self_signed(dir: &std::path::Path, cn: &str) -> Result<(String, String)> {
    let path =
        |name: &str| -> Result<String> { Ok(dir.join(name).to_str().context("path")?.to_string()) };
    let (cert, key) = (path(&format!("{cn}.pem"))?, path(&format!("{cn}.key"))?);
    crate::run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &key,
            "-out",
            &cert,
        ],
    )?;
    Ok((cert, key))
}
