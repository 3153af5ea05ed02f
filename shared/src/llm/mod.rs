//! LLM providers behind the [`crate::ports::LlmClient`] port: the offline provider, the
//! OpenAI-compatible chat-completions client (OpenAI, vLLM, Ollama, LiteLLM), the Anthropic Messages
//! client, and the retry policy they share (only 408/409/429/5xx and connection errors, full-jitter
//! backoff honouring the provider's reset headers, bounded attempts), the rate limiter in front of
//! each route's client ([`limited`]), and the per-lane routes with their fallback.

mod anthropic;
pub mod limited;
mod offline;
mod openai;
pub mod price;
pub mod retry;
pub mod route;

pub use anthropic::AnthropicClient;
pub use limited::{Limited, estimate_tokens, limited};
pub use offline::{BatchAnswer, OFFLINE_MODEL, OfflineProvider};
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
