//! Reading partition 0 of a single-partition internal topic (positions, checkpoints, offset
//! syncs) from where the last read stopped to the end it had when the read began.
//!
//! An assign-only consumer: it never joins its group nor commits, so reading never disturbs a
//! replicator or a consumer group. Blocking: call from a CLI or `spawn_blocking`. The
//! replicator's loops that follow a topic for as long as they run use
//! `replicator::kafka_io::follow_partition` instead (a thread, records as events).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// How far `consumer` has read partition 0 of `topic`: its position, which after compaction or
/// transaction markers at the end is past the last record delivered. `None` when unknown.
pub fn position_in<C, X>(consumer: &C, topic: &str) -> Option<i64>
where
    C: Consumer<X>,
    X: rdkafka::consumer::ConsumerContext,
{
    match consumer.position().ok()?.find_partition(topic, 0)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// A cluster that does not answer metadata within this does not answer at all.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("topic {topic} does not exist on the {cluster} cluster")]
    NoTopic {
        cluster: &'static str,
        topic: String,
    },
    #[error(
        "cannot read {topic} on the {cluster} cluster: {source}; check \
         spec.{cluster}.bootstrapServers, the flow's credentials there, and that the cluster is up"
    )]
    Kafka {
        cluster: &'static str,
        topic: String,
        #[source]
        source: KafkaError,
    },
    #[error(
        "reading {topic} on the {cluster} cluster stopped at offset {at} of {end} after {timeout:?}"
    )]
    Timeout {
        cluster: &'static str,
        topic: String,
        at: i64,
        end: i64,
        timeout: Duration,
    },
}

impl ReadError {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReadError::NoTopic { .. } => "no_topic",
            ReadError::Kafka { .. } => "unreachable",
            ReadError::Timeout { .. } => "timeout",
        }
    }
}

/// Which records a read sees, and so where its end is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Committed records up to the last stable offset: what a consumer would see now.
    Committed,
    /// Committed records, and the read waits for every transaction open on the topic to end
    /// (its end is the high watermark, not the last stable offset), so nothing committed so
    /// far is missed.
    CommittedAll,
}

pub struct PartitionReader {
    cluster: &'static str,
    topic: String,
    consumer: BaseConsumer,
    /// For [`Isolation::CommittedAll`]: a `read_uncommitted` client for the high watermark. A
    /// `read_committed` consumer's watermark is the last stable offset, which stops before the
    /// oldest open transaction.
    watermarks: Option<BaseConsumer>,
    next: i64,
    /// The topic was seen in the metadata (checked before the first read only).
    exists: bool,
}

impl PartitionReader {
    pub fn new(
        client: &ClientConfig,
        cluster: &'static str,
        topic: String,
        group: &str,
        isolation: Isolation,
    ) -> Result<Self, ReadError> {
        let kafka = |source| ReadError::Kafka {
            cluster,
            topic: topic.clone(),
            source,
        };
        let config = |isolation: &str| {
            let mut config = client.clone();
            config
                .set("group.id", group)
                .set("enable.auto.commit", "false")
                .set("enable.auto.offset.store", "false")
                .set("fetch.wait.max.ms", "100")
                .set("isolation.level", isolation);
            config
        };
        let consumer: BaseConsumer = config("read_committed").create().map_err(kafka)?;
        let watermarks = match isolation {
            Isolation::CommittedAll => Some(config("read_uncommitted").create().map_err(kafka)?),
            Isolation::Committed => None,
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Beginning)
            .and_then(|()| consumer.assign(&tpl))
            .map_err(kafka)?;
        Ok(PartitionReader {
            cluster,
            topic,
            consumer,
            watermarks,
            next: 0,
            exists: false,
        })
    }

    /// Calls `on_record` for every record from where the last read stopped up to the end the
    /// topic has now. Errors on the way (a broker reconnecting) are retried until `timeout`;
    /// the last one is returned if the end was not reached.
    pub fn read_to_end(
        &mut self,
        timeout: Duration,
        mut on_record: impl FnMut(&BorrowedMessage<'_>),
    ) -> Result<(), ReadError> {
        let deadline = Instant::now() + timeout;
        if !self.exists {
            self.check_exists(timeout)?;
        }
        let (low, high) = self
            .watermarks
            .as_ref()
            .unwrap_or(&self.consumer)
            .fetch_watermarks(&self.topic, 0, remaining(deadline))
            .map_err(|e| self.kafka(e))?;
        // Records before `low` are gone (retention, compaction of the head): nothing to wait for.
        self.next = self.next.max(low);
        let mut last_error = None;
        while self.next < high {
            if Instant::now() >= deadline {
                return Err(match last_error {
                    Some(source) => self.kafka(source),
                    None => ReadError::Timeout {
                        cluster: self.cluster,
                        topic: self.topic.clone(),
                        at: self.next,
                        end: high,
                        timeout,
                    },
                });
            }
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    self.next = m.offset().saturating_add(1);
                    on_record(&m);
                }
                Some(Err(KafkaError::MessageConsumption(
                    RDKafkaErrorCode::UnknownTopicOrPartition,
                ))) => {
                    self.exists = false;
                    return Err(self.no_topic());
                }
                // Connection errors arrive here too, also stale ones queued while the cluster
                // was away (this consumer is only polled here); librdkafka reconnects by
                // itself, so they end the read only if it cannot finish.
                Some(Err(e)) => last_error = Some(e),
                None => {
                    // Compaction or transaction markers can leave the last offsets without a
                    // record: the consumer's position tells how far the log was read.
                    if let Some(o) = position_in(&self.consumer, &self.topic) {
                        self.next = self.next.max(o);
                    }
                }
            }
        }
        Ok(())
    }

    /// Metadata first: a missing topic is an answer, not a timeout of the watermark request.
    fn check_exists(&mut self, timeout: Duration) -> Result<(), ReadError> {
        let md = self
            .consumer
            .fetch_metadata(Some(&self.topic), timeout.min(METADATA_TIMEOUT))
            .map_err(|e| self.kafka(e))?;
        self.exists = md
            .topics()
            .iter()
            .any(|t| t.name() == self.topic && t.error().is_none() && !t.partitions().is_empty());
        if self.exists {
            Ok(())
        } else {
            Err(self.no_topic())
        }
    }

    fn kafka(&self, source: KafkaError) -> ReadError {
        ReadError::Kafka {
            cluster: self.cluster,
            topic: self.topic.clone(),
            source,
        }
    }

    fn no_topic(&self) -> ReadError {
        ReadError::NoTopic {
            cluster: self.cluster,
            topic: self.topic.clone(),
        }
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100))
}
