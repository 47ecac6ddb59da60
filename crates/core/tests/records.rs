//! Decoders never panic on arbitrary bytes, and valid records round-trip.

use mirrorflow_core::{Checkpoint, Heartbeat, MAX_OFFSET, OffsetSync, TopicPartition};
use proptest::prelude::*;

fn name() -> impl Strategy<Value = String> {
    // Includes multi-byte UTF-8 so lengths are counted in bytes, not chars.
    "[a-zA-Z0-9._\\-é日]{0,40}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn decoders_never_panic(key in prop::collection::vec(any::<u8>(), 0..64),
                            value in prop::collection::vec(any::<u8>(), 0..64)) {
        // A typed error or a record; reaching the end of this test is the assertion.
        let results = [
            Checkpoint::decode(&key, &value).is_ok(),
            Heartbeat::decode(&key, &value).is_ok(),
            OffsetSync::decode(&key, &value).is_ok(),
        ];
        prop_assert_eq!(results.len(), 3);
    }

    #[test]
    fn checkpoint_round_trips(group in name(), topic in name(), partition in 0..i32::MAX,
                              up in 0..=MAX_OFFSET, down in 0..=MAX_OFFSET, metadata in name(),
                              trailing in prop::collection::vec(any::<u8>(), 0..4)) {
        let cp = Checkpoint {
            group, topic_partition: TopicPartition::new(topic, partition),
            upstream_offset: up, downstream_offset: down, metadata,
        };
        let rec = cp.encode().unwrap();
        let mut value = rec.value.clone();
        value.extend_from_slice(&trailing);
        prop_assert_eq!(Checkpoint::decode(&rec.key, &value).unwrap(), cp);
    }

    #[test]
    fn heartbeat_round_trips(source in name(), target in name(), ts in 0..i64::MAX) {
        let hb = Heartbeat { source_alias: source, target_alias: target, timestamp_ms: ts };
        let rec = hb.encode().unwrap();
        prop_assert_eq!(Heartbeat::decode(&rec.key, &rec.value).unwrap(), hb);
    }

    #[test]
    fn offset_sync_round_trips(topic in name(), partition in 0..i32::MAX,
                               up in 0..=MAX_OFFSET, down in 0..=MAX_OFFSET) {
        let sync = OffsetSync::new(TopicPartition::new(topic, partition), up, down);
        let rec = sync.encode().unwrap();
        prop_assert_eq!(rec.value.len(), 16);
        prop_assert_eq!(OffsetSync::decode(&rec.key, &rec.value).unwrap(), sync);
    }

    #[test]
    fn offsets_beyond_any_log_never_encode(up in (MAX_OFFSET + 1)..=i64::MAX, down in 0..=MAX_OFFSET) {
        let sync = OffsetSync::new(TopicPartition::new("t", 0), up, down);
        prop_assert!(sync.encode().is_err());
        let swapped = OffsetSync::new(TopicPartition::new("t", 0), down, up);
        prop_assert!(swapped.encode().is_err());
    }

    #[test]
    fn negative_offsets_never_encode(up in i64::MIN..0, down in 0..=MAX_OFFSET) {
        let sync = OffsetSync::new(TopicPartition::new("t", 0), up, down);
        prop_assert!(sync.encode().is_err());
        let swapped = OffsetSync::new(TopicPartition::new("t", 0), down, up);
        prop_assert!(swapped.encode().is_err());
    }
}
