//! Exactly-once copying (`spec.exactlyOnce: true`): records, offset syncs and the source
//! position of a partition are committed in one producer transaction on the target.
//!
//! # What a transaction holds
//! Per owned source partition and about every [`ExactlyOnce::COMMIT_EVERY`]: the records copied since the
//! last commit, the offset syncs the dense [`SyncPolicy`] asks for (known once the records are
//! acknowledged: the producer is flushed first), and the partition's position (next source
//! offset, target offset of the last record). Consumers of the remote topics, the checkpoint
//! loop (syncs) and the position reader all read `read_committed`, so either all three are
//! visible or none. The syncs are in the transaction only when they live on the target
//! (`sourceLoop.offsetSyncsLocation: Target`): [`crate::flow::validate`] refuses exactly-once
//! otherwise, because a write to the source cluster can never join a target transaction.
//!
//! # Fencing: one transactional id per source partition
//! The id is `mirrorflow.<flow>.<source>-<target>.tx.<topic>-<partition>`
//! ([`txn::transactional_id`]). Whoever copies a partition first calls `init_transactions` with the
//! partition's id, which aborts the previous writer's open transaction and bumps the epoch, so
//! that writer (a replica that lost the partition in a rebalance, a paused process, the old
//! incarnation of a restarted pod) can never commit again; only then does it read the positions
//! topic to its end (waiting for transactions open on it) and start from the stored position.
//! Hence every committed transaction of a partition starts exactly where the previous committed
//! one ended, whoever wrote them, and the consumer group only decides who works (two replicas
//! believing they own a partition fence each other; neither commits a duplicate).
//!
//! Why not one id per replica (the StatefulSet ordinal) and fence the previous owner's id on
//! assignment: a partition moves between replicas, so the previous writer of a partition is not
//! known from the group alone; recording it with the position leaves a window where two
//! claimants both read "owner X", both fence X and both copy (a zombie that missed its session
//! timeout). Kafka's own fencing of a shared id closes it without any protocol of ours. The
//! price is one producer (connections, a thread per broker) per owned partition, the scheme of
//! Kafka Streams' first exactly-once version: fine for tens of partitions per replica, heavy
//! for thousands; the at-least-once mode has no such cost.
//!
//! # Failures
//! A failed record or sync write aborts the partition's transaction and rewinds it to its last
//! committed position. A fatal producer error (fenced: someone else took the partition) drops
//! the producer; the partition is prepared again after a backoff (init, read, seek), which is
//! safe by the argument above, and stops once the group moves the partition away.

mod end;
mod hanging;
mod ownership;
pub mod txn;

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use self::txn::{NOT_A_RECORD, Phase, TxFailure, absorb, producer_config, transactional_id};
use crate::kafka::positions::{self, Frontier, Gap};
use crate::mm2::{OffsetSync, SyncPolicy, TopicPartition};
use crate::replicator::backoff::{Backoff, Retry};
use crate::replicator::source::continuity::{self};
use crate::replicator::source::engine::delivery::{CopiesRecords, Delivery, PolledRecords, Source};
use crate::replicator::source::engine::rebalance::{self, Owner};
use crate::replicator::source::engine::send::{self, AckContext};
use crate::replicator::source::engine::shared::{GapWrite, Shared};
use crate::replicator::source::engine::slots::{Slot, SlotTable};
use crate::replicator::source::limits::{self, RemoteLimits};

const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a fenced partition waits before it is prepared again (see [`ExactlyOnce::end`]).
const FENCED_RETRY: Duration = Duration::from_secs(10);

/// What this policy keeps of an owned partition besides the engine's part.
pub struct TxPart {
    transactional_id: String,
    producer: Option<BaseProducer<AckContext>>,
    phase: Phase,
    /// The position of the last committed transaction (where a rewind goes).
    committed: Option<Frontier>,
    /// After the newest acknowledged record of the open transaction.
    latest: Option<Frontier>,
    policy: SyncPolicy,
    records: u64,
    bytes: u64,
    failed: Option<TxFailure>,
    /// The target partition went back under the copies: check both logs before going on.
    recheck: bool,
    /// After an aborted transaction: when the partition is copied again from `committed`.
    rewind: Retry,
    /// The limit the producer's batches were capped by ([`producer_config`]).
    capped_by: Option<usize>,
    /// Records of the open transaction that may not fit the limit alone: (offset, bytes).
    large: Vec<(i64, usize)>,
    /// A record the target refused alone: skipped when copied again, recorded as a gap in
    /// the transaction that passes it.
    refused: Option<Refused>,
}

/// One owned source partition, with its own transactional producer.
pub type TxSlot = Slot<TxPart>;

impl TxPart {
    fn prepare_at(&mut self, retry_at: Instant) {
        self.phase = Phase::Preparing { retry_at };
    }

    fn open(&self) -> bool {
        self.phase == Phase::Open
    }
}

impl TxSlot {
    /// Prepared again after the next backoff delay from `from`.
    fn prepare_after(&mut self, from: Instant) {
        let delay = self.backoff.next_delay();
        self.own.prepare_at(from + delay);
    }
}

#[derive(Debug, Clone, Copy)]
struct Refused {
    offset: i64,
    bytes: usize,
    limit: Option<usize>,
    /// The open transaction passed it.
    passed: bool,
}

/// What ending a transaction left to do.
enum Ended {
    Committed,
    /// Aborted: copy again from the committed position.
    Rewind,
    /// The producer is unusable (fenced or broken): prepare the partition again.
    Lost,
}

/// The exactly-once policy: what the copy thread mutates.
pub struct ExactlyOnce {
    shared: Shared,
    producer_base: ClientConfig,
    slots: SlotTable<TxSlot>,
    limits: RemoteLimits,
    /// A `read_uncommitted` client of the target, for the remote partitions' high watermarks
    /// ([`hanging`]).
    target_watermarks: rdkafka::consumer::BaseConsumer,
}

impl Delivery for ExactlyOnce {
    fn copied(&self) -> Vec<crate::replicator::source::engine::delivery::Copied> {
        self.slots
            .iter()
            .map(|(_, s)| crate::replicator::source::engine::delivery::Copied {
                topic: s.topic.clone(),
                partition: s.partition,
                remote: s.remote.to_string(),
                next: s.latest.or(s.committed).map_or(-1, |f| f.next),
                reason: s.failed.as_ref().map(|_| {
                    "a transaction of the partition failed; it is copied again from its last committed position".to_string()
                }),
                waits_on_reader: s.failed.is_none(),
            })
            .collect()
    }

    /// How often each partition's transaction is committed: the latency of exactly-once copies.
    const COMMIT_EVERY: Duration = Duration::from_millis(500);
    const IDLE_CHECK_EVERY: Duration = Duration::from_millis(100);
    type Feed = PolledRecords;

    fn busy(&self) -> bool {
        self.slots.iter().any(|(_, s)| s.open())
    }

    /// Commits every open transaction; prepares partitions whose producer is not ready.
    fn commit(&mut self, consumer: &Source<Self>) {
        for (topic, partition) in self.slots.keys() {
            let ended = self.end(&topic, partition, true);
            self.after(&topic, partition, ended);
        }
        self.rewind_due(consumer);
        self.retry_unready(consumer);
    }

    /// Tail syncs of partitions idle for the sync interval, each in a transaction of its own.
    fn idle_syncs(&mut self) {
        let now = self.shared.now();
        let syncs_topic = self.shared.syncs_topic.clone();
        for (topic, partition) in self.slots.keys() {
            let Some(slot) = self.slots.find_mut(&topic, partition) else {
                continue;
            };
            let slot = &mut slot.own;
            if slot.phase != Phase::Ready || slot.policy.records_since_sync() == 0 {
                continue;
            }
            // A ready partition has its producer.
            let (Some(producer), Some(sync)) = (slot.producer.as_ref(), slot.policy.idle_sync(now))
            else {
                continue;
            };
            if producer.begin_transaction().is_err() {
                continue;
            }
            slot.phase = Phase::Open;
            if let Err(e) = send_sync(producer, &syncs_topic, &sync, &self.shared.shutdown) {
                slot.failed = Some(e);
            }
            let ended = self.end(&topic, partition, true);
            let config = self.shared.sync_config;
            if !matches!(ended, Some(Ended::Committed))
                && let Some(slot) = self.slots.find_mut(&topic, partition)
            {
                // Nothing to copy again (the records were committed before); the next record
                // simply gets a fresh first sync.
                slot.policy =
                    SyncPolicy::new(TopicPartition::new(topic.clone(), partition), config);
            }
        }
    }

    /// Finds remote partitions that end before the last committed copy (the remote topic was
    /// deleted, and discovery created it again) among ready partitions without an open
    /// transaction (open ones notice from their acknowledgements); those are prepared again,
    /// which records the break and copies them again.
    fn check_targets(&mut self) {
        let idle = self
            .slots
            .iter()
            .filter_map(|(_, s)| {
                let downstream = s.committed?.downstream;
                (s.phase == Phase::Ready && downstream >= 0).then(|| {
                    let key = (s.topic.clone(), s.partition, downstream);
                    (key, s.remote.to_string(), s.partition)
                })
            })
            .collect();
        for ((topic, partition, downstream), end) in self.shared.probe.remote_ends(idle) {
            if end <= downstream
                && let Some(slot) = self.slots.find_mut(&topic, partition)
            {
                slot.prepare_at(Instant::now());
            }
        }
    }

    // No `stalled`: a replica that froze past its session can commit nothing the next owner
    // did not see, because the next owner's `init_transactions` fenced it.

    /// Commits every open transaction.
    fn stop(&mut self) {
        for (topic, partition) in self.slots.keys() {
            self.end(&topic, partition, true);
        }
    }
}

impl CopiesRecords for ExactlyOnce {
    /// Copies one source record into its partition's open transaction.
    fn copy(&mut self, m: &BorrowedMessage<'_>) {
        let Some(Slot {
            remote,
            backoff,
            own: slot,
            ..
        }) = self.slots.find_mut(m.topic(), m.partition())
        else {
            return;
        };
        if !slot.phase.ready() || slot.failed.is_some() || slot.rewind.pending() {
            // Not positioned yet, or the transaction will be aborted and the partition
            // rewound: this record is copied later.
            return;
        }
        let Some(producer) = slot.producer.as_ref() else {
            return;
        };
        if !slot.open() {
            if let Err(e) = producer.begin_transaction() {
                // Only a broken producer refuses to begin: replace it (init, read, seek).
                tracing::warn!(topic = %m.topic(), partition = m.partition(), error = %e,
                    "cannot begin a transaction; preparing the partition again");
                slot.producer = None;
                slot.prepare_at(Instant::now() + backoff.next_delay());
                return;
            }
            slot.phase = Phase::Open;
        }
        if let Some(r) = slot.refused.as_mut()
            && r.offset == m.offset()
        {
            // Refused before: this transaction passes it and records the gap (see `end`).
            r.passed = true;
            return;
        }
        let Ok(opaque) = usize::try_from(m.offset()) else {
            return;
        };
        if let Some(limit) = slot.capped_by {
            let wire = limits::message_size(m);
            if wire.saturating_add(limits::BATCH_OVERHEAD) > limit {
                slot.large.push((m.offset(), wire));
            }
        }
        let (record, bytes) = send::forward(m, remote, opaque);
        if let Err(error) = send::send_waiting(producer, record, &self.shared.shutdown, None) {
            slot.failed = Some(TxFailure::Produce {
                remote: remote.to_string(),
                error,
            });
            return;
        }
        slot.records += 1;
        slot.bytes += bytes as u64;
    }

    /// Every owned partition is prepared again, which checks its committed position against
    /// both logs and records the break.
    fn offsets_out_of_range(&mut self, _consumer: &Source<Self>) {
        for (topic, partition) in self.slots.keys() {
            self.end(&topic, partition, false);
            if let Some(slot) = self.slots.find_mut(&topic, partition) {
                slot.prepare_at(Instant::now());
            }
        }
    }
}

/// Partitions fenced and settled, ready to resume ([`ExactlyOnce::resume`]): (source topic,
/// partition, remote topic), and where their remote partitions end for `read_committed` readers.
struct Fenced {
    partitions: Vec<(String, i32, String)>,
    target_ends: continuity::Ends,
}

impl ExactlyOnce {
    /// `producer_base`: the target producer's settings without a transactional id.
    pub fn new(
        shared: Shared,
        producer_base: ClientConfig,
        limits: RemoteLimits,
        target_watermarks: rdkafka::consumer::BaseConsumer,
    ) -> Self {
        ExactlyOnce {
            shared,
            producer_base,
            slots: SlotTable::default(),
            limits,
            target_watermarks,
        }
    }

    /// Positions the consumer after an aborted transaction.
    fn after(&mut self, topic: &str, partition: i32, ended: Option<Ended>) {
        if !matches!(ended, Some(Ended::Rewind)) {
            return;
        }
        let Some(slot) = self.slots.find_mut(topic, partition) else {
            return;
        };
        if slot.recheck {
            // Prepared again: the start position is then checked against both logs.
            slot.recheck = false;
            slot.prepare_at(Instant::now());
            return;
        }
        // Not at once: a write the target refuses every time would otherwise abort a
        // transaction every COMMIT_EVERY forever. Reset by the next commit.
        let delay = slot.rewind.failed(Instant::now());
        tracing::debug!(%topic, partition, ?delay, "copying the partition again after a backoff");
    }

    /// Moves partitions whose rewind is due back to their committed position.
    fn rewind_due(&mut self, consumer: &Source<Self>) {
        let now = Instant::now();
        for (_, slot) in self.slots.iter_mut() {
            if !slot.rewind.due(now) {
                continue;
            }
            slot.rewind.take();
            let offset = slot
                .committed
                .map_or(Offset::Beginning, |f| Offset::Offset(f.next));
            if let Err(e) = rebalance::reposition(consumer, &slot.topic, slot.partition, offset) {
                tracing::debug!(topic = %slot.topic, partition = slot.partition, error = %e,
                    "seek failed; preparing the partition again");
                slot.prepare_after(now);
            }
        }
    }

    /// Creates and initialises the producers of `keys` that have none (fencing the previous
    /// writer), then reads the positions topic to its end. Returns the partitions now ready
    /// with the offset to start from.
    fn prepare(&mut self, keys: &[(String, i32)]) -> Vec<(String, i32, Offset)> {
        let fenced = self.fence(keys);
        if fenced.is_empty() {
            return Vec::new();
        }
        match self.settle_fenced(fenced) {
            Some(settled) => self.resume(settled),
            None => Vec::new(),
        }
    }

    /// The partitions of `keys` whose producer is ready, a new one created and initialised
    /// (which aborts what the previous writer left open and fences it) where there was none:
    /// (source topic, partition, remote topic). The others are prepared again later.
    fn fence(&mut self, keys: &[(String, i32)]) -> Vec<(String, i32, String)> {
        let mut inited = Vec::new();
        for (topic, partition) in keys {
            let health = self.shared.target_health.clone();
            let limit = self
                .slots
                .find(topic, *partition)
                .and_then(|s| self.limits.get(&s.remote));
            let base = &self.producer_base;
            let Some(slot) = self.slots.find_mut(topic, *partition) else {
                continue;
            };
            if slot.producer.is_none() {
                slot.capped_by = limit;
                let created: Result<BaseProducer<AckContext>, KafkaError> =
                    producer_config(base, &slot.transactional_id, slot.capped_by)
                        .create_with_context(AckContext::new(health));
                let producer = match created {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::error!(%topic, partition, error = %e, "cannot create the transactional producer");
                        slot.prepare_after(Instant::now());
                        continue;
                    }
                };
                // Aborts whatever the previous writer left open and fences it.
                if let Err(e) = producer.init_transactions(CALL_TIMEOUT) {
                    tracing::warn!(%topic, partition, error = %e, id = %slot.transactional_id,
                        "initialising transactions failed; retrying");
                    slot.prepare_after(Instant::now());
                    continue;
                }
                slot.producer = Some(producer);
            }
            inited.push((topic.clone(), *partition, slot.remote.to_string()));
        }
        inited
    }

    /// After fencing: the transactions the fenced writers left open for good are ended (those
    /// partitions are prepared again), and the positions topic is read to its end. The
    /// partitions to resume with where their remote partitions end; `None` when the read
    /// failed (all are prepared again).
    fn settle_fenced(&mut self, mut inited: Vec<(String, i32, String)>) -> Option<Fenced> {
        // After fencing: every position a previous writer committed is in the topic now, and
        // whatever is still open where it wrote stays open for good unless ended here.
        let (open_remotes, target_ends) = self.open_remotes(&inited);
        let read = self.shared.read_positions();
        let positions_topic = self.shared.positions_topic.clone();
        let stopped = (read.as_ref().err())
            .and_then(crate::replicator::source::engine::hanging::stopped_at_open_transaction)
            .map(|_| positions_topic.as_str());
        let closed = self.end_hanging(&inited, &open_remotes, stopped);
        if read.is_err() {
            for (topic, partition, _) in &inited {
                if let Some(slot) = self.slots.find_mut(topic, *partition)
                    && !closed.contains(&(topic.clone(), *partition))
                {
                    slot.prepare_after(Instant::now());
                }
            }
            return None;
        }
        inited.retain(|(topic, partition, _)| !closed.contains(&(topic.clone(), *partition)));
        Some(Fenced {
            partitions: inited,
            target_ends,
        })
    }

    /// Where each settled partition resumes: its committed position checked against both logs
    /// (a break found is recorded with the position past it before anything is copied).
    fn resume(&mut self, fenced: Fenced) -> Vec<(String, i32, Offset)> {
        let Fenced {
            partitions: inited,
            target_ends,
        } = fenced;
        // Stored positions are checked against both logs before anything is read (the remote
        // ends read when settling: the closed partitions left, nothing wrote to the others
        // since).
        let resumes = continuity::resume_all_at(
            &self.shared.positions,
            &self.shared.probe,
            &inited,
            &target_ends,
        );
        let mut ready = Vec::new();
        for ((topic, partition, _), r) in inited.into_iter().zip(resumes) {
            if let Some((kind, from, to)) = r.gap {
                let gap = continuity::found_now(&topic, partition, (kind, from, to));
                if !self.write_gap(&gap, r.start) {
                    // Not copied until the break is on record with the position past it.
                    if let Some(slot) = self.slots.find_mut(&topic, partition) {
                        slot.producer = None;
                        slot.prepare_after(Instant::now());
                    }
                    continue;
                }
            }
            let start = r.start;
            let config = self.shared.sync_config;
            let Some(slot) = self.slots.find_mut(&topic, partition) else {
                continue;
            };
            slot.committed = start;
            slot.latest = start;
            slot.policy = SyncPolicy::new(TopicPartition::new(topic.clone(), partition), config);
            if let rdkafka::Offset::Offset(position) = r.offset {
                slot.policy.reading_from(position, None);
            }
            slot.phase = Phase::Ready;
            let offset = r.offset;
            tracing::debug!(%topic, partition, ?offset, "partition ready (exactly-once)");
            ready.push((topic, partition, offset));
        }
        ready
    }

    /// Records a break and the position past it in one transaction of the partition's
    /// producer, so neither is visible without the other.
    fn write_gap(&mut self, gap: &Gap, start: Option<Frontier>) -> bool {
        let Some(producer) = self
            .slots
            .find(&gap.topic, gap.partition)
            .and_then(|s| s.producer.as_ref())
        else {
            return false;
        };
        let written = self
            .shared
            .record_gap(producer, gap, start, GapWrite::Transaction);
        producer.context().discard();
        written
    }

    fn retry_unready(&mut self, consumer: &Source<Self>) {
        let now = Instant::now();
        let due: Vec<(String, i32)> = self
            .slots
            .iter()
            .filter(|(_, s)| s.phase.due(now))
            .map(|(_, s)| (s.topic.clone(), s.partition))
            .collect();
        if due.is_empty() || self.shared.shutdown.is_cancelled() {
            return;
        }
        for (topic, partition, offset) in self.prepare(&due) {
            if let Err(e) = rebalance::reposition(consumer, &topic, partition, offset) {
                tracing::debug!(%topic, partition, error = %e, "seek failed; retrying later");
                if let Some(slot) = self.slots.find_mut(&topic, partition) {
                    slot.prepare_after(now);
                }
            }
        }
    }
}

fn send_sync(
    producer: &BaseProducer<AckContext>,
    topic: &str,
    sync: &OffsetSync,
    shutdown: &CancellationToken,
) -> Result<(), TxFailure> {
    send::send_sync(producer, topic, sync, NOT_A_RECORD, shutdown).map_err(|error| match error {
        send::SendError::Encode(e) => TxFailure::SyncEncoding(e.to_string()),
        error => TxFailure::Sync {
            topic: topic.to_string(),
            error,
        },
    })
}
