//! The source loop against the world's real Kafka clusters: MM2's integration scenarios for
//! copying, naming, config sync, discovery, offset syncs, restarts and the split between
//! replicas. Each test uses fresh aliases and topics, so tests never see each other's data.
//!
//! Left out on purpose: broker restarts (the world is shared; restarting a broker would break
//! other engineers' runs).

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mirrorflow_e2e::replicator::{Replicator, binary, measured_condition, number_field, plain};
use mirrorflow_e2e::{World, eventually, fidelity, kafka, unique};
use rdkafka::admin::{AdminOptions, AlterConfig, ConfigSource, NewPartitions, ResourceSpecifier};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const WAIT: Duration = Duration::from_secs(90);

/// One test's world: fresh aliases, a flow name, a metrics port.
struct Setup {
    world: World,
    name: String,
    source_alias: String,
    target_alias: String,
}

impl Setup {
    fn new(prefix: &str) -> Result<Setup> {
        Ok(Setup {
            world: World::from_env()?,
            name: unique(prefix),
            source_alias: unique("src"),
            target_alias: unique("tgt"),
        })
    }

    /// A flow with fast refreshes and only the source loop, plus `extra` YAML.
    fn flow(&self, topics: &[&str], extra: &str) -> String {
        let topics: Vec<String> = topics.iter().map(|t| format!("'{t}'")).collect();
        format!(
            "source: {{alias: {}, bootstrapServers: '{}'}}\n\
             target: {{alias: {}, bootstrapServers: '{}'}}\n\
             topics: [{}]\n\
             checkpoints: {{enabled: false}}\n\
             heartbeats: {{enabled: false}}\n{extra}",
            self.source_alias,
            self.world.source_bootstrap,
            self.target_alias,
            self.world.target_bootstrap,
            topics.join(", ")
        )
    }

    fn start(&self, replica: &str, flow: &str) -> Result<Replicator> {
        Replicator::start(
            &self.world.repo_root,
            &format!("{}-{replica}", self.name),
            flow,
            free_port()?,
        )
    }

    fn remote(&self, topic: &str) -> String {
        format!("{}.{topic}", self.source_alias)
    }
}

const FAST: &str = "sourceLoop: {topicsRefreshInterval: 1s, offsetSyncInterval: 1s}\n";

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// A record as read back, with everything the copy must preserve.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp: Option<i64>,
}

/// A reader of the tests' topics; it reports reaching a partition's end (see [`read_all`]).
fn consumer(bootstrap: &str) -> Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "mirrorflow-e2e-source-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()?)
}

/// High watermark of every partition of `topic` (error while the topic does not exist).
fn end_offsets(bootstrap: &str, topic: &str) -> Result<Vec<i64>> {
    Ok(watermarks(bootstrap, topic)?
        .into_iter()
        .map(|(_, h)| h)
        .collect())
}

/// (low, high) watermarks of every partition of `topic`.
fn watermarks(bootstrap: &str, topic: &str) -> Result<Vec<(i64, i64)>> {
    let c = consumer(bootstrap)?;
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let t = md.topics().first().context("no metadata")?;
    ensure!(
        t.error().is_none() && !t.partitions().is_empty(),
        "{topic} does not exist"
    );
    t.partitions()
        .iter()
        .map(|p| Ok(c.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?))
        .collect()
}

/// Every record of every partition of `topic`, in partition then offset order. A partition is
/// read once the consumer passed its high watermark or reached its end (a copy written in
/// transactions ends with a commit marker, which no record carries).
fn read_all(bootstrap: &str, topic: &str) -> Result<Vec<Rec>> {
    let marks = watermarks(bootstrap, topic)?;
    let ends: Vec<i64> = marks.iter().map(|(_, h)| *h).collect();
    let c = consumer(bootstrap)?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..ends.len() as i32 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let mut next: Vec<i64> = marks.iter().map(|(l, _)| *l).collect();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while next.iter().zip(&ends).any(|(n, e)| n < e) {
        if Instant::now() > deadline {
            bail!("reading {topic} timed out at {next:?} of {ends:?}");
        }
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                next[m.partition() as usize] = m.offset() + 1;
                out.push(Rec {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                    headers: m
                        .headers()
                        .map(|h| {
                            h.iter()
                                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                                .collect()
                        })
                        .unwrap_or_default(),
                    timestamp: m.timestamp().to_millis(),
                });
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                // The end now lies at or past the watermark read before.
                if let (Some(n), Some(e)) = (next.get_mut(p as usize), ends.get(p as usize)) {
                    *n = (*n).max(*e);
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}

/// Waits until `topic` holds at least `n` records in total, counted record by record (end
/// offsets also count a transactional copy's markers).
async fn wait_for_records(bootstrap: &str, topic: &str, n: usize) -> Result<()> {
    eventually(&format!("{n} records read from {topic}"), WAIT, || async {
        Ok((read_all(bootstrap, topic)?.len() >= n).then_some(()))
    })
    .await
}

/// Waits until `topic` on the target holds at least `n` records in total.
async fn wait_for_count(bootstrap: &str, topic: &str, n: i64) -> Result<()> {
    let (bootstrap, topic) = (bootstrap.to_string(), topic.to_string());
    eventually(&format!("{n} records in {topic}"), WAIT, || {
        let (bootstrap, topic) = (bootstrap.clone(), topic.clone());
        async move {
            let total: i64 = end_offsets(&bootstrap, &topic)?.iter().sum();
            Ok((total >= n).then_some(()))
        }
    })
    .await
}

/// Dynamic (topic-level) configs of a topic.
async fn topic_configs(bootstrap: &str, topic: &str) -> Result<BTreeMap<String, String>> {
    let results = kafka::admin(bootstrap)?
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await?;
    let resource = results
        .into_iter()
        .next()
        .context("no config result")?
        .map_err(|e| anyhow::anyhow!("describe {topic}: {e}"))?;
    Ok(resource
        .entries
        .into_iter()
        .filter(|e| e.source == ConfigSource::DynamicTopic)
        .filter_map(|e| Some((e.name, e.value?)))
        .collect())
}

/// Sends `(partition, key, value)` records with a header and a fixed timestamp each.
async fn produce(
    producer: &FutureProducer,
    topic: &str,
    records: &[(i32, String, String)],
) -> Result<()> {
    let mut pending = Vec::with_capacity(records.len());
    // Explicit but recent: records far in the past would fall to retention at once.
    let base_ts = now_ms() - 3_600_000;
    for (i, (p, k, v)) in records.iter().enumerate() {
        let headers = OwnedHeaders::new().insert(Header {
            key: "h",
            value: Some(k.as_bytes()),
        });
        let record = FutureRecord::to(topic)
            .partition(*p)
            .key(k)
            .payload(v)
            .headers(headers)
            .timestamp(base_ts + i as i64);
        match producer.send_result(record) {
            Ok(d) => pending.push(d),
            Err((e, _)) => bail!("enqueueing: {e}"),
        }
    }
    for d in pending {
        d.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// `n` records spread over `partitions`, values unique under `tag`.
fn records(tag: &str, partitions: i32, n: usize) -> Vec<(i32, String, String)> {
    (0..n)
        .map(|i| {
            (
                (i % partitions as usize) as i32,
                format!("k{i}"),
                format!("{tag}-{i}"),
            )
        })
        .collect()
}

/// Counts of each value on the target; fails if a source value is missing.
fn check_all_present(source: &[Rec], target: &[Rec]) -> Result<usize> {
    let mut seen: HashMap<&[u8], usize> = HashMap::new();
    for r in target {
        *seen
            .entry(r.value.as_deref().unwrap_or_default())
            .or_default() += 1;
    }
    let missing: Vec<&Rec> = source
        .iter()
        .filter(|r| !seen.contains_key(r.value.as_deref().unwrap_or_default()))
        .collect();
    ensure!(
        missing.is_empty(),
        "{} source records missing on the target, first {:?}",
        missing.len(),
        missing.first()
    );
    Ok(seen.values().map(|n| n - 1).sum())
}

/// Decodes an MM2 offset sync (key: topic STRING, partition INT32; value: up, down INT64).
fn decode_sync(key: &[u8], value: &[u8]) -> Option<(String, i32, i64, i64)> {
    let len = i16::from_be_bytes(key.get(..2)?.try_into().ok()?) as usize;
    let topic = String::from_utf8(key.get(2..2 + len)?.to_vec()).ok()?;
    let partition = i32::from_be_bytes(key.get(2 + len..6 + len)?.try_into().ok()?);
    let up = i64::from_be_bytes(value.get(..8)?.try_into().ok()?);
    let down = i64::from_be_bytes(value.get(8..16)?.try_into().ok()?);
    Some((topic, partition, up, down))
}

#[tokio::test]
async fn records_are_copied_with_key_value_headers_timestamp_and_partition() -> Result<()> {
    let s = Setup::new("copy")?;
    let topic = unique("orders");
    kafka::create_topic(&s.world.source_bootstrap, &topic, 3).await?;
    let producer = kafka::producer(&s.world.source_bootstrap, Duration::from_secs(30))?;
    // MF_COPY_RECORDS raises the count for a rough throughput figure.
    let n_records = std::env::var("MF_COPY_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30_000_usize);
    let produced = Instant::now();
    produce(&producer, &topic, &records("a", 3, n_records)).await?;
    eprintln!("produced {n_records} records in {:?}", produced.elapsed());
    // A tombstone and a record without key or headers are copied as they are.
    producer
        .send(
            FutureRecord::<str, ()>::to(&topic).partition(0).key("gone"),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    producer
        .send(
            FutureRecord::<(), str>::to(&topic)
                .partition(1)
                .payload("bare"),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;

    let started = Instant::now();
    let r = s.start("r", &s.flow(&[&topic], FAST))?;
    let remote = s.remote(&topic);
    wait_for_count(&s.world.target_bootstrap, &remote, n_records as i64 + 2)
        .await
        .with_context(|| r.log_text())?;
    let took = started.elapsed();
    let rss = r
        .pid()
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .and_then(|st| {
            st.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(str::to_string)
        });
    eprintln!("replicator peak RSS: {}", rss.unwrap_or_default());
    eprintln!(
        "copied {} records in {took:?} including start-up ({:.0} records/s)",
        n_records + 2,
        (n_records + 2) as f64 / took.as_secs_f64()
    );

    let source = read_all(&s.world.source_bootstrap, &topic)?;
    let target = read_all(&s.world.target_bootstrap, &remote)?;
    ensure!(
        end_offsets(&s.world.target_bootstrap, &remote)?.len() == 3,
        "same partition count"
    );
    // Same partitions, same order, same content: a fresh topic gets the same offsets too.
    assert_eq!(source.len(), target.len());
    for (a, b) in source.iter().zip(&target) {
        assert_eq!(a, b, "record copied exactly");
    }
    assert!(
        target
            .iter()
            .any(|r| r.value.is_none() && r.key.as_deref() == Some(b"gone".as_slice()))
    );

    // Offset syncs: on the source, decodable, marked dense, one at least for every partition.
    let syncs_topic = format!("mm2-offset-syncs.{}.internal", s.target_alias);
    let syncs = eventually("offset syncs for all partitions", WAIT, || {
        let (b, t, topic) = (
            s.world.source_bootstrap.clone(),
            syncs_topic.clone(),
            topic.clone(),
        );
        async move {
            let all = read_all(&b, &t)?;
            let decoded: Vec<_> = all
                .iter()
                .filter_map(|r| decode_sync(r.key.as_deref()?, r.value.as_deref()?).map(|d| (d, r)))
                .collect();
            let partitions: std::collections::BTreeSet<i32> = decoded
                .iter()
                .filter(|((t, ..), _)| *t == topic)
                .map(|((_, p, ..), _)| *p)
                .collect();
            Ok((partitions.len() == 3).then_some(
                decoded
                    .into_iter()
                    .map(|(d, r)| (d, r.clone()))
                    .collect::<Vec<_>>(),
            ))
        }
    })
    .await?;
    // `heartbeats` is always replicated too; only this test's topic is checked.
    for ((t, p, up, down), rec) in syncs.iter().filter(|((t, ..), _)| *t == topic) {
        assert!((0..3).contains(p) && *up >= 0 && *down >= 0);
        // The copy preserves offsets here, so every sync says up == down.
        assert_eq!(up, down, "sync {t}-{p}");
        assert_eq!(
            rec.headers,
            [("mirrorflow.sync".to_string(), Some(b"dense".to_vec()))]
        );
    }
    let copied = r
        .metric("mirrorflow_records_replicated_total")
        .unwrap_or(0.0);
    assert!(
        copied >= (n_records + 2) as f64,
        "records_replicated_total {copied}"
    );
    assert!(r.metric("mirrorflow_offset_syncs_total").unwrap_or(0.0) >= 3.0);
    let assigned = r.metric("mirrorflow_assigned_partitions").unwrap_or(0.0);
    assert!(
        assigned >= 3.0,
        "3 partitions of {topic} plus heartbeats: {assigned}"
    );
    Ok(())
}

#[tokio::test]
async fn identity_policy_keeps_topic_names() -> Result<()> {
    let s = Setup::new("identity")?;
    let topic = unique("same-name");
    kafka::create_topic(&s.world.source_bootstrap, &topic, 2).await?;
    let producer = kafka::producer(&s.world.source_bootstrap, Duration::from_secs(30))?;
    produce(&producer, &topic, &records("i", 2, 100)).await?;
    let r = s.start(
        "r",
        &s.flow(
            &[&topic],
            &format!("{FAST}replicationPolicy: {{type: Identity}}\n"),
        ),
    )?;
    wait_for_count(&s.world.target_bootstrap, &topic, 100)
        .await
        .with_context(|| r.log_text())?;
    let target = kafka::topics(&s.world.target_bootstrap)?;
    assert!(!target.contains(&s.remote(&topic)), "no prefixed copy");
    let copied = read_all(&s.world.target_bootstrap, &topic)?;
    assert_eq!(copied, read_all(&s.world.source_bootstrap, &topic)?);
    Ok(())
}

#[tokio::test]
async fn topic_configs_are_synced_except_mm2_exclusions() -> Result<()> {
    let s = Setup::new("configs")?;
    let topic = unique("compacted");
    kafka::create_topic_with(
        &s.world.source_bootstrap,
        &topic,
        1,
        &[
            ("cleanup.policy", "compact"),
            ("min.insync.replicas", "1"),
            ("retention.ms", "86400000"),
        ],
    )
    .await?;
    let r = s.start("r", &s.flow(&[&topic], FAST))?;
    let remote = s.remote(&topic);
    let configs = eventually("remote topic created", WAIT, || {
        let (b, t) = (s.world.target_bootstrap.clone(), remote.clone());
        async move {
            // Describing a missing topic answers with no entries rather than an error.
            if !kafka::topics(&b)?.contains(&t) {
                return Ok(None);
            }
            Ok(Some(topic_configs(&b, &t).await?))
        }
    })
    .await
    .with_context(|| r.log_text())?;
    assert_eq!(
        configs.get("cleanup.policy").map(String::as_str),
        Some("compact")
    );
    assert_eq!(
        configs.get("retention.ms").map(String::as_str),
        Some("86400000")
    );
    assert!(
        !configs.contains_key("min.insync.replicas"),
        "excluded: {configs:?}"
    );

    // A later change on the source follows.
    let alter = AlterConfig::new(ResourceSpecifier::Topic(&topic))
        .set("cleanup.policy", "compact")
        .set("min.insync.replicas", "1")
        .set("retention.ms", "3600000");
    kafka::admin(&s.world.source_bootstrap)?
        .alter_configs(&[alter], &AdminOptions::new())
        .await?;
    eventually("retention.ms synced", WAIT, || {
        let (b, t) = (s.world.target_bootstrap.clone(), remote.clone());
        async move {
            let c = topic_configs(&b, &t).await?;
            Ok((c.get("retention.ms").map(String::as_str) == Some("3600000")).then_some(()))
        }
    })
    .await
    .with_context(|| r.log_text())?;
    Ok(())
}

#[tokio::test]
async fn new_topics_and_new_partitions_are_picked_up() -> Result<()> {
    let s = Setup::new("discover")?;
    let prefix = unique("disc");
    let first = format!("{prefix}-a");
    kafka::create_topic(&s.world.source_bootstrap, &first, 2).await?;
    let producer = kafka::producer(&s.world.source_bootstrap, Duration::from_secs(30))?;
    produce(&producer, &first, &records("a", 2, 20)).await?;
    let r = s.start("r", &s.flow(&[&format!("{prefix}-.*")], FAST))?;
    wait_for_count(&s.world.target_bootstrap, &s.remote(&first), 20)
        .await
        .with_context(|| r.log_text())?;

    // A topic created after start.
    let second = format!("{prefix}-b");
    kafka::create_topic(&s.world.source_bootstrap, &second, 1).await?;
    produce(&producer, &second, &records("b", 1, 10)).await?;
    wait_for_count(&s.world.target_bootstrap, &s.remote(&second), 10)
        .await
        .with_context(|| r.log_text())?;

    // 2 -> 3 partitions: the remote grows and the new partition is copied.
    kafka::admin(&s.world.source_bootstrap)?
        .create_partitions(&[NewPartitions::new(&first, 3)], &AdminOptions::new())
        .await?;
    eventually("3 source partitions", WAIT, || {
        let (b, t) = (s.world.source_bootstrap.clone(), first.clone());
        async move { Ok((end_offsets(&b, &t)?.len() == 3).then_some(())) }
    })
    .await?;
    // A fresh producer: the first one's metadata still says 2 partitions.
    let producer = kafka::producer(&s.world.source_bootstrap, Duration::from_secs(30))?;
    let on_new: Vec<_> = (0..5)
        .map(|i| (2, format!("n{i}"), format!("new-{i}")))
        .collect();
    produce(&producer, &first, &on_new).await?;
    let remote = s.remote(&first);
    eventually("5 records in the new remote partition", WAIT, || {
        let (b, t) = (s.world.target_bootstrap.clone(), remote.clone());
        async move {
            let ends = end_offsets(&b, &t)?;
            Ok((ends.len() == 3 && ends[2] >= 5).then_some(()))
        }
    })
    .await
    .with_context(|| r.log_text())?;
    let target = read_all(&s.world.target_bootstrap, &remote)?;
    let new: Vec<&[u8]> = target
        .iter()
        .filter(|r| r.partition == 2)
        .filter_map(|r| r.value.as_deref())
        .collect();
    assert_eq!(
        new,
        ["new-0", "new-1", "new-2", "new-3", "new-4"].map(str::as_bytes)
    );
    Ok(())
}

#[tokio::test]
async fn heartbeats_are_replicated_despite_filters_and_cycles_are_refused() -> Result<()> {
    let s = Setup::new("hb-cycle")?;
    // The shared `heartbeats` topic: create it if nobody did, and add one valid heartbeat of
    // this test's own aliases (MM2 format) so there is something to copy.
    match kafka::create_topic_with(&s.world.source_bootstrap, "heartbeats", 1, &[]).await {
        Ok(()) => {}
        Err(e) if e.to_string().contains("already exists") => {}
        Err(e) => return Err(e),
    }
    let mut key = Vec::new();
    for a in [&s.source_alias, &s.target_alias] {
        key.extend_from_slice(&(a.len() as i16).to_be_bytes());
        key.extend_from_slice(a.as_bytes());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let value = [&0_i16.to_be_bytes()[..], &now.to_be_bytes()].concat();
    let producer = kafka::producer(&s.world.source_bootstrap, Duration::from_secs(30))?;
    producer
        .send(
            FutureRecord::to("heartbeats")
                .partition(0)
                .key(&key)
                .payload(&value),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;

    let plain = unique("plain");
    let looped = format!("{}.{}", s.target_alias, unique("topic1"));
    for t in [&plain, &looped] {
        kafka::create_topic(&s.world.source_bootstrap, t, 1).await?;
        produce(&producer, t, &records("c", 1, 10)).await?;
    }
    let r = s.start("r", &s.flow(&[&plain, &looped.replace('.', "\\.")], FAST))?;
    wait_for_count(&s.world.target_bootstrap, &s.remote(&plain), 10)
        .await
        .with_context(|| r.log_text())?;
    let hb_remote = s.remote("heartbeats");
    let hb_ends: i64 = end_offsets(&s.world.source_bootstrap, "heartbeats")?
        .iter()
        .sum();
    wait_for_count(&s.world.target_bootstrap, &hb_remote, hb_ends)
        .await
        .with_context(|| r.log_text())?;
    let copied = read_all(&s.world.target_bootstrap, &hb_remote)?;
    assert!(
        copied
            .iter()
            .any(|r| r.key.as_deref() == Some(key.as_slice())),
        "our heartbeat copied"
    );
    // Two more discovery rounds: the cycle topic still has no remote copy.
    r.discovery_rounds(2, Duration::from_secs(60))
        .await
        .with_context(|| r.log_text())?;
    let target = kafka::topics(&s.world.target_bootstrap)?;
    assert!(
        !target.contains(&s.remote(&looped)),
        "{looped} came from the target: never copied back"
    );
    assert!(r.log_text().contains("cycle"), "the refusal is logged");
    Ok(())
}

#[tokio::test]
async fn offset_syncs_can_live_on_the_target() -> Result<()> {
    let s = Setup::new("syncs-target")?;
    let topic = unique("t");
    kafka::create_topic(&s.world.source_bootstrap, &topic, 1).await?;
    let producer = kafka::producer(&s.world.source_bootstrap, Duration::from_secs(30))?;
    produce(&producer, &topic, &records("s", 1, 50)).await?;
    let r = s.start(
        "r",
        &s.flow(
            &[&topic],
            "sourceLoop: {topicsRefreshInterval: 1s, offsetSyncInterval: 1s, offsetSyncsLocation: Target}\n",
        ),
    )?;
    wait_for_count(&s.world.target_bootstrap, &s.remote(&topic), 50)
        .await
        .with_context(|| r.log_text())?;
    let on_target = format!("mm2-offset-syncs.{}.internal", s.source_alias);
    // `heartbeats` is replicated too: look for this test's topic.
    let first = eventually("a sync of the topic on the target", WAIT, || {
        let (b, t, topic) = (
            s.world.target_bootstrap.clone(),
            on_target.clone(),
            topic.clone(),
        );
        async move {
            Ok(read_all(&b, &t)?
                .iter()
                .filter_map(|r| decode_sync(r.key.as_deref()?, r.value.as_deref()?))
                .find(|(t, ..)| *t == topic))
        }
    })
    .await
    .with_context(|| r.log_text())?;
    assert_eq!(
        (first.0.as_str(), first.1, first.2, first.3),
        (topic.as_str(), 0, 0, 0),
        "the first record of the partition gets a sync"
    );
    let on_source = format!("mm2-offset-syncs.{}.internal", s.target_alias);
    assert!(!kafka::topics(&s.world.source_bootstrap)?.contains(&on_source));
    Ok(())
}

#[tokio::test]
async fn restarts_resume_without_loss_and_a_graceful_stop_without_duplicates() -> Result<()> {
    let s = Setup::new("restart")?;
    let topic = unique("r");
    kafka::create_topic(&s.world.source_bootstrap, &topic, 2).await?;
    let producer = kafka::producer(&s.world.source_bootstrap, Duration::from_secs(30))?;
    let remote = s.remote(&topic);
    let flow = s.flow(&[&topic], FAST);

    produce(&producer, &topic, &records("one", 2, 2000)).await?;
    let mut r = s.start("r", &flow)?;
    wait_for_count(&s.world.target_bootstrap, &remote, 2000)
        .await
        .with_context(|| r.log_text())?;
    assert_eq!(r.stop(Duration::from_secs(30)), Some(0), "SIGTERM exits 0");

    produce(&producer, &topic, &records("two", 2, 2000)).await?;
    let mut r = s.start("r", &flow)?;
    wait_for_count(&s.world.target_bootstrap, &remote, 4000)
        .await
        .with_context(|| r.log_text())?;
    let source = read_all(&s.world.source_bootstrap, &topic)?;
    let dups = check_all_present(&source, &read_all(&s.world.target_bootstrap, &remote)?)?;
    assert_eq!(dups, 0, "a graceful stop stores every position");

    // A crash while copying: kill -9 mid-stream, then resume.
    produce(&producer, &topic, &records("three", 2, 20_000)).await?;
    eventually("copying under way", WAIT, || {
        let (b, t) = (s.world.target_bootstrap.clone(), remote.clone());
        async move { Ok((end_offsets(&b, &t)?.iter().sum::<i64>() > 4000).then_some(())) }
    })
    .await?;
    r.kill();
    let _r = s.start("r", &flow)?;
    wait_for_count(&s.world.target_bootstrap, &remote, 24_000).await?;
    let source = read_all(&s.world.source_bootstrap, &topic)?;
    // Duplicates after a crash are allowed (at-least-once); wait for the copy to settle.
    eventually(
        "every source record on the target after the crash",
        WAIT,
        || {
            let (b, t, source) = (
                s.world.target_bootstrap.clone(),
                remote.clone(),
                source.clone(),
            );
            async move {
                let target = read_all(&b, &t)?;
                Ok(check_all_present(&source, &target).ok())
            }
        },
    )
    .await
    .map(|dups| eprintln!("duplicates after kill -9: {dups}"))?;
    Ok(())
}

#[tokio::test]
async fn two_replicators_split_the_partitions() -> Result<()> {
    let s = Setup::new("split")?;
    let topic = unique("split");
    kafka::create_topic(&s.world.source_bootstrap, &topic, 6).await?;
    let producer = kafka::producer(&s.world.source_bootstrap, Duration::from_secs(30))?;
    let remote = s.remote(&topic);
    let flow = s.flow(&[&topic], FAST);
    produce(&producer, &topic, &records("before", 6, 600)).await?;
    let a = s.start("a", &flow)?;
    wait_for_count(&s.world.target_bootstrap, &remote, 600)
        .await
        .with_context(|| a.log_text())?;
    let b = s.start("b", &flow)?;
    // `heartbeats` is always replicated: its partitions are split too.
    let total = 6.0
        + end_offsets(&s.world.source_bootstrap, "heartbeats")
            .map(|p| p.len() as f64)
            .unwrap_or(0.0);
    let assigned = |r: &Replicator| r.metric("mirrorflow_assigned_partitions").unwrap_or(0.0);
    eventually(
        "both replicas own partitions, all of them once",
        WAIT,
        || {
            let (x, y) = (assigned(&a), assigned(&b));
            async move { Ok((x > 0.0 && y > 0.0 && x + y == total).then_some(())) }
        },
    )
    .await
    .with_context(|| format!("{}\n---\n{}", a.log_text(), b.log_text()))?;
    produce(&producer, &topic, &records("after", 6, 6000)).await?;
    wait_for_count(&s.world.target_bootstrap, &remote, 6600)
        .await
        .with_context(|| format!("{}\n---\n{}", a.log_text(), b.log_text()))?;
    // Let any straggler land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let source = read_all(&s.world.source_bootstrap, &topic)?;
    let target = read_all(&s.world.target_bootstrap, &remote)?;
    let dups = check_all_present(&source, &target)?;
    assert_eq!(
        dups, 0,
        "a graceful rebalance moves partitions without copying twice"
    );
    // The replicas' counts also include `heartbeats`, which keeps growing (others write to
    // it): bracket it by the remote heartbeats' size before and after reading the metrics.
    let hb_remote = s.remote("heartbeats");
    let hb = || -> f64 {
        end_offsets(&s.world.target_bootstrap, &hb_remote)
            .map(|e| e.iter().sum::<i64>() as f64)
            .unwrap_or(0.0)
    };
    let before = hb();
    let count = |r: &Replicator| {
        r.metric("mirrorflow_records_replicated_total")
            .unwrap_or(0.0)
    };
    let (ca, cb) = (count(&a), count(&b));
    let after = hb();
    assert!(
        ca > 0.0 && cb > 0.0,
        "each replica copied its share ({ca} + {cb})"
    );
    assert!(
        6600.0 + before - 2.0 <= ca + cb && ca + cb <= 6600.0 + after,
        "each record copied by one replica: {ca} + {cb} vs 6600 + heartbeats {before}..{after}"
    );
    Ok(())
}

/// A replica far from the source runs several consumers by itself; `consumers: 2` forces that
/// here. They split the replica's partitions as two replicas would, and a graceful stop hands
/// all of them on: a replica with one consumer goes on from both consumers' positions without
/// copying a record twice.
#[tokio::test]
async fn two_consumers_in_one_replica_split_its_partitions_and_hand_them_on() -> Result<()> {
    two_consumers_split_and_hand_on("consumers", "", "").await?;
    Ok(())
}

/// The same exactly-once: each consumer's partitions get their own transactional producers,
/// and the handover copies no record twice (checked by the scenario).
#[tokio::test]
async fn two_exactly_once_consumers_in_one_replica_hand_on_without_duplicates() -> Result<()> {
    two_consumers_split_and_hand_on(
        "consumerseo",
        "exactlyOnce: true\n",
        "offsetSyncsLocation: Target, ",
    )
    .await?;
    Ok(())
}

/// The same with `offsets: Aligned`: each consumer's partitions get their own transactional
/// producers, and every copied record keeps its source offset across the split and the handover.
#[tokio::test]
async fn two_aligned_consumers_in_one_replica_keep_every_offset() -> Result<()> {
    let (topic, remote) =
        two_consumers_split_and_hand_on("consumersal", "offsets: Aligned\n", "").await?;
    for p in 0..6 {
        let source = fidelity::read_visible(&topic.0, &topic.1, p)?;
        let target = fidelity::read_visible(&remote.0, &remote.1, p)?;
        let at = |recs: &[fidelity::Rec]| -> Vec<(i64, String)> {
            recs.iter().map(|r| (r.offset, r.value.clone())).collect()
        };
        ensure!(
            at(&source) == at(&target),
            "partition {p}: the target's records are not at their source offsets"
        );
    }
    Ok(())
}

/// Runs the two-consumer scenario with `mode` added to the flow and `source_loop` to its
/// `sourceLoop`; returns (source bootstrap, topic) and (target bootstrap, remote topic).
async fn two_consumers_split_and_hand_on(
    prefix: &str,
    mode: &str,
    source_loop: &str,
) -> Result<((String, String), (String, String))> {
    let s = Setup::new(prefix)?;
    let topic = unique(prefix);
    kafka::create_topic(&s.world.source_bootstrap, &topic, 6).await?;
    let producer = kafka::producer(&s.world.source_bootstrap, Duration::from_secs(30))?;
    let remote = s.remote(&topic);
    produce(&producer, &topic, &records("before", 6, 600)).await?;
    let two = s.flow(
        &[&topic],
        &format!(
            "{mode}sourceLoop: {{{source_loop}topicsRefreshInterval: 1s, offsetSyncInterval: 1s, consumers: 2}}\n"
        ),
    );
    let mut a = s.start("a", &two)?;
    wait_for_records(&s.world.target_bootstrap, &remote, 600)
        .await
        .with_context(|| a.log_text())?;
    // A standalone flow is named after its file, flow.yaml.
    let group = format!(
        "mirrorflow.flow.{}-{}.source",
        s.source_alias, s.target_alias
    );
    // `heartbeats` is always replicated: its partitions are split too.
    let total = 6.0
        + end_offsets(&s.world.source_bootstrap, "heartbeats")
            .map(|p| p.len() as f64)
            .unwrap_or(0.0);
    eventually(
        "two consumers in the source group, each owning some partitions, the replica all once",
        WAIT,
        || {
            let members = kafka::group_members(&s.world.source_bootstrap, &group).ok();
            let consumers = a.metric("mirrorflow_source_consumers");
            let assigned = a.metric("mirrorflow_assigned_partitions");
            let owned = owned_by_consumer(&a.log_text());
            async move {
                let split = owned.len() == 2 && owned.values().all(|&n| n > 0);
                Ok((split
                    && members == Some(2)
                    && consumers == Some(2.0)
                    && assigned == Some(total))
                .then_some(()))
            }
        },
    )
    .await
    .with_context(|| a.log_text())?;
    produce(&producer, &topic, &records("after", 6, 6000)).await?;
    wait_for_records(&s.world.target_bootstrap, &remote, 6600)
        .await
        .with_context(|| a.log_text())?;
    assert_eq!(a.stop(Duration::from_secs(30)), Some(0), "SIGTERM exits 0");

    produce(&producer, &topic, &records("later", 6, 600)).await?;
    let one = s.flow(
        &[&topic],
        &format!(
            "{mode}sourceLoop: {{{source_loop}topicsRefreshInterval: 1s, offsetSyncInterval: 1s, consumers: 1}}\n"
        ),
    );
    let b = s.start("b", &one)?;
    wait_for_records(&s.world.target_bootstrap, &remote, 7200)
        .await
        .with_context(|| b.log_text())?;
    // Let any straggler land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let source = read_all(&s.world.source_bootstrap, &topic)?;
    let dups = check_all_present(&source, &read_all(&s.world.target_bootstrap, &remote)?)?;
    assert_eq!(
        dups, 0,
        "both consumers stored their positions on a graceful stop"
    );
    assert_eq!(b.metric("mirrorflow_source_consumers"), Some(1.0));
    Ok((
        (s.world.source_bootstrap.clone(), topic),
        (s.world.target_bootstrap.clone(), remote),
    ))
}

/// Partitions each source consumer of a replica owns, by its latest assignment log line
/// (`partitions=N consumer=I`; the text log colours field names, so escapes are dropped first).
fn owned_by_consumer(log: &str) -> BTreeMap<u32, u32> {
    log.lines()
        .filter(|l| l.contains("assigned to this consumer"))
        .map(plain)
        .filter_map(|l| {
            Some((
                number_field(&l, "consumer")?,
                number_field(&l, "partitions")?,
            ))
        })
        .collect()
}

#[tokio::test]
async fn an_invalid_flow_exits_non_zero_naming_the_field() -> Result<()> {
    let s = Setup::new("invalid")?;
    let dir = std::env::temp_dir().join("mirrorflow-e2e").join(&s.name);
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("flow.yaml");
    std::fs::write(&file, s.flow(&["(unclosed"], ""))?;
    let out = Command::new(binary(&s.world.repo_root))
        .args(["replicate", "--config"])
        .arg(&file)
        .args(["--listen", &format!("127.0.0.1:{}", free_port()?)])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must fail: {stderr}");
    assert!(
        stderr.contains("spec.topics") && stderr.contains("(unclosed"),
        "{stderr}"
    );
    Ok(())
}

/// Two flows with one source alias into one target that no operator sees both of (each run
/// from its own resource file, with its own uid and creation time, as another namespace's or
/// another cluster's operator would render it) share the positions and checkpoints topics
/// there. The later one copies nothing while the older one runs, says why in its status, goes
/// on once the older stops, and stops when the older comes back.
#[tokio::test]
async fn a_later_flow_sharing_internal_topics_waits_while_the_older_one_runs() -> Result<()> {
    let s = Setup::new("claims")?;
    let (older_topic, newer_topic) = (unique("own"), unique("shared"));
    for t in [&older_topic, &newer_topic] {
        kafka::create_topic(&s.world.source_bootstrap, t, 1).await?;
        kafka::produce_values(&s.world.source_bootstrap, t, 100, 1).await?;
    }
    let resource = |name: &str, uid: &str, created: &str, topic: &str| {
        let spec: String = s
            .flow(&[topic], FAST)
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect();
        format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: team-{name}, uid: {uid}, creationTimestamp: '{created}'}}\nspec:\n{spec}"
        )
    };
    let older_flow = resource("older", "uid-older", "2026-01-01T00:00:00Z", &older_topic);
    let newer_flow = resource("newer", "uid-newer", "2026-06-01T00:00:00Z", &newer_topic);
    let (tb, older_remote, newer_remote) = (
        s.world.target_bootstrap.clone(),
        s.remote(&older_topic),
        s.remote(&newer_topic),
    );

    let mut older = s.start("older", &older_flow)?;
    wait_for_count(&tb, &older_remote, 100)
        .await
        .with_context(|| older.log_text())?;

    let mut newer = s.start("newer", &newer_flow)?;
    eventually("the later flow yields", WAIT, || {
        let v = newer.metric("mirrorflow_writer_yielding");
        async move { Ok((v == Some(1.0)).then_some(())) }
    })
    .await
    .with_context(|| newer.log_text())?;
    // Its status names the older flow, from the clusters alone (no operator sees both).
    let file = std::env::temp_dir()
        .join("mirrorflow-e2e")
        .join(format!("{}-newer", s.name))
        .join("flow.yaml");
    let out = Command::new(binary(&s.world.repo_root))
        .args(["status", "-o", "json", "--flow-file"])
        .arg(&file)
        .output()?;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    let ready = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["status"], "False", "{status:#}");
    assert_eq!(ready["reason"], "ConflictingFlow", "{status:#}");
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(message.contains("'team-older/older'"), "{message}");
    // Nothing of it written: not even its remote topic exists.
    assert!(
        !kafka::topics(&tb)?.contains(&newer_remote),
        "the waiting flow created {newer_remote}"
    );

    // The older flow stops cleanly: its claim is released and the later one goes on.
    let stopped = Instant::now();
    assert_eq!(older.stop(Duration::from_secs(30)), Some(0));
    wait_for_count(&tb, &newer_remote, 100)
        .await
        .with_context(|| newer.log_text())?;
    eprintln!(
        "the later flow copied its topic {:.1}s after the older one stopped",
        stopped.elapsed().as_secs_f64()
    );
    assert_eq!(newer.metric("mirrorflow_writer_yielding"), Some(0.0));

    // The older flow comes back: it goes on, and the later one stops (its pod would restart
    // and wait).
    let older = s.start("older", &older_flow)?;
    eventually("the later flow stops for the older one", WAIT, || {
        let running = newer.running();
        async move { Ok((!running).then_some(())) }
    })
    .await
    .with_context(|| newer.log_text())?;
    let log = newer.log_text();
    assert!(
        log.contains("flow 'team-older/older' (older"),
        "the later flow's log does not name the older one:\n{log}"
    );
    kafka::produce_values(&s.world.source_bootstrap, &older_topic, 50, 1).await?;
    wait_for_count(&tb, &older_remote, 150)
        .await
        .with_context(|| older.log_text())?;
    Ok(())
}

#[tokio::test]
async fn a_remote_topic_the_target_refuses_is_reported_until_it_exists() -> Result<()> {
    let s = Setup::new("refused")?;
    let topic = unique("refused");
    kafka::create_topic(&s.world.source_bootstrap, &topic, 1).await?;
    kafka::produce_values(&s.world.source_bootstrap, &topic, 3, 1).await?;
    // A replication factor the one-broker target cannot give: every topic the replicator
    // creates there is refused, its positions topic first, so it would wait at start: the
    // probe says so from the spec and the broker count.
    let flow = s.flow(
        &[&topic],
        "sourceLoop: {topicsRefreshInterval: 1s, replicationFactor: 2}\n",
    );
    let dir = std::env::temp_dir().join("mirrorflow-e2e").join(&s.name);
    std::fs::create_dir_all(&dir)?;
    let flow_file = dir.join("flow.yaml");
    std::fs::write(&flow_file, &flow)?;
    let before = measured_condition(&s.world.repo_root, &flow_file, "Replicating")?;
    ensure!(
        before["reason"] == "TopicChangesRefused"
            && before["message"]
                .as_str()
                .is_some_and(|m| m.contains("replicationFactor is 2 but the target has 1 broker")),
        "before the positions topic exists: {before}"
    );
    // With the positions topic made by hand the replicator runs, and records every remote
    // topic the target refuses.
    let positions = format!("mirrorflow-positions.{}.internal", s.source_alias);
    kafka::create_topic_with(
        &s.world.target_bootstrap,
        &positions,
        1,
        &[("cleanup.policy", "compact")],
    )
    .await?;
    let mut r = s.start("r", &flow)?;
    let remote = s.remote(&topic);
    let refused = eventually("Replicating False with TopicChangesRefused", WAIT, || {
        let (world, file) = (&s.world, &flow_file);
        async move {
            let c = measured_condition(&world.repo_root, file, "Replicating")?;
            Ok((c["reason"] == "TopicChangesRefused").then_some(c))
        }
    })
    .await
    .with_context(|| r.log_text())?;
    println!("refused: {refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    ensure!(
        refused["status"] == "False"
            && message.contains(&remote)
            && message.contains("spec.sourceLoop.replicationFactor"),
        "the condition names the topic and the field to fix: {refused}"
    );
    ensure!(
        !kafka::topics(&s.world.target_bootstrap)?.contains(&remote),
        "the remote topic exists"
    );

    // The fix the message names, made as a user would: the flow with a replication factor
    // the target can give, run by a new replicator. It reads the refusals the first one
    // recorded and writes their tombstones once the topics exist.
    r.stop(Duration::from_secs(10));
    let fixed = s.flow(
        &[&topic],
        "sourceLoop: {topicsRefreshInterval: 1s, replicationFactor: 1}\n",
    );
    std::fs::write(&flow_file, &fixed)?;
    let r = s.start("r2", &fixed)?;
    wait_for_count(&s.world.target_bootstrap, &remote, 3)
        .await
        .with_context(|| r.log_text())?;
    let cleared = eventually("the refusals cleared", WAIT, || {
        let (world, file) = (&s.world, &flow_file);
        async move {
            let c = measured_condition(&world.repo_root, file, "Replicating")?;
            Ok((c["reason"] != "TopicChangesRefused").then_some(c))
        }
    })
    .await
    .with_context(|| r.log_text())?;
    println!("after the fix: {cleared}");
    Ok(())
}
