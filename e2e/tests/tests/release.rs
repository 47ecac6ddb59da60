//! A release as users get it: one version for the binary, the image and the chart; the chart and
//! the image in an OCI registry (the world's, filled by the release's own scripts under
//! `release/`), the image pulled from it by the node's containerd by tag and by digest; the
//! release workflow checked by actionlint so it cannot rot unseen; the kubectl plugin's release
//! archive and krew manifest (the release's own scripts) validated and installed by krew itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mirrorflow_e2e::replicator::binary;
use mirrorflow_e2e::{World, eventually, run, run_with_input, unique};

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
    let v = world.release_version()?;
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
    let v = world.release_version()?;
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

/// The platform krew names this machine (its `arch` label), which the world's binary is built for.
fn krew_arch() -> Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        other => anyhow::bail!("no krew platform for the machine's architecture {other}"),
    }
}

/// `kubectl krew install --manifest=MANIFEST --archive=ARCHIVE` into `krew_root`: the archive is
/// the local file, so nothing is downloaded.
fn krew_install(krew_root: &Path, manifest: &Path, archive: &Path) -> Result<String> {
    let manifest = format!("--manifest={}", manifest.display());
    let archive = format!("--archive={}", archive.display());
    let args = ["krew", "install", manifest.as_str(), archive.as_str()];
    let out = Command::new("kubectl")
        .args(args)
        .env("KREW_ROOT", krew_root)
        .stdin(std::process::Stdio::null())
        .output()
        .context("running kubectl krew (on the world's PATH: e2e/world.sh tools builds it)")?;
    ensure!(
        out.status.success(),
        "kubectl {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The release's plugin archive (release/plugin-archive.sh) of the world's binary and its krew
/// manifest (release/krew.sh), in `dir`; the manifest under the release asset's name.
fn plugin_release(world: &World, v: &str, dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let script = |name: &str| world.repo_root.join("release").join(name);
    let binary = binary(&world.repo_root);
    let archive = run(
        script("plugin-archive.sh").to_str().context("path")?,
        &[
            binary.to_str().context("path")?,
            "linux",
            krew_arch()?,
            dir.to_str().context("path")?,
        ],
    )?;
    let archive = PathBuf::from(archive.trim());
    let manifest = run(
        script("krew.sh").to_str().context("path")?,
        &[v, archive.to_str().context("path")?],
    )?;
    let path = dir.join("mirrorflow-krew.yaml");
    std::fs::write(&path, manifest)?;
    Ok((archive, path))
}

/// The check bites: the same archive under a manifest with another checksum is refused by krew.
fn refuses_a_wrong_sha256(dir: &Path, manifest: &str, archive: &Path) -> Result<()> {
    let wrong = dir.join("wrong-sha.yaml");
    let sha = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("sha256: "))
        .map(|v| v.trim_matches('"'))
        .context("no sha256 in the manifest")?;
    // Another valid digest: the first hex digit changed.
    let first = if sha.starts_with('0') { "1" } else { "0" };
    let other = format!("{first}{}", sha.get(1..).unwrap_or_default());
    std::fs::write(&wrong, manifest.replace(sha, &other))?;
    let refused = krew_install(&dir.join("krew-wrong"), &wrong, archive);
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("checksum does not match")),
        "krew installed the archive under a wrong sha256: {refused:?}"
    );
    Ok(())
}

#[test]
fn the_kubectl_plugin_installs_with_krew_from_the_release_manifest() -> Result<()> {
    let world = World::from_env()?;
    let v = world.release_version()?;
    let dir = std::env::temp_dir().join(unique("e2e-krew"));
    std::fs::create_dir_all(&dir)?;
    let result = (|| {
        let (archive, manifest) = plugin_release(&world, &v, &dir)?;
        let name = format!("kubectl-mirrorflow_{v}_linux_{}.tar.gz", krew_arch()?);
        ensure!(
            archive.file_name().and_then(|n| n.to_str()) == Some(name.as_str()),
            "the plugin archive is {}, the release asset is named {name}",
            archive.display()
        );
        let text = std::fs::read_to_string(&manifest)?;
        let uri = format!("https://github.com/mirrorflow/mirrorflow/releases/download/v{v}/{name}");
        ensure!(
            text.lines().any(|l| l.trim() == format!("uri: \"{uri}\"")),
            "the manifest does not download {uri}:\n{text}"
        );
        // krew's validator infers the plugin's name from the file's; it installs from the URI,
        // which is not published yet, so the install below does that with the local archive.
        let named = dir.join("mirrorflow.yaml");
        std::fs::copy(&manifest, &named)?;
        run(
            "validate-krew-manifest",
            &[
                "-manifest",
                named.to_str().context("path")?,
                "-skip-install",
            ],
        )?;
        let krew_root = dir.join("krew");
        krew_install(&krew_root, &manifest, &archive)?;
        let path = format!(
            "{}:{}",
            krew_root.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("kubectl")
            .args(["mirrorflow", "--version"])
            .env("PATH", path)
            .output()?;
        let printed = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && printed.trim() == format!("mirrorflow {v}"),
            "`kubectl mirrorflow --version` printed {printed:?} ({}; stderr {}), the release is {v}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        refuses_a_wrong_sha256(&dir, &text, &archive)
    })();
    std::fs::remove_dir_all(&dir).ok();
    result
}
