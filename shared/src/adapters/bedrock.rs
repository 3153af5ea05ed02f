//! AWS Bedrock Converse (`aws-sdk-bedrockruntime`). Throttling, unavailability, model timeouts and
//! not-ready models are retryable; validation, access and missing models are permanent. Usage is read
//! from every response.

use crate::domain::TokenUsage;
use crate::domain::tier::Tier;
use crate::ports::{LlmClient, LlmError, LlmRequest, LlmResponse};
use async_trait::async_trait;
use aws_sdk_bedrockruntime::Client;
use aws_sdk_bedrockruntime::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_bedrockruntime::operation::converse::ConverseError;
use aws_sdk_bedrockruntime::types::{
    ContentBlock, ConversationRole, ConverseOutput, InferenceConfiguration, Message, ServiceTier,
    ServiceTierType, SystemContentBlock,
};

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

fn map_error(e: SdkError<ConverseError>) -> LlmError {
    let message = format!("bedrock: {}: {}", e.code().unwrap_or("error"), e.message().unwrap_or_default());
    match e.as_service_error() {
        Some(ConverseError::ThrottlingException(_)) => LlmError::Throttled { message, retry_after: None },
        Some(
            ConverseError::ServiceUnavailableException(_)
            | ConverseError::InternalServerException(_)
            | ConverseError::ModelNotReadyException(_)
            | ConverseError::ModelTimeoutException(_),
        ) => LlmError::Retryable { message, retry_after: None },
        Some(_) => LlmError::Permanent(message),
        // Timeouts, dispatch and response failures: the request may succeed later.
        None => LlmError::Retryable { message: format!("bedrock: {e}"), retry_after: None },
    }
}

/// What a refused tier call means: a model without the tier is a validation error naming it, and
/// any other validation error of a tier call is asked again at sync, whose answer is final. For
/// flex, a failure a retry would answer (the service unavailable to flex, a model timeout, a cut
/// connection) is flex's spare capacity failing, answered at sync too; a priority call is retried
/// as it is. A throttle stays a throttle (the account's quota, which `sync` shares).
fn tier_refusal(tier: Tier, e: SdkError<ConverseError>) -> LlmError {
    let said = format!("{} {}", e.code().unwrap_or_default(), e.message().unwrap_or_default());
    let message = format!("bedrock: {said}");
    match e.as_service_error() {
        Some(ConverseError::ValidationException(_)) => {
            let unsupported = ["tier", tier.as_str()].iter().any(|w| said.to_ascii_lowercase().contains(w));
            LlmError::TierRefused { message, unsupported }
        }
        _ => match map_error(e) {
            LlmError::Retryable { message, .. } if tier == Tier::Flex => {
                LlmError::TierRefused { message, unsupported: false }
            }
            other => other,
        },
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

#[async_trait]
impl LlmClient for BedrockClient {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let message = Message::builder()
            .role(ConversationRole::User)
            .content(ContentBlock::Text(request.user_message()))
            .build()
            .map_err(|e| LlmError::Permanent(format!("bedrock request: {e}")))?;
        let max_tokens = i32::try_from(request.max_tokens).unwrap_or(i32::MAX);
        let tier = match request.tier {
            // Bedrock's batch inference is a job over S3, not a tier of Converse: a synchronous
            // call asked at `batch` is made at the list price.
            Tier::Sync | Tier::Batch => None,
            Tier::Flex => Some(ServiceTierType::Flex),
            Tier::Priority => Some(ServiceTierType::Priority),
        };
        let out = self
            .client
            .converse()
            .model_id(&self.model_id)
            .system(SystemContentBlock::Text(request.kind.system_prompt().to_owned()))
            .messages(message)
            .inference_config(inference_config(request, max_tokens))
            .set_service_tier(
                tier.map(|t| ServiceTier::builder().r#type(t).build())
                    .transpose()
                    .map_err(|e| LlmError::Permanent(format!("bedrock request: {e}")))?,
            )
            .send()
            .await
            .map_err(
                |e| if request.tier == Tier::Sync { map_error(e) } else { tier_refusal(request.tier, e) },
            )?;
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
        let usage = out.usage();
        Ok(LlmResponse {
            limits: Default::default(),
            truncated: matches!(
                out.stop_reason(),
                aws_sdk_bedrockruntime::types::StopReason::MaxTokens
                    | aws_sdk_bedrockruntime::types::StopReason::ModelContextWindowExceeded
            ),
            text,
            model: self.model_id.clone(),
            usage: TokenUsage {
                prompt: usage.map_or(0, |u| u.input_tokens().max(0) as u64),
                completion: usage.map_or(0, |u| u.output_tokens().max(0) as u64),
            },
            tier: match out.service_tier().map(|t| t.r#type()) {
                Some(ServiceTierType::Flex) => Tier::Flex,
                Some(ServiceTierType::Priority) => Tier::Priority,
                _ => Tier::Sync,
            },
            route: Default::default(),
        })
    }
}
