//! A flow from a broker that wants SCRAM-SHA-512 over TLS, with credentials and CA from Secrets:
//! it replicates and becomes FailoverReady; a wrong password and a wrong CA each get a
//! condition naming the field to fix; and no credential shows up in ConfigMaps, status,
//! events, pod logs or metrics.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::Api;
use kube::api::ListParams;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{
    SecretSource, condition, create_shared_secret, install_operator, wait_for_flow,
};
use mirrorflow_e2e::replicator::http_get;
use mirrorflow_e2e::secure::SecureKafka;
use mirrorflow_e2e::{World, eventually, kafka, run, run_with_input, unique};

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", &self.0]);
        let _ = run("kubectl", &["delete", "namespace", &self.0, "--wait=false"]);
    }
}

fn secret(ns: &str, name: &str, pairs: &[(&str, &str)]) -> Result<()> {
    let sources: Vec<SecretSource<'_>> = pairs
        .iter()
        .map(|(k, v)| SecretSource::Literal(k, v))
        .collect();
    create_shared_secret(ns, name, &sources)
}

/// A CA certificate that did not sign the brokers' certificate.
fn unrelated_ca() -> Result<String> {
    let dir = std::env::temp_dir().join(unique("mf-ca"));
    std::fs::create_dir_all(&dir)?;
    let (cert, _) = mirrorflow_e2e::secure::self_signed(&dir, "not-the-brokers-ca")?;
    let pem = std::fs::read_to_string(&cert)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(pem)
}

/// The flows of this test differ only in name, alias, CA Secret and password Secret.
struct Flows<'a> {
    ns: &'a str,
    world: &'a World,
    secure: &'a SecureKafka,
    topic: &'a str,
}

impl Flows<'_> {
    fn yaml(&self, name: &str, alias: &str, ca: &str, password: &str) -> String {
        format!(
            r#"apiVersion: mirrorflow.io/v1alpha1
kind: MirrorFlow
metadata: {{name: {name}, namespace: {ns}}}
spec:
  source:
    alias: {alias}
    bootstrapServers: "{src}"
    tls: {{caSecretRef: {{name: {ca}, key: ca.crt}}}}
    sasl:
      mechanism: SCRAM-SHA-512
      usernameSecretRef: {{name: kafka-user, key: username}}
      passwordSecretRef: {{name: {password}, key: password}}
  target: {{alias: {alias}-t, bootstrapServers: "{tgt}"}}
  topics: ["{topic}"]
  groups: ["{topic}-.*"]
"#,
            ns = self.ns,
            topic = self.topic,
            src = self.secure.source_bootstrap,
            tgt = self.world.target_bootstrap,
        )
    }
}

#[tokio::test]
async fn scram_over_tls_replicates_wrong_credentials_are_named_and_nothing_leaks() -> Result<()> {
    let world = World::from_env()?;
    let secure = SecureKafka::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-sec");
    let _cleanup = Cleanup(ns.clone());
    install_operator(&world, &ns)?;
    let wrong_password = format!("not-{}", secure.password);
    secret(&ns, "kafka-ca", &[("ca.crt", &secure.ca_pem)])?;
    secret(&ns, "other-ca", &[("ca.crt", &unrelated_ca()?)])?;
    secret(
        &ns,
        "kafka-user",
        &[("username", &secure.user), ("password", &secure.password)],
    )?;
    secret(&ns, "kafka-wrong", &[("password", &wrong_password)])?;

    let topic = unique("sectopic");
    let alias = unique("sec");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 30, 1).await?;
    kafka::commit(
        &world.source_bootstrap,
        &format!("{topic}-app"),
        &topic,
        &[(0, 20)],
    )?;

    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    let flows_yaml = Flows {
        ns: &ns,
        world: &world,
        secure: &secure,
        topic: &topic,
    };
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &flows_yaml.yaml("secure", &alias, "kafka-ca", "kafka-user"),
    )?;
    let started = std::time::Instant::now();
    wait_for_flow(
        &flows,
        "secure",
        "FailoverReady over SCRAM/TLS",
        Duration::from_secs(180),
        |mf| {
            condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True")
                && mf.status.as_ref().is_some_and(|s| s.groups == Some(1))
        },
    )
    .await?;
    println!("FailoverReady over SASL_SSL after {:?}", started.elapsed());
    let remote = format!("{alias}.{topic}");
    let copied = eventually("records on the target", Duration::from_secs(60), || async {
        let n = kafka::read_partition(&world.target_bootstrap, &remote, 0)?.len();
        Ok((n >= 30).then_some(n))
    })
    .await?;
    assert_eq!(copied, 30);

    // A wrong password and an unrelated CA: each named with the field to fix.
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &flows_yaml.yaml("wrongpass", &unique("wp"), "kafka-ca", "kafka-wrong"),
    )?;
    run_with_input(
        "kubectl",
        &["apply", "-f", "-"],
        &flows_yaml.yaml("wrongca", &unique("wc"), "other-ca", "kafka-user"),
    )?;
    for (name, reason, field) in [
        (
            "wrongpass",
            "SourceAuthenticationFailed",
            "spec.source.sasl.passwordSecretRef",
        ),
        ("wrongca", "SourceTLSFailed", "spec.source.tls.caSecretRef"),
    ] {
        let mf = wait_for_flow(&flows, name, reason, Duration::from_secs(90), |mf| {
            condition(mf, "Ready").is_some_and(|c| c.1 == reason)
        })
        .await?;
        let (status, _, message) = condition(&mf, "FailoverReady").context("FailoverReady")?;
        assert_eq!(status, "False");
        assert!(message.contains(field), "{name}: {message}");
        println!("{name}: {message}");
    }

    // Let the failing replicators log their errors, then look everywhere for the passwords.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut haystack = String::new();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for cm in cms.list(&ListParams::default()).await? {
        haystack.push_str(&serde_json::to_string(&cm.data)?);
    }
    for mf in flows.list(&ListParams::default()).await? {
        haystack.push_str(&serde_json::to_string(&mf.status)?);
    }
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    for ev in events.list(&ListParams::default()).await? {
        haystack.push_str(&ev.message.unwrap_or_default());
    }
    let mut logs = 0;
    for file in world.pod_log_files(&ns)? {
        haystack.push_str(&std::fs::read_to_string(file).unwrap_or_default());
        logs += 1;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut scraped = 0;
    for pod in pods.list(&ListParams::default()).await? {
        let Some(ip) = pod.status.and_then(|s| s.pod_ip) else {
            continue;
        };
        for port in [8080, 9464] {
            if let Ok(text) = http_get(&format!("{ip}:{port}"), "/metrics") {
                haystack.push_str(&text);
                scraped += 1;
            }
        }
    }
    println!(
        "searched {} bytes: config maps, statuses, events, {logs} log files, {scraped} /metrics pages",
        haystack.len()
    );
    if logs < 4 || scraped < 2 {
        bail!("too little was searched: {logs} logs, {scraped} metrics pages");
    }
    assert!(
        haystack.contains(&alias),
        "the haystack holds the flows' output"
    );
    for (what, value) in [
        ("password", &secure.password),
        ("wrong password", &wrong_password),
    ] {
        assert!(!haystack.contains(value.as_str()), "the {what} leaked");
    }
    Ok(())
}
