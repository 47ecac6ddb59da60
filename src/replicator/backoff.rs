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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(2));
        let got: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, [500, 1000, 2000, 2000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(500));
    }
}
