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

/// Where the test's flows go: the namespace (with its own operator), its flows and a topic.
struct Place<'a> {
    world: &'a World,
    ns: String,
    flows: Api<MirrorFlow>,
    topic: String,
}

impl Place<'_> {
    /// Creates the ResourceQuota `quota` with `hard`, applies the flow `name` and waits for
    /// `Ready` False with `reason`; checks the message holds each of `parts` (and who
    /// refused), that an Event says it, and returns it.
    async fn refused_under_quota(
        &self,
        quota: &str,
        hard: &str,
        name: &str,
        reason: &str,
        parts: &[&str],
    ) -> Result<String> {
        let ns = &self.ns;
        run(
            "kubectl",
            &[
                "create",
                "quota",
                quota,
                "-n",
                ns,
                &format!("--hard={hard}"),
            ],
        )?;
        let alias = unique("pol");
        let flow = format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  source: {{alias: {alias}, bootstrapServers: \"{}\"}}\n  target: {{alias: {alias}-t, bootstrapServers: \"{}\"}}\n  topics: [\"{}\"]\n",
            self.world.source_bootstrap, self.world.target_bootstrap, self.topic
        );
        run_with_input("kubectl", &["apply", "-f", "-"], &flow)?;
        let applied = Instant::now();
        let mf = wait_for_flow(
            &self.flows,
            name,
            &format!("Ready False: {reason}"),
            Duration::from_secs(90),
            |mf| condition(mf, "Ready").is_some_and(|c| c.0 == "False" && c.1 == reason),
        )
        .await?;
        let (_, _, message) = condition(&mf, "Ready").context("Ready")?;
        println!(
            "{reason} {:?} after the flow was applied: {message}",
            applied.elapsed()
        );
        let who = format!("a ResourceQuota of namespace {ns} has no room for it");
        let quoted = format!("exceeded quota: {quota}");
        for part in parts.iter().copied().chain([who.as_str(), quoted.as_str()]) {
            assert!(message.contains(part), "{part:?} not in {message:?}");
        }
        wait_for_event(ns, name, reason, "exceeded quota").await?;
        Ok(message)
    }
}

#[tokio::test]
async fn quotas_refusing_a_flows_pods_or_objects_are_named_and_recovered_from() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-policy");
    install_operator(&world, &ns)?;
    let topic = unique("policytopic");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    let place = Place {
        world: &world,
        flows: Api::namespaced(client, &ns),
        ns: ns.clone(),
        topic,
    };

    // Pods: the operator's own pod runs already; no room for another.
    place
        .refused_under_quota(
            "no-pods",
            "pods=1",
            "quota",
            "ReplicatorNotCreated",
            &["replicator pod quota-0 cannot be created"],
        )
        .await?;
    run("kubectl", &["delete", "quota", "no-pods", "-n", &ns])?;
    let freed = Instant::now();
    wait_for_flow(
        &place.flows,
        "quota",
        "Ready once the quota is gone",
        Duration::from_secs(240),
        |mf| condition(mf, "Ready").is_some_and(|c| c.0 == "True"),
    )
    .await?;
    println!("Ready {:?} after the quota was deleted", freed.elapsed());

    // Services: the operator's own write is refused.
    place
        .refused_under_quota(
            "no-services",
            "services=0",
            "services",
            "ChildForbidden",
            &["the apiserver refused to write the replicators' Service"],
        )
        .await?;
    // The first flow, whose objects exist, is untouched by the quota on new ones.
    let first = place.flows.get("quota").await?;
    assert!(
        condition(&first, "Ready").is_some_and(|c| c.0 == "True"),
        "{:?}",
        condition(&first, "Ready")
    );
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    Ok(())
}
