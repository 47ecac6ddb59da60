//! Whole record batches written idempotently to the leaders of their target partitions.
//!
//! Each partition is a lane: batches queued in order, given their sequences by a
//! [`Sequencer`] when sent, at most [`MAX_IN_FLIGHT`] unacknowledged. Every leader gets
//! requests holding one batch per partition (what Produce v3 and later allow), at most
//! `in_flight` of them outstanding on its connection. A lane's first batch under a producer id
//! goes alone until it is acknowledged: a broker that keeps no sequence of the producer takes
//! any, so a later batch could land before a first one refused (a new topic's leader not yet
//! elected). An answer that says a batch may not have been written (the leader moved, a
//! timeout, too few replicas) has the lane write its unacknowledged batches again, in order and
//! with the same sequences, after [`RETRY_BACKOFF`] and new metadata (after the metadata when
//! leadership was the cause); a broken connection does the same for every lane it carried.
//! When the broker no longer knows the producer's sequences, or a lane's batches have waited
//! longer than the delivery timeout ([`DELIVERY_TIMEOUT`]) for an acknowledged write, the
//! lane's batches (unacknowledged and queued) go back to the caller as a [`Fault`], to be copied
//! again from the last written position under a new producer id: no wait lasts unseen.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mirrorflow_core::batch::sequencer::{Answer, MAX_IN_FLIGHT, Sequencer, Ticket};
use mirrorflow_core::batch::{self, Stamp};
use mirrorflow_core::protocol::{self, ErrorCode, ProduceRequest};

use crate::cluster::{Pacer, topics_of};
use crate::fetcher::METADATA_BACKOFF;
use crate::{Cluster, ConnError};

/// Kafka's longest topic name.
pub const MAX_TOPIC_LEN: usize = 249;

/// How long the target may take to write a request to its replicas (`acks=all`).
pub const PRODUCE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a partition's batches may wait for an acknowledged write before they go back to the
/// caller (a Java producer's `delivery.timeout.ms`): longer than a write the target holds for
/// its replicas ([`PRODUCE_TIMEOUT`]) and a few leader elections.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a partition waits before it writes again after an answer that said its batch may not
/// have been written (a Java producer's `retry.backoff.ms`); after a leadership error it also
/// waits for new metadata ([`METADATA_BACKOFF`] apart).
pub const RETRY_BACKOFF: Duration = Duration::from_millis(100);

/// A batch to write: bytes of a fetch answer, and what the caller knows it by.
#[derive(Debug, Clone)]
pub struct Item<T> {
    pub body: Arc<Vec<u8>>,
    pub range: Range<usize>,
    pub token: T,
}

/// A batch the target acknowledged.
#[derive(Debug)]
pub struct Written<T> {
    pub topic: Arc<str>,
    pub partition: i32,
    pub token: T,
    /// The target offset of its first record; `None` when the broker had it already.
    pub base_offset: Option<i64>,
}

/// A lane's writes failed for good: its batches, oldest first, not known to be written.
#[derive(Debug)]
pub struct Fault<T> {
    pub topic: Arc<str>,
    pub partition: i32,
    /// The broker's answer that ended the lane, or (`waited`) the last one while it waited.
    pub error: ErrorCode,
    /// Set when no write was acknowledged for this long (the delivery timeout): the lane was
    /// given back for waiting, not for an answer that ends it.
    pub waited: Option<Duration>,
    pub tokens: Vec<T>,
}

/// What one [`Writer::pump`] brought.
#[derive(Debug)]
pub struct Progress<T> {
    pub written: Vec<Written<T>>,
    pub faults: Vec<Fault<T>>,
    /// Errors answered for a partition that the writer retries by itself (leadership, too few
    /// replicas, timeouts), or a partition without a leader.
    pub troubles: Vec<(Arc<str>, i32, ErrorCode)>,
    /// A metadata, producer id or connection failure.
    pub failure: Option<String>,
}

impl<T> Default for Progress<T> {
    fn default() -> Self {
        Progress {
            written: Vec::new(),
            faults: Vec::new(),
            troubles: Vec::new(),
            failure: None,
        }
    }
}

type Key = (Arc<str>, i32);

/// A batch's write again: its stamp and ticket, and its bytes.
type Resend = (Stamp, Ticket, Arc<Vec<u8>>, Range<usize>);

struct Lane<T> {
    queue: VecDeque<Item<T>>,
    sequencer: Option<Sequencer<Item<T>>>,
    /// Unacknowledged batches to write again, in order, before any new one.
    resending: VecDeque<Resend>,
    leader: Option<i32>,
    /// No batch of the lane is sent before then: the backoff after a retriable answer.
    retry_at: Option<Instant>,
    /// Since when the lane has had batches pending and none acknowledged.
    waiting_since: Option<Instant>,
    /// What last held the lane up: the error its batches go back with when that lasts longer
    /// than the delivery timeout.
    held_by: ErrorCode,
}

impl<T> Lane<T> {
    fn new() -> Self {
        Lane {
            queue: VecDeque::new(),
            sequencer: None,
            resending: VecDeque::new(),
            leader: None,
            retry_at: None,
            waiting_since: None,
            held_by: ErrorCode::REQUEST_TIMED_OUT,
        }
    }

    /// Batches not yet acknowledged (queued, or written and unanswered).
    fn pending(&self) -> usize {
        self.queue.len() + self.sequencer.as_ref().map_or(0, Sequencer::unacknowledged)
    }

    /// Whether the lane may send now (its backoff over).
    fn ready(&self, now: Instant) -> bool {
        self.retry_at.is_none_or(|at| at <= now)
    }

    /// A write of the lane may not have happened (`error`): its unacknowledged batches are
    /// written again, in order, after [`RETRY_BACKOFF`], and after new metadata when the leader
    /// was the cause.
    fn retry(&mut self, error: ErrorCode) {
        if let Some(sequencer) = self.sequencer.as_mut() {
            self.resending = resend(sequencer);
        }
        self.held_by = error;
        self.retry_at = Some(Instant::now() + RETRY_BACKOFF);
        if error.is_leadership() {
            self.leader = None;
        }
    }

    /// The lane's writes failed for good: its unacknowledged batches (`unacknowledged`, from
    /// the sequencer) and its queued ones go back to the caller, oldest first, and the lane
    /// waits for a sequencer under a new producer id.
    fn fault(
        &mut self,
        key: &Key,
        error: ErrorCode,
        waited: Option<Duration>,
        unacknowledged: Vec<Item<T>>,
    ) -> Fault<T> {
        let mut tokens: Vec<T> = unacknowledged.into_iter().map(|i| i.token).collect();
        tokens.extend(self.queue.drain(..).map(|i| i.token));
        self.resending.clear();
        self.sequencer = None;
        self.retry_at = None;
        self.waiting_since = None;
        Fault {
            topic: key.0.clone(),
            partition: key.1,
            error,
            waited,
            tokens,
        }
    }
}

/// A request outstanding on a leader's connection: its correlation id, and the ticket of each
/// partition's batch in it.
struct Outstanding {
    /// The connection it was sent on ([`crate::Conn::serial`]).
    conn: u64,
    id: i32,
    sent_at: Instant,
    tickets: Vec<(Key, Ticket)>,
}

pub struct Writer<T> {
    cluster: Cluster,
    in_flight: usize,
    lanes: BTreeMap<Key, Lane<T>>,
    outstanding: HashMap<i32, VecDeque<Outstanding>>,
    /// The producer id and epoch new sequencers start with; `None` after a fault, so that the
    /// faulted lane does not start again under the id the broker lost track of.
    producer: Option<(i64, i16)>,
    stale: bool,
    pacer: Pacer,
    /// How long a lane may have batches pending without one acknowledged before they go back
    /// to the caller as a fault.
    delivery_timeout: Duration,
}

impl<T> Writer<T> {
    /// `in_flight`: requests outstanding per connection (librdkafka's `max.in.flight`). The
    /// cluster's connection timeout should exceed [`PRODUCE_TIMEOUT`], so that a write the
    /// target holds (waiting for its replicas) ends in the broker's answer, not in a closed
    /// connection.
    pub fn new(cluster: Cluster, in_flight: usize) -> Self {
        Writer {
            cluster,
            in_flight: in_flight.clamp(1, MAX_IN_FLIGHT),
            lanes: BTreeMap::new(),
            outstanding: HashMap::new(),
            producer: None,
            stale: true,
            pacer: Pacer::new(METADATA_BACKOFF),
            delivery_timeout: DELIVERY_TIMEOUT,
        }
    }

    /// How long a partition's batches may wait for a write that is acknowledged (the leader
    /// unknown, refused, timed out, unreachable) before they go back to the caller as a
    /// [`Fault`] with the last error ([`DELIVERY_TIMEOUT`] unless told otherwise).
    #[must_use]
    pub fn with_delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// Queues a batch for `topic`'s `partition`, after the ones queued before it. A topic name
    /// longer than Kafka allows is refused.
    pub fn push(&mut self, topic: &Arc<str>, partition: i32, item: Item<T>) -> Result<(), Item<T>> {
        if topic.is_empty() || topic.len() > MAX_TOPIC_LEN {
            return Err(item);
        }
        let lane = self
            .lanes
            .entry((topic.clone(), partition))
            .or_insert_with(Lane::new);
        if lane.leader.is_none() {
            self.stale = true;
        }
        lane.waiting_since.get_or_insert_with(Instant::now);
        lane.queue.push_back(item);
        Ok(())
    }

    /// Batches not yet acknowledged (queued, or written and unanswered).
    pub fn pending(&self) -> usize {
        self.lanes.values().map(Lane::pending).sum()
    }

    /// Sends what can be sent (up to `in_flight` requests per leader), then reads the oldest
    /// outstanding answer (blocking until it comes or the connection's timeout). With nothing
    /// to send and nothing outstanding it returns at once, or, when batches wait (for a leader,
    /// a producer id, a retry's backoff), after that wait or [`METADATA_BACKOFF`], whichever
    /// is shorter. Batches that waited longer than the delivery timeout come back as faults.
    pub fn pump(&mut self) -> Progress<T> {
        let mut progress = Progress::default();
        if self.stale {
            self.refresh(&mut progress);
        }
        if self.lanes.values().any(|l| l.sequencer.is_none()) {
            if self.producer.is_none() {
                self.init_producer(&mut progress);
            }
            // Lanes new since the producer id came, or faulted and waiting for a new one.
            if let Some((id, epoch)) = self.producer {
                for lane in self.lanes.values_mut() {
                    if lane.sequencer.is_none() {
                        lane.sequencer = Some(Sequencer::new(id, epoch));
                    }
                }
            }
        }
        let mut sent = false;
        let leaders: Vec<i32> = {
            let mut l: Vec<i32> = self.lanes.values().filter_map(|l| l.leader).collect();
            l.sort_unstable();
            l.dedup();
            l
        };
        for leader in leaders {
            while self.outstanding.get(&leader).map_or(0, VecDeque::len) < self.in_flight {
                match self.send(leader, &mut progress) {
                    Ok(true) => sent = true,
                    Ok(false) => break,
                    Err(e) => {
                        self.lost(leader, e, &mut progress);
                        break;
                    }
                }
            }
        }
        let oldest = self
            .outstanding
            .iter()
            .filter_map(|(&leader, q)| q.front().map(|o| (o.sent_at, leader)))
            .min();
        match oldest {
            Some((_, leader)) => self.receive(leader, &mut progress),
            None if !sent && self.pending() > 0 => std::thread::sleep(self.idle_wait()),
            None => {}
        }
        self.expire(&mut progress);
        progress
    }

    /// How long a pump with batches pending, nothing sent and nothing outstanding waits: until
    /// the first backoff ends, at most [`METADATA_BACKOFF`] (the next metadata request).
    fn idle_wait(&self) -> Duration {
        let now = Instant::now();
        self.lanes
            .values()
            .filter_map(|l| l.retry_at)
            .filter(|&at| at > now)
            .map(|at| at - now)
            .min()
            .map_or(METADATA_BACKOFF, |wait| wait.min(METADATA_BACKOFF))
    }

    /// Lanes whose batches have waited longer than the delivery timeout without one
    /// acknowledged go back to the caller with what held them up: a wait the caller sees, not
    /// one that lasts for ever.
    fn expire(&mut self, progress: &mut Progress<T>) {
        let now = Instant::now();
        for (key, lane) in &mut self.lanes {
            let expired = lane
                .waiting_since
                .is_some_and(|since| now.saturating_duration_since(since) >= self.delivery_timeout);
            if !expired {
                continue;
            }
            let error = lane.held_by;
            let unacknowledged = match lane.sequencer.as_mut().map(|s| s.abandon(error)) {
                Some(Answer::Fault { tokens, .. }) => tokens,
                _ => Vec::new(),
            };
            progress.faults.push(lane.fault(
                key,
                error,
                Some(self.delivery_timeout),
                unacknowledged,
            ));
            // Writes of the old sequences may still land: the lane starts again under a new
            // producer id, as after any fault.
            self.producer = None;
        }
    }

    fn refresh(&mut self, progress: &mut Progress<T>) {
        if !self.pacer.ready() {
            return;
        }
        match self.cluster.metadata(&topics_of(self.lanes.iter())) {
            Ok(metadata) => {
                self.stale = false;
                for ((topic, partition), lane) in &mut self.lanes {
                    let found = metadata
                        .topic(topic)
                        .and_then(|t| t.partitions.iter().find(|p| p.partition == *partition));
                    lane.leader = found.map(|p| p.leader).filter(|&l| l >= 0);
                    if lane.leader.is_none() {
                        self.stale = true;
                        let error = match found {
                            Some(p) if p.error.is_error() => p.error,
                            Some(_) => ErrorCode::LEADER_NOT_AVAILABLE,
                            None => ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                        };
                        lane.held_by = error;
                        progress.troubles.push((topic.clone(), *partition, error));
                    }
                }
            }
            Err(e) => progress.failure = Some(e.to_string()),
        }
    }

    fn init_producer(&mut self, progress: &mut Progress<T>) {
        let Some(leader) = self.lanes.values().find_map(|l| l.leader) else {
            return;
        };
        let answer = self.cluster.broker(leader).and_then(|conn| {
            conn.require(
                protocol::API_INIT_PRODUCER_ID,
                "InitProducerId",
                protocol::INIT_PRODUCER_ID_VERSION,
            )?;
            let (error, id, epoch) = conn.ask(
                |id, client| {
                    let timeout = i32::try_from(PRODUCE_TIMEOUT.as_millis()).unwrap_or(i32::MAX);
                    protocol::init_producer_id_request(id, client, None, timeout)
                },
                protocol::decode_init_producer_id,
            )?;
            conn.check("InitProducerId", error, "")?;
            Ok((id, epoch))
        });
        match answer {
            Ok(producer) => self.producer = Some(producer),
            Err(e @ ConnError::Broker { .. }) => {
                // Retriable (a coordinator still loading) or not, it is asked again on the next
                // pump, after [`METADATA_BACKOFF`]; the error is the caller's to show, and the
                // one the waiting lanes go back with when it lasts.
                if let ConnError::Broker { error, .. } = &e {
                    for lane in self.lanes.values_mut().filter(|l| l.sequencer.is_none()) {
                        lane.held_by = *error;
                    }
                }
                progress.failure = Some(e.to_string());
            }
            Err(e) => self.lost(leader, e, progress),
        }
    }

    /// One request to `leader` with the next batch of each of its lanes; whether it had any.
    /// Once a batch has its sequence, the request is outstanding: if it cannot be sent, the
    /// connection's loss ([`Self::lost`]) has its lanes write again.
    fn send(&mut self, leader: i32, progress: &mut Progress<T>) -> Result<bool, ConnError> {
        let conn = self.cluster.broker(leader)?;
        conn.require(protocol::API_PRODUCE, "Produce", protocol::PRODUCE_VERSION)?;
        let id = conn.correlation();
        let timeout = i32::try_from(PRODUCE_TIMEOUT.as_millis()).unwrap_or(i32::MAX);
        let mut request = ProduceRequest::new(id, conn.client_id(), None, -1, timeout, 1 << 20)?;
        let mut tickets = Vec::new();
        let mut topic: Option<Arc<str>> = None;
        let now = Instant::now();
        for (key, lane) in &mut self.lanes {
            if lane.leader != Some(leader) || !lane.ready(now) {
                continue;
            }
            let Some(sequencer) = lane.sequencer.as_mut() else {
                continue;
            };
            let next = if let Some(resend) = lane.resending.pop_front() {
                Some(resend)
            } else if sequencer.may_send()
                && let Some(item) = lane.queue.pop_front()
            {
                let records = batch::batches(&item.body[item.range.clone()])
                    .next()
                    .and_then(Result::ok)
                    .map_or(0, |b| b.header.record_count);
                let (body, range) = (item.body.clone(), item.range.clone());
                sequencer
                    .assign(records, item)
                    .map(|(stamp, ticket)| (stamp, ticket, body, range))
            } else {
                None
            };
            let Some((stamp, ticket, body, range)) = next else {
                continue;
            };
            if topic.as_ref() != Some(&key.0) {
                // Names were checked when pushed ([`Self::push`]): this cannot fail.
                request.topic(&key.0)?;
                topic = Some(key.0.clone());
            }
            let written = request.partition::<ConnError>(key.1, |out| {
                let Some(Ok(b)) = batch::batches(&body[range]).next() else {
                    return Err(ConnError::Batch {
                        message: "a queued range is not one batch".into(),
                    });
                };
                batch::restamp(&b, &stamp, out).map_err(|e| ConnError::Batch {
                    message: e.to_string(),
                })
            });
            match written {
                Ok(()) => tickets.push((key.clone(), ticket)),
                Err(_) => {
                    // The bytes changed since the source broker wrote them (their CRC fails):
                    // no write of them can be right. The lane's batches go back to the caller.
                    if let Answer::Fault { error, tokens } =
                        sequencer.abandon(ErrorCode::CORRUPT_MESSAGE)
                    {
                        progress.faults.push(lane.fault(key, error, None, tokens));
                        self.producer = None;
                    }
                }
            }
        }
        if tickets.is_empty() {
            return Ok(false);
        }
        let frame = request.finish();
        let conn = self.cluster.broker(leader)?;
        let serial = conn.serial();
        self.outstanding
            .entry(leader)
            .or_default()
            .push_back(Outstanding {
                conn: serial,
                id,
                sent_at: Instant::now(),
                tickets,
            });
        conn.send(&frame?)?;
        Ok(true)
    }

    fn receive(&mut self, leader: i32, progress: &mut Progress<T>) {
        let Some(request) = self
            .outstanding
            .get_mut(&leader)
            .and_then(VecDeque::pop_front)
        else {
            return;
        };
        let answer = self.cluster.broker(leader).and_then(|conn| {
            if conn.serial() != request.conn {
                return Err(ConnError::Replaced {
                    peer: conn.peer().to_owned(),
                });
            }
            let body = conn.recv(request.id)?;
            protocol::decode_produce(&body).map_err(|e| conn.decode(e))
        });
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                self.outstanding
                    .entry(leader)
                    .or_default()
                    .push_front(request);
                self.lost(leader, e, progress);
                return;
            }
        };
        for (key, ticket) in request.tickets {
            let answered = answer
                .topics
                .iter()
                .filter(|(t, _)| *t == *key.0)
                .flat_map(|(_, p)| p)
                .find(|p| p.partition == key.1);
            let (error, base_offset) = answered.map_or(
                // Not answered: as if the write may not have happened.
                (ErrorCode::NOT_LEADER_OR_FOLLOWER, -1),
                |p| (p.error, p.base_offset),
            );
            self.settle(&key, ticket, error, base_offset, progress);
        }
    }

    fn settle(
        &mut self,
        key: &Key,
        ticket: Ticket,
        error: ErrorCode,
        base_offset: i64,
        progress: &mut Progress<T>,
    ) {
        let Some(lane) = self.lanes.get_mut(key) else {
            return;
        };
        let Some(sequencer) = lane.sequencer.as_mut() else {
            return;
        };
        match sequencer.answer(ticket, error, base_offset) {
            Answer::Written { token, base_offset } => {
                lane.waiting_since = (lane.pending() > 0).then(Instant::now);
                progress.written.push(Written {
                    topic: key.0.clone(),
                    partition: key.1,
                    token: token.token,
                    base_offset,
                });
            }
            Answer::Resend(error) => {
                progress.troubles.push((key.0.clone(), key.1, error));
                // Whatever the error, the leader may have moved: metadata is asked again
                // (paced), and the lane writes again after its backoff.
                self.stale = true;
                lane.retry(error);
            }
            Answer::Fault { error, tokens } => {
                progress.faults.push(lane.fault(key, error, None, tokens));
                self.producer = None;
            }
            Answer::Stale => {}
        }
    }

    /// `leader`'s connection failed: what it carried is written again, after new metadata.
    fn lost(&mut self, leader: i32, error: ConnError, progress: &mut Progress<T>) {
        self.cluster.forget(leader);
        self.stale = true;
        progress.failure = Some(error.to_string());
        let requests = self.outstanding.remove(&leader).unwrap_or_default();
        let mut keys: Vec<Key> = requests
            .into_iter()
            .flat_map(|r| r.tickets.into_iter().map(|(k, _)| k))
            .collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            if let Some(lane) = self.lanes.get_mut(&key) {
                lane.retry(ErrorCode::NETWORK_EXCEPTION);
            }
        }
        for lane in self.lanes.values_mut() {
            if lane.leader == Some(leader) {
                lane.leader = None;
            }
        }
    }
}

/// A new attempt of every unacknowledged batch of a lane, oldest first.
fn resend<T>(sequencer: &mut Sequencer<Item<T>>) -> VecDeque<Resend> {
    sequencer
        .resend()
        .into_iter()
        .map(|(stamp, ticket, item)| (stamp, ticket, item.body.clone(), item.range.clone()))
        .collect()
}

#[cfg(test)]
mod fake_broker;

#[cfg(test)]
mod tests {
    use super::fake_broker::{self, FakeBroker};
    use super::*;
    use crate::{Conn, Options, Security};

    const LEADER: i32 = 1;

    fn options() -> Options {
        Options {
            client_id: "mf".into(),
            timeout: Duration::from_secs(5),
            max_frame: 1 << 20,
            address_check: None,
        }
    }

    fn topic() -> Arc<str> {
        Arc::from("t")
    }

    /// A writer whose leader's connection reads `answers`, with one request outstanding on it
    /// (correlation id 0) holding the first batch of partitions 0 and 1 (tokens 0 and 1),
    /// and the second batch of partition 0 queued (token 2).
    fn writer_answered_by(answers: Vec<u8>) -> Writer<u32> {
        let cluster =
            Cluster::new("127.0.0.1:9", Security::default(), options()).expect("one address");
        let mut writer = Writer::new(cluster, 1);
        let conn = Conn::over("memory", std::io::Cursor::new(answers), &options());
        let serial = conn.serial();
        writer.cluster.adopt(LEADER, conn);
        let body = Arc::new(vec![0u8; 61]);
        for (partition, token) in [(0, 0), (1, 1), (0, 2)] {
            let item = Item {
                body: body.clone(),
                range: 0..61,
                token,
            };
            assert!(writer.push(&topic(), partition, item).is_ok());
        }
        let mut tickets = Vec::new();
        for (key, lane) in &mut writer.lanes {
            lane.leader = Some(LEADER);
            let mut sequencer = Sequencer::new(5, 0);
            let item = lane.queue.pop_front().expect("a queued batch");
            let (_, ticket) = sequencer.assign(1, item).expect("room");
            tickets.push((key.clone(), ticket));
            lane.sequencer = Some(sequencer);
        }
        writer
            .outstanding
            .entry(LEADER)
            .or_default()
            .push_back(Outstanding {
                conn: serial,
                id: 0,
                sent_at: Instant::now(),
                tickets,
            });
        writer
    }

    /// A Produce v8 answer frame for request `id`: topic `name`'s (partition, error, base
    /// offset).
    fn answer(id: i32, name: &str, partitions: &[(i32, i16, i64)]) -> Vec<u8> {
        let mut body = id.to_be_bytes().to_vec();
        body.extend_from_slice(&1i32.to_be_bytes());
        body.extend_from_slice(&i16::try_from(name.len()).unwrap_or(0).to_be_bytes());
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(&i32::try_from(partitions.len()).unwrap_or(0).to_be_bytes());
        for (partition, error, base_offset) in partitions {
            body.extend_from_slice(&partition.to_be_bytes());
            body.extend_from_slice(&error.to_be_bytes());
            body.extend_from_slice(&base_offset.to_be_bytes());
            body.extend_from_slice(&(-1i64).to_be_bytes()); // log append time
            body.extend_from_slice(&0i64.to_be_bytes()); // log start
            body.extend_from_slice(&0i32.to_be_bytes()); // no record errors
            body.extend_from_slice(&(-1i16).to_be_bytes()); // no message
        }
        body.extend_from_slice(&0i32.to_be_bytes()); // throttle
        let mut frame = i32::try_from(body.len())
            .unwrap_or(0)
            .to_be_bytes()
            .to_vec();
        frame.extend_from_slice(&body);
        frame
    }

    fn receive(writer: &mut Writer<u32>) -> Progress<u32> {
        let mut progress = Progress::default();
        writer.receive(LEADER, &mut progress);
        progress
    }

    fn written(progress: &Progress<u32>) -> Vec<(i32, u32, Option<i64>)> {
        progress
            .written
            .iter()
            .map(|w| (w.partition, w.token, w.base_offset))
            .collect()
    }

    fn resending(writer: &Writer<u32>) -> Vec<usize> {
        writer.lanes.values().map(|l| l.resending.len()).collect()
    }

    #[test]
    fn an_answer_acknowledges_its_batches() {
        let mut writer = writer_answered_by(answer(0, "t", &[(0, 0, 40), (1, 0, -7)]));
        let progress = receive(&mut writer);
        // A negative base offset is not an offset.
        assert_eq!(written(&progress), vec![(0, 0, Some(40)), (1, 1, None)]);
        assert_eq!(writer.pending(), 1, "the queued batch");
    }

    #[test]
    fn another_requests_answer_drops_the_connection_and_writes_again() {
        for frame in [
            answer(7, "t", &[(0, 0, 40), (1, 0, 41)]),
            answer(0, "t", &[(0, 0, 40)])[..20].to_vec(),
            (i32::MAX).to_be_bytes().to_vec(),
            Vec::new(),
        ] {
            let mut writer = writer_answered_by(frame);
            let progress = receive(&mut writer);
            assert!(progress.written.is_empty() && progress.faults.is_empty());
            assert!(progress.failure.is_some());
            assert_eq!(resending(&writer), vec![1, 1], "both batches written again");
            assert!(writer.lanes.values().all(|l| l.leader.is_none()));
            assert_eq!(writer.pending(), 3, "nothing lost");
        }
    }

    #[test]
    fn partitions_left_out_or_not_asked_for_are_written_again() {
        let frame = answer(0, "t", &[(7, 0, 1), (1, 0, 41), (1, 0, 99), (-1, 0, 3)]);
        let mut writer = writer_answered_by(frame);
        let progress = receive(&mut writer);
        assert_eq!(written(&progress), vec![(1, 1, Some(41))]);
        assert_eq!(
            progress.troubles,
            vec![(topic(), 0, ErrorCode::NOT_LEADER_OR_FOLLOWER)]
        );
        assert_eq!(resending(&writer), vec![1, 0]);
        // Another topic's answer acknowledges nothing of this one.
        let mut writer = writer_answered_by(answer(0, "u", &[(0, 0, 1), (1, 0, 2)]));
        let progress = receive(&mut writer);
        assert!(progress.written.is_empty());
        assert_eq!(resending(&writer), vec![1, 1]);
    }

    #[test]
    fn an_error_the_writer_cannot_resolve_gives_the_lane_back() {
        // 87: INVALID_RECORD; the queued batch goes back with the unacknowledged one.
        let mut writer = writer_answered_by(answer(0, "t", &[(0, 87, -1), (1, 0, 41)]));
        let progress = receive(&mut writer);
        assert_eq!(written(&progress), vec![(1, 1, Some(41))]);
        let faults: Vec<_> = progress
            .faults
            .iter()
            .map(|f| (f.partition, f.tokens.clone()))
            .collect();
        assert_eq!(faults, vec![(0, vec![0, 2])]);
        assert_eq!(writer.pending(), 0);
    }

    const NOT_LEADER: ErrorCode = ErrorCode::NOT_LEADER_OR_FOLLOWER;

    /// A writer whose only broker is `broker` (leading every partition), its producer id
    /// known, with `batches` batches of 10 records queued for partition 0 (tokens 0, 1, ...).
    fn writer_on(broker: &FakeBroker, batches: u32) -> Writer<u32> {
        let cluster = Cluster::new(fake_broker::ADDRESS, Security::default(), options())
            .expect("one address");
        let mut writer = Writer::new(cluster, 5);
        let mut produce = Conn::over(fake_broker::ADDRESS, broker.connection(), &options());
        produce.serve(protocol::API_PRODUCE, protocol::PRODUCE_VERSION);
        let mut metadata = Conn::over(fake_broker::ADDRESS, broker.connection(), &options());
        metadata.serve(protocol::API_METADATA, protocol::METADATA_VERSION);
        writer.cluster.adopt(fake_broker::NODE, produce);
        writer.cluster.adopt_metadata(metadata);
        writer.producer = Some((5, 0));
        let body = Arc::new(fake_broker::source_batch(10));
        for token in 0..batches {
            let item = Item {
                body: body.clone(),
                range: 0..body.len(),
                token,
            };
            assert!(writer.push(&topic(), 0, item).is_ok());
        }
        writer
    }

    /// Pumps until nothing is pending or `limit` passed: the tokens written, and the faults.
    fn pump_until_settled(
        writer: &mut Writer<u32>,
        limit: Duration,
    ) -> (Vec<u32>, Vec<Fault<u32>>) {
        let started = Instant::now();
        let (mut written, mut faults) = (Vec::new(), Vec::new());
        while writer.pending() > 0 && started.elapsed() < limit {
            let progress = writer.pump();
            written.extend(progress.written.iter().map(|w| w.token));
            faults.extend(progress.faults);
        }
        (written, faults)
    }

    fn faults_of(faults: &[Fault<u32>]) -> Vec<(i32, ErrorCode, Vec<u32>)> {
        faults
            .iter()
            .map(|f| (f.partition, f.error, f.tokens.clone()))
            .collect()
    }

    /// A topic created a moment ago: its leader answers the first write NOT_LEADER_OR_FOLLOWER
    /// (its election not yet applied), then takes writes. It keeps no sequence of the producer
    /// yet, so it would take a later batch first at any sequence (and then refuse the first
    /// one as out of order): every batch lands once, in order, and nothing faults.
    #[test]
    fn a_new_partitions_first_refusal_neither_reorders_nor_faults() {
        let broker = FakeBroker::refusing(1, NOT_LEADER);
        let mut writer = writer_on(&broker, 3);
        let (written, faults) = pump_until_settled(&mut writer, Duration::from_secs(5));
        assert_eq!(faults_of(&faults), vec![]);
        assert_eq!(written, vec![0, 1, 2]);
        let state = broker.state();
        assert_eq!(
            state.log.get(&0),
            Some(&vec![0, 10, 20]),
            "the target's order"
        );
        assert!(state.metadata >= 2, "the leader was asked for again");
    }

    /// A leader that never takes the write: the writer asks for metadata and writes again,
    /// paced (no busy loop), and after its delivery timeout gives the lane back as a fault
    /// with the leader's error, instead of waiting for ever.
    #[test]
    fn a_refusal_that_lasts_gives_the_lane_back_after_the_delivery_timeout() {
        for error in [NOT_LEADER, ErrorCode(19), ErrorCode(7)] {
            let broker = FakeBroker::refusing(usize::MAX, error);
            let timeout = Duration::from_millis(800);
            let mut writer = writer_on(&broker, 3).with_delivery_timeout(timeout);
            let started = Instant::now();
            let (written, faults) = pump_until_settled(&mut writer, Duration::from_secs(5));
            let elapsed = started.elapsed();
            assert!(written.is_empty());
            assert_eq!(
                faults_of(&faults),
                vec![(0, error, vec![0, 1, 2])],
                "{error}"
            );
            assert!(
                faults.iter().all(|f| f.waited == Some(timeout)),
                "given back for waiting, and says so"
            );
            assert!(
                elapsed >= timeout && elapsed < Duration::from_secs(3),
                "{elapsed:?}"
            );
            let state = broker.state();
            // One write per backoff at most: 0.8 s of them, not thousands.
            assert!(
                (2..=10).contains(&state.requests),
                "{} writes",
                state.requests
            );
            assert_eq!(state.log.get(&0), None);
        }
    }

    /// A partition whose leader the metadata never names: its batches go back to the caller
    /// after the delivery timeout, metadata asked for meanwhile at the metadata backoff.
    #[test]
    fn a_partition_without_a_leader_for_too_long_is_given_back() {
        let broker = FakeBroker::default();
        broker.state().leaderless = true;
        let timeout = Duration::from_millis(800);
        let mut writer = writer_on(&broker, 2).with_delivery_timeout(timeout);
        let (written, faults) = pump_until_settled(&mut writer, Duration::from_secs(5));
        assert!(written.is_empty());
        assert_eq!(
            faults_of(&faults),
            vec![(0, ErrorCode::LEADER_NOT_AVAILABLE, vec![0, 1])]
        );
        let state = broker.state();
        assert_eq!(state.requests, 0, "nothing written without a leader");
        assert!(
            (2..=6).contains(&state.metadata),
            "{} metadata requests",
            state.metadata
        );
    }

    /// A leader that drops its connection with a write unanswered and cannot be reached
    /// again: the writer asks for metadata and tries again, paced, and gives the lane back
    /// after the delivery timeout as a connection failure, instead of waiting.
    #[test]
    fn a_leader_that_cannot_be_reached_gives_the_lane_back() {
        let broker = FakeBroker::default();
        broker.state().mute = true;
        let timeout = Duration::from_millis(800);
        let mut writer = writer_on(&broker, 2).with_delivery_timeout(timeout);
        let (written, faults) = pump_until_settled(&mut writer, Duration::from_secs(5));
        assert!(written.is_empty());
        assert_eq!(
            faults_of(&faults),
            vec![(0, ErrorCode::NETWORK_EXCEPTION, vec![0, 1])]
        );
        let state = broker.state();
        assert_eq!(state.requests, 1, "the one write the connection took");
        assert!(
            (2..=6).contains(&state.metadata),
            "{} metadata requests",
            state.metadata
        );
    }
}
