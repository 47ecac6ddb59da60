//! `mirrorflow takeover`: a flow starts copying where a MirrorMaker 2 stopped, instead of from
//! each partition's beginning.
//!
//! MM2's source connector keeps its progress in its Connect offsets topic on the target
//! (dedicated mode: `mm2-offsets.<source alias>.internal`): per source partition the offset of
//! the last record it copied, committed every `offset.flush.interval.ms`. Records MM2 copied
//! after its last flush are on the target but not in that offset. So for each partition this
//! reads MM2's offset, then places the remote partition's newest record among the source records
//! that follow it (by key, value, headers and timestamp, as `drill` does): the flow resumes right
//! after it, and copies nothing twice. When the newest record cannot be placed within `--window`
//! records, the flow resumes after MM2's offset and the records MM2 copied since its flush are
//! copied again (at most that many duplicates; the report gives the bound).
//!
//! `--apply` writes these as the flow's own positions (`mirrorflow-positions.<source
//! alias>.internal` on the target), which is where its source loop resumes from when the flow
//! turns from `spec.mode: Observe` to `Replicate`. It never overwrites a position the flow
//! already has, and refuses while the remote topics still grow (MM2 still running) unless
//! `--force`. Checkpoints stay monotonic by themselves: the checkpoint loop reads MM2's last
//! checkpoints from the same topic before writing any.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use serde_json::Value;

use super::drill::judge::Seen;
use super::records::{kafka_error, newest_before, read_range, reader};
use super::table::Table;
use super::{CliError, EXIT_REFUSED, FlowArgs, OutputFormat};
use crate::api::{FlowMode, OffsetsMode};
use crate::flow::Flow;
use crate::kafka::positions::{self, Frontier, PositionReader};
use crate::mm2::{TopicDecision, topic_decision};

const TIMEOUT: Duration = Duration::from_secs(10);
/// Remote topics that grow over this long mean something still copies into them.
const STILL_PERIOD: Duration = Duration::from_secs(3);

/// `mirrorflow takeover`.
#[derive(Args, Debug, Clone)]
pub struct TakeoverArgs {
    #[command(flatten)]
    pub flow: FlowArgs,
    /// MM2's Connect offsets topic on the target (`offset.storage.topic`; Strimzi's default is
    /// `mirrormaker2-cluster-offsets`).
    #[arg(long, value_name = "TOPIC")]
    pub offsets_topic: Option<String>,
    /// The source connector's name in that topic (default: any name ending in
    /// `MirrorSourceConnector`, e.g. Strimzi's `east->west.MirrorSourceConnector`).
    #[arg(long, value_name = "NAME")]
    pub connector: Option<String>,
    /// Source records after MM2's offset searched for the remote partition's newest record.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub window: i64,
    /// Write the positions. Without it nothing is written (dry run).
    #[arg(long)]
    pub apply: bool,
    /// Write even while the remote topics still grow.
    #[arg(long)]
    pub force: bool,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// The command's long help (`mirrorflow takeover --help`).
pub const TAKEOVER_HELP: &str = "\
Start a flow where a MirrorMaker 2 stopped, instead of copying every partition again.

Run it on a flow in spec.mode: Observe (the MirrorFlow that watched the MM2 flow), after MM2
stopped for that flow. Per source partition it reads MM2's progress from its Connect offsets
topic on the target (--offsets-topic, default mm2-offsets.<source alias>.internal), finds the
remote partition's newest record among the source records after it (records MM2 copied after
its last offset flush), and prints where the flow will resume and how many records that saves
from being copied twice. --apply writes these positions for the flow; then switch the flow to
spec.mode: Replicate.

It never overwrites a position the flow already has, refuses while the remote topics still grow
(--force writes anyway), and only for flows with spec.offsets: Translated.

Exit status: 0 done (or would be done), 3 something refused, 1 an error.

Examples:
  mirrorflow takeover --name east-west -n kafka
  mirrorflow takeover --name east-west -n kafka --apply
  kubectl mirrorflow takeover --name east-west --offsets-topic mirrormaker2-cluster-offsets
";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TakeoverReport {
    pub source: String,
    pub target: String,
    pub offsets_topic: String,
    pub dry_run: bool,
    /// Why nothing was written, when refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    pub partitions: Vec<PartitionTakeover>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionTakeover {
    /// Source topic.
    pub topic: String,
    pub partition: i32,
    /// The offset of the last record MM2 committed as copied.
    pub mm2_offset: i64,
    /// Where the flow resumes copying.
    pub resume_at: i64,
    /// The target offset of the record before `resume_at`, when found (-1: unknown).
    pub remote_offset: i64,
    /// Records MM2 copied after its last offset flush, which the flow does not copy again.
    pub found_after_flush: i64,
    /// Records that may be copied twice (when the newest remote record was not found).
    pub duplicates_at_most: i64,
    /// `write`, `written`, or `skip` (the flow has its own position).
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl PartitionTakeover {
    /// A partition nothing is written for, and why.
    fn skipped(topic: &str, partition: i32, mm2_offset: i64, note: String) -> Self {
        PartitionTakeover {
            topic: topic.to_string(),
            partition,
            mm2_offset,
            resume_at: -1,
            remote_offset: -1,
            found_after_flush: 0,
            duplicates_at_most: 0,
            action: "skip",
            note: Some(note),
        }
    }
}

/// One progress entry of MM2's source connector: (connector, source alias, topic, partition)
/// from the key `["<connector>",{"cluster":..,"partition":..,"topic":..}]`, and the offset from
/// the value `{"offset":N}` (`None`: a tombstone).
pub fn parse_progress(
    key: &[u8],
    value: Option<&[u8]>,
) -> Option<(String, String, String, i32, Option<i64>)> {
    let key: Value = serde_json::from_slice(key).ok()?;
    let connector = key.get(0)?.as_str()?.to_string();
    let part = key.get(1)?;
    let cluster = part.get("cluster")?.as_str()?.to_string();
    let topic = part.get("topic")?.as_str()?.to_string();
    let partition = i32::try_from(part.get("partition")?.as_i64()?).ok()?;
    let offset = match value {
        None => None,
        Some(v) => Some(
            serde_json::from_slice::<Value>(v)
                .ok()?
                .get("offset")?
                .as_i64()?,
        ),
    };
    Some((connector, cluster, topic, partition, offset))
}

/// Where to resume after MM2's `mm2_offset`, from the source records `from_mm2` read from
/// `mm2_offset` on and the remote partition's newest record: right after that record when it is
/// among them, with how many records after MM2's offset it was (copied after MM2's last offset
/// flush). `None` when it is not among them; an empty remote partition resumes after MM2's offset.
pub fn resume_point(
    mm2_offset: i64,
    from_mm2: &[Seen],
    newest_remote: Option<super::drill::judge::Fingerprint>,
) -> Option<(i64, i64)> {
    let Some(fp) = newest_remote else {
        return Some((mm2_offset.saturating_add(1), 0));
    };
    let at = from_mm2.iter().position(|(_, f)| *f == fp)?;
    let (offset, _) = from_mm2[at];
    let found = from_mm2[..=at]
        .iter()
        .filter(|(o, _)| *o > mm2_offset)
        .count() as i64;
    Some((offset.saturating_add(1), found))
}

fn matches_connector(name: &str, wanted: Option<&str>) -> bool {
    match wanted {
        Some(w) => name == w,
        None => name.ends_with("MirrorSourceConnector"),
    }
}

/// MM2's newest progress per source partition of this flow's source alias.
fn read_progress(
    flow: &Flow,
    topic: &str,
    connector: Option<&str>,
) -> Result<BTreeMap<(String, i32), i64>, CliError> {
    let consumer: BaseConsumer = reader(&flow.target_client, "target")?;
    let mut progress = BTreeMap::new();
    // Connect's offsets topic has 25 partitions by default; every one may hold entries.
    let metadata = consumer
        .fetch_metadata(Some(topic), TIMEOUT)
        .map_err(kafka_error(format!("describing {topic}"), "target"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(CliError::Usage {
            flag: "--offsets-topic",
            message: format!(
                "MM2's offsets topic {topic} has no partitions on the target (does it exist? dedicated mode names it mm2-offsets.<source alias>.internal, Strimzi mirrormaker2-cluster-offsets)"
            ),
        });
    }
    for p in partitions {
        let (lo, hi) = consumer
            .fetch_watermarks(topic, p, TIMEOUT)
            .map_err(kafka_error(
                format!("reading the end of {topic}[{p}]"),
                "target",
            ))?;
        if lo >= hi {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(lo))
            .map_err(kafka_error(format!("assigning {topic}[{p}]"), "target"))?;
        consumer
            .assign(&tpl)
            .map_err(kafka_error(format!("assigning {topic}[{p}]"), "target"))?;
        let deadline = std::time::Instant::now() + TIMEOUT * 3;
        loop {
            if std::time::Instant::now() > deadline {
                return Err(CliError::Usage {
                    flag: "--offsets-topic",
                    message: format!("reading {topic}[{p}] to its end timed out"),
                });
            }
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    let offset = m.offset();
                    if let Some(key) = m.key()
                        && let Some((name, cluster, t, part, value)) =
                            parse_progress(key, m.payload())
                        && matches_connector(&name, connector)
                        && cluster == flow.source_alias()
                    {
                        match value {
                            Some(v) => progress.insert((t, part), v),
                            None => progress.remove(&(t, part)),
                        };
                    }
                    if offset + 1 >= hi {
                        break;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => {
                    return Err(kafka_error(format!("reading {topic}[{p}]"), "target")(e));
                }
                None => {}
            }
        }
    }
    Ok(progress)
}

/// The source partitions the flow already has a position for (none before it first ran: then
/// its positions topic does not exist yet).
fn own_positions(flow: &Flow) -> Result<std::collections::BTreeSet<(String, i32)>, CliError> {
    let topic = positions::positions_topic(flow.source_alias());
    let failed = |e: positions::ReadError| CliError::Usage {
        flag: "--name/--flow-file",
        message: format!("reading the flow's positions: {e}"),
    };
    let mut reader =
        PositionReader::new(&flow.target_client, topic, "mirrorflow-cli-reader").map_err(failed)?;
    match reader.read_to_end(TIMEOUT) {
        Err(positions::ReadError::NoTopic { .. }) => return Ok(Default::default()),
        read => read.map_err(failed)?,
    }
    Ok(reader.into_positions().map(|(key, _)| key).collect())
}

/// The ends of the remote partitions, twice [`STILL_PERIOD`] apart: those that grew.
fn growing(flow: &Flow, remotes: &[(String, i32)]) -> Result<Vec<String>, CliError> {
    let consumer = reader(&flow.target_client, "target")?;
    let ends = |c: &BaseConsumer| -> Result<Vec<i64>, CliError> {
        remotes
            .iter()
            .map(|(t, p)| {
                c.fetch_watermarks(t, *p, TIMEOUT)
                    .map(|(_, h)| h)
                    .map_err(kafka_error(
                        format!("reading the end of {t}[{p}]"),
                        "target",
                    ))
            })
            .collect()
    };
    let before = ends(&consumer)?;
    std::thread::sleep(STILL_PERIOD);
    let after = ends(&consumer)?;
    Ok(remotes
        .iter()
        .zip(before.iter().zip(after.iter()))
        .filter(|(_, (b, a))| a > b)
        .map(|((t, p), _)| format!("{t}[{p}]"))
        .collect())
}

pub fn plan(flow: &Flow, args: &TakeoverArgs) -> Result<TakeoverReport, CliError> {
    if flow.spec.mode != FlowMode::Observe {
        return Err(CliError::Usage {
            flag: "spec.mode",
            message: "takeover writes the flow's positions, which a replicating flow's source loop owns: run it on the flow in spec.mode: Observe, then switch it to Replicate".into(),
        });
    }
    if flow.spec.offsets != OffsetsMode::Translated {
        return Err(CliError::Usage {
            flag: "spec.offsets",
            message:
                "MM2's copies do not keep source offsets; take over with spec.offsets: Translated"
                    .into(),
        });
    }
    let offsets_topic = args
        .offsets_topic
        .clone()
        .unwrap_or_else(|| format!("mm2-offsets.{}.internal", flow.source_alias()));
    let progress = read_progress(flow, &offsets_topic, args.connector.as_deref())?;
    let own = own_positions(flow)?;
    let source = reader(&flow.source_client, "source")?;
    let target = reader(&flow.target_client, "target")?;
    let mut partitions = Vec::new();
    for ((topic, partition), mm2_offset) in &progress {
        let decision = topic_decision(
            flow.policy.as_ref(),
            &flow.topics,
            topic,
            flow.source_alias(),
            flow.target_alias(),
        );
        if decision != TopicDecision::Replicate {
            continue;
        }
        let remote = flow.policy.format_remote_topic(flow.source_alias(), topic);
        if own.contains(&(topic.clone(), *partition)) {
            partitions.push(PartitionTakeover::skipped(
                topic,
                *partition,
                *mm2_offset,
                "the flow has a position of its own here; it is kept".into(),
            ));
            continue;
        }
        let placed = place(
            (&source, &target),
            (topic, *partition, &remote),
            *mm2_offset,
            args.window,
        );
        match placed {
            Ok(row) => partitions.push(row),
            // A topic deleted since MM2 copied it: nothing to resume there.
            Err((cluster, e)) if is_gone(&e) => partitions.push(PartitionTakeover::skipped(
                topic,
                *partition,
                *mm2_offset,
                format!("no longer on the {cluster} cluster ({e}); nothing is written for it"),
            )),
            Err((cluster, e)) => {
                return Err(kafka_error(
                    format!("reading {topic}[{partition}] and {remote}[{partition}]"),
                    cluster,
                )(e));
            }
        }
    }
    Ok(TakeoverReport {
        source: flow.source_alias().to_string(),
        target: flow.target_alias().to_string(),
        offsets_topic,
        dry_run: !args.apply,
        refused: None,
        partitions,
    })
}

/// Where one partition resumes after MM2's `mm2_offset` (the module docs say how); the error
/// names the cluster that answered it.
fn place(
    (source, target): (&BaseConsumer, &BaseConsumer),
    (topic, partition, remote): (&str, i32, &str),
    mm2_offset: i64,
    window: i64,
) -> Result<PartitionTakeover, (&'static str, KafkaError)> {
    let on_target = |e| ("target", e);
    let on_source = |e| ("source", e);
    let (_, remote_end) = target
        .fetch_watermarks(remote, partition, TIMEOUT)
        .map_err(on_target)?;
    let newest = newest_before(target, remote, partition, remote_end).map_err(on_target)?;
    let from = mm2_offset.saturating_add(1);
    let (from_mm2, _) = read_range(
        source,
        topic,
        partition,
        mm2_offset,
        from.saturating_add(window),
    )
    .map_err(on_source)?;
    let (_, source_end) = source
        .fetch_watermarks(topic, partition, TIMEOUT)
        .map_err(on_source)?;
    let placed = resume_point(mm2_offset, &from_mm2, newest.map(|(_, fp)| fp));
    let unplaced = placed.is_none();
    let (resume_at, found) = placed.unwrap_or((from, 0));
    Ok(PartitionTakeover {
        topic: topic.to_string(),
        partition,
        mm2_offset,
        resume_at,
        remote_offset: match (placed, newest) {
            (Some(_), Some((offset, _))) => offset,
            _ => -1,
        },
        found_after_flush: found,
        // Unplaced: everything after MM2's offset may already be on the target.
        duplicates_at_most: if unplaced {
            source_end.saturating_sub(from)
        } else {
            0
        },
        action: "write",
        note: unplaced.then(|| {
            format!(
                "the remote partition's newest record is not among the {} source records from MM2's offset on; resuming after MM2's offset",
                from_mm2.len()
            )
        }),
    })
}

/// A topic or partition that does not exist (any more).
fn is_gone(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownPartition
        )
    )
}

/// Writes the planned positions into the flow's positions topic.
pub fn apply(flow: &Flow, report: &mut TakeoverReport, force: bool) -> Result<(), CliError> {
    let remotes: Vec<(String, i32)> = report
        .partitions
        .iter()
        .filter(|p| p.action == "write")
        .map(|p| {
            (
                flow.policy
                    .format_remote_topic(flow.source_alias(), &p.topic),
                p.partition,
            )
        })
        .collect();
    if remotes.is_empty() {
        return Ok(());
    }
    let still = growing(flow, &remotes)?;
    if !still.is_empty() && !force {
        report.refused = Some(format!(
            "the remote partitions {} grew in the last {} s: is MirrorMaker 2 still copying them? Stop it first (--force writes anyway)",
            still.join(", "),
            STILL_PERIOD.as_secs()
        ));
        return Ok(());
    }
    let topic = positions::positions_topic(flow.source_alias());
    let admin = crate::kafka::admin::Admin::new(crate::kafka::Side::Target, &flow.target_client)
        .map_err(|e| CliError::Usage {
            flag: "--apply",
            message: format!("creating an admin client: {e}"),
        })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Usage {
            flag: "--apply",
            message: format!("cannot start the admin client's runtime: {e}"),
        })?;
    runtime
        .block_on(admin.ensure_compacted(&topic, flow.spec.source_loop.replication_factor))
        .map_err(|e| CliError::Usage {
            flag: "--apply",
            message: format!("creating {topic} on the target: {e}"),
        })?;
    let producer: BaseProducer = flow
        .target_client
        .clone()
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .create()
        .map_err(kafka_error("creating a producer".into(), "target"))?;
    for p in report.partitions.iter_mut().filter(|p| p.action == "write") {
        let key = positions::encode_key(&p.topic, p.partition);
        // With the remote offset known, the source loop's start check also catches a remote
        // topic deleted between this and its start.
        let value = positions::encode_value(Frontier {
            next: p.resume_at,
            downstream: p.remote_offset,
        });
        producer
            .send(BaseRecord::to(&topic).key(&key).payload(&value))
            .map_err(|(e, _)| kafka_error(format!("writing to {topic}"), "target")(e))?;
        p.action = "written";
    }
    producer
        .flush(TIMEOUT)
        .map_err(kafka_error(format!("writing to {topic}"), "target"))?;
    Ok(())
}

pub fn render_table(r: &TakeoverReport) -> String {
    let mut t = Table::new(&[
        "TOPIC",
        "PARTITION",
        "MM2-OFFSET",
        "RESUME-AT",
        "FOUND-AFTER-FLUSH",
        "DUPLICATES-AT-MOST",
        "ACTION",
    ]);
    let mut notes = Vec::new();
    for p in &r.partitions {
        t.row(vec![
            p.topic.clone(),
            p.partition.to_string(),
            p.mm2_offset.to_string(),
            p.resume_at.to_string(),
            p.found_after_flush.to_string(),
            p.duplicates_at_most.to_string(),
            p.action.to_string(),
        ]);
        if let Some(n) = &p.note {
            notes.push(format!("{}[{}]: {n}", p.topic, p.partition));
        }
    }
    let mode = if r.dry_run {
        " (dry run: --apply writes)"
    } else {
        ""
    };
    let mut out = format!(
        "takeover {} -> {} from {}{mode}\n{}",
        r.source,
        r.target,
        r.offsets_topic,
        t.render()
    );
    if let Some(why) = &r.refused {
        out.push_str(&format!("refused: {why}\n"));
    }
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

pub fn run(args: &TakeoverArgs) -> Result<i32, CliError> {
    let flow = super::load_flow(&args.flow)?;
    let mut report = plan(&flow, args)?;
    if args.apply {
        apply(&flow, &mut report, args.force)?;
    }
    match args.output {
        OutputFormat::Json => super::print_json(&report)?,
        OutputFormat::Table => super::print_text(&render_table(&report))?,
    }
    Ok(if report.refused.is_some() {
        EXIT_REFUSED
    } else {
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mm2_progress_entries_are_read_and_anything_else_is_not() {
        let key = br#"["MirrorSourceConnector",{"cluster":"east","partition":2,"topic":"orders"}]"#;
        assert_eq!(
            parse_progress(key, Some(br#"{"offset":41}"#)),
            Some((
                "MirrorSourceConnector".into(),
                "east".into(),
                "orders".into(),
                2,
                Some(41)
            ))
        );
        assert_eq!(
            parse_progress(key, None).map(|p| p.4),
            Some(None),
            "a tombstone"
        );
        for bad in [
            &br#"{"not":"a list"}"#[..],
            br#"["c",{"cluster":"east","topic":"t"}]"#,
            br#"["c",{"cluster":"east","partition":99999999999,"topic":"t"}]"#,
            b"\xff",
        ] {
            assert_eq!(parse_progress(bad, Some(br#"{"offset":1}"#)), None);
        }
        assert_eq!(parse_progress(key, Some(b"{}")), None);
    }

    #[test]
    fn strimzi_connector_names_match_by_suffix_unless_one_is_given() {
        assert!(matches_connector("east->west.MirrorSourceConnector", None));
        assert!(!matches_connector("MirrorCheckpointConnector", None));
        assert!(!matches_connector("MirrorSourceConnector", Some("other")));
    }

    #[test]
    fn resumes_after_the_newest_remote_record_found_after_the_flush() {
        let from_mm2: Vec<Seen> = (41..60).map(|o| (o, o as u128)).collect();
        assert_eq!(resume_point(41, &from_mm2, Some(50)), Some((51, 9)));
        assert_eq!(
            resume_point(41, &from_mm2, Some(41)),
            Some((42, 0)),
            "MM2 flushed right after its last copy"
        );
        assert_eq!(resume_point(41, &from_mm2, Some(7)), None, "not found");
        assert_eq!(
            resume_point(41, &from_mm2, None),
            Some((42, 0)),
            "an empty remote"
        );
    }
}
