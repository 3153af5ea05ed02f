//! LLM providers behind the [`crate::ports::LlmClient`] port: the offline provider, the
//! OpenAI-compatible chat-completions client (OpenAI, vLLM, Ollama, LiteLLM), the Anthropic Messages
//! client, and the retry policy they share (only 408/409/429/5xx and connection errors, full-jitter
//! backoff honouring the provider's reset headers, bounded attempts).

mod anthropic;
mod bedrock;
pub mod mock;
mod offline;
mod openai;
pub mod retry;

pub use anthropic::AnthropicClient;
pub use bedrock::BedrockClient;
pub use offline::{OFFLINE_MODEL, OfflineProvider};
pub use openai::OpenAiClient;
pub use retry::{RetryPolicy, Retrying};

use crate::domain::Kind;

/// The system prompt for a task kind.
pub fn system_prompt(kind: Kind) -> &'static str {
    match kind {
        Kind::Autocomplete => "Complete the code at the cursor. Answer with code only.",
        Kind::Explain => "Explain what the code does, briefly and precisely.",
        Kind::LintPatch => {
            "Propose a minimal patch that fixes the lint findings. Answer with a unified diff."
        }
        Kind::Classify => "Classify the change. Answer with one label and one sentence of reason.",
        Kind::TestPatch => "Write a focused test for the code. Answer with a unified diff.",
        Kind::Scaffold => "Scaffold the requested project or module. Answer with files as unified diffs.",
        Kind::MultiFile => "Make the requested change across the files. Answer with a unified diff.",
        Kind::Refactor => "Refactor as requested without changing behaviour. Answer with a unified diff.",
        Kind::Agent => "Plan and carry out the task step by step. Answer with the result.",
        Kind::CommitSummary => {
            "You summarize Git commits for a changelog, one or two sentences each. Answer with only a JSON \
             array of {\"sha\", \"summary\"} objects, one per commit in the prompt."
        }
    }
}

/// The user message: the prompt plus the files it is about.
pub fn user_message(request: &crate::ports::LlmRequest) -> String {
    if request.target_files.is_empty() {
        request.prompt.clone()
    } else {
        format!("{}\n\nFiles: {}", request.prompt, request.target_files.join(", "))
    }
}

/// Puts the limiter (if any) in front of `llm`. A budget wait longer than `max_wait` hands the task
/// back to its queue.
pub fn limited(
    llm: std::sync::Arc<dyn crate::ports::LlmClient>,
    limiter: Option<std::sync::Arc<dyn crate::limiter::RateLimiter>>,
    max_wait: std::time::Duration,
) -> std::sync::Arc<dyn crate::ports::LlmClient> {
    match limiter {
        Some(limiter) => std::sync::Arc::new(crate::limiter::Limited::new(llm, limiter, max_wait)),
        None => llm,
    }
}

/// The limiter's name for the configured provider and model: one shared budget per model.
pub fn limiter_name() -> String {
    format!(
        "{}:{}",
        crate::config::optional_env("LANES_LLM_PROVIDER").unwrap_or_else(|| "offline".into()),
        std::env::var("LANES_LLM_MODEL").unwrap_or_default()
    )
}

/// Reads an API key from AWS Secrets Manager (a plain string secret, or JSON with an `api_key` field).
pub async fn fetch_secret(
    client: &aws_sdk_secretsmanager::Client,
    secret_id: &str,
) -> Result<String, crate::config::ConfigError> {
    fetch_named_secret(client, secret_id, "LANES_LLM_API_KEY_SECRET").await
}

/// A value from the variable `var`, else from the Secrets Manager secret named by `secret_var`
/// (fetched once, at cold start), else `None`.
pub async fn env_or_secret(
    var: &'static str,
    secret_var: &'static str,
) -> Result<Option<String>, crate::config::ConfigError> {
    if let Some(v) = crate::config::optional_env(var) {
        return Ok(Some(v));
    }
    match crate::config::optional_env(secret_var) {
        None => Ok(None),
        Some(secret) => {
            let sdk = crate::adapters::sdk_config(&Default::default()).await;
            let client = aws_sdk_secretsmanager::Client::new(&sdk);
            Ok(Some(fetch_named_secret(&client, &secret, secret_var).await?))
        }
    }
}

/// [`fetch_secret`], naming `var` in its errors.
pub async fn fetch_named_secret(
    client: &aws_sdk_secretsmanager::Client,
    secret_id: &str,
    var: &'static str,
) -> Result<String, crate::config::ConfigError> {
    use aws_sdk_secretsmanager::error::ProvideErrorMetadata;
    crate::metrics::aws_request("secretsmanager", "GetSecretValue");
    let invalid = |reason: String| crate::config::ConfigError::Invalid { name: var, reason };
    let out = client.get_secret_value().secret_id(secret_id).send().await.map_err(|e| {
        invalid(format!("{}: {}", e.code().unwrap_or("error"), e.message().unwrap_or_default()))
    })?;
    let raw = out.secret_string().ok_or_else(|| invalid("the secret has no string value".into()))?;
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(serde_json::Value::Object(m)) => m
            .get("api_key")
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .ok_or_else(|| invalid("the JSON secret has no `api_key` string".into())),
        _ => Ok(raw.trim().to_owned()),
    }
}

/// Chooses the provider from the environment, once per process:
/// `LANES_LLM_PROVIDER` = `offline` (default) | `openai` | `anthropic` | `bedrock`; `LANES_LLM_MODEL`
/// (required but for offline; the model id for Bedrock); `LANES_LLM_BASE_URL` (defaults to the
/// vendor's); the key from `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`, or, in Lambda, from the Secrets
/// Manager secret named by `LANES_LLM_API_KEY_SECRET` (fetched once per container);
/// `LANES_LLM_TIMEOUT_MS` (default 120000). Real providers are wrapped in [`Retrying`].
pub async fn from_env(
    offline_latency: std::time::Duration,
) -> Result<std::sync::Arc<dyn crate::ports::LlmClient>, crate::config::ConfigError> {
    use crate::config::{ConfigError, require_env};
    use std::sync::Arc;
    let timeout = match std::env::var("LANES_LLM_TIMEOUT_MS") {
        Err(_) => std::time::Duration::from_secs(120),
        Ok(v) => std::time::Duration::from_millis(v.trim().parse().map_err(|_| ConfigError::Invalid {
            name: "LANES_LLM_TIMEOUT_MS",
            reason: format!("`{v}` is not a whole number"),
        })?),
    };
    let base = |default: &str| {
        crate::config::optional_env("LANES_LLM_BASE_URL").unwrap_or_else(|| default.to_owned())
    };
    let invalid = |e: crate::ports::LlmError| ConfigError::Invalid {
        name: "LANES_LLM_PROVIDER",
        reason: e.to_string(),
    };
    let key = |var: &'static str| env_or_secret(var, "LANES_LLM_API_KEY_SECRET");
    match crate::config::optional_env("LANES_LLM_PROVIDER").unwrap_or_else(|| "offline".into()).as_str() {
        "offline" => Ok(Arc::new(OfflineProvider::new(|_| offline_latency))),
        "openai" => {
            let client = OpenAiClient::new(
                &base("https://api.openai.com/v1"),
                &require_env("LANES_LLM_MODEL")?,
                key("OPENAI_API_KEY").await?,
                timeout,
            )
            .map_err(invalid)?;
            Ok(Arc::new(Retrying::new(client, RetryPolicy::default())))
        }
        "anthropic" => {
            let api_key = key("ANTHROPIC_API_KEY").await?.ok_or(ConfigError::Missing("ANTHROPIC_API_KEY"))?;
            let client = AnthropicClient::new(
                &base("https://api.anthropic.com"),
                &require_env("LANES_LLM_MODEL")?,
                api_key,
                timeout,
            )
            .map_err(invalid)?;
            Ok(Arc::new(Retrying::new(client, RetryPolicy::default())))
        }
        "bedrock" => {
            let sdk = crate::adapters::sdk_config(&Default::default()).await;
            let client = BedrockClient::new(&sdk, &require_env("LANES_LLM_MODEL")?);
            Ok(Arc::new(Retrying::new(client, RetryPolicy::default())))
        }
        other => Err(ConfigError::Invalid {
            name: "LANES_LLM_PROVIDER",
            reason: format!("`{other}`; expected offline, openai, anthropic or bedrock"),
        }),
    }
}
