//! The writer against answers in memory and the in-memory broker ([`super::fake_broker`]).
use super::fake_broker::{self, FakeBroker};
use super::*;
use crate::{Conn, Options, Security};

const LEADER: i32 = 1;

fn options() -> Options {
    Options {
        client_id: "mf".into(),
        timeout: Duration::from_secs(5),
        max_frame: 1 << 20,
        address_check: None,
    }
}

fn topic() -> Arc<str> {
    Arc::from("t")
}

/// A writer whose leader's connection reads `answers`, with one request outstanding on it
/// (correlation id 0) holding the first batch of partitions 0 and 1 (tokens 0 and 1),
/// and the second batch of partition 0 queued (token 2).
fn writer_answered_by(answers: Vec<u8>) -> Writer<u32> {
    let cluster = Cluster::new("127.0.0.1:9", Security::default(), options()).expect("one address");
    let mut writer = Writer::new(cluster, 1);
    let conn = Conn::over("memory", std::io::Cursor::new(answers), &options());
    let serial = conn.serial();
    writer.cluster.adopt(LEADER, conn);
    let body = Arc::new(vec![0u8; 61]);
    for (partition, token) in [(0, 0), (1, 1), (0, 2)] {
        let item = Item {
            body: body.clone(),
            range: 0..61,
            token,
        };
        assert!(writer.push(&topic(), partition, item).is_ok());
    }
    let mut tickets = Vec::new();
    for (key, lane) in &mut writer.lanes {
        lane.leader = Some(LEADER);
        let mut sequencer = Sequencer::new(5, 0);
        let item = lane.queue.pop_front().expect("a queued batch");
        let (_, ticket) = sequencer.assign(1, item).expect("room");
        tickets.push((key.clone(), ticket));
        lane.sequencer = Some(sequencer);
    }
    writer
        .outstanding
        .entry(LEADER)
        .or_default()
        .push_back(Outstanding {
            conn: serial,
            id: 0,
            sent_at: Instant::now(),
            tickets,
        });
    writer
}

/// A Produce v8 answer frame for request `id`: topic `name`'s (partition, error, base
/// offset).
fn answer(id: i32, name: &str, partitions: &[(i32, i16, i64)]) -> Vec<u8> {
    let mut body = id.to_be_bytes().to_vec();
    body.extend_from_slice(&1i32.to_be_bytes());
    body.extend_from_slice(&i16::try_from(name.len()).unwrap_or(0).to_be_bytes());
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(&i32::try_from(partitions.len()).unwrap_or(0).to_be_bytes());
    for (partition, error, base_offset) in partitions {
        body.extend_from_slice(&partition.to_be_bytes());
        body.extend_from_slice(&error.to_be_bytes());
        body.extend_from_slice(&base_offset.to_be_bytes());
        body.extend_from_slice(&(-1i64).to_be_bytes()); // log append time
        body.extend_from_slice(&0i64.to_be_bytes()); // log start
        body.extend_from_slice(&0i32.to_be_bytes()); // no record errors
        body.extend_from_slice(&(-1i16).to_be_bytes()); // no message
    }
    body.extend_from_slice(&0i32.to_be_bytes()); // throttle
    let mut frame = i32::try_from(body.len())
        .unwrap_or(0)
        .to_be_bytes()
        .to_vec();
    frame.extend_from_slice(&body);
    frame
}

fn receive(writer: &mut Writer<u32>) -> Progress<u32> {
    let mut progress = Progress::default();
    writer.receive(LEADER, &mut progress);
    progress
}

fn written(progress: &Progress<u32>) -> Vec<(i32, u32, Option<i64>)> {
    progress
        .written
        .iter()
        .map(|w| (w.partition, w.token, w.base_offset))
        .collect()
}

fn resending(writer: &Writer<u32>) -> Vec<usize> {
    writer.lanes.values().map(|l| l.resending.len()).collect()
}

#[test]
fn an_answer_acknowledges_its_batches() {
    let mut writer = writer_answered_by(answer(0, "t", &[(0, 0, 40), (1, 0, -7)]));
    let progress = receive(&mut writer);
    // A negative base offset is not an offset.
    assert_eq!(written(&progress), vec![(0, 0, Some(40)), (1, 1, None)]);
    assert_eq!(writer.pending(), 1, "the queued batch");
}

#[test]
fn another_requests_answer_drops_the_connection_and_writes_again() {
    for frame in [
        answer(7, "t", &[(0, 0, 40), (1, 0, 41)]),
        answer(0, "t", &[(0, 0, 40)])[..20].to_vec(),
        (i32::MAX).to_be_bytes().to_vec(),
        Vec::new(),
    ] {
        let mut writer = writer_answered_by(frame);
        let progress = receive(&mut writer);
        assert!(progress.written.is_empty() && progress.faults.is_empty());
        assert!(progress.failure.is_some());
        assert_eq!(resending(&writer), vec![1, 1], "both batches written again");
        assert!(writer.lanes.values().all(|l| l.leader.is_none()));
        assert_eq!(writer.pending(), 3, "nothing lost");
    }
}

#[test]
fn partitions_left_out_or_not_asked_for_are_written_again() {
    let frame = answer(0, "t", &[(7, 0, 1), (1, 0, 41), (1, 0, 99), (-1, 0, 3)]);
    let mut writer = writer_answered_by(frame);
    let progress = receive(&mut writer);
    assert_eq!(written(&progress), vec![(1, 1, Some(41))]);
    assert_eq!(
        progress.troubles,
        vec![(topic(), 0, ErrorCode::NOT_LEADER_OR_FOLLOWER)]
    );
    assert_eq!(resending(&writer), vec![1, 0]);
    // Another topic's answer acknowledges nothing of this one.
    let mut writer = writer_answered_by(answer(0, "u", &[(0, 0, 1), (1, 0, 2)]));
    let progress = receive(&mut writer);
    assert!(progress.written.is_empty());
    assert_eq!(resending(&writer), vec![1, 1]);
}

#[test]
fn an_error_the_writer_cannot_resolve_gives_the_lane_back() {
    // 87: INVALID_RECORD; the queued batch goes back with the unacknowledged one.
    let mut writer = writer_answered_by(answer(0, "t", &[(0, 87, -1), (1, 0, 41)]));
    let progress = receive(&mut writer);
    assert_eq!(written(&progress), vec![(1, 1, Some(41))]);
    let faults: Vec<_> = progress
        .faults
        .iter()
        .map(|f| (f.partition, f.tokens.clone()))
        .collect();
    assert_eq!(faults, vec![(0, vec![0, 2])]);
    assert_eq!(writer.pending(), 0);
}

const NOT_LEADER: ErrorCode = ErrorCode::NOT_LEADER_OR_FOLLOWER;

/// A writer whose only broker is `broker` (leading every partition), its producer id
/// known, with `batches` batches of 10 records queued for partition 0 (tokens 0, 1, ...).
fn writer_on(broker: &FakeBroker, batches: u32) -> Writer<u32> {
    let cluster =
        Cluster::new(fake_broker::ADDRESS, Security::default(), options()).expect("one address");
    let mut writer = Writer::new(cluster, 5);
    let mut produce = Conn::over(fake_broker::ADDRESS, broker.connection(), &options());
    produce.serve(protocol::API_PRODUCE, protocol::PRODUCE_VERSION);
    let mut metadata = Conn::over(fake_broker::ADDRESS, broker.connection(), &options());
    metadata.serve(protocol::API_METADATA, protocol::METADATA_VERSION);
    writer.cluster.adopt(fake_broker::NODE, produce);
    writer.cluster.adopt_metadata(metadata);
    writer.producer = Some((5, 0));
    let body = Arc::new(fake_broker::source_batch(10));
    for token in 0..batches {
        let item = Item {
            body: body.clone(),
            range: 0..body.len(),
            token,
        };
        assert!(writer.push(&topic(), 0, item).is_ok());
    }
    writer
}

/// Pumps until nothing is pending or `limit` passed: the tokens written, and the faults.
fn pump_until_settled(writer: &mut Writer<u32>, limit: Duration) -> (Vec<u32>, Vec<Fault<u32>>) {
    let started = Instant::now();
    let (mut written, mut faults) = (Vec::new(), Vec::new());
    while writer.pending() > 0 && started.elapsed() < limit {
        let progress = writer.pump();
        written.extend(progress.written.iter().map(|w| w.token));
        faults.extend(progress.faults);
    }
    (written, faults)
}

fn faults_of(faults: &[Fault<u32>]) -> Vec<(i32, ErrorCode, Vec<u32>)> {
    faults
        .iter()
        .map(|f| (f.partition, f.error, f.tokens.clone()))
        .collect()
}

/// A topic created a moment ago: its leader answers the first write NOT_LEADER_OR_FOLLOWER
/// (its election not yet applied), then takes writes. It keeps no sequence of the producer
/// yet, so it would take a later batch first at any sequence (and then refuse the first
/// one as out of order): every batch lands once, in order, and nothing faults.
#[test]
fn a_new_partitions_first_refusal_neither_reorders_nor_faults() {
    let broker = FakeBroker::refusing(1, NOT_LEADER);
    let mut writer = writer_on(&broker, 3);
    let (written, faults) = pump_until_settled(&mut writer, Duration::from_secs(5));
    assert_eq!(faults_of(&faults), vec![]);
    assert_eq!(written, vec![0, 1, 2]);
    let state = broker.state();
    assert_eq!(
        state.log.get(&0),
        Some(&vec![0, 10, 20]),
        "the target's order"
    );
    assert!(state.metadata >= 2, "the leader was asked for again");
}

/// A leader that never takes the write: the writer asks for metadata and writes again,
/// paced (no busy loop), and after its delivery timeout gives the lane back as a fault
/// with the leader's error, instead of waiting for ever.
#[test]
fn a_refusal_that_lasts_gives_the_lane_back_after_the_delivery_timeout() {
    for error in [NOT_LEADER, ErrorCode(19), ErrorCode(7)] {
        let broker = FakeBroker::refusing(usize::MAX, error);
        let timeout = Duration::from_millis(800);
        let mut writer = writer_on(&broker, 3).with_delivery_timeout(timeout);
        let started = Instant::now();
        let (written, faults) = pump_until_settled(&mut writer, Duration::from_secs(5));
        let elapsed = started.elapsed();
        assert!(written.is_empty());
        assert_eq!(
            faults_of(&faults),
            vec![(0, error, vec![0, 1, 2])],
            "{error}"
        );
        assert!(
            faults.iter().all(|f| f.waited == Some(timeout)),
            "given back for waiting, and says so"
        );
        assert!(
            elapsed >= timeout && elapsed < Duration::from_secs(3),
            "{elapsed:?}"
        );
        let state = broker.state();
        // One write per backoff at most: 0.8 s of them, not thousands.
        assert!(
            (2..=10).contains(&state.requests),
            "{} writes",
            state.requests
        );
        assert_eq!(state.log.get(&0), None);
    }
}

/// A leader the writer cannot use for longer than the delivery timeout: its batches go back
/// to the caller with the class of the fault, metadata asked for meanwhile at the metadata
/// backoff, instead of the writer waiting. Per case: how the broker fails, the fault's code,
/// and the writes it took.
#[test]
fn a_leader_unusable_for_too_long_gives_the_lane_back() {
    type Break = fn(&mut fake_broker::State);
    let cases: [(&str, Break, ErrorCode, usize); 2] = [
        (
            "no leader named by the metadata",
            |s| s.leaderless = true,
            ErrorCode::LEADER_NOT_AVAILABLE,
            0,
        ),
        (
            // It drops its connection with a write unanswered and cannot be reached again.
            "a leader that cannot be reached",
            |s| s.mute = true,
            ErrorCode::NETWORK_EXCEPTION,
            1,
        ),
    ];
    for (case, break_it, code, writes) in cases {
        let broker = FakeBroker::default();
        break_it(&mut broker.state());
        let timeout = Duration::from_millis(800);
        let mut writer = writer_on(&broker, 2).with_delivery_timeout(timeout);
        let (written, faults) = pump_until_settled(&mut writer, Duration::from_secs(5));
        assert!(written.is_empty(), "{case}");
        assert_eq!(faults_of(&faults), vec![(0, code, vec![0, 1])], "{case}");
        let state = broker.state();
        assert_eq!(state.requests, writes, "{case}: writes taken");
        assert!(
            (2..=6).contains(&state.metadata),
            "{case}: {} metadata requests",
            state.metadata
        );
    }
}

/// A leader on loopback played by `serve`, given the accepted socket; the writer's end.
fn leader_on_loopback(
    serve: impl FnOnce(std::net::TcpStream) + Send + 'static,
) -> std::net::TcpStream {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        if let Ok((socket, _)) = listener.accept() {
            serve(socket);
        }
    });
    std::net::TcpStream::connect(addr).expect("connected")
}

/// Passes each request to `broker` and its answers back, as they come.
fn answering(broker: FakeBroker) -> impl FnOnce(std::net::TcpStream) + Send + 'static {
    use std::io::{Read, Write};
    move |mut socket| {
        let mut broker = broker;
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = socket.read(&mut buf) {
            if broker.write_all(&buf[..n]).is_err() {
                return;
            }
            let mut answers = Vec::new();
            while let Ok(m @ 1..) = broker.read(&mut buf) {
                answers.extend_from_slice(&buf[..m]);
            }
            if socket.write_all(&answers).is_err() {
                return;
            }
        }
    }
}

/// Reads every request and answers none.
fn silent(mut socket: std::net::TcpStream) {
    use std::io::Read;
    let mut buf = [0u8; 4096];
    while let Ok(1..) = socket.read(&mut buf) {}
}

/// Partition 0 led by broker 1, which never answers; partition 1 by broker 2, which answers
/// at once: partition 1's batches are all written while partition 0's first write waits, and
/// that write ends at the connection's timeout, counted from its sending: the writer never
/// waits on one leader while another's batches could be written.
#[test]
fn a_silent_leader_holds_neither_another_leaders_writes_nor_its_own_for_ever() {
    let timeout = Duration::from_millis(1500);
    let options = Options {
        timeout,
        ..options()
    };
    let cluster = Cluster::new(fake_broker::ADDRESS, Security::default(), options.clone())
        .expect("an address");
    let mut writer: Writer<u32> = Writer::new(cluster, 5);
    let quick = FakeBroker::default();
    for (node, socket) in [
        (1, leader_on_loopback(silent)),
        (2, leader_on_loopback(answering(quick.connection()))),
    ] {
        let mut conn = Conn::over_tcp("127.0.0.1", socket, &options);
        conn.serve(protocol::API_PRODUCE, protocol::PRODUCE_VERSION);
        writer.cluster.adopt(node, conn);
    }
    writer.producer = Some((5, 0));
    let body = Arc::new(fake_broker::source_batch(10));
    for (partition, tokens) in [(0, 0..3), (1, 10..13)] {
        for token in tokens {
            let item = Item {
                body: body.clone(),
                range: 0..body.len(),
                token,
            };
            assert!(writer.push(&topic(), partition, item).is_ok());
        }
    }
    for ((_, partition), lane) in &mut writer.lanes {
        lane.leader = Some(if *partition == 0 { 1 } else { 2 });
    }
    writer.stale = false;

    let started = Instant::now();
    let mut written = Vec::new();
    while written.len() < 3 && started.elapsed() < Duration::from_secs(1) {
        let progress = writer.pump();
        written.extend(progress.written.iter().map(|w| (w.partition, w.token)));
    }
    assert_eq!(
        written,
        vec![(1, 10), (1, 11), (1, 12)],
        "partition 1 written while broker 1 is silent, in {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < timeout,
        "not after the silent leader's timeout: {:?}",
        started.elapsed()
    );
    // The silent leader's write ends at its deadline: its connection is dropped (and the
    // partition written again once metadata names a leader).
    while writer.cluster.connected(1).is_some() && started.elapsed() < timeout * 2 {
        let _ = writer.pump();
    }
    let ended = started.elapsed();
    assert!(
        writer.cluster.connected(1).is_none(),
        "still waiting after {ended:?}"
    );
    assert!(ended >= timeout, "dropped before its timeout: {ended:?}");
}
