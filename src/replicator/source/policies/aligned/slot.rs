//! What the aligned copy keeps of an owned partition ([`AlignedSlot`]): where its copying is,
//! its writes in flight, what it holds back and waits with, and what it tells the stall watch.

use std::time::Instant;

use rdkafka::Message;
use rdkafka::message::OwnedMessage;
use rdkafka::producer::BaseProducer;

use super::held::Pending;
use crate::kafka::positions::Frontier;
use crate::mm2::{SyncPolicy, TopicPartition};
use crate::replicator::patience::Patience;
use crate::replicator::source::engine::delivery::Copied;
use crate::replicator::source::engine::send::AckContext;
use crate::replicator::source::engine::slots::{InFlightQueue, Slot, UNOWNED};

/// The opaque of the fillers that align a remote partition's log start: no slot's, and told
/// apart from the positions' [`UNOWNED`] so a failed one is counted as what it is.
pub(super) const LOG_START_FILLER: usize = UNOWNED - 1;

/// Where a partition's copying is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Not copying: (re)prepared at `retry_at` (fence, read where the target ends, seek).
    Preparing { retry_at: Instant },
    /// Copying with target offsets equal to source offsets.
    Aligned,
    /// Alignment broke: copying on with translated offsets.
    Translated,
}

/// A plain write not acknowledged yet.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    /// Its source offset; -1 for a filler.
    pub(super) source: i64,
    /// The target offset it must land on; -1 when any will do (translated).
    pub(super) expected: i64,
    pub(super) bytes: u64,
}

/// What this policy keeps of an owned partition besides the engine's part.
pub struct AlignedPart {
    pub(super) transactional_id: String,
    pub(super) txn: Option<BaseProducer<AckContext>>,
    pub(super) state: State,
    /// The target offset the next write lands on (aligned: the next source offset).
    pub(super) next_target: i64,
    /// The newest record read, not written yet; it belongs at `next_target`.
    pub(super) held: Option<OwnedMessage>,
    pub(super) read_at: Instant,
    pub(super) in_flight: InFlightQueue<InFlight>,
    pub(super) sync: SyncPolicy,
    /// After the newest acknowledged record (next source offset, its target offset).
    pub(super) latest: Option<Frontier>,
    pub(super) stored: Option<Frontier>,
    /// A transaction wrapping this source offset failed: the record may be aborted on the
    /// target, so the partition resumes there, translated.
    pub(super) wrap_failed: Option<i64>,
    /// Tries to end a transaction left open at the remote partition's end ([`super::hanging`]).
    pub(super) open_closes: u32,
    /// A transaction planned and not written yet, with the records read after it.
    pub(super) pending: Option<Pending>,
    /// How long a look-up of the partition's marker waits (run off the copy thread, so the
    /// partition's own).
    pub(super) marker_patience: Patience,
}

impl AlignedPart {
    /// `marker_patience`: how long a look-up of its marker may wait.
    pub(super) fn new(
        transactional_id: String,
        state: State,
        sync: SyncPolicy,
        marker_patience: Patience,
    ) -> Self {
        AlignedPart {
            transactional_id,
            txn: None,
            state,
            next_target: 0,
            held: None,
            read_at: Instant::now(),
            in_flight: InFlightQueue::default(),
            sync,
            latest: None,
            stored: None,
            wrap_failed: None,
            open_closes: 0,
            pending: None,
            marker_patience,
        }
    }
}

/// One owned source partition.
pub type AlignedSlot = Slot<AlignedPart>;

impl AlignedSlot {
    pub(super) fn copying(&self) -> bool {
        !matches!(self.state, State::Preparing { .. })
    }

    pub(super) fn tp(&self) -> TopicPartition {
        TopicPartition::new(self.topic.clone(), self.partition)
    }

    /// Where its copy stands, and what it waits for, for the stall watch.
    pub(super) fn copied(&self) -> Copied {
        let next = match (self.latest, self.state) {
            (Some(l), _) => l.next,
            (None, State::Aligned) => self.next_target,
            (None, _) => -1,
        };
        let reason = match (self.state, &self.held) {
            (State::Aligned, _) if self.pending.is_some() => format!(
                "aligned mode waits to write a transaction of the partition, beside those of other partitions ({} records read after it wait with it)",
                self.pending.as_ref().map_or(0, |p| p.backlog.len())
            ),
            (State::Preparing { .. }, _) => format!(
                "aligned mode prepares the partition again and again (fencing the previous writer of {}, reading where the remote partition ends); see the replicator's warnings",
                self.transactional_id
            ),
            (State::Aligned, Some(h)) => format!(
                "aligned mode holds the record at source offset {} back until the offset after it is known, and the source consumer has not reached the source's high watermark (a source transaction still open after it, or the consumer busy with other partitions)",
                h.offset()
            ),
            (State::Aligned, None) => {
                "aligned mode waits for the next record from the source consumer (busy with other partitions' records, or not fetching)".to_string()
            }
            (State::Translated, _) => {
                "aligned mode (translated after a break) waits for the next record from the source consumer"
                    .to_string()
            }
        };
        Copied {
            topic: self.topic.clone(),
            partition: self.partition,
            remote: self.remote.to_string(),
            next,
            reason: Some(reason),
            // Translated, or aligned with nothing held or waiting: records past `next` that
            // the consumer read were markers or aborted ones.
            waits_on_reader: match self.state {
                State::Translated => true,
                State::Aligned => self.held.is_none() && self.pending.is_none(),
                State::Preparing { .. } => false,
            },
        }
    }
}
