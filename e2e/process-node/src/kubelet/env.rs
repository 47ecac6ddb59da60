//! A container's environment, as the kubelet builds it, and `$(VAR)` expansion.
//!
//! Everything here is pure: the ConfigMaps and Secrets a container refers to are fetched by
//! the caller (see [`referenced_sources`]) and handed in as [`Sources`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};

/// ConfigMaps and Secrets of the pod's namespace, by name; absent ones are missing.
#[derive(Default, Debug)]
pub struct Sources {
    pub config_maps: BTreeMap<String, ConfigMap>,
    pub secrets: BTreeMap<String, Secret>,
}

/// What the node tells every container.
#[derive(Clone, Debug)]
pub struct NodeFacts {
    pub node_name: String,
    pub host_ip: String,
    pub apiserver_host: String,
    pub apiserver_port: u16,
    /// Allocatable cpu cores and memory bytes: what resourceFieldRef reports without limits.
    pub cpu_cores: f64,
    pub memory_bytes: f64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvError {
    #[error("configmap {0:?} not found")]
    ConfigMapMissing(String),
    #[error("key {key:?} not found in configmap {name:?}")]
    ConfigMapKeyMissing { name: String, key: String },
    #[error("secret {0:?} not found")]
    SecretMissing(String),
    #[error("key {key:?} not found in secret {name:?}")]
    SecretKeyMissing { name: String, key: String },
    #[error("unsupported fieldPath {0:?}")]
    FieldPath(String),
    #[error("unsupported resource {0:?}")]
    Resource(String),
    #[error(
        "unsupported env source for {0:?} (only value, fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef)"
    )]
    Source(String),
}

impl EnvError {
    /// The container waiting reason the kubelet uses for a bad environment.
    pub const REASON: &'static str = "CreateContainerConfigError";
}

/// Names of the ConfigMaps and Secrets the container's env refers to.
pub fn referenced_sources(c: &Container) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    for e in c.env.iter().flatten() {
        if let Some(vf) = &e.value_from {
            if let Some(r) = &vf.config_map_key_ref {
                cms.push(r.name.clone());
            }
            if let Some(r) = &vf.secret_key_ref {
                secrets.push(r.name.clone());
            }
        }
    }
    for ef in c.env_from.iter().flatten() {
        if let Some(r) = &ef.config_map_ref {
            cms.push(r.name.clone());
        }
        if let Some(r) = &ef.secret_ref {
            secrets.push(r.name.clone());
        }
    }
    cms.sort();
    cms.dedup();
    secrets.sort();
    secrets.dedup();
    (cms, secrets)
}

fn config_map_value(cm: &ConfigMap, key: &str) -> Option<String> {
    if let Some(v) = cm.data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.clone());
    }
    cm.binary_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
}

fn config_map_entries(cm: &ConfigMap) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = cm.data.clone().unwrap_or_default().into_iter().collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.push((k.clone(), String::from_utf8_lossy(&v.0).into_owned()));
    }
    out
}

fn secret_entries(s: &Secret) -> Vec<(String, String)> {
    let mut out: BTreeMap<String, String> = s
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    for (k, v) in s.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone());
    }
    out.into_iter().collect()
}

/// The value of a downward-API `fieldPath` for env vars (`as_file` = false) or volume files.
pub fn field_value(
    pod: &Pod,
    pod_ip: &str,
    node: &NodeFacts,
    path: &str,
    as_file: bool,
) -> Result<String, EnvError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let map_entry = |m: &Option<BTreeMap<String, String>>, key: &str| {
        m.as_ref()
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or_default()
    };
    let quoted_lines = |m: &Option<BTreeMap<String, String>>| {
        m.iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}\n", go_quote(v)))
            .collect::<String>()
    };
    let v = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" if as_file => quoted_lines(&meta.labels),
        "metadata.annotations" if as_file => quoted_lines(&meta.annotations),
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| node.node_name.clone()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".to_string()),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => node.host_ip.clone(),
        p => {
            if let Some(key) = bracket_key(p, "metadata.labels") {
                map_entry(&meta.labels, &key)
            } else if let Some(key) = bracket_key(p, "metadata.annotations") {
                map_entry(&meta.annotations, &key)
            } else {
                return Err(EnvError::FieldPath(p.to_string()));
            }
        }
    };
    Ok(v)
}

/// `metadata.labels['app']` -> `app`.
fn bracket_key(path: &str, prefix: &str) -> Option<String> {
    let rest = path
        .strip_prefix(prefix)?
        .strip_prefix('[')?
        .strip_suffix(']')?;
    let key = rest
        .strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .or_else(|| rest.strip_prefix('"').and_then(|r| r.strip_suffix('"')))?;
    Some(key.to_string())
}

/// Go's `%q` for the characters that matter in labels and annotations.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A Kubernetes quantity as a float (`500m` -> 0.5, `1Gi` -> 1073741824).
pub fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "u" => 1e-6,
        "n" => 1e-9,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        s => {
            let exp: i32 = s.strip_prefix(['e', 'E'])?.parse().ok()?;
            10f64.powi(exp)
        }
    };
    Some(n * mult)
}

/// `resourceFieldRef`: `limits.cpu`, `requests.memory`, ... of `container`, divided by
/// `divisor` and rounded up, like the kubelet. Without a limit, the node's allocatable.
pub fn resource_value(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
    node: &NodeFacts,
) -> Result<String, EnvError> {
    let res = container.resources.as_ref();
    let get = |which: &str, name: &str| {
        let m = match which {
            "limits" => res.and_then(|r| r.limits.as_ref()),
            _ => res.and_then(|r| r.requests.as_ref()),
        };
        m.and_then(|m| m.get(name))
            .and_then(|q| parse_quantity(&q.0))
    };
    let (which, name) = resource
        .split_once('.')
        .ok_or_else(|| EnvError::Resource(resource.to_string()))?;
    let node_value = match name {
        "cpu" => node.cpu_cores,
        "memory" => node.memory_bytes,
        "ephemeral-storage" => 0.0,
        _ => return Err(EnvError::Resource(resource.to_string())),
    };
    let value = match which {
        "limits" => get("limits", name).unwrap_or(node_value),
        "requests" => get("requests", name)
            .or_else(|| get("limits", name))
            .unwrap_or(0.0),
        _ => return Err(EnvError::Resource(resource.to_string())),
    };
    let divisor = divisor
        .and_then(parse_quantity)
        .filter(|d| *d > 0.0)
        .unwrap_or(1.0);
    // A tiny epsilon so 0.5/0.001 does not round up to 501.
    Ok(format!(
        "{}",
        ((value / divisor) - 1e-9).ceil().max(0.0) as i64
    ))
}

/// The full environment of `container`, in Kubernetes order: envFrom, then env (each
/// value expanded against what came before), then the node's own variables where the pod
/// did not set them.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    pod_ip: &str,
    node: &NodeFacts,
    sources: &Sources,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
        if let Some(slot) = env.iter_mut().find(|(n, _)| *n == k) {
            slot.1 = v;
        } else {
            env.push((k, v));
        }
    };
    let service_env = [
        (
            "KUBERNETES_SERVICE_HOST".to_string(),
            node.apiserver_host.clone(),
        ),
        (
            "KUBERNETES_SERVICE_PORT".to_string(),
            node.apiserver_port.to_string(),
        ),
        (
            "KUBERNETES_SERVICE_PORT_HTTPS".to_string(),
            node.apiserver_port.to_string(),
        ),
        (
            "KUBERNETES_PORT".to_string(),
            format!("tcp://{}:{}", node.apiserver_host, node.apiserver_port),
        ),
    ];
    for ef in container.env_from.iter().flatten() {
        let prefix = ef.prefix.clone().unwrap_or_default();
        if let Some(r) = &ef.config_map_ref {
            match sources.config_maps.get(&r.name) {
                Some(cm) => {
                    for (k, v) in config_map_entries(cm) {
                        set(&mut env, format!("{prefix}{k}"), v);
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(EnvError::ConfigMapMissing(r.name.clone())),
            }
        }
        if let Some(r) = &ef.secret_ref {
            match sources.secrets.get(&r.name) {
                Some(s) => {
                    for (k, v) in secret_entries(s) {
                        set(&mut env, format!("{prefix}{k}"), v);
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(EnvError::SecretMissing(r.name.clone())),
            }
        }
    }
    for e in container.env.iter().flatten() {
        let value = match &e.value_from {
            None => {
                let raw = e.value.clone().unwrap_or_default();
                let lookup = |name: &str| {
                    env.iter()
                        .chain(service_env.iter())
                        .rev()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.clone())
                };
                Some(expand(&raw, lookup))
            }
            Some(vf) => {
                if let Some(f) = &vf.field_ref {
                    Some(field_value(pod, pod_ip, node, &f.field_path, false)?)
                } else if let Some(r) = &vf.resource_field_ref {
                    let target = match r.container_name.as_deref() {
                        Some(n) if !n.is_empty() && n != container.name => pod
                            .spec
                            .as_ref()
                            .and_then(|s| s.containers.iter().find(|c| c.name == n))
                            .unwrap_or(container),
                        _ => container,
                    };
                    let divisor = r.divisor.as_ref().map(|d| d.0.as_str());
                    Some(resource_value(target, &r.resource, divisor, node)?)
                } else if let Some(r) = &vf.config_map_key_ref {
                    match sources.config_maps.get(&r.name) {
                        Some(cm) => match config_map_value(cm, &r.key) {
                            Some(v) => Some(v),
                            None if r.optional == Some(true) => None,
                            None => {
                                return Err(EnvError::ConfigMapKeyMissing {
                                    name: r.name.clone(),
                                    key: r.key.clone(),
                                });
                            }
                        },
                        None if r.optional == Some(true) => None,
                        None => return Err(EnvError::ConfigMapMissing(r.name.clone())),
                    }
                } else if let Some(r) = &vf.secret_key_ref {
                    match sources.secrets.get(&r.name) {
                        Some(s) => match secret_entries(s).into_iter().find(|(k, _)| *k == r.key) {
                            Some((_, v)) => Some(v),
                            None if r.optional == Some(true) => None,
                            None => {
                                return Err(EnvError::SecretKeyMissing {
                                    name: r.name.clone(),
                                    key: r.key.clone(),
                                });
                            }
                        },
                        None if r.optional == Some(true) => None,
                        None => return Err(EnvError::SecretMissing(r.name.clone())),
                    }
                } else {
                    return Err(EnvError::Source(e.name.clone()));
                }
            }
        };
        if let Some(v) = value {
            set(&mut env, e.name.clone(), v);
        }
    }
    for (k, v) in service_env {
        if !env.iter().any(|(n, _)| *n == k) {
            env.push((k, v));
        }
    }
    let defaults = [
        ("HOSTNAME", pod.metadata.name.clone().unwrap_or_default()),
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        ),
    ];
    for (k, v) in defaults {
        if !env.iter().any(|(n, _)| n == k) {
            env.push((k.to_string(), v));
        }
    }
    Ok(env)
}

/// Kubernetes' `$(VAR)` expansion: `$(VAR)` becomes VAR's value when it is known and stays
/// as written otherwise; `$$` is an escaped `$`.
pub fn expand(input: &str, mut lookup: impl FnMut(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest[1..].find(')') {
                    Some(end) => {
                        let name = &rest[1..1 + end];
                        match lookup(name) {
                            Some(v) => out.push_str(&v),
                            None => {
                                out.push_str("$(");
                                out.push_str(name);
                                out.push(')');
                            }
                        }
                        end + 2
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    // `$x`: no variable; keep both characters.
                    out.push('$');
                    0
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    if checkpoint < input.len() {
        out.push_str(&input[checkpoint..]);
    }
    out
}

/// Expands `$(VAR)` in a command or argument list against the final environment.
pub fn expand_all(items: &[String], env: &[(String, String)]) -> Vec<String> {
    items
        .iter()
        .map(|s| {
            expand(s, |name| {
                env.iter()
                    .rev()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar, EnvVarSource,
        ObjectFieldSelector, PodSpec, ResourceFieldSelector, ResourceRequirements,
        SecretKeySelector,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node() -> NodeFacts {
        NodeFacts {
            node_name: "n1".into(),
            host_ip: "127.0.0.1".into(),
            apiserver_host: "127.0.0.1".into(),
            apiserver_port: 16443,
            cpu_cores: 2.0,
            memory_bytes: 1024.0 * 1024.0 * 1024.0,
        }
    }

    fn vars(m: &[(&str, &str)]) -> impl FnMut(&str) -> Option<String> {
        let m: Vec<(String, String)> = m
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        move |n| m.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let v = &[("A", "x"), ("B", "y")];
        assert_eq!(expand("$(A)", vars(v)), "x");
        assert_eq!(expand("a$(A)b$(B)c", vars(v)), "axbyc");
        assert_eq!(expand("$(C)", vars(v)), "$(C)");
        assert_eq!(expand("$$(A)", vars(v)), "$(A)");
        assert_eq!(expand("$$$(A)", vars(v)), "$x");
        assert_eq!(expand("$(A", vars(v)), "$(A");
        assert_eq!(expand("$A", vars(v)), "$A");
        assert_eq!(expand("end$", vars(v)), "end$");
        assert_eq!(expand("", vars(v)), "");
        assert_eq!(expand("héllo $(A) wörld", vars(v)), "héllo x wörld");
    }

    fn pod(container: Container) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u-1".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![container],
                node_name: Some("n1".into()),
                service_account_name: Some("sa".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn field(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    api_version: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn plain(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..Default::default()
        }
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn env_resolves_fields_refs_and_expansion() {
        let c = Container {
            name: "c".into(),
            env: Some(vec![
                field("POD", "metadata.name"),
                field("NS", "metadata.namespace"),
                field("IP", "status.podIP"),
                field("APP", "metadata.labels['app']"),
                field("SA", "spec.serviceAccountName"),
                plain("URL", "http://$(IP):80/$(NS)/$(MISSING)"),
                EnvVar {
                    name: "K".into(),
                    value_from: Some(EnvVarSource {
                        config_map_key_ref: Some(ConfigMapKeySelector {
                            name: "cm".into(),
                            key: "k".into(),
                            optional: None,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                EnvVar {
                    name: "OPT".into(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "nope".into(),
                            key: "k".into(),
                            optional: Some(true),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                EnvVar {
                    name: "MEM".into(),
                    value_from: Some(EnvVarSource {
                        resource_field_ref: Some(ResourceFieldSelector {
                            resource: "limits.memory".into(),
                            divisor: Some(Quantity("1Mi".into())),
                            container_name: None,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
            env_from: Some(vec![EnvFromSource {
                prefix: Some("P_".into()),
                config_map_ref: Some(ConfigMapEnvSource {
                    name: "cm".into(),
                    optional: None,
                }),
                secret_ref: None,
            }]),
            resources: Some(ResourceRequirements {
                limits: Some([("memory".to_string(), Quantity("256Mi".into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut sources = Sources::default();
        sources.config_maps.insert(
            "cm".into(),
            ConfigMap {
                data: Some([("k".to_string(), "v".to_string())].into()),
                ..Default::default()
            },
        );
        let p = pod(c.clone());
        let env =
            container_env(&p, &c, "127.0.1.5", &node(), &sources).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(get(&env, "POD"), Some("p"));
        assert_eq!(get(&env, "NS"), Some("ns"));
        assert_eq!(get(&env, "IP"), Some("127.0.1.5"));
        assert_eq!(get(&env, "APP"), Some("web"));
        assert_eq!(get(&env, "SA"), Some("sa"));
        assert_eq!(get(&env, "URL"), Some("http://127.0.1.5:80/ns/$(MISSING)"));
        assert_eq!(get(&env, "K"), Some("v"));
        assert_eq!(get(&env, "P_k"), Some("v"));
        assert_eq!(get(&env, "OPT"), None);
        assert_eq!(get(&env, "MEM"), Some("256"));
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("127.0.0.1"));
        assert_eq!(get(&env, "KUBERNETES_SERVICE_PORT"), Some("16443"));
        assert_eq!(get(&env, "HOSTNAME"), Some("p"));

        let missing = Sources::default();
        assert_eq!(
            container_env(&p, &c, "127.0.1.5", &node(), &missing),
            Err(EnvError::ConfigMapMissing("cm".into()))
        );
        assert_eq!(
            referenced_sources(&c),
            (vec!["cm".to_string()], vec!["nope".to_string()])
        );
    }

    #[test]
    fn quantities_and_resources() {
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("2"), Some(2.0));
        assert_eq!(parse_quantity("1Gi"), Some(1073741824.0));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("x"), None);
        let c = Container {
            resources: Some(ResourceRequirements {
                limits: Some([("cpu".to_string(), Quantity("500m".into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            resource_value(&c, "limits.cpu", None, &node()),
            Ok("1".into())
        );
        assert_eq!(
            resource_value(&c, "limits.cpu", Some("1m"), &node()),
            Ok("500".into())
        );
        assert_eq!(
            resource_value(&c, "requests.cpu", Some("1m"), &node()),
            Ok("500".into())
        );
        assert_eq!(
            resource_value(&c, "limits.memory", None, &node()),
            Ok("1073741824".into())
        );
        assert!(resource_value(&c, "limits.gpu", None, &node()).is_err());
    }

    #[test]
    fn downward_file_formats() {
        let p = pod(Container::default());
        assert_eq!(
            field_value(&p, "", &node(), "metadata.labels", true),
            Ok("app=\"web\"\n".to_string())
        );
        assert!(field_value(&p, "", &node(), "metadata.labels", false).is_err());
        assert_eq!(
            field_value(&p, "", &node(), "metadata.uid", false),
            Ok("u-1".into())
        );
        assert_eq!(
            bracket_key("metadata.annotations[\"a/b\"]", "metadata.annotations"),
            Some("a/b".into())
        );
    }
}
