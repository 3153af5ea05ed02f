//! The task worker: one message of the interactive or synthesis lane, from claim to the fenced final
//! write. The lease itself (start, heartbeat, hand-back, requeue, DLQ) is [`crate::lease`]'s; this
//! module decides what a delivery's outcome is:
//!
//! - the claim returns the fence; a terminal record (a duplicate, or a task cancelled while pending)
//!   is acked, and so is a delivery with no live record, logged and counted;
//! - a task older than its lane's maximum age ends `FAILED` unrun;
//! - waiting never uses an attempt: a throttled provider, a lock held elsewhere or an unreachable
//!   store put the message off; only a provider call that fails counts, in the record, against the
//!   lane's attempt budget;
//! - the client's cancellation, seen at a heartbeat, drops the provider call;
//! - the record is written once, fenced, and only then cached and acked.

use crate::clock::SharedClock;
use crate::config::WorkerConfig;
use crate::domain::Lane;
use crate::domain::{TaskMessage, TaskRecord};
use crate::lease::{self, CancelProbe, Heartbeat, Leased, LeasedQueue, Watch};
pub use crate::lease::{Outcome, full_jitter_backoff};
use crate::metrics::{Latency, Metrics};
use crate::ports::{
    Acquire, Cache, ClaimOutcome, Completion, LeaseLock, LlmClient, LlmError, QueueConsume, ReceivedMessage,
    TaskStore,
};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info_span, warn};

/// Everything a worker needs, built once per process.
#[derive(Clone)]
pub struct Worker {
    /// Durable records.
    pub store: Arc<dyn TaskStore>,
    /// Lease lock.
    pub lock: Arc<dyn LeaseLock>,
    /// Finished records (completed ones answer reads; any one wakes long-polls) and cancellation hints.
    pub cache: Arc<dyn Cache>,
    /// The model.
    pub llm: Arc<dyn LlmClient>,
    /// Metrics.
    pub metrics: Metrics,
    /// Time.
    pub clock: SharedClock,
    /// Lease, retry and per-lane settings.
    pub config: WorkerConfig,
    /// Where results too large for a record are kept ([`crate::tasks::large_results`]).
    pub objects: Option<Arc<dyn crate::ports::ResultObjects>>,
    /// The synthesis lane's provider batches, for the tasks that opt in with `params.deadline_s`
    /// ([`crate::tasks::batches`]); `None` where its route has no batch endpoint (they are then
    /// called at flex).
    pub batching: Option<crate::ports::Batching>,
    /// Where its runs' events go as they run ([`crate::tasks::stream`]); `None` streams nothing.
    pub events: Option<Arc<dyn crate::ports::EventLog>>,
}

/// Tries of the fenced final write before its answer is given up (about 2.5 s in all).
pub(super) const FINISH_TRIES: u32 = 4;

/// How a put-off delivery's record is settled when the put-off fails on its last delivery.
pub(super) enum Settle<'a> {
    /// This run's claim: the fenced write fails it.
    Fenced(&'a TaskRecord),
    /// Not claimed by this delivery, and no one else holds the lock: failed whatever the fence.
    Unfinished,
    /// Another worker holds the lock: it settles the run.
    ByHolder,
}

/// A claimed run's delivery, as the steps after its provider call see it.
#[derive(Clone, Copy)]
pub(super) struct Run<'a> {
    pub(super) queue: &'a Arc<dyn QueueConsume>,
    pub(super) message: &'a ReceivedMessage,
    pub(super) task: &'a TaskMessage,
    pub(super) record: &'a TaskRecord,
    pub(super) completed: &'a std::sync::atomic::AtomicBool,
}

/// How one provider call ended, from the worker's point of view.
pub(super) enum Call {
    /// Boxed: an answer is far larger than the other outcomes.
    Answered(Box<Result<crate::ports::LlmResponse, LlmError>>),
    LeaseLost,
    Cancelled,
}

impl Worker {
    /// Processes one delivery to the end, applying the ack rule. Never panics on input.
    pub async fn process(&self, queue: Arc<dyn QueueConsume>, message: ReceivedMessage) -> Outcome {
        self.traced(queue, message, None).await
    }

    /// Like [`Self::process`], for a delivery of `batch`: renewed by the batch's heartbeat (shared
    /// by its other deliveries, see [`Self::heartbeat`]) and settled through it.
    pub async fn process_in(&self, batch: Arc<LeasedQueue>, message: ReceivedMessage) -> Outcome {
        let queue: Arc<dyn QueueConsume> = batch.clone();
        self.traced(queue, message, Some(batch)).await
    }

    async fn traced(
        &self,
        queue: Arc<dyn QueueConsume>,
        message: ReceivedMessage,
        batch: Option<Arc<LeasedQueue>>,
    ) -> Outcome {
        let trace = message.attributes.get(crate::trace::TRACE_HEADER).map(String::as_str);
        let span = info_span!("task", message_id = %message.message_id, task_id = tracing::field::Empty, lane = tracing::field::Empty, trace);
        self.process_inner(queue, message, batch).instrument(span).await
    }

    /// A heartbeat for `lane`'s deliveries read from `queue`, renewing each one's visibility and
    /// lock and asking on every beat whether its client cancelled it. Every delivery of a batch
    /// can share one ([`Self::process_in`]).
    pub fn heartbeat(&self, queue: Arc<dyn QueueConsume>, lane: Lane) -> Heartbeat {
        let probe: Arc<dyn CancelProbe> = Arc::new(crate::tasks::cache::CancelHint {
            cache: self.cache.clone(),
            store: self.store.clone(),
            clock: self.clock.clone(),
        });
        Heartbeat::start(
            queue,
            self.lock.clone(),
            Some(probe),
            self.metrics.clone(),
            lane.as_str(),
            &self.config,
        )
    }

    async fn process_inner(
        &self,
        queue: Arc<dyn QueueConsume>,
        message: ReceivedMessage,
        batch: Option<Arc<LeasedQueue>>,
    ) -> Outcome {
        let task: TaskMessage = match serde_json::from_str(&message.body) {
            Ok(t) => t,
            Err(e) => {
                let (reason, m) = (format!("undecodable message: {e}"), &self.metrics);
                return lease::dead_letter(m, &*queue, &message, reason, "unknown", "undecodable").await;
            }
        };
        let span = tracing::Span::current();
        span.record("task_id", task.task_id.as_str());
        span.record("lane", task.lane.as_str());
        let lane = task.lane.as_str();

        // The queue's own visibility stays long (Lambda requires it); the lease is made short here.
        let entered = tokio::time::Instant::now();
        if let Err(outcome) = lease::start(&*queue, &message, &self.config, lane).await {
            self.metrics.waits_total.with_label_values(&[lane, "queue"]).inc();
            return outcome;
        }

        let lock_key = crate::lease::task_lock_key(&task.task_id);
        let token = match self.take_lock(&queue, &message, &task, &lock_key).await {
            Ok(token) => token,
            Err(outcome) => return outcome,
        };
        let completed = std::sync::atomic::AtomicBool::new(false);
        let held = token.as_ref().map(|t| (lock_key.clone(), t.clone()));
        // Renewed from the lock's start, not the claim's, so a slow claim cannot let the lock or
        // the visibility lapse; settled through the batch (or a heartbeat of its own) from here on,
        // which ends the renewals before any hand-back.
        let batch = batch.unwrap_or_else(|| {
            Arc::new(LeasedQueue::new(queue.clone(), self.heartbeat(queue.clone(), task.lane)))
        });
        let lease = Leased { lock: held, ..Leased::new(message.receipt.clone(), CancellationToken::new()) };
        let _locked = batch.heartbeat().join(lease.clone());
        let leased: Arc<dyn QueueConsume> = batch.clone();
        // Under the heartbeat already, so a slow confirmation cannot let the lock lapse either.
        let confirmed =
            lease::confirm(&*leased, &message, &self.config, entered, Some(batch.heartbeat()), lane).await;
        let (outcome, claimed) = match confirmed {
            Ok(()) => (self.run_claimed(&leased, &message, &task, lease, &completed, &batch).await, true),
            Err(unclaimed) => (unclaimed, false),
        };
        // A completed task never runs again (a later delivery waits out the lock, then claims a
        // terminal record and acks), so its lock is left to expire rather than released: one
        // request less per task. Any other end may be followed by a run of the same id (a retry, a
        // resubmission), which must not wait out the lock. A lost lease's lock may be another's; one
        // lost before the claim is still ours.
        let settled = completed.load(std::sync::atomic::Ordering::Relaxed);
        let lost = claimed && matches!(outcome, Outcome::LeaseLost);
        if let (Some(token), false) = (token, settled || lost)
            && let Err(e) = self.lock.release(&lock_key, &token).await
        {
            warn!(error = %e, "lock release failed; it expires with its TTL");
        }
        outcome
    }

    /// The task's lease lock for this delivery: the token it runs under (one of its own when the
    /// lock service is down), or the put-off when another live worker holds the lock.
    async fn take_lock(
        &self,
        queue: &Arc<dyn QueueConsume>,
        message: &ReceivedMessage,
        task: &TaskMessage,
        lock_key: &str,
    ) -> Result<Option<String>, Outcome> {
        match self.acquire(lock_key).await {
            Ok(Acquire::Acquired(token)) => Ok(Some(token)),
            Ok(Acquire::Held { remaining }) => {
                // Another live worker has it: look again when its lease would have ended. Never
                // dropped: if that worker dies, this delivery finishes the task.
                self.metrics.lock_contended_total.with_label_values(&[task.lane.as_str()]).inc();
                let (after, why) =
                    (lease::after_holder(&self.config, remaining), "lease held by another worker");
                Err(self.wait(&**queue, message, task, Settle::ByHolder, after, Some("lock"), why).await)
            }
            Err(e) => {
                // Redis is an accelerator: without it, SQS visibility plus the fence still keep
                // writes single; only duplicate LLM calls become possible.
                warn!(error = %e, "lock unavailable; running degraded");
                self.metrics.degraded_operations_total.with_label_values(&["lock"]).inc();
                // A token of its own, not yet held: the first beat the lock service answers takes
                // the key with it (a renewal takes a free key), or finds another worker holding it
                // and drops this run. So one outage does not leave the whole run unlocked.
                Ok(Some(uuid::Uuid::new_v4().to_string()))
            }
        }
    }

    /// Takes the lease lock, asking twice more (briefly) when the lock service fails: a failure whose
    /// answer was lost may have taken the lock, or found it held, and running degraded then would
    /// claim a run another worker holds.
    async fn acquire(&self, key: &str) -> Result<Acquire, crate::ports::LockError> {
        lease::ask_thrice(|| self.lock.acquire(key, self.config.lease_ttl), |_| true).await
    }

    async fn run_claimed(
        &self,
        queue: &Arc<dyn QueueConsume>,
        message: &ReceivedMessage,
        task: &TaskMessage,
        lease: Leased,
        completed: &std::sync::atomic::AtomicBool,
        batch: &Arc<LeasedQueue>,
    ) -> Outcome {
        let lane = task.lane.as_str();
        let policy = *self.config.lane(task.lane);
        let now = self.clock.now_ms();
        let record = match self.claim(queue, message, task, now).await {
            Ok(record) => record,
            Err(outcome) => return outcome,
        };
        let age = Duration::from_millis(now.saturating_sub(record.created_at_ms));
        self.metrics.observe(Latency::Wait, lane, age.as_secs_f64());
        let group =
            crate::domain::fairness::task_group(record.request.tenant.as_ref(), &record.request.project_id);
        self.metrics.tenant_waited(lane, &group, age.as_secs_f64());
        if age > policy.max_age {
            let reason = crate::domain::failure::FailureCode::Expired.reason(format_args!(
                "not started within the {} lane's maximum task age ({} s)",
                lane,
                policy.max_age.as_secs()
            ));
            return self.finish(queue, message, &record, Completion::Failed(reason), completed).await;
        }

        // From the claim on, the beats also ask whether its client cancelled this run.
        let (lost, cancelled) = (lease.lost.clone(), CancellationToken::new());
        let watch = Watch { id: task.task_id.clone(), fence: record.fence, cancelled: cancelled.clone() };
        let _renewed = batch.heartbeat().join(Leased { watch: Some(watch), ..lease });
        let run = Run { queue, message, task, record: &record, completed };
        let (mut request, estimate) = match self.request_or_park(run, now).await {
            Ok(call) => call,
            Err(outcome) => return outcome,
        };
        // A run taken over continues what the lost one saved, where its provider can.
        request.prefix = crate::tasks::checkpoint::resumed_from(&record);
        let (_place, share) = match self.take_turn(run, &group, estimate, now).await {
            Ok(turn) => turn,
            Err(outcome) => return outcome,
        };
        let reservation = match self.admit(run, estimate, now).await {
            Ok(reservation) => reservation,
            Err(outcome) => {
                self.settle_share(share.as_ref(), &record.request, 0).await;
                return outcome;
            }
        };
        // A run already ended (lease lost, cancelled) before its call never asks the provider.
        let asked = !lost.is_cancelled() && !cancelled.is_cancelled();
        let call = self.call(&record, &request, &lost, &cancelled).await;
        // An answer in hand is written even if the lease was lost meanwhile: the fenced write
        // decides whether this run still owns the record.
        let answer = match call {
            Call::Answered(a) => *a,
            dropped => return self.dropped(run, dropped, reservation.as_ref(), asked).await,
        };
        match answer {
            Ok(resp) => {
                // No usage reported keeps the estimate, as the budgets do.
                let used = resp.usage.reported().unwrap_or(estimate);
                self.metrics.tenants.used(lane, &group, used);
                self.settle_share(share.as_ref(), &record.request, used).await;
                let result = self.answered(lane, resp, reservation.as_ref()).await;
                self.finish(queue, message, &record, Completion::Completed(result), completed).await
            }
            Err(e) => {
                // A refused or failed call used no tokens: they go back to the budgets.
                self.settle(reservation.as_ref(), crate::domain::quota::Cost::default()).await;
                self.settle_share(share.as_ref(), &record.request, 0).await;
                self.failed_call(run, e).await
            }
        }
    }

    /// The claim of the record a delivery names: the claimed record, or how the delivery ends
    /// (acked when there is nothing left to run, put off when the store is down).
    async fn claim(
        &self,
        queue: &Arc<dyn QueueConsume>,
        message: &ReceivedMessage,
        task: &TaskMessage,
        now: u64,
    ) -> Result<Box<TaskRecord>, Outcome> {
        match self.store.claim(&task.task_id, now, self.config.record_ttl_secs).await {
            Ok(ClaimOutcome::Claimed(r)) => Ok(r),
            // A duplicate delivery, or a task cancelled while it waited: nothing left to do.
            Ok(ClaimOutcome::Terminal(_)) => Err(lease::ack(&**queue, message).await),
            // A provider batch owns the run ([`crate::tasks::batches`]).
            Ok(ClaimOutcome::Parked(r)) => {
                let completed = std::sync::atomic::AtomicBool::new(false);
                Err(self
                    .parked_delivery(Run { queue, message, task, record: &r, completed: &completed })
                    .await)
            }
            Ok(ClaimOutcome::Missing) => {
                // A record outlives its message (TTL >= retention), so this is a message whose send
                // ingress undid, or a record deleted by hand. Never silent.
                warn!(sent_at_ms = message.sent_at_ms, "no live record for this message; acking it");
                self.metrics.tasks_missing_total.with_label_values(&[task.lane.as_str()]).inc();
                Err(lease::ack(&**queue, message).await)
            }
            Err(e) => {
                warn!(error = %e, "claim failed");
                let after = full_jitter_backoff(&self.config, message.receive_count);
                let why = "store unavailable";
                Err(self.wait(&**queue, message, task, Settle::Unfinished, after, Some("store"), why).await)
            }
        }
    }

    /// The budgets' reservation for this call, estimated at `tokens` ([`crate::quota::reserve`]): `Err` with the put-off
    /// when a budget is over (a wait, no attempt used), or the task's end when the budget renews only
    /// after the lane's maximum age; `Ok(None)` when the cache is down and budgets are not enforced.
    async fn admit(
        &self,
        run: Run<'_>,
        tokens: u64,
        now: u64,
    ) -> Result<Option<crate::quota::Reservation>, Outcome> {
        let Run { queue, message, task, record, completed } = run;
        let quota = &self.config.quota;
        let scopes = crate::quota::task_scopes(record);
        let cost = crate::quota::estimate(quota, task.lane, tokens);
        match crate::quota::reserve(&*self.cache, quota, &scopes, cost, now, record.created_at_ms).await {
            Ok(Ok(reservation)) => Ok(Some(reservation)),
            Ok(Err(over)) => {
                let why = over.describe(&record.request.project_id);
                let max_age = self.config.lane(task.lane).max_age.as_millis() as u64;
                let renews_at = now + over.retry_after.as_millis() as u64;
                if renews_at > record.created_at_ms.saturating_add(max_age) {
                    let reason = crate::domain::failure::FailureCode::OverBudget
                        .reason(format_args!("{why}, which renews after the lane's maximum task age"));
                    return Err(self
                        .finish(queue, message, record, Completion::Failed(reason), completed)
                        .await);
                }
                let settle = Settle::Fenced(record);
                Err(self.wait(&**queue, message, task, settle, over.retry_after, Some("quota"), &why).await)
            }
            Err(e) => {
                warn!(error = %e, "cache unavailable; budgets not enforced");
                self.metrics.degraded_operations_total.with_label_values(&["quota"]).inc();
                Ok(None)
            }
        }
    }

    /// Corrects a reservation to what the call used; with the cache down the correction is lost
    /// (counted as degraded): the day then never counts the call, and the hold given back at the
    /// task's end leaves it counting less than was spent, as budgets go unenforced in any outage.
    pub(super) async fn settle(
        &self,
        reservation: Option<&crate::quota::Reservation>,
        used: crate::domain::quota::Cost,
    ) {
        let Some(reservation) = reservation else { return };
        if let Err(e) = crate::quota::settle(&*self.cache, reservation, used).await {
            warn!(error = %e, "cache unavailable; a budget reservation is not corrected");
            self.metrics.degraded_operations_total.with_label_values(&["quota"]).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock, SystemClock};
    use crate::config::IngressConfig;
    use crate::domain::TokenUsage;
    use crate::domain::{TaskRequest, TaskStatus};
    use crate::embedded::{
        EmbeddedDb, EmbeddedQueue, EmbeddedQueues, EmbeddedStore, MemoryCache, MemoryLock, QueueSettings,
    };
    use crate::ports::{CancelOutcome, FinishOutcome, LlmRequest, LlmResponse, PutOutcome, QueueSend};
    use crate::tasks::cache::{HINT_TTL, cache_key, cancel_key};
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
        truncated: bool,
        seen: Mutex<Vec<LlmRequest>>,
        /// Answers with no usage, as a proxy that leaves it out does.
        no_usage: bool,
    }

    #[async_trait]
    impl LlmClient for ScriptedLlm {
        async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.seen.lock().unwrap().push(request.clone());
            tokio::time::sleep(self.delay).await;
            if let Some(e) = self.failures.lock().unwrap().pop_front() {
                return Err(e);
            }
            Ok(LlmResponse {
                text: format!("answer to {}", request.prompt),
                model: "gpt-4o-mini-2024-07-18".into(),
                usage: if self.no_usage {
                    TokenUsage::default()
                } else {
                    TokenUsage { prompt: 1000, completion: 100 }
                },
                truncated: self.truncated,
                limits: Default::default(),
                tier: Default::default(),
                route: Default::default(),
                continued: 0,
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
        task_id: crate::domain::TaskId,
    }

    const MAX_RECEIVES: u32 = 3;

    async fn rig_with(
        clock: SharedClock,
        llm: ScriptedLlm,
        config: WorkerConfig,
        body: serde_json::Value,
    ) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let store = EmbeddedStore::new(db.clone());
        let settings = QueueSettings {
            default_visibility: Duration::from_secs(900),
            max_receive_count: MAX_RECEIVES,
            ..Default::default()
        };
        let queue = EmbeddedQueues::open(db, clock.clone(), settings)
            .await
            .unwrap()
            .queue("interactive", "interactive-dlq");
        let request = TaskRequest::from_value(body).unwrap();
        let ttl = IngressConfig::default().pending_ttl_secs;
        let record = TaskRecord::pending(request.task_id(None), request, clock.now_ms(), ttl);
        assert_eq!(store.put_pending(&record, clock.now_ms()).await.unwrap(), PutOutcome::Created);
        let body = json!({"task_id": record.task_id, "lane": "interactive", "kind": "explain"}).to_string();
        queue.send(&body, BTreeMap::new()).await.unwrap();
        let lock = Arc::new(MemoryLock::new(clock.clone()));
        let llm = Arc::new(llm);
        let worker = Worker {
            objects: None,
            store: Arc::new(store.clone()),
            lock: lock.clone(),
            cache: Arc::new(MemoryCache::new(clock.clone())),
            llm: llm.clone(),
            metrics: Metrics::new(),
            clock,
            config,
            batching: Default::default(),
            events: None,
        };
        Rig { _dir: dir, worker, queue, store, lock, llm, task_id: record.task_id }
    }

    async fn rig(clock: SharedClock, llm: ScriptedLlm, config: WorkerConfig) -> Rig {
        let body = json!({"project_id":"p","kind":"explain","prompt":"why","target_files":[]});
        rig_with(clock, llm, config, body).await
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

    fn interactive(config: &mut WorkerConfig) -> &mut crate::config::LanePolicy {
        &mut config.lanes[Lane::Interactive.index()]
    }

    impl Rig {
        /// Receives the message until its last delivery, and processes that on a queue that
        /// refuses to requeue it (so a put-off cannot keep it from the redrive).
        async fn last_delivery_unable_to_requeue(&self) -> Outcome {
            let mut m = self.receive().await;
            while m.receive_count < MAX_RECEIVES {
                self.queue.change_visibility(&m.receipt, Duration::ZERO).await.unwrap();
                m = self.receive().await;
            }
            self.worker.process(Arc::new(NoRequeue(self.queue.clone())), m).await
        }

        async fn receive(&self) -> ReceivedMessage {
            let mut got = self.queue.receive(1).await.unwrap();
            assert_eq!(got.len(), 1, "expected a visible message");
            got.remove(0)
        }
        async fn record(&self) -> TaskRecord {
            self.store.get(&self.task_id, self.worker.clock.now_ms()).await.unwrap().unwrap()
        }
        async fn status(&self) -> TaskStatus {
            self.record().await.status
        }
        fn queue(&self) -> Arc<dyn QueueConsume> {
            Arc::new(self.queue.clone())
        }
        fn count(&self, c: &prometheus::IntCounterVec, labels: &[&str]) -> u64 {
            c.with_label_values(labels).get()
        }
    }

    #[tokio::test]
    async fn completes_writes_caches_and_acks() {
        let r = rig(Arc::new(SystemClock), ScriptedLlm::default(), fast()).await;
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        // A completed task's lock is left to expire, not released: it never runs again. Asked
        // first, well inside the lock's 300 ms.
        let lock_key = format!("lease:{{task:{}}}", r.task_id);
        let again = r.worker.lock.acquire(&lock_key, Duration::from_secs(1)).await.unwrap();
        assert!(matches!(again, Acquire::Held { .. }), "{again:?}");
        let rec = r.record().await;
        assert_eq!((rec.status, rec.fence, rec.attempts), (TaskStatus::Completed, 1, 0));
        let result = rec.result.unwrap();
        assert_eq!(result.text, "answer to why");
        assert!(!result.truncated);
        // 1000 prompt and 100 completion tokens at gpt-4o-mini's list price.
        let cost = result.cost_usd.unwrap();
        assert!((cost - 0.00021).abs() < 1e-12, "{cost}");
        let spent = r
            .worker
            .metrics
            .llm_cost_usd_total
            .with_label_values(&["interactive", "", &result.model, "sync"])
            .get();
        assert!((spent - 0.00021).abs() < 1e-12, "{spent}");
        let cached = r.worker.cache.get(&cache_key(&r.task_id)).await.unwrap().unwrap();
        assert_eq!(serde_json::from_str::<TaskRecord>(&cached).unwrap(), r.record().await);
        assert_eq!(r.queue.depth().await.unwrap().visible + r.queue.depth().await.unwrap().in_flight, 0);
    }

    #[tokio::test]
    async fn params_and_the_lane_token_cap_reach_the_model_and_truncation_is_flagged() {
        let llm = ScriptedLlm { truncated: true, ..Default::default() };
        let body = json!({"project_id":"p","kind":"explain","prompt":"why","target_files":[],
            "params":{"temperature":0.2,"max_tokens":99999,"stop":"END","seed":7}});
        let mut config = fast();
        interactive(&mut config).max_tokens = 512;
        let r = rig_with(Arc::new(SystemClock), llm, config, body).await;
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        let seen = r.llm.seen.lock().unwrap()[0].clone();
        assert_eq!(seen.max_tokens, 512, "params.max_tokens never raises the lane's cap");
        assert_eq!(seen.params.temperature, Some(0.2));
        assert_eq!((seen.params.stop.clone(), seen.params.seed), (vec!["END".to_owned()], Some(7)));
        let rec = r.record().await;
        assert_eq!(rec.status, TaskStatus::Completed);
        assert!(rec.result.unwrap().truncated, "a cut answer is stored flagged, not as a whole one");
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
        let rec = r.record().await;
        assert_eq!((rec.status, rec.result), (TaskStatus::Processing, None), "nothing written");
        assert_eq!(r.worker.metrics.leases_lost_total.with_label_values(&["interactive"]).get(), 1);
        assert_eq!(r.queue.depth().await.unwrap().in_flight, 1, "the message is left to its next delivery");
    }

    /// A lock key lost in a failover (here: lapsed while the worker paused) with no one else
    /// holding it is taken again by the next beat; the run goes on and its answer is written.
    #[tokio::test]
    async fn a_lock_key_lost_without_a_new_holder_is_taken_again_and_the_call_kept() {
        let clock = ManualClock::new(1_000_000);
        let llm = ScriptedLlm { delay: Duration::from_millis(300), ..Default::default() };
        let r = rig(clock.clone(), llm, fast()).await;
        let m = r.receive().await;
        let (w, q) = (r.worker.clone(), r.queue());
        let run = tokio::spawn(async move { w.process(q, m).await });
        tokio::time::sleep(Duration::from_millis(30)).await;
        clock.advance_ms(301);
        assert_eq!(run.await.unwrap(), Outcome::Acked);
        assert_eq!((r.llm.calls.load(Ordering::SeqCst), r.status().await), (1, TaskStatus::Completed));
    }

    /// A lock acquire slower than the lease: meanwhile the message is delivered again and deleted by
    /// another consumer. The late worker must not claim the record on its dead delivery: nothing
    /// would be left to finish a `PROCESSING` record. It ends unclaimed and frees the lock.
    #[tokio::test]
    async fn a_delivery_that_lapsed_during_a_slow_lock_acquire_claims_nothing() {
        let clock = ManualClock::new(1_000_000);
        let mut r = rig(clock.clone(), ScriptedLlm::default(), fast()).await;
        let gated = Arc::new(crate::embedded::ScriptedLock::new(r.lock.clone(), r.task_id.to_string(), true));
        r.worker.lock = gated.clone();
        let m = r.receive().await;
        let (w, q) = (r.worker.clone(), r.queue());
        let run = tokio::spawn(async move { w.process(q, m).await });
        tokio::time::sleep(Duration::from_millis(40)).await;
        clock.advance_ms(301);
        let again = r.receive().await;
        r.queue.delete(&again.receipt).await.unwrap();
        gated.gate.add_permits(1);
        assert_eq!(run.await.unwrap(), Outcome::LeaseLost);
        let rec = r.record().await;
        assert_eq!((rec.status, rec.fence), (TaskStatus::Pending, 0), "claimed on a dead delivery");
        assert_eq!(r.llm.calls.load(Ordering::SeqCst), 0);
        let key = crate::lease::task_lock_key(&r.task_id);
        let free = r.lock.acquire(&key, Duration::from_secs(1)).await.unwrap();
        assert!(matches!(free, Acquire::Acquired(_)), "the lock is left held: {free:?}");
    }

    /// A store whose first `n` final writes fail.
    struct FlakyFinish {
        inner: EmbeddedStore,
        failures: std::sync::atomic::AtomicU32,
    }

    #[async_trait]
    impl TaskStore for FlakyFinish {
        async fn put_pending(
            &self,
            r: &TaskRecord,
            now: u64,
        ) -> Result<PutOutcome, crate::ports::StoreError> {
            self.inner.put_pending(r, now).await
        }
        async fn get(
            &self,
            id: &crate::domain::TaskId,
            now: u64,
        ) -> Result<Option<TaskRecord>, crate::ports::StoreError> {
            self.inner.get(id, now).await
        }
        async fn mark_enqueued(
            &self,
            id: &crate::domain::TaskId,
            mark: crate::ports::EnqueueMark,
            now: u64,
            ttl: u64,
        ) -> Result<bool, crate::ports::StoreError> {
            self.inner.mark_enqueued(id, mark, now, ttl).await
        }
        async fn claim(
            &self,
            id: &crate::domain::TaskId,
            now: u64,
            ttl: u64,
        ) -> Result<ClaimOutcome, crate::ports::StoreError> {
            self.inner.claim(id, now, ttl).await
        }
        async fn note_attempt(
            &self,
            id: &crate::domain::TaskId,
            f: u64,
            why: &str,
            now: u64,
        ) -> Result<Option<u32>, crate::ports::StoreError> {
            self.inner.note_attempt(id, f, why, now).await
        }
        async fn cancel(
            &self,
            id: &crate::domain::TaskId,
            now: u64,
            ttl: u64,
        ) -> Result<CancelOutcome, crate::ports::StoreError> {
            self.inner.cancel(id, now, ttl).await
        }
        async fn fail_unfinished(
            &self,
            id: &crate::domain::TaskId,
            why: &str,
            before: u64,
            now: u64,
            ttl: u64,
        ) -> Result<bool, crate::ports::StoreError> {
            self.inner.fail_unfinished(id, why, before, now, ttl).await
        }
        async fn park(
            &self,
            id: &crate::domain::TaskId,
            fence: u64,
            parked: crate::domain::Parked,
            now: u64,
            ttl: u64,
        ) -> Result<bool, crate::ports::StoreError> {
            self.inner.park(id, fence, parked, now, ttl).await
        }
        async fn unpark(
            &self,
            id: &crate::domain::TaskId,
            fence: u64,
            now: u64,
        ) -> Result<bool, crate::ports::StoreError> {
            self.inner.unpark(id, fence, now).await
        }
        async fn checkpoint(
            &self,
            id: &crate::domain::TaskId,
            fence: u64,
            text: &str,
            now: u64,
        ) -> Result<bool, crate::ports::StoreError> {
            self.inner.checkpoint(id, fence, text, now).await
        }
        async fn finish(
            &self,
            id: &crate::domain::TaskId,
            fence: u64,
            c: Completion,
            now: u64,
            ttl: u64,
        ) -> Result<FinishOutcome, crate::ports::StoreError> {
            let left = self.failures.load(Ordering::SeqCst);
            if left > 0 {
                self.failures.store(left - 1, Ordering::SeqCst);
                return Err(crate::ports::StoreError::Unavailable("throttled".into()));
            }
            self.inner.finish(id, fence, c, now, ttl).await
        }
    }

    /// A final write that fails is tried again before the paid answer is given up.
    #[tokio::test]
    async fn a_failed_final_write_is_retried_before_the_answer_is_given_up() {
        let mut r = rig(Arc::new(SystemClock), ScriptedLlm::default(), fast()).await;
        r.worker.store = Arc::new(FlakyFinish { inner: r.store.clone(), failures: 2.into() });
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        assert_eq!((r.llm.calls.load(Ordering::SeqCst), r.status().await), (1, TaskStatus::Completed));
    }

    /// A queue whose requeues fail.
    struct NoRequeue(EmbeddedQueue);

    #[async_trait]
    impl QueueConsume for NoRequeue {
        async fn receive_for(
            &self,
            n: usize,
            v: Option<Duration>,
        ) -> Result<Vec<ReceivedMessage>, crate::ports::QueueError> {
            self.0.receive_for(n, v).await
        }
        async fn change_visibility(&self, r: &str, t: Duration) -> Result<(), crate::ports::QueueError> {
            self.0.change_visibility(r, t).await
        }
        async fn delete(&self, r: &str) -> Result<(), crate::ports::QueueError> {
            self.0.delete(r).await
        }
        async fn requeue(&self, _: &ReceivedMessage, _: Duration) -> Result<(), crate::ports::QueueError> {
            Err(crate::ports::QueueError::Unavailable("throttled".into()))
        }
        async fn dead_letter(&self, m: &ReceivedMessage, why: &str) -> Result<(), crate::ports::QueueError> {
            self.0.dead_letter(m, why).await
        }
        async fn depth(&self) -> Result<crate::ports::QueueDepth, crate::ports::QueueError> {
            self.0.depth().await
        }
        fn max_receive_count(&self) -> u32 {
            self.0.max_receive_count()
        }
    }

    /// A duplicate on its last delivery, refused by a live holder's lock and unable to requeue,
    /// leaves the holder's run alone.
    #[tokio::test]
    async fn a_last_delivery_duplicate_never_fails_a_run_a_live_holder_is_finishing() {
        let r = rig(Arc::new(SystemClock), ScriptedLlm::default(), fast()).await;
        let now = SystemClock.now_ms();
        let key = crate::lease::task_lock_key(&r.task_id);
        assert!(matches!(r.lock.acquire(&key, Duration::from_secs(10)).await.unwrap(), Acquire::Acquired(_)));
        let ClaimOutcome::Claimed(held) = r.store.claim(&r.task_id, now, 3600).await.unwrap() else {
            panic!()
        };
        let outcome = r.last_delivery_unable_to_requeue().await;
        assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
        let rec = r.record().await;
        assert_eq!(
            (rec.status, rec.fence),
            (TaskStatus::Processing, held.fence),
            "the holder's run is untouched"
        );
    }

    /// A run failed because its last delivery could not be put off has ended: its hold on the day
    /// goes back, as at any end.
    #[tokio::test]
    async fn a_run_failed_on_a_last_delivery_that_could_not_be_put_off_gives_its_hold_back() {
        let err = LlmError::Retryable { message: "502".into(), retry_after: None };
        let llm = ScriptedLlm { failures: Mutex::new(VecDeque::from([err])), ..Default::default() };
        let mut config = fast();
        config.quota.project.daily_tokens = Some(1_000_000);
        let r = rig(Arc::new(SystemClock), llm, config).await;
        let (rec, quota) = (r.record().await, r.worker.config.quota);
        let scopes = crate::quota::scopes(None, "p");
        let day = crate::domain::quota::Cost { tokens: 1_000_000, usd_micros: 0 };
        let held = crate::quota::hold(&*r.worker.cache, &quota, &scopes, day, &rec.nonce, rec.created_at_ms);
        assert_eq!(held.await.unwrap(), Ok(()), "the task holds the whole day");
        let outcome = r.last_delivery_unable_to_requeue().await;
        assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
        assert_eq!(r.status().await, TaskStatus::Failed);
        let now = SystemClock.now_ms();
        let again = crate::quota::hold(&*r.worker.cache, &quota, &scopes, day, "probe", now);
        assert_eq!(again.await.unwrap(), Ok(()), "the hold went back");
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
        let now = SystemClock.now_ms();
        let ClaimOutcome::Claimed(theirs) = r.store.claim(&r.task_id, now, 3600).await.unwrap() else {
            panic!()
        };
        assert_eq!(theirs.fence, 2);
        assert_eq!(run.await.unwrap(), Outcome::LeaseLost);
        assert_eq!(r.status().await, TaskStatus::Processing);
        assert_eq!(r.worker.metrics.stale_writes_rejected_total.with_label_values(&["interactive"]).get(), 1);
        let done =
            r.store.finish(&r.task_id, 2, Completion::Failed("theirs".into()), now, 3600).await.unwrap();
        assert!(matches!(done, FinishOutcome::Written(_)), "the current fence still writes");
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
        assert_eq!(r.count(&r.worker.metrics.waits_total, &["interactive", "lock"]), 1);
    }

    #[tokio::test]
    async fn failed_attempts_are_counted_in_the_record_and_the_budget_fails_the_task() {
        let err = || LlmError::Retryable { message: "502".into(), retry_after: None };
        let llm =
            ScriptedLlm { failures: Mutex::new(VecDeque::from([err(), err(), err()])), ..Default::default() };
        let mut config = fast();
        interactive(&mut config).attempt_budget = 3;
        let r = rig(Arc::new(SystemClock), llm, config).await;
        for attempt in 1..=2u32 {
            let m = r.receive().await;
            let Outcome::Retry { after, .. } = r.worker.process(r.queue(), m).await else { panic!("retry") };
            assert!(
                after <= Duration::from_millis(50 << (attempt - 1)),
                "full jitter within the cap: {after:?}"
            );
            let rec = r.record().await;
            assert_eq!((rec.status, rec.attempts), (TaskStatus::Processing, attempt));
            tokio::time::sleep(after).await;
        }
        let m = r.receive().await;
        assert_eq!(
            r.worker.process(r.queue(), m).await,
            Outcome::Acked,
            "a failed task is settled, not dead-lettered"
        );
        let rec = r.record().await;
        assert_eq!((rec.status, rec.attempts), (TaskStatus::Failed, 3));
        assert!(rec.error.unwrap().contains("gave up after 3 failed provider attempts"));
        assert!(r.queue.dead_letter_queue().peek_all().await.is_empty());
    }

    #[tokio::test]
    async fn throttling_never_uses_an_attempt_nor_reaches_the_dlq() {
        // Twice as many 429s as the queue has receives: the last delivery puts itself off with a fresh
        // copy instead of being redriven.
        let throttled =
            || LlmError::Throttled { message: "429".into(), retry_after: Some(Duration::from_millis(5)) };
        let storm: VecDeque<LlmError> = (0..2 * MAX_RECEIVES).map(|_| throttled()).collect();
        let llm = ScriptedLlm { failures: Mutex::new(storm), ..Default::default() };
        let mut config = fast();
        interactive(&mut config).attempt_budget = 1;
        let r = rig(Arc::new(SystemClock), llm, config).await;
        let mut requeued = 0;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let Some(m) = r.queue.receive(1).await.unwrap().pop() else { continue };
            assert!(m.receive_count <= MAX_RECEIVES);
            match r.worker.process(r.queue(), m).await {
                Outcome::Acked => break,
                Outcome::Requeued { .. } => requeued += 1,
                Outcome::Retry { .. } => {}
                other => panic!("{other:?}"),
            }
        }
        let rec = r.record().await;
        assert_eq!((rec.status, rec.attempts), (TaskStatus::Completed, 0), "waiting is not failing");
        assert!(requeued >= 1, "the last delivery was requeued");
        assert!(r.queue.dead_letter_queue().peek_all().await.is_empty());
        assert_eq!(
            r.count(&r.worker.metrics.waits_total, &["interactive", "throttled"]),
            2 * MAX_RECEIVES as u64
        );
    }

    /// An answer that reports no usage is counted at its estimate, not at zero: its tenant's share
    /// and token count keep what the call may have cost.
    #[tokio::test]
    async fn an_answer_without_usage_counts_its_estimate() {
        let tokens = |no_usage: bool| async move {
            let llm = ScriptedLlm { no_usage, ..Default::default() };
            let r = rig(Arc::new(SystemClock), llm, fast()).await;
            let m = r.receive().await;
            assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
            let rendered = r.worker.metrics.render();
            let line = rendered.lines().find(|l| l.starts_with("lanes_tenant_tokens_total{")).unwrap();
            line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
        };
        assert_eq!(tokens(false).await, 1_100, "the usage reported");
        let estimate = tokens(true).await;
        assert!(estimate > 200, "the estimate stands: {estimate}");
    }

    /// One token-share step of `group` in the interactive lane, on the rig's cache (weight 1).
    async fn share_step(
        r: &Rig,
        group: &str,
        step: crate::domain::token_share::Step,
    ) -> crate::domain::token_share::Verdict {
        let ask = crate::domain::token_share::ShareAsk {
            group: group.into(),
            weight: 1,
            step,
            now_ms: r.worker.clock.now_ms(),
            settings: r.worker.config.quota.share.settings,
        };
        r.worker.cache.share(&crate::tasks::share::share_key(Lane::Interactive), &ask).await.unwrap()
    }

    /// The lane's shares with the rig's tenant (project `p`) far over its share of the tokens while
    /// another tenant's task waits.
    async fn over_its_share(r: &Rig) {
        let mine = crate::domain::fairness::task_group(None, "p");
        share_step(r, &mine, crate::domain::token_share::Step::Decide { estimate: 50_000 }).await;
        share_step(r, "t-other", crate::domain::token_share::Step::Submit).await;
    }

    /// A tenant over its share of the lane's tokens while another tenant's task waits is put off
    /// (a wait: no attempt, nothing failed); once the other has started, it runs.
    #[tokio::test]
    async fn a_group_over_its_token_share_waits_while_another_waits_then_runs() {
        use crate::domain::token_share::Step;
        let mut config = fast();
        config.quota.share.settings.put_off_ms = 10;
        // The other tenant's task competes from its submission (it has waited long enough).
        config.quota.share.settings.patience_ms = 0;
        let r = rig(Arc::new(SystemClock), ScriptedLlm::default(), config).await;
        over_its_share(&r).await;
        let m = r.receive().await;
        assert!(matches!(r.worker.process(r.queue(), m).await, Outcome::Retry { .. }));
        assert_eq!(
            (r.record().await.attempts, r.count(&r.worker.metrics.waits_total, &["interactive", "fairness"])),
            (0, 1)
        );
        // The decision reported the lane's standings: all the tokens are the tenant's, and the
        // waiting tenant (which this worker never served, so it is counted as `other`) entitles
        // each to half.
        let mine = crate::domain::fairness::task_group(None, "p");
        let share = |t: &str, kind| r.worker.metrics.tenants.share("interactive", t, kind);
        assert_eq!((share(&mine, "received"), share(&mine, "entitled")), (Some(1.0), Some(0.5)));
        assert_eq!((share("other", "received"), share("other", "entitled")), (Some(0.0), Some(0.5)));
        let go = share_step(&r, "t-other", Step::Decide { estimate: 100 }).await;
        assert_eq!(go, crate::domain::token_share::Verdict::Go);
        tokio::time::sleep(Duration::from_millis(30)).await;
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        assert_eq!(r.status().await, TaskStatus::Completed);
    }

    /// The cache beside `inner`'s, whose token-share steps fail as a cache outage does.
    struct SharesDown(Arc<dyn crate::ports::Cache>);

    #[async_trait::async_trait]
    impl crate::ports::Cache for SharesDown {
        async fn get(&self, k: &str) -> Result<Option<String>, crate::ports::CacheError> {
            self.0.get(k).await
        }
        async fn set(&self, k: &str, v: &str, ttl: Duration) -> Result<(), crate::ports::CacheError> {
            self.0.set(k, v, ttl).await
        }
        async fn add(&self, k: &str, by: u64, ttl: Duration) -> Result<u64, crate::ports::CacheError> {
            self.0.add(k, by, ttl).await
        }
        async fn leave(&self, k: &str, m: &str) -> Result<(), crate::ports::CacheError> {
            self.0.leave(k, m).await
        }
        async fn enter_within(
            &self,
            k: &str,
            m: &str,
            now: u64,
            until: u64,
            max: u64,
        ) -> Result<bool, crate::ports::CacheError> {
            self.0.enter_within(k, m, now, until, max).await
        }
        async fn count_live(&self, k: &str, now: u64) -> Result<u64, crate::ports::CacheError> {
            self.0.count_live(k, now).await
        }
        async fn reserve(
            &self,
            c: &[crate::domain::quota::Charge],
        ) -> Result<Option<usize>, crate::ports::CacheError> {
            self.0.reserve(c).await
        }
        async fn share(
            &self,
            _: &str,
            _: &crate::domain::token_share::ShareAsk,
        ) -> Result<crate::domain::token_share::Verdict, crate::ports::CacheError> {
            Err(crate::ports::CacheError::Unavailable("connection refused".into()))
        }
        async fn share_state(&self, _: &str) -> Result<crate::ports::ShareState, crate::ports::CacheError> {
            Err(crate::ports::CacheError::Unavailable("connection refused".into()))
        }
    }

    /// With the cache unreachable the token shares are not counted: a task its group's share would
    /// put off runs (the queue's fair order, by tasks, is what is left), and the outage is counted.
    #[tokio::test]
    async fn with_the_cache_down_token_shares_are_not_counted_and_the_task_runs() {
        let mut config = fast();
        config.quota.share.settings.patience_ms = 0;
        let mut r = rig(Arc::new(SystemClock), ScriptedLlm::default(), config).await;
        // The state the same task is put off by while the cache answers (the test above).
        over_its_share(&r).await;
        r.worker.cache = Arc::new(SharesDown(r.worker.cache.clone()));
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        assert_eq!(r.status().await, TaskStatus::Completed);
        assert_eq!(r.count(&r.worker.metrics.waits_total, &["interactive", "fairness"]), 0);
        assert!(r.count(&r.worker.metrics.degraded_operations_total, &["fairness"]) >= 1);
    }

    /// A tenant at its concurrency cap in the lane is put off (a wait, no attempt); a run holds
    /// its place past the place's first end time (renewed), and gives it back when it ends.
    #[tokio::test]
    async fn a_tenant_at_its_cap_waits_and_a_run_holds_its_place_until_it_ends() {
        use crate::domain::concurrency::{Caps, running_key};
        let mut config = fast();
        config.quota.share.settings.put_off_ms = 10;
        config.quota.concurrency = Caps::parse("interactive=1").unwrap();
        let llm = ScriptedLlm { delay: Duration::from_millis(450), ..Default::default() };
        let r = rig(Arc::new(SystemClock), llm, config).await;
        let key = running_key(Lane::Interactive, &crate::domain::fairness::task_group(None, "p"));
        let now = r.worker.clock.now_ms();
        assert!(r.worker.cache.enter_within(&key, "another-run", now, now + 60_000, 1).await.unwrap());
        let handed_back =
            || crate::metrics::HANDED_BACK.with_label_values(&["interactive", "tenant_cap"]).get();
        let before = handed_back();
        let m = r.receive().await;
        assert!(matches!(r.worker.process(r.queue(), m).await, Outcome::Retry { .. }));
        assert!(handed_back() > before, "the hand-back's reason kind is tenant_cap");
        assert_eq!(
            (
                r.record().await.attempts,
                r.count(&r.worker.metrics.waits_total, &["interactive", "tenant_cap"])
            ),
            (0, 1)
        );
        r.worker.cache.leave(&key, "another-run").await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let m = r.receive().await;
        let (worker, queue) = (r.worker.clone(), r.queue());
        let run = tokio::spawn(async move { worker.process(queue, m).await });
        // Past the lease TTL (300 ms) the place is still held: the run renews it.
        tokio::time::sleep(Duration::from_millis(380)).await;
        let held = r.worker.cache.count_live(&key, r.worker.clock.now_ms()).await.unwrap();
        assert_eq!(held, 1, "renewed while the run lasts");
        // An earlier run of the task (the put-off claim's fence) giving its place back leaves this
        // run's alone.
        let fence = r.record().await.fence;
        let stale = crate::domain::concurrency::place_member(&r.task_id, fence - 1);
        r.worker.cache.leave(&key, &stale).await.unwrap();
        let held = r.worker.cache.count_live(&key, r.worker.clock.now_ms()).await.unwrap();
        assert_eq!(held, 1, "a stale run's leave frees only its own place");
        assert_eq!(run.await.unwrap(), Outcome::Acked);
        assert_eq!(r.status().await, TaskStatus::Completed);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(r.worker.cache.count_live(&key, r.worker.clock.now_ms()).await.unwrap(), 0, "given back");
        // Per tenant: the put-off, the wait and the tokens received, under the tenant's group.
        let (g, tenants) = (crate::domain::fairness::task_group(None, "p"), &r.worker.metrics.tenants);
        assert_eq!(r.count(&tenants.put_offs_total, &["interactive", &g, "tenant_cap"]), 1);
        assert_eq!(r.count(&tenants.tokens_total, &["interactive", &g]), 1_100);
        let claims = tenants.wait_seconds.with_label_values(&["interactive", &g]).get_sample_count();
        assert_eq!(claims, 2, "one per claim, as the lane's wait: the put-off one and the run");
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
        let cached = r.worker.cache.get(&cache_key(&r.task_id)).await.unwrap().unwrap();
        let cached: TaskRecord = serde_json::from_str(&cached).unwrap();
        assert_eq!(cached.status, TaskStatus::Failed, "the finished record wakes long-polls");
        // A failed task may be resubmitted at once: its lock is released.
        let lock_key = format!("lease:{{task:{}}}", r.task_id);
        let again = r.worker.lock.acquire(&lock_key, Duration::from_secs(1)).await.unwrap();
        assert!(matches!(again, Acquire::Acquired(_)), "{again:?}");
    }

    #[tokio::test]
    async fn a_backlog_older_than_an_hour_is_not_lost() {
        let clock = ManualClock::new(1_000_000_000);
        let mut config = fast();
        interactive(&mut config).max_age = Duration::from_secs(24 * 3600);
        let r = rig(clock.clone(), ScriptedLlm::default(), config).await;
        clock.advance_ms(3 * 3600 * 1000);
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        assert_eq!(r.status().await, TaskStatus::Completed);
        assert_eq!(r.count(&r.worker.metrics.tasks_missing_total, &["interactive"]), 0);
    }

    #[tokio::test]
    async fn a_task_older_than_its_lane_allows_fails_unrun_and_a_missing_record_is_counted() {
        let clock = ManualClock::new(1_000_000_000);
        let r = rig(clock.clone(), ScriptedLlm::default(), fast()).await;
        clock.advance_ms(3600 * 1000 + 1);
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        let rec = r.record().await;
        assert_eq!(rec.status, TaskStatus::Failed);
        assert!(rec.error.unwrap().contains("maximum task age"));
        assert_eq!(r.llm.calls.load(Ordering::SeqCst), 0);

        // A message whose record is gone is acked, logged and counted: never silently.
        let ghost = json!({"task_id": "f".repeat(64), "lane": "interactive", "kind": "explain"}).to_string();
        r.queue.send(&ghost, BTreeMap::new()).await.unwrap();
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        assert_eq!(r.count(&r.worker.metrics.tasks_missing_total, &["interactive"]), 1);
    }

    #[tokio::test]
    async fn a_cancelled_pending_task_is_acked_unrun() {
        let r = rig(Arc::new(SystemClock), ScriptedLlm::default(), fast()).await;
        let cancelled = r.store.cancel(&r.task_id, SystemClock.now_ms(), 3600).await.unwrap();
        assert!(matches!(cancelled, CancelOutcome::Cancelled(_)));
        let m = r.receive().await;
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        assert_eq!((r.status().await, r.llm.calls.load(Ordering::SeqCst)), (TaskStatus::Cancelled, 0));
    }

    /// The embedded queue answers a delete before it is written, so a crash can bring a finished
    /// task's message back (as SQS may): the new process, its lock empty, acks it unpaid.
    #[tokio::test]
    async fn a_finished_tasks_message_delivered_again_is_acked_without_a_call() {
        let clock = ManualClock::new(1_000_000);
        let r = rig(clock.clone(), ScriptedLlm::default(), fast()).await;
        let m = r.receive().await;
        let body = m.body.clone();
        assert_eq!(r.worker.process(r.queue(), m).await, Outcome::Acked);
        let done = r.record().await;
        // The message as the file still held it; the restarted process's lock knows nothing.
        r.queue.send(&body, BTreeMap::new()).await.unwrap();
        let worker = Worker { lock: Arc::new(MemoryLock::new(clock.clone())), ..r.worker.clone() };
        let again = r.receive().await;
        assert_eq!(worker.process(r.queue(), again).await, Outcome::Acked);
        assert_eq!(r.llm.calls.load(Ordering::SeqCst), 1, "paid once");
        assert_eq!(r.record().await, done, "the finished record is left as it was");
        assert_eq!(r.queue.depth().await.unwrap().visible + r.queue.depth().await.unwrap().in_flight, 0);
    }

    #[tokio::test]
    async fn a_running_task_cancelled_by_its_client_drops_the_call_at_the_next_heartbeat() {
        let llm = ScriptedLlm { delay: Duration::from_secs(30), ..Default::default() };
        let day = 1_000_000;
        let mut config = fast();
        config.quota.project.daily_tokens = Some(day);
        let r = rig(Arc::new(SystemClock), llm, config).await;
        let m = r.receive().await;
        let (w, q) = (r.worker.clone(), r.queue());
        let run = tokio::spawn(async move { w.process(q, m).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(r.status().await, TaskStatus::Processing);
        let now = SystemClock.now_ms();
        let CancelOutcome::Cancelled(cancelled) = r.store.cancel(&r.task_id, now, 3600).await.unwrap() else {
            panic!("cancel a running task")
        };
        // An old run's hint (fence 1, the running claim's own) cancels nothing; the new fence does.
        r.worker.cache.set(&cancel_key(&r.task_id), "1", HINT_TTL).await.unwrap();
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(r.count(&r.worker.metrics.llm_calls_dropped_total, &["interactive", "cancelled"]), 0);
        r.worker.cache.set(&cancel_key(&r.task_id), &cancelled.fence.to_string(), HINT_TTL).await.unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(2), run).await.expect("dropped within a beat");
        assert_eq!(outcome.unwrap(), Outcome::Acked);
        assert_eq!(r.status().await, TaskStatus::Cancelled);
        assert_eq!(r.count(&r.worker.metrics.llm_calls_dropped_total, &["interactive", "cancelled"]), 1);
        assert_eq!(r.queue.depth().await.unwrap().in_flight, 0);
        // The dropped call may have been billed: its estimate counts on the day.
        let scopes = crate::quota::scopes(None, "p");
        let whole = crate::domain::quota::Cost { tokens: day, usd_micros: 0 };
        let held = crate::quota::hold(&*r.worker.cache, &r.worker.config.quota, &scopes, whole, "probe", now);
        assert!(held.await.unwrap().is_err(), "the day counts the dropped call");
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
        assert_eq!(dlq[0].1[crate::ports::DEAD_LETTER_REASON], reason);
        assert_eq!(
            r.worker.process(r.queue(), got.pop().unwrap()).await,
            Outcome::Acked,
            "the others succeed"
        );
    }
}
