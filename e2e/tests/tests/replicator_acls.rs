//! Topic ACL sync (`spec.sourceLoop.syncTopicAcls`, on by default) against the world's real
//! brokers, which run Kafka's StandardAuthorizer (`e2e/lib/kafka.sh`): an ALLOW ACL added on a
//! source topic shows on its remote topic within the refresh interval, WRITE is not copied and
//! ALL becomes READ, and the world's ordinary SCRAM user `reader` can read the remote topic on
//! the SASL_SSL listener with the copied ACL and not without it.
//!
//! A topic with no ACL is open to everyone (`allow.everyone.if.no.acl.found=true`), so the test
//! first closes the topic with an ACL for another principal: any ACL on a topic closes it to
//! the principals it does not name (measured: an ALLOW or a DENY for `User:x` alone makes
//! `reader` get TOPIC_AUTHORIZATION_FAILED).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mirrorflow::kafka::Side;
use mirrorflow::kafka::acls::{AclBinding, Operation, Permission, topic_binding};
use mirrorflow::kafka::admin::Admin;
use mirrorflow_e2e::replicator::{
    Replicator, binary, measured_condition, measured_condition_with_secrets,
};
use mirrorflow_e2e::secure::SecureKafka;
use mirrorflow_e2e::{World, eventually, kafka, unique};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

/// The refresh interval the flow runs with: "within seconds".
const REFRESH: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(90);

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn allow(topic: &str, principal: &str, operation: Operation) -> AclBinding {
    topic_binding(topic, principal, operation, Permission::Allow)
}

fn admin(side: Side, bootstrap: &str) -> Result<Admin> {
    Ok(Admin::new(
        side,
        ClientConfig::new().set("bootstrap.servers", bootstrap),
    )?)
}

/// The world's `reader` user on the target's SASL_SSL listener (same password as the flows'
/// user, an ordinary principal: no super user).
fn reader_config(secure: &SecureKafka) -> Result<ClientConfig> {
    let bootstrap = std::env::var("MF_TARGET_SECURE_BOOTSTRAP")
        .context("MF_TARGET_SECURE_BOOTSTRAP is not set: run through e2e/test.sh")?;
    let ca = std::env::var("MF_KAFKA_CA_PEM").context("MF_KAFKA_CA_PEM is not set")?;
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("security.protocol", "SASL_SSL")
        .set("sasl.mechanisms", "SCRAM-SHA-512")
        .set("sasl.username", "reader")
        .set("sasl.password", &secure.password)
        .set("ssl.ca.location", ca)
        .set("group.id", unique("acl-reader"))
        .set("enable.auto.commit", "false");
    Ok(c)
}

/// Reads partition 0 of `topic` from its start as `reader` (assigned, no group commits): the
/// records' values, or the authorization error the brokers answer.
fn read_as_reader(
    config: &ClientConfig,
    topic: &str,
    want: usize,
) -> Result<Result<Vec<String>, RDKafkaErrorCode>> {
    let c: BaseConsumer = config.create()?;
    // A topic the principal may not DESCRIBE comes back from metadata with the error; the
    // fetch itself just returns nothing.
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    if let Some(code) = md.topics().first().and_then(|t| t.error()) {
        let code = RDKafkaErrorCode::from(code);
        if code == RDKafkaErrorCode::TopicAuthorizationFailed {
            return Ok(Err(code));
        }
        bail!("metadata of {topic} as reader: {code}");
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut values = Vec::new();
    while Instant::now() < deadline && values.len() < want {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                values.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into())
            }
            Some(Err(KafkaError::MessageConsumption(
                code @ (RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed),
            ))) => return Ok(Err(code)),
            Some(Err(e)) => bail!("reading {topic} as reader: {e}"),
            None => {}
        }
    }
    Ok(Ok(values))
}

#[tokio::test(flavor = "multi_thread")]
async fn source_topic_acls_reach_the_remote_topic_within_the_refresh_interval() -> Result<()> {
    let world = World::from_env()?;
    let secure = SecureKafka::from_env()?;
    ensure!(
        binary(&world.repo_root).exists(),
        "build the binary first: cargo build -p mirrorflow"
    );
    let (source_alias, target_alias) = (unique("src"), unique("tgt"));
    let topic = unique("acl-orders");
    let remote = format!("{source_alias}.{topic}");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 3, 1).await?;
    let source = admin(Side::Source, &world.source_bootstrap)?;
    let target = admin(Side::Target, &world.target_bootstrap)?;
    // Closes the topic (and, once copied, its remote topic) to every principal but `other`.
    let other = unique("User:other");
    source
        .create_acls(vec![allow(&topic, &other, Operation::Read)])
        .await?
        .into_iter()
        .next()
        .map_or(Ok(()), Err)?;
    // The controller takes the binding before the broker that answers DescribeAcls applies
    // it: the probe below must see the binding the test set up (CI once probed 1 s too early).
    eventually("the closing ACL readable on the source", WAIT, || async {
        let acls = source.topic_acls().await?;
        Ok(acls
            .contains(&allow(&topic, &other, Operation::Read))
            .then_some(()))
    })
    .await?;

    let flow = format!(
        "source: {{alias: {source_alias}, bootstrapServers: '{}'}}\n\
         target: {{alias: {target_alias}, bootstrapServers: '{}'}}\n\
         topics: ['{topic}']\n\
         checkpoints: {{enabled: false}}\n\
         heartbeats: {{enabled: false}}\n\
         sourceLoop: {{topicsRefreshInterval: {}s}}\n",
        world.source_bootstrap,
        world.target_bootstrap,
        REFRESH.as_secs()
    );
    let name = unique("acl-sync");
    // Before any replicator runs, the probe sees the source's binding missing on the target.
    let dir = std::env::temp_dir().join("mirrorflow-e2e").join(&name);
    std::fs::create_dir_all(&dir)?;
    let flow_file = dir.join("probe-flow.yaml");
    std::fs::write(&flow_file, &flow)?;
    let condition = topic_acls_condition(&world, &flow_file)?;
    ensure!(
        condition["status"] == "False" && condition["reason"] == "TopicAclsMissing",
        "before the replicator runs: {condition}"
    );
    let replicator = Replicator::start(&world.repo_root, &name, &flow, free_port()?)?;
    let on_target = |wanted: AclBinding| {
        let target = target.clone();
        async move {
            let acls = target.topic_acls().await?;
            Ok(acls.contains(&wanted).then_some(()))
        }
    };
    eventually("the copy of the closing ACL on the target", WAIT, || {
        on_target(allow(&remote, &other, Operation::Read))
    })
    .await
    .with_context(|| replicator.log_text())?;
    eventually("the 3 records on the remote topic", WAIT, || async {
        let ends = kafka::read_partition(&world.target_bootstrap, &remote, 0)?;
        Ok((ends.len() >= 3).then_some(()))
    })
    .await?;

    let reader = reader_config(&secure)?;
    let denied = read_as_reader(&reader, &remote, 3)?;
    ensure!(
        denied == Err(RDKafkaErrorCode::TopicAuthorizationFailed),
        "reader read the remote topic without an ACL: {denied:?}"
    );

    // The ACLs a consumer needs, plus a WRITE (never copied) and an ALL (copied as READ).
    let writer = unique("User:writer");
    let admin_user = unique("User:admin");
    let added = Instant::now();
    let failures = source
        .create_acls(vec![
            allow(&topic, "User:reader", Operation::Read),
            allow(&topic, "User:reader", Operation::Describe),
            allow(&topic, &writer, Operation::Write),
            allow(&topic, &admin_user, Operation::All),
        ])
        .await?;
    ensure!(
        failures.is_empty(),
        "creating the source ACLs: {failures:?}"
    );
    eventually("reader's ACLs on the remote topic", WAIT, || async {
        let acls = target.topic_acls().await?;
        Ok([
            allow(&remote, "User:reader", Operation::Read),
            allow(&remote, "User:reader", Operation::Describe),
            allow(&remote, &admin_user, Operation::Read),
        ]
        .iter()
        .all(|b| acls.contains(b))
        .then_some(()))
    })
    .await
    .with_context(|| replicator.log_text())?;
    let took = added.elapsed();
    println!("source ACL to target ACL: {} ms", took.as_millis());
    // One refresh, plus the round's own requests and a busy two-core machine.
    ensure!(
        took <= REFRESH + Duration::from_secs(5),
        "the ACLs took {took:?} to reach the target (refresh {REFRESH:?})"
    );
    let acls = target.topic_acls().await?;
    let on_remote: Vec<&AclBinding> = acls.iter().filter(|b| b.name == remote).collect();
    ensure!(
        !on_remote
            .iter()
            .any(|b| b.operation == Operation::Write || b.operation == Operation::All),
        "WRITE or ALL reached the remote topic: {on_remote:?}"
    );
    ensure!(
        !on_remote.iter().any(|b| b.principal == writer),
        "the writer's ACL was copied: {on_remote:?}"
    );

    let read = read_as_reader(&reader, &remote, 3)?;
    ensure!(
        read.as_ref().map(Vec::len) == Ok(3),
        "reader could not read the remote topic with the copied ACLs: {read:?}"
    );
    let created = replicator
        .metric("mirrorflow_topic_acls_created_total")
        .unwrap_or_default();
    ensure!(
        created >= 4.0,
        "mirrorflow_topic_acls_created_total is {created}"
    );
    ensure!(
        replicator.metric("mirrorflow_topic_acls_missing") == Some(0.0),
        "mirrorflow_topic_acls_missing is not 0"
    );

    // The operator's probe, run by the CLI against the same clusters, agrees.
    let condition = topic_acls_condition(&world, &flow_file)?;
    ensure!(
        condition["status"] == "True",
        "TopicAclsSynced is not True: {condition}"
    );
    Ok(())
}

/// The `TopicAclsSynced` condition `mirrorflow status --flow-file` (the operator's probe and
/// condition rules, run from here) reports for the flow in `flow_file`.
fn topic_acls_condition(world: &World, flow_file: &std::path::Path) -> Result<serde_json::Value> {
    measured_condition(&world.repo_root, flow_file, "TopicAclsSynced")
}

/// A flow whose target principal may not WRITE a topic its replicator writes is told so by
/// its status, naming the topic and the grant, before any record is lost to it; once the grant
/// is made the condition clears and a replicator running as that principal copies. The flow
/// authenticates to the target as the world's ordinary SCRAM user `reader`; its remote topic
/// is made (by a super user) and closed to `reader` but for READ and DESCRIBE. Its positions
/// topic has no ACL (open to everyone), so it must not be named.
#[tokio::test(flavor = "multi_thread")]
async fn a_target_topic_the_flow_may_not_write_is_named_until_it_is_granted() -> Result<()> {
    let world = World::from_env()?;
    let secure = SecureKafka::from_env()?;
    let target_secure = std::env::var("MF_TARGET_SECURE_BOOTSTRAP")
        .context("MF_TARGET_SECURE_BOOTSTRAP is not set: run through e2e/test.sh")?;
    let (source_alias, target_alias) = (unique("src"), unique("tgt"));
    let topic = unique("unwritable");
    let remote = format!("{source_alias}.{topic}");
    let positions = format!("mirrorflow-positions.{source_alias}.internal");
    kafka::create_topic(&world.source_bootstrap, &topic, 1).await?;
    kafka::produce_values(&world.source_bootstrap, &topic, 3, 1).await?;
    kafka::create_topic(&world.target_bootstrap, &remote, 1).await?;
    let target = admin(Side::Target, &world.target_bootstrap)?;
    let granted = target
        .create_acls(vec![
            allow(&remote, "User:reader", Operation::Read),
            allow(&remote, "User:reader", Operation::Describe),
        ])
        .await?;
    ensure!(granted.is_empty(), "creating the ACLs: {granted:?}");

    let name = unique("unwritable");
    let dir = std::env::temp_dir().join("mirrorflow-e2e").join(&name);
    let secrets = dir.join("secrets");
    for (secret, key, value) in [
        ("reader", "username", "reader".to_string()),
        ("reader", "password", secure.password.clone()),
        ("kafka-ca", "ca.crt", secure.ca_pem.clone()),
    ] {
        std::fs::create_dir_all(secrets.join(secret))?;
        std::fs::write(secrets.join(secret).join(key), value)?;
    }
    // Config and ACL sync off: `reader` may not alter the remote topic either, which would be
    // refused changes of their own.
    let flow = format!(
        "source: {{alias: {source_alias}, bootstrapServers: '{}'}}\n\
         target:\n  alias: {target_alias}\n  bootstrapServers: '{target_secure}'\n  \
         tls: {{caSecretRef: {{name: kafka-ca, key: ca.crt}}}}\n  \
         sasl: {{mechanism: SCRAM-SHA-512, usernameSecretRef: {{name: reader, key: username}}, \
         passwordSecretRef: {{name: reader, key: password}}}}\n\
         topics: ['{topic}']\n\
         checkpoints: {{enabled: false}}\n\
         heartbeats: {{enabled: false}}\n\
         sourceLoop: {{topicsRefreshInterval: {}s, syncTopicConfigs: false, syncTopicAcls: false}}\n",
        world.source_bootstrap,
        REFRESH.as_secs()
    );
    // The file the replicator runs from too: one flow name, so the probe sees the replicator's
    // claim as its own flow's.
    let flow_file = dir.join("flow.yaml");
    std::fs::write(&flow_file, &flow)?;
    // The positions topic, made here so the probe has two topics to judge.
    kafka::create_topic_with(
        &world.target_bootstrap,
        &positions,
        1,
        &[("cleanup.policy", "compact")],
    )
    .await?;
    let replicating = || {
        measured_condition_with_secrets(&world.repo_root, &flow_file, Some(&secrets), "Replicating")
    };
    let denied = replicating()?;
    let message = denied["message"].as_str().unwrap_or_default();
    println!("denied: {denied}");
    ensure!(
        denied["status"] == "False" && denied["reason"] == "TopicChangesRefused",
        "without WRITE on {remote}: {denied}"
    );
    ensure!(
        message.contains(&format!(
            "{remote}: the target cluster does not let the replicator write to {remote}"
        )) && message.contains("not WRITE")
            && message.contains("grant the flow's target principal WRITE"),
        "the message does not name {remote} and the grant: {message}"
    );
    ensure!(
        !message.contains(&positions),
        "the positions topic, open to everyone, is named: {message}"
    );

    let granted = target
        .create_acls(vec![allow(&remote, "User:reader", Operation::Write)])
        .await?;
    ensure!(granted.is_empty(), "creating the WRITE ACL: {granted:?}");
    let replicator = Replicator::start(&world.repo_root, &name, &flow, free_port()?)?;
    eventually("the 3 records on the remote topic", WAIT, || async {
        let copied = kafka::read_partition(&world.target_bootstrap, &remote, 0)?;
        Ok((copied.len() >= 3).then_some(()))
    })
    .await
    .with_context(|| replicator.log_text())?;
    // The refusal clears as soon as the replicator writes the topic; the condition turns True
    // once its heartbeats are replicated too, a moment later (NoHeartbeats until then).
    let mut last = serde_json::Value::Null;
    let cleared = eventually("Replicating True with WRITE granted", WAIT, || {
        let c = replicating();
        if let Ok(c) = &c {
            last = c.clone();
        }
        async move {
            let c = c?;
            Ok((c["status"] == "True").then_some(c))
        }
    })
    .await
    .with_context(|| format!("with WRITE granted and the records copied: {last}"))?;
    println!("granted: {cleared}");
    Ok(())
}
