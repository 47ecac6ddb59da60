use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

use mirrorflow::kafka::{DEFAULT_SECRETS_DIR, SecretFiles};
use mirrorflow::replicator;

/// MirrorFlow: Kafka replication with a failover-readiness status.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Log format: text for terminals, json for clusters.
    #[arg(
        long,
        global = true,
        env = "MIRRORFLOW_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum DocsCommand {
    /// The CRD reference as Markdown (docs/crd-reference.md): every field, its type, default,
    /// validation and description.
    Crd,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Print the MirrorFlow CustomResourceDefinition as YAML.
    Crd,
    /// Print generated documentation.
    #[command(subcommand)]
    Docs(DocsCommand),
    /// Run a flow's replicator: source, checkpoint and heartbeat loops.
    Replicate {
        /// The flow: a MirrorFlow resource or just its spec, as YAML.
        #[arg(long, short = 'c', env = "MIRRORFLOW_CONFIG")]
        config: PathBuf,
        /// Folder with the Secrets the flow references, as `<secret>/<key>` files.
        #[arg(long, env = "MIRRORFLOW_SECRETS_DIR", default_value = DEFAULT_SECRETS_DIR)]
        secrets_dir: PathBuf,
        /// Address of /metrics, /healthz and /readyz.
        #[arg(long, env = "MIRRORFLOW_LISTEN", default_value = "127.0.0.1:9464")]
        listen: SocketAddr,
        /// This replica's name (in a pod: the pod name). Given, it must be stable and its
        /// own: the replica joins the source group as a static member under it, so a restart
        /// moves no partition. Left out: the host name, and dynamic membership.
        #[arg(long, env = "MIRRORFLOW_REPLICA")]
        replica: Option<String>,
    },
    /// Run the operator: reconcile MirrorFlows into replicators and report their status.
    Operator {
        /// Address of /metrics, /healthz and /readyz.
        #[arg(long, env = "MIRRORFLOW_LISTEN", default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        /// Image of the replicator pods.
        #[arg(
            long,
            env = "MIRRORFLOW_REPLICATOR_IMAGE",
            default_value = "mirrorflow:dev"
        )]
        replicator_image: String,
        /// Image prefixes a flow may choose with spec.pod.image, comma-separated (the
        /// replicator image is always allowed; default: no other).
        #[arg(
            long,
            env = "MIRRORFLOW_ALLOWED_IMAGE_PREFIXES",
            value_delimiter = ',',
            default_value = ""
        )]
        allowed_image_prefixes: Vec<String>,
        /// Label and annotation keys a flow may put on its replicator pods, comma-separated:
        /// exact keys, prefixes ending in `/` or `*`, or `*` for any (default: none). The pods
        /// mount the flow's Secrets, and labels and annotations steer meshes, AppArmor,
        /// Services and NetworkPolicies.
        #[arg(
            long,
            env = "MIRRORFLOW_ALLOWED_POD_METADATA_KEYS",
            value_delimiter = ',',
            default_value = ""
        )]
        allowed_pod_metadata_keys: Vec<String>,
        /// Resources of a replicator container whose flow sets no `spec.resources`: requests,
        /// comma-separated `name=quantity` (cpu, memory, ephemeral-storage).
        #[arg(
            long,
            env = "MIRRORFLOW_REPLICATOR_DEFAULT_REQUESTS",
            value_delimiter = ',',
            default_value = "cpu=100m,memory=128Mi"
        )]
        replicator_default_requests: Vec<String>,
        /// ... and limits; memory is required: every replicator container gets a memory limit
        /// (a flow that sets resources without one gets this one).
        #[arg(
            long,
            env = "MIRRORFLOW_REPLICATOR_DEFAULT_LIMITS",
            value_delimiter = ',',
            default_value = "cpu=2,memory=512Mi"
        )]
        replicator_default_limits: Vec<String>,
        /// The most a flow may request or be limited to per replicator container,
        /// comma-separated `name=quantity`; a flow asking for more is refused
        /// (ResourcesNotAllowed). A resource not named is unbounded.
        #[arg(
            long,
            env = "MIRRORFLOW_REPLICATOR_MAX_RESOURCES",
            value_delimiter = ',',
            default_value = ""
        )]
        replicator_max_resources: Vec<String>,
        /// Refuse flows that request a resource without limiting it.
        #[arg(
            long,
            env = "MIRRORFLOW_REPLICATOR_REQUIRE_LIMITS",
            default_value_t = false
        )]
        replicator_require_limits: bool,
        /// The NetworkPolicy per flow in front of its replicator pods, as JSON: `{"enabled":
        /// true, "metricsFrom": [NetworkPolicyPeer...], "egressCidrs": ["10.0.0.0/8"...],
        /// "dnsTo": [NetworkPolicyPeer...]}` (the chart renders it). Empty: none.
        #[arg(long, env = "MIRRORFLOW_REPLICATOR_NETWORK_POLICY", default_value = "")]
        replicator_network_policy: String,
        /// CIDR blocks every address of a flow's bootstrap servers must be in before the
        /// operator connects to them, comma-separated (default: any address not denied).
        #[arg(
            long,
            env = "MIRRORFLOW_PROBE_ALLOW_CIDRS",
            value_delimiter = ',',
            default_value = ""
        )]
        probe_allow_cidrs: Vec<String>,
        /// CIDR blocks no address of a flow's bootstrap servers may be in (e.g. the cloud
        /// metadata address 169.254.169.254/32); also kept out of replicator egress when the
        /// replicator NetworkPolicy is on.
        #[arg(
            long,
            env = "MIRRORFLOW_PROBE_DENY_CIDRS",
            value_delimiter = ',',
            default_value = ""
        )]
        probe_deny_cidrs: Vec<String>,
        /// Seconds a replicator pod's node may stay lost (its Ready condition Unknown) before
        /// the operator deletes the pod so its StatefulSet starts it on a node that answers;
        /// 0: never (a person deletes it).
        #[arg(
            long,
            env = "MIRRORFLOW_REPLICA_REPLACE_AFTER_SECONDS",
            default_value_t = 60
        )]
        replica_replace_after_seconds: u64,
        /// Watch only this namespace (default: all).
        #[arg(long, env = "MIRRORFLOW_WATCH_NAMESPACE")]
        watch_namespace: Option<String>,
        /// Hold a Lease before reconciling, so several operator replicas can run.
        #[arg(long, env = "MIRRORFLOW_LEADER_ELECTION", default_value_t = false)]
        leader_election: bool,
    },
    /// Print where consumer groups resume on the target: their newest checkpoints.
    Translate(mirrorflow::cli::translate::TranslateArgs),
    /// Move consumer groups to the target at their checkpoints (dry run unless --apply).
    #[command(long_about = mirrorflow::cli::failover::FAILOVER_HELP)]
    Failover(mirrorflow::cli::failover::FailoverArgs),
    /// Move consumer groups back to the source after a failover (dry run unless --apply).
    #[command(long_about = mirrorflow::cli::failback::FAILBACK_HELP)]
    Failback(mirrorflow::cli::failback::FailbackArgs),
    /// Rehearse a failover in drill groups on the target; no real group changes.
    #[command(long_about = mirrorflow::cli::drill::DRILL_HELP)]
    Drill(mirrorflow::cli::drill::DrillArgs),
    /// Start a flow where a MirrorMaker 2 stopped, instead of copying again (dry run unless --apply).
    #[command(long_about = mirrorflow::cli::takeover::TAKEOVER_HELP)]
    Takeover(mirrorflow::cli::takeover::TakeoverArgs),
    /// Move producers and consumers to the target with nothing lost, skipped or read twice
    /// (dry run unless --apply).
    #[command(long_about = mirrorflow::cli::switchover::SWITCHOVER_HELP)]
    Switchover(mirrorflow::cli::switchover::SwitchoverArgs),
    /// Show a flow's failover readiness: conditions, lags and the least-ready groups.
    Status(mirrorflow::cli::status::StatusArgs),
}

fn init_logs(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// The replicator's heap arenas ([`mirrorflow_rdkafka_ext::heap::limit_arenas`]): two, for its
/// two busy threads (the copy thread and the source's broker thread); the others allocate little.
const REPLICATOR_ARENAS: i32 = 2;

/// The `replicate` command: one replica of a flow, until a signal stops it.
fn replicate(
    config: PathBuf,
    secrets_dir: PathBuf,
    listen: SocketAddr,
    replica: Option<String>,
) -> anyhow::Result<()> {
    // Before the runtime and the Kafka clients start their threads.
    mirrorflow_rdkafka_ext::heap::limit_arenas(REPLICATOR_ARENAS);
    let file = mirrorflow::flow::load_file(&config)?;
    let mut flow = mirrorflow::flow::resolve(file.name, file.spec, &SecretFiles::new(secrets_dir))?;
    flow.writer = file.writer;
    let static_membership = replica.is_some();
    let replica =
        replica.unwrap_or_else(|| std::env::var("HOSTNAME").unwrap_or_else(|_| "replica-0".into()));
    let mut ctx = replicator::Context::new(flow, replica).context("creating metrics")?;
    ctx.static_membership = static_membership;
    let ctx = Arc::new(ctx);
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        tokio::spawn(stop_on_signal(shutdown.clone()));
        replicator::run(ctx, listen, shutdown).await
    })
}

fn main() -> anyhow::Result<()> {
    // librdkafka's reads of compressed batches go to the bounded inflaters: this reference is
    // what makes the linker take them (with build.rs's `--wrap`s) over librdkafka's own.
    std::hint::black_box(mirrorflow_rdkafka_ext::inflater::linked());
    // Invoked as `kubectl-mirrorflow` (kubectl's plugin lookup), help and errors say
    // `kubectl mirrorflow`.
    let mut command = Cli::command();
    if let Some(name) = std::env::args_os()
        .next()
        .and_then(|a| mirrorflow::cli::plugin_bin_name(&a))
    {
        command = command.bin_name(name);
    }
    let cli = Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    let default_filter = match cli.command {
        Command::Translate(_)
        | Command::Failover(_)
        | Command::Failback(_)
        | Command::Drill(_)
        | Command::Takeover(_)
        | Command::Switchover(_)
        | Command::Status(_) => mirrorflow::cli::LOG_FILTER,
        _ => "info",
    };
    init_logs(cli.log_format, default_filter);
    match cli.command {
        Command::Crd => print!("{}", mirrorflow::api::crd::crd_yaml()?),
        Command::Docs(DocsCommand::Crd) => {
            print!("{}", mirrorflow::api::reference::crd_markdown()?)
        }
        Command::Replicate {
            config,
            secrets_dir,
            listen,
            replica,
        } => {
            replicator::last_words::on_panic();
            replicator::last_words::record(replicate(config, secrets_dir, listen, replica))?;
        }
        Command::Operator {
            listen,
            replicator_image,
            allowed_image_prefixes,
            allowed_pod_metadata_keys,
            replicator_default_requests,
            replicator_default_limits,
            replicator_max_resources,
            replicator_require_limits,
            replicator_network_policy,
            probe_allow_cidrs,
            probe_deny_cidrs,
            replica_replace_after_seconds,
            watch_namespace,
            leader_election,
        } => {
            let leader_election = if leader_election {
                let ns = std::env::var("POD_NAMESPACE").context(
                    "leader election needs POD_NAMESPACE (set it from the downward API)",
                )?;
                let holder = std::env::var("POD_NAME")
                    .or_else(|_| std::env::var("HOSTNAME"))
                    .context("leader election needs POD_NAME")?;
                Some((ns, holder))
            } else {
                None
            };
            let resources = mirrorflow::operator::guards::ResourcePolicy::from_flags(
                &replicator_default_requests,
                &replicator_default_limits,
                &replicator_max_resources,
                replicator_require_limits,
            )
            .map_err(|e| anyhow::anyhow!("replicator resources: {e}"))?;
            let network = mirrorflow::operator::network::ReplicatorNetwork::from_json(
                &replicator_network_policy,
            )
            .map_err(|e| anyhow::anyhow!("replicator network policy: {e}"))?;
            let addresses = mirrorflow::operator::guards::addresses::AddressPolicy::from_flags(
                &probe_allow_cidrs,
                &probe_deny_cidrs,
            )
            .map_err(|e| anyhow::anyhow!("probe addresses: {e}"))?;
            let network = network.with_denied(&addresses.deny);
            let runtime = mirrorflow::operator::runtime()?;
            runtime.block_on(mirrorflow::operator::run(mirrorflow::operator::Options {
                listen,
                replicator_image,
                allowed_image_prefixes: allowed_image_prefixes
                    .into_iter()
                    .map(|p| p.trim().to_string())
                    .filter(|p| !p.is_empty())
                    .collect(),
                allowed_pod_metadata_keys: allowed_pod_metadata_keys
                    .into_iter()
                    .map(|p| p.trim().to_string())
                    .filter(|p| !p.is_empty())
                    .collect(),
                resources,
                network,
                addresses,
                replace_after: (replica_replace_after_seconds > 0)
                    .then(|| std::time::Duration::from_secs(replica_replace_after_seconds)),
                watch_namespace: watch_namespace.filter(|n| !n.is_empty()),
                leader_election,
            }))?;
        }
        Command::Translate(args) => exit_with(mirrorflow::cli::translate::run(&args)),
        Command::Failover(args) => exit_with(mirrorflow::cli::failover::run(&args)),
        Command::Failback(args) => exit_with(mirrorflow::cli::failback::run(&args)),
        Command::Drill(args) => exit_with(mirrorflow::cli::drill::run(&args)),
        Command::Takeover(args) => exit_with(mirrorflow::cli::takeover::run(&args)),
        Command::Switchover(args) => exit_with(mirrorflow::cli::switchover::run(&args)),
        Command::Status(args) => exit_with(mirrorflow::cli::status::run(&args)),
    }
    Ok(())
}

/// Ends a CLI command with its exit status (0 returns normally).
fn exit_with(result: Result<i32, mirrorflow::cli::CliError>) {
    let code = mirrorflow::cli::exit_code(result);
    if code != 0 {
        std::process::exit(code);
    }
}

/// SIGTERM (pod deletion) and Ctrl-C both mean: flush, store positions, exit 0.
async fn stop_on_signal(shutdown: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops gracefully");
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt: shutting down"),
    }
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_binary_links_librdkafka_to_the_bounded_inflaters() {
        assert!(
            mirrorflow_rdkafka_ext::inflater::wrapped_here(),
            "librdkafka's lz4, zstd and snappy inflaters are its own: build.rs's --wrap flags did not apply"
        );
    }
}
