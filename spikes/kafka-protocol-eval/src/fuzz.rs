//! The stable fuzz runner (`fuzz/stable/runner.rs`: seeds, every prefix, byte flips, then
//! bounded random edits) over the seeds of `broker_answers` and `fetcher_answers`, feeding
//! both decoders and recording panics and the largest single allocation per input.

use crate::alloc::{human, measure};
use crate::decoders;
use crate::runner;
use bytes::Bytes;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

#[derive(Debug, Default, Clone)]
struct Stats {
    inputs: u64,
    panics: u64,
    decoded: u64,
    /// Inputs the library decodes that the core refuses for a value outside its range.
    unchecked_values: u64,
    /// Inputs this decoder decodes and the other refuses.
    only_this: u64,
    /// Why the other refused such inputs: its error, and how often.
    other_refusals: std::collections::BTreeMap<String, u64>,
    largest: usize,
    largest_input: Vec<u8>,
    /// The largest allocation per byte of input.
    worst_ratio: f64,
}

static LIBRARY: Mutex<Option<Stats>> = Mutex::new(None);
static PROJECT: Mutex<Option<Stats>> = Mutex::new(None);

/// One decoder's result for one input.
struct Run {
    panicked: bool,
    decoded: bool,
    largest: usize,
}

fn record(
    stats: &Mutex<Option<Stats>>,
    input: &[u8],
    run: &Run,
    other: &Run,
    unchecked: bool,
    other_error: Option<String>,
) {
    let Ok(mut guard) = stats.lock() else { return };
    let s = guard.get_or_insert_with(Stats::default);
    let Run {
        panicked,
        decoded,
        largest,
    } = *run;
    s.inputs += 1;
    s.panics += u64::from(panicked);
    s.decoded += u64::from(decoded);
    if decoded && !other.decoded {
        s.only_this += 1;
        if let Some(e) = other_error {
            *s.other_refusals.entry(e).or_default() += 1;
        }
    }
    s.unchecked_values += u64::from(unchecked);
    if largest > s.largest {
        s.largest = largest;
        s.largest_input = input.to_vec();
    }
    let ratio = largest as f64 / input.len().max(1) as f64;
    if ratio > s.worst_ratio {
        s.worst_ratio = ratio;
    }
}

fn both(kind: usize, body: &[u8], input: &[u8]) {
    let bytes = Bytes::copy_from_slice(body);
    let (result, allocated) =
        measure(|| catch_unwind(AssertUnwindSafe(|| decoders::library(kind, &bytes))));
    let library = Run {
        panicked: result.is_err(),
        decoded: matches!(result, Ok(decoders::Outcome::Decoded)),
        largest: allocated.largest,
    };
    let (result, allocated) =
        measure(|| catch_unwind(AssertUnwindSafe(|| decoders::project(kind, body))));
    let project = Run {
        panicked: result.is_err(),
        decoded: matches!(result, Ok(decoders::Outcome::Decoded)),
        largest: allocated.largest,
    };
    let unchecked = decoders::library_accepts_what_the_core_refuses(kind, &bytes);
    record(&LIBRARY, input, &library, &project, unchecked, None);
    // The library's reason, kept without the numbers that vary, for the README.
    let library_error = (project.decoded && !library.decoded).then(|| {
        decoders::library_error(kind, &bytes)
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .collect()
    });
    record(&PROJECT, input, &project, &library, false, library_error);
}

/// `broker_answers`: the first byte picks the answer kind.
fn broker_answers(data: &[u8]) {
    if let Some((&kind, body)) = data.split_first() {
        both(usize::from(kind), body, data);
    }
}

/// `fetcher_answers`: 8 bytes of offset, then a Fetch answer body.
fn fetcher_answers(data: &[u8]) {
    if let Some(body) = data.get(8..) {
        both(2, body, data);
    }
}

fn take(stats: &Mutex<Option<Stats>>) -> Stats {
    stats
        .lock()
        .ok()
        .and_then(|mut g| g.take())
        .unwrap_or_default()
}

fn line(target: &str, who: &str, s: &Stats) {
    let hex: String = s
        .largest_input
        .iter()
        .take(48)
        .map(|b| format!("{b:02x}"))
        .collect();
    println!(
        "| {target} | {who} | {} | {} | {} | {} | {} | {} ({} B input `{hex}`) | {:.0} |",
        s.inputs,
        s.panics,
        s.decoded,
        s.only_this,
        s.unchecked_values,
        human(s.largest),
        s.largest_input.len(),
        s.worst_ratio
    );
}

pub fn report(manifest_dir: &str) {
    println!("## The fuzz targets' inputs (stable runner: seeds, prefixes, flips, random edits)\n");
    std::panic::set_hook(Box::new(|_| {}));
    let mut rows = Vec::new();
    for (target, body) in [
        ("broker_answers", broker_answers as runner::FuzzBody),
        ("fetcher_answers", fetcher_answers as runner::FuzzBody),
    ] {
        runner::run_with_mutations(manifest_dir, target, body, 1);
        runner::bounded_random_fuzzing(manifest_dir, &[(target, body)]);
        rows.push((target, take(&LIBRARY), take(&PROJECT)));
    }
    let _ = std::panic::take_hook();
    println!();
    println!(
        "| target | decoder | inputs | panics | decoded | decoded, the other refused | with a port or offset the core refuses | largest allocation (its input, first 48 bytes) | worst bytes allocated per input byte |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (target, library, project) in &rows {
        line(target, "kafka-protocol 0.18.0", library);
        line(target, "core (hand-written)", project);
    }
    println!(
        "\nWhy the library refused what the core decoded (most frequent errors, digits as #):\n"
    );
    for (target, _, project) in &rows {
        refusals(target, project);
    }
    println!();
}

fn refusals(target: &str, s: &Stats) {
    let mut reasons: Vec<(&String, &u64)> = s.other_refusals.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1));
    for (reason, n) in reasons.iter().take(4) {
        println!("- {target}: {n} x `{reason}`");
    }
}
