//! An admin client of one cluster, named for its errors: listing, describing, creating,
//! growing and configuring topics. Topic discovery uses it for remote topics, and every loop for
//! the single-partition compacted topics it keeps (positions, offset syncs, checkpoints,
//! heartbeats): one way to create a topic, one meaning of an unreachable cluster
//! ([`super::is_unreachable`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, ConfigEntry, NewPartitions, NewTopic,
    OwnedResourceSpecifier, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::Side;
use super::acls::{self, AclBinding, AclError};

const ADMIN_TIMEOUT: Duration = Duration::from_secs(15);

/// What a request asked of one topic, for the errors naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicChange {
    Create,
    AddPartitions,
    AlterConfigs,
}

impl std::fmt::Display for TopicChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TopicChange::Create => "creating topic",
            TopicChange::AddPartitions => "adding partitions to",
            TopicChange::AlterConfigs => "altering configs of",
        })
    }
}

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
        what: TopicChange,
        topic: String,
        code: RDKafkaErrorCode,
    },
    /// A source topic's configs were not in the DescribeConfigs answer (not allowed, or the
    /// topic went away): its remote topic is not created until they are, because one created
    /// without them could lose records (a compacted topic copied under time retention).
    #[error(
        "{cluster} cluster: the configs of {topic} could not be read, so its remote topic {remote} \
         is not created yet; allow DescribeConfigs on the topic to the flow's principal"
    )]
    Undescribed {
        cluster: Side,
        topic: String,
        remote: String,
    },
    /// An ACL request (topic ACL sync), or one binding of it, failed.
    #[error("{cluster} cluster: {what}: {source}")]
    Acl {
        cluster: Side,
        what: String,
        #[source]
        source: AclError,
    },
}

impl AdminError {
    pub fn cluster(&self) -> Side {
        match self {
            AdminError::Kafka { cluster, .. }
            | AdminError::Refused { cluster, .. }
            | AdminError::Undescribed { cluster, .. }
            | AdminError::Acl { cluster, .. } => *cluster,
        }
    }

    /// Could not talk to the cluster at all, as opposed to a refused request
    /// ([`super::is_unreachable`]).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, AdminError::Kafka { source, .. } if super::is_unreachable(source))
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

    /// The cluster this client talks to.
    pub fn side(&self) -> Side {
        self.cluster
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
        Ok(self.failures(results, TopicChange::Create))
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
        Ok(self.failures(results, TopicChange::AddPartitions))
    }

    /// Deletes the records of `topic`/`partition` before `offset` (DeleteRecords): the log
    /// then starts there.
    pub async fn delete_before(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), AdminError> {
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
            .map_err(self.kafka("deleting records"))?;
        let answer = self
            .client
            .delete_records(&tpl, &Self::options())
            .await
            .map_err(self.kafka("deleting records"))?;
        match answer.find_partition(topic, partition).map(|e| e.error()) {
            Some(Err(source)) => Err(AdminError::Kafka {
                cluster: self.cluster,
                what: format!("deleting records of {topic}-{partition}"),
                source,
            }),
            _ => Ok(()),
        }
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
                what: TopicChange::AlterConfigs,
                topic: match spec {
                    OwnedResourceSpecifier::Topic(t) => t,
                    other => format!("{other:?}"),
                },
                code,
            })
            .collect())
    }

    /// Runs one of the blocking ACL calls on a blocking thread; its failure (or the thread's)
    /// is an [`AdminError::Acl`] saying `what` was done.
    async fn acl_call<T: Send + 'static>(
        &self,
        what: &'static str,
        call: impl FnOnce(&rdkafka::client::Client<DefaultClientContext>) -> Result<T, AclError>
        + Send
        + 'static,
    ) -> Result<T, AdminError> {
        let client = self.client.clone();
        let cluster = self.cluster;
        tokio::task::spawn_blocking(move || call(client.inner()))
            .await
            .map_err(|e| AclError {
                code: RDKafkaErrorCode::Fail,
                message: e.to_string(),
            })
            .and_then(|r| r)
            .map_err(|source| AdminError::Acl {
                cluster,
                what: what.into(),
                source,
            })
    }

    /// The ALLOW bindings on literal topic names ([`acls::topic_allow_filter`]). A cluster
    /// without an authorizer fails with `SecurityDisabled`.
    pub async fn topic_acls(&self) -> Result<Vec<AclBinding>, AdminError> {
        self.acl_call("describing topic ACLs", |client| {
            mirrorflow_rdkafka_ext::acls::describe_acls(
                client,
                &acls::topic_allow_filter(),
                ADMIN_TIMEOUT,
            )
        })
        .await
    }

    /// The operations this client's principal may perform on the cluster resource; `None`
    /// when the brokers did not say. A cluster without an authorizer allows all of them.
    pub async fn cluster_operations(&self) -> Result<Option<Vec<acls::Operation>>, AdminError> {
        self.acl_call("describing the cluster's authorized operations", |client| {
            mirrorflow_rdkafka_ext::acls::cluster_operations(client, ADMIN_TIMEOUT)
        })
        .await
    }

    /// Creates `bindings`; returns those that failed (an existing binding counts as created).
    pub async fn create_acls(
        &self,
        bindings: Vec<AclBinding>,
    ) -> Result<Vec<AdminError>, AdminError> {
        if bindings.is_empty() {
            return Ok(Vec::new());
        }
        let cluster = self.cluster;
        let made = bindings.clone();
        let results = self
            .acl_call("creating topic ACLs", move |client| {
                mirrorflow_rdkafka_ext::acls::create_acls(client, &made, ADMIN_TIMEOUT)
            })
            .await?;
        Ok(bindings
            .iter()
            .zip(results)
            .filter_map(|(b, r)| {
                r.err().map(|source| AdminError::Acl {
                    cluster,
                    what: format!(
                        "creating the ACL {} {:?} on topic {}",
                        b.principal, b.operation, b.name
                    ),
                    source,
                })
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
        what: TopicChange,
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
