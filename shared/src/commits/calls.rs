//! A commits batch's model calls: the pending commits packed into as few calls as the budget
//! allows (one repository per call), each call abandoned when its leases are lost or the deadline
//! comes, the answer split by sha with each commit's share of the tokens, a commit the answer left
//! out asked about alone once, and each answer written once.

use super::budget;
use super::budget::Trimmed;
use super::group::{Group, GroupEnd};
use super::prompt::{self, COMPLETION_TOKENS_PER_COMMIT};
use super::report::{BatchReport, Served};
use super::worker::{CommitsWorker, LANE, Pending};
use crate::domain::commit::{CommitMessage, CommitSummary, SummarySource};
use crate::domain::tier::Tier;
use crate::domain::{Kind, Lane, TokenUsage};
use crate::lease::full_jitter_backoff;
use crate::metrics::Latency;
use crate::ports::{LlmError, LlmRequest};
use futures::future::join_all;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

impl CommitsWorker {
    /// Packs the pending commits into calls, runs them, retries missing answers alone, writes.
    pub(super) async fn summarize(
        &self,
        groups: &mut [Group],
        pending: Vec<Pending>,
        report: &mut BatchReport,
        deadline: Instant,
    ) {
        if pending.is_empty() {
            return;
        }
        let bins = self.bins(groups, &pending);
        let bins = self.submit_batches(groups, &pending, bins).await;
        let slots = Arc::new(tokio::sync::Semaphore::new(self.config.llm_concurrency.max(1)));
        let read: &[Group] = groups;
        let calls = join_all(bins.iter().map(|bin| {
            let items: Vec<&Pending> = bin.iter().map(|&i| &pending[i]).collect();
            let tokens: Vec<CancellationToken> = items.iter().map(|p| read[p.group].lost.clone()).collect();
            let slots = slots.clone();
            async move {
                let _slot = slots.acquire_owned().await;
                let r = self.call(read, &items, &tokens, deadline).await;
                (items, r)
            }
        }))
        .await;
        let mut singles: Vec<&Pending> = Vec::new();
        let mut answered: Vec<Answer<'_>> = Vec::new();
        for (items, r) in calls {
            match r {
                CallResult::Answered { answers, usage, by } => {
                    report.add_call(usage);
                    let (ok, missing) = split_answer(groups, &items, &answers, usage, &by);
                    answered.extend(ok);
                    singles.extend(missing);
                }
                CallResult::Failed(LlmError::Permanent(e)) if items.len() > 1 => {
                    report.llm_calls += 1;
                    warn!(error = %e, commits = items.len(), "batch call refused; retrying each commit alone");
                    singles.extend(items);
                }
                CallResult::Failed(e) => {
                    report.llm_calls += 1;
                    for p in items {
                        groups[p.group].outcome = Some(self.llm_failure(&e, groups[p.group].receives));
                    }
                }
                CallResult::Cancelled(reason) => {
                    for p in items {
                        groups[p.group].outcome =
                            Some(GroupEnd::Wait { after: Duration::ZERO, reason: reason.clone() });
                    }
                }
            }
        }
        answered.extend(self.ask_alone(groups, &singles, report, deadline).await);
        for (p, text, usage, (model, tier)) in answered {
            let g = p.group;
            if groups[g].lost.is_cancelled() {
                // Written all the same, as a task's answer in hand is: a summary is written once
                // (the store refuses a second), so a paid answer can only spare another worker
                // its call, never overwrite one.
                info!(key = %groups[g].commit.key(), "lease lost mid-batch; writing the answer in hand");
                self.metrics.leases_lost_total.with_label_values(&[LANE]).inc();
            }
            let summary =
                self.summary(&groups[g].commit, text, &model, SummarySource::Llm, usage, &p.trimmed);
            let summary = CommitSummary { tier, ..summary };
            let waited = summary.created_at_ms.saturating_sub(groups[g].enqueued_at_ms);
            let end = self.write(&groups[g], summary, Served::Llm).await;
            if matches!(end, GroupEnd::Done(_)) {
                self.metrics.observe(Latency::Summary, tier.as_str(), waited as f64 / 1000.0);
            }
            groups[g].outcome = Some(end);
        }
    }

    /// The pending commits (indexes into `pending`) packed into calls. One call carries the commits
    /// of one repository only: a diff is untrusted text, and in a shared prompt it could steer the
    /// summary written (once, for good) for another repository, another tenant's. Within a
    /// repository the shas are distinct, so an answer keyed by sha is unambiguous. Repositories are
    /// packed in a fixed order, so batches are reproducible.
    pub(super) fn bins(&self, groups: &[Group], pending: &[Pending]) -> Vec<Vec<usize>> {
        let mut by_repo: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
        for (i, p) in pending.iter().enumerate() {
            by_repo.entry(groups[p.group].commit.repo_id.as_str()).or_default().push(i);
        }
        by_repo
            .values()
            .flat_map(|repo| {
                let sizes: Vec<usize> = repo.iter().map(|&i| pending[i].section_tokens).collect();
                prompt::pack(&sizes, self.config.batch_tokens, self.config.max_commits_per_call)
                    .into_iter()
                    .map(|bin| bin.into_iter().map(|j| repo[j]).collect::<Vec<usize>>())
            })
            .collect()
    }

    /// Asks about each commit a batch answer left out or mangled alone, once.
    async fn ask_alone<'p>(
        &self,
        groups: &mut [Group],
        singles: &[&'p Pending],
        report: &mut BatchReport,
        deadline: Instant,
    ) -> Vec<Answer<'p>> {
        let read: &[Group] = groups;
        let retried = join_all(singles.iter().map(|p| {
            let token = vec![read[p.group].lost.clone()];
            async move { (*p, self.call(read, &[*p], &token, deadline).await) }
        }))
        .await;
        let mut answered = Vec::new();
        for (p, r) in retried {
            match r {
                CallResult::Answered { answers, usage, by } => {
                    report.add_call(usage);
                    match answers.get(groups[p.group].commit.sha.as_str()) {
                        Some(text) => answered.push((p, text.clone(), usage, by)),
                        None => {
                            let after = full_jitter_backoff(&self.lease, groups[p.group].receives);
                            groups[p.group].outcome = Some(GroupEnd::Retry {
                                after,
                                reason: "the model's answer had no valid summary".into(),
                            });
                        }
                    }
                }
                CallResult::Failed(e) => {
                    report.llm_calls += 1;
                    groups[p.group].outcome = Some(self.llm_failure(&e, groups[p.group].receives));
                }
                CallResult::Cancelled(reason) => {
                    groups[p.group].outcome = Some(GroupEnd::Wait { after: Duration::ZERO, reason });
                }
            }
        }
        answered
    }

    /// A commit's summary record, written by the model or by a rule.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn summary(
        &self,
        commit: &CommitMessage,
        text: String,
        model: &str,
        source: SummarySource,
        tokens: TokenUsage,
        trimmed: &Trimmed,
    ) -> CommitSummary {
        CommitSummary {
            repo_id: commit.repo_id.clone(),
            sha: commit.sha.clone(),
            repo: commit.repo.clone(),
            subject: commit.subject.clone(),
            summary: text,
            model: model.to_owned(),
            source,
            tokens,
            diff_tokens: trimmed.tokens as u64,
            diff_cut: trimmed.cut,
            committed_at_ms: commit.committed_at_ms,
            created_at_ms: self.clock.now_ms(),
            tier: crate::domain::tier::Tier::Sync,
        }
    }

    fn llm_failure(&self, e: &LlmError, receives: u32) -> GroupEnd {
        match e {
            LlmError::Permanent(reason) => {
                self.metrics.llm_requests_total.with_label_values(&[LANE, "permanent"]).inc();
                GroupEnd::DeadLetter(format!("the model refused the commit: {reason}"), "permanent")
            }
            LlmError::Retryable { message, retry_after } => {
                self.metrics.llm_requests_total.with_label_values(&[LANE, "retryable"]).inc();
                let after = full_jitter_backoff(&self.lease, receives).max(retry_after.unwrap_or_default());
                GroupEnd::Retry { after, reason: format!("model: {message}") }
            }
            LlmError::TierRefused { message, .. } => {
                // Answered at `sync` inside the routes; one reaching here is a wait, not an attempt.
                self.metrics.waits_total.with_label_values(&[LANE, "throttled"]).inc();
                let after = full_jitter_backoff(&self.lease, receives);
                GroupEnd::Wait { after, reason: format!("model: {message}") }
            }
            LlmError::Throttled { message, retry_after } => {
                self.metrics.llm_requests_total.with_label_values(&[LANE, "throttled"]).inc();
                self.metrics.waits_total.with_label_values(&[LANE, "throttled"]).inc();
                let after = retry_after.unwrap_or_else(|| full_jitter_backoff(&self.lease, receives));
                GroupEnd::Wait { after, reason: format!("model: {message}") }
            }
        }
    }

    /// The tier of a call for `items`: the lane's choice for the item that has waited longest,
    /// never below the floor of an item a batch sent back. `batch` where the lane allows it: the
    /// caller then submits those calls to a provider batch ([`super::batches`]).
    pub(super) fn tier_for(&self, groups: &[Group], items: &[&Pending]) -> Tier {
        let oldest = items.iter().map(|p| groups[p.group].enqueued_at_ms).min().unwrap_or(u64::MAX);
        let waited = Duration::from_millis(self.clock.now_ms().saturating_sub(oldest));
        let policy = self.lease.lane(Lane::Commits);
        let floor = items
            .iter()
            .filter_map(|p| groups[p.group].commit.escalated.as_ref().map(|e| e.floor))
            .fold(None, |acc: Option<Tier>, f| Some(f.at_least(acc)));
        crate::domain::tier::choose(policy.tier, policy.deadline, waited).at_least(floor)
    }

    /// The call for `items` at `tier`: their sections in one prompt.
    pub(super) fn request_for(&self, items: &[&Pending], tier: Tier) -> LlmRequest {
        LlmRequest {
            tier,
            lane: Lane::Commits,
            kind: Kind::CommitSummary,
            prompt: prompt::build_prompt(items.iter().map(|p| p.section.as_str())),
            target_files: Vec::new(),
            max_tokens: 200 + COMPLETION_TOKENS_PER_COMMIT * items.len() as u32,
            params: Default::default(),
            prefix: None,
        }
    }

    /// One model call for `items`, abandoned when every item's lease is lost or the deadline comes.
    async fn call(
        &self,
        groups: &[Group],
        items: &[&Pending],
        lost: &[CancellationToken],
        deadline: Instant,
    ) -> CallResult {
        // A call the lane would batch but that is made now (no batch endpoint, or no room in its
        // queue) is made at the nearest synchronous price.
        let tier = match self.tier_for(groups, items) {
            Tier::Batch => Tier::Flex,
            tier => tier,
        };
        let request = self.request_for(items, tier);
        let all_lost = async {
            for t in lost {
                t.cancelled().await;
            }
        };
        let r = tokio::select! {
            biased;
            _ = all_lost => return CallResult::Cancelled("lease lost".into()),
            _ = tokio::time::sleep_until(deadline) => return CallResult::Cancelled("invocation deadline".into()),
            r = self.llm.complete(&request) => r,
        };
        match r {
            Ok(resp) => {
                self.metrics.llm_requests_total.with_label_values(&[LANE, "ok"]).inc();
                self.metrics.llm_tokens_total.with_label_values(&[LANE, "prompt"]).inc_by(resp.usage.prompt);
                let cost =
                    crate::llm::price::prices().cost(&resp.model, resp.usage, resp.tier).unwrap_or(0.0);
                self.metrics
                    .llm_cost_usd_total
                    .with_label_values(&[LANE, &resp.route, &resp.model, resp.tier.as_str()])
                    .inc_by(cost);
                self.metrics
                    .llm_tokens_total
                    .with_label_values(&[LANE, "completion"])
                    .inc_by(resp.usage.completion);
                let shas: Vec<&str> = items.iter().map(|p| sha_of(&p.section)).collect();
                let answers = prompt::parse_answer(&resp.text, &shas);
                CallResult::Answered { answers, usage: resp.usage, by: (resp.model, resp.tier) }
            }
            Err(e) => CallResult::Failed(e),
        }
    }
}

fn sha_of(section: &str) -> &str {
    section.lines().next().and_then(|l| l.strip_prefix("=== commit ")).unwrap_or("").trim()
}

/// The model that answered a call and the tier it was served at.
type By = (String, Tier);

/// One commit's answer in hand: its text, its share of the call's tokens, who answered.
type Answer<'p> = (&'p Pending, String, TokenUsage, By);

/// A batch call's answers, each with its share of the call's usage (prompt tokens by section size,
/// completion tokens by answer size), and the commits the answer left out.
fn split_answer<'p>(
    groups: &[Group],
    items: &[&'p Pending],
    answers: &HashMap<String, String>,
    usage: TokenUsage,
    by: &By,
) -> (Vec<Answer<'p>>, Vec<&'p Pending>) {
    let (ok, missing): (Vec<&Pending>, Vec<&Pending>) =
        items.iter().copied().partition(|p| answers.contains_key(groups[p.group].commit.sha.as_str()));
    let text = |p: &Pending| &answers[groups[p.group].commit.sha.as_str()];
    let prompts =
        prompt::apportion(usage.prompt, &ok.iter().map(|p| p.section_tokens as u64).collect::<Vec<_>>());
    let completions = prompt::apportion(
        usage.completion,
        &ok.iter().map(|p| budget::count_tokens(text(p)) as u64).collect::<Vec<_>>(),
    );
    let answered = ok
        .iter()
        .zip(prompts)
        .zip(completions)
        .map(|((p, pt), ct)| (*p, text(p).clone(), TokenUsage { prompt: pt, completion: ct }, by.clone()))
        .collect();
    (answered, missing)
}

enum CallResult {
    Answered { answers: HashMap<String, String>, usage: TokenUsage, by: By },
    Failed(LlmError),
    Cancelled(String),
}
