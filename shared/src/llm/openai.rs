//! OpenAI-compatible chat completions (`POST {base}/chat/completions`): OpenAI, vLLM, Ollama, LiteLLM.
//! Usage is read from every response; throttles and server errors carry the provider's reset hint.
//! With `stream: true` the text goes to the caller as it arrives; a stream is complete only at its
//! `[DONE]`.

use super::retry::{is_retryable_status, rate_limits, retry_hint};
use crate::domain::TokenUsage;
use crate::domain::tier::Tier;
use crate::ports::{DeltaSink, LlmClient, LlmError, LlmRequest, LlmResponse};
use crate::secret::Secret;
use async_trait::async_trait;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};

/// A chat-completions client.
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    pub(super) timeout: Duration,
    pub(super) base_url: String,
    pub(super) model: String,
    pub(super) api_key: Option<Secret>,
}

impl OpenAiClient {
    /// A client for `base_url` (e.g. `https://api.openai.com/v1`) and `model`, with a per-request timeout.
    pub fn new(base_url: &str, model: &str, api_key: Option<Secret>, timeout: Duration) -> Self {
        Self {
            timeout,
            base_url: base_url.trim_end_matches('/').to_owned(),
            model: model.to_owned(),
            api_key,
        }
    }
}

impl OpenAiClient {
    /// Whether this is OpenAI's own API (by host), rather than a compatible server.
    fn is_openai(&self) -> bool {
        reqwest::Url::parse(&self.base_url).is_ok_and(|u| u.host_str() == Some("api.openai.com"))
    }

    /// The chat-completions body of `request` (also one line of a batch's input file).
    pub(super) fn chat_body(&self, request: &LlmRequest) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": [
                {"role": "system", "content": request.kind.system_prompt()},
                {"role": "user", "content": request.user_message()},
            ],
        });
        // OpenAI's own API deprecated `max_tokens` (its reasoning models refuse it); compatible
        // servers (vLLM, Ollama, LiteLLM) still expect it.
        let cap = if self.is_openai() { "max_completion_tokens" } else { "max_tokens" };
        body[cap] = json!(request.max_tokens);
        // A continued answer (only for a server configured to continue one): the saved text is a
        // final assistant message that the server continues rather than answers (vLLM's and
        // SGLang's `continue_final_message`, without a new generation prompt).
        if let Some((prefix, left)) = request.continuation() {
            if let Some(messages) = body["messages"].as_array_mut() {
                messages.push(json!({"role": "assistant", "content": prefix}));
            }
            body["continue_final_message"] = json!(true);
            body["add_generation_prompt"] = json!(false);
            body[cap] = json!(left);
        }
        let p = &request.params;
        if let Some(t) = p.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(t) = p.top_p {
            body["top_p"] = json!(t);
        }
        if !p.stop.is_empty() {
            body["stop"] = json!(p.stop);
        }
        if let Some(seed) = p.seed {
            body["seed"] = json!(seed);
        }
        // A batch's request is priced by the batch; it names no tier of its own.
        if !matches!(request.tier, Tier::Sync | Tier::Batch) {
            body["service_tier"] = json!(request.tier.as_str());
        }
        body
    }
}

/// A chat completion's answer (a synchronous one, or a line of a batch's output file).
pub(super) fn chat_answer(
    v: &Value,
    default_model: &str,
    limits: crate::domain::model_call::ProviderLimits,
) -> Result<LlmResponse, LlmError> {
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .ok_or_else(|| LlmError::Retryable {
            message: "answer without choices[0].message.content".into(),
            retry_after: None,
        })?
        .to_owned();
    Ok(LlmResponse {
        truncated: v["choices"][0]["finish_reason"] == "length",
        limits,
        text,
        model: v["model"].as_str().unwrap_or(default_model).to_owned(),
        usage: TokenUsage {
            prompt: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
            completion: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        },
        // The answer names the tier that served it, which may differ from the one asked for;
        // without it (a compatible server) the call is taken as charged at the list price.
        tier: match v["service_tier"].as_str() {
            Some("flex") => Tier::Flex,
            Some("priority") => Tier::Priority,
            _ => Tier::Sync,
        },
        route: Default::default(),
        continued: 0,
    })
}

/// Maps a failed [`crate::http::send`]: all of it is worth retrying, a key refused mid-rotation
/// included (a key given as a variable and refused is a 401 answer, mapped by [`status_error`]).
pub(super) fn send_error(e: crate::http::SendError) -> LlmError {
    match e {
        crate::http::SendError::Transport(e) => transport_error(&e),
        other => LlmError::Retryable { retry_after: other.retry_after(), message: other.to_string() },
    }
}

/// Maps a transport error: timeouts and connection failures are worth retrying.
pub(super) fn transport_error(e: &reqwest::Error) -> LlmError {
    let message =
        if e.is_timeout() { "request timed out".to_owned() } else { format!("connection failed: {e}") };
    LlmError::Retryable { message, retry_after: None }
}

/// Most bytes of a model's answer read: far past the largest completion a lane asks for, and a
/// bound on what a broken or hostile OpenAI-compatible server can make a worker hold.
pub(super) const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// An answer's JSON body, read at most `cap` bytes: a longer one is refused (it will not shrink on
/// a retry), a cut connection is retried.
pub(super) async fn json_capped(resp: reqwest::Response, cap: usize) -> Result<Value, LlmError> {
    let body = body_capped(resp, cap).await?;
    serde_json::from_slice(&body)
        .map_err(|e| LlmError::Retryable { message: format!("answer is not JSON: {e}"), retry_after: None })
}

/// A body of JSON lines (a batch's results), read at most `cap` bytes. A line that does not parse
/// is left out: its request counts as unanswered and goes on.
pub(super) async fn jsonl_capped(resp: reqwest::Response, cap: usize) -> Result<Vec<Value>, LlmError> {
    let body = body_capped(resp, cap).await?;
    let text = String::from_utf8_lossy(&body);
    Ok(text.lines().filter(|l| !l.trim().is_empty()).filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// A body, read at most `cap` bytes: a longer one is refused (it will not shrink on a retry), a
/// cut connection is retried.
async fn body_capped(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, LlmError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport_error(&e))? {
        if body.len() + chunk.len() > cap {
            return Err(LlmError::Permanent(format!("the provider's answer is over {cap} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Maps a non-success HTTP answer to a retryable or permanent error, keeping the provider's message
/// short and the reset hint.
pub(super) async fn status_error(provider: &str, resp: reqwest::Response) -> LlmError {
    let status = resp.status().as_u16();
    let hint = retry_hint(resp.headers(), SystemTime::now());
    let body: Value = json_capped(resp, 64 * 1024).await.unwrap_or(Value::Null);
    let error = &body["error"];
    let mut detail = error["message"].as_str().unwrap_or("").chars().take(300).collect::<String>();
    // The machine-readable parts say what the message may not (`code`, `type`, the `param` at fault).
    for part in ["code", "type", "param"].iter().filter_map(|k| error[*k].as_str()) {
        detail.push_str(&format!(" [{}]", part.chars().take(60).collect::<String>()));
    }
    let message = format!("{provider} answered {status}: {detail}");
    if status == 429 {
        LlmError::Throttled { message, retry_after: hint }
    } else if is_retryable_status(status) {
        LlmError::Retryable { message, retry_after: hint }
    } else {
        LlmError::Permanent(message)
    }
}

/// What a refused tier call means. OpenAI answers a flex call it lacks capacity for with
/// `429 Resource Unavailable` (not charged), and a call at a tier its model lacks with a 400 naming
/// the `service_tier` parameter. Either is a [`LlmError::TierRefused`], which the routes answer by
/// calling again at `sync`. So is any other refusal (4xx) of a tier call, which `sync` then answers
/// for good, and, for flex, a failure a retry would answer (a 5xx, a timeout, a cut connection):
/// flex is the slower, best-effort tier, and retrying it could spend the task's attempts on a
/// failure `sync` may not have (a priority call is retried as it is: it is the fast path). A
/// rate-limit 429 stays a throttle (`sync` shares the quota).
fn tier_refusal(tier: Tier, e: LlmError) -> LlmError {
    let says = |m: &str, words: &[&str]| {
        let m = m.to_ascii_lowercase();
        words.iter().any(|w| m.contains(w))
    };
    match e {
        LlmError::Throttled { message, .. }
            if tier == Tier::Flex && says(&message, &["resource unavailable", "resource_unavailable"]) =>
        {
            LlmError::TierRefused { message, unsupported: false }
        }
        LlmError::Permanent(message) => {
            // Only a refusal naming the tier says the model has none. Any other refusal of a tier
            // call is asked again at sync, whose answer is final: a model refusing the tier in
            // words not recognised here never fails work that sync would do.
            let unsupported = says(&message, &["service_tier", tier.as_str()]);
            LlmError::TierRefused { message, unsupported }
        }
        LlmError::Retryable { message, .. } if tier == Tier::Flex => {
            LlmError::TierRefused { message, unsupported: false }
        }
        other => other,
    }
}

#[async_trait]
impl LlmClient for OpenAiClient {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let resp = self.post_chat(&self.chat_body(request), request.tier).await?;
        let limits = rate_limits(resp.headers(), SystemTime::now());
        let v: Value = json_capped(resp, MAX_ANSWER_BYTES).await?;
        chat_answer(&v, &self.model, limits)
    }

    /// `stream: true` with `stream_options.include_usage`: the usage arrives in the last chunk.
    async fn stream(&self, request: &LlmRequest, sink: &dyn DeltaSink) -> Result<LlmResponse, LlmError> {
        let mut body = self.chat_body(request);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let resp = self.post_chat(&body, request.tier).await?;
        let limits = rate_limits(resp.headers(), SystemTime::now());
        let v = read_chat_stream(resp, sink, self.timeout.min(STALL_LIMIT)).await?;
        chat_answer(&v, &self.model, limits)
    }
}

impl OpenAiClient {
    /// Posts a chat-completions body: the answer, once its status says it is one.
    async fn post_chat(&self, body: &Value, tier: Tier) -> Result<reqwest::Response, LlmError> {
        let url = format!("{}/chat/completions", self.base_url);
        let resp = crate::http::send(self.api_key.as_ref(), |http, key| {
            let req = http.post(&url).timeout(self.timeout).json(body);
            match key {
                Some(key) => req.bearer_auth(key),
                None => req,
            }
        })
        .await
        .map_err(|e| if tier == Tier::Sync { send_error(e) } else { tier_refusal(tier, send_error(e)) })?;
        if !resp.status().is_success() {
            let e = status_error("provider", resp).await;
            return Err(if tier == Tier::Sync { e } else { tier_refusal(tier, e) });
        }
        Ok(resp)
    }
}

// ---------------------------------------------------------------- streaming

// A streamed chat completion (`stream: true`) is read as server-sent events: each chunk's text goes
// to the sink as it arrives, and the chunks fold into the answer a call without streaming returns,
// so one parser ([`chat_answer`]) reads both. A stream is complete only at its `[DONE]`: one that
// ends before it, stalls, or carries an error is retried, never taken as the whole answer.

/// Longest silence between two events before the stream is taken as stalled.
pub(super) const STALL_LIMIT: Duration = Duration::from_secs(30);

/// A stream that cannot be the whole answer: worth calling again.
pub(super) fn cut(why: impl Into<String>) -> LlmError {
    LlmError::Retryable { message: why.into(), retry_after: None }
}

/// The answer's server-sent events, each at most `stall` after the one before.
pub(super) struct SseEvents {
    events: std::pin::Pin<
        Box<
            dyn futures::Stream<Item = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>
                + Send,
        >,
    >,
    stall: Duration,
}

impl SseEvents {
    pub(super) fn new(resp: reqwest::Response, stall: Duration) -> Self {
        Self { events: Box::pin(resp.bytes_stream().eventsource()), stall }
    }

    /// The next event; an error when the stream ends (`end` names the marker it lacked), stalls or
    /// breaks.
    pub(super) async fn next(&mut self, end: &str) -> Result<eventsource_stream::Event, LlmError> {
        match tokio::time::timeout(self.stall, self.events.next()).await {
            Err(_) => Err(cut(format!("the provider's stream stalled for {} s", self.stall.as_secs()))),
            Ok(None) => Err(cut(format!("the provider's stream ended before its {end}"))),
            Ok(Some(Err(EventStreamError::Transport(e)))) => Err(transport_error(&e)),
            Ok(Some(Err(e))) => Err(cut(format!("the provider's stream is not server-sent events: {e}"))),
            Ok(Some(Ok(event))) => Ok(event),
        }
    }
}

/// Reads the stream to its `[DONE]`: the answer as a non-streamed call's JSON.
async fn read_chat_stream(
    resp: reqwest::Response,
    sink: &dyn DeltaSink,
    stall: Duration,
) -> Result<Value, LlmError> {
    let mut events = SseEvents::new(resp, stall);
    let mut answer = Answer::default();
    loop {
        let event = events.next("[DONE]").await?;
        if event.data.trim() == "[DONE]" {
            return Ok(answer.into_json());
        }
        let chunk: Value =
            serde_json::from_str(&event.data).map_err(|_| cut("a stream event that is not JSON"))?;
        if let Some(message) = chunk["error"]["message"].as_str() {
            let message: String = message.chars().take(300).collect();
            return Err(cut(format!("the provider's stream failed: {message}")));
        }
        answer.add(&chunk, sink)?;
    }
}

/// What the chunks said so far.
#[derive(Default)]
struct Answer {
    text: String,
    finish: Value,
    model: Value,
    usage: Value,
    tier: Value,
}

impl Answer {
    fn add(&mut self, chunk: &Value, sink: &dyn DeltaSink) -> Result<(), LlmError> {
        let choice = &chunk["choices"][0];
        if let Some(piece) = choice["delta"]["content"].as_str().filter(|p| !p.is_empty()) {
            if self.text.len() + piece.len() > MAX_ANSWER_BYTES {
                return Err(LlmError::Permanent(format!(
                    "the provider's answer is over {MAX_ANSWER_BYTES} bytes"
                )));
            }
            self.text.push_str(piece);
            sink.delta(piece);
        }
        for (field, value) in [
            (&mut self.finish, &choice["finish_reason"]),
            (&mut self.model, &chunk["model"]),
            (&mut self.usage, &chunk["usage"]),
            (&mut self.tier, &chunk["service_tier"]),
        ] {
            if !value.is_null() {
                *field = value.clone();
            }
        }
        Ok(())
    }

    fn into_json(self) -> Value {
        json!({
            "choices": [{"message": {"content": self.text}, "finish_reason": self.finish}],
            "model": self.model,
            "usage": self.usage,
            "service_tier": self.tier,
        })
    }
}

#[cfg(test)]
mod tests {

    #[tokio::test]
    async fn an_answer_past_the_cap_is_refused_not_held() {
        let resp = |body: String| reqwest::Response::from(axum::http::Response::new(body));
        assert!(json_capped(resp(r#"{"a": 1}"#.into()), 100).await.is_ok());
        assert!(matches!(json_capped(resp("7".repeat(200)), 100).await, Err(LlmError::Permanent(_))));
        assert!(matches!(json_capped(resp("not json".into()), 100).await, Err(LlmError::Retryable { .. })));
    }
    use super::*;

    #[test]
    fn openais_own_api_gets_max_completion_tokens_and_compatible_servers_max_tokens() {
        let c = |url: &str| OpenAiClient::new(url, "m", None, Duration::from_secs(1));
        assert!(c("https://api.openai.com/v1").is_openai());
        assert!(!c("http://127.0.0.1:8000/v1").is_openai());
        assert!(!c("https://api.openai.com.example.org/v1").is_openai());
    }

    /// A key read from Secrets Manager and refused with 401 (rotated there) is read again and the
    /// call made once more with the new key; refused again with no newer key, the call is
    /// retryable (a rotation may be half done), not a permanent failure of the task.
    #[tokio::test]
    async fn a_rotated_key_refused_with_401_is_read_again() {
        use axum::http::{HeaderMap, StatusCode};
        use axum::response::IntoResponse;
        let router = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(|headers: HeaderMap| async move {
                match headers.get("authorization").and_then(|v| v.to_str().ok()) {
                    Some("Bearer new") => {
                        axum::Json(json!({"model": "m", "choices": [{"message": {"content": "ok"}}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 1}}))
                        .into_response()
                    }
                    _ => (StatusCode::UNAUTHORIZED, r#"{"error":{"message":"Incorrect API key"}}"#)
                        .into_response(),
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        let stored = std::sync::Arc::new(std::sync::Mutex::new("old"));
        let fetch: crate::secret::Fetch = {
            let stored = stored.clone();
            std::sync::Arc::new(move || {
                let v = stored.lock().map(|v| v.to_string()).unwrap_or_default();
                Box::pin(async move { Ok(v) })
            })
        };
        let clock = crate::clock::ManualClock::new(0);
        let key = Secret::read_by(fetch, clock.clone());
        let client = OpenAiClient::new(&url, "m", Some(key), Duration::from_secs(5));
        let request = LlmRequest {
            lane: crate::domain::Lane::Interactive,
            kind: crate::domain::Kind::Explain,
            prompt: "p".into(),
            target_files: vec![],
            max_tokens: 8,
            params: Default::default(),
            tier: Default::default(),
            prefix: None,
        };
        let refused = client.complete(&request).await;
        // Not before the key may be read again: a sooner retry would send the same refused key.
        let hint = match refused {
            Err(LlmError::Retryable { retry_after, .. }) => retry_after,
            other => panic!("{other:?}"),
        };
        assert_eq!(hint, Some(crate::secret::MIN_REREAD));
        *stored.lock().unwrap() = "new";
        clock.advance_ms(crate::secret::MIN_REREAD.as_millis() as u64);
        assert_eq!(client.complete(&request).await.unwrap().text, "ok");
        // A key given as a variable and refused stays the permanent 401 it always was.
        let given = OpenAiClient::new(&url, "m", Some("old".into()), Duration::from_secs(5));
        assert!(matches!(given.complete(&request).await, Err(LlmError::Permanent(_))));
    }
}
