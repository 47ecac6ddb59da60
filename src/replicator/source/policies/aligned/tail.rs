//! What a previous writer left at the end of a remote partition: the one case fencing cannot
//! settle. A writer killed while the transaction wrapping a record was open (see
//! [`super::plan::Step::Wrapped`]) leaves that record aborted by the next owner's
//! `init_transactions`: the offsets still match, but the record is invisible to
//! `read_committed` readers. It is found by reading the record two offsets before the end both
//! ways: a copied record (not a filler) that only `read_uncommitted` returns was aborted.
//! Before that, a partition whose last transaction is still open (its records neither
//! committed nor aborted yet) is not judged at all: its end is not known until it closes.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::kafka::log_bounds::log_bounds;
use crate::replicator::patience::Patience;
use crate::replicator::source::engine::hanging::{FILLER_HEADER, Unread, open_at_end};

const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// (remote topic, partition) -> (offset of the first record found, whether it is a filler).
type FirstRecords = HashMap<(String, i32), (i64, bool)>;

/// A topic's partition.
type Key = (String, i32);

/// A remote partition, the source partition it copies, and where the remote one ends.
pub type Copy = (Key, Key, i64);

/// Of `ends` ((remote topic, partition) -> log end), the partitions whose record at end - 2 is
/// a copy whose wrapping transaction was aborted.
pub fn aborted_wraps(
    target: &ClientConfig,
    ends: &[((String, i32), i64)],
) -> Result<HashSet<(String, i32)>, KafkaError> {
    let candidates: Vec<((String, i32), i64)> = ends
        .iter()
        .filter(|(_, end)| *end >= 2)
        .map(|(k, end)| (k.clone(), end - 2))
        .collect();
    if candidates.is_empty() {
        return Ok(HashSet::new());
    }
    let everything = first_records(target, "read_uncommitted", &candidates)?;
    let visible = first_records(target, "read_committed", &candidates)?;
    Ok(candidates
        .into_iter()
        .filter(|(key, at)| {
            everything.get(key) == Some(&(*at, false))
                && visible.get(key).is_none_or(|v| v.0 != *at)
        })
        .map(|(key, _)| key)
        .collect())
}

/// Of `ends` ((remote topic, partition) -> log end, with the source partition it copies), the
/// partitions whose last offset (end - 1) holds no record where the source has a visible one.
/// A writer fenced after its transaction wrapping a record took the partition, but before the
/// record reached it, leaves the marker of an empty transaction at the record's offset: the
/// record was never copied, and alignment broke there. (Anywhere else a marker or an aborted
/// filler on the target stands for an offset the source's `read_committed` readers skip too.)
pub fn unwritten_wraps(
    (target, source): (&ClientConfig, &ClientConfig),
    ends: &[Copy],
) -> Result<HashSet<(String, i32)>, KafkaError> {
    let last: Vec<((String, i32), i64)> = ends
        .iter()
        .filter(|(_, _, end)| *end >= 1)
        .map(|(remote, _, end)| (remote.clone(), end - 1))
        .collect();
    if last.is_empty() {
        return Ok(HashSet::new());
    }
    let records = first_records(target, "read_uncommitted", &last)?;
    let markers: Vec<(&Key, &Key, i64)> = ends
        .iter()
        .filter(|(remote, _, end)| *end >= 1 && records.get(remote).is_none_or(|r| r.0 != end - 1))
        .map(|(remote, source, end)| (remote, source, end - 1))
        .collect();
    if markers.is_empty() {
        return Ok(HashSet::new());
    }
    let at: Vec<((String, i32), i64)> = markers
        .iter()
        .map(|(_, source, offset)| ((*source).clone(), *offset))
        .collect();
    let visible = first_records(source, "read_committed", &at)?;
    Ok(markers
        .into_iter()
        .filter(|(_, source, offset)| visible.get(*source).is_some_and(|v| v.0 == *offset))
        .map(|(remote, _, _)| remote.clone())
        .collect())
}

/// Of `stable` ((remote topic, partition) -> where the log ends for `read_committed` readers:
/// the last stable offset), the partitions where a transaction is still open, with their high
/// watermark beyond the stable end (or the stable end when it could not be read: open until
/// known). Resuming at the stable end there put the next copy past its source offset.
/// `uncommitted`: a `read_uncommitted` client of the target (the policy's watermark reader).
/// `patience`: how long the look-up of their watermarks may take.
pub fn open_transactions(
    (uncommitted, patience): (&BaseConsumer, &Patience),
    stable: &[((String, i32), i64)],
) -> Result<HashMap<(String, i32), i64>, KafkaError> {
    if stable.is_empty() {
        return Ok(HashMap::new());
    }
    let keys: Vec<(String, i32)> = stable.iter().map(|(k, _)| k.clone()).collect();
    let high = patience.ask(super::CALL_TIMEOUT, |limit| {
        log_bounds(uncommitted, &keys, limit)
    })?;
    let high = high.into_iter().map(|(k, b)| (k, b.end)).collect();
    Ok(open_at_end(
        stable.iter().map(|(k, e)| (k, e)),
        &high,
        Unread::Open,
    ))
}

/// The first record at or after each offset: (its offset, whether it is a filler); partitions
/// that end before one arrives are left out. One partition at a time: the end-of-partition
/// event names a partition number only.
fn first_records(
    cluster: &ClientConfig,
    isolation: &str,
    from: &[((String, i32), i64)],
) -> Result<FirstRecords, KafkaError> {
    let consumer: BaseConsumer = cluster
        .clone()
        .set("group.id", "mirrorflow-aligned-tail")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        // An offset below the log start (fillers deleted there): nothing to find.
        .set("auto.offset.reset", "latest")
        .set("isolation.level", isolation)
        .create()?;
    let mut found = HashMap::new();
    for ((topic, partition), offset) in from {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
        consumer.assign(&tpl)?;
        let deadline = Instant::now() + READ_TIMEOUT;
        while Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    let filler = m
                        .headers()
                        .is_some_and(|h| h.iter().any(|h| h.key == FILLER_HEADER));
                    found.insert((topic.clone(), *partition), (m.offset(), filler));
                    break;
                }
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => return Err(e),
                None => {}
            }
        }
    }
    Ok(found)
}
