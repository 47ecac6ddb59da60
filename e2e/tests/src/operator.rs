//! Installing the operator's chart for a test and reading a flow's conditions.

use anyhow::{Context, Result};
use mirrorflow::api::MirrorFlow;

use crate::{World, run};

/// Installs the chart as release `mirrorflow` into `ns` (created), running the locally built
/// binary; the operator watches only `ns`, so it never touches other tests' flows.
pub fn install_operator(world: &World, ns: &str) -> Result<()> {
    let chart = world.repo_root.join("charts/mirrorflow");
    let chart = chart.to_str().context("chart path")?;
    let watch = format!("watchNamespace={ns}");
    run(
        "helm",
        &[
            "install",
            "mirrorflow",
            chart,
            "-n",
            ns,
            "--create-namespace",
            "--wait",
            "--timeout",
            "180s",
            "--set",
            "image.repository=mirrorflow",
            "--set",
            "image.tag=dev",
            "--set",
            "listenHost=$(POD_IP)",
            "--set",
            &watch,
        ],
    )
    .map(|_| ())
}

/// (status, reason, message) of the flow's condition `type_`.
pub fn condition(mf: &MirrorFlow, type_: &str) -> Option<(String, String, String)> {
    let c = mf
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}
