//! The checkpoint and heartbeat loops against the world's real Kafka clusters.
//!
//! Until the source loop copies records, each test mirrors by hand: it writes the same records
//! to the source topic and to its remote topic on the target (after `SHIFT` filler records,
//! so target offsets differ from source offsets) and writes the offset syncs itself, with the
//! header that marks them dense. The replicator runs with the source loop disabled.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mirrorflow::kafka::positions::{PositionReader, positions_topic};
use mirrorflow::kafka::refusals::UNREADABLE_MARK;
use mirrorflow::mm2::{Checkpoint, Heartbeat, OffsetSync, TopicPartition};
use mirrorflow_e2e::kafka::commit;
use mirrorflow_e2e::replicator::{Replicator, http_get};
use mirrorflow_e2e::switchover::end_offsets;
use mirrorflow_e2e::{World, eventually, kafka, unique};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

/// (offset, key, value) as `kafka::read_partition` returns them.
type PartitionRecord = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

/// Target offsets are source offsets plus this.
const SHIFT: i64 = 7;
const DENSE_HEADER: &str = "mirrorflow.sync";
/// Checkpoint tests leave the shared `heartbeats` topics alone.
const NO_HEARTBEATS: &str = "heartbeats: {enabled: false}\n";
const GROUP_SYNC: &str = "heartbeats: {enabled: false}\ncheckpoints: {syncGroupOffsets: true}\n";

/// One test's names and clients: a fresh source alias, target alias and topic.
struct Mirror {
    world: World,
    name: String,
    source_alias: String,
    target_alias: String,
    topic: String,
    remote: String,
    partitions: i32,
    source: FutureProducer,
    target: FutureProducer,
}

impl Mirror {
    async fn new(prefix: &str, partitions: i32) -> Result<Mirror> {
        let world = World::from_env()?;
        let name = unique(prefix);
        let source_alias = unique("src");
        let target_alias = unique("tgt");
        let topic = unique("orders");
        let remote = format!("{source_alias}.{topic}");
        kafka::create_topic(&world.source_bootstrap, &topic, partitions).await?;
        kafka::create_topic(&world.target_bootstrap, &remote, partitions).await?;
        let syncs = format!("mm2-offset-syncs.{target_alias}.internal");
        kafka::create_topic(&world.source_bootstrap, &syncs, 1).await?;
        let source = kafka::producer(&world.source_bootstrap, Duration::from_secs(30))?;
        let target = kafka::producer(&world.target_bootstrap, Duration::from_secs(30))?;
        let m = Mirror {
            world,
            name,
            source_alias,
            target_alias,
            topic,
            remote,
            partitions,
            source,
            target,
        };
        for p in 0..partitions {
            for i in 0..SHIFT {
                send(&m.target, &m.remote, p, &format!("filler-{i}"), None).await?;
            }
        }
        Ok(m)
    }

    /// The flow; `extra` holds more spec fields, one per line, unindented.
    fn flow_yaml(&self, extra: &str) -> String {
        let extra: String = extra.lines().map(|l| format!("  {l}\n")).collect();
        format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: e2e}}\nspec:\n  source: {{alias: {s}, bootstrapServers: '{sb}'}}\n  target: {{alias: {t}, bootstrapServers: '{tb}'}}\n  sourceLoop: {{enabled: false}}\n{extra}",
            name = self.name,
            s = self.source_alias,
            t = self.target_alias,
            sb = self.world.source_bootstrap,
            tb = self.world.target_bootstrap,
        )
    }

    fn checkpoints_topic(&self) -> String {
        format!("{}.checkpoints.internal", self.source_alias)
    }

    /// Starts a replicator for this flow and waits until it is ready.
    /// Waits (30 s) until the flow's refusal record names `topic` as holding a batch the
    /// replicator cannot read (`held`; its message returned), or no longer does.
    async fn unreadable_recorded(&self, topic: &str, held: bool) -> Result<String> {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", &self.world.target_bootstrap);
        let mut reader = PositionReader::new(
            &client,
            positions_topic(&self.source_alias),
            &unique("holds"),
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            reader.read_to_end(Duration::from_secs(10))?;
            let found = reader
                .refusals()
                .values()
                .find(|r| r.topic == topic && r.message.contains(UNREADABLE_MARK))
                .map(|r| r.message.clone());
            match (found, held) {
                (Some(message), true) => return Ok(message),
                (None, false) => return Ok(String::new()),
                (found, _) if Instant::now() >= deadline => {
                    bail!(
                        "after 30 s the refusal record holds {found:?} for {topic} (want held: {held})"
                    )
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    async fn start(&self, extra: &str) -> Result<Replicator> {
        let port = free_port()?;
        let r = Replicator::start(
            &self.world.repo_root,
            &format!("{}-{port}", self.name),
            &self.flow_yaml(extra),
            port,
        )?;
        r.wait_ready().await?;
        Ok(r)
    }

    /// "Mirrors" `count` more records of partition `p`: appends them to both sides and writes
    /// a dense sync for the first and the last. Returns the source offsets written.
    async fn mirror(&self, p: i32, count: i64) -> Result<std::ops::Range<i64>> {
        let mut first = None;
        let mut last = 0;
        for _ in 0..count {
            let value = unique("rec");
            let up = send(&self.source, &self.topic, p, &value, None).await?;
            let down = send(&self.target, &self.remote, p, &value, None).await?;
            ensure!(down == up + SHIFT, "target offset {down} for source {up}");
            first.get_or_insert(up);
            last = up;
        }
        let first = first.context("mirror at least one record")?;
        for up in [first, last] {
            self.sync(p, up, up + SHIFT, true).await?;
        }
        Ok(first..last + 1)
    }

    async fn sync(&self, p: i32, up: i64, down: i64, dense: bool) -> Result<()> {
        let rec = OffsetSync::new(TopicPartition::new(&self.topic, p), up, down).encode()?;
        let syncs = format!("mm2-offset-syncs.{}.internal", self.target_alias);
        let mut record = FutureRecord::to(&syncs)
            .partition(0)
            .key(&rec.key)
            .payload(&rec.value);
        if dense {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: DENSE_HEADER,
                value: Some("dense"),
            }));
        }
        self.source
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)?;
        Ok(())
    }

    /// Checkpoints of `group` in the checkpoints topic, in order.
    fn checkpoints(&self, group: &str) -> Result<Vec<Checkpoint>> {
        let topic = self.checkpoints_topic();
        if !kafka::topics(&self.world.target_bootstrap)?.contains(&topic) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        // A checkpoint stated again with its verification on the records is no new checkpoint.
        let records = kafka::read_partition_with_header(
            &self.world.target_bootstrap,
            &topic,
            0,
            mirrorflow::verify::header::VERIFICATION_HEADER,
        )?;
        for ((_, key, value), _) in records.into_iter().filter(|(_, v)| v.is_none()) {
            let (Some(k), Some(v)) = (key, value) else {
                bail!("a null key or value in {topic}");
            };
            let cp = Checkpoint::decode(&k, &v).context("decoding a checkpoint")?;
            if cp.group == group {
                out.push(cp);
            }
        }
        Ok(out)
    }

    /// Waits for the exact checkpoint of `group` on partition 0 at upstream offset `up` (its
    /// downstream offset `up` + [`SHIFT`], which only a sync written for it gives).
    async fn wait_exact_checkpoint(&self, group: &str, up: i64, r: &Replicator) -> Result<()> {
        let exact = up + SHIFT;
        eventually(
            &format!("checkpoint {group} p0 up {up} down {exact}"),
            Duration::from_secs(30),
            || async {
                Ok(self
                    .checkpoints(group)?
                    .into_iter()
                    .find(|c| c.upstream_offset == up && c.downstream_offset == exact)
                    .map(|_| ()))
            },
        )
        .await
        .with_context(|| {
            format!(
                "checkpoints: {:?}\n{}",
                self.checkpoints(group),
                r.log_text()
            )
        })
    }

    /// Waits for a checkpoint of `group` on `partition` with this upstream offset.
    async fn wait_checkpoint(&self, group: &str, partition: i32, up: i64) -> Result<Checkpoint> {
        eventually(
            &format!("checkpoint {group} p{partition} up {up}"),
            Duration::from_secs(30),
            || async {
                Ok(self
                    .checkpoints(group)?
                    .into_iter()
                    .rev()
                    .find(|c| c.topic_partition.partition == partition && c.upstream_offset == up))
            },
        )
        .await
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Sends one record and returns its offset.
async fn send(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    value: &str,
    key: Option<&[u8]>,
) -> Result<i64> {
    let mut record = FutureRecord::to(topic).partition(partition).payload(value);
    if let Some(key) = key {
        record = record.key(key);
    }
    let delivery = producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)?;
    Ok(delivery.offset)
}

/// Committed offsets of `group` on `topic`'s partitions.
fn committed(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<BTreeMap<i32, i64>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let list = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(list
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// Value of a metric sample whose name and labels start with `prefix`.
/// Waits until the checkpoint loop counted an error of `kind`.
async fn wait_counted(r: &Replicator, kind: &str) -> Result<()> {
    let sample = format!(r#"mirrorflow_errors_total{{kind="{kind}",loop="checkpoint"}}"#);
    eventually(
        &format!("{kind} counted"),
        Duration::from_secs(30),
        || async { Ok(metric_sample(r, &sample).filter(|n| *n >= 1.0).map(|_| ())) },
    )
    .await
    .with_context(|| r.log_text())
}

fn metric_sample(r: &Replicator, prefix: &str) -> Option<f64> {
    let body = http_get(&r.metrics_addr, "/metrics").ok()?;
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn every_committed_partition_is_checkpointed_exactly_and_kafka_decodes_it() -> Result<()> {
    let m = Mirror::new("cp-all", 3).await?;
    let r = m.start(NO_HEARTBEATS).await?;
    let group = unique("app");
    let mut commits = Vec::new();
    for p in 0..m.partitions {
        let range = m.mirror(p, 10).await?;
        // Mid-run on 0 and 1 (inside a dense run), at the end (next record not yet written) on 2.
        let c = if p == 2 {
            range.end
        } else {
            range.start + 3 + i64::from(p)
        };
        commits.push((p, c));
    }
    commit(&m.world.source_bootstrap, &group, &m.topic, &commits)?;
    for &(p, c) in &commits {
        let cp = m
            .wait_checkpoint(&group, p, c)
            .await
            .with_context(|| r.log_text())?;
        assert_eq!(
            cp.topic_partition.topic, m.remote,
            "the TARGET-side topic name"
        );
        // Exact: the target position of the record the group reads next, found on the target.
        assert_eq!(cp.downstream_offset, c + SHIFT, "{cp:?}");
        if p != 2 {
            let source = kafka::read_partition(&m.world.source_bootstrap, &m.topic, p)?;
            let target = kafka::read_partition(&m.world.target_bootstrap, &m.remote, p)?;
            let next_source = source.iter().find(|(o, _, _)| *o == c).map(|r| &r.2);
            let next_target = target
                .iter()
                .find(|(o, _, _)| *o == cp.downstream_offset)
                .map(|r| &r.2);
            assert_eq!(
                next_source, next_target,
                "same record at the translated offset"
            );
        }
    }
    assert!(
        r.metric("mirrorflow_checkpoints_emitted_total")
            .unwrap_or(0.0)
            >= 3.0
    );

    // MirrorMaker 2's own formatter reads the same records.
    let kafka_home = std::env::var("KAFKA_HOME").context("KAFKA_HOME")?;
    let out = std::process::Command::new("java")
        .args([
            "-cp",
            &format!("{kafka_home}/lib/*"),
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            "--bootstrap-server",
            &m.world.target_bootstrap,
            "--topic",
            &m.checkpoints_topic(),
            "--from-beginning",
            "--max-messages",
            "3",
            "--timeout-ms",
            "30000",
            "--formatter",
            "org.apache.kafka.connect.mirror.formatters.CheckpointFormatter",
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    println!("CheckpointFormatter output:\n{text}");
    for &(p, c) in &commits {
        let expected = format!(
            "topicPartition={}-{p}, upstreamOffset={c}, downstreamOffset={}",
            m.remote,
            c + SHIFT
        );
        assert!(
            text.contains(&expected) && text.contains(&group),
            "missing `{expected}` in the formatter's output:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_new_commit_is_checkpointed_within_two_seconds() -> Result<()> {
    let m = Mirror::new("cp-fresh", 1).await?;
    let r = m.start(NO_HEARTBEATS).await?;
    let group = unique("app");
    // A watcher on the checkpoints topic sees each checkpoint as it lands.
    let (tx, rx) = mpsc::channel::<(Checkpoint, Instant)>();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &m.world.target_bootstrap)
        .set("group.id", "mirrorflow-e2e-watcher")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "20")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&m.checkpoints_topic(), 0, Offset::End)?;
    consumer.assign(&tpl)?;
    let watched_group = group.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_watch = stop.clone();
    let watcher = std::thread::spawn(move || {
        while !stop_watch.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(Ok(msg)) = consumer.poll(Duration::from_millis(50))
                && let (Some(k), Some(v)) = (msg.key(), msg.payload())
                && let Ok(cp) = Checkpoint::decode(k, v)
                && cp.group == watched_group
            {
                let _ = tx.send((cp, Instant::now()));
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await; // the watcher's assignment settles

    let mut latencies = Vec::new();
    for round in 0..5 {
        let range = m.mirror(0, 5).await?;
        let committed_at = Instant::now();
        commit(
            &m.world.source_bootstrap,
            &group,
            &m.topic,
            &[(0, range.end)],
        )?;
        let deadline = committed_at + Duration::from_secs(10);
        let arrived = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((cp, at)) if cp.upstream_offset == range.end => break at,
                Ok(_) => continue,
                Err(_) => bail!(
                    "round {round}: no checkpoint for {} within 10s\n{}",
                    range.end,
                    r.log_text()
                ),
            }
        };
        latencies.push(arrived.duration_since(committed_at));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = watcher.join();
    println!("commit -> checkpoint latencies: {latencies:?}");
    let worst = latencies.iter().max().copied().unwrap_or_default();
    assert!(
        worst < Duration::from_secs(2),
        "slowest commit -> checkpoint {worst:?}"
    );
    assert!(metric_sample(&r, "mirrorflow_checkpoint_latency_seconds_count").unwrap_or(0.0) >= 5.0);
    Ok(())
}

#[tokio::test]
async fn checkpoints_stay_monotonic_across_a_restart_and_a_rewind_emits_a_new_one() -> Result<()> {
    let m = Mirror::new("cp-restart", 1).await?;
    let mut r = m.start(NO_HEARTBEATS).await?;
    let group = unique("app");
    let range = m.mirror(0, 20).await?;
    commit(&m.world.source_bootstrap, &group, &m.topic, &[(0, 15)])?;
    m.wait_checkpoint(&group, 0, 15).await?;
    r.stop(Duration::from_secs(10));
    let before = m.checkpoints(&group)?.len();

    // Restarted, it re-reads everything and has nothing new to say: once it has evaluated the
    // group (its checkpoint age is published only after checkpoints, syncs and group offsets
    // are loaded), nothing was written for it.
    let r2 = m.start(NO_HEARTBEATS).await?;
    let evaluated = format!("mirrorflow_group_checkpoint_age_seconds{{group=\"{group}\"}}");
    eventually(
        "the restarted loop evaluates the group",
        Duration::from_secs(30),
        || async { Ok(r2.metric(&evaluated)) },
    )
    .await
    .with_context(|| r2.log_text())?;
    assert_eq!(
        m.checkpoints(&group)?.len(),
        before,
        "no repeated checkpoint after a restart\n{}",
        r2.log_text()
    );
    assert_eq!(r2.metric("mirrorflow_checkpoints_emitted_total"), Some(0.0));

    // Rewind: a new, lower checkpoint is due (MM2's rule).
    commit(
        &m.world.source_bootstrap,
        &group,
        &m.topic,
        &[(0, range.start + 2)],
    )?;
    let rewound = m.wait_checkpoint(&group, 0, range.start + 2).await?;
    // Syncs read at start-up are not trusted as consecutive (compaction may have removed
    // some), so inside an older run the translation is MM2's conservative one: never past
    // the true position, at most a record or two before it.
    let exact = range.start + 2 + SHIFT;
    assert!(
        (exact - 1..=exact).contains(&rewound.downstream_offset),
        "{rewound:?}, true position {exact}"
    );
    // Forward again past the old position: checkpointed, and downstream only rose except at
    // the rewind.
    commit(
        &m.world.source_bootstrap,
        &group,
        &m.topic,
        &[(0, range.end)],
    )?;
    m.wait_checkpoint(&group, 0, range.end).await?;
    let all = m.checkpoints(&group)?;
    for pair in all.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            b.downstream_offset > a.downstream_offset || b.upstream_offset < a.upstream_offset,
            "not monotonic: {a:?} then {b:?}"
        );
    }
    Ok(())
}

/// A batch of the offset-syncs topic the replicator cannot read (a gzip bomb: 40 MiB of zeros
/// in a few tens of KB) holds the checkpoint loop's follower there: counted, and recorded for
/// the status with the fix (the status's unit tests show the condition), while the loop goes
/// on with the syncs read before it. Done as the message says (the records deleted up to past
/// the batch), the follower reads on, and a sync written after the batch translates a commit
/// exactly.
#[tokio::test]
async fn an_unreadable_batch_of_offset_syncs_holds_the_follower_until_deleted() -> Result<()> {
    let m = Mirror::new("cp-bomb", 1).await?;
    let r = m.start(NO_HEARTBEATS).await?;
    let group = unique("app");
    let before = m.mirror(0, 5).await?;
    commit(
        &m.world.source_bootstrap,
        &group,
        &m.topic,
        &[(0, before.end)],
    )?;
    m.wait_checkpoint(&group, 0, before.end).await?;
    let syncs = format!("mm2-offset-syncs.{}.internal", m.target_alias);
    let keys: Vec<Vec<u8>> = (0..40).map(|i| format!("bomb-{i}").into_bytes()).collect();
    kafka::produce_bomb(&m.world.source_bootstrap, &syncs, &keys, "gzip").await?;
    let past_bomb = end_offsets(&m.world.source_bootstrap, &syncs, 1)?
        .first()
        .copied()
        .context("the offset-syncs topic's end")?;
    wait_counted(&r, "refused_batch").await?;
    ensure!(
        r.log_text()
            .contains(&format!("{syncs} holds a batch the replicator cannot read")),
        "the hold is not named: {}",
        r.log_text()
    );
    // The source loop does not run here (checkpoints only): the hold reaches the operator
    // through the positions topic's refusal record all the same.
    let held = m.unreadable_recorded(&syncs, true).await?;
    ensure!(
        held.contains("kafka-delete-records"),
        "the record names no fix: {held}"
    );
    // Written after the batch: not read while the follower is held there.
    let after = m.mirror(0, 5).await?;
    commit(
        &m.world.source_bootstrap,
        &group,
        &m.topic,
        &[(0, after.end)],
    )?;
    kafka::delete_records_before(&m.world.source_bootstrap, &syncs, past_bomb).await?;
    m.wait_exact_checkpoint(&group, after.end, &r).await?;
    // Read on past it: the record is taken out.
    m.unreadable_recorded(&syncs, false).await?;
    Ok(())
}

/// The offset-syncs topic deleted and created again under the checkpoint loop: the follower's
/// position lies past the new topic's end, and it reads the new topic from its start (counting
/// the loss) where librdkafka's default would jump to the end and skip the syncs written there
/// first. The commit after the recreation is only exact through those syncs.
#[tokio::test]
async fn a_recreated_offset_syncs_topic_is_followed_from_its_start() -> Result<()> {
    let m = Mirror::new("cp-resync", 1).await?;
    let r = m.start(NO_HEARTBEATS).await?;
    let group = unique("app");
    let mut end = 0;
    // Eight syncs: the follower's position ends up well past the recreated topic's end.
    for _ in 0..4 {
        end = m.mirror(0, 5).await?.end;
    }
    commit(&m.world.source_bootstrap, &group, &m.topic, &[(0, end)])?;
    m.wait_checkpoint(&group, 0, end).await?;
    let syncs = format!("mm2-offset-syncs.{}.internal", m.target_alias);
    kafka::delete_topic(&m.world.source_bootstrap, &syncs).await?;
    kafka::create_topic(&m.world.source_bootstrap, &syncs, 1).await?;
    // Written at once, before the follower's next fetch finds its position gone.
    let range = m.mirror(0, 5).await?;
    commit(
        &m.world.source_bootstrap,
        &group,
        &m.topic,
        &[(0, range.end)],
    )?;
    // Until the follower's next fetch finds its position gone, the commit may be translated
    // by the old topic's syncs, which still hold (the records they describe are there): a
    // conservative checkpoint one past the last old sync. The exact one must follow, and it
    // can only come from the recreated topic's syncs.
    m.wait_exact_checkpoint(&group, range.end, &r).await?;
    for cp in m.checkpoints(&group)? {
        assert!(
            cp.downstream_offset <= cp.upstream_offset + SHIFT,
            "a checkpoint past the records its group consumed: {cp:?}"
        );
    }
    wait_counted(&r, "position_lost").await?;
    Ok(())
}

#[tokio::test]
async fn no_checkpoint_for_offsets_no_sync_covers() -> Result<()> {
    let m = Mirror::new("cp-uncovered", 2).await?;
    let r = m.start(GROUP_SYNC).await?;
    // Partition 1 gets records on both sides but no sync: nothing says where they are.
    for i in 0..5 {
        send(&m.source, &m.topic, 1, &format!("v{i}"), None).await?;
        send(&m.target, &m.remote, 1, &format!("v{i}"), None).await?;
    }
    let lonely = unique("lonely");
    commit(&m.world.source_bootstrap, &lonely, &m.topic, &[(1, 3)])?;
    // Meanwhile a covered group on partition 0 proves the loop is working.
    let range = m.mirror(0, 5).await?;
    let covered = unique("covered");
    commit(
        &m.world.source_bootstrap,
        &covered,
        &m.topic,
        &[(0, range.end)],
    )?;
    m.wait_checkpoint(&covered, 0, range.end).await?;
    // The loop's own word that it evaluated the lonely commit and found nothing to translate
    // it by: only after it is there does "no checkpoint" mean the loop declined one.
    eventually(
        "NoOffsetSyncCovers logged",
        Duration::from_secs(20),
        || async {
            Ok(r.log_text()
                .lines()
                .any(|l| l.contains(&lonely) && l.contains("NoOffsetSyncCovers"))
                .then_some(()))
        },
    )
    .await
    .with_context(|| r.log_text())?;
    assert!(
        m.checkpoints(&lonely)?.is_empty(),
        "a checkpoint without a covering sync"
    );
    Ok(())
}

#[tokio::test]
async fn group_offsets_sync_into_idle_target_groups_only() -> Result<()> {
    let m = Mirror::new("cp-groupsync", 1).await?;
    let r = m.start(GROUP_SYNC).await?;
    let range = m.mirror(0, 10).await?;
    let idle = unique("idle");
    let active = unique("active");

    // A live consumer of `active` on the target: its offsets are its own.
    let member: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &m.world.target_bootstrap)
        .set("group.id", &active)
        .set("enable.auto.commit", "false")
        .create()?;
    member.subscribe(&[&m.remote])?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_member = stop.clone();
    let member_thread = std::thread::spawn(move || {
        while !stop_member.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = member.poll(Duration::from_millis(100));
        }
    });
    eventually(
        "the active group is Stable on the target",
        Duration::from_secs(30),
        || async {
            let admin: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &m.world.target_bootstrap)
                .create()?;
            let list = admin.fetch_group_list(Some(&active), Duration::from_secs(5))?;
            Ok(list
                .groups()
                .first()
                .filter(|g| g.state() == "Stable")
                .map(|_| ()))
        },
    )
    .await?;

    commit(
        &m.world.source_bootstrap,
        &idle,
        &m.topic,
        &[(0, range.start + 4)],
    )?;
    commit(
        &m.world.source_bootstrap,
        &active,
        &m.topic,
        &[(0, range.start + 6)],
    )?;
    m.wait_checkpoint(&idle, 0, range.start + 4).await?;
    m.wait_checkpoint(&active, 0, range.start + 6).await?;

    let synced = eventually(
        "idle group synced on the target",
        Duration::from_secs(30),
        || async {
            let c = committed(&m.world.target_bootstrap, &idle, &m.remote, 1)?;
            Ok(c.get(&0).copied())
        },
    )
    .await
    .with_context(|| r.log_text())?;
    assert_eq!(synced, range.start + 4 + SHIFT);
    eventually("ActiveOnTarget logged", Duration::from_secs(30), || async {
        Ok(r.log_text()
            .lines()
            .any(|l| l.contains(&active) && l.contains("ActiveOnTarget"))
            .then_some(()))
    })
    .await
    .with_context(|| r.log_text())?;
    assert!(
        committed(&m.world.target_bootstrap, &active, &m.remote, 1)?.is_empty(),
        "an active target group's offsets were written"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = member_thread.join();

    // Never backwards: the idle group moved ahead on the target keeps its offset.
    commit(
        &m.world.target_bootstrap,
        &idle,
        &m.remote,
        &[(0, range.end + SHIFT)],
    )?;
    commit(
        &m.world.source_bootstrap,
        &idle,
        &m.topic,
        &[(0, range.start + 5)],
    )?;
    m.wait_checkpoint(&idle, 0, range.start + 5).await?;
    eventually("TargetAhead logged", Duration::from_secs(30), || async {
        Ok(r.log_text()
            .lines()
            .any(|l| l.contains(&idle) && l.contains("TargetAhead"))
            .then_some(()))
    })
    .await
    .with_context(|| r.log_text())?;
    assert_eq!(
        committed(&m.world.target_bootstrap, &idle, &m.remote, 1)?.get(&0),
        Some(&(range.end + SHIFT))
    );
    Ok(())
}

#[tokio::test]
async fn heartbeats_go_to_both_clusters_and_replicated_ones_give_the_lag() -> Result<()> {
    let m = Mirror::new("hb", 1).await?;
    let r = m.start("checkpoints: {enabled: false}\n").await?;
    let is = |records: &[PartitionRecord], src: &str, tgt: &str| {
        records.iter().any(|(_, k, v)| {
            k.as_deref()
                .zip(v.as_deref())
                .and_then(|(k, v)| Heartbeat::decode(k, v).ok())
                .is_some_and(|hb| hb.source_alias == src && hb.target_alias == tgt)
        })
    };
    eventually(
        "heartbeats on both clusters",
        Duration::from_secs(20),
        || async {
            let target = kafka::read_partition(&m.world.target_bootstrap, "heartbeats", 0)?;
            let source = kafka::read_partition(&m.world.source_bootstrap, "heartbeats", 0)?;
            Ok((is(&target, &m.source_alias, &m.target_alias)
                && is(&source, &m.target_alias, &m.source_alias))
            .then_some(()))
        },
    )
    .await
    .with_context(|| r.log_text())?;
    assert!(
        r.metric("mirrorflow_heartbeats_emitted_total")
            .unwrap_or(0.0)
            >= 2.0
    );

    // Replicate the source's heartbeats as `<source>.heartbeats` by hand (the source loop's
    // job), one second late: the lag metric must follow.
    let remote = format!("{}.heartbeats", m.source_alias);
    kafka::create_topic(&m.world.target_bootstrap, &remote, 1).await?;
    for _ in 0..6 {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        let hb = Heartbeat {
            source_alias: m.target_alias.clone(),
            target_alias: m.source_alias.clone(),
            timestamp_ms: now_ms - 1000,
        }
        .encode()?;
        m.target
            .send(
                FutureRecord::to(&remote)
                    .partition(0)
                    .key(&hb.key)
                    .payload(&hb.value),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let lag = r.metric("mirrorflow_heartbeat_lag_seconds").unwrap_or(-1.0);
    assert!((0.9..3.0).contains(&lag), "heartbeat lag {lag}");
    Ok(())
}

/// With the real source loop: records copied by it, its dense syncs translated exactly, and
/// the replicated heartbeats giving a lag of a few seconds at most.
#[tokio::test]
async fn end_to_end_with_the_source_loop() -> Result<()> {
    let world = World::from_env()?;
    let name = unique("cp-e2e");
    let (source_alias, target_alias) = (unique("src"), unique("tgt"));
    let topic = unique("orders");
    let remote = format!("{source_alias}.{topic}");
    kafka::create_topic(&world.source_bootstrap, &topic, 2).await?;
    // Filler on the target so target offsets differ from source offsets.
    kafka::create_topic(&world.target_bootstrap, &remote, 2).await?;
    let source = kafka::producer(&world.source_bootstrap, Duration::from_secs(30))?;
    let target = kafka::producer(&world.target_bootstrap, Duration::from_secs(30))?;
    for p in 0..2 {
        for i in 0..SHIFT {
            send(&target, &remote, p, &format!("filler-{i}"), None).await?;
        }
        for i in 0..30 {
            send(&source, &topic, p, &format!("{p}-{i}"), None).await?;
        }
    }
    let yaml = format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: e2e}}\nspec:\n  source: {{alias: {source_alias}, bootstrapServers: '{}'}}\n  target: {{alias: {target_alias}, bootstrapServers: '{}'}}\n  topics: ['{topic}']\n",
        world.source_bootstrap, world.target_bootstrap
    );
    let port = free_port()?;
    let r = Replicator::start(&world.repo_root, &format!("{name}-{port}"), &yaml, port)?;
    r.wait_ready().await?;
    eventually("records copied", Duration::from_secs(60), || async {
        let copied = (0..2)
            .map(|p| kafka::read_partition(&world.target_bootstrap, &remote, p).map(|v| v.len()))
            .collect::<Result<Vec<_>>>()?;
        Ok(copied.iter().all(|n| *n as i64 == SHIFT + 30).then_some(()))
    })
    .await
    .with_context(|| r.log_text())?;

    let group = unique("app");
    commit(&world.source_bootstrap, &group, &topic, &[(0, 12), (1, 30)])?;
    let checkpoints_topic = format!("{source_alias}.checkpoints.internal");
    let find = |p: i32, c: i64, exact: bool| {
        let (world, group, topic, remote) = (&world, &group, &checkpoints_topic, &remote);
        eventually("checkpoint", Duration::from_secs(30), move || async move {
            // The true position: where the source record at `c` landed on the target.
            let truth = kafka::read_partition(&world.target_bootstrap, remote, p)?
                .iter()
                .find(|(_, _, v)| v.as_deref() == Some(format!("{p}-{c}").as_bytes()))
                .map(|(o, _, _)| *o);
            let all = kafka::read_partition(&world.target_bootstrap, topic, 0)?;
            Ok(all.into_iter().rev().find_map(|(_, k, v)| {
                let cp = Checkpoint::decode(k.as_deref()?, v.as_deref()?).ok()?;
                let wanted = cp.group == *group
                    && cp.topic_partition.partition == p
                    && cp.upstream_offset == c
                    && (!exact || Some(cp.downstream_offset) == truth);
                wanted.then_some((cp, truth))
            }))
        })
    };
    for (p, c) in [(0, 12), (1, 30)] {
        let (cp, truth) = find(p, c, false).await.with_context(|| r.log_text())?;
        assert_eq!(cp.topic_partition.topic, remote);
        // Past the newest sync the writer made, translation is MM2's conservative one: at or
        // before the true position (the end, SHIFT + 30, when the record does not exist yet).
        let truth = truth.unwrap_or(SHIFT + 30);
        assert!(cp.downstream_offset <= truth, "{cp:?} is past {truth}");
        println!("before the next sync: {cp:?}, true position {truth}");
    }
    // One more record per partition after the sync interval (1s) makes the source loop write
    // a periodic sync; the checkpoints then become exact without any new commit.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for p in 0..2 {
        send(&source, &topic, p, &format!("{p}-30"), None).await?;
    }
    for (p, c) in [(0, 12), (1, 30)] {
        let (cp, truth) = find(p, c, true).await.with_context(|| r.log_text())?;
        println!("after it: {cp:?}, true position {truth:?}");
    }

    let lag = eventually(
        "heartbeat lag measured",
        Duration::from_secs(60),
        || async {
            Ok(r.metric("mirrorflow_heartbeat_lag_seconds")
                .filter(|l| *l > 0.0))
        },
    )
    .await
    .with_context(|| r.log_text())?;
    println!("heartbeat lag through the source loop: {lag}s");
    assert!(lag < 5.0, "heartbeat lag {lag}");
    Ok(())
}

/// A burst of records, then silence: the source loop's tail sync (written once the partition
/// has been idle for `offsetSyncInterval`) covers the end of the burst, so a group that
/// consumed into it is checkpointed exactly, without waiting for another record.
#[tokio::test]
async fn an_idle_partitions_tail_is_checkpointed_exactly() -> Result<()> {
    let world = World::from_env()?;
    let name = unique("cp-idle");
    let (source_alias, target_alias) = (unique("src"), unique("tgt"));
    let topic = unique("orders");
    let remote = format!("{source_alias}.{topic}");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    // Filler on the target so target offsets differ from source offsets.
    kafka::create_topic(&world.target_bootstrap, &remote, 1).await?;
    let source = kafka::producer(&world.source_bootstrap, Duration::from_secs(30))?;
    let target = kafka::producer(&world.target_bootstrap, Duration::from_secs(30))?;
    for i in 0..SHIFT {
        send(&target, &remote, 0, &format!("filler-{i}"), None).await?;
    }
    let yaml = format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: e2e}}\nspec:\n  source: {{alias: {source_alias}, bootstrapServers: '{}'}}\n  target: {{alias: {target_alias}, bootstrapServers: '{}'}}\n  topics: ['{topic}']\n  {NO_HEARTBEATS}",
        world.source_bootstrap, world.target_bootstrap
    );
    let port = free_port()?;
    let r = Replicator::start(&world.repo_root, &format!("{name}-{port}"), &yaml, port)?;
    r.wait_ready().await?;

    // 30 records in a burst.
    let payloads: Vec<String> = (0..30).map(|i| format!("idle-{i}")).collect();
    let sends: Vec<_> = payloads
        .iter()
        .map(|payload| {
            source.send(
                FutureRecord::<(), _>::to(&topic)
                    .partition(0)
                    .payload(payload),
                Duration::from_secs(10),
            )
        })
        .collect();
    for sent in sends {
        sent.await.map_err(|(e, _)| e)?;
    }
    eventually("records copied", Duration::from_secs(60), || async {
        let copied = kafka::read_partition(&world.target_bootstrap, &remote, 0)?.len();
        Ok((copied as i64 == SHIFT + 30).then_some(()))
    })
    .await
    .with_context(|| r.log_text())?;
    // Idle for longer than offsetSyncInterval (1s by default).
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The true position of committed offset 25: where source record 25 landed.
    let truth = kafka::read_partition(&world.target_bootstrap, &remote, 0)?
        .iter()
        .find(|(_, _, v)| v.as_deref() == Some(b"idle-25".as_slice()))
        .map(|(o, _, _)| *o)
        .context("source record 25 is not on the target")?;
    let group = unique("app");
    let committed_at = Instant::now();
    commit(&world.source_bootstrap, &group, &topic, &[(0, 25)])?;
    let checkpoints_topic = format!("{source_alias}.checkpoints.internal");
    let cp = eventually(
        "exact checkpoint of the idle tail",
        Duration::from_secs(3),
        || async {
            if !kafka::topics(&world.target_bootstrap)?.contains(&checkpoints_topic) {
                return Ok(None);
            }
            let all = kafka::read_partition(&world.target_bootstrap, &checkpoints_topic, 0)?;
            Ok(all.into_iter().find_map(|(_, k, v)| {
                let cp = Checkpoint::decode(k.as_deref()?, v.as_deref()?).ok()?;
                (cp.group == group && cp.upstream_offset == 25).then_some(cp)
            }))
        },
    )
    .await
    .with_context(|| r.log_text())?;
    let latency = committed_at.elapsed();
    println!("idle tail: {cp:?}, true position {truth}, commit -> checkpoint {latency:?}");
    assert_eq!(cp.topic_partition.topic, remote);
    assert_eq!(
        cp.downstream_offset, truth,
        "the first checkpoint of 25 is exact"
    );
    assert!(latency < Duration::from_secs(3), "{latency:?}");
    Ok(())
}
