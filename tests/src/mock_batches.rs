//! An emulator of OpenAI's Files and Batch APIs, and of Anthropic's Message Batches, on loopback, from their documented shapes, on an
//! injected clock so a 24-hour window passes in a test:
//! - `POST /v1/files` (multipart, `purpose=batch`) and `GET /v1/files/{id}/content`;
//! - `POST /v1/batches`, `GET /v1/batches` (newest first, `limit`/`after`, `has_more`),
//!   `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`;
//! - status `validating` -> `in_progress` -> `finalizing` -> `completed`, or `expired` when the
//!   window passes first (the requests finished by then answered, the rest in the error file as
//!   `batch_expired`), or `cancelling` -> `cancelled` (the same, up to the cancellation);
//! - Anthropic's Message Batches beside them (`/v1/messages/batches`: create, list with
//!   `after_id`, retrieve, `results`, `cancel`), on the same clock and pace, results as
//!   `succeeded`, `errored`, `expired` or `canceled`;
//! - per-line errors (a request whose prompt holds a marker the test chose at run time, so no
//!   diff of this source holds it, fails with a 400 in the error file).
//!
//! Requests finish one after another, `per_request` apart, after `validating`. A commit-summary
//! request is answered as a model following the prompt would be; the emulator counts every sha it
//! answered, so a test sees a commit answered twice.

use axum::Json;
use axum::extract::{Multipart, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use lanes_core::clock::SharedClock;
use lanes_core::domain::batch::{BatchPhase, BatchRecord};
use lanes_core::ports::StoreError;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The emulator's timing.
#[derive(Debug, Clone, Copy)]
pub struct BatchTiming {
    /// Time in `validating`.
    pub validating: Duration,
    /// Time per request once in progress.
    pub per_request: Duration,
    /// The completion window (24 hours at OpenAI).
    pub window: Duration,
    /// Time from a cancel to `cancelled`.
    pub cancelling: Duration,
    /// When set, each batch's window passes once this share of its requests is answered, whatever
    /// its size (a way to expire every batch part-done).
    pub window_share: Option<f64>,
}

impl Default for BatchTiming {
    fn default() -> Self {
        Self {
            validating: Duration::from_secs(60),
            per_request: Duration::from_secs(30),
            window: Duration::from_secs(24 * 3600),
            cancelling: Duration::from_secs(120),
            window_share: None,
        }
    }
}

struct Batch {
    id: String,
    input: Vec<Value>,
    created_ms: u64,
    metadata: Value,
    cancel_ms: Option<u64>,
    files: Option<(Option<String>, Option<String>)>,
    /// Made through Anthropic's Message Batches (its requests kept in OpenAI's line shape).
    anthropic: bool,
}

#[derive(Default)]
struct St {
    files: HashMap<String, String>,
    batches: Vec<Batch>,
    answered: HashMap<String, u32>,
    requests: u64,
    next: u64,
}

struct Shared {
    st: Mutex<St>,
    clock: SharedClock,
    timing: Mutex<BatchTiming>,
    fail: Mutex<Option<String>>,
}

impl Shared {
    fn st(&self) -> std::sync::MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What a batch's view depends on now: the time, the pace, the failing marker.
    fn moment(&self) -> (u64, BatchTiming, Option<String>) {
        let timing = *self.timing.lock().unwrap_or_else(|e| e.into_inner());
        (self.clock.now_ms(), timing, self.fail.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// The running emulator.
pub struct MockBatches {
    /// Base URL, `http://127.0.0.1:PORT/v1`.
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl MockBatches {
    /// Starts on a free loopback port, on `clock`.
    pub async fn start(clock: SharedClock, timing: BatchTiming) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            st: Default::default(),
            clock,
            timing: Mutex::new(timing),
            fail: Mutex::new(None),
        });
        let app = axum::Router::new()
            .route("/v1/files", post(upload))
            .route("/v1/files/{id}/content", get(content))
            .route("/v1/batches", post(create).get(list))
            .route("/v1/batches/{id}", get(retrieve))
            .route("/v1/batches/{id}/cancel", post(cancel))
            .route("/v1/messages/batches", post(anthropic::create).get(anthropic::list))
            .route("/v1/messages/batches/{id}", get(anthropic::retrieve))
            .route("/v1/messages/batches/{id}/results", get(anthropic::results))
            .route("/v1/messages/batches/{id}/cancel", post(anthropic::cancel))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/v1", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, shared, task })
    }

    /// Changes the timing of batches made from now and of those under way.
    pub fn set_timing(&self, timing: BatchTiming) {
        *self.shared.timing.lock().unwrap_or_else(|e| e.into_inner()) = timing;
    }

    /// Fails alone, with a 400, each request whose prompt contains `marker`.
    pub fn fail_requests_containing(&self, marker: &str) {
        *self.shared.fail.lock().unwrap_or_else(|e| e.into_inner()) = Some(marker.to_owned());
    }

    /// Batches made.
    pub fn batches(&self) -> usize {
        self.shared.st().batches.len()
    }

    /// Requests it served (files, batches, lists, polls, cancels).
    pub fn requests(&self) -> usize {
        self.shared.st().requests as usize
    }

    /// How many times each sha was answered.
    pub fn answered(&self) -> HashMap<String, u32> {
        self.shared.st().answered.clone()
    }
}

impl Drop for MockBatches {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": {"message": message, "type": "invalid_request_error"}}))).into_response()
}

async fn upload(State(s): State<Arc<Shared>>, mut form: Multipart) -> Response {
    s.st().requests += 1;
    let (mut purpose, mut file) = (None, None);
    while let Ok(Some(field)) = form.next_field().await {
        match field.name() {
            Some("purpose") => purpose = field.text().await.ok(),
            Some("file") => file = field.text().await.ok(),
            _ => {}
        }
    }
    let (Some(purpose), Some(file)) = (purpose, file) else {
        return error(StatusCode::BAD_REQUEST, "purpose and file are required");
    };
    if purpose != "batch" {
        return error(StatusCode::BAD_REQUEST, "purpose must be batch here");
    }
    for line in file.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            return error(StatusCode::BAD_REQUEST, "each line must be JSON");
        };
        if v["custom_id"].as_str().is_none() || v["method"] != "POST" || v["url"] != "/v1/chat/completions" {
            return error(StatusCode::BAD_REQUEST, "each line needs custom_id, method POST and url");
        }
    }
    let mut st = s.st();
    st.next += 1;
    let id = format!("file-{}", st.next);
    let bytes = file.len();
    st.files.insert(id.clone(), file);
    Json(json!({"id": id, "object": "file", "bytes": bytes, "created_at": s.clock.now_ms() / 1000,
        "filename": "batch.jsonl", "purpose": "batch"}))
    .into_response()
}

async fn content(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    s.st().requests += 1;
    match s.st().files.get(&id) {
        Some(text) => text.clone().into_response(),
        None => error(StatusCode::NOT_FOUND, "no such file"),
    }
}

async fn create(State(s): State<Arc<Shared>>, Json(body): Json<Value>) -> Response {
    s.st().requests += 1;
    if body["endpoint"] != "/v1/chat/completions" || body["completion_window"] != "24h" {
        return error(StatusCode::BAD_REQUEST, "endpoint and a 24h completion_window are required");
    }
    let mut st = s.st();
    let Some(input) = body["input_file_id"].as_str().and_then(|f| st.files.get(f)) else {
        return error(StatusCode::BAD_REQUEST, "input_file_id names no file");
    };
    let input: Vec<Value> = input.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    st.next += 1;
    let batch = Batch {
        id: format!("batch_{}", st.next),
        input,
        created_ms: s.clock.now_ms(),
        metadata: body["metadata"].clone(),
        cancel_ms: None,
        files: None,
        anthropic: false,
    };
    st.batches.push(batch);
    let (now, timing, fail) = s.moment();
    let st = &mut *st;
    let Some(b) = st.batches.last_mut() else { return error(StatusCode::INTERNAL_SERVER_ERROR, "lost") };
    Json(view(b, now, (&timing, fail.as_deref()), &mut st.files, &mut st.answered)).into_response()
}

async fn list(State(s): State<Arc<Shared>>, Query(q): Query<HashMap<String, String>>) -> Response {
    s.st().requests += 1;
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(20).clamp(1, 100);
    let (now, timing, fail) = s.moment();
    let mut guard = s.st();
    let st = &mut *guard;
    let mut newest_first: Vec<&mut Batch> = st.batches.iter_mut().rev().filter(|b| !b.anthropic).collect();
    if let Some(after) = q.get("after") {
        let skip = newest_first.iter().position(|b| &b.id == after).map_or(0, |i| i + 1);
        newest_first.drain(..skip);
    }
    let has_more = newest_first.len() > limit;
    let data: Vec<Value> = newest_first
        .into_iter()
        .take(limit)
        .map(|b| view(b, now, (&timing, fail.as_deref()), &mut st.files, &mut st.answered))
        .collect();
    Json(json!({"object": "list", "data": data, "has_more": has_more,
        "first_id": data.first().map(|b| b["id"].clone()), "last_id": data.last().map(|b| b["id"].clone())}))
    .into_response()
}

async fn retrieve(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    s.st().requests += 1;
    let (now, timing, fail) = s.moment();
    let mut guard = s.st();
    let st = &mut *guard;
    match st.batches.iter_mut().find(|b| b.id == id) {
        Some(b) => {
            Json(view(b, now, (&timing, fail.as_deref()), &mut st.files, &mut st.answered)).into_response()
        }
        None => error(StatusCode::NOT_FOUND, "no such batch"),
    }
}

async fn cancel(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    s.st().requests += 1;
    let (now, timing, fail) = s.moment();
    let mut guard = s.st();
    let st = &mut *guard;
    let Some(b) = st.batches.iter_mut().find(|b| b.id == id) else {
        return error(StatusCode::NOT_FOUND, "no such batch");
    };
    let v = view(b, now, (&timing, fail.as_deref()), &mut st.files, &mut st.answered);
    if !matches!(v["status"].as_str(), Some("validating" | "in_progress" | "finalizing")) {
        return error(StatusCode::CONFLICT, &format!("a batch {} cannot be cancelled", v["status"]));
    }
    b.cancel_ms = Some(now);
    Json(view(b, now, (&timing, fail.as_deref()), &mut st.files, &mut st.answered)).into_response()
}

/// The batch as the API shows it at `now`, writing its output and error files when it ends.
fn view(
    b: &mut Batch,
    now: u64,
    (t, fail): (&BatchTiming, Option<&str>),
    files: &mut HashMap<String, String>,
    answered: &mut HashMap<String, u32>,
) -> Value {
    let ms = |d: Duration| d.as_millis() as u64;
    let started = b.created_ms + ms(t.validating);
    let done_at = started + ms(t.per_request) * b.input.len() as u64;
    let expires = match t.window_share {
        Some(share) => {
            let answered = (b.input.len() as f64 * share).ceil() as u64;
            started + ms(t.per_request) * answered + ms(t.per_request) / 2
        }
        None => b.created_ms + ms(t.window),
    };
    let (status, cut) = match b.cancel_ms {
        Some(c) if now >= c + ms(t.cancelling) => ("cancelled", Some(c)),
        Some(_) => ("cancelling", None),
        None if done_at <= expires && now > done_at => ("completed", Some(done_at)),
        None if now >= expires && done_at > expires => ("expired", Some(expires)),
        None if now >= done_at => ("finalizing", None),
        None if now >= started => ("in_progress", None),
        None => ("validating", None),
    };
    if let (Some(cut), None) = (cut, &b.files) {
        let finished = (cut.saturating_sub(started) / ms(t.per_request).max(1)) as usize;
        b.files = Some(write_files(b, (finished, status, fail), files, answered));
    }
    let (output, errors) = b.files.clone().unwrap_or((None, None));
    let finished = (now.saturating_sub(started) / ms(t.per_request).max(1)).min(b.input.len() as u64);
    json!({"id": b.id, "object": "batch", "endpoint": "/v1/chat/completions", "errors": null,
        "completion_window": "24h", "status": status, "output_file_id": output, "error_file_id": errors,
        "created_at": b.created_ms / 1000, "expires_at": expires / 1000,
        "cancelling_at": b.cancel_ms.map(|c| c / 1000),
        "request_counts": {"total": b.input.len(), "completed": finished, "failed": 0},
        "metadata": b.metadata})
}

/// The output file (the first `finished` requests answered, or failed alone) and the error file
/// (the failed, and the rest as not executed).
fn write_files(
    b: &Batch,
    (finished, status, fail): (usize, &str, Option<&str>),
    files: &mut HashMap<String, String>,
    answered: &mut HashMap<String, u32>,
) -> (Option<String>, Option<String>) {
    let (mut out, mut err) = (String::new(), String::new());
    for (i, line) in b.input.iter().enumerate() {
        let custom_id = line["custom_id"].clone();
        let body = &line["body"];
        let prompt: String =
            body["messages"].as_array().into_iter().flatten().filter_map(|m| m["content"].as_str()).collect();
        let row = if i >= finished {
            let code = if status == "expired" { "batch_expired" } else { "batch_cancelled" };
            json!({"id": format!("batch_req_{i}"), "custom_id": custom_id, "response": null,
                "error": {"code": code, "message": "This request could not be executed before the batch ended."}})
        } else if fail.is_some_and(|m| prompt.contains(m)) {
            json!({"id": format!("batch_req_{i}"), "custom_id": custom_id, "response": {"status_code": 400,
                "request_id": format!("req_{i}"), "body": {"error": {"message": "invalid prompt", "type": "invalid_request_error"}}},
                "error": null})
        } else {
            let text = lanes_core::commits::prompt::offline_answer(&prompt)
                .replace("[offline heuristic, not an LLM]", "[mock]");
            for sha in prompt.split("=== commit ").skip(1).filter_map(|s| s.split_whitespace().next()) {
                if sha.len() == 40 && sha.bytes().all(|c| c.is_ascii_hexdigit()) {
                    *answered.entry(sha.to_owned()).or_default() += 1;
                }
            }
            let (p, c) = (prompt.len().div_ceil(4), text.len().div_ceil(4));
            json!({"id": format!("batch_req_{i}"), "custom_id": custom_id, "response": {"status_code": 200,
                "request_id": format!("req_{i}"), "body": {"id": format!("chatcmpl-{i}"), "object": "chat.completion",
                "model": body["model"], "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                "finish_reason": "stop"}], "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}},
                "error": null})
        };
        let target = if row["response"]["status_code"] == 200 { &mut out } else { &mut err };
        target.push_str(&row.to_string());
        target.push('\n');
    }
    let mut file = |text: String, n: usize| {
        (!text.is_empty()).then(|| {
            let id = format!("file-{}-{n}", b.id);
            files.insert(id.clone(), text);
            id
        })
    };
    (file(out, 1), file(err, 2))
}

/// Anthropic's Message Batches, on the same batches: a request is kept as OpenAI's line would be
/// (its system prompt first among the messages), and its result read back from the files.
mod anthropic {
    use super::*;

    fn rfc3339(ms: u64) -> String {
        humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
    }

    pub(super) async fn create(State(s): State<Arc<Shared>>, Json(body): Json<Value>) -> Response {
        s.st().requests += 1;
        let Some(requests) = body["requests"].as_array().filter(|r| !r.is_empty()) else {
            return error(StatusCode::BAD_REQUEST, "requests: at least one is required");
        };
        let mut input = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for r in requests {
            let id = r["custom_id"].as_str().unwrap_or("");
            let valid = !id.is_empty()
                && id.len() <= 64
                && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
            if !valid || !seen.insert(id.to_owned()) {
                return error(
                    StatusCode::BAD_REQUEST,
                    "custom_id: 1 to 64 of [a-zA-Z0-9_-], unique in the batch",
                );
            }
            let p = &r["params"];
            if p["model"].as_str().is_none()
                || p["max_tokens"].as_u64().is_none()
                || !p["messages"].is_array()
            {
                return error(StatusCode::BAD_REQUEST, "params: model, max_tokens and messages are required");
            }
            let mut messages = vec![json!({"role": "system", "content": p["system"]})];
            messages.extend(p["messages"].as_array().into_iter().flatten().cloned());
            input.push(json!({"custom_id": id, "body": {"model": p["model"], "messages": messages}}));
        }
        let (now, timing, fail) = s.moment();
        let mut guard = s.st();
        let st = &mut *guard;
        st.next += 1;
        let id = format!("msgbatch_{}", st.next);
        st.batches.push(Batch {
            id,
            input,
            created_ms: now,
            metadata: Value::Null,
            cancel_ms: None,
            files: None,
            anthropic: true,
        });
        let Some(b) = st.batches.last_mut() else { return error(StatusCode::INTERNAL_SERVER_ERROR, "lost") };
        Json(view(b, now, (&timing, fail.as_deref()), &mut st.files, &mut st.answered)).into_response()
    }

    /// The batch as Anthropic shows it, from OpenAI's view of it.
    fn view(
        b: &mut Batch,
        now: u64,
        how: (&BatchTiming, Option<&str>),
        files: &mut HashMap<String, String>,
        answered: &mut HashMap<String, u32>,
    ) -> Value {
        let v = super::view(b, now, how, files, answered);
        let status = match v["status"].as_str() {
            Some("cancelling") => "canceling",
            Some("completed" | "expired" | "cancelled") => "ended",
            _ => "in_progress",
        };
        let lines = results_of(b, files);
        let count = |t: &str| lines.iter().filter(|l| l["result"]["type"] == t).count();
        let ended = status == "ended";
        let processing = if ended { 0 } else { b.input.len() };
        json!({"id": b.id, "type": "message_batch", "processing_status": status,
            "request_counts": {"processing": processing, "succeeded": count("succeeded"), "errored": count("errored"),
                "canceled": count("canceled"), "expired": count("expired")},
            "created_at": rfc3339(b.created_ms), "expires_at": rfc3339(b.created_ms + 86_400_000),
            "cancel_initiated_at": b.cancel_ms.map(rfc3339), "ended_at": ended.then(|| rfc3339(now)),
            "results_url": ended.then(|| format!("/v1/messages/batches/{}/results", b.id))})
    }

    /// An ended batch's result lines, in Anthropic's shape.
    fn results_of(b: &Batch, files: &HashMap<String, String>) -> Vec<Value> {
        let Some((output, errors)) = &b.files else { return Vec::new() };
        let text = |f: &Option<String>| f.as_ref().and_then(|f| files.get(f)).cloned().unwrap_or_default();
        let mut out = Vec::new();
        for line in text(output).lines().chain(text(errors).lines()) {
            let Ok(l) = serde_json::from_str::<Value>(line) else { continue };
            let body = &l["response"]["body"];
            let result = match (l["response"]["status_code"].as_u64(), l["error"]["code"].as_str()) {
                (Some(200), _) => {
                    json!({"type": "succeeded", "message": {"id": body["id"], "type": "message",
                    "role": "assistant", "model": body["model"],
                    "content": [{"type": "text", "text": body["choices"][0]["message"]["content"]}],
                    "stop_reason": "end_turn", "usage": {"input_tokens": body["usage"]["prompt_tokens"],
                    "output_tokens": body["usage"]["completion_tokens"]}}})
                }
                (Some(_), _) => json!({"type": "errored", "error": {"type": "error", "error":
                    {"type": "invalid_request_error", "message": body["error"]["message"]}}}),
                (None, Some("batch_expired")) => json!({"type": "expired"}),
                _ => json!({"type": "canceled"}),
            };
            out.push(json!({"custom_id": l["custom_id"], "result": result}));
        }
        out
    }

    fn find<'a>(st: &'a mut St, id: &str) -> Option<&'a mut Batch> {
        st.batches.iter_mut().find(|b| b.anthropic && b.id == id)
    }

    pub(super) async fn retrieve(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
        s.st().requests += 1;
        let (now, timing, fail) = s.moment();
        let mut guard = s.st();
        let st = &mut *guard;
        let Some(b) = st.batches.iter_mut().find(|b| b.anthropic && b.id == id) else {
            return error(StatusCode::NOT_FOUND, "no such batch");
        };
        Json(view(b, now, (&timing, fail.as_deref()), &mut st.files, &mut st.answered)).into_response()
    }

    pub(super) async fn results(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
        s.st().requests += 1;
        let mut guard = s.st();
        let st = &mut *guard;
        let files = st.files.clone();
        match find(st, &id) {
            Some(b) if b.files.is_some() => {
                results_of(b, &files).iter().map(|l| format!("{l}\n")).collect::<String>().into_response()
            }
            Some(_) => error(StatusCode::BAD_REQUEST, "the batch has not ended"),
            None => error(StatusCode::NOT_FOUND, "no such batch"),
        }
    }

    pub(super) async fn list(
        State(s): State<Arc<Shared>>,
        Query(q): Query<HashMap<String, String>>,
    ) -> Response {
        s.st().requests += 1;
        let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(20).clamp(1, 100);
        let (now, timing, fail) = s.moment();
        let mut guard = s.st();
        let st = &mut *guard;
        let mut newest_first: Vec<&mut Batch> = st.batches.iter_mut().rev().filter(|b| b.anthropic).collect();
        if let Some(after) = q.get("after_id") {
            let skip = newest_first.iter().position(|b| &b.id == after).map_or(0, |i| i + 1);
            newest_first.drain(..skip);
        }
        let has_more = newest_first.len() > limit;
        let data: Vec<Value> = newest_first
            .into_iter()
            .take(limit)
            .map(|b| view(b, now, (&timing, fail.as_deref()), &mut st.files, &mut st.answered))
            .collect();
        Json(json!({"data": data, "has_more": has_more,
            "first_id": data.first().map(|b| b["id"].clone()), "last_id": data.last().map(|b| b["id"].clone())}))
        .into_response()
    }

    pub(super) async fn cancel(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
        s.st().requests += 1;
        let (now, timing, fail) = s.moment();
        let mut guard = s.st();
        let st = &mut *guard;
        let Some(b) = st.batches.iter_mut().find(|b| b.anthropic && b.id == id) else {
            return error(StatusCode::NOT_FOUND, "no such batch");
        };
        let v = view(b, now, (&timing, fail.as_deref()), &mut st.files, &mut st.answered);
        if v["processing_status"] != "in_progress" {
            return error(StatusCode::CONFLICT, "only a batch in progress can be canceled");
        }
        b.cancel_ms = Some(now);
        Json(view(b, now, (&timing, fail.as_deref()), &mut st.files, &mut st.answered)).into_response()
    }
}

/// A batch store that fails to record a batch's provider id the first `fail` times (a crash
/// between submission and record, as the worker sees it), and whose next `blind` lookups of the
/// carriers find nothing (a read that raced ahead of another delivery's record write).
pub struct Forgetful {
    /// The store it forgets in front of.
    pub inner: Arc<dyn lanes_core::ports::BatchStore>,
    /// Updates still to fail.
    pub fail: std::sync::atomic::AtomicU32,
    /// Carrier lookups still to find nothing.
    pub blind: std::sync::atomic::AtomicU32,
}

impl Forgetful {
    /// In front of `inner`, failing the first `fail` updates.
    pub fn new(inner: Arc<dyn lanes_core::ports::BatchStore>, fail: u32) -> Self {
        Self { inner, fail: fail.into(), blind: 0.into() }
    }
}

#[async_trait::async_trait]
impl lanes_core::ports::BatchStore for Forgetful {
    async fn create_batch(&self, r: &BatchRecord) -> Result<bool, StoreError> {
        self.inner.create_batch(r).await
    }
    async fn update_batch(&self, r: &BatchRecord, expect: BatchPhase) -> Result<bool, StoreError> {
        use std::sync::atomic::Ordering;
        if self.fail.load(Ordering::SeqCst) > 0 {
            self.fail.fetch_sub(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable("the worker died here".into()));
        }
        self.inner.update_batch(r, expect).await
    }
    async fn open_batches(&self, limit: usize) -> Result<Vec<BatchRecord>, StoreError> {
        self.inner.open_batches(limit).await
    }
    async fn batched(
        &self,
        keys: &[String],
    ) -> Result<HashMap<String, lanes_core::domain::batch::Carrier>, StoreError> {
        use std::sync::atomic::Ordering;
        if self.blind.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Ok(HashMap::new());
        }
        self.inner.batched(keys).await
    }
    async fn close_batch(&self, r: &BatchRecord) -> Result<(), StoreError> {
        self.inner.close_batch(r).await
    }
}
