//! Requests to a group's coordinator: a share group's start offsets (KIP-932), read and set
//! (what a share group's checkpoint is made of, and what a failover sets on the target), and a
//! streams group's members (KIP-1071), which the consumer-group descriptions do not see.

use mirrorflow_core::protocol::share_offsets::{self, AlteredShareGroupOffsets, ShareGroupOffsets};
use mirrorflow_core::protocol::streams_groups::{self, StreamsGroup};
use mirrorflow_core::protocol::{self};

use super::{Cluster, MAX_BOOTSTRAP};
use crate::{Conn, ConnError};

impl Cluster {
    /// The node id of the broker coordinating `group`, found through the metadata
    /// connection. Metadata is read first when there is no such connection yet, and again
    /// when the coordinator is a broker it did not name, so a series of groups costs one
    /// metadata request, not one each.
    fn coordinator(&mut self, group: &str) -> Result<i32, ConnError> {
        if self.metadata_conn.is_none() || self.addresses.is_empty() {
            self.metadata(&[])?;
        }
        let node = self.find_coordinator(group)?;
        if !self.addresses.contains_key(&node) {
            self.metadata(&[])?;
        }
        Ok(node)
    }

    fn find_coordinator(&mut self, group: &str) -> Result<i32, ConnError> {
        let conn = (self.metadata_conn.as_mut()).ok_or(ConnError::Bootstrap {
            count: 0,
            max: MAX_BOOTSTRAP,
        })?;
        conn.require(
            protocol::API_FIND_COORDINATOR,
            "FindCoordinator",
            protocol::FIND_COORDINATOR_VERSION,
        )?;
        let found = match conn.ask(
            |id, client| share_offsets::find_coordinator_request(id, client, group),
            share_offsets::decode_find_coordinator,
        ) {
            Ok(found) => found,
            Err(e) => {
                // A connection that failed is not asked again: the next call reads metadata
                // on a new one.
                self.metadata_conn = None;
                return Err(e);
            }
        };
        conn.check("FindCoordinator", found.error, &found.message)?;
        Ok(found.node_id)
    }

    /// Asks `group`'s coordinator with `ask`; the connection is closed when that fails.
    fn ask_coordinator<T>(
        &mut self,
        group: &str,
        ask: impl FnOnce(&mut Conn) -> Result<T, ConnError>,
    ) -> Result<T, ConnError> {
        let node = self.coordinator(group)?;
        let answer = self.broker_at_rest(node).and_then(ask);
        if answer.is_err() {
            self.forget(node);
        }
        answer
    }

    /// Every start offset the share coordinator keeps for `group`. A group-level error
    /// (GROUP_ID_NOT_FOUND: no such share group) comes back in the answer for the caller to
    /// read; an error to reach or read the coordinator is an `Err`.
    pub fn share_group_offsets(&mut self, group: &str) -> Result<ShareGroupOffsets, ConnError> {
        self.ask_coordinator(group, |conn| {
            conn.require(
                protocol::API_DESCRIBE_SHARE_GROUP_OFFSETS,
                "DescribeShareGroupOffsets",
                protocol::DESCRIBE_SHARE_GROUP_OFFSETS_VERSION,
            )?;
            conn.ask(
                |id, client| share_offsets::describe_share_group_offsets_request(id, client, group),
                share_offsets::decode_describe_share_group_offsets,
            )
        })
    }

    /// `group`'s state and member count as a streams group; GROUP_ID_NOT_FOUND in the answer
    /// when no streams group has that name (also for a group of another type).
    pub fn describe_streams_group(&mut self, group: &str) -> Result<StreamsGroup, ConnError> {
        self.ask_coordinator(group, |conn| {
            conn.require(
                protocol::API_STREAMS_GROUP_DESCRIBE,
                "StreamsGroupDescribe",
                protocol::STREAMS_GROUP_DESCRIBE_VERSION,
            )?;
            conn.ask(
                |id, client| streams_groups::streams_group_describe_request(id, client, group),
                streams_groups::decode_streams_group_describe,
            )
        })
    }

    /// Sets `group`'s start offsets (`(topic, partition, offset)`); the answer says, per
    /// partition and for the group (NON_EMPTY_GROUP while it has members), what was refused.
    pub fn alter_share_group_offsets(
        &mut self,
        group: &str,
        starts: &[(&str, i32, i64)],
    ) -> Result<AlteredShareGroupOffsets, ConnError> {
        self.ask_coordinator(group, |conn| {
            conn.require(
                protocol::API_ALTER_SHARE_GROUP_OFFSETS,
                "AlterShareGroupOffsets",
                protocol::ALTER_SHARE_GROUP_OFFSETS_VERSION,
            )?;
            conn.ask(
                |id, client| {
                    share_offsets::alter_share_group_offsets_request(id, client, group, starts)
                },
                share_offsets::decode_alter_share_group_offsets,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{answer, metadata_body, scripted, string};
    use super::*;
    use crate::Security;

    /// A cluster of one broker (node 1) that coordinates every group and answers `body` to
    /// the one request sent to it.
    fn coordinating(body: &[u8], api: i16, version: i16) -> Cluster {
        let mut cluster = Cluster::new(
            "127.0.0.1:1",
            Security::default(),
            super::super::tests::options(),
        )
        .expect("one address");
        let mut found = Vec::new();
        found.extend_from_slice(&0_i32.to_be_bytes());
        found.extend_from_slice(&0_i16.to_be_bytes());
        found.extend_from_slice(&(-1_i16).to_be_bytes());
        found.extend_from_slice(&1_i32.to_be_bytes());
        string(&mut found, "b1");
        found.extend_from_slice(&9092_i32.to_be_bytes());
        let mut script = answer(0, &metadata_body(1));
        script.extend(answer(1, &found));
        let mut metadata = scripted("m", script);
        metadata.serve(protocol::API_METADATA, protocol::METADATA_VERSION);
        metadata.serve(
            protocol::API_FIND_COORDINATOR,
            protocol::FIND_COORDINATOR_VERSION,
        );
        cluster.adopt_metadata(metadata);
        // Answer header v1: the correlation id, then no tagged fields.
        let mut flexible = vec![0];
        flexible.extend_from_slice(body);
        let mut coordinator = scripted("b1:9092", answer(0, &flexible));
        coordinator.serve(api, version);
        cluster.adopt(1, coordinator);
        cluster
    }

    #[test]
    fn start_offsets_are_read_from_the_coordinator() {
        let mut body = 0_i32.to_be_bytes().to_vec();
        body.extend([2, 2, b'q', 2, 2, b'o']);
        body.extend([0; 16]);
        body.push(2);
        body.extend_from_slice(&3_i32.to_be_bytes());
        body.extend_from_slice(&41_i64.to_be_bytes());
        body.extend_from_slice(&0_i32.to_be_bytes());
        body.extend_from_slice(&0_i16.to_be_bytes());
        body.extend([0, 0, 0]);
        body.extend_from_slice(&0_i16.to_be_bytes());
        body.extend([0, 0]);
        let mut cluster = coordinating(
            &body,
            protocol::API_DESCRIBE_SHARE_GROUP_OFFSETS,
            protocol::DESCRIBE_SHARE_GROUP_OFFSETS_VERSION,
        );
        let got = cluster.share_group_offsets("q").expect("answered");
        assert_eq!(got.partitions.len(), 1);
        assert_eq!(
            (
                got.partitions[0].topic.as_str(),
                got.partitions[0].start_offset
            ),
            ("o", 41)
        );
    }

    #[test]
    fn a_metadata_connection_that_fails_a_find_coordinator_is_dropped() {
        // The metadata connection answers metadata, then nothing: FindCoordinator fails.
        let mut cluster = Cluster::new(
            "127.0.0.1:1",
            Security::default(),
            super::super::tests::options(),
        )
        .expect("one address");
        let mut metadata = scripted("m", answer(0, &metadata_body(1)));
        metadata.serve(protocol::API_METADATA, protocol::METADATA_VERSION);
        metadata.serve(
            protocol::API_FIND_COORDINATOR,
            protocol::FIND_COORDINATOR_VERSION,
        );
        cluster.adopt_metadata(metadata);
        assert!(cluster.share_group_offsets("q").is_err());
        assert!(cluster.metadata_conn.is_none(), "not asked again");
    }

    #[test]
    fn a_coordinator_without_the_api_is_unsupported_and_forgotten() {
        let mut cluster = coordinating(
            &[],
            protocol::API_LIST_GROUPS,
            protocol::LIST_GROUPS_VERSION,
        );
        assert!(matches!(
            cluster.alter_share_group_offsets("q", &[("o", 0, 1)]),
            Err(ConnError::Unsupported {
                api: "AlterShareGroupOffsets",
                ..
            })
        ));
        assert!(cluster.connected(1).is_none());
    }
}
