//! `GET /v1/tasks/{id}/events`: a task's runs as server-sent events, scoped by tenant as `GET` is.
//!
//! The events are the runs' (`crate::tasks::stream` writes them): `status` (`queued` before any
//! run, then each run's `running`, `retrying`, `restarting` and `stopped`, with its reason) and `delta` with
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
//!
//! How a response carries the events is its [`Delivery`]: streamed as they come where what is in
//! front passes a body on as it is written (`lanes dev`, a function URL in `RESPONSE_STREAM` mode),
//! or in short buffered responses where it returns a response whole (API Gateway's HTTP API). A
//! buffered response ends soon after its first event with `status: reconnect` and `retry: 0`, and
//! the client's reconnect with `Last-Event-ID` takes the next part: the same events, in parts. Either
//! way a response ends before its invocation's deadline ([`AnswerBy`]) with that same `reconnect`,
//! never with a cut the client cannot tell from the end.

use super::answers::{invalid_id, not_found};
use super::cache::cache_key;
use super::ingress::{Ingress, caller, read};
use super::poll::{AnswerBy, wait_within};
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
/// Most events read from the log at once: what one reader holds before its client takes it, so a
/// slow client costs at most this many events of memory, however long the stream.
const PAGE: usize = 16;
/// Longest a buffered response waits for its first event (a long-poll's wait).
const BUFFERED_WAIT: Duration = Duration::from_secs(20);
/// How long a buffered response gathers events after its first, before it ends.
const BUFFERED_LINGER: Duration = Duration::from_millis(1_000);

/// How a response carries the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Written as they come, on one response for up to fifteen minutes.
    Streamed,
    /// For a front that returns a response whole: each response holds what comes within twenty
    /// seconds, ends a second after its first event, and the client reconnects for the rest.
    Buffered,
}

/// The event stream's state: the task API's, and how responses carry the events.
struct EventsApi {
    ing: Ingress,
    delivery: Delivery,
}

/// The route of the event stream.
pub fn router(ingress: Ingress, delivery: Delivery) -> Router {
    Router::new()
        .route("/v1/tasks/{id}/events", get(task_events))
        .with_state(Arc::new(EventsApi { ing: ingress, delivery }))
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
        (status = 200, body = StreamEvent, description = "Server-sent events. `status`: `{\"state\": \"queued\" | \"running\" | \"retrying\" | \"restarting\" | \"stopped\" | \"reconnect\", \"run\", \"reason\"}` (`retrying`: the call is made again before any text; `restarting`: the run's text so far is void; `reconnect`: this response ends, resume with `Last-Event-ID`); `delta`: `{\"run\", \"text\"}`; the last is `result` (a completed task's view) or `error` (a failed or cancelled task's view). Each run is a segment, named by `run`.", content_type = "text/event-stream"),
        (status = 400, description = "Invalid id, query or `Last-Event-ID`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No authenticated tenant (tenancy on)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task (for this tenant)", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "This deployment keeps no event streams", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable; retry", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn task_events(
    State(api): State<Arc<EventsApi>>,
    tenant: Option<Extension<Tenant>>,
    answer_by: Option<Extension<AnswerBy>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let ing = &api.ing;
    let caller = match caller(ing, tenant) {
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
    let record = match read(ing, &caller, &id).await {
        Ok(Some(record)) => record,
        Ok(None) => return not_found(),
        Err(resp) => return resp,
    };
    let limit = follow_limit(api.delivery, answer_by.map(|Extension(by)| by), ing.clock.now_ms());
    let follow = Follow::new(api.clone(), caller, events, record, after, limit);
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

/// How long one response follows the task: the delivery's whole time, cut as a long-poll's wait is
/// to end a margin before the invocation must have answered.
fn follow_limit(delivery: Delivery, answer_by: Option<AnswerBy>, now_ms: u64) -> Duration {
    let whole = match delivery {
        Delivery::Streamed => MAX_FOLLOW,
        Delivery::Buffered => BUFFERED_WAIT,
    };
    wait_within(whole.as_secs(), answer_by, now_ms)
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
    api: Arc<EventsApi>,
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
        api: Arc<EventsApi>,
        caller: Option<Tenant>,
        events: Arc<dyn EventLog>,
        record: TaskRecord,
        after: Option<EventId>,
        limit: Duration,
    ) -> Self {
        let now = tokio::time::Instant::now();
        let mut f = Self {
            api,
            caller,
            events,
            record,
            after,
            ready: VecDeque::new(),
            done: false,
            ended: false,
            until: now + limit,
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
            let now = tokio::time::Instant::now();
            if now >= self.until {
                (self.done, self.ended) = (true, true);
                return Some(status("reconnect").retry(Duration::ZERO));
            }
            let wait = QUIET.min(self.until - now);
            if self.read_events(wait).await {
                if self.api.delivery == Delivery::Buffered {
                    // A buffered response's first events end it soon: they reach the client only then.
                    self.until = self.until.min(tokio::time::Instant::now() + BUFFERED_LINGER);
                }
            } else {
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
        let ing = &self.api.ing;
        let hinted = match ing.cache.get(&cache_key(id)).await {
            Ok(Some(json)) => serde_json::from_str::<TaskRecord>(&json)
                .is_ok_and(|r| r.status.is_terminal() && r.created_at_ms == self.record.created_at_ms),
            _ => false,
        };
        if !hinted && self.store_read.elapsed() < STORE_EVERY {
            return;
        }
        self.store_read = tokio::time::Instant::now();
        match read(ing, &self.caller, id).await {
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
        let view = match crate::tasks::large_results::resolve(self.api.ing.objects.as_deref(), record).await {
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

#[cfg(test)]
mod tests {
    // Test helpers panic on failure by design: a failed unwrap is a failed test.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::clock::{Clock, SharedClock, SystemClock};
    use crate::config::IngressConfig;
    use crate::domain::{Lane, TaskRequest};
    use crate::embedded::{
        EmbeddedDb, EmbeddedQueues, EmbeddedStore, MemoryCache, MemoryEvents, QueueSettings,
    };
    use crate::metrics::Metrics;
    use crate::ports::{QueueSend, TaskStore};
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    /// One response's events, as `(name, id, data, retry)` from its whole body.
    async fn part(router: &Router, uri: &str, last: Option<&str>) -> Vec<(String, String, String, String)> {
        let mut req = Request::builder().uri(uri);
        if let Some(last) = last {
            req = req.header("last-event-id", last);
        }
        let resp = router.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        let field = |block: &str, name: &str| {
            let prefix = format!("{name}:");
            let lines = block.lines().filter_map(|l| l.strip_prefix(&prefix).map(str::trim_start));
            lines.collect::<Vec<_>>().join("\n")
        };
        text.split("\n\n")
            .filter(|b| b.lines().any(|l| l.starts_with("event:")))
            .map(|b| (field(b, "event"), field(b, "id"), field(b, "data"), field(b, "retry")))
            .collect()
    }

    /// Buffered, the events come in parts that each end soon after their first event with
    /// `reconnect` and `retry: 0`; reconnecting with the last id each part gave misses and repeats
    /// nothing, and the last part ends with the task.
    #[tokio::test]
    async fn buffered_parts_resume_where_the_last_ended() {
        let dir = tempfile::tempdir().unwrap();
        let clock: SharedClock = Arc::new(SystemClock);
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let store = EmbeddedStore::new(db.clone());
        let queues = EmbeddedQueues::open(db, clock.clone(), QueueSettings::default()).await.unwrap();
        let queues = Lane::ALL.map(|l| Arc::new(queues.queue(l.as_str(), "dlq")) as Arc<dyn QueueSend>);
        let events = Arc::new(MemoryEvents::new(clock.clone()));
        let ingress = Ingress {
            store: Arc::new(store.clone()),
            cache: Arc::new(MemoryCache::new(clock.clone())),
            admission: Arc::new(crate::ports::PutThenSend::new(Arc::new(store.clone()), queues.clone())),
            queues,
            metrics: Metrics::new(),
            clock: clock.clone(),
            config: IngressConfig::default(),
            objects: None,
            events: Some(events.clone()),
        };
        let request = TaskRequest::from_value(serde_json::json!(
            {"project_id": "p", "kind": "explain", "prompt": "parts", "target_files": []}))
        .unwrap();
        let record = TaskRecord::pending(request.task_id(None), request, clock.now_ms(), 3600);
        let id = record.task_id.clone();
        store.put_pending(&record, clock.now_ms()).await.unwrap();
        let router = router(ingress, Delivery::Buffered);
        // Eight pieces over 2.8 s, then a cancel: longer than one part's second, so there are parts.
        let writer = tokio::spawn({
            let (events, store, id) = (events.clone(), store.clone(), id.clone());
            async move {
                events.append(&id, &[RunEvent::Running { run: 1 }]).await.unwrap();
                for i in 0..8 {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    events.append(&id, &[RunEvent::Delta { run: 1, text: format!("<{i}>") }]).await.unwrap();
                }
                store.cancel(&id, SystemClock.now_ms(), 3600).await.unwrap();
            }
        });
        let uri = format!("/v1/tasks/{id}/events");
        let (mut text, mut last, mut parts) = (String::new(), None::<String>, 0);
        loop {
            let got = part(&router, &uri, last.as_deref()).await;
            parts += 1;
            assert!(parts < 20, "the parts end");
            let (end, _, _, retry) = got.last().unwrap().clone();
            for (name, id, data, _) in &got {
                if name == "delta" {
                    let data: serde_json::Value = serde_json::from_str(data).unwrap();
                    text.push_str(data["text"].as_str().unwrap());
                }
                if !id.is_empty() {
                    last = Some(id.clone());
                }
            }
            if end == "error" {
                break;
            }
            assert_eq!((end.as_str(), retry.as_str()), ("status", "0"), "{got:?}");
        }
        writer.await.unwrap();
        assert_eq!(text, (0..8).map(|i| format!("<{i}>")).collect::<String>());
        assert!(parts >= 3, "in parts: {parts}");
    }

    /// A response ends a margin before the invocation must answer, and never later than its
    /// delivery's whole time.
    #[test]
    fn a_response_ends_before_the_invocation_must_answer() {
        let now = 1_000_000;
        assert_eq!(follow_limit(Delivery::Buffered, None, now), BUFFERED_WAIT);
        assert_eq!(follow_limit(Delivery::Streamed, None, now), MAX_FOLLOW);
        let by = Some(AnswerBy(now + 300_000));
        assert_eq!(follow_limit(Delivery::Streamed, by, now), Duration::from_millis(298_000));
        assert_eq!(follow_limit(Delivery::Buffered, by, now), BUFFERED_WAIT);
        assert_eq!(follow_limit(Delivery::Buffered, Some(AnswerBy(now + 1_000)), now), Duration::ZERO);
    }
}
