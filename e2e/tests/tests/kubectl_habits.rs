//! What kubectl users reach for first works on the installed CRD: `kubectl explain` gives each
//! field's documentation from the Rust types, the short and singular names list flows, and
//! `kubectl get` prints the status columns.

use anyhow::{Result, ensure};
use mirrorflow_e2e::operator::apply_crds;
use mirrorflow_e2e::{World, run, run_with_input, unique};

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run("kubectl", &["delete", "namespace", &self.0, "--wait=false"]);
    }
}

/// `kubectl explain FIELD` with its whitespace folded, retried once a second for up to `seconds`.
fn explain_within(field: &str, seconds: u64) -> Result<String> {
    let mut last = None;
    for _ in 0..seconds {
        match run("kubectl", &["explain", field]) {
            // kubectl wraps descriptions at 80 columns: compare words, not lines.
            Ok(text) => return Ok(text.split_whitespace().collect::<Vec<_>>().join(" ")),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("kubectl explain {field}: not tried")))
}

#[test]
fn kubectl_explain_short_names_and_columns_work_on_the_installed_crd() -> Result<()> {
    let world = World::from_env()?;
    apply_crds(&world)?;
    run(
        "kubectl",
        &[
            "wait",
            "--for=condition=Established",
            "crd/mirrorflows.mirrorflow.io",
            "--timeout=60s",
        ],
    )?;
    // Field docs come from the `///` comments of crates/api/src/spec.rs, through the CRD. The
    // apiserver publishes a new CRD's schema a few seconds after it is established.
    let explained = explain_within("mirrorflow.spec.source.bootstrapServers", 60)?;
    ensure!(
        explained.contains("Comma-separated `host:port` list of the cluster's brokers"),
        "kubectl explain of bootstrapServers:\n{explained}"
    );
    let alias = explain_within("mf.spec.source.alias", 10)?;
    ensure!(
        alias.contains("remote topics on the target are named"),
        "kubectl explain by short name:\n{alias}"
    );
    let kind = explain_within("mirrorflow", 10)?;
    ensure!(
        kind.contains("A one-way Kafka replication flow"),
        "kubectl explain of the kind:\n{kind}"
    );

    // A flow that no operator watches: no status yet, but the columns are there, and the
    // short and singular names list it.
    let ns = unique("e2e-kubectl");
    let _cleanup = Cleanup(ns.clone());
    run("kubectl", &["create", "namespace", &ns])?;
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: columns, namespace: {ns}}}\nspec:\n  source: {{alias: kc-src, bootstrapServers: \"127.0.0.1:1\"}}\n  target: {{alias: kc-tgt, bootstrapServers: \"127.0.0.1:2\"}}\n  topics: [orders]\n"
        ),
    )?;
    let table = run("kubectl", &["get", "mf", "-n", &ns])?;
    let header = table.lines().next().unwrap_or_default();
    let columns: Vec<&str> = header.split_whitespace().collect();
    ensure!(
        columns
            == [
                "NAME", "READY", "FAILOVER", "HB-LAG", "CKPT-AGE", "TOPICS", "AGE"
            ],
        "kubectl get mf columns: {header}"
    );
    ensure!(table.contains("columns"), "kubectl get mf:\n{table}");
    let by_singular = run("kubectl", &["get", "mirrorflow", "-n", &ns, "-o", "name"])?;
    ensure!(
        by_singular.trim() == "mirrorflow.mirrorflow.io/columns",
        "kubectl get by the singular name: {by_singular}"
    );
    Ok(())
}
