//! ListOffsets v4: a partition's first or next offset (or the first at a time), from its
//! leader, where a copy starts or resumes reading.

use super::{API_LIST_OFFSETS, ErrorCode, Isolation, LIST_OFFSETS_VERSION, finish_frame, frame};
use crate::wire::{DecodeError, EncodeError, MAX_OFFSET, Reader};

/// The timestamp asking for the next offset to be written (or, `read_committed`, the last
/// stable offset).
pub const LATEST: i64 = -1;
/// The timestamp asking for the log start offset.
pub const EARLIEST: i64 = -2;

pub fn list_offsets_request(
    correlation_id: i32,
    client_id: &str,
    isolation: Isolation,
    topic: &str,
    partitions: &[(i32, i64)],
) -> Result<Vec<u8>, EncodeError> {
    let mut w = frame(
        API_LIST_OFFSETS,
        LIST_OFFSETS_VERSION,
        correlation_id,
        client_id,
        16 + topic.len() + 16 * partitions.len(),
    )?;
    w.i32(-1) // replica id: a client
        .i8(match isolation {
            Isolation::ReadUncommitted => 0,
            Isolation::ReadCommitted => 1,
        });
    w.len("topics", 1)?;
    w.string("topic", topic)?;
    w.len("partitions", partitions.len())?;
    for &(partition, timestamp) in partitions {
        w.i32(partition)
            .i32(-1) // current leader epoch: not checked
            .i64(timestamp);
    }
    finish_frame(w)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedOffset {
    pub partition: i32,
    pub error: ErrorCode,
    /// -1 when no record is at or after the timestamp asked for.
    pub offset: i64,
    pub leader_epoch: i32,
}

/// The partitions of every topic answered, in order.
pub fn decode_list_offsets(body: &[u8]) -> Result<Vec<(String, ListedOffset)>, DecodeError> {
    let mut r = Reader::new(body);
    r.i32("throttle_time_ms")?;
    let mut listed = Vec::new();
    for _ in 0..r.array_len("topics")? {
        let topic = r.string("name")?;
        for _ in 0..r.array_len("partitions")? {
            let partition = r.i32("partition_index")?;
            let error = ErrorCode(r.i16("error_code")?);
            r.i64("timestamp")?;
            let offset = r.i64("offset")?;
            if !(-1..=MAX_OFFSET).contains(&offset) {
                return Err(DecodeError::OutOfRange {
                    field: "offset",
                    value: offset,
                    min: -1,
                    max: MAX_OFFSET,
                });
            }
            let leader_epoch = r.i32("leader_epoch")?;
            listed.push((
                topic.clone(),
                ListedOffset {
                    partition,
                    error,
                    offset,
                    leader_epoch,
                },
            ));
        }
    }
    Ok(listed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::Fields as Bytes;

    #[test]
    fn a_list_offsets_request_is_laid_out_as_the_spec_lists_it() {
        let expected = Bytes::default()
            .i16(2)
            .i16(4)
            .i32(9)
            .string("mf")
            .i32(-1)
            .i8(1)
            .i32(1)
            .string("orders")
            .i32(2)
            .i32(0)
            .i32(-1)
            .i64(LATEST)
            .i32(1)
            .i32(-1)
            .i64(EARLIEST)
            .framed();
        let request = list_offsets_request(
            9,
            "mf",
            Isolation::ReadCommitted,
            "orders",
            &[(0, LATEST), (1, EARLIEST)],
        );
        assert_eq!(request, Ok(expected));
    }

    fn answer(offset: i64) -> Bytes {
        Bytes::default()
            .i32(0)
            .i32(1)
            .string("orders")
            .i32(2)
            .i32(0)
            .i16(0)
            .i64(-1)
            .i64(offset)
            .i32(4)
            .i32(1)
            .i16(6)
            .i64(-1)
            .i64(-1)
            .i32(-1)
    }

    #[test]
    fn each_partition_answers_its_offset_or_its_error() {
        let listed = decode_list_offsets(&answer(1234).0).expect("well-formed answer");
        assert_eq!(
            listed,
            vec![
                (
                    "orders".to_owned(),
                    ListedOffset {
                        partition: 0,
                        error: ErrorCode::NONE,
                        offset: 1234,
                        leader_epoch: 4
                    }
                ),
                (
                    "orders".to_owned(),
                    ListedOffset {
                        partition: 1,
                        error: ErrorCode::NOT_LEADER_OR_FOLLOWER,
                        offset: -1,
                        leader_epoch: -1
                    }
                ),
            ]
        );
    }

    #[test]
    fn an_offset_below_minus_one_is_refused_and_a_cut_answer_is_an_error() {
        assert!(decode_list_offsets(&answer(-2).0).is_err());
        assert!(decode_list_offsets(&answer(MAX_OFFSET + 1).0).is_err());
        let whole = answer(7).0;
        for len in 0..whole.len() {
            assert!(decode_list_offsets(&whole[..len]).is_err(), "cut at {len}");
        }
    }
}
