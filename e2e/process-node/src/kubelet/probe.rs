//! Probes: httpGet, tcpSocket and exec, run from a task per container run.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::podinit;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Startup,
    Readiness,
    Liveness,
}

/// How an exec probe runs: like the container (same env and mounts).
#[derive(Clone, Debug)]
pub struct ExecCtx {
    pub env: Vec<(String, String)>,
    pub spec: podinit::Spec,
}

/// A probe result sent to the pod worker, tagged with the container run it belongs to.
#[derive(Debug)]
pub struct Outcome {
    pub container: usize,
    pub run: u64,
    pub kind: Kind,
    pub ok: bool,
    pub message: String,
}

/// Consecutive-result bookkeeping with success/failure thresholds.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    successes: i32,
    failures: i32,
}

impl Tracker {
    /// Records one result; returns the probe's verdict once a threshold is reached.
    pub fn record(&mut self, ok: bool, probe: &Probe) -> Option<bool> {
        if ok {
            self.failures = 0;
            self.successes += 1;
            (self.successes >= probe.success_threshold.unwrap_or(1).max(1)).then_some(true)
        } else {
            self.successes = 0;
            self.failures += 1;
            (self.failures >= probe.failure_threshold.unwrap_or(3).max(1)).then_some(false)
        }
    }
}

/// A named or numbered container port.
pub fn resolve_port(port: &IntOrString, container: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(s) => match s.parse::<u16>() {
            Ok(n) => Some(n),
            Err(_) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(s.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok()),
        },
    }
}

/// `HTTP/1.1 200 OK` -> 200.
pub fn status_code(first_line: &str) -> Option<u16> {
    let mut parts = first_line.split_whitespace();
    let version = parts.next()?;
    if !version.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<(), String> {
    let mut stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("connect {host}:{port}: {e}"))?;
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.36\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while !buf.contains(&b'\n') && buf.len() < 4096 {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf);
    let line = text.lines().next().unwrap_or_default();
    match status_code(line) {
        Some(code) if (200..400).contains(&code) => Ok(()),
        Some(code) => Err(format!("HTTP probe failed with statuscode: {code}")),
        None => Err(format!("bad HTTP response {line:?}")),
    }
}

async fn exec(ctx: &ExecCtx, command: &[String]) -> Result<(), String> {
    let Some((program, args)) = command.split_first() else {
        return Err("exec probe without command".into());
    };
    let spec = podinit::Spec {
        program: program.clone(),
        args: args.to_vec(),
        ..ctx.spec.clone()
    };
    let log = ctx.spec.fallback_dir.join(".probe-exec.log");
    let mut child =
        super::process::spawn(&spec, &ctx.env, &log).map_err(|e| format!("exec probe: {e}"))?;
    let status = child.wait().await.map_err(|e| format!("exec probe: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("exec probe exited with {status}"))
    }
}

/// One probe attempt, bounded by timeoutSeconds.
pub async fn probe_once(
    probe: &Probe,
    pod_ip: &str,
    container: &Container,
    exec_ctx: &ExecCtx,
) -> Result<(), String> {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let attempt = async {
        if let Some(h) = &probe.http_get {
            if h.scheme
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case("https"))
            {
                return Err("HTTPS probes are not supported by the process node".to_string());
            }
            let port = resolve_port(&h.port, container)
                .ok_or_else(|| format!("unknown port {:?}", h.port))?;
            let host = h
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| pod_ip.to_string());
            let headers: Vec<(String, String)> = h
                .http_headers
                .iter()
                .flatten()
                .map(|x| (x.name.clone(), x.value.clone()))
                .collect();
            http_get(&host, port, h.path.as_deref().unwrap_or("/"), &headers).await
        } else if let Some(t) = &probe.tcp_socket {
            let port = resolve_port(&t.port, container)
                .ok_or_else(|| format!("unknown port {:?}", t.port))?;
            let host = t
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| pod_ip.to_string());
            TcpStream::connect((host.as_str(), port))
                .await
                .map(|_| ())
                .map_err(|e| format!("connect {host}:{port}: {e}"))
        } else if let Some(e) = &probe.exec {
            exec(exec_ctx, e.command.as_deref().unwrap_or_default()).await
        } else {
            Err("probe has no httpGet, tcpSocket or exec handler (grpc is not supported)".into())
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(format!("probe timed out after {}s", timeout.as_secs())),
    }
}

/// Probes forever (until aborted) at the probe's period, after its initial delay.
pub struct Runner {
    pub kind: Kind,
    pub probe: Probe,
    pub container: Container,
    pub index: usize,
    pub run: u64,
    pub pod_ip: String,
    pub exec: ExecCtx,
}

impl Runner {
    pub fn spawn(self, tx: mpsc::UnboundedSender<Outcome>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let delay = self.probe.initial_delay_seconds.unwrap_or(0).max(0) as u64;
            tokio::time::sleep(Duration::from_secs(delay)).await;
            let period = Duration::from_secs(self.probe.period_seconds.unwrap_or(10).max(1) as u64);
            loop {
                let result =
                    probe_once(&self.probe, &self.pod_ip, &self.container, &self.exec).await;
                let outcome = Outcome {
                    container: self.index,
                    run: self.run,
                    kind: self.kind,
                    ok: result.is_ok(),
                    message: result.err().unwrap_or_default(),
                };
                if tx.send(outcome).is_err() {
                    return;
                }
                tokio::time::sleep(period).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction};

    #[test]
    fn ports_and_status_lines() {
        let c = Container {
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Some(80));
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c),
            Some(8080)
        );
        assert_eq!(resolve_port(&IntOrString::String("nope".into()), &c), None);
        assert_eq!(status_code("HTTP/1.1 204 No Content"), Some(204));
        assert_eq!(status_code("garbage"), None);
    }

    #[test]
    fn thresholds() {
        let p = Probe {
            success_threshold: Some(2),
            failure_threshold: Some(2),
            ..Default::default()
        };
        let mut t = Tracker::default();
        assert_eq!(t.record(true, &p), None);
        assert_eq!(t.record(true, &p), Some(true));
        assert_eq!(t.record(false, &p), None);
        assert_eq!(t.record(false, &p), Some(false));
        assert_eq!(t.record(true, &p), None);
    }

    #[tokio::test]
    async fn http_probe_against_a_local_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        let server = tokio::spawn(async move {
            for code in ["200 OK", "503 Service Unavailable"] {
                if let Ok((mut s, _)) = listener.accept().await {
                    let mut buf = [0u8; 1024];
                    let _ = s.read(&mut buf).await;
                    let _ = s
                        .write_all(
                            format!("HTTP/1.1 {code}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
                        )
                        .await;
                }
            }
        });
        let probe = Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/ready".into()),
                port: IntOrString::Int(i32::from(port)),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ctx = ExecCtx {
            env: Vec::new(),
            spec: podinit::Spec {
                mounts: Vec::new(),
                program: String::new(),
                args: Vec::new(),
                working_dir: None,
                fallback_dir: std::env::temp_dir(),
            },
        };
        let c = Container::default();
        assert_eq!(probe_once(&probe, "127.0.0.1", &c, &ctx).await, Ok(()));
        assert!(probe_once(&probe, "127.0.0.1", &c, &ctx).await.is_err());
        let _ = server.await;
        // Nothing listens any more: connection refused is a failure.
        assert!(probe_once(&probe, "127.0.0.1", &c, &ctx).await.is_err());
    }
}
