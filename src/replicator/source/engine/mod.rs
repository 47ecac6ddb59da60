//! The copy engine: one blocking thread copies the owned source partitions to the target,
//! whatever the delivery policy.
//!
//! Structure (chosen for throughput and a small footprint):
//! - a [`rdkafka::consumer::BaseConsumer`] in the source group, polled by this thread only;
//!   rebalances are handled on it too (librdkafka calls back from inside `poll`), so the
//!   policy's state is behind a mutex that is never contended;
//! - the records come from one of two feeds ([`delivery::Feed`]): the consumer's own polls,
//!   copied one by one ([`delivery::PolledRecords`]: at-least-once, exactly-once, aligned
//!   offsets), or whole batches a [`fetcher`] thread reads from the leaders while the consumer's
//!   partitions stay paused ([`delivery::FetchedBatches`]: the batch copy, the default);
//! - producers or a batch writer on the target, driven by this same thread, so delivery
//!   callbacks run here too: a callback only collects the report ([`send::AckContext`]), the
//!   policy drains them;
//! - the policy ([`Delivery`], in [`super::policies`]) decides what is written and what is
//!   committed when; every policy keeps its partitions in a [`slots::SlotTable`], takes and
//!   gives them up through one skeleton ([`stored`] or [`fenced`]) and resumes them from stored
//!   positions checked against both logs ([`super::continuity`]); what they share besides
//!   ([`shared::Shared`]) writes the positions and offset-syncs topics.
//!
//! The loop itself ([`run`]) follows discovery's subscription, polls, guards against a frozen
//! thread, and runs the policy's chores on their intervals. A replica far from the source runs
//! several such loops, each a consumer of the group with a policy of its own ([`workers`]).

pub mod delivery;
pub mod fenced;
pub mod fetcher;
pub mod hanging;
pub mod rebalance;
pub mod send;
pub mod shared;
pub mod slots;
pub mod stall;
pub mod stored;
pub mod subscription;
pub mod timing;
pub mod tracked;
pub mod workers;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio_util::sync::CancellationToken;

use self::delivery::{Delivery, Feed, Source, SourceContext};
use self::shared::count_error;
use crate::replicator::context::Context;
use crate::replicator::kafka_io;
use crate::replicator::reach::Reachability;
use crate::replicator::stops::lock;
/// Records between two [`Delivery::service`] calls while the source has data.
const SERVICE_EVERY: u32 = 512;
/// How often the remote partitions are checked for having gone back under the copies
/// ([`Delivery::check_targets`]): an idle partition would otherwise never notice.
const TARGET_CHECK_EVERY: Duration = Duration::from_secs(10);

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
                P::Feed::polled(&mut p, &m);
                since_service += 1;
                if since_service >= SERVICE_EVERY {
                    since_service = 0;
                    p.service(&consumer);
                }
            }
            Some(Err(e)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::AutoOffsetReset) => {
                P::Feed::out_of_range(&mut lock(&policy), &consumer);
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
