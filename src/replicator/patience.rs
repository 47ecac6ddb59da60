//! How long the next try of a look-up may take, learnt from the last ones.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The share of its limit a failed look-up must have taken to count as out of time (a client's
/// own timer fires a little before or after the limit it was given).
const RAN_OUT: f64 = 0.9;

/// The limit of one client's next look-up (a watermark, a log's bounds): `first` at the start,
/// doubled after each look-up that failed by running out of its limit (up to `most`) and
/// halved after one that answered (down to `first`). A fixed limit shorter than a loaded
/// broker's answer fails every try, each dropped and asked anew at the back of the same queue,
/// for as long as the load lasts: the aligned copy's held records stalled 61 s so in CI.
/// A failure that came back early (a partition unknown, a refusal) says nothing about the
/// broker's pace and leaves the limit as it is: growing it would make the next look-up of a
/// broker that then stops answering block the copy thread for `most`.
#[derive(Debug)]
pub struct Patience {
    limit: Cell<Duration>,
    first: Duration,
    most: Duration,
}

impl Patience {
    pub fn new(first: Duration, most: Duration) -> Self {
        Patience {
            limit: Cell::new(first),
            first,
            most: most.max(first),
        }
    }

    /// Runs `look_up` with the current limit, at most `within` (the time its caller has
    /// left), and learns from its outcome.
    pub fn ask<T, E>(
        &self,
        within: Duration,
        look_up: impl FnOnce(Duration) -> Result<T, E>,
    ) -> Result<T, E> {
        let limit = self.limit.get();
        let given = limit.min(within);
        let asked = Instant::now();
        let answer = look_up(given);
        let ran_out = asked.elapsed() >= given.mul_f64(RAN_OUT);
        self.limit.set(match answer {
            Ok(_) => (limit / 2).max(self.first),
            Err(_) if ran_out => limit.saturating_mul(2).min(self.most),
            Err(_) => limit,
        });
        answer
    }

    /// The limit the next look-up gets.
    pub fn limit(&self) -> Duration {
        self.limit.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Milliseconds, so the look-ups that run out of time can really take their limit.
    const FIRST: Duration = Duration::from_millis(20);
    const MOST: Duration = Duration::from_millis(300);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A look-up that answers when given at least `takes`, and otherwise uses all its limit.
    fn broker(takes: Duration) -> impl Fn(Duration) -> Result<i64, &'static str> {
        move |limit| {
            if limit >= takes {
                Ok(100)
            } else {
                std::thread::sleep(limit);
                Err("OperationTimedOut")
            }
        }
    }

    /// An answer slower than the first limit: asked with a limit that has grown past it.
    #[test]
    fn patience_grows_past_a_slow_answer_and_shrinks_back() {
        let patience = Patience::new(FIRST, MOST);
        let ask = broker(ms(100));
        let limits: Vec<Duration> = (0..3)
            .map(|_| {
                let l = patience.limit();
                assert!(patience.ask(MOST, &ask).is_err());
                l
            })
            .collect();
        assert_eq!(limits, [20, 40, 80].map(ms), "doubled after each time-out");
        assert_eq!(patience.limit(), ms(160));
        assert_eq!(patience.ask(MOST, &ask), Ok(100));
        assert_eq!(patience.limit(), ms(80), "halved after an answer");
        // Never past the call's limit, never below the first.
        let silent = broker(Duration::MAX);
        for _ in 0..3 {
            let _ = patience.ask(MOST, &silent);
        }
        assert_eq!(patience.limit(), MOST);
        for _ in 0..10 {
            let _ = patience.ask(MOST, |_| Ok::<_, ()>(1));
        }
        assert_eq!(patience.limit(), FIRST);
        // The time a caller has left bounds one ask.
        let mut asked_with = Duration::ZERO;
        let _ = patience.ask(ms(7), |l| {
            asked_with = l;
            Ok::<_, ()>(1)
        });
        assert_eq!(asked_with, ms(7));
    }

    /// A refusal that comes back at once (a partition unknown, a broker down) is no sign of a
    /// slow broker: the limit stays, so the next look-up of a broker that stops answering
    /// waits the short limit, not the longest.
    #[test]
    fn a_quick_failure_leaves_the_limit_as_it_is() {
        let patience = Patience::new(FIRST, MOST);
        for _ in 0..10 {
            assert!(
                patience
                    .ask(MOST, |_| Err::<i64, _>("UnknownTopicOrPartition"))
                    .is_err()
            );
        }
        assert_eq!(patience.limit(), FIRST);
        // After a time-out, a quick failure neither grows nor shrinks what was learnt.
        let _ = patience.ask(MOST, broker(Duration::MAX));
        assert_eq!(patience.limit(), ms(40));
        let _ = patience.ask(MOST, |_| Err::<i64, _>("refused"));
        assert_eq!(patience.limit(), ms(40));
    }

    /// A caller with little time left whose look-up runs out of it counts as a time-out too.
    #[test]
    fn running_out_of_the_callers_time_counts_as_a_time_out() {
        let patience = Patience::new(FIRST, MOST);
        let _ = patience.ask(ms(10), broker(Duration::MAX));
        assert_eq!(patience.limit(), ms(40));
    }
}
