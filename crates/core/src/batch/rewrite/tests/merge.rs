//! [`merge`]: many batches of a partition written as few.

use super::*;

/// Each of `records` in a batch of its own, in `codec`: what a partition written one record at
/// a time holds.
fn singles(codec: Codec, records: &[Owned]) -> Vec<Vec<u8>> {
    records
        .iter()
        .map(|r| source(r.offset, codec, 0, 0, std::slice::from_ref(r)))
        .collect()
}

fn parsed(all: &[Vec<u8>]) -> Vec<Batch<'_>> {
    all.iter().map(|b| one(b)).collect()
}

#[test]
fn batches_of_following_offsets_become_one_batch_in_the_first_ones_codec() {
    for codec in CODECS {
        let records: Vec<Owned> = (500..540)
            .map(|o| Owned::new(o, 1_000 + (o % 7) * 3, b"{\"user\":\"someone\"}"))
            .collect();
        let mut inputs = singles(codec, &records[..20]);
        inputs.push(source(520, Codec::None, 0, 19, &records[20..]));
        let merged = merge(&parsed(&inputs), LIMIT, LIMIT).expect("merged");
        assert_eq!(runs(&merged.batches), [(500, 40)], "{}", codec.name());
        assert_eq!(checked(&merged.batches, LIMIT), records, "{}", codec.name());
        let written = one(&merged.batches[0].bytes).header.codec();
        assert_eq!(written, Ok(codec), "{}", codec.name());
        let inflated: usize = parsed(&inputs)
            .iter()
            .map(|b| records::open(b, LIMIT).expect("opens").inflated_len())
            .sum();
        assert_eq!(merged.inflated, inflated, "{}", codec.name());
    }
}

#[test]
fn tiny_records_keep_their_codec() {
    let records = [Owned::new(0, 1_000, b"a"), Owned::new(1, 1_000, b"b")];
    for codec in CODECS {
        let inputs = singles(codec, &records);
        let merged = merge(&parsed(&inputs), LIMIT, LIMIT).expect("merged");
        let written = one(&merged.batches[0].bytes).header.codec();
        assert_eq!(written, Ok(codec), "{}", codec.name());
        assert_eq!(checked(&merged.batches, LIMIT), records, "{}", codec.name());
    }
}

#[test]
fn a_gap_between_batches_starts_another_batch() {
    // A transaction marker at 3 (left out by the fetcher) between two data batches.
    let records: Vec<Owned> = [0, 1, 2, 4, 5]
        .iter()
        .map(|&o| Owned::new(o, 1_000, b"v"))
        .collect();
    let inputs = [
        source(0, Codec::Lz4, 0, 2, &records[..3]),
        source(4, Codec::Lz4, 0, 1, &records[3..]),
    ];
    let merged = merge(&parsed(&inputs), LIMIT, LIMIT).expect("merged");
    assert_eq!(runs(&merged.batches), [(0, 3), (4, 2)]);
    assert_eq!(checked(&merged.batches, LIMIT), records);
}

#[test]
fn merged_records_are_split_under_the_limit() {
    let records: Vec<Owned> = (0..30).map(|o| Owned::new(o, 1_000, &[7; 100])).collect();
    let inputs = singles(Codec::None, &records);
    let max = HEADER_LEN + 700;
    let merged = merge(&parsed(&inputs), LIMIT, max).expect("merged");
    assert!(
        (4..30).contains(&merged.batches.len()),
        "{} batches",
        merged.batches.len()
    );
    for pair in merged.batches.windows(2) {
        assert_eq!(pair[0].next_offset(), pair[1].base_offset);
    }
    assert_eq!(checked(&merged.batches, max), records);
}

#[test]
fn the_inflate_limit_holds_for_all_the_batches_together() {
    let records: Vec<Owned> = (0..4).map(|o| Owned::new(o, 1_000, &[0; 10_000])).collect();
    let inputs = singles(Codec::Gzip, &records);
    let one_inflated = records::open(&one(&inputs[0]), LIMIT)
        .expect("opens")
        .inflated_len();
    let err = merge(&parsed(&inputs), one_inflated * 3, LIMIT).expect_err("over the limit");
    assert!(
        matches!(
            err,
            RewriteError::Records(RecordsError::BatchTooLarge { base_offset: 3, .. })
        ),
        "{err}"
    );
    assert!(merge(&parsed(&inputs), one_inflated * 4, LIMIT).is_ok());
}

#[test]
fn batches_out_of_order_or_markers_are_errors() {
    let records: Vec<Owned> = (10..14).map(|o| Owned::new(o, 1_000, b"v")).collect();
    let inputs = singles(Codec::Lz4, &records);
    let backwards = [inputs[2].clone(), inputs[1].clone()];
    assert_eq!(
        merge(&parsed(&backwards), LIMIT, LIMIT),
        Err(RewriteError::Offsets {
            base_offset: 11,
            offset: 11
        })
    );
    let twice = [inputs[0].clone(), inputs[0].clone()];
    assert!(matches!(
        merge(&parsed(&twice), LIMIT, LIMIT),
        Err(RewriteError::Offsets { .. })
    ));
    let marker = Source {
        attributes: CONTROL,
        ..Source::data(14, 1, &[0; 12])
    }
    .bytes();
    let with_marker = [inputs[3].clone(), marker];
    assert_eq!(
        merge(&parsed(&with_marker), LIMIT, LIMIT),
        Err(RewriteError::Control { base_offset: 14 })
    );
}

#[test]
fn nothing_merges_to_nothing() {
    assert_eq!(
        merge(&[], LIMIT, LIMIT),
        Ok(Merged {
            batches: vec![],
            inflated: 0
        })
    );
}

proptest! {
    #[test]
    fn merging_keeps_every_record_at_its_offset_however_the_batches_were_cut(
        fields in prop::collection::vec(owned_record(), 1..40),
        cuts in prop::collection::vec(any::<bool>(), 40),
        gaps in prop::collection::vec(0i64..3, 40),
        codec in 0usize..5,
        max in HEADER_LEN + 200..HEADER_LEN + 2_000,
    ) {
        let mut offset = 1_000i64;
        let mut batches: Vec<Vec<Owned>> = vec![Vec::new()];
        for (((key, value, headers, time), cut), gap) in fields.into_iter().zip(cuts).zip(gaps) {
            if cut && !batches.last().is_some_and(Vec::is_empty) {
                batches.push(Vec::new());
                offset += gap;
            }
            let record = Owned { offset, timestamp: 1_000 + time, key, value, headers };
            batches.last_mut().expect("one").push(record);
            offset += 1;
        }
        let inputs: Vec<Vec<u8>> = batches
            .iter()
            .map(|b| {
                let base = b[0].offset;
                let last = i32::try_from(b[b.len() - 1].offset - base).expect("small");
                source(base, CODECS[codec], 0, last, b)
            })
            .collect();
        let expected: Vec<Owned> = batches.into_iter().flatten().collect();
        match merge(&parsed(&inputs), LIMIT, max) {
            Ok(merged) => {
                prop_assert!(merged.batches.len() <= inputs.len() + expected.len());
                prop_assert_eq!(checked(&merged.batches, max), expected);
            }
            Err(RewriteError::RecordTooLarge { offset, .. }) => {
                prop_assert!(expected.iter().any(|r| r.offset == offset));
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }
}
