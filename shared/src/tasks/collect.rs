//! The collector of synthesis tasks' provider batches ([`super::batches`]), run beside the commits'
//! ([`crate::commits::collect`]): every minute by the controller in Lambda, on a timer by
//! `lanes dev`. Each tick takes the unclosed records that carry a task, and first asks whose the
//! run is now:
//! - a run that ended meanwhile (the client cancelled it; the DLQ sweep failed it) or moved on (it
//!   was given back and claimed again) is no longer the batch's: the provider batch is cancelled,
//!   best effort, and the record closed;
//! - otherwise [`crate::domain::batch::step`] decides, as for commits: an ended batch's answer is
//!   written with the parked claim's fenced final write, then cached (the hold on the day's budgets
//!   given back as after any run); a batch that would miss the deadline is cancelled, and the run
//!   given back before it (unparked and its message sent again, to be called at flex or sync); a
//!   record a crash left `Submitting` is looked up by its key and the batch adopted, or the run
//!   given back when none was made.
//!
//! Every step is safe to repeat: the final write is fenced, a give-back of a run already given back
//! only sends its message again, and a tick that fails part-way is done again by the next.

use super::worker::Worker;
use crate::commits::collect::{CollectError, Collected};
use crate::domain::batch::{BatchPhase, BatchRecord, BatchedTask, ESCALATE_AT, Step, step};
use crate::domain::tier::Tier;
use crate::domain::{TaskRecord, TaskStatus};
use crate::metrics::Latency;
use crate::ports::{BatchStatus, Batching, Completion, FinishOutcome, LlmError, QueueSend};
use std::sync::Arc;
use tracing::{info, warn};

/// Most records one tick takes, the nearest deadlines first.
const PER_TICK: usize = 1000;

/// The collector.
#[derive(Clone)]
pub struct TaskCollector {
    /// The task worker's store, cache, metrics, clock and settings: the final write is its.
    pub worker: Worker,
    /// The synthesis lane's batch endpoint and the records.
    pub batching: Batching,
    /// The synthesis queue, for the runs given back.
    pub send: Arc<dyn QueueSend>,
}

impl TaskCollector {
    /// One pass over the unclosed records of task batches.
    pub async fn tick(&self) -> Collected {
        let mut out = Collected::default();
        let mut records = match self.batching.store.open_batches(PER_TICK).await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "batch records unavailable");
                out.errors += 1;
                return out;
            }
        };
        records.retain(|r| r.task.is_some());
        out.open = records.len();
        records.sort_by_key(|r| r.deadline_ms);
        for r in records {
            let key = r.key.clone();
            let now = self.worker.clock.now_ms();
            if let Err(e) = self.one(r, now, &mut out).await {
                warn!(error = %e, key, "task batch step failed; again next tick");
                out.errors += 1;
            }
        }
        if out != (Collected { open: out.open, ..Default::default() }) {
            info!(?out, "task batches collected");
        }
        out
    }

    async fn one(&self, mut r: BatchRecord, now: u64, out: &mut Collected) -> Result<(), CollectError> {
        let Some(t) = r.task.clone() else { return Ok(()) };
        let store = &self.batching.store;
        let live = self.worker.store.get(&t.task_id, now).await?;
        if !live.as_ref().is_some_and(|l| l.status == TaskStatus::Processing && l.fence == t.fence) {
            // Cancelled, failed, finished by a late answer, or claimed again: not the batch's.
            if r.provider_id.is_some() && !r.escalated && r.phase == BatchPhase::Open {
                self.cancel(&r, out).await;
            }
            store.close_batch(&r).await?;
            out.ended += 1;
            return Ok(());
        }
        match step(&r, now) {
            Step::Wait => {}
            Step::LookUp => match self.batching.api.find(&r.key, r.created_at_ms, r.requests()).await {
                Ok(Some(id)) => {
                    let was = r.phase;
                    (r.provider_id, r.phase) = (Some(id), BatchPhase::Open);
                    store.update_batch(&r, was).await?;
                    out.adopted += 1;
                }
                Ok(None) => {
                    if !r.escalated {
                        self.give_back(&t, now, out).await?;
                    }
                    store.close_batch(&r).await?;
                }
                Err(e)
                    if !r.escalated
                        && r.deadline_ms.saturating_sub(now) <= ESCALATE_AT.as_millis() as u64 =>
                {
                    warn!(error = %e, key = %r.key, "batch lookup failed near the deadline; giving the run back");
                    self.give_back(&t, now, out).await?;
                    let was = r.phase;
                    r.escalated = true;
                    store.update_batch(&r, was).await?;
                }
                Err(e) => return Err(e.into()),
            },
            Step::Poll => {
                self.poll(&r, &t, out).await?;
            }
            Step::Cancel | Step::Escalate => {
                match self.poll(&r, &t, out).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(e) if step(&r, now) == Step::Escalate => {
                        warn!(error = %e, key = %r.key, "batch status unknown at its escalation; escalating");
                    }
                    Err(e) => return Err(e),
                }
                let (was, before) = (r.phase, r.clone());
                if step(&r, now) == Step::Escalate {
                    self.give_back(&t, now, out).await?;
                    r.escalated = true;
                    crate::metrics::llm_route_event(t.lane, self.batching.api.route(), "batch_escalated");
                }
                if was == BatchPhase::Open && self.cancel(&r, out).await {
                    r.phase = BatchPhase::Cancelling;
                }
                if r != before {
                    store.update_batch(&r, was).await?;
                }
            }
        }
        Ok(())
    }

    /// Asks the provider to cancel the batch; whether it took the request (or refused it for good:
    /// a batch that ended meanwhile, which the next poll reads). Best effort: a failure is tried
    /// again next tick.
    async fn cancel(&self, r: &BatchRecord, out: &mut Collected) -> bool {
        let Some(id) = &r.provider_id else { return false };
        match self.batching.api.cancel(id).await {
            Ok(()) => {
                out.cancelled += 1;
                true
            }
            Err(LlmError::Permanent(e)) => {
                warn!(error = %e, batch = %id, "batch cancel refused");
                true
            }
            Err(e) => {
                warn!(error = %e, batch = %id, "batch cancel failed; again next tick");
                false
            }
        }
    }

    /// Reads an ended batch: writes its answer under the parked claim's fence, or gives the run
    /// back; closes the record. Whether it had ended.
    async fn poll(
        &self,
        r: &BatchRecord,
        t: &BatchedTask,
        out: &mut Collected,
    ) -> Result<bool, CollectError> {
        let Some(id) = &r.provider_id else { return Ok(false) };
        let answers = match self.batching.api.status(id).await {
            Ok(BatchStatus::Running(_)) => return Ok(false),
            Ok(BatchStatus::Ended(end, answers)) => {
                info!(batch = %id, ?end, "task batch ended");
                answers
            }
            Err(LlmError::Permanent(e)) => {
                warn!(batch = %id, error = %e, "batch status refused; the run is given back");
                Vec::new()
            }
            Err(e) => return Err(e.into()),
        };
        let answer = answers.into_iter().find(|a| a.custom_id == t.custom_id).map(|a| a.outcome);
        match answer {
            Some(Ok(answer)) => {
                out.calls += 1;
                out.written += self.write(t, answer).await? as usize;
            }
            other => {
                let why = other.and_then(Result::err).unwrap_or_else(|| "not answered".into());
                warn!(batch = %id, why, "batch request unanswered; the run is given back");
                if !r.escalated {
                    self.give_back(t, self.worker.clock.now_ms(), out).await?;
                }
            }
        }
        self.batching.store.close_batch(r).await?;
        out.ended += 1;
        Ok(true)
    }

    /// The parked claim's fenced final write of the batch's answer, then the cache; whether it was
    /// written (a run cancelled or moved on meanwhile keeps what it has).
    async fn write(&self, t: &BatchedTask, answer: crate::ports::LlmResponse) -> Result<bool, CollectError> {
        let w = &self.worker;
        let lane = t.lane.as_str();
        let answer = crate::ports::LlmResponse { tier: Tier::Batch, ..answer };
        let result = w.answered(lane, answer, None).await;
        let Some(record) = w.store.get(&t.task_id, w.clock.now_ms()).await? else { return Ok(false) };
        let used = (result.tokens.reported(), result.cost_usd);
        let completion = w.kept(&record, Completion::Completed(result)).await?;
        let now = w.clock.now_ms();
        let written = w.store.finish(&t.task_id, t.fence, completion, now, w.config.record_ttl_secs).await?;
        self.charge_day(&record, used).await;
        match written {
            FinishOutcome::Written(done) => {
                self.finished(&done, now).await;
                Ok(true)
            }
            FinishOutcome::StaleFence => {
                w.metrics.stale_writes_rejected_total.with_label_values(&[lane]).inc();
                Ok(false)
            }
        }
    }

    /// Adds a batch answer's usage (`tokens` reported, `cost_usd`) to the day its task was accepted
    /// on, as a direct call's is: the provider billed it whatever became of the run. Called once the
    /// final write has answered, either way: a tick that fails before then is tried again, and would
    /// charge the answer again.
    async fn charge_day(&self, record: &TaskRecord, (tokens, cost_usd): (Option<u64>, Option<f64>)) {
        let (w, quota) = (&self.worker, &self.worker.config.quota);
        let scopes = crate::quota::task_scopes(record);
        let estimate = crate::quota::task_estimate(quota, &record.request);
        let day = crate::quota::day_only(quota, &scopes, estimate, record.created_at_ms);
        w.settle(Some(&day), crate::quota::used(tokens, cost_usd, day.cost())).await;
    }

    async fn finished(&self, done: &TaskRecord, now: u64) {
        let (w, lane) = (&self.worker, done.lane.as_str());
        w.metrics.observe(Latency::Total, lane, now.saturating_sub(done.created_at_ms) as f64 / 1000.0);
        w.metrics.tasks_finished_total.with_label_values(&[lane, done.status.as_str()]).inc();
        w.publish(done).await;
        w.release(done).await;
    }

    /// Gives the parked run back: unparked under its fence (already so after an earlier give-back
    /// whose send failed), then its message sent again, to be claimed and called at flex or sync.
    async fn give_back(&self, t: &BatchedTask, now: u64, out: &mut Collected) -> Result<(), CollectError> {
        self.worker.store.unpark(&t.task_id, t.fence, now).await?;
        let Some(record) = self.worker.store.get(&t.task_id, now).await? else { return Ok(()) };
        if record.status != TaskStatus::Processing || record.fence != t.fence {
            return Ok(());
        }
        let (body, attributes) = super::enqueue::message(&record, now)?;
        self.send.send(&body, attributes).await?;
        out.sent_back += 1;
        Ok(())
    }
}
