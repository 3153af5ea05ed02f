//! What the task API answers: a task's view, with the headers that say where and when to look
//! again, and the problems (RFC 9457) it answers with, each with its slug and the field at fault.
//! Internal error text is logged here and never put in a body.

use crate::domain::TaskView;
use crate::ports::StoreError;
use crate::problem::Problem;
use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tracing::error;

/// A task as JSON. An unfinished task answers `202` with `Location` and a `Retry-After` sized to its
/// lane (when to poll again), a finished one `200`.
pub(crate) fn view_response(status: StatusCode, view: &TaskView) -> Response {
    let status =
        if status == StatusCode::OK && !view.status.is_terminal() { StatusCode::ACCEPTED } else { status };
    let mut resp = (status, Json(view)).into_response();
    if status == StatusCode::ACCEPTED {
        if let Ok(v) = HeaderValue::from_str(&format!("/v1/tasks/{}", view.task_id)) {
            resp.headers_mut().insert(header::LOCATION, v);
        }
        let secs = match view.lane {
            crate::domain::Lane::Interactive => 1,
            _ => 5,
        };
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// `503` for a store that is down (retry), `500` for an item that cannot be read; logged here,
/// never shown.
pub(crate) fn store_problem(e: &StoreError, retry_after: u64) -> Problem {
    error!(error = %e, "task store failure");
    match e {
        StoreError::Unavailable(_) => {
            Problem::unavailable("the task store is unavailable; retry later", retry_after)
        }
        StoreError::Corrupt(_) => Problem::internal(),
    }
}

/// `422`: the `Idempotency-Key` names another payload's task.
pub(crate) fn conflict() -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reused",
        "Idempotency-Key reused with another payload",
        "this Idempotency-Key was already used with a different request body",
    )
    .with_field("Idempotency-Key")
}

/// A request without a tenant where tenancy is on.
pub(crate) struct NoTenant;

impl IntoResponse for NoTenant {
    fn into_response(self) -> Response {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "No tenant",
            "this deployment serves tasks per tenant and the request carries no authenticated caller",
        )
        .into_response()
    }
}

/// `429`: the tenant's or the project's day is spent. The project's budget names `project_id`; the
/// tenant's names no field, since no field of the request chose it.
pub(crate) fn over_budget(project_id: &str, over: crate::quota::OverQuota) -> Problem {
    let title = match over.budget {
        crate::domain::quota::Budget::DailyUsd => "Daily USD budget used",
        _ => "Daily token budget used",
    };
    let detail = format!("{}; it renews at 00:00 UTC", over.describe(project_id));
    let mut p = Problem::new(StatusCode::TOO_MANY_REQUESTS, "quota-exceeded", title, detail);
    if over.owner == crate::domain::quota::Owner::Project {
        p = p.with_field("project_id");
    }
    p.retry_after = Some(over.retry_after.as_secs().max(1));
    p
}

/// `400`: not a task id.
pub(crate) fn invalid_id() -> Response {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "invalid-task-id",
        "Invalid task id",
        "a task id is 64 lowercase hex digits",
    )
    .with_field("task_id")
    .into_response()
}

/// `404`: no such task for this caller.
pub(crate) fn not_found() -> Response {
    Problem::new(
        StatusCode::NOT_FOUND,
        "task-not-found",
        "Task not found",
        "no task has this id (or it expired)",
    )
    .with_field("task_id")
    .into_response()
}
