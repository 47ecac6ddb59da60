//! What `failover` and `failback` share: the verdicts on one partition and one group, planning
//! groups side by side, committing a plan with `--apply`, the report's text layout and the run
//! from flags to exit status. Each command keeps what differs: where its offsets come from and
//! what its report shows per partition.

use rdkafka::ClientConfig;
use serde::Serialize;

use super::clusters::{self, Membership, Partition};
use super::table::Table;
use super::{
    ApplyArgs, CliError, EXIT_REFUSED, FlowArgs, GroupSelection, OutputFormat, load_flow,
    print_json, print_text,
};
use crate::flow::Flow;

/// Per-partition verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionAction {
    /// The offset is (or would be) committed.
    Commit,
    /// The group already sits at the offset.
    Unchanged,
    /// Not committed; `reason` says why and which flag overrides.
    Refused,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Overrides {
    pub force: bool,
    pub allow_rewind: bool,
}

impl From<&ApplyArgs> for Overrides {
    fn from(args: &ApplyArgs) -> Self {
        Self {
            force: args.force,
            allow_rewind: args.allow_rewind,
        }
    }
}

/// Weighs moving a group to `offset` against its `committed` offset there: unchanged when it
/// already sits there, refused (`ahead` says why) when the move would go backwards and rewinds
/// are not allowed; `None` when the commit may move.
pub fn against_commit(
    offset: i64,
    committed: Option<i64>,
    o: Overrides,
    ahead: impl FnOnce(i64) -> String,
) -> Option<(PartitionAction, Option<String>)> {
    match committed {
        Some(c) if c == offset => Some((PartitionAction::Unchanged, None)),
        Some(c) if c > offset && !o.allow_rewind => {
            Some((PartitionAction::Refused, Some(ahead(c))))
        }
        _ => None,
    }
}

/// A group's membership for the member guard, failing closed: a group whose members could
/// not be read is not known to be idle, so the error stands unless `--force` overrides the
/// guard (then the group counts as having no members, as `--force` treats active ones).
pub fn membership_or_refuse(
    read: Result<Membership, super::CliError>,
    o: Overrides,
) -> Result<Option<Membership>, super::CliError> {
    match read {
        Ok(m) => Ok(Some(m)),
        Err(_) if o.force => Ok(None),
        Err(e) => Err(e),
    }
}

/// The group's members when they block a commit: active and not overridden (committing would
/// race them, and Kafka refuses commits from outside a group with live members).
pub fn blocking_members(members: Option<&Membership>, o: Overrides) -> Option<&Membership> {
    members.filter(|m| m.is_active() && !o.force)
}

/// Per-group outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupAction {
    /// Dry run: these offsets would be committed.
    WouldCommit,
    Committed,
    /// Every partition already at its checkpoint.
    Unchanged,
    Refused,
    Failed,
}

impl GroupAction {
    pub fn is_failure(self) -> bool {
        matches!(self, GroupAction::Refused | GroupAction::Failed)
    }
}

/// A group's outcome as its report shows it, and whether `--apply` writes the group's
/// `Commit` partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub action: GroupAction,
    pub message: String,
    #[serde(skip)]
    pub write: bool,
}

impl Verdict {
    pub fn refused(message: String) -> Self {
        Self {
            action: GroupAction::Refused,
            message,
            write: false,
        }
    }
}

/// Decides a group before any write: refused when it has no partitions to act on at all or
/// has members (unless forced); otherwise what the dry run or apply does.
pub fn decide_group(
    members: Option<&Membership>,
    actions: &[PartitionAction],
    apply: bool,
    o: Overrides,
) -> Verdict {
    if actions.is_empty() {
        return Verdict::refused(
            "no checkpoints for this group: nothing to fail over (is it in spec.groups, and has \
             it committed on a replicated topic?)"
                .into(),
        );
    }
    let refused = actions
        .iter()
        .filter(|a| **a == PartitionAction::Refused)
        .count();
    let to_commit = actions
        .iter()
        .filter(|a| **a == PartitionAction::Commit)
        .count();
    if to_commit > 0
        && let Some(m) = blocking_members(members, o)
    {
        return Verdict::refused(format!(
            "{} member(s) active on the target (state {}): committing would race them; stop its \
             consumers there first (--force tries anyway)",
            m.members, m.state
        ));
    }
    let refused_text = if refused > 0 {
        format!("; {refused} partition(s) refused")
    } else {
        String::new()
    };
    let (action, message) = match (to_commit, apply) {
        (0, _) if refused > 0 => (
            GroupAction::Refused,
            format!("nothing committed{refused_text}"),
        ),
        (0, _) => (GroupAction::Unchanged, "already at its checkpoints".into()),
        (n, false) => (
            if refused > 0 {
                GroupAction::Refused
            } else {
                GroupAction::WouldCommit
            },
            format!("dry run: would commit {n} partition(s){refused_text}; --apply commits"),
        ),
        (n, true) => (
            if refused > 0 {
                GroupAction::Refused
            } else {
                GroupAction::Committed
            },
            format!("committed {n} partition(s){refused_text}"),
        ),
    };
    Verdict {
        action,
        message,
        write: to_commit > 0,
    }
}

/// The groups to plan: the named ones (sorted, once each), or with `--all-groups` those `all`
/// finds.
pub fn group_names(
    selection: &GroupSelection,
    all: impl FnOnce() -> Result<Vec<String>, CliError>,
) -> Result<Vec<String>, CliError> {
    if selection.all_groups {
        return all();
    }
    let mut names = selection.group.clone();
    names.sort();
    names.dedup();
    Ok(names)
}

/// Plans each group with `plan` (`None` leaves it out of the report), in the order of `names`;
/// the first error ends the plan.
pub fn plan_groups<G: Send>(
    names: &[String],
    plan: impl Fn(&String) -> Result<Option<G>, CliError> + Sync,
) -> Result<Vec<G>, CliError> {
    // Each group costs a few round trips to each cluster: several groups at a time.
    let planned = clusters::par_map(names, clusters::WORKERS, plan);
    let mut groups = Vec::new();
    for planned in planned {
        groups.extend(planned?);
    }
    Ok(groups)
}

/// One group of a plan, as `--apply` sees it.
pub trait PlannedGroup {
    fn group(&self) -> &str;
    fn verdict_mut(&mut self) -> &mut Verdict;
    /// The offsets (with their metadata) of the partitions the plan commits.
    fn commits(&self) -> Vec<(Partition, i64, String)>;
    /// A share group, whose start offsets its command sets itself ([`commit_groups`] skips it).
    fn is_share_group(&self) -> bool {
        false
    }
}

/// Commits what the plan decided, group by group; a failed group does not stop the others.
pub fn commit_groups(
    client: &ClientConfig,
    cluster: &'static str,
    groups: &mut [impl PlannedGroup],
) {
    for g in groups.iter_mut().filter(|g| !g.is_share_group()) {
        let offsets = g.commits();
        if !g.verdict_mut().write || offsets.is_empty() {
            continue;
        }
        if let Err(e) = clusters::commit(client, cluster, g.group(), &offsets) {
            let verdict = g.verdict_mut();
            verdict.action = GroupAction::Failed;
            verdict.message = format!("commit failed, nothing may have changed: {e}");
        }
    }
}

/// The first line of a report: `failover a -> b (dry run)`.
pub fn title(command: &str, from: &str, to: &str, dry_run: bool) -> String {
    format!(
        "{command} {from} -> {to}{}\n",
        if dry_run { " (dry run)" } else { "" }
    )
}

/// A report as text: `head` (its title and any warning), the partitions, the notes on them and
/// the groups.
pub fn render(head: String, partitions: &Table, notes: &[String], groups: &Table) -> String {
    let mut out = head;
    if !partitions.is_empty() {
        out.push('\n');
        out.push_str(&partitions.render());
    }
    if !notes.is_empty() {
        out.push_str("\nnotes:\n");
        out.push_str(&notes.join("\n"));
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&groups.render());
    out
}

/// A failover or failback report.
pub trait Report: Serialize {
    fn render_table(&self) -> String;
    /// Something asked was refused or failed.
    fn failed(&self) -> bool;
}

/// Runs a command: load the flow, `plan`, `commit` with `--apply`, print; exit status 3 when
/// something was refused or failed.
pub fn run<R: Report>(
    flow: &FlowArgs,
    selection: &GroupSelection,
    args: &ApplyArgs,
    plan: impl FnOnce(&Flow, &GroupSelection, &ApplyArgs) -> Result<R, CliError>,
    commit: impl FnOnce(&Flow, &mut R),
) -> Result<i32, CliError> {
    if selection.all_groups && !selection.group.is_empty() {
        return Err(CliError::Usage {
            flag: "--all-groups",
            message: "give either --group (repeatable) or --all-groups, not both".into(),
        });
    }
    let flow = load_flow(flow)?;
    let mut report = plan(&flow, selection, args)?;
    if args.apply {
        commit(&flow, &mut report);
    }
    match args.output {
        OutputFormat::Json => print_json(&report)?,
        OutputFormat::Table => print_text(&report.render_table())?,
    }
    Ok(if report.failed() { EXIT_REFUSED } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_never_move_back_unless_told() {
        let o = Overrides::default();
        let ahead = |c| format!("ahead at {c}");
        assert_eq!(against_commit(10, None, o, ahead), None);
        assert_eq!(against_commit(10, Some(5), o, ahead), None);
        assert_eq!(
            against_commit(10, Some(10), o, ahead),
            Some((PartitionAction::Unchanged, None))
        );
        assert_eq!(
            against_commit(10, Some(15), o, ahead),
            Some((PartitionAction::Refused, Some("ahead at 15".into())))
        );
        let rewind = Overrides {
            allow_rewind: true,
            ..o
        };
        assert_eq!(against_commit(10, Some(15), rewind, ahead), None);
    }

    #[test]
    fn a_group_whose_members_cannot_be_read_is_refused_unless_forced() {
        let unreadable = || -> Result<Membership, super::super::CliError> {
            Err(super::super::CliError::Usage {
                flag: "--group",
                message: "describe refused".into(),
            })
        };
        // Unknown members are not "no members": the error stands.
        assert!(membership_or_refuse(unreadable(), Overrides::default()).is_err());
        let force = Overrides {
            force: true,
            ..Overrides::default()
        };
        assert!(matches!(
            membership_or_refuse(unreadable(), force),
            Ok(None)
        ));
        let idle = Membership {
            state: "Empty".into(),
            protocol: String::new(),
            members: 0,
        };
        assert!(matches!(
            membership_or_refuse(Ok(idle), Overrides::default()),
            Ok(Some(m)) if m.members == 0
        ));
    }

    #[test]
    fn active_groups_are_refused_unless_forced() {
        let active = Membership {
            state: "Stable".into(),
            protocol: "consumer".into(),
            members: 2,
        };
        let commit = [PartitionAction::Commit];
        let v = decide_group(Some(&active), &commit, true, Overrides::default());
        assert_eq!((v.action, v.write), (GroupAction::Refused, false));
        assert!(
            v.message.contains("2 member(s)") && v.message.contains("--force"),
            "{}",
            v.message
        );
        let force = Overrides {
            force: true,
            ..Overrides::default()
        };
        assert_eq!(
            decide_group(Some(&active), &commit, true, force).action,
            GroupAction::Committed
        );
        // Nothing to commit: an active group is no problem.
        assert_eq!(
            decide_group(
                Some(&active),
                &[PartitionAction::Unchanged],
                true,
                Overrides::default()
            )
            .action,
            GroupAction::Unchanged
        );
    }

    #[test]
    fn group_outcomes() {
        let o = Overrides::default();
        assert_eq!(
            decide_group(None, &[], false, o).action,
            GroupAction::Refused
        );
        assert_eq!(
            decide_group(None, &[PartitionAction::Commit], false, o).action,
            GroupAction::WouldCommit
        );
        let v = decide_group(
            None,
            &[PartitionAction::Commit, PartitionAction::Refused],
            true,
            o,
        );
        assert_eq!(v.action, GroupAction::Refused);
        assert!(v.message.contains("committed 1") && v.message.contains("1 partition(s) refused"));
    }

    #[test]
    fn named_groups_are_sorted_once_each() {
        let selection = GroupSelection {
            group: vec!["b".into(), "a".into(), "b".into()],
            all_groups: false,
        };
        let names = group_names(&selection, || Ok(vec!["x".into()]));
        assert_eq!(names.ok(), Some(vec!["a".to_string(), "b".to_string()]));
    }
}
