//! `mirrorflow switchover` against the world's brokers, which run Kafka's StandardAuthorizer
//! (`e2e/lib/kafka.sh`): a producer writing as the ordinary SCRAM user `reader` is fenced by
//! DENY WRITE ACLs, the copy and the group's checkpoints catch up, the group is committed on
//! the target where its consumers re-read and skip nothing, and `--abort` lets the producer
//! write to the source again.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use mirrorflow_e2e::replicator::Replicator;
use mirrorflow_e2e::secure::SecureKafka;
use mirrorflow_e2e::switchover::{committed, end_offsets, outcomes, run_switchover, step_millis};
use mirrorflow_e2e::{World, eventually, kafka, unique};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The world's ordinary SCRAM user `reader` on the source's SASL_SSL listener, as a producer.
fn fenced_producer(secure: &SecureKafka) -> Result<FutureProducer> {
    let bootstrap = std::env::var("MF_SOURCE_SECURE_BOOTSTRAP")
        .context("MF_SOURCE_SECURE_BOOTSTRAP is not set: run through e2e/test.sh")?;
    let ca = std::env::var("MF_KAFKA_CA_PEM").context("MF_KAFKA_CA_PEM is not set")?;
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("security.protocol", "SASL_SSL")
        .set("sasl.mechanisms", "SCRAM-SHA-512")
        .set("sasl.username", "reader")
        .set("sasl.password", &secure.password)
        .set("ssl.ca.location", ca)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "10000")
        .create()?)
}

/// Sends `value` to `partition` and waits for the broker's answer.
async fn send(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    value: &str,
) -> Result<(), KafkaError> {
    producer
        .send(
            FutureRecord::to(topic)
                .partition(partition)
                .key(value)
                .payload(value),
            Duration::from_secs(15),
        )
        .await
        .map(|_| ())
        .map_err(|(e, _)| e)
}

#[tokio::test]
async fn a_switchover_fences_producers_and_moves_groups_with_nothing_lost_skipped_or_read_twice()
-> Result<()> {
    let world = World::from_env()?;
    let secure = SecureKafka::from_env()?;
    let (a, b) = (unique("swa"), unique("swb"));
    let topic = unique("sw");
    let remote = format!("{a}.{topic}");
    let group = unique("sw-app");
    let partitions = 2;
    kafka::create_topic(&world.source_bootstrap, &topic, partitions).await?;
    let flow = format!(
        "source: {{alias: {a}, bootstrapServers: '{}'}}\n\
         target: {{alias: {b}, bootstrapServers: '{}'}}\n\
         topics: ['{topic}']\ngroups: ['{group}']\n\
         sourceLoop: {{topicsRefreshInterval: 1s, offsetSyncInterval: 1s}}\n\
         checkpoints: {{interval: 500ms}}\n\
         heartbeats: {{enabled: false}}\n",
        world.source_bootstrap, world.target_bootstrap
    );
    let name = unique("switchover");
    let replicator = Replicator::start(&world.repo_root, &name, &flow, free_port()?)?;
    let flow_file = std::env::temp_dir()
        .join("mirrorflow-e2e")
        .join(&name)
        .join("flow.yaml");

    // Producing as `reader` until the fence refuses it; consuming as the group meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    // Acknowledged records per partition, so the switchover starts only once both hold some.
    let acked_on: Arc<[AtomicU32; 2]> = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
    let producing = {
        let (producer, topic, stop) = (fenced_producer(&secure)?, topic.clone(), stop.clone());
        let acked_on = acked_on.clone();
        tokio::spawn(async move {
            let (mut acked, mut refused) = (Vec::new(), 0u32);
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) && refused < 3 {
                let value = format!("v{i}");
                let partition = (i % 2) as usize;
                match send(&producer, &topic, partition as i32, &value).await {
                    Ok(()) => {
                        acked_on[partition].fetch_add(1, Ordering::Relaxed);
                        acked.push(value)
                    }
                    // Refused by the fence (TOPIC_AUTHORIZATION_FAILED).
                    Err(KafkaError::MessageProduction(
                        RDKafkaErrorCode::TopicAuthorizationFailed,
                    )) => refused += 1,
                    Err(e) => eprintln!("produce failed: {e}"),
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (acked, refused)
        })
    };
    let consuming = {
        let (bootstrap, topic, group, stop) = (
            world.source_bootstrap.clone(),
            topic.clone(),
            group.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || -> Result<usize> {
            let c: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                .set("group.id", group)
                .set("enable.auto.commit", "false")
                .set("auto.offset.reset", "earliest")
                .create()?;
            c.subscribe(&[&topic])?;
            let mut read = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Some(m) = c.poll(Duration::from_millis(100)) {
                    let m = m?;
                    read += 1;
                    c.commit_message(&m, CommitMode::Sync)?;
                }
            }
            Ok(read)
        })
    };
    // Not a fixed pause: on a loaded machine the SASL_SSL producer's first answers have come
    // after the fence, leaving a partition empty and the test without the reads it checks.
    eventually(
        "records acknowledged on both partitions",
        Duration::from_secs(60),
        || async {
            Ok(acked_on
                .iter()
                .all(|n| n.load(Ordering::Relaxed) >= 5)
                .then_some(()))
        },
    )
    .await?;

    let file = flow_file.to_string_lossy().into_owned();
    let started = Instant::now();
    let (code, report, stderr) = run_switchover(
        &world,
        &[
            "--flow-file",
            &file,
            "--group",
            &group,
            "--deny-principal",
            "User:reader",
            "--timeout",
            "120",
            "--apply",
        ],
    )?;
    let took = started.elapsed();
    ensure!(
        code == 0,
        "switchover exited {code}: {report:#}\n{stderr}\n{}",
        replicator.log_text()
    );
    let names = outcomes(&report);
    let want: Vec<(String, String)> = [
        ("fence", "done"),
        ("drain", "done"),
        ("commit", "done"),
        ("reverse", "skipped"),
    ]
    .iter()
    .map(|(n, o)| (n.to_string(), o.to_string()))
    .collect();
    assert_eq!(names, want, "{report:#}");
    let millis = step_millis(&report);
    println!("switchover took {took:?}; steps fence, drain, commit (ms): {millis:?}");

    // The producer was fenced: refused after the fence, every acknowledged record copied.
    let (acked, refused) = tokio::time::timeout(Duration::from_secs(60), producing)
        .await
        .context("the producer was never refused")??;
    ensure!(refused > 0, "the producer was never refused");
    ensure!(!acked.is_empty(), "nothing was produced before the fence");
    let mut copied = BTreeSet::new();
    for p in 0..partitions {
        for r in kafka::read_partition(&world.target_bootstrap, &remote, p)? {
            if let Some(v) = r.2 {
                copied.insert(String::from_utf8_lossy(&v).into_owned());
            }
        }
    }
    let lost: Vec<&String> = acked.iter().filter(|v| !copied.contains(*v)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged records not on the target: {lost:?}",
        lost.len()
    );

    // The group on the target: exactly where its consumers stopped reading on the source, so
    // resuming there re-reads nothing and skips nothing (it read every record).
    stop.store(true, Ordering::Relaxed);
    let read = consuming
        .join()
        .map_err(|_| anyhow::anyhow!("consumer panicked"))??;
    let source_ends = end_offsets(&world.source_bootstrap, &topic, partitions)?;
    let source_commits = committed(&world.source_bootstrap, &group, &topic, partitions)?;
    let target_ends = end_offsets(&world.target_bootstrap, &remote, partitions)?;
    let target_commits = committed(&world.target_bootstrap, &group, &remote, partitions)?;
    for p in 0..partitions as usize {
        assert_eq!(
            source_commits[p],
            Some(source_ends[p]),
            "p{p}: the group read the source to its end"
        );
        assert_eq!(
            target_commits[p],
            Some(target_ends[p]),
            "p{p}: the target group's commit is where the copy ends: 0 re-read, 0 skipped"
        );
    }
    println!(
        "{} records acknowledged before the fence, {refused} refused after it, 0 lost; the group read {read} and resumes on the target with 0 re-read, 0 skipped",
        acked.len()
    );

    // Abort: the fence's ACLs go and the producer writes again.
    let (code, report, stderr) = run_switchover(
        &world,
        &[
            "--flow-file",
            &file,
            "--deny-principal",
            "User:reader",
            "--abort",
        ],
    )?;
    ensure!(code == 0, "abort exited {code}: {report:#}\n{stderr}");
    let producer = fenced_producer(&secure)?;
    let mut written = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && !written {
        written = send(&producer, &topic, 0, "after-abort").await.is_ok();
        if !written {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    ensure!(written, "the producer cannot write after --abort");
    Ok(())
}
