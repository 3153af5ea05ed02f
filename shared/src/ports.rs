//! Ports: the small traits the core talks to, one capability each, with retry intent in their
//! errors. Task and summary stores, queue, lock and cache each have an embedded twin and an AWS
//! adapter held to one contract (`tests/src/contract.rs`); the limiter's in-process and Redis
//! implementations are run side by side on `redis-server`; the model clients, diff sources and
//! mapping control are tested each on its own.

use crate::domain::{Lane, TaskRecord};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::time::Duration;

/// Whether an error may go away on its own.
pub trait RetryIntent {
    /// True when the same call may succeed later (timeouts, throttles, an unreachable service).
    fn is_retryable(&self) -> bool;
}

// ---------------------------------------------------------------- queue

/// Errors of a queue.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The receipt handle is not the message's current one: the lease was lost.
    #[error("receipt handle is invalid or expired")]
    ReceiptInvalid,
    /// The queue could not be reached or failed; try again.
    #[error("queue unavailable: {0}")]
    Unavailable(String),
    /// The request itself is wrong; retrying will not help.
    #[error("queue rejected the request: {0}")]
    Rejected(String),
}

impl RetryIntent for QueueError {
    fn is_retryable(&self) -> bool {
        matches!(self, QueueError::Unavailable(_))
    }
}

/// Message attribute naming why a message was moved to a DLQ (set by every queue adapter, read by
/// the DLQ sweep and `lanes dlq`).
pub const DEAD_LETTER_REASON: &str = "DeadLetterReason";
/// Message attribute naming the queue a dead-lettered message came from.
pub const DEAD_LETTER_SOURCE: &str = "DeadLetterSourceQueue";

/// A message as received, SQS-shaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    /// Stable id of the message.
    pub message_id: String,
    /// Handle of this delivery; only the newest delivery's handle is valid.
    pub receipt: String,
    /// The body.
    pub body: String,
    /// `ApproximateReceiveCount`, including this delivery.
    pub receive_count: u32,
    /// Unix ms when it was first sent.
    pub sent_at_ms: u64,
    /// Message attributes (lane, kind, enqueue time).
    pub attributes: BTreeMap<String, String>,
    /// The lease this delivery already has: the visibility it was received with, when the receiver
    /// chose one ([`QueueConsume::receive_for`]), or the one a Lambda batch started for all its
    /// deliveries at once (`lease::start_many`); `None` while the queue's default applies, as for
    /// what Lambda's event source mapping delivers. A delivery already in its lease needs no lease
    /// start.
    pub leased_for: Option<Duration>,
    /// When that lease began, as this process saw it: the receive's answer, or the batch's lease
    /// start. A worker that starts a delivery later than one renewal interval after this confirms
    /// the lease before it claims anything on it (`lease::confirm`).
    pub leased_at: Option<tokio::time::Instant>,
}

/// Queue depth as SQS reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepth {
    /// Messages ready to be received.
    pub visible: u64,
    /// Messages received and not yet deleted or visible again.
    pub in_flight: u64,
    /// Age of the oldest message in the queue, in ms.
    pub oldest_age_ms: u64,
}

/// Sending side of a lane queue (ingress, webhook).
#[async_trait]
pub trait QueueSend: Send + Sync {
    /// Sends one message; returns its id.
    async fn send(&self, body: &str, attributes: BTreeMap<String, String>) -> Result<String, QueueError>;
    /// Sends many messages (SQS: 10 a request, failed entries retried); returns the bodies that
    /// could still not be sent.
    async fn send_batch(
        &self,
        messages: &[(String, BTreeMap<String, String>)],
    ) -> Result<Vec<String>, QueueError> {
        let mut unsent = Vec::new();
        for (body, attributes) in messages {
            if let Err(e) = self.send(body, attributes.clone()).await {
                if !e.is_retryable() {
                    return Err(e);
                }
                unsent.push(body.clone());
            }
        }
        Ok(unsent)
    }
}

/// Consuming side of a lane queue (workers, the local poller).
#[async_trait]
pub trait QueueConsume: Send + Sync {
    /// Receives up to `max` visible messages, each becoming invisible for `visibility` (the queue's
    /// default when `None`). Messages received more than `max_receive_count` times are moved to the
    /// DLQ instead. A poller passes its lease TTL, so a poller that dies between receiving and
    /// leasing loses nothing for longer than a lease.
    async fn receive_for(
        &self,
        max: usize,
        visibility: Option<Duration>,
    ) -> Result<Vec<ReceivedMessage>, QueueError>;
    /// Like [`Self::receive_for`], waiting up to `wait` for a message when none is visible, and
    /// answering as soon as one is (SQS long polling, `WaitTimeSeconds`, at most 20 s). An idle
    /// poller uses it instead of asking for the queue's depth in a loop. The default looks again
    /// every 50 ms, which costs nothing on an in-process queue.
    async fn receive_waiting(
        &self,
        max: usize,
        visibility: Option<Duration>,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let got = self.receive_for(max, visibility).await?;
            if !got.is_empty() || tokio::time::Instant::now() >= until {
                return Ok(got);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    /// Receives with the queue's default visibility (what Lambda's event source mapping does).
    async fn receive(&self, max: usize) -> Result<Vec<ReceivedMessage>, QueueError> {
        self.receive_for(max, None).await
    }
    /// Sets the visibility timeout of one delivery, counted from now (`ChangeMessageVisibility`).
    async fn change_visibility(&self, receipt: &str, timeout: Duration) -> Result<(), QueueError>;
    /// Sets the visibility of many deliveries at once, one result per receipt in order. SQS does it
    /// ten a request (`ChangeMessageVisibilityBatch`); the default asks one by one.
    async fn change_visibility_many(
        &self,
        receipts: &[String],
        timeout: Duration,
    ) -> Vec<Result<(), QueueError>> {
        let mut out = Vec::with_capacity(receipts.len());
        for r in receipts {
            out.push(self.change_visibility(r, timeout).await);
        }
        out
    }
    /// Acknowledges (deletes) a delivery.
    async fn delete(&self, receipt: &str) -> Result<(), QueueError>;
    /// Sends a fresh copy of a delivery (receive count 1, visible after `delay`, at most 15 min) and
    /// deletes this one: how a wait on the last delivery avoids the redrive to the DLQ. Waiting is not
    /// failing, so it must not use up receives.
    async fn requeue(&self, message: &ReceivedMessage, delay: Duration) -> Result<(), QueueError>;
    /// Moves a delivery to the DLQ now, recording why (undecodable or out of attempts).
    async fn dead_letter(&self, message: &ReceivedMessage, reason: &str) -> Result<(), QueueError>;
    /// Current depth.
    async fn depth(&self) -> Result<QueueDepth, QueueError>;
    /// The redrive policy's `maxReceiveCount`.
    fn max_receive_count(&self) -> u32;
    /// On a DLQ: starts the queue service's own move of every visible message back to the queue it
    /// came from (SQS's message move task, `StartMessageMoveTask`); returns the task's handle. The
    /// messages travel as they are: their task records must be made runnable first (see
    /// `crate::dlq::redrive_by_move`).
    async fn start_move_back(&self) -> Result<String, QueueError> {
        Err(QueueError::Rejected(
            "this queue is not a DLQ with a source queue to move messages back to".into(),
        ))
    }
    /// On a DLQ: its recent move tasks, newest first (`ListMessageMoveTasks`).
    async fn move_tasks(&self) -> Result<Vec<MoveTask>, QueueError> {
        Ok(Vec::new())
    }
}

/// One move of a DLQ's messages back to their source queue, as `ListMessageMoveTasks` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MoveTask {
    /// The handle (SQS only reports it while the task runs).
    pub handle: Option<String>,
    /// `RUNNING`, `COMPLETED`, `CANCELLING`, `CANCELLED` or `FAILED`.
    pub status: String,
    /// Messages moved so far.
    pub moved: u64,
    /// Messages to move in all, when known.
    pub to_move: Option<u64>,
    /// Why it failed, when it did.
    pub failure_reason: Option<String>,
    /// Unix ms when it started.
    pub started_at_ms: u64,
}

// ---------------------------------------------------------------- store

/// Errors of the durable store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or failed; try again.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A stored item could not be decoded: data corruption, not retryable.
    #[error("stored item is corrupt: {0}")]
    Corrupt(String),
}

impl RetryIntent for StoreError {
    fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// Result of the conditional put of a `PENDING` record.
#[derive(Debug, Clone, PartialEq)]
pub enum PutOutcome {
    /// The record was written (the key was absent, expired, `FAILED` or `CANCELLED`).
    Created,
    /// A live record exists; here it is (DynamoDB's `ReturnValuesOnConditionCheckFailure`).
    Exists(Box<TaskRecord>),
}

pub use crate::domain::lifecycle::{Completion, EnqueueMark, UNSENT};

/// Result of a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// Claimed: the record is `PROCESSING` with this fence.
    Claimed(Box<TaskRecord>),
    /// Not claimable (terminal); the current record.
    Terminal(Box<TaskRecord>),
    /// No record (never written, deleted, or expired).
    Missing,
}

/// Result of the fenced final write.
#[derive(Debug, Clone, PartialEq)]
pub enum FinishOutcome {
    /// Written; the record as the store now holds it (what the hot cache may repeat: a result too
    /// large to store ends `FAILED` here, never `COMPLETED` in the cache).
    Written(Box<TaskRecord>),
    /// The fence moved on (another worker claimed the task) or the record is no longer `PROCESSING`:
    /// nothing was written.
    StaleFence,
}

/// Result of a cancellation.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// The record is now `CANCELLED` (it was `PENDING` or `PROCESSING`); the fence moved on, so a
    /// worker still running it can write nothing.
    Cancelled(Box<TaskRecord>),
    /// Already terminal; the current record.
    Terminal(Box<TaskRecord>),
    /// No live record.
    Missing,
}

/// The durable task store (DynamoDB in AWS, a redb file locally). Every write is one row of
/// [`crate::domain::lifecycle::TRANSITIONS`], carried out atomically; a record past its TTL counts
/// as absent.
#[async_trait]
pub trait TaskStore: Send + Sync {
    /// Writes `record` (status `PENDING`) if the key is absent, expired, `FAILED` or `CANCELLED`; else
    /// returns the existing record. A replaced record keeps its fence. Atomic.
    async fn put_pending(&self, record: &TaskRecord, now_ms: u64) -> Result<PutOutcome, StoreError>;
    /// Reads a live (unexpired) record.
    async fn get(&self, task_id: &str, now_ms: u64) -> Result<Option<TaskRecord>, StoreError>;
    /// Moves a `PENDING` record's `enqueued_at_ms` from `mark.from_ms` to `mark.to_ms` if it is
    /// still the record with `mark.fence` and still reads `from_ms` (compare-and-set), and sets
    /// its TTL to `ttl_secs` from now (a new message's retention); false if it changed.
    /// Ingress claims a re-send this way before sending, so of concurrent readers one sends, and
    /// marks a message known unsent with [`UNSENT`].
    async fn mark_enqueued(
        &self,
        task_id: &str,
        mark: EnqueueMark,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError>;
    /// Claims the task: `PENDING|PROCESSING -> PROCESSING`, fence + 1; the TTL becomes
    /// `ttl_secs` from now. Attempts are not claims: see [`TaskStore::note_attempt`].
    async fn claim(&self, task_id: &str, now_ms: u64, ttl_secs: u64) -> Result<ClaimOutcome, StoreError>;
    /// Counts one failed provider attempt of the claim holding `fence` and keeps its reason; the new
    /// count, or `None` when the fence moved on.
    async fn note_attempt(
        &self,
        task_id: &str,
        fence: u64,
        reason: &str,
        now_ms: u64,
    ) -> Result<Option<u32>, StoreError>;
    /// `PENDING|PROCESSING -> CANCELLED`, fence + 1.
    async fn cancel(&self, task_id: &str, now_ms: u64, ttl_secs: u64) -> Result<CancelOutcome, StoreError>;
    /// `PENDING|PROCESSING -> FAILED` with `reason` whatever the fence, fence + 1: for a message that
    /// reached its DLQ, where no claim is left to finish it. Only a run submitted no later than
    /// `sent_before_ms` (the message's send time, plus clock skew) is settled: a resubmission after the
    /// message was sent is another run, which that message must not fail. False when the record is
    /// terminal, gone, or newer.
    async fn fail_unfinished(
        &self,
        task_id: &str,
        reason: &str,
        sent_before_ms: u64,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError>;
    /// Final write, conditional on `status = PROCESSING` and `fence = fence`.
    async fn finish(
        &self,
        task_id: &str,
        fence: u64,
        completion: Completion,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<FinishOutcome, StoreError>;
}

// ---------------------------------------------------------------- lock

/// Errors of the lease lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock service could not be reached: callers degrade to SQS visibility plus the fence.
    #[error("lock service unavailable: {0}")]
    Unavailable(String),
}

impl RetryIntent for LockError {
    fn is_retryable(&self) -> bool {
        true
    }
}

/// Result of trying to take a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// Ours, with this token.
    Acquired(String),
    /// Someone else holds it for this much longer.
    Held {
        /// Remaining TTL of the holder's lease.
        remaining: Duration,
    },
}

/// A lease lock: `SET NX PX`, compare-then-`PEXPIRE`, compare-then-`DEL`.
#[async_trait]
pub trait LeaseLock: Send + Sync {
    /// Takes the lock if free.
    async fn acquire(&self, key: &str, ttl: Duration) -> Result<Acquire, LockError>;
    /// Extends the lease if `token` still holds it, and takes it again with `token` if no one holds
    /// it (a failover lost the key); false means another token holds it: the lease is lost.
    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LockError>;
    /// Releases the lease if `token` still holds it.
    async fn release(&self, key: &str, token: &str) -> Result<bool, LockError>;
}

// ---------------------------------------------------------------- cache

/// Errors of the hot cache. Always soft: a cache miss is never a failure.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The cache could not be reached.
    #[error("cache unavailable: {0}")]
    Unavailable(String),
}

/// A TTL key-value cache (Redis in AWS, in-process locally).
#[async_trait]
pub trait Cache: Send + Sync {
    /// Reads a live entry.
    async fn get(&self, key: &str) -> Result<Option<String>, CacheError>;
    /// Writes an entry that lives for `ttl`.
    async fn set(&self, key: &str, value: &str, ttl: Duration) -> Result<(), CacheError>;
    /// Adds `by` to the counter at `key` atomically and returns its new value; a new counter starts
    /// at zero and lives for `ttl` (adding never extends it).
    async fn add(&self, key: &str, by: u64, ttl: Duration) -> Result<u64, CacheError>;
    /// Puts `member` in the set at `key` until `until_ms` (Unix ms, the caller's clock; `now_ms` is
    /// its now), replacing its previous time. Members past their time are not counted, and are
    /// dropped as others enter.
    async fn enter(&self, key: &str, member: &str, now_ms: u64, until_ms: u64) -> Result<(), CacheError>;
    /// Takes `member` out of the set at `key`.
    async fn leave(&self, key: &str, member: &str) -> Result<(), CacheError>;
    /// How many members of the set at `key` are still within their time at `now_ms`.
    async fn count_live(&self, key: &str, now_ms: u64) -> Result<u64, CacheError>;
}

// ---------------------------------------------------------------- llm

/// Errors of an LLM provider.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Throttled, timed out, 5xx, connection trouble: retry later.
    #[error("provider temporarily failed: {message}")]
    Retryable {
        /// What happened.
        message: String,
        /// The provider's own hint, when it gave one.
        retry_after: Option<Duration>,
    },
    /// 400/401/403/404 and the like: retrying will not help.
    #[error("provider rejected the request: {0}")]
    Permanent(String),
    /// The provider (429) or our own limiter said "not now": waiting, never a failed attempt.
    #[error("provider throttled: {message}")]
    Throttled {
        /// What happened.
        message: String,
        /// When to come back, when known.
        retry_after: Option<Duration>,
    },
}

impl RetryIntent for LlmError {
    fn is_retryable(&self) -> bool {
        matches!(self, LlmError::Retryable { .. } | LlmError::Throttled { .. })
    }
}

impl LlmError {
    /// The provider's hint of when to come back, for either retryable kind.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::Retryable { retry_after, .. } | LlmError::Throttled { retry_after, .. } => *retry_after,
            LlmError::Permanent(_) => None,
        }
    }
}

pub use crate::domain::model_call::{LlmRequest, LlmResponse, ProviderLimits};

// ---------------------------------------------------------------- limiter

/// Errors of the limiter store.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    /// Redis unreachable: callers proceed unthrottled and count a degraded operation (the provider's
    /// own 429s, retried with backoff, are the backstop).
    #[error("limiter unavailable: {0}")]
    Unavailable(String),
}

pub use crate::domain::limits::{Decision, LimiterConfig};

/// The limiter port: shared by every worker of a deployment.
#[async_trait]
pub trait RateLimiter: Send + Sync {
    /// Tries to take budget for one call of `lane` estimated at `tokens`, reserving it when the
    /// caller would wait at most `reserve_up_to` for it (`crate::limiter::decide`).
    async fn try_acquire(
        &self,
        lane: Lane,
        tokens: u64,
        reserve_up_to: Duration,
    ) -> Result<Decision, LimiterError>;
    /// Reconciles the estimate with the reported usage.
    async fn reconcile(&self, lane: Lane, estimated: u64, actual: u64) -> Result<(), LimiterError>;
    /// Returns an unused reservation: one request and `tokens` (`crate::limiter::give_back`).
    async fn give_back(&self, lane: Lane, tokens: u64) -> Result<(), LimiterError>;
    /// Makes every caller wait `for_` from now (a 429's hint): the cooldown is shared.
    async fn cool_down(&self, for_: Duration) -> Result<(), LimiterError>;
    /// How long the shared cooldown has left, if one is running (a route cooling down is skipped
    /// while a fallback route exists).
    async fn cooling_for(&self) -> Result<Option<Duration>, LimiterError>;
    /// Paces by the limits the provider said, where lower than the configured caps; true when this
    /// process did not know them before (then [`RateLimiter::align`] with the same answer).
    fn learn(&self, limits: &ProviderLimits) -> bool;
    /// Lines the shared buckets up with the provider's `remaining-*`/`reset-*` (`crate::limiter::align`).
    async fn align(&self, limits: &ProviderLimits) -> Result<(), LimiterError>;
    /// The limits in force (the caps lowered to what was learned).
    fn limits(&self) -> LimiterConfig;
}

/// A model provider.
#[async_trait]
pub trait LlmClient: Send + Sync {
    /// Runs one completion. Dropping the future aborts the request.
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError>;
}

#[async_trait]
impl<T: LlmClient + ?Sized> LlmClient for std::sync::Arc<T> {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        (**self).complete(request).await
    }
}

// ---------------------------------------------------------------- commits

/// A page of a repository's summaries, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryPage {
    /// The summaries.
    pub items: Vec<crate::domain::commit::CommitSummary>,
    /// Opaque cursor of the next page, when there is one.
    pub next: Option<String>,
}

/// Whether a summary write took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOnce {
    /// Written now.
    Written,
    /// A summary already existed (written by another worker); it was left as it is.
    Exists,
}

/// Durable, immutable commit summaries and webhook delivery markers (DynamoDB in AWS, redb locally).
#[async_trait]
pub trait SummaryStore: Send + Sync {
    /// Reads summaries by `(repo_id, sha)` (DynamoDB `BatchGetItem`); absent ones are left out.
    async fn get_summaries(
        &self,
        keys: &[(String, String)],
    ) -> Result<Vec<crate::domain::commit::CommitSummary>, StoreError>;
    /// Writes a summary once (`attribute_not_exists`).
    async fn put_summary(
        &self,
        summary: &crate::domain::commit::CommitSummary,
    ) -> Result<WriteOnce, StoreError>;
    /// A repository's summaries, newest first, `limit` per page.
    async fn list_summaries(
        &self,
        repo_id: &str,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<SummaryPage, StoreError>;
    /// Records a webhook delivery id for `ttl_secs` once its commits are enqueued; false when it was
    /// already recorded.
    async fn mark_delivery(&self, delivery: &str, now_ms: u64, ttl_secs: u64) -> Result<bool, StoreError>;
    /// Whether a delivery id is recorded (a replay of a delivery whose commits were enqueued).
    async fn delivery_seen(&self, delivery: &str, now_ms: u64) -> Result<bool, StoreError>;
}

/// Errors fetching a diff.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// Throttled, 5xx, or unreachable: try again later (after `retry_after` when the host said).
    #[error("diff source temporarily failed: {message}")]
    Retryable {
        /// What happened.
        message: String,
        /// The host's own hint.
        retry_after: Option<Duration>,
    },
    /// Not found, forbidden, or not a diff: retrying will not help.
    #[error("diff unavailable: {0}")]
    Permanent(String),
}

impl RetryIntent for DiffError {
    fn is_retryable(&self) -> bool {
        matches!(self, DiffError::Retryable { .. })
    }
}

/// Where a commit's unified diff comes from (GitHub, GitLab, a local repository).
#[async_trait]
pub trait DiffSource: Send + Sync {
    /// The unified diff of `commit` against its first parent (the full tree for a root commit).
    async fn diff(&self, commit: &crate::domain::commit::CommitMessage) -> Result<String, DiffError>;
    /// The commits of a push the payload did not list in full: reachable from `range.head` and not
    /// from `range.base`, oldest first. A source that cannot list them says so (permanent).
    async fn commits_between(
        &self,
        range: &crate::domain::commit::PushRange,
    ) -> Result<Vec<crate::domain::commit::CommitMessage>, DiffError> {
        Err(DiffError::Permanent(format!("{} cannot list the commits of a push", range.provider)))
    }
}

// ---------------------------------------------------------------- event source mappings

/// Errors of the mapping port.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Throttled or unreachable: the next tick tries again.
    #[error("event source mapping service unavailable: {0}")]
    Unavailable(String),
    /// The mapping does not exist or the call is not allowed: fix the configuration.
    #[error("event source mapping call refused: {0}")]
    Refused(String),
}

impl RetryIntent for ControlError {
    fn is_retryable(&self) -> bool {
        matches!(self, ControlError::Unavailable(_))
    }
}

/// An event source mapping's concurrency (Lambda `Get`/`UpdateEventSourceMapping`).
#[async_trait]
pub trait MappingControl: Send + Sync {
    /// The mapping's current `ScalingConfig.MaximumConcurrency` (`None` when unset).
    async fn max_concurrency(&self, mapping: &str) -> Result<Option<u32>, ControlError>;
    /// Sets it.
    async fn set_max_concurrency(&self, mapping: &str, value: u32) -> Result<(), ControlError>;
}
