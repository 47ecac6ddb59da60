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
}
