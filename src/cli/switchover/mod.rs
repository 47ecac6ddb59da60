//! `mirrorflow switchover`: a planned move from the flow's source to its target with nothing
//! lost, skipped or read twice.
//!
//! Steps, each reported with its duration:
//! 1. **fence**: writes to the flow's source topics are denied to the given principals (one
//!    DENY WRITE ACL per topic and principal, on the source), or the user's own fence command
//!    runs (`--fence-command`, for clusters without an authorizer);
//! 2. **drain**: waits until every source record is on the target (the flow's stored
//!    positions reach the source's last records) and each selected group's newest checkpoint is
//!    exact (a failover re-reads and skips nothing), twice in a row with the groups' source
//!    commits unchanged between;
//! 3. **commit**: the checkpoints are committed into the target groups, as `failover --apply`;
//! 4. **reverse** (`--reverse-flow-file`, with `--name`): the reverse flow is applied on the
//!    apiserver, so records written on the target from now on flow back.
//!
//! `--abort` undoes the fence: it deletes the DENY WRITE ACLs of the given principals on the
//! flow's topics (a switchover refuses to start while such ACLs exist, so they are its own),
//! or runs the fence command with `unfence`.

mod fence;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::consumer::Consumer;
use serde::Serialize;

use super::apply::GroupAction;
use super::clusters;
use super::failover::{self, FailoverReport, Landing, Range};
use super::records::{kafka_error, read_range, reader};
use super::{ApplyArgs, CliError, EXIT_REFUSED, FlowArgs, GroupSelection, OutputFormat};
use crate::flow::Flow;
use crate::kafka::positions::{PositionReader, positions_topic};
use crate::mm2::TopicDecision;

const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_EVERY: Duration = Duration::from_millis(500);
/// Up to this many offsets behind, the records are read and counted; beyond, the offsets
/// stand for them (an upper bound), so a drain far behind reads nothing it does not need.
const COUNTED_BELOW: i64 = 1000;
/// `mirrorflow switchover`.
#[derive(Args, Debug, Clone)]
pub struct SwitchoverArgs {
    #[command(flatten)]
    pub flow: FlowArgs,
    /// A consumer group to move (repeat the flag for more).
    #[arg(long, value_name = "G", required_unless_present_any = ["all_groups", "abort"])]
    pub group: Vec<String>,
    /// Every group with checkpoints that passes the flow's group filter.
    #[arg(long, conflicts_with = "group")]
    pub all_groups: bool,
    /// A producer principal whose writes to the flow's source topics are denied while
    /// switching over, e.g. `User:orders-app` (repeat the flag for more).
    #[arg(long = "deny-principal", value_name = "PRINCIPAL")]
    pub principals: Vec<String>,
    /// Instead of ACLs: a shell command that stops the producers (clusters without an
    /// authorizer). Run as `sh -c` with MIRRORFLOW_SWITCHOVER_STEP=fence (unfence for
    /// --abort) and MIRRORFLOW_TOPICS (the source topics, comma-separated); exit 0 when done.
    #[arg(long, value_name = "CMD", conflicts_with = "principals")]
    pub fence_command: Option<String>,
    /// How long to wait for the copy and the checkpoints to catch up.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub timeout: u64,
    /// With --name: a MirrorFlow (file) to apply once the groups moved, replicating back.
    #[arg(long, value_name = "FILE", requires = "name")]
    pub reverse_flow_file: Option<std::path::PathBuf>,
    /// Do it. Without it nothing is written: the plan and the current lag are printed.
    #[arg(long)]
    pub apply: bool,
    /// Undo a switchover's fence (delete its ACLs, or run the fence command with unfence).
    #[arg(long, conflicts_with = "apply")]
    pub abort: bool,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// The command's long help (`mirrorflow switchover --help`).
pub const SWITCHOVER_HELP: &str = "\
Move a flow's producers and consumers from its source to its target with nothing lost,
skipped or read twice: a planned switchover.

Steps (each reported with its duration):
  fence    writes to the flow's source topics are denied to the --deny-principal principals
           (a DENY WRITE ACL per topic and principal, on the source; the principal running
           this command needs ALTER on the source cluster), or --fence-command runs;
  drain    waits (up to --timeout) until every source record is on the target and every
           selected group's checkpoint is exact: a failover re-reads and skips nothing;
  commit   commits those checkpoints into the target groups (as failover --apply);
  reverse  with --name and --reverse-flow-file: applies the reverse flow.

Stop the consumers on the source once they read everything (or let the command find their
last commits), then start them on the target; point the producers at the target.

Dry run by default: prints which ACLs would be created and how far the copy and the
checkpoints are. --abort deletes the fence's ACLs (or runs the fence command with unfence):
producers may write to the source again. A switchover refuses to start while a DENY WRITE ACL
of those principals on those topics exists already, so --abort removes only its own.

Examples:
  mirrorflow switchover --name orders --all-groups --deny-principal User:orders-app
  mirrorflow switchover --name orders --all-groups --deny-principal User:orders-app --apply \\
      --reverse-flow-file orders-back.yaml
  mirrorflow switchover --name orders --deny-principal User:orders-app --abort

Exit status: 0 when every step was done (or would be), 3 when a step failed or timed out
(the fence stays: fix what the report says and run again, or --abort), 1 on errors.";

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    Done,
    Planned,
    Failed,
    Skipped,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub name: &'static str,
    pub outcome: Outcome,
    pub millis: u64,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SwitchoverReport {
    pub source: String,
    pub target: String,
    pub dry_run: bool,
    pub aborted: bool,
    pub steps: Vec<Step>,
    /// The DENY WRITE ACLs created (or, dry run and abort, that would be / were deleted).
    pub fence: Vec<FencedTopic>,
    /// Source records not yet on the target when the drain ended, per partition with any.
    pub not_copied: BTreeMap<String, i64>,
    /// The commit step's per-group plan (failover's report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<FailoverReport>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FencedTopic {
    pub topic: String,
    pub principal: String,
}

impl SwitchoverReport {
    fn failed(&self) -> bool {
        self.steps.iter().any(|s| s.outcome == Outcome::Failed)
    }

    /// A step done (`Ok`) or failed (`Err`), with what it said.
    fn ended(&mut self, name: &'static str, started: Instant, result: Result<String, String>) {
        match result {
            Ok(d) => self.step(name, started, Outcome::Done, d),
            Err(d) => self.step(name, started, Outcome::Failed, d),
        }
    }

    fn step(&mut self, name: &'static str, started: Instant, outcome: Outcome, detail: String) {
        self.steps.push(Step {
            name,
            outcome,
            millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            detail,
        });
    }
}

/// The groups whose failover is not exact yet, with why (empty: every group is exact).
pub fn not_exact(report: &FailoverReport) -> Vec<String> {
    let mut out = Vec::new();
    for g in &report.groups {
        if g.verdict.action.is_failure() {
            out.push(format!("{}: {}", g.group, g.verdict.message));
            continue;
        }
        for p in &g.partitions {
            let why = match (p.reread, p.skips) {
                (_, Some(n)) => Some(format!("would skip {n}")),
                (Some(r), None) if r == Range::exact(0) => None,
                (Some(r), None) => Some(format!("would re-read {}-{}", r.min, r.max)),
                (None, None) => Some("re-read unknown".into()),
            };
            if let Some(why) = why {
                out.push(format!("{} {}-{}: {why}", g.group, p.topic, p.partition));
            }
        }
    }
    out
}

/// (group, source topic, partition, committed offset) of every planned partition.
type Commits = Vec<(String, String, i32, Option<i64>)>;

/// The source committed offsets the plan was made from, to see consumers still moving.
fn source_commits(report: &FailoverReport) -> Commits {
    report
        .groups
        .iter()
        .flat_map(|g| {
            g.partitions.iter().map(|p| {
                (
                    g.group.clone(),
                    p.upstream_topic.clone(),
                    p.partition,
                    p.source_committed,
                )
            })
        })
        .collect()
}

/// The flow's source topics that producers write (not the heartbeats, which only
/// replicators write).
fn source_topics(flow: &Flow) -> Result<Vec<String>, CliError> {
    let c = clusters::consumer(&flow.source_client, "source", "mirrorflow-cli")?;
    let md = clusters::metadata(&c, "source")?;
    let policy = flow.policy.as_ref();
    let mut out: Vec<String> = md
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .filter(|t| !policy.is_heartbeats_topic(t))
        .filter(|t| {
            crate::mm2::topic_decision(
                policy,
                &flow.topics,
                t,
                flow.source_alias(),
                flow.target_alias(),
            ) == TopicDecision::Replicate
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Source records not on the target yet, per partition that has any: the records (not
/// markers) between the flow's stored position and the partition's end ([`COUNTED_BELOW`]).
fn not_copied(flow: &Flow, topics: &[String]) -> Result<BTreeMap<String, i64>, CliError> {
    let source = reader(&flow.source_client, "source")?;
    let md = source
        .fetch_metadata(None, CALL_TIMEOUT)
        .map_err(|e| CliError::Unreachable {
            cluster: "source",
            source: e,
        })?;
    let mut positions = PositionReader::new(
        &flow.target_client,
        positions_topic(flow.source_alias()),
        "mirrorflow-cli-switchover",
    )
    .map_err(|e| CliError::Usage {
        flag: "--flow-file/--name",
        message: e.to_string(),
    })?;
    positions
        .read_to_end(CALL_TIMEOUT)
        .map_err(|e| CliError::Usage {
            flag: "--flow-file/--name",
            message: format!("{e}: is the flow's replicator running?"),
        })?;
    let mut out = BTreeMap::new();
    for t in md
        .topics()
        .iter()
        .filter(|t| topics.iter().any(|n| n == t.name()))
    {
        for p in t.partitions() {
            let next = positions.get(t.name(), p.id()).map_or(0, |f| f.next);
            let failed = || kafka_error(format!("reading {}-{}", t.name(), p.id()), "source");
            let (_, high) = source
                .fetch_watermarks(t.name(), p.id(), CALL_TIMEOUT)
                .map_err(failed())?;
            let behind = high.saturating_sub(next);
            // Far behind, the offsets bound it; near the end, the records count (transaction
            // markers after the last record are no records to wait for).
            let n = if behind > COUNTED_BELOW {
                behind
            } else if behind > 0 {
                let (records, _) =
                    read_range(&source, t.name(), p.id(), next, high).map_err(failed())?;
                i64::try_from(records.len()).unwrap_or(i64::MAX)
            } else {
                0
            };
            if n > 0 {
                out.insert(format!("{}-{}", t.name(), p.id()), n);
            }
        }
    }
    Ok(out)
}

fn dry_apply(output: OutputFormat, apply: bool) -> ApplyArgs {
    ApplyArgs {
        apply,
        force: false,
        allow_rewind: false,
        output,
    }
}

impl SwitchoverArgs {
    fn groups(&self) -> GroupSelection {
        GroupSelection {
            group: self.group.clone(),
            all_groups: self.all_groups,
        }
    }
}

fn drain(
    flow: &Flow,
    args: &SwitchoverArgs,
    topics: &[String],
    report: &mut SwitchoverReport,
) -> Result<bool, CliError> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.timeout);
    let dry = dry_apply(args.output, false);
    let mut previous: Option<Commits> = None;
    loop {
        let uncopied = not_copied(flow, topics)?;
        let plan = failover::plan(flow, &args.groups(), &dry, Landing::Checkpoint)?;
        let waiting = not_exact(&plan);
        let commits = source_commits(&plan);
        let settled = uncopied.is_empty() && waiting.is_empty();
        if settled && previous.as_ref() == Some(&commits) {
            report.not_copied = uncopied;
            report.step(
                "drain",
                started,
                Outcome::Done,
                format!(
                    "every source record is on the target and {} groups' checkpoints are exact",
                    plan.groups.len()
                ),
            );
            return Ok(true);
        }
        previous = settled.then_some(commits);
        if !args.apply || Instant::now() >= deadline {
            let records: i64 = uncopied.values().sum();
            let detail = format!(
                "{records} source records not yet on the target; {} group partitions not exact{}",
                waiting.len(),
                waiting
                    .first()
                    .map_or(String::new(), |w| format!(" (first: {w})"))
            );
            report.not_copied = uncopied;
            let outcome = if args.apply {
                Outcome::Failed
            } else {
                Outcome::Planned
            };
            let detail = if args.apply {
                format!(
                    "not settled within {}s: {detail}; the fence stays (fix it and run again, or --abort)",
                    args.timeout
                )
            } else {
                format!("now: {detail}")
            };
            report.step("drain", started, outcome, detail);
            return Ok(false);
        }
        std::thread::sleep(POLL_EVERY);
    }
}

fn commit(
    flow: &Flow,
    args: &SwitchoverArgs,
    report: &mut SwitchoverReport,
) -> Result<(), CliError> {
    let started = Instant::now();
    let mut plan = failover::plan(
        flow,
        &args.groups(),
        &dry_apply(args.output, true),
        Landing::Checkpoint,
    )?;
    failover::apply(flow, &mut plan);
    let failed: Vec<String> = plan
        .groups
        .iter()
        .filter(|g| g.verdict.action.is_failure())
        .map(|g| format!("{}: {}", g.group, g.verdict.message))
        .collect();
    let committed = plan
        .groups
        .iter()
        .filter(|g| {
            matches!(
                g.verdict.action,
                GroupAction::Committed | GroupAction::Unchanged
            )
        })
        .count();
    if failed.is_empty() {
        report.step(
            "commit",
            started,
            Outcome::Done,
            format!("{committed} groups committed on the target at their exact checkpoints"),
        );
    } else {
        report.step("commit", started, Outcome::Failed, failed.join("; "));
    }
    report.groups = Some(plan);
    Ok(())
}

fn reverse(args: &SwitchoverArgs, report: &mut SwitchoverReport) {
    let started = Instant::now();
    let Some(file) = &args.reverse_flow_file else {
        return report.step(
            "reverse",
            started,
            Outcome::Skipped,
            "no --reverse-flow-file".into(),
        );
    };
    let applied = super::apply_flow_file(file, args.flow.namespace.as_deref());
    match applied {
        Ok(name) => report.step(
            "reverse",
            started,
            Outcome::Done,
            format!("applied MirrorFlow {name}"),
        ),
        Err(e) => report.step("reverse", started, Outcome::Failed, e.to_string()),
    }
}

pub fn render_table(r: &SwitchoverReport) -> String {
    let mode = if r.aborted {
        "abort"
    } else if r.dry_run {
        "dry run"
    } else {
        "applied"
    };
    let mut out = format!("switchover {} -> {} ({mode})\n", r.source, r.target);
    let mut t = super::table::Table::new(&["STEP", "OUTCOME", "TOOK", "DETAIL"]);
    for s in &r.steps {
        t.row(vec![
            s.name.to_string(),
            super::table::serde_plain(&s.outcome),
            format!("{:.1}s", s.millis as f64 / 1000.0),
            s.detail.clone(),
        ]);
    }
    out.push_str(&t.render());
    for (partition, n) in &r.not_copied {
        out.push_str(&format!("  not yet copied: {partition}: {n} records\n"));
    }
    if let Some(groups) = &r.groups {
        out.push('\n');
        out.push_str(&failover::render_table(groups));
    }
    out
}

pub fn run(args: &SwitchoverArgs) -> Result<i32, CliError> {
    if args.fence_command.is_none() && args.principals.is_empty() {
        return Err(CliError::Usage {
            flag: "--deny-principal",
            message: "name the producers' principals to fence (User:<name>, repeatable), or give --fence-command".into(),
        });
    }
    let flow = super::load_flow(&args.flow)?;
    let topics = source_topics(&flow)?;
    let mut report = SwitchoverReport {
        source: flow.source_alias().to_string(),
        target: flow.target_alias().to_string(),
        dry_run: !args.apply,
        aborted: args.abort,
        steps: Vec::new(),
        fence: Vec::new(),
        not_copied: BTreeMap::new(),
        groups: None,
    };
    if args.abort {
        fence::abort(&flow, args, &topics, &mut report);
    } else {
        fence::fence(&flow, args, &topics, &mut report);
        if !report.failed() && drain(&flow, args, &topics, &mut report)? && args.apply {
            commit(&flow, args, &mut report)?;
            if !report.failed() {
                reverse(args, &mut report);
            }
        }
    }
    match args.output {
        OutputFormat::Json => super::print_json(&report)?,
        OutputFormat::Table => super::print_text(&render_table(&report))?,
    }
    Ok(if report.failed() { EXIT_REFUSED } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(reread: Option<Range>, skips: Option<i64>) -> failover::PartitionPlan {
        failover::PartitionPlan {
            topic: "src.orders".into(),
            partition: 0,
            offset: 10,
            upstream_topic: "orders".into(),
            upstream_offset: 10,
            metadata: String::new(),
            checkpoint_age_ms: Some(100),
            source_committed: Some(10),
            target_committed: None,
            reread,
            skips,
            note: None,
            action: super::super::apply::PartitionAction::Commit,
            reason: None,
        }
    }

    fn report(partitions: Vec<failover::PartitionPlan>, action: GroupAction) -> FailoverReport {
        FailoverReport {
            source: "src".into(),
            target: "tgt".into(),
            dry_run: true,
            source_error: None,
            groups: vec![failover::GroupPlan {
                group: "app".into(),
                share_group: false,
                target_group: None,
                verdict: super::super::apply::Verdict {
                    action,
                    message: "refused: members on the target".into(),
                    write: false,
                },
                partitions,
            }],
        }
    }

    #[test]
    fn only_a_failover_that_re_reads_and_skips_nothing_is_exact() {
        let exact = report(
            vec![partition(Some(Range::exact(0)), None)],
            GroupAction::WouldCommit,
        );
        assert!(not_exact(&exact).is_empty());
        for (p, said) in [
            (partition(Some(Range::exact(3)), None), "re-read 3-3"),
            (
                partition(Some(Range { min: 0, max: 2 }), None),
                "re-read 0-2",
            ),
            (partition(None, Some(4)), "skip 4"),
            (partition(None, None), "unknown"),
        ] {
            let waiting = not_exact(&report(vec![p], GroupAction::WouldCommit));
            assert_eq!(waiting.len(), 1);
            assert!(waiting[0].contains(said), "{waiting:?}");
        }
        let refused = report(
            vec![partition(Some(Range::exact(0)), None)],
            GroupAction::Refused,
        );
        assert!(not_exact(&refused)[0].contains("members on the target"));
    }
}
