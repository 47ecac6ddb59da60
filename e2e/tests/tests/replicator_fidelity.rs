//! Failover fidelity against the world's real Kafka clusters, with the replicator binary as a
//! child process: where a consumer group lands on the target when it fails over at its latest
//! checkpoint, on sources whose offsets have gaps (transaction markers and aborted records,
//! compaction); failing back; and the target cluster going away while records flow.
//!
//! "Lands exactly" is checked by payload: the first record a consumer reads on the target at
//! the checkpoint's downstream offset must be the record the group would read next on the
//! source. Each case prints how many records a failover would skip and re-read.
//!
//! The outage test stops the shared world's TARGET broker; it waits until no other world test
//! binary runs, and restarts the broker on every path (also on a failed assertion).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use mirrorflow_e2e::fidelity::*;
use mirrorflow_e2e::kafka::commit;
use mirrorflow_e2e::{eventually, kafka, unique};
use rdkafka::admin::AdminOptions;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

/// What the consumer group does next in the transactional case.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Read this many records and commit (last + 1).
    Consume(usize),
    /// Commit this source offset directly (a Java consumer's position after it fetched past
    /// control records and aborted batches).
    Commit(i64),
}

#[tokio::test]
async fn transactional_source_fails_over_onto_the_next_record() -> Result<()> {
    let _brokers = BROKERS.read().await;
    let s = Setup::new("fid-tx")?;
    let (source, target) = (
        s.world.source_bootstrap.clone(),
        s.world.target_bootstrap.clone(),
    );
    let partitions = 2;
    let topic = unique("txn");
    let remote = format!("{}.{topic}", s.a);
    let group = unique("fid-tx-app");
    let cps_topic = format!("{}.checkpoints.internal", s.a);
    kafka::create_topic(&source, &topic, partitions).await?;
    let r = s
        .start("r", &s.flow(false, &[&topic], &[&group], ""))
        .await?;

    // Committed and aborted transactions over both partitions: every marker and every aborted
    // record is an offset gap on the source that the copy closes up.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &source)
        .set("transactional.id", unique("fid-txid"))
        .set("acks", "all")
        .create()?;
    producer.init_transactions(Duration::from_secs(30))?;
    let plan = [
        (5, true),
        (3, false),
        (4, true),
        (3, true),
        (2, false),
        (3, true),
    ];
    let mut aborted = HashSet::new();
    for (i, &(n, ok)) in plan.iter().enumerate() {
        let values = transaction(&producer, &topic, partitions, &format!("tx{i}"), n, ok).await?;
        if !ok {
            aborted.extend(values);
        }
    }

    let mut total = Landing::default();
    let mut report = Vec::new();
    for p in 0..partitions {
        let visible = wait_copied(&source, &topic, &target, &remote, p)
            .await
            .with_context(|| r.log_text())?;
        let copied = read_visible(&target, &remote, p)?;
        ensure!(
            copied.iter().all(|c| !aborted.contains(&c.value)),
            "an aborted record was copied"
        );
        ensure!(visible.len() == 15, "visible records {visible:?}");
        // tx0: 5 records then its marker; tx1 aborted: 3 records + marker; tx2: 4 + marker;
        // tx3: 3 + marker; tx4 aborted: 2 + marker; tx5: 3 + marker.
        let steps = [
            Step::Consume(2),                     // inside a run
            Step::Consume(3),                     // at tx0's marker, an aborted tx follows
            Step::Commit(visible[5].offset),      // past the gap: same next record
            Step::Consume(4),                     // at tx2's marker
            Step::Consume(3),                     // at tx3's marker, an aborted tx follows
            Step::Commit(visible[11].offset + 2), // inside the aborted records: same next
            Step::Consume(3),                     // at the last marker: the end
        ];
        let mut next = 0_usize;
        for step in steps {
            let before = next;
            let c = match step {
                Step::Consume(n) => {
                    let (read, c) = consume_and_commit(&source, &group, &topic, p, n)?;
                    ensure!(
                        read.as_slice() == &visible[next..next + n],
                        "the group read {read:?}"
                    );
                    ensure!(c == read[n - 1].offset + 1, "committed {c} after {read:?}");
                    next += n;
                    c
                }
                Step::Commit(c) => {
                    commit(&source, &group, &topic, &[(p, c)])?;
                    next = next_index(&visible, c);
                    c
                }
            };
            let gap = !visible.iter().any(|v| v.offset == c);
            let at_end = next == visible.len();
            let cp = checkpoint_for(&target, &cps_topic, &group, &remote, p, c, next != before)
                .await
                .with_context(|| r.log_text())?;
            let first = first_from(&target, &remote, p, cp.downstream_offset)?;
            let l = landing(&visible, next, first.as_ref())?;
            report.push(format!(
                "p{p} {step:?}: committed {c}{} -> checkpoint {}->{}; next on source {:?}, first on target {:?}: skipped {}, re-read {}",
                match (gap, at_end) {
                    (_, true) => " (a marker, then the end)",
                    (true, false) => " (an offset gap)",
                    (false, false) => "",
                },
                cp.upstream_offset,
                cp.downstream_offset,
                visible.get(next).map(|v| &v.value),
                first.as_ref().map(|f| &f.value),
                l.skipped,
                l.reread
            ));
            total.skipped += l.skipped;
            total.reread += l.reread;
        }
    }

    // The group is at the end of both partitions: the next record is one produced after the
    // checkpoint. A failover now must read exactly it.
    transaction(&producer, &topic, partitions, "tx6", 2, true).await?;
    for p in 0..partitions {
        let visible = wait_copied(&source, &topic, &target, &remote, p)
            .await
            .with_context(|| r.log_text())?;
        tokio::time::sleep(Duration::from_secs(2)).await; // a re-evaluation may land
        let cp = latest(&checkpoints(&target, &cps_topic, &group)?, &remote, p)
            .context("no checkpoint")?;
        let first = first_from(&target, &remote, p, cp.downstream_offset)?;
        let l = landing(&visible, 15, first.as_ref())?;
        report.push(format!(
            "p{p} after new records: checkpoint {}->{}; next on source {:?}, first on target {:?}: skipped {}, re-read {}",
            cp.upstream_offset,
            cp.downstream_offset,
            visible.get(15).map(|v| &v.value),
            first.as_ref().map(|f| &f.value),
            l.skipped,
            l.reread
        ));
        total.skipped += l.skipped;
        total.reread += l.reread;
    }
    println!("transactional source, failover at the latest checkpoint:");
    for line in &report {
        println!("  {line}");
    }
    println!(
        "transactional: skipped {} re-read {} (over {} failover points)",
        total.skipped,
        total.reread,
        report.len()
    );
    assert_eq!(total.skipped, 0, "records skipped:\n{}", report.join("\n"));
    assert_eq!(total.reread, 0, "records re-read:\n{}", report.join("\n"));
    Ok(())
}

/// Translated mode far behind the head: a long transactional history (hundreds of
/// transactions of 1-5 records, every tenth aborted, so hundreds of runs where the store's run
/// list keeps 64) is copied first; then groups commit where lagging consumers are: rewound to
/// ~2% of it, on a marker in the middle, on one partition only at ~70%, and at the head. Each
/// checkpoint must land on the record the group reads next on the source (0 skipped, 0 re-read),
/// which takes the store's exact history (`mirrorflow-core`'s `sync::history`).
#[tokio::test]
async fn translated_checkpoints_are_exact_far_behind_a_long_transactional_history() -> Result<()> {
    let _brokers = BROKERS.read().await;
    let s = Setup::new("fid-hist")?;
    let (source, target) = (
        s.world.source_bootstrap.clone(),
        s.world.target_bootstrap.clone(),
    );
    let partitions = 2;
    let topic = unique("txhist");
    let remote = format!("{}.{topic}", s.a);
    let prefix = unique("fid-hist-app");
    let cps_topic = format!("{}.checkpoints.internal", s.a);
    kafka::create_topic(&source, &topic, partitions).await?;
    let r = s
        .start(
            "r",
            &s.flow(false, &[&topic], &[&format!("{prefix}-.*")], ""),
        )
        .await?;
    let producer = transactional(&source)?;
    let transactions = 300;
    for i in 0..transactions {
        let n = 1 + (i * 7 + i / 3) % 5;
        transaction(
            &producer,
            &topic,
            partitions,
            &format!("h{i}"),
            n,
            i % 10 != 9,
        )
        .await?;
    }
    let mut visible = Vec::new();
    for p in 0..partitions {
        visible.push(
            wait_copied(&source, &topic, &target, &remote, p)
                .await
                .with_context(|| r.log_text())?,
        );
    }
    let at = |p: usize, share: usize| visible[p][visible[p].len() * share / 100].offset;
    // The offset just past a visible record whose next offset holds no visible record: a
    // commit marker or the start of aborted records.
    let marker_near = |p: usize, share: usize| {
        let v = &visible[p];
        (v.len() * share / 100..v.len() - 1)
            .find(|&i| v[i + 1].offset > v[i].offset + 1)
            .map_or(at(p, share), |i| v[i].offset + 1)
    };
    let end = |p: usize| visible[p].last().map_or(0, |v| v.offset + 1);
    let groups: Vec<(String, Vec<(i32, i64)>)> = vec![
        (
            format!("{prefix}-rewound"),
            vec![(0, at(0, 2)), (1, at(1, 2))],
        ),
        (
            format!("{prefix}-middle"),
            vec![(0, marker_near(0, 50)), (1, marker_near(1, 50))],
        ),
        (format!("{prefix}-one"), vec![(1, at(1, 70))]),
        (format!("{prefix}-head"), vec![(0, end(0)), (1, end(1))]),
    ];
    for (g, commits) in &groups {
        commit(&source, g, &topic, commits)?;
    }
    let (mut skipped, mut reread) = (0, 0);
    for (g, commits) in &groups {
        for &(p, c) in commits {
            let cp = eventually(
                &format!("checkpoint of {g} p{p} at upstream {c}"),
                WAIT,
                || async {
                    Ok(latest(&checkpoints(&target, &cps_topic, g)?, &remote, p)
                        .filter(|cp| cp.upstream_offset == c))
                },
            )
            .await
            .with_context(|| r.log_text())?;
            let v = &visible[p as usize];
            let first = first_from(&target, &remote, p, cp.downstream_offset)?;
            let l = landing(v, next_index(v, c), first.as_ref())?;
            println!(
                "{g} p{p}: committed {c} of {} -> checkpoint {}->{}: skipped {}, re-read {}",
                end(p as usize),
                cp.upstream_offset,
                cp.downstream_offset,
                l.skipped,
                l.reread
            );
            skipped += l.skipped;
            reread += l.reread;
        }
    }
    println!(
        "translated, {transactions} transactions per partition: skipped {skipped}, re-read {reread}"
    );
    ensure!(
        skipped == 0 && reread == 0,
        "skipped {skipped}, re-read {reread}\n{}",
        r.log_text()
    );
    Ok(())
}

#[tokio::test]
async fn compacted_source_fails_over_onto_the_next_record() -> Result<()> {
    let _brokers = BROKERS.read().await;
    let s = Setup::new("fid-compact")?;
    let (source, target) = (
        s.world.source_bootstrap.clone(),
        s.world.target_bootstrap.clone(),
    );
    let topic = unique("compacted");
    let remote = format!("{}.{topic}", s.a);
    let group = unique("fid-cp-app");
    let cps_topic = format!("{}.checkpoints.internal", s.a);
    create_compacted(&source, &topic).await?;
    let producer = kafka::producer(&source, Duration::from_secs(30))?;
    let send = |key: String, value: String| {
        let (producer, topic) = (&producer, &topic);
        async move {
            producer
                .send(
                    FutureRecord::to(topic)
                        .partition(0)
                        .key(&key)
                        .payload(&value),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)?;
            anyhow::Ok(())
        }
    };
    // Rounds of ten repeated keys and one key of its own, one segment per round: compaction
    // keeps the last round and each round's own key, so survivors are separated by gaps of
    // ten offsets and each is the last record of its key (the target's own compaction, the
    // configs being copied, removes none of them).
    let rounds = 6;
    compactable_rounds(&source, &topic, 0..rounds).await?;
    let compacted_at = Instant::now();
    let visible = compacted(&source, &topic).await?;
    let offsets: Vec<i64> = visible.iter().map(|r| r.offset).collect();
    println!(
        "compacted in {:?}: {} records left of {}, offsets {offsets:?}",
        compacted_at.elapsed(),
        visible.len(),
        rounds * 11 + 1
    );

    // Only now does the replicator start: the copy has no gaps, the source has many.
    let r = s
        .start("r", &s.flow(false, &[&topic], &["fid-cp-.*"], ""))
        .await?;
    let visible = wait_copied(&source, &topic, &target, &remote, 0)
        .await
        .with_context(|| r.log_text())?;
    // A commit before the first surviving record (a group that committed 0 before compaction)
    // has no checkpoint: no offset sync is older than the first record copied, so nothing says
    // the offsets before it are empty (MM2 does the same). A failed-over consumer then falls
    // back to its auto.offset.reset. Checked: nothing wrong is written.
    let early = unique("fid-cp-early");
    commit(&source, &early, &topic, &[(0, 0)])?;
    // Commit points: right after a survivor (a gap follows), in the middle of a gap, on a
    // survivor, inside the last round's run, and the end.
    let end = visible.last().map(|r| r.offset + 1).context("empty")?;
    let candidates = [
        visible[0].offset + 1,
        (visible[1].offset + visible[2].offset) / 2,
        visible[3].offset,
        visible[3].offset + 1,
        visible[visible.len() - 5].offset,
        end,
    ];
    let mut total = Landing::default();
    let mut report = Vec::new();
    let mut next = None;
    for c in candidates {
        let n = next_index(&visible, c);
        if next.is_some_and(|prev| n <= prev) {
            continue;
        }
        commit(&source, &group, &topic, &[(0, c)])?;
        let cp = checkpoint_for(&target, &cps_topic, &group, &remote, 0, c, true)
            .await
            .with_context(|| r.log_text())?;
        let first = first_from(&target, &remote, 0, cp.downstream_offset)?;
        let mut l = landing(&visible, n, first.as_ref())?;
        let mut line = format!(
            "committed {c}{} -> checkpoint {}->{}; next on source {:?}, first on target {:?}",
            if n == visible.len() {
                " (the end)"
            } else if offsets.contains(&c) {
                ""
            } else {
                " (an offset gap)"
            },
            cp.upstream_offset,
            cp.downstream_offset,
            visible.get(n).map(|v| &v.value),
            first.as_ref().map(|f| &f.value),
        );
        if n == visible.len() {
            // At the end: the next record is the next one produced.
            send("after".into(), "after".into()).await?;
            let visible = wait_copied(&source, &topic, &target, &remote, 0).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let cp = latest(&checkpoints(&target, &cps_topic, &group)?, &remote, 0)
                .context("no checkpoint")?;
            let first = first_from(&target, &remote, 0, cp.downstream_offset)?;
            l = landing(&visible, n, first.as_ref())?;
            line += &format!(
                "; after a new record: checkpoint {}->{}, first on target {:?}",
                cp.upstream_offset,
                cp.downstream_offset,
                first.as_ref().map(|f| &f.value)
            );
        }
        report.push(format!(
            "{line}: skipped {}, re-read {}",
            l.skipped, l.reread
        ));
        total.skipped += l.skipped;
        total.reread += l.reread;
        next = Some(n);
    }
    let early_cps = checkpoints(&target, &cps_topic, &early)?;
    println!(
        "compacted: a commit at 0, before the first record ({}), got checkpoints {early_cps:?} \
         (no offset sync precedes the first record copied)",
        visible[0].offset
    );
    ensure!(
        early_cps.iter().all(|c| c.downstream_offset == 0),
        "a commit before the first record checkpointed past it: {early_cps:?}"
    );
    println!("compacted source, failover at the latest checkpoint:");
    for line in &report {
        println!("  {line}");
    }
    println!(
        "compacted: skipped {} re-read {} (over {} failover points)",
        total.skipped,
        total.reread,
        report.len()
    );
    assert_eq!(total.skipped, 0, "records skipped:\n{}", report.join("\n"));
    assert_eq!(total.reread, 0, "records re-read:\n{}", report.join("\n"));
    Ok(())
}

/// Failover with group offsets synced into the target, then failback with a second flow in the
/// other direction.
///
/// What it shows (and pins only where the behaviour is sound):
/// - the synced group offset on the target lands on the next record;
/// - the reverse flow does not copy the remote topic `<a>.<topic>` back (cycle rule);
/// - topics the applications wrote on the target after failing over are copied back and the
///   group's offsets on them are checkpointed exactly;
/// - the group's progress on the remote topic `<a>.<topic>` is NOT checkpointed back: the
///   reverse flow does not mirror that topic, so there is nothing to translate through. Failing
///   back to `<topic>` on the old source resumes from the group's own, older commit there; the
///   test prints how many records that re-reads.
#[tokio::test]
async fn failback_copies_new_topics_back_but_not_the_remote_topic() -> Result<()> {
    let _brokers = BROKERS.read().await;
    let s = Setup::new("fid-fb")?;
    let outcome = failback(&s).await;
    // Whatever happened: leave no topic of this test's aliases behind on either cluster.
    for bootstrap in [&s.world.source_bootstrap, &s.world.target_bootstrap] {
        if let Err(e) = delete_topics_naming(bootstrap, &[&s.a, &s.b]).await {
            eprintln!("cleaning up topics on {bootstrap}: {e:#}");
        }
    }
    outcome
}

/// Deletes every topic whose name contains one of `needles`.
async fn delete_topics_naming(bootstrap: &str, needles: &[&str]) -> Result<()> {
    let names: Vec<String> = kafka::topics(bootstrap)?
        .into_iter()
        .filter(|t| needles.iter().any(|n| t.contains(n)))
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    kafka::admin(bootstrap)?
        .delete_topics(&refs, &AdminOptions::new())
        .await?;
    println!("deleted {} topics of this test on {bootstrap}", names.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_outage_is_reported_and_nothing_is_lost() -> Result<()> {
    let _brokers = BROKERS.write().await;
    let s = Setup::new("fid-outage")?;
    let (source, target) = (
        s.world.source_bootstrap.clone(),
        s.world.target_bootstrap.clone(),
    );
    let partitions = 2;
    let topic = unique("outage");
    let remote = format!("{}.{topic}", s.a);
    kafka::create_topic(&source, &topic, partitions).await?;
    let r = s
        .start(
            "r",
            &s.flow(
                false,
                &[&topic],
                &["none"],
                "checkpoints: {enabled: false}\n",
            ),
        )
        .await?;

    // A steady producer on the source for the whole test.
    let producer = kafka::producer(&source, Duration::from_secs(60))?;
    let stop = Arc::new(AtomicBool::new(false));
    let producing = {
        let (stop, topic) = (stop.clone(), topic.clone());
        tokio::spawn(async move {
            let mut sent = Vec::new();
            let mut seq = 0_u64;
            while !stop.load(Ordering::Relaxed) {
                let value = format!("rec-{seq}");
                let p = (seq % 2) as i32;
                match producer
                    .send(
                        FutureRecord::to(&topic)
                            .partition(p)
                            .key("k")
                            .payload(&value),
                        Duration::from_secs(10),
                    )
                    .await
                {
                    Ok(_) => sent.push(value),
                    Err((e, _)) => eprintln!("producing {value} failed: {e}"),
                }
                seq += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            sent
        })
    };
    flowing(&target, &remote, partitions, 50)
        .await
        .with_context(|| r.log_text())?;

    if let Err(e) = wait_alone().await {
        stop.store(true, Ordering::Relaxed);
        return Err(e);
    }

    let mut guard = TargetBack {
        world: &s.world,
        armed: true,
    };
    let stopped_at = Instant::now(); // the broker goes away during the call
    s.world.world_sh(&["kafka", "stop", "target"])?;
    // Everything measured while the target is down; asserted only after it is back.
    let during: Result<(Duration, String)> = async {
        let seen = eventually(
            "cluster_unreachable{cluster=\"target\"} 1",
            Duration::from_secs(60),
            || async {
                Ok(
                    labelled(&r, "mirrorflow_cluster_unreachable", "cluster=\"target\"")
                        .filter(|v| *v == 1.0)
                        .map(|_| stopped_at.elapsed()),
                )
            },
        )
        .await?;
        let line = r
            .log_text()
            .lines()
            .find(|l| l.contains("unreachable") && l.contains("target"))
            .map(str::to_string)
            .context("no log line saying the target is unreachable")?;
        tokio::time::sleep(Duration::from_secs(10)).await; // records pile up on the source
        Ok((seen, line))
    }
    .await;
    let restarted_at = Instant::now();
    guard.start_now()?;
    let outage = stopped_at.elapsed();
    let (detected, line) = during.with_context(|| r.log_text())?;
    println!(
        "target down for about {outage:?} (stop to restart returning); gauge at 1 {detected:?} \
         after the stop began: {line}"
    );
    let recovered = eventually(
        "cluster_unreachable{cluster=\"target\"} 0",
        WAIT,
        || async {
            Ok(
                labelled(&r, "mirrorflow_cluster_unreachable", "cluster=\"target\"")
                    .filter(|v| *v == 0.0)
                    .map(|_| restarted_at.elapsed()),
            )
        },
    )
    .await
    .with_context(|| r.log_text())?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let sent = producing.await?;

    let copied = eventually("every record on the target", WAIT, || async {
        let mut values = Vec::new();
        for p in 0..partitions {
            values.extend(
                read_visible(&target, &remote, p)?
                    .into_iter()
                    .map(|r| r.value),
            );
        }
        let have: HashSet<&String> = values.iter().collect();
        Ok(sent.iter().all(|v| have.contains(v)).then_some(values))
    })
    .await
    .with_context(|| r.log_text())?;
    let mut counts: BTreeMap<&String, usize> = BTreeMap::new();
    for v in &copied {
        *counts.entry(v).or_default() += 1;
    }
    let duplicates: usize = counts.values().map(|n| n - 1).sum();
    let sent_set: HashSet<&String> = sent.iter().collect();
    let lost = sent.iter().filter(|v| !counts.contains_key(v)).count();
    let foreign = counts.keys().filter(|v| !sent_set.contains(*v)).count();
    let by_partition: HashMap<i32, usize> = (0..partitions)
        .map(|p| Ok((p, read_visible(&source, &topic, p)?.len())))
        .collect::<Result<_>>()?;
    println!(
        "outage: sent {} ({by_partition:?} per partition), on the target {}, lost {lost}, duplicates {duplicates}, gauge back to 0 {recovered:?} after the restart began",
        sent.len(),
        copied.len()
    );
    ensure!(lost == 0 && foreign == 0, "lost {lost}, foreign {foreign}");
    Ok(())
}
