//! The failover CLI (`mirrorflow translate`, `failover`, `failback`, `kubectl mirrorflow`)
//! against the world's real Kafka clusters and apiserver, with our replicator copying.
//!
//! The scenario: a flow from the world's source (alias `a`) to its target (alias `b`) with a
//! pre-filled remote topic (target offsets = source offsets + `SHIFT`), groups committing on the
//! source, then: `translate` equals the checkpoints topic; `failover` reports what it would do
//! and its re-read counts; `failover --apply` commits and a consumer on the target resumes on the
//! next record; a group with members on the target is refused; `failback` maps the group's
//! progress on the remote topic back to the original topic exactly.
//!
//! Needs `target/debug/mirrorflow` built (`cargo build -p mirrorflow`). Never stops a broker.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mirrorflow::mm2::{Checkpoint, TopicPartition};
use mirrorflow_e2e::kafka::commit;
use mirrorflow_e2e::replicator::{Replicator, binary};
use mirrorflow_e2e::{World, eventually, kafka, run, run_with_input, unique};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Value, json};

/// Filler records written to the remote topic before the flow starts.
const SHIFT: i64 = 5;
const RECORDS: i64 = 100;
const PARTITIONS: i32 = 2;
const WAIT: Duration = Duration::from_secs(90);

/// A CLI run: exit code, stdout, stderr.
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Result<Value> {
        serde_json::from_str(&self.stdout).with_context(|| {
            format!(
                "stdout is not JSON (exit {}): {}\nstderr: {}",
                self.code, self.stdout, self.stderr
            )
        })
    }
}

fn cli_at(program: &Path, args: &[&str], path_prefix: Option<&Path>) -> Result<Out> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    if let Some(dir) = path_prefix {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", dir.display()));
    }
    let out = cmd
        .output()
        .with_context(|| format!("running {} (cargo build -p mirrorflow)", program.display()))?;
    Ok(Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn cli(world: &World, args: &[&str]) -> Result<Out> {
    cli_at(&binary(&world.repo_root), args, None)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Newest checkpoint per (group, topic, partition) of the groups starting with `prefix`, read
/// and decoded here independently of the CLI's reader.
fn checkpoints(
    bootstrap: &str,
    topic: &str,
    prefix: &str,
) -> Result<BTreeMap<(String, TopicPartition), Checkpoint>> {
    let mut out = BTreeMap::new();
    if !kafka::topics(bootstrap)?.contains(topic) {
        return Ok(out);
    }
    for (_, key, value) in kafka::read_partition(bootstrap, topic, 0)? {
        let (Some(k), Some(v)) = (key, value) else {
            bail!("a null key or value in {topic}");
        };
        let cp = Checkpoint::decode(&k, &v).context("decoding a checkpoint")?;
        if cp.group.starts_with(prefix) {
            out.insert((cp.group.clone(), cp.topic_partition.clone()), cp);
        }
    }
    Ok(out)
}

/// The JSON `translate` must print for these checkpoints.
fn expected_translate(
    source: &str,
    target: &str,
    cps: &BTreeMap<(String, TopicPartition), Checkpoint>,
    upstream: impl Fn(&str) -> String,
) -> Value {
    let mut groups: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for ((g, tp), cp) in cps {
        groups.entry(g).or_default().push(json!({
            "topic": tp.topic, "partition": tp.partition, "offset": cp.downstream_offset,
            "upstreamTopic": upstream(&tp.topic), "upstreamOffset": cp.upstream_offset,
            "metadata": cp.metadata,
        }));
    }
    json!({
        "source": source, "target": target,
        "groups": groups.into_iter().map(|(g, p)| json!({"group": g, "partitions": p})).collect::<Vec<_>>(),
    })
}

fn committed(bootstrap: &str, group: &str, topic: &str, partition: i32) -> Result<Option<i64>> {
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

/// An application consumer: joins `group` (subscribe), resumes at its committed offsets
/// (earliest without one, so a missing commit shows as a filler record), reads `per_partition`
/// records of every partition, commits them and leaves. Returns the values read per partition.
fn consume(
    bootstrap: &str,
    group: &str,
    topic: &str,
    per_partition: usize,
) -> Result<BTreeMap<i32, Vec<String>>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create()?;
    c.subscribe(&[topic])?;
    let mut read: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    let mut positions = TopicPartitionList::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = (0..PARTITIONS).all(|p| read.get(&p).is_some_and(|r| r.len() >= per_partition));
        if done {
            break;
        }
        ensure!(Instant::now() < deadline, "{group} read only {read:?}");
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let got = read.entry(m.partition()).or_default();
                if got.len() < per_partition {
                    got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
                    positions.add_partition_offset(
                        topic,
                        m.partition(),
                        Offset::Offset(m.offset() + 1),
                    )?;
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    c.commit(&positions, CommitMode::Sync)?;
    c.unsubscribe();
    Ok(read)
}

/// A consumer that stays a member of `group` on `topic` until dropped.
struct Member {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Member {
    fn join(bootstrap: &str, group: &str, topic: &str) -> Result<Member> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "latest")
            .set("session.timeout.ms", "6000")
            .create()?;
        c.subscribe(&[topic])?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let _ = c.poll(Duration::from_millis(200));
            }
            c.unsubscribe();
        });
        Ok(Member {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The partition of `group` in a failover or failback report.
fn part<'a>(report: &'a Value, group: &str, partition: i64) -> Result<&'a Value> {
    report["groups"]
        .as_array()
        .and_then(|gs| gs.iter().find(|g| g["group"] == group))
        .and_then(|g| g["partitions"].as_array())
        .and_then(|ps| ps.iter().find(|p| p["partition"] == partition))
        .with_context(|| format!("no {group}/{partition} in {report:#}"))
}

/// The consumer groups on a cluster, by name.
fn target_groups(bootstrap: &str) -> Result<Vec<String>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let list = c.fetch_group_list(None, Duration::from_secs(10))?;
    Ok(list.groups().iter().map(|g| g.name().to_string()).collect())
}

fn group_of<'a>(report: &'a Value, group: &str) -> Result<&'a Value> {
    report["groups"]
        .as_array()
        .and_then(|gs| gs.iter().find(|g| g["group"] == group))
        .with_context(|| format!("no group {group} in {report:#}"))
}

struct Scenario {
    world: World,
    a: String,
    b: String,
    topic: String,
    remote: String,
    /// A topic the applications write on the target after failing over.
    local: String,
    prefix: String,
    flow_file: PathBuf,
}

impl Scenario {
    async fn new() -> Result<Scenario> {
        let world = World::from_env()?;
        let a = unique("cfa");
        let b = unique("cfb");
        let topic = unique("cf-orders");
        let remote = format!("{a}.{topic}");
        let prefix = unique("cfg");
        let dir = std::env::temp_dir()
            .join("mirrorflow-e2e")
            .join(unique("cli"));
        std::fs::create_dir_all(&dir)?;
        let flow_file = dir.join("flow.yaml");
        // Heartbeats off: the `heartbeats` topics are shared by every test.
        std::fs::write(
            &flow_file,
            format!(
                "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\n\
                 metadata: {{name: cli, namespace: e2e}}\n\
                 spec:\n  source: {{alias: {a}, bootstrapServers: '{}'}}\n  \
                 target: {{alias: {b}, bootstrapServers: '{}'}}\n  topics: ['{topic}']\n  \
                 groups: ['{prefix}-.*']\n  \
                 sourceLoop: {{topicsRefreshInterval: 1s, offsetSyncInterval: 1s}}\n  \
                 heartbeats: {{enabled: false}}\n",
                world.source_bootstrap, world.target_bootstrap
            ),
        )?;
        Ok(Scenario {
            world,
            a,
            b,
            topic,
            remote,
            local: unique("cf-local"),
            prefix,
            flow_file,
        })
    }

    fn flow_args(&self) -> Vec<String> {
        vec!["--flow-file".into(), self.flow_file.display().to_string()]
    }

    fn run(&self, cmd: &str, extra: &[&str]) -> Result<Out> {
        let mut args: Vec<String> = vec![cmd.into()];
        args.extend(self.flow_args());
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&self.world, &refs)
    }

    fn group(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }
}

#[tokio::test]
async fn translate_failover_and_failback_against_our_replicator() -> Result<()> {
    let s = Scenario::new().await?;
    let outcome = scenario(&s).await;
    // Whatever happened: leave no topic of this test on the shared clusters.
    for bootstrap in [&s.world.source_bootstrap, &s.world.target_bootstrap] {
        if let Err(e) = delete_topics_naming(bootstrap, &[&s.a, &s.b, &s.topic, &s.local]).await {
            eprintln!("cleaning up topics on {bootstrap}: {e:#}");
        }
    }
    outcome
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
        .delete_topics(&refs, &rdkafka::admin::AdminOptions::new())
        .await?;
    Ok(())
}

async fn scenario(s: &Scenario) -> Result<()> {
    let (src, tgt) = (
        s.world.source_bootstrap.clone(),
        s.world.target_bootstrap.clone(),
    );
    kafka::create_topic(&src, &s.topic, PARTITIONS).await?;
    kafka::create_topic(&tgt, &s.remote, PARTITIONS).await?;
    let ps = kafka::producer(&src, Duration::from_secs(30))?;
    let pt = kafka::producer(&tgt, Duration::from_secs(30))?;
    for p in 0..PARTITIONS {
        for i in 0..SHIFT {
            pt.send(
                FutureRecord::to(&s.remote)
                    .partition(p)
                    .key("f")
                    .payload(&format!("filler-{i}")),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
        }
        for i in 0..RECORDS {
            ps.send(
                FutureRecord::to(&s.topic)
                    .partition(p)
                    .key("k")
                    .payload(&format!("p{p}-{i}")),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
        }
    }
    let (g1, g2, g3) = (s.group("one"), s.group("two"), s.group("three"));
    commit(&src, &g1, &s.topic, &[(0, 30), (1, 60)])?;
    commit(&src, &g2, &s.topic, &[(0, 10), (1, 20)])?;
    commit(&src, &g3, &s.topic, &[(0, 50)])?;
    let flow_yaml = std::fs::read_to_string(&s.flow_file)?;
    let port = free_port()?;
    let mut replicator = Replicator::start(
        &s.world.repo_root,
        &format!("cli-{}-{port}", s.a),
        &flow_yaml,
        port,
    )?;
    replicator.wait_ready().await?;

    // 1. Checkpoints of every commit, exact (target = source + SHIFT).
    let cps_topic = format!("{}.checkpoints.internal", s.a);
    let want: Vec<(String, i32, i64)> = vec![
        (g1.clone(), 0, 30),
        (g1.clone(), 1, 60),
        (g2.clone(), 0, 10),
        (g2.clone(), 1, 20),
        (g3.clone(), 0, 50),
    ];
    let started = Instant::now();
    let cps = eventually("exact checkpoints of every commit", WAIT, || async {
        let cps = checkpoints(&tgt, &cps_topic, &s.prefix)?;
        let all = want.iter().all(|(g, p, c)| {
            cps.get(&(g.clone(), TopicPartition::new(s.remote.clone(), *p)))
                .is_some_and(|cp| cp.upstream_offset == *c && cp.downstream_offset == c + SHIFT)
        });
        if all {
            Ok(Some(cps))
        } else {
            bail!("checkpoints so far: {cps:?}")
        }
    })
    .await
    .with_context(|| replicator.log_text())?;
    println!(
        "exact checkpoints of 5 commits after {:?}",
        started.elapsed()
    );

    // 2. translate = the checkpoints topic, newest per key (RemoteClusterUtils).
    let t = Instant::now();
    let out = s.run("translate", &["--output", "json"])?;
    println!("translate took {:?}", t.elapsed());
    ensure!(out.code == 0, "translate failed: {}", out.stderr);
    let topic = s.topic.clone();
    let expected = expected_translate(&s.a, &s.b, &cps, |_| topic.clone());
    ensure!(
        out.json()? == expected,
        "translate printed\n{}\nexpected\n{expected:#}",
        out.stdout
    );
    let one = s
        .run("translate", &["--group", &g2, "-o", "json"])?
        .json()?;
    ensure!(
        one["groups"].as_array().map(Vec::len) == Some(1)
            && one["groups"][0]["group"] == g2.as_str(),
        "{one:#}"
    );
    let table = s.run("translate", &["--group", &g1])?;
    println!("{}", table.stdout);
    ensure!(
        table.stdout.contains(&format!("{}", 30 + SHIFT)),
        "{}",
        table.stdout
    );

    // 3. Source consumers stop; a commit the checkpoint loop never sees (replicator stopped).
    replicator.stop(Duration::from_secs(10));
    commit(&src, &g3, &s.topic, &[(0, 70)])?;
    let dry = s.run("failover", &["--all-groups", "-o", "json"])?;
    ensure!(
        dry.code == 0,
        "dry run exit {}: {}{}",
        dry.code,
        dry.stdout,
        dry.stderr
    );
    let dry = dry.json()?;
    ensure!(dry["dryRun"] == true);
    for (g, p, c) in &want {
        let pp = part(&dry, g, i64::from(*p))?;
        ensure!(
            pp["offset"] == c + SHIFT && pp["action"] == "commit",
            "{pp:#}"
        );
    }
    let g1p0 = part(&dry, &g1, 0)?;
    ensure!(g1p0["reread"] == json!({"min": 0, "max": 0}), "{g1p0:#}");
    let g3p0 = part(&dry, &g3, 0)?;
    ensure!(
        g3p0["sourceCommitted"] == 70 && g3p0["reread"] == json!({"min": 20, "max": 20}),
        "a commit 20 records past the checkpoint re-reads exactly 20: {g3p0:#}"
    );
    println!(
        "failover dry run: {g3} re-reads {} records (20 committed after its checkpoint)",
        g3p0["reread"]
    );
    ensure!(
        committed(&tgt, &g1, &s.remote, 0)?.is_none(),
        "a dry run committed"
    );
    println!("{}", s.run("failover", &["--all-groups"])?.stdout);

    // 3b. The same failover rehearsed in drill groups and checked record by record: nothing is
    // skipped, g3 re-reads the 20 records it committed after its checkpoint, everything is
    // copied; the real groups are untouched and the drill groups are gone afterwards.
    let drill = s.run("drill", &["--all-groups", "-o", "json"])?;
    ensure!(
        drill.code == 0,
        "drill exit {}: {}{}",
        drill.code,
        drill.stdout,
        drill.stderr
    );
    let dj = drill.json()?;
    for (g, p, _) in &want {
        let dp = part(&dj, g, i64::from(*p))?;
        let reread = if *g == g3 { 20 } else { 0 };
        ensure!(
            dp["skipped"] == 0 && dp["reread"] == reread && dp["notCopied"] == 0,
            "{dp:#}"
        );
        ensure!(group_of(&dj, g)?["verdict"] == "pass", "{dj:#}");
    }
    println!(
        "drill: {g3} re-reads {} records, first records read {} ms after the drill commit",
        part(&dj, &g3, 0)?["reread"],
        group_of(&dj, &g3)?["firstRecordsMs"]
    );
    ensure!(
        committed(&tgt, &g1, &s.remote, 0)?.is_none()
            && committed(&src, &g3, &s.topic, 0)? == Some(70),
        "the drill changed a real group"
    );
    ensure!(
        target_groups(&tgt)?
            .iter()
            .all(|g| !g.starts_with("mirrorflow-drill.")),
        "drill groups left behind: {:?}",
        target_groups(&tgt)?
    );
    println!("{}", s.run("drill", &["--group", &g1])?.stdout);

    // A source that does not answer: re-reads unknown, checkpoint ages still shown.
    let dead_source = s.flow_file.with_file_name("dead-source.yaml");
    std::fs::write(&dead_source, flow_yaml.replace(src.as_str(), "127.0.0.1:1"))?;
    let dead = cli(
        &s.world,
        &[
            "failover",
            "--flow-file",
            &dead_source.display().to_string(),
            "--group",
            &g1,
            "-o",
            "json",
        ],
    )?;
    ensure!(
        dead.code == 0,
        "dead source exit {}: {}{}",
        dead.code,
        dead.stdout,
        dead.stderr
    );
    let dead = dead.json()?;
    let d = part(&dead, &g1, 0)?;
    ensure!(
        dead["sourceError"].is_string()
            && d["reread"].is_null()
            && d["checkpointAgeMs"].is_i64()
            && d["offset"] == 30 + SHIFT,
        "{dead:#}"
    );
    println!("source unreachable: {}", dead["sourceError"]);

    // A group that rewound on the source after its checkpoint: failing over would skip.
    commit(&src, &g3, &s.topic, &[(0, 40)])?;
    let skip = s.run("failover", &["--group", &g3, "--apply", "-o", "json"])?;
    let sj = skip.json()?;
    let sp = part(&sj, &g3, 0)?;
    ensure!(
        skip.code == 3 && sp["skips"] == 10 && sp["action"] == "refused",
        "a failover that skips must be refused: {sj:#}"
    );
    ensure!(
        committed(&tgt, &g3, &s.remote, 0)?.is_none(),
        "a refused skip was committed"
    );
    println!("rewound group: {}", sp["reason"]);
    // The drill finds the same 10 records by reading them, and says so in its exit status.
    let drill = s.run("drill", &["--group", &g3, "-o", "json"])?;
    let dj = drill.json()?;
    let dp = part(&dj, &g3, 0)?;
    ensure!(
        drill.code == 3 && dp["skipped"] == 10 && group_of(&dj, &g3)?["verdict"] == "skips",
        "a drill of a group a failover would skip: exit {}, {dj:#}",
        drill.code
    );

    // 4. failover --apply: the target group resumes on the next record.
    let applied = s.run("failover", &["--group", &g1, "--apply", "-o", "json"])?;
    ensure!(
        applied.code == 0,
        "apply exit {}: {}{}",
        applied.code,
        applied.stdout,
        applied.stderr
    );
    ensure!(
        group_of(&applied.json()?, &g1)?["action"] == "committed",
        "{}",
        applied.stdout
    );
    ensure!(committed(&tgt, &g1, &s.remote, 0)? == Some(30 + SHIFT));
    ensure!(committed(&tgt, &g1, &s.remote, 1)? == Some(60 + SHIFT));
    let read = consume(&tgt, &g1, &s.remote, 15)?;
    let first: Vec<_> = read.values().map(|v| v[0].clone()).collect();
    ensure!(
        first == ["p0-30", "p1-60"],
        "resumed at {first:?}: skipped or re-read records"
    );
    println!("failover --apply: {g1} resumed on the target at {first:?}: 0 skipped, 0 re-read");
    // Applying again changes nothing (the group moved on past the checkpoint: kept, refused).
    let again = s.run("failover", &["--group", &g1, "--apply", "-o", "json"])?;
    ensure!(
        again.code == 3,
        "re-apply over newer target commits must refuse: {}",
        again.stdout
    );
    ensure!(
        committed(&tgt, &g1, &s.remote, 0)? == Some(45 + SHIFT),
        "moved a group backwards"
    );

    // 5. A group with a member on the target is refused.
    let member = Member::join(&tgt, &g2, &s.remote)?;
    eventually(
        "g2 has a member on the target",
        Duration::from_secs(30),
        || async { Ok((kafka::group_members(&tgt, &g2)? > 0).then_some(())) },
    )
    .await?;
    let refused = s.run("failover", &["--group", &g2, "--apply", "-o", "json"])?;
    let rj = refused.json()?;
    ensure!(
        refused.code == 3 && group_of(&rj, &g2)?["action"] == "refused",
        "{}",
        refused.stdout
    );
    ensure!(
        committed(&tgt, &g2, &s.remote, 0)?.is_none(),
        "a refused group was committed"
    );
    println!("active group: {}", group_of(&rj, &g2)?["message"]);
    let forced = s.run(
        "failover",
        &["--group", &g2, "--apply", "--force", "-o", "json"],
    )?;
    println!(
        "active group with --force: exit {}, {}",
        forced.code,
        forced
            .json()
            .map(|j| group_of(&j, &g2)
                .map(|g| g["message"].clone())
                .unwrap_or_default())
            .unwrap_or_default()
    );
    drop(member);
    eventually("g2 has no member", Duration::from_secs(30), || async {
        Ok((kafka::group_members(&tgt, &g2)? == 0).then_some(()))
    })
    .await?;
    // 5b. So is a member of the consumer protocol (KIP-848), which the classic group
    // description reports as a dead group without members.
    let java = kafka::JavaConsumer::join(&tgt, &g2, &s.remote)?;
    eventually(
        "g2 has a consumer-protocol member on the target",
        Duration::from_secs(60),
        || async { Ok((kafka::group_members(&tgt, &g2)? > 0).then_some(())) },
    )
    .await?;
    let refused = s.run("failover", &["--group", &g2, "--apply", "-o", "json"])?;
    let rj = refused.json()?;
    let g2_plan = group_of(&rj, &g2)?;
    ensure!(
        refused.code == 3
            && g2_plan["action"] == "refused"
            && g2_plan["targetGroup"]["protocol"] == "consumer",
        "{}",
        refused.stdout
    );
    ensure!(
        committed(&tgt, &g2, &s.remote, 0)?.is_none(),
        "a group with a consumer-protocol member was committed"
    );
    drop(java);
    eventually(
        "g2's consumer-protocol member left",
        Duration::from_secs(60),
        || async { Ok((kafka::group_members(&tgt, &g2)? == 0).then_some(())) },
    )
    .await?;
    let ok = s.run("failover", &["--group", &g2, "--apply", "-o", "json"])?;
    ensure!(
        ok.code == 0,
        "after the member left: {}{}",
        ok.stdout,
        ok.stderr
    );
    ensure!(committed(&tgt, &g2, &s.remote, 1)? == Some(20 + SHIFT));

    // 6. failback: g1 consumed 15 records per partition on the target; map them back. Its
    // producers failed over too and wrote a topic on the target, which g1 also consumed: only a
    // reverse flow can move that, and failback says so.
    // (Its own name: another test's identity flow may be copying every source topic, this
    // one's too, onto the target.)
    kafka::create_topic(&tgt, &s.local, 1).await?;
    commit(&tgt, &g1, &s.local, &[(0, 0)])?;
    let fb = s.run("failback", &["--group", &g1, "-o", "json"])?;
    ensure!(
        fb.code == 0,
        "failback dry run exit {}: {}{}",
        fb.code,
        fb.stdout,
        fb.stderr
    );
    let fb = fb.json()?;
    for (p, c) in [(0, 45), (1, 75)] {
        let pp = part(&fb, &g1, p)?;
        ensure!(
            pp["remoteCommitted"] == c + SHIFT
                && pp["offset"] == c
                && pp["exact"] == true
                && pp["action"] == "commit",
            "failback of partition {p}: {pp:#}"
        );
    }
    // Contains, not equals: another test's flow syncing every group could commit g1 on its
    // own remote topics of this source topic.
    ensure!(
        group_of(&fb, &g1)?["otherTopics"]
            .as_array()
            .is_some_and(|t| t.contains(&json!(s.local))),
        "{fb:#}"
    );
    // g2 sits exactly at its failover offsets: back to its source commits.
    let fb2 = s.run("failback", &["--group", &g2, "-o", "json"])?.json()?;
    let p1 = part(&fb2, &g2, 1)?;
    ensure!(
        p1["offset"] == 20 && p1["exact"] == true && p1["action"] == "unchanged",
        "{p1:#}"
    );
    println!("{}", s.run("failback", &["--group", &g1])?.stdout);
    let fb = s.run("failback", &["--group", &g1, "--apply", "-o", "json"])?;
    ensure!(
        fb.code == 0,
        "failback --apply exit {}: {}{}",
        fb.code,
        fb.stdout,
        fb.stderr
    );
    ensure!(committed(&src, &g1, &s.topic, 0)? == Some(45));
    ensure!(committed(&src, &g1, &s.topic, 1)? == Some(75));
    let back = consume(&src, &g1, &s.topic, 1)?;
    let first: Vec<_> = back.values().map(|v| v[0].clone()).collect();
    ensure!(first == ["p0-45", "p1-75"], "failback resumed at {first:?}");
    println!("failback --apply: {g1} resumed on the source at {first:?}: 0 skipped, 0 re-read");
    Ok(())
}

/// `kubectl mirrorflow translate --name` through a symlink on PATH, reading the MirrorFlow from
/// the world's apiserver; checkpoints are written by the test itself (no replicator needed).
#[tokio::test]
async fn kubectl_plugin_reads_the_flow_from_the_apiserver() -> Result<()> {
    let world = World::from_env()?;
    let dir = std::env::temp_dir()
        .join("mirrorflow-e2e")
        .join(unique("plugin"));
    std::fs::create_dir_all(&dir)?;
    let link = dir.join("kubectl-mirrorflow");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(std::fs::canonicalize(binary(&world.repo_root))?, &link)?;

    let listed = cli_at(Path::new("kubectl"), &["plugin", "list"], Some(&dir))?;
    ensure!(
        listed.stdout.contains(&link.display().to_string()),
        "kubectl plugin list: {}{}",
        listed.stdout,
        listed.stderr
    );
    let help = cli_at(
        Path::new("kubectl"),
        &["mirrorflow", "translate", "--help"],
        Some(&dir),
    )?;
    ensure!(
        help.code == 0 && help.stdout.contains("Usage: kubectl mirrorflow translate"),
        "{}{}",
        help.stdout,
        help.stderr
    );

    if run("kubectl", &["get", "crd", "mirrorflows.mirrorflow.io"]).is_err() {
        let crd = world.repo_root.join("crds/mirrorflows.mirrorflow.io.yaml");
        run("kubectl", &["apply", "-f", &crd.display().to_string()])?;
    }
    let ns = unique("cf-plugin");
    run("kubectl", &["create", "namespace", &ns])?;
    let (a, b) = (unique("cpa"), unique("cpb"));
    let outcome = plugin_checks(&world, &dir, &ns, &a, &b).await;
    if let Err(e) = delete_topics_naming(&world.target_bootstrap, &[&a]).await {
        eprintln!("cleaning up topics: {e:#}");
    }
    let _ = run("kubectl", &["delete", "namespace", &ns, "--wait=false"]);
    outcome
}

async fn plugin_checks(world: &World, dir: &Path, ns: &str, a: &str, b: &str) -> Result<()> {
    let group = unique("cpg");
    run_with_input(
        "kubectl",
        &["apply", "-n", ns, "-f", "-"],
        &format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: plug}}\n\
             spec:\n  source: {{alias: {a}, bootstrapServers: '{}'}}\n  \
             target: {{alias: {b}, bootstrapServers: '{}'}}\n---\n\
             apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: locked}}\n\
             spec:\n  source: {{alias: {a}, bootstrapServers: '{}'}}\n  \
             target: {{alias: {b}, bootstrapServers: '{}', sasl: {{mechanism: PLAIN, \
             usernameSecretRef: {{name: absent, key: user}}, passwordSecretRef: {{name: absent, key: pw}}}}}}\n",
            world.source_bootstrap,
            world.target_bootstrap,
            world.source_bootstrap,
            world.target_bootstrap
        ),
    )?;
    // Checkpoints as a replicator writes them; an older one of the same key comes first.
    let topic = format!("{a}.checkpoints.internal");
    kafka::create_topic(&world.target_bootstrap, &topic, 1).await?;
    let producer = kafka::producer(&world.target_bootstrap, Duration::from_secs(30))?;
    for (p, up, down) in [(0, 5, 9), (0, 7, 11), (1, 3, 4)] {
        let rec = Checkpoint {
            group: group.clone(),
            topic_partition: TopicPartition::new(format!("{a}.t"), p),
            upstream_offset: up,
            downstream_offset: down,
            metadata: String::new(),
        }
        .encode()?;
        producer
            .send(
                FutureRecord::to(&topic)
                    .partition(0)
                    .key(&rec.key)
                    .payload(&rec.value),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    let kubectl = |args: &[&str]| {
        let mut all = vec!["mirrorflow"];
        all.extend_from_slice(args);
        cli_at(Path::new("kubectl"), &all, Some(dir))
    };
    let out = kubectl(&["translate", "--name", "plug", "-n", ns, "-o", "json"])?;
    ensure!(
        out.code == 0,
        "kubectl mirrorflow translate: {}{}",
        out.stdout,
        out.stderr
    );
    let want = json!({"source": a, "target": b, "groups": [{"group": group, "partitions": [
        {"topic": format!("{a}.t"), "partition": 0, "offset": 11, "upstreamTopic": "t", "upstreamOffset": 7, "metadata": ""},
        {"topic": format!("{a}.t"), "partition": 1, "offset": 4, "upstreamTopic": "t", "upstreamOffset": 3, "metadata": ""},
    ]}]});
    ensure!(out.json()? == want, "got {}", out.stdout);
    println!(
        "kubectl mirrorflow translate --name plug -n {ns}:\n{}",
        kubectl(&["translate", "--name", "plug", "-n", ns])?.stdout
    );

    // Clear errors, exit 1, no panic.
    let missing = kubectl(&["translate", "--name", "nope", "-n", ns])?;
    ensure!(
        missing.code == 1
            && missing.stderr.contains("--name")
            && missing.stderr.contains("no MirrorFlow 'nope'"),
        "{}",
        missing.stderr
    );
    let locked = kubectl(&["translate", "--name", "locked", "-n", ns])?;
    ensure!(
        locked.code == 1
            && locked.stderr.contains("spec.target.sasl.usernameSecretRef")
            && locked.stderr.contains("absent"),
        "{}",
        locked.stderr
    );
    // A Secret that did not opt in is not sent by the CLI either, whoever runs it (the
    // caller's kubeconfig may read every Secret).
    run_with_input(
        "kubectl",
        &["apply", "-n", ns, "-f", "-"],
        "apiVersion: v1\nkind: Secret\nmetadata: {name: absent}\n\
         stringData: {user: alice, pw: hunter2-secret}\n",
    )?;
    let refused = kubectl(&["translate", "--name", "locked", "-n", ns])?;
    ensure!(
        refused.code == 1
            && refused.stderr.contains("mirrorflow.io/allowed-flows")
            && !refused.stderr.contains("hunter2"),
        "{}",
        refused.stderr
    );
    // Credentials read from the API are used once the Secret allows it, never shown: the
    // world's brokers speak no SASL, so the connection fails, and the error must not carry
    // the password.
    run(
        "kubectl",
        &[
            "annotate",
            "secret",
            "absent",
            "-n",
            ns,
            "mirrorflow.io/allowed-flows=locked",
            "mirrorflow.io/allowed-destinations=127.0.0.1",
            "mirrorflow.io/allow-plaintext=true",
        ],
    )?;
    let sasl = kubectl(&["translate", "--name", "locked", "-n", ns])?;
    ensure!(
        sasl.code == 1 && !sasl.stderr.contains("hunter2") && !sasl.stdout.contains("hunter2"),
        "exit {}: {}{}",
        sasl.code,
        sasl.stdout,
        sasl.stderr
    );
    println!("with the Secret present: {}", sasl.stderr.trim());
    let both = kubectl(&["failover", "--name", "plug", "-n", ns])?;
    ensure!(
        both.code == 2 && both.stderr.contains("--group"),
        "{}",
        both.stderr
    );
    println!(
        "errors: {}\n{}\n{}",
        missing.stderr.trim(),
        locked.stderr.trim(),
        both.stderr.trim()
    );
    Ok(())
}
