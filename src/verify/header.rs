//! The outcome of a verification, carried to the operator's probe on the checkpoint record it
//! verified ([`VERIFICATION_HEADER`]), beside [`crate::kafka::checkpoints::TRANSLATION_HEADER`].
//!
//! Why there: the probe already follows the checkpoints topic with bounded reads and trusts its
//! translation header as far as it trusts the topic's writers (only the flow's replicators
//! may write it); a verification read together with the checkpoint it is about needs no
//! second topic, no second trust boundary and no join. The checkpoint loop writes the same key
//! and value again with the header and the checkpoint's own timestamp, so MM2's readers see
//! the same checkpoint twice (compaction keeps one) and its age does not change.
//!
//! The value is short ASCII: `v1 <at ms> <upstream> <downstream> match`,
//! `... mismatch <skipped|-> <reread|->` or `... unverifiable <reason code>`. Anything else,
//! longer than [`MAX_HEADER`] bytes or with a number that does not parse, reads as no
//! verification.

use super::outcome::{Mismatch, Outcome, Unverifiable};

pub const VERIFICATION_HEADER: &str = "mirrorflow.verification";
/// The longest value read: `v1`, five numbers of at most 19 digits and a word, with spaces.
pub const MAX_HEADER: usize = 128;
const VERSION: &str = "v1";

/// One verification of one checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verification {
    /// When it was made (ms since the epoch).
    pub at_ms: i64,
    /// The checkpoint verified: its upstream (source) and downstream (target) offsets.
    pub upstream: i64,
    pub downstream: i64,
    pub outcome: Outcome,
}

fn count(n: Option<i64>) -> String {
    n.map_or_else(|| "-".to_string(), |n| n.to_string())
}

/// A non-negative decimal of at most 19 digits (no sign, no spaces).
fn number(field: &str) -> Option<i64> {
    if field.is_empty() || field.len() > 19 || !field.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    field.parse().ok()
}

fn optional(field: &str) -> Option<Option<i64>> {
    if field == "-" {
        Some(None)
    } else {
        number(field).map(Some)
    }
}

impl Verification {
    /// The header value that says it.
    pub fn header_value(&self) -> String {
        let what = match self.outcome {
            Outcome::Match => "match".to_string(),
            Outcome::Mismatch(m) => format!("mismatch {} {}", count(m.skipped), count(m.reread)),
            Outcome::Unverifiable(u) => format!("unverifiable {}", u.code()),
        };
        format!(
            "{VERSION} {} {} {} {what}",
            self.at_ms.max(0),
            self.upstream.max(0),
            self.downstream.max(0)
        )
    }

    /// What a [`VERIFICATION_HEADER`] value says; `None` for no header or one this version
    /// does not read. Anyone who can write the checkpoints topic chooses the bytes.
    pub fn from_header(value: Option<&[u8]>) -> Option<Verification> {
        let text = value
            .filter(|v| v.len() <= MAX_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())?;
        let fields: Vec<&str> = text.split(' ').take(8).collect();
        let (head, rest) = fields.split_at_checked(5)?;
        let [version, at, up, down, what] = head else {
            return None;
        };
        if *version != VERSION {
            return None;
        }
        let outcome = match (*what, rest) {
            ("match", []) => Outcome::Match,
            ("mismatch", [skipped, reread]) => Outcome::Mismatch(Mismatch {
                skipped: optional(skipped)?,
                reread: optional(reread)?,
            }),
            ("unverifiable", [code]) => Outcome::Unverifiable(Unverifiable::from_code(code)?),
            _ => return None,
        };
        Some(Verification {
            at_ms: number(at)?,
            upstream: number(up)?,
            downstream: number(down)?,
            outcome,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(outcome: Outcome) -> Verification {
        Verification {
            at_ms: 1_800_000_000_000,
            upstream: 40,
            downstream: 47,
            outcome,
        }
    }

    #[test]
    fn every_outcome_reads_back_as_written() {
        let outcomes = [
            Outcome::Match,
            Outcome::Mismatch(Mismatch {
                skipped: Some(3),
                reread: Some(0),
            }),
            Outcome::Mismatch(Mismatch {
                skipped: None,
                reread: None,
            }),
            Outcome::Unverifiable(Unverifiable::TooLarge),
            Outcome::Unverifiable(Unverifiable::TargetUnreadable),
        ];
        for o in outcomes {
            let value = v(o).header_value();
            assert!(value.len() <= MAX_HEADER, "{value}");
            assert_eq!(
                Verification::from_header(Some(value.as_bytes())),
                Some(v(o)),
                "{value}"
            );
        }
        let widest = Verification {
            at_ms: i64::MAX,
            upstream: i64::MAX,
            downstream: i64::MAX,
            outcome: Outcome::Mismatch(Mismatch {
                skipped: Some(i64::MAX),
                reread: Some(i64::MAX),
            }),
        };
        let value = widest.header_value();
        assert!(value.len() <= MAX_HEADER, "{} bytes", value.len());
        assert_eq!(
            Verification::from_header(Some(value.as_bytes())),
            Some(widest)
        );
    }

    #[test]
    fn hostile_values_read_as_no_verification() {
        let long = format!("v1 1 2 3 match{}", " ".repeat(MAX_HEADER));
        let cases: Vec<&[u8]> = vec![
            b"",
            b"v1",
            b"v2 1 2 3 match",
            b"v1 1 2 3 match extra",
            b"v1 1 2 3 mismatch 1",
            b"v1 1 2 3 mismatch 1 2 3",
            b"v1 -1 2 3 match",
            b"v1 +1 2 3 match",
            b"v1 1 2 3 Match",
            b"v1 1 2 3 unverifiable",
            b"v1 1 2 3 unverifiable evil",
            b"v1 1 2 3 mismatch x -",
            b"v1 99999999999999999999 2 3 match",
            b"v1  1 2 3 match",
            b"v1 1 2 3 match\n",
            b"\xff\xfe 1 2 3 match",
            long.as_bytes(),
        ];
        for value in cases {
            assert_eq!(
                Verification::from_header(Some(value)),
                None,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
        assert_eq!(Verification::from_header(None), None);
    }
}
