//! `spec.mode: Observe`: the operator watches a flow a real MirrorMaker 2 (dedicated mode, from
//! the world's Kafka jars) replicates, deploys nothing, and reports failover readiness from
//! MirrorMaker's own heartbeats and checkpoints; when MirrorMaker stops, the status says so.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{condition, install_operator, wait_for_flow};
use mirrorflow_e2e::{World, kafka, run, run_with_input, unique};

/// Stops the MirrorMaker and removes the namespace even when the test fails half-way.
struct Cleanup<'a> {
    world: &'a World,
    mm2: String,
    ns: String,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.world.world_sh(&["mm2", "stop", &self.mm2]);
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", &self.ns]);
        let _ = run(
            "kubectl",
            &["delete", "namespace", &self.ns, "--wait=false"],
        );
    }
}

#[tokio::test]
async fn observe_mode_reports_a_mirrormaker2_flow_and_deploys_nothing() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-observe");
    let src = unique("mmsrc");
    let tgt = unique("mmtgt");
    let topic = unique("obstopic");
    let group = format!("{topic}-app");
    let _cleanup = Cleanup {
        world: &world,
        mm2: src.clone(),
        ns: ns.clone(),
    };

    kafka::create_topic(&world.source_bootstrap, &topic, 2).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 40, 2).await?;
    kafka::commit(&world.source_bootstrap, &group, &topic, &[(0, 15), (1, 20)])?;

    // MirrorMaker's heartbeats for SRC->TGT come from the TGT->SRC heartbeat emitter writing into
    // the source's `heartbeats` topic; the helper turns that emitter off by default.
    world.world_sh(&[
        "mm2",
        "start",
        &src,
        &src,
        &world.source_bootstrap,
        &tgt,
        &world.target_bootstrap,
        &format!("topics={topic}"),
        &format!("groups={group}"),
        &format!("{tgt}->{src}.emit.heartbeats.enabled=true"),
    ])?;

    install_operator(&world, &ns)?;
    let flow = format!(
        r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: mm2, namespace: {ns}}}
spec:
  mode: Observe
  source: {{alias: {src}, bootstrapServers: "{s}"}}
  target: {{alias: {tgt}, bootstrapServers: "{t}"}}
  topics: ["{topic}"]
  groups: ["{group}"]
  failoverReadiness: {{maxHeartbeatLag: 10s}}
"#,
        s = world.source_bootstrap,
        t = world.target_bootstrap,
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &flow)?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    let started = std::time::Instant::now();
    let ready = wait_for_flow(
        &flows,
        "mm2",
        "FailoverReady=True from MirrorMaker's heartbeats and checkpoints",
        Duration::from_secs(180),
        |mf| condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True"),
    )
    .await?;
    println!(
        "FailoverReady (observing MirrorMaker 2) after {:?}",
        started.elapsed()
    );
    let status = ready.status.context("status")?;
    let ready_cond = condition_of(&status.conditions, "Ready")?;
    assert_eq!(ready_cond.reason, "Observing", "{ready_cond:?}");
    assert_eq!(
        status.groups,
        Some(1),
        "MirrorMaker's checkpointed group is counted"
    );
    let row = status
        .least_ready_groups
        .iter()
        .find(|g| g.group == group)
        .context("the group is listed")?;
    assert_eq!(row.reason, "Ready", "{row:?}");
    assert_eq!(
        status.replication_lag, None,
        "no positions of ours to measure lag from"
    );
    let stses: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    assert!(
        stses.get_opt("mm2").await?.is_none(),
        "observe mode deploys no replicator"
    );

    // `mirrorflow status` draws the operator's status, and measures the same verdict itself
    // from a flow file, without the operator.
    let binary = mirrorflow_e2e::replicator::binary(&world.repo_root);
    let binary = binary.to_str().context("binary path")?;
    let report = run(binary, &["status", "--name", "mm2", "-n", &ns])?;
    assert!(report.contains("(as the operator measured it)"), "{report}");
    assert!(
        report.contains("LEAST-READY GROUPS") && report.contains(&group),
        "{report}"
    );
    let file = std::env::temp_dir().join(format!("{ns}.yaml"));
    std::fs::write(&file, &flow)?;
    let measured = run(
        binary,
        &[
            "status",
            "--flow-file",
            file.to_str().context("path")?,
            "-o",
            "json",
            "--watch",
            "1",
            "--count",
            "2",
        ],
    );
    let _ = std::fs::remove_file(&file);
    let measured = measured?;
    // Two JSON documents, one per draw; the last one counts.
    let documents = serde_json::Deserializer::from_str(&measured)
        .into_iter::<serde_json::Value>()
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("status documents in {measured}"))?;
    ensure!(documents.len() == 2, "two status documents: {measured}");
    let status = documents.last().context("a status document")?;
    let failover = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "FailoverReady"))
        .context("FailoverReady in the measured status")?;
    assert_eq!(failover["status"], "True", "{status}");

    // MirrorMaker stops: its heartbeats age past the limit and the flow is no longer ready.
    world.world_sh(&["mm2", "stop", &src])?;
    let stopped = std::time::Instant::now();
    let down = wait_for_flow(
        &flows,
        "mm2",
        "Replicating=False once MirrorMaker's heartbeats stop",
        Duration::from_secs(90),
        |mf| condition(mf, "Replicating").is_some_and(|c| c.0 == "False"),
    )
    .await?;
    println!(
        "Replicating=False {:?} after MirrorMaker stopped",
        stopped.elapsed()
    );
    let (_, reason, message) = condition(&down, "FailoverReady").context("FailoverReady")?;
    assert_eq!(reason, "HeartbeatLagHigh", "{message}");
    assert!(message.contains("is the replicator running"), "{message}");
    Ok(())
}

fn condition_of<'a>(
    conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Result<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .with_context(|| format!("condition {type_}"))
}
