//! The tasks' event streams in Redis Streams: one stream a task (`<prefix>events:<task id>`), each
//! event one entry whose field `e` holds its JSON. An append is one atomic pipeline of `XADD`s with
//! `MAXLEN ~` and a `PEXPIRE`, so a stream is trimmed and expires as it grows.
//!
//! A reader polls `XRANGE` rather than blocking in `XREAD BLOCK`: the process shares one
//! multiplexed connection, and a blocked command would hold every command behind it (the lease's
//! renewals among them) for as long as it blocks. A wait polls every 5 ms for its first 50 ms, then
//! backs off, doubling to 100 ms: a stream that is flowing is read within about 5 ms of each append
//! (a reader's next wait starts at the fast end again), and a quiet one costs ten reads a second.

use super::{RedisConn, ms};
use crate::domain::TaskId;
use crate::domain::events::{EventId, RunEvent, STREAM_MAX_EVENTS, STREAM_TTL_SECS};
use crate::ports::{CacheError, EventLog};
use async_trait::async_trait;
use redis::streams::StreamRangeReply;
use std::time::Duration;

/// How often a waiting reader looks again at first, for how long, and at the longest.
const POLL_FIRST: Duration = Duration::from_millis(5);
const POLL_FAST_FOR: Duration = Duration::from_millis(50);
const POLL_MAX: Duration = Duration::from_millis(100);

/// The event log in Redis.
#[derive(Clone)]
pub struct RedisEvents {
    conn: RedisConn,
    prefix: String,
}

impl RedisEvents {
    /// A log over `conn` with keys under `prefix`.
    pub fn new(conn: RedisConn, prefix: &str) -> Self {
        Self { conn, prefix: prefix.to_owned() }
    }

    fn key(&self, task: &TaskId) -> String {
        format!("{}events:{task}", self.prefix)
    }

    async fn range(
        &self,
        task: &TaskId,
        after: Option<EventId>,
        limit: usize,
    ) -> Result<Vec<(EventId, RunEvent)>, CacheError> {
        crate::metrics::aws_request("redis", "XRANGE");
        let start = after.map_or("-".to_owned(), |a| EventId { seq: a.seq + 1, ..a }.to_string());
        let mut conn = self.conn.clone();
        let reply: StreamRangeReply = redis::cmd("XRANGE")
            .arg(self.key(task))
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let mut out = Vec::with_capacity(reply.ids.len());
        for entry in reply.ids {
            let id = entry.id.parse().map_err(|_| corrupt(&entry.id))?;
            let json: String = entry.get("e").ok_or_else(|| corrupt(&entry.id))?;
            out.push((id, serde_json::from_str(&json).map_err(|_| corrupt(&entry.id))?));
        }
        Ok(out)
    }
}

fn unavailable(e: redis::RedisError) -> CacheError {
    CacheError::Unavailable(e.to_string())
}

fn corrupt(id: &str) -> CacheError {
    CacheError::Unavailable(format!("event {id} is not one this log wrote"))
}

#[async_trait]
impl EventLog for RedisEvents {
    async fn append(&self, task: &TaskId, events: &[RunEvent]) -> Result<EventId, CacheError> {
        crate::metrics::aws_request("redis", "XADD");
        let key = self.key(task);
        let mut pipe = redis::pipe();
        pipe.atomic();
        for e in events {
            let json = serde_json::to_string(e).map_err(|e| CacheError::Unavailable(e.to_string()))?;
            pipe.cmd("XADD")
                .arg(&key)
                .arg("MAXLEN")
                .arg("~")
                .arg(STREAM_MAX_EVENTS)
                .arg("*")
                .arg("e")
                .arg(json);
        }
        pipe.cmd("PEXPIRE").arg(&key).arg(ms(Duration::from_secs(STREAM_TTL_SECS))).ignore();
        let mut conn = self.conn.clone();
        let ids: Vec<String> = pipe.query_async(&mut conn).await.map_err(unavailable)?;
        let last = ids.last().ok_or_else(|| CacheError::Unavailable("nothing appended".into()))?;
        last.parse().map_err(|_| corrupt(last))
    }

    async fn read(
        &self,
        task: &TaskId,
        after: Option<EventId>,
        limit: usize,
        wait: Duration,
    ) -> Result<Vec<(EventId, RunEvent)>, CacheError> {
        let started = tokio::time::Instant::now();
        let deadline = started + wait;
        let mut every = POLL_FIRST;
        loop {
            let found = self.range(task, after, limit).await?;
            let now = tokio::time::Instant::now();
            if !found.is_empty() || now >= deadline {
                return Ok(found);
            }
            tokio::time::sleep(every.min(deadline - now)).await;
            if now - started >= POLL_FAST_FOR {
                every = (every * 2).min(POLL_MAX);
            }
        }
    }
}
