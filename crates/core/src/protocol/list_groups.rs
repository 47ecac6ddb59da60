//! ListGroups v2: the groups a broker coordinates, each with its protocol type. Share groups
//! (KIP-932) answer `share` and streams groups (KIP-1071) `streams`; consumer groups, of
//! either protocol, `consumer`, and groups that only ever committed offsets an empty type. A
//! cluster's groups are the union of every broker's answer.

use super::{API_LIST_GROUPS, ErrorCode, LIST_GROUPS_VERSION, finish_frame, frame};
use crate::wire::{DecodeError, EncodeError, Reader};

/// The request has no body in this version: every group of the broker, of every type.
pub fn list_groups_request(correlation_id: i32, client_id: &str) -> Result<Vec<u8>, EncodeError> {
    finish_frame(frame(
        API_LIST_GROUPS,
        LIST_GROUPS_VERSION,
        correlation_id,
        client_id,
        0,
    )?)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGroup {
    pub group: String,
    /// `consumer`, `share`, `streams`, `connect`, ... or empty.
    pub protocol_type: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGroups {
    pub error: ErrorCode,
    pub groups: Vec<ListedGroup>,
}

pub fn decode_list_groups(body: &[u8]) -> Result<ListedGroups, DecodeError> {
    let mut r = Reader::new(body);
    r.i32("throttle_time_ms")?;
    let error = ErrorCode(r.i16("error_code")?);
    let count = r.array_len("groups")?;
    let mut groups = Vec::new();
    for _ in 0..count {
        groups.push(ListedGroup {
            group: r.string("group_id")?,
            protocol_type: r.string("protocol_type")?,
        });
    }
    Ok(ListedGroups { error, groups })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::Fields as Bytes;

    #[test]
    fn a_list_groups_request_is_a_bare_header() {
        let expected = Bytes::default().i16(16).i16(2).i32(9).string("mf").framed();
        assert_eq!(list_groups_request(9, "mf"), Ok(expected));
    }

    fn answer() -> Bytes {
        Bytes::default()
            .i32(0)
            .i16(0)
            .i32(3)
            .string("orders-app")
            .string("consumer")
            .string("orders-queue")
            .string("share")
            .string("committer")
            .string("")
    }

    #[test]
    fn each_group_comes_with_its_protocol_type() {
        let listed = decode_list_groups(&answer().0).expect("well-formed answer");
        assert_eq!(listed.error, ErrorCode::NONE);
        let kinds: Vec<(&str, &str)> = (listed.groups.iter())
            .map(|g| (g.group.as_str(), g.protocol_type.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("orders-app", "consumer"),
                ("orders-queue", "share"),
                ("committer", "")
            ]
        );
    }

    #[test]
    fn a_cut_or_overlong_answer_is_an_error() {
        let whole = answer().0;
        for len in 0..whole.len() {
            assert!(decode_list_groups(&whole[..len]).is_err(), "cut at {len}");
        }
        let claims_more = Bytes::default().i32(0).i16(0).i32(i32::MAX).string("g");
        assert!(decode_list_groups(&claims_more.0).is_err());
        let negative = Bytes::default().i32(0).i16(0).i32(-2);
        assert!(decode_list_groups(&negative.0).is_err());
    }
}
