//! A release as users get it: one version for the binary, the image and the chart; the chart and
//! the image in an OCI registry (the world's, filled by the release's own scripts under
//! `release/`), the image pulled from it by the node's containerd by tag and by digest; the
//! release workflow checked by actionlint so it cannot rot unseen.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mirrorflow_e2e::replicator::binary;
use mirrorflow_e2e::{World, eventually, run, run_with_input, unique};

fn version(world: &World) -> Result<String> {
    let script = world.repo_root.join("release/version.sh");
    Ok(run(script.to_str().context("path")?, &[])?
        .trim()
        .to_string())
}

fn registry() -> Result<String> {
    std::env::var("MF_REGISTRY").context("MF_REGISTRY is not set: run through e2e/test.sh")
}

/// The digest the world's chart values pin the image to (what the registry answered the push).
fn pinned_digest(world: &World) -> Result<String> {
    let values = std::fs::read_to_string(&world.chart_values)?;
    values
        .lines()
        .find_map(|l| l.trim().strip_prefix("digest: "))
        .map(str::to_string)
        .context("no image digest in the world's chart values")
}

/// One field of a pod, by JSONPath.
fn pod_field(name: &str, ns: &str, path: &str) -> Result<String> {
    run(
        "kubectl",
        &[
            "get",
            "pod",
            name,
            "-n",
            ns,
            "-o",
            &format!("jsonpath={path}"),
        ],
    )
}

#[test]
fn the_binary_the_chart_and_the_changelog_carry_one_version() -> Result<()> {
    let world = World::from_env()?;
    let v = version(&world)?;
    let binary = binary(&world.repo_root);
    let printed = run(binary.to_str().context("path")?, &["--version"])?;
    ensure!(
        printed.trim() == format!("mirrorflow {v}"),
        "`mirrorflow --version` printed {printed:?}, the release is {v}"
    );
    let chart = format!("oci://{}/charts/mirrorflow", registry()?);
    let shown = run(
        "helm",
        &["show", "chart", &chart, "--version", &v, "--plain-http"],
    )?;
    ensure!(
        shown.lines().any(|l| l == format!("version: {v}"))
            && shown.lines().any(|l| l == format!("appVersion: {v}")),
        "the published chart is not version {v}:\n{shown}"
    );
    let notes = world.repo_root.join("release/notes.sh");
    let notes = run(notes.to_str().context("path")?, &[])?;
    ensure!(
        notes.contains("### "),
        "CHANGELOG.md's section for {v} is empty:\n{notes}"
    );
    Ok(())
}

#[tokio::test]
async fn the_node_pulls_the_image_from_the_registry_by_tag_and_by_digest() -> Result<()> {
    let world = World::from_env()?;
    let v = version(&world)?;
    let registry = registry()?;
    let digest = pinned_digest(&world)?;
    let ns = unique("e2e-release");
    run("kubectl", &["create", "namespace", &ns])?;
    let pod = |name: &str, image: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\n\
             spec:\n  restartPolicy: Never\n  automountServiceAccountToken: false\n\
             \x20 containers:\n  - name: version\n    image: {image}\n    imagePullPolicy: Always\n\
             \x20   args: [--version]\n    securityContext: {{runAsNonRoot: true, allowPrivilegeEscalation: false, \
             readOnlyRootFilesystem: true, capabilities: {{drop: [ALL]}}}}\n"
        )
    };
    let by_tag = format!("{registry}/mirrorflow:{v}");
    let by_digest = format!("{registry}/mirrorflow@{digest}");
    let result = async {
        for (name, image) in [("by-tag", &by_tag), ("by-digest", &by_digest)] {
            run_with_input("kubectl", &["apply", "-f", "-"], &pod(name, image))?;
        }
        for name in ["by-tag", "by-digest"] {
            eventually(
                &format!("pod {name} ran to completion"),
                Duration::from_secs(120),
                || async {
                    let phase = pod_field(name, &ns, "{.status.phase}")?;
                    ensure!(phase != "Failed", "pod {name} failed");
                    Ok((phase == "Succeeded").then_some(()))
                },
            )
            .await?;
            let printed = run("kubectl", &["logs", name, "-n", &ns])?;
            ensure!(
                printed.trim() == format!("mirrorflow {v}"),
                "{name}: the pulled image printed {printed:?}, the release is {v}"
            );
            let image_id = pod_field(name, &ns, "{.status.containerStatuses[0].imageID}")?;
            ensure!(
                image_id == by_digest,
                "{name}: containerd ran {image_id}, the registry's {by_digest}"
            );
        }
        anyhow::Ok(())
    }
    .await;
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    result
}

#[test]
fn the_release_workflow_passes_actionlint() -> Result<()> {
    let world = World::from_env()?;
    let workflows = world.repo_root.join(".github/workflows");
    let files: Vec<String> = std::fs::read_dir(&workflows)?
        .filter_map(|e| e.ok())
        .map(|e| e.path().to_string_lossy().into_owned())
        .filter(|p| p.ends_with(".yml") || p.ends_with(".yaml"))
        .collect();
    ensure!(!files.is_empty(), "no workflow in {}", workflows.display());
    let args: Vec<&str> = files.iter().map(String::as_str).collect();
    // actionlint is on the world's PATH (e2e/world.sh tools builds it); a failure prints its
    // findings.
    run("actionlint", &args)?;
    Ok(())
}
