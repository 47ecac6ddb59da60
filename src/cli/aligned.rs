//! `failover --offsets as-is` on flows with `spec.offsets: Aligned`: a group's source offset
//! holds the same record on the target, except on partitions whose alignment broke (recorded in
//! the flow's positions topic).

use super::CliError;
use super::clusters::Partition;
use super::failover::{Estimate, Range};
use crate::flow::Flow;

/// `--offsets as-is` for one partition: (offset, estimate, refusal). The group's source commit
/// holds on the target when the partition is aligned.
pub fn as_is(source_committed: Option<i64>, misaligned: bool) -> (i64, Estimate, Option<String>) {
    let none = Estimate {
        reread: None,
        skips: None,
        note: None,
    };
    match source_committed {
        _ if misaligned => (
            -1,
            none,
            Some(
                "the partition's alignment broke (condition OffsetsAligned): fail it over at its \
                 checkpoint (without --offsets as-is)"
                    .into(),
            ),
        ),
        None => (
            -1,
            none,
            Some("no committed source offset to reuse (is the source reachable?)".into()),
        ),
        Some(c) => (
            c,
            Estimate {
                reread: Some(Range::exact(0)),
                skips: None,
                note: Some("aligned: the source offset as is".into()),
            },
            None,
        ),
    }
}

/// Source partitions whose alignment broke, from the flow's positions topic.
pub fn misaligned_partitions(
    flow: &Flow,
) -> Result<std::collections::HashSet<Partition>, CliError> {
    if flow.spec.offsets != crate::api::OffsetsMode::Aligned {
        return Err(CliError::Usage {
            flag: "--offsets",
            message: "--offsets as-is needs a flow with spec.offsets: Aligned: translated \
                      flows number remote records differently"
                .into(),
        });
    }
    use crate::kafka::positions::{PositionReader, ReadError, positions_topic};
    let topic = positions_topic(flow.source_alias());
    let failed = |e: ReadError| match e {
        ReadError::Timeout {
            topic,
            at,
            end,
            timeout,
            ..
        } => CliError::Usage {
            flag: "--offsets",
            message: format!(
                "the positions topic {topic} could not be read to its end within {timeout:?} (offset {at} of {end}), so alignment is unknown"
            ),
        },
        e => CliError::Read(e),
    };
    let mut reader =
        PositionReader::new(&flow.target_client, topic, "mirrorflow-cli").map_err(failed)?;
    reader
        .read_to_end(std::time::Duration::from_secs(15))
        .map_err(failed)?;
    Ok(reader
        .gaps()
        .iter()
        .filter(|g| g.kind.breaks_alignment())
        .map(|g| (g.topic.clone(), g.partition))
        .collect())
}
