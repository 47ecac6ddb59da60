//! Where a fenced partition's copy starts again, decided from what was read of both logs. Pure,
//! so that every way records of the previous writer can be missing from the target is tried
//! in a table.
//!
//! Several findings can each say "the records from here on are not visible on the target": a
//! wrap that failed (or a hanging transaction that was ended by an abort, which aborts every
//! record of it), an aborted wrap at the remote end, a wrap whose record never arrived. They
//! are read from different places and can disagree, e.g. once a hanging transaction was ended
//! with an aborted filler, the remote end looks like a wrap whose record never arrived, one
//! record later than the first one lost. The copy starts again at the earliest of them: a
//! record copied twice is a duplicate a reader can see, a record skipped is lost.

use crate::kafka::log_bounds::LogBounds;

/// How the remote partition ends, past its last visible record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tail {
    /// Nothing of the previous writer is missing there.
    Clean,
    /// The last transaction wrapping a record was aborted: the record at end - 2.
    AbortedWrap,
    /// The last transaction wrapping a record ended before its record arrived: its marker holds
    /// the record's offset, end - 1.
    UnwrittenWrap,
}

/// What was read of a fenced partition that has no open transaction at its remote end.
#[derive(Debug, Clone, Copy)]
pub(super) struct Found {
    /// A break of alignment is recorded for the partition already.
    pub broke_before: bool,
    pub tail: Tail,
    /// The first source offset a failed wrap (or an aborted hanging transaction) left
    /// without a visible copy.
    pub wrap_failed: Option<i64>,
    /// Where the remote partition ends.
    pub end: i64,
    pub source: LogBounds,
    /// The flow stored a position for the partition.
    pub stored: bool,
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Restart {
    /// Records from source offset `from` on are not visible on the target, whose end is past
    /// it: the break (`from`, end) is recorded and the copy goes on translated from `from`.
    CopyAgain { from: i64, why: &'static str },
    /// Translated already: from `from` when a wrap failed (copied again), else from the stored
    /// position.
    Translated { from: Option<i64> },
    /// The remote partition holds records the flow did not write, or more than the source:
    /// it cannot be aligned.
    MisalignedAtStart,
    /// The remote partition ends before the source's log start: aligned with it first.
    AlignLogStart,
    /// Aligned where the remote partition ends.
    Aligned,
}

pub(super) const WHY_ABORTED: &str =
    "the previous writer's last record was aborted by fencing; copying it again, translated";
pub(super) const WHY_UNWRITTEN: &str = "the previous writer was fenced before the record of its last transaction reached the target, whose marker took the record's offset; copying it again, translated";
pub(super) const WHY_FAILED: &str = "a failed transaction of the aligned copy took offsets on the target (or a hanging one was ended by an abort); copying again from its first record, translated";

pub(super) fn decide(f: &Found) -> Restart {
    if f.broke_before {
        return Restart::Translated {
            from: f.wrap_failed,
        };
    }
    let tail = match f.tail {
        Tail::Clean => None,
        Tail::AbortedWrap => Some((f.end.saturating_sub(2), WHY_ABORTED)),
        Tail::UnwrittenWrap => Some((f.end.saturating_sub(1), WHY_UNWRITTEN)),
    };
    // A failed wrap that took no offset on the target lost nothing: aligned as before.
    let failed = f
        .wrap_failed
        .filter(|&at| at != f.end)
        .map(|at| (at, WHY_FAILED));
    let earliest = match (tail, failed) {
        (Some(t), Some(w)) => Some(if w.0 <= t.0 { w } else { t }),
        (t, w) => t.or(w),
    };
    if let Some((from, why)) = earliest {
        return Restart::CopyAgain { from, why };
    }
    if f.end > f.source.end || (!f.stored && f.end > 0) {
        Restart::MisalignedAtStart
    } else if f.end < f.source.start {
        Restart::AlignLogStart
    } else {
        Restart::Aligned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(tail: Tail, wrap_failed: Option<i64>, end: i64) -> Found {
        Found {
            broke_before: false,
            tail,
            wrap_failed,
            end,
            source: LogBounds {
                start: 0,
                end: 1340,
            },
            stored: true,
        }
    }

    fn from(r: Restart) -> Option<i64> {
        match r {
            Restart::CopyAgain { from, .. } => Some(from),
            _ => None,
        }
    }

    #[test]
    fn the_copy_starts_again_at_the_first_record_any_finding_says_is_missing() {
        use Tail::*;
        let cases = [
            // A hanging transaction from 42 ended with an aborted filler (43) and its marker
            // (44): the end looks like an unwritten wrap at 44, yet 42 is lost too.
            (found(UnwrittenWrap, Some(42), 45), Some(42)),
            (found(AbortedWrap, Some(42), 46), Some(42)),
            // Each finding alone.
            (found(UnwrittenWrap, None, 45), Some(44)),
            (found(AbortedWrap, None, 45), Some(43)),
            (found(Clean, Some(42), 45), Some(42)),
            // A failed wrap later than the tail's record: the tail's is first.
            (found(AbortedWrap, Some(44), 45), Some(43)),
            // A failed wrap that took no offset: nothing lost, aligned as before.
            (found(Clean, Some(45), 45), None),
            (found(UnwrittenWrap, Some(45), 45), Some(44)),
            (found(Clean, None, 45), None),
        ];
        for (f, want) in cases {
            assert_eq!(from(decide(&f)), want, "{f:?}");
        }
        assert_eq!(decide(&found(Clean, Some(45), 45)), Restart::Aligned);
    }

    #[test]
    fn a_partition_broken_before_goes_on_translated_whatever_its_tail() {
        for tail in [Tail::Clean, Tail::AbortedWrap, Tail::UnwrittenWrap] {
            for failed in [None, Some(7)] {
                let f = Found {
                    broke_before: true,
                    ..found(tail, failed, 45)
                };
                assert_eq!(decide(&f), Restart::Translated { from: failed });
            }
        }
    }

    #[test]
    fn a_clean_end_is_aligned_unless_it_cannot_be() {
        let at = |end, start, stored| {
            decide(&Found {
                source: LogBounds { start, end: 100 },
                stored,
                ..found(Tail::Clean, None, end)
            })
        };
        assert_eq!(at(100, 0, true), Restart::Aligned);
        assert_eq!(at(0, 0, false), Restart::Aligned);
        // More on the target than on the source, or records without a position of ours.
        assert_eq!(at(101, 0, true), Restart::MisalignedAtStart);
        assert_eq!(at(5, 0, false), Restart::MisalignedAtStart);
        // The source's log starts past the remote end.
        assert_eq!(at(5, 50, true), Restart::AlignLogStart);
    }
}
