//! Mirroring by hand for the checkpoint tests that run without the source loop: records written
//! to partition 0 of both sides, dense offset syncs written as the source loop writes its own,
//! and the CLI's view of the flow's status (`mirrorflow status -o json`, the probe's rules).

use std::time::Duration;

use anyhow::{Context, Result};
use mirrorflow::mm2::{OffsetSync, TopicPartition};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::World;
use crate::replicator::binary;

/// A record to partition 0; its offset.
pub async fn send_value(producer: &FutureProducer, topic: &str, value: &str) -> Result<i64> {
    let delivery = producer
        .send(
            FutureRecord::<(), _>::to(topic).partition(0).payload(value),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    Ok(delivery.offset)
}

/// A dense offset sync (the header the source loop puts on its own) of `topic`-0.
pub async fn dense_sync(
    source: &FutureProducer,
    syncs: &str,
    topic: &str,
    up: i64,
    down: i64,
) -> Result<()> {
    let rec = OffsetSync::new(TopicPartition::new(topic, 0), up, down).encode()?;
    let record = FutureRecord::to(syncs)
        .partition(0)
        .key(&rec.key)
        .payload(&rec.value)
        .headers(OwnedHeaders::new().insert(Header {
            key: "mirrorflow.sync",
            value: Some("dense"),
        }));
    source
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)?;
    Ok(())
}

/// `mirrorflow <command> --flow-file <file> <extra> -o json`, parsed.
pub fn cli_json(
    world: &World,
    command: &str,
    file: &std::path::Path,
    extra: &[&str],
) -> Result<serde_json::Value> {
    let out = std::process::Command::new(binary(&world.repo_root))
        .arg(command)
        .arg("--flow-file")
        .arg(file)
        .args(extra)
        .args(["-o", "json"])
        .output()?;
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "mirrorflow {command}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Waits up to 60 s until `mirrorflow status` of `flow_file` says FailoverReady True, with
/// `group` the least ready group, Ready, its message starting with `says`; returns the status.
pub async fn ready_to_fail_over(
    world: &World,
    flow_file: &std::path::Path,
    group: &str,
    says: &str,
) -> Result<serde_json::Value> {
    let status = crate::eventually(
        "FailoverReady True",
        std::time::Duration::from_secs(60),
        || async {
            let status = cli_json(world, "status", flow_file, &[])?;
            let ready = condition(&status, "FailoverReady")["status"] == "True";
            Ok(ready.then_some(status))
        },
    )
    .await?;
    let row = &status["leastReadyGroups"][0];
    anyhow::ensure!(
        (row["group"].as_str(), row["reason"].as_str()) == (Some(group), Some("Ready")),
        "{status}"
    );
    let message = row["message"].as_str().unwrap_or_default();
    anyhow::ensure!(message.starts_with(says), "{message}");
    Ok(status)
}

/// The condition `type_` of a status (`null` when absent).
pub fn condition<'a>(status: &'a serde_json::Value, type_: &str) -> &'a serde_json::Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&serde_json::Value::Null)
}
