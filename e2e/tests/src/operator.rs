//! Installing the operator's chart for a test and reading a flow's conditions.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mirrorflow::api::MirrorFlow;

use crate::{World, run};

/// Installs the chart as release `mirrorflow` into `ns` (created) with the world's values (the
/// image built from this checkout); the operator watches only `ns`, so it never touches other
/// tests' flows.
pub fn install_operator(world: &World, ns: &str) -> Result<()> {
    install_operator_with(world, ns, &[])
}

/// [`install_operator`] with more `--set key=value` chart values.
pub fn install_operator_with(world: &World, ns: &str, values: &[&str]) -> Result<()> {
    install_operator_in(world, ns, ns, values)
}

/// Applies the checkout's CRD. Helm installs a chart's CRDs only when absent and never
/// upgrades them: a world that outlived a schema change would test against the old schema.
pub fn apply_crds(world: &World) -> Result<()> {
    let crds = world.repo_root.join("crds");
    run(
        "kubectl",
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crds.to_str().context("crds path")?,
        ],
    )
    .map(|_| ())
}

/// Installs the chart as release `mirrorflow` into `ns` (created), its operator watching
/// `watch` only (as a platform team runs it when the two differ).
pub fn install_operator_in(world: &World, ns: &str, watch: &str, values: &[&str]) -> Result<()> {
    let chart = world.repo_root.join("charts/mirrorflow");
    let chart = chart.to_str().context("chart path")?;
    apply_crds(world)?;
    let sets: Vec<&str> = values.iter().flat_map(|v| ["--set", *v]).collect();
    helm_release(world, "install", chart, (ns, watch), &sets)
}

/// `helm <verb>` (install or upgrade) of `chart` as release `mirrorflow` in `ns` (created),
/// with the world's values, its operator watching `watch`; `extra` goes to helm as it is.
pub fn helm_release(
    world: &World,
    verb: &str,
    chart: &str,
    (ns, watch): (&str, &str),
    extra: &[&str],
) -> Result<()> {
    let world_values = world.chart_values.to_str().context("chart values path")?;
    let watch = format!("watchNamespace={watch}");
    let mut args = vec![
        verb,
        "mirrorflow",
        chart,
        "-n",
        ns,
        "--create-namespace",
        "--wait",
        "--timeout",
        "180s",
        "-f",
        world_values,
        "--set",
        &watch,
    ];
    args.extend_from_slice(extra);
    run("helm", &args).map(|_| ())
}

/// (status, reason, message) of the flow's condition `type_`.
pub fn condition(mf: &MirrorFlow, type_: &str) -> Option<(String, String, String)> {
    let c = mf
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until `check` holds for the flow `name`; on timeout the error shows the conditions
/// last seen.
pub async fn wait_for_flow(
    flows: &kube::Api<MirrorFlow>,
    name: &str,
    what: &str,
    timeout: std::time::Duration,
    check: impl Fn(&MirrorFlow) -> bool,
) -> Result<MirrorFlow> {
    crate::eventually(what, timeout, || async {
        let mf = flows.get(name).await?;
        if check(&mf) {
            return Ok(Some(mf));
        }
        let seen: Vec<_> = mf
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .map(|c| {
                // A timeout's message is all a failed CI run shows: say why each is not True.
                if c.status == "True" {
                    format!("{}={} ({})", c.type_, c.status, c.reason)
                } else {
                    format!("{}={} ({}: {})", c.type_, c.status, c.reason, c.message)
                }
            })
            .collect();
        anyhow::bail!("now {}", seen.join(", "))
    })
    .await
}

/// Patches the flow's spec and waits until its pods run the new spec: the operator has
/// observed the generation (so the StatefulSet is changed) and the rollout is complete. Until
/// then the old pods keep doing what the old spec said.
pub async fn roll_flow_spec(
    flows: &kube::Api<MirrorFlow>,
    ns: &str,
    name: &str,
    spec_json: &str,
) -> Result<()> {
    patch_flow_spec(ns, name, spec_json)?;
    wait_for_flow(
        flows,
        name,
        "the new generation observed",
        std::time::Duration::from_secs(60),
        |mf| mf.status.as_ref().and_then(|s| s.observed_generation) == mf.metadata.generation,
    )
    .await?;
    run(
        "kubectl",
        &[
            "rollout",
            "status",
            &format!("statefulset/{name}"),
            "-n",
            ns,
            "--timeout=120s",
        ],
    )
    .map(|_| ())
}

/// Merge-patches the flow's spec with `spec_json` (a JSON object), as a user would.
pub fn patch_flow_spec(ns: &str, name: &str, spec_json: &str) -> Result<()> {
    let patch = format!(r#"{{"spec":{spec_json}}}"#);
    run(
        "kubectl",
        &[
            "patch", "mf", name, "-n", ns, "--type", "merge", "-p", &patch,
        ],
    )
    .map(|_| ())
}

/// Where a Secret's values come from, as `kubectl create secret generic` takes them.
pub enum SecretSource<'a> {
    /// `--from-literal=key=value`
    Literal(&'a str, &'a str),
    /// `--from-file=key=path`
    File(&'a str, &'a str),
}

/// Creates a generic Secret in `ns` that every flow of the namespace may use (a Secret nobody
/// allowed is refused: `tenancy.rs`).
pub fn create_shared_secret(ns: &str, name: &str, sources: &[SecretSource<'_>]) -> Result<()> {
    let mut args = vec![
        "create".to_string(),
        "secret".into(),
        "generic".into(),
        name.into(),
        "-n".into(),
        ns.into(),
    ];
    for source in sources {
        args.push(match source {
            SecretSource::Literal(k, v) => format!("--from-literal={k}={v}"),
            SecretSource::File(k, path) => format!("--from-file={k}={path}"),
        });
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run("kubectl", &args)?;
    run(
        "kubectl",
        &[
            "annotate",
            "secret",
            name,
            "-n",
            ns,
            "mirrorflow.io/allowed-flows=*",
            // The tests' Secrets go to the local world's brokers and token endpoints only.
            "mirrorflow.io/allowed-destinations=127.0.0.1,localhost",
            "mirrorflow.io/allow-plaintext=true",
            "--overwrite",
        ],
    )
    .map(|_| ())
}

/// The operator pod's `/metrics` (port 8080, from inside the world's network).
pub fn operator_metrics(pod: &k8s_openapi::api::core::v1::Pod) -> Result<String> {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("pod IP")?;
    crate::replicator::http_get(&format!("{ip}:8080"), "/metrics")
}

/// The sum of every series of the metric `name` in a Prometheus text page (0 when absent: a
/// counter vector has no series before its first increment).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name).then(|| value.trim().parse::<f64>().ok())?
        })
        // Not `sum()`: an empty f64 sum is -0.
        .fold(0.0, |a, v| a + v)
}

/// `mirrorflow_operator_reconciles_total` of one operator pod.
pub fn reconciles(pod: &k8s_openapi::api::core::v1::Pod) -> Result<f64> {
    let text = operator_metrics(pod)?;
    anyhow::ensure!(
        text.contains("mirrorflow_operator_reconciles_total "),
        "no reconciles_total in /metrics"
    );
    Ok(metric_sum(&text, "mirrorflow_operator_reconciles_total"))
}

/// Applies a replicating flow `name` in `ns` with a source topic of its own, named from
/// `prefix`, and an alias of its own, so no two flows share internal topics.
pub async fn apply_replicating_flow(
    world: &World,
    ns: &str,
    name: &str,
    prefix: &str,
) -> Result<()> {
    let topic = crate::unique(&format!("{prefix}-{name}"));
    crate::kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    let alias = topic.replacen(prefix, "a", 1);
    let yaml = format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  source: {{alias: {alias}, bootstrapServers: \"{src}\"}}\n  target: {{alias: {alias}-t, bootstrapServers: \"{tgt}\"}}\n  topics: [\"{topic}\"]\n",
        src = world.source_bootstrap,
        tgt = world.target_bootstrap,
    );
    crate::run_with_input("kubectl", &["apply", "-f", "-"], &yaml).map(|_| ())
}

/// `Ready` True, written for the flow's current generation.
pub fn ready_at_generation(mf: &MirrorFlow) -> bool {
    condition(mf, "Ready").is_some_and(|c| c.0 == "True")
        && mf.status.as_ref().and_then(|s| s.observed_generation) == mf.metadata.generation
}

/// The (reason, message) of every Event about `flow` in `ns`.
pub fn flow_events(ns: &str, flow: &str) -> Result<Vec<(String, String)>> {
    let json = run(
        "kubectl",
        &[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            &format!("involvedObject.name={flow},involvedObject.kind=MirrorFlow"),
            "-o",
            "json",
        ],
    )?;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    Ok(v["items"]
        .as_array()
        .context("events list")?
        .iter()
        .map(|e| {
            let text = |k: &str| e[k].as_str().map(str::to_string);
            (
                text("reason").unwrap_or_default(),
                text("message").or_else(|| text("note")).unwrap_or_default(),
            )
        })
        .collect())
}

/// Waits up to a minute for an Event `reason` about `flow` whose message contains `part`;
/// its message.
pub async fn wait_for_event(ns: &str, flow: &str, reason: &str, part: &str) -> Result<String> {
    crate::eventually(
        &format!("a {reason} event naming {part}"),
        Duration::from_secs(60),
        || async {
            let events = flow_events(ns, flow)?;
            Ok(events
                .into_iter()
                .find(|(r, m)| r == reason && m.contains(part))
                .map(|(_, m)| m))
        },
    )
    .await
}

/// The kinds of object a flow may own (NetworkPolicy when the installer turns it on).
pub const CHILD_KINDS: &str =
    "statefulsets,configmaps,services,poddisruptionbudgets,networkpolicies";

/// A child as found: its uid, its owning flow's uid, whether the flow controls it, and its flow
/// label.
pub type Child = (String, String, bool, String);

/// Every object in `ns` a MirrorFlow owns, as `kind/name` -> [`Child`]. Found by owner
/// reference, not by label: a child without its labels counts.
pub fn owned_children(ns: &str) -> Result<BTreeMap<String, Child>> {
    let out = run("kubectl", &["get", CHILD_KINDS, "-n", ns, "-o", "json"])?;
    let list: serde_json::Value = serde_json::from_str(&out)?;
    let mut children = BTreeMap::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let meta = &item["metadata"];
        let owners: Vec<&serde_json::Value> = meta["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| o["kind"] == "MirrorFlow")
            .collect();
        let Some(owner) = owners.first() else {
            continue;
        };
        ensure!(owners.len() == 1, "two flows own {meta}");
        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        children.insert(
            format!("{}/{}", s(&item["kind"]), s(&meta["name"])),
            (
                s(&meta["uid"]),
                s(&owner["uid"]),
                owner["controller"] == true,
                s(&meta["labels"]["mirrorflow.io/flow"]),
            ),
        );
    }
    Ok(children)
}

/// Checks that each flow has exactly one child of each kind, controlled by it and labelled with
/// its name; returns how many children each flow has.
pub async fn one_set_each(
    flows: &kube::Api<MirrorFlow>,
    ns: &str,
    names: &[&str],
) -> Result<usize> {
    let children = owned_children(ns)?;
    let mut per_flow = None;
    for name in names {
        let uid = flows.get(name).await?.metadata.uid.context("flow uid")?;
        let mine: Vec<(&String, &Child)> = children.iter().filter(|(_, c)| c.1 == uid).collect();
        let mut kinds: Vec<&str> = mine
            .iter()
            .filter_map(|(k, _)| k.split('/').next())
            .collect();
        let all = kinds.len();
        kinds.dedup();
        ensure!(kinds.len() == all, "{name}: a kind twice: {mine:?}");
        for (key, (_, _, controller, label)) in &mine {
            ensure!(
                *controller,
                "{key} is owned by {name} but not controlled by it"
            );
            ensure!(label == name, "{key} carries flow label '{label}'");
        }
        ensure!(*per_flow.get_or_insert(all) == all, "{name}: {mine:?}");
    }
    let n = per_flow.unwrap_or(0);
    ensure!(
        n >= 4,
        "every flow has at least its ConfigMap, Service, StatefulSet and PDB"
    );
    ensure!(
        children.len() == n * names.len(),
        "children nobody expects: {children:?}"
    );
    Ok(n)
}
