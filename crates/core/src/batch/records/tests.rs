use std::io::Write;

use proptest::prelude::*;

use super::*;
use crate::batch::{CRC_AT, Codec, LOG_OVERHEAD, batches};

type Owned = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(Vec<u8>, Option<Vec<u8>>)>,
);

fn zigzag(v: i64, out: &mut Vec<u8>) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn nullable(b: &Option<Vec<u8>>, out: &mut Vec<u8>) {
    match b {
        None => zigzag(-1, out),
        Some(b) => {
            zigzag(i64::try_from(b.len()).expect("small"), out);
            out.extend_from_slice(b);
        }
    }
}

/// The records part of a batch as a producer writes it, uncompressed.
fn plain_records(records: &[Owned]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, (key, value, headers)) in records.iter().enumerate() {
        let mut body = vec![0u8];
        zigzag(i64::try_from(i).expect("small") * 10, &mut body); // timestamp delta
        zigzag(i64::try_from(i).expect("small"), &mut body); // offset delta
        nullable(key, &mut body);
        nullable(value, &mut body);
        zigzag(i64::try_from(headers.len()).expect("small"), &mut body);
        for (k, v) in headers {
            nullable(&Some(k.clone()), &mut body);
            nullable(v, &mut body);
        }
        zigzag(i64::try_from(body.len()).expect("small"), &mut out);
        out.extend(body);
    }
    out
}

/// `plain` compressed as a producer might (snappy as one raw block).
pub(crate) fn compress(codec: Codec, plain: &[u8]) -> Vec<u8> {
    match codec {
        Codec::None => plain.to_vec(),
        Codec::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(plain).expect("in memory");
            e.finish().expect("in memory")
        }
        Codec::Snappy => snap::raw::Encoder::new()
            .compress_vec(plain)
            .expect("in memory"),
        Codec::Lz4 => {
            let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
            e.write_all(plain).expect("in memory");
            e.finish().expect("in memory")
        }
        Codec::Zstd => {
            ruzstd::encoding::compress_to_vec(plain, ruzstd::encoding::CompressionLevel::Fastest)
        }
    }
}

fn codec_bits(codec: Codec) -> i16 {
    match codec {
        Codec::None => 0,
        Codec::Gzip => 1,
        Codec::Snappy => 2,
        Codec::Lz4 => 3,
        Codec::Zstd => 4,
    }
}

/// A whole batch at `base_offset` holding `count` records whose (possibly compressed) bytes are
/// `payload`, with a valid CRC.
pub(crate) fn batch_bytes(base_offset: i64, codec: Codec, count: i32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&base_offset.to_be_bytes());
    let length = i32::try_from(HEADER_LEN - LOG_OVERHEAD + payload.len()).expect("small");
    b.extend_from_slice(&length.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&codec_bits(codec).to_be_bytes());
    b.extend_from_slice(&(count - 1).max(0).to_be_bytes());
    b.extend_from_slice(&1_000i64.to_be_bytes());
    b.extend_from_slice(&2_000i64.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&count.to_be_bytes());
    b.extend_from_slice(payload);
    let crc = crc32c::crc32c(&b[CRC_FROM..]);
    b[CRC_AT..CRC_FROM].copy_from_slice(&crc.to_be_bytes());
    b
}

fn encode(base_offset: i64, codec: Codec, records: &[Owned]) -> Vec<u8> {
    let count = i32::try_from(records.len()).expect("small");
    batch_bytes(
        base_offset,
        codec,
        count,
        &compress(codec, &plain_records(records)),
    )
}

fn decode(bytes: &[u8], limit: usize) -> Result<Vec<Owned>, RecordsError> {
    let mut out = Vec::new();
    for b in batches(bytes) {
        let opened = open(&b?, limit)?;
        for r in opened.records() {
            let r = r?;
            out.push((
                r.key.map(<[u8]>::to_vec),
                r.value.map(<[u8]>::to_vec),
                r.headers
                    .iter()
                    .map(|h| (h.key.to_vec(), h.value.map(<[u8]>::to_vec)))
                    .collect(),
            ));
        }
    }
    Ok(out)
}

const CODECS: [Codec; 5] = [
    Codec::None,
    Codec::Gzip,
    Codec::Snappy,
    Codec::Lz4,
    Codec::Zstd,
];

fn sample() -> Vec<Owned> {
    vec![
        (Some(b"k1".to_vec()), Some(b"v1".to_vec()), vec![]),
        (None, None, vec![(b"h".to_vec(), None)]),
        (
            Some(Vec::new()),
            Some(vec![7; 3000]),
            vec![
                (b"a".to_vec(), Some(b"b".to_vec())),
                (Vec::new(), Some(Vec::new())),
            ],
        ),
    ]
}

#[test]
fn records_of_every_codec_read_back_with_offsets_and_timestamps() {
    for codec in CODECS {
        let bytes = encode(40, codec, &sample());
        assert_eq!(
            decode(&bytes, 1 << 20).unwrap_or_else(|e| panic!("{}: {e}", codec.name())),
            sample()
        );
        let b = batches(&bytes).next().expect("one").expect("valid");
        let opened = open(&b, 1 << 20).expect("opens");
        let stamps: Vec<(i64, i64)> = opened
            .records()
            .map(|r| r.map(|r| (r.offset, r.timestamp)).expect("valid"))
            .collect();
        assert_eq!(stamps, [(40, 1_000), (41, 1_010), (42, 1_020)]);
    }
}

#[test]
fn a_bomb_is_refused_as_batch_too_large_naming_its_offset_and_the_cap() {
    // 64 records of 1 MiB of zeros: a few hundred KB compressed, 64 MiB inflated.
    let zeros = vec![0u8; 1 << 20];
    let records: Vec<Owned> = (0..64)
        .map(|_| (None, Some(zeros.clone()), vec![]))
        .collect();
    for codec in [Codec::Gzip, Codec::Lz4, Codec::Zstd, Codec::Snappy] {
        let bytes = encode(7, codec, &records);
        assert!(
            bytes.len() < 4 << 20,
            "{}: {} bytes",
            codec.name(),
            bytes.len()
        );
        let err = decode(&bytes, 8 << 20).expect_err(codec.name());
        assert_eq!(
            err,
            RecordsError::BatchTooLarge {
                base_offset: 7,
                limit: 8 << 20
            },
            "{}",
            codec.name()
        );
        assert_eq!(err.class(), "batch_too_large");
        assert!(err.to_string().contains("offset 7") && err.to_string().contains("8388608"));
    }
}

#[test]
fn a_changed_byte_is_a_crc_error_before_anything_is_inflated() {
    let mut bytes = encode(0, Codec::Gzip, &sample());
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    assert!(matches!(
        decode(&bytes, 1 << 20),
        Err(RecordsError::Batch(BatchError::Crc { .. }))
    ));
}

#[test]
fn counts_and_lengths_beyond_the_bytes_left_are_corrupt_records() {
    let plain = plain_records(&sample());
    // More records announced than written.
    let more = batch_bytes(0, Codec::None, 4, &plain);
    assert!(matches!(
        decode(&more, 1 << 20),
        Err(RecordsError::CorruptRecord { index: 3, .. })
    ));
    // Fewer announced than written.
    let fewer = batch_bytes(0, Codec::None, 2, &plain);
    assert!(matches!(
        decode(&fewer, 1 << 20),
        Err(RecordsError::CorruptRecord { index: 2, .. })
    ));
    // A header count of a billion in a record of a few bytes.
    let mut body = vec![0u8, 0, 0];
    zigzag(-1, &mut body);
    zigzag(-1, &mut body);
    zigzag(1_000_000_000, &mut body);
    let mut rec = Vec::new();
    zigzag(i64::try_from(body.len()).expect("small"), &mut rec);
    rec.extend(body);
    let bytes = batch_bytes(0, Codec::None, 1, &rec);
    assert!(matches!(
        decode(&bytes, 1 << 20),
        Err(RecordsError::CorruptRecord { index: 0, what, .. }) if what.contains("headers")
    ));
}

fn owned() -> impl Strategy<Value = Owned> {
    let bytes = prop::option::of(prop::collection::vec(any::<u8>(), 0..40));
    let header = (prop::collection::vec(any::<u8>(), 0..8), bytes.clone());
    (bytes.clone(), bytes, prop::collection::vec(header, 0..3))
}

proptest! {
    #[test]
    fn whatever_is_encoded_decodes_to_itself(
        records in prop::collection::vec(owned(), 1..12),
        codec in 0usize..5,
    ) {
        let codec = CODECS[codec];
        let bytes = encode(3, codec, &records);
        prop_assert_eq!(decode(&bytes, 1 << 20).expect("round trip"), records);
    }

    #[test]
    fn any_bytes_behind_a_valid_header_end_in_records_or_an_error(
        payload in prop::collection::vec(any::<u8>(), 0..300),
        count in -2i32..20,
        codec in 0usize..5,
    ) {
        let bytes = batch_bytes(0, CODECS[codec], count, &payload);
        if let Some(Ok(b)) = batches(&bytes).next() && let Ok(opened) = open(&b, 4096) {
            prop_assert!(opened.inflated_len() <= 4096);
            prop_assert!(opened.records().count() <= usize::try_from(count.max(0)).unwrap_or(0) + 1);
        }
    }
}

/// Writes the seeds of the `batch_records` fuzz target (`fuzz/seeds/batch_records/`): one per
/// codec, and a small bomb. Run by hand when the record format of the seeds changes.
#[test]
#[ignore = "writes fuzz seeds"]
fn write_batch_records_seeds() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/batch_records");
    std::fs::create_dir_all(&dir).expect("seed folder");
    let plain = plain_records(&sample());
    for (i, codec) in CODECS.iter().enumerate() {
        let choice = u8::try_from(i + 5 * sample().len()).expect("small");
        let mut seed = vec![choice];
        seed.extend(compress(*codec, &plain));
        std::fs::write(dir.join(codec.name()), seed).expect("seed");
    }
    // Just over the fuzz body's 1 MiB cap.
    let zeros: Vec<Owned> = (0..3)
        .map(|_| (None, Some(vec![0u8; 400_000]), vec![]))
        .collect();
    let mut bomb = vec![1 + 5 * 3];
    bomb.extend(compress(Codec::Gzip, &plain_records(&zeros)));
    std::fs::write(dir.join("gzip_bomb_1_2mb"), bomb).expect("seed");
}
