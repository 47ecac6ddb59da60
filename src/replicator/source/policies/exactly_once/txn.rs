//! The pure parts of exactly-once copying: transactional ids, producer settings, the phase of
//! a partition's writer, the typed failures that abort a transaction, and how a transaction's
//! delivery reports become offset syncs and a position ([`absorb`]).

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

use crate::flow::Flow;
use crate::kafka::positions::Frontier;
use crate::mm2::{OffsetSync, SyncPolicy};
use crate::replicator::kafka_io::configured_ms;
use crate::replicator::source::engine::send::{Ack, SendError};
use crate::replicator::source::limits;

/// The coordinator aborts a transaction open longer than this (a replica that hangs).
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(15);

/// The transactional id of the writer of one source partition (see the module docs of
/// [`super`]).
pub fn transactional_id(flow: &Flow, topic: &str, partition: i32) -> String {
    let group = crate::replicator::source::source_group_id(flow);
    let base = group.strip_suffix(".source").unwrap_or(&group);
    format!("{base}.tx.{topic}-{partition}")
}

/// Settings of a partition's transactional producer: the at-least-once producer's, plus the id
/// and timeouts a transaction needs.
/// `limit` is the remote topic's `max.message.bytes`, if known: the partition's producer writes
/// only that topic, so its batches are kept under it (a record larger than `batch.size` still
/// goes, alone in its batch, and a refusal then names it).
pub fn producer_config(
    base: &ClientConfig,
    transactional_id: &str,
    limit: Option<usize>,
) -> ClientConfig {
    let mut c = base.clone();
    if let Some(limit) = limit {
        let cap = limits::batch_cap(c.get("batch.size"), c.get("message.max.bytes"))
            .min(limit.saturating_sub(limits::BATCH_OVERHEAD))
            .max(1);
        c.set("batch.size", cap.to_string());
    }
    let timeout = configured_ms(&c, "transaction.timeout.ms")
        .unwrap_or(TRANSACTION_TIMEOUT)
        .as_millis()
        .to_string();
    c.set("transactional.id", transactional_id)
        .set("transaction.timeout.ms", &timeout)
        // librdkafka requires it not to exceed the transaction timeout.
        .set("message.timeout.ms", &timeout);
    c
}

/// Where a partition's writer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not positioned (no producer, start position unread, or to be checked against both
    /// logs again): prepared at `retry_at` (init, read, seek).
    Preparing { retry_at: Instant },
    /// Positioned, no transaction open.
    Ready,
    /// A transaction is open: records are copied into it.
    Open,
}

impl Phase {
    /// Records are copied (a transaction may have to be begun).
    pub fn ready(self) -> bool {
        !matches!(self, Phase::Preparing { .. })
    }

    pub fn due(self, now: Instant) -> bool {
        matches!(self, Phase::Preparing { retry_at } if retry_at <= now)
    }
}

/// Why an open transaction is aborted rather than committed.
#[derive(Debug, thiserror::Error)]
pub enum TxFailure {
    #[error("producing to {remote}: {error}")]
    Produce { remote: String, error: SendError },
    #[error("flushing records: {0}")]
    Flush(KafkaError),
    #[error("writing to the target: {0}")]
    Delivery(KafkaError),
    /// Target offsets only grow within a partition's log: a new log, or lost records.
    #[error(
        "the remote partition went back below the copied records (a copy landed at offset {downstream})"
    )]
    TargetRewound { downstream: i64 },
    #[error(
        "the target refused a batch as too large (offset {offset}); the producer is made again with the remote topic's limit"
    )]
    BatchTooLarge { offset: i64 },
    #[error("encoding an offset sync: {0}")]
    SyncEncoding(String),
    #[error("writing an offset sync to {topic}: {error}")]
    Sync { topic: String, error: SendError },
    #[error("writing the gap of a refused record")]
    Gap,
    #[error("writing the position: {0}")]
    Position(SendError),
    /// A failed call is not a failed commit: only the next producer's init settles it.
    #[error("committing: {0}")]
    Commit(KafkaError),
}

impl TxFailure {
    /// After this failure the start position must be checked against both logs again.
    pub fn needs_recheck(&self) -> bool {
        matches!(self, TxFailure::TargetRewound { .. })
    }
}

/// The source offset a record report is about; `None` for syncs, positions and gaps (their
/// opaque is [`NOT_A_RECORD`]).
pub fn upstream_of(ack: &Ack) -> Option<i64> {
    i64::try_from(ack.opaque).ok()
}

/// The opaque of writes that are not copied records.
pub const NOT_A_RECORD: usize = usize::MAX;

/// Folds a transaction's delivery reports (in send order, one partition) into the sync policy
/// and the position after the last acknowledged record. Returns the offset syncs to add to the
/// transaction, or the first failure (the transaction must then be aborted). Reports of syncs
/// and positions are skipped.
pub fn absorb(
    policy: &mut SyncPolicy,
    latest: &mut Option<Frontier>,
    acks: Vec<Ack>,
    now: Duration,
) -> Result<Vec<OffsetSync>, TxFailure> {
    let mut syncs = Vec::new();
    for ack in acks {
        let upstream = upstream_of(&ack);
        let downstream = ack.result.map_err(TxFailure::Delivery)?.offset;
        let Some(upstream) = upstream else {
            continue;
        };
        if latest.is_some_and(|l| l.downstream >= 0 && downstream <= l.downstream) {
            return Err(TxFailure::TargetRewound { downstream });
        }
        syncs.extend(policy.observe(upstream, downstream, now));
        *latest = Some(Frontier {
            next: upstream.saturating_add(1),
            downstream,
        });
    }
    Ok(syncs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm2::{SyncPolicyConfig, TopicPartition};
    use crate::replicator::source::engine::send::Landed;
    use rdkafka::error::RDKafkaErrorCode;

    fn flow() -> Flow {
        crate::flow::test_flow(
            "ns/f",
            "exactlyOnce: true\nsourceLoop: {offsetSyncsLocation: Target}\n",
        )
    }

    fn ack(upstream: i64, downstream: i64) -> Ack {
        Ack {
            opaque: usize::try_from(upstream).unwrap_or(NOT_A_RECORD),
            result: Ok(Landed {
                offset: downstream,
                timestamp: None,
            }),
        }
    }

    #[test]
    fn each_source_partition_has_its_own_stable_transactional_id() {
        let f = flow();
        assert_eq!(
            transactional_id(&f, "orders", 3),
            "mirrorflow.ns_f.a-b.tx.orders-3"
        );
        assert_ne!(
            transactional_id(&f, "orders", 3),
            transactional_id(&f, "orders", 4)
        );
    }

    #[test]
    fn each_transaction_syncs_where_its_markers_shift_the_delta() {
        let mut policy = SyncPolicy::new(
            TopicPartition::new("t", 0),
            SyncPolicyConfig {
                max_records: 0,
                max_interval: None,
            },
        );
        let mut latest = None;
        let t = Duration::ZERO;
        // First transaction: source 0..3 at target 0..3, then its position record.
        let first = vec![ack(0, 0), ack(1, 1), ack(2, 2), ack(-1, 9)];
        let syncs = absorb(&mut policy, &mut latest, first, t).unwrap();
        assert_eq!(syncs.len(), 1, "the first record");
        assert_eq!(
            latest,
            Some(Frontier {
                next: 3,
                downstream: 2
            })
        );
        // Second: source 3.. lands at 4.. (after the marker): one sync, at its first record.
        let second = vec![ack(3, 4), ack(4, 5)];
        let syncs = absorb(&mut policy, &mut latest, second, t).unwrap();
        assert_eq!(
            syncs
                .iter()
                .map(|s| (s.upstream_offset, s.downstream_offset))
                .collect::<Vec<_>>(),
            [(3, 4)]
        );
        assert_eq!(latest.map(|f| f.next), Some(5));
    }

    #[test]
    fn a_failed_record_fails_the_transaction_and_a_shrinking_log_asks_for_a_recheck() {
        let mut policy = SyncPolicy::new(TopicPartition::new("t", 0), SyncPolicyConfig::default());
        let mut latest = None;
        let failed = Ack {
            opaque: 1,
            result: Err(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageTimedOut,
            )),
        };
        let err = absorb(
            &mut policy,
            &mut latest,
            vec![ack(0, 0), failed],
            Duration::ZERO,
        )
        .unwrap_err();
        assert!(matches!(err, TxFailure::Delivery(_)), "{err}");
        assert!(!err.needs_recheck());
        let err = absorb(&mut policy, &mut latest, vec![ack(1, 0)], Duration::ZERO).unwrap_err();
        assert!(matches!(err, TxFailure::TargetRewound { downstream: 0 }));
        assert!(err.needs_recheck());
    }

    #[test]
    fn message_timeout_never_exceeds_the_transaction_timeout() {
        let mut base = ClientConfig::new();
        base.set("message.timeout.ms", "120000");
        let c = producer_config(&base, "id", None);
        assert_eq!(c.get("transactional.id"), Some("id"));
        assert_eq!(c.get("transaction.timeout.ms"), Some("15000"));
        assert_eq!(c.get("message.timeout.ms"), Some("15000"));
        assert_eq!(c.get("batch.size"), None);
        // A remote topic with a small limit: batches stay under it.
        let small = producer_config(&base, "id", Some(65_536));
        assert_eq!(small.get("batch.size"), Some("65475"));
        base.set("transaction.timeout.ms", "60000");
        assert_eq!(
            producer_config(&base, "id", None).get("message.timeout.ms"),
            Some("60000")
        );
    }

    #[test]
    fn phases_say_when_records_are_copied_and_when_preparing_is_due() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        assert!(!Phase::Preparing { retry_at: now }.ready());
        assert!(Phase::Preparing { retry_at: now }.due(now));
        assert!(!Phase::Preparing { retry_at: later }.due(now));
        assert!(Phase::Ready.ready() && Phase::Open.ready());
        assert!(!Phase::Open.due(later));
    }
}
