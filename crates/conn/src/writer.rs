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

/// How long one [`Writer::pump`] looks for an answer among several leaders before it returns
/// to the caller, who may have batches for a leader that is not the slow one.
const ANSWER_WAIT: Duration = Duration::from_millis(20);
/// How long each look waits on the oldest request's leader.
const ANSWER_STEP: Duration = Duration::from_millis(2);

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

    /// Sends what can be sent (up to `in_flight` requests per leader), then reads one answer:
    /// with requests out to one leader, its oldest (blocking until it comes or the
    /// connection's timeout); to several, the first to arrive, or none within
    /// [`ANSWER_WAIT`]. With nothing to send and nothing outstanding it returns at once, or,
    /// when batches wait (for a leader, a producer id, a retry's backoff), after that wait or
    /// [`METADATA_BACKOFF`], whichever is shorter. Batches that waited longer than the
    /// delivery timeout come back as faults.
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
        let mut waiting: Vec<(Instant, i32)> = (self.outstanding.iter())
            .filter_map(|(&leader, q)| q.front().map(|o| (o.sent_at, leader)))
            .collect();
        waiting.sort_unstable();
        let next = match waiting.as_slice() {
            [] => None,
            // Nothing else to serve meanwhile: read it, by its connection's timeout.
            [(_, only)] => Some(*only),
            several => self.first_to_answer(several, &mut progress),
        };
        match next {
            Some(leader) => self.receive(leader, &mut progress),
            None if waiting.is_empty() && !sent && self.pending() > 0 => {
                std::thread::sleep(self.idle_wait());
            }
            None => {}
        }
        self.expire(&mut progress);
        progress
    }

    /// Of the leaders with requests out (`waiting`, oldest request first), the first whose
    /// answer has begun to arrive, looked for for at most [`ANSWER_WAIT`]: a slow leader never
    /// holds the other leaders' answers, nor the caller's next batches, for longer. A leader
    /// whose oldest request has had no answer for its connection's timeout has the connection
    /// dropped and its batches written again ([`Self::lost`]): every request has a deadline,
    /// counted from its sending.
    fn first_to_answer(
        &mut self,
        waiting: &[(Instant, i32)],
        progress: &mut Progress<T>,
    ) -> Option<i32> {
        let until = Instant::now() + ANSWER_WAIT;
        loop {
            // A look at each, then a short wait on the oldest.
            let looks = waiting.iter().map(|&(_, l)| (l, Duration::ZERO));
            let step = waiting.first().map(|&(_, l)| (l, ANSWER_STEP));
            for (leader, wait) in looks.chain(step) {
                let Some(conn) = self.cluster.connected(leader) else {
                    // Gone: reading it says so, and its batches are written again.
                    return Some(leader);
                };
                if conn.answer_waiting(wait).unwrap_or(true) {
                    return Some(leader);
                }
            }
            for &(sent_at, leader) in waiting {
                let Some(conn) = self.cluster.connected(leader) else {
                    continue;
                };
                if sent_at.elapsed() > conn.timeout() {
                    let error = ConnError::Io {
                        peer: conn.peer().to_owned(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the broker did not answer a write within the request timeout",
                        ),
                    };
                    self.lost(leader, error, progress);
                    return None;
                }
            }
            if Instant::now() >= until {
                return None;
            }
        }
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
        let at_rest = self.outstanding.get(&leader).is_none_or(VecDeque::is_empty);
        let conn = if at_rest {
            self.cluster.broker_at_rest(leader)
        } else {
            self.cluster.broker(leader)
        };
        let answer = conn.and_then(|conn| {
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
        // A session about to end (KIP-368) takes no more requests: once its answers are in, the
        // next request goes on a new connection (a new token), never into the broker's close.
        if (self.cluster.connected(leader)).is_some_and(|c| c.session_ending()) {
            if self.outstanding.get(&leader).is_some_and(|q| !q.is_empty()) {
                return Ok(false);
            }
            self.cluster.renew_ending(leader);
        }
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
mod tests;
