//! Checkpoints that point into a remote log that is no longer there: the remote topic was
//! deleted and created again (or lost records) after the checkpoint was written. The
//! replicator replaces such checkpoints, but until it has (or while the source is down and it
//! cannot), committing one would place the group at an offset of the new log that means
//! nothing. Failover refuses those partitions instead.

use std::collections::HashMap;
use std::time::Duration;

use super::clusters::Partition;
use crate::flow::Flow;
use crate::kafka::positions::{GapKind, PositionReader, positions_topic};

/// When the replicator last found each source partition's remote partition rewound (ms since
/// the epoch), from the flow's positions topic. Flows whose positions topic cannot be read
/// (another replicator writes the target, or it is not reachable now) give none: the remote
/// partition's end is still compared.
pub fn target_rewinds(flow: &Flow) -> HashMap<Partition, i64> {
    let topic = positions_topic(flow.source_alias());
    let Ok(mut reader) = PositionReader::new(&flow.target_client, topic, "mirrorflow-cli") else {
        return HashMap::new();
    };
    if reader.read_to_end(Duration::from_secs(15)).is_err() {
        return HashMap::new();
    }
    let mut newest = HashMap::new();
    for g in reader
        .gaps()
        .iter()
        .filter(|g| g.kind == GapKind::TargetRewound)
    {
        let at = newest
            .entry((g.topic.clone(), g.partition))
            .or_insert(g.detected_ms);
        *at = (*at).max(g.detected_ms);
    }
    newest
}

/// Why a checkpoint at remote offset `downstream` (written at `written_ms`) must not be
/// committed, if it must not: it lies past the remote partition's end, or the remote partition
/// was found rewound after it was written.
pub fn stale_checkpoint(
    downstream: i64,
    written_ms: Option<i64>,
    remote_end: Option<i64>,
    rewound_ms: Option<i64>,
) -> Option<String> {
    if let Some(end) = remote_end.filter(|&end| downstream > end) {
        return Some(format!(
            "the checkpoint (offset {downstream}) lies past the remote partition's end ({end}): the remote topic was recreated or lost records since; wait for the replicator to write a new checkpoint"
        ));
    }
    match (rewound_ms, written_ms) {
        (Some(rewound), Some(written)) if rewound >= written => Some(
            "the remote topic was found recreated (condition Gapless, TargetTopicRecreated) after this checkpoint was written, so its offset belongs to the old log; wait for the replicator to write a new checkpoint".to_string(),
        ),
        (Some(_), None) => Some(
            "the remote topic was found recreated (condition Gapless, TargetTopicRecreated) and this checkpoint carries no time to tell whether it is newer; wait for the replicator to write a new checkpoint".to_string(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_into_a_gone_log_are_refused() {
        // Fresh: inside the log, no rewind, or a rewind before it was written.
        assert_eq!(stale_checkpoint(10, Some(1_000), Some(10), None), None);
        assert_eq!(stale_checkpoint(10, Some(1_000), Some(50), Some(999)), None);
        assert_eq!(stale_checkpoint(10, Some(1_000), None, None), None);
        // Past the end of the (new, shorter) log.
        let past = stale_checkpoint(40, Some(1_000), Some(12), None).expect("refused");
        assert!(
            past.contains("past the remote partition's end (12)"),
            "{past}"
        );
        // Inside the new log, but written before the rewind was found.
        let older = stale_checkpoint(5, Some(1_000), Some(12), Some(1_000)).expect("refused");
        assert!(older.contains("recreated"), "{older}");
        assert!(stale_checkpoint(5, None, Some(12), Some(1)).is_some());
    }
}
