use super::*;
use crate::status::reason;

const ID: i32 = API_VERSIONS_ID;

fn kafka_frame(size: i32, id: i32) -> Vec<u8> {
    let mut v = size.to_be_bytes().to_vec();
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(&[0, 0, 0, 0]);
    v
}

#[test]
fn first_bytes_are_classified_by_protocol() {
    use Answer::*;
    let tls_alert = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32];
    let server_hello = [0x16, 0x03, 0x01, 0x00, 0x5a];
    let table: Vec<(&str, Vec<u8>, ReadEnd, Answer)> = vec![
        ("kafka answer", kafka_frame(430, ID), ReadEnd::Enough, Kafka),
        (
            "small kafka answer",
            kafka_frame(4, ID),
            ReadEnd::Enough,
            Kafka,
        ),
        (
            "frame of another request",
            kafka_frame(430, 7),
            ReadEnd::Enough,
            Foreign(super::Foreign::Unknown),
        ),
        (
            "implausible size",
            kafka_frame(200 * 1024 * 1024, ID),
            ReadEnd::Enough,
            Foreign(super::Foreign::Unknown),
        ),
        (
            "negative size",
            kafka_frame(-1, ID),
            ReadEnd::Enough,
            Foreign(super::Foreign::Unknown),
        ),
        ("tls alert", tls_alert.to_vec(), ReadEnd::Closed, Tls),
        ("tls handshake", server_hello.to_vec(), ReadEnd::Enough, Tls),
        (
            "http status line",
            b"HTTP/1.1 400 Bad Request\r\n".to_vec(),
            ReadEnd::Enough,
            Foreign(super::Foreign::Http),
        ),
        (
            "http read as a length",
            b"HTTP/1.0 ".to_vec(),
            ReadEnd::Closed,
            Foreign(super::Foreign::Http),
        ),
        (
            "html page",
            b"<html><body>".to_vec(),
            ReadEnd::Closed,
            Foreign(super::Foreign::Http),
        ),
        (
            "ssh banner",
            b"SSH-2.0-OpenSSH_9.6\r\n".to_vec(),
            ReadEnd::Enough,
            Foreign(super::Foreign::Ssh),
        ),
        (
            "smtp banner",
            b"220 mail.example ESMTP\r\n".to_vec(),
            ReadEnd::Enough,
            Foreign(super::Foreign::Text),
        ),
        (
            "redis error",
            b"-ERR unknown command\r\n".to_vec(),
            ReadEnd::Enough,
            Foreign(super::Foreign::Text),
        ),
        (
            "binary garbage",
            vec![0xff, 0x00, 0x13, 0x37, 0x00, 0x00, 0x00, 0x01],
            ReadEnd::Enough,
            Foreign(super::Foreign::Unknown),
        ),
        (
            "two bytes then close",
            vec![0x00, 0x01],
            ReadEnd::Closed,
            Foreign(super::Foreign::Unknown),
        ),
        ("nothing, closed", vec![], ReadEnd::Closed, Closed),
        ("nothing, in time", vec![], ReadEnd::Deadline, Silent),
    ];
    for (case, bytes, end, want) in table {
        assert_eq!(plain_answer(&bytes, end, ID), want, "{case}");
    }
}

#[test]
fn tls_failures_are_classified_by_cause() {
    let table = [
        (
            "hostname",
            62,
            "error:0A000086:SSL routines::certificate verify failed",
            TlsEnd::HostnameMismatch,
        ),
        (
            "ip address",
            64,
            "certificate verify failed",
            TlsEnd::HostnameMismatch,
        ),
        (
            "self-signed",
            18,
            "error:0A000086:SSL routines::certificate verify failed",
            TlsEnd::Untrusted,
        ),
        ("unknown issuer", 20, "", TlsEnd::Untrusted),
        (
            "client cert required",
            0,
            "error:0A00045C:SSL routines::tlsv13 alert certificate required",
            TlsEnd::CertificateRefused,
        ),
        (
            "client cert unknown ca",
            0,
            "ssl/tls alert unknown ca",
            TlsEnd::CertificateRefused,
        ),
        (
            "plaintext answer",
            0,
            "error:0A00010B:SSL routines::wrong version number",
            TlsEnd::NotTls,
        ),
        (
            "huge record",
            0,
            "error:0A0000C6:SSL routines::packet length too long",
            TlsEnd::NotTls,
        ),
        (
            "closed",
            0,
            "error:0A000126:SSL routines::unexpected eof while reading",
            TlsEnd::Closed,
        ),
        (
            "reset",
            0,
            "Connection reset by peer (os error 104)",
            TlsEnd::Closed,
        ),
        (
            "timeout",
            0,
            "Resource temporarily unavailable",
            TlsEnd::Deadline,
        ),
        ("other", 0, "no shared cipher suites here", TlsEnd::Other),
        (
            "broker certificate expired",
            10,
            "error:0A000086:SSL routines::certificate verify failed",
            TlsEnd::OutOfDate(true),
        ),
        (
            "broker certificate not yet valid",
            9,
            "certificate verify failed",
            TlsEnd::OutOfDate(false),
        ),
        (
            "client certificate expired",
            0,
            "error:0A000415:SSL routines::sslv3 alert certificate expired",
            TlsEnd::ClientCertificateExpired,
        ),
    ];
    for (case, verify, text, want) in table {
        assert_eq!(tls_failure(verify, text), want, "{case}");
    }
}

#[test]
fn only_a_refused_client_certificate_is_a_client_refusal() {
    let refusals = [
        (TlsEnd::CertificateRefused, Some(Class::CertificateRefused)),
        (
            TlsEnd::ClientCertificateExpired,
            Some(Class::ClientCertificateExpired),
        ),
    ];
    for (end, want) in refusals {
        assert_eq!(end.client_refusal(), want, "{end:?}");
    }
    let others = [
        TlsEnd::NotTls,
        TlsEnd::Untrusted,
        TlsEnd::HostnameMismatch,
        TlsEnd::OutOfDate(true),
        TlsEnd::OutOfDate(false),
        TlsEnd::Closed,
        TlsEnd::Deadline,
        TlsEnd::Other,
    ];
    for end in others {
        assert_eq!(end.client_refusal(), None, "{end:?}");
    }
}

#[test]
fn sasl_answers_name_the_mechanisms_or_the_mismatch() {
    let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let table = [
        (
            "mechanism enabled",
            Some("SCRAM-SHA-512"),
            Some((0, list(&["SCRAM-SHA-512"]))),
            Class::Kafka,
        ),
        (
            "mechanism not enabled",
            Some("SCRAM-SHA-256"),
            Some((33, list(&["SCRAM-SHA-512", "PLAIN"]))),
            Class::MechanismNotEnabled {
                asked: "SCRAM-SHA-256".into(),
                enabled: list(&["SCRAM-SHA-512", "PLAIN"]),
            },
        ),
        (
            "hostile names are dropped",
            Some("PLAIN"),
            Some((33, list(&["SCRAM-SHA-512", "<script>", ""]))),
            Class::MechanismNotEnabled {
                asked: "PLAIN".into(),
                enabled: list(&["SCRAM-SHA-512"]),
            },
        ),
        (
            "sasl on a listener without it",
            Some("PLAIN"),
            Some((34, vec![])),
            Class::SaslNotEnabled,
        ),
        (
            "closed on handshake",
            Some("PLAIN"),
            None,
            Class::SaslNotEnabled,
        ),
        (
            "no sasl asked, listener requires it",
            None,
            Some((33, list(&["SCRAM-SHA-512"]))),
            Class::SaslExpected(list(&["SCRAM-SHA-512"])),
        ),
        (
            "no sasl asked, listener enables plain",
            None,
            Some((0, list(&["PLAIN"]))),
            Class::SaslExpected(list(&["PLAIN"])),
        ),
        (
            "no sasl asked, none used",
            None,
            Some((34, vec![])),
            Class::Kafka,
        ),
        ("no sasl asked, closed", None, None, Class::Kafka),
    ];
    for (case, asked, answer, want) in table {
        assert_eq!(sasl_answer(asked, answer), want, "{case}");
    }
}

#[test]
fn failed_connection_attempts_are_refused_or_unanswered() {
    use std::io::ErrorKind::*;
    assert_eq!(connect_failure(ConnectionRefused), Class::NothingListening);
    for kind in [
        TimedOut,
        HostUnreachable,
        NetworkUnreachable,
        WouldBlock,
        Other,
    ] {
        assert_eq!(connect_failure(kind), Class::NoAnswer, "{kind:?}");
    }
}

#[test]
fn every_class_names_a_field_and_a_fix_and_no_bytes() {
    let classes = [
        Class::Unresolved,
        Class::NothingListening,
        Class::NoAnswer,
        Class::Silent,
        Class::TlsExpected,
        Class::PlaintextExpected,
        Class::NotKafka(Foreign::Http),
        Class::NotKafka(Foreign::Ssh),
        Class::NotKafka(Foreign::Text),
        Class::NotKafka(Foreign::Unknown),
        Class::CertificateUntrusted,
        Class::HostnameMismatch,
        Class::CertificateRefused,
        Class::CertificateOutOfDate { expired: true },
        Class::CertificateOutOfDate { expired: false },
        Class::ClientCertificateExpired,
        Class::SaslExpected(vec!["SCRAM-SHA-512".into()]),
        Class::SaslNotEnabled,
        Class::MechanismNotEnabled {
            asked: "PLAIN".into(),
            enabled: vec!["SCRAM-SHA-512".into()],
        },
        Class::Kafka,
    ];
    for class in classes {
        for side in ["source", "target"] {
            let d = Diagnosis {
                address: "kafka-0.kafka:9093".into(),
                class: class.clone(),
            };
            let (reason, message) = describe(&d, side);
            let prefix = if side == "source" { "Source" } else { "Target" };
            assert!(reason.starts_with(prefix), "{class:?}: {reason}");
            assert!(
                message.starts_with(&format!("spec.{side}.")),
                "{class:?}: {message}"
            );
            assert!(message.contains("kafka-0.kafka:9093"), "{message}");
            assert!(message.contains("; "), "no fix in {message}");
        }
    }
    let mismatch = describe(
        &Diagnosis {
            address: "a:1".into(),
            class: Class::MechanismNotEnabled {
                asked: "SCRAM-SHA-256".into(),
                enabled: vec!["SCRAM-SHA-512".into()],
            },
        },
        "source",
    );
    assert_eq!(mismatch.0, reason::SOURCE_SASL_MECHANISM_NOT_ENABLED);
    assert!(
        mismatch
            .1
            .starts_with("spec.source.sasl.mechanism: SCRAM-SHA-256")
            && mismatch.1.contains("enables SCRAM-SHA-512"),
        "{}",
        mismatch.1
    );
}

#[test]
fn the_expected_connection_comes_from_the_client_configuration() {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", "a:1, b:2,,c:3,d:4")
        .set("security.protocol", "SASL_SSL")
        .set("sasl.mechanisms", "SCRAM-SHA-512")
        .set("ssl.ca.pem", "PEM");
    let e = Expected::from_client_config(&c);
    assert_eq!(e.addresses, ["a:1", "b:2", "c:3", "d:4"]);
    assert_eq!(e.sasl.as_deref(), Some("SCRAM-SHA-512"));
    let tls = e.tls.expect("tls");
    assert_eq!(tls.ca_pem.as_deref(), Some("PEM"));
    assert!(tls.client.is_none());
    let mut plain = ClientConfig::new();
    plain.set("bootstrap.servers", "a:1");
    let e = Expected::from_client_config(&plain);
    assert!(e.tls.is_none() && e.sasl.is_none());
}

/// A listener on 127.0.0.1 that runs `serve` on every connection, on threads of its own.
fn listener(serve: fn(std::net::TcpStream)) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || serve(s));
        }
    });
    addr
}

fn plain(addr: &str) -> Expected {
    Expected {
        addresses: vec![addr.to_string()],
        ..Expected::default()
    }
}

fn class_at(expected: &Expected) -> Option<Class> {
    diagnose(expected, Instant::now() + Duration::from_secs(8)).map(|d| d.class)
}

#[test]
fn local_listeners_are_told_apart() {
    let closed = listener(|_s| {});
    let http = listener(|mut s| {
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    });
    // Answers only once a line ends, as Python's http.server does.
    let line_http = listener(|mut s| {
        let mut seen = Vec::new();
        let mut buf = [0u8; 64];
        while !seen.contains(&b'\n') {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let _ = s.write_all(b"<!DOCTYPE HTML>\n<html><body>400</body></html>\n");
    });
    let ssh = listener(|mut s| {
        let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n");
        std::thread::sleep(Duration::from_secs(1));
    });
    // Nothing listens on a port just freed.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .to_string();
    assert_eq!(class_at(&plain(&free)), Some(Class::NothingListening));
    assert_eq!(
        class_at(&plain(&closed)),
        Some(Class::NotKafka(Foreign::Unknown))
    );
    assert_eq!(
        class_at(&plain(&http)),
        Some(Class::NotKafka(Foreign::Http))
    );
    assert_eq!(class_at(&plain(&ssh)), Some(Class::NotKafka(Foreign::Ssh)));
    assert_eq!(
        class_at(&plain(&line_http)),
        Some(Class::NotKafka(Foreign::Http))
    );
    let tls_to_line_http = Expected {
        addresses: vec![line_http.clone()],
        tls: Some(TlsMaterial::default()),
        sasl: None,
    };
    assert_eq!(
        class_at(&tls_to_line_http),
        Some(Class::NotKafka(Foreign::Http))
    );
    assert_eq!(
        class_at(&plain("no-such-host.invalid:9092")),
        Some(Class::Unresolved)
    );
    // The first address that answers decides.
    let both = Expected {
        addresses: vec![free.clone(), http.clone()],
        ..Expected::default()
    };
    let found = diagnose(&both, Instant::now() + Duration::from_secs(8)).expect("found");
    assert_eq!(
        (found.address, found.class),
        (http, Class::NotKafka(Foreign::Http))
    );
}

#[test]
fn a_silent_or_trickling_listener_ends_by_the_deadline() {
    let silent = listener(|s| {
        std::thread::sleep(Duration::from_secs(20));
        drop(s);
    });
    // The listeners hold a connection 20 s (silent) and 30 s (trickling): ending well before
    // that shows the 2 s deadline held. The bound leaves room for a loaded machine (a CI run
    // building beside it took 6.5 s here), not for a diagnosis that waits for the peer.
    let ended_by_the_deadline = Duration::from_secs(10);
    let started = Instant::now();
    let found = diagnose(&plain(&silent), Instant::now() + Duration::from_secs(2));
    assert_eq!(found.map(|d| d.class), Some(Class::Silent));
    assert!(
        started.elapsed() < ended_by_the_deadline,
        "{:?}",
        started.elapsed()
    );
    // TLS asked of a peer that trickles one byte a second: the watchdog ends it.
    let trickle = listener(|mut s| {
        for b in [0x16u8, 0x03, 0x03, 0x40, 0x00].iter().cycle().take(60) {
            if s.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let tls = Expected {
        addresses: vec![trickle],
        tls: Some(TlsMaterial::default()),
        sasl: None,
    };
    let started = Instant::now();
    let _ = diagnose(&tls, Instant::now() + Duration::from_secs(2));
    assert!(
        started.elapsed() < ended_by_the_deadline,
        "{:?}",
        started.elapsed()
    );
}

/// A certificate for `cn` valid from `days.0` to `days.1` days from now, signed by `issuer`
/// (self-signed when `None`), naming 127.0.0.1.
fn certificate(
    cn: &str,
    days: (i64, i64),
    issuer: Option<&(
        openssl::x509::X509,
        openssl::pkey::PKey<openssl::pkey::Private>,
    )>,
) -> (
    openssl::x509::X509,
    openssl::pkey::PKey<openssl::pkey::Private>,
) {
    use openssl::asn1::Asn1Time;
    use openssl::x509::extension::{BasicConstraints, SubjectAlternativeName};
    let key = openssl::pkey::PKey::from_rsa(openssl::rsa::Rsa::generate(2048).unwrap()).unwrap();
    let mut name = openssl::x509::X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", cn).unwrap();
    let name = name.build();
    let mut b = openssl::x509::X509::builder().unwrap();
    b.set_version(2).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(issuer.map_or(&name, |(c, _)| c.subject_name()))
        .unwrap();
    b.set_pubkey(&key).unwrap();
    let at = |d: i64| Asn1Time::from_unix(crate::clock::now_ms() / 1000 + d * 86_400).unwrap();
    b.set_not_before(&at(days.0)).unwrap();
    b.set_not_after(&at(days.1)).unwrap();
    if issuer.is_none() {
        b.append_extension(BasicConstraints::new().ca().build().unwrap())
            .unwrap();
    } else {
        let san = SubjectAlternativeName::new()
            .ip("127.0.0.1")
            .build(&b.x509v3_context(issuer.map(|(c, _)| c.as_ref()), None))
            .unwrap();
        b.append_extension(san).unwrap();
    }
    let signer = issuer.map_or(&key, |(_, k)| k);
    b.sign(signer, openssl::hash::MessageDigest::sha256())
        .unwrap();
    (b.build(), key)
}

fn pem(cert: &openssl::x509::X509) -> String {
    String::from_utf8(cert.to_pem().unwrap()).unwrap()
}

/// A TLS listener on 127.0.0.1 with `server`'s certificate that, given `client_ca`, requires
/// a client certificate it signed; each connection reads until the peer goes, answering its
/// first read with `answer` when there is one (an HTTPS server's).
fn tls_listener(
    server: &(
        openssl::x509::X509,
        openssl::pkey::PKey<openssl::pkey::Private>,
    ),
    client_ca: Option<&openssl::x509::X509>,
    answer: Option<&'static [u8]>,
) -> String {
    use openssl::ssl::{SslAcceptor, SslMethod, SslVerifyMode};
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
    b.set_certificate(&server.0).unwrap();
    b.set_private_key(&server.1).unwrap();
    if let Some(ca) = client_ca {
        let mut store = openssl::x509::store::X509StoreBuilder::new().unwrap();
        store.add_cert(ca.clone()).unwrap();
        b.set_verify_cert_store(store.build()).unwrap();
        b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    }
    let acceptor = std::sync::Arc::new(b.build());
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let acceptor = acceptor.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                match acceptor.accept(s) {
                    Ok(mut tls) => {
                        let mut first = true;
                        while matches!(tls.read(&mut buf), Ok(n) if n > 0) {
                            if let Some(answer) = answer.filter(|_| first) {
                                let _ = tls.write_all(answer);
                            }
                            first = false;
                        }
                    }
                    // Refused: the alert is sent; reading what the client sent before closing
                    // keeps the close from being a reset that could overtake the alert.
                    Err(openssl::ssl::HandshakeError::Failure(mut mid)) => {
                        let tcp = mid.get_mut();
                        let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
                        while matches!(tcp.read(&mut buf), Ok(n) if n > 0) {}
                    }
                    Err(_) => {}
                }
            });
        }
    });
    addr
}

#[test]
fn certificates_outside_their_validity_are_told_as_such() {
    let ca = certificate("test-ca", (-30, 30), None);
    let tls_to = |addr: &str, client: Option<(String, String)>| Expected {
        addresses: vec![addr.to_string()],
        tls: Some(TlsMaterial {
            ca_pem: Some(pem(&ca.0)),
            client,
        }),
        sasl: None,
    };
    let expired = tls_listener(&certificate("broker", (-30, -1), Some(&ca)), None, None);
    assert_eq!(
        class_at(&tls_to(&expired, None)),
        Some(Class::CertificateOutOfDate { expired: true })
    );
    let early = tls_listener(&certificate("broker", (2, 30), Some(&ca)), None, None);
    assert_eq!(
        class_at(&tls_to(&early, None)),
        Some(Class::CertificateOutOfDate { expired: false })
    );
    // A broker that takes client certificates the CA signed, and an expired one of those.
    let mtls = tls_listener(
        &certificate("broker", (-1, 30), Some(&ca)),
        Some(&ca.0),
        None,
    );
    let old_client = certificate("client", (-30, -1), Some(&ca));
    let key = String::from_utf8(old_client.1.private_key_to_pem_pkcs8().unwrap()).unwrap();
    assert_eq!(
        class_at(&tls_to(&mtls, Some((pem(&old_client.0), key)))),
        Some(Class::ClientCertificateExpired)
    );
    assert_eq!(
        class_at(&tls_to(&mtls, None)),
        Some(Class::CertificateRefused)
    );
    // An HTTPS server whose certificate expired: the address is the fix to name, not the
    // certificate.
    let https = tls_listener(
        &certificate("web", (-30, -1), Some(&ca)),
        None,
        Some(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
    );
    assert_eq!(
        class_at(&tls_to(&https, None)),
        Some(Class::NotKafka(Foreign::Http))
    );
}
