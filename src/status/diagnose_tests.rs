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
    ];
    for (case, verify, text, want) in table {
        assert_eq!(tls_failure(verify, text), want, "{case}");
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
    let started = Instant::now();
    let found = diagnose(&plain(&silent), Instant::now() + Duration::from_secs(2));
    assert_eq!(found.map(|d| d.class), Some(Class::Silent));
    assert!(
        started.elapsed() < Duration::from_secs(4),
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
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}
