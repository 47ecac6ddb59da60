//! The operator's `/healthz`: failing when the controller has stopped turning, so the kubelet
//! restarts a wedged operator instead of leaving every flow's status frozen.
//!
//! Every reconcile beats (a standby's too, before it checks the Lease). A flow that exists is
//! reconciled at least every minute (10 s healthy, 60 s blocked, at most 5 min in error
//! backoff), so no beat for [`WEDGED_AFTER`] while flows exist means the controller is stuck.
//! Without flows nothing reconciles, and that is healthy.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longer than the longest requeue (the error backoff's 5 minutes) plus a probe's budget.
pub const WEDGED_AFTER: Duration = Duration::from_secs(6 * 60);

#[derive(Debug)]
pub struct Liveness {
    last: Mutex<Instant>,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            last: Mutex::new(Instant::now()),
        }
    }
}

impl Liveness {
    /// A reconcile started.
    pub fn beat(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = Instant::now();
        }
    }

    /// Whether the controller turns, given how many flows the watch holds.
    pub fn alive(&self, flows: usize, now: Instant) -> bool {
        let Ok(last) = self.last.lock() else {
            // A poisoned lock: a reconcile panicked while holding it.
            return false;
        };
        flows == 0 || now.saturating_duration_since(*last) < WEDGED_AFTER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_controller_that_stopped_reconciling_existing_flows_is_not_alive() {
        let l = Liveness::default();
        let now = Instant::now();
        assert!(l.alive(3, now));
        let later = now + WEDGED_AFTER + Duration::from_secs(1);
        assert!(!l.alive(3, later), "flows, and no reconcile for too long");
        assert!(l.alive(0, later), "no flows: nothing to reconcile");
        l.beat();
        assert!(l.alive(3, Instant::now()));
    }
}
