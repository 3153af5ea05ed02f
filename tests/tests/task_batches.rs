//! Synthesis tasks that opt in with `params.deadline_s`, handed to a provider batch, against the
//! emulators of OpenAI's Batch API and Anthropic's Message Batches (and of chat completions, for
//! the calls made at flex), on the embedded store and queue, on one manual clock: a batch that
//! answers (the task `PROCESSING` at tier `batch` until then, then `COMPLETED` at half price by the
//! parked claim's fenced write), a cancel of a batched task (its provider batch cancelled), a batch
//! that would miss the deadline (the run given back and answered at flex in time, once), a crash
//! after the park and one between submission and record (never submitted twice), a delivery
//! that finds the record another wrote (put off until the record owns the run, never acked before),
//! and a batch's answer counted on its task's day.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::clock::{Clock, ManualClock, SharedClock};
use lanes_core::domain::batch::{BatchPhase, task_batch_key};
use lanes_core::domain::tier::Tier;
use lanes_core::domain::{Lane, Parked, TaskId, TaskMessage, TaskRecord, TaskRequest, TaskStatus};
use lanes_core::lease::Outcome;
use lanes_core::llm::{AnthropicBatches, AnthropicClient, OpenAiBatches, OpenAiClient};
use lanes_core::metrics::Metrics;
use lanes_core::ports::{BatchApi, BatchStore, Batching, ClaimOutcome};
use lanes_core::tasks::collect::TaskCollector;
use lanes_core::tasks::worker::Worker;
use lanes_core::wiring::Adapters;
use lanes_tests::mock_batches::{BatchTiming, Forgetful, MockBatches};
use lanes_tests::mock_llm::MockLlm;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

const MIN: u64 = 60_000;
/// A claimed record's life, as the worker's (longer than any deadline).
const TTL: u64 = 15 * 86_400;

struct Rig {
    _dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    adapters: Adapters,
    batches: MockBatches,
    chat: MockLlm,
    worker: Worker,
    collector: TaskCollector,
    start: u64,
    /// The worker's batch records, in front of which lookups can be made to miss.
    forgetful: Arc<Forgetful>,
}

async fn rig(anthropic: bool, timing: BatchTiming, fail_updates: u32) -> Rig {
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
    let api: Arc<dyn BatchApi> = if anthropic {
        let base = batches.url.trim_end_matches("/v1");
        let key = lanes_core::secret::Secret::fixed("k");
        let messages = AnthropicClient::new(base, "claude-3-5-haiku-latest", key, Duration::from_secs(10));
        Arc::new(AnthropicBatches::new(messages, "anthropic:claude-3-5-haiku-latest".into()))
    } else {
        Arc::new(OpenAiBatches::new(
            OpenAiClient::new(&batches.url, "gpt-4o-mini", None, Duration::from_secs(10)),
            "openai:gpt-4o-mini".into(),
        ))
    };
    let forgetful = Arc::new(Forgetful::new(adapters.batches.clone(), fail_updates));
    let store: Arc<dyn BatchStore> = forgetful.clone();
    let batching = Batching { api, store, queue_tokens: None, scope: "test".into() };
    let worker = Worker {
        batching: Some(batching.clone()),
        ..adapters.task_worker(llm, Metrics::new(), shared, Default::default())
    };
    let send = adapters.send[Lane::Synthesis.index()].clone();
    let collector = TaskCollector { worker: worker.clone(), batching, send };
    Rig { _dir: dir, clock, adapters, batches, chat, worker, collector, start, forgetful }
}

impl Rig {
    /// Accepts a synthesis task with `deadline_s` and sends its message.
    async fn submit(&self, deadline_s: u64) -> TaskId {
        let request = TaskRequest::from_value(serde_json::json!({
            "project_id": "p", "kind": "scaffold", "prompt": "a CLI that counts lines",
            "target_files": ["src/main.rs"], "params": {"deadline_s": deadline_s},
        }))
        .unwrap();
        let record = TaskRecord::pending(request.task_id(None), request, self.clock.now_ms(), 30 * 86_400);
        self.adapters.store.put_pending(&record, self.clock.now_ms()).await.unwrap();
        self.resend(&record.task_id).await;
        record.task_id
    }

    async fn resend(&self, id: &TaskId) {
        let m = TaskMessage {
            task_id: id.clone(),
            lane: Lane::Synthesis,
            kind: lanes_core::domain::Kind::Scaffold,
        };
        let queue = &self.adapters.send[Lane::Synthesis.index()];
        queue.send(&serde_json::to_string(&m).unwrap(), Default::default()).await.unwrap();
    }

    /// Runs the worker over what the queue shows now; the outcomes.
    async fn drain(&self) -> Vec<Outcome> {
        let queue = self.adapters.consume[Lane::Synthesis.index()].clone();
        let mut outcomes = Vec::new();
        for m in lanes_core::lease::receive_batch(&*queue, 10, Duration::from_secs(30)).await.unwrap() {
            outcomes.push(self.worker.process(queue.clone(), m).await);
        }
        outcomes
    }

    /// Runs the worker, whose one delivery is put off (its message comes back later).
    async fn drain_put_off(&self, why: &str) {
        let outcomes = self.drain().await;
        assert!(
            matches!(outcomes[..], [Outcome::Retry { .. } | Outcome::Requeued { .. }]),
            "{why}: {outcomes:?}"
        );
    }

    /// Runs the worker, whose delivery is acked unrun because the batch record owns the run; the
    /// collector adopts the batch at `adopted_at` and writes its answer at `written_at` (ms from the
    /// start): one submission, no direct call.
    async fn acked_for_the_batch(&self, id: &TaskId, adopted_at: u64, written_at: u64) {
        assert_eq!(self.drain().await, [Outcome::Acked]);
        assert_eq!(self.batches.batches(), 1, "no second submission");
        assert_eq!(self.at(adopted_at).await.adopted, 1);
        assert_eq!(self.at(written_at).await.written, 1);
        assert_eq!(self.record(id).await.status, TaskStatus::Completed);
        assert_eq!(self.chat.usage().served, 0);
    }

    async fn at(&self, ms: u64) -> lanes_core::commits::collect::Collected {
        self.clock.advance_ms((self.start + ms).saturating_sub(self.clock.now_ms()));
        self.collector.tick().await
    }

    async fn record(&self, id: &TaskId) -> TaskRecord {
        self.adapters.store.get(id, self.clock.now_ms()).await.unwrap().unwrap()
    }
}

#[tokio::test]
async fn an_opted_in_task_waits_at_tier_batch_then_completes_at_half_price() {
    for anthropic in [false, true] {
        let r = rig(anthropic, BatchTiming::default(), 0).await;
        let id = r.submit(2 * 3600).await;
        assert_eq!(r.drain().await, [Outcome::Acked], "acked once the batch owns it");
        let view = r.record(&id).await.view();
        assert_eq!((view.status, view.tier), (TaskStatus::Processing, Some(Tier::Batch)));
        assert_eq!(view.expected_by_ms, Some(r.start + 2 * 3600 * 1000));
        assert_eq!((r.batches.batches(), r.chat.usage().served), (1, 0), "one batch, no call");
        // A duplicate delivery finds the run parked and its record, and is acked unrun.
        r.resend(&id).await;
        assert_eq!(r.drain().await, [Outcome::Acked]);
        assert_eq!(r.batches.batches(), 1);
        assert_eq!(r.at(MIN / 2).await.written, 0, "still running");
        let collected = r.at(5 * MIN).await;
        assert_eq!((collected.written, collected.ended), (1, 1), "{collected:?}");
        let done = r.record(&id).await;
        let result = done.result.clone().unwrap();
        assert_eq!((done.status, result.tier, done.view().tier), (TaskStatus::Completed, Tier::Batch, None));
        let prices = lanes_core::llm::price::prices();
        let model = result.model.clone();
        if let (Some(paid), Some(list)) = (result.cost_usd, prices.cost(&model, result.tokens, Tier::Sync)) {
            assert!((paid - list / 2.0).abs() < 1e-12, "{paid} against {list} on {model}");
        } else {
            panic!("{model} has a price");
        }
        assert!(r.adapters.batches.open_batches(10).await.unwrap().is_empty(), "record closed");
        assert_eq!(r.chat.usage().served, 0);
    }
}

#[tokio::test]
async fn a_batched_task_cancelled_by_its_client_has_its_provider_batch_cancelled() {
    for anthropic in [false, true] {
        let timing = BatchTiming { per_request: Duration::from_secs(3600), ..Default::default() };
        let r = rig(anthropic, timing, 0).await;
        let id = r.submit(4 * 3600).await;
        assert_eq!(r.drain().await, [Outcome::Acked]);
        let parked = r.record(&id).await;
        let cancelled = r.adapters.store.cancel(&id, r.clock.now_ms(), 3600).await.unwrap();
        assert!(matches!(cancelled, lanes_core::ports::CancelOutcome::Cancelled(_)), "{cancelled:?}");
        let collected = r.at(2 * MIN).await;
        assert_eq!((collected.cancelled, collected.ended, collected.written), (1, 1, 0), "{collected:?}");
        assert!(r.adapters.batches.open_batches(10).await.unwrap().is_empty());
        // The batch ends cancelled at the provider; nothing writes over the cancellation.
        r.at(10 * MIN).await;
        let after = r.record(&id).await;
        assert_eq!(
            (after.status, after.fence > parked.fence, after.result),
            (TaskStatus::Cancelled, true, None)
        );
    }
}

#[tokio::test]
async fn a_batch_that_would_miss_the_deadline_gives_the_run_back_to_be_answered_at_flex_in_time() {
    for anthropic in [false, true] {
        let timing = BatchTiming { per_request: Duration::from_secs(10 * 3600), ..Default::default() };
        let r = rig(anthropic, timing, 0).await;
        let deadline = 2 * 60 * MIN;
        let id = r.submit(deadline / 1000).await;
        assert_eq!(r.drain().await, [Outcome::Acked]);
        assert_eq!(r.at(60 * MIN).await.sent_back, 0);
        let cancelled = r.at(deadline - 27 * MIN).await;
        assert_eq!((cancelled.cancelled, cancelled.sent_back), (1, 0), "cancelled first");
        let escalated = r.at(deadline - 17 * MIN).await;
        assert_eq!(escalated.sent_back, 1, "{escalated:?}");
        let back = r.record(&id).await;
        assert_eq!((back.status, back.view().tier), (TaskStatus::Processing, None), "given back");
        assert_eq!(r.drain().await, [Outcome::Acked]);
        let done = r.record(&id).await;
        assert_eq!(
            (done.status, done.result.as_ref().map(|x| x.tier)),
            (TaskStatus::Completed, Some(Tier::Flex))
        );
        assert!(done.finished_at_ms.unwrap() <= r.start + deadline);
        assert_eq!(r.chat.usage().served, 1, "answered once");
        // The cancelled batch's end is read and its record closed; the answer stays.
        r.at(deadline).await;
        assert!(r.adapters.batches.open_batches(10).await.unwrap().is_empty());
        assert_eq!(r.record(&id).await.result, done.result);
    }
}

#[tokio::test]
async fn a_crash_after_the_park_carries_on_under_the_same_fence() {
    let r = rig(false, BatchTiming::default(), 0).await;
    let id = r.submit(2 * 3600).await;
    // A worker claimed the run and parked it, then died before writing the batch record.
    let now = r.clock.now_ms();
    let ClaimOutcome::Claimed(claimed) = r.adapters.store.claim(&id, now, TTL).await.unwrap() else {
        panic!()
    };
    let key = task_batch_key("test", &id, claimed.fence);
    let parked = Parked { batch: key.clone(), due_ms: r.start + 2 * 3600 * 1000 };
    assert!(r.adapters.store.park(&id, claimed.fence, parked, now, TTL).await.unwrap());
    // Its message comes back: the claim finds the run parked, no record owning it, and carries on.
    r.clock.advance_ms(MIN);
    assert_eq!(r.drain().await, [Outcome::Acked]);
    assert_eq!(r.batches.batches(), 1);
    let open = r.adapters.batches.open_batches(10).await.unwrap();
    assert_eq!((open.len(), open[0].key.as_str(), open[0].phase), (1, key.as_str(), BatchPhase::Open));
    assert_eq!(r.at(10 * MIN).await.written, 1);
    assert_eq!(r.record(&id).await.fence, claimed.fence, "the parked claim's fence wrote it");
}

#[tokio::test]
async fn a_crash_between_submission_and_record_never_submits_twice() {
    for anthropic in [false, true] {
        let r = rig(anthropic, BatchTiming::default(), 1).await;
        let id = r.submit(2 * 3600).await;
        r.drain_put_off("the record is written and its batch id is not").await;
        assert_eq!(r.batches.batches(), 1);
        // The message comes back inside the grace: a worker could still give the run back, so it
        // waits for the grace's end.
        r.clock.advance_ms(10 * MIN);
        r.drain_put_off("within the grace").await;
        assert_eq!(r.at(14 * MIN).await.adopted, 0, "still within the grace");
        // Past it the record owns the run: acked unrun, nothing submitted again.
        r.clock.advance_ms(MIN + 1);
        r.acked_for_the_batch(&id, 16 * MIN, 40 * MIN).await;
    }
}

/// A delivery whose lookup missed the run's record (another delivery wrote it just after) finds it
/// when it writes its own: that record may still be its worker's, submitting, so the delivery is
/// put off rather than acked, and acked only once the record owns the run.
#[tokio::test]
async fn a_delivery_that_finds_the_record_written_by_another_waits_until_it_owns_the_run() {
    let r = rig(false, BatchTiming::default(), 1).await;
    let id = r.submit(2 * 3600).await;
    // The batch is made and its id not recorded: the record stays `Submitting`.
    r.drain_put_off("the record is written and its batch id is not").await;
    r.clock.advance_ms(10 * MIN);
    r.forgetful.blind.store(1, Ordering::SeqCst);
    r.drain_put_off("the record found on writing is another's, maybe still submitting").await;
    assert_eq!(r.forgetful.blind.load(Ordering::SeqCst), 0, "the lookup missed the record");
    // It comes back once the grace has passed, when the record owns the run: acked, adopted,
    // answered once.
    r.clock.advance_ms(15 * MIN);
    r.acked_for_the_batch(&id, 26 * MIN, 50 * MIN).await;
}

#[tokio::test]
async fn a_parked_run_is_not_taken_for_an_earlier_runs_batch_still_open() {
    let r = rig(false, BatchTiming { per_request: Duration::from_secs(3600), ..Default::default() }, 0).await;
    let id = r.submit(2 * 3600).await;
    assert_eq!(r.drain().await, [Outcome::Acked]);
    // Cancelled and submitted again: the first run's batch record is open until the next tick.
    r.adapters.store.cancel(&id, r.clock.now_ms(), 3600).await.unwrap();
    let again = r.record(&id).await;
    let resubmitted = TaskRecord::pending(id.clone(), again.request.clone(), r.clock.now_ms(), 30 * 86_400);
    r.adapters.store.put_pending(&resubmitted, r.clock.now_ms()).await.unwrap();
    // The new run is claimed and parked, and its worker dies before writing its record.
    let now = r.clock.now_ms();
    let ClaimOutcome::Claimed(claimed) = r.adapters.store.claim(&id, now, TTL).await.unwrap() else {
        panic!()
    };
    let key = task_batch_key("test", &id, claimed.fence);
    let parked = Parked { batch: key.clone(), due_ms: now + 2 * 3600 * 1000 };
    assert!(r.adapters.store.park(&id, claimed.fence, parked, now, TTL).await.unwrap());
    // Its message comes back: the task's marker still names the first run's batch, which does
    // not own this run, so the delivery writes this run's record and submits it.
    r.resend(&id).await;
    assert_eq!(r.drain().await, [Outcome::Acked]);
    assert_eq!(r.batches.batches(), 2);
    let collected = r.at(2 * MIN).await;
    assert_eq!((collected.cancelled, collected.ended), (1, 1), "the first run's batch: {collected:?}");
    r.batches.set_timing(BatchTiming::default());
    let done = r.at(90 * MIN).await;
    assert_eq!(done.written, 1, "{done:?}");
    assert_eq!(r.record(&id).await.status, TaskStatus::Completed);
}

/// A batch's answer counts on its task's day as a direct call's does: the provider billed it.
#[tokio::test]
async fn a_batch_answer_counts_on_its_tasks_day() {
    use lanes_core::config::QuotaConfig;
    use lanes_core::domain::quota::{Cost, Limits};
    let mut r = rig(false, BatchTiming::default(), 0).await;
    let day = 1_000_000;
    let quota = QuotaConfig {
        project: Limits { daily_tokens: Some(day), ..Default::default() },
        ..Default::default()
    };
    r.worker.config.quota = quota;
    r.collector.worker.config.quota = quota;
    let id = r.submit(2 * 3600).await;
    assert_eq!(r.drain().await, [Outcome::Acked]);
    assert_eq!(r.at(5 * MIN).await.written, 1);
    let used = r.record(&id).await.result.unwrap().tokens.reported().unwrap();
    assert!(used > 0);
    let scopes = lanes_core::quota::scopes(None, "p");
    let probe = |tokens: u64, nonce: &'static str| {
        let (cache, scopes, now) = (r.adapters.cache.clone(), scopes.clone(), r.clock.now_ms());
        async move {
            let cost = Cost { tokens, usd_micros: 0 };
            lanes_core::quota::hold(&*cache, &quota, &scopes, cost, nonce, now).await.unwrap().is_ok()
        }
    };
    assert!(!probe(day - used + 1, "over").await, "the answer's {used} tokens count on the day");
    assert!(probe(day - used, "fits").await);
}
