//! The status probe with shared, followed clients, against the world's two Kafka clusters (no
//! apiserver, no pods): each probe sees what was written to the target's checkpoints, positions
//! and heartbeats topics since the previous one, and clients are shared only within a namespace;
//! and the status does not call a group ready on a checkpoint its writer said was conservative.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, ensure};
use mirrorflow::api::MirrorFlowSpec;
use mirrorflow::flow::{self, Flow};
use mirrorflow::kafka::SecretFiles;
use mirrorflow::kafka::positions::{self, Frontier};
use mirrorflow::mm2::{Checkpoint, Heartbeat, TopicPartition};
use mirrorflow::status::clients::ProbeClients;
use mirrorflow::status::probe::{Budget, ClusterObservation, PROBE_BUDGET, observe_with};
use mirrorflow_e2e::handmirror::{cli_json, condition, dense_sync, send_value};
use mirrorflow_e2e::replicator::Replicator;
use mirrorflow_e2e::{World, eventually, kafka, unique};
use rdkafka::producer::{FutureProducer, FutureRecord};

async fn send(producer: &FutureProducer, topic: &str, key: &[u8], value: &[u8]) -> Result<()> {
    producer
        .send(
            FutureRecord::to(topic).key(key).payload(value),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    Ok(())
}

async fn checkpoint(
    producer: &FutureProducer,
    topic: &str,
    group: &str,
    remote: &str,
    upstream: i64,
) -> Result<()> {
    let r = Checkpoint {
        group: group.into(),
        topic_partition: TopicPartition::new(remote.to_string(), 0),
        upstream_offset: upstream,
        downstream_offset: upstream,
        metadata: String::new(),
    }
    .encode()?;
    send(producer, topic, &r.key, &r.value).await
}

/// One probe, on a blocking thread as in the operator.
fn probe(clients: &ProbeClients, ns: &str, flow: &Flow) -> ClusterObservation {
    tokio::task::block_in_place(|| observe_with(clients, ns, flow, Budget::new(PROBE_BUDGET)))
}

/// An Observe flow `tenant-a/<alias>` of `topic` and the groups `groups` matches.
fn observe_flow(world: &World, alias: &str, topic: &str, groups: &str) -> Result<Flow> {
    let spec: MirrorFlowSpec = serde_json::from_value(serde_json::json!({
        "mode": "Observe",
        "source": {"alias": alias, "bootstrapServers": world.source_bootstrap},
        "target": {"alias": format!("{alias}-t"), "bootstrapServers": world.target_bootstrap},
        "topics": [topic],
        "groups": [groups],
    }))?;
    Ok(flow::resolve(
        format!("tenant-a/{alias}"),
        spec,
        &SecretFiles::new("/nonexistent"),
    )?)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_probe_reads_what_was_written_since_the_last_one() -> Result<()> {
    let world = World::from_env()?;
    let topic = unique("probed");
    let alias = unique("pa");
    let group = format!("{topic}-g");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 10, 1).await?;
    kafka::commit(&world.source_bootstrap, &group, &topic, &[(0, 10)])?;
    let remote = format!("{alias}.{topic}");
    let checkpoints = format!("{alias}.checkpoints.internal");
    let heartbeats = format!("{alias}.heartbeats");
    let positions_topic = positions::positions_topic(&alias);
    for t in [&remote, &checkpoints, &heartbeats, &positions_topic] {
        kafka::create_topic(&world.target_bootstrap, t, 1).await?;
    }
    let target = kafka::producer(&world.target_bootstrap, Duration::from_secs(30))?;
    checkpoint(&target, &checkpoints, &group, &remote, 4).await?;
    let key = positions::encode_key(&topic, 0);
    let half = positions::encode_value(Frontier {
        next: 6,
        downstream: 6,
    });
    send(&target, &positions_topic, &key, &half).await?;
    // Every flow replicates the source's `heartbeats` topic too (MirrorMaker 2's rule), which
    // other tests write to: positions past its end leave it out of the lag.
    for p in 0..4 {
        let past_the_end = positions::encode_value(Frontier {
            next: i64::MAX / 4,
            downstream: 0,
        });
        let hb_key = positions::encode_key("heartbeats", p);
        send(&target, &positions_topic, &hb_key, &past_the_end).await?;
    }

    let flow = observe_flow(&world, &alias, &topic, &group)?;
    let clients = ProbeClients::default();

    let first = probe(&clients, "tenant-a", &flow);
    assert_eq!(first.source_error, None);
    assert_eq!(first.target_error, None);
    assert_eq!(first.replication_lag, Some(4), "10 records, 6 copied");
    let g = first
        .groups
        .iter()
        .find(|g| g.group == group)
        .expect("the group is observed");
    assert_eq!(g.replay_records, 6, "committed 10, checkpoint at 4");
    assert_eq!(g.uncopied_records, 4);
    assert!(first.heartbeat.is_none(), "no heartbeat yet");

    // Written after the first probe: only these are read by the second.
    checkpoint(&target, &checkpoints, &group, &remote, 10).await?;
    let all = positions::encode_value(Frontier {
        next: 10,
        downstream: 10,
    });
    send(&target, &positions_topic, &key, &all).await?;
    let emitted = now_ms();
    let hb = Heartbeat {
        source_alias: alias.clone(),
        target_alias: format!("{alias}-t"),
        timestamp_ms: emitted,
    }
    .encode()?;
    send(&target, &heartbeats, &hb.key, &hb.value).await?;

    let second = probe(&clients, "tenant-a", &flow);
    assert_eq!(second.replication_lag, Some(0), "every record copied");
    let g = second
        .groups
        .iter()
        .find(|g| g.group == group)
        .expect("the group is observed");
    assert_eq!(g.replay_records, 0, "the new checkpoint covers the commit");
    assert_eq!(g.checkpoint_age, Some(Duration::ZERO));
    assert_eq!(second.heartbeat.map(|(_, ts)| ts), Some(emitted));
    assert_eq!(clients.len(), 2, "one client per cluster for the namespace");

    // Another tenant with the same clusters and (no) credentials gets clients of its own.
    let other = probe(&clients, "tenant-b", &flow);
    assert_eq!(other.replication_lag, Some(0));
    assert_eq!(clients.len(), 4);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_sees_hundreds_of_groups_and_only_their_mirrored_commits() -> Result<()> {
    let world = World::from_env()?;
    let topic = unique("many");
    let other = unique("unmirrored");
    let alias = unique("pg");
    kafka::create_topic(&world.source_bootstrap, &topic, 2).await?;
    kafka::create_topic(&world.source_bootstrap, &other, 1).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 20, 2).await?;
    // More groups than one round of requests in flight (50), each committed on the mirrored
    // topic; every third one also on a topic the flow does not mirror.
    let groups: Vec<String> = (0..120).map(|i| format!("{topic}-g{i:03}")).collect();
    let started = std::time::Instant::now();
    for (i, g) in groups.iter().enumerate() {
        kafka::commit(&world.source_bootstrap, g, &topic, &[(0, 3), (1, 4)])?;
        if i % 3 == 0 {
            kafka::commit(&world.source_bootstrap, g, &other, &[(0, 1)])?;
        }
    }
    println!("120 groups committed in {:?}", started.elapsed());
    let flow = observe_flow(&world, &alias, &topic, &format!("{topic}-g.*"))?;
    let clients = ProbeClients::default();
    let started = std::time::Instant::now();
    let seen = probe(&clients, "tenant-a", &flow);
    println!("probe of 120 groups: {:?}", started.elapsed());
    assert_eq!(seen.source_error, None);
    let mut names: Vec<&str> = seen.groups.iter().map(|g| g.group.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, groups.iter().map(String::as_str).collect::<Vec<_>>());
    for g in &seen.groups {
        // No checkpoint: a failover would read again everything committed on the mirrored
        // partitions (3 + 4), and nothing of the topic the flow does not mirror.
        assert_eq!(g.replay_records, 7, "{g:?}");
        assert_eq!(g.checkpoint_age, None, "{g:?}");
    }
    Ok(())
}

/// Target offsets of the hand-mirrored records are source offsets plus this.
const SHIFT: i64 = 7;

/// The issue-43 case, without a race to win: the offset syncs are written by hand, so the
/// checkpoint loop's first translation of the commit is conservative for as long as the test
/// wants. The status must say so (not ready, 59 records to re-read), and only the exact
/// checkpoint the loop writes once the sync past the commit lands makes the group ready; the
/// translation `mirrorflow translate` prints then is the record's true place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conservative_checkpoint_is_not_ready_until_the_sync_past_the_commit_makes_it_exact()
-> Result<()> {
    let world = World::from_env()?;
    let name = unique("cons");
    let (source_alias, target_alias) = (unique("src"), unique("tgt"));
    let topic = unique("orders");
    let group = format!("{topic}-app");
    let remote = format!("{source_alias}.{topic}");
    let syncs = format!("mm2-offset-syncs.{target_alias}.internal");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    kafka::create_topic(&world.target_bootstrap, &remote, 1).await?;
    kafka::create_topic(&world.source_bootstrap, &syncs, 1).await?;
    let source = kafka::producer(&world.source_bootstrap, Duration::from_secs(30))?;
    let target = kafka::producer(&world.target_bootstrap, Duration::from_secs(30))?;
    for i in 0..SHIFT {
        send_value(&target, &remote, &format!("filler-{i}")).await?;
    }
    // 100 records, copied by hand; the copy's only sync so far is its first record's, as when
    // the source loop has copied the tail but not yet written the sync that covers it.
    for i in 0..100 {
        let value = format!("{name}-{i}");
        let up = send_value(&source, &topic, &value).await?;
        let down = send_value(&target, &remote, &value).await?;
        ensure!(down == up + SHIFT, "target offset {down} for source {up}");
    }
    dense_sync(&source, &syncs, &topic, 0, SHIFT).await?;
    kafka::commit(&world.source_bootstrap, &group, &topic, &[(0, 60)])?;

    let yaml = format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: e2e}}\nspec:\n  source: {{alias: {source_alias}, bootstrapServers: '{}'}}\n  target: {{alias: {target_alias}, bootstrapServers: '{}'}}\n  topics: ['{topic}']\n  groups: ['{group}']\n  sourceLoop: {{enabled: false}}\n  heartbeats: {{enabled: false}}\n",
        world.source_bootstrap, world.target_bootstrap
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let r = Replicator::start(&world.repo_root, &format!("{name}-{port}"), &yaml, port)?;
    let flow_file = r.log.with_file_name("flow.yaml");
    let checkpoints = format!("{source_alias}.checkpoints.internal");
    let checkpoint_of_60 = |down: i64| {
        let (world, checkpoints, group) = (&world, &checkpoints, &group);
        move || async move {
            if !kafka::topics(&world.target_bootstrap)?.contains(checkpoints) {
                return Ok(None);
            }
            let all = kafka::read_partition(&world.target_bootstrap, checkpoints, 0)?;
            Ok(all.into_iter().rev().find_map(|(_, k, v)| {
                let cp = Checkpoint::decode(k.as_deref()?, v.as_deref()?).ok()?;
                (&cp.group == group && cp.upstream_offset == 60 && cp.downstream_offset == down)
                    .then_some(())
            }))
        }
    };
    // 60 is past the only sync: MM2's rule, the record after the newest one known (target 8),
    // which re-reads up to 59 records.
    eventually(
        "the conservative checkpoint",
        Duration::from_secs(60),
        checkpoint_of_60(SHIFT + 1),
    )
    .await
    .with_context(|| r.log_text())?;

    let status = cli_json(&world, "status", &flow_file, &[])?;
    let row = &status["leastReadyGroups"][0];
    assert_eq!(row["group"], group.as_str(), "{status}");
    assert_eq!(row["reason"], "CheckpointConservative", "{status}");
    assert_eq!(row["estimatedReplayRecords"], 59, "{status}");
    let fresh = condition(&status, "CheckpointsFresh");
    assert_eq!(
        (&fresh["status"], &fresh["reason"]),
        (&"False".into(), &"CheckpointsConservative".into()),
        "{status}"
    );
    assert_ne!(
        condition(&status, "FailoverReady")["status"],
        "True",
        "{status}"
    );
    let translated = cli_json(&world, "translate", &flow_file, &["--group", &group])?;
    assert_eq!(
        translated["groups"][0]["partitions"][0]["offset"],
        SHIFT + 1,
        "the checkpoint in force: {translated}"
    );

    // The copy's sync past the commit, same delta: 60 translates exactly now.
    dense_sync(&source, &syncs, &topic, 99, 99 + SHIFT).await?;
    eventually(
        "the exact checkpoint",
        Duration::from_secs(30),
        checkpoint_of_60(60 + SHIFT),
    )
    .await
    .with_context(|| r.log_text())?;
    let status = cli_json(&world, "status", &flow_file, &[])?;
    let row = &status["leastReadyGroups"][0];
    assert_eq!(
        (&row["reason"], &row["estimatedReplayRecords"]),
        (&"Ready".into(), &0.into()),
        "{status}"
    );
    assert_eq!(
        condition(&status, "CheckpointsFresh")["status"],
        "True",
        "{status}"
    );
    let translated = cli_json(&world, "translate", &flow_file, &["--group", &group])?;
    let offset = translated["groups"][0]["partitions"][0]["offset"]
        .as_i64()
        .context("a translated offset")?;
    let at = kafka::read_partition(&world.target_bootstrap, &remote, 0)?
        .into_iter()
        .find(|(o, _, _)| *o == offset)
        .and_then(|(_, _, v)| v);
    assert_eq!(
        at.as_deref(),
        Some(format!("{name}-60").as_bytes()),
        "translate agrees with the status: the group resumes at source record 60, the first it has not processed"
    );
    Ok(())
}
