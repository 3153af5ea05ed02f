//! The commits lane's worker: a whole batch of commit messages at once (see docs/ARCHITECTURE.md:
//! Flows; Lease, fence and ack; Idempotency). Every message is leased at receipt and renewed by one heartbeat (visibility and lock together); each
//! distinct `repo_id:sha` is answered from the hot cache, then the store (`BatchGetItem`), and only
//! the rest are locked, diffed, trimmed, packed into as few LLM calls as the budget allows, validated,
//! written once (`attribute_not_exists`), cached for 24 h and acknowledged. Nothing is dropped: a
//! commit held by another worker, or failing for a reason that may pass, goes back to the queue.

pub use super::CommitsConfig;
use super::budget::Trimmed;
use super::group::{Group, GroupEnd};
pub use super::report::{BatchReport, Done, Served};
use crate::clock::SharedClock;
use crate::config::WorkerConfig;
use crate::domain::commit::{CommitSummary, CommitsMessage, PushRange, summary_cache_key};
use crate::domain::{MessageId, RepoId, Sha};
use crate::lease::{
    self, Heartbeat, Leased, LeasedQueue, Membership, Outcome, after_holder, full_jitter_backoff,
};
use crate::metrics::Metrics;
use crate::ports::{
    Acquire, Cache, DiffSource, LeaseLock, LlmClient, QueueConsume, QueueError, QueueSend, ReceivedMessage,
    SummaryStore, WriteOnce,
};
use futures::future::join_all;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub(super) const LANE: &str = "commits";

/// The commits worker, built once per process.
#[derive(Clone)]
pub struct CommitsWorker {
    /// Immutable summaries.
    pub summaries: Arc<dyn SummaryStore>,
    /// Hot cache.
    pub cache: Arc<dyn Cache>,
    /// Lease lock.
    pub lock: Arc<dyn LeaseLock>,
    /// The model (behind the shared limiter).
    pub llm: Arc<dyn LlmClient>,
    /// Where diffs come from.
    pub diffs: Arc<dyn DiffSource>,
    /// The commits queue, where the commits of an incomplete push are sent once listed.
    pub send: Arc<dyn QueueSend>,
    /// Metrics.
    pub metrics: Metrics,
    /// Time.
    pub clock: SharedClock,
    /// Lease and backoff settings (shared with the task worker).
    pub lease: WorkerConfig,
    /// Budgets.
    pub config: CommitsConfig,
    /// Provider batches, when the lane's route has a batch endpoint ([`super::batches`]).
    pub batching: Option<super::Batching>,
}

/// A commit waiting for the model.
pub(super) struct Pending {
    pub(super) group: usize,
    pub(super) trimmed: Trimmed,
    pub(super) section: String,
    pub(super) section_tokens: usize,
}

impl CommitsWorker {
    /// A heartbeat for commit deliveries read from `queue`: each joined delivery's visibility and
    /// lock, renewed together.
    pub fn heartbeat(&self, queue: Arc<dyn QueueConsume>) -> Heartbeat {
        Heartbeat::start(queue, self.lock.clone(), None, self.metrics.clone(), LANE, &self.lease)
    }

    /// Processes a batch before `deadline`; returns each message's outcome (by message id) and what
    /// was done. Commits still waiting at the deadline are handed back at once.
    pub async fn process_batch(
        &self,
        queue: Arc<dyn QueueConsume>,
        messages: Vec<ReceivedMessage>,
        deadline: Instant,
    ) -> (Vec<(MessageId, Outcome)>, BatchReport) {
        let batch = Arc::new(LeasedQueue::new(queue.clone(), self.heartbeat(queue)));
        self.process_batch_in(batch, messages, deadline).await
    }

    /// Like [`Self::process_batch`], for the deliveries of `batch` (a Lambda invocation's, see
    /// [`LeasedQueue::for_mapping`]): renewed by its heartbeat and settled through it.
    pub async fn process_batch_in(
        &self,
        batch: Arc<LeasedQueue>,
        messages: Vec<ReceivedMessage>,
        deadline: Instant,
    ) -> (Vec<(MessageId, Outcome)>, BatchReport) {
        let heartbeat = batch.heartbeat();
        let queue: Arc<dyn QueueConsume> = batch.clone();
        let mut outcomes: Vec<Option<Outcome>> = vec![None; messages.len()];
        let mut report = BatchReport::default();

        let (mut groups, ranges) = self.decode(&*queue, &messages, &mut outcomes).await;
        report.commits = groups.len();
        // Listing a push may take many pages: its own deadline (six diff fetches' worth, within the
        // batch's), the ranges side by side.
        let list_by = deadline.min(Instant::now() + self.config.fetch_deadline.saturating_mul(6));
        let expanded =
            join_all(ranges.iter().map(|(i, range)| self.expand(&*queue, &messages[*i], range, list_by)))
                .await;
        for ((i, _), (outcome, sent)) in ranges.iter().zip(expanded) {
            outcomes[*i] = Some(outcome);
            report.expanded += sent;
        }

        // Renewed while these live: to the end of the batch.
        let _renewed = self.start_leases(&*queue, heartbeat, &mut groups, &messages).await;

        // Locked first, then looked up: a worker that summarized a commit did so under its lock, so
        // once the lock is ours its summary is in the store. Looking up first let a commit
        // summarized between the lookup and the lock be summarized again.
        self.lock_rest(&mut groups, &messages, heartbeat).await;
        // Batched first, then looked up: a batch's record is closed only once its summaries are
        // written, so a commit whose record is gone has its summary in the store by then.
        self.answer_batched(&mut groups).await;
        self.answer_known(&mut groups, &mut report).await;
        // Only a commit that will cost a diff and a call counts against its repository's day.
        self.take_repo_budget(&mut groups).await;
        let pending = self.fetch_and_trim(&mut groups).await;
        self.summarize(&mut groups, pending, &mut report, deadline).await;
        self.give_back_repo_budget(&groups).await;

        self.settle(&*queue, heartbeat, groups, &messages, &mut outcomes, &mut report).await;
        let out = messages
            .iter()
            .zip(outcomes)
            .map(|(m, o)| (m.message_id.clone(), o.unwrap_or(Outcome::LeaseLost)))
            .collect();
        info!(
            commits = report.commits,
            llm_calls = report.llm_calls,
            cache_hits = report.cache_hits,
            store_hits = report.store_hits,
            "commit batch done"
        );
        (out, report)
    }

    /// Decodes the batch's messages: commits grouped by key (a commit delivered twice is one
    /// group), push ranges to expand, and undecodable ones dead-lettered at once.
    async fn decode(
        &self,
        queue: &dyn QueueConsume,
        messages: &[ReceivedMessage],
        outcomes: &mut [Option<Outcome>],
    ) -> (Vec<Group>, Vec<(usize, PushRange)>) {
        let mut groups: Vec<Group> = Vec::new();
        let mut by_key: HashMap<String, usize> = HashMap::new();
        let mut ranges: Vec<(usize, PushRange)> = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let commit = match serde_json::from_str::<CommitsMessage>(&m.body).map_err(|e| e.to_string()) {
                Ok(CommitsMessage::Range { range }) => match range.validate() {
                    Ok(()) => {
                        ranges.push((i, range));
                        continue;
                    }
                    Err(e) => Err(e.to_string()),
                },
                Ok(CommitsMessage::Commit(c)) => c.validate().map(|_| c).map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            match commit {
                Ok(c) => {
                    let g = *by_key.entry(c.key()).or_insert_with(|| {
                        groups.push(Group {
                            commit: c.clone(),
                            receives: 0,
                            members: Vec::new(),
                            lost: CancellationToken::new(),
                            lock: None,
                            outcome: None,
                            budget: None,
                            // Lowered below by every delivery's send and, for one sent back by a
                            // batch's collector, its first send ([`Group::escalated_too`]).
                            enqueued_at_ms: u64::MAX,
                            sent_back_by: Vec::new(),
                        });
                        groups.len() - 1
                    });
                    groups[g].members.push(i);
                    if let Some(e) = &c.escalated {
                        groups[g].escalated_too(e);
                    }
                    groups[g].enqueued_at_ms = groups[g].enqueued_at_ms.min(m.sent_at_ms);
                    groups[g].receives = groups[g].receives.max(m.receive_count);
                }
                Err(e) => {
                    let reason = format!("undecodable commit message: {e}");
                    outcomes[i] =
                        Some(lease::dead_letter(&self.metrics, queue, m, reason, LANE, "undecodable").await);
                }
            }
        }
        (groups, ranges)
    }

    /// Leases every commit delivery now: the queue's own visibility is long; ours is short and
    /// renewed by `heartbeat` while the returned memberships live. A group whose lease could not
    /// start waits.
    async fn start_leases(
        &self,
        queue: &dyn QueueConsume,
        heartbeat: &Heartbeat,
        groups: &mut [Group],
        messages: &[ReceivedMessage],
    ) -> Vec<Membership> {
        let ttl = self.lease.lease_ttl;
        let members: Vec<usize> = groups.iter().flat_map(|g| g.members.iter().copied()).collect();
        let mut leased: Vec<ReceivedMessage> = members.iter().map(|&i| messages[i].clone()).collect();
        let starts = members.into_iter().zip(crate::lease::start_many(queue, &mut leased, ttl).await);
        let mut leases = Vec::new();
        for (i, r) in starts {
            let Some(g) = groups.iter().position(|g| g.members.contains(&i)) else { continue };
            // The group's lease follows its first delivery, the one that carries its lock: another
            // delivery of the same commit whose receipt is refused went to another consumer, which
            // the lock turns away; it must not stop the group's run (and drop a paid call).
            let carrier = groups[g].members.first() == Some(&i);
            let lost = if carrier { groups[g].lost.clone() } else { CancellationToken::new() };
            match r {
                Ok(()) => {}
                Err(QueueError::ReceiptInvalid) => lost.cancel(),
                Err(e) => {
                    warn!(error = %e, "could not start the lease");
                    let after = full_jitter_backoff(&self.lease, groups[g].receives);
                    groups[g].outcome = Some(GroupEnd::Wait { after, reason: "queue unavailable".into() });
                }
            }
            leases.push(Leased::new(messages[i].receipt.clone(), lost));
        }
        leases.into_iter().map(|l| heartbeat.join(l)).collect()
    }

    /// Settles every commit delivery by its group's end, releases the groups' locks and reports
    /// the summaries.
    async fn settle(
        &self,
        queue: &dyn QueueConsume,
        heartbeat: &Heartbeat,
        mut groups: Vec<Group>,
        messages: &[ReceivedMessage],
        outcomes: &mut [Option<Outcome>],
        report: &mut BatchReport,
    ) {
        // Off the heartbeat together first (one wait
        // for a beat under way, not one per delivery). Only the groups' members: a range message
        // acked earlier stays kept hidden for the mapping's delete.
        let receipts: Vec<&str> =
            groups.iter().flat_map(|g| &g.members).map(|&i| messages[i].receipt.as_str()).collect();
        heartbeat.leave_all(&receipts).await;
        for g in &mut groups {
            let end = match g.outcome.take() {
                Some(e) => e,
                None => {
                    GroupEnd::Wait { after: Duration::ZERO, reason: "not reached before the deadline".into() }
                }
            };
            let end =
                if g.lost.is_cancelled() && matches!(end, GroupEnd::Retry { .. } | GroupEnd::Wait { .. }) {
                    GroupEnd::Lost
                } else {
                    end
                };
            for &i in &g.members {
                let m = &messages[i];
                outcomes[i] = Some(match &end {
                    GroupEnd::Done(_) | GroupEnd::Batched => lease::ack(queue, m).await,
                    GroupEnd::Lost => Outcome::LeaseLost,
                    GroupEnd::Wait { after, reason } => {
                        lease::retry_later(queue, m, *after, reason, LANE).await
                    }
                    GroupEnd::Retry { after, reason } => {
                        // A commit has no record: its deliveries are its attempts.
                        if lease::is_last_delivery(queue, m) {
                            let reason = format!("gave up after {} attempts: {reason}", m.receive_count);
                            lease::dead_letter(&self.metrics, queue, m, reason, LANE, "attempts").await
                        } else {
                            lease::hand_back(queue, m, *after, reason, LANE).await
                        }
                    }
                    GroupEnd::DeadLetter(reason, why) => {
                        lease::dead_letter(&self.metrics, queue, m, reason.clone(), LANE, why).await
                    }
                });
            }
            if let (Some((key, token)), false) = (&g.lock, matches!(end, GroupEnd::Lost))
                && let Err(e) = self.lock.release(key, token).await
            {
                warn!(error = %e, "lock release failed; it expires with its TTL");
            }
            if matches!(end, GroupEnd::Batched) {
                report.batched += 1;
            }
            if let GroupEnd::Done(done) = end {
                if done.served == Served::Rule {
                    report.rule_summaries += 1;
                }
                report.done.push(*done);
            }
        }
    }

    pub(super) fn open(groups: &[Group]) -> impl Iterator<Item = usize> + '_ {
        groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.outcome.is_none() && !g.lost.is_cancelled())
            .map(|(i, _)| i)
    }

    /// Hot cache, then one `BatchGetItem` for the misses.
    async fn answer_known(&self, groups: &mut [Group], report: &mut BatchReport) {
        let open: Vec<usize> = Self::open(groups).collect();
        let hits = join_all(open.iter().map(|&g| {
            let key = summary_cache_key(&groups[g].commit.repo_id, &groups[g].commit.sha);
            let cache = self.cache.clone();
            async move { (g, cache.get(&key).await) }
        }))
        .await;
        for (g, hit) in hits {
            match hit {
                Ok(Some(json)) => {
                    if let Ok(summary) = serde_json::from_str::<CommitSummary>(&json) {
                        report.cache_hits += 1;
                        self.metrics.duplicates_total.with_label_values(&["commit_cache"]).inc();
                        groups[g].outcome =
                            Some(GroupEnd::Done(Box::new(Done { served: Served::Cache, summary })));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, "cache unavailable; reading the store");
                    self.metrics.degraded_operations_total.with_label_values(&["cache"]).inc();
                }
            }
        }
        let open: Vec<usize> = Self::open(groups).collect();
        if open.is_empty() {
            return;
        }
        let keys: Vec<(RepoId, Sha)> =
            open.iter().map(|&g| (groups[g].commit.repo_id.clone(), groups[g].commit.sha.clone())).collect();
        match self.summaries.get_summaries(&keys).await {
            Ok(found) => {
                for summary in found {
                    let Some(&g) = open.iter().find(|&&g| groups[g].commit.key() == summary.key()) else {
                        continue;
                    };
                    report.store_hits += 1;
                    self.metrics.duplicates_total.with_label_values(&["commit_store"]).inc();
                    self.fill_cache(&summary).await;
                    groups[g].outcome =
                        Some(GroupEnd::Done(Box::new(Done { served: Served::Store, summary })));
                }
            }
            Err(e) => {
                // A wait, as in the task flow: an outage uses none of a commit's deliveries, so it
                // never sends the commit to the DLQ.
                warn!(error = %e, "store unavailable");
                for &g in &open {
                    let after = full_jitter_backoff(&self.lease, groups[g].receives);
                    groups[g].outcome = Some(GroupEnd::Wait { after, reason: "store unavailable".into() });
                }
            }
        }
    }

    /// Locks each remaining commit; one held elsewhere goes back for when that lease would end.
    async fn lock_rest(&self, groups: &mut [Group], messages: &[ReceivedMessage], heartbeat: &Heartbeat) {
        let open: Vec<usize> = Self::open(groups).collect();
        let ttl = self.lease.lease_ttl;
        let results = join_all(open.iter().map(|&g| {
            let key = format!("lease:{{commit:{}}}", groups[g].commit.key());
            let lock = self.lock.clone();
            // One delivery of the group carries the lock on the heartbeat.
            let carrier = groups[g].members.first().map(|&m| messages[m].receipt.clone());
            async move {
                let r = lock.acquire(&key, ttl).await;
                // Renewed from the moment it is taken, not once every other commit's lock has
                // answered: one slow acquire must not let the batch's other locks lapse.
                if let (Ok(Acquire::Acquired(token)), Some(receipt)) = (&r, &carrier) {
                    heartbeat.set_lock(receipt, key.clone(), token.clone());
                }
                (g, key, r)
            }
        }))
        .await;
        for (g, key, r) in results {
            match r {
                Ok(Acquire::Acquired(token)) => groups[g].lock = Some((key, token)),
                Ok(Acquire::Held { remaining }) => {
                    self.metrics.lock_contended_total.with_label_values(&[LANE]).inc();
                    let after = after_holder(&self.lease, remaining);
                    groups[g].outcome =
                        Some(GroupEnd::Wait { after, reason: "lease held by another worker".into() });
                }
                Err(e) => {
                    warn!(error = %e, "lock unavailable; running degraded");
                    self.metrics.degraded_operations_total.with_label_values(&["lock"]).inc();
                }
            }
        }
    }

    /// Write once; when another worker won the race, its summary is the one kept and served.
    pub(super) async fn write(&self, group: &Group, summary: CommitSummary, served: Served) -> GroupEnd {
        // A failed write is asked again before a paid answer is put off: the write is once only
        // (`attribute_not_exists`), so a write whose answer was lost reads `Exists` the next time.
        let written = lease::ask_thrice(
            || self.summaries.put_summary(&summary),
            |e: &crate::ports::StoreError| crate::ports::RetryIntent::is_retryable(e),
        )
        .await;
        match written {
            Ok(WriteOnce::Written) => {
                self.fill_cache(&summary).await;
                GroupEnd::Done(Box::new(Done { served, summary }))
            }
            Ok(WriteOnce::Exists) => {
                self.metrics.stale_writes_rejected_total.with_label_values(&[LANE]).inc();
                let key = [(summary.repo_id.clone(), summary.sha.clone())];
                match self.summaries.get_summaries(&key).await {
                    Ok(mut found) if !found.is_empty() => {
                        let kept = found.remove(0);
                        self.fill_cache(&kept).await;
                        GroupEnd::Done(Box::new(Done { served: Served::Store, summary: kept }))
                    }
                    _ => GroupEnd::Done(Box::new(Done { served: Served::Store, summary })),
                }
            }
            Err(e) => {
                warn!(error = %e, key = %group.commit.key(), "summary write failed");
                GroupEnd::Wait {
                    after: full_jitter_backoff(&self.lease, group.receives),
                    reason: "store unavailable".into(),
                }
            }
        }
    }

    pub(super) async fn fill_cache(&self, summary: &CommitSummary) {
        let Ok(json) = serde_json::to_string(summary) else { return };
        let key = summary_cache_key(&summary.repo_id, &summary.sha);
        if let Err(e) = self.cache.set(&key, &json, self.config.cache_ttl).await {
            warn!(error = %e, "cache fill failed");
            self.metrics.degraded_operations_total.with_label_values(&["cache"]).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::commits::prompt;
    use crate::domain::commit::{CommitMessage, Provider};
    use crate::embedded::{
        EmbeddedDb, EmbeddedQueue, EmbeddedQueues, EmbeddedSummaries, MemoryCache, MemoryLock,
    };
    use crate::llm::OfflineProvider;
    use crate::ports::{DiffError, LlmError, LlmRequest};
    use crate::ports::{LlmResponse, StoreError};
    use async_trait::async_trait;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Diffs by sha; an unknown sha is a 404 (permanent).
    #[derive(Default)]
    struct FakeDiffs {
        diffs: HashMap<String, String>,
        calls: AtomicU64,
    }

    /// The commit whose diff never arrives.
    const SLOW_SHA: &str = "5105105105105105105105105105105105105105";

    #[async_trait]
    impl DiffSource for FakeDiffs {
        async fn diff(&self, commit: &CommitMessage) -> Result<String, DiffError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if commit.sha == SLOW_SHA {
                // A host that never finishes sending this one.
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            self.diffs.get(commit.sha.as_str()).cloned().ok_or_else(|| DiffError::Permanent("404".into()))
        }

        /// Every commit it has a diff for, in sha order, as the range's commits.
        async fn commits_between(&self, range: &PushRange) -> Result<Vec<CommitMessage>, DiffError> {
            let mut shas: Vec<&String> = self.diffs.keys().filter(|s| s.as_str() != SLOW_SHA).collect();
            shas.sort();
            Ok(shas
                .into_iter()
                .map(|sha| CommitMessage {
                    provider: range.provider,
                    repo_id: range.repo_id.clone(),
                    repo: range.repo.clone(),
                    sha: sha.clone().parse().unwrap(),
                    subject: "listed by the host".into(),
                    committed_at_ms: 1,
                    escalated: Default::default(),
                })
                .collect())
        }
    }

    /// The offline answer with some shas left out of batch answers (answered when asked alone).
    struct Forgetful {
        inner: OfflineProvider,
        forget: String,
        calls: AtomicU64,
        commits_asked: Mutex<Vec<String>>,
        /// The shas of each call, call by call.
        prompts: Mutex<Vec<Vec<String>>>,
        /// The tier each call asked for.
        tiers: Mutex<Vec<crate::domain::tier::Tier>>,
    }

    #[async_trait]
    impl LlmClient for Forgetful {
        async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let shas: Vec<String> = request
                .prompt
                .lines()
                .filter_map(|l| l.strip_prefix("=== commit ").map(str::to_owned))
                .collect();
            if let Ok(mut asked) = self.commits_asked.lock() {
                asked.extend(shas.iter().cloned());
            }
            if let Ok(mut prompts) = self.prompts.lock() {
                prompts.push(shas.clone());
            }
            if let Ok(mut tiers) = self.tiers.lock() {
                tiers.push(request.tier);
            }
            let mut resp = self.inner.complete(request).await?;
            if shas.len() > 1 {
                let mut v: Vec<serde_json::Value> = serde_json::from_str(&resp.text).unwrap_or_default();
                v.retain(|e| e["sha"].as_str() != Some(self.forget.as_str()));
                resp.text = serde_json::to_string(&v).unwrap_or_default();
            }
            Ok(resp)
        }
    }

    fn diff(path: &str, lines: usize) -> String {
        let body: String = (0..lines).map(|i| format!("+line {i} of {path}\n")).collect();
        format!("diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -0,0 +1,{lines} @@\n{body}")
    }

    fn sha(i: u32) -> String {
        format!("{i:040x}")
    }

    struct Rig {
        _dir: tempfile::TempDir,
        worker: CommitsWorker,
        queue: EmbeddedQueue,
        llm: Arc<Forgetful>,
        diffs: Arc<FakeDiffs>,
    }

    async fn rig(diffs: HashMap<String, String>, forget: &str) -> Rig {
        rig_answering_in(diffs, forget, Duration::ZERO).await
    }

    /// A rig whose model takes `latency` to answer.
    async fn rig_answering_in(diffs: HashMap<String, String>, forget: &str, latency: Duration) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let clock: SharedClock = Arc::new(SystemClock);
        let queues = EmbeddedQueues::open(db.clone(), clock.clone(), Default::default()).await.unwrap();
        let queue = queues.queue("commits", "commits-dlq");
        let llm = Arc::new(Forgetful {
            inner: OfflineProvider::new(move |_| latency).answering_batches(prompt::offline_answer),
            forget: forget.to_owned(),
            calls: AtomicU64::new(0),
            commits_asked: Mutex::new(Vec::new()),
            prompts: Mutex::new(Vec::new()),
            tiers: Mutex::new(Vec::new()),
        });
        let diffs = Arc::new(FakeDiffs { diffs, calls: AtomicU64::new(0) });
        let worker = CommitsWorker {
            summaries: Arc::new(EmbeddedSummaries::new(db)),
            cache: Arc::new(MemoryCache::new(clock.clone())),
            lock: Arc::new(MemoryLock::new(clock.clone())),
            llm: llm.clone(),
            diffs: diffs.clone(),
            send: Arc::new(queue.clone()),
            metrics: Metrics::new(),
            clock,
            lease: WorkerConfig::default().with_lease(Duration::from_millis(600)),
            config: CommitsConfig { batch_tokens: 2_000, ..CommitsConfig::default() },
            batching: Default::default(),
        };
        Rig { _dir: dir, worker, queue, llm, diffs }
    }

    fn message(repo_id: &str, sha: &str) -> String {
        serde_json::to_string(&CommitMessage {
            provider: Provider::Github,
            repo_id: repo_id.parse().unwrap(),
            repo: "o/r".into(),
            sha: sha.parse().unwrap(),
            subject: format!("subject {}", &sha[36..]),
            committed_at_ms: 1,
            escalated: Default::default(),
        })
        .unwrap()
    }

    async fn drain(r: &Rig) -> (Vec<Outcome>, BatchReport) {
        let batch = crate::lease::receive_batch(&r.queue, 100, Duration::from_secs(5)).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let (outcomes, report) = r.worker.process_batch(Arc::new(r.queue.clone()), batch, deadline).await;
        (outcomes.into_iter().map(|(_, o)| o).collect(), report)
    }

    /// Nobody waits for a summary: by default the lane asks for flex while its six hours leave room
    /// for a slow flex call, and for sync once they do not (the deadline counts from the send).
    #[tokio::test]
    async fn the_commits_lane_asks_for_flex_while_its_deadline_leaves_room_and_sync_after() {
        use crate::clock::Clock;
        use crate::domain::tier::Tier;
        let r = rig(HashMap::from([(sha(1), diff("a.rs", 5))]), "").await;
        r.queue.send(&message("github:1", &sha(1)), Default::default()).await.unwrap();
        assert!(drain(&r).await.0.iter().all(|o| *o == Outcome::Acked));
        assert_eq!(*r.llm.tiers.lock().unwrap(), [Tier::Flex]);
        // Timed by the tier that served it: the offline model serves the tier it is asked for.
        let timed = |r: &Rig, tier: &str| {
            r.worker.metrics.summary_latency_seconds.with_label_values(&[tier]).get_sample_count()
        };
        assert_eq!((timed(&r, "sync"), timed(&r, "flex")), (0, 1));
        let mut r = rig(HashMap::from([(sha(2), diff("b.rs", 5))]), "").await;
        let late =
            SystemClock.now_ms() + 6 * 3600 * 1000 - crate::domain::tier::FLEX_HEADROOM.as_millis() as u64;
        r.worker.clock = crate::clock::ManualClock::new(late + 60_000);
        r.queue.send(&message("github:1", &sha(2)), Default::default()).await.unwrap();
        assert!(drain(&r).await.0.iter().all(|o| *o == Outcome::Acked));
        assert_eq!(*r.llm.tiers.lock().unwrap(), [Tier::Sync]);
    }

    #[tokio::test]
    async fn each_distinct_commit_is_summarized_once_in_as_few_calls_as_fit() {
        let diffs: HashMap<String, String> =
            (0..12).map(|i| (sha(i), diff(&format!("src/f{i}.rs"), 40))).collect();
        let r = rig(diffs, "").await;
        // Every commit twice (a replayed push), and commit 0 also under a second repository.
        for i in 0..12 {
            r.queue.send(&message("github:1", &sha(i)), Default::default()).await.unwrap();
            r.queue.send(&message("github:1", &sha(i)), Default::default()).await.unwrap();
        }
        r.queue.send(&message("github:2", &sha(0)), Default::default()).await.unwrap();
        let (outcomes, report) = drain(&r).await;
        assert_eq!(outcomes.len(), 25);
        assert!(outcomes.iter().all(|o| *o == Outcome::Acked), "{outcomes:?}");
        assert_eq!(report.commits, 13, "12 commits of one repository + the same sha in another");
        assert_eq!(report.done.iter().filter(|d| d.served == Served::Llm).count(), 13);
        let asked = r.llm.commits_asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 13, "each commit in exactly one prompt: {asked:?}");
        let section_tokens: u64 = report.done.iter().map(|d| d.summary.tokens.prompt).sum();
        assert_eq!(section_tokens, report.prompt_tokens, "tokens apportioned exactly");
        let calls = r.llm.calls.load(Ordering::SeqCst);
        let bound = report.prompt_tokens.div_ceil(r.worker.config.batch_tokens as u64) + 2;
        assert!(calls >= 2 && calls <= bound, "{calls} calls, bound {bound}");

        // Redelivered later: answered from the cache, no diff, no model.
        let diff_calls = r.diffs.calls.load(Ordering::SeqCst);
        for i in 0..12 {
            r.queue.send(&message("github:1", &sha(i)), Default::default()).await.unwrap();
        }
        let (outcomes, report) = drain(&r).await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Acked));
        assert_eq!((report.cache_hits, report.llm_calls), (12, 0));
        assert_eq!(r.diffs.calls.load(Ordering::SeqCst), diff_calls);
        assert_eq!(r.llm.calls.load(Ordering::SeqCst), calls);
    }

    #[tokio::test]
    async fn a_repository_over_its_daily_commit_budget_waits_and_an_unsummarized_commit_gives_it_back() {
        let diffs: HashMap<String, String> =
            (0..6).map(|i| (sha(i), diff(&format!("src/f{i}.rs"), 10))).collect();
        let mut r = rig(diffs, "").await;
        r.worker.lease.quota.repo_daily_commits = Some(3);
        let waits = |r: &Rig| r.worker.metrics.waits_total.with_label_values(&["commits", "quota"]).get();
        // A commit whose diff is gone (404, dead-lettered) takes the budget and gives it back.
        r.queue.send(&message("github:1", &sha(99)), Default::default()).await.unwrap();
        let (outcomes, _) = drain(&r).await;
        assert!(matches!(outcomes[..], [Outcome::DeadLettered { .. }]), "{outcomes:?}");

        for i in 0..5 {
            r.queue.send(&message("github:1", &sha(i)), Default::default()).await.unwrap();
        }
        r.queue.send(&message("github:2", &sha(0)), Default::default()).await.unwrap();
        let (outcomes, report) = drain(&r).await;
        let acked = outcomes.iter().filter(|o| **o == Outcome::Acked).count();
        assert_eq!(acked, 4, "3 of the first repository, whole budget, and 1 of another: {outcomes:?}");
        let day = Duration::from_secs(24 * 3600);
        let waited: Vec<_> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Retry { after, reason } if *after > Duration::ZERO && *after <= day => Some(reason),
                _ => None,
            })
            .collect();
        assert_eq!(waited.len(), 2, "{outcomes:?}");
        assert!(waited.iter().all(|r| r.contains("github:1") && r.contains("3 commits")), "{waited:?}");
        assert_eq!((report.llm_calls > 0, waits(&r)), (true, 2));

        // The same commits again: the summarized ones come from the cache and take no budget; the
        // others still wait.
        let diff_calls = r.diffs.calls.load(Ordering::SeqCst);
        for i in 0..5 {
            r.queue.send(&message("github:1", &sha(i)), Default::default()).await.unwrap();
        }
        let (outcomes, report) = drain(&r).await;
        assert_eq!(report.cache_hits, 3);
        assert_eq!(outcomes.iter().filter(|o| matches!(o, Outcome::Retry { .. })).count(), 2);
        assert_eq!((waits(&r), r.diffs.calls.load(Ordering::SeqCst)), (4, diff_calls), "no diff fetched");
    }

    /// Queues commits 0 and 1 and processes them as one batch in the background.
    async fn two_commits_in_one_batch(
        r: &Rig,
    ) -> tokio::task::JoinHandle<(Vec<(MessageId, Outcome)>, BatchReport)> {
        for i in 0..2 {
            r.queue.send(&message("github:1", &sha(i)), Default::default()).await.unwrap();
        }
        let (worker, queue) = (r.worker.clone(), r.queue.clone());
        tokio::spawn(async move {
            let batch = crate::lease::receive_batch(&queue, 100, Duration::from_secs(5)).await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            worker.process_batch(Arc::new(queue), batch, deadline).await
        })
    }

    /// One commit's lock answers only after the lease (600 ms) has passed: the batch's other lock,
    /// taken at once, is renewed meanwhile, so no other worker can take that commit and pay for it twice.
    #[tokio::test]
    async fn one_slow_lock_acquire_does_not_let_the_batchs_other_locks_lapse() {
        let diffs: HashMap<String, String> = (0..2).map(|i| (sha(i), diff("src/a.rs", 5))).collect();
        let mut r = rig(diffs, "").await;
        let inner = Arc::new(MemoryLock::new(Arc::new(SystemClock)));
        let slow = Arc::new(crate::embedded::ScriptedLock::new(inner.clone(), sha(1), true));
        r.worker.lock = slow.clone();
        let run = two_commits_in_one_batch(&r).await;
        tokio::time::sleep(Duration::from_millis(900)).await;
        let first: CommitMessage = serde_json::from_str(&message("github:1", &sha(0))).unwrap();
        let key = format!("lease:{{commit:{}}}", first.key());
        let probe = inner.acquire(&key, Duration::from_secs(5)).await.unwrap();
        assert!(matches!(probe, Acquire::Held { .. }), "the fast commit's lock lapsed: {probe:?}");
        slow.gate.add_permits(1);
        let (outcomes, report) = run.await.unwrap();
        assert!(outcomes.iter().all(|(_, o)| *o == Outcome::Acked), "{outcomes:?}");
        assert_eq!(report.done.len(), 2);
    }

    /// A commit whose lease is lost while the call that carries it (with another commit) is under
    /// way: the answer is paid for, so it is written all the same (a summary is written once).
    #[tokio::test]
    async fn an_answer_in_hand_is_written_though_its_lease_was_lost_mid_call() {
        let diffs: HashMap<String, String> = (0..2).map(|i| (sha(i), diff("src/a.rs", 5))).collect();
        let mut r = rig_answering_in(diffs, "", Duration::from_millis(1_000)).await;
        let inner = Arc::new(MemoryLock::new(Arc::new(SystemClock)));
        let lock = Arc::new(crate::embedded::ScriptedLock::new(inner, sha(1), false));
        r.worker.lock = lock.clone();
        let run = two_commits_in_one_batch(&r).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        lock.refuse_renewals.store(true, Ordering::SeqCst);
        let (_, report) = run.await.unwrap();
        assert_eq!(r.llm.calls.load(Ordering::SeqCst), 1, "one call for both");
        let keys: Vec<(RepoId, Sha)> =
            (0..2).map(|i| ("github:1".parse().unwrap(), sha(i).parse().unwrap())).collect();
        let stored = r.worker.summaries.get_summaries(&keys).await.unwrap();
        assert_eq!(stored.len(), 2, "the lost commit's paid answer was thrown away: {:?}", report.done.len());
    }

    /// Summaries whose first write fails (the store blips): the answer is paid for.
    struct BlipOnce {
        inner: Arc<dyn SummaryStore>,
        failed: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl SummaryStore for BlipOnce {
        async fn get_summaries(&self, keys: &[(RepoId, Sha)]) -> Result<Vec<CommitSummary>, StoreError> {
            self.inner.get_summaries(keys).await
        }
        async fn put_summary(&self, summary: &CommitSummary) -> Result<crate::ports::WriteOnce, StoreError> {
            if !self.failed.swap(true, Ordering::SeqCst) {
                return Err(StoreError::Unavailable("blip".into()));
            }
            self.inner.put_summary(summary).await
        }
        async fn list_summaries(
            &self,
            repo_id: &RepoId,
            limit: usize,
            after: Option<&str>,
        ) -> Result<crate::ports::SummaryPage, StoreError> {
            self.inner.list_summaries(repo_id, limit, after).await
        }
        async fn mark_delivery(
            &self,
            delivery: &str,
            now_ms: u64,
            ttl_secs: u64,
        ) -> Result<bool, StoreError> {
            self.inner.mark_delivery(delivery, now_ms, ttl_secs).await
        }
        async fn delivery_seen(&self, delivery: &str, now_ms: u64) -> Result<bool, StoreError> {
            self.inner.delivery_seen(delivery, now_ms).await
        }
        async fn count_pushed(
            &self,
            scope: &crate::domain::commit::PushScope,
            day: u64,
            commits: i64,
            limit: u64,
        ) -> Result<bool, StoreError> {
            self.inner.count_pushed(scope, day, commits, limit).await
        }
    }

    /// A summary write that fails once is asked again before the paid answer is put off: the
    /// commit is written from the one call and acked, not handed back to be summarized again.
    #[tokio::test]
    async fn a_summary_write_that_fails_once_is_retried_before_the_answer_is_put_off() {
        let mut r = rig(HashMap::from([(sha(0), diff("src/a.rs", 5))]), "").await;
        r.worker.summaries = Arc::new(BlipOnce { inner: r.worker.summaries.clone(), failed: false.into() });
        r.queue.send(&message("github:1", &sha(0)), Default::default()).await.unwrap();
        let (outcomes, _) = drain(&r).await;
        assert_eq!(outcomes, vec![Outcome::Acked]);
        assert_eq!(r.llm.calls.load(Ordering::SeqCst), 1);
        let stored = r
            .worker
            .summaries
            .get_summaries(&[("github:1".parse().unwrap(), sha(0).parse().unwrap())])
            .await
            .unwrap();
        assert_eq!(stored.len(), 1);
    }

    /// In a Lambda invocation the acked deliveries are not deleted one by one: the event source
    /// mapping deletes them when the invocation returns, and until then they stay hidden.
    #[tokio::test]
    async fn in_a_lambda_batch_acked_commits_are_left_for_the_mapping_to_delete() {
        let diffs: HashMap<String, String> = (0..20).map(|i| (sha(i), diff("src/a.rs", 5))).collect();
        let r = rig(diffs, "").await;
        for i in 0..20 {
            r.queue.send(&message("github:1", &sha(i)), Default::default()).await.unwrap();
        }
        let batch = crate::lease::receive_batch(&r.queue, 100, Duration::from_secs(5)).await.unwrap();
        let queue: Arc<dyn QueueConsume> = Arc::new(r.queue.clone());
        let invocation =
            Arc::new(crate::lease::LeasedQueue::for_mapping(queue.clone(), r.worker.heartbeat(queue)));
        let deadline = Instant::now() + Duration::from_secs(30);
        let (outcomes, report) = r.worker.process_batch_in(invocation.clone(), batch, deadline).await;
        assert!(outcomes.iter().all(|(_, o)| *o == Outcome::Acked), "{outcomes:?}");
        assert_eq!(report.done.len(), 20);
        let depth = r.queue.depth().await.unwrap();
        assert_eq!((depth.visible, depth.in_flight), (0, 20), "none deleted, none visible again");
        // Past a whole lease (600 ms), the invocation's heartbeat still keeps them hidden.
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(r.queue.depth().await.unwrap().visible, 0);
    }

    #[tokio::test]
    async fn no_prompt_mixes_two_repositories_and_each_is_still_batched() {
        let (a, b): (Vec<String>, Vec<String>) = ((0..6).map(sha).collect(), (100..106).map(sha).collect());
        let diffs: HashMap<String, String> =
            a.iter().chain(&b).map(|s| (s.clone(), diff("src/a.rs", 5))).collect();
        let r = rig(diffs, "").await;
        for i in 0..6 {
            r.queue.send(&message("github:1", &a[i]), Default::default()).await.unwrap();
            r.queue.send(&message("github:2", &b[i]), Default::default()).await.unwrap();
        }
        let (outcomes, report) = drain(&r).await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Acked), "{outcomes:?}");
        assert_eq!(report.done.len(), 12, "every summary written");
        let prompts = r.llm.prompts.lock().unwrap().clone();
        assert_eq!(prompts.len(), 2, "one call per repository: {prompts:?}");
        for shas in &prompts {
            let from_a = shas.iter().filter(|s| a.contains(s)).count();
            assert!(from_a == 0 || from_a == shas.len(), "a prompt mixes repositories: {shas:?}");
        }
    }

    /// A batch of 100 where one commit adds a 20 MB single-line minified file and one commit's diff
    /// never arrives: the 98 others and the huge one are summarized, the stuck one is handed back alone.
    #[tokio::test]
    async fn a_huge_or_stuck_diff_never_holds_the_rest_of_the_batch() {
        let mut diffs: HashMap<String, String> =
            (0..98).map(|i| (sha(i), diff(&format!("src/f{i}.rs"), 5))).collect();
        let huge = format!(
            "{}diff --git a/web/app.js b/web/app.js\n--- a/web/app.js\n+++ b/web/app.js\n@@ -0,0 +1 @@\n+{}\n",
            diff("src/lib.rs", 3),
            "var a=1;".repeat(2_500_000)
        );
        diffs.insert(sha(98), huge);
        diffs.insert(SLOW_SHA.to_owned(), diff("src/slow.rs", 3));
        let mut r = rig(diffs, "").await;
        r.worker.config.fetch_deadline = Duration::from_millis(500);
        for i in 0..99 {
            r.queue.send(&message("github:1", &sha(i)), Default::default()).await.unwrap();
        }
        r.queue.send(&message("github:1", SLOW_SHA), Default::default()).await.unwrap();
        let started = std::time::Instant::now();
        let (outcomes, report) = drain(&r).await;
        assert!(started.elapsed() < Duration::from_secs(25), "well inside the batch's deadline");
        assert_eq!(outcomes.len(), 100);
        assert_eq!(report.done.len(), 99, "every other commit summarized");
        let retried: Vec<&Outcome> = outcomes.iter().filter(|o| matches!(o, Outcome::Retry { .. })).collect();
        assert_eq!(retried.len(), 1, "{outcomes:?}");
        assert!(format!("{:?}", retried[0]).contains("not fetched within"), "{retried:?}");
        // Counted by reason kind (process-wide, so at least this one).
        assert!(crate::metrics::HANDED_BACK.with_label_values(&["commits", "diff_source"]).get() >= 1);
        let big = report.done.iter().find(|d| d.summary.sha == sha(98).as_str()).unwrap();
        assert!(big.summary.diff_cut, "the long line is cut");
    }

    /// A push of 30 commits whose payload listed 20: the range message brings the other 10 (and only
    /// them) onto the queue, and every one of the 30 is summarized once.
    #[tokio::test]
    async fn an_incomplete_push_is_expanded_and_every_commit_summarized() {
        let diffs: HashMap<String, String> =
            (0..30).map(|i| (sha(i), diff(&format!("src/f{i}.rs"), 3))).collect();
        let r = rig(diffs, "").await;
        let range = PushRange {
            provider: Provider::Gitlab,
            repo_id: "gitlab:7".parse().unwrap(),
            repo: "group/project".into(),
            base: sha(1000),
            head: sha(29).parse().unwrap(),
            listed: (10..30).map(|i| sha(i).parse().unwrap()).collect(),
        };
        let body = serde_json::to_string(&CommitsMessage::Range { range }).unwrap();
        r.queue.send(&body, Default::default()).await.unwrap();
        let gitlab = |s: &str| {
            serde_json::to_string(&CommitMessage {
                provider: Provider::Gitlab,
                repo_id: "gitlab:7".parse().unwrap(),
                repo: "group/project".into(),
                sha: s.parse().unwrap(),
                subject: "listed".into(),
                committed_at_ms: 1,
                escalated: Default::default(),
            })
            .unwrap()
        };
        for i in 10..30 {
            r.queue.send(&gitlab(&sha(i)), Default::default()).await.unwrap();
        }
        let (outcomes, report) = drain(&r).await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Acked), "{outcomes:?}");
        assert_eq!((report.expanded, report.done.len()), (10, 20));
        let (outcomes, report) = drain(&r).await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Acked), "{outcomes:?}");
        assert_eq!((outcomes.len(), report.done.len()), (10, 10), "the unlisted ten, once each");
        assert!(
            crate::lease::receive_batch(&r.queue, 100, Duration::from_millis(50)).await.unwrap().is_empty()
        );
    }

    #[tokio::test]
    async fn a_commit_missing_from_the_answer_is_asked_alone() {
        let diffs: HashMap<String, String> = (0..3).map(|i| (sha(i), diff("src/a.rs", 5))).collect();
        let r = rig(diffs, &sha(1)).await;
        for i in 0..3 {
            r.queue.send(&message("github:1", &sha(i)), Default::default()).await.unwrap();
        }
        let (outcomes, report) = drain(&r).await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Acked), "{outcomes:?}");
        assert_eq!(report.llm_calls, 2, "one batch, one retry alone");
        let asked = r.llm.commits_asked.lock().unwrap().clone();
        assert_eq!(asked.iter().filter(|s| **s == sha(1)).count(), 2);
        assert_eq!(report.done.len(), 3);
    }

    #[tokio::test]
    async fn noise_needs_no_model_and_unknown_commits_go_to_the_dlq() {
        let lock: String = (0..200_000).map(|i| format!("+checksum = \"{i:064x}\"\n")).collect();
        let lockfile = format!(
            "diff --git a/Cargo.lock b/Cargo.lock\n--- a/Cargo.lock\n+++ b/Cargo.lock\n@@ -1 +1,200000 @@\n{lock}"
        );
        assert!(lockfile.len() > 5_000_000);
        let r = rig(HashMap::from([(sha(1), lockfile)]), "").await;
        r.queue.send(&message("github:1", &sha(1)), Default::default()).await.unwrap();
        r.queue.send(&message("github:1", &sha(2)), Default::default()).await.unwrap();
        r.queue.send("{not json", Default::default()).await.unwrap();
        let (outcomes, report) = drain(&r).await;
        assert_eq!(report.llm_calls, 0, "a lockfile-only commit spends no token");
        assert_eq!((report.rule_summaries, report.prompt_tokens), (1, 0));
        assert!(report.done[0].summary.summary.contains("Cargo.lock"));
        let dead = outcomes.iter().filter(|o| matches!(o, Outcome::DeadLettered { .. })).count();
        assert_eq!(dead, 2, "unknown commit (404) and undecodable message: {outcomes:?}");
        assert_eq!(r.queue.depth().await.unwrap(), Default::default());
    }

    /// Summaries whose reads fail while `failing` counts down (a store outage).
    struct Outage {
        inner: EmbeddedSummaries,
        failing: AtomicU64,
    }

    #[async_trait]
    impl SummaryStore for Outage {
        async fn get_summaries(&self, keys: &[(RepoId, Sha)]) -> Result<Vec<CommitSummary>, StoreError> {
            if self.failing.load(Ordering::SeqCst) > 0 {
                self.failing.fetch_sub(1, Ordering::SeqCst);
                return Err(StoreError::Unavailable("throttled".into()));
            }
            self.inner.get_summaries(keys).await
        }
        async fn put_summary(&self, summary: &CommitSummary) -> Result<WriteOnce, StoreError> {
            self.inner.put_summary(summary).await
        }
        async fn list_summaries(
            &self,
            repo_id: &RepoId,
            limit: usize,
            cursor: Option<&str>,
        ) -> Result<crate::ports::SummaryPage, StoreError> {
            self.inner.list_summaries(repo_id, limit, cursor).await
        }
        async fn mark_delivery(&self, delivery: &str, now_ms: u64, ttl: u64) -> Result<bool, StoreError> {
            self.inner.mark_delivery(delivery, now_ms, ttl).await
        }
        async fn delivery_seen(&self, delivery: &str, now_ms: u64) -> Result<bool, StoreError> {
            self.inner.delivery_seen(delivery, now_ms).await
        }
        async fn count_pushed(
            &self,
            scope: &crate::domain::commit::PushScope,
            day: u64,
            commits: i64,
            limit: u64,
        ) -> Result<bool, StoreError> {
            self.inner.count_pushed(scope, day, commits, limit).await
        }
    }

    /// A store outage is a wait, not an attempt: with three deliveries allowed, a commit whose
    /// lookups fail on five deliveries in a row is put off each time, never dead-lettered, and
    /// summarized once (one call) when the store answers again.
    #[tokio::test]
    async fn a_store_outage_longer_than_the_deliveries_never_dead_letters_a_commit() {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let manual = crate::clock::ManualClock::new(1_000_000);
        let clock: SharedClock = manual.clone();
        let settings = crate::embedded::QueueSettings { max_receive_count: 3, ..Default::default() };
        let queue = EmbeddedQueues::open(db.clone(), clock.clone(), settings)
            .await
            .unwrap()
            .queue("commits", "commits-dlq");
        let mut r = rig(HashMap::from([(sha(1), diff("a.rs", 5))]), "").await;
        r.worker.summaries =
            Arc::new(Outage { inner: EmbeddedSummaries::new(db), failing: AtomicU64::new(5) });
        (r.worker.clock, r.worker.send) = (clock, Arc::new(queue.clone()));
        queue.send(&message("github:1", &sha(1)), Default::default()).await.unwrap();
        let mut ends = Vec::new();
        for _ in 0..10 {
            // Whatever was put off is due again.
            manual.advance_ms(3_600_000);
            let batch = crate::lease::receive_batch(&queue, 10, Duration::from_secs(5)).await.unwrap();
            let Some(m) = batch.first() else { break };
            let receives = m.receive_count;
            let deadline = Instant::now() + Duration::from_secs(30);
            let (outcomes, _) = r.worker.process_batch(Arc::new(queue.clone()), batch, deadline).await;
            ends.push((receives, outcomes[0].1.clone()));
        }
        let dlq = queue.dead_letter_queue().depth().await.unwrap();
        assert_eq!(dlq.visible + dlq.in_flight, 0, "{ends:?}");
        assert!(matches!(ends.last(), Some((_, Outcome::Acked))), "{ends:?}");
        assert_eq!(ends.len(), 6, "five waits, then the summary: {ends:?}");
        assert!(
            ends.iter().any(|(_, o)| matches!(o, Outcome::Requeued { .. })),
            "a last delivery requeued: {ends:?}"
        );
        assert_eq!(r.llm.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_commit_leased_elsewhere_goes_back_to_the_queue() {
        let r = rig(HashMap::from([(sha(1), diff("a.rs", 3))]), "").await;
        let key = format!(
            "lease:{{commit:{}}}",
            crate::domain::commit::commit_key(&"github:1".parse().unwrap(), &sha(1).parse().unwrap())
        );
        let Acquire::Acquired(_) = r.worker.lock.acquire(&key, Duration::from_secs(30)).await.unwrap() else {
            panic!("lock")
        };
        r.queue.send(&message("github:1", &sha(1)), Default::default()).await.unwrap();
        let (outcomes, report) = drain(&r).await;
        match &outcomes[0] {
            Outcome::Retry { after, .. } => assert!(*after >= Duration::from_secs(29), "{after:?}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(report.llm_calls, 0);
        let d = r.queue.depth().await.unwrap();
        assert_eq!(d.visible + d.in_flight, 1, "kept, not dropped");
    }
}
