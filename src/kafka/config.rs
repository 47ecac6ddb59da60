//! Kafka client configuration from a [`ClusterSpec`]: bootstrap, TLS, SASL, extra properties.
//!
//! Credentials never live in the spec: a spec names Secret keys, and the process reads them from
//! files (the operator mounts each Secret at `<secrets dir>/<secret name>/<key>`; a standalone
//! run points `--secrets-dir` at a folder laid out the same way).

use std::path::{Path, PathBuf};

use rdkafka::ClientConfig;

use crate::api::{ClusterSpec, SaslMechanism, SecretKeyRef};

/// Where a pod finds the Secrets the operator mounted for it.
pub const DEFAULT_SECRETS_DIR: &str = "/var/run/mirrorflow/secrets";

/// Client properties that carry secrets: refused in `config`, so they cannot leak into a
/// ConfigMap or a log line.
const SECRET_PROPERTIES: &[&str] = &[
    "sasl.password",
    "sasl.username",
    "sasl.jaas.config",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
    "ssl.truststore.password",
    "sasl.oauthbearer.client.secret",
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "{field}: cannot read Secret '{secret}' key '{key}' at {path}: {source}; create the Secret with that key in the flow's namespace"
    )]
    SecretUnreadable {
        field: String,
        secret: String,
        key: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{field}: '{property}' carries a secret and is not allowed here; use {instead}")]
    SecretInConfig {
        field: String,
        property: String,
        instead: &'static str,
    },
    #[error("{field}: bootstrapServers is empty; give at least one host:port")]
    NoBootstrap { field: String },
}

impl ConfigError {
    /// A low-cardinality label for metrics and condition reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            ConfigError::SecretUnreadable { .. } => "SecretMissing",
            ConfigError::SecretInConfig { .. } | ConfigError::NoBootstrap { .. } => "InvalidSpec",
        }
    }
}

/// Reads Secret values from files laid out `<dir>/<name>/<key>` (replicator pods, standalone
/// runs), or from values already fetched from the apiserver (the operator's probe, which must not
/// write credentials to disk).
#[derive(Clone)]
pub struct SecretFiles {
    dir: PathBuf,
    values: Option<std::collections::BTreeMap<(String, String), String>>,
}

impl std::fmt::Debug for SecretFiles {
    // Values are credentials: never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretFiles")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl SecretFiles {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SecretFiles {
            dir: dir.into(),
            values: None,
        }
    }

    /// Secret values keyed by (secret name, key).
    pub fn from_values(values: std::collections::BTreeMap<(String, String), String>) -> Self {
        SecretFiles {
            dir: PathBuf::from("<apiserver>"),
            values: Some(values),
        }
    }

    pub fn path_of(&self, secret: &SecretKeyRef) -> PathBuf {
        self.dir.join(&secret.name).join(&secret.key)
    }

    fn read(&self, field: &str, secret: &SecretKeyRef) -> Result<String, ConfigError> {
        let path = self.path_of(secret);
        if let Some(values) = &self.values {
            return values
                .get(&(secret.name.clone(), secret.key.clone()))
                .cloned()
                .ok_or_else(|| ConfigError::SecretUnreadable {
                    field: field.to_string(),
                    secret: secret.name.clone(),
                    key: secret.key.clone(),
                    path,
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
        }
        std::fs::read_to_string(&path)
            .map(|s| s.trim_end_matches(['\n', '\r']).to_string())
            .map_err(|source| ConfigError::SecretUnreadable {
                field: field.to_string(),
                secret: secret.name.clone(),
                key: secret.key.clone(),
                path,
                source,
            })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Builds the client configuration for one cluster. `field` is the spec path of the cluster
/// (`spec.source`), used in every error so users know what to fix.
pub fn client_config(
    cluster: &ClusterSpec,
    field: &str,
    secrets: &SecretFiles,
) -> Result<ClientConfig, ConfigError> {
    if cluster.bootstrap_servers.trim().is_empty() {
        return Err(ConfigError::NoBootstrap {
            field: field.to_string(),
        });
    }
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", cluster.bootstrap_servers.trim());
    config.set("client.id", format!("mirrorflow-{}", cluster.alias));
    for (key, value) in &cluster.config {
        if SECRET_PROPERTIES.contains(&key.as_str()) {
            return Err(ConfigError::SecretInConfig {
                field: format!("{field}.config"),
                property: key.clone(),
                instead: "sasl.usernameSecretRef / sasl.passwordSecretRef",
            });
        }
        config.set(key, value);
    }
    let protocol = match (&cluster.tls, &cluster.sasl) {
        (None, None) => "PLAINTEXT",
        (Some(_), None) => "SSL",
        (None, Some(_)) => "SASL_PLAINTEXT",
        (Some(_), Some(_)) => "SASL_SSL",
    };
    config.set("security.protocol", protocol);
    if let Some(tls) = &cluster.tls
        && let Some(ca) = &tls.ca_secret_ref
    {
        let pem = secrets.read(&format!("{field}.tls.caSecretRef"), ca)?;
        config.set("ssl.ca.pem", pem);
    }
    if let Some(sasl) = &cluster.sasl {
        let mechanism = match sasl.mechanism {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        };
        config.set("sasl.mechanisms", mechanism);
        let user = secrets.read(
            &format!("{field}.sasl.usernameSecretRef"),
            &sasl.username_secret_ref,
        )?;
        let password = secrets.read(
            &format!("{field}.sasl.passwordSecretRef"),
            &sasl.password_secret_ref,
        )?;
        config.set("sasl.username", user);
        config.set("sasl.password", password);
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SaslSpec, TlsSpec};

    fn cluster() -> ClusterSpec {
        ClusterSpec {
            alias: "a".into(),
            bootstrap_servers: "127.0.0.1:9092".into(),
            tls: None,
            sasl: None,
            config: Default::default(),
        }
    }

    #[test]
    fn plaintext_by_default() {
        let c =
            client_config(&cluster(), "spec.source", &SecretFiles::new("/nonexistent")).unwrap();
        assert_eq!(c.get("security.protocol"), Some("PLAINTEXT"));
        assert_eq!(c.get("bootstrap.servers"), Some("127.0.0.1:9092"));
    }

    #[test]
    fn secrets_in_config_are_refused_with_the_field() {
        let mut c = cluster();
        c.config.insert("sasl.password".into(), "hunter2".into());
        let err = client_config(&c, "spec.target", &SecretFiles::new("/x")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("spec.target.config") && text.contains("sasl.password"),
            "{text}"
        );
        assert!(
            !text.contains("hunter2"),
            "the secret itself is never echoed"
        );
    }

    #[test]
    fn sasl_credentials_come_from_files_and_a_missing_one_names_the_secret() {
        let dir = std::env::temp_dir().join(format!("mf-secrets-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("creds")).unwrap();
        std::fs::write(dir.join("creds/user"), "alice\n").unwrap();
        std::fs::write(dir.join("creds/password"), "s3cret").unwrap();
        let mut c = cluster();
        c.tls = Some(TlsSpec::default());
        c.sasl = Some(SaslSpec {
            mechanism: SaslMechanism::ScramSha512,
            username_secret_ref: SecretKeyRef {
                name: "creds".into(),
                key: "user".into(),
            },
            password_secret_ref: SecretKeyRef {
                name: "creds".into(),
                key: "password".into(),
            },
        });
        let secrets = SecretFiles::new(&dir);
        let cfg = client_config(&c, "spec.source", &secrets).unwrap();
        assert_eq!(cfg.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(cfg.get("sasl.mechanisms"), Some("SCRAM-SHA-512"));
        assert_eq!(cfg.get("sasl.username"), Some("alice"));
        assert_eq!(cfg.get("sasl.password"), Some("s3cret"));

        if let Some(sasl) = c.sasl.as_mut() {
            sasl.password_secret_ref.name = "absent".into();
        }
        let err = client_config(&c, "spec.source", &secrets).unwrap_err();
        assert_eq!(err.reason(), "SecretMissing");
        let text = err.to_string();
        assert!(
            text.contains("spec.source.sasl.passwordSecretRef") && text.contains("'absent'"),
            "{text}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
