//! Runs the fuzz targets' bodies over mirrorflow-conn (SCRAM messages, answer framing, fetch answers) over
//! their seed corpus (`fuzz/seeds/<target>/`) and simple mutations of it, then fuzzes each for
//! a bounded time with random edits, as `crates/core/tests/fuzz_corpus.rs` does for the core.

#[path = "../../../fuzz/src/conn_bodies.rs"]
mod fuzz_bodies;
#[path = "../../../fuzz/stable/runner.rs"]
mod runner;

use runner::{FuzzBody, bounded_random_fuzzing, run_with_mutations};

const DIR: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn scram_messages_corpus() {
    // Every accepted first message costs 4096 PBKDF2 rounds: flip fewer bytes.
    assert!(run_with_mutations(DIR, "scram_messages", fuzz_bodies::scram_messages, 3) > 100);
}

#[test]
fn conn_frames_corpus() {
    assert!(run_with_mutations(DIR, "conn_frames", fuzz_bodies::conn_frames, 1) > 100);
}

#[test]
fn fetcher_answers_corpus() {
    assert!(run_with_mutations(DIR, "fetcher_answers", fuzz_bodies::fetcher_answers, 1) > 100);
}

/// Every target, each for a bounded time (`MF_FUZZ_SECONDS`, default 3 s per target).
#[test]
fn bounded_random_fuzzing_of_every_target() {
    let targets: [(&str, FuzzBody); 3] = [
        ("scram_messages", fuzz_bodies::scram_messages),
        ("conn_frames", fuzz_bodies::conn_frames),
        ("fetcher_answers", fuzz_bodies::fetcher_answers),
    ];
    bounded_random_fuzzing(DIR, &targets);
}
