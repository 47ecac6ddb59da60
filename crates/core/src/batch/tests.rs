use proptest::prelude::*;

use super::*;

/// A batch as a source producer and broker wrote it, with a valid CRC.
pub(super) struct Source {
    pub(super) base_offset: i64,
    pub(super) leader_epoch: i32,
    pub(super) attributes: i16,
    pub(super) last_offset_delta: i32,
    pub(super) producer_id: i64,
    pub(super) producer_epoch: i16,
    pub(super) base_sequence: i32,
    pub(super) record_count: i32,
    pub(super) records: Vec<u8>,
}

impl Source {
    pub(super) fn data(base_offset: i64, count: i32, records: &[u8]) -> Self {
        Self {
            base_offset,
            leader_epoch: 7,
            attributes: 3, // lz4
            last_offset_delta: count - 1,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            record_count: count,
            records: records.to_vec(),
        }
    }

    fn transactional(mut self, producer_id: i64) -> Self {
        self.attributes |= TRANSACTIONAL;
        self.producer_id = producer_id;
        self.producer_epoch = 0;
        self.base_sequence = 0;
        self
    }

    /// A transaction marker of `producer_id`: one uncompressed control record whose key is
    /// (version 0, `kind`) and whose value is (version 0, coordinator epoch 0).
    fn marker(base_offset: i64, producer_id: i64, kind: i16) -> Self {
        let mut record = vec![0u8]; // attributes
        record.push(0); // timestamp delta 0
        record.push(0); // offset delta 0
        record.push(8); // key length 4, zigzag
        record.extend_from_slice(&0i16.to_be_bytes());
        record.extend_from_slice(&kind.to_be_bytes());
        record.push(12); // value length 6
        record.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        record.push(0); // no headers
        let mut records = vec![u8::try_from(record.len() * 2).expect("short record")];
        records.extend(record);
        Self {
            attributes: CONTROL | TRANSACTIONAL,
            ..Self::data(base_offset, 1, &records).transactional(producer_id)
        }
    }

    pub(super) fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.base_offset.to_be_bytes());
        let length = i32::try_from(HEADER_LEN - LOG_OVERHEAD + self.records.len()).expect("small");
        b.extend_from_slice(&length.to_be_bytes());
        b.extend_from_slice(&self.leader_epoch.to_be_bytes());
        b.push(2);
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&self.attributes.to_be_bytes());
        b.extend_from_slice(&self.last_offset_delta.to_be_bytes());
        b.extend_from_slice(&1_000i64.to_be_bytes());
        b.extend_from_slice(&2_000i64.to_be_bytes());
        b.extend_from_slice(&self.producer_id.to_be_bytes());
        b.extend_from_slice(&self.producer_epoch.to_be_bytes());
        b.extend_from_slice(&self.base_sequence.to_be_bytes());
        b.extend_from_slice(&self.record_count.to_be_bytes());
        b.extend_from_slice(&self.records);
        let crc = crc32c::crc32c(&b[CRC_FROM..]);
        b[CRC_AT..CRC_FROM].copy_from_slice(&crc.to_be_bytes());
        b
    }
}

fn all(records: &[u8]) -> Vec<Batch<'_>> {
    batches(records)
        .collect::<Result<_, _>>()
        .expect("well-formed batches")
}

#[test]
fn the_crc_is_castagnolis() {
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    // RFC 3720 (iSCSI) B.4: 32 bytes of zeros.
    assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8A91_36AA);
}

#[test]
fn a_fetch_answer_splits_into_its_complete_batches() {
    let mut fetched = Source::data(10, 5, b"compressed").bytes();
    fetched.extend(Source::data(15, 2, b"more").bytes());
    let cut = Source::data(17, 1, b"cut").bytes();
    fetched.extend(&cut[..20]);
    let mut it = batches(&fetched);
    let first = it.next().expect("a batch").expect("well formed");
    assert_eq!(first.header.base_offset, 10);
    assert_eq!(first.header.next_offset(), 15);
    assert_eq!(first.header.codec(), Ok(Codec::Lz4));
    assert_eq!(first.header.leader_epoch, 7);
    assert_eq!(&first.bytes()[HEADER_LEN..], b"compressed");
    let second = it.next().expect("a batch").expect("well formed");
    assert_eq!(second.header.last_offset(), 16);
    assert!(
        it.next().is_none(),
        "the cut batch is left for the next fetch"
    );
    assert_eq!(it.partial_len(), 20);
    assert_eq!(batches(&fetched[..8]).count(), 0, "less than a header");
}

#[test]
fn malformed_batches_end_the_answer_with_an_error_naming_the_offset() {
    let mut old = Source::data(3, 1, b"x").bytes();
    old[MAGIC_AT] = 1;
    let mut it = batches(&old);
    assert_eq!(
        it.next().map(|r| r.map(|b| b.header)),
        Some(Err(BatchError::Magic {
            base_offset: 3,
            magic: 1
        }))
    );
    assert!(it.next().is_none(), "nothing after an error");

    for length in [-5i32, 10, i32::MIN] {
        let mut short = Source::data(3, 1, b"x").bytes();
        short[8..12].copy_from_slice(&length.to_be_bytes());
        let e = batches(&short).next().expect("an item").map(|b| b.header);
        assert_eq!(
            e,
            Err(BatchError::Length {
                base_offset: 3,
                length
            })
        );
    }

    let mut negative = Source::data(3, 1, b"x");
    negative.last_offset_delta = -1;
    let bytes = negative.bytes();
    assert!(matches!(
        batches(&bytes).next(),
        Some(Err(BatchError::Range { .. }))
    ));

    let mut codec = Source::data(3, 1, b"x");
    codec.attributes = 6;
    let bytes = codec.bytes();
    assert_eq!(
        all(&bytes)[0].header.codec(),
        Err(BatchError::Codec {
            base_offset: 3,
            codec: 6
        })
    );
}

#[test]
fn compacted_batches_and_broker_timestamps_are_not_copied_whole() {
    let plain = Source::data(0, 3, b"x").bytes();
    assert_eq!(all(&plain)[0].header.whole(), Ok(()));

    let mut compacted = Source::data(0, 3, b"x");
    compacted.last_offset_delta = 4; // two of five records compacted away
    let bytes = compacted.bytes();
    assert_eq!(all(&bytes)[0].header.whole(), Err(NotWhole::OffsetGaps));

    let mut appended = Source::data(0, 3, b"x");
    appended.attributes |= LOG_APPEND_TIME;
    let bytes = appended.bytes();
    assert_eq!(all(&bytes)[0].header.whole(), Err(NotWhole::LogAppendTime));
}

#[test]
fn aborted_transactions_and_markers_are_not_copied() {
    let mut log = Vec::new();
    log.extend(Source::data(0, 2, b"plain").bytes());
    log.extend(Source::data(2, 3, b"p7-aborted").transactional(7).bytes());
    log.extend(Source::data(5, 1, b"p8-committed").transactional(8).bytes());
    log.extend(Source::marker(6, 7, ABORT_MARKER).bytes());
    log.extend(Source::marker(7, 8, 1).bytes());
    log.extend(Source::data(8, 2, b"p7-later").transactional(7).bytes());
    let batches = all(&log);
    let mut committed = Committed::new(&[(7, 2)]);
    let admitted: Vec<Admission> = batches
        .iter()
        .map(|b| committed.admit(b).expect("readable"))
        .collect();
    assert_eq!(
        admitted,
        [
            Admission::Copy,
            Admission::Aborted,
            Admission::Copy,
            Admission::Marker,
            Admission::Marker,
            Admission::Copy,
        ],
        "producer 7's next transaction, after its abort marker, is committed data"
    );
}

#[test]
fn a_fetch_from_inside_a_batch_copies_what_follows_and_moves_past_markers() {
    let mut log = Vec::new();
    log.extend(Source::data(0, 4, b"already-copied").bytes());
    log.extend(Source::data(4, 3, b"p7-aborted").transactional(7).bytes());
    log.extend(Source::marker(7, 7, ABORT_MARKER).bytes());
    log.extend(Source::data(8, 2, b"next").bytes());
    let sizes: Vec<usize> = all(&log).iter().map(|b| b.bytes().len()).collect();
    let next_start = sizes[0] + sizes[1] + sizes[2];
    // The first batch ends before offset 4: a broker may send it again; it is not copied.
    let mut cut = log.clone();
    cut.extend_from_slice(&Source::data(10, 1, b"partial").bytes()[..20]);
    assert_eq!(
        to_copy(&cut, &[(7, 4)], 4),
        Ok(ToCopy {
            ranges: std::iter::once(next_start..next_start + sizes[3]).collect(),
            next_offset: 10,
            partial: 20,
        })
    );
    // From the start: the first batch too.
    let from_zero = to_copy(&log, &[(7, 4)], 0).expect("readable");
    assert_eq!(from_zero.ranges[0], 0..sizes[0]);
    assert_eq!(from_zero.ranges.len(), 2);
    // Only the aborted batch and its marker: nothing to copy, and the position moves past them.
    let tail = &log[sizes[0]..next_start];
    assert_eq!(
        to_copy(tail, &[(7, 4)], 4),
        Ok(ToCopy {
            ranges: vec![],
            next_offset: 8,
            partial: 0,
        })
    );
    // Nothing whole: the position stays.
    assert_eq!(
        to_copy(&log[..30], &[], 0),
        Ok(ToCopy {
            ranges: vec![],
            next_offset: 0,
            partial: 30,
        })
    );
}

#[test]
fn an_aborted_transaction_opens_at_its_first_offset_not_before() {
    let mut log = Source::data(0, 2, b"before").transactional(7).bytes();
    log.extend(Source::data(2, 2, b"aborted").transactional(7).bytes());
    let mut committed = Committed::new(&[(7, 2)]);
    let admitted: Vec<Admission> = all(&log)
        .iter()
        .map(|b| committed.admit(b).expect("readable"))
        .collect();
    assert_eq!(admitted, [Admission::Copy, Admission::Aborted]);
}

#[test]
fn an_unreadable_marker_is_an_error() {
    let mut marker = Source::marker(6, 7, ABORT_MARKER);
    marker.records.truncate(3);
    let bytes = marker.bytes();
    let batch = all(&bytes)[0];
    assert_eq!(
        Committed::new(&[]).admit(&batch),
        Err(BatchError::ControlRecord { base_offset: 6 })
    );
}

#[test]
fn a_restamped_batch_carries_the_copying_producer_and_a_valid_crc() {
    let source = Source::data(40, 5, b"compressed-records").transactional(99);
    let bytes = source.bytes();
    let batch = all(&bytes)[0];
    let stamp = Stamp {
        producer_id: 12,
        producer_epoch: 3,
        base_sequence: 250,
        transactional: false,
    };
    let mut out = b"request-so-far".to_vec();
    restamp(&batch, &stamp, &mut out).expect("an intact batch");
    let copy = &out[14..];
    assert_eq!(copy.len(), bytes.len());
    let h = all(copy)[0].header;
    assert_eq!(h.base_offset, 0, "the target broker assigns offsets");
    assert_eq!(h.leader_epoch, -1);
    assert_eq!(h.attributes, 3, "codec kept, not transactional");
    assert_eq!((h.last_offset_delta, h.record_count), (4, 5));
    assert_eq!((h.base_timestamp, h.max_timestamp), (1_000, 2_000));
    assert_eq!(
        (h.producer_id, h.producer_epoch, h.base_sequence),
        (12, 3, 250)
    );
    assert_eq!(h.crc, crc32c::crc32c(&copy[CRC_FROM..]));
    assert_eq!(&copy[HEADER_LEN..], b"compressed-records");

    let mut out = Vec::new();
    let stamp = Stamp {
        transactional: true,
        ..stamp
    };
    restamp(&batch, &stamp, &mut out).expect("an intact batch");
    assert!(all(&out)[0].header.is_transactional());
}

#[test]
fn a_damaged_batch_is_not_given_a_fresh_crc() {
    let mut bytes = Source::data(40, 5, b"compressed-records").bytes();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let batch = all(&bytes)[0];
    let stamp = Stamp {
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        transactional: false,
    };
    let mut out = Vec::new();
    assert!(matches!(
        restamp(&batch, &stamp, &mut out),
        Err(BatchError::Crc {
            base_offset: 40,
            ..
        })
    ));
    assert!(out.is_empty());
}

#[test]
fn sequences_wrap_after_the_largest_int32() {
    assert_eq!(next_sequence(0, 5), 5);
    assert_eq!(next_sequence(i32::MAX - 5, 5), i32::MAX);
    assert_eq!(next_sequence(i32::MAX - 1, 5), 3);
    assert_eq!(next_sequence(i32::MAX, 1), 0);
}

proptest! {
    #[test]
    fn any_bytes_split_without_panic_and_within_the_input(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut it = batches(&bytes);
        let mut taken = 0usize;
        for b in &mut it {
            let Ok(b) = b else { break };
            prop_assert!(b.bytes().len() >= HEADER_LEN);
            taken += b.bytes().len();
            let _ = Committed::new(&[(b.header.producer_id, 0)]).admit(&b);
        }
        prop_assert!(taken + it.partial_len() <= bytes.len());
    }

    #[test]
    fn restamping_keeps_records_and_yields_a_valid_batch(
        records in prop::collection::vec(any::<u8>(), 0..200),
        count in 1i32..50,
        base in 0i64..1 << 40,
        producer_id in -1i64..1 << 40,
        sequence in 0i32..i32::MAX,
    ) {
        let bytes = Source::data(base, count, &records).bytes();
        let batch = all(&bytes)[0];
        let stamp = Stamp { producer_id, producer_epoch: 0, base_sequence: sequence, transactional: false };
        let mut out = Vec::new();
        prop_assert!(restamp(&batch, &stamp, &mut out).is_ok());
        let copy = all(&out)[0];
        prop_assert_eq!(copy.header.crc, crc32c::crc32c(&out[CRC_FROM..]));
        prop_assert_eq!(&out[HEADER_LEN..], &records[..]);
        prop_assert_eq!(copy.header.record_count, count);
        prop_assert_eq!(copy.header.base_sequence, sequence);
    }
}
