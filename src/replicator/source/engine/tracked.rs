//! What the policies that store positions outside a transaction (at-least-once, whole batches)
//! do alike with their partitions' [`Progress`]: store the positions that moved, find the
//! tail syncs of partitions gone idle and the remote partitions gone back, rewind a faulted
//! partition, and count what the target acknowledged.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use prometheus::local::{LocalHistogram, LocalIntCounter};
use rdkafka::producer::{BaseProducer, Producer};

use super::send::{self, AckContext};
use super::shared::Shared;
use super::slots::{Keyed, Slot, SlotTable, opaque, unpack};
use crate::kafka::positions;
use crate::mm2::OffsetSync;
use crate::replicator::metrics::Metrics;
use crate::replicator::source::progress::{Frontier, Progress};

/// How long storing a position waits for room in the producer's queue.
const POSITION_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// A faulted partition: copied again from `resume_from` at `retry_at`.
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    pub retry_at: Instant,
    pub resume_from: Option<Frontier>,
}

/// The metrics of copies the target acknowledged, counted thread-locally on the copy thread
/// and flushed on service.
pub struct CopyMeters {
    records: LocalIntCounter,
    bytes: LocalIntCounter,
    record_age: LocalHistogram,
    latency: LocalHistogram,
}

impl CopyMeters {
    pub fn new(m: &Metrics) -> Self {
        CopyMeters {
            records: m.records_replicated.local(),
            bytes: m.bytes_replicated.local(),
            record_age: m.record_age.local(),
            latency: m.replication_latency.local(),
        }
    }

    /// `records` records (`bytes` bytes) read at `read_at` were acknowledged; the newest of
    /// them was `age_ms` old then, when its timestamp is known.
    pub fn copied(&mut self, records: u64, bytes: u64, read_at: Instant, age_ms: Option<i64>) {
        self.records.inc_by(records);
        self.bytes.inc_by(bytes);
        self.latency.observe(read_at.elapsed().as_secs_f64());
        if let Some(age) = age_ms {
            self.record_age.observe(age.max(0) as f64 / 1000.0);
        }
    }

    pub fn flush(&self) {
        self.records.flush();
        self.bytes.flush();
        self.record_age.flush();
        self.latency.flush();
    }
}

/// What the policies that store positions outside a transaction keep of each partition besides
/// the engine's part ([`Slot`]): its progress, its fault, why its last write failed, and `own`,
/// the policy's remaining fields (read through `Deref` as the slot's own).
#[derive(Debug)]
pub struct Tracking<P> {
    pub progress: Progress,
    /// Set while the partition waits to be copied again: nothing of it is stored or synced.
    pub fault: Option<Fault>,
    /// Why its last write failed, until a write succeeds again: what a stall of it is named
    /// with.
    pub last_fault: Option<String>,
    pub own: P,
}

impl<P> Tracking<P> {
    pub fn new(progress: Progress, fault: Option<Fault>, own: P) -> Self {
        Tracking {
            progress,
            fault,
            last_fault: None,
            own,
        }
    }

    /// Whether it is being copied.
    pub fn copying(&self) -> bool {
        self.fault.is_none()
    }

    fn tracked(&mut self) -> Option<&mut Progress> {
        self.fault.is_none().then_some(&mut self.progress)
    }
}

impl<P> Deref for Tracking<P> {
    type Target = P;
    fn deref(&self) -> &P {
        &self.own
    }
}

impl<P> DerefMut for Tracking<P> {
    fn deref_mut(&mut self) -> &mut P {
        &mut self.own
    }
}

/// A slot of a policy that tracks progress record by record (or batch by batch).
pub type TrackedSlot<P> = Slot<Tracking<P>>;

impl<P> TrackedSlot<P> {
    /// Copying proceeds in generation `generation`.
    pub fn live(&self, generation: u32) -> bool {
        self.generation == generation && self.own.copying()
    }

    /// A faulted partition whose retry could not start now: the next attempt after the next
    /// backoff delay from `now`.
    pub fn retry_later(&mut self, now: Instant) {
        let delay = self.backoff.next_delay();
        if let Some(f) = self.own.fault.as_mut() {
            f.retry_at = now + delay;
        }
    }
}

/// Queues the position of each of `idxs` whose committable point moved on the positions
/// topic through `producer` (its report comes back as a position write of the slot). A
/// position that cannot be queued now is handed out again next time.
pub fn persist<P>(
    shared: &Shared,
    producer: &BaseProducer<AckContext>,
    slots: &mut SlotTable<TrackedSlot<P>>,
    idxs: &[usize],
) {
    for &idx in idxs {
        let Some(slot) = slots.get_mut(idx) else {
            continue;
        };
        let (topic, partition) = slot.key();
        let key = positions::encode_key(topic, partition);
        let generation = slot.generation;
        let Some(progress) = slot.own.tracked() else {
            continue;
        };
        let Some(position) = progress.take_to_store() else {
            continue;
        };
        let value = positions::encode_value(position);
        let record = send::internal(
            &shared.positions_topic,
            &key,
            &value,
            opaque(idx, generation, true),
        );
        let deadline = Some(Instant::now() + POSITION_SEND_TIMEOUT);
        // Serves callbacks, which only queue reports: the slot stays valid.
        if let Err(e) = send::send_waiting(producer, record, &shared.shutdown, deadline) {
            progress.store_failed();
            super::shared::count_error(&shared.ctx, "positions");
            let (topic, partition) = slot.key();
            tracing::warn!(%topic, partition, error = %e,
                "cannot store the source position now; retrying");
        }
    }
}

/// Settles the offset syncs `syncs` acknowledged since the last call (each partition's in the
/// order they were written) and returns the slots of those it failed, with the error, for the
/// caller to fault. Reports of an older generation of a slot are ignored.
pub fn settle_syncs<P>(
    shared: &Shared,
    syncs: &BaseProducer<AckContext>,
    slots: &mut SlotTable<TrackedSlot<P>>,
) -> Vec<(usize, rdkafka::error::KafkaError)> {
    let mut acks = Vec::new();
    syncs.context().take(&mut acks);
    let mut failed = Vec::new();
    for ack in acks {
        let (idx, generation, _) = unpack(ack.opaque);
        let Some(slot) = slots.get_mut(idx).filter(|s| s.generation == generation) else {
            continue;
        };
        match ack.result {
            Ok(_) => {
                slot.own.progress.sync_acknowledged();
                shared.ctx.metrics.offset_syncs.inc();
            }
            Err(e) => failed.push((idx, e)),
        }
    }
    failed
}

/// The tail sync of every partition that went idle with copies after its last sync
/// ([`Progress::idle_sync`]), with its slot and generation; one cheap check per partition.
pub fn idle_syncs<P>(
    shared: &Shared,
    slots: &mut SlotTable<TrackedSlot<P>>,
) -> Vec<(usize, u32, OffsetSync)> {
    let now = shared.now();
    let mut syncs = Vec::new();
    for (idx, slot) in slots.iter_mut() {
        let generation = slot.generation;
        if let Some(sync) = slot.own.tracked().and_then(|p| p.idle_sync(now)) {
            tracing::debug!(topic = %sync.topic_partition.topic, partition = sync.topic_partition.partition,
                upstream = sync.upstream_offset, downstream = sync.downstream_offset,
                "partition idle: offset sync at its last record");
            syncs.push((idx, generation, sync));
        }
    }
    syncs
}

/// The remote partitions that end at or before the newest copy of theirs (the remote topic was
/// deleted, and discovery created it again), among the copying partitions `quiet` says
/// nothing is written to now (written ones notice from their answers): (slot, the first
/// offset missing, the remote end). One ListOffsets per broker.
pub fn rewound_targets<P>(
    shared: &Shared,
    slots: &SlotTable<TrackedSlot<P>>,
    quiet: impl Fn(&TrackedSlot<P>) -> bool,
) -> Vec<(usize, i64, i64)> {
    let idle = (slots.iter())
        .filter_map(|(idx, s)| {
            let latest = s.progress.latest()?;
            (s.copying() && quiet(s) && latest.downstream >= 0)
                .then(|| ((idx, latest.downstream), s.remote.to_string(), s.partition))
        })
        .collect();
    (shared.probe.remote_ends(idle).into_iter())
        .filter(|&((_, downstream), end)| end <= downstream)
        .map(|((idx, downstream), end)| (idx, downstream.saturating_add(1), end))
        .collect()
}
