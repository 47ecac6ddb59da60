//! Keeps the positions topic's record of refused topic changes ([`crate::kafka::refusals`]) in
//! line with what each discovery round found, so the operator reports them.

use std::time::Duration;

use rdkafka::ClientConfig;

use crate::clock::now_ms;
use crate::kafka::admin::AdminError;
use crate::kafka::positions::PositionReader;
use crate::kafka::refusals::{self, Refusal, Refusals};
use crate::replicator::kafka_io::AckedProducer;

const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads the positions topic as far as it can within [`READ_TIMEOUT`] and returns the reader
/// (to go on from there) with the refusals a previous run recorded.
pub async fn read_previous(
    mut reader: PositionReader,
) -> anyhow::Result<(PositionReader, Refusals)> {
    Ok(tokio::task::spawn_blocking(move || {
        if let Err(e) = reader.read_to_end(READ_TIMEOUT) {
            // What was read is kept; a refusal not read stays until it recurs and is fixed,
            // or the topic leaves the flow after a restart that reads it.
            tracing::warn!(error = %e, "could not read all the refusals a previous run recorded");
        }
        let previous = reader.refusals().clone();
        (reader, previous)
    })
    .await?)
}

pub struct RefusalRecorder {
    topic: String,
    producer: AckedProducer,
    /// What the topic holds as far as this replicator knows: what a previous run left, then
    /// what it wrote.
    written: Refusals,
}

impl RefusalRecorder {
    pub fn new(target: &ClientConfig, topic: &str, previous: Refusals) -> anyhow::Result<Self> {
        Ok(RefusalRecorder {
            topic: topic.to_string(),
            producer: AckedProducer::new(target.clone().set("linger.ms", "0"))?,
            written: previous,
        })
    }

    /// Records this round's refusals (`refused` by discovery, `stopped` by the copy): new and
    /// changed ones, and a tombstone for each that no longer holds. What could not be written
    /// is written again next round.
    pub async fn round(
        &mut self,
        refused: &[AdminError],
        stopped: Vec<Refusal>,
    ) -> Result<(), rdkafka::error::KafkaError> {
        let now = now_ms();
        let found = (refused.iter().filter_map(|e| Refusal::of(e, now)))
            .chain(stopped)
            .collect();
        let before = self.written.clone();
        let records = refusals::changes(&mut self.written, found);
        let mut pending = Vec::with_capacity(records.len());
        for (key, value) in &records {
            pending.push(self.producer.send(&self.topic, key, value.as_deref(), None));
        }
        let mut result = Ok(());
        for sent in pending {
            let acked = match sent {
                Ok(acked) => self.producer.acknowledged(acked).await,
                Err(e) => Err(e),
            };
            if let Err(e) = acked {
                result = Err(e);
            }
        }
        if result.is_err() {
            self.written = before;
        }
        result
    }
}
