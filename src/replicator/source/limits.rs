//! Record size limits of remote topics, and what they mean for a partition's writes (pure,
//! plus the map discovery fills and the copiers read).
//!
//! A broker compares each record batch, not each record, with the topic's
//! `max.message.bytes`, and refuses the whole batch when it is larger (`MSG_SIZE_TOO_LARGE`,
//! permanent: librdkafka does not split batches). Config sync copies the source topic's limit,
//! while the producer batches up to its own `batch.size` across every topic it writes, so a
//! remote topic with a small limit would have its batches refused, its partition rewound and
//! the same batch built and refused again, forever. Two rules prevent that:
//!
//! - the bytes a partition has queued and unacknowledged stay under its remote limit
//!   ([`admit`]): librdkafka builds a partition's batch only from what is queued for it, so no
//!   batch can grow past the limit;
//! - a record that may not fit alone is written alone (nothing queued before or after it), so
//!   a refusal names that record and nothing else. It is then skipped and recorded as a
//!   [`crate::kafka::positions::GapKind::RecordRejected`] gap instead of retried.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use rdkafka::admin::ConfigEntry;
use rdkafka::message::{BorrowedMessage, Headers, Message};

/// The topic config the broker checks batches against.
pub const MAX_MESSAGE_BYTES: &str = "max.message.bytes";

/// Bytes of a v2 record batch besides its records: base offset, length, leader epoch, magic,
/// CRC, attributes, offset delta, timestamps, producer id, epoch, base sequence, count.
/// The broker counts them against the limit.
pub const BATCH_OVERHEAD: usize = 61;
/// The most framing a v2 record adds besides its key, value and headers: length, attributes,
/// timestamp delta, offset delta, key and value lengths, header count (varints at their
/// widest).
const RECORD_OVERHEAD: usize = 5 + 1 + 10 + 5 + 5 + 5 + 5;
/// The most framing a header adds besides its key and value (two length varints).
const HEADER_OVERHEAD: usize = 10;

/// Remote topic name -> its `max.message.bytes`, as discovery last read it from the target.
#[derive(Clone, Default)]
pub struct RemoteLimits(Arc<RwLock<HashMap<String, usize>>>);

impl RemoteLimits {
    pub fn get(&self, remote: &str) -> Option<usize> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(remote)
            .copied()
    }

    /// Records the limits read from the remote topics' configs (`describe` output); topics
    /// without a readable limit keep what was known.
    pub fn update<'a>(
        &self,
        configs: impl IntoIterator<Item = (&'a String, &'a Vec<ConfigEntry>)>,
    ) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        for (topic, entries) in configs {
            if let Some(limit) = limit_of(entries) {
                map.insert(topic.clone(), limit);
            }
        }
    }
}

/// The effective `max.message.bytes` among a topic's described configs (the topic's own value,
/// or the broker's `message.max.bytes` the description reports in its place).
pub fn limit_of(entries: &[ConfigEntry]) -> Option<usize> {
    entries
        .iter()
        .find(|e| e.name == MAX_MESSAGE_BYTES)
        .and_then(|e| e.value.as_deref())
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&l| l > 0)
}

/// An upper bound of the bytes a record takes in a v2 batch. `headers` are (key, value)
/// lengths.
pub fn wire_size(
    key: usize,
    value: usize,
    headers: impl IntoIterator<Item = (usize, usize)>,
) -> usize {
    headers.into_iter().fold(
        RECORD_OVERHEAD.saturating_add(key).saturating_add(value),
        |n, (k, v)| {
            n.saturating_add(HEADER_OVERHEAD)
                .saturating_add(k)
                .saturating_add(v)
        },
    )
}

/// [`wire_size`] of a record as the source consumer returned it.
pub fn message_size(m: &BorrowedMessage<'_>) -> usize {
    wire_size(
        m.key().map_or(0, <[u8]>::len),
        m.payload().map_or(0, <[u8]>::len),
        m.headers()
            .into_iter()
            .flat_map(|h| h.iter())
            .map(|h| (h.key.len(), h.value.map_or(0, <[u8]>::len))),
    )
}

/// What to do with a record before queueing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Queue it now.
    Send,
    /// Wait for acknowledgements of the partition's queued records first: together they
    /// could make a batch over the limit.
    WaitForRoom,
    /// It may not fit even alone: queue it with nothing else of its partition queued, and
    /// queue nothing after it until it is acknowledged or refused.
    Alone,
}

/// Decides for a record of `wire` bytes ([`wire_size`]) with `in_flight` bytes of its
/// partition queued or unacknowledged (`queued_records` records). `limit` is the remote topic's,
/// if known; `batch_cap` the largest batch the producer builds (its `batch.size` and
/// `message.max.bytes`, whichever is smaller); `alone` forces [`Admit::Alone`] (the record
/// was part of a refused batch).
pub fn admit(
    wire: usize,
    in_flight: usize,
    queued_records: usize,
    limit: Option<usize>,
    batch_cap: usize,
    alone: bool,
) -> Admit {
    let may_not_fit_alone = limit.is_some_and(|l| wire.saturating_add(BATCH_OVERHEAD) > l);
    if alone || may_not_fit_alone {
        return if queued_records == 0 {
            Admit::Alone
        } else {
            Admit::WaitForRoom
        };
    }
    match limit {
        // The producer's own batches stay under the limit (or the limit is unknown: trust it).
        None => Admit::Send,
        Some(l) if l >= batch_cap => Admit::Send,
        Some(l) => {
            let batch = in_flight
                .saturating_add(wire)
                .saturating_add(BATCH_OVERHEAD);
            if queued_records == 0 || batch <= l {
                Admit::Send
            } else {
                Admit::WaitForRoom
            }
        }
    }
}

/// The largest batch a producer with these settings builds (librdkafka: the smaller of
/// `batch.size` and `message.max.bytes`, its defaults when unset or unreadable).
pub fn batch_cap(batch_size: Option<&str>, message_max_bytes: Option<&str>) -> usize {
    let parse = |v: Option<&str>, default: usize| {
        v.and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(default)
    };
    parse(batch_size, 1_000_000).min(parse(message_max_bytes, 1_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::admin::ConfigSource;

    const MB: usize = 1_000_000;

    #[test]
    fn a_topic_whose_limit_the_producer_cannot_reach_is_never_held_back() {
        assert_eq!(
            admit(1000, 900 * 1000, 900, Some(2 * MB), MB, false),
            Admit::Send
        );
        assert_eq!(admit(1000, 900 * 1000, 900, None, MB, false), Admit::Send);
    }

    #[test]
    fn queued_bytes_of_a_partition_stay_under_a_small_limit() {
        let limit = Some(10_000);
        // 9 records of 1000 bytes queued: one more would make a batch of 10 061 bytes.
        assert_eq!(admit(1000, 9000, 9, limit, MB, false), Admit::WaitForRoom);
        assert_eq!(admit(1000, 8000, 8, limit, MB, false), Admit::Send);
        // Nothing queued: a record that fits alone always goes.
        assert_eq!(admit(9000, 0, 0, limit, MB, false), Admit::Send);
    }

    #[test]
    fn a_record_that_may_not_fit_goes_alone_after_the_queue_drained() {
        let limit = Some(10_000);
        assert_eq!(admit(9950, 3000, 3, limit, MB, false), Admit::WaitForRoom);
        assert_eq!(admit(9950, 0, 0, limit, MB, false), Admit::Alone);
        // A record of a refused batch goes alone whatever its size.
        assert_eq!(admit(10, 0, 0, None, MB, true), Admit::Alone);
        assert_eq!(admit(10, 10, 1, None, MB, true), Admit::WaitForRoom);
    }

    #[test]
    fn wire_size_bounds_the_record_from_above() {
        assert_eq!(wire_size(0, 0, []), 36);
        assert_eq!(wire_size(3, 100, [(4, 5)]), 36 + 103 + 10 + 9);
        assert_eq!(wire_size(usize::MAX, 1, []), usize::MAX);
    }

    #[test]
    fn limits_and_caps_are_read_from_configs() {
        let entry = |name: &str, value: Option<&str>| ConfigEntry {
            name: name.into(),
            value: value.map(str::to_string),
            source: ConfigSource::Default,
            is_read_only: false,
            is_default: true,
            is_sensitive: false,
        };
        assert_eq!(
            limit_of(&[
                entry("retention.ms", Some("1")),
                entry(MAX_MESSAGE_BYTES, Some("65536"))
            ]),
            Some(65536)
        );
        assert_eq!(limit_of(&[entry(MAX_MESSAGE_BYTES, Some("lots"))]), None);
        assert_eq!(limit_of(&[entry(MAX_MESSAGE_BYTES, None)]), None);
        let limits = RemoteLimits::default();
        let configs =
            HashMap::from([("a.t".to_string(), vec![entry(MAX_MESSAGE_BYTES, Some("5"))])]);
        limits.update(&configs);
        assert_eq!((limits.get("a.t"), limits.get("a.u")), (Some(5), None));
        assert_eq!(batch_cap(Some("1000000"), Some("16777216")), MB);
        assert_eq!(batch_cap(Some("2000000"), Some("500000")), 500_000);
        assert_eq!(batch_cap(None, Some("x")), MB);
    }
}
