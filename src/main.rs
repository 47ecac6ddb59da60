use clap::{Parser, Subcommand};

/// MirrorFlow: Kafka replication with a failover-readiness status.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the version and exit.
    Version,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Version => println!("mirrorflow {}", env!("CARGO_PKG_VERSION")),
    }
    Ok(())
}
