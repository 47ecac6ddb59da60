//! The verifier's reads: a few records of one partition from an offset, `read_committed`, with
//! the project's own connections ([`mirrorflow_conn`]) and batch decoder
//! ([`mirrorflow_core::batch::records`]) rather than librdkafka, which inflates a compressed
//! batch without a limit (see [`crate::status::tails`]).
//!
//! Whoever writes the topics chooses what is read, so every read is bounded before it is
//! allocated: an answer frame at most [`MAX_FRAME`] bytes, a batch's records at most
//! [`BATCH_CAP`] bytes once inflated, at most [`MAX_ROUNDS`] fetches per read. A batch past a
//! bound is [`ReadFailure::TooLarge`] ("cannot verify: too large"), never an allocation.
//!
//! What a read costs the cluster is bounded too: its first fetch asks for [`FIRST_FETCH`]
//! bytes, each further one twice as many up to [`LAST_FETCH`], and it stops once its answers
//! hold [`READ_BUDGET`] bytes. A broker returns the batch at the offset whole, whatever the
//! fetch asks, so a read costs at least that batch; past it, a few records of 1 KiB cost one
//! fetch of 64 KiB, not 1 MiB. At most `READ_BUDGET + MAX_FRAME` bytes a read.

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
/// The bytes the first fetch of a read asks for.
pub const FIRST_FETCH: i32 = 64 << 10;
/// The most bytes a fetch of a read asks for (each one twice the one before).
pub const LAST_FETCH: i32 = 1 << 20;
/// A read stops once its answers hold this many bytes (the verdict then says it was short).
pub const READ_BUDGET: u64 = 4 << 20;

/// The bounds of a read's fetch number `round` (from 0).
fn limits(round: usize) -> FetchLimits {
    let shift = u32::try_from(round).unwrap_or(u32::MAX).min(8);
    let bytes = FIRST_FETCH
        .checked_mul(1 << shift)
        .unwrap_or(LAST_FETCH)
        .min(LAST_FETCH);
    FetchLimits {
        max_bytes: bytes,
        partition_max_bytes: bytes,
        // Answer at once: a verification never waits for records to come.
        max_wait: Duration::ZERO,
    }
}
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
    /// Bytes of the fetch answers that brought records, since [`Self::take_read_bytes`].
    read_bytes: u64,
}

impl Reader {
    pub fn new(bootstrap: &str, security: Security, client_id: String) -> Self {
        Reader {
            bootstrap: bootstrap.to_owned(),
            security,
            client_id,
            fetcher: None,
            read_bytes: 0,
        }
    }

    /// The bytes read since the last call (what verification costs the cluster).
    pub fn take_read_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.read_bytes)
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
            self.fetcher = Some(Fetcher::new(cluster, limits(0)));
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
        let mut read_bytes: u64 = 0;
        let outcome = (|| {
            for n in 0..MAX_ROUNDS {
                if read_bytes >= READ_BUDGET {
                    return Ok(());
                }
                let fetcher = self.fetcher()?;
                fetcher.set_limits(limits(n));
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
                for f in &fetched {
                    let len = u64::try_from(f.body.len()).unwrap_or(u64::MAX);
                    read_bytes = read_bytes.saturating_add(len);
                }
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
        self.read_bytes = self.read_bytes.saturating_add(read_bytes);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_starts_small_and_doubles_to_its_cap() {
        let asked: Vec<i32> = (0..MAX_ROUNDS + 3).map(|n| limits(n).max_bytes).collect();
        assert_eq!(asked[..4], [64 << 10, 128 << 10, 256 << 10, 512 << 10]);
        assert!(asked.iter().all(|&b| b <= LAST_FETCH), "{asked:?}");
        assert_eq!(limits(usize::MAX).max_bytes, LAST_FETCH, "saturates");
        assert!((0..MAX_ROUNDS).all(|n| limits(n).max_bytes == limits(n).partition_max_bytes));
        // What the rounds of one read may ask for in all stays under the budget it stops at.
        let total: u64 = (0..MAX_ROUNDS)
            .map(|n| u64::try_from(limits(n).max_bytes).unwrap_or(u64::MAX))
            .sum();
        assert!(total <= READ_BUDGET, "{total}");
    }
}
