//! The invocation's deadline in the HTTP functions (ingress, webhook). Lambda kills an invocation
//! at its `Timeout`, and API Gateway or the function URL then answers a bare 5xx that says nothing
//! of what happened. So each request learns when it must be answered ([`AnswerBy`], which the
//! long-poll cuts its wait to), and one that would still be running then is dropped a margin
//! before it and answered `503` with `Retry-After` instead. Dropping it is what the kill would do,
//! only earlier: every path is safe to cut (a task record without its message is re-sent by the
//! next read or duplicate POST; a webhook delivery is recorded only after its commits are queued).

use super::batch::remaining_time;
use crate::clock::{Clock, SystemClock};
use crate::problem::Problem;
use crate::tasks::poll::AnswerBy;
use axum::response::IntoResponse;
use std::time::Duration;

/// Time kept between a request's cut-off and the invocation's deadline: the answer must still be
/// written back to the runtime API.
pub const ANSWER_MARGIN: Duration = Duration::from_millis(500);

/// Bounds every request of `router` by its invocation's deadline (Lambda's `Context`; requests
/// without one, outside Lambda, are left alone).
pub fn with_deadline(router: axum::Router) -> axum::Router {
    router.layer(axum::middleware::from_fn(
        |mut req: axum::extract::Request, next: axum::middleware::Next| async move {
            let Some(deadline) = req.extensions().get::<lambda_http::Context>().map(|c| c.deadline) else {
                return next.run(req).await;
            };
            let now = SystemClock.now_ms();
            let left = remaining_time(deadline, now);
            req.extensions_mut().insert(AnswerBy(now + left.as_millis() as u64));
            match tokio::time::timeout(left.saturating_sub(ANSWER_MARGIN), next.run(req)).await {
                Ok(resp) => resp,
                Err(_) => {
                    tracing::warn!(
                        left_ms = left.as_millis() as u64,
                        "request cut at the invocation's deadline"
                    );
                    Problem::unavailable("the request could not finish in time; retry it", 1).into_response()
                }
            }
        },
    ))
}
