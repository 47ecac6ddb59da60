//! Record batches of many partitions, fetched `read_committed` from each partition's leader.
//!
//! A round ([`Fetcher::round`]) sends one fetch to every leader of an assigned partition before
//! reading any answer, so a round takes as long as the slowest leader, not the sum of them.
//! What comes back is handed on as the answer's bytes and the ranges of the batches to copy
//! (aborted transactions and markers left out, positions moved past them); nothing is decoded
//! or copied here.
//!
//! Leadership errors and broken connections make the next round ask for metadata again
//! (at most every [`METADATA_BACKOFF`]); errors only the caller can resolve (an offset out of
//! range, a topic it may not read, records that do not parse) pause the partition until the
//! caller moves it ([`Fetcher::assign`]). Every error is reported in the round it happened.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use mirrorflow_core::batch::{self, BatchError};
use mirrorflow_core::protocol::metadata::Metadata;
use mirrorflow_core::protocol::{self, ErrorCode, FetchPartition, FetchRequest, Isolation};

use crate::cluster::{Pacer, topics_of};
use crate::{Cluster, ConnError};

/// The shortest wait between two metadata requests of a fetcher whose leaders moved.
pub const METADATA_BACKOFF: Duration = Duration::from_millis(200);

/// A fetch's bounds (a consumer's `fetch.max.bytes`, `max.partition.fetch.bytes`,
/// `fetch.max.wait.ms`).
#[derive(Debug, Clone, Copy)]
pub struct FetchLimits {
    pub max_bytes: i32,
    pub partition_max_bytes: i32,
    pub max_wait: Duration,
}

/// One partition's part of a fetch answer: the batches to copy, in offset order.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub topic: Arc<str>,
    pub partition: i32,
    /// The answer's body; `batches` are ranges of it.
    pub body: Arc<Vec<u8>>,
    pub batches: Vec<Range<usize>>,
    /// The position after this answer (past the batches, and past markers and aborted
    /// batches after them).
    pub next_offset: i64,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
}

/// What went wrong for one partition.
#[derive(Debug, Clone, PartialEq)]
pub enum Trouble {
    /// The leader answered this error.
    Broker(ErrorCode),
    /// The partition's leader is not known, or its connection failed; metadata is asked again.
    NoLeader,
    /// The records do not parse.
    Records(BatchError),
    /// The answer held part of a batch and no whole one: a batch larger than
    /// [`FetchLimits::max_bytes`].
    BatchTooLarge { partial: usize },
    /// The leader's answer was larger than the connection reads (a broker returns the first
    /// batch of a fetch whole, whatever its size); the connection was dropped.
    FrameTooLarge { size: i64, max: usize },
}

#[derive(Debug, Clone, PartialEq)]
pub struct PartitionTrouble {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub trouble: Trouble,
    /// Whether the partition waits for the caller (not retried by itself).
    pub paused: bool,
}

/// What one round brought.
#[derive(Debug, Default)]
pub struct Round {
    pub fetched: Vec<Fetched>,
    pub troubles: Vec<PartitionTrouble>,
    /// A metadata request or a connection that failed this round.
    pub failure: Option<String>,
}

#[derive(Debug)]
struct Part {
    offset: i64,
    paused: bool,
}

pub struct Fetcher {
    cluster: Cluster,
    limits: FetchLimits,
    parts: BTreeMap<(Arc<str>, i32), Part>,
    leaders: HashMap<(Arc<str>, i32), i32>,
    stale: bool,
    /// A partition whose leader is not known was assigned since the last metadata: the next
    /// round asks for it whatever the pacer says. The pacer is for leaders that moved; a
    /// caller that reads one partition after another (the verifier) would otherwise find
    /// every partition after the first without a leader for 200 ms.
    unknown: bool,
    pacer: Pacer,
    /// Where the next round starts in the partition order, so that every partition is in turn
    /// the first of its request (a broker returns the first partition's first batch whole,
    /// whatever its size).
    rotation: usize,
    /// Partitions that were in an answer too large to read ([`Trouble::FrameTooLarge`]): one
    /// of them holds a batch larger than a connection reads, and which is not known. Each is
    /// fetched alone until an answer of its own reads (cleared) or is too large again (true:
    /// the culprit, fetched alone and last of its leader's requests, so the others' answers on
    /// the connection are read before it drops it). Only assigned partitions are kept.
    suspects: BTreeMap<(Arc<str>, i32), bool>,
}

/// One fetch request: its leader and its partitions.
type Request = (i32, Vec<(Arc<str>, FetchPartition)>);

impl Fetcher {
    pub fn new(cluster: Cluster, limits: FetchLimits) -> Self {
        Fetcher {
            cluster,
            limits,
            parts: BTreeMap::new(),
            leaders: HashMap::new(),
            stale: true,
            unknown: false,
            pacer: Pacer::new(METADATA_BACKOFF),
            rotation: 0,
            suspects: BTreeMap::new(),
        }
    }

    /// Fetches `topic`'s `partition` from `offset` on (again, when it was paused).
    pub fn assign(&mut self, topic: &str, partition: i32, offset: i64) {
        let key = (Arc::from(topic), partition);
        if !self.leaders.contains_key(&key) {
            self.stale = true;
            self.unknown = true;
        }
        self.parts.insert(
            key,
            Part {
                offset,
                paused: false,
            },
        );
    }

    /// Stops fetching `topic`'s `partition`. Its leader stays known: assigned again, it is
    /// fetched without asking for metadata first (a leader that moved meanwhile answers
    /// NotLeader, and metadata is asked then).
    pub fn unassign(&mut self, topic: &str, partition: i32) {
        let key = (Arc::from(topic), partition);
        self.parts.remove(&key);
        self.suspects.remove(&key);
    }

    /// The cluster the fetcher reads from, for the requests it does not make itself
    /// (metadata, offsets). Its broker connections are the fetcher's: use them only between
    /// rounds.
    pub fn cluster_mut(&mut self) -> &mut Cluster {
        &mut self.cluster
    }

    /// The next offset `topic`'s `partition` is fetched from.
    pub fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        self.parts
            .get(&(Arc::from(topic), partition))
            .map(|p| p.offset)
    }

    /// One fetch from every leader of an assigned partition, answers read in turn. Returns at
    /// once with nothing to fetch only after waiting `max_wait` (no busy loop).
    pub fn round(&mut self) -> Round {
        let mut round = Round::default();
        if self.stale {
            self.refresh(&mut round);
        }
        let requests = self.requests(&mut round);
        if requests.is_empty() {
            std::thread::sleep(self.limits.max_wait);
            return round;
        }
        let mut sent = Vec::with_capacity(requests.len());
        for (leader, partitions) in requests {
            match self.send(leader, &partitions) {
                Ok(sent_on) => sent.push((leader, sent_on, partitions)),
                Err(e) => self.lost(leader, &partitions, e, &mut round),
            }
        }
        for (leader, (serial, id), partitions) in sent {
            let read = self
                .cluster
                .broker(leader)
                .and_then(|conn| {
                    if conn.serial() != serial {
                        return Err(ConnError::Replaced {
                            peer: conn.peer().to_owned(),
                        });
                    }
                    conn.recv(id)
                })
                .and_then(|body| self.read(leader, &Arc::new(body), &mut round));
            match read {
                Ok(()) => self.cleared(&partitions),
                Err(e) => self.lost(leader, &partitions, e, &mut round),
            }
        }
        round
    }

    /// Fetches with other bounds from the next round on (a reader that widens its fetches
    /// round by round).
    pub fn set_limits(&mut self, limits: FetchLimits) {
        self.limits = limits;
    }

    fn refresh(&mut self, round: &mut Round) {
        // A newly assigned partition is asked for at once (and counts as a request for the
        // pacer); only leaders that moved wait for it.
        let allowed = self.pacer.ready();
        if !std::mem::take(&mut self.unknown) && !allowed {
            return;
        }
        let asked: Vec<String> = topics_of(self.parts.iter())
            .into_iter()
            .map(str::to_owned)
            .collect();
        let topics: Vec<&str> = asked.iter().map(String::as_str).collect();
        match self.cluster.metadata(&topics) {
            Ok(metadata) => {
                self.stale = false;
                self.learn(&topics, &metadata);
            }
            Err(e) => round.failure = Some(e.to_string()),
        }
    }

    /// The requests of a round: per leader, one with its partitions, then one per suspect
    /// partition ([`Self::suspects`]), culprits last. Partitions without a leader are reported.
    fn requests(&mut self, round: &mut Round) -> Vec<Request> {
        let by_leader = self.by_leader(round);
        let mut requests = Vec::with_capacity(by_leader.len());
        for (leader, partitions) in by_leader {
            let (mut alone, together): (Vec<_>, Vec<_>) = partitions
                .into_iter()
                .partition(|(t, p)| self.suspects.contains_key(&(t.clone(), p.partition)));
            if !together.is_empty() {
                requests.push((leader, together));
            }
            // Stable: suspects keep the round's rotation among themselves.
            alone.sort_by_key(|(t, p)| self.suspects.get(&(t.clone(), p.partition)) == Some(&true));
            requests.extend(alone.into_iter().map(|p| (leader, vec![p])));
        }
        requests
    }

    /// Takes the leaders `metadata` gives for the topics `asked`: theirs are replaced, the
    /// other topics' kept (bounded by the partitions of the topics ever asked for).
    fn learn(&mut self, asked: &[&str], metadata: &Metadata) {
        let asked: HashSet<&str> = asked.iter().copied().collect();
        self.leaders.retain(|(t, _), _| !asked.contains(t.as_ref()));
        for t in metadata
            .topics
            .iter()
            .filter(|t| asked.contains(t.name.as_str()))
        {
            let name: Arc<str> = Arc::from(t.name.as_str());
            for p in &t.partitions {
                if p.leader >= 0 {
                    self.leaders.insert((name.clone(), p.partition), p.leader);
                }
            }
        }
    }

    /// The partitions to fetch, by leader; those without one are reported.
    fn by_leader(&mut self, round: &mut Round) -> BTreeMap<i32, Vec<(Arc<str>, FetchPartition)>> {
        let mut by_leader: BTreeMap<i32, Vec<(Arc<str>, FetchPartition)>> = BTreeMap::new();
        let count = self.parts.len();
        self.rotation = if count == 0 {
            0
        } else {
            (self.rotation + 1) % count
        };
        let (tail, head) = {
            let all: Vec<_> = self.parts.iter().collect();
            let (a, b) = all.split_at(self.rotation.min(all.len()));
            (a.to_vec(), b.to_vec())
        };
        for ((topic, partition), part) in head.into_iter().chain(tail) {
            if part.paused {
                continue;
            }
            match self.leaders.get(&(topic.clone(), *partition)) {
                Some(&leader) => by_leader.entry(leader).or_default().push((
                    topic.clone(),
                    FetchPartition {
                        partition: *partition,
                        offset: part.offset,
                        max_bytes: self.limits.partition_max_bytes,
                    },
                )),
                None => {
                    self.stale = true;
                    round.troubles.push(PartitionTrouble {
                        topic: topic.clone(),
                        partition: *partition,
                        offset: part.offset,
                        trouble: Trouble::NoLeader,
                        paused: false,
                    });
                }
            }
        }
        by_leader
    }

    fn send(
        &mut self,
        leader: i32,
        partitions: &[(Arc<str>, FetchPartition)],
    ) -> Result<(u64, i32), ConnError> {
        let mut topics: Vec<(&str, Vec<FetchPartition>)> = Vec::new();
        for (topic, p) in partitions {
            match topics.last_mut() {
                Some((t, ps)) if *t == topic.as_ref() => ps.push(*p),
                _ => topics.push((topic.as_ref(), vec![*p])),
            }
        }
        let request = FetchRequest {
            max_wait_ms: i32::try_from(self.limits.max_wait.as_millis()).unwrap_or(i32::MAX),
            min_bytes: 1,
            max_bytes: self.limits.max_bytes,
            isolation: Isolation::ReadCommitted,
            topics,
        };
        // Nothing is outstanding between rounds.
        let conn = self.cluster.broker_at_rest(leader)?;
        conn.require(protocol::API_FETCH, "Fetch", protocol::FETCH_VERSION)?;
        let id = conn.correlation();
        let frame = protocol::fetch_request(id, conn.client_id(), &request)?;
        conn.send(&frame)?;
        Ok((conn.serial(), id))
    }

    /// A leader's connection failed: its partitions wait for new metadata.
    fn lost(
        &mut self,
        leader: i32,
        partitions: &[(Arc<str>, FetchPartition)],
        error: ConnError,
        round: &mut Round,
    ) {
        self.cluster.forget(leader);
        self.stale = true;
        let trouble = match (&error, partitions) {
            // Alone in its request: this partition's batch is the one too large.
            (ConnError::FrameSize { size, max, .. }, [(topic, p)]) => {
                self.suspects.insert((topic.clone(), p.partition), true);
                Trouble::FrameTooLarge {
                    size: *size,
                    max: *max,
                }
            }
            // One of these is; each is fetched alone from now on to find which, and none is
            // held for it meanwhile.
            (ConnError::FrameSize { .. }, several) => {
                for (topic, p) in several {
                    self.suspects
                        .entry((topic.clone(), p.partition))
                        .or_insert(false);
                }
                Trouble::NoLeader
            }
            _ => Trouble::NoLeader,
        };
        round.failure = Some(error.to_string());
        for (topic, p) in partitions {
            self.leaders.remove(&(topic.clone(), p.partition));
            round.troubles.push(PartitionTrouble {
                topic: topic.clone(),
                partition: p.partition,
                offset: p.offset,
                trouble: trouble.clone(),
                paused: false,
            });
        }
    }

    /// A request's answer was read: a partition fetched alone is not too large (any more).
    fn cleared(&mut self, partitions: &[(Arc<str>, FetchPartition)]) {
        if let [(topic, p)] = partitions {
            self.suspects.remove(&(topic.clone(), p.partition));
        }
    }

    /// Takes a fetch answer's body as if `leader` had sent it on this fetcher's connection:
    /// what [`Self::round`] does with each answer it reads. For answers read elsewhere (tests,
    /// fuzzing); an error is what would drop the leader's connection.
    pub fn take_answer(&mut self, leader: i32, body: Vec<u8>) -> Result<Round, ConnError> {
        let mut round = Round::default();
        self.read(leader, &Arc::new(body), &mut round)?;
        Ok(round)
    }

    /// Takes the batches of one answer.
    fn read(
        &mut self,
        leader: i32,
        body: &Arc<Vec<u8>>,
        round: &mut Round,
    ) -> Result<(), ConnError> {
        let answer = protocol::decode_fetch(body).map_err(|source| ConnError::Decode {
            peer: format!("broker {leader}"),
            source,
        })?;
        if answer.error.is_error() {
            return Err(ConnError::Broker {
                peer: format!("broker {leader}"),
                api: "Fetch",
                error: answer.error,
                message: String::new(),
            });
        }
        for (topic, partitions) in &answer.topics {
            for part in partitions {
                let key = (Arc::<str>::from(topic.as_str()), part.partition);
                let Some(state) = self.parts.get_mut(&key) else {
                    continue; // unassigned while the request was out
                };
                let mut trouble = |trouble: Trouble, paused: bool, state: &mut Part| {
                    state.paused |= paused;
                    round.troubles.push(PartitionTrouble {
                        topic: key.0.clone(),
                        partition: part.partition,
                        offset: state.offset,
                        trouble,
                        paused,
                    });
                };
                if part.error.is_error() {
                    // Leadership moved (or is moving): ask for metadata, then fetch again.
                    let leadership = part.error.is_retriable();
                    self.stale |= leadership;
                    trouble(Trouble::Broker(part.error), !leadership, state);
                    continue;
                }
                let copy = match batch::to_copy(part.records, &part.aborted, state.offset) {
                    Ok(copy) => copy,
                    Err(e) => {
                        trouble(Trouble::Records(e), true, state);
                        continue;
                    }
                };
                if copy.next_offset == state.offset {
                    if copy.partial > 0 {
                        trouble(
                            Trouble::BatchTooLarge {
                                partial: copy.partial,
                            },
                            false,
                            state,
                        );
                    }
                    continue;
                }
                state.offset = copy.next_offset;
                if copy.ranges.is_empty() {
                    continue;
                }
                // Where this partition's records start in the answer's body.
                let base = (part.records.as_ptr() as usize).saturating_sub(body.as_ptr() as usize);
                round.fetched.push(Fetched {
                    topic: key.0.clone(),
                    partition: part.partition,
                    body: body.clone(),
                    batches: copy
                        .ranges
                        .into_iter()
                        .map(|r| base + r.start..base + r.end)
                        .collect(),
                    next_offset: copy.next_offset,
                    high_watermark: part.high_watermark,
                    last_stable_offset: part.last_stable_offset,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
