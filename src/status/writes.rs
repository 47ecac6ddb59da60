//! Topics on the target that the flow's replicator writes and that the target's authorizer
//! does not let the flow's principal write. The replicator's write errors have no channel to
//! the status (the record that would report them goes to its positions topic, which may be
//! one of those refused), so the probe asks the target, with the flow's credentials, what that
//! principal may do on each topic (DescribeTopics with authorized operations), and each one it
//! may not write becomes a refusal: `Replicating` names it with the fix.

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::metadata::Metadata;

use crate::api::{FlowMode, OffsetSyncsLocation};
use crate::flow::Flow;
use crate::kafka::acls::Operation;
use crate::kafka::positions;
use crate::kafka::refusals::Refusal;
use mirrorflow_rdkafka_ext::acls as ext;

/// At most this many topics are asked about per probe: the internal topics first, then the
/// remote topics by name.
pub const MAX_CHECKED: usize = 500;

/// The topics on the target the flow's loops write: its positions and offset-syncs topics
/// and the remote topics of the source topics it copies, `mirrored` (source loop), its
/// checkpoints topic (checkpoint loop); internal topics first, then the remote topics by name.
/// None for an Observe flow, which writes nothing.
pub fn written_topics(flow: &Flow, mirrored: &[&str]) -> Vec<String> {
    if flow.spec.mode != FlowMode::Replicate {
        return Vec::new();
    }
    let policy = flow.policy.as_ref();
    let alias = flow.source_alias();
    let mut internal = Vec::new();
    let mut remote = Vec::new();
    if flow.spec.source_loop.enabled {
        internal.push(positions::positions_topic(alias));
        if flow.spec.source_loop.offset_syncs_location == OffsetSyncsLocation::Target {
            internal.push(policy.offset_syncs_topic(alias));
        }
        remote.extend(
            mirrored
                .iter()
                .map(|t| policy.format_remote_topic(alias, t)),
        );
        remote.sort();
    }
    if flow.spec.checkpoints.enabled {
        internal.push(policy.checkpoints_topic(alias));
    }
    internal.into_iter().chain(remote).collect()
}

/// The topics of `written` the target has, at most [`MAX_CHECKED`], in order: those the probe
/// asks about.
pub fn checked(written: Vec<String>, on_target: impl Fn(&str) -> bool) -> Vec<String> {
    written
        .into_iter()
        .filter(|t| on_target(t))
        .take(MAX_CHECKED)
        .collect()
}

/// The names of the topics `md` lists with partitions.
pub fn present(md: &Metadata) -> HashSet<&str> {
    md.topics()
        .iter()
        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
        .map(|t| t.name())
        .collect()
}

/// A refusal for each of `topics` the target's authorizer does not let the client's principal
/// write. Nothing when the target does not answer (the probe's other checks name that) or
/// does not say (a broker before KIP-430, or without an authorizer: it then grants all).
pub fn refused_writes<C: ClientContext>(
    target: &Client<C>,
    topics: &[String],
    timeout: Duration,
) -> Vec<Refusal> {
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let Ok(answers) = ext::topic_operations(target, &names, timeout) else {
        return Vec::new();
    };
    answers
        .into_iter()
        .filter_map(|(topic, granted)| {
            let why = match granted {
                Ok(Some(ops)) if !ops.iter().any(|o| matches!(o, Operation::Write | Operation::All)) => {
                    format!("its authorizer grants the flow's principal {ops:?} on it, not WRITE")
                }
                Err(e) if e.code == RDKafkaErrorCode::TopicAuthorizationFailed => {
                    "its authorizer does not even let the flow's principal DESCRIBE it".to_string()
                }
                _ => return None,
            };
            Some(Refusal {
                message: format!(
                    "the target cluster does not let the replicator write to {topic}: {why}; grant the flow's target principal WRITE on it (a prefixed ACL on the source alias covers the remote topics), or give the flow target credentials that have it"
                ),
                topic,
                detected_ms: 0,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::test_flow;

    fn written(extra: &str, mirrored: &[&str], target: &[&str]) -> Vec<String> {
        let flow = test_flow("ns/f", extra);
        checked(written_topics(&flow, mirrored), |t| target.contains(&t))
    }

    #[test]
    fn the_internal_topics_come_first_then_the_remote_topics_the_target_has() {
        let got = written(
            "sourceLoop: {offsetSyncsLocation: Target}\n",
            &["orders-2", "orders-1", "orders-3"],
            &[
                "a.orders-1",
                "a.orders-2",
                "a.payments",
                "mirrorflow-positions.a.internal",
                "mm2-offset-syncs.a.internal",
                "a.checkpoints.internal",
            ],
        );
        assert_eq!(
            got,
            [
                "mirrorflow-positions.a.internal",
                "mm2-offset-syncs.a.internal",
                "a.checkpoints.internal",
                "a.orders-1",
                "a.orders-2",
            ]
        );
    }

    #[test]
    fn only_the_loops_that_run_write() {
        let target = [
            "a.orders",
            "mirrorflow-positions.a.internal",
            "mm2-offset-syncs.b.internal",
            "a.checkpoints.internal",
        ];
        // Offset syncs on the source (the default): not a target topic of the flow.
        assert_eq!(
            written("sourceLoop: {enabled: false}\n", &["orders"], &target),
            ["a.checkpoints.internal"]
        );
        assert_eq!(
            written("checkpoints: {enabled: false}\n", &["orders"], &target),
            ["mirrorflow-positions.a.internal", "a.orders"]
        );
        assert!(written("mode: Observe\n", &["orders"], &target).is_empty());
    }

    #[test]
    fn at_most_max_checked_topics_are_asked_about() {
        let source: Vec<String> = (0..MAX_CHECKED + 10)
            .map(|i| format!("orders-{i:04}"))
            .collect();
        let target: Vec<String> = source.iter().map(|t| format!("a.{t}")).collect();
        let flow = test_flow("ns/f", "");
        let mirrored: Vec<&str> = source.iter().map(String::as_str).collect();
        let got = checked(written_topics(&flow, &mirrored), |t| {
            target.contains(&t.to_string())
        });
        assert_eq!(got.len(), MAX_CHECKED);
        assert_eq!(got[0], "a.orders-0000");
    }
}
