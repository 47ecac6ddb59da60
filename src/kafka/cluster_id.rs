//! Which Kafka cluster a client configuration reaches: the id its brokers report (KRaft and
//! ZooKeeper clusters alike, since Kafka 0.10.1). Two bootstrap strings for one cluster (a load
//! balancer and a broker list, `localhost` and `127.0.0.1`) share one id.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// The cluster id, or `None` when the cluster did not answer within `timeout` (blocking).
pub fn cluster_id(config: &ClientConfig, timeout: Duration) -> Option<String> {
    let mut c = config.clone();
    // A consumer without a group joins nothing; it is only a metadata client here.
    c.set("enable.auto.commit", "false");
    let client: BaseConsumer = c.create().ok()?;
    client.client().fetch_cluster_id(timeout)
}

/// Why a flow must not run: its target is its own source. `None` when the ids differ or one
/// is unknown.
pub fn same_cluster_message(source: Option<&str>, target: Option<&str>) -> Option<String> {
    match (source, target) {
        (Some(s), Some(t)) if s == t => Some(format!(
            "spec.target.bootstrapServers: reaches the same Kafka cluster (id {t}) as spec.source.bootstrapServers; a flow into its own source would copy its own copies again and again, so nothing is deployed and no topic is created; point spec.target at another cluster"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_two_known_equal_ids_are_one_cluster() {
        assert!(same_cluster_message(Some("X"), Some("X")).is_some_and(|m| m.contains("id X")));
        assert_eq!(same_cluster_message(Some("X"), Some("Y")), None);
        assert_eq!(same_cluster_message(None, Some("Y")), None);
        assert_eq!(same_cluster_message(None, None), None);
    }

    #[test]
    fn an_unreachable_cluster_has_no_id() {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", "127.0.0.1:1");
        assert_eq!(cluster_id(&c, Duration::from_millis(300)), None);
    }
}
