//! `init-groups` and `groups`: many consumer groups committing on many partitions, and how long
//! each commit takes to reach a checkpoint on the target (checkpoint freshness at scale).
//!
//! Group `g` owns topic `g mod topics` (every partition of it), as a fleet of applications each
//! reading its own topic would. The groups have no members: their offsets are set with
//! AlterConsumerGroupOffsets from one client, so 500 groups cost one connection rather than 500
//! consumers (whose threads would compete with the replicator measured). Each group commits
//! every `commit_every` (Kafka's auto-commit default is 5 s), the groups spread evenly over it,
//! moving each of its partitions one record further within the pre-loaded data.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use mirrorflow_rdkafka_ext::offsets::alter_group_offsets;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;

use crate::steady::{decode_checkpoint, summary};
use crate::{client, cpu_seconds, end_offsets, now_us, partitions, peak_rss_kib, plain_consumer};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Groups {
    pub source: String,
    pub target: String,
    /// The source topics, in order: group `g` owns `topics[g mod len]`.
    pub topics: Vec<String>,
    /// What the arm puts before a source topic's name on the target (`<alias>.`).
    pub remote_prefix: String,
    pub checkpoints: String,
    pub groups: usize,
    pub group_prefix: String,
    pub duration: Duration,
    pub commit_every: Duration,
    pub settle: Duration,
    pub pid: Option<u32>,
}

/// One group's commit: when it was sent, and the offsets it set.
struct Commit {
    group: usize,
    at_us: i64,
    offsets: Vec<(i32, i64)>,
}

/// The checkpoints seen per (group, remote topic, partition): when, and the upstream offset.
type Seen = HashMap<(String, String, i32), Vec<(i64, i64)>>;

fn group_name(prefix: &str, g: usize) -> String {
    format!("{prefix}{g}")
}

fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>> {
    Ok(client(bootstrap).create()?)
}

fn commit(
    admin: &AdminClient<DefaultClientContext>,
    group: &str,
    topic: &str,
    offsets: &[(i32, i64)],
) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    for &(p, o) in offsets {
        tpl.add_partition_offset(topic, p, Offset::Offset(o))?;
    }
    let refused = alter_group_offsets(admin.inner(), group, &tpl, REQUEST_TIMEOUT)
        .map_err(|e| anyhow!("committing for {group}: {e}"))?;
    if let Some(r) = refused.first() {
        bail!(
            "committing for {group}: {}-{} refused ({:?}), {} partitions in all",
            r.topic,
            r.partition,
            r.code,
            refused.len()
        );
    }
    Ok(())
}

/// The partition count of every topic.
fn partition_counts(bootstrap: &str, topics: &[String]) -> Result<Vec<i32>> {
    let consumer = plain_consumer(bootstrap)?;
    topics
        .iter()
        .map(|t| partitions(&consumer, t, Duration::from_secs(30)))
        .collect()
}

/// Commits offset 0 on every partition of its topic for each group, so the groups exist before
/// a replicator lists groups (MirrorMaker 2 lists them every 10 min by default).
pub fn init_groups(
    bootstrap: &str,
    topics: &[String],
    groups: usize,
    prefix: &str,
    offset: i64,
) -> Result<()> {
    let counts = partition_counts(bootstrap, topics)?;
    let admin = admin(bootstrap)?;
    let started = Instant::now();
    for g in 0..groups {
        let t = g % topics.len();
        let at: Vec<(i32, i64)> = (0..counts[t]).map(|p| (p, offset)).collect();
        commit(&admin, &group_name(prefix, g), &topics[t], &at)?;
    }
    println!(
        "{}",
        json!({ "groups": groups, "topics": topics.len(), "seconds": started.elapsed().as_secs_f64() })
    );
    Ok(())
}

pub fn groups(s: &Groups) -> Result<()> {
    if s.topics.is_empty() || s.groups == 0 {
        bail!("no topics or no groups");
    }
    let counts = partition_counts(&s.source, &s.topics)?;
    let probe = plain_consumer(&s.source)?;
    let ends: Vec<Vec<i64>> = s
        .topics
        .iter()
        .zip(&counts)
        .map(|(t, &n)| end_offsets(&probe, t, n))
        .collect::<Result<_>>()?;
    let admin = admin(&s.source)?;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));

    std::thread::scope(|scope| -> Result<()> {
        let watcher = scope.spawn(|| watch(s, &seen, &stop));
        let cpu_start = s.pid.map(cpu_seconds).transpose()?;
        let start = Instant::now();
        // Group g's k-th commit (k from 1) is due at (g / groups + k - 1) commit intervals.
        let mut next_k = vec![1_i64; s.groups];
        let mut commits = Vec::new();
        let mut late_ms: Vec<f64> = Vec::new();
        let due = |g: usize, k: i64| {
            s.commit_every
                .mul_f64(g as f64 / s.groups as f64 + (k - 1) as f64)
        };
        while start.elapsed() < s.duration {
            let mut sent_any = false;
            for (g, next) in next_k.iter_mut().enumerate() {
                let k = *next;
                let at = due(g, k);
                if at > start.elapsed() || at >= s.duration {
                    continue;
                }
                let t = g % s.topics.len();
                let offsets: Vec<(i32, i64)> = (0..counts[t])
                    .map(|p| (p, k.min(ends[t][p as usize])))
                    .collect();
                late_ms.push((start.elapsed().saturating_sub(at)).as_secs_f64() * 1e3);
                let at_us = now_us();
                commit(
                    &admin,
                    &group_name(&s.group_prefix, g),
                    &s.topics[t],
                    &offsets,
                )?;
                commits.push(Commit {
                    group: g,
                    at_us,
                    offsets,
                });
                *next += 1;
                sent_any = true;
            }
            if !sent_any {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let traffic_s = start.elapsed().as_secs_f64();
        let cpu_traffic = match (s.pid, cpu_start) {
            (Some(pid), Some(c0)) => Some(cpu_seconds(pid)? - c0),
            _ => None,
        };

        // Let the last commits reach their checkpoints, or give up after `settle`.
        let settle_start = Instant::now();
        loop {
            let covered = {
                let seen = seen.lock().map_err(|_| anyhow!("lock"))?;
                commits.iter().all(|c| freshness_us(s, c, &seen).is_some())
            };
            if covered || settle_start.elapsed() >= s.settle {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::Relaxed);
        match watcher.join() {
            Ok(r) => r?,
            Err(_) => bail!("the checkpoint watcher panicked"),
        }
        let seen = seen.lock().map_err(|_| anyhow!("lock"))?;
        let mut fresh_ms = Vec::new();
        let mut uncovered = 0_usize;
        let mut groups_checkpointed = vec![false; s.groups];
        for c in &commits {
            match freshness_us(s, c, &seen) {
                Some(us) => {
                    fresh_ms.push(us as f64 / 1e3);
                    groups_checkpointed[c.group] = true;
                }
                None => uncovered += 1,
            }
        }
        let partitions_committed: i32 = (0..s.groups).map(|g| counts[g % counts.len()]).sum();
        println!(
            "{}",
            json!({
                "groups": s.groups,
                "topics": s.topics.len(),
                "partitions": counts.iter().sum::<i32>(),
                "group_partitions": partitions_committed,
                "commit_every_s": s.commit_every.as_secs_f64(),
                "duration_s": traffic_s,
                "commits": commits.len(),
                "commit_lateness_ms": summary(late_ms),
                "checkpoints_seen": seen.values().map(Vec::len).sum::<usize>(),
                "freshness_ms": summary(fresh_ms),
                "commits_without_checkpoint": uncovered,
                "groups_never_checkpointed": groups_checkpointed.iter().filter(|c| !**c).count(),
                "settle_s": settle_start.elapsed().as_secs_f64(),
                "cpu_s_per_s": cpu_traffic.map(|c| c / traffic_s),
                "peak_rss_kib": s.pid.map(peak_rss_kib).transpose().ok().flatten(),
            })
        );
        Ok(())
    })
}

/// Microseconds from the commit until every partition it set had a checkpoint at or past it.
fn freshness_us(s: &Groups, c: &Commit, seen: &Seen) -> Option<i64> {
    let group = group_name(&s.group_prefix, c.group);
    let remote = format!("{}{}", s.remote_prefix, s.topics[c.group % s.topics.len()]);
    let mut worst = c.at_us;
    for &(p, offset) in &c.offsets {
        let first = seen
            .get(&(group.clone(), remote.clone(), p))?
            .iter()
            .find(|(_, upstream)| *upstream >= offset)?;
        worst = worst.max(first.0);
    }
    Some(worst - c.at_us)
}

/// Follows the checkpoints topic on the target and keeps the checkpoints of the groups.
fn watch(s: &Groups, seen: &Mutex<Seen>, stop: &AtomicBool) -> Result<()> {
    let consumer: BaseConsumer = plain_consumer(&s.target)?;
    let n = partitions(&consumer, &s.checkpoints, Duration::from_secs(180))
        .context("the checkpoints topic")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition_offset(&s.checkpoints, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(20)) {
            Some(Ok(m)) => {
                let seen_us = now_us();
                let (Some(k), Some(v)) = (m.key(), m.payload()) else {
                    continue;
                };
                let Some((group, topic, partition, upstream, _)) = decode_checkpoint(k, v) else {
                    continue;
                };
                if group.starts_with(&s.group_prefix) && topic.starts_with(&s.remote_prefix) {
                    seen.lock()
                        .map_err(|_| anyhow!("lock"))?
                        .entry((group, topic, partition))
                        .or_default()
                        .push((seen_us, upstream));
                }
            }
            Some(Err(e)) => eprintln!("checkpoint watcher: {e}"),
            None => {}
        }
    }
    Ok(())
}
