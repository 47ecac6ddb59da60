//! librdkafka admin calls rust-rdkafka does not wrap: `DescribeConsumerGroups` (here), the
//! ACL calls `DescribeAcls` and `CreateAcls` ([`acls`]) and `AlterConsumerGroupOffsets`
//! ([`offsets`]).
//!
//! It is the only call that describes groups of the consumer protocol (KIP-848,
//! `group.protocol=consumer`): the classic DescribeGroups that rust-rdkafka's
//! `fetch_group_list` sends gets such a group back as `Dead` with no members while its
//! consumers run (measured with Kafka 4.3 and a Java consumer), so a replicator trusting it would
//! commit into, or fail back over, a group in use. librdkafka sends ConsumerGroupDescribe and
//! falls back to DescribeGroups for classic groups, so one call answers for both kinds.
//!
//! [`heap`] gives the memory freed by librdkafka and the operator back to the system;
//! [`inflater`] replaces librdkafka's inflaters (gzip, lz4, zstd, snappy) with bounded ones.
//!
//! This is the workspace's only unsafe code. Every pointer read comes from librdkafka and is
//! copied into owned values before the event that owns it is destroyed; every object created
//! here is destroyed on every path by a guard.

pub mod acls;
pub mod heap;
pub mod inflater;
pub mod offsets;

use std::ffi::{CStr, CString, c_char, c_int};
use std::time::Duration;

use rdkafka::bindings as sys;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;

/// What the group coordinator says of one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub group: String,
    /// `Stable`, `Empty`, `Dead`, `PreparingRebalance`, `CompletingRebalance`, or `Unknown`.
    pub state: &'static str,
    /// `consumer` (KIP-848), `classic`, or `unknown`.
    pub protocol: &'static str,
    pub members: usize,
}

/// One group's answer: its description, or its name and why it has none.
pub type GroupResult = Result<GroupDescription, (String, DescribeError)>;

/// Why a group, or the whole request, could not be described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeError {
    pub code: RDKafkaErrorCode,
    pub message: String,
}

impl std::fmt::Display for DescribeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{} ({})", self.code, self.message)
        }
    }
}

impl std::error::Error for DescribeError {}

fn state_name(state: sys::rd_kafka_consumer_group_state_t) -> &'static str {
    use sys::rd_kafka_consumer_group_state_t::*;
    match state {
        RD_KAFKA_CONSUMER_GROUP_STATE_PREPARING_REBALANCE => "PreparingRebalance",
        RD_KAFKA_CONSUMER_GROUP_STATE_COMPLETING_REBALANCE => "CompletingRebalance",
        RD_KAFKA_CONSUMER_GROUP_STATE_STABLE => "Stable",
        RD_KAFKA_CONSUMER_GROUP_STATE_DEAD => "Dead",
        RD_KAFKA_CONSUMER_GROUP_STATE_EMPTY => "Empty",
        _ => "Unknown",
    }
}

fn protocol_name(kind: sys::rd_kafka_consumer_group_type_t) -> &'static str {
    use sys::rd_kafka_consumer_group_type_t::*;
    match kind {
        RD_KAFKA_CONSUMER_GROUP_TYPE_CONSUMER => "consumer",
        RD_KAFKA_CONSUMER_GROUP_TYPE_CLASSIC => "classic",
        _ => "unknown",
    }
}

/// # Safety
/// `s` is null or a NUL-terminated string that lives for the call.
pub(crate) unsafe fn owned(s: *const c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: non-null, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// Destroys what librdkafka allocated for one request, whichever way the call returns.
pub(crate) struct Request {
    pub(crate) rk: *mut sys::rd_kafka_t,
    pub(crate) queue: *mut sys::rd_kafka_queue_t,
    pub(crate) options: *mut sys::rd_kafka_AdminOptions_t,
    pub(crate) event: *mut sys::rd_kafka_event_t,
    timeout_ms: c_int,
}

impl Drop for Request {
    fn drop(&mut self) {
        // SAFETY: each pointer is null or was returned by its librdkafka constructor and is
        // destroyed exactly once, here.
        unsafe {
            if !self.event.is_null() {
                sys::rd_kafka_event_destroy(self.event);
            }
            if !self.options.is_null() {
                sys::rd_kafka_AdminOptions_destroy(self.options);
            }
            if !self.queue.is_null() {
                sys::rd_kafka_queue_destroy(self.queue);
            }
        }
    }
}

pub(crate) fn invalid(message: &str) -> DescribeError {
    DescribeError {
        code: RDKafkaErrorCode::InvalidArgument,
        message: message.to_string(),
    }
}

impl Request {
    /// A queue and options for one `op` request on `client`'s handle, with `timeout`.
    pub(crate) fn new<C: ClientContext>(
        client: &Client<C>,
        op: sys::rd_kafka_admin_op_t,
        timeout: Duration,
    ) -> Result<Request, DescribeError> {
        let timeout_ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        let rk = client.native_ptr();
        // SAFETY: `rk` is the live client `client` borrows; the request does not outlive the
        // caller's borrow of it.
        let request = unsafe {
            Request {
                rk,
                queue: sys::rd_kafka_queue_new(rk),
                options: sys::rd_kafka_AdminOptions_new(rk, op),
                event: std::ptr::null_mut(),
                timeout_ms,
            }
        };
        if request.queue.is_null() || request.options.is_null() {
            return Err(invalid("librdkafka could not create the request"));
        }
        let mut errstr = [0 as c_char; 256];
        // SAFETY: `options` is live; `errstr` is writable for its stated length.
        let set = unsafe {
            sys::rd_kafka_AdminOptions_set_request_timeout(
                request.options,
                timeout_ms,
                errstr.as_mut_ptr(),
                errstr.len(),
            )
        };
        if set != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            // SAFETY: librdkafka wrote a NUL-terminated message into `errstr`.
            return Err(invalid(&unsafe { owned(errstr.as_ptr()) }));
        }
        Ok(request)
    }

    /// Waits for the answer to the request sent on `queue`; the request-level error (timeout,
    /// cluster unreachable, SECURITY_DISABLED...) is returned as the error.
    pub(crate) fn wait(&mut self, what: &str) -> Result<(), DescribeError> {
        // The request's own timeout answers first; the margin only covers a late event.
        let wait_ms = self.timeout_ms.saturating_add(1_000);
        // SAFETY: `queue` is live.
        self.event = unsafe { sys::rd_kafka_queue_poll(self.queue, wait_ms) };
        if self.event.is_null() {
            return Err(DescribeError {
                code: RDKafkaErrorCode::OperationTimedOut,
                message: format!("no answer to {what}"),
            });
        }
        // SAFETY: `event` is live until `self` drops.
        unsafe {
            let err = sys::rd_kafka_event_error(self.event);
            if err != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                return Err(DescribeError {
                    code: err.into(),
                    message: owned(sys::rd_kafka_event_error_string(self.event)),
                });
            }
        }
        Ok(())
    }
}

/// `names` as C strings, refused with `nul` if one holds a NUL byte.
pub(crate) fn c_strings(names: &[&str], nul: &str) -> Result<Vec<CString>, DescribeError> {
    names
        .iter()
        .map(|n| CString::new(*n).map_err(|_| invalid(nul)))
        .collect()
}

/// The code and message of a librdkafka error object (null: none).
///
/// # Safety
/// `error` is null or a live `rd_kafka_error_t`.
pub(crate) unsafe fn error_of(error: *const sys::rd_kafka_error_t) -> Option<DescribeError> {
    if error.is_null() {
        return None;
    }
    // SAFETY: non-null and live by the caller's contract.
    unsafe {
        Some(DescribeError {
            code: sys::rd_kafka_error_code(error).into(),
            message: owned(sys::rd_kafka_error_string(error)),
        })
    }
}

/// Describes `groups` through `client` (any consumer, producer or admin client of the cluster),
/// waiting at most `timeout`. The outer error is the request's (timeout, cluster unreachable);
/// each group has its own result (e.g. `NotCoordinator` while its coordinator moves).
pub fn describe_groups<C: ClientContext>(
    client: &Client<C>,
    groups: &[&str],
    timeout: Duration,
) -> Result<Vec<GroupResult>, DescribeError> {
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    let names = c_strings(groups, "a group name holds a NUL byte")?;
    let mut pointers: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let mut request = Request::new(
        client,
        sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS,
        timeout,
    )?;
    // SAFETY: `pointers` holds `names.len()` NUL-terminated strings that outlive the call
    // (librdkafka copies them); `rk`, `options` and `queue` are live.
    unsafe {
        sys::rd_kafka_DescribeConsumerGroups(
            request.rk,
            pointers.as_mut_ptr(),
            pointers.len(),
            request.options,
            request.queue,
        );
    }
    request.wait("DescribeConsumerGroups")?;
    // SAFETY: `event` is live until `request` drops, after everything is copied out.
    unsafe { read_result(request.event) }
}

/// # Safety
/// `event` is a live DescribeConsumerGroups result event.
unsafe fn read_result(
    event: *mut sys::rd_kafka_event_t,
) -> Result<Vec<GroupResult>, DescribeError> {
    // SAFETY: the caller's contract; everything read below is owned by `event`.
    unsafe {
        let result = sys::rd_kafka_event_DescribeConsumerGroups_result(event);
        if result.is_null() {
            return Err(DescribeError {
                code: RDKafkaErrorCode::Fail,
                message: "not a DescribeConsumerGroups result".into(),
            });
        }
        let mut count = 0usize;
        let descriptions = sys::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut count);
        if descriptions.is_null() {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(count);
        for &d in std::slice::from_raw_parts(descriptions, count) {
            let group = owned(sys::rd_kafka_ConsumerGroupDescription_group_id(d));
            if let Some(failed) = error_of(sys::rd_kafka_ConsumerGroupDescription_error(d)) {
                out.push(Err((group, failed)));
                continue;
            }
            out.push(Ok(GroupDescription {
                group,
                state: state_name(sys::rd_kafka_ConsumerGroupDescription_state(d)),
                protocol: protocol_name(sys::rd_kafka_ConsumerGroupDescription_type(d)),
                members: sys::rd_kafka_ConsumerGroupDescription_member_count(d),
            }));
        }
        Ok(out)
    }
}
