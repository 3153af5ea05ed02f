//! The task API as an axum router: `POST /v1/tasks`, `GET /v1/tasks/{id}[?wait=N]`,
//! `DELETE /v1/tasks/{id}`, `GET /healthz`. It makes idempotency's lookup in its order (hot cache,
//! conditional put of `PENDING`: [`crate::idempotency`]) and answers its outcomes. It marks a
//! record whose enqueue failed, and asks for the re-send of an unsent or orphaned `PENDING` record
//! (by a duplicate POST or by a GET; how is [`crate::tasks::enqueue`]'s), cancellation, and the
//! long-poll.

use crate::clock::SharedClock;
use crate::config::IngressConfig;
use crate::domain::{MAX_BODY_BYTES, TaskId, TaskRecord, TaskRequest, TaskStatus, TaskView};
use crate::idempotency::{self, Duplicate, validate_idempotency_key};
use crate::metrics::Metrics;
use crate::ports::{Admission, Admitted, Cache, CancelOutcome, QueueSend, TaskStore};
use crate::problem::Problem;
use crate::tasks::answers::{
    NoTenant, conflict, invalid_id, not_found, over_budget, store_problem, view_response,
};
use crate::tasks::cache::{HINT_TTL, cache_key, cancel_key, publish_finished};
use crate::tasks::poll::{AnswerBy, long_poll, parse_wait, wait_within};
use crate::tasks::tenant::Tenant;
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::Arc;
use tracing::{Instrument, error, warn};

/// Everything ingress needs, built once.
#[derive(Clone)]
pub struct Ingress {
    /// Durable records.
    pub store: Arc<dyn TaskStore>,
    /// Hot cache of completed tasks.
    pub cache: Arc<dyn Cache>,
    /// One sender per lane, indexed by [`Lane::index`].
    pub queues: [Arc<dyn QueueSend>; 3],
    /// A new task's put and send: [`crate::ports::PutThenSend`] on these `store` and `queues`, or
    /// the backend's own, which makes the two one write.
    pub admission: Arc<dyn Admission>,
    /// Metrics.
    pub metrics: Metrics,
    /// Time.
    pub clock: SharedClock,
    /// Settings.
    pub config: IngressConfig,
    /// Where results too large for a record are kept ([`crate::tasks::large_results`]); `None`
    /// where the deployment has no results store.
    pub objects: Option<Arc<dyn crate::ports::ResultObjects>>,
    /// The tasks' event streams (`GET /v1/tasks/{id}/events`, [`crate::tasks::events`]); `None`
    /// where the deployment keeps none (it answers 501).
    pub events: Option<Arc<dyn crate::ports::EventLog>>,
}

/// The task API router.
pub fn router(ingress: Ingress) -> Router {
    Router::new()
        .route("/v1/tasks", post(post_task))
        .route("/v1/tasks/{id}", get(get_task).delete(cancel_task))
        .route("/healthz", get(healthz))
        .fallback(|| async { Problem::new(StatusCode::NOT_FOUND, "not-found", "Not found", "no such route") })
        .method_not_allowed_fallback(|| async {
            Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                "this route does not take that method",
            )
        })
        .with_state(Arc::new(ingress))
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "Up", body = Object, example = json!({"status": "ok"}))))]
pub(crate) async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// Submits a task. The same payload (canonical form) or the same `Idempotency-Key` names the same
/// task: a duplicate answers with the existing task instead of running it again.
#[utoipa::path(
    post,
    path = "/v1/tasks",
    tag = "tasks",
    request_body(content = TaskRequest, content_type = "application/json"),
    params(("Idempotency-Key" = Option<String>, Header, description = "Names the task instead of the payload's hash (1 to 255 visible ASCII characters); reused with another payload it is a 422", pattern = "^[!-~]{1,255}$")),
    responses(
        (status = 202, description = "Accepted: new, or a duplicate still running", body = TaskView,
            headers(("Location" = String, description = "The task's URL"), ("Retry-After" = u64, description = "Seconds until it is worth asking again"))),
        (status = 200, description = "A duplicate of a finished task: its result", body = TaskView),
        (status = 400, description = "Invalid request; `field` and `errors` name what is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No authenticated tenant (tenancy on)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 256 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not `application/json`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`Idempotency-Key` reused with another payload", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The tenant's or the project's daily token or USD budget is spent (`field` is `project_id` for the project's; none for the tenant's, which no field of the request chose)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds until midnight UTC"))),
        (status = 503, description = "Store or queue unavailable; retry", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64))),
        (status = 500, description = "A stored item could not be read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn post_task(
    State(ing): State<Arc<Ingress>>,
    tenant: Option<Extension<Tenant>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let tenant = match caller(&ing, tenant) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let span =
        tracing::info_span!("ingress", task_id = tracing::field::Empty, trace = crate::trace::current());
    match accept(&ing, tenant, &headers, body).instrument(span).await {
        Ok(resp) => resp,
        Err(problem) => problem.into_response(),
    }
}

/// The caller's tenant with tenancy on (`401` without one), `None` with it off.
pub(super) fn caller(ing: &Ingress, tenant: Option<Extension<Tenant>>) -> Result<Option<Tenant>, NoTenant> {
    match (ing.config.tenancy, tenant) {
        (false, _) => Ok(None),
        (true, Some(Extension(t))) => Ok(Some(t)),
        (true, None) => Err(NoTenant),
    }
}

/// Whether `caller` may see `record`: always with tenancy off, otherwise only its own tasks.
fn owns(caller: &Option<Tenant>, record: &TaskRecord) -> bool {
    caller.is_none() || record.request.tenant == *caller
}

/// The submission a `POST` carries: its JSON body, validated, for `tenant`, and its
/// `Idempotency-Key` header, if any.
async fn submission(
    tenant: Option<Tenant>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(TaskRequest, Option<String>), Problem> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mime = content_type.split(';').next().unwrap_or("").trim();
    if !mime.eq_ignore_ascii_case("application/json") {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            format!("Content-Type must be application/json, got `{content_type}`"),
        )
        .with_field("Content-Type"));
    }
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|_| {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            format!("the body must be at most {MAX_BODY_BYTES} bytes"),
        )
        .with_field("body")
    })?;
    let mut request = TaskRequest::from_json(&bytes).map_err(Problem::validation)?;
    request.tenant = tenant;
    let idem = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let key = v.to_str().unwrap_or("\u{0}");
            validate_idempotency_key(key).map_err(|e| Problem::validation(vec![e]))?;
            Some(key.to_owned())
        }
    };
    Ok((request, idem))
}

/// `POST /v1/tasks` past authentication: the submission, looked up in idempotency's order, stored
/// and sent when new.
async fn accept(
    ing: &Ingress,
    tenant: Option<Tenant>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let (request, idem) = submission(tenant, headers, body).await?;
    let task_id = request.task_id(idem.as_deref());
    tracing::Span::current().record("task_id", task_id.as_str());
    let payload_hash = request.payload_hash();

    // The lookup in idempotency's order. 1. Hot cache: a completed task costs no store request.
    match ing.cache.get(&cache_key(&task_id)).await {
        Ok(cached) => {
            if let Some(duplicate) = idempotency::from_cache(cached.as_deref(), &payload_hash) {
                return answer_duplicate(ing, duplicate, Answered::ByCache, ing.clock.now_ms()).await;
            }
        }
        Err(e) => {
            warn!(error = %e, "cache unavailable; answering from the store");
            ing.metrics.degraded_operations_total.with_label_values(&["cache"]).inc();
        }
    }

    // 2. A new task holds its estimate on its tenant's and project's day; over one, nothing is
    // stored, but a duplicate of an accepted task is never refused: the store is asked first.
    let now = ing.clock.now_ms();
    let retry_after = ing.config.retry_after_secs;
    let record = TaskRecord::pending(task_id, request, now, ing.config.pending_ttl_secs);
    if let Err(over) = super::hold::take(&*ing.cache, &ing.config.quota, &ing.metrics, &record).await {
        let stored = ing.store.get(&record.task_id, now).await.map_err(|e| store_problem(&e, retry_after))?;
        return match idempotency::from_record(stored, &payload_hash) {
            Some(duplicate) => answer_duplicate(ing, duplicate, Answered::ByStore, now).await,
            None => Err(over_budget(&record.request.project_id, over)),
        };
    }

    // 3. Conditional put of PENDING and, when it creates the record, the send; a duplicate gets the
    // existing record back in the same request (and gives back the hold this submission took).
    let admitted = match ing.admit(&record, now).await {
        Ok(admitted) => admitted,
        Err(e) => {
            super::hold::give_back(&*ing.cache, &ing.config.quota, &ing.metrics, &record).await;
            return Err(store_problem(&e, retry_after));
        }
    };
    match admitted {
        Admitted::Sent(_) => Ok(view_response(StatusCode::ACCEPTED, &record.view())),
        // 4. A failed send is not undone: a duplicate may already have been answered 202 for this
        // record. It is marked unsent instead, so the retry the 503 asks for, or the next read,
        // sends it at once.
        Admitted::Unsent(e) => {
            error!(error = %e, task_id = %record.task_id, "enqueue failed; the record is marked unsent");
            ing.mark_unsent(&record, now).await;
            Err(Problem::unavailable("the task queue is unavailable; retry later", retry_after))
        }
        Admitted::Exists(live) => {
            super::hold::give_back(&*ing.cache, &ing.config.quota, &ing.metrics, &record).await;
            answer_duplicate(ing, idempotency::judge(*live, &payload_hash), Answered::ByStore, now).await
        }
    }
}

/// Where a duplicate's record came from: the hot cache, or the store (whose completed record goes
/// back into the cache).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answered {
    ByCache,
    ByStore,
}

/// The answer to a duplicate: its result once completed, else `202` (re-sending its message when
/// it is known unsent or looks lost), counted by where its record came from.
async fn answer_duplicate(
    ing: &Ingress,
    duplicate: Duplicate,
    by: Answered,
    now: u64,
) -> Result<Response, Problem> {
    if duplicate != Duplicate::Conflict {
        let stage = if by == Answered::ByCache { "cache" } else { "store" };
        ing.metrics.duplicates_total.with_label_values(&[stage]).inc();
    }
    match duplicate {
        Duplicate::Conflict => Err(conflict()),
        Duplicate::Completed(existing) => {
            if by == Answered::ByStore
                && let Ok(json) = serde_json::to_string(&existing)
                && let Err(e) =
                    ing.cache.set(&cache_key(&existing.task_id), &json, ing.config.result_cache_ttl).await
            {
                warn!(error = %e, "cache refill failed");
            }
            Ok(ing.finished_view(StatusCode::OK, *existing).await)
        }
        Duplicate::Queued(existing) => {
            ing.resend_if_orphaned(&existing, now).await;
            Ok(view_response(StatusCode::ACCEPTED, &existing.view()))
        }
        Duplicate::Running(existing) => Ok(view_response(StatusCode::ACCEPTED, &existing.view())),
    }
}

/// A task's status and, once finished, its result. With `wait`, answers as soon as the task ends or
/// after `wait` seconds (long-poll).
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}",
    tag = "tasks",
    params(
        ("id" = String, Path, description = "The task id (64 lowercase hex characters)", pattern = "^[0-9a-f]{64}$"),
        ("wait" = Option<u64>, Query, description = "Seconds to wait for the task to end, 0 to 20 (0: answer at once); given once", minimum = 0, maximum = 20),
    ),
    responses(
        (status = 200, description = "Finished", body = TaskView),
        (status = 202, description = "Not finished yet", body = TaskView,
            headers(("Location" = String, description = "The task's URL"), ("Retry-After" = u64, description = "Seconds until it is worth asking again"))),
        (status = 400, description = "Invalid id or `wait`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No authenticated tenant (tenancy on)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task (for this tenant)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable; retry", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "A stored item could not be read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn get_task(
    State(ing): State<Arc<Ingress>>,
    tenant: Option<Extension<Tenant>>,
    answer_by: Option<Extension<AnswerBy>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let caller = match caller(&ing, tenant) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let Ok(id) = TaskId::parse(&id) else {
        return invalid_id();
    };
    let wait = match parse_wait(query.as_deref()) {
        Ok(w) => w,
        Err(problem) => return problem.into_response(),
    };
    // A completed record never changes again, so the cache may answer for it.
    if let Ok(Some(json)) = ing.cache.get(&cache_key(&id)).await
        && let Ok(rec) = serde_json::from_str::<TaskRecord>(&json)
        && rec.status == TaskStatus::Completed
        && owns(&caller, &rec)
    {
        return ing.finished_view(StatusCode::OK, rec).await;
    }
    let wait = wait_within(wait, answer_by.map(|Extension(a)| a), ing.clock.now_ms());
    let deadline = tokio::time::Instant::now() + wait;
    let record = match read(&ing, &caller, &id).await {
        Ok(Some(rec)) => rec,
        Ok(None) => return not_found(),
        Err(resp) => return resp,
    };
    ing.resend_if_orphaned(&record, ing.clock.now_ms()).await;
    match long_poll(&*ing.cache, || read(&ing, &caller, &id), record, deadline).await {
        Ok(Some(record)) => ing.finished_view(StatusCode::OK, record).await,
        Ok(None) => not_found(),
        Err(resp) => resp,
    }
}

impl Ingress {
    /// The view of `record`, its result's text read back from the results store when the record
    /// keeps only its key.
    async fn finished_view(&self, status: StatusCode, record: TaskRecord) -> Response {
        match crate::tasks::large_results::resolve(self.objects.as_deref(), record).await {
            Ok(record) => view_response(status, &record.view()),
            Err(e) => store_problem(&e, self.config.retry_after_secs).into_response(),
        }
    }
}

/// The record of `id` if `caller` may see it (another tenant's task reads as missing).
pub(super) async fn read(
    ing: &Ingress,
    caller: &Option<Tenant>,
    id: &TaskId,
) -> Result<Option<TaskRecord>, Response> {
    ing.store
        .get(id, ing.clock.now_ms())
        .await
        .map(|rec| rec.filter(|r| owns(caller, r)))
        .map_err(|e| store_problem(&e, ing.config.retry_after_secs).into_response())
}

/// Cancels a task that has not finished: a running one drops its model call at its next heartbeat.
#[utoipa::path(
    delete,
    path = "/v1/tasks/{id}",
    tag = "tasks",
    params(("id" = String, Path, description = "The task id (64 lowercase hex characters)", pattern = "^[0-9a-f]{64}$")),
    responses(
        (status = 200, description = "Cancelled", body = TaskView),
        (status = 400, description = "Invalid id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No authenticated tenant (tenancy on)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task (for this tenant)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already finished", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable; retry", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "A stored item could not be read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn cancel_task(
    State(ing): State<Arc<Ingress>>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
) -> Response {
    let caller = match caller(&ing, tenant) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let Ok(id) = TaskId::parse(&id) else {
        return invalid_id();
    };
    // A task id belongs to one tenant for good (the tenant is hashed into it), so checking the owner
    // before the conditional cancel leaves no window for another tenant's record to appear.
    if caller.is_some() {
        match read(&ing, &caller, &id).await {
            Ok(Some(_)) => {}
            Ok(None) => return not_found(),
            Err(resp) => return resp,
        }
    }
    let now = ing.clock.now_ms();
    match ing.store.cancel(&id, now, ing.config.pending_ttl_secs).await {
        Ok(CancelOutcome::Cancelled(rec)) => {
            ing.metrics.cancellations_total.with_label_values(&[rec.lane.as_str()]).inc();
            // Hints for the running worker's heartbeat and (the finished record) for long-polls;
            // the store already holds the truth, so a cache that is down only delays the noticing.
            // The cancel hint carries the cancelled record's fence: it stops the claim it cancelled,
            // never a later run of the same id.
            let (key, fence) = (cancel_key(&id), rec.fence.to_string());
            // The task has ended: its hold on the day's budgets goes back.
            let (hints, ()) = tokio::join!(
                async {
                    tokio::join!(
                        ing.cache.set(&key, &fence, HINT_TTL),
                        publish_finished(&*ing.cache, &rec, ing.config.result_cache_ttl),
                    )
                },
                super::hold::give_back(&*ing.cache, &ing.config.quota, &ing.metrics, &rec),
            );
            for written in [hints.0, hints.1] {
                if let Err(e) = written {
                    warn!(error = %e, "cancellation hint not written");
                }
            }
            view_response(StatusCode::OK, &rec.view())
        }
        Ok(CancelOutcome::Terminal(rec)) => Problem::new(
            StatusCode::CONFLICT,
            "task-finished",
            "Task already finished",
            format!("the task is {} and can no longer be cancelled", rec.status.as_str()),
        )
        .with_field("task_id")
        .into_response(),
        Ok(CancelOutcome::Missing) => not_found(),
        Err(e) => store_problem(&e, ing.config.retry_after_secs).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::domain::fairness::GROUP_ATTRIBUTE;
    use crate::domain::{Lane, TaskMessage};
    use crate::embedded::{
        EmbeddedDb, EmbeddedQueue, EmbeddedQueues, EmbeddedStore, MemoryCache, QueueSettings,
    };
    use crate::ports::UNSENT;
    use crate::ports::{QueueConsume, QueueError};
    use async_trait::async_trait;
    use axum::http::HeaderValue;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use tower::ServiceExt;

    /// A sender that can be switched off, standing in for an unreachable SQS endpoint.
    struct Switchable {
        inner: EmbeddedQueue,
        down: Arc<AtomicBool>,
        stall: Arc<Stall>,
    }

    /// A send that stalls (until released) and then fails, as SQS does in a brown-out.
    #[derive(Default)]
    struct Stall {
        on: AtomicBool,
        entered: tokio::sync::Notify,
        release: tokio::sync::Notify,
    }

    #[async_trait]
    impl QueueSend for Switchable {
        async fn send(
            &self,
            body: &str,
            attributes: BTreeMap<String, String>,
        ) -> Result<crate::domain::MessageId, QueueError> {
            if self.stall.on.swap(false, Ordering::SeqCst) {
                self.stall.entered.notify_one();
                self.stall.release.notified().await;
                return Err(QueueError::Unavailable("timed out".into()));
            }
            if self.down.load(Ordering::SeqCst) {
                return Err(QueueError::Unavailable("connection refused".into()));
            }
            self.inner.send(body, attributes).await
        }
    }

    struct Rig {
        _dir: tempfile::TempDir,
        router: Router,
        clock: Arc<ManualClock>,
        store: EmbeddedStore,
        interactive: EmbeddedQueue,
        down: Arc<AtomicBool>,
        stall: Arc<Stall>,
    }

    async fn rig() -> Rig {
        rig_with(IngressConfig::default()).await
    }

    async fn rig_with(config: IngressConfig) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let store = EmbeddedStore::new(db.clone());
        let all = EmbeddedQueues::open(db, clock.clone(), QueueSettings::default()).await.unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let stall = Arc::new(Stall::default());
        let queues = Lane::ALL.map(|l| {
            let inner = all.queue(l.as_str(), "dlq");
            Arc::new(Switchable { inner, down: down.clone(), stall: stall.clone() }) as Arc<dyn QueueSend>
        });
        let cache = Arc::new(MemoryCache::new(clock.clone()));
        let ingress = Ingress {
            objects: None,
            events: None,
            store: Arc::new(store.clone()),
            cache,
            admission: Arc::new(crate::ports::PutThenSend::new(Arc::new(store.clone()), queues.clone())),
            queues,
            metrics: Metrics::new(),
            clock: clock.clone(),
            config,
        };
        let tenancy = crate::tasks::tenant::Tenancy::Header(axum::http::HeaderName::from_static("x-tenant"));
        Rig {
            router: crate::tasks::tenant::with_header(router(ingress), &tenancy),
            clock,
            store,
            interactive: all.queue("interactive", "dlq"),
            down,
            stall,
            _dir: dir,
        }
    }

    const BODY: &str = r#"{"project_id":"p1","kind":"explain","prompt":"what does main do?","target_files":["src/main.rs"]}"#;

    /// One request as `tenant` (none: no header): status and JSON body.
    async fn as_tenant(
        r: &Rig,
        method: &str,
        uri: &str,
        tenant: Option<&str>,
        body: &str,
    ) -> (StatusCode, serde_json::Value) {
        let mut req = Request::builder().method(method).uri(uri).header("content-type", "application/json");
        if let Some(t) = tenant {
            req = req.header("x-tenant", t);
        }
        let resp = r.router.clone().oneshot(req.body(Body::from(body.to_owned())).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    /// One tenant's burst does not put another tenant's task behind it: each send carries the
    /// tenant's group, and the lane's queue delivers across groups.
    #[tokio::test]
    async fn a_tenants_burst_leaves_another_tenants_task_at_the_front_of_the_lane() {
        let r = rig_with(IngressConfig { tenancy: true, ..Default::default() }).await;
        let body = |i: usize| {
            format!(r#"{{"project_id":"p{i}","kind":"explain","prompt":"burst {i}","target_files":[]}}"#)
        };
        for i in 0..30 {
            assert_eq!(
                as_tenant(&r, "POST", "/v1/tasks", Some("team-a"), &body(i)).await.0,
                StatusCode::ACCEPTED
            );
        }
        let (s, quiet) = as_tenant(&r, "POST", "/v1/tasks", Some("team-b"), BODY).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{quiet}");
        let first = r.interactive.receive(2).await.unwrap();
        let ids: Vec<String> = first
            .iter()
            .filter_map(|m| serde_json::from_str::<TaskMessage>(&m.body).ok())
            .map(|t| t.task_id.to_string())
            .collect();
        assert!(
            ids.iter().any(|id| quiet["task_id"] == id.as_str()),
            "the quiet tenant's task is among the first two"
        );
        let groups: std::collections::HashSet<&str> =
            first.iter().filter_map(|m| m.attributes.get(GROUP_ATTRIBUTE).map(String::as_str)).collect();
        assert_eq!(groups.len(), 2, "one group per tenant, projects aside: {groups:?}");
    }

    /// A tenant's `high` task passes its own older ones; an unknown priority is a 400 naming it.
    #[tokio::test]
    async fn a_high_priority_task_heads_its_tenants_backlog() {
        let r = rig_with(IngressConfig { tenancy: true, ..Default::default() }).await;
        let body = |i: usize, priority: &str| {
            format!(
                r#"{{"project_id":"p","kind":"explain","prompt":"task {i}","target_files":[],"priority":"{priority}"}}"#
            )
        };
        for i in 0..5 {
            let p = if i == 0 { "low" } else { "normal" };
            assert_eq!(
                as_tenant(&r, "POST", "/v1/tasks", Some("team-a"), &body(i, p)).await.0,
                StatusCode::ACCEPTED
            );
        }
        let (s, high) = as_tenant(&r, "POST", "/v1/tasks", Some("team-a"), &body(9, "high")).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{high}");
        let (s, bad) = as_tenant(&r, "POST", "/v1/tasks", Some("team-a"), &body(10, "urgent")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(bad["errors"][0]["field"], "priority", "{bad}");
        let got = r.interactive.receive(10).await.unwrap();
        let mut prompts = Vec::new();
        for m in &got {
            let task: TaskMessage = serde_json::from_str(&m.body).unwrap();
            prompts.push(r.store.get(&task.task_id, r.clock.now_ms()).await.unwrap().unwrap().request.prompt);
        }
        assert_eq!(
            prompts,
            ["task 9", "task 1", "task 2", "task 3", "task 4", "task 0"],
            "high first, low last"
        );
        assert_eq!(
            got[0].attributes.get(crate::domain::fairness::PRIORITY_ATTRIBUTE).map(String::as_str),
            Some("high")
        );
    }

    #[tokio::test]
    async fn tenants_get_their_own_ids_and_never_see_each_others_tasks() {
        let r = rig_with(IngressConfig { tenancy: true, ..Default::default() }).await;
        let (s, a) = as_tenant(&r, "POST", "/v1/tasks", Some("team-a"), BODY).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{a}");
        let (s, b) = as_tenant(&r, "POST", "/v1/tasks", Some("team-b"), BODY).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{b}");
        let (ida, idb) = (a["task_id"].as_str().unwrap(), b["task_id"].as_str().unwrap());
        assert_ne!(ida, idb, "the same payload is a different task per tenant");
        let uri = format!("/v1/tasks/{ida}");
        assert_eq!(
            as_tenant(&r, "GET", &uri, Some("team-a"), "").await.0,
            StatusCode::ACCEPTED,
            "pending, visible"
        );
        assert_eq!(as_tenant(&r, "GET", &uri, Some("team-b"), "").await.0, StatusCode::NOT_FOUND);
        assert_eq!(
            as_tenant(&r, "GET", &format!("{uri}?wait=1"), Some("team-b"), "").await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(as_tenant(&r, "DELETE", &uri, Some("team-b"), "").await.0, StatusCode::NOT_FOUND);
        assert_eq!(
            r.store.get(&ida.parse().unwrap(), r.clock.now_ms()).await.unwrap().unwrap().status,
            TaskStatus::Pending
        );
        // The same Idempotency-Key is two tasks too.
        let keyed = |t: &'static str| {
            let req = Request::post("/v1/tasks")
                .header("content-type", "application/json")
                .header("idempotency-key", "k-1")
                .header("x-tenant", t)
                .body(Body::from(BODY))
                .unwrap();
            r.router.clone().oneshot(req)
        };
        let (ka, kb) = (keyed("team-a").await.unwrap(), keyed("team-b").await.unwrap());
        assert_eq!((ka.status(), kb.status()), (StatusCode::ACCEPTED, StatusCode::ACCEPTED));
        // No tenant: 401, nothing stored; a body cannot name one.
        let (s, p) = as_tenant(&r, "POST", "/v1/tasks", None, BODY).await;
        assert_eq!((s, p["status"].as_u64()), (StatusCode::UNAUTHORIZED, Some(401)), "{p}");
        assert_eq!(as_tenant(&r, "GET", &uri, None, "").await.0, StatusCode::UNAUTHORIZED);
        let forged = BODY.replacen('{', r#"{"tenant":"team-a","#, 1);
        let (s, p) = as_tenant(&r, "POST", "/v1/tasks", Some("team-b"), &forged).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{p}");
        assert!(p.to_string().contains("tenant"), "{p}");
        // The owner cancels.
        assert_eq!(as_tenant(&r, "DELETE", &uri, Some("team-a"), "").await.0, StatusCode::OK);
    }

    async fn post(r: &Rig, body: &str, key: Option<&str>) -> (StatusCode, HeaderMap, serde_json::Value) {
        let mut req = Request::post("/v1/tasks").header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let resp = r.router.clone().oneshot(req.body(Body::from(body.to_owned())).unwrap()).await.unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    /// The request's X-Ray trace header leaves with the task's message, for its worker to continue.
    #[tokio::test]
    async fn the_trace_header_of_the_request_travels_with_the_task() {
        let r = rig().await;
        let h = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let (status, _, _) = crate::trace::scope(Some(h.into()), post(&r, BODY, None)).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        let sent = r.interactive.receive(1).await.unwrap();
        assert_eq!(sent[0].attributes.get(crate::trace::TRACE_HEADER).map(String::as_str), Some(h));
        let other = BODY.replace("main", "lib");
        post(&r, &other, None).await;
        let sent = r.interactive.receive(1).await.unwrap();
        assert!(!sent[0].attributes.contains_key(crate::trace::TRACE_HEADER), "no trace, no header");
    }

    #[tokio::test]
    async fn a_failed_send_answers_503_and_leaves_the_record_for_the_retry_to_send() {
        let r = rig().await;
        r.down.store(true, Ordering::SeqCst);
        let (status, headers, body) = post(&r, BODY, None).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers[header::RETRY_AFTER], "2");
        assert_eq!(headers[header::CONTENT_TYPE], crate::problem::PROBLEM_JSON);
        assert!(!body.to_string().contains("connection refused"), "no internal error text leaks");
        let left = r.store.all(r.clock.now_ms()).await.unwrap();
        assert_eq!((left.len(), left[0].status, left[0].enqueued_at_ms), (1, TaskStatus::Pending, UNSENT));
        r.down.store(false, Ordering::SeqCst);
        let (status, _, again) = post(&r, BODY, None).await;
        assert_eq!(
            (status, again["task_id"].as_str()),
            (StatusCode::ACCEPTED, Some(left[0].task_id.as_str()))
        );
        assert_eq!(r.interactive.depth().await.unwrap().visible, 1, "the retry sent it at once");
        post(&r, BODY, None).await;
        assert_eq!(r.interactive.depth().await.unwrap().visible, 1, "and only once");
    }

    /// A resubmission's record carries the cancelled run's fence: its failed send is marked unsent
    /// all the same, and the retry sends it at once.
    #[tokio::test]
    async fn a_resubmission_whose_send_fails_is_sent_by_the_retry() {
        let r = rig().await;
        let (_, _, body) = post(&r, BODY, None).await;
        call(&r, "DELETE", &format!("/v1/tasks/{}", body["task_id"].as_str().unwrap())).await;
        r.down.store(true, Ordering::SeqCst);
        assert_eq!(post(&r, BODY, None).await.0, StatusCode::SERVICE_UNAVAILABLE);
        let left = r.store.all(r.clock.now_ms()).await.unwrap();
        assert_eq!((left[0].fence, left[0].enqueued_at_ms), (1, UNSENT));
        r.down.store(false, Ordering::SeqCst);
        assert_eq!(post(&r, BODY, None).await.0, StatusCode::ACCEPTED);
        assert_eq!(
            r.interactive.depth().await.unwrap().visible,
            2,
            "the first run's message and the retry's"
        );
    }

    /// A duplicate answered 202 while the first POST's send was failing must not lose its task.
    #[tokio::test]
    async fn a_duplicate_answered_while_the_send_fails_never_reads_404() {
        let r = rig().await;
        r.stall.on.store(true, Ordering::SeqCst);
        let router = r.router.clone();
        let first = tokio::spawn(async move {
            let req = Request::post("/v1/tasks").header("content-type", "application/json");
            router.oneshot(req.body(Body::from(BODY)).unwrap()).await.unwrap().status()
        });
        r.stall.entered.notified().await;
        let (status, _, dup) = post(&r, BODY, None).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{dup}");
        r.stall.release.notify_one();
        assert_eq!(first.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
        let uri = format!("/v1/tasks/{}", dup["task_id"].as_str().unwrap());
        let (status, _, view) = call(&r, "GET", &uri).await;
        assert_eq!((status, view["status"].as_str()), (StatusCode::ACCEPTED, Some("PENDING")), "never 404");
        assert_eq!(r.interactive.depth().await.unwrap().visible, 1, "the read sent the unsent message");
    }

    /// A tenant's day holds two tasks' estimates, whatever the project ids: a third new task is
    /// refused, duplicates hold nothing, and a cancelled task gives its hold back.
    #[tokio::test]
    async fn new_tasks_hold_the_tenants_day_and_a_cancelled_one_gives_it_back() {
        let body = |p: usize| {
            format!(r#"{{"project_id":"p{p}","kind":"explain","prompt":"same","target_files":[]}}"#)
        };
        let mut quota = crate::config::QuotaConfig::default();
        let one = crate::quota::task_estimate(&quota, &TaskRequest::from_json(body(0).as_bytes()).unwrap());
        quota.tenant.daily_tokens = Some(2 * one.tokens);
        let r = rig_with(IngressConfig { quota, tenancy: true, ..Default::default() }).await;
        let post = |p: usize| {
            let body = body(p);
            let r = &r;
            async move { as_tenant(r, "POST", "/v1/tasks", Some("team-a"), &body).await }
        };
        let (s, first) = post(0).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{first}");
        for _ in 0..3 {
            assert_eq!(post(0).await.0, StatusCode::ACCEPTED, "a duplicate, holding nothing");
        }
        assert_eq!(post(1).await.0, StatusCode::ACCEPTED, "the second estimate fits");
        let (s, refused) = post(2).await;
        assert_eq!(
            (s, refused["type"].as_str()),
            (StatusCode::TOO_MANY_REQUESTS, Some("/problems/quota-exceeded"))
        );
        assert_eq!(refused["field"], serde_json::Value::Null, "the tenant's budget, not a project's");
        assert_eq!(
            as_tenant(&r, "POST", "/v1/tasks", Some("team-b"), &body(2)).await.0,
            StatusCode::ACCEPTED,
            "another tenant's day is its own"
        );
        let uri = format!("/v1/tasks/{}", first["task_id"].as_str().unwrap());
        assert_eq!(as_tenant(&r, "DELETE", &uri, Some("team-a"), "").await.0, StatusCode::OK);
        assert_eq!(post(2).await.0, StatusCode::ACCEPTED, "the cancelled task's hold went back");
        assert_eq!(post(3).await.0, StatusCode::TOO_MANY_REQUESTS);
    }

    /// A duplicate of an accepted task gets its task back whatever the project's budget.
    #[tokio::test]
    async fn a_duplicate_of_an_accepted_task_is_answered_over_the_budget() {
        let limits = crate::domain::quota::Limits { daily_tokens: Some(10), ..Default::default() };
        let quota = crate::config::QuotaConfig { project: limits, ..Default::default() };
        let r = rig_with(IngressConfig { quota, ..Default::default() }).await;
        let (s1, _, b1) = post(&r, BODY, None).await;
        assert_eq!(s1, StatusCode::ACCEPTED);
        // The accepted task holds its estimate, more than the day's 10 tokens: the day is spent.
        let (s2, _, b2) = post(&r, BODY, None).await;
        assert_eq!((s2, &b2["task_id"]), (StatusCode::ACCEPTED, &b1["task_id"]), "{b2}");
        let (s3, _, p3) = post(&r, &BODY.replace("main", "lib"), None).await;
        assert_eq!((s3, p3["field"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("project_id")));
        // Completed, and no longer in the cache: the store answers with its result.
        let id = &b1["task_id"].as_str().unwrap().parse().unwrap();
        let now = r.clock.now_ms();
        let crate::ports::ClaimOutcome::Claimed(c) = r.store.claim(id, now, 3600).await.unwrap() else {
            panic!()
        };
        let result = crate::domain::TaskResult {
            text_ref: None,
            text: "t".into(),
            model: "m".into(),
            tokens: Default::default(),
            truncated: false,
            cost_usd: None,
            tier: Default::default(),
            tokens_saved: 0,
        };
        r.store.finish(id, c.fence, crate::ports::Completion::Completed(result), now, 3600).await.unwrap();
        let (s4, _, b4) = post(&r, BODY, None).await;
        assert_eq!((s4, b4["status"].as_str()), (StatusCode::OK, Some("COMPLETED")));
    }

    #[tokio::test]
    async fn a_stale_unclaimed_pending_task_is_sent_again() {
        let r = rig().await;
        let (s1, h1, b1) = post(&r, BODY, None).await;
        assert_eq!(s1, StatusCode::ACCEPTED);
        assert_eq!(h1[header::LOCATION], format!("/v1/tasks/{}", b1["task_id"].as_str().unwrap()));
        // The message is lost (say, purged); within the grace a duplicate does not re-send.
        let lost = r.interactive.receive(10).await.unwrap();
        r.interactive.delete(&lost[0].receipt).await.unwrap();
        r.clock.advance_ms(59_000);
        post(&r, BODY, None).await;
        assert_eq!(r.interactive.depth().await.unwrap().visible, 0);
        r.clock.advance_ms(1_000);
        let (s2, _, b2) = post(&r, BODY, None).await;
        assert_eq!((s2, &b2["task_id"]), (StatusCode::ACCEPTED, &b1["task_id"]));
        assert_eq!(r.interactive.depth().await.unwrap().visible, 1, "re-sent after the grace");
        post(&r, BODY, None).await;
        assert_eq!(r.interactive.depth().await.unwrap().visible, 1, "and the grace restarts");
    }

    #[tokio::test]
    async fn idempotency_key_reused_with_another_payload_is_422() {
        let r = rig().await;
        let (s1, _, b1) = post(&r, BODY, Some("order-1")).await;
        assert_eq!(s1, StatusCode::ACCEPTED);
        let same = BODY.replace("what does", "  what does");
        let (s2, _, b2) = post(&r, &same, Some("order-1")).await;
        assert_eq!((s2, &b2["task_id"]), (StatusCode::ACCEPTED, &b1["task_id"]));
        let other = BODY.replace("explain", "refactor");
        let (s3, _, b3) = post(&r, &other, Some("order-1")).await;
        assert_eq!(s3, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(b3["field"], "Idempotency-Key");
        let (s4, _, b4) = post(&r, BODY, Some("bad key")).await;
        assert_eq!((s4, b4["field"].as_str()), (StatusCode::BAD_REQUEST, Some("Idempotency-Key")));
    }

    #[tokio::test]
    async fn get_validates_the_id_and_404s_unknown_tasks() {
        let r = rig().await;
        let get = |uri: &str| Request::get(uri).body(Body::empty()).unwrap();
        let resp = r.router.clone().oneshot(get("/v1/tasks/nothex")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let resp = r.router.clone().oneshot(get(&format!("/v1/tasks/{}", "a".repeat(64)))).await.unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], crate::problem::PROBLEM_JSON);
        let resp = r.router.clone().oneshot(get("/healthz")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }

    async fn call(r: &Rig, method: &str, uri: &str) -> (StatusCode, HeaderMap, serde_json::Value) {
        let req = Request::builder().method(method).uri(uri).body(Body::empty()).unwrap();
        let resp = r.router.clone().oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    #[tokio::test]
    async fn commit_summaries_are_not_tasks() {
        let r = rig().await;
        let body = BODY.replace("explain", "commit_summary");
        let (status, _, problem) = post(&r, &body, None).await;
        assert_eq!((status, problem["errors"][0]["field"].as_str()), (StatusCode::BAD_REQUEST, Some("kind")));
        assert!(r.store.all(r.clock.now_ms()).await.unwrap().is_empty(), "nothing stored");
    }

    #[tokio::test]
    async fn every_202_says_when_to_look_again() {
        let r = rig().await;
        let (status, headers, body) = post(&r, BODY, None).await;
        assert_eq!((status, &headers[header::RETRY_AFTER]), (StatusCode::ACCEPTED, &HeaderValue::from(1)));
        let (status, headers, _) =
            call(&r, "GET", &format!("/v1/tasks/{}", body["task_id"].as_str().unwrap())).await;
        assert_eq!(status, StatusCode::ACCEPTED, "an unfinished task is 202 on GET too");
        assert!(headers.contains_key(header::RETRY_AFTER) && headers.contains_key(header::LOCATION));
    }

    #[tokio::test]
    async fn cancellation_of_a_pending_task_then_a_resubmission_runs_again() {
        let r = rig().await;
        let (_, _, body) = post(&r, BODY, None).await;
        let id = body["task_id"].as_str().unwrap().to_owned();
        let uri = format!("/v1/tasks/{id}");
        let (status, _, view) = call(&r, "DELETE", &uri).await;
        assert_eq!((status, view["status"].as_str()), (StatusCode::OK, Some("CANCELLED")));
        let (status, headers, problem) = call(&r, "DELETE", &uri).await;
        assert_eq!((status, problem["field"].as_str()), (StatusCode::CONFLICT, Some("task_id")));
        assert_eq!(headers[header::CONTENT_TYPE], crate::problem::PROBLEM_JSON);
        assert_eq!(
            r.store.get(&id.parse().unwrap(), r.clock.now_ms()).await.unwrap().unwrap().status,
            TaskStatus::Cancelled
        );
        let (status, _, _) = call(&r, "DELETE", &format!("/v1/tasks/{}", "b".repeat(64))).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _, _) = call(&r, "DELETE", "/v1/tasks/NOT-AN-ID").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        // The same payload again: a new run of the same task id.
        let (status, _, again) = post(&r, BODY, None).await;
        assert_eq!(
            (status, again["task_id"].as_str(), again["status"].as_str()),
            (StatusCode::ACCEPTED, Some(id.as_str()), Some("PENDING"))
        );
        assert_eq!(r.interactive.depth().await.unwrap().visible, 2, "the resubmission was sent");
    }

    #[tokio::test]
    async fn a_get_re_sends_an_orphaned_pending_task() {
        let r = rig().await;
        let (_, _, body) = post(&r, BODY, None).await;
        let uri = format!("/v1/tasks/{}", body["task_id"].as_str().unwrap());
        // The message is lost (a crash between the put and the send would leave the same state).
        let lost = r.interactive.receive(10).await.unwrap();
        r.interactive.delete(&lost[0].receipt).await.unwrap();
        call(&r, "GET", &uri).await;
        assert_eq!(r.interactive.depth().await.unwrap().visible, 0, "within the grace, nothing is re-sent");
        r.clock.advance_ms(60_000);
        call(&r, "GET", &uri).await;
        assert_eq!(r.interactive.depth().await.unwrap().visible, 1, "a poll re-sends it");
        call(&r, "GET", &uri).await;
        assert_eq!(r.interactive.depth().await.unwrap().visible, 1, "once per grace");
    }

    /// A task still queued after the grace is re-sent once, not once per poll, and the wait
    /// doubles with each re-send.
    #[tokio::test]
    async fn polls_of_a_queued_task_re_send_it_once_per_doubling_wait() {
        let r = rig().await;
        let (_, _, body) = post(&r, BODY, None).await;
        let uri = format!("/v1/tasks/{}", body["task_id"].as_str().unwrap());
        r.clock.advance_ms(61_000);
        let polls: Vec<_> = (0..10).map(|_| call(&r, "GET", &uri)).collect();
        futures::future::join_all(polls).await;
        assert_eq!(r.interactive.depth().await.unwrap().visible, 2, "ten polls, one re-send");
        r.clock.advance_ms(50_000);
        call(&r, "GET", &uri).await;
        assert_eq!(
            r.interactive.depth().await.unwrap().visible,
            2,
            "the next wait is the age at the re-send"
        );
        r.clock.advance_ms(12_000);
        call(&r, "GET", &uri).await;
        assert_eq!(r.interactive.depth().await.unwrap().visible, 3);
    }

    #[tokio::test]
    async fn long_poll_answers_when_the_task_ends_and_bad_waits_are_refused() {
        let r = rig().await;
        let (_, _, body) = post(&r, BODY, None).await;
        let id = body["task_id"].as_str().unwrap().to_owned();
        for bad in ["wait=21", "wait=-1", "wait=soon", "wiat=3"] {
            let (status, _, problem) = call(&r, "GET", &format!("/v1/tasks/{id}?{bad}")).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(problem["field"].is_string(), "{bad}: {problem}");
        }
        let (router, uri) = (r.router.clone(), format!("/v1/tasks/{id}?wait=10"));
        let started = std::time::Instant::now();
        let poll = tokio::spawn(async move {
            let resp = router.oneshot(Request::get(uri).body(Body::empty()).unwrap()).await.unwrap();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!poll.is_finished(), "an unfinished task holds the long-poll");
        // A client cancels it: the long-poll answers at once (the hint wakes it, the store answers).
        let (status, _, _) = call(&r, "DELETE", &format!("/v1/tasks/{id}")).await;
        assert_eq!(status, StatusCode::OK);
        let view = poll.await.unwrap();
        assert_eq!(view["status"], "CANCELLED");
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    }
}
