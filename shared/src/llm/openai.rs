//! OpenAI-compatible chat completions (`POST {base}/chat/completions`): OpenAI, vLLM, Ollama, LiteLLM.
//! Usage is read from every response; throttles and server errors carry the provider's reset hint.

use super::retry::{is_retryable_status, rate_limits, retry_hint};
use super::{system_prompt, user_message};
use crate::domain::TokenUsage;
use crate::ports::{LlmClient, LlmError, LlmRequest, LlmResponse};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};

/// A chat-completions client.
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    timeout: Duration,
    base_url: String,
    model: String,
    api_key: Option<String>,
}

impl OpenAiClient {
    /// A client for `base_url` (e.g. `https://api.openai.com/v1`) and `model`, with a per-request timeout.
    pub fn new(base_url: &str, model: &str, api_key: Option<String>, timeout: Duration) -> Self {
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
}

/// The process's HTTPS client ([`crate::http`], built at the first request); each request sets its
/// provider's timeout.
pub(super) fn http_client() -> Result<reqwest::Client, LlmError> {
    crate::http::client()
        .map_err(|e| LlmError::Retryable { message: format!("HTTP client: {e}"), retry_after: None })
}

/// Maps a transport error: timeouts and connection failures are worth retrying.
pub(super) fn transport_error(e: &reqwest::Error) -> LlmError {
    let message =
        if e.is_timeout() { "request timed out".to_owned() } else { format!("connection failed: {e}") };
    LlmError::Retryable { message, retry_after: None }
}

/// Maps a non-success HTTP answer to a retryable or permanent error, keeping the provider's message
/// short and the reset hint.
pub(super) async fn status_error(provider: &str, resp: reqwest::Response) -> LlmError {
    let status = resp.status().as_u16();
    let hint = retry_hint(resp.headers(), SystemTime::now());
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    let detail = body["error"]["message"].as_str().unwrap_or("").chars().take(300).collect::<String>();
    let message = format!("{provider} answered {status}: {detail}");
    if status == 429 {
        LlmError::Throttled { message, retry_after: hint }
    } else if is_retryable_status(status) {
        LlmError::Retryable { message, retry_after: hint }
    } else {
        LlmError::Permanent(message)
    }
}

#[async_trait]
impl LlmClient for OpenAiClient {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let mut body = json!({
            "model": self.model,
            "messages": [
                {"role": "system", "content": system_prompt(request.kind)},
                {"role": "user", "content": user_message(request)},
            ],
        });
        // OpenAI's own API deprecated `max_tokens` (its reasoning models refuse it); compatible
        // servers (vLLM, Ollama, LiteLLM) still expect it.
        let cap = if self.is_openai() { "max_completion_tokens" } else { "max_tokens" };
        body[cap] = json!(request.max_tokens);
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
        let mut req = http_client()?
            .post(format!("{}/chat/completions", self.base_url))
            .timeout(self.timeout)
            .json(&body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.map_err(|e| transport_error(&e))?;
        if !resp.status().is_success() {
            return Err(status_error("provider", resp).await);
        }
        let limits = rate_limits(resp.headers(), SystemTime::now());
        let v: Value = resp.json().await.map_err(|e| transport_error(&e))?;
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
            model: v["model"].as_str().unwrap_or(&self.model).to_owned(),
            usage: TokenUsage {
                prompt: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                completion: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openais_own_api_gets_max_completion_tokens_and_compatible_servers_max_tokens() {
        let c = |url: &str| OpenAiClient::new(url, "m", None, Duration::from_secs(1));
        assert!(c("https://api.openai.com/v1").is_openai());
        assert!(!c("http://127.0.0.1:8000/v1").is_openai());
        assert!(!c("https://api.openai.com.example.org/v1").is_openai());
    }
}
