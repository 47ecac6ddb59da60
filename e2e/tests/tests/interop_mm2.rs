//! Interoperability with the real MirrorMaker 2 (Kafka 4.3.1 jars of the world):
//! - MirrorMaker's own readers on what our replicator wrote: Kafka's console formatters
//!   (`CheckpointFormatter`, `HeartbeatFormatter`, `OffsetSyncFormatter`) decode our
//!   checkpoints, heartbeats and offset syncs to the fields we decode ourselves, and
//!   `RemoteClusterUtils.translateOffsets` on our checkpoints gives, partition by partition,
//!   what `mirrorflow translate` prints;
//! - the reverse: a real MirrorMaker 2 (dedicated mode) replicates, and `mirrorflow translate`
//!   on its checkpoints agrees with `RemoteClusterUtils`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use mirrorflow::mm2::{Checkpoint, Heartbeat, OffsetSync};
use mirrorflow_e2e::mm2::{self, MirrorMaker, Positions};
use mirrorflow_e2e::replicator::Replicator;
use mirrorflow_e2e::{World, eventually, kafka, unique};
use rdkafka::admin::AdminOptions;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

const WAIT: Duration = Duration::from_secs(90);

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Sends `n` records to each of `partitions` partitions.
async fn produce(bootstrap: &str, topic: &str, partitions: i32, n: usize, tag: &str) -> Result<()> {
    let producer = kafka::producer(bootstrap, Duration::from_secs(30))?;
    for i in 0..n {
        for p in 0..partitions {
            producer
                .send(
                    FutureRecord::to(topic)
                        .partition(p)
                        .key(&format!("k{i}"))
                        .payload(&format!("{tag}-p{p}-{i}")),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)?;
        }
    }
    Ok(())
}

/// Commits `offsets` (partition, offset) with `metadata` into `group` without joining it, as a
/// consumer that read up to there would.
fn commit(
    bootstrap: &str,
    group: &str,
    topic: &str,
    offsets: &[(i32, i64)],
    metadata: &str,
) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for &(p, o) in offsets {
        tpl.add_partition_offset(topic, p, Offset::Offset(o))?;
        if let Some(mut e) = tpl.find_partition(topic, p) {
            e.set_metadata(metadata);
        }
    }
    consumer.commit(&tpl, CommitMode::Sync)?;
    Ok(())
}

/// High watermark of each partition of `topic`.
fn ends(bootstrap: &str, topic: &str, partitions: i32) -> Result<Vec<i64>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    (0..partitions)
        .map(|p| Ok(c.fetch_watermarks(topic, p, Duration::from_secs(10))?.1))
        .collect()
}

/// Every record of partition 0 of `topic` decoded with `decode`; `[]` if the topic is absent.
fn decode_all<T>(
    bootstrap: &str,
    topic: &str,
    decode: impl Fn(&[u8], &[u8]) -> Result<T>,
) -> Result<Vec<T>> {
    if !kafka::topics(bootstrap)?.contains(topic) {
        return Ok(Vec::new());
    }
    kafka::read_partition(bootstrap, topic, 0)?
        .into_iter()
        .map(|(offset, k, v)| {
            let (Some(k), Some(v)) = (k, v) else {
                bail!("a null key or value at {topic}@{offset}");
            };
            decode(&k, &v).with_context(|| format!("decoding {topic}@{offset}"))
        })
        .collect()
}

fn checkpoints(bootstrap: &str, topic: &str) -> Result<Vec<Checkpoint>> {
    decode_all(bootstrap, topic, |k, v| Ok(Checkpoint::decode(k, v)?))
}

/// The latest checkpoint per (target topic, partition) of each group: what a reader that
/// keeps the last record per key (RemoteClusterUtils) arrives at.
fn latest_by_group(cps: &[Checkpoint], groups: &[&str]) -> BTreeMap<String, Positions> {
    let mut out: BTreeMap<String, Positions> = groups
        .iter()
        .map(|g| (g.to_string(), Positions::new()))
        .collect();
    for c in cps {
        if let Some(p) = out.get_mut(&c.group) {
            p.insert(
                (c.topic_partition.topic.clone(), c.topic_partition.partition),
                (c.downstream_offset, c.metadata.clone()),
            );
        }
    }
    out
}

/// Waits until the checkpoints in `cps_topic` carry every commit in `commits`
/// ((group, target topic, partition) -> upstream offset) as the group's latest checkpoint or,
/// with `exact` false, until every (group, partition) has some checkpoint: MirrorMaker emits a
/// new one only when the translated downstream offset moves, which a commit between two sparse
/// offset syncs does not do.
async fn wait_checkpointed(
    bootstrap: &str,
    cps_topic: &str,
    commits: &BTreeMap<(String, String, i32), i64>,
    exact: bool,
    log: impl Fn() -> String,
) -> Result<Vec<Checkpoint>> {
    eventually("checkpoints of every commit", WAIT, || async {
        let cps = checkpoints(bootstrap, cps_topic)?;
        let mut latest = BTreeMap::new();
        for c in &cps {
            latest.insert(
                (
                    c.group.clone(),
                    c.topic_partition.topic.clone(),
                    c.topic_partition.partition,
                ),
                c.upstream_offset,
            );
        }
        let missing: Vec<_> = commits
            .iter()
            .filter(|(k, up)| match latest.get(*k) {
                Some(got) => exact && got != *up,
                None => true,
            })
            .collect();
        if missing.is_empty() {
            Ok(Some(cps))
        } else {
            bail!("not yet checkpointed: {missing:?}; latest {latest:?}")
        }
    })
    .await
    .with_context(log)
}

fn print_positions(label: &str, by_group: &BTreeMap<String, Positions>) {
    for (g, positions) in by_group {
        let parts: Vec<String> = positions
            .iter()
            .map(|((t, p), (o, m))| {
                format!("{t}-{p}:{o}{}", if m.is_empty() { "" } else { "+meta" })
            })
            .collect();
        println!("  {label:<22} {g}: {}", parts.join(" "));
    }
}

/// Deletes every topic whose name contains one of `needles`.
async fn delete_topics_naming(bootstrap: &str, needles: &[&str]) -> Result<()> {
    let names: Vec<String> = kafka::topics(bootstrap)?
        .into_iter()
        .filter(|t| needles.iter().any(|n| t.contains(n)))
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    kafka::admin(bootstrap)?
        .delete_topics(&refs, &AdminOptions::new())
        .await?;
    Ok(())
}

async fn cleanup(world: &World, needles: &[&str]) {
    for bootstrap in [&world.source_bootstrap, &world.target_bootstrap] {
        if let Err(e) = delete_topics_naming(bootstrap, needles).await {
            eprintln!("cleaning up topics on {bootstrap}: {e:#}");
        }
    }
}

fn write_flow(name: &str, yaml: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join("mirrorflow-e2e").join(name);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("flow.yaml");
    std::fs::write(&path, yaml)?;
    Ok(path)
}

#[tokio::test]
async fn mirrormaker_reads_our_checkpoints_heartbeats_and_offset_syncs() -> Result<()> {
    let world = World::from_env()?;
    let (a, b) = (unique("ia"), unique("ib"));
    let topic = unique("iop");
    let outcome = ours_read_by_mirrormaker(&world, &a, &b, &topic).await;
    cleanup(&world, &[&a, &b, &topic]).await;
    outcome
}

async fn ours_read_by_mirrormaker(world: &World, a: &str, b: &str, topic: &str) -> Result<()> {
    let (source, target) = (&world.source_bootstrap, &world.target_bootstrap);
    let partitions = 2;
    let remote = format!("{a}.{topic}");
    let cps_topic = format!("{a}.checkpoints.internal");
    let syncs_topic = format!("mm2-offset-syncs.{b}.internal");
    let groups_owned: Vec<String> = (1..=3).map(|i| unique(&format!("iop-g{i}"))).collect();
    let groups: Vec<&str> = groups_owned.iter().map(String::as_str).collect();
    kafka::create_topic(source, topic, partitions).await?;
    produce(source, topic, partitions, 60, "r1").await?;

    let flow = format!(
        "source: {{alias: {a}, bootstrapServers: '{source}'}}\n\
         target: {{alias: {b}, bootstrapServers: '{target}'}}\n\
         topics: ['{topic}']\n\
         groups: [{}]\n\
         sourceLoop: {{topicsRefreshInterval: 1s, offsetSyncInterval: 1s}}\n\
         checkpoints: {{groupsRefreshInterval: 1s}}\n\
         heartbeats: {{interval: 1s}}\n",
        groups
            .iter()
            .map(|g| format!("'{g}'"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let name = unique("iop-ours");
    let flow_file = write_flow(&name, &flow)?;
    let port = free_port()?;
    let mut r = Replicator::start(&world.repo_root, &name, &flow, port)?;
    r.wait_ready().await?;
    eventually("the copy", WAIT, || async {
        Ok(kafka::topics(target)?
            .contains(&remote)
            .then(|| ends(target, &remote, partitions))
            .transpose()?
            .filter(|e| e.iter().all(|n| *n == 60)))
    })
    .await
    .with_context(|| r.log_text())?;

    // Groups at different places, one with commit metadata, one committing twice with more
    // records copied in between (several checkpoints per partition in the topic).
    let mut commits = BTreeMap::new();
    for (g, offsets, meta) in [
        (groups[0], vec![(0, 10), (1, 25)], "iop-meta"),
        (groups[1], vec![(0, 60), (1, 3)], ""),
        (groups[2], vec![(0, 0)], ""),
    ] {
        commit(source, g, topic, &offsets, meta)?;
        for (p, o) in offsets {
            commits.insert((g.to_string(), remote.clone(), p), o);
        }
    }
    wait_checkpointed(target, &cps_topic, &commits, true, || r.log_text()).await?;
    produce(source, topic, partitions, 20, "r2").await?;
    commit(source, groups[0], topic, &[(0, 70), (1, 41)], "iop-meta")?;
    commits.insert((groups[0].to_string(), remote.clone(), 0), 70);
    commits.insert((groups[0].to_string(), remote.clone(), 1), 41);
    wait_checkpointed(target, &cps_topic, &commits, true, || r.log_text()).await?;
    // A few heartbeats both ways, then a quiet topic set to read.
    tokio::time::sleep(Duration::from_secs(2)).await;
    r.stop(Duration::from_secs(10));

    // Checkpoints: the formatter's fields are ours, record by record.
    let cps = checkpoints(target, &cps_topic)?;
    let java: Vec<mm2::JavaCheckpoint> = mm2::format(
        &world.repo_root,
        "checkpoint",
        target,
        &cps_topic,
        cps.len(),
    )?
    .iter()
    .map(|l| mm2::parse_checkpoint(l))
    .collect::<Result<_>>()?;
    let as_java: Vec<mm2::JavaCheckpoint> = cps
        .iter()
        .map(|c| mm2::JavaCheckpoint {
            group: c.group.clone(),
            topic: c.topic_partition.topic.clone(),
            partition: c.topic_partition.partition,
            upstream_offset: c.upstream_offset,
            downstream_offset: c.downstream_offset,
            metadata: c.metadata.clone(),
        })
        .collect();
    println!(
        "CheckpointFormatter decoded {} checkpoints of ours, e.g. {:?}",
        java.len(),
        java.first()
    );
    ensure!(
        java == as_java,
        "CheckpointFormatter {java:#?}\nours {as_java:#?}"
    );
    ensure!(
        cps.iter()
            .any(|c| c.group == groups[0] && c.metadata == "iop-meta"),
        "commit metadata not carried into checkpoints: {cps:?}"
    );
    // The copy keeps offsets here (a fresh remote topic): the latest checkpoint of each
    // partition is exact, downstream == upstream (an earlier one may be conservative when the
    // commit overtook the offset sync of the records it covers).
    let latest = latest_by_group(&cps, &groups);
    for ((g, _, p), up) in &commits {
        let got = latest.get(g).and_then(|m| m.get(&(remote.clone(), *p)));
        ensure!(
            got.map(|(o, _)| *o) == Some(*up),
            "{g} p{p}: latest checkpoint {got:?}, committed {up}: {cps:?}"
        );
    }
    let conservative: Vec<String> = cps
        .iter()
        .filter(|c| c.downstream_offset != c.upstream_offset)
        .map(|c| {
            format!(
                "{} p{} {}->{}",
                c.group, c.topic_partition.partition, c.upstream_offset, c.downstream_offset
            )
        })
        .collect();
    println!("earlier conservative checkpoints of ours (superseded): {conservative:?}");

    // Offset syncs on the source.
    let syncs = decode_all(source, &syncs_topic, |k, v| Ok(OffsetSync::decode(k, v)?))?;
    ensure!(!syncs.is_empty(), "no offset syncs in {syncs_topic}");
    let java: Vec<(String, i32, i64, i64)> = mm2::format(
        &world.repo_root,
        "offset-sync",
        source,
        &syncs_topic,
        syncs.len(),
    )?
    .iter()
    .map(|l| mm2::parse_offset_sync(l))
    .collect::<Result<_>>()?;
    let as_java: Vec<(String, i32, i64, i64)> = syncs
        .iter()
        .map(|s| {
            (
                s.topic_partition.topic.clone(),
                s.topic_partition.partition,
                s.upstream_offset,
                s.downstream_offset,
            )
        })
        .collect();
    println!(
        "OffsetSyncFormatter decoded {} offset syncs of ours, e.g. {:?}",
        java.len(),
        java.first()
    );
    ensure!(!java.is_empty(), "no offset syncs");
    ensure!(
        java == as_java,
        "OffsetSyncFormatter {java:?}\nours {as_java:?}"
    );

    // Heartbeats: the shared `heartbeats` topics hold other flows' too; compare ours.
    for (bootstrap, from, to) in [(target, a, b), (source, b, a)] {
        let all = decode_all(bootstrap, "heartbeats", |k, v| Ok(Heartbeat::decode(k, v)?))?;
        // The first `all.len()` records: the topic may grow meanwhile (other flows).
        let java: Vec<(String, String, i64)> = mm2::format(
            &world.repo_root,
            "heartbeat",
            bootstrap,
            "heartbeats",
            all.len(),
        )?
        .iter()
        .map(|l| mm2::parse_heartbeat(l))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .filter(|(s, t, _)| s == from && t == to)
        .collect();
        let mine: Vec<(String, String, i64)> = all
            .into_iter()
            .filter(|h| h.source_alias == from && h.target_alias == to)
            .map(|h| (h.source_alias, h.target_alias, h.timestamp_ms))
            .collect();
        println!(
            "HeartbeatFormatter decoded {} heartbeats {from}->{to} of ours on {bootstrap}",
            java.len()
        );
        ensure!(
            !java.is_empty(),
            "no heartbeats {from}->{to} on {bootstrap}"
        );
        ensure!(java == mine, "HeartbeatFormatter {java:?}\nours {mine:?}");
    }

    // Translation: MirrorMaker's client library on our checkpoints.
    let rcu = mm2::remote_cluster_utils(&world.repo_root, target, a, &groups, &[])?;
    let mf = mm2::mirrorflow_translate(&world.repo_root, &flow_file, &groups)?;
    let what = "mirrorflow translate";
    // RemoteClusterUtils keeps the last checkpoint per partition: so does our reading of them.
    let decoded = latest_by_group(&cps, &groups);
    ensure!(
        rcu == decoded,
        "RemoteClusterUtils {rcu:?}\nlatest checkpoints {decoded:?}"
    );
    println!("translated positions on the target ({what} vs RemoteClusterUtils):");
    print_positions(what, &mf);
    print_positions("RemoteClusterUtils", &rcu);
    ensure!(rcu == mf, "RemoteClusterUtils {rcu:?}\n{what} {mf:?}");
    for ((g, _, p), up) in &commits {
        let got = rcu
            .get(g)
            .and_then(|m| m.get(&(remote.clone(), *p)))
            .map(|(o, _)| *o);
        ensure!(
            got == Some(*up),
            "{g} p{p}: RemoteClusterUtils {got:?}, committed {up}"
        );
    }
    Ok(())
}

/// MirrorMaker copying `topic` (2 partitions) from the world's source to its target with
/// aliases `a` and `b` and the separator `_` (MirrorMaker copies every heartbeats topic
/// regardless of the topic filter; with `.` it would copy any `<alias>.heartbeats` other tests
/// left on the shared source), checkpointing `groups`; returns once the remote topic holds
/// `records` in each partition.
async fn start_mirrormaker(
    world: &World,
    (a, b): (&str, &str),
    topic: &str,
    groups: &str,
    records: i64,
) -> Result<MirrorMaker> {
    let (source, target) = (&world.source_bootstrap, &world.target_bootstrap);
    let remote = format!("{a}_{topic}");
    let mm = MirrorMaker::start(
        &world.repo_root,
        &[],
        &unique("iopmm"),
        (a, source),
        (b, target),
        &[
            format!("topics={topic}"),
            format!("groups={groups}"),
            "replication.policy.separator=_".into(),
            "emit.heartbeats.enabled=false".into(),
        ],
    )?;
    eventually("MirrorMaker's copy", WAIT, || async {
        Ok(kafka::topics(target)?
            .contains(&remote)
            .then(|| ends(target, &remote, 2))
            .transpose()?
            .filter(|e| e.iter().all(|n| *n == records)))
    })
    .await
    .with_context(|| mm.log_text())?;
    Ok(mm)
}

#[tokio::test]
async fn our_translate_reads_mirrormaker_checkpoints() -> Result<()> {
    let world = World::from_env()?;
    let (a, b) = (unique("ma"), unique("mb"));
    let topic = unique("iopmm");
    let outcome = mirrormaker_read_by_ours(&world, &a, &b, &topic).await;
    cleanup(&world, &[&a, &b, &topic]).await;
    outcome
}

async fn mirrormaker_read_by_ours(world: &World, a: &str, b: &str, topic: &str) -> Result<()> {
    let (source, target) = (&world.source_bootstrap, &world.target_bootstrap);
    let partitions = 2;
    let remote = format!("{a}_{topic}");
    let cps_topic = format!("{a}_checkpoints_internal");
    let prefix = unique("iopmm-g");
    let groups_owned: Vec<String> = (1..=3).map(|i| format!("{prefix}-{i}")).collect();
    let groups: Vec<&str> = groups_owned.iter().map(String::as_str).collect();
    kafka::create_topic(source, topic, partitions).await?;
    produce(source, topic, partitions, 50, "m1").await?;
    let mut mm = start_mirrormaker(world, (a, b), topic, &format!("{prefix}-.*"), 50).await?;

    let mut commits = BTreeMap::new();
    for (g, offsets, meta) in [
        (groups[0], vec![(0, 10), (1, 49)], "mm-meta"),
        (groups[1], vec![(0, 50), (1, 1)], ""),
        (groups[2], vec![(0, 0)], ""),
    ] {
        commit(source, g, topic, &offsets, meta)?;
        for (p, o) in offsets {
            commits.insert((g.to_string(), remote.clone(), p), o);
        }
    }
    wait_checkpointed(target, &cps_topic, &commits, false, || mm.log_text()).await?;
    produce(source, topic, partitions, 30, "m2").await?;
    commit(source, groups[0], topic, &[(0, 65), (1, 79)], "mm-meta")?;
    commits.insert((groups[0].to_string(), remote.clone(), 0), 65);
    commits.insert((groups[0].to_string(), remote.clone(), 1), 79);
    wait_checkpointed(target, &cps_topic, &commits, false, || mm.log_text()).await?;
    // Several checkpoint intervals (1 s) and offset flushes (1 s) for what MirrorMaker emits
    // after the last commit.
    tokio::time::sleep(Duration::from_secs(8)).await;
    mm.stop()?;

    // MirrorMaker's records through our decoder and through its own formatter agree.
    let cps_now = checkpoints(target, &cps_topic)?;
    let java: Vec<mm2::JavaCheckpoint> = mm2::format(
        &world.repo_root,
        "checkpoint",
        target,
        &cps_topic,
        cps_now.len(),
    )?
    .iter()
    .map(|l| mm2::parse_checkpoint(l))
    .collect::<Result<_>>()?;
    ensure!(
        java.len() == cps_now.len()
            && java.iter().zip(&cps_now).all(|(j, c)| j.group == c.group
                && j.topic == c.topic_partition.topic
                && j.partition == c.topic_partition.partition
                && j.upstream_offset == c.upstream_offset
                && j.downstream_offset == c.downstream_offset
                && j.metadata == c.metadata),
        "CheckpointFormatter {java:#?}\nours {cps_now:#?}"
    );
    println!(
        "MirrorMaker wrote {} checkpoints; ours decodes them as its formatter does",
        cps_now.len()
    );
    for ((g, t, p), up) in &commits {
        let last = cps_now.iter().rev().find(|c| {
            &c.group == g && &c.topic_partition.topic == t && c.topic_partition.partition == *p
        });
        println!(
            "  {g} {t}-{p}: committed {up}, MirrorMaker's latest checkpoint {}",
            last.map(|c| format!("{}->{}", c.upstream_offset, c.downstream_offset))
                .unwrap_or_else(|| "none".into())
        );
    }

    let flow = format!(
        "source: {{alias: {a}, bootstrapServers: '{source}'}}\n\
         target: {{alias: {b}, bootstrapServers: '{target}'}}\n\
         topics: ['{topic}']\n\
         groups: ['{prefix}-.*']\n\
         replicationPolicy: {{type: Prefix, separator: '_'}}\n"
    );
    let flow_file = write_flow(&unique("iopmm-flow"), &flow)?;
    let rcu = mm2::remote_cluster_utils(
        &world.repo_root,
        target,
        a,
        &groups,
        &["replication.policy.separator=_"],
    )?;
    let mf = mm2::mirrorflow_translate(&world.repo_root, &flow_file, &groups)?;
    let what = "mirrorflow translate";
    let decoded = latest_by_group(&cps_now, &groups);
    ensure!(
        rcu == decoded,
        "RemoteClusterUtils {rcu:?}\nlatest checkpoints {decoded:?}"
    );
    println!("translated positions of MirrorMaker's checkpoints ({what} vs RemoteClusterUtils):");
    print_positions(what, &mf);
    print_positions("RemoteClusterUtils", &rcu);
    ensure!(rcu == mf, "RemoteClusterUtils {rcu:?}\n{what} {mf:?}");
    ensure!(
        rcu.values().all(|p| !p.is_empty()),
        "a group without translated offsets: {rcu:?}"
    );
    Ok(())
}

/// Runs the CLI; (exit status, stdout as JSON).
fn cli_json(world: &World, args: &[&str]) -> Result<(i32, serde_json::Value)> {
    let out = std::process::Command::new(mirrorflow_e2e::replicator::binary(&world.repo_root))
        .args(args)
        .output()
        .context("running mirrorflow (cargo build -p mirrorflow)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&stdout).with_context(|| {
        format!(
            "mirrorflow {args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok((out.status.code().unwrap_or(-1), json))
}

/// Values of every record of `topic`, per partition, read committed from the start.
fn values_of(bootstrap: &str, topic: &str, partitions: i32) -> Result<Vec<Vec<String>>> {
    (0..partitions)
        .map(|p| {
            Ok(kafka::read_partition(bootstrap, topic, p)?
                .into_iter()
                .map(|(_, _, v)| String::from_utf8_lossy(&v.unwrap_or_default()).into_owned())
                .collect())
        })
        .collect()
}

#[tokio::test]
async fn our_flow_takes_over_from_a_killed_mirrormaker_without_copying_again() -> Result<()> {
    let world = World::from_env()?;
    let (a, b) = (unique("ta"), unique("tb"));
    let topic = unique("iopto");
    let outcome = takeover(&world, &a, &b, &topic).await;
    cleanup(&world, &[&a, &b, &topic]).await;
    outcome
}

/// MirrorMaker replicates and is killed while records keep coming (so it copied records after
/// its last offset flush); `mirrorflow takeover` positions the flow where MirrorMaker's copies
/// end and the flow copies the rest: every source record on the target exactly once, the
/// group's checkpoints never go back across the switch, and a drill of the group skips nothing.
async fn takeover(world: &World, a: &str, b: &str, topic: &str) -> Result<()> {
    let (source, target) = (&world.source_bootstrap, &world.target_bootstrap);
    let partitions = 2;
    let remote = format!("{a}_{topic}");
    let cps_topic = format!("{a}_checkpoints_internal");
    let group = unique("iopto-g");
    kafka::create_topic(source, topic, partitions).await?;
    produce(source, topic, partitions, 100, "t1").await?;
    let mut mm = start_mirrormaker(world, (a, b), topic, &group, 100).await?;
    commit(source, &group, topic, &[(0, 60), (1, 80)], "")?;
    let mut commits = BTreeMap::new();
    commits.insert((group.clone(), remote.clone(), 0), 60);
    commits.insert((group.clone(), remote.clone(), 1), 80);
    wait_checkpointed(target, &cps_topic, &commits, false, || mm.log_text()).await?;

    // Records keep coming; MirrorMaker dies in the middle, without a last offset flush.
    let writer = {
        let source = source.clone();
        let topic = topic.to_string();
        tokio::spawn(async move {
            for i in 0..40 {
                produce(&source, &topic, partitions, 5, &format!("t2-{i}")).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    mm.kill()?;
    writer.await??;

    let observe = format!(
        "source: {{alias: {a}, bootstrapServers: '{source}'}}\n\
         target: {{alias: {b}, bootstrapServers: '{target}'}}\n\
         topics: ['{topic}']\n\
         groups: ['{group}']\n\
         replicationPolicy: {{type: Prefix, separator: '_'}}\n\
         heartbeats: {{enabled: false}}\n"
    );
    let observe_file = write_flow(
        &unique("iopto-observe"),
        &format!("mode: Observe\n{observe}"),
    )?;
    let file = observe_file.display().to_string();
    let (code, dry) = cli_json(world, &["takeover", "--flow-file", &file, "-o", "json"])?;
    let rows = dry["partitions"].as_array().cloned().unwrap_or_default();
    // Both partitions of the topic, and the heartbeats topic MirrorMaker copied as well.
    ensure!(
        code == 0
            && rows.iter().filter(|r| r["topic"] == topic).count() == 2
            && rows.iter().all(|r| r["action"] == "write"),
        "takeover dry run: exit {code}, {dry:#}"
    );
    let (code, applied) = cli_json(
        world,
        &["takeover", "--flow-file", &file, "--apply", "-o", "json"],
    )?;
    let rows = applied["partitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(
        code == 0 && rows.iter().all(|r| r["action"] == "written"),
        "takeover --apply: exit {code}, {applied:#}"
    );
    let bound: i64 = rows
        .iter()
        .filter_map(|r| r["duplicatesAtMost"].as_i64())
        .sum();
    for r in &rows {
        println!(
            "takeover {}[{}]: MirrorMaker's offset {}, resume at {}, {} records copied after its last flush not copied again",
            r["topic"], r["partition"], r["mm2Offset"], r["resumeAt"], r["foundAfterFlush"]
        );
    }

    // The flow replicates from there.
    let replicate = format!("{observe}sourceLoop: {{topicsRefreshInterval: 1s}}\n");
    let replicate_file = write_flow(&unique("iopto-replicate"), &replicate)?;
    let port = free_port()?;
    let mut r = Replicator::start(&world.repo_root, &unique("iopto-ours"), &replicate, port)?;
    produce(source, topic, partitions, 20, "t3").await?;
    let source_values = values_of(source, topic, partitions)?;
    let want: Vec<i64> = source_values.iter().map(|v| v.len() as i64).collect();
    eventually("the flow's copy", WAIT, || async {
        let ends = ends(target, &remote, partitions)?;
        Ok(ends
            .iter()
            .zip(&want)
            .all(|(have, want)| have >= want)
            .then_some(()))
    })
    .await
    .with_context(|| r.log_text())?;
    let copied = values_of(target, &remote, partitions)?;
    for (p, (src, tgt)) in source_values.iter().zip(&copied).enumerate() {
        let distinct: std::collections::BTreeSet<&String> = tgt.iter().collect();
        let lost = src.iter().filter(|v| !distinct.contains(v)).count();
        let duplicates = tgt.len() - distinct.len();
        println!(
            "partition {p}: {} source records, {} on the target, {lost} lost, {duplicates} duplicates",
            src.len(),
            tgt.len()
        );
        ensure!(lost == 0, "records lost in partition {p}");
        ensure!(
            duplicates as i64 <= bound,
            "{duplicates} duplicates in partition {p}, more than the {bound} the takeover allowed"
        );
    }

    // Our checkpoints continue MirrorMaker's, never below them.
    commit(source, &group, topic, &[(0, 250), (1, 270)], "")?;
    let mut commits = BTreeMap::new();
    commits.insert((group.clone(), remote.clone(), 0), 250);
    commits.insert((group.clone(), remote.clone(), 1), 270);
    wait_checkpointed(target, &cps_topic, &commits, true, || r.log_text()).await?;
    let history = checkpoints(target, &cps_topic)?;
    for p in 0..partitions {
        let downs: Vec<i64> = history
            .iter()
            .filter(|c| c.group == group && c.topic_partition.partition == p)
            .map(|c| c.downstream_offset)
            .collect();
        ensure!(
            downs.windows(2).all(|w| w[0] <= w[1]),
            "checkpoints of partition {p} went back: {downs:?}"
        );
    }
    let (code, drill) = cli_json(
        world,
        &[
            "drill",
            "--flow-file",
            &replicate_file.display().to_string(),
            "--group",
            &group,
            "-o",
            "json",
        ],
    )?;
    ensure!(
        code == 0 && drill["groups"][0]["verdict"] == "pass",
        "a drill after the takeover: exit {code}, {drill:#}"
    );
    r.stop(Duration::from_secs(10));
    Ok(())
}
