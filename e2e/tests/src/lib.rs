//! Helpers shared by the world tests: where the running world is, commands against it, waits.
//!
//! The tests run through `e2e/test.sh`, which starts the world and exports its endpoints; run
//! alone they stop at once with a message saying so rather than pass vacuously.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Endpoints of the running world, read from the environment `e2e/world.sh env` prints.
pub struct World {
    pub source_bootstrap: String,
    pub target_bootstrap: String,
    pub kubeconfig: PathBuf,
    /// The node's state dir (kubelet's pod logs are in `pod-logs/`).
    pub node_state: PathBuf,
    /// The chart values the world installs with (its image, never pulled).
    pub chart_values: PathBuf,
    /// An image with a shell, curl and python3, for pods that run commands.
    pub tools_image: String,
    pub repo_root: PathBuf,
}

fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| {
        format!("{name} is not set: these tests need the local world; run them with e2e/test.sh")
    })
}

impl World {
    pub fn from_env() -> Result<World> {
        Ok(World {
            source_bootstrap: var("MF_SOURCE_BOOTSTRAP")?,
            target_bootstrap: var("MF_TARGET_BOOTSTRAP")?,
            kubeconfig: PathBuf::from(var("KUBECONFIG")?),
            node_state: PathBuf::from(var("MF_NODE_STATE")?),
            chart_values: PathBuf::from(var("MF_CHART_VALUES")?),
            tools_image: var("MF_TOOLS_IMAGE")?,
            repo_root: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."),
        })
    }

    /// Runs `e2e/world.sh` with the given arguments (e.g. restarting a broker) and fails on error.
    pub fn world_sh(&self, args: &[&str]) -> Result<()> {
        let out = Command::new(self.repo_root.join("e2e/world.sh"))
            .args(args)
            .output()
            .context("running e2e/world.sh")?;
        check("e2e/world.sh", args, out).map(|_| ())
    }

    /// The checkout's release version (`release/version.sh`: the binary's, the image's and
    /// the chart's).
    pub fn release_version(&self) -> Result<String> {
        let script = self.repo_root.join("release/version.sh");
        Ok(run(script.to_str().context("path")?, &[])?
            .trim()
            .to_string())
    }

    pub async fn kube_client(&self) -> Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }
}

/// Runs a program of the world's PATH (kubectl, helm) and returns its stdout; a non-zero exit
/// is an error carrying stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    check(program, args, out)
}

/// Runs a program feeding `input` on stdin (kubectl apply -f -).
pub fn run_with_input(program: &str, args: &[&str], input: &str) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    child
        .stdin
        .take()
        .context("stdin of child")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    check(program, args, out)
}

fn check(program: &str, args: &[&str], out: Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Polls `probe` until it returns `Some`, or fails after `timeout` with `what` and the last error.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = String::from("condition not met");
    loop {
        match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A name unique to this test run, so reruns against a live world never collide.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    // The clock alone repeats: threads of one test binary may read the same instant, and test
    // binaries run side by side. Microseconds (40 bits: 12 days before they wrap) strictly
    // increasing within the process, then the process id's low byte.
    static LAST: AtomicU64 = AtomicU64::new(0);
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default();
    let previous = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(micros.max(last.saturating_add(1)))
        })
        .unwrap_or(micros);
    let issued = micros.max(previous.saturating_add(1));
    let value = ((issued & 0xff_ffff_ffff) << 8) | u64::from(std::process::id() & 0xff);
    format!("{prefix}-{value:x}")
}

/// A pseudo-random delay below `max` (the clock's nanoseconds: enough to vary where a fault
/// lands between runs).
pub fn jitter(max: std::time::Duration) -> std::time::Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    max.mul_f64(f64::from(nanos % 1000) / 1000.0)
}

pub mod batches;
pub mod fidelity;
pub mod handmirror;
pub mod kafka;
pub mod mm2;
pub mod node;
pub mod oauth;
pub mod operator;
pub mod prometheus;
pub mod replicator;
pub mod secure;
pub mod steady;
pub mod switchover;
pub mod upgrade;
