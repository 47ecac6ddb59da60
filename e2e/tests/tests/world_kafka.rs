//! The two Kafka clusters of the world are real, separate and usable from rdkafka.

use std::time::Duration;

use mirrorflow_e2e::{World, kafka, unique};
use rdkafka::producer::FutureRecord;

#[tokio::test]
async fn produce_and_consume_on_both_clusters() -> anyhow::Result<()> {
    let world = World::from_env()?;
    for bootstrap in [&world.source_bootstrap, &world.target_bootstrap] {
        let topic = unique("roundtrip");
        kafka::create_topic(bootstrap, &topic, 1).await?;
        let producer = kafka::producer(bootstrap, Duration::from_secs(30))?;
        for i in 0..100 {
            let key = format!("k{i}");
            let value = format!("v{i}");
            producer
                .send(
                    FutureRecord::to(&topic).key(&key).payload(&value),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)?;
        }
        let records = kafka::read_partition(bootstrap, &topic, 0)?;
        assert_eq!(records.len(), 100, "all records read back from {bootstrap}");
        for (i, (offset, key, value)) in records.iter().enumerate() {
            assert_eq!(*offset, i as i64);
            assert_eq!(key.as_deref(), Some(format!("k{i}").as_bytes()));
            assert_eq!(value.as_deref(), Some(format!("v{i}").as_bytes()));
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_topic_created_on_one_cluster_is_absent_on_the_other() -> anyhow::Result<()> {
    let world = World::from_env()?;
    let topic = unique("only-on-source");
    kafka::create_topic(&world.source_bootstrap, &topic, 3).await?;
    assert!(kafka::topics(&world.source_bootstrap)?.contains(&topic));
    assert!(!kafka::topics(&world.target_bootstrap)?.contains(&topic));
    Ok(())
}
