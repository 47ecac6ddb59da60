//! `mirrorflow switchover --name` through the operator: the forward flow is a MirrorFlow its
//! replicator pods run; the switchover reads it from the apiserver, fences the source, moves
//! the group, and applies the reverse flow, which the operator then runs: a record produced on
//! the target afterwards reaches the source.
//!
//! Run alone (`EXCLUSIVE` in `e2e/world-tests.sh`): the reverse flow replicates the target's
//! heartbeats topics, those of every other test's flows too, onto the shared source, where the
//! other tests' flows would copy them again. The test deletes its namespace, waits for its pods
//! to go, then deletes every topic named after its aliases on both clusters, whatever its
//! outcome.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{condition, install_operator, wait_for_flow};
use mirrorflow_e2e::switchover::{committed, end_offsets, outcomes, run_switchover, step_millis};
use mirrorflow_e2e::{World, eventually, kafka, run, run_with_input, unique};

#[tokio::test]
async fn a_switchover_by_name_applies_the_reverse_flow_the_operator_runs() -> Result<()> {
    let world = World::from_env()?;
    let ns = unique("e2e-sw");
    let (a, b) = (unique("swa"), unique("swb"));
    let outcome = switchover_by_name(&world, &ns, &a, &b).await;
    let cleaned = clean_up(&world, &ns, &[&a, &b]).await;
    outcome?;
    cleaned
}

async fn switchover_by_name(world: &World, ns: &str, a: &str, b: &str) -> Result<()> {
    let client = world.kube_client().await?;
    install_operator(world, ns)?;
    let topic = unique("swop");
    let group = unique("swop-app");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 50, 1).await?;
    // The group read everything before the switchover.
    kafka::commit(&world.source_bootstrap, &group, &topic, &[(0, 50)])?;
    let resource = |name: &str, (src, sb): (&str, &str), (tgt, tb): (&str, &str)| {
        format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  source: {{alias: {src}, bootstrapServers: '{sb}'}}\n  target: {{alias: {tgt}, bootstrapServers: '{tb}'}}\n  topics: ['{topic}']\n  groups: ['{group}']\n  sourceLoop: {{topicsRefreshInterval: 1s}}\n  checkpoints: {{interval: 500ms}}\n"
        )
    };
    let forward = resource(
        "forward",
        (a, &world.source_bootstrap),
        (b, &world.target_bootstrap),
    );
    let back = resource(
        "back",
        (b, &world.target_bootstrap),
        (a, &world.source_bootstrap),
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &forward)?;
    let flows: kube::Api<MirrorFlow> = kube::Api::namespaced(client, ns);
    let ready = |mf: &MirrorFlow| condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True");
    wait_for_flow(
        &flows,
        "forward",
        "forward FailoverReady",
        Duration::from_secs(180),
        ready,
    )
    .await?;

    let dir = std::env::temp_dir().join("mirrorflow-e2e").join(ns);
    std::fs::create_dir_all(&dir)?;
    let back_file = dir.join("back.yaml");
    std::fs::write(&back_file, &back)?;
    let back_path = back_file.to_string_lossy().into_owned();
    let (code, report, stderr) = run_switchover(
        world,
        &[
            "--name",
            "forward",
            "-n",
            ns,
            "--group",
            &group,
            "--deny-principal",
            "User:reader",
            "--timeout",
            "120",
            "--apply",
            "--reverse-flow-file",
            &back_path,
        ],
    )?;
    ensure!(code == 0, "switchover exited {code}: {report:#}\n{stderr}");
    let steps = outcomes(&report);
    let want: Vec<(String, String)> = ["fence", "drain", "commit", "reverse"]
        .iter()
        .map(|s| (s.to_string(), "done".to_string()))
        .collect();
    assert_eq!(steps, want, "{report:#}");
    let remote = format!("{a}.{topic}");
    let target_end = end_offsets(&world.target_bootstrap, &remote, 1)?;
    let target_commit = committed(&world.target_bootstrap, &group, &remote, 1)?;
    assert_eq!(
        target_commit[0],
        Some(target_end[0]),
        "0 re-read, 0 skipped on the target"
    );
    let millis = step_millis(&report);
    println!("switchover --name: steps fence, drain, commit, reverse (ms): {millis:?}");

    // The reverse flow runs: the producers' new topic on the target flows back.
    let applied = Instant::now();
    wait_for_flow(
        &flows,
        "back",
        "back FailoverReady",
        Duration::from_secs(180),
        ready,
    )
    .await?;
    kafka::create_topic(&world.target_bootstrap, &topic, 1).await?;
    kafka::produce_values(&world.target_bootstrap, &topic, 10, 1).await?;
    let returned = format!("{b}.{topic}");
    eventually(
        "records written on the target reach the source",
        Duration::from_secs(90),
        || async {
            let n = kafka::read_partition(&world.source_bootstrap, &returned, 0)
                .map(|r| r.len())
                .unwrap_or(0);
            Ok((n >= 10).then_some(()))
        },
    )
    .await?;
    println!(
        "the reverse flow ready and its first records on the source {:.1}s after the switchover applied it",
        applied.elapsed().as_secs_f64()
    );

    let (code, report, stderr) = run_switchover(
        world,
        &[
            "--name",
            "forward",
            "-n",
            ns,
            "--deny-principal",
            "User:reader",
            "--abort",
        ],
    )?;
    ensure!(code == 0, "abort exited {code}: {report:#}\n{stderr}");
    Ok(())
}

/// Deletes the namespace and waits for it (its replicator pods stop writing), then every topic
/// on either cluster whose name holds one of `aliases` (remote topics, heartbeats copied back,
/// the flows' internal topics).
async fn clean_up(world: &World, ns: &str, aliases: &[&str]) -> Result<()> {
    run(
        "kubectl",
        &["delete", "namespace", ns, "--wait=true", "--timeout=180s"],
    )?;
    for bootstrap in [&world.source_bootstrap, &world.target_bootstrap] {
        let mine: Vec<String> = kafka::topics(bootstrap)?
            .into_iter()
            .filter(|t| aliases.iter().any(|a| t.contains(a)))
            .collect();
        for topic in &mine {
            kafka::delete_topic(bootstrap, topic).await?;
        }
        println!("deleted {} topics of this test's aliases", mine.len());
    }
    Ok(())
}
