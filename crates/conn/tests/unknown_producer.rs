//! Against a real broker (ignored unless asked for: `MF_CONN_BROKER=host:port
//! MF_CONN_TOPIC=<a topic created beforehand, nothing written to its partition 0> cargo test -p
//! mirrorflow-conn --test unknown_producer -- --ignored`): the broker behaviour the writer's
//! rule that a producer's first batch on a partition goes alone rests on. A partition that keeps
//! no sequence of a producer takes its batch at any sequence; the batch before it, written
//! after, is then refused as out of order. So a later batch in flight while the first was
//! refused (a new topic's leader not yet elected) would land first, and the first one never.

use std::time::Duration;

use mirrorflow_conn::{Cluster, ConnError, Options, Security};
use mirrorflow_core::batch::{self, Stamp};
use mirrorflow_core::protocol::{self, ErrorCode, ProduceRequest};

/// A source batch of `n` uncompressed records of one byte, no key, base offset 0.
fn source_batch(n: u8) -> Vec<u8> {
    let mut records = Vec::new();
    for i in 0..n {
        // attributes, timestamp delta 0, offset delta i, key length -1, value length 1, the
        // value, no headers; varints zigzag-encoded (all fit one byte).
        let record = [0, 0, i * 2, 1, 2, b'x', 0];
        records.push(u8::try_from(record.len() * 2).unwrap_or(0));
        records.extend_from_slice(&record);
    }
    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes());
    let length = i32::try_from(batch::HEADER_LEN - 12 + records.len()).unwrap_or(0);
    b.extend_from_slice(&length.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&i32::from(n - 1).to_be_bytes());
    let now = 1_700_000_000_000i64;
    b.extend_from_slice(&now.to_be_bytes());
    b.extend_from_slice(&now.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&i32::from(n).to_be_bytes());
    b.extend_from_slice(&records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

#[test]
#[ignore = "needs a broker: MF_CONN_BROKER and MF_CONN_TOPIC"]
fn a_partition_without_the_producers_state_takes_any_sequence_and_then_refuses_the_first() {
    let broker = std::env::var("MF_CONN_BROKER").expect("MF_CONN_BROKER=host:port");
    let topic = std::env::var("MF_CONN_TOPIC").expect("MF_CONN_TOPIC=<a new topic>");
    let options = Options {
        client_id: "mf-unknown-producer".into(),
        timeout: Duration::from_secs(30),
        max_frame: 1 << 20,
        address_check: None,
    };
    let mut cluster = Cluster::new(&broker, Security::default(), options).expect("an address");
    let metadata = cluster.metadata(&[&topic]).expect("metadata");
    let leader = metadata
        .topic(&topic)
        .and_then(|t| t.partitions.iter().find(|p| p.partition == 0))
        .map(|p| p.leader)
        .expect("partition 0 and its leader");
    let conn = cluster.broker(leader).expect("the leader");
    let (error, producer_id, producer_epoch) = conn
        .ask(
            |id, client| protocol::init_producer_id_request(id, client, None, 30_000),
            protocol::decode_init_producer_id,
        )
        .expect("InitProducerId");
    assert_eq!(error, ErrorCode::NONE);
    let source = source_batch(10);
    let mut write = |base_sequence: i32| -> (ErrorCode, i64) {
        let stamp = Stamp {
            producer_id,
            producer_epoch,
            base_sequence,
            transactional: false,
        };
        let id = conn.correlation();
        let mut request =
            ProduceRequest::new(id, conn.client_id(), None, -1, 30_000, 1 << 16).expect("new");
        request.topic(&topic).expect("topic");
        request
            .partition::<ConnError>(0, |out| {
                let b = batch::batches(&source)
                    .next()
                    .expect("one batch")
                    .expect("a valid batch");
                batch::restamp(&b, &stamp, out).map_err(|e| ConnError::Batch {
                    message: e.to_string(),
                })
            })
            .expect("the batch");
        let frame = request.finish().expect("a frame");
        let body = conn.call(id, &frame).expect("an answer");
        let answer = protocol::decode_produce(&body).expect("a Produce answer");
        let p = &answer.topics[0].1[0];
        (p.error, p.base_offset)
    };
    // The second batch first: taken, at the partition's first offset.
    assert_eq!(write(10), (ErrorCode::NONE, 0));
    // The first batch after it: refused for good.
    assert_eq!(write(0).0, ErrorCode::OUT_OF_ORDER_SEQUENCE_NUMBER);
}
