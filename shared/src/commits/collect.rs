//! The collector of provider batches: run every minute by the controller in Lambda, and on a timer
//! by `lanes dev`. Each tick takes the unclosed batch records ([`crate::ports::BatchStore`]) and
//! does what [`crate::domain::batch::step`] says of each:
//! - a batch that ended is read: each answer is split by sha as a synchronous answer is, each
//!   summary written once (`attribute_not_exists`: a commit escalated and answered meanwhile keeps
//!   its first summary) and cached, and each commit it did not answer sent back to the queue at
//!   flex or above, its first enqueue time kept so its deadline still holds; then the record is
//!   closed;
//! - a batch that would miss its deadline is cancelled, and later escalated (its unanswered commits
//!   sent back at once, its late answers still written once);
//! - a record left `Submitting` by a crash is looked up at the provider by its key: the batch found
//!   is adopted, or, if none was made, its commits are sent back.
//!
//! Every step is safe to repeat: a tick that fails part-way leaves the record as it was, and the
//! next tick does it again (writes are once only, sends are of commits not yet summarized).

use super::Batching;
use super::budget::count_tokens;
use super::prompt;
use super::worker::LANE;
use crate::clock::SharedClock;
use crate::domain::batch::{BatchPhase, BatchRecord, BatchedCommit, ESCALATE_AT, Step, step};
use crate::domain::commit::{CommitSummary, CommitsMessage, Escalation, SummarySource, summary_cache_key};
use crate::domain::tier::Tier;
use crate::domain::{Lane, TokenUsage};
use crate::metrics::{Latency, Metrics};
use crate::ports::{
    BatchAnswer, BatchStatus, Cache, LlmError, LlmResponse, QueueError, QueueSend, StoreError, SummaryStore,
};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Most records one tick takes, the nearest deadlines first.
const PER_TICK: usize = 1000;

/// Why a step failed; the next tick does it again.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// The records or the summaries could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The provider did not answer.
    #[error(transparent)]
    Provider(#[from] LlmError),
    /// The queue refused the commits sent back.
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// What one tick did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Collected {
    /// Unclosed records seen.
    pub open: usize,
    /// Batches read and closed.
    pub ended: usize,
    /// Requests of ended batches that were answered (each one call's worth of tokens).
    pub calls: usize,
    /// Summaries written.
    pub written: usize,
    /// Commits sent back to the queue (unanswered, escalated, or never submitted).
    pub sent_back: usize,
    /// Cancellations asked for.
    pub cancelled: usize,
    /// Lost submissions found at the provider and adopted.
    pub adopted: usize,
    /// Steps that failed (done again next tick).
    pub errors: usize,
}

/// The collector.
#[derive(Clone)]
pub struct Collector {
    /// The batch endpoint and the records.
    pub batching: Batching,
    /// Where summaries are written.
    pub summaries: Arc<dyn SummaryStore>,
    /// Where they are cached.
    pub cache: Arc<dyn Cache>,
    /// The commits queue, for the commits sent back.
    pub send: Arc<dyn QueueSend>,
    /// Time.
    pub clock: SharedClock,
    /// Metrics.
    pub metrics: Metrics,
    /// Lifetime of a summary in the cache.
    pub cache_ttl: Duration,
}

impl Collector {
    /// One pass over the unclosed records.
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
        // A task's batch is the task collector's ([`crate::tasks::collect`]).
        records.retain(|r| r.task.is_none());
        out.open = records.len();
        records.sort_by_key(|r| r.deadline_ms);
        for r in records {
            let key = r.key.clone();
            // Each record decides on the time now, not the tick's start: a tick reads files.
            let now = self.clock.now_ms();
            if let Err(e) = self.one(r, now, &mut out).await {
                warn!(error = %e, key, "batch step failed; again next tick");
                out.errors += 1;
            }
        }
        if out != (Collected { open: out.open, ..Default::default() }) {
            info!(?out, "batches collected");
        }
        out
    }

    async fn one(&self, mut r: BatchRecord, now: u64, out: &mut Collected) -> Result<(), CollectError> {
        let api = &self.batching.api;
        let store = &self.batching.store;
        match step(&r, now) {
            Step::Wait => {}
            Step::LookUp => match api.find(&r.key, r.created_at_ms, r.requests()).await {
                Ok(Some(id)) => {
                    let was = r.phase;
                    r.provider_id = Some(id);
                    r.phase = BatchPhase::Open;
                    store.update_batch(&r, was).await?;
                    out.adopted += 1;
                }
                Ok(None) => {
                    // Never made: its commits go on as they were (unless already sent on), the
                    // deadline kept.
                    if !r.escalated {
                        out.sent_back += self.send_back(&r, Tier::Batch).await?;
                    }
                    store.close_batch(&r).await?;
                }
                // A lookup that cannot finish does not hold the commits past their deadline: they
                // go on at flex, and the record stays to be looked up again (its late answers
                // are written once).
                Err(e)
                    if !r.escalated
                        && r.deadline_ms.saturating_sub(now) <= ESCALATE_AT.as_millis() as u64 =>
                {
                    warn!(error = %e, key = %r.key, "batch lookup failed near the deadline; sending its commits on");
                    out.sent_back += self.send_back(&r, Tier::Flex).await?;
                    let was = r.phase;
                    r.escalated = true;
                    store.update_batch(&r, was).await?;
                }
                Err(e) => return Err(e.into()),
            },
            Step::Poll => {
                self.poll(&r, out).await?;
            }
            Step::Cancel | Step::Escalate => {
                // An ended batch is collected, not cancelled or escalated: its answers are in hand.
                // A provider that cannot say does not stop an escalation: the deadline comes first.
                match self.poll(&r, out).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(e) if step(&r, now) == Step::Escalate => {
                        warn!(error = %e, key = %r.key, "batch status unknown at its escalation; escalating");
                    }
                    Err(e) => return Err(e),
                }
                let (was, before) = (r.phase, r.clone());
                if step(&r, now) == Step::Escalate {
                    out.sent_back += self.send_back(&r, Tier::Flex).await?;
                    r.escalated = true;
                    crate::metrics::llm_route_event(Lane::Commits, api.route(), "batch_escalated");
                }
                if was == BatchPhase::Open && self.cancel(&r, out).await? {
                    r.phase = BatchPhase::Cancelling;
                }
                if r != before {
                    store.update_batch(&r, was).await?;
                }
            }
        }
        Ok(())
    }

    /// Asks the provider to cancel the batch: whether it took the request (or refused it for good,
    /// a batch that ended meanwhile: the next poll reads it). A failure that may pass is an error
    /// when only cancelling, and leaves the batch open to be cancelled next tick when escalating.
    async fn cancel(&self, r: &BatchRecord, out: &mut Collected) -> Result<bool, CollectError> {
        let Some(id) = &r.provider_id else { return Ok(false) };
        match self.batching.api.cancel(id).await {
            Ok(()) => {
                out.cancelled += 1;
                Ok(true)
            }
            Err(LlmError::Permanent(e)) => {
                warn!(error = %e, batch = %id, "batch cancel refused; reading it next tick");
                Ok(true)
            }
            Err(e) if r.escalated => {
                warn!(error = %e, batch = %id, "batch cancel failed; again next tick");
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Reads an ended batch: writes its answers, sends the rest on, closes its record. Whether it
    /// had ended.
    async fn poll(&self, r: &BatchRecord, out: &mut Collected) -> Result<bool, CollectError> {
        let Some(id) = &r.provider_id else { return Ok(false) };
        let answers = match self.batching.api.status(id).await {
            Ok(BatchStatus::Running(_)) => return Ok(false),
            Ok(BatchStatus::Ended(end, answers)) => {
                info!(batch = %id, ?end, answers = answers.len(), "batch ended");
                answers
            }
            // The provider refuses to say, for good (the batch is unknown to it, or the key no
            // longer reads it): read as ended with nothing answered, so its commits go on.
            Err(LlmError::Permanent(e)) => {
                warn!(batch = %id, error = %e, "batch status refused; its commits go on");
                Vec::new()
            }
            Err(e) => return Err(e.into()),
        };
        let by_id: HashMap<&str, &BatchAnswer> = answers.iter().map(|a| (a.custom_id.as_str(), a)).collect();
        let mut unanswered: Vec<&BatchedCommit> = Vec::new();
        for call in &r.calls {
            let answer = match by_id.get(call.custom_id.as_str()).map(|a| &a.outcome) {
                Some(Ok(answer)) => answer,
                other => {
                    let why = other.map_or("not answered", |o| o.as_ref().err().map_or("", |e| e.as_str()));
                    warn!(batch = %id, custom_id = %call.custom_id, why, "batch request unanswered; its commits go on");
                    unanswered.extend(&call.commits);
                    continue;
                }
            };
            self.count_call(answer);
            out.calls += 1;
            let shas: Vec<&str> = call.commits.iter().map(|c| c.commit.sha.as_str()).collect();
            let texts = prompt::parse_answer(&answer.text, &shas);
            let (ok, missing): (Vec<&BatchedCommit>, Vec<&BatchedCommit>) =
                call.commits.iter().partition(|c| texts.contains_key(c.commit.sha.as_str()));
            unanswered.extend(missing);
            for (c, tokens) in ok.iter().zip(shares(&ok, &texts, answer.usage)) {
                let text = texts[c.commit.sha.as_str()].clone();
                out.written += self.write(c, text, answer, tokens).await? as usize;
            }
        }
        if !r.escalated && !unanswered.is_empty() {
            out.sent_back += self.send(&unanswered, Tier::Flex, &r.key).await?;
        }
        self.batching.store.close_batch(r).await?;
        out.ended += 1;
        Ok(true)
    }

    /// Counts an answered batch request's tokens and cost.
    fn count_call(&self, answer: &LlmResponse) {
        let m = &self.metrics;
        m.llm_requests_total.with_label_values(&[LANE, "ok"]).inc();
        m.llm_tokens_total.with_label_values(&[LANE, "prompt"]).inc_by(answer.usage.prompt);
        m.llm_tokens_total.with_label_values(&[LANE, "completion"]).inc_by(answer.usage.completion);
        let cost = crate::llm::price::prices().cost(&answer.model, answer.usage, Tier::Batch).unwrap_or(0.0);
        m.llm_cost_usd_total.with_label_values(&[LANE, &answer.route, &answer.model, "batch"]).inc_by(cost);
    }

    /// Writes one commit's summary once; whether it was written now.
    async fn write(
        &self,
        c: &BatchedCommit,
        text: String,
        answer: &LlmResponse,
        tokens: TokenUsage,
    ) -> Result<bool, CollectError> {
        let now = self.clock.now_ms();
        let summary = CommitSummary {
            repo_id: c.commit.repo_id.clone(),
            sha: c.commit.sha.clone(),
            repo: c.commit.repo.clone(),
            subject: c.commit.subject.clone(),
            summary: text,
            model: answer.model.clone(),
            source: SummarySource::Llm,
            tokens,
            diff_tokens: c.diff_tokens,
            diff_cut: c.diff_cut,
            committed_at_ms: c.commit.committed_at_ms,
            created_at_ms: now,
            tier: Tier::Batch,
        };
        let written = self.summaries.put_summary(&summary).await? == crate::ports::WriteOnce::Written;
        if written {
            let waited = now.saturating_sub(c.enqueued_at_ms) as f64 / 1000.0;
            self.metrics.observe(Latency::Summary, Tier::Batch.as_str(), waited);
            if let Ok(json) = serde_json::to_string(&summary) {
                let key = summary_cache_key(&summary.repo_id, &summary.sha);
                if let Err(e) = self.cache.set(&key, &json, self.cache_ttl).await {
                    warn!(error = %e, "summary not cached");
                }
            }
        } else {
            self.metrics.stale_writes_rejected_total.with_label_values(&[LANE]).inc();
        }
        Ok(written)
    }

    /// Sends every commit of `r` not yet summarized back, at `floor` or above.
    async fn send_back(&self, r: &BatchRecord, floor: Tier) -> Result<usize, CollectError> {
        let all: Vec<&BatchedCommit> = r.commits().collect();
        self.send(&all, floor, &r.key).await
    }

    /// Sends those of `commits` not yet summarized back to the queue, each carrying `floor`, its
    /// first enqueue time and the batch `from` that no longer owns it; how many were sent.
    async fn send(&self, commits: &[&BatchedCommit], floor: Tier, from: &str) -> Result<usize, CollectError> {
        let keys: Vec<_> = commits.iter().map(|c| (c.commit.repo_id.clone(), c.commit.sha.clone())).collect();
        let done: std::collections::HashSet<String> =
            self.summaries.get_summaries(&keys).await?.iter().map(|s| s.key()).collect();
        let mut messages = Vec::new();
        for c in commits.iter().filter(|c| !done.contains(&c.commit.key())) {
            let escalated =
                Some(Escalation { floor, enqueued_at_ms: c.enqueued_at_ms, from: Some(from.to_owned()) });
            let commit = crate::domain::commit::CommitMessage { escalated, ..c.commit.clone() };
            let attributes = commit.send_attributes();
            let body = serde_json::to_string(&CommitsMessage::Commit(commit))
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            messages.push((body, attributes));
        }
        let unsent = self.send.send_batch(&messages).await?;
        if !unsent.is_empty() {
            return Err(QueueError::Unavailable(format!("{} commits not sent back", unsent.len())).into());
        }
        Ok(messages.len())
    }
}

/// Each answered commit's share of the request's tokens: prompt tokens by section size, completion
/// tokens by answer size (as a synchronous call's are split).
fn shares(ok: &[&BatchedCommit], texts: &HashMap<String, String>, usage: TokenUsage) -> Vec<TokenUsage> {
    let prompts = prompt::apportion(usage.prompt, &ok.iter().map(|c| c.section_tokens).collect::<Vec<_>>());
    let completions = prompt::apportion(
        usage.completion,
        &ok.iter().map(|c| count_tokens(&texts[c.commit.sha.as_str()]) as u64).collect::<Vec<_>>(),
    );
    prompts
        .into_iter()
        .zip(completions)
        .map(|(prompt, completion)| TokenUsage { prompt, completion })
        .collect()
}
