//! `steady`: traffic at a fixed rate with a send stamp in a header; end-to-end latency read on
//! the target, checkpoint freshness (source commit -> checkpoint visible on the target) and the
//! records a consumer would read again after failing over on the latest checkpoint.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;

use crate::{client, cpu_seconds, end_offsets, now_us, partitions, plain_consumer};

/// Header carrying the producer's send time (microseconds since the epoch, big-endian i64).
const STAMP: &str = "bench.sent.us";

pub struct Steady {
    pub source: String,
    pub target: String,
    pub topic: String,
    pub remote: String,
    pub checkpoints: String,
    pub group: String,
    pub rate: u64,
    pub size: usize,
    pub duration: Duration,
    pub commit_every: Duration,
    pub settle: Duration,
    pub pid: Option<u32>,
}

/// A commit of the group: when it was sent and the offsets that moved.
struct Commit {
    at_us: i64,
    moved: Vec<(i32, i64)>,
}

/// A checkpoint of the group as the watcher saw it.
#[derive(Clone, Copy)]
struct SeenCheckpoint {
    seen_us: i64,
    partition: i32,
    upstream: i64,
    downstream: i64,
}

#[derive(Default)]
struct Shared {
    latencies: Mutex<Vec<(i64, i64)>>,
    received: AtomicU64,
    checkpoints: Mutex<Vec<SeenCheckpoint>>,
    traffic_done: AtomicBool,
    stop: AtomicBool,
}

fn seq_value(seq: i64, size: usize) -> Vec<u8> {
    let mut v = vec![0_u8; size.max(8)];
    v[..8].copy_from_slice(&seq.to_be_bytes());
    v
}

fn seq_of(payload: Option<&[u8]>) -> Option<i64> {
    let b: [u8; 8] = payload?.get(..8)?.try_into().ok()?;
    Some(i64::from_be_bytes(b))
}

fn stamp_of<M: Message>(m: &M) -> Option<i64> {
    let headers = m.headers()?;
    headers.iter().find(|h| h.key == STAMP).and_then(|h| {
        let b: [u8; 8] = h.value?.try_into().ok()?;
        Some(i64::from_be_bytes(b))
    })
}

fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let idx = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[idx])
}

pub(crate) fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(f64::total_cmp);
    json!({
        "count": v.len(),
        "p50": percentile(&v, 0.50),
        "p99": percentile(&v, 0.99),
        "max": v.last(),
    })
}

pub fn steady(s: &Steady) -> Result<()> {
    let shared = Arc::new(Shared::default());
    let probe = plain_consumer(&s.source)?;
    let n = partitions(&probe, &s.topic, Duration::from_secs(30))?;

    let mut pc = client(&s.source);
    pc.set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "1");
    let producer: BaseProducer = pc.create()?;
    let mut seqs = vec![0_i64; n as usize];
    let mut send = |p: i32, producer: &BaseProducer| -> Result<()> {
        let seq = seqs[p as usize];
        let value = seq_value(seq, s.size);
        let stamp = now_us().to_be_bytes();
        let headers = OwnedHeaders::new().insert(Header {
            key: STAMP,
            value: Some(&stamp),
        });
        let mut record = BaseRecord::<(), [u8]>::to(&s.topic)
            .partition(p)
            .payload(&value)
            .headers(headers);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, back)) => {
                    if e.rdkafka_error_code() != Some(RDKafkaErrorCode::QueueFull) {
                        bail!("producing: {e}");
                    }
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
        seqs[p as usize] += 1;
        Ok(())
    };

    std::thread::scope(|scope| -> Result<()> {
        let latency = scope.spawn(|| read_latencies(s, &shared));
        let watcher = scope.spawn(|| watch_checkpoints(s, &shared));

        // Warm-up: one record per partition must come through before the clock starts.
        for p in 0..n {
            send(p, &producer)?;
        }
        producer.flush(Duration::from_secs(30))?;
        let warm = Instant::now();
        while shared.received.load(Ordering::Relaxed) < n as u64 {
            if warm.elapsed() > Duration::from_secs(180) {
                shared.stop.store(true, Ordering::Relaxed);
                bail!("warm-up records did not reach {} in 180 s", s.remote);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let warm_up_s = warm.elapsed().as_secs_f64();
        let start_us = now_us();
        let commits = scope.spawn(|| consume_and_commit(s, n, &shared));

        // Fixed rate: a batch every 10 ms, partitions round robin.
        let start = Instant::now();
        let cpu_start = s.pid.map(cpu_seconds).transpose()?;
        let mut sent: u64 = 0;
        let mut next_p = 0;
        while start.elapsed() < s.duration {
            let due = (start.elapsed().as_secs_f64() * s.rate as f64) as u64;
            while sent < due {
                send(next_p, &producer)?;
                next_p = (next_p + 1) % n;
                sent += 1;
            }
            producer.poll(Duration::ZERO);
            std::thread::sleep(Duration::from_millis(10));
        }
        producer.flush(Duration::from_secs(30))?;
        let produced_at_us = now_us();
        let cpu_traffic = match (s.pid, cpu_start) {
            (Some(pid), Some(c0)) => Some(cpu_seconds(pid)? - c0),
            _ => None,
        };
        let traffic_s = start.elapsed().as_secs_f64();
        shared.traffic_done.store(true, Ordering::Relaxed);
        let (commits, final_offsets) = match commits.join() {
            Ok(r) => r?,
            Err(_) => bail!("the committing consumer panicked"),
        };

        // Steady state: wait until the latest checkpoint of every partition carries the final
        // commit and translates it exactly (a failover would read nothing twice), or give up
        // after `settle`. Target offsets equal source offsets here (checked below), so exact
        // means downstream == upstream == the final commit.
        let settle_start = Instant::now();
        let latest_of = |cps: &[SeenCheckpoint]| {
            let mut latest: HashMap<i32, SeenCheckpoint> = HashMap::new();
            for c in cps {
                latest.insert(c.partition, *c);
            }
            latest
        };
        let state = |cps: &[SeenCheckpoint]| {
            let latest = latest_of(cps);
            let at = |p: usize| latest.get(&(p as i32));
            let covered = (0..final_offsets.len())
                .all(|p| at(p).is_some_and(|c| c.upstream >= final_offsets[p]));
            let exact = (0..final_offsets.len())
                .all(|p| at(p).is_some_and(|c| c.downstream >= final_offsets[p]));
            (covered, exact)
        };
        let mut covered_after = None;
        loop {
            let (covered, exact) = state(
                &shared
                    .checkpoints
                    .lock()
                    .map_err(|_| anyhow::anyhow!("lock"))?,
            );
            if covered && covered_after.is_none() {
                covered_after = Some(settle_start.elapsed().as_secs_f64());
            }
            if exact || settle_start.elapsed() >= s.settle {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let settled = settle_start.elapsed().as_secs_f64();
        // Let the latency reader get the tail.
        let expected: u64 = n as u64 + sent;
        let tail = Instant::now();
        while shared.received.load(Ordering::Relaxed) < expected
            && tail.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        shared.stop.store(true, Ordering::Relaxed);
        match latency.join() {
            Ok(r) => r?,
            Err(_) => bail!("the latency reader panicked"),
        }
        match watcher.join() {
            Ok(r) => r?,
            Err(_) => bail!("the checkpoint watcher panicked"),
        }
        let cps = shared
            .checkpoints
            .lock()
            .map_err(|_| anyhow::anyhow!("lock"))?
            .clone();
        let lat = shared
            .latencies
            .lock()
            .map_err(|_| anyhow::anyhow!("lock"))?
            .clone();

        // End-to-end latency of the records sent after warm-up.
        let lat_ms: Vec<f64> = lat
            .iter()
            .filter(|(sent, _)| *sent >= start_us)
            .map(|(_, l)| *l as f64 / 1000.0)
            .collect();

        // When the slow records were sent: the worst latency of each second of traffic, so a
        // periodic stall (a chore every second, a check every 10 s) shows apart from noise.
        let mut worst_by_second: Vec<f64> = Vec::new();
        for (sent, l) in lat.iter().filter(|(sent, _)| *sent >= start_us) {
            let second = usize::try_from((sent - start_us) / 1_000_000).unwrap_or(0);
            if worst_by_second.len() <= second {
                worst_by_second.resize(second + 1, 0.0);
            }
            let ms = (*l as f64 / 100.0).round() / 10.0;
            worst_by_second[second] = worst_by_second[second].max(ms);
        }

        // Freshness: first moment every partition a commit moved has a checkpoint at or past it.
        let mut by_p: HashMap<i32, Vec<(i64, i64)>> = HashMap::new();
        for c in &cps {
            by_p.entry(c.partition)
                .or_default()
                .push((c.seen_us, c.upstream));
        }
        let mut fresh_ms = Vec::new();
        let mut uncovered = 0;
        for c in commits.iter().filter(|c| !c.moved.is_empty()) {
            let mut worst: Option<i64> = Some(c.at_us);
            for &(p, off) in &c.moved {
                let seen = by_p
                    .get(&p)
                    .and_then(|v| v.iter().find(|(_, up)| *up >= off).map(|(t, _)| *t));
                worst = match (worst, seen) {
                    (Some(w), Some(t)) => Some(w.max(t)),
                    _ => None,
                };
            }
            match worst {
                Some(t) => fresh_ms.push((t - c.at_us).max(0) as f64 / 1000.0),
                None => uncovered += 1,
            }
        }

        // Translation during traffic: records a failover on each checkpoint would read again
        // relative to the commit it carries (target offsets equal source offsets here: fresh
        // topics copied in order from offset 0; checked below).
        let gaps: Vec<f64> = cps
            .iter()
            .filter(|c| c.seen_us >= start_us && c.seen_us <= produced_at_us)
            .map(|c| (c.upstream - c.downstream) as f64)
            .collect();

        // Failover in steady state: on the latest checkpoint of each partition, read the target
        // and count records the group had already consumed on the source.
        let latest = latest_of(&cps);
        let (covered, exact) = state(&cps);
        let reread = count_rereads(s, n, &final_offsets, &latest)?;
        let target_probe = plain_consumer(&s.target)?;
        let source_ends = end_offsets(&probe, &s.topic, n)?;
        let target_ends = end_offsets(&target_probe, &s.remote, n)?;

        println!(
            "{}",
            json!({
                "rate": s.rate,
                "size": s.size,
                "duration_s": s.duration.as_secs_f64(),
                "warm_up_s": warm_up_s,
                "cpu_s_per_s_during_traffic": cpu_traffic.map(|c| c / traffic_s),
                "records_sent": expected,
                "records_received": shared.received.load(Ordering::Relaxed),
                "latency_ms": summary(lat_ms),
                "latency_worst_by_second_ms": worst_by_second,
                "commits": commits.len(),
                "checkpoints_seen": cps.len(),
                "freshness_ms": summary(fresh_ms),
                "commits_without_checkpoint": uncovered,
                "translation_gap_records": summary(gaps),
                "final_committed": final_offsets,
                "final_checkpoint_covered": covered,
                "final_checkpoint_covered_after_s": covered_after,
                "final_checkpoint_exact": exact,
                "settle_s": settled,
                "reread_after_failover": reread,
                "offsets_identical": source_ends == target_ends,
            })
        );
        Ok(())
    })
}

/// Reads the remote topic from the beginning and stamps every record's end-to-end latency.
fn read_latencies(s: &Steady, shared: &Shared) -> Result<()> {
    let consumer = plain_consumer(&s.target)?;
    let n = partitions(&consumer, &s.remote, Duration::from_secs(180))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition_offset(&s.remote, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut local = Vec::with_capacity(1 << 16);
    while !shared.stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(20)) {
            Some(Ok(m)) => {
                let now = now_us();
                if let Some(sent) = stamp_of(&m) {
                    local.push((sent, now - sent));
                }
                shared.received.fetch_add(1, Ordering::Relaxed);
            }
            Some(Err(e)) => eprintln!("latency reader: {e}"),
            None => {}
        }
        if local.len() >= 4096 {
            shared
                .latencies
                .lock()
                .map_err(|_| anyhow::anyhow!("lock"))?
                .append(&mut local);
        }
    }
    shared
        .latencies
        .lock()
        .map_err(|_| anyhow::anyhow!("lock"))?
        .append(&mut local);
    Ok(())
}

/// MirrorMaker 2's checkpoint record, decoded here rather than with the crate's own decoder so
/// the bench observes both arms independently of the code under test: key = group, topic
/// (int16-length strings), partition (int32); value = version (int16), upstream offset, offset
/// (int64), metadata.
pub(crate) fn decode_checkpoint(
    key: &[u8],
    value: &[u8],
) -> Option<(String, String, i32, i64, i64)> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (b.get(..n)?, b.get(n..)?);
        *b = tail;
        Some(head)
    }
    fn string(b: &mut &[u8]) -> Option<String> {
        let len = i16::from_be_bytes(take(b, 2)?.try_into().ok()?);
        let bytes = take(b, usize::try_from(len).ok()?)?;
        String::from_utf8(bytes.to_vec()).ok()
    }
    let mut k = key;
    let group = string(&mut k)?;
    let topic = string(&mut k)?;
    let partition = i32::from_be_bytes(take(&mut k, 4)?.try_into().ok()?);
    let mut v = value;
    take(&mut v, 2)?;
    let upstream = i64::from_be_bytes(take(&mut v, 8)?.try_into().ok()?);
    let downstream = i64::from_be_bytes(take(&mut v, 8)?.try_into().ok()?);
    Some((group, topic, partition, upstream, downstream))
}

/// Follows the checkpoints topic on the target and keeps the group's checkpoints.
fn watch_checkpoints(s: &Steady, shared: &Shared) -> Result<()> {
    let consumer = plain_consumer(&s.target)?;
    let n = partitions(&consumer, &s.checkpoints, Duration::from_secs(180))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition_offset(&s.checkpoints, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    while !shared.stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(20)) {
            Some(Ok(m)) => {
                let seen_us = now_us();
                let (Some(k), Some(v)) = (m.key(), m.payload()) else {
                    continue;
                };
                let Some((group, topic, partition, upstream, downstream)) = decode_checkpoint(k, v)
                else {
                    continue;
                };
                if group == s.group && topic == s.remote {
                    shared
                        .checkpoints
                        .lock()
                        .map_err(|_| anyhow::anyhow!("lock"))?
                        .push(SeenCheckpoint {
                            seen_us,
                            partition,
                            upstream,
                            downstream,
                        });
                }
            }
            Some(Err(e)) => eprintln!("checkpoint watcher: {e}"),
            None => {}
        }
    }
    Ok(())
}

/// The group consumes the source topic and commits its position every `commit_every`; after
/// the traffic it reads to the end and commits that. Returns the commits and the final offsets.
fn consume_and_commit(s: &Steady, n: i32, shared: &Shared) -> Result<(Vec<Commit>, Vec<i64>)> {
    let mut c = client(&s.source);
    c.set("group.id", &s.group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "5");
    let consumer: BaseConsumer = c.create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition_offset(&s.topic, p, Offset::Stored)?;
    }
    consumer.assign(&tpl)?;
    let mut next = vec![-1_i64; n as usize];
    let mut committed = vec![-1_i64; n as usize];
    let mut commits = Vec::new();
    let mut last = Instant::now();
    let commit = |next: &[i64], committed: &mut [i64], commits: &mut Vec<Commit>| -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        let mut moved = Vec::new();
        for (p, &o) in next.iter().enumerate() {
            if o > committed[p] && o >= 0 {
                tpl.add_partition_offset(&s.topic, p as i32, Offset::Offset(o))?;
                moved.push((p as i32, o));
            }
        }
        if moved.is_empty() {
            return Ok(());
        }
        let at_us = now_us();
        consumer.commit(&tpl, CommitMode::Sync)?;
        for &(p, o) in &moved {
            committed[p as usize] = o;
        }
        commits.push(Commit { at_us, moved });
        Ok(())
    };
    let mut ends: Option<Vec<i64>> = None;
    loop {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(20)) {
            next[m.partition() as usize] = m.offset() + 1;
        }
        if last.elapsed() >= s.commit_every {
            last = Instant::now();
            commit(&next, &mut committed, &mut commits)?;
        }
        if ends.is_none() && shared.traffic_done.load(Ordering::Relaxed) {
            ends = Some(end_offsets(&consumer, &s.topic, n)?);
        }
        if let Some(e) = &ends
            && next.iter().zip(e).all(|(a, b)| a >= b || *b == 0)
        {
            let finals: Vec<i64> = e.clone();
            commit(&finals, &mut committed, &mut commits)?;
            return Ok((commits, finals));
        }
        if shared.stop.load(Ordering::Relaxed) {
            bail!("stopped before the group caught up");
        }
    }
}

/// Fails over on the latest checkpoint: reads each target partition from the checkpoint's
/// downstream offset and counts the records whose source offset the group had already consumed
/// (the value carries the per-partition sequence, equal to the source offset).
fn count_rereads(
    s: &Steady,
    n: i32,
    final_offsets: &[i64],
    latest: &HashMap<i32, SeenCheckpoint>,
) -> Result<serde_json::Value> {
    let consumer = plain_consumer(&s.target)?;
    let ends = end_offsets(&consumer, &s.remote, n)?;
    let mut total = 0_i64;
    let mut per_partition = Vec::new();
    for p in 0..n {
        let from = latest.get(&p).map_or(0, |c| c.downstream);
        let end = ends[p as usize];
        let consumed = final_offsets[p as usize];
        let mut count = 0_i64;
        if from < end {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&s.remote, p, Offset::Offset(from))?;
            consumer.assign(&tpl)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut at = from;
            while at < end && Instant::now() < deadline {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                    at = m.offset() + 1;
                    match seq_of(m.payload()) {
                        Some(seq) if seq < consumed => count += 1,
                        _ => break,
                    }
                }
            }
        }
        total += count;
        per_partition.push(count);
    }
    Ok(json!({ "total": total, "per_partition": per_partition }))
}
