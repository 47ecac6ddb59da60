//! How topics are named across clusters, following MM2's `ReplicationPolicy` contract.
//!
//! Two policies: [`PrefixPolicy`] (MM2's `DefaultReplicationPolicy`: `<source><sep><topic>`) and
//! [`IdentityPolicy`] (names kept; only heartbeats are prefixed, so cycles are invisible).

use thiserror::Error;

/// The name MM2 gives the heartbeats topic unless configured otherwise.
pub const DEFAULT_HEARTBEATS_TOPIC: &str = "heartbeats";
/// MM2's default remote topic separator.
pub const DEFAULT_SEPARATOR: &str = ".";

/// The policy configuration cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    #[error("replication policy separator must not be empty")]
    EmptySeparator,
    #[error("heartbeats topic name must not be empty")]
    EmptyHeartbeatsTopic,
}

/// Naming rules shared by the replicator (renaming, cycle checks) and the operator (status).
///
/// Methods mirror MM2's `ReplicationPolicy`; `None` stands for Java's `null` ("not remote").
pub trait ReplicationPolicy: std::fmt::Debug + Send + Sync {
    /// Name on the target of `topic` replicated from `source_alias`.
    fn format_remote_topic(&self, source_alias: &str, topic: &str) -> String;

    /// Cluster alias `topic` was replicated from, or `None` if it is not a remote topic.
    fn topic_source<'a>(&'a self, topic: &'a str) -> Option<&'a str>;

    /// Name of `topic` one hop upstream, or `None` if it is not a remote topic.
    fn upstream_topic<'a>(&'a self, topic: &'a str) -> Option<&'a str>;

    /// Name of the heartbeats topic, which is never renamed by the separator.
    fn heartbeats_topic(&self) -> &str;

    /// `<alias>.checkpoints.internal`: on the target, holds `alias`'s groups' checkpoints.
    fn checkpoints_topic(&self, cluster_alias: &str) -> String;

    /// `mm2-offset-syncs.<alias>.internal`.
    fn offset_syncs_topic(&self, cluster_alias: &str) -> String;

    /// The topic MM2 itself writes and that must never be replicated.
    fn is_mm2_internal_topic(&self, topic: &str) -> bool;

    fn is_checkpoints_topic(&self, topic: &str) -> bool;

    /// Topic at the end of a chain of hops (the topic itself when it is not remote).
    fn original_topic<'a>(&'a self, mut topic: &'a str) -> &'a str {
        // Iterative form of MM2's recursion; stops when a policy maps a name onto itself.
        while let Some(upstream) = self.upstream_topic(topic) {
            if upstream == topic {
                break;
            }
            topic = upstream;
        }
        topic
    }

    /// Never replicated: Kafka internals (`__*`, `.*`), Connect/MM2 internals (`*.internal`,
    /// `*-internal`, and the separator-aware MM2 internal suffix).
    fn is_internal_topic(&self, topic: &str) -> bool {
        topic.starts_with("__")
            || topic.starts_with('.')
            || topic.ends_with(".internal")
            || topic.ends_with("-internal")
            || self.is_mm2_internal_topic(topic)
    }

    /// `heartbeats`, `A.heartbeats`, `B.A.heartbeats`...: always replicated, whatever the filters.
    fn is_heartbeats_topic(&self, topic: &str) -> bool {
        self.original_topic(topic) == self.heartbeats_topic()
    }

    /// True when replicating `topic` to `target_alias` would bring it back to a cluster it
    /// already went through, at any hop. MM2's `MirrorSourceConnector.isCycle`.
    fn is_cycle<'a>(&'a self, mut topic: &'a str, target_alias: &str) -> bool {
        while let Some(source) = self.topic_source(topic) {
            if source == target_alias {
                return true;
            }
            match self.upstream_topic(topic) {
                Some(upstream) if upstream != topic => topic = upstream,
                _ => return false,
            }
        }
        false
    }
}

/// MM2's `DefaultReplicationPolicy`: remote topics are `<source alias><separator><topic>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixPolicy {
    separator: String,
    /// MM2's `replication.policy.internal.topic.separator.enabled` (default true): whether
    /// internal topic names (checkpoints, offset syncs) use the custom separator or `.`.
    separator_in_internal_topics: bool,
    heartbeats_topic: String,
}

impl Default for PrefixPolicy {
    fn default() -> Self {
        Self {
            separator: DEFAULT_SEPARATOR.to_owned(),
            separator_in_internal_topics: true,
            heartbeats_topic: DEFAULT_HEARTBEATS_TOPIC.to_owned(),
        }
    }
}

impl PrefixPolicy {
    pub fn new(separator: impl Into<String>) -> Result<Self, PolicyError> {
        let separator = separator.into();
        if separator.is_empty() {
            return Err(PolicyError::EmptySeparator);
        }
        Ok(Self {
            separator,
            ..Self::default()
        })
    }

    /// With `false`, internal topics keep `.` even under a custom separator (MM2 option).
    pub fn with_separator_in_internal_topics(mut self, enabled: bool) -> Self {
        self.separator_in_internal_topics = enabled;
        self
    }

    pub fn with_heartbeats_topic(mut self, name: impl Into<String>) -> Result<Self, PolicyError> {
        let name = name.into();
        if name.is_empty() {
            return Err(PolicyError::EmptyHeartbeatsTopic);
        }
        self.heartbeats_topic = name;
        Ok(self)
    }

    pub fn separator(&self) -> &str {
        &self.separator
    }

    fn internal_separator(&self) -> &str {
        if self.separator_in_internal_topics {
            &self.separator
        } else {
            DEFAULT_SEPARATOR
        }
    }

    fn internal_suffix(&self) -> String {
        format!("{}internal", self.internal_separator())
    }

    fn checkpoints_suffix(&self) -> String {
        let sep = self.internal_separator();
        format!("{sep}checkpoints{sep}internal")
    }

    /// Splits like Java's `String.split(quote(sep))`: a topic is remote only if some part after
    /// the first separator is non-empty (Java drops trailing empty parts), so `a.` and `a..`
    /// are not remote but `.a` is, with source `""`.
    fn split_remote<'a>(&self, topic: &'a str) -> Option<(&'a str, &'a str)> {
        let (source, rest) = topic.split_once(self.separator.as_str())?;
        rest.split(self.separator.as_str())
            .any(|part| !part.is_empty())
            .then_some((source, rest))
    }
}

impl ReplicationPolicy for PrefixPolicy {
    fn format_remote_topic(&self, source_alias: &str, topic: &str) -> String {
        format!("{source_alias}{}{topic}", self.separator)
    }

    fn topic_source<'a>(&'a self, topic: &'a str) -> Option<&'a str> {
        self.split_remote(topic).map(|(source, _)| source)
    }

    fn upstream_topic<'a>(&'a self, topic: &'a str) -> Option<&'a str> {
        self.split_remote(topic).map(|(_, rest)| rest)
    }

    fn heartbeats_topic(&self) -> &str {
        &self.heartbeats_topic
    }

    fn checkpoints_topic(&self, cluster_alias: &str) -> String {
        format!("{cluster_alias}{}", self.checkpoints_suffix())
    }

    fn offset_syncs_topic(&self, cluster_alias: &str) -> String {
        format!(
            "mm2-offset-syncs{}{cluster_alias}{}",
            self.internal_separator(),
            self.internal_suffix()
        )
    }

    fn is_mm2_internal_topic(&self, topic: &str) -> bool {
        topic.ends_with(&self.internal_suffix())
    }

    fn is_checkpoints_topic(&self, topic: &str) -> bool {
        topic.ends_with(&self.checkpoints_suffix())
    }
}

/// MM2's `IdentityReplicationPolicy`: topics keep their names on the target.
///
/// Topics whose name ends with the heartbeats topic name are still prefixed (MM2 uses
/// `endsWith`, so `myheartbeats` counts too), which is the only way cycles become visible.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentityPolicy {
    prefix: PrefixPolicy,
    /// MM2's `source.cluster.alias`: what `topic_source` answers for ordinary topics.
    source_alias: Option<String>,
}

impl IdentityPolicy {
    pub fn new(prefix_for_heartbeats: PrefixPolicy, source_alias: Option<String>) -> Self {
        Self {
            prefix: prefix_for_heartbeats,
            source_alias,
        }
    }

    fn looks_like_heartbeats(&self, topic: &str) -> bool {
        topic.ends_with(self.prefix.heartbeats_topic())
    }
}

impl ReplicationPolicy for IdentityPolicy {
    fn format_remote_topic(&self, source_alias: &str, topic: &str) -> String {
        if self.looks_like_heartbeats(topic) {
            self.prefix.format_remote_topic(source_alias, topic)
        } else {
            topic.to_owned()
        }
    }

    fn topic_source<'a>(&'a self, topic: &'a str) -> Option<&'a str> {
        if self.looks_like_heartbeats(topic) {
            self.prefix.topic_source(topic)
        } else {
            self.source_alias.as_deref()
        }
    }

    fn upstream_topic<'a>(&'a self, topic: &'a str) -> Option<&'a str> {
        if self.looks_like_heartbeats(topic) {
            self.prefix.upstream_topic(topic)
        } else {
            Some(topic)
        }
    }

    fn heartbeats_topic(&self) -> &str {
        self.prefix.heartbeats_topic()
    }

    fn checkpoints_topic(&self, cluster_alias: &str) -> String {
        self.prefix.checkpoints_topic(cluster_alias)
    }

    fn offset_syncs_topic(&self, cluster_alias: &str) -> String {
        self.prefix.offset_syncs_topic(cluster_alias)
    }

    fn is_mm2_internal_topic(&self, topic: &str) -> bool {
        self.prefix.is_mm2_internal_topic(topic)
    }

    fn is_checkpoints_topic(&self, topic: &str) -> bool {
        self.prefix.is_checkpoints_topic(topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_policy_names_like_mm2() {
        let p = PrefixPolicy::default();
        assert_eq!(p.format_remote_topic("primary", "t"), "primary.t");
        assert_eq!(p.topic_source("primary.t"), Some("primary"));
        assert_eq!(p.upstream_topic("B.A.t"), Some("A.t"));
        assert_eq!(p.original_topic("B.A.t"), "t");
        assert_eq!(p.topic_source("t"), None);
        assert_eq!(p.checkpoints_topic("A"), "A.checkpoints.internal");
        assert_eq!(p.offset_syncs_topic("B"), "mm2-offset-syncs.B.internal");
        assert_eq!(p.heartbeats_topic(), "heartbeats");
        assert!(p.is_checkpoints_topic("A.checkpoints.internal"));
    }

    #[test]
    fn topic_source_follows_java_split_semantics() {
        let p = PrefixPolicy::default();
        assert_eq!(
            p.topic_source("a."),
            None,
            "trailing empty parts are dropped"
        );
        assert_eq!(p.topic_source("a.."), None);
        assert_eq!(p.topic_source(".a"), Some(""));
        assert_eq!(p.topic_source("a..b"), Some("a"));
        assert_eq!(p.upstream_topic("a..b"), Some(".b"));
        assert_eq!(p.topic_source(""), None);
        assert_eq!(p.topic_source("..."), None);
    }

    #[test]
    fn custom_separator_applies_to_internal_topics_unless_disabled() {
        let p = PrefixPolicy::new("_").unwrap();
        assert_eq!(p.format_remote_topic("A", "t"), "A_t");
        assert_eq!(p.checkpoints_topic("A"), "A_checkpoints_internal");
        assert_eq!(p.offset_syncs_topic("B"), "mm2-offset-syncs_B_internal");
        assert!(p.is_internal_topic("mm2-offset-syncs_B_internal"));
        // Heartbeats keep their name; the remote form uses the separator.
        assert_eq!(p.heartbeats_topic(), "heartbeats");
        assert!(p.is_heartbeats_topic("B_A_heartbeats"));
        assert!(!p.is_heartbeats_topic("A.heartbeats"));
        let dotted = p.with_separator_in_internal_topics(false);
        assert_eq!(dotted.checkpoints_topic("A"), "A.checkpoints.internal");
        assert_eq!(
            dotted.offset_syncs_topic("B"),
            "mm2-offset-syncs.B.internal"
        );
        assert_eq!(PrefixPolicy::new(""), Err(PolicyError::EmptySeparator));
    }

    #[test]
    fn internal_topics_are_recognised() {
        let p = PrefixPolicy::default();
        for t in [
            "__consumer_offsets",
            ".hidden",
            "x.internal",
            "connect-internal",
            "A.checkpoints.internal",
        ] {
            assert!(p.is_internal_topic(t), "{t}");
        }
        for t in [
            "orders",
            "A.orders",
            "internal",
            "heartbeats",
            "A.heartbeats",
        ] {
            assert!(!p.is_internal_topic(t), "{t}");
        }
    }

    #[test]
    fn cycles_are_detected_at_any_hop() {
        let p = PrefixPolicy::default();
        assert!(p.is_cycle("target.topic1", "target"));
        assert!(p.is_cycle("source.target.topic1", "target"));
        assert!(!p.is_cycle("source.topic1", "target"));
        assert!(!p.is_cycle("topic1", "target"));
        assert!(p.is_cycle("target.heartbeats", "target"));
    }

    #[test]
    fn identity_policy_keeps_names_and_prefixes_only_heartbeats() {
        let p = IdentityPolicy::default();
        assert_eq!(p.format_remote_topic("A", "orders"), "orders");
        assert_eq!(p.format_remote_topic("A", "heartbeats"), "A.heartbeats");
        assert_eq!(p.topic_source("orders"), None);
        assert_eq!(p.upstream_topic("orders"), Some("orders"));
        assert_eq!(p.original_topic("orders"), "orders");
        assert!(p.is_heartbeats_topic("B.A.heartbeats"));
        // A cycle is only visible through heartbeats.
        assert!(!p.is_cycle("orders", "A"));
        assert!(p.is_cycle("A.heartbeats", "A"));
        let with_alias = IdentityPolicy::new(PrefixPolicy::default(), Some("A".into()));
        assert_eq!(with_alias.topic_source("orders"), Some("A"));
        assert!(with_alias.is_cycle("orders", "A"));
        assert!(!with_alias.is_cycle("orders", "B"));
    }
}
