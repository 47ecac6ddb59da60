//! A partition leader in memory for the writer's tests: it reads Produce v8 requests as they
//! are written and answers each at once, keeping per partition what a Kafka broker keeps for an
//! idempotent producer (the producer's last sequence and its last five batches), with Kafka's
//! rules: a duplicate of a recent batch is answered with its offset, a producer the partition
//! has no state of is taken at any sequence, a known one only at the next sequence.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{Read, Write};
use std::sync::{Arc, Mutex, MutexGuard};

use mirrorflow_core::protocol::ErrorCode;

/// What the broker knows of one producer on one partition.
#[derive(Debug, Default)]
struct ProducerState {
    last_sequence: i32,
    /// (first sequence, last sequence, base offset) of its last five batches.
    recent: VecDeque<(i32, i32, i64)>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    /// Per partition, the base sequences of the batches appended, in log order.
    pub(super) log: BTreeMap<i32, Vec<i32>>,
    producers: HashMap<(i32, i64), ProducerState>,
    /// Produce requests answered so far.
    pub(super) requests: usize,
    /// The first this many Produce requests are answered with `refusal` for every partition (a
    /// leader not yet elected, too few replicas); `usize::MAX`: every one.
    pub(super) refuse_first: usize,
    pub(super) refusal: i16,
    /// Metadata answers name no leader (an election under way).
    pub(super) leaderless: bool,
    /// Metadata requests answered so far.
    pub(super) metadata: usize,
    /// Produce requests are read and never answered (the connection ends there).
    pub(super) mute: bool,
}

/// One connection's bytes: written by the client and not yet read as a whole request, and
/// answers not yet read.
#[derive(Debug, Default)]
struct Wire {
    inbox: Vec<u8>,
    outbox: VecDeque<u8>,
}

/// The broker (shared by its connections) and one connection to it.
#[derive(Debug, Clone, Default)]
pub(super) struct FakeBroker {
    state: Arc<Mutex<State>>,
    wire: Arc<Mutex<Wire>>,
}

/// The broker's node id and address in its metadata answers.
pub(super) const NODE: i32 = 1;
/// Nothing listens there: a connection the writer opens again is refused at once.
pub(super) const ADDRESS: &str = "127.0.0.1:9";
/// The partitions of every topic asked about.
pub(super) const PARTITIONS: i32 = 2;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FakeBroker {
    /// A broker that answers the first `requests` Produce requests with `error` for every
    /// partition.
    pub(super) fn refusing(requests: usize, error: ErrorCode) -> Self {
        let broker = FakeBroker::default();
        {
            let mut state = broker.state();
            state.refuse_first = requests;
            state.refusal = error.0;
        }
        broker
    }

    /// Another connection to the same broker.
    pub(super) fn connection(&self) -> Self {
        FakeBroker {
            state: self.state.clone(),
            wire: Arc::default(),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl Read for FakeBroker {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut wire = lock(&self.wire);
        let n = buf.len().min(wire.outbox.len());
        for (slot, byte) in buf.iter_mut().zip(wire.outbox.drain(..n)) {
            *slot = byte;
        }
        // Nothing to read is the end of the stream: every request is answered as it is written.
        Ok(n)
    }
}

impl Write for FakeBroker {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut wire = lock(&self.wire);
        wire.inbox.extend_from_slice(buf);
        while let Some(frame) = wire.next_frame() {
            let answer = self.state().answer(&frame).map_err(std::io::Error::other)?;
            wire.outbox.extend(answer);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads a request's fields in order.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("a request cut short: {n} bytes wanted"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn i16(&mut self) -> Result<i16, String> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    fn i32(&mut self) -> Result<i32, String> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn string(&mut self) -> Result<String, String> {
        let len = usize::try_from(self.i16()?).unwrap_or(0);
        Ok(String::from_utf8_lossy(self.take(len)?).into_owned())
    }
    fn count(&mut self) -> Result<usize, String> {
        usize::try_from(self.i32()?).map_err(|_| "a negative count".to_owned())
    }
}

fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(x)
}

impl Wire {
    fn next_frame(&mut self) -> Option<Vec<u8>> {
        let size = usize::try_from(be_i32(self.inbox.get(..4)?, 0)).ok()?;
        if self.inbox.len() < 4 + size {
            return None;
        }
        let frame = self.inbox[4..4 + size].to_vec();
        self.inbox.drain(..4 + size);
        Some(frame)
    }
}

/// A frame of `body` (correlation id first).
fn framed(body: Vec<u8>) -> Vec<u8> {
    let mut frame = i32::try_from(body.len())
        .unwrap_or(0)
        .to_be_bytes()
        .to_vec();
    frame.extend(body);
    frame
}

impl State {
    /// The answer frame to one request: Produce v8 or Metadata v8.
    fn answer(&mut self, frame: &[u8]) -> Result<Vec<u8>, String> {
        let mut r = Fields(frame);
        let (api, version) = (r.i16()?, r.i16()?);
        let id = r.i32()?;
        r.string()?; // client id
        match (api, version) {
            (0, 8) => self.produce(id, r),
            (3, 8) => self.metadata(id, r),
            _ => Err(format!(
                "not a Produce or Metadata v8 request: api {api} v{version}"
            )),
        }
    }

    fn metadata(&mut self, id: i32, mut r: Fields<'_>) -> Result<Vec<u8>, String> {
        self.metadata += 1;
        let mut body = id.to_be_bytes().to_vec();
        body.extend_from_slice(&0i32.to_be_bytes()); // throttle
        body.extend_from_slice(&1i32.to_be_bytes()); // one broker
        body.extend_from_slice(&NODE.to_be_bytes());
        let (host, port) = ADDRESS.split_once(':').unwrap_or((ADDRESS, "9"));
        body.extend_from_slice(&i16::try_from(host.len()).unwrap_or(0).to_be_bytes());
        body.extend_from_slice(host.as_bytes());
        body.extend_from_slice(&port.parse::<i32>().unwrap_or(9).to_be_bytes());
        body.extend_from_slice(&(-1i16).to_be_bytes()); // no rack
        body.extend_from_slice(&(-1i16).to_be_bytes()); // no cluster id
        body.extend_from_slice(&NODE.to_be_bytes()); // controller
        let topics = r.count()?;
        body.extend_from_slice(&i32::try_from(topics).unwrap_or(0).to_be_bytes());
        for _ in 0..topics {
            let name = r.string()?;
            body.extend_from_slice(&0i16.to_be_bytes());
            body.extend_from_slice(&i16::try_from(name.len()).unwrap_or(0).to_be_bytes());
            body.extend_from_slice(name.as_bytes());
            body.push(0); // not internal
            body.extend_from_slice(&PARTITIONS.to_be_bytes());
            for partition in 0..PARTITIONS {
                let (error, leader) = if self.leaderless {
                    (ErrorCode::LEADER_NOT_AVAILABLE, -1)
                } else {
                    (ErrorCode::NONE, NODE)
                };
                body.extend_from_slice(&error.0.to_be_bytes());
                body.extend_from_slice(&partition.to_be_bytes());
                body.extend_from_slice(&leader.to_be_bytes());
                body.extend_from_slice(&0i32.to_be_bytes()); // leader epoch
                for _ in 0..2 {
                    body.extend_from_slice(&1i32.to_be_bytes()); // replicas, then in sync
                    body.extend_from_slice(&NODE.to_be_bytes());
                }
                body.extend_from_slice(&0i32.to_be_bytes()); // none offline
            }
            body.extend_from_slice(&0i32.to_be_bytes()); // topic operations
        }
        body.extend_from_slice(&0i32.to_be_bytes()); // cluster operations
        Ok(framed(body))
    }

    fn produce(&mut self, id: i32, mut r: Fields<'_>) -> Result<Vec<u8>, String> {
        r.string()?; // transactional id: null, read as empty
        r.i16()?; // acks
        r.i32()?; // timeout
        self.requests += 1;
        if self.mute {
            return Ok(Vec::new());
        }
        let refused = self.requests <= self.refuse_first;
        let mut body = id.to_be_bytes().to_vec();
        let topics = r.count()?;
        body.extend_from_slice(&i32::try_from(topics).unwrap_or(0).to_be_bytes());
        for _ in 0..topics {
            let name = r.string()?;
            body.extend_from_slice(&i16::try_from(name.len()).unwrap_or(0).to_be_bytes());
            body.extend_from_slice(name.as_bytes());
            let partitions = r.count()?;
            body.extend_from_slice(&i32::try_from(partitions).unwrap_or(0).to_be_bytes());
            for _ in 0..partitions {
                let partition = r.i32()?;
                let len = r.count()?;
                let batch = r.take(len)?.to_vec();
                let (error, base_offset) = if refused {
                    (ErrorCode(self.refusal), -1)
                } else {
                    self.append(partition, &batch)?
                };
                body.extend_from_slice(&partition.to_be_bytes());
                body.extend_from_slice(&error.0.to_be_bytes());
                body.extend_from_slice(&base_offset.to_be_bytes());
                body.extend_from_slice(&(-1i64).to_be_bytes()); // log append time
                body.extend_from_slice(&0i64.to_be_bytes()); // log start
                body.extend_from_slice(&0i32.to_be_bytes()); // no record errors
                body.extend_from_slice(&(-1i16).to_be_bytes()); // no message
            }
        }
        body.extend_from_slice(&0i32.to_be_bytes()); // throttle
        Ok(framed(body))
    }

    /// One batch written to `partition` by the rules of an idempotent producer's partition
    /// state: its error and base offset.
    fn append(&mut self, partition: i32, batch: &[u8]) -> Result<(ErrorCode, i64), String> {
        if batch.len() < mirrorflow_core::batch::HEADER_LEN {
            return Err("a batch shorter than its header".into());
        }
        let (producer, first) = (be_i64(batch, 43), be_i32(batch, 53));
        let last = first.saturating_add(be_i32(batch, 57)).saturating_sub(1);
        let log = self.log.entry(partition).or_default();
        // No state of this producer on the partition: any sequence is taken.
        if let Some(known) = self.producers.get(&(partition, producer)) {
            if let Some(&(_, _, offset)) = known
                .recent
                .iter()
                .find(|&&(f, l, _)| (f, l) == (first, last))
            {
                return Ok((ErrorCode::NONE, offset));
            }
            if first != known.last_sequence.saturating_add(1) {
                return Ok((ErrorCode::OUT_OF_ORDER_SEQUENCE_NUMBER, -1));
            }
        }
        let offset = i64::try_from(log.len()).unwrap_or(0);
        log.push(first);
        let state = self.producers.entry((partition, producer)).or_default();
        state.last_sequence = last;
        state.recent.push_back((first, last, offset));
        if state.recent.len() > 5 {
            state.recent.pop_front();
        }
        Ok((ErrorCode::NONE, offset))
    }
}

/// A valid batch of `records` records (no record bytes: the broker here reads only headers),
/// as a source broker wrote it.
pub(super) fn source_batch(records: i32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes()); // base offset
    let length = i32::try_from(mirrorflow_core::batch::HEADER_LEN - 12).unwrap_or(0);
    b.extend_from_slice(&length.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // leader epoch
    b.push(2); // magic
    b.extend_from_slice(&[0; 4]); // the CRC, written last
    b.extend_from_slice(&0i16.to_be_bytes()); // attributes
    b.extend_from_slice(&(records - 1).to_be_bytes()); // last offset delta
    b.extend_from_slice(&1_000i64.to_be_bytes());
    b.extend_from_slice(&1_000i64.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes()); // no producer
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&records.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}
