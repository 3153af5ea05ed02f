//! Running work per lane, as the workers themselves report it, for the concurrency controller.
//!
//! Why not the queue's in-flight count: a commits invocation holds up to 100 messages, and a message
//! handed back with a long backoff is in flight but idle, so in-flight over-counts running work by up
//! to two orders of magnitude, and the controller would starve the lanes that have backlog. What
//! `MaximumConcurrency` bounds is invocations, so that is what is counted: each worker invocation
//! enters a per-lane set in the cache under its own id, with a lease ending at its deadline, and
//! leaves it when it returns. A crashed invocation stops counting when its lease ends, so nothing
//! has to clean up after it. When the cache cannot be read the controller falls back to in-flight.

use crate::clock::SharedClock;
use crate::domain::Lane;
use crate::ports::{Cache, CacheError};
use std::sync::Arc;
use std::time::Duration;

/// How long past its deadline an invocation still counts: Lambda's own shutdown takes a moment, and
/// counting a finished invocation a little longer errs on the side of the budget.
const GRACE: Duration = Duration::from_secs(5);

fn key(lane: Lane) -> String {
    format!("running:{lane}")
}

/// The per-lane registry of running invocations, over the shared cache.
#[derive(Clone)]
pub struct RunningWork {
    cache: Arc<dyn Cache>,
    clock: SharedClock,
}

/// One registered invocation; hand it back to [`RunningWork::leave`].
#[derive(Debug)]
pub struct Entry {
    lane: Lane,
    id: String,
}

impl RunningWork {
    /// A registry over `cache`, timed by `clock`.
    pub fn new(cache: Arc<dyn Cache>, clock: SharedClock) -> Self {
        Self { cache, clock }
    }

    /// Registers one invocation of `lane` that ends by `deadline_ms` (Unix ms). A cache failure is
    /// logged and returns `None`: the work runs anyway, and the controller falls back to in-flight.
    pub async fn enter(&self, lane: Lane, deadline_ms: u64) -> Option<Entry> {
        let id = uuid::Uuid::new_v4().to_string();
        let now = self.clock.now_ms();
        let until = deadline_ms.max(now).saturating_add(GRACE.as_millis() as u64);
        match self.cache.enter(&key(lane), &id, now, until).await {
            Ok(()) => Some(Entry { lane, id }),
            Err(e) => {
                tracing::warn!(lane = %lane, error = %e, "running work not registered (the controller falls back to in-flight)");
                None
            }
        }
    }

    /// Unregisters an invocation; on failure its lease ends it.
    pub async fn leave(&self, entry: Entry) {
        if let Err(e) = self.cache.leave(&key(entry.lane), &entry.id).await {
            tracing::warn!(lane = %entry.lane, error = %e, "running work not unregistered (its lease ends it)");
        }
    }

    /// Invocations of `lane` running now.
    pub async fn count(&self, lane: Lane) -> Result<u64, CacheError> {
        self.cache.count_live(&key(lane), self.clock.now_ms()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::embedded::MemoryCache;

    #[tokio::test]
    async fn invocations_count_until_they_leave_or_their_lease_ends() {
        let clock = ManualClock::new(1_000_000);
        let running = RunningWork::new(Arc::new(MemoryCache::new(clock.clone())), clock.clone());
        let a = running.enter(Lane::Commits, 1_000_000 + 30_000).await.unwrap();
        let _crashed = running.enter(Lane::Commits, 1_000_000 + 10_000).await.unwrap();
        running.enter(Lane::Interactive, 1_000_000 + 30_000).await.unwrap();
        assert_eq!(running.count(Lane::Commits).await.unwrap(), 2);
        running.leave(a).await;
        assert_eq!(running.count(Lane::Commits).await.unwrap(), 1);
        clock.advance_ms(10_000 + GRACE.as_millis() as u64);
        assert_eq!(running.count(Lane::Commits).await.unwrap(), 0, "a crashed invocation's lease ended");
        assert_eq!(running.count(Lane::Interactive).await.unwrap(), 1);
        assert_eq!(running.count(Lane::Synthesis).await.unwrap(), 0);
    }
}
