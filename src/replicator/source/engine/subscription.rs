//! What the copy loops subscribe to, and the static member name that goes with it.
//!
//! A static member (KIP-345) that restarts within its session gets back the assignment its
//! previous process had, without a rebalance: the coordinator only rebalances a returning
//! static member when the group's assignor would change, not when its subscription did. A
//! replica that came back with a topic (or partitions) its previous process did not
//! subscribe to therefore never copied them: the leader's metadata at the join already held
//! them, so librdkafka saw nothing change afterwards either (found by `operator_faults`: a
//! topic added while the source loop was off stayed uncopied once it was on again). The
//! member's name carries a digest of the topics and partition counts of its first
//! subscription, so a process that subscribes to what its predecessor did keeps the
//! predecessor's partitions at once, and any other joins as a new member, which the
//! coordinator assigns in a real rebalance once the old name's session ends.

use std::sync::Arc;

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaError;

use crate::replicator::context::Context;

/// Discovery's source topics to copy, with the partition counts it saw, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscription {
    topics: Vec<(String, i32)>,
}

/// The channel discovery publishes subscriptions on; `None` until its first round.
pub type Subscriptions = tokio::sync::watch::Receiver<Option<Arc<Subscription>>>;

impl Subscription {
    pub fn new(mut topics: Vec<(String, i32)>) -> Self {
        topics.sort();
        topics.dedup_by(|a, b| a.0 == b.0);
        Subscription { topics }
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.topics.iter().map(|(t, _)| t.as_str())
    }

    fn same_topics(&self, other: &Subscription) -> bool {
        self.names().eq(other.names())
    }

    /// A digest of the topics and their partition counts (FNV-1a, 32 bits: stable across
    /// builds, unlike the standard library's hasher, so an upgrade alone keeps the name).
    pub fn shape(&self) -> u32 {
        let mut h: u32 = 0x811c_9dc5;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h ^= u32::from(*b);
                h = h.wrapping_mul(0x0100_0193);
            }
        };
        for (topic, partitions) in &self.topics {
            eat(topic.as_bytes());
            eat(&[0]);
            eat(&partitions.to_be_bytes());
        }
        h
    }
}

/// Waits for discovery's first subscription (or `None` at shutdown), leaving it unseen so the
/// copy loop's first [`follow`] subscribes to it.
pub fn first(
    subscriptions: &mut Subscriptions,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Option<Arc<Subscription>> {
    let handle = tokio::runtime::Handle::current();
    let first = handle.block_on(async {
        tokio::select! {
            () = shutdown.cancelled() => None,
            seen = subscriptions.wait_for(Option::is_some) => seen.ok().and_then(|s| s.clone()),
        }
    });
    subscriptions.mark_changed();
    first
}

/// Follows discovery's subscription: (un)subscribes when the topic list changed (partition
/// counts alone need no new subscription: librdkafka follows them). The first list received
/// makes the source loop ready.
pub fn follow<C: ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    subscriptions: &mut Subscriptions,
    subscribed: &mut Option<Arc<Subscription>>,
    ctx: &Context,
) -> Result<(), KafkaError> {
    if !subscriptions.has_changed().unwrap_or(false) {
        return Ok(());
    }
    let wanted = subscriptions.borrow_and_update().clone();
    let Some(topics) = wanted else {
        return Ok(());
    };
    if subscribed.as_ref().is_some_and(|s| s.same_topics(&topics)) {
        return Ok(());
    }
    let names: Vec<&str> = topics.names().collect();
    if names.is_empty() {
        consumer.unsubscribe();
    } else {
        consumer.subscribe(&names)?;
    }
    tracing::debug!(topics = names.len(), "subscribed");
    *subscribed = Some(topics);
    ctx.readiness
        .source
        .store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(topics: &[(&str, i32)]) -> Subscription {
        Subscription::new(topics.iter().map(|(t, p)| ((*t).to_owned(), *p)).collect())
    }

    #[test]
    fn the_shape_follows_topics_and_partition_counts_not_their_order() {
        let base = sub(&[("orders", 3), ("payments", 1)]);
        assert_eq!(base.shape(), sub(&[("payments", 1), ("orders", 3)]).shape());
        assert_ne!(
            base.shape(),
            sub(&[("orders", 3), ("payments", 1), ("refunds", 1)]).shape(),
            "a topic added"
        );
        assert_ne!(
            base.shape(),
            sub(&[("orders", 4), ("payments", 1)]).shape(),
            "partitions added"
        );
        assert_ne!(
            sub(&[("ab", 1)]).shape(),
            sub(&[("a", 1), ("b", 1)]).shape(),
            "names do not run into each other"
        );
        assert_eq!(sub(&[]).shape(), Subscription::default().shape());
    }

    #[test]
    fn partition_counts_alone_are_the_same_topics() {
        assert!(sub(&[("orders", 3)]).same_topics(&sub(&[("orders", 6)])));
        assert!(!sub(&[("orders", 3)]).same_topics(&sub(&[("orders", 3), ("b", 1)])));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_first_subscription_is_waited_for_and_left_for_follow() {
        let (tx, mut rx) = tokio::sync::watch::channel(None);
        let shutdown = tokio_util::sync::CancellationToken::new();
        let waiting = tokio::task::spawn_blocking(move || {
            let got = first(&mut rx, &shutdown);
            (got, rx.has_changed().unwrap_or(false))
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "nothing published yet");
        tx.send_replace(Some(Arc::new(sub(&[("orders", 3)]))));
        let (got, unseen) = waiting.await.expect("the waiting thread");
        assert_eq!(got.as_deref(), Some(&sub(&[("orders", 3)])));
        assert!(unseen, "follow must still see it as new and subscribe");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_ends_the_wait_for_a_first_subscription() {
        let (_tx, mut rx) = tokio::sync::watch::channel::<Option<Arc<Subscription>>>(None);
        let shutdown = tokio_util::sync::CancellationToken::new();
        let stop = shutdown.clone();
        let waiting = tokio::task::spawn_blocking(move || first(&mut rx, &shutdown));
        stop.cancel();
        assert_eq!(waiting.await.expect("the waiting thread"), None);
    }
}
