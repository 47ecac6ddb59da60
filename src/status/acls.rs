//! The `TopicAclsSynced` condition (`spec.sourceLoop.syncTopicAcls`): the probe reads the
//! source's topic ALLOW ACLs and the target's, and compares them the way the source loop
//! copies them ([`crate::kafka::acls`]).
//!
//! The replicator has no channel to the status, so the condition is what anyone can check on
//! the clusters: a binding the source loop could not create (target without an authorizer, a
//! principal without ALTER on the target's cluster) stays missing, and the condition names it.

use std::time::Duration;

use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;

use super::{Verdict, reason, verdict};
use crate::kafka::Side;
use crate::kafka::acls::{self, AclBinding, AclError};

pub const TOPIC_ACLS_SYNCED: &str = "TopicAclsSynced";

/// What the probe saw of the topic ACLs of both clusters.
#[derive(Clone, Debug, PartialEq)]
pub enum TopicAcls {
    /// The source has no authorizer: there are no ACLs to copy.
    NoSourceAuthorizer,
    /// Every binding the source's ACLs call for is on the target (`desired` of them).
    InSync { desired: usize },
    /// `missing` of `desired` bindings are not on the target; `example` is one of them.
    Missing {
        desired: usize,
        missing: usize,
        example: AclBinding,
    },
    /// The source has ACLs to copy and the target has no authorizer.
    TargetAuthorizerMissing { desired: usize },
    /// The flow's principal may not describe ACLs on `side`'s cluster.
    Forbidden { side: Side, error: String },
    /// The ACLs of `side` could not be read for another reason (timeout, unreachable).
    Unreadable { side: Side, error: String },
}

/// Reads and compares the ACLs; blocking. `remote_of` names a replicated topic's remote topic.
pub fn observe<S: ClientContext, T: ClientContext>(
    source: &Client<S>,
    target: &Client<T>,
    remote_of: impl Fn(&str) -> Option<String>,
    timeout: impl Fn() -> Duration,
) -> TopicAcls {
    let describe = |side: Side, result: Result<Vec<AclBinding>, AclError>| {
        result.map_err(|e| match e.code {
            RDKafkaErrorCode::ClusterAuthorizationFailed => TopicAcls::Forbidden {
                side,
                error: e.to_string(),
            },
            _ => TopicAcls::Unreadable {
                side,
                error: e.to_string(),
            },
        })
    };
    let filter = acls::topic_allow_filter();
    let source_acls = match mirrorflow_rdkafka_ext::acls::describe_acls(source, &filter, timeout())
    {
        Err(e) if e.code == RDKafkaErrorCode::SecurityDisabled => {
            return TopicAcls::NoSourceAuthorizer;
        }
        other => match describe(Side::Source, other) {
            Ok(b) => b,
            Err(t) => return t,
        },
    };
    let desired = acls::remote_bindings(&source_acls, remote_of);
    if desired.is_empty() {
        return TopicAcls::InSync { desired: 0 };
    }
    let target_acls = match mirrorflow_rdkafka_ext::acls::describe_acls(target, &filter, timeout())
    {
        Err(e) if e.code == RDKafkaErrorCode::SecurityDisabled => {
            return TopicAcls::TargetAuthorizerMissing {
                desired: desired.len(),
            };
        }
        other => match describe(Side::Target, other) {
            Ok(b) => b,
            Err(t) => return t,
        },
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
        TopicAcls::NoSourceAuthorizer => verdict(
            TOPIC_ACLS_SYNCED,
            true,
            reason::OK,
            "the source cluster has no authorizer: no topic ACLs to copy",
        ),
        TopicAcls::InSync { desired: 0 } => verdict(
            TOPIC_ACLS_SYNCED,
            true,
            reason::OK,
            "no ALLOW ACL on a replicated topic to copy",
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
                "{missing} of {desired} ACL bindings copied from the source are not on the target (e.g. {} {:?} on topic {}); the replicator adds them every {refresh} (spec.sourceLoop.topicsRefreshInterval); if this lasts, the target refuses them: grant the principal of spec.target ALTER on the target's cluster resource (kafka-acls --add --allow-principal <it> --operation Alter --cluster), see the replicator's log, {off}",
                example.principal, example.operation, example.name
            ),
        ),
        TopicAcls::TargetAuthorizerMissing { desired } => verdict(
            TOPIC_ACLS_SYNCED,
            false,
            reason::TARGET_AUTHORIZER_MISSING,
            format!(
                "the source has {desired} ACL bindings to copy and the target cluster has no authorizer (SECURITY_DISABLED): its remote topics are open to every client; configure authorizer.class.name on the target's brokers, {off}"
            ),
        ),
        TopicAcls::Forbidden { side, error } => verdict(
            TOPIC_ACLS_SYNCED,
            false,
            reason::TOPIC_ACLS_FORBIDDEN,
            format!(
                "the {side} cluster does not let the principal of spec.{side} describe ACLs: {error}; grant it DESCRIBE on the {side}'s cluster resource (and ALTER on the target's, to create them), {off}"
            ),
        ),
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
            (TopicAcls::NoSourceAuthorizer, true, reason::OK),
            (TopicAcls::InSync { desired: 3 }, true, reason::OK),
            (
                TopicAcls::Missing {
                    desired: 3,
                    missing: 1,
                    example,
                },
                false,
                reason::TOPIC_ACLS_MISSING,
            ),
            (
                TopicAcls::TargetAuthorizerMissing { desired: 2 },
                false,
                reason::TARGET_AUTHORIZER_MISSING,
            ),
            (
                TopicAcls::Forbidden {
                    side: Side::Target,
                    error: "denied".into(),
                },
                false,
                reason::TOPIC_ACLS_FORBIDDEN,
            ),
        ];
        for (acls, ok, why) in cases {
            let v = topic_acls_synced(&acls, "10s");
            assert_eq!((v.ok, v.reason), (ok, why), "{acls:?}");
            if !ok {
                assert!(
                    v.message.contains("spec.sourceLoop.syncTopicAcls"),
                    "{}",
                    v.message
                );
            }
        }
    }
}
