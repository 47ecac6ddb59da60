//! Small batches merged before they are written.
//!
//! A produce request carries one batch per partition, and the target broker pays for every
//! batch it appends (its log, indexes and producer state), whatever its size. A partition
//! with little traffic (many partitions, each producer's linger ending before its batch fills)
//! holds many small batches, and a copy that writes them as they are costs the target a
//! request slot and an append for each. Over 2,000 partitions whose batches were about 11 KB
//! (33 JSON records in lz4), whole batches copied at a quarter to a half of the rate of copying records,
//! held back by the target's answers; merged, the same copy took 9.1 s from start to the last
//! record where copying records took 16.1 s, at half its CPU
//! (`bench/results/2026-12-07-batches-merging`). So a fetched partition's run of small
//! batches whose offsets follow each other is written as few batches as the target takes
//! ([`batch::rewrite::merge`]): their records inflated, once, and compressed again in the
//! first batch's codec. Offset syncs stay exact: a merged batch of `n` records written at
//! target offset `t` stands for the run's source offsets at `t..t + n`, as a batch written as
//! it is does. Large batches are never touched (copying them unopened is what whole batches
//! save).
//!
//! Merging is a saving, never a condition of the copy: a run that cannot be merged (records
//! that do not decode, a record the limit cannot hold, inflation past what a run or a round
//! may use) is written batch by batch as before, where the same cause, if any, gets its
//! answer.

use std::ops::Range;
use std::sync::Arc;

use mirrorflow_core::batch::rewrite::merge;
use mirrorflow_core::batch::{self, Batch};

use super::prepare::{DEFAULT_MAX_MESSAGE_BYTES, Ready, Target, Token, written_anew};

/// A batch is small, and merged with the small batches that follow it, when it holds fewer
/// than [`SMALL_BATCH_RECORDS`] records in fewer than [`SMALL_BATCH`] bytes on the wire: its
/// producer sent it because its linger ended, not because it filled. Both bounds, because
/// merging costs what re-encoding the records costs: a zstd batch of 300 records in 60 KB
/// (what a busy producer writes) is large, and merging such batches raised the zstd copy's CPU
/// from 0.8 to 5.9 s per GB (the project's zstd encoder is slower than the producer's and
/// compresses less); over 2,000 partitions of 11 KB batches of 33 records, merging took the
/// copy from a third of the records copy's rate to faster than it, at no measurable CPU
/// (`bench/results/2026-12-07-batches-merging`).
pub const SMALL_BATCH: usize = 64 << 10;
/// See [`SMALL_BATCH`].
pub const SMALL_BATCH_RECORDS: i32 = 128;
/// The most records' bytes (uncompressed) one merged batch holds, under the remote topic's
/// `max.message.bytes` too: large enough that a request per batch costs nothing that matters.
const MERGED_BATCH: usize = 1 << 20;
/// The most wire bytes of one run: a run's output is about this much, and written as it is
/// filled.
const RUN_BYTES: usize = 1 << 20;
/// How far one run's records may inflate; a run past it is written as it is.
const RUN_INFLATE_LIMIT: usize = 8 << 20;
/// How far all the runs of one fetched round may inflate together: a round of small hostile
/// batches (each a compression bomb) costs at most this much inflating, then goes as it is.
pub const ROUND_INFLATE_LIMIT: usize = 64 << 20;

/// How a partition's fetched batches are written: one as it comes ([`super::prepare`]), or a
/// run of small batches merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit {
    One(Range<usize>),
    Run(Vec<Range<usize>>),
}

/// A partition's fetched batches (`ranges` of `body`, in offset order) as the units they are
/// written in: runs of at least two small batches whose offsets follow each other, at or past
/// `position` (a batch holding records before it is written as it is, as always), and every
/// other batch alone.
pub fn plan(body: &[u8], ranges: &[Range<usize>], position: i64) -> Vec<Unit> {
    let mut units = Vec::new();
    let mut run: Vec<Range<usize>> = Vec::new();
    let mut run_bytes = 0_usize;
    let mut next: Option<i64> = None;
    for range in ranges {
        let header = body
            .get(range.clone())
            .and_then(|r| batch::batches(r).next())
            .and_then(Result::ok)
            .map(|b| b.header)
            .filter(|h| {
                range.len() < SMALL_BATCH
                    && h.record_count < SMALL_BATCH_RECORDS
                    && h.whole().is_ok()
                    && !h.is_control()
                    && h.base_offset >= position
            });
        let joins = header.is_some_and(|h| {
            next == Some(h.base_offset) && run_bytes.saturating_add(range.len()) <= RUN_BYTES
        });
        if !joins {
            close(&mut run, &mut units);
            run_bytes = 0;
        }
        match header {
            Some(h) => {
                run.push(range.clone());
                run_bytes = run_bytes.saturating_add(range.len());
                next = Some(h.next_offset());
            }
            None => {
                units.push(Unit::One(range.clone()));
                next = None;
            }
        }
    }
    close(&mut run, &mut units);
    units
}

/// Ends a run: two or more batches are merged, one is written as it is.
fn close(run: &mut Vec<Range<usize>>, units: &mut Vec<Unit>) {
    match run.len() {
        0 => {}
        1 => units.extend(run.drain(..).map(Unit::One)),
        _ => units.push(Unit::Run(std::mem::take(run))),
    }
}

/// A run's batches merged, each output batch its own token like `like`; `None` when they cannot
/// be (the caller writes them one by one). What the records inflated to is taken from `budget`
/// (all of the run's limit when merging failed).
pub fn merge_run(
    body: &Arc<Vec<u8>>,
    run: &[Range<usize>],
    target: &Target<'_>,
    like: Token,
    budget: &mut usize,
) -> Option<Vec<Ready>> {
    let limit = RUN_INFLATE_LIMIT.min(*budget);
    if limit == 0 {
        return None;
    }
    let batches: Vec<Batch<'_>> = (run.iter())
        .map(|r| {
            body.get(r.clone())
                .and_then(|b| batch::batches(b).next()?.ok())
        })
        .collect::<Option<_>>()?;
    let max_bytes = (target.max_bytes)
        .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES)
        .min(MERGED_BATCH);
    let Ok(merged) = merge(&batches, limit, max_bytes) else {
        *budget = budget.saturating_sub(limit);
        return None;
    };
    *budget = budget.saturating_sub(merged.inflated);
    let max_timestamp = (batches.iter())
        .map(|b| b.header.max_timestamp)
        .max()
        .unwrap_or(-1);
    let ready = (merged.batches.into_iter())
        .map(|r| written_anew(r, max_timestamp, like))
        .collect();
    Some(ready)
}

#[cfg(test)]
mod tests;
