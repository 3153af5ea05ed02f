//! Synthesis tasks handed to a provider batch. A synthesis task that opts in with
//! `params.deadline_s` is asked at tier `batch` while its deadline leaves room for one
//! ([`crate::domain::tier::choose`]); where the lane's route has a batch endpoint the worker does
//! not make the call, it parks the run:
//!
//! 1. the claim's record is *parked* under its fence ([`crate::ports::TaskStore::park`]): it stays
//!    `PROCESSING`, its view says `tier: batch` and when the answer is due, and no claim takes it;
//! 2. the batch record is written (`Submitting`, with the task's marker), the key looked up at the
//!    provider, the batch submitted only if nothing carries it, and the provider's id recorded;
//! 3. only then is the message acked: the batch record owns the run, and the collector
//!    ([`super::collect`]) ends it with the claim's fenced final write, or gives it back.
//!
//! The key is derived from the task and the claim's fence, which a parked run keeps, so every
//! delivery of that run finds the same record. What can go wrong, and what happens:
//! - the park's outcome is unknown (the store failed): the delivery comes back, and finds the run
//!   parked or claims it anew;
//! - the record cannot be written: the run is given back and the call made now, at flex;
//! - the record is there already (another delivery wrote it after this one looked): the message
//!   comes back once the record owns the run (submitted, or past the grace in which its worker may
//!   still be submitting it), and is acked then;
//! - the provider refuses the batch (it made none): the record is deleted, the run given back, and
//!   the call made now;
//! - the submission's outcome is unknown, or its id cannot be recorded: the message comes back, its
//!   claim finds the run parked and the record there, and acks; the collector later adopts the batch
//!   it finds under the key, or gives the run back;
//! - a crash after the park, before the record: the message comes back, finds the run parked and no
//!   record naming it (an earlier run's may still be open), and carries on from step 2 under the
//!   same fence.

use super::worker::{Run, Worker};
use crate::domain::batch::{
    BatchPhase, BatchRecord, BatchedTask, SUBMIT_GRACE, SUBMIT_LIMIT, task_batch_key, task_marker,
};
use crate::domain::tier::Tier;
use crate::domain::{Parked, TaskRecord};
use crate::lease::{self, Outcome};
use crate::ports::{BatchSubmission, Batching, LlmRequest, SubmitError};
use std::time::Duration;
use tracing::{info, warn};

/// How handing a run to a provider batch ended.
pub(super) enum Parking {
    /// The run is the batch's (or another delivery's): the delivery ends so.
    Done(Outcome),
    /// No batch owns the run: make the call now, at flex.
    CallNow,
}

impl Worker {
    /// The claimed run's call at the tier its lane and deadline choose, and its token estimate; a
    /// call at `batch` is parked in a provider batch instead (`Err`: how the delivery ended), or,
    /// where none can take it, made at flex.
    pub(super) async fn request_or_park(&self, run: Run<'_>, now: u64) -> Result<(LlmRequest, u64), Outcome> {
        let (task, record) = (run.task, run.record);
        let policy = self.config.lane(task.lane);
        let waited = Duration::from_millis(now.saturating_sub(record.created_at_ms));
        let mut request =
            LlmRequest { lane: task.lane, ..LlmRequest::for_task(&record.request, policy.max_tokens) }
                .at_tier((policy.tier, policy.deadline), waited);
        let estimate = crate::llm::estimate_tokens(&request);
        if request.tier == Tier::Batch {
            // A batch call never touches the synchronous limits: it is parked before its turn.
            match self.park_run(run, &request, estimate).await {
                Parking::Done(outcome) => return Err(outcome),
                Parking::CallNow => request.tier = Tier::Flex,
            }
        }
        Ok((request, estimate))
    }

    /// Hands the claimed run of `run` to a provider batch, if the lane has one and its queue room.
    pub(super) async fn park_run(&self, run: Run<'_>, request: &LlmRequest, tokens: u64) -> Parking {
        let Some(batching) = &self.batching else { return Parking::CallNow };
        if batching.queue_room().await < tokens {
            return Parking::CallNow;
        }
        let record = run.record;
        let key = task_batch_key(&batching.scope, &record.task_id, record.fence);
        let parked = Parked { batch: key, due_ms: due_ms(record) };
        let (now, ttl) = (self.clock.now_ms(), self.config.record_ttl_secs);
        match self.store.park(&record.task_id, record.fence, parked, now, ttl).await {
            Ok(true) => self.submit_parked(batching, run, request, tokens).await,
            // The fence moved on: another claim, or the client's cancellation, has the record.
            Ok(false) => Parking::Done(Outcome::LeaseLost),
            // The park may have taken effect with its answer lost: calling now could pay for a run
            // a batch is about to carry. The delivery comes back and finds out which it was.
            Err(e) => Parking::Done(self.store_down(run, &e.to_string()).await),
        }
    }

    /// A delivery whose claim found the run parked: acked when a batch record owns it; carried on
    /// from the record's write when none does (a crash after the park); given back when no batch
    /// endpoint is configured now.
    pub(super) async fn parked_delivery(&self, run: Run<'_>) -> Outcome {
        let Run { queue, message, task, record, .. } = run;
        let lane = task.lane.as_str();
        let Some(batching) = &self.batching else {
            warn!("a parked run and no batch endpoint; giving it back");
            return match self.store.unpark(&record.task_id, record.fence, self.clock.now_ms()).await {
                Ok(_) => lease::retry_later(&**queue, message, Duration::ZERO, "run given back", lane).await,
                Err(e) => self.store_down(run, &e.to_string()).await,
            };
        };
        let marker = task_marker(&record.task_id);
        let parked_in = record.waiting().map(|p| p.batch.as_str());
        match batching.store.batched(std::slice::from_ref(&marker)).await {
            // A marker naming another batch is an earlier run's, whose record its collector has
            // not closed yet: this run's record is still to be written.
            Ok(found) if found.get(&marker).map(|c| c.batch.as_str()) == parked_in => {
                let owned_in =
                    found.get(&marker).map(|c| c.owned_in(self.clock.now_ms())).unwrap_or_default();
                if owned_in.is_zero() {
                    self.metrics.duplicates_total.with_label_values(&["task_batched"]).inc();
                    lease::ack(&**queue, message).await
                } else {
                    // Its worker may still give the run back and call now: asked again once no
                    // worker can still be submitting.
                    let after = owned_in.max(self.config.backoff_base);
                    lease::retry_later(&**queue, message, after, "batch still submitting", lane).await
                }
            }
            Ok(_) => {
                let policy = self.config.lane(task.lane);
                let request = LlmRequest {
                    tier: Tier::Batch,
                    ..LlmRequest::for_task(&record.request, policy.max_tokens)
                };
                let tokens = crate::llm::estimate_tokens(&request);
                match self.submit_parked(batching, run, &request, tokens).await {
                    Parking::Done(outcome) => outcome,
                    Parking::CallNow => {
                        lease::retry_later(&**queue, message, Duration::ZERO, "run given back", lane).await
                    }
                }
            }
            Err(e) => self.store_down(run, &e.to_string()).await,
        }
    }

    /// Records, looks up, submits and records again the batch of the parked run; acks once the
    /// record owns it.
    async fn submit_parked(
        &self,
        batching: &Batching,
        run: Run<'_>,
        request: &LlmRequest,
        tokens: u64,
    ) -> Parking {
        let Run { queue, message, task, record, .. } = run;
        let key = task_batch_key(&batching.scope, &record.task_id, record.fence);
        let custom_id = format!("t-{}", key.trim_start_matches("lanes-"));
        let mut batch = BatchRecord {
            key: key.clone(),
            route: batching.api.route().to_owned(),
            provider_id: None,
            phase: BatchPhase::Submitting,
            calls: Vec::new(),
            created_at_ms: self.clock.now_ms(),
            deadline_ms: due_ms(record),
            escalated: false,
            task: Some(BatchedTask {
                task_id: record.task_id.clone(),
                fence: record.fence,
                lane: task.lane,
                kind: task.kind,
                custom_id: custom_id.clone(),
                tokens,
            }),
        };
        match batching.store.create_batch(&batch).await {
            Ok(true) => {}
            Ok(false) => return Parking::Done(self.recorded_by_another(run).await),
            Err(e) => {
                warn!(error = %e, "batch record not written; calling now");
                return self.give_back(run).await;
            }
        }
        let submission = BatchSubmission { key: key.clone(), calls: vec![(custom_id, request.clone())] };
        let id = match tokio::time::timeout(SUBMIT_LIMIT, batching.find_or_submit(&batch, &submission)).await
        {
            Ok(Ok(id)) => id,
            Ok(Err(SubmitError::NotMade(e))) => {
                warn!(error = %e, "batch not made; calling now");
                crate::metrics::llm_route_event(task.lane, batching.api.route(), "batch_refused");
                return match batching.store.close_batch(&batch).await {
                    Ok(()) => self.give_back(run).await,
                    // The record owns the run: its collector gives it back.
                    Err(_) => Parking::Done(self.owned_later(run, "batch not made").await),
                };
            }
            Ok(Err(SubmitError::Unknown(e))) => {
                warn!(error = %e, key = %key, "batch submission unanswered; its record owns the run");
                return Parking::Done(self.owned_later(run, "batch submission unanswered").await);
            }
            Err(_) => return Parking::Done(self.owned_later(run, "batch submission timed out").await),
        };
        batch.provider_id = Some(id.clone());
        batch.phase = BatchPhase::Open;
        match batching.store.update_batch(&batch, BatchPhase::Submitting).await {
            Ok(true) => {
                info!(key = %key, batch = %id, "task handed to a provider batch");
                crate::metrics::llm_route_event(task.lane, batching.api.route(), "batch_submitted");
                self.metrics.waits_total.with_label_values(&[task.lane.as_str(), "batch"]).inc();
                Parking::Done(lease::ack(&**queue, message).await)
            }
            Ok(false) => {
                Parking::Done(self.owned_later(run, "batch record changed under the submission").await)
            }
            Err(_) => Parking::Done(self.owned_later(run, "batch id not recorded").await),
        }
    }

    /// Gives the parked run back so the call is made now; if even that fails, the message comes
    /// back to find it parked.
    async fn give_back(&self, run: Run<'_>) -> Parking {
        let record = run.record;
        match self.store.unpark(&record.task_id, record.fence, self.clock.now_ms()).await {
            Ok(true) => Parking::CallNow,
            Ok(false) => Parking::Done(Outcome::LeaseLost),
            Err(e) => Parking::Done(self.store_down(run, &e.to_string()).await),
        }
    }

    /// A run its batch record owns although the batch is not known to be made: the message comes
    /// back after a pause, finds the record, and is acked; the collector settles the rest.
    async fn owned_later(&self, run: Run<'_>, why: &str) -> Outcome {
        let Run { queue, message, task, .. } = run;
        lease::retry_later(&**queue, message, self.config.backoff_base, why, task.lane.as_str()).await
    }

    /// The run's batch was recorded by another delivery, after this one's lookup missed it: that
    /// worker may still be submitting, and delete the record if the batch is refused. The message
    /// comes back once the record is sure to own the run (the grace is the longest a record stays
    /// its worker's), and is acked then.
    async fn recorded_by_another(&self, run: Run<'_>) -> Outcome {
        let Run { queue, message, task, .. } = run;
        let after = SUBMIT_GRACE.max(self.config.backoff_base);
        lease::retry_later(&**queue, message, after, "batch recorded by another", task.lane.as_str()).await
    }

    /// The store could not be read or written: the delivery comes back later.
    async fn store_down(&self, run: Run<'_>, why: &str) -> Outcome {
        let Run { queue, message, task, .. } = run;
        warn!(error = %why, "batch records unavailable");
        self.metrics.waits_total.with_label_values(&[task.lane.as_str(), "store"]).inc();
        let after = lease::full_jitter_backoff(&self.config, message.receive_count);
        lease::retry_later(&**queue, message, after, "store unavailable", task.lane.as_str()).await
    }
}

/// The task's deadline: its submission plus its `params.deadline_s` (a run with none is never
/// parked; its submission then).
pub(super) fn due_ms(record: &TaskRecord) -> u64 {
    let params = crate::domain::ModelParams::from_value(&record.request.params);
    record.created_at_ms.saturating_add(params.deadline_s.unwrap_or(0).saturating_mul(1000))
}
