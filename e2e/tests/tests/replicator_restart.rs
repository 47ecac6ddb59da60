//! A rolling restart moves no partition: a replica named with `--replica` (every pod is) joins
//! the source group as a static member, so when it stops and starts again within the session
//! timeout it gets its own partitions back and the other replicas are never asked to take them.
//! The same restart with unnamed (dynamic) replicas is measured beside it, so the test shows
//! the difference rather than assume it. Records are produced throughout: none may be lost.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use mirrorflow_e2e::replicator::{Membership, Replicator, number_field, plain};
use mirrorflow_e2e::switchover::end_offsets;
use mirrorflow_e2e::{World, eventually, fidelity, kafka, unique};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;

const WAIT: Duration = Duration::from_secs(90);
const PARTITIONS: i32 = 6;

/// How many partitions `topic` has (0 when it does not exist).
fn partition_count(bootstrap: &str, topic: &str) -> Result<usize> {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let metadata = client.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(metadata
        .topics()
        .first()
        .map(|t| t.partitions().len())
        .unwrap_or(0))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The partition counts a replica's log reported, in order ("source partitions assigned to
/// this consumer ... partitions=N").
fn assignments(log: &str) -> Vec<u32> {
    log.lines()
        .filter(|l| l.contains("assigned to this consumer"))
        .filter_map(|l| number_field(&plain(l), "partitions"))
        .collect()
}

struct Outcome {
    /// Partitions the replica that stayed up took on while the other restarted.
    moved_to_survivor: u32,
    /// From the stop until the restarted replica owned partitions again.
    back_after: Duration,
}

async fn restart_one_of_two(membership: Membership) -> Result<Outcome> {
    let world = World::from_env()?;
    let prefix = match membership {
        Membership::Static => "rstatic",
        Membership::Dynamic => "rdynamic",
    };
    let name = unique(prefix);
    let topic = unique(prefix);
    let (source_alias, target_alias) = (unique("src"), unique("tgt"));
    kafka::create_topic(&world.source_bootstrap, &topic, PARTITIONS).await?;
    let flow = format!(
        "source: {{alias: {source_alias}, bootstrapServers: '{}'}}\n\
         target: {{alias: {target_alias}, bootstrapServers: '{}'}}\n\
         topics: ['{topic}']\n\
         checkpoints: {{enabled: false}}\n\
         heartbeats: {{enabled: false}}\n\
         sourceLoop: {{topicsRefreshInterval: 1s, offsetSyncInterval: 1s}}\n",
        world.source_bootstrap, world.target_bootstrap
    );
    let start = |replica: &str| {
        Replicator::start_as(
            &world.repo_root,
            &format!("{name}-{replica}"),
            &flow,
            free_port()?,
            membership,
        )
    };
    let survivor = start("a")?;
    let mut restarted = start("b")?;
    let assigned = |r: &Replicator| r.metric("mirrorflow_assigned_partitions").unwrap_or(0.0);
    // Every partition of the topic and of `heartbeats` (always replicated; other tests may
    // create it meanwhile) is owned once.
    let total = || -> Result<f64> {
        Ok(f64::from(PARTITIONS) + partition_count(&world.source_bootstrap, "heartbeats")? as f64)
    };
    let split = || {
        let (x, y, all) = (assigned(&survivor), assigned(&restarted), total());
        async move { Ok((x > 0.0 && y > 0.0 && x + y == all?).then_some(())) }
    };
    eventually(
        "both replicas own partitions, all of them once",
        WAIT,
        split,
    )
    .await
    .with_context(|| format!("{}\n---\n{}", survivor.log_text(), restarted.log_text()))?;
    let before = assignments(&survivor.log_text());
    let owned_before = before.last().copied().unwrap_or(0);

    let producer = kafka::producer(&world.source_bootstrap, Duration::from_secs(30))?;
    let produced = 3_000u32;
    let writing = {
        let topic = topic.clone();
        tokio::spawn(async move {
            for i in 0..produced {
                let value = format!("r{i}");
                let key = i.to_string();
                producer
                    .send(
                        FutureRecord::to(&topic).key(&key).payload(&value),
                        Duration::from_secs(30),
                    )
                    .await
                    .map_err(|(e, _)| e)?;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            anyhow::Ok(())
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopped = Instant::now();
    restarted.stop(Duration::from_secs(30));
    // A pod comes back after its container starts; a second is about the fastest.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let restarted = start("b")?;
    eventually("the restarted replica owns partitions again", WAIT, || {
        let (x, y, all) = (assigned(&survivor), assigned(&restarted), total());
        async move { Ok((y > 0.0 && x + y == all?).then_some(())) }
    })
    .await
    .with_context(|| format!("{}\n---\n{}", survivor.log_text(), restarted.log_text()))?;
    let back_after = stopped.elapsed();
    writing.await??;

    let remote = format!("{source_alias}.{topic}");
    eventually(
        "every record produced during the restart copied",
        WAIT,
        || {
            let n: i64 = end_offsets(&world.target_bootstrap, &remote, PARTITIONS)
                .map(|e| e.iter().sum())
                .unwrap_or(0);
            async move { Ok((n >= i64::from(produced)).then_some(())) }
        },
    )
    .await
    .with_context(|| format!("{}\n---\n{}", survivor.log_text(), restarted.log_text()))?;

    let mut copied = std::collections::BTreeSet::new();
    for p in 0..PARTITIONS {
        for r in fidelity::read_visible(&world.target_bootstrap, &remote, p)? {
            copied.insert(r.value);
        }
    }
    let lost: Vec<u32> = (0..produced)
        .filter(|i| !copied.contains(&format!("r{i}")))
        .collect();
    ensure!(
        lost.is_empty(),
        "{} records lost in the restart, first {:?}",
        lost.len(),
        lost.first()
    );

    let after = assignments(&survivor.log_text());
    let peak = after
        .iter()
        .skip(before.len())
        .copied()
        .max()
        .unwrap_or(owned_before);
    Ok(Outcome {
        moved_to_survivor: peak.saturating_sub(owned_before),
        back_after,
    })
}

#[tokio::test]
async fn a_restarted_static_replica_gets_its_partitions_back_and_moves_none() -> Result<()> {
    let dynamic = restart_one_of_two(Membership::Dynamic).await?;
    let fixed = restart_one_of_two(Membership::Static).await?;
    eprintln!(
        "rolling restart of 1 of 2 replicas: dynamic membership moved {} partitions to the other replica (owner back after {:?}); static membership moved {} (back after {:?})",
        dynamic.moved_to_survivor, dynamic.back_after, fixed.moved_to_survivor, fixed.back_after
    );
    ensure!(
        fixed.moved_to_survivor == 0,
        "a static member's restart moved {} partitions to the other replica",
        fixed.moved_to_survivor
    );
    ensure!(
        dynamic.moved_to_survivor > 0,
        "the dynamic restart moved no partition either: the measurement cannot tell the two apart"
    );
    Ok(())
}

/// A static member that comes back within its session gets its old partitions without a
/// rebalance, whatever it subscribes to now. A topic created, and partitions added, while the
/// replica was down must still be copied once it is back (the replica joins under a new name
/// when what it copies changed: `engine::subscription`). Without that, the old assignment
/// stayed for good (found intermittently by `operator_faults`).
#[tokio::test]
async fn a_static_replica_back_to_new_topics_and_partitions_copies_them() -> Result<()> {
    use rdkafka::admin::{AdminOptions, NewPartitions};
    let world = World::from_env()?;
    let name = unique("rgrown");
    let topic = unique("rgrown");
    let added = format!("{topic}-added");
    let (source_alias, target_alias) = (unique("src"), unique("tgt"));
    kafka::create_topic(&world.source_bootstrap, &topic, 2).await?;
    let flow = format!(
        "source: {{alias: {source_alias}, bootstrapServers: '{}'}}\n\
         target: {{alias: {target_alias}, bootstrapServers: '{}'}}\n\
         topics: ['{topic}.*']\n\
         checkpoints: {{enabled: false}}\n\
         heartbeats: {{enabled: false}}\n\
         sourceLoop: {{topicsRefreshInterval: 1s, offsetSyncInterval: 1s}}\n",
        world.source_bootstrap, world.target_bootstrap
    );
    let start = || {
        Replicator::start_as(
            &world.repo_root,
            &format!("{name}-a"),
            &flow,
            free_port()?,
            Membership::Static,
        )
    };
    let assigned = |r: &Replicator| r.metric("mirrorflow_assigned_partitions").unwrap_or(0.0);
    let heartbeats = || partition_count(&world.source_bootstrap, "heartbeats");
    let mut first = start()?;
    eventually("the replica owns every partition", WAIT, || {
        let (owned, all) = (assigned(&first), heartbeats().map(|h| h as f64 + 2.0));
        async move { Ok((owned == all?).then_some(())) }
    })
    .await
    .with_context(|| first.log_text())?;

    first.stop(Duration::from_secs(30));
    let admin = kafka::admin(&world.source_bootstrap)?;
    let grown = admin
        .create_partitions(&[NewPartitions::new(&topic, 4)], &AdminOptions::new())
        .await?;
    for result in grown {
        result.map_err(|(t, e)| anyhow::anyhow!("adding partitions to {t}: {e}"))?;
    }
    kafka::create_topic(&world.source_bootstrap, &added, 1).await?;
    eventually("the source shows the new partitions", WAIT, || {
        let n = partition_count(&world.source_bootstrap, &topic);
        async move { Ok((n? == 4).then_some(())) }
    })
    .await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 40, 4).await?;
    kafka::produce_values(&world.source_bootstrap, &added, 10, 1).await?;
    // Back well within the 20 s session of the old name.
    let back = start()?;
    eventually(
        "the replica back owns the new topic's and the new partitions too",
        WAIT,
        || {
            let (owned, all) = (assigned(&back), heartbeats().map(|h| h as f64 + 5.0));
            async move { Ok((owned == all?).then_some(())) }
        },
    )
    .await
    .with_context(|| back.log_text())?;
    for (source, partitions, records) in [(&topic, 4, 40), (&added, 1, 10)] {
        let remote = format!("{source_alias}.{source}");
        eventually(&format!("every record of {source} copied"), WAIT, || {
            let n: i64 = end_offsets(&world.target_bootstrap, &remote, partitions)
                .map(|e| e.iter().sum())
                .unwrap_or(0);
            async move { Ok((n >= records).then_some(())) }
        })
        .await
        .with_context(|| back.log_text())?;
    }
    Ok(())
}
