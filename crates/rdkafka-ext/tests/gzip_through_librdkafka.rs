//! librdkafka's own reads of gzip batches come to the bounded inflater: a consumer of
//! librdkafka's in-process mock broker is refused a bomb, again at every try, and hands out
//! none of its records nor any after it (librdkafka holds the partition at a batch it cannot
//! read); the gzip batches before it are read.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use mirrorflow_rdkafka_ext::gzip::{INFLATE_LIMIT, linked, refused};

const TOPIC: &str = "bombed";

fn produce(bootstrap: &str, values: &[Vec<u8>]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", "gzip")
        .set("linger.ms", "500")
        .set("batch.num.messages", "1000")
        .set("batch.size", "1000000000")
        .set("message.max.bytes", "1000000000")
        .create()
        .expect("producer");
    for v in values {
        producer
            .send(BaseRecord::<(), [u8]>::to(TOPIC).payload(v))
            .expect("queued");
    }
    producer.flush(Duration::from_secs(30)).expect("flushed");
}

#[test]
fn a_gzip_bomb_read_by_librdkafka_is_refused_at_every_try_and_holds_its_partition() {
    // What every binary of the workspace does to get the bounded inflater linked.
    let _ = linked();
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster
        .create_topic(TOPIC, 1, 1)
        .expect("topic on the mock broker");
    let bootstrap = cluster.bootstrap_servers();
    produce(&bootstrap, &[b"before the bomb".to_vec()]);
    // One batch: 40 MiB of zeros, a few tens of KB compressed.
    let mib = 1 << 20;
    let bomb: Vec<Vec<u8>> = (0..INFLATE_LIMIT / mib + 8)
        .map(|_| vec![0u8; mib])
        .collect();
    produce(&bootstrap, &bomb);
    produce(&bootstrap, &[b"after the bomb".to_vec()]);

    let (before, _) = refused();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "reader")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.max.bytes", "100000000")
        .set("receive.message.max.bytes", "200000000")
        .create()
        .expect("consumer");
    consumer.subscribe(&[TOPIC]).expect("subscribed");
    let mut errors = Vec::new();
    let mut read = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => read.push((m.offset(), m.payload().map(<[u8]>::to_vec))),
            Some(Err(e)) => errors.push(e),
            None => {}
        }
    }
    let (after, last) = refused();
    assert!(
        after >= before + 2,
        "librdkafka's reads did not come here, or did not try again: {} refusals",
        after - before
    );
    assert!(
        last.is_some_and(|e| e.to_string().contains("inflate to more than")),
        "the reason"
    );
    assert!(
        errors.iter().any(|e| matches!(
            e,
            KafkaError::MessageConsumption(RDKafkaErrorCode::BadCompression)
        )),
        "the consumer is told: {errors:?}"
    );
    assert_eq!(
        read,
        vec![(0, Some(b"before the bomb".to_vec()))],
        "only the record before the bomb is handed out"
    );
}
