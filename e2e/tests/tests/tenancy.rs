//! The operator is nobody's deputy: a user who may create MirrorFlows in a namespace but may
//! not read its Secrets cannot make the operator send one to a broker of theirs. The user is a
//! real ServiceAccount with a token (`kubectl --kubeconfig` with that token), the "broker" a
//! listener this test runs on 127.0.0.1 that counts who connects.

use std::io::Read;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{condition, install_operator, wait_for_flow};
use mirrorflow_e2e::{World, run, run_with_input, unique};

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", &self.0]);
        let _ = run("kubectl", &["delete", "namespace", &self.0, "--wait=false"]);
    }
}

/// A TCP listener that counts connections and keeps the first bytes each one sent.
struct Listener {
    port: u16,
    connections: Arc<AtomicUsize>,
}

fn listen() -> Result<Listener> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = connections.clone();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            seen.fetch_add(1, Ordering::SeqCst);
            let mut conn = conn;
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 512];
            let _ = conn.read(&mut buf);
            // Dropped: the client sees a broker that hangs up, as a hostile one might.
        }
    });
    Ok(Listener { port, connections })
}

/// A kubeconfig for the ServiceAccount `sa` of `ns`, with a token from the TokenRequest API.
fn kubeconfig_for(world: &World, ns: &str, sa: &str) -> Result<std::path::PathBuf> {
    let token = run(
        "kubectl",
        &["create", "token", sa, "-n", ns, "--duration=1h"],
    )?;
    let cluster_field = |field: &str| {
        run(
            "kubectl",
            &[
                "config",
                "view",
                "--raw",
                "--minify",
                "-o",
                &format!("jsonpath={{.clusters[0].cluster.{field}}}"),
            ],
        )
    };
    let server = cluster_field("server")?;
    let ca = cluster_field("certificate-authority-data")?;
    let path = world
        .kubeconfig
        .with_file_name(format!("{ns}-{sa}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: w, cluster: {{server: \"{}\", certificate-authority-data: \"{}\"}}}}]\nusers: [{{name: {sa}, user: {{token: \"{}\"}}}}]\ncontexts: [{{name: c, context: {{cluster: w, user: {sa}, namespace: {ns}}}}}]\ncurrent-context: c\n",
            server.trim(),
            ca.trim(),
            token.trim()
        ),
    )?;
    Ok(path)
}

#[tokio::test]
async fn a_flow_author_cannot_have_the_operator_send_a_secret_to_their_broker() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-tenant");
    let _cleanup = Cleanup(ns.clone());
    install_operator(&world, &ns)?;

    // The victim's credentials, which the author may not read.
    run(
        "kubectl",
        &[
            "create",
            "secret",
            "generic",
            "victim",
            "-n",
            &ns,
            "--from-literal=username=svc-payments",
            "--from-literal=password=never-sent-4c1d",
        ],
    )?;
    // The author: MirrorFlows yes, Secrets no.
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: author, namespace: {ns}}}\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: flow-author, namespace: {ns}}}\n\
             rules: [{{apiGroups: [mirrorflow.io], resources: [mirrorflows], verbs: [get, list, watch, create, patch, update, delete]}}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: flow-author, namespace: {ns}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: flow-author}}\n\
             subjects: [{{kind: ServiceAccount, name: author, namespace: {ns}}}]\n"
        ),
    )?;
    let author = kubeconfig_for(&world, &ns, "author")?;
    let author = author.to_str().context("kubeconfig path")?;
    let denied = run(
        "kubectl",
        &["--kubeconfig", author, "get", "secret", "victim", "-n", &ns],
    );
    ensure!(
        denied
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("Forbidden")),
        "the author can read the Secret: {denied:?}"
    );

    let broker = listen()?;
    let flow = format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: borrow, namespace: {ns}}}\nspec:\n  source:\n    alias: attacker\n    bootstrapServers: \"127.0.0.1:{}\"\n    sasl: {{mechanism: PLAIN, usernameSecretRef: {{name: victim, key: username}}, passwordSecretRef: {{name: victim, key: password}}}}\n  target: {{alias: tgt, bootstrapServers: \"{}\"}}\n",
        broker.port, world.target_bootstrap
    );
    run_with_input(
        "kubectl",
        &["--kubeconfig", author, "apply", "-f", "-"],
        &flow,
    )?;

    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    let mf = wait_for_flow(
        &flows,
        "borrow",
        "SecretNotShared",
        Duration::from_secs(20),
        |mf| condition(mf, "Ready").is_some_and(|c| c.1 == "SecretNotShared"),
    )
    .await?;
    let (_, _, message) = condition(&mf, "Ready").context("Ready")?;
    ensure!(
        message.contains("spec.source.sasl.usernameSecretRef")
            && message.contains("kubectl annotate secret victim"),
        "{message}"
    );
    ensure!(
        !message.contains("never-sent"),
        "the Secret's value is in the status"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let refused = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .any(|e| e.reason.as_deref() == Some("SecretNotShared"));
    ensure!(refused, "no SecretNotShared event");
    // The verdict came before any connection, and no replicator (which would mount the Secret)
    // was made.
    ensure!(
        broker.connections.load(Ordering::SeqCst) == 0,
        "the operator connected to the author's broker"
    );
    let stses: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    ensure!(
        stses.get_opt("borrow").await?.is_none(),
        "a StatefulSet was made"
    );

    // Once the Secret's owner allows this flow, it is used: the same listener now sees the
    // operator's probe. (This is what an unguarded operator did at once.)
    run(
        "kubectl",
        &[
            "annotate",
            "secret",
            "victim",
            "-n",
            &ns,
            "mirrorflow.io/allowed-flows=borrow",
        ],
    )?;
    // Editing the flow starts a reconcile at once (the Secret is not watched).
    let touch = |n: u32| {
        run(
            "kubectl",
            &[
                "--kubeconfig",
                author,
                "annotate",
                "mf",
                "borrow",
                "-n",
                &ns,
                "--overwrite",
                &format!("touched={n}"),
            ],
        )
    };
    touch(1)?;
    // Opting in the flow is not enough: the Secret names where it may go, and the author's
    // listener is not among those places (the owner named the world's real source only).
    let refused_for = |needle: &'static str| {
        let flows = flows.clone();
        async move {
            wait_for_flow(&flows, "borrow", needle, Duration::from_secs(30), |mf| {
                condition(mf, "Ready")
                    .is_some_and(|c| c.1 == "SecretNotShared" && c.2.contains(needle))
            })
            .await
        }
    };
    refused_for("names no place its value may be sent to").await?;
    // What the Secret's owner says, one annotation at a time.
    let owner_says = |annotation: String| {
        run(
            "kubectl",
            &[
                "annotate",
                "secret",
                "victim",
                "-n",
                &ns,
                "--overwrite",
                &annotation,
            ],
        )
    };
    owner_says(format!(
        "mirrorflow.io/allowed-destinations={}",
        world.source_bootstrap
    ))?;
    touch(2)?;
    refused_for("may be sent only to").await?;
    ensure!(
        broker.connections.load(Ordering::SeqCst) == 0,
        "the operator sent the Secret to a destination its owner did not name"
    );
    // Named, but plaintext: still refused until the owner allows plaintext too.
    owner_says(format!(
        "mirrorflow.io/allowed-destinations=127.0.0.1:{}",
        broker.port
    ))?;
    touch(3)?;
    refused_for("unencrypted").await?;
    ensure!(
        broker.connections.load(Ordering::SeqCst) == 0,
        "the operator sent a PLAIN password over plaintext without the owner's word"
    );
    owner_says("mirrorflow.io/allow-plaintext=true".to_string())?;
    touch(4)?;
    mirrorflow_e2e::eventually(
        "the probe to reach the listener",
        Duration::from_secs(60),
        || async { Ok((broker.connections.load(Ordering::SeqCst) > 0).then_some(())) },
    )
    .await?;
    println!(
        "deputy attack: refused with SecretNotShared and 0 connections (not opted in; opted in without destinations; another destination; plaintext); after the owner named this listener and allowed plaintext {} connections",
        broker.connections.load(Ordering::SeqCst)
    );
    Ok(())
}

/// One tenant's flows whose broker accepts connections and never answers cost at most one
/// running probe each; a healthy flow served by the same operator keeps a status that follows
/// its clusters.
#[tokio::test]
async fn a_stalled_broker_stalls_no_other_flow() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-stall");
    let _cleanup = Cleanup(ns.clone());
    install_operator(&world, &ns)?;
    let silent = listen()?;
    let stalled: Vec<String> = (0..4).map(|i| format!("stalled-{i}")).collect();
    for name in &stalled {
        run_with_input(
            "kubectl",
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  mode: Observe\n  source: {{alias: {name}, bootstrapServers: \"127.0.0.1:{}\"}}\n  target: {{alias: tgt, bootstrapServers: \"{}\"}}\n",
                silent.port, world.target_bootstrap
            ),
        )?;
    }
    let prefix = unique("stall-topic");
    mirrorflow_e2e::kafka::create_topic(&world.source_bootstrap, &format!("{prefix}-0"), 1).await?;
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: healthy, namespace: {ns}}}\nspec:\n  mode: Observe\n  source: {{alias: healthy-src, bootstrapServers: \"{}\"}}\n  target: {{alias: tgt, bootstrapServers: \"{}\"}}\n  topics: [\"{prefix}-.*\"]\n",
            world.source_bootstrap, world.target_bootstrap
        ),
    )?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    for name in &stalled {
        wait_for_flow(
            &flows,
            name,
            "SourceUnreachable or SourceNotKafka",
            Duration::from_secs(30),
            // The listener accepts, reads for 2 s and hangs up: no answer, or (once the
            // diagnosis has looked) not a Kafka broker.
            |mf| {
                condition(mf, "Ready")
                    .is_some_and(|c| c.1 == "SourceUnreachable" || c.1 == "SourceNotKafka")
            },
        )
        .await?;
    }
    let topics =
        |n: i32| move |mf: &MirrorFlow| mf.status.as_ref().and_then(|s| s.topics) == Some(n);
    // Its topic, plus the source's heartbeats topic (always mirrored) when other flows made one.
    let first = wait_for_flow(
        &flows,
        "healthy",
        "a topic count",
        Duration::from_secs(30),
        |mf| {
            mf.status
                .as_ref()
                .and_then(|s| s.topics)
                .is_some_and(|n| n >= 1)
        },
    )
    .await?;
    let base = first.status.and_then(|s| s.topics).unwrap_or(1);
    // The healthy flow keeps following its source while the stalled ones keep failing.
    for n in 1..=2 {
        let t0 = std::time::Instant::now();
        mirrorflow_e2e::kafka::create_topic(&world.source_bootstrap, &format!("{prefix}-{n}"), 1)
            .await?;
        let want = base + n;
        wait_for_flow(
            &flows,
            "healthy",
            &format!("{want} topics"),
            Duration::from_secs(30),
            topics(want),
        )
        .await?;
        println!(
            "healthy flow saw new topic {n} after {:.1} s",
            t0.elapsed().as_secs_f64()
        );
    }
    println!(
        "stalled listener: {} connections from 4 flows",
        silent.connections.load(Ordering::SeqCst)
    );
    Ok(())
}

/// A ServiceAccount of `ns` that may create, edit and delete MirrorFlows and nothing else, and
/// a kubeconfig with its token.
fn flow_author(world: &World, ns: &str, sa: &str) -> Result<std::path::PathBuf> {
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {sa}, namespace: {ns}}}\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: {sa}, namespace: {ns}}}\n\
             rules: [{{apiGroups: [mirrorflow.io], resources: [mirrorflows], verbs: [get, list, watch, create, patch, update, delete]}}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {sa}, namespace: {ns}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {sa}}}\n\
             subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {ns}}}]\n"
        ),
    )?;
    kubeconfig_for(world, ns, sa)
}

/// Two tenants of one operator, each with a real token that may write MirrorFlows only. The
/// later tenant tries what the audit found: a flow the other way (Observe, then Replicate) to
/// stop the older tenant's running Identity flow, a flow named after an object of someone else
/// to take it over, and pod annotations that would take the pods out of a mesh. None of it
/// changes the older flow or the foreign object; each attempt is answered on the attacker's
/// own flow.
#[tokio::test]
async fn a_later_tenant_changes_nothing_of_an_older_one() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-tenants");
    let _cleanup = Cleanup(ns.clone());
    install_operator(&world, &ns)?;
    let alice = flow_author(&world, &ns, "alice")?;
    let mallory = flow_author(&world, &ns, "mallory")?;
    let (alice, mallory) = (
        alice.to_str().context("kubeconfig path")?.to_string(),
        mallory.to_str().context("kubeconfig path")?.to_string(),
    );
    let apply_as = |kubeconfig: &str, yaml: String| {
        run_with_input(
            "kubectl",
            &["--kubeconfig", kubeconfig, "apply", "-f", "-"],
            &yaml,
        )
    };
    let (s, t) = (&world.source_bootstrap, &world.target_bootstrap);
    let flow = |name: &str, src: &str, tgt: &str, extra: &str| {
        format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  source: {{alias: {name}-s, bootstrapServers: \"{src}\"}}\n  target: {{alias: {name}-t, bootstrapServers: \"{tgt}\"}}\n  topics: [\"none-such-{name}\"]\n{extra}"
        )
    };
    // Alice's flow, running (it copies nothing: no topic matches).
    apply_as(
        &alice,
        flow("alice", s, t, "  replicationPolicy: {type: Identity}\n"),
    )?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    let stses: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    mirrorflow_e2e::eventually("alice's replicators", Duration::from_secs(120), || async {
        Ok(stses.get_opt("alice").await?.map(|_| ()))
    })
    .await?;
    // Something of the namespace's owner that Mallory may not touch: a PDB named `app`.
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: app, namespace: {ns}}}\nspec:\n  maxUnavailable: 2\n  selector: {{matchLabels: {{app: payments}}}}\n"
        ),
    )?;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // Mallory, later: back the other way (Observe, then Replicate), a flow named `app`, and a
    // flow whose pods would leave the mesh.
    apply_as(&mallory, flow("watch", t, s, "  mode: Observe\n"))?;
    apply_as(&mallory, flow("back", t, s, ""))?;
    apply_as(&mallory, flow("app", s, t, ""))?;
    apply_as(
        &mallory,
        flow(
            "nomesh",
            s,
            t,
            "  pod: {annotations: {sidecar.istio.io/inject: \"false\"}}\n",
        ),
    )?;
    let answered = |name: &'static str, reason: &'static str| {
        let flows = flows.clone();
        async move {
            wait_for_flow(&flows, name, reason, Duration::from_secs(90), |mf| {
                condition(mf, "Ready").is_some_and(|c| c.1 == reason)
            })
            .await
        }
    };
    let back = answered("back", "ReplicationLoop").await?;
    answered("app", "ChildConflict").await?;
    answered("nomesh", "PodMetadataNotAllowed").await?;
    answered("watch", "Observing").await?;
    let (_, _, message) = condition(&back, "Ready").context("Ready")?;
    ensure!(message.contains("spec.replicationPolicy.type"), "{message}");

    // Alice's flow ran on throughout: its StatefulSet is the one it had, and its conditions
    // never carried a verdict about another flow.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let mf = flows.get("alice").await?;
    let (_, reason, message) = condition(&mf, "Ready").context("Ready")?;
    ensure!(
        !["ReplicationLoop", "ConflictingFlow", "InvalidSpec"].contains(&reason.as_str()),
        "alice's flow was stopped by a later one: {reason}: {message}"
    );
    ensure!(
        stses.get_opt("alice").await?.is_some(),
        "alice's StatefulSet is gone"
    );
    // The PDB is the owner's as it was: no owner reference, its own selector and budget.
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(client.clone(), &ns);
    let pdb = pdbs.get("app").await?;
    let spec = pdb.spec.context("PDB spec")?;
    ensure!(
        pdb.metadata.owner_references.unwrap_or_default().is_empty()
            && spec.max_unavailable
                == Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2))
            && spec
                .selector
                .and_then(|s| s.match_labels)
                .is_some_and(|l| l.get("app").map(String::as_str) == Some("payments")),
        "the PDB was taken over"
    );
    // Mallory's refused flows run nothing.
    for name in ["back", "app", "nomesh"] {
        ensure!(
            stses.get_opt(name).await?.is_none(),
            "{name}: a StatefulSet was made"
        );
    }
    // Deleting the flow named `app` leaves the PDB.
    run(
        "kubectl",
        &["--kubeconfig", &mallory, "delete", "mf", "app", "-n", &ns],
    )?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    ensure!(
        pdbs.get_opt("app").await?.is_some(),
        "deleting the flow deleted the PDB"
    );
    println!(
        "two tenants: the later one's reverse Replicate flow got ReplicationLoop, its Observe flow ran, `app` got ChildConflict, pod annotations PodMetadataNotAllowed; the older flow and the PDB unchanged"
    );
    Ok(())
}
