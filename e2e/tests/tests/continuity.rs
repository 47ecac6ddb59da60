//! Breaks in continuity are found, surfaced and handled, never skipped silently: records
//! deleted on the source while the replicator is stopped, a source topic deleted and created
//! again, and the remote topic deleted under a running replicator. Each must end up in
//! `status.gaps`, turn `Gapless` False with its reason, get a Warning event, and leave the
//! target with exactly what the source still holds.
//!
//! A recreated remote topic also voids the checkpoints into its old log: they are written
//! again from the new one.
//!
//! Runs on the world's shared clusters with topics of its own (no broker is stopped).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Api;
use mirrorflow::api::{GapStatus, MirrorFlow};
use mirrorflow::mm2::{Checkpoint, TopicPartition};
use mirrorflow_e2e::operator::{
    condition, install_operator, patch_flow_spec, roll_flow_spec, wait_for_event, wait_for_flow,
};
use mirrorflow_e2e::{World, eventually, kafka, run, run_with_input, unique};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureRecord;
use rdkafka::{Message, Offset, TopicPartitionList};

/// The end offset of partition 0 of `topic`.
fn high_watermark(bootstrap: &str, topic: &str) -> Result<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    Ok(consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))?
        .1)
}

async fn produce(bootstrap: &str, topic: &str, values: impl Iterator<Item = String>) -> Result<()> {
    let producer = kafka::producer(bootstrap, Duration::from_secs(30))?;
    for v in values {
        producer
            .send(
                FutureRecord::<(), _>::to(topic).payload(&v).partition(0),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// Values of partition 0, read committed up to the end (transaction markers take offsets, so
/// the end is where the consumer reports it, not the last record's offset + 1).
fn values(bootstrap: &str, topic: &str) -> Result<Vec<String>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "mirrorflow-e2e-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if Instant::now() > deadline {
            bail!("reading {topic} timed out after {} records", out.len());
        }
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                out.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned())
            }
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(out),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
}

/// The values of `topic` once it holds at least `n` records.
async fn copied(bootstrap: &str, topic: &str, n: usize, timeout: Duration) -> Result<Vec<String>> {
    eventually(&format!("{n} records in {topic}"), timeout, || async {
        let v = values(bootstrap, topic)?;
        if v.len() >= n {
            return Ok(Some(v));
        }
        bail!("{} so far", v.len())
    })
    .await
}

fn gap<'a>(mf: &'a MirrorFlow, topic: &str, reason: &str) -> Option<&'a GapStatus> {
    mf.status
        .as_ref()?
        .gaps
        .iter()
        .find(|g| g.topic == topic && g.reason == reason)
}

#[tokio::test]
async fn at_least_once_surfaces_truncation_recreation_and_a_deleted_remote_topic() -> Result<()> {
    breaks_are_surfaced_not_skipped(false).await
}

#[tokio::test]
async fn exactly_once_surfaces_truncation_recreation_and_a_deleted_remote_topic() -> Result<()> {
    breaks_are_surfaced_not_skipped(true).await
}

async fn breaks_are_surfaced_not_skipped(exactly_once: bool) -> Result<()> {
    let world = World::from_env()?;
    let (src, tgt) = (
        world.source_bootstrap.clone(),
        world.target_bootstrap.clone(),
    );
    let client = world.kube_client().await?;
    let ns = unique("e2e-cont");
    install_operator(&world, &ns)?;
    let alias = unique("cont");
    let truncated = unique("conttrunc");
    let recreated = unique("controcr");
    let swapped = unique("contswap");
    let remote_deleted = unique("contrdel");
    for t in [&truncated, &recreated, &remote_deleted, &swapped] {
        kafka::create_topic(&src, t, 1).await?;
        produce(&src, t, (0..20).map(|i| format!("{t}-{i}"))).await?;
    }
    let flow = format!(
        r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: flow, namespace: {ns}}}
spec:
  source: {{alias: {alias}, bootstrapServers: "{src}"}}
  target: {{alias: {alias}-t, bootstrapServers: "{tgt}"}}
  topics: ["{truncated}", "{recreated}", "{remote_deleted}", "{swapped}"]
  sourceLoop: {{topicsRefreshInterval: 3s{syncs}}}
{eos}"#,
        syncs = if exactly_once {
            ", offsetSyncsLocation: Target"
        } else {
            ""
        },
        eos = if exactly_once {
            "  exactlyOnce: true\n"
        } else {
            ""
        },
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &flow)?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    let remote = |t: &str| format!("{alias}.{t}");
    for t in [&truncated, &recreated, &remote_deleted, &swapped] {
        copied(&tgt, &remote(t), 20, Duration::from_secs(120)).await?;
    }
    let clean = wait_for_flow(
        &flows,
        "flow",
        "Gapless True",
        Duration::from_secs(60),
        |mf| condition(mf, "Gapless").is_some_and(|c| c.0 == "True"),
    )
    .await?;
    assert!(clean.status.as_ref().is_some_and(|s| s.gaps.is_empty()));

    // 1. Retention while the replicator is stopped: 30 more records, of which the first 20
    // are deleted before the source loop comes back.
    roll_flow_spec(&flows, &ns, "flow", r#"{"sourceLoop":{"enabled":false}}"#).await?;
    produce(
        &src,
        &truncated,
        (20..50).map(|i| format!("{truncated}-{i}")),
    )
    .await?;
    kafka::delete_records_before(&src, &truncated, 40).await?;
    patch_flow_spec(&ns, "flow", r#"{"sourceLoop":{"enabled":true}}"#)?;
    let mf = wait_for_flow(
        &flows,
        "flow",
        "a SourceTruncated gap",
        Duration::from_secs(120),
        |mf| gap(mf, &truncated, "SourceTruncated").is_some(),
    )
    .await?;
    let g = gap(&mf, &truncated, "SourceTruncated").context("gap")?;
    assert_eq!((g.from, g.to), (20, 40), "{g:?}");
    assert!(g.message.contains("20 records are missing"), "{g:?}");
    let c = condition(&mf, "Gapless").context("Gapless")?;
    assert_eq!(
        (c.0.as_str(), c.1.as_str()),
        ("False", "SourceTruncated"),
        "{c:?}"
    );
    assert!(c.2.contains("mirrorflow.io/gaps-acknowledged="), "{c:?}");
    wait_for_event(&ns, "flow", "SourceTruncated", &truncated).await?;
    let after_gap = copied(&tgt, &remote(&truncated), 30, Duration::from_secs(60)).await?;
    let want: Vec<String> = (0..20)
        .chain(40..50)
        .map(|i| format!("{truncated}-{i}"))
        .collect();
    assert_eq!(
        after_gap, want,
        "exactly the records the source still had, once"
    );

    // 2. The source topic is deleted and created again with new records.
    kafka::delete_topic(&src, &recreated).await?;
    eventually("the source topic gone", Duration::from_secs(30), || async {
        if kafka::topics(&src)?.contains(&recreated) {
            bail!("still listed");
        }
        Ok(Some(()))
    })
    .await?;
    // Long enough for discovery to notice it missing (3 s rounds).
    tokio::time::sleep(Duration::from_secs(8)).await;
    eventually(
        "the source topic created again",
        Duration::from_secs(30),
        || async { kafka::create_topic(&src, &recreated, 1).await.map(Some) },
    )
    .await?;
    produce(
        &src,
        &recreated,
        (0..5).map(|i| format!("{recreated}-new-{i}")),
    )
    .await?;
    let mf = wait_for_flow(
        &flows,
        "flow",
        "a SourceTopicRecreated gap",
        Duration::from_secs(120),
        |mf| gap(mf, &recreated, "SourceTopicRecreated").is_some(),
    )
    .await?;
    let g = gap(&mf, &recreated, "SourceTopicRecreated").context("gap")?;
    assert_eq!(g.from, 20, "the old position: {g:?}");
    assert!(g.to <= 5, "the new log's end when found: {g:?}");
    wait_for_event(&ns, "flow", "SourceTopicRecreated", &recreated).await?;
    let both = copied(&tgt, &remote(&recreated), 25, Duration::from_secs(60)).await?;
    let want: Vec<String> = (0..20)
        .map(|i| format!("{recreated}-{i}"))
        .chain((0..5).map(|i| format!("{recreated}-new-{i}")))
        .collect();
    assert_eq!(
        both, want,
        "the old incarnation's copies, then the new records once"
    );

    // 2b. Deleted and created again at once, faster than discovery looks: the consumer may
    // meet the new log at its old position (stopped by auto.offset.reset=error, then moved)
    // rather than through a rebalance. Either way the new records must arrive once.
    kafka::delete_topic(&src, &swapped).await?;
    eventually(
        "the swapped topic created again",
        Duration::from_secs(30),
        || async { kafka::create_topic(&src, &swapped, 1).await.map(Some) },
    )
    .await?;
    produce(&src, &swapped, (0..5).map(|i| format!("{swapped}-new-{i}"))).await?;
    wait_for_flow(
        &flows,
        "flow",
        "a SourceTopicRecreated gap for the swapped topic",
        Duration::from_secs(120),
        |mf| gap(mf, &swapped, "SourceTopicRecreated").is_some(),
    )
    .await?;
    let both = copied(&tgt, &remote(&swapped), 25, Duration::from_secs(60)).await?;
    let want: Vec<String> = (0..20)
        .map(|i| format!("{swapped}-{i}"))
        .chain((0..5).map(|i| format!("{swapped}-new-{i}")))
        .collect();
    assert_eq!(
        both, want,
        "swapped: the old copies, then the new records once"
    );

    // 3. The remote topic is deleted under the running replicator: discovery creates it
    // again and the partition is copied again from the source's earliest record.
    // Where the copies reach is a target offset: the end of the remote partition, before
    // its commit marker in exactly-once mode (how many transactions the 20 records took
    // depends on the machine's pace, and each adds a marker).
    let end = high_watermark(&tgt, &remote(&remote_deleted))?;
    let reached = if exactly_once { end - 1 } else { end };
    kafka::delete_topic_under_writer(&tgt, &remote(&remote_deleted)).await?;
    let mf = wait_for_flow(
        &flows,
        "flow",
        "a TargetTopicRecreated gap",
        Duration::from_secs(120),
        |mf| gap(mf, &remote_deleted, "TargetTopicRecreated").is_some(),
    )
    .await?;
    let g = gap(&mf, &remote_deleted, "TargetTopicRecreated").context("gap")?;
    assert_eq!(g.from, reached, "where the copies had reached: {g:?}");
    assert!(
        exactly_once || g.from == 20,
        "at-least-once copies 1:1: {g:?}"
    );
    wait_for_event(&ns, "flow", "TargetTopicRecreated", &remote_deleted).await?;
    produce(
        &src,
        &remote_deleted,
        (20..25).map(|i| format!("{remote_deleted}-{i}")),
    )
    .await?;
    // Records copied into the new remote topic before the break was found are copied again.
    let want: BTreeSet<String> = (0..25).map(|i| format!("{remote_deleted}-{i}")).collect();
    let have = eventually(
        "the partition copied again",
        Duration::from_secs(90),
        || async {
            let have: BTreeSet<String> = values(&tgt, &remote(&remote_deleted))?
                .into_iter()
                .collect();
            if have.len() >= want.len() {
                return Ok(Some(have));
            }
            bail!("{} distinct records", have.len())
        },
    )
    .await?;
    assert_eq!(have, want, "every source record is on the target again");

    // Acknowledging the newest clears the condition; nothing was found twice.
    let mf = flows.get("flow").await?;
    let gaps = mf
        .status
        .as_ref()
        .map(|s| s.gaps.clone())
        .unwrap_or_default();
    let per_reason = |r: &str| gaps.iter().filter(|g| g.reason == r).count();
    assert_eq!(
        (
            per_reason("SourceTruncated"),
            per_reason("SourceTopicRecreated"),
            per_reason("TargetTopicRecreated")
        ),
        (1, 2, 1),
        "{gaps:?}"
    );
    let newest = gaps.last().context("gaps")?.detected_at.clone();
    run(
        "kubectl",
        &[
            "annotate",
            "mirrorflow",
            "flow",
            "-n",
            &ns,
            &format!("mirrorflow.io/gaps-acknowledged={newest}"),
            "--overwrite",
        ],
    )?;
    let acked = wait_for_flow(
        &flows,
        "flow",
        "Gapless True again",
        Duration::from_secs(60),
        |mf| condition(mf, "Gapless").is_some_and(|c| c.0 == "True"),
    )
    .await?;
    assert!(acked.status.as_ref().is_some_and(|s| s.gaps.is_empty()));
    let _ = run("kubectl", &["delete", "namespace", &ns, "--wait=false"]);
    Ok(())
}

/// The newest checkpoint of `group` for partition 0 of `remote`, as (upstream, downstream).
fn last_checkpoint(
    bootstrap: &str,
    topic: &str,
    group: &str,
    remote: &str,
) -> Result<Option<(i64, i64)>> {
    if !kafka::topics(bootstrap)?.contains(topic) {
        return Ok(None);
    }
    let want = TopicPartition::new(remote, 0);
    let mut last = None;
    for (_, key, value) in kafka::read_partition(bootstrap, topic, 0)? {
        let (Some(k), Some(v)) = (key, value) else {
            bail!("a null key or value in {topic}");
        };
        let cp = Checkpoint::decode(&k, &v).context("decoding a checkpoint")?;
        if cp.group == group && cp.topic_partition == want {
            last = Some((cp.upstream_offset, cp.downstream_offset));
        }
    }
    Ok(last)
}

/// The remote topic is deleted under a flow whose group has a checkpoint, after the source
/// dropped its oldest records: the partition is copied again into a shorter log, and the
/// group's checkpoint must follow it down (before: it kept pointing at offset 40 of the gone
/// log, past the new log's end, so a failover would have skipped every record there) and the
/// group be ready to fail over again.
#[tokio::test]
async fn checkpoints_are_written_again_into_a_recreated_remote_topic() -> Result<()> {
    let world = World::from_env()?;
    let (src, tgt) = (
        world.source_bootstrap.clone(),
        world.target_bootstrap.clone(),
    );
    let client = world.kube_client().await?;
    let ns = unique("e2e-contck");
    install_operator(&world, &ns)?;
    let alias = unique("contck");
    let topic = unique("contckt");
    let group = unique("contckg");
    kafka::create_topic(&src, &topic, 1).await?;
    produce(&src, &topic, (0..40).map(|i| format!("{topic}-{i}"))).await?;
    kafka::commit(&src, &group, &topic, &[(0, 40)])?;
    let flow = format!(
        r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: flow, namespace: {ns}}}
spec:
  source: {{alias: {alias}, bootstrapServers: "{src}"}}
  target: {{alias: {alias}-t, bootstrapServers: "{tgt}"}}
  topics: ["{topic}"]
  groups: ["{group}"]
  sourceLoop: {{topicsRefreshInterval: 3s}}
"#
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &flow)?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    let remote = format!("{alias}.{topic}");
    let cps_topic = format!("{alias}.checkpoints.internal");
    copied(&tgt, &remote, 40, Duration::from_secs(120)).await?;
    let checkpoint = |want: (i64, i64)| {
        let (tgt, cps_topic, group, remote) = (&tgt, &cps_topic, &group, &remote);
        async move {
            eventually(
                &format!("the checkpoint {want:?}"),
                Duration::from_secs(90),
                || async move {
                    match last_checkpoint(tgt, cps_topic, group, remote)? {
                        Some(have) if have == want => Ok(Some(())),
                        have => bail!("the newest is {have:?}"),
                    }
                },
            )
            .await
        }
    };
    checkpoint((40, 40)).await?;
    let ready = |what: &'static str| {
        wait_for_flow(&flows, "flow", what, Duration::from_secs(90), |mf| {
            condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True")
        })
    };
    ready("FailoverReady True").await?;

    kafka::delete_records_before(&src, &topic, 30).await?;
    kafka::delete_topic_under_writer(&tgt, &remote).await?;
    wait_for_flow(
        &flows,
        "flow",
        "a TargetTopicRecreated gap",
        Duration::from_secs(120),
        |mf| gap(mf, &topic, "TargetTopicRecreated").is_some(),
    )
    .await?;
    let again = copied(&tgt, &remote, 10, Duration::from_secs(90)).await?;
    let want: Vec<String> = (30..40).map(|i| format!("{topic}-{i}")).collect();
    assert_eq!(again, want, "the new log holds what the source still has");
    // Committed offset 40 is the end of the source partition, and the end of the new log
    // (10 records) is where a failed-over consumer must start.
    checkpoint((40, 10)).await?;
    let mf = ready("FailoverReady True on the new log's checkpoint").await?;
    let rows = mf
        .status
        .as_ref()
        .map(|s| s.least_ready_groups.clone())
        .unwrap_or_default();
    let row = rows.iter().find(|r| r.group == group);
    assert_eq!(row.map(|r| r.reason.as_str()), Some("Ready"), "{rows:?}");
    let _ = run("kubectl", &["delete", "namespace", &ns, "--wait=false"]);
    Ok(())
}
