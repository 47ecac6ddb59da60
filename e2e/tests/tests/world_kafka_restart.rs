//! A cluster restart loses nothing for a producer that retries (acks=all, idempotent).
//! Its own test binary: cargo runs binaries one after another, so no other test sees the outage.

use std::time::Duration;

use mirrorflow_e2e::{World, kafka, unique};
use rdkafka::producer::FutureRecord;

#[tokio::test]
async fn a_retrying_producer_loses_nothing_across_a_cluster_restart() -> anyhow::Result<()> {
    let world = World::from_env()?;
    let topic = unique("restart");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    let producer = kafka::producer(&world.source_bootstrap, Duration::from_secs(120))?;

    const TOTAL: usize = 3000;
    let send_all = {
        let producer = producer.clone();
        let topic = topic.clone();
        tokio::spawn(async move {
            let mut pending = Vec::with_capacity(TOTAL);
            for i in 0..TOTAL {
                let value = format!("r{i}");
                // Enqueued now; the delivery future resolves once the broker acknowledged it.
                match producer.send_result(FutureRecord::<(), _>::to(&topic).payload(&value)) {
                    Ok(delivery) => pending.push(delivery),
                    Err((e, _)) => panic!("enqueueing record {i} failed: {e}"),
                }
                // Spread sends over the restart so records are in flight while the broker is down.
                if i % 50 == 49 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
            let mut failed = 0;
            for p in pending {
                if !matches!(p.await, Ok(Ok(_))) {
                    failed += 1;
                }
            }
            failed
        })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    world.world_sh(&["kafka", "restart", "source"])?;
    let failed = send_all.await?;
    assert_eq!(failed, 0, "no send may fail across the restart");

    let records = kafka::read_partition(&world.source_bootstrap, &topic, 0)?;
    let mut values: Vec<String> = records
        .iter()
        .filter_map(|(_, _, v)| {
            v.as_deref()
                .map(|v| String::from_utf8_lossy(v).into_owned())
        })
        .collect();
    values.sort();
    values.dedup();
    assert_eq!(
        values.len(),
        TOTAL,
        "every record is present after the restart"
    );
    assert_eq!(
        records.len(),
        TOTAL,
        "the idempotent producer wrote no duplicates"
    );
    Ok(())
}
