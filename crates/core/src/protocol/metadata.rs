//! Metadata v8: which broker leads each partition of the topics a copy reads or writes, and
//! where each broker listens (on the listener the request came in on).

use super::{API_METADATA, ErrorCode, METADATA_VERSION, finish_frame, frame};
use crate::wire::{DecodeError, EncodeError, Reader};

/// Asks for `topics`' partitions and leaders, never creating a topic (a copy creates its
/// topics on purpose, with their settings, elsewhere).
pub fn metadata_request(
    correlation_id: i32,
    client_id: &str,
    topics: &[&str],
) -> Result<Vec<u8>, EncodeError> {
    let names: usize = topics.iter().map(|t| t.len() + 2).sum();
    let mut w = frame(
        API_METADATA,
        METADATA_VERSION,
        correlation_id,
        client_id,
        8 + names,
    )?;
    w.len("topics", topics.len())?;
    for topic in topics {
        w.string("topic", topic)?;
    }
    w.i8(0) // allow_auto_topic_creation
        .i8(0) // include_cluster_authorized_operations
        .i8(0); // include_topic_authorized_operations
    finish_frame(w)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
}

impl Broker {
    /// `host:port`, with brackets around an IPv6 address.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLeader {
    pub partition: i32,
    pub error: ErrorCode,
    /// -1 while the partition has none.
    pub leader: i32,
    pub leader_epoch: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    pub name: String,
    pub error: ErrorCode,
    pub partitions: Vec<PartitionLeader>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    pub brokers: Vec<Broker>,
    pub controller: i32,
    pub topics: Vec<TopicMetadata>,
}

impl Metadata {
    pub fn broker(&self, node_id: i32) -> Option<&Broker> {
        self.brokers.iter().find(|b| b.node_id == node_id)
    }

    pub fn topic(&self, name: &str) -> Option<&TopicMetadata> {
        self.topics.iter().find(|t| t.name == name)
    }
}

pub fn decode_metadata(body: &[u8]) -> Result<Metadata, DecodeError> {
    let mut r = Reader::new(body);
    r.i32("throttle_time_ms")?;
    let mut brokers = Vec::new();
    for _ in 0..r.array_len("brokers")? {
        let node_id = r.i32("node_id")?;
        let host = r.string("host")?;
        let port = r.i32("port")?;
        if !(1..=65535).contains(&port) {
            return Err(DecodeError::OutOfRange {
                field: "port",
                value: i64::from(port),
                min: 1,
                max: 65535,
            });
        }
        r.nullable_string("rack")?;
        brokers.push(Broker {
            node_id,
            host,
            port,
        });
    }
    r.nullable_string("cluster_id")?;
    let controller = r.i32("controller_id")?;
    let mut topics = Vec::new();
    for _ in 0..r.array_len("topics")? {
        let error = ErrorCode(r.i16("error_code")?);
        let name = r.string("name")?;
        r.i8("is_internal")?;
        let mut partitions = Vec::new();
        for _ in 0..r.array_len("partitions")? {
            let error = ErrorCode(r.i16("error_code")?);
            let partition = r.i32("partition_index")?;
            let leader = r.i32("leader_id")?;
            let leader_epoch = r.i32("leader_epoch")?;
            for field in ["replica_nodes", "isr_nodes", "offline_replicas"] {
                for _ in 0..r.array_len(field)? {
                    r.i32(field)?;
                }
            }
            partitions.push(PartitionLeader {
                partition,
                error,
                leader,
                leader_epoch,
            });
        }
        r.i32("topic_authorized_operations")?;
        topics.push(TopicMetadata {
            name,
            error,
            partitions,
        });
    }
    r.i32("cluster_authorized_operations")?;
    Ok(Metadata {
        brokers,
        controller,
        topics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::Fields as Bytes;

    #[test]
    fn a_metadata_request_never_asks_for_a_topic_to_be_created() {
        let expected = Bytes::default()
            .i16(3)
            .i16(8)
            .i32(4)
            .string("mf")
            .i32(1)
            .string("orders")
            .i8(0)
            .i8(0)
            .i8(0)
            .framed();
        assert_eq!(metadata_request(4, "mf", &["orders"]), Ok(expected));
    }

    fn answer(port: i32) -> Bytes {
        Bytes::default()
            .i32(0)
            .i32(2)
            .i32(1)
            .string("10.0.0.1")
            .i32(9092)
            .i16(-1)
            .i32(2)
            .string("::1")
            .i32(port)
            .string("rack-b")
            .string("cluster")
            .i32(1)
            .i32(2)
            // orders: partition 0 led by 2, partition 1 without a leader
            .i16(0)
            .string("orders")
            .i8(0)
            .i32(2)
            .i16(0)
            .i32(0)
            .i32(2)
            .i32(7)
            .i32(2)
            .i32(1)
            .i32(2)
            .i32(1)
            .i32(2)
            .i32(0)
            .i16(5)
            .i32(1)
            .i32(-1)
            .i32(3)
            .i32(0)
            .i32(-1)
            .i32(-1)
            .i32(0)
            // missing: unknown
            .i16(3)
            .string("missing")
            .i8(0)
            .i32(0)
            .i32(0)
            .i32(0)
    }

    #[test]
    fn a_metadata_answer_gives_each_partition_its_leader_and_each_leader_an_address() {
        let metadata = decode_metadata(&answer(9093).0).expect("well-formed answer");
        assert_eq!(metadata.controller, 1);
        let orders = metadata.topic("orders").expect("orders listed");
        assert_eq!(orders.partitions[0].leader, 2);
        assert_eq!(orders.partitions[0].leader_epoch, 7);
        assert_eq!(orders.partitions[1].leader, -1);
        assert_eq!(orders.partitions[1].error.name(), "LEADER_NOT_AVAILABLE");
        assert_eq!(
            metadata.broker(2).map(Broker::address).as_deref(),
            Some("[::1]:9093")
        );
        assert_eq!(
            metadata.broker(1).map(Broker::address).as_deref(),
            Some("10.0.0.1:9092")
        );
        let missing = metadata.topic("missing").expect("missing listed");
        assert_eq!(missing.error.name(), "UNKNOWN_TOPIC_OR_PARTITION");
    }

    #[test]
    fn a_broker_port_outside_tcp_is_refused() {
        for port in [0, -1, 65536] {
            assert!(decode_metadata(&answer(port).0).is_err(), "port {port}");
        }
    }

    #[test]
    fn a_cut_metadata_answer_is_an_error_at_every_length() {
        let whole = answer(9093).0;
        for len in 0..whole.len() {
            assert!(decode_metadata(&whole[..len]).is_err(), "cut at {len}");
        }
    }
}
