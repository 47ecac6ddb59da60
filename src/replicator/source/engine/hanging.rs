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

use std::collections::HashMap;
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

/// What a partition whose high watermark was not read counts as: the caller's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// Open until known: its copy waits (aligned offsets resume at the end of the log).
    Open,
    /// Not open: the next look decides (exactly-once resumes at its committed position).
    Closed,
}

/// Of `stable` (each partition's end for `read_committed` readers: its last stable offset),
/// the partitions a transaction holds open at their end, each with its high watermark (`high`):
/// one past the stable end. The two ends come from two requests, so a watermark before the
/// stable end (the log was cut between them) tells as little as none: both count as `unread`
/// says, open (with the stable end) or not.
pub fn open_at_end<'a>(
    stable: impl IntoIterator<Item = (&'a (String, i32), &'a i64)>,
    high: &HashMap<(String, i32), i64>,
    unread: Unread,
) -> HashMap<(String, i32), i64> {
    stable
        .into_iter()
        .filter_map(|(key, &end)| match high.get(key) {
            Some(&h) if h == end => None,
            Some(&h) if h > end => Some((key.clone(), h)),
            _ => (unread == Unread::Open).then(|| (key.clone(), end)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_is_open_while_its_high_watermark_is_past_its_stable_end() {
        let key = |p: i32| ("remote".to_string(), p);
        // Closed (ends agree), open (a record past the stable end), not read, read before
        // the stable end (the log was cut between the two requests).
        let stable: HashMap<_, _> = [(key(0), 22), (key(1), 22), (key(2), 7), (key(3), 9)].into();
        let high: HashMap<_, _> = [(key(0), 22), (key(1), 23), (key(3), 4)].into();
        let waits = open_at_end(&stable, &high, Unread::Open);
        assert_eq!(waits, [(key(1), 23), (key(2), 7), (key(3), 9)].into());
        let goes_on = open_at_end(&stable, &high, Unread::Closed);
        assert_eq!(goes_on, [(key(1), 23)].into());
    }

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
