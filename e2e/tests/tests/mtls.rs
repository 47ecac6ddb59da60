//! Flows that authenticate with a client certificate (mTLS), in both forms Strimzi writes for a
//! `KafkaUser` with `authentication: tls`: PEM (`user.crt`, `user.key`) and PKCS#12
//! (`user.p12`, `user.password`). The world's brokers require a certificate their clients CA
//! signed on port+3 (`e2e/lib/kafka.sh`). A certificate they do not trust, and none at all,
//! are named with the field to fix.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::operator::{
    SecretSource, condition, create_shared_secret, install_operator, wait_for_flow,
};
use mirrorflow_e2e::{World, eventually, kafka, run, run_with_input, unique};

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", &self.0]);
        let _ = run("kubectl", &["delete", "namespace", &self.0, "--wait=false"]);
    }
}

fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run through e2e/test.sh"))
}

/// A Secret from files (`key=path`), which every flow of the namespace may use.
fn secret_from_files(ns: &str, name: &str, files: &[(&str, &str)]) -> Result<()> {
    let sources: Vec<SecretSource<'_>> = files
        .iter()
        .map(|(k, path)| SecretSource::File(k, path))
        .collect();
    create_shared_secret(ns, name, &sources)
}

fn flow(
    ns: &str,
    name: &str,
    alias: &str,
    bootstrap: &str,
    tls: &str,
    topic: &str,
    world: &World,
) -> String {
    format!(
        "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  source:\n    alias: {alias}\n    bootstrapServers: \"{bootstrap}\"\n    tls: {tls}\n  target: {{alias: {alias}-t, bootstrapServers: \"{}\"}}\n  topics: [\"{topic}\"]\n  groups: [\"{topic}-app\"]\n",
        world.target_bootstrap
    )
}

#[tokio::test]
async fn client_certificates_pem_and_pkcs12_replicate_and_refusals_are_named() -> Result<()> {
    let world = World::from_env()?;
    let client = world.kube_client().await?;
    let mtls = var("MF_SOURCE_MTLS_BOOTSTRAP")?;
    let ns = unique("e2e-mtls");
    let _cleanup = Cleanup(ns.clone());
    install_operator(&world, &ns)?;
    let dir = std::env::temp_dir().join(unique("mf-mtls"));
    std::fs::create_dir_all(&dir)?;
    // A client certificate and key no CA of the world signed.
    let (stranger_cert, stranger_key) = mirrorflow_e2e::secure::self_signed(&dir, "stranger")?;
    let (ca, cert, key) = (
        var("MF_KAFKA_CA_PEM")?,
        var("MF_KAFKA_CLIENT_CERT_PEM")?,
        var("MF_KAFKA_CLIENT_KEY_PEM")?,
    );
    let (p12, p12_password) = (
        var("MF_KAFKA_CLIENT_P12")?,
        var("MF_KAFKA_CLIENT_P12_PASSWORD_FILE")?,
    );
    secret_from_files(&ns, "kafka-ca", &[("ca.crt", &ca)])?;
    secret_from_files(&ns, "user-pem", &[("user.crt", &cert), ("user.key", &key)])?;
    secret_from_files(
        &ns,
        "user-p12",
        &[("user.p12", &p12), ("user.password", &p12_password)],
    )?;
    secret_from_files(
        &ns,
        "stranger",
        &[("user.crt", &stranger_cert), ("user.key", &stranger_key)],
    )?;
    let _ = std::fs::remove_dir_all(&dir);

    let topic = unique("mtls-topic");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 10, 1).await?;
    kafka::commit(
        &world.source_bootstrap,
        &format!("{topic}-app"),
        &topic,
        &[(0, 10)],
    )?;

    let ca_ref = "caSecretRef: {name: kafka-ca, key: ca.crt}";
    let cases = [
        (
            "pem",
            format!(
                "{{{ca_ref}, certSecretRef: {{name: user-pem, key: user.crt}}, keySecretRef: {{name: user-pem, key: user.key}}}}"
            ),
        ),
        (
            "p12",
            format!(
                "{{{ca_ref}, pkcs12SecretRef: {{name: user-p12, key: user.p12}}, pkcs12PasswordSecretRef: {{name: user-p12, key: user.password}}}}"
            ),
        ),
        (
            "stranger",
            format!(
                "{{{ca_ref}, certSecretRef: {{name: stranger, key: user.crt}}, keySecretRef: {{name: stranger, key: user.key}}}}"
            ),
        ),
        ("nocert", format!("{{{ca_ref}}}")),
    ];
    let mut aliases = Vec::new();
    for (name, tls) in &cases {
        let alias = unique(name);
        run_with_input(
            "kubectl",
            &["apply", "-f", "-"],
            &flow(&ns, name, &alias, &mtls, tls, &topic, &world),
        )?;
        aliases.push(alias);
    }
    let flows: kube::Api<MirrorFlow> = kube::Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    for (name, alias) in [("pem", &aliases[0]), ("p12", &aliases[1])] {
        wait_for_flow(
            &flows,
            name,
            "FailoverReady over mTLS",
            Duration::from_secs(180),
            |mf| {
                condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True")
                    && mf.status.as_ref().is_some_and(|s| s.groups == Some(1))
            },
        )
        .await?;
        let remote = format!("{alias}.{topic}");
        let copied = eventually("records on the target", Duration::from_secs(60), || async {
            let n = kafka::read_partition(&world.target_bootstrap, &remote, 0)?.len();
            Ok((n >= 10).then_some(n))
        })
        .await?;
        assert_eq!(copied, 10, "{name}");
        println!(
            "{name}: FailoverReady over mTLS after {:?}, 10 records copied",
            started.elapsed()
        );
    }
    for name in ["stranger", "nocert"] {
        let mf = wait_for_flow(
            &flows,
            name,
            "SourceCertificateRefused",
            Duration::from_secs(60),
            |mf| condition(mf, "Ready").is_some_and(|c| c.1 == "SourceCertificateRefused"),
        )
        .await?;
        let (_, _, message) = condition(&mf, "Ready").context("Ready")?;
        assert!(
            message.contains("spec.source.tls.certSecretRef"),
            "{name}: {message}"
        );
        println!("{name}: {message}");
    }
    Ok(())
}
