//! Batch plumbing of the SQS-triggered functions: records decoded into deliveries, the deliveries
//! run to outcomes under one heartbeat and the invocation's deadline, and the outcomes turned into
//! the partial-batch response; with the deadline and queue-age readings of a batch.

use crate::commits::worker::CommitsWorker;
use crate::domain::fairness::GROUP_ATTRIBUTE;
use crate::domain::{IdError, Lane, MessageId};
use crate::lease::{self, Outcome};
use crate::ports::{QueueConsume, ReceivedMessage};
use crate::tasks::worker::Worker;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsMessage};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::warn;

/// How long the oldest record of a batch waited in its queue (`now - SentTimestamp`): SQS has no
/// queue attribute for it (`ApproximateAgeOfOldestMessage` is a CloudWatch metric), so each worker
/// reports the age of what it receives (its gauge, on `/metrics` where one is served, and in EMF as
/// `queue_oldest_age_seconds`): a lower bound of the queue's oldest, exact when the queue is
/// drained in order.
pub fn oldest_age_ms(records: &[SqsMessage], now_ms: u64) -> Option<u64> {
    records
        .iter()
        .filter_map(|r| r.attributes.get("SentTimestamp")?.parse::<u64>().ok())
        .map(|sent| now_ms.saturating_sub(sent))
        .max()
}

/// Time left before the invocation deadline. Lambda sends Unix ms; `cargo lambda watch` sends the
/// timeout itself (e.g. `600000`), so a value too small to be a date is taken as a duration.
pub fn remaining_time(deadline_ms: u64, now_ms: u64) -> Duration {
    const YEAR_2001_MS: u64 = 978_307_200_000;
    if deadline_ms < YEAR_2001_MS {
        Duration::from_millis(deadline_ms)
    } else {
        Duration::from_millis(deadline_ms.saturating_sub(now_ms))
    }
}
/// Processes a batch concurrently (at most `concurrency` at a time) within `budget`. Every message's
/// lease starts at receipt, all in one go, also for those waiting for a slot, and one heartbeat
/// renews them all; what is unfinished when the budget runs out is made visible again and reported
/// as a failure, so nothing waits for a dead invocation. What is acked is left for the event
/// source mapping to delete ([`lease::LeasedQueue::for_mapping`]).
pub async fn handle_batch(
    worker: &Worker,
    queue: &Arc<dyn QueueConsume>,
    lane: Lane,
    records: &[SqsMessage],
    budget: Duration,
    concurrency: usize,
) -> SqsBatchResponse {
    let deadline = tokio::time::Instant::now() + budget;
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut set = JoinSet::new();
    let mut outcomes: Vec<(MessageId, Outcome)> = Vec::new();
    let mut messages = Vec::with_capacity(records.len());
    for record in records {
        match received_from_sqs(record) {
            Ok(m) => messages.push(m),
            Err(e) => outcomes.extend(unusable(record, &e, lane.as_str())),
        }
    }
    // The mapping received them with the queue's long visibility: one lease start for the batch
    // (ten a request), then one heartbeat for every delivery, waiting or running.
    let started = lease::start_many(&**queue, &mut messages, worker.config.lease_ttl).await;
    let batch =
        Arc::new(lease::LeasedQueue::for_mapping(queue.clone(), worker.heartbeat(queue.clone(), lane)));
    for (message, start) in messages.into_iter().zip(started) {
        if let Err(crate::ports::QueueError::ReceiptInvalid) = start {
            outcomes.push((message.message_id, Outcome::LeaseLost));
            continue;
        }
        set.spawn(run_one(worker.clone(), batch.clone(), slots.clone(), message, deadline, lane));
    }
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(pair) => outcomes.push(pair),
            Err(e) => warn!(error = %e, "message task panicked; its lease expires and it is redelivered"),
        }
    }
    // A panicked task left no outcome: report every record without one as a failure.
    for record in records {
        if let Some(id) = record.message_id.as_deref().and_then(|id| MessageId::parse(id).ok())
            && !outcomes.iter().any(|(i, _)| *i == id)
        {
            outcomes.push((id, Outcome::LeaseLost));
        }
    }
    batch_response(outcomes.iter().map(|(id, o)| (id.as_str(), o)))
}

/// One delivery of a batch: renewed while it waits for a slot, run by the worker, and put off at
/// once if the invocation's deadline comes first.
async fn run_one(
    worker: Worker,
    batch: Arc<lease::LeasedQueue>,
    slots: Arc<Semaphore>,
    message: ReceivedMessage,
    deadline: tokio::time::Instant,
    lane: Lane,
) -> (MessageId, Outcome) {
    let id = message.message_id.clone();
    let delivery = message.clone();
    let settling = batch.clone();
    let run = async move {
        // Renewed from now on, while it waits for a slot too; the worker's own entry (with its
        // lock and watch) takes this one's place when it runs.
        let lost = tokio_util::sync::CancellationToken::new();
        let _waiting = batch.heartbeat().join(lease::Leased::new(message.receipt.clone(), lost.clone()));
        let _slot = slots.acquire_owned().await;
        if lost.is_cancelled() {
            // The queue refused a renewal while it waited: another delivery has it now.
            return Outcome::LeaseLost;
        }
        worker.process_in(batch, message).await
    };
    match tokio::time::timeout_at(deadline, run).await {
        Ok(outcome) => {
            tracing::info!(message_id = %id, ?outcome, "message done");
            (id, outcome)
        }
        Err(_) => {
            // Stopped after it was settled (while releasing its lock, say): nothing to hand back.
            if let Some(outcome) = settling.settled(&delivery.receipt) {
                return (id, outcome);
            }
            // Not a failure: put off at once (a fresh copy on its last delivery), so the
            // deadline never uses up the message's receives.
            let outcome = lease::retry_later(
                &*settling,
                &delivery,
                Duration::ZERO,
                "invocation deadline",
                lane.as_str(),
            )
            .await;
            (id, outcome)
        }
    }
}

/// Processes a commits batch as one unit within `budget`: the worker hands back at the deadline
/// whatever it has not finished.
pub async fn handle_commit_batch(
    worker: &CommitsWorker,
    queue: &Arc<dyn QueueConsume>,
    records: &[SqsMessage],
    budget: Duration,
) -> SqsBatchResponse {
    let mut outcomes: Vec<(MessageId, Outcome)> = Vec::new();
    let mut messages = Vec::with_capacity(records.len());
    for record in records {
        match received_from_sqs(record) {
            Ok(m) => messages.push(m),
            Err(e) => outcomes.extend(unusable(record, &e, Lane::Commits.as_str())),
        }
    }
    let deadline = tokio::time::Instant::now() + budget;
    // Acked deliveries are left for the mapping to delete: no DeleteMessage for a whole batch. One
    // heartbeat renews the batch's leases and keeps what was acked hidden until then.
    let batch = Arc::new(lease::LeasedQueue::for_mapping(queue.clone(), worker.heartbeat(queue.clone())));
    let (done, report) = worker.process_batch_in(batch.clone(), messages, deadline).await;
    tracing::info!(
        commits = report.commits,
        llm_calls = report.llm_calls,
        cache_hits = report.cache_hits,
        store_hits = report.store_hits,
        prompt_tokens = report.prompt_tokens,
        "commit batch done"
    );
    outcomes.extend(done);
    batch_response(outcomes.iter().map(|(id, o)| (id.as_str(), o)))
}

/// Why an SQS record could not become a [`ReceivedMessage`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// A field SQS always sets is absent.
    #[error("SQS record without {0}")]
    Missing(&'static str),
    /// The record's `messageId` is not one a partial batch response can name.
    #[error("SQS record with an unusable id: {0}")]
    BadId(IdError),
}

/// Converts one record of an `SqsEvent`.
pub fn received_from_sqs(record: &SqsMessage) -> Result<ReceivedMessage, RecordError> {
    let message_id = record.message_id.as_deref().ok_or(RecordError::Missing("messageId"))?;
    let message_id = MessageId::parse(message_id).map_err(RecordError::BadId)?;
    let receipt = record.receipt_handle.clone().ok_or(RecordError::Missing("receiptHandle"))?;
    let receive_count =
        record.attributes.get("ApproximateReceiveCount").and_then(|v| v.parse().ok()).unwrap_or(1);
    let sent_at_ms = record.attributes.get("SentTimestamp").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut attributes: BTreeMap<String, String> = record
        .message_attributes
        .iter()
        .filter_map(|(k, v)| v.string_value.clone().map(|s| (k.clone(), s)))
        .collect();
    // The trace context arrives as a system attribute; the worker reads it with the others.
    if let Some(h) = record.attributes.get(crate::trace::TRACE_HEADER).filter(|h| crate::trace::is_valid(h)) {
        attributes.insert(crate::trace::TRACE_HEADER.to_owned(), h.clone());
    }
    // So is the fairness group, which a requeue or a dead-letter must send on with the message.
    if let Some(g) = record.attributes.get(GROUP_ATTRIBUTE) {
        attributes.insert(GROUP_ATTRIBUTE.to_owned(), g.clone());
    }
    Ok(ReceivedMessage {
        message_id,
        receipt,
        body: record.body.clone().unwrap_or_default(),
        receive_count,
        sent_at_ms,
        attributes,
        leased_for: None, // the mapping received it with the queue's long visibility
        leased_at: None,
    })
}

/// A record the batch handler cannot read (no receipt, say): logged, counted as a hand-back, and
/// reported as a batch item failure so the queue redelivers it (`None` without a message id to name).
pub(super) fn unusable(record: &SqsMessage, e: &RecordError, lane: &str) -> Option<(MessageId, Outcome)> {
    warn!(error = %e, lane, "unusable SQS record");
    let id = MessageId::parse(record.message_id.as_deref()?).ok()?;
    crate::metrics::HANDED_BACK.with_label_values(&[lane, "unusable_record"]).inc();
    Some((id, Outcome::Retry { after: Duration::ZERO, reason: e.to_string() }))
}

/// The partial-batch response: one failure per message that stays in the queue. Never an empty id
/// (Lambda would fail the whole batch).
pub fn batch_response<'a>(outcomes: impl IntoIterator<Item = (&'a str, &'a Outcome)>) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for (id, outcome) in outcomes {
        if outcome.is_batch_item_failure() && !id.is_empty() {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id.to_owned();
            response.batch_item_failures.push(failure);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, SharedClock, SystemClock};
    use crate::config::WorkerConfig;
    use crate::domain::Lane;
    use crate::domain::{TaskMessage, TaskRecord, TaskRequest, TaskStatus};
    use crate::lease::{self, Outcome};
    use crate::llm::OfflineProvider;
    use crate::metrics::Metrics;
    use crate::ports::QueueSend;
    use crate::ports::{QueueConsume, ReceivedMessage};
    use crate::tasks::worker::Worker;
    use crate::wiring::Adapters;
    use aws_lambda_events::event::sqs::SqsMessage;
    use serde_json::json;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    async fn setup(
        latency: Duration,
    ) -> (tempfile::TempDir, Worker, Arc<dyn QueueConsume>, Vec<SqsMessage>, Adapters) {
        let dir = tempfile::tempdir().unwrap();
        let clock: SharedClock = Arc::new(SystemClock);
        let (adapters, queues) =
            crate::wiring::embedded(dir.path(), Default::default(), clock.clone()).await.unwrap();
        for i in 0..3 {
            let req = TaskRequest::from_value(
                json!({"project_id":"p","kind":"explain","prompt":format!("{i}"),"target_files":[]}),
            )
            .unwrap();
            let rec = TaskRecord::pending(req.task_id(None), req, clock.now_ms(), 3600);
            adapters.store.put_pending(&rec, clock.now_ms()).await.unwrap();
            let msg = TaskMessage { task_id: rec.task_id.clone(), lane: rec.lane, kind: rec.request.kind };
            queues[0].send(&serde_json::to_string(&msg).unwrap(), Default::default()).await.unwrap();
        }
        let received = queues[0].receive(10).await.unwrap();
        let records = received
            .iter()
            .map(|m| {
                let mut s = SqsMessage::default();
                s.message_id = Some(m.message_id.to_string());
                s.receipt_handle = Some(m.receipt.clone());
                s.body = Some(m.body.clone());
                s
            })
            .collect();
        let worker = Worker {
            objects: None,
            events: None,
            store: adapters.store.clone(),
            lock: adapters.lock.clone(),
            cache: adapters.cache.clone(),
            llm: Arc::new(OfflineProvider::new(move |_| latency)),
            metrics: Metrics::new(),
            clock,
            config: WorkerConfig {
                lease_ttl: Duration::from_millis(300),
                renew_interval: Duration::from_millis(100),
                ..WorkerConfig::default()
            },
            batching: Default::default(),
        };
        let queue = adapters.consume[0].clone();
        (dir, worker, queue, records, adapters)
    }

    #[tokio::test]
    async fn a_batch_completes_within_its_budget() {
        let (_dir, worker, queue, records, _) = setup(Duration::from_millis(20)).await;
        let resp =
            handle_batch(&worker, &queue, Lane::Interactive, &records, Duration::from_secs(5), 2).await;
        assert!(resp.batch_item_failures.is_empty());
        let depth = queue.depth().await.unwrap();
        assert_eq!((depth.visible, depth.in_flight), (0, 3), "settled, left for the mapping to delete");
        // What the event source mapping then does.
        for r in &records {
            queue.delete(r.receipt_handle.as_deref().unwrap()).await.unwrap();
        }
        assert_eq!(queue.depth().await.unwrap().in_flight, 0);
    }

    /// In an invocation, an acked delivery stays hidden until the invocation returns, and a handed-back
    /// one keeps its delay: the heartbeat stops renewing it even while its worker still holds its
    /// place.
    #[tokio::test]
    async fn an_acked_delivery_stays_hidden_and_a_hand_back_keeps_its_delay() {
        let (_dir, worker, queue, records, _) = setup(Duration::from_millis(0)).await;
        let mut messages: Vec<ReceivedMessage> =
            records.iter().map(|r| received_from_sqs(r).unwrap()).collect();
        lease::start_many(&*queue, &mut messages, worker.config.lease_ttl).await;
        let batch = lease::LeasedQueue::for_mapping(
            queue.clone(),
            worker.heartbeat(queue.clone(), Lane::Interactive),
        );
        let places: Vec<_> = messages
            .iter()
            .map(|m| {
                batch
                    .heartbeat()
                    .join(lease::Leased::new(m.receipt.clone(), tokio_util::sync::CancellationToken::new()))
            })
            .collect();
        let (acked, handed_back) = (&messages[0], &messages[1]);
        assert_eq!(lease::ack(&batch, acked).await, Outcome::Acked);
        assert_eq!(batch.settled(&acked.receipt), Some(Outcome::Acked));
        lease::hand_back(&batch, handed_back, Duration::from_secs(10), "test", "interactive").await;
        assert!(
            matches!(batch.settled(&handed_back.receipt), Some(Outcome::Retry { after, .. }) if after == Duration::from_secs(10)),
            "a deadline after the hand-back must not hand it back again"
        );
        // Twice the lease (300 ms) with every place still held: only the third is renewed as work.
        tokio::time::sleep(Duration::from_millis(600)).await;
        drop(places);
        // The third, no longer renewed, comes back within about a lease; the ack is still hidden
        // (kept), the hand-back too (its 10 s delay, not cut to a lease by a beat).
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        let back = loop {
            let back = queue.receive(10).await.unwrap();
            if !back.is_empty() || std::time::Instant::now() > deadline {
                break back;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            back.iter().map(|m| m.message_id.as_str()).collect::<Vec<_>>(),
            [messages[2].message_id.as_str()]
        );
        let depth = queue.depth().await.unwrap();
        assert_eq!((depth.visible, depth.in_flight), (0, 3), "the ack and the hand-back stay hidden");
    }

    /// Counts what a batch asks of its queue, by kind of request.
    #[derive(Default)]
    struct Asked {
        single: AtomicUsize,
        many: AtomicUsize,
        deletes: AtomicUsize,
    }

    struct Counting(Arc<dyn QueueConsume>, Arc<Asked>);

    #[async_trait::async_trait]
    impl QueueConsume for Counting {
        async fn receive_for(
            &self,
            max: usize,
            visibility: Option<Duration>,
        ) -> Result<Vec<ReceivedMessage>, crate::ports::QueueError> {
            self.0.receive_for(max, visibility).await
        }
        async fn change_visibility(
            &self,
            receipt: &str,
            t: Duration,
        ) -> Result<(), crate::ports::QueueError> {
            self.1.single.fetch_add(1, Ordering::Relaxed);
            self.0.change_visibility(receipt, t).await
        }
        async fn change_visibility_many(
            &self,
            receipts: &[String],
            t: Duration,
        ) -> Vec<Result<(), crate::ports::QueueError>> {
            self.1.many.fetch_add(1, Ordering::Relaxed);
            self.0.change_visibility_many(receipts, t).await
        }
        async fn delete(&self, receipt: &str) -> Result<(), crate::ports::QueueError> {
            self.1.deletes.fetch_add(1, Ordering::Relaxed);
            self.0.delete(receipt).await
        }
        async fn requeue(&self, m: &ReceivedMessage, d: Duration) -> Result<(), crate::ports::QueueError> {
            self.0.requeue(m, d).await
        }
        async fn dead_letter(&self, m: &ReceivedMessage, r: &str) -> Result<(), crate::ports::QueueError> {
            self.0.dead_letter(m, r).await
        }
        async fn depth(&self) -> Result<crate::ports::QueueDepth, crate::ports::QueueError> {
            self.0.depth().await
        }
        fn max_receive_count(&self) -> u32 {
            self.0.max_receive_count()
        }
    }

    /// Three deliveries run one after the other (one slot), each longer than a third of the lease,
    /// so the last waits longer than a whole lease: one lease start and one heartbeat serve them
    /// all (no per-delivery `ChangeMessageVisibility`, no `DeleteMessage`), and none comes back
    /// while it waits or after it is settled.
    #[tokio::test]
    async fn one_lease_start_and_one_heartbeat_serve_the_whole_batch() {
        let (_dir, worker, queue, records, adapters) = setup(Duration::from_millis(200)).await;
        let asked = Arc::new(Asked::default());
        let counting: Arc<dyn QueueConsume> = Arc::new(Counting(queue.clone(), asked.clone()));
        let started = std::time::Instant::now();
        let resp =
            handle_batch(&worker, &counting, Lane::Interactive, &records, Duration::from_secs(5), 1).await;
        let took = started.elapsed();
        assert!(resp.batch_item_failures.is_empty(), "{:?}", resp.batch_item_failures);
        assert!(took > worker.config.lease_ttl, "the batch outlasted a lease ({took:?})");
        let depth = queue.depth().await.unwrap();
        assert_eq!((depth.visible, depth.in_flight), (0, 3), "still hidden when the invocation returns");
        assert_eq!(asked.single.load(Ordering::Relaxed), 0, "no lease start or renewal one by one");
        assert_eq!(asked.deletes.load(Ordering::Relaxed), 0, "deletes left to the mapping");
        // The batch's lease start, then one renewal a beat (every 100 ms) for all of them together.
        let many = asked.many.load(Ordering::Relaxed);
        let beats = (took.as_millis() / 100) as usize;
        assert!((2..=beats + 2).contains(&many), "{many} batch calls in {took:?}");
        for r in &records {
            let msg: TaskMessage = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
            let rec = adapters.store.get(&msg.task_id, SystemClock.now_ms()).await.unwrap().unwrap();
            assert_eq!((rec.status, rec.fence), (TaskStatus::Completed, 1), "claimed once");
        }
    }

    #[tokio::test]
    async fn unfinished_messages_are_handed_back_before_the_deadline() {
        let (_dir, worker, queue, records, adapters) = setup(Duration::from_secs(5)).await;
        let started = std::time::Instant::now();
        let resp =
            handle_batch(&worker, &queue, Lane::Interactive, &records, Duration::from_millis(200), 1).await;
        assert!(started.elapsed() < Duration::from_secs(2), "returned before the deadline");
        assert_eq!(resp.batch_item_failures.len(), 3, "every unfinished message is a batch item failure");
        assert_eq!(queue.depth().await.unwrap().visible, 3, "and visible again at once");
        for r in &records {
            let msg: TaskMessage = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
            let rec = adapters.store.get(&msg.task_id, SystemClock.now_ms()).await.unwrap().unwrap();
            assert_ne!(rec.status, TaskStatus::Completed, "nothing written");
        }
    }
}
