//! One call to a model, as every provider and the limiter see it: the request (with its user
//! message), the answer, and what the provider's rate-limit headers said with it. Pure.

use super::tier::{Tier, TierSetting, choose};
use super::{Kind, Lane, ModelParams, TokenUsage};
use std::time::Duration;

/// One call to a model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmRequest {
    /// Lane of the caller (for reservations and metrics).
    pub lane: Lane,
    /// Task kind (the system prompt depends on it).
    pub kind: Kind,
    /// The full prompt.
    pub prompt: String,
    /// Files the task is about.
    pub target_files: Vec<String>,
    /// Upper bound on completion tokens.
    pub max_tokens: u32,
    /// Sampling parameters from the task's `params`.
    pub params: ModelParams,
    /// The tier asked for ([`super::tier::choose`]); a route that does not offer it calls at `sync`.
    pub tier: Tier,
    /// The answer's start, given by an earlier run of the task that was lost: a provider that
    /// continues a prefix is asked for the rest only ([`crate::llm::continuation`]).
    pub prefix: Option<Prefix>,
}

/// An answer's start to continue from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix {
    /// The text.
    pub text: String,
    /// Its completion tokens, as counted when it was read back.
    pub tokens: u32,
}

impl LlmRequest {
    /// The call a task makes: its prompt, files and parameters, its completion capped at `cap` (the
    /// lane's) or lower when the task asks for less.
    pub fn for_task(request: &super::TaskRequest, cap: u32) -> Self {
        let params = ModelParams::from_value(&request.params);
        Self {
            lane: request.lane(),
            kind: request.kind,
            prompt: request.prompt.clone(),
            target_files: request.target_files.clone(),
            max_tokens: params.max_tokens.map_or(cap, |m| m.min(cap)),
            params,
            tier: Tier::Sync,
            prefix: None,
        }
    }

    /// What a provider that continues a prefix is sent: the prefix without its trailing whitespace
    /// (Anthropic refuses an assistant turn that ends in it, and a model continues a word better
    /// than a space), and the completion cap left after it. `None` when there is no prefix, or
    /// nothing of it or of the cap is left.
    pub fn continuation(&self) -> Option<(&str, u32)> {
        let prefix = self.prefix.as_ref()?;
        let text = prefix.text.trim_end();
        let left = self.max_tokens.checked_sub(prefix.tokens).filter(|l| *l > 0)?;
        (!text.is_empty()).then_some((text, left))
    }

    /// The same call for the whole answer.
    pub fn whole(&self) -> Self {
        Self { prefix: None, ..self.clone() }
    }

    /// The same call at the tier for work that has waited `waited`: a task's own `deadline_s` makes
    /// it `auto` with that deadline (`batch` in the synthesis lane, whose worker hands such a call to
    /// a provider batch where its route has one, and makes it at flex where not), else the lane's
    /// setting and deadline decide.
    pub fn at_tier(self, (setting, deadline): (TierSetting, Option<Duration>), waited: Duration) -> Self {
        let own = if self.lane == Lane::Synthesis { TierSetting::Batch } else { TierSetting::Auto };
        let tier = match self.params.deadline_s {
            Some(d) => choose(own, Some(Duration::from_secs(d)), waited),
            None => choose(setting, deadline, waited),
        };
        Self { tier, ..self }
    }

    /// The user message: the prompt plus the files it is about.
    pub fn user_message(&self) -> String {
        if self.target_files.is_empty() {
            self.prompt.clone()
        } else {
            format!("{}\n\nFiles: {}", self.prompt, self.target_files.join(", "))
        }
    }
}

/// What a provider's rate-limit headers say about its limits (per window) and its budget now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProviderLimits {
    /// Requests per window (`x-ratelimit-limit-requests`, `anthropic-ratelimit-requests-limit`).
    pub rpm: Option<f64>,
    /// Tokens per window (`x-ratelimit-limit-tokens`, `anthropic-ratelimit-tokens-limit`).
    pub tpm: Option<f64>,
    /// Set when a `remaining-*` header says the budget is spent: until its `reset-*`.
    pub exhausted_for: Option<Duration>,
    /// What is left of the current window (`remaining-*`): requests, tokens.
    pub remaining: [Option<f64>; 2],
    /// When each of those resets (`reset-*`): requests, tokens.
    pub reset: [Option<Duration>; 2],
}

/// A model's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmResponse {
    /// Generated text.
    pub text: String,
    /// Model name as reported.
    pub model: String,
    /// Usage as reported (or counted, for the offline provider).
    pub usage: TokenUsage,
    /// The model stopped at `max_tokens` (`finish_reason` / `stop_reason` = length / max_tokens).
    pub truncated: bool,
    /// What the provider's rate-limit headers said with this answer.
    pub limits: ProviderLimits,
    /// The tier the provider says it served the call at (what it charged).
    pub tier: Tier,
    /// The route that answered (`provider:model`), set by the routes; empty for a call made without
    /// them.
    pub route: String,
    /// Completion tokens of the request's prefix that the text continues (it starts with that
    /// prefix, not paid for again); 0 when the answer was made whole.
    pub continued: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tasks_own_deadline_opts_it_into_batch_or_flex_whatever_its_lanes_setting() {
        let call = |params: serde_json::Value| LlmRequest {
            lane: Lane::Synthesis,
            kind: Kind::Scaffold,
            prompt: "p".into(),
            target_files: vec![],
            max_tokens: 8,
            params: ModelParams::from_value(&params),
            tier: Tier::Sync,
            prefix: None,
        };
        let sync_lane = (TierSetting::Sync, None);
        let minutes = |m: u64| Duration::from_secs(m * 60);
        let patient = serde_json::json!({"deadline_s": 3600});
        assert_eq!(call(patient.clone()).at_tier(sync_lane, minutes(10)).tier, Tier::Flex);
        assert_eq!(
            call(patient).at_tier(sync_lane, minutes(50)).tier,
            Tier::Sync,
            "too little left for flex"
        );
        assert_eq!(call(serde_json::Value::Null).at_tier(sync_lane, Duration::ZERO).tier, Tier::Sync);
        // Two hours in the synthesis lane: a provider batch; in the interactive lane, flex.
        let patient = serde_json::json!({"deadline_s": 7200});
        assert_eq!(call(patient.clone()).at_tier(sync_lane, minutes(10)).tier, Tier::Batch);
        let interactive = LlmRequest { lane: Lane::Interactive, ..call(patient) };
        assert_eq!(interactive.at_tier(sync_lane, minutes(10)).tier, Tier::Flex);
        let flex_lane = (TierSetting::Flex, None);
        assert_eq!(call(serde_json::Value::Null).at_tier(flex_lane, Duration::ZERO).tier, Tier::Flex);
    }
}
