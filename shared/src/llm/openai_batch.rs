//! OpenAI's Batch API ([`crate::ports::BatchApi`]): a batch's requests uploaded as one JSONL file
//! (`POST /files`, `purpose=batch`), the batch made from it (`POST /batches`, a 24-hour window, our
//! key in its `metadata`), polled (`GET /batches/{id}`), and, once it ended, its output and error
//! files read (`GET /files/{id}/content`), one line per request by `custom_id`. Each line's body is
//! the chat completion a synchronous call would have had, so it is read the same way
//! ([`super::openai::chat_answer`]), and charged at the batch price.

use super::openai::{OpenAiClient, chat_answer, json_capped, jsonl_capped, send_error, status_error};
use crate::domain::tier::Tier;
use crate::ports::{BatchAnswer, BatchApi, BatchEnd, BatchStatus, BatchSubmission, LlmError, SubmitError};
use async_trait::async_trait;
use serde_json::{Value, json};

/// The metadata field that carries a batch's key.
const KEY_FIELD: &str = "lanes_key";
/// Most pages of the batch list read to find a key (100 batches a page, newest first): past
/// them the lookup is an error, never a "none".
const FIND_PAGES: usize = 100;
/// How much earlier than the submission's record a batch may say it was created (clocks differ).
const FIND_SLACK_MS: u64 = 10 * 60 * 1000;
/// Most bytes of a batch's output or error file read.
const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;

/// The Batch API of one OpenAI route.
#[derive(Debug, Clone)]
pub struct OpenAiBatches {
    chat: OpenAiClient,
    route: String,
}

impl OpenAiBatches {
    /// The batches of the route `route` (`openai:model`), through `chat`'s base URL and key.
    pub fn new(chat: OpenAiClient, route: String) -> Self {
        Self { chat, route }
    }

    async fn send(
        &self,
        build: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, LlmError> {
        let url = self.chat.base_url.clone();
        let resp = crate::http::send(self.chat.api_key.as_ref(), |http, key| {
            let req = build(http, &url).timeout(self.chat.timeout);
            match key {
                Some(key) => req.bearer_auth(key),
                None => req,
            }
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

    /// A file's content, as lines.
    async fn file_lines(&self, id: &str) -> Result<Vec<Value>, LlmError> {
        let resp = self.send(|http, base| http.get(format!("{base}/files/{id}/content"))).await?;
        jsonl_capped(resp, MAX_FILE_BYTES).await
    }

    /// One output or error line: its request's answer, or why it has none.
    fn answer(&self, line: &Value) -> Option<BatchAnswer> {
        let custom_id = line["custom_id"].as_str()?.to_owned();
        let response = &line["response"];
        let outcome = if response["status_code"].as_u64() == Some(200) {
            chat_answer(&response["body"], &self.chat.model, Default::default())
                .map(|a| crate::ports::LlmResponse { tier: Tier::Batch, route: self.route.clone(), ..a })
                .map_err(|e| e.to_string())
        } else {
            let why = [&response["body"]["error"]["message"], &line["error"]["message"]]
                .iter()
                .find_map(|m| m.as_str())
                .unwrap_or("no answer")
                .chars()
                .take(300)
                .collect::<String>();
            Err(format!("status {}: {why}", response["status_code"]))
        };
        Some(BatchAnswer { custom_id, outcome })
    }
}

/// The id to ask the next page of a newest-first batch list after: `None` on the last page, an
/// error when a page says there is more but names no usable id (the lookup cannot go on).
pub(super) fn next_page(page: &Value) -> Result<Option<String>, LlmError> {
    let last = page["data"].as_array().and_then(|d| d.last()).and_then(|b| b["id"].as_str());
    match (page["has_more"].as_bool(), last) {
        // A batch id is a prefix and letters and digits: nothing to escape in a query.
        (Some(true), Some(last)) if last.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
            Ok(Some(last.to_owned()))
        }
        (Some(true), _) => Err(LlmError::Retryable {
            message: "batch list page with no usable last id".into(),
            retry_after: None,
        }),
        _ => Ok(None),
    }
}

/// A lookup that read every page it may and did not reach the batches made before the submission.
pub(super) fn unfinished(since_ms: u64) -> LlmError {
    LlmError::Retryable {
        message: format!("batch lookup did not reach batches made before {since_ms} ms"),
        retry_after: None,
    }
}

#[async_trait]
impl BatchApi for OpenAiBatches {
    fn route(&self) -> &str {
        &self.route
    }

    async fn find(&self, key: &str, since_ms: u64, _requests: usize) -> Result<Option<String>, LlmError> {
        let mut after: Option<String> = None;
        for _ in 0..FIND_PAGES {
            let page = self
                .json(|http, base| {
                    let after = after.as_deref().map(|a| format!("&after={a}")).unwrap_or_default();
                    http.get(format!("{base}/batches?limit=100{after}"))
                })
                .await?;
            let data = page["data"].as_array().cloned().unwrap_or_default();
            if let Some(b) = data.iter().find(|b| b["metadata"][KEY_FIELD] == key) {
                return Ok(b["id"].as_str().map(str::to_owned));
            }
            // Newest first: once a batch is older than the submission, no later page holds it.
            let older =
                |b: &Value| b["created_at"].as_u64().is_some_and(|c| c * 1000 + FIND_SLACK_MS < since_ms);
            if data.last().is_some_and(older) {
                return Ok(None);
            }
            match next_page(&page)? {
                Some(last) => after = Some(last),
                None => return Ok(None),
            }
        }
        Err(unfinished(since_ms))
    }

    async fn submit(&self, batch: &BatchSubmission) -> Result<String, SubmitError> {
        let mut jsonl = String::new();
        for (custom_id, request) in &batch.calls {
            let line = json!({
                "custom_id": custom_id,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": self.chat.chat_body(request),
            });
            jsonl.push_str(&line.to_string());
            jsonl.push('\n');
        }
        let name = format!("{}.jsonl", batch.key);
        let file = self
            .json(|http, base| {
                let part =
                    reqwest::multipart::Part::bytes(jsonl.clone().into_bytes()).file_name(name.clone());
                let form = reqwest::multipart::Form::new().text("purpose", "batch").part("file", part);
                http.post(format!("{base}/files")).multipart(form)
            })
            .await
            .map_err(SubmitError::NotMade)?;
        // A file is not a batch: whatever became of the upload, no batch was made yet.
        let file_id = file["id"].as_str().ok_or_else(|| {
            SubmitError::NotMade(LlmError::Retryable {
                message: "file upload answered without an id".into(),
                retry_after: None,
            })
        })?;
        let body = json!({
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {KEY_FIELD: batch.key},
        });
        // A refusal (4xx) made nothing; anything else may have made the batch.
        let made =
            self.json(|http, base| http.post(format!("{base}/batches")).json(&body)).await.map_err(|e| {
                match e {
                    LlmError::Permanent(_) => SubmitError::NotMade(e),
                    e => SubmitError::Unknown(e),
                }
            })?;
        made["id"].as_str().map(str::to_owned).ok_or_else(|| {
            SubmitError::Unknown(LlmError::Retryable {
                message: "batch creation answered without an id".into(),
                retry_after: None,
            })
        })
    }

    async fn status(&self, id: &str) -> Result<BatchStatus, LlmError> {
        let b = self.json(|http, base| http.get(format!("{base}/batches/{id}"))).await?;
        let status = b["status"].as_str().unwrap_or("").to_owned();
        let end = match status.as_str() {
            "completed" => BatchEnd::Completed,
            "expired" => BatchEnd::Expired,
            "cancelled" => BatchEnd::Cancelled,
            "failed" => BatchEnd::Failed,
            _ => return Ok(BatchStatus::Running(status)),
        };
        let mut answers = Vec::new();
        for file in ["output_file_id", "error_file_id"] {
            if let Some(f) = b[file].as_str() {
                answers.extend(self.file_lines(f).await?.iter().filter_map(|l| self.answer(l)));
            }
        }
        Ok(BatchStatus::Ended(end, answers))
    }

    async fn cancel(&self, id: &str) -> Result<(), LlmError> {
        self.json(|http, base| http.post(format!("{base}/batches/{id}/cancel"))).await.map(|_| ())
    }
}
