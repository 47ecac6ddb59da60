//! A decompression bomb in a topic the status probe follows, against the world's target
//! cluster: one gzip batch of 300 records of 1 MiB of zeros (a few hundred KB on the broker)
//! written with an ordinary producer into a flow's positions topic. The probe's tail reader
//! refuses it at its cap with bounded memory, the flow's probe names the topic, and a normal
//! topic on the same cluster is still followed.
//!
//! The bomb is produced by a child process (this binary, running `bomb_producer`): the
//! producer buffers the 300 MiB before compressing them, which would hide the reader's own
//! peak memory in this process.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mirrorflow::api::MirrorFlowSpec;
use mirrorflow::flow;
use mirrorflow::kafka::SecretFiles;
use mirrorflow::kafka::positions::{self, Frontier};
use mirrorflow::status::clients::{ProbeClients, TailKind, TailState};
use mirrorflow::status::probe::{Budget, PROBE_BUDGET, observe_with};
use mirrorflow::status::tails::{BATCH_CAP, TailError, TailRefusal};
use mirrorflow_e2e::{kafka, unique};
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

const RECORDS: usize = 300;
const RECORD_BYTES: usize = kafka::BOMB_RECORD_BYTES;

/// VmHWM (peak resident memory) and VmRSS of this process, in KiB.
fn memory_kib() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("VmHWM:")?, field("VmRSS:")?))
}

/// Resets this process's peak resident memory to what it holds now (Linux `clear_refs` 5).
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Writes the bomb: one gzip batch (linger and batch size far above what 300 MiB need).
#[tokio::test]
#[ignore = "run by the_probe_refuses_a_gzip_bomb_with_bounded_memory in a child process"]
async fn bomb_producer() -> Result<()> {
    let (Ok(bootstrap), Ok(topic)) = (
        std::env::var("MF_BOMB_BOOTSTRAP"),
        std::env::var("MF_BOMB_TOPIC"),
    ) else {
        return Ok(());
    };
    let keys: Vec<Vec<u8>> = (0..RECORDS)
        .map(|i| positions::encode_key(&format!("bomb-{i}"), 0))
        .collect();
    kafka::produce_bomb(&bootstrap, &topic, &keys, "gzip").await
}

fn produce_bomb(bootstrap: &str, topic: &str) -> Result<()> {
    let out = Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "bomb_producer",
            "--include-ignored",
            "--nocapture",
        ])
        .env("MF_BOMB_BOOTSTRAP", bootstrap)
        .env("MF_BOMB_TOPIC", topic)
        .output()
        .context("running the bomb producer")?;
    ensure!(
        out.status.success(),
        "bomb producer: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The first and next offsets of partition 0 and the size of its log on the broker.
fn batches_written(bootstrap: &str, topic: &str) -> Result<(i64, i64)> {
    let consumer: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    use rdkafka::consumer::Consumer;
    Ok(consumer.fetch_watermarks(topic, 0, Duration::from_secs(10))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_refuses_a_gzip_bomb_with_bounded_memory() -> Result<()> {
    // Kafka only: no apiserver needed.
    let bootstrap = |side: &str| {
        std::env::var(format!("MF_{side}_BOOTSTRAP"))
            .with_context(|| format!("MF_{side}_BOOTSTRAP is not set: run through e2e/test.sh"))
    };
    let (source_bootstrap, target_bootstrap) = (bootstrap("SOURCE")?, bootstrap("TARGET")?);
    let alias = unique("bomb");
    let bomb_topic = positions::positions_topic(&alias);
    kafka::create_topic_with(
        &target_bootstrap,
        &bomb_topic,
        1,
        &[
            ("max.message.bytes", "1000000000"),
            ("cleanup.policy", "compact"),
        ],
    )
    .await?;
    produce_bomb(&target_bootstrap, &bomb_topic)?;
    let (low, high) = batches_written(&target_bootstrap, &bomb_topic)?;
    ensure!(
        high - low == RECORDS as i64,
        "{low}..{high}: the bomb is not there"
    );

    // A normal positions topic on the same cluster.
    let normal_alias = unique("calm");
    let normal_topic = positions::positions_topic(&normal_alias);
    kafka::create_topic(&target_bootstrap, &normal_topic, 1).await?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &target_bootstrap)
        .set("compression.type", "gzip")
        .create()?;
    for p in 0..3 {
        let key = positions::encode_key("orders", p);
        let value = positions::encode_value(Frontier {
            next: 10 + i64::from(p),
            downstream: 0,
        });
        producer
            .send(
                FutureRecord::to(&normal_topic).key(&key).payload(&value),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)?;
    }

    let clients = ProbeClients::default();
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &target_bootstrap);
    let cluster = clients.cluster("tenant-bomb", &config)?;
    let reset = reset_peak();
    let before = memory_kib();
    let read = tokio::task::block_in_place(|| {
        cluster.follow(
            &bomb_topic,
            TailKind::Positions,
            Duration::from_secs(20),
            |_| (),
        )
    });
    let after = memory_kib();
    match read {
        Err(TailError::Refused(TailRefusal::BatchTooLarge { offset, limit })) => {
            assert_eq!((offset, limit), (low, BATCH_CAP));
        }
        other => panic!("the bomb was not refused: {other:?}"),
    }
    if let (Some((_, rss_before)), Some((peak_after, rss_after))) = (before, after) {
        let grown = peak_after.saturating_sub(rss_before);
        println!(
            "bomb of {RECORDS} x {RECORD_BYTES} bytes refused; peak RSS {} by {grown} KiB over the {rss_before} KiB held before (RSS after: {rss_after} KiB)",
            if reset { "grew" } else { "(not reset) grew" }
        );
        if reset {
            assert!(
                grown < 64 * 1024,
                "the probe's peak memory grew by {grown} KiB"
            );
        }
    }
    // Refused for good: the next probe says so again without reading.
    let again = tokio::task::block_in_place(|| {
        cluster.follow(
            &bomb_topic,
            TailKind::Positions,
            Duration::from_secs(5),
            |_| (),
        )
    });
    assert!(matches!(again, Err(TailError::Refused(_))), "{again:?}");

    // The normal topic is followed by the same client.
    let positions = tokio::task::block_in_place(|| {
        cluster.follow(
            &normal_topic,
            TailKind::Positions,
            Duration::from_secs(20),
            |state| match state {
                TailState::Positions { positions, .. } => positions.len(),
                _ => 0,
            },
        )
    });
    assert_eq!(positions, Ok(3));

    // The flow's whole probe names the topic, and the others' are unaffected.
    let spec: MirrorFlowSpec = serde_json::from_value(serde_json::json!({
        "mode": "Observe",
        "source": {"alias": alias, "bootstrapServers": source_bootstrap},
        "target": {"alias": format!("{alias}-t"), "bootstrapServers": target_bootstrap},
        "topics": ["none-of-them"],
    }))?;
    let bomb_flow = flow::resolve(
        format!("tenant-bomb/{alias}"),
        spec,
        &SecretFiles::new("/nonexistent"),
    )?;
    let observed = tokio::task::block_in_place(|| {
        observe_with(
            &clients,
            "tenant-bomb",
            &bomb_flow,
            Budget::new(PROBE_BUDGET),
        )
    });
    let message = observed
        .unreadable_topic
        .context("the probe names the topic")?;
    ensure!(
        message.contains(&bomb_topic) && message.contains(&format!("offset {low}")),
        "{message}"
    );
    println!("status message: {message}");
    Ok(())
}

/// The tails' own connections speak what the probe's configuration says: SCRAM-SHA-512 over
/// TLS with the flow's CA, and mutual TLS with its client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tails_are_followed_over_scram_and_mutual_tls() -> Result<()> {
    let var = |n: &str| std::env::var(n).with_context(|| format!("{n} is not set"));
    let read = |n: &str| -> Result<String> { Ok(std::fs::read_to_string(var(n)?)?) };
    let target = var("MF_TARGET_BOOTSTRAP")?;
    let topic = positions::positions_topic(&unique("secure"));
    kafka::create_topic(&target, &topic, 1).await?;
    let producer = kafka::producer(&target, Duration::from_secs(30))?;
    let key = positions::encode_key("orders", 0);
    let value = positions::encode_value(Frontier {
        next: 7,
        downstream: 6,
    });
    producer
        .send(
            FutureRecord::to(&topic).key(&key).payload(&value),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;

    let mut scram = ClientConfig::new();
    scram
        .set("bootstrap.servers", var("MF_TARGET_SECURE_BOOTSTRAP")?)
        .set("security.protocol", "SASL_SSL")
        .set("ssl.ca.pem", read("MF_KAFKA_CA_PEM")?)
        .set("sasl.mechanisms", "SCRAM-SHA-512")
        .set("sasl.username", var("MF_KAFKA_SCRAM_USER")?)
        .set(
            "sasl.password",
            read("MF_KAFKA_SCRAM_PASSWORD_FILE")?.trim(),
        );
    let mut mtls = ClientConfig::new();
    mtls.set("bootstrap.servers", var("MF_TARGET_MTLS_BOOTSTRAP")?)
        .set("security.protocol", "SSL")
        .set("ssl.ca.pem", read("MF_KAFKA_CA_PEM")?)
        .set("ssl.certificate.pem", read("MF_KAFKA_CLIENT_CERT_PEM")?)
        .set("ssl.key.pem", read("MF_KAFKA_CLIENT_KEY_PEM")?);
    let clients = ProbeClients::default();
    for (name, config) in [("scram", scram), ("mtls", mtls)] {
        let cluster = clients.cluster("tenant-secure", &config)?;
        let got = tokio::task::block_in_place(|| {
            cluster.follow(
                &topic,
                TailKind::Positions,
                Duration::from_secs(20),
                |state| match state {
                    TailState::Positions { positions, .. } => {
                        positions.get(&("orders".to_string(), 0)).map(|f| f.next)
                    }
                    _ => None,
                },
            )
        });
        assert_eq!(got, Ok(Some(7)), "{name}");
    }
    Ok(())
}

/// SASL/OAUTHBEARER targets are followed with the same connections, tokens fetched by their
/// own bounded client from the world's token endpoint (on loopback: a CLI's clients allow it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tails_are_followed_over_oauthbearer_with_the_own_token_client() -> Result<()> {
    let oauth = mirrorflow_e2e::oauth::OAuthKafka::from_env()?;
    let target = std::env::var("MF_TARGET_BOOTSTRAP").context("MF_TARGET_BOOTSTRAP")?;
    let topic = positions::positions_topic(&unique("oauth"));
    kafka::create_topic(&target, &topic, 1).await?;
    let producer = kafka::producer(&target, Duration::from_secs(30))?;
    let key = positions::encode_key("orders", 0);
    let value = positions::encode_value(Frontier {
        next: 9,
        downstream: 8,
    });
    producer
        .send(
            FutureRecord::to(&topic).key(&key).payload(&value),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    let client_id = unique("mf-tails");
    let secret = unique("secret");
    oauth.add_client(&client_id, &secret, None)?;
    let before = oauth.issued(&client_id)?;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &oauth.target_bootstrap)
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanisms", "OAUTHBEARER")
        .set("sasl.oauthbearer.method", "oidc")
        .set("sasl.oauthbearer.token.endpoint.url", oauth.token_url())
        .set("sasl.oauthbearer.client.id", &client_id)
        .set("sasl.oauthbearer.client.secret", &secret)
        .set("sasl.oauthbearer.scope", "kafka");
    let clients = ProbeClients::for_cli();
    let cluster = clients.cluster("tenant-oauth", &config)?;
    let got = tokio::task::block_in_place(|| {
        cluster.follow(
            &topic,
            TailKind::Positions,
            Duration::from_secs(20),
            |state| match state {
                TailState::Positions { positions, .. } => {
                    positions.get(&("orders".to_string(), 0)).map(|f| f.next)
                }
                _ => None,
            },
        )
    });
    assert_eq!(got, Ok(Some(9)));
    let issued = oauth.issued(&client_id)? - before;
    println!("tokens issued to the tails' client and librdkafka's: {issued}");
    ensure!(issued >= 1, "no token was fetched");
    // The operator's clients do not call a loopback token endpoint at all.
    ensure!(
        ProbeClients::default()
            .cluster("tenant-oauth", &config)
            .is_err()
    );
    Ok(())
}
