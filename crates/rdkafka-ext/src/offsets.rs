//! `AlterConsumerGroupOffsets` and `ListConsumerGroupOffsets`: a group's committed offsets set
//! or read from any client of the cluster, without a consumer whose `group.id` is that group
//! (one client serves every group). The coordinator accepts an alter only while the group has
//! no members, as it does a member-less consumer's commit.

use std::ffi::{CString, c_char};
use std::time::Duration;

use rdkafka::bindings as sys;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

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
        Ok(
            group_partitions(groups, count, "AlterConsumerGroupOffsets")?
                .into_iter()
                .filter(|p| p.err != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
                .map(|p| PartitionRefusal {
                    topic: owned(p.topic as *const c_char),
                    partition: p.partition,
                    code: p.err.into(),
                })
                .collect(),
        )
    }
}

/// Every committed offset of each of `groups` (a partition the group never committed to is
/// not in its list), read through `client` with one OffsetFetch per group, all in flight at
/// once, each waiting at most `timeout`. A group's error is the request's or the group's
/// (timeout, unreachable, `GroupAuthorizationFailed`...).
pub fn list_group_offsets<C: ClientContext>(
    client: &Client<C>,
    groups: &[&str],
    timeout: Duration,
) -> Vec<Result<TopicPartitionList, DescribeError>> {
    let pending: Vec<_> = groups
        .iter()
        .map(|group| send_list(client, group, timeout))
        .collect();
    pending
        .into_iter()
        .map(|sent| {
            let mut request = sent?;
            request.wait("ListConsumerGroupOffsets")?;
            // SAFETY: `event` is live until `request` drops, after everything is copied out.
            unsafe { read_list(request.event) }
        })
        .collect()
}

fn send_list<C: ClientContext>(
    client: &Client<C>,
    group: &str,
    timeout: Duration,
) -> Result<Request, DescribeError> {
    let name = CString::new(group).map_err(|_| invalid("the group name holds a NUL byte"))?;
    let request = Request::new(
        client,
        sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTCONSUMERGROUPOFFSETS,
        timeout,
    )?;
    // SAFETY: librdkafka copies `name`; no partition list asks for every committed partition;
    // the request object is destroyed right after the call, which has taken what it needs.
    unsafe {
        let mut list = sys::rd_kafka_ListConsumerGroupOffsets_new(name.as_ptr(), std::ptr::null());
        if list.is_null() {
            return Err(invalid("librdkafka could not build the request"));
        }
        sys::rd_kafka_ListConsumerGroupOffsets(
            request.rk,
            &mut list,
            1,
            request.options,
            request.queue,
        );
        sys::rd_kafka_ListConsumerGroupOffsets_destroy(list);
    }
    Ok(request)
}

/// # Safety
/// `event` is a live ListConsumerGroupOffsets result event.
unsafe fn read_list(
    event: *mut sys::rd_kafka_event_t,
) -> Result<TopicPartitionList, DescribeError> {
    // SAFETY: the caller's contract; everything read below is owned by `event`.
    unsafe {
        let result = sys::rd_kafka_event_ListConsumerGroupOffsets_result(event);
        if result.is_null() {
            return Err(invalid("not a ListConsumerGroupOffsets result"));
        }
        let mut count = 0usize;
        let groups = sys::rd_kafka_ListConsumerGroupOffsets_result_groups(result, &mut count);
        let mut out = TopicPartitionList::new();
        for p in group_partitions(groups, count, "ListConsumerGroupOffsets")? {
            // A partition's own error reads as no commit.
            if p.err != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || p.offset < 0 {
                continue;
            }
            out.add_partition_offset(
                &owned(p.topic as *const c_char),
                p.partition,
                Offset::Offset(p.offset),
            )
            .map_err(|e| invalid(&e.to_string()))?;
        }
        Ok(out)
    }
}

/// Every partition of every group in a group-result array, or the first group's error.
///
/// # Safety
/// `groups` is null or `count` live group results, which outlive the returned references.
unsafe fn group_partitions<'a>(
    groups: *mut *const sys::rd_kafka_group_result_t,
    count: usize,
    what: &str,
) -> Result<Vec<&'a sys::rd_kafka_topic_partition_t>, DescribeError> {
    if groups.is_null() || count == 0 {
        return Err(invalid(&format!("no group in the {what} result")));
    }
    let mut out = Vec::new();
    // SAFETY: the caller's contract.
    unsafe {
        for &g in std::slice::from_raw_parts(groups, count) {
            if let Some(failed) = error_of(sys::rd_kafka_group_result_error(g)) {
                return Err(failed);
            }
            let list = sys::rd_kafka_group_result_partitions(g);
            if list.is_null() || (*list).elems.is_null() {
                continue;
            }
            let cnt = usize::try_from((*list).cnt).unwrap_or(0);
            out.extend(std::slice::from_raw_parts((*list).elems, cnt));
        }
    }
    Ok(out)
}
