//! What the hot cache holds for tasks: each finished record (a completed one answers reads and
//! duplicates; any finished one wakes long-polls) and the hint that a task was cancelled, which
//! the running worker's heartbeat reads. Ingress and the worker both write here; the store stays
//! the truth.

use crate::clock::SharedClock;
use crate::domain::{TaskId, TaskRecord, TaskStatus};
use crate::lease::CancelProbe;
use crate::ports::{Cache, TaskStore};
use std::sync::Arc;
use std::time::Duration;

/// Cache key of a finished task's record. Readers answer from it only when it is `COMPLETED`: that
/// status is final, so the cache can never contradict the store. Any finished record there wakes
/// the task's long-polls, which then read the store (the record's `created_at_ms` tells a
/// leftover of an earlier run of the id from the current one).
pub fn cache_key(task_id: &TaskId) -> String {
    format!("task:{task_id}")
}

/// Cache key of the hint that a task was cancelled (read by the running worker's heartbeat); its
/// value is the cancelled record's fence, so it cannot cancel a later run of the same id.
pub fn cancel_key(task_id: &TaskId) -> String {
    format!("cancel:{task_id}")
}

/// How long cancellation hints and finished records that are not `COMPLETED` live in the cache:
/// longer than any lease or long-poll.
pub const HINT_TTL: Duration = Duration::from_secs(3600);

/// The heartbeat's cancellation check: the cache's hint, or the store when the cache is down.
pub(crate) struct CancelHint {
    pub(crate) cache: Arc<dyn Cache>,
    pub(crate) store: Arc<dyn TaskStore>,
    pub(crate) clock: SharedClock,
}

#[async_trait::async_trait]
impl CancelProbe for CancelHint {
    async fn is_cancelled(&self, task_id: &TaskId, fence: u64) -> bool {
        match self.cache.get(&cancel_key(task_id)).await {
            Ok(hint) => hint.and_then(|h| h.parse::<u64>().ok()).is_some_and(|cancelled| cancelled > fence),
            Err(_) => matches!(
                self.store.get(task_id, self.clock.now_ms()).await,
                Ok(Some(r)) if r.status == TaskStatus::Cancelled && r.fence > fence
            ),
        }
    }
}

/// Writes a finished record under [`cache_key`]: for `completed_ttl` when it is `COMPLETED` (it
/// then answers reads), for [`HINT_TTL`] otherwise (it only wakes long-polls). The worker's finish
/// and the client's cancellation both end a task this way.
pub async fn publish_finished(
    cache: &dyn Cache,
    done: &TaskRecord,
    completed_ttl: Duration,
) -> Result<(), crate::ports::CacheError> {
    let ttl = if done.status == TaskStatus::Completed { completed_ttl } else { HINT_TTL };
    let json =
        serde_json::to_string(done).map_err(|e| crate::ports::CacheError::Unavailable(e.to_string()))?;
    cache.set(&cache_key(&done.task_id), &json, ttl).await
}
