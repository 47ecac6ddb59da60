//! Which written checkpoints were conservative translations, and when a checkpoint MM2's rule
//! would not write again is written anyway because it became exact.
//!
//! Every checkpoint carries its [`Exactness`] in [`crate::kafka::checkpoints::TRANSLATION_HEADER`]
//! for the operator's probe. A conservative checkpoint becomes exact once the copy's offset sync
//! covers its commit; usually the exact translation lies further downstream, so MM2's rule
//! writes it anyway. When it lands on the same offsets (the records between the newest sync
//! and the commit were not there, e.g. transaction markers), MM2's rule would keep the
//! conservative record for good and the group would look like it re-reads records forever:
//! the same key and value are written again with the exact header (MM2's readers see the same
//! checkpoint twice; compaction keeps one).

use std::collections::HashMap;

use crate::kafka::checkpoints::Exactness;
use crate::mm2::{Checkpoint, TopicPartition};

/// Per group, the TARGET partitions whose latest checkpoint (written here, or read back from
/// the topic) was a conservative translation. Kept as long as the tracker keeps the pair (also
/// while another replica owns the group), so a group that comes back is still made exact.
#[derive(Debug, Default)]
pub struct Conservative {
    /// Per group, per target partition, the records its translation said a failover may re-read.
    groups: HashMap<String, HashMap<TopicPartition, u64>>,
}

impl Conservative {
    /// `cp` is the pair's latest checkpoint, with what its writer said of it.
    pub fn record(&mut self, cp: &Checkpoint, exactness: Exactness) {
        match exactness {
            Exactness::Conservative { max_replay } => {
                self.groups
                    .entry(cp.group.clone())
                    .or_default()
                    .insert(cp.topic_partition.clone(), max_replay);
            }
            // Exact, or a writer that did not say (MM2): nothing to make exact later.
            Exactness::Exact | Exactness::Unknown => self.forget(&cp.group, &cp.topic_partition),
        }
    }

    pub fn contains(&self, group: &str, target: &TopicPartition) -> bool {
        self.max_replay(group, target).is_some()
    }

    /// What the latest checkpoint's translation said a failover may re-read, when conservative.
    pub fn max_replay(&self, group: &str, target: &TopicPartition) -> Option<u64> {
        self.groups.get(group)?.get(target).copied()
    }

    pub fn forget(&mut self, group: &str, target: &TopicPartition) {
        if let Some(g) = self.groups.get_mut(group) {
            g.remove(target);
            if g.is_empty() {
                self.groups.remove(group);
            }
        }
    }
}

/// Whether a translation MM2's rule does not emit (`last` is the pair's latest checkpoint,
/// `(upstream, downstream)`) is written anyway: it is exact, the latest was conservative, and
/// its downstream offset does not go back (a checkpoint never does).
pub fn restamp(
    last_conservative: bool,
    last: Option<(i64, i64)>,
    downstream: i64,
    exactness: Exactness,
) -> bool {
    last_conservative
        && exactness == Exactness::Exact
        && last.is_some_and(|(_, last_down)| downstream >= last_down)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_exact_translation_replaces_a_conservative_checkpoint_in_place() {
        let conservative = Exactness::Conservative { max_replay: 59 };
        // (latest was conservative, latest (up, down), new downstream, new exactness) -> written
        let cases = [
            (true, Some((60, 1)), 1, Exactness::Exact, true),
            (true, Some((60, 1)), 2, Exactness::Exact, true),
            (true, Some((60, 5)), 4, Exactness::Exact, false),
            (true, Some((60, 1)), 1, conservative, false),
            (true, Some((60, 1)), 1, Exactness::Unknown, false),
            (false, Some((60, 1)), 1, Exactness::Exact, false),
            (true, None, 1, Exactness::Exact, false),
        ];
        for (last_conservative, last, down, exactness, want) in cases {
            assert_eq!(
                restamp(last_conservative, last, down, exactness),
                want,
                "{last_conservative} {last:?} {down} {exactness:?}"
            );
        }
    }

    #[test]
    fn the_latest_checkpoint_of_a_pair_decides() {
        let cp = |group: &str, p: i32| Checkpoint {
            group: group.into(),
            topic_partition: TopicPartition::new("A.t", p),
            upstream_offset: 60,
            downstream_offset: 1,
            metadata: String::new(),
        };
        let mut c = Conservative::default();
        c.record(&cp("g", 0), Exactness::Conservative { max_replay: 59 });
        c.record(&cp("g", 1), Exactness::Conservative { max_replay: 3 });
        c.record(&cp("h", 0), Exactness::Conservative { max_replay: 3 });
        assert!(c.contains("g", &TopicPartition::new("A.t", 0)));
        c.record(&cp("g", 0), Exactness::Exact);
        assert!(!c.contains("g", &TopicPartition::new("A.t", 0)));
        c.record(&cp("g", 1), Exactness::Unknown);
        assert!(
            !c.contains("g", &TopicPartition::new("A.t", 1)),
            "MM2 wrote over it: nothing of ours to make exact"
        );
        assert!(!c.groups.contains_key("g"), "an emptied group goes");
        c.forget("h", &TopicPartition::new("A.t", 0));
        assert!(!c.contains("h", &TopicPartition::new("A.t", 0)));
    }

    /// The loop's core, loaded, owning `__consumer_offsets` partition 0, with `g` committed at
    /// 60 on `t-0`, and the checkpoints it writes (acknowledged at once).
    mod in_the_loop {
        use std::time::{Duration, UNIX_EPOCH};

        use super::*;
        use crate::mm2::{Filters, OffsetSync, PrefixPolicy, SyncOrigin};
        use crate::replicator::checkpoint::state::{Commit, Naming};
        use crate::replicator::checkpoint::{Core, Due, Event};

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
            let policy = PrefixPolicy::default();
            let filters = Filters::new(&[".*"], &[] as &[&str], &[".*"], &[] as &[&str])
                .expect("valid filters");
            let mut c = Core::new(Naming {
                policy: &policy,
                filters: &filters,
                source_alias: "A",
                target_alias: "B",
            });
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
    }
}
