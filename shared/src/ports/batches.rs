//! The provider-batch ports: [`BatchApi`], a provider's batch endpoint (OpenAI's Files and Batches,
//! the offline model's twin), and [`BatchStore`], the durable records that own a batch's commits
//! from submission to collection ([`crate::domain::batch`]).

use super::{LlmError, LlmRequest, LlmResponse, StoreError};
use crate::domain::batch::{BatchPhase, BatchRecord, Carrier};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Arc;

/// A batch to submit: its key (kept in the provider batch's metadata, so a lost submission can be
/// found again) and its requests by id.
#[derive(Debug, Clone)]
pub struct BatchSubmission {
    /// [`crate::domain::batch::batch_key`].
    pub key: String,
    /// Each request with its `custom_id`.
    pub calls: Vec<(String, LlmRequest)>,
}

/// How a provider batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEnd {
    /// Every request was processed (each answered or failed on its own).
    Completed,
    /// The provider's window passed: the requests answered so far are in, the rest are not.
    Expired,
    /// Cancelled: the requests answered before are in.
    Cancelled,
    /// The batch as a whole was refused (its input did not validate).
    Failed,
}

/// What a request of an ended batch came to.
#[derive(Debug, Clone)]
pub struct BatchAnswer {
    /// The request's id.
    pub custom_id: String,
    /// Its answer, or why it has none.
    pub outcome: Result<LlmResponse, String>,
}

/// What the provider says of a batch.
#[derive(Debug, Clone)]
pub enum BatchStatus {
    /// Still under way (validating, in progress, finalizing, cancelling: the provider's word).
    Running(String),
    /// Ended: how, and every request's outcome it reports (a request it does not mention was not
    /// answered).
    Ended(BatchEnd, Vec<BatchAnswer>),
}

/// Why a submission failed: whether a batch may have been made is what decides what follows.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// No batch was made (the input was refused, or never reached the provider): the calls may be
    /// made another way now.
    #[error("batch not made: {0}")]
    NotMade(LlmError),
    /// A batch may have been made (the creation went unanswered): only a lookup can tell.
    #[error("batch may have been made: {0}")]
    Unknown(LlmError),
}

/// A provider's batch endpoint, for one route.
#[async_trait]
pub trait BatchApi: Send + Sync {
    /// The route (`provider:model`) it submits to.
    fn route(&self) -> &str;
    /// The id of a batch carrying `key`, of `requests` requests, made by a submission no earlier
    /// than `since_ms` (Unix ms). `None` only when every batch made since then was looked at: a
    /// lookup that could not finish is an error, never a "none".
    async fn find(&self, key: &str, since_ms: u64, requests: usize) -> Result<Option<String>, LlmError>;
    /// Submits the batch; its provider id.
    async fn submit(&self, batch: &BatchSubmission) -> Result<String, SubmitError>;
    /// How the batch is, with its answers once it ended.
    async fn status(&self, id: &str) -> Result<BatchStatus, LlmError>;
    /// Asks the provider to cancel it (it ends `Cancelled` a while later).
    async fn cancel(&self, id: &str) -> Result<(), LlmError>;
}

/// The durable batch records (DynamoDB in AWS, the redb file locally). A commit is *batched* while
/// an unclosed record carries it; its marker is the index a duplicate finds the record by.
#[async_trait]
pub trait BatchStore: Send + Sync {
    /// Writes the record (and a marker per commit, first) unless one with its key exists: whether
    /// it was written.
    async fn create_batch(&self, record: &BatchRecord) -> Result<bool, StoreError>;
    /// Replaces the record if its phase is still `expect`: whether it was replaced.
    async fn update_batch(&self, record: &BatchRecord, expect: BatchPhase) -> Result<bool, StoreError>;
    /// At most `limit` unclosed records, oldest first.
    async fn open_batches(&self, limit: usize) -> Result<Vec<BatchRecord>, StoreError>;
    /// Which of the commit keys (`repo_id:sha`, or a parked run's [`task_marker`]) an unclosed
    /// record carries, each with that record.
    ///
    /// [`task_marker`]: crate::domain::batch::task_marker
    async fn batched(&self, keys: &[String]) -> Result<HashMap<String, Carrier>, StoreError>;
    /// Deletes the record and those of its markers that still name it.
    async fn close_batch(&self, record: &BatchRecord) -> Result<(), StoreError>;
}

/// A provider's batch endpoint and the records of its batches: what a worker hands calls to at
/// tier `batch` (`crate::commits::batches`, `crate::tasks::batches`) and a collector reads them back
/// from (`crate::commits::collect`, `crate::tasks::collect`).
#[derive(Clone)]
pub struct Batching {
    /// The lane's route's batch endpoint.
    pub api: Arc<dyn BatchApi>,
    /// The records.
    pub store: Arc<dyn BatchStore>,
    /// The provider's batch queue limit: most prompt tokens the unended batches may hold
    /// (`LANES_BATCH_QUEUE_TOKENS`; OpenAI's per-model "batch queue limit"). Calls past it are made
    /// now, at flex: a batch never waits on a full queue, and never spends the synchronous budget.
    pub queue_tokens: Option<u64>,
    /// The deployment its batch keys are scoped to (its table), so two deployments sharing a
    /// provider account never adopt each other's batches.
    pub scope: String,
}

impl Batching {
    /// The prompt tokens the provider's batch queue has room for: its limit less what the unended
    /// batches hold; none when the records cannot be read (no batch is made blind).
    pub async fn queue_room(&self) -> u64 {
        let Some(limit) = self.queue_tokens else { return u64::MAX };
        match self.store.open_batches(1000).await {
            Ok(open) => limit.saturating_sub(open.iter().map(BatchRecord::tokens).sum()),
            Err(e) => {
                tracing::warn!(error = %e, "batch records unavailable; calling now");
                0
            }
        }
    }

    /// The id of the batch carrying the record's key, made now if none does. The record just
    /// written is what keeps a key from being submitted twice (only its own collector closes it);
    /// the lookup is a second guard, so one that cannot answer (Anthropic's, while a batch of as
    /// many requests runs) does not stop the submission.
    pub async fn find_or_submit(
        &self,
        record: &BatchRecord,
        submission: &BatchSubmission,
    ) -> Result<String, SubmitError> {
        match self.api.find(&record.key, record.created_at_ms, record.requests()).await {
            Ok(Some(id)) => Ok(id),
            Ok(None) => self.api.submit(submission).await,
            Err(e) => {
                tracing::warn!(error = %e, key = %record.key, "batch lookup unanswered; submitting under the new record");
                self.api.submit(submission).await
            }
        }
    }
}
