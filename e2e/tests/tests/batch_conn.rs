//! The batch-keeping copy's own pieces against the world's brokers: connections over SASL_SSL
//! (SCRAM-SHA-512) and mutual TLS (`mirrorflow-conn`), and the requests and batch rules of
//! `mirrorflow_core::{protocol, batch}`, with the TLS and SASL a flow's cluster spec resolves to
//! for them (`mirrorflow::kafka::config::conn_security`, from Secret files). Record batches a real
//! producer wrote (lz4, one committed and one aborted transaction) are fetched `read_committed`
//! from the source, written whole by an idempotent producer to the target, and read back with
//! librdkafka: the committed records arrive in order at offsets that follow the source's batches,
//! the aborted ones and the markers do not, and the target keeps lz4. Wrong credentials and an
//! untrusted CA are refused with errors that say so. A `Cluster` finds partitions' leaders and
//! offsets on the listener it was asked on, and asking for a topic's metadata never creates it; a
//! `Fetcher` follows several partitions to their ends, handing on only the batches to copy, and
//! pauses one asked for beyond its log until it is moved; a `Writer` writes what it handed on, over
//! mutual TLS, each partition in order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mirrorflow::api::{ClusterSpec, SaslMechanism, SaslSpec, SecretKeyRef, TlsSpec};
use mirrorflow::kafka::SecretFiles;
use mirrorflow::kafka::config::conn_security;
use mirrorflow_conn::fetcher::Trouble;
use mirrorflow_conn::writer::Item;
use mirrorflow_conn::{
    Cluster, Conn, ConnError, FetchLimits, Fetcher, Options, Security, Tls, Writer,
};
use mirrorflow_core::batch::sequencer::{Answer, Sequencer};
use mirrorflow_core::batch::{self, Admission, Codec};
use mirrorflow_core::protocol::list_offsets::{EARLIEST, LATEST, ListedOffset};
use mirrorflow_core::protocol::{
    self, ErrorCode, FetchPartition, FetchRequest, Isolation, ProduceRequest,
};
use mirrorflow_e2e::batches::committed_batches;
use mirrorflow_e2e::secure::{SecureKafka, self_signed};
use mirrorflow_e2e::{World, kafka, unique};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run through e2e/test.sh"))
}

fn options() -> Options {
    Options {
        client_id: "mirrorflow-e2e-batches".into(),
        timeout: Duration::from_secs(10),
        max_frame: 64 << 20,
        address_check: None,
    }
}

/// What the replicator makes of a flow's cluster spec for the batch copy's connections
/// (`mirrorflow::kafka::config::conn_security`): its TLS and SASL with these Secret values, kept
/// as files of Secret `conn` in a folder of their own for as long as it takes.
fn spec_security(values: &[(&str, &str)], sasl: Option<SaslMechanism>) -> Result<Security> {
    let dir = std::env::temp_dir().join(unique("batch-conn-secrets"));
    std::fs::create_dir_all(dir.join("conn"))?;
    for (key, value) in values {
        std::fs::write(dir.join("conn").join(key), value)?;
    }
    let key = |name: &str| {
        values
            .iter()
            .any(|(k, _)| *k == name)
            .then(|| SecretKeyRef {
                name: "conn".into(),
                key: name.into(),
            })
    };
    let cluster = ClusterSpec {
        alias: "batch".into(),
        bootstrap_servers: "127.0.0.1:9092".into(),
        tls: Some(TlsSpec {
            ca_secret_ref: key("ca"),
            cert_secret_ref: key("cert"),
            key_secret_ref: key("key"),
            ..TlsSpec::default()
        }),
        sasl: sasl.map(|mechanism| SaslSpec {
            mechanism,
            username_secret_ref: key("user"),
            password_secret_ref: key("password"),
            oauthbearer: None,
        }),
        config: Default::default(),
    };
    let security = conn_security(&cluster, "spec.source", &SecretFiles::new(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(security?)
}

fn scram(secure: &SecureKafka, password: &str) -> Result<Security> {
    spec_security(
        &[
            ("ca", &secure.ca_pem),
            ("user", &secure.user),
            ("password", password),
        ],
        Some(SaslMechanism::ScramSha512),
    )
}

fn mtls(ca_pem: &str) -> Result<Security> {
    let read = |n: &str| -> Result<String> {
        let path = var(n)?;
        std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))
    };
    let (cert, key) = (
        read("MF_KAFKA_CLIENT_CERT_PEM")?,
        read("MF_KAFKA_CLIENT_KEY_PEM")?,
    );
    spec_security(&[("ca", ca_pem), ("cert", &cert), ("key", &key)], None)
}

/// A record's value: its name, then enough repeated text that lz4 shrinks the batch (librdkafka
/// sends a batch uncompressed when compressing does not make it smaller).
fn value(name: &str) -> String {
    format!("{name}:{}", "compressible text ".repeat(30))
}

/// Writes, in this order: a committed transaction (t0..t2), an aborted one (x0, x1), and five
/// plain lz4 records (p0..p4) in one batch.
fn write_source(bootstrap: &str, topic: &str) -> Result<()> {
    let timeout = Duration::from_secs(30);
    let txn: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", unique("batch-conn-txn"))
        .set("compression.type", "lz4")
        .create()?;
    txn.init_transactions(timeout)?;
    for (values, commit) in [(&["t0", "t1", "t2"][..], true), (&["x0", "x1"][..], false)] {
        txn.begin_transaction()?;
        for v in values {
            let v = value(v);
            txn.send(BaseRecord::<(), str>::to(topic).payload(&v).partition(0))
                .map_err(|(e, _)| e)?;
        }
        txn.flush(timeout)?;
        if commit {
            txn.commit_transaction(timeout)?;
        } else {
            txn.abort_transaction(timeout)?;
        }
    }
    let plain: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", "lz4")
        .set("linger.ms", "1000")
        .create()?;
    for i in 0..5 {
        plain
            .send(
                BaseRecord::<(), str>::to(topic)
                    .payload(&value(&format!("p{i}")))
                    .partition(0),
            )
            .map_err(|(e, _)| e)?;
    }
    plain.flush(timeout)?;
    Ok(())
}

/// Writes `n` plain records `<name>0`, `<name>1`, ... to each (partition, n).
fn write_plain(bootstrap: &str, topic: &str, name: &str, counts: &[(i32, usize)]) -> Result<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    for &(partition, n) in counts {
        for i in 0..n {
            producer
                .send(
                    BaseRecord::<(), str>::to(topic)
                        .payload(&value(&format!("{name}{i}")))
                        .partition(partition),
                )
                .map_err(|(e, _)| e)?;
        }
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}

/// Fetches partition 0 of `topic` from offset 0 to its last stable offset: the bytes of every
/// batch to copy, and what the fetch saw.
fn fetch_committed(conn: &mut Conn, topic: &str) -> Result<(Vec<Vec<u8>>, Vec<Admission>)> {
    let (mut copy, mut seen) = (Vec::new(), Vec::new());
    for (admission, bytes) in committed_batches(conn, topic, 0)? {
        seen.push(admission);
        if admission == Admission::Copy {
            let Some(Ok(b)) = batch::batches(&bytes).next() else {
                bail!("a fetched batch does not parse");
            };
            ensure!(b.header.whole().is_ok(), "a fresh batch needs decoding");
            ensure!(b.header.codec()? == Codec::Lz4, "the source wrote lz4");
            copy.push(bytes);
        }
    }
    Ok((copy, seen))
}

#[test]
fn whole_batches_cross_sasl_ssl_and_mutual_tls_with_their_records() -> Result<()> {
    let world = World::from_env()?;
    let secure = SecureKafka::from_env()?;
    let rt = tokio::runtime::Runtime::new()?;
    let topic = unique("batches");
    rt.block_on(kafka::create_topic(&world.source_bootstrap, &topic, 1))?;
    rt.block_on(kafka::create_topic(&world.target_bootstrap, &topic, 1))?;
    write_source(&world.source_bootstrap, &topic)?;

    let mut source = Conn::open(
        &secure.source_bootstrap,
        &scram(&secure, &secure.password)?,
        &options(),
    )?;
    source.require(protocol::API_FETCH, "Fetch", protocol::FETCH_VERSION)?;
    let (copy, seen) = fetch_committed(&mut source, &topic)?;
    ensure!(
        seen == [
            Admission::Copy,
            Admission::Marker,
            Admission::Aborted,
            Admission::Marker,
            Admission::Copy
        ],
        "committed batch, its marker, the aborted batch, its marker, the plain batch: {seen:?}"
    );

    let mut target = Conn::open(
        &var("MF_TARGET_MTLS_BOOTSTRAP")?,
        &mtls(&secure.ca_pem)?,
        &options(),
    )?;
    let (producer_id, epoch) = init_producer_id(&mut target)?;
    let mut sequencer = Sequencer::new(producer_id, epoch);
    let mut offsets = Vec::new();
    for bytes in &copy {
        let Some(Ok(b)) = batch::batches(bytes).next() else {
            bail!("a fetched batch no longer parses");
        };
        let (stamp, ticket) = sequencer
            .assign(b.header.record_count, b.header.base_offset)
            .context("room for one batch")?;
        let id = target.correlation();
        let mut request = ProduceRequest::new(id, target.client_id(), None, -1, 30_000, 1024)?;
        request.topic(&topic)?;
        request.partition::<anyhow::Error>(0, |out| Ok(batch::restamp(&b, &stamp, out)?))?;
        let answer = protocol::decode_produce(&target.call(id, &request.finish()?)?)?;
        let Some(p) = answer.topics.first().and_then(|(_, p)| p.first()) else {
            bail!("the produce answer has no partition");
        };
        match sequencer.answer(ticket, p.error, p.base_offset) {
            Answer::Written {
                token,
                base_offset: Some(at),
            } => offsets.push((token, at)),
            other => bail!("writing the batch from {}: {other:?}", b.header.base_offset),
        }
    }
    // The committed transaction's batch at 0, the plain one after both markers and the aborted
    // batch at 7: on the target they follow each other.
    ensure!(
        offsets == [(0, 0), (7, 3)],
        "(source, target) base offsets {offsets:?}"
    );

    let records = kafka::read_partition(&world.target_bootstrap, &topic, 0)?;
    let values: Vec<(i64, String)> = records
        .iter()
        .map(|(o, _, v)| {
            (
                *o,
                String::from_utf8_lossy(v.as_deref().unwrap_or(&[])).into(),
            )
        })
        .collect();
    let expected: Vec<(i64, String)> = ["t0", "t1", "t2", "p0", "p1", "p2", "p3", "p4"]
        .iter()
        .zip(0..)
        .map(|(v, o)| (o, value(v)))
        .collect();
    ensure!(
        values == expected,
        "the target holds {values:?}, not {expected:?}"
    );

    // What the target stored: the copied batches as they were, lz4, under the copy's producer.
    let (stored, _) = fetch_committed(&mut target, &topic)?;
    for bytes in &stored {
        let Some(Ok(b)) = batch::batches(bytes).next() else {
            bail!("a stored batch does not parse");
        };
        ensure!(
            b.header.codec()? == Codec::Lz4,
            "stored as {:?}",
            b.header.codec()
        );
        ensure!(
            b.header.producer_id == producer_id,
            "stored under {}",
            b.header.producer_id
        );
    }
    ensure!(stored.len() == 2, "{} batches stored", stored.len());
    Ok(())
}

#[test]
fn a_wrong_password_and_an_untrusted_ca_are_refused_by_name() -> Result<()> {
    let secure = SecureKafka::from_env()?;
    let wrong = Conn::open(
        &secure.source_bootstrap,
        &scram(&secure, "not-the-password")?,
        &options(),
    );
    match wrong {
        Err(ConnError::Authentication { message }) => ensure!(
            message.contains("SASL_AUTHENTICATION_FAILED"),
            "message: {message}"
        ),
        other => bail!("a wrong password gave {other:?}"),
    }

    let dir = std::env::temp_dir().join(unique("batch-conn-ca"));
    std::fs::create_dir_all(&dir)?;
    let (other_ca, _) = self_signed(&dir, "not-the-brokers-ca")?;
    let mut untrusted = scram(&secure, &secure.password)?;
    if let Some(tls) = untrusted.tls.as_mut() {
        tls.ca_pem = Some(std::fs::read_to_string(&other_ca)?);
    }
    let refused = Conn::open(&secure.source_bootstrap, &untrusted, &options());
    let _ = std::fs::remove_dir_all(&dir);
    match refused {
        Err(ConnError::Tls { message, .. }) => ensure!(
            message.contains("certificate verify failed"),
            "message: {message}"
        ),
        other => bail!("an untrusted CA gave {other:?}"),
    }

    // Mutual TLS without a client certificate: the broker refuses the connection.
    let no_cert = Security {
        tls: Some(Tls {
            ca_pem: Some(secure.ca_pem.clone()),
            client: None,
            verify_hostname: true,
        }),
        sasl: None,
    };
    ensure!(
        Conn::open(&var("MF_SOURCE_MTLS_BOOTSTRAP")?, &no_cert, &options()).is_err(),
        "a broker requiring a client certificate served one without"
    );
    Ok(())
}

/// A producer id from the target, waiting out a coordinator that is still loading its log
/// (a fresh cluster answers COORDINATOR_LOAD_IN_PROGRESS for its first seconds).
fn init_producer_id(target: &mut Conn) -> Result<(i64, i16)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let id = target.correlation();
        let frame = protocol::init_producer_id_request(id, target.client_id(), None, 60_000)?;
        let (error, producer_id, epoch) =
            protocol::decode_init_producer_id(&target.call(id, &frame)?)?;
        if !(error.is_retriable() && Instant::now() < deadline) {
            target.check("InitProducerId", error, "")?;
            return Ok((producer_id, epoch));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn leaders_and_offsets_come_from_the_listener_asked_and_no_topic_is_created() -> Result<()> {
    let world = World::from_env()?;
    let secure = SecureKafka::from_env()?;
    let rt = tokio::runtime::Runtime::new()?;
    let topic = unique("batch-leaders");
    let missing = unique("batch-missing");
    rt.block_on(kafka::create_topic(&world.source_bootstrap, &topic, 3))?;
    let counts = [2i64, 0, 5];
    write_plain(
        &world.source_bootstrap,
        &topic,
        "r",
        &[(0, 2), (1, 0), (2, 5)],
    )?;

    let mut cluster = Cluster::new(
        &secure.source_bootstrap,
        scram(&secure, &secure.password)?,
        options(),
    )?;
    let metadata = cluster.metadata(&[&topic, &missing])?;
    let Some(found) = metadata.topic(&topic) else {
        bail!("{topic} is not in the metadata answer");
    };
    ensure!(
        found.partitions.len() == 3,
        "{} partitions",
        found.partitions.len()
    );
    for p in &found.partitions {
        ensure!(
            !p.error.is_error() && p.leader >= 0,
            "partition {}: {} leader {}",
            p.partition,
            p.error,
            p.leader
        );
        // The leader is addressed on the listener the metadata was asked on (SASL_SSL), and a
        // connection to it authenticates like the bootstrap one.
        let peer = cluster.broker(p.leader)?.peer().to_owned();
        ensure!(
            peer == secure.source_bootstrap,
            "leader {} at {peer}, asked on {}",
            p.leader,
            secure.source_bootstrap
        );
    }
    // A request outstanding on a leader's connection while metadata is asked again: the
    // metadata answer is not read from that connection, and the request's answer stays there.
    let leader = found.partitions[0].leader;
    let conn = cluster.broker(leader)?;
    let (serial, id) = (conn.serial(), conn.correlation());
    let request = FetchRequest::committed(
        &topic,
        vec![FetchPartition {
            partition: 0,
            offset: 0,
            max_bytes: 1 << 20,
        }],
        1 << 20,
    );
    conn.send(&protocol::fetch_request(id, conn.client_id(), &request)?)?;
    let again = cluster.metadata(&[&topic])?;
    ensure!(
        again.topic(&topic).is_some(),
        "{topic} gone from the metadata"
    );
    let conn = cluster.broker(leader)?;
    ensure!(
        conn.serial() == serial,
        "the leader's connection was replaced"
    );
    let answer = conn.recv(id)?;
    let fetched = protocol::decode_fetch(&answer)?;
    ensure!(
        fetched.topics.first().map(|(t, _)| t.as_str()) == Some(topic.as_str()),
        "the fetch answer read back is not the fetch's"
    );

    let Some(unknown) = metadata.topic(&missing) else {
        bail!("{missing} is not in the metadata answer");
    };
    ensure!(
        unknown.error == ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
        "{missing}: {}",
        unknown.error
    );
    ensure!(
        !kafka::topics(&world.source_bootstrap)?.contains(&missing),
        "asking for {missing}'s metadata created it"
    );

    let asks = |timestamp| {
        [
            (0, timestamp),
            (1, timestamp),
            (2, timestamp),
            (7, timestamp),
        ]
    };
    let latest = cluster.list_offsets(found, &asks(LATEST), Isolation::ReadCommitted)?;
    let earliest = cluster.list_offsets(found, &asks(EARLIEST), Isolation::ReadCommitted)?;
    let offsets = |listed: &[ListedOffset]| -> Vec<(i32, String, i64)> {
        listed
            .iter()
            .map(|l| (l.partition, l.error.name().to_owned(), l.offset))
            .collect()
    };
    let none = || "NONE".to_owned();
    let unknown_partition = (7, "UNKNOWN_TOPIC_OR_PARTITION".to_owned(), -1);
    ensure!(
        offsets(&latest)
            == [
                (0, none(), counts[0]),
                (1, none(), counts[1]),
                (2, none(), counts[2]),
                unknown_partition.clone()
            ],
        "latest: {latest:?}"
    );
    ensure!(
        offsets(&earliest)
            == [
                (0, none(), 0),
                (1, none(), 0),
                (2, none(), 0),
                unknown_partition
            ],
        "earliest: {earliest:?}"
    );
    Ok(())
}

#[test]
fn a_fetcher_and_a_writer_copy_every_partition_and_a_partition_read_out_of_range_pauses()
-> Result<()> {
    let world = World::from_env()?;
    let secure = SecureKafka::from_env()?;
    let rt = tokio::runtime::Runtime::new()?;
    let topic = unique("batch-fetcher");
    rt.block_on(kafka::create_topic(&world.source_bootstrap, &topic, 3))?;
    rt.block_on(kafka::create_topic(&world.target_bootstrap, &topic, 3))?;
    // Partition 0: a committed and an aborted transaction and a plain batch (12 offsets, 8
    // records to copy); partition 1: 2 records; partition 2: 4.
    write_source(&world.source_bootstrap, &topic)?;
    write_plain(&world.source_bootstrap, &topic, "q", &[(1, 2), (2, 4)])?;

    let cluster = Cluster::new(
        &secure.source_bootstrap,
        scram(&secure, &secure.password)?,
        options(),
    )?;
    let mut fetcher = Fetcher::new(
        cluster,
        FetchLimits {
            max_bytes: 1 << 20,
            partition_max_bytes: 1 << 20,
            max_wait: Duration::from_millis(100),
        },
    );
    fetcher.assign(&topic, 0, 0);
    fetcher.assign(&topic, 1, 1000);
    fetcher.assign(&topic, 2, 0);
    let target = Cluster::new(
        &var("MF_TARGET_MTLS_BOOTSTRAP")?,
        mtls(&secure.ca_pem)?,
        options(),
    )?;
    let mut writer: Writer<i64> = Writer::new(target, 5);
    let remote: Arc<str> = Arc::from(topic.as_str());
    let mut written: Vec<(i32, i64, Option<i64>)> = Vec::new();
    let mut records = [0i64; 3];
    let mut out_of_range = None;
    let mut reassigned = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    let ends = [12, 2, 4];
    while (0..3).any(|p| fetcher.position(&topic, p) != Some(ends[p as usize])) {
        ensure!(
            Instant::now() < deadline,
            "positions {:?} after 30 s (records {records:?}, out of range {out_of_range:?})",
            (0..3)
                .map(|p| fetcher.position(&topic, p))
                .collect::<Vec<_>>()
        );
        let round = fetcher.round();
        ensure!(round.failure.is_none(), "round failed: {:?}", round.failure);
        for f in &round.fetched {
            for range in &f.batches {
                let Some(Ok(b)) = batch::batches(&f.body[range.clone()]).next() else {
                    bail!(
                        "{}-{}: a fetched range is not one batch",
                        f.topic,
                        f.partition
                    );
                };
                ensure!(!b.header.is_control(), "a marker was handed on to copy");
                records[usize::try_from(f.partition)?] += i64::from(b.header.record_count);
                let item = Item {
                    body: f.body.clone(),
                    range: range.clone(),
                    token: b.header.base_offset,
                };
                if writer.push(&remote, f.partition, item).is_err() {
                    bail!("{remote}: refused as a topic name");
                }
            }
        }
        for t in &round.troubles {
            ensure!(
                t.partition == 1 && t.paused && !reassigned,
                "unexpected trouble {t:?}"
            );
            out_of_range = Some(t.trouble.clone());
        }
        // Written as they come, as a copy does: partition 1's first batch is pushed after the
        // writer has its producer id.
        let progress = writer.pump();
        ensure!(progress.faults.is_empty(), "faults: {:?}", progress.faults);
        written.extend(
            progress
                .written
                .iter()
                .map(|w| (w.partition, w.token, w.base_offset)),
        );
        if out_of_range.is_some() && !reassigned {
            ensure!(
                fetcher.position(&topic, 1) == Some(1000),
                "a paused partition moved"
            );
            fetcher.assign(&topic, 1, 0);
            reassigned = true;
        }
    }
    ensure!(
        out_of_range == Some(Trouble::Broker(ErrorCode::OFFSET_OUT_OF_RANGE)),
        "partition 1 at 1000: {out_of_range:?}"
    );
    ensure!(
        records == [8, 2, 4],
        "records handed on to copy: {records:?}"
    );

    // Every batch written, each partition's in order from target offset 0.
    let deadline = Instant::now() + Duration::from_secs(30);
    while writer.pending() > 0 {
        ensure!(
            Instant::now() < deadline,
            "{} batches unwritten after 30 s",
            writer.pending()
        );
        let progress = writer.pump();
        ensure!(progress.faults.is_empty(), "faults: {:?}", progress.faults);
        written.extend(
            progress
                .written
                .iter()
                .map(|w| (w.partition, w.token, w.base_offset)),
        );
    }
    written.sort_unstable();
    ensure!(
        written
            == [
                (0, 0, Some(0)),
                (0, 7, Some(3)),
                (1, 0, Some(0)),
                (2, 0, Some(0))
            ],
        "(partition, source offset, target offset) of the written batches: {written:?}"
    );
    for (partition, expected) in [
        (
            0,
            ["t0", "t1", "t2", "p0", "p1", "p2", "p3", "p4"].as_slice(),
        ),
        (1, ["q0", "q1"].as_slice()),
        (2, ["q0", "q1", "q2", "q3"].as_slice()),
    ] {
        let values: Vec<String> =
            kafka::read_partition(&world.target_bootstrap, &topic, partition)?
                .iter()
                .map(|(_, _, v)| String::from_utf8_lossy(v.as_deref().unwrap_or(&[])).into())
                .collect();
        let expected: Vec<String> = expected.iter().map(|v| value(v)).collect();
        ensure!(
            values == expected,
            "target partition {partition} holds {values:?}"
        );
    }
    Ok(())
}
