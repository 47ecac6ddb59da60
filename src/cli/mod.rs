//! The failover CLI: `mirrorflow translate`, `failover`, `failback`, `drill` and `takeover`, also run as the kubectl
//! plugin `kubectl mirrorflow` (the same binary invoked as `kubectl-mirrorflow`).
//!
//! Each command reads a flow (a file, or a `MirrorFlow` and its Secrets from the apiserver),
//! reads what it needs from the two clusters, computes its plan with pure functions (unit
//! tested here) and prints it as a table or JSON. Only `--apply` writes anything (consumer group
//! offsets; `takeover`: the flow's positions), and `drill` its own drill groups.
//!
//! | command | reads | writes with `--apply` |
//! |---|---|---|
//! | [`translate`] | the target's checkpoints topic | nothing |
//! | [`failover`] | checkpoints, offset syncs, group offsets and members on both clusters | target group offsets |
//! | [`failback`] | the forward flow's offset syncs, group offsets on both clusters | old source group offsets |
//! | [`drill`] | what `failover` reads, then the first records of drill groups and the source's records around the groups | only `mirrorflow-drill.<group>` groups (always; deleted afterwards) |
//! | [`takeover`] | MM2's Connect offsets, the remote partitions' newest records, the source's records after MM2's offsets | the flow's positions |
//! | [`switchover`] | what `failover` reads, the flow's positions, the source's records after them and its ACLs | DENY WRITE ACLs on the source, target group offsets, the reverse flow (`--abort`: deletes the ACLs) |
//! | [`status`] | the `MirrorFlow`'s status, or (with a flow file) what the operator's probe reads | nothing |

mod aligned;
pub mod apply;
pub mod clusters;
pub mod drill;
pub mod failback;
pub mod failover;
mod records;
pub mod share_groups;
mod stale;
pub mod status;
pub mod switchover;
pub mod table;
pub mod takeover;
pub mod translate;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use clap::{ArgGroup, Args, ValueEnum};
use k8s_openapi::api::core::v1::Secret;

use crate::api::MirrorFlow;
use crate::flow::{self, Flow, FlowError};
use crate::kafka::checkpoints::ReadError;
use crate::kafka::{DEFAULT_SECRETS_DIR, SecretFiles};

/// Exit code when the command ran but refused or failed part of what it was asked to do.
pub const EXIT_REFUSED: i32 = 3;

/// Names under which the binary acts as a kubectl plugin (`kubectl mirrorflow`, `kubectl mf`).
const PLUGIN_NAMES: &[&str] = &["kubectl-mirrorflow", "kubectl-mf"];

/// The command name to show in help when the binary runs as a kubectl plugin: kubectl finds
/// plugins as `kubectl-<name>` executables on PATH and passes the remaining arguments through.
pub fn plugin_bin_name(argv0: &OsStr) -> Option<String> {
    let base = Path::new(argv0).file_name()?.to_str()?;
    let base = base.strip_suffix(".exe").unwrap_or(base);
    PLUGIN_NAMES
        .contains(&base)
        .then(|| base.replacen('-', " ", 1))
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Flow(#[from] FlowError),
    #[error("{flag}: {message}")]
    Usage { flag: &'static str, message: String },
    #[error(
        "--name: cannot build a Kubernetes client from the kubeconfig ({source}); set KUBECONFIG or use --flow-file"
    )]
    Kubeconfig {
        #[source]
        source: kube::Error,
    },
    #[error("--name: reading {what} from the apiserver: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(
        "cannot reach the {cluster} cluster: {source}; check spec.{cluster}.bootstrapServers and \
         that the cluster is up"
    )]
    Unreachable {
        cluster: &'static str,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    #[error("{what} on the {cluster} cluster: {source}")]
    Kafka {
        what: String,
        cluster: &'static str,
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// A share group's call on the project's own connections (no librdkafka error to carry).
    #[error("{what} on the {cluster} cluster: {message}")]
    Share {
        what: String,
        cluster: &'static str,
        message: String,
    },
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
}

impl CliError {
    /// A low-cardinality label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            CliError::Flow(_) => "invalid_flow",
            CliError::Usage { .. } => "usage",
            CliError::Kubeconfig { .. } | CliError::Api { .. } => "apiserver",
            CliError::Read(e) => e.metric_label(),
            CliError::Unreachable { .. } => "unreachable",
            CliError::Kafka { .. } | CliError::Share { .. } => "kafka",
            CliError::Output(_) => "output",
        }
    }
}

/// Where the flow comes from: a file, or a `MirrorFlow` on the cluster of the kubeconfig.
#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("flow").required(true).args(["flow_file", "name"])))]
pub struct FlowArgs {
    /// The flow: a MirrorFlow resource (as `kubectl get mf NAME -o yaml` prints it) or just its
    /// spec, as YAML.
    #[arg(long, value_name = "FILE")]
    pub flow_file: Option<PathBuf>,
    /// Folder with the Secrets the flow file references, as `<secret>/<key>` files
    /// (default: /var/run/mirrorflow/secrets). Only with --flow-file.
    #[arg(long, value_name = "DIR", requires = "flow_file")]
    pub secrets_dir: Option<PathBuf>,
    /// Name of a MirrorFlow to read, with the Secrets it references, from the apiserver of the
    /// current kubeconfig context (KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Namespace of the MirrorFlow given by --name (default: the kubeconfig context's).
    #[arg(long, short = 'n', value_name = "NS", requires = "name")]
    pub namespace: Option<String>,
}

/// Output format of every command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for people.
    #[default]
    Table,
    /// One JSON document on stdout, for scripts.
    Json,
}

/// Which consumer groups a failover or failback acts on.
#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("groups").required(true).args(["group", "all_groups"])))]
pub struct GroupSelection {
    /// A consumer group (repeat the flag for more).
    #[arg(long, value_name = "G")]
    pub group: Vec<String>,
    /// Every group the command finds for the flow (see the command's help).
    #[arg(long)]
    pub all_groups: bool,
}

/// Safety switches of the writing commands.
#[derive(Args, Debug, Clone, Copy)]
pub struct ApplyArgs {
    /// Commit the offsets. Without it nothing is written (dry run).
    #[arg(long)]
    pub apply: bool,
    /// Also act on groups with active members and on partitions whose move would skip records
    /// the group has not read (see the command's help for what Kafka itself still refuses).
    #[arg(long)]
    pub force: bool,
    /// Allow moving a group's committed offset backwards (re-reading what it already read there).
    #[arg(long)]
    pub allow_rewind: bool,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// Ends a CLI command: prints an error's message (which carries its causes) on stderr and
/// returns the process exit status (1 for errors).
pub fn exit_code(result: Result<i32, CliError>) -> i32 {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

/// Default log filter of the CLI commands: librdkafka reports every failed connection attempt,
/// which the commands already turn into one error naming the cluster.
pub const LOG_FILTER: &str = "warn,librdkafka=off,rdkafka=off";

/// Reads and resolves the flow from a file or from the apiserver.
pub fn load_flow(args: &FlowArgs) -> Result<Flow, CliError> {
    match (&args.flow_file, &args.name) {
        (Some(file), _) => {
            let file = flow::load_file(file)?;
            let dir = args
                .secrets_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SECRETS_DIR));
            let resolved = flow::resolve(file.name, file.spec, &SecretFiles::new(&dir));
            let mut resolved = resolved.map_err(|e| match e {
                FlowError::Client(c) if c.reason() == "SecretMissing" => CliError::Usage {
                    flag: "--secrets-dir",
                    message: format!(
                        "{c} (with --flow-file, Secrets are read from {} as <secret>/<key> files)",
                        dir.display()
                    ),
                },
                other => other.into(),
            })?;
            resolved.writer = file.writer;
            Ok(resolved)
        }
        (None, Some(name)) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(load_from_apiserver(name, args.namespace.as_deref()))
        }
        (None, None) => Err(CliError::Usage {
            flag: "--flow-file/--name",
            message: "give the flow as --flow-file FILE or --name NAME".into(),
        }),
    }
}

/// The MirrorFlow `name` from the apiserver of the kubeconfig, in `namespace` or the
/// kubeconfig's default; with the client and the namespace it came from.
pub(crate) async fn fetch_flow(
    name: &str,
    namespace: Option<&str>,
) -> Result<(kube::Client, String, MirrorFlow), CliError> {
    let client = kube::Client::try_default()
        .await
        .map_err(|source| CliError::Kubeconfig { source })?;
    let ns = namespace
        .map(str::to_string)
        .unwrap_or_else(|| client.default_namespace().to_string());
    let mf = kube::Api::<MirrorFlow>::namespaced(client.clone(), &ns)
        .get_opt(name)
        .await
        .map_err(|source| CliError::Api {
            what: format!("MirrorFlow {ns}/{name}"),
            source,
        })?
        .ok_or_else(|| CliError::Usage {
            flag: "--name",
            message: format!(
                "no MirrorFlow '{name}' in namespace '{ns}'; `kubectl get mf -A` lists them, \
                 --namespace picks another namespace"
            ),
        })?;
    Ok((client, ns, mf))
}

async fn load_from_apiserver(name: &str, namespace: Option<&str>) -> Result<Flow, CliError> {
    let (client, ns, mf) = fetch_flow(name, namespace).await?;
    let secrets = kube::Api::<Secret>::namespaced(client, &ns);
    let mut values = BTreeMap::new();
    for (field, r) in crate::operator::desired::secret_refs(&mf) {
        let secret = secrets
            .get_opt(&r.name)
            .await
            .map_err(|source| CliError::Api {
                what: format!("Secret {ns}/{} ({field})", r.name),
                source,
            })?
            .ok_or_else(|| CliError::Usage {
                flag: "--name",
                message: format!(
                    "{field}: Secret '{}' not found in namespace '{ns}'; create it with key '{}'",
                    r.name, r.key
                ),
            })?;
        // The CLI runs with whoever's kubeconfig: it sends a Secret only where the Secret's
        // owner allowed this flow to send it, exactly as the operator does.
        crate::operator::guards::secret_grant(&secret, name, &mf.spec, &field, &ns).map_err(
            |b| CliError::Usage {
                flag: "--name",
                message: b.message,
            },
        )?;
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&r.key))
            .ok_or_else(|| CliError::Usage {
                flag: "--name",
                message: format!(
                    "{field}: Secret '{}' in namespace '{ns}' has no key '{}'; add it",
                    r.name, r.key
                ),
            })?;
        // Values are credentials: kept in memory only, never printed.
        values.insert((r.name.clone(), r.key.clone()), bytes.0.clone());
    }
    let full = format!("{ns}/{name}");
    let mut resolved = flow::resolve(
        full.clone(),
        mf.spec.clone(),
        &SecretFiles::from_values(values),
    )?;
    resolved.writer = flow::writer_of(&full, &mf.metadata);
    Ok(resolved)
}

/// Applies the MirrorFlow in `path` on the apiserver of the kubeconfig (server-side apply, in
/// its own namespace or `namespace`); returns its `namespace/name`.
pub fn apply_flow_file(path: &Path, namespace: Option<&str>) -> Result<String, CliError> {
    use kube::ResourceExt;
    let usage = |message: String| CliError::Usage {
        flag: "--reverse-flow-file",
        message,
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
    let mut mf: MirrorFlow = serde_yaml::from_str(&text)
        .map_err(|e| usage(format!("{} is not a MirrorFlow: {e}", path.display())))?;
    flow::validate(&mf.spec)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let client = kube::Client::try_default()
            .await
            .map_err(|source| CliError::Kubeconfig { source })?;
        let ns = mf
            .namespace()
            .or(namespace.map(str::to_string))
            .unwrap_or_else(|| client.default_namespace().to_string());
        let name = mf.name_any();
        mf.metadata.namespace = Some(ns.clone());
        mf.metadata.managed_fields = None;
        mf.metadata.resource_version = None;
        mf.status = None;
        let api = kube::Api::<MirrorFlow>::namespaced(client, &ns);
        let params = kube::api::PatchParams::apply("mirrorflow-switchover").force();
        api.patch(&name, &params, &kube::api::Patch::Apply(&mf))
            .await
            .map_err(|source| CliError::Api {
                what: format!("applying MirrorFlow {ns}/{name}"),
                source,
            })?;
        Ok(format!("{ns}/{name}"))
    })
}

/// Prints a serializable report as pretty JSON on stdout.
pub fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    use std::io::Write;
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    Ok(())
}

/// Prints text on stdout, reporting a closed pipe as an error instead of panicking.
pub fn print_text(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_names_are_recognised_from_any_path() {
        assert_eq!(
            plugin_bin_name(OsStr::new("/usr/local/bin/kubectl-mirrorflow")).as_deref(),
            Some("kubectl mirrorflow")
        );
        assert_eq!(
            plugin_bin_name(OsStr::new("kubectl-mf")).as_deref(),
            Some("kubectl mf")
        );
        assert_eq!(plugin_bin_name(OsStr::new("/bin/mirrorflow")), None);
        assert_eq!(plugin_bin_name(OsStr::new("")), None);
    }

    #[test]
    fn a_missing_secret_with_a_flow_file_names_the_secrets_dir_flag() {
        let dir = std::env::temp_dir().join(format!("mf-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("flow.yaml");
        std::fs::write(
            &file,
            "source: {alias: a, bootstrapServers: 'x:1', sasl: {mechanism: PLAIN, \
             usernameSecretRef: {name: creds, key: user}, passwordSecretRef: {name: creds, key: pw}}}\n\
             target: {alias: b, bootstrapServers: 'y:1'}\n",
        )
        .unwrap();
        let args = FlowArgs {
            flow_file: Some(file),
            secrets_dir: Some(dir.join("none")),
            name: None,
            namespace: None,
        };
        let err = load_flow(&args).unwrap_err().to_string();
        assert!(
            err.starts_with("--secrets-dir") && err.contains("creds"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
