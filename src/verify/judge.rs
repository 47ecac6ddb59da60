//! Where the first record a failed-over consumer would read sits in the source partition,
//! against the group's committed position, from records alone ([`place`]). Shared by
//! `mirrorflow drill` (once, on demand: [`judge`]) and the checkpoint loop's continuous
//! verification ([`super::outcome`]). Pure, so every case is unit-tested; the reading is in
//! the callers.
//!
//! Records are compared by a fingerprint of what a copy preserves (key, value, headers,
//! timestamp), not by offset: offsets differ between the clusters unless the flow is aligned.

use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::OnceLock;

use serde::Serialize;

/// A record's fingerprint: 128 bits of two SipHash functions whose keys are drawn anew in
/// every process, so whoever writes records cannot search for two that look the same (a
/// fixed-key 64-bit hash falls to a birthday search of about 2^32 records).
pub type Fingerprint = u128;

/// A record's offset and fingerprint.
pub type Seen = (i64, Fingerprint);

fn keys() -> &'static (RandomState, RandomState) {
    static KEYS: OnceLock<(RandomState, RandomState)> = OnceLock::new();
    KEYS.get_or_init(|| (RandomState::new(), RandomState::new()))
}

/// The fingerprint of a record as a copy preserves it. The checkpoint loop's verification
/// leaves the timestamp out (`None`): a remote topic stamped with log-append time holds every
/// record under another time, and the record a failover resumes on is what matters there.
pub fn fingerprint(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    timestamp_ms: Option<i64>,
    headers: &[(&[u8], Option<&[u8]>)],
) -> Fingerprint {
    let half = |state: &RandomState| {
        let mut h = state.build_hasher();
        key.hash(&mut h);
        value.hash(&mut h);
        timestamp_ms.hash(&mut h);
        headers.hash(&mut h);
        h.finish()
    };
    let (a, b) = keys();
    (u128::from(half(a)) << 64) | u128::from(half(b))
}

/// One partition's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// Source records the group has not read that a consumer failed over now would never read.
    pub skipped: Option<i64>,
    /// Source records the group has read that it would read again.
    pub reread: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Finding {
    #[cfg(test)]
    fn exact() -> Self {
        Finding {
            skipped: Some(0),
            reread: Some(0),
            note: None,
        }
    }

    fn unverified(note: String) -> Self {
        Finding {
            skipped: None,
            reread: None,
            note: Some(note),
        }
    }
}

/// What was read around one partition's failover point.
#[derive(Debug, Clone, Default)]
pub struct Around {
    /// The group's committed offset on the source.
    pub committed: i64,
    /// Source records in a window around `committed`, in offset order.
    pub source: Vec<Seen>,
    /// Whether `source` reaches the partition's end (nothing after its last record).
    pub source_to_end: bool,
    /// The first record the drill group read on the target, if there was one.
    pub first: Option<Seen>,
    /// The newest target record before the drill group's offset, if any.
    pub before: Option<Seen>,
}

/// Where `fp` sits in the window: the occurrence nearest `committed` (identical records can
/// repeat; the nearest is the one a copy of this position would be).
fn locate(source: &[Seen], fp: Fingerprint, committed: i64) -> Option<i64> {
    source
        .iter()
        .filter(|(_, f)| *f == fp)
        .map(|(o, _)| *o)
        .min_by_key(|o| o.saturating_sub(committed).saturating_abs())
}

/// Source records in `[from, to)`: offsets are not records (transaction markers, compaction).
fn records_between(source: &[Seen], from: i64, to: i64) -> i64 {
    let n = source.iter().filter(|(o, _)| *o >= from && *o < to).count();
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Where the target's record lies among the source's, as [`place`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Located: a failover now skips `skipped` source records the group has not read and
    /// reads `reread` it has read again. `pending`: the target holds nothing at the failover
    /// offset yet and the target's newest record before it was located instead (the records
    /// after it are not copied yet).
    At {
        skipped: i64,
        reread: i64,
        pending: bool,
    },
    /// The target's record (at the offset, or the newest before it when nothing is there yet)
    /// is none of the source records read. `pending` as above.
    NotInWindow { pending: bool },
    /// Neither the target nor the source holds a record to compare.
    NothingToCompare,
}

/// Places the target's record of `a` in its source window.
pub fn place(a: &Around) -> Placement {
    if let Some((_, fp)) = a.first {
        return match locate(&a.source, fp, a.committed) {
            Some(at) => Placement::At {
                skipped: records_between(&a.source, a.committed, at),
                reread: records_between(&a.source, at, a.committed),
                pending: false,
            },
            None => Placement::NotInWindow { pending: false },
        };
    }
    // Nothing to read on the target yet.
    let unread = records_between(&a.source, a.committed, i64::MAX);
    if unread == 0 && a.source_to_end {
        return Placement::At {
            skipped: 0,
            reread: 0,
            pending: false,
        };
    }
    match a.before {
        // The target ends before the failover offset: what lies after its newest record is
        // what the group would read once copied.
        Some((_, fp)) => match locate(&a.source, fp, a.committed) {
            Some(at) => Placement::At {
                skipped: records_between(&a.source, a.committed, at.saturating_add(1)),
                reread: records_between(&a.source, at.saturating_add(1), a.committed),
                pending: true,
            },
            None => Placement::NotInWindow { pending: true },
        },
        None => Placement::NothingToCompare,
    }
}

/// The drill's answer for one partition.
pub fn judge(a: &Around) -> Finding {
    match place(a) {
        Placement::At {
            skipped, reread, ..
        } => Finding {
            skipped: Some(skipped),
            reread: Some(reread),
            note: None,
        },
        Placement::NotInWindow { .. } => Finding::unverified(format!(
            "the target's record is not among the {} source records read around offset {}; widen --window",
            a.source.len(),
            a.committed
        )),
        Placement::NothingToCompare => Finding::unverified(
            "the target partition holds no record up to the drill group's offset; nothing to compare".into(),
        ),
    }
}

/// Source records after the target's newest one: what a failover now would lose until copied
/// (the recovery point). `None` when the target's newest record is not in the source tail read.
pub fn not_copied(source_tail: &[Seen], target_newest: Option<Fingerprint>) -> Option<i64> {
    match target_newest {
        None => Some(source_tail.len() as i64),
        Some(fp) => {
            let at = source_tail.iter().rposition(|(_, f)| *f == fp)?;
            Some((source_tail.len() - at - 1) as i64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Source offsets `from..to` whose fingerprints are their offsets.
    fn source(from: i64, to: i64) -> Vec<Seen> {
        (from..to).map(|o| (o, o as Fingerprint)).collect()
    }

    fn around(committed: i64, first: Option<i64>, before: Option<i64>) -> Around {
        Around {
            committed,
            source: source(0, 100),
            source_to_end: true,
            first: first.map(|s| (s + 7, s as Fingerprint)),
            before: before.map(|s| (s + 7, s as Fingerprint)),
        }
    }

    #[test]
    fn the_next_record_of_the_group_first_is_exact() {
        assert_eq!(judge(&around(40, Some(40), Some(39))), Finding::exact());
    }

    #[test]
    fn a_target_record_after_the_group_position_skips_the_records_between() {
        let f = judge(&around(40, Some(50), None));
        assert_eq!((f.skipped, f.reread), (Some(10), Some(0)));
    }

    #[test]
    fn a_target_record_before_the_group_position_is_read_again() {
        let f = judge(&around(70, Some(50), None));
        assert_eq!((f.skipped, f.reread), (Some(0), Some(20)));
    }

    #[test]
    fn offsets_that_are_no_records_do_not_count() {
        // Markers at 45..50 (no records there).
        let mut a = around(40, Some(55), None);
        a.source.retain(|(o, _)| !(45..50).contains(o));
        assert_eq!(judge(&a).skipped, Some(10));
    }

    #[test]
    fn at_the_end_of_both_partitions_nothing_is_skipped() {
        assert_eq!(judge(&around(100, None, Some(99))), Finding::exact());
    }

    #[test]
    fn a_target_behind_the_group_reads_the_uncopied_records_again_once_copied() {
        // The target's newest record is source 89; the group read up to 95.
        let f = judge(&around(95, None, Some(89)));
        assert_eq!((f.skipped, f.reread), (Some(0), Some(5)));
    }

    #[test]
    fn a_drill_offset_past_records_the_group_has_not_read_skips_them() {
        // Nothing at the drill offset; the target's newest record before it is source 60, the
        // group is at 50: 50..=60 are on the target before where the group would resume.
        let f = judge(&around(50, None, Some(60)));
        assert_eq!((f.skipped, f.reread), (Some(11), Some(0)));
    }

    #[test]
    fn a_record_outside_the_window_is_unverified_not_guessed() {
        let mut a = around(40, Some(50), None);
        a.first = Some((57, 9_999));
        let f = judge(&a);
        assert_eq!((f.skipped, f.reread), (None, None));
        assert!(f.note.is_some_and(|n| n.contains("--window")));
    }

    #[test]
    fn identical_records_resolve_to_the_nearest() {
        let mut a = around(40, None, None);
        a.source = vec![(10, 1), (39, 2), (40, 1), (80, 1)];
        a.first = Some((47, 1));
        assert_eq!(judge(&a), Finding::exact());
    }

    #[test]
    fn the_recovery_point_counts_records_after_the_targets_newest() {
        let tail = source(90, 100);
        assert_eq!(not_copied(&tail, Some(99)), Some(0));
        assert_eq!(not_copied(&tail, Some(94)), Some(5));
        assert_eq!(not_copied(&tail, None), Some(10));
        assert_eq!(not_copied(&tail, Some(5)), None);
    }

    #[test]
    fn the_fingerprint_covers_key_value_headers_and_time() {
        let base = fingerprint(
            Some(b"k"),
            Some(b"v"),
            Some(1),
            &[(&b"h"[..], Some(&b"x"[..]))],
        );
        assert_eq!(
            base,
            fingerprint(
                Some(b"k"),
                Some(b"v"),
                Some(1),
                &[(&b"h"[..], Some(&b"x"[..]))]
            )
        );
        for other in [
            fingerprint(
                Some(b"K"),
                Some(b"v"),
                Some(1),
                &[(&b"h"[..], Some(&b"x"[..]))],
            ),
            fingerprint(
                Some(b"k"),
                Some(b"V"),
                Some(1),
                &[(&b"h"[..], Some(&b"x"[..]))],
            ),
            fingerprint(
                Some(b"k"),
                Some(b"v"),
                Some(2),
                &[(&b"h"[..], Some(&b"x"[..]))],
            ),
            fingerprint(Some(b"k"), Some(b"v"), Some(1), &[(&b"h"[..], None)]),
        ] {
            assert_ne!(base, other);
        }
    }
}
