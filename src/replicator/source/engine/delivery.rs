//! What the engine asks of a delivery policy ([`Delivery`]), where the policy's records come
//! from ([`Feed`]: the source consumer's polls, or a fetcher of whole batches), and the source
//! consumer's context, through which librdkafka hands rebalances to the policy.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, TopicPartitionList};

use super::rebalance::{self, Owner};
use super::send;
use crate::replicator::reach::Reachability;
use crate::replicator::stops::lock;

/// Poll timeouts: short while writes are outstanding, so acknowledgements (and the positions
/// and syncs that follow them) stay fresh.
const BUSY_POLL: Duration = Duration::from_millis(5);
pub const IDLE_POLL: Duration = Duration::from_millis(100);

/// Where a policy's copy of one partition stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    pub topic: String,
    pub partition: i32,
    /// The remote topic (the refusal record is kept per remote topic).
    pub remote: String,
    /// The next source offset to copy (-1 when not known yet).
    pub next: i64,
    /// What the policy knows of why it does not move, e.g. what it waits for.
    pub reason: Option<String>,
    /// The copy holds nothing read back and no write of it failed: it moves when the source
    /// consumer gives it records, so where the consumer has read, the copy is (what lies
    /// between were transaction markers or aborted records), and a consumer refused batches
    /// is the reason it stands.
    pub waits_on_reader: bool,
}

/// The source consumer of a policy `P`.
pub type Source<P> = BaseConsumer<SourceContext<P>>;

/// What a delivery policy decides; the engine calls it from the copy thread only.
pub trait Delivery: Owner + Send + Sized + 'static {
    /// How often [`Self::commit`] runs.
    const COMMIT_EVERY: Duration;
    /// How often [`Self::idle_syncs`] runs.
    const IDLE_CHECK_EVERY: Duration;
    /// Where the policy's records come from: [`PolledRecords`] or [`FetchedBatches`].
    type Feed: Feed<Self>;
    /// Writes are outstanding: poll briefly.
    fn busy(&self) -> bool;
    /// How long the consumer's poll may wait for a record or a rebalance.
    fn poll_timeout(&self) -> Duration {
        if self.busy() { BUSY_POLL } else { IDLE_POLL }
    }
    /// Serves delivery reports and retries (and, fed whole batches, copies them); after an
    /// empty poll and every few hundred polled records.
    fn service(&mut self, _consumer: &Source<Self>) {}
    /// Makes what was copied durable (stores positions, commits transactions).
    fn commit(&mut self, consumer: &Source<Self>);
    /// Tail offset syncs of partitions that went idle.
    fn idle_syncs(&mut self);
    /// Finds remote partitions that went back under the copies.
    fn check_targets(&mut self);
    /// The thread did not run for `stalled`, long enough for the group to have moved its
    /// partitions. Policies whose writes another owner fences need nothing here.
    fn stalled(&mut self, _stalled: Duration) {}
    /// Where the copy of each owned partition stands, for the watch on partitions that stop
    /// making progress ([`super::stall`]).
    fn copied(&self) -> Vec<Copied> {
        Vec::new()
    }
    /// Graceful stop: settle every write.
    fn stop(&mut self);
}

/// The source consumer's context: routes rebalances to the policy and notes when the last one
/// returned (they may block for seconds; that is not a stall).
pub struct SourceContext<P> {
    pub policy: Arc<Mutex<P>>,
    pub health: Arc<Reachability>,
    pub rebalanced: Mutex<Instant>,
}

impl<P> SourceContext<P> {
    pub fn new(policy: P, health: Arc<Reachability>) -> Self {
        SourceContext {
            policy: Arc::new(Mutex::new(policy)),
            health,
            rebalanced: Mutex::new(Instant::now()),
        }
    }
}

impl<P: Owner + Send + 'static> ClientContext for SourceContext<P> {
    fn error(&self, error: KafkaError, reason: &str) {
        send::note_client_error(&self.health, error, reason);
    }
}

impl<P: Delivery> ConsumerContext for SourceContext<P> {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        rebalance::rebalance(&self.policy, consumer, err, tpl, P::Feed::PAUSED);
        *lock(&self.rebalanced) = Instant::now();
    }
}

/// Where a policy's records come from: the engine's two kinds of source. Both keep the source
/// group's assignment in the consumer (the group decides who copies what, [`rebalance`]).
pub trait Feed<P: Delivery> {
    /// Whether the consumer's partitions are paused as soon as they are assigned: the policy
    /// fetches them itself and the consumer brings rebalances only.
    const PAUSED: bool;
    /// A record the consumer polled.
    fn polled(policy: &mut P, m: &BorrowedMessage<'_>);
    /// The consumer stopped on an offset outside its partition's log.
    fn out_of_range(policy: &mut P, consumer: &Source<P>);
}

/// The source consumer fetches the records, and the policy copies them one by one.
pub struct PolledRecords;

/// A policy fed [`PolledRecords`].
pub trait CopiesRecords: Delivery {
    /// Copies one polled record.
    fn copy(&mut self, m: &BorrowedMessage<'_>);
    /// The consumer stopped on an offset outside its partition's log.
    fn offsets_out_of_range(&mut self, consumer: &Source<Self>);
}

impl<P: CopiesRecords> Feed<P> for PolledRecords {
    const PAUSED: bool = false;
    fn polled(policy: &mut P, m: &BorrowedMessage<'_>) {
        policy.copy(m);
    }
    fn out_of_range(policy: &mut P, consumer: &Source<P>) {
        policy.offsets_out_of_range(consumer);
    }
}

/// A fetcher of whole batches ([`super::fetcher`], a thread of its own) reads the owned
/// partitions from their leaders; the policy takes its rounds in [`Delivery::service`].
pub struct FetchedBatches;

impl<P: Delivery> Feed<P> for FetchedBatches {
    const PAUSED: bool = true;
    /// Fetched before the pause took hold: the fetcher brings the same record in its batch.
    fn polled(_policy: &mut P, _m: &BorrowedMessage<'_>) {}
    /// The consumer fetches nothing; the fetcher reports an offset out of range itself.
    fn out_of_range(_policy: &mut P, _consumer: &Source<P>) {}
}
