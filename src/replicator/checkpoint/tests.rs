//! The checkpoint loop's decisions ([`Core`]), driven by the events its readers send.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;

use super::core::Due;
use super::group_sync::GroupView;
use super::state::Commit;
use super::*;
use crate::kafka::checkpoints::Exactness;
use crate::mm2::{Checkpoint, OffsetSync, PrefixPolicy, SyncOrigin, TopicPartition};

mod exactness;
mod ownership;
mod verify;

const COMMITTED_MS: i64 = 1_000;

struct Names {
    policy: PrefixPolicy,
    filters: Filters,
}

/// Every topic but `secret*` is mirrored, every group followed.
fn names() -> Names {
    Names {
        policy: PrefixPolicy::default(),
        filters: Filters::new(&[".*"], &["secret.*"], &[".*"], &[] as &[&str]).unwrap(),
    }
}

fn core(names: &Names) -> Core<'_> {
    Core::new(Naming {
        policy: &names.policy,
        filters: &names.filters,
        source_alias: "A",
        target_alias: "B",
    })
}

/// Checkpoints and syncs loaded, `__consumer_offsets` partitions 0 and 1 assigned and read.
fn loaded_core(names: &Names) -> Core<'_> {
    let mut c = core(names);
    for event in [
        Event::CheckpointsLoaded,
        Event::SyncsLoaded,
        Event::Assigned(vec![0, 1]),
        Event::CaughtUp(0),
        Event::CaughtUp(1),
    ] {
        c.handle(event);
    }
    c
}

fn tp(topic: &str, partition: i32) -> TopicPartition {
    TopicPartition::new(topic, partition)
}

fn commit(co_partition: i32, group: &str, tp: TopicPartition, offset: i64) -> Event {
    Event::Commit {
        co_partition,
        group: group.into(),
        tp,
        commit: Some(Commit {
            offset,
            metadata: "m".into(),
            commit_timestamp_ms: COMMITTED_MS,
            live: false,
        }),
    }
}

fn deletion(co_partition: i32, group: &str, tp: TopicPartition) -> Event {
    Event::Commit {
        co_partition,
        group: group.into(),
        tp,
        commit: None,
    }
}

fn sync(tp: TopicPartition, up: i64, down: i64, at_ms: i64) -> Event {
    Event::Sync(
        OffsetSync::new(tp, up, down),
        SyncOrigin::Dense,
        Some(at_ms),
    )
}

fn checkpoint(group: &str, target: TopicPartition, up: i64, down: i64) -> Checkpoint {
    Checkpoint {
        group: group.into(),
        topic_partition: target,
        upstream_offset: up,
        downstream_offset: down,
        metadata: "m".into(),
    }
}

fn at_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn dirty(c: &Core<'_>) -> BTreeSet<(String, TopicPartition)> {
    c.dirty.iter().cloned().collect()
}

fn pair(group: &str, tp: TopicPartition) -> (String, TopicPartition) {
    (group.into(), tp)
}

/// Evaluates the dirty pairs and acknowledges every checkpoint due at `now`; returns them.
fn flush_acked(c: &mut Core<'_>, now: SystemTime) -> Vec<Checkpoint> {
    flush_acked_with_exactness(c, now)
        .into_iter()
        .map(|(cp, _)| cp)
        .collect()
}

/// [`flush_acked`], with what each checkpoint's header says.
fn flush_acked_with_exactness(c: &mut Core<'_>, now: SystemTime) -> Vec<(Checkpoint, Exactness)> {
    let due = c.due_checkpoints();
    for d in &due {
        c.written(&d.tp, &d.checkpoint, d.exactness, now);
    }
    due.into_iter()
        .map(|d| (d.checkpoint, d.exactness))
        .collect()
}

fn offsets(cps: &[Checkpoint]) -> Vec<(&str, i64, i64)> {
    let mut v: Vec<_> = cps
        .iter()
        .map(|c| (c.group.as_str(), c.upstream_offset, c.downstream_offset))
        .collect();
    v.sort();
    v
}

#[test]
fn the_loop_is_not_loaded_until_checkpoints_syncs_and_group_offsets_are() {
    let n = names();
    let mut c = core(&n);
    let steps = [
        Event::Assigned(vec![3]),
        Event::CheckpointsLoaded,
        Event::SyncsLoaded,
        Event::CaughtUp(3),
    ];
    for step in steps {
        assert!(!c.loaded(), "not loaded before {step:?}");
        c.handle(step);
    }
    assert!(c.loaded());
    c.handle(Event::Assigned(vec![4]));
    assert!(
        !c.loaded(),
        "a newly assigned partition is read again first"
    );
}

#[test]
fn a_replica_assigned_no_partitions_is_loaded_once_checkpoints_and_syncs_are() {
    let n = names();
    let mut c = core(&n);
    c.handle(Event::CheckpointsLoaded);
    c.handle(Event::SyncsLoaded);
    assert!(!c.loaded(), "no assignment seen yet");
    c.handle(Event::Assigned(Vec::new()));
    assert!(c.loaded());
}

#[test]
fn nothing_is_evaluated_before_checkpoints_and_syncs_are_loaded_and_nothing_dirty_is_lost() {
    let n = names();
    let mut c = core(&n);
    c.handle(Event::Assigned(vec![0]));
    c.handle(Event::CaughtUp(0));
    c.handle(commit(0, "g", tp("t", 0), 10));
    c.handle(sync(tp("t", 0), 0, 100, 1));
    c.handle(sync(tp("t", 0), 20, 120, 1));
    assert!(!c.ready_to_evaluate());
    assert!(c.due_checkpoints().is_empty());
    assert_eq!(dirty(&c), BTreeSet::from([pair("g", tp("t", 0))]));

    c.handle(Event::SyncsLoaded);
    assert!(
        !c.ready_to_evaluate(),
        "the last checkpoints are not read yet"
    );
    assert!(c.due_checkpoints().is_empty());
    c.handle(Event::CheckpointsLoaded);
    assert!(c.ready_to_evaluate());
    assert_eq!(
        flush_acked(&mut c, at_ms(5_000)),
        [checkpoint("g", tp("A.t", 0), 10, 110)]
    );
    assert!(c.dirty.is_empty());
}

#[test]
fn replayed_history_is_evaluated_once_its_partition_caught_up_and_is_not_timed() {
    let n = names();
    let mut c = core(&n);
    c.handle(Event::CheckpointsLoaded);
    c.handle(Event::SyncsLoaded);
    c.handle(sync(tp("t", 0), 0, 100, 1));
    c.handle(Event::Assigned(vec![0]));
    c.handle(commit(0, "g", tp("t", 0), 5));
    c.handle(commit(0, "g", tp("t", 0), 7));
    c.handle(commit(0, "h", tp("t", 0), 3));
    assert!(c.dirty.is_empty(), "history is still being read");
    c.handle(Event::CaughtUp(0));
    assert_eq!(
        dirty(&c),
        BTreeSet::from([pair("g", tp("t", 0)), pair("h", tp("t", 0))])
    );
    let due = c.due_checkpoints();
    assert_eq!(due.len(), 2);
    assert!(
        due.iter().all(|d| d.live_since.is_none()),
        "a replayed commit has no latency to measure: {due:?}"
    );
    assert!(
        due.iter()
            .any(|d| d.checkpoint.group == "g" && d.checkpoint.upstream_offset == 7),
        "only the latest commit of a group counts: {due:?}"
    );
}

#[test]
fn a_live_commit_is_timed_until_its_checkpoint_is_written() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(sync(tp("t", 0), 0, 100, 1));
    c.handle(commit(0, "g", tp("t", 0), 0));
    let due = c.due_checkpoints();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].live_since, Some(COMMITTED_MS));
    assert_eq!(due[0].tp, tp("t", 0));
    c.written(
        &due[0].tp,
        &due[0].checkpoint,
        due[0].exactness,
        at_ms(9_000),
    );
    assert_eq!(c.commits.get("g", &tp("t", 0)).map(|c| c.live), Some(false));
    assert_eq!(c.tracker.last("g", &tp("A.t", 0)), Some((0, 100)));
    assert_eq!(c.last_checkpoint.get("g"), Some(&at_ms(9_000)));
    assert!(c.changed_groups.contains("g"));
}

#[test]
fn a_commit_that_translates_to_the_last_checkpoint_is_not_written_again() {
    let n = names();
    let mut c = loaded_core(&n);
    // An MM2 sync: every commit past it translates to the record after it.
    c.handle(Event::Sync(
        OffsetSync::new(tp("t", 0), 0, 100),
        SyncOrigin::Sparse,
        Some(1),
    ));
    c.handle(commit(0, "g", tp("t", 0), 10));
    assert_eq!(
        flush_acked(&mut c, at_ms(1)),
        [checkpoint("g", tp("A.t", 0), 10, 101)]
    );
    c.handle(commit(0, "g", tp("t", 0), 15));
    assert_eq!(dirty(&c), BTreeSet::from([pair("g", tp("t", 0))]));
    assert!(flush_acked(&mut c, at_ms(2)).is_empty());
    assert_eq!(
        c.commits.get("g", &tp("t", 0)).map(|c| c.live),
        Some(false),
        "nothing will come of it: no longer timed"
    );
    assert_eq!(c.last_checkpoint.get("g"), Some(&at_ms(1)));
}

#[test]
fn a_group_that_rewound_is_written_even_though_downstream_goes_back() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(sync(tp("t", 0), 0, 100, 1));
    c.handle(sync(tp("t", 0), 50, 150, 1));
    c.handle(commit(0, "g", tp("t", 0), 40));
    assert_eq!(offsets(&flush_acked(&mut c, at_ms(1))), [("g", 40, 140)]);
    c.handle(commit(0, "g", tp("t", 0), 10));
    assert_eq!(offsets(&flush_acked(&mut c, at_ms(2))), [("g", 10, 110)]);
}

#[test]
fn a_commit_on_a_topic_the_flow_does_not_mirror_writes_no_checkpoint() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(sync(tp("secret", 0), 0, 100, 1));
    c.handle(commit(0, "g", tp("secret", 0), 10));
    c.handle(commit(0, "g", tp("B.orders", 0), 10));
    assert!(flush_acked(&mut c, at_ms(1)).is_empty());
    assert_eq!(c.uncovered.get("g").map(HashSet::len), Some(0));
    assert_eq!(
        c.commits.get("g", &tp("secret", 0)).map(|c| c.live),
        Some(false)
    );
}

#[test]
fn a_commit_no_sync_covers_is_uncovered_until_a_sync_for_its_partition_lands() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(commit(0, "g", tp("t", 0), 10));
    assert!(flush_acked(&mut c, at_ms(1)).is_empty());
    assert_eq!(
        c.take_group_views(),
        [GroupView::Update {
            group: "g".into(),
            checkpoints: BTreeMap::new(),
            uncovered: 1,
            share: false,
        }]
    );
    assert_eq!(
        c.commits.get("g", &tp("t", 0)).map(|c| c.live),
        Some(true),
        "still waiting for its checkpoint"
    );

    c.handle(sync(tp("t", 0), 0, 100, 1));
    assert_eq!(offsets(&flush_acked(&mut c, at_ms(2))), [("g", 10, 101)]);
    assert_eq!(
        c.take_group_views(),
        [GroupView::Update {
            group: "g".into(),
            checkpoints: BTreeMap::from([(tp("A.t", 0), 101)]),
            uncovered: 0,
            share: false,
        }]
    );
}

#[test]
fn a_share_group_is_checkpointed_and_its_view_says_it_is_a_share_group() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(Event::ShareGroups(HashSet::from(["q".to_string()])));
    c.handle(sync(tp("t", 0), 0, 100, 1));
    c.handle(commit(0, "q", tp("t", 0), 10));
    c.handle(commit(1, "g", tp("t", 0), 10));
    assert_eq!(
        offsets(&flush_acked(&mut c, at_ms(2))),
        [("g", 10, 101), ("q", 10, 101)]
    );
    let mut views = c.take_group_views();
    views.sort_by_key(|v| format!("{v:?}"));
    let view = |group: &str, share| GroupView::Update {
        group: group.into(),
        checkpoints: BTreeMap::from([(tp("A.t", 0), 101)]),
        uncovered: 0,
        share,
    };
    assert_eq!(views, [view("g", false), view("q", true)]);
}

#[test]
fn a_sync_marks_its_partition_dirty_for_every_group_committed_on_it_and_no_other() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(commit(0, "g", tp("t", 0), 1));
    c.handle(commit(1, "h", tp("t", 0), 1));
    c.handle(commit(0, "k", tp("t", 1), 1));
    c.dirty.clear();
    c.handle(sync(tp("t", 0), 0, 0, 1));
    assert_eq!(
        dirty(&c),
        BTreeSet::from([pair("g", tp("t", 0)), pair("h", tp("t", 0))])
    );
    c.dirty.clear();
    c.handle(sync(tp("u", 0), 0, 0, 1));
    assert!(c.dirty.is_empty(), "no group committed on it");
}

#[test]
fn syncs_read_during_the_initial_load_dirty_nothing_until_it_ends_then_everything() {
    let n = names();
    let mut c = core(&n);
    c.handle(Event::CheckpointsLoaded);
    c.handle(Event::Assigned(vec![0]));
    c.handle(commit(0, "g", tp("t", 0), 1));
    c.handle(commit(0, "g", tp("t", 1), 1));
    c.handle(Event::CaughtUp(0));
    c.dirty.clear();
    c.handle(sync(tp("t", 0), 0, 0, 1));
    assert!(c.dirty.is_empty());
    c.handle(Event::SyncsLoaded);
    assert_eq!(
        dirty(&c),
        BTreeSet::from([pair("g", tp("t", 0)), pair("g", tp("t", 1))])
    );
}

#[test]
fn an_invalid_sync_is_ignored() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(commit(0, "g", tp("t", 0), 1));
    c.dirty.clear();
    c.handle(sync(tp("t", 0), -1, 5, 1));
    assert!(c.dirty.is_empty());
    assert!(c.store.partition(&tp("t", 0)).is_none());
}

#[test]
fn a_commit_of_a_partition_this_replica_does_not_own_is_ignored() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(commit(7, "g", tp("t", 0), 1));
    assert!(c.dirty.is_empty());
    assert!(!c.commits.is_owned_group("g"));
}

#[test]
fn a_failed_write_is_evaluated_again_at_the_next_flush() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(sync(tp("t", 0), 0, 100, 1));
    c.handle(commit(0, "g", tp("t", 0), 0));
    let due = c.due_checkpoints();
    assert_eq!(due.len(), 1);
    let Due {
        tp: source,
        checkpoint: cp,
        ..
    } = due[0].clone();
    c.write_failed(source, cp.clone());
    assert_eq!(dirty(&c), BTreeSet::from([pair("g", tp("t", 0))]));
    assert!(c.last_checkpoint.is_empty());
    assert_eq!(
        c.due_checkpoints()
            .into_iter()
            .map(|d| d.checkpoint)
            .collect::<Vec<_>>(),
        [cp],
        "nothing was recorded, so it is due again"
    );
}

#[test]
fn a_recreated_remote_partition_waits_for_its_new_logs_first_sync_then_is_written_lower() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(sync(tp("t", 0), 0, 0, 1_000));
    c.handle(sync(tp("t", 0), 50, 50, 1_000));
    c.handle(commit(0, "g", tp("t", 0), 50));
    assert_eq!(offsets(&flush_acked(&mut c, at_ms(2_000))), [("g", 50, 50)]);

    c.handle(Event::TargetRecreated {
        tp: tp("t", 0),
        detected_ms: 3_000,
    });
    assert_eq!(dirty(&c), BTreeSet::from([pair("g", tp("t", 0))]));
    assert!(
        flush_acked(&mut c, at_ms(3_100)).is_empty(),
        "the syncs are still the old log's"
    );
    c.handle(Event::TargetRecreated {
        tp: tp("t", 0),
        detected_ms: 2_500,
    });
    assert!(
        c.dirty.is_empty(),
        "an older recreation read late changes nothing"
    );

    c.handle(sync(tp("t", 0), 50, 0, 4_000));
    assert_eq!(
        offsets(&flush_acked(&mut c, at_ms(4_100))),
        [("g", 50, 0)],
        "the new log's checkpoint, lower than the gone log's"
    );
}

#[test]
fn a_recreation_read_before_the_syncs_are_loaded_dirties_nothing_yet() {
    let n = names();
    let mut c = core(&n);
    c.handle(Event::Assigned(vec![0]));
    c.handle(commit(0, "g", tp("t", 0), 1));
    c.handle(Event::CaughtUp(0));
    c.dirty.clear();
    c.handle(Event::TargetRecreated {
        tp: tp("t", 0),
        detected_ms: 3_000,
    });
    assert!(c.dirty.is_empty());
}

/// One step of a random run of the loop.
#[derive(Debug, Clone)]
enum Step {
    Commit {
        group: usize,
        partition: i32,
        offset: i64,
    },
    /// A sync `gap` records past the partition's previous one, `skipped` of them not copied.
    Sync {
        partition: i32,
        gap: i64,
        skipped: i64,
    },
    Flush,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3usize, 0..2i32, 0..300i64).prop_map(|(group, partition, offset)| Step::Commit {
            group,
            partition,
            offset
        }),
        (0..2i32, 1..40i64, 0..3i64).prop_map(|(partition, gap, skipped)| Step::Sync {
            partition,
            gap,
            skipped
        }),
        Just(Step::Flush),
    ]
}

proptest! {
    #[test]
    fn written_checkpoints_follow_mm2s_rule_and_nothing_is_written_twice(
        steps in proptest::collection::vec(step(), 1..120)
    ) {
        let n = names();
        let mut c = loaded_core(&n);
        let groups = ["g0", "g1", "g2"];
        let mut heads = [(0i64, 0i64); 2];
        let mut written: HashMap<(String, TopicPartition), (i64, i64, Exactness)> = HashMap::new();
        let mut ms = 0u64;
        let mut check = |cps: Vec<(Checkpoint, Exactness)>| -> Result<(), TestCaseError> {
            for (cp, exactness) in cps {
                let key = (cp.group.clone(), cp.topic_partition.clone());
                let now = (cp.upstream_offset, cp.downstream_offset);
                prop_assert!(exactness != Exactness::Unknown, "{key:?}: every write says");
                if let Some(&(up, down, was)) = written.get(&key) {
                    // MM2's rule; the one exception: the same offsets once more when a
                    // conservative checkpoint turned out exact (its header is all that changes).
                    let confirmed = now == (up, down)
                        && matches!(was, Exactness::Conservative { .. })
                        && exactness == Exactness::Exact;
                    prop_assert!(
                        now.0 < up || now.1 > down || confirmed,
                        "{key:?}: {now:?} {exactness:?} after {:?} {was:?}", (up, down)
                    );
                }
                written.insert(key, (now.0, now.1, exactness));
            }
            Ok(())
        };
        for s in steps {
            match s {
                Step::Commit { group, partition, offset } => c.handle(commit(
                    // A group's commits all land in one `__consumer_offsets` partition.
                    i32::from(group == 1),
                    groups[group],
                    tp("t", partition),
                    offset,
                )),
                Step::Sync { partition, gap, skipped } => {
                    let head = &mut heads[usize::try_from(partition).unwrap()];
                    head.0 += gap;
                    head.1 += gap - skipped.min(gap - 1);
                    c.handle(sync(tp("t", partition), head.0, head.1, 1));
                }
                Step::Flush => {
                    ms += 1;
                    check(flush_acked_with_exactness(&mut c, at_ms(ms)))?;
                }
            }
        }
        check(flush_acked_with_exactness(&mut c, at_ms(ms + 1)))?;
        prop_assert!(c.dirty.is_empty());
        // Every pair evaluated again with nothing new: nothing to write.
        c.handle(Event::SyncsLoaded);
        prop_assert!(c.due_checkpoints().is_empty());
    }

    #[test]
    fn the_loop_is_loaded_only_after_all_four_start_conditions_in_any_order(
        order in Just(vec![0usize, 1, 2, 3]).prop_shuffle()
    ) {
        let n = names();
        let mut c = core(&n);
        let mut seen = 0;
        for i in &order {
            prop_assert!(!c.loaded());
            c.handle(match i {
                0 => Event::CheckpointsLoaded,
                1 => Event::SyncsLoaded,
                // Caught up before the assignment: that end belongs to no owned partition.
                2 => Event::CaughtUp(0),
                _ => Event::Assigned(vec![0]),
            });
            seen += 1;
            if seen == 4 {
                let caught_up_first = order.iter().position(|&i| i == 2)
                    < order.iter().position(|&i| i == 3);
                prop_assert_eq!(c.loaded(), !caught_up_first);
            }
        }
        c.handle(Event::CaughtUp(0));
        prop_assert!(c.loaded());
    }
}
