//! Breaks in continuity the replicator recorded: `status.gaps` and the `Gapless` condition.

use super::{
    GAPLESS, GAPS_ACKNOWLEDGED, MAX_LISTED_GAPS, OFFSETS_ALIGNED, Observation, Verdict, reason,
    verdict,
};
use crate::api::{GapStatus, MirrorFlowStatus};
use crate::kafka::positions::GapKind;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The unacknowledged gaps, oldest first, at most [`MAX_LISTED_GAPS`] (the newest), and how
/// many there are in all.
pub(super) fn gap_list(
    previous: Option<&MirrorFlowStatus>,
    obs: &Observation,
) -> (Vec<GapStatus>, usize) {
    let mut gaps: Vec<(i64, GapStatus)> = match &obs.gaps {
        Some(found) => found
            .iter()
            // Nothing was skipped there: `OffsetsAligned` reports it.
            .filter(|g| !g.kind.breaks_alignment())
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
        reason::FILLERS_NOT_DELETED => reason::FILLERS_NOT_DELETED,
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

/// `OffsetsAligned`: no partition of an aligned flow recorded a break of its alignment. Not
/// acknowledgeable: a misaligned partition stays translated for good (consumers that reuse
/// source offsets must not fail over onto it).
pub(super) fn offsets_aligned(obs: &Observation, previous: &[Condition]) -> Verdict {
    let Some(found) = &obs.gaps else {
        // The positions could not be read this time: the last verdict stands.
        if let Some(c) = previous.iter().find(|c| c.type_ == OFFSETS_ALIGNED) {
            let reason = match c.reason.as_str() {
                reason::OFFSETS_MATCH => reason::OFFSETS_MATCH,
                reason::OFFSETS_MISALIGNED => reason::OFFSETS_MISALIGNED,
                _ => reason::ALIGNMENT_UNKNOWN,
            };
            return verdict(
                OFFSETS_ALIGNED,
                c.status == "True",
                reason,
                c.message.clone(),
            );
        }
        return verdict(
            OFFSETS_ALIGNED,
            false,
            reason::ALIGNMENT_UNKNOWN,
            "the flow's positions topic on the target could not be read yet, so whether every partition is aligned is not known; it is created when the replicator starts",
        );
    };
    let mut broken: Vec<_> = found.iter().filter(|g| g.kind.breaks_alignment()).collect();
    broken.sort_by_key(|g| g.detected_ms);
    // An open transaction keeps the remote partition's read_committed consumers from reading
    // on until an administrator ends it: that break is the one to show, whenever it happened.
    let shown = broken
        .iter()
        .rev()
        .find(|g| g.kind == GapKind::OpenTransaction)
        .map(|g| ("an open transaction", *g));
    let Some(first) = broken.first() else {
        return verdict(
            OFFSETS_ALIGNED,
            true,
            reason::OFFSETS_MATCH,
            "every remote partition holds its records at their source offsets: consumers may fail over reusing their offsets (failover --offsets as-is)",
        );
    };
    let mut partitions: Vec<String> = broken
        .iter()
        .map(|g| format!("{}[{}]", g.topic, g.partition))
        .collect();
    partitions.dedup();
    let (label, shown) = shown.unwrap_or(("first", first));
    verdict(
        OFFSETS_ALIGNED,
        false,
        reason::OFFSETS_MISALIGNED,
        format!(
            "{} partition(s) lost alignment ({}); {label}: {}. Consumers of those partitions must fail over through checkpoints (translated offsets), not by reusing source offsets. Find what else writes to the remote topic; a new flow with new remote topics aligns again.",
            partitions.len(),
            partitions.join(", "),
            shown.describe()
        ),
    )
}
