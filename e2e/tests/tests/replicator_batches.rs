//! Whole-batch copies (`spec.sourceLoop.copy: Batches`) against the world's real Kafka
//! clusters, with the replicator binary as a child process: zstd batches with committed and
//! aborted transactions land whole (still zstd, where a copy of records would write the
//! product's lz4) with exactly the visible records; groups
//! translate onto the record they read next; a graceful restart neither repeats nor skips; and
//! batches the target could not take as they are (records compacted away, log-append time,
//! over the remote topic's limit) are written anew with exact translation; a batch larger than
//! the copy fetches stops its partition with a `Replicating` condition that names the fix; a
//! partition written a record at a time is written as few batches, exactly.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use mirrorflow_conn::{Conn, Options, Security};
use mirrorflow_core::batch::{self, Admission, Codec};
use mirrorflow_e2e::batches::committed_batches;
use mirrorflow_e2e::fidelity::*;
use mirrorflow_e2e::replicator::{Replicator, measured_condition};
use mirrorflow_e2e::{eventually, kafka, unique};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

/// The fidelity flow with whole-batch copies.
fn batches_flow(s: &Setup, topics: &[&str], groups: &[&str]) -> String {
    let flow = s.flow(false, topics, groups, "");
    let batches = flow.replace(
        "offsetSyncInterval: 1s}",
        "offsetSyncInterval: 1s, copy: Batches}",
    );
    assert_ne!(flow, batches, "the fidelity flow's sourceLoop line changed");
    batches
}

/// A producer that packs what it is given within 20 ms into one zstd batch per partition.
fn zstd_producer(bootstrap: &str, transactional: bool) -> Result<FutureProducer> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", "zstd")
        .set("linger.ms", "20")
        .set("acks", "all");
    if transactional {
        config.set("transactional.id", unique("batches-txid"));
    }
    let producer: FutureProducer = config.create()?;
    if transactional {
        producer.init_transactions(Duration::from_secs(30))?;
    }
    Ok(producer)
}

/// Sends `values` to `partition` at once (so they share batches) and waits for them.
async fn send_together(
    producer: &FutureProducer,
    topic: &str,
    partition: i32,
    key: Option<&str>,
    values: &[String],
) -> Result<()> {
    let mut queued = Vec::with_capacity(values.len());
    for v in values {
        let mut record = FutureRecord::to(topic).partition(partition).payload(v);
        if let Some(k) = key {
            record = record.key(k);
        }
        queued.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    for delivery in queued {
        delivery.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// The codec of every committed data batch of `topic`'s `partition`, read from its leader on
/// `bootstrap` (the world's clusters have one broker).
fn stored_codecs(bootstrap: &str, topic: &str, partition: i32) -> Result<Vec<Codec>> {
    let options = Options {
        client_id: "mirrorflow-e2e-batches".into(),
        timeout: Duration::from_secs(10),
        max_frame: 64 << 20,
        address_check: None,
    };
    let mut conn = Conn::open(bootstrap, &Security::default(), &options)?;
    let mut codecs = Vec::new();
    for (admission, bytes) in committed_batches(&mut conn, topic, partition)? {
        if admission != Admission::Copy {
            continue;
        }
        let Some(Ok(b)) = batch::batches(&bytes).next() else {
            bail!("a stored batch does not parse");
        };
        codecs.push(b.header.codec()?);
    }
    Ok(codecs)
}

/// Values of `records`, in order.
fn values(records: &[Rec]) -> Vec<&str> {
    records.iter().map(|r| r.value.as_str()).collect()
}

#[tokio::test]
async fn whole_batches_keep_their_codec_and_groups_translate_exactly() -> Result<()> {
    let _brokers = BROKERS.read().await;
    let s = Setup::new("batches")?;
    let (source, target) = (
        s.world.source_bootstrap.clone(),
        s.world.target_bootstrap.clone(),
    );
    let partitions = 2;
    let topic = unique("batches");
    let remote = format!("{}.{topic}", s.a);
    let group = unique("batches-app");
    let cps_topic = format!("{}.checkpoints.internal", s.a);
    kafka::create_topic(&source, &topic, partitions).await?;
    let tx = zstd_producer(&source, true)?;
    let plain = zstd_producer(&source, false)?;
    let mut aborted = HashSet::new();
    let history = |tag: &'static str| {
        let (tx, plain) = (&tx, &plain);
        let topic = topic.clone();
        async move {
            let mut aborted = Vec::new();
            for (i, (n, commit)) in [(5, true), (3, false), (4, true), (2, false), (3, true)]
                .into_iter()
                .enumerate()
            {
                tx.begin_transaction()?;
                for p in 0..partitions {
                    let vals: Vec<String> =
                        (0..n).map(|j| format!("{tag}-t{i}-p{p}-{j}")).collect();
                    send_together(tx, &topic, p, None, &vals).await?;
                    if !commit {
                        aborted.extend(vals);
                    }
                }
                if commit {
                    tx.commit_transaction(Duration::from_secs(30))?;
                } else {
                    tx.abort_transaction(Duration::from_secs(30))?;
                }
            }
            for p in 0..partitions {
                let vals: Vec<String> = (0..6).map(|j| format!("{tag}-plain-p{p}-{j}")).collect();
                send_together(plain, &topic, p, None, &vals).await?;
            }
            anyhow::Ok(aborted)
        }
    };
    aborted.extend(history("before").await?);
    let flow = batches_flow(&s, &[&topic], &[&group]);
    let mut r = s.start("r", &flow).await?;
    aborted.extend(history("during").await?);

    for p in 0..partitions {
        let visible = wait_copied(&source, &topic, &target, &remote, p)
            .await
            .with_context(|| r.log_text())?;
        let copied = read_visible(&target, &remote, p)?;
        ensure!(
            values(&copied) == values(&visible),
            "p{p}: the target holds\n{:?}\nnot\n{:?}\n{}",
            values(&copied),
            values(&visible),
            r.log_text()
        );
        ensure!(
            copied.iter().all(|c| !aborted.contains(&c.value)),
            "an aborted record was copied"
        );
        let codecs = stored_codecs(&target, &remote, p)?;
        ensure!(
            !codecs.is_empty() && codecs.iter().all(|c| *c == Codec::Zstd),
            "p{p}: the target stored {codecs:?}"
        );
        println!(
            "p{p}: {} visible records in {} zstd batches on the target",
            copied.len(),
            codecs.len()
        );

        // A group part way (inside a transaction's run) and at the end of what was produced:
        // each checkpoint lands on the record it reads next.
        let mut next = 0usize;
        for n in [7, visible.len() - 7] {
            let (read, c) = consume_and_commit(&source, &group, &topic, p, n)?;
            ensure!(
                read.as_slice() == &visible[next..next + n],
                "the group read {read:?}"
            );
            next += n;
            let cp = checkpoint_for(&target, &cps_topic, &group, &remote, p, c, true)
                .await
                .with_context(|| r.log_text())?;
            let first = first_from(&target, &remote, p, cp.downstream_offset)?;
            let l = landing(&visible, next, first.as_ref())?;
            println!(
                "p{p}: committed {c} -> checkpoint {}->{}: skipped {}, re-read {}",
                cp.upstream_offset, cp.downstream_offset, l.skipped, l.reread
            );
            ensure!(
                l.skipped == 0 && l.reread == 0,
                "p{p} after {next} records: {l:?}"
            );
        }
    }
    let copied = r.metric("mirrorflow_records_replicated_total");
    ensure!(
        copied.is_some_and(|n| n > 0.0),
        "records_replicated_total {copied:?}"
    );

    // A graceful restart: the positions it stored are where the next run goes on, exactly.
    r.stop(Duration::from_secs(30));
    let after: Vec<String> = (0..5).map(|j| format!("after-{j}")).collect();
    send_together(&plain, &topic, 0, None, &after).await?;
    let r = s.start("r2", &flow).await?;
    let visible = wait_copied(&source, &topic, &target, &remote, 0)
        .await
        .with_context(|| r.log_text())?;
    let copied = read_visible(&target, &remote, 0)?;
    ensure!(
        values(&copied) == values(&visible),
        "after a restart the target holds\n{:?}\nnot\n{:?}\n{}",
        values(&copied),
        values(&visible),
        r.log_text()
    );
    Ok(())
}

/// Batches the target could not take as they are are written anew, not stopped: a compacted
/// topic's batches with records compacted away (one batch per run of offsets), a
/// log-append-time topic's batches, and a batch larger than the remote topic's
/// `max.message.bytes` (split under it). Every visible record lands in order, a group
/// committed among the compaction gaps translates onto the record it reads next, and each
/// rewrite is counted by its reason.
#[tokio::test]
async fn batches_the_target_could_not_take_as_they_are_are_written_anew_exactly() -> Result<()> {
    let _brokers = BROKERS.read().await;
    let s = Setup::new("batches-anew")?;
    let (source, target) = (
        s.world.source_bootstrap.clone(),
        s.world.target_bootstrap.clone(),
    );
    let compact = unique("batches-compact");
    create_compacted(&source, &compact).await?;
    // Each round is one batch of ten repeated keys and a key of its own (and a segment of its
    // own): compaction keeps the last round's repeated keys, so every earlier batch keeps only
    // its own key, one record under the offsets of eleven.
    let producer = zstd_producer(&source, false)?;
    for round in 0..4 {
        let keyed: Vec<(String, String)> = (0..10)
            .map(|k| (format!("k{k}"), format!("round{round}-k{k}")))
            .chain([(format!("own{round}"), format!("own{round}"))])
            .collect();
        let mut queued = Vec::new();
        for (key, value) in &keyed {
            let record = FutureRecord::to(&compact)
                .partition(0)
                .key(key)
                .payload(value);
            queued.push(producer.send_result(record).map_err(|(e, _)| e)?);
        }
        for delivery in queued {
            delivery.await?.map_err(|(e, _)| e)?;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    send_together(&producer, &compact, 0, Some("roll"), &[unique("roll")]).await?;
    let kept = compacted(&source, &compact).await?;
    println!("compacted: {} records kept", kept.len());

    let appended = unique("batches-appended");
    kafka::create_topic_with(
        &source,
        &appended,
        1,
        &[("message.timestamp.type", "LogAppendTime")],
    )
    .await?;
    let stamped: Vec<String> = (0..12).map(|i| format!("appended-{i}")).collect();
    send_together(&producer, &appended, 0, None, &stamped).await?;

    // One uncompressed batch of about 400 KB, for a remote topic that takes 100 KB.
    let large = unique("batches-split");
    kafka::create_topic_with(&source, &large, 1, &[("max.message.bytes", "4194304")]).await?;
    let remote_large = format!("{}.{large}", s.a);
    kafka::create_topic_with(
        &target,
        &remote_large,
        1,
        &[("max.message.bytes", "100000")],
    )
    .await?;
    let big: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &source)
        .set("linger.ms", "50")
        .set("batch.size", "1048576")
        .set("message.max.bytes", "4194304")
        .create()?;
    let pad = "x".repeat(10_000);
    let split: Vec<String> = (0..40).map(|i| format!("split-{i:02}-{pad}")).collect();
    send_together(&big, &large, 0, None, &split).await?;

    let group = unique("batches-anew-app");
    let flow = batches_flow(&s, &[&compact, &appended, &large], &[&group]).replace(
        "copy: Batches}",
        // The remote topic keeps the smaller limit it was made with.
        "copy: Batches, syncTopicConfigs: false}",
    );
    let r = s.start("r", &flow).await?;
    for topic in [&compact, &appended, &large] {
        let remote = format!("{}.{topic}", s.a);
        let visible = wait_copied(&source, topic, &target, &remote, 0)
            .await
            .with_context(|| r.log_text())?;
        let copied = read_visible(&target, &remote, 0)?;
        ensure!(
            values(&copied) == values(&visible),
            "{remote} holds\n{:?}\nnot\n{:?}",
            values(&copied),
            values(&visible)
        );
        println!("{topic}: {} records copied in order", copied.len());
    }

    // A group that read part of the compacted topic (its next record is past a gap):
    // the checkpoint lands on the record it reads next.
    translates_exactly(&s, &r, (&compact, &group), &kept, kept.len() / 2).await?;

    for reason in ["compacted", "log_append_time", "too_large"] {
        let series = format!("mirrorflow_batches_rewritten_total{{reason=\"{reason}\"}}");
        let n = r.metric(&series);
        ensure!(
            n.is_some_and(|n| n > 0.0),
            "{series} = {n:?}\n{}",
            r.log_text()
        );
    }
    Ok(())
}

/// A partition written one record at a time (each record a zstd batch of its own, what a
/// producer's linger gives a partition with little traffic) is written as few batches: the
/// target holds every record in order, still zstd, in fewer batches than the source; a group
/// committed inside the run translates onto the record it reads next; the merges are counted.
#[tokio::test]
async fn small_batches_are_merged_exactly_and_keep_their_codec() -> Result<()> {
    let _brokers = BROKERS.read().await;
    let s = Setup::new("batches-merged")?;
    let (source, target) = (
        s.world.source_bootstrap.clone(),
        s.world.target_bootstrap.clone(),
    );
    let topic = unique("batches-small");
    let remote = format!("{}.{topic}", s.a);
    kafka::create_topic(&source, &topic, 1).await?;
    let producer = zstd_producer(&source, false)?;
    // Values that compress, so that the producer writes each lone record as zstd (librdkafka
    // sends a batch uncompressed when compressing does not make it smaller).
    let pad = "x".repeat(200);
    for i in 0..60 {
        // One at a time: each send is its own batch.
        send_together(&producer, &topic, 0, None, &[format!("small-{i:02}-{pad}")]).await?;
    }
    let stored = stored_codecs(&source, &topic, 0)?;
    let source_batches = stored.len();
    ensure!(
        source_batches == 60 && stored.iter().all(|c| *c == Codec::Zstd),
        "the source holds {stored:?}"
    );

    let group = unique("batches-merged-app");
    let flow = batches_flow(&s, &[&topic], &[&group]);
    let r = s.start("r", &flow).await?;
    let visible = wait_copied(&source, &topic, &target, &remote, 0)
        .await
        .with_context(|| r.log_text())?;
    let copied = read_visible(&target, &remote, 0)?;
    ensure!(
        values(&copied) == values(&visible),
        "the target holds\n{:?}\nnot\n{:?}",
        values(&copied),
        values(&visible)
    );
    let codecs = stored_codecs(&target, &remote, 0)?;
    println!(
        "{} records: {source_batches} batches on the source, {} on the target",
        copied.len(),
        codecs.len()
    );
    ensure!(
        codecs.len() < source_batches / 4 && codecs.iter().all(|c| *c == Codec::Zstd),
        "the target stored {codecs:?}"
    );
    let merged = r.metric("mirrorflow_batches_rewritten_total{reason=\"merged\"}");
    ensure!(merged.is_some_and(|n| n > 0.0), "merged {merged:?}");

    translates_exactly(&s, &r, (&topic, &group), &visible, 23).await
}

/// `group` reads the first `n` of `visible` (partition 0 of `topic`) and commits: its
/// checkpoint lands on the record it reads next, on the remote topic.
async fn translates_exactly(
    s: &Setup,
    r: &Replicator,
    (topic, group): (&str, &str),
    visible: &[Rec],
    n: usize,
) -> Result<()> {
    let (source, target) = (&s.world.source_bootstrap, &s.world.target_bootstrap);
    let remote = format!("{}.{topic}", s.a);
    let cps_topic = format!("{}.checkpoints.internal", s.a);
    let (read, c) = consume_and_commit(source, group, topic, 0, n)?;
    ensure!(read.as_slice() == &visible[..n], "the group read {read:?}");
    let cp = checkpoint_for(target, &cps_topic, group, &remote, 0, c, true)
        .await
        .with_context(|| r.log_text())?;
    let first = first_from(target, &remote, 0, cp.downstream_offset)?;
    let l = landing(visible, n, first.as_ref())?;
    println!(
        "committed {c} -> checkpoint {}->{}: skipped {}, re-read {}",
        cp.upstream_offset, cp.downstream_offset, l.skipped, l.reread
    );
    ensure!(l.skipped == 0 && l.reread == 0, "{l:?}");
    Ok(())
}

/// One batch larger than the whole-batch copy fetches (the topic's `max.message.bytes` allows
/// 32 MiB; the copy reads answers of up to 16 MiB) stops its partition with a `Replicating`
/// condition that names it and the fix, instead of stalling it silently.
#[tokio::test]
async fn a_batch_larger_than_the_copy_fetches_is_named_not_stalled() -> Result<()> {
    let _brokers = BROKERS.read().await;
    let s = Setup::new("batches-large")?;
    let source = s.world.source_bootstrap.clone();
    let topic = unique("batches-large");
    kafka::create_topic_with(&source, &topic, 1, &[("max.message.bytes", "33554432")]).await?;
    // 20 records of 1 MiB sent together, uncompressed: one batch of about 20 MiB.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &source)
        .set("compression.type", "none")
        .set("linger.ms", "500")
        .set("batch.size", "33554432")
        .set("message.max.bytes", "33554432")
        .set("acks", "all")
        .create()?;
    let values: Vec<String> = (0..20)
        .map(|i| format!("{i:02}{}", "x".repeat(1 << 20)))
        .collect();
    send_together(&producer, &topic, 0, None, &values).await?;
    let options = Options {
        client_id: "mirrorflow-e2e-batches".into(),
        timeout: Duration::from_secs(10),
        max_frame: 64 << 20,
        address_check: None,
    };
    let mut conn = Conn::open(&source, &Security::default(), &options)?;
    let largest = committed_batches(&mut conn, &topic, 0)?
        .iter()
        .map(|(_, bytes)| bytes.len())
        .max()
        .unwrap_or(0);
    ensure!(
        largest > 17 << 20,
        "the source holds one batch over the copy's 16 MiB (largest: {largest} bytes)"
    );

    let dir = std::env::temp_dir().join("mirrorflow-e2e").join(&s.name);
    std::fs::create_dir_all(&dir)?;
    let flow_file = dir.join("flow.yaml");
    let flow = batches_flow(&s, &[&topic], &[]);
    std::fs::write(&flow_file, &flow)?;
    let r = s.start("r", &flow).await?;
    let stopped = eventually(
        "Replicating False naming the oversized batch's partition",
        Duration::from_secs(150),
        || {
            let (world, file) = (&s.world, &flow_file);
            async move {
                let c = measured_condition(&world.repo_root, file, "Replicating")?;
                Ok((c["status"] == "False"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("larger than the whole-batch copy fetches")))
                .then_some(c))
            }
        },
    )
    .await
    .with_context(|| r.log_text())?;
    println!("stopped: {stopped}");
    let message = stopped["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains(&format!("{topic}-0"))
            && message.contains("spec.sourceLoop.copy: Records"),
        "the condition names the partition and the fix: {message}"
    );
    Ok(())
}
