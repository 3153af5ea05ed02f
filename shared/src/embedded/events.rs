//! The in-process twin of the Redis Streams event log: each task's stream in memory, its ids
//! `<ms>-<seq>` from the injected clock, trimmed and expired as `XADD MAXLEN ~` and `PEXPIRE`
//! keep the Redis one, and a reader waiting for the next event woken by the append.

use super::expiring::Expiring;
use crate::clock::SharedClock;
use crate::domain::TaskId;
use crate::domain::events::{EventId, RunEvent, STREAM_MAX_EVENTS, STREAM_TTL_SECS};
use crate::ports::{CacheError, EventLog};
use async_trait::async_trait;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// Most streams kept; past it the soonest-expiring go first.
const MAX_STREAMS: usize = 100_000;

/// One task's events, oldest first, and the last id given.
#[derive(Debug, Default)]
struct Stream {
    events: VecDeque<(EventId, RunEvent)>,
    last: Option<EventId>,
}

/// The embedded event log.
#[derive(Debug)]
pub struct MemoryEvents {
    clock: SharedClock,
    streams: Mutex<Expiring<Stream>>,
    appended: tokio::sync::Notify,
    max_events: usize,
}

impl MemoryEvents {
    /// A log judged by `clock`.
    pub fn new(clock: SharedClock) -> Self {
        Self::capped(clock, STREAM_MAX_EVENTS)
    }

    /// A log keeping at most `max_events` a stream (tests trim with a small one).
    pub fn capped(clock: SharedClock, max_events: usize) -> Self {
        Self {
            clock,
            streams: Mutex::new(Expiring::new(MAX_STREAMS)),
            appended: tokio::sync::Notify::new(),
            max_events,
        }
    }

    fn after(
        &self,
        task: &TaskId,
        after: Option<EventId>,
        limit: usize,
    ) -> Result<Vec<(EventId, RunEvent)>, CacheError> {
        let now = self.clock.now_ms();
        let streams =
            self.streams.lock().map_err(|_| CacheError::Unavailable("event log poisoned".into()))?;
        let Some((stream, _)) = streams.live(task.as_str(), now) else { return Ok(Vec::new()) };
        // Ids only grow along a stream: the first one after `after` is found by bisection.
        let from = after.map_or(0, |a| stream.events.partition_point(|(id, _)| *id <= a));
        Ok(stream.events.range(from..).take(limit).cloned().collect())
    }
}

#[async_trait]
impl EventLog for MemoryEvents {
    async fn append(&self, task: &TaskId, events: &[RunEvent]) -> Result<EventId, CacheError> {
        let now = self.clock.now_ms();
        let last = {
            let mut streams =
                self.streams.lock().map_err(|_| CacheError::Unavailable("event log poisoned".into()))?;
            let mut stream = match streams.remove(task.as_str()) {
                Some((s, exp)) if exp > now => s,
                _ => Stream::default(),
            };
            for e in events {
                let id = EventId::next(stream.last, now);
                stream.events.push_back((id, e.clone()));
                stream.last = Some(id);
            }
            while stream.events.len() > self.max_events {
                stream.events.pop_front();
            }
            let last = stream.last.unwrap_or(EventId { ms: now, seq: 0 });
            streams.insert(task.as_str(), stream, now + STREAM_TTL_SECS * 1000, now);
            last
        };
        self.appended.notify_waiters();
        Ok(last)
    }

    async fn read(
        &self,
        task: &TaskId,
        after: Option<EventId>,
        limit: usize,
        wait: Duration,
    ) -> Result<Vec<(EventId, RunEvent)>, CacheError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before the look, so an append between the look and the wait wakes it.
            let appended = self.appended.notified();
            let found = self.after(task, after, limit)?;
            if !found.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(found);
            }
            if tokio::time::timeout_at(deadline, appended).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }
}
