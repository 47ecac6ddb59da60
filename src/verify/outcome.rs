//! What one verification of a checkpoint found ([`classify`]), from where [`super::judge`]
//! places the target's record: the checkpoint holds, a failover to it would not resume where
//! the group stands, or it cannot be told (and why). Pure.

use super::judge::{Around, Placement, place};

/// Why a checkpoint could not be verified. The codes are what the checkpoint record carries
/// ([`super::header`]): a fixed set, so a reader never shows bytes someone else chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unverifiable {
    /// A batch at the offsets is larger than the verifier reads (the answer, or its records
    /// once inflated).
    TooLarge,
    /// A batch or record there does not decode.
    Corrupt,
    /// The records read do not reach every record a correct translation could point at.
    Window,
    /// Neither side holds a record up to the offsets yet.
    NothingCopied,
    /// The source did not answer the read (unreachable, refused, leader moving).
    SourceUnreadable,
    /// The target did not answer the read.
    TargetUnreadable,
}

const UNVERIFIABLE: [Unverifiable; 6] = [
    Unverifiable::TooLarge,
    Unverifiable::Corrupt,
    Unverifiable::Window,
    Unverifiable::NothingCopied,
    Unverifiable::SourceUnreadable,
    Unverifiable::TargetUnreadable,
];

impl Unverifiable {
    /// Its code on the checkpoint record and in metrics.
    pub fn code(self) -> &'static str {
        match self {
            Unverifiable::TooLarge => "too_large",
            Unverifiable::Corrupt => "corrupt",
            Unverifiable::Window => "window",
            Unverifiable::NothingCopied => "nothing_copied",
            Unverifiable::SourceUnreadable => "source_unreadable",
            Unverifiable::TargetUnreadable => "target_unreadable",
        }
    }

    pub fn from_code(code: &str) -> Option<Self> {
        UNVERIFIABLE.into_iter().find(|u| u.code() == code)
    }

    /// For the status: why, and what would make it verifiable.
    pub fn describe(self) -> &'static str {
        match self {
            Unverifiable::TooLarge => {
                "cannot verify: too large (a record batch at the offsets is larger than the verifier reads)"
            }
            Unverifiable::Corrupt => "cannot verify: a record batch at the offsets does not decode",
            Unverifiable::Window => {
                "cannot verify: the records read do not reach every record the translation may point at (a conservative translation re-reading many records, or large records)"
            }
            Unverifiable::NothingCopied => {
                "cannot verify: no record up to the checkpoint on the target yet"
            }
            Unverifiable::SourceUnreadable => {
                "cannot verify: the source did not answer the read (unreachable, or the flow's principal may not read the topic)"
            }
            Unverifiable::TargetUnreadable => {
                "cannot verify: the target did not answer the read (unreachable, or the flow's principal may not read the remote topic)"
            }
        }
    }
}

/// A checkpoint a failover would not resume right on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// Source records the group has not read that a failover now would never deliver;
    /// `None` when the target's record is none of the source's read.
    pub skipped: Option<i64>,
    /// Source records the group has read that a failover now would deliver again, beyond what
    /// the translation said it might.
    pub reread: Option<i64>,
}

impl Mismatch {
    /// What a failover to the checkpoint would do there.
    pub fn failover(&self) -> String {
        match (self.skipped, self.reread) {
            (Some(s), _) if s > 0 => format!(
                "a failover would skip {s} record(s) the group has not read"
            ),
            (Some(_), Some(r)) => format!(
                "a failover would read again {r} record(s) the group already processed, more than its translation said"
            ),
            _ => "a failover would resume on a record that is none of the source's records at the group's position (written on the target by another producer, or a wrong translation)".to_string(),
        }
    }
}

/// What one verification found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A failover to the checkpoint resumes on the record the group would read next (or
    /// re-reads no more than its translation said).
    Match,
    Mismatch(Mismatch),
    Unverifiable(Unverifiable),
}

impl Outcome {
    /// Its label in metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Match => "match",
            Outcome::Mismatch(_) => "mismatch",
            Outcome::Unverifiable(_) => "unverifiable",
        }
    }
}

/// Judges a checkpoint from `a` (its upstream offset as `committed`). `allowed_reread`: the
/// records its translation said a failover may read again (0 when exact). `window_from`: the
/// lowest source offset the read could return (where it started, or the log's start).
pub fn classify(a: &Around, allowed_reread: i64, window_from: i64) -> Outcome {
    match place(a) {
        Placement::At {
            skipped, reread, ..
        } if skipped > 0 || reread > allowed_reread.max(0) => Outcome::Mismatch(Mismatch {
            skipped: Some(skipped),
            reread: Some(reread),
        }),
        Placement::At { .. } => Outcome::Match,
        Placement::NotInWindow { .. } => {
            // Every record a correct translation may point at was read: the target's record
            // is none of them.
            let earliest = a.committed.saturating_sub(allowed_reread.max(0));
            let reaches_next = a.source_to_end || a.source.iter().any(|(o, _)| *o >= a.committed);
            if window_from <= earliest && reaches_next {
                Outcome::Mismatch(Mismatch {
                    skipped: None,
                    reread: None,
                })
            } else {
                Outcome::Unverifiable(Unverifiable::Window)
            }
        }
        Placement::NothingToCompare => Outcome::Unverifiable(Unverifiable::NothingCopied),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::judge::{Fingerprint, Seen};

    /// Source offsets `from..to` whose fingerprints are their offsets.
    fn source(from: i64, to: i64) -> Vec<Seen> {
        (from..to).map(|o| (o, o as Fingerprint)).collect()
    }

    /// Committed at 40 with the source read from 32 to its end at 100; the target's record at
    /// the checkpoint is the copy of source `first`, its newest before it of source `before`.
    fn around(first: Option<i64>, before: Option<i64>) -> Around {
        Around {
            committed: 40,
            source: source(32, 100),
            source_to_end: true,
            first: first.map(|s| (s + 7, s as Fingerprint)),
            before: before.map(|s| (s + 7, s as Fingerprint)),
        }
    }

    #[test]
    fn the_next_record_of_the_group_matches() {
        assert_eq!(classify(&around(Some(40), Some(39)), 0, 32), Outcome::Match);
    }

    #[test]
    fn a_checkpoint_past_the_group_position_skips() {
        let got = classify(&around(Some(43), None), 0, 32);
        assert_eq!(
            got,
            Outcome::Mismatch(Mismatch {
                skipped: Some(3),
                reread: Some(0)
            })
        );
        let Outcome::Mismatch(m) = got else {
            unreachable!()
        };
        assert!(m.failover().contains("skip 3"), "{}", m.failover());
    }

    #[test]
    fn re_reading_is_a_mismatch_only_beyond_what_the_translation_said() {
        let a = around(Some(35), None);
        assert!(matches!(classify(&a, 0, 32), Outcome::Mismatch(_)));
        assert_eq!(classify(&a, 5, 32), Outcome::Match, "conservative by 5");
        assert!(matches!(classify(&a, 4, 32), Outcome::Mismatch(_)));
    }

    #[test]
    fn transaction_markers_and_compaction_are_not_records() {
        // Offsets 40..45 hold no record (markers, or compacted away): the group's next record
        // is 45, and a checkpoint at its copy skips nothing.
        let mut a = around(Some(45), Some(39));
        a.source.retain(|(o, _)| !(40..45).contains(o));
        assert_eq!(classify(&a, 0, 32), Outcome::Match);
    }

    #[test]
    fn a_record_nobody_copied_from_the_source_is_a_mismatch() {
        let mut a = around(None, None);
        a.first = Some((47, 9_999));
        let got = classify(&a, 0, 32);
        assert_eq!(
            got,
            Outcome::Mismatch(Mismatch {
                skipped: None,
                reread: None
            })
        );
        let Outcome::Mismatch(m) = got else {
            unreachable!()
        };
        assert!(
            m.failover().contains("another producer"),
            "{}",
            m.failover()
        );
    }

    #[test]
    fn a_record_outside_a_short_window_is_unverified_not_called_a_mismatch() {
        let mut a = around(None, None);
        a.first = Some((47, 9_999));
        // Conservative by 20: a correct translation may point back to 20, before the read.
        assert_eq!(
            classify(&a, 20, 32),
            Outcome::Unverifiable(Unverifiable::Window)
        );
        // Large records: the read stopped before the group's position.
        a.source = source(32, 38);
        a.source_to_end = false;
        assert_eq!(
            classify(&a, 0, 32),
            Outcome::Unverifiable(Unverifiable::Window)
        );
    }

    #[test]
    fn records_not_copied_yet_are_judged_on_the_targets_newest() {
        // The target ends at the checkpoint; its newest record is the copy of source 39.
        assert_eq!(classify(&around(None, Some(39)), 0, 32), Outcome::Match);
        // Its newest is the copy of 42: the checkpoint sits past records the group has not read.
        assert!(matches!(
            classify(&around(None, Some(42)), 0, 32),
            Outcome::Mismatch(Mismatch {
                skipped: Some(3),
                ..
            })
        ));
        // Nothing on the target at all, records on the source.
        assert_eq!(
            classify(&around(None, None), 0, 32),
            Outcome::Unverifiable(Unverifiable::NothingCopied)
        );
    }

    #[test]
    fn the_reason_codes_read_back_and_nothing_else_does() {
        for u in UNVERIFIABLE {
            assert_eq!(Unverifiable::from_code(u.code()), Some(u));
            assert!(u.describe().starts_with("cannot verify"));
        }
        assert_eq!(Unverifiable::from_code("Window"), None);
        assert_eq!(Unverifiable::from_code(""), None);
    }
}
