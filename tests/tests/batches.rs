//! The commits lane at tier `batch` against the emulators of OpenAI's Files and Batch APIs and its
//! chat completions, on the embedded store and queue, on one manual clock (hours pass at once):
//! a batch that completes, one that expires half-done, one that would miss the deadline (cancelled
//! and escalated in time), a crash between submission and record, duplicates while a batch is
//! open, and a request the provider fails alone. Each ends with every commit summarized once, by
//! one answer, before its deadline.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use async_trait::async_trait;
use lanes_core::clock::{Clock, ManualClock, SharedClock};
use lanes_core::commits::batches::Batching;
use lanes_core::commits::collect::{Collected, Collector};
use lanes_core::commits::worker::{BatchReport, CommitsWorker};
use lanes_core::config::{LanePolicy, WorkerConfig};
use lanes_core::domain::commit::{CommitMessage, CommitsMessage, Provider};
use lanes_core::domain::tier::{Tier, TierSetting};
use lanes_core::domain::{Lane, RepoId, Sha};
use lanes_core::llm::{AnthropicBatches, AnthropicClient, OpenAiBatches, OpenAiClient};
use lanes_core::metrics::Metrics;
use lanes_core::ports::{
    BatchApi, BatchStatus, BatchStore, BatchSubmission, DiffError, DiffSource, LlmError, SubmitError,
};
use lanes_core::wiring::Adapters;
use lanes_tests::mock_batches::{BatchTiming, Forgetful, MockBatches};
use lanes_tests::mock_llm::MockLlm;
use std::sync::Arc;
use std::time::Duration;

const HOUR: u64 = 3_600_000;
const MIN: u64 = 60_000;

struct Diffs;

#[async_trait]
impl DiffSource for Diffs {
    async fn diff(&self, c: &CommitMessage) -> Result<String, DiffError> {
        Ok(format!(
            "diff --git a/src/lib.rs b/src/lib.rs\n--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1 +1 @@\n-old\n+fn f_{}() {{}}\n",
            c.sha
        ))
    }
}

/// How the provider's batch endpoint misbehaves, the first time of each.
#[derive(Default)]
struct ApiFaults {
    /// The first submission answers this, without making a batch.
    submit: Option<fn() -> SubmitError>,
    /// The first cancel fails as a 503 would.
    cancel: bool,
    /// Anthropic's Message Batches rather than OpenAI's Batch API.
    anthropic: bool,
    /// Every status read fails as a 503 would.
    status: bool,
}

/// The emulator's client with `ApiFaults`.
struct Flaky {
    inner: Box<dyn BatchApi>,
    faults: std::sync::Mutex<ApiFaults>,
}

#[async_trait]
impl BatchApi for Flaky {
    fn route(&self) -> &str {
        self.inner.route()
    }
    async fn find(&self, key: &str, since_ms: u64, requests: usize) -> Result<Option<String>, LlmError> {
        self.inner.find(key, since_ms, requests).await
    }
    async fn submit(&self, batch: &BatchSubmission) -> Result<String, SubmitError> {
        let fault = self.faults.lock().unwrap().submit.take();
        match fault {
            Some(error) => Err(error()),
            None => self.inner.submit(batch).await,
        }
    }
    async fn status(&self, id: &str) -> Result<BatchStatus, LlmError> {
        if self.faults.lock().unwrap().status {
            return Err(LlmError::Retryable { message: "503".into(), retry_after: None });
        }
        self.inner.status(id).await
    }
    async fn cancel(&self, id: &str) -> Result<(), LlmError> {
        if std::mem::take(&mut self.faults.lock().unwrap().cancel) {
            return Err(LlmError::Retryable { message: "503".into(), retry_after: None });
        }
        self.inner.cancel(id).await
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    adapters: Adapters,
    batches: MockBatches,
    chat: MockLlm,
    worker: CommitsWorker,
    collector: Collector,
    start: u64,
}

async fn rig(timing: BatchTiming, fail_updates: u32) -> Rig {
    rig_with(timing, fail_updates, ApiFaults::default()).await
}

/// [`rig`], on Anthropic's Message Batches when `anthropic`.
async fn rig_on(anthropic: bool, timing: BatchTiming, fail_updates: u32) -> Rig {
    rig_with(timing, fail_updates, ApiFaults { anthropic, ..Default::default() }).await
}

async fn rig_with(timing: BatchTiming, fail_updates: u32, faults: ApiFaults) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let start = 1_800_000_000_000;
    let clock = ManualClock::new(start);
    let shared: SharedClock = clock.clone();
    let (adapters, _) =
        lanes_core::wiring::embedded(dir.path(), Default::default(), shared.clone()).await.unwrap();
    let batches = MockBatches::start(shared.clone(), timing).await.unwrap();
    let chat = MockLlm::start().await.unwrap();
    let llm = Arc::new(OpenAiClient::new(
        &format!("{}/v1", chat.url),
        "gpt-4o-mini",
        None,
        Duration::from_secs(10),
    ));
    let mut lease = WorkerConfig::default();
    lease.lanes[Lane::Commits.index()] = LanePolicy {
        tier: TierSetting::Batch,
        deadline: Some(Duration::from_secs(6 * 3600)),
        ..lease.lanes[2]
    };
    let inner: Box<dyn BatchApi> = if faults.anthropic {
        let base = batches.url.trim_end_matches("/v1");
        let key = lanes_core::secret::Secret::fixed("k");
        let messages = AnthropicClient::new(base, "claude-3-5-haiku-latest", key, Duration::from_secs(10));
        Box::new(AnthropicBatches::new(messages, "anthropic:claude-3-5-haiku-latest".into()))
    } else {
        Box::new(OpenAiBatches::new(
            OpenAiClient::new(&batches.url, "gpt-4o-mini", None, Duration::from_secs(10)),
            "openai:gpt-4o-mini".into(),
        ))
    };
    let api = Flaky { inner, faults: std::sync::Mutex::new(faults) };
    let store: Arc<dyn BatchStore> = Arc::new(Forgetful::new(adapters.batches.clone(), fail_updates));
    let worker = CommitsWorker {
        batching: Some(Batching { api: Arc::new(api), store, queue_tokens: None, scope: "test".into() }),
        ..adapters.commits_worker(llm, Arc::new(Diffs), Metrics::new(), shared, lease)
    };
    let collector = worker.collector().unwrap();
    Rig { _dir: dir, clock, adapters, batches, chat, worker, collector, start }
}

fn commit(repo: u64, i: u32, subject: &str) -> CommitMessage {
    CommitMessage {
        provider: Provider::Github,
        repo_id: RepoId::parse(&format!("github:{repo}")).unwrap(),
        repo: format!("o/r{repo}"),
        sha: Sha::parse(&format!("{:040x}", (repo << 16) + u64::from(i))).unwrap(),
        subject: subject.into(),
        committed_at_ms: 0,
        escalated: None,
    }
}

/// Four repositories, three commits each.
fn commits() -> Vec<CommitMessage> {
    (1..=4).flat_map(|r| (0..3).map(move |i| commit(r, i, &format!("Change {i}")))).collect()
}

impl Rig {
    async fn send(&self, commits: &[CommitMessage]) {
        let messages: Vec<_> = commits
            .iter()
            .map(|c| {
                (serde_json::to_string(&CommitsMessage::Commit(c.clone())).unwrap(), c.send_attributes())
            })
            .collect();
        assert!(self.adapters.send[Lane::Commits.index()].send_batch(&messages).await.unwrap().is_empty());
    }

    /// Runs the worker until the queue shows nothing; what it did, summed.
    async fn drain(&self) -> BatchReport {
        let queue = self.adapters.consume[Lane::Commits.index()].clone();
        let mut total = BatchReport::default();
        loop {
            let batch =
                lanes_core::lease::receive_batch(&*queue, 100, Duration::from_secs(30)).await.unwrap();
            if batch.is_empty() {
                return total;
            }
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            let (_, r) = self.worker.process_batch(queue.clone(), batch, deadline).await;
            total.batched += r.batched;
            total.llm_calls += r.llm_calls;
            total.done.extend(r.done);
        }
    }

    async fn at(&self, ms: u64) -> Collected {
        self.clock.advance_ms((self.start + ms).saturating_sub(self.clock.now_ms()));
        self.collector.tick().await
    }

    /// Every commit's summary, each written by exactly one answer and before the deadline.
    async fn all_summarized_once(&self, commits: &[CommitMessage]) -> Vec<Tier> {
        let keys: Vec<_> = commits.iter().map(|c| (c.repo_id.clone(), c.sha.clone())).collect();
        let found = self.adapters.summaries.get_summaries(&keys).await.unwrap();
        assert_eq!(found.len(), commits.len(), "every commit summarized");
        for s in &found {
            assert!(s.created_at_ms <= self.start + 6 * HOUR, "{} written after its deadline", s.sha);
        }
        let mut answered = self.batches.answered();
        for (sha, n) in self.chat.answered_commits() {
            *answered.entry(sha).or_default() += n;
        }
        for c in commits {
            assert_eq!(answered.get(c.sha.as_str()), Some(&1), "{} answered once", c.sha);
        }
        assert!(self.adapters.batches.open_batches(10).await.unwrap().is_empty(), "every record closed");
        found.iter().map(|s| s.tier).collect()
    }
}

#[tokio::test]
async fn a_batch_completes_and_each_summary_is_written_once_at_half_price() {
    a_batch_completes_and_each_summary_is_written_once_at_half_price_on(false).await
}

#[tokio::test]
async fn a_batch_completes_and_each_summary_is_written_once_at_half_price_on_anthropic() {
    a_batch_completes_and_each_summary_is_written_once_at_half_price_on(true).await
}

async fn a_batch_completes_and_each_summary_is_written_once_at_half_price_on(anthropic: bool) {
    let r = rig_on(anthropic, BatchTiming::default(), 0).await;
    let commits = commits();
    r.send(&commits).await;
    let report = r.drain().await;
    assert_eq!((report.batched, report.llm_calls), (12, 0), "handed to one batch, no call made");
    assert_eq!(r.batches.batches(), 1);
    // Minutes later: four requests, one per repository, still running.
    assert_eq!(r.at(3 * MIN).await.ended, 0);
    let collected = r.at(10 * MIN).await;
    assert_eq!((collected.ended, collected.calls, collected.written, collected.sent_back), (1, 4, 12, 0));
    let tiers = r.all_summarized_once(&commits).await;
    assert!(tiers.iter().all(|t| *t == Tier::Batch));
    let cost = lanes_core::llm::price::prices();
    let s = &r
        .adapters
        .summaries
        .get_summaries(&[(commits[0].repo_id.clone(), commits[0].sha.clone())])
        .await
        .unwrap()[0];
    let (half, full) =
        (cost.cost(&s.model, s.tokens, s.tier).unwrap(), cost.cost(&s.model, s.tokens, Tier::Sync).unwrap());
    assert!((half * 2.0 - full).abs() < 1e-12, "charged half the list price");
}

#[tokio::test]
async fn a_batch_expiring_half_done_has_the_rest_summarized_at_flex_in_time() {
    a_batch_expiring_half_done_has_the_rest_summarized_at_flex_in_time_on(false).await
}

#[tokio::test]
async fn a_batch_expiring_half_done_has_the_rest_summarized_at_flex_in_time_on_anthropic() {
    a_batch_expiring_half_done_has_the_rest_summarized_at_flex_in_time_on(true).await
}

async fn a_batch_expiring_half_done_has_the_rest_summarized_at_flex_in_time_on(anthropic: bool) {
    // The provider's window passes after two of the four requests.
    let timing = BatchTiming {
        per_request: Duration::from_secs(40 * 60),
        window: Duration::from_secs(2 * 3600),
        ..Default::default()
    };
    let r = rig_on(anthropic, timing, 0).await;
    let commits = commits();
    r.send(&commits).await;
    assert_eq!(r.drain().await.batched, 12);
    assert_eq!(r.at(HOUR).await.ended, 0);
    let collected = r.at(2 * HOUR + MIN).await;
    assert_eq!((collected.ended, collected.written, collected.sent_back), (1, 6, 6));
    let report = r.drain().await;
    assert_eq!((report.done.len(), report.batched), (6, 0), "sent back, summarized now, never batched again");
    let tiers = r.all_summarized_once(&commits).await;
    assert_eq!(tiers.iter().filter(|t| **t == Tier::Batch).count(), 6);
    assert_eq!(tiers.iter().filter(|t| **t == Tier::Flex).count(), 6, "{tiers:?}");
}

#[tokio::test]
async fn a_batch_that_would_miss_the_deadline_is_cancelled_and_escalated_in_time() {
    a_batch_that_would_miss_the_deadline_is_cancelled_and_escalated_in_time_on(false).await
}

#[tokio::test]
async fn a_batch_that_would_miss_the_deadline_is_cancelled_and_escalated_in_time_on_anthropic() {
    a_batch_that_would_miss_the_deadline_is_cancelled_and_escalated_in_time_on(true).await
}

async fn a_batch_that_would_miss_the_deadline_is_cancelled_and_escalated_in_time_on(anthropic: bool) {
    // Ten hours a request: it would finish long past the six-hour deadline.
    let timing = BatchTiming { per_request: Duration::from_secs(10 * 3600), ..Default::default() };
    let r = rig_on(anthropic, timing, 0).await;
    let commits = commits();
    r.send(&commits).await;
    assert_eq!(r.drain().await.batched, 12);
    for h in 1..=5 {
        assert_eq!(r.at(h * HOUR).await, Collected { open: 1, ..Default::default() }, "polled at {h} h");
    }
    let cancelled = r.at(6 * HOUR - 27 * MIN).await;
    assert_eq!((cancelled.cancelled, cancelled.sent_back), (1, 0), "cancelled first");
    // Cancelled two minutes later with nothing answered: read, its commits sent on at flex, in
    // time for a slow flex call.
    let collected = r.at(6 * HOUR - 17 * MIN).await;
    assert_eq!((collected.ended, collected.sent_back), (1, 12));
    let report = r.drain().await;
    assert_eq!(report.done.len(), 12);
    let tiers = r.all_summarized_once(&commits).await;
    assert!(tiers.iter().all(|t| *t == Tier::Flex), "{tiers:?}");
}

#[tokio::test]
async fn a_crash_between_submission_and_record_never_submits_twice() {
    a_crash_between_submission_and_record_never_submits_twice_on(false).await
}

#[tokio::test]
async fn a_crash_between_submission_and_record_never_submits_twice_on_anthropic() {
    a_crash_between_submission_and_record_never_submits_twice_on(true).await
}

async fn a_crash_between_submission_and_record_never_submits_twice_on(anthropic: bool) {
    let r = rig_on(anthropic, BatchTiming::default(), 1).await;
    let commits = commits();
    r.send(&commits).await;
    let first = r.drain().await;
    assert_eq!((first.batched, first.llm_calls), (0, 0), "not acked: the id was not recorded");
    assert_eq!(r.batches.batches(), 1);
    // The messages come back inside the grace: a worker could still delete the record, so they
    // wait, once, for its end.
    r.clock.advance_ms(10 * MIN);
    let again = r.drain().await;
    assert_eq!((again.batched, again.llm_calls), (0, 0));
    assert_eq!(r.at(14 * MIN).await.adopted, 0, "still within the grace");
    // Past it the record owns them: they are acked as pending, and nothing is submitted again.
    r.clock.advance_ms(MIN + 1);
    let later = r.drain().await;
    assert_eq!((later.batched, later.llm_calls), (12, 0));
    assert_eq!(r.batches.batches(), 1, "no second submission");
    // The collector finds the batch by its key.
    assert_eq!(r.at(16 * MIN).await.adopted, 1);
    assert_eq!(r.at(40 * MIN).await.written, 12);
    r.all_summarized_once(&commits).await;
}

#[tokio::test]
async fn duplicates_while_a_batch_is_open_are_pending_not_batched_again() {
    duplicates_while_a_batch_is_open_are_pending_not_batched_again_on(false).await
}

#[tokio::test]
async fn duplicates_while_a_batch_is_open_are_pending_not_batched_again_on_anthropic() {
    duplicates_while_a_batch_is_open_are_pending_not_batched_again_on(true).await
}

async fn duplicates_while_a_batch_is_open_are_pending_not_batched_again_on(anthropic: bool) {
    let r = rig_on(anthropic, BatchTiming::default(), 0).await;
    let commits = commits();
    r.send(&commits).await;
    assert_eq!(r.drain().await.batched, 12);
    // A host redelivers the push under a new delivery id, twice.
    r.send(&commits).await;
    r.send(&commits[..4]).await;
    let dup = r.drain().await;
    // 16 deliveries of 12 distinct commits, each acked as pending.
    assert_eq!((dup.batched, dup.llm_calls), (12, 0), "acked as pending");
    // Some of them alone: another packing, another key; the commits' markers still hold.
    r.send(&commits[..4]).await;
    assert_eq!(r.drain().await.batched, 4);
    assert_eq!(r.batches.batches(), 1);
    assert_eq!(r.at(20 * MIN).await.written, 12);
    // After the batch: duplicates are answered from the store.
    r.send(&commits[..2]).await;
    assert_eq!(r.drain().await.done.len(), 2);
    r.all_summarized_once(&commits).await;
}

/// A commit two workers batched at once (a lock that vanished lets both) is carried by two batches.
/// When both end and send it back, its two deliveries can meet in one receive. Neither batch owns
/// it any more, so it is summarized now. Passing over only the first delivery's batch acked both
/// copies as still batched (each found the other batch's marker), and the commit was never
/// summarized.
#[tokio::test]
async fn a_commit_two_batches_sent_back_is_summarized_not_acked_as_still_batched() {
    use lanes_core::domain::commit::Escalation;
    let r = rig(BatchTiming::default(), 0).await;
    let x = commit(1, 0, "Change 0");
    r.send(std::slice::from_ref(&x)).await;
    assert_eq!(r.drain().await.batched, 1);
    let a = r.adapters.batches.open_batches(10).await.unwrap().remove(0);
    // The other worker's batch of the same commit: its marker is the one a lookup finds now.
    let b = lanes_core::domain::batch::BatchRecord { key: format!("{}-other", a.key), ..a.clone() };
    assert!(r.adapters.batches.create_batch(&b).await.unwrap());
    let carrier = r.adapters.batches.batched(&[x.key()]).await.unwrap().remove(&x.key()).unwrap();
    assert_eq!(carrier.batch, b.key, "the later batch's marker names the commit");
    // Both send it back, the first batch's copy first.
    let back = |from: &str| CommitMessage {
        escalated: Some(Escalation { floor: Tier::Flex, enqueued_at_ms: r.start, from: Some(from.into()) }),
        ..x.clone()
    };
    r.send(&[back(&a.key), back(&b.key)]).await;
    let report = r.drain().await;
    assert_eq!((report.batched, report.done.len()), (0, 1), "summarized now, not acked as batched");
    let found = r.adapters.summaries.get_summaries(&[(x.repo_id.clone(), x.sha.clone())]).await.unwrap();
    assert_eq!(found.len(), 1);
}

/// A commit a batch sent back (its floor flex, its deadline counting from its first enqueue long
/// ago) and a plain duplicate of it (another branch's push) in one receive: the group keeps the
/// floor and the first enqueue whichever delivery comes first, so the commit is called now at
/// flex, not batched again as the plain copy alone would be.
#[tokio::test]
async fn a_sent_back_commit_meeting_a_plain_duplicate_keeps_its_floor_and_deadline() {
    use lanes_core::domain::commit::Escalation;
    let r = rig(BatchTiming::default(), 0).await;
    r.clock.advance_ms(5 * HOUR);
    let x = commit(1, 0, "Change 0");
    let back = CommitMessage {
        escalated: Some(Escalation { floor: Tier::Flex, enqueued_at_ms: r.start, from: Some("gone".into()) }),
        ..x.clone()
    };
    r.send(&[x.clone(), back]).await;
    let report = r.drain().await;
    assert_eq!((report.batched, report.done.len()), (0, 1), "called now, not batched again");
    let found = r.adapters.summaries.get_summaries(&[(x.repo_id.clone(), x.sha.clone())]).await.unwrap();
    assert_eq!(found.iter().map(|s| s.tier).collect::<Vec<_>>(), vec![Tier::Flex]);
}

#[tokio::test]
async fn a_request_the_provider_fails_alone_is_summarized_at_the_next_tier() {
    a_request_the_provider_fails_alone_is_summarized_at_the_next_tier_on(false).await
}

#[tokio::test]
async fn a_request_the_provider_fails_alone_is_summarized_at_the_next_tier_on_anthropic() {
    a_request_the_provider_fails_alone_is_summarized_at_the_next_tier_on(true).await
}

async fn a_request_the_provider_fails_alone_is_summarized_at_the_next_tier_on(anthropic: bool) {
    let r = rig_on(anthropic, BatchTiming::default(), 0).await;
    // Chosen now: no diff of this file holds it.
    let marker = format!(
        "refuse-{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    );
    r.batches.fail_requests_containing(&marker);
    let mut commits = commits();
    commits.push(commit(9, 0, &format!("Broken {marker}")));
    r.send(&commits).await;
    assert_eq!(r.drain().await.batched, 13);
    let collected = r.at(20 * MIN).await;
    assert_eq!((collected.written, collected.sent_back), (12, 1));
    assert_eq!(r.drain().await.done.len(), 1);
    let tiers = r.all_summarized_once(&commits).await;
    assert_eq!(tiers.iter().filter(|t| **t == Tier::Flex).count(), 1);
}

#[tokio::test]
async fn calls_past_the_providers_batch_queue_limit_are_made_now_at_flex() {
    let mut r = rig(BatchTiming::default(), 0).await;
    let commits = commits();
    // No room at all: a token is less than any request.
    r.worker.batching.as_mut().unwrap().queue_tokens = Some(1);
    r.send(&commits[..3]).await;
    let full = r.drain().await;
    assert_eq!((full.batched, full.llm_calls, r.batches.batches()), (0, 1, 0), "no room: called now");
    r.worker.batching.as_mut().unwrap().queue_tokens = Some(100_000);
    r.send(&commits[3..]).await;
    let roomy = r.drain().await;
    assert_eq!((roomy.batched, roomy.llm_calls, r.batches.batches()), (9, 0, 1));
    assert_eq!(r.at(20 * MIN).await.written, 9);
    let tiers = r.all_summarized_once(&commits).await;
    assert_eq!(tiers.iter().filter(|t| **t == Tier::Flex).count(), 3);
}

#[tokio::test]
async fn a_submission_lost_before_the_provider_made_it_is_found_missing_and_sent_on() {
    a_submission_lost_before_the_provider_made_it_is_found_missing_and_sent_on_on(false).await
}

#[tokio::test]
async fn a_submission_lost_before_the_provider_made_it_is_found_missing_and_sent_on_on_anthropic() {
    a_submission_lost_before_the_provider_made_it_is_found_missing_and_sent_on_on(true).await
}

async fn a_submission_lost_before_the_provider_made_it_is_found_missing_and_sent_on_on(anthropic: bool) {
    let unanswered =
        || SubmitError::Unknown(LlmError::Retryable { message: "timeout".into(), retry_after: None });
    let r = rig_with(
        BatchTiming::default(),
        0,
        ApiFaults { submit: Some(unanswered), anthropic, ..Default::default() },
    )
    .await;
    let commits = commits();
    r.send(&commits).await;
    let first = r.drain().await;
    assert_eq!(
        (first.batched, first.llm_calls, r.batches.batches()),
        (0, 0, 0),
        "owned by the record, not acked"
    );
    r.clock.advance_ms(10 * MIN);
    assert_eq!(r.drain().await.batched, 0, "back inside the grace: they wait for its end");
    r.clock.advance_ms(5 * MIN);
    assert_eq!(r.drain().await.batched, 12, "back, and found batched");
    // Past the grace: the provider made none, so the commits go on, their deadline kept.
    let looked = r.at(16 * MIN).await;
    assert_eq!((looked.adopted, looked.sent_back, looked.ended), (0, 12, 0));
    assert!(r.adapters.batches.open_batches(10).await.unwrap().is_empty(), "the record is closed");
    let again = r.drain().await;
    assert_eq!((again.batched, r.batches.batches()), (12, 1), "batched anew, once");
    assert_eq!(r.at(30 * MIN).await.written, 12);
    let tiers = r.all_summarized_once(&commits).await;
    assert!(tiers.iter().all(|t| *t == Tier::Batch));
}

#[tokio::test]
async fn a_refused_batch_is_forgotten_and_its_calls_made_now() {
    let refused = || SubmitError::NotMade(LlmError::Permanent("400: invalid file".into()));
    let r =
        rig_with(BatchTiming::default(), 0, ApiFaults { submit: Some(refused), ..Default::default() }).await;
    let commits = commits();
    r.send(&commits).await;
    let report = r.drain().await;
    assert_eq!((report.batched, report.done.len(), r.batches.batches()), (0, 12, 0));
    assert!(r.adapters.batches.open_batches(10).await.unwrap().is_empty(), "no record left");
    let tiers = r.all_summarized_once(&commits).await;
    assert!(tiers.iter().all(|t| *t == Tier::Flex), "{tiers:?}");
}

#[tokio::test]
async fn a_cancel_that_fails_is_asked_again_and_nothing_is_late() {
    let timing = BatchTiming { per_request: Duration::from_secs(10 * 3600), ..Default::default() };
    let r = rig_with(timing, 0, ApiFaults { cancel: true, ..Default::default() }).await;
    let commits = commits();
    r.send(&commits).await;
    assert_eq!(r.drain().await.batched, 12);
    let failed = r.at(6 * HOUR - 27 * MIN).await;
    assert_eq!((failed.cancelled, failed.errors), (0, 1), "the 503 is an error of the tick");
    assert_eq!(r.at(6 * HOUR - 26 * MIN).await.cancelled, 1, "asked again");
    let collected = r.at(6 * HOUR - 17 * MIN).await;
    assert_eq!((collected.ended, collected.sent_back), (1, 12));
    assert_eq!(r.drain().await.done.len(), 12);
    let tiers = r.all_summarized_once(&commits).await;
    assert!(tiers.iter().all(|t| *t == Tier::Flex), "{tiers:?}");
}

#[tokio::test]
async fn a_batch_still_cancelling_at_its_escalation_has_its_commits_sent_on_and_its_end_read_later() {
    let timing = BatchTiming {
        per_request: Duration::from_secs(10 * 3600),
        cancelling: Duration::from_secs(30 * 60),
        ..Default::default()
    };
    let r = rig(timing, 0).await;
    let commits = commits();
    r.send(&commits).await;
    assert_eq!(r.drain().await.batched, 12);
    assert_eq!(r.at(6 * HOUR - 27 * MIN).await.cancelled, 1);
    let escalated = r.at(6 * HOUR - 17 * MIN).await;
    assert_eq!((escalated.ended, escalated.sent_back), (0, 12), "still cancelling: sent on at once");
    assert_eq!(r.drain().await.done.len(), 12);
    // Cancelled at last, with nothing answered: read and closed, nothing sent on twice.
    let ended = r.at(6 * HOUR + 5 * MIN).await;
    assert_eq!((ended.ended, ended.sent_back), (1, 0));
    let tiers = r.all_summarized_once(&commits).await;
    assert!(tiers.iter().all(|t| *t == Tier::Flex), "{tiers:?}");
}

#[tokio::test]
async fn a_provider_that_cannot_say_how_its_batch_is_does_not_hold_the_commits_past_the_deadline() {
    let r = rig_with(BatchTiming::default(), 0, ApiFaults { status: true, ..Default::default() }).await;
    let commits = commits();
    r.send(&commits).await;
    assert_eq!(r.drain().await.batched, 12);
    assert_eq!(r.at(HOUR).await.errors, 1, "the failed read is an error of the tick");
    let escalated = r.at(6 * HOUR - 17 * MIN).await;
    assert_eq!(escalated.sent_back, 12, "sent on at the escalation all the same");
    assert_eq!(r.drain().await.done.len(), 12);
    let keys: Vec<_> = commits.iter().map(|c| (c.repo_id.clone(), c.sha.clone())).collect();
    let found = r.adapters.summaries.get_summaries(&keys).await.unwrap();
    assert_eq!(found.len(), 12);
    assert!(found.iter().all(|s| s.created_at_ms <= r.start + 6 * HOUR));
}
