//! A streams group's state and member count (KIP-1071) with StreamsGroupDescribe v0
//! (flexible), sent to the group's coordinator. The consumer-group descriptions answer a
//! streams group as if there were none of that name, so a tool that commits only into idle
//! groups needs this one to see its members.
//!
//! Only what that needs is kept: the state and how many members; the topology before the
//! members is read through and dropped, every count bounded by the answer's own bytes.

use super::{
    API_STREAMS_GROUP_DESCRIBE, ErrorCode, STREAMS_GROUP_DESCRIBE_VERSION, finish_frame,
    flexible_frame,
};
use crate::wire::{DecodeError, EncodeError, Reader};

pub fn streams_group_describe_request(
    correlation_id: i32,
    client_id: &str,
    group: &str,
) -> Result<Vec<u8>, EncodeError> {
    let mut w = flexible_frame(
        API_STREAMS_GROUP_DESCRIBE,
        STREAMS_GROUP_DESCRIBE_VERSION,
        correlation_id,
        client_id,
        group.len() + 8,
    )?;
    w.compact_len("group_ids", 1)?;
    w.compact_string("group_id", group)?;
    // No authorized operations asked for.
    w.i8(0);
    w.no_tagged_fields();
    finish_frame(w)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamsGroup {
    /// GROUP_ID_NOT_FOUND also for a group of another type.
    pub error: ErrorCode,
    pub message: String,
    pub group: String,
    /// `Empty`, `NotReady`, `Assigning`, `Reconciling`, `Stable`, `Dead`.
    pub state: String,
    pub members: usize,
}

/// The answer for the one group asked (the first the answer names; none is an error).
pub fn decode_streams_group_describe(body: &[u8]) -> Result<StreamsGroup, DecodeError> {
    let mut r = Reader::new(body);
    r.skip_tagged_fields()?;
    r.i32("throttle_time_ms")?;
    if r.compact_array_len("groups")? == 0 {
        return Err(DecodeError::Mismatch {
            field: "groups",
            expected: 1,
            got: 0,
        });
    }
    let error = ErrorCode(r.i16("error_code")?);
    let message = r.compact_nullable_string("error_message")?;
    let group = r.compact_string("group_id")?;
    let state = r.compact_string("group_state")?;
    r.i32("group_epoch")?;
    r.i32("assignment_epoch")?;
    skip_topology(&mut r)?;
    let members = r.compact_array_len("members")?;
    Ok(StreamsGroup {
        error,
        message,
        group,
        state,
        members,
    })
}

/// A nullable struct: -1 for null, 1 then its fields.
fn present(r: &mut Reader<'_>, field: &'static str) -> Result<bool, DecodeError> {
    match r.i8(field)? {
        -1 => Ok(false),
        1 => Ok(true),
        got => Err(DecodeError::Mismatch {
            field,
            expected: 1,
            got: i64::from(got),
        }),
    }
}

fn skip_topology(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    if !present(r, "topology")? {
        return Ok(());
    }
    r.i32("topology_epoch")?;
    for _ in 0..r.compact_array_len("subtopologies")? {
        r.compact_string("subtopology_id")?;
        for field in ["source_topics", "repartition_sink_topics"] {
            for _ in 0..r.compact_array_len(field)? {
                r.compact_string("topic")?;
            }
        }
        for field in ["state_changelog_topics", "repartition_source_topics"] {
            for _ in 0..r.compact_array_len(field)? {
                r.compact_string("topic_name")?;
                r.i32("partitions")?;
                r.i16("replication_factor")?;
                for _ in 0..r.compact_array_len("topic_configs")? {
                    r.compact_string("key")?;
                    r.compact_string("value")?;
                    r.skip_tagged_fields()?;
                }
                r.skip_tagged_fields()?;
            }
        }
        r.skip_tagged_fields()?;
    }
    r.skip_tagged_fields()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::Fields as Bytes;

    #[test]
    fn a_describe_request_asks_one_group_without_operations() {
        let expected = (Bytes::default()
            .i16(89)
            .i16(0)
            .i32(3)
            .string("mf")
            .uvarint(0))
        .uvarint(2)
        .compact_string("app")
        .i8(0)
        .uvarint(0)
        .framed();
        assert_eq!(streams_group_describe_request(3, "mf", "app"), Ok(expected));
    }

    fn topic_info(b: Bytes, name: &str) -> Bytes {
        (b.compact_string(name).i32(2).i16(1).uvarint(2))
            .compact_string("cleanup.policy")
            .compact_string("compact")
            .uvarint(0)
            .uvarint(0)
    }

    fn described(members: u32) -> Bytes {
        let b = (Bytes::default()
            .uvarint(0)
            .i32(0)
            .uvarint(2)
            .i16(0)
            .uvarint(0))
        .compact_string("app")
        .compact_string("Stable")
        .i32(4)
        .i32(4)
        .i8(1)
        .i32(2)
        .uvarint(2)
        .compact_string("0")
        .uvarint(2)
        .compact_string("orders")
        .uvarint(1)
        .uvarint(2);
        let b = topic_info(b, "app-store-changelog")
            .uvarint(1)
            .uvarint(0)
            .uvarint(0);
        // The members' own fields follow their count; only the count is read.
        b.uvarint(members + 1).raw(&vec![0; 64 * members as usize])
    }

    #[test]
    fn the_state_and_member_count_are_read_through_the_topology() {
        let got = decode_streams_group_describe(&described(2).0).expect("well-formed");
        assert_eq!(
            (
                got.error,
                got.group.as_str(),
                got.state.as_str(),
                got.members
            ),
            (ErrorCode::NONE, "app", "Stable", 2)
        );
        let empty = decode_streams_group_describe(&described(0).0).expect("well-formed");
        assert_eq!(empty.members, 0);
    }

    #[test]
    fn a_group_of_another_type_is_not_found_and_a_cut_answer_an_error() {
        let other = (Bytes::default().uvarint(0).i32(0).uvarint(2).i16(69))
            .compact_string("app is not a streams group")
            .compact_string("app")
            .compact_string("Dead")
            .i32(-1)
            .i32(-1)
            .i8(-1)
            .uvarint(1);
        let got = decode_streams_group_describe(&other.0).expect("well-formed");
        assert_eq!((got.error.name(), got.members), ("GROUP_ID_NOT_FOUND", 0));
        let whole = described(1).0;
        let members_start = whole.len() - 65;
        for end in 0..members_start {
            assert!(
                decode_streams_group_describe(&whole[..end]).is_err(),
                "{end}"
            );
        }
    }
}
