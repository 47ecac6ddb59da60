//! Topic discovery and remote topic upkeep: the I/O around [`super::topics`].
//!
//! Each round lists both clusters, creates missing remote topics with the source's partition
//! count and synced configs, grows partition counts, re-syncs configs when asked to, and
//! returns the source topics the consumer may subscribe to; it also copies the source's topic
//! ACLs when asked to ([`super::acl_sync`]). Topics are created on the target
//! before they are subscribed to, so the producer never writes to a missing topic.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rdkafka::admin::ConfigEntry;

pub use crate::kafka::admin::{Admin, AdminError, TopicChange};

use super::acl_sync::AclSync;
use super::limits::RemoteLimits;
use super::topics::{self, Mirrored, Plan};
use crate::flow::Flow;
use crate::kafka::Side;
use crate::mm2::Filters;

/// The outcome of one discovery round.
#[derive(Debug, Default)]
pub struct Round {
    /// Source topics to subscribe to, with their partition counts.
    pub subscription: Vec<(String, i32)>,
    /// Requests the clusters refused this round (logged and counted; retried next round).
    pub refused: Vec<AdminError>,
}

/// Keeps the target's remote topics in line with the source.
pub struct Discovery {
    flow: Flow,
    filters: Filters,
    pub source: Admin,
    pub target: Admin,
    known: BTreeSet<String>,
    cycles_logged: BTreeSet<String>,
    /// Filled each round for the copier, which keeps batches under them.
    limits: RemoteLimits,
    acls: AclSync,
}

impl Discovery {
    pub fn new(
        flow: Flow,
        source: Admin,
        target: Admin,
        limits: RemoteLimits,
        metrics: crate::replicator::metrics::Metrics,
    ) -> Self {
        let filters = Filters {
            topics: flow.topics.clone(),
            groups: flow.groups.clone(),
        };
        Discovery {
            flow,
            filters,
            source,
            target,
            known: BTreeSet::new(),
            cycles_logged: BTreeSet::new(),
            limits,
            acls: AclSync::new(metrics),
        }
    }

    pub async fn round(&mut self) -> Result<Round, AdminError> {
        let source = self.source.list().await?;
        let target = self.target.list().await?;
        let plan = topics::plan(
            &self.filters,
            self.flow.policy.as_ref(),
            self.flow.source_alias(),
            self.flow.target_alias(),
            &source,
            &target,
        );
        for t in &plan.cycles {
            if self.cycles_logged.insert(t.clone()) {
                tracing::info!(topic = %t, target = %self.flow.target_alias(),
                    "not replicating a topic that came from the target (cycle)");
            }
        }
        let sync_configs = self.flow.spec.source_loop.sync_topic_configs;
        let source_configs = self
            .source
            .describe(&configs_needed(&plan, sync_configs))
            .await?;
        let (creates, mut refused) = creations(&plan, &source_configs);
        let rf = self.flow.spec.source_loop.replication_factor;
        refused.extend(self.target.create(&creates, rf).await?);
        refused.extend(self.target.grow(&plan.grow).await?);
        if sync_configs {
            let existing = existing(&plan);
            let remote_names: Vec<&str> = existing.iter().map(|m| m.remote.as_str()).collect();
            let target_configs = self.target.describe(&remote_names).await?;
            let updates = config_updates(&existing, &source_configs, &target_configs);
            for (topic, _) in &updates {
                tracing::info!(topic = %topic, "syncing topic configs from the source");
            }
            refused.extend(self.target.alter(&updates).await?);
        }
        if self.flow.spec.source_loop.sync_topic_acls {
            self.acls
                .round(&self.source, &self.target, &plan.mirrored)
                .await;
        }
        // After creation and config sync, so the copier sees the limits records will meet.
        let remotes: Vec<&str> = plan.mirrored.iter().map(|m| m.remote.as_str()).collect();
        self.limits.update(&self.target.describe(&remotes).await?);
        let subscription = plan.subscription(&failed_creations(&plan, &refused));
        for (t, _) in &subscription {
            if self.known.insert(t.clone()) {
                tracing::info!(topic = %t, remote = %self.flow.policy.format_remote_topic(self.flow.source_alias(), t),
                    "replicating topic");
            }
        }
        for (remote, count) in &plan.grow {
            tracing::info!(topic = %remote, partitions = count, "added partitions to the remote topic");
        }
        Ok(Round {
            subscription,
            refused,
        })
    }
}

/// Topic configs as a cluster described them, by topic name.
type Described = HashMap<String, Vec<ConfigEntry>>;

/// The source topics whose configs a round needs: those whose remote topic is created now, and
/// every mirrored one when configs are synced.
fn configs_needed(plan: &Plan, sync_configs: bool) -> Vec<&str> {
    plan.mirrored
        .iter()
        .filter(|m| sync_configs || plan.create.contains(m))
        .map(|m| m.source.as_str())
        .collect()
}

/// A remote topic to create: name, partitions, configs.
type Creation = (String, i32, BTreeMap<String, String>);

/// The remote topics to create, each with its source's partition count and syncable configs;
/// and those not created this round because the source did not describe their configs
/// ([`AdminError::Undescribed`]: not allowed, or deleted meanwhile), retried every round.
fn creations(plan: &Plan, source_configs: &Described) -> (Vec<Creation>, Vec<AdminError>) {
    let mut creates = Vec::new();
    let mut undescribed = Vec::new();
    for m in &plan.create {
        match source_configs.get(&m.source) {
            Some(entries) => creates.push((
                m.remote.clone(),
                m.partitions,
                topics::syncable_configs(entries),
            )),
            None => undescribed.push(AdminError::Undescribed {
                cluster: Side::Source,
                topic: m.source.clone(),
                remote: m.remote.clone(),
            }),
        }
    }
    (creates, undescribed)
}

/// The mirrored topics whose remote topic exists already (not created this round).
fn existing(plan: &Plan) -> Vec<&Mirrored> {
    plan.mirrored
        .iter()
        .filter(|m| !plan.create.contains(m))
        .collect()
}

/// The config writes that bring existing remote topics in line with their source. A topic
/// either cluster did not describe is left alone: a write replaces every dynamic config of the
/// remote topic, so unknown source configs taken as none would wipe the target's
/// (`cleanup.policy`, `retention.ms`) rather than sync them.
fn config_updates(
    existing: &[&Mirrored],
    source_configs: &Described,
    target_configs: &Described,
) -> Vec<(String, BTreeMap<String, String>)> {
    existing
        .iter()
        .filter_map(|m| {
            let desired = topics::syncable_configs(source_configs.get(&m.source)?);
            let current = target_configs.get(&m.remote)?;
            topics::config_update(&desired, current).map(|u| (m.remote.clone(), u))
        })
        .collect()
}

/// The remote topics not created this round (refused by the target, or held back for want of
/// the source's configs). They are not subscribed to (the producer would write to a missing
/// topic) until a later round creates them; a topic whose growth failed still is, its new
/// partitions fail to copy until a later round grows it.
fn failed_creations(plan: &Plan, refused: &[AdminError]) -> BTreeSet<String> {
    plan.create
        .iter()
        .filter(|m| {
            refused.iter().any(|e| match e {
                AdminError::Refused { topic, .. } => *topic == m.remote,
                AdminError::Undescribed { remote, .. } => *remote == m.remote,
                _ => false,
            })
        })
        .map(|m| m.remote.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The topics of a subscription, without their partition counts.
    fn names(subscription: Vec<(String, i32)>) -> Vec<String> {
        subscription.into_iter().map(|(t, _)| t).collect()
    }
    use crate::mm2::{DEFAULT_TOPICS_EXCLUDE, Filters, PrefixPolicy};
    use proptest::prelude::*;
    use rdkafka::admin::ConfigSource;
    use rdkafka::types::RDKafkaErrorCode;

    /// Source alias `A`, target alias `B`, MM2's naming.
    fn plan_for(include: &[&str], source: &[(&str, i32)], target: &[(&str, i32)]) -> Plan {
        let filters = Filters::new(include, DEFAULT_TOPICS_EXCLUDE, &[".*"], &[]).unwrap();
        let listing = |items: &[(&str, i32)]| -> BTreeMap<String, i32> {
            items.iter().map(|(t, p)| (t.to_string(), *p)).collect()
        };
        topics::plan(
            &filters,
            &PrefixPolicy::default(),
            "A",
            "B",
            &listing(source),
            &listing(target),
        )
    }

    fn topic_config(name: &str, value: &str) -> ConfigEntry {
        ConfigEntry {
            name: name.into(),
            value: Some(value.into()),
            source: ConfigSource::DynamicTopic,
            is_default: false,
            is_read_only: false,
            is_sensitive: false,
        }
    }

    fn described(topics: &[(&str, &[(&str, &str)])]) -> Described {
        topics
            .iter()
            .map(|(t, entries)| {
                let entries = entries.iter().map(|(k, v)| topic_config(k, v)).collect();
                (t.to_string(), entries)
            })
            .collect()
    }

    fn configs(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn refused(topic: &str, what: TopicChange) -> AdminError {
        AdminError::Refused {
            cluster: Side::Target,
            what,
            topic: topic.into(),
            code: RDKafkaErrorCode::PolicyViolation,
        }
    }

    /// Every source topic of `plan` described, with no dynamic configs.
    fn every_source_described(plan: &Plan) -> Described {
        plan.mirrored
            .iter()
            .map(|m| (m.source.clone(), Vec::new()))
            .collect()
    }

    #[test]
    fn a_missing_remote_topic_is_created_with_the_sources_partitions_and_configs() {
        let plan = plan_for(&["orders"], &[("orders", 3)], &[]);
        let source = described(&[(
            "orders",
            &[
                ("cleanup.policy", "compact"),
                // The target's operators decide durability: never copied.
                ("min.insync.replicas", "2"),
            ],
        )]);
        let (creates, undescribed) = creations(&plan, &source);
        assert_eq!(
            creates,
            [(
                "A.orders".to_string(),
                3,
                configs(&[("cleanup.policy", "compact")])
            )]
        );
        assert!(undescribed.is_empty());
        assert!(existing(&plan).is_empty());
        assert_eq!(
            names(plan.subscription(&failed_creations(&plan, &[]))),
            ["orders"]
        );
    }

    #[test]
    fn a_topic_whose_source_configs_are_unknown_is_neither_created_nor_subscribed_yet() {
        // Created without them, a compacted topic would be copied under time retention and
        // lose records on the target; the next round that reads them creates it.
        let plan = plan_for(&[".*"], &[("orders", 3), ("ledger", 1)], &[]);
        let source = described(&[("orders", &[])]);
        let (creates, undescribed) = creations(&plan, &source);
        let created: Vec<&str> = creates.iter().map(|(r, ..)| r.as_str()).collect();
        assert_eq!(created, ["A.orders"]);
        assert_eq!(undescribed.len(), 1);
        let message = undescribed[0].to_string();
        assert!(
            message.contains("ledger") && message.contains("A.ledger"),
            "{message}"
        );
        assert!(message.contains("DescribeConfigs"), "{message}");
        assert_eq!(
            names(plan.subscription(&failed_creations(&plan, &undescribed))),
            ["orders"]
        );
        let next_round = described(&[
            ("orders", &[]),
            ("ledger", &[("cleanup.policy", "compact")]),
        ]);
        let (creates, undescribed) = creations(&plan, &next_round);
        assert_eq!(creates.len(), 2);
        assert!(undescribed.is_empty());
    }

    #[test]
    fn only_topics_created_this_round_are_described_unless_configs_are_synced() {
        let plan = plan_for(
            &["orders", "payments"],
            &[("orders", 3), ("payments", 2)],
            &[("A.payments", 2)],
        );
        assert_eq!(configs_needed(&plan, false), ["orders"]);
        assert_eq!(configs_needed(&plan, true), ["orders", "payments"]);
    }

    #[test]
    fn filtered_internal_and_cyclic_topics_get_no_remote_topic_and_no_subscription() {
        let plan = plan_for(
            &["orders"],
            &[
                ("orders", 1),
                ("other", 1),
                ("__consumer_offsets", 50),
                ("mm2-offset-syncs.B.internal", 1),
                ("B.checkpoints.internal", 1),
                // Came from the target: copying it back would close a cycle.
                ("B.orders", 1),
                ("B.heartbeats", 1),
                // A copy of our own heartbeats made by a flow B -> A... -> A.
                ("A.heartbeats", 1),
                // Heartbeats are copied whatever the topic lists say, also from a third cluster.
                ("heartbeats", 1),
                ("C.heartbeats", 1),
            ],
            &[],
        );
        let created: Vec<String> = creations(&plan, &every_source_described(&plan))
            .0
            .into_iter()
            .map(|(remote, ..)| remote)
            .collect();
        assert_eq!(created, ["A.C.heartbeats", "A.heartbeats", "A.orders"]);
        assert_eq!(
            names(plan.subscription(&failed_creations(&plan, &[]))),
            ["C.heartbeats", "heartbeats", "orders"]
        );
        assert_eq!(plan.cycles, ["A.heartbeats", "B.heartbeats", "B.orders"]);
    }

    #[test]
    fn a_remote_topic_with_fewer_partitions_is_grown_and_stays_subscribed_when_growth_fails() {
        let plan = plan_for(
            &[".*"],
            &[("orders", 6), ("small", 1)],
            &[("A.orders", 3), ("A.small", 4)],
        );
        assert_eq!(plan.grow, [("A.orders".to_string(), 6)]);
        let (creates, undescribed) = creations(&plan, &every_source_described(&plan));
        assert!(creates.is_empty() && undescribed.is_empty());
        let refusals = [refused("A.orders", TopicChange::AddPartitions)];
        assert!(failed_creations(&plan, &refusals).is_empty());
        assert_eq!(
            names(plan.subscription(&failed_creations(&plan, &refusals))),
            ["orders", "small"]
        );
    }

    #[test]
    fn a_refused_creation_is_not_subscribed_until_a_later_round_creates_it() {
        let plan = plan_for(
            &[".*"],
            &[("orders", 1), ("payments", 1), ("refunds", 1)],
            &[("A.refunds", 1)],
        );
        // A refused config write of an existing topic keeps it subscribed.
        let refusals = [
            refused("A.orders", TopicChange::Create),
            refused("A.refunds", TopicChange::AlterConfigs),
        ];
        let failed = failed_creations(&plan, &refusals);
        assert_eq!(failed, BTreeSet::from(["A.orders".to_string()]));
        assert_eq!(names(plan.subscription(&failed)), ["payments", "refunds"]);
        let next_round = plan_for(
            &[".*"],
            &[("orders", 1), ("payments", 1), ("refunds", 1)],
            &[("A.orders", 1), ("A.payments", 1), ("A.refunds", 1)],
        );
        assert_eq!(
            names(next_round.subscription(&failed_creations(&next_round, &[]))),
            ["orders", "payments", "refunds"]
        );
    }

    #[test]
    fn existing_remote_topics_take_the_sources_configs_and_keep_the_targets_excluded_ones() {
        let plan = plan_for(
            &[".*"],
            &[("orders", 1), ("synced", 1), ("new", 1)],
            &[("A.orders", 1), ("A.synced", 1)],
        );
        let remotes: Vec<&str> = existing(&plan).iter().map(|m| m.remote.as_str()).collect();
        // The topic created this round got its configs at creation.
        assert_eq!(remotes, ["A.orders", "A.synced"]);
        let source = described(&[
            (
                "orders",
                &[("cleanup.policy", "compact"), ("retention.ms", "-1")],
            ),
            ("synced", &[("retention.ms", "1000")]),
            ("new", &[("retention.ms", "5")]),
        ]);
        let target = described(&[
            (
                "A.orders",
                &[("cleanup.policy", "delete"), ("min.insync.replicas", "2")],
            ),
            ("A.synced", &[("retention.ms", "1000")]),
        ]);
        assert_eq!(
            config_updates(&existing(&plan), &source, &target),
            [(
                "A.orders".to_string(),
                configs(&[
                    ("cleanup.policy", "compact"),
                    ("min.insync.replicas", "2"),
                    ("retention.ms", "-1"),
                ])
            )]
        );
    }

    #[test]
    fn a_source_topic_that_was_not_described_leaves_its_remote_configs_alone() {
        // Deleted on the source between the listing and the describe, or not describable: its
        // configs are unknown, not empty. The write replaces every dynamic config, so taking
        // them as none would turn a compacted, keep-forever remote into one deleted by
        // retention.
        let plan = plan_for(&[".*"], &[("orders", 1)], &[("A.orders", 1)]);
        let target = described(&[(
            "A.orders",
            &[("cleanup.policy", "compact"), ("retention.ms", "-1")],
        )]);
        assert_eq!(
            config_updates(&existing(&plan), &Described::new(), &target),
            []
        );
    }

    #[test]
    fn a_remote_topic_the_target_did_not_describe_is_not_written() {
        let plan = plan_for(&[".*"], &[("orders", 1)], &[("A.orders", 1)]);
        let source = described(&[("orders", &[("cleanup.policy", "compact")])]);
        assert_eq!(
            config_updates(&existing(&plan), &source, &Described::new()),
            []
        );
    }

    fn listing() -> impl Strategy<Value = BTreeMap<String, i32>> {
        let name = prop::sample::select(vec![
            "orders",
            "payments",
            "heartbeats",
            "A.orders",
            "B.orders",
            "C.orders",
            "__consumer_offsets",
            "x.internal",
        ]);
        prop::collection::btree_map(name.prop_map(String::from), 1..8i32, 0..8)
    }

    proptest! {
        /// Whatever the clusters hold, a subscribed topic's remote exists or is created this
        /// round, and has (or is given) at least the source's partitions: the producer never
        /// writes to a missing topic or partition, except one whose growth the target refused.
        #[test]
        fn every_subscribed_topic_has_a_remote_with_enough_partitions(
            source in listing(),
            remote in listing(),
            refuse in prop::collection::vec(any::<bool>(), 8),
        ) {
            // The target holds remote topics under their remote names.
            let target: BTreeMap<String, i32> =
                remote.into_iter().map(|(t, p)| (format!("A.{t}"), p)).collect();
            let source_listing: Vec<(&str, i32)> =
                source.iter().map(|(t, p)| (t.as_str(), *p)).collect();
            let target_listing: Vec<(&str, i32)> =
                target.iter().map(|(t, p)| (t.as_str(), *p)).collect();
            let plan = plan_for(&[".*"], &source_listing, &target_listing);
            let (creates, undescribed) = creations(&plan, &every_source_described(&plan));
            prop_assert!(undescribed.is_empty());
            let refusals: Vec<AdminError> = creates
                .iter()
                .zip(&refuse)
                .filter(|(_, refused)| **refused)
                .map(|((remote, ..), _)| refused(remote, TopicChange::Create))
                .collect();
            let subscription = plan.subscription(&failed_creations(&plan, &refusals));
            for (topic, counted) in &subscription {
                let remote = format!("A.{topic}");
                let partitions = source[topic];
                prop_assert_eq!(*counted, partitions, "the subscription carries the source's count");
                let created = creates
                    .iter()
                    .any(|(r, p, _)| *r == remote && *p == partitions)
                    && !refusals
                        .iter()
                        .any(|e| matches!(e, AdminError::Refused { topic: t, .. } if *t == remote));
                let there = target.get(&remote).is_some_and(|&p| p >= partitions);
                let grown = plan.grow.contains(&(remote.clone(), partitions));
                prop_assert!(created || there || grown, "{topic} -> {remote}");
                prop_assert!(!topic.starts_with("B.") && !topic.starts_with("__"));
            }
            for (remote, ..) in &creates {
                prop_assert!(!target.contains_key(remote));
            }
        }
    }
}
