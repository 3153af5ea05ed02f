//! The worker core (design §3): one message under a short lease. It owns the heartbeat (visibility and
//! lock renewed together, work cancelled when either says the lease is lost), the claim that returns
//! the fence, the fenced final write, the ack rule, full-jitter backoff through visibility, and DLQs.

use crate::clock::SharedClock;
use crate::config::WorkerConfig;
use crate::domain::{TaskMessage, TaskRecord, TaskResult};
use crate::metrics::Metrics;
use crate::ports::{
    Acquire, Cache, ClaimOutcome, Completion, FinishOutcome, LeaseLock, LlmClient, LlmError, LlmRequest,
    QueueConsume, QueueError, ReceivedMessage, StoreError, TaskStore,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

/// What became of one message. Only `Acked` and `DeadLettered` remove it from its queue; everything
/// else leaves it to come back (a batch item failure in Lambda).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The record is terminal and the message was deleted.
    Acked,
    /// Handed back to come again after `after` (retryable failure or a lock held elsewhere).
    Retry {
        /// The visibility set on the message.
        after: Duration,
        /// Why.
        reason: String,
    },
    /// The lease was lost (or the fence moved): nothing was written, the message is left to its next
    /// delivery.
    LeaseLost,
    /// Moved to the DLQ (undecodable, or out of attempts with the record marked `FAILED`).
    DeadLettered {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// Whether the message stays in its queue (an `SQSBatchItemFailure` in Lambda).
    pub fn is_batch_item_failure(&self) -> bool {
        !matches!(self, Outcome::Acked | Outcome::DeadLettered { .. })
    }
}

/// Everything a worker needs, built once per process.
#[derive(Clone)]
pub struct Worker {
    /// Durable records.
    pub store: Arc<dyn TaskStore>,
    /// Lease lock.
    pub lock: Arc<dyn LeaseLock>,
    /// Hot cache of completed tasks.
    pub cache: Arc<dyn Cache>,
    /// The model.
    pub llm: Arc<dyn LlmClient>,
    /// Metrics.
    pub metrics: Metrics,
    /// Time.
    pub clock: SharedClock,
    /// Lease and retry settings.
    pub config: WorkerConfig,
}

/// Cache key of a task's record in the hot cache.
pub fn cache_key(task_id: &str) -> String {
    format!("task:{task_id}")
}

/// Full-jitter backoff: uniform in `[0, min(max, base * 2^(receive_count - 1))]`, never below 1 ms so a
/// retry is never an immediate redelivery loop.
pub fn full_jitter_backoff(config: &WorkerConfig, receive_count: u32) -> Duration {
    let exp = receive_count.saturating_sub(1).min(30);
    let cap = config.backoff_base.saturating_mul(1u32 << exp).min(config.backoff_max);
    let ms = cap.as_millis().max(1) as u64;
    Duration::from_millis(rand::random_range(1..=ms))
}

/// Aborts the heartbeat task on every exit path (success, error, panic, cancellation).
struct HeartbeatGuard(JoinHandle<()>);

impl Drop for HeartbeatGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Worker {
    /// Processes one delivery to the end, applying the ack rule. Never panics on input.
    pub async fn process(&self, queue: Arc<dyn QueueConsume>, message: ReceivedMessage) -> Outcome {
        let span = info_span!("task", message_id = %message.message_id, task_id = tracing::field::Empty, lane = tracing::field::Empty);
        self.process_inner(queue, message).instrument(span).await
    }

    async fn process_inner(&self, queue: Arc<dyn QueueConsume>, message: ReceivedMessage) -> Outcome {
        let task: TaskMessage = match serde_json::from_str(&message.body) {
            Ok(t) => t,
            Err(e) => {
                let reason = format!("undecodable message: {e}");
                return self.dead_letter(&*queue, &message, reason, "unknown", "undecodable").await;
            }
        };
        let span = tracing::Span::current();
        span.record("task_id", task.task_id.as_str());
        span.record("lane", task.lane.as_str());
        let lane = task.lane.as_str();
        let ttl = self.config.lease_ttl;

        // The queue's own visibility stays long (Lambda requires it); the lease is made short here.
        match queue.change_visibility(&message.receipt, ttl).await {
            Ok(()) => {}
            Err(QueueError::ReceiptInvalid) => return Outcome::LeaseLost,
            Err(e) => {
                warn!(error = %e, "could not start the lease");
                return Outcome::Retry { after: Duration::ZERO, reason: "queue unavailable".into() };
            }
        }

        let lock_key = format!("lease:{{task:{}}}", task.task_id);
        let token = match self.lock.acquire(&lock_key, ttl).await {
            Ok(Acquire::Acquired(token)) => Some(token),
            Ok(Acquire::Held { remaining }) => {
                // Another live worker has it: hand the message back for when its lease would have
                // ended. Never dropped: if that worker dies, this delivery finishes the task.
                self.metrics.lock_contended_total.with_label_values(&[lane]).inc();
                let jitter = rand::random_range(0..=self.config.lock_jitter_max.as_millis() as u64);
                let after = remaining + Duration::from_millis(jitter);
                return self.hand_back(&*queue, &message, after, "lease held by another worker").await;
            }
            Err(e) => {
                // Redis is an accelerator: without it, SQS visibility plus the fence still keep
                // writes single; only duplicate LLM calls become possible.
                warn!(error = %e, "lock unavailable; running degraded");
                self.metrics.degraded_operations_total.with_label_values(&["lock"]).inc();
                None
            }
        };
        let outcome = self.run_claimed(&queue, &message, &task, &lock_key, token.as_deref()).await;
        if let (Some(token), false) = (token, matches!(outcome, Outcome::LeaseLost)) {
            if let Err(e) = self.lock.release(&lock_key, &token).await {
                warn!(error = %e, "lock release failed; it expires with its TTL");
            }
        }
        outcome
    }

    async fn run_claimed(
        &self,
        queue: &Arc<dyn QueueConsume>,
        message: &ReceivedMessage,
        task: &TaskMessage,
        lock_key: &str,
        token: Option<&str>,
    ) -> Outcome {
        let lane = task.lane.as_str();
        let now = self.clock.now_ms();
        let record = match self.store.claim(&task.task_id, now, self.config.record_ttl_secs).await {
            Ok(ClaimOutcome::Claimed(r)) => r,
            Ok(ClaimOutcome::Terminal(_)) | Ok(ClaimOutcome::Missing) => {
                // Terminal: a duplicate delivery. Missing: ingress removed the record after a failed
                // send, or it expired; there is nothing left to do for this message.
                return self.ack(&**queue, message).await;
            }
            Err(e) => return self.store_failure(&**queue, message, e).await,
        };
        self.metrics
            .task_wait_seconds
            .with_label_values(&[lane])
            .observe(now.saturating_sub(record.created_at_ms) as f64 / 1000.0);

        let cancel = CancellationToken::new();
        let _heartbeat = HeartbeatGuard(self.spawn_heartbeat(
            queue.clone(),
            message.receipt.clone(),
            lock_key.to_owned(),
            token.map(str::to_owned),
            lane,
            cancel.clone(),
        ));
        let request = LlmRequest {
            lane: task.lane,
            kind: record.request.kind,
            prompt: record.request.prompt.clone(),
            target_files: record.request.target_files.clone(),
            max_tokens: self.config.max_completion_tokens,
        };
        let answer = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            r = self.llm.complete(&request) => Some(r),
        };
        let Some(answer) = answer.filter(|_| !cancel.is_cancelled()) else {
            info!("lease lost mid-task; dropping the work, writing nothing");
            self.metrics.leases_lost_total.with_label_values(&[lane]).inc();
            return Outcome::LeaseLost;
        };
        match answer {
            Ok(resp) => {
                self.metrics.llm_requests_total.with_label_values(&[lane, "ok"]).inc();
                self.metrics.llm_tokens_total.with_label_values(&[lane, "prompt"]).inc_by(resp.usage.prompt);
                self.metrics
                    .llm_tokens_total
                    .with_label_values(&[lane, "completion"])
                    .inc_by(resp.usage.completion);
                let result = TaskResult { text: resp.text, model: resp.model, tokens: resp.usage };
                self.finish(queue, message, &record, Completion::Completed(result)).await
            }
            Err(e @ LlmError::Permanent(_)) => {
                self.metrics.llm_requests_total.with_label_values(&[lane, "permanent"]).inc();
                self.finish(queue, message, &record, Completion::Failed(e.to_string())).await
            }
            Err(e @ LlmError::Retryable { .. }) => {
                self.metrics.llm_requests_total.with_label_values(&[lane, "retryable"]).inc();
                if message.receive_count >= queue.max_receive_count() {
                    let reason = format!("gave up after {} attempts: {e}", message.receive_count);
                    return match self
                        .finish(queue, message, &record, Completion::Failed(reason.clone()))
                        .await
                    {
                        Outcome::Acked => Outcome::DeadLettered { reason },
                        other => other,
                    };
                }
                let hint = match &e {
                    LlmError::Retryable { retry_after, .. } => retry_after.unwrap_or_default(),
                    LlmError::Permanent(_) => Duration::ZERO,
                };
                let after = full_jitter_backoff(&self.config, message.receive_count).max(hint);
                self.hand_back(&**queue, message, after, &e.to_string()).await
            }
        }
    }

    /// Fenced final write, then cache, then ack. Attempts exhausted are also dead-lettered so
    /// operators see them in the DLQ.
    async fn finish(
        &self,
        queue: &Arc<dyn QueueConsume>,
        message: &ReceivedMessage,
        record: &TaskRecord,
        completion: Completion,
    ) -> Outcome {
        let lane = record.lane.as_str();
        let failed_reason = match &completion {
            Completion::Failed(r) => Some(r.clone()),
            Completion::Completed(_) => None,
        };
        let now = self.clock.now_ms();
        let written = self
            .store
            .finish(&record.task_id, record.fence, completion, now, self.config.record_ttl_secs)
            .await;
        match written {
            Ok(FinishOutcome::Written) => {}
            Ok(FinishOutcome::StaleFence) => {
                warn!(fence = record.fence, "final write rejected by the fence");
                self.metrics.stale_writes_rejected_total.with_label_values(&[lane]).inc();
                return Outcome::LeaseLost;
            }
            Err(e) => return self.store_failure(&**queue, message, e).await,
        }
        if let Some(started) = record.started_at_ms {
            self.metrics
                .task_run_seconds
                .with_label_values(&[lane])
                .observe(now.saturating_sub(started) as f64 / 1000.0);
        }
        self.metrics
            .task_latency_seconds
            .with_label_values(&[lane])
            .observe(now.saturating_sub(record.created_at_ms) as f64 / 1000.0);
        if failed_reason.is_none() {
            self.fill_cache(&record.task_id).await;
        }
        match failed_reason {
            Some(reason) if message.receive_count >= queue.max_receive_count() => {
                self.dead_letter(&**queue, message, reason, lane, "attempts").await
            }
            _ => self.ack(&**queue, message).await,
        }
    }

    async fn fill_cache(&self, task_id: &str) {
        let now = self.clock.now_ms();
        let Ok(Some(done)) = self.store.get(task_id, now).await else { return };
        let Ok(json) = serde_json::to_string(&done) else { return };
        if let Err(e) = self.cache.set(&cache_key(task_id), &json, self.config.result_cache_ttl).await {
            warn!(error = %e, "cache fill failed");
            self.metrics.degraded_operations_total.with_label_values(&["cache"]).inc();
        }
    }

    fn spawn_heartbeat(
        &self,
        queue: Arc<dyn QueueConsume>,
        receipt: String,
        lock_key: String,
        token: Option<String>,
        lane: &'static str,
        cancel: CancellationToken,
    ) -> JoinHandle<()> {
        let lock = self.lock.clone();
        let metrics = self.metrics.clone();
        let (ttl, every) = (self.config.lease_ttl, self.config.renew_interval);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match queue.change_visibility(&receipt, ttl).await {
                    Ok(()) => {}
                    Err(QueueError::ReceiptInvalid) => {
                        warn!("visibility renewal refused: lease lost");
                        cancel.cancel();
                        return;
                    }
                    Err(e) => warn!(error = %e, "visibility renewal failed; retrying next beat"),
                }
                if let Some(token) = &token {
                    match lock.renew(&lock_key, token, ttl).await {
                        Ok(true) => {}
                        Ok(false) => {
                            warn!("lock renewal refused: lease lost");
                            cancel.cancel();
                            return;
                        }
                        Err(e) => {
                            warn!(error = %e, "lock renewal failed; running degraded");
                            metrics.degraded_operations_total.with_label_values(&["lock"]).inc();
                        }
                    }
                }
                metrics.lease_renewals_total.with_label_values(&[lane]).inc();
            }
        })
    }

    async fn ack(&self, queue: &dyn QueueConsume, message: &ReceivedMessage) -> Outcome {
        match queue.delete(&message.receipt).await {
            Ok(()) => Outcome::Acked,
            // The record is terminal: the next delivery will find it so and ack then.
            Err(e) => {
                warn!(error = %e, "delete failed; the message will return and be acked then");
                Outcome::Retry { after: Duration::ZERO, reason: "delete failed".into() }
            }
        }
    }

    async fn hand_back(
        &self,
        queue: &dyn QueueConsume,
        message: &ReceivedMessage,
        after: Duration,
        reason: &str,
    ) -> Outcome {
        if let Err(e) = queue.change_visibility(&message.receipt, after).await {
            warn!(error = %e, "could not set the retry delay; the lease TTL applies");
        }
        Outcome::Retry { after, reason: reason.to_owned() }
    }

    async fn store_failure(
        &self,
        queue: &dyn QueueConsume,
        message: &ReceivedMessage,
        e: StoreError,
    ) -> Outcome {
        warn!(error = %e, "store failure");
        let after = full_jitter_backoff(&self.config, message.receive_count);
        self.hand_back(queue, message, after, "store unavailable").await
    }

    async fn dead_letter(
        &self,
        queue: &dyn QueueConsume,
        message: &ReceivedMessage,
        reason: String,
        lane: &str,
        why: &str,
    ) -> Outcome {
        warn!(%reason, "moving message to the DLQ");
        match queue.dead_letter(message, &reason).await {
            Ok(()) => {
                self.metrics.dead_lettered_total.with_label_values(&[lane, why]).inc();
                Outcome::DeadLettered { reason }
            }
            Err(e) => {
                warn!(error = %e, "dead-lettering failed; redrive will move it after maxReceiveCount");
                Outcome::Retry { after: Duration::ZERO, reason }
            }
        }
    }
}
