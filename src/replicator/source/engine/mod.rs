//! The copy engine: one blocking thread consumes from the source and writes to the target,
//! whatever the delivery policy.
//!
//! Structure (chosen for throughput and a small footprint):
//! - a [`BaseConsumer`] in the source group, polled by this thread only; rebalances are
//!   handled on it too (librdkafka calls back from inside `poll`), so the policy's state is
//!   behind a mutex that is never contended;
//! - producers on the target polled by this same thread, so delivery callbacks run here too:
//!   a callback only collects the report ([`send::AckContext`]), the policy drains them;
//! - the policy ([`Delivery`]) decides what a polled record becomes and what is committed
//!   when: at-least-once ([`super::policies::at_least_once`]: idempotent producer, positions stored
//!   about every second) or exactly-once ([`super::policies::exactly_once`]: a transaction per
//!   partition). Both keep their partitions in a [`slots::SlotTable`] and resume them from
//!   stored positions checked against both logs ([`super::continuity`]).
//!
//! The loop itself ([`run`]) follows discovery's subscription, polls, guards against a frozen
//! thread, and runs the policy's chores on their intervals. A replica far from the source runs
//! several such loops, each a consumer of the group with a policy of its own ([`workers`]).

pub mod fenced;
pub mod hanging;
pub mod rebalance;
pub mod send;
pub mod slots;
pub mod stall;
pub mod stored;
pub mod subscription;
pub mod tracked;
pub mod workers;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use rdkafka::producer::{BaseProducer, Producer};

use self::rebalance::Owner;
use self::send::AckContext;
use self::workers::Worker;
use super::continuity::{self, LogProbe};
use crate::kafka::positions::{self, Frontier, Gap, PositionReader};
use crate::kafka::reader::ReadError;
use crate::mm2::{OffsetSync, SyncPolicyConfig};
use crate::replicator::context::Context;
use crate::replicator::kafka_io;
use crate::replicator::reach::Reachability;

/// How long recording a break waits for the target ([`Shared::record_gap`]): a flush, or a
/// transaction (whose commit may first wait for the coordinator).
const GAP_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
const GAP_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one read of the positions topic to its end may take ([`Shared::read_positions`]).
const POSITIONS_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Records between two [`Delivery::service`] calls while the source has data.
const SERVICE_EVERY: u32 = 512;
/// How often the remote partitions are checked for having gone back under the copies
/// ([`Delivery::check_targets`]): an idle partition would otherwise never notice.
const TARGET_CHECK_EVERY: Duration = Duration::from_secs(10);
/// Poll timeouts: short while writes are outstanding, so acknowledgements (and the positions
/// and syncs that follow them) stay fresh.
const BUSY_POLL: Duration = Duration::from_millis(5);
pub const IDLE_POLL: Duration = Duration::from_millis(100);

/// The copy thread's state lock. A panic while holding it leaves the state as consistent as
/// any crash would, so a poisoned lock is used as it is.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The source consumer of a policy `P`.
pub type Source<P> = BaseConsumer<SourceContext<P>>;

/// What a delivery policy decides; the engine calls it from the copy thread only.
pub trait Delivery: Owner + Send + Sized + 'static {
    /// How often [`Self::commit`] runs.
    const COMMIT_EVERY: Duration;
    /// How often [`Self::idle_syncs`] runs.
    const IDLE_CHECK_EVERY: Duration;
    /// Copies one polled record.
    fn copy(&mut self, m: &BorrowedMessage<'_>);
    /// Writes are outstanding: poll briefly.
    fn busy(&self) -> bool;
    /// How long the consumer's poll may wait for a record or a rebalance.
    fn poll_timeout(&self) -> Duration {
        if self.busy() { BUSY_POLL } else { IDLE_POLL }
    }
    /// Serves delivery reports and retries; after an empty poll and every [`SERVICE_EVERY`]
    /// records.
    fn service(&mut self, _consumer: &Source<Self>) {}
    /// Makes what was copied durable (stores positions, commits transactions).
    fn commit(&mut self, consumer: &Source<Self>);
    /// Tail offset syncs of partitions that went idle.
    fn idle_syncs(&mut self);
    /// Finds remote partitions that went back under the copies.
    fn check_targets(&mut self);
    /// The consumer stopped on an offset outside its partition's log.
    fn offsets_out_of_range(&mut self, consumer: &Source<Self>);
    /// The thread did not run for `stalled`, long enough for the group to have moved its
    /// partitions. Policies whose writes another owner fences need nothing here.
    fn stalled(&mut self, _stalled: Duration) {}
    /// Where the copy of each owned partition stands, for the watch on partitions that stop
    /// making progress ([`stall`]).
    fn copied(&self) -> Vec<self::stall::Copied> {
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
    rebalanced: Mutex<Instant>,
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

impl<P: Owner + Send + 'static> ConsumerContext for SourceContext<P> {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        rebalance::rebalance(&self.policy, consumer, err, tpl);
        *lock(&self.rebalanced) = Instant::now();
    }
}

/// Counts an error of the source loop under `kind`.
pub fn count_error(ctx: &Context, kind: &str) {
    ctx.metrics
        .errors
        .with_label_values(&["source", kind])
        .inc();
}

/// How [`Shared::record_gap`] makes a break durable on its producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapWrite {
    /// A plain producer: flushed.
    Flush,
    /// A transactional producer with no transaction open: a transaction of its own.
    Transaction,
}

/// What every delivery policy holds besides its slots and producers: the flow, where its
/// positions and offset syncs go, what resumes a partition, and the two clusters' health.
pub struct Shared {
    pub ctx: Arc<Context>,
    pub syncs_topic: String,
    pub positions_topic: String,
    pub positions: PositionReader,
    pub probe: LogProbe,
    /// The dense sync policy of every partition: a sync on every delta change, and at least
    /// every `sourceLoop.offsetSyncInterval`.
    pub sync_config: SyncPolicyConfig,
    /// The origin of the sync policies' clock ([`Shared::now`]).
    pub started: Instant,
    pub shutdown: CancellationToken,
    pub source_health: Arc<Reachability>,
    pub target_health: Arc<Reachability>,
    /// Which of the replica's copy loops this policy runs in.
    pub worker: Worker,
    /// Partitions the flow's owner must hear of (stopped batches, stalled partitions), which
    /// the discovery loop writes into the positions topic's refusal record.
    pub stops: self::stall::Stops,
}

impl Shared {
    /// The dense sync policy of a flow's partitions.
    pub fn sync_config_of(ctx: &Context) -> SyncPolicyConfig {
        SyncPolicyConfig {
            max_interval: Some(ctx.flow.spec.source_loop.offset_sync_interval.as_duration()),
            ..SyncPolicyConfig::default()
        }
    }

    /// Time since the loop started: the clock of the sync policies.
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// The remote topic of a source topic.
    pub fn remote_topic(&self, topic: &str) -> String {
        let flow = &self.ctx.flow;
        flow.policy.format_remote_topic(flow.source_alias(), topic)
    }

    /// Reads the positions topic to its end (every position a previous owner stored is then
    /// known); a failure is counted and marks the target unreachable.
    pub fn read_positions(&mut self) -> Result<(), ReadError> {
        match self.positions.read_to_end(POSITIONS_READ_TIMEOUT) {
            Ok(()) => {
                self.target_health.ok();
                if self.positions.undecodable() > 0 {
                    tracing::warn!(count = self.positions.undecodable(), topic = %self.positions_topic,
                        "ignored records the positions topic should not hold");
                }
                Ok(())
            }
            Err(e) => {
                count_error(&self.ctx, "positions");
                match hanging::stopped_at_open_transaction(&e) {
                    // The cluster answers: a transaction is open there. Each fenced partition's
                    // producer ends its own ([`hanging`]); one no replica owns stays until an
                    // administrator ends it.
                    Some(at) => tracing::warn!(error = %e, topic = %self.positions_topic,
                        "reading the positions topic stops at a transaction open at offset {at}; the partition whose writer left it ends it when it is prepared again; if it stays, end it with kafka-transactions.sh abort --topic {} --partition 0 --start-offset {at}",
                        self.positions_topic),
                    None => {
                        tracing::warn!(error = %e, "reading the positions topic failed; retrying");
                        self.target_health
                            .unreachable("reading the positions topic", &e);
                    }
                }
                Err(e)
            }
        }
    }

    /// Queues an offset sync on the flow's offset-syncs topic ([`send::send_sync`]). An error
    /// is the caller's to fault the partition with; a sync that cannot be encoded is logged
    /// and counted here instead (impossible for a real topic name, and copying again would
    /// not change it).
    pub fn write_sync(
        &self,
        producer: &BaseProducer<AckContext>,
        sync: &OffsetSync,
        opaque: usize,
    ) -> Result<(), send::SendError> {
        match send::send_sync(producer, &self.syncs_topic, sync, opaque, &self.shutdown) {
            Err(send::SendError::Encode(e)) => {
                tracing::error!(error = %e, sync = ?sync, "cannot encode an offset sync");
                count_error(&self.ctx, "offset_sync");
                Ok(())
            }
            sent => sent,
        }
    }

    /// Records a break in the positions topic through `producer` and waits for the target to
    /// take it, with the position copying resumes from when there is one (so a restart before
    /// the next stored position does not find the same break again). Returns whether it was
    /// written ([`continuity::record`]).
    pub fn record_gap(
        &self,
        producer: &BaseProducer<AckContext>,
        gap: &Gap,
        start: Option<Frontier>,
        how: GapWrite,
    ) -> bool {
        let topic = &self.positions_topic;
        continuity::record(gap, &self.ctx.metrics, |key, value| {
            if how == GapWrite::Transaction {
                producer.begin_transaction()?;
            }
            let queue = |k: &[u8], v: &[u8]| {
                producer
                    .send(send::internal(topic, k, v, slots::UNOWNED))
                    .map_err(|(e, _)| e)
            };
            let queued = queue(key, value).and_then(|()| match start {
                Some(f) => queue(
                    &positions::encode_key(&gap.topic, gap.partition),
                    &positions::encode_value(f),
                ),
                None => Ok(()),
            });
            match (how, queued) {
                (GapWrite::Flush, Ok(())) => producer.flush(GAP_FLUSH_TIMEOUT),
                (GapWrite::Flush, Err(e)) => Err(e),
                (GapWrite::Transaction, Ok(())) => {
                    producer.commit_transaction(GAP_TRANSACTION_TIMEOUT)
                }
                (GapWrite::Transaction, Err(e)) => {
                    // The abort's own failure changes nothing: the break is not on record.
                    let _ = producer.abort_transaction(GAP_TRANSACTION_TIMEOUT);
                    Err(e)
                }
            }
        })
    }
}

/// The source consumer's `session.timeout.ms`: the flow's, else a static member's default,
/// else librdkafka's 45 s.
fn session_timeout(source: &rdkafka::ClientConfig, static_member: bool) -> Duration {
    let default = match static_member {
        true => super::clients::STATIC_SESSION_TIMEOUT,
        false => kafka_io::DEFAULT_SESSION_TIMEOUT,
    };
    kafka_io::configured_ms(source, "session.timeout.ms").unwrap_or(default)
}

/// When each chore of the loop is due.
struct Chore {
    every: Duration,
    last: Instant,
}

impl Chore {
    fn new(every: Duration) -> Self {
        Chore {
            every,
            last: Instant::now(),
        }
    }

    fn due(&mut self) -> bool {
        if self.last.elapsed() < self.every {
            return false;
        }
        self.last = Instant::now();
        true
    }
}

/// What the copy loop runs with, whatever the policy.
pub struct CopyLoop {
    /// Discovery's topic list.
    pub subscriptions: subscription::Subscriptions,
    pub ctx: Arc<Context>,
    pub shutdown: CancellationToken,
}

/// The replica's running copy loops.
pub type Loops = tokio::task::JoinSet<Result<(), KafkaError>>;

/// Runs `policy`'s copy loop ([`run`]) on a blocking thread of its own, in `loops`: the source
/// consumer is created from `config` once discovery's first subscription is known (a static
/// member's name depends on it, [`subscription`]).
pub fn spawn<P: Delivery>(
    policy: P,
    config: &rdkafka::ClientConfig,
    health: &Arc<Reachability>,
    copy: CopyLoop,
    loops: &mut Loops,
) {
    let worker = policy.shared().worker.index();
    let mut config = config.clone();
    let health = health.clone();
    let span = tracing::info_span!("consumer", n = worker);
    loops.spawn_blocking(move || {
        let _in = span.enter();
        let CopyLoop {
            mut subscriptions,
            ctx,
            shutdown,
        } = copy;
        let Some(first) = subscription::first(&mut subscriptions, &shutdown) else {
            return Ok(());
        };
        if ctx.static_membership {
            super::clients::static_member(&mut config, &ctx.replica, worker, first.shape());
        }
        let consumer: Source<P> = config.create_with_context(SourceContext::new(policy, health))?;
        run(consumer, subscriptions, ctx, shutdown)
    });
}

/// The chores of the copy loop, each on its interval.
struct Chores {
    commit: Chore,
    idle: Chore,
    targets: Chore,
    stalls: Chore,
    stall_watch: stall::StallWatch,
    refused: stall::Refused,
}

impl Chores {
    fn new<P: Delivery>() -> Self {
        Chores {
            commit: Chore::new(P::COMMIT_EVERY),
            idle: Chore::new(P::IDLE_CHECK_EVERY),
            targets: Chore::new(TARGET_CHECK_EVERY),
            stalls: Chore::new(stall::CHECK_EVERY),
            stall_watch: stall::StallWatch::default(),
            refused: stall::Refused::default(),
        }
    }

    /// Runs the chores that are due.
    fn run_due<P: Delivery>(&mut self, policy: &Mutex<P>, consumer: &Source<P>) {
        if self.commit.due() {
            lock(policy).commit(consumer);
        }
        if self.idle.due() {
            lock(policy).idle_syncs();
        }
        if self.targets.due() {
            lock(policy).check_targets();
            // The interval counts from the end of a check: one that waited for an absent
            // broker is not due again at once.
            self.targets.last = Instant::now();
        }
        if self.stalls.due() {
            let read = stall::read_positions(consumer);
            let p = lock(policy);
            let stops = p.shared().stops.clone();
            let refused = self.refused.reason(Instant::now());
            stall::check(
                &mut self.stall_watch,
                &*p,
                &stops,
                &read,
                refused.as_deref(),
            );
            drop(p);
            self.stalls.last = Instant::now();
        }
    }
}

/// Runs the copy loop until `shutdown`; `subscriptions` carries discovery's topic list.
pub fn run<P: Delivery>(
    consumer: Source<P>,
    mut subscriptions: subscription::Subscriptions,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
) -> Result<(), KafkaError> {
    let policy = consumer.context().policy.clone();
    let worker = lock(&policy).shared().worker.clone();
    let mut subscribed = None;
    let mut chores = Chores::new::<P>();
    let mut since_service = 0_u32;
    let stall_limit = session_timeout(&ctx.flow.source_client, ctx.static_membership) / 2;
    let mut last_turn = Instant::now();
    while !shutdown.is_cancelled() {
        subscription::follow(&consumer, &mut subscriptions, &mut subscribed, &ctx)?;
        let timeout = lock(&policy).poll_timeout();
        worker.turned(&ctx);
        let polled = consumer.poll(timeout);
        // Checked before anything polled is handled: nothing acknowledged after a freeze may
        // reach an offset sync. Rebalance callbacks (which may wait seconds) reset the clock.
        let turn = last_turn.max(*lock(&consumer.context().rebalanced));
        if turn.elapsed() > stall_limit + timeout {
            lock(&policy).stalled(turn.elapsed());
        }
        last_turn = Instant::now();
        match polled {
            Some(Ok(m)) => {
                consumer.context().health.ok();
                let mut p = lock(&policy);
                p.copy(&m);
                since_service += 1;
                if since_service >= SERVICE_EVERY {
                    since_service = 0;
                    p.service(&consumer);
                }
            }
            Some(Err(e)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::AutoOffsetReset) => {
                lock(&policy).offsets_out_of_range(&consumer);
            }
            Some(Err(e)) if crate::kafka::is_unreadable_batch(&e) => {
                // librdkafka tries the batch again: its partition stops there, and the stall
                // watch names it with this reason.
                count_error(&ctx, "refused_batch");
                if chores.refused.note(&e, Instant::now()) {
                    tracing::warn!(error = %e, "the source consumer cannot read a batch (counted in errors_total{{kind=\"refused_batch\"}}; logged again after a minute without one)");
                }
            }
            Some(Err(e)) => {
                count_error(&ctx, "consume");
                tracing::debug!(error = %e, "consumer error");
            }
            None => {
                since_service = 0;
                lock(&policy).service(&consumer);
            }
        }
        chores.run_due(&policy, &consumer);
    }
    stop(&policy, &consumer, ctx.static_membership);
    Ok(())
}

/// Settles every write and lets the partitions go: a static member gives them up in this
/// consumer only and keeps its place in the group, any other leaves the group.
fn stop<P: Delivery>(policy: &Mutex<P>, consumer: &Source<P>, static_membership: bool) {
    tracing::info!("source loop stopping: settling writes");
    lock(policy).stop();
    if static_membership {
        // A static member that leaves hands its partitions to the others at once, and they
        // come back when it returns: two moves per restart. It gives them up here only (the
        // policy stores their positions as on a revocation) and closes without leaving
        // (KIP-345), so the coordinator keeps them for it until the session timeout.
        self::rebalance::give_up_locally(policy, consumer);
        return;
    }
    // Leaving the group revokes everything through the policy, which has little left to do.
    consumer.unsubscribe();
    for _ in 0..10 {
        if consumer.poll(Duration::from_millis(50)).is_none()
            && consumer.assignment().map(|a| a.count()).unwrap_or(0) == 0
        {
            break;
        }
    }
}
