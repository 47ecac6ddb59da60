//! What every delivery policy holds besides its slots and producers ([`Shared`]), and the
//! writes of the positions topic and the offset-syncs topic every policy makes alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, Producer};
use tokio_util::sync::CancellationToken;

use super::hanging;
use super::send::{self, AckContext};
use super::slots;
use super::workers::Worker;
use crate::kafka::positions::{self, Frontier, Gap, PositionReader};
use crate::kafka::reader::ReadError;
use crate::mm2::{OffsetSync, SyncPolicyConfig};
use crate::replicator::context::Context;
use crate::replicator::reach::Reachability;
use crate::replicator::source::continuity::{self, LogProbe};
use crate::replicator::stops::Stops;

/// How long recording a break waits for the target ([`Shared::record_gap`]): a flush, or a
/// transaction (whose commit may first wait for the coordinator).
const GAP_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
const GAP_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one read of the positions topic to its end may take ([`Shared::read_positions`]).
const POSITIONS_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Counts an error of the source loop under `kind`.
pub fn count_error(ctx: &Context, kind: &str) {
    ctx.metrics
        .errors
        .with_label_values(&["source", kind])
        .inc();
}

/// How [`Shared::record_gap`] makes a break durable on its producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapWrite {
    /// A plain producer: flushed.
    Flush,
    /// A transactional producer with no transaction open: a transaction of its own.
    Transaction,
}

/// What every delivery policy holds besides its slots and producers: the flow, where its
/// positions and offset syncs go, what resumes a partition, and the two clusters' health.
pub struct Shared {
    pub ctx: Arc<Context>,
    pub syncs_topic: String,
    pub positions_topic: String,
    pub positions: PositionReader,
    pub probe: LogProbe,
    /// The dense sync policy of every partition: a sync on every delta change, and at least
    /// every `sourceLoop.offsetSyncInterval`.
    pub sync_config: SyncPolicyConfig,
    /// The origin of the sync policies' clock ([`Shared::now`]).
    pub started: Instant,
    pub shutdown: CancellationToken,
    pub source_health: Arc<Reachability>,
    pub target_health: Arc<Reachability>,
    /// Which of the replica's copy loops this policy runs in.
    pub worker: Worker,
    /// Partitions the flow's owner must hear of (stopped batches, stalled partitions), which
    /// the discovery loop writes into the positions topic's refusal record.
    pub stops: Stops,
}

impl Shared {
    /// The dense sync policy of a flow's partitions.
    pub fn sync_config_of(ctx: &Context) -> SyncPolicyConfig {
        SyncPolicyConfig {
            max_interval: Some(ctx.flow.spec.source_loop.offset_sync_interval.as_duration()),
            ..SyncPolicyConfig::default()
        }
    }

    /// Time since the loop started: the clock of the sync policies.
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// The remote topic of a source topic.
    pub fn remote_topic(&self, topic: &str) -> String {
        let flow = &self.ctx.flow;
        flow.policy.format_remote_topic(flow.source_alias(), topic)
    }

    /// Reads the positions topic to its end (every position a previous owner stored is then
    /// known); a failure is counted and marks the target unreachable.
    pub fn read_positions(&mut self) -> Result<(), ReadError> {
        match self.positions.read_to_end(POSITIONS_READ_TIMEOUT) {
            Ok(()) => {
                self.target_health.ok();
                if self.positions.undecodable() > 0 {
                    tracing::warn!(count = self.positions.undecodable(), topic = %self.positions_topic,
                        "ignored records the positions topic should not hold");
                }
                Ok(())
            }
            Err(e) => {
                count_error(&self.ctx, "positions");
                match hanging::stopped_at_open_transaction(&e) {
                    // The cluster answers: a transaction is open there. Each fenced partition's
                    // producer ends its own ([`hanging`]); one no replica owns stays until an
                    // administrator ends it.
                    Some(at) => tracing::warn!(error = %e, topic = %self.positions_topic,
                        "reading the positions topic stops at a transaction open at offset {at}; the partition whose writer left it ends it when it is prepared again; if it stays, end it with kafka-transactions.sh abort --topic {} --partition 0 --start-offset {at}",
                        self.positions_topic),
                    None => {
                        tracing::warn!(error = %e, "reading the positions topic failed; retrying");
                        self.target_health
                            .unreachable("reading the positions topic", &e);
                    }
                }
                Err(e)
            }
        }
    }

    /// Queues an offset sync on the flow's offset-syncs topic ([`send::send_sync`]). An error
    /// is the caller's to fault the partition with; a sync that cannot be encoded is logged
    /// and counted here instead (impossible for a real topic name, and copying again would
    /// not change it).
    pub fn write_sync(
        &self,
        producer: &BaseProducer<AckContext>,
        sync: &OffsetSync,
        opaque: usize,
    ) -> Result<(), send::SendError> {
        match send::send_sync(producer, &self.syncs_topic, sync, opaque, &self.shutdown) {
            Err(send::SendError::Encode(e)) => {
                tracing::error!(error = %e, sync = ?sync, "cannot encode an offset sync");
                count_error(&self.ctx, "offset_sync");
                Ok(())
            }
            sent => sent,
        }
    }

    /// Records a break in the positions topic through `producer` and waits for the target to
    /// take it, with the position copying resumes from when there is one (so a restart before
    /// the next stored position does not find the same break again). Returns whether it was
    /// written ([`continuity::record`]).
    pub fn record_gap(
        &self,
        producer: &BaseProducer<AckContext>,
        gap: &Gap,
        start: Option<Frontier>,
        how: GapWrite,
    ) -> bool {
        let topic = &self.positions_topic;
        continuity::record(gap, &self.ctx.metrics, |key, value| {
            if how == GapWrite::Transaction {
                producer.begin_transaction()?;
            }
            let queue = |k: &[u8], v: &[u8]| {
                producer
                    .send(send::internal(topic, k, v, slots::UNOWNED))
                    .map_err(|(e, _)| e)
            };
            let queued = queue(key, value).and_then(|()| match start {
                Some(f) => queue(
                    &positions::encode_key(&gap.topic, gap.partition),
                    &positions::encode_value(f),
                ),
                None => Ok(()),
            });
            match (how, queued) {
                (GapWrite::Flush, Ok(())) => producer.flush(GAP_FLUSH_TIMEOUT),
                (GapWrite::Flush, Err(e)) => Err(e),
                (GapWrite::Transaction, Ok(())) => {
                    producer.commit_transaction(GAP_TRANSACTION_TIMEOUT)
                }
                (GapWrite::Transaction, Err(e)) => {
                    // The abort's own failure changes nothing: the break is not on record.
                    let _ = producer.abort_transaction(GAP_TRANSACTION_TIMEOUT);
                    Err(e)
                }
            }
        })
    }
}
