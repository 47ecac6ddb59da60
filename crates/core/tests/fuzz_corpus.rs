//! Runs every fuzz target's body over mirrorflow-core's decoders over its seed corpus
//! (`fuzz/seeds/<target>/`) and simple mutations of it, then fuzzes each for a bounded time
//! with random edits, so CI exercises the fuzz invariants without nightly or libFuzzer.

#[path = "../../../fuzz/src/core_bodies.rs"]
mod fuzz_bodies;
#[path = "../../../fuzz/stable/runner.rs"]
mod runner;

use runner::{FuzzBody, bounded_random_fuzzing, run_with_mutations};

const DIR: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn decode_checkpoint_corpus() {
    assert!(run_with_mutations(DIR, "decode_checkpoint", fuzz_bodies::decode_checkpoint, 1) > 100);
}

#[test]
fn decode_heartbeat_corpus() {
    assert!(run_with_mutations(DIR, "decode_heartbeat", fuzz_bodies::decode_heartbeat, 1) > 50);
}

#[test]
fn decode_offset_sync_corpus() {
    assert!(
        run_with_mutations(
            DIR,
            "decode_offset_sync",
            fuzz_bodies::decode_offset_sync,
            1
        ) > 50
    );
}

#[test]
fn fetched_batches_corpus() {
    assert!(run_with_mutations(DIR, "fetched_batches", fuzz_bodies::fetched_batches, 1) > 100);
}

#[test]
fn broker_answers_corpus() {
    assert!(run_with_mutations(DIR, "broker_answers", fuzz_bodies::broker_answers, 1) > 100);
}

#[test]
fn batch_records_corpus() {
    // Inflating up to the 1 MiB cap is slow in debug builds: flip fewer bytes.
    assert!(run_with_mutations(DIR, "batch_records", fuzz_bodies::batch_records, 8) > 100);
}

#[test]
fn rewritten_batches_corpus() {
    assert!(run_with_mutations(DIR, "rewritten_batches", fuzz_bodies::rewritten_batches, 4) > 100);
}

#[test]
fn positions_records_corpus() {
    assert!(run_with_mutations(DIR, "positions_records", fuzz_bodies::positions_records, 1) > 100);
}

#[test]
fn policy_filter_corpus() {
    // Compiling regexes is slow in debug builds: flip fewer bytes.
    assert!(run_with_mutations(DIR, "policy_filter", fuzz_bodies::policy_filter, 5) > 100);
}

#[test]
fn consumer_offsets_corpus() {
    assert!(run_with_mutations(DIR, "consumer_offsets", fuzz_bodies::consumer_offsets, 1) > 100);
}

#[test]
fn fetch_positions_corpus() {
    assert!(run_with_mutations(DIR, "fetch_positions", fuzz_bodies::fetch_positions, 1) > 100);
}

/// Every target, each for a bounded time (`MF_FUZZ_SECONDS`, default 3 s per target).
#[test]
fn bounded_random_fuzzing_of_every_target() {
    let targets: [(&str, FuzzBody); 11] = [
        ("decode_checkpoint", fuzz_bodies::decode_checkpoint),
        ("decode_heartbeat", fuzz_bodies::decode_heartbeat),
        ("decode_offset_sync", fuzz_bodies::decode_offset_sync),
        ("policy_filter", fuzz_bodies::policy_filter),
        ("fetched_batches", fuzz_bodies::fetched_batches),
        ("broker_answers", fuzz_bodies::broker_answers),
        ("batch_records", fuzz_bodies::batch_records),
        ("rewritten_batches", fuzz_bodies::rewritten_batches),
        ("positions_records", fuzz_bodies::positions_records),
        ("consumer_offsets", fuzz_bodies::consumer_offsets),
        ("fetch_positions", fuzz_bodies::fetch_positions),
    ];
    bounded_random_fuzzing(DIR, &targets);
}
