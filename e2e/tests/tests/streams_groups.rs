//! Streams groups (KIP-1071) as a real Kafka Streams application makes them
//! (`group.protocol=streams`, `e2e/kafka/streams/PassThrough.java`): they commit offsets like
//! consumer groups, so the replicator checkpoints them and the status judges them; a failover
//! commits their checkpoints into the target and the application started there resumes from
//! them with 0 records skipped. The consumer-group descriptions answer a streams group as if
//! there were none, so its members on the target are read with StreamsGroupDescribe: a
//! failover into a running application there is refused.
//!
//! Runs alone (world-tests.sh's exclusive set): while the group exists, every other flow on the
//! shared source that selects all groups (the default) would rightly see it.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result};
use mirrorflow_e2e::fidelity::free_port;
use mirrorflow_e2e::handmirror::{cli_json, ready_to_fail_over};
use mirrorflow_e2e::kafka::{self, JavaConsumer};
use mirrorflow_e2e::replicator::Replicator;
use mirrorflow_e2e::{World, eventually, unique};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Writes `n` records of unique values over both partitions of `topic`; returns the values.
async fn write_unique(bootstrap: &str, topic: &str, n: i32) -> Result<Vec<String>> {
    let producer = kafka::producer(bootstrap, Duration::from_secs(30))?;
    let mut values = Vec::new();
    for i in 0..n {
        let value = unique("rec");
        producer
            .send(
                rdkafka::producer::FutureRecord::<(), _>::to(topic)
                    .payload(&value)
                    .partition(i % 2),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
        values.push(value);
    }
    Ok(values)
}

/// Every value in both partitions of `topic`, with its partition and offset.
fn values(bootstrap: &str, topic: &str) -> Result<Vec<(i32, i64, String)>> {
    let mut out = Vec::new();
    for p in 0..2 {
        for (offset, _, value) in kafka::read_partition(bootstrap, topic, p)? {
            if let Some(v) = value {
                out.push((p, offset, String::from_utf8_lossy(&v).into_owned()));
            }
        }
    }
    Ok(out)
}

/// `group`'s committed offsets on both partitions of `topic` (`None` where it has none).
fn committed(bootstrap: &str, group: &str, topic: &str) -> Result<[Option<i64>; 2]> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    tpl.add_partition(topic, 1);
    let got = c.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(
        [0, 1].map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_group_fails_over_at_its_checkpoints_with_nothing_skipped() -> Result<()> {
    let world = World::from_env()?;
    let (source, target) = (&world.source_bootstrap, &world.target_bootstrap);
    let topic = unique("events");
    let alias = unique("stg");
    let app = unique("stg-app");
    let remote = format!("{alias}.{topic}");
    kafka::create_topic(source, &topic, 2).await?;
    for output in [format!("{topic}-out"), format!("{topic}-early")] {
        kafka::create_topic(source, &output, 2).await?;
        kafka::create_topic(target, &output, 2).await?;
    }
    let port = free_port()?;
    let flow = format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {alias}, namespace: e2e}}\nspec:\n  source: {{alias: {alias}, bootstrapServers: '{source}'}}\n  target: {{alias: {alias}-t, bootstrapServers: '{target}'}}\n  topics: ['{topic}']\n  groups: ['{app}']\n",
    );
    let flow_file = std::env::temp_dir().join(format!("{alias}.yaml"));
    std::fs::write(&flow_file, &flow)?;
    let replicator = Replicator::start(&world.repo_root, &format!("{alias}-{port}"), &flow, port)?;
    replicator.wait_ready().await?;

    // The application reads and commits everything written while it runs on the source.
    let read = write_unique(source, &topic, 20).await?;
    let on_source = JavaConsumer::streams(source, &app, &topic, &format!("{topic}-out"))?;
    eventually(
        "the application committed its input's end",
        Duration::from_secs(90),
        || async { Ok((committed(source, &app, &topic)? == [Some(10), Some(10)]).then_some(())) },
    )
    .await?;
    on_source.stop();
    // Never read on the source: written after the application stopped.
    let unread = write_unique(source, &topic, 20).await?;
    eventually(
        "the unread records copied",
        Duration::from_secs(60),
        || async {
            let copied: HashSet<String> =
                values(target, &remote)?.into_iter().map(|v| v.2).collect();
            Ok(unread.iter().all(|v| copied.contains(v)).then_some(()))
        },
    )
    .await?;

    // The status says the group can fail over, on checkpoints at its commits.
    ready_to_fail_over(
        &world,
        &flow_file,
        &app,
        "a streams group: the group can fail over",
    )
    .await?;

    // The application started on the target too early (reading the remote topic from its
    // beginning into another topic): its group is seen with its member, and the failover is
    // refused.
    let early = JavaConsumer::streams(target, &app, &remote, &format!("{topic}-early"))?;
    let refused = eventually("the failover refused", Duration::from_secs(90), || async {
        let report = cli_json(
            &world,
            "failover",
            &flow_file,
            &["--group", &app, "--apply"],
        )?;
        let members = report["groups"][0]["targetGroup"]["members"].as_u64();
        Ok((members > Some(0)).then_some(report))
    })
    .await?;
    let planned = &refused["groups"][0];
    assert_eq!(planned["action"], "refused", "{refused}");
    assert_eq!(planned["targetGroup"]["protocol"], "streams", "{refused}");
    early.stop();

    // Stopped: the group fails over, moved back from where the early run committed.
    let report = eventually("the failover applied", Duration::from_secs(90), || async {
        let report = cli_json(
            &world,
            "failover",
            &flow_file,
            &["--group", &app, "--apply", "--allow-rewind"],
        )?;
        Ok((report["groups"][0]["action"] == "committed").then_some(report))
    })
    .await?;
    let offsets: Vec<i64> = (report["groups"][0]["partitions"].as_array())
        .context("partitions in the report")?
        .iter()
        .filter_map(|p| p["offset"].as_i64())
        .collect();
    assert_eq!(
        offsets,
        [10, 10],
        "the checkpoints at the commits: {report}"
    );

    // On the target, the application resumes at the checkpoints: every unread record, and
    // none of those read on the source.
    let on_target = JavaConsumer::streams(target, &app, &remote, &format!("{topic}-out"))?;
    let out = eventually(
        "the application read the unread records",
        Duration::from_secs(90),
        || async {
            let out: HashSet<String> = values(target, &format!("{topic}-out"))?
                .into_iter()
                .map(|v| v.2)
                .collect();
            Ok(unread.iter().all(|v| out.contains(v)).then_some(out))
        },
    )
    .await?;
    on_target.stop();
    let skipped = unread.iter().filter(|v| !out.contains(*v)).count();
    let again = read.iter().filter(|v| out.contains(*v)).count();
    assert_eq!((skipped, again), (0, 0), "skipped, read again");
    eprintln!(
        "failover of streams group {app}: {} records read on the target, 0 skipped, 0 read again",
        out.len()
    );

    drop(replicator);
    tokio::task::block_in_place(|| {
        kafka::delete_streams_group(source, &app)?;
        kafka::delete_streams_group(target, &app)
    })?;
    kafka::delete_topic(source, &topic).await
}
