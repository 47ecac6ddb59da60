//! Fuzz target bodies, shared by the libFuzzer binaries (`fuzz_targets/`) and by the main
//! core crate's `crates/core/tests/fuzz_corpus.rs`, which runs them over the seed corpus on stable.
//!
//! Each body panics only when an invariant is broken, which is what the fuzzer looks for.

use mirrorflow_core::{
    Checkpoint, Filters, Heartbeat, IdentityPolicy, OffsetSync, PrefixPolicy, ReplicationPolicy,
};

/// First byte chooses where the key ends; the rest is key then value.
fn split_key_value(data: &[u8]) -> (&[u8], &[u8]) {
    match data.split_first() {
        Some((&at, rest)) => rest.split_at(usize::from(at).min(rest.len())),
        None => (&[], &[]),
    }
}

/// Whatever decodes must re-encode to the bytes it was read from (trailing bytes aside).
fn assert_reencodes(key: &[u8], value: &[u8], encoded: (Vec<u8>, Vec<u8>)) {
    let (k, v) = encoded;
    assert!(key.starts_with(&k), "key re-encodes differently");
    assert!(value.starts_with(&v), "value re-encodes differently");
}

pub fn decode_checkpoint(data: &[u8]) {
    let (key, value) = split_key_value(data);
    if let Ok(checkpoint) = Checkpoint::decode(key, value) {
        let record = checkpoint.encode().expect("decoded checkpoint must encode");
        assert_reencodes(key, value, (record.key, record.value));
    }
}

pub fn decode_heartbeat(data: &[u8]) {
    let (key, value) = split_key_value(data);
    if let Ok(heartbeat) = Heartbeat::decode(key, value) {
        let record = heartbeat.encode().expect("decoded heartbeat must encode");
        assert_reencodes(key, value, (record.key, record.value));
    }
}

pub fn decode_offset_sync(data: &[u8]) {
    let (key, value) = split_key_value(data);
    if let Ok(sync) = OffsetSync::decode(key, value) {
        let record = sync.encode().expect("decoded offset sync must encode");
        assert_reencodes(key, value, (record.key, record.value));
    }
}

/// Lines of the input: a separator, then names that are used both as topic names and as
/// patterns for the four filter lists.
pub fn policy_filter(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.lines();
    let separator = lines.next().unwrap_or(".");
    let names: Vec<&str> = lines.take(16).collect();

    let prefix = PrefixPolicy::new(separator).unwrap_or_default();
    let identity = IdentityPolicy::new(prefix.clone(), names.first().map(|s| s.to_string()));
    let policies: [&dyn ReplicationPolicy; 2] = [&prefix, &identity];
    for policy in policies {
        for name in &names {
            exercise_policy(policy, name);
        }
    }
    for name in &names {
        check_prefix_round_trip(&prefix, name);
    }

    let (a, b) = names.split_at(names.len() / 2);
    let (a1, a2) = a.split_at(a.len() / 2);
    let (b1, b2) = b.split_at(b.len() / 2);
    if let Ok(filters) = Filters::new(a1, a2, b1, b2) {
        for name in &names {
            let _ = filters.topic_allowed(name);
            let _ = filters.group_allowed(name);
            let _ = filters.topic_decision(&prefix, name, "source", "target");
        }
    }
}

fn exercise_policy(policy: &dyn ReplicationPolicy, topic: &str) {
    let _ = policy.topic_source(topic);
    let _ = policy.upstream_topic(topic);
    let original = policy.original_topic(topic);
    assert!(topic.ends_with(original), "original topic is a suffix");
    let _ = policy.is_internal_topic(topic);
    let _ = policy.is_heartbeats_topic(topic);
    let _ = policy.is_checkpoints_topic(topic);
    let _ = policy.is_cycle(topic, "target");
    let _ = policy.checkpoints_topic(topic);
    let _ = policy.offset_syncs_topic(topic);
}

/// A topic renamed from an alias without the separator reads back as coming from that alias.
fn check_prefix_round_trip(policy: &PrefixPolicy, topic: &str) {
    let sep = policy.separator();
    let alias = "src";
    let remote = policy.format_remote_topic(alias, topic);
    if remote.find(sep) != Some(alias.len()) {
        // The separator overlaps the alias: Java's split would cut elsewhere too.
        return;
    }
    // Java's split drops trailing empty parts, so all-separator names are not remote.
    if topic.split(sep).any(|part| !part.is_empty()) {
        assert_eq!(policy.topic_source(&remote), Some(alias));
        assert_eq!(policy.upstream_topic(&remote), Some(topic));
        assert!(policy.is_cycle(&remote, alias));
    } else {
        assert_eq!(policy.topic_source(&remote), None);
    }
}

/// The input is a fetch answer's records for one partition. Every complete batch goes through
/// the `read_committed` filter (the first transactional batch's producer counts as aborted from
/// that batch on) and, when admitted, through [`batch::restamp`]: the copy must be one batch of
/// the same size and records with a valid CRC, or the source batch's CRC must be wrong.
pub fn fetched_batches(data: &[u8]) {
    use mirrorflow_core::batch::{self, Admission, Committed, Stamp};
    let all: Vec<batch::Batch<'_>> = batch::batches(data).map_while(Result::ok).collect();
    let aborted: Vec<(i64, i64)> = all
        .iter()
        .find(|b| b.header.is_transactional())
        .map(|b| (b.header.producer_id, b.header.base_offset))
        .into_iter()
        .collect();
    let mut committed = Committed::new(&aborted);
    let stamp = Stamp {
        producer_id: 5,
        producer_epoch: 1,
        base_sequence: i32::MAX,
        transactional: true,
    };
    for b in &all {
        if committed.admit(b) != Ok(Admission::Copy) {
            continue;
        }
        let mut out = Vec::new();
        if batch::restamp(b, &stamp, &mut out).is_err() {
            assert!(out.is_empty(), "a refused batch writes nothing");
            continue;
        }
        let copies: Vec<_> = batch::batches(&out).collect();
        assert_eq!(copies.len(), 1, "one batch in, one batch out");
        let copy = copies[0].as_ref().expect("a restamped batch parses");
        assert_eq!(out.len(), b.bytes().len());
        assert_eq!(out[batch::HEADER_LEN..], b.bytes()[batch::HEADER_LEN..]);
        assert_eq!(copy.header.producer_id, 5);
        let mut again = Vec::new();
        assert!(
            batch::restamp(copy, &stamp, &mut again).is_ok(),
            "a restamped batch's CRC holds"
        );
    }
}

/// The first byte picks the answer's kind, the rest is the answer body a broker sent. Decoding
/// never panics and what decodes keeps the bounds the copy relies on: addresses are TCP ports,
/// offsets are -1 or a real offset, fetched records are bytes of the answer itself.
pub fn broker_answers(data: &[u8]) {
    use mirrorflow_core::protocol::{self, list_offsets, metadata};
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match kind % 7 {
        0 => {
            if let Ok(m) = metadata::decode_metadata(body) {
                assert!(m.brokers.iter().all(|b| (1..=65535).contains(&b.port)));
            }
        }
        1 => {
            if let Ok(listed) = list_offsets::decode_list_offsets(body) {
                assert!(listed.iter().all(|(_, l)| l.offset >= -1));
            }
        }
        2 => {
            if let Ok(answer) = protocol::decode_fetch(body) {
                let range = body.as_ptr_range();
                for (_, partitions) in &answer.topics {
                    for p in partitions {
                        let r = p.records.as_ptr_range();
                        assert!(
                            p.records.is_empty() || (range.start <= r.start && r.end <= range.end)
                        );
                    }
                }
            }
        }
        3 => {
            let _ = protocol::decode_produce(body);
        }
        4 => {
            let _ = protocol::decode_api_versions(body);
        }
        5 => {
            let _ = protocol::decode_init_producer_id(body);
        }
        _ => {
            let _ = protocol::decode_sasl_handshake(body);
            let _ = protocol::decode_sasl_authenticate(body);
        }
    }
}

/// The first byte picks the codec (`% 5`) and the record count (`/ 5`); the rest is a batch's
/// records as written (compressed or not), wrapped here in a batch header with a valid CRC so
/// that inflating and record reading are reached. The records inflate to at most the cap, there
/// are never more records than the batch announces (plus the error that ends them), and every
/// offset is the batch's or after it.
pub fn batch_records(data: &[u8]) {
    use mirrorflow_core::batch::{self, records};
    const CAP: usize = 1 << 20;
    let Some((&choice, payload)) = data.split_first() else {
        return;
    };
    let count = i32::from(choice / 5);
    let bytes = batch_with(i16::from(choice % 5), count, payload);
    for b in batch::batches(&bytes).chain(batch::batches(data)) {
        let Ok(b) = b else { continue };
        let Ok(opened) = records::open(&b, CAP) else {
            continue;
        };
        assert!(opened.inflated_len() <= CAP, "inflated past the cap");
        let mut read = 0usize;
        for r in opened.records() {
            read += 1;
            if let Ok(r) = r {
                assert!(r.offset >= b.header.base_offset, "offset before the batch");
            }
        }
        let announced = usize::try_from(b.header.record_count.max(0)).unwrap_or(usize::MAX);
        assert!(
            read <= announced.saturating_add(1),
            "more records than announced"
        );
    }
}

/// A magic 2 batch at offset 0 around `records`, its CRC computed.
fn batch_with(codec: i16, count: i32, records: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(61 + records.len());
    b.extend_from_slice(&0i64.to_be_bytes());
    let length = i32::try_from(49 + records.len()).unwrap_or(i32::MAX);
    b.extend_from_slice(&length.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&codec.to_be_bytes());
    b.extend_from_slice(&(count - 1).max(0).to_be_bytes());
    b.extend_from_slice(&[0; 16]); // timestamps
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&count.to_be_bytes());
    b.extend_from_slice(records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// First byte chooses where the key ends; the rest is a key and value as read from a flow's
/// positions topic on the target, which the shared operator reads for every flow. Every decoder
/// of that topic (position, gap, claim, refusal) reads it; whatever decodes re-encodes to the
/// bytes it was read from (trailing bytes aside), and a gap's message is written without panic.
pub fn positions_records(data: &[u8]) {
    use mirrorflow_core::positions::{self, ClaimValue, Gap};
    let (key, value) = split_key_value(data);
    if let Some((topic, partition)) = positions::decode_key(key) {
        assert!(key.starts_with(&positions::encode_key(&topic, partition)));
    }
    if let Some(frontier) = positions::decode_value(value) {
        assert!(value.starts_with(&positions::encode_value(frontier)));
    }
    if let Some(gap) = Gap::decode(key, value) {
        let (k, v) = gap.encode();
        assert_reencodes(key, value, (k, v));
        assert!(!gap.describe().is_empty());
    }
    if let Some(claim) = ClaimValue::decode(value) {
        assert!(
            value.starts_with(&claim.encode()),
            "claim re-encodes differently"
        );
    }
    if let Some((detected_ms, message)) = positions::decode_refusal_value(value) {
        assert_eq!(positions::encode_refusal_value(detected_ms, message), value);
    }
}
