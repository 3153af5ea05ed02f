//! The worker core (design §3): one message under a short lease. It owns the heartbeat (visibility and
//! lock renewed together, work cancelled when either says the lease is lost), the claim that returns
//! the fence, the fenced final write, the ack rule, full-jitter backoff through visibility, and DLQs.

use crate::clock::SharedClock;
use crate::config::WorkerConfig;
use crate::domain::{TaskMessage, TaskRecord, TaskResult};
use crate::metrics::{Latency, Metrics};
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
                return dead_letter(&self.metrics, &*queue, &message, reason, "unknown", "undecodable").await;
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
                return hand_back(&*queue, &message, after, "lease held by another worker").await;
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
        if let (Some(token), false) = (token, matches!(outcome, Outcome::LeaseLost))
            && let Err(e) = self.lock.release(&lock_key, &token).await
        {
            warn!(error = %e, "lock release failed; it expires with its TTL");
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
                return ack(&**queue, message).await;
            }
            Err(e) => return self.store_failure(&**queue, message, e).await,
        };
        let waited = now.saturating_sub(record.created_at_ms) as f64 / 1000.0;
        self.metrics.observe(Latency::Wait, lane, waited);

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
                    // finish() dead-letters a failure on the last attempt.
                    return self.finish(queue, message, &record, Completion::Failed(reason)).await;
                }
                let hint = match &e {
                    LlmError::Retryable { retry_after, .. } => retry_after.unwrap_or_default(),
                    LlmError::Permanent(_) => Duration::ZERO,
                };
                let after = full_jitter_backoff(&self.config, message.receive_count).max(hint);
                hand_back(&**queue, message, after, &e.to_string()).await
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
        let now = self.clock.now_ms();
        let (failed_reason, done) = match &completion {
            Completion::Failed(r) => (Some(r.clone()), None),
            Completion::Completed(result) => {
                // The record as the fenced write leaves it, built here so the cache costs no read.
                let mut done = record.clone();
                done.status = crate::domain::TaskStatus::Completed;
                done.result = Some(result.clone());
                done.finished_at_ms = Some(now);
                done.expires_at = now / 1000 + self.config.record_ttl_secs;
                (None, Some(done))
            }
        };
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
            self.metrics.observe(Latency::Run, lane, now.saturating_sub(started) as f64 / 1000.0);
        }
        self.metrics.observe(Latency::Total, lane, now.saturating_sub(record.created_at_ms) as f64 / 1000.0);
        if let Some(done) = done {
            self.fill_cache(&done).await;
        }
        match failed_reason {
            Some(reason) if message.receive_count >= queue.max_receive_count() => {
                dead_letter(&self.metrics, &**queue, message, reason, lane, "attempts").await
            }
            _ => ack(&**queue, message).await,
        }
    }

    async fn fill_cache(&self, done: &TaskRecord) {
        let Ok(json) = serde_json::to_string(done) else { return };
        if let Err(e) = self.cache.set(&cache_key(&done.task_id), &json, self.config.result_cache_ttl).await {
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

    async fn store_failure(
        &self,
        queue: &dyn QueueConsume,
        message: &ReceivedMessage,
        e: StoreError,
    ) -> Outcome {
        warn!(error = %e, "store failure");
        let after = full_jitter_backoff(&self.config, message.receive_count);
        hand_back(queue, message, after, "store unavailable").await
    }
}

/// Acknowledges a delivery whose record is terminal.
pub(crate) async fn ack(queue: &dyn QueueConsume, message: &ReceivedMessage) -> Outcome {
    match queue.delete(&message.receipt).await {
        Ok(()) => Outcome::Acked,
        // The record is terminal: the next delivery will find it so and ack then.
        Err(e) => {
            warn!(error = %e, "delete failed; the message will return and be acked then");
            Outcome::Retry { after: Duration::ZERO, reason: "delete failed".into() }
        }
    }
}

/// Hands a delivery back to come again after `after`.
pub(crate) async fn hand_back(
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

/// Moves a delivery to the DLQ with `reason`, counted by lane and `why`.
pub(crate) async fn dead_letter(
    metrics: &Metrics,
    queue: &dyn QueueConsume,
    message: &ReceivedMessage,
    reason: String,
    lane: &str,
    why: &str,
) -> Outcome {
    warn!(%reason, "moving message to the DLQ");
    match queue.dead_letter(message, &reason).await {
        Ok(()) => {
            metrics.dead_lettered_total.with_label_values(&[lane, why]).inc();
            Outcome::DeadLettered { reason }
        }
        Err(e) => {
            warn!(error = %e, "dead-lettering failed; redrive will move it after maxReceiveCount");
            Outcome::Retry { after: Duration::ZERO, reason }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock, SystemClock};
    use crate::domain::{TaskRequest, TaskStatus};
    use crate::embedded::{
        EmbeddedDb, EmbeddedQueue, EmbeddedQueues, EmbeddedStore, MemoryCache, MemoryLock, QueueSettings,
    };
    use crate::ports::{LlmResponse, PutOutcome, QueueSend};
    use async_trait::async_trait;
    use serde_json::json;
    use std::collections::{BTreeMap, VecDeque};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A provider with a fixed delay that fails as scripted, then answers.
    #[derive(Default)]
    struct ScriptedLlm {
        delay: Duration,
        failures: Mutex<VecDeque<LlmError>>,
        calls: AtomicU64,
    }

    #[async_trait]
    impl LlmClient for ScriptedLlm {
        async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            if let Some(e) = self.failures.lock().unwrap().pop_front() {
                return Err(e);
            }
            Ok(LlmResponse {
                text: format!("answer to {}", request.prompt),
                model: "scripted".into(),
                usage: Default::default(),
            })
        }
    }

    struct Rig {
        _dir: tempfile::TempDir,
        worker: Worker,
        queue: EmbeddedQueue,
        store: EmbeddedStore,
        lock: Arc<MemoryLock>,
        llm: Arc<ScriptedLlm>,
        task_id: String,
    }

    async fn rig(clock: SharedClock, llm: ScriptedLlm, config: WorkerConfig) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let store = EmbeddedStore::new(db.clone());
        let settings = QueueSettings { default_visibility: Duration::from_secs(900), max_receive_count: 3 };
        let queue = EmbeddedQueues::open(db, clock.clone(), settings)
            .await
            .unwrap()
            .queue("interactive", "interactive-dlq");
        let request = TaskRequest::from_value(
            json!({"project_id":"p","kind":"explain","prompt":"why","target_files":[]}),
        )
        .unwrap();
        let record = TaskRecord::pending(request.task_id(None), request, clock.now_ms(), 3600);
        assert_eq!(store.put_pending(&record, clock.now_ms()).await.unwrap(), PutOutcome::Created);
        let body = json!({"task_id": record.task_id, "lane": "interactive", "kind": "explain"}).to_string();
        queue.send(&body, BTreeMap::new()).await.unwrap();
        let lock = Arc::new(MemoryLock::new(clock.clone()));
        let llm = Arc::new(llm);
        let worker = Worker {
            store: Arc::new(store.clone()),
            lock: lock.clone(),
            cache: Arc::new(MemoryCache::new(clock.clone())),
            llm: llm.clone(),
            metrics: Metrics::new(),
            clock,
            config,
        };
        Rig { _dir: dir, worker, queue, store, lock, llm, task_id: record.task_id }
    }

    fn fast() -> WorkerConfig {
        WorkerConfig {
            lease_ttl: Duration::from_millis(300),
            renew_interval: Duration::from_millis(20),
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_millis(400),
            lock_jitter_max: Duration::from_millis(10),
            ..WorkerConfig::default()
        }
    }

    impl Rig {
        async fn receive(&self) -> ReceivedMessage {
            let mut got = self.queue.receive(1).await.unwrap();
            assert_eq!(got.len(), 1, "expected a visible message");
            got.remove(0)
        }
        async fn status(&self) -> TaskStatus {
            self.store.get(&self.task_id, 0).await.unwrap().unwrap().status
        }
        fn queue(&self) -> Arc<dyn QueueConsume> {
            Arc::new(self.queue.clone())
        }
    }

    #[tokio::test]
    async fn completes_writes_caches_and_acks() {
        let r = rig(Arc::new(SystemClock), ScriptedLlm::default(), fast()).await;
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        let rec = r.store.get(&r.task_id, 0).await.unwrap().unwrap();
        assert_eq!((rec.status, rec.fence), (TaskStatus::Completed, 1));
        assert_eq!(rec.result.unwrap().text, "answer to why");
        assert!(r.worker.cache.get(&cache_key(&r.task_id)).await.unwrap().is_some());
        assert_eq!(r.queue.depth().await.unwrap().visible + r.queue.depth().await.unwrap().in_flight, 0);
    }

    #[tokio::test]
    async fn heartbeat_holds_a_lease_shorter_than_the_llm_call() {
        // lease 60 ms, LLM 250 ms: without renewals the message would be visible again mid-call.
        let config = WorkerConfig {
            lease_ttl: Duration::from_millis(60),
            renew_interval: Duration::from_millis(15),
            ..fast()
        };
        let llm = ScriptedLlm { delay: Duration::from_millis(250), ..Default::default() };
        let r = rig(Arc::new(SystemClock), llm, config).await;
        let m = r.receive().await;
        let (w, q) = (r.worker.clone(), r.queue());
        let run = tokio::spawn(async move { w.process(q, m).await });
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(r.queue.receive(1).await.unwrap().is_empty(), "redelivered while the lease was held");
        }
        assert_eq!(run.await.unwrap(), Outcome::Acked);
        assert_eq!(r.llm.calls.load(Ordering::SeqCst), 1);
        assert!(r.worker.metrics.lease_renewals_total.with_label_values(&["interactive"]).get() >= 3);
    }

    #[tokio::test]
    async fn a_worker_whose_lease_is_lost_mid_task_writes_nothing() {
        let clock = ManualClock::new(1_000_000);
        let llm = ScriptedLlm { delay: Duration::from_millis(400), ..Default::default() };
        let r = rig(clock.clone(), llm, fast()).await;
        let m = r.receive().await;
        let (w, q) = (r.worker.clone(), r.queue());
        let run = tokio::spawn(async move { w.process(q, m).await });
        tokio::time::sleep(Duration::from_millis(30)).await;
        // The worker stalls past its TTL (GC pause, frozen container) and another takes the lease.
        clock.advance_ms(301);
        let key = format!("lease:{{task:{}}}", r.task_id);
        assert!(matches!(r.lock.acquire(&key, Duration::from_secs(10)).await.unwrap(), Acquire::Acquired(_)));
        assert_eq!(run.await.unwrap(), Outcome::LeaseLost);
        let rec = r.store.get(&r.task_id, clock.now_ms()).await.unwrap().unwrap();
        assert_eq!((rec.status, rec.result), (TaskStatus::Processing, None), "nothing written");
        assert_eq!(r.worker.metrics.leases_lost_total.with_label_values(&["interactive"]).get(), 1);
        assert_eq!(r.queue.depth().await.unwrap().in_flight, 1, "the message is left to its next delivery");
    }

    #[tokio::test]
    async fn a_stale_fence_write_is_rejected() {
        let llm = ScriptedLlm { delay: Duration::from_millis(100), ..Default::default() };
        let r = rig(Arc::new(SystemClock), llm, fast()).await;
        let m = r.receive().await;
        let (w, q) = (r.worker.clone(), r.queue());
        let run = tokio::spawn(async move { w.process(q, m).await });
        tokio::time::sleep(Duration::from_millis(30)).await;
        // Another worker claimed the task (Redis was down, so the lock did not stop it).
        let ClaimOutcome::Claimed(theirs) = r.store.claim(&r.task_id, 0, 3600).await.unwrap() else {
            panic!()
        };
        assert_eq!(theirs.fence, 2);
        assert_eq!(run.await.unwrap(), Outcome::LeaseLost);
        assert_eq!(r.status().await, TaskStatus::Processing);
        assert_eq!(r.worker.metrics.stale_writes_rejected_total.with_label_values(&["interactive"]).get(), 1);
        let done = r.store.finish(&r.task_id, 2, Completion::Failed("theirs".into()), 0, 3600).await.unwrap();
        assert_eq!(done, FinishOutcome::Written, "the current fence still writes");
    }

    #[tokio::test]
    async fn a_message_whose_lock_is_held_elsewhere_is_retried_later_not_dropped() {
        let r = rig(Arc::new(SystemClock), ScriptedLlm::default(), fast()).await;
        let key = format!("lease:{{task:{}}}", r.task_id);
        let Acquire::Acquired(token) = r.lock.acquire(&key, Duration::from_millis(100)).await.unwrap() else {
            panic!()
        };
        let m = r.receive().await;
        let Outcome::Retry { after, .. } = r.worker.process(r.queue(), m).await else {
            panic!("must be handed back")
        };
        assert!(after >= Duration::from_millis(90) && after <= Duration::from_millis(115), "{after:?}");
        assert_eq!(r.llm.calls.load(Ordering::SeqCst), 0);
        assert_eq!(r.status().await, TaskStatus::Pending);
        assert!(r.queue.receive(1).await.unwrap().is_empty(), "hidden until the holder's lease would end");
        // The holder dies without finishing: the retry delivery does the work.
        drop(token);
        tokio::time::sleep(after).await;
        let m = r.receive().await;
        assert_eq!(m.receive_count, 2);
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        assert_eq!(r.status().await, TaskStatus::Completed);
    }

    #[tokio::test]
    async fn retryable_failures_back_off_then_fail_into_the_dlq() {
        let storm = || LlmError::Retryable { message: "429".into(), retry_after: None };
        let llm = ScriptedLlm {
            failures: Mutex::new(VecDeque::from([storm(), storm(), storm()])),
            ..Default::default()
        };
        let r = rig(Arc::new(SystemClock), llm, fast()).await;
        for attempt in 1..=2u32 {
            let m = r.receive().await;
            assert_eq!(m.receive_count, attempt);
            let Outcome::Retry { after, .. } = r.worker.process(r.queue(), m).await else { panic!("retry") };
            assert!(
                after <= Duration::from_millis(50 << (attempt - 1)),
                "full jitter within the cap: {after:?}"
            );
            assert_eq!(r.status().await, TaskStatus::Processing);
            tokio::time::sleep(after).await;
        }
        let m = r.receive().await;
        assert_eq!(m.receive_count, 3);
        let Outcome::DeadLettered { reason } = r.worker.process(r.queue(), m).await else { panic!("dlq") };
        assert!(reason.contains("gave up after 3 attempts"));
        let rec = r.store.get(&r.task_id, 0).await.unwrap().unwrap();
        assert_eq!(rec.status, TaskStatus::Failed);
        assert_eq!(rec.error.as_deref(), Some(reason.as_str()));
        assert_eq!(r.queue.dead_letter_queue().peek_all().await.len(), 1);
    }

    #[tokio::test]
    async fn permanent_failure_is_terminal_and_acked() {
        let llm = ScriptedLlm {
            failures: Mutex::new(VecDeque::from([LlmError::Permanent("400".into())])),
            ..Default::default()
        };
        let r = rig(Arc::new(SystemClock), llm, fast()).await;
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        assert_eq!(r.status().await, TaskStatus::Failed);
    }

    #[tokio::test]
    async fn undecodable_messages_go_to_the_dlq_with_the_reason() {
        let r = rig(Arc::new(SystemClock), ScriptedLlm::default(), fast()).await;
        r.queue.send("not json", BTreeMap::new()).await.unwrap();
        let mut got = r.queue.receive(10).await.unwrap();
        let bad = got.pop().unwrap();
        assert_eq!(bad.body, "not json");
        let Outcome::DeadLettered { reason } = r.worker.process(r.queue(), bad).await else { panic!() };
        assert!(reason.starts_with("undecodable message"));
        let dlq = r.queue.dead_letter_queue().peek_all().await;
        assert_eq!(dlq[0].1[crate::embedded::DEAD_LETTER_REASON], reason);
        assert_eq!(
            r.worker.process(r.queue(), got.pop().unwrap()).await,
            Outcome::Acked,
            "the others succeed"
        );
    }

    #[test]
    fn backoff_is_full_jitter_under_a_growing_cap() {
        let c = fast();
        for n in 1..=10 {
            let cap = (50u64 << (n - 1)).min(400);
            for _ in 0..50 {
                let d = full_jitter_backoff(&c, n).as_millis() as u64;
                assert!((1..=cap).contains(&d), "attempt {n}: {d} not in 1..={cap}");
            }
        }
    }
}
