//! A flow whose clusters want SASL/OAUTHBEARER (`e2e/lib/kafka.sh`, PORT+4): tokens from the
//! world's OAuth token endpoint (client credentials grant, RS256 JWTs of 60 s, `lib/oidc.sh`),
//! which the brokers validate against its JWKS and whose expiry ends the session unless the
//! client re-authenticates with a new token (KIP-368).
//!
//! The token refresh test runs the replicator standalone (`mirrorflow replicate`) on both sides
//! over OAUTHBEARER, and the operator's probe and condition rules through `mirrorflow status
//! --flow-file`; the operator test installs the chart and lets the operator run a flow (its
//! probe and the replicator pods, with the client secret mounted from an opted-in Secret).
//! Each test registers its own OAuth client, so the token counts it reads are its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::Api;
use kube::api::ListParams;
use mirrorflow::api::MirrorFlow;
use mirrorflow_e2e::oauth::OAuthKafka;
use mirrorflow_e2e::operator::{
    SecretSource, condition as flow_condition, create_shared_secret, install_operator,
    wait_for_flow,
};
use mirrorflow_e2e::replicator::{Replicator, binary};
use mirrorflow_e2e::{World, eventually, kafka, run, run_with_input, unique};

const WAIT: Duration = Duration::from_secs(90);

fn plaintext(side: &str) -> Result<String> {
    let name = format!("MF_{side}_BOOTSTRAP");
    std::env::var(&name).with_context(|| format!("{name} is not set: run through e2e/test.sh"))
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The folder `Replicator::start` gives the run `name`; its Secrets live under `secrets/`.
fn run_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join("mirrorflow-e2e").join(name)
}

fn write_client_secret(name: &str, secret: &str) -> Result<PathBuf> {
    let secrets = run_dir(name).join("secrets");
    std::fs::create_dir_all(secrets.join("oauth"))?;
    std::fs::write(secrets.join("oauth/client-secret"), secret)?;
    Ok(secrets)
}

/// One side's YAML: OAUTHBEARER with the Secret `oauth`/`client-secret`, or plaintext.
fn side(alias: &str, bootstrap: &str, oauth: Option<(&str, &str)>) -> String {
    match oauth {
        Some((token_url, client_id)) => format!(
            "{{alias: {alias}, bootstrapServers: '{bootstrap}', sasl: {{mechanism: OAUTHBEARER, \
             oauthbearer: {{tokenEndpointUrl: '{token_url}', clientId: '{client_id}', scope: kafka, \
             clientSecretSecretRef: {{name: oauth, key: client-secret}}}}}}}}"
        ),
        None => format!("{{alias: {alias}, bootstrapServers: '{bootstrap}'}}"),
    }
}

/// `mirrorflow status --flow-file` as JSON: the operator's probe and conditions, from here.
fn measured_status(flow: &Path, secrets: &Path) -> Result<(serde_json::Value, String)> {
    let out = Command::new(binary(&repo_root()))
        .args(["status", "-o", "json", "--flow-file"])
        .arg(flow)
        .arg("--secrets-dir")
        .arg(secrets)
        .output()
        .context("running mirrorflow status")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "mirrorflow status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((serde_json::from_str(&text)?, text))
}

/// (status, reason, message) of condition `type_`.
fn condition(status: &serde_json::Value, type_: &str) -> Option<(String, String, String)> {
    let c = status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

fn values(bootstrap: &str, topic: &str) -> Result<Vec<String>> {
    Ok(kafka::read_partition(bootstrap, topic, 0)?
        .into_iter()
        .map(|(_, _, v)| String::from_utf8_lossy(&v.unwrap_or_default()).into_owned())
        .collect())
}

async fn produce(bootstrap: &str, topic: &str, from: i32, to: i32) -> Result<()> {
    let producer = kafka::producer(bootstrap, Duration::from_secs(30))?;
    for i in from..to {
        let v = format!("v{i}");
        producer
            .send(
                rdkafka::producer::FutureRecord::<(), _>::to(topic).payload(&v),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }
    Ok(())
}

async fn copied(target: &str, remote: &str, n: i32) -> Result<()> {
    let want: Vec<String> = (0..n).map(|i| format!("v{i}")).collect();
    eventually(&format!("{n} records copied to {remote}"), WAIT, || async {
        let got = values(target, remote)?;
        Ok((got == want).then_some(()))
    })
    .await
}

#[tokio::test]
async fn a_flow_over_oauthbearer_keeps_replicating_across_token_expiries_and_is_failover_ready()
-> Result<()> {
    across_token_expiries("Records").await
}

/// The whole-batch copy's own connections (fetcher and writer) over OAUTHBEARER: tokens from
/// the project's bounded OAuth client, a new connection with a new token once a broker ends a
/// session whose token expired.
#[tokio::test]
async fn whole_batches_over_oauthbearer_keep_copying_across_token_expiries() -> Result<()> {
    across_token_expiries("Batches").await
}

async fn across_token_expiries(copy: &str) -> Result<()> {
    let oauth = OAuthKafka::from_env()?;
    let (source_plain, target_plain) = (plaintext("SOURCE")?, plaintext("TARGET")?);
    let client_id = unique("mf-client");
    let secret = unique("client-secret");
    oauth.add_client(&client_id, &secret, None)?;
    let name = unique("oauth-flow");
    let (src, tgt) = (unique("src"), unique("tgt"));
    let topic = unique("orders");
    kafka::create_topic(&source_plain, &topic, 1).await?;
    let token_url = oauth.token_url();
    let client = Some((token_url.as_str(), client_id.as_str()));
    let flow = format!(
        "source: {}\ntarget: {}\ntopics: ['{topic}']\nsourceLoop: {{topicsRefreshInterval: 1s, copy: {copy}}}\n",
        side(&src, &oauth.source_bootstrap, client),
        side(&tgt, &oauth.target_bootstrap, client),
    );
    let secrets = write_client_secret(&name, &secret)?;
    let mut replicator = Replicator::start(&repo_root(), &name, &flow, free_port()?)?;
    let remote = format!("{src}.{topic}");

    produce(&source_plain, &topic, 0, 20).await?;
    copied(&target_plain, &remote, 20)
        .await
        .with_context(|| replicator.log_text())?;
    if copy == "Batches" {
        ensure!(
            (replicator.log_text()).contains("source loop starting (whole record batches)"),
            "the flow did not copy whole batches: {}",
            replicator.log_text()
        );
    }
    let started = Instant::now();
    let first_tokens = oauth.issued(&client_id)?;
    ensure!(
        first_tokens >= 1,
        "the replicator got no token from the endpoint"
    );

    // Past two token lifetimes (60 s each), a record every 5 s: every session the brokers
    // opened has expired at least once by the end, so records still arriving means the
    // clients re-authenticated with tokens they fetched again.
    let mut n = 20;
    while started.elapsed() < Duration::from_secs(135) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        produce(&source_plain, &topic, n, n + 1).await?;
        n += 1;
    }
    copied(&target_plain, &remote, n)
        .await
        .with_context(|| replicator.log_text())?;
    let tokens = oauth.issued(&client_id)?;
    ensure!(
        tokens > first_tokens,
        "no token fetched after the first ones expired ({first_tokens} then {tokens})"
    );
    ensure!(replicator.running(), "{}", replicator.log_text());
    // Token expiries are not outages: the project's own connections (the batch copy's, the
    // share-group poller's) renew a session before the broker ends it, so no loop saw a
    // cluster as unreachable and no poll failed.
    let log = replicator.log_text();
    for sign in [
        "cluster unreachable",
        "could not read the source's share groups",
    ] {
        ensure!(!log.contains(sign), "'{sign}' across token expiries: {log}");
    }

    // The operator's probe over OAUTHBEARER on both clusters: heartbeats replicated, ready.
    let flow_file = run_dir(&name).join("flow.yaml");
    let text = eventually("FailoverReady measured over OAUTHBEARER", WAIT, || async {
        let (status, text) = measured_status(&flow_file, &secrets)?;
        match condition(&status, "FailoverReady") {
            Some((s, _, _)) if s == "True" => Ok(Some(text)),
            other => bail!("FailoverReady is {other:?}"),
        }
    })
    .await?;
    for (what, body) in [
        ("status", &text),
        ("replicator log", &replicator.log_text()),
    ] {
        ensure!(
            !body.contains(&secret),
            "the client secret is in the {what}"
        );
    }
    replicator.stop(Duration::from_secs(10));
    println!(
        "{copy}: {n} records copied over {:?}; {tokens} tokens issued to the flow's clients",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn oauthbearer_failures_are_named_with_the_field_to_fix() -> Result<()> {
    let oauth = OAuthKafka::from_env()?;
    let target_plain = plaintext("TARGET")?;
    let right = unique("client-secret");
    let good = unique("mf-good");
    oauth.add_client(&good, &right, None)?;
    let foreign = unique("mf-foreign");
    oauth.add_client(&foreign, &right, Some("not-kafka"))?;
    let closed = format!("http://127.0.0.1:{}/token", free_port()?);
    let token_url = oauth.token_url();
    for (case, url, client_id, secret, reason, field) in [
        (
            "wrong-secret",
            token_url.as_str(),
            good.as_str(),
            "not-the-secret",
            "SourceClientCredentialsRefused",
            "spec.source.sasl.oauthbearer.clientSecretSecretRef",
        ),
        (
            "closed-endpoint",
            closed.as_str(),
            good.as_str(),
            right.as_str(),
            "SourceTokenEndpointUnreachable",
            "spec.source.sasl.oauthbearer.tokenEndpointUrl",
        ),
        (
            "foreign-audience",
            token_url.as_str(),
            foreign.as_str(),
            right.as_str(),
            "SourceTokenRefused",
            "spec.source.sasl.oauthbearer.scope",
        ),
    ] {
        let name = unique(&format!("oauth-{case}"));
        let secrets = write_client_secret(&name, secret)?;
        let flow_file = run_dir(&name).join("flow.yaml");
        std::fs::write(
            &flow_file,
            format!(
                "source: {}\ntarget: {}\n",
                side(
                    &unique("src"),
                    &oauth.source_bootstrap,
                    Some((url, client_id))
                ),
                side(&unique("tgt"), &target_plain, None),
            ),
        )?;
        let (status, text) = measured_status(&flow_file, &secrets)?;
        let ready = condition(&status, "Ready").context("no Ready condition")?;
        ensure!(
            ready.0 == "False" && ready.1 == reason && ready.2.contains(field),
            "{case}: Ready is {ready:?}, expected {reason} naming {field}"
        );
        ensure!(
            !text.contains(&right),
            "{case}: the client secret is in the status"
        );
    }
    Ok(())
}

struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = run("helm", &["uninstall", "mirrorflow", "-n", &self.0]);
        let _ = run("kubectl", &["delete", "namespace", &self.0, "--wait=false"]);
    }
}

#[tokio::test]
async fn the_operator_runs_an_oauthbearer_flow_to_failover_ready_and_names_a_wrong_secret()
-> Result<()> {
    let world = World::from_env()?;
    let oauth = OAuthKafka::from_env()?;
    let client = world.kube_client().await?;
    let ns = unique("e2e-oauth");
    let _cleanup = Cleanup(ns.clone());
    install_operator(&world, &ns)?;
    let client_id = unique("mf-op");
    let secret = unique("client-secret");
    oauth.add_client(&client_id, &secret, None)?;
    let wrong = format!("not-{secret}");
    create_shared_secret(
        &ns,
        "oauth",
        &[SecretSource::Literal("client-secret", &secret)],
    )?;
    create_shared_secret(
        &ns,
        "oauth-wrong",
        &[SecretSource::Literal("client-secret", &wrong)],
    )?;

    let topic = unique("oauth-topic");
    let group = format!("{topic}-app");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 10, 1).await?;
    kafka::commit(&world.source_bootstrap, &group, &topic, &[(0, 10)])?;
    let token_url = oauth.token_url();
    let sasl = |secret_name: &str| {
        format!(
            "{{mechanism: OAUTHBEARER, oauthbearer: {{tokenEndpointUrl: '{token_url}', \
             clientId: '{client_id}', scope: kafka, clientSecretSecretRef: {{name: {secret_name}, key: client-secret}}}}}}"
        )
    };
    let alias = unique("oauth");
    for (name, secret_name) in [("good", "oauth"), ("wrong", "oauth-wrong")] {
        run_with_input(
            "kubectl",
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: mirrorflow.io/v1alpha1\nkind: MirrorFlow\nmetadata: {{name: {name}, namespace: {ns}}}\n\
                 spec:\n  source: {{alias: {alias}-{name}, bootstrapServers: '{}', sasl: {}}}\n  \
                 target: {{alias: {alias}-{name}-t, bootstrapServers: '{}', sasl: {}}}\n  \
                 topics: ['{topic}']\n  groups: ['{group}']\n",
                oauth.source_bootstrap,
                sasl(secret_name),
                oauth.target_bootstrap,
                sasl(secret_name),
            ),
        )?;
    }
    let flows: Api<MirrorFlow> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    wait_for_flow(
        &flows,
        "good",
        "FailoverReady over OAUTHBEARER",
        Duration::from_secs(180),
        |mf| {
            flow_condition(mf, "FailoverReady").is_some_and(|c| c.0 == "True")
                && mf.status.as_ref().is_some_and(|s| s.groups == Some(1))
        },
    )
    .await?;
    let remote = format!("{alias}-good.{topic}");
    copied(&world.target_bootstrap, &remote, 10).await?;
    println!(
        "good: FailoverReady over OAUTHBEARER after {:?}",
        started.elapsed()
    );
    let mf = wait_for_flow(
        &flows,
        "wrong",
        "SourceClientCredentialsRefused",
        Duration::from_secs(60),
        |mf| flow_condition(mf, "Ready").is_some_and(|c| c.1 == "SourceClientCredentialsRefused"),
    )
    .await?;
    let (_, _, message) = flow_condition(&mf, "Ready").context("Ready")?;
    ensure!(
        message.contains("spec.source.sasl.oauthbearer.clientSecretSecretRef"),
        "{message}"
    );
    println!("wrong: {message}");
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually("a Warning event naming the field", WAIT, || async {
        let named = events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|ev| {
                ev.type_.as_deref() == Some("Warning")
                    && ev.reason.as_deref() == Some("SourceClientCredentialsRefused")
                    && ev.message.as_deref().is_some_and(|m| {
                        m.contains("spec.source.sasl.oauthbearer.clientSecretSecretRef")
                    })
            });
        Ok(named.then_some(()))
    })
    .await?;

    // Neither secret in what the operator wrote or the pods said.
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
    for ev in events.list(&ListParams::default()).await? {
        haystack.push_str(&ev.message.unwrap_or_default());
    }
    let mut logs = 0;
    for file in world.pod_log_files(&ns)? {
        haystack.push_str(&std::fs::read_to_string(file).unwrap_or_default());
        logs += 1;
    }
    ensure!(logs >= 2, "only {logs} pod logs to search");
    ensure!(
        haystack.contains("SourceClientCredentialsRefused"),
        "the haystack holds the flows' output"
    );
    for value in [&secret, &wrong] {
        ensure!(!haystack.contains(value.as_str()), "a client secret leaked");
    }
    Ok(())
}
