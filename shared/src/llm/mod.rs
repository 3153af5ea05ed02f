//! LLM providers behind the [`crate::ports::LlmClient`] port: the offline provider, the
//! OpenAI-compatible chat-completions client (OpenAI, vLLM, Ollama, LiteLLM), the Anthropic Messages
//! client, the batch endpoints ([`OpenAiBatches`], [`AnthropicBatches`], and [`OfflineBatches`], their
//! local twin), and the
//! retry policy they share (only 408/409/429/5xx and connection errors, full-jitter
//! backoff honouring the provider's reset headers, bounded attempts), the rate limiter in front of
//! each route's client ([`limited`]), the per-lane routes with their fallback, and the continuation of
//! an answer a lost run began ([`continuation`]).

mod anthropic;
mod anthropic_batch;
pub mod continuation;
pub mod limited;
mod offline;
mod offline_batch;
mod openai;
mod openai_batch;
pub mod price;
pub mod retry;
pub mod route;

pub use anthropic::AnthropicClient;
pub use anthropic_batch::AnthropicBatches;
pub use continuation::Continuing;
pub use limited::{Limited, estimate_tokens, limited};
pub use offline::{BatchAnswer, OFFLINE_MODEL, OfflineProvider};
pub use offline_batch::OfflineBatches;
pub use openai::OpenAiClient;
pub use openai_batch::OpenAiBatches;
pub use retry::{RetryPolicy, Retrying};
