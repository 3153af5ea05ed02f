//! A provider emulator on loopback speaking the OpenAI chat-completions and Anthropic Messages shapes,
//! for tests and for `lanes bench limiter` (which must measure against something that enforces limits
//! like a provider, offline).
//! It answers from a script (statuses with headers, slow answers) and then normally, records every
//! request it got, and can enforce its own requests/tokens per window like a provider, answering 429
//! with `retry-after-ms` when a request would exceed them.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One scripted answer, used once, in order.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// An error status with headers (e.g. 429 with `retry-after`).
    Status(u16, Vec<(&'static str, String)>),
    /// A normal answer after a delay.
    Slow(Duration),
    /// A chat completion (OpenAI's shape) with this text, finished normally.
    Answer(String),
    /// OpenAI's refusal of a flex call for want of capacity: `429 Resource Unavailable`.
    FlexUnavailable,
    /// A streamed answer with this text, cut (the connection closed, no `[DONE]`) after this many
    /// of its chunks; asked without `stream`, a 500.
    StreamCut(String, usize),
    /// A streamed answer with this text that stops after this many of its chunks and stays open,
    /// silent, for this long before it closes (no `[DONE]`); asked without `stream`, a 500.
    StreamStall(String, usize, Duration),
}

/// What the mock saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Request path.
    pub path: String,
    /// Headers.
    pub headers: HeaderMap,
    /// JSON body.
    pub body: Value,
}

/// How a provider counts its limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Discipline {
    /// Continuously refilled buckets, starting full.
    #[default]
    TokenBucket,
    /// Counters reset at each calendar window boundary (a full limit at the start of every window).
    FixedWindow,
    /// The requests and tokens of the last window, whenever it starts.
    SlidingWindow,
}

/// Where a 429 says when to come back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Hint {
    /// `retry-after-ms` and `retry-after`.
    #[default]
    Both,
    /// `retry-after` (whole seconds) only.
    RetryAfter,
    /// `retry-after-ms` only.
    RetryAfterMs,
    /// A vendor-prefixed `x-vendor-retry-after` (seconds) only.
    Vendor,
    /// No hint at all (a provider in slow start).
    None,
}

/// A provider's own limits: requests and tokens per window, counted by `discipline`; whether it
/// states them in `x-ratelimit-*` headers; how its 429s hint.
#[derive(Debug, Clone, Copy, Default)]
pub struct MockLimits {
    /// Requests per window.
    pub rpm: f64,
    /// Tokens (prompt + completion) per window.
    pub tpm: f64,
    /// The window.
    pub window: Duration,
    /// How the limits are counted.
    pub discipline: Discipline,
    /// Whether answers carry `x-ratelimit-limit-*`, `-remaining-*` and `-reset-*`.
    pub headers: bool,
    /// How a 429 hints.
    pub hint: Hint,
}

struct Buckets {
    limits: MockLimits,
    levels: [f64; 2],
    at: std::time::Instant,
    started: std::time::Instant,
    window_index: u64,
    log: VecDeque<(std::time::Instant, f64)>,
}

/// What a served request leaves of the budget, for the rate-limit headers.
#[derive(Debug, Clone, Copy, Default)]
struct Remaining {
    requests: f64,
    tokens: f64,
    reset: Duration,
}

/// What the mock's limiter saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct MockUsage {
    /// Requests answered.
    pub served: u64,
    /// Tokens answered.
    pub tokens: u64,
    /// Requests refused with 429 for exceeding the limits.
    pub throttled: u64,
}

#[derive(Default)]
struct MockState {
    script: Mutex<VecDeque<Scripted>>,
    seen: Mutex<Vec<Seen>>,
    buckets: Mutex<Option<Buckets>>,
    usage: Mutex<MockUsage>,
    /// Models that have no flex tier: a flex call to one is refused with a 400.
    no_flex: Mutex<Vec<String>>,
    /// How flex calls are served ([`MockLlm::flex_capacity`]).
    flex: Mutex<FlexCapacity>,
    /// Each commit summarized in an answer, by sha, and how many answers carried it.
    answered_commits: Mutex<std::collections::HashMap<String, u32>>,
    /// Anthropic answers as an organisation with Priority Tier capacity: `usage.service_tier` says
    /// `priority` (else `standard`).
    anthropic_priority: std::sync::atomic::AtomicBool,
    /// A model that takes no prefill ([`MockLlm::refuse_prefill`]).
    no_prefill: std::sync::atomic::AtomicBool,
    /// Streamed chat completions at a fixed rate ([`MockLlm::pace`]).
    pace: Mutex<Option<Pace>>,
    /// The cut of the last `StreamCut` used by a request without `stream` in its body (Bedrock's
    /// ConverseStream says it streams by its path).
    last_cut: Mutex<Option<usize>>,
}

/// A fixed-rate stream: every streamed chat completion is `chunks` chunks, one each `interval`.
/// Each chunk's text is `@<µs>;` (the Unix time in microseconds at which the emulator wrote it) then
/// `pad` bytes, so a client that reads the text knows when each piece left the provider.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Chunks of text per answer.
    pub chunks: usize,
    /// Time between chunks.
    pub interval: Duration,
    /// Filler bytes per chunk, after the stamp.
    pub pad: usize,
}

impl Pace {
    /// The send times (Unix µs) of the chunks complete in `text`, a paced answer's prefix.
    pub fn stamps(text: &str) -> Vec<u64> {
        text.split('@').skip(1).filter_map(|c| c.split_once(';')?.0.parse().ok()).collect()
    }
}

/// How the emulator serves flex calls: one in `refuse_every` is refused for capacity (`429 Resource
/// Unavailable`, 0 for none), and each answered one takes `latency` (spare capacity is slower).
#[derive(Debug, Clone, Copy, Default)]
pub struct FlexCapacity {
    /// One flex call in this many is refused; 0 refuses none.
    pub refuse_every: u64,
    /// Added to each answered flex call.
    pub latency: Duration,
    /// Flex calls asked so far.
    pub asked: u64,
    /// Flex calls refused so far.
    pub refused: u64,
}

impl MockState {
    /// Charges one request of `tokens`; `Err(wait)` when it would exceed the limits.
    fn charge(&self, tokens: u64) -> Result<Option<(MockLimits, Remaining)>, Duration> {
        let mut guard = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let mut left = None;
        if let Some(b) = guard.as_mut() {
            let need = [1.0, tokens as f64];
            match b.take(need) {
                Ok(remaining) => left = Some((b.limits, remaining)),
                Err(wait) => {
                    usage.throttled += 1;
                    return Err(wait);
                }
            }
        }
        usage.served += 1;
        usage.tokens += tokens;
        Ok(left)
    }
}

impl MockState {
    fn hint(&self) -> Hint {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map_or(Hint::Both, |b| b.limits.hint)
    }
}

impl Buckets {
    fn new(limits: MockLimits) -> Self {
        let now = std::time::Instant::now();
        Self {
            limits,
            levels: [limits.rpm, limits.tpm],
            at: now,
            started: now,
            window_index: 0,
            log: VecDeque::new(),
        }
    }

    /// Takes `need` (requests, tokens) by the discipline, or says how long until it would fit.
    fn take(&mut self, need: [f64; 2]) -> Result<Remaining, Duration> {
        let now = std::time::Instant::now();
        let window = self.limits.window;
        let caps = [self.limits.rpm, self.limits.tpm];
        match self.limits.discipline {
            Discipline::TokenBucket => {
                let elapsed = now.duration_since(self.at).as_secs_f64();
                for (level, cap) in self.levels.iter_mut().zip(caps) {
                    *level = (*level + elapsed * cap / window.as_secs_f64()).min(cap);
                }
                self.at = now;
                let short = |i: usize| (need[i] - self.levels[i]).max(0.0) / (caps[i] / window.as_secs_f64());
                if self.levels[0] < need[0] || self.levels[1] < need[1] {
                    return Err(Duration::from_secs_f64(short(0).max(short(1))));
                }
                self.levels[0] -= need[0];
                self.levels[1] -= need[1];
                let reset = (0..2)
                    .map(|i| (caps[i] - self.levels[i]) / (caps[i] / window.as_secs_f64()))
                    .fold(0.0, f64::max);
                Ok(Remaining {
                    requests: self.levels[0],
                    tokens: self.levels[1],
                    reset: Duration::from_secs_f64(reset),
                })
            }
            Discipline::FixedWindow => {
                let since = now.duration_since(self.started);
                let index = (since.as_nanos() / window.as_nanos().max(1)) as u64;
                if index != self.window_index {
                    self.window_index = index;
                    self.levels = caps;
                }
                let next = window.saturating_mul(index as u32 + 1).saturating_sub(since);
                if self.levels[0] < need[0] || self.levels[1] < need[1] {
                    return Err(next);
                }
                self.levels[0] -= need[0];
                self.levels[1] -= need[1];
                Ok(Remaining { requests: self.levels[0], tokens: self.levels[1], reset: next })
            }
            Discipline::SlidingWindow => {
                while self.log.front().is_some_and(|(t, _)| now.duration_since(*t) >= window) {
                    self.log.pop_front();
                }
                let used = [self.log.len() as f64, self.log.iter().map(|(_, k)| k).sum::<f64>()];
                if used[0] + need[0] > caps[0] || used[1] + need[1] > caps[1] {
                    // Until enough of the oldest entries leave the window.
                    let mut freed = [0.0, 0.0];
                    for (t, k) in &self.log {
                        freed[0] += 1.0;
                        freed[1] += k;
                        if used[0] - freed[0] + need[0] <= caps[0] && used[1] - freed[1] + need[1] <= caps[1]
                        {
                            return Err((*t + window).saturating_duration_since(now));
                        }
                    }
                    return Err(window);
                }
                self.log.push_back((now, need[1]));
                let reset = self
                    .log
                    .front()
                    .map_or(Duration::ZERO, |(t, _)| (*t + window).saturating_duration_since(now));
                Ok(Remaining {
                    requests: caps[0] - used[0] - 1.0,
                    tokens: caps[1] - used[1] - need[1],
                    reset,
                })
            }
        }
    }
}

/// The `x-ratelimit-*` headers of an answer, OpenAI's way (reset as a Go duration).
fn rate_headers(resp: &mut Response, limits: &MockLimits, left: &Remaining) {
    let ms = format!("{}ms", left.reset.as_millis());
    for (k, v) in [
        ("x-ratelimit-limit-requests", format!("{}", limits.rpm.floor())),
        ("x-ratelimit-limit-tokens", format!("{}", limits.tpm.floor())),
        ("x-ratelimit-remaining-requests", format!("{}", left.requests.max(0.0).floor())),
        ("x-ratelimit-remaining-tokens", format!("{}", left.tokens.max(0.0).floor())),
        ("x-ratelimit-reset-requests", ms.clone()),
        ("x-ratelimit-reset-tokens", ms.clone()),
    ] {
        if let Ok(v) = v.parse() {
            resp.headers_mut().insert(k, v);
        }
    }
}

/// The running mock.
pub struct MockLlm {
    /// Base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    state: Arc<MockState>,
    task: tokio::task::JoinHandle<()>,
}

impl MockLlm {
    /// Starts on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        let state = Arc::new(MockState::default());
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(openai))
            .route("/v1/messages", post(anthropic))
            .route("/model/{model}/converse", post(converse))
            .route("/model/{model}/converse-stream", post(converse_stream))
            .with_state(state.clone());
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
        let url = format!("http://{}", listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}")));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, state, task })
    }

    /// Starts on a free loopback port, enforcing `limits` (a full budget at the start, as a provider's).
    pub async fn start_limited(limits: MockLimits) -> std::io::Result<Self> {
        let mock = Self::start().await?;
        *mock.state.buckets.lock().unwrap_or_else(|e| e.into_inner()) = Some(Buckets::new(limits));
        Ok(mock)
    }

    /// Requests and tokens served, requests throttled.
    pub fn usage(&self) -> MockUsage {
        *self.state.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Streams every chat completion asked with `stream: true` at `pace` from now on.
    pub fn pace(&self, pace: Pace) {
        *self.state.pace.lock().unwrap_or_else(|e| e.into_inner()) = Some(pace);
    }

    /// Queues scripted answers.
    pub fn script(&self, answers: impl IntoIterator<Item = Scripted>) {
        self.state.script.lock().unwrap_or_else(|e| e.into_inner()).extend(answers);
    }

    /// Drops the scripted answers not used yet.
    pub fn clear_script(&self) {
        self.state.script.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Refuses flex calls to `model` as OpenAI refuses them for a model without flex (a 400 naming
    /// `service_tier`).
    pub fn without_flex(&self, model: &str) {
        self.state.no_flex.lock().unwrap_or_else(|e| e.into_inner()).push(model.to_owned());
    }

    /// Serves flex calls as `capacity` says (its counts start at zero).
    pub fn flex_capacity(&self, capacity: FlexCapacity) {
        *self.state.flex.lock().unwrap_or_else(|e| e.into_inner()) =
            FlexCapacity { asked: 0, refused: 0, ..capacity };
    }

    /// Flex calls asked and refused so far.
    pub fn flex_counts(&self) -> (u64, u64) {
        let f = *self.state.flex.lock().unwrap_or_else(|e| e.into_inner());
        (f.asked, f.refused)
    }

    /// Answers Anthropic calls as served at its Priority Tier (`usage.service_tier: "priority"`).
    pub fn anthropic_priority(&self, on: bool) {
        self.state.anthropic_priority.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Answers as a model that takes no prefill: a Messages request whose conversation ends with an
    /// assistant turn is refused with a 400, as Anthropic's newest models refuse it.
    pub fn refuse_prefill(&self, on: bool) {
        self.state.no_prefill.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Each commit summarized in an answer, by sha, with the number of answers that carried it.
    pub fn answered_commits(&self) -> std::collections::HashMap<String, u32> {
        self.state.answered_commits.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn record_and_script(
    state: &MockState,
    path: &str,
    headers: HeaderMap,
    body: Value,
) -> Option<Response> {
    state.seen.lock().unwrap_or_else(|e| e.into_inner()).push(Seen {
        path: path.into(),
        headers,
        body: body.clone(),
    });
    let next = state.script.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
    match next {
        None => None,
        Some(Scripted::Slow(d)) => {
            tokio::time::sleep(d).await;
            None
        }
        Some(Scripted::Answer(text)) => {
            let completion = tokens(&text);
            let answer = json!({
                "id": "chatcmpl-mock", "object": "chat.completion", "model": "scripted",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": completion, "total_tokens": completion + 10}
            });
            Some(chat_response(&body, answer, None))
        }
        Some(Scripted::StreamCut(text, after)) if body["stream"] == true => {
            let answer = json!({
                "id": "chatcmpl-mock", "object": "chat.completion", "model": "scripted",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
            });
            Some(chat_response(&body, answer, Some((after, Duration::ZERO))))
        }
        Some(Scripted::StreamStall(text, after, hold)) if body["stream"] == true => {
            let answer = json!({
                "id": "chatcmpl-mock", "object": "chat.completion", "model": "scripted",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
            });
            Some(chat_response(&body, answer, Some((after, hold))))
        }
        Some(Scripted::StreamCut(_, after)) => {
            *state.last_cut.lock().unwrap_or_else(|e| e.into_inner()) = Some(after);
            Some((StatusCode::INTERNAL_SERVER_ERROR, "not streamed").into_response())
        }
        Some(Scripted::StreamStall(..)) => {
            Some((StatusCode::INTERNAL_SERVER_ERROR, "not streamed").into_response())
        }
        Some(Scripted::FlexUnavailable) => Some(flex_unavailable()),
        Some(Scripted::Status(code, hdrs)) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut resp =
                (status, Json(json!({"error": {"message": format!("scripted {code}")}}))).into_response();
            for (k, v) in hdrs {
                if let Ok(v) = v.parse() {
                    resp.headers_mut().insert(k, v);
                }
            }
            Some(resp)
        }
    }
}

/// OpenAI's refusal of a flex call it has no capacity for.
fn flex_unavailable() -> Response {
    let error = json!({"message": "Resource Unavailable: flex capacity is exhausted, retry later or use the default tier",
        "type": "resource_unavailable", "param": null, "code": "resource_unavailable"});
    (StatusCode::TOO_MANY_REQUESTS, Json(json!({ "error": error }))).into_response()
}

fn throttled(wait: Duration, hint: Hint) -> Response {
    let mut resp =
        (StatusCode::TOO_MANY_REQUESTS, Json(json!({"error": {"message": "rate limit exceeded"}})))
            .into_response();
    let ms = (wait.as_millis() as u64 + 1).to_string();
    let secs = wait.as_secs_f64().ceil().max(1.0).to_string();
    let headers: &[(&str, &str)] = match hint {
        Hint::Both => &[("retry-after-ms", &ms), ("retry-after", &secs)],
        Hint::RetryAfter => &[("retry-after", &secs)],
        Hint::RetryAfterMs => &[("retry-after-ms", &ms)],
        Hint::Vendor => &[("x-vendor-retry-after", &secs)],
        Hint::None => &[],
    };
    for (k, v) in headers {
        if let Ok(v) = v.parse() {
            resp.headers_mut().insert(*k, v);
        }
    }
    resp
}

fn tokens(s: &str) -> u64 {
    s.len().div_ceil(4) as u64
}

/// The answer's start a request asks to be continued: its last message's text when that message is
/// the assistant's (Anthropic's prefill; for a chat completion, only with `continue_final_message`,
/// as vLLM takes it).
fn prefill(body: &Value) -> Option<String> {
    let last = body["messages"].as_array()?.last()?;
    (last["role"] == "assistant").then(|| last["content"].as_str().unwrap_or_default().to_owned())
}

/// `answer` continued after `prefix` as a model would: the rest of it where the prefix is its
/// start, else the whole of it after a space.
fn continue_after(answer: &str, prefix: Option<&str>) -> String {
    match prefix {
        None => answer.to_owned(),
        Some(p) => answer.strip_prefix(p).map_or_else(|| format!(" {answer}"), str::to_owned),
    }
}

/// The mock's answer ("mock answer", a token a word), continued after `prefix`.
fn continued(prefix: Option<&str>) -> (String, u64) {
    let text = continue_after("mock answer", prefix);
    let words = text.split_whitespace().count() as u64;
    (text, words)
}

/// Anthropic's 400 for a prefill the model refuses, or for one ending in whitespace.
fn prefill_refused(state: &MockState, prefix: &str) -> Option<Response> {
    let message = if state.no_prefill.load(std::sync::atomic::Ordering::Relaxed) {
        "This model does not support assistant message prefill. The conversation must end with a user message."
    } else if prefix.trim_end() != prefix {
        "messages: final assistant content cannot end with trailing whitespace"
    } else {
        return None;
    };
    let error = json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
    Some((StatusCode::BAD_REQUEST, Json(error)).into_response())
}

/// A chat completion as the request asked for it: the JSON answer, or with `stream: true` the
/// documented `chat.completion.chunk` events (the text a few words a chunk, 10 ms apart, the
/// `finish_reason` in the last, a usage chunk with empty `choices` when `stream_options.include_usage`,
/// then `[DONE]`); `cut_after` ends the stream after that many chunks instead, silent for the given
/// time before it closes.
fn chat_response(request: &Value, answer: Value, cut_after: Option<(usize, Duration)>) -> Response {
    if request["stream"] != true {
        return Json(answer).into_response();
    }
    let base = json!({"id": answer["id"], "object": "chat.completion.chunk", "model": answer["model"],
        "service_tier": answer["service_tier"]});
    let chunk = |delta: Value, finish: Value| {
        let mut c = base.clone();
        c["choices"] = json!([{"index": 0, "delta": delta, "finish_reason": finish}]);
        c
    };
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    for piece in words.chunks(3) {
        chunks.push(chunk(json!({"content": piece.concat()}), Value::Null));
    }
    chunks.push(chunk(json!({}), answer["choices"][0]["finish_reason"].clone()));
    if request["stream_options"]["include_usage"] == true {
        let mut usage = base.clone();
        usage["choices"] = json!([]);
        usage["usage"] = answer["usage"].clone();
        chunks.push(usage);
    }
    let mut lines: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    let hold = match cut_after {
        Some((n, hold)) => {
            lines.truncate(n);
            hold
        }
        None => {
            lines.push("data: [DONE]\n\n".into());
            Duration::ZERO
        }
    };
    sse_body(lines, hold)
}

/// A chat completion streamed at `pace`, each chunk stamped as it is written: OpenAI's documented
/// chunks, the usage chunk when asked, then `[DONE]`.
fn paced_stream(pace: Pace, include_usage: bool) -> Response {
    let base = json!({"id": "chatcmpl-paced", "object": "chat.completion.chunk", "model": "paced"});
    let chunk = move |delta: Value, finish: Value| {
        let mut c = base.clone();
        c["choices"] = json!([{"index": 0, "delta": delta, "finish_reason": finish}]);
        format!("data: {c}\n\n")
    };
    let pad = "x".repeat(pace.pad);
    let chunk_text = chunk.clone();
    let text = futures::stream::iter(0..pace.chunks).then(move |_| {
        let (chunk, pad) = (chunk_text.clone(), pad.clone());
        async move {
            tokio::time::sleep(pace.interval).await;
            let micros = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_micros())
                .unwrap_or(0);
            Ok::<_, std::convert::Infallible>(chunk(
                json!({"content": format!("@{micros};{pad}")}),
                Value::Null,
            ))
        }
    });
    let completion = (pace.chunks * (pace.pad + 18)).div_ceil(4);
    let mut tail = vec![chunk(json!({}), json!("stop"))];
    if include_usage {
        let usage = json!({"id": "chatcmpl-paced", "object": "chat.completion.chunk", "model": "paced", "choices": [],
            "usage": {"prompt_tokens": 10, "completion_tokens": completion, "total_tokens": completion + 10}});
        tail.push(format!("data: {usage}\n\n"));
    }
    tail.push("data: [DONE]\n\n".into());
    let first = futures::stream::iter([Ok(chunk(json!({"role": "assistant", "content": ""}), Value::Null))]);
    let events = first.chain(text).chain(futures::stream::iter(tail.into_iter().map(Ok)));
    ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(events))
        .into_response()
}

/// Server-sent events, one `lines` entry 10 ms after another,
/// then `hold` of silence before the body ends.
fn sse_body(lines: Vec<String>, hold: Duration) -> Response {
    let events = futures::stream::iter(lines).then(|l| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok::<_, std::convert::Infallible>(l)
    });
    let silence = futures::stream::once(async move {
        tokio::time::sleep(hold).await;
        Ok::<_, std::convert::Infallible>(String::new())
    });
    let events = events.chain(silence);
    ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(events))
        .into_response()
}

async fn openai(
    State(state): State<Arc<MockState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Some(r) = record_and_script(&state, "/v1/chat/completions", headers, body.clone()).await {
        return r;
    }
    let pace = *state.pace.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pace) = pace.filter(|_| body["stream"] == true) {
        return paced_stream(pace, body["stream_options"]["include_usage"] == true);
    }
    let flex = body["service_tier"] == "flex";
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    if flex && state.no_flex.lock().unwrap_or_else(|e| e.into_inner()).contains(&model) {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": format!("Flex processing is not available for model {model}."),
                "type": "invalid_request_error", "param": "service_tier", "code": null}})),
        )
            .into_response();
    }
    let prompt: String =
        body["messages"].as_array().into_iter().flatten().filter_map(|m| m["content"].as_str()).collect();
    if flex {
        let refused = {
            let mut f = state.flex.lock().unwrap_or_else(|e| e.into_inner());
            f.asked += 1;
            let refused = f.refuse_every > 0 && f.asked % f.refuse_every == 0;
            f.refused += u64::from(refused);
            if refused { None } else { Some(f.latency) }
        };
        match refused {
            None => return flex_unavailable(),
            Some(latency) => tokio::time::sleep(latency).await,
        }
    }
    // A commit-summary prompt gets a well-formed JSON array, as a model following it would answer.
    let (content, completion) = if prompt.contains("=== commit ") {
        let a = lanes_core::commits::prompt::offline_answer(&prompt)
            .replace("[offline heuristic, not an LLM]", "[mock]");
        let n = tokens(&a);
        (a, n)
    } else {
        continued(prefill(&body).filter(|_| body["continue_final_message"] == true).as_deref())
    };
    // A model stops at its cap and says so, as the API documents (`finish_reason: "length"`).
    let cap = body["max_completion_tokens"].as_u64().or(body["max_tokens"].as_u64()).unwrap_or(u64::MAX);
    let (content, completion, finish) = cut_at(content, completion, cap, "stop", "length");
    let left = match state.charge(tokens(&prompt) + completion) {
        Ok(left) => left,
        Err(wait) => return throttled(wait, state.hint()),
    };
    let mut answered = state.answered_commits.lock().unwrap_or_else(|e| e.into_inner());
    let shas = prompt.split("=== commit ").skip(1).filter_map(|s| s.split_whitespace().next());
    // Only the sections' shas: the instructions show the marker too, with a placeholder.
    for sha in shas.filter(|s| matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit())) {
        *answered.entry(sha.to_owned()).or_default() += 1;
    }
    drop(answered);
    let answer = json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
        "usage": {"prompt_tokens": tokens(&prompt), "completion_tokens": completion,
                  "total_tokens": tokens(&prompt) + completion},
        // The tier that served the call, as OpenAI names it in every answer.
        "service_tier": body["service_tier"].as_str().filter(|t| matches!(*t, "flex" | "priority")).unwrap_or("default")
    });
    let mut resp = chat_response(&body, answer, None);
    if let Some((limits, left)) = left
        && limits.headers
    {
        rate_headers(&mut resp, &limits, &left);
    }
    resp
}

async fn anthropic(
    State(state): State<Arc<MockState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if headers.get("x-api-key").is_none() || headers.get("anthropic-version").is_none() {
        return (StatusCode::UNAUTHORIZED, Json(json!({"error": {"message": "missing x-api-key"}})))
            .into_response();
    }
    if let Some(r) = record_and_script(&state, "/v1/messages", headers, body.clone()).await {
        return r;
    }
    let prefix = prefill(&body);
    if let Some(refused) = prefix.as_deref().and_then(|p| prefill_refused(&state, p)) {
        return refused;
    }
    // A prefill is billed as input.
    let prompt = format!(
        "{}{}{}",
        body["system"].as_str().unwrap_or(""),
        body["messages"][0]["content"].as_str().unwrap_or(""),
        prefix.as_deref().unwrap_or("")
    );
    let cap = body["max_tokens"].as_u64().unwrap_or(u64::MAX);
    let (text, words) = continued(prefix.as_deref());
    let (text, completion, stop) = cut_at(text, words, cap, "end_turn", "max_tokens");
    if let Err(wait) = state.charge(tokens(&prompt) + completion) {
        return throttled(wait, state.hint());
    }
    let content: Vec<Value> =
        text.split_inclusive(' ').map(|part| json!({"type": "text", "text": part})).collect();
    let message = json!({
        "id": "msg_mock",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": stop,
        "usage": {"input_tokens": tokens(&prompt), "output_tokens": completion,
                  "service_tier": if state.anthropic_priority.load(std::sync::atomic::Ordering::Relaxed) { "priority" } else { "standard" }}
    });
    if body["stream"] == true {
        return message_stream(&message);
    }
    Json(message).into_response()
}

/// A Message as the Messages API streams it: `message_start` (the input usage), a text block of
/// `content_block_delta`s with a `ping` among them, `message_delta` (the stop reason and output
/// usage), then `message_stop`.
fn message_stream(message: &Value) -> Response {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut start = message.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"]["output_tokens"] = json!(1);
    let mut lines = vec![
        event("message_start", json!({"type": "message_start", "message": start})),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        event("ping", json!({"type": "ping"})),
    ];
    for block in message["content"].as_array().into_iter().flatten() {
        lines.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": block["text"]}}),
        ));
    }
    lines.push(event("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
    lines.push(event(
        "message_delta",
        json!({"type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": null},
        "usage": {"output_tokens": message["usage"]["output_tokens"]}}),
    ));
    lines.push(event("message_stop", json!({"type": "message_stop"})));
    sse_body(lines, Duration::ZERO)
}

/// An answer cut to `cap` completion tokens (one word a token here), with the stop reason a provider
/// gives for a whole answer (`done`) or a cut one (`cut`).
fn cut_at(
    text: String,
    tokens: u64,
    cap: u64,
    done: &'static str,
    cut: &'static str,
) -> (String, u64, &'static str) {
    if tokens <= cap {
        return (text, tokens, done);
    }
    let kept: Vec<&str> = text.split_whitespace().take(cap as usize).collect();
    (kept.join(" "), cap, cut)
}

/// A Converse response as Bedrock returns it (recorded shape, in `tests/fixtures/`).
pub const RECORDED_CONVERSE: &str = include_str!("../fixtures/bedrock-converse-response.json");

async fn converse(
    State(state): State<Arc<MockState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if headers.get("authorization").is_none() {
        return (StatusCode::FORBIDDEN, Json(json!({"message": "missing signature"}))).into_response();
    }
    if let Some(r) = record_and_script(&state, "/converse", headers, body.clone()).await {
        return bedrock_error(r);
    }
    let mut recorded = converse_answer(&body);
    // Converse names the tier that served the call when one was asked for.
    if let Some(tier) = body["serviceTier"]["type"].as_str() {
        recorded["serviceTier"] = json!({"type": tier});
    }
    Json(recorded).into_response()
}

/// The recorded Converse answer, continued where the conversation ends with an assistant turn
/// (prefill): the rest of its text after that turn's, a token a word fewer for each word given.
fn converse_answer(body: &Value) -> Value {
    let mut recorded: Value = serde_json::from_str(RECORDED_CONVERSE).unwrap_or(Value::Null);
    let last = body["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or(Value::Null);
    if last["role"] == "assistant" {
        let prefix = last["content"][0]["text"].as_str().unwrap_or_default();
        let text = recorded["output"]["message"]["content"][0]["text"].as_str().unwrap_or_default();
        let rest = continue_after(text, Some(prefix));
        let given = prefix.split_whitespace().count() as u64;
        let output = recorded["usage"]["outputTokens"].as_u64().unwrap_or(0).saturating_sub(given);
        recorded["output"]["message"]["content"][0]["text"] = json!(rest);
        recorded["usage"]["outputTokens"] = json!(output);
    }
    recorded
}

/// A scripted error as Bedrock answers it: the error's name in a header, which the SDK maps to the
/// operation's error variant.
fn bedrock_error(r: Response) -> Response {
    let (mut parts, b) = r.into_parts();
    let kind = match parts.status.as_u16() {
        429 => "ThrottlingException",
        400 => "ValidationException",
        403 => "AccessDeniedException",
        503 => "ServiceUnavailableException",
        _ => "InternalServerException",
    };
    if let Ok(v) = kind.parse() {
        parts.headers.insert("x-amzn-errortype", v);
    }
    Response::from_parts(parts, b)
}

/// One event of a ConverseStream answer, framed as the AWS event stream encoding frames it
/// (`application/vnd.amazon.eventstream`: prelude, headers, payload, CRCs) with the headers the
/// service sets: `:message-type` `event`, `:event-type` its name, `:content-type` JSON.
fn converse_event(event_type: &str, payload: &Value) -> bytes::Bytes {
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    let header =
        |name: &str, value: &str| Header::new(name.to_owned(), HeaderValue::String(value.to_owned().into()));
    let message = Message::new(payload.to_string().into_bytes())
        .add_header(header(":message-type", "event"))
        .add_header(header(":event-type", event_type))
        .add_header(header(":content-type", "application/json"));
    let mut frame = Vec::new();
    aws_smithy_eventstream::frame::write_message_to(&message, &mut frame)
        .unwrap_or_else(|e| panic!("event stream frame: {e}"));
    frame.into()
}

/// ConverseStream: the recorded Converse answer's text as `contentBlockDelta` events a word or two
/// at a time, 10 ms apart, between `messageStart` and `contentBlockStop`, `messageStop` (its stop
/// reason) and `metadata` (its usage, and the tier when one was asked). A scripted `StreamCut` ends
/// the body after that many events, with no `messageStop`.
async fn converse_stream(
    State(state): State<Arc<MockState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if headers.get("authorization").is_none() {
        return (StatusCode::FORBIDDEN, Json(json!({"message": "missing signature"}))).into_response();
    }
    let cut = matches!(
        state.script.lock().unwrap_or_else(|e| e.into_inner()).front(),
        Some(Scripted::StreamCut(..))
    );
    let cut_after = match record_and_script(&state, "/converse-stream", headers, body.clone()).await {
        // The scripted cut answers a 500 to a request without `stream`; this one streams.
        Some(_) if cut => state.last_cut.lock().unwrap_or_else(|e| e.into_inner()).take(),
        Some(r) => return bedrock_error(r),
        None => None,
    };
    let recorded = converse_answer(&body);
    let text = recorded["output"]["message"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    let mut events = vec![converse_event("messageStart", &json!({"role": "assistant"}))];
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    for piece in words.chunks(2) {
        let delta = json!({"contentBlockIndex": 0, "delta": {"text": piece.concat()}});
        events.push(converse_event("contentBlockDelta", &delta));
    }
    events.push(converse_event("contentBlockStop", &json!({"contentBlockIndex": 0})));
    events.push(converse_event("messageStop", &json!({"stopReason": recorded["stopReason"]})));
    let mut metadata = json!({"usage": recorded["usage"], "metrics": recorded["metrics"]});
    if let Some(tier) = body["serviceTier"]["type"].as_str() {
        metadata["serviceTier"] = json!({"type": tier});
    }
    events.push(converse_event("metadata", &metadata));
    if let Some(n) = cut_after {
        events.truncate(n);
    }
    let frames = futures::stream::iter(events).then(|f| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok::<_, std::convert::Infallible>(f)
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/vnd.amazon.eventstream")],
        axum::body::Body::from_stream(frames),
    )
        .into_response()
}
