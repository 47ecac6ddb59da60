//! Downstream -> upstream translation of one partition's offset syncs: [`InverseSyncs`].
//!
//! A failback moves a consumer group from the remote topic on the old target (`a.orders`) back
//! to the original topic on the old source (`orders`). No flow can checkpoint that direction
//! (a reverse flow never copies `a.orders` back: MM2's cycle rule), but the forward flow's offset
//! syncs already pair every source offset they cover with its target offset; read backwards they
//! turn the group's committed offset on the remote topic into an offset on the original topic.
//!
//! # Rules (the mirror image of [`super::OffsetSyncStore`]'s)
//! `c` is the committed offset on the target partition: the group consumed every target record
//! below `c`. The answer `u` must never skip: every source record at or after `u` that the group
//! has not consumed on the target must still be read.
//! - `c` equal to a sync's downstream offset: that sync's upstream offset, exactly.
//! - Between two consecutive syncs `s`, `n` that a dense writer wrote (our source loop, see
//!   [`super::SyncPolicy`]) with `n` upstream of `s`: the records from `s` on were copied with one
//!   delta and contiguous offsets until the next sync, so `s.up + (c - s.down)` is exact while
//!   it is at most `n.up`. Past that the target moved further than the source between the two
//!   syncs: records not copied from this partition (a dense writer syncs at the next source
//!   record, so `n.up` is exact) or a writer restart that re-copied (the group is further on);
//!   the wire cannot tell them apart, so `n.up` is returned as conservative.
//! - Otherwise (MM2's sparse syncs, a writer restart that re-copied, the newest sync): `s.up + 1`,
//!   since the record at `s.up` was consumed; it may re-read up to
//!   `min(c - s.down - 1, n.up - s.up - 1)` records and is exact when that bound is 0 (e.g. a
//!   group that consumed exactly up to an idle partition's tail sync).
//! - `c` below every retained sync (compaction keeps a suffix): no answer.
//!
//! A target offset that went backwards (topic recreated or truncated on the target) voids
//! everything read before it: those target offsets now name other records.

use super::SyncOrigin;
use super::store::{Translation, UnknownReason};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sync {
    up: i64,
    down: i64,
    dense: bool,
}

/// The offset syncs of one source partition, in the order read, for inverse translation.
#[derive(Debug, Clone, Default)]
pub struct InverseSyncs {
    /// Strictly increasing `down` (see [`Self::push`]).
    syncs: Vec<Sync>,
}

impl InverseSyncs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one sync in the order it was read from the offset-syncs topic. Negative offsets
    /// are not positions and are ignored.
    pub fn push(&mut self, upstream: i64, downstream: i64, origin: SyncOrigin) {
        if upstream < 0 || downstream < 0 {
            return;
        }
        let sync = Sync {
            up: upstream,
            down: downstream,
            dense: origin == SyncOrigin::Dense,
        };
        match self.syncs.last() {
            Some(last) if downstream == last.down && upstream == last.up => {}
            Some(last) if downstream <= last.down => {
                // Target reset: older target offsets now belong to other records.
                self.syncs.clear();
                self.syncs.push(sync);
            }
            _ => self.syncs.push(sync),
        }
    }

    pub fn len(&self) -> usize {
        self.syncs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.syncs.is_empty()
    }

    /// Oldest target offset that can be translated back.
    pub fn oldest_downstream(&self) -> Option<i64> {
        self.syncs.first().map(|s| s.down)
    }

    /// The source offset to commit for a group that committed `committed` on the target.
    pub fn translate(&self, committed: i64) -> Translation {
        if committed < 0 {
            return Translation::Unknown(UnknownReason::NegativeOffset);
        }
        let idx = self.syncs.partition_point(|s| s.down <= committed);
        let Some(s) = idx.checked_sub(1).and_then(|i| self.syncs.get(i)) else {
            return Translation::Unknown(match self.syncs.first() {
                Some(oldest) => UnknownReason::OlderThanOldestSync {
                    oldest: oldest.down,
                },
                None => UnknownReason::NoSyncs,
            });
        };
        let c = committed;
        if c == s.down {
            return Translation::Exact(s.up);
        }
        let next = self.syncs.get(idx);
        if let Some(n) = next
            && s.dense
            && n.dense
            && n.up > s.up
        {
            let (run, moved) = (n.up - s.up, c - s.down);
            if moved <= run {
                return Translation::Exact(s.up.saturating_add(moved));
            }
            // The target moved further than the source: records not copied from this
            // partition (then `n.up` is exact) or a writer restart that re-copied (then the
            // group is further on): `n.up` never skips, the difference may be re-read.
            return match u64::try_from(moved - run) {
                Ok(max_replay) if max_replay > 0 => Translation::Conservative {
                    offset: n.up,
                    max_replay,
                },
                _ => Translation::Exact(n.up),
            };
        }
        // Consumed target records past `s.down` each hold a distinct source record after `s.up`,
        // and all of them lie before `n.up` when the source moved forward.
        let by_downstream = c - s.down - 1;
        let bound = match next {
            Some(n) if n.up > s.up => by_downstream.min(n.up - s.up - 1),
            _ => by_downstream,
        };
        let offset = s.up.saturating_add(1);
        match u64::try_from(bound.max(0)) {
            Ok(0) | Err(_) => Translation::Exact(offset),
            Ok(max_replay) => Translation::Conservative { offset, max_replay },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SyncOrigin::{Dense, Sparse};

    fn syncs(list: &[(i64, i64, SyncOrigin)]) -> InverseSyncs {
        let mut s = InverseSyncs::new();
        for &(u, d, o) in list {
            s.push(u, d, o);
        }
        s
    }

    #[test]
    fn nothing_known_translates_to_unknown() {
        let s = InverseSyncs::new();
        assert_eq!(s.translate(5), Translation::Unknown(UnknownReason::NoSyncs));
        let s = syncs(&[(10, 20, Dense)]);
        assert_eq!(
            s.translate(-1),
            Translation::Unknown(UnknownReason::NegativeOffset)
        );
        assert_eq!(
            s.translate(19),
            Translation::Unknown(UnknownReason::OlderThanOldestSync { oldest: 20 })
        );
    }

    #[test]
    fn a_sync_point_is_exact() {
        let s = syncs(&[(10, 20, Sparse), (50, 60, Sparse)]);
        assert_eq!(s.translate(20), Translation::Exact(10));
        assert_eq!(s.translate(60), Translation::Exact(50));
    }

    #[test]
    fn inside_a_dense_run_is_exact() {
        // Periodic dense syncs with one delta (+10).
        let s = syncs(&[(0, 10, Dense), (100, 110, Dense), (200, 210, Dense)]);
        assert_eq!(s.translate(11), Translation::Exact(1));
        assert_eq!(s.translate(57), Translation::Exact(47));
        assert_eq!(s.translate(150), Translation::Exact(140));
    }

    #[test]
    fn a_source_gap_inside_a_dense_pair_stays_exact() {
        // Records 0..=9 at 5..=14, then a transaction marker at source 10: next record 11 at 15.
        let s = syncs(&[(0, 5, Dense), (11, 15, Dense)]);
        for c in 5..=14 {
            assert_eq!(s.translate(c), Translation::Exact(c - 5), "c={c}");
        }
        assert_eq!(s.translate(15), Translation::Exact(11));
    }

    #[test]
    fn foreign_target_records_inside_a_dense_pair_map_to_the_next_source_record() {
        // Source 0..=4 at 0..=4, then 3 records written to the target by someone else (5..=7),
        // then source 5 at 8 (delta changed: a dense sync).
        let s = syncs(&[(0, 0, Dense), (5, 8, Dense)]);
        assert_eq!(s.translate(4), Translation::Exact(4));
        assert_eq!(s.translate(5), Translation::Exact(5));
        // Indistinguishable from a restart that re-copied: the right answer, not claimed exact.
        assert_eq!(
            s.translate(7),
            Translation::Conservative {
                offset: 5,
                max_replay: 2
            }
        );
        assert_eq!(s.translate(8), Translation::Exact(5));
    }

    #[test]
    fn sparse_pairs_are_conservative_and_bounded() {
        // MM2 syncs every 100 records: between them, MM2's own rule backwards.
        let s = syncs(&[(0, 10, Sparse), (100, 110, Sparse)]);
        assert_eq!(
            s.translate(50),
            Translation::Conservative {
                offset: 1,
                max_replay: 39
            }
        );
        // Just past a sync: the next record, exactly.
        assert_eq!(s.translate(11), Translation::Exact(1));
        // Bounded by the next sync's source offset when that is closer.
        let s = syncs(&[(0, 10, Sparse), (5, 110, Sparse)]);
        assert_eq!(
            s.translate(100),
            Translation::Conservative {
                offset: 1,
                max_replay: 4
            }
        );
    }

    #[test]
    fn a_dense_sync_followed_by_a_sparse_one_is_not_trusted() {
        let s = syncs(&[(0, 10, Dense), (100, 110, Sparse)]);
        assert!(!s.translate(50).is_exact());
        assert!(s.translate(50).offset() <= Some(40));
    }

    #[test]
    fn the_tail_after_the_newest_sync_is_conservative_except_right_after_it() {
        let s = syncs(&[(0, 10, Dense), (49, 59, Dense)]);
        assert_eq!(s.translate(60), Translation::Exact(50));
        assert_eq!(
            s.translate(65),
            Translation::Conservative {
                offset: 50,
                max_replay: 5
            }
        );
    }

    #[test]
    fn a_writer_restart_that_re_copied_never_skips() {
        // Source 0..=49 copied to 0..=49, restart re-copies from source 40 at target 50.
        let s = syncs(&[(0, 0, Dense), (40, 50, Dense), (80, 90, Dense)]);
        // Consumed target 0..=44 = source 0..=44: 40 re-reads 5, and says so.
        assert_eq!(
            s.translate(45),
            Translation::Conservative {
                offset: 40,
                max_replay: 5
            }
        );
        assert_eq!(s.translate(38), Translation::Exact(38));
        // Consumed the second copy up to source 59: exact in the re-copied run.
        assert_eq!(s.translate(70), Translation::Exact(60));
    }

    #[test]
    fn a_target_reset_voids_older_syncs() {
        let s = syncs(&[(0, 100, Dense), (50, 150, Dense), (60, 0, Dense)]);
        assert_eq!(s.len(), 1);
        assert_eq!(s.translate(0), Translation::Exact(60));
        assert_eq!(s.oldest_downstream(), Some(0));
    }

    #[test]
    fn negative_syncs_are_ignored() {
        let s = syncs(&[(-1, 5, Dense), (3, -2, Dense)]);
        assert!(s.is_empty());
    }

    /// Property: over a random dense copy, inverse translation is exact everywhere between
    /// syncs and never skips anywhere.
    #[test]
    fn never_skips_on_a_simulated_copy() {
        use proptest::prelude::*;
        proptest!(|(steps in proptest::collection::vec((1i64..4, 0i64..3, any::<bool>()), 1..60))| {
            // Build a source log with gaps and a target log with foreign records.
            let mut pairs = Vec::new(); // (source offset, target offset) of copied records
            let (mut up, mut down) = (0i64, 0i64);
            for (gap, foreign, _) in &steps {
                up += gap - 1;
                down += foreign;
                pairs.push((up, down));
                up += 1;
                down += 1;
            }
            // Dense policy: a sync on the first record and whenever the delta changes or
            // the source skipped; periodic ones where the third flag says so.
            let mut inv = InverseSyncs::new();
            let mut prev: Option<(i64, i64)> = None;
            for (i, &(u, d)) in pairs.iter().enumerate() {
                let periodic = steps[i].2;
                let sync = match prev {
                    None => true,
                    Some((pu, pd)) => u != pu + 1 || d != pd + 1 || periodic,
                };
                if sync {
                    inv.push(u, d, Dense);
                }
                prev = Some((u, d));
            }
            for c in pairs[0].1..=down {
                // The true next source record: the first copied record at or after c.
                let truth = pairs.iter().find(|&&(_, d)| d >= c).map(|&(u, _)| u);
                let t = inv.translate(c);
                let got = t.offset();
                prop_assert!(got.is_some(), "c={c} {t:?}");
                if let (Some(g), Some(truth)) = (got, truth) {
                    prop_assert!(g <= truth, "skips at c={c}: {g} > {truth}");
                    if t.is_exact() {
                        // Exact answers name a position equivalent to the truth: no source
                        // record lies in [g, truth).
                        prop_assert!(
                            !pairs.iter().any(|&(u, _)| u >= g && u < truth),
                            "c={c}: exact {g} but truth {truth}"
                        );
                    }
                }
            }
        });
    }
}
