//! The cluster's own policies refusing what a flow needs, answered by class in the flow's
//! status and an Event within seconds, and recovered from without a person touching the flow:
//! - a ResourceQuota with no room for pods: the StatefulSet exists, its pods are refused at
//!   creation, so no pod status says why; `Ready` is `ReplicatorNotCreated` quoting the
//!   quota (read from the StatefulSet controller's `FailedCreate` Event) until the quota goes;
//! - a ResourceQuota with no room for Services: the operator's own write is refused (403);
//!   `Ready` is `ChildForbidden` naming the quota, where it used to be an error only the
//!   operator's log showed, retried for ever.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kube::Api;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{condition, install_operator, wait_for_event, wait_for_flow};
use mirrorflow_e2e::{World, kafka, run, run_with_input, unique};

fn flow(ns: &str, name: &str, alias: &str, topic: &str, world: &World) -> String {
    format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  source: {{alias: {alias}, bootstrapServers: \"{}\"}}\n  target: {{alias: {alias}-t, bootstrapServers: \"{}\"}}\n  topics: [\"{topic}\"]\n",
        world.source_bootstrap, world.target_bootstrap
    )
}

/// Waits for `Ready` False with `reason`, and returns its message and how long it took.
async fn told(
    flows: &Api<MirrorFlow>,
    name: &str,
    reason: &str,
    since: Instant,
) -> Result<(String, Duration)> {
    let mf = wait_for_flow(
        flows,
        name,
        &format!("Ready False: {reason}"),
        Duration::from_secs(90),
        |mf| condition(mf, "Ready").is_some_and(|c| c.0 == "False" && c.1 == reason),
    )
    .await?;
    let (_, _, message) = condition(&mf, "Ready").context("Ready")?;
    Ok((message, since.elapsed()))
}

#[tokio::test]
async fn quotas_refusing_a_flows_pods_or_objects_are_named_and_recovered_from() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-policy");
    install_operator(&world, &ns)?;
    let flows: Api<MirrorFlow> = Api::namespaced(client, &ns);
    let topic = unique("policytopic");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;

    // Pods: the operator's own pod runs already; no room for another.
    run(
        "kubectl",
        &["create", "quota", "no-pods", "-n", &ns, "--hard=pods=1"],
    )?;
    let alias = unique("pol");
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &flow(&ns, "quota", &alias, &topic, &world),
    )?;
    let (message, after) = told(&flows, "quota", "ReplicatorNotCreated", Instant::now()).await?;
    println!("ReplicatorNotCreated {after:?} after the flow was applied: {message}");
    for part in [
        "replicator pod quota-0 cannot be created",
        "exceeded quota: no-pods",
        &format!("a ResourceQuota of namespace {ns} has no room for it"),
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    wait_for_event(&ns, "quota", "ReplicatorNotCreated", "exceeded quota").await?;
    run("kubectl", &["delete", "quota", "no-pods", "-n", &ns])?;
    let freed = Instant::now();
    wait_for_flow(
        &flows,
        "quota",
        "Ready once the quota is gone",
        Duration::from_secs(240),
        |mf| condition(mf, "Ready").is_some_and(|c| c.0 == "True"),
    )
    .await?;
    println!("Ready {:?} after the quota was deleted", freed.elapsed());

    // Services: the operator's own write is refused.
    run(
        "kubectl",
        &[
            "create",
            "quota",
            "no-services",
            "-n",
            &ns,
            "--hard=services=0",
        ],
    )?;
    let alias = unique("pol");
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &flow(&ns, "services", &alias, &topic, &world),
    )?;
    let (message, after) = told(&flows, "services", "ChildForbidden", Instant::now()).await?;
    println!("ChildForbidden {after:?} after the flow was applied: {message}");
    for part in [
        "the apiserver refused to write the replicators' Service",
        "exceeded quota: no-services",
        &format!("a ResourceQuota of namespace {ns} has no room for it"),
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    wait_for_event(&ns, "services", "ChildForbidden", "exceeded quota").await?;
    // The first flow, whose objects exist, is untouched by the quota on new ones.
    let first = flows.get("quota").await?;
    assert!(
        condition(&first, "Ready").is_some_and(|c| c.0 == "True"),
        "{:?}",
        condition(&first, "Ready")
    );
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}
