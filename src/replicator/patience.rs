//! How long the next try of a look-up may take, learnt from the last ones.

use std::cell::Cell;
use std::time::Duration;

/// The limit of one client's next look-up (a watermark, a log's bounds): `first` at the start,
/// doubled after each look-up that failed (up to `most`) and halved after one that answered
/// (down to `first`). A fixed limit shorter than a loaded broker's answer fails every try, each
/// dropped and asked anew at the back of the same queue, for as long as the load lasts: the
/// aligned copy's held records stalled 61 s so in CI.
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
        let answer = look_up(limit.min(within));
        self.limit.set(match answer {
            Ok(_) => (limit / 2).max(self.first),
            Err(_) => limit.saturating_mul(2).min(self.most),
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

    const FIRST: Duration = Duration::from_secs(2);
    const MOST: Duration = Duration::from_secs(30);

    /// An answer slower than the first limit: asked with a limit that has grown past it.
    #[test]
    fn patience_grows_past_a_slow_answer_and_shrinks_back() {
        let patience = Patience::new(FIRST, MOST);
        let answer_takes = Duration::from_secs(10);
        let ask = |limit: Duration| {
            if limit >= answer_takes {
                Ok(100)
            } else {
                Err("OperationTimedOut")
            }
        };
        let limits: Vec<Duration> = (0..3)
            .map(|_| {
                let l = patience.limit();
                assert!(patience.ask(MOST, ask).is_err());
                l
            })
            .collect();
        assert_eq!(
            limits,
            [2, 4, 8].map(Duration::from_secs),
            "doubled after each failure"
        );
        assert_eq!(patience.limit(), Duration::from_secs(16));
        assert_eq!(patience.ask(MOST, ask), Ok(100));
        assert_eq!(
            patience.limit(),
            Duration::from_secs(8),
            "halved after an answer"
        );
        // Never past the call's limit, never below the first.
        for _ in 0..10 {
            let _ = patience.ask(MOST, |_| Err::<i64, _>("down"));
        }
        assert_eq!(patience.limit(), MOST);
        for _ in 0..10 {
            let _ = patience.ask(MOST, |_| Ok::<_, ()>(1));
        }
        assert_eq!(patience.limit(), FIRST);
        // The time a caller has left bounds one ask.
        let mut asked_with = Duration::ZERO;
        let _ = patience.ask(Duration::from_millis(300), |l| {
            asked_with = l;
            Ok::<_, ()>(1)
        });
        assert_eq!(asked_with, Duration::from_millis(300));
    }
}
