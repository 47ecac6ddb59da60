//! Volumes, materialised as directories under the pod dir (`volumes/<name>/`).
//!
//! Files are written to a temporary name and renamed into place, so a re-run (the pod
//! worker refreshes volumes periodically: ConfigMap edits and token rotation) is seen
//! atomically through the containers' bind mounts.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccount, Volume,
};
use kube::api::PostParams;
use kube::{Api, Client};

use super::env::{NodeFacts, field_value, resource_value};

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume {volume:?}: {kind} volumes are not supported by the process node")]
    Unsupported { volume: String, kind: String },
    #[error("volume {volume:?}: configmap {name:?} not found")]
    ConfigMapMissing { volume: String, name: String },
    #[error("volume {volume:?}: secret {name:?} not found")]
    SecretMissing { volume: String, name: String },
    #[error("volume {volume:?}: key {key:?} not found")]
    KeyMissing { volume: String, key: String },
    #[error("volume {volume:?}: bad path {path:?}")]
    BadPath { volume: String, path: String },
    #[error("volume {volume:?}: {message}")]
    Downward { volume: String, message: String },
    #[error("volume {volume:?}: api call failed")]
    Api {
        volume: String,
        #[source]
        source: kube::Error,
    },
    #[error("volume {volume:?}: cannot write {path}")]
    Io {
        volume: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl VolumeError {
    /// The container waiting reason while volumes cannot be set up (as the kubelet shows).
    pub const REASON: &'static str = "ContainerCreating";
}

/// One file to be written into a volume directory.
struct File {
    path: String,
    data: Vec<u8>,
    mode: u32,
}

/// What a pod's volumes need from the outside world.
pub struct Ctx<'a> {
    pub client: &'a Client,
    pub pod: &'a Pod,
    pub pod_ip: &'a str,
    pub node: &'a NodeFacts,
}

impl Ctx<'_> {
    fn namespace(&self) -> String {
        self.pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into())
    }
}

/// Materialises every volume of the pod; returns volume name -> host path.
pub async fn materialise(
    ctx: &Ctx<'_>,
    pod_dir: &Path,
) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
    let mut out = BTreeMap::new();
    let volumes = ctx
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    for v in &volumes {
        let dir = pod_dir.join("volumes").join(&v.name);
        let path = materialise_one(ctx, v, &dir).await?;
        out.insert(v.name.clone(), path);
    }
    Ok(out)
}

async fn materialise_one(ctx: &Ctx<'_>, v: &Volume, dir: &Path) -> Result<PathBuf, VolumeError> {
    let name = v.name.as_str();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| VolumeError::Io {
            volume: name.to_string(),
            path,
            source,
        }
    };
    if let Some(hp) = &v.host_path {
        let p = PathBuf::from(&hp.path);
        if matches!(hp.type_.as_deref(), Some("DirectoryOrCreate")) {
            std::fs::create_dir_all(&p).map_err(io(&p))?;
        }
        return Ok(p);
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    if v.empty_dir.is_some() {
        return Ok(dir.to_path_buf());
    }
    let files = if let Some(cm) = &v.config_map {
        let default_mode = cm.default_mode.unwrap_or(0o644);
        config_map_files(
            ctx,
            name,
            &cm.name,
            cm.items.as_deref(),
            cm.optional,
            default_mode,
        )
        .await?
    } else if let Some(s) = &v.secret {
        let default_mode = s.default_mode.unwrap_or(0o644);
        let secret_name = s.secret_name.clone().unwrap_or_default();
        secret_files(
            ctx,
            name,
            &secret_name,
            s.items.as_deref(),
            s.optional,
            default_mode,
        )
        .await?
    } else if let Some(d) = &v.downward_api {
        let default_mode = d.default_mode.unwrap_or(0o644);
        downward_files(
            ctx,
            name,
            d.items.as_deref().unwrap_or_default(),
            default_mode,
        )?
    } else if let Some(p) = &v.projected {
        let default_mode = p.default_mode.unwrap_or(0o644);
        let mut files = Vec::new();
        for src in p.sources.iter().flatten() {
            if let Some(t) = &src.service_account_token {
                let token =
                    request_token(ctx, name, t.audience.as_deref(), t.expiration_seconds).await?;
                files.push(File {
                    path: t.path.clone(),
                    data: token.into_bytes(),
                    mode: default_mode as u32,
                });
            } else if let Some(cm) = &src.config_map {
                files.extend(
                    config_map_files(
                        ctx,
                        name,
                        &cm.name,
                        cm.items.as_deref(),
                        cm.optional,
                        default_mode,
                    )
                    .await?,
                );
            } else if let Some(s) = &src.secret {
                files.extend(
                    secret_files(
                        ctx,
                        name,
                        &s.name,
                        s.items.as_deref(),
                        s.optional,
                        default_mode,
                    )
                    .await?,
                );
            } else if let Some(d) = &src.downward_api {
                files.extend(downward_files(
                    ctx,
                    name,
                    d.items.as_deref().unwrap_or_default(),
                    default_mode,
                )?);
            } else {
                return Err(VolumeError::Unsupported {
                    volume: name.to_string(),
                    kind: "this projected source (clusterTrustBundle/podCertificate)".into(),
                });
            }
        }
        files
    } else {
        return Err(VolumeError::Unsupported {
            volume: name.to_string(),
            kind: volume_kind(v),
        });
    };
    write_files(name, dir, &files)?;
    Ok(dir.to_path_buf())
}

/// The volume's source kind as named in the pod spec, for messages.
fn volume_kind(v: &Volume) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|j| {
            j.as_object()
                .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn select(
    volume: &str,
    entries: BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    optional: bool,
    default_mode: i32,
) -> Result<Vec<File>, VolumeError> {
    match items {
        None => Ok(entries
            .into_iter()
            .map(|(k, data)| File {
                path: k,
                data,
                mode: default_mode as u32,
            })
            .collect()),
        Some(items) => {
            let mut out = Vec::new();
            for it in items {
                match entries.get(&it.key) {
                    Some(data) => out.push(File {
                        path: it.path.clone(),
                        data: data.clone(),
                        mode: it.mode.unwrap_or(default_mode) as u32,
                    }),
                    None if optional => {}
                    None => {
                        return Err(VolumeError::KeyMissing {
                            volume: volume.to_string(),
                            key: it.key.clone(),
                        });
                    }
                }
            }
            Ok(out)
        }
    }
}

async fn config_map_files(
    ctx: &Ctx<'_>,
    volume: &str,
    cm_name: &str,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    default_mode: i32,
) -> Result<Vec<File>, VolumeError> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace());
    let cm = api
        .get_opt(cm_name)
        .await
        .map_err(|source| VolumeError::Api {
            volume: volume.to_string(),
            source,
        })?;
    let optional = optional == Some(true);
    let Some(cm) = cm else {
        if optional {
            return Ok(Vec::new());
        }
        return Err(VolumeError::ConfigMapMissing {
            volume: volume.to_string(),
            name: cm_name.to_string(),
        });
    };
    let mut entries: BTreeMap<String, Vec<u8>> = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.unwrap_or_default() {
        entries.insert(k, v.0);
    }
    select(volume, entries, items, optional, default_mode)
}

async fn secret_files(
    ctx: &Ctx<'_>,
    volume: &str,
    secret_name: &str,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    default_mode: i32,
) -> Result<Vec<File>, VolumeError> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace());
    let s = api
        .get_opt(secret_name)
        .await
        .map_err(|source| VolumeError::Api {
            volume: volume.to_string(),
            source,
        })?;
    let optional = optional == Some(true);
    let Some(s) = s else {
        if optional {
            return Ok(Vec::new());
        }
        return Err(VolumeError::SecretMissing {
            volume: volume.to_string(),
            name: secret_name.to_string(),
        });
    };
    let mut entries: BTreeMap<String, Vec<u8>> = s
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for (k, v) in s.string_data.unwrap_or_default() {
        entries.insert(k, v.into_bytes());
    }
    select(volume, entries, items, optional, default_mode)
}

fn downward_files(
    ctx: &Ctx<'_>,
    volume: &str,
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
) -> Result<Vec<File>, VolumeError> {
    let err = |message: String| VolumeError::Downward {
        volume: volume.to_string(),
        message,
    };
    let mut out = Vec::new();
    for it in items {
        let value = if let Some(f) = &it.field_ref {
            field_value(ctx.pod, ctx.pod_ip, ctx.node, &f.field_path, true)
                .map_err(|e| err(e.to_string()))?
        } else if let Some(r) = &it.resource_field_ref {
            let containers = ctx
                .pod
                .spec
                .as_ref()
                .map(|s| s.containers.as_slice())
                .unwrap_or_default();
            let c = containers
                .iter()
                .find(|c| Some(c.name.as_str()) == r.container_name.as_deref())
                .or(containers.first())
                .ok_or_else(|| err("pod has no containers".into()))?;
            let divisor = r.divisor.as_ref().map(|d| d.0.as_str());
            resource_value(c, &r.resource, divisor, ctx.node).map_err(|e| err(e.to_string()))?
        } else {
            return Err(err(format!(
                "item {:?} has neither fieldRef nor resourceFieldRef",
                it.path
            )));
        };
        out.push(File {
            path: it.path.clone(),
            data: value.into_bytes(),
            mode: it.mode.unwrap_or(default_mode) as u32,
        });
    }
    Ok(out)
}

/// A bound service-account token, as the kubelet requests it for projected volumes.
async fn request_token(
    ctx: &Ctx<'_>,
    volume: &str,
    audience: Option<&str>,
    expiration_seconds: Option<i64>,
) -> Result<String, VolumeError> {
    let sa = ctx
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &ctx.namespace());
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: audience.map(|a| vec![a.to_string()]),
            expiration_seconds: Some(expiration_seconds.unwrap_or(3607)),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: ctx.pod.metadata.name.clone(),
                uid: ctx.pod.metadata.uid.clone(),
            }),
        }),
        ..Default::default()
    };
    let resp: TokenRequest = api
        .create_subresource("token", &sa, &PostParams::default(), &req)
        .await
        .map_err(|source| VolumeError::Api {
            volume: volume.to_string(),
            source,
        })?;
    Ok(resp.status.and_then(|s| s.token).unwrap_or_default())
}

/// A relative path inside a volume: no `..`, not absolute, not empty.
fn safe_relative(path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    let ok = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    ok.then(|| p.to_path_buf())
}

fn write_files(volume: &str, dir: &Path, files: &[File]) -> Result<(), VolumeError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| VolumeError::Io {
            volume: volume.to_string(),
            path,
            source,
        }
    };
    let mut written = BTreeSet::new();
    for f in files {
        let rel = safe_relative(&f.path).ok_or_else(|| VolumeError::BadPath {
            volume: volume.to_string(),
            path: f.path.clone(),
        })?;
        let target = dir.join(&rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let tmp = target.with_file_name(format!(
            ".{}.tmp",
            rel.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        std::fs::write(&tmp, &f.data).map_err(io(&tmp))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(f.mode & 0o7777))
            .map_err(io(&tmp))?;
        std::fs::rename(&tmp, &target).map_err(io(&target))?;
        if let Some(Component::Normal(first)) = rel.components().next() {
            written.insert(first.to_os_string());
        }
    }
    // Keys removed from the source disappear (top level only).
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if !written.contains(&e.file_name()) && e.path().is_file() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_confined() {
        assert!(safe_relative("token").is_some());
        assert!(safe_relative("a/b").is_some());
        assert!(safe_relative("../x").is_none());
        assert!(safe_relative("/etc/x").is_none());
        assert!(safe_relative("").is_none());
    }

    #[test]
    fn items_select_keys_and_modes() {
        let entries: BTreeMap<String, Vec<u8>> = [
            ("a".to_string(), b"1".to_vec()),
            ("b".to_string(), b"2".to_vec()),
        ]
        .into();
        let all =
            select("v", entries.clone(), None, false, 0o600).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].mode, 0o600);
        let items = [KeyToPath {
            key: "b".into(),
            path: "sub/b.txt".into(),
            mode: Some(0o400),
        }];
        let some = select("v", entries.clone(), Some(&items), false, 0o644)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((some[0].path.as_str(), some[0].mode), ("sub/b.txt", 0o400));
        let missing = [KeyToPath {
            key: "z".into(),
            path: "z".into(),
            mode: None,
        }];
        assert!(select("v", entries.clone(), Some(&missing), false, 0o644).is_err());
        assert!(select("v", entries, Some(&missing), true, 0o644).is_ok_and(|f| f.is_empty()));
    }

    #[test]
    fn writes_files_atomically_and_prunes_old_keys() {
        let dir = std::env::temp_dir().join(format!("pn-vol-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = |p: &str, d: &str| File {
            path: p.into(),
            data: d.as_bytes().to_vec(),
            mode: 0o640,
        };
        write_files("v", &dir, &[file("a", "1"), file("n/b", "2")])
            .unwrap_or_else(|e| panic!("{e}"));
        write_files("v", &dir, &[file("n/b", "3")]).unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.join("a").exists());
        assert_eq!(
            std::fs::read_to_string(dir.join("n/b")).ok().as_deref(),
            Some("3")
        );
        let mode = std::fs::metadata(dir.join("n/b"))
            .map(|m| m.permissions().mode() & 0o777)
            .ok();
        assert_eq!(mode, Some(0o640));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
