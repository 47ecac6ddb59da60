//! A payments-like history copied in both offset modes against the world's real clusters, with
//! the replicator binary as a child process (issue 44): a transactional topic of 6 partitions
//! whose transactions (10 records each, from two producers at once) span several partitions,
//! one in ten aborted; a compacted topic of 3 partitions whose cleaner runs before and during
//! the copy; a plain topic beside them. Each test asserts that every remote partition reaches
//! the source's end within a bound (with `Aligned`: every visible record at its source offset,
//! or a break recorded), that groups committed at the head, in the middle, rewound to ~2% and
//! on a few partitions fail over at their checkpoints with nothing skipped or re-read, and that
//! `mirrorflow translate` and MirrorMaker 2's `RemoteClusterUtils` agree on every group-partition.
//! It prints what the issue's note reports: time to catch up, re-reads per group, partitions
//! skipped, translate agreement and the breaks aligned mode recorded.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use mirrorflow::kafka::positions::{Gap, positions_topic};
use mirrorflow_e2e::fidelity::*;
use mirrorflow_e2e::replicator::Replicator;
use mirrorflow_e2e::{eventually, kafka, mm2, unique};
use rdkafka::Message;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::Consumer;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

const TXN_PARTITIONS: i32 = 6;
const COMPACTED_PARTITIONS: i32 = 3;
const PLAIN_PARTITIONS: i32 = 12;
/// Transactions per producer written before the flow starts, and while it runs.
const TXNS_BEFORE: u32 = 250;
const TXNS_DURING: u32 = 60;
const RECORDS_PER_TXN: u32 = 10;
/// How long a copy may take to reach the source's end once the source stopped growing.
const CATCH_UP: Duration = Duration::from_secs(180);

/// The two tests run one after the other (their timings are compared).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn aligned_copies_transactional_and_compacted_history_to_the_end() -> Result<()> {
    let _serial = SERIAL.lock().await;
    history_copied("Aligned").await
}

#[tokio::test]
async fn translated_copies_transactional_and_compacted_history_to_the_end() -> Result<()> {
    let _serial = SERIAL.lock().await;
    history_copied("Translated").await
}

struct Topics {
    txn: String,
    compacted: String,
    plain: String,
}

impl Topics {
    fn all(&self) -> [(&str, i32); 3] {
        [
            (self.txn.as_str(), TXN_PARTITIONS),
            (self.compacted.as_str(), COMPACTED_PARTITIONS),
            (self.plain.as_str(), PLAIN_PARTITIONS),
        ]
    }
}

async fn history_copied(mode: &str) -> Result<()> {
    let _brokers = BROKERS.read().await;
    let s = Setup::new("alh")?;
    let source = s.world.source_bootstrap.clone();
    let target = s.world.target_bootstrap.clone();
    let topics = Topics {
        txn: unique("alh-txn"),
        compacted: unique("alh-cmp"),
        plain: unique("alh-plain"),
    };
    kafka::create_topic(&source, &topics.txn, TXN_PARTITIONS).await?;
    kafka::create_topic(&source, &topics.plain, PLAIN_PARTITIONS).await?;
    create_compacted_topic(&source, &topics.compacted).await?;

    let t = Instant::now();
    aborted_head(&source, &topics.txn).await?;
    let before = std::env::var("MF_ALH_TXNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(TXNS_BEFORE);
    transactions(&source, &topics.txn, "before", before).await?;
    compacted_rounds(&source, &topics.compacted, 0..12).await?;
    plain_records(&source, &topics.plain, 500).await?;
    println!("{mode}: history written in {:?}", t.elapsed());
    let cleaned = wait_some_compaction(&source, &topics.compacted).await?;
    println!("{mode}: compacted topic before the copy: {cleaned}");

    let prefix = unique("alh-app");
    let flow = s.flow(
        false,
        &[&topics.txn, &topics.compacted, &topics.plain],
        &[&format!("{prefix}-.*")],
        &format!("offsets: {mode}\n"),
    );
    let started = Instant::now();
    let r = s.start("r", &flow).await?;
    // The history grows while the copy runs; the compacted topic is cleaned meanwhile.
    let (txns, rounds) = tokio::join!(
        transactions(&source, &topics.txn, "during", TXNS_DURING),
        compacted_rounds(&source, &topics.compacted, 12..20),
    );
    txns?;
    rounds?;
    let written = Instant::now();
    let caught_up = wait_caught_up(&source, &target, &s.a, &topics, &r).await?;
    println!(
        "{mode}: caught up {:?} after the replicator was ready, {:?} after the source stopped growing",
        caught_up.duration_since(started),
        caught_up.duration_since(written)
    );

    let breaks = recorded_breaks(&target, &s.a)?;
    println!("{mode}: breaks recorded in the positions topic: {breaks:?}");
    if mode == "Aligned" {
        assert_aligned(&source, &target, &s.a, &topics, &breaks)?;
    }

    let groups = commit_groups(&source, &topics, &prefix)?;
    let cps_topic = format!("{}.checkpoints.internal", s.a);
    wait_checkpoints(&target, &cps_topic, &groups, &s.a, &r).await?;
    let landings = fail_over_at_checkpoints(&source, &target, &cps_topic, &s.a, &groups)?;
    let (mut skipped, mut reread) = (0, 0);
    for (g, (sk, rr)) in &landings {
        println!("{mode}: {g}: skipped {sk}, re-read {rr}");
        skipped += sk;
        reread += rr;
    }
    if mode == "Aligned" {
        aligned_checkpoints(&target, &cps_topic, &s.a, &groups, &breaks)?;
    }
    let agreeing = translate_agrees(&s, &flow, &groups)?;
    println!(
        "{mode}: mirrorflow translate == RemoteClusterUtils on all {agreeing} group-partitions"
    );
    let errors = labelled(
        &r,
        "mirrorflow_errors_total",
        "kind=\"misaligned\",loop=\"source\"",
    );
    println!("{mode}: mirrorflow_errors_total{{kind=\"misaligned\"}} {errors:?}");
    ensure!(
        skipped == 0 && reread == 0,
        "{mode}: failover at the checkpoints skipped {skipped} and re-read {reread} records"
    );
    Ok(())
}

/// A compacted topic whose cleaner runs every few hundred milliseconds.
async fn create_compacted_topic(source: &str, topic: &str) -> Result<()> {
    let base = [
        ("cleanup.policy", "compact"),
        ("segment.ms", "200"),
        ("min.cleanable.dirty.ratio", "0.01"),
        ("min.compaction.lag.ms", "0"),
        ("delete.retention.ms", "100"),
    ];
    let admin = kafka::admin(source)?;
    for small_segments in [true, false] {
        let mut new = base.iter().fold(
            NewTopic::new(topic, COMPACTED_PARTITIONS, TopicReplication::Fixed(1)),
            |t, (k, v)| t.set(k, v),
        );
        if small_segments {
            new = new.set("segment.bytes", "16384");
        }
        let results = admin.create_topics(&[new], &AdminOptions::new()).await?;
        match results.into_iter().next().context("no result")? {
            Ok(_) => return Ok(()),
            Err(_) if small_segments => {}
            Err((name, code)) => anyhow::bail!("creating {name}: {code}"),
        }
    }
    Ok(())
}

/// `count` transactions from each of two producers at once; transaction `i` writes its 10
/// records over 2 to 4 partitions, and one in ten is aborted.
async fn transactions(source: &str, topic: &str, tag: &str, count: u32) -> Result<()> {
    let one = |who: u32| async move {
        let producer = transactional(source)?;
        for i in 0..count {
            let n = i * 2 + who;
            producer.begin_transaction()?;
            let start = n % TXN_PARTITIONS as u32;
            let span = 2 + n % 3;
            let mut sends = Vec::new();
            for j in 0..RECORDS_PER_TXN {
                let partition = ((start + j % span) % TXN_PARTITIONS as u32) as i32;
                let value = format!("{tag}-t{n}-r{j}");
                let record = FutureRecord::to(topic)
                    .partition(partition)
                    .key(&value)
                    .payload(&value);
                sends.push(
                    producer
                        .send_result(record)
                        .map_err(|(e, _)| anyhow::anyhow!("queueing: {e}"))?,
                );
            }
            delivered(sends).await?;
            if n % 10 == 3 {
                producer.abort_transaction(Duration::from_secs(30))?;
            } else {
                producer.commit_transaction(Duration::from_secs(30))?;
            }
        }
        anyhow::Ok(())
    };
    tokio::try_join!(one(0), one(1))?;
    Ok(())
}

/// An aborted transaction at the start of every partition: the first records a
/// `read_committed` copy reads lie past offset 0, so a group committed below them (`START`)
/// is at a position no offset sync of a record covers, whatever the cleaner does.
async fn aborted_head(source: &str, topic: &str) -> Result<()> {
    let producer = transactional(source)?;
    producer.begin_transaction()?;
    let mut sends = Vec::new();
    for p in 0..TXN_PARTITIONS {
        for r in 0..3 {
            sends.push(send(
                &producer,
                topic,
                p,
                "aborted",
                &format!("head-p{p}-r{r}"),
            )?);
        }
    }
    delivered(sends).await?;
    producer.abort_transaction(Duration::from_secs(30))?;
    Ok(())
}

/// Rounds of 20 repeated keys per partition, each round in a segment of its own.
async fn compacted_rounds(source: &str, topic: &str, rounds: std::ops::Range<u32>) -> Result<()> {
    let producer = kafka::producer(source, Duration::from_secs(30))?;
    for round in rounds {
        let mut sends = Vec::new();
        for p in 0..COMPACTED_PARTITIONS {
            for k in 0..20 {
                let key = format!("k{k}");
                let value = format!("round{round}-p{p}-k{k}");
                sends.push(send(&producer, topic, p, &key, &value)?);
            }
        }
        delivered(sends).await?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Queues one record; its delivery is awaited with [`delivered`].
fn send(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    key: &str,
    value: &str,
) -> Result<DeliveryFuture> {
    producer
        .send_result(
            FutureRecord::to(topic)
                .partition(partition)
                .key(key)
                .payload(value),
        )
        .map_err(|(e, _)| anyhow::anyhow!("queueing a record: {e}"))
}

async fn delivered(sends: Vec<DeliveryFuture>) -> Result<()> {
    for sent in sends {
        sent.await
            .context("delivery canceled")?
            .map_err(|(e, _)| e)?;
    }
    Ok(())
}

async fn plain_records(source: &str, topic: &str, per_partition: i32) -> Result<()> {
    let producer = kafka::producer(source, Duration::from_secs(30))?;
    let mut sends = Vec::new();
    for i in 0..per_partition {
        for p in 0..PLAIN_PARTITIONS {
            let value = format!("plain-p{p}-{i}");
            sends.push(send(&producer, topic, p, &value, &value)?);
        }
    }
    delivered(sends).await?;
    Ok(())
}

/// Waits (bounded) until the cleaner removed records of the compacted topic; says how many.
async fn wait_some_compaction(source: &str, topic: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut visible = 0;
        let mut ends = 0;
        for p in 0..COMPACTED_PARTITIONS {
            visible += read_visible(source, topic, p)?.len();
            let (_, high) = reader(source)?.fetch_watermarks(topic, p, Duration::from_secs(10))?;
            ends += high;
        }
        if (visible as i64) < ends || Instant::now() >= deadline {
            return Ok(format!("{visible} records visible of {ends} offsets"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// When every remote partition held every visible record of its source partition (by value,
/// in order). Fails after [`CATCH_UP`] naming the partitions behind.
async fn wait_caught_up(
    source: &str,
    target: &str,
    alias: &str,
    topics: &Topics,
    r: &Replicator,
) -> Result<Instant> {
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let mut behind = Vec::new();
        for (topic, partitions) in topics.all() {
            let remote = format!("{alias}.{topic}");
            let sources = read_all(source, topic, partitions)?;
            let remotes = read_all(target, &remote, partitions).unwrap_or_default();
            for (p, src) in sources.iter().enumerate() {
                let dst = remotes.get(p).map_or(&[][..], Vec::as_slice);
                if !covers(dst, src) {
                    behind.push(format!(
                        "{topic}[{p}]: {} of {} records (last source offset {:?}, last remote offset {:?})",
                        dst.len(),
                        src.len(),
                        src.last().map(|r| r.offset),
                        dst.last().map(|r| r.offset)
                    ));
                }
            }
        }
        if behind.is_empty() {
            return Ok(Instant::now());
        }
        ensure!(
            Instant::now() < deadline,
            "not caught up after {CATCH_UP:?}:\n{}\n--- replicator log (tail) ---\n{}",
            behind.join("\n"),
            tail(&r.log_text(), 200)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every record a `read_committed` reader sees in each partition of `topic`, read by one
/// consumer up to each partition's end.
fn read_all(bootstrap: &str, topic: &str, partitions: i32) -> Result<Vec<Vec<Rec>>> {
    let c = reader(bootstrap)?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut out = vec![Vec::new(); usize::try_from(partitions)?];
    let mut ended = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ended.len() < out.len() {
        ensure!(Instant::now() < deadline, "reading {topic} timed out");
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                if let Some(part) = out.get_mut(usize::try_from(m.partition())?) {
                    part.push(rec(&m));
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    Ok(out)
}

/// Whether `dst` holds every record of `src`, in order (by value). The remote copy of a
/// compacted topic may hold more: the source's cleaner runs on its own schedule.
fn covers(dst: &[Rec], src: &[Rec]) -> bool {
    let mut rest = dst.iter();
    src.iter().all(|s| rest.any(|d| d.value == s.value))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A gap recorded in the flow's positions topic: (kind, topic, partition, from, to).
type Break = (String, String, i32, i64, i64);

/// Every gap recorded in the flow's positions topic.
fn recorded_breaks(target: &str, alias: &str) -> Result<Vec<Break>> {
    Ok(kafka::read_partition(target, &positions_topic(alias), 0)?
        .into_iter()
        .filter_map(|(_, k, v)| Gap::decode(&k?, &v?))
        .map(|g| (format!("{:?}", g.kind), g.topic, g.partition, g.from, g.to))
        .collect())
}

fn broke(breaks: &[Break], topic: &str, p: i32) -> bool {
    breaks
        .iter()
        .any(|(kind, t, bp, _, _)| t == topic && *bp == p && kind != "SourceTruncated")
}

/// With `Aligned`: every visible record of a partition with no break recorded is at its source
/// offset on the target; the transactional and plain topics have no break at all.
fn assert_aligned(
    source: &str,
    target: &str,
    alias: &str,
    topics: &Topics,
    breaks: &[Break],
) -> Result<()> {
    for (topic, partitions) in topics.all() {
        let remote = format!("{alias}.{topic}");
        for p in 0..partitions {
            if broke(breaks, topic, p) {
                ensure!(
                    topic == topics.compacted,
                    "{topic}[{p}]: alignment broke on a topic without compaction: {breaks:?}"
                );
                continue;
            }
            let src = read_visible(source, topic, p)?;
            let dst: std::collections::HashMap<String, i64> = read_visible(target, &remote, p)?
                .into_iter()
                .map(|r| (r.value, r.offset))
                .collect();
            let moved: Vec<_> = src
                .iter()
                .filter(|s| dst.get(&s.value) != Some(&s.offset))
                .take(3)
                .map(|s| (s, dst.get(&s.value)))
                .collect();
            ensure!(
                moved.is_empty(),
                "{topic}[{p}]: records at other offsets than on the source, none recorded: {moved:?}"
            );
        }
    }
    Ok(())
}

/// The name of the groups committed inside compacted-away ranges.
const HOLE: &str = "hole";
/// The name of the groups committed inside the aborted transaction that starts every
/// partition of the transactional topic ([`aborted_head`]).
const START: &str = "start";

/// (group, topic, [(partition, committed source offset)]).
type Groups = Vec<(String, String, Vec<(i32, i64)>)>;

/// Per topic: a group at the head, one in the middle, one rewound to ~2% of the history and
/// one on two partitions only, each at a visible record's offset (or the end); on the
/// compacted topic also one inside a range its cleaner removed; on the transactional one also
/// one inside the aborted records before the first visible one.
fn commit_groups(source: &str, topics: &Topics, prefix: &str) -> Result<Groups> {
    let mut groups = Vec::new();
    for (topic, partitions) in topics.all() {
        let visible: Vec<Vec<Rec>> = (0..partitions)
            .map(|p| read_visible(source, topic, p))
            .collect::<Result<_>>()?;
        let end = |p: usize| visible[p].last().map_or(0, |v| v.offset + 1);
        let at = |p: usize, share: usize| {
            visible[p]
                .get(visible[p].len() * share / 100)
                .map_or(end(p), |v| v.offset)
        };
        let all = |f: &dyn Fn(usize) -> i64| -> Vec<(i32, i64)> {
            (0..partitions).map(|p| (p, f(p as usize))).collect()
        };
        let short = topic.split('-').nth(1).unwrap_or(topic);
        let mut add = |name: &str, commits: Vec<(i32, i64)>| {
            groups.push((
                format!("{prefix}-{short}-{name}"),
                topic.to_string(),
                commits,
            ));
        };
        add("head", all(&|p| end(p)));
        add("middle", all(&|p| at(p, 50)));
        add("rewound", all(&|p| at(p, 2)));
        add("few", vec![(0, at(0, 70)), (1, at(1, 30))]);
        if topic == topics.txn {
            add(START, all(&|_| 1));
        }
        if topic == topics.compacted {
            // Committed inside a range the cleaner removed: the checkpoint must still say the
            // source offset on an aligned partition, and both readers the same.
            let holes: Vec<(i32, i64)> = (0..partitions)
                .filter_map(|p| {
                    let v = &visible[p as usize];
                    let inner = v.windows(2).find(|w| w[0].offset + 1 < w[1].offset);
                    match (v.first(), inner) {
                        (_, Some(w)) => Some((p, w[0].offset + 1)),
                        // The cleaner removed the partition's oldest records.
                        (Some(first), None) if first.offset > 0 => Some((p, first.offset - 1)),
                        _ => None,
                    }
                })
                .collect();
            if !holes.is_empty() {
                add(HOLE, holes);
            }
        }
    }
    for (g, topic, commits) in &groups {
        kafka::commit(source, g, topic, commits)?;
    }
    Ok(groups)
}

/// Waits until every committed group-partition has a checkpoint of its commit.
async fn wait_checkpoints(
    target: &str,
    cps_topic: &str,
    groups: &Groups,
    alias: &str,
    r: &Replicator,
) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut missing = Vec::new();
        for (g, topic, commits) in groups {
            let cps = checkpoints(target, cps_topic, g)?;
            let remote = format!("{alias}.{topic}");
            for (p, c) in commits {
                if latest(&cps, &remote, *p).is_none_or(|cp| cp.upstream_offset != *c) {
                    missing.push(format!("{g} {topic}[{p}] at {c}"));
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "no checkpoint after {WAIT:?} for {}\n--- replicator log (tail) ---\n{}",
            missing.join(", "),
            tail(&r.log_text(), 100)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Per group: (records skipped, records re-read) by a consumer resuming on the target at the
/// latest checkpoint's downstream offset, against the record it reads next on the source.
fn fail_over_at_checkpoints(
    source: &str,
    target: &str,
    cps_topic: &str,
    alias: &str,
    groups: &Groups,
) -> Result<BTreeMap<String, (usize, usize)>> {
    let mut out = BTreeMap::new();
    for (g, topic, commits) in groups {
        if g.ends_with(HOLE) {
            // What the target holds at a compacted-away offset may be a version the source's
            // cleaner removed after it was copied: no record of the source's list to land on.
            continue;
        }
        let cps = checkpoints(target, cps_topic, g)?;
        let remote = format!("{alias}.{topic}");
        let (mut skipped, mut reread) = (0, 0);
        for &(p, c) in commits {
            let visible = read_visible(source, topic, p)?;
            let cp = latest(&cps, &remote, p).context("no checkpoint")?;
            let first = first_from(target, &remote, p, cp.downstream_offset)?;
            let l = landing(&visible, next_index(&visible, c), first.as_ref())?;
            skipped += l.skipped;
            reread += l.reread;
        }
        out.insert(g.clone(), (skipped, reread));
    }
    Ok(out)
}

/// With `Aligned`: on a partition with no break recorded a checkpoint says downstream ==
/// upstream (what `failover --offsets as-is` commits).
fn aligned_checkpoints(
    target: &str,
    cps_topic: &str,
    alias: &str,
    groups: &Groups,
    breaks: &[Break],
) -> Result<()> {
    let mut wrong = Vec::new();
    for (g, topic, commits) in groups {
        let cps = checkpoints(target, cps_topic, g)?;
        let remote = format!("{alias}.{topic}");
        for &(p, c) in commits {
            if broke(breaks, topic, p) {
                continue;
            }
            if let Some(cp) = latest(&cps, &remote, p)
                && cp.downstream_offset != c
            {
                wrong.push(format!(
                    "{g} {topic}[{p}]: upstream {c}, downstream {}",
                    cp.downstream_offset
                ));
            }
        }
    }
    ensure!(
        wrong.is_empty(),
        "checkpoints of aligned partitions not at the source offsets:\n{}",
        wrong.join("\n")
    );
    Ok(())
}

/// `mirrorflow translate` and MirrorMaker 2's `RemoteClusterUtils.translateOffsets` on the
/// same checkpoints topic: equal for every group; returns how many group-partitions.
fn translate_agrees(s: &Setup, flow: &str, groups: &Groups) -> Result<usize> {
    let dir: PathBuf = std::env::temp_dir().join(unique("alh-flow"));
    std::fs::create_dir_all(&dir)?;
    let flow_file = dir.join("flow.yaml");
    std::fs::write(&flow_file, flow)?;
    let names: Vec<&str> = groups.iter().map(|(g, _, _)| g.as_str()).collect();
    let ours = mm2::mirrorflow_translate(&s.world.repo_root, &flow_file, &names)?;
    let theirs = mm2::remote_cluster_utils(
        &s.world.repo_root,
        &s.world.target_bootstrap,
        &s.a,
        &names,
        &[],
    )?;
    ensure!(
        ours == theirs,
        "mirrorflow translate {ours:?}\nRemoteClusterUtils {theirs:?}"
    );
    let expected: usize = groups.iter().map(|(_, _, c)| c.len()).sum();
    let count: usize = ours.values().map(BTreeMap::len).sum();
    ensure!(
        count == expected,
        "{count} group-partitions translated, {expected} committed"
    );
    Ok(count)
}

/// A partition that copies nothing for a minute while the source holds records beyond it is
/// named in the metrics and in the status's `Replicating` message, then cleared once it moves:
/// here an aligned partition whose newest record waits behind a source transaction left open.
#[tokio::test]
async fn a_stalled_partition_is_named_within_a_minute_and_cleared_when_it_moves() -> Result<()> {
    let _brokers = BROKERS.read().await;
    let s = Setup::new("alh-stall")?;
    let source = s.world.source_bootstrap.clone();
    let topic = unique("alh-open");
    kafka::create_topic(&source, &topic, 1).await?;
    let plain = kafka::producer(&source, Duration::from_secs(30))?;
    delivered(vec![send(&plain, &topic, 0, "k", "before")?]).await?;
    // Open for longer than the watch's minute (librdkafka's default is 60 s).
    let open: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &source)
        .set("transactional.id", unique("alh-open-txid"))
        .set("transaction.timeout.ms", "300000")
        .create()?;
    open.init_transactions(Duration::from_secs(30))?;
    open.begin_transaction()?;
    delivered(vec![send(&open, &topic, 0, "k", "open")?]).await?;
    let flow = s.flow(false, &[&topic], &["alh-none"], "offsets: Aligned\n");
    let started = Instant::now();
    let r = s.start("r", &flow).await?;
    let label = format!("partition=\"0\",topic=\"{topic}\"");
    let named = eventually(
        "the stall named in the metrics",
        Duration::from_secs(120),
        || async { Ok(labelled(&r, "mirrorflow_partition_stalled", &label)) },
    )
    .await
    .with_context(|| r.log_text())?;
    println!(
        "stalled partition named after {:?} at offset {named}",
        started.elapsed()
    );
    ensure!(
        named == 0.0,
        "named at offset {named}, the held record is at 0"
    );
    let dir: PathBuf = std::env::temp_dir().join(unique("alh-stall-flow"));
    std::fs::create_dir_all(&dir)?;
    let flow_file = dir.join("flow.yaml");
    std::fs::write(&flow_file, &flow)?;
    let wanted = format!("partition 0 of {topic} copies nothing: stalled at source offset 0");
    let condition = eventually(
        "Replicating naming the stall",
        Duration::from_secs(60),
        || {
            let (flow_file, wanted) = (flow_file.clone(), wanted.clone());
            let root = s.world.repo_root.clone();
            async move {
                let c = mirrorflow_e2e::replicator::measured_condition(
                    &root,
                    &flow_file,
                    "Replicating",
                )?;
                let says = c["status"] == "False"
                    && c["message"].as_str().is_some_and(|m| m.contains(&wanted));
                Ok(says.then_some(c))
            }
        },
    )
    .await
    .with_context(|| r.log_text())?;
    println!("Replicating: {condition}");
    open.abort_transaction(Duration::from_secs(30))?;
    delivered(vec![send(&plain, &topic, 0, "k", "after")?]).await?;
    eventually("the stall cleared", Duration::from_secs(60), || async {
        Ok(labelled(&r, "mirrorflow_partition_stalled", &label)
            .is_none()
            .then_some(()))
    })
    .await
    .with_context(|| r.log_text())?;
    eventually(
        "Replicating without the stall",
        Duration::from_secs(60),
        || {
            let (flow_file, wanted) = (flow_file.clone(), wanted.clone());
            let root = s.world.repo_root.clone();
            async move {
                let c = mirrorflow_e2e::replicator::measured_condition(
                    &root,
                    &flow_file,
                    "Replicating",
                )?;
                let clear = !c["message"].as_str().is_some_and(|m| m.contains(&wanted));
                Ok(clear.then_some(()))
            }
        },
    )
    .await?;
    Ok(())
}
