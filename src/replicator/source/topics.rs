//! Which source topics are replicated and what the target needs for them (pure).
//!
//! [`plan`] turns a listing of both clusters into actions (create, grow) and the consumer's
//! subscription; [`syncable_configs`] and [`config_update`] decide which topic configs follow
//! the source, with MirrorMaker 2's exclusions.

use std::collections::{BTreeMap, BTreeSet};

use rdkafka::admin::{ConfigEntry, ConfigSource};

use crate::mm2::{Filters, ReplicationPolicy, TopicDecision};

/// Topic configs MM2 never copies: replication throttles, timestamp handling and durability
/// settings belong to the target cluster's operators.
pub const EXCLUDED_CONFIGS: &[&str] = &[
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
    "message.timestamp.difference.max.ms",
    "message.timestamp.type",
    "unclean.leader.election.enable",
    "min.insync.replicas",
];

/// One replicated topic: its name on both sides and the source's partition count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirrored {
    pub source: String,
    pub remote: String,
    pub partitions: i32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Every topic to replicate, by source name.
    pub mirrored: Vec<Mirrored>,
    /// Remote topics to create, with the source's partition count.
    pub create: Vec<Mirrored>,
    /// Remote topics with fewer partitions than their source: (remote name, new count).
    pub grow: Vec<(String, i32)>,
    /// Source topics skipped because they would close a cycle (for logs).
    pub cycles: Vec<String>,
}

impl Plan {
    /// The source topics the consumer may read now: those whose remote topic exists, or is
    /// about to, with at least as many partitions as the source once the actions succeeded;
    /// with their partition counts.
    pub fn subscription(&self, failed: &BTreeSet<String>) -> Vec<(String, i32)> {
        self.mirrored
            .iter()
            .filter(|m| !failed.contains(&m.remote))
            .map(|m| (m.source.clone(), m.partitions))
            .collect()
    }
}

/// Decides per source topic (MM2's `shouldReplicateTopic`) and compares partition counts.
/// `source` and `target` map topic names to partition counts.
pub fn plan(
    filters: &Filters,
    policy: &dyn ReplicationPolicy,
    source_alias: &str,
    target_alias: &str,
    source: &BTreeMap<String, i32>,
    target: &BTreeMap<String, i32>,
) -> Plan {
    let mut plan = Plan::default();
    for (topic, &partitions) in source {
        match filters.topic_decision(policy, topic, source_alias, target_alias) {
            TopicDecision::Replicate => {}
            TopicDecision::Skip(crate::mm2::SkipReason::Cycle) => {
                plan.cycles.push(topic.clone());
                continue;
            }
            TopicDecision::Skip(_) => continue,
        }
        let m = Mirrored {
            source: topic.clone(),
            remote: policy.format_remote_topic(source_alias, topic),
            partitions,
        };
        match target.get(&m.remote) {
            None => plan.create.push(m.clone()),
            Some(&have) if have < partitions => plan.grow.push((m.remote.clone(), partitions)),
            Some(_) => {}
        }
        plan.mirrored.push(m);
    }
    plan
}

/// The source topic's configs to copy: those set on the topic itself (as MM2 with its
/// default `use.defaults.from=target`), neither read-only nor sensitive nor excluded.
pub fn syncable_configs(entries: &[ConfigEntry]) -> BTreeMap<String, String> {
    entries
        .iter()
        .filter(|e| {
            e.source == ConfigSource::DynamicTopic
                && !e.is_default
                && !e.is_read_only
                && !e.is_sensitive
                && !EXCLUDED_CONFIGS.contains(&e.name.as_str())
        })
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect()
}

/// The full set of topic configs to write to a remote topic, or `None` when it already has
/// them. The write replaces every dynamic config of the topic (AlterConfigs), so the target's
/// own values for excluded keys are carried over: they are the target's business.
pub fn config_update(
    desired: &BTreeMap<String, String>,
    target: &[ConfigEntry],
) -> Option<BTreeMap<String, String>> {
    let current: BTreeMap<&str, &str> = target
        .iter()
        .filter(|e| e.source == ConfigSource::DynamicTopic && !e.is_sensitive)
        .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
        .collect();
    let up_to_date = desired
        .iter()
        .all(|(k, v)| current.get(k.as_str()) == Some(&v.as_str()))
        && current
            .keys()
            .all(|k| desired.contains_key(*k) || EXCLUDED_CONFIGS.contains(k));
    if up_to_date {
        return None;
    }
    let mut update = desired.clone();
    for (k, v) in current {
        if EXCLUDED_CONFIGS.contains(&k) {
            update.insert(k.to_string(), v.to_string());
        }
    }
    Some(update)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm2::{NameFilter, PrefixPolicy};

    fn filters(include: &[&str]) -> Filters {
        let all = NameFilter::new("t", &[".*"], "x", &[]).unwrap();
        Filters {
            topics: NameFilter::new(
                "spec.topics",
                include,
                "spec.topicsExclude",
                crate::mm2::DEFAULT_TOPICS_EXCLUDE,
            )
            .unwrap(),
            groups: all,
        }
    }

    fn listing(items: &[(&str, i32)]) -> BTreeMap<String, i32> {
        items.iter().map(|(t, p)| (t.to_string(), *p)).collect()
    }

    fn entry(name: &str, value: &str, source: ConfigSource) -> ConfigEntry {
        ConfigEntry {
            name: name.into(),
            value: Some(value.into()),
            is_default: source == ConfigSource::Default,
            source,
            is_read_only: false,
            is_sensitive: false,
        }
    }

    #[test]
    fn plan_creates_grows_and_skips_like_mm2() {
        let source = listing(&[
            ("orders", 3),
            ("payments", 2),
            ("heartbeats", 1),
            ("B.orders", 1),
            ("__consumer_offsets", 50),
            ("mm2-offset-syncs.B.internal", 1),
            ("other", 1),
        ]);
        let target = listing(&[("A.payments", 1), ("A.orders", 3)]);
        let p = plan(
            &filters(&["orders", "payments"]),
            &PrefixPolicy::default(),
            "A",
            "B",
            &source,
            &target,
        );
        let names: Vec<&str> = p.mirrored.iter().map(|m| m.remote.as_str()).collect();
        assert_eq!(names, ["A.heartbeats", "A.orders", "A.payments"]);
        assert_eq!(p.create.len(), 1);
        assert_eq!(p.create[0].remote, "A.heartbeats");
        assert_eq!(p.grow, [("A.payments".to_string(), 2)]);
        assert_eq!(p.cycles, ["B.orders"]);
        let failed = BTreeSet::from(["A.heartbeats".to_string()]);
        assert_eq!(
            p.subscription(&failed),
            [("orders".to_string(), 3), ("payments".to_string(), 2)],
            "the source's partition counts, even where the remote has fewer"
        );
    }

    #[test]
    fn partition_counts_only_grow() {
        let p = plan(
            &filters(&[".*"]),
            &PrefixPolicy::default(),
            "A",
            "B",
            &listing(&[("t", 2)]),
            &listing(&[("A.t", 5)]),
        );
        assert!(p.grow.is_empty() && p.create.is_empty());
        assert_eq!(p.mirrored.len(), 1);
    }

    #[test]
    fn only_topic_level_non_excluded_configs_are_copied() {
        let mut sensitive = entry("sasl.secret", "x", ConfigSource::DynamicTopic);
        sensitive.is_sensitive = true;
        let mut read_only = entry("ro", "x", ConfigSource::DynamicTopic);
        read_only.is_read_only = true;
        let entries = [
            entry("cleanup.policy", "compact", ConfigSource::DynamicTopic),
            entry("retention.ms", "1000", ConfigSource::DynamicTopic),
            entry("min.insync.replicas", "2", ConfigSource::DynamicTopic),
            entry(
                "message.timestamp.type",
                "LogAppendTime",
                ConfigSource::DynamicTopic,
            ),
            entry("segment.bytes", "1", ConfigSource::StaticBroker),
            entry("flush.ms", "1", ConfigSource::Default),
            sensitive,
            read_only,
        ];
        let got = syncable_configs(&entries);
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            [
                ("cleanup.policy".to_string(), "compact".to_string()),
                ("retention.ms".to_string(), "1000".to_string())
            ]
        );
    }

    #[test]
    fn config_update_keeps_the_targets_excluded_keys() {
        let desired = BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]);
        let same = [
            entry("cleanup.policy", "compact", ConfigSource::DynamicTopic),
            entry("min.insync.replicas", "2", ConfigSource::DynamicTopic),
            entry("retention.ms", "5", ConfigSource::Default),
        ];
        assert_eq!(config_update(&desired, &same), None);
        let changed = [
            entry("cleanup.policy", "delete", ConfigSource::DynamicTopic),
            entry("min.insync.replicas", "2", ConfigSource::DynamicTopic),
        ];
        let update = config_update(&desired, &changed).unwrap();
        assert_eq!(
            update.get("cleanup.policy").map(String::as_str),
            Some("compact")
        );
        assert_eq!(
            update.get("min.insync.replicas").map(String::as_str),
            Some("2")
        );
        // A config removed on the source is removed on the target too.
        let extra = [
            entry("cleanup.policy", "compact", ConfigSource::DynamicTopic),
            entry("retention.ms", "5", ConfigSource::DynamicTopic),
        ];
        assert_eq!(config_update(&desired, &extra), Some(desired.clone()));
    }
}
