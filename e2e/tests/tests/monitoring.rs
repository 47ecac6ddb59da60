//! Monitoring as the chart ships it, looked at by the real thing: the alert rules pass
//! `promtool check rules` and a promtool unit test for every alert (firing and not firing), and
//! a real Prometheus, scraping what the chart's ServiceMonitor and PodMonitor select, answers
//! every dashboard panel's query with series of a running flow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use kube::Api;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{condition, install_operator_in, wait_for_flow};
use mirrorflow_e2e::prometheus::{Prometheus, scrape_configs};
use mirrorflow_e2e::{World, eventually, kafka, run, run_with_input, unique};
use serde_yaml::Value;

fn path_str(path: &Path) -> Result<&str> {
    path.to_str().context("non-UTF-8 path")
}

/// The chart's documents of `templates` rendered with `values` (release `mirrorflow`, in `ns`).
fn render(world: &World, ns: &str, values: &[&str], templates: &[&str]) -> Result<Vec<Value>> {
    let chart = world.repo_root.join("charts/mirrorflow");
    let world_values = path_str(&world.chart_values)?.to_string();
    let mut args = vec!["template", "mirrorflow", path_str(&chart)?, "-n", ns];
    args.extend(["-f", &world_values]);
    for v in values {
        args.extend(["--set", v]);
    }
    for t in templates {
        args.extend(["--show-only", t]);
    }
    let text = run("helm", &args)?;
    let mut docs = Vec::new();
    for doc in text.split("\n---") {
        let v: Value = serde_yaml::from_str(doc)?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// Alert names of a rule file's `groups`.
fn alert_names(rules: &Value) -> BTreeSet<String> {
    rules["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn every_alert_passes_promtool_tests_that_fire_it_and_leave_it_quiet() -> Result<()> {
    let world = World::from_env()?;
    let docs = render(
        &world,
        "mirrorflow-system",
        &["alerts.enabled=true"],
        &["templates/prometheusrule.yaml"],
    )?;
    let rule = docs.first().context("the PrometheusRule")?;
    let rules = rule.get("spec").context("PrometheusRule spec")?;
    let dir = std::env::temp_dir().join(unique("mirrorflow-rules"));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("rules.yaml"), serde_yaml::to_string(rules)?)?;
    let tests_path = world.repo_root.join("e2e/monitoring/alerts.test.yaml");
    let tests_text = std::fs::read_to_string(&tests_path)?;
    std::fs::write(dir.join("alerts.test.yaml"), &tests_text)?;

    run(
        "promtool",
        &["check", "rules", path_str(&dir.join("rules.yaml"))?],
    )?;
    let out = run(
        "promtool",
        &["test", "rules", path_str(&dir.join("alerts.test.yaml"))?],
    )?;
    println!("{out}");

    // Every alert is tested both ways: a rule nobody saw fire, or saw stay quiet, could be
    // always on or never on.
    let tests: Value = serde_yaml::from_str(&tests_text)?;
    let mut seen: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    for t in tests["tests"].as_sequence().into_iter().flatten() {
        for case in t["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap_or_default().to_string();
            let fires = case["exp_alerts"]
                .as_sequence()
                .is_some_and(|a| !a.is_empty());
            let e = seen.entry(name).or_default();
            if fires {
                e.0 = true;
            } else {
                e.1 = true;
            }
        }
    }
    let alerts = alert_names(rules);
    ensure!(!alerts.is_empty(), "the chart renders no alert");
    for a in &alerts {
        let (fires, quiet) = seen.get(a).copied().unwrap_or_default();
        ensure!(
            fires && quiet,
            "alert {a}: e2e/monitoring/alerts.test.yaml needs a case where it fires ({fires}) and one where it does not ({quiet})"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", &self.0[0]]);
        for ns in &self.0 {
            let _ = run("kubectl", &["delete", "namespace", ns, "--wait=false"]);
        }
    }
}

/// Every `expr` of the dashboard's panels, with the panel's title.
fn panel_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |t| Some((title.clone(), t["expr"].as_str()?.to_string())))
        })
        .collect()
}

/// The operator in one namespace, the flow in another (as a platform team runs it): every
/// dashboard panel returns series of that flow, labelled with the flow's namespace and name.
#[tokio::test]
async fn a_real_prometheus_answers_every_dashboard_panel_for_a_running_flow() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ops = unique("e2e-mon-ops");
    let team = unique("e2e-mon-team");
    let _cleanup = Cleanup(vec![ops.clone(), team.clone()]);
    run("kubectl", &["create", "namespace", &team])?;
    let monitors = [
        "metrics.serviceMonitor.enabled=true",
        "metrics.replicatorPodMonitor.enabled=true",
    ];
    let watch = format!("watchNamespace={team}");
    install_operator_in(&world, &ops, &team, &[])?;

    // What the Prometheus Operator would scrape, had the chart's monitors been installed.
    let mut configs = Vec::new();
    for m in render(
        &world,
        &ops,
        &[&watch, monitors[0], monitors[1]],
        &["templates/servicemonitor.yaml", "templates/podmonitor.yaml"],
    )? {
        configs.extend(scrape_configs(&m, &world.kubeconfig)?);
    }
    ensure!(configs.len() == 2, "one ServiceMonitor and one PodMonitor");
    let prometheus = Prometheus::start(
        &std::env::temp_dir().join(unique("mirrorflow-prometheus")),
        configs,
        "5s",
    )?;

    // A flow with traffic and a committing group, so that every histogram moves.
    let alias = unique("mon");
    let topic = unique("montopic");
    let group = format!("{topic}-g");
    kafka::create_topic(&world.source_bootstrap, &topic, 2).await?;
    let flow = format!(
        r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: watched, namespace: {team}}}
spec:
  source: {{alias: {alias}, bootstrapServers: "{s}"}}
  target: {{alias: {alias}-t, bootstrapServers: "{t}"}}
  topics: ["{topic}"]
  groups: ["{group}"]
  checkpoints: {{interval: 2s}}
"#,
        s = world.source_bootstrap,
        t = world.target_bootstrap,
    );
    run_with_input("kubectl", &["apply", "-f", "-"], &flow)?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &team);
    let traffic = keep_traffic(world.source_bootstrap.clone(), topic.clone(), group.clone());
    let ready = wait_for_flow(
        &flows,
        "watched",
        "FailoverReady=True",
        Duration::from_secs(240),
        |mf| condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True"),
    )
    .await;
    if let Err(e) = ready {
        traffic.abort();
        bail!("{e:#}\ntargets: {:?}", prometheus.targets()?);
    }

    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        world
            .repo_root
            .join("charts/mirrorflow/dashboards/mirrorflow.json"),
    )?)?;
    let queries = panel_queries(&dashboard);
    ensure!(queries.len() >= 10, "the dashboard's queries: {queries:?}");
    let mut answered = Vec::new();
    for (title, expr) in &queries {
        let q = expr
            .replace("$namespace", &team)
            .replace("$flow", "watched");
        let series = eventually(
            &format!("series for panel {title:?}: {q}"),
            Duration::from_secs(150),
            || async {
                let r = prometheus.query(&q)?;
                // Each series names the flow's own namespace (not the operator's) and, where
                // the panel groups by it, the flow.
                let ok = r.iter().any(|s| {
                    let m = &s["metric"];
                    m["namespace"] == team.as_str()
                        && (!q.contains("flow)") && !q.contains("flow,") || m["flow"] == "watched")
                });
                Ok(ok.then_some(r.len()))
            },
        )
        .await;
        match series {
            Ok(n) => answered.push(format!("{title}: {n} series")),
            Err(e) => {
                traffic.abort();
                bail!("{e:#}\ntargets: {:#?}", prometheus.targets()?);
            }
        }
    }
    traffic.abort();
    println!("{}", answered.join("\n"));

    // The dashboard's variables: the namespaces and flows it offers hold this flow.
    let flows_of_team = prometheus.query(&format!(
        "group by (namespace, flow) (mirrorflow_operator_flow_condition{{namespace=\"{team}\"}})"
    ))?;
    ensure!(
        flows_of_team
            .iter()
            .any(|s| s["metric"]["flow"] == "watched"),
        "the flow variable's series: {flows_of_team:?}"
    );
    Ok(())
}

/// Records every 200 ms and a group commit at the end every 2 s, until aborted.
fn keep_traffic(source: String, topic: String, group: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut round = 0_i64;
        loop {
            let _ = kafka::produce_values(&source, &topic, 10, 2).await;
            round += 1;
            if round % 10 == 0 {
                let ends: Vec<(i32, i64)> = (0..2).map(|p| (p, round * 5)).collect();
                let _ = kafka::commit(&source, &group, &topic, &ends);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}
