//! `mirrorflow drill`: a failover rehearsal that touches no real group.
//!
//! Per selected group it clones the group into a drill group on the target
//! (`mirrorflow-drill.<group>`) at the offsets a failover would commit now (its newest
//! checkpoints, as `failover` plans them), reads the first record of each partition as that drill
//! group, and compares it with what the source group reads next ([`judge`]): records a failover
//! now would skip (must be 0), records it would read again, and source records not yet on the
//! target (the recovery point), with how long committing and reading took (the drill's own
//! recovery time). Only the drill groups are written, and they are deleted afterwards
//! (`--keep-groups` leaves them for inspection). Group names starting with `mirrorflow` are
//! never replicated by a flow, so a drill group cannot travel anywhere.

pub use crate::verify::judge;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use self::judge::{Around, Finding, Seen};
use super::clusters::{COMMIT_TIMEOUT, Partition};
use super::failover::{self, Landing};
use super::records::{kafka_error, newest_before, read_range, reader, seen};
use super::table::Table;
use super::{ApplyArgs, CliError, EXIT_REFUSED, FlowArgs, GroupSelection, OutputFormat};
use crate::flow::Flow;
use crate::kafka::commit::commit_within;

/// The prefix of drill groups.
pub const DRILL_GROUP_PREFIX: &str = "mirrorflow-drill.";

/// Exit code when a partition could not be verified (and none would skip).
pub const EXIT_UNVERIFIED: i32 = 4;

const TIMEOUT: Duration = Duration::from_secs(10);
/// How long the drill group waits for its first records: a failover's consumers would not
/// wait longer before someone looks.
const FIRST_RECORDS_WAIT: Duration = Duration::from_secs(30);

/// `mirrorflow drill`.
#[derive(Args, Debug, Clone)]
pub struct DrillArgs {
    #[command(flatten)]
    pub flow: FlowArgs,
    #[command(flatten)]
    pub groups: GroupSelection,
    /// Source records read on each side of a group's position to place the target's record
    /// (and at the source's end, for the recovery point).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub window: i64,
    /// Leave the drill groups on the target instead of deleting them.
    #[arg(long)]
    pub keep_groups: bool,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// The command's long help (`mirrorflow drill --help`).
pub const DRILL_HELP: &str = "\
Rehearse a failover without touching any real consumer group.

For each group (--group, or --all-groups: every group with checkpoints that passes the flow's
group filter) it commits the offsets a failover would commit now into a drill group on the
target, mirrorflow-drill.<group>, reads the first record of each partition as that group, and
compares it with the record the group reads next on the source. Per partition it reports:
  SKIPPED     records a failover now would never deliver (must be 0);
  RE-READ     records the group has read that it would read again;
  NOT-COPIED  source records not on the target yet (the recovery point, in records);
and per group the time from the first commit to the first records read.

Records are compared by key, value, headers and timestamp within --window records of the
group's position; a record outside it is reported as unverified, never guessed. The source
must be reachable. The drill groups are deleted afterwards (--keep-groups keeps them).

Exit status: 0 when every partition was verified and none would skip, 3 when one would skip,
4 when one could not be verified, 1 on errors, 2 bad usage.

Examples:
  mirrorflow drill --flow-file flow.yaml --all-groups
  kubectl mirrorflow drill --name orders -n apps --group billing -o json
";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrillReport {
    pub source: String,
    pub target: String,
    pub groups: Vec<GroupDrill>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupDrill {
    pub group: String,
    pub drill_group: String,
    /// `pass`, `skips` or `unverified`.
    pub verdict: &'static str,
    /// From the drill group's commit to its first records read, in ms.
    pub first_records_ms: u64,
    pub partitions: Vec<PartitionDrill>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionDrill {
    /// Target topic.
    pub topic: String,
    pub partition: i32,
    /// Where the drill group started (what a failover would commit).
    pub offset: i64,
    pub source_committed: Option<i64>,
    #[serde(flatten)]
    pub finding: Finding,
    pub not_copied: Option<i64>,
}

fn verdict(partitions: &[PartitionDrill]) -> &'static str {
    if partitions
        .iter()
        .any(|p| p.finding.skipped.is_some_and(|s| s > 0))
    {
        "skips"
    } else if partitions.iter().any(|p| p.finding.skipped.is_none()) {
        "unverified"
    } else {
        "pass"
    }
}

/// The first record the drill group read, by target partition (`None`: nothing to read there).
type FirstRecords = BTreeMap<Partition, Option<Seen>>;

/// Commits `offsets` into `group` on the target, then reads the first record of each partition
/// as that group. Returns the records by target partition and how long it took.
fn clone_and_read(
    flow: &Flow,
    group: &str,
    offsets: &BTreeMap<Partition, i64>,
) -> Result<(FirstRecords, Duration), CliError> {
    let started = Instant::now();
    let consumer: BaseConsumer = flow
        .target_client
        .clone()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .map_err(kafka_error(
            "creating the drill group's client".into(),
            "target",
        ))?;
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in offsets {
        tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))
            .map_err(kafka_error(
                format!("listing {topic}[{partition}]"),
                "target",
            ))?;
    }
    let consumer = commit_within(consumer, tpl, COMMIT_TIMEOUT).map_err(kafka_error(
        format!("committing into drill group '{group}'"),
        "target",
    ))?;
    // Resume as a failed-over consumer does: from the group's committed offsets.
    let mut stored = TopicPartitionList::new();
    for (topic, partition) in offsets.keys() {
        stored
            .add_partition_offset(topic, *partition, Offset::Stored)
            .map_err(kafka_error(
                format!("listing {topic}[{partition}]"),
                "target",
            ))?;
    }
    consumer.assign(&stored).map_err(kafka_error(
        format!("assigning drill group '{group}'"),
        "target",
    ))?;
    // A partition whose end is at or before the drill offset has nothing to read: not waited
    // for (a consumer there would wait for the next copy).
    let mut first = FirstRecords::new();
    for ((topic, partition), offset) in offsets {
        let (_, high) = consumer
            .fetch_watermarks(topic, *partition, TIMEOUT)
            .map_err(kafka_error(
                format!("reading the end of {topic}[{partition}]"),
                "target",
            ))?;
        if *offset >= high {
            first.insert((topic.clone(), *partition), None);
        }
    }
    let deadline = Instant::now() + FIRST_RECORDS_WAIT;
    while first.len() < offsets.len() && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                first
                    .entry((m.topic().to_string(), m.partition()))
                    .or_insert_with(|| Some(seen(&m)));
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => {
                return Err(kafka_error(
                    format!("reading as drill group '{group}'"),
                    "target",
                )(e));
            }
            None => {}
        }
    }
    Ok((first, started.elapsed()))
}

fn delete_groups(flow: &Flow, groups: &[String]) -> Result<(), CliError> {
    if groups.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = flow
        .target_client
        .create()
        .map_err(kafka_error("creating an admin client".into(), "target"))?;
    let names: Vec<&str> = groups.iter().map(String::as_str).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Usage {
            flag: "--keep-groups",
            message: format!("cannot delete the drill groups ({e}); delete them by hand"),
        })?;
    let results = runtime
        .block_on(admin.delete_groups(&names, &AdminOptions::new().request_timeout(Some(TIMEOUT))))
        .map_err(kafka_error("deleting the drill groups".into(), "target"))?;
    for r in results {
        if let Err((name, code)) = r {
            return Err(CliError::Kafka {
                what: format!("deleting drill group '{name}'"),
                cluster: "target",
                source: KafkaError::AdminOp(code),
            });
        }
    }
    Ok(())
}

/// Runs the drill (writes only the drill groups).
pub fn drill(flow: &Flow, args: &DrillArgs) -> Result<DrillReport, CliError> {
    let plan_args = ApplyArgs {
        apply: false,
        force: false,
        allow_rewind: false,
        output: args.output,
    };
    let plan = failover::plan(flow, &args.groups, &plan_args, Landing::Checkpoint)?;
    if let Some(e) = plan.source_error {
        return Err(CliError::Usage {
            flag: "--name/--flow-file",
            message: format!("a drill compares with the source, which cannot be read: {e}"),
        });
    }
    let source = reader(&flow.source_client, "source")?;
    let target = reader(&flow.target_client, "target")?;
    let mut report = DrillReport {
        source: plan.source,
        target: plan.target,
        groups: Vec::new(),
    };
    let mut created = Vec::new();
    let outcome = (|| {
        for g in &plan.groups {
            let drill_group = format!("{DRILL_GROUP_PREFIX}{}", g.group);
            let offsets: BTreeMap<Partition, i64> = g
                .partitions
                .iter()
                .map(|p| ((p.topic.clone(), p.partition), p.offset))
                .collect();
            created.push(drill_group.clone());
            let (first, took) = clone_and_read(flow, &drill_group, &offsets)?;
            let mut partitions = Vec::new();
            for p in &g.partitions {
                let source_err = |e| {
                    kafka_error(
                        format!("reading {}[{}]", p.upstream_topic, p.partition),
                        "source",
                    )(e)
                };
                let target_err =
                    |e| kafka_error(format!("reading {}[{}]", p.topic, p.partition), "target")(e);
                let finding = match p.source_committed {
                    None => Finding {
                        skipped: None,
                        reread: None,
                        note: Some(
                            "the group has no committed offset on the source for this partition"
                                .into(),
                        ),
                    },
                    Some(c) => {
                        let (window, to_end) = read_range(
                            &source,
                            &p.upstream_topic,
                            p.partition,
                            c.saturating_sub(args.window),
                            c.saturating_add(args.window),
                        )
                        .map_err(source_err)?;
                        let before = newest_before(&target, &p.topic, p.partition, p.offset)
                            .map_err(target_err)?;
                        judge::judge(&Around {
                            committed: c,
                            source: window,
                            source_to_end: to_end,
                            first: first
                                .get(&(p.topic.clone(), p.partition))
                                .copied()
                                .flatten(),
                            before,
                        })
                    }
                };
                let (_, src_high) = source
                    .fetch_watermarks(&p.upstream_topic, p.partition, TIMEOUT)
                    .map_err(source_err)?;
                let (tail, _) = read_range(
                    &source,
                    &p.upstream_topic,
                    p.partition,
                    src_high.saturating_sub(args.window),
                    src_high,
                )
                .map_err(source_err)?;
                let (_, tgt_high) = target
                    .fetch_watermarks(&p.topic, p.partition, TIMEOUT)
                    .map_err(target_err)?;
                let newest =
                    newest_before(&target, &p.topic, p.partition, tgt_high).map_err(target_err)?;
                partitions.push(PartitionDrill {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    offset: p.offset,
                    source_committed: p.source_committed,
                    finding,
                    not_copied: judge::not_copied(&tail, newest.map(|(_, fp)| fp)),
                });
            }
            report.groups.push(GroupDrill {
                group: g.group.clone(),
                drill_group,
                verdict: verdict(&partitions),
                first_records_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
                partitions,
            });
        }
        Ok::<(), CliError>(())
    })();
    let cleaned = if args.keep_groups {
        Ok(())
    } else {
        delete_groups(flow, &created)
    };
    outcome?;
    cleaned?;
    Ok(report)
}

fn cell(v: Option<i64>) -> String {
    v.map_or_else(|| "unknown".to_string(), |n| n.to_string())
}

pub fn render_table(r: &DrillReport) -> String {
    let mut t = Table::new(&[
        "GROUP",
        "TOPIC",
        "PARTITION",
        "OFFSET",
        "SKIPPED",
        "RE-READ",
        "NOT-COPIED",
        "VERDICT",
    ]);
    let mut notes = Vec::new();
    for g in &r.groups {
        for p in &g.partitions {
            t.row(vec![
                g.group.clone(),
                p.topic.clone(),
                p.partition.to_string(),
                p.offset.to_string(),
                cell(p.finding.skipped),
                cell(p.finding.reread),
                cell(p.not_copied),
                g.verdict.to_string(),
            ]);
            if let Some(n) = &p.finding.note {
                notes.push(format!("{} {}[{}]: {n}", g.group, p.topic, p.partition));
            }
        }
        notes.push(format!(
            "{}: first records read {} ms after the drill group's commit",
            g.group, g.first_records_ms
        ));
    }
    let mut out = format!("drill {} -> {}\n{}", r.source, r.target, t.render());
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

pub fn run(args: &DrillArgs) -> Result<i32, CliError> {
    if args.groups.all_groups && !args.groups.group.is_empty() {
        return Err(CliError::Usage {
            flag: "--all-groups",
            message: "give either --group (repeatable) or --all-groups, not both".into(),
        });
    }
    let flow = super::load_flow(&args.flow)?;
    let report = drill(&flow, args)?;
    match args.output {
        OutputFormat::Json => super::print_json(&report)?,
        OutputFormat::Table => super::print_text(&render_table(&report))?,
    }
    Ok(
        match report.groups.iter().map(|g| g.verdict).collect::<Vec<_>>() {
            v if v.contains(&"skips") => EXIT_REFUSED,
            v if v.contains(&"unverified") => EXIT_UNVERIFIED,
            _ => 0,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(skipped: Option<i64>) -> PartitionDrill {
        PartitionDrill {
            topic: "a.t".into(),
            partition: 0,
            offset: 7,
            source_committed: Some(0),
            finding: Finding {
                skipped,
                reread: skipped.map(|_| 0),
                note: None,
            },
            not_copied: Some(0),
        }
    }

    #[test]
    fn one_skip_fails_the_group_and_unknowns_leave_it_unverified() {
        assert_eq!(verdict(&[part(Some(0)), part(Some(0))]), "pass");
        assert_eq!(verdict(&[part(Some(0)), part(None)]), "unverified");
        assert_eq!(verdict(&[part(None), part(Some(3))]), "skips");
    }
}
