use super::*;
use crate::kafka::positions::{Gap, GapKind, encode_key, encode_value};
use crate::kafka::writers::{self, Writer};
use crate::mm2::{Checkpoint, TopicPartition};

fn position(tail: &mut Tail, offset: i64, partition: i32) -> Result<(), TailRefusal> {
    let key = encode_key("orders", partition);
    let value = encode_value(Frontier {
        next: 5,
        downstream: 4,
    });
    tail.apply(offset, Some(&key), Some(&value), None, Exactness::Unknown)
}

#[test]
fn a_positions_tail_over_its_bound_is_refused_emptied_and_stays_refused() {
    let mut tail = Tail::new(TailKind::Positions, 0);
    for p in 0..i32::try_from(MAX_POSITIONS).expect("small") {
        position(&mut tail, i64::from(p), p).expect("within the bound");
    }
    let over = i64::try_from(MAX_POSITIONS).expect("small");
    let refused = position(&mut tail, over, i32::MAX).expect_err("one over");
    assert_eq!(
        refused,
        TailRefusal::TooManyEntries {
            offset: over,
            what: "positions (source partitions)",
            limit: MAX_POSITIONS
        }
    );
    match &tail.state {
        TailState::Positions { positions, .. } => assert!(positions.is_empty(), "memory freed"),
        other => panic!("{other:?}"),
    }
    assert_eq!(position(&mut tail, over + 1, 1), Err(refused.clone()));
    let message = refused.message("mirrorflow-positions.a.internal");
    assert!(
        message.contains("mirrorflow-positions.a.internal (partition 0, offset 100000)")
            && message.contains("more than 100000 positions")
            && message.contains("spec.target.bootstrapServers"),
        "{message}"
    );
}

#[test]
fn gaps_claims_and_checkpoints_are_bounded_too() {
    let mut gaps = Tail::new(TailKind::Positions, 0);
    let mut result = Ok(());
    for i in 0..=i64::try_from(MAX_GAPS).expect("small") {
        let (key, value) = Gap {
            topic: "t".into(),
            partition: 0,
            kind: GapKind::SourceTruncated,
            from: 1,
            to: 2,
            detected_ms: i,
        }
        .encode();
        result = gaps.apply(i, Some(&key), Some(&value), None, Exactness::Unknown);
    }
    assert!(matches!(
        result,
        Err(TailRefusal::TooManyEntries { what: "gaps", .. })
    ));

    let mut claims = Tail::new(TailKind::Positions, 0);
    let mut result = Ok(());
    for i in 0..=MAX_CLAIMS {
        let w = Writer::unnamed(&format!("w{i}"));
        let key = writers::encode_key(&w);
        let value = writers::encode_value(&w, 1);
        result = claims.apply(
            i64::try_from(i).expect("small"),
            Some(&key),
            Some(&value),
            None,
            Exactness::Unknown,
        );
    }
    assert!(matches!(
        result,
        Err(TailRefusal::TooManyEntries {
            what: "writers' claims",
            ..
        })
    ));

    let mut index = Tail::new(TailKind::Checkpoints, 0);
    let checkpoint = |partition: i32| {
        Checkpoint {
            group: "g".into(),
            topic_partition: TopicPartition::new("a.t", partition),
            upstream_offset: 1,
            downstream_offset: 1,
            metadata: String::new(),
        }
        .encode()
        .expect("encodes")
    };
    // The same group-partition again and again is one entry.
    for offset in 0..10 {
        let r = checkpoint(0);
        index
            .apply(
                offset,
                Some(&r.key),
                Some(&r.value),
                Some(1),
                Exactness::Unknown,
            )
            .expect("one entry");
    }
    assert_eq!(index.checkpoints, 1);
}

#[test]
fn records_before_the_tail_were_read_already() {
    let mut tail = Tail::new(TailKind::Heartbeats, 10);
    let hb = crate::mm2::Heartbeat {
        source_alias: "a".into(),
        target_alias: "b".into(),
        timestamp_ms: 7,
    }
    .encode()
    .expect("encodes");
    tail.apply(9, Some(&hb.key), Some(&hb.value), None, Exactness::Unknown)
        .expect("skipped");
    assert!(matches!(tail.state, TailState::Heartbeat(None)));
    tail.apply(10, Some(&hb.key), Some(&hb.value), None, Exactness::Unknown)
        .expect("read");
    assert!(matches!(tail.state, TailState::Heartbeat(Some(7))));
    assert_eq!(tail.next, 11);
}

fn config(pairs: &[(&str, &str)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", "127.0.0.1:9092");
    for (k, v) in pairs {
        c.set(*k, *v);
    }
    c
}

/// The installer's address check reaches a token endpoint and takes no other credentials
/// away: SCRAM and PLAIN tails kept their SASL once (and reached the broker unauthenticated).
#[test]
fn the_address_check_keeps_every_kind_of_credentials() {
    let check = Some(mirrorflow_conn::AddressCheck::new(|_| Ok(())));
    for (mechanism, extra) in [
        ("SCRAM-SHA-512", None),
        ("PLAIN", None),
        (
            "OAUTHBEARER",
            Some([
                ("sasl.oauthbearer.token.endpoint.url", "https://idp/t"),
                ("sasl.oauthbearer.client.id", "c"),
                ("sasl.oauthbearer.client.secret", "s"),
            ]),
        ),
    ] {
        let mut pairs = vec![
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", mechanism),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
        ];
        pairs.extend(extra.into_iter().flatten());
        let security = conn_security(&config(&pairs), false).expect(mechanism);
        let kept = checked(security, &check);
        let same = match (mechanism, &kept.sasl) {
            ("SCRAM-SHA-512", Some(Sasl::Scram { user, .. })) => user == "u",
            ("PLAIN", Some(Sasl::Plain { user, .. })) => user == "u",
            ("OAUTHBEARER", Some(Sasl::OAuthBearer(_))) => true,
            _ => false,
        };
        assert!(same, "{mechanism}: the credentials went missing");
    }
}

#[test]
fn the_probe_configuration_gives_the_same_security_to_the_own_connections() {
    let plain = conn_security(&config(&[]), false).expect("plaintext");
    assert!(plain.tls.is_none() && plain.sasl.is_none());
    let mtls = conn_security(
        &config(&[
            ("security.protocol", "SASL_SSL"),
            ("ssl.ca.pem", "CA"),
            ("ssl.certificate.pem", "CERT"),
            ("ssl.key.pem", "KEY"),
            ("sasl.mechanisms", "SCRAM-SHA-512"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
        ]),
        false,
    )
    .expect("scram over mTLS");
    let tls = mtls.tls.expect("tls");
    assert_eq!(tls.ca_pem.as_deref(), Some("CA"));
    assert_eq!(tls.client, Some(("CERT".into(), "KEY".into())));
    assert!(tls.verify_hostname);
    assert!(matches!(
        mtls.sasl,
        Some(Sasl::Scram {
            hash: ScramHash::Sha512,
            ..
        })
    ));
    let oauth = config(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanisms", "OAUTHBEARER"),
        ("sasl.oauthbearer.token.endpoint.url", "https://idp/t"),
        ("sasl.oauthbearer.client.id", "c"),
        ("sasl.oauthbearer.client.secret", "s"),
        ("sasl.oauthbearer.extensions", "a=1,b=2"),
    ]);
    match conn_security(&oauth, false).and_then(|s| s.sasl) {
        Some(Sasl::OAuthBearer(o)) => {
            assert_eq!(
                o.extensions,
                [("a".into(), "1".into()), ("b".into(), "2".into())]
            );
            assert!(!o.allow_loopback);
        }
        other => panic!("{other:?}"),
    }
    let unknown = config(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanisms", "GSSAPI"),
    ]);
    assert!(
        conn_security(&unknown, false).is_none(),
        "followed with librdkafka"
    );
    assert!(OwnTails::new(&unknown, false, None).is_none());
}

#[test]
fn a_transaction_is_open_for_as_long_as_the_stable_end_stays_at_the_same_offset() {
    let mut tail = Tail::new(TailKind::Positions, 0);
    let t0 = Instant::now();
    tail.note_open(13, true, t0);
    tail.note_open(13, true, t0 + Duration::from_secs(30));
    assert_eq!(
        tail.open_transaction(t0 + Duration::from_secs(90)),
        Some((13, Duration::from_secs(90))),
        "seen first at t0, still at 13"
    );
    // The stable end moved (that transaction ended, another is open): counted anew.
    tail.note_open(20, true, t0 + Duration::from_secs(95));
    assert_eq!(
        tail.open_transaction(t0 + Duration::from_secs(100)),
        Some((20, Duration::from_secs(5)))
    );
    // Nothing past the stable end: nothing open.
    tail.note_open(25, false, t0 + Duration::from_secs(101));
    assert_eq!(tail.open_transaction(t0 + Duration::from_secs(200)), None);
}
