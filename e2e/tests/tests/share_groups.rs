//! Share groups (KIP-932) on the source, as a real share consumer makes them: the status names
//! a selected share group as not mirrored, with the fix, and FailoverReady is False for it,
//! where before it was counted as a consumer group that "has not committed yet" (nothing to
//! fail over); excluded, it is not mentioned. Measured with `mirrorflow status --flow-file`,
//! the probe the operator runs.
//!
//! Runs alone (world-tests.sh's exclusive set): while the share group exists, every other
//! flow on the shared source that selects all groups (the default) would rightly see it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use mirrorflow_e2e::handmirror::{cli_json, condition};
use mirrorflow_e2e::kafka::{self, JavaConsumer};
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
