//! The topic changes a cluster refused the replicator's discovery (a remote topic not created,
//! partitions not added, configs not synced, a source topic's configs not readable), kept in
//! the positions topic so the operator's probe reports them in `.status` and an Event however
//! many replicas run or restarted since: the replicator's log alone reaches nobody.
//!
//! One record per remote topic, so compaction keeps the newest word on each:
//! - key: `0xFF 0xFF` (never a position key: older readers skip it as undecodable), then
//!   `refused:` and the remote topic's name in UTF-8;
//! - value: `version: u8 = 3`, `detected: i64` (ms since the epoch, when first refused), then
//!   the message (UTF-8, at most [`MAX_MESSAGE`] bytes): what was refused and the fix.
//!   A tombstone: the topic's changes went through (or it left the flow).

use std::collections::BTreeMap;

use super::admin::{AdminError, TopicChange};
use rdkafka::types::RDKafkaErrorCode;

pub use mirrorflow_core::positions::REFUSAL_VERSION;
use mirrorflow_core::positions::{decode_refusal_value, encode_refusal_value};
const KEY_PREFIX: &[u8] = b"\xff\xffrefused:";
/// Bounds what one record adds to a status: a message is a sentence or two.
pub const MAX_MESSAGE: usize = 1024;
/// Bounds what a positions topic's refusals cost a reader (the operator reads every flow's):
/// the first topics by name; the status names a few anyway.
pub const MAX_RECORDED: usize = 64;

/// The words by which a refusal record says a partition stalled (not a topic change refused):
/// written by the source loop's stall watch, read by the status for its reason.
pub const STALLED_MARK: &str = " copies nothing: stalled ";

/// The words by which a refusal record says an internal topic a loop follows holds a batch the
/// replicator cannot read (not a topic change refused): written by the followers
/// ([`crate::replicator::reach::Reachability::hold`]), read by the status for its reason.
pub const UNREADABLE_MARK: &str = " holds a batch the replicator cannot read";

/// The words by which a status message says an internal topic is held by a transaction left
/// open at its end (the operator's probe finds it; `InternalTopicRefused` on `Replicating`).
pub const HELD_MARK: &str = " is held by an open transaction";

/// A remote topic the clusters would not keep in line with its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The remote topic (on the target).
    pub topic: String,
    /// When it was first refused, ms since the epoch.
    pub detected_ms: i64,
    pub message: String,
}

/// The refusals in force, by remote topic.
pub type Refusals = BTreeMap<String, Refusal>;

impl Refusal {
    /// The refusal a discovery round's error stands for, if it is about one remote topic
    /// (ACL sync has a condition of its own, `TopicAclsSynced`).
    pub fn of(error: &AdminError, now_ms: i64) -> Option<Refusal> {
        let (topic, message) = match error {
            AdminError::Refused {
                cluster,
                what,
                topic,
                code,
            } => (
                topic,
                format!(
                    "the {cluster} cluster refused {what} {topic} ({code}); {}",
                    fix(*code, *what)
                ),
            ),
            AdminError::Undescribed { remote, .. } => (remote, error.to_string()),
            AdminError::Kafka { .. } | AdminError::Acl { .. } => return None,
        };
        Some(Refusal {
            topic: topic.clone(),
            detected_ms: now_ms,
            message: truncated(message),
        })
    }

    pub fn encode(&self) -> (Vec<u8>, Vec<u8>) {
        (
            encode_key(&self.topic),
            encode_refusal_value(self.detected_ms, &self.message),
        )
    }
}

/// What the flow's owner can do about a refused request, by the broker's error code.
fn fix(code: RDKafkaErrorCode, what: TopicChange) -> &'static str {
    match code {
        RDKafkaErrorCode::InvalidReplicationFactor => {
            "set spec.sourceLoop.replicationFactor to at most the target's broker count (-1 takes the broker's default)"
        }
        RDKafkaErrorCode::TopicAuthorizationFailed
        | RDKafkaErrorCode::ClusterAuthorizationFailed
            if what == TopicChange::AlterConfigs =>
        {
            "grant the flow's target principal ALTER_CONFIGS on the remote topic, or set spec.sourceLoop.syncTopicConfigs: false"
        }
        RDKafkaErrorCode::TopicAuthorizationFailed
        | RDKafkaErrorCode::ClusterAuthorizationFailed => {
            "grant the flow's target principal CREATE and ALTER on the remote topic (or a prefix of the source alias), or create the remote topic yourself"
        }
        RDKafkaErrorCode::PolicyViolation => {
            "the target's topic policy refused it: create the remote topic yourself, or ask the cluster's operators"
        }
        RDKafkaErrorCode::InvalidConfig => {
            "the target refused a topic config copied from the source: set spec.sourceLoop.syncTopicConfigs: false, or set the config on the remote topic yourself"
        }
        _ => {
            "retried every spec.sourceLoop.topicsRefreshInterval; the replicator's log has the details"
        }
    }
}

pub fn truncated(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

pub fn is_refusal_key(key: &[u8]) -> bool {
    key.starts_with(KEY_PREFIX)
}

pub fn encode_key(topic: &str) -> Vec<u8> {
    [KEY_PREFIX, topic.as_bytes()].concat()
}

/// Folds a refusal record into `refusals`. False when the key is a refusal's but the value is
/// not one this version reads.
pub fn apply(refusals: &mut Refusals, key: &[u8], value: Option<&[u8]>) -> bool {
    let Some(topic) = key
        .strip_prefix(KEY_PREFIX)
        .and_then(|t| std::str::from_utf8(t).ok())
        // Not a topic Kafka could have: its name would only lengthen the status.
        .filter(|t| t.len() <= mirrorflow_core::positions::MAX_TOPIC_LEN)
    else {
        return false;
    };
    let Some(value) = value else {
        refusals.remove(topic);
        return true;
    };
    if refusals.len() >= MAX_RECORDED && !refusals.contains_key(topic) {
        // Read, and left out: a writer that keeps to the bound never gets here.
        return true;
    }
    match decode_refusal_value(value) {
        Some((detected_ms, message)) => {
            refusals.insert(
                topic.to_string(),
                Refusal {
                    topic: topic.to_string(),
                    detected_ms,
                    message: truncated(message.to_string()),
                },
            );
            true
        }
        None => false,
    }
}

/// The records that bring the topic from `written` (what this replicator last wrote or read
/// there) to `now` (this round's refusals): each new or changed refusal, keeping the time it
/// was first refused, and a tombstone for each that no longer holds. Updates `written`.
pub fn changes(written: &mut Refusals, now: Vec<Refusal>) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let mut current = Refusals::new();
    for mut r in now {
        match current.get_mut(&r.topic) {
            // Two refusals of one topic in a round (creation and configs): one record.
            Some(first) => {
                first.message = truncated(format!("{}; {}", first.message, r.message));
            }
            None => {
                if let Some(before) = written.get(&r.topic) {
                    r.detected_ms = before.detected_ms;
                }
                current.insert(r.topic.clone(), r);
            }
        }
    }
    while current.len() > MAX_RECORDED {
        current.pop_last();
    }
    let mut records = Vec::new();
    for topic in written.keys().filter(|t| !current.contains_key(*t)) {
        records.push((encode_key(topic), None));
    }
    for (topic, r) in &current {
        if written.get(topic) != Some(r) {
            let (key, value) = r.encode();
            records.push((key, Some(value)));
        }
    }
    *written = current;
    records
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::Side;

    fn refused(topic: &str, what: TopicChange, code: RDKafkaErrorCode) -> AdminError {
        AdminError::Refused {
            cluster: Side::Target,
            what,
            topic: topic.into(),
            code,
        }
    }

    fn folded(records: &[(Vec<u8>, Option<Vec<u8>>)], into: &mut Refusals) {
        for (k, v) in records {
            assert!(apply(into, k, v.as_deref()), "undecodable: {k:?}");
        }
    }

    #[test]
    fn a_refused_creation_round_trips_with_its_fix() {
        let error = refused(
            "A.orders",
            TopicChange::Create,
            RDKafkaErrorCode::InvalidReplicationFactor,
        );
        let r = Refusal::of(&error, 1_800_000_000_000).unwrap();
        assert_eq!(r.topic, "A.orders");
        assert!(
            r.message.contains("creating topic A.orders")
                && r.message.contains("spec.sourceLoop.replicationFactor"),
            "{}",
            r.message
        );
        let (key, value) = r.encode();
        assert!(is_refusal_key(&key) && !crate::kafka::writers::is_claim_key(&key));
        assert_eq!(crate::kafka::positions::decode_key(&key), None);
        assert_eq!(value[0], REFUSAL_VERSION);
        let mut read = Refusals::new();
        assert!(apply(&mut read, &key, Some(&value)));
        assert_eq!(read.get("A.orders"), Some(&r));
        assert!(apply(&mut read, &key, None), "a tombstone");
        assert!(read.is_empty());
    }

    #[test]
    fn only_errors_about_one_remote_topic_are_refusals() {
        let acl = AdminError::Kafka {
            cluster: Side::Target,
            what: "listing topics".into(),
            source: rdkafka::error::KafkaError::AdminOp(RDKafkaErrorCode::RequestTimedOut),
        };
        assert_eq!(Refusal::of(&acl, 0), None);
        let undescribed = AdminError::Undescribed {
            cluster: Side::Source,
            topic: "ledger".into(),
            remote: "A.ledger".into(),
        };
        let r = Refusal::of(&undescribed, 0).unwrap();
        assert_eq!(r.topic, "A.ledger");
        assert!(r.message.contains("DescribeConfigs"), "{}", r.message);
        let alter = refused(
            "A.orders",
            TopicChange::AlterConfigs,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        );
        assert!(
            Refusal::of(&alter, 0)
                .unwrap()
                .message
                .contains("syncTopicConfigs: false")
        );
    }

    #[test]
    fn rounds_write_only_what_changed_and_tombstone_what_was_fixed() {
        let create = |t: &str| {
            refused(
                t,
                TopicChange::Create,
                RDKafkaErrorCode::TopicAuthorizationFailed,
            )
        };
        let mut written = Refusals::new();
        let mut topic = Refusals::new();
        let first = changes(
            &mut written,
            vec![
                Refusal::of(&create("A.a"), 10).unwrap(),
                Refusal::of(&create("A.b"), 10).unwrap(),
            ],
        );
        assert_eq!(first.len(), 2);
        folded(&first, &mut topic);
        // The same refusals again: nothing to write, the first time kept.
        let again = changes(
            &mut written,
            vec![
                Refusal::of(&create("A.a"), 20).unwrap(),
                Refusal::of(&create("A.b"), 20).unwrap(),
            ],
        );
        assert!(again.is_empty(), "{again:?}");
        // A.a created at last: its tombstone; A.b refused for another reason: rewritten.
        let other = refused(
            "A.b",
            TopicChange::Create,
            RDKafkaErrorCode::PolicyViolation,
        );
        let third = changes(&mut written, vec![Refusal::of(&other, 30).unwrap()]);
        assert_eq!(third.len(), 2);
        folded(&third, &mut topic);
        assert_eq!(topic.len(), 1);
        assert_eq!(topic["A.b"].detected_ms, 10, "first refused at 10");
        assert!(topic["A.b"].message.contains("policy"));
        assert_eq!(topic, written, "what the topic holds is what was written");
    }

    #[test]
    fn a_round_records_and_a_reader_keeps_at_most_the_bound() {
        let many: Vec<Refusal> = (0..MAX_RECORDED + 10)
            .map(|i| Refusal {
                topic: format!("A.t{i:03}"),
                detected_ms: 1,
                message: "refused".into(),
            })
            .collect();
        let mut written = Refusals::new();
        let records = changes(&mut written, many.clone());
        assert_eq!((records.len(), written.len()), (MAX_RECORDED, MAX_RECORDED));
        assert!(written.contains_key("A.t000") && !written.contains_key("A.t073"));
        // A writer past the bound: the reader keeps the bound.
        let mut read = Refusals::new();
        for r in &many {
            let (k, v) = r.encode();
            assert!(apply(&mut read, &k, Some(&v)));
        }
        assert_eq!(read.len(), MAX_RECORDED);
    }

    #[test]
    fn garbage_is_refused_and_messages_are_bounded() {
        let mut read = Refusals::new();
        let key = encode_key("t");
        assert!(!apply(&mut read, &key, Some(&[9, 0, 0])), "unknown version");
        assert!(
            !apply(&mut read, &key, Some(&[REFUSAL_VERSION, 0])),
            "short"
        );
        let bad_utf8 = [&[REFUSAL_VERSION][..], &[0; 8], &[0xff, 0xfe]].concat();
        assert!(!apply(&mut read, &key, Some(&bad_utf8)));
        assert!(!apply(&mut read, b"\xff\xffwriter:x", Some(&bad_utf8)));
        let long = Refusal {
            topic: "t".into(),
            detected_ms: 0,
            message: "é".repeat(MAX_MESSAGE),
        };
        let (key, value) = long.encode();
        assert!(apply(&mut read, &key, Some(&value)));
        assert!(read["t"].message.len() <= MAX_MESSAGE);
        assert!(truncated("é".repeat(MAX_MESSAGE)).len() <= MAX_MESSAGE);
        // A topic name no Kafka cluster allows (it would only lengthen the status).
        let (key, value) = Refusal {
            topic: "t".repeat(250),
            ..long
        }
        .encode();
        assert!(!apply(&mut read, &key, Some(&value)));
        assert_eq!(read.len(), 1);
    }
}
