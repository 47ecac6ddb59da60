//! `passthrough`: a measuring arm, not a replicator. It copies one topic's record batches from
//! the source to a target topic as they are (compressed records neither decoded nor compressed
//! again), to measure what a copy costs when no client decodes every record: the question
//! behind issue 20's CPU-per-GB target, which the product's librdkafka clients cannot meet
//! (they take and give records, not batches). Batches go through the project's own pieces for
//! such a copy (`mirrorflow_core::batch` and `::protocol`): fetched `read_committed`, aborted
//! transactions and markers left out, written by an idempotent producer (its id, epoch and
//! sequences stamped into each batch, the source's CRC checked and a new one computed). No
//! offset syncs, checkpoints, retries or leader changes; single leader per side; plaintext.
//!
//! One thread fetches (one request in flight, as a consumer's fetcher has) and hands the
//! batches on; the calling thread produces them with up to `in_flight` requests outstanding,
//! one batch per partition per request (what Produce v3+ allows), each batch restamped
//! straight into the request.

mod wire;

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use mirrorflow_core::batch::sequencer::{Answer, Sequencer, Ticket};
use mirrorflow_core::batch::{self, Admission, Committed};
use mirrorflow_core::protocol::{self, FetchPartition, FetchRequest, Isolation, ProduceRequest};
use rdkafka::consumer::Consumer;

use wire::{CLIENT_ID, Conn};

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
    let topic = o.topic.clone();
    let (max_bytes, partition_max_bytes) = (o.max_bytes, o.partition_max_bytes);
    let fetcher = std::thread::Builder::new()
        .name("fetch".into())
        .spawn(move || {
            fetch_loop(
                &source_leader,
                &topic,
                &partitions,
                (max_bytes, partition_max_bytes),
                &tx,
            )
        })?;
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
    (max_bytes, partition_max_bytes): (i32, i32),
    tx: &mpsc::SyncSender<Fetched>,
) -> Result<()> {
    let mut conn = Conn::open(leader)?;
    let mut offsets: BTreeMap<i32, i64> = partitions.iter().map(|&p| (p, 0)).collect();
    loop {
        let request = FetchRequest {
            max_wait_ms: 100,
            min_bytes: 1,
            max_bytes,
            isolation: Isolation::ReadCommitted,
            topics: vec![(
                topic,
                offsets
                    .iter()
                    .map(|(&partition, &offset)| FetchPartition {
                        partition,
                        offset,
                        max_bytes: partition_max_bytes,
                    })
                    .collect(),
            )],
        };
        let id = conn.correlation();
        conn.send(&protocol::fetch_request(id, CLIENT_ID, &request)?)?;
        let body = Arc::new(conn.recv(id)?);
        let answer = protocol::decode_fetch(&body)?;
        if answer.error.is_error() {
            bail!("fetch: {}", answer.error);
        }
        let mut copy = Vec::new();
        for part in answer.topics.iter().flat_map(|(_, p)| p) {
            let Some(offset) = offsets.get_mut(&part.partition) else {
                bail!("fetch answered partition {} not asked for", part.partition);
            };
            if part.error.is_error() {
                bail!("fetch {topic}-{}: {}", part.partition, part.error);
            }
            let mut committed = Committed::new(&part.aborted);
            // Where this partition's records start in the answer's body.
            let base = part.records.as_ptr() as usize - body.as_ptr() as usize;
            let mut at = 0usize;
            for b in batch::batches(part.records) {
                let b = b.with_context(|| format!("{topic}-{}", part.partition))?;
                let size = b.bytes().len();
                // The broker answers from the start of the batch holding the offset asked for.
                let fresh = b.header.next_offset() > *offset;
                *offset = (*offset).max(b.header.next_offset());
                if fresh && committed.admit(&b)? == Admission::Copy {
                    if let Err(why) = b.header.whole() {
                        bail!(
                            "{topic}-{} at {}: {why:?}: a batch to decode, which this arm does not",
                            part.partition,
                            b.header.base_offset
                        );
                    }
                    copy.push((part.partition, base + at..base + at + size));
                }
                at += size;
            }
        }
        if !copy.is_empty() && tx.send((body.clone(), copy)).is_err() {
            return Ok(()); // the producer ended; its error is the one to report
        }
    }
}

/// A batch waiting for its produce request.
struct Pending {
    body: Arc<Vec<u8>>,
    range: Range<usize>,
}

fn produce_loop(
    leader: &str,
    topic: &str,
    in_flight: usize,
    rx: &mpsc::Receiver<Fetched>,
) -> Result<()> {
    let mut conn = Conn::open(leader)?;
    let id = conn.correlation();
    conn.send(&protocol::init_producer_id_request(
        id, CLIENT_ID, None, 60_000,
    )?)?;
    let (error, producer_id, producer_epoch) = protocol::decode_init_producer_id(&conn.recv(id)?)?;
    if error.is_error() {
        bail!("InitProducerId: {error}");
    }
    let mut sequencers: BTreeMap<i32, Sequencer<Pending>> = BTreeMap::new();
    let mut pending: BTreeMap<i32, VecDeque<Pending>> = BTreeMap::new();
    // Requests outstanding: their correlation id and each partition's ticket.
    let mut outstanding: VecDeque<(i32, Vec<(i32, Ticket)>)> = VecDeque::new();
    let mut queued = 0usize;
    loop {
        if queued == 0 && outstanding.is_empty() {
            let Ok(fetched) = rx.recv() else {
                bail!("the fetching thread ended");
            };
            queue(&mut pending, &mut queued, fetched);
        }
        while let Ok(fetched) = rx.try_recv() {
            queue(&mut pending, &mut queued, fetched);
        }
        if queued > 0 && outstanding.len() < in_flight.max(1) {
            let id = conn.correlation();
            let mut request = ProduceRequest::new(id, CLIENT_ID, None, -1, 30_000, 4 << 20)?;
            request.topic(topic)?;
            let mut tickets = Vec::new();
            // One batch per partition: the head of each partition's queue, in order.
            for (&partition, q) in &mut pending {
                let sequencer = sequencers
                    .entry(partition)
                    .or_insert_with(|| Sequencer::new(producer_id, producer_epoch));
                if q.is_empty() || !sequencer.has_room() {
                    continue;
                }
                let Some(next) = q.pop_front() else { continue };
                queued -= 1;
                let body = next.body.clone();
                let Some(Ok(b)) = batch::batches(&body[next.range.clone()]).next() else {
                    bail!("{topic}-{partition}: a fetched batch no longer parses");
                };
                let Some((stamp, ticket)) = sequencer.assign(b.header.record_count, next) else {
                    bail!("{topic}-{partition}: no room after checking for it");
                };
                request.partition::<anyhow::Error>(partition, |out| {
                    batch::restamp(&b, &stamp, out)?;
                    Ok(())
                })?;
                tickets.push((partition, ticket));
            }
            if !tickets.is_empty() {
                conn.send(&request.finish()?)?;
                outstanding.push_back((id, tickets));
                continue;
            }
        }
        let Some((id, tickets)) = outstanding.pop_front() else {
            continue;
        };
        let answer = protocol::decode_produce(&conn.recv(id)?)?;
        for p in answer.topics.iter().flat_map(|(_, p)| p) {
            let ticket = tickets
                .iter()
                .find(|(partition, _)| *partition == p.partition);
            let (Some((_, ticket)), Some(sequencer)) = (ticket, sequencers.get_mut(&p.partition))
            else {
                bail!("produce answered partition {} not written", p.partition);
            };
            match sequencer.answer(*ticket, p.error, p.base_offset) {
                Answer::Written { .. } => {}
                // One leader that stays: anything else ends the measurement.
                other => bail!(
                    "produce {topic}-{}: {} {} {:?}: {}",
                    p.partition,
                    p.error,
                    p.message,
                    p.record_errors,
                    match other {
                        Answer::Resend(_) => "would be sent again; this arm does not retry",
                        Answer::Fault { .. } => "a fault",
                        _ => "a stale answer",
                    }
                ),
            }
        }
    }
}

fn queue(pending: &mut BTreeMap<i32, VecDeque<Pending>>, queued: &mut usize, fetched: Fetched) {
    let (body, batches) = fetched;
    *queued += batches.len();
    for (partition, range) in batches {
        pending.entry(partition).or_default().push_back(Pending {
            body: body.clone(),
            range,
        });
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
