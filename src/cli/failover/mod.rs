//! `mirrorflow failover`: move consumer groups from the source to the target at their newest
//! checkpoints, saying per partition what that costs.
//!
//! Per group and target partition: the checkpoint's downstream offset (what `translate` prints),
//! the records a consumer resuming there would read again, the checkpoint's age, the group's
//! committed offset on the target and whether the group has members there. Dry run unless
//! `--apply`, which commits the offsets into the target groups (never into a group with members,
//! never backwards, never past records the group has not read, each unless overridden).
//!
//! Re-read records come from the source when it is reachable: the group's committed source
//! offset translated through the flow's offset syncs, minus the checkpoint's downstream offset.
//! That counts both commits the checkpoint loop has not caught up with and any slack in the
//! checkpoint's own translation. Without offset syncs for the commit it falls back to source
//! offsets (an upper bound: transaction markers take offsets but are no records).

mod plan;

use self::plan::Planner;
use crate::clock::now_ms;
use std::collections::BTreeMap;

use clap::Args;
use serde::Serialize;

use super::aligned::misaligned_partitions;
use super::apply::{
    self, Overrides, PartitionAction, PlannedGroup, Report, Verdict, against_commit, commit_groups,
    decide_group, group_names, plan_groups, render, title,
};
use super::clusters::{self, Membership, Partition};
use super::share_groups;
use super::stale::target_rewinds;
use super::table::{Table, age, serde_plain};
use super::translate::read_flow_checkpoints;
use super::{ApplyArgs, CliError, FlowArgs, GroupSelection};
use crate::flow::Flow;
use crate::mm2::{OffsetSyncStore, StoreConfig, Translation};

/// `mirrorflow failover`.
#[derive(Args, Debug, Clone)]
pub struct FailoverArgs {
    #[command(flatten)]
    pub flow: FlowArgs,
    #[command(flatten)]
    pub groups: GroupSelection,
    #[command(flatten)]
    pub apply: ApplyArgs,
    /// Where each group lands: `checkpoint` (its newest checkpoint) or `as-is` (its committed
    /// source offset, unchanged: only for flows with `spec.offsets: Aligned`, on partitions
    /// whose alignment never broke; needs the source reachable).
    #[arg(long, value_enum, default_value_t)]
    pub offsets: Landing,
}

/// `--offsets`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Landing {
    #[default]
    Checkpoint,
    AsIs,
}

/// The command's long help (`mirrorflow failover --help`).
pub const FAILOVER_HELP: &str = "\
Move consumer groups from the flow's source to its target at their newest checkpoints.

For each group (--group, or --all-groups: every group with checkpoints that passes the flow's
group filter) and each target partition it prints the translated target offset, how many
records a consumer resuming there would read again (from the group's committed offset on the
source when the source is reachable; `unknown` and the checkpoint's age when it is not),
the group's committed offset on the target and whether the group has members there.

--offsets as-is (flows with spec.offsets: Aligned) commits each group's committed source
offset unchanged instead: on an aligned partition the same offset holds the same record, so
nothing is re-read; partitions whose alignment broke (condition OffsetsAligned) are refused.

Dry run by default. --apply commits the offsets into the target groups, per group:
  - a group with members on the target is refused (--force tries anyway; Kafka itself refuses
    commits from outside a group that has live members, so stop those consumers first);
  - a partition whose target commit is ahead of the checkpoint keeps it (--allow-rewind moves
    it back);
  - a partition whose checkpoint is ahead of the group's source commit (the group rewound
    after its last checkpoint) is refused, since the failover would skip records
    (--force commits it anyway).

Procedure: stop the consumers on the source (their last commits reach the target as
checkpoints within the flow's checkpoint interval), run this command without --apply until the
re-read column is what you accept, run it with --apply, start the consumers on the target.

Exit status: 0 when everything asked was done (or would be), 3 when something was refused or
failed, 1 on errors (bad flags or flow, a cluster unreachable).";

/// Records a consumer would read again, as a range (equal ends: exact).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Range {
    pub min: i64,
    pub max: i64,
}

impl Range {
    pub(crate) fn exact(n: i64) -> Self {
        Self {
            min: n.max(0),
            max: n.max(0),
        }
    }

    fn text(&self) -> String {
        if self.min == self.max {
            self.min.to_string()
        } else {
            format!("{}-{}", self.min, self.max)
        }
    }
}

/// What failing over one partition at its checkpoint costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    /// Records read again; `None` when it cannot be known.
    pub reread: Option<Range>,
    /// Records the group has not read that a consumer resuming at the checkpoint would skip.
    pub skips: Option<i64>,
    pub note: Option<String>,
}

/// The re-read estimate of one partition.
///
/// `checkpoint` is (upstream, downstream); `source_committed` the group's committed offset on
/// the source partition now; `commit` and `at_checkpoint` translate `source_committed` and the
/// checkpoint's upstream offset through the flow's offset syncs.
pub fn estimate(
    checkpoint: (i64, i64),
    source_committed: Option<i64>,
    commit: Translation,
    at_checkpoint: Translation,
) -> Estimate {
    let (up, down) = checkpoint;
    let Some(sc) = source_committed else {
        return Estimate {
            reread: None,
            skips: None,
            note: Some("the group has no commit on this source partition now".into()),
        };
    };
    if sc < up {
        return Estimate {
            reread: None,
            skips: Some(up - sc),
            note: Some(format!(
                "the group rewound to {sc} on the source after its checkpoint at {up}; \
                 wait for the next checkpoint"
            )),
        };
    }
    match commit {
        Translation::Exact(x) if x < down => Estimate {
            reread: None,
            skips: Some(down - x),
            note: Some(format!(
                "the checkpoint ({down}) is ahead of the group's translated position ({x})"
            )),
        },
        Translation::Exact(x) => Estimate {
            reread: Some(Range::exact(x - down)),
            skips: None,
            note: None,
        },
        Translation::Conservative { offset, max_replay } => Estimate {
            reread: Some(Range {
                min: (offset - down).max(0),
                max: (offset - down)
                    .saturating_add(i64::try_from(max_replay).unwrap_or(i64::MAX))
                    .max(0),
            }),
            skips: None,
            note: Some("offset syncs only bound this commit's translation".into()),
        },
        Translation::Unknown(_) => {
            // Commits past the checkpoint, counted in source offsets, plus the checkpoint's own
            // slack when the syncs still cover it.
            let behind = sc - up;
            let slack = match at_checkpoint {
                Translation::Exact(x) => Some(Range::exact(x - down)),
                Translation::Conservative { offset, max_replay } => Some(Range {
                    min: (offset - down).max(0),
                    max: (offset - down)
                        .saturating_add(i64::try_from(max_replay).unwrap_or(i64::MAX))
                        .max(0),
                }),
                Translation::Unknown(_) => None,
            };
            let slack_known = slack.is_some();
            let slack = slack.unwrap_or(Range { min: 0, max: 0 });
            Estimate {
                reread: Some(Range {
                    min: slack.min,
                    max: slack.max.saturating_add(behind),
                }),
                skips: None,
                note: Some(if slack_known {
                    "no offset sync covers the commit: counted in source offsets (at most)".into()
                } else {
                    "no offset sync covers the commit nor the checkpoint: counted in source \
                     offsets, without the checkpoint's own slack"
                        .into()
                }),
            }
        }
    }
}

/// Decides one partition: `offset` the checkpoint's target offset, `target_committed` the
/// group's committed target offset now.
pub fn decide_partition(
    offset: i64,
    target_committed: Option<i64>,
    skips: Option<i64>,
    o: Overrides,
) -> (PartitionAction, Option<String>) {
    if let Some(verdict) = against_commit(offset, target_committed, o, |tc| {
        format!(
            "the target group already committed {tc}, ahead of the checkpoint {offset}; kept \
             (--allow-rewind moves it back and re-reads {} records)",
            tc - offset
        )
    }) {
        return verdict;
    }
    if let Some(n) = skips
        && !o.force
    {
        return (
            PartitionAction::Refused,
            Some(format!(
                "committing {offset} would skip up to {n} records the group has not read \
                 (--force commits it anyway)"
            )),
        );
    }
    (PartitionAction::Commit, None)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverReport {
    pub source: String,
    pub target: String,
    pub dry_run: bool,
    /// Why re-read counts are unknown, when the source could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_error: Option<String>,
    pub groups: Vec<GroupPlan>,
}

impl Report for FailoverReport {
    fn render_table(&self) -> String {
        render_table(self)
    }

    fn failed(&self) -> bool {
        self.groups.iter().any(|g| g.verdict.action.is_failure())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupPlan {
    pub group: String,
    /// A share group: its start offsets are set (AlterShareGroupOffsets), not committed, and
    /// its coordinator refuses while it has members (no `targetGroup` is read for it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub share_group: bool,
    /// The group on the target: state and members, `None` when it could not be described.
    pub target_group: Option<Membership>,
    #[serde(flatten)]
    pub verdict: Verdict,
    pub partitions: Vec<PartitionPlan>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionPlan {
    /// Target topic.
    pub topic: String,
    pub partition: i32,
    /// The translated target offset (the checkpoint's downstream offset).
    pub offset: i64,
    pub upstream_topic: String,
    pub upstream_offset: i64,
    #[serde(skip)]
    pub metadata: String,
    pub checkpoint_age_ms: Option<i64>,
    pub source_committed: Option<i64>,
    pub target_committed: Option<i64>,
    /// Records read again after resuming at `offset`; `null` when unknown.
    pub reread: Option<Range>,
    /// Records skipped by resuming at `offset`, when the checkpoint is ahead of the group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skips: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub action: PartitionAction,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

pub fn render_table(r: &FailoverReport) -> String {
    let mut t = Table::new(&[
        "GROUP",
        "TOPIC",
        "PARTITION",
        "OFFSET",
        "TARGET-COMMITTED",
        "SOURCE-COMMITTED",
        "RE-READ",
        "CKPT-AGE",
        "ACTION",
    ]);
    let mut notes = Vec::new();
    let opt = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
    for g in &r.groups {
        for p in &g.partitions {
            let reread = match (p.reread, p.skips) {
                (_, Some(n)) => format!("SKIPS {n}"),
                (Some(range), None) => range.text(),
                (None, None) => "unknown".into(),
            };
            t.row(vec![
                g.group.clone(),
                p.topic.clone(),
                p.partition.to_string(),
                p.offset.to_string(),
                opt(p.target_committed),
                opt(p.source_committed),
                reread,
                p.checkpoint_age_ms.map_or("-".into(), age),
                serde_plain(&p.action),
            ]);
            for text in [&p.note, &p.reason].into_iter().flatten() {
                notes.push(format!("  {} {}-{}: {text}", g.group, p.topic, p.partition));
            }
        }
    }
    let mut groups = Table::new(&["GROUP", "TARGET-STATE", "MEMBERS", "ACTION", "MESSAGE"]);
    for g in &r.groups {
        groups.row(vec![
            g.group.clone(),
            g.target_group
                .as_ref()
                .map_or("-".into(), |m| m.state.clone()),
            g.target_group
                .as_ref()
                .map_or("-".into(), |m| m.members.to_string()),
            serde_plain(&g.verdict.action),
            g.verdict.message.clone(),
        ]);
    }
    let mut head = title("failover", &r.source, &r.target, r.dry_run);
    if let Some(e) = &r.source_error {
        head.push_str(&format!(
            "source unreachable, re-read counts unknown: {e}\n"
        ));
    }
    render(head, &t, &notes, &groups)
}

/// What the source told us: the store of the flow's offset syncs and a way to read commits.
struct SourceView {
    syncs: OffsetSyncStore,
}

fn read_source_view(flow: &Flow) -> Result<SourceView, CliError> {
    let source = clusters::consumer(&flow.source_client, "source", "mirrorflow-cli")?;
    clusters::metadata(&source, "source")?;
    let mut syncs = OffsetSyncStore::new(StoreConfig::default());
    // No syncs (yet): estimates fall back to source offsets.
    for (sync, origin) in clusters::flow_offset_syncs(flow)? {
        // A negative sync is refused by the store; it only costs exactness.
        let _ = syncs.update(&sync, origin);
    }
    syncs.finish_initial_load();
    Ok(SourceView { syncs })
}

/// Builds the plan (reads only).
pub fn plan(
    flow: &Flow,
    selection: &GroupSelection,
    args: &ApplyArgs,
    landing: Landing,
) -> Result<FailoverReport, CliError> {
    let index = read_flow_checkpoints(flow)?;
    let misaligned = match landing {
        Landing::Checkpoint => None,
        Landing::AsIs => Some(misaligned_partitions(flow)?),
    };
    let target = clusters::consumer(&flow.target_client, "target", "mirrorflow-cli")?;
    clusters::metadata(&target, "target")?;
    let names = group_names(selection, || {
        Ok(index
            .keys()
            .filter(|g| flow.groups.matches(g))
            .cloned()
            .collect())
    })?;
    let source = read_source_view(flow);
    let source_error = source.as_ref().err().map(ToString::to_string);
    let sides = (
        share_groups::Side::new(&flow.target_client, "target"),
        share_groups::Side::new(&flow.source_client, "source"),
    );
    let share = share_groups::share_groups(&index, &[&sides.0, &sides.1]);
    let planner = Planner {
        flow,
        source: source.as_ref().ok(),
        misaligned: misaligned.as_ref(),
        target: &target,
        sides: [&sides.0, &sides.1],
        rewinds: target_rewinds(flow),
        overrides: Overrides::from(args),
        now: now_ms(),
    };
    let empty = BTreeMap::new();
    let groups = plan_groups(&names, |group| {
        let cps = index.get(group).unwrap_or(&empty);
        let is_share = share.contains(group);
        let positions = planner.positions(group, cps, is_share)?;
        let partitions: Vec<PartitionPlan> = (cps.iter())
            .map(|(tp, stored)| planner.partition(tp, stored, &positions))
            .collect();
        let actions: Vec<PartitionAction> = partitions.iter().map(|p| p.action).collect();
        let verdict = decide_group(
            positions.membership.as_ref(),
            &actions,
            args.apply,
            planner.overrides,
        );
        Ok(Some(GroupPlan {
            group: group.clone(),
            share_group: is_share,
            target_group: positions.membership,
            verdict,
            partitions,
        }))
    })?;
    Ok(FailoverReport {
        source: flow.source_alias().to_string(),
        target: flow.target_alias().to_string(),
        dry_run: !args.apply,
        source_error,
        groups,
    })
}

impl PlannedGroup for GroupPlan {
    fn group(&self) -> &str {
        &self.group
    }

    fn verdict_mut(&mut self) -> &mut Verdict {
        &mut self.verdict
    }

    fn is_share_group(&self) -> bool {
        self.share_group
    }

    fn commits(&self) -> Vec<(Partition, i64, String)> {
        self.partitions
            .iter()
            .filter(|p| p.action == PartitionAction::Commit)
            .map(|p| ((p.topic.clone(), p.partition), p.offset, p.metadata.clone()))
            .collect()
    }
}

/// Commits what the plan decided into the target groups; a share group's start offsets are set.
pub fn apply(flow: &Flow, report: &mut FailoverReport) {
    let side = share_groups::Side::new(&flow.target_client, "target");
    for g in report.groups.iter_mut().filter(|g| g.share_group) {
        let offsets: Vec<(Partition, i64)> = (g.commits().into_iter())
            .map(|(partition, offset, _)| (partition, offset))
            .collect();
        if !g.verdict.write || offsets.is_empty() {
            continue;
        }
        let set = side.with(|side| side.alter(&g.group, &offsets));
        if let Err(e) = set {
            g.verdict.action = apply::GroupAction::Failed;
            g.verdict.message = format!("start offsets not set, nothing may have changed: {e}");
        }
    }
    commit_groups(&flow.target_client, "target", &mut report.groups);
}

pub fn run(args: &FailoverArgs) -> Result<i32, CliError> {
    apply::run(
        &args.flow,
        &args.groups,
        &args.apply,
        |f, s, a| plan(f, s, a, args.offsets),
        apply,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mm2::UnknownReason;

    const NONE: Translation = Translation::Unknown(UnknownReason::NoSyncs);

    #[test]
    fn a_caught_up_exact_checkpoint_re_reads_nothing() {
        let e = estimate(
            (100, 107),
            Some(100),
            Translation::Exact(107),
            Translation::Exact(107),
        );
        assert_eq!(e.reread, Some(Range { min: 0, max: 0 }));
        assert_eq!(e.skips, None);
    }

    #[test]
    fn commits_after_the_checkpoint_are_re_read_exactly_through_the_syncs() {
        // Checkpoint at source 100 -> target 107; the group committed 130 since, which the
        // syncs translate to 137: a consumer at 107 reads 30 records again.
        let e = estimate(
            (100, 107),
            Some(130),
            Translation::Exact(137),
            Translation::Exact(107),
        );
        assert_eq!(e.reread, Some(Range { min: 30, max: 30 }));
    }

    #[test]
    fn a_conservative_checkpoint_adds_its_slack() {
        // MM2 sparse syncs: the checkpoint said 101 (down+1) although the exact spot is 150.
        let e = estimate(
            (143, 101),
            Some(143),
            Translation::Conservative {
                offset: 101,
                max_replay: 99,
            },
            Translation::Conservative {
                offset: 101,
                max_replay: 99,
            },
        );
        assert_eq!(e.reread, Some(Range { min: 0, max: 99 }));
        assert!(e.note.is_some());
    }

    #[test]
    fn without_syncs_the_source_offsets_bound_the_re_read() {
        let e = estimate((100, 107), Some(120), NONE, Translation::Exact(107));
        assert_eq!(e.reread, Some(Range { min: 0, max: 20 }));
        let e = estimate((100, 107), Some(120), NONE, NONE);
        assert_eq!(e.reread, Some(Range { min: 0, max: 20 }));
        assert!(e.note.as_deref().is_some_and(|n| n.contains("slack")));
    }

    #[test]
    fn a_group_that_rewound_after_its_checkpoint_would_skip() {
        let e = estimate((100, 107), Some(90), Translation::Exact(97), NONE);
        assert_eq!(e.skips, Some(10));
        assert_eq!(e.reread, None);
    }

    #[test]
    fn no_source_commit_is_unknown() {
        let e = estimate((100, 107), None, NONE, NONE);
        assert_eq!((e.reread, e.skips), (None, None));
    }

    #[test]
    fn partitions_never_move_back_or_skip_unless_told() {
        let o = Overrides::default();
        assert_eq!(
            decide_partition(10, None, None, o).0,
            PartitionAction::Commit
        );
        assert_eq!(
            decide_partition(10, Some(5), None, o).0,
            PartitionAction::Commit
        );
        assert_eq!(
            decide_partition(10, Some(10), None, o).0,
            PartitionAction::Unchanged
        );
        let (a, why) = decide_partition(10, Some(15), None, o);
        assert_eq!(a, PartitionAction::Refused);
        assert!(why.is_some_and(|w| w.contains("--allow-rewind")));
        let rewind = Overrides {
            allow_rewind: true,
            ..o
        };
        assert_eq!(
            decide_partition(10, Some(15), None, rewind).0,
            PartitionAction::Commit
        );
        let (a, why) = decide_partition(10, None, Some(3), o);
        assert_eq!(a, PartitionAction::Refused);
        assert!(why.is_some_and(|w| w.contains("--force")));
        let force = Overrides { force: true, ..o };
        assert_eq!(
            decide_partition(10, None, Some(3), force).0,
            PartitionAction::Commit
        );
    }

    #[test]
    fn the_table_shows_unknowns_skips_and_reasons() {
        let p = |partition, reread, skips, action, reason: Option<&str>| PartitionPlan {
            topic: "a.t".into(),
            partition,
            offset: 10,
            upstream_topic: "t".into(),
            upstream_offset: 8,
            metadata: String::new(),
            checkpoint_age_ms: Some(65_000),
            source_committed: None,
            target_committed: Some(4),
            reread,
            skips,
            note: None,
            action,
            reason: reason.map(str::to_string),
        };
        let r = FailoverReport {
            source: "a".into(),
            target: "b".into(),
            dry_run: true,
            source_error: Some("source down".into()),
            groups: vec![GroupPlan {
                group: "g".into(),
                share_group: false,
                target_group: Some(Membership {
                    state: "Empty".into(),
                    protocol: "classic".into(),
                    members: 0,
                }),
                verdict: Verdict::refused("dry run".into()),
                partitions: vec![
                    p(0, None, None, PartitionAction::Commit, None),
                    p(
                        1,
                        Some(Range { min: 2, max: 5 }),
                        None,
                        PartitionAction::Commit,
                        None,
                    ),
                    p(
                        2,
                        None,
                        Some(3),
                        PartitionAction::Refused,
                        Some("would skip"),
                    ),
                ],
            }],
        };
        let text = render_table(&r);
        assert!(
            text.starts_with("failover a -> b (dry run)\nsource unreachable"),
            "{text}"
        );
        assert!(text.contains("unknown") && text.contains("2-5") && text.contains("SKIPS 3"));
        assert!(
            text.contains("1m5s") && text.contains("g a.t-2: would skip"),
            "{text}"
        );
        assert!(text.contains("would-commit") || text.contains("commit"));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["dryRun"], true);
        assert_eq!(json["groups"][0]["partitions"][1]["reread"]["max"], 5);
        assert_eq!(
            json["groups"][0]["partitions"][0]["reread"],
            serde_json::Value::Null
        );
        assert_eq!(json["groups"][0]["targetGroup"]["members"], 0);
    }
}
