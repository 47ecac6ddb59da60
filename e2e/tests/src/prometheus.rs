//! A real Prometheus for tests, scraping what the chart's ServiceMonitor and PodMonitor select.
//!
//! The world has no Prometheus Operator, so the scrape configuration it would generate from
//! those two objects is written here, with the same rules: Kubernetes service discovery of the
//! selected namespaces, a keep rule per selector label and for the named port, the target
//! labels (`namespace`, `service`, `pod`, `container`, `endpoint`, `job`), the endpoint's
//! `honorLabels`, then the object's own `relabelings`. Only the fields the chart uses are
//! translated; an unknown field fails the test rather than being ignored.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value as Json, json};
use serde_yaml::Value;

use crate::fidelity::free_port;

/// A Prometheus process, stopped when dropped.
pub struct Prometheus {
    child: Child,
    pub addr: String,
    pub dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts `prometheus` (from the world's PATH) on a free loopback port with `scrape_configs`,
    /// scraping every `interval`, its data and log in `dir`.
    pub fn start(dir: &Path, scrape_configs: Vec<Json>, interval: &str) -> Result<Prometheus> {
        std::fs::create_dir_all(dir)?;
        let config = json!({
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": scrape_configs,
        });
        let config_path = dir.join("prometheus.yml");
        // JSON is YAML: Prometheus reads it as it is.
        std::fs::write(&config_path, serde_json::to_string_pretty(&config)?)?;
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting prometheus (built by e2e/world.sh tools)")?;
        let p = Prometheus {
            child,
            addr,
            dir: dir.to_path_buf(),
        };
        for _ in 0..120 {
            if http_get(&p.addr, "/-/ready").is_ok_and(|b| b.contains("Ready")) {
                return Ok(p);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        bail!("prometheus did not get ready: {}", p.log_tail())
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The result vector of an instant query.
    pub fn query(&self, promql: &str) -> Result<Vec<Json>> {
        let body = http_get(
            &self.addr,
            &format!("/api/v1/query?query={}", encode(promql)),
        )?;
        let answer: Json = serde_json::from_str(&body)
            .with_context(|| format!("the query API's answer: {body}"))?;
        if answer["status"] != "success" {
            bail!("query {promql}: {answer}");
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The scrape targets and their health, one line each.
    pub fn targets(&self) -> Result<Vec<String>> {
        let body = http_get(&self.addr, "/api/v1/targets")?;
        let answer: Json = serde_json::from_str(&body)?;
        Ok(answer["data"]["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                format!(
                    "{} {} {} {}",
                    t["labels"]["job"], t["scrapeUrl"], t["health"], t["lastError"]
                )
            })
            .collect())
    }
}

/// An HTTP/1.0 GET (the answer comes whole, never in chunks, however long).
fn http_get(addr: &str, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200 ") {
        bail!("GET {path}: {status}: {body}");
    }
    Ok(body.to_string())
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Kubernetes label names as service discovery's meta labels spell them.
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn str_of<'a>(v: &'a Value, key: &str) -> Result<&'a str> {
    v.get(key)
        .and_then(Value::as_str)
        .with_context(|| format!("{key} in {v:?}"))
}

/// Only the fields this translation knows: anything else the chart adds must be taught here.
fn known_fields(v: &Value, known: &[&str], what: &str) -> Result<()> {
    if let Some(map) = v.as_mapping() {
        for k in map.keys() {
            let k = k.as_str().unwrap_or_default();
            if !known.contains(&k) {
                bail!(
                    "{what}.{k} is not translated into a scrape config (e2e/tests/src/prometheus.rs)"
                );
            }
        }
    }
    Ok(())
}

/// The scrape configs a Prometheus Operator would generate for a ServiceMonitor or PodMonitor
/// (one per endpoint), discovering through `kubeconfig`.
pub fn scrape_configs(object: &Value, kubeconfig: &Path) -> Result<Vec<Json>> {
    let kind = str_of(object, "kind")?;
    let meta = object.get("metadata").context("metadata")?;
    let (name, ns) = (str_of(meta, "name")?, str_of(meta, "namespace")?);
    let spec = object.get("spec").context("spec")?;
    let (role, meta_kind, endpoints_key, short) = match kind {
        "ServiceMonitor" => ("endpoints", "service", "endpoints", "serviceMonitor"),
        "PodMonitor" => ("pod", "pod", "podMetricsEndpoints", "podMonitor"),
        other => bail!("not a monitor: {other}"),
    };
    known_fields(
        spec,
        &["selector", "namespaceSelector", endpoints_key],
        "spec",
    )?;
    let mut discovery = json!({"role": role, "kubeconfig_file": kubeconfig});
    let namespaces = spec.get("namespaceSelector").cloned().unwrap_or_default();
    known_fields(
        &namespaces,
        &["matchNames", "any"],
        "spec.namespaceSelector",
    )?;
    if namespaces.get("any").and_then(Value::as_bool) != Some(true) {
        let names: Vec<String> = match namespaces.get("matchNames") {
            Some(list) => serde_yaml::from_value(list.clone())?,
            None => vec![ns.to_string()],
        };
        discovery["namespaces"] = json!({"names": names});
    }
    let selector = spec.get("selector").context("spec.selector")?;
    known_fields(selector, &["matchLabels"], "spec.selector")?;
    let match_labels: std::collections::BTreeMap<String, String> =
        serde_yaml::from_value(selector.get("matchLabels").cloned().unwrap_or_default())?;
    let endpoints = spec
        .get(endpoints_key)
        .and_then(Value::as_sequence)
        .with_context(|| format!("spec.{endpoints_key}"))?;
    let mut out = Vec::new();
    for (i, ep) in endpoints.iter().enumerate() {
        known_fields(
            ep,
            &["port", "path", "interval", "honorLabels", "relabelings"],
            endpoints_key,
        )?;
        let port = str_of(ep, "port")?;
        let mut relabel = Vec::new();
        for (k, v) in &match_labels {
            let k = sanitize(k);
            relabel.push(json!({
                "action": "keep",
                "source_labels": [format!("__meta_kubernetes_{meta_kind}_label_{k}"),
                                  format!("__meta_kubernetes_{meta_kind}_labelpresent_{k}")],
                "regex": format!("({v});true"),
            }));
        }
        let port_label = if kind == "ServiceMonitor" {
            "__meta_kubernetes_endpoint_port_name"
        } else {
            "__meta_kubernetes_pod_container_port_name"
        };
        relabel.push(json!({"action": "keep", "source_labels": [port_label], "regex": port}));
        for (target, source) in [
            ("namespace", "__meta_kubernetes_namespace"),
            ("pod", "__meta_kubernetes_pod_name"),
            ("container", "__meta_kubernetes_pod_container_name"),
        ] {
            relabel.push(json!({"source_labels": [source], "target_label": target}));
        }
        if kind == "ServiceMonitor" {
            relabel.push(json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}));
            relabel.push(
                json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"}),
            );
        } else {
            relabel.push(json!({"target_label": "job", "replacement": format!("{ns}/{name}")}));
        }
        relabel.push(json!({"target_label": "endpoint", "replacement": port}));
        for r in ep
            .get("relabelings")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            known_fields(r, &["sourceLabels", "targetLabel"], "relabelings")?;
            let sources: Vec<String> =
                serde_yaml::from_value(r.get("sourceLabels").cloned().unwrap_or_default())?;
            relabel
                .push(json!({"source_labels": sources, "target_label": str_of(r, "targetLabel")?}));
        }
        out.push(json!({
            "job_name": format!("{short}/{ns}/{name}/{i}"),
            "honor_labels": ep.get("honorLabels").and_then(Value::as_bool).unwrap_or(false),
            "metrics_path": ep.get("path").and_then(Value::as_str).unwrap_or("/metrics"),
            "kubernetes_sd_configs": [discovery.clone()],
            "relabel_configs": relabel,
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_monitor_keeps_its_selector_port_and_relabelings() {
        let monitor: Value = serde_yaml::from_str(
            "kind: PodMonitor\nmetadata: {name: r, namespace: ops}\nspec:\n  selector: {matchLabels: {app.kubernetes.io/component: replicator}}\n  namespaceSelector: {any: true}\n  podMetricsEndpoints:\n    - port: metrics\n      relabelings: [{sourceLabels: [a], targetLabel: flow}]\n",
        )
        .unwrap();
        let c = scrape_configs(&monitor, Path::new("/k")).unwrap();
        assert_eq!(c.len(), 1);
        let text = c[0].to_string();
        assert!(text.contains("__meta_kubernetes_pod_label_app_kubernetes_io_component"));
        assert!(text.contains("\"(replicator);true\""));
        assert!(text.contains("\"target_label\":\"flow\""));
        assert!(c[0]["kubernetes_sd_configs"][0].get("namespaces").is_none());
        assert_eq!(c[0]["honor_labels"], false);
    }

    #[test]
    fn an_unknown_field_is_refused_not_ignored() {
        let monitor: Value = serde_yaml::from_str(
            "kind: ServiceMonitor\nmetadata: {name: o, namespace: ops}\nspec:\n  selector: {matchLabels: {a: b}}\n  endpoints: [{port: http, scheme: https}]\n",
        )
        .unwrap();
        assert!(scrape_configs(&monitor, Path::new("/k")).is_err());
    }
}
