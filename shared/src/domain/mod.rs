//! The vocabulary both flows and the ports share: lanes and the kinds that decide them, token
//! counts, the field-naming error of a rejected input, the checked identifiers ([`ids`]), who a message is fair to and in what order ([`fairness`]), what a budget charges ([`quota`]), each group's share of a lane in tokens ([`token_share`]), the service tier a call is made at ([`tier`]), what a client asks for ([`request`]), the
//! task's record ([`task`]) and its transition table ([`lifecycle`]), why a task failed as a client
//! sees it ([`failure`]), and the commit types ([`commit`]). Pure: no I/O.

pub mod batch;
pub mod commit;
pub mod concurrency;
pub mod events;
pub mod failure;
pub mod fairness;
pub mod ids;
pub mod lifecycle;
pub mod limits;
pub mod model_call;
pub mod quota;
pub mod request;
pub mod task;
pub mod tier;
pub mod token_share;

pub use ids::{IdError, MessageId, RepoId, Sha, TaskId, Tenant};
pub use request::{MAX_BODY_BYTES, ModelParams, TaskRequest};
pub use task::{Parked, Partial, TaskMessage, TaskRecord, TaskResult, TaskStatus, TaskView};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// A queue lane. The kind of a task decides its lane. See docs/ARCHITECTURE.md, Lanes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    /// Short, latency-sensitive tasks (SLA < 3 s).
    Interactive,
    /// Long generation tasks (45–180 s); one per invocation.
    Synthesis,
    /// Commit summaries, batched.
    Commits,
}

impl Lane {
    /// Every lane, in priority order.
    pub const ALL: [Lane; 3] = [Lane::Interactive, Lane::Synthesis, Lane::Commits];

    /// Position in [`Lane::ALL`], for per-lane arrays.
    pub fn index(self) -> usize {
        match self {
            Lane::Interactive => 0,
            Lane::Synthesis => 1,
            Lane::Commits => 2,
        }
    }

    /// The lane's name as used in queue names, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Interactive => "interactive",
            Lane::Synthesis => "synthesis",
            Lane::Commits => "commits",
        }
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Lane {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Lane::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| format!("unknown lane `{s}` (expected interactive, synthesis or commits)"))
    }
}

/// A task kind. Unknown kinds are rejected, never guessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Inline completion.
    Autocomplete,
    /// Explain code.
    Explain,
    /// Propose a lint fix.
    LintPatch,
    /// Classify a change or a file.
    Classify,
    /// Propose a test.
    TestPatch,
    /// Scaffold a project or module.
    Scaffold,
    /// Edit several files.
    MultiFile,
    /// Refactor.
    Refactor,
    /// Multi-step agent run.
    Agent,
    /// Summary of one Git commit.
    CommitSummary,
}

impl Kind {
    /// The system prompt of the kind's model calls.
    pub fn system_prompt(self) -> &'static str {
        match self {
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

    /// Every kind.
    pub const ALL: [Kind; 10] = [
        Kind::Autocomplete,
        Kind::Explain,
        Kind::LintPatch,
        Kind::Classify,
        Kind::TestPatch,
        Kind::Scaffold,
        Kind::MultiFile,
        Kind::Refactor,
        Kind::Agent,
        Kind::CommitSummary,
    ];

    /// The lane this kind runs in. See docs/ARCHITECTURE.md, Lanes.
    pub fn lane(self) -> Lane {
        match self {
            Kind::Autocomplete | Kind::Explain | Kind::LintPatch | Kind::Classify | Kind::TestPatch => {
                Lane::Interactive
            }
            Kind::Scaffold | Kind::MultiFile | Kind::Refactor | Kind::Agent => Lane::Synthesis,
            Kind::CommitSummary => Lane::Commits,
        }
    }

    /// Whether `POST /v1/tasks` accepts this kind (kinds of the commits lane come from the webhook).
    pub fn is_task(self) -> bool {
        self.lane() != Lane::Commits
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Autocomplete => "autocomplete",
            Kind::Explain => "explain",
            Kind::LintPatch => "lint_patch",
            Kind::Classify => "classify",
            Kind::TestPatch => "test_patch",
            Kind::Scaffold => "scaffold",
            Kind::MultiFile => "multi_file",
            Kind::Refactor => "refactor",
            Kind::Agent => "agent",
            Kind::CommitSummary => "commit_summary",
        }
    }
}

impl FromStr for Kind {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s).ok_or(())
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem with a request, naming the field it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// JSON pointer-ish name of the field (`target_files[3]`), or `body`.
    pub field: String,
    /// Why it was rejected, in words a client can act on.
    pub reason: String,
}

impl FieldError {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { field: field.into(), reason: reason.into() }
    }
}

/// Largest completion cap a task may ask for (`params.max_tokens`; a lane's own cap may be lower,
/// and the lower one applies).
pub const MAX_PARAM_TOKENS: u32 = 128_000;

/// Tokens spent on one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Completion tokens.
    pub completion: u64,
}

impl TokenUsage {
    /// The tokens the provider reported, or `None` when it reported none. Every answer reads its
    /// prompt, so a total of zero means usage was left out (a proxy that drops it, a stream whose
    /// server ignores `include_usage`), not a free call: each place that charges for an answer
    /// (the budgets, the limiter, the token share) keeps its estimate then.
    pub fn reported(&self) -> Option<u64> {
        Some(self.prompt.saturating_add(self.completion)).filter(|&total| total > 0)
    }
}

/// Hex-encoded sha256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `prefix` followed by the first 32 hex digits (128 bits) of `bytes`' sha256: the short, opaque
/// name of an identity (a tenant, a project, a repository owner) in queue groups and cache keys, so
/// the identity itself never reaches them.
pub fn hashed_tag(prefix: &str, bytes: &[u8]) -> String {
    format!("{prefix}{}", hex::encode(&Sha256::digest(bytes)[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hashed_tag_is_its_prefix_and_the_first_half_of_the_hex_sha256() {
        let tag = hashed_tag("t-", b"tenant");
        assert_eq!(tag, format!("t-{}", &sha256_hex(b"tenant")[..32]));
        assert_eq!(hashed_tag("", b"x").len(), 32);
    }

    #[test]
    fn kinds_map_to_lanes() {
        assert_eq!(Kind::Explain.lane(), Lane::Interactive);
        assert_eq!(Kind::Autocomplete.lane(), Lane::Interactive);
        assert_eq!(Kind::Refactor.lane(), Lane::Synthesis);
        assert_eq!(Kind::Agent.lane(), Lane::Synthesis);
        assert_eq!(Kind::CommitSummary.lane(), Lane::Commits);
        for k in Kind::ALL {
            assert_eq!(k.as_str().parse::<Kind>(), Ok(k));
        }
    }
}
