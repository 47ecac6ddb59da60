//! The operator killed during an upgrade (issue 40, item 5, its upgrade part): the previous
//! release installed with two flows copying live records (at least once, exactly once), then
//! `helm upgrade` to this checkout, and the upgraded operator SIGKILLed twice on the way: once
//! as soon as the test finds its process running (the old operator usually still there), once
//! a random 0-4 s after the old operator is gone and the new one runs again (taking the lease
//! over and re-applying every flow's children with the new image). Afterwards each flow has one set of children, every
//! child controlled by its flow and none recreated (same uids), every replicator rolled to the
//! new image, every flow Ready, and no record lost.
//!
//! Prints an `upgrade_killed: ...` line and one `upgrade_killed[<mode>] ...` line per flow. Like
//! `upgrade_traffic`, a smoke from the world's own release when the previous one is not in the
//! registry.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use mirrorflow_e2e::node::{container_pid, signal};
use mirrorflow_e2e::operator::{one_set_each, owned_children};
use mirrorflow_e2e::steady;
use mirrorflow_e2e::upgrade::{
    Flow, Installed, Mode, drained, install_previous, operator_image, rolled, start_flows,
    upgrade_to_checkout,
};
use mirrorflow_e2e::{World, eventually, jitter};

const OPERATOR: &str = "app.kubernetes.io/component=operator";

/// (pod name, host pid) of the operator running `image`, or None while it does not run.
async fn operator_running(pods: &Api<Pod>, image: &str) -> Result<Option<(String, i32)>> {
    for p in pods
        .list(&ListParams::default().labels(OPERATOR))
        .await?
        .items
    {
        let runs_image = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .is_some_and(|c| c.image.as_deref() == Some(image));
        if runs_image
            && p.metadata.deletion_timestamp.is_none()
            && let Ok(pid) = container_pid(&p, "operator")
        {
            return Ok(Some((p.metadata.name.unwrap_or_default(), pid)));
        }
    }
    Ok(None)
}

/// Whether any operator pod running `image` is left (terminating ones included).
async fn any_operator_with(pods: &Api<Pod>, image: &str) -> Result<bool> {
    Ok(pods
        .list(&ListParams::default().labels(OPERATOR))
        .await?
        .items
        .iter()
        .any(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .is_some_and(|c| c.image.as_deref() == Some(image))
        }))
}

/// The image the upgrade puts in the operator's Deployment, once helm has changed it.
async fn upgraded_image(ns: &str, old: &str) -> Result<String> {
    eventually(
        "helm changing the operator's image",
        Duration::from_secs(60),
        || async {
            let image = operator_image(ns)?;
            Ok((image != old).then_some(image))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_during_the_upgrade_leaves_one_set_of_children_and_ready_flows()
-> Result<()> {
    let world = World::from_env()?;
    let Installed {
        from,
        ns,
        old_image,
        client,
        flows: api,
        stateful_sets: sts,
        cleanup: _cleanup,
    } = install_previous(&world, "e2e-upgkill").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut flows: Vec<Flow> = [Mode::AtLeastOnce, Mode::ExactlyOnce]
        .into_iter()
        .map(Flow::new)
        .collect();
    start_flows(&world, &ns, &mut flows, &api).await?;
    let names: Vec<&str> = flows.iter().map(|f| f.mode.name()).collect();
    let per_flow = one_set_each(&api, &ns, &names).await?;
    let before = owned_children(&ns)?;

    let upgrading = Instant::now();
    let helm = upgrade_to_checkout(&ns, upgrading)?;
    let new_image = upgraded_image(&ns, &old_image).await?;
    // First kill: the upgraded operator's process as soon as it runs, the old one leading.
    let (pod, pid) = eventually(
        "the upgraded operator running",
        Duration::from_secs(120),
        || operator_running(&pods, &new_image),
    )
    .await?;
    let old_still_there = any_operator_with(&pods, &old_image).await?;
    signal(pid, "-KILL")?;
    let first_kill = upgrading.elapsed();
    // Second kill: once the old operator is gone and the new one runs again (kubelet's restart
    // backoff: 10 s), a moment later, while it takes the lease and re-applies the children.
    eventually(
        "the old operator gone and the upgraded one running again",
        Duration::from_secs(180),
        || async {
            if any_operator_with(&pods, &old_image).await? {
                return Ok(None);
            }
            Ok(operator_running(&pods, &new_image)
                .await?
                .filter(|(_, p)| *p != pid))
        },
    )
    .await?;
    tokio::time::sleep(jitter(Duration::from_secs(4))).await;
    let (_, pid) = operator_running(&pods, &new_image)
        .await?
        .context("the upgraded operator stopped before the second kill")?;
    signal(pid, "-KILL")?;
    let second_kill = upgrading.elapsed();
    let helm_done = helm.await??;
    eventually(
        "every replicator rolled to the new image and every flow Ready",
        Duration::from_secs(300),
        || async { Ok(rolled(&sts, &api, &flows, &new_image).await?.then_some(())) },
    )
    .await?;
    let rolled_after = upgrading.elapsed();

    // One set each, the same objects: an operator killed half-way through applying them
    // neither made a second set nor replaced one.
    ensure!(
        one_set_each(&api, &ns, &names).await? == per_flow,
        "the number of children per flow changed"
    );
    let after = owned_children(&ns)?;
    let uids = |m: &std::collections::BTreeMap<String, mirrorflow_e2e::operator::Child>| {
        m.iter()
            .map(|(k, c)| (k.clone(), c.0.clone()))
            .collect::<Vec<_>>()
    };
    ensure!(
        uids(&after) == uids(&before),
        "children recreated or added: {before:?} -> {after:?}"
    );
    println!(
        "upgrade_killed: {} -> checkout: the upgraded operator ({pod}) SIGKILLed {:.1} s (the old operator {}) and {:.1} s (the old one gone) after the upgrade started; helm upgrade --wait done after {:.1} s; every replicator rolled and every flow Ready after {:.1} s; {per_flow} children per flow, none recreated",
        from.describe(),
        first_kill.as_secs_f64(),
        if old_still_there {
            "still there"
        } else {
            "gone already"
        },
        second_kill.as_secs_f64(),
        helm_done.as_secs_f64(),
        rolled_after.as_secs_f64(),
    );

    for f in &mut flows {
        if let Some(p) = f.producer.take() {
            f.written = p.stop().await?;
        }
        f.consumer_stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let drained = drained(&flows).await;
    let mut failures = Vec::new();
    for f in &flows {
        let (lost, duplicated) = steady::lost_and_duplicated(&f.seen(), &f.written);
        println!(
            "upgrade_killed[{}] written {}, lost {lost}, duplicated {duplicated} (at most {})",
            f.mode.name(),
            f.written.iter().sum::<u64>(),
            f.mode.duplicates_bound()
        );
        if lost > 0 || duplicated > f.mode.duplicates_bound() {
            failures.push(format!(
                "{}: lost {lost}, duplicated {duplicated}",
                f.mode.name()
            ));
        }
    }
    if let Err(e) = drained {
        failures.push(format!("{e:#}"));
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
