//! Small rdkafka helpers for world tests: admin, producer, a consumer that reads a partition fully.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

pub fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?)
}

pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<()> {
    create_topic_with(bootstrap, topic, partitions, &[]).await
}

/// Deletes `topic` and waits until the cluster's metadata no longer lists it, so a topic
/// created under the same name afterwards is a new one.
pub async fn delete_topic(bootstrap: &str, topic: &str) -> Result<()> {
    delete_topic_under_writer(bootstrap, topic).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while topics(bootstrap)?.contains(topic) {
        if Instant::now() > deadline {
            bail!("{topic} still listed 30 s after its deletion");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Deletes `topic` and returns once the controller took the deletion, without waiting for the
/// metadata to drop it: for a topic a running replicator creates again at once (its discovery
/// may do so between two looks at the metadata, which then never miss it).
pub async fn delete_topic_under_writer(bootstrap: &str, topic: &str) -> Result<()> {
    let results = admin(bootstrap)?
        .delete_topics(
            &[topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await?;
    topic_results("deleting", results)
}

/// Fails on the first topic an admin call (create, delete) did not do.
fn topic_results(
    what: &str,
    results: Vec<Result<String, (String, rdkafka::types::RDKafkaErrorCode)>>,
) -> Result<()> {
    for r in results {
        if let Err((name, code)) = r {
            bail!("{what} topic {name} failed: {code}");
        }
    }
    Ok(())
}

/// Creates `topic` with topic `configs` (e.g. `max.message.bytes`); replication factor 1.
pub async fn create_topic_with(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) -> Result<()> {
    let new = configs.iter().fold(
        NewTopic::new(topic, partitions, TopicReplication::Fixed(1)),
        |t, (k, v)| t.set(k, v),
    );
    let results = admin(bootstrap)?
        .create_topics(
            &[new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?;
    topic_results("creating", results)
}

/// Names of the topics the cluster reports in its metadata.
pub fn topics(bootstrap: &str) -> Result<HashSet<String>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let md = consumer.fetch_metadata(None, Duration::from_secs(10))?;
    Ok(md.topics().iter().map(|t| t.name().to_string()).collect())
}

/// An idempotent producer with acks=all that retries across broker restarts for up to `timeout`.
pub fn producer(bootstrap: &str, timeout: Duration) -> Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("delivery.timeout.ms", timeout.as_millis().to_string())
        .set("reconnect.backoff.max.ms", "1000")
        .create()?)
}

/// Waits up to `timeout` for `topic` to exist on the cluster at `bootstrap` (a flow's
/// discovery creating its remote topic).
pub async fn wait_for_topic(bootstrap: &str, topic: &str, timeout: Duration) -> Result<()> {
    crate::eventually(&format!("{topic} on {bootstrap}"), timeout, || async {
        Ok(topics(bootstrap)?.contains(topic).then_some(()))
    })
    .await
}

/// Deletes records of partition 0 of `topic` before `offset` (what retention does to a
/// partition's log start; what kafka-delete-records does).
pub async fn delete_records_before(bootstrap: &str, topic: &str, offset: i64) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))?;
    let out = admin(bootstrap)?
        .delete_records(&tpl, &AdminOptions::new())
        .await?;
    for e in out.elements() {
        e.error()
            .map_err(|e| anyhow::anyhow!("deleting records of {topic}: {e}"))?;
    }
    Ok(())
}

/// Bytes of zeros in each record of [`produce_bomb`].
pub const BOMB_RECORD_BYTES: usize = 1 << 20;

/// Writes a decompression bomb to partition 0 of `topic`: one batch compressed with `codec`
/// (linger and batch size far above what it needs) of one record of [`BOMB_RECORD_BYTES`]
/// zeros per key, about 1,400 (gzip) or 250 (lz4) times smaller on the broker than inflated.
/// The producer buffers it all first: a test that measures its own memory writes it from a
/// child process.
pub async fn produce_bomb(
    bootstrap: &str,
    topic: &str,
    keys: &[Vec<u8>],
    codec: &str,
) -> Result<()> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", codec)
        .set("linger.ms", "5000")
        .set("batch.size", "400000000")
        .set("message.max.bytes", "1000000000")
        .set("queue.buffering.max.kbytes", "2097151")
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .create()?;
    let zeros = vec![0u8; BOMB_RECORD_BYTES];
    let mut sends = Vec::with_capacity(keys.len());
    for key in keys {
        let record = FutureRecord::to(topic)
            .partition(0)
            .key(key)
            .payload(&zeros);
        sends.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    for s in sends {
        s.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// Writes `n` records with the values `v0`, `v1`, ... to `topic`, record `i` to partition
/// `i % partitions`, each acknowledged before the next (so offsets follow the values).
pub async fn produce_values(bootstrap: &str, topic: &str, n: i32, partitions: i32) -> Result<()> {
    let producer = producer(bootstrap, Duration::from_secs(30))?;
    for i in 0..n {
        let v = format!("v{i}");
        producer
            .send(
                FutureRecord::<(), _>::to(topic)
                    .payload(&v)
                    .partition(i % partitions.max(1)),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// (offset, key, value) of one record.
pub type Record = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

/// Reads every record of one partition from the beginning up to its current end.
/// Returns (offset, key, value) triples.
pub fn read_partition(bootstrap: &str, topic: &str, partition: i32) -> Result<Vec<Record>> {
    Ok(read_partition_with_header(bootstrap, topic, partition, "")?
        .into_iter()
        .map(|(record, _)| record)
        .collect())
}

/// [`read_partition`], each record with the value of its header `header` (`None`: absent).
pub fn read_partition_with_header(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    header: &str,
) -> Result<Vec<(Record, Option<Vec<u8>>)>> {
    use rdkafka::message::Headers;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "mirrorflow-e2e-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()?;
    let (_, high) = consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .context("fetching watermarks")?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut out: Vec<(Record, Option<Vec<u8>>)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.last().map(|((o, _, _), _)| *o + 1).unwrap_or(0_i64) < high {
        if Instant::now() > deadline {
            bail!(
                "reading {topic}-{partition} timed out at {} of {high}",
                out.len()
            );
        }
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let value = m.headers().and_then(|h| {
                    h.iter()
                        .find(|h| h.key == header)
                        .map(|h| h.value.unwrap_or_default().to_vec())
                });
                out.push((
                    (
                        m.offset(),
                        m.key().map(<[u8]>::to_vec),
                        m.payload().map(<[u8]>::to_vec),
                    ),
                    value,
                ));
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) | None => {}
            Some(Err(e)) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// Commits offsets into `group` without joining it (what `kafka-consumer-groups
/// --reset-offsets` does); refused while the group has members.
pub fn commit(bootstrap: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) -> Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for &(p, o) in offsets {
        tpl.add_partition_offset(topic, p, Offset::Offset(o))?;
    }
    consumer.commit(&tpl, rdkafka::consumer::CommitMode::Sync)?;
    Ok(())
}

/// A Kafka tool's class run from the world's Kafka jars (`KAFKA_HOME`), its output dropped.
fn kafka_tool(class: &str, args: &[&str]) -> Result<std::process::Command> {
    let home = std::env::var("KAFKA_HOME").context("KAFKA_HOME (eval \"$(e2e/world.sh env)\")")?;
    let mut command = std::process::Command::new("java");
    command
        .arg("-Xmx256m")
        .arg(format!(
            "-Dlog4j2.configurationFile={home}/log4j2.properties"
        ))
        .args(["-cp", &format!("{home}/lib/*")])
        .arg(class)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    Ok(command)
}

/// A Java consumer of `group` on `topic`, from the world's Kafka jars, until dropped: of the
/// consumer group protocol (KIP-848, `group.protocol=consumer`, never committing), or of a
/// share group (KIP-932).
pub struct JavaConsumer {
    child: std::process::Child,
}

impl JavaConsumer {
    pub fn join(bootstrap: &str, group: &str, topic: &str) -> Result<JavaConsumer> {
        Self::start(
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            [bootstrap, group, topic],
            &[
                "--consumer-property",
                "group.protocol=consumer",
                "--consumer-property",
                "enable.auto.commit=false",
            ],
        )
    }

    /// A share consumer (`ConsoleShareConsumer`) of share group `group`.
    pub fn share(bootstrap: &str, group: &str, topic: &str) -> Result<JavaConsumer> {
        Self::start(
            "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
            [bootstrap, group, topic],
            &[],
        )
    }

    /// [`JavaConsumer::share`], each value it reads written as a line to `out`.
    pub fn share_printing(
        bootstrap: &str,
        group: &str,
        topic: &str,
        out: &std::path::Path,
    ) -> Result<JavaConsumer> {
        let file = std::fs::File::create(out)?;
        Self::spawn(
            "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
            [bootstrap, group, topic],
            &[],
            Some(file),
        )
    }

    /// The world's Kafka Streams application (`e2e/kafka/streams/PassThrough.java`) as
    /// application (streams group) `app`, copying `input` to `output` on `bootstrap` until
    /// stopped; a new group starts at the input's beginning.
    pub fn streams(bootstrap: &str, app: &str, input: &str, output: &str) -> Result<JavaConsumer> {
        let home = std::env::var("MF_STREAMS_APP").context(
            "MF_STREAMS_APP (eval \"$(e2e/world.sh env)\" of a world set up by this version)",
        )?;
        let state = std::env::temp_dir().join(format!("mirrorflow-streams-{app}"));
        let child = std::process::Command::new("java")
            .arg("-Xmx256m")
            .args(["-cp", &format!("{home}/classes:{home}/lib/*")])
            .arg("PassThrough")
            .args([bootstrap, app, input, output])
            .arg(&state)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting the Kafka Streams application")?;
        Ok(JavaConsumer { child })
    }

    fn start(class: &str, names: [&str; 3], more: &[&str]) -> Result<Self> {
        Self::spawn(class, names, more, None)
    }

    /// Its standard output to `out`, or nowhere.
    fn spawn(
        class: &str,
        [bootstrap, group, topic]: [&str; 3],
        more: &[&str],
        out: Option<std::fs::File>,
    ) -> Result<Self> {
        let mut args = vec![
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--group",
            group,
        ];
        args.extend_from_slice(more);
        let mut command = kafka_tool(class, &args)?;
        if let Some(out) = out {
            command.stdout(out);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {class}"))?;
        Ok(JavaConsumer { child })
    }
}

impl JavaConsumer {
    /// Stops it the way an operator would (SIGTERM: the consumer leaves its group), killed
    /// when dropped if it has not exited within 15 s.
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for JavaConsumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Deletes share group `group`, asked again for up to 90 s while it is not empty (a member
/// that did not leave stays until its session times out, 45 s by default).
pub fn delete_share_group(bootstrap: &str, group: &str) -> Result<()> {
    delete_group_with("consumer.group.ShareGroupCommand", bootstrap, group)
}

/// [`delete_share_group`] for a streams group (KIP-1071).
pub fn delete_streams_group(bootstrap: &str, group: &str) -> Result<()> {
    delete_group_with("streams.StreamsGroupCommand", bootstrap, group)
}

/// Deletes `group` with Kafka's tool `org.apache.kafka.tools.<tool>`.
fn delete_group_with(tool: &str, bootstrap: &str, group: &str) -> Result<()> {
    let args = [
        "--bootstrap-server",
        bootstrap,
        "--delete",
        "--group",
        group,
    ];
    let class = format!("org.apache.kafka.tools.{tool}");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let deleted = kafka_tool(&class, &args)?
            .status()
            .with_context(|| format!("running {class}"))?
            .success();
        if deleted && !group_listed(bootstrap, group)? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("group {group} still there after 90 s of deleting it");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// A share group's start offsets per (topic, partition) as Kafka's own tool reports them
/// (`kafka-share-groups.sh --describe --offsets`): the independent view tests compare with.
pub fn share_start_offsets(
    bootstrap: &str,
    group: &str,
) -> Result<std::collections::BTreeMap<(String, i32), i64>> {
    let args = [
        "--bootstrap-server",
        bootstrap,
        "--describe",
        "--offsets",
        "--group",
        group,
    ];
    let out = kafka_tool(
        "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
        &args,
    )?
    .stdout(std::process::Stdio::piped())
    .output()
    .context("running ShareGroupCommand")?;
    ensure!(out.status.success(), "ShareGroupCommand --describe failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut starts = std::collections::BTreeMap::new();
    // GROUP TOPIC PARTITION START-OFFSET LAG; a partition without a start offset says "-".
    for line in text.lines().filter(|l| l.starts_with(group)) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let [_, topic, partition, start, ..] = fields.as_slice()
            && let (Ok(partition), Ok(start)) = (partition.parse(), start.parse())
        {
            starts.insert(((*topic).to_string(), partition), start);
        }
    }
    Ok(starts)
}

/// `group`'s type as Kafka's own tool lists it (`kafka-groups.sh --list`: `Classic`,
/// `Consumer`, `Share`, `Streams`); none when the cluster does not list the group.
pub fn group_type(bootstrap: &str, group: &str) -> Result<Option<String>> {
    let out = kafka_tool(
        "org.apache.kafka.tools.GroupsCommand",
        &["--bootstrap-server", bootstrap, "--list"],
    )?
    .stdout(std::process::Stdio::piped())
    .output()
    .context("running GroupsCommand")?;
    ensure!(out.status.success(), "GroupsCommand --list failed");
    // GROUP TYPE PROTOCOL, one line per group.
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(
            |line| match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                [name, kind, ..] if *name == group => Some((*kind).to_string()),
                _ => None,
            },
        ))
}

/// Whether the cluster lists `group` (of any type).
pub fn group_listed(bootstrap: &str, group: &str) -> Result<bool> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let list = c.fetch_group_list(Some(group), Duration::from_secs(10))?;
    Ok(list.groups().iter().any(|g| g.name() == group))
}

/// Members of `group` as its coordinator reports them, for both group protocols.
pub fn group_members(bootstrap: &str, group: &str) -> Result<usize> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let m = mirrorflow::kafka::groups::describe(c.client(), group, Duration::from_secs(10))?;
    Ok(m.members)
}
