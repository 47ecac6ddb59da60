//! `pipe`: what the two clusters allow here, measured with librdkafka clients (the replicator's
//! own client library) in parallel: 1, 2, 3, ... producers into a fresh target topic, then as
//! many consumers draining the source data set, then both at once (as replication runs them),
//! each until one more client no longer raises the rate. One client is no limit: a copy that
//! pipelines fetches and produces can beat it (the 129 % "of the limit").

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Value, json};

use crate::{client, create_topics, end_offsets, partitions, plain_consumer};

pub struct Pipe {
    pub source: String,
    pub target: String,
    /// The pre-loaded data set on the source (read, never written).
    pub topic: String,
    pub size: usize,
    /// Each step (a client count) runs this long.
    pub step: Duration,
    pub max_clients: usize,
    /// One more client must raise the rate by this fraction to count as a rise.
    pub min_gain: f64,
}

/// Client `i` of `k` owns the partitions `p` with `p % k == i`.
fn owned(n: i32, k: usize, i: usize) -> Vec<i32> {
    (0..n).filter(|p| *p as usize % k == i).collect()
}

/// `k` producers write `size`-byte records into a fresh topic for `step`; records/s acked.
fn produce_step(p: &Pipe, n: i32, k: usize, tag: &str) -> Result<f64> {
    let topic = format!("pipe-{tag}-{k}");
    create_topics(&p.target, n, std::slice::from_ref(&topic))?;
    // Leaders of a new topic take a moment; the first client would measure that.
    let probe = plain_consumer(&p.target)?;
    partitions(&probe, &topic, Duration::from_secs(30))?;
    let value = vec![b'x'; p.size];
    let started = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (0..k)
            .map(|i| {
                let (topic, value, mine) = (&topic, &value, owned(n, k, i));
                scope.spawn(move || -> Result<()> {
                    // The replicator's producer defaults (src/replicator/source/clients.rs).
                    let mut c = client(&p.target);
                    c.set("acks", "all")
                        .set("enable.idempotence", "true")
                        .set("linger.ms", "5")
                        .set("batch.size", "1000000")
                        .set("batch.num.messages", "10000")
                        .set("compression.type", "none");
                    let producer: BaseProducer = c.create()?;
                    let mut next = 0;
                    while started.elapsed() < p.step {
                        let part = mine[next % mine.len()];
                        next += 1;
                        let mut record = BaseRecord::<(), [u8]>::to(topic)
                            .partition(part)
                            .payload(value.as_slice());
                        loop {
                            match producer.send(record) {
                                Ok(()) => break,
                                Err((e, back)) => {
                                    if e.rdkafka_error_code() != Some(RDKafkaErrorCode::QueueFull) {
                                        anyhow::bail!("producing: {e}");
                                    }
                                    record = back;
                                    producer.poll(Duration::from_millis(1));
                                }
                            }
                        }
                        producer.poll(Duration::ZERO);
                    }
                    producer.flush(Duration::from_secs(60))?;
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a producer panicked"))??;
        }
        Ok(())
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let written: i64 = end_offsets(&probe, &topic, n)?.iter().sum();
    delete_topic(&p.target, &topic)?;
    Ok(written as f64 / elapsed)
}

/// `k` consumers read the source data set from the beginning for at most `step`; records/s.
/// The window opens once every consumer is assigned: connecting and asking for end offsets
/// on a loaded machine can take longer than a short step, and would count as zero records.
fn consume_step(p: &Pipe, n: i32, k: usize) -> Result<f64> {
    let read = AtomicU64::new(0);
    let ready = Barrier::new(k);
    let elapsed_us = AtomicU64::new(0);
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (0..k)
            .map(|i| {
                let (read, ready, elapsed_us, mine) = (&read, &ready, &elapsed_us, owned(n, k, i));
                scope.spawn(move || -> Result<()> {
                    let prepared = assigned_consumer(p, n, &mine);
                    // Every worker reaches the barrier, even one that failed to prepare, so
                    // that none waits for ever.
                    ready.wait();
                    let (consumer, goal) = prepared?;
                    let started = Instant::now();
                    let mut mine_read = 0_i64;
                    while mine_read < goal && started.elapsed() < p.step {
                        if let Some(m) = consumer.poll(Duration::from_millis(50)) {
                            m.context("consuming")?;
                            mine_read += 1;
                        }
                    }
                    let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                    elapsed_us.fetch_max(took, Ordering::Relaxed);
                    read.fetch_add(mine_read as u64, Ordering::Relaxed);
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a consumer panicked"))??;
        }
        Ok(())
    })?;
    let seconds = elapsed_us.load(Ordering::Relaxed) as f64 / 1e6;
    Ok(read.load(Ordering::Relaxed) as f64 / seconds.max(1e-3))
}

/// A consumer of the partitions `mine` of the data set, assigned at their beginning, and how
/// many records they hold.
fn assigned_consumer(p: &Pipe, n: i32, mine: &[i32]) -> Result<(BaseConsumer, i64)> {
    // The replicator's consumer fetch defaults (src/replicator/source/clients.rs).
    let mut c = client(&p.source);
    c.set("group.id", "mirrorflow-bench-pipe")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.queue.backoff.ms", "10")
        .set("fetch.max.bytes", "4194304")
        .set("max.partition.fetch.bytes", "1048576")
        .set("queued.max.messages.kbytes", "4096")
        .set("fetch.wait.max.ms", "100");
    let consumer: BaseConsumer = c.create()?;
    let ends = end_offsets(&consumer, &p.topic, n)?;
    let goal: i64 = mine.iter().map(|&q| ends[q as usize]).sum();
    let mut tpl = TopicPartitionList::new();
    for &q in mine {
        tpl.add_partition_offset(&p.topic, q, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok((consumer, goal))
}

pub fn delete_topic(bootstrap: &str, topic: &str) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client(bootstrap).create()?;
    let results = futures::executor::block_on(admin.delete_topics(&[topic], &AdminOptions::new()))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((t, e)) => anyhow::bail!("deleting {t}: {e}"),
        }
    }
    Ok(())
}

/// Adds clients one at a time while the rate rises by at least `min_gain`; returns every step
/// and the best rate.
fn escalate(p: &Pipe, mut step: impl FnMut(usize) -> Result<f64>) -> Result<(Vec<Value>, f64)> {
    let mut steps = Vec::new();
    let mut best = 0.0_f64;
    for k in 1..=p.max_clients {
        let rps = step(k)?;
        steps.push(json!({"clients": k, "records_per_s": rps}));
        let rose = rps > best * (1.0 + p.min_gain);
        best = best.max(rps);
        if !rose {
            break;
        }
    }
    Ok((steps, best))
}

pub fn pipe(p: &Pipe) -> Result<()> {
    let probe = plain_consumer(&p.source)?;
    let n = partitions(&probe, &p.topic, Duration::from_secs(30))?;
    let (produce, produce_limit) = escalate(p, |k| produce_step(p, n, k, "alone"))?;
    let (consume, consume_limit) = escalate(p, |k| consume_step(p, n, k))?;
    // Both ends at once, `k` clients each: on a small machine they share the cores, and a
    // replication is both at once.
    let (both, both_limit) = escalate(p, |k| {
        let (prod, cons) = std::thread::scope(|scope| {
            let prod = scope.spawn(|| produce_step(p, n, k, "both"));
            let cons = consume_step(p, n, k);
            (prod.join(), cons)
        });
        let prod = prod.map_err(|_| anyhow::anyhow!("the producers panicked"))??;
        Ok(prod.min(cons?))
    })?;
    println!(
        "{}",
        json!({
            "size": p.size,
            "step_s": p.step.as_secs_f64(),
            "produce": produce,
            "consume": consume,
            "both": both,
            "produce_limit_rps": produce_limit,
            "consume_limit_rps": consume_limit,
            "limit_rps": produce_limit.min(consume_limit),
            "both_limit_rps": both_limit,
        })
    );
    Ok(())
}
