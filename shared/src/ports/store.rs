//! The task store port ([`TaskStore`]): the record's writes, each a transition of the lifecycle
//! table, and what each one came to.

use super::RetryIntent;
use crate::domain::{TaskId, TaskRecord};
use async_trait::async_trait;

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

pub use crate::domain::lifecycle::{Command, Completion, EnqueueMark, UNSENT};

/// Result of a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// Claimed: the record is `PROCESSING` with this fence.
    Claimed(Box<TaskRecord>),
    /// Not claimable (terminal); the current record.
    Terminal(Box<TaskRecord>),
    /// Not claimable: a provider batch owns the run (`PROCESSING`, parked); the current record.
    Parked(Box<TaskRecord>),
    /// No record (never written, deleted, or expired).
    Missing,
}

impl ClaimOutcome {
    /// What a claim the store refused on the live record `live` came to.
    pub fn refused(live: TaskRecord) -> Self {
        if live.waiting().is_some() {
            ClaimOutcome::Parked(Box::new(live))
        } else {
            ClaimOutcome::Terminal(Box::new(live))
        }
    }
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
    async fn get(&self, task_id: &TaskId, now_ms: u64) -> Result<Option<TaskRecord>, StoreError>;
    /// Moves a `PENDING` record's `enqueued_at_ms` from `mark.from_ms` to `mark.to_ms` if it is
    /// still the record with `mark.fence` and still reads `from_ms` (compare-and-set), and sets
    /// its TTL to `ttl_secs` from now (a new message's retention); false if it changed.
    /// Ingress claims a re-send this way before sending, so of concurrent readers one sends, and
    /// marks a message known unsent with [`UNSENT`].
    async fn mark_enqueued(
        &self,
        task_id: &TaskId,
        mark: EnqueueMark,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError>;
    /// Claims the task: `PENDING|PROCESSING -> PROCESSING` unless parked, fence + 1; the TTL becomes
    /// `ttl_secs` from now. Attempts are not claims: see [`TaskStore::note_attempt`].
    async fn claim(&self, task_id: &TaskId, now_ms: u64, ttl_secs: u64) -> Result<ClaimOutcome, StoreError>;
    /// Counts one failed provider attempt of the claim holding `fence` and keeps its reason; the new
    /// count, or `None` when the fence moved on.
    async fn note_attempt(
        &self,
        task_id: &TaskId,
        fence: u64,
        reason: &str,
        now_ms: u64,
    ) -> Result<Option<u32>, StoreError>;
    /// `PENDING|PROCESSING -> CANCELLED`, fence + 1.
    async fn cancel(&self, task_id: &TaskId, now_ms: u64, ttl_secs: u64)
    -> Result<CancelOutcome, StoreError>;
    /// `PENDING|PROCESSING -> FAILED` with `reason` whatever the fence, fence + 1: for a message that
    /// reached its DLQ, where no claim is left to finish it. Only a run submitted no later than
    /// `sent_before_ms` (the message's send time, plus clock skew) is settled: a resubmission after the
    /// message was sent is another run, which that message must not fail. False when the record is
    /// terminal, gone, or newer.
    async fn fail_unfinished(
        &self,
        task_id: &TaskId,
        reason: &str,
        sent_before_ms: u64,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError>;
    /// Final write, conditional on `status = PROCESSING` and `fence = fence`.
    async fn finish(
        &self,
        task_id: &TaskId,
        fence: u64,
        completion: Completion,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<FinishOutcome, StoreError>;
    /// Hands the claim holding `fence` to a provider batch ([`Command::Park`]): `PROCESSING`,
    /// unparked, fence kept, TTL `ttl_secs` from now. False when the fence moved on or it is parked.
    async fn park(
        &self,
        task_id: &TaskId,
        fence: u64,
        parked: crate::domain::Parked,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError>;
    /// Gives a parked run back ([`Command::Unpark`]) so a delivery can claim it: false when the
    /// fence moved on or it is not parked.
    async fn unpark(&self, task_id: &TaskId, fence: u64, now_ms: u64) -> Result<bool, StoreError>;
    /// Saves the text so far of the run holding `fence` ([`Command::Checkpoint`]): `PROCESSING`,
    /// unparked, the fence unchanged. False when the fence moved on (the run is no longer the
    /// task's) or the run ended.
    async fn checkpoint(
        &self,
        task_id: &TaskId,
        fence: u64,
        text: &str,
        now_ms: u64,
    ) -> Result<bool, StoreError>;
    /// Deletes at most `max` records whose TTL has passed; how many it deleted. DynamoDB's own TTL
    /// sweep does this (nothing to do there); the embedded twin does it when asked.
    async fn sweep_expired(&self, _now_ms: u64, _max: usize) -> Result<usize, StoreError> {
        Ok(0)
    }
}
