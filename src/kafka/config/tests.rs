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
fn the_batch_copys_connections_get_the_same_credentials_oauthbearer_included() {
    let dir = std::env::temp_dir().join(format!("mf-conn-secrets-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("creds")).unwrap();
    std::fs::write(dir.join("creds/user"), "alice\n").unwrap();
    std::fs::write(dir.join("creds/password"), "s3cret").unwrap();
    let (ca, _) = super::super::client_cert::self_signed("ca");
    let ca_pem = String::from_utf8(ca.to_pem().unwrap()).unwrap();
    std::fs::write(dir.join("creds/ca"), &ca_pem).unwrap();
    std::fs::create_dir_all(dir.join("oauth")).unwrap();
    std::fs::write(dir.join("oauth/client-secret"), "t0ken-secret").unwrap();
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
    assert_eq!(tls.ca_pem.as_deref(), Some(ca_pem.trim_end()));
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

    // OAUTHBEARER: the client credentials librdkafka's `oidc` method gets, the secret from
    // the same Secret file.
    match conn_security(&oauth_cluster(), "spec.target", &secrets).map(|s| s.sasl) {
        Ok(Some(mirrorflow_conn::Sasl::OAuthBearer(o))) => {
            assert_eq!(
                (o.token_endpoint.as_str(), o.client_id.as_str()),
                ("https://idp.example.com/realms/kafka/token", "mirrorflow")
            );
            assert_eq!(o.client_secret, "t0ken-secret");
            assert_eq!(o.scope.as_deref(), Some("kafka openid"));
            assert_eq!(o.extensions.len(), 2);
        }
        other => panic!("OAUTHBEARER expected, got {other:?}"),
    }
    std::fs::remove_file(dir.join("oauth/client-secret")).unwrap();
    let err = conn_security(&oauth_cluster(), "spec.target", &secrets).unwrap_err();
    assert_eq!(err.reason(), "SecretMissing");
    assert!(
        (err.to_string()).contains("spec.target.sasl.oauthbearer.clientSecretSecretRef"),
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

#[test]
fn a_ca_secret_without_a_pem_certificate_is_refused_naming_it() {
    let (ca, key) = super::super::client_cert::self_signed("ca");
    let key_pem = key.private_key_to_pem_pkcs8().unwrap();
    let der = ca.to_der().unwrap();
    let mut c = cluster();
    c.tls = Some(TlsSpec {
        ca_secret_ref: Some(SecretKeyRef {
            name: "tls".into(),
            key: "ca.crt".into(),
        }),
        ..TlsSpec::default()
    });
    for (what, value) in [
        ("a private key", key_pem),
        ("DER bytes", der),
        ("a path", b"/etc/ssl/certs/ca.pem".to_vec()),
        (
            "a PEM header alone",
            b"-----BEGIN CERTIFICATE-----".to_vec(),
        ),
    ] {
        let secrets =
            SecretFiles::from_values([(("tls".to_string(), "ca.crt".to_string()), value)].into());
        for err in [
            client_config(&c, "spec.source", &secrets, ClientUse::Probe).map(|_| ()),
            conn_security(&c, "spec.source", &secrets).map(|_| ()),
        ] {
            let err = err.expect_err(what);
            assert_eq!(err.reason(), "InvalidSpec", "{what}");
            let text = err.to_string();
            assert!(
                text.starts_with("spec.source.tls.caSecretRef: Secret 'tls' key 'ca.crt' holds no PEM certificate"),
                "{what}: {text}"
            );
        }
    }
}
