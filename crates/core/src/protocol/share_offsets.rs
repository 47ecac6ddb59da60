//! Where a share group's consumers are (KIP-932): each share-partition's start offset, the
//! first offset not yet acknowledged, which the share coordinator keeps instead of committed
//! offsets. Read with DescribeShareGroupOffsets v0 and set with AlterShareGroupOffsets v0
//! (both flexible: request header v2, answer header v1, compact strings and arrays), each
//! sent to the group's coordinator, found with FindCoordinator v2.
//!
//! Answers are bounded by their own bytes like every decoder here: no count is trusted
//! beyond the bytes left to hold it.

use super::{
    ALTER_SHARE_GROUP_OFFSETS_VERSION, API_ALTER_SHARE_GROUP_OFFSETS,
    API_DESCRIBE_SHARE_GROUP_OFFSETS, API_FIND_COORDINATOR, DESCRIBE_SHARE_GROUP_OFFSETS_VERSION,
    ErrorCode, FIND_COORDINATOR_VERSION, finish_frame, flexible_frame, frame,
};
use crate::wire::{DecodeError, EncodeError, Reader};

/// FindCoordinator's key type for a group (of any type: share groups too).
const GROUP_KEY: i8 = 0;

pub fn find_coordinator_request(
    correlation_id: i32,
    client_id: &str,
    group: &str,
) -> Result<Vec<u8>, EncodeError> {
    let mut w = frame(
        API_FIND_COORDINATOR,
        FIND_COORDINATOR_VERSION,
        correlation_id,
        client_id,
        group.len() + 3,
    )?;
    w.string("key", group)?.i8(GROUP_KEY);
    finish_frame(w)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coordinator {
    pub error: ErrorCode,
    pub message: String,
    /// The broker to ask, by the node id the cluster's metadata addresses (the answer's own
    /// host and port are not used: a copy connects only where metadata points).
    pub node_id: i32,
}

pub fn decode_find_coordinator(body: &[u8]) -> Result<Coordinator, DecodeError> {
    let mut r = Reader::new(body);
    r.i32("throttle_time_ms")?;
    let error = ErrorCode(r.i16("error_code")?);
    let message = r.nullable_string("error_message")?;
    let node_id = r.i32("node_id")?;
    r.string("host")?;
    r.i32("port")?;
    Ok(Coordinator {
        error,
        message,
        node_id,
    })
}

/// Every share-partition of `group`, of every topic it consumed.
pub fn describe_share_group_offsets_request(
    correlation_id: i32,
    client_id: &str,
    group: &str,
) -> Result<Vec<u8>, EncodeError> {
    let mut w = flexible_frame(
        API_DESCRIBE_SHARE_GROUP_OFFSETS,
        DESCRIBE_SHARE_GROUP_OFFSETS_VERSION,
        correlation_id,
        client_id,
        group.len() + 8,
    )?;
    w.compact_len("groups", 1)?;
    w.compact_string("group_id", group)?;
    // A null topic array: every topic-partition the group has a start offset for.
    w.uvarint(0);
    w.no_tagged_fields().no_tagged_fields();
    finish_frame(w)
}

/// One share-partition's start offset, or why the coordinator has none to give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareStart {
    pub topic: String,
    pub partition: i32,
    /// -1 when the coordinator keeps no start offset for the partition (yet).
    pub start_offset: i64,
    pub error: ErrorCode,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupOffsets {
    pub group: String,
    pub error: ErrorCode,
    pub message: String,
    pub partitions: Vec<ShareStart>,
}

/// A group's answer that is an error: the coordinator's code and words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRefused {
    pub error: ErrorCode,
    pub message: String,
}

impl ShareGroupOffsets {
    /// The start offsets the coordinator keeps, as `(topic, partition, start offset)`: a
    /// partition without one (an error, or -1: nothing acknowledged yet) is left out, and a
    /// group the coordinator does not know has none (it is made by the first share consumer or
    /// by setting its start offsets). Any other error of the group is the caller's to name.
    pub fn starts(self) -> Result<Vec<(String, i32, i64)>, GroupRefused> {
        match self.error.name() {
            "NONE" => {}
            "GROUP_ID_NOT_FOUND" => return Ok(Vec::new()),
            _ => {
                return Err(GroupRefused {
                    error: self.error,
                    message: self.message,
                });
            }
        }
        Ok((self.partitions.into_iter())
            .filter(|p| !p.error.is_error() && p.start_offset >= 0)
            .map(|p| (p.topic, p.partition, p.start_offset))
            .collect())
    }
}

/// The answer for the one group asked (the first the answer names; none is an error).
pub fn decode_describe_share_group_offsets(body: &[u8]) -> Result<ShareGroupOffsets, DecodeError> {
    let mut r = Reader::new(body);
    r.skip_tagged_fields()?;
    r.i32("throttle_time_ms")?;
    let groups = r.compact_array_len("groups")?;
    if groups == 0 {
        return Err(DecodeError::Mismatch {
            field: "groups",
            expected: 1,
            got: 0,
        });
    }
    let group = r.compact_string("group_id")?;
    let mut partitions = Vec::new();
    for _ in 0..r.compact_array_len("topics")? {
        let topic = r.compact_string("topic_name")?;
        r.skip_uuid("topic_id")?;
        for _ in 0..r.compact_array_len("partitions")? {
            let partition = r.i32("partition_index")?;
            let start_offset = r.i64("start_offset")?;
            r.i32("leader_epoch")?;
            let error = ErrorCode(r.i16("error_code")?);
            r.compact_nullable_string("error_message")?;
            r.skip_tagged_fields()?;
            partitions.push(ShareStart {
                topic: topic.clone(),
                partition,
                start_offset: start_offset.clamp(-1, crate::wire::MAX_OFFSET),
                error,
            });
        }
        r.skip_tagged_fields()?;
    }
    let error = ErrorCode(r.i16("error_code")?);
    let message = r.compact_nullable_string("error_message")?;
    r.skip_tagged_fields()?;
    Ok(ShareGroupOffsets {
        group,
        error,
        message,
        partitions,
    })
}

/// Sets `group`'s start offsets: `(topic, partition, start offset)`, grouped by topic in the
/// order given. The coordinator refuses while the group has members (NON_EMPTY_GROUP).
pub fn alter_share_group_offsets_request(
    correlation_id: i32,
    client_id: &str,
    group: &str,
    starts: &[(&str, i32, i64)],
) -> Result<Vec<u8>, EncodeError> {
    let mut topics: Vec<(&str, Vec<(i32, i64)>)> = Vec::new();
    for &(topic, partition, offset) in starts {
        match topics.iter_mut().find(|(t, _)| *t == topic) {
            Some((_, parts)) => parts.push((partition, offset)),
            None => topics.push((topic, vec![(partition, offset)])),
        }
    }
    let mut w = flexible_frame(
        API_ALTER_SHARE_GROUP_OFFSETS,
        ALTER_SHARE_GROUP_OFFSETS_VERSION,
        correlation_id,
        client_id,
        group.len() + starts.len().saturating_mul(16) + 8,
    )?;
    w.compact_string("group_id", group)?;
    w.compact_len("topics", topics.len())?;
    for (topic, parts) in &topics {
        w.compact_string("topic_name", topic)?;
        w.compact_len("partitions", parts.len())?;
        for &(partition, offset) in parts {
            w.non_negative_i32("partition_index", partition)?;
            w.non_negative_i64("start_offset", offset)?;
            w.no_tagged_fields();
        }
        w.no_tagged_fields();
    }
    w.no_tagged_fields();
    finish_frame(w)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlteredStart {
    pub topic: String,
    pub partition: i32,
    pub error: ErrorCode,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlteredShareGroupOffsets {
    pub error: ErrorCode,
    pub message: String,
    pub partitions: Vec<AlteredStart>,
}

pub fn decode_alter_share_group_offsets(
    body: &[u8],
) -> Result<AlteredShareGroupOffsets, DecodeError> {
    let mut r = Reader::new(body);
    r.skip_tagged_fields()?;
    r.i32("throttle_time_ms")?;
    let error = ErrorCode(r.i16("error_code")?);
    let message = r.compact_nullable_string("error_message")?;
    let mut partitions = Vec::new();
    for _ in 0..r.compact_array_len("responses")? {
        let topic = r.compact_string("topic_name")?;
        r.skip_uuid("topic_id")?;
        for _ in 0..r.compact_array_len("partitions")? {
            let partition = r.i32("partition_index")?;
            let error = ErrorCode(r.i16("error_code")?);
            let message = r.compact_nullable_string("error_message")?;
            r.skip_tagged_fields()?;
            partitions.push(AlteredStart {
                topic: topic.clone(),
                partition,
                error,
                message,
            });
        }
        r.skip_tagged_fields()?;
    }
    Ok(AlteredShareGroupOffsets {
        error,
        message,
        partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::Fields as Bytes;

    #[test]
    fn a_find_coordinator_request_names_the_group_as_a_group_key() {
        let expected = (Bytes::default().i16(10).i16(2).i32(4).string("mf"))
            .string("orders-queue")
            .i8(0)
            .framed();
        assert_eq!(
            find_coordinator_request(4, "mf", "orders-queue"),
            Ok(expected)
        );
    }

    #[test]
    fn the_coordinator_is_named_by_its_node_id() {
        let body = (Bytes::default().i32(0).i16(0).i16(-1).i32(3))
            .string("elsewhere.example")
            .i32(9092);
        let c = decode_find_coordinator(&body.0).expect("well-formed answer");
        assert_eq!(
            (c.error, c.node_id, c.message.as_str()),
            (ErrorCode::NONE, 3, "")
        );
    }

    #[test]
    fn a_describe_request_asks_one_group_for_every_topic() {
        let expected = (Bytes::default()
            .i16(90)
            .i16(0)
            .i32(5)
            .string("mf")
            .uvarint(0))
        .uvarint(2)
        .compact_string("q")
        .uvarint(0)
        .uvarint(0)
        .uvarint(0)
        .framed();
        assert_eq!(
            describe_share_group_offsets_request(5, "mf", "q"),
            Ok(expected)
        );
    }

    fn partition(b: Bytes, index: i32, start: i64, error: i16) -> Bytes {
        b.i32(index)
            .i64(start)
            .i32(7)
            .i16(error)
            .uvarint(0)
            .uvarint(0)
    }

    fn described() -> Bytes {
        let b = (Bytes::default().uvarint(0).i32(0).uvarint(2))
            .compact_string("q")
            .uvarint(3)
            .compact_string("orders")
            .raw(&[0xab; 16])
            .uvarint(3);
        let b = partition(partition(b, 0, 41, 0), 1, -1, 0).uvarint(0);
        let b = b.compact_string("audit").raw(&[0xcd; 16]).uvarint(2);
        partition(b, 4, 0, 29)
            .uvarint(0)
            .i16(0)
            .uvarint(0)
            .uvarint(0)
    }

    #[test]
    fn every_share_partition_comes_with_its_start_offset_or_error() {
        let got = decode_describe_share_group_offsets(&described().0).expect("well-formed");
        assert_eq!((got.group.as_str(), got.error), ("q", ErrorCode::NONE));
        let starts: Vec<(&str, i32, i64, i16)> = (got.partitions.iter())
            .map(|p| (p.topic.as_str(), p.partition, p.start_offset, p.error.0))
            .collect();
        assert_eq!(
            starts,
            [
                ("orders", 0, 41, 0),
                ("orders", 1, -1, 0),
                ("audit", 4, 0, 29)
            ]
        );
    }

    #[test]
    fn only_kept_start_offsets_are_starts_and_an_unknown_group_has_none() {
        let got = decode_describe_share_group_offsets(&described().0).expect("well-formed");
        // -1 (nothing acknowledged) and a partition's error are not start offsets.
        assert_eq!(got.clone().starts(), Ok(vec![("orders".into(), 0, 41)]));
        let unknown = ShareGroupOffsets {
            error: ErrorCode(69),
            ..got.clone()
        };
        assert_eq!(unknown.starts(), Ok(Vec::new()));
        let refused = ShareGroupOffsets {
            error: ErrorCode(30),
            message: "no".into(),
            ..got
        };
        assert_eq!(
            refused.starts(),
            Err(GroupRefused {
                error: ErrorCode(30),
                message: "no".into()
            })
        );
    }

    #[test]
    fn a_describe_answer_cut_anywhere_or_counting_beyond_its_bytes_is_an_error() {
        let whole = described().0;
        // Everything up to the one group's end is read; the answer's own tagged fields after it
        // are left, like any trailing bytes.
        for end in 0..whole.len() - 1 {
            assert!(
                decode_describe_share_group_offsets(&whole[..end]).is_err(),
                "{end}"
            );
        }
        // The topic count forged to four billion: refused before anything is kept for it.
        let forged = (Bytes::default().uvarint(0).i32(0).uvarint(2))
            .compact_string("q")
            .uvarint(u32::MAX);
        assert!(matches!(
            decode_describe_share_group_offsets(&forged.0),
            Err(DecodeError::Truncated { .. } | DecodeError::BadVarint { .. })
        ));
    }

    #[test]
    fn an_alter_request_groups_partitions_by_topic() {
        let starts = [("orders", 0, 41), ("audit", 4, 0), ("orders", 1, 7)];
        let expected = (Bytes::default()
            .i16(91)
            .i16(0)
            .i32(6)
            .string("mf")
            .uvarint(0))
        .compact_string("q")
        .uvarint(3)
        .compact_string("orders")
        .uvarint(3)
        .i32(0)
        .i64(41)
        .uvarint(0)
        .i32(1)
        .i64(7)
        .uvarint(0)
        .uvarint(0)
        .compact_string("audit")
        .uvarint(2)
        .i32(4)
        .i64(0)
        .uvarint(0)
        .uvarint(0)
        .uvarint(0)
        .framed();
        assert_eq!(
            alter_share_group_offsets_request(6, "mf", "q", &starts),
            Ok(expected)
        );
        assert!(alter_share_group_offsets_request(6, "mf", "q", &[("orders", 0, -1)]).is_err());
    }

    #[test]
    fn an_alter_answer_names_each_partition_and_the_group_error() {
        let body = (Bytes::default()
            .uvarint(0)
            .i32(0)
            .i16(0)
            .uvarint(0)
            .uvarint(2))
        .compact_string("orders")
        .raw(&[0; 16])
        .uvarint(2)
        .i32(0)
        .i16(0)
        .uvarint(0)
        .uvarint(0)
        .uvarint(0)
        .uvarint(0);
        let got = decode_alter_share_group_offsets(&body.0).expect("well-formed");
        assert_eq!(got.error, ErrorCode::NONE);
        assert_eq!(got.partitions.len(), 1);
        assert_eq!(
            (got.partitions[0].partition, got.partitions[0].error),
            (0, ErrorCode::NONE)
        );
        let refused = (Bytes::default().uvarint(0).i32(0).i16(68))
            .compact_string("the group has members")
            .uvarint(1)
            .uvarint(0);
        let got = decode_alter_share_group_offsets(&refused.0).expect("well-formed");
        assert_eq!(
            (got.error.name(), got.message.as_str()),
            ("NON_EMPTY_GROUP", "the group has members")
        );
    }
}
