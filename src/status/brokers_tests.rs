//! The probe's clients against a fake broker whose Metadata answer lists what a test says: the
//! audit's N6 measurement (threads before and after a many-broker answer) and the N12 check of
//! brokers named in metadata.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::Duration;

use mirrorflow_conn::AddressCheck;
use rdkafka::ClientConfig;

use super::{MAX_BROKERS, Refusal};
use crate::status::ClusterFault;
use crate::status::clients::{IDLE, ProbeClients};

/// A broker on loopback that answers ApiVersions (Metadata up to v1) and Metadata with the
/// brokers (node id, host, port) `brokers` gives for its own port, on every connection, until
/// the test ends.
fn fake_broker(brokers: impl FnOnce(i32) -> Vec<(i32, String, i32)>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
    let local = listener.local_addr().expect("its address");
    let addr = local.to_string();
    let brokers = brokers(i32::from(local.port()));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let brokers = brokers.clone();
            std::thread::spawn(move || serve(conn, &brokers));
        }
    });
    addr
}

fn serve(mut conn: TcpStream, brokers: &[(i32, String, i32)]) {
    loop {
        let mut size = [0u8; 4];
        if conn.read_exact(&mut size).is_err() {
            return;
        }
        let mut request = vec![0u8; usize::try_from(i32::from_be_bytes(size)).unwrap_or(0)];
        if request.len() < 8 || conn.read_exact(&mut request).is_err() {
            return;
        }
        let api_key = i16::from_be_bytes([request[0], request[1]]);
        let version = i16::from_be_bytes([request[2], request[3]]);
        let mut answer = request[4..8].to_vec(); // the correlation id
        match api_key {
            18 => api_versions(&mut answer, version),
            3 => metadata_v1(&mut answer, brokers),
            _ => return,
        }
        let mut frame = i32::try_from(answer.len())
            .unwrap_or(0)
            .to_be_bytes()
            .to_vec();
        frame.extend(answer);
        if conn.write_all(&frame).is_err() {
            return;
        }
    }
}

/// ApiVersions 0..3 and Metadata 0..1; v3 answers are flexible (compact array, tags).
fn api_versions(out: &mut Vec<u8>, version: i16) {
    let apis: [(i16, i16, i16); 2] = [(18, 0, 3), (3, 0, 1)];
    out.extend(0i16.to_be_bytes());
    if version >= 3 {
        out.push(u8::try_from(apis.len() + 1).unwrap_or(0));
    } else {
        out.extend(i32::try_from(apis.len()).unwrap_or(0).to_be_bytes());
    }
    for (key, min, max) in apis {
        out.extend(key.to_be_bytes());
        out.extend(min.to_be_bytes());
        out.extend(max.to_be_bytes());
        if version >= 3 {
            out.push(0);
        }
    }
    if version >= 1 {
        out.extend(0i32.to_be_bytes());
    }
    if version >= 3 {
        out.push(0);
    }
}

fn metadata_v1(out: &mut Vec<u8>, brokers: &[(i32, String, i32)]) {
    out.extend(i32::try_from(brokers.len()).unwrap_or(0).to_be_bytes());
    for (id, host, port) in brokers {
        out.extend(id.to_be_bytes());
        out.extend(i16::try_from(host.len()).unwrap_or(0).to_be_bytes());
        out.extend(host.as_bytes());
        out.extend(port.to_be_bytes());
        out.extend((-1i16).to_be_bytes());
    }
    out.extend(brokers.first().map_or(-1, |b| b.0).to_be_bytes());
    out.extend(0i32.to_be_bytes());
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

fn probe_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    c
}

/// N6: a cluster listing thousands of brokers is refused and its client, with the thread
/// librdkafka started per broker, dropped; it is not connected to again soon.
#[test]
fn a_metadata_answer_with_too_many_brokers_is_refused_and_its_threads_go() {
    // Unroutable documentation addresses: nothing is ever connected there.
    let listed = 2_000;
    let bootstrap = fake_broker(|_| {
        (0..listed)
            .map(|i| (i + 1, format!("192.0.2.{}", i % 250 + 1), 9092 + i))
            .collect()
    });
    let clients = ProbeClients::new(IDLE);
    let config = probe_config(&bootstrap);
    let before = threads();
    let cluster = clients.cluster("ns", &config).expect("a client");
    let md = cluster
        .metadata(Duration::from_secs(10))
        .expect("the fake broker's metadata");
    let peak = threads();
    assert_eq!(md.brokers().len(), 2_000);
    let fault = clients
        .brokers_refused("ns", &config, &md)
        .expect("refused");
    assert_eq!(
        fault,
        ClusterFault::Brokers(Refusal::TooManyBrokers { count: 2_000 })
    );
    drop(md);
    drop(cluster);
    let after = threads();
    println!("threads: {before} before, {peak} with the answer, {after} after the refusal");
    // Other tests of this process start and end threads meanwhile: a margin of 100.
    assert!(
        peak >= before + 1_900,
        "librdkafka starts a thread per broker"
    );
    assert!(
        after + 1_900 <= peak,
        "the client and its broker threads are gone"
    );
    assert_eq!(clients.len(), 0);
    assert!(clients.recently_refused("ns", &config).is_some());
    assert!(
        clients.cluster("ns", &config).is_err(),
        "not asked again soon"
    );
    assert!(MAX_BROKERS < listed as usize);
}

/// N12: a broker named in metadata at an address the installer refuses is not followed.
#[test]
fn a_broker_named_in_metadata_at_a_refused_address_is_not_followed() {
    let bootstrap = fake_broker(|own| {
        vec![
            (1, "127.0.0.1".into(), own),
            (2, "169.254.169.254".into(), 80),
        ]
    });
    let check = AddressCheck::new(|ip: IpAddr| {
        if ip == IpAddr::from([169, 254, 169, 254]) {
            Err("169.254.169.254 is in 169.254.169.254/32".into())
        } else {
            Ok(())
        }
    });
    let clients = ProbeClients::new(IDLE).with_address_check(Some(check));
    let config = probe_config(&bootstrap);
    let cluster = clients.cluster("ns", &config).expect("a client");
    let md = cluster
        .metadata(Duration::from_secs(10))
        .expect("the fake broker's metadata");
    match clients.brokers_refused("ns", &config, &md) {
        Some(ClusterFault::Brokers(Refusal::Address { broker, why })) => {
            assert_eq!(broker, "169.254.169.254:80");
            assert!(why.contains("169.254.169.254/32"), "{why}");
        }
        other => panic!("expected an address refusal, got {other:?}"),
    }
    // Without the installer's lists the same answer is followed.
    let open = ProbeClients::new(IDLE);
    let cluster = open.cluster("ns", &config).expect("a client");
    let md = cluster.metadata(Duration::from_secs(10)).expect("metadata");
    assert_eq!(open.brokers_refused("ns", &config, &md), None);
}

/// A refusal names the side's field and its reason, and a broker name from the answer is
/// bounded before it reaches a message.
#[test]
fn refused_metadata_names_the_side_and_the_reason() {
    for (refusal, side, want) in [
        (
            Refusal::TooManyBrokers { count: 20_000 },
            "source",
            crate::status::reason::TOO_MANY_BROKERS,
        ),
        (
            Refusal::Address {
                broker: "169.254.169.254:80".into(),
                why: "169.254.169.254 is in 169.254.169.254/32".into(),
            },
            "target",
            crate::status::reason::ADDRESS_NOT_ALLOWED,
        ),
    ] {
        let (got, message) = ClusterFault::Brokers(refusal).describe(side);
        assert_eq!(got, want);
        assert!(
            message.starts_with(&format!(
                "spec.{side}.bootstrapServers: the {side} cluster's metadata"
            )),
            "{message}"
        );
    }
    // A broker name from the answer is bounded before it reaches a message.
    let long = format!("{}:9092", "b".repeat(100_000));
    let r = super::judge(
        1,
        &[(long, 9092)],
        Some(&mirrorflow_conn::AddressCheck::new(|_| Err("no".into()))),
        |_| Ok(vec![std::net::IpAddr::from([10, 0, 0, 1])]),
        std::time::Instant::now() + std::time::Duration::from_secs(5),
    )
    .expect("refused");
    let (_, message) = ClusterFault::Brokers(r).describe("source");
    assert!(
        message.len() < crate::status::MAX_FOREIGN_TEXT + 600,
        "{}",
        message.len()
    );
}
