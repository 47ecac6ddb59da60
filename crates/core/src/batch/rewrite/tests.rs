use proptest::prelude::*;

use super::*;
use crate::batch::records::Header as RecordHeader;
use crate::batch::records::tests::compress as producer_compress;
use crate::batch::tests::Source;
use crate::batch::{CONTROL, LOG_APPEND_TIME, NotWhole, batches};

const LIMIT: usize = 1 << 20;

const CODECS: [Codec; 5] = [
    Codec::None,
    Codec::Gzip,
    Codec::Snappy,
    Codec::Lz4,
    Codec::Zstd,
];

/// A record as read, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owned {
    offset: i64,
    timestamp: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Headers,
}

impl Owned {
    fn new(offset: i64, timestamp: i64, value: &[u8]) -> Self {
        Self {
            offset,
            timestamp,
            key: Some(format!("k{offset}").into_bytes()),
            value: Some(value.to_vec()),
            headers: vec![(b"h".to_vec(), None)],
        }
    }

    fn of(r: &Record<'_>) -> Self {
        Self {
            offset: r.offset,
            timestamp: r.timestamp,
            key: r.key.map(<[u8]>::to_vec),
            value: r.value.map(<[u8]>::to_vec),
            headers: r
                .headers
                .iter()
                .map(|h| (h.key.to_vec(), h.value.map(<[u8]>::to_vec)))
                .collect(),
        }
    }

    fn with_time(&self, timestamp: i64) -> Self {
        Self {
            timestamp,
            ..self.clone()
        }
    }
}

/// A source batch at `base` holding `records` (their offsets absolute, with any gaps),
/// compressed with `codec` as a producer would, `flags` added to its attributes. Its header's
/// base and max timestamps are `Source`'s (1000 and 2000).
fn source(base: i64, codec: Codec, flags: i16, last_delta: i32, records: &[Owned]) -> Vec<u8> {
    let count = i32::try_from(records.len()).expect("small");
    let payload = producer_compress(codec, &plain(base, 1_000, records));
    Source {
        attributes: codec.attribute() | flags,
        last_offset_delta: last_delta,
        ..Source::data(base, count, &payload)
    }
    .bytes()
}

/// `records` uncompressed, their offsets and times as deltas from `base` and `base_timestamp`.
fn plain(base: i64, base_timestamp: i64, records: &[Owned]) -> Vec<u8> {
    let mut plain = Vec::new();
    let mut scratch = Vec::new();
    for r in records {
        let headers: Vec<RecordHeader<'_>> = r
            .headers
            .iter()
            .map(|(k, v)| RecordHeader {
                key: k,
                value: v.as_deref(),
            })
            .collect();
        let record = Record {
            offset: r.offset,
            timestamp: r.timestamp,
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            headers,
        };
        put_record(&record, base, base_timestamp, &mut scratch, &mut plain);
    }
    plain
}

fn one(bytes: &[u8]) -> Batch<'_> {
    let all: Vec<_> = batches(bytes).collect();
    assert_eq!(all.len(), 1, "one batch");
    all[0].clone().expect("a well-formed batch")
}

/// An output batch's header and records, read back with the project's own reader.
fn read(bytes: &[u8]) -> (BatchHeader, Vec<Owned>) {
    let b = one(bytes);
    assert_eq!(b.bytes().len(), bytes.len(), "nothing after the batch");
    let opened = records::open(&b, LIMIT).expect("a rewritten batch opens");
    let records = opened
        .records()
        .map(|r| r.map(|r| Owned::of(&r)).expect("readable"))
        .collect();
    (b.header, records)
}

fn rewrite_bytes(bytes: &[u8], max: usize) -> Result<Vec<Rewritten>, RewriteError> {
    rewrite(&one(bytes), LIMIT, max)
}

/// Every output batch fits `max`, is one the target takes as it is (no gaps, CreateTime, no
/// producer stamp) and says what `Rewritten` says; their records, in order.
fn checked(out: &[Rewritten], max: usize) -> Vec<Owned> {
    let mut all = Vec::new();
    for w in out {
        assert!(w.bytes.len() <= max, "{} bytes > {max}", w.bytes.len());
        let (h, mut records) = read(&w.bytes);
        assert_eq!(h.whole(), Ok(()));
        assert_eq!((h.base_offset, h.record_count), (0, w.record_count));
        let deltas: Vec<i64> = records.iter().map(|r| r.offset).collect();
        let expected: Vec<i64> = (0..i64::from(w.record_count)).collect();
        assert_eq!(deltas, expected, "offset deltas 0..n");
        for r in &mut records {
            r.offset += w.base_offset;
        }
        assert_eq!(
            (h.producer_id, h.producer_epoch, h.base_sequence),
            (-1, -1, -1)
        );
        assert!(!h.is_transactional() && !h.is_control());
        let times = records.iter().map(|r| r.timestamp);
        assert_eq!(h.max_timestamp, times.clone().max().expect("records"));
        assert_eq!(h.base_timestamp, records[0].timestamp);
        all.extend(records);
    }
    all
}

fn runs(out: &[Rewritten]) -> Vec<(i64, i32)> {
    out.iter()
        .map(|w| (w.base_offset, w.record_count))
        .collect()
}

#[test]
fn a_compacted_batch_gives_one_batch_per_contiguous_run() {
    let records: Vec<Owned> = [100, 101, 102, 105, 106, 109]
        .iter()
        .map(|&o| Owned::new(o, 1_000 + o, b"value"))
        .collect();
    let bytes = source(100, Codec::Lz4, 0, 9, &records);
    assert_eq!(one(&bytes).header.whole(), Err(NotWhole::OffsetGaps));
    let out = rewrite_bytes(&bytes, LIMIT).expect("rewritten");
    assert_eq!(runs(&out), [(100, 3), (105, 2), (109, 1)]);
    assert_eq!(checked(&out, LIMIT), records);
}

#[test]
fn rewritten_over_a_range_of_offsets_a_batch_keeps_exactly_those_records() {
    for codec in CODECS {
        let records: Vec<Owned> = (40..50)
            .map(|o| Owned::new(o, 1_000 + o, &[9; 80]))
            .collect();
        let bytes = source(40, codec, 0, 9, &records);
        let b = one(&bytes);
        let out = rewrite_range(&b, 47..i64::MAX, LIMIT, LIMIT).expect("rewritten");
        assert_eq!(runs(&out), [(47, 3)], "{codec:?}");
        assert_eq!(checked(&out, LIMIT), records[7..], "{codec:?}");
        // From its first record or before: all of it; past its last: nothing.
        let all = rewrite_range(&b, 12..i64::MAX, LIMIT, LIMIT).expect("rewritten");
        assert_eq!(checked(&all, LIMIT), records, "{codec:?}");
        assert!(
            rewrite_range(&b, 50..i64::MAX, LIMIT, LIMIT)
                .expect("read")
                .is_empty()
        );
        // Up to an offset inside it: the records before that one.
        let head = rewrite_range(&b, 40..43, LIMIT, LIMIT).expect("rewritten");
        assert_eq!(checked(&head, LIMIT), records[..3], "{codec:?}");
        let middle = rewrite_range(&b, 44..46, LIMIT, LIMIT).expect("rewritten");
        assert_eq!(runs(&middle), [(44, 2)], "{codec:?}");
    }
    // Compaction gaps before and after the cut: runs start at the first record kept.
    let records: Vec<Owned> = [100, 101, 104, 105, 106, 109]
        .iter()
        .map(|&o| Owned::new(o, 1_000, b"value"))
        .collect();
    let bytes = source(100, Codec::Zstd, 0, 9, &records);
    let out = rewrite_range(&one(&bytes), 102..i64::MAX, LIMIT, LIMIT).expect("rewritten");
    assert_eq!(runs(&out), [(104, 3), (109, 1)]);
    assert_eq!(checked(&out, LIMIT), records[2..]);
    // Records before the cut are still read and checked: a bomb there is refused.
    let bomb: Vec<Owned> = (0..3).map(|o| Owned::new(o, 1_000, &[0; 4_000])).collect();
    let bytes = source(0, Codec::Gzip, 0, 2, &bomb);
    let err = rewrite_range(&one(&bytes), 2..3, 1_000, LIMIT).expect_err("over the inflate limit");
    assert!(matches!(err, RewriteError::Records(_)), "{err:?}");
}

#[test]
fn log_append_time_becomes_create_time_with_the_append_time_on_every_record() {
    let records: Vec<Owned> = (0..4).map(|o| Owned::new(o, 1_000 + o * 7, b"v")).collect();
    let bytes = source(0, Codec::Gzip, LOG_APPEND_TIME, 3, &records);
    assert_eq!(one(&bytes).header.whole(), Err(NotWhole::LogAppendTime));
    let out = rewrite_bytes(&bytes, LIMIT).expect("rewritten");
    assert_eq!(runs(&out), [(0, 4)]);
    let (h, _) = read(&out[0].bytes);
    assert_eq!(h.attributes & LOG_APPEND_TIME, 0, "CreateTime");
    assert_eq!((h.base_timestamp, h.max_timestamp), (2_000, 2_000));
    let expected: Vec<Owned> = records.iter().map(|r| r.with_time(2_000)).collect();
    assert_eq!(checked(&out, LIMIT), expected);
}

#[test]
fn create_time_keeps_each_records_own_time_in_any_order() {
    let times = [1_500, 900, -1, 1_200];
    let records: Vec<Owned> = (0..4)
        .map(|o| Owned::new(o, times[o as usize], b"v"))
        .collect();
    let bytes = source(0, Codec::None, 0, 3, &records);
    let out = rewrite_bytes(&bytes, LIMIT).expect("rewritten");
    let (h, _) = read(&out[0].bytes);
    assert_eq!((h.base_timestamp, h.max_timestamp), (1_500, 1_500));
    assert_eq!(checked(&out, LIMIT), records);
}

#[test]
fn a_run_larger_than_the_maximum_is_split_in_order() {
    let records: Vec<Owned> = (50..70).map(|o| Owned::new(o, 1_000, &[7; 100])).collect();
    let bytes = source(50, Codec::None, 0, 19, &records);
    let max = HEADER_LEN + 400;
    let out = rewrite_bytes(&bytes, max).expect("rewritten");
    assert!(out.len() >= 5, "{} batches", out.len());
    assert_eq!(
        out.iter().map(|w| w.record_count).sum::<i32>(),
        20,
        "every record once"
    );
    for pair in out.windows(2) {
        assert_eq!(pair[0].next_offset(), pair[1].base_offset);
    }
    assert_eq!(checked(&out, max), records);
}

/// Bytes that do not compress (xorshift64).
fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_be_bytes()[0]
        })
        .collect()
}

#[test]
fn a_record_that_fits_no_batch_alone_is_the_error_naming_it() {
    let noise = noise(1_000);
    let records = [Owned::new(3, 1_000, b"small"), Owned::new(4, 1_000, &noise)];
    let bytes = source(3, Codec::Lz4, 0, 1, &records);
    let max = HEADER_LEN + 500;
    let err = rewrite_bytes(&bytes, max).expect_err("too large");
    assert!(
        matches!(err, RewriteError::RecordTooLarge { offset: 4, size, max: m } if size > m && m == max),
        "{err}"
    );
    assert_eq!(err.class(), "record_too_large");
    assert!(err.to_string().contains("offset 4"), "{err}");

    // A record larger than the limit that compresses below it goes alone, compressed.
    let zeros = [Owned::new(9, 1_000, &[0; 5_000])];
    let bytes = source(9, Codec::Lz4, 0, 0, &zeros);
    let out = rewrite_bytes(&bytes, max).expect("fits compressed");
    assert_eq!(one(&out[0].bytes).header.codec(), Ok(Codec::Lz4));
    assert_eq!(checked(&out, max), zeros);
}

#[test]
fn the_records_before_one_no_batch_can_hold_are_written_in_the_same_pass() {
    let noise = noise(1_000);
    let records = [
        Owned::new(20, 1_000, b"first"),
        Owned::new(21, 1_000, b"second"),
        // 22 compacted away; 23 fits no batch; 24 after it.
        Owned::new(23, 1_000, &noise),
        Owned::new(24, 1_000, b"after"),
    ];
    let max = HEADER_LEN + 500;
    for codec in CODECS {
        let bytes = source(20, codec, 0, 4, &records);
        let b = one(&bytes);
        let refused = rewrite_range_before_refusal(&b, 21..i64::MAX, LIMIT, max)
            .expect_err("23 fits no batch");
        assert!(
            matches!(
                refused.error,
                RewriteError::RecordTooLarge { offset: 23, .. }
            ),
            "{codec:?}: {}",
            refused.error
        );
        // Exactly what a second pass over the offsets before it writes.
        let cut = rewrite_range(&b, 21..23, LIMIT, max).expect("fits");
        assert_eq!(refused.before, cut, "{codec:?}");
        assert_eq!(checked(&refused.before, max), records[1..2].to_vec());
        assert_eq!(
            rewrite_range(&b, 21..i64::MAX, LIMIT, max),
            Err(refused.error.clone())
        );
        // Refused at the range's first record: nothing before it.
        let at = rewrite_range_before_refusal(&b, 23..i64::MAX, LIMIT, max).expect_err("23");
        assert_eq!(at.before, Vec::new(), "{codec:?}");
    }
    // Any other error writes nothing.
    let mut corrupt = source(20, Codec::Lz4, 0, 4, &records);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let refused = rewrite_range_before_refusal(&one(&corrupt), 20..i64::MAX, LIMIT, max)
        .expect_err("the CRC");
    assert_eq!(refused.before, Vec::new());
    assert!(!matches!(
        refused.error,
        RewriteError::RecordTooLarge { .. }
    ));
}

#[test]
fn a_batch_whose_records_were_all_compacted_away_gives_nothing() {
    for codec in [Codec::None, Codec::Zstd] {
        let bytes = source(20, codec, 0, 4, &[]);
        assert_eq!(rewrite_bytes(&bytes, LIMIT), Ok(vec![]), "{}", codec.name());
    }
}

fn sample(base: i64) -> Vec<Owned> {
    let mut records: Vec<Owned> = (0..40)
        .map(|i| {
            Owned::new(
                base + i,
                1_000 + i,
                format!("value {i} ").repeat(30).as_bytes(),
            )
        })
        .collect();
    records[1].key = None;
    records[2].value = None;
    records[3].headers = vec![
        (Vec::new(), Some(Vec::new())),
        (b"a".to_vec(), Some(b"b".to_vec())),
    ];
    records[4].key = Some(Vec::new());
    records
}

#[test]
fn every_codec_writes_what_the_projects_inflate_reads_back() {
    for codec in CODECS {
        let mut records = sample(1_000);
        records.remove(10); // a gap: two runs
        let bytes = source(1_000, codec, 0, 39, &records);
        let out = rewrite_bytes(&bytes, LIMIT).unwrap_or_else(|e| panic!("{}: {e}", codec.name()));
        assert_eq!(runs(&out), [(1_000, 10), (1_011, 29)], "{}", codec.name());
        for w in &out {
            assert_eq!(one(&w.bytes).header.codec(), Ok(codec), "{}", codec.name());
        }
        assert_eq!(checked(&out, LIMIT), records, "{}", codec.name());
    }
}

#[test]
fn snappy_is_written_in_xerial_blocks() {
    let records = sample(0);
    let bytes = source(0, Codec::Snappy, LOG_APPEND_TIME, 39, &records);
    let out = rewrite_bytes(&bytes, LIMIT).expect("rewritten");
    assert_eq!(out[0].bytes[HEADER_LEN..HEADER_LEN + 8], XERIAL_MAGIC);
    // More than one 32 KiB block.
    let big = [Owned::new(0, 1_000, &[1; 100_000])];
    let bytes = source(0, Codec::Snappy, 0, 0, &big);
    let out = rewrite_bytes(&bytes, LIMIT).expect("rewritten");
    assert_eq!(checked(&out, LIMIT), big);
}

#[test]
fn records_that_do_not_compress_are_written_uncompressed() {
    let noise = noise(300);
    let records = [Owned::new(0, 1_000, &noise)];
    let bytes = source(0, Codec::Gzip, LOG_APPEND_TIME, 0, &records);
    let out = rewrite_bytes(&bytes, LIMIT).expect("rewritten");
    assert_eq!(one(&out[0].bytes).header.codec(), Ok(Codec::None));
    assert_eq!(checked(&out, LIMIT), [records[0].with_time(2_000)]);

    // A lone small record between gaps: no codec's framing pays for itself.
    let small = [
        Owned::new(0, 1_000, &[0; 20]),
        Owned::new(2, 1_000, &[0; 20]),
    ];
    let bytes = source(0, Codec::Zstd, 0, 2, &small);
    let out = rewrite_bytes(&bytes, LIMIT).expect("rewritten");
    assert_eq!(runs(&out), [(0, 1), (2, 1)]);
    assert!(
        out.iter()
            .all(|w| one(&w.bytes).header.codec() == Ok(Codec::None))
    );
    assert_eq!(checked(&out, LIMIT), small);
}

#[test]
fn malformed_batches_are_errors() {
    let records = sample(0);
    // A transaction marker.
    let bytes = Source {
        attributes: CONTROL,
        ..Source::data(5, 1, b"x")
    }
    .bytes();
    assert_eq!(
        rewrite_bytes(&bytes, LIMIT),
        Err(RewriteError::Control { base_offset: 5 })
    );
    // A changed byte.
    let mut bytes = source(0, Codec::Lz4, 0, 39, &records);
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let err = rewrite_bytes(&bytes, LIMIT).expect_err("crc");
    assert_eq!(err.class(), "crc");
    // Offsets that go back, and one past the batch's last offset.
    let mut back = records[..3].to_vec();
    back[2].offset = 1;
    let bytes = source(0, Codec::None, 0, 2, &back);
    assert_eq!(
        rewrite_bytes(&bytes, LIMIT),
        Err(RewriteError::Offsets {
            base_offset: 0,
            offset: 1
        })
    );
    let bytes = source(0, Codec::None, 0, 1, &records[..3]);
    assert_eq!(
        rewrite_bytes(&bytes, LIMIT),
        Err(RewriteError::Offsets {
            base_offset: 0,
            offset: 2
        })
    );
    // Records that inflate past the limit.
    let bytes = source(0, Codec::Zstd, 0, 39, &records);
    let err = rewrite(&one(&bytes), 1_000, LIMIT).expect_err("bomb");
    assert_eq!(err.class(), "batch_too_large");
}

type Headers = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Key, value, headers and time delta of a record.
fn owned_record() -> impl Strategy<Value = (Option<Vec<u8>>, Option<Vec<u8>>, Headers, i64)> {
    let bytes = prop::option::of(prop::collection::vec(any::<u8>(), 0..60));
    let header = (prop::collection::vec(any::<u8>(), 0..6), bytes.clone());
    (
        bytes.clone(),
        bytes,
        prop::collection::vec(header, 0..3),
        -5_000i64..5_000,
    )
}

proptest! {
    #[test]
    fn the_outputs_hold_exactly_the_sources_records_at_their_offsets(
        fields in prop::collection::vec(owned_record(), 0..30),
        gaps in prop::collection::vec(0i64..4, 30),
        codec in 0usize..5,
        append_time in any::<bool>(),
        max in HEADER_LEN..HEADER_LEN + 600,
        base in 0i64..1 << 40,
    ) {
        let mut offset = base;
        let mut records = Vec::new();
        for ((key, value, headers, time), gap) in fields.into_iter().zip(gaps) {
            offset += gap;
            records.push(Owned { offset, timestamp: 1_000 + time, key, value, headers });
            offset += 1;
        }
        let last_delta = i32::try_from(offset - base).expect("small").max(1) - 1;
        let flags = if append_time { LOG_APPEND_TIME } else { 0 };
        let bytes = source(base, CODECS[codec], flags, last_delta, &records);
        let expected: Vec<Owned> = records
            .iter()
            .map(|r| if append_time { r.with_time(2_000) } else { r.clone() })
            .collect();
        match rewrite_bytes(&bytes, max) {
            Ok(out) => {
                let inflated = records::open(&one(&bytes), LIMIT).expect("opens").inflated_len();
                let total: usize = out.iter().map(|w| w.bytes.len()).sum();
                prop_assert!(total <= inflated + GROWTH_PER_RECORD * records.len());
                prop_assert_eq!(checked(&out, max), expected);
                for pair in out.windows(2) {
                    prop_assert!(pair[0].next_offset() <= pair[1].base_offset);
                }
            }
            Err(RewriteError::RecordTooLarge { offset, size, max: m }) => {
                prop_assert!(size > m && m == max);
                prop_assert!(records.iter().any(|r| r.offset == offset));
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }

    #[test]
    fn any_bytes_rewrite_without_panic_within_the_limits(
        payload in prop::collection::vec(any::<u8>(), 0..300),
        count in 1i32..20,
        codec in 0usize..5,
        max in 0usize..400,
    ) {
        let bytes = Source {
            attributes: CODECS[codec].attribute(),
            ..Source::data(0, count, &payload)
        }
        .bytes();
        if let Ok(out) = rewrite(&one(&bytes), 4_096, max) {
            prop_assert!(out.len() <= usize::try_from(count).expect("positive"));
            prop_assert!(out.iter().all(|w| w.bytes.len() <= max));
        }
    }
}

/// The record as `tests/kafka/ReadRewrites.java` prints it, at offset `index`.
fn kafka_line(index: usize, r: &Owned) -> String {
    fn hex(b: &Option<Vec<u8>>) -> String {
        b.as_ref().map_or("-".to_string(), |b| {
            b.iter().map(|x| format!("{x:02x}")).collect()
        })
    }
    let mut line = format!("{index} {} {} {}", r.timestamp, hex(&r.key), hex(&r.value));
    for (k, v) in &r.headers {
        line.push_str(&format!(" {}={}", hex(&Some(k.clone())), hex(v)));
    }
    line + "\n"
}

/// Writes rewritten batches of every codec to `$MF_REWRITE_DIR` for Kafka's own reader and
/// produce validation (`tests/kafka/ReadRewrites.java`, which says how to run both).
#[test]
#[ignore = "writes batches for Kafka's reader"]
fn write_batches_for_kafkas_reader() {
    let dir = std::path::PathBuf::from(std::env::var("MF_REWRITE_DIR").expect("MF_REWRITE_DIR"));
    std::fs::create_dir_all(&dir).expect("output folder");
    let mut big = vec![
        Owned::new(0, 1_000, &[3; 200_000]),
        Owned::new(1, 1_000, &noise(100_000)),
    ];
    big[1].headers = vec![(b"a".to_vec(), Some(noise(50)))];
    let mut compacted = sample(0);
    compacted.remove(10);
    let mut n = 0;
    for codec in CODECS {
        for (flags, records, max) in [
            (LOG_APPEND_TIME, &compacted, LIMIT),
            (0, &compacted, HEADER_LEN + 700),
            (0, &big, LIMIT),
        ] {
            let last = i32::try_from(records.last().expect("records").offset).expect("small");
            let bytes = source(0, codec, flags, last, records);
            for w in rewrite_bytes(&bytes, max).expect("rewritten") {
                let (h, read) = read(&w.bytes);
                let name = format!("{}-{n:03}", h.codec().expect("a codec").name());
                let expect: String = read
                    .iter()
                    .enumerate()
                    .map(|(i, r)| kafka_line(i, r))
                    .collect();
                std::fs::write(dir.join(format!("{name}.batch")), &w.bytes).expect("batch");
                std::fs::write(dir.join(format!("{name}.expect")), expect).expect("records");
                n += 1;
            }
        }
    }
}

/// Writes the seeds of the `rewritten_batches` fuzz target (`fuzz/seeds/rewritten_batches/`):
/// a compacted batch in each codec, one stamped with the append time, one split by a small
/// limit, and a record too large for it. Run by hand when the seeds' layout changes.
#[test]
#[ignore = "writes fuzz seeds"]
fn write_rewritten_batches_seeds() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/rewritten_batches");
    std::fs::create_dir_all(&dir).expect("seed folder");
    let mut records: Vec<Owned> = sample(0).into_iter().take(12).collect();
    records.remove(4); // a gap of one: the last offset delta is one past the count
    let seed = |choice: u8, max: u8, codec: Codec, records: &[Owned]| {
        let count = u8::try_from(records.len()).expect("small");
        let mut seed = vec![choice, count, 1, max];
        seed.extend(producer_compress(codec, &plain(0, 0, records)));
        seed
    };
    for (i, codec) in CODECS.iter().enumerate() {
        let choice = u8::try_from(i).expect("small");
        let name = format!("compacted_{}", codec.name());
        std::fs::write(dir.join(name), seed(choice, 255, *codec, &records)).expect("seed");
    }
    let write = |name: &str, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).expect("seed");
    write("append_time_lz4", seed(3 + 5, 255, Codec::Lz4, &records));
    write("split_zstd", seed(4, 40, Codec::Zstd, &records));
    let noisy = [Owned::new(0, 0, &noise(3_000))];
    write("too_large_gzip", seed(1, 100, Codec::Gzip, &noisy));
}

/// Rewrite speed per codec, in MB of records (inflated) per second of this thread's CPU time
/// (Linux's `/proc/thread-self/schedstat`, so that a busy machine does not count), for a 1 MiB
/// batch of 4,096 JSON-like records: stamped with the append time (one run), and compacted (a
/// gap every 8 records).
/// `cargo test --release -p mirrorflow-core --lib rewrite_speed -- --ignored --nocapture`
#[test]
#[ignore = "measures speed"]
fn rewrite_speed() {
    let records: Vec<Owned> = (0..4_096)
        .map(|i| {
            let value = format!(
                r#"{{"id":{i},"user":"user-{}","event":"click","page":"/products/{}","ms":{}}}"#,
                i % 97,
                i % 13,
                i * 7
            );
            Owned::new(i, 1_000 + i, value.repeat(3).as_bytes())
        })
        .collect();
    let compacted: Vec<Owned> = records
        .iter()
        .filter(|r| r.offset % 8 != 7)
        .cloned()
        .collect();
    for codec in CODECS {
        for (name, flags, set) in [
            ("append-time", LOG_APPEND_TIME, &records),
            ("compacted", 0, &compacted),
        ] {
            let bytes = source(0, codec, flags, 4_095, set);
            let batch = one(&bytes);
            let inflated = records::open(&batch, 8 << 20)
                .expect("opens")
                .inflated_len();
            let start = cpu_ns();
            let mut rounds = 0u32;
            let mut written = 0usize;
            while cpu_ns() - start < 500_000_000 {
                let out = rewrite(&batch, 8 << 20, 1 << 20).expect("rewritten");
                written = out.iter().map(|w| w.bytes.len()).sum();
                rounds += 1;
            }
            let seconds = (cpu_ns() - start) as f64 / 1e9;
            let mb_s = f64::from(rounds) * inflated as f64 / seconds / 1e6;
            println!(
                "{:>6} {name:>11}: {mb_s:7.1} MB/s of records; {} bytes in, {written} out",
                codec.name(),
                bytes.len()
            );
        }
    }
}

/// Nanoseconds this thread has run on a CPU.
fn cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("Linux schedstat");
    let ns = stat.split_whitespace().next().expect("run time");
    ns.parse().expect("nanoseconds")
}

mod merge;
