//! The `TopicAclsSynced` condition (`spec.sourceLoop.syncTopicAcls`): the probe reads the
//! source's topic ALLOW ACLs and the target's, and compares them the way the source loop
//! copies them ([`crate::kafka::acls`]).
//!
//! The replicator has no channel to the status, so the condition is what anyone can check on
//! the clusters: the principal's operations on each cluster resource (DESCRIBE on the source,
//! DESCRIBE and ALTER on the target), and the bindings themselves: one the source loop could
//! not create (a target without an authorizer) stays missing, and the condition says so.

use std::time::Duration;

use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;

use super::{Verdict, reason, verdict};
use crate::kafka::Side;
use crate::kafka::acls::{self, AclBinding, AclError};
use mirrorflow_rdkafka_ext::acls as ext;

pub const TOPIC_ACLS_SYNCED: &str = "TopicAclsSynced";

/// What the probe saw of the topic ACLs of both clusters.
#[derive(Clone, Debug, PartialEq)]
pub enum TopicAcls {
    /// Every binding the source's ACLs call for is on the target (`desired` of them; 0 also
    /// when the source has no authorizer).
    InSync { desired: usize },
    /// `missing` of `desired` bindings are not on the target; `example` is one of them.
    Missing {
        desired: usize,
        missing: usize,
        example: AclBinding,
    },
    /// The flow's principal lacks `lacking` on `side`'s cluster resource.
    Forbidden {
        side: Side,
        lacking: Vec<acls::Operation>,
    },
    /// The ACLs of `side` could not be read for another reason (timeout, unreachable).
    Unreadable { side: Side, error: String },
}

/// Reads and compares the ACLs; blocking. `remote_of` names a replicated topic's remote topic.
///
/// A target without an authorizer cannot be told from one with no ACLs yet: librdkafka 2.12
/// answers DescribeAcls with "no bindings" for both (it drops SECURITY_DISABLED), so such a
/// target shows as `Missing` and the message says that this is the likely cause.
pub fn observe<S: ClientContext, T: ClientContext>(
    source: &Client<S>,
    target: &Client<T>,
    remote_of: impl Fn(&str) -> Option<String>,
    timeout: impl Fn() -> Duration,
) -> TopicAcls {
    let unreadable = |side: Side, e: AclError| TopicAcls::Unreadable {
        side,
        error: e.to_string(),
    };
    // DescribeAcls answers "no bindings" to a principal without DESCRIBE on the cluster.
    let allowed = |side: Side, granted: Result<Option<Vec<acls::Operation>>, AclError>, needed| {
        let granted = granted.map_err(|e| unreadable(side, e))?;
        let lacking = acls::lacking(granted.as_deref(), needed);
        if lacking.is_empty() {
            Ok(())
        } else {
            Err(TopicAcls::Forbidden { side, lacking })
        }
    };
    let filter = acls::topic_allow_filter();
    let source_ops = ext::cluster_operations(source, timeout());
    if let Err(t) = allowed(Side::Source, source_ops, acls::SOURCE_NEEDS) {
        return t;
    }
    let source_acls = match ext::describe_acls(source, &filter, timeout()) {
        Ok(b) => b,
        // No authorizer on the source: nothing to copy (said by a librdkafka that reports it).
        Err(e) if e.code == RDKafkaErrorCode::SecurityDisabled => Vec::new(),
        Err(e) => return unreadable(Side::Source, e),
    };
    let desired = acls::remote_bindings(&source_acls, remote_of);
    if desired.is_empty() {
        return TopicAcls::InSync { desired: 0 };
    }
    let target_ops = ext::cluster_operations(target, timeout());
    if let Err(t) = allowed(Side::Target, target_ops, acls::TARGET_NEEDS) {
        return t;
    }
    let target_acls = match ext::describe_acls(target, &filter, timeout()) {
        Ok(b) => b,
        Err(e) if e.code == RDKafkaErrorCode::SecurityDisabled => Vec::new(),
        Err(e) => return unreadable(Side::Target, e),
    };
    let missing = acls::missing(&desired, &target_acls);
    match missing.first() {
        None => TopicAcls::InSync {
            desired: desired.len(),
        },
        Some(example) => TopicAcls::Missing {
            desired: desired.len(),
            missing: missing.len(),
            example: example.clone(),
        },
    }
}

/// The condition for what the probe saw; `refresh` is `spec.sourceLoop.topicsRefreshInterval`.
pub(crate) fn topic_acls_synced(acls: &TopicAcls, refresh: &str) -> Verdict {
    let off = "or set spec.sourceLoop.syncTopicAcls to false";
    match acls {
        TopicAcls::InSync { desired: 0 } => verdict(
            TOPIC_ACLS_SYNCED,
            true,
            reason::OK,
            "no ALLOW ACL on a replicated topic to copy (or the source has no authorizer)",
        ),
        TopicAcls::InSync { desired } => verdict(
            TOPIC_ACLS_SYNCED,
            true,
            reason::OK,
            format!(
                "the target has all {desired} ACL bindings copied from the source's topic ACLs"
            ),
        ),
        TopicAcls::Missing {
            desired,
            missing,
            example,
        } => verdict(
            TOPIC_ACLS_SYNCED,
            false,
            reason::TOPIC_ACLS_MISSING,
            format!(
                "{missing} of {desired} ACL bindings copied from the source are not on the target (e.g. {} {:?} on topic {}); the replicator adds them every {refresh} (spec.sourceLoop.topicsRefreshInterval); if this lasts, the target refuses them, most likely because its brokers have no authorizer (SECURITY_DISABLED in the replicator's log: configure authorizer.class.name on them), {off}",
                example.principal, example.operation, example.name
            ),
        ),
        TopicAcls::Forbidden { side, lacking } => {
            let ops: Vec<String> = lacking
                .iter()
                .map(|o| format!("{o:?}").to_uppercase())
                .collect();
            let flags: Vec<String> = lacking
                .iter()
                .map(|o| format!("--operation {o:?}"))
                .collect();
            verdict(
                TOPIC_ACLS_SYNCED,
                false,
                reason::TOPIC_ACLS_FORBIDDEN,
                format!(
                    "the principal of spec.{side} lacks {} on the {side} cluster's cluster resource (DESCRIBE to read ACLs, ALTER on the target to create them): grant it (kafka-acls --add --allow-principal <it> {} --cluster), {off}",
                    ops.join(" and "),
                    flags.join(" ")
                ),
            )
        }
        TopicAcls::Unreadable { side, error } => verdict(
            TOPIC_ACLS_SYNCED,
            false,
            reason::TOPIC_ACLS_UNKNOWN,
            format!("the topic ACLs of the {side} cluster could not be read: {error}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::acls::{Operation, PatternType, Permission, ResourceType};

    #[test]
    fn each_outcome_has_its_reason_and_names_the_field() {
        let example = AclBinding {
            resource_type: ResourceType::Topic,
            name: "src.orders".into(),
            pattern: PatternType::Literal,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: Operation::Read,
            permission: Permission::Allow,
        };
        let cases = [
            (TopicAcls::InSync { desired: 0 }, true, reason::OK, ""),
            (TopicAcls::InSync { desired: 3 }, true, reason::OK, ""),
            (
                TopicAcls::Missing {
                    desired: 3,
                    missing: 1,
                    example,
                },
                false,
                reason::TOPIC_ACLS_MISSING,
                "authorizer.class.name",
            ),
            (
                TopicAcls::Forbidden {
                    side: Side::Target,
                    lacking: vec![Operation::Alter],
                },
                false,
                reason::TOPIC_ACLS_FORBIDDEN,
                "spec.target lacks ALTER",
            ),
            (
                TopicAcls::Unreadable {
                    side: Side::Source,
                    error: "timed out".into(),
                },
                false,
                reason::TOPIC_ACLS_UNKNOWN,
                "timed out",
            ),
        ];
        for (acls, ok, why, says) in cases {
            let v = topic_acls_synced(&acls, "10s");
            assert_eq!((v.ok, v.reason), (ok, why), "{acls:?}");
            assert!(v.message.contains(says), "{}", v.message);
        }
        let v = topic_acls_synced(
            &TopicAcls::Forbidden {
                side: Side::Source,
                lacking: vec![Operation::Describe],
            },
            "10s",
        );
        assert!(
            v.message.contains("--operation Describe --cluster")
                && v.message.contains("spec.sourceLoop.syncTopicAcls"),
            "{}",
            v.message
        );
    }
}
