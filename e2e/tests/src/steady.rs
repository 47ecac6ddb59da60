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

use anyhow::{Context, Result, bail};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
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
