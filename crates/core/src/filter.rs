//! Topic and group include/exclude lists, with MM2's defaults and full-match semantics.
//!
//! MM2 joins each list with `|` and calls Java's `Matcher.matches()`, so every pattern must
//! match the whole name. Here each pattern is anchored as `^(?:p)$` and compiled on its own,
//! which gives the same answers and lets an error name the pattern and its list.

use regex::{Regex, RegexSet, RegexSetBuilder};
use thiserror::Error;

use super::policy::ReplicationPolicy;

pub const DEFAULT_TOPICS: &[&str] = &[".*"];
pub const DEFAULT_TOPICS_EXCLUDE: &[&str] = &[r".*[\-\.]internal", r".*\.replica", "__.*"];
pub const DEFAULT_GROUPS: &[&str] = &[".*"];
pub const DEFAULT_GROUPS_EXCLUDE: &[&str] = &["console-consumer-.*", "connect-.*", "__.*"];

/// Bounds the compiled size of one user pattern, so a hostile config cannot exhaust memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Bounds one whole list as it is kept (one set of all its patterns). Lists are compiled in
/// the shared operator on every reconcile; a set of 256 patterns of 1 MiB each would be
/// 256 MiB per list. Each pattern is first compiled alone (and dropped) within
/// [`REGEX_SIZE_LIMIT`], so an error can name it.
/// Four lists make a flow's filters: at most 8 MiB. A Unicode class such as `\w` compiles to
/// about 60 KiB, so some thirty of them fit in one list; MirrorMaker 2 (Java) reads `\w` as
/// `[a-zA-Z0-9_]` anyway, which costs almost nothing.
const LIST_SIZE_LIMIT: usize = 2 << 20;

/// A filter pattern could not be compiled.
#[derive(Debug, Clone, Error)]
#[error("invalid regex {pattern:?} in `{field}`: {source}")]
pub struct FilterError {
    /// The configuration field holding the pattern, e.g. `topics.exclude`.
    pub field: String,
    pub pattern: String,
    #[source]
    pub source: regex::Error,
}

/// A name is allowed when it fully matches some include pattern and no exclude pattern.
///
/// An empty include list allows nothing and an empty exclude list excludes nothing, as MM2
/// (whose joined empty pattern matches only the empty name).
#[derive(Debug, Clone)]
pub struct NameFilter {
    include: RegexSet,
    exclude: RegexSet,
}

impl NameFilter {
    /// `include_field`/`exclude_field` are the config field names used in error messages.
    pub fn new<S: AsRef<str>>(
        include_field: &str,
        include: &[S],
        exclude_field: &str,
        exclude: &[S],
    ) -> Result<Self, FilterError> {
        Ok(Self {
            include: compile(include_field, include)?,
            exclude: compile(exclude_field, exclude)?,
        })
    }

    pub fn matches(&self, name: &str) -> bool {
        self.include.is_match(name) && !self.exclude.is_match(name)
    }
}

fn anchored(pattern: &str) -> String {
    format!("^(?:{pattern})$")
}

fn compile<S: AsRef<str>>(field: &str, patterns: &[S]) -> Result<RegexSet, FilterError> {
    let error = |pattern: &str, source| FilterError {
        field: field.to_owned(),
        pattern: pattern.to_owned(),
        source,
    };
    for pattern in patterns {
        let pattern = pattern.as_ref();
        regex::RegexBuilder::new(&anchored(pattern))
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map(|_: Regex| ())
            .map_err(|e| error(pattern, e))?;
    }
    RegexSetBuilder::new(patterns.iter().map(|p| anchored(p.as_ref())))
        .size_limit(LIST_SIZE_LIMIT)
        .dfa_size_limit(LIST_SIZE_LIMIT)
        .build()
        .map_err(|e| {
            error(
                &format!(
                    "the {} patterns together (too large compiled: use fewer patterns, or ASCII classes such as [a-zA-Z0-9_] for \\w, which is what MirrorMaker 2 means by it)",
                    patterns.len()
                ),
                e,
            )
        })
}

/// Splits an MM2-style comma separated list (`a, b ,c`) into trimmed, non-empty entries.
pub fn parse_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The topic and group filters of one replication flow.
#[derive(Debug, Clone)]
pub struct Filters {
    pub topics: NameFilter,
    pub groups: NameFilter,
}

impl Filters {
    pub fn new<S: AsRef<str>>(
        topics: &[S],
        topics_exclude: &[S],
        groups: &[S],
        groups_exclude: &[S],
    ) -> Result<Self, FilterError> {
        Ok(Self {
            topics: NameFilter::new("topics", topics, "topics.exclude", topics_exclude)?,
            groups: NameFilter::new("groups", groups, "groups.exclude", groups_exclude)?,
        })
    }

    /// MM2's defaults for all four lists.
    pub fn mm2_defaults() -> Self {
        Self::new(
            DEFAULT_TOPICS,
            DEFAULT_TOPICS_EXCLUDE,
            DEFAULT_GROUPS,
            DEFAULT_GROUPS_EXCLUDE,
        )
        .unwrap_or_else(|e| unreachable!("MM2 default patterns are valid: {e}"))
    }

    /// The topic lists alone; see [`Self::topic_decision`] for the full replication rule.
    pub fn topic_allowed(&self, topic: &str) -> bool {
        self.topics.matches(topic)
    }

    pub fn group_allowed(&self, group: &str) -> bool {
        self.groups.matches(group)
    }

    /// See [`topic_decision`].
    pub fn topic_decision(
        &self,
        policy: &dyn ReplicationPolicy,
        topic: &str,
        source_alias: &str,
        target_alias: &str,
    ) -> TopicDecision {
        topic_decision(policy, &self.topics, topic, source_alias, target_alias)
    }
}

/// MM2's `shouldReplicateTopic`: (the topic lists allow it or it is a heartbeats topic) and it
/// is not internal and replicating it to `target_alias` would not close a cycle. One rule more
/// than MM2: a heartbeats topic that already went through the source cluster (`<source
/// alias>.heartbeats` found on the source) can only be a copy of a copy, made by a flow whose
/// target is its own source; copying it again would add one prefix per round, forever.
pub fn topic_decision(
    policy: &dyn ReplicationPolicy,
    topics: &NameFilter,
    topic: &str,
    source_alias: &str,
    target_alias: &str,
) -> TopicDecision {
    if policy.is_internal_topic(topic) {
        TopicDecision::Skip(SkipReason::Internal)
    } else if policy.is_cycle(topic, target_alias) {
        TopicDecision::Skip(SkipReason::Cycle)
    } else if policy.is_heartbeats_topic(topic) {
        if policy.topic_source(topic).is_some() && policy.is_cycle(topic, source_alias) {
            TopicDecision::Skip(SkipReason::Cycle)
        } else {
            TopicDecision::Replicate
        }
    } else if topics.matches(topic) {
        TopicDecision::Replicate
    } else {
        TopicDecision::Skip(SkipReason::Filtered)
    }
}

/// Whether a source topic is replicated, and if not, why (for status and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicDecision {
    Replicate,
    Skip(SkipReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// Kafka, Connect or MM2 internal topic.
    Internal,
    /// The topic already went through the target cluster.
    Cycle,
    /// Not included, or excluded, by the topic lists.
    Filtered,
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_list_of_patterns_shares_one_bounded_budget() {
        use std::time::Instant;
        // The audit's list: 256 patterns each just under the old per-pattern limit.
        let heavy: Vec<String> = (0..256).map(|_| r"\w{2000}".to_string()).collect();
        let started = Instant::now();
        let refused = NameFilter::new("topics", &heavy, "topics.exclude", &[] as &[String]);
        assert!(
            refused.is_err(),
            "a 256-pattern list of heavy patterns compiles"
        );
        assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
        // Ordinary lists of the same length still compile: names, prefixes, classes.
        let mut ordinary: Vec<String> = (0..232)
            .map(|i| format!(r"team-{i}-[a-zA-Z0-9_]+\.events"))
            .collect();
        ordinary.extend((0..24).map(|i| format!(r"orders-\w+-{i}")));
        assert!(NameFilter::new("topics", &ordinary, "topics.exclude", &ordinary).is_ok());
        let unicode: Vec<String> = (0..256).map(|i| format!(r"orders-\w+-{i}")).collect();
        let e = NameFilter::new("topics", &unicode, "topics.exclude", &[] as &[String])
            .expect_err("256 Unicode classes exceed the list's budget");
        assert!(e.to_string().contains("[a-zA-Z0-9_]"), "{e}");
        // One heavy pattern alone keeps the per-pattern limit.
        let one = [r"\w{3000}".to_string()];
        assert!(NameFilter::new("topics", &one, "topics.exclude", &[] as &[String]).is_err());
        let fits = [r"\w{20}".to_string()];
        assert!(NameFilter::new("topics", &fits, "topics.exclude", &[] as &[String]).is_ok());
    }

    use super::*;
    use crate::policy::PrefixPolicy;

    #[test]
    fn mm2_defaults_exclude_internal_replica_and_double_underscore_topics() {
        let f = Filters::mm2_defaults();
        assert!(f.topic_allowed("orders"));
        assert!(f.topic_allowed("A.orders"));
        for t in [
            "x.internal",
            "x-internal",
            "orders.replica",
            "__consumer_offsets",
        ] {
            assert!(!f.topic_allowed(t), "{t}");
        }
        assert!(f.group_allowed("payments"));
        for g in ["console-consumer-123", "connect-mirror", "__internal"] {
            assert!(!f.group_allowed(g), "{g}");
        }
    }

    #[test]
    fn patterns_must_match_the_whole_name() {
        let f = NameFilter::new("topics", &["ord"], "topics.exclude", &[]).unwrap();
        assert!(f.matches("ord"));
        assert!(!f.matches("orders"));
        assert!(!f.matches("xord"));
        // Alternation inside one pattern is anchored as a whole.
        let alt = NameFilter::new("topics", &["a|b"], "topics.exclude", &[]).unwrap();
        assert!(alt.matches("a") && alt.matches("b") && !alt.matches("ab"));
    }

    #[test]
    fn empty_lists_allow_nothing_and_exclude_nothing() {
        let none: &[&str] = &[];
        let f = NameFilter::new("topics", none, "topics.exclude", none).unwrap();
        assert!(!f.matches("orders"));
        let all = NameFilter::new("topics", &[".*"], "topics.exclude", none).unwrap();
        assert!(all.matches("orders"));
    }

    #[test]
    fn invalid_pattern_error_names_pattern_and_field() {
        let err = Filters::new(&[".*"], &["ok", "(unclosed"], &[".*"], &[]).unwrap_err();
        assert_eq!(err.field, "topics.exclude");
        assert_eq!(err.pattern, "(unclosed");
        assert!(err.to_string().contains("topics.exclude"));
        // Java-only syntax (look-around) is refused rather than silently misread.
        let err = Filters::new(&[".*"], &[], &["(?!x).*"], &[]).unwrap_err();
        assert_eq!(err.field, "groups");
    }

    #[test]
    fn parse_list_trims_like_mm2_config_lists() {
        assert_eq!(parse_list(" a, b ,,c "), vec!["a", "b", "c"]);
    }

    #[test]
    fn heartbeats_bypass_filters_but_not_cycles() {
        let p = PrefixPolicy::default();
        let f = Filters::new(&["orders"], &[], &[".*"], &[]).unwrap();
        let decide = |topic| f.topic_decision(&p, topic, "A", "B");
        assert_eq!(decide("orders"), TopicDecision::Replicate);
        assert_eq!(decide("heartbeats"), TopicDecision::Replicate);
        assert_eq!(decide("C.heartbeats"), TopicDecision::Replicate);
        assert_eq!(
            decide("B.heartbeats"),
            TopicDecision::Skip(SkipReason::Cycle)
        );
        assert_eq!(
            decide("payments"),
            TopicDecision::Skip(SkipReason::Filtered)
        );
        assert_eq!(
            decide("A.checkpoints.internal"),
            TopicDecision::Skip(SkipReason::Internal)
        );
        assert_eq!(decide("B.orders"), TopicDecision::Skip(SkipReason::Cycle));
    }

    #[test]
    fn heartbeats_copied_back_onto_their_source_are_never_copied_again() {
        // A flow A -> B whose "B" is cluster A itself made `A.heartbeats` on A; with the
        // plain MM2 rule it would be copied to `A.A.heartbeats`, then `A.A.A.heartbeats`...
        let p = PrefixPolicy::default();
        let all = Filters::new(&[".*"], &[], &[".*"], &[]).unwrap();
        for topic in ["A.heartbeats", "A.A.heartbeats", "C.A.heartbeats"] {
            assert_eq!(
                all.topic_decision(&p, topic, "A", "B"),
                TopicDecision::Skip(SkipReason::Cycle),
                "{topic}"
            );
        }
        // Heartbeats from a cluster further upstream still travel on, as in MM2.
        assert_eq!(
            all.topic_decision(&p, "C.heartbeats", "A", "B"),
            TopicDecision::Replicate
        );
        assert_eq!(
            all.topic_decision(&p, "heartbeats", "A", "B"),
            TopicDecision::Replicate
        );
    }
}
