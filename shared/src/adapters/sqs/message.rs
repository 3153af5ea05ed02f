//! What an SQS message carries and what SQS answers: outgoing attributes, the trace header as
//! a system attribute, the fairness group as the `MessageGroupId`, visibility in whole seconds, and the error codes that mean a lost receipt.

use crate::domain::fairness::{GROUP_ATTRIBUTE, is_valid_group};
use crate::ports::QueueError;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    MessageAttributeValue, MessageSystemAttributeNameForSends, MessageSystemAttributeValue,
};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// SQS's largest visibility timeout (12 h).
pub(super) const MAX_VISIBILITY_SECS: u64 = 43_200;

pub(super) fn unavailable<E: std::fmt::Debug + ProvideErrorMetadata>(e: &SdkError<E>) -> QueueError {
    let code = e.code().unwrap_or("");
    let message = e.message().unwrap_or("");
    QueueError::Unavailable(if code.is_empty() { format!("{e:?}") } else { format!("{code}: {message}") })
}

/// Whether an SQS error says the delivery is no longer ours (the lease is lost), by its documented
/// code: `ReceiptHandleIsInvalid` and `MessageNotInflight` (also as the query protocol's
/// `AWS.SimpleQueueService.MessageNotInflight`), and `InvalidParameterValue` when its message says
/// the message does not exist or is not available for a visibility change, or that the receipt
/// handle expired: what real SQS answers to a `ChangeMessageVisibility` on a message redelivered
/// to someone else.
pub fn is_lost_receipt(code: Option<&str>, message: Option<&str>) -> bool {
    let message = message.unwrap_or("").to_ascii_lowercase();
    match code.unwrap_or("") {
        "ReceiptHandleIsInvalid" | "MessageNotInflight" | "AWS.SimpleQueueService.MessageNotInflight" => true,
        "InvalidParameterValue" => {
            message.contains("message does not exist or is not available")
                || message.contains("receipt handle has expired")
                || message.contains("receipthandle is invalid")
        }
        _ => false,
    }
}

pub(super) fn attribute(v: &str) -> Result<MessageAttributeValue, QueueError> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(v)
        .build()
        .map_err(|e| QueueError::Rejected(e.to_string()))
}

/// The message attributes of an outgoing message: every attribute but the trace header, which
/// SQS carries as a system attribute ([`trace_attribute`]), and the group, which it carries as
/// the message's `MessageGroupId` ([`group`]).
pub(super) fn attributes(
    map: &BTreeMap<String, String>,
) -> Result<HashMap<String, MessageAttributeValue>, QueueError> {
    map.iter()
        .filter(|(k, _)| k.as_str() != crate::trace::TRACE_HEADER && k.as_str() != GROUP_ATTRIBUTE)
        .map(|(k, v)| Ok((k.clone(), attribute(v)?)))
        .collect()
}

/// The `AWSTraceHeader` system attribute of an outgoing message, when it has a valid one: what
/// joins the consumer's Lambda invocation to the producer's trace.
pub(super) fn trace_attribute(
    map: &BTreeMap<String, String>,
) -> Result<Option<HashMap<MessageSystemAttributeNameForSends, MessageSystemAttributeValue>>, QueueError> {
    let Some(header) = map.get(crate::trace::TRACE_HEADER).filter(|h| crate::trace::is_valid(h)) else {
        return Ok(None);
    };
    let value = MessageSystemAttributeValue::builder()
        .data_type("String")
        .string_value(header)
        .build()
        .map_err(|e| QueueError::Rejected(e.to_string()))?;
    Ok(Some(HashMap::from([(MessageSystemAttributeNameForSends::AwsTraceHeader, value)])))
}

/// The `MessageGroupId` of an outgoing message: its group, when it has one SQS accepts. On a
/// standard queue this makes the queue fair across groups; a message without one is outside the
/// fairness, as in SQS.
pub(super) fn group(map: &BTreeMap<String, String>) -> Option<String> {
    map.get(GROUP_ATTRIBUTE).filter(|g| is_valid_group(g)).cloned()
}

/// SQS counts visibility in whole seconds: round up, never past the 12 h limit.
pub(super) fn visibility_secs(d: Duration) -> i32 {
    d.as_millis().div_ceil(1000).min(u128::from(MAX_VISIBILITY_SECS)) as i32
}
