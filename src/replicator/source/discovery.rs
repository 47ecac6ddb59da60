//! Topic discovery and remote topic upkeep: the I/O around [`super::topics`].
//!
//! Each round lists both clusters, creates missing remote topics with the source's partition
//! count and synced configs, grows partition counts, re-syncs configs when asked to, and
//! returns the source topics the consumer may subscribe to. Topics are created on the target
//! before they are subscribed to, so the producer never writes to a missing topic.

use crate::replicator::reach::Side;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigEntry, NewPartitions, NewTopic,
    OwnedResourceSpecifier, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::limits::RemoteLimits;
use super::topics::{self, Mirrored};
use crate::mm2::Filters;
use crate::replicator::Flow;

const ADMIN_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{cluster} cluster: {what}: {source}")]
    Kafka {
        cluster: Side,
        what: String,
        #[source]
        source: KafkaError,
    },
    #[error("{cluster} cluster: {what} {topic}: {code}")]
    Refused {
        cluster: Side,
        what: &'static str,
        topic: String,
        code: RDKafkaErrorCode,
    },
}

impl AdminError {
    pub fn cluster(&self) -> Side {
        match self {
            AdminError::Kafka { cluster, .. } | AdminError::Refused { cluster, .. } => *cluster,
        }
    }

    /// Could not talk to the cluster at all, as opposed to a refused request
    /// ([`crate::replicator::reach::is_unreachable`]).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, AdminError::Kafka { source, .. } if crate::replicator::reach::is_unreachable(source))
    }
}

/// An admin client of one cluster, named for errors.
#[derive(Clone)]
pub struct Admin {
    cluster: Side,
    client: Arc<AdminClient<DefaultClientContext>>,
}

impl Admin {
    pub fn new(cluster: Side, config: &ClientConfig) -> Result<Self, AdminError> {
        let client = config.create().map_err(|source| AdminError::Kafka {
            cluster,
            what: "creating an admin client".into(),
            source,
        })?;
        Ok(Admin {
            cluster,
            client: Arc::new(client),
        })
    }

    fn kafka(&self, what: impl Into<String>) -> impl FnOnce(KafkaError) -> AdminError {
        let (cluster, what) = (self.cluster, what.into());
        move |source| AdminError::Kafka {
            cluster,
            what,
            source,
        }
    }

    fn options() -> AdminOptions {
        AdminOptions::new()
            .request_timeout(Some(ADMIN_TIMEOUT))
            .operation_timeout(Some(ADMIN_TIMEOUT))
    }

    /// Topic name -> partition count, from the cluster's metadata.
    pub async fn list(&self) -> Result<BTreeMap<String, i32>, AdminError> {
        let client = self.client.clone();
        let md =
            tokio::task::spawn_blocking(move || client.inner().fetch_metadata(None, ADMIN_TIMEOUT))
                .await
                .map_err(|e| AdminError::Kafka {
                    cluster: self.cluster,
                    what: format!("listing topics: {e}"),
                    source: KafkaError::Canceled,
                })?
                .map_err(self.kafka("listing topics"))?;
        Ok(md
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| (t.name().to_string(), t.partitions().len() as i32))
            .collect())
    }

    /// Configs of the given topics; topics that vanished meanwhile are left out.
    pub async fn describe(
        &self,
        topics: &[&str],
    ) -> Result<HashMap<String, Vec<ConfigEntry>>, AdminError> {
        if topics.is_empty() {
            return Ok(HashMap::new());
        }
        let specs: Vec<ResourceSpecifier<'_>> =
            topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let results = self
            .client
            .describe_configs(&specs, &Self::options())
            .await
            .map_err(self.kafka("describing topic configs"))?;
        Ok(results
            .into_iter()
            .filter_map(Result::ok)
            .filter_map(|r| match r.specifier {
                OwnedResourceSpecifier::Topic(t) => Some((t, r.entries)),
                _ => None,
            })
            .collect())
    }

    /// Creates topics; returns those that failed (already existing counts as created).
    pub async fn create(
        &self,
        topics: &[(String, i32, BTreeMap<String, String>)],
        replication_factor: i32,
    ) -> Result<Vec<AdminError>, AdminError> {
        if topics.is_empty() {
            return Ok(Vec::new());
        }
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|(name, partitions, configs)| {
                configs.iter().fold(
                    NewTopic::new(
                        name,
                        *partitions,
                        TopicReplication::Fixed(replication_factor),
                    ),
                    |t, (k, v)| t.set(k, v),
                )
            })
            .collect();
        let results = self
            .client
            .create_topics(&new, &Self::options())
            .await
            .map_err(self.kafka("creating topics"))?;
        Ok(self.failures(results, "creating topic"))
    }

    /// Raises partition counts; returns the failures.
    pub async fn grow(&self, topics: &[(String, i32)]) -> Result<Vec<AdminError>, AdminError> {
        if topics.is_empty() {
            return Ok(Vec::new());
        }
        let new: Vec<NewPartitions<'_>> = topics
            .iter()
            .map(|(name, count)| NewPartitions::new(name, usize::try_from(*count).unwrap_or(0)))
            .collect();
        let results = self
            .client
            .create_partitions(&new, &Self::options())
            .await
            .map_err(self.kafka("adding partitions"))?;
        Ok(self.failures(results, "adding partitions to"))
    }

    /// Replaces the dynamic configs of topics; returns the failures.
    pub async fn alter(
        &self,
        updates: &[(String, BTreeMap<String, String>)],
    ) -> Result<Vec<AdminError>, AdminError> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        let alters: Vec<AlterConfig<'_>> = updates
            .iter()
            .map(|(topic, configs)| {
                configs.iter().fold(
                    AlterConfig::new(ResourceSpecifier::Topic(topic)),
                    |a, (k, v)| a.set(k, v),
                )
            })
            .collect();
        let results = self
            .client
            .alter_configs(&alters, &Self::options())
            .await
            .map_err(self.kafka("altering topic configs"))?;
        Ok(results
            .into_iter()
            .filter_map(|r| r.err())
            .map(|(spec, code)| AdminError::Refused {
                cluster: self.cluster,
                what: "altering configs of",
                topic: match spec {
                    OwnedResourceSpecifier::Topic(t) => t,
                    other => format!("{other:?}"),
                },
                code,
            })
            .collect())
    }

    /// Creates a compacted single-partition topic unless it exists.
    pub async fn ensure_compacted(
        &self,
        topic: &str,
        replication_factor: i32,
    ) -> Result<(), AdminError> {
        let configs = BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]);
        let failures = self
            .create(&[(topic.to_string(), 1, configs)], replication_factor)
            .await?;
        match failures.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn failures(
        &self,
        results: Vec<Result<String, (String, RDKafkaErrorCode)>>,
        what: &'static str,
    ) -> Vec<AdminError> {
        results
            .into_iter()
            .filter_map(|r| match r {
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) | Ok(_) => None,
                Err((topic, code)) => Some(AdminError::Refused {
                    cluster: self.cluster,
                    what,
                    topic,
                    code,
                }),
            })
            .collect()
    }
}

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
}

impl Discovery {
    pub fn new(flow: Flow, source: Admin, target: Admin, limits: RemoteLimits) -> Self {
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
