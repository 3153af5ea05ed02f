//! The queue ports: sending ([`QueueSend`]) and consuming ([`QueueConsume`]: receive, visibility,
//! delete, the DLQ's move task), the message as received, and the queue's errors.

use super::RetryIntent;
use crate::domain::MessageId;
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::time::Duration;

/// Errors of a queue.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The receipt handle is not the message's current one: the lease was lost.
    #[error("receipt handle is invalid or expired")]
    ReceiptInvalid,
    /// The queue could not be reached or failed; try again.
    #[error("queue unavailable: {0}")]
    Unavailable(String),
    /// The request itself is wrong; retrying will not help.
    #[error("queue rejected the request: {0}")]
    Rejected(String),
}

impl RetryIntent for QueueError {
    fn is_retryable(&self) -> bool {
        matches!(self, QueueError::Unavailable(_))
    }
}

/// Message attribute naming why a message was moved to a DLQ (set by every queue adapter, read by
/// the DLQ sweep and `lanes dlq`).
pub const DEAD_LETTER_REASON: &str = "DeadLetterReason";
/// Message attribute naming the queue a dead-lettered message came from.
pub const DEAD_LETTER_SOURCE: &str = "DeadLetterSourceQueue";

/// A message as received, SQS-shaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    /// Stable id of the message.
    pub message_id: MessageId,
    /// Handle of this delivery; only the newest delivery's handle is valid.
    pub receipt: String,
    /// The body.
    pub body: String,
    /// `ApproximateReceiveCount`, including this delivery.
    pub receive_count: u32,
    /// Unix ms when it was first sent.
    pub sent_at_ms: u64,
    /// Message attributes (lane, kind, enqueue time).
    pub attributes: BTreeMap<String, String>,
    /// The lease this delivery already has: the visibility it was received with, when the receiver
    /// chose one ([`QueueConsume::receive_for`]), or the one a Lambda batch started for all its
    /// deliveries at once (`lease::start_many`); `None` while the queue's default applies, as for
    /// what Lambda's event source mapping delivers. A delivery already in its lease needs no lease
    /// start.
    pub leased_for: Option<Duration>,
    /// When that lease began, as this process saw it: the receive's answer, or the batch's lease
    /// start. A worker that starts a delivery later than one renewal interval after this confirms
    /// the lease before it claims anything on it (`lease::confirm`).
    pub leased_at: Option<tokio::time::Instant>,
}

/// Queue depth as SQS reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepth {
    /// Messages ready to be received.
    pub visible: u64,
    /// Messages received and not yet deleted or visible again.
    pub in_flight: u64,
    /// Age of the oldest message in the queue, in ms.
    pub oldest_age_ms: u64,
}

/// Sending side of a lane queue (ingress, webhook).
#[async_trait]
pub trait QueueSend: Send + Sync {
    /// Sends one message; returns its id.
    async fn send(&self, body: &str, attributes: BTreeMap<String, String>) -> Result<MessageId, QueueError>;
    /// Sends many messages (SQS: 10 a request, failed entries retried); returns the bodies that
    /// could still not be sent.
    async fn send_batch(
        &self,
        messages: &[(String, BTreeMap<String, String>)],
    ) -> Result<Vec<String>, QueueError> {
        let mut unsent = Vec::new();
        for (body, attributes) in messages {
            if let Err(e) = self.send(body, attributes.clone()).await {
                if !e.is_retryable() {
                    return Err(e);
                }
                unsent.push(body.clone());
            }
        }
        Ok(unsent)
    }
}

/// Consuming side of a lane queue (workers, the local poller).
#[async_trait]
pub trait QueueConsume: Send + Sync {
    /// Receives up to `max` visible messages, each becoming invisible for `visibility` (the queue's
    /// default when `None`). Messages received more than `max_receive_count` times are moved to the
    /// DLQ instead. A poller passes its lease TTL, so a poller that dies between receiving and
    /// leasing loses nothing for longer than a lease.
    async fn receive_for(
        &self,
        max: usize,
        visibility: Option<Duration>,
    ) -> Result<Vec<ReceivedMessage>, QueueError>;
    /// Like [`Self::receive_for`], waiting up to `wait` for a message when none is visible, and
    /// answering as soon as one is (SQS long polling, `WaitTimeSeconds`, at most 20 s). An idle
    /// poller uses it instead of asking for the queue's depth in a loop. The default looks again
    /// every 50 ms (test fakes use it); the SQS adapter long-polls, and the embedded queue is woken
    /// the moment a message is shown.
    async fn receive_waiting(
        &self,
        max: usize,
        visibility: Option<Duration>,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let got = self.receive_for(max, visibility).await?;
            if !got.is_empty() || tokio::time::Instant::now() >= until {
                return Ok(got);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    /// Receives with the queue's default visibility (what Lambda's event source mapping does).
    async fn receive(&self, max: usize) -> Result<Vec<ReceivedMessage>, QueueError> {
        self.receive_for(max, None).await
    }
    /// Sets the visibility timeout of one delivery, counted from now (`ChangeMessageVisibility`).
    async fn change_visibility(&self, receipt: &str, timeout: Duration) -> Result<(), QueueError>;
    /// Sets the visibility of many deliveries at once, one result per receipt in order. SQS does it
    /// ten a request (`ChangeMessageVisibilityBatch`); the default asks one by one.
    async fn change_visibility_many(
        &self,
        receipts: &[String],
        timeout: Duration,
    ) -> Vec<Result<(), QueueError>> {
        let mut out = Vec::with_capacity(receipts.len());
        for r in receipts {
            out.push(self.change_visibility(r, timeout).await);
        }
        out
    }
    /// Acknowledges (deletes) a delivery: from `Ok` on, no receive hands the message out again
    /// through this queue. Delivery stays at least once: SQS may deliver a deleted message again,
    /// and the embedded queue does once after a crash that came before the delete was written
    /// (it answers without waiting for that write). So a delete is only ever made of work already
    /// durable, and a consumer takes a delivery of work it finds done as a duplicate.
    async fn delete(&self, receipt: &str) -> Result<(), QueueError>;
    /// Sends a fresh copy of a delivery (receive count 1, visible after `delay`, at most 15 min) and
    /// deletes this one: how a wait on the last delivery avoids the redrive to the DLQ. Waiting is not
    /// failing, so it must not use up receives.
    async fn requeue(&self, message: &ReceivedMessage, delay: Duration) -> Result<(), QueueError>;
    /// Moves a delivery to the DLQ now, recording why (undecodable or out of attempts).
    async fn dead_letter(&self, message: &ReceivedMessage, reason: &str) -> Result<(), QueueError>;
    /// Current depth.
    async fn depth(&self) -> Result<QueueDepth, QueueError>;
    /// The redrive policy's `maxReceiveCount`.
    fn max_receive_count(&self) -> u32;
    /// On a DLQ: starts the queue service's own move of every visible message back to the queue it
    /// came from (SQS's message move task, `StartMessageMoveTask`); returns the task's handle. The
    /// messages travel as they are: their task records must be made runnable first (see
    /// `crate::dlq::redrive_by_move`).
    async fn start_move_back(&self) -> Result<String, QueueError> {
        Err(QueueError::Rejected(
            "this queue is not a DLQ with a source queue to move messages back to".into(),
        ))
    }
    /// On a DLQ: its recent move tasks, newest first (`ListMessageMoveTasks`).
    async fn move_tasks(&self) -> Result<Vec<MoveTask>, QueueError> {
        Ok(Vec::new())
    }
}

/// One move of a DLQ's messages back to their source queue, as `ListMessageMoveTasks` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MoveTask {
    /// The handle (SQS only reports it while the task runs).
    pub handle: Option<String>,
    /// `RUNNING`, `COMPLETED`, `CANCELLING`, `CANCELLED` or `FAILED`.
    pub status: String,
    /// Messages moved so far.
    pub moved: u64,
    /// Messages to move in all, when known.
    pub to_move: Option<u64>,
    /// Why it failed, when it did.
    pub failure_reason: Option<String>,
    /// Unix ms when it started.
    pub started_at_ms: u64,
}
