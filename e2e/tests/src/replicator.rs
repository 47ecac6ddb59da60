//! Runs `mirrorflow replicate` as a child process against the world's clusters.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

/// How a replicator process joins its flow's source group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Membership {
    /// Named with `--replica`: a static member, as every pod is.
    Static,
    /// Unnamed: a new member at every start.
    Dynamic,
}

/// A replicator process; stopped with SIGTERM (then SIGKILL) when dropped.
pub struct Replicator {
    child: Option<Child>,
    pub log: PathBuf,
    pub metrics_addr: String,
}

/// The condition `type_` as the probe measures it now from the flow in `flow_file`
/// (`mirrorflow status --flow-file -o json`, the operator's rules without an operator).
pub fn measured_condition(
    repo_root: &Path,
    flow_file: &Path,
    type_: &str,
) -> Result<serde_json::Value> {
    measured_condition_with_secrets(repo_root, flow_file, None, type_)
}

/// [`measured_condition`] for a flow file that references Secrets, read from `secrets_dir`
/// (`<secret>/<key>` files).
pub fn measured_condition_with_secrets(
    repo_root: &Path,
    flow_file: &Path,
    secrets_dir: Option<&Path>,
    type_: &str,
) -> Result<serde_json::Value> {
    let mut status = Command::new(binary(repo_root));
    status.args(["status", "--flow-file"]).arg(flow_file);
    if let Some(dir) = secrets_dir {
        status.arg("--secrets-dir").arg(dir);
    }
    let out = status.args(["-o", "json"]).output()?;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "mirrorflow status: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .with_context(|| format!("no {type_} condition: {status}"))
}

/// Path of the `mirrorflow` binary cargo built for these tests.
pub fn binary(repo_root: &Path) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root.join("target"));
    target.join("debug/mirrorflow")
}

impl Replicator {
    /// Writes `flow_yaml` to a file and starts a replicator on it. `port` picks its metrics port
    /// on 127.0.0.1; `replica` names it.
    pub fn start(repo_root: &Path, name: &str, flow_yaml: &str, port: u16) -> Result<Replicator> {
        Replicator::start_as(repo_root, name, flow_yaml, port, Membership::Static)
    }

    /// [`Replicator::start`], choosing whether the replica is named (`--replica`: a static
    /// member of the source group, as in a pod) or not (dynamic membership).
    pub fn start_as(
        repo_root: &Path,
        name: &str,
        flow_yaml: &str,
        port: u16,
        membership: Membership,
    ) -> Result<Replicator> {
        Replicator::start_with_env(repo_root, name, flow_yaml, port, membership, &[])
    }

    /// [`Replicator::start_as`] with more environment variables (the debug build's test-only
    /// fault injections).
    pub fn start_with_env(
        repo_root: &Path,
        name: &str,
        flow_yaml: &str,
        port: u16,
        membership: Membership,
        env: &[(&str, &str)],
    ) -> Result<Replicator> {
        let dir = std::env::temp_dir().join("mirrorflow-e2e").join(name);
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("flow.yaml");
        std::fs::write(&config, flow_yaml)?;
        let log = dir.join("replicator.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let metrics_addr = format!("127.0.0.1:{port}");
        let child = Command::new(binary(repo_root))
            .args(["replicate", "--config"])
            .arg(&config)
            .args(["--listen", &metrics_addr])
            .args(match membership {
                Membership::Static => vec!["--replica", name],
                Membership::Dynamic => vec![],
            })
            .arg("--secrets-dir")
            .arg(dir.join("secrets"))
            .env("RUST_LOG", "info,mirrorflow=debug")
            .envs(env.iter().copied())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .spawn()
            .context(
                "starting mirrorflow replicate (is the binary built? cargo build -p mirrorflow)",
            )?;
        Ok(Replicator {
            child: Some(child),
            log,
            metrics_addr,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The replicator's log so far (for assertion messages).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait up to `grace` before SIGKILL. Returns the exit status code if any.
    pub fn stop(&mut self, grace: Duration) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + grace;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The process has not exited.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kills the process at once (a crash).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Fetches `/metrics` and returns the value of an unlabelled sample, if present.
    /// Waits (up to a minute) until the replicator answers `/readyz`; an error carries its log.
    pub async fn wait_ready(&self) -> Result<()> {
        let addr = self.metrics_addr.clone();
        crate::eventually("replicator ready", Duration::from_secs(60), || {
            let addr = addr.clone();
            async move { Ok(http_get(&addr, "/readyz").ok().map(|_| ())) }
        })
        .await
        .with_context(|| self.log_text())
    }

    pub fn metric(&self, name: &str) -> Option<f64> {
        let body = http_get(&self.metrics_addr, "/metrics").ok()?;
        body.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }

    /// Waits until topic discovery completed `rounds` more rounds than it had when called:
    /// what a test that checks that something did NOT happen waits for, instead of a time
    /// that a loaded machine may not give the replicator.
    pub async fn discovery_rounds(&self, rounds: u32, timeout: Duration) -> Result<()> {
        const NAME: &str = "mirrorflow_discovery_rounds_total";
        let start = self.metric(NAME).unwrap_or(0.0);
        crate::eventually(
            &format!("{rounds} more discovery rounds"),
            timeout,
            || async {
                Ok((self.metric(NAME).unwrap_or(0.0) >= start + f64::from(rounds)).then_some(()))
            },
        )
        .await
    }
}

impl Drop for Replicator {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// A minimal HTTP/1.1 GET for the replicator's own endpoints on loopback.
pub fn http_get(addr: &str, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200"),
        "GET {path}: {}",
        head.lines().next().unwrap_or("")
    );
    Ok(body.to_string())
}

/// A log line without its colour escapes (`ESC [ 3 m`), as the replicator writes to a file.
pub fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape sequence ends with its first letter.
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The number after ` name=` in a [`plain`] log line.
pub fn number_field(plain_line: &str, name: &str) -> Option<u32> {
    let at = plain_line.find(&format!(" {name}="))? + name.len() + 2;
    let digits: String = plain_line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}
