//! Transactions left open for good ("hanging") on a partition a fenced writer wrote.
//!
//! A target broker that restarts while a transaction ends can leave it open on some of its
//! partitions: the coordinator, loaded before the broker knows the partitions' leaders again,
//! takes them for deleted and skips their markers, then counts the transaction as ended. No
//! timeout ends it after that, and every `read_committed` reader of such a partition stops at
//! its first record for good: the copy's own read of the positions topic included, which every
//! exactly-once or aligned partition waits for before it copies, so one lost marker stopped
//! every partition of the flow.
//!
//! Only a marker of the same producer ends it. A partition's transactional producer, fenced in
//! by `init_transactions`, keeps the producer id of the writer it fenced (with a newer epoch):
//! a transaction of it that writes a filler to the partition and aborts ends the open one with
//! it, aborted. Aborting is the side that keeps exactly-once: whatever the lost transaction
//! held (copies, the position past them, offset syncs) is invisible together, and the copy
//! goes on from the position committed before it.

use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tokio_util::sync::CancellationToken;

use super::send::{self, AckContext};
use crate::kafka::reader::ReadError;

/// The header (and the key) of the records the copy writes only to take an offset or to end a
/// transaction: never a source record's copy.
pub const FILLER_HEADER: &str = "mirrorflow.filler";
/// How often a producer is served while its writes settle.
const SETTLE_POLL: Duration = Duration::from_millis(1);

pub fn filler_headers() -> OwnedHeaders {
    OwnedHeaders::new().insert(Header {
        key: FILLER_HEADER,
        value: Some(&[] as &[u8]),
    })
}

/// A filler of `topic`'s partition: the filler key (a compacted topic refuses records
/// without one), no value, the filler header.
pub fn filler<'a>(
    topic: &'a str,
    partition: i32,
    headers: &OwnedHeaders,
    timestamp: Option<i64>,
) -> send::Record<'a> {
    let record: send::Record<'a> = BaseRecord::with_opaque_to(topic, 0)
        .partition(partition)
        .key(FILLER_HEADER.as_bytes())
        .headers(headers.clone());
    match timestamp {
        Some(ts) => record.timestamp(ts),
        None => record,
    }
}

/// Serves `producer` until nothing it wrote is unacknowledged, or `timeout`.
pub fn settle(producer: &BaseProducer<AckContext>, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while producer.in_flight_count() > 0 {
        if Instant::now() >= deadline {
            return Err(format!(
                "{} writes unacknowledged after {timeout:?}",
                producer.in_flight_count()
            ));
        }
        producer.poll(SETTLE_POLL);
    }
    Ok(())
}

/// One transaction of `producer` that writes a filler to each of `partitions` and aborts: it
/// ends a transaction the producer's id left open there. The delivery reports are dropped
/// (nothing of the copy's).
pub fn abort_fillers(
    producer: &BaseProducer<AckContext>,
    partitions: &[(String, i32)],
    shutdown: &CancellationToken,
    timeout: Duration,
) -> Result<(), String> {
    producer.begin_transaction().map_err(|e| e.to_string())?;
    let headers = filler_headers();
    let deadline = Instant::now() + timeout;
    let written = partitions
        .iter()
        .try_for_each(|(topic, partition)| {
            let record = filler(topic, *partition, &headers, None);
            send::send_waiting(producer, record, shutdown, Some(deadline))
                .map_err(|e| e.to_string())
        })
        .and_then(|()| settle(producer, timeout));
    let mut reports = Vec::new();
    producer.context().take(&mut reports);
    let aborted = producer
        .abort_transaction(timeout)
        .map_err(|e| e.to_string());
    written.and(aborted)
}

/// Where a read of a single-partition topic to its end stopped short of records that are
/// there (`Some(offset)`): a transaction open at that offset, which it waits for. `None` for
/// every other failure.
pub fn stopped_at_open_transaction(error: &ReadError) -> Option<i64> {
    match error {
        ReadError::Timeout { at, end, .. } if at < end => Some(*at),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_read_short_of_records_that_are_there_waits_on_a_transaction() {
        let timeout = |at, end| ReadError::Timeout {
            cluster: "target",
            topic: "p".into(),
            at,
            end,
            timeout: Duration::from_secs(10),
        };
        assert_eq!(stopped_at_open_transaction(&timeout(13, 57)), Some(13));
        assert_eq!(stopped_at_open_transaction(&timeout(57, 57)), None);
        let missing = ReadError::NoTopic {
            cluster: "target",
            topic: "p".into(),
        };
        assert_eq!(stopped_at_open_transaction(&missing), None);
    }

    #[test]
    fn a_filler_carries_the_filler_key_and_header_and_no_value() {
        let headers = filler_headers();
        let record = filler("t", 3, &headers, Some(7));
        assert_eq!(record.partition, Some(3));
        assert_eq!(record.key, Some(FILLER_HEADER.as_bytes()));
        assert_eq!(record.payload, None);
        assert_eq!(record.timestamp, Some(7));
    }
}
