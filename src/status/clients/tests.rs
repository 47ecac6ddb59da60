use super::*;

fn config(pairs: &[(&str, &str)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", "127.0.0.1:9092")
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanisms", "SCRAM-SHA-512")
        .set("sasl.username", "app")
        .set("sasl.password", "hunter2");
    for (k, v) in pairs {
        c.set(*k, *v);
    }
    c
}

#[test]
fn flows_share_a_client_only_with_the_same_namespace_and_credentials() {
    let clients = ProbeClients::default();
    let a = clients.cluster("tenant-a", &config(&[])).expect("client");
    let same = clients.cluster("tenant-a", &config(&[])).expect("client");
    assert!(Arc::ptr_eq(&a, &same), "same namespace and credentials");
    let other_password = clients
        .cluster("tenant-a", &config(&[("sasl.password", "two")]))
        .expect("client");
    assert!(!Arc::ptr_eq(&a, &other_password), "other password");
    let other_ca = clients
        .cluster("tenant-a", &config(&[("ssl.ca.pem", "-----BEGIN...")]))
        .expect("client");
    assert!(!Arc::ptr_eq(&a, &other_ca), "other TLS settings");
    let other_namespace = clients.cluster("tenant-b", &config(&[])).expect("client");
    assert!(
        !Arc::ptr_eq(&a, &other_namespace),
        "same credentials, another tenant"
    );
    let other_servers = clients
        .cluster(
            "tenant-a",
            &config(&[("bootstrap.servers", "127.0.0.1:9093")]),
        )
        .expect("client");
    assert!(!Arc::ptr_eq(&a, &other_servers), "other cluster");
    assert_eq!(clients.len(), 5);
}

#[test]
fn probe_clients_have_small_buffers_unless_the_flow_chose_its_own() {
    let c = probe_config(&config(&[]), PROBE_GROUP);
    assert_eq!(c.get("queued.max.messages.kbytes"), Some("512"));
    assert_eq!(c.get("max.partition.fetch.bytes"), Some("262144"));
    assert_eq!(c.get("statistics.interval.ms"), Some("0"));
    assert_eq!(c.get("receive.message.max.bytes"), Some("8388608"));
    let own = probe_config(
        &config(&[("max.partition.fetch.bytes", "1048576")]),
        PROBE_GROUP,
    );
    assert_eq!(own.get("max.partition.fetch.bytes"), Some("1048576"));
    // The answer bound holds whatever the configuration says (N6).
    let big = probe_config(
        &config(&[("receive.message.max.bytes", "100000000")]),
        PROBE_GROUP,
    );
    assert_eq!(big.get("receive.message.max.bytes"), Some("8388608"));
    // librdkafka accepts the settings (it refuses a fetch size below the message size).
    consumer(&config(&[]), PROBE_GROUP, false, None).expect("a probe client");
}

#[test]
fn a_cluster_whose_metadata_was_refused_is_not_connected_to_again_for_a_while() {
    let clients = ProbeClients::new(IDLE);
    let hostile = config(&[("bootstrap.servers", "hostile:9092")]);
    let fault =
        ClusterFault::Brokers(crate::status::brokers::Refusal::TooManyBrokers { count: 20_000 });
    if let Ok(mut r) = clients.refused.lock() {
        r.insert(
            ClientKey::new("ns", &hostile),
            (Instant::now(), fault.clone()),
        );
    }
    assert_eq!(clients.recently_refused("ns", &hostile), Some(fault));
    assert!(clients.cluster("ns", &hostile).is_err());
    assert_eq!(clients.len(), 0, "no client, no broker threads");
    // Another namespace, or another cluster, is not affected.
    assert_eq!(clients.recently_refused("other", &hostile), None);
    // After REFUSED_FOR the cluster is asked again (an `Instant` that far back exists
    // once the machine has run that long).
    let Some(long_ago) = Instant::now().checked_sub(REFUSED_FOR + Duration::from_secs(1)) else {
        return;
    };
    if let Ok(mut r) = clients.refused.lock()
        && let Some(entry) = r.get_mut(&ClientKey::new("ns", &hostile))
    {
        entry.0 = long_ago;
    }
    assert_eq!(clients.recently_refused("ns", &hostile), None);
}

#[test]
fn the_operator_fetches_no_token_from_its_own_loopback_unless_allowed() {
    let loopback = config(&[
        ("sasl.mechanisms", "OAUTHBEARER"),
        ("sasl.oauthbearer.method", "oidc"),
        (
            "sasl.oauthbearer.token.endpoint.url",
            "http://127.0.0.1:15000/quitquitquit",
        ),
    ]);
    let operator = ProbeClients::new(IDLE);
    assert!(matches!(
        operator.refused(&loopback),
        Some(ClusterFault::TokenEndpointUnreachable(m)) if m.contains("probe.loopbackTokenEndpoints")
    ));
    assert!(operator.cluster("ns", &loopback).is_err(), "no client made");
    assert!(operator.is_empty());
    assert_eq!(ProbeClients::for_cli().refused(&loopback), None);
    let allowed = ProbeClients::new(IDLE).with_loopback_token_endpoints(true);
    assert_eq!(allowed.refused(&loopback), None);
    let https = config(&[(
        "sasl.oauthbearer.token.endpoint.url",
        "https://idp.example.com/token",
    )]);
    assert_eq!(operator.refused(&https), None);
}

#[test]
fn oauth_tokens_come_from_the_bounded_client_not_librdkafkas() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("bound").port();
    let served = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("one request");
        let mut request = [0u8; 2048];
        let _ = s.read(&mut request);
        let body = r#"{"access_token":"tok-1","expires_in":100}"#;
        let answer = format!("HTTP/1.1 200 OK\r\n\r\n{body}");
        s.write_all(answer.as_bytes()).expect("answered");
    });
    let oauth = config(&[
        ("sasl.mechanisms", "OAUTHBEARER"),
        ("sasl.oauthbearer.method", "oidc"),
        (
            "sasl.oauthbearer.token.endpoint.url",
            &format!("http://127.0.0.1:{port}/token"),
        ),
        ("sasl.oauthbearer.client.id", "probe"),
        ("sasl.oauthbearer.client.secret", "s3cret"),
    ]);
    let client = consumer(&oauth, PROBE_GROUP, true, None).expect("a probe client");
    let context = client.context();
    assert!(context.oauth.is_some());
    let token = context.generate_oauth_token(None).expect("a token");
    served.join().expect("served");
    assert_eq!(token.token, "tok-1");
    let now = crate::clock::now_ms();
    assert!((now + 70_000..=now + 80_000).contains(&token.lifetime_ms));
    // Served from the cache while fresh: the endpoint answered once.
    assert_eq!(
        context.generate_oauth_token(None).expect("cached").token,
        "tok-1"
    );
    // librdkafka's own OIDC client is not configured.
    let librdkafka = librdkafka_config(&oauth, PROBE_GROUP, true);
    assert_eq!(librdkafka.get("sasl.oauthbearer.method"), None);
    assert_eq!(librdkafka.get("sasl.oauthbearer.client.secret"), None);
    assert_eq!(librdkafka.get("sasl.mechanisms"), Some("OAUTHBEARER"));
    // With SASL extensions, which a token from the context cannot carry: librdkafka's own.
    let mut extended = oauth.clone();
    extended.set("sasl.oauthbearer.extensions", "logicalCluster=lkc-1");
    let client = consumer(&extended, PROBE_GROUP, true, None).expect("a probe client");
    assert!(client.context().oauth.is_none());
}

#[test]
fn a_key_never_prints_its_credentials() {
    let key = ClientKey::new("tenant-a", &config(&[]));
    let shown = format!("{key:?}");
    assert!(shown.contains("tenant-a") && shown.contains("127.0.0.1:9092"));
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[test]
fn idle_clients_are_dropped() {
    let clients = ProbeClients::new(Duration::from_millis(50));
    let c = clients.cluster("ns", &config(&[])).expect("client");
    drop(c);
    assert_eq!(clients.evict_idle(), 1, "still fresh");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(clients.evict_idle(), 0);
    assert!(clients.is_empty());
}
