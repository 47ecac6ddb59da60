//! A failed connection answered by class: tiny listeners of this test on 127.0.0.1 (nothing
//! listening, a port that accepts and closes, an HTTP server, an HTTPS server with a self-signed
//! certificate, a TLS listener that says nothing, a silent port) and the world's real brokers
//! (plaintext, SASL_SSL/SCRAM-SHA-512, mTLS, SASL_PLAINTEXT/OAUTHBEARER listeners) with specs
//! that do not fit them. Each case asserts the class the diagnosis finds, and the reason and
//! message of `Ready` from `status::probe::observe` (the CLI's probe, the operator's code), and
//! prints the table class -> reason -> message. No operator is needed.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mirrorflow::api::{FailoverReadinessSpec, MirrorFlowSpec};
use mirrorflow::flow;
use mirrorflow::kafka::SecretFiles;
use mirrorflow::status::diagnose::{self, Class, Expected, Foreign};
use mirrorflow::status::probe::{Budget, PROBE_BUDGET, observe};
use mirrorflow::status::{self, Observation, reason};
use mirrorflow_e2e::secure::{SecureKafka, self_signed};
use mirrorflow_e2e::unique;
use openssl::ssl::{SslAcceptor, SslFiletype, SslMethod};
use serde_json::{Value, json};

/// A listener on 127.0.0.1 that hands every connection to `serve` on a thread of its own.
fn listener(serve: impl Fn(TcpStream) + Send + Sync + 'static) -> Result<String> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?.to_string();
    let serve = Arc::new(serve);
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let serve = serve.clone();
            std::thread::spawn(move || serve(s));
        }
    });
    Ok(addr)
}

fn http_answer(mut s: impl Read + Write) {
    let mut buf = [0u8; 256];
    let _ = s.read(&mut buf);
    let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
}

/// A TLS listener with a self-signed certificate: `then` runs on each accepted TLS stream.
fn tls_listener(
    dir: &std::path::Path,
    then: fn(openssl::ssl::SslStream<TcpStream>),
) -> Result<String> {
    let (cert, key) = self_signed(dir, "127.0.0.1")?;
    let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls())?;
    acceptor.set_certificate_chain_file(&cert)?;
    acceptor.set_private_key_file(&key, SslFiletype::PEM)?;
    let acceptor = Arc::new(acceptor.build());
    listener(move |s| {
        let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
        if let Ok(tls) = acceptor.accept(s) {
            then(tls);
        }
    })
}

/// One case: the source cluster spec, the class the diagnosis must find (`None`: nothing wrong
/// with the connection itself), the reason of `Ready` and words its message must hold.
struct Case {
    name: &'static str,
    source: Value,
    class: Option<Class>,
    reason: &'static str,
    says: &'static [&'static str],
}

fn refs(name: &str, key: &str) -> Value {
    json!({"name": name, "key": key})
}

fn scram(mechanism: &str, password_key: &str) -> Value {
    json!({
        "mechanism": mechanism,
        "usernameSecretRef": refs("scram", "user"),
        "passwordSecretRef": refs("scram", password_key),
    })
}

fn tls(ca: &str) -> Value {
    json!({"caSecretRef": refs(ca, "ca.crt")})
}

/// The listeners of this test and the world's, and what a spec that does not fit each gets.
fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| {
        format!(
            "{name} is not set: run the world tests with the world's environment (e2e/world.sh env)"
        )
    })
}

fn cases(secure: &SecureKafka, dir: &std::path::Path) -> Result<Vec<Case>> {
    let plain_broker = var("MF_SOURCE_BOOTSTRAP")?;
    let scram_tls = secure.source_bootstrap.clone();
    let mtls = var("MF_SOURCE_MTLS_BOOTSTRAP")?;
    let oauth = var("MF_SOURCE_OAUTH_BOOTSTRAP")?;
    let free = TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
    let closes = listener(drop)?;
    let http = listener(http_answer)?;
    let silent = listener(|s| {
        std::thread::sleep(Duration::from_secs(60));
        drop(s);
    })?;
    let https = tls_listener(dir, http_answer)?;
    let tls_silent = tls_listener(dir, |s| {
        std::thread::sleep(Duration::from_secs(60));
        drop(s);
    })?;
    let port = scram_tls.rsplit_once(':').map(|(_, p)| p).unwrap_or("0");
    let source = |addr: &str, extra: Value| {
        let mut v = json!({"alias": "src", "bootstrapServers": addr});
        if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            v.extend(extra.clone());
        }
        v
    };
    let none = json!({});
    let case = |name, source, class, reason, says| Case {
        name,
        source,
        class,
        reason,
        says,
    };
    Ok(vec![
        case(
            "nothing listening",
            source(&free, none.clone()),
            Some(Class::NothingListening),
            reason::SOURCE_UNREACHABLE,
            &["spec.source.bootstrapServers", "nothing listens"],
        ),
        case(
            "name does not resolve",
            source("no-such-broker.invalid:9092", none.clone()),
            Some(Class::Unresolved),
            reason::SOURCE_UNREACHABLE,
            &["spec.source.bootstrapServers", "does not resolve"],
        ),
        case(
            "accepts and closes",
            source(&closes, none.clone()),
            Some(Class::NotKafka(Foreign::Unknown)),
            reason::SOURCE_NOT_KAFKA,
            &["spec.source.bootstrapServers", "not as a Kafka broker"],
        ),
        case(
            "HTTP server",
            source(&http, none.clone()),
            Some(Class::NotKafka(Foreign::Http)),
            reason::SOURCE_NOT_KAFKA,
            &["spec.source.bootstrapServers", "an HTTP server"],
        ),
        case(
            "HTTPS server, spec without tls",
            source(&https, none.clone()),
            Some(Class::NotKafka(Foreign::Http)),
            reason::SOURCE_NOT_KAFKA,
            &["an HTTP server"],
        ),
        case(
            "HTTPS server, spec with tls",
            source(&https, json!({"tls": tls("ca")})),
            Some(Class::NotKafka(Foreign::Http)),
            reason::SOURCE_NOT_KAFKA,
            &["an HTTP server"],
        ),
        case(
            "silent port",
            source(&silent, none.clone()),
            Some(Class::Silent),
            reason::SOURCE_UNREACHABLE,
            &["spec.source.bootstrapServers", "does not answer"],
        ),
        case(
            "TLS listener, spec without tls",
            source(&tls_silent, none.clone()),
            Some(Class::TlsExpected),
            reason::SOURCE_SECURITY_MISMATCH,
            &["spec.source.tls", "speaks TLS"],
        ),
        case(
            "SCRAM without tls on the SASL_SSL listener",
            source(
                &scram_tls,
                json!({"sasl": scram("SCRAM-SHA-512", "password")}),
            ),
            Some(Class::TlsExpected),
            reason::SOURCE_SECURITY_MISMATCH,
            &["spec.source.tls", "speaks TLS"],
        ),
        case(
            "tls on the plaintext listener",
            source(&plain_broker, json!({"tls": tls("ca")})),
            Some(Class::PlaintextExpected),
            reason::SOURCE_SECURITY_MISMATCH,
            &["spec.source.tls", "without TLS"],
        ),
        case(
            "SCRAM-SHA-256 on a SCRAM-SHA-512 listener",
            source(
                &scram_tls,
                json!({"tls": tls("ca"), "sasl": scram("SCRAM-SHA-256", "password")}),
            ),
            Some(Class::MechanismNotEnabled {
                asked: "SCRAM-SHA-256".into(),
                enabled: vec!["SCRAM-SHA-512".into()],
            }),
            reason::SOURCE_SASL_MECHANISM_NOT_ENABLED,
            &["spec.source.sasl.mechanism", "enables SCRAM-SHA-512"],
        ),
        case(
            "PLAIN on the OAUTHBEARER listener",
            source(&oauth, json!({"sasl": scram("PLAIN", "password")})),
            Some(Class::MechanismNotEnabled {
                asked: "PLAIN".into(),
                enabled: vec!["OAUTHBEARER".into()],
            }),
            reason::SOURCE_SASL_MECHANISM_NOT_ENABLED,
            &["spec.source.sasl.mechanism", "enables OAUTHBEARER"],
        ),
        case(
            "no sasl on the SASL_SSL listener",
            source(&scram_tls, json!({"tls": tls("ca")})),
            Some(Class::SaslExpected(vec!["SCRAM-SHA-512".into()])),
            reason::SOURCE_SECURITY_MISMATCH,
            &["spec.source.sasl", "requires SASL", "SCRAM-SHA-512"],
        ),
        case(
            "sasl on the plaintext listener",
            source(&plain_broker, json!({"sasl": scram("PLAIN", "password")})),
            Some(Class::SaslNotEnabled),
            reason::SOURCE_SECURITY_MISMATCH,
            &["spec.source.sasl", "does not use SASL"],
        ),
        case(
            "a CA that did not sign the brokers' certificates",
            source(
                &scram_tls,
                json!({"tls": tls("other-ca"), "sasl": scram("SCRAM-SHA-512", "password")}),
            ),
            Some(Class::CertificateUntrusted),
            reason::SOURCE_TLS_FAILED,
            &["spec.source.tls.caSecretRef"],
        ),
        case(
            "a host name the certificate does not list",
            source(
                &format!("localhost:{port}"),
                json!({"tls": tls("ca"), "sasl": scram("SCRAM-SHA-512", "password")}),
            ),
            Some(Class::HostnameMismatch),
            reason::SOURCE_TLS_FAILED,
            &["spec.source.bootstrapServers", "does not name 'localhost'"],
        ),
        case(
            "mTLS listener without a client certificate",
            source(&mtls, json!({"tls": tls("ca")})),
            Some(Class::CertificateRefused),
            reason::SOURCE_CERTIFICATE_REFUSED,
            &["spec.source.tls.certSecretRef"],
        ),
        case(
            "wrong SCRAM password",
            source(
                &scram_tls,
                json!({"tls": tls("ca"), "sasl": scram("SCRAM-SHA-512", "wrong")}),
            ),
            None,
            reason::SOURCE_AUTHENTICATION_FAILED,
            &["spec.source.sasl.passwordSecretRef"],
        ),
    ])
}

/// What one case got: the diagnosis's class, and `Ready`'s reason and message.
struct Seen {
    class: Option<Class>,
    reason: String,
    message: String,
    took: Duration,
}

fn run_case(case: &Case, target: &str, secrets: &SecretFiles) -> Result<Seen> {
    let spec: MirrorFlowSpec = serde_json::from_value(json!({
        "mode": "Observe",
        "source": case.source,
        "target": {"alias": unique("tgt"), "bootstrapServers": target},
    }))?;
    let flow = flow::resolve(format!("classes/{}", case.name), spec, secrets)?;
    let started = Instant::now();
    let expected = Expected::from_client_config(&flow.source_probe_client);
    let class =
        diagnose::diagnose(&expected, Instant::now() + Duration::from_secs(8)).map(|d| d.class);
    let mut obs = Observation {
        observe_only: true,
        heartbeats_enabled: true,
        checkpoints_enabled: true,
        ..Observation::default()
    };
    observe(&flow, Budget::new(PROBE_BUDGET)).record_into(&mut obs);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let st = status::status(None, &obs, &FailoverReadinessSpec::default(), None, &now);
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .context("no Ready condition")?;
    Ok(Seen {
        class,
        reason: ready.reason.clone(),
        message: ready.message.clone(),
        took: started.elapsed(),
    })
}

#[test]
fn failed_connections_are_answered_by_class() -> Result<()> {
    let target = var("MF_TARGET_BOOTSTRAP")?;
    let secure = SecureKafka::from_env()?;
    let dir = std::env::temp_dir().join(unique("mf-classes"));
    std::fs::create_dir_all(&dir)?;
    let (other_ca, _) = self_signed(&dir, "not-the-brokers-ca")?;
    let values: BTreeMap<(String, String), Vec<u8>> = [
        (("ca", "ca.crt"), secure.ca_pem.clone().into_bytes()),
        (("other-ca", "ca.crt"), std::fs::read(&other_ca)?),
        (("scram", "user"), secure.user.clone().into_bytes()),
        (("scram", "password"), secure.password.clone().into_bytes()),
        (("scram", "wrong"), b"not-the-password".to_vec()),
    ]
    .into_iter()
    .map(|((n, k), v)| ((n.to_string(), k.to_string()), v))
    .collect();
    let secrets = SecretFiles::from_values(values);
    let cases = cases(&secure, &dir)?;
    // The probes wait on clusters, not on a core: all at once.
    let seen: Vec<Result<Seen>> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|c| scope.spawn(|| run_case(c, &target, &secrets)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| bail!("the case panicked")))
            .collect()
    });
    let _ = std::fs::remove_dir_all(&dir);
    println!("| case | class | Ready reason | message | probe took |");
    println!("|---|---|---|---|---|");
    let mut wrong = Vec::new();
    for (case, seen) in cases.iter().zip(seen) {
        let seen = match seen {
            Ok(s) => s,
            Err(e) => {
                wrong.push(format!("{}: {e:#}", case.name));
                continue;
            }
        };
        println!(
            "| {} | {:?} | {} | {} | {:.1}s |",
            case.name,
            seen.class,
            seen.reason,
            seen.message,
            seen.took.as_secs_f64()
        );
        let says = case.says.iter().all(|w| seen.message.contains(w));
        if seen.class != case.class || seen.reason != case.reason || !says {
            wrong.push(format!(
                "{}: want {:?} / {} / {:?}, got {:?} / {} / {}",
                case.name,
                case.class,
                case.reason,
                case.says,
                seen.class,
                seen.reason,
                seen.message
            ));
        }
        // The class, never the bytes read.
        assert!(
            !seen.message.contains("Bad Request") && !seen.message.contains("1213486160"),
            "{}: {}",
            case.name,
            seen.message
        );
    }
    if !wrong.is_empty() {
        bail!("{} case(s) wrong:\n{}", wrong.len(), wrong.join("\n"));
    }
    Ok(())
}

/// The status of one probe of an Observe flow with `selection` (topics and groups), with
/// `replicas` replicator pods taken as desired and ready.
fn probed_status(selection: Value, replicas: i32) -> Result<mirrorflow::api::MirrorFlowStatus> {
    let mut spec = json!({
        "mode": "Observe",
        "source": {"alias": unique("sel"), "bootstrapServers": var("MF_SOURCE_BOOTSTRAP")?},
        "target": {"alias": unique("selt"), "bootstrapServers": var("MF_TARGET_BOOTSTRAP")?},
    });
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), selection.as_object()) {
        s.extend(extra.clone());
    }
    let spec: MirrorFlowSpec = serde_json::from_value(spec)?;
    let flow = flow::resolve("classes/selection".into(), spec, &SecretFiles::new("/none"))?;
    let mut obs = Observation {
        desired_replicas: replicas,
        ready_replicas: replicas,
        heartbeats_enabled: true,
        checkpoints_enabled: true,
        ..Observation::default()
    };
    observe(&flow, Budget::new(PROBE_BUDGET)).record_into(&mut obs);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    Ok(status::status(
        None,
        &obs,
        &FailoverReadinessSpec::default(),
        None,
        &now,
    ))
}

fn condition(
    s: &mirrorflow::api::MirrorFlowStatus,
    type_: &str,
) -> Result<(String, String, String)> {
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .with_context(|| format!("no {type_}"))?;
    Ok((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selections_the_source_does_not_fill_are_answered_with_counts() -> Result<()> {
    let topic = unique("classes-sel");
    let source = var("MF_SOURCE_BOOTSTRAP")?;
    mirrorflow_e2e::kafka::create_topic(&source, &topic, 3).await?;
    let (no_topic, no_group, idle) = tokio::task::block_in_place(|| -> Result<_> {
        // A group the selection leaves out: "none of the N groups" needs the source to list
        // one, whatever other tests ran before on this world.
        mirrorflow_e2e::kafka::commit(&source, &format!("{topic}-somebody"), &topic, &[(0, 0)])?;
        Ok((
            // A pattern (not a plain name, which may just not be created yet).
            probed_status(json!({"topics": [format!("{topic}-absent-.*")]}), 1)?,
            probed_status(
                json!({"topics": [topic.clone()], "groups": [format!("{topic}-nobody-.*")]}),
                1,
            )?,
            probed_status(json!({"topics": [topic.clone()]}), 64)?,
        ))
    })?;
    let (status, reason_, message) = condition(&no_topic, "FailoverReady")?;
    println!("no topic matched: FailoverReady {status} {reason_}: {message}");
    assert_eq!(
        (status.as_str(), reason_.as_str()),
        ("False", reason::NO_TOPICS_MATCHED)
    );
    assert!(message.contains("select none of the") && message.contains("topics on the source"));
    let (status, reason_, message) = condition(&no_group, "CheckpointsFresh")?;
    println!("no group matched: CheckpointsFresh {status} {reason_}: {message}");
    assert_eq!(
        (status.as_str(), reason_.as_str()),
        ("True", reason::NO_GROUPS_MATCHED)
    );
    assert!(message.contains("select none of the"), "{message}");
    // FailoverReady follows the other conditions (this probe runs no replicator, so no
    // heartbeats flow): the empty group selection itself blocks nothing.
    let (_, reason_, _) = condition(&no_group, "FailoverReady")?;
    assert_ne!(reason_, reason::NO_TOPICS_MATCHED);
    let (status, reason_, message) = condition(&idle, "Ready")?;
    println!("64 replicas, 3 partitions: Ready {status} {reason_}: {message}");
    assert_eq!(
        (status.as_str(), reason_.as_str()),
        ("True", reason::REPLICAS_ABOVE_PARTITIONS)
    );
    // 3 partitions of the topic, and the source's heartbeats topic when one exists (copied
    // whatever the selection): 61 or 60 replicas idle.
    assert!(
        message.contains("61 replica(s) idle") || message.contains("60 replica(s) idle"),
        "{message}"
    );
    Ok(())
}
