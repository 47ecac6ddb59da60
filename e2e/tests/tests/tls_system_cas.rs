//! TLS with the system's CAs: a cluster side with `tls: {}` (no `caSecretRef`) trusts what the
//! machine trusts. The world's brokers have certificates of the world's own CA, which no system
//! store holds: refused as `SourceTLSFailed` naming `caSecretRef`, and trusted once the system
//! store the Kafka client reads (OpenSSL's default paths, which `SSL_CERT_FILE` overrides, as a
//! distribution's store or a container's mounted bundle would) holds that CA.
//!
//! Runs the operator's probe through `mirrorflow status --flow-file` against the world's
//! SCRAM-over-TLS listener; nothing in Kubernetes.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use mirrorflow_e2e::replicator::binary;
use mirrorflow_e2e::{World, unique};

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set: run through e2e/test.sh"))
}

/// `mirrorflow status` of the flow, with `SSL_CERT_FILE` set to `system_store` if given;
/// the reason and message of `Ready`.
fn ready(
    world: &World,
    flow: &Path,
    secrets: &Path,
    system_store: Option<&str>,
) -> Result<(String, String)> {
    let mut cmd = Command::new(binary(&world.repo_root));
    cmd.args(["status", "-o", "json", "--flow-file"])
        .arg(flow)
        .arg("--secrets-dir")
        .arg(secrets)
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR");
    if let Some(store) = system_store {
        cmd.env("SSL_CERT_FILE", store);
    }
    let out = cmd.output().context("running mirrorflow status")?;
    ensure!(
        out.status.success(),
        "mirrorflow status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let ready = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .context("no Ready condition")?;
    let s = |k: &str| ready[k].as_str().unwrap_or_default().to_string();
    Ok((s("reason"), s("message")))
}

#[test]
fn tls_without_a_ca_secret_uses_the_system_store() -> Result<()> {
    let world = World::from_env()?;
    let dir = std::env::temp_dir()
        .join("mirrorflow-e2e")
        .join(unique("system-cas"));
    let secrets = dir.join("secrets");
    std::fs::create_dir_all(secrets.join("kafka-user"))?;
    std::fs::write(
        secrets.join("kafka-user/username"),
        env("MF_KAFKA_SCRAM_USER")?,
    )?;
    std::fs::copy(
        env("MF_KAFKA_SCRAM_PASSWORD_FILE")?,
        secrets.join("kafka-user/password"),
    )?;
    let flow = dir.join("flow.yaml");
    std::fs::write(
        &flow,
        format!(
            "source:\n  alias: sys\n  bootstrapServers: '{}'\n  tls: {{}}\n  sasl:\n    mechanism: SCRAM-SHA-512\n    usernameSecretRef: {{name: kafka-user, key: username}}\n    passwordSecretRef: {{name: kafka-user, key: password}}\ntarget: {{alias: sys-t, bootstrapServers: '{}'}}\ntopics: ['{}']\n",
            env("MF_SOURCE_SECURE_BOOTSTRAP")?,
            world.target_bootstrap,
            unique("none")
        ),
    )?;

    let (reason, message) = ready(&world, &flow, &secrets, None)?;
    assert_eq!(reason, "SourceTLSFailed", "{message}");
    assert!(message.contains("spec.source.tls.caSecretRef"), "{message}");

    let ca = env("MF_KAFKA_CA_PEM")?;
    let (reason, message) = ready(&world, &flow, &secrets, Some(&ca))?;
    assert!(
        !reason.starts_with("Source"),
        "the world's CA in the system store: the source is reachable ({reason}: {message})"
    );
    Ok(())
}
