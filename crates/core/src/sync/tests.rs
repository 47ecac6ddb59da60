//! Store and policy behaviour: MM2's `OffsetSyncStoreTest` cases as behaviour, exact mode,
//! and property tests against a simulated replicated log.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::records::{OffsetSync, TopicPartition};

fn tp() -> TopicPartition {
    TopicPartition::new("topic1", 2)
}

/// A loaded store of `max_runs` runs and no byte budget for history (its newest entry only).
fn loaded_store(max_runs: usize) -> OffsetSyncStore {
    loaded_store_with(max_runs, 0)
}

fn loaded_store_with(max_runs: usize, history_bytes: usize) -> OffsetSyncStore {
    let mut store = OffsetSyncStore::new(StoreConfig {
        max_runs,
        history_bytes,
    });
    store.finish_initial_load();
    store
}

fn sync(store: &mut OffsetSyncStore, up: i64, down: i64, origin: SyncOrigin) {
    store
        .update(&OffsetSync::new(tp(), up, down), origin)
        .unwrap();
}

fn conservative(offset: i64, max_replay: u64) -> Translation {
    Translation::Conservative { offset, max_replay }
}

// ---- MM2's OffsetSyncStoreTest, as behaviour (syncs written by MM2 are Sparse) ----

#[test]
fn mm2_offset_translation() {
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync(&mut store, 100, 200, SyncOrigin::Sparse);
    // No dead reckoning past a sparse sync: down + 1, up to 49 records re-read.
    assert_eq!(store.translate(&tp(), 150), conservative(201, 49));
    sync(&mut store, 150, 251, SyncOrigin::Sparse);
    assert_eq!(store.translate(&tp(), 150), Translation::Exact(251));
    // Once the next sync is known, the replay bound also uses its downstream offset.
    assert_eq!(store.translate(&tp(), 120), conservative(201, 19));
    assert_eq!(
        store.translate(&tp(), 5),
        Translation::Unknown(UnknownReason::OlderThanOldestSync { oldest: 100 })
    );
    // Downstream offsets reset.
    sync(&mut store, 200, 10, SyncOrigin::Sparse);
    assert_eq!(store.translate(&tp(), 200), Translation::Exact(10));
    // Upstream offsets reset: history is void.
    sync(&mut store, 20, 20, SyncOrigin::Sparse);
    assert_eq!(store.translate(&tp(), 20), Translation::Exact(20));
    assert_eq!(store.partition(&tp()).unwrap().len(), 1);
}

#[test]
fn mm2_no_translation_until_initial_load_is_done() {
    let mut store = OffsetSyncStore::new(StoreConfig::default());
    let loading = Translation::Unknown(UnknownReason::Loading);
    assert_eq!(store.translate(&tp(), 0), loading);
    sync(&mut store, 100, 200, SyncOrigin::Sparse);
    assert_eq!(store.translate(&tp(), 100), loading);
    store.finish_initial_load();
    assert!(matches!(
        store.translate(&tp(), 0),
        Translation::Unknown(UnknownReason::OlderThanOldestSync { .. })
    ));
    assert_eq!(store.translate(&tp(), 100), Translation::Exact(200));
    assert_eq!(store.translate(&tp(), 200), conservative(201, 99));
}

#[test]
fn mm2_no_translation_without_syncs() {
    let store = loaded_store(DEFAULT_MAX_RUNS);
    assert_eq!(
        store.translate(&tp(), 0),
        Translation::Unknown(UnknownReason::NoSyncs)
    );
}

#[test]
fn mm2_past_offset_translation_keeps_history_read_at_start() {
    let mut store = OffsetSyncStore::new(StoreConfig::default());
    let mut offset = 0;
    while offset <= 1000 {
        sync(&mut store, offset, offset, SyncOrigin::Sparse);
        offset += 10;
    }
    store.finish_initial_load();
    // MM2 keeps only the last sync read at start (1000); we keep them, so older groups translate.
    assert_eq!(store.translate(&tp(), 1000), Translation::Exact(1000));
    assert_eq!(store.translate(&tp(), 500), Translation::Exact(500));
    assert_eq!(store.translate(&tp(), 505), conservative(501, 4));
    while offset <= 10_000 {
        sync(&mut store, offset, offset, SyncOrigin::Sparse);
        offset += 10;
    }
    let syncs = store.partition(&tp()).unwrap();
    assert_eq!(syncs.len(), DEFAULT_MAX_RUNS);
    assert_eq!(
        syncs.oldest_upstream(),
        Some(0),
        "the earliest sync stays usable"
    );
    // Precision degrades with distance from the head, log-spaced.
    for c in [9_995, 9_000, 5_000, 1_000, 100] {
        let t = store.translate(&tp(), c);
        let replay = t.max_replay().unwrap() as i64;
        let age = 10_000 - c;
        assert!(
            replay <= age / 2 + 10,
            "c={c}: {t:?} replay {replay} for age {age}"
        );
    }
    assert_eq!(store.translate(&tp(), 9_995), conservative(9_991, 4));
    // Rewinding upstream clears history.
    sync(&mut store, 1500, 11_000, SyncOrigin::Sparse);
    assert!(matches!(
        store.translate(&tp(), 1499),
        Translation::Unknown(UnknownReason::OlderThanOldestSync { oldest: 1500 })
    ));
    assert_eq!(store.translate(&tp(), 1500), Translation::Exact(11_000));
    assert_eq!(store.translate(&tp(), 2000), conservative(11_001, 499));
}

#[test]
fn mm2_each_sync_expires_at_most_one_other() {
    for step in [1_i64, 3, 7, 1023, 1 << 20] {
        let mut store = loaded_store(DEFAULT_MAX_RUNS);
        let mut last_len = 0;
        for i in 0..5_000_i64 {
            let offset = i * step;
            sync(&mut store, offset, offset, SyncOrigin::Sparse);
            let syncs = store.partition(&tp()).unwrap();
            assert!(
                syncs.len() + 1 >= last_len,
                "step {step}: dropped more than one"
            );
            assert_eq!(syncs.oldest_upstream(), Some(0));
            assert_eq!(store.translate(&tp(), offset), Translation::Exact(offset));
            last_len = syncs.len();
        }
    }
}

// ---- exact mode ----

#[test]
fn dense_syncs_translate_exactly_between_delta_changes() {
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync(&mut store, 100, 200, SyncOrigin::Dense);
    // MM2 would say 201 for 150; with only one dense sync the run's extent is unknown.
    assert_eq!(store.translate(&tp(), 150), conservative(201, 49));
    // Delta changes 100 -> 101 at 150 (e.g. a transaction marker on the target).
    sync(&mut store, 150, 251, SyncOrigin::Dense);
    assert_eq!(store.translate(&tp(), 120), Translation::Exact(220));
    assert_eq!(store.translate(&tp(), 149), Translation::Exact(249));
    assert_eq!(store.translate(&tp(), 150), Translation::Exact(251));
    assert_eq!(
        store.translate(&tp(), 151),
        Translation::Exact(252),
        "down + 1 is exact"
    );
}

#[test]
fn upstream_gap_with_smaller_delta_is_clamped_to_the_next_sync() {
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    // Records 0..=9 at 0..=9, then a compaction gap: record 20 lands at 10.
    sync(&mut store, 0, 0, SyncOrigin::Dense);
    sync(&mut store, 20, 10, SyncOrigin::Dense);
    assert_eq!(store.translate(&tp(), 5), Translation::Exact(5));
    assert_eq!(store.translate(&tp(), 10), Translation::Exact(10));
    // 15 lies in the gap: the next record is 20, at 10; c + delta = 15 would skip records.
    assert_eq!(store.translate(&tp(), 15), Translation::Exact(10));
}

#[test]
fn periodic_syncs_and_coverage_extend_the_newest_run() {
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync(&mut store, 100, 200, SyncOrigin::Dense);
    sync(&mut store, 200, 300, SyncOrigin::Dense); // periodic, same delta: merged
    assert_eq!(store.partition(&tp()).unwrap().len(), 1);
    assert_eq!(store.translate(&tp(), 180), Translation::Exact(280));
    assert_eq!(store.translate(&tp(), 210), conservative(301, 9));
    let coverage = Coverage {
        last_sync: (200, 300),
        last_record: (250, 350),
    };
    assert!(store.report_coverage(&tp(), coverage));
    assert_eq!(store.translate(&tp(), 251), Translation::Exact(351));
    assert_eq!(store.translate(&tp(), 260), conservative(351, 9));
    // Coverage from a writer whose last sync we have not seen is refused.
    let stale = Coverage {
        last_sync: (100, 200),
        last_record: (400, 500),
    };
    assert!(!store.report_coverage(&tp(), stale));
}

#[test]
fn a_tail_sync_with_the_runs_delta_makes_the_idle_tail_exact() {
    // 30 records 0..29 copied in a burst: a first sync, then the idle partition's tail sync.
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync(&mut store, 0, 0, SyncOrigin::Dense);
    assert_eq!(store.translate(&tp(), 25), conservative(1, 24));
    sync(&mut store, 29, 29, SyncOrigin::Dense);
    assert_eq!(
        store.partition(&tp()).unwrap().len(),
        1,
        "the run was extended"
    );
    assert_eq!(store.translate(&tp(), 25), Translation::Exact(25));
    assert_eq!(store.translate(&tp(), 29), Translation::Exact(29));
    assert_eq!(store.translate(&tp(), 30), Translation::Exact(30));
    // Same with an offset delta, and after coverage already reached the tail record.
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync(&mut store, 100, 150, SyncOrigin::Dense);
    let coverage = Coverage {
        last_sync: (100, 150),
        last_record: (129, 179),
    };
    assert!(store.report_coverage(&tp(), coverage));
    sync(&mut store, 129, 179, SyncOrigin::Dense);
    assert_eq!(store.partition(&tp()).unwrap().len(), 1);
    assert_eq!(store.translate(&tp(), 125), Translation::Exact(175));
    // The run goes on from the tail sync.
    sync(&mut store, 200, 250, SyncOrigin::Dense);
    assert_eq!(store.partition(&tp()).unwrap().len(), 1);
    assert_eq!(store.translate(&tp(), 160), Translation::Exact(210));
}

#[test]
fn the_policys_tail_sync_feeds_the_store_exactly() {
    let config = SyncPolicyConfig {
        max_records: 100,
        max_interval: Some(Duration::from_secs(1)),
    };
    let mut policy = SyncPolicy::new(tp(), config);
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    let burst = Duration::from_millis(5);
    for i in 0..30 {
        if let Some(s) = policy.observe(i, i + 3, burst) {
            store.update(&s, SyncOrigin::Dense).unwrap();
        }
    }
    assert_eq!(store.translate(&tp(), 25), conservative(4, 24));
    assert_eq!(policy.idle_sync(burst + Duration::from_millis(999)), None);
    let tail = policy.idle_sync(burst + Duration::from_secs(1)).unwrap();
    assert_eq!(policy.last_reason(), Some(SyncReason::Idle));
    store.update(&tail, SyncOrigin::Dense).unwrap();
    assert_eq!(store.translate(&tp(), 25), Translation::Exact(28));
}

#[test]
fn sparse_sync_after_dense_keeps_earlier_exactness_but_adds_none() {
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync(&mut store, 0, 1000, SyncOrigin::Dense);
    sync(&mut store, 100, 1100, SyncOrigin::Dense);
    sync(&mut store, 300, 1305, SyncOrigin::Sparse); // MM2 took over
    assert_eq!(store.translate(&tp(), 50), Translation::Exact(1050));
    assert_eq!(store.translate(&tp(), 100), Translation::Exact(1100));
    // Unknown what happened between 100 and 300: MM2's rule.
    assert_eq!(store.translate(&tp(), 200), conservative(1101, 99));
    sync(&mut store, 400, 1405, SyncOrigin::Dense); // first of ours after MM2: no exact link
    assert_eq!(store.translate(&tp(), 350), conservative(1306, 49));
}

#[test]
fn dense_syncs_read_during_initial_load_translate_exactly() {
    let mut store = OffsetSyncStore::new(StoreConfig::default());
    // Re-read at start: compaction keeps a contiguous suffix of a partition's syncs, so these
    // two were consecutive in the writer's output and 0..100 had delta 0.
    sync(&mut store, 0, 0, SyncOrigin::Dense);
    sync(&mut store, 100, 110, SyncOrigin::Dense);
    store.finish_initial_load();
    assert_eq!(store.translate(&tp(), 50), Translation::Exact(50));
    sync(&mut store, 200, 220, SyncOrigin::Dense);
    assert_eq!(store.translate(&tp(), 150), Translation::Exact(160));
}

#[test]
fn writer_restart_from_an_earlier_position_keeps_first_copies() {
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync(&mut store, 0, 0, SyncOrigin::Dense);
    sync(&mut store, 100, 100, SyncOrigin::Dense); // merged, run covers 0..=100
    // Restarted at 80, re-replicated 80.. at 101..
    sync(&mut store, 80, 101, SyncOrigin::Dense);
    assert_eq!(store.translate(&tp(), 50), Translation::Exact(50));
    assert_eq!(store.translate(&tp(), 79), Translation::Exact(79));
    assert_eq!(store.translate(&tp(), 80), Translation::Exact(101));
}

#[test]
fn negative_inputs_are_refused_not_translated() {
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    assert!(
        store
            .update(&OffsetSync::new(tp(), -1, 5), SyncOrigin::Sparse)
            .is_err()
    );
    sync(&mut store, 0, 0, SyncOrigin::Sparse);
    assert_eq!(
        store.translate(&tp(), -1),
        Translation::Unknown(UnknownReason::NegativeOffset)
    );
}

/// The stated bound: `max_runs + 1` runs of 40 bytes, the history's budget and half again
/// for its anchors' spare capacity, and the struct.
fn memory_bound(config: StoreConfig) -> usize {
    std::mem::size_of::<PartitionSyncs>()
        + (config.max_runs + 1) * 40
        + config.history_bytes * 3 / 2
}

#[test]
fn memory_per_partition_is_bounded() {
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    for i in 0..10_000 {
        sync(&mut store, i * 10, i * 10 + (i % 2), SyncOrigin::Dense);
    }
    let syncs = store.partition(&tp()).unwrap();
    assert_eq!(syncs.len(), DEFAULT_MAX_RUNS);
    let no_history = StoreConfig {
        max_runs: DEFAULT_MAX_RUNS,
        history_bytes: 0,
    };
    assert!(
        syncs.memory_bytes() <= memory_bound(no_history),
        "{}",
        syncs.memory_bytes()
    );
    let dense_constant = {
        let mut s = loaded_store(DEFAULT_MAX_RUNS);
        for i in 0..10_000 {
            sync(&mut s, i * 10, i * 10 + 7, SyncOrigin::Dense);
        }
        s.partition(&tp()).unwrap().memory_bytes()
    };
    assert!(
        dense_constant <= std::mem::size_of::<PartitionSyncs>() + 4 * 40,
        "one run: {dense_constant}"
    );
}

/// A transactional partition copied without its markers: a new run at every transaction of
/// 1-20 records, every tenth aborted, 200,000 transactions (2.1 M offsets). With the default
/// budget every offset of the newest ~6,000 transactions translates exactly, older ones as the
/// run list does, and memory stays within the bound.
#[test]
fn irregular_transactions_translate_exactly_within_the_history_budget() {
    let config = StoreConfig::default();
    let mut store = loaded_store_with(config.max_runs, config.history_bytes);
    let (mut up, mut down, mut seed) = (0_i64, 0_i64, 7_u64);
    let mut records = Vec::new();
    for i in 0..200_000_u64 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let n = 1 + (seed >> 33) as i64 % 20;
        if i % 10 == 9 {
            up += n + 1; // aborted: its records and marker are not copied
            continue;
        }
        sync(&mut store, up, down, SyncOrigin::Dense);
        records.push((up, down, n));
        up += n + 1;
        down += n;
    }
    let syncs = store.partition(&tp()).unwrap();
    let from = syncs.exact_history_from().unwrap();
    let exact_transactions = records.iter().filter(|r| r.0 >= from).count();
    println!(
        "{} bytes for 200,000 transactions; exact over the newest {exact_transactions}",
        syncs.memory_bytes()
    );
    assert!(
        syncs.memory_bytes() <= memory_bound(config),
        "{}",
        syncs.memory_bytes()
    );
    assert!(exact_transactions >= 5_000, "{exact_transactions}");
    // Every committed offset inside a transaction's records, and on its marker, lands on the
    // next record the target holds. (The newest transaction's end is known only from its
    // successor's sync or coverage, so it is left out.)
    for &(u, d, n) in records.iter().filter(|r| r.0 >= from).rev().skip(1) {
        for k in 0..n {
            assert_eq!(
                store.translate(&tp(), u + k),
                Translation::Exact(d + k),
                "c={}",
                u + k
            );
        }
        assert_eq!(
            store.translate(&tp(), u + n),
            Translation::Exact(d + n),
            "marker {}",
            u + n
        );
    }
    // Older offsets still translate (coarsely), and never past the true position.
    let (u, d, _) = records[1_000];
    let t = store.translate(&tp(), u + 1);
    assert!(t.offset().is_some_and(|o| o <= d + 1), "{t:?}");
}

/// Fixed-size transactions are one shape: the whole history fits in a few bytes.
#[test]
fn a_regular_marker_pattern_translates_exactly_in_constant_space() {
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    for i in 0..1_000_000_i64 {
        sync(&mut store, i * 10, i * 9, SyncOrigin::Dense);
    }
    let syncs = store.partition(&tp()).unwrap();
    assert_eq!(syncs.exact_history_from(), Some(0));
    assert!(
        syncs.memory_bytes()
            <= memory_bound(StoreConfig {
                max_runs: DEFAULT_MAX_RUNS,
                history_bytes: 0
            })
    );
    for c in [1, 9, 10, 4_567_893, 9_999_979] {
        let want = c / 10 * 9 + (c % 10).min(9);
        assert_eq!(store.translate(&tp(), c), Translation::Exact(want), "c={c}");
    }
}

// ---- properties against a simulated replicated log ----

/// A replicated partition: `(upstream, downstream)` of every record, both strictly increasing.
#[derive(Debug, Clone)]
struct Log {
    records: Vec<(i64, i64)>,
}

impl Log {
    /// Steps are (upstream step, downstream step): > 1 upstream is a marker or compaction gap,
    /// > 1 downstream a marker or foreign write on the target.
    fn build(start_up: i64, start_down: i64, steps: &[(i64, i64)]) -> Self {
        let mut records = vec![(start_up, start_down)];
        for &(du, dd) in steps {
            let (u, d) = records[records.len() - 1];
            records.push((u + du, d + dd));
        }
        Self { records }
    }

    fn last(&self) -> (i64, i64) {
        self.records[self.records.len() - 1]
    }

    /// Downstream position of the first record a group committed at `c` has not read.
    fn true_position(&self, c: i64) -> i64 {
        let i = self.records.partition_point(|&(u, _)| u < c);
        self.records.get(i).map_or(self.last().1 + 1, |&(_, d)| d)
    }

    /// Records already read (upstream < c) that seeking to `t` delivers again.
    fn replayed(&self, c: i64, t: i64) -> u64 {
        self.records
            .iter()
            .filter(|&&(u, d)| u < c && d >= t)
            .count() as u64
    }
}

/// MM2's rule over every sync (no retention): newest at or before, `down + 1` when past it.
fn mm2_translate(syncs: &[(i64, i64)], c: i64) -> Option<i64> {
    let s = syncs.iter().rev().find(|&&(u, _)| u <= c)?;
    Some(if s.0 == c { s.1 } else { s.1 + 1 })
}

/// MM2's source task: first record, upstream gap, downstream backwards, or 100 since the last.
fn mm2_writer(log: &Log) -> Vec<(i64, i64)> {
    let mut syncs: Vec<(i64, i64)> = Vec::new();
    let mut prev: Option<(i64, i64)> = None;
    for &(u, d) in &log.records {
        let emit = match (prev, syncs.last()) {
            (Some((pu, pd)), Some(&(_, sd))) => u - pu != 1 || d < pd || d - sd > 100, // MM2: down - lastSyncDown - 1 >= offset.lag.max
            _ => true,
        };
        if emit {
            syncs.push((u, d));
        }
        prev = Some((u, d));
    }
    syncs
}

fn our_writer(log: &Log, config: SyncPolicyConfig) -> (Vec<(i64, i64)>, Option<Coverage>) {
    our_writer_idling(log, config, None)
}

/// Our writer, with the partition going idle (long enough for a tail sync) after every
/// `idle_every`-th record.
fn our_writer_idling(
    log: &Log,
    config: SyncPolicyConfig,
    idle_every: Option<usize>,
) -> (Vec<(i64, i64)>, Option<Coverage>) {
    let mut policy = SyncPolicy::new(tp(), config);
    let mut now = Duration::ZERO;
    let mut syncs = Vec::new();
    for (i, &(u, d)) in log.records.iter().enumerate() {
        now += Duration::from_millis(10);
        syncs.extend(policy.observe(u, d, now));
        if idle_every.is_some_and(|n| (i + 1) % n == 0) {
            now += config.max_interval.unwrap_or_default();
            syncs.extend(policy.idle_sync(now));
        }
    }
    let syncs = syncs
        .into_iter()
        .map(|s| (s.upstream_offset, s.downstream_offset))
        .collect();
    (syncs, policy.coverage())
}

/// The syncs our writer (`dense`) or MM2's writes for `log`, and their origin.
fn syncs_of(log: &Log, config: SyncPolicyConfig, dense: bool) -> (Vec<(i64, i64)>, SyncOrigin) {
    if dense {
        (our_writer(log, config).0, SyncOrigin::Dense)
    } else {
        (mm2_writer(log), SyncOrigin::Sparse)
    }
}

fn steps() -> impl Strategy<Value = Vec<(i64, i64)>> {
    let step = prop_oneof![
        8 => Just((1_i64, 1_i64)),
        1 => (2_i64..6, Just(1_i64)),  // upstream gap: markers, compaction
        1 => (Just(1_i64), 2_i64..4),  // target-side marker or foreign record
        1 => (2_i64..6, 2_i64..6),     // both
    ];
    prop::collection::vec(step, 0..400)
}

fn sync_config() -> impl Strategy<Value = SyncPolicyConfig> {
    (0_u64..300, prop::option::of(0_u64..2_000)).prop_map(|(n, ms)| SyncPolicyConfig {
        max_records: n,
        max_interval: ms.map(Duration::from_millis),
    })
}

/// Checks every committed offset from before the log to past its end.
fn check_against_truth(
    log: &Log,
    store: &OffsetSyncStore,
    mm2_syncs: Option<&[(i64, i64)]>,
) -> Result<(), TestCaseError> {
    let (first_up, _) = log.records[0];
    let (last_up, _) = log.last();
    for c in first_up.saturating_sub(2).max(0)..=last_up + 3 {
        let t = store.translate(&tp(), c);
        let truth = log.true_position(c);
        if let Some(offset) = t.offset() {
            prop_assert!(offset <= truth, "c={c}: {t:?} skips records (true {truth})");
            let replayed = log.replayed(c, offset);
            let bound = t.max_replay().unwrap_or(0);
            prop_assert!(replayed <= bound, "c={c}: {t:?} re-reads {replayed}");
        }
        if let Some(mm2) = mm2_syncs.and_then(|s| mm2_translate(s, c)) {
            let ours = t.offset();
            prop_assert!(ours.is_some(), "c={c}: MM2 translates to {mm2}, we do not");
            let ours = ours.unwrap_or_default();
            prop_assert!(
                log.replayed(c, ours) <= log.replayed(c, mm2),
                "c={c}: ours {ours} re-reads more than MM2's {mm2}"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn dense_translation_is_exact_inside_runs_and_never_skips(
        start in (0_i64..1_000, 0_i64..1_000),
        steps in steps(),
        config in sync_config(),
        report_coverage in any::<bool>(),
    ) {
        let log = Log::build(start.0, start.1, &steps);
        let (syncs, coverage) = our_writer(&log, config);
        let mut store = loaded_store(1_000);
        for &(u, d) in &syncs {
            store.update(&OffsetSync::new(tp(), u, d), SyncOrigin::Dense).unwrap();
        }
        if report_coverage {
            prop_assert!(store.report_coverage(&tp(), coverage.unwrap()));
        }
        check_against_truth(&log, &store, Some(&syncs))?;
        // Exact everywhere a sync or the coverage vouches for.
        let exact_until = if report_coverage { log.last().0 + 1 } else { syncs[syncs.len() - 1].0 + 1 };
        for c in start.0..=exact_until {
            let t = store.translate(&tp(), c);
            prop_assert!(t.is_exact(), "c={c}: {t:?}");
        }
    }

    #[test]
    fn tail_syncs_keep_the_stream_dense_and_make_the_tail_exact(
        start in (0_i64..1_000, 0_i64..1_000),
        steps in steps(),
        config in sync_config(),
        idle_every in 1_usize..50,
    ) {
        let config = SyncPolicyConfig {
            max_interval: Some(config.max_interval.unwrap_or(Duration::from_secs(1))),
            ..config
        };
        let log = Log::build(start.0, start.1, &steps);
        let (syncs, _) = our_writer_idling(&log, config, Some(idle_every));
        let mut store = loaded_store(1_000);
        for &(u, d) in &syncs {
            store.update(&OffsetSync::new(tp(), u, d), SyncOrigin::Dense).unwrap();
        }
        check_against_truth(&log, &store, Some(&syncs))?;
        // Every record up to the last idle point translates exactly without any coverage.
        let idle_records = log.records.len() / idle_every * idle_every;
        if let Some(&(last_idle_up, _)) = idle_records.checked_sub(1).and_then(|i| log.records.get(i)) {
            for c in start.0..=last_idle_up + 1 {
                let t = store.translate(&tp(), c);
                prop_assert!(t.is_exact(), "c={c}: {t:?}");
            }
        }
    }

    #[test]
    fn mm2_syncs_translate_no_worse_than_mm2(
        start in (0_i64..1_000, 0_i64..1_000),
        steps in steps(),
    ) {
        let log = Log::build(start.0, start.1, &steps);
        let syncs = mm2_writer(&log);
        let mut store = loaded_store(1_000);
        for &(u, d) in &syncs {
            store.update(&OffsetSync::new(tp(), u, d), SyncOrigin::Sparse).unwrap();
        }
        check_against_truth(&log, &store, Some(&syncs))?;
    }

    #[test]
    fn mm2_then_ours_never_skips_and_is_no_worse(
        start in (0_i64..1_000, 0_i64..1_000),
        steps in steps(),
        split in 0.0_f64..1.0,
        config in sync_config(),
    ) {
        let log = Log::build(start.0, start.1, &steps);
        let at = ((log.records.len() as f64) * split) as usize;
        let (before, after) = log.records.split_at(at);
        let mut syncs = mm2_writer(&Log { records: before.to_vec() });
        let mut origins = vec![SyncOrigin::Sparse; syncs.len()];
        if !after.is_empty() {
            let (ours, _) = our_writer(&Log { records: after.to_vec() }, config);
            origins.extend(std::iter::repeat_n(SyncOrigin::Dense, ours.len()));
            syncs.extend(ours);
        }
        let mut store = loaded_store(1_000);
        for (&(u, d), &origin) in syncs.iter().zip(&origins) {
            store.update(&OffsetSync::new(tp(), u, d), origin).unwrap();
        }
        check_against_truth(&log, &store, Some(&syncs))?;
    }

    #[test]
    fn bounded_store_never_skips_and_bounds_replay(
        start in (0_i64..1_000, 0_i64..1_000),
        steps in steps(),
        config in sync_config(),
        max_runs in 2_usize..12,
        dense in any::<bool>(),
    ) {
        let log = Log::build(start.0, start.1, &steps);
        let (syncs, origin) = syncs_of(&log, config, dense);
        let mut store = loaded_store(max_runs);
        for &(u, d) in &syncs {
            store.update(&OffsetSync::new(tp(), u, d), origin).unwrap();
            prop_assert!(store.partition(&tp()).unwrap().len() <= max_runs);
        }
        check_against_truth(&log, &store, None)?;
        // The newest sync always translates exactly.
        let (u, d) = syncs[syncs.len() - 1];
        prop_assert_eq!(store.translate(&tp(), u), Translation::Exact(d));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// With history, a store that keeps a few runs translates every offset since its oldest
    /// history entry exactly as one that keeps every run; and within a small budget it never
    /// skips and bounds its replay.
    #[test]
    fn history_translates_as_if_every_run_were_kept(
        start in (0_i64..1_000, 0_i64..1_000),
        steps in steps(),
        config in sync_config(),
        max_runs in 2_usize..8,
        history_bytes in prop_oneof![Just(1_usize << 20), 0_usize..300],
        dense in any::<bool>(),
    ) {
        let log = Log::build(start.0, start.1, &steps);
        let (syncs, origin) = syncs_of(&log, config, dense);
        let mut every_run = loaded_store_with(100_000, 0);
        let mut bounded = loaded_store_with(max_runs, history_bytes);
        for &(u, d) in &syncs {
            every_run.update(&OffsetSync::new(tp(), u, d), origin).unwrap();
            bounded.update(&OffsetSync::new(tp(), u, d), origin).unwrap();
        }
        check_against_truth(&log, &bounded, None)?;
        let from = bounded.partition(&tp()).unwrap().exact_history_from().unwrap();
        if history_bytes >= 1 << 20 {
            prop_assert_eq!(from, syncs[0].0);
        }
        let (last_up, _) = log.last();
        for c in from..=last_up + 3 {
            prop_assert_eq!(bounded.translate(&tp(), c), every_run.translate(&tp(), c), "c={}", c);
        }
    }
}

#[test]
fn a_target_offset_going_back_is_a_new_remote_log_and_voids_history() {
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    let apply = |store: &mut OffsetSyncStore, up, down| {
        store
            .update(&OffsetSync::new(tp(), up, down), SyncOrigin::Dense)
            .unwrap()
    };
    assert!(!apply(&mut store, 0, 100));
    assert!(!apply(&mut store, 19, 119));
    // The writer re-copied from an earlier position into the same log: later offsets.
    assert!(!apply(&mut store, 10, 130));
    // The remote topic was recreated and copied again from the source's log start 5.
    assert!(apply(&mut store, 5, 0));
    assert!(!apply(&mut store, 19, 14));
    assert_eq!(store.translate(&tp(), 15), Translation::Exact(10));
    assert_eq!(store.partition(&tp()).unwrap().len(), 1);
}

// ---- where the copy started reading ([`CopyStart`]) ----

/// A dense sync `(up, down)` whose record is the first the copy read from `start`.
fn sync_after(store: &mut OffsetSyncStore, start: (i64, i64), up: i64, down: i64) {
    let mut s = OffsetSync::new(tp(), up, down);
    s.start = Some(CopyStart {
        upstream: start.0,
        downstream: start.1,
    });
    store.update(&s, SyncOrigin::Dense).unwrap();
}

#[test]
fn positions_below_the_first_record_translate_from_where_the_copy_started() {
    // Aligned: the cleaner left nothing below 360; the copy read from 0, target at 0.
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync_after(&mut store, (0, 0), 360, 360);
    sync(&mut store, 400, 400, SyncOrigin::Dense);
    for c in [0, 1, 359, 360, 380, 400] {
        assert_eq!(
            store.translate(&tp(), c),
            Translation::Exact(c),
            "aligned {c}"
        );
    }
    assert_eq!(store.partition(&tp()).map(PartitionSyncs::len), Some(1));

    // Translated: the first record, 360, landed at 5; every position before it maps there.
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync_after(&mut store, (0, 5), 360, 5);
    sync(&mut store, 370, 15, SyncOrigin::Dense);
    for c in [0, 200, 359, 360] {
        assert_eq!(
            store.translate(&tp(), c),
            Translation::Exact(5),
            "translated {c}"
        );
    }
    assert_eq!(store.translate(&tp(), 365), Translation::Exact(10));

    // Resumed from a stored position after records copied before: older runs stay.
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync(&mut store, 10, 0, SyncOrigin::Dense);
    sync(&mut store, 20, 10, SyncOrigin::Dense);
    sync_after(&mut store, (21, 11), 30, 11);
    assert_eq!(store.translate(&tp(), 15), Translation::Exact(5));
    assert_eq!(store.translate(&tp(), 21), Translation::Exact(11));
    assert_eq!(store.translate(&tp(), 25), Translation::Exact(11));
    assert_eq!(store.translate(&tp(), 30), Translation::Exact(11));

    // A start MM2's syncs carried (or a hostile header on them) says nothing.
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    let mut s = OffsetSync::new(tp(), 360, 5);
    s.start = Some(CopyStart {
        upstream: 0,
        downstream: 5,
    });
    store.update(&s, SyncOrigin::Sparse).unwrap();
    assert_eq!(
        store.translate(&tp(), 359),
        Translation::Unknown(UnknownReason::OlderThanOldestSync { oldest: 360 })
    );
    // ... nor one past its record.
    let mut store = loaded_store(DEFAULT_MAX_RUNS);
    sync_after(&mut store, (361, 5), 360, 5);
    assert_eq!(
        store.translate(&tp(), 359),
        Translation::Unknown(UnknownReason::OlderThanOldestSync { oldest: 360 })
    );
}

#[test]
fn the_policy_says_where_the_copy_started_on_the_first_sync_after_it_only() {
    let config = SyncPolicyConfig {
        max_records: 0,
        max_interval: None,
    };
    let mut p = SyncPolicy::new(tp(), config);
    p.reading_from(0, Some(0));
    let first = p.observe(360, 360, Duration::ZERO).unwrap();
    assert_eq!(
        first.start,
        Some(CopyStart {
            upstream: 0,
            downstream: 0
        })
    );
    let gap = p.observe(370, 370, Duration::ZERO);
    assert_eq!(gap.and_then(|s| s.start), None, "only the first");

    // Translated: the start maps where the record landed; none when nothing lay between.
    p.reading_from(371, None);
    let s = p.observe(380, 9, Duration::ZERO).unwrap();
    assert_eq!(
        s.start,
        Some(CopyStart {
            upstream: 371,
            downstream: 9
        })
    );
    p.reading_from(381, None);
    assert_eq!(p.observe(381, 10, Duration::ZERO).unwrap().start, None);
    // A negative position (no concrete seek) is no start.
    p.reading_from(-2, None);
    assert_eq!(p.observe(390, 11, Duration::ZERO).unwrap().start, None);
}
