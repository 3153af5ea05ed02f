//! Anthropic Messages (`POST {base}/v1/messages`, `anthropic-version: 2023-06-01`). Usage is read
//! from every response; 429/529 carry the `anthropic-ratelimit-*-reset` or `retry-after` hint.
//! Streamed (`stream: true`), the text goes to the caller as it arrives, complete only at
//! `message_stop`.

use super::openai::{MAX_ANSWER_BYTES, STALL_LIMIT, SseEvents, cut, json_capped, send_error, status_error};
use crate::domain::TokenUsage;
use crate::ports::{DeltaSink, LlmClient, LlmError, LlmRequest, LlmResponse};
use crate::secret::Secret;
use async_trait::async_trait;
use serde_json::{Value, json};
use std::time::Duration;

/// A Messages API client.
#[derive(Debug, Clone)]
pub struct AnthropicClient {
    pub(super) timeout: Duration,
    pub(super) base_url: String,
    pub(super) model: String,
    pub(super) api_key: Secret,
}

impl AnthropicClient {
    /// A client for `base_url` (e.g. `https://api.anthropic.com`) and `model`.
    pub fn new(base_url: &str, model: &str, api_key: Secret, timeout: Duration) -> Self {
        Self {
            timeout,
            base_url: base_url.trim_end_matches('/').to_owned(),
            model: model.to_owned(),
            api_key,
        }
    }
}

impl AnthropicClient {
    /// The Messages body of `request` (also a batch request's `params`).
    pub(super) fn messages_body(&self, request: &LlmRequest) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": request.max_tokens,
            "system": request.kind.system_prompt(),
            "messages": [{"role": "user", "content": request.user_message()}],
        });
        // A continued answer: the saved text is the assistant turn's start (prefill), and the cap
        // is what is left of it.
        if let Some((prefix, left)) = request.continuation() {
            if let Some(messages) = body["messages"].as_array_mut() {
                messages.push(json!({"role": "assistant", "content": prefix}));
            }
            body["max_tokens"] = json!(left);
        }
        // The Messages API has no seed.
        let p = &request.params;
        if let Some(t) = p.temperature {
            // Anthropic's range is 0 to 1.
            body["temperature"] = json!(t.min(1.0));
        }
        if let Some(t) = p.top_p {
            body["top_p"] = json!(t);
        }
        if !p.stop.is_empty() {
            body["stop_sequences"] = json!(p.stop);
        }
        body
    }
}

#[async_trait]
impl LlmClient for AnthropicClient {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let resp = self.post(&self.messages_body(request)).await?;
        let limits = super::retry::rate_limits(resp.headers(), std::time::SystemTime::now());
        let v: Value = json_capped(resp, MAX_ANSWER_BYTES).await?;
        message_answer(&v, &self.model, limits)
    }

    /// `stream: true`: the text from each `content_block_delta`, the usage from `message_start`
    /// and `message_delta`, complete only at `message_stop`.
    async fn stream(&self, request: &LlmRequest, sink: &dyn DeltaSink) -> Result<LlmResponse, LlmError> {
        let mut body = self.messages_body(request);
        body["stream"] = json!(true);
        let resp = self.post(&body).await?;
        let limits = super::retry::rate_limits(resp.headers(), std::time::SystemTime::now());
        let mut events = SseEvents::new(resp, self.timeout.min(STALL_LIMIT));
        let mut message = json!({"content": [{"type": "text", "text": ""}], "usage": {}});
        let mut text = String::new();
        loop {
            let event = events.next("message_stop").await?;
            let data: Value =
                serde_json::from_str(&event.data).map_err(|_| cut("a stream event that is not JSON"))?;
            match data["type"].as_str().unwrap_or_default() {
                "message_start" => {
                    message = json!({"content": [], "model": data["message"]["model"], "usage": data["message"]["usage"]})
                }
                "content_block_delta" if data["delta"]["type"] == "text_delta" => {
                    let piece = data["delta"]["text"].as_str().unwrap_or_default();
                    if text.len() + piece.len() > MAX_ANSWER_BYTES {
                        return Err(LlmError::Permanent(format!(
                            "the provider's answer is over {MAX_ANSWER_BYTES} bytes"
                        )));
                    }
                    text.push_str(piece);
                    sink.delta(piece);
                }
                "message_delta" => {
                    message["stop_reason"] = data["delta"]["stop_reason"].clone();
                    message["usage"]["output_tokens"] = data["usage"]["output_tokens"].clone();
                }
                "message_stop" => break,
                "error" => {
                    let kind: String =
                        data["error"]["type"].as_str().unwrap_or("error").chars().take(60).collect();
                    return Err(cut(format!("the provider's stream failed: {kind}")));
                }
                _ => {}
            }
        }
        message["content"] = json!([{"type": "text", "text": text}]);
        message_answer(&message, &self.model, limits)
    }
}

impl AnthropicClient {
    /// Posts a Messages body: the answer, once its status says it is one.
    async fn post(&self, body: &Value) -> Result<reqwest::Response, LlmError> {
        let url = format!("{}/v1/messages", self.base_url);
        let resp = crate::http::send(Some(&self.api_key), |http, key| {
            http.post(&url)
                .timeout(self.timeout)
                .header("x-api-key", key.unwrap_or_default())
                .header("anthropic-version", "2023-06-01")
                .json(body)
        })
        .await
        .map_err(send_error)?;
        if !resp.status().is_success() {
            return Err(status_error("provider", resp).await);
        }
        Ok(resp)
    }
}

/// A Message's answer (a synchronous one, or a batch request's result).
pub(super) fn message_answer(
    v: &Value,
    default_model: &str,
    limits: crate::domain::model_call::ProviderLimits,
) -> Result<LlmResponse, LlmError> {
    let text: String = v["content"]
        .as_array()
        .map(|blocks| {
            blocks.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect()
        })
        .unwrap_or_default();
    if text.is_empty() {
        return Err(LlmError::Retryable { message: "answer without text content".into(), retry_after: None });
    }
    Ok(LlmResponse {
        truncated: v["stop_reason"] == "max_tokens",
        limits,
        text,
        model: v["model"].as_str().unwrap_or(default_model).to_owned(),
        usage: TokenUsage {
            prompt: v["usage"]["input_tokens"].as_u64().unwrap_or(0),
            completion: v["usage"]["output_tokens"].as_u64().unwrap_or(0),
        },
        // Anthropic serves at its Priority Tier by the organisation's capacity commitment, not
        // per request, and says so in `usage.service_tier`; it has no flex tier (its discount
        // is the Message Batches API).
        tier: match v["usage"]["service_tier"].as_str() {
            Some("priority") => crate::domain::tier::Tier::Priority,
            _ => crate::domain::tier::Tier::Sync,
        },
        route: Default::default(),
        continued: 0,
    })
}
