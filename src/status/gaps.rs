//! Breaks in continuity the replicator recorded: `status.gaps` and the `Gapless` condition.

use super::{GAPLESS, GAPS_ACKNOWLEDGED, MAX_LISTED_GAPS, Observation, Verdict, reason, verdict};
use crate::api::{GapStatus, MirrorFlowStatus};

/// The unacknowledged gaps, oldest first, at most [`MAX_LISTED_GAPS`] (the newest), and how
/// many there are in all.
pub(super) fn gap_list(
    previous: Option<&MirrorFlowStatus>,
    obs: &Observation,
) -> (Vec<GapStatus>, usize) {
    let mut gaps: Vec<(i64, GapStatus)> = match &obs.gaps {
        Some(found) => found
            .iter()
            .map(|g| {
                let at = k8s_openapi::jiff::Timestamp::from_millisecond(g.detected_ms)
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                (
                    g.detected_ms,
                    GapStatus {
                        topic: g.topic.clone(),
                        partition: g.partition,
                        reason: g.kind.reason().to_string(),
                        from: g.from,
                        to: g.to,
                        detected_at: at,
                        message: g.describe(),
                    },
                )
            })
            .collect(),
        None => previous
            .map(|p| p.gaps.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|g| (millis(&g.detected_at), g))
            .collect(),
    };
    if let Some(Ok(ack)) = obs.gaps_acknowledged {
        gaps.retain(|(at, _)| *at > ack);
    }
    gaps.sort_by(|a, b| (a.0, &a.1.topic, a.1.partition).cmp(&(b.0, &b.1.topic, b.1.partition)));
    let total = gaps.len();
    let skip = total.saturating_sub(MAX_LISTED_GAPS);
    (gaps.into_iter().skip(skip).map(|(_, g)| g).collect(), total)
}

fn millis(rfc3339: &str) -> i64 {
    rfc3339
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map_or(0, |t| t.as_millisecond())
}

pub(super) fn gapless(gaps: &[GapStatus], unacknowledged: usize, obs: &Observation) -> Verdict {
    let Some(newest) = gaps.last() else {
        let message = if obs.observe_only {
            "Observe mode: another tool replicates, and its skips are not visible here"
        } else {
            "no record was skipped: the replicator found no break in continuity, or each was acknowledged"
        };
        return verdict(GAPLESS, true, reason::NO_GAPS, message);
    };
    let bad_annotation = match &obs.gaps_acknowledged {
        Some(Err(e)) => format!(" Note: {e}."),
        _ => String::new(),
    };
    let reason = match newest.reason.as_str() {
        reason::SOURCE_TRUNCATED => reason::SOURCE_TRUNCATED,
        reason::SOURCE_TOPIC_RECREATED => reason::SOURCE_TOPIC_RECREATED,
        reason::RECORD_REJECTED => reason::RECORD_REJECTED,
        _ => reason::TARGET_TOPIC_RECREATED,
    };
    verdict(
        GAPLESS,
        false,
        reason,
        format!(
            "{} unacknowledged break(s) in continuity, see status.gaps; newest, detected {}: {}. Check what the consumers of that topic need, then acknowledge: kubectl annotate mirrorflow {} {GAPS_ACKNOWLEDGED}={} --overwrite.{bad_annotation}",
            unacknowledged, newest.detected_at, newest.message, obs.name, newest.detected_at
        ),
    )
}
