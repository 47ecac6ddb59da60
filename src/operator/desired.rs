//! The objects a flow needs, built by pure functions from the flow alone, so the whole desired
//! state is testable without a cluster and every reconcile applies exactly the same thing.
//!
//! Per flow `<name>`: a ConfigMap `<name>-flow` (the rendered flow, never secrets), a StatefulSet
//! `<name>` of replicators (stable names, so logs, metrics and a later exactly-once mode can
//! refer to replica `<name>-<ordinal>`), a headless Service `<name>-metrics` (per-pod metrics,
//! and the StatefulSet's governing service), a PodDisruptionBudget `<name>` and, when the
//! installer wants one, a NetworkPolicy `<name>` in front of the replicator pods.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretVolumeSource, SecurityContext, Service,
    ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use super::network::{self, ReplicatorNetwork};
use super::spread;
use crate::api::{MirrorFlow, SecretKeyRef};
use crate::kafka::DEFAULT_SECRETS_DIR;

/// Port of the replicator's /metrics, /healthz, /readyz.
pub const REPLICATOR_PORT: i32 = 9464;
/// Where the rendered flow is mounted in replicator pods.
pub const CONFIG_DIR: &str = "/etc/mirrorflow";
/// Where the kubelet reads a container's termination message (its default path).
const TERMINATION_LOG: &str = "/dev/termination-log";
pub const CONFIG_FILE: &str = "flow.yaml";
/// Pod annotation whose change rolls the replicators when the rendered config or a Secret changes.
pub const CONFIG_HASH_ANNOTATION: &str = "mirrorflow.io/config-hash";
pub const FLOW_LABEL: &str = "mirrorflow.io/flow";
const NONROOT_UID: i64 = 65532;

/// Everything the builders need beyond the flow itself.
#[derive(Clone, Debug)]
pub struct BuildInputs {
    /// The replicator image (default: the operator's own).
    pub image: String,
    /// resourceVersion of every Secret the flow references, so a rotated credential rolls pods.
    pub secret_versions: BTreeMap<String, String>,
    /// The replicator container's resources, as the installer's bounds allowed them
    /// ([`super::guards::replicator_resources`]).
    pub resources: ResourceRequirements,
    /// The installer's NetworkPolicy settings for replicator pods.
    pub network: ReplicatorNetwork,
}

/// The objects to apply, in apply order.
pub struct Desired {
    pub config_map: ConfigMap,
    pub service: Service,
    pub stateful_set: StatefulSet,
    pub pdb: PodDisruptionBudget,
    /// `None` when the installer wants no NetworkPolicy.
    pub network_policy: Option<NetworkPolicy>,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("the flow has no {0}")]
    Missing(&'static str),
    #[error("rendering the flow config failed: {0}")]
    Render(#[from] serde_yaml::Error),
}

pub fn config_map_name(flow: &MirrorFlow) -> String {
    format!("{}-flow", flow.name_any())
}

pub fn service_name(flow: &MirrorFlow) -> String {
    format!("{}-metrics", flow.name_any())
}

/// Labels every child carries; the selector of the replicator pods.
pub fn selector_labels(flow: &MirrorFlow) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "mirrorflow-replicator".to_string(),
        ),
        (FLOW_LABEL.to_string(), flow.name_any()),
    ])
}

fn labels(flow: &MirrorFlow) -> BTreeMap<String, String> {
    let mut l = selector_labels(flow);
    l.insert(
        "app.kubernetes.io/managed-by".into(),
        "mirrorflow-operator".into(),
    );
    l.insert("app.kubernetes.io/component".into(), "replicator".into());
    l
}

fn meta(flow: &MirrorFlow, name: String) -> Result<ObjectMeta, BuildError> {
    let owner: OwnerReference = flow
        .controller_owner_ref(&())
        .ok_or(BuildError::Missing("metadata.uid"))?;
    Ok(ObjectMeta {
        name: Some(name),
        namespace: flow.namespace(),
        labels: Some(labels(flow)),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    })
}

/// The flow as the replicator reads it: the resource with its spec, its uid and creation time
/// (its identity), without status or other server-set metadata. Secrets appear only as
/// references.
pub fn render_flow(flow: &MirrorFlow) -> Result<String, BuildError> {
    let mut clean = MirrorFlow::new(&flow.name_any(), flow.spec.clone());
    clean.metadata.namespace = flow.namespace();
    // The flow's identity in the internal topics it may share with flows this operator
    // cannot see (`kafka::writers`): stable for the resource's life.
    clean.metadata.uid = flow.metadata.uid.clone();
    clean.metadata.creation_timestamp = flow.metadata.creation_timestamp.clone();
    Ok(serde_yaml::to_string(&clean)?)
}

/// Every Secret the flow references, by name.
pub fn referenced_secrets(flow: &MirrorFlow) -> BTreeSet<String> {
    secret_refs(flow)
        .into_iter()
        .map(|(_, r)| r.name.clone())
        .collect()
}

/// (spec field, reference) for every Secret key the flow uses.
pub fn secret_refs(flow: &MirrorFlow) -> Vec<(String, &SecretKeyRef)> {
    let mut out = crate::kafka::config::secret_refs(&flow.spec.source, "spec.source");
    out.extend(crate::kafka::config::secret_refs(
        &flow.spec.target,
        "spec.target",
    ));
    out
}

fn config_hash(rendered: &str, inputs: &BuildInputs) -> String {
    // Stable across processes and versions of std (unlike DefaultHasher's seed-free SipHash
    // parameters, which std does not promise to keep): FNV-1a over the inputs.
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 ^= u64::from(*b);
                self.0 = self.0.wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    rendered.hash(&mut h);
    inputs.secret_versions.hash(&mut h);
    inputs.image.hash(&mut h);
    format!("{:016x}", h.finish())
}

pub fn build(flow: &MirrorFlow, inputs: &BuildInputs) -> Result<Desired, BuildError> {
    let rendered = render_flow(flow)?;
    let hash = config_hash(&rendered, inputs);
    let config_map = ConfigMap {
        metadata: meta(flow, config_map_name(flow))?,
        data: Some(BTreeMap::from([(CONFIG_FILE.to_string(), rendered)])),
        ..ConfigMap::default()
    };
    let service = Service {
        metadata: meta(flow, service_name(flow))?,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(selector_labels(flow)),
            ports: Some(vec![ServicePort {
                name: Some("metrics".into()),
                port: REPLICATOR_PORT,
                target_port: Some(IntOrString::String("metrics".into())),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    let stateful_set = StatefulSet {
        metadata: meta(flow, flow.name_any())?,
        spec: Some(StatefulSetSpec {
            replicas: Some(flow.spec.replicas),
            service_name: Some(service_name(flow)),
            // Replicas share work through a consumer group; none waits for another to start.
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(selector_labels(flow)),
                ..LabelSelector::default()
            },
            template: pod_template(flow, inputs, hash)?,
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    };
    let pdb = PodDisruptionBudget {
        metadata: meta(flow, flow.name_any())?,
        spec: Some(PodDisruptionBudgetSpec {
            // One replica at a time: the survivors take over its partitions.
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(flow)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    };
    let network_policy = match inputs.network.enabled {
        true => Some(NetworkPolicy {
            metadata: meta(flow, flow.name_any())?,
            spec: Some(network::spec(
                &inputs.network,
                selector_labels(flow),
                REPLICATOR_PORT,
            )),
        }),
        false => None,
    };
    Ok(Desired {
        config_map,
        service,
        stateful_set,
        pdb,
        network_policy,
    })
}

/// glibc's allocator in the replicator, as the chart sets it for the operator: two arenas, and
/// blocks of 128 KiB and more mapped apart and given back when freed. Whole batches allocate a
/// fetch answer of megabytes at a time from several threads, which glibc otherwise keeps per
/// thread arena after they are freed: over 2,000 partitions the replicator's peak RSS was 179
/// MiB without and 127 MiB with these (bench/results/2026-12-07-side-by-side/findings.md;
/// `bench/run.sh` runs its arms of ours with them too).
pub const ALLOCATOR_ENV: [(&str, &str); 3] = [
    ("MALLOC_ARENA_MAX", "2"),
    ("MALLOC_MMAP_THRESHOLD_", "131072"),
    ("MALLOC_TRIM_THRESHOLD_", "131072"),
];

/// The replicator container's environment: its pod's identity, its log format, where its last
/// words go, and [`ALLOCATOR_ENV`].
fn replicator_env() -> Vec<EnvVar> {
    let value = |name: &str, value: &str| EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    };
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_IP", "status.podIP"),
        value("MIRRORFLOW_LOG_FORMAT", "json"),
        // Its fatal error becomes the pod's termination message, which the operator names in
        // the flow's status (`operator::unready`).
        value(crate::replicator::last_words::ENV, TERMINATION_LOG),
    ];
    env.extend(ALLOCATOR_ENV.iter().map(|(name, v)| value(name, v)));
    env
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Probe::default()
    }
}

fn pod_template(
    flow: &MirrorFlow,
    inputs: &BuildInputs,
    hash: String,
) -> Result<PodTemplateSpec, BuildError> {
    let overrides = flow.spec.pod.clone().unwrap_or_default();
    let mut pod_labels = labels(flow);
    pod_labels.extend(overrides.labels.clone());
    // Selector labels win over user labels, or the StatefulSet would lose its pods.
    pod_labels.extend(selector_labels(flow));
    let mut annotations = overrides.annotations.clone();
    annotations.insert(CONFIG_HASH_ANNOTATION.into(), hash);
    let (volumes, mounts) = volumes(flow);
    let image = (overrides.image.clone()).unwrap_or_else(|| inputs.image.clone());
    let container = replicator_container(image, inputs.resources.clone(), mounts);
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            volumes: Some(volumes),
            // Replicators never call the apiserver.
            automount_service_account_token: Some(false),
            termination_grace_period_seconds: Some(30),
            node_selector: (!overrides.node_selector.is_empty())
                .then_some(overrides.node_selector.clone()),
            tolerations: (!overrides.tolerations.is_empty())
                .then_some(overrides.tolerations.clone()),
            topology_spread_constraints: Some(spread::constraints(flow, &selector_labels(flow))),
            security_context: Some(pod_security()),
            ..PodSpec::default()
        }),
    })
}

/// The flow's ConfigMap and every Secret it references, read-only, with their mounts.
fn volumes(flow: &MirrorFlow) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = vec![Volume {
        name: "flow".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map_name(flow),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "flow".into(),
        mount_path: CONFIG_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }];
    for (i, secret) in referenced_secrets(flow).into_iter().enumerate() {
        let name = format!("secret-{i}");
        mounts.push(VolumeMount {
            name: name.clone(),
            mount_path: format!("{DEFAULT_SECRETS_DIR}/{secret}"),
            read_only: Some(true),
            ..VolumeMount::default()
        });
        volumes.push(Volume {
            name,
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret),
                default_mode: Some(0o400),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    (volumes, mounts)
}

fn replicator_container(
    image: String,
    resources: ResourceRequirements,
    mounts: Vec<VolumeMount>,
) -> Container {
    Container {
        name: "replicator".into(),
        image: Some(image),
        args: Some(vec![
            "replicate".into(),
            "--config".into(),
            format!("{CONFIG_DIR}/{CONFIG_FILE}"),
            "--listen".into(),
            format!("$(POD_IP):{REPLICATOR_PORT}"),
            "--replica".into(),
            "$(POD_NAME)".into(),
        ]),
        env: Some(replicator_env()),
        termination_message_path: Some(TERMINATION_LOG.into()),
        // A crash before the replicator could write (an abort in a native library) still
        // leaves its log's tail there.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: REPLICATOR_PORT,
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(http_probe("/readyz", 2, 3)),
        liveness_probe: Some(http_probe("/healthz", 10, 6)),
        resources: Some(resources),
        volume_mounts: Some(mounts),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(NONROOT_UID),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

fn pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(NONROOT_UID),
        // Secret volumes are 0400 and root's; kubelet gives this group read access to them
        // (0440), so the non-root replicator can read its credentials and no other uid can.
        fs_group: Some(NONROOT_UID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MirrorFlowSpec;

    fn flow(extra: &str) -> MirrorFlow {
        let spec: MirrorFlowSpec = serde_yaml::from_str(&format!(
            "source: {{alias: a, bootstrapServers: 'x:1'}}\ntarget: {{alias: b, bootstrapServers: 'y:1', sasl: {{mechanism: SCRAM-SHA-512, usernameSecretRef: {{name: creds, key: user}}, passwordSecretRef: {{name: creds, key: password}}}}}}\n{extra}"
        ))
        .unwrap();
        let mut f = MirrorFlow::new("orders", spec);
        f.metadata.namespace = Some("apps".into());
        f.metadata.uid = Some("uid-1".into());
        f
    }

    fn inputs() -> BuildInputs {
        BuildInputs {
            image: "mirrorflow:dev".into(),
            secret_versions: BTreeMap::from([("creds".into(), "1".into())]),
            resources: crate::operator::guards::ResourcePolicy::default().default,
            network: ReplicatorNetwork::default(),
        }
    }

    fn pod_spec(d: &Desired) -> &PodSpec {
        d.stateful_set
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
    }

    #[test]
    fn children_are_owned_and_the_config_holds_references_not_secrets() {
        let d = build(&flow(""), &inputs()).unwrap();
        let owner = &d.config_map.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("MirrorFlow", Some(true))
        );
        let text = &d.config_map.data.as_ref().unwrap()[CONFIG_FILE];
        assert!(text.contains("passwordSecretRef") && text.contains("name: creds"));
        let reparsed: MirrorFlow = serde_yaml::from_str(text).unwrap();
        assert_eq!(reparsed.spec, flow("").spec);
    }

    #[test]
    fn the_flow_file_carries_the_flows_identity_for_the_replicator() {
        let mut f = flow("");
        let created = k8s_openapi::jiff::Timestamp::from_millisecond(1_700_000_000_123).unwrap();
        f.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            created,
        ));
        f.metadata.resource_version = Some("42".into());
        let text = render_flow(&f).unwrap();
        assert!(!text.contains("resourceVersion"), "{text}");
        let dir = std::env::temp_dir().join(format!("mf-render-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("flow.yaml");
        std::fs::write(&path, &text).unwrap();
        let read = crate::flow::load_file(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read.name, "apps/orders");
        assert_eq!(
            read.writer,
            crate::kafka::writers::Writer {
                id: "uid-1".into(),
                flow: "apps/orders".into(),
                created_ms: 1_700_000_000_000,
            }
        );
    }

    #[test]
    fn pods_are_locked_down_and_mount_the_secrets_they_need() {
        let d = build(&flow(""), &inputs()).unwrap();
        let pod = pod_spec(&d);
        assert_eq!(pod.automount_service_account_token, Some(false));
        let c = &pod.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        assert!(c.resources.as_ref().unwrap().limits.is_some());
        let pod_sc = pod.security_context.as_ref().unwrap();
        assert_eq!(
            pod_sc.fs_group, pod_sc.run_as_user,
            "the replicator's uid can read the Secret volumes through their group"
        );
        let mounts: Vec<_> = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert!(
            mounts.contains(&"/var/run/mirrorflow/secrets/creds"),
            "{mounts:?}"
        );
        assert!(
            c.args
                .as_ref()
                .unwrap()
                .contains(&format!("$(POD_IP):{REPLICATOR_PORT}"))
        );
        // The allocator gives freed fetch answers back (ALLOCATOR_ENV).
        let env: Vec<(&str, Option<&str>)> = (c.env.iter().flatten())
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect();
        for (name, value) in ALLOCATOR_ENV {
            assert!(env.contains(&(name, Some(value))), "{name} in {env:?}");
        }
    }

    #[test]
    fn a_spec_or_secret_change_changes_the_pod_template_hash() {
        let hash = |f: &MirrorFlow, i: &BuildInputs| {
            let d = build(f, i).unwrap();
            let t = d.stateful_set.spec.unwrap().template.metadata.unwrap();
            t.annotations.unwrap()[CONFIG_HASH_ANNOTATION].clone()
        };
        let base = hash(&flow(""), &inputs());
        assert_eq!(base, hash(&flow(""), &inputs()), "deterministic");
        assert_ne!(base, hash(&flow("topics: ['orders.*']\n"), &inputs()));
        let mut rotated = inputs();
        rotated.secret_versions.insert("creds".into(), "2".into());
        assert_ne!(base, hash(&flow(""), &rotated));
    }

    #[test]
    fn a_network_policy_is_built_only_when_the_installer_wants_one() {
        assert!(
            build(&flow(""), &inputs())
                .unwrap()
                .network_policy
                .is_none()
        );
        let mut with = inputs();
        with.network.enabled = true;
        let policy = build(&flow(""), &with).unwrap().network_policy.unwrap();
        assert_eq!(policy.metadata.name.as_deref(), Some("orders"));
        assert_eq!(
            policy.metadata.owner_references.unwrap()[0].controller,
            Some(true)
        );
        let spec = policy.spec.unwrap();
        assert_eq!(
            spec.pod_selector.unwrap().match_labels,
            Some(selector_labels(&flow("")))
        );
        assert_eq!(
            spec.ingress,
            Some(Vec::new()),
            "no scraper named: none admitted"
        );
    }

    #[test]
    fn replicas_and_user_labels_apply_but_never_break_the_selector() {
        let f = flow("replicas: 3\npod: {labels: {team: data, 'mirrorflow.io/flow': hijack}}\n");
        let d = build(&f, &inputs()).unwrap();
        let sts = d.stateful_set.spec.unwrap();
        assert_eq!(sts.replicas, Some(3));
        let labels = sts.template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels["team"], "data");
        assert_eq!(labels[FLOW_LABEL], "orders");
    }
}
