//! `passthrough`: a measuring arm, not a replicator. It copies one topic's record batches from
//! the source to a target topic as they are (compressed records neither decoded nor compressed
//! again; only the producer fields of each batch header cleared and the CRC computed anew), to
//! measure what a copy costs when no client decodes every record: the question behind issue
//! 20's CPU-per-GB target, which the product's librdkafka clients cannot meet (they take and
//! give records, not batches). No offset syncs, checkpoints, retries or leader changes; single
//! leader per side; plaintext.
//!
//! One thread fetches (one request in flight, as a consumer's fetcher has) and hands the
//! batches on; the calling thread produces them with up to `in_flight` requests outstanding,
//! one batch per partition per request (what Produce v3+ allows).

mod batch;
mod wire;

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rdkafka::consumer::Consumer;

use wire::{Conn, FetchLimits};

pub struct Options {
    pub source: String,
    pub target: String,
    pub topic: String,
    pub remote_topic: String,
    pub max_bytes: i32,
    pub partition_max_bytes: i32,
    pub in_flight: usize,
}

/// Fetched batches handed from the fetching thread to the producing one.
type Fetched = Vec<(i32, Vec<u8>)>;

pub fn run(o: &Options) -> Result<()> {
    let (source_leader, partitions) = leader(&o.source, &o.topic)?;
    let count = i32::try_from(partitions.len()).context("partition count")?;
    crate::create_topics_rf(&o.target, count, -1, std::slice::from_ref(&o.remote_topic))?;
    let (target_leader, _) = leader(&o.target, &o.remote_topic)?;
    eprintln!(
        "passthrough: {} ({} partitions, leader {source_leader}) -> {} (leader {target_leader})",
        o.topic,
        partitions.len(),
        o.remote_topic
    );

    let (tx, rx) = mpsc::sync_channel::<Fetched>(4);
    let limits = FetchLimits {
        max_wait_ms: 100,
        max_bytes: o.max_bytes,
        partition_max_bytes: o.partition_max_bytes,
    };
    let topic = o.topic.clone();
    let fetcher = std::thread::Builder::new()
        .name("fetch".into())
        .spawn(move || fetch_loop(&source_leader, &topic, &partitions, limits, &tx))?;
    let produced = produce_loop(&target_leader, &o.remote_topic, o.in_flight, &rx);
    // The producer only ends on an error; the fetcher's own error says more when it ended first.
    match fetcher.join() {
        Ok(Err(e)) => Err(e.context("fetching")),
        _ => produced.context("producing"),
    }
}

fn fetch_loop(
    leader: &str,
    topic: &str,
    partitions: &[i32],
    limits: FetchLimits,
    tx: &mpsc::SyncSender<Fetched>,
) -> Result<()> {
    let mut conn = Conn::open(leader)?;
    let mut offsets: BTreeMap<i32, i64> = partitions.iter().map(|&p| (p, 0)).collect();
    loop {
        let wanted: Vec<(i32, i64)> = offsets.iter().map(|(&p, &o)| (p, o)).collect();
        let id = conn.send_fetch(topic, &wanted, limits)?;
        let answer = conn.recv(id)?;
        let mut out = Fetched::new();
        for part in wire::fetched(&answer)? {
            let Some(offset) = offsets.get_mut(&part.partition) else {
                bail!("fetch answered partition {} not asked for", part.partition);
            };
            let passable = batch::passable(part.records, *offset)
                .with_context(|| format!("{topic}-{}", part.partition))?;
            if let Some(next) = passable.next_offset {
                *offset = next.max(*offset);
            }
            out.extend(passable.batches.into_iter().map(|b| (part.partition, b)));
        }
        if !out.is_empty() && tx.send(out).is_err() {
            return Ok(()); // the producer ended; its error is the one to report
        }
    }
}

fn produce_loop(
    leader: &str,
    topic: &str,
    in_flight: usize,
    rx: &mpsc::Receiver<Fetched>,
) -> Result<()> {
    let mut conn = Conn::open(leader)?;
    let mut pending: BTreeMap<i32, VecDeque<Vec<u8>>> = BTreeMap::new();
    let mut outstanding: VecDeque<i32> = VecDeque::new();
    let mut queued = 0usize;
    loop {
        if queued == 0 && outstanding.is_empty() {
            let Ok(batches) = rx.recv() else {
                bail!("the fetching thread ended");
            };
            queue(&mut pending, &mut queued, batches);
        }
        while let Ok(batches) = rx.try_recv() {
            queue(&mut pending, &mut queued, batches);
        }
        if queued > 0 && outstanding.len() < in_flight.max(1) {
            // One batch per partition: the head of each partition's queue, in order.
            let request: Vec<(i32, Vec<u8>)> = pending
                .iter_mut()
                .filter_map(|(&p, q)| q.pop_front().map(|b| (p, b)))
                .collect();
            queued -= request.len();
            outstanding.push_back(conn.send_produce(topic, &request)?);
            continue;
        }
        if let Some(id) = outstanding.pop_front() {
            wire::produced(&conn.recv(id)?)?;
        }
    }
}

fn queue(pending: &mut BTreeMap<i32, VecDeque<Vec<u8>>>, queued: &mut usize, batches: Fetched) {
    *queued += batches.len();
    for (p, b) in batches {
        pending.entry(p).or_default().push_back(b);
    }
}

/// The one broker leading every partition of `topic`, as host:port, and the partitions.
fn leader(bootstrap: &str, topic: &str) -> Result<(String, Vec<i32>)> {
    let consumer = crate::plain_consumer(bootstrap)?;
    crate::partitions(&consumer, topic, Duration::from_secs(30))?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .with_context(|| format!("{topic}: not in the metadata"))?;
    let leaders: std::collections::BTreeSet<i32> =
        t.partitions().iter().map(|p| p.leader()).collect();
    let [id] = leaders.into_iter().collect::<Vec<_>>()[..] else {
        bail!("{topic}: the passthrough spike needs one leader for every partition");
    };
    let broker = md
        .brokers()
        .iter()
        .find(|b| b.id() == id)
        .with_context(|| format!("{topic}: leader {id} not among the brokers"))?;
    let partitions = t.partitions().iter().map(|p| p.id()).collect();
    Ok((format!("{}:{}", broker.host(), broker.port()), partitions))
}
