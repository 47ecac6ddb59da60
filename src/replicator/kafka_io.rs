//! Kafka I/O the replicator's loops share (checkpoints, heartbeats, the flow's claim, the
//! source loop's refusal record): creating single-partition compacted topics, following a partition from a thread, writing records and waiting for
//! their acknowledgement ([`AckedProducer`]), telling "cluster unreachable" apart from other
//! errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, ProducerContext};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::kafka::reader::position_in;
use crate::replicator::backoff::Backoff;
use crate::replicator::patience::Patience;
pub use crate::replicator::reach::{Reachability, is_unreachable};

/// librdkafka's `session.timeout.ms` and `heartbeat.interval.ms` for a config that sets none.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(45);
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);

/// A duration in milliseconds that a client config sets (`session.timeout.ms`, ...); `None`
/// when it sets none or no number (the client then refuses it or takes its default).
pub fn configured_ms(config: &ClientConfig, key: &str) -> Option<Duration> {
    let ms = config.get(key)?.trim().parse::<u64>().ok()?;
    Some(Duration::from_millis(ms))
}

/// Creates a 1-partition compacted topic unless it exists, as MM2 creates its checkpoints,
/// heartbeats and offset-syncs topics; retries until it succeeds or `shutdown` fires.
/// Returns false on shutdown.
pub async fn ensure_compacted_topic(
    client: &ClientConfig,
    topic: &str,
    replication_factor: i32,
    reach: &Reachability,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    let admin = crate::kafka::admin::Admin::new(reach.side(), client)?;
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    loop {
        match admin.ensure_compacted(topic, replication_factor).await {
            Ok(()) => {
                reach.ok();
                return Ok(true);
            }
            Err(e) if e.is_unreachable() => {
                reach.unreachable(&format!("creating topic {topic}"), &e)
            }
            Err(e) => reach.refused(&format!("creating topic {topic}"), &e),
        }
        if !backoff.wait(shutdown).await {
            return Ok(false);
        }
    }
}

/// How often a task waiting for an acknowledgement polls its producer. An acknowledgement
/// takes at least `linger.ms` plus an `acks=all` round trip, so this adds little to it.
const DELIVERY_POLL: Duration = Duration::from_millis(2);

/// Hands each delivery report to the task that wrote the record.
pub struct AckContext;

impl ClientContext for AckContext {}

impl ProducerContext for AckContext {
    type DeliveryOpaque = Box<oneshot::Sender<KafkaResult<()>>>;

    fn delivery(&self, result: &DeliveryResult<'_>, ack: Self::DeliveryOpaque) {
        // The writer may have stopped waiting (shutdown): then nobody needs to know.
        let _ = ack.send(result.as_ref().map(|_| ()).map_err(|(e, _)| e.clone()));
    }
}

/// A producer for the loops' few small writes (checkpoints, heartbeats), polled by the task
/// that waits for an acknowledgement and by nothing else. rdkafka's `FutureProducer` polls from
/// a thread of its own in 100 ms slices and spins through the last millisecond of each (the
/// remaining time reaches librdkafka in whole milliseconds, rounded down to 0): 11% of the
/// replicator's CPU while copying, and a constant cost when idle.
pub struct AckedProducer(BaseProducer<AckContext>);

impl AckedProducer {
    pub fn new(config: &ClientConfig) -> KafkaResult<Self> {
        Ok(AckedProducer(config.create_with_context(AckContext)?))
    }

    /// Queues one record (a tombstone without `payload`) for partition 0 of `topic`;
    /// [`Self::acknowledged`] waits for it.
    pub fn send(
        &self,
        topic: &str,
        key: &[u8],
        payload: Option<&[u8]>,
        timestamp_ms: Option<i64>,
    ) -> KafkaResult<oneshot::Receiver<KafkaResult<()>>> {
        self.send_with_headers(topic, key, payload, timestamp_ms, None)
    }

    /// [`Self::send`] with record headers.
    pub fn send_with_headers(
        &self,
        topic: &str,
        key: &[u8],
        payload: Option<&[u8]>,
        timestamp_ms: Option<i64>,
        headers: Option<rdkafka::message::OwnedHeaders>,
    ) -> KafkaResult<oneshot::Receiver<KafkaResult<()>>> {
        let (ack, acked) = oneshot::channel();
        let mut record = BaseRecord::with_opaque_to(topic, Box::new(ack))
            .partition(0)
            .key(key);
        if let Some(payload) = payload {
            record = record.payload(payload);
        }
        if let Some(ts) = timestamp_ms {
            record = record.timestamp(ts);
        }
        if let Some(headers) = headers {
            record = record.headers(headers);
        }
        self.0.send(record).map_err(|(e, _)| e)?;
        Ok(acked)
    }

    /// Polls the producer until the record behind `acked` is acknowledged or failed
    /// (`message.timeout.ms` bounds the wait).
    pub async fn acknowledged(
        &self,
        mut acked: oneshot::Receiver<KafkaResult<()>>,
    ) -> KafkaResult<()> {
        loop {
            // Zero: one pass over the queued events, never a wait that rounds to a spin.
            self.0.poll(Duration::ZERO);
            match acked.try_recv() {
                Ok(result) => return result,
                Err(oneshot::error::TryRecvError::Empty) => {
                    tokio::time::sleep(DELIVERY_POLL).await;
                }
                Err(oneshot::error::TryRecvError::Closed) => return Err(KafkaError::Canceled),
            }
        }
    }
}

/// Group id of the assign-only readers. librdkafka wants one even for `assign`; they never
/// join it nor commit, so the group never exists on the broker.
const READER_GROUP: &str = "mirrorflow.readers";

/// Client callbacks that keep librdkafka's end-of-partition events out of the error log: the
/// readers use them to detect catching up.
pub struct QuietEof;

impl ClientContext for QuietEof {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(&error, reason);
    }
}

impl ConsumerContext for QuietEof {}

/// Logs a client-level error unless it is an end-of-partition event.
pub fn log_client_error(error: &KafkaError, reason: &str) {
    if !matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::PartitionEOF)
    ) {
        tracing::warn!(error = %error, reason, "kafka client error");
    }
}

/// A consumer that only ever uses `assign`: never joins a group, never commits.
pub fn assign_only_consumer(client: &ClientConfig) -> Result<BaseConsumer<QuietEof>, KafkaError> {
    client
        .clone()
        .set("group.id", READER_GROUP)
        .set("enable.auto.commit", "false")
        // The follower announces it caught up on the partition's end.
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "100")
        // An end reached under read_committed is an end a consumer would see too.
        .set("isolation.level", "read_committed")
        // librdkafka's default would jump to the end of a truncated or recreated topic in
        // silence; the follower stops on it instead and starts over from the earliest record.
        .set("auto.offset.reset", "error")
        .create_with_context(QuietEof)
}

/// Requests to a follower ([`follow_partition`]): "tell me once you have read everything the
/// partition held when this request arrived". Each request is a number; the follower answers
/// with `reached(number)` through its channel, after every record before that end.
pub struct EndMarks<E> {
    pub requests: std::sync::mpsc::Receiver<u64>,
    pub reached: fn(u64) -> E,
}

/// Follows partition 0 of `topic` from `start` on a dedicated thread, mapping each record
/// with `on_record` into the channel, and sending `loaded` once the partition's end as of
/// the start was reached (at once when the topic does not exist yet; records that appear
/// later still flow), and answering `marks` (see [`EndMarks`]). The thread ends when
/// `shutdown` fires or the receiver is dropped.
#[allow(clippy::too_many_arguments)]
pub fn follow_partition<E, F>(
    what: &'static str,
    consumer: BaseConsumer<QuietEof>,
    topic: String,
    start: Offset,
    reach: Arc<Reachability>,
    tx: mpsc::Sender<E>,
    loaded: Option<E>,
    marks: Option<EndMarks<E>>,
    mut on_record: F,
    shutdown: CancellationToken,
) -> std::thread::JoinHandle<()>
where
    E: Send + 'static,
    F: FnMut(&BorrowedMessage<'_>) -> Option<E> + Send + 'static,
{
    std::thread::spawn(move || {
        let follower = Follower {
            what,
            topic,
            reach,
            tx,
            loaded,
            patience: Patience::new(Duration::from_secs(2), FOLLOWER_LOOK_UP_MOST),
            next_offset: 0,
            held: false,
            last_probe: Instant::now(),
        };
        follower.run(&consumer, start, marks, &mut on_record, &shutdown);
    })
}

/// A follower thread's state ([`follow_partition`]), beside its consumer (whose records
/// borrow it while they are handled).
struct Follower<E> {
    what: &'static str,
    topic: String,
    reach: Arc<Reachability>,
    tx: mpsc::Sender<E>,
    /// Sent once the partition's end as of the start is reached.
    loaded: Option<E>,
    patience: Patience,
    /// The offset after the last record read.
    next_offset: i64,
    /// Held at a batch it cannot read ([`Reachability::hold`]), until a record comes.
    held: bool,
    last_probe: Instant,
}

impl<E> Follower<E> {
    fn run(
        mut self,
        consumer: &BaseConsumer<QuietEof>,
        start: Offset,
        marks: Option<EndMarks<E>>,
        on_record: &mut impl FnMut(&BorrowedMessage<'_>) -> Option<E>,
        shutdown: &CancellationToken,
    ) {
        let Some(end) = self.start(consumer, start, shutdown) else {
            return;
        };
        let mut pending = PendingMarks::default();
        while !shutdown.is_cancelled() {
            if let Some(marks) = &marks {
                let (topic, patience) = (&self.topic, &self.patience);
                let ends = |within| {
                    patience.ask(within, |limit| consumer.fetch_watermarks(topic, 0, limit))
                };
                if pending
                    .answer(marks, ends, self.next_offset, &self.tx)
                    .is_err()
                {
                    return;
                }
            }
            let go_on = match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => self.record(&m, end, on_record),
                Some(Err(KafkaError::PartitionEOF(_))) => self.at_end(consumer, marks.is_some()),
                Some(Err(e)) => {
                    self.held |= crate::kafka::is_unreadable_batch(&e);
                    let (what, topic) = (self.what, self.topic.as_str());
                    on_follow_error(
                        &e,
                        what,
                        consumer,
                        topic,
                        &self.reach,
                        &mut self.next_offset,
                    )
                }
                None => true,
            };
            if !go_on {
                return;
            }
            self.probe_if_down(consumer);
        }
    }

    /// Finds the end to reach before `loaded` (before assigning, so records written meanwhile
    /// do not delay readiness), assigns the partition at `start`, and sends `loaded` at once
    /// when there is nothing to load. The end (`None`: nothing to load); `None` when following
    /// cannot start.
    fn start(
        &mut self,
        consumer: &BaseConsumer<QuietEof>,
        start: Offset,
        shutdown: &CancellationToken,
    ) -> Option<Option<i64>> {
        let topic = &self.topic;
        let end = end_to_load(consumer, topic, &self.reach, &self.patience, shutdown)?;
        let mut tpl = TopicPartitionList::new();
        if let Err(e) = tpl
            .add_partition_offset(topic, 0, start)
            .and_then(|()| consumer.assign(&tpl))
        {
            // Never announced as loaded, so the loop never turns ready on half its input.
            tracing::error!(topic = %topic, error = %e, "cannot assign {}; not following it", self.what);
            return None;
        }
        if end.is_none() && !self.send_loaded() {
            return None;
        }
        Some(end)
    }

    /// A record read: mapped into the channel, and `loaded` sent when it reaches `end`. False
    /// once the receiver is gone.
    fn record(
        &mut self,
        m: &BorrowedMessage<'_>,
        end: Option<i64>,
        on_record: &mut impl FnMut(&BorrowedMessage<'_>) -> Option<E>,
    ) -> bool {
        self.reach.ok();
        if std::mem::take(&mut self.held) {
            self.reach.release(&self.topic);
        }
        let offset = m.offset();
        self.next_offset = offset.saturating_add(1);
        if let Some(event) = on_record(m)
            && self.tx.blocking_send(event).is_err()
        {
            return false;
        }
        if end.is_some_and(|end| offset.saturating_add(1) >= end) {
            return self.send_loaded();
        }
        true
    }

    /// The end of the partition reached: `loaded` is due. With marks to answer, the position
    /// counts as read: at the end it may be past the last record read (transaction markers,
    /// as an MM2 writing checkpoints with exactly-once support leaves them, are never
    /// delivered, and a mark's end would stay out of reach). False once the receiver is gone.
    fn at_end(&mut self, consumer: &BaseConsumer<QuietEof>, marks: bool) -> bool {
        self.reach.ok();
        if marks && let Some(position) = position_in(consumer, &self.topic) {
            self.next_offset = self.next_offset.max(position);
        }
        self.send_loaded()
    }

    /// Sends `loaded` unless it was sent; false once the receiver is gone.
    fn send_loaded(&mut self) -> bool {
        match self.loaded.take() {
            Some(event) => self.tx.blocking_send(event).is_ok(),
            None => true,
        }
    }

    /// An idle partition yields no record to prove the cluster is back: it is asked.
    fn probe_if_down(&mut self, consumer: &BaseConsumer<QuietEof>) {
        if self.reach.is_down() && self.last_probe.elapsed() > Duration::from_secs(2) {
            self.last_probe = Instant::now();
            let topic = &self.topic;
            let asked = self.patience.ask(FOLLOWER_LOOK_UP_MOST, |limit| {
                consumer.fetch_watermarks(topic, 0, limit)
            });
            if asked.is_ok() {
                self.reach.ok();
            }
        }
    }
}

/// A follower's consumer error handled; false when following cannot go on.
fn on_follow_error(
    e: &KafkaError,
    what: &'static str,
    consumer: &BaseConsumer<QuietEof>,
    topic: &str,
    reach: &Reachability,
    next_offset: &mut i64,
) -> bool {
    if is_unreachable(e) {
        reach.unreachable(what, e);
    } else if e.rdkafka_error_code() == Some(RDKafkaErrorCode::AutoOffsetReset) {
        reach.position_lost(topic);
        let mut again = TopicPartitionList::new();
        // `seek` is refused once the reset error stopped the partition: assign anew.
        if let Err(e) = again
            .add_partition_offset(topic, 0, Offset::Beginning)
            .and_then(|()| consumer.assign(&again))
        {
            tracing::error!(topic = %topic, error = %e, "cannot assign {what} again; not following it");
            return false;
        }
        // Reading starts over in a log that may now be shorter: a mark's end is reached by
        // what is read from here on, not by the old log's offsets.
        *next_offset = 0;
    } else if crate::kafka::is_unreadable_batch(e) {
        // librdkafka tries the batch again: following stops here until it can be read (a
        // bomb is refused at every try, without inflating again).
        reach.hold(what, topic, &crate::kafka::unreadable_reason(e));
    } else {
        tracing::debug!(topic = %topic, error = %e, "{what}: consumer error");
    }
    true
}

/// The longest a follower's look-up of its partition's bounds may wait ([`Patience`]): the
/// thread polls nothing meanwhile, and its shutdown waits for it.
const FOLLOWER_LOOK_UP_MOST: Duration = Duration::from_secs(10);

/// The end of `topic`'s partition 0 as the follower starts (`Some(None)`: empty or not there
/// yet), asked until it answers; `None` once `shutdown` fires.
fn end_to_load<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    reach: &Reachability,
    patience: &Patience,
    shutdown: &CancellationToken,
) -> Option<Option<i64>> {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    loop {
        if shutdown.is_cancelled() {
            return None;
        }
        let asked = patience.ask(FOLLOWER_LOOK_UP_MOST, |limit| {
            consumer.fetch_watermarks(topic, 0, limit)
        });
        match asked {
            Ok((low, high)) => {
                reach.ok();
                return Some((high > low).then_some(high));
            }
            Err(e)
                if matches!(
                    e.rdkafka_error_code(),
                    Some(
                        RDKafkaErrorCode::UnknownTopicOrPartition
                            | RDKafkaErrorCode::UnknownTopic
                            | RDKafkaErrorCode::UnknownPartition
                    )
                ) =>
            {
                return Some(None);
            }
            Err(e) => reach.failed(&format!("reading the end of {topic}"), &e),
        }
        std::thread::sleep(backoff.next_delay());
    }
}

/// A follower's end marks ([`EndMarks`]) not answered yet.
#[derive(Default)]
struct PendingMarks {
    /// Asked for, their end not known yet.
    unanswered: Vec<u64>,
    /// (mark, the end to read up to).
    waiting: Vec<(u64, i64)>,
}

impl PendingMarks {
    /// Takes the new requests, learns their end from `ends` (the partition's (low, high)
    /// watermarks, given the time one look-up may take; one that fails is asked again on the
    /// next round, the loop waiting meanwhile), and answers each mark whose end `next_offset`
    /// reached. `Err` once the receiver is gone.
    fn answer<E>(
        &mut self,
        marks: &EndMarks<E>,
        ends: impl FnOnce(Duration) -> KafkaResult<(i64, i64)>,
        next_offset: i64,
        tx: &mpsc::Sender<E>,
    ) -> Result<(), ()> {
        self.unanswered.extend(marks.requests.try_iter());
        if !self.unanswered.is_empty()
            && let Ok((low, high)) = ends(FOLLOWER_LOOK_UP_MOST)
        {
            let end = if high > low { high } else { 0 };
            let marked = self.unanswered.drain(..).map(|mark| (mark, end));
            self.waiting.extend(marked);
        }
        let mut failed = false;
        self.waiting.retain(|&(mark, end)| {
            if next_offset < end || failed {
                return true;
            }
            failed = tx.blocking_send((marks.reached)(mark)).is_err();
            false
        });
        if failed { Err(()) } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_answered_once_its_end_is_read_and_a_failed_look_up_keeps_it() {
        let (ask, requests) = std::sync::mpsc::channel();
        let marks = EndMarks {
            requests,
            reached: |n| n,
        };
        let (tx, mut rx) = mpsc::channel(8);
        let mut pending = PendingMarks::default();
        let timed_out = |_| {
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::OperationTimedOut,
            ))
        };
        ask.send(1).expect("asked");
        assert_eq!(pending.answer(&marks, timed_out, 0, &tx), Ok(()));
        assert_eq!(pending.unanswered, [1], "kept for the next round");
        // The partition ends at 10: answered once the records before it were read.
        let ends = |_| Ok((0, 10));
        assert_eq!(pending.answer(&marks, ends, 9, &tx), Ok(()));
        assert!(rx.try_recv().is_err(), "not before offset 9 was read");
        ask.send(2).expect("asked");
        assert_eq!(pending.answer(&marks, |_| Ok((0, 12)), 10, &tx), Ok(()));
        assert_eq!(rx.try_recv().ok(), Some(1));
        assert!(rx.try_recv().is_err(), "mark 2 waits for offset 12");
        assert_eq!(pending.answer(&marks, ends, 12, &tx), Ok(()));
        assert_eq!(rx.try_recv().ok(), Some(2));
        // An empty partition's marks are answered at once.
        ask.send(3).expect("asked");
        assert_eq!(pending.answer(&marks, |_| Ok((5, 5)), 0, &tx), Ok(()));
        assert_eq!(rx.try_recv().ok(), Some(3));
        drop(rx);
        ask.send(4).expect("asked");
        assert_eq!(
            pending.answer(&marks, ends, 12, &tx),
            Err(()),
            "the loop is gone"
        );
    }

    #[test]
    fn only_transport_errors_count_as_unreachable() {
        assert!(is_unreachable(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::AllBrokersDown
        )));
        assert!(!is_unreachable(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::UnknownTopicOrPartition
        )));
        assert!(!is_unreachable(&KafkaError::AdminOp(
            RDKafkaErrorCode::TopicAlreadyExists
        )));
    }
}
