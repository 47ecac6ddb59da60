//! Where a batch copy's two threads spend their time, logged at debug every [`LOG_EVERY`]:
//! the fetching thread in fetch rounds (a round trip to the source and the answers' transfer)
//! and waiting for the copy thread to take them; the copy thread writing to the target and
//! waiting for rounds. The way to see which side holds a copy back, e.g. far from the source.

use std::time::{Duration, Instant};

const LOG_EVERY: Duration = Duration::from_secs(2);

pub struct TimeSplit {
    thread: &'static str,
    parts: [(&'static str, Duration); 2],
    rounds: u64,
    bytes: u64,
    since: Instant,
}

impl TimeSplit {
    pub fn new(thread: &'static str, parts: [&'static str; 2]) -> Self {
        TimeSplit {
            thread,
            parts: parts.map(|p| (p, Duration::ZERO)),
            rounds: 0,
            bytes: 0,
            since: Instant::now(),
        }
    }

    /// Adds the time since `from` to part `i` (0 or 1).
    pub fn spent(&mut self, i: usize, from: Instant) {
        if let Some((_, total)) = self.parts.get_mut(i) {
            *total = total.saturating_add(from.elapsed());
        }
    }

    /// Counts a round of `bytes`, and logs when [`LOG_EVERY`] has passed.
    pub fn round(&mut self, bytes: usize) {
        self.rounds = self.rounds.saturating_add(1);
        self.bytes = self
            .bytes
            .saturating_add(u64::try_from(bytes).unwrap_or(u64::MAX));
        let over = self.since.elapsed();
        if over < LOG_EVERY {
            return;
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            let share = |d: Duration| 100.0 * d.as_secs_f64() / over.as_secs_f64();
            let [(a, in_a), (b, in_b)] = self.parts;
            tracing::debug!(
                thread = self.thread,
                rounds = self.rounds,
                "where the batch copy's time went: {a} {:.0} %, {b} {:.0} %; {:.1} ms per round, {:.1} MiB/s",
                share(in_a),
                share(in_b),
                over.as_secs_f64() * 1000.0 / self.rounds as f64,
                self.bytes as f64 / over.as_secs_f64() / f64::from(1 << 20),
            );
        }
        *self = TimeSplit::new(self.thread, self.parts.map(|(p, _)| p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_and_rounds_add_up_per_part_and_a_third_part_is_ignored() {
        let mut t = TimeSplit::new("fetch", ["fetching", "handing over"]);
        let long_ago = Instant::now() - Duration::from_millis(40);
        t.spent(0, long_ago);
        t.spent(2, long_ago);
        t.round(1000);
        t.round(24);
        assert!(t.parts[0].1 >= Duration::from_millis(40));
        assert_eq!(t.parts[1].1, Duration::ZERO);
        assert_eq!((t.rounds, t.bytes), (2, 1024));
    }

    #[test]
    fn after_a_logging_period_it_starts_over() {
        let mut t = TimeSplit::new("copy", ["writing", "waiting for rounds"]);
        t.since = Instant::now() - LOG_EVERY;
        t.spent(1, Instant::now() - Duration::from_millis(5));
        t.round(10);
        assert_eq!((t.rounds, t.bytes), (0, 0));
        assert_eq!(t.parts[1].1, Duration::ZERO);
        assert_eq!(t.parts.map(|(p, _)| p), ["writing", "waiting for rounds"]);
    }
}
