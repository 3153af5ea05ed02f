//! How a claimed task run ends, once its provider call is over: an answer written under the fence
//! (tried again before it is given up), then cached and acked; a failed call counted in the record
//! against the lane's attempt budget, or waited out; a dropped call (cancelled, or its lease lost)
//! settled without a write of its own.

use super::worker::{Call, FINISH_TRIES, Run, Settle, Worker};
use crate::domain::failure::FailureCode;
use crate::domain::{TaskMessage, TaskRecord, TaskResult, TaskStatus};
use crate::lease::{self, Outcome, full_jitter_backoff};
use crate::metrics::Latency;
use crate::ports::{Completion, FinishOutcome, LlmError, QueueConsume, ReceivedMessage, RetryIntent};
use crate::tasks::cache::publish_finished;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

impl Worker {
    /// How a delivery ends whose provider call was dropped before its answer.
    pub(super) async fn dropped(
        &self,
        run: Run<'_>,
        call: Call,
        reservation: Option<&crate::quota::Reservation>,
        asked: bool,
    ) -> Outcome {
        // A call that was asked keeps its reservation, and its day counts the estimate: the
        // provider may have billed it, and a client that cancels each task mid-call must not spend
        // unseen. One never asked gives its reservation back, as a failed call does.
        let used = reservation.filter(|_| asked).map(|r| r.cost()).unwrap_or_default();
        self.settle(reservation, used).await;
        let Run { queue, message, task, .. } = run;
        let lane = task.lane.as_str();
        if let Call::Cancelled = call {
            // The cancellation moved the fence: nothing to write. Acked only once the store confirms
            // it, so a stale hint can never end a run silently.
            info!("task cancelled by its client; dropping the provider call");
            self.metrics.llm_calls_dropped_total.with_label_values(&[lane, "cancelled"]).inc();
            return match self.store.get(&task.task_id, self.clock.now_ms()).await {
                Ok(Some(r)) if r.status.is_terminal() => lease::ack(&**queue, message).await,
                _ => {
                    lease::retry_later(&**queue, message, Duration::ZERO, "cancellation not confirmed", lane)
                        .await
                }
            };
        }
        info!("lease lost mid-task; dropping the work, writing nothing");
        self.metrics.leases_lost_total.with_label_values(&[lane]).inc();
        self.metrics.llm_calls_dropped_total.with_label_values(&[lane, "lease"]).inc();
        Outcome::LeaseLost
    }

    /// A model's answer as the task's result: counted (calls, tokens, cost), and its usage settled
    /// against the budgets' reservation.
    pub(super) async fn answered(
        &self,
        lane: &str,
        resp: crate::ports::LlmResponse,
        reservation: Option<&crate::quota::Reservation>,
    ) -> TaskResult {
        self.metrics.llm_requests_total.with_label_values(&[lane, "ok"]).inc();
        self.metrics.llm_tokens_total.with_label_values(&[lane, "prompt"]).inc_by(resp.usage.prompt);
        self.metrics.llm_tokens_total.with_label_values(&[lane, "completion"]).inc_by(resp.usage.completion);
        self.metrics.llm_tokens_total.with_label_values(&[lane, "saved"]).inc_by(resp.continued);
        let cost_usd = crate::llm::price::prices().cost(&resp.model, resp.usage, resp.tier);
        if let Some(r) = reservation {
            self.settle(Some(r), crate::quota::used(resp.usage.reported(), cost_usd, r.cost())).await;
        }
        self.metrics
            .llm_cost_usd_total
            .with_label_values(&[lane, &resp.route, &resp.model, resp.tier.as_str()])
            .inc_by(cost_usd.unwrap_or(0.0));
        TaskResult {
            text_ref: None,
            text: resp.text,
            model: resp.model,
            tokens: resp.usage,
            truncated: resp.truncated,
            cost_usd,
            tier: resp.tier,
            tokens_saved: resp.continued,
        }
    }

    /// A provider call that failed: permanent ends the run `FAILED`; throttling is a wait (no attempt
    /// used); a retryable failure is an attempt, counted under the fence, and `FAILED` once the
    /// lane's budget is spent.
    pub(super) async fn failed_call(&self, run: Run<'_>, e: LlmError) -> Outcome {
        let Run { queue, message, task, record, completed } = run;
        let lane = task.lane.as_str();
        match e {
            LlmError::Permanent(_) => {
                self.metrics.llm_requests_total.with_label_values(&[lane, "permanent"]).inc();
                let reason = FailureCode::ProviderRefused.reason(&e);
                self.finish(queue, message, record, Completion::Failed(reason), completed).await
            }
            // A tier refusal is answered at `sync` inside the routes; one reaching here is a wait.
            LlmError::Throttled { .. } | LlmError::TierRefused { .. } => {
                self.metrics.llm_requests_total.with_label_values(&[lane, "throttled"]).inc();
                let after = e
                    .retry_after()
                    .unwrap_or_else(|| full_jitter_backoff(&self.config, message.receive_count));
                let why = e.to_string();
                self.wait(&**queue, message, task, Settle::Fenced(record), after, Some("throttled"), &why)
                    .await
            }
            LlmError::Retryable { .. } => {
                self.metrics.llm_requests_total.with_label_values(&[lane, "retryable"]).inc();
                let reason = FailureCode::ProviderRetrying.reason(&e);
                let now = self.clock.now_ms();
                let attempts = match self.store.note_attempt(&task.task_id, record.fence, &reason, now).await
                {
                    Ok(Some(n)) => n,
                    Ok(None) => {
                        self.metrics.stale_writes_rejected_total.with_label_values(&[lane]).inc();
                        return Outcome::LeaseLost;
                    }
                    Err(store) => {
                        warn!(error = %store, "could not count the attempt");
                        record.attempts + 1
                    }
                };
                if attempts >= self.config.lane(task.lane).attempt_budget {
                    let reason = FailureCode::ProviderUnavailable
                        .reason(format_args!("gave up after {attempts} failed provider attempts: {e}"));
                    return self.finish(queue, message, record, Completion::Failed(reason), completed).await;
                }
                let after =
                    full_jitter_backoff(&self.config, attempts).max(e.retry_after().unwrap_or_default());
                self.wait(&**queue, message, task, Settle::Fenced(record), after, None, &reason).await
            }
        }
    }

    /// Puts the delivery off for `after` ([`lease::retry_later`]); `wait` names why when it is a wait
    /// (counted), `None` for a failed attempt's backoff. If even that could not keep it from its
    /// last delivery's redrive, the record is settled `FAILED` first, as `settle` says, so no task
    /// is left `PROCESSING` behind a message in the DLQ.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn wait(
        &self,
        queue: &dyn QueueConsume,
        message: &ReceivedMessage,
        task: &TaskMessage,
        settle: Settle<'_>,
        after: Duration,
        wait: Option<&str>,
        reason: &str,
    ) -> Outcome {
        if let Some(why) = wait {
            self.metrics.waits_total.with_label_values(&[task.lane.as_str(), why]).inc();
        }
        let outcome = lease::retry_later(queue, message, after, reason, task.lane.as_str()).await;
        if matches!(outcome, Outcome::Retry { .. }) && lease::is_last_delivery(queue, message) {
            let reason = FailureCode::NotScheduled
                .reason(format_args!("last delivery could not be put off ({reason})"));
            let now = self.clock.now_ms();
            let ttl = self.config.record_ttl_secs;
            let settled = match settle {
                Settle::Fenced(r) => self
                    .store
                    .finish(&r.task_id, r.fence, Completion::Failed(reason), now, ttl)
                    .await
                    .map(|o| matches!(o, FinishOutcome::Written(_))),
                Settle::Unfinished => {
                    let sent_before = message.sent_at_ms.saturating_add(crate::dlq::CLOCK_SKEW_MS);
                    self.store.fail_unfinished(&task.task_id, &reason, sent_before, now, ttl).await
                }
                // A live worker holds the lock and settles the run itself; failing it here would
                // throw away the answer it is about to write. The DLQ sweep looks at the lock too.
                Settle::ByHolder => Ok(false),
            };
            match settled {
                // The task ended: its hold on the day goes back, as at any end.
                Ok(true) => {
                    if let Ok(Some(done)) = self.store.get(&task.task_id, now).await {
                        self.release(&done).await;
                    }
                }
                Ok(false) => {}
                Err(e) => warn!(error = %e, "could not settle the record; the DLQ sweep will"),
            }
        }
        outcome
    }

    /// `completion` as the record keeps it: a completed result's large text put in the results
    /// store first ([`crate::tasks::large_results::offload`]), tried as often as the final write.
    pub(super) async fn kept(
        &self,
        record: &TaskRecord,
        completion: Completion,
    ) -> Result<Completion, crate::ports::StoreError> {
        let Completion::Completed(result) = completion else { return Ok(completion) };
        let mut tries = 0;
        loop {
            let objects = self.objects.as_deref();
            match crate::tasks::large_results::offload(objects, &record.task_id, record.fence, result.clone())
                .await
            {
                Ok(kept) => return Ok(Completion::Completed(kept)),
                Err(e) if e.is_retryable() && tries + 1 < FINISH_TRIES => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(crate::jitter::range(100..=400 << tries))).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Fenced final write, then the cache from what the store wrote, then ack. `completed` is set
    /// when the written record is `COMPLETED`.
    pub(super) async fn finish(
        &self,
        queue: &Arc<dyn QueueConsume>,
        message: &ReceivedMessage,
        record: &TaskRecord,
        completion: Completion,
        completed: &std::sync::atomic::AtomicBool,
    ) -> Outcome {
        let lane = record.lane.as_str();
        let now = self.clock.now_ms();
        if let Completion::Failed(reason) = &completion {
            // The detail stays here and in the record; the client's view shows only its code.
            warn!(task_id = %record.task_id, reason = %reason, "task failed");
        }
        let completion = match self.kept(record, completion).await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "large result not stored");
                self.metrics.waits_total.with_label_values(&[lane, "store"]).inc();
                let after = full_jitter_backoff(&self.config, message.receive_count);
                return lease::retry_later(&**queue, message, after, "results store unavailable", lane).await;
            }
        };
        // A failed write is tried again (the heartbeat still holds the lease) before a paid answer
        // is given up: the fence keeps a late retry from writing over another run.
        let mut written = Err(crate::ports::StoreError::Unavailable("not tried".into()));
        for attempt in 0..FINISH_TRIES {
            if attempt > 0 {
                let ms = crate::jitter::range(100..=400 << attempt);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let ttl = self.config.record_ttl_secs;
            written = self.store.finish(&record.task_id, record.fence, completion.clone(), now, ttl).await;
            if !matches!(&written, Err(e) if e.is_retryable()) {
                break;
            }
        }
        let done = match written {
            Ok(FinishOutcome::Written(done)) => done,
            Ok(FinishOutcome::StaleFence) => {
                // Another claim, or the client's cancellation, moved the fence on.
                warn!(fence = record.fence, "final write rejected by the fence");
                self.metrics.stale_writes_rejected_total.with_label_values(&[lane]).inc();
                return match self.store.get(&record.task_id, now).await {
                    Ok(Some(r)) if r.status.is_terminal() => {
                        self.release(&r).await;
                        lease::ack(&**queue, message).await
                    }
                    _ => Outcome::LeaseLost,
                };
            }
            Err(e) => {
                warn!(error = %e, "final write failed");
                let after = full_jitter_backoff(&self.config, message.receive_count);
                self.metrics.waits_total.with_label_values(&[lane, "store"]).inc();
                // The claim is kept: the next delivery re-claims (the fence grows) and runs again.
                return lease::retry_later(&**queue, message, after, "store unavailable", lane).await;
            }
        };
        if let Some(started) = record.started_at_ms {
            self.metrics.observe(Latency::Run, lane, now.saturating_sub(started) as f64 / 1000.0);
        }
        self.metrics.observe(Latency::Total, lane, now.saturating_sub(record.created_at_ms) as f64 / 1000.0);
        self.metrics.tasks_finished_total.with_label_values(&[lane, done.status.as_str()]).inc();
        completed.store(done.status == TaskStatus::Completed, std::sync::atomic::Ordering::Relaxed);
        self.publish(&done).await;
        self.release(&done).await;
        lease::ack(&**queue, message).await
    }

    /// Gives back the ended task's hold on the day's budgets: the day then counts what its calls
    /// used.
    pub(super) async fn release(&self, done: &TaskRecord) {
        super::hold::give_back(&*self.cache, &self.config.quota, &self.metrics, done).await;
    }

    /// Writes the finished record to the cache, in one request: a `COMPLETED` one answers reads
    /// and duplicates from then on, and any finished one wakes the task's long-polls. Best effort:
    /// the store already holds the truth.
    pub(super) async fn publish(&self, done: &TaskRecord) {
        if let Err(e) = publish_finished(&*self.cache, done, self.config.result_cache_ttl).await {
            warn!(error = %e, "cache fill failed");
            self.metrics.degraded_operations_total.with_label_values(&["cache"]).inc();
        }
    }
}
