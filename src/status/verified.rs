//! What the verifications carried on a group's checkpoint records ([`crate::verify::header`])
//! say about a failover now: when the group was last verified and on how many partitions,
//! the partitions where a failover would not resume on the group's next record, and those
//! that cannot be verified (and why). [`Verified::add`] folds the probe's stored checkpoints;
//! [`super::groups`] turns a mismatch into the group's state.

use std::time::Duration;

use crate::kafka::checkpoints::StoredCheckpoint;
use crate::mm2::TopicPartition;
use crate::verify::outcome::{Mismatch, Outcome, Unverifiable};

/// Partitions named in a group's message, at most (the counts say how many in all).
pub const MAX_NAMED: usize = 3;

/// A partition whose latest verification was a mismatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatched {
    /// The target partition.
    pub partition: TopicPartition,
    /// The checkpoint verified: the group's committed source offset and its translation.
    pub source_offset: i64,
    pub target_offset: i64,
    pub mismatch: Mismatch,
}

/// One group's verifications, as the probe read them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verified {
    /// Partitions with a checkpoint, and those among them with a verification.
    pub checkpointed: u32,
    pub verified: u32,
    /// When the newest and the least recent of the partitions' latest verifications were
    /// made (ms since the epoch).
    pub newest_ms: Option<i64>,
    pub oldest_ms: Option<i64>,
    /// How long ago those were (set by [`Verified::aged`]).
    pub newest_age: Option<Duration>,
    pub oldest_age: Option<Duration>,
    pub mismatches: u32,
    /// The first [`MAX_NAMED`] mismatched partitions.
    pub mismatched: Vec<Mismatched>,
    pub unverifiable: u32,
    /// The first [`MAX_NAMED`] partitions that cannot be verified, and why.
    pub unverifiable_named: Vec<(TopicPartition, Unverifiable)>,
}

impl Verified {
    /// Folds the stored checkpoint of `partition` (a target partition).
    pub fn add(&mut self, partition: &TopicPartition, stored: &StoredCheckpoint) {
        self.checkpointed = self.checkpointed.saturating_add(1);
        let Some(v) = stored.verification else {
            return;
        };
        self.verified = self.verified.saturating_add(1);
        self.newest_ms = Some(self.newest_ms.map_or(v.at_ms, |n| n.max(v.at_ms)));
        self.oldest_ms = Some(self.oldest_ms.map_or(v.at_ms, |n| n.min(v.at_ms)));
        match v.outcome {
            Outcome::Match => {}
            Outcome::Mismatch(mismatch) => {
                self.mismatches = self.mismatches.saturating_add(1);
                if self.mismatched.len() < MAX_NAMED {
                    self.mismatched.push(Mismatched {
                        partition: partition.clone(),
                        source_offset: v.upstream,
                        target_offset: v.downstream,
                        mismatch,
                    });
                }
            }
            Outcome::Unverifiable(why) => {
                self.unverifiable = self.unverifiable.saturating_add(1);
                if self.unverifiable_named.len() < MAX_NAMED {
                    self.unverifiable_named.push((partition.clone(), why));
                }
            }
        }
    }

    /// With the ages of its times, `age` turning a time (ms since the epoch) into how long ago.
    pub fn aged(self, age: impl Fn(i64) -> Duration) -> Self {
        Verified {
            newest_age: self.newest_ms.map(&age),
            oldest_age: self.oldest_ms.map(&age),
            ..self
        }
    }

    /// The `leastReadyGroups` message of a group with a mismatch.
    pub fn mismatch_message(&self) -> String {
        let named: Vec<String> = self
            .mismatched
            .iter()
            .map(|m| {
                format!(
                    "partition {} (source offset {}, target offset {}): {}",
                    m.partition,
                    m.source_offset,
                    m.target_offset,
                    m.mismatch.failover()
                )
            })
            .collect();
        let more = self
            .mismatches
            .saturating_sub(u32::try_from(named.len()).unwrap_or(0));
        format!(
            "verified on the records, the checkpoint of {} partition(s) is wrong: {}{}; do not fail over this group on its checkpoints. Either a producer other than this flow writes into the remote topic (only the flow's replicators should have WRITE on it), or the translation is wrong (compare with `mirrorflow drill --group <group>`); the group is ready again once a later verification of its checkpoint matches (every spec.checkpoints.verifyInterval)",
            self.mismatches,
            named.join("; "),
            if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            }
        )
    }

    /// What a ready group's message adds: how recent the evidence is, and what cannot be
    /// verified. Empty before the first verification.
    pub fn evidence(&self) -> String {
        let Some(newest) = self.newest_age else {
            return String::new();
        };
        let mut out = format!(
            "; its checkpoints were verified on the records on {}/{} partition(s), newest {} ago",
            self.verified,
            self.checkpointed,
            super::secs(newest)
        );
        if let Some(oldest) = self.oldest_age.filter(|o| *o > newest) {
            out.push_str(&format!(", oldest {} ago", super::secs(oldest)));
        }
        for (partition, why) in &self.unverifiable_named {
            out.push_str(&format!("; partition {partition}: {}", why.describe()));
        }
        out
    }
}

/// What `FailoverReady`'s message says of the evidence over every group: on how many
/// group-partitions the checkpoints were verified on the records, and how recent the newest
/// and the least recent verifications are.
pub fn flow_evidence(groups: &[super::GroupObservation]) -> String {
    let (verified, checkpointed) = groups.iter().fold((0u32, 0u32), |(v, c), g| {
        (
            v.saturating_add(g.verified.verified),
            c.saturating_add(g.verified.checkpointed),
        )
    });
    let newest = groups.iter().filter_map(|g| g.verified.newest_age).min();
    let oldest = groups.iter().filter_map(|g| g.verified.oldest_age).max();
    match (newest, oldest) {
        (Some(newest), Some(oldest)) => format!(
            "; checkpoints verified on the records on {verified}/{checkpointed} group-partition(s), newest {} ago, least recent {} ago",
            super::secs(newest),
            super::secs(oldest)
        ),
        _ if checkpointed > 0 => {
            "; no checkpoint was verified on the records yet (spec.checkpoints.verifyInterval)"
                .to_string()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::checkpoints::Exactness;
    use crate::mm2::Checkpoint;
    use crate::verify::header::Verification;

    fn stored(p: i32, outcome: Option<Outcome>) -> (TopicPartition, StoredCheckpoint) {
        let tp = TopicPartition::new("A.t", p);
        let stored = StoredCheckpoint {
            checkpoint: Checkpoint {
                group: "g".into(),
                topic_partition: tp.clone(),
                upstream_offset: 40,
                downstream_offset: 47,
                metadata: String::new(),
            },
            written_ms: Some(1_000),
            exactness: Exactness::Exact,
            exact_ms: Some(1_000),
            verification: outcome.map(|outcome| Verification {
                at_ms: 10_000 + i64::from(p) * 1_000,
                upstream: 40,
                downstream: 47,
                outcome,
            }),
            share: false,
        };
        (tp, stored)
    }

    #[test]
    fn a_group_counts_its_verified_partitions_and_names_its_mismatches() {
        let skip = Outcome::Mismatch(Mismatch {
            skipped: Some(3),
            reread: Some(0),
        });
        let mut v = Verified::default();
        for (p, outcome) in [
            (0, Some(Outcome::Match)),
            (1, Some(skip)),
            (2, None),
            (3, Some(Outcome::Unverifiable(Unverifiable::TooLarge))),
        ] {
            let (tp, s) = stored(p, outcome);
            v.add(&tp, &s);
        }
        let v = v.aged(|ms| Duration::from_millis(u64::try_from(20_000 - ms).unwrap_or(0)));
        assert_eq!((v.checkpointed, v.verified, v.mismatches), (4, 3, 1));
        assert_eq!(v.newest_age, Some(Duration::from_secs(7)));
        assert_eq!(v.oldest_age, Some(Duration::from_secs(10)));
        let message = v.mismatch_message();
        assert!(
            message.contains("partition A.t-1 (source offset 40, target offset 47)")
                && message.contains("skip 3"),
            "{message}"
        );
        let evidence = v.evidence();
        assert!(
            evidence.contains("3/4 partition(s), newest 7s ago, oldest 10s ago")
                && evidence.contains("A.t-3: cannot verify: too large"),
            "{evidence}"
        );
    }

    #[test]
    fn named_partitions_are_bounded_and_the_rest_counted() {
        let mut v = Verified::default();
        for p in 0..10 {
            let (tp, s) = stored(
                p,
                Some(Outcome::Mismatch(Mismatch {
                    skipped: None,
                    reread: None,
                })),
            );
            v.add(&tp, &s);
        }
        assert_eq!(v.mismatched.len(), MAX_NAMED);
        assert!(v.mismatch_message().contains("and 7 more"));
        assert_eq!(Verified::default().evidence(), "", "no evidence yet");
    }
}
