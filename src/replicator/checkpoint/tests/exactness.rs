//! Conservative and exact checkpoints in the loop ([`super::super::exactness`]): its core,
//! loaded, owning `__consumer_offsets` partition 0, with `g` committed at 60 on `t-0`, and the
//! checkpoints it writes (acknowledged at once).

use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::mm2::{OffsetSync, SyncOrigin};
use crate::replicator::checkpoint::core::{Core, Due};
use crate::replicator::checkpoint::events::Event;
use crate::replicator::checkpoint::state::Commit;

fn sync(up: i64, down: i64) -> Event {
    Event::Sync(
        OffsetSync::new(TopicPartition::new("t", 0), up, down),
        SyncOrigin::Dense,
        Some(1),
    )
}

fn flush(c: &mut Core<'_>) -> Vec<Written> {
    let due: Vec<Due> = c.due_checkpoints();
    for d in &due {
        c.written(
            &d.tp,
            &d.checkpoint,
            d.exactness,
            UNIX_EPOCH + Duration::from_secs(1),
        );
    }
    due.into_iter()
        .map(|d| {
            (
                d.checkpoint.upstream_offset,
                d.checkpoint.downstream_offset,
                d.exactness,
            )
        })
        .collect()
}

/// (upstream, downstream, exactness) of a checkpoint.
type Written = (i64, i64, Exactness);
/// What the loop reads in a step.
enum Read {
    /// An offset sync (upstream, downstream) of `t-0`.
    Synced(i64, i64),
    /// `__consumer_offsets` partition 0 goes to another replica, and comes back.
    Reassigned,
}
/// What the loop reads, then the checkpoints due.
type Step<'a> = (&'a [Read], &'a [Written]);

fn commit_60() -> Event {
    Event::Commit {
        co_partition: 0,
        group: "g".into(),
        tp: TopicPartition::new("t", 0),
        commit: Some(Commit {
            offset: 60,
            metadata: String::new(),
            commit_timestamp_ms: 1,
            live: false,
        }),
    }
}

/// `read_back`: the checkpoint of `g` on `A.t-0` in the topic at start.
fn run(read_back: Option<Written>, steps: &[Step]) {
    let n = names();
    let mut c = core(&n);
    if let Some((up, down, exactness)) = read_back {
        let cp = Checkpoint {
            group: "g".into(),
            topic_partition: TopicPartition::new("A.t", 0),
            upstream_offset: up,
            downstream_offset: down,
            metadata: String::new(),
        };
        c.handle(Event::CheckpointRead(cp, Some(1), exactness));
    }
    for event in [
        Event::CheckpointsLoaded,
        Event::SyncsLoaded,
        Event::Assigned(vec![0]),
        Event::CaughtUp(0),
        commit_60(),
    ] {
        c.handle(event);
    }
    for (i, (reads, want)) in steps.iter().enumerate() {
        for read in reads.iter() {
            match *read {
                Read::Synced(up, down) => c.handle(sync(up, down)),
                Read::Reassigned => {
                    for e in [
                        Event::Revoked(vec![0]),
                        Event::Assigned(vec![0]),
                        commit_60(),
                        Event::CaughtUp(0),
                    ] {
                        c.handle(e);
                    }
                }
            }
        }
        assert_eq!(flush(&mut c), *want, "step {i}");
    }
}

use Read::{Reassigned, Synced};
const EXACT: Exactness = Exactness::Exact;
const BY_59: Exactness = Exactness::Conservative { max_replay: 59 };

#[test]
fn a_commit_past_the_newest_sync_is_written_conservative_then_exact_when_covered() {
    run(
        None,
        &[
            // Only the first record's sync: 60 is past it, 59 records may lie between.
            (&[Synced(0, 7)], &[(60, 8, BY_59)]),
            // The copy's sync past the commit, same delta: the run covers 60 exactly.
            (&[Synced(99, 106)], &[(60, 67, EXACT)]),
            (&[Synced(120, 127)], &[]),
        ],
    );
}

#[test]
fn an_exact_translation_onto_the_same_offsets_is_written_again_once() {
    run(
        None,
        &[
            (&[Synced(0, 7)], &[(60, 8, BY_59)]),
            // Source offsets 1..=59 held no record (compaction): 60 landed right after 0,
            // where the conservative checkpoint already points. MM2's rule writes nothing.
            (&[Synced(60, 8)], &[(60, 8, EXACT)]),
            (&[Synced(61, 9)], &[]),
        ],
    );
}

#[test]
fn a_conservative_checkpoint_read_back_at_start_is_made_exact_in_place() {
    // Another replica (or this one before a restart) wrote it; the header says so.
    run(
        Some((60, 8, BY_59)),
        &[
            (&[Synced(0, 7)], &[]),
            (&[Synced(60, 8)], &[(60, 8, EXACT)]),
        ],
    );
    // MM2 wrote it: no evidence to correct, MM2's rule alone.
    run(
        Some((60, 8, Exactness::Unknown)),
        &[(&[Synced(0, 7)], &[]), (&[Synced(60, 8)], &[])],
    );
}

#[test]
fn a_group_that_left_and_came_back_is_still_made_exact() {
    run(
        None,
        &[
            (&[Synced(0, 7)], &[(60, 8, BY_59)]),
            (&[Reassigned], &[]),
            (&[Synced(60, 8)], &[(60, 8, EXACT)]),
        ],
    );
}
