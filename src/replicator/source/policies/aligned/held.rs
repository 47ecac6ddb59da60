//! What an aligned partition holds back: a transaction planned and not written yet, with the
//! records read after it ([`Pending`], bounded by [`BACKLOG_RECORDS`] and [`BACKLOG_BYTES`]),
//! and the records the copy keeps past the poll that returned them ([`Hold`]).

use std::collections::VecDeque;

use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, OwnedMessage};

use super::plan::Step;
use crate::replicator::source::engine::send::CopyHeaders;

/// The most records a partition queues behind its waiting transaction.
pub(super) const BACKLOG_RECORDS: usize = 4096;
/// The most bytes (keys and values) a partition queues behind its waiting transaction.
pub(super) const BACKLOG_BYTES: usize = 8 << 20;
/// A transaction planned for a partition and not written yet, with what was read for the
/// partition since (copied after it, in order).
pub(super) struct Pending {
    pub(super) step: Step,
    /// The record a [`Step::Wrapped`] commits.
    pub(super) held: Option<OwnedMessage>,
    /// The fillers' timestamp.
    pub(super) timestamp: Option<i64>,
    pub(super) backlog: VecDeque<OwnedMessage>,
    pub(super) backlog_bytes: usize,
}

impl Pending {
    pub(super) fn new(step: Step, held: Option<OwnedMessage>, timestamp: Option<i64>) -> Self {
        Pending {
            step,
            held,
            timestamp,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
        }
    }

    /// Queues a record read after the transaction; true once the queue is full.
    pub(super) fn queue(&mut self, m: OwnedMessage) -> bool {
        self.backlog_bytes = self.backlog_bytes.saturating_add(size(&m));
        self.backlog.push_back(m);
        self.full()
    }

    fn full(&self) -> bool {
        self.backlog.len() >= BACKLOG_RECORDS || self.backlog_bytes >= BACKLOG_BYTES
    }

    /// Every record it keeps, in source order: the one it wraps, then those read after.
    pub(super) fn into_records(self) -> impl Iterator<Item = OwnedMessage> {
        self.held.into_iter().chain(self.backlog)
    }
}

/// A record's keys and values, as the bounds count them.
pub(super) fn size(m: &OwnedMessage) -> usize {
    m.key()
        .map_or(0, <[u8]>::len)
        .saturating_add(m.payload().map_or(0, <[u8]>::len))
}

/// A record the copy can keep past the poll that returned it.
pub(super) trait Hold: Message<Headers: CopyHeaders> {
    fn hold(&self) -> OwnedMessage;
}

impl Hold for BorrowedMessage<'_> {
    fn hold(&self) -> OwnedMessage {
        self.detach()
    }
}

impl Hold for OwnedMessage {
    fn hold(&self) -> OwnedMessage {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, bytes: usize) -> OwnedMessage {
        OwnedMessage::new(
            Some(vec![0; bytes]),
            None,
            "t".into(),
            rdkafka::Timestamp::NotAvailable,
            0,
            offset,
            None,
        )
    }

    #[test]
    fn a_queue_is_full_at_its_count_or_its_bytes_and_keeps_source_order() {
        let mut pending = Pending::new(Step::Wrapped, Some(record(9, 1)), None);
        assert!(!pending.queue(record(11, 10)));
        assert!(!pending.queue(record(12, 10)));
        let order: Vec<i64> = pending.into_records().map(|m| m.offset()).collect();
        assert_eq!(
            order,
            [9, 11, 12],
            "the wrapped record first, then those read after"
        );

        let mut by_count = Pending::new(Step::Aborted(2), None, None);
        let full: Vec<bool> = (0..BACKLOG_RECORDS as i64)
            .map(|o| by_count.queue(record(o, 0)))
            .collect();
        assert_eq!(full.iter().filter(|f| **f).count(), 1);
        assert_eq!(full.last(), Some(&true));

        let mut by_bytes = Pending::new(Step::Aborted(2), None, None);
        assert!(!by_bytes.queue(record(1, BACKLOG_BYTES - 1)));
        assert!(by_bytes.queue(record(2, 1)));
    }
}
