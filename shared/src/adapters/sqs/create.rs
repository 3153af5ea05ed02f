//! Creating a queue with its DLQ and redrive policy (`lanes dev --backend aws --create`, tests).

use super::message::unavailable;
use crate::ports::QueueError;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;
use std::time::Duration;

/// Creates (idempotently) a queue and its DLQ `<name>-dlq` with a redrive policy; returns the queue URL.
pub async fn create_queue_with_dlq(
    client: &Client,
    name: &str,
    visibility: Duration,
    max_receive_count: u32,
) -> Result<String, QueueError> {
    let dlq = client
        .create_queue()
        .queue_name(format!("{name}-dlq"))
        .attributes(QueueAttributeName::MessageRetentionPeriod, "1209600")
        .send()
        .await
        .map_err(|e| unavailable(&e))?;
    let dlq_url = dlq.queue_url().unwrap_or_default();
    let arn = client
        .get_queue_attributes()
        .queue_url(dlq_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(|e| unavailable(&e))?
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .ok_or_else(|| QueueError::Rejected("DLQ without an ARN".into()))?;
    let policy =
        serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": max_receive_count}).to_string();
    let out = client
        .create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::VisibilityTimeout, visibility.as_secs().to_string())
        .attributes(QueueAttributeName::RedrivePolicy, policy)
        .send()
        .await
        .map_err(|e| unavailable(&e))?;
    out.queue_url()
        .map(str::to_owned)
        .ok_or_else(|| QueueError::Rejected("CreateQueue returned no URL".into()))
}
