//! SQS adapter of the queue ports: send (single and batched by ten with per-entry retries),
//! `ChangeMessageVisibility`, delete, dead-lettering with a reason, receive, and depth. Message
//! attributes carry lane, kind and enqueue time. The redrive policy is read from the queue itself, so
//! `maxReceiveCount` and the DLQ are never configured twice.

use crate::domain::MessageId;
use crate::domain::fairness::GROUP_ATTRIBUTE;
use crate::ports::{MoveTask, QueueConsume, QueueDepth, QueueError, QueueSend, ReceivedMessage};
use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::operation::change_message_visibility::ChangeMessageVisibilityError;
use aws_sdk_sqs::operation::delete_message::DeleteMessageError;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};
use std::collections::BTreeMap;
use std::time::Duration;

mod create;
mod message;

pub use create::create_queue_with_dlq;
pub use message::is_lost_receipt;
use message::{attributes, group, trace_attribute, unavailable, visibility_secs};

/// A message to send: body and string attributes.
pub type OutgoingMessage = (String, BTreeMap<String, String>);

/// One SQS queue and its DLQ.
#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: Client,
    url: String,
    dlq_url: Option<String>,
    max_receive_count: u32,
    /// This queue's ARN (read by `connect`).
    arn: Option<String>,
    /// The DLQ's ARN, from the redrive policy.
    dlq_arn: Option<String>,
    /// On a DLQ handle: the ARN of the queue whose DLQ it is (where a move task sends messages back).
    source_arn: Option<String>,
}

impl SqsQueue {
    /// A consumer of `url` whose redrive policy is known (its DLQ's URL and `maxReceiveCount`), built
    /// without I/O. Its ARN is unknown, so it cannot start a move task from its DLQ; use
    /// [`SqsQueue::connect`] for that.
    pub fn known(client: Client, url: &str, dlq_url: &str, max_receive_count: u32) -> Self {
        Self { dlq_url: Some(dlq_url.to_owned()), max_receive_count, ..Self::sender(client, url) }
    }

    /// A sender for `url`, without I/O. Consuming through it treats the queue as having no redrive
    /// policy; use [`SqsQueue::connect`] for a consumer.
    pub fn sender(client: Client, url: &str) -> Self {
        Self {
            client,
            url: url.to_owned(),
            dlq_url: None,
            max_receive_count: u32::MAX,
            arn: None,
            dlq_arn: None,
            source_arn: None,
        }
    }

    /// Binds to `url`, reading its ARN and redrive policy (DLQ and `maxReceiveCount`) once.
    pub async fn connect(client: Client, url: &str) -> Result<Self, QueueError> {
        let attrs = client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        let policy = attrs.attributes().and_then(|a| a.get(&QueueAttributeName::RedrivePolicy)).cloned();
        let arn = attrs.attributes().and_then(|a| a.get(&QueueAttributeName::QueueArn)).cloned();
        let mut dlq_arn = None;
        let (dlq_url, max_receive_count) = match policy {
            None => (None, u32::MAX),
            Some(json) => {
                let v: serde_json::Value = serde_json::from_str(&json)
                    .map_err(|e| QueueError::Rejected(format!("RedrivePolicy: {e}")))?;
                let max = match &v["maxReceiveCount"] {
                    serde_json::Value::Number(n) => n.as_u64().unwrap_or(u64::from(u32::MAX)) as u32,
                    serde_json::Value::String(s) => s.parse().unwrap_or(u32::MAX),
                    _ => u32::MAX,
                };
                let target = v["deadLetterTargetArn"].as_str().unwrap_or_default();
                let name = target.rsplit(':').next().unwrap_or_default();
                let dlq =
                    client.get_queue_url().queue_name(name).send().await.map_err(|e| unavailable(&e))?;
                dlq_arn = Some(target.to_owned()).filter(|a| !a.is_empty());
                (dlq.queue_url().map(str::to_owned), max)
            }
        };
        Ok(Self { client, url: url.to_owned(), dlq_url, max_receive_count, arn, dlq_arn, source_arn: None })
    }

    /// The queue URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A consumer of this queue's DLQ (the twin of the embedded queue's), when it has one.
    pub fn dead_letter_queue(&self) -> Option<SqsQueue> {
        let url = self.dlq_url.as_deref()?;
        let mut dlq = SqsQueue::sender(self.client.clone(), url);
        dlq.arn = self.dlq_arn.clone();
        dlq.source_arn = self.arn.clone();
        Some(dlq)
    }

    /// Sends many messages in batches of ten (eight batches in flight, so a webhook with thousands of
    /// commits still answers within the sender's timeout), retrying entries SQS failed (up to three
    /// rounds). Returns the bodies that still failed.
    pub async fn send_batch(
        &self,
        messages: &[(String, BTreeMap<String, String>)],
    ) -> Result<Vec<String>, QueueError> {
        use futures::StreamExt;
        let sends: Vec<_> = messages.chunks(10).map(|c| self.send_chunk(c)).collect();
        let results: Vec<Result<Vec<String>, QueueError>> =
            futures::stream::iter(sends).buffer_unordered(8).collect().await;
        let mut failed = Vec::new();
        for r in results {
            failed.extend(r?);
        }
        Ok(failed)
    }

    async fn send_chunk(
        &self,
        chunk: &[(String, BTreeMap<String, String>)],
    ) -> Result<Vec<String>, QueueError> {
        let mut pending: Vec<(usize, &OutgoingMessage)> = chunk.iter().enumerate().collect();
        for _ in 0..3 {
            if pending.is_empty() {
                break;
            }
            let entries = pending
                .iter()
                .map(|(i, (body, attrs))| {
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(body)
                        .set_message_attributes(Some(attributes(attrs)?))
                        .set_message_system_attributes(trace_attribute(attrs)?)
                        .set_message_group_id(group(attrs))
                        .build()
                        .map_err(|e| QueueError::Rejected(e.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let out = self
                .client
                .send_message_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| unavailable(&e))?;
            let again: Vec<String> =
                out.failed().iter().filter(|f| !f.sender_fault()).map(|f| f.id().to_owned()).collect();
            if let Some(f) = out.failed().iter().find(|f| f.sender_fault()) {
                return Err(QueueError::Rejected(format!(
                    "{}: {}",
                    f.code(),
                    f.message().unwrap_or_default()
                )));
            }
            pending.retain(|(i, _)| again.contains(&i.to_string()));
        }
        Ok(pending.into_iter().map(|(_, (body, _))| body.clone()).collect())
    }
}

#[async_trait]
impl QueueSend for SqsQueue {
    async fn send(&self, body: &str, attrs: BTreeMap<String, String>) -> Result<MessageId, QueueError> {
        let out = self
            .client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .set_message_attributes(Some(attributes(&attrs)?))
            .set_message_system_attributes(trace_attribute(&attrs)?)
            .set_message_group_id(group(&attrs))
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        // Sent, but with no usable id: said as retryable, since a second copy is harmless (every
        // consumer is idempotent) where a message thought sent and lost is not.
        out.message_id()
            .and_then(|id| MessageId::parse(id).ok())
            .ok_or_else(|| QueueError::Unavailable("SQS answered a send without a valid MessageId".into()))
    }

    async fn send_batch(
        &self,
        messages: &[(String, BTreeMap<String, String>)],
    ) -> Result<Vec<String>, QueueError> {
        SqsQueue::send_batch(self, messages).await
    }
}

#[async_trait]
impl QueueConsume for SqsQueue {
    async fn receive_for(
        &self,
        max: usize,
        visibility: Option<Duration>,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        self.receive_waiting(max, visibility, Duration::ZERO).await
    }

    /// `ReceiveMessage` with `WaitTimeSeconds` (whole seconds, at most 20): SQS answers as soon as
    /// a message is there. The call's timeouts are raised past the wait, which the client's own
    /// (made for short calls) would cut.
    async fn receive_waiting(
        &self,
        max: usize,
        visibility: Option<Duration>,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        let wait_secs = wait.as_secs().min(20) as i32;
        let request = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            .set_visibility_timeout(visibility.map(visibility_secs))
            .wait_time_seconds(wait_secs)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All");
        let out = if wait_secs > 0 {
            let long = Duration::from_secs(wait_secs as u64);
            let timeouts = aws_config::timeout::TimeoutConfig::builder()
                .operation_attempt_timeout(long + Duration::from_secs(5))
                .operation_timeout(long + Duration::from_secs(15))
                .build();
            request
                .customize()
                .config_override(aws_sdk_sqs::config::Builder::default().timeout_config(timeouts))
                .send()
                .await
        } else {
            request.send().await
        }
        .map_err(|e| unavailable(&e))?;
        Ok(out
            .messages()
            .iter()
            .filter_map(|m| {
                let sys = m.attributes();
                let get = |k: MessageSystemAttributeName| {
                    sys.and_then(|a| a.get(&k)).and_then(|v| v.parse::<u64>().ok())
                };
                Some(ReceivedMessage {
                    message_id: MessageId::parse(m.message_id()?).ok()?,
                    receipt: m.receipt_handle()?.to_owned(),
                    body: m.body().unwrap_or_default().to_owned(),
                    receive_count: get(MessageSystemAttributeName::ApproximateReceiveCount).unwrap_or(1)
                        as u32,
                    sent_at_ms: get(MessageSystemAttributeName::SentTimestamp).unwrap_or(0),
                    leased_for: visibility,
                    leased_at: visibility.map(|_| tokio::time::Instant::now()),
                    attributes: m
                        .message_attributes()
                        .into_iter()
                        .flatten()
                        .filter_map(|(k, v)| Some((k.clone(), v.string_value()?.to_owned())))
                        .chain(
                            sys.and_then(|a| a.get(&MessageSystemAttributeName::AwsTraceHeader))
                                .filter(|h| crate::trace::is_valid(h))
                                .map(|h| (crate::trace::TRACE_HEADER.to_owned(), h.clone())),
                        )
                        .chain(
                            sys.and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                                .map(|g| (GROUP_ATTRIBUTE.to_owned(), g.clone())),
                        )
                        .collect(),
                })
            })
            .collect())
    }

    async fn change_visibility(&self, receipt: &str, timeout: Duration) -> Result<(), QueueError> {
        let secs = visibility_secs(timeout);
        match self
            .client
            .change_message_visibility()
            .queue_url(&self.url)
            .receipt_handle(receipt)
            .visibility_timeout(secs)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(
                    ChangeMessageVisibilityError::ReceiptHandleIsInvalid(_)
                    | ChangeMessageVisibilityError::MessageNotInflight(_),
                ) => Err(QueueError::ReceiptInvalid),
                _ if is_lost_receipt(e.code(), e.message()) => Err(QueueError::ReceiptInvalid),
                _ => Err(unavailable(&e)),
            },
        }
    }

    /// Ten a request with `ChangeMessageVisibilityBatch` (one receipt alone: the single call, the
    /// same one request). An entry SQS fails is mapped like the single call's error: a lost receipt,
    /// or unavailable; a failed request fails its ten.
    async fn change_visibility_many(
        &self,
        receipts: &[String],
        timeout: Duration,
    ) -> Vec<Result<(), QueueError>> {
        if receipts.len() == 1 {
            return vec![self.change_visibility(&receipts[0], timeout).await];
        }
        let chunks = receipts.chunks(10).map(|chunk| async move {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(r)
                        .visibility_timeout(visibility_secs(timeout))
                        .build()
                        .map_err(|e| QueueError::Rejected(e.to_string()))
                })
                .collect::<Result<Vec<_>, _>>();
            let entries = match entries {
                Ok(e) => e,
                Err(e) => return chunk.iter().map(|_| Err(QueueError::Rejected(e.to_string()))).collect(),
            };
            let out = self
                .client
                .change_message_visibility_batch()
                .queue_url(&self.url)
                .set_entries(Some(entries))
                .send()
                .await;
            match out {
                Err(e) => {
                    let message = match unavailable(&e) {
                        QueueError::Unavailable(m) => m,
                        other => other.to_string(),
                    };
                    chunk.iter().map(|_| Err(QueueError::Unavailable(message.clone()))).collect::<Vec<_>>()
                }
                // One result per receipt: an entry SQS lists neither as done nor as failed is a
                // failed renewal, never a silent success.
                Ok(out) => (0..chunk.len())
                    .map(|i| match out.failed().iter().find(|f| f.id() == i.to_string()) {
                        None if out.successful().iter().any(|s| s.id() == i.to_string()) => Ok(()),
                        None => Err(QueueError::Unavailable("SQS answered nothing for this receipt".into())),
                        Some(f) if is_lost_receipt(Some(f.code()), f.message()) => {
                            Err(QueueError::ReceiptInvalid)
                        }
                        Some(f) => Err(QueueError::Unavailable(format!(
                            "{}: {}",
                            f.code(),
                            f.message().unwrap_or_default()
                        ))),
                    })
                    .collect(),
            }
        });
        futures::future::join_all(chunks).await.into_iter().flatten().collect()
    }

    async fn delete(&self, receipt: &str) -> Result<(), QueueError> {
        match self.client.delete_message().queue_url(&self.url).receipt_handle(receipt).send().await {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(DeleteMessageError::ReceiptHandleIsInvalid(_)) => Err(QueueError::ReceiptInvalid),
                _ if is_lost_receipt(e.code(), e.message()) => Err(QueueError::ReceiptInvalid),
                _ => Err(unavailable(&e)),
            },
        }
    }

    async fn requeue(&self, message: &ReceivedMessage, delay: Duration) -> Result<(), QueueError> {
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(&message.body)
            .delay_seconds(delay.as_secs().min(900) as i32)
            .set_message_attributes(Some(attributes(&message.attributes)?))
            .set_message_system_attributes(trace_attribute(&message.attributes)?)
            .set_message_group_id(group(&message.attributes))
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        // The copy is out, so the delivery is put off whatever happens next: a failed delete leaves two
        // copies, and the task's claim and fence make the second a no-op (in Lambda the delivery is not
        // reported as a failure, so the event source mapping deletes it anyway).
        if let Err(e) = self.delete(&message.receipt).await {
            tracing::warn!(error = %e, "requeued copy sent, original not deleted; the duplicate is harmless");
        }
        Ok(())
    }

    async fn dead_letter(&self, message: &ReceivedMessage, reason: &str) -> Result<(), QueueError> {
        let Some(dlq) = &self.dlq_url else {
            return Err(QueueError::Rejected(format!("{} has no redrive policy", self.url)));
        };
        let mut attrs = message.attributes.clone();
        attrs.insert(crate::ports::DEAD_LETTER_REASON.into(), reason.chars().take(1024).collect());
        attrs.insert(crate::ports::DEAD_LETTER_SOURCE.into(), self.url.clone());
        self.client
            .send_message()
            .queue_url(dlq)
            .message_body(&message.body)
            .set_message_attributes(Some(attributes(&attrs)?))
            .set_message_system_attributes(trace_attribute(&attrs)?)
            .set_message_group_id(group(&attrs))
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        self.delete(&message.receipt).await
    }

    async fn depth(&self) -> Result<QueueDepth, QueueError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        let get = |k: QueueAttributeName| {
            out.attributes().and_then(|a| a.get(&k)).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        };
        // The oldest message's age is a CloudWatch metric (ApproximateAgeOfOldestMessage), not a queue
        // attribute; it is not read here.
        Ok(QueueDepth {
            visible: get(QueueAttributeName::ApproximateNumberOfMessages),
            in_flight: get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            oldest_age_ms: 0,
        })
    }

    fn max_receive_count(&self) -> u32 {
        self.max_receive_count
    }

    /// `StartMessageMoveTask` from this DLQ to the queue whose DLQ it is, named explicitly (rather
    /// than left to SQS's "original source") so a message dead-lettered by hand moves back too.
    async fn start_move_back(&self) -> Result<String, QueueError> {
        let (Some(source), Some(destination)) = (&self.arn, &self.source_arn) else {
            return Err(QueueError::Rejected(format!("{} is not a DLQ handle with known ARNs", self.url)));
        };
        let out = self
            .client
            .start_message_move_task()
            .source_arn(source)
            .destination_arn(destination)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        out.task_handle().map(str::to_owned).ok_or_else(|| QueueError::Unavailable("no TaskHandle".into()))
    }

    async fn move_tasks(&self) -> Result<Vec<MoveTask>, QueueError> {
        let Some(source) = &self.arn else {
            return Err(QueueError::Rejected(format!("{} is not a DLQ handle with a known ARN", self.url)));
        };
        let out = self
            .client
            .list_message_move_tasks()
            .source_arn(source)
            .max_results(10)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(out
            .results()
            .iter()
            .map(|r| MoveTask {
                handle: r.task_handle().map(str::to_owned),
                status: r.status().unwrap_or("UNKNOWN").to_owned(),
                moved: r.approximate_number_of_messages_moved().max(0) as u64,
                to_move: r.approximate_number_of_messages_to_move().map(|n| n.max(0) as u64),
                failure_reason: r.failure_reason().map(str::to_owned),
                started_at_ms: r.started_timestamp().max(0) as u64,
            })
            .collect())
    }
}
