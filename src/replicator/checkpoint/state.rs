//! What the checkpoint loop knows about source groups, and the rule that turns one committed
//! offset into a checkpoint. Pure: the loop feeds it records and asks it what to write.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::exactness::{self, Conservative};
use crate::kafka::checkpoints::Exactness;
use crate::mm2::{
    Checkpoint, CheckpointTracker, Filters, NameFilter, OffsetSyncStore, ReplicationPolicy,
    TopicDecision, TopicPartition, Translation, UnknownReason,
};

/// Groups the replicator itself uses (`mirrorflow.<flow>.source`, `.checkpoints`, ...): never
/// checkpointed, whatever the filters say.
pub const OWN_GROUP_PREFIX: &str = "mirrorflow.";

/// Whether a source group's offsets are checkpointed.
pub fn group_wanted(groups: &NameFilter, group: &str) -> bool {
    !group.starts_with(OWN_GROUP_PREFIX) && groups.matches(group)
}

/// A group's committed offset on one source partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub offset: i64,
    pub metadata: String,
    /// Broker time of the commit (epoch ms).
    pub commit_timestamp_ms: i64,
    /// Read live (after its `__consumer_offsets` partition caught up) and not yet reflected in
    /// a checkpoint: its checkpoint's latency is worth measuring. History replayed at
    /// assignment is not live, or every restart would report hours of latency.
    pub live: bool,
}

#[derive(Debug, Default)]
struct OwnedPartition {
    caught_up: bool,
    groups: HashMap<String, BTreeMap<TopicPartition, Commit>>,
}

/// Latest committed offsets of the groups this replica owns, i.e. whose `__consumer_offsets`
/// partition its consumer is assigned. Keyed by that partition so a revocation drops exactly
/// the groups another replica takes over.
#[derive(Debug, Default)]
pub struct Commits {
    partitions: HashMap<i32, OwnedPartition>,
    home: HashMap<String, i32>,
    by_source_partition: HashMap<TopicPartition, HashSet<String>>,
}

impl Commits {
    /// Starts owning a `__consumer_offsets` partition, read from its beginning.
    pub fn assign(&mut self, partition: i32) {
        self.revoke(partition);
        self.partitions.insert(partition, OwnedPartition::default());
    }

    /// Stops owning a partition; returns the groups that left with it.
    pub fn revoke(&mut self, partition: i32) -> Vec<String> {
        let Some(owned) = self.partitions.remove(&partition) else {
            return Vec::new();
        };
        let mut dropped = Vec::with_capacity(owned.groups.len());
        for (group, commits) in owned.groups {
            for tp in commits.keys() {
                self.unindex(&group, tp);
            }
            self.home.remove(&group);
            dropped.push(group);
        }
        dropped
    }

    pub fn owns(&self, partition: i32) -> bool {
        self.partitions.contains_key(&partition)
    }

    /// Marks a partition as read up to its end; returns its (group, partition) pairs, all of
    /// which need evaluating now.
    pub fn caught_up(&mut self, partition: i32) -> Vec<(String, TopicPartition)> {
        match self.partitions.get_mut(&partition) {
            Some(owned) if !owned.caught_up => {
                owned.caught_up = true;
                owned
                    .groups
                    .iter()
                    .flat_map(|(g, commits)| commits.keys().map(|tp| (g.clone(), tp.clone())))
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    pub fn all_caught_up(&self) -> bool {
        self.partitions.values().all(|p| p.caught_up)
    }

    /// Applies one record of an owned partition (`None` = offset deleted). Returns whether
    /// the pair must be evaluated now (false while the partition is still loading, or when
    /// the partition is not owned).
    pub fn apply(
        &mut self,
        partition: i32,
        group: &str,
        tp: TopicPartition,
        commit: Option<Commit>,
    ) -> bool {
        let Some(owned) = self.partitions.get_mut(&partition) else {
            return false;
        };
        let caught_up = owned.caught_up;
        match commit {
            Some(mut commit) => {
                commit.live = caught_up;
                owned
                    .groups
                    .entry(group.to_owned())
                    .or_default()
                    .insert(tp.clone(), commit);
                self.home.insert(group.to_owned(), partition);
                self.by_source_partition
                    .entry(tp)
                    .or_default()
                    .insert(group.to_owned());
            }
            None => {
                let emptied = owned.groups.get_mut(group).is_some_and(|commits| {
                    commits.remove(&tp);
                    commits.is_empty()
                });
                if emptied {
                    owned.groups.remove(group);
                    self.home.remove(group);
                }
                self.unindex(group, &tp);
            }
        }
        caught_up
    }

    fn unindex(&mut self, group: &str, tp: &TopicPartition) {
        if let Some(groups) = self.by_source_partition.get_mut(tp) {
            groups.remove(group);
            if groups.is_empty() {
                self.by_source_partition.remove(tp);
            }
        }
    }

    /// The group's commits, if it is owned, its partition caught up and it has any.
    pub fn group(&self, group: &str) -> Option<&BTreeMap<TopicPartition, Commit>> {
        let owned = self.partitions.get(self.home.get(group)?)?;
        owned.caught_up.then(|| owned.groups.get(group)).flatten()
    }

    pub fn get(&self, group: &str, tp: &TopicPartition) -> Option<&Commit> {
        self.group(group)?.get(tp)
    }

    /// The commit's checkpoint latency was measured (or cannot be any more).
    pub fn settle(&mut self, group: &str, tp: &TopicPartition) {
        if let Some(partition) = self.home.get(group)
            && let Some(commit) = self
                .partitions
                .get_mut(partition)
                .and_then(|p| p.groups.get_mut(group))
                .and_then(|g| g.get_mut(tp))
        {
            commit.live = false;
        }
    }

    /// Owned groups with a commit on this source partition (to re-evaluate on a new sync).
    pub fn groups_on(&self, tp: &TopicPartition) -> impl Iterator<Item = &String> {
        self.by_source_partition.get(tp).into_iter().flatten()
    }

    /// Every (group, partition) of caught-up partitions.
    pub fn all_pairs(&self) -> Vec<(String, TopicPartition)> {
        self.partitions
            .values()
            .filter(|p| p.caught_up)
            .flat_map(|p| p.groups.iter())
            .flat_map(|(g, commits)| commits.keys().map(|tp| (g.clone(), tp.clone())))
            .collect()
    }

    /// Owned groups with commits, of caught-up partitions.
    pub fn groups(&self) -> impl Iterator<Item = (&String, &BTreeMap<TopicPartition, Commit>)> {
        self.partitions
            .values()
            .filter(|p| p.caught_up)
            .flat_map(|p| p.groups.iter())
    }

    /// Whether the group is held by this replica (caught up or not).
    pub fn is_owned_group(&self, group: &str) -> bool {
        self.home.contains_key(group)
    }
}

/// What the flow does with names: the target topic of a source topic, and whether the
/// source topic is mirrored at all.
pub struct Naming<'a> {
    pub policy: &'a dyn ReplicationPolicy,
    pub filters: &'a Filters,
    pub source_alias: &'a str,
    pub target_alias: &'a str,
}

impl Naming<'_> {
    /// The target-side partition a source partition is mirrored to, or `None` when this flow
    /// does not mirror the topic (MM2 checkpoints only replicated topics).
    pub fn target_partition(&self, tp: &TopicPartition) -> Option<TopicPartition> {
        match self.filters.topic_decision(
            self.policy,
            &tp.topic,
            self.source_alias,
            self.target_alias,
        ) {
            TopicDecision::Replicate => Some(TopicPartition::new(
                self.policy
                    .format_remote_topic(self.source_alias, &tp.topic),
                tp.partition,
            )),
            TopicDecision::Skip(_) => None,
        }
    }
}

/// The outcome of evaluating one committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evaluation {
    /// The topic is not mirrored by this flow.
    NotMirrored,
    /// No offset sync covers the committed offset (yet).
    Untranslatable(UnknownReason),
    /// The checkpoint to write, and how exact its translation is.
    Emit(Checkpoint, Exactness),
    /// Translated, but MM2's rule says nothing new (no rewind, downstream did not advance).
    Unchanged,
}

/// Translates `commit` and applies MM2's monotonic emission rule against `tracker`, plus
/// [`exactness::restamp`] for pairs whose latest checkpoint is in `conservative`. The tracker
/// is not updated: record the checkpoint once the target acknowledged it.
pub fn evaluate(
    naming: &Naming<'_>,
    store: &OffsetSyncStore,
    tracker: &CheckpointTracker,
    conservative: &Conservative,
    group: &str,
    tp: &TopicPartition,
    commit: &Commit,
) -> Evaluation {
    let Some(target) = naming.target_partition(tp) else {
        return Evaluation::NotMirrored;
    };
    let (downstream, exactness) = match store.translate(tp, commit.offset) {
        Translation::Exact(offset) => (offset, Exactness::Exact),
        Translation::Conservative { offset, max_replay } => {
            (offset, Exactness::Conservative { max_replay })
        }
        Translation::Unknown(reason) => return Evaluation::Untranslatable(reason),
    };
    if !tracker.should_emit(group, &target, commit.offset, downstream)
        && !exactness::restamp(
            conservative.contains(group, &target),
            tracker.last(group, &target),
            downstream,
            exactness,
        )
    {
        return Evaluation::Unchanged;
    }
    Evaluation::Emit(
        Checkpoint {
            group: group.to_owned(),
            topic_partition: target,
            upstream_offset: commit.offset,
            downstream_offset: downstream,
            metadata: commit.metadata.clone(),
        },
        exactness,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm2::{OffsetSync, PrefixPolicy, StoreConfig, SyncOrigin};

    fn commit(offset: i64) -> Commit {
        Commit {
            offset,
            metadata: "m".into(),
            commit_timestamp_ms: 1,
            live: false,
        }
    }

    fn tp(topic: &str, p: i32) -> TopicPartition {
        TopicPartition::new(topic, p)
    }

    #[test]
    fn own_groups_are_never_wanted() {
        let all = NameFilter::new("g", &[".*"], "x", &[] as &[&str]).unwrap();
        assert!(group_wanted(&all, "payments"));
        assert!(!group_wanted(&all, "mirrorflow.ns/f.source"));
        assert!(!group_wanted(&all, "mirrorflow.f.checkpoints"));
        let some = NameFilter::new("g", &["pay.*"], "x", &["payX"]).unwrap();
        assert!(!group_wanted(&some, "orders"));
        assert!(!group_wanted(&some, "payX"));
    }

    #[test]
    fn loading_partitions_hold_commits_until_caught_up_then_release_them() {
        let mut c = Commits::default();
        c.assign(7);
        assert!(
            !c.apply(7, "g", tp("t", 0), Some(commit(5))),
            "still loading"
        );
        assert!(!c.apply(7, "g", tp("t", 0), Some(commit(9))), "latest wins");
        assert!(!c.apply(3, "h", tp("t", 0), Some(commit(1))), "not owned");
        assert_eq!(c.get("g", &tp("t", 0)), None, "hidden while loading");
        assert!(!c.all_caught_up());
        assert_eq!(c.caught_up(7), vec![("g".to_string(), tp("t", 0))]);
        assert!(c.caught_up(7).is_empty(), "only the first end counts");
        assert_eq!(
            c.get("g", &tp("t", 0)).map(|c| (c.offset, c.live)),
            Some((9, false))
        );
        assert!(c.apply(7, "g", tp("t", 0), Some(commit(12))));
        assert_eq!(c.get("g", &tp("t", 0)).map(|c| c.live), Some(true));
        c.settle("g", &tp("t", 0));
        assert_eq!(c.get("g", &tp("t", 0)).map(|c| c.live), Some(false));
        assert_eq!(c.groups_on(&tp("t", 0)).collect::<Vec<_>>(), ["g"]);
    }

    #[test]
    fn deletion_and_revocation_drop_groups_and_their_index() {
        let mut c = Commits::default();
        c.assign(1);
        c.caught_up(1);
        c.apply(1, "g", tp("t", 0), Some(commit(1)));
        c.apply(1, "g", tp("t", 1), Some(commit(1)));
        c.apply(1, "h", tp("t", 0), Some(commit(1)));
        c.apply(1, "g", tp("t", 1), None);
        assert_eq!(c.group("g").map(|g| g.len()), Some(1));
        assert_eq!(c.groups_on(&tp("t", 1)).count(), 0);
        c.apply(1, "g", tp("t", 0), None);
        assert!(c.group("g").is_none() && !c.is_owned_group("g"));
        let mut dropped = c.revoke(1);
        dropped.sort();
        assert_eq!(dropped, ["h"]);
        assert_eq!(c.groups_on(&tp("t", 0)).count(), 0);
        assert!(c.all_pairs().is_empty());
        assert!(c.all_caught_up(), "nothing owned");
    }

    fn naming_fixture() -> (PrefixPolicy, Filters) {
        let filters = Filters::new(&[".*"], &["secret.*"], &[".*"], &[] as &[&str]).unwrap();
        (PrefixPolicy::default(), filters)
    }

    #[test]
    fn evaluation_follows_translation_and_mm2_emission_rule() {
        let (policy, filters) = naming_fixture();
        let naming = Naming {
            policy: &policy,
            filters: &filters,
            source_alias: "A",
            target_alias: "B",
        };
        let mut store = OffsetSyncStore::new(StoreConfig::default());
        let mut tracker = CheckpointTracker::new();
        let conservative = Conservative::default();
        let t0 = tp("orders", 0);
        // Only the store, the tracker and the pair change from one evaluation to the next.
        let eval = |store: &OffsetSyncStore,
                    tracker: &CheckpointTracker,
                    tp: &TopicPartition,
                    commit: &Commit| {
            evaluate(&naming, store, tracker, &conservative, "g", tp, commit)
        };
        assert_eq!(
            eval(&store, &tracker, &t0, &commit(10)),
            Evaluation::Untranslatable(UnknownReason::Loading)
        );
        store.finish_initial_load();
        assert_eq!(
            eval(&store, &tracker, &t0, &commit(10)),
            Evaluation::Untranslatable(UnknownReason::NoSyncs)
        );
        store
            .update(&OffsetSync::new(t0.clone(), 0, 100), SyncOrigin::Dense)
            .unwrap();
        store
            .update(&OffsetSync::new(t0.clone(), 20, 120), SyncOrigin::Dense)
            .unwrap();
        let Evaluation::Emit(cp, Exactness::Exact) = eval(&store, &tracker, &t0, &commit(10))
        else {
            panic!("a covered commit is checkpointed");
        };
        assert_eq!(cp.topic_partition, tp("A.orders", 0));
        assert_eq!((cp.upstream_offset, cp.downstream_offset), (10, 110));
        assert_eq!(cp.metadata, "m");
        tracker.record(&cp);
        assert_eq!(
            eval(&store, &tracker, &t0, &commit(10)),
            Evaluation::Unchanged
        );
        assert!(matches!(
            eval(&store, &tracker, &t0, &commit(5)),
            Evaluation::Emit(
                Checkpoint {
                    upstream_offset: 5,
                    downstream_offset: 105,
                    ..
                },
                Exactness::Exact
            )
        ));
        for (topic, why) in [
            ("secret-x", "the topic filter excludes it"),
            (
                "B.orders",
                "a topic that came from the target would be a cycle",
            ),
        ] {
            assert_eq!(
                eval(&store, &tracker, &tp(topic, 0), &commit(1)),
                Evaluation::NotMirrored,
                "{why}"
            );
        }
    }
}
