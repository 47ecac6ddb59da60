//! `verify`: what a copy of a `load-json` data set holds, read back record by record. Every
//! record carries its `seq` (0 to n - 1), so records missing and records copied twice are
//! counted, not inferred from end offsets (which count duplicates as progress). `leader` and
//! `wait-in-sync`: the partition leaders `--brokers3` stops, and the cluster healed afterwards.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;

use crate::{end_offsets, partitions, plain_consumer};

/// Records read back per second at least: a copy that cannot be read at this pace is stuck.
const READ_TIMEOUT: Duration = Duration::from_secs(300);
/// Examples printed of each kind of defect.
const EXAMPLES: usize = 10;

pub struct Verify {
    pub target: String,
    pub topic: String,
    pub expect: u64,
    /// The end offsets must stay the same this long before the copy is read.
    pub quiet: Duration,
    /// The source bootstrap and topic: where missing records are, when some are.
    pub source: Option<(String, String)>,
}

/// The `seq` of a `load-json` record: the number after `"seq":` (records.rs writes compact JSON).
fn seq_of(value: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"seq\":";
    let at = value.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let digits = value[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    std::str::from_utf8(&value[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// Reads every partition of `topic` from the beginning up to `ends`, handing each record's
/// partition, offset and value to `each`.
fn read_all(
    consumer: &BaseConsumer,
    topic: &str,
    ends: &[i64],
    mut each: impl FnMut(i32, i64, Option<&[u8]>),
) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    let mut open: Vec<i32> = Vec::new();
    for (p, end) in ends.iter().enumerate() {
        let p = i32::try_from(p)?;
        if *end > 0 {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
            open.push(p);
        }
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + READ_TIMEOUT;
    while !open.is_empty() {
        if Instant::now() >= deadline {
            bail!("{topic}: partitions {open:?} not read to their end within {READ_TIMEOUT:?}");
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                each(m.partition(), m.offset(), m.payload());
                let end = ends[usize::try_from(m.partition())?];
                if m.offset() + 1 >= end {
                    open.retain(|p| *p != m.partition());
                }
            }
            // A broker going away while the copy is read (a leader change) is reported as
            // an error and recovered from by the client: only the deadline ends the read.
            Some(Err(e)) => eprintln!("{topic}: reading: {e} (retrying)"),
            // Control records are never handed out: the position tells when they ended a log.
            None => {
                let positions = consumer.position()?;
                open.retain(|p| {
                    !matches!(
                        positions.find_partition(topic, *p).map(|e| e.offset()),
                        Some(Offset::Offset(o)) if o >= ends[*p as usize]
                    )
                });
            }
        }
    }
    consumer.unassign()?;
    Ok(())
}

/// The end offsets of `topic`, asked again while a leader change makes the answer an error
/// (NotLeaderForPartition right after an election), until `READ_TIMEOUT`.
fn ends_retrying(consumer: &BaseConsumer, topic: &str, n: i32) -> Result<Vec<i64>> {
    let started = Instant::now();
    loop {
        match end_offsets(consumer, topic, n) {
            Ok(ends) => return Ok(ends),
            Err(e) if started.elapsed() >= READ_TIMEOUT => return Err(e),
            Err(e) => eprintln!("{topic}: end offsets: {e} (retrying)"),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The end offsets of `topic` once they stayed the same for `quiet` (or after `READ_TIMEOUT`).
fn settled_ends(consumer: &BaseConsumer, topic: &str, n: i32, quiet: Duration) -> Result<Vec<i64>> {
    let started = Instant::now();
    let mut last = ends_retrying(consumer, topic, n)?;
    let mut since = Instant::now();
    while since.elapsed() < quiet && started.elapsed() < READ_TIMEOUT {
        std::thread::sleep(Duration::from_millis(250));
        let now = ends_retrying(consumer, topic, n)?;
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
    Ok(last)
}

pub fn verify(v: &Verify) -> Result<()> {
    let consumer = plain_consumer(&v.target)?;
    let n = partitions(&consumer, &v.topic, Duration::from_secs(30))?;
    let ends = settled_ends(&consumer, &v.topic, n, v.quiet)?;
    let expect = usize::try_from(v.expect)?;
    let mut copies = vec![0_u32; expect];
    let mut read = 0_u64;
    let mut foreign = 0_u64;
    let mut dup_by_partition: BTreeMap<i32, u64> = BTreeMap::new();
    let mut dup_examples = Vec::new();
    read_all(&consumer, &v.topic, &ends, |p, offset, value| {
        read += 1;
        match value.and_then(seq_of).and_then(|s| usize::try_from(s).ok()) {
            Some(s) if s < expect => {
                copies[s] += 1;
                if copies[s] > 1 {
                    *dup_by_partition.entry(p).or_default() += 1;
                    if dup_examples.len() < EXAMPLES {
                        dup_examples.push(json!({"seq": s, "partition": p, "offset": offset}));
                    }
                }
            }
            _ => foreign += 1,
        }
    })?;
    let missing: Vec<u64> = (0..v.expect).filter(|s| copies[*s as usize] == 0).collect();
    let duplicates: u64 = copies.iter().map(|c| u64::from(c.saturating_sub(1))).sum();
    // Where the missing records are on the source: partition, how many, first and last offset.
    let mut on_source = serde_json::Value::Null;
    if let (false, Some((bootstrap, topic))) = (missing.is_empty(), &v.source) {
        let src = plain_consumer(bootstrap)?;
        let sn = partitions(&src, topic, Duration::from_secs(30))?;
        let src_ends = ends_retrying(&src, topic, sn)?;
        let mut by_partition: BTreeMap<i32, (u64, i64, i64)> = BTreeMap::new();
        read_all(&src, topic, &src_ends, |p, offset, value| {
            if let Some(s) = value.and_then(seq_of)
                && usize::try_from(s).is_ok_and(|s| s < expect && copies[s] == 0)
            {
                let e = by_partition.entry(p).or_insert((0, offset, offset));
                e.0 += 1;
                e.1 = e.1.min(offset);
                e.2 = e.2.max(offset);
            }
        })
        .context("reading the source for the missing records")?;
        on_source = by_partition
            .into_iter()
            .map(|(p, (count, first, last))| {
                json!({"partition": p, "records": count, "first_offset": first, "last_offset": last})
            })
            .collect();
    }
    println!(
        "{}",
        json!({
            "records_read": read,
            "end_offsets": ends,
            "distinct": v.expect - missing.len() as u64,
            "missing": missing.len(),
            "duplicates": duplicates,
            "foreign": foreign,
            "missing_seq_examples": missing.iter().take(EXAMPLES).collect::<Vec<_>>(),
            "missing_on_source": on_source,
            "duplicates_by_partition": dup_by_partition,
            "duplicate_examples": dup_examples,
        })
    );
    Ok(())
}

/// The node id leading `partition` of `topic` (-1: none).
pub fn leader(bootstrap: &str, topic: &str, partition: i32) -> Result<i32> {
    let consumer = plain_consumer(bootstrap)?;
    partitions(&consumer, topic, Duration::from_secs(30))?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    md.topics()
        .iter()
        .find(|t| t.name() == topic)
        .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
        .map(|p| p.leader())
        .with_context(|| format!("{topic}-{partition}: not in the metadata"))
}

/// Waits until every partition of every topic has all its replicas in sync; prints how long.
pub fn wait_in_sync(bootstrap: &str, timeout: Duration) -> Result<()> {
    let consumer = plain_consumer(bootstrap)?;
    let started = Instant::now();
    loop {
        let behind: Vec<String> = match consumer.fetch_metadata(None, Duration::from_secs(10)) {
            Ok(md) => md
                .topics()
                .iter()
                .flat_map(|t| {
                    t.partitions()
                        .iter()
                        .filter(|p| p.isr().len() < p.replicas().len() || p.leader() < 0)
                        .map(move |p| format!("{}-{}", t.name(), p.id()))
                })
                .collect(),
            Err(e) => vec![format!("no metadata: {e}")],
        };
        if behind.is_empty() {
            println!(
                "{}",
                json!({"in_sync_after_s": started.elapsed().as_secs_f64()})
            );
            return Ok(());
        }
        if started.elapsed() >= timeout {
            bail!(
                "after {timeout:?}, {} partitions still have replicas out of sync, e.g. {:?}",
                behind.len(),
                &behind[..behind.len().min(5)]
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seq_of_a_loaded_record_is_read_back() {
        assert_eq!(
            seq_of(br#"{"country":"DE","seq":12345,"ts":"x"}"#),
            Some(12345)
        );
        assert_eq!(seq_of(br#"{"seq":0}"#), Some(0));
        assert_eq!(seq_of(b"random bytes"), None);
    }
}
