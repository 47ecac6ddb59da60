//! A replicator as the node runs it: a container whose root file system refuses writes, whose
//! process runs as uid 65532 with no capabilities under seccomp, and which kubelet restarts
//! after a `kill -9` with no record lost (at-least-once) and the flow FailoverReady again; and a
//! replicator that stops answering, which kubelet's liveness probe finds and restarts; and one
//! over its memory limit, which the kernel kills and kubelet restarts.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::node::{container_pid, process_alive};
use mirrorflow_e2e::operator::{
    condition, install_operator, patch_flow_spec, wait_for_event, wait_for_flow,
};
use mirrorflow_e2e::switchover::end_offsets;
use mirrorflow_e2e::{World, eventually, kafka, run, run_with_input, unique};
use rdkafka::producer::FutureRecord;

const PARTITIONS: i32 = 3;
const BEFORE: i32 = 200;
const DURING: i32 = 300;
/// Below what a replicator needs to start its clients (it idles at about 14 MiB in its memory
/// cgroup, measured; 16Mi runs): the kernel kills it at once.
const OOM_LIMIT: &str = "6Mi";

/// The `Name:\tvalue` line of /proc/<pid>/status.
fn proc_status(pid: i32, name: &str) -> Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .map(|v| v.trim().to_owned())
        .with_context(|| format!("no {name} in /proc/{pid}/status"))
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == "replicator"))
        .map_or(0, |c| c.restart_count)
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The values of every record of `topic`, all partitions, with how many times each was seen.
fn values(bootstrap: &str, topic: &str) -> Result<(BTreeSet<String>, usize)> {
    let mut set = BTreeSet::new();
    let mut n = 0;
    for p in 0..PARTITIONS {
        for (_, _, v) in kafka::read_partition(bootstrap, topic, p)? {
            n += 1;
            set.insert(String::from_utf8_lossy(&v.unwrap_or_default()).into_owned());
        }
    }
    Ok((set, n))
}

/// A namespace with the operator and a FailoverReady flow `flow` copying a topic of
/// [`PARTITIONS`] partitions that holds [`BEFORE`] records: (namespace, alias, topic, flows).
async fn ready_flow(
    world: &World,
    client: &kube::Client,
) -> Result<(String, String, String, Api<MirrorFlow>)> {
    let ns = unique("e2e-ctr");
    install_operator(world, &ns)?;
    let alias = unique("ctr");
    let topic = unique("ctrtopic");
    kafka::create_topic(&world.source_bootstrap, &topic, PARTITIONS).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, BEFORE, PARTITIONS).await?;
    let flow = format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: flow, namespace: {ns}}}\nspec:\n  source: {{alias: {alias}, bootstrapServers: \"{}\"}}\n  target: {{alias: {alias}-t, bootstrapServers: \"{}\"}}\n  topics: [\"{topic}\"]\n",
        world.source_bootstrap, world.target_bootstrap
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &flow)?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    wait_for_flow(
        &flows,
        "flow",
        "FailoverReady",
        Duration::from_secs(180),
        failover_ready,
    )
    .await?;
    Ok((ns, alias, topic, flows))
}

fn failover_ready(mf: &MirrorFlow) -> bool {
    condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True")
}

/// The replicator container's last run, once it ended.
fn last_termination(pod: &Pod) -> Option<k8s_openapi::api::core::v1::ContainerStateTerminated> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "replicator")?
        .last_state
        .as_ref()?
        .terminated
        .clone()
}

/// Waits for the flow to be FailoverReady on a heartbeat written after `since` (RFC 3339 in
/// UTC on both sides, so the strings compare as times): proof of the restarted container's work.
async fn ready_after(flows: &Api<MirrorFlow>, since: &str) -> Result<MirrorFlow> {
    wait_for_flow(
        flows,
        "flow",
        "FailoverReady with a heartbeat written after the restart",
        Duration::from_secs(120),
        |mf| {
            failover_ready(mf)
                && mf
                    .status
                    .as_ref()
                    .and_then(|s| s.heartbeat.as_ref())
                    .and_then(|h| h.last_heartbeat_time.as_deref())
                    .is_some_and(|t| t > since)
        },
    )
    .await
}

fn utc_now() -> Result<String> {
    Ok(run("date", &["-u", "+%Y-%m-%dT%H:%M:%S"])?
        .trim()
        .to_owned())
}

#[tokio::test]
async fn a_killed_replicator_container_is_restarted_by_kubelet_with_no_record_lost() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let (ns, alias, topic, flows) = ready_flow(&world, &client).await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods.get("flow-0").await?;
    let pid = container_pid(&pod, "replicator")?;

    // What the kernel says about the container's process, not what the pod spec asked for.
    let uid = proc_status(pid, "Uid")?;
    assert!(
        uid.split_whitespace().all(|u| u == "65532"),
        "real, effective, saved and fs uid are 65532: {uid}"
    );
    assert_eq!(
        proc_status(pid, "CapEff")?,
        "0000000000000000",
        "no capabilities"
    );
    assert_eq!(proc_status(pid, "Seccomp")?, "2", "a seccomp filter is on");
    assert_eq!(proc_status(pid, "NoNewPrivs")?, "1");
    // Through /proc/<pid>/root a write lands in the container's own root mount: even root on
    // the host is refused there, because that mount is read-only.
    let probe = format!("/proc/{pid}/root/mirrorflow-write-probe");
    match std::fs::write(&probe, b"x") {
        Err(e) if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem => {}
        Err(e) => bail!("writing {probe} failed, but not as a read-only file system: {e}"),
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            bail!("the container's root file system accepted a write ({probe})");
        }
    }

    // Records keep coming while the container is killed.
    let producer = kafka::producer(&world.source_bootstrap, Duration::from_secs(60))?;
    let topic_in_task = topic.clone();
    let writer = tokio::spawn(async move {
        for i in BEFORE..BEFORE + DURING {
            let v = format!("v{i}");
            producer
                .send(
                    FutureRecord::<(), _>::to(&topic_in_task)
                        .payload(&v)
                        .partition(i % PARTITIONS),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)?;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        anyhow::Ok(())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    run("kill", &["-9", &pid.to_string()])?;
    let killed = Instant::now();
    let killed_at = utc_now()?;
    let restarted = eventually(
        "kubelet to restart the replicator container",
        Duration::from_secs(120),
        || async {
            let p = pods.get("flow-0").await?;
            let new = container_pid(&p, "replicator").ok().filter(|n| *n != pid);
            Ok((restarts(&p) >= 1 && ready(&p) && new.is_some()).then_some(p))
        },
    )
    .await?;
    println!("restarted and ready {:?} after the kill", killed.elapsed());
    assert!(!process_alive(pid), "the killed process is gone");
    let last = last_termination(&restarted).context("the container's last state is terminated")?;
    assert_eq!(last.exit_code, 137, "SIGKILL ended the last run: {last:?}");
    writer.await??;

    // At least once: every value the source holds arrives on the target.
    let (source, _) = values(&world.source_bootstrap, &topic)?;
    assert_eq!(source.len(), (BEFORE + DURING) as usize);
    let remote = format!("{alias}.{topic}");
    let (copied, n) = eventually(
        "every record on the target",
        Duration::from_secs(120),
        || async {
            let (got, n) = values(&world.target_bootstrap, &remote)?;
            Ok(source.is_subset(&got).then_some((got, n)))
        },
    )
    .await?;
    assert_eq!(
        copied, source,
        "the target holds exactly the source's values"
    );
    println!(
        "{} records on the source, {n} on the target: 0 lost, {} duplicates",
        source.len(),
        n - source.len()
    );
    // Ready again on what the restarted container did.
    let after = ready_after(&flows, &killed_at).await?;
    println!(
        "FailoverReady again, heartbeat {:?}",
        after
            .status
            .and_then(|s| s.heartbeat)
            .and_then(|h| h.last_heartbeat_time)
    );
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}

/// Liveness, as kubelet probes it: a replicator frozen with SIGSTOP (what a deadlocked process
/// looks like from outside: no answer on /healthz) fails the probe, kubelet kills and restarts
/// the container, and the flow is FailoverReady again on the new container's work. The probe
/// is every 10 s with 6 failures allowed, so the restart comes after about a minute, not at once.
#[tokio::test]
async fn a_frozen_replicator_fails_its_liveness_probe_and_is_restarted() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let (ns, _, _, flows) = ready_flow(&world, &client).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pid = container_pid(&pods.get("flow-0").await?, "replicator")?;
    run("kill", &["-STOP", &pid.to_string()])?;
    let frozen = Instant::now();
    let frozen_at = utc_now()?;
    let restarted = eventually(
        "kubelet to restart the frozen container",
        Duration::from_secs(240),
        || async {
            let p = pods.get("flow-0").await?;
            let new = container_pid(&p, "replicator").ok().filter(|n| *n != pid);
            Ok((restarts(&p) >= 1 && new.is_some()).then_some(p))
        },
    )
    .await?;
    let took = frozen.elapsed();
    println!("restarted {took:?} after the freeze");
    assert!(
        took >= Duration::from_secs(40),
        "restarted after {took:?}: sooner than 6 failed probes 10 s apart allow, so not by the liveness probe"
    );
    assert!(!process_alive(pid), "the frozen process is gone");
    assert!(
        last_termination(&restarted).is_some(),
        "the frozen run ended"
    );
    let events = run(
        "kubectl",
        &[
            "get",
            "events",
            "-n",
            &ns,
            "--field-selector",
            "reason=Unhealthy",
            "-o",
            "jsonpath={.items[*].message}",
        ],
    )?;
    assert!(
        events.contains("Liveness probe failed"),
        "kubelet reported the failed liveness probe: {events:?}"
    );
    ready_after(&flows, &frozen_at).await?;
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}

/// A replicator over its memory limit is killed by the kernel (`OOMKilled`, as kubelet reports
/// it) and restarted by kubelet, again and again while the limit stays too low; the flow's
/// `Ready` says so by class (`ReplicatorOutOfMemory`), naming the pod, the limit and the field,
/// with an Event. With the limit raised the flow recovers.
#[tokio::test]
async fn an_oom_killed_replicator_is_restarted_by_kubelet() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-oom");
    install_operator(&world, &ns)?;
    let alias = unique("oom");
    let topic = unique("oomtopic");
    kafka::create_topic(&world.source_bootstrap, &topic, PARTITIONS).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, BEFORE, PARTITIONS).await?;
    let flow = format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: flow, namespace: {ns}}}\nspec:\n  source: {{alias: {alias}, bootstrapServers: \"{}\"}}\n  target: {{alias: {alias}-t, bootstrapServers: \"{}\"}}\n  topics: [\"{topic}\"]\n  resources: {{requests: {{memory: {OOM_LIMIT}}}, limits: {{memory: {OOM_LIMIT}}}}}\n",
        world.source_bootstrap, world.target_bootstrap
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &flow)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let killed = eventually(
        "the replicator container OOM-killed and restarted",
        Duration::from_secs(180),
        || async {
            let Ok(p) = pods.get("flow-0").await else {
                return Ok(None);
            };
            let oom =
                last_termination(&p).is_some_and(|t| t.reason.as_deref() == Some("OOMKilled"));
            Ok((oom && restarts(&p) >= 1).then_some(p))
        },
    )
    .await?;
    let last = last_termination(&killed).context("terminated")?;
    println!(
        "OOMKilled (exit {}) with a {OOM_LIMIT} limit, {} restart(s) so far",
        last.exit_code,
        restarts(&killed)
    );
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    let named = wait_for_flow(
        &flows,
        "flow",
        "Ready False: ReplicatorOutOfMemory",
        Duration::from_secs(60),
        |mf| {
            condition(mf, "Ready").is_some_and(|c| c.0 == "False" && c.1 == "ReplicatorOutOfMemory")
        },
    )
    .await?;
    let (_, _, message) = condition(&named, "Ready").context("Ready")?;
    println!("Ready: {message}");
    for part in ["flow-0", OOM_LIMIT, "spec.resources.limits.memory"] {
        assert!(message.contains(part), "{part} not in {message:?}");
    }
    wait_for_event(
        &ns,
        "flow",
        "ReplicatorOutOfMemory",
        "spec.resources.limits.memory",
    )
    .await?;
    patch_flow_spec(
        &ns,
        "flow",
        r#"{"resources":{"requests":{"memory":"128Mi"},"limits":{"memory":"512Mi"}}}"#,
    )?;
    wait_for_flow(
        &flows,
        "flow",
        "FailoverReady with the limit raised",
        Duration::from_secs(180),
        failover_ready,
    )
    .await?;
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}

/// The issue's record that killed the shared operator, aimed at a replicator instead: one gzip
/// batch of 200 records of 1 MiB of zeros (a few hundred KB on the broker) in a topic a
/// `copy: Records` flow copies with a 96 MiB memory limit. librdkafka reads its records; the
/// binary's gzip inflater refuses the batch past 32 MiB and librdkafka tries it again and
/// again, so the replicator stays up (never killed, never restarted) and holds the partition
/// at the batch, named in `Replicating` with the reason and the fix; a second flow of the same
/// operator copying an ordinary topic stays FailoverReady throughout. Switched to
/// `copy: Batches` as the message says, the flow copies every record of the bomb.
#[tokio::test]
async fn a_gzip_bomb_in_a_copied_topic_harms_only_its_flow_which_names_it() -> Result<()> {
    a_bomb_in_a_copied_topic_harms_only_its_flow_which_names_it("gzip").await
}

/// The same with lz4 (about 800 KB on the broker), whose inflater the binary takes over from
/// librdkafka by the linker's `--wrap` (the image's build must pass it: this is its check).
#[tokio::test]
async fn an_lz4_bomb_in_a_copied_topic_harms_only_its_flow_which_names_it() -> Result<()> {
    a_bomb_in_a_copied_topic_harms_only_its_flow_which_names_it("lz4").await
}

async fn a_bomb_in_a_copied_topic_harms_only_its_flow_which_names_it(codec: &str) -> Result<()> {
    const BOMB_RECORDS: i64 = 200;
    const LIMIT: &str = "96Mi";
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let (ns, _, calm_topic, flows) = ready_flow(&world, &client).await?;
    let started = utc_now()?;
    let alias = unique("bombed");
    let topic = unique("bombtopic");
    kafka::create_topic_with(
        &world.source_bootstrap,
        &topic,
        1,
        &[("max.message.bytes", "10000000")],
    )
    .await?;
    let keys: Vec<Vec<u8>> = (0..BOMB_RECORDS)
        .map(|i| format!("k{i}").into_bytes())
        .collect();
    kafka::produce_bomb(&world.source_bootstrap, &topic, &keys, codec).await?;
    let flow = |copy: &str| {
        format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: bombed, namespace: {ns}}}\nspec:\n  source: {{alias: {alias}, bootstrapServers: \"{}\"}}\n  target: {{alias: {alias}-t, bootstrapServers: \"{}\"}}\n  topics: [\"{topic}\"]\n  sourceLoop: {{copy: {copy}}}\n  resources: {{requests: {{memory: {LIMIT}}}, limits: {{memory: {LIMIT}}}}}\n",
            world.source_bootstrap, world.target_bootstrap
        )
    };
    run_with_input("kubectl", &["apply", "-f", "-"], &flow("Records"))?;
    let applied = Instant::now();
    // Nothing of the partition was copied yet: it is held before its first record.
    let wanted = format!("partition 0 of {topic} copies nothing: stalled before its first record");
    let named = wait_for_flow(
        &flows,
        "bombed",
        "Replicating False naming the held partition",
        Duration::from_secs(180),
        |mf| condition(mf, "Replicating").is_some_and(|c| c.0 == "False" && c.2.contains(&wanted)),
    )
    .await?;
    let (_, reason, message) = condition(&named, "Replicating").context("Replicating")?;
    println!(
        "Replicating {reason} after {:?} from the flow's apply: {message}",
        applied.elapsed()
    );
    for part in [
        "refused a batch",
        &format!("{codec} records inflate to more than 33554432 bytes"),
        "spec.sourceLoop.copy",
    ] {
        assert!(message.contains(part), "{part} not in {message:?}");
    }
    // Bounded: the replicator was never killed at its limit nor restarted.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods.get("bombed-0").await?;
    assert_eq!(
        (restarts(&pod), last_termination(&pod).map(|t| t.reason)),
        (0, None),
        "the bombed flow's replicator"
    );
    // Nothing of the bomb reached the target.
    let remote = format!("{alias}.{topic}");
    let ends = end_offsets(&world.target_bootstrap, &remote, 1).unwrap_or_default();
    assert!(
        ends.first().is_none_or(|&n| n == 0),
        "the remote topic holds {ends:?}"
    );
    // The other flow of the same operator and cluster was never disturbed.
    let calm = flows.get("flow").await?;
    assert!(
        failover_ready(&calm),
        "the other flow: {:?}",
        calm.status.as_ref().map(|s| &s.conditions)
    );
    kafka::produce_values(&world.source_bootstrap, &calm_topic, 30, PARTITIONS).await?;

    run_with_input("kubectl", &["apply", "-f", "-"], &flow("Batches"))?;
    let switched = Instant::now();
    eventually(
        "every record of the bomb copied whole",
        Duration::from_secs(180),
        || async {
            // The high watermark: reading 200 MiB back would inflate them in this process.
            let ends = end_offsets(&world.target_bootstrap, &remote, 1).unwrap_or_default();
            Ok(ends.first().copied().filter(|&n| n >= BOMB_RECORDS))
        },
    )
    .await?;
    println!(
        "with copy: Batches, all {BOMB_RECORDS} records copied in {:?}",
        switched.elapsed()
    );
    wait_for_flow(
        &flows,
        "bombed",
        "Ready again with copy: Batches",
        Duration::from_secs(120),
        |mf| condition(mf, "Ready").is_some_and(|c| c.0 == "True"),
    )
    .await?;
    ready_after(&flows, &started).await?;
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}
