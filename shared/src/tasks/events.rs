//! `GET /v1/tasks/{id}/events`: a task's runs as server-sent events, scoped by tenant as `GET` is.
//!
//! The events are the runs' (`crate::tasks::stream` writes them): `status` (`queued` before any
//! run, then each run's `running`, `restarting` and `stopped`, with its reason) and `delta` with
//! the text as it arrives, each with the id of its place in the stream. The stream ends with one
//! event from the record, never from the runs: `result` (the task's view, as `GET` answers it) or
//! `error` (a failed or cancelled task's view). A client that connects after the end gets that
//! event at once; one that reconnects with `Last-Event-ID` gets what follows that id, so no
//! character is missed or repeated; the final event carries no id, so a reconnect after it asks
//! again from the last text.
//!
//! Between events the reader waits on the log ([`EventLog::read`]) a quarter second at a time, and
//! after each quiet wait looks at the finished-record hint the worker's final write leaves (the
//! store every few seconds, in case the hint was lost): the `result` follows the last text by at
//! most that quarter second.

use super::answers::{invalid_id, not_found};
use super::cache::cache_key;
use super::ingress::{Ingress, caller, read};
use super::tenant::Tenant;
use crate::domain::events::{EventId, RunEvent};
use crate::domain::{TaskId, TaskRecord, TaskStatus};
use crate::ports::EventLog;
use crate::problem::Problem;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// How long a reader waits on the log before it looks for the task's end.
const QUIET: Duration = Duration::from_millis(250);
/// How often a reader reads the record from the store when no hint says the task ended.
const STORE_EVERY: Duration = Duration::from_secs(5);
/// Longest one connection follows a task; the client reconnects with `Last-Event-ID`.
const MAX_FOLLOW: Duration = Duration::from_secs(15 * 60);
/// Most events read from the log at once.
const PAGE: usize = 256;

/// The route of the event stream.
pub fn router(ingress: Ingress) -> Router {
    Router::new().route("/v1/tasks/{id}/events", get(task_events)).with_state(Arc::new(ingress))
}

/// A task's events, as `text/event-stream`: `status` and `delta` events as its runs go, then one
/// `result` or `error`.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/events",
    tag = "tasks",
    params(
        ("id" = String, Path, description = "The task id (64 lowercase hex characters)", pattern = "^[0-9a-f]{64}$"),
        ("Last-Event-ID" = Option<String>, Header, nullable = false, description = "Resume after this event (an id this stream gave: two decimal numbers joined by '-'); empty, from the start", pattern = "^([0-9]{1,19}-[0-9]{1,19})?$"),
    ),
    responses(
        (status = 200, body = StreamEvent, description = "Server-sent events. `status`: `{\"state\": \"queued\" | \"running\" | \"restarting\" | \"stopped\", \"run\", \"reason\"}` (`restarting`: the run's text so far is void); `delta`: `{\"run\", \"text\"}`; the last is `result` (a completed task's view) or `error` (a failed or cancelled task's view). Each run is a segment, named by `run`.", content_type = "text/event-stream"),
        (status = 400, description = "Invalid id, query or `Last-Event-ID`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No authenticated tenant (tenancy on)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task (for this tenant)", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "This deployment keeps no event streams", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable; retry", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn task_events(
    State(ing): State<Arc<Ingress>>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let caller = match caller(&ing, tenant) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let Ok(id) = TaskId::parse(&id) else {
        return invalid_id();
    };
    if let Err(problem) = crate::query::params(query.as_deref(), &[]) {
        return problem.into_response();
    }
    let after = match last_event_id(&headers) {
        Ok(after) => after,
        Err(problem) => return problem.into_response(),
    };
    let Some(events) = ing.events.clone() else {
        return Problem::new(
            StatusCode::NOT_IMPLEMENTED,
            "no-event-streams",
            "No event streams here",
            "this deployment keeps no event streams; follow the task with GET /v1/tasks/{id}?wait=20",
        )
        .into_response();
    };
    let record = match read(&ing, &caller, &id).await {
        Ok(Some(record)) => record,
        Ok(None) => return not_found(),
        Err(resp) => return resp,
    };
    let follow = Follow::new(ing, caller, events, record, after);
    let stream = futures::stream::unfold(follow, |mut f| async move {
        let event = f.next().await?;
        Some((Ok::<_, Infallible>(event), f))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// One server-sent event of the stream, by its fields: what the OpenAPI document says of each event,
/// and what every event is built from.
#[derive(utoipa::ToSchema)]
pub(crate) struct StreamEvent {
    /// `status`, `delta`, `result` or `error`.
    #[schema(pattern = "^(status|delta|result|error)$")]
    event: &'static str,
    /// The event's JSON document, as text.
    data: String,
    /// Its place in the stream, to resume after with `Last-Event-ID`; absent on the reader's own
    /// `queued` and `reconnect` and on the final event.
    #[schema(pattern = "^[0-9]{1,19}-[0-9]{1,19}$")]
    id: Option<String>,
}

impl StreamEvent {
    fn sse(self) -> Event {
        let event = Event::default().event(self.event).data(self.data);
        match self.id {
            Some(id) => event.id(id),
            None => event,
        }
    }
}

/// The `Last-Event-ID` header, if any: a malformed one is a 400 naming it. An empty one is none,
/// as an `EventSource` whose stream gave no id yet would send it.
fn last_event_id(headers: &HeaderMap) -> Result<Option<EventId>, Box<Problem>> {
    let Some(value) = headers.get("last-event-id").filter(|v| !v.is_empty()) else { return Ok(None) };
    let parsed = value.to_str().ok().map(|v| v.parse::<EventId>());
    match parsed {
        Some(Ok(id)) => Ok(Some(id)),
        Some(Err(e)) => Err(Box::new(bad_header(e.to_string()))),
        None => Err(Box::new(bad_header("not visible ASCII".into()))),
    }
}

fn bad_header(reason: String) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "invalid-header",
        "Invalid header",
        format!("Last-Event-ID: {reason}"),
    )
    .with_field("Last-Event-ID")
}

/// One reader's place in a task's stream.
struct Follow {
    ing: Arc<Ingress>,
    caller: Option<Tenant>,
    events: Arc<dyn EventLog>,
    record: TaskRecord,
    after: Option<EventId>,
    ready: VecDeque<Event>,
    /// Nothing more to read from the log.
    done: bool,
    /// The final event was given (or is not to be).
    ended: bool,
    until: tokio::time::Instant,
    store_read: tokio::time::Instant,
}

impl Follow {
    fn new(
        ing: Arc<Ingress>,
        caller: Option<Tenant>,
        events: Arc<dyn EventLog>,
        record: TaskRecord,
        after: Option<EventId>,
    ) -> Self {
        let now = tokio::time::Instant::now();
        let mut f = Self {
            ing,
            caller,
            events,
            record,
            after,
            ready: VecDeque::new(),
            done: false,
            ended: false,
            until: now + MAX_FOLLOW,
            store_read: now,
        };
        // A task that ended answers at once; one no run has started says it is queued.
        if f.after.is_none() && f.record.status.is_terminal() {
            f.done = true;
        } else if f.after.is_none() && f.record.status == TaskStatus::Pending {
            f.ready.push_back(status("queued"));
        }
        f
    }

    /// The next event, `None` once the stream has ended.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            if self.done {
                if self.ended {
                    return None;
                }
                self.ended = true;
                return self.end().await;
            }
            if tokio::time::Instant::now() >= self.until {
                (self.done, self.ended) = (true, true);
                return Some(status("reconnect"));
            }
            if !self.read_events(QUIET).await {
                self.look_for_the_end().await;
                if self.record.status.is_terminal() {
                    // What the runs wrote before the final write comes first.
                    self.read_events(Duration::ZERO).await;
                    self.done = true;
                }
            }
        }
    }

    /// Queues the events after the last one given, waiting up to `wait` for one: whether any came.
    async fn read_events(&mut self, wait: Duration) -> bool {
        match self.events.read(&self.record.task_id, self.after, PAGE, wait).await {
            Ok(found) if !found.is_empty() => {
                for (id, e) in found {
                    self.after = Some(id);
                    self.ready.push_back(event(id, &e));
                }
                true
            }
            Ok(_) => false,
            Err(e) => {
                // The stream is a view: without it the reader still ends with the record.
                tracing::warn!(error = %e, "task events unavailable");
                tokio::time::sleep(wait).await;
                false
            }
        }
    }

    /// Reads the record again when the worker's hint says this run of the task ended, or every
    /// [`STORE_EVERY`].
    async fn look_for_the_end(&mut self) {
        let id = &self.record.task_id;
        let hinted = match self.ing.cache.get(&cache_key(id)).await {
            Ok(Some(json)) => serde_json::from_str::<TaskRecord>(&json)
                .is_ok_and(|r| r.status.is_terminal() && r.created_at_ms == self.record.created_at_ms),
            _ => false,
        };
        if !hinted && self.store_read.elapsed() < STORE_EVERY {
            return;
        }
        self.store_read = tokio::time::Instant::now();
        match read(&self.ing, &self.caller, id).await {
            Ok(Some(record)) => self.record = record,
            // Gone (expired, or its tenant's no longer): the stream ends with what it has.
            Ok(None) => self.done = true,
            Err(_) => {}
        }
    }

    /// The final event: `result` or `error` from the record, its large result resolved.
    async fn end(&self) -> Option<Event> {
        if !self.record.status.is_terminal() {
            return None;
        }
        let record = self.record.clone();
        let name = if record.status == TaskStatus::Completed { "result" } else { "error" };
        let view = match crate::tasks::large_results::resolve(self.ing.objects.as_deref(), record).await {
            Ok(record) => record.view(),
            Err(_) => {
                let data = r#"{"status":"unreadable"}"#.to_owned();
                return Some(StreamEvent { event: "error", data, id: None }.sse());
            }
        };
        let data = serde_json::to_string(&view).unwrap_or_else(|_| "{}".into());
        Some(StreamEvent { event: name, data, id: None }.sse())
    }
}

/// The SSE event of one run event.
fn event(id: EventId, e: &RunEvent) -> Event {
    StreamEvent { event: e.sse_name(), data: e.sse_data().to_string(), id: Some(id.to_string()) }.sse()
}

/// A status the reader says (no id: it is not in the log).
fn status(state: &str) -> Event {
    StreamEvent { event: "status", data: serde_json::json!({"state": state}).to_string(), id: None }.sse()
}
