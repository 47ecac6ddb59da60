//! Records written at a steady rate and read back as they arrive, for tests that break
//! something while a flow copies and measure what it cost: how long until records written
//! after the fault arrive, and what was lost or duplicated.
//!
//! Every record names itself: its value is `<partition>/<n>` with `n` its position in the
//! source partition as produced, so each copy on the target maps back to its source record
//! whatever offset it got there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mirrorflow::mm2::Checkpoint;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureRecord;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::kafka;

/// Writes one record to each partition of a source topic every `every`, until stopped.
pub struct SteadyProducer {
    /// Records queued so far per partition: the next record's `n`.
    queued: Arc<Vec<AtomicU64>>,
    /// Records the source acknowledged per partition (a prefix of those queued).
    acked: Arc<Vec<AtomicU64>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl SteadyProducer {
    pub fn start(bootstrap: &str, topic: &str, partitions: i32, every: Duration) -> Result<Self> {
        let producer = kafka::producer(bootstrap, Duration::from_secs(60))?;
        let counters = || {
            Arc::new(
                (0..partitions)
                    .map(|_| AtomicU64::new(0))
                    .collect::<Vec<_>>(),
            )
        };
        let (queued, acked, stop) = (counters(), counters(), Arc::new(AtomicBool::new(false)));
        let topic = topic.to_owned();
        let task = tokio::spawn({
            let (queued, acked, stop) = (queued.clone(), acked.clone(), stop.clone());
            async move {
                let mut tick = tokio::time::interval(every);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let mut pending = Vec::new();
                    for p in 0..partitions {
                        let n = queued[p as usize].load(Ordering::Relaxed);
                        let value = format!("{p}/{n}");
                        let f = producer
                            .send_result(
                                FutureRecord::<(), _>::to(&topic)
                                    .partition(p)
                                    .payload(&value),
                            )
                            .map_err(|(e, _)| e)
                            .with_context(|| format!("queueing {topic} {value}"))?;
                        queued[p as usize].store(n + 1, Ordering::Relaxed);
                        pending.push((p, n, f));
                    }
                    for (p, n, f) in pending {
                        match f.await {
                            Ok(Ok(_)) => acked[p as usize].store(n + 1, Ordering::Relaxed),
                            Ok(Err((e, _))) => bail!("producing {topic} {p}/{n}: {e}"),
                            Err(_) => bail!("producing {topic} {p}/{n}: cancelled"),
                        }
                    }
                }
                Ok(())
            }
        });
        Ok(SteadyProducer {
            queued,
            acked,
            stop,
            task,
        })
    }

    /// Records queued so far, per partition: those with a greater or equal `n` are written
    /// after this call.
    pub fn queued(&self) -> Vec<u64> {
        self.queued
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Stops and returns how many records of each partition the source acknowledged.
    pub async fn stop(mut self) -> Result<Vec<u64>> {
        self.stop.store(true, Ordering::Relaxed);
        (&mut self.task).await.context("the producer task")??;
        Ok(self
            .acked
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect())
    }
}

impl Drop for SteadyProducer {
    fn drop(&mut self) {
        // A test that failed before stop(): the task must not outlive it.
        self.task.abort();
    }
}

/// What a [`TargetReader`] has seen of one source record: when its first copy arrived and how
/// many copies there are.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    pub first: Instant,
    pub copies: u32,
}

/// Reads a remote topic from its beginning, on a thread of its own, until dropped.
pub struct TargetReader {
    seen: Arc<Mutex<HashMap<(i32, u64), Seen>>>,
    error: Arc<Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TargetReader {
    /// `committed`: read with `read_committed` (a transactional flow's copies count once their
    /// transaction commits).
    pub fn start(bootstrap: &str, topic: &str, partitions: i32, committed: bool) -> Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "mirrorflow-e2e-steady-reader")
            .set("enable.auto.commit", "false")
            .set(
                "isolation.level",
                if committed {
                    "read_committed"
                } else {
                    "read_uncommitted"
                },
            )
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        let seen: Arc<Mutex<HashMap<(i32, u64), Seen>>> = Arc::default();
        let error: Arc<Mutex<Option<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (seen, error, stop) = (seen.clone(), error.clone(), stop.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    let Some(m) = consumer.poll(Duration::from_millis(100)) else {
                        continue;
                    };
                    let at = Instant::now();
                    let parsed = m.map_err(|e| e.to_string()).and_then(|m| {
                        let v = String::from_utf8_lossy(m.payload().unwrap_or_default());
                        let (p, n) = v.split_once('/').ok_or(format!("value {v:?}"))?;
                        Ok((
                            p.parse::<i32>().map_err(|e| format!("{v:?}: {e}"))?,
                            n.parse::<u64>().map_err(|e| format!("{v:?}: {e}"))?,
                        ))
                    });
                    match parsed {
                        Ok(key) => {
                            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                            seen.entry(key)
                                .and_modify(|s| s.copies += 1)
                                .or_insert(Seen {
                                    first: at,
                                    copies: 1,
                                });
                        }
                        // Transient client errors (a broker connection reset) are retried by
                        // the client; kept only to explain a reader that saw nothing.
                        Err(e) => *error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e),
                    }
                }
            }
        });
        Ok(TargetReader {
            seen,
            error,
            stop,
            thread: Some(thread),
        })
    }

    /// A copy of what was seen so far.
    pub fn seen(&self) -> HashMap<(i32, u64), Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The last error the consumer reported, if any.
    pub fn last_error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for TargetReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// When every partition first had a copy of a record written at or after `from[p]` (its
/// `n`): the latest of those first arrivals, or None while a partition has none yet.
pub fn resumed_at(seen: &HashMap<(i32, u64), Seen>, from: &[u64]) -> Option<Instant> {
    let mut latest: Option<Instant> = None;
    for (p, &start) in from.iter().enumerate() {
        let first = seen
            .iter()
            .filter(|((sp, n), _)| *sp == p as i32 && *n >= start)
            .map(|(_, s)| s.first)
            .min()?;
        latest = Some(latest.map_or(first, |l| l.max(first)));
    }
    latest
}

/// Records of the first `written[p]` of each partition with no copy, and copies beyond the
/// first of each record.
pub fn lost_and_duplicated(seen: &HashMap<(i32, u64), Seen>, written: &[u64]) -> (u64, u64) {
    let mut lost = 0;
    for (p, &n) in written.iter().enumerate() {
        lost += (0..n)
            .filter(|i| !seen.contains_key(&(p as i32, *i)))
            .count() as u64;
    }
    let duplicated = seen.values().map(|s| u64::from(s.copies - 1)).sum();
    (lost, duplicated)
}

/// True once every record of the first `written[p]` of each partition has a copy.
pub fn all_arrived(seen: &HashMap<(i32, u64), Seen>, written: &[u64]) -> bool {
    lost_and_duplicated(seen, written).0 == 0
}

/// A consumer group on the source that consumes `topic` and commits every 300 ms, so the
/// checkpoint loop has commits to translate while a test breaks something. Sends the number of
/// commits it asked for once stopped.
///
/// The commits are asynchronous: a synchronous commit in flight while the source broker
/// restarted once never returned (librdkafka kept waiting for the group's coordinator), and
/// the test waited on it for over an hour.
pub fn committing_consumer(
    bootstrap: String,
    group: String,
    topic: String,
    stop: Arc<AtomicBool>,
) -> std::sync::mpsc::Receiver<Result<u64>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let consumer: BaseConsumer = match ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
        {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(Err(e.into()));
                return;
            }
        };
        if let Err(e) = consumer.subscribe(&[&topic]) {
            let _ = tx.send(Err(e.into()));
            return;
        }
        let mut last_commit = Instant::now();
        let mut asked = 0;
        while !stop.load(Ordering::Relaxed) {
            let _ = consumer.poll(Duration::from_millis(50));
            if last_commit.elapsed() >= Duration::from_millis(300) {
                last_commit = Instant::now();
                // Refused at once when the consumer holds no position yet.
                if consumer.commit_consumer_state(CommitMode::Async).is_ok() {
                    asked += 1;
                }
            }
        }
        let _ = tx.send(Ok(asked));
        // Closing the consumer can wait on the same coordinator: the count is sent first.
    });
    rx
}

/// The longest time between `from` and `to` in which no record had its first copy arrive: how
/// long the copy paused.
pub fn copy_pause(seen: &HashMap<(i32, u64), Seen>, from: Instant, to: Instant) -> Duration {
    let mut arrivals: Vec<Instant> = seen
        .values()
        .map(|s| s.first)
        .filter(|t| *t >= from && *t <= to)
        .collect();
    arrivals.sort();
    arrivals.push(to);
    let mut last = from;
    let mut longest = Duration::ZERO;
    for a in arrivals {
        longest = longest.max(a.saturating_duration_since(last));
        last = a;
    }
    longest
}

/// A checkpoint and when it was written (its record's timestamp, ms since the epoch).
pub struct Written {
    pub cp: Checkpoint,
    pub at_ms: i64,
}

/// Every checkpoint of `group` in `<alias>.checkpoints.internal` on `target`, in the order of
/// each partition, read committed.
pub fn checkpoints_of(target: &str, alias: &str, group: &str) -> Result<Vec<Written>> {
    let topic = format!("{alias}.checkpoints.internal");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", target)
        .set("group.id", "mirrorflow-e2e-upgrade-checkpoints")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()?;
    let md = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
    let partitions = md.topics().first().map_or(0, |t| t.partitions().len());
    let mut out = Vec::new();
    for p in 0..partitions as i32 {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, p, Offset::Beginning)?;
        consumer.assign(&tpl)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            ensure!(Instant::now() < deadline, "reading {topic}-{p} timed out");
            match consumer.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    let (Some(k), Some(v)) = (m.key(), m.payload()) else {
                        continue;
                    };
                    let cp = Checkpoint::decode(k, v).context("decoding a checkpoint")?;
                    if cp.group == group {
                        let at_ms = m.timestamp().to_millis().unwrap_or_default();
                        out.push(Written { cp, at_ms });
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => return Err(e.into()),
                None => {}
            }
        }
    }
    Ok(out)
}
