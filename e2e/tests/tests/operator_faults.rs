//! The status tells the truth when things break: a group whose checkpoints stop advancing is
//! listed with its reason, and a source outage turns HeartbeatsFlowing and FailoverReady False
//! with the reason, then recovers. Its own binary: it stops the source cluster.

use std::time::Duration;

use anyhow::{Context, Result};
use kube::Api;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{
    condition, install_operator, patch_flow_spec, roll_flow_spec, wait_for_flow,
};
use mirrorflow_e2e::{World, kafka, run, run_with_input, unique};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

fn commit(bootstrap: &str, group: &str, topic: &str, offset: i64) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))?;
    consumer.commit(&tpl, CommitMode::Sync)?;
    Ok(())
}

async fn wait_for(
    flows: &Api<MirrorFlow>,
    what: &str,
    check: impl Fn(&MirrorFlow) -> bool,
) -> Result<MirrorFlow> {
    wait_for_flow(flows, "flow", what, Duration::from_secs(150), check).await
}

#[tokio::test]
async fn stale_groups_and_a_source_outage_show_in_the_status_with_reasons() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-opf");
    install_operator(&world, &ns)?;
    let alias = unique("opf");
    let topic = unique("opftopic");
    let group = format!("{topic}-billing");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 30, 1).await?;
    commit(&world.source_bootstrap, &group, &topic, 10)?;
    let flow = format!(
        r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: flow, namespace: {ns}}}
spec:
  source: {{alias: {alias}, bootstrapServers: "{src}"}}
  target: {{alias: {alias}-t, bootstrapServers: "{tgt}"}}
  topics: ["{topic}"]
  groups: ["{group}"]
  failoverReadiness: {{maxCheckpointAge: 5s, maxHeartbeatLag: 15s}}
"#,
        src = world.source_bootstrap,
        tgt = world.target_bootstrap,
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &flow)?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    wait_for(&flows, "FailoverReady with the group checkpointed", |mf| {
        condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True")
            && mf.status.as_ref().is_some_and(|s| s.groups == Some(1))
    })
    .await?;

    // Checkpoints stop (the loop is switched off) while the group keeps committing: after
    // maxCheckpointAge the group is listed first with CheckpointStale and what it would re-read.
    patch_flow_spec(&ns, "flow", r#"{"checkpoints":{"enabled":false}}"#)?;
    wait_for(&flows, "the new generation observed", |mf| {
        mf.status.as_ref().and_then(|s| s.observed_generation) == mf.metadata.generation
            && condition(mf, "CheckpointsFresh").is_some_and(|c| c.1 == "CheckpointsDisabled")
    })
    .await?;
    // Let the old pod's checkpoint loop finish before moving the group on.
    tokio::time::sleep(Duration::from_secs(5)).await;
    commit(&world.source_bootstrap, &group, &topic, 25)?;
    let stale = wait_for(&flows, "the group listed as CheckpointStale", |mf| {
        mf.status
            .as_ref()
            .and_then(|s| s.least_ready_groups.first())
            .is_some_and(|g| g.group == group && g.reason == "CheckpointStale")
    })
    .await?;
    let row = &stale.status.as_ref().context("status")?.least_ready_groups[0];
    assert_eq!(
        row.estimated_replay_records, 15,
        "commit 25 vs checkpoint at 10: {row:?}"
    );
    assert!(row.message.contains("old"), "{row:?}");
    assert_eq!(
        condition(&stale, "FailoverReady").map(|c| c.0).as_deref(),
        Some("False")
    );

    // Back on: the group catches up.
    patch_flow_spec(&ns, "flow", r#"{"checkpoints":{"enabled":true}}"#)?;
    wait_for(&flows, "FailoverReady again", |mf| {
        condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True")
    })
    .await?;

    // Copying stops (the source loop is off) and a new topic joins the flow; the group reads
    // it on the source: nothing of it is copied, so no offset sync and no checkpoint can cover
    // the group, and the reason names replication, not checkpoints.
    let topic_b = format!("{topic}-b");
    // The old pod copies until it is gone: wait for the rollout, not just the status.
    roll_flow_spec(
        &flows,
        &ns,
        "flow",
        &format!(r#"{{"sourceLoop":{{"enabled":false}},"topics":["{topic}","{topic_b}"]}}"#),
    )
    .await?;
    kafka::create_topic(&world.source_bootstrap, &topic_b, 1).await?;
    kafka::produce_values(&world.source_bootstrap, &topic_b, 20, 1).await?;
    commit(&world.source_bootstrap, &group, &topic_b, 15)?;
    let behind = wait_for(&flows, "the group listed as ReplicationBehind", |mf| {
        mf.status.as_ref().is_some_and(|s| {
            // One probe reads end offsets before group offsets: wait for one that saw all 20.
            s.replication_lag.is_some_and(|l| l >= 20)
                && s.least_ready_groups
                    .first()
                    .is_some_and(|g| g.group == group && g.reason == "ReplicationBehind")
        })
    })
    .await?;
    let status = behind.status.as_ref().context("status")?;
    let row = &status.least_ready_groups[0];
    assert!(
        row.message.contains("15 records"),
        "commit 15, nothing copied: {row:?}"
    );
    println!(
        "replicationLag with copying off: {:?}",
        status.replication_lag
    );
    assert_eq!(
        condition(&behind, "CheckpointsFresh")
            .map(|c| c.1)
            .as_deref(),
        Some("ReplicationBehind")
    );
    patch_flow_spec(&ns, "flow", r#"{"sourceLoop":{"enabled":true}}"#)?;
    wait_for(&flows, "FailoverReady once copying resumes", |mf| {
        condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True")
    })
    .await?;

    // Then the source goes away.
    world.world_sh(&["kafka", "stop", "source"])?;
    let outcome = wait_for(
        &flows,
        "HeartbeatsFlowing and FailoverReady False: SourceUnreachable",
        |mf| {
            condition(mf, "HeartbeatsFlowing")
                .is_some_and(|c| c.0 == "False" && c.1 == "SourceUnreachable")
                && condition(mf, "FailoverReady")
                    .is_some_and(|c| c.0 == "False" && c.1 == "SourceUnreachable")
        },
    )
    .await;
    world.world_sh(&["kafka", "start", "source"])?;
    outcome?;
    wait_for(&flows, "HeartbeatsFlowing recovered", |mf| {
        condition(mf, "HeartbeatsFlowing").is_some_and(|c| c.0 == "True")
    })
    .await?;

    run(
        "kubectl",
        &[
            "delete",
            "mf",
            "flow",
            "-n",
            &ns,
            "--wait=true",
            "--timeout=60s",
        ],
    )?;
    run("helm", &["uninstall", "mirrorflow", "-n", &ns, "--wait"])?;
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}
