//! `passthrough`: a measuring arm, not a replicator. It copies one topic's record batches from
//! the source to a target topic as they are (compressed records neither decoded nor compressed
//! again), to measure what a copy costs when no client decodes every record: the question
//! behind issue 20's CPU-per-GB target, which the product's librdkafka clients cannot meet
//! (they take and give records, not batches). Batches go through the project's own pieces for
//! such a copy (`mirrorflow_core::batch` and `::protocol`, `mirrorflow_conn`'s `Fetcher` and
//! `Writer`): fetched `read_committed` from each partition's leader, aborted transactions and
//! markers left out, written by an idempotent producer to each target partition's leader (its
//! id, epoch and sequences stamped into each batch, the source's CRC checked and a new one
//! computed). Leaders that move are followed on both sides, and writes that may have failed
//! are sent again with their sequences. No offset syncs or checkpoints; a batch that needs
//! decoding or a write that faults ends the run; plaintext.
//!
//! One thread fetches (one request in flight per source leader, as a consumer's fetcher has)
//! and hands the batches on; the calling thread writes them with up to `in_flight` requests
//! outstanding per target leader, one batch per partition per request (what Produce v3+
//! allows), each batch restamped straight into the request.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use mirrorflow_conn::writer::Item;
use mirrorflow_conn::{Cluster, FetchLimits, Fetcher, Options as ConnOptions, Security, Writer};
use mirrorflow_core::batch;

const CLIENT_ID: &str = "mirrorflow-bench-passthrough";

/// The bench's clusters: plaintext, one thread's connections.
fn cluster(bootstrap: &str) -> Result<Cluster> {
    let options = ConnOptions {
        client_id: CLIENT_ID.into(),
        // Longer than the writer's produce timeout (librdkafka's `socket.timeout.ms`).
        timeout: Duration::from_secs(60),
        // A fetch's `max_bytes` plus its framing, with room to spare.
        max_frame: 256 << 20,
        address_check: None,
    };
    Ok(Cluster::new(bootstrap, Security::default(), options)?)
}

/// The leaders of `topic`'s partitions, once every partition has one.
fn leaders(cluster: &mut Cluster, topic: &str) -> Result<std::collections::BTreeSet<i32>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let metadata = cluster.metadata(&[topic])?;
        let t = metadata
            .topic(topic)
            .with_context(|| format!("{topic}: not in the metadata"))?;
        if !t.error.is_error() && t.partitions.iter().all(|p| p.leader >= 0) {
            return Ok(t.partitions.iter().map(|p| p.leader).collect());
        }
        if std::time::Instant::now() > deadline {
            bail!("{topic}: {} 30 s after it was created", t.error);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub struct Options {
    pub source: String,
    pub target: String,
    pub topic: String,
    pub remote_topic: String,
    pub max_bytes: i32,
    pub partition_max_bytes: i32,
    pub in_flight: usize,
}

/// One fetch answer's body and the batches to copy in it: (partition, byte range).
type Fetched = (Arc<Vec<u8>>, Vec<(i32, Range<usize>)>);

pub fn run(o: &Options) -> Result<()> {
    let mut source = cluster(&o.source)?;
    let source_leaders = leaders(&mut source, &o.topic)?;
    let partitions: Vec<i32> = {
        let metadata = source.metadata(&[&o.topic])?;
        let found = metadata
            .topic(&o.topic)
            .context("the source topic's metadata")?;
        found.partitions.iter().map(|p| p.partition).collect()
    };
    let count = i32::try_from(partitions.len()).context("partition count")?;
    crate::create_topics_rf(&o.target, count, -1, std::slice::from_ref(&o.remote_topic))?;
    let mut target = cluster(&o.target)?;
    let target_leaders = leaders(&mut target, &o.remote_topic)?;
    eprintln!(
        "passthrough: {} ({} partitions, leaders {source_leaders:?}) -> {} (leaders {target_leaders:?})",
        o.topic,
        partitions.len(),
        o.remote_topic
    );

    let (tx, rx) = mpsc::sync_channel::<Fetched>(4);
    let stop = Arc::new(AtomicBool::new(false));
    let topic = o.topic.clone();
    let (max_bytes, partition_max_bytes) = (o.max_bytes, o.partition_max_bytes);
    let fetching = stop.clone();
    let fetcher =
        std::thread::Builder::new()
            .name("fetch".into())
            .spawn(move || -> Result<()> {
                fetch_loop(
                    source,
                    &topic,
                    &partitions,
                    (max_bytes, partition_max_bytes),
                    (&tx, &fetching),
                )
            })?;
    let produced = produce_loop(target, &o.remote_topic, o.in_flight, rx);
    end(produced, &stop, fetcher)
}

/// The producer only ends on an error: the fetcher is told to stop and joined, and the error
/// reported (the fetcher's when it ended first: it says more). A fetcher that has fetched
/// everything hands nothing on, so it would never learn from its channel that the producer
/// ended: waiting for it unasked kept the producer's error unreported, and the process alive
/// with nothing copied, until the watcher's timeout.
fn end(produced: Result<()>, stop: &AtomicBool, fetcher: JoinHandle<Result<()>>) -> Result<()> {
    stop.store(true, Ordering::Relaxed);
    match fetcher.join() {
        Ok(Err(e)) => Err(e.context("fetching")),
        _ => produced.context("producing"),
    }
}

/// Fetches every partition from offset 0 on through [`Fetcher`] and hands the batches on,
/// until `stop` (checked every round). Leader moves are followed (the fetcher asks for
/// metadata again); any other trouble ends the measurement.
fn fetch_loop(
    source: Cluster,
    topic: &str,
    partitions: &[i32],
    (max_bytes, partition_max_bytes): (i32, i32),
    (tx, stop): (&mpsc::SyncSender<Fetched>, &AtomicBool),
) -> Result<()> {
    let limits = FetchLimits {
        max_bytes,
        partition_max_bytes,
        max_wait: Duration::from_millis(100),
    };
    let mut fetcher = Fetcher::new(source, limits);
    for &p in partitions {
        fetcher.assign(topic, p, 0);
    }
    let mut log = Log::default();
    while !stop.load(Ordering::Relaxed) {
        let round = fetcher.round();
        log.note(
            "fetch",
            round.failure.as_deref(),
            round.troubles.iter().map(|t| {
                format!(
                    "{}-{} at {}: {:?}",
                    t.topic, t.partition, t.offset, t.trouble
                )
            }),
        );
        if let Some(t) = round.troubles.iter().find(|t| t.paused) {
            bail!(
                "fetch {}-{} at {}: {:?}",
                t.topic,
                t.partition,
                t.offset,
                t.trouble
            );
        }
        for f in round.fetched {
            let mut copy = Vec::with_capacity(f.batches.len());
            for range in f.batches {
                if let Some(Ok(b)) = batch::batches(&f.body[range.clone()]).next()
                    && let Err(why) = b.header.whole()
                {
                    bail!(
                        "{topic}-{} at {}: {why:?}: a batch to decode, which this arm does not",
                        f.partition,
                        b.header.base_offset
                    );
                }
                copy.push((f.partition, range));
            }
            if tx.send((f.body, copy)).is_err() {
                return Ok(()); // the producer ended; its error is the one to report
            }
        }
    }
    Ok(())
}

/// Writes every batch handed on through [`Writer`]: leader moves and retriable errors are
/// handled there (the batches written again with their sequences, and given back as a fault
/// when that lasts longer than the writer's delivery timeout); a fault ends the measurement.
/// The channel closes when this returns, so a fetcher waiting to hand on a round ends too.
fn produce_loop(
    target: Cluster,
    topic: &str,
    in_flight: usize,
    rx: mpsc::Receiver<Fetched>,
) -> Result<()> {
    let topic: Arc<str> = Arc::from(topic);
    let mut writer: Writer<()> = Writer::new(target, in_flight);
    let mut log = Log::default();
    // At most this many batches wait for their write: the fetcher waits in its channel then.
    let most = 64usize;
    loop {
        if writer.pending() == 0 {
            let Ok(fetched) = rx.recv() else {
                bail!("the fetching thread ended");
            };
            queue(&mut writer, &topic, fetched)?;
        }
        while writer.pending() < most
            && let Ok(fetched) = rx.try_recv()
        {
            queue(&mut writer, &topic, fetched)?;
        }
        let progress = writer.pump();
        log.note(
            "write",
            progress.failure.as_deref(),
            progress
                .troubles
                .iter()
                .map(|(t, p, e)| format!("{t}-{p}: {e}")),
        );
        if let Some(fault) = progress.faults.first() {
            bail!(
                "produce {}-{}: {}: {} batches not written; this arm does not copy again",
                fault.topic,
                fault.partition,
                fault.error,
                fault.tokens.len()
            );
        }
    }
}

fn queue(writer: &mut Writer<()>, topic: &Arc<str>, fetched: Fetched) -> Result<()> {
    let (body, batches) = fetched;
    for (partition, range) in batches {
        let item = Item {
            body: body.clone(),
            range,
            token: (),
        };
        if writer.push(topic, partition, item).is_err() {
            bail!("{topic}: not a topic name Kafka takes");
        }
    }
    Ok(())
}

/// What went wrong and was retried (leaders that moved, connections lost), on stderr at most
/// once a second, with the time since the start: the log says why a copy paused.
struct Log {
    start: std::time::Instant,
    last: Option<std::time::Instant>,
    skipped: usize,
}

impl Default for Log {
    fn default() -> Self {
        Log {
            start: std::time::Instant::now(),
            last: None,
            skipped: 0,
        }
    }
}

impl Log {
    fn note(&mut self, side: &str, failure: Option<&str>, troubles: impl Iterator<Item = String>) {
        let troubles: Vec<String> = troubles.collect();
        if failure.is_none() && troubles.is_empty() {
            return;
        }
        if self
            .last
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1))
        {
            self.skipped += 1;
            return;
        }
        self.last = Some(std::time::Instant::now());
        eprintln!(
            "{:.1} s {side}: {} {} ({} more rounds with troubles since the last line)",
            self.start.elapsed().as_secs_f64(),
            failure.unwrap_or(""),
            troubles.join(", "),
            std::mem::take(&mut self.skipped)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A fetcher with nothing left to fetch: it hands nothing on, and only ends when told.
    fn caught_up_fetcher(stop: &Arc<AtomicBool>) -> JoinHandle<Result<()>> {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(())
        })
    }

    /// The CI smoke run's silent stall: the producer's fault was held behind a join of a
    /// fetcher that had fetched everything, so the arm neither copied nor failed. It is
    /// reported at once now.
    #[test]
    fn a_producers_error_is_reported_while_the_fetcher_has_nothing_to_hand_on() {
        let stop = Arc::new(AtomicBool::new(false));
        let fetcher = caught_up_fetcher(&stop);
        let started = Instant::now();
        let ended = end(Err(anyhow::anyhow!("a fault")), &stop, fetcher);
        assert!(started.elapsed() < Duration::from_secs(5));
        let message = ended.err().map_or_else(String::new, |e| format!("{e:#}"));
        assert!(message.contains("producing: a fault"), "{message}");
    }

    /// When the fetcher failed first, its error is the one reported.
    #[test]
    fn a_fetchers_error_is_the_one_reported_when_it_ended_first() {
        let stop = Arc::new(AtomicBool::new(false));
        let fetcher = std::thread::spawn(|| -> Result<()> { bail!("a batch to decode") });
        let ended = end(
            Err(anyhow::anyhow!("the fetching thread ended")),
            &stop,
            fetcher,
        );
        let message = ended.err().map_or_else(String::new, |e| format!("{e:#}"));
        assert!(message.contains("fetching: a batch to decode"), "{message}");
    }
}
