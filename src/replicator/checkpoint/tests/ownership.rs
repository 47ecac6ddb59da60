//! Who owns a group's checkpoints: commits deleted, partitions revoked, checkpoints read back
//! from another owner, a frozen loop, and the ages the status reads.

use super::*;

#[test]
fn a_deleted_commit_leaves_the_groups_view_and_the_last_one_forgets_the_group() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(sync(tp("t", 0), 0, 100, 1));
    c.handle(sync(tp("t", 1), 0, 200, 1));
    c.handle(commit(0, "g", tp("t", 0), 0));
    c.handle(commit(0, "g", tp("t", 1), 0));
    c.handle(commit(0, "g", tp("t", 2), 0));
    flush_acked(&mut c, at_ms(1));
    assert_eq!(c.uncovered.get("g").map(HashSet::len), Some(1));
    c.take_group_views();

    c.handle(deletion(0, "g", tp("t", 2)));
    c.handle(deletion(0, "g", tp("t", 1)));
    assert!(c.dirty.is_empty(), "a deletion writes nothing");
    assert!(c.forgotten.is_empty());
    assert_eq!(
        c.take_group_views(),
        [GroupView::Update {
            group: "g".into(),
            checkpoints: BTreeMap::from([(tp("A.t", 0), 100)]),
            uncovered: 0,
            share: false,
        }]
    );

    c.handle(commit(0, "g", tp("t", 0), 5));
    c.handle(deletion(0, "g", tp("t", 0)));
    assert!(
        c.dirty.is_empty(),
        "the forgotten group's pending pair is gone"
    );
    assert_eq!(c.forgotten, ["g"]);
    assert!(!c.uncovered.contains_key("g"));
    assert_eq!(c.take_group_views(), [GroupView::Forget("g".into())]);
}

#[test]
fn a_revoked_partition_forgets_its_groups_and_their_pending_work() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(commit(0, "g", tp("t", 0), 1));
    c.handle(commit(1, "h", tp("t", 0), 1));
    assert!(
        flush_acked(&mut c, at_ms(1)).is_empty(),
        "no syncs: uncovered"
    );
    c.handle(commit(0, "g", tp("t", 1), 1));
    c.handle(commit(1, "h", tp("t", 1), 1));
    c.handle(Event::Revoked(vec![0]));
    assert_eq!(dirty(&c), BTreeSet::from([pair("h", tp("t", 1))]));
    assert_eq!(c.forgotten, ["g"]);
    assert!(!c.uncovered.contains_key("g") && c.uncovered.contains_key("h"));
    let views = c.take_group_views();
    assert_eq!(views.first(), Some(&GroupView::Forget("g".into())));
    assert!(
        views
            .iter()
            .all(|v| !matches!(v, GroupView::Update { group, .. } if group == "g")),
        "{views:?}"
    );
    c.handle(sync(tp("t", 0), 0, 0, 1));
    assert_eq!(
        dirty(&c),
        BTreeSet::from([pair("h", tp("t", 0)), pair("h", tp("t", 1))]),
        "syncs no longer concern the groups that left"
    );
}

/// A revocation's hand-over is answered after the revoked groups are forgotten, a failed
/// write waiting for its retry included: nothing decided for them is written after it.
#[test]
fn a_hand_over_is_answered_with_the_revoked_groups_and_their_retries_forgotten() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(sync(tp("t", 0), 0, 0, 1));
    c.handle(commit(0, "g", tp("t", 0), 1));
    c.handle(commit(1, "h", tp("t", 0), 1));
    let due = c.due_checkpoints();
    assert_eq!(due.len(), 2, "{due:?}");
    for d in due {
        c.write_failed(d.tp, d.checkpoint);
    }
    let (settled, answer) = std::sync::mpsc::channel();
    c.handle(Event::Revoked(vec![0]));
    c.handle(Event::Handover(settled));
    assert_eq!(answer.try_recv(), Ok(()));
    let retried: Vec<String> = c
        .due_checkpoints()
        .into_iter()
        .map(|d| d.checkpoint.group)
        .collect();
    assert_eq!(retried, ["h"], "the revoked group's retry is dropped");
}

#[test]
fn a_forgotten_group_is_told_before_its_next_view_even_when_the_channel_was_full() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(commit(0, "g", tp("t", 0), 1));
    c.handle(commit(1, "h", tp("t", 0), 1));
    flush_acked(&mut c, at_ms(1));
    c.take_group_views();
    c.handle(Event::Revoked(vec![0]));
    c.handle(Event::Assigned(vec![0]));
    c.handle(commit(0, "g", tp("t", 0), 2));
    c.handle(Event::CaughtUp(0));
    flush_acked(&mut c, at_ms(2));
    let views = c.take_group_views();
    assert_eq!(
        views,
        [
            GroupView::Forget("g".into()),
            GroupView::Update {
                group: "g".into(),
                checkpoints: BTreeMap::new(),
                uncovered: 1,
                share: false,
            }
        ]
    );
    // A full channel refused them all: the next send repeats them, in the same order.
    c.unsent_group_views(views.clone());
    assert!(c.has_group_views());
    assert_eq!(c.take_group_views(), views);
    // It took the `Forget` only.
    c.unsent_group_views(views[1..].to_vec());
    assert_eq!(c.take_group_views(), views[1..]);
    assert!(!c.has_group_views());
}

#[test]
fn without_a_group_sync_task_the_views_are_dropped() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(commit(0, "g", tp("t", 0), 1));
    flush_acked(&mut c, at_ms(1));
    c.handle(deletion(0, "g", tp("t", 0)));
    assert!(c.has_group_views());
    c.discard_group_views();
    assert!(!c.has_group_views());
    assert!(c.take_group_views().is_empty());
}

#[test]
fn checkpoints_read_back_rebuild_the_tracker_but_never_roll_back_an_owned_group() {
    let n = names();
    let mut c = core(&n);
    c.handle(Event::Assigned(vec![0]));
    c.handle(commit(0, "g", tp("t", 0), 10));
    c.handle(Event::CaughtUp(0));
    c.handle(Event::CheckpointRead(
        checkpoint("g", tp("A.t", 0), 10, 150),
        Some(1_000),
        Exactness::Unknown,
    ));
    c.handle(Event::CheckpointsLoaded);
    c.handle(sync(tp("t", 0), 0, 100, 1));
    c.handle(Event::SyncsLoaded);
    assert!(
        flush_acked(&mut c, at_ms(2_000)).is_empty(),
        "the checkpoint read at start is past this translation: never backwards"
    );

    c.handle(Event::CheckpointRead(
        checkpoint("g", tp("A.t", 0), 1, 1),
        Some(1_500),
        Exactness::Unknown,
    ));
    assert_eq!(
        c.tracker.last("g", &tp("A.t", 0)),
        Some((10, 150)),
        "an owned group's read-back is ignored once loaded"
    );
    c.handle(Event::CheckpointRead(
        checkpoint("other", tp("A.t", 0), 1, 1),
        Some(1_500),
        Exactness::Unknown,
    ));
    assert_eq!(
        c.tracker.last("other", &tp("A.t", 0)),
        Some((1, 1)),
        "another replica's group is followed"
    );
    assert_eq!(c.last_checkpoint.get("other"), Some(&at_ms(1_500)));
}

/// The chaos test's failure (exactly-once, a replica frozen past its session timeout): the
/// frozen replica comes back owning the group again, with offset syncs that lag; meanwhile
/// another replica checkpointed the group from fresher syncs. Its conservative translation
/// of the same commit must not be written after theirs.
#[test]
fn after_an_assignment_another_owners_later_checkpoints_are_read_before_anything_is_written() {
    let n = names();
    let mut c = core(&n);
    let (marks, requests) = std::sync::mpsc::channel();
    c.marks = Some(marks);
    for event in [
        Event::CheckpointsLoaded,
        Event::SyncsLoaded,
        Event::Assigned(vec![3]),
    ] {
        c.handle(event);
    }
    assert_eq!(
        requests.try_recv().ok(),
        Some(1),
        "a mark asked for at the assignment"
    );
    c.handle(sync(tp("t", 1), 399, 400, 1));
    c.handle(commit(3, "g", tp("t", 1), 399));
    c.handle(Event::CaughtUp(3));
    assert!(
        flush_acked(&mut c, at_ms(1)).is_empty(),
        "nothing before the mark"
    );
    c.handle(Event::CheckpointsMark(1));
    assert_eq!(
        flush_acked(&mut c, at_ms(2)),
        [checkpoint("g", tp("A.t", 1), 399, 400)]
    );

    // Frozen; the group moved to another replica, which wrote from syncs this one lacks;
    // back, this replica loses the partition and is given it again.
    c.handle(Event::Revoked(vec![3]));
    c.handle(Event::Assigned(vec![3]));
    assert_eq!(requests.try_recv().ok(), Some(2));
    c.handle(commit(3, "g", tp("t", 1), 4563));
    c.handle(Event::CaughtUp(3));
    assert!(
        flush_acked(&mut c, at_ms(3)).is_empty(),
        "nothing before the mark, though the commit is dirty"
    );
    c.handle(Event::CheckpointRead(
        checkpoint("g", tp("A.t", 1), 4563, 4565),
        Some(3),
        Exactness::Unknown,
    ));
    // A read-back of this replica's own older write does not roll the tracker back.
    c.handle(Event::CheckpointRead(
        checkpoint("g", tp("A.t", 1), 399, 400),
        Some(4),
        Exactness::Unknown,
    ));
    c.handle(Event::CheckpointsMark(2));
    assert_eq!(c.tracker.last("g", &tp("A.t", 1)), Some((4563, 4565)));
    assert!(
        flush_acked(&mut c, at_ms(4)).is_empty(),
        "4563 translates to 401 through the lagging syncs: behind the other owner's 4565"
    );
    c.handle(sync(tp("t", 1), 4600, 4602, 5));
    assert!(
        flush_acked(&mut c, at_ms(5)).is_empty(),
        "still not past 4565"
    );
    c.handle(commit(3, "g", tp("t", 1), 4601));
    assert_eq!(
        flush_acked(&mut c, at_ms(6)),
        [checkpoint("g", tp("A.t", 1), 4601, 4603)]
    );
}

#[test]
fn a_mark_of_an_older_assignment_does_not_end_the_wait_for_a_newer_one() {
    let n = names();
    let mut c = core(&n);
    let (marks, _requests) = std::sync::mpsc::channel();
    c.marks = Some(marks);
    for event in [
        Event::CheckpointsLoaded,
        Event::SyncsLoaded,
        Event::Assigned(vec![0]),
        Event::Assigned(vec![1]),
        Event::CaughtUp(0),
        Event::CaughtUp(1),
        Event::CheckpointsMark(1),
    ] {
        c.handle(event);
    }
    assert!(!c.ready_to_evaluate(), "mark 2 is awaited");
    assert!(c.loaded(), "readiness does not wait for marks");
    c.handle(Event::CheckpointsMark(2));
    assert!(c.ready_to_evaluate());
}

/// The chaos test's failure (at least once, a replica SIGSTOPped for 10 s): on SIGCONT the
/// frozen replica still counted itself the owner and its tracker had not read what others
/// checkpointed meanwhile, so a verification it had finished was stated on a checkpoint older
/// than theirs (a checkpoint going backwards). A loop that waited past `FROZEN_AFTER` for its
/// turn writes nothing until the checkpoints topic is read to its end; a normal wait changes
/// nothing.
#[test]
fn a_loop_that_was_frozen_writes_nothing_until_it_read_the_checkpoints_topic_again() {
    let n = names();
    let (marks, requests) = std::sync::mpsc::channel();
    let mut c = owning_core(core(&n), marks);
    assert_eq!(requests.try_recv().ok(), Some(1));
    assert!(c.ready_to_evaluate());
    c.resumed_after(Duration::from_millis(1_200));
    assert!(c.ready_to_evaluate(), "a tick's wait is not a freeze");
    assert!(requests.try_recv().is_err());
    c.resumed_after(Duration::from_secs(10));
    assert!(!c.ready_to_evaluate(), "frozen: nothing is written");
    assert_eq!(requests.try_recv().ok(), Some(2), "a mark asked for");
    c.handle(Event::CheckpointsMark(2));
    assert!(c.ready_to_evaluate());
}

#[test]
fn a_groups_last_checkpoint_time_is_the_newest_read_back() {
    let n = names();
    let mut c = core(&n);
    for ms in [Some(5_000), Some(3_000), None, Some(-1)] {
        c.handle(Event::CheckpointRead(
            checkpoint("g", tp("A.t", 0), 1, 1),
            ms,
            Exactness::Unknown,
        ));
    }
    assert_eq!(c.last_checkpoint.get("g"), Some(&at_ms(5_000)));
}

#[test]
fn checkpoint_ages_cover_owned_groups_with_a_known_checkpoint_time() {
    let n = names();
    let mut c = loaded_core(&n);
    c.handle(commit(0, "g", tp("t", 0), 1));
    c.handle(commit(0, "fresh", tp("t", 0), 1));
    c.last_checkpoint.insert("g".into(), at_ms(4_000));
    c.last_checkpoint.insert("elsewhere".into(), at_ms(4_000));
    assert_eq!(
        c.checkpoint_ages(at_ms(10_000)),
        [("g", Duration::from_secs(6))]
    );
    assert_eq!(
        c.checkpoint_ages(at_ms(1_000)),
        [("g", Duration::ZERO)],
        "a clock that went back reads as no age"
    );
}

/// With a short session a shorter wait counts as a freeze: the groups may have moved sooner.
#[test]
fn a_short_write_deadline_counts_a_shorter_wait_as_frozen() {
    let n = names();
    let (marks, requests) = std::sync::mpsc::channel();
    for (deadline, frozen) in [
        (Duration::from_secs(21), false),
        (Duration::from_millis(2_500), true),
    ] {
        let mut c = owning_core(core(&n).with_write_deadline(deadline), marks.clone());
        while requests.try_recv().is_ok() {}
        c.resumed_after(Duration::from_secs(3));
        assert_eq!(!c.ready_to_evaluate(), frozen, "deadline {deadline:?}");
    }
}

/// `c` with its inputs loaded, `__consumer_offsets` partition 0 assigned and caught up, and the
/// assignment's mark (1, asked through `marks`) reached: ready to write.
fn owning_core<'a>(mut c: Core<'a>, marks: std::sync::mpsc::Sender<u64>) -> Core<'a> {
    c.marks = Some(marks);
    for event in [
        Event::CheckpointsLoaded,
        Event::SyncsLoaded,
        Event::Assigned(vec![0]),
        Event::CaughtUp(0),
        Event::CheckpointsMark(1),
    ] {
        c.handle(event);
    }
    c
}
