use std::ops::Range;
use std::sync::Arc;

use super::*;
use crate::replicator::source::policies::batches::prepare::tests::{batch, like, target, values};

const LOG_APPEND_TIME: i16 = 1 << 3;

/// A fetch answer's records: `batches` one after another, and each one's range.
fn answer(batches: &[Vec<u8>]) -> (Arc<Vec<u8>>, Vec<Range<usize>>) {
    let mut body = Vec::new();
    let mut ranges = Vec::new();
    for b in batches {
        ranges.push(body.len()..body.len() + b.len());
        body.extend_from_slice(b);
    }
    (Arc::new(body), ranges)
}

/// A batch of `n` records of 10 bytes at `base`.
fn small(base: i64, n: usize) -> Vec<u8> {
    let last = i32::try_from(n).expect("small") - 1;
    batch(base, &values(n, 10), last, 0)
}

fn kinds(units: &[Unit]) -> Vec<usize> {
    units
        .iter()
        .map(|u| match u {
            Unit::One(_) => 1,
            Unit::Run(r) => r.len() * 10,
        })
        .collect()
}

#[test]
fn small_batches_that_follow_each_other_are_one_run() {
    let (body, ranges) = answer(&[small(0, 1), small(1, 2), small(3, 1), small(4, 1)]);
    assert_eq!(
        plan(&body, &ranges, 0),
        vec![Unit::Run(ranges.clone())],
        "four batches, one run"
    );
}

#[test]
fn what_cannot_join_a_run_ends_it() {
    let large = batch(4, &values(1, SMALL_BATCH), 0, 0);
    assert!(large.len() >= SMALL_BATCH);
    let many = usize::try_from(SMALL_BATCH_RECORDS).expect("positive");
    let full = batch(14, &values(many, 1), SMALL_BATCH_RECORDS - 1, 0);
    assert!(full.len() < SMALL_BATCH, "few bytes, many records");
    let after_full = 14 + i64::from(SMALL_BATCH_RECORDS);
    let compacted = batch(8, &[(0, b"a".to_vec()), (2, b"c".to_vec())], 2, 0);
    let append_time = batch(13, &values(1, 10), 0, LOG_APPEND_TIME);
    let (body, ranges) = answer(&[
        small(0, 2),
        small(2, 2),
        large,        // too large to merge
        small(5, 1),  // alone between two that cannot join it
        compacted,    // offsets 8 and 10: not a producer's batch
        small(11, 1), // follows 10, but after a batch written alone
        small(12, 1),
        append_time,          // written anew whole
        full,                 // a producer's full batch: many records in few bytes
        small(after_full, 1), // alone after it
        small(300, 1),        // a gap (a marker, aborted records)
        small(301, 1),
    ]);
    assert_eq!(
        kinds(&plan(&body, &ranges, 0)),
        [20, 1, 1, 1, 20, 1, 1, 1, 20],
        "{:?}",
        plan(&body, &ranges, 0)
    );
}

#[test]
fn a_batch_holding_records_before_the_position_is_written_as_it_is() {
    let (body, ranges) = answer(&[small(0, 3), small(3, 1), small(4, 1), small(5, 1)]);
    // Records 0-1 were written before a restart: the first batch goes as it is.
    assert_eq!(kinds(&plan(&body, &ranges, 2)), [1, 30]);
    assert_eq!(kinds(&plan(&body, &ranges, 3)), [1, 30]);
}

#[test]
fn a_run_is_merged_into_batches_standing_for_its_offsets() {
    let (body, ranges) = answer(&[small(40, 1), small(41, 3), small(44, 2)]);
    let mut budget = ROUND_INFLATE_LIMIT;
    let ready = merge_run(
        &body,
        &ranges,
        &target(Some(1 << 20), 40),
        like(),
        &mut budget,
    )
    .expect("merged");
    assert_eq!(ready.len(), 1);
    let t = ready[0].token;
    assert_eq!((t.idx, t.generation), (3, 7), "the slot's token");
    assert_eq!((t.base, t.records, t.max_timestamp), (40, 6, 2_000));
    assert_eq!(t.bytes, u64::try_from(ready[0].range.len()).expect("small"));
    let written = ready[0]
        .body
        .get(ready[0].range.clone())
        .expect("its bytes");
    let b = batch::batches(written)
        .next()
        .expect("a batch")
        .expect("well formed");
    assert_eq!((b.header.record_count, b.header.whole()), (6, Ok(())));
    assert!(
        budget < ROUND_INFLATE_LIMIT && budget > ROUND_INFLATE_LIMIT - 1_000,
        "what the records inflated to is spent: {budget}"
    );
}

#[test]
fn a_run_that_cannot_be_merged_is_left_to_be_written_as_it_is() {
    let mut corrupt = small(1, 1);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff; // its CRC no longer holds
    let (body, ranges) = answer(&[small(0, 1), corrupt]);
    let mut budget = ROUND_INFLATE_LIMIT;
    assert!(merge_run(&body, &ranges, &target(None, 0), like(), &mut budget).is_none());
    assert_eq!(
        budget,
        ROUND_INFLATE_LIMIT - RUN_INFLATE_LIMIT,
        "a failed run costs all it could have"
    );

    let (body, ranges) = answer(&[small(0, 1), small(1, 1)]);
    let mut spent = 0;
    assert!(
        merge_run(&body, &ranges, &target(None, 0), like(), &mut spent).is_none(),
        "nothing left of the round's budget"
    );
}
