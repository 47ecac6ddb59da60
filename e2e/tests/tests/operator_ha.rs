//! Two operator replicas (the chart's `replicaCount: 2`): only the Lease holder reconciles; when
//! its pod is deleted it gives the Lease up and the standby takes over and keeps reconciling.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use mirrorflow::api::MirrorFlow;
use mirrorflow::operator::lease::RETRY_EVERY;
use mirrorflow::operator::reconcile::STATUS_INTERVAL;
use mirrorflow_e2e::node::{container_pid, process_alive, signal};
use mirrorflow_e2e::operator::{
    install_operator_with, operator_metrics, patch_flow_spec, reconciles, wait_for_flow,
};
use mirrorflow_e2e::{World, eventually, run, run_with_input, unique};

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", &self.0]);
        let _ = run("kubectl", &["delete", "namespace", &self.0, "--wait=false"]);
    }
}

async fn holder(leases: &Api<Lease>) -> Result<Option<String>> {
    Ok(leases
        .get_opt("mirrorflow-operator")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

fn observed(mf: &MirrorFlow) -> bool {
    mf.status.as_ref().and_then(|s| s.observed_generation) == mf.metadata.generation
}

#[tokio::test]
async fn a_standby_operator_takes_over_when_the_leader_goes() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-ha");
    let _cleanup = Cleanup(ns.clone());
    install_operator_with(&world, &ns, &["replicaCount=2"])?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let selector = "app.kubernetes.io/component=operator";
    let leader = eventually("a Lease holder", Duration::from_secs(60), || async {
        holder(&leases).await
    })
    .await?;
    let operators = pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items;
    assert_eq!(operators.len(), 2, "two operator pods");
    let names: Vec<String> = operators
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert!(
        names.contains(&leader),
        "the holder {leader} is one of {names:?}"
    );

    // An observe-only flow: reconciled and probed, nothing deployed.
    let flow = format!(
        r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: watched, namespace: {ns}}}
spec:
  mode: Observe
  source: {{alias: ha-src, bootstrapServers: "{s}"}}
  target: {{alias: ha-tgt, bootstrapServers: "{t}"}}
  topics: ["{ns}-none"]
"#,
        s = world.source_bootstrap,
        t = world.target_bootstrap,
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &flow)?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    wait_for_flow(
        &flows,
        "watched",
        "status for generation 1",
        Duration::from_secs(60),
        observed,
    )
    .await?;

    // Only the holder reconciles.
    let operators = pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items;
    for p in &operators {
        let n = reconciles(p)?;
        let name = p.metadata.name.clone().unwrap_or_default();
        if name == leader {
            assert!(n >= 1.0, "the leader {name} reconciled ({n})");
            // The leader also exports what it measured per flow, for dashboards and alerts.
            let text = operator_metrics(p)?;
            assert!(
                text.lines()
                    .any(|l| l.starts_with("mirrorflow_operator_flow_condition{")
                        && l.contains("flow=\"watched\"")
                        && l.contains("condition=\"Ready\"")),
                "per-flow condition series in the leader's /metrics"
            );
        } else {
            assert_eq!(n, 0.0, "the standby {name} must not reconcile");
        }
    }

    // How often the status moves while one leader runs: the yardstick for the handover.
    let mut times = StatusTimes::default();
    let until = Instant::now() + STATUS_INTERVAL * 2 + Duration::from_secs(2);
    while Instant::now() < until {
        times.poll(&flows).await?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let steady = times.longest_gap();

    // The leader's pod goes (graceful deletion, as in a node drain): the standby takes over.
    let gone = Instant::now();
    let before = times.len();
    run(
        "kubectl",
        &["delete", "pod", &leader, "-n", &ns, "--wait=false"],
    )?;
    let mut next = None;
    let mut after_takeover = 0;
    while after_takeover < 2 {
        ensure!(
            gone.elapsed() < Duration::from_secs(90),
            "no new Lease holder writing statuses 90 s after the leader's pod was deleted"
        );
        times.poll(&flows).await?;
        if next.is_none() {
            next = holder(&leases).await?.filter(|h| *h != leader);
            // Count only what is written from here on: the new leader's statuses.
            times.moved();
        } else if times.moved() {
            after_takeover += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let next = next.unwrap_or_default();
    let handover = gone.elapsed();
    println!("Lease handed from {leader} to {next}; statuses from both in {handover:?}");
    // The stopping leader writes every status once more before it releases the lease, and
    // the standby watches the Lease: the status stands still no longer across the handover
    // than between two probes of one leader, plus a lease round trip.
    let across = times.longest_gap_from(before.saturating_sub(1));
    println!(
        "status refreshed at most every {steady:?} before the handover and every {across:?} across it"
    );
    ensure!(
        across <= steady.max(STATUS_INTERVAL) + RETRY_EVERY,
        "the status stood still for {across:?} across the handover, more than the {steady:?} \
         between probes before it plus a lease poll ({RETRY_EVERY:?})"
    );
    // The standby, or the replacement pod the ReplicaSet started meanwhile: both race for the
    // released Lease, and either may win.
    let kind = if names.contains(&next) {
        "the standby"
    } else {
        "the replacement pod"
    };
    println!("{kind} took over");

    // The new leader reconciles: a spec change gets a status for the new generation.
    patch_flow_spec(
        &ns,
        "watched",
        r#"{"failoverReadiness":{"maxHeartbeatLag":"20s"}}"#,
    )?;
    let changed = Instant::now();
    wait_for_flow(
        &flows,
        "watched",
        "status for generation 2",
        Duration::from_secs(60),
        observed,
    )
    .await?;
    println!(
        "the new leader reconciled the change in {:?}",
        changed.elapsed()
    );
    Ok(())
}

/// The distinct `status.observedTime`s of `watched` seen by polling, in order (ms since the
/// epoch).
#[derive(Default)]
struct StatusTimes {
    times: Vec<i64>,
    /// How many of them [`StatusTimes::moved`] has reported.
    reported: usize,
}

impl StatusTimes {
    async fn poll(&mut self, flows: &Api<MirrorFlow>) -> Result<()> {
        let mf = flows.get("watched").await?;
        let at = mf
            .status
            .and_then(|s| s.observed_time)
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|t| t.as_millisecond());
        if let Some(at) = at
            && self.times.last() != Some(&at)
        {
            self.times.push(at);
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.times.len()
    }

    /// Whether a time was added since the last call.
    fn moved(&mut self) -> bool {
        let moved = self.times.len() > self.reported;
        self.reported = self.times.len();
        moved
    }

    fn longest_gap(&self) -> Duration {
        self.longest_gap_from(0)
    }

    /// The longest wait between two of the times from the `from`th on.
    fn longest_gap_from(&self, from: usize) -> Duration {
        let gaps = self.times.get(from..).unwrap_or_default().windows(2);
        let ms = gaps.map(|w| w[1] - w[0]).max().unwrap_or(0);
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }
}

/// Two operators in a namespace of their own, liveness slow enough that a stalled leader is
/// not restarted by it: the Lease API and the leader's name and host pid.
async fn two_operators(world: &World, ns: &str) -> Result<(Api<Lease>, String, i32)> {
    let client = world.kube_client().await?;
    install_operator_with(
        world,
        ns,
        &["replicaCount=2", "livenessProbe.failureThreshold=12"],
    )?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let leases: Api<Lease> = Api::namespaced(client, ns);
    let leader = eventually("a Lease holder", Duration::from_secs(60), || async {
        holder(&leases).await
    })
    .await?;
    let pid = container_pid(&pods.get(&leader).await?, "operator")?;
    Ok((leases, leader, pid))
}

/// An Observe flow `watched` in `ns`, once it has a status.
async fn watched_flow(world: &World, ns: &str) -> Result<Api<MirrorFlow>> {
    let flow = format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: watched, namespace: {ns}}}\nspec:\n  mode: Observe\n  source: {{alias: ha-src, bootstrapServers: \"{}\"}}\n  target: {{alias: ha-tgt, bootstrapServers: \"{}\"}}\n  topics: [\"{ns}-none\"]\n",
        world.source_bootstrap, world.target_bootstrap
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &flow)?;
    let flows: Api<MirrorFlow> = Api::namespaced(world.kube_client().await?, ns);
    wait_for_flow(
        &flows,
        "watched",
        "a status",
        Duration::from_secs(60),
        observed,
    )
    .await?;
    Ok(flows)
}

/// A spec change of `watched` gets a status for its new generation: someone leads and serves.
async fn new_leader_serves(ns: &str, flows: &Api<MirrorFlow>) -> Result<()> {
    patch_flow_spec(
        ns,
        "watched",
        r#"{"failoverReadiness":{"maxHeartbeatLag":"25s"}}"#,
    )?;
    wait_for_flow(
        flows,
        "watched",
        "the new leader's status",
        Duration::from_secs(60),
        observed,
    )
    .await?;
    Ok(())
}

/// A leader frozen past its lease (as when its node or its apiserver connection stalls): a
/// standby takes over, and the old leader, once it runs again, writes nothing and exits instead
/// of reconciling beside the new one.
#[tokio::test]
async fn a_frozen_leader_is_replaced_and_stops_when_it_wakes() -> Result<()> {
    let world = World::from_env()?;
    let ns = unique("e2e-frozen");
    let _cleanup = Cleanup(ns.clone());
    // Liveness would restart the frozen pod after 30 s; this test wakes it itself.
    let (leases, leader, pid) = two_operators(&world, &ns).await?;
    let flows = watched_flow(&world, &ns).await?;

    signal(pid, "-STOP")?;
    let frozen = Instant::now();
    let next = eventually("another Lease holder", Duration::from_secs(60), || async {
        Ok(holder(&leases).await?.filter(|h| *h != leader))
    })
    .await;
    let next = match next {
        Ok(n) => n,
        Err(e) => {
            let _ = signal(pid, "-CONT");
            return Err(e);
        }
    };
    println!(
        "frozen leader {leader} replaced by {next} after {:?}",
        frozen.elapsed()
    );
    new_leader_serves(&ns, &flows).await?;

    // Wake the old leader: its lease lapsed long ago by its own clock.
    signal(pid, "-CONT")?;
    let woke = Instant::now();
    eventually(
        "the old leader to exit",
        Duration::from_secs(30),
        || async { Ok((!process_alive(pid)).then_some(())) },
    )
    .await?;
    println!("the woken leader exited after {:?}", woke.elapsed());
    // All runs of the container: kubelet restarts the one that exited.
    let text = world.container_log(&ns, &leader, "operator")?;
    assert!(
        text.contains("lost the leader lease")
            || text.contains("could not renew the leader lease in time"),
        "the old leader's log does not say why it stopped: {text}"
    );
    // What the new leader wrote stands: the old one did not write its view over it.
    let mf = flows.get("watched").await?;
    assert!(observed(&mf), "the status is for the newest generation");
    Ok(())
}

/// Runs `iptables ARGS` inside the network namespace of the process `pid` (the pod's).
fn pod_iptables(pid: i32, args: &[&str]) -> Result<()> {
    let target = pid.to_string();
    let mut all = vec!["-t", target.as_str(), "-n", "iptables", "-w"];
    all.extend_from_slice(args);
    run("nsenter", &all).map(|_| ())
}

/// The leader keeps running but its apiserver connection stalls (every packet to the
/// apiserver dropped inside its pod's network namespace, so requests hang rather than fail):
/// a standby takes over, and the old leader stops on its own renew deadline, while still cut
/// off, instead of going on reconciling on what it last knew.
#[tokio::test]
async fn a_leader_whose_apiserver_connection_stalls_is_replaced_and_stops() -> Result<()> {
    let world = World::from_env()?;
    let ns = unique("e2e-cutoff");
    let _cleanup = Cleanup(ns.clone());
    // Liveness must not be what stops it: the renew deadline must.
    let (leases, leader, pid) = two_operators(&world, &ns).await?;
    let flows = watched_flow(&world, &ns).await?;
    let port = std::env::var("APISERVER_PORT").unwrap_or_else(|_| "16443".into());
    // After the pod's own DNAT of the `kubernetes` Service, packets to the apiserver go to
    // its host port: drop those, established connections included.
    let drop = ["-p", "tcp", "--dport", port.as_str(), "-j", "DROP"];
    let mut insert = vec!["-I", "OUTPUT"];
    insert.extend_from_slice(&drop);
    pod_iptables(pid, &insert)?;
    let cut = Instant::now();

    let next = eventually("another Lease holder", Duration::from_secs(60), || async {
        Ok(holder(&leases).await?.filter(|h| *h != leader))
    })
    .await?;
    println!(
        "cut-off leader {leader} replaced by {next} after {:?}",
        cut.elapsed()
    );
    let stopped = eventually(
        "the cut-off leader to stop",
        Duration::from_secs(60),
        || async { Ok((!process_alive(pid)).then(|| cut.elapsed())) },
    )
    .await?;
    println!("the cut-off leader stopped {stopped:?} after its connection stalled");
    let text = world.container_log(&ns, &leader, "operator")?;
    assert!(
        text.contains("could not renew the leader lease in time")
            || text.contains("lost the leader lease"),
        "the cut-off leader's log does not say why it stopped: {text}"
    );
    // The new leader serves the flow.
    new_leader_serves(&ns, &flows).await?;
    assert_eq!(
        holder(&leases).await?.as_deref(),
        Some(next.as_str()),
        "the restarted old leader, still cut off, did not take the lease back"
    );
    Ok(())
}
