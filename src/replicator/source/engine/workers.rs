//! A replica's source consumers ([`crate::replicator::source::clients::SourceFetch`]): each
//! runs the copy loop on a thread of its own over its share of the partitions; what the replica
//! reports for all of them is gathered here.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use crate::clock::now_ms;
use crate::replicator::context::Context;
use crate::replicator::health::Loop;
use crate::replicator::stops::lock;

/// What a replica's copy loops report together.
struct Crew {
    /// Per loop: ms since the epoch of its last turn; 0 = not in its main loop yet.
    turns: Vec<AtomicI64>,
    /// Per loop: the partitions it owns. Behind a lock so the gauge is set from one
    /// consistent sum (rebalances reach every loop at about the same time).
    assigned: Mutex<Vec<usize>>,
}

/// One copy loop's place in its replica.
#[derive(Clone)]
pub struct Worker {
    index: usize,
    crew: Arc<Crew>,
}

impl Worker {
    /// The handles of a replica's `n` copy loops (at least one).
    pub fn crew(n: usize) -> Vec<Worker> {
        let n = n.max(1);
        let crew = Arc::new(Crew {
            turns: (0..n).map(|_| AtomicI64::new(0)).collect(),
            assigned: Mutex::new(vec![0; n]),
        });
        (0..n)
            .map(|index| Worker {
                index,
                crew: crew.clone(),
            })
            .collect()
    }

    /// This loop's number in its replica, for logs.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The loop went round. Liveness sees the loop that turned longest ago, so one wedged
    /// consumer is not hidden by the others turning.
    pub fn turned(&self, ctx: &Context) {
        let turns = &self.crew.turns;
        if let Some(own) = turns.get(self.index) {
            own.store(now_ms(), Ordering::Relaxed);
        }
        let oldest = turns
            .iter()
            .map(|t| t.load(Ordering::Relaxed))
            .min()
            .unwrap_or(0);
        ctx.readiness.turned_at(Loop::Source, oldest);
    }

    /// Publishes that this loop owns `n` partitions; the gauge shows the replica's sum.
    pub fn assigned(&self, ctx: &Context, n: usize) -> usize {
        let mut all = lock(&self.crew.assigned);
        if let Some(own) = all.get_mut(self.index) {
            *own = n;
        }
        let sum: usize = all.iter().sum();
        ctx.metrics
            .assigned_partitions
            .set(i64::try_from(sum).unwrap_or(i64::MAX));
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replica_reports_the_sum_of_partitions_and_its_oldest_turn() {
        let ctx = crate::replicator::test_context();
        let crew = Worker::crew(2);
        assert_eq!(Worker::crew(0).len(), 1);
        assert_eq!(crew[0].assigned(&ctx, 3), 3);
        assert_eq!(crew[1].assigned(&ctx, 4), 7);
        assert_eq!(crew[0].assigned(&ctx, 1), 5);
        assert_eq!(ctx.metrics.assigned_partitions.get(), 5);
        // Until both went round, the source loop is not judged; then by the older turn.
        crew[0].turned(&ctx);
        assert!(ctx.readiness.wedged(now_ms() + 3_600_000).is_empty());
        crew[1].turned(&ctx);
        assert_eq!(ctx.readiness.wedged(now_ms() + 3_600_000).len(), 1);
    }
}
