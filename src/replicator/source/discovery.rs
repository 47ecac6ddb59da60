//! Topic discovery and remote topic upkeep: the I/O around [`super::topics`].
//!
//! Each round lists both clusters, creates missing remote topics with the source's partition
//! count and synced configs, grows partition counts, re-syncs configs when asked to, and
//! returns the source topics the consumer may subscribe to; it also copies the source's topic
//! ACLs when asked to ([`super::acl_sync`]). Topics are created on the target
//! before they are subscribed to, so the producer never writes to a missing topic.

use std::collections::{BTreeMap, BTreeSet};

pub use crate::kafka::admin::{Admin, AdminError};

use super::acl_sync::AclSync;
use super::limits::RemoteLimits;
use super::topics::{self, Mirrored};
use crate::mm2::Filters;
use crate::replicator::Flow;

/// The outcome of one discovery round.
#[derive(Debug, Default)]
pub struct Round {
    /// Source topics to subscribe to.
    pub subscription: Vec<String>,
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
        let to_describe: Vec<&str> = plan
            .mirrored
            .iter()
            .filter(|m| sync_configs || plan.create.contains(m))
            .map(|m| m.source.as_str())
            .collect();
        let source_configs = self.source.describe(&to_describe).await?;
        let desired = |m: &Mirrored| {
            source_configs
                .get(&m.source)
                .map(|e| topics::syncable_configs(e))
                .unwrap_or_default()
        };
        let mut refused = Vec::new();
        let creates: Vec<(String, i32, BTreeMap<String, String>)> = plan
            .create
            .iter()
            .map(|m| (m.remote.clone(), m.partitions, desired(m)))
            .collect();
        let rf = self.flow.spec.source_loop.replication_factor;
        refused.extend(self.target.create(&creates, rf).await?);
        refused.extend(self.target.grow(&plan.grow).await?);
        if sync_configs {
            let existing: Vec<&Mirrored> = plan
                .mirrored
                .iter()
                .filter(|m| !plan.create.contains(m))
                .collect();
            let remote_names: Vec<&str> = existing.iter().map(|m| m.remote.as_str()).collect();
            let target_configs = self.target.describe(&remote_names).await?;
            let updates: Vec<(String, BTreeMap<String, String>)> = existing
                .iter()
                .filter_map(|m| {
                    let current = target_configs.get(&m.remote)?;
                    topics::config_update(&desired(m), current).map(|u| (m.remote.clone(), u))
                })
                .collect();
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
        // A topic whose creation failed is not subscribed to; one whose growth failed still is,
        // its new partitions fail to copy until a later round grows it.
        let failed: BTreeSet<String> = plan
            .create
            .iter()
            .filter(|m| {
                refused
                    .iter()
                    .any(|e| matches!(e, AdminError::Refused { topic, .. } if *topic == m.remote))
            })
            .map(|m| m.remote.clone())
            .collect();
        let subscription = plan.subscription(&failed);
        for t in &subscription {
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
