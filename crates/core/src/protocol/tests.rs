use proptest::prelude::*;

use super::*;

use crate::fields::Fields as Bytes;

fn header(api: i16, version: i16, id: i32) -> Bytes {
    Bytes::default().i16(api).i16(version).i32(id).string("mf")
}

#[test]
fn a_fetch_request_is_laid_out_as_the_spec_lists_it() {
    let partition = FetchPartition {
        partition: 3,
        offset: 42,
        max_bytes: 65536,
    };
    let request = FetchRequest::committed("orders", vec![partition], 1 << 20);
    let expected = header(API_FETCH, 11, 7)
        .i32(-1)
        .i32(100)
        .i32(1)
        .i32(1 << 20)
        .i8(1)
        .i32(0)
        .i32(-1)
        .i32(1)
        .string("orders")
        .i32(1)
        .i32(3)
        .i32(-1)
        .i64(42)
        .i64(-1)
        .i32(65536)
        .i32(0)
        .string("")
        .framed();
    assert_eq!(fetch_request(7, "mf", &request), Ok(expected));
}

#[test]
fn a_fetch_answer_is_read_partition_by_partition() {
    let body = Bytes::default()
        .i32(5)
        .i16(0)
        .i32(0)
        .i32(1)
        .string("orders")
        .i32(2)
        // partition 0: records and one aborted transaction
        .i32(0)
        .i16(0)
        .i64(10)
        .i64(9)
        .i64(0)
        .i32(1)
        .i64(77)
        .i64(4)
        .i32(-1)
        .bytes(b"batches")
        // partition 1: moved, no records (null aborted list and null records)
        .i32(1)
        .i16(6)
        .i64(-1)
        .i64(-1)
        .i64(-1)
        .i32(-1)
        .i32(-1)
        .i32(-1);
    let answer = decode_fetch(&body.0).expect("well-formed answer");
    assert_eq!(answer.throttle_ms, 5);
    let (topic, parts) = &answer.topics[0];
    assert_eq!(topic, "orders");
    assert_eq!(parts[0].records, b"batches");
    assert_eq!(parts[0].aborted, vec![(77, 4)]);
    assert_eq!(
        (parts[0].high_watermark, parts[0].last_stable_offset),
        (10, 9)
    );
    assert_eq!(parts[1].error, ErrorCode::NOT_LEADER_OR_FOLLOWER);
    assert!(parts[1].error.is_retriable());
    assert!(parts[1].records.is_empty());

    for cut in 0..body.0.len() {
        assert!(
            decode_fetch(&body.0[..cut]).is_err(),
            "an answer cut at {cut} bytes is an error"
        );
    }
}

#[test]
fn a_produce_request_carries_its_batches_as_written_in_place() {
    let mut request = ProduceRequest::new(9, "mf", None, -1, 30_000, 64).expect("short fields");
    request.topic("orders.copy").expect("short name");
    request
        .partition::<EncodeError>(0, |out| {
            out.extend_from_slice(b"batch-0");
            Ok(())
        })
        .expect("written");
    let refused = request.partition(1, |out| {
        out.extend_from_slice(b"half");
        Err(EncodeError::NoTopic { field: "test" })
    });
    assert!(refused.is_err());
    request
        .partition::<EncodeError>(2, |out| {
            out.extend_from_slice(b"batch-2");
            Ok(())
        })
        .expect("written");
    let expected = header(API_PRODUCE, 8, 9)
        .i16(-1)
        .i16(-1)
        .i32(30_000)
        .i32(1)
        .string("orders.copy")
        .i32(2)
        .i32(0)
        .bytes(b"batch-0")
        .i32(2)
        .bytes(b"batch-2")
        .framed();
    assert_eq!(
        request.finish(),
        Ok(expected),
        "a refused partition leaves nothing behind"
    );
}

#[test]
fn a_partition_before_its_topic_is_refused() {
    let mut request = ProduceRequest::new(1, "mf", Some("t"), -1, 1, 0).expect("short fields");
    assert_eq!(
        request.partition::<EncodeError>(0, |_| Ok(())),
        Err(EncodeError::NoTopic { field: "partition" })
    );
}

#[test]
fn a_produce_answer_gives_base_offsets_and_errors() {
    let body = Bytes::default()
        .i32(1)
        .string("orders.copy")
        .i32(2)
        .i32(0)
        .i16(0)
        .i64(500)
        .i64(-1)
        .i64(0)
        .i32(0)
        .i16(-1)
        .i32(1)
        .i16(87)
        .i64(-1)
        .i64(-1)
        .i64(0)
        .i32(1)
        .i32(0)
        .string("crc")
        .string("invalid record")
        .i32(3);
    let answer = decode_produce(&body.0).expect("well-formed answer");
    assert_eq!(answer.throttle_ms, 3);
    let parts = &answer.topics[0].1;
    assert_eq!(parts[0].base_offset, 500);
    assert!(!parts[0].error.is_error());
    assert_eq!(parts[1].error.name(), "INVALID_RECORD");
    assert!(!parts[1].error.is_retriable());
    assert_eq!(parts[1].record_errors, vec![(0, "crc".to_owned())]);
    assert_eq!(parts[1].message, "invalid record");
}

#[test]
fn api_versions_and_producer_ids_round_trip() {
    assert_eq!(
        api_versions_request(3, "mf"),
        Ok(header(API_VERSIONS, 0, 3).framed())
    );
    let body = Bytes::default()
        .i16(0)
        .i32(2)
        .i16(0)
        .i16(0)
        .i16(9)
        .i16(1)
        .i16(0)
        .i16(13);
    let (error, served) = decode_api_versions(&body.0).expect("well-formed");
    assert_eq!(error, ErrorCode::NONE);
    assert_eq!(
        served[1],
        ApiRange {
            api: 1,
            min: 0,
            max: 13
        }
    );

    assert_eq!(
        init_producer_id_request(4, "mf", None, 60_000),
        Ok(header(API_INIT_PRODUCER_ID, 1, 4)
            .i16(-1)
            .i32(60_000)
            .framed())
    );
    let body = Bytes::default().i32(0).i16(0).i64(1234).i16(2);
    assert_eq!(
        decode_init_producer_id(&body.0),
        Ok((ErrorCode::NONE, 1234, 2))
    );
}

#[test]
fn sasl_handshake_and_authenticate_round_trip() {
    assert_eq!(
        sasl_handshake_request(5, "mf", "SCRAM-SHA-512"),
        Ok(header(API_SASL_HANDSHAKE, 1, 5)
            .string("SCRAM-SHA-512")
            .framed())
    );
    let body = Bytes::default()
        .i16(33)
        .i32(2)
        .string("PLAIN")
        .string("SCRAM-SHA-256")
        .0;
    let (error, mechanisms) = decode_sasl_handshake(&body).expect("well-formed");
    assert_eq!(error.name(), "UNSUPPORTED_SASL_MECHANISM");
    assert_eq!(mechanisms, ["PLAIN", "SCRAM-SHA-256"]);

    assert_eq!(
        sasl_authenticate_request(6, "mf", b"n,,n=user,r=abc"),
        Ok(header(API_SASL_AUTHENTICATE, 1, 6)
            .bytes(b"n,,n=user,r=abc")
            .framed())
    );
    let body = Bytes::default()
        .i16(58)
        .string("Authentication failed")
        .bytes(b"")
        .i64(0)
        .0;
    let answer = decode_sasl_authenticate(&body).expect("well-formed");
    assert_eq!(answer.error.name(), "SASL_AUTHENTICATION_FAILED");
    assert_eq!(answer.message, "Authentication failed");
    let body = Bytes::default()
        .i16(0)
        .i16(-1)
        .bytes(b"v=sig")
        .i64(3_600_000)
        .0;
    let answer = decode_sasl_authenticate(&body).expect("well-formed");
    assert_eq!(
        (answer.auth_bytes, answer.session_lifetime_ms),
        (&b"v=sig"[..], 3_600_000)
    );
}

#[test]
fn an_answer_to_another_request_is_refused() {
    let frame = Bytes::default().i32(8).i16(0).0;
    assert_eq!(answer_body(&frame, 8), Ok(&[0u8, 0][..]));
    assert!(matches!(
        answer_body(&frame, 9),
        Err(DecodeError::Mismatch {
            expected: 9,
            got: 8,
            ..
        })
    ));
}

#[test]
fn a_huge_array_count_is_a_truncation_not_an_allocation() {
    let body = Bytes::default().i32(0).i16(0).i32(0).i32(i32::MAX).0;
    assert!(matches!(
        decode_fetch(&body),
        Err(DecodeError::Truncated { .. })
    ));
    let body = Bytes::default().i32(-2).0;
    assert!(matches!(
        decode_produce(&body),
        Err(DecodeError::Negative { .. })
    ));
}

proptest! {
    #[test]
    fn any_answer_bytes_decode_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_fetch(&bytes);
        let _ = decode_produce(&bytes);
        let _ = decode_api_versions(&bytes);
        let _ = decode_init_producer_id(&bytes);
        let _ = decode_sasl_handshake(&bytes);
        let _ = decode_sasl_authenticate(&bytes);
        let _ = metadata::decode_metadata(&bytes);
        let _ = list_offsets::decode_list_offsets(&bytes);
        let _ = answer_body(&bytes, 0);
    }
}
