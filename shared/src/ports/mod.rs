//! Ports: the small traits the core talks to, one capability each, with retry intent in their
//! errors. Task and summary stores, large-result objects, queue, lock and cache each have an
//! embedded twin and an AWS adapter held to one contract (`tests/src/contract.rs`), and so does
//! admission (a new task's put and send), whose AWS side is the composition of the store and queue
//! ports ([`PutThenSend`]); the limiter's in-process and Redis implementations are run side by
//! side on `redis-server`; the model clients, diff sources and mapping control are tested each on
//! its own.

mod admission;
mod batches;
mod events;
mod objects;
mod queue;
mod store;

pub use admission::*;
pub use batches::*;
pub use events::*;
pub use objects::*;
pub use queue::*;
pub use store::*;

use crate::domain::{Lane, RepoId, Sha};
use async_trait::async_trait;
use std::time::Duration;

/// Whether an error may go away on its own.
pub trait RetryIntent {
    /// True when the same call may succeed later (timeouts, throttles, an unreachable service).
    fn is_retryable(&self) -> bool;
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
    /// dropped as others enter. [`Self::enter_within`] with no cap.
    async fn enter(&self, key: &str, member: &str, now_ms: u64, until_ms: u64) -> Result<(), CacheError> {
        self.enter_within(key, member, now_ms, until_ms, u64::MAX).await.map(|_| ())
    }
    /// Takes `member` out of the set at `key`.
    async fn leave(&self, key: &str, member: &str) -> Result<(), CacheError>;
    /// Like [`Self::enter`], but only while fewer than `max` members are within their time (one
    /// already in renews its time whatever the count), in one atomic step: whether `member` is in.
    /// What holds a per-tenant concurrency cap under a parallel burst.
    async fn enter_within(
        &self,
        key: &str,
        member: &str,
        now_ms: u64,
        until_ms: u64,
        max: u64,
    ) -> Result<bool, CacheError>;
    /// How many members of the set at `key` are still within their time at `now_ms`.
    async fn count_live(&self, key: &str, now_ms: u64) -> Result<u64, CacheError>;
    /// Applies every charge or none, in one atomic step: `None` when all were applied, or the index
    /// of the first whose limit refused ([`crate::domain::quota::refuses`]), and then none was. The
    /// keys must share one hash tag (one cluster slot).
    async fn reserve(&self, charges: &[Charge]) -> Result<Option<usize>, CacheError>;
    /// One step of a lane's token shares ([`crate::domain::token_share::step`]), atomically, on the
    /// state at `key` (the Redis adapter keeps it under keys that share `key`'s hash tag, so one
    /// cluster slot).
    async fn share(&self, key: &str, ask: &ShareAsk) -> Result<Verdict, CacheError>;
    /// Every group's use of the lane at `key`, as [`Self::share`] keeps it (empty when nothing is
    /// kept); read-only, for the standings the metrics report
    /// ([`crate::domain::token_share::standings`]).
    async fn share_state(&self, key: &str) -> Result<ShareState, CacheError>;
}

/// Each group's stored use of a lane, by group.
pub type ShareState = std::collections::BTreeMap<String, crate::domain::token_share::GroupUse>;

pub use crate::domain::token_share::{ShareAsk, Verdict};

pub use crate::domain::quota::Charge;

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
    /// The provider would not serve the call at the tier asked for (a flex call refused for
    /// capacity, or a model without flex): the same call is made at `sync`, and it is neither a
    /// failure nor an attempt ([`crate::llm::route`]).
    #[error("provider refused the tier: {message}")]
    TierRefused {
        /// What happened.
        message: String,
        /// The model does not offer the tier at all (rather than lacking capacity now).
        unsupported: bool,
    },
}

impl RetryIntent for LlmError {
    fn is_retryable(&self) -> bool {
        !matches!(self, LlmError::Permanent(_))
    }
}

impl LlmError {
    /// The provider's hint of when to come back, for either retryable kind.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::Retryable { retry_after, .. } | LlmError::Throttled { retry_after, .. } => *retry_after,
            LlmError::Permanent(_) | LlmError::TierRefused { .. } => None,
        }
    }

    /// What a client may be told of it (a stream's restart): its kind, never the provider's text.
    pub fn client_reason(&self) -> &'static str {
        match self {
            LlmError::Retryable { .. } => "the provider failed; calling again",
            LlmError::Throttled { .. } => "the provider is rate limiting; calling again",
            LlmError::Permanent(_) => "the provider refused the call",
            LlmError::TierRefused { .. } => "the service tier was refused; calling at the standard tier",
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
    /// Lines the shared buckets up with the provider's `remaining-*`/`reset-*` after an answer to a
    /// call of `lane`, which takes the debt of the calls made unpaced (`crate::limiter::align`).
    async fn align(&self, lane: Lane, limits: &ProviderLimits) -> Result<(), LimiterError>;
    /// The limits in force (the caps lowered to what was learned).
    fn limits(&self) -> LimiterConfig;
}

/// Where a streamed call's text goes as it arrives (the worker's publisher of the run's events).
pub trait DeltaSink: Send + Sync {
    /// The next text of the answer.
    fn delta(&self, text: &str);
    /// What was given so far is void: the call starts again (`reason`, fit for the client: no
    /// provider's text), on this route or the next.
    fn restart(&self, reason: &str);
}

/// A model provider.
#[async_trait]
pub trait LlmClient: Send + Sync {
    /// Runs one completion. Dropping the future aborts the request.
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError>;

    /// Runs one completion, giving `sink` its text as it arrives where the provider streams, and
    /// returns the whole answer as [`LlmClient::complete`] does (its usage included). A layer that
    /// calls again after a failure tells `sink` to restart first. By default the whole text is
    /// given once answered.
    async fn stream(&self, request: &LlmRequest, sink: &dyn DeltaSink) -> Result<LlmResponse, LlmError> {
        let answer = self.complete(request).await?;
        sink.delta(&answer.text);
        Ok(answer)
    }

    /// [`LlmClient::stream`] to `sink` when there is one, else [`LlmClient::complete`]: what a layer
    /// that passes either on calls.
    async fn call(
        &self,
        request: &LlmRequest,
        sink: Option<&dyn DeltaSink>,
    ) -> Result<LlmResponse, LlmError> {
        match sink {
            Some(sink) => self.stream(request, sink).await,
            None => self.complete(request).await,
        }
    }
}

#[async_trait]
impl<T: LlmClient + ?Sized> LlmClient for std::sync::Arc<T> {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        (**self).complete(request).await
    }
    async fn stream(&self, request: &LlmRequest, sink: &dyn DeltaSink) -> Result<LlmResponse, LlmError> {
        (**self).stream(request, sink).await
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
        keys: &[(RepoId, Sha)],
    ) -> Result<Vec<crate::domain::commit::CommitSummary>, StoreError>;
    /// Writes a summary once (`attribute_not_exists`).
    async fn put_summary(
        &self,
        summary: &crate::domain::commit::CommitSummary,
    ) -> Result<WriteOnce, StoreError>;
    /// A repository's summaries, newest first, `limit` per page.
    async fn list_summaries(
        &self,
        repo_id: &RepoId,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<SummaryPage, StoreError>;
    /// Records a webhook delivery (its key, [`crate::idempotency::delivery_key`]) for `ttl_secs`
    /// once its commits are enqueued; false when it was already recorded.
    async fn mark_delivery(&self, delivery: &str, now_ms: u64, ttl_secs: u64) -> Result<bool, StoreError>;
    /// Whether a delivery is recorded (a replay of a delivery whose commits were enqueued).
    async fn delivery_seen(&self, delivery: &str, now_ms: u64) -> Result<bool, StoreError>;
    /// Adds `commits` to the commits pushed in `scope` (a repository, by the owner that signed its
    /// pushes) on UTC day `day` (days since the epoch) if the day's total stays within `limit`, in
    /// one conditional write: whether they were added. A negative `commits` (a give-back) is always
    /// added. The counter outlives its day by a day.
    async fn count_pushed(
        &self,
        scope: &crate::domain::commit::PushScope,
        day: u64,
        commits: i64,
        limit: u64,
    ) -> Result<bool, StoreError>;
    /// Deletes at most `max` expired delivery marks and past days' push counts; how many. DynamoDB's
    /// TTL sweep does this (nothing to do there); the embedded twin does it when asked.
    async fn sweep_expired(&self, _now_ms: u64, _max: usize) -> Result<usize, StoreError> {
        Ok(0)
    }
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
    /// The push's repository name is not the one the host gives its id: a forged or stale pairing,
    /// never summarized ([`crate::commits::sources::Identities`]).
    #[error("repository identity refused: {0}")]
    Refused(String),
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
