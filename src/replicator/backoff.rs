//! Capped doubling backoff between retries, shared by every loop of the replicator.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Doubling backoff between `min` and `max`, reset after a success.
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The delay to wait now; the following one doubles, up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// Sleeps the next delay; false when `shutdown` fired meanwhile.
    pub async fn wait(&mut self, shutdown: &CancellationToken) -> bool {
        let delay = self.next_delay();
        tokio::select! {
            _ = shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}

/// When something that failed may be tried again: each failure in a row waits longer
/// ([`Backoff`]), a success starts over from the shortest wait.
#[derive(Debug)]
pub struct Retry {
    backoff: Backoff,
    at: Option<std::time::Instant>,
}

impl Retry {
    pub fn new(min: Duration, max: Duration) -> Self {
        Retry {
            backoff: Backoff::new(min, max),
            at: None,
        }
    }

    /// A failure at `now`: the next try waits the next delay. Returns that delay.
    pub fn failed(&mut self, now: std::time::Instant) -> Duration {
        let delay = self.backoff.next_delay();
        self.at = Some(now + delay);
        delay
    }

    /// A try is scheduled and its time has come.
    pub fn due(&self, now: std::time::Instant) -> bool {
        self.at.is_some_and(|at| at <= now)
    }

    /// A try is scheduled (due or not).
    pub fn pending(&self) -> bool {
        self.at.is_some()
    }

    /// The scheduled try is being made.
    pub fn take(&mut self) {
        self.at = None;
    }

    /// It worked: the next failure waits the shortest delay again.
    pub fn succeeded(&mut self) {
        self.backoff.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn failures_in_a_row_wait_longer_until_a_success() {
        let mut r = Retry::new(Duration::from_millis(500), Duration::from_secs(30));
        let t0 = Instant::now();
        assert!(!r.pending() && !r.due(t0));
        let delays: Vec<u128> = (0..8)
            .map(|_| {
                let d = r.failed(t0);
                r.take();
                d.as_millis()
            })
            .collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        r.succeeded();
        assert_eq!(r.failed(t0), Duration::from_millis(500));
        assert!(r.pending());
        assert!(!r.due(t0 + Duration::from_millis(499)));
        assert!(r.due(t0 + Duration::from_millis(500)));
        r.take();
        assert!(!r.pending());
    }

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(2));
        let got: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, [500, 1000, 2000, 2000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(500));
    }
}
