//! The pure part of aligned copying: what to write so the next source offset is also the
//! target's next offset.
//!
//! A `read_committed` source consumer delivers only visible records; everything else (commit
//! and abort markers, aborted records, compaction holes) shows as a jump in offsets. The
//! target must take exactly as many offsets there, invisible to its own `read_committed`
//! readers. What Kafka offers for that:
//! - an aborted transaction of `n` fillers takes `n + 1` offsets (records and abort marker),
//!   so it fills any jump of 2 or more;
//! - a jump of exactly 1 is the commit marker of a transaction holding the record before it:
//!   that is why the newest record of a partition is held back until the next offset is known;
//! - a jump of 1 with nothing held (the record before it was written long ago) cannot be
//!   filled invisibly: one filler record, visible but marked, keeps the numbers right.

/// One write of a plan, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The held record, on its own (no transaction).
    Plain,
    /// The held record in a committed transaction: its marker takes the next offset.
    Wrapped,
    /// An aborted transaction of this many fillers (one offset more for its marker).
    Aborted(i64),
    /// This many fillers outside a transaction (visible to every reader, marked as fillers).
    Visible(i64),
}

/// The writes that bring the target to `next`, the offset of the record just read (or the
/// consumer's position when nothing follows), from `next_target`, the target's next offset.
/// `held`: a record is held back; it is the one at `next_target`. Empty when nothing is to be
/// written yet; `None` when `next` lies before what the target already has (the source went
/// back: alignment cannot hold).
pub fn plan(held: bool, next_target: i64, next: i64) -> Option<Vec<Step>> {
    let after_held = if held {
        next_target.saturating_add(1)
    } else {
        next_target
    };
    let jump = next.checked_sub(after_held)?;
    if jump < 0 {
        return None;
    }
    let mut steps = Vec::with_capacity(2);
    match (held, jump) {
        (true, 0) => steps.push(Step::Plain),
        (true, 1) => steps.push(Step::Wrapped),
        (true, k) => {
            steps.push(Step::Plain);
            steps.push(Step::Aborted(k - 1));
        }
        (false, 0) => {}
        (false, 1) => steps.push(Step::Visible(1)),
        (false, k) => steps.push(Step::Aborted(k - 1)),
    }
    Some(steps)
}

/// The offsets a plan takes on the target.
pub fn offsets_taken(steps: &[Step]) -> i64 {
    steps
        .iter()
        .map(|s| match s {
            Step::Plain => 1,
            Step::Wrapped => 2,
            Step::Aborted(n) => n.saturating_add(1),
            Step::Visible(n) => *n,
        })
        .fold(0_i64, i64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_run_of_records_is_copied_as_it_comes() {
        assert_eq!(plan(true, 10, 11), Some(vec![Step::Plain]));
        assert_eq!(plan(false, 10, 10), Some(vec![]));
    }

    #[test]
    fn a_commit_marker_wraps_the_record_before_it() {
        assert_eq!(plan(true, 10, 12), Some(vec![Step::Wrapped]));
    }

    #[test]
    fn an_aborted_transaction_or_a_hole_becomes_aborted_fillers() {
        // Records 11..14 aborted on the source, marker at 14, next record at 15.
        assert_eq!(
            plan(true, 10, 15),
            Some(vec![Step::Plain, Step::Aborted(3)])
        );
        assert_eq!(plan(false, 10, 13), Some(vec![Step::Aborted(2)]));
    }

    #[test]
    fn a_lone_hole_of_one_after_a_written_record_takes_a_visible_filler() {
        assert_eq!(plan(false, 10, 11), Some(vec![Step::Visible(1)]));
    }

    #[test]
    fn the_source_going_back_cannot_be_aligned() {
        assert_eq!(plan(true, 10, 10), None);
        assert_eq!(plan(false, 10, 9), None);
        assert_eq!(plan(true, i64::MAX, 0), None);
    }

    proptest! {
        /// Whatever the jump, the plan lands the target exactly on `next`: the held record (if
        /// any) and the fillers take every offset in between, no more.
        #[test]
        fn a_plan_takes_exactly_the_offsets_up_to_next(
            held in any::<bool>(),
            next_target in 0_i64..1_000_000,
            jump in 0_i64..10_000,
        ) {
            let next = next_target + i64::from(held) + jump;
            let steps = plan(held, next_target, next).expect("a forward jump has a plan");
            prop_assert_eq!(next_target + offsets_taken(&steps), next);
            // A held record is written exactly once; nothing is written without a reason.
            let written = steps.iter().filter(|s| matches!(s, Step::Plain | Step::Wrapped)).count();
            prop_assert_eq!(written, usize::from(held));
            // Visible fillers only where nothing invisible fits.
            let visible = steps.iter().any(|s| matches!(s, Step::Visible(_)));
            prop_assert_eq!(visible, !held && jump == 1);
        }
    }
}
