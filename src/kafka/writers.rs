//! Which flow writes a positions topic. Two flows with one source alias into one target
//! cluster share their internal topics there and corrupt each other's positions and
//! checkpoints. The operator refuses the later of two such flows it can see; flows it cannot
//! see (another namespace's operator, another Kubernetes cluster, a standalone run) find each
//! other here: every running replicator keeps a claim in the positions topic, and of two live
//! claims the older flow keeps writing while the later one waits.
//!
//! A claim is its own record, keyed by the writer, so compaction keeps one per writer however
//! many positions the other writers overwrite:
//! - key: `0xFF 0xFF` (an i16 length of -1: never a position key, so older readers skip it as
//!   undecodable), then `writer:` and the writer's id (the flow resource's uid) in UTF-8;
//! - value: `version: u8 = 2`, `created: i64` (the flow's creation time, ms since the epoch;
//!   `i64::MAX` when unknown: such a flow yields to every flow that has one), `renewed: i64`
//!   (the writer's clock, ms since the epoch), `flow: i16 length + UTF-8` (`namespace/name`,
//!   for messages). A tombstone releases the claim (a replicator stopping cleanly).
//!
//! A claim not renewed for [`STALE_AFTER`] is ignored: its replicator is gone (killed, or its
//! flow deleted without a clean stop).

use std::collections::HashMap;
use std::time::Duration;

pub use mirrorflow_core::positions::CLAIM_VERSION;
use mirrorflow_core::positions::ClaimValue;
const KEY_PREFIX: &[u8] = b"\xff\xffwriter:";

/// How often a running replicator renews its claim.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// A claim older than this is a replicator that is gone. Several renewals, so a slow target
/// never makes a live writer look gone.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// Who writes: a flow's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    /// The flow resource's uid; for a flow without one (a standalone file), its name.
    pub id: String,
    /// `namespace/name`, for messages.
    pub flow: String,
    /// The flow's creation time (ms since the epoch); `i64::MAX` when unknown.
    pub created_ms: i64,
}

impl Writer {
    /// A flow known by its name only: it yields to every flow with a creation time.
    pub fn unnamed(flow: &str) -> Self {
        Writer {
            id: flow.to_string(),
            flow: flow.to_string(),
            created_ms: i64::MAX,
        }
    }

    /// Older flows win; equal times (two flows without one) are ordered by name, then id, so
    /// both sides agree on the same order.
    fn precedes(&self, other: &Writer) -> bool {
        (self.created_ms, &self.flow, &self.id) < (other.created_ms, &other.flow, &other.id)
    }
}

/// A writer's claim as read from the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub writer: Writer,
    pub renewed_ms: i64,
}

/// The live claims by writer id.
pub type Claims = HashMap<String, Claim>;

pub fn is_claim_key(key: &[u8]) -> bool {
    key.starts_with(KEY_PREFIX)
}

pub fn encode_key(writer: &Writer) -> Vec<u8> {
    let mut key = KEY_PREFIX.to_vec();
    key.extend_from_slice(writer.id.as_bytes());
    key
}

pub fn encode_value(writer: &Writer, renewed_ms: i64) -> Vec<u8> {
    ClaimValue {
        created_ms: writer.created_ms,
        renewed_ms,
        flow: &writer.flow,
    }
    .encode()
}

/// How far ahead of the reader's clock a claim's renewal time may be: clocks of hosts in one
/// deployment differ by far less. A later time is read as this far ahead, so a forged or
/// broken claim (renewed in the year 292 million) lapses like any other once it is not
/// renewed, instead of being live for ever.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Folds a claim record into `claims` as read now. False when the key is a claim's but the
/// value is not one this version reads.
pub fn apply(claims: &mut Claims, key: &[u8], value: Option<&[u8]>) -> bool {
    apply_at(claims, key, value, crate::clock::now_ms())
}

/// [`apply`] as read at `now_ms`: a renewal time ahead of it by more than [`MAX_CLOCK_SKEW`]
/// is taken as `now_ms + MAX_CLOCK_SKEW`.
pub fn apply_at(claims: &mut Claims, key: &[u8], value: Option<&[u8]>, now_ms: i64) -> bool {
    let Some(id) = key
        .strip_prefix(KEY_PREFIX)
        .and_then(|id| std::str::from_utf8(id).ok())
    else {
        return false;
    };
    let Some(value) = value else {
        claims.remove(id);
        return true;
    };
    match decode_value(id, value) {
        Some(mut claim) => {
            let skew = i64::try_from(MAX_CLOCK_SKEW.as_millis()).unwrap_or(i64::MAX);
            claim.renewed_ms = claim.renewed_ms.min(now_ms.saturating_add(skew));
            claims.insert(id.to_string(), claim);
            true
        }
        None => false,
    }
}

fn decode_value(id: &str, value: &[u8]) -> Option<Claim> {
    let v = ClaimValue::decode(value)?;
    Some(Claim {
        writer: Writer {
            id: id.to_string(),
            flow: v.flow.to_string(),
            created_ms: v.created_ms,
        },
        renewed_ms: v.renewed_ms,
    })
}

/// The live claim of another flow that `own` must yield to (the oldest of them), if any.
/// Live: renewed within [`STALE_AFTER`] of `now_ms` (a claim from a clock ahead of ours is
/// live too, until it is that old; [`apply`] bounds how far ahead it can be).
pub fn yields_to<'a>(own: &Writer, claims: &'a Claims, now_ms: i64) -> Option<&'a Claim> {
    let stale = i64::try_from(STALE_AFTER.as_millis()).unwrap_or(i64::MAX);
    claims
        .values()
        .filter(|c| c.writer.id != own.id)
        .filter(|c| now_ms.saturating_sub(c.renewed_ms) <= stale)
        .filter(|c| c.writer.precedes(own))
        .min_by(|a, b| {
            (a.writer.created_ms, &a.writer.flow, &a.writer.id).cmp(&(
                b.writer.created_ms,
                &b.writer.flow,
                &b.writer.id,
            ))
        })
}

/// What the later flow is told: which flow it shares its internal topics with, and the fix.
pub fn yield_message(other: &Claim, source_alias: &str) -> String {
    format!(
        "spec.source.alias: flow '{}' (older; not one this operator manages, or in another Kubernetes cluster) already replicates source alias '{source_alias}' into this target cluster and writes the same internal topics there (mirrorflow-positions.{source_alias}.internal, {source_alias}.checkpoints.internal); this flow's replicators copy nothing while that flow runs, so neither corrupts the other; give one of the two source clusters another alias, or stop the other flow (its claim lapses {}s after its replicators stop)",
        // The name comes from a record anyone with WRITE on the topic can forge.
        crate::status::bounded_text(&other.writer.flow),
        STALE_AFTER.as_secs(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(id: &str, flow: &str, created_ms: i64) -> Writer {
        Writer {
            id: id.into(),
            flow: flow.into(),
            created_ms,
        }
    }

    fn claims(list: &[(Writer, i64)]) -> Claims {
        let mut out = Claims::new();
        for (w, renewed) in list {
            assert!(apply(
                &mut out,
                &encode_key(w),
                Some(&encode_value(w, *renewed))
            ));
        }
        out
    }

    #[test]
    fn a_claim_round_trips_and_a_tombstone_releases_it() {
        let w = writer("0b6e-uid", "team-a/orders", 1_700_000_000_000);
        let mut c = claims(&[(w.clone(), 42)]);
        assert_eq!(
            c.get("0b6e-uid"),
            Some(&Claim {
                writer: w.clone(),
                renewed_ms: 42
            })
        );
        assert!(apply(&mut c, &encode_key(&w), None));
        assert!(c.is_empty());
    }

    #[test]
    fn claim_keys_are_never_position_keys() {
        let key = encode_key(&writer("u", "n/f", 1));
        assert!(is_claim_key(&key));
        assert_eq!(crate::kafka::positions::decode_key(&key), None);
        let position = crate::kafka::positions::encode_key("topic", 0);
        assert!(!is_claim_key(&position));
    }

    #[test]
    fn truncated_or_foreign_values_are_not_claims() {
        let w = writer("u", "n/f", 1);
        let value = encode_value(&w, 5);
        let mut c = Claims::new();
        for cut in 0..value.len() {
            assert!(
                !apply(&mut c, &encode_key(&w), Some(&value[..cut])),
                "{cut}"
            );
        }
        let mut other_version = value.clone();
        other_version[0] = 9;
        assert!(!apply(&mut c, &encode_key(&w), Some(&other_version)));
        // A length longer than what follows.
        let mut long = value.clone();
        long[17] = 0x7f;
        assert!(!apply(&mut c, &encode_key(&w), Some(&long)));
        assert!(c.is_empty());
        assert!(!apply(&mut c, b"not a claim", Some(&value)));
    }

    #[test]
    fn the_later_flow_yields_to_the_older_live_one_only() {
        let now = 1_000_000;
        let older = writer("a", "ns1/first", 100);
        let newer = writer("b", "ns2/second", 200);
        let c = claims(&[(older.clone(), now - 5_000), (newer.clone(), now)]);
        assert_eq!(yields_to(&newer, &c, now).map(|c| &c.writer), Some(&older));
        assert_eq!(yields_to(&older, &c, now), None);
        // Its own claim never counts.
        assert_eq!(
            yields_to(&older, &claims(&[(older.clone(), now)]), now),
            None
        );
    }

    #[test]
    fn a_stale_claim_is_a_writer_that_is_gone() {
        let now = 1_000_000;
        let older = writer("a", "ns1/first", 100);
        let newer = writer("b", "ns2/second", 200);
        let stale = i64::try_from(STALE_AFTER.as_millis()).unwrap();
        let gone = claims(&[(older.clone(), now - stale - 1)]);
        assert_eq!(yields_to(&newer, &gone, now), None);
        let just_live = claims(&[(older.clone(), now - stale)]);
        assert!(yields_to(&newer, &just_live, now).is_some());
        // A clock ahead of ours: live.
        let ahead = claims(&[(older, now + 30_000)]);
        assert!(yields_to(&newer, &ahead, now).is_some());
    }

    #[test]
    fn a_claim_from_the_far_future_is_read_as_slightly_ahead_and_lapses() {
        let now = 1_700_000_000_000;
        let forged = writer("x", "evil/forged", 0);
        let victim = writer("v", "team/victim", 1_000);
        let mut c = Claims::new();
        assert!(apply_at(
            &mut c,
            &encode_key(&forged),
            Some(&encode_value(&forged, i64::MAX)),
            now
        ));
        let skew = i64::try_from(MAX_CLOCK_SKEW.as_millis()).unwrap();
        let stale = i64::try_from(STALE_AFTER.as_millis()).unwrap();
        assert_eq!(c["x"].renewed_ms, now + skew);
        assert!(
            yields_to(&victim, &c, now).is_some(),
            "live while it could be"
        );
        assert!(yields_to(&victim, &c, now + skew + stale).is_some());
        assert_eq!(yields_to(&victim, &c, now + skew + stale + 1), None);
        assert_eq!(yields_to(&victim, &c, now + 3_600_000), None, "an hour on");
        // Within the skew, a clock ahead of ours is kept as it is.
        apply_at(
            &mut c,
            &encode_key(&forged),
            Some(&encode_value(&forged, now + 1_000)),
            now,
        );
        assert_eq!(c["x"].renewed_ms, now + 1_000);
    }

    #[test]
    fn a_long_flow_name_in_a_claim_is_cut_in_the_message() {
        let long = writer("x", &"n".repeat(20_000), 0);
        let message = yield_message(
            &Claim {
                writer: long,
                renewed_ms: 0,
            },
            "src",
        );
        assert!(message.len() < 2_000, "{} bytes", message.len());
    }

    #[test]
    fn flows_without_a_creation_time_yield_to_those_with_one_and_agree_among_themselves() {
        let now = 10;
        let known = writer("uid", "ns/known", 500);
        let file_a = Writer::unnamed("a.yaml");
        let file_b = Writer::unnamed("b.yaml");
        let c = claims(&[
            (known.clone(), now),
            (file_a.clone(), now),
            (file_b.clone(), now),
        ]);
        assert_eq!(yields_to(&file_a, &c, now).map(|c| &c.writer), Some(&known));
        assert_eq!(yields_to(&known, &c, now), None);
        let files = claims(&[(file_a.clone(), now), (file_b.clone(), now)]);
        assert_eq!(yields_to(&file_a, &files, now), None);
        assert_eq!(
            yields_to(&file_b, &files, now).map(|c| &c.writer),
            Some(&file_a)
        );
    }

    #[test]
    fn the_oldest_of_several_is_named() {
        let now = 10;
        let (a, b, c) = (
            writer("a", "x/a", 1),
            writer("b", "x/b", 2),
            writer("c", "x/c", 3),
        );
        let all = claims(&[(b.clone(), now), (a.clone(), now), (c.clone(), now)]);
        assert_eq!(yields_to(&c, &all, now).map(|c| &c.writer), Some(&a));
        assert!(yield_message(&all["a"], "src").contains("flow 'x/a'"));
    }
}
