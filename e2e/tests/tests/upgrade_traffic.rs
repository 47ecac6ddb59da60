//! The upgrade from the previous release under traffic (issue 40, item 4): the previous
//! release's chart and image (built from the commit in e2e/previous-release.env by
//! `e2e/world.sh previous`, pushed to the world's registry under `previous/`) installed in a
//! namespace of its own, one flow in each delivery mode copying records written live, a
//! committing consumer group per flow, then `helm upgrade` to this checkout's chart and image:
//! the operator is replaced and every replicator rolls to the new image.
//!
//! Checked and printed per flow (`upgrade_traffic[<mode>] ...` lines):
//! - records lost (none may be) and copied twice (at least once and whole batches: bounded;
//!   exactly once and aligned offsets, read committed: none), and the copy's longest pause;
//! - the group's checkpoints never go backwards and go on after the upgrade, and a consumer
//!   failing over at any of them would skip no record;
//! - `FailoverReady` is never True, through the whole upgrade, unless every partition the
//!   group committed on had a checkpoint by the time the status was measured;
//! - the status's `observedTime` (moved by every probe) never stands still during the
//!   operator's handover for longer than it did before plus one probe interval plus the
//!   standby's lease poll (`lease::RETRY_EVERY`): the old operator stops up to a probe
//!   interval after its last status, and the new one polls the lease it releases. Measured
//!   gaps reach about two probe intervals (docs/upgrading.md).
//!
//! When the previous release is not in the registry (a cold CI run does not build it: see
//! e2e/README.md, "Nightly"), the test runs as a smoke from the world's own release (the same
//! image under another reference, so the replicators still roll) and says so; with
//! `MF_UPGRADE_FROM_PREVIOUS=1` (the nightly set) that fails instead.
//!
//! Not exclusive: the CRD is cluster-wide, and the test checks it is the same in both releases
//! (it applies the checkout's, as every install in the world does, and installs the previous
//! chart with `--skip-crds`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use mirrorflow::operator::lease::RETRY_EVERY;
use mirrorflow::operator::reconcile::STATUS_INTERVAL;
use mirrorflow_e2e::World;
use mirrorflow_e2e::fidelity::read_visible;
use mirrorflow_e2e::steady::{self, Written, checkpoints_of, copy_pause};
use mirrorflow_e2e::upgrade::{
    Flow, Installed, Mode, PARTITIONS, drained, install_previous, operator_image, poll, poll_for,
    rolled, start_flows, upgrade_to_checkout, wall_ms,
};

/// Polled before the upgrade, to know how far apart the probes are when nothing happens.
const STEADY: Duration = Duration::from_secs(35);
/// Polled after every replicator rolled and every flow is Ready again.
const AFTER_ROLL: Duration = Duration::from_secs(20);

/// What the checkpoints of one flow's group show.
#[derive(Default, Debug)]
struct CheckpointTally {
    before_upgrade: usize,
    after_roll: usize,
    backwards: Vec<String>,
    skipping: Vec<String>,
}

/// Checkpoints in order per partition: neither offset goes back, and a consumer failing over
/// at one skips no record (every source record at or after its upstream offset has a copy at
/// or after its downstream offset).
fn tally_checkpoints(
    world: &World,
    f: &Flow,
    cps: &[Written],
    (upgrade_ms, rolled_ms): (i64, i64),
) -> Result<CheckpointTally> {
    let mut t = CheckpointTally::default();
    // source offset -> last target offset of its copy, per partition.
    let mut last_copy: HashMap<i32, HashMap<i64, i64>> = HashMap::new();
    for p in 0..PARTITIONS {
        let target: HashMap<String, i64> = read_visible(&world.target_bootstrap, &f.remote, p)?
            .into_iter()
            .map(|r| (r.value, r.offset))
            .collect();
        let source = read_visible(&world.source_bootstrap, &f.topic, p)?;
        last_copy.insert(
            p,
            source
                .iter()
                .map(|r| (r.offset, target.get(&r.value).copied().unwrap_or(-1)))
                .collect(),
        );
    }
    let mut previous: HashMap<i32, (i64, i64)> = HashMap::new();
    for w in cps {
        let tp = &w.cp.topic_partition;
        if tp.topic != f.remote {
            continue;
        }
        if w.at_ms < upgrade_ms {
            t.before_upgrade += 1;
        } else if w.at_ms > rolled_ms {
            t.after_roll += 1;
        }
        let now = (w.cp.upstream_offset, w.cp.downstream_offset);
        if let Some(before) = previous.insert(tp.partition, now)
            && (now.0 < before.0 || now.1 < before.1)
        {
            t.backwards
                .push(format!("{}: {before:?} then {now:?}", tp.partition));
        }
        let copies = last_copy.get(&tp.partition);
        if let Some((o, at)) = copies
            .into_iter()
            .flatten()
            .find(|(o, at)| **o >= w.cp.upstream_offset && **at < w.cp.downstream_offset)
        {
            t.skipping.push(format!(
                "{}: at {now:?} source offset {o} (copy at {at})",
                tp.partition
            ));
        }
    }
    Ok(t)
}

/// Samples where `FailoverReady` was True although some partition the group has checkpoints
/// for had none written by the time the status was measured: a failover then would have found
/// no checkpoint there.
fn ready_without_checkpoints(f: &Flow, cps: &[Written]) -> usize {
    let mut first: HashMap<i32, i64> = HashMap::new();
    for w in cps
        .iter()
        .filter(|w| w.cp.topic_partition.topic == f.remote)
    {
        first
            .entry(w.cp.topic_partition.partition)
            .or_insert(w.at_ms);
    }
    f.samples
        .iter()
        .filter(|s| s.failover_ready)
        .filter(|s| {
            let observed = s.observed_ms.unwrap_or(i64::MIN);
            first.len() < PARTITIONS as usize || first.values().any(|at| *at > observed)
        })
        .count()
}

/// The longest time `observedTime` stood still: (before the upgrade, from it on), in ms.
fn status_gaps(f: &Flow, upgrade_ms: i64) -> (i64, i64) {
    let mut times: Vec<i64> = f.samples.iter().filter_map(|s| s.observed_ms).collect();
    times.dedup();
    let (mut steady, mut handover) = (0, 0);
    for w in times.windows(2) {
        let gap = w[1] - w[0];
        if w[1] <= upgrade_ms {
            steady = steady.max(gap);
        } else {
            handover = handover.max(gap);
        }
    }
    (steady, handover)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_the_previous_release_under_traffic_loses_nothing_in_any_mode() -> Result<()>
{
    let world = World::from_env()?;
    let Installed {
        from,
        ns,
        old_image,
        flows: api,
        stateful_sets: sts,
        cleanup: _cleanup,
        ..
    } = install_previous(&world, "e2e-upgtraffic").await?;
    let mut flows: Vec<Flow> = Mode::ALL.into_iter().map(Flow::new).collect();
    start_flows(&world, &ns, &mut flows, &api).await?;
    poll_for(&mut flows, &api, STEADY).await?;

    // The upgrade, polled while helm runs and until every replicator rolled.
    let upgrade_ms = wall_ms();
    let upgrading = Instant::now();
    let helm = upgrade_to_checkout(&ns, upgrading)?;
    while !helm.is_finished() {
        poll(&mut flows, &api).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let helm_done = helm.await??;
    let new_image = operator_image(&ns)?;
    ensure!(
        new_image != old_image,
        "the upgrade kept the operator's image {old_image}"
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    while !rolled(&sts, &api, &flows, &new_image).await? {
        ensure!(
            Instant::now() < deadline,
            "not every flow rolled to {new_image} and Ready within 300 s of helm's end"
        );
        poll(&mut flows, &api).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rolled_after = upgrading.elapsed();
    let rolled_ms = wall_ms();
    poll_for(&mut flows, &api, AFTER_ROLL).await?;
    let end = Instant::now();

    // Everything written must arrive; then what it cost.
    for f in &mut flows {
        if let Some(p) = f.producer.take() {
            f.written = p.stop().await?;
        }
    }
    let drained = drained(&flows).await;
    let mut commits = Vec::new();
    for f in &mut flows {
        f.consumer_stop.store(true, Ordering::Relaxed);
        let asked = f
            .consumer
            .take()
            .map(|rx| rx.recv_timeout(Duration::from_secs(10)));
        commits.push(match asked {
            Some(Ok(Ok(n))) => n,
            _ => 0,
        });
    }
    println!(
        "upgrade_traffic: {} ({old_image}) -> checkout ({new_image}): helm upgrade --wait took {:.1} s, every replicator rolled and every flow Ready {:.1} s after it started",
        from.describe(),
        helm_done.as_secs_f64(),
        rolled_after.as_secs_f64(),
    );
    let mut failures = Vec::new();
    for (f, asked) in flows.iter().zip(commits) {
        failures.extend(report(
            &world,
            f,
            asked,
            (upgrade_ms, rolled_ms),
            (upgrading, end),
        )?);
    }
    if let Err(e) = drained {
        failures.push(format!("{e:#}"));
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// Prints one flow's figures and returns what failed.
fn report(
    world: &World,
    f: &Flow,
    commits: u64,
    (upgrade_ms, rolled_ms): (i64, i64),
    (upgrading, end): (Instant, Instant),
) -> Result<Vec<String>> {
    let name = f.mode.name();
    let seen = f.seen();
    let (lost, duplicated) = steady::lost_and_duplicated(&seen, &f.written);
    let pause = copy_pause(&seen, upgrading, end);
    let cps = checkpoints_of(&world.target_bootstrap, &f.alias, &f.group)?;
    let tally = tally_checkpoints(world, f, &cps, (upgrade_ms, rolled_ms))?;
    let ready_samples = f.samples.iter().filter(|s| s.failover_ready).count();
    let unfounded = ready_without_checkpoints(f, &cps);
    let (steady_gap, handover_gap) = status_gaps(f, upgrade_ms);
    let written: u64 = f.written.iter().sum();
    println!(
        "upgrade_traffic[{name}] written {written}, lost {lost}, duplicated {duplicated} (at most {}); \
         copy paused at most {:.1} s; checkpoints {} before the upgrade, {} after the roll, {} backwards, \
         {} would skip records; {commits} commits asked; FailoverReady True in {ready_samples} of {} \
         polls, {unfounded} without a checkpoint on every partition; status refreshed at most every \
         {:.1} s before, {:.1} s during and after the upgrade (probe interval {:?})",
        f.mode.duplicates_bound(),
        pause.as_secs_f64(),
        tally.before_upgrade,
        tally.after_roll,
        tally.backwards.len(),
        tally.skipping.len(),
        f.samples.len(),
        steady_gap as f64 / 1000.0,
        handover_gap as f64 / 1000.0,
        STATUS_INTERVAL,
    );
    let mut failures = Vec::new();
    if lost > 0 {
        failures.push(format!("{name}: {lost} records never copied"));
    }
    if duplicated > f.mode.duplicates_bound() {
        failures.push(format!(
            "{name}: {duplicated} duplicates, more than {}",
            f.mode.duplicates_bound()
        ));
    }
    if tally.before_upgrade == 0 || tally.after_roll == 0 {
        failures.push(format!(
            "{name}: checkpoints did not go on across the upgrade: {tally:?}"
        ));
    }
    if !tally.backwards.is_empty() || !tally.skipping.is_empty() {
        failures.push(format!(
            "{name}: checkpoints backwards {:?}, skipping {:?}",
            tally.backwards, tally.skipping
        ));
    }
    if unfounded > 0 {
        failures.push(format!(
            "{name}: FailoverReady True in {unfounded} polls while a partition had no checkpoint"
        ));
    }
    let allowed = steady_gap + (STATUS_INTERVAL + RETRY_EVERY).as_millis() as i64;
    if handover_gap > allowed {
        failures.push(format!(
            "{name}: the status stood still for {handover_gap} ms during the handover, more than \
             the {steady_gap} ms between probes before it plus one probe interval and one \
             lease poll ({allowed} ms)"
        ));
    }
    Ok(failures)
}
