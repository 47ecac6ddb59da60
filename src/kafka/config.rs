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
pub const REASONS: &[&str] = &["SecretMissing", "InvalidSpec", INVALID_CLIENT_CONFIG];

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
        Some(ca) => Some(secrets.read(&format!("{field}.tls.caSecretRef"), ca)?),
        None => None,
    };
    Ok((ca_pem, client_certificate(tls, field, secrets)?))
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
/// names are always checked (the spec cannot turn that off). OAUTHBEARER is refused: those
/// connections do not speak it yet.
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
        Some(sasl) => {
            let refused = || ConfigError::InvalidSasl {
                field: format!("{field}.sasl.mechanism"),
                message: "OAUTHBEARER is not spoken by the batch copy's connections yet; \
                          use PLAIN or SCRAM for this flow"
                    .into(),
            };
            let Some((user, password)) = sasl_password(sasl, field, secrets)? else {
                return Err(refused());
            };
            Some(match sasl.mechanism {
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
                SaslMechanism::OAuthBearer => return Err(refused()),
            })
        }
    };
    Ok(mirrorflow_conn::Security { tls, sasl })
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
mod tests {
    use super::*;
    use crate::api::{OAuthBearerSpec, SaslSpec, TlsSpec};

    fn none() -> SecretFiles {
        SecretFiles::new("/nonexistent")
    }

    fn with_config(pairs: &[(&str, &str)]) -> ClusterSpec {
        let mut c = cluster();
        for (k, v) in pairs {
            c.config.insert((*k).into(), (*v).into());
        }
        c
    }

    fn refusal(pairs: &[(&str, &str)]) -> ConfigError {
        match client_config(
            &with_config(pairs),
            "spec.source",
            &none(),
            ClientUse::Replicator,
        ) {
            Err(e) => e,
            Ok(_) => panic!("{pairs:?} accepted"),
        }
    }

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
        let c = client_config(&cluster(), "spec.source", &none(), ClientUse::Replicator).unwrap();
        assert_eq!(c.get("security.protocol"), Some("PLAINTEXT"));
        assert_eq!(c.get("bootstrap.servers"), Some("127.0.0.1:9092"));
    }

    #[test]
    fn secrets_in_config_are_refused_with_the_field() {
        let mut c = cluster();
        c.config.insert("sasl.password".into(), "hunter2".into());
        let err = client_config(&c, "spec.target", &none(), ClientUse::Replicator).unwrap_err();
        assert_eq!(err.reason(), "InvalidSpec");
        let text = err.to_string();
        assert!(
            text.starts_with("spec.target.config.sasl.password:")
                && text.contains("spec.target.sasl.passwordSecretRef"),
            "{text}"
        );
        assert!(
            !text.contains("hunter2"),
            "the secret itself is never echoed"
        );
    }

    /// `mechanism` with the user name and password in Secret `creds`, keys `user` and
    /// `password`.
    fn password_sasl(mechanism: SaslMechanism) -> SaslSpec {
        let key = |key: &str| {
            Some(SecretKeyRef {
                name: "creds".into(),
                key: key.into(),
            })
        };
        SaslSpec {
            mechanism,
            username_secret_ref: key("user"),
            password_secret_ref: key("password"),
            oauthbearer: None,
        }
    }

    #[test]
    fn sasl_credentials_come_from_files_and_a_missing_one_names_the_secret() {
        let dir = std::env::temp_dir().join(format!("mf-secrets-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("creds")).unwrap();
        std::fs::write(dir.join("creds/user"), "alice\n").unwrap();
        std::fs::write(dir.join("creds/password"), "s3cret").unwrap();
        let mut c = cluster();
        c.tls = Some(TlsSpec::default());
        c.sasl = Some(password_sasl(SaslMechanism::ScramSha512));
        let secrets = SecretFiles::new(&dir);
        let cfg = client_config(&c, "spec.source", &secrets, ClientUse::Replicator).unwrap();
        assert_eq!(cfg.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(cfg.get("sasl.mechanisms"), Some("SCRAM-SHA-512"));
        assert_eq!(cfg.get("sasl.username"), Some("alice"));
        assert_eq!(cfg.get("sasl.password"), Some("s3cret"));

        if let Some(r) = c.sasl.as_mut().and_then(|s| s.password_secret_ref.as_mut()) {
            r.name = "absent".into();
        }
        let err = client_config(&c, "spec.source", &secrets, ClientUse::Replicator).unwrap_err();
        assert_eq!(err.reason(), "SecretMissing");
        let text = err.to_string();
        assert!(
            text.contains("spec.source.sasl.passwordSecretRef") && text.contains("'absent'"),
            "{text}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_batch_copys_connections_get_the_same_credentials_and_refuse_oauthbearer() {
        let dir = std::env::temp_dir().join(format!("mf-conn-secrets-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("creds")).unwrap();
        std::fs::write(dir.join("creds/user"), "alice\n").unwrap();
        std::fs::write(dir.join("creds/password"), "s3cret").unwrap();
        std::fs::write(dir.join("creds/ca"), "-----BEGIN CERTIFICATE-----").unwrap();
        let secrets = SecretFiles::new(&dir);
        let plain = conn_security(&cluster(), "spec.target", &secrets).unwrap();
        assert!(plain.tls.is_none() && plain.sasl.is_none());

        let mut c = cluster();
        c.tls = Some(TlsSpec {
            ca_secret_ref: Some(SecretKeyRef {
                name: "creds".into(),
                key: "ca".into(),
            }),
            ..TlsSpec::default()
        });
        c.sasl = Some(password_sasl(SaslMechanism::ScramSha256));
        let security = conn_security(&c, "spec.target", &secrets).unwrap();
        let tls = security.tls.expect("TLS");
        assert_eq!(tls.ca_pem.as_deref(), Some("-----BEGIN CERTIFICATE-----"));
        assert!(tls.verify_hostname && tls.client.is_none());
        match security.sasl {
            Some(mirrorflow_conn::Sasl::Scram {
                hash: mirrorflow_conn::ScramHash::Sha256,
                user,
                password,
            }) => assert_eq!((user.as_str(), password.as_str()), ("alice", "s3cret")),
            other => panic!("SCRAM-SHA-256 expected, got {other:?}"),
        }

        if let Some(r) = c.sasl.as_mut().and_then(|s| s.username_secret_ref.as_mut()) {
            r.name = "absent".into();
        }
        let err = conn_security(&c, "spec.target", &secrets).unwrap_err();
        assert_eq!(err.reason(), "SecretMissing");
        assert!(
            err.to_string()
                .contains("spec.target.sasl.usernameSecretRef"),
            "{err}"
        );

        let err = conn_security(&oauth_cluster(), "spec.target", &secrets).unwrap_err();
        assert_eq!(err.reason(), "InvalidSpec");
        assert!(
            err.to_string()
                .starts_with("spec.target.sasl.mechanism: OAUTHBEARER"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn oauth_cluster() -> ClusterSpec {
        let mut c = cluster();
        c.sasl = Some(SaslSpec {
            mechanism: SaslMechanism::OAuthBearer,
            username_secret_ref: None,
            password_secret_ref: None,
            oauthbearer: Some(OAuthBearerSpec {
                token_endpoint_url: "https://idp.example.com/realms/kafka/token".into(),
                client_id: "mirrorflow".into(),
                client_secret_secret_ref: SecretKeyRef {
                    name: "oauth".into(),
                    key: "client-secret".into(),
                },
                scope: Some("kafka openid".into()),
                extensions: [("logicalCluster", "lkc-1"), ("identityPoolId", "pool-2")]
                    .into_iter()
                    .map(|(k, v)| (k.into(), v.into()))
                    .collect(),
            }),
        });
        c
    }

    fn oauth(c: &mut ClusterSpec) -> &mut OAuthBearerSpec {
        c.sasl
            .as_mut()
            .and_then(|s| s.oauthbearer.as_mut())
            .expect("an OAUTHBEARER cluster")
    }

    #[test]
    fn oauthbearer_uses_the_clients_own_oidc_with_the_secret_from_its_file() {
        let dir = std::env::temp_dir().join(format!("mf-oauth-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("oauth")).unwrap();
        std::fs::write(dir.join("oauth/client-secret"), "s3cret\n").unwrap();
        let c = oauth_cluster();
        let secrets = SecretFiles::new(&dir);
        for usage in [ClientUse::Replicator, ClientUse::Probe] {
            let cfg = client_config(&c, "spec.source", &secrets, usage).unwrap();
            assert_eq!(cfg.get("security.protocol"), Some("SASL_PLAINTEXT"));
            assert_eq!(cfg.get("sasl.mechanisms"), Some("OAUTHBEARER"));
            assert_eq!(cfg.get("sasl.oauthbearer.method"), Some("oidc"));
            assert_eq!(
                cfg.get("sasl.oauthbearer.token.endpoint.url"),
                Some("https://idp.example.com/realms/kafka/token")
            );
            assert_eq!(cfg.get("sasl.oauthbearer.client.id"), Some("mirrorflow"));
            assert_eq!(cfg.get("sasl.oauthbearer.client.secret"), Some("s3cret"));
            assert_eq!(cfg.get("sasl.oauthbearer.scope"), Some("kafka openid"));
            assert_eq!(
                cfg.get("sasl.oauthbearer.extensions"),
                Some("identityPoolId=pool-2,logicalCluster=lkc-1")
            );
            assert_eq!(cfg.get("sasl.username"), None);
            // librdkafka was built with OIDC (libcurl): it takes the configuration.
            if let Err(e) = cfg.create_native_config() {
                panic!("{e}");
            }
        }
        let refs: Vec<String> = secret_refs(&c, "spec.source")
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        assert_eq!(
            refs,
            ["spec.source.sasl.oauthbearer.clientSecretSecretRef"],
            "the client secret is a Secret the flow must be allowed to use and the pod mounts"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let err = client_config(&c, "spec.source", &secrets, ClientUse::Probe).unwrap_err();
        assert_eq!(err.reason(), "SecretMissing");
        assert!(
            err.to_string()
                .starts_with("spec.source.sasl.oauthbearer.clientSecretSecretRef: "),
            "{err}"
        );
    }

    #[test]
    fn a_flow_file_gets_the_crds_sasl_rules() {
        let refused = |c: &ClusterSpec| match check_cluster(c, "spec.source") {
            Err(e) => {
                assert_eq!(e.reason(), "InvalidSpec");
                e.to_string()
            }
            Ok(()) => panic!("accepted: {:?}", c.sasl),
        };
        assert!(check_cluster(&oauth_cluster(), "spec.source").is_ok());
        let mut c = oauth_cluster();
        oauth(&mut c).token_endpoint_url = "http://idp.example.com/token".into();
        let text = refused(&c);
        assert!(
            text.starts_with("spec.source.sasl.oauthbearer.tokenEndpointUrl: ")
                && text.contains("https://"),
            "{text}"
        );
        let mut c = oauth_cluster();
        oauth(&mut c).token_endpoint_url = "http://127.0.0.1:18080/token".into();
        assert!(check_cluster(&c, "spec.source").is_ok(), "loopback http");
        let mut c = oauth_cluster();
        oauth(&mut c).client_id = "a:b".into();
        assert!(refused(&c).starts_with("spec.source.sasl.oauthbearer.clientId: "));
        let mut c = oauth_cluster();
        oauth(&mut c).scope = Some("a&b".into());
        assert!(refused(&c).starts_with("spec.source.sasl.oauthbearer.scope: "));
        let mut c = oauth_cluster();
        oauth(&mut c).extensions.insert("auth".into(), "x".into());
        assert!(refused(&c).starts_with("spec.source.sasl.oauthbearer.extensions.auth: "));
        let mut c = oauth_cluster();
        oauth(&mut c).extensions = (0..17)
            .map(|i| (format!("k{}", "x".repeat(i)), "v".into()))
            .collect();
        assert!(refused(&c).starts_with("spec.source.sasl.oauthbearer.extensions: "));
        // Credentials that do not go with the mechanism.
        let mut c = oauth_cluster();
        if let Some(s) = c.sasl.as_mut() {
            s.oauthbearer = None;
        }
        assert!(refused(&c).contains("needs oauthbearer"));
        let mut c = oauth_cluster();
        if let Some(s) = c.sasl.as_mut() {
            s.mechanism = SaslMechanism::ScramSha512;
        }
        assert!(refused(&c).starts_with("spec.source.sasl.oauthbearer: "));
        let mut c = oauth_cluster();
        if let Some(s) = c.sasl.as_mut() {
            s.password_secret_ref = Some(SecretKeyRef {
                name: "p".into(),
                key: "p".into(),
            });
        }
        assert!(refused(&c).contains("takes no usernameSecretRef"));
        let mut c = cluster();
        c.sasl = Some(SaslSpec {
            mechanism: SaslMechanism::Plain,
            username_secret_ref: None,
            password_secret_ref: None,
            oauthbearer: None,
        });
        assert!(refused(&c).contains("need usernameSecretRef and passwordSecretRef"));
    }

    #[test]
    fn allowed_tuning_reaches_the_client_and_the_rest_is_refused_by_name() {
        let c = with_config(&[("linger.ms", "20"), ("fetch.max.bytes", "8388608")]);
        let cfg = client_config(&c, "spec.source", &none(), ClientUse::Replicator).unwrap();
        assert_eq!(cfg.get("linger.ms"), Some("20"));
        assert_eq!(cfg.get("fetch.max.bytes"), Some("8388608"));
        for (name, says) in [
            ("plugin.library.paths", "loads or reads a file from the pod"),
            ("ssl.engine.location", "loads or reads a file from the pod"),
            ("bootstrap.servers", "spec.source.bootstrapServers"),
            ("security.protocol", "spec.source.tls and spec.source.sasl"),
            ("acks", "the replicator sets it"),
            ("debug", "docs/crd-reference.md"),
        ] {
            let err = refusal(&[(name, "1")]);
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("spec.source.config.{name}: ")) && text.contains(says),
                "{text}"
            );
            assert_eq!(err.reason(), "InvalidSpec");
        }
    }

    #[test]
    fn a_value_the_client_refuses_is_named_without_connecting() {
        let err = refusal(&[("linger.ms", "5"), ("fetch.wait.max.ms", "banana")]);
        assert_eq!(err.reason(), INVALID_CLIENT_CONFIG);
        let text = err.to_string();
        assert!(
            text.starts_with(
                "spec.source.config.fetch.wait.max.ms: the Kafka client refuses 'banana': "
            ) && text.contains("Invalid value"),
            "{text}"
        );
        // librdkafka's range, and a value it cannot parse for a bounded property.
        assert_eq!(
            refusal(&[("fetch.wait.max.ms", "999999999")]).reason(),
            INVALID_CLIENT_CONFIG
        );
        assert_eq!(
            refusal(&[("compression.type", "brotli")]).reason(),
            INVALID_CLIENT_CONFIG
        );
        assert_eq!(
            refusal(&[("fetch.max.bytes", "lots")]).reason(),
            INVALID_CLIENT_CONFIG
        );
        // A pair librdkafka would refuse only when the client starts.
        let err = refusal(&[("reconnect.backoff.ms", "20000")]);
        assert_eq!(err.reason(), INVALID_CLIENT_CONFIG);
        assert!(
            err.to_string()
                .starts_with("spec.source.config.reconnect.backoff.ms: the Kafka client refuses '20000': reconnect.backoff.max.ms must be at least"),
            "{err}"
        );
    }

    #[test]
    fn a_size_outside_its_bounds_is_refused_with_the_bounds() {
        let err = refusal(&[("queued.max.messages.kbytes", "2000000")]);
        assert_eq!(err.reason(), "InvalidSpec");
        let text = err.to_string();
        assert!(
            text.starts_with("spec.source.config.queued.max.messages.kbytes:")
                && text.contains("from 1 to 131072"),
            "{text}"
        );
    }

    #[test]
    fn the_probe_takes_only_probe_safe_properties() {
        let c = with_config(&[
            ("broker.address.family", "v4"),
            ("socket.keepalive.enable", "true"),
            ("fetch.max.bytes", "67108864"),
            ("queued.max.messages.kbytes", "131072"),
            ("linger.ms", "100"),
        ]);
        let probe = client_config(&c, "spec.source", &none(), ClientUse::Probe).unwrap();
        assert_eq!(probe.get("broker.address.family"), Some("v4"));
        assert_eq!(probe.get("socket.keepalive.enable"), Some("true"));
        for name in ["fetch.max.bytes", "queued.max.messages.kbytes", "linger.ms"] {
            assert_eq!(probe.get(name), None, "{name} reached the probe");
        }
        assert_eq!(probe.get("bootstrap.servers"), Some("127.0.0.1:9092"));
        let replicator = client_config(&c, "spec.source", &none(), ClientUse::Replicator).unwrap();
        assert_eq!(replicator.get("fetch.max.bytes"), Some("67108864"));
        // A refused property is refused for the probe too, not silently dropped.
        let bad = with_config(&[("plugin.library.paths", "/tmp/x.so")]);
        assert!(client_config(&bad, "spec.source", &none(), ClientUse::Probe).is_err());
    }

    #[test]
    fn malformed_bootstrap_servers_are_refused_naming_the_field() {
        for servers in ["", "kafka", "kafka:0", "a:1, b:2"] {
            let mut c = cluster();
            c.bootstrap_servers = servers.into();
            let err = check_cluster(&c, "spec.target").unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("spec.target.bootstrapServers: "),
                "{err}"
            );
            assert_eq!(err.reason(), "InvalidSpec");
        }
    }

    #[test]
    fn secret_refs_are_checked_with_the_cluster() {
        // The rule itself is tested in kafka::secrets; here: validate runs it on every ref.
        for (name, key, field) in [
            (
                "creds",
                "../../etc/passwd",
                "spec.source.sasl.passwordSecretRef.key",
            ),
            ("../creds", "p", "spec.source.sasl.passwordSecretRef.name"),
        ] {
            let mut c = cluster();
            c.sasl = Some(SaslSpec {
                mechanism: SaslMechanism::Plain,
                username_secret_ref: Some(SecretKeyRef {
                    name: "creds".into(),
                    key: "user".into(),
                }),
                password_secret_ref: Some(SecretKeyRef {
                    name: name.into(),
                    key: key.into(),
                }),
                oauthbearer: None,
            });
            let err = check_cluster(&c, "spec.source").unwrap_err();
            assert!(err.to_string().starts_with(&format!("{field}: ")), "{err}");
        }
        let mut c = cluster();
        c.tls = Some(TlsSpec {
            ca_secret_ref: Some(SecretKeyRef {
                name: "ca".into(),
                key: "../ca.crt".into(),
            }),
            ..Default::default()
        });
        let err = check_cluster(&c, "spec.source").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("spec.source.tls.caSecretRef.key: "),
            "{err}"
        );
    }

    #[test]
    fn every_reason_is_listed() {
        let errors = [
            refusal(&[("acks", "1")]),
            refusal(&[("linger.ms", "soon")]),
            ConfigError::InvalidBootstrap {
                field: "f".into(),
                message: "m".into(),
            },
            ConfigError::InvalidSecretRef {
                field: "f".into(),
                message: "m".into(),
            },
            none()
                .read(
                    "f",
                    &SecretKeyRef {
                        name: "absent".into(),
                        key: "k".into(),
                    },
                )
                .unwrap_err(),
        ];
        for e in errors {
            assert!(REASONS.contains(&e.reason()), "{}", e.reason());
        }
    }
}
