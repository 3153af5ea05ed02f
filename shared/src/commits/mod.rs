//! The commit flow, shaped like [`crate::tasks`]: Git push webhooks, diff sources, the diff budget,
//! micro-batched summaries and the commits worker. The types it moves around (commit messages and
//! summaries, their keys) are [`crate::domain::commit`]'s, so the ports see them without this flow.
//!
//! - [`webhook`]: signature checks, delivery dedupe; `enqueue`: one message per commit, within the
//!   repository's daily commit budget at the door.
//! - [`signatures`]: the hosts' push checks, and which secret verifies a push (its owner's own,
//!   else the shared one).
//! - [`push`]: the hosts' push payloads parsed into the commits to summarize (and the range of an
//!   incomplete one).
//! - [`sources`]: where diffs come from: GitHub REST, GitLab REST, a local repository.
//! - [`api`]: the read API (one summary, a repository's summaries newest first).
//! - [`readers`]: which tenants may read a repository's summaries (those mapped to its owner).
//! - [`budget`]: noise filtering and the 4,000-token cut, counted by a real BPE tokenizer.
//! - [`prompt`]: the batch prompt, first-fit-decreasing packing, answer validation, token apportioning.
//! - [`dead_letters`]: the commits DLQ: summarized commits swept out, the rest listed and redriven.
//! - `repo_budget`: each repository's daily commit budget, taken before a diff is fetched.
//! - [`report`]: what a batch did, commit by commit.
//! - [`batches`]: the commits handed to a provider batch at tier `batch` (recorded, looked up,
//!   submitted, then acked), and [`collect`]: the collector that reads the ended batches, writes
//!   each summary once and sends the unanswered on at the next tier.
//! - [`worker`]: the commits lane's batch worker (cache -> store -> lease -> diffs -> LLM -> write once),
//!   with what it reads from the Git host in `fetch` (diffs, push ranges) and its model calls in
//!   `calls` (packing, apportioning, asking alone, writing once).

pub mod api;
pub mod batches;
pub mod budget;
mod calls;
pub mod collect;
pub mod dead_letters;
mod enqueue;
mod fetch;
mod group;
pub mod prompt;
pub mod push;
pub mod readers;
mod repo_budget;
pub mod report;
pub mod signatures;
pub mod sources;
pub mod webhook;
pub mod worker;

use std::time::Duration;

pub use crate::ports::Batching;

/// Tunables of the commits worker.
#[derive(Debug, Clone, Copy)]
pub struct CommitsConfig {
    /// Per-commit diff budget in tokens.
    pub diff_tokens: usize,
    /// Prompt-token budget of one call (commit sections).
    pub batch_tokens: usize,
    /// Most commits per call.
    pub max_commits_per_call: usize,
    /// Lifetime of a summary in the hot cache.
    pub cache_ttl: Duration,
    /// Diffs fetched at once.
    pub diff_concurrency: usize,
    /// LLM calls at once (the shared limiter still applies).
    pub llm_concurrency: usize,
    /// Longest one commit's diff may take to fetch and trim: a slower one is handed back alone, so it
    /// never holds the rest of the batch.
    pub fetch_deadline: Duration,
}

impl Default for CommitsConfig {
    fn default() -> Self {
        Self {
            diff_tokens: budget::DIFF_TOKENS,
            batch_tokens: prompt::BATCH_TOKENS,
            max_commits_per_call: prompt::MAX_COMMITS_PER_CALL,
            cache_ttl: Duration::from_secs(24 * 3600),
            diff_concurrency: 8,
            llm_concurrency: 4,
            fetch_deadline: Duration::from_secs(20),
        }
    }
}
