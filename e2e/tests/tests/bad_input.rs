//! The bad-input catalogue: malformed or dangerous MirrorFlows and flow files. Each is refused
//! by the apiserver with the field named, or gets a condition (and an event) whose message
//! names the field and the fix, or makes `mirrorflow replicate` exit with such a message.
//! Wrong credentials and a wrong CA are in `security.rs`. At the end the operator's reconcile
//! rate over the broken flows is measured: bounded, no hot loop.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::ListParams;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{condition, install_operator_with, wait_for_flow};
use mirrorflow_e2e::replicator::http_get;
use mirrorflow_e2e::{World, run, run_with_input, unique};

/// A repository of the world's registry that does not exist (the registry's address from the
/// world's environment).
fn unpullable_prefix() -> String {
    let registry = std::env::var("MF_REGISTRY").unwrap_or_else(|_| "127.0.0.1:15000".into());
    format!("{registry}/nowhere/")
}

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", &self.0]);
        let _ = run("kubectl", &["delete", "namespace", &self.0, "--wait=false"]);
    }
}

/// A flow with valid clusters; `spec` lines are appended (2-space indented under `spec:`).
fn resource(ns: &str, name: &str, world: &World, spec: &str) -> String {
    format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  source: {{alias: src, bootstrapServers: \"{}\"}}\n  target: {{alias: tgt, bootstrapServers: \"{}\"}}\n{spec}",
        world.source_bootstrap, world.target_bootstrap
    )
}

/// Refused by the apiserver (schema, CEL, strict field validation): (case, spec lines or a
/// whole replacement, text the error must contain).
fn refused_cases() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![
        (
            "same alias twice",
            "REPLACE:  source: {alias: same, bootstrapServers: \"a:1\"}\n  target: {alias: same, bootstrapServers: \"b:1\"}\n",
            "spec.target.alias",
        ),
        (
            "alias with a dot",
            "REPLACE:  source: {alias: my.dc, bootstrapServers: \"a:1\"}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "spec.source.alias",
        ),
        (
            "empty bootstrap servers",
            "REPLACE:  source: {alias: a, bootstrapServers: \"\"}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "spec.source.bootstrapServers",
        ),
        (
            "no target",
            "REPLACE:  source: {alias: a, bootstrapServers: \"a:1\"}\n",
            "spec.target",
        ),
        ("replicas 0", "  replicas: 0\n", "spec.replicas"),
        ("replicas 10000", "  replicas: 10000\n", "spec.replicas"),
        (
            "negative interval",
            "  heartbeats: {interval: \"-5s\"}\n",
            "spec.heartbeats.interval",
        ),
        (
            "interval that is not a duration",
            "  checkpoints: {interval: fast}\n",
            "spec.checkpoints.interval",
        ),
        (
            "interval too short",
            "  sourceLoop: {offsetSyncInterval: 1ms}\n",
            "spec.sourceLoop.offsetSyncInterval",
        ),
        (
            "absurd interval",
            "  heartbeats: {interval: 5000h}\n",
            "spec.heartbeats.interval",
        ),
        (
            "absurd checkpoint age limit",
            "  failoverReadiness: {maxCheckpointAge: 9999h}\n",
            "spec.failoverReadiness.maxCheckpointAge",
        ),
        (
            "negative replication lag limit",
            "  failoverReadiness: {maxReplicationLag: -1}\n",
            "spec.failoverReadiness.maxReplicationLag",
        ),
        (
            "unknown field",
            "  heartbeat: {interval: 1s}\n",
            "unknown field \"spec.heartbeat\"",
        ),
        (
            "separator with Identity",
            "  replicationPolicy: {type: Identity, separator: _}\n",
            "spec.replicationPolicy",
        ),
        (
            "unknown policy type",
            "  replicationPolicy: {type: Mirror}\n",
            "spec.replicationPolicy.type",
        ),
        (
            "unknown SASL mechanism",
            "REPLACE:  source:\n    alias: a\n    bootstrapServers: \"a:1\"\n    sasl: {mechanism: SCRAM-SHA-1, usernameSecretRef: {name: s, key: u}, passwordSecretRef: {name: s, key: p}}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "spec.source.sasl.mechanism",
        ),
        (
            "OAUTHBEARER over plain http to a remote token endpoint",
            "REPLACE:  source:\n    alias: a\n    bootstrapServers: \"a:1\"\n    sasl: {mechanism: OAUTHBEARER, oauthbearer: {tokenEndpointUrl: \"http://idp.example.com/token\", clientId: c, clientSecretSecretRef: {name: s, key: k}}}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "spec.source.sasl.oauthbearer.tokenEndpointUrl",
        ),
        (
            "OAUTHBEARER without its client",
            "REPLACE:  source:\n    alias: a\n    bootstrapServers: \"a:1\"\n    sasl: {mechanism: OAUTHBEARER}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "mechanism OAUTHBEARER needs oauthbearer",
        ),
        (
            "replication factor 100",
            "  sourceLoop: {replicationFactor: 100}\n",
            "spec.sourceLoop.replicationFactor",
        ),
        (
            "unknown offset syncs location",
            "  sourceLoop: {offsetSyncsLocation: Moon}\n",
            "spec.sourceLoop.offsetSyncsLocation",
        ),
        ("unknown mode", "  mode: Mirror\n", "spec.mode"),
        (
            "bootstrap server without a port",
            "REPLACE:  source: {alias: a, bootstrapServers: \"kafka\"}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "spec.source.bootstrapServers",
        ),
        (
            "bootstrap port out of range",
            "REPLACE:  source: {alias: a, bootstrapServers: \"a:1\"}\n  target: {alias: b, bootstrapServers: \"b:1,c:70000\"}\n",
            "spec.target.bootstrapServers",
        ),
        (
            "bootstrap servers with spaces",
            "REPLACE:  source: {alias: a, bootstrapServers: \"a:1, a2:1\"}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "spec.source.bootstrapServers",
        ),
        (
            "bootstrap server without a host",
            "REPLACE:  source: {alias: a, bootstrapServers: \":9092\"}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "spec.source.bootstrapServers",
        ),
        (
            "Secret name with a slash",
            "REPLACE:  source:\n    alias: a\n    bootstrapServers: \"a:1\"\n    sasl: {mechanism: PLAIN, usernameSecretRef: {name: s/status, key: u}, passwordSecretRef: {name: s, key: p}}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "spec.source.sasl.usernameSecretRef.name",
        ),
        (
            "Secret key that leaves its folder",
            "REPLACE:  source:\n    alias: a\n    bootstrapServers: \"a:1\"\n    sasl: {mechanism: PLAIN, usernameSecretRef: {name: s, key: u}, passwordSecretRef: {name: s, key: ../../etc/passwd}}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "spec.source.sasl.passwordSecretRef.key",
        ),
        (
            "CA Secret key '..'",
            "REPLACE:  source:\n    alias: a\n    bootstrapServers: \"a:1\"\n    tls: {caSecretRef: {name: ca, key: \"..\"}}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n",
            "spec.source.tls.caSecretRef.key",
        ),
        (
            "source alias containing the separator",
            "REPLACE:  source: {alias: us-east, bootstrapServers: \"a:1\"}\n  target: {alias: b, bootstrapServers: \"b:1\"}\n  replicationPolicy: {separator: \"-\"}\n",
            "spec.source.alias",
        ),
        (
            "target alias containing the separator",
            "REPLACE:  source: {alias: a, bootstrapServers: \"a:1\"}\n  target: {alias: eu_west, bootstrapServers: \"b:1\"}\n  replicationPolicy: {separator: _}\n",
            "replicationPolicy.separator",
        ),
        (
            "separator that cannot be in a topic name",
            "  replicationPolicy: {separator: \"/\"}\n",
            "spec.replicationPolicy.separator",
        ),
    ]
}

/// Accepted by the apiserver, refused by the operator: (name, spec lines, reason, text the
/// Ready condition's message must contain).
fn condition_cases() -> Vec<(&'static str, String, &'static str, &'static str)> {
    vec![
        (
            "bad-topic-regex",
            "  topics: [\"orders[\"]\n".into(),
            "InvalidSpec",
            "spec.topics",
        ),
        (
            "remote-names-too-long",
            "  topics: [\"events-[a-z]{240}\"]\n".into(),
            "InvalidSpec",
            "spec.topics",
        ),
        (
            "bad-exclude-regex",
            "  topicsExclude: [\"(unclosed\"]\n".into(),
            "InvalidSpec",
            "spec.topicsExclude",
        ),
        (
            "bad-group-regex",
            "  groups: [\"*app\"]\n".into(),
            "InvalidSpec",
            "spec.groups",
        ),
        (
            "internal-topics-only",
            "  topics: [\"__.*\"]\n".into(),
            "InvalidSpec",
            "spec.topics",
        ),
        (
            "secret-in-config",
            "REPLACE_SOURCE_CONFIG".into(),
            "InvalidSpec",
            "spec.source.config",
        ),
        (
            "exactly-once-syncs-on-source",
            "  exactlyOnce: true\n".into(),
            "InvalidSpec",
            "spec.sourceLoop.offsetSyncsLocation",
        ),
        (
            "missing-secret",
            "REPLACE_SASL:nope".into(),
            "SecretMissing",
            "spec.source.sasl.usernameSecretRef",
        ),
        (
            "missing-secret-key",
            "REPLACE_SASL:partial".into(),
            "SecretMissing",
            "has no key",
        ),
        (
            "unreachable-source",
            "REPLACE_UNREACHABLE".into(),
            "SourceUnreachable",
            "spec.source.bootstrapServers",
        ),
        (
            "config-plugin",
            "REPLACE_SOURCE_CONFIG:plugin.library.paths: /tmp/x.so".into(),
            "InvalidSpec",
            "spec.source.config.plugin.library.paths",
        ),
        (
            "config-file-location",
            "REPLACE_SOURCE_CONFIG:ssl.ca.location: /etc/shadow".into(),
            "InvalidSpec",
            "spec.source.config.ssl.ca.location",
        ),
        (
            "config-bootstrap",
            "REPLACE_SOURCE_CONFIG:bootstrap.servers: 'x:1'".into(),
            "InvalidSpec",
            "spec.source.bootstrapServers",
        ),
        (
            "config-huge-buffer",
            "REPLACE_SOURCE_CONFIG:queued.max.messages.kbytes: '2097151'".into(),
            "InvalidSpec",
            "spec.source.config.queued.max.messages.kbytes",
        ),
        (
            "config-banana",
            "REPLACE_SOURCE_CONFIG:fetch.wait.max.ms: banana".into(),
            "InvalidClientConfig",
            "spec.source.config.fetch.wait.max.ms",
        ),
        (
            "same-cluster",
            "REPLACE_SAME_CLUSTER".into(),
            "SameCluster",
            "spec.target.bootstrapServers",
        ),
        (
            "conflicting-flow",
            "REPLACE_CONFLICT".into(),
            "ConflictingFlow",
            "conflict-older",
        ),
        (
            "image-not-allowed",
            "  pod: {image: \"registry.example.invalid/miner:1\"}\n".into(),
            "ImageNotAllowed",
            "spec.pod.image",
        ),
        // An allowed registry (the test's install allows it) without that image: the pod
        // is created and the kubelet cannot pull it.
        (
            "image-not-pullable",
            format!(
                "  pod: {{image: \"{}mirrorflow:0.0.0\"}}\n",
                unpullable_prefix()
            ),
            "ReplicatorImageUnavailable",
            "spec.pod.image",
        ),
        // A node selector no node matches: the pod is created and never scheduled.
        (
            "no-node-matches",
            "  pod: {nodeSelector: {mirrorflow.io/nowhere: \"x\"}}\n".into(),
            "ReplicatorUnschedulable",
            "spec.pod.nodeSelector",
        ),
        (
            "bad-pod-label",
            "  pod: {labels: {\"bad key!\": x}}\n".into(),
            "PodMetadataNotAllowed",
            "spec.pod.labels",
        ),
        (
            "bad-pod-annotation",
            "  pod: {annotations: {\"sidecar.istio.io/inject\": \"false\"}}\n".into(),
            "PodMetadataNotAllowed",
            "spec.pod.annotations",
        ),
        (
            "limits-below-requests",
            "  resources: {requests: {cpu: \"2\"}, limits: {cpu: \"1\"}}\n".into(),
            "ResourcesNotAllowed",
            "spec.resources.requests.cpu",
        ),
        (
            "resources-above-the-installers-maximum",
            "  resources: {requests: {memory: 1Gi}, limits: {cpu: \"1\", memory: 64Gi}}\n".into(),
            "ResourcesNotAllowed",
            "spec.resources.limits.memory",
        ),
        (
            "source-at-a-denied-address",
            "REPLACE_DENIED_SOURCE".into(),
            "AddressNotAllowed",
            "spec.source.bootstrapServers",
        ),
        (
            "bad-toleration",
            "  pod: {tolerations: [{key: a, operator: Exists, value: x}]}\n".into(),
            "ChildRejected",
            "spec.pod.tolerations",
        ),
        (
            "identity-back",
            "REPLACE_REVERSE".into(),
            "ReplicationLoop",
            "spec.replicationPolicy.type",
        ),
        (
            "topic-in-both-lists",
            "  topics: [\"orders\"]\n  topicsExclude: [\"orders\"]\n".into(),
            "InvalidSpec",
            "spec.topicsExclude",
        ),
        (
            "groups-emptied-by-excludes",
            "  groups: [\"app-1\"]\n  groupsExclude: [\"app-.*\"]\n".into(),
            "InvalidSpec",
            "spec.groupsExclude",
        ),
        (
            "password-too-large",
            "REPLACE_SASL:huge".into(),
            "SecretValueTooLarge",
            "Secret 'huge' key 'password'",
        ),
        (
            "tls-on-plaintext-listener",
            "REPLACE_SOURCE_EXTRA:tls: {}".into(),
            "SourceSecurityMismatch",
            "spec.source.tls",
        ),
        (
            "http-server-as-bootstrap",
            "REPLACE_HTTP_SOURCE".into(),
            "SourceNotKafka",
            "spec.source.bootstrapServers",
        ),
    ]
}

/// The source alias of the flow into its own source cluster: unique, so the test can tell that
/// no topic of that flow appeared on the cluster.
fn self_alias(ns: &str) -> String {
    format!("self-{}", ns.rsplit('-').next().unwrap_or("x"))
}

fn condition_yaml(ns: &str, name: &str, world: &World, spec: &str) -> String {
    let flow = |alias: &str, src: &str, tgt: &str, extra_src: &str| {
        format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  source:\n    alias: {alias}\n    bootstrapServers: \"{src}\"\n{extra_src}  target: {{alias: tgt, bootstrapServers: \"{tgt}\"}}\n"
        )
    };
    // Each case its own source alias: flows with one alias into one target would conflict.
    let clusters = |src: &str, tgt: &str, extra_src: &str| flow(name, src, tgt, extra_src);
    let (s, t) = (&world.source_bootstrap, &world.target_bootstrap);
    match spec {
        // Another name for the source cluster: only the cluster id tells they are one.
        "REPLACE_SAME_CLUSTER" => {
            flow(&self_alias(ns), s, &s.replace("127.0.0.1", "localhost"), "")
        }
        // The same source alias into the same target as `conflict-older`, created before.
        "REPLACE_CONFLICT" => format!("{}  topics: [\"none-such\"]\n", flow("dup", s, t, "")),
        "REPLACE_UNREACHABLE" => flow("unreach", "127.0.0.1:1", t, ""),
        // The cloud metadata address, which the test's operator denies (probeAddresses.deny).
        "REPLACE_DENIED_SOURCE" => flow("denied", "169.254.169.254:9092", t, ""),
        "REPLACE_SOURCE_CONFIG" => clusters(s, t, "    config: {sasl.password: hunter2}\n"),
        c if c.starts_with("REPLACE_SOURCE_EXTRA:") => clusters(
            s,
            t,
            &format!("    {}\n", &c["REPLACE_SOURCE_EXTRA:".len()..]),
        ),
        // The world's token endpoint: an HTTP server where a broker should be.
        "REPLACE_HTTP_SOURCE" => {
            let oidc = std::env::var("MF_OIDC_URL").unwrap_or_default();
            let http = oidc.trim_start_matches("http://").trim_end_matches('/');
            clusters(http, t, "")
        }
        c if c.starts_with("REPLACE_SOURCE_CONFIG:") => {
            let property = &c["REPLACE_SOURCE_CONFIG:".len()..];
            clusters(s, t, &format!("    config: {{{property}}}\n"))
        }
        "REPLACE_REVERSE" => {
            format!(
                "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  source: {{alias: tgt, bootstrapServers: \"{t}\"}}\n  target: {{alias: src, bootstrapServers: \"{s}\"}}\n  replicationPolicy: {{type: Identity}}\n"
            )
        }
        sasl if sasl.starts_with("REPLACE_SASL:") => {
            let secret = &sasl["REPLACE_SASL:".len()..];
            clusters(
                s,
                t,
                &format!(
                    "    sasl: {{mechanism: PLAIN, usernameSecretRef: {{name: {secret}, key: username}}, passwordSecretRef: {{name: {secret}, key: password}}}}\n"
                ),
            )
        }
        lines => format!("{}{lines}", clusters(s, t, "")),
    }
}

#[tokio::test]
async fn every_bad_flow_is_refused_or_named_and_the_operator_stays_calm() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-bad");
    let _cleanup = Cleanup(ns.clone());
    install_operator_with(
        &world,
        &ns,
        &[
            "probeAddresses.deny={169.254.169.254/32}",
            &format!("allowedImagePrefixes={{{}}}", unpullable_prefix()),
        ],
    )?;

    // 1. The apiserver refuses these outright (server-side dry run: nothing is stored).
    let mut table = Vec::new();
    for (i, (case, spec, field)) in refused_cases().into_iter().enumerate() {
        let yaml = match spec.strip_prefix("REPLACE:") {
            Some(clusters) => format!(
                "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: refused-{i}, namespace: {ns}}}\nspec:\n{clusters}"
            ),
            None => resource(&ns, &format!("refused-{i}"), &world, spec),
        };
        let out = run_with_input(
            "kubectl",
            &["apply", "--dry-run=server", "--validate=strict", "-f", "-"],
            &yaml,
        );
        let err = match out {
            Ok(o) => bail!("{case}: accepted by the apiserver: {o}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            err.contains(field),
            "{case}: the error does not name {field}: {err}"
        );
        table.push(format!("| {case} | refused by the apiserver | `{field}` |"));
    }

    // A name too long for the objects derived from it (pods' revision-hash label).
    let long = resource(
        &ns,
        "a-flow-whose-name-is-too-long-for-the-objects-derived-from-i",
        &world,
        "",
    );
    let err = run_with_input("kubectl", &["apply", "--dry-run=server", "-f", "-"], &long)
        .expect_err("the apiserver refuses a 60-character flow name");
    assert!(
        format!("{err:#}").contains("metadata.name: a MirrorFlow's name has at most 52"),
        "{err:#}"
    );
    table.push("| name of 60 characters | refused by the apiserver | `metadata.name` |".into());

    // An alias cannot change once set.
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &resource(&ns, "renamed", &world, "  topics: [\"none-such\"]\n"),
    )?;
    let renamed = resource(&ns, "renamed", &world, "  topics: [\"none-such\"]\n")
        .replace("alias: src", "alias: src2");
    let err = run_with_input(
        "kubectl",
        &["apply", "--dry-run=server", "-f", "-"],
        &renamed,
    )
    .expect_err("the apiserver refuses an alias change");
    assert!(
        format!("{err:#}").contains("the alias cannot change"),
        "{err:#}"
    );
    table.push(
        "| alias changed after creation | refused by the apiserver | `spec.source.alias` |".into(),
    );

    // 2. The operator refuses these with a condition and an event naming the field.
    run(
        "kubectl",
        &[
            "create",
            "secret",
            "generic",
            "partial",
            "-n",
            &ns,
            "--from-literal=username=u",
        ],
    )?;
    run(
        "kubectl",
        &[
            "annotate",
            "secret",
            "partial",
            "-n",
            &ns,
            "mirrorflow.io/allowed-flows=*",
            "mirrorflow.io/allowed-destinations=127.0.0.1,localhost",
            "mirrorflow.io/allow-plaintext=true",
        ],
    )?;
    // A password far larger than any password: refused before it is sent.
    let huge = "p".repeat(5000);
    run(
        "kubectl",
        &[
            "create",
            "secret",
            "generic",
            "huge",
            "-n",
            &ns,
            "--from-literal=username=u",
            &format!("--from-literal=password={huge}"),
        ],
    )?;
    run(
        "kubectl",
        &[
            "annotate",
            "secret",
            "huge",
            "-n",
            &ns,
            "mirrorflow.io/allowed-flows=*",
            "mirrorflow.io/allowed-destinations=127.0.0.1,localhost",
            "mirrorflow.io/allow-plaintext=true",
        ],
    )?;
    // The older of two flows sharing internal topics: valid, and left running.
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: conflict-older, namespace: {ns}}}\nspec:\n  source: {{alias: dup, bootstrapServers: \"{}\"}}\n  target: {{alias: tgt, bootstrapServers: \"{}\"}}\n  topics: [\"none-such\"]\n",
            world.source_bootstrap, world.target_bootstrap
        ),
    )?;
    // The older of two flows copying back and forth with Identity: valid, and left running
    // (it copies nothing: no topic matches).
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: identity-there, namespace: {ns}}}\nspec:\n  source: {{alias: idsrc, bootstrapServers: \"{}\"}}\n  target: {{alias: tgt, bootstrapServers: \"{}\"}}\n  replicationPolicy: {{type: Identity}}\n  topics: [\"none-such-identity\"]\n",
            world.source_bootstrap, world.target_bootstrap
        ),
    )?;
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    // Older means seen first: the newer flows are applied once the operator has seen these,
    // a second later at least (creation times have seconds).
    for older in ["conflict-older", "identity-there"] {
        wait_for_flow(&flows, older, "a status", Duration::from_secs(60), |mf| {
            mf.status.is_some()
        })
        .await?;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let cases = condition_cases();
    for (name, spec, _, _) in &cases {
        run_with_input(
            "kubectl",
            &["apply", "-f", "-"],
            &condition_yaml(&ns, name, &world, spec),
        )?;
    }
    let applied = Instant::now();
    for (name, _, reason, text) in &cases {
        let mf = wait_for_flow(&flows, name, reason, Duration::from_secs(120), |mf| {
            condition(mf, "Ready").is_some_and(|c| c.1 == *reason)
        })
        .await?;
        let (_, _, message) = condition(&mf, "Ready").context("Ready")?;
        assert!(
            message.contains(text),
            "{name}: the condition does not name {text}: {message}"
        );
        table.push(format!("| {name} | condition `{reason}` | {message} |"));
    }
    println!(
        "every condition case answered {:.1} s after the last was applied",
        applied.elapsed().as_secs_f64()
    );
    // The later flows never changed the older ones' fate.
    for older in ["conflict-older", "identity-there"] {
        let mf = flows.get(older).await?;
        let (_, reason, message) = condition(&mf, "Ready").context("Ready")?;
        assert!(
            !["ReplicationLoop", "ConflictingFlow", "InvalidSpec"].contains(&reason.as_str()),
            "{older}: stopped by a later flow: {reason}: {message}"
        );
    }
    // The flow into its own source created nothing there.
    let alias = self_alias(&ns);
    let made: Vec<String> = mirrorflow_e2e::kafka::topics(&world.source_bootstrap)?
        .into_iter()
        .filter(|t| t.contains(&alias))
        .collect();
    assert!(
        made.is_empty(),
        "same-cluster flow created {made:?} on the source"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let all_events = events.list(&ListParams::default()).await?.items;
    for (name, _, reason, _) in &cases {
        assert!(
            all_events
                .iter()
                .any(|e| e.involved_object.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason)),
            "{name}: no {reason} event"
        );
    }
    // Broken flows never get replicators (those with a cluster fault may: their spec is valid).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (name, _, reason, _) in &cases {
        // Cluster faults come from probing a valid spec: such a flow is deployed (its
        // replicators report the same fault); so is one whose pods cannot run (`Replicator...`:
        // named from those pods).
        if ["Source", "Target", "Replicator"]
            .iter()
            .any(|p| reason.starts_with(p))
        {
            continue;
        }
        // The first of two Identity flows may run until the second appears; then it stops.
        let selector = format!("mirrorflow.io/flow={name}");
        mirrorflow_e2e::eventually(
            &format!("{name}: no replicator pods"),
            Duration::from_secs(90),
            || async {
                let n = pods
                    .list(&ListParams::default().labels(&selector))
                    .await?
                    .items
                    .len();
                Ok((n == 0).then_some(()))
            },
        )
        .await?;
    }

    // 3. Flow files for the standalone replicator: a clear message and exit code, no panic.
    let dir = std::env::temp_dir().join(unique("mf-bad-files"));
    std::fs::create_dir_all(&dir)?;
    let binary = mirrorflow_e2e::replicator::binary(&world.repo_root);
    let into_itself = format!(
        "source: {{alias: a, bootstrapServers: '{}'}}\ntarget: {{alias: b, bootstrapServers: '{}'}}\n",
        world.source_bootstrap,
        world.source_bootstrap.replace("127.0.0.1", "localhost")
    );
    let files = [
        (
            "target is the source (another name)",
            into_itself.as_str(),
            "spec.target.bootstrapServers: reaches the same Kafka cluster",
        ),
        ("not YAML", "source: [unclosed\n", "not a valid MirrorFlow"),
        (
            "misspelt field",
            "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1'}\nheartbeat: {interval: 1s}\n",
            "unknown field spec.heartbeat",
        ),
        (
            "invalid regex",
            "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1'}\ntopics: ['orders[']\n",
            "spec.topics",
        ),
        (
            "secret file missing",
            "source: {alias: a, bootstrapServers: 'x:1', sasl: {mechanism: PLAIN, usernameSecretRef: {name: s, key: u}, passwordSecretRef: {name: s, key: p}}}\ntarget: {alias: b, bootstrapServers: 'y:1'}\n",
            "spec.source.sasl.usernameSecretRef",
        ),
        (
            "mode Observe",
            "source: {alias: a, bootstrapServers: '127.0.0.1:1'}\ntarget: {alias: b, bootstrapServers: '127.0.0.1:2'}\nmode: Observe\n",
            "spec.mode is Observe",
        ),
        (
            "bootstrap server without a port",
            "source: {alias: a, bootstrapServers: 'kafka'}\ntarget: {alias: b, bootstrapServers: 'y:1'}\n",
            "spec.source.bootstrapServers: 'kafka' has no port",
        ),
        (
            "Secret key that leaves its folder",
            "source: {alias: a, bootstrapServers: 'x:1', sasl: {mechanism: PLAIN, usernameSecretRef: {name: s, key: ../../../etc/passwd}, passwordSecretRef: {name: s, key: p}}}\ntarget: {alias: b, bootstrapServers: 'y:1'}\n",
            "spec.source.sasl.usernameSecretRef.key",
        ),
        (
            "alias containing the separator",
            "source: {alias: us-east, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1'}\nreplicationPolicy: {separator: '-'}\n",
            "spec.source.alias: 'us-east' contains spec.replicationPolicy.separator",
        ),
        (
            "client property that loads a file",
            "source: {alias: a, bootstrapServers: 'x:1', config: {plugin.library.paths: /tmp/x.so}}\ntarget: {alias: b, bootstrapServers: 'y:1'}\n",
            "spec.source.config.plugin.library.paths: not allowed: it loads or reads a file from the pod",
        ),
        (
            "client property value the client refuses",
            "source: {alias: a, bootstrapServers: 'x:1'}\ntarget: {alias: b, bootstrapServers: 'y:1', config: {fetch.wait.max.ms: banana}}\n",
            "spec.target.config.fetch.wait.max.ms: the Kafka client refuses 'banana'",
        ),
        (
            "client property with a typed field",
            "source: {alias: a, bootstrapServers: 'x:1', config: {security.protocol: SSL}}\ntarget: {alias: b, bootstrapServers: 'y:1'}\n",
            "set by spec.source.tls and spec.source.sasl",
        ),
    ];
    for (case, text, expected) in files {
        let path = dir.join("flow.yaml");
        std::fs::write(&path, text)?;
        let out = Command::new(&binary)
            .args(["replicate", "--config"])
            .arg(&path)
            .args(["--secrets-dir"])
            .arg(dir.join("secrets"))
            .args(["--listen", "127.0.0.1:0"])
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{case}: exit code; stderr: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{case}: panicked: {stderr}");
        assert!(
            stderr.contains(expected),
            "{case}: the message does not say {expected}: {stderr}"
        );
        table.push(format!(
            "| file: {case} | `mirrorflow replicate` exits 1 | `{expected}` |"
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);

    // 4. No hot loop: the operator's reconcile rate with all these broken flows in place.
    let operator = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
        .await?
        .items
        .into_iter()
        .next()
        .context("the operator pod")?;
    let ip = operator
        .status
        .and_then(|s| s.pod_ip)
        .context("operator pod IP")?;
    let reconciles = || -> Result<f64> {
        let text = http_get(&format!("{ip}:8080"), "/metrics")?;
        text.lines()
            .find_map(|l| l.strip_prefix("mirrorflow_operator_reconciles_total "))
            .context("reconciles_total")?
            .trim()
            .parse()
            .context("reconciles_total value")
    };
    // 90 s: broken flows are retried every 60 s, so a shorter window would count each 0-2
    // times depending on phase.
    let (before, t0) = (reconciles()?, Instant::now());
    tokio::time::sleep(Duration::from_secs(90)).await;
    let per_minute = (reconciles()? - before) / t0.elapsed().as_secs_f64() * 60.0;
    let flows_now = flows.list(&ListParams::default()).await?.items.len();
    println!(
        "reconcile rate with {flows_now} flows ({} broken): {per_minute:.1}/min",
        cases.len()
    );
    // Broken flows are retried every 60 s, the unreachable one and the valid one every 10 s.
    assert!(
        per_minute <= 3.0 * flows_now as f64 + 20.0,
        "hot loop: {per_minute:.1} reconciles/min"
    );

    println!("| case | outcome | field / message |\n|---|---|---|");
    for row in &table {
        println!("{row}");
    }
    println!("{} cases", table.len());
    assert!(table.len() >= 25, "the catalogue has {} cases", table.len());
    Ok(())
}
