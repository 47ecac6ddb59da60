//! Writing to Kafka from the copy thread: the one producer context every policy uses, record
//! building, and sending with backpressure.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedHeaders, DeliveryResult, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientContext, Message};
use tokio_util::sync::CancellationToken;

use crate::replicator::reach::Reachability;
use crate::replicator::stops::lock;

/// Bound on the delivery-report events one [`serve_reports`] serves, so a steady stream of
/// them cannot keep the loop from consuming.
const MAX_REPORT_EVENTS: usize = 1024;
/// How long a queue-full send waits for the producer between two attempts.
const QUEUE_FULL_POLL: Duration = Duration::from_millis(20);

/// Where the target put a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    pub offset: i64,
    pub timestamp: Option<i64>,
}

/// A delivery report, as the callback saw it. The opaque is the policy's (a slot and
/// generation, or a source offset): no allocation per record.
#[derive(Debug)]
pub struct Ack {
    pub opaque: usize,
    pub result: Result<Landed, KafkaError>,
}

/// The producer context of every producer the copy thread owns: collects delivery reports,
/// which the loop drains on its own schedule (callbacks run inside `poll` on the same thread).
pub struct AckContext {
    acks: Mutex<Vec<Ack>>,
    health: Arc<Reachability>,
}

impl AckContext {
    pub fn new(health: Arc<Reachability>) -> Self {
        AckContext {
            acks: Mutex::new(Vec::with_capacity(1024)),
            health,
        }
    }

    /// Moves the collected reports into `into` (cleared first), keeping both allocations.
    pub fn take(&self, into: &mut Vec<Ack>) {
        into.clear();
        std::mem::swap(&mut *lock(&self.acks), into);
    }

    /// Forgets the collected reports (of writes whose outcome the caller learnt otherwise).
    pub fn discard(&self) {
        lock(&self.acks).clear();
    }

    fn collected(&self) -> usize {
        lock(&self.acks).len()
    }
}

impl ClientContext for AckContext {
    fn error(&self, error: KafkaError, reason: &str) {
        note_client_error(&self.health, error, reason);
    }
}

impl ProducerContext for AckContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let result = match result {
            Ok(m) => Ok(Landed {
                offset: m.offset(),
                timestamp: m.timestamp().to_millis(),
            }),
            Err((e, _)) => Err(e.clone()),
        };
        lock(&self.acks).push(Ack { opaque, result });
    }
}

/// The one meaning of a client error callback on the copy thread: "all brokers down" makes the
/// cluster unreachable; anything else is the client's own business (it retries).
pub fn note_client_error(health: &Reachability, error: KafkaError, reason: &str) {
    if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
        health.unreachable("a client callback", &reason);
    } else {
        tracing::debug!(%error, %reason, "kafka client error");
    }
}

/// Serves every delivery report `producer` has queued. `poll(ZERO)` serves one event, and an
/// event reports one produce batch: served once per loop pass, reports of small batches (a
/// few records per partition at moderate rates) queued up faster than they were served, so
/// acknowledgements, and the offset syncs written on them, trailed the target by tens of
/// seconds. Non-zero timeouts are avoided: rdkafka's poll keeps polling until the whole
/// timeout has passed, and spins through its last millisecond.
pub fn serve_reports(producer: &BaseProducer<AckContext>) {
    for _ in 0..MAX_REPORT_EVENTS {
        let before = producer.context().collected();
        producer.poll(Duration::ZERO);
        if producer.context().collected() == before {
            break;
        }
    }
}

pub type Record<'a> = BaseRecord<'a, [u8], [u8], usize>;

/// Headers a copy can carry: those of a polled record, or of one held back
/// ([`rdkafka::message::OwnedMessage`], the aligned policy's).
pub trait CopyHeaders {
    fn copy_headers(&self) -> OwnedHeaders;
}

impl CopyHeaders for BorrowedHeaders {
    fn copy_headers(&self) -> OwnedHeaders {
        self.detach()
    }
}

impl CopyHeaders for OwnedHeaders {
    fn copy_headers(&self) -> OwnedHeaders {
        self.clone()
    }
}

/// The copy of a source record for `remote`, same partition, key, value, timestamp and
/// headers, with the key and value bytes it carries.
pub fn forward<'a, M: Message>(m: &'a M, remote: &'a str, opaque: usize) -> (Record<'a>, usize)
where
    M::Headers: CopyHeaders,
{
    let mut record = BaseRecord::with_opaque_to(remote, opaque).partition(m.partition());
    let mut bytes = 0_usize;
    if let Some(k) = m.key() {
        bytes = bytes.saturating_add(k.len());
        record = record.key(k);
    }
    if let Some(v) = m.payload() {
        bytes = bytes.saturating_add(v.len());
        record = record.payload(v);
    }
    if let Some(ts) = m.timestamp().to_millis() {
        record = record.timestamp(ts);
    }
    if let Some(h) = m.headers() {
        record = record.headers(h.copy_headers());
    }
    (record, bytes)
}

/// An offset sync record as the dense sync policy writes it: MM2's format, with the origin
/// header that tells the checkpoint loop every delta change is in the topic, and where the
/// copy started reading when its first sync says so ([`crate::mm2::CopyStart`]).
pub fn offset_sync<'a>(
    topic: &'a str,
    encoded: &'a crate::mm2::EncodedRecord,
    start: Option<&str>,
    opaque: usize,
) -> Record<'a> {
    let mut headers = OwnedHeaders::new().insert(rdkafka::message::Header {
        key: crate::mm2::SYNC_ORIGIN_HEADER,
        value: Some(crate::mm2::SYNC_ORIGIN_DENSE),
    });
    if let Some(start) = start {
        headers = headers.insert(rdkafka::message::Header {
            key: crate::mm2::SYNC_START_HEADER,
            value: Some(start),
        });
    }
    internal(topic, &encoded.key, &encoded.value, opaque).headers(headers)
}

/// Queues `sync` on `topic` in MM2's format, waiting for room: an offset sync is never dropped
/// (a dropped one could leave a group translated by an older delta).
pub fn send_sync(
    producer: &BaseProducer<AckContext>,
    topic: &str,
    sync: &crate::mm2::OffsetSync,
    opaque: usize,
    shutdown: &CancellationToken,
) -> Result<(), SendError> {
    let encoded = sync.encode().map_err(SendError::Encode)?;
    let start = sync.start.map(|s| s.header_value());
    let record = offset_sync(topic, &encoded, start.as_deref(), opaque);
    send_waiting(producer, record, shutdown, None)
}

/// A record of an internal topic (positions, offset syncs, gaps): partition 0, key, value.
pub fn internal<'a>(topic: &'a str, key: &'a [u8], value: &'a [u8], opaque: usize) -> Record<'a> {
    BaseRecord::with_opaque_to(topic, opaque)
        .partition(0)
        .key(key)
        .payload(value)
}

/// Why a record was not queued.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("the loop is stopping")]
    Stopping,
    #[error("the producer's queue stayed full until the deadline")]
    QueueFull,
    /// Larger than the producer's own `message.max.bytes`: no broker would take it either.
    #[error("larger than the producer's message.max.bytes")]
    TooLarge,
    #[error(transparent)]
    Kafka(KafkaError),
    /// Cannot happen for a real Kafka topic name; sending again would not help either.
    #[error("cannot encode the offset sync: {0}")]
    Encode(crate::mm2::EncodeError),
}

/// What an attempt to queue a record came to.
pub enum Offered<'a> {
    Queued,
    /// The producer's queue is full: the record back, to offer again once there is room.
    Full(Record<'a>),
    Refused(SendError),
}

/// Offers `record` to the producer once.
pub fn offer<'a>(producer: &BaseProducer<AckContext>, record: Record<'a>) -> Offered<'a> {
    match producer.send(record) {
        Ok(()) => Offered::Queued,
        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
            Offered::Full(back)
        }
        Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {
            Offered::Refused(SendError::TooLarge)
        }
        Err((e, _)) => Offered::Refused(SendError::Kafka(e)),
    }
}

/// Queues `record`, waiting for room while the queue is full (serving the producer, whose
/// callbacks only collect reports), until `shutdown` or `deadline`. Never drops a record
/// silently: every way out that is not `Ok` says why.
pub fn send_waiting(
    producer: &BaseProducer<AckContext>,
    mut record: Record<'_>,
    shutdown: &CancellationToken,
    deadline: Option<Instant>,
) -> Result<(), SendError> {
    loop {
        match offer(producer, record) {
            Offered::Queued => return Ok(()),
            Offered::Refused(e) => return Err(e),
            Offered::Full(back) => {
                record = back;
                producer.poll(QUEUE_FULL_POLL);
                if shutdown.is_cancelled() {
                    return Err(SendError::Stopping);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(SendError::QueueFull);
                }
            }
        }
    }
}
