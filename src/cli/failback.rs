//! `mirrorflow failback`: move consumer groups from the old target back to the old source after
//! a failover, through the forward flow's offset syncs read backwards.
//!
//! See [`FAILBACK_HELP`] (the command's long help) and `docs/failover.md` for the procedure and
//! its limits; the translation rules are [`crate::mm2::InverseSyncs`]'s.

use std::collections::{BTreeMap, HashSet};

use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;

use super::apply::{
    self, Overrides, PartitionAction, PlannedGroup, Report, Verdict, against_commit,
    blocking_members, commit_groups, decide_group, group_names, membership_or_refuse, plan_groups,
    render, title,
};
use super::clusters::{self, Membership, Partition, TIMEOUT};
use super::table::{Table, serde_plain};
use super::{ApplyArgs, CliError, FlowArgs, GroupSelection};
use crate::api::PolicyKind;
use crate::flow::Flow;
use crate::mm2::{InverseSyncs, TopicPartition, Translation, UnknownReason};

/// `mirrorflow failback`.
#[derive(Args, Debug, Clone)]
pub struct FailbackArgs {
    /// The FORWARD flow (old source -> old target), the one consumers failed over with.
    #[command(flatten)]
    pub flow: FlowArgs,
    #[command(flatten)]
    pub groups: GroupSelection,
    #[command(flatten)]
    pub apply: ApplyArgs,
}

/// The command's long help (`mirrorflow failback --help`).
pub const FAILBACK_HELP: &str = "\
Move consumer groups back from the flow's target (where they run since a failover, reading the
remote topics such as `a.orders`) to the flow's source (the original `orders`), without
copying anything back and without a replication loop.

Give the FORWARD flow, the one the groups failed over with. For each group (--group, or
--all-groups: every group on the target that passes the flow's group filter and committed on
one of the flow's remote topics) and each remote partition it committed on, the committed
target offset is translated back to the source partition through the forward flow's offset
syncs (`mm2-offset-syncs.<target>.internal` on the source, or on the target with
offsetSyncsLocation Target):
  - exact at a sync and between two consecutive syncs of MirrorFlow's dense writer;
  - otherwise conservative (MM2's rule backwards): never skips a record, re-reads at most the
    printed number;
  - unknown when the offset predates every retained sync (the syncs topic is compacted): the
    group keeps its own older commit on the source and re-reads from there (refused, exit 3).

Dry run by default. --apply commits the offsets into the groups on the source, refusing a
group with members on the source or on the target (stop the consumers first; --force tries
anyway, but Kafka refuses commits from outside a group with live members), never moving a
source commit backwards (--allow-rewind), and never past the end of the source partition (a
source that lost records or was recreated no longer matches the syncs).

Procedure:
  1. stop producers on the target, and the consumers of the groups there;
  2. if producers wrote topics on the target after the failover, run a reverse flow (target ->
     source, its own aliases) until it caught up, and move the groups' positions on those
     topics with `mirrorflow failover` of the REVERSE flow (its checkpoints translate them);
     this command names such topics per group and does not move them;
  3. run this command without --apply, check it, then with --apply;
  4. start the consumers and producers on the source; restart the forward flow.

Limits: records written to the remote topics on the target by anything but the forward flow
are not on the source, and a group positioned after them resumes at the next replicated
record. The source partition must still hold the records (retention) for the translated
offsets to be useful.

Exit status: 0 when everything asked was done (or would be), 3 when something was refused or
failed, 1 on errors (bad flags or flow, a cluster unreachable).";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailbackReport {
    /// Alias of the cluster the groups run on now (the forward flow's target).
    pub from: String,
    /// Alias of the cluster they move back to (the forward flow's source).
    pub to: String,
    pub dry_run: bool,
    pub groups: Vec<GroupBack>,
}

impl Report for FailbackReport {
    fn render_table(&self) -> String {
        render_table(self)
    }

    fn failed(&self) -> bool {
        self.groups.iter().any(|g| g.verdict.action.is_failure())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupBack {
    pub group: String,
    /// The group on the cluster it moves back to (where offsets are committed).
    pub to_group: Option<Membership>,
    /// The group on the cluster it runs on now.
    pub from_group: Option<Membership>,
    #[serde(flatten)]
    pub verdict: Verdict,
    pub partitions: Vec<PartitionBack>,
    /// Topics the group committed on that are not remote topics of this flow (e.g. written
    /// on the target after the failover): they need a reverse flow, see the help.
    pub other_topics: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionBack {
    /// The remote topic on the old target (`a.orders`).
    pub remote_topic: String,
    pub partition: i32,
    /// The group's committed offset there.
    pub remote_committed: i64,
    /// The original topic on the old source (`orders`).
    pub topic: String,
    /// The offset to commit there; `null` when it cannot be translated.
    pub offset: Option<i64>,
    pub exact: bool,
    /// At most this many records are read again (0 when exact).
    pub reread_max: Option<u64>,
    /// The group's committed offset on the old source now.
    pub committed: Option<i64>,
    pub action: PartitionAction,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Decides one partition: `translation` of the remote commit, the group's `committed` offset on
/// the source partition now and that partition's end offset.
pub fn decide_back(
    remote_committed: i64,
    translation: Translation,
    committed: Option<i64>,
    end: Option<i64>,
    o: Overrides,
) -> (PartitionAction, Option<String>) {
    let offset = match translation.offset() {
        Some(u) => u,
        None => {
            let why = match translation {
                Translation::Unknown(UnknownReason::OlderThanOldestSync { oldest }) => format!(
                    "the remote commit {remote_committed} predates the oldest retained offset \
                     sync (target offset {oldest})"
                ),
                Translation::Unknown(UnknownReason::NoSyncs) => {
                    "the forward flow has no offset sync for this partition".into()
                }
                _ => format!("the remote commit {remote_committed} cannot be translated"),
            };
            let keep = committed.map_or(
                "has no commit there: it starts by its auto.offset.reset".into(),
                |c| format!("keeps its commit {c} there and re-reads from it"),
            );
            return (
                PartitionAction::Refused,
                Some(format!("{why}; the group {keep}")),
            );
        }
    };
    if let Some(end) = end
        && offset > end
    {
        return (
            PartitionAction::Refused,
            Some(format!(
                "the translated offset {offset} is past the end ({end}) of the source partition: \
                 it lost records or was recreated since the offset syncs were written"
            )),
        );
    }
    against_commit(offset, committed, o, |c| {
        format!(
            "the group already committed {c} on the source, ahead of {offset}; kept \
             (--allow-rewind moves it back)"
        )
    })
    .unwrap_or((PartitionAction::Commit, None))
}

pub fn render_table(r: &FailbackReport) -> String {
    let mut t = Table::new(&[
        "GROUP",
        "REMOTE-TOPIC",
        "PARTITION",
        "REMOTE-COMMITTED",
        "TOPIC",
        "OFFSET",
        "RE-READ",
        "COMMITTED",
        "ACTION",
    ]);
    let mut notes = Vec::new();
    for g in &r.groups {
        for p in &g.partitions {
            t.row(vec![
                g.group.clone(),
                p.remote_topic.clone(),
                p.partition.to_string(),
                p.remote_committed.to_string(),
                p.topic.clone(),
                p.offset.map_or("-".into(), |o| o.to_string()),
                match (p.exact, p.reread_max) {
                    (true, _) => "0".into(),
                    (false, Some(m)) => format!("0-{m}"),
                    (false, None) => "-".into(),
                },
                p.committed.map_or("-".into(), |c| c.to_string()),
                serde_plain(&p.action),
            ]);
            if let Some(reason) = &p.reason {
                notes.push(format!(
                    "  {} {}-{}: {reason}",
                    g.group, p.remote_topic, p.partition
                ));
            }
        }
        if !g.other_topics.is_empty() {
            notes.push(format!(
                "  {}: also committed on {} on {}: not remote topics of this flow; move those \
                 with a reverse flow and `mirrorflow failover` of it",
                g.group,
                g.other_topics.join(", "),
                r.from
            ));
        }
    }
    let mut groups = Table::new(&["GROUP", "MEMBERS-FROM", "MEMBERS-TO", "ACTION", "MESSAGE"]);
    let members = |m: &Option<Membership>| m.as_ref().map_or("-".into(), |m| m.members.to_string());
    for g in &r.groups {
        groups.row(vec![
            g.group.clone(),
            members(&g.from_group),
            members(&g.to_group),
            serde_plain(&g.verdict.action),
            g.verdict.message.clone(),
        ]);
    }
    render(
        title("failback", &r.from, &r.to, r.dry_run),
        &t,
        &notes,
        &groups,
    )
}

/// The forward flow's syncs per source partition.
fn inverse_syncs(flow: &Flow) -> Result<BTreeMap<TopicPartition, InverseSyncs>, CliError> {
    let mut out: BTreeMap<TopicPartition, InverseSyncs> = BTreeMap::new();
    for (sync, origin) in clusters::flow_offset_syncs(flow)? {
        out.entry(sync.topic_partition.clone()).or_default().push(
            sync.upstream_offset,
            sync.downstream_offset,
            origin,
        );
    }
    Ok(out)
}

/// Why a share group is not failed back, and what to do instead.
const SHARE_GROUP_BACK: &str = "a share group (KIP-932): failback does not move share groups' \
     start offsets; fail back with a reverse flow and `mirrorflow failover` of it, which does";

pub fn plan(
    flow: &Flow,
    selection: &GroupSelection,
    args: &ApplyArgs,
) -> Result<FailbackReport, CliError> {
    if flow.spec.replication_policy.kind == PolicyKind::Identity {
        return Err(CliError::Usage {
            flag: "--flow-file/--name",
            message: "spec.replicationPolicy.type is Identity: remote and local topics share \
                      names on the target, so what the groups read there cannot be told apart \
                      from what was written there after the failover; fail back with a reverse \
                      flow and `mirrorflow failover` of it instead"
                .into(),
        });
    }
    let from = clusters::consumer(&flow.target_client, "target", "mirrorflow-cli")?;
    let from_md = clusters::metadata(&from, "target")?;
    let to = clusters::consumer(&flow.source_client, "source", "mirrorflow-cli")?;
    clusters::metadata(&to, "source")?;
    let (remote_parts, other_parts) = remote_and_other_partitions(flow, &from_md);
    let names = group_names(selection, || target_groups(flow, &from))?;
    // Share groups are moved by their start offsets, which failback does not read backwards
    // yet; an OffsetCommit would make a consumer group of the name on the old source. So a
    // target whose groups cannot be told apart fails the failback (never taken as "none").
    let sides = (
        super::share_groups::Side::new(&flow.source_client, "source"),
        super::share_groups::Side::new(&flow.target_client, "target"),
    );
    let share = (sides.1).with(super::share_groups::ShareSide::share_groups)?;
    let planner = GroupPlanner {
        flow,
        all_groups: selection.all_groups,
        args,
        to: &to,
        remote_parts: &remote_parts,
        other_parts: &other_parts,
        syncs: inverse_syncs(flow)?,
        sides: &sides,
        share: &share,
    };
    let groups = plan_groups(&names, |group| planner.group(group))?;
    Ok(FailbackReport {
        from: flow.target_alias().to_string(),
        to: flow.source_alias().to_string(),
        dry_run: !args.apply,
        groups,
    })
}

/// The target's groups the flow selects (its own left out), sorted once each.
fn target_groups(flow: &Flow, from: &BaseConsumer) -> Result<Vec<String>, CliError> {
    let list = from
        .fetch_group_list(None, TIMEOUT)
        .map_err(|source| CliError::Kafka {
            what: "listing groups".into(),
            cluster: "target",
            source,
        })?;
    let mut names: Vec<String> = list
        .groups()
        .iter()
        .map(|g| g.name().to_string())
        .filter(|g| flow.groups.matches(g) && !g.starts_with("mirrorflow"))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// What planning one group needs, gathered once per failback.
struct GroupPlanner<'a> {
    flow: &'a Flow,
    /// Every group of the flow was asked for: one without commits on remote topics is left out.
    all_groups: bool,
    args: &'a ApplyArgs,
    /// The old source, where the groups go back to.
    to: &'a BaseConsumer,
    remote_parts: &'a [Partition],
    other_parts: &'a [Partition],
    syncs: BTreeMap<TopicPartition, InverseSyncs>,
    sides: &'a (super::share_groups::Side<'a>, super::share_groups::Side<'a>),
    share: &'a HashSet<String>,
}

impl GroupPlanner<'_> {
    fn group(&self, group: &str) -> Result<Option<GroupBack>, CliError> {
        let group = group.to_owned();
        if self.share.contains(&group) {
            return Ok(Some(GroupBack {
                verdict: Verdict::refused(SHARE_GROUP_BACK.into()),
                group,
                to_group: None,
                from_group: None,
                partitions: Vec::new(),
                other_topics: Vec::new(),
            }));
        }
        let target = &self.flow.target_client;
        let remote = clusters::committed(target, "target", &group, self.remote_parts)?;
        if remote.is_empty() && self.all_groups {
            return Ok(None);
        }
        let others = clusters::committed(target, "target", &group, self.other_parts)?;
        let mut other_topics: Vec<String> = others.keys().map(|(t, _)| t.clone()).collect();
        other_topics.dedup();
        let source_parts: Vec<Partition> = (remote.keys())
            .map(|(t, p)| (self.upstream(t), *p))
            .collect();
        let committed =
            clusters::committed(&self.flow.source_client, "source", &group, &source_parts)?;
        let overrides = Overrides::from(self.args);
        let to_group =
            membership_or_refuse(clusters::membership(&self.sides.0, &group), overrides)?;
        let from_group =
            membership_or_refuse(clusters::membership(&self.sides.1, &group), overrides)?;
        let partitions: Vec<PartitionBack> = (remote.iter())
            .map(|((remote_topic, p), c_b)| self.partition(remote_topic, *p, *c_b, &committed))
            .collect();
        let actions: Vec<PartitionAction> = partitions.iter().map(|p| p.action).collect();
        let verdict = group_verdict(
            self.flow,
            decide_group(to_group.as_ref(), &actions, self.args.apply, overrides),
            actions.is_empty(),
            from_group.as_ref(),
            overrides,
        );
        Ok(Some(GroupBack {
            group,
            to_group,
            from_group,
            verdict,
            partitions,
            other_topics,
        }))
    }

    /// One remote partition the group committed `c_b` on: its commit on the source read
    /// backwards through the syncs, and what to do with it given the source's own commit
    /// (`committed`) and end.
    fn partition(
        &self,
        remote_topic: &str,
        partition: i32,
        c_b: i64,
        committed: &BTreeMap<Partition, i64>,
    ) -> PartitionBack {
        let topic = self.upstream(remote_topic);
        let tp = TopicPartition::new(topic.clone(), partition);
        let translation = match self.syncs.get(&tp) {
            Some(syncs) => syncs.translate(c_b),
            None => InverseSyncs::new().translate(c_b),
        };
        let end = (self.to)
            .fetch_watermarks(&topic, partition, TIMEOUT)
            .ok()
            .map(|(_, h)| h);
        let c_a = committed.get(&(topic.clone(), partition)).copied();
        let overrides = Overrides::from(self.args);
        let (action, reason) = decide_back(c_b, translation, c_a, end, overrides);
        PartitionBack {
            remote_topic: remote_topic.to_string(),
            partition,
            remote_committed: c_b,
            topic,
            offset: translation.offset(),
            exact: translation.is_exact(),
            reread_max: translation.max_replay(),
            committed: c_a,
            action,
            reason,
        }
    }

    fn upstream(&self, remote_topic: &str) -> String {
        let policy = self.flow.policy.as_ref();
        policy
            .upstream_topic(remote_topic)
            .unwrap_or(remote_topic)
            .to_string()
    }
}

/// The target's partitions of this flow's remote topics, and of every other topic (whose
/// commits failback leaves where they are), internal and heartbeats topics left out.
fn remote_and_other_partitions(
    flow: &Flow,
    md: &rdkafka::metadata::Metadata,
) -> (Vec<Partition>, Vec<Partition>) {
    let policy = flow.policy.as_ref();
    let mut remote_parts: Vec<Partition> = Vec::new();
    let mut other_parts: Vec<Partition> = Vec::new();
    for t in md.topics() {
        let name = t.name();
        if policy.is_internal_topic(name) || policy.is_heartbeats_topic(name) {
            continue;
        }
        let remote = policy.topic_source(name) == Some(flow.source_alias());
        let parts = if remote {
            &mut remote_parts
        } else {
            &mut other_parts
        };
        parts.extend(t.partitions().iter().map(|p| (name.to_string(), p.id())));
    }
    (remote_parts, other_parts)
}

/// The group's verdict, said for a group with nothing to move back, and refused while its
/// members on the target still commit (what they commit would move on after the failback).
fn group_verdict(
    flow: &Flow,
    mut verdict: Verdict,
    nothing_remote: bool,
    from_group: Option<&Membership>,
    overrides: Overrides,
) -> Verdict {
    if nothing_remote {
        verdict.message = format!(
            "no commit on a remote topic of this flow ({}.*) on {}",
            flow.source_alias(),
            flow.target_alias()
        );
    }
    if verdict.write
        && let Some(m) = blocking_members(from_group, overrides)
    {
        verdict = Verdict::refused(format!(
            "{} member(s) still active on {} (state {}): their commits would move on after \
             this; stop them first (--force ignores them)",
            m.members,
            flow.target_alias(),
            m.state
        ));
    }
    verdict
}

impl PlannedGroup for GroupBack {
    fn group(&self) -> &str {
        &self.group
    }

    fn verdict_mut(&mut self) -> &mut Verdict {
        &mut self.verdict
    }

    fn commits(&self) -> Vec<(Partition, i64, String)> {
        self.partitions
            .iter()
            .filter(|p| p.action == PartitionAction::Commit)
            .filter_map(|p| {
                p.offset
                    .map(|o| ((p.topic.clone(), p.partition), o, String::new()))
            })
            .collect()
    }
}

/// Commits what the plan decided into the groups on the old source.
pub fn apply(flow: &Flow, report: &mut FailbackReport) {
    commit_groups(&flow.source_client, "source", &mut report.groups);
}

pub fn run(args: &FailbackArgs) -> Result<i32, CliError> {
    apply::run(&args.flow, &args.groups, &args.apply, plan, apply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exact_translation_is_committed_unless_the_source_is_ahead() {
        let o = Overrides::default();
        assert_eq!(
            decide_back(20, Translation::Exact(13), Some(5), Some(30), o).0,
            PartitionAction::Commit
        );
        assert_eq!(
            decide_back(20, Translation::Exact(13), Some(13), Some(30), o).0,
            PartitionAction::Unchanged
        );
        let (a, why) = decide_back(20, Translation::Exact(13), Some(17), Some(30), o);
        assert_eq!(a, PartitionAction::Refused);
        assert!(why.is_some_and(|w| w.contains("--allow-rewind")));
        let rewind = Overrides {
            allow_rewind: true,
            ..o
        };
        assert_eq!(
            decide_back(20, Translation::Exact(13), Some(17), Some(30), rewind).0,
            PartitionAction::Commit
        );
    }

    #[test]
    fn an_untranslatable_commit_keeps_the_old_one_and_says_so() {
        let t = Translation::Unknown(UnknownReason::OlderThanOldestSync { oldest: 40 });
        let (a, why) = decide_back(20, t, Some(3), Some(30), Overrides::default());
        assert_eq!(a, PartitionAction::Refused);
        let why = why.unwrap_or_default();
        assert!(
            why.contains("oldest") && why.contains("keeps its commit 3"),
            "{why}"
        );
    }

    #[test]
    fn an_offset_past_the_source_end_is_refused() {
        let (a, why) = decide_back(
            20,
            Translation::Exact(50),
            None,
            Some(30),
            Overrides {
                force: true,
                allow_rewind: true,
            },
        );
        assert_eq!(a, PartitionAction::Refused);
        assert!(why.is_some_and(|w| w.contains("past the end")));
    }

    #[test]
    fn the_table_and_json_name_other_topics() {
        let r = FailbackReport {
            from: "b".into(),
            to: "a".into(),
            dry_run: true,
            groups: vec![GroupBack {
                group: "g".into(),
                to_group: None,
                from_group: None,
                verdict: Verdict {
                    action: apply::GroupAction::WouldCommit,
                    message: "dry run".into(),
                    write: true,
                },
                partitions: vec![PartitionBack {
                    remote_topic: "a.t".into(),
                    partition: 0,
                    remote_committed: 20,
                    topic: "t".into(),
                    offset: Some(11),
                    exact: false,
                    reread_max: Some(4),
                    committed: None,
                    action: PartitionAction::Commit,
                    reason: None,
                }],
                other_topics: vec!["t".into()],
            }],
        };
        let text = render_table(&r);
        assert!(
            text.contains("0-4") && text.contains("also committed on t on b"),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["groups"][0]["partitions"][0]["offset"], 11);
        assert_eq!(json["groups"][0]["otherTopics"][0], "t");
        assert_eq!(json["groups"][0]["action"], "would-commit");
    }
}
