//! A flow file or resource turned into what the loops run on: compiled filters, the naming
//! policy, client configurations. Every refusal names the spec field and how to fix it.

use std::path::Path;
use std::sync::Arc;

use rdkafka::ClientConfig;

mod bounds;
pub mod placement;
mod selection;
mod validate;

pub use self::validate::{BatchesBlocker, batches_blocker, copy_unit, validate};

use crate::api::{CopyUnit, MirrorFlowSpec, OffsetSyncsLocation, OffsetsMode, PolicyKind};
use crate::kafka::writers::Writer;
use crate::kafka::{self, ClientUse, SecretFiles};
use crate::mm2::{
    FilterError, IdentityPolicy, NameFilter, PolicyError, PrefixPolicy, ReplicationPolicy,
};

#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    #[error("cannot read the flow file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the flow file {path} is not a valid MirrorFlow: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error(
        "the flow file {path} has an unknown field {field}: remove it or fix its spelling (`kubectl explain mirrorflow.spec` lists the fields)"
    )]
    UnknownField { path: String, field: String },
    #[error("{0}")]
    Filter(#[from] FilterError),
    #[error("spec.replicationPolicy.separator: {0}")]
    Policy(#[from] PolicyError),
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// Past a bound of the CRD's schema, which a flow file meets no apiserver to hold it to.
    #[error("{field}: {message}")]
    OutOfBounds { field: String, message: String },
    #[error(transparent)]
    Client(#[from] kafka::ConfigError),
}

/// Every reason [`FlowError::reason`] returns.
pub fn reasons() -> impl Iterator<Item = &'static str> {
    std::iter::once("InvalidSpec").chain(kafka::config::REASONS.iter().copied())
}

impl FlowError {
    /// A condition reason for the operator's status.
    pub fn reason(&self) -> &'static str {
        match self {
            FlowError::Client(e) => e.reason(),
            _ => "InvalidSpec",
        }
    }
}

/// A validated flow, ready to run.
#[derive(Clone)]
pub struct Flow {
    /// `<namespace>/<name>` of the resource, or the file's name for a standalone run.
    pub name: String,
    pub spec: MirrorFlowSpec,
    pub policy: Arc<dyn ReplicationPolicy>,
    pub topics: NameFilter,
    pub groups: NameFilter,
    pub source_client: ClientConfig,
    pub target_client: ClientConfig,
    /// The clients of the operator's status probe: the same clusters and credentials, with only
    /// the probe-safe part of `spec.<side>.config` ([`kafka::ClientUse::Probe`]).
    pub source_probe_client: ClientConfig,
    pub target_probe_client: ClientConfig,
    /// Who this flow is in the internal topics it shares with other flows
    /// ([`kafka::writers`]).
    pub writer: Writer,
    /// The replicator's own connections (the batch copy's, verification's, share groups'):
    /// a flow whose settings cannot make them is refused, naming the field, like one whose
    /// settings cannot make librdkafka's (they read the same fields and Secrets).
    pub own_security: OwnSecurity,
}

/// The TLS and SASL of the replicator's own connections to both clusters.
#[derive(Clone)]
pub struct OwnSecurity {
    pub source: mirrorflow_conn::Security,
    pub target: mirrorflow_conn::Security,
}

impl std::fmt::Debug for Flow {
    // Client configs may hold credentials: never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flow")
            .field("name", &self.name)
            .field("source", &self.spec.source.alias)
            .field("target", &self.spec.target.alias)
            .finish_non_exhaustive()
    }
}

impl Flow {
    pub fn source_alias(&self) -> &str {
        &self.spec.source.alias
    }

    pub fn target_alias(&self) -> &str {
        &self.spec.target.alias
    }
}

/// A flow file as read: its name, spec and identity.
#[derive(Debug)]
pub struct FlowFile {
    pub name: String,
    pub spec: MirrorFlowSpec,
    pub writer: Writer,
}

/// The identity of a flow resource: its uid and creation time when it has them (the operator
/// renders both into the replicator's flow file), its name otherwise.
pub fn writer_of(name: &str, metadata: &kube::api::ObjectMeta) -> Writer {
    match &metadata.uid {
        Some(uid) if !uid.is_empty() => Writer {
            id: uid.clone(),
            flow: name.to_string(),
            created_ms: metadata
                .creation_timestamp
                .as_ref()
                .map_or(i64::MAX, |t| t.0.as_millisecond()),
        },
        _ => Writer::unnamed(name),
    }
}

/// Reads a flow file: a whole `MirrorFlow` resource (as `kubectl get -o yaml` prints it) or
/// just its spec.
pub fn load_file(path: &Path) -> Result<FlowFile, FlowError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| FlowError::Read {
        path: shown.clone(),
        source,
    })?;
    let value: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|source| FlowError::Parse {
            path: shown.clone(),
            source,
        })?;
    // The apiserver prunes unknown fields; a file has no apiserver, so a misspelt field
    // (`heartbeat:` for `heartbeats:`) would silently fall back to a default.
    let parse_spec = |spec: serde_yaml::Value, prefix: &str| -> Result<MirrorFlowSpec, FlowError> {
        // The schema's bounds, which the apiserver would hold a resource to.
        let written = serde_json::to_value(&spec).unwrap_or(serde_json::Value::Null);
        let mut unknown = Vec::new();
        let spec: MirrorFlowSpec =
            serde_ignored::deserialize(spec, |p| unknown.push(p.to_string())).map_err(
                |source| FlowError::Parse {
                    path: shown.clone(),
                    source,
                },
            )?;
        if let Some(field) = unknown.first() {
            return Err(FlowError::UnknownField {
                path: shown.clone(),
                field: format!("{prefix}{field}"),
            });
        }
        bounds::check(&written)
            .map_err(|b| FlowError::OutOfBounds {
                field: b.field,
                message: b.message,
            })
            .map(|()| spec)
    };
    match value {
        serde_yaml::Value::Mapping(mut resource) if resource.contains_key("spec") => {
            let spec = resource.remove("spec").unwrap_or(serde_yaml::Value::Null);
            let spec = parse_spec(spec, "spec.")?;
            let metadata: kube::api::ObjectMeta = match resource.remove("metadata") {
                Some(m) => serde_yaml::from_value(m).map_err(|source| FlowError::Parse {
                    path: shown.clone(),
                    source,
                })?,
                None => Default::default(),
            };
            let name = match (metadata.namespace.as_deref(), metadata.name.as_deref()) {
                (Some(ns), Some(n)) => format!("{ns}/{n}"),
                (None, Some(n)) => n.to_string(),
                _ => stem(path),
            };
            Ok(FlowFile {
                writer: writer_of(&name, &metadata),
                name,
                spec,
            })
        }
        spec => {
            let name = stem(path);
            Ok(FlowFile {
                writer: Writer::unnamed(&name),
                spec: parse_spec(spec, "spec.")?,
                name,
            })
        }
    }
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "flow".into())
}

/// Checks what the CRD schema cannot and builds the runtime pieces.
pub fn resolve(
    name: String,
    spec: MirrorFlowSpec,
    secrets: &SecretFiles,
) -> Result<Flow, FlowError> {
    validate(&spec)?;
    let policy: Arc<dyn ReplicationPolicy> = match spec.replication_policy.kind {
        PolicyKind::Prefix => Arc::new(match &spec.replication_policy.separator {
            Some(sep) => PrefixPolicy::new(sep.clone())?,
            None => PrefixPolicy::default(),
        }),
        PolicyKind::Identity => Arc::new(IdentityPolicy::new(
            PrefixPolicy::default(),
            Some(spec.source.alias.clone()),
        )),
    };
    let topics = NameFilter::new(
        "spec.topics",
        &spec.topics,
        "spec.topicsExclude",
        &spec.topics_exclude,
    )?;
    let groups = NameFilter::new(
        "spec.groups",
        &spec.groups,
        "spec.groupsExclude",
        &spec.groups_exclude,
    )?;
    let client = |cluster, field, usage| kafka::client_config(cluster, field, secrets, usage);
    let (source, target) = (&spec.source, &spec.target);
    let source_client = client(source, "spec.source", ClientUse::Replicator)?;
    let target_client = client(target, "spec.target", ClientUse::Replicator)?;
    let source_probe_client = client(source, "spec.source", ClientUse::Probe)?;
    let target_probe_client = client(target, "spec.target", ClientUse::Probe)?;
    let own_security = OwnSecurity {
        source: kafka::config::conn_security(source, "spec.source", secrets)?,
        target: kafka::config::conn_security(target, "spec.target", secrets)?,
    };
    Ok(Flow {
        own_security,
        writer: Writer::unnamed(&name),
        name,
        spec,
        policy,
        topics,
        groups,
        source_client,
        target_client,
        source_probe_client,
        target_probe_client,
    })
}

/// The flow `name` from alias `a` (`x:1`) to `b` (`y:1`) with `extra` spec lines: the one
/// fixture of the unit tests that need a resolved flow.
#[cfg(test)]
pub fn test_flow(name: &str, extra: &str) -> Flow {
    let yaml = format!(
        "source: {{alias: a, bootstrapServers: 'x:1'}}\ntarget: {{alias: b, bootstrapServers: 'y:1'}}\n{extra}"
    );
    let spec = serde_yaml::from_str(&yaml).expect("a valid test spec");
    resolve(name.into(), spec, &crate::kafka::SecretFiles::new("/none"))
        .expect("a resolvable test flow")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> MirrorFlowSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    const BASE: &str = "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1'}\n";

    #[test]
    fn a_minimal_spec_gets_mm2_defaults_and_resolves() {
        let flow = resolve("f".into(), spec(BASE), &SecretFiles::new("/none")).unwrap();
        assert!(flow.topics.matches("orders"));
        assert!(!flow.topics.matches("__consumer_offsets"));
        assert!(!flow.groups.matches("console-consumer-1"));
        assert_eq!(flow.policy.format_remote_topic("a", "orders"), "a.orders");
    }

    #[test]
    fn an_invalid_regex_names_its_field_and_pattern() {
        let s = spec(&format!("{BASE}topicsExclude: ['ok', '(unclosed']\n"));
        let err = resolve("f".into(), s, &SecretFiles::new("/none"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("spec.topicsExclude") && err.contains("(unclosed"),
            "{err}"
        );
    }

    #[test]
    fn same_aliases_and_bad_replicas_are_refused_by_field() {
        let s = spec(
            "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: a, bootstrapServers: 'y:1'}\n",
        );
        assert!(
            validate(&s)
                .unwrap_err()
                .to_string()
                .starts_with("spec.target.alias")
        );
        let s = spec(&format!("{BASE}replicas: 10000\n"));
        assert!(
            validate(&s)
                .unwrap_err()
                .to_string()
                .starts_with("spec.replicas")
        );
        let s = spec(&format!("{BASE}sourceLoop: {{consumers: 0}}\n"));
        assert!(
            validate(&s)
                .unwrap_err()
                .to_string()
                .starts_with("spec.sourceLoop.consumers")
        );
        assert!(validate(&spec(&format!("{BASE}sourceLoop: {{consumers: 8}}\n"))).is_ok());
    }

    #[test]
    fn a_flow_file_with_a_misspelt_field_is_refused_naming_it() {
        let dir = std::env::temp_dir().join(format!("mf-flow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let resource = dir.join("typo.yaml");
        std::fs::write(
            &resource,
            format!(
                "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: f, namespace: n}}\nspec:\n  {}\n  heartbeat: {{interval: 1s}}\n",
                BASE.trim_end().replace('\n', "\n  ")
            ),
        )
        .unwrap();
        let err = load_file(&resource).unwrap_err().to_string();
        assert!(err.contains("unknown field spec.heartbeat"), "{err}");
        let spec_only = dir.join("nested.yaml");
        std::fs::write(&spec_only, format!("{BASE}heartbeats: {{intervall: 1s}}\n")).unwrap();
        let err = load_file(&spec_only).unwrap_err().to_string();
        assert!(
            err.contains("unknown field spec.heartbeats.intervall"),
            "{err}"
        );
        let good = dir.join("good.yaml");
        std::fs::write(
            &good,
            format!(
                "metadata: {{name: f, namespace: n}}\nspec:\n  {}\n",
                BASE.trim_end().replace('\n', "\n  ")
            ),
        )
        .unwrap();
        assert_eq!(load_file(&good).unwrap().name, "n/f");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_topic_filter_that_can_only_match_internal_topics_is_refused() {
        for pattern in ["__consumer_offsets", "__.*", ".*\\.internal"] {
            let err = validate(&spec(&format!("{BASE}topics: ['{pattern}']\n")))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("spec.topics") && err.contains("internal"),
                "{err}"
            );
        }
        for pattern in [".*", "orders", "[a-z_]+", "__consumer_offsets|orders"] {
            assert!(
                validate(&spec(&format!("{BASE}topics: ['{pattern}']\n"))).is_ok(),
                "{pattern}"
            );
        }
    }

    #[test]
    fn absurd_intervals_are_refused_naming_the_field() {
        let err = validate(&spec(&format!("{BASE}heartbeats: {{interval: 5000h}}\n")))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("spec.heartbeats.interval") && err.contains("100ms to 1h"),
            "{err}"
        );
        let err = validate(&spec(&format!(
            "{BASE}failoverReadiness: {{maxCheckpointAge: 10ms}}\n"
        )))
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("spec.failoverReadiness.maxCheckpointAge"),
            "{err}"
        );
    }

    #[test]
    fn aligned_offsets_refuse_exactly_once() {
        let both = spec(&format!(
            "{BASE}exactlyOnce: true\noffsets: Aligned\nsourceLoop: {{offsetSyncsLocation: Target}}\n"
        ));
        let err = validate(&both).unwrap_err().to_string();
        assert!(err.starts_with("spec.offsets"), "{err}");
        assert!(validate(&spec(&format!("{BASE}offsets: Aligned\n"))).is_ok());
        let bad: Result<crate::api::MirrorFlowSpec, _> =
            serde_yaml::from_str(&format!("{BASE}offsets: Same\n"));
        assert!(bad.is_err(), "an unknown offsets mode must not parse");
    }

    #[test]
    fn batch_copies_refuse_exactly_once_and_aligned_offsets_and_resolve_their_connections() {
        let batches = "sourceLoop: {copy: Batches, offsetSyncsLocation: Target}\n";
        for (other, named) in [
            ("exactlyOnce: true\n", "spec.exactlyOnce"),
            ("offsets: Aligned\n", "spec.offsets: Aligned"),
        ] {
            let err = validate(&spec(&format!("{BASE}{other}{batches}")))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("spec.sourceLoop.copy") && err.contains(named),
                "{err}"
            );
        }
        // The batch copy's connections speak OAUTHBEARER (tokens from the bounded client).
        let oauth = "sasl: {mechanism: OAUTHBEARER, oauthbearer: {tokenEndpointUrl: 'https://idp.example/token', clientId: c, clientSecretSecretRef: {name: s, key: k}}}";
        let target_oauth = format!(
            "source: {{alias: a, bootstrapServers: 'x:1'}}\ntarget: {{alias: b, bootstrapServers: 'y:1', {oauth}}}\n"
        );
        assert_eq!(crate::flow::batches_blocker(&spec(&target_oauth)), None);
        assert!(validate(&spec(&format!("{target_oauth}{batches}"))).is_ok());
        assert_eq!(crate::flow::batches_blocker(&spec(BASE)), None);
        let flow = test_flow("f", batches);
        assert_eq!(flow.spec.source_loop.copy, Some(CopyUnit::Batches));
        let bad: Result<crate::api::MirrorFlowSpec, _> =
            serde_yaml::from_str(&format!("{BASE}sourceLoop: {{copy: Bytes}}\n"));
        assert!(bad.is_err(), "an unknown copy unit must not parse");
    }

    #[test]
    fn unset_the_copy_is_whole_batches_where_they_can_carry_the_spec_and_records_elsewhere() {
        let unit = |extra: &str| {
            let s = spec(&format!("{BASE}{extra}"));
            assert!(validate(&s).is_ok(), "{extra}: {:?}", validate(&s));
            crate::flow::copy_unit(&s)
        };
        assert_eq!(unit(""), CopyUnit::Batches);
        let eos = "exactlyOnce: true\nsourceLoop: {offsetSyncsLocation: Target}\n";
        assert_eq!(unit(eos), CopyUnit::Records);
        assert_eq!(unit("offsets: Aligned\n"), CopyUnit::Records);
        // What a spec names is what it copies.
        assert_eq!(unit("sourceLoop: {copy: Records}\n"), CopyUnit::Records);
        assert_eq!(unit("sourceLoop: {copy: Batches}\n"), CopyUnit::Batches);
        let eos_records =
            "exactlyOnce: true\nsourceLoop: {offsetSyncsLocation: Target, copy: Records}\n";
        assert_eq!(unit(eos_records), CopyUnit::Records);
        // Unset is not written back: a spec read and served again keeps choosing.
        let served = serde_json::to_value(spec(BASE)).expect("serialises");
        assert!(served["sourceLoop"].get("copy").is_none(), "{served}");
    }

    #[test]
    fn exactly_once_needs_offset_syncs_on_the_target() {
        let err = validate(&spec(&format!("{BASE}exactlyOnce: true\n")))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("spec.sourceLoop.offsetSyncsLocation") && err.contains("Target"),
            "{err}"
        );
        let ok = spec(&format!(
            "{BASE}exactlyOnce: true\nsourceLoop: {{offsetSyncsLocation: Target}}\n"
        ));
        assert!(validate(&ok).is_ok());
        let s = spec(
            "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1', config: {transactional.id: x}}\nexactlyOnce: true\nsourceLoop: {offsetSyncsLocation: Target}\n",
        );
        assert!(
            validate(&s)
                .unwrap_err()
                .to_string()
                .starts_with("spec.target.config")
        );
    }

    #[test]
    fn unknown_durations_are_refused_when_parsing() {
        let err = serde_yaml::from_str::<MirrorFlowSpec>(&format!(
            "{BASE}heartbeats: {{interval: soon}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("heartbeats") && err.contains("not a duration"),
            "{err}"
        );
    }

    #[test]
    fn an_alias_containing_the_separator_is_refused_naming_it() {
        let s = spec(
            "source: {alias: us-east, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1'}\nreplicationPolicy: {separator: '-'}\n",
        );
        let err = validate(&s).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "spec.source.alias: 'us-east' contains spec.replicationPolicy.separator"
            ),
            "{err}"
        );
        let s = spec(
            "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: west_2, bootstrapServers: 'y:1'}\nreplicationPolicy: {separator: _}\n",
        );
        assert!(
            validate(&s)
                .unwrap_err()
                .to_string()
                .starts_with("spec.target.alias:")
        );
        let ok = spec(
            "source: {alias: us-east, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1'}\nreplicationPolicy: {separator: _}\n",
        );
        assert!(validate(&ok).is_ok());
        assert!(validate(&spec(BASE)).is_ok(), "the default separator '.'");
    }

    #[test]
    fn a_separator_that_cannot_be_in_a_topic_name_is_refused_naming_it() {
        for separator in ["/", "' '", "'::'", "é", "'a b'"] {
            let s = spec(&format!(
                "source: {{alias: a, bootstrapServers: 'x:1'}}\ntarget: {{alias: b, bootstrapServers: 'y:1'}}\nreplicationPolicy: {{separator: {separator}}}\n"
            ));
            let err = validate(&s).unwrap_err().to_string();
            assert!(
                err.starts_with("spec.replicationPolicy.separator:")
                    && err.contains("cannot be part of a topic name"),
                "{separator}: {err}"
            );
        }
    }

    #[test]
    fn flow_files_get_the_crd_rules_on_addresses_and_secret_refs() {
        let s = spec(
            "source: {alias: a, bootstrapServers: 'kafka'}\ntarget: {alias: b, bootstrapServers: 'y:1'}\n",
        );
        let err = validate(&s).unwrap_err();
        assert_eq!(err.reason(), "InvalidSpec");
        assert!(
            err.to_string()
                .starts_with("spec.source.bootstrapServers: 'kafka' has no port"),
            "{err}"
        );
        let s = spec(
            "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1', sasl: {mechanism: PLAIN, usernameSecretRef: {name: s, key: u}, passwordSecretRef: {name: s, key: ../../etc/shadow}}}\n",
        );
        let err = validate(&s).unwrap_err().to_string();
        assert!(
            err.starts_with("spec.target.sasl.passwordSecretRef.key:"),
            "{err}"
        );
    }

    #[test]
    fn client_properties_are_checked_before_anything_connects() {
        let with = |config: &str| {
            spec(&format!(
                "source: {{alias: a, bootstrapServers: 'x:1', config: {{{config}}}}}\ntarget: {{alias: b, bootstrapServers: 'y:1'}}\n"
            ))
        };
        let err = validate(&with("fetch.wait.max.ms: banana")).unwrap_err();
        assert_eq!(err.reason(), "InvalidClientConfig");
        assert!(
            err.to_string().starts_with(
                "spec.source.config.fetch.wait.max.ms: the Kafka client refuses 'banana'"
            ),
            "{err}"
        );
        let err = validate(&with("plugin.library.paths: /tmp/evil.so")).unwrap_err();
        assert_eq!(err.reason(), "InvalidSpec");
        assert!(err.to_string().contains("loads or reads a file"), "{err}");
        let flow = resolve(
            "f".into(),
            with("linger.ms: '20', broker.address.family: v4"),
            &SecretFiles::new("/none"),
        )
        .unwrap();
        assert_eq!(flow.source_client.get("linger.ms"), Some("20"));
        assert_eq!(flow.source_probe_client.get("linger.ms"), None);
        assert_eq!(
            flow.source_probe_client.get("broker.address.family"),
            Some("v4")
        );
    }

    #[test]
    fn every_reason_is_known() {
        let all: Vec<_> = reasons().collect();
        assert!(all.contains(&"InvalidSpec") && all.contains(&"InvalidClientConfig"));
        let err = FlowError::Invalid {
            field: "spec.x",
            message: String::new(),
        };
        assert!(all.contains(&err.reason()));
    }
}
