//! Share groups (KIP-932) on the source, as a real share consumer makes them: a running
//! replicator checkpoints a share group's start offsets (where its consumers are) in MM2's
//! format, the status judges them like committed offsets, and `mirrorflow failover --apply`
//! sets them on the target, where a share consumer of the group then skips nothing. The status
//! is measured with `mirrorflow status --flow-file`, the probe the operator runs.
//!
//! Runs alone (world-tests.sh's exclusive set): while the share group exists, every other
//! flow on the shared source that selects all groups (the default) would rightly see it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use mirrorflow::mm2::Checkpoint;
use mirrorflow_e2e::fidelity::free_port;
use mirrorflow_e2e::handmirror::{cli_json, condition, ready_to_fail_over};
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
    /// A share consumer of `group` on `topic`, on the cluster at `bootstrap`.
    fn start(bootstrap: &str, group: &str, topic: &str) -> Result<ShareGroup> {
        Ok(ShareGroup {
            bootstrap: bootstrap.to_owned(),
            group: group.to_owned(),
            consumer: Some(JavaConsumer::share(bootstrap, group, topic)?),
            deleted: false,
        })
    }

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

/// Without a replicator, a selected share group is judged on its start offsets as a consumer
/// group on its commits: named with no checkpoint and FailoverReady False (it used to be counted
/// as a consumer group that "has not committed yet", nothing to fail over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selected_share_group_without_checkpoints_is_named_and_blocks_failover() -> Result<()> {
    let world = World::from_env()?;
    let topic = unique("queued");
    let prefix = unique("sg");
    let group = format!("{prefix}-queue");
    kafka::create_topic(&world.source_bootstrap, &topic, 2).await?;
    let mut share = ShareGroup::start(&world.source_bootstrap, &group, &topic)?;

    let selected = flow_file(&world, &topic, &format!("{prefix}-.*"), "none")?;
    let row = eventually(
        "the share group named in the status",
        Duration::from_secs(90),
        || {
            let status = cli_json(&world, "status", &selected, &[]);
            let (world, topic) = (&world, &topic);
            async move {
                // Its start offsets exist once it read something.
                kafka::produce_values(&world.source_bootstrap, topic, 4, 2).await?;
                let status = status?;
                let row = status["leastReadyGroups"][0].clone();
                if row["reason"] != "NoCheckpoint" {
                    return Ok(None);
                }
                let failover = condition(&status, "FailoverReady");
                anyhow::ensure!(failover["status"] == "False", "FailoverReady: {failover}");
                Ok(Some(row))
            }
        },
    )
    .await?;
    assert_eq!(row["group"], group.as_str(), "{row}");

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

/// A flow that copies one topic and checkpoints one share group, and the group's share
/// consumer on the source, reading and acknowledging what is written while it runs.
struct Mirrored {
    world: World,
    topic: String,
    alias: String,
    group: String,
    flow_file: PathBuf,
    replicator: Replicator,
    share: ShareGroup,
}

type Starts = std::collections::BTreeMap<(String, i32), i64>;

impl Mirrored {
    /// `checkpoints` is the flow's `spec.checkpoints`, as YAML flow style.
    async fn start(prefix: &str, checkpoints: &str) -> Result<Mirrored> {
        let world = World::from_env()?;
        let topic = unique("queued");
        let alias = unique(prefix);
        let group = unique(&format!("{prefix}-queue"));
        kafka::create_topic(&world.source_bootstrap, &topic, 2).await?;
        let port = free_port()?;
        let flow = format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {alias}, namespace: e2e}}\nspec:\n  source: {{alias: {alias}, bootstrapServers: '{src}'}}\n  target: {{alias: {alias}-t, bootstrapServers: '{tgt}'}}\n  topics: ['{topic}']\n  groups: ['{group}']\n  checkpoints: {checkpoints}\n",
            src = world.source_bootstrap,
            tgt = world.target_bootstrap,
        );
        let flow_file = std::env::temp_dir().join(format!("{alias}.yaml"));
        std::fs::write(&flow_file, &flow)?;
        let replicator =
            Replicator::start(&world.repo_root, &format!("{alias}-{port}"), &flow, port)?;
        replicator.wait_ready().await?;
        let share = ShareGroup::start(&world.source_bootstrap, &group, &topic)?;
        Ok(Mirrored {
            world,
            topic,
            alias,
            group,
            flow_file,
            replicator,
            share,
        })
    }

    /// The group's start offsets as Kafka's own tool reports them on `bootstrap`.
    fn starts(&self, bootstrap: &str) -> Result<Starts> {
        tokio::task::block_in_place(|| kafka::share_start_offsets(bootstrap, &self.group))
    }

    /// A share group starts at the log's end (share.auto.offset.reset=latest) when its first
    /// consumer joins: records are written, a few at a time, until its start offsets moved.
    async fn until_moved(&self) -> Result<Starts> {
        eventually(
            "the share group's start offsets past the first records",
            Duration::from_secs(90),
            || async {
                kafka::produce_values(&self.world.source_bootstrap, &self.topic, 10, 2).await?;
                let starts = self.starts(&self.world.source_bootstrap)?;
                Ok((starts.len() == 2 && starts.values().all(|&s| s > 0)).then_some(starts))
            },
        )
        .await
    }

    /// Waits for checkpoints of both partitions at the start offsets Kafka reports, each past
    /// `past`; returns those offsets and checkpoints.
    async fn checkpointed(&self, past: &Starts) -> Result<(Starts, [Checkpoint; 2])> {
        let found = eventually(
            "checkpoints at the start offsets Kafka reports",
            Duration::from_secs(90),
            || async {
                let starts = self.starts(&self.world.source_bootstrap)?;
                let written =
                    checkpoints_of(&self.world.target_bootstrap, &self.alias, &self.group)?;
                let latest = |p: i32| {
                    (written.iter())
                        .filter(|w| w.cp.topic_partition.partition == p)
                        .map(|w| w.cp.clone())
                        .next_back()
                };
                let at = |p: i32| starts.get(&(self.topic.clone(), p)).copied();
                let matched = [0, 1].into_iter().all(|p| {
                    latest(p).is_some_and(|cp| Some(cp.upstream_offset) == at(p))
                        && at(p) > past.get(&(self.topic.clone(), p)).copied()
                });
                Ok(match (matched, latest(0), latest(1)) {
                    (true, Some(a), Some(b)) => Some((starts.clone(), [a, b])),
                    _ => None,
                })
            },
        )
        .await?;
        let (starts, checkpoints) = found;
        for (p, cp) in (0..).zip(&checkpoints) {
            assert_eq!(
                cp.topic_partition.topic,
                format!("{}.{}", self.alias, self.topic)
            );
            assert_eq!(cp.topic_partition.partition, p);
            let start = starts[&(self.topic.clone(), p)];
            // A new remote topic copied one to one: the same offset.
            assert_eq!(
                (cp.upstream_offset, cp.downstream_offset),
                (start, start),
                "{cp:?}"
            );
        }
        Ok((starts, checkpoints))
    }

    async fn clean_up(mut self) -> Result<()> {
        self.replicator.stop(Duration::from_secs(10));
        tokio::task::block_in_place(|| self.share.delete())?;
        kafka::delete_topic(&self.world.source_bootstrap, &self.topic).await
    }
}

/// A share consumer reads and acknowledges what is written while it runs; once the writing
/// stops, the replicator's checkpoints of its group carry, per partition, the start offset the
/// share coordinator keeps, as Kafka's own `kafka-share-groups.sh` reports it, translated to the
/// remote topic. The coordinator's start offset may stay at the first offset of the last batch
/// it acknowledged (Kafka 4.3 keeps that batch's state beside it): a failover to it delivers at
/// most that batch again, and skips nothing. With `syncGroupOffsets`, the group's start offsets
/// on the target follow its checkpoints (the group made there, idle: no consumer of it runs on
/// the target).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_groups_start_offsets_are_checkpointed_and_synced() -> Result<()> {
    let m = Mirrored::start("sgc", "{syncGroupOffsets: true}").await?;
    let moved = m.until_moved().await?;
    kafka::produce_values(&m.world.source_bootstrap, &m.topic, 20, 2).await?;
    m.checkpointed(&moved).await?;
    let remote = format!("{}.{}", m.alias, m.topic);
    eventually(
        "the target group's start offsets at the checkpoints",
        Duration::from_secs(60),
        || async {
            let (_, checkpoints) = m.checkpointed(&moved).await?;
            let on_target = m.starts(&m.world.target_bootstrap)?;
            let synced = (0..)
                .zip(&checkpoints)
                .all(|(p, cp)| on_target.get(&(remote.clone(), p)) == Some(&cp.downstream_offset));
            Ok(synced.then_some(()))
        },
    )
    .await?;
    tokio::task::block_in_place(|| kafka::delete_share_group(&m.world.target_bootstrap, &m.group))?;
    m.clean_up().await
}

/// The group's consumer stops on the source; records written after it are never delivered
/// there. `mirrorflow failover --apply` sets the group's start offsets on the target at its
/// checkpoints (AlterShareGroupOffsets; no consumer group of its name is made), and a share
/// consumer of the group on the target then reads every record from there on: 0 skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_group_fails_over_at_its_checkpoints_with_nothing_skipped() -> Result<()> {
    let mut m = Mirrored::start("sgf", "{}").await?;
    let moved = m.until_moved().await?;
    kafka::produce_values(&m.world.source_bootstrap, &m.topic, 20, 2).await?;
    // Checkpointed as it reads; then the consumer stops (acknowledging what it read).
    m.checkpointed(&moved).await?;
    if let Some(consumer) = m.share.consumer.take() {
        consumer.stop();
    }
    let (starts, checkpoints) = m.checkpointed(&moved).await?;
    // Never delivered on the source: written after its consumer left.
    let producer = kafka::producer(&m.world.source_bootstrap, Duration::from_secs(30))?;
    let unread: Vec<String> = (0..20).map(|_| unique("unread")).collect();
    for (i, value) in (0..).zip(&unread) {
        producer
            .send(
                rdkafka::producer::FutureRecord::<(), _>::to(&m.topic)
                    .payload(value)
                    .partition(i % 2),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    let remote = format!("{}.{}", m.alias, m.topic);
    let copied = eventually(
        "the unread records copied",
        Duration::from_secs(60),
        || async {
            let records: Vec<Vec<kafka::Record>> = [0, 1]
                .into_iter()
                .map(|p| kafka::read_partition(&m.world.target_bootstrap, &remote, p))
                .collect::<Result<_>>()?;
            let values: std::collections::HashSet<Vec<u8>> = (records.iter().flatten())
                .filter_map(|r| r.2.clone())
                .collect();
            Ok(unread
                .iter()
                .all(|v| values.contains(v.as_bytes()))
                .then_some(records))
        },
    )
    .await?;

    // The status says the group can fail over, on its checkpoints at its start offsets.
    ready_to_fail_over(
        &m.world,
        &m.flow_file,
        &m.group,
        "a share group: the group can fail over",
    )
    .await?;

    // A consumer of the group started on the target too early: the coordinator refuses to
    // move the group while it has a member (there is no --force for that).
    let early = JavaConsumer::share(&m.world.target_bootstrap, &m.group, &remote)?;
    eventually(
        "the early consumer in the group",
        Duration::from_secs(60),
        || async {
            let listed = tokio::task::block_in_place(|| {
                kafka::group_listed(&m.world.target_bootstrap, &m.group)
            })?;
            Ok(listed.then_some(()))
        },
    )
    .await?;
    let refused = eventually("the failover refused", Duration::from_secs(60), || async {
        let report = cli_json(
            &m.world,
            "failover",
            &m.flow_file,
            &["--group", &m.group, "--apply"],
        )?;
        Ok((report["groups"][0]["action"] == "failed").then_some(report))
    })
    .await?;
    let message = refused["groups"][0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("NON_EMPTY_GROUP") && message.contains("stop its share consumers"),
        "{message}"
    );
    early.stop();

    // Stopped: the group fails over. It may have start offsets of its own there by now (at the
    // end, where the early consumer joined): moved back to the checkpoints.
    let report = eventually("the failover applied", Duration::from_secs(60), || async {
        let report = cli_json(
            &m.world,
            "failover",
            &m.flow_file,
            &["--group", &m.group, "--apply", "--allow-rewind"],
        )?;
        Ok((report["groups"][0]["action"] == "committed").then_some(report))
    })
    .await?;
    let planned = &report["groups"][0];
    assert_eq!(planned["group"], m.group.as_str(), "{report}");
    assert_eq!(planned["shareGroup"], true, "{report}");
    assert_eq!(planned["action"], "committed", "{report}");
    let on_target = m.starts(&m.world.target_bootstrap)?;
    for (p, cp) in (0..).zip(&checkpoints) {
        assert_eq!(
            on_target.get(&(remote.clone(), p)),
            Some(&cp.downstream_offset),
            "the target's start offsets are the checkpoints'"
        );
    }
    // The name is a share group on the target, not a consumer group the failover made of it
    // (share consumers could not join that).
    assert_eq!(
        kafka::group_type(&m.world.target_bootstrap, &m.group)?.as_deref(),
        Some("Share")
    );

    let printed = std::env::temp_dir().join(format!("{}.values", m.group));
    let target_consumer =
        JavaConsumer::share_printing(&m.world.target_bootstrap, &m.group, &remote, &printed)?;
    // Every record of the remote partitions from the start offsets on: what a consumer that
    // skips nothing reads.
    let due: Vec<String> = (0..)
        .zip(&copied)
        .flat_map(|(p, records)| {
            let start = checkpoints[usize::try_from(p).unwrap_or(0)].downstream_offset;
            (records.iter())
                .filter(move |r| r.0 >= start)
                .filter_map(|r| {
                    r.2.as_ref()
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                })
        })
        .collect();
    let read = eventually(
        "the target's share consumer read every record from the start offsets on",
        Duration::from_secs(90),
        || async {
            let text = std::fs::read_to_string(&printed).unwrap_or_default();
            let read: std::collections::HashSet<String> = text.lines().map(str::to_owned).collect();
            Ok(due.iter().all(|v| read.contains(v)).then_some(read))
        },
    )
    .await?;
    target_consumer.stop();
    let skipped = unread.iter().filter(|v| !read.contains(*v)).count();
    assert_eq!(
        skipped, 0,
        "records never delivered on the source, skipped on the target"
    );
    eprintln!(
        "failover of share group {}: source start offsets {starts:?}, {} records read on the target",
        m.group,
        read.len()
    );
    // Failback does not read start offsets backwards: refused, with the way that works.
    let back = cli_json(&m.world, "failback", &m.flow_file, &["--group", &m.group])?;
    assert_eq!(back["groups"][0]["action"], "refused", "{back}");
    let message = back["groups"][0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("a share group") && message.contains("reverse flow"),
        "{message}"
    );
    tokio::task::block_in_place(|| kafka::delete_share_group(&m.world.target_bootstrap, &m.group))?;
    m.clean_up().await
}
