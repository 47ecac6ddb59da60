//! `AlterConsumerGroupOffsets`: sets a group's committed offsets from any client of the cluster,
//! without a consumer whose `group.id` is that group. The coordinator accepts it only while the
//! group has no members, as it does a member-less consumer's commit.

use std::ffi::{CString, c_char};
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::bindings as sys;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;

use crate::{DescribeError, Request, error_of, invalid, owned};

/// A partition the coordinator did not take, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRefusal {
    pub topic: String,
    pub partition: i32,
    pub code: RDKafkaErrorCode,
}

/// Sets `group`'s offsets to those in `offsets` through `client`, waiting at most `timeout`.
/// The outer error is the request's or the group's (timeout, unreachable, `NonEmptyGroup`...);
/// the list holds the partitions refused one by one (empty: all taken).
pub fn alter_group_offsets<C: ClientContext>(
    client: &Client<C>,
    group: &str,
    offsets: &TopicPartitionList,
    timeout: Duration,
) -> Result<Vec<PartitionRefusal>, DescribeError> {
    let name = CString::new(group).map_err(|_| invalid("the group name holds a NUL byte"))?;
    let mut request = Request::new(
        client,
        sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_ALTERCONSUMERGROUPOFFSETS,
        timeout,
    )?;
    // SAFETY: `name` and `offsets` outlive the call and librdkafka copies both; the alter
    // object is destroyed right after the call, which has taken what it needs from it.
    unsafe {
        let mut alter = sys::rd_kafka_AlterConsumerGroupOffsets_new(name.as_ptr(), offsets.ptr());
        if alter.is_null() {
            return Err(invalid("librdkafka could not build the request"));
        }
        sys::rd_kafka_AlterConsumerGroupOffsets(
            request.rk,
            &mut alter,
            1,
            request.options,
            request.queue,
        );
        sys::rd_kafka_AlterConsumerGroupOffsets_destroy(alter);
    }
    request.wait("AlterConsumerGroupOffsets")?;
    // SAFETY: `event` is live until `request` drops, after everything is copied out.
    unsafe { read_result(request.event) }
}

/// # Safety
/// `event` is a live AlterConsumerGroupOffsets result event.
unsafe fn read_result(
    event: *mut sys::rd_kafka_event_t,
) -> Result<Vec<PartitionRefusal>, DescribeError> {
    // SAFETY: the caller's contract; everything read below is owned by `event`.
    unsafe {
        let result = sys::rd_kafka_event_AlterConsumerGroupOffsets_result(event);
        if result.is_null() {
            return Err(invalid("not an AlterConsumerGroupOffsets result"));
        }
        let mut count = 0usize;
        let groups = sys::rd_kafka_AlterConsumerGroupOffsets_result_groups(result, &mut count);
        if groups.is_null() || count == 0 {
            return Err(invalid("no group in the AlterConsumerGroupOffsets result"));
        }
        let mut refused = Vec::new();
        for &g in std::slice::from_raw_parts(groups, count) {
            if let Some(failed) = error_of(sys::rd_kafka_group_result_error(g)) {
                return Err(failed);
            }
            let list = sys::rd_kafka_group_result_partitions(g);
            if list.is_null() || (*list).elems.is_null() {
                continue;
            }
            let cnt = usize::try_from((*list).cnt).unwrap_or(0);
            for p in std::slice::from_raw_parts((*list).elems, cnt) {
                if p.err != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    refused.push(PartitionRefusal {
                        topic: owned(p.topic as *const c_char),
                        partition: p.partition,
                        code: p.err.into(),
                    });
                }
            }
        }
        Ok(refused)
    }
}
