//! `mirrorflow status`: a flow's failover readiness as a table, once or refreshed.
//!
//! With `--name` it draws the status the operator wrote on the `MirrorFlow` (what `kubectl
//! describe mf` shows, laid out as a report). With `--flow-file` there is no operator: it runs
//! the operator's own probe and condition rules against the two clusters from here, so a flow
//! run with `mirrorflow replicate` (or by MirrorMaker 2) gets the same verdict. Replicator pods
//! are unknown then, so readiness is judged as in `mode: Observe`: by what the clusters show.

use std::io::IsTerminal;
use std::time::Duration;

use clap::Args;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::table::Table;
use super::{CliError, FlowArgs, OutputFormat, load_flow, print_json, print_text};
use crate::api::{MirrorFlow, MirrorFlowStatus};
use crate::status::probe;
use crate::status::{self as conditions, Observation};

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub flow: FlowArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: OutputFormat,
    /// Redraw every SECONDS until interrupted (or --count draws).
    #[arg(long, short = 'w', value_name = "SECONDS")]
    pub watch: Option<u64>,
    /// With --watch: stop after this many draws.
    #[arg(long, value_name = "N", requires = "watch")]
    pub count: Option<u64>,
}

pub fn run(args: &StatusArgs) -> Result<i32, CliError> {
    if args.watch == Some(0) {
        return Err(CliError::Usage {
            flag: "--watch",
            message: "the refresh interval must be at least 1 second".into(),
        });
    }
    let clear = args.watch.is_some()
        && args.output == OutputFormat::Table
        && std::io::stdout().is_terminal();
    let mut drawn = 0u64;
    loop {
        let (title, status) = measure(args)?;
        match args.output {
            OutputFormat::Json => print_json(&status)?,
            OutputFormat::Table => {
                let mut text = String::new();
                if clear {
                    // Home and clear: a refreshed report replaces the old one, like `watch`.
                    text.push_str("\x1b[H\x1b[2J");
                }
                text.push_str(&render(&title, &status));
                print_text(&text)?;
            }
        }
        drawn += 1;
        match (args.watch, args.count) {
            (None, _) => break,
            (Some(_), Some(n)) if drawn >= n => break,
            (Some(secs), _) => std::thread::sleep(Duration::from_secs(secs)),
        }
    }
    Ok(0)
}

/// The flow's name and status, from the apiserver or measured here.
fn measure(args: &StatusArgs) -> Result<(String, MirrorFlowStatus), CliError> {
    if let (None, Some(name)) = (&args.flow.flow_file, &args.flow.name) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (ns, mf) = runtime.block_on(fetch(name, args.flow.namespace.as_deref()))?;
        let title = format!("{ns}/{name} (as the operator measured it)");
        return Ok((title, mf.status.unwrap_or_default()));
    }
    let flow = load_flow(&args.flow)?;
    let mut obs = Observation {
        observe_only: true,
        aligned: flow.spec.offsets == crate::api::OffsetsMode::Aligned,
        heartbeats_enabled: flow.spec.heartbeats.enabled,
        checkpoints_enabled: flow.spec.checkpoints.enabled,
        ..Observation::default()
    };
    // The CLI waits as long as the operator would for one probe.
    probe::observe(&flow, probe::Budget::new(probe::PROBE_BUDGET)).record_into(&mut obs);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let status = conditions::status(None, &obs, &flow.spec.failover_readiness, None, &now);
    Ok((
        format!("{} (measured from the clusters now)", flow.name),
        status,
    ))
}

async fn fetch(name: &str, namespace: Option<&str>) -> Result<(String, MirrorFlow), CliError> {
    let (_, ns, mf) = super::fetch_flow(name, namespace).await?;
    Ok((ns, mf))
}

/// The report: conditions, the measured figures, then the least-ready groups.
pub fn render(title: &str, status: &MirrorFlowStatus) -> String {
    let mut out = format!("FLOW {title}\n\n");
    let mut conditions = Table::new(&["CONDITION", "STATUS", "REASON", "MESSAGE"]);
    for c in &status.conditions {
        conditions.row(vec![
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
        ]);
    }
    if conditions.is_empty() {
        out.push_str("no conditions yet: the operator has not reconciled this flow\n");
    } else {
        out.push_str(&conditions.render());
    }
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let mut figures = Table::new(&[
        "HEARTBEAT-LAG",
        "NEWEST-CKPT",
        "OLDEST-CKPT",
        "TOPICS",
        "GROUPS",
        "REPLICATION-LAG",
    ]);
    figures.row(vec![
        or_dash(status.heartbeat.as_ref().and_then(|h| h.lag.clone())),
        or_dash(
            status
                .checkpoints
                .as_ref()
                .and_then(|c| c.newest_age.clone()),
        ),
        or_dash(
            status
                .checkpoints
                .as_ref()
                .and_then(|c| c.oldest_age.clone()),
        ),
        or_dash(status.topics.map(|t| t.to_string())),
        or_dash(status.groups.map(|g| g.to_string())),
        or_dash(status.replication_lag.map(|l| l.to_string())),
    ]);
    out.push('\n');
    out.push_str(&figures.render());
    if !status.least_ready_groups.is_empty() {
        let mut groups = Table::new(&["GROUP", "REASON", "CKPT-AGE", "RE-READ", "MESSAGE"]);
        for g in &status.least_ready_groups {
            groups.row(vec![
                g.group.clone(),
                g.reason.clone(),
                g.checkpoint_age.clone(),
                g.estimated_replay_records.to_string(),
                g.message.clone(),
            ]);
        }
        out.push_str("\nLEAST-READY GROUPS\n");
        out.push_str(&groups.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CheckpointsStatus, GroupReadiness, HeartbeatStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    #[test]
    fn the_report_shows_conditions_figures_and_groups_in_that_order() {
        let status = MirrorFlowStatus {
            conditions: vec![Condition {
                type_: "FailoverReady".into(),
                status: "False".into(),
                reason: "CheckpointsStale".into(),
                message: "1 of 2 groups not ready".into(),
                observed_generation: None,
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }],
            heartbeat: Some(HeartbeatStatus {
                lag: Some("2s".into()),
                last_heartbeat_time: None,
            }),
            checkpoints: Some(CheckpointsStatus {
                newest_age: Some("0s".into()),
                oldest_age: Some("1m5s".into()),
            }),
            topics: Some(3),
            groups: Some(2),
            replication_lag: None,
            least_ready_groups: vec![GroupReadiness {
                group: "billing".into(),
                checkpoint_age: "1m5s".into(),
                estimated_replay_records: 40,
                reason: "CheckpointStale".into(),
                message: "newest checkpoint is 1m5s old".into(),
                ..GroupReadiness::default()
            }],
            ..MirrorFlowStatus::default()
        };
        let text = render("demo/demo", &status);
        let at = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s} in {text}"));
        assert!(at("FLOW demo/demo") < at("FailoverReady"));
        assert!(at("CheckpointsStale") < at("HEARTBEAT-LAG"));
        assert!(at("1m5s") < at("LEAST-READY GROUPS"));
        assert!(at("LEAST-READY GROUPS") < at("billing"));
        let figures = text
            .lines()
            .skip_while(|l| !l.starts_with("HEARTBEAT-LAG"))
            .nth(1)
            .unwrap_or_default();
        assert!(
            figures.starts_with("2s") && figures.trim_end().ends_with('-'),
            "{figures}"
        );
    }

    #[test]
    fn an_unreconciled_flow_says_so() {
        let text = render("ns/f", &MirrorFlowStatus::default());
        assert!(text.contains("no conditions yet"), "{text}");
    }
}
