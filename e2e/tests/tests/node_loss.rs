//! Losing a node: the world's second node (`e2e/world.sh node2`) crashes while flows copy
//! records, and the test measures what that costs and checks that nobody has to step in.
//!
//! - `spread`: two replicas, one on each node. The replica on the lost node stops; its
//!   partitions go on being copied (by the other replica, or by the replacement).
//! - `lone` and `lone-eos`: one replica, on the node that crashes (placed there by cordoning the
//!   first node while they are created), at least once and exactly once. Nothing copies until
//!   the operator replaces the pod stuck on the unreachable node: kubelet is gone, so the pod
//!   is never deleted by itself and the StatefulSet never makes another.
//!
//! The crash (`node2 kill`) cuts the node's network before killing every process of it, so no
//! connection is closed by the node: brokers, the apiserver and the other node find out by their
//! own timeouts, as they would from a machine that lost power. The Node object is left as it
//! was; kube-controller-manager turns it NotReady after its grace period (20 s in the world).
//!
//! The operator's part (docs/day-two.md, "A node lost"): a replica whose node has been lost
//! (`Ready` Unknown) for longer than the installer's `replicaReplaceAfterSeconds` (15 here) is
//! deleted with grace period 0, so the StatefulSet makes it again on a node that answers; while
//! it waits, the flow's `Ready` condition is False with reason `ReplicaOnLostNode` and a message
//! naming the pod and the node; the replacement is recorded as an Event `ReplicaReplaced` about
//! the flow, naming them too.
//!
//! Measured for each flow, from the kill: detection (the flow's `ReplicaOnLostNode`), the
//! replacement (the pod on the lost node gone), the resumption (on every partition, a record
//! written after the kill is on the target), and at the end the records lost (must be none) and
//! duplicated (at least once: bounded; exactly once, read committed: none). Printed as
//! `node_loss[<flow>] ...` lines.
//!
//! Runs alone (world-tests.sh's exclusive list): while the second node is up, other tests' pods
//! could be scheduled on it and lost with it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::Api;
use kube::api::ListParams;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{condition, install_operator_with};
use mirrorflow_e2e::steady::{self, SteadyProducer, TargetReader};
use mirrorflow_e2e::{World, eventually, kafka, run, run_with_input, unique};

const NODE1: &str = "mirrorflow-node";
const NODE2: &str = "mirrorflow-node-2";
const PARTITIONS: i32 = 4;
/// One record per partition this often: 40 records a second per flow.
const PRODUCE_EVERY: Duration = Duration::from_millis(100);
/// The installer's `replicaReplaceAfterSeconds` for this test: shorter than the chart's 60 s so
/// the test takes minutes, long enough that the operator waits out more than a blip.
const REPLACE_AFTER_SECONDS: u64 = 15;
/// Copying steadily for this long before the crash, so the replicas have stored positions and
/// the figures start from a flow in its normal state.
const STEADY_BEFORE_KILL: Duration = Duration::from_secs(15);
/// From the kill: kcm's 20 s, the operator's 15 s, a new pod's start and a group's rebalance
/// fit several times over.
const RESUME_WITHIN: Duration = Duration::from_secs(150);
const DRAIN_WITHIN: Duration = Duration::from_secs(60);
/// At least once, a replacement copies again what the lost replica copied after its last
/// stored positions (stored every second): more duplicates than this much of the flow's
/// records means it started from an older position than the last one stored.
const DUPLICATES_WITHIN: Duration = Duration::from_secs(10);

/// The second node, started for this test and stopped (its Node deleted) when dropped, also
/// when the test fails.
struct Node2 {
    repo_root: PathBuf,
}

impl Node2 {
    fn world_sh(repo_root: &std::path::Path, args: &[&str]) -> Result<()> {
        let out = Command::new(repo_root.join("e2e/world.sh"))
            .args(args)
            .output()
            .context("running e2e/world.sh")?;
        ensure!(
            out.status.success(),
            "e2e/world.sh {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    fn start(world: &World) -> Result<Node2> {
        // One left over from an interrupted run starts clean.
        Self::world_sh(&world.repo_root, &["node2", "stop"])?;
        let node = Node2 {
            repo_root: world.repo_root.clone(),
        };
        Self::world_sh(&node.repo_root, &["node2", "start"])?;
        Ok(node)
    }

    fn kill(&self) -> Result<()> {
        Self::world_sh(&self.repo_root, &["node2", "kill"])
    }
}

impl Drop for Node2 {
    fn drop(&mut self) {
        if let Err(e) = Self::world_sh(&self.repo_root, &["node2", "stop"]) {
            eprintln!("stopping the second node failed: {e:#}");
        }
    }
}

/// The first node cordoned until dropped, so pods created meanwhile go to the second.
struct Cordon;

impl Cordon {
    fn first_node() -> Result<Cordon> {
        run("kubectl", &["cordon", NODE1])?;
        Ok(Cordon)
    }
}

impl Drop for Cordon {
    fn drop(&mut self) {
        if let Err(e) = run("kubectl", &["uncordon", NODE1]) {
            eprintln!("uncordoning {NODE1} failed: {e:#}");
        }
    }
}

/// One flow of the test, its records and what was measured.
struct Flow {
    name: &'static str,
    replicas: u8,
    exactly_once: bool,
    topic: String,
    remote: String,
    producer: Option<SteadyProducer>,
    reader: Option<TargetReader>,
    /// (name, uid) of its pods on the second node when it crashed.
    lost_pods: Vec<(String, String)>,
    /// Records queued when the kill returned, per partition: those after were written with the
    /// node gone.
    after_kill: Vec<u64>,
    /// Records written before the producer stopped, per partition.
    written: Vec<u64>,
    detected: Option<Duration>,
    /// The `ReplicaOnLostNode` message first seen.
    lost_node_message: Option<String>,
    replaced: Option<Duration>,
    resumed: Option<Duration>,
}

impl Flow {
    fn new(name: &'static str, replicas: u8, exactly_once: bool) -> Flow {
        let topic = unique(&format!("loss-{name}"));
        Flow {
            name,
            replicas,
            exactly_once,
            remote: format!("{}.{topic}", alias(name)),
            topic,
            producer: None,
            reader: None,
            lost_pods: Vec::new(),
            after_kill: Vec::new(),
            written: Vec::new(),
            detected: None,
            lost_node_message: None,
            replaced: None,
            resumed: None,
        }
    }

    fn yaml(&self, ns: &str, world: &World) -> String {
        // Each flow its own source alias: flows with one alias share their positions topic and
        // wait for each other's claims.
        let eos = if self.exactly_once {
            "  exactlyOnce: true\n  sourceLoop: {offsetSyncsLocation: Target}\n"
        } else {
            ""
        };
        format!(
            r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: {name}, namespace: {ns}}}
spec:
  source: {{alias: {alias}, bootstrapServers: "{src}"}}
  target: {{alias: {alias}-t, bootstrapServers: "{tgt}"}}
  topics: ["{topic}"]
  groups: ["{topic}-.*"]
  replicas: {replicas}
{eos}"#,
            name = self.name,
            alias = alias(self.name),
            src = world.source_bootstrap,
            tgt = world.target_bootstrap,
            topic = self.topic,
            replicas = self.replicas,
        )
    }

    fn mode(&self) -> &'static str {
        if self.exactly_once {
            "exactly once"
        } else {
            "at least once"
        }
    }

    fn seen(&self) -> HashMap<(i32, u64), steady::Seen> {
        self.reader
            .as_ref()
            .map(TargetReader::seen)
            .unwrap_or_default()
    }

    /// Duplicates allowed: none read committed, else [`DUPLICATES_WITHIN`] of its records.
    fn duplicates_bound(&self) -> u64 {
        if self.exactly_once {
            0
        } else {
            DUPLICATES_WITHIN.as_millis() as u64 / PRODUCE_EVERY.as_millis() as u64
                * PARTITIONS as u64
        }
    }
}

/// The source alias of a flow, unique to this run so remote topics never collide.
fn alias(flow: &str) -> String {
    format!("nl{}-{flow}", std::process::id())
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// The flow's pods, once all `replicas` of them are scheduled: (name, uid, node).
async fn scheduled_pods(pods: &Api<Pod>, flow: &Flow) -> Result<Vec<(String, String, String)>> {
    let what = format!("{}'s {} pods scheduled", flow.name, flow.replicas);
    eventually(&what, Duration::from_secs(120), || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("mirrorflow.io/flow={}", flow.name)))
            .await?
            .items;
        let placed: Vec<_> = list
            .iter()
            .filter_map(|p| {
                Some((
                    p.metadata.name.clone()?,
                    p.metadata.uid.clone()?,
                    node_of(p)?.to_owned(),
                ))
            })
            .collect();
        Ok((placed.len() == usize::from(flow.replicas)).then_some(placed))
    })
    .await
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_nodes_replicas_are_replaced_and_records_flow_again() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-nodeloss");
    // The operator first, while the first node is the only one: the crash must not take the
    // operator with it, or nothing would replace anything.
    install_operator_with(
        &world,
        &ns,
        &[&format!(
            "replicaReplaceAfterSeconds={REPLACE_AFTER_SECONDS}"
        )],
    )?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let operator = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
        .await?
        .items;
    ensure!(
        !operator.is_empty() && operator.iter().all(|p| node_of(p) == Some(NODE1)),
        "the operator's pods run on {NODE1}"
    );
    let node2 = Node2::start(&world)?;
    let nodes: Api<Node> = Api::all(client.clone());
    let flows_api: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);

    let mut flows = vec![
        Flow::new("spread", 2, false),
        Flow::new("lone", 1, false),
        Flow::new("lone-eos", 1, true),
    ];
    for f in &mut flows {
        kafka::create_topic(&world.source_bootstrap, &f.topic, PARTITIONS).await?;
        f.producer = Some(SteadyProducer::start(
            &world.source_bootstrap,
            &f.topic,
            PARTITIONS,
            PRODUCE_EVERY,
        )?);
    }

    // Two replicas on two nodes: the spread is the operator's (a topology spread over
    // kubernetes.io/hostname), never forced here, so a flow whose replicas share a node is a
    // finding of this test, not something to arrange around.
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &flows[0].yaml(&ns, &world),
    )?;
    let spread = scheduled_pods(&pods, &flows[0]).await?;
    let spread_nodes: std::collections::BTreeSet<&str> =
        spread.iter().map(|(_, _, n)| n.as_str()).collect();
    ensure!(
        spread_nodes.len() == 2,
        "the two replicas of a flow were scheduled onto one node ({spread:?}): the replicator \
         pods have no topology spread over kubernetes.io/hostname, so losing that node stops \
         the whole flow"
    );
    // One replica each on the node that will crash: created while the first node is cordoned.
    {
        let _cordon = Cordon::first_node()?;
        for f in &flows[1..] {
            run_with_input("kubectl", &["apply", "-f", "-"], &f.yaml(&ns, &world))?;
        }
        for f in &flows[1..] {
            let placed = scheduled_pods(&pods, f).await?;
            ensure!(
                placed.iter().all(|(_, _, n)| n == NODE2),
                "{}: created while {NODE1} was cordoned, yet {placed:?}",
                f.name
            );
        }
    }

    // Copying: every flow has copied, on every partition, records written from here on.
    for f in &mut flows {
        kafka::wait_for_topic(&world.target_bootstrap, &f.remote, Duration::from_secs(180)).await?;
        f.reader = Some(TargetReader::start(
            &world.target_bootstrap,
            &f.remote,
            PARTITIONS,
            f.exactly_once,
        )?);
    }
    let from: Vec<Vec<u64>> = flows
        .iter()
        .map(|f| {
            f.producer
                .as_ref()
                .map(SteadyProducer::queued)
                .unwrap_or_default()
        })
        .collect();
    eventually(
        "every flow copying records as they are written",
        Duration::from_secs(180),
        || async {
            let behind: Vec<&str> = flows
                .iter()
                .zip(&from)
                .filter(|(f, from)| steady::resumed_at(&f.seen(), from).is_none())
                .map(|(f, _)| f.name)
                .collect();
            if behind.is_empty() {
                return Ok(Some(()));
            }
            bail!("not yet copying: {behind:?}")
        },
    )
    .await?;
    tokio::time::sleep(STEADY_BEFORE_KILL).await;

    // Which pods the crash takes.
    for f in &mut flows {
        f.lost_pods = scheduled_pods(&pods, f)
            .await?
            .into_iter()
            .filter(|(_, _, n)| n == NODE2)
            .map(|(name, uid, _)| (name, uid))
            .collect();
        ensure!(
            f.lost_pods.len() == 1,
            "{}: {} of its pods on {NODE2} before the crash, one expected",
            f.name,
            f.lost_pods.len()
        );
    }

    let killed = Instant::now();
    node2.kill()?;
    // The kill cuts the node's network first and returns once every process of it is dead: a
    // record queued from here on cannot have been copied by a replica on it.
    for f in &mut flows {
        f.after_kill = f
            .producer
            .as_ref()
            .map(SteadyProducer::queued)
            .unwrap_or_default();
    }
    println!(
        "node_loss: {NODE2} killed in {:.1} s",
        killed.elapsed().as_secs_f64()
    );

    let mut not_ready: Option<Duration> = None;
    let deadline = killed + RESUME_WITHIN;
    loop {
        let now = killed.elapsed();
        if not_ready.is_none() && !node_ready(&nodes.get(NODE2).await?) {
            not_ready = Some(now);
        }
        for f in &mut flows {
            if f.detected.is_none() {
                let mf = flows_api.get(f.name).await?;
                if let Some((status, reason, message)) = condition(&mf, "Ready")
                    && status == "False"
                    && reason == "ReplicaOnLostNode"
                {
                    f.detected = Some(now);
                    f.lost_node_message = Some(message);
                }
            }
            if f.replaced.is_none() {
                let mut gone = true;
                for (name, uid) in &f.lost_pods {
                    let current = pods.get_opt(name).await?;
                    if current.is_some_and(|p| p.metadata.uid.as_deref() == Some(uid)) {
                        gone = false;
                    }
                }
                if gone {
                    f.replaced = Some(now);
                }
            }
            if f.resumed.is_none()
                && let Some(at) = steady::resumed_at(&f.seen(), &f.after_kill)
            {
                f.resumed = Some(at.saturating_duration_since(killed));
            }
        }
        let done = flows
            .iter()
            .all(|f| f.detected.is_some() && f.replaced.is_some() && f.resumed.is_some());
        if done || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Everything written up to now must arrive: stop writing, then wait for the last records.
    for f in &mut flows {
        if let Some(p) = f.producer.take() {
            f.written = p.stop().await?;
        }
    }
    let drained = eventually(
        "every record written on the target",
        DRAIN_WITHIN,
        || async {
            Ok(flows
                .iter()
                .all(|f| steady::all_arrived(&f.seen(), &f.written))
                .then_some(()))
        },
    )
    .await;

    let events: Vec<Event> = Api::<Event>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ReplicaReplaced"))
        .collect();
    let mut failures = Vec::new();
    println!(
        "node_loss: {NODE2} NotReady (kube-controller-manager) after {}",
        secs(not_ready)
    );
    for f in &flows {
        let seen = f.seen();
        let (lost, duplicated) = steady::lost_and_duplicated(&seen, &f.written);
        let mut now_on = Vec::new();
        for (name, _) in &f.lost_pods {
            let node = pods
                .get_opt(name)
                .await?
                .as_ref()
                .and_then(node_of)
                .map(str::to_owned);
            now_on.push(format!("{name} on {}", node.as_deref().unwrap_or("-")));
        }
        let written: u64 = f.written.iter().sum();
        println!(
            "node_loss[{}] replicas {}, {}: detected after {}, replaced after {} (now {}), \
             resumed after {}; written {written}, lost {lost}, duplicated {duplicated} (at most {})",
            f.name,
            f.replicas,
            f.mode(),
            secs(f.detected),
            secs(f.replaced),
            now_on.join(", "),
            secs(f.resumed),
            f.duplicates_bound(),
        );
        let ready = condition(&flows_api.get(f.name).await?, "Ready");
        if f.resumed.is_none() {
            failures.push(format!(
                "{}: no record written after the crash reached the target within {RESUME_WITHIN:?} \
                 on every partition (pods on the lost node: {now_on:?}; Ready now {ready:?}; \
                 reader: {:?})",
                f.name,
                f.reader.as_ref().and_then(TargetReader::last_error)
            ));
        }
        if f.replaced.is_none() {
            failures.push(format!(
                "{}: {:?} still on the lost node {RESUME_WITHIN:?} after the crash: the operator \
                 did not replace it (Ready now {ready:?})",
                f.name, f.lost_pods
            ));
        }
        match &f.lost_node_message {
            None => failures.push(format!(
                "{}: the Ready condition never said ReplicaOnLostNode while its replica was on \
                 the lost node (now {ready:?})",
                f.name
            )),
            Some(m) => {
                for (pod, _) in &f.lost_pods {
                    if !m.contains(pod.as_str()) || !m.contains(NODE2) {
                        failures.push(format!(
                            "{}: the ReplicaOnLostNode message names neither {pod} nor {NODE2}: {m}",
                            f.name
                        ));
                    }
                }
            }
        }
        for (pod, _) in &f.lost_pods {
            let recorded = events.iter().any(|e| {
                let message = e.message.as_deref().unwrap_or_default();
                e.involved_object.kind.as_deref() == Some("MirrorFlow")
                    && e.involved_object.name.as_deref() == Some(f.name)
                    && message.contains(pod.as_str())
                    && message.contains(NODE2)
            });
            if !recorded {
                failures.push(format!(
                    "{}: no ReplicaReplaced Event about the flow naming {pod} and {NODE2}",
                    f.name
                ));
            }
        }
        if lost > 0 {
            failures.push(format!(
                "{}: {lost} records written were never copied",
                f.name
            ));
        }
        if duplicated > f.duplicates_bound() {
            failures.push(format!(
                "{}: {duplicated} duplicates, more than {} ({})",
                f.name,
                f.duplicates_bound(),
                f.mode()
            ));
        }
    }
    if let Err(e) = drained {
        failures.push(format!("{e:#}"));
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));

    drop(node2);
    run("helm", &["uninstall", "mirrorflow", "-n", &ns, "--wait"])?;
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}
