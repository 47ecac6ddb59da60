//! `mirrorflow switchover` as the world tests run it, and what they read of its JSON report
//! and of the clusters afterwards.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::replicator::binary;
use crate::{World, unique};

/// Runs `mirrorflow switchover ARGS -o json`: its exit code, report and stderr.
pub fn run_switchover(world: &World, args: &[&str]) -> Result<(i32, serde_json::Value, String)> {
    let out = Command::new(binary(&world.repo_root))
        .env("KUBECONFIG", &world.kubeconfig)
        .arg("switchover")
        .args(args)
        .args(["-o", "json"])
        .output()
        .context("running mirrorflow switchover")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(&text).with_context(|| format!("{text}\n{stderr}"))?;
    Ok((out.status.code().unwrap_or(-1), json, stderr))
}

/// The steps' (name, outcome) in the report, in order.
pub fn outcomes(report: &serde_json::Value) -> Vec<(String, String)> {
    report["steps"]
        .as_array()
        .map(|s| {
            s.iter()
                .map(|s| {
                    (
                        s["name"].as_str().unwrap_or_default().to_string(),
                        s["outcome"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The steps' durations in the report, in order.
pub fn step_millis(report: &serde_json::Value) -> Vec<u64> {
    report["steps"]
        .as_array()
        .map(|s| {
            s.iter()
                .map(|s| s["millis"].as_u64().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

/// High watermarks of `topic`'s first `partitions` partitions.
pub fn end_offsets(bootstrap: &str, topic: &str, partitions: i32) -> Result<Vec<i64>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("ends"))
        .create()?;
    (0..partitions)
        .map(|p| Ok(c.fetch_watermarks(topic, p, Duration::from_secs(10))?.1))
        .collect()
}

/// `group`'s committed offsets on `topic`'s first `partitions` partitions.
pub fn committed(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<Vec<Option<i64>>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok((0..partitions)
        .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        })
        .collect())
}
