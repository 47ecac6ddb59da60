//! Topic ACL sync, MirrorMaker 2's way (pure): which target bindings the source's topic ACLs
//! call for, and which of them the target lacks. The source loop creates what is missing
//! ([`super::admin::Admin::create_acls`]); the status probe compares the same sets.
//!
//! Like MM2's `MirrorSourceConnector`: only ALLOW bindings on literal topic names are read;
//! a binding is copied when its topic is replicated; WRITE is never copied (only the flow
//! writes remote topics) and ALL becomes READ (so a principal the source trusts with
//! everything may read the copy, not alter or delete it). Unlike MM2, the literal wildcard `*`
//! (every topic) is not copied: it names no topic, so it has no remote topic.
//! Nothing is ever removed from the target: bindings there may be the target's own.

use std::collections::BTreeSet;

pub use mirrorflow_rdkafka_ext::acls::{
    AclBinding, AclError, AclFilter, Operation, PatternType, Permission, ResourceType,
};

/// The wildcard resource name: every topic.
const WILDCARD: &str = "*";

/// The bindings sync reads on either cluster: ALLOW on literal topic names, any operation
/// and principal (MM2's filter).
pub fn topic_allow_filter() -> AclFilter {
    AclFilter {
        resource_type: ResourceType::Topic,
        name: None,
        pattern: PatternType::Literal,
        principal: None,
        host: None,
        operation: Operation::Any,
        permission: Permission::Allow,
    }
}

/// The target bindings for `source`'s: `remote_of` names a source topic's remote topic, or
/// `None` when the flow does not replicate it.
pub fn remote_bindings(
    source: &[AclBinding],
    remote_of: impl Fn(&str) -> Option<String>,
) -> BTreeSet<AclBinding> {
    source
        .iter()
        .filter(|b| {
            b.resource_type == ResourceType::Topic
                && b.pattern == PatternType::Literal
                && b.permission == Permission::Allow
                && b.name != WILDCARD
        })
        .filter_map(|b| {
            let operation = match b.operation {
                Operation::Write => return None,
                Operation::All => Operation::Read,
                // An operation this build does not know cannot be created faithfully.
                Operation::Unknown | Operation::Any => return None,
                other => other,
            };
            Some(AclBinding {
                name: remote_of(&b.name)?,
                operation,
                ..b.clone()
            })
        })
        .collect()
}

/// Of the cluster-resource operations sync needs (`needed`), those `granted` lacks; none when
/// the brokers did not say (`None`). DescribeAcls itself cannot tell: librdkafka 2.12 drops
/// its CLUSTER_AUTHORIZATION_FAILED (and SECURITY_DISABLED) and answers "no bindings".
pub fn lacking(granted: Option<&[Operation]>, needed: &[Operation]) -> Vec<Operation> {
    match granted {
        None => Vec::new(),
        Some(granted) => needed
            .iter()
            .filter(|o| !granted.contains(o) && !granted.contains(&Operation::All))
            .copied()
            .collect(),
    }
}

/// What sync needs on the source's cluster resource: DESCRIBE, to read ACLs.
pub const SOURCE_NEEDS: &[Operation] = &[Operation::Describe];
/// What sync needs on the target's: DESCRIBE to read ACLs, ALTER to create them.
pub const TARGET_NEEDS: &[Operation] = &[Operation::Describe, Operation::Alter];

/// What of `desired` the target's bindings (`target`) lack, in a stable order.
pub fn missing(desired: &BTreeSet<AclBinding>, target: &[AclBinding]) -> Vec<AclBinding> {
    let present: BTreeSet<&AclBinding> = target.iter().collect();
    desired
        .iter()
        .filter(|b| !present.contains(b))
        .cloned()
        .collect()
}

/// A binding on the literal topic name `topic` for `principal` from any host.
pub fn topic_binding(
    topic: &str,
    principal: &str,
    operation: Operation,
    permission: Permission,
) -> AclBinding {
    AclBinding {
        resource_type: ResourceType::Topic,
        name: topic.into(),
        pattern: PatternType::Literal,
        principal: principal.into(),
        host: "*".into(),
        operation,
        permission,
    }
}

/// `principal` may do `operation` on `topic` from `*`.
#[cfg(test)]
fn allow(topic: &str, principal: &str, operation: Operation) -> AclBinding {
    topic_binding(topic, principal, operation, Permission::Allow)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prefix policy over a flow replicating `orders` and `payments` only.
    fn remote_of(topic: &str) -> Option<String> {
        ["orders", "payments"]
            .contains(&topic)
            .then(|| format!("src.{topic}"))
    }

    #[test]
    fn read_and_describe_are_copied_to_the_remote_topic() {
        let source = [
            allow("orders", "User:alice", Operation::Read),
            allow("orders", "User:alice", Operation::Describe),
        ];
        let got: Vec<AclBinding> = remote_bindings(&source, remote_of).into_iter().collect();
        assert_eq!(
            got,
            [
                allow("src.orders", "User:alice", Operation::Read),
                allow("src.orders", "User:alice", Operation::Describe),
            ]
        );
    }

    #[test]
    fn write_is_never_copied_and_all_becomes_read() {
        let source = [
            allow("orders", "User:producer", Operation::Write),
            allow("payments", "User:admin", Operation::All),
        ];
        let got: Vec<AclBinding> = remote_bindings(&source, remote_of).into_iter().collect();
        assert_eq!(got, [allow("src.payments", "User:admin", Operation::Read)]);
    }

    #[test]
    fn other_operations_keep_their_principal_and_host() {
        let mut b = allow("orders", "User:ops", Operation::DescribeConfigs);
        b.host = "10.0.0.7".into();
        let got: Vec<AclBinding> = remote_bindings(&[b], remote_of).into_iter().collect();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].name, "src.orders");
        assert_eq!(got[0].host, "10.0.0.7");
        assert_eq!(got[0].principal, "User:ops");
        assert_eq!(got[0].operation, Operation::DescribeConfigs);
    }

    #[test]
    fn topics_the_flow_does_not_replicate_are_left_out() {
        let source = [
            allow("internal", "User:alice", Operation::Read),
            allow("*", "User:alice", Operation::Read),
        ];
        assert!(remote_bindings(&source, remote_of).is_empty());
    }

    #[test]
    fn deny_prefixed_and_non_topic_bindings_are_left_out() {
        let mut deny = allow("orders", "User:alice", Operation::Read);
        deny.permission = Permission::Deny;
        let mut prefixed = allow("orders", "User:alice", Operation::Read);
        prefixed.pattern = PatternType::Prefixed;
        let mut group = allow("orders", "User:alice", Operation::Read);
        group.resource_type = ResourceType::Group;
        assert!(remote_bindings(&[deny, prefixed, group], remote_of).is_empty());
    }

    #[test]
    fn all_and_read_for_one_principal_make_one_binding() {
        let source = [
            allow("orders", "User:alice", Operation::All),
            allow("orders", "User:alice", Operation::Read),
        ];
        assert_eq!(remote_bindings(&source, remote_of).len(), 1);
    }

    #[test]
    fn lacking_names_the_cluster_operations_not_granted() {
        use Operation::*;
        assert_eq!(lacking(Some(&[]), TARGET_NEEDS), [Describe, Alter]);
        assert_eq!(lacking(Some(&[Describe, Create]), TARGET_NEEDS), [Alter]);
        assert!(lacking(Some(&[Describe]), SOURCE_NEEDS).is_empty());
        assert!(lacking(Some(&[All]), TARGET_NEEDS).is_empty());
        assert!(lacking(None, TARGET_NEEDS).is_empty());
    }

    #[test]
    fn only_bindings_the_target_lacks_are_missing() {
        let desired = remote_bindings(
            &[
                allow("orders", "User:alice", Operation::Read),
                allow("payments", "User:bob", Operation::Read),
            ],
            remote_of,
        );
        let target = [
            allow("src.orders", "User:alice", Operation::Read),
            // The target's own binding: not desired, and never removed.
            allow("src.orders", "User:carol", Operation::Read),
        ];
        assert_eq!(
            missing(&desired, &target),
            [allow("src.payments", "User:bob", Operation::Read)]
        );
        let all: Vec<AclBinding> = desired.iter().cloned().collect();
        assert!(missing(&desired, &all).is_empty());
    }
}
