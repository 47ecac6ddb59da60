//! The stable runner of the fuzz targets' bodies, shared by `crates/core/tests/fuzz_corpus.rs`
//! and `crates/conn/tests/fuzz_corpus.rs` (each includes this file): the seeds of each target,
//! simple mutations of them, and bounded random fuzzing. Not part of the fuzz crate.

use std::path::Path;

/// A fuzz target's body.
pub type FuzzBody = fn(&[u8]);

/// `fuzz/seeds/<target>/`, sorted; `manifest_dir` is the running test crate's.
pub fn seeds(manifest_dir: &str, target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(manifest_dir)
        .join("../..")
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
pub fn run_with_mutations(
    manifest_dir: &str,
    target: &str,
    body: FuzzBody,
    stride: usize,
) -> usize {
    let mut runs = 0;
    for seed in seeds(manifest_dir, target) {
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

/// xorshift64*: a few lines instead of a dependency; the seed is printed so a failure can be
/// replayed with `MF_FUZZ_SEED`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One random edit of an input: flip, set, insert, delete, duplicate a span, or splice with
/// another seed, the kinds of edits libFuzzer's mutator makes.
fn mutate(rng: &mut Rng, input: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    let len = input.len();
    match rng.below(6) {
        0 if len > 0 => {
            let i = rng.below(len);
            input[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            input[i] = [0x00, 0x7f, 0x80, 0xff, rng.next() as u8][rng.below(5)];
        }
        2 => {
            let i = rng.below(len + 1);
            input.insert(i, rng.next() as u8);
        }
        3 if len > 0 => {
            let i = rng.below(len);
            let n = rng.below(len - i) + 1;
            input.drain(i..i + n);
        }
        4 if len > 0 && len < 4096 => {
            let i = rng.below(len);
            let n = rng.below(len - i) + 1;
            let span: Vec<u8> = input[i..i + n].to_vec();
            let at = rng.below(len + 1);
            input.splice(at..at, span);
        }
        _ => {
            let other = &seeds[rng.below(seeds.len())];
            let cut = rng.below(len + 1);
            let from = rng.below(other.len() + 1);
            input.truncate(cut);
            input.extend_from_slice(&other[from..]);
        }
    }
}

/// Every target of `targets`, each for a bounded time (`MF_FUZZ_SECONDS`, default 3 s per
/// target): random edits stacked on the seeds. Coverage-guided fuzzing with libFuzzer is
/// `fuzz/README.md`.
pub fn bounded_random_fuzzing(manifest_dir: &str, targets: &[(&str, FuzzBody)]) {
    let seconds: u64 = std::env::var("MF_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let seed = std::env::var("MF_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    println!("MF_FUZZ_SEED={seed} MF_FUZZ_SECONDS={seconds}");
    let mut rng = Rng(seed);
    for &(name, body) in targets {
        let corpus = seeds(manifest_dir, name);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
        let mut runs = 0u64;
        while std::time::Instant::now() < deadline {
            let mut input = corpus[rng.below(corpus.len())].clone();
            for _ in 0..=rng.below(8) {
                mutate(&mut rng, &mut input, &corpus);
            }
            body(&input);
            runs += 1;
        }
        println!("{name}: {runs} inputs in {seconds} s");
        assert!(runs > 10, "{name}: only {runs} inputs ran");
    }
}
