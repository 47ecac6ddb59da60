//! Runs every fuzz target's body over its seed corpus (`fuzz/seeds/<target>/`) and simple
//! mutations of it, so CI exercises the fuzz invariants without nightly or libFuzzer.

#[path = "../fuzz/src/lib.rs"]
mod fuzz_bodies;

use std::path::Path;

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("readable corpus entry").path();
            std::fs::read(&path).unwrap_or_else(|e| panic!("seed {}: {e}", path.display()))
        })
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// Each seed, every prefix of it, and every `stride`-th byte flipped to a few values.
fn run_with_mutations(target: &str, body: fn(&[u8]), stride: usize) -> usize {
    let mut runs = 0;
    for seed in seeds(target) {
        for len in 0..=seed.len() {
            body(&seed[..len]);
            runs += 1;
        }
        for i in (0..seed.len()).step_by(stride) {
            for byte in [0x00, 0x01, 0x7f, 0x80, 0xff, seed[i] ^ 0x20] {
                let mut mutated = seed.clone();
                mutated[i] = byte;
                body(&mutated);
                runs += 1;
            }
        }
    }
    runs
}

#[test]
fn decode_checkpoint_corpus() {
    assert!(run_with_mutations("decode_checkpoint", fuzz_bodies::decode_checkpoint, 1) > 100);
}

#[test]
fn decode_heartbeat_corpus() {
    assert!(run_with_mutations("decode_heartbeat", fuzz_bodies::decode_heartbeat, 1) > 50);
}

#[test]
fn decode_offset_sync_corpus() {
    assert!(run_with_mutations("decode_offset_sync", fuzz_bodies::decode_offset_sync, 1) > 50);
}

#[test]
fn policy_filter_corpus() {
    // Compiling regexes is slow in debug builds: flip fewer bytes.
    assert!(run_with_mutations("policy_filter", fuzz_bodies::policy_filter, 5) > 100);
}
