//! The verifier's reads: a few records of one partition from an offset, `read_committed`, with
//! the project's own connections ([`mirrorflow_conn`]) and batch decoder
//! ([`mirrorflow_core::batch::records`]) rather than librdkafka, which inflates a compressed
//! batch without a limit (see [`crate::status::tails`]).
//!
//! Whoever writes the topics chooses what is read, so every read is bounded before it is
//! allocated: an answer frame at most [`MAX_FRAME`] bytes, a batch's records at most
//! [`BATCH_CAP`] bytes once inflated, at most [`MAX_ROUNDS`] fetches per read. A batch past a
//! bound is [`ReadFailure::TooLarge`] ("cannot verify: too large"), never an allocation.

use mirrorflow_conn::fetcher::{Fetched, Trouble};
use mirrorflow_conn::{Cluster, FetchLimits, Fetcher, Options, Security};
use mirrorflow_core::batch::{self, records};
use mirrorflow_core::protocol::list_offsets::{EARLIEST, LATEST};
use mirrorflow_core::protocol::{ErrorCode, Isolation};
use std::time::Duration;

use crate::verify::judge::{Seen, fingerprint};

/// The largest fetch answer read (a broker returns the first batch of a fetch whole).
pub const MAX_FRAME: usize = 4 << 20;
/// The most bytes a batch's records may inflate to.
pub const BATCH_CAP: usize = 8 << 20;
/// Fetches per read: records between the first offset and the ones wanted that take more
/// than this many answers leave the read short (the verdict then says so).
pub const MAX_ROUNDS: usize = 4;
const LIMITS: FetchLimits = FetchLimits {
    max_bytes: 1 << 20,
    partition_max_bytes: 1 << 20,
    // Answer at once: a verification never waits for records to come.
    max_wait: Duration::ZERO,
};
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a read has no records to give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFailure {
    TooLarge,
    Corrupt,
    /// The cluster did not answer, or refused the read.
    Unreadable,
}

/// Records read from one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Window {
    /// Where the read started (the offset asked for, or the log's start when that is later).
    pub from: i64,
    /// The records read, in offset order (fingerprints of key, value and headers).
    pub records: Vec<Seen>,
    /// The read reached the partition's end (as a `read_committed` consumer sees it).
    pub to_end: bool,
}

/// What to read: from `from` on, until `wanted` records at or after `past` (or the end).
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub from: i64,
    pub past: i64,
    pub wanted: usize,
}

/// The reads of one cluster, with the flow's own principal.
pub struct Reader {
    bootstrap: String,
    security: Security,
    client_id: String,
    fetcher: Option<Fetcher>,
}

impl Reader {
    pub fn new(bootstrap: &str, security: Security, client_id: String) -> Self {
        Reader {
            bootstrap: bootstrap.to_owned(),
            security,
            client_id,
            fetcher: None,
        }
    }

    fn fetcher(&mut self) -> Result<&mut Fetcher, ReadFailure> {
        if self.fetcher.is_none() {
            let options = Options {
                client_id: self.client_id.clone(),
                timeout: IO_TIMEOUT,
                max_frame: MAX_FRAME,
                // Replicators run in the flow's namespace; their egress is the NetworkPolicy's.
                address_check: None,
            };
            let cluster = Cluster::new(&self.bootstrap, self.security.clone(), options)
                .map_err(|_| ReadFailure::Unreadable)?;
            self.fetcher = Some(Fetcher::new(cluster, LIMITS));
        }
        self.fetcher.as_mut().ok_or(ReadFailure::Unreadable)
    }

    /// The partition's first offset and its end as a `read_committed` reader sees it.
    fn bounds(&mut self, topic: &str, partition: i32) -> Result<(i64, i64), ReadFailure> {
        let cluster = self.fetcher()?.cluster_mut();
        let metadata = cluster
            .metadata(&[topic])
            .map_err(|_| ReadFailure::Unreadable)?;
        let t = metadata
            .topics
            .iter()
            .find(|t| t.name == topic && !t.error.is_error())
            .ok_or(ReadFailure::Unreadable)?;
        let mut offset = |at: i64| -> Result<i64, ReadFailure> {
            let listed = cluster
                .list_offsets(t, &[(partition, at)], Isolation::ReadCommitted)
                .map_err(|_| ReadFailure::Unreadable)?;
            match listed.as_slice() {
                [l] if !l.error.is_error() && l.offset >= 0 => Ok(l.offset),
                _ => Err(ReadFailure::Unreadable),
            }
        };
        Ok((offset(EARLIEST)?, offset(LATEST)?))
    }

    /// Reads `span` of `topic`'s `partition`.
    pub fn read(&mut self, topic: &str, partition: i32, span: Span) -> Result<Window, ReadFailure> {
        let mut window = Window {
            from: span.from.max(0),
            ..Window::default()
        };
        let mut next = window.from;
        let outcome = (|| {
            for _ in 0..MAX_ROUNDS {
                let fetcher = self.fetcher()?;
                fetcher.assign(topic, partition, next);
                let round = fetcher.round();
                let moved = fetcher.position(topic, partition).unwrap_or(next);
                if let Some(trouble) = round
                    .troubles
                    .iter()
                    .find(|t| t.partition == partition && t.topic.as_ref() == topic)
                {
                    match &trouble.trouble {
                        Trouble::Broker(ErrorCode::OFFSET_OUT_OF_RANGE) => {
                            let (low, high) = self.bounds(topic, partition)?;
                            if next >= high {
                                window.to_end = true;
                                return Ok(());
                            }
                            // Retention removed the records before `low`.
                            next = next.max(low);
                            window.from = window.from.max(low);
                            continue;
                        }
                        Trouble::FrameTooLarge { .. } | Trouble::BatchTooLarge { .. } => {
                            return Err(ReadFailure::TooLarge);
                        }
                        Trouble::Records(_) => return Err(ReadFailure::Corrupt),
                        // Leaders moving: the next round asks for metadata again.
                        Trouble::NoLeader => continue,
                        Trouble::Broker(e) if e.is_retriable() => continue,
                        Trouble::Broker(_) => return Err(ReadFailure::Unreadable),
                    }
                }
                let fetched: Vec<&Fetched> = round
                    .fetched
                    .iter()
                    .filter(|f| f.partition == partition && f.topic.as_ref() == topic)
                    .collect();
                if fetched.is_empty() {
                    if moved > next {
                        // Past aborted batches or markers only: go on from there.
                        next = moved;
                        continue;
                    }
                    // Nothing at `next`: the end.
                    window.to_end = round.failure.is_none();
                    return if window.to_end {
                        Ok(())
                    } else {
                        Err(ReadFailure::Unreadable)
                    };
                }
                for f in fetched {
                    if take(&mut window, f, span)? {
                        return Ok(());
                    }
                    window.to_end = f.next_offset >= f.last_stable_offset;
                    next = f.next_offset;
                }
                if window.to_end {
                    return Ok(());
                }
            }
            Ok(())
        })();
        // Nothing stays assigned between verifications.
        if let Some(f) = self.fetcher.as_mut() {
            f.unassign(topic, partition);
        }
        outcome.map(|()| window)
    }
}

/// Adds the records of `f` at or after `window.from`; true once `span.wanted` records at or
/// after `span.past` are in (the read is done).
fn take(window: &mut Window, f: &Fetched, span: Span) -> Result<bool, ReadFailure> {
    for range in &f.batches {
        let Some(bytes) = f.body.get(range.clone()) else {
            continue;
        };
        for b in batch::batches(bytes) {
            let b = b.map_err(|_| ReadFailure::Corrupt)?;
            if b.header.next_offset() <= window.from {
                continue;
            }
            let opened = records::open(&b, BATCH_CAP).map_err(|e| match e {
                records::RecordsError::BatchTooLarge { .. } => ReadFailure::TooLarge,
                _ => ReadFailure::Corrupt,
            })?;
            for r in opened.records() {
                let r = r.map_err(|_| ReadFailure::Corrupt)?;
                if r.offset < window.from
                    || window.records.last().is_some_and(|(o, _)| *o >= r.offset)
                {
                    continue;
                }
                let headers: Vec<(&[u8], Option<&[u8]>)> =
                    r.headers.iter().map(|h| (h.key, h.value)).collect();
                window
                    .records
                    .push((r.offset, fingerprint(r.key, r.value, None, &headers)));
                let before = window.records.partition_point(|(o, _)| *o < span.past);
                if window.records.len().saturating_sub(before) >= span.wanted {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}
