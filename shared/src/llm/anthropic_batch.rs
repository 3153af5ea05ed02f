//! Anthropic's Message Batches ([`crate::ports::BatchApi`]): a batch's requests sent as one
//! `POST /v1/messages/batches`, polled (`GET /v1/messages/batches/{id}`: `in_progress`,
//! `canceling`, `ended`), and, once ended, its results read (`GET .../results`, one JSON line per
//! request: `succeeded` with the Message a synchronous call would have had, `errored`, `canceled`
//! or `expired`).
//!
//! A Message Batch has no metadata, so the batch's key travels in each request's `custom_id`
//! (`<key>-<id>`, 57 characters of `[a-zA-Z0-9_-]`, within Anthropic's 64). Looking a key up reads
//! the results of the batches made since the submission; one of those still running with as many
//! requests cannot be told apart, so the lookup then fails (it is asked again next tick, and the
//! collector sends the commits on if the deadline nears) rather than answer "none".

use super::anthropic::{AnthropicClient, message_answer};
use super::openai::{json_capped, jsonl_capped, send_error, status_error};
use super::openai_batch::{next_page, unfinished};
use crate::domain::tier::Tier;
use crate::ports::{
    BatchAnswer, BatchApi, BatchEnd, BatchStatus, BatchSubmission, LlmError, LlmResponse, SubmitError,
};
use async_trait::async_trait;
use serde_json::{Value, json};

/// Most pages of the batch list read in a lookup (100 batches a page, newest first).
const FIND_PAGES: usize = 20;
/// How much earlier than the submission's record a batch may say it was made (clocks differ).
const FIND_SLACK_MS: u64 = 10 * 60 * 1000;
/// Most bytes of a batch's results read.
const MAX_RESULTS_BYTES: usize = 64 * 1024 * 1024;

/// The Message Batches of one Anthropic route.
#[derive(Debug, Clone)]
pub struct AnthropicBatches {
    messages: AnthropicClient,
    route: String,
}

impl AnthropicBatches {
    /// The batches of the route `route` (`anthropic:model`), through `messages`' base URL and key.
    pub fn new(messages: AnthropicClient, route: String) -> Self {
        Self { messages, route }
    }

    async fn send(
        &self,
        build: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, LlmError> {
        let base = format!("{}/v1/messages/batches", self.messages.base_url);
        let resp = crate::http::send(Some(&self.messages.api_key), |http, key| {
            build(http, &base)
                .timeout(self.messages.timeout)
                .header("x-api-key", key.unwrap_or_default())
                .header("anthropic-version", "2023-06-01")
        })
        .await
        .map_err(send_error)?;
        if resp.status().is_success() { Ok(resp) } else { Err(status_error("provider", resp).await) }
    }

    async fn json(
        &self,
        build: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
    ) -> Result<Value, LlmError> {
        json_capped(self.send(build).await?, 1024 * 1024).await
    }

    /// An ended batch's result lines.
    async fn results(&self, id: &str) -> Result<Vec<Value>, LlmError> {
        let resp = self.send(|http, base| http.get(format!("{base}/{id}/results"))).await?;
        jsonl_capped(resp, MAX_RESULTS_BYTES).await
    }

    /// One result line, its `custom_id` stripped of the key: the request's answer, or why it has none.
    fn answer(&self, line: &Value) -> Option<BatchAnswer> {
        let wire = line["custom_id"].as_str()?;
        let custom_id = wire.split_once('-').and_then(|(_, rest)| rest.split_once('-')).map(|(_, id)| id)?;
        let result = &line["result"];
        let outcome = match result["type"].as_str() {
            Some("succeeded") => message_answer(&result["message"], &self.messages.model, Default::default())
                .map(|a| LlmResponse { tier: Tier::Batch, route: self.route.clone(), ..a })
                .map_err(|e| e.to_string()),
            Some("errored") => Err(result["error"]["error"]["message"]
                .as_str()
                .unwrap_or("errored")
                .chars()
                .take(300)
                .collect()),
            other => Err(other.unwrap_or("no result").to_owned()),
        };
        Some(BatchAnswer { custom_id: custom_id.to_owned(), outcome })
    }
}

/// The `custom_id` a request is sent with: the batch's key, then its own id.
fn wire_id(key: &str, custom_id: &str) -> String {
    format!("{key}-{custom_id}")
}

/// A batch's creation time (RFC 3339) in Unix ms.
fn created_ms(b: &Value) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(b["created_at"].as_str()?).ok()?;
    t.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_millis() as u64)
}

#[async_trait]
impl BatchApi for AnthropicBatches {
    fn route(&self) -> &str {
        &self.route
    }

    async fn find(&self, key: &str, since_ms: u64, requests: usize) -> Result<Option<String>, LlmError> {
        let prefix = format!("{key}-");
        let mut after: Option<String> = None;
        for _ in 0..FIND_PAGES {
            let page = self
                .json(|http, base| {
                    let after = after.as_deref().map(|a| format!("&after_id={a}")).unwrap_or_default();
                    http.get(format!("{base}?limit=100{after}"))
                })
                .await?;
            let data = page["data"].as_array().cloned().unwrap_or_default();
            for b in &data {
                // Newest first: a batch made before the submission cannot be it, nor any after it.
                if created_ms(b).is_some_and(|c| c + FIND_SLACK_MS < since_ms) {
                    return Ok(None);
                }
                let Some(id) = b["id"].as_str() else { continue };
                // A running batch of another size cannot be this one.
                let c = &b["request_counts"];
                let total: u64 = ["processing", "succeeded", "errored", "canceled", "expired"]
                    .iter()
                    .map(|k| c[*k].as_u64().unwrap_or(0))
                    .sum();
                if b["processing_status"] != "ended" && total != requests as u64 {
                    continue;
                }
                if b["processing_status"] != "ended" {
                    return Err(LlmError::Retryable {
                        message: format!(
                            "batch {id}, made since, is still running: looked up again once it ends"
                        ),
                        retry_after: None,
                    });
                }
                let results = self.results(id).await?;
                if results.iter().any(|l| l["custom_id"].as_str().is_some_and(|c| c.starts_with(&prefix))) {
                    return Ok(Some(id.to_owned()));
                }
            }
            match next_page(&page)? {
                Some(last) => after = Some(last),
                None => return Ok(None),
            }
        }
        Err(unfinished(since_ms))
    }

    async fn submit(&self, batch: &BatchSubmission) -> Result<String, SubmitError> {
        let requests: Vec<Value> = batch
            .calls
            .iter()
            .map(|(id, request)| {
                json!({"custom_id": wire_id(&batch.key, id), "params": self.messages.messages_body(request)})
            })
            .collect();
        let body = json!({"requests": requests});
        // A refusal (4xx) made nothing; anything else may have made the batch.
        let made = self.json(|http, base| http.post(base).json(&body)).await.map_err(|e| match e {
            LlmError::Permanent(_) => SubmitError::NotMade(e),
            e => SubmitError::Unknown(e),
        })?;
        made["id"].as_str().map(str::to_owned).ok_or_else(|| {
            SubmitError::Unknown(LlmError::Retryable {
                message: "batch creation answered without an id".into(),
                retry_after: None,
            })
        })
    }

    async fn status(&self, id: &str) -> Result<BatchStatus, LlmError> {
        let b = self.json(|http, base| http.get(format!("{base}/{id}"))).await?;
        if b["processing_status"] != "ended" {
            return Ok(BatchStatus::Running(b["processing_status"].as_str().unwrap_or("").to_owned()));
        }
        let counts = &b["request_counts"];
        let end = if counts["expired"].as_u64().unwrap_or(0) > 0 {
            BatchEnd::Expired
        } else if counts["canceled"].as_u64().unwrap_or(0) > 0 {
            BatchEnd::Cancelled
        } else {
            BatchEnd::Completed
        };
        let answers = self.results(id).await?.iter().filter_map(|l| self.answer(l)).collect();
        Ok(BatchStatus::Ended(end, answers))
    }

    async fn cancel(&self, id: &str) -> Result<(), LlmError> {
        self.json(|http, base| http.post(format!("{base}/{id}/cancel"))).await.map(|_| ())
    }
}
