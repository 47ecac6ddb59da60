//! `mirrorflow translate`: MM2's `RemoteClusterUtils.translateOffsets` for one or all groups.
//!
//! Reads `<source alias>.checkpoints.internal` (the flow's policy names it) on the target from
//! its start to its end, keeps the newest checkpoint per (group, partition) and prints, for each
//! target topic-partition, the checkpoint's downstream offset: where the group would resume on
//! the target. The JSON shape is a contract other tools code against; change it only by adding
//! fields.

use clap::Args;
use serde::Serialize;

use super::clusters::READ_TIMEOUT;
use super::table::Table;
use super::{CliError, FlowArgs, OutputFormat, load_flow, print_json, print_text};
use crate::flow::Flow;
use crate::kafka::checkpoints::{CheckpointIndex, ReadError, read_checkpoints};
use crate::mm2::{NameFilter, ReplicationPolicy};

/// `mirrorflow translate`.
#[derive(Args, Debug, Clone)]
pub struct TranslateArgs {
    #[command(flatten)]
    pub flow: FlowArgs,
    /// Only this consumer group (repeat the flag for more). Default: every group that has
    /// checkpoints and passes the flow's group filter (spec.groups, spec.groupsExclude).
    #[arg(long, value_name = "G")]
    pub group: Vec<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: OutputFormat,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TranslateReport {
    /// Source cluster alias.
    pub source: String,
    /// Target cluster alias.
    pub target: String,
    /// Sorted by group name.
    pub groups: Vec<GroupOffsets>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupOffsets {
    pub group: String,
    /// Sorted by (topic, partition).
    pub partitions: Vec<PartitionOffset>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionOffset {
    /// The topic on the target (the remote name, e.g. `a.orders`).
    pub topic: String,
    pub partition: i32,
    /// Where the group resumes on the target: the checkpoint's downstream offset.
    pub offset: i64,
    /// The topic on the source.
    pub upstream_topic: String,
    /// The group's committed source offset the checkpoint translated.
    pub upstream_offset: i64,
    /// The commit's metadata ("" when none).
    pub metadata: String,
}

/// Builds the report from the checkpoints read. `requested` empty means every group that
/// passes `groups`; requested groups always appear (with no partitions when they have no
/// checkpoint), so a script can tell "asked, nothing there" apart from "not asked".
/// Also returns warnings for stderr.
pub fn report(
    source: &str,
    target: &str,
    policy: &dyn ReplicationPolicy,
    groups: &NameFilter,
    index: &CheckpointIndex,
    requested: &[String],
) -> (TranslateReport, Vec<String>) {
    let mut warnings = Vec::new();
    let mut names: Vec<&String> = if requested.is_empty() {
        index.keys().filter(|g| groups.matches(g)).collect()
    } else {
        for g in requested {
            if !groups.matches(g) {
                warnings.push(format!(
                    "group '{g}' is excluded by the flow's group filter (spec.groups / \
                     spec.groupsExclude): the replicator writes no checkpoints for it"
                ));
            } else if !index.contains_key(g) {
                warnings.push(format!(
                    "group '{g}' has no checkpoint yet: it has no commit on a replicated topic, \
                     or the checkpoint loop has not translated one"
                ));
            }
        }
        requested.iter().collect()
    };
    names.sort();
    names.dedup();
    let groups = names
        .into_iter()
        .map(|g| GroupOffsets {
            group: g.clone(),
            // BTreeMap order is (topic, partition).
            partitions: index
                .get(g)
                .into_iter()
                .flatten()
                .map(|(tp, stored)| {
                    let cp = &stored.checkpoint;
                    PartitionOffset {
                        topic: tp.topic.clone(),
                        partition: tp.partition,
                        offset: cp.downstream_offset,
                        upstream_topic: policy
                            .upstream_topic(&tp.topic)
                            .unwrap_or(&tp.topic)
                            .to_string(),
                        upstream_offset: cp.upstream_offset,
                        metadata: cp.metadata.clone(),
                    }
                })
                .collect(),
        })
        .collect();
    (
        TranslateReport {
            source: source.to_string(),
            target: target.to_string(),
            groups,
        },
        warnings,
    )
}

pub fn render_table(report: &TranslateReport) -> String {
    let mut t = Table::new(&[
        "GROUP",
        "TOPIC",
        "PARTITION",
        "OFFSET",
        "UPSTREAM-TOPIC",
        "UPSTREAM-OFFSET",
    ]);
    for g in &report.groups {
        if g.partitions.is_empty() {
            t.row(vec![g.group.clone(), "<no checkpoints>".into()]);
        }
        for p in &g.partitions {
            t.row(vec![
                g.group.clone(),
                p.topic.clone(),
                p.partition.to_string(),
                p.offset.to_string(),
                p.upstream_topic.clone(),
                p.upstream_offset.to_string(),
            ]);
        }
    }
    if t.is_empty() {
        return format!(
            "no checkpoints for the flow's groups ({} -> {})\n",
            report.source, report.target
        );
    }
    t.render()
}

/// Reads the flow's checkpoints; a missing topic is explained, since it is the usual first
/// question ("is the checkpoint loop running?").
pub fn read_flow_checkpoints(flow: &Flow) -> Result<CheckpointIndex, CliError> {
    let topic = flow.policy.checkpoints_topic(flow.source_alias());
    match read_checkpoints(&flow.target_client, "target", &topic, READ_TIMEOUT) {
        Ok(read) => {
            if read.undecodable > 0 {
                eprintln!(
                    "warning: {} records of {topic} are not checkpoints and were skipped",
                    read.undecodable
                );
            }
            Ok(read.items)
        }
        Err(ReadError::NoTopic { .. }) => Err(CliError::Usage {
            flag: "--flow-file/--name",
            message: format!(
                "the target cluster has no topic {topic}: no checkpoint was ever written for \
                 source alias '{}'; check the flow's checkpoint loop runs \
                 (spec.checkpoints.enabled) and that the flow's aliases are the ones the \
                 replicator uses",
                flow.source_alias()
            ),
        }),
        Err(e) => Err(e.into()),
    }
}

pub fn run(args: &TranslateArgs) -> Result<i32, CliError> {
    let flow = load_flow(&args.flow)?;
    let index = read_flow_checkpoints(&flow)?;
    let (report, warnings) = report(
        flow.source_alias(),
        flow.target_alias(),
        flow.policy.as_ref(),
        &flow.groups,
        &index,
        &args.group,
    );
    for w in warnings {
        eprintln!("warning: {w}");
    }
    match args.output {
        OutputFormat::Json => print_json(&report)?,
        OutputFormat::Table => print_text(&render_table(&report))?,
    }
    Ok(0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kafka::checkpoints::StoredCheckpoint;
    use crate::mm2::{Checkpoint, PrefixPolicy, TopicPartition};

    pub(crate) fn index(cps: &[(&str, &str, i32, i64, i64)]) -> CheckpointIndex {
        let mut index = CheckpointIndex::new();
        for &(g, t, p, up, down) in cps {
            let tp = TopicPartition::new(t, p);
            index.entry(g.to_string()).or_default().insert(
                tp.clone(),
                StoredCheckpoint {
                    checkpoint: Checkpoint {
                        group: g.into(),
                        topic_partition: tp,
                        upstream_offset: up,
                        downstream_offset: down,
                        metadata: String::new(),
                    },
                    written_ms: Some(1_000),
                    exactness: crate::kafka::checkpoints::Exactness::Unknown,
                    exact_ms: None,
                    verification: None,
                    share: false,
                },
            );
        }
        index
    }

    fn filter() -> NameFilter {
        NameFilter::new(
            "spec.groups",
            &[".*"],
            "spec.groupsExclude",
            &["console-consumer-.*"],
        )
        .unwrap()
    }

    #[test]
    fn the_json_shape_is_the_contract() {
        let idx = index(&[
            ("g2", "a.orders", 1, 20, 25),
            ("g2", "a.orders", 0, 10, 15),
            ("g1", "a.t", 0, 3, 3),
            ("console-consumer-1", "a.t", 0, 1, 1),
        ]);
        let (r, warnings) = report("a", "b", &PrefixPolicy::default(), &filter(), &idx, &[]);
        assert!(warnings.is_empty());
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "source": "a", "target": "b",
                "groups": [
                    {"group": "g1", "partitions": [
                        {"topic": "a.t", "partition": 0, "offset": 3, "upstreamTopic": "t",
                         "upstreamOffset": 3, "metadata": ""}]},
                    {"group": "g2", "partitions": [
                        {"topic": "a.orders", "partition": 0, "offset": 15,
                         "upstreamTopic": "orders", "upstreamOffset": 10, "metadata": ""},
                        {"topic": "a.orders", "partition": 1, "offset": 25,
                         "upstreamTopic": "orders", "upstreamOffset": 20, "metadata": ""}]}
                ]
            })
        );
    }

    #[test]
    fn requested_groups_appear_even_without_checkpoints_and_are_warned_about() {
        let idx = index(&[("g1", "a.t", 0, 3, 3)]);
        let requested = vec!["zz".to_string(), "g1".into(), "console-consumer-9".into()];
        let (r, warnings) = report(
            "a",
            "b",
            &PrefixPolicy::default(),
            &filter(),
            &idx,
            &requested,
        );
        let names: Vec<_> = r.groups.iter().map(|g| g.group.as_str()).collect();
        assert_eq!(names, ["console-consumer-9", "g1", "zz"]);
        assert!(r.groups[2].partitions.is_empty());
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings.iter().any(|w| w.contains("excluded")));
    }

    #[test]
    fn the_table_lists_one_line_per_partition() {
        let idx = index(&[("g1", "a.t", 0, 3, 5)]);
        let (r, _) = report(
            "a",
            "b",
            &PrefixPolicy::default(),
            &filter(),
            &idx,
            &["g1".into(), "g0".into()],
        );
        assert_eq!(
            render_table(&r),
            "GROUP   TOPIC              PARTITION   OFFSET   UPSTREAM-TOPIC   UPSTREAM-OFFSET\n\
             g0      <no checkpoints>\n\
             g1      a.t                0           5        t                3\n"
        );
    }
}
