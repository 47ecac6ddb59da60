//! Where partitions' logs start and end, for many partitions in one round trip per broker.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

/// The first offset still held and the offset after the last record (high watermark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogBounds {
    pub start: i64,
    pub end: i64,
}

/// Bounds of `partitions`; partitions the cluster does not know (a deleted topic) are left
/// out of the answer rather than failing the rest.
pub fn log_bounds<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
    client: &C,
    partitions: &[(String, i32)],
    timeout: Duration,
) -> Result<HashMap<(String, i32), LogBounds>, KafkaError> {
    let mut out = HashMap::new();
    if partitions.is_empty() {
        return Ok(out);
    }
    let mut starts = TopicPartitionList::new();
    let mut ends = TopicPartitionList::new();
    for (topic, partition) in partitions {
        starts.add_partition_offset(topic, *partition, Offset::Beginning)?;
        ends.add_partition_offset(topic, *partition, Offset::End)?;
    }
    // ListOffsets with the earliest/latest timestamps: one request per broker for all.
    let starts = client.offsets_for_times(starts, timeout)?;
    let ends = client.offsets_for_times(ends, timeout)?;
    for e in ends.elements() {
        let (Offset::Offset(end), Some(Offset::Offset(start))) = (
            e.offset(),
            starts
                .find_partition(e.topic(), e.partition())
                .map(|s| s.offset()),
        ) else {
            continue;
        };
        if e.error().is_err() {
            continue;
        }
        out.insert(
            (e.topic().to_string(), e.partition()),
            LogBounds { start, end },
        );
    }
    Ok(out)
}
