//! What one fetched batch becomes before the writer takes it: the batch as it is, or, when the
//! target could not take it as it is, the batches [`batch::rewrite`] makes of it, so no topic
//! stops the copy for the shape of its batches:
//!
//! - compaction left gaps in its offsets (a produce request's batch may have none): one batch
//!   per run of contiguous offsets, each acknowledging exactly its run, so offset syncs stay
//!   exact (a jump between runs changes the delta, and the sync policy writes a sync there);
//! - the source broker stamped it with its append time: the same records, each with that time,
//!   as CreateTime (what the source's readers saw);
//! - it is larger than the remote topic's `max.message.bytes`: split under it;
//! - it holds the partition's position past its first record (a position stored by a copy of
//!   records, or by a MirrorMaker 2 taken over): its records from the position on, so a copy
//!   resuming there copies none of them twice.
//!
//! A batch whose records cannot be written at all (one record alone over the limit, records
//! that do not decode or inflate past [`REWRITE_INFLATE_LIMIT`]) stops its partition with the
//! reason, named to the operator like every stop.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use mirrorflow_core::batch::rewrite::{
    Refused, RewriteError, Rewritten, rewrite_range_before_refusal,
};
use mirrorflow_core::batch::{self, Batch, NotWhole};

/// What the writer carries for each batch.
#[derive(Debug, Clone, Copy)]
pub struct Token {
    pub(super) idx: usize,
    pub(super) generation: u32,
    /// The source offset of its first record.
    pub(super) base: i64,
    pub(super) records: i64,
    pub(super) bytes: u64,
    pub(super) max_timestamp: i64,
    pub(super) read_at: Instant,
}

/// A partition that cannot go on as it is.
#[derive(Debug, PartialEq)]
pub struct Stop {
    pub(super) offset: i64,
    pub(super) message: String,
}

/// How far one batch's records may inflate to be written anew: one batch at a time is, so a
/// replica holds at most about twice this for it. The same bound as librdkafka's reads of
/// records have in this process.
pub const REWRITE_INFLATE_LIMIT: usize = mirrorflow_rdkafka_ext::inflater::INFLATE_LIMIT;
/// A remote topic's `max.message.bytes` before discovery has read it: Kafka's default.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1_048_588;

/// Why a batch was written anew, as the `reason` of `batches_rewritten_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Compacted,
    LogAppendTime,
    TooLarge,
    /// One of a run of small batches merged ([`super::merge`]).
    Merged,
    /// The partition's position is inside it: the records before it are on the target.
    Resumed,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::Compacted => "compacted",
            Reason::LogAppendTime => "log_append_time",
            Reason::TooLarge => "too_large",
            Reason::Merged => "merged",
            Reason::Resumed => "resumed",
        }
    }
}

/// One batch to hand to the writer: its bytes and what it stands for.
#[derive(Debug)]
pub struct Ready {
    pub body: Arc<Vec<u8>>,
    pub range: Range<usize>,
    pub token: Token,
}

/// What a fetched batch becomes.
#[derive(Debug)]
pub enum Prepared {
    /// Written as fetched, or as the batches it was rewritten into (`Some(reason)`), in
    /// offset order, of its records at or after `position` (copied before a restart).
    Write(Vec<Ready>, Option<Reason>),
    /// The batches of its records before the one that stops the partition (written anew), and
    /// the stop.
    Stop(Vec<Ready>, Stop),
}

/// The partition a batch is prepared for.
pub struct Target<'a> {
    pub topic: &'a str,
    pub partition: i32,
    /// The remote topic's `max.message.bytes`, once known.
    pub max_bytes: Option<usize>,
    /// Where the partition's copy stands: records before it are on the target already.
    pub position: i64,
}

/// Prepares the batch at `range` of a fetch answer's `body` for `target`; `like` gives its
/// tokens their slot, generation and read time.
pub fn prepare(
    body: &Arc<Vec<u8>>,
    range: Range<usize>,
    target: &Target<'_>,
    like: Token,
) -> Prepared {
    let Some(Ok(b)) = body
        .get(range.clone())
        .and_then(|r| batch::batches(r).next())
    else {
        // The fetcher parsed it already, so this is not expected; skipping it would carry the
        // position over its records.
        return Prepared::Stop(
            Vec::new(),
            Stop {
                offset: target.position,
                message: format!(
                    "a batch of {}-{} after offset {} could not be read again after it was fetched; the partition is stopped rather than skip it",
                    target.topic, target.partition, target.position
                ),
            },
        );
    };
    let max_bytes = target.max_bytes.unwrap_or(DEFAULT_MAX_MESSAGE_BYTES);
    let h = &b.header;
    let holds_position = h.base_offset < target.position && target.position <= h.last_offset();
    let reason = match h.whole() {
        Err(NotWhole::OffsetGaps) => Some(Reason::Compacted),
        Err(NotWhole::LogAppendTime) => Some(Reason::LogAppendTime),
        Ok(()) if range.len() > max_bytes => Some(Reason::TooLarge),
        Ok(()) if holds_position => Some(Reason::Resumed),
        Ok(()) => None,
    };
    let Some(reason) = reason else {
        let token = Token {
            base: b.header.base_offset,
            records: i64::from(b.header.last_offset_delta).saturating_add(1),
            bytes: u64::try_from(range.len()).unwrap_or(u64::MAX),
            max_timestamp: b.header.max_timestamp,
            ..like
        };
        let ready = Ready {
            body: body.clone(),
            range,
            token,
        };
        return Prepared::Write(vec![ready], None);
    };
    let from = target.position;
    match rewrite_range_before_refusal(&b, from..i64::MAX, REWRITE_INFLATE_LIMIT, max_bytes) {
        Ok(batches) => Prepared::Write(rewritten(&b, batches, like), Some(reason)),
        // The records before the one no batch can hold are written: the partition stops at
        // that record, not at its batch.
        Err(Refused {
            error: e @ RewriteError::RecordTooLarge { offset, .. },
            before,
        }) => Prepared::Stop(
            rewritten(&b, before, like),
            cannot_rewrite(&b, offset.max(from), target, reason, &e),
        ),
        Err(Refused { error, .. }) => {
            Prepared::Stop(Vec::new(), cannot_rewrite(&b, from, target, reason, &error))
        }
    }
}

/// The rewritten batches, each its own token.
fn rewritten(b: &Batch<'_>, batches: Vec<Rewritten>, like: Token) -> Vec<Ready> {
    (batches.into_iter())
        .map(|r| written_anew(r, b.header.max_timestamp, like))
        .collect()
}

/// A batch written anew, its token like `like` standing for its source offsets.
pub fn written_anew(r: Rewritten, max_timestamp: i64, like: Token) -> Ready {
    let token = Token {
        base: r.base_offset,
        records: i64::from(r.record_count),
        bytes: u64::try_from(r.bytes.len()).unwrap_or(u64::MAX),
        max_timestamp,
        ..like
    };
    let range = 0..r.bytes.len();
    Ready {
        body: Arc::new(r.bytes),
        range,
        token,
    }
}

/// The stop at `offset` (the record no batch holds, or where the batch's copy resumes) of a
/// batch that cannot be written, with what the flow's owner can do.
fn cannot_rewrite(
    b: &Batch<'_>,
    offset: i64,
    target: &Target<'_>,
    reason: Reason,
    e: &RewriteError,
) -> Stop {
    let at = format!(
        "the batch at offset {} of {}-{}",
        b.header.base_offset, target.topic, target.partition
    );
    let message = match e {
        RewriteError::RecordTooLarge { .. } => format!(
            "{at} holds a record the target refuses ({e}); raise max.message.bytes of the remote topic on the target (or the target brokers' message.max.bytes), or copy this topic with spec.sourceLoop.copy: Records, which skips such a record and records the gap"
        ),
        _ => format!(
            "{at} had to be written anew ({}) and could not be: {e}; copy this topic with spec.sourceLoop.copy: Records, or exclude it with spec.topicsExclude",
            reason.label()
        ),
    };
    Stop {
        offset: offset.max(b.header.base_offset),
        message,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Instant;

    use super::*;

    const LOG_APPEND_TIME: i16 = 1 << 3;

    fn varint(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z >= 0x80 {
            out.push((z as u8) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }

    /// An uncompressed record batch (magic 2) at `base` holding `records` as (offset delta,
    /// value), whose last offset delta is `last_delta` (more than the last record's when
    /// compaction removed records at its end).
    pub(in super::super) fn batch(
        base: i64,
        records: &[(i32, Vec<u8>)],
        last_delta: i32,
        attributes: i16,
    ) -> Vec<u8> {
        let mut body = Vec::new();
        for (delta, value) in records {
            let mut r = vec![0u8];
            varint(&mut r, 0);
            varint(&mut r, i64::from(*delta));
            varint(&mut r, -1);
            varint(&mut r, i64::try_from(value.len()).unwrap());
            r.extend_from_slice(value);
            varint(&mut r, 0);
            varint(&mut body, i64::try_from(r.len()).unwrap());
            body.extend(r);
        }
        let mut after_crc = Vec::new();
        after_crc.extend(attributes.to_be_bytes());
        after_crc.extend(last_delta.to_be_bytes());
        after_crc.extend(1_000_i64.to_be_bytes());
        after_crc.extend(2_000_i64.to_be_bytes());
        after_crc.extend((-1_i64).to_be_bytes());
        after_crc.extend((-1_i16).to_be_bytes());
        after_crc.extend((-1_i32).to_be_bytes());
        after_crc.extend(i32::try_from(records.len()).unwrap().to_be_bytes());
        after_crc.extend(body);
        let mut b = Vec::new();
        b.extend(base.to_be_bytes());
        b.extend(i32::try_from(after_crc.len() + 9).unwrap().to_be_bytes());
        b.extend(0_i32.to_be_bytes());
        b.push(2);
        b.extend(crc32c::crc32c(&after_crc).to_be_bytes());
        b.extend(after_crc);
        b
    }

    pub(in super::super) fn like() -> Token {
        Token {
            idx: 3,
            generation: 7,
            base: -1,
            records: 0,
            bytes: 0,
            max_timestamp: -1,
            read_at: Instant::now(),
        }
    }

    pub(in super::super) fn target(max_bytes: Option<usize>, position: i64) -> Target<'static> {
        Target {
            topic: "t",
            partition: 0,
            max_bytes,
            position,
        }
    }

    /// (base, records) of each batch to write, and why they were rewritten.
    fn written(p: Prepared) -> (Vec<(i64, i64)>, Option<Reason>) {
        match p {
            Prepared::Write(ready, reason) => {
                for r in &ready {
                    assert_eq!(
                        (r.token.idx, r.token.generation),
                        (3, 7),
                        "the slot's token"
                    );
                    assert!(r.body.get(r.range.clone()).is_some(), "a range of its body");
                }
                let runs = ready
                    .iter()
                    .map(|r| (r.token.base, r.token.records))
                    .collect();
                (runs, reason)
            }
            Prepared::Stop(_, s) => panic!("stopped: {}", s.message),
        }
    }

    pub(in super::super) fn values(n: usize, len: usize) -> Vec<(i32, Vec<u8>)> {
        (0..n)
            .map(|i| (i32::try_from(i).unwrap(), vec![b'v'; len]))
            .collect()
    }

    #[test]
    fn a_batch_the_target_takes_is_written_as_it_is() {
        let body = Arc::new(batch(40, &values(3, 10), 2, 0));
        let range = 0..body.len();
        let p = prepare(&body, range.clone(), &target(Some(1 << 20), 40), like());
        let Prepared::Write(ready, None) = p else {
            panic!("not written as it is: {p:?}");
        };
        assert_eq!(ready.len(), 1);
        assert!(
            Arc::ptr_eq(&ready[0].body, &body),
            "the fetched bytes, not a copy"
        );
        assert_eq!(ready[0].range, range);
        let t = ready[0].token;
        assert_eq!((t.base, t.records, t.max_timestamp), (40, 3, 2_000));
        assert_eq!(t.bytes, u64::try_from(body.len()).unwrap());
    }

    #[test]
    fn a_compacted_batch_is_one_batch_per_run_of_offsets() {
        let kept = vec![
            (0, b"a".to_vec()),
            (1, b"b".to_vec()),
            (2, b"c".to_vec()),
            (5, b"f".to_vec()),
        ];
        let body = Arc::new(batch(100, &kept, 7, 0));
        let p = prepare(&body, 0..body.len(), &target(None, 100), like());
        assert_eq!(
            written(p),
            (vec![(100, 3), (105, 1)], Some(Reason::Compacted))
        );
    }

    #[test]
    fn runs_wholly_before_the_position_are_left_out() {
        let kept = vec![(0, b"a".to_vec()), (1, b"b".to_vec()), (4, b"e".to_vec())];
        let body = Arc::new(batch(100, &kept, 4, 0));
        let p = prepare(&body, 0..body.len(), &target(None, 102), like());
        assert_eq!(written(p), (vec![(104, 1)], Some(Reason::Compacted)));
    }

    #[test]
    fn a_batch_holding_the_position_is_written_from_it() {
        let body = Arc::new(batch(200, &values(6, 10), 5, 0));
        let p = prepare(&body, 0..body.len(), &target(None, 203), like());
        assert_eq!(written(p), (vec![(203, 3)], Some(Reason::Resumed)));
        // At its first record, or before it: as it is.
        for position in [200, 150] {
            let p = prepare(&body, 0..body.len(), &target(None, position), like());
            assert_eq!(written(p), (vec![(200, 6)], None), "position {position}");
        }
        // Any other reason to write it anew also starts at the position.
        let body = Arc::new(batch(200, &values(6, 60), 5, 0));
        let limit = 200;
        assert!(body.len() > limit);
        let p = prepare(&body, 0..body.len(), &target(Some(limit), 201), like());
        let (runs, reason) = written(p);
        assert_eq!(reason, Some(Reason::TooLarge));
        assert_eq!(runs.first().map(|r| r.0), Some(201));
        assert_eq!(runs.iter().map(|r| r.1).sum::<i64>(), 5);
    }

    #[test]
    fn a_log_append_time_batch_is_written_anew_whole() {
        let body = Arc::new(batch(9, &values(4, 8), 3, LOG_APPEND_TIME));
        let p = prepare(&body, 0..body.len(), &target(None, 0), like());
        assert_eq!(written(p), (vec![(9, 4)], Some(Reason::LogAppendTime)));
    }

    #[test]
    fn a_batch_over_the_remote_limit_is_split_under_it_in_order() {
        let body = Arc::new(batch(0, &values(20, 100), 19, 0));
        let limit = 600;
        assert!(body.len() > limit);
        let p = prepare(&body, 0..body.len(), &target(Some(limit), 0), like());
        let Prepared::Write(ready, Some(Reason::TooLarge)) = p else {
            panic!("not split: {p:?}");
        };
        assert!(ready.len() > 1, "split");
        let mut next = 0;
        for r in &ready {
            assert!(
                r.range.len() <= limit,
                "{} bytes over {limit}",
                r.range.len()
            );
            assert_eq!(r.token.base, next, "contiguous, in order");
            next += r.token.records;
        }
        assert_eq!(next, 20, "every record");
    }

    #[test]
    fn a_record_no_batch_of_the_target_can_hold_stops_the_partition_with_the_fix() {
        let body = Arc::new(batch(50, &values(2, 2_000), 1, 0));
        let p = prepare(&body, 0..body.len(), &target(Some(1_000), 50), like());
        let Prepared::Stop(before, stop) = p else {
            panic!("not stopped: {p:?}");
        };
        assert!(before.is_empty(), "the first record is the one");
        assert_eq!(stop.offset, 50);
        assert!(
            stop.message.contains("t-0") && stop.message.contains("max.message.bytes"),
            "{}",
            stop.message
        );
        // Records before that one in its batch are written; the stop is at the record.
        let mut records = values(3, 100);
        records.push((3, vec![b'x'; 2_000]));
        records.extend(values(2, 100).into_iter().map(|(d, v)| (d + 4, v)));
        let body = Arc::new(batch(60, &records, 5, 0));
        let p = prepare(&body, 0..body.len(), &target(Some(1_000), 61), like());
        let Prepared::Stop(before, stop) = p else {
            panic!("not stopped: {p:?}");
        };
        let runs: Vec<(i64, i64)> = before
            .iter()
            .map(|r| (r.token.base, r.token.records))
            .collect();
        assert_eq!(runs, [(61, 2)], "from the position to the record");
        assert_eq!(stop.offset, 63);
    }

    #[test]
    fn bytes_that_are_no_batch_stop_the_partition_rather_than_skip() {
        let body = Arc::new(vec![0u8; 10]);
        let p = prepare(&body, 0..10, &target(None, 77), like());
        let Prepared::Stop(_, stop) = p else {
            panic!("not stopped: {p:?}");
        };
        assert_eq!(stop.offset, 77);
    }
}
