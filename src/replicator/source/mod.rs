//! The source loop (being built; see the issue for the contract).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Context;

pub async fn run(_ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    shutdown.cancelled().await;
    Ok(())
}
