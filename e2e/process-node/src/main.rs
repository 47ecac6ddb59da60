//! mirrorflow-process-node: the test world's scheduler and kubelet for one fake Node.
//! See README.md next to Cargo.toml for the CLI, the image rule and the state-dir layout.

mod kubelet;
mod node;
mod podinit;
mod scheduler;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use clap::Parser;
use jiff::Timestamp;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use nix::fcntl::{Flock, FlockArg};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::info;

use kubelet::env::NodeFacts;

/// Plays scheduler and kubelet for one Node: binds pending pods to it and runs their
/// containers as local processes.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// Kubeconfig with rights to nodes, leases, pods, pods/status, pods/binding,
    /// configmaps, secrets and serviceaccounts/token.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Name of the Node object this process plays.
    #[arg(long, default_value = "mirrorflow-node")]
    node_name: String,
    /// Where pod dirs, logs and pid files go (created if missing).
    #[arg(long)]
    state_dir: PathBuf,
    /// YAML file with image rules tried before the built-in ones (see README).
    #[arg(long)]
    image_map: Option<PathBuf>,
    /// Host executable for `mirrorflow` images. Default: `mirrorflow` next to this binary.
    #[arg(long)]
    mirrorflow_binary: Option<PathBuf>,
    /// KUBERNETES_SERVICE_HOST given to pods. Default: the kubeconfig server's host.
    #[arg(long)]
    apiserver_host: Option<String>,
    /// KUBERNETES_SERVICE_PORT given to pods. Default: the kubeconfig server's port.
    #[arg(long)]
    apiserver_port: Option<u16>,
    /// Loopback addresses handed out as pod IPs, FIRST-LAST.
    #[arg(long, default_value = "127.0.1.1-127.0.1.254")]
    pod_ip_range: String,
}

fn main() -> anyhow::Result<()> {
    // Hidden: the per-container wrapper (see podinit.rs); only returns on failure.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("pod-init") {
        let code = podinit::run(args.get(2).map(String::as_str).unwrap_or_default());
        std::process::exit(code);
    }
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    tokio::runtime::Runtime::new()?.block_on(run(cli))
}

fn memory_bytes() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(8.0 * 1024.0 * 1024.0 * 1024.0, |kb| kb * 1024.0)
}

fn default_mirrorflow_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("mirrorflow")))
        .unwrap_or_else(|| PathBuf::from("mirrorflow"))
}

async fn client(path: &Path) -> anyhow::Result<(Client, Config)> {
    let kc = Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading kubeconfig {}", path.display()))?;
    let client = Client::try_from(config.clone()).context("building the kube client")?;
    Ok((client, config))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let (client, config) = client(&cli.kubeconfig).await?;
    let apiserver_host = cli
        .apiserver_host
        .or_else(|| {
            config
                .cluster_url
                .host()
                .map(|h| h.trim_matches(['[', ']']).to_string())
        })
        .unwrap_or_else(|| "127.0.0.1".into());
    let apiserver_port = cli
        .apiserver_port
        .or_else(|| config.cluster_url.port_u16())
        .unwrap_or(443);
    let facts = NodeFacts {
        node_name: cli.node_name.clone(),
        host_ip: "127.0.0.1".into(),
        apiserver_host,
        apiserver_port,
        cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get()) as f64,
        memory_bytes: memory_bytes(),
    };
    std::fs::create_dir_all(cli.state_dir.join("pods"))
        .with_context(|| format!("creating state dir {}", cli.state_dir.display()))?;
    let state_dir = std::fs::canonicalize(&cli.state_dir)?;
    // One node per state dir: a second one would kill and double-run the first one's pods.
    let lock_file = std::fs::File::create(state_dir.join("node.lock"))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        anyhow::anyhow!(
            "state dir {} is in use by another process node: {e}",
            state_dir.display()
        )
    })?;
    let pids = kubelet::process::PidFiles::new(&state_dir)?;
    let orphans = pids.kill_orphans();
    if orphans > 0 {
        info!(
            count = orphans,
            "killed container processes left by an earlier run"
        );
    }
    let mirrorflow = cli
        .mirrorflow_binary
        .unwrap_or_else(default_mirrorflow_binary);
    let images = kubelet::image::ImageMap::load(cli.image_map.as_deref(), &mirrorflow)?;
    let pool = kubelet::ippool::IpPool::parse(&cli.pod_ip_range)?;
    info!(
        node = %facts.node_name,
        state_dir = %state_dir.display(),
        apiserver = %format!("{}:{}", facts.apiserver_host, facts.apiserver_port),
        mirrorflow = %mirrorflow.display(),
        "process node starting"
    );

    let since = Timestamp::now();
    let uid = node::register(&client, &facts, since)
        .await
        .context("registering the node")?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let keep_alive = tokio::spawn(node::keep_alive(
        client.clone(),
        facts.clone(),
        uid,
        since,
        stop_rx.clone(),
    ));
    let scheduler = tokio::spawn(scheduler::run(
        client.clone(),
        facts.node_name.clone(),
        stop_rx.clone(),
    ));
    let shared = Arc::new(kubelet::Shared {
        client,
        node: facts,
        state_dir,
        images,
        pool: Mutex::new(pool),
        pids,
    });
    let kubelet = tokio::spawn(kubelet::run(shared, stop_rx));

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: stopping all pods"),
        _ = int.recv() => info!("SIGINT: stopping all pods"),
    }
    let _ = stop_tx.send(true);
    let _ = kubelet.await;
    let _ = scheduler.await;
    let _ = keep_alive.await;
    info!("process node stopped");
    Ok(())
}
