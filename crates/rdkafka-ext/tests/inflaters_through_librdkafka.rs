//! librdkafka's own reads of compressed batches come to the bounded inflaters, in every codec
//! its producer writes: a consumer of librdkafka's in-process mock broker is refused a bomb,
//! again at every try, and hands out none of its records nor any after it (librdkafka holds
//! the partition at a batch it cannot read); the batches before it are read. This test binary
//! is linked as the replicator's is (`--wrap`s from the build script, [`linked`] called).

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use mirrorflow_rdkafka_ext::inflater::{INFLATE_LIMIT, linked, refused, wrapped_here};

fn produce(bootstrap: &str, topic: &str, codec: &str, values: &[Vec<u8>]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", codec)
        .set("linger.ms", "500")
        .set("batch.num.messages", "1000")
        .set("batch.size", "1000000000")
        .set("message.max.bytes", "1000000000")
        .create()
        .expect("producer");
    for v in values {
        producer
            .send(BaseRecord::<(), [u8]>::to(topic).payload(v))
            .expect("queued");
    }
    producer.flush(Duration::from_secs(30)).expect("flushed");
}

#[test]
fn this_binary_is_linked_to_the_wrapped_inflaters() {
    assert!(wrapped_here());
}

#[test]
fn a_gzip_bomb_read_by_librdkafka_is_refused_at_every_try_and_holds_its_partition() {
    a_bomb_is_refused_at_every_try_and_holds_its_partition("gzip");
}

#[test]
fn an_lz4_bomb_read_by_librdkafka_is_refused_at_every_try_and_holds_its_partition() {
    a_bomb_is_refused_at_every_try_and_holds_its_partition("lz4");
}

#[test]
fn a_zstd_bomb_read_by_librdkafka_is_refused_at_every_try_and_holds_its_partition() {
    a_bomb_is_refused_at_every_try_and_holds_its_partition("zstd");
}

/// librdkafka's producer writes one raw snappy block per batch (no xerial framing): refused by
/// the length it declares, before librdkafka allocates it.
#[test]
fn a_snappy_bomb_read_by_librdkafka_is_refused_at_every_try_and_holds_its_partition() {
    a_bomb_is_refused_at_every_try_and_holds_its_partition("snappy");
}

fn a_bomb_is_refused_at_every_try_and_holds_its_partition(codec: &str) {
    // What every binary of the workspace does to get the bounded inflaters linked.
    std::hint::black_box(linked());
    let cluster = MockCluster::new(1).expect("mock cluster");
    let topic = format!("bombed-{codec}");
    cluster
        .create_topic(&topic, 1, 1)
        .expect("topic on the mock broker");
    let bootstrap = cluster.bootstrap_servers();
    produce(&bootstrap, &topic, codec, &[b"before the bomb".to_vec()]);
    // One batch: 40 MiB of zeros, a few tens of KB compressed (about 2 MiB in snappy).
    let mib = 1 << 20;
    let bomb: Vec<Vec<u8>> = (0..INFLATE_LIMIT / mib + 8)
        .map(|_| vec![0u8; mib])
        .collect();
    produce(&bootstrap, &topic, codec, &bomb);
    produce(&bootstrap, &topic, codec, &[b"after the bomb".to_vec()]);

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
    consumer.subscribe(&[&topic]).expect("subscribed");
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
        "{codec}: librdkafka's reads did not come here, or did not try again: {} refusals",
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
        "{codec}: the consumer is told: {errors:?}"
    );
    assert_eq!(
        read,
        vec![(0, Some(b"before the bomb".to_vec()))],
        "{codec}: only the record before the bomb is handed out"
    );
}
