//! Helpers of the failover-fidelity world tests (`replicator_fidelity`, `replicator_aligned`):
//! one test's flow and replicators, reading records and checkpoints back, committing groups,
//! and waiting for the other world test binaries (the tests that stop a broker run alone).

use std::time::{Duration, Instant};

use crate::replicator::{Replicator, http_get};
use crate::{World, eventually, kafka, unique};
use anyhow::{Context, Result, bail, ensure};
use mirrorflow::mm2::Checkpoint;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// A test that stops the target broker (the outage test, the aligned broker restart) holds
/// this exclusively; the other tests of its binary (run beside it on the test threads) use
/// that broker and hold it shared. Each test binary is a process of its own, with its own.
pub static BROKERS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

pub const WAIT: Duration = Duration::from_secs(90);

/// Fast discovery and syncs; heartbeats off (the `heartbeats` topics are shared).
pub const FAST: &str = "sourceLoop: {topicsRefreshInterval: 1s, offsetSyncInterval: 1s}\n\
                    heartbeats: {enabled: false}\n";

/// One test's names: a flow name and fresh aliases for the two clusters.
pub struct Setup {
    pub world: World,
    pub name: String,
    /// Alias of the world's source cluster.
    pub a: String,
    /// Alias of the world's target cluster.
    pub b: String,
}

impl Setup {
    pub fn new(prefix: &str) -> Result<Setup> {
        Ok(Setup {
            world: World::from_env()?,
            name: unique(prefix),
            a: unique("fa"),
            b: unique("fb"),
        })
    }

    /// A flow from the world's source (alias `a`) to its target (alias `b`); `reverse` swaps
    /// the clusters and the aliases (failback).
    pub fn flow(&self, reverse: bool, topics: &[&str], groups: &[&str], extra: &str) -> String {
        let quote = |v: &[&str]| {
            v.iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (sa, sb, ta, tb) = if reverse {
            (
                &self.b,
                &self.world.target_bootstrap,
                &self.a,
                &self.world.source_bootstrap,
            )
        } else {
            (
                &self.a,
                &self.world.source_bootstrap,
                &self.b,
                &self.world.target_bootstrap,
            )
        };
        // No group: a copy-only flow (checkpoints off), since a flow that checkpoints must
        // select some group.
        let groups = if groups.is_empty() {
            "checkpoints: {enabled: false}\n".to_string()
        } else {
            format!("groups: [{}]\n", quote(groups))
        };
        format!(
            "source: {{alias: {sa}, bootstrapServers: '{sb}'}}\n\
             target: {{alias: {ta}, bootstrapServers: '{tb}'}}\n\
             topics: [{}]\n\
             {groups}{FAST}{extra}",
            quote(topics),
        )
    }

    /// Starts a replicator on `flow` and waits until it is ready.
    pub async fn start(&self, replica: &str, flow: &str) -> Result<Replicator> {
        let port = free_port()?;
        let r = Replicator::start(
            &self.world.repo_root,
            &format!("{}-{replica}-{port}", self.name),
            flow,
            port,
        )?;
        r.wait_ready().await?;
        Ok(r)
    }
}

pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One record as a consumer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    pub offset: i64,
    pub key: Option<String>,
    pub value: String,
}

pub fn rec(m: &impl Message) -> Rec {
    Rec {
        offset: m.offset(),
        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
    }
}

pub fn reader(bootstrap: &str) -> Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "mirrorflow-e2e-fidelity-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()?)
}

/// Every record a `read_committed` consumer sees in one partition, up to its end. Ends on the
/// end-of-partition event rather than at the high watermark, which a transaction marker may
/// hold past the last record.
pub fn read_visible(bootstrap: &str, topic: &str, partition: i32) -> Result<Vec<Rec>> {
    let c = reader(bootstrap)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)?;
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
            Some(Ok(m)) => out.push(rec(&m)),
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(out),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
}

/// The first record at or after `offset`, or `None` when the partition ends there.
pub fn first_from(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<Option<Rec>> {
    let c = reader(bootstrap)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    c.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => return Ok(Some(rec(&m))),
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(None),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    bail!("no record nor end of {topic}-{partition} from {offset}")
}

/// Waits until the target copy of a partition holds exactly the source's visible records.
pub async fn wait_copied(
    source: &str,
    topic: &str,
    target: &str,
    remote: &str,
    partition: i32,
) -> Result<Vec<Rec>> {
    eventually(
        &format!("{topic}-{partition} copied to {remote}"),
        WAIT,
        || async {
            let src = read_visible(source, topic, partition)?;
            let dst = read_visible(target, remote, partition)?;
            let same =
                src.len() == dst.len() && src.iter().zip(&dst).all(|(s, d)| s.value == d.value);
            Ok(same.then_some(src))
        },
    )
    .await
}

/// Checkpoints of `group` in `topic` on `bootstrap`, in order.
pub fn checkpoints(bootstrap: &str, topic: &str, group: &str) -> Result<Vec<Checkpoint>> {
    if !kafka::topics(bootstrap)?.contains(topic) {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (_, key, value) in kafka::read_partition(bootstrap, topic, 0)? {
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

/// The latest checkpoint of `group` for one target partition: what a failover reads.
pub fn latest(cps: &[Checkpoint], remote: &str, partition: i32) -> Option<Checkpoint> {
    cps.iter()
        .rev()
        .find(|c| c.topic_partition.topic == remote && c.topic_partition.partition == partition)
        .cloned()
}

/// The committed offset of `group` on one partition, if any.
pub fn committed(bootstrap: &str, group: &str, topic: &str, partition: i32) -> Result<Option<i64>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let list = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(list.elements().first().and_then(|e| match e.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }))
}

/// An application consumer of `group`: resumes at the group's committed offset (earliest
/// without one), reads `n` records with `read_committed`, commits its position the usual way
/// (last record + 1) and returns the records read and the committed offset.
pub fn consume_and_commit(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partition: i32,
    n: usize,
) -> Result<(Vec<Rec>, i64)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Stored)?;
    c.assign(&tpl)?;
    let mut read = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while read.len() < n {
        ensure!(
            Instant::now() < deadline,
            "{group} read only {} of {n} records",
            read.len()
        );
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => read.push(rec(&m)),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    c.commit_consumer_state(CommitMode::Sync)?;
    let offset = committed(bootstrap, group, topic, partition)?.context("nothing committed")?;
    Ok((read, offset))
}

/// Where a failover landed, in source records: `skipped` records the group never read are
/// passed over, `reread` records it had read are delivered again.
#[derive(Debug, Default, Clone, Copy)]
pub struct Landing {
    pub skipped: usize,
    pub reread: usize,
}

/// Compares the first record read on the target (`actual`, `None` at the end) with the one the
/// group reads next on the source (`visible[expected]`; `expected == visible.len()`: none yet).
pub fn landing(visible: &[Rec], expected: usize, actual: Option<&Rec>) -> Result<Landing> {
    let at = match actual {
        None => visible.len(),
        Some(r) => visible
            .iter()
            .position(|v| v.value == r.value)
            .with_context(|| format!("{r:?} on the target is no source record"))?,
    };
    Ok(Landing {
        skipped: at.saturating_sub(expected),
        reread: expected.saturating_sub(at),
    })
}

/// Index of the first visible record at or after offset `c`.
pub fn next_index(visible: &[Rec], c: i64) -> usize {
    visible
        .iter()
        .position(|r| r.offset >= c)
        .unwrap_or(visible.len())
}

/// Waits for the checkpoint of a commit: one with upstream `c` when the translated position
/// moves (MM2's rule writes one), otherwise none new within a few seconds; returns the latest
/// checkpoint of the partition either way.
pub async fn checkpoint_for(
    bootstrap: &str,
    cps_topic: &str,
    group: &str,
    remote: &str,
    partition: i32,
    c: i64,
    moves: bool,
) -> Result<Checkpoint> {
    if moves {
        return eventually(
            &format!("checkpoint of {group} {remote}-{partition} at upstream {c}"),
            Duration::from_secs(30),
            || async {
                Ok(latest(
                    &checkpoints(bootstrap, cps_topic, group)?,
                    remote,
                    partition,
                )
                .filter(|cp| cp.upstream_offset == c))
            },
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    latest(
        &checkpoints(bootstrap, cps_topic, group)?,
        remote,
        partition,
    )
    .context("no checkpoint at all")
}

/// Sends `n` records per partition in one transaction, committed or aborted; returns the
/// values sent.
pub async fn transaction(
    producer: &FutureProducer,
    topic: &str,
    partitions: i32,
    tag: &str,
    n: usize,
    commit: bool,
) -> Result<Vec<String>> {
    producer.begin_transaction()?;
    let mut values = Vec::new();
    for j in 0..n {
        for p in 0..partitions {
            let value = format!("{tag}-p{p}-{j}");
            producer
                .send(
                    FutureRecord::to(topic)
                        .partition(p)
                        .key(&format!("k{j}"))
                        .payload(&value),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)?;
            values.push(value);
        }
    }
    if commit {
        producer.commit_transaction(Duration::from_secs(30))?;
    } else {
        producer.abort_transaction(Duration::from_secs(30))?;
    }
    Ok(values)
}

/// Creates a topic with configs; returns whether `segment.bytes` had to be left out (Kafka 4
/// rejects values under 1 MiB).
pub async fn create_compacted(bootstrap: &str, topic: &str) -> Result<bool> {
    let base = [
        ("cleanup.policy", "compact"),
        ("segment.ms", "100"),
        ("min.cleanable.dirty.ratio", "0.01"),
        ("min.compaction.lag.ms", "0"),
        ("delete.retention.ms", "100"),
    ];
    let admin = kafka::admin(bootstrap)?;
    for small_segments in [true, false] {
        let mut new = base.iter().fold(
            NewTopic::new(topic, 1, TopicReplication::Fixed(1)),
            |t, (k, v)| t.set(k, v),
        );
        if small_segments {
            new = new.set("segment.bytes", "16384");
        }
        let results = admin.create_topics(&[new], &AdminOptions::new()).await?;
        match results.into_iter().next().context("no result")? {
            Ok(_) => return Ok(!small_segments),
            Err((_, code)) if small_segments => {
                println!("segment.bytes=16384 refused ({code}); rolling segments by time only");
            }
            Err((name, code)) => bail!("creating {name}: {code}"),
        }
    }
    unreachable!()
}

/// Both flows of the failback test name remote topics `<alias>_<topic>`: still the prefix
/// policy and its cycle rule, but only `heartbeats` and `*_heartbeats` count as heartbeats
/// topics. With the default `.`, the reverse flow would copy every `<alias>.heartbeats` topic
/// other tests left on the shared target (heartbeats topics bypass the topic filter, as in MM2)
/// and the world's own flows would copy those again: thousands of topics.
pub const SEPARATOR: &str = "replicationPolicy: {type: Prefix, separator: '_'}\n";

pub async fn failback(s: &Setup) -> Result<()> {
    let (cluster_a, cluster_b) = (
        s.world.source_bootstrap.clone(),
        s.world.target_bootstrap.clone(),
    );
    let topic = unique("fb");
    let remote = format!("{}_{topic}", s.a);
    let group = unique("fid-fb-app");
    kafka::create_topic(&cluster_a, &topic, 1).await?;
    let pa = kafka::producer(&cluster_a, Duration::from_secs(30))?;
    for i in 0..20 {
        pa.send(
            FutureRecord::to(&topic)
                .partition(0)
                .key("k")
                .payload(&format!("a-{i}")),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    }
    let mut forward = s
        .start(
            "forward",
            &s.flow(
                false,
                &[&topic],
                &[&group],
                &format!("checkpoints: {{syncGroupOffsets: true}}\n{SEPARATOR}"),
            ),
        )
        .await?;
    let visible = wait_copied(&cluster_a, &topic, &cluster_b, &remote, 0)
        .await
        .with_context(|| forward.log_text())?;
    let (_, c_a) = consume_and_commit(&cluster_a, &group, &topic, 0, 12)?;
    let synced = eventually(
        "the group's offset synced into the target",
        Duration::from_secs(30),
        || async { committed(&cluster_b, &group, &remote, 0) },
    )
    .await
    .with_context(|| forward.log_text())?;
    forward.stop(Duration::from_secs(10));

    // Failover: the group resumes on the target at its synced offset.
    let (read, c_b) = consume_and_commit(&cluster_b, &group, &remote, 0, 4)?;
    let l = landing(&visible, next_index(&visible, c_a), read.first())?;
    println!(
        "failover via synced group offset {c_a}->{synced}: first read {:?}: skipped {}, re-read {}",
        read.first().map(|r| &r.value),
        l.skipped,
        l.reread
    );
    ensure!(l.skipped == 0 && l.reread == 0, "failover landed {l:?}");
    // The applications' producers failed over too and write `topic` on the target.
    kafka::create_topic(&cluster_b, &topic, 1).await?;
    let pb = kafka::producer(&cluster_b, Duration::from_secs(30))?;
    for i in 0..10 {
        pb.send(
            FutureRecord::to(&topic)
                .partition(0)
                .key("k")
                .payload(&format!("b-{i}")),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    }
    let (_, c_local) = consume_and_commit(&cluster_b, &group, &topic, 0, 6)?;

    // Failback: the old target is now the source of a flow into the old source.
    let back_remote = format!("{}_{topic}", s.b);
    let cycle = format!("{}_{remote}", s.b);
    let back_cps = format!("{}_checkpoints_internal", s.b);
    let back = s
        .start(
            "back",
            &s.flow(true, &[&format!(".*{topic}")], &[&group], SEPARATOR),
        )
        .await?;
    let back_visible = wait_copied(&cluster_b, &topic, &cluster_a, &back_remote, 0)
        .await
        .with_context(|| back.log_text())?;
    let cp = eventually(
        "checkpoint of the group's offset on the new topic",
        Duration::from_secs(30),
        || async {
            Ok(latest(
                &checkpoints(&cluster_a, &back_cps, &group)?,
                &back_remote,
                0,
            )
            .filter(|cp| cp.upstream_offset == c_local))
        },
    )
    .await
    .with_context(|| back.log_text())?;
    // The group committed before the reverse flow started: its first checkpoint may come while
    // the copy is under way (conservative, MM2's rule); the exact one follows with the next
    // sync. A failback in steady state reads the latest.
    let expected = next_index(&back_visible, c_local);
    let first = first_from(&cluster_a, &back_remote, 0, cp.downstream_offset)?;
    let l_first = landing(&back_visible, expected, first.as_ref())?;
    println!(
        "failback: first checkpoint {}->{}: skipped {}, re-read {}",
        cp.upstream_offset, cp.downstream_offset, l_first.skipped, l_first.reread
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cp = latest(
        &checkpoints(&cluster_a, &back_cps, &group)?,
        &back_remote,
        0,
    )
    .context("no checkpoint")?;
    let first = first_from(&cluster_a, &back_remote, 0, cp.downstream_offset)?;
    let l_back = landing(&back_visible, expected, first.as_ref())?;
    ensure!(
        l_first.skipped == 0,
        "failback skipped records: {l_first:?}"
    );
    let topics_a = kafka::topics(&cluster_a)?;
    let all_back = checkpoints(&cluster_a, &back_cps, &group)?;
    let own_commit = committed(&cluster_a, &group, &topic, 0)?.context("no commit on A")?;
    let consumed_on_b = next_index(&visible, c_a) + read.len();
    println!(
        "failback: {back_remote} copied ({} records), {cycle} exists on the old source: {}",
        back_visible.len(),
        topics_a.contains(&cycle)
    );
    println!(
        "failback: {back_remote} checkpoint {}->{}: first read {:?}: skipped {}, re-read {}",
        cp.upstream_offset,
        cp.downstream_offset,
        first.as_ref().map(|f| &f.value),
        l_back.skipped,
        l_back.reread
    );
    println!(
        "failback: checkpoints of {group} on the old source: {:?}",
        all_back
            .iter()
            .map(|c| format!(
                "{}-{} {}->{}",
                c.topic_partition.topic,
                c.topic_partition.partition,
                c.upstream_offset,
                c.downstream_offset
            ))
            .collect::<Vec<_>>()
    );
    println!(
        "failback: the group committed {c_b} on {remote} (on the old target); no checkpoint \
         carries it back, so on {topic} (old source) it resumes at its own commit {own_commit} \
         and re-reads {} records",
        consumed_on_b.saturating_sub(next_index(&visible, own_commit))
    );
    ensure!(
        !topics_a.contains(&cycle),
        "the remote topic was copied back as {cycle}"
    );
    ensure!(
        l_back.skipped == 0 && l_back.reread == 0,
        "failback landed {l_back:?}"
    );
    Ok(())
}

/// Other world test binaries that a broker stop would disturb.
pub fn other_world_tests() -> Vec<String> {
    let mine = own_lineage();
    let out = std::process::Command::new("pgrep")
        .args([
            "-fa",
            "deps/(operator_faults|operator|replicator_|world_kafka|chart)",
        ])
        .output();
    let Ok(out) = out else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        // This binary, and the processes that started it (world-tests.sh's `timeout`, whose
        // command line names this binary too).
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_none_or(|pid| !mine.iter().any(|m| m == pid))
        })
        // The compiler mentions deps/ paths in its arguments; only test binaries count.
        .filter(|l| !l.contains("rustc") && !l.contains("cargo"))
        .map(str::to_string)
        .collect()
}

/// This process's pid and its ancestors' (read from /proc), as text.
fn own_lineage() -> Vec<String> {
    let mut pids = vec![std::process::id().to_string()];
    let mut pid = std::process::id();
    // Bounded: a process tree is not deeper than this here.
    for _ in 0..64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            break;
        };
        // `pid (comm) state ppid ...`: the command may hold spaces and parentheses.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            break;
        };
        if ppid <= 1 {
            break;
        }
        pids.push(ppid.to_string());
        pid = ppid;
    }
    pids
}

/// Waits until the remote topic's partitions hold more than `n` records in all.
pub async fn flowing(target: &str, remote: &str, partitions: i32, n: i64) -> Result<()> {
    eventually("records flowing to the target", WAIT, || async {
        // Watermarks: a reader never reaches the end of a partition that keeps growing.
        let c = reader(target)?;
        let total: i64 = (0..partitions)
            .map(|p| Ok(c.fetch_watermarks(remote, p, Duration::from_secs(5))?.1))
            .sum::<Result<i64>>()?;
        Ok((total > n).then_some(()))
    })
    .await
}

/// Waits until no other world test binary runs: the world is shared, and a broker must never
/// stop under another test.
pub async fn wait_alone() -> Result<()> {
    let waited = Instant::now();
    loop {
        let others = other_world_tests();
        if others.is_empty() {
            return Ok(());
        }
        if waited.elapsed() > Duration::from_secs(600) {
            bail!(
                "other world tests kept running for 10 minutes; not stopping the target: {others:?}"
            );
        }
        println!("waiting for other world tests to finish: {others:?}");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Value of `name{label}` on the replicator's /metrics.
pub fn labelled(r: &Replicator, name: &str, label: &str) -> Option<f64> {
    let body = http_get(&r.metrics_addr, "/metrics").ok()?;
    let prefix = format!("{name}{{{label}}}");
    body.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

/// Restarts the target broker when dropped, unless disarmed: also on a panic.
pub struct TargetBack<'a> {
    pub world: &'a World,
    pub armed: bool,
}

impl TargetBack<'_> {
    pub fn start_now(&mut self) -> Result<()> {
        self.armed = false;
        self.world.world_sh(&["kafka", "start", "target"])
    }
}

impl Drop for TargetBack<'_> {
    fn drop(&mut self) {
        if self.armed {
            eprintln!("restarting the target broker (cleanup)");
            if let Err(e) = self.world.world_sh(&["kafka", "start", "target"]) {
                eprintln!("restarting the target broker failed: {e:#}");
            }
        }
    }
}

/// Sends `values` to one partition inside the producer's open transaction.
pub async fn send_in(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    values: &[String],
) -> Result<()> {
    for v in values {
        producer
            .send(
                FutureRecord::to(topic)
                    .partition(partition)
                    .key("k")
                    .payload(v),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    Ok(())
}

pub fn transactional(bootstrap: &str) -> Result<FutureProducer> {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", unique("fid-al-txid"))
        .set("acks", "all")
        .create()?;
    p.init_transactions(Duration::from_secs(30))?;
    Ok(p)
}

/// Rounds of ten repeated keys and one key of its own on partition 0, one segment per round
/// (see `compacted_source_fails_over_onto_the_next_record`), then a record that closes the
/// last round's segment.
pub async fn compactable_rounds(
    source: &str,
    topic: &str,
    rounds: std::ops::Range<u32>,
) -> Result<()> {
    let producer = kafka::producer(source, Duration::from_secs(30))?;
    for round in rounds {
        for k in 0..10 {
            producer
                .send(
                    FutureRecord::to(topic)
                        .partition(0)
                        .key(&format!("k{k}"))
                        .payload(&format!("round{round}-k{k}")),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)?;
        }
        let own = format!("own{round}");
        producer
            .send(
                FutureRecord::to(topic).partition(0).key(&own).payload(&own),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    send_in(&producer, topic, 0, &[format!("roll-{}", unique("r"))]).await
}

/// Waits until the source topic holds one round of the repeated keys: compacted.
pub async fn compacted(source: &str, topic: &str) -> Result<Vec<Rec>> {
    eventually(
        "compaction of the source topic",
        Duration::from_secs(120),
        || async {
            let recs = read_visible(source, topic, 0)?;
            let repeated = recs.iter().filter(|r| r.value.starts_with("round")).count();
            Ok((repeated == 10).then_some(recs))
        },
    )
    .await
}
