//! The measuring side of `bench/run.sh`: it watches a replicator (ours or MirrorMaker 2) from
//! outside through the clusters, so both arms are measured the same way; apart from one
//! measuring arm (`passthrough`), it never replicates anything itself.
//!
//! - `watch-copy`: waits until target topics hold a pre-loaded data set; copy window, CPU
//!   seconds and peak RSS of the replicator process.
//! - `create-topics`: topics of the data sets (the brokers do not create topics on use).
//! - `verify` (`verify.rs`): which records of a `load-json` data set a copy holds, missing and
//!   twice; `leader`, `wait-in-sync`: a partition's leader, and every replica caught up (the
//!   leader changes of `--brokers3`).
//! - `init-group`: commits offset 0 for a group so it exists before a replicator lists groups.
//! - `load-json`: a data set of JSON-like records in lz4/zstd/... batches (`records.rs`).
//! - `pipe`: what the clusters allow, with clients added until the rate stops rising (`pipe.rs`).
//! - `codec`: the compression codecs of the batches a topic holds on a broker's disk;
//!   `delete-topics`: drops a measured copy (the disk is small).
//! - `wan-link` (`wan.rs`): a link of two TUN devices adding a round-trip time and a bandwidth
//!   cap between the replicators and the source broker's network namespace.
//! - `steady` (`steady.rs`): traffic at a fixed rate with a send stamp in a header; latency read on
//!   the target, checkpoint freshness (source commit -> checkpoint visible on the target) and the
//!   records a consumer would read again after failing over on the latest checkpoint.
//! - `init-groups`, `groups` (`groups.rs`): many groups committing on many partitions, and the
//!   freshness of their checkpoints.
//!
//! - `passthrough` (`passthrough/`): the one exception to "never replicates": an arm for the
//!   compressed scenario that copies record batches as they are, to measure what a copy costs
//!   without decoding and compressing every record again (not the product; see its module).
//!
//! Every figure is printed as one JSON object on stdout.

mod groups;
mod passthrough;
mod pipe;
mod records;
mod steady;
mod verify;
mod wan;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::json;

/// Kernel USER_HZ: the unit of utime/stime in /proc/<pid>/stat (fixed at 100 on Linux).
const USER_HZ: f64 = 100.0;

#[derive(Parser)]
#[command(about = "Measures a replicator from outside (bench/run.sh)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Waits until the topics on `bootstrap` hold `expect` records together; prints the copy
    /// window and the CPU seconds and peak RSS of process `pid`.
    WatchCopy {
        #[arg(long)]
        bootstrap: String,
        /// Each topic of the copy (repeat the flag).
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        #[arg(long)]
        expect: i64,
        /// The arm's process; repeat the flag for an arm of several (a flow's replicas): CPU
        /// and peak RSS are their sums.
        #[arg(long = "pid", required = true)]
        pids: Vec<u32>,
        #[arg(long, default_value_t = 900)]
        timeout_s: u64,
        /// Ends the watch, as incomplete (`"complete": false`), once the count has not moved
        /// for this long: a copy that lost records would otherwise be waited for until the
        /// timeout.
        #[arg(long)]
        stall_s: Option<u64>,
        /// Ends the watch, as incomplete, once the copy has run this long from its first
        /// record: the rate is what it copied in that window (a copy across a slow link).
        #[arg(long)]
        limit_s: Option<u64>,
        /// Adds the copied count once a second (`"timeline": [[seconds, records], ...]`).
        #[arg(long)]
        timeline: bool,
    },
    /// Creates topics (an existing one is left as it is).
    CreateTopics {
        #[arg(long)]
        bootstrap: String,
        #[arg(long, default_value_t = 8)]
        partitions: i32,
        #[arg(long, default_value_t = 1)]
        replication_factor: i32,
        topics: Vec<String>,
    },
    /// Reads a copy of a `load-json` data set back once its end offsets stop moving: records
    /// missing, copied twice, and (with `source`) where the missing ones are on the source.
    Verify {
        #[arg(long)]
        bootstrap: String,
        #[arg(long)]
        topic: String,
        /// The data set's record count (`seq` 0 to expect - 1).
        #[arg(long)]
        expect: u64,
        /// The end offsets must stay the same this long before the copy is read.
        #[arg(long, default_value_t = 5)]
        quiet_s: u64,
        #[arg(long)]
        source: Option<String>,
        #[arg(long)]
        source_topic: Option<String>,
    },
    /// Prints the node id leading a partition.
    Leader {
        #[arg(long)]
        bootstrap: String,
        #[arg(long)]
        topic: String,
        #[arg(long, default_value_t = 0)]
        partition: i32,
    },
    /// Waits until every replica of every partition of the cluster is in sync.
    WaitInSync {
        #[arg(long)]
        bootstrap: String,
        #[arg(long, default_value_t = 300)]
        timeout_s: u64,
    },
    /// Commits offset 0 on every partition of `topic` for `group`.
    InitGroup {
        #[arg(long)]
        bootstrap: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        group: String,
    },
    /// Produces `n` JSON-like records of `size` bytes in `codec` batches, the topics taking
    /// turns.
    LoadJson {
        #[arg(long)]
        bootstrap: String,
        /// Each topic (repeat the flag).
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        #[arg(long)]
        n: u64,
        #[arg(long, default_value_t = 1024)]
        size: usize,
        #[arg(long)]
        codec: String,
    },
    /// Parallel clients into the target and out of the source until one more adds nothing.
    Pipe {
        #[arg(long)]
        source: String,
        #[arg(long)]
        target: String,
        /// The pre-loaded data set on the source.
        #[arg(long)]
        topic: String,
        #[arg(long, default_value_t = 1024)]
        size: usize,
        #[arg(long, default_value_t = 8)]
        step_s: u64,
        #[arg(long, default_value_t = 4)]
        max_clients: usize,
        #[arg(long, default_value_t = 0.05)]
        min_gain: f64,
    },
    /// A link of two TUN devices adding a round-trip time and, optionally, a bandwidth cap
    /// (`wan.rs`); runs until killed.
    WanLink {
        /// The device left in this network namespace.
        #[arg(long)]
        near: String,
        /// The device the caller moves into the far side's namespace.
        #[arg(long)]
        far: String,
        #[arg(long)]
        rtt_ms: u64,
        /// Cap in MiB/s in each direction (none when absent).
        #[arg(long)]
        rate_mib_s: Option<f64>,
        /// The queue in front of the cap, in KiB; a packet that does not fit is dropped.
        #[arg(long, default_value_t = 4096)]
        queue_kib: u64,
    },
    /// Deletes topics (a missing one is fine).
    DeleteTopics {
        #[arg(long)]
        bootstrap: String,
        topics: Vec<String>,
    },
    /// Counts the record batches of each codec a topic holds on a broker's disk.
    Codec {
        /// The broker's `log.dirs`.
        #[arg(long)]
        data: std::path::PathBuf,
        #[arg(long)]
        topic: String,
    },
    /// Copies `topic`'s record batches as they are into `remote_topic` until killed (an arm
    /// of the compressed scenario, `oursp`: the cost of a copy without re-encoding).
    Passthrough {
        #[arg(long)]
        source: String,
        #[arg(long)]
        target: String,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        remote_topic: String,
        /// The product's fetch defaults below 25 ms of round trip.
        #[arg(long, default_value_t = 4 << 20)]
        max_bytes: i32,
        #[arg(long, default_value_t = 1 << 20)]
        partition_max_bytes: i32,
        /// Produce requests outstanding (librdkafka's max.in.flight is 5).
        #[arg(long, default_value_t = 5)]
        in_flight: usize,
    },
    /// Commits `offset` (default 0) for `groups` groups, group g on every partition of topic
    /// g mod topics.
    InitGroups {
        #[arg(long)]
        bootstrap: String,
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        #[arg(long)]
        groups: usize,
        #[arg(long)]
        group_prefix: String,
        #[arg(long, default_value_t = 0)]
        offset: i64,
    },
    /// Many groups committing (`groups.rs`); freshness of their checkpoints on the target.
    Groups {
        #[arg(long)]
        source: String,
        #[arg(long)]
        target: String,
        /// The source topics, in the order `init-groups` was given them.
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        /// What a source topic's name gets before it on the target (`<alias>.`).
        #[arg(long)]
        remote_prefix: String,
        #[arg(long)]
        checkpoints: String,
        #[arg(long)]
        groups: usize,
        #[arg(long)]
        group_prefix: String,
        #[arg(long, default_value_t = 60)]
        duration_s: u64,
        /// How often each group commits (Kafka's `auto.commit.interval.ms` default: 5 s).
        #[arg(long, default_value_t = 5000)]
        commit_every_ms: u64,
        #[arg(long, default_value_t = 75)]
        settle_s: u64,
        #[arg(long)]
        pid: Option<u32>,
    },
    /// Fixed-rate traffic; latency, checkpoint freshness and failover re-reads.
    Steady {
        #[arg(long)]
        source: String,
        #[arg(long)]
        target: String,
        /// The source topic (its partitions are all used).
        #[arg(long)]
        topic: String,
        /// Its copy on the target.
        #[arg(long)]
        remote: String,
        /// The checkpoints topic on the target (`<source alias>.checkpoints.internal`).
        #[arg(long)]
        checkpoints: String,
        /// The source group that consumes `topic` and commits every `commit_every_ms`.
        #[arg(long)]
        group: String,
        #[arg(long, default_value_t = 1000)]
        rate: u64,
        #[arg(long, default_value_t = 1024)]
        size: usize,
        #[arg(long, default_value_t = 60)]
        duration_s: u64,
        #[arg(long, default_value_t = 1000)]
        commit_every_ms: u64,
        /// After the traffic, how long to wait for the checkpoint of the group's final commit.
        #[arg(long, default_value_t = 75)]
        settle_s: u64,
        /// The replicator process, for its CPU seconds during the traffic.
        #[arg(long)]
        pid: Option<u32>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::WatchCopy {
            bootstrap,
            topics,
            expect,
            pids,
            timeout_s,
            stall_s,
            limit_s,
            timeline,
        } => watch_copy(
            &bootstrap,
            &topics,
            expect,
            &pids,
            timeout_s,
            Ends {
                stall: stall_s.map(Duration::from_secs),
                limit: limit_s.map(Duration::from_secs),
            },
            timeline,
        ),
        Cmd::CreateTopics {
            bootstrap,
            partitions,
            replication_factor,
            topics,
        } => create_topics_rf(&bootstrap, partitions, replication_factor, &topics),
        Cmd::Verify {
            bootstrap,
            topic,
            expect,
            quiet_s,
            source,
            source_topic,
        } => verify::verify(&verify::Verify {
            target: bootstrap,
            topic,
            expect,
            quiet: Duration::from_secs(quiet_s),
            source: source.zip(source_topic),
        }),
        Cmd::Leader {
            bootstrap,
            topic,
            partition,
        } => {
            println!("{}", verify::leader(&bootstrap, &topic, partition)?);
            Ok(())
        }
        Cmd::WaitInSync {
            bootstrap,
            timeout_s,
        } => verify::wait_in_sync(&bootstrap, Duration::from_secs(timeout_s)),
        Cmd::InitGroup {
            bootstrap,
            topic,
            group,
        } => init_group(&bootstrap, &topic, &group),
        Cmd::LoadJson {
            bootstrap,
            topics,
            n,
            size,
            codec,
        } => records::load_json(&bootstrap, &topics, n, size, &codec),
        Cmd::Passthrough {
            source,
            target,
            topic,
            remote_topic,
            max_bytes,
            partition_max_bytes,
            in_flight,
        } => passthrough::run(&passthrough::Options {
            source,
            target,
            topic,
            remote_topic,
            max_bytes,
            partition_max_bytes,
            in_flight,
        }),
        Cmd::InitGroups {
            bootstrap,
            topics,
            groups,
            group_prefix,
            offset,
        } => groups::init_groups(&bootstrap, &topics, groups, &group_prefix, offset),
        Cmd::Groups {
            source,
            target,
            topics,
            remote_prefix,
            checkpoints,
            groups,
            group_prefix,
            duration_s,
            commit_every_ms,
            settle_s,
            pid,
        } => groups::groups(&groups::Groups {
            source,
            target,
            topics,
            remote_prefix,
            checkpoints,
            groups,
            group_prefix,
            duration: Duration::from_secs(duration_s),
            commit_every: Duration::from_millis(commit_every_ms),
            settle: Duration::from_secs(settle_s),
            pid,
        }),
        Cmd::Pipe {
            source,
            target,
            topic,
            size,
            step_s,
            max_clients,
            min_gain,
        } => pipe::pipe(&pipe::Pipe {
            source,
            target,
            topic,
            size,
            step: Duration::from_secs(step_s),
            max_clients,
            min_gain,
        }),
        Cmd::WanLink {
            near,
            far,
            rtt_ms,
            rate_mib_s,
            queue_kib,
        } => wan::link(
            &near,
            &far,
            Duration::from_millis(rtt_ms),
            rate_mib_s,
            queue_kib,
        ),
        Cmd::DeleteTopics { bootstrap, topics } => topics
            .iter()
            .try_for_each(|t| pipe::delete_topic(&bootstrap, t)),
        Cmd::Codec { data, topic } => records::codecs(&data, &topic),
        Cmd::Steady {
            source,
            target,
            topic,
            remote,
            checkpoints,
            group,
            rate,
            size,
            duration_s,
            commit_every_ms,
            settle_s,
            pid,
        } => steady::steady(&steady::Steady {
            source,
            target,
            topic,
            remote,
            checkpoints,
            group,
            rate,
            size,
            duration: Duration::from_secs(duration_s),
            commit_every: Duration::from_millis(commit_every_ms),
            settle: Duration::from_secs(settle_s),
            pid,
        }),
    }
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn client(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("client.id", "mirrorflow-bench");
    c
}

fn plain_consumer(bootstrap: &str) -> Result<BaseConsumer> {
    let mut c = client(bootstrap);
    c.set("group.id", "mirrorflow-bench-unused")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "5")
        .set("fetch.min.bytes", "1");
    Ok(c.create()?)
}

/// The partition count of `topic`, waiting up to `timeout` for it to exist.
fn partitions(consumer: &BaseConsumer, topic: &str, timeout: Duration) -> Result<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(md) = consumer.fetch_metadata(Some(topic), Duration::from_secs(5))
            && let Some(t) = md.topics().iter().find(|t| t.name() == topic)
            && t.error().is_none()
            && !t.partitions().is_empty()
        {
            return Ok(t.partitions().len() as i32);
        }
        if Instant::now() >= deadline {
            bail!("topic {topic} did not appear within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn end_offsets(consumer: &BaseConsumer, topic: &str, n: i32) -> Result<Vec<i64>> {
    (0..n)
        .map(|p| {
            Ok(consumer
                .fetch_watermarks(topic, p, Duration::from_secs(5))?
                .1)
        })
        .collect()
}

/// The end offsets of every partition of `topics` (name, partition count) together, in one
/// ListOffsets request per broker (a request per partition would take seconds at 2,000).
fn end_offsets_of(consumer: &BaseConsumer, topics: &[(&str, i32)]) -> Result<i64> {
    let mut tpl = TopicPartitionList::new();
    for &(topic, n) in topics {
        for p in 0..n {
            // Offsets-for-times at the "latest" timestamp (-1) answers each end offset.
            tpl.add_partition_offset(topic, p, Offset::End)?;
        }
    }
    let answer = consumer.offsets_for_times(tpl, Duration::from_secs(5))?;
    let mut sum = 0_i64;
    for e in answer.elements() {
        e.error()
            .with_context(|| format!("{}-{}", e.topic(), e.partition()))?;
        match e.offset() {
            Offset::Offset(o) => sum = sum.saturating_add(o),
            other => bail!("{}-{}: end offset {other:?}", e.topic(), e.partition()),
        }
    }
    Ok(sum)
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field =
        |n: usize| -> Result<f64> { Ok(f.get(n - 3).context("short /proc stat")?.parse::<f64>()?) };
    Ok((field(14)? + field(15)?) / USER_HZ)
}

/// Whether `pid` still runs (a zombie, exited but not yet waited for, does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start());
        !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
    })
}

/// CPU seconds of every process of an arm (a flow's replicas, each its own process).
fn cpu_seconds_sum(pids: &[u32]) -> Result<f64> {
    pids.iter().map(|p| cpu_seconds(*p)).sum()
}

/// The peaks of every process of an arm, added (an upper bound of their peak together).
fn peak_rss_sum(pids: &[u32]) -> Result<u64> {
    pids.iter().map(|p| peak_rss_kib(*p)).sum()
}

/// VmHWM of `pid` in KiB.
fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("no VmHWM value")?
        .parse()?)
}

/// When a watch ends before the whole data set is copied.
struct Ends {
    /// The count has not moved for this long.
    stall: Option<Duration>,
    /// The copy has run this long from its first record.
    limit: Option<Duration>,
}

fn watch_copy(
    bootstrap: &str,
    topics: &[String],
    expect: i64,
    pids: &[u32],
    timeout_s: u64,
    ends: Ends,
    timeline: bool,
) -> Result<()> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout_s);
    let consumer = plain_consumer(bootstrap)?;
    let what = match topics {
        [one] => one.clone(),
        [first, ..] => format!("{first} and {} more topics", topics.len() - 1),
        [] => bail!("no topic to watch"),
    };
    let mut sizes = Vec::with_capacity(topics.len());
    for topic in topics {
        let n = loop {
            match partitions(&consumer, topic, Duration::from_secs(2)) {
                Ok(n) => break n,
                Err(_) if !pids.iter().any(|p| running(*p)) => {
                    bail!("{topic}: process {pids:?} exited before the topic appeared")
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => {}
            }
        };
        sizes.push((topic.as_str(), n));
    }
    let topic = &what;
    let mut first: Option<(Instant, i64, f64)> = None;
    // A tool that exits once it has written everything (ProducerPerformance) can be gone, or a
    // zombie without memory figures, by the time the copy is seen complete: keep the last
    // peak and CPU time read while it ran.
    let mut last_rss = None;
    let mut last_cpu = None;
    let mut gone_since: Option<Instant> = None;
    // The last time the count rose, and the longest time it stood still during the copy.
    let mut progress: Option<(Instant, i64)> = None;
    let mut max_stall = Duration::ZERO;
    let mut max_stall_from = started;
    let mut samples: Vec<(f64, i64)> = Vec::new();
    loop {
        last_rss = peak_rss_sum(pids).ok().or(last_rss);
        last_cpu = cpu_seconds_sum(pids).ok().or(last_cpu);
        let cpu_now = || {
            cpu_seconds_sum(pids)
                .ok()
                .or(last_cpu)
                .context("no CPU time: the process was gone before it was read")
        };
        // Right after the replicator creates the topic, leaders may not be known yet.
        let copied: i64 = match end_offsets_of(&consumer, &sizes) {
            Ok(ends) => ends,
            Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        if first.is_none() && copied > 0 {
            first = Some((now, copied, cpu_now()?));
        }
        if timeline
            && samples
                .last()
                .is_none_or(|(t, _)| now.duration_since(started).as_secs_f64() - t >= 1.0)
        {
            samples.push((now.duration_since(started).as_secs_f64(), copied));
        }
        match progress {
            Some((_, c)) if c == copied => {}
            Some((t, _)) => {
                if now.duration_since(t) > max_stall {
                    max_stall = now.duration_since(t);
                    max_stall_from = t;
                }
                progress = Some((now, copied));
            }
            None if copied > 0 => progress = Some((now, copied)),
            None => {}
        }
        let stalled = match (ends.stall, progress) {
            (Some(limit), Some((t, _))) => now.duration_since(t) >= limit,
            _ => false,
        };
        let limited = match (ends.limit, first) {
            (Some(limit), Some((t0, _, _))) => now.duration_since(t0) >= limit,
            _ => false,
        };
        if copied >= expect || stalled || limited {
            let cpu_end = cpu_now()?;
            let rss = peak_rss_sum(pids)
                .ok()
                .or(last_rss)
                .context("no VmHWM: the process was gone before its memory was read")?;
            let (t0, c0, cpu0) = first.unwrap_or((now, copied, cpu_end));
            // A stalled copy's window ends at its last record.
            let end = if stalled {
                progress.map_or(now, |(t, _)| t)
            } else {
                now
            };
            if stalled && now.duration_since(end) > max_stall {
                max_stall = now.duration_since(end);
                max_stall_from = end;
            }
            let window = end.duration_since(t0).as_secs_f64().max(1e-3);
            let records = (copied - c0).max(1) as f64;
            println!(
                "{}",
                json!({
                    "complete": copied >= expect,
                    // The copy ran into --limit-s: its rate is over that window.
                    "limited": limited && copied < expect,
                    "max_stall_s": max_stall.as_secs_f64(),
                    // When the longest stall began, from the start of the watch (as startup_s).
                    "max_stall_from_s": max_stall_from.duration_since(started).as_secs_f64(),
                    "timeline": timeline.then_some(&samples),
                    "records": copied,
                    "startup_s": t0.duration_since(started).as_secs_f64(),
                    "window_s": window,
                    "records_per_s": records / window,
                    // 0: the copy was complete at the first look, so the rate is not measured.
                    "window_records": copied - c0,
                    "cpu_s_window": cpu_end - cpu0,
                    "cpu_s_per_million": (cpu_end - cpu0) / records * 1e6,
                    "cpu_s_total": cpu_end,
                    "peak_rss_kib": rss,
                })
            );
            return Ok(());
        }
        if now >= deadline {
            bail!("{topic}: {copied} of {expect} records after {timeout_s} s");
        }
        // A replicator that died (a port in use, a bad config) would otherwise be waited for
        // until the timeout; its log says why.
        if !pids.iter().any(|p| running(*p)) {
            gone_since.get_or_insert(now);
        }
        if gone_since.is_some_and(|t| now.duration_since(t) > Duration::from_secs(5)) {
            bail!(
                "{topic}: process {pids:?} exited after {copied} of {expect} records were copied"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn create_topics(bootstrap: &str, partitions: i32, topics: &[String]) -> Result<()> {
    create_topics_rf(bootstrap, partitions, 1, topics)
}

fn create_topics_rf(
    bootstrap: &str,
    partitions: i32,
    replication_factor: i32,
    topics: &[String],
) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client(bootstrap).create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication_factor)))
        .collect();
    let results = futures::executor::block_on(admin.create_topics(&new, &AdminOptions::new()))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, e)) => bail!("creating {topic}: {e}"),
        }
    }
    Ok(())
}

fn init_group(bootstrap: &str, topic: &str, group: &str) -> Result<()> {
    let mut c = client(bootstrap);
    c.set("group.id", group).set("enable.auto.commit", "false");
    let consumer: BaseConsumer = c.create()?;
    let n = partitions(&consumer, topic, Duration::from_secs(30))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition_offset(topic, p, Offset::Offset(0))?;
    }
    consumer.commit(&tpl, CommitMode::Sync)?;
    Ok(())
}
