//! Fuzz target bodies over mirrorflow-core's decoders, shared by the libFuzzer binaries
//! (`fuzz_targets/`) and by `crates/core/tests/fuzz_corpus.rs`, which runs them over the seed
//! corpus on stable.
//!
//! Each body panics only when an invariant is broken, which is what the fuzzer looks for.

use mirrorflow_core::{
    Checkpoint, CopyStart, Filters, Heartbeat, IdentityPolicy, OffsetSync, OffsetSyncStore,
    PrefixPolicy, ReplicationPolicy, StoreConfig, SyncOrigin, Translation,
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
    if let Ok(mut sync) = OffsetSync::decode(key, value) {
        let record = sync.encode().expect("decoded offset sync must encode");
        assert_reencodes(key, value, (record.key, record.value));
        // The bytes past the value as a `mirrorflow.sync.start` header: a start is only taken
        // at or before its sync, and a store fed it still maps the sync's record to its offset.
        let (up, down) = (sync.upstream_offset, sync.downstream_offset);
        sync.start = CopyStart::from_header(value.get(16..).unwrap_or_default(), up, down);
        if let Some(start) = sync.start {
            assert!(start.upstream <= up && start.downstream <= down);
        }
        let mut store = OffsetSyncStore::new(StoreConfig::default());
        store.finish_initial_load();
        if store.update(&sync, SyncOrigin::Dense).is_ok() {
            assert_eq!(
                store.translate(&sync.topic_partition, up),
                Translation::Exact(down)
            );
        }
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
/// offsets are -1 or a real offset, fetched records are bytes of the answer itself, a group
/// listing holds no more groups than its bytes could name.
pub fn broker_answers(data: &[u8]) {
    use mirrorflow_core::protocol::{
        self, list_groups, list_offsets, metadata, share_offsets, streams_groups,
    };
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match kind % 11 {
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
        6 => {
            let _ = protocol::decode_sasl_handshake(body);
            let _ = protocol::decode_sasl_authenticate(body);
        }
        7 => {
            if let Ok(listed) = list_groups::decode_list_groups(body) {
                // Each group takes at least its two string lengths.
                assert!(listed.groups.len().saturating_mul(4) <= body.len());
            }
        }
        8 => {
            let _ = share_offsets::decode_find_coordinator(body);
            if let Ok(altered) = share_offsets::decode_alter_share_group_offsets(body) {
                // Each partition takes at least its index, error code, message and tags.
                assert!(altered.partitions.len().saturating_mul(8) <= body.len());
            }
        }
        10 => {
            if let Ok(got) = streams_groups::decode_streams_group_describe(body) {
                // The members are counted, never allocated: at most one per byte left.
                assert!(got.members <= body.len());
            }
        }
        _ => {
            if let Ok(got) = share_offsets::decode_describe_share_group_offsets(body) {
                // Each partition takes at least 20 bytes; a start offset is -1 or an offset.
                assert!(got.partitions.len().saturating_mul(20) <= body.len());
                assert!(got.partitions.iter().all(|p| p.start_offset >= -1));
            }
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
    batch_around(codec, (count - 1).max(0), count, records)
}

/// A magic 2 batch at offset 0 with these attributes and last offset delta around `records`,
/// its base timestamp 0 and its max timestamp 1000, its CRC computed.
fn batch_around(attributes: i16, last_delta: i32, count: i32, records: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(61 + records.len());
    b.extend_from_slice(&0i64.to_be_bytes());
    let length = i32::try_from(49 + records.len()).unwrap_or(i32::MAX);
    b.extend_from_slice(&length.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&attributes.to_be_bytes());
    b.extend_from_slice(&last_delta.to_be_bytes());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&1_000i64.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&count.to_be_bytes());
    b.extend_from_slice(records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// The first four bytes pick the batch: its codec (`% 5`) and whether the source broker stamped
/// its append time (`/ 5 % 2`), its record count (`% 64`), how far its last offset delta lies
/// past the last record's (`% 16`: compaction gaps), and the target's batch limit (61 + 16 times
/// the byte); the rest is the batch's records as written, wrapped in a header with a valid CRC
/// (and the input is read as a fetch answer too). [`rewrite::rewrite`] with a 64 KiB inflate
/// limit never panics; what it writes are batches within the limit that a target takes as they
/// are (no gaps, CreateTime), in offset order without overlap, at most
/// [`rewrite::GROWTH_PER_RECORD`] bytes per record more than the records inflated, whose
/// records are exactly the source's records at their source offsets with the times their
/// readers saw.
pub fn rewritten_batches(data: &[u8]) {
    use mirrorflow_core::batch;
    let Some((&[choice, count, extra, max], payload)) = data.split_first_chunk::<4>() else {
        return;
    };
    let append_time = if (choice / 5) % 2 == 1 { 0x08 } else { 0 };
    let count = i32::from(count % 64);
    let last_delta = (count - 1).max(0) + i32::from(extra % 16);
    let max = batch::HEADER_LEN + 16 * usize::from(max);
    let bytes = batch_around(
        i16::from(choice % 5) | append_time,
        last_delta,
        count,
        payload,
    );
    for b in batch::batches(&bytes).chain(batch::batches(data)) {
        let Ok(b) = b else { continue };
        check_rewrite(&b, max);
    }
}

/// A record's offset, time, key, value and headers.
type OwnedRecord = (
    i64,
    i64,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(Vec<u8>, Option<Vec<u8>>)>,
);

fn owned(offset: i64, r: &mirrorflow_core::batch::records::Record<'_>) -> OwnedRecord {
    let headers = r
        .headers
        .iter()
        .map(|h| (h.key.to_vec(), h.value.map(<[u8]>::to_vec)));
    (
        offset,
        r.timestamp,
        r.key.map(<[u8]>::to_vec),
        r.value.map(<[u8]>::to_vec),
        headers.collect(),
    )
}

fn check_rewrite(b: &mirrorflow_core::batch::Batch<'_>, max: usize) {
    use mirrorflow_core::batch::{self, records, rewrite};
    const CAP: usize = 64 << 10;
    let Ok(out) = rewrite::rewrite(b, CAP, max) else {
        return;
    };
    let opened = records::open(b, CAP).expect("a rewritten batch opens");
    let source: Vec<OwnedRecord> = opened
        .records()
        .map(|r| {
            r.map(|r| owned(r.offset, &r))
                .expect("a rewritten batch's records read")
        })
        .collect();
    assert!(out.len() <= source.len(), "more batches than records");
    let growth = rewrite::GROWTH_PER_RECORD.saturating_mul(source.len());
    let total: usize = out.iter().map(|w| w.bytes.len()).sum();
    assert!(
        total <= opened.inflated_len().saturating_add(growth),
        "the output grew past its bound"
    );
    let (mut written, mut next) = (Vec::new(), i64::MIN);
    for w in &out {
        assert!(w.bytes.len() <= max, "a batch past the limit");
        assert!(w.base_offset >= next, "batches overlap or go back");
        next = w.next_offset();
        let all: Vec<_> = batch::batches(&w.bytes).collect();
        assert_eq!(all.len(), 1, "one batch per rewritten batch");
        let copy = all[0].as_ref().expect("a rewritten batch parses");
        assert_eq!(copy.bytes().len(), w.bytes.len(), "bytes after the batch");
        assert_eq!(
            copy.header.whole(),
            Ok(()),
            "a rewritten batch is not whole"
        );
        assert_eq!(copy.header.record_count, w.record_count);
        // One record alone may be larger than the limit uncompressed, never than the source's.
        let opened = records::open(copy, 2 * CAP).expect("a rewritten batch's CRC and codec");
        for (i, r) in opened.records().enumerate() {
            let r = r.expect("a rewritten record reads");
            assert_eq!(
                r.offset,
                i64::try_from(i).unwrap_or(i64::MAX),
                "offset deltas 0..n"
            );
            written.push(owned(w.base_offset.saturating_add(r.offset), &r));
        }
    }
    assert!(
        written == source,
        "the rewritten records are not the source's"
    );
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

/// First byte chooses where the key ends (its top bit: the value is a tombstone); the rest is a
/// key and value of a source `__consumer_offsets` record. Whatever decodes keeps its strings
/// within the bytes read, reads the same with bytes appended (trailing bytes are ignored), and
/// reads the same again once written back in the canonical form of its version.
pub fn consumer_offsets(data: &[u8]) {
    use mirrorflow_core::consumer_offsets::{self, Record};
    let tombstone = data.first().is_some_and(|b| b & 0x80 != 0);
    let (key, value) = split_key_value_masked(data);
    let value = (!tombstone).then_some(value);
    let Ok(record) = consumer_offsets::decode(key, value) else {
        return;
    };
    let mut longer_key = key.to_vec();
    longer_key.extend_from_slice(&[0x80, 0xff, 0]);
    let longer_value = value.map(|v| [v, &[0x80, 0xff, 0][..]].concat());
    assert_eq!(
        consumer_offsets::decode(&longer_key, longer_value.as_deref()).as_ref(),
        Ok(&record),
        "trailing bytes changed the record"
    );
    let Record::OffsetCommit { key: k, value: v } = &record else {
        return;
    };
    assert!(
        k.group.len() + k.topic.len() + 8 <= key.len(),
        "key strings past the key"
    );
    let (Some(v), Some(bytes)) = (v, value) else {
        return;
    };
    assert!(v.metadata.len() < bytes.len(), "metadata past the value");
    let version = i16::from_be_bytes([bytes[0], bytes[1]]);
    let canonical_key = canonical_offset_key(k);
    let canonical_value = canonical_offset_value(version, v);
    assert_eq!(
        consumer_offsets::decode(&canonical_key, Some(&canonical_value)).as_ref(),
        Ok(&record),
        "the canonical form reads differently"
    );
}

/// As [`split_key_value`], the first byte's top bit left out of the key length.
fn split_key_value_masked(data: &[u8]) -> (&[u8], &[u8]) {
    match data.split_first() {
        Some((&at, rest)) => rest.split_at(usize::from(at & 0x7f).min(rest.len())),
        None => (&[], &[]),
    }
}

fn kafka_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&i16::try_from(s.len()).unwrap_or(i16::MAX).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn canonical_offset_key(k: &mirrorflow_core::consumer_offsets::OffsetCommitKey) -> Vec<u8> {
    let mut out = 1i16.to_be_bytes().to_vec();
    kafka_string(&mut out, &k.group);
    kafka_string(&mut out, &k.topic);
    out.extend_from_slice(&k.partition.to_be_bytes());
    out
}

/// The value as the group coordinator writes `version` of it: minimal varints, no tags.
fn canonical_offset_value(
    version: i16,
    v: &mirrorflow_core::consumer_offsets::OffsetCommitValue,
) -> Vec<u8> {
    let mut out = version.to_be_bytes().to_vec();
    out.extend_from_slice(&v.offset.to_be_bytes());
    if version >= 3 {
        out.extend_from_slice(&v.leader_epoch.unwrap_or(-1).to_be_bytes());
    }
    if version >= 4 {
        let mut len = u32::try_from(v.metadata.len() + 1).unwrap_or(u32::MAX);
        while len >= 0x80 {
            out.push((len as u8) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(v.metadata.as_bytes());
    } else {
        kafka_string(&mut out, &v.metadata);
    }
    out.extend_from_slice(&v.commit_timestamp_ms.to_be_bytes());
    if version == 1 {
        out.extend_from_slice(&0i64.to_be_bytes());
    }
    if version >= 4 {
        out.push(0);
    }
    out
}

/// A fetch answer's position bookkeeping for one partition: the input is the offset the copy
/// reads from (8 bytes), a count of aborted transactions (1 byte, `% 8`) and that many
/// (producer id, first offset) pairs (8 bytes each), then the partition's records.
/// [`batch::to_copy`] never moves the position back, copies only whole batches of the input
/// that end past the position, in order and without overlap, never a marker, never a batch of
/// an aborted transaction (when no marker ends one), and reading the same answer again from
/// where it left off copies nothing.
pub fn fetch_positions(data: &[u8]) {
    use mirrorflow_core::batch;
    let Some((offset, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let offset = i64::from_be_bytes(*offset);
    let Some((&count, mut rest)) = rest.split_first() else {
        return;
    };
    let mut aborted = Vec::new();
    for _ in 0..count % 8 {
        let Some((pair, tail)) = rest.split_first_chunk::<16>() else {
            break;
        };
        let (producer, first) = pair.split_at(8);
        aborted.push((be_i64(producer), be_i64(first)));
        rest = tail;
    }
    let records = rest;
    let Ok(copy) = batch::to_copy(records, &aborted, offset) else {
        return;
    };
    assert!(copy.next_offset >= offset, "the position moved back");
    assert!(copy.partial <= records.len());
    let whole = records.len() - copy.partial;
    let any_marker = batch::batches(&records[..whole])
        .map_while(Result::ok)
        .any(|b| b.header.is_control());
    let (mut end, mut last_next) = (0usize, offset);
    for range in &copy.ranges {
        assert!(
            end <= range.start && range.end <= whole,
            "ranges overlap or leave the input"
        );
        end = range.end;
        let one: Vec<_> = batch::batches(&records[range.clone()]).collect();
        assert_eq!(one.len(), 1, "a range is one batch");
        let b = one[0].as_ref().expect("a copied range parses");
        assert_eq!(b.bytes().len(), range.len(), "a range is a whole batch");
        assert!(!b.header.is_control(), "a marker copied");
        assert!(
            b.header.next_offset() > last_next,
            "a batch copied twice or backwards"
        );
        last_next = b.header.next_offset();
        assert!(
            last_next <= copy.next_offset,
            "a batch past the position copied"
        );
        if !any_marker && b.header.is_transactional() && b.header.has_producer_id() {
            let aborted_before = aborted
                .iter()
                .any(|&(p, first)| p == b.header.producer_id && first <= b.header.last_offset());
            assert!(!aborted_before, "a batch of an aborted transaction copied");
        }
    }
    let again = batch::to_copy(records, &aborted, copy.next_offset)
        .expect("an answer that was read reads again");
    assert!(again.ranges.is_empty(), "the same answer copied twice");
    assert_eq!(again.next_offset, copy.next_offset);
}

fn be_i64(bytes: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&bytes[..8]);
    i64::from_be_bytes(a)
}
