//! Share groups (KIP-932) on the source, as a real share consumer makes them: a running
//! replicator checkpoints a share group's start offsets (where its consumers are) in MM2's
//! format; the status names a selected share group as not ready to fail over, with the fix
//! (a failover does not set its start offsets on the target yet), and FailoverReady is False
//! for it, where before it was counted as a consumer group that "has not committed yet"
//! (nothing to fail over); excluded, it is not mentioned. The status is measured with
//! `mirrorflow status --flow-file`, the probe the operator runs.
//!
//! Runs alone (world-tests.sh's exclusive set): while the share group exists, every other
//! flow on the shared source that selects all groups (the default) would rightly see it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use mirrorflow_e2e::fidelity::free_port;
use mirrorflow_e2e::handmirror::{cli_json, condition};
use mirrorflow_e2e::kafka::{self, JavaConsumer};
use mirrorflow_e2e::replicator::Replicator;
use mirrorflow_e2e::steady::checkpoints_of;
use mirrorflow_e2e::{World, eventually, unique};

/// The share group and its consumer, deleted at the end ([`ShareGroup::delete`]) or, if the
/// test fails first, when dropped.
struct ShareGroup {
    bootstrap: String,
    group: String,
    consumer: Option<JavaConsumer>,
    deleted: bool,
}

impl ShareGroup {
    /// Stops its consumer (it leaves the group) and deletes the group.
    fn delete(&mut self) -> Result<()> {
        if let Some(consumer) = self.consumer.take() {
            consumer.stop();
        }
        kafka::delete_share_group(&self.bootstrap, &self.group)?;
        self.deleted = true;
        Ok(())
    }
}

impl Drop for ShareGroup {
    fn drop(&mut self) {
        if !self.deleted
            && let Err(e) = self.delete()
        {
            eprintln!("share group {} left behind: {e:#}", self.group);
        }
    }
}

fn flow_file(world: &World, topic: &str, groups: &str, exclude: &str) -> Result<PathBuf> {
    let yaml = format!(
        "source: {{alias: {alias}, bootstrapServers: \"{src}\"}}\ntarget: {{alias: {alias}-t, bootstrapServers: \"{tgt}\"}}\ntopics: [\"{topic}\"]\ngroups: [\"{groups}\"]\ngroupsExclude: [\"{exclude}\"]\n",
        alias = unique("sg"),
        src = world.source_bootstrap,
        tgt = world.target_bootstrap,
    );
    let file = std::env::temp_dir().join(format!("{}.yaml", unique("share-flow")));
    std::fs::write(&file, yaml)?;
    Ok(file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selected_share_group_is_named_not_mirrored_with_the_fix() -> Result<()> {
    let world = World::from_env()?;
    let topic = unique("queued");
    let prefix = unique("sg");
    let group = format!("{prefix}-queue");
    kafka::create_topic(&world.source_bootstrap, &topic, 2).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 20, 2).await?;
    let mut share = ShareGroup {
        bootstrap: world.source_bootstrap.clone(),
        group: group.clone(),
        consumer: Some(JavaConsumer::share(
            &world.source_bootstrap,
            &group,
            &topic,
        )?),
        deleted: false,
    };

    let selected = flow_file(&world, &topic, &format!("{prefix}-.*"), "none")?;
    let row = eventually(
        "the share group named in the status",
        Duration::from_secs(90),
        || {
            let status = cli_json(&world, "status", &selected, &[]);
            async move {
                let status = status?;
                let fresh = condition(&status, "CheckpointsFresh");
                if fresh["reason"] != "GroupsNotMirrored" {
                    return Ok(None);
                }
                let failover = condition(&status, "FailoverReady");
                anyhow::ensure!(failover["status"] == "False", "FailoverReady: {failover}");
                Ok(Some((fresh.clone(), status["leastReadyGroups"][0].clone())))
            }
        },
    )
    .await?;
    let (fresh, least_ready) = row;
    let message = fresh["message"].as_str().context("a message")?;
    assert!(message.contains(&group), "{message}");
    assert!(message.contains("a share group"), "{message}");
    assert!(message.contains("share.auto.offset.reset"), "{message}");
    assert!(message.contains("spec.groupsExclude"), "{message}");
    assert_eq!(least_ready["group"], group.as_str());
    assert_eq!(least_ready["reason"], "ShareGroupNotMirrored");

    // Left out by the flow's exclusion: nothing about it, and nothing blocks.
    let excluded = flow_file(&world, &topic, &format!("{prefix}-.*"), &group)?;
    let status = cli_json(&world, "status", &excluded, &[])?;
    let fresh = condition(&status, "CheckpointsFresh");
    assert_eq!(fresh["status"], "True", "{fresh}");
    assert!(!status.to_string().contains(&group), "{status}");
    tokio::task::block_in_place(|| share.delete())?;
    kafka::delete_topic(&world.source_bootstrap, &topic).await?;
    Ok(())
}

/// A share consumer reads and acknowledges what is written while it runs; once the writing
/// stops, the replicator's checkpoints of its group carry, per partition, the start offset the
/// share coordinator keeps, as Kafka's own `kafka-share-groups.sh` reports it, translated to the
/// remote topic (the same offset: a new remote topic copied one to one). The coordinator's start
/// offset may stay at the first offset of the last batch it acknowledged (Kafka 4.3 keeps that
/// batch's state beside it): a failover to it re-delivers at most that batch, and skips nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_groups_start_offsets_are_checkpointed() -> Result<()> {
    let world = World::from_env()?;
    let topic = unique("queued");
    let alias = unique("sgc");
    let group = unique("sgc-queue");
    kafka::create_topic(&world.source_bootstrap, &topic, 2).await?;
    let port = free_port()?;
    let flow = format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {alias}, namespace: e2e}}\nspec:\n  source: {{alias: {alias}, bootstrapServers: '{src}'}}\n  target: {{alias: {alias}-t, bootstrapServers: '{tgt}'}}\n  topics: ['{topic}']\n  groups: ['{group}']\n",
        src = world.source_bootstrap,
        tgt = world.target_bootstrap,
    );
    let replicator = Replicator::start(&world.repo_root, &format!("{alias}-{port}"), &flow, port)?;
    replicator.wait_ready().await?;
    let mut share = ShareGroup {
        bootstrap: world.source_bootstrap.clone(),
        group: group.clone(),
        consumer: Some(JavaConsumer::share(
            &world.source_bootstrap,
            &group,
            &topic,
        )?),
        deleted: false,
    };
    // A share group starts at the log's end (share.auto.offset.reset=latest) when its first
    // consumer joins: records are written, a few at a time, until its start offsets moved.
    let moved = eventually(
        "the share group's start offsets past the first records",
        Duration::from_secs(90),
        || {
            let (world, topic, group) = (&world, &topic, &group);
            async move {
                kafka::produce_values(&world.source_bootstrap, topic, 10, 2).await?;
                let starts = tokio::task::block_in_place(|| {
                    kafka::share_start_offsets(&world.source_bootstrap, group)
                })?;
                Ok((starts.len() == 2 && starts.values().all(|&s| s > 0)).then_some(starts))
            }
        },
    )
    .await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 20, 2).await?;
    let (starts, checkpoints) = eventually(
        "checkpoints at the start offsets Kafka reports",
        Duration::from_secs(90),
        || {
            let (world, topic, alias, group, moved) = (&world, &topic, &alias, &group, &moved);
            async move {
                let starts = tokio::task::block_in_place(|| {
                    kafka::share_start_offsets(&world.source_bootstrap, group)
                })?;
                let written = checkpoints_of(&world.target_bootstrap, alias, group)?;
                let latest = |p: i32| {
                    (written.iter())
                        .filter(|w| w.cp.topic_partition.partition == p)
                        .map(|w| w.cp.clone())
                        .next_back()
                };
                let at = |p: i32| starts.get(&(topic.clone(), p)).copied();
                let matched = [0, 1].into_iter().all(|p| {
                    latest(p).is_some_and(|cp| Some(cp.upstream_offset) == at(p))
                        && at(p).is_some_and(|s| s > moved[&(topic.clone(), p)])
                });
                Ok(matched.then(|| (starts.clone(), [latest(0), latest(1)])))
            }
        },
    )
    .await?;
    for (p, cp) in checkpoints.into_iter().enumerate() {
        let cp = cp.context("a checkpoint per partition")?;
        let p = i32::try_from(p)?;
        assert_eq!(cp.topic_partition.topic, format!("{alias}.{topic}"));
        assert_eq!(cp.topic_partition.partition, p);
        let start = starts[&(topic.clone(), p)];
        assert_eq!(
            (cp.upstream_offset, cp.downstream_offset),
            (start, start),
            "{cp:?}"
        );
    }
    drop(replicator);
    tokio::task::block_in_place(|| share.delete())?;
    kafka::delete_topic(&world.source_bootstrap, &topic).await?;
    Ok(())
}
