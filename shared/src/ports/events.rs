//! The port of the tasks' event streams: what a run writes while it runs and
//! `GET /v1/tasks/{id}/events` reads (Redis Streams in AWS, in-process locally). A view of the runs
//! that may lose its tail in an outage, never the record: readers end with the record's answer.

use super::CacheError;
use crate::domain::TaskId;
use crate::domain::events::{EventId, RunEvent};
use async_trait::async_trait;
use std::time::Duration;

/// The tasks' event streams.
#[async_trait]
pub trait EventLog: Send + Sync {
    /// Appends `events` to `task`'s stream, in order, and keeps the stream for
    /// [`STREAM_TTL_SECS`] from now, trimmed to about its newest [`STREAM_MAX_EVENTS`]: the id of
    /// the last.
    ///
    /// [`STREAM_TTL_SECS`]: crate::domain::events::STREAM_TTL_SECS
    /// [`STREAM_MAX_EVENTS`]: crate::domain::events::STREAM_MAX_EVENTS
    async fn append(&self, task: &TaskId, events: &[RunEvent]) -> Result<EventId, CacheError>;
    /// At most `limit` of `task`'s events after `after` (from its start when `None`), oldest first;
    /// when there are none yet, waits up to `wait` for one.
    async fn read(
        &self,
        task: &TaskId,
        after: Option<EventId>,
        limit: usize,
        wait: Duration,
    ) -> Result<Vec<(EventId, RunEvent)>, CacheError>;
}
