//! The long-poll of `GET /v1/tasks/{id}?wait=N`: the `wait` parameter, how long it may really wait
//! (never past the invocation's deadline, less a margin), and the wait itself, a parked future
//! woken by the finished record in the hot cache, with the store read now and then in case a cache
//! write was lost.

use crate::domain::{TaskRecord, TaskStatus};
use crate::ports::Cache;
use crate::problem::Problem;
use crate::tasks::cache::cache_key;
use axum::http::StatusCode;
use std::future::Future;
use std::time::Duration;

/// Longest long-poll a GET may ask for, in seconds (API Gateway's own limit is 30 s).
pub const MAX_WAIT_SECS: u64 = 20;

/// When the invocation serving a request must have answered, in Unix ms: Lambda's deadline, which
/// the Lambda wiring puts in each request (`crate::lambda::deadline`); absent outside Lambda.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnswerBy(pub u64);

/// Time a long-poll leaves before the invocation's deadline: its last store read and the answer.
pub const LONG_POLL_MARGIN: Duration = Duration::from_millis(2_000);

/// How long a GET that asked for `wait_secs` waits at `now_ms`: the whole wait, or less when the
/// invocation must answer sooner, so the client gets the task's state (and polls again) rather
/// than the 5xx Lambda's timeout would leave it.
pub(crate) fn wait_within(wait_secs: u64, answer_by: Option<AnswerBy>, now_ms: u64) -> Duration {
    let asked = Duration::from_secs(wait_secs);
    match answer_by {
        None => asked,
        Some(AnswerBy(by)) => {
            asked.min(Duration::from_millis(by.saturating_sub(now_ms)).saturating_sub(LONG_POLL_MARGIN))
        }
    }
}

/// Reads `wait` from the query: whole seconds, `0..=MAX_WAIT_SECS`. Other parameters are refused, so
/// a typo is not silently a plain GET.
pub(crate) fn parse_wait(query: Option<&str>) -> Result<u64, Box<Problem>> {
    let params = crate::query::params(query, &["wait"])?;
    match params.get("wait").map(|v| v.parse::<u64>()) {
        None => Ok(0),
        Some(Ok(n)) if n <= MAX_WAIT_SECS => Ok(n),
        Some(_) => Err(Box::new(
            Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid-query",
                "Invalid query parameter",
                format!("`wait` must be whole seconds from 0 to {MAX_WAIT_SECS}"),
            )
            .with_field("wait"),
        )),
    }
}

/// The long-poll: until `deadline`, waits for `record`'s run to end and answers its last record, as
/// `read` gives it (None when it is gone). The finished record in the cache (written by the worker or the cancellation)
/// wakes it; a completed one answers, any other is read again from the store. The store is also
/// re-read now and then in case the cache write was lost. Each waiter is a parked future, not a
/// thread.
pub(crate) async fn long_poll<E, F: Future<Output = Result<Option<TaskRecord>, E>>>(
    cache: &dyn Cache,
    read: impl Fn() -> F,
    mut record: TaskRecord,
    deadline: tokio::time::Instant,
) -> Result<Option<TaskRecord>, E> {
    let id = record.task_id.clone();
    let mut since_store = Duration::ZERO;
    while !record.status.is_terminal() && tokio::time::Instant::now() < deadline {
        let step = LONG_POLL_TICK.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        tokio::time::sleep(step).await;
        since_store += step;
        // The same run of the id only: a record left by an earlier run is not this one's end.
        let finished = match cache.get(&cache_key(&id)).await {
            Ok(Some(json)) => serde_json::from_str::<TaskRecord>(&json)
                .ok()
                .filter(|r| r.status.is_terminal() && r.created_at_ms == record.created_at_ms),
            _ => None,
        };
        if let Some(done) = finished.as_ref().filter(|r| r.status == TaskStatus::Completed) {
            return Ok(Some(done.clone()));
        }
        if finished.is_some()
            || since_store >= LONG_POLL_STORE_EVERY
            || tokio::time::Instant::now() >= deadline
        {
            since_store = Duration::ZERO;
            match read().await? {
                Some(rec) => record = rec,
                None => return Ok(None),
            }
        }
    }
    Ok(Some(record))
}

/// How often a long-poll looks at the wake-up hint.
const LONG_POLL_TICK: Duration = Duration::from_millis(200);
/// How often a long-poll re-reads the store without a hint.
const LONG_POLL_STORE_EVERY: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_a_margin_before_the_invocation_must_answer() {
        let now = 1_000_000;
        assert_eq!(wait_within(20, None, now), Duration::from_secs(20), "outside Lambda, all of it");
        // 10 s left: 8 s of wait, 2 s for the last read and the answer.
        assert_eq!(wait_within(20, Some(AnswerBy(now + 10_000)), now), Duration::from_secs(8));
        assert_eq!(wait_within(5, Some(AnswerBy(now + 25_000)), now), Duration::from_secs(5), "asked less");
        assert_eq!(wait_within(20, Some(AnswerBy(now + 1_000)), now), Duration::ZERO, "no time: no wait");
        assert_eq!(wait_within(20, Some(AnswerBy(now - 1)), now), Duration::ZERO, "past it");
    }
}
