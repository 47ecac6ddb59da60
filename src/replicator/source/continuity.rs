//! Breaks in a copied partition's continuity, found instead of skipped.
//!
//! Kafka lets a consumer jump silently when its position falls outside the log: MM2 (and any
//! consumer with `auto.offset.reset`) resumes at the log start after retention deleted what it
//! had not copied yet, and at the start of a recreated topic without a word. Here the source
//! consumer runs with `auto.offset.reset=error`, every start position is checked against both
//! logs, and each break is decided by [`resume`], recorded as a [`Gap`] in the positions topic
//! (where the operator turns it into a condition and an event), logged and counted:
//!
//! | found | kind | copying continues |
//! |---|---|---|
//! | stored position before the source log start | [`GapKind::SourceTruncated`] | at the log start; the records between are gone |
//! | stored position after the source log end | [`GapKind::SourceRewound`] | at the start of the new log |
//! | target partition ends before the copies reached | [`GapKind::TargetRewound`] | from the source's earliest record, all copied again |

use crate::clock::now_ms;
use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Offset};

use crate::kafka::log_bounds::{LogBounds, log_bounds};
use crate::kafka::positions::{Frontier, Gap, GapKind};

/// Where a partition resumes and what, if anything, broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    pub offset: Offset,
    /// The frontier to start the partition's bookkeeping from (`None`: nothing copied yet).
    pub start: Option<Frontier>,
    /// A break: (kind, from, to), see [`Gap`].
    pub gap: Option<(GapKind, i64, i64)>,
}

/// Where partitions end, by topic and partition (one missing: not known).
pub type Ends = HashMap<(String, i32), i64>;

/// Where each of `partitions` (source topic, partition, remote topic) resumes: its stored
/// position checked against both logs ([`resume`]), with one ListOffsets per cluster for all
/// of them. The positions must have been read to their end first. A partition without a stored
/// position starts at the source log start read here too: left to librdkafka, each
/// `Offset::Beginning` costs a ListOffsets request of its own, and with 2,000 partitions the
/// copy would start seconds late.
pub fn resume_all(
    positions: &crate::kafka::positions::PositionReader,
    probe: &LogProbe,
    partitions: &[(String, i32, String)],
) -> Vec<Resume> {
    let remotes: Vec<(String, i32)> = partitions
        .iter()
        .filter(|(t, p, _)| positions.get(t, *p).is_some())
        .map(|(_, p, r)| (r.clone(), *p))
        .collect();
    resume_all_at(positions, probe, partitions, &probe.target_ends(&remotes))
}

/// [`resume_all`], the remote partitions' ends read already (`target_ends`: where each ends
/// for `read_committed` readers; one missing is unknown).
pub fn resume_all_at(
    positions: &crate::kafka::positions::PositionReader,
    probe: &LogProbe,
    partitions: &[(String, i32, String)],
    target_ends: &Ends,
) -> Vec<Resume> {
    let sources: Vec<(String, i32)> = partitions.iter().map(|(t, p, _)| (t.clone(), *p)).collect();
    let bounds = probe.source(&sources);
    partitions
        .iter()
        .map(|(topic, partition, remote)| {
            resume(
                positions.get(topic, *partition),
                bounds.get(&(topic.clone(), *partition)).copied(),
                target_ends.get(&(remote.clone(), *partition)).copied(),
            )
        })
        .collect()
}

/// Decides where a partition resumes from its stored position and the logs' bounds
/// (`None` when unknown: then the stored position is trusted, as before the check existed).
pub fn resume(
    stored: Option<Frontier>,
    source: Option<LogBounds>,
    target_end: Option<i64>,
) -> Resume {
    let Some(stored) = stored else {
        // Nothing copied yet: the source log start, as `Offset::Beginning` would resolve it.
        return Resume {
            offset: source.map_or(Offset::Beginning, |b| Offset::Offset(b.start)),
            start: None,
            gap: None,
        };
    };
    if let Some(end) = target_end
        && stored.downstream >= 0
        && end <= stored.downstream
    {
        // The copies are gone from the target: copy again whatever the source still holds.
        // Nothing of it is on the target now (downstream unknown).
        let gap = Some((GapKind::TargetRewound, stored.downstream + 1, end));
        return match source {
            Some(b) => Resume {
                offset: Offset::Offset(b.start),
                start: Some(Frontier {
                    next: b.start,
                    downstream: -1,
                }),
                gap,
            },
            None => Resume {
                offset: Offset::Beginning,
                start: None,
                gap,
            },
        };
    }
    let Some(bounds) = source else {
        return Resume {
            offset: Offset::Offset(stored.next),
            start: Some(stored),
            gap: None,
        };
    };
    let restart = |kind, to| Resume {
        offset: Offset::Offset(bounds.start),
        start: Some(Frontier {
            next: bounds.start,
            downstream: stored.downstream,
        }),
        gap: Some((kind, stored.next, to)),
    };
    if stored.next < bounds.start {
        restart(GapKind::SourceTruncated, bounds.start)
    } else if stored.next > bounds.end {
        restart(GapKind::SourceRewound, bounds.end)
    } else {
        Resume {
            offset: Offset::Offset(stored.next),
            start: Some(stored),
            gap: None,
        }
    }
}

/// A break found while copying: the consumer's next offset `next` of a partition lies outside
/// its source log (the consumer stopped on it, `auto.offset.reset=error`). `None`: inside.
pub fn out_of_range(next: i64, bounds: LogBounds) -> Option<(GapKind, i64, i64)> {
    if next < bounds.start {
        Some((GapKind::SourceTruncated, next, bounds.start))
    } else if next > bounds.end {
        Some((GapKind::SourceRewound, next, bounds.end))
    } else {
        None
    }
}

/// Asks both clusters where logs start and end; answers `None` for what it could not learn
/// (then the stored position is trusted and the consumer's own range check backs it up).
pub struct LogProbe {
    source: BaseConsumer,
    target: BaseConsumer,
}

const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// The periodic check of idle remote partitions ([`LogProbe::remote_ends`]) runs on the copy
/// thread, which copies nothing while it waits: a target broker that went away (whose
/// partitions' leaders moved to the others) must cost a second or two, not the 10 s of a
/// request to a dead leader. An unanswered check is simply repeated next time.
const IDLE_CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the probe's clients refresh their metadata on their own. librdkafka's 5 min
/// default kept a stopped broker as leader in an unpolled client for minutes, so every check
/// went to it and timed out; leader changes are learned within this instead.
const METADATA_REFRESH: &str = "10000";

impl LogProbe {
    pub fn new(source: &ClientConfig, target: &ClientConfig) -> Result<Self, KafkaError> {
        // Never in a group: only ListOffsets requests.
        let client = |base: &ClientConfig| -> Result<BaseConsumer, KafkaError> {
            base.clone()
                .set("group.id", "mirrorflow-log-probe")
                // Ends as the copy's read_committed consumer and the aligned resume see them
                // (the last stable offset), whatever the flow's client properties say.
                .set("isolation.level", "read_committed")
                .set("enable.auto.commit", "false")
                .set("topic.metadata.refresh.interval.ms", METADATA_REFRESH)
                .create()
        };
        Ok(LogProbe {
            source: client(source)?,
            target: client(target)?,
        })
    }

    pub fn source(&self, partitions: &[(String, i32)]) -> HashMap<(String, i32), LogBounds> {
        log_bounds(&self.source, partitions, PROBE_TIMEOUT).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the source partitions' offsets; trusting the stored positions");
            HashMap::new()
        })
    }

    /// The source bounds of `partitions` for a periodic check on the copy thread (the stall
    /// watch): bounded like [`Self::remote_ends`], and an unanswered check is simply left out.
    pub fn source_quick(&self, partitions: &[(String, i32)]) -> HashMap<(String, i32), LogBounds> {
        log_bounds(&self.source, partitions, IDLE_CHECK_TIMEOUT).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "cannot read the source partitions' offsets for the stall watch");
            HashMap::new()
        })
    }

    /// Where each remote partition of `copied` (a caller's key, remote topic, partition) ends
    /// now; one ListOffsets per broker. Partitions the target did not answer for are left out
    /// (checked again next time).
    pub fn remote_ends<K>(&self, copied: Vec<(K, String, i32)>) -> Vec<(K, i64)> {
        if copied.is_empty() {
            return Vec::new();
        }
        let keys: Vec<(String, i32)> = copied.iter().map(|(_, r, p)| (r.clone(), *p)).collect();
        let ends = self.ends_within(&keys, IDLE_CHECK_TIMEOUT);
        copied
            .into_iter()
            .filter_map(|(k, r, p)| Some((k, *ends.get(&(r, p))?)))
            .collect()
    }

    /// End offsets of target partitions.
    pub fn target_ends(&self, partitions: &[(String, i32)]) -> Ends {
        self.ends_within(partitions, PROBE_TIMEOUT)
    }

    fn ends_within(
        &self,
        partitions: &[(String, i32)],
        timeout: Duration,
    ) -> HashMap<(String, i32), i64> {
        log_bounds(&self.target, partitions, timeout)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot read the remote partitions' offsets; resumes trust the stored positions, aligned ones ask again");
                HashMap::new()
            })
            .into_iter()
            .map(|(k, b)| (k, b.end))
            .collect()
    }
}

/// A break found now in `topic`/`partition`; `found` is (kind, from, to) as [`Resume::gap`].
pub fn found_now(topic: &str, partition: i32, (kind, from, to): (GapKind, i64, i64)) -> Gap {
    Gap {
        topic: topic.to_string(),
        partition,
        kind,
        from,
        to,
        detected_ms: now_ms(),
    }
}

/// Logs and counts a gap, then has `write` put its record (key, value) into the positions
/// topic and wait for the target to take it: a gap is rare, and must be on record before the
/// position moves past it. Returns whether the record was written.
pub fn record(
    gap: &Gap,
    metrics: &crate::replicator::metrics::Metrics,
    write: impl FnOnce(&[u8], &[u8]) -> Result<(), KafkaError>,
) -> bool {
    tracing::error!(topic = %gap.topic, partition = gap.partition, reason = gap.kind.reason(),
        from = gap.from, to = gap.to, "{}", gap.describe());
    metrics
        .continuity_breaks
        .with_label_values(&[gap.kind.reason()])
        .inc();
    let (key, value) = gap.encode();
    if let Err(e) = write(&key, &value) {
        tracing::warn!(error = %e, topic = %gap.topic, partition = gap.partition,
            "could not record the break in the positions topic; it is logged and counted only");
        metrics
            .errors
            .with_label_values(&["source", "positions"])
            .inc();
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(next: i64, downstream: i64) -> Option<Frontier> {
        Some(Frontier { next, downstream })
    }

    fn bounds(start: i64, end: i64) -> Option<LogBounds> {
        Some(LogBounds { start, end })
    }

    #[test]
    fn a_position_inside_both_logs_resumes_where_it_was() {
        let r = resume(at(50, 49), bounds(0, 80), Some(50));
        assert_eq!(r.offset, Offset::Offset(50));
        assert_eq!(r.start, at(50, 49));
        assert_eq!(r.gap, None);
        // At the very end of the source, nothing to copy yet: still no break.
        assert_eq!(resume(at(80, 79), bounds(0, 80), Some(80)).gap, None);
        // Nothing stored: from the log start, nothing to compare.
        let fresh = resume(None, bounds(10, 80), Some(0));
        assert_eq!(
            (fresh.offset, fresh.start, fresh.gap),
            (Offset::Offset(10), None, None)
        );
        // Nor its bounds: from the beginning, whatever it is.
        assert_eq!(resume(None, None, None).offset, Offset::Beginning);
    }

    #[test]
    fn retention_past_the_position_is_a_gap_with_its_exact_range() {
        let r = resume(at(50, 49), bounds(120, 200), Some(50));
        assert_eq!(r.gap, Some((GapKind::SourceTruncated, 50, 120)));
        assert_eq!(r.offset, Offset::Offset(120));
        assert_eq!(
            r.start,
            at(120, 49),
            "target offsets continue after the copies"
        );
    }

    #[test]
    fn a_source_log_shorter_than_the_position_is_a_recreated_topic() {
        let r = resume(at(500, 499), bounds(0, 30), Some(500));
        assert_eq!(r.gap, Some((GapKind::SourceRewound, 500, 30)));
        assert_eq!(r.offset, Offset::Offset(0));
        assert_eq!(r.start, at(0, 499));
    }

    #[test]
    fn a_target_log_behind_the_copies_means_copy_everything_again() {
        let r = resume(at(500, 499), bounds(100, 600), Some(0));
        assert_eq!(r.gap, Some((GapKind::TargetRewound, 500, 0)));
        assert_eq!((r.offset, r.start), (Offset::Offset(100), at(100, -1)));
        // Source bounds unknown: from its beginning, whatever it is.
        let r = resume(at(500, 499), None, Some(3));
        assert_eq!(r.gap, Some((GapKind::TargetRewound, 500, 3)));
        assert_eq!((r.offset, r.start), (Offset::Beginning, None));
        // A position that never reached the target (downstream unknown) proves nothing.
        assert_eq!(resume(at(5, -1), bounds(0, 10), Some(0)).gap, None);
        // Unknown bounds: the stored position is trusted.
        assert_eq!(resume(at(5, 4), None, None).offset, Offset::Offset(5));
    }

    #[test]
    fn out_of_range_names_the_side_the_offset_fell_off() {
        let b = LogBounds { start: 10, end: 20 };
        assert_eq!(out_of_range(3, b), Some((GapKind::SourceTruncated, 3, 10)));
        assert_eq!(out_of_range(25, b), Some((GapKind::SourceRewound, 25, 20)));
        assert_eq!(out_of_range(10, b), None);
        assert_eq!(out_of_range(20, b), None);
    }
}
