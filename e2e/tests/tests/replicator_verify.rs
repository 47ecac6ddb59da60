//! The checkpoint loop's continuous verification against the world's real Kafka: within two
//! verification periods it catches a remote topic written by another producer at a
//! checkpoint's offset, and a translation broken on purpose (the debug build's test-only
//! fault injection), and the status (`mirrorflow status`, the probe's rules) names each.
//!
//! Records are mirrored by hand (the source loop is off), as in `status_probe.rs`: the same
//! values on both sides, the target's after `SHIFT` fillers, with the dense offset syncs the
//! source loop would write.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, ensure};
use mirrorflow::mm2::Checkpoint;
use mirrorflow::verify::header::{VERIFICATION_HEADER, Verification};
use mirrorflow::verify::outcome::Outcome;
use mirrorflow_e2e::handmirror::{cli_json, condition, dense_sync, send_value};
use mirrorflow_e2e::replicator::{Membership, Replicator};
use mirrorflow_e2e::{World, eventually, kafka, unique};
use rdkafka::producer::FutureProducer;

/// Target offsets of the hand-mirrored records are source offsets plus this.
const SHIFT: i64 = 7;
/// The flow's `spec.checkpoints.verifyInterval`.
const PERIOD: Duration = Duration::from_secs(3);
const RECORDS: i64 = 100;
/// `MIRRORFLOW_TEST_CHECKPOINT_SKEW` of the debug build.
const SKEW_ENV: &str = "MIRRORFLOW_TEST_CHECKPOINT_SKEW";

struct Mirrored {
    world: World,
    name: String,
    source_alias: String,
    target_alias: String,
    topic: String,
    remote: String,
    group: String,
    target: FutureProducer,
}

/// `RECORDS` records mirrored by hand, with the copy's syncs of its first and last record.
async fn mirrored(prefix: &str) -> Result<Mirrored> {
    let world = World::from_env()?;
    let name = unique(prefix);
    let (source_alias, target_alias) = (unique("src"), unique("tgt"));
    let topic = unique("orders");
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
    for i in 0..RECORDS {
        let value = format!("{name}-{i}");
        let up = send_value(&source, &topic, &value).await?;
        let down = send_value(&target, &remote, &value).await?;
        ensure!(down == up + SHIFT, "target offset {down} for source {up}");
    }
    dense_sync(&source, &syncs, &topic, 0, SHIFT).await?;
    dense_sync(&source, &syncs, &topic, RECORDS - 1, RECORDS - 1 + SHIFT).await?;
    Ok(Mirrored {
        group: format!("{topic}-app"),
        world,
        name,
        source_alias,
        target_alias,
        topic,
        remote,
        target,
    })
}

impl Mirrored {
    /// Starts a replicator (with `env`) and waits until it is ready.
    async fn start(&self, env: &[(&str, &str)]) -> Result<Replicator> {
        let yaml = format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: e2e}}\nspec:\n  source: {{alias: {s}, bootstrapServers: '{sb}'}}\n  target: {{alias: {t}, bootstrapServers: '{tb}'}}\n  topics: ['{topic}']\n  groups: ['{group}']\n  sourceLoop: {{enabled: false}}\n  heartbeats: {{enabled: false}}\n  checkpoints: {{verifyInterval: {period}s}}\n",
            name = self.name,
            s = self.source_alias,
            t = self.target_alias,
            sb = self.world.source_bootstrap,
            tb = self.world.target_bootstrap,
            topic = self.topic,
            group = self.group,
            period = PERIOD.as_secs(),
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let r = Replicator::start_with_env(
            &self.world.repo_root,
            &format!("{}-{port}", self.name),
            &yaml,
            port,
            Membership::Static,
            env,
        )?;
        r.wait_ready().await?;
        Ok(r)
    }

    /// The status once the group is `RecordsMismatch`, naming its partition and the offsets
    /// `upstream` and `downstream` (asserted).
    async fn mismatch_named(
        &self,
        r: &Replicator,
        upstream: i64,
        downstream: i64,
    ) -> Result<serde_json::Value> {
        let status = self
            .status_when(r, "the mismatch in the status", |row| {
                row["reason"] == "RecordsMismatch"
            })
            .await?;
        assert_not_ready(
            &status,
            &format!(
                "partition {}-0 (source offset {upstream}, target offset {downstream})",
                self.remote
            ),
        );
        Ok(status)
    }

    fn checkpoints_topic(&self) -> String {
        format!("{}.checkpoints.internal", self.source_alias)
    }

    /// The group's row in the status once `wanted` holds for it, with the whole status.
    async fn status_when(
        &self,
        r: &Replicator,
        what: &str,
        wanted: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value> {
        let flow_file = r.log.with_file_name("flow.yaml");
        eventually(what, Duration::from_secs(60), || {
            let flow_file = flow_file.clone();
            let wanted = &wanted;
            async move {
                let status = cli_json(&self.world, "status", &flow_file, &[])?;
                let row = status["leastReadyGroups"]
                    .as_array()
                    .and_then(|rows| rows.iter().find(|g| g["group"] == self.group.as_str()));
                Ok(row.is_some_and(wanted).then_some(status))
            }
        })
        .await
        .with_context(|| r.log_text())
    }
}

/// The verifications written on the group's checkpoint records, in order.
fn verifications(
    world: &World,
    topic: &str,
    group: &str,
) -> Result<Vec<(Checkpoint, Verification)>> {
    let records =
        kafka::read_partition_with_header(&world.target_bootstrap, topic, 0, VERIFICATION_HEADER)?;
    Ok(records
        .into_iter()
        .filter_map(|((_, k, v), header)| {
            let cp = Checkpoint::decode(k.as_deref()?, v.as_deref()?).ok()?;
            let verification = Verification::from_header(header.as_deref())?;
            (cp.group == group).then_some((cp, verification))
        })
        .collect())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn period_ms() -> i64 {
    i64::try_from(PERIOD.as_millis()).unwrap_or(i64::MAX)
}

/// The first mismatch verified on the group's checkpoint records.
fn first_mismatch(m: &Mirrored) -> Result<(Checkpoint, Verification)> {
    let all = verifications(&m.world, &m.checkpoints_topic(), &m.group)?;
    all.iter()
        .find(|(_, v)| matches!(v.outcome, Outcome::Mismatch(_)))
        .cloned()
        .with_context(|| format!("no mismatch verified: {all:?}"))
}

/// `at_ms` is within two verification periods after `since_ms`.
fn within_two_periods(at_ms: i64, since_ms: i64) -> Result<()> {
    ensure!(
        at_ms.saturating_sub(since_ms) <= 2 * period_ms(),
        "verified {} ms after the fault, more than two periods of {} ms",
        at_ms.saturating_sub(since_ms),
        period_ms()
    );
    Ok(())
}

fn assert_not_ready(status: &serde_json::Value, needle: &str) {
    let row = status["leastReadyGroups"][0].clone();
    assert_eq!(row["reason"], "RecordsMismatch", "{status}");
    let message = row["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{needle} in {message}");
    // Without replicator pods the CLI judges the flow as in Observe mode, where hand-mirrored
    // records have no replicated heartbeat: FailoverReady is False for that first, and the
    // groups' condition carries the mismatch.
    let fresh = condition(status, "CheckpointsFresh");
    assert_eq!(
        (&fresh["status"], &fresh["reason"]),
        (&"False".into(), &"RecordsMismatch".into()),
        "{status}"
    );
    assert!(
        fresh["message"]
            .as_str()
            .is_some_and(|m| m.contains(needle)),
        "{status}"
    );
    assert_ne!(
        condition(status, "FailoverReady")["status"],
        "True",
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_another_producer_wrote_at_the_checkpoint_is_caught_within_two_periods()
-> Result<()> {
    let m = mirrored("verify-foreign").await?;
    // The group read everything: its checkpoint points at the target's end, which a failover
    // would read from once new records are copied.
    kafka::commit(
        &m.world.source_bootstrap,
        &m.group,
        &m.topic,
        &[(0, RECORDS)],
    )?;
    let r = m.start(&[]).await?;
    let ready = m
        .status_when(&r, "the group verified and ready", |row| {
            row["reason"] == "Ready" && row["verifiedPartitions"] == "1/1"
        })
        .await?;
    let row = &ready["leastReadyGroups"][0];
    assert!(
        row["message"]
            .as_str()
            .is_some_and(|s| s.contains("verified on the records on 1/1 partition(s), newest")),
        "{ready}"
    );
    assert_eq!(
        condition(&ready, "CheckpointsFresh")["status"],
        "True",
        "{ready}"
    );

    // Another producer writes into the remote topic: its record lands at the checkpoint.
    let fault_ms = now_ms();
    let at = send_value(&m.target, &m.remote, "written-by-someone-else").await?;
    assert_eq!(at, RECORDS + SHIFT, "at the checkpoint's offset");
    let status = m.mismatch_named(&r, RECORDS, RECORDS + SHIFT).await?;
    assert_not_ready(&status, "another producer");
    let (cp, v) = first_mismatch(&m)?;
    ensure!(v.at_ms >= fault_ms, "no mismatch before the fault: {v:?}");
    within_two_periods(v.at_ms, fault_ms)?;
    assert_eq!(
        (
            cp.upstream_offset,
            cp.downstream_offset,
            v.upstream,
            v.downstream
        ),
        (RECORDS, RECORDS + SHIFT, RECORDS, RECORDS + SHIFT)
    );
    assert!(
        r.metric("mirrorflow_verification_mismatches")
            .is_some_and(|n| n >= 1.0),
        "the mismatch gauge"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_translation_broken_on_purpose_is_caught_within_two_periods() -> Result<()> {
    let m = mirrored("verify-skew").await?;
    kafka::commit(&m.world.source_bootstrap, &m.group, &m.topic, &[(0, 60)])?;
    // Every checkpoint written 3 records past its translation: 60 -> 70 instead of 67.
    let r = m.start(&[(SKEW_ENV, "3")]).await?;
    let checkpoints = m.checkpoints_topic();
    let written_ms = eventually("the skewed checkpoint", Duration::from_secs(60), || {
        let (world, checkpoints, group) = (&m.world, &checkpoints, &m.group);
        async move {
            if !kafka::topics(&world.target_bootstrap)?.contains(checkpoints) {
                return Ok(None);
            }
            let all = kafka::read_partition(&world.target_bootstrap, checkpoints, 0)?;
            Ok(all.into_iter().find_map(|(_, k, v)| {
                let cp = Checkpoint::decode(k.as_deref()?, v.as_deref()?).ok()?;
                (&cp.group == group && cp.upstream_offset == 60 && cp.downstream_offset == 70)
                    .then(now_ms)
            }))
        }
    })
    .await
    .with_context(|| r.log_text())?;
    let status = m.mismatch_named(&r, 60, 70).await?;
    assert_not_ready(&status, "skip 3 record(s)");
    // The checkpoint was written by `written_ms` (when the test saw it): its first verification
    // came within two periods of that.
    let (cp, v) = first_mismatch(&m)?;
    assert_eq!((cp.upstream_offset, cp.downstream_offset), (60, 70));
    within_two_periods(v.at_ms, written_ms)?;
    Ok(())
}

/// The remote topic deleted and written again by someone else, the same number of records at
/// the same offsets but other ones: offsets alone still look right, the records do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_rewritten_on_the_target_are_caught_within_two_periods() -> Result<()> {
    let m = mirrored("verify-rewritten").await?;
    kafka::commit(&m.world.source_bootstrap, &m.group, &m.topic, &[(0, 60)])?;
    let r = m.start(&[]).await?;
    m.status_when(&r, "the group verified and ready", |row| {
        row["reason"] == "Ready" && row["verifiedPartitions"] == "1/1"
    })
    .await?;

    kafka::delete_topic(&m.world.target_bootstrap, &m.remote).await?;
    kafka::create_topic(&m.world.target_bootstrap, &m.remote, 1).await?;
    let fault_ms = now_ms();
    for i in 0..RECORDS + SHIFT {
        send_value(&m.target, &m.remote, &format!("rewritten-{i}")).await?;
    }
    m.mismatch_named(&r, 60, 60 + SHIFT).await?;
    let (cp, v) = first_mismatch(&m)?;
    assert_eq!((cp.upstream_offset, cp.downstream_offset), (60, 60 + SHIFT));
    ensure!(v.at_ms >= fault_ms, "no mismatch before the fault: {v:?}");
    within_two_periods(v.at_ms, fault_ms)?;
    Ok(())
}
