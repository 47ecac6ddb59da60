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

/// The topics on the target the flow's loops write, those the target has: its positions and
/// offset-syncs topics and the remote topics (source loop), its checkpoints topic (checkpoint
/// loop). None for an Observe flow, which writes nothing.
pub fn written_topics(
    flow: &Flow,
    source: Option<&Metadata>,
    target: &Metadata,
    replicates: impl Fn(&str) -> bool,
) -> Vec<String> {
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
            source
                .into_iter()
                .flat_map(|md| md.topics())
                .map(|t| t.name())
                .filter(|t| replicates(t))
                .map(|t| policy.format_remote_topic(alias, t)),
        );
        remote.sort();
    }
    if flow.spec.checkpoints.enabled {
        internal.push(policy.checkpoints_topic(alias));
    }
    let present: HashSet<&str> = target
        .topics()
        .iter()
        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
        .map(|t| t.name())
        .collect();
    internal
        .into_iter()
        .chain(remote)
        .filter(|t| present.contains(t.as_str()))
        .take(MAX_CHECKED)
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
