//! Upgrades under stored flows (issue 40, item 4, the CRD and chart part): a CRD with one more
//! optional field that has a default keeps the stored MirrorFlows served and reconciled, and a
//! `helm upgrade` from the chart in the registry to this checkout's chart replaces the operator
//! and keeps the flows Ready with none of their children recreated.
//!
//! Runs alone (world-tests.sh's exclusive list): the CRD is cluster-wide, and every other
//! test's flows are served through it while it carries the added field. The checkout's CRD is
//! applied again when the test ends, also when it fails.
//!
//! The registry's chart is the one this world published (the checkout's version), so the
//! upgrade is from that chart to this checkout's; the upgrade from the previous release, under
//! traffic, is `upgrade_traffic`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{
    apply_crds, apply_replicating_flow, helm_release, ready_at_generation, reconciles,
    roll_flow_spec, wait_for_flow,
};
use mirrorflow_e2e::{World, eventually, run, run_with_input, unique};

/// The field the test adds to `spec`, and its default.
const ADDED: &str = "upgradeNote";
const DEFAULT: &str = "added-by-operator-upgrade";

/// Puts the checkout's CRD back and removes the test's namespace when dropped.
struct Restore<'a> {
    world: &'a World,
    ns: String,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        if let Err(e) = apply_crds(self.world) {
            eprintln!("putting the CRD back failed: {e:#}");
        }
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", &self.ns]);
        let _ = run(
            "kubectl",
            &["delete", "namespace", &self.ns, "--wait=false"],
        );
    }
}

/// The checkout's CRD with `spec.<ADDED>`: an optional string with a default.
fn crd_with_added_field(world: &World) -> Result<String> {
    let path = world.repo_root.join("crds/mirrorflows.mirrorflow.io.yaml");
    let mut crd: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(path)?)?;
    let spec_props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"]
        .as_mapping_mut()
        .context("the CRD's spec properties")?;
    spec_props.insert(
        ADDED.into(),
        serde_yaml::from_str(&format!(
            "{{type: string, default: {DEFAULT}, description: 'Added by the upgrade test.'}}"
        ))?,
    );
    Ok(serde_yaml::to_string(&crd)?)
}

/// uid of every child the operator manages in `ns`, by `kind/name`.
fn children(ns: &str) -> Result<BTreeMap<String, String>> {
    let out = run(
        "kubectl",
        &[
            "get",
            "statefulsets,configmaps,services,poddisruptionbudgets",
            "-n",
            ns,
            "-l",
            "app.kubernetes.io/managed-by=mirrorflow-operator",
            "-o",
            "json",
        ],
    )?;
    let list: serde_json::Value = serde_json::from_str(&out)?;
    let mut found = BTreeMap::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let key = format!(
            "{}/{}",
            item["kind"].as_str().unwrap_or_default(),
            item["metadata"]["name"].as_str().unwrap_or_default()
        );
        found.insert(
            key,
            item["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    Ok(found)
}

/// Each StatefulSet's update revision: it changes when its pod template does (a roll).
async fn revisions(sts: &Api<StatefulSet>, names: &[&str]) -> Result<Vec<Option<String>>> {
    let mut out = Vec::new();
    for n in names {
        out.push(sts.get(n).await?.status.and_then(|s| s.update_revision));
    }
    Ok(out)
}

#[tokio::test]
async fn a_crd_with_a_defaulted_field_and_a_chart_upgrade_keep_stored_flows_ready_and_children()
-> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-upgrade");
    let _restore = Restore {
        world: &world,
        ns: ns.clone(),
    };
    let version = world.release_version()?;
    let registry = std::env::var("MF_REGISTRY").context("MF_REGISTRY: run through e2e/test.sh")?;
    apply_crds(&world)?;
    let published = format!("oci://{registry}/charts/mirrorflow");
    helm_release(
        &world,
        "install",
        &published,
        (&ns, &ns),
        &["--version", version.trim(), "--plain-http"],
    )?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let names = ["a", "b"];
    for n in names {
        apply_replicating_flow(&world, &ns, n, "upg").await?;
    }
    for n in names {
        wait_for_flow(
            &flows,
            n,
            "Ready",
            Duration::from_secs(180),
            ready_at_generation,
        )
        .await?;
    }
    let before = children(&ns)?;
    ensure!(before.len() == 4 * names.len(), "children: {before:?}");
    let rev0 = revisions(&sts, &names).await?;

    // The CRD grows a defaulted field: the stored flows are served with its default, reconciled
    // on (their refreshes roll nothing: the replicators' config does not carry the field) and
    // a spec change is observed.
    run_with_input(
        "kubectl",
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &crd_with_added_field(&world)?,
    )?;
    let field = format!("jsonpath={{.spec.{ADDED}}}");
    let served = run("kubectl", &["get", "mf", "a", "-n", &ns, "-o", &field])?;
    ensure!(served == DEFAULT, "stored flow served with '{served}'");
    tokio::time::sleep(Duration::from_secs(15)).await;
    let rev1 = revisions(&sts, &names).await?;
    ensure!(
        rev1 == rev0,
        "the added field rolled replicators: {rev0:?} -> {rev1:?}"
    );
    roll_flow_spec(
        &flows,
        &ns,
        "a",
        r#"{"failoverReadiness":{"maxHeartbeatLag":"40s"}}"#,
    )
    .await?;
    let rev2 = revisions(&sts, &names).await?;

    // The operator replaced by an upgrade to this checkout's chart (a pod annotation makes it
    // a new pod even where the two charts are equal).
    let chart = world.repo_root.join("charts/mirrorflow");
    let upgrading = std::time::Instant::now();
    helm_release(
        &world,
        "upgrade",
        chart.to_str().context("chart path")?,
        (&ns, &ns),
        &["--set", "podAnnotations.upgraded=yes"],
    )?;
    let helm_done = upgrading.elapsed();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let n = eventually(
        "the new operator reconciling both flows",
        Duration::from_secs(60),
        || async {
            let mut seen = Vec::new();
            for p in pods
                .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
                .await?
                .items
            {
                let upgraded = p
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("upgraded"));
                // Not the old pod: a stopped pod's address may not answer a connect at all.
                if !upgraded {
                    continue;
                }
                let n = reconciles(&p);
                if n.as_ref().is_ok_and(|n| *n >= 2.0) {
                    return Ok(n.ok());
                }
                seen.push(format!("{:?}: {n:#?}", p.metadata.name));
            }
            anyhow::bail!("upgraded operator pods: {seen:?}")
        },
    )
    .await?;
    let handover = upgrading.elapsed();
    println!(
        "operator_upgrade: helm upgrade done after {helm_done:?}; the new operator had reconciled both flows {handover:?} after the upgrade started"
    );
    for n in names {
        wait_for_flow(
            &flows,
            n,
            "Ready after the upgrade",
            Duration::from_secs(60),
            ready_at_generation,
        )
        .await?;
    }
    let after = children(&ns)?;
    ensure!(
        after == before,
        "children recreated or changed: {before:?} -> {after:?}"
    );
    let rev3 = revisions(&sts, &names).await?;
    ensure!(
        rev3 == rev2,
        "the upgrade rolled replicators: {rev2:?} -> {rev3:?}"
    );
    println!(
        "operator_upgrade: CRD +spec.{ADDED} served with its default, no roll; chart {} from the registry -> checkout: new operator reconciled ({n}), {} children kept (same uids), no replicator rolled",
        version.trim(),
        after.len(),
    );
    Ok(())
}
