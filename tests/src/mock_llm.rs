//! A mock LLM provider on loopback speaking the OpenAI chat-completions and Anthropic Messages shapes.
//! It answers from a script (statuses with headers, slow answers) and then normally, and records every
//! request it got.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
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

#[derive(Default)]
struct MockState {
    script: Mutex<VecDeque<Scripted>>,
    seen: Mutex<Vec<Seen>>,
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
    pub async fn start() -> Self {
        let state = Arc::new(MockState::default());
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(openai))
            .route("/v1/messages", post(anthropic))
            .with_state(state.clone());
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
        let url = format!("http://{}", listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}")));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, state, task }
    }

    /// Queues scripted answers.
    pub fn script(&self, answers: impl IntoIterator<Item = Scripted>) {
        self.state.script.lock().unwrap_or_else(|e| e.into_inner()).extend(answers);
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
    state.seen.lock().unwrap_or_else(|e| e.into_inner()).push(Seen { path: path.into(), headers, body });
    let next = state.script.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
    match next {
        None => None,
        Some(Scripted::Slow(d)) => {
            tokio::time::sleep(d).await;
            None
        }
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

fn tokens(s: &str) -> u64 {
    s.len().div_ceil(4) as u64
}

async fn openai(
    State(state): State<Arc<MockState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Some(r) = record_and_script(&state, "/v1/chat/completions", headers, body.clone()).await {
        return r;
    }
    let prompt: String =
        body["messages"].as_array().into_iter().flatten().filter_map(|m| m["content"].as_str()).collect();
    Json(json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "mock answer"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": tokens(&prompt), "completion_tokens": 2, "total_tokens": tokens(&prompt) + 2}
    }))
    .into_response()
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
    let prompt = format!(
        "{}{}",
        body["system"].as_str().unwrap_or(""),
        body["messages"][0]["content"].as_str().unwrap_or("")
    );
    Json(json!({
        "id": "msg_mock",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [{"type": "text", "text": "mock "}, {"type": "text", "text": "answer"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": tokens(&prompt), "output_tokens": 2}
    }))
    .into_response()
}
