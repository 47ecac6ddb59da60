//! Reading a few records of a partition for the commands that compare the clusters' records
//! (`drill`, `takeover`): read committed, as no group, bounded by offsets and time.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::CliError;
use super::drill::judge::{Seen, fingerprint};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Maps a client error to the command error naming what was done on which cluster.
pub(crate) fn kafka_error(
    what: String,
    cluster: &'static str,
) -> impl FnOnce(KafkaError) -> CliError {
    move |source| CliError::Kafka {
        what,
        cluster,
        source,
    }
}

/// A reader of one partition's records, read committed, as no group.
pub(crate) fn reader(
    client: &ClientConfig,
    cluster: &'static str,
) -> Result<BaseConsumer, CliError> {
    client
        .clone()
        .set("group.id", "mirrorflow-cli-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .create()
        .map_err(kafka_error("creating a reader".into(), cluster))
}

pub(crate) fn seen(m: &rdkafka::message::BorrowedMessage<'_>) -> Seen {
    let headers: Vec<(&[u8], Option<&[u8]>)> = m
        .headers()
        .map(|h| h.iter().map(|h| (h.key.as_bytes(), h.value)).collect())
        .unwrap_or_default();
    let fp = fingerprint(m.key(), m.payload(), m.timestamp().to_millis(), &headers);
    (m.offset(), fp)
}

/// Records of `topic`/`partition` in `[from, to)` (clamped to the log), and whether that
/// reached the partition's end.
pub(crate) fn read_range(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    from: i64,
    to: i64,
) -> Result<(Vec<Seen>, bool), KafkaError> {
    let (low, high) = consumer.fetch_watermarks(topic, partition, TIMEOUT)?;
    let (from, to) = (from.max(low), to.min(high));
    if from >= to {
        return Ok((Vec::new(), to >= high));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(from))?;
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                if m.offset() >= to {
                    break;
                }
                out.push(seen(&m));
                if m.offset() + 1 >= to {
                    break;
                }
            }
            // The end as read committed: markers and open transactions end it before `high`.
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    Ok((out, to >= high))
}

/// The newest record of a partition before `before`, looking back a few offsets (transaction
/// markers take offsets).
pub(crate) fn newest_before(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    before: i64,
) -> Result<Option<Seen>, KafkaError> {
    let (records, _) = read_range(consumer, topic, partition, before.saturating_sub(8), before)?;
    Ok(records.last().copied())
}
