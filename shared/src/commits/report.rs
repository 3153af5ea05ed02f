//! What a commits batch did: how each commit was answered (model, rule, cache, store) and the counts
//! behind metrics, logs, `lanes summarize` and the benchmarks.

use crate::domain::TokenUsage;
use crate::domain::commit::CommitSummary;
use serde::Serialize;

/// Where a commit's summary came from in this batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Served {
    /// Written now by the model.
    Llm,
    /// Written now by a rule (noise-only commit).
    Rule,
    /// Found in the hot cache.
    Cache,
    /// Found in the durable store.
    Store,
}

/// One commit finished in this batch.
#[derive(Debug, Clone, Serialize)]
pub struct Done {
    /// How it was answered.
    pub served: Served,
    /// The stored summary.
    pub summary: CommitSummary,
}

/// What a batch did (for metrics, logs, `lanes summarize` and benchmarks).
#[derive(Debug, Clone, Default, Serialize)]
pub struct BatchReport {
    /// Distinct commits in the batch.
    pub commits: usize,
    /// Model calls made.
    pub llm_calls: u64,
    /// Answered from the hot cache.
    pub cache_hits: u64,
    /// Answered from the durable store.
    pub store_hits: u64,
    /// Summarized by rule, no model.
    pub rule_summaries: u64,
    /// Prompt tokens reported by the model.
    pub prompt_tokens: u64,
    /// Completion tokens reported by the model.
    pub completion_tokens: u64,
    /// Commits whose summary another worker wrote first.
    pub lost_races: u64,
    /// Commits sent to the queue from pushes whose payload did not list them all.
    pub expanded: u64,
    /// Commits handed to a provider batch, or found in one: acked, the batch's record owns them.
    pub batched: u64,
    /// Commits finished.
    pub done: Vec<Done>,
}

impl BatchReport {
    /// Counts one answered model call and its tokens.
    pub fn add_call(&mut self, usage: TokenUsage) {
        self.llm_calls += 1;
        self.prompt_tokens += usage.prompt;
        self.completion_tokens += usage.completion;
    }
}
