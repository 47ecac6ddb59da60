//! Kafka client configuration from a [`ClusterSpec`]: bootstrap, TLS, SASL, extra properties.
//!
//! Credentials never live in the spec: a spec names Secret keys, and the process reads them
//! through [`SecretFiles`].

use std::path::PathBuf;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

use crate::api::client_properties::{self, Refusal};
use crate::api::rules;
use crate::api::{ClusterSpec, OAuthBearerSpec, SaslMechanism, SaslSpec, SecretKeyRef, TlsSpec};

use super::client_cert::{ClientIdentity, client_certificate};
use super::secrets::{SecretFiles, check_secret_ref};

/// The reason of a client property the Kafka client itself refuses (unknown to it, or a value
/// it cannot use): the flow would never connect, however reachable the cluster is.
pub const INVALID_CLIENT_CONFIG: &str = "InvalidClientConfig";

/// Every reason [`ConfigError::reason`] returns (each has a troubleshooting entry).
pub const REASONS: &[&str] = &[
    "SecretMissing",
    "InvalidSpec",
    INVALID_CLIENT_CONFIG,
    super::secrets::SECRET_VALUE_TOO_LARGE,
];

/// Who the client configuration is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientUse {
    /// The replicator pods (and the CLI): every allowed property of `spec.<side>.config`.
    Replicator,
    /// The operator's status probe, which runs in the shared operator: only the allowed
    /// properties marked probe-safe (how to reach the brokers), never a buffer size or timing.
    Probe,
}

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
    /// A Secret value larger than any value of its kind: refused before it is sent anywhere.
    #[error(
        "{field}: Secret '{secret}' key '{key}' holds {size} bytes, more than the {max} bytes {what} may hold; put the right value in that key (a PEM bundle, a password or a token, not a file or an archive)"
    )]
    SecretTooLarge {
        field: String,
        secret: String,
        key: String,
        size: usize,
        max: usize,
        what: &'static str,
    },
    /// A property outside the allow-list, or an allowed one outside its bounds. The value is
    /// never part of the message: a refused property may carry a secret.
    #[error("{field}: {message}")]
    PropertyRefused { field: String, message: String },
    /// librdkafka refused the property (its description says why). Only allowed properties
    /// reach librdkafka, and none of them carries a secret, so the value is shown.
    #[error("{field}: the Kafka client refuses '{value}': {description}")]
    ClientRefused {
        field: String,
        value: String,
        description: String,
    },
    #[error("{field}: {message}")]
    InvalidBootstrap { field: String, message: String },
    #[error("{field}: {message}")]
    InvalidSecretRef { field: String, message: String },
    #[error("{field}: {message}")]
    ClientCertificate { field: String, message: String },
    /// A SASL setting a flow file gives wrongly (the CRD refuses the same with its rules).
    #[error("{field}: {message}")]
    InvalidSasl { field: String, message: String },
}

impl ConfigError {
    /// A low-cardinality label for metrics and condition reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            ConfigError::SecretUnreadable { .. } => "SecretMissing",
            ConfigError::SecretTooLarge { .. } => super::secrets::SECRET_VALUE_TOO_LARGE,
            ConfigError::ClientRefused { .. } => INVALID_CLIENT_CONFIG,
            ConfigError::PropertyRefused { .. }
            | ConfigError::InvalidBootstrap { .. }
            | ConfigError::InvalidSecretRef { .. }
            | ConfigError::ClientCertificate { .. }
            | ConfigError::InvalidSasl { .. } => "InvalidSpec",
        }
    }
}

/// The checks of one cluster that need no Secret and no connection: its addresses, the Secret
/// references (so no name or key can leave the secrets folder) and its client properties.
/// `field` is the cluster's spec path (`spec.source`).
pub fn check_cluster(cluster: &ClusterSpec, field: &str) -> Result<(), ConfigError> {
    check_addresses(cluster, field)?;
    user_properties(cluster, field, ClientUse::Replicator).map(|_| ())
}

/// The broker addresses and the Secret references.
fn check_addresses(cluster: &ClusterSpec, field: &str) -> Result<(), ConfigError> {
    if let Some(message) = rules::bootstrap_problem(&cluster.bootstrap_servers) {
        return Err(ConfigError::InvalidBootstrap {
            field: format!("{field}.bootstrapServers"),
            message,
        });
    }
    for (ref_field, secret) in secret_refs(cluster, field) {
        check_secret_ref(&ref_field, secret)?;
    }
    if let Some(sasl) = &cluster.sasl {
        check_sasl(sasl, &format!("{field}.sasl"))?;
    }
    Ok(())
}

/// The CRD's SASL rules, for flow files that never meet an apiserver: which credentials go
/// with which mechanism, and the OAuth client's URL, id, scope and extensions.
fn check_sasl(sasl: &SaslSpec, field: &str) -> Result<(), ConfigError> {
    let refused = |at: &str, message: String| {
        Err(ConfigError::InvalidSasl {
            field: format!("{field}{at}"),
            message,
        })
    };
    let has_password = sasl.username_secret_ref.is_some() || sasl.password_secret_ref.is_some();
    let Some(oauth) = &sasl.oauthbearer else {
        if sasl.mechanism == SaslMechanism::OAuthBearer {
            return refused(
                "",
                "mechanism OAUTHBEARER needs oauthbearer (tokenEndpointUrl, clientId, clientSecretSecretRef)".into(),
            );
        }
        if sasl.username_secret_ref.is_none() || sasl.password_secret_ref.is_none() {
            return refused(
                "",
                "mechanisms PLAIN and SCRAM-* need usernameSecretRef and passwordSecretRef".into(),
            );
        }
        return Ok(());
    };
    if sasl.mechanism != SaslMechanism::OAuthBearer {
        return refused(
            ".oauthbearer",
            "oauthbearer applies only to mechanism OAUTHBEARER".into(),
        );
    }
    if has_password {
        return refused(
            "",
            "mechanism OAUTHBEARER takes no usernameSecretRef or passwordSecretRef: the client authenticates with oauthbearer.clientId and oauthbearer.clientSecretSecretRef".into(),
        );
    }
    if let Some(m) = rules::token_endpoint_problem(&oauth.token_endpoint_url) {
        return refused(".oauthbearer.tokenEndpointUrl", m);
    }
    if let Some(m) = rules::client_id_problem(&oauth.client_id) {
        return refused(".oauthbearer.clientId", m);
    }
    if let Some(m) = oauth.scope.as_deref().and_then(rules::scope_problem) {
        return refused(".oauthbearer.scope", m);
    }
    if oauth.extensions.len() > rules::MAX_EXTENSIONS {
        return refused(
            ".oauthbearer.extensions",
            format!(
                "has {} entries; at most {} are sent",
                oauth.extensions.len(),
                rules::MAX_EXTENSIONS
            ),
        );
    }
    for (key, value) in &oauth.extensions {
        if let Some(m) = rules::extension_problem(key, value) {
            return refused(&format!(".oauthbearer.extensions.{key}"), m);
        }
    }
    Ok(())
}

/// The Secret references of a cluster, with their spec paths (`field` is the cluster's).
pub fn secret_refs<'a>(cluster: &'a ClusterSpec, field: &str) -> Vec<(String, &'a SecretKeyRef)> {
    let mut refs = Vec::new();
    if let Some(tls) = &cluster.tls {
        for (name, r) in [
            ("caSecretRef", &tls.ca_secret_ref),
            ("certSecretRef", &tls.cert_secret_ref),
            ("keySecretRef", &tls.key_secret_ref),
            ("pkcs12SecretRef", &tls.pkcs12_secret_ref),
            ("pkcs12PasswordSecretRef", &tls.pkcs12_password_secret_ref),
        ] {
            if let Some(r) = r {
                refs.push((format!("{field}.tls.{name}"), r));
            }
        }
    }
    if let Some(sasl) = &cluster.sasl {
        for (name, r) in [
            ("usernameSecretRef", &sasl.username_secret_ref),
            ("passwordSecretRef", &sasl.password_secret_ref),
        ] {
            if let Some(r) = r {
                refs.push((format!("{field}.sasl.{name}"), r));
            }
        }
        if let Some(oauth) = &sasl.oauthbearer {
            refs.push((
                format!("{field}.sasl.oauthbearer.clientSecretSecretRef"),
                &oauth.client_secret_secret_ref,
            ));
        }
    }
    refs
}

/// The user's properties of `cluster` that `usage` takes, each checked against the allow-list,
/// by librdkafka (without connecting) and against its bounds, in that order.
fn user_properties<'a>(
    cluster: &'a ClusterSpec,
    field: &str,
    usage: ClientUse,
) -> Result<Vec<(&'a str, &'a str)>, ConfigError> {
    let mut taken = Vec::new();
    for (name, value) in &cluster.config {
        let property_field = format!("{field}.config.{name}");
        let refused = |r: Refusal| ConfigError::PropertyRefused {
            field: property_field.clone(),
            message: r.message(),
        };
        let entry = client_properties::check_name(field, name).map_err(refused)?;
        // One property per native config, so librdkafka's refusal is pinned to its property.
        let mut alone = ClientConfig::new();
        alone.set(name, value);
        if let Err(e) = alone.create_native_config() {
            let description = match e {
                KafkaError::ClientConfig(_, description, _, _) => description,
                other => other.to_string(),
            };
            return Err(ConfigError::ClientRefused {
                field: property_field,
                value: value.clone(),
                description,
            });
        }
        entry.check_value(value).map_err(refused)?;
        if usage == ClientUse::Replicator || entry.probe {
            taken.push((name.as_str(), value.as_str()));
        }
    }
    let set = |name: &str| cluster.config.get(name).map(String::as_str);
    if let Some((name, value, description)) = client_properties::contradiction(set) {
        return Err(ConfigError::ClientRefused {
            field: format!("{field}.config.{name}"),
            value,
            description,
        });
    }
    Ok(taken)
}

/// Builds the client configuration for one cluster and `usage`. `field` is the spec path of
/// the cluster (`spec.source`), used in every error so users know what to fix.
pub fn client_config(
    cluster: &ClusterSpec,
    field: &str,
    secrets: &SecretFiles,
    usage: ClientUse,
) -> Result<ClientConfig, ConfigError> {
    check_addresses(cluster, field)?;
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &cluster.bootstrap_servers);
    config.set("client.id", format!("mirrorflow-{}", cluster.alias));
    for (name, value) in user_properties(cluster, field, usage)? {
        config.set(name, value);
    }
    let protocol = match (&cluster.tls, &cluster.sasl) {
        (None, None) => "PLAINTEXT",
        (Some(_), None) => "SSL",
        (None, Some(_)) => "SASL_PLAINTEXT",
        (Some(_), Some(_)) => "SASL_SSL",
    };
    config.set("security.protocol", protocol);
    if let Some(tls) = &cluster.tls {
        let (ca_pem, identity) = tls_material(tls, field, secrets)?;
        if let Some(pem) = ca_pem {
            config.set("ssl.ca.pem", pem);
        }
        if let Some(id) = identity {
            config.set("ssl.certificate.pem", id.cert_pem);
            config.set("ssl.key.pem", id.key_pem);
        }
    }
    if let Some(sasl) = &cluster.sasl {
        let mechanism = match sasl.mechanism {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
            SaslMechanism::OAuthBearer => "OAUTHBEARER",
        };
        config.set("sasl.mechanisms", mechanism);
        if let Some(oauth) = &sasl.oauthbearer {
            set_oauthbearer(&mut config, oauth, field, secrets)?;
        } else if let Some((user, password)) = sasl_password(sasl, field, secrets)? {
            config.set("sasl.username", user);
            config.set("sasl.password", password);
        }
    }
    Ok(config)
}

/// The CA certificates and the client certificate `tls` names, read from their Secrets.
fn tls_material(
    tls: &TlsSpec,
    field: &str,
    secrets: &SecretFiles,
) -> Result<(Option<String>, Option<ClientIdentity>), ConfigError> {
    let ca_pem = match &tls.ca_secret_ref {
        Some(ca) => Some(ca_certificates(
            secrets.read(&format!("{field}.tls.caSecretRef"), ca)?,
            ca,
            field,
        )?),
        None => None,
    };
    Ok((ca_pem, client_certificate(tls, field, secrets)?))
}

/// The CA certificates of `pem`, checked: a value with no PEM certificate (a key, DER bytes, a
/// path, base64 of base64) would fail every connection with a TLS error that names nothing.
fn ca_certificates(pem: String, ca: &SecretKeyRef, field: &str) -> Result<String, ConfigError> {
    match openssl::x509::X509::stack_from_pem(pem.as_bytes()) {
        Ok(certs) if !certs.is_empty() => Ok(pem),
        _ => Err(ConfigError::ClientCertificate {
            field: format!("{field}.tls.caSecretRef"),
            message: format!(
                "Secret '{}' key '{}' holds no PEM certificate: give the certificate of the CA that signed the brokers' certificates ('-----BEGIN CERTIFICATE-----'), or remove caSecretRef to trust the system's CAs",
                ca.name, ca.key
            ),
        }),
    }
}

/// The SASL user name and password, for the mechanisms that take them.
fn sasl_password(
    sasl: &SaslSpec,
    field: &str,
    secrets: &SecretFiles,
) -> Result<Option<(String, String)>, ConfigError> {
    match (&sasl.username_secret_ref, &sasl.password_secret_ref) {
        (Some(user_ref), Some(password_ref)) if sasl.oauthbearer.is_none() => {
            let user = secrets.read(&format!("{field}.sasl.usernameSecretRef"), user_ref)?;
            let password =
                secrets.read(&format!("{field}.sasl.passwordSecretRef"), password_ref)?;
            Ok(Some((user, password)))
        }
        // check_sasl refused every other combination.
        _ => Ok(None),
    }
}

/// The same cluster's TLS and SASL for the batch copy's own connections
/// ([`mirrorflow_conn`]), read from the same Secrets as [`client_config`]'s. Brokers' host
/// names are always checked (the spec cannot turn that off). OAUTHBEARER tokens come from the
/// project's bounded OAuth client ([`mirrorflow_conn::oauth`]) with the same client
/// credentials librdkafka's `oidc` method gets.
pub fn conn_security(
    cluster: &ClusterSpec,
    field: &str,
    secrets: &SecretFiles,
) -> Result<mirrorflow_conn::Security, ConfigError> {
    check_addresses(cluster, field)?;
    let tls = match &cluster.tls {
        Some(tls) => {
            let (ca_pem, identity) = tls_material(tls, field, secrets)?;
            Some(mirrorflow_conn::Tls {
                ca_pem,
                client: identity.map(|id| (id.cert_pem, id.key_pem)),
                verify_hostname: true,
            })
        }
        None => None,
    };
    let sasl = match &cluster.sasl {
        None => None,
        Some(sasl) => Some(conn_sasl(sasl, field, secrets)?),
    };
    Ok(mirrorflow_conn::Security { tls, sasl })
}

/// One cluster's SASL for the project's own connections.
fn conn_sasl(
    sasl: &SaslSpec,
    field: &str,
    secrets: &SecretFiles,
) -> Result<mirrorflow_conn::Sasl, ConfigError> {
    if let Some(oauth) = &sasl.oauthbearer {
        let secret = secrets.read(
            &format!("{field}.sasl.oauthbearer.clientSecretSecretRef"),
            &oauth.client_secret_secret_ref,
        )?;
        let extensions = (oauth.extensions.iter())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // As librdkafka's `oidc` client in the same pod does: the replicator runs with the
        // flow's own identity in the flow's namespace, so its loopback is its own (the shared
        // operator's probe is the one held off loopback).
        return Ok(mirrorflow_conn::Sasl::OAuthBearer(
            mirrorflow_conn::oauth::OAuth::new(
                oauth.token_endpoint_url.clone(),
                oauth.client_id.clone(),
                secret,
                oauth.scope.clone(),
                extensions,
                true,
            ),
        ));
    }
    // check_sasl refused every other combination without a username and password.
    let Some((user, password)) = sasl_password(sasl, field, secrets)? else {
        return Err(ConfigError::InvalidSasl {
            field: format!("{field}.sasl"),
            message: "mechanisms PLAIN and SCRAM-* need usernameSecretRef and passwordSecretRef"
                .into(),
        });
    };
    Ok(match sasl.mechanism {
        SaslMechanism::Plain => mirrorflow_conn::Sasl::Plain { user, password },
        SaslMechanism::ScramSha256 => mirrorflow_conn::Sasl::Scram {
            hash: mirrorflow_conn::ScramHash::Sha256,
            user,
            password,
        },
        SaslMechanism::ScramSha512 => mirrorflow_conn::Sasl::Scram {
            hash: mirrorflow_conn::ScramHash::Sha512,
            user,
            password,
        },
        SaslMechanism::OAuthBearer => {
            return Err(ConfigError::InvalidSasl {
                field: format!("{field}.sasl"),
                message: "mechanism OAUTHBEARER needs oauthbearer (tokenEndpointUrl, clientId, clientSecretSecretRef)".into(),
            });
        }
    })
}

/// librdkafka's own OIDC client (`sasl.oauthbearer.method=oidc`): it posts the client
/// credentials grant to the token endpoint on its background thread and gets a new token
/// before the current one expires (at 80 % of its lifetime), so no client of ours has to poll
/// for it and every connection re-authenticates with a fresh token.
fn set_oauthbearer(
    config: &mut ClientConfig,
    oauth: &OAuthBearerSpec,
    field: &str,
    secrets: &SecretFiles,
) -> Result<(), ConfigError> {
    let secret = secrets.read(
        &format!("{field}.sasl.oauthbearer.clientSecretSecretRef"),
        &oauth.client_secret_secret_ref,
    )?;
    config
        .set("sasl.oauthbearer.method", "oidc")
        .set(
            "sasl.oauthbearer.token.endpoint.url",
            &oauth.token_endpoint_url,
        )
        .set("sasl.oauthbearer.client.id", &oauth.client_id)
        .set("sasl.oauthbearer.client.secret", secret);
    if let Some(scope) = &oauth.scope {
        config.set("sasl.oauthbearer.scope", scope);
    }
    if !oauth.extensions.is_empty() {
        let pairs: Vec<String> = oauth
            .extensions
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        config.set("sasl.oauthbearer.extensions", pairs.join(","));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
