//! AWS Bedrock Converse and ConverseStream (`aws-sdk-bedrockruntime`). Throttling, unavailability,
//! model timeouts, not-ready models and a stream's model error are retryable; validation, access and
//! missing models are permanent. Usage is read from every response: a stream's from its `metadata`
//! event. A stream is an answer only once it has said `messageStop`; an end before it, or 30 s of
//! silence, is a retryable failure, as a cut OpenAI or Anthropic stream is.

use crate::domain::TokenUsage;
use crate::domain::tier::Tier;
use crate::ports::{DeltaSink, LlmClient, LlmError, LlmRequest, LlmResponse};
use async_trait::async_trait;
use aws_sdk_bedrockruntime::Client;
use aws_sdk_bedrockruntime::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_bedrockruntime::types::{
    ContentBlock, ContentBlockDelta, ConversationRole, ConverseOutput, ConverseStreamOutput,
    InferenceConfiguration, Message, ServiceTier, ServiceTierType, StopReason, SystemContentBlock,
};
use std::time::Duration;

/// Longest silence inside a stream before it counts as stalled.
const STALL_LIMIT: Duration = Duration::from_secs(30);

/// A Converse client for one model.
#[derive(Debug, Clone)]
pub struct BedrockClient {
    client: Client,
    model_id: String,
}

impl BedrockClient {
    /// A client for `model_id` (a model or inference-profile id). The SDK's own retries are turned
    /// off: [`crate::llm::Retrying`] owns retries, so attempts stay bounded and jittered in one place.
    pub fn new(sdk: &aws_config::SdkConfig, model_id: &str) -> Self {
        let config = aws_sdk_bedrockruntime::config::Builder::from(sdk)
            .retry_config(aws_sdk_bedrockruntime::config::retry::RetryConfig::disabled())
            .interceptor(super::requests::CountRequests)
            // A generation takes minutes, not the seconds the other AWS calls are given.
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(std::time::Duration::from_secs(3))
                    .operation_timeout(std::time::Duration::from_secs(600))
                    .build(),
            )
            .build();
        Self { client: Client::from_conf(config), model_id: model_id.to_owned() }
    }
}

/// An SDK error of Converse or ConverseStream, by the error code the service named.
fn map_error<E, R>(e: SdkError<E, R>) -> LlmError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    let message = format!("bedrock: {}: {}", e.code().unwrap_or("error"), e.message().unwrap_or_default());
    if e.as_service_error().is_none() {
        // Timeouts, dispatch and response failures: the request may succeed later.
        return LlmError::Retryable { message: format!("bedrock: {e}"), retry_after: None };
    }
    match e.code().unwrap_or_default() {
        "ThrottlingException" => LlmError::Throttled { message, retry_after: None },
        "ServiceUnavailableException"
        | "InternalServerException"
        | "ModelNotReadyException"
        | "ModelTimeoutException"
        | "ModelStreamErrorException" => LlmError::Retryable { message, retry_after: None },
        _ => LlmError::Permanent(message),
    }
}

/// What a refused tier call means: a model without the tier is a validation error naming it, and
/// any other validation error of a tier call is asked again at sync, whose answer is final. For
/// flex, a failure a retry would answer (the service unavailable to flex, a model timeout, a cut
/// connection) is flex's spare capacity failing, answered at sync too; a priority call is retried
/// as it is. A throttle stays a throttle (the account's quota, which `sync` shares).
fn tier_refusal<E, R>(tier: Tier, e: SdkError<E, R>) -> LlmError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    let said = format!("{} {}", e.code().unwrap_or_default(), e.message().unwrap_or_default());
    if e.as_service_error().is_some() && e.code() == Some("ValidationException") {
        let unsupported = ["tier", tier.as_str()].iter().any(|w| said.to_ascii_lowercase().contains(w));
        return LlmError::TierRefused { message: format!("bedrock: {said}"), unsupported };
    }
    match map_error(e) {
        LlmError::Retryable { message, .. } if tier == Tier::Flex => {
            LlmError::TierRefused { message, unsupported: false }
        }
        other => other,
    }
}

/// The failure of a call asked at `tier`.
fn call_error<E, R>(tier: Tier, e: SdkError<E, R>) -> LlmError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    if tier == Tier::Sync { map_error(e) } else { tier_refusal(tier, e) }
}

/// The parts of a request Converse and ConverseStream share: the user's message, the inference
/// settings and the service tier.
fn request_parts(
    request: &LlmRequest,
) -> Result<(Vec<Message>, InferenceConfiguration, Option<ServiceTier>), LlmError> {
    let message = |role, text| {
        Message::builder()
            .role(role)
            .content(ContentBlock::Text(text))
            .build()
            .map_err(|e| LlmError::Permanent(format!("bedrock request: {e}")))
    };
    let mut messages = vec![message(ConversationRole::User, request.user_message())?];
    let mut cap = request.max_tokens;
    // A continued answer: the saved text is the assistant turn's start (prefill, which Claude
    // models on Bedrock take), and the cap is what is left of it.
    if let Some((prefix, left)) = request.continuation() {
        messages.push(message(ConversationRole::Assistant, prefix.to_owned())?);
        cap = left;
    }
    let max_tokens = i32::try_from(cap).unwrap_or(i32::MAX);
    let tier = match request.tier {
        // Bedrock's batch inference is a job over S3, not a tier of Converse: a synchronous call
        // asked at `batch` is made at the list price.
        Tier::Sync | Tier::Batch => None,
        Tier::Flex => Some(ServiceTierType::Flex),
        Tier::Priority => Some(ServiceTierType::Priority),
    };
    let tier = tier
        .map(|t| ServiceTier::builder().r#type(t).build())
        .transpose()
        .map_err(|e| LlmError::Permanent(format!("bedrock request: {e}")))?;
    Ok((messages, inference_config(request, max_tokens), tier))
}

/// The tier that served a call, as the answer names it.
fn served_tier(tier: Option<&ServiceTier>) -> Tier {
    match tier.map(|t| t.r#type()) {
        Some(ServiceTierType::Flex) => Tier::Flex,
        Some(ServiceTierType::Priority) => Tier::Priority,
        _ => Tier::Sync,
    }
}

/// Whether the model stopped at a cap rather than at its answer's end.
fn truncated(stop: &StopReason) -> bool {
    matches!(stop, StopReason::MaxTokens | StopReason::ModelContextWindowExceeded)
}

fn usage_of(usage: Option<&aws_sdk_bedrockruntime::types::TokenUsage>) -> TokenUsage {
    TokenUsage {
        prompt: usage.map_or(0, |u| u.input_tokens().max(0) as u64),
        completion: usage.map_or(0, |u| u.output_tokens().max(0) as u64),
    }
}

/// Converse's inference settings from the task's parameters (Converse has no seed).
fn inference_config(request: &LlmRequest, max_tokens: i32) -> InferenceConfiguration {
    let p = &request.params;
    InferenceConfiguration::builder()
        .max_tokens(max_tokens)
        .set_temperature(p.temperature.map(|t| t as f32))
        .set_top_p(p.top_p.map(|t| t as f32))
        .set_stop_sequences((!p.stop.is_empty()).then(|| p.stop.clone()))
        .build()
}

/// `builder` (Converse's or ConverseStream's: distinct types with the same setters) with the
/// request's model, system prompt, message, inference settings and tier.
macro_rules! asked {
    ($client:expr, $request:expr, $builder:expr) => {{
        let (messages, inference, tier) = request_parts($request)?;
        $builder
            .model_id(&$client.model_id)
            .system(SystemContentBlock::Text($request.kind.system_prompt().to_owned()))
            .set_messages(Some(messages))
            .inference_config(inference)
            .set_service_tier(tier)
    }};
}

#[async_trait]
impl LlmClient for BedrockClient {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let out = asked!(self, request, self.client.converse())
            .send()
            .await
            .map_err(|e| call_error(request.tier, e))?;
        let text: String = match out.output() {
            Some(ConverseOutput::Message(m)) => m
                .content()
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::Text(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect(),
            _ => String::new(),
        };
        if text.is_empty() {
            return Err(LlmError::Retryable {
                message: "bedrock: answer without text".into(),
                retry_after: None,
            });
        }
        Ok(LlmResponse {
            limits: Default::default(),
            truncated: truncated(out.stop_reason()),
            text,
            model: self.model_id.clone(),
            usage: usage_of(out.usage()),
            tier: served_tier(out.service_tier()),
            route: Default::default(),
            continued: 0,
        })
    }

    /// ConverseStream: each text delta goes to `sink` as it comes; the usage and the tier come in
    /// the `metadata` event, the stop reason in `messageStop`, without which it is no answer.
    async fn stream(&self, request: &LlmRequest, sink: &dyn DeltaSink) -> Result<LlmResponse, LlmError> {
        let out = asked!(self, request, self.client.converse_stream())
            .send()
            .await
            .map_err(|e| call_error(request.tier, e))?;
        let mut events = out.stream;
        let (mut text, mut stop, mut usage, mut served) =
            (String::new(), None, TokenUsage::default(), Tier::Sync);
        loop {
            let next = tokio::time::timeout(STALL_LIMIT, events.recv()).await.map_err(|_| {
                LlmError::Retryable { message: "bedrock: the stream stalled".into(), retry_after: None }
            })?;
            match next.map_err(map_error)? {
                None => break,
                Some(ConverseStreamOutput::ContentBlockDelta(d)) => {
                    if let Some(ContentBlockDelta::Text(t)) = d.delta() {
                        sink.delta(t);
                        text.push_str(t);
                    }
                }
                Some(ConverseStreamOutput::MessageStop(m)) => stop = Some(m.stop_reason().clone()),
                Some(ConverseStreamOutput::Metadata(m)) => {
                    usage = usage_of(m.usage());
                    served = served_tier(m.service_tier());
                }
                Some(_) => {}
            }
        }
        let Some(stop) = stop.filter(|_| !text.is_empty()) else {
            let message = "bedrock: the stream ended before its answer did".into();
            return Err(LlmError::Retryable { message, retry_after: None });
        };
        Ok(LlmResponse {
            limits: Default::default(),
            truncated: truncated(&stop),
            text,
            model: self.model_id.clone(),
            usage,
            tier: served,
            route: Default::default(),
            continued: 0,
        })
    }
}
