//! Whole record batches written idempotently to the leaders of their target partitions.
//!
//! Each partition is a lane: batches queued in order, given their sequences by a
//! [`Sequencer`] when sent, at most [`MAX_IN_FLIGHT`] unacknowledged. Every leader gets
//! requests holding one batch per partition (what Produce v3 and later allow), at most
//! `in_flight` of them outstanding on its connection. An answer that says a batch may not
//! have been written (the leader moved, a timeout, too few replicas) has the lane write its
//! unacknowledged batches again, in order and with the same sequences, after asking for
//! metadata when leadership was the cause; a broken connection does the same for every lane
//! it carried. When the broker no longer knows the producer's sequences, the lane's batches
//! (unacknowledged and queued) go back to the caller as a [`Fault`], to be copied again from
//! the last written position under a new producer id.

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
    pub error: ErrorCode,
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
}

impl<T> Lane<T> {
    /// The lane's writes failed for good: its unacknowledged batches (`unacknowledged`, from
    /// the sequencer) and its queued ones go back to the caller, oldest first, and the lane
    /// waits for a sequencer under a new producer id.
    fn fault(&mut self, key: &Key, error: ErrorCode, unacknowledged: Vec<Item<T>>) -> Fault<T> {
        let mut tokens: Vec<T> = unacknowledged.into_iter().map(|i| i.token).collect();
        tokens.extend(self.queue.drain(..).map(|i| i.token));
        self.resending.clear();
        self.sequencer = None;
        Fault {
            topic: key.0.clone(),
            partition: key.1,
            error,
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
        }
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
            .or_insert_with(|| Lane {
                queue: VecDeque::new(),
                sequencer: None,
                resending: VecDeque::new(),
                leader: None,
            });
        if lane.leader.is_none() {
            self.stale = true;
        }
        lane.queue.push_back(item);
        Ok(())
    }

    /// Batches not yet acknowledged (queued, or written and unanswered).
    pub fn pending(&self) -> usize {
        self.lanes
            .values()
            .map(|l| l.queue.len() + l.sequencer.as_ref().map_or(0, Sequencer::unacknowledged))
            .sum()
    }

    /// Sends what can be sent (up to `in_flight` requests per leader), then reads the oldest
    /// outstanding answer (blocking until it comes or the connection's timeout). With nothing
    /// to send and nothing outstanding it returns at once, or, when batches wait for a leader
    /// or a producer id, after [`METADATA_BACKOFF`].
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
            None if !sent && self.lanes.values().any(|l| !l.queue.is_empty()) => {
                std::thread::sleep(METADATA_BACKOFF);
            }
            None => {}
        }
        progress
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
                // pump, after [`METADATA_BACKOFF`]; the error is the caller's to show.
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
        for (key, lane) in &mut self.lanes {
            if lane.leader != Some(leader) {
                continue;
            }
            let Some(sequencer) = lane.sequencer.as_mut() else {
                continue;
            };
            let next = if let Some(resend) = lane.resending.pop_front() {
                Some(resend)
            } else if sequencer.has_room()
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
                        progress.faults.push(lane.fault(key, error, tokens));
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
            Answer::Written { token, base_offset } => progress.written.push(Written {
                topic: key.0.clone(),
                partition: key.1,
                token: token.token,
                base_offset,
            }),
            Answer::Resend(error) => {
                progress.troubles.push((key.0.clone(), key.1, error));
                self.stale |= error.is_leadership();
                lane.resending = resend(sequencer);
            }
            Answer::Fault { error, tokens } => {
                progress.faults.push(lane.fault(key, error, tokens));
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
            if let Some(lane) = self.lanes.get_mut(&key)
                && let Some(sequencer) = lane.sequencer.as_mut()
            {
                lane.resending = resend(sequencer);
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
mod tests {
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
}
