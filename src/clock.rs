//! Wall-clock time as Kafka carries it: milliseconds since the Unix epoch in an `i64`.
//!
//! Record timestamps, heartbeats, claims and checkpoint ages are all compared in that unit, so
//! every loop and the probe read the clock through here and agree on what a clock before 1970
//! (0) or past `i64::MAX` ms (saturated) means.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, in milliseconds since the epoch.
pub fn now_ms() -> i64 {
    ms_since_epoch(SystemTime::now())
}

/// `at` in milliseconds since the epoch: 0 before it, `i64::MAX` past what an `i64` holds.
pub fn ms_since_epoch(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How long ago `since_ms` was; zero for a time in the future (another host's clock ahead of
/// ours must not read as a negative age).
pub fn age(since_ms: i64) -> Duration {
    age_at(now_ms(), since_ms)
}

fn age_at(now_ms: i64, since_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(now_ms.saturating_sub(since_ms)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_outside_the_i64_range_saturate_and_ages_are_never_negative() {
        assert_eq!(ms_since_epoch(UNIX_EPOCH), 0);
        assert_eq!(ms_since_epoch(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(
            ms_since_epoch(UNIX_EPOCH + Duration::from_millis(1_500)),
            1_500
        );
        assert_eq!(age_at(10_000, 4_000), Duration::from_secs(6));
        assert_eq!(age_at(4_000, 10_000), Duration::ZERO);
        assert_eq!(
            age_at(i64::MAX, i64::MIN),
            Duration::from_millis(i64::MAX as u64)
        );
        assert!(now_ms() > 1_700_000_000_000);
    }
}
