//! The Helm chart and the manifests rendered from it: the chart's CRD is the generated one,
//! manifests/mirrorflow.yaml is what manifests/render.sh renders now, the chart lints, and
//! installed into the real apiserver its RBAC gives the operator what it needs and nothing more.
//!
//! The install runs no operator pod (`replicaCount=0`) and skips the CRD: an operator watching
//! every namespace, or a Helm-owned CRD, would get in the way of other tests sharing the world.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use mirrorflow_e2e::{World, run, run_with_input, unique};

const CRD: &str = "mirrorflows.mirrorflow.io.yaml";

fn path_str(path: &Path) -> Result<&str> {
    path.to_str().context("non-UTF-8 path")
}

#[test]
fn chart_crd_is_the_generated_crd() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let generated = std::fs::read(root.join("crds").join(CRD)).context("reading crds/")?;
    let in_chart = std::fs::read(root.join("charts/mirrorflow/crds").join(CRD))
        .context("reading charts/mirrorflow/crds/")?;
    if generated != in_chart {
        bail!(
            "charts/mirrorflow/crds/{CRD} differs from crds/{CRD}: cp crds/{CRD} charts/mirrorflow/crds/"
        );
    }
    Ok(())
}

#[test]
fn manifests_are_the_rendered_chart() -> Result<()> {
    let world = World::from_env()?;
    let rendered = run(
        path_str(&world.repo_root.join("manifests/render.sh"))?,
        &["--stdout"],
    )?;
    let committed = world.repo_root.join("manifests/mirrorflow.yaml");
    // render.sh writes the rendering plus one newline (printf '%s\n' of a command substitution).
    let expected = format!("{}\n", rendered.trim_end_matches('\n'));
    if std::fs::read_to_string(&committed)? != expected {
        let fresh = std::env::temp_dir().join(unique("mirrorflow-rendered"));
        std::fs::write(&fresh, &expected)?;
        let diff = Command::new("diff")
            .args(["-u", path_str(&committed)?, path_str(&fresh)?])
            .output()?;
        let _ = std::fs::remove_file(&fresh);
        bail!(
            "manifests/mirrorflow.yaml is stale; run manifests/render.sh\n{}",
            String::from_utf8_lossy(&diff.stdout)
        );
    }
    Ok(())
}

#[test]
fn chart_lints_and_renders_its_variants() -> Result<()> {
    let world = World::from_env()?;
    let chart = world.repo_root.join("charts/mirrorflow");
    let chart = path_str(&chart)?;
    run("helm", &["lint", "--strict", chart])?;
    run(
        "helm",
        &[
            "lint",
            "--strict",
            chart,
            "--set",
            "replicaCount=2,watchNamespace=team-a",
        ],
    )?;

    let ha = run(
        "helm",
        &["template", "mf", chart, "--set", "replicaCount=2"],
    )?;
    assert!(
        ha.contains("kind: PodDisruptionBudget"),
        "HA gets a PDB:\n{ha}"
    );
    let single = run("helm", &["template", "mf", chart])?;
    assert!(
        !single.contains("kind: PodDisruptionBudget"),
        "one replica gets no PDB"
    );
    assert!(
        single.contains("- --leader-election\n"),
        "leader election is on by default"
    );

    let scoped = run(
        "helm",
        &["template", "mf", chart, "--set", "watchNamespace=team-a"],
    )?;
    // One watched namespace: Roles there, and one ClusterRole only, to read Nodes by name
    // (whether a replica's node still answers: replicaReplaceAfterSeconds).
    let cluster_roles: Vec<&str> = scoped
        .split("\n---")
        .filter(|d| d.contains("\nkind: ClusterRole\n"))
        .collect();
    assert_eq!(cluster_roles.len(), 1, "{cluster_roles:?}");
    assert!(
        cluster_roles[0].contains("resources: [nodes]")
            && cluster_roles[0].contains("verbs: [get]")
            && cluster_roles[0].matches("apiGroups").count() == 1,
        "the scoped install's ClusterRole reads nodes and nothing else: {}",
        cluster_roles[0]
    );
    let without_replacement = run(
        "helm",
        &[
            "template",
            "mf",
            chart,
            "--set",
            "watchNamespace=team-a",
            "--set",
            "replicaReplaceAfterSeconds=0",
        ],
    )?;
    assert!(
        !without_replacement.contains("kind: ClusterRole"),
        "one watched namespace without replacement needs no ClusterRole"
    );
    // Pods are still read by name, to say why a replica is not ready; never deleted.
    let pods_verbs = (without_replacement.split("resources: [pods]").nth(1))
        .and_then(|rest| rest.lines().nth(1))
        .map(str::trim);
    assert_eq!(
        pods_verbs,
        Some("verbs: [get]"),
        "without replacement: get on pods, no delete"
    );
    assert!(scoped.contains("- --watch-namespace=team-a\n"));

    let unsafe_ha = [
        "template",
        "mf",
        chart,
        "--set",
        "replicaCount=2,leaderElection.enabled=false",
    ];
    assert!(
        run("helm", &unsafe_ha).is_err(),
        "two replicas without leader election must not render"
    );
    assert!(
        single.contains("- --listen=$(POD_IP):8080\n") && !single.contains("kind: NetworkPolicy"),
        "metrics on the pod IP; no NetworkPolicy unless asked"
    );
    let fenced = run(
        "helm",
        &[
            "template",
            "mf",
            chart,
            "--set",
            "networkPolicy.enabled=true",
        ],
    )?;
    assert!(
        fenced.contains("kind: NetworkPolicy") && fenced.contains("ingress: []"),
        "a NetworkPolicy that admits no one by default:\n{fenced}"
    );
    let scraped = run(
        "helm",
        &[
            "template",
            "mf",
            chart,
            "--set",
            "networkPolicy.enabled=true,networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus",
        ],
    )?;
    assert!(
        scraped.contains("app: prometheus") && scraped.contains("port: http"),
        "the scrapers named are admitted to the metrics port:\n{scraped}"
    );
    let typo = ["template", "mf", chart, "--set", "replicas=2"];
    assert!(
        run("helm", &typo).is_err(),
        "values.schema.json rejects unknown values"
    );
    Ok(())
}

/// The operator pod as the chart renders it passes the `restricted` Pod Security Standard (a
/// server dry-run create in a namespace that enforces it), and the CRD is accepted as is.
#[test]
fn operator_pod_meets_restricted_pod_security() -> Result<()> {
    let world = World::from_env()?;
    let chart = world.repo_root.join("charts/mirrorflow");
    run(
        "kubectl",
        &[
            "apply",
            "--dry-run=server",
            "--server-side",
            "--force-conflicts",
            "-f",
            path_str(&chart.join("crds"))?,
        ],
    )?;

    let ns = unique("e2e-chart-psa");
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    \
             pod-security.kubernetes.io/enforce: restricted\n"
        ),
    )?;
    let result = (|| -> Result<()> {
        let template = |file: &str| {
            run(
                "helm",
                &["template", "mf", path_str(&chart)?, "-n", &ns, "-s", file],
            )
        };
        // The pod's ServiceAccount must exist for the pod to be admitted at all.
        run_with_input(
            "kubectl",
            &["apply", "-f", "-"],
            &template("templates/serviceaccount.yaml")?,
        )?;
        let deployment = template("templates/deployment.yaml")?;
        let deployment = run_with_input(
            "kubectl",
            &["create", "--dry-run=client", "-o", "json", "-f", "-"],
            &deployment,
        )?;
        let deployment: serde_json::Value = serde_json::from_str(&deployment)?;
        let template = &deployment["spec"]["template"];
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "operator-psa-check", "namespace": ns, "labels": template["metadata"]["labels"]},
            "spec": template["spec"],
        });
        run_with_input(
            "kubectl",
            &["create", "--dry-run=server", "-f", "-"],
            &pod.to_string(),
        )
        .context("the operator pod is refused by the restricted Pod Security Standard")?;
        Ok(())
    })();
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    result
}

/// One access question: verb on `group/resource[/subresource]` (named `name` if not empty) in
/// `namespace` (empty: cluster-wide).
struct Access {
    namespace: String,
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    subresource: &'static str,
    name: &'static str,
}

fn access(
    namespace: &str,
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
) -> Access {
    Access {
        namespace: namespace.into(),
        verb,
        group,
        resource,
        subresource: "",
        name: "",
    }
}

impl Access {
    fn sub(self, subresource: &'static str) -> Access {
        Access {
            subresource,
            ..self
        }
    }
    fn named(self, name: &'static str) -> Access {
        Access { name, ..self }
    }
    fn describe(&self) -> String {
        let sub = if self.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", self.subresource)
        };
        let name = if self.name.is_empty() {
            String::new()
        } else {
            format!(" {}", self.name)
        };
        let ns = if self.namespace.is_empty() {
            "(all namespaces)"
        } else {
            &self.namespace
        };
        format!(
            "{} {}.{}{sub}{name} in {ns}",
            self.verb, self.resource, self.group
        )
    }
}

/// What `kubectl auth can-i --as <sa>` asks, as a SubjectAccessReview: exact group, resource,
/// subresource and name, and no discovery (the CRD need not be installed).
fn can_i(ns: &str, sa: &str, a: &Access) -> Result<bool> {
    let review = serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": format!("system:serviceaccount:{ns}:{sa}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
            "resourceAttributes": {
                "namespace": a.namespace, "verb": a.verb, "group": a.group, "resource": a.resource,
                "subresource": a.subresource, "name": a.name,
            },
        },
    });
    let answer = run_with_input(
        "kubectl",
        &["create", "-o", "json", "-f", "-"],
        &review.to_string(),
    )?;
    let answer: serde_json::Value = serde_json::from_str(&answer)?;
    answer["status"]["allowed"]
        .as_bool()
        .context("SubjectAccessReview without status.allowed")
}

#[test]
fn installed_chart_gives_the_operator_least_privilege() -> Result<()> {
    let world = World::from_env()?;
    let chart = world.repo_root.join("charts/mirrorflow");
    let ns = unique("e2e-chart");
    let release = unique("mf");
    run(
        "helm",
        &[
            "install",
            &release,
            path_str(&chart)?,
            "-n",
            &ns,
            "--create-namespace",
            "--skip-crds",
            "--set",
            "replicaCount=0,image.repository=mirrorflow,image.tag=dev",
        ],
    )?;
    let result = check_installed(&ns, &release);
    let uninstall = run("helm", &["uninstall", &release, "-n", &ns, "--wait"]);
    run("kubectl", &["delete", "namespace", &ns, "--wait=false"])?;
    result?;
    uninstall?;
    Ok(())
}

fn check_installed(ns: &str, release: &str) -> Result<()> {
    let name = format!("{release}-mirrorflow-operator");
    let container = run(
        "kubectl",
        &[
            "get",
            "deployment",
            &name,
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.template.spec.containers[0]}",
        ],
    )?;
    let container: serde_json::Value = serde_json::from_str(&container)?;
    assert_eq!(container["image"], "mirrorflow:dev");
    let replicator_image = container["env"]
        .as_array()
        .and_then(|env| {
            env.iter()
                .find(|e| e["name"] == "MIRRORFLOW_REPLICATOR_IMAGE")
        })
        .map(|e| e["value"].clone());
    assert_eq!(
        replicator_image,
        Some("mirrorflow:dev".into()),
        "replicators default to the operator image"
    );

    let flows = format!("{ns}-flows"); // the namespace need not exist
    let f = flows.as_str();
    let allowed = [
        access("", "list", "mirrorflow.io", "mirrorflows"),
        access("", "watch", "mirrorflow.io", "mirrorflows"),
        access(f, "patch", "mirrorflow.io", "mirrorflows").sub("status"),
        access(f, "create", "apps", "statefulsets"),
        access(f, "patch", "apps", "statefulsets"),
        access(f, "delete", "apps", "statefulsets"),
        access(f, "patch", "", "configmaps"),
        access(f, "delete", "", "services"),
        access(f, "create", "policy", "poddisruptionbudgets"),
        access(f, "get", "networking.k8s.io", "networkpolicies"),
        access(f, "patch", "networking.k8s.io", "networkpolicies"),
        access(f, "delete", "networking.k8s.io", "networkpolicies"),
        access(f, "get", "", "secrets"),
        access(f, "create", "events.k8s.io", "events"),
        access(f, "patch", "", "events"),
        // Why a replica is missing: the StatefulSet controller's FailedCreate Events.
        access(f, "list", "", "events"),
        // Replicas read by name to say why they are not ready, and deleted on a lost node
        // (replicaReplaceAfterSeconds).
        access(f, "get", "", "pods"),
        access(f, "delete", "", "pods"),
        access("", "get", "", "nodes"),
        access(ns, "get", "coordination.k8s.io", "leases").named("mirrorflow-operator"),
        access(ns, "update", "coordination.k8s.io", "leases").named("mirrorflow-operator"),
        access(ns, "create", "coordination.k8s.io", "leases"),
    ];
    let forbidden = [
        access(f, "*", "*", "*"),
        access("", "delete", "", "namespaces"),
        access("", "create", "rbac.authorization.k8s.io", "clusterroles"),
        access(f, "create", "rbac.authorization.k8s.io", "rolebindings"),
        access(f, "create", "", "secrets"),
        access(f, "patch", "", "secrets"),
        access(f, "list", "", "secrets"),
        access("", "watch", "", "secrets"),
        access("", "list", "", "pods"),
        access("", "watch", "", "pods"),
        access(f, "list", "", "pods"),
        access("", "list", "", "nodes"),
        access("", "patch", "", "nodes"),
        access(f, "patch", "", "pods"),
        access(f, "patch", "mirrorflow.io", "mirrorflows"),
        access(f, "delete", "mirrorflow.io", "mirrorflows"),
        access(f, "update", "mirrorflow.io", "mirrorflows").sub("status"),
        access(f, "create", "", "pods"),
        access(f, "create", "", "pods").sub("exec"),
        access(f, "update", "apps", "statefulsets"),
        access(f, "create", "", "serviceaccounts"),
        access(ns, "get", "coordination.k8s.io", "leases").named("someone-elses-lease"),
        access(f, "create", "coordination.k8s.io", "leases"),
    ];
    let mut wrong = Vec::new();
    for (expect, cases) in [(true, &allowed[..]), (false, &forbidden[..])] {
        for case in cases {
            if can_i(ns, &name, case)? != expect {
                let answer = if expect { "denied" } else { "allowed" };
                wrong.push(format!("{}: {answer}", case.describe()));
            }
        }
    }
    // Replicator pods run as their namespace's `default` ServiceAccount without a token: they
    // read Kafka, never the apiserver, and the chart grants that account nothing.
    let replicator_forbidden = [
        access(f, "get", "", "secrets"),
        access(f, "list", "", "configmaps"),
        access(f, "get", "mirrorflow.io", "mirrorflows"),
        access(f, "patch", "mirrorflow.io", "mirrorflows").sub("status"),
        access(f, "list", "", "pods"),
        access(f, "delete", "", "pods"),
        access(f, "create", "", "events"),
        access(f, "get", "coordination.k8s.io", "leases"),
    ];
    for case in &replicator_forbidden {
        if can_i(f, "default", case)? {
            wrong.push(format!(
                "replicator (default SA): {}: allowed",
                case.describe()
            ));
        }
    }
    if !wrong.is_empty() {
        bail!("RBAC is off:\n  {}", wrong.join("\n  "));
    }
    Ok(())
}
