//! When the checkpoint loop may write. A replica frozen (stopped, starved) past its session
//! loses its groups to another replica, which writes theirs; a checkpoint this one decided or
//! queued before the freeze must not land after those (one did, found by the chaos test: a
//! checkpoint going backwards). Two bounds keep it out: how long a write may take from its
//! decision to the target ([`write_deadline`]), and how long a wait counts as a freeze
//! ([`FreezeLimit`]: the loop then reads the checkpoints topic to its end before it writes).

use std::time::Duration;

use crate::replicator::kafka_io::{
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_SESSION_TIMEOUT, configured_ms,
};

/// The longest a checkpoint write may wait for the target before it fails (and is evaluated
/// again); a revocation waits for the loop's writes at most a little longer
/// ([`super::commits::hand_over`]). Shorter with short sessions: [`write_deadline`].
pub(super) const CHECKPOINT_WRITE_TIMEOUT: Duration = Duration::from_secs(120);

/// A wait for the loop's next turn beyond which it counts as frozen: ticks come every second.
const FROZEN_AFTER: Duration = Duration::from_secs(5);

/// Above a turn's normal length (a tick a second and a flush), so a loop that merely waited is
/// never taken for frozen.
pub(super) const MIN_WRITE_DEADLINE: Duration = Duration::from_secs(2);

/// How long a checkpoint may take from its decision to the target. The commits follower's
/// group evicts a member that sent no heartbeat for its `session.timeout.ms` (librdkafka's
/// 45 s unless the flow's source config sets it), at the earliest one `heartbeat.interval.ms`
/// after the freeze began; half of that is the limit. A checkpoint older than it at a resume
/// is not sent: the producer drops queued messages past `message.timeout.ms` before it sends
/// them, and [`FreezeLimit`] stops the loop before it queues one it decided earlier.
pub(super) fn write_deadline(source: &rdkafka::ClientConfig) -> Duration {
    let session = configured_ms(source, "session.timeout.ms").unwrap_or(DEFAULT_SESSION_TIMEOUT);
    let heartbeat =
        configured_ms(source, "heartbeat.interval.ms").unwrap_or(DEFAULT_HEARTBEAT_INTERVAL);
    (session.saturating_sub(heartbeat) / 2).clamp(MIN_WRITE_DEADLINE, CHECKPOINT_WRITE_TIMEOUT)
}

/// A wait for the loop's next turn, or from a decision to its write, beyond which the process
/// counts as frozen and other replicas may have taken its groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FreezeLimit(Duration);

impl Default for FreezeLimit {
    fn default() -> Self {
        FreezeLimit(FROZEN_AFTER)
    }
}

impl FreezeLimit {
    /// Shorter than the usual limit when the checkpoints' write deadline is.
    pub(super) fn within(deadline: Duration) -> Self {
        FreezeLimit(FROZEN_AFTER.min(deadline))
    }

    pub(super) fn passed_by(self, gap: Duration) -> bool {
        gap > self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> rdkafka::ClientConfig {
        let mut c = rdkafka::ClientConfig::new();
        for (k, v) in pairs {
            c.set(*k, *v);
        }
        c
    }

    #[test]
    fn a_turns_wait_is_no_freeze_and_a_short_deadline_shortens_the_limit() {
        let usual = FreezeLimit::default();
        assert!(!usual.passed_by(Duration::from_millis(1_200)));
        assert!(usual.passed_by(Duration::from_secs(6)));
        let short = FreezeLimit::within(Duration::from_millis(2_500));
        assert!(short.passed_by(Duration::from_secs(3)));
        assert_eq!(FreezeLimit::within(Duration::from_secs(21)), usual);
    }

    #[test]
    fn the_write_deadline_is_half_of_what_a_session_lets_a_frozen_member_keep_its_groups() {
        // librdkafka's defaults: (45 s - 3 s) / 2.
        assert_eq!(write_deadline(&config(&[])), Duration::from_secs(21));
        // The chaos flow's: (6 s - 1 s) / 2.
        assert_eq!(
            write_deadline(&config(&[
                ("session.timeout.ms", "6000"),
                ("heartbeat.interval.ms", "1000"),
            ])),
            Duration::from_millis(2_500)
        );
        assert_eq!(
            write_deadline(&config(&[("session.timeout.ms", "3000")])),
            MIN_WRITE_DEADLINE,
        );
        assert_eq!(
            write_deadline(&config(&[("session.timeout.ms", "1800000")])),
            CHECKPOINT_WRITE_TIMEOUT
        );
        assert_eq!(
            write_deadline(&config(&[("session.timeout.ms", "soon")])),
            Duration::from_secs(21),
            "not a number: librdkafka's default"
        );
    }
}
