//! What the broker lets this principal do: the operations it is authorized for
//! on topics and consumer groups (KIP-430's `authorized_operations`), asked
//! through librdkafka's DescribeTopics and DescribeConsumerGroups, which the
//! `rdkafka` crate does not wrap. A broker without an authorizer answers every
//! operation, so the check costs one round trip and passes.
//!
//! The only unsafe code of Sluice lives here: each call's pointers are owned by
//! this function and destroyed before it returns.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::ffi::{CStr, CString, c_char};
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::ClientContext;

use crate::access::{Operation, ResourceKind};

/// The broker's answer for one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Authorized {
    /// The operations allowed (`None`: the broker did not say).
    Operations(Option<BTreeSet<Operation>>),
    /// Not even described: no ACL names it for this principal.
    Denied,
    /// It does not exist (a group not yet joined is not this: it is described).
    Missing,
    Other(String),
}

fn operation(op: rd::rd_kafka_AclOperation_t) -> Vec<Operation> {
    use rd::rd_kafka_AclOperation_t::*;
    match op {
        RD_KAFKA_ACL_OPERATION_ALL => vec![
            Operation::Read,
            Operation::Write,
            Operation::Create,
            Operation::DescribeConfigs,
        ],
        RD_KAFKA_ACL_OPERATION_READ => vec![Operation::Read],
        RD_KAFKA_ACL_OPERATION_WRITE => vec![Operation::Write],
        RD_KAFKA_ACL_OPERATION_CREATE => vec![Operation::Create],
        RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS => vec![Operation::DescribeConfigs],
        _ => Vec::new(),
    }
}

/// Reads the error out of a librdkafka error object (NULL or NO_ERROR: none).
///
/// SAFETY: `error` is NULL or a live `rd_kafka_error_t`.
unsafe fn error_of(error: *const rd::rd_kafka_error_t) -> Option<Authorized> {
    if error.is_null() {
        return None;
    }
    let code = unsafe { rd::rd_kafka_error_code(error) };
    use rd::rd_kafka_resp_err_t::*;
    match code {
        RD_KAFKA_RESP_ERR_NO_ERROR => None,
        RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED
        | RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED => Some(Authorized::Denied),
        RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART => Some(Authorized::Missing),
        _ => Some(Authorized::Other(unsafe {
            CStr::from_ptr(rd::rd_kafka_error_string(error))
                .to_string_lossy()
                .into_owned()
        })),
    }
}

/// SAFETY: `ops` points at `n` operations (or is NULL).
unsafe fn operations_of(ops: *const rd::rd_kafka_AclOperation_t, n: usize) -> Authorized {
    if ops.is_null() {
        return Authorized::Operations(None);
    }
    let set = unsafe { std::slice::from_raw_parts(ops, n) }
        .iter()
        .flat_map(|op| operation(*op))
        .collect();
    Authorized::Operations(Some(set))
}

/// Asks the broker what this client's principal may do on each of `names`
/// (topics or consumer groups); answers in the order asked.
pub fn describe<C: ClientContext>(
    admin: &AdminClient<C>,
    kind: ResourceKind,
    names: &[String],
    timeout: Duration,
) -> Result<Vec<(String, Authorized)>, String> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let c_names: Vec<CString> = names
        .iter()
        .map(|n| CString::new(n.as_str()).map_err(|e| format!("{n:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let mut ptrs: Vec<*const c_char> = c_names.iter().map(|n| n.as_ptr()).collect();
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let rk = admin.inner().native_ptr();
    let op = match kind {
        ResourceKind::Topic => rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        ResourceKind::Group => rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS,
        ResourceKind::TransactionalId => {
            return Err("the broker describes no transactional id's operations".into());
        }
    };
    // SAFETY: `rk` is the admin client's live handle; the queue, options, topic
    // collection and result event are created here and destroyed below; every
    // pointer read from the event is used before the event is destroyed.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        let options = rd::rd_kafka_AdminOptions_new(rk, op);
        let mut errstr = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options,
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        let err = rd::rd_kafka_AdminOptions_set_include_authorized_operations(options, 1);
        if !err.is_null() {
            rd::rd_kafka_error_destroy(err);
        }
        let mut collection = std::ptr::null_mut();
        match kind {
            ResourceKind::Topic => {
                collection =
                    rd::rd_kafka_TopicCollection_of_topic_names(ptrs.as_mut_ptr(), ptrs.len());
                rd::rd_kafka_DescribeTopics(rk, collection, options, queue);
            }
            _ => rd::rd_kafka_DescribeConsumerGroups(
                rk,
                ptrs.as_mut_ptr(),
                ptrs.len(),
                options,
                queue,
            ),
        }
        let event = rd::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(1_000));
        let result = if event.is_null() {
            Err(format!("no answer within {} ms", timeout.as_millis()))
        } else if rd::rd_kafka_event_error(event)
            != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            Err(CStr::from_ptr(rd::rd_kafka_event_error_string(event))
                .to_string_lossy()
                .into_owned())
        } else {
            let mut answers = Vec::new();
            let mut n = 0usize;
            match kind {
                ResourceKind::Topic => {
                    let r = rd::rd_kafka_event_DescribeTopics_result(event);
                    let topics = rd::rd_kafka_DescribeTopics_result_topics(r, &mut n);
                    for i in 0..n {
                        let t = *topics.add(i);
                        let name = CStr::from_ptr(rd::rd_kafka_TopicDescription_name(t))
                            .to_string_lossy()
                            .into_owned();
                        let answer = match error_of(rd::rd_kafka_TopicDescription_error(t)) {
                            Some(e) => e,
                            None => {
                                let mut m = 0usize;
                                let ops =
                                    rd::rd_kafka_TopicDescription_authorized_operations(t, &mut m);
                                operations_of(ops, m)
                            }
                        };
                        answers.push((name, answer));
                    }
                }
                _ => {
                    let r = rd::rd_kafka_event_DescribeConsumerGroups_result(event);
                    let groups = rd::rd_kafka_DescribeConsumerGroups_result_groups(r, &mut n);
                    for i in 0..n {
                        let g = *groups.add(i);
                        let name =
                            CStr::from_ptr(rd::rd_kafka_ConsumerGroupDescription_group_id(g))
                                .to_string_lossy()
                                .into_owned();
                        let answer = match error_of(rd::rd_kafka_ConsumerGroupDescription_error(g))
                        {
                            Some(e) => e,
                            None => {
                                let mut m = 0usize;
                                let ops =
                                    rd::rd_kafka_ConsumerGroupDescription_authorized_operations(
                                        g, &mut m,
                                    );
                                operations_of(ops, m)
                            }
                        };
                        answers.push((name, answer));
                    }
                }
            }
            Ok(answers)
        };
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        if !collection.is_null() {
            rd::rd_kafka_TopicCollection_destroy(collection);
        }
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_queue_destroy(queue);
        drop(c_names);
        result
    }
}
