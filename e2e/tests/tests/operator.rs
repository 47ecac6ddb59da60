//! The operator end to end: installed by its Helm chart, running as a container on the world's node,
//! deploying replicators for a MirrorFlow and reporting a status measured on the clusters.
//! One test function, because the steps share one installation and run in order.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::Api;
use kube::api::ListParams;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{condition, install_operator, patch_flow_spec, wait_for_flow};
use mirrorflow_e2e::{World, eventually, kafka, run, run_with_input, unique};

const READY_WITHIN: Duration = Duration::from_secs(180);

fn flow_yaml(ns: &str, name: &str, alias: &str, world: &World, topic: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: {name}, namespace: {ns}}}
spec:
  source: {{alias: {alias}, bootstrapServers: "{src}"}}
  target: {{alias: {alias}-t, bootstrapServers: "{tgt}"}}
  topics: ["{topic}"]
  groups: ["{topic}-.*"]
{extra}"#,
        src = world.source_bootstrap,
        tgt = world.target_bootstrap,
    )
}

async fn wait_condition(
    flows: &Api<MirrorFlow>,
    name: &str,
    type_: &str,
    status: &str,
    timeout: Duration,
) -> Result<MirrorFlow> {
    let what = format!("{name}: {type_}={status}");
    wait_for_flow(flows, name, &what, timeout, |mf| {
        condition(mf, type_).is_some_and(|c| c.0 == status)
    })
    .await
}

#[tokio::test]
async fn the_operator_deploys_flows_and_reports_failover_readiness() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-op");
    install_operator(&world, &ns)?;

    // A flow that replicates live data becomes FailoverReady; with aligned offsets (the newest
    // delivery policy, here in the image on a real kubelet) it also reports OffsetsAligned.
    let alias = unique("op");
    let topic = unique("optopic");
    kafka::create_topic(&world.source_bootstrap, &topic, 2).await?;
    let started = std::time::Instant::now();
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &flow_yaml(&ns, "flow", &alias, &world, &topic, "  offsets: Aligned\n"),
    )?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    kafka::produce_values(&world.source_bootstrap, &topic, 50, 2).await?;
    let ready = wait_condition(&flows, "flow", "FailoverReady", "True", READY_WITHIN).await?;
    println!("FailoverReady after {:?}", started.elapsed());
    let aligned = wait_condition(&flows, "flow", "OffsetsAligned", "True", READY_WITHIN)
        .await
        .with_context(|| format!("{:?}", condition(&ready, "OffsetsAligned")))?;
    let (_, reason, _) = condition(&aligned, "OffsetsAligned").context("OffsetsAligned")?;
    assert_eq!(reason, "OffsetsMatch");
    let status = ready.status.clone().context("status")?;
    assert_eq!(status.observed_generation, ready.metadata.generation);
    assert!(
        status.heartbeat.and_then(|h| h.lag).is_some(),
        "heartbeat lag reported"
    );
    let remote = format!("{alias}.{topic}");
    let copied = eventually("records on the target", Duration::from_secs(60), || async {
        let n: usize = (0..2)
            .map(|p| kafka::read_partition(&world.target_bootstrap, &remote, p).map(|r| r.len()))
            .sum::<Result<usize>>()?;
        Ok((n >= 50).then_some(n))
    })
    .await?;
    assert_eq!(copied, 50);
    // Replication lag is measured from the source's end offsets and the stored positions; once
    // the 50 records are copied only heartbeats in flight can be behind.
    let caught_up = wait_for_flow(
        &flows,
        "flow",
        "replicationLag at most a few heartbeats",
        Duration::from_secs(60),
        |mf| {
            mf.status
                .as_ref()
                .and_then(|s| s.replication_lag)
                .is_some_and(|lag| lag <= 5)
        },
    )
    .await?;
    println!(
        "replicationLag {:?}",
        caught_up.status.and_then(|s| s.replication_lag)
    );
    // `kubectl wait` works on the condition, as users will script it.
    run(
        "kubectl",
        &[
            "wait",
            "--for=condition=FailoverReady",
            "mf/flow",
            "-n",
            &ns,
            "--timeout=30s",
        ],
    )?;

    // A spec change rolls the replicator pods.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let selector = "mirrorflow.io/flow=flow";
    let before: Vec<String> = pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    patch_flow_spec(&ns, "flow", r#"{"heartbeats":{"interval":"2s"}}"#)?;
    eventually(
        "a new replicator pod after the spec change",
        Duration::from_secs(120),
        || async {
            let now = pods
                .list(&ListParams::default().labels(selector))
                .await?
                .items;
            Ok(now
                .iter()
                .any(|p| {
                    p.metadata.uid.as_ref().is_some_and(|u| !before.contains(u)) && is_ready(p)
                })
                .then_some(()))
        },
    )
    .await?;

    // A missing Secret gives a condition naming it; the Secret's value never leaks anywhere.
    let secret_value = "never-print-this-9f3a";
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: present, namespace: {ns}, annotations: {{mirrorflow.io/allowed-flows: needs-secret, mirrorflow.io/allowed-destinations: 127.0.0.1, mirrorflow.io/allow-plaintext: \"true\"}}}}\nstringData: {{user: alice, password: {secret_value}}}\n"
        ),
    )?;
    let yaml = format!(
        r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: needs-secret, namespace: {ns}}}
spec:
  source: {{alias: {alias}, bootstrapServers: "{src}"}}
  target:
    alias: {alias}-t
    bootstrapServers: "{tgt}"
    sasl:
      mechanism: PLAIN
      usernameSecretRef: {{name: present, key: user}}
      passwordSecretRef: {{name: absent, key: password}}
  topics: ["{topic}"]
"#,
        alias = unique("sec"),
        src = world.source_bootstrap,
        tgt = world.target_bootstrap,
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &yaml)?;
    let missing = wait_condition(
        &flows,
        "needs-secret",
        "Ready",
        "False",
        Duration::from_secs(60),
    )
    .await?;
    let (_, reason, message) = condition(&missing, "Ready").context("Ready condition")?;
    assert_eq!(reason, "SecretMissing", "{message}");
    assert!(
        message.contains("'absent'") && message.contains("spec.target.sasl.passwordSecretRef"),
        "{message}"
    );
    run(
        "kubectl",
        &[
            "patch",
            "mf",
            "needs-secret",
            "-n",
            &ns,
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/spec/target/sasl/passwordSecretRef/name","value":"present"}]"#,
        ],
    )?;
    eventually(
        "the flow to use the now-present Secret",
        Duration::from_secs(60),
        || async {
            let mf = flows.get("needs-secret").await?;
            Ok(condition(&mf, "Ready")
                .is_some_and(|c| c.1 != "SecretMissing")
                .then_some(()))
        },
    )
    .await?;
    let mut haystack = String::new();
    for cm in Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await?
    {
        haystack.push_str(&serde_json::to_string(&cm.data)?);
    }
    for mf in flows.list(&ListParams::default()).await? {
        haystack.push_str(&serde_json::to_string(&mf.status)?);
    }
    for ev in Api::<Event>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await?
    {
        haystack.push_str(&ev.message.unwrap_or_default());
    }
    for file in world.pod_log_files(&ns)? {
        haystack.push_str(&std::fs::read_to_string(file).unwrap_or_default());
    }
    assert!(
        haystack.contains("needs-secret") || haystack.contains("flow"),
        "the haystack holds what was searched"
    );
    assert!(
        !haystack.contains(secret_value),
        "the Secret's value leaked into ConfigMaps, status, events or logs"
    );

    // Children edited behind the operator's back are put back although the flow did not
    // change: the watches see the edit and the next reconcile applies again.
    let stses: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let replicas = stses
        .get("flow")
        .await?
        .spec
        .and_then(|s| s.replicas)
        .context("the StatefulSet has replicas")?;
    run(
        "kubectl",
        &["scale", "statefulset", "flow", "-n", &ns, "--replicas=0"],
    )?;
    run("kubectl", &["delete", "configmap", "flow-flow", "-n", &ns])?;
    let edited = std::time::Instant::now();
    eventually(
        "the operator to restore the StatefulSet and the ConfigMap",
        Duration::from_secs(60),
        || async {
            let sts = stses.get_opt("flow").await?;
            let cm = cms.get_opt("flow-flow").await?;
            let restored = sts.and_then(|s| s.spec).and_then(|s| s.replicas) == Some(replicas);
            Ok((restored && cm.is_some()).then_some(()))
        },
    )
    .await?;
    println!("edited children restored after {:?}", edited.elapsed());

    // An invalid flow is refused by the apiserver, naming the field.
    let same_alias =
        flow_yaml(&ns, "bad", "same", &world, &topic, "").replace("alias: same-t", "alias: same");
    let err = run_with_input("kubectl", &["apply", "-f", "-"], &same_alias)
        .expect_err("the apiserver refuses it");
    assert!(err.to_string().contains("spec.target.alias"), "{err}");

    // Deleting the flow removes its replicators and objects.
    run(
        "kubectl",
        &[
            "delete",
            "mf",
            "flow",
            "-n",
            &ns,
            "--wait=true",
            "--timeout=60s",
        ],
    )?;
    eventually(
        "the flow's StatefulSet and pods to be gone",
        Duration::from_secs(90),
        || async {
            let sts = stses.get_opt("flow").await?;
            let left = pods
                .list(&ListParams::default().labels(selector))
                .await?
                .items;
            Ok((sts.is_none() && left.is_empty()).then_some(()))
        },
    )
    .await?;

    run("helm", &["uninstall", "mirrorflow", "-n", &ns, "--wait"])?;
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    if haystack.is_empty() {
        bail!("nothing was searched for leaks");
    }
    Ok(())
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
