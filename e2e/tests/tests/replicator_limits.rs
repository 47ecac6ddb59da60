//! Records the target refuses (Kafka only, replicators started standalone): a remote topic with
//! a smaller `max.message.bytes` than its source must neither refuse batches of records that fit
//! one by one, nor stall its partition silently on one record that can never fit. Copying
//! records, that record is skipped, counted and recorded as a `RecordRejected` gap and every
//! other record arrives; copying whole batches (the default), the batches are split under the
//! limit up to that record, where the partition stops with a `Replicating` condition that
//! names it and the fix.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use mirrorflow::kafka::positions::{GapKind, PositionReader, positions_topic};
use mirrorflow_e2e::replicator::{Replicator, measured_condition};
use mirrorflow_e2e::{World, eventually, kafka, unique};
use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;

const WAIT: Duration = Duration::from_secs(90);
/// The remote topic's limit; records of [`NORMAL`] bytes fit it alone, [`HUGE`] does not.
const REMOTE_LIMIT: usize = 100_000;
const NORMAL: usize = 5_000;
const HUGE: usize = 300_000;
/// Normal records before and after the huge one: enough that unbounded batches would be ten
/// times the limit.
const BEFORE: usize = 200;
const AFTER: usize = 50;

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

async fn create(bootstrap: &str, topic: &str, max_message_bytes: usize) -> Result<()> {
    let limit = max_message_bytes.to_string();
    kafka::create_topic_with(bootstrap, topic, 1, &[("max.message.bytes", &limit)]).await
}

/// Keys of every committed record of partition 0, read to its end.
fn read_keys(bootstrap: &str, topic: &str) -> Result<Vec<String>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "mirrorflow-e2e-limits-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)?;
    c.assign(&tpl)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut keys = Vec::new();
    loop {
        if std::time::Instant::now() > deadline {
            bail!("reading {topic} timed out after {} records", keys.len());
        }
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => keys.push(
                m.key()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .unwrap_or_default(),
            ),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => return Ok(keys),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
}

/// Writes the case: [`BEFORE`] normal records, one of [`HUGE`] bytes, [`AFTER`] more.
async fn huge_record_case() -> Result<Case> {
    let world = World::from_env()?;
    let (source_alias, target_alias) = (unique("src"), unique("tgt"));
    let topic = unique("limits");
    let remote = format!("{source_alias}.{topic}");
    // The source takes records up to 2 MB; the remote topic, made before the replicator starts
    // and left alone by config sync, only 100 kB batches.
    create(&world.source_bootstrap, &topic, 2_000_000).await?;
    create(&world.target_bootstrap, &remote, REMOTE_LIMIT).await?;

    let producer: rdkafka::producer::FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &world.source_bootstrap)
        .set("message.max.bytes", "2000000")
        .set("linger.ms", "20")
        .create()?;
    let normal = "n".repeat(NORMAL);
    // Incompressible (xorshift bytes): the copy producer compresses, and a repeated byte would
    // fit the remote limit once compressed, so nothing would be refused.
    let huge: Vec<u8> = (0..HUGE)
        .scan(0x9E37_79B9_7F4A_7C15_u64, |x, _| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            Some((*x >> 24) as u8)
        })
        .collect();
    let mut pending = Vec::new();
    for i in 0..BEFORE + 1 + AFTER {
        let value: &[u8] = if i == BEFORE {
            &huge
        } else {
            normal.as_bytes()
        };
        let key = i.to_string();
        match producer.send_result(
            FutureRecord::to(&topic)
                .partition(0)
                .key(&key)
                .payload(value),
        ) {
            Ok(d) => pending.push(d),
            Err((e, _)) => bail!("enqueueing: {e}"),
        }
    }
    for d in pending {
        d.await?.map_err(|(e, _)| e)?;
    }
    let huge_offset = i64::try_from(BEFORE)?;

    Ok(Case {
        world,
        source_alias,
        target_alias,
        topic,
        remote,
        huge_offset,
    })
}

/// A source topic holding [`BEFORE`] normal records, the huge one, and [`AFTER`] more, and its
/// remote topic made with [`REMOTE_LIMIT`] before a replicator starts.
struct Case {
    world: World,
    source_alias: String,
    target_alias: String,
    topic: String,
    remote: String,
    huge_offset: i64,
}

impl Case {
    /// The flow copying the case's topic, with `mode`'s lines.
    fn flow(&self, mode: &str) -> String {
        format!(
            "source: {{alias: {}, bootstrapServers: '{}'}}\n\
             target: {{alias: {}, bootstrapServers: '{}'}}\n\
             topics: ['{}']\n\
             checkpoints: {{enabled: false}}\n\
             heartbeats: {{enabled: false}}\n{mode}",
            self.source_alias,
            self.world.source_bootstrap,
            self.target_alias,
            self.world.target_bootstrap,
            self.topic
        )
    }

    /// Waits until the remote topic holds at least `want` records and returns their keys.
    async fn keys_once(&self, want: usize, replicator: &Replicator) -> Result<Vec<String>> {
        let (target, remote) = (&self.world.target_bootstrap, &self.remote);
        eventually(
            &format!("{want} records in {remote}"),
            WAIT,
            || async move {
                let keys = read_keys(target, remote)?;
                Ok((keys.len() >= want).then_some(keys))
            },
        )
        .await
        .with_context(|| format!("replicator log:\n{}", tail(&replicator.log_text())))
    }
}

async fn refused_record_is_skipped_and_recorded(exactly_once: bool) -> Result<()> {
    let c = huge_record_case().await?;
    let mode = if exactly_once {
        "exactlyOnce: true\nsourceLoop: {topicsRefreshInterval: 1s, syncTopicConfigs: false, offsetSyncsLocation: Target}\n"
    } else {
        // Records skip such a record; whole batches (the default) stop the partition instead
        // (below).
        "sourceLoop: {topicsRefreshInterval: 1s, syncTopicConfigs: false, copy: Records}\n"
    };
    let (world, topic, huge_offset) = (&c.world, &c.topic, c.huge_offset);
    let name = unique(if exactly_once { "limits-eos" } else { "limits" });
    let replicator = Replicator::start(&world.repo_root, &name, &c.flow(mode), free_port()?)?;

    // Every record but the huge one arrives, the ones after it included.
    let want = BEFORE + AFTER;
    let keys = c.keys_once(want, &replicator).await?;
    let expected: Vec<String> = (0..BEFORE + 1 + AFTER)
        .filter(|i| *i != BEFORE)
        .map(|i| i.to_string())
        .collect();
    anyhow::ensure!(
        keys == expected,
        "the remote topic holds {} records, keys {:?}.., instead of every record but #{BEFORE}",
        keys.len(),
        &keys[..keys.len().min(5)]
    );

    // Counted once, by topic.
    let metric = format!("mirrorflow_records_rejected_total{{topic=\"{topic}\"}}");
    let rejected = eventually("the refused record to be counted", WAIT, || {
        let v = replicator.metric(&metric);
        async move { Ok(v.filter(|v| *v >= 1.0)) }
    })
    .await?;
    anyhow::ensure!(rejected == 1.0, "{metric} = {rejected}, want 1");

    // On record for the operator, with its offset, size and the limit.
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &world.target_bootstrap)
        .set("isolation.level", "read_committed");
    let mut reader = PositionReader::new(
        &client,
        positions_topic(&c.source_alias),
        &unique("limits-check"),
    )?;
    reader.read_to_end(Duration::from_secs(10))?;
    let gaps: Vec<_> = reader
        .gaps()
        .iter()
        .filter(|g| &g.topic == topic)
        .cloned()
        .collect();
    anyhow::ensure!(gaps.len() == 1, "gaps recorded: {gaps:?}");
    let g = &gaps[0];
    anyhow::ensure!(
        (g.partition, g.from, g.to) == (0, huge_offset, huge_offset + 1),
        "gap {g:?}"
    );
    match g.kind {
        GapKind::RecordRejected { size, limit } => {
            anyhow::ensure!(size >= HUGE as i64, "size {size}");
            anyhow::ensure!(limit == REMOTE_LIMIT as i64, "limit {limit}");
        }
        other => bail!("gap kind {other:?}"),
    }
    // No retry storm: the partition did not fault over and over on the way.
    let faults = replicator
        .metric("mirrorflow_errors_total{kind=\"produce\",loop=\"source\"}")
        .unwrap_or(0.0)
        + replicator
            .metric("mirrorflow_errors_total{kind=\"transaction\",loop=\"source\"}")
            .unwrap_or(0.0);
    anyhow::ensure!(faults <= 3.0, "{faults} produce/transaction errors");
    println!(
        "limits[{}]: {want} records copied, 1 refused and recorded, {faults} write errors",
        if exactly_once {
            "exactly-once"
        } else {
            "at-least-once"
        }
    );
    Ok(())
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

#[tokio::test]
async fn a_record_over_the_remote_limit_is_skipped_and_recorded() -> Result<()> {
    refused_record_is_skipped_and_recorded(false).await
}

#[tokio::test]
async fn a_record_over_the_remote_limit_is_skipped_and_recorded_exactly_once() -> Result<()> {
    refused_record_is_skipped_and_recorded(true).await
}

/// Whole batches, the default: the source's batches of normal records (up to 1 MB each, ten
/// times the remote limit) are split under it, every record before the huge one arrives in
/// order, and the partition stops there, named in `Replicating` with the limit's fix, instead
/// of skipping a record the flow did not say it may lose.
#[tokio::test]
async fn by_default_a_record_over_the_remote_limit_stops_its_partition_named() -> Result<()> {
    let c = huge_record_case().await?;
    let flow = c.flow("sourceLoop: {topicsRefreshInterval: 1s, syncTopicConfigs: false}\n");
    let dir = std::env::temp_dir()
        .join("mirrorflow-e2e")
        .join(unique("limits-batches"));
    std::fs::create_dir_all(&dir)?;
    let flow_file = dir.join("flow.yaml");
    std::fs::write(&flow_file, &flow)?;
    let name = unique("limits-batches");
    let replicator = Replicator::start(&c.world.repo_root, &name, &flow, free_port()?)?;
    let keys = c.keys_once(BEFORE, &replicator).await?;
    let expected: Vec<String> = (0..BEFORE).map(|i| i.to_string()).collect();
    anyhow::ensure!(
        keys == expected,
        "the remote topic holds {} records ({:?}..), not exactly the {BEFORE} before the huge one",
        keys.len(),
        &keys[..keys.len().min(5)]
    );
    let partition = format!("{}-0", c.topic);
    let stopped = eventually("Replicating False naming the partition", WAIT, || {
        let (root, file, partition) = (&c.world.repo_root, &flow_file, &partition);
        async move {
            let cond = measured_condition(root, file, "Replicating")?;
            Ok((cond["status"] == "False"
                && cond["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(partition.as_str())))
            .then_some(cond))
        }
    })
    .await
    .with_context(|| format!("replicator log:\n{}", tail(&replicator.log_text())))?;
    let message = stopped["message"].as_str().unwrap_or_default();
    for part in ["max.message.bytes", "spec.sourceLoop.copy: Records"] {
        anyhow::ensure!(message.contains(part), "{part} not in {message:?}");
    }
    // Stopped, not skipped: nothing past the huge record arrives while it stands.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = read_keys(&c.world.target_bootstrap, &c.remote)?;
    anyhow::ensure!(
        later.len() == BEFORE,
        "{} records after the stop",
        later.len()
    );
    println!(
        "limits[batches]: {BEFORE} records copied, the partition stopped at offset {}: {message}",
        c.huge_offset
    );
    Ok(())
}
