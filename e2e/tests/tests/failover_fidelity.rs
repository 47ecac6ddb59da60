//! Failover fidelity, ours against the real MirrorMaker 2, on the same data at the same moment.
//!
//! One source cluster, one target cluster of this test's own (it stops its source broker, so it
//! never uses the shared world's clusters; `e2e/world.sh` with its own `MF_STATE` and ports).
//! Our replicator (aliases a -> b) and a MirrorMaker 2 in dedicated mode (aliases m -> n)
//! replicate the same source topics: a plain one, one written by a transactional producer with
//! aborted transactions, and a compacted one compacted before replication starts. Consumer
//! groups read random amounts and commit while both replicate; then the source broker stops.
//! Each replicator's checkpoints are failed over (`mirrorflow failover --all-groups --apply`,
//! on ours and on MirrorMaker's checkpoints, the latter checked against RemoteClusterUtils)
//! and each group restarts on the target on each replicator's copy. Per group it
//! counts records skipped (expected next on the source, never delivered on the target),
//! re-read (consumed on the source before the failover, delivered again) and aborted records
//! delivered, and prints both tables. Ours must skip nothing and, since every commit was
//! checkpointed before the stop, re-read nothing. MirrorMaker's numbers are reported, not
//! asserted. A group that committed before the first record surviving compaction gets no
//! checkpoint from either (no offset sync precedes that record); it restarts at its
//! `auto.offset.reset` (earliest here), shown as a partition without a target commit.
//!
//! `FIDELITY_SEED` repeats a run's random choices (the seed is printed).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mirrorflow_e2e::mm2::{self, MirrorMaker};
use mirrorflow_e2e::replicator::{Replicator, binary, http_get};
use mirrorflow_e2e::{eventually, kafka, unique};
use rdkafka::admin::{AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const WAIT: Duration = Duration::from_secs(90);

/// A Kafka pair of this test's own; `e2e/world.sh down` on drop, also after a failure.
struct PrivateWorld {
    repo_root: PathBuf,
    env: Vec<(String, String)>,
    source: String,
    target: String,
}

impl PrivateWorld {
    /// The test's own world; no broker runs yet (see `start_brokers`).
    fn new(repo_root: &Path) -> Result<PrivateWorld> {
        let state = std::env::temp_dir().join(unique("mirrorflow-fidelity"));
        // Each broker takes PORT (clients), PORT+1 (controller) and PORT+2 (SASL_SSL clients);
        // 19392 and 19492 belong to the benchmark and the chaos test.
        let port = [19292_u16, 19692, 19792, 19892]
            .into_iter()
            .find(|p| {
                [0, 1, 2, 10_000, 10_001, 10_002]
                    .iter()
                    .all(|d| std::net::TcpListener::bind(("127.0.0.1", p + d)).is_ok())
            })
            .context("no free ports for the test's own Kafka clusters")?;
        let world = PrivateWorld {
            repo_root: repo_root.to_path_buf(),
            env: vec![
                ("MF_STATE".into(), state.display().to_string()),
                ("KAFKA_SOURCE_PORT".into(), port.to_string()),
                ("KAFKA_TARGET_PORT".into(), (port + 10_000).to_string()),
            ],
            source: format!("127.0.0.1:{port}"),
            target: format!("127.0.0.1:{}", port + 10_000),
        };
        Ok(world)
    }

    /// Starts both brokers, overlapping: the target's start begins once the source's has made
    /// the world's shared TLS material (two starts making it at once would race), or once the
    /// source is up with a kafka.sh that makes none.
    fn start_brokers(&self) -> Result<(Starting, Starting)> {
        let mut source = self.start_broker("source")?;
        let tls = PathBuf::from(&self.env[0].1).join("kafka/tls/broker.p12");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !tls.exists() && !source.exited()? && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok((source, self.start_broker("target")?))
    }

    fn start_broker(&self, cluster: &'static str) -> Result<Starting> {
        let bootstrap = if cluster == "source" {
            &self.source
        } else {
            &self.target
        };
        Ok(Starting(
            cluster,
            Some(
                self.command(&["kafka", "start", cluster])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .with_context(|| format!("starting kafka {cluster}"))?,
            ),
            bootstrap.clone(),
        ))
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.repo_root.join("e2e/world.sh"));
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd
    }

    fn world_sh(&self, args: &[&str]) -> Result<()> {
        let out = self.command(args).output()?;
        ensure!(
            out.status.success(),
            "world.sh {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Drop for PrivateWorld {
    fn drop(&mut self) {
        if let Err(e) = self.world_sh(&["down"]) {
            eprintln!("tearing down the test's own Kafka clusters: {e:#}");
        }
    }
}

/// A broker start under way. Waited for when dropped, so that a failure meanwhile never tears
/// the world down under a start that then leaves a broker behind.
struct Starting(&'static str, Option<std::process::Child>, String);

impl Starting {
    fn exited(&mut self) -> Result<bool> {
        match self.1.as_mut() {
            Some(child) => Ok(child.try_wait()?.is_some()),
            None => Ok(true),
        }
    }

    fn wait(mut self) -> Result<()> {
        let child = self.1.take().context("already waited")?;
        let out = child.wait_with_output()?;
        if out.status.success() {
            return Ok(());
        }
        // world.sh gives a broker 90 s and then leaves it running; on a machine this loaded
        // (four engineers' builds and tests on two cores) it may still come up.
        let deadline = Instant::now() + Duration::from_secs(150);
        while Instant::now() < deadline {
            if kafka::topics(&self.2).is_ok() {
                println!("kafka {} started slowly but serves now", self.0);
                return Ok(());
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        bail!(
            "starting kafka {}: {}",
            self.0,
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(mut child) = self.1.take() {
            let _ = child.wait();
        }
    }
}

/// A small deterministic generator (xorshift64*), so a printed seed repeats a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

/// Every record produced, by value: (topic, partition, source offset, visible), and its key.
/// Values are unique, so a record read anywhere names its source position.
#[derive(Default)]
struct Ledger {
    records: HashMap<String, (String, i32, i64, bool)>,
    keys: HashMap<String, String>,
}

impl Ledger {
    async fn send(
        &mut self,
        producer: &FutureProducer,
        topic: &str,
        partition: i32,
        key: &str,
        value: String,
    ) -> Result<()> {
        let delivery = producer
            .send(
                FutureRecord::to(topic)
                    .partition(partition)
                    .key(key)
                    .payload(&value),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
        self.keys.insert(value.clone(), key.to_string());
        self.records.insert(
            value,
            (topic.to_string(), delivery.partition, delivery.offset, true),
        );
        Ok(())
    }

    /// Of `values`, the last one (by source offset) of each key: what compaction keeps, on
    /// either cluster, whenever it runs. Keys of the plain and transactional topics are
    /// unique, so there it is every value.
    fn latest_per_key<'a>(
        &self,
        values: impl IntoIterator<Item = &'a String>,
    ) -> HashSet<&'a String> {
        let mut last: HashMap<&str, (i64, &'a String)> = HashMap::new();
        for v in values {
            let (Some(key), Some(r)) = (self.keys.get(v), self.records.get(v)) else {
                continue;
            };
            let e = last.entry(key.as_str()).or_insert((r.2, v));
            if r.2 >= e.0 {
                *e = (r.2, v);
            }
        }
        last.into_values().map(|(_, v)| v).collect()
    }

    fn abort(&mut self, values: &[String]) {
        for v in values {
            if let Some(r) = self.records.get_mut(v) {
                r.3 = false;
            }
        }
    }
}

fn reader(bootstrap: &str) -> Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "mirrorflow-e2e-fidelity-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()?)
}

/// Values a `read_committed` consumer reads in one partition from `from` to the end.
fn read_from(bootstrap: &str, topic: &str, partition: i32, from: Offset) -> Result<Vec<String>> {
    let c = reader(bootstrap)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, from)?;
    c.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        ensure!(
            Instant::now() < deadline,
            "reading {topic}-{partition} timed out after {} records",
            out.len()
        );
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                out.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned())
            }
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(out),
            // A connection the broker dropped under load: librdkafka reconnects and fetches
            // on from the same position, so nothing is lost by reading on.
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure))) => {
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
}

/// The group's committed offset on each partition (`None`: no commit).
fn committed(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<Vec<Option<i64>>> {
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
    (0..partitions)
        .map(|p| {
            let e = list
                .find_partition(topic, p)
                .context("partition missing in committed offsets")?;
            Ok(match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
        })
        .collect()
}

/// An application consumer of `group`: resumes at its commits (earliest without one), reads
/// up to `quota[p]` records of each partition and commits after the last one read there.
fn consume(bootstrap: &str, group: &str, topic: &str, quota: &[usize]) -> Result<()> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..quota.len() {
        tpl.add_partition_offset(topic, i32::try_from(p)?, Offset::Stored)?;
    }
    c.assign(&tpl)?;
    let mut read = vec![0_usize; quota.len()];
    let mut last: Vec<Option<i64>> = vec![None; quota.len()];
    let mut done: HashSet<usize> = (0..quota.len()).filter(|p| quota[*p] == 0).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while done.len() < quota.len() && Instant::now() < deadline {
        match c.poll(Duration::from_millis(300)) {
            Some(Ok(m)) => {
                let p = usize::try_from(m.partition())?;
                if done.contains(&p) {
                    continue;
                }
                read[p] += 1;
                last[p] = Some(m.offset());
                if read[p] >= quota[p] {
                    done.insert(p);
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                done.insert(usize::try_from(p)?);
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    let mut commit = TopicPartitionList::new();
    for (p, o) in last.iter().enumerate() {
        if let Some(o) = o {
            commit.add_partition_offset(topic, i32::try_from(p)?, Offset::Offset(o + 1))?;
        }
    }
    if commit.count() > 0 {
        commit_retrying(&c, &commit)?;
    }
    Ok(())
}

async fn create_compacted(bootstrap: &str, topic: &str) -> Result<()> {
    let new = [
        ("cleanup.policy", "compact"),
        ("segment.ms", "100"),
        ("min.cleanable.dirty.ratio", "0.01"),
        ("min.compaction.lag.ms", "0"),
        ("delete.retention.ms", "100"),
    ]
    .iter()
    .fold(
        NewTopic::new(topic, 1, TopicReplication::Fixed(1)),
        |t, (k, v)| t.set(k, v),
    );
    for r in kafka::admin(bootstrap)?
        .create_topics(&[new], &AdminOptions::new())
        .await?
    {
        if let Err((name, code)) = r {
            bail!("creating {name}: {code}");
        }
    }
    Ok(())
}

/// The test's topics on the source: name and partition count.
struct Topics {
    plain: String,
    tx: String,
    compact: String,
}

impl Topics {
    fn all(&self) -> [(&str, i32); 3] {
        [(&self.plain, 3), (&self.tx, 2), (&self.compact, 1)]
    }
}

/// A consumer group by role, and the topic it reads.
struct Group {
    role: &'static str,
    id: String,
    topic: String,
    partitions: i32,
}

/// One replicator's side of the comparison.
struct Side {
    label: &'static str,
    source_alias: String,
    target_alias: String,
    flow_file: PathBuf,
}

impl Side {
    fn remote(&self, topic: &str) -> String {
        format!("{}.{topic}", self.source_alias)
    }
}

/// A group's committed offset on one source partition and the values visible there.
type SourceState = (Option<i64>, Vec<String>);

/// skipped, re-read, aborted records delivered.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Fidelity {
    skipped: usize,
    reread: usize,
    aborted: usize,
    no_commit: usize,
}

fn write_flow(dir: &Path, name: &str, yaml: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    std::fs::write(&path, yaml)?;
    Ok(path)
}

fn run_cli(repo_root: &Path, args: &[&str]) -> Result<(i32, String)> {
    let out = Command::new("timeout")
        .arg("120")
        .arg(binary(repo_root))
        .args(args)
        .output()
        .context("running mirrorflow")?;
    Ok((
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_fidelity_ours_and_mirrormaker() -> Result<()> {
    let repo_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let world = PrivateWorld::new(&repo_root)?;
    let brokers = world.start_brokers()?;
    scenario(&world, &repo_root, brokers).await
    // `world` drops here or on any error above: its brokers stop and its state is deleted.
}

async fn scenario(
    world: &PrivateWorld,
    repo_root: &Path,
    (source_start, target_start): (Starting, Starting),
) -> Result<()> {
    let t0 = Instant::now();
    let phase = |what: &str| println!("[{:>5.1}s] {what}", t0.elapsed().as_secs_f64());
    let (source, target) = (world.source.clone(), world.target.clone());
    source_start.wait()?;
    phase("source cluster up");
    println!("own clusters: source {source}, target {target}");
    let seed = std::env::var("FIDELITY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    println!("FIDELITY_SEED={seed}");
    let mut rng = Rng(seed);
    let p = unique("ff");
    let topics = Topics {
        plain: format!("{p}-plain"),
        tx: format!("{p}-tx"),
        compact: format!("{p}-compact"),
    };
    let groups: Vec<Group> = [
        ("plain-a", &topics.plain, 3),
        ("plain-b", &topics.plain, 3),
        ("tx", &topics.tx, 2),
        ("compact", &topics.compact, 1),
        ("compact-early", &topics.compact, 1),
    ]
    .into_iter()
    .map(|(role, topic, partitions)| Group {
        role,
        id: format!("{p}-g-{role}"),
        topic: topic.clone(),
        partitions,
    })
    .collect();

    // The cleaner looks for work every 15 s by default; a dynamic broker setting makes the
    // compaction before replication quick.
    kafka::admin(&source)?
        .alter_configs(
            &[AlterConfig::new(ResourceSpecifier::Broker(1)).set("log.cleaner.backoff.ms", "500")],
            &AdminOptions::new(),
        )
        .await?;
    kafka::create_topic(&source, &topics.plain, 3).await?;
    kafka::create_topic(&source, &topics.tx, 2).await?;
    create_compacted(&source, &topics.compact).await?;

    let mut ledger = Ledger::default();
    let producer = kafka::producer(&source, Duration::from_secs(30))?;
    // Compacted history before replication: rounds of the same ten keys, one segment each.
    let mut seq = 0_usize;
    for round in 0..4 {
        for k in 0..10 {
            seq += 1;
            ledger
                .send(
                    &producer,
                    &topics.compact,
                    0,
                    &format!("k{k}"),
                    format!("c-{round}-k{k}-{seq}"),
                )
                .await?;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ledger
        .send(&producer, &topics.compact, 0, "roll", "c-roll".into())
        .await?;
    // A group that committed 0 before compaction removed the first records.
    let early = groups
        .iter()
        .find(|g| g.role == "compact-early")
        .context("no early group")?;
    commit_at(&source, &early.id, &topics.compact, 0, 0)?;
    let compacted = eventually(
        "compaction of the source topic",
        Duration::from_secs(60),
        || async {
            let n = read_from(&source, &topics.compact, 0, Offset::Beginning)?.len();
            Ok((n <= 12).then_some(n))
        },
    )
    .await;
    match &compacted {
        Ok(n) => println!("compacted topic: {n} records left of 41 before replication"),
        Err(e) => println!("compacted topic not compacted before replication: {e:#}"),
    }
    phase("compacted history written");
    target_start.wait()?;
    phase("target cluster up");

    // Both replicators on the same source topics and groups.
    let dir = std::env::temp_dir().join("mirrorflow-e2e").join(&p);
    let ours = Side {
        label: "mirrorflow",
        source_alias: unique("fa"),
        target_alias: unique("fb"),
        flow_file: PathBuf::new(),
    };
    let mm = Side {
        label: "MirrorMaker 2",
        source_alias: unique("fm"),
        target_alias: unique("fn"),
        flow_file: PathBuf::new(),
    };
    let flow = |s: &Side, extra: &str| {
        format!(
            "source: {{alias: {}, bootstrapServers: '{source}'}}\n\
             target: {{alias: {}, bootstrapServers: '{target}'}}\n\
             topics: ['{p}-.*']\n\
             groups: ['{p}-g-.*']\n{extra}",
            s.source_alias, s.target_alias
        )
    };
    let ours_yaml = flow(
        &ours,
        "sourceLoop: {topicsRefreshInterval: 1s, offsetSyncInterval: 1s, replicationFactor: 1}\n\
         checkpoints: {groupsRefreshInterval: 1s}\n",
    );
    let ours = Side {
        flow_file: write_flow(&dir, "ours.yaml", &ours_yaml)?,
        ..ours
    };
    let mm = Side {
        flow_file: write_flow(&dir, "mm2.yaml", &flow(&mm, ""))?,
        ..mm
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut replicator = Replicator::start(repo_root, &format!("{p}-ours"), &ours_yaml, port)?;
    let mm_start = {
        let (repo_root, env) = (repo_root.to_path_buf(), world.env.clone());
        let (m, n, src, tgt, p) = (
            mm.source_alias.clone(),
            mm.target_alias.clone(),
            source.clone(),
            target.clone(),
            p.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            MirrorMaker::start(
                &repo_root,
                &env,
                &format!("{p}-mm2"),
                (&m, &src),
                (&n, &tgt),
                &[
                    format!("topics={p}-.*"),
                    format!("groups={p}-g-.*"),
                    // MirrorMaker's default; named here because the comparison depends on it.
                    "offset.lag.max=100".into(),
                ],
            )
        })
    };
    let addr = replicator.metrics_addr.clone();
    eventually("our replicator ready", Duration::from_secs(60), || {
        let addr = addr.clone();
        async move { Ok(http_get(&addr, "/readyz").ok().map(|_| ())) }
    })
    .await
    .with_context(|| replicator.log_text())?;
    let mut mirror_maker = mm_start.await??;
    phase("both replicators replicate");

    // Traffic while both replicate: plain records, transactions (some aborted), keyed updates
    // of the compacted topic; after each burst every group reads a random amount and commits.
    let tx_producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &source)
        .set("transactional.id", unique("ff-txid"))
        .set("acks", "all")
        .create()?;
    tx_producer.init_transactions(Duration::from_secs(30))?;
    for round in 0..4 {
        for part in 0..3 {
            for _ in 0..rng.range(20, 60) {
                seq += 1;
                ledger
                    .send(
                        &producer,
                        &topics.plain,
                        part,
                        &format!("k{seq}"),
                        format!("p-{round}-{seq}"),
                    )
                    .await?;
            }
        }
        for _ in 0..rng.range(2, 4) {
            tx_producer.begin_transaction()?;
            let mut values = Vec::new();
            for _ in 0..rng.range(3, 12) {
                for part in 0..2 {
                    seq += 1;
                    let v = format!("t-{round}-{seq}");
                    ledger
                        .send(
                            &tx_producer,
                            &topics.tx,
                            part,
                            &format!("k{seq}"),
                            v.clone(),
                        )
                        .await?;
                    values.push(v);
                }
            }
            if rng.range(0, 3) == 0 {
                tx_producer.abort_transaction(Duration::from_secs(30))?;
                ledger.abort(&values);
            } else {
                tx_producer.commit_transaction(Duration::from_secs(30))?;
            }
        }
        for _ in 0..rng.range(5, 15) {
            seq += 1;
            let k = rng.range(0, 12);
            ledger
                .send(
                    &producer,
                    &topics.compact,
                    0,
                    &format!("k{k}"),
                    format!("c-{round}-k{k}-{seq}"),
                )
                .await?;
        }
        for g in groups.iter().filter(|g| g.role != "compact-early") {
            let quota: Vec<usize> = (0..g.partitions).map(|_| rng.range(0, 50)).collect();
            consume(&source, &g.id, &g.topic, &quota)?;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    phase("traffic and commits done");
    // Both copies complete (the latest source record of each key on the target: both
    // replicators copy the compacted topic's configs, so the target compacts it on its own
    // schedule, possibly before the source's active segment does), then a few
    // checkpoint intervals of both replicators (ours 500 ms, MirrorMaker's here 1 s).
    for side in [&ours, &mm] {
        for (topic, partitions) in topics.all() {
            for part in 0..partitions {
                eventually(
                    &format!("{} copy of {topic}-{part}", side.label),
                    WAIT,
                    || async {
                        let want = read_from(&source, topic, part, Offset::Beginning)?;
                        let remote = side.remote(topic);
                        if !kafka::topics(&target)?.contains(&remote) {
                            return Ok(None);
                        }
                        let have: HashSet<String> =
                            read_from(&target, &remote, part, Offset::Beginning)?
                                .into_iter()
                                .collect();
                        let latest = ledger.latest_per_key(&want);
                        let missing: Vec<&&String> =
                            latest.iter().filter(|v| !have.contains(**v)).collect();
                        if missing.is_empty() {
                            return Ok(Some(()));
                        }
                        bail!(
                            "{remote}-{part}: {} of {} latest records not there yet, e.g. {:?}",
                            missing.len(),
                            latest.len(),
                            missing.first()
                        )
                    },
                )
                .await
                .with_context(|| {
                    format!("{}\n{}", replicator.log_text(), mirror_maker.log_text())
                })?;
            }
        }
    }
    phase("both copies complete");
    tokio::time::sleep(Duration::from_secs(6)).await;

    // What the groups had consumed and what the source shows, at the moment it goes away.
    let mut truth: BTreeMap<&str, Vec<SourceState>> = BTreeMap::new();
    for g in &groups {
        let commits = committed(&source, &g.id, &g.topic, g.partitions)?;
        let mut per = Vec::new();
        for (part, c) in commits.into_iter().enumerate() {
            per.push((
                c,
                read_from(&source, &g.topic, i32::try_from(part)?, Offset::Beginning)?,
            ));
        }
        truth.insert(g.role, per);
    }
    let stop_at = Instant::now();
    world.world_sh(&["kafka", "stop", "source"])?;
    phase(&format!(
        "source stopped (the stop took {:?})",
        stop_at.elapsed()
    ));
    // The replicators go down with the source region; nothing they do now matters.
    replicator.kill();
    mirror_maker.kill()?;

    // Failover of each replicator's checkpoints, both at once (with the source gone, each
    // command waits out its source connection attempt). RemoteClusterUtils reads MirrorMaker's
    // checkpoints meanwhile: what its users would commit (on ours the interop test shows it
    // equals `mirrorflow translate`).
    let group_ids: Vec<&str> = groups.iter().map(|g| g.id.as_str()).collect();
    let (failovers, rcu) = std::thread::scope(|scope| {
        let runs: Vec<_> = [&ours, &mm]
            .into_iter()
            .map(|side| {
                let flow = side.flow_file.display().to_string();
                scope.spawn(move || {
                    run_cli(
                        repo_root,
                        &["failover", "--flow-file", &flow, "--all-groups", "--apply"],
                    )
                    .map(|r| (side.label, r))
                })
            })
            .collect();
        let rcu = mm2::remote_cluster_utils(repo_root, &target, &mm.source_alias, &group_ids, &[]);
        let failovers = runs
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("failover thread panicked"))?
            })
            .collect::<Result<Vec<_>>>();
        (failovers, rcu)
    });
    let rcu = rcu?;
    println!("{}: RemoteClusterUtils translation:", mm.label);
    for (g, positions) in &rcu {
        let parts: Vec<String> = positions
            .iter()
            .map(|((t, p), (o, _))| format!("{t}-{p}:{o}"))
            .collect();
        println!("  {g}: {}", parts.join(" "));
    }
    for (label, (code, out)) in failovers? {
        println!("{label}: mirrorflow failover --all-groups --apply (exit {code}):\n{out}");
        ensure!(
            code == 0 || code == 3,
            "mirrorflow failover failed ({code}): {out}"
        );
    }
    // Our failover on MirrorMaker's checkpoints commits what RemoteClusterUtils reads.
    for g in &groups {
        let remote = mm.remote(&g.topic);
        let on_target = committed(&target, &g.id, &remote, g.partitions)?;
        for (part, c) in on_target.iter().enumerate() {
            let want = rcu
                .get(&g.id)
                .and_then(|m| m.get(&(remote.clone(), i32::try_from(part).ok()?)))
                .map(|(o, _)| *o);
            ensure!(
                *c == want,
                "{} {remote}-{part}: failover committed {c:?}, RemoteClusterUtils {want:?}",
                g.id
            );
        }
    }

    phase("failovers done");
    // Each group restarts on the target on each copy.
    let mut table: BTreeMap<(&str, &str), Fidelity> = BTreeMap::new();
    for side in [&ours, &mm] {
        for g in &groups {
            let remote = side.remote(&g.topic);
            let on_target = committed(&target, &g.id, &remote, g.partitions)?;
            let mut f = Fidelity::default();
            for (part, (c_src, visible)) in truth[g.role].iter().enumerate() {
                let from = on_target[part];
                if from.is_none() {
                    f.no_commit += 1;
                }
                let delivered = read_from(
                    &target,
                    &remote,
                    i32::try_from(part)?,
                    from.map_or(Offset::Beginning, Offset::Offset),
                )?;
                let c = c_src.unwrap_or(0);
                let delivered_set: HashSet<&String> = delivered.iter().collect();
                // Expected next on the source: visible records at or after the group's commit
                // (of the compacted topic, the latest of each key: an older one may be gone on
                // the target by its own compaction, which no consumer of it can tell apart).
                f.skipped += ledger
                    .latest_per_key(
                        visible
                            .iter()
                            .filter(|v| ledger.records.get(*v).is_some_and(|r| r.2 >= c)),
                    )
                    .into_iter()
                    .filter(|v| !delivered_set.contains(v))
                    .count();
                for v in &delivered {
                    match ledger.records.get(v) {
                        Some((_, _, _, false)) => f.aborted += 1,
                        Some((_, _, o, true)) if *o < c => f.reread += 1,
                        _ => {}
                    }
                }
            }
            table.insert((side.label, g.role), f);
        }
    }

    phase("groups restarted on the target");
    println!("\nfailover fidelity (same source data, commits and stop instant for both):");
    println!(
        "{:<14} {:<8} | {:>12} {:>12} {:>12} | {:>12} {:>12} {:>12}",
        "group",
        "topic",
        "ours skipped",
        "ours re-read",
        "ours aborted",
        "MM2 skipped",
        "MM2 re-read",
        "MM2 aborted"
    );
    let mut ours_skipped = 0;
    for g in &groups {
        let o = table[&(ours.label, g.role)];
        let m = table[&(mm.label, g.role)];
        ours_skipped += o.skipped;
        let topic_kind = g.topic.rsplit('-').next().unwrap_or_default();
        println!(
            "{:<14} {:<8} | {:>12} {:>12} {:>12} | {:>12} {:>12} {:>12}{}",
            g.role,
            topic_kind,
            o.skipped,
            o.reread,
            o.aborted,
            m.skipped,
            m.reread,
            m.aborted,
            if o.no_commit + m.no_commit > 0 {
                format!(
                    "  (partitions without a target commit: ours {}, MM2 {})",
                    o.no_commit, m.no_commit
                )
            } else {
                String::new()
            }
        );
    }
    let total = |label: &str| {
        table
            .iter()
            .filter(|((l, _), _)| *l == label)
            .fold(Fidelity::default(), |a, (_, f)| Fidelity {
                skipped: a.skipped + f.skipped,
                reread: a.reread + f.reread,
                aborted: a.aborted + f.aborted,
                no_commit: a.no_commit + f.no_commit,
            })
    };
    println!(
        "totals: mirrorflow {:?}; MirrorMaker 2 {:?}",
        total(ours.label),
        total(mm.label)
    );
    ensure!(
        ours_skipped == 0,
        "our failover skipped {ours_skipped} records"
    );
    // Exact translation: every commit was checkpointed seconds before the source went away,
    // so nothing is read twice and no aborted record is delivered either.
    let t = total(ours.label);
    ensure!(
        t.reread == 0 && t.aborted == 0,
        "our failover re-read {} and delivered {} aborted records",
        t.reread,
        t.aborted
    );
    Ok(())
}

/// Commits one offset into `group` without joining it.
fn commit_at(bootstrap: &str, group: &str, topic: &str, partition: i32, offset: i64) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    commit_retrying(&consumer, &tpl)
}

/// Commits, retrying for a while: a broker that just started answers
/// `CoordinatorLoadInProgress` until it has loaded its group metadata.
fn commit_retrying(consumer: &BaseConsumer, tpl: &TopicPartitionList) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match consumer.commit(tpl, CommitMode::Sync) {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                eprintln!("commit failed, retrying: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e.into()),
        }
    }
}
