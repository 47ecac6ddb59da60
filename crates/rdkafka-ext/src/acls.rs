//! librdkafka's `DescribeAcls`, `CreateAcls` and `DeleteAcls` (KIP-140), and the cluster operations a
//! principal may perform (`DescribeCluster`), for topic ACL sync.
//!
//! Bindings cross the boundary as owned Rust values: a binding librdkafka returns is copied
//! before its event is destroyed, and a binding made for a request is destroyed by a guard
//! after librdkafka copied it. Errors are librdkafka's codes: `SecurityDisabled` when the
//! cluster has no authorizer, `ClusterAuthorizationFailed` when the principal may not describe
//! (DESCRIBE) or create (ALTER) ACLs on the cluster.

use std::ffi::{CString, c_char};
use std::time::Duration;

use rdkafka::bindings as sys;
use rdkafka::client::{Client, ClientContext};

use crate::{DescribeError, Request, c_strings, error_of, invalid, owned};

/// Why an ACL request, or one binding of it, failed.
pub type AclError = DescribeError;

/// The kind of resource a binding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceType {
    /// Filters only.
    Any,
    Topic,
    Group,
    Cluster,
    TransactionalId,
    Unknown,
}

/// How a binding's resource name matches resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PatternType {
    /// Filters only: literal and prefixed.
    Any,
    /// Filters only: every binding that applies to the named resource.
    Match,
    Literal,
    Prefixed,
    Unknown,
}

/// An operation a binding allows or denies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    /// Filters only.
    Any,
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    /// Filters only.
    Any,
    Deny,
    Allow,
    Unknown,
}

/// One ACL binding: `principal` from `host` may (or may not) do `operation` on the resource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub name: String,
    pub pattern: PatternType,
    /// `User:alice`.
    pub principal: String,
    /// `*` for any host.
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

/// Which bindings to describe; `None` matches any value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: ResourceType,
    pub name: Option<String>,
    pub pattern: PatternType,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Operation,
    pub permission: Permission,
}

fn resource_to_sys(r: ResourceType) -> sys::rd_kafka_ResourceType_t {
    use sys::rd_kafka_ResourceType_t::*;
    match r {
        ResourceType::Any => RD_KAFKA_RESOURCE_ANY,
        ResourceType::Topic => RD_KAFKA_RESOURCE_TOPIC,
        ResourceType::Group => RD_KAFKA_RESOURCE_GROUP,
        ResourceType::Cluster => RD_KAFKA_RESOURCE_BROKER,
        ResourceType::TransactionalId => RD_KAFKA_RESOURCE_TRANSACTIONAL_ID,
        ResourceType::Unknown => RD_KAFKA_RESOURCE_UNKNOWN,
    }
}

fn resource_from_sys(r: sys::rd_kafka_ResourceType_t) -> ResourceType {
    use sys::rd_kafka_ResourceType_t::*;
    match r {
        RD_KAFKA_RESOURCE_ANY => ResourceType::Any,
        RD_KAFKA_RESOURCE_TOPIC => ResourceType::Topic,
        RD_KAFKA_RESOURCE_GROUP => ResourceType::Group,
        RD_KAFKA_RESOURCE_BROKER => ResourceType::Cluster,
        RD_KAFKA_RESOURCE_TRANSACTIONAL_ID => ResourceType::TransactionalId,
        _ => ResourceType::Unknown,
    }
}

fn pattern_to_sys(p: PatternType) -> sys::rd_kafka_ResourcePatternType_t {
    use sys::rd_kafka_ResourcePatternType_t::*;
    match p {
        PatternType::Any => RD_KAFKA_RESOURCE_PATTERN_ANY,
        PatternType::Match => RD_KAFKA_RESOURCE_PATTERN_MATCH,
        PatternType::Literal => RD_KAFKA_RESOURCE_PATTERN_LITERAL,
        PatternType::Prefixed => RD_KAFKA_RESOURCE_PATTERN_PREFIXED,
        PatternType::Unknown => RD_KAFKA_RESOURCE_PATTERN_UNKNOWN,
    }
}

fn pattern_from_sys(p: sys::rd_kafka_ResourcePatternType_t) -> PatternType {
    use sys::rd_kafka_ResourcePatternType_t::*;
    match p {
        RD_KAFKA_RESOURCE_PATTERN_ANY => PatternType::Any,
        RD_KAFKA_RESOURCE_PATTERN_MATCH => PatternType::Match,
        RD_KAFKA_RESOURCE_PATTERN_LITERAL => PatternType::Literal,
        RD_KAFKA_RESOURCE_PATTERN_PREFIXED => PatternType::Prefixed,
        _ => PatternType::Unknown,
    }
}

const OPERATIONS: [(Operation, sys::rd_kafka_AclOperation_t); 13] = {
    use sys::rd_kafka_AclOperation_t::*;
    [
        (Operation::Any, RD_KAFKA_ACL_OPERATION_ANY),
        (Operation::All, RD_KAFKA_ACL_OPERATION_ALL),
        (Operation::Read, RD_KAFKA_ACL_OPERATION_READ),
        (Operation::Write, RD_KAFKA_ACL_OPERATION_WRITE),
        (Operation::Create, RD_KAFKA_ACL_OPERATION_CREATE),
        (Operation::Delete, RD_KAFKA_ACL_OPERATION_DELETE),
        (Operation::Alter, RD_KAFKA_ACL_OPERATION_ALTER),
        (Operation::Describe, RD_KAFKA_ACL_OPERATION_DESCRIBE),
        (
            Operation::ClusterAction,
            RD_KAFKA_ACL_OPERATION_CLUSTER_ACTION,
        ),
        (
            Operation::DescribeConfigs,
            RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
        ),
        (
            Operation::AlterConfigs,
            RD_KAFKA_ACL_OPERATION_ALTER_CONFIGS,
        ),
        (
            Operation::IdempotentWrite,
            RD_KAFKA_ACL_OPERATION_IDEMPOTENT_WRITE,
        ),
        (Operation::Unknown, RD_KAFKA_ACL_OPERATION_UNKNOWN),
    ]
};

fn operation_to_sys(o: Operation) -> sys::rd_kafka_AclOperation_t {
    OPERATIONS
        .iter()
        .find(|(ours, _)| *ours == o)
        .map(|(_, theirs)| *theirs)
        .unwrap_or(sys::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_UNKNOWN)
}

fn operation_from_sys(o: sys::rd_kafka_AclOperation_t) -> Operation {
    OPERATIONS
        .iter()
        .find(|(_, theirs)| *theirs == o)
        .map(|(ours, _)| *ours)
        .unwrap_or(Operation::Unknown)
}

fn permission_to_sys(p: Permission) -> sys::rd_kafka_AclPermissionType_t {
    use sys::rd_kafka_AclPermissionType_t::*;
    match p {
        Permission::Any => RD_KAFKA_ACL_PERMISSION_TYPE_ANY,
        Permission::Deny => RD_KAFKA_ACL_PERMISSION_TYPE_DENY,
        Permission::Allow => RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW,
        Permission::Unknown => RD_KAFKA_ACL_PERMISSION_TYPE_UNKNOWN,
    }
}

fn permission_from_sys(p: sys::rd_kafka_AclPermissionType_t) -> Permission {
    use sys::rd_kafka_AclPermissionType_t::*;
    match p {
        RD_KAFKA_ACL_PERMISSION_TYPE_ANY => Permission::Any,
        RD_KAFKA_ACL_PERMISSION_TYPE_DENY => Permission::Deny,
        RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW => Permission::Allow,
        _ => Permission::Unknown,
    }
}

/// Bindings (or filters) made for one request, destroyed whichever way the call returns.
struct Bindings(Vec<*mut sys::rd_kafka_AclBinding_t>);

impl Drop for Bindings {
    fn drop(&mut self) {
        for &b in &self.0 {
            // SAFETY: each pointer was returned by `rd_kafka_AclBinding(Filter)_new` and is
            // destroyed once, here; librdkafka copied what it needed when the request was made.
            unsafe { sys::rd_kafka_AclBinding_destroy(b) };
        }
    }
}

fn c_string(s: &str) -> Result<CString, AclError> {
    CString::new(s).map_err(|_| invalid("an ACL field holds a NUL byte"))
}

/// Makes one binding (`filter` = false) or filter (true) with librdkafka's own validation.
#[allow(clippy::too_many_arguments)]
fn new_binding(
    filter: bool,
    resource_type: ResourceType,
    name: Option<&str>,
    pattern: PatternType,
    principal: Option<&str>,
    host: Option<&str>,
    operation: Operation,
    permission: Permission,
) -> Result<*mut sys::rd_kafka_AclBinding_t, AclError> {
    let name = name.map(c_string).transpose()?;
    let principal = principal.map(c_string).transpose()?;
    let host = host.map(c_string).transpose()?;
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    let mut errstr = [0 as c_char; 512];
    let args = (
        resource_to_sys(resource_type),
        ptr(&name),
        pattern_to_sys(pattern),
        ptr(&principal),
        ptr(&host),
        operation_to_sys(operation),
        permission_to_sys(permission),
    );
    // SAFETY: the strings are null or NUL-terminated and outlive the call (librdkafka copies
    // them); `errstr` is writable for its stated length.
    let made = unsafe {
        if filter {
            sys::rd_kafka_AclBindingFilter_new(
                args.0,
                args.1,
                args.2,
                args.3,
                args.4,
                args.5,
                args.6,
                errstr.as_mut_ptr(),
                errstr.len(),
            )
        } else {
            sys::rd_kafka_AclBinding_new(
                args.0,
                args.1,
                args.2,
                args.3,
                args.4,
                args.5,
                args.6,
                errstr.as_mut_ptr(),
                errstr.len(),
            )
        }
    };
    if made.is_null() {
        // SAFETY: librdkafka wrote a NUL-terminated message into `errstr`.
        return Err(invalid(&unsafe { owned(errstr.as_ptr()) }));
    }
    Ok(made)
}

/// What a batch request sends: bindings (CreateAcls) or filters (DeleteAcls).
trait Made {
    fn made(&self) -> Result<*mut sys::rd_kafka_AclBinding_t, AclError>;
}

impl Made for AclBinding {
    fn made(&self) -> Result<*mut sys::rd_kafka_AclBinding_t, AclError> {
        new_binding(
            false,
            self.resource_type,
            Some(&self.name),
            self.pattern,
            Some(&self.principal),
            Some(&self.host),
            self.operation,
            self.permission,
        )
    }
}

impl Made for AclFilter {
    fn made(&self) -> Result<*mut sys::rd_kafka_AclBinding_t, AclError> {
        new_binding(
            true,
            self.resource_type,
            self.name.as_deref(),
            self.pattern,
            self.principal.as_deref(),
            self.host.as_deref(),
            self.operation,
            self.permission,
        )
    }
}

/// librdkafka's CreateAcls and DeleteAcls take the same arguments.
type BatchCall = unsafe extern "C" fn(
    *mut sys::rd_kafka_t,
    *mut *mut sys::rd_kafka_AclBinding_t,
    usize,
    *const sys::rd_kafka_AdminOptions_t,
    *mut sys::rd_kafka_queue_t,
);

/// Sends one batch request of `items` (bindings or filters) and waits for its answer.
fn batch<C: ClientContext, T: Made>(
    client: &Client<C>,
    op: sys::rd_kafka_admin_op_t,
    what: &'static str,
    items: &[T],
    call: BatchCall,
    timeout: Duration,
) -> Result<Request, AclError> {
    // Pushed one by one: those made before a refused one are still destroyed.
    let mut made = Bindings(Vec::with_capacity(items.len()));
    for item in items {
        made.0.push(item.made()?);
    }
    let mut request = Request::new(client, op, timeout)?;
    // SAFETY: `made` holds `made.0.len()` live bindings that outlive the call (librdkafka
    // copies them); `rk`, `options` and `queue` are live.
    unsafe {
        call(
            request.rk,
            made.0.as_mut_ptr(),
            made.0.len(),
            request.options,
            request.queue,
        );
    }
    request.wait(what)?;
    Ok(request)
}

/// # Safety
/// `b` is a live binding.
unsafe fn read_binding(b: *const sys::rd_kafka_AclBinding_t) -> AclBinding {
    // SAFETY: the caller's contract; the strings are copied out.
    unsafe {
        AclBinding {
            resource_type: resource_from_sys(sys::rd_kafka_AclBinding_restype(b)),
            name: owned(sys::rd_kafka_AclBinding_name(b)),
            pattern: pattern_from_sys(sys::rd_kafka_AclBinding_resource_pattern_type(b)),
            principal: owned(sys::rd_kafka_AclBinding_principal(b)),
            host: owned(sys::rd_kafka_AclBinding_host(b)),
            operation: operation_from_sys(sys::rd_kafka_AclBinding_operation(b)),
            permission: permission_from_sys(sys::rd_kafka_AclBinding_permission_type(b)),
        }
    }
}

/// The bindings of the cluster `client` talks to that match `filter`; blocking, at most
/// `timeout`. A cluster without an authorizer answers `SecurityDisabled`.
pub fn describe_acls<C: ClientContext>(
    client: &Client<C>,
    filter: &AclFilter,
    timeout: Duration,
) -> Result<Vec<AclBinding>, AclError> {
    let made = Bindings(vec![filter.made()?]);
    let mut request = Request::new(
        client,
        sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBEACLS,
        timeout,
    )?;
    // SAFETY: the filter, `rk`, `options` and `queue` are live; librdkafka copies the filter.
    unsafe {
        sys::rd_kafka_DescribeAcls(request.rk, made.0[0], request.options, request.queue);
    }
    request.wait("DescribeAcls")?;
    // SAFETY: `event` is live until `request` drops, after everything is copied out.
    unsafe {
        let result = sys::rd_kafka_event_DescribeAcls_result(request.event);
        if result.is_null() {
            return Err(invalid("not a DescribeAcls result"));
        }
        let mut count = 0usize;
        let acls = sys::rd_kafka_DescribeAcls_result_acls(result, &mut count);
        if acls.is_null() {
            return Ok(Vec::new());
        }
        Ok(std::slice::from_raw_parts(acls, count)
            .iter()
            .map(|&b| read_binding(b))
            .collect())
    }
}

/// Creates `bindings` on the cluster `client` talks to; blocking, at most `timeout`. The outer
/// error is the request's; each binding has its own result, in the order given (creating a
/// binding that exists already succeeds).
pub fn create_acls<C: ClientContext>(
    client: &Client<C>,
    bindings: &[AclBinding],
    timeout: Duration,
) -> Result<Vec<Result<(), AclError>>, AclError> {
    if bindings.is_empty() {
        return Ok(Vec::new());
    }
    let request = batch(
        client,
        sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_CREATEACLS,
        "CreateAcls",
        bindings,
        sys::rd_kafka_CreateAcls,
        timeout,
    )?;
    // SAFETY: `event` is live until `request` drops, after everything is copied out.
    unsafe {
        let result = sys::rd_kafka_event_CreateAcls_result(request.event);
        if result.is_null() {
            return Err(invalid("not a CreateAcls result"));
        }
        let mut count = 0usize;
        let results = sys::rd_kafka_CreateAcls_result_acls(result, &mut count);
        if results.is_null() {
            return Ok(Vec::new());
        }
        Ok(std::slice::from_raw_parts(results, count)
            .iter()
            .map(|&r| match error_of(sys::rd_kafka_acl_result_error(r)) {
                Some(e) => Err(e),
                None => Ok(()),
            })
            .collect())
    }
}

/// Deletes every binding that matches one of `filters` on the cluster `client` talks to;
/// blocking, at most `timeout`. Returns the bindings deleted; the first filter's error fails
/// the whole call (a partial delete is reported by what was deleted before it, not hidden).
pub fn delete_acls<C: ClientContext>(
    client: &Client<C>,
    filters: &[AclFilter],
    timeout: Duration,
) -> Result<Vec<AclBinding>, AclError> {
    if filters.is_empty() {
        return Ok(Vec::new());
    }
    let request = batch(
        client,
        sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DELETEACLS,
        "DeleteAcls",
        filters,
        sys::rd_kafka_DeleteAcls,
        timeout,
    )?;
    // SAFETY: `event` is live until `request` drops, after everything is copied out.
    unsafe {
        let result = sys::rd_kafka_event_DeleteAcls_result(request.event);
        if result.is_null() {
            return Err(invalid("not a DeleteAcls result"));
        }
        let mut count = 0usize;
        let responses = sys::rd_kafka_DeleteAcls_result_responses(result, &mut count);
        if responses.is_null() {
            return Ok(Vec::new());
        }
        let mut deleted = Vec::new();
        for &response in std::slice::from_raw_parts(responses, count) {
            if let Some(e) = error_of(sys::rd_kafka_DeleteAcls_result_response_error(response)) {
                return Err(e);
            }
            let mut n = 0usize;
            let matching = sys::rd_kafka_DeleteAcls_result_response_matching_acls(response, &mut n);
            if !matching.is_null() {
                deleted.extend(
                    std::slice::from_raw_parts(matching, n)
                        .iter()
                        .map(|&b| read_binding(b)),
                );
            }
        }
        Ok(deleted)
    }
}

/// The operations the client's principal may perform on the cluster resource (DescribeCluster
/// with authorized operations); blocking, at most `timeout`. `None` when the brokers did not
/// say. DescribeAcls cannot tell that the principal lacks DESCRIBE on the cluster: librdkafka
/// (2.12) drops that response's error code and answers "no bindings", so sync asks this first.
pub fn cluster_operations<C: ClientContext>(
    client: &Client<C>,
    timeout: Duration,
) -> Result<Option<Vec<Operation>>, AclError> {
    let mut request = Request::new(
        client,
        sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECLUSTER,
        timeout,
    )?;
    include_authorized_operations(&request)?;
    // SAFETY: `rk`, `options` and `queue` are live.
    unsafe {
        sys::rd_kafka_DescribeCluster(request.rk, request.options, request.queue);
    }
    request.wait("DescribeCluster")?;
    // SAFETY: `event` is live until `request` drops, after everything is copied out.
    unsafe {
        let result = sys::rd_kafka_event_DescribeCluster_result(request.event);
        if result.is_null() {
            return Err(invalid("not a DescribeCluster result"));
        }
        let mut count = 0usize;
        let ops = sys::rd_kafka_DescribeCluster_result_authorized_operations(result, &mut count);
        Ok(operations(ops, count))
    }
}

/// Asks the brokers to answer with the principal's authorized operations.
fn include_authorized_operations(request: &Request) -> Result<(), DescribeError> {
    // SAFETY: `options` is live; the returned error, if any, is ours to destroy.
    unsafe {
        let error =
            sys::rd_kafka_AdminOptions_set_include_authorized_operations(request.options, 1);
        if let Some(e) = error_of(error) {
            sys::rd_kafka_error_destroy(error);
            return Err(e);
        }
    }
    Ok(())
}

/// # Safety
/// `ops` is null (the brokers did not say) or points to `count` live operations.
unsafe fn operations(
    ops: *const sys::rd_kafka_AclOperation_t,
    count: usize,
) -> Option<Vec<Operation>> {
    if ops.is_null() {
        return None;
    }
    // SAFETY: non-null, with `count` elements, by the caller's contract.
    let ops = unsafe { std::slice::from_raw_parts(ops, count) };
    Some(ops.iter().map(|&o| operation_from_sys(o)).collect())
}

/// What the client's principal may do on one topic: `None` when the brokers did not say; an
/// error for a topic they would not describe (`TopicAuthorizationFailed`: not even DESCRIBE)
/// or do not have.
pub type TopicOperations = (String, Result<Option<Vec<Operation>>, DescribeError>);

/// The operations the client's principal may perform on each of `topics` (DescribeTopics with
/// authorized operations, one request); blocking, at most `timeout`.
pub fn topic_operations<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    timeout: Duration,
) -> Result<Vec<TopicOperations>, AclError> {
    if topics.is_empty() {
        return Ok(Vec::new());
    }
    let names = c_strings(topics, "a topic name holds a NUL byte")?;
    let mut pointers: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let mut request = Request::new(
        client,
        sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        timeout,
    )?;
    include_authorized_operations(&request)?;
    // SAFETY: `names` outlive the collection, which librdkafka copies them into; the
    // collection is destroyed after the call, which has copied what it needs.
    unsafe {
        let collection =
            sys::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len());
        if collection.is_null() {
            return Err(invalid("librdkafka could not build the request"));
        }
        sys::rd_kafka_DescribeTopics(request.rk, collection, request.options, request.queue);
        sys::rd_kafka_TopicCollection_destroy(collection);
    }
    request.wait("DescribeTopics")?;
    // SAFETY: `event` is live until `request` drops, after everything is copied out; the
    // descriptions, their errors and operations are owned by it.
    unsafe {
        let result = sys::rd_kafka_event_DescribeTopics_result(request.event);
        if result.is_null() {
            return Err(invalid("not a DescribeTopics result"));
        }
        let mut count = 0usize;
        let descriptions = sys::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        if descriptions.is_null() {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(count);
        for &d in std::slice::from_raw_parts(descriptions, count) {
            let name = owned(sys::rd_kafka_TopicDescription_name(d));
            if let Some(e) = error_of(sys::rd_kafka_TopicDescription_error(d)) {
                out.push((name, Err(e)));
                continue;
            }
            let mut n = 0usize;
            let ops = sys::rd_kafka_TopicDescription_authorized_operations(d, &mut n);
            out.push((name, Ok(operations(ops, n))));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_round_trip() {
        for (ours, theirs) in OPERATIONS {
            assert_eq!(operation_from_sys(theirs), ours);
            assert_eq!(operation_to_sys(ours), theirs);
        }
    }

    #[test]
    fn a_name_with_a_nul_byte_is_refused_before_librdkafka_sees_it() {
        let e = new_binding(
            false,
            ResourceType::Topic,
            Some("a\0b"),
            PatternType::Literal,
            Some("User:x"),
            Some("*"),
            Operation::Read,
            Permission::Allow,
        )
        .err();
        assert!(e.is_some());
    }

    #[test]
    fn a_binding_without_a_principal_is_refused_and_a_filter_without_one_is_not() {
        let make = |filter| {
            new_binding(
                filter,
                ResourceType::Topic,
                Some("t"),
                PatternType::Literal,
                None,
                Some("*"),
                Operation::Read,
                Permission::Allow,
            )
        };
        assert!(make(false).is_err());
        let f = make(true).map(|p| Bindings(vec![p]));
        assert!(f.is_ok());
    }
}
