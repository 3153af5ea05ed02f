//! The commit types both the flow and the ports speak: where a repository lives, a commit to
//! summarize (the `commits` queue's message) and its stored summary, their keys (`repo_id:sha`, with
//! `repo_id = provider:numeric id` so tenants never collide) and validation. Pure.

use crate::domain::TokenUsage;
use serde::{Deserialize, Serialize};

/// Where a repository lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// github.com or GitHub Enterprise.
    Github,
    /// gitlab.com or a self-managed GitLab.
    Gitlab,
    /// A repository on this machine (`lanes summarize`, `lanes dev`); never enabled in Lambda.
    Local,
}

impl Provider {
    /// Lower-case name, the prefix of a `repo_id`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Github => "github",
            Provider::Gitlab => "gitlab",
            Provider::Local => "local",
        }
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a commit reference is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct CommitRefError {
    /// The offending field.
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

fn bad(field: &'static str, reason: impl Into<String>) -> CommitRefError {
    CommitRefError { field, reason: reason.into() }
}

/// Checks a `repo_id`: `github:<digits>`, `gitlab:<digits>` or `local:<hex>`.
pub fn validate_repo_id(repo_id: &str) -> Result<Provider, CommitRefError> {
    let (provider, id) = repo_id
        .split_once(':')
        .ok_or_else(|| bad("repo_id", "must be `provider:id`, e.g. `github:123456`"))?;
    let provider = match provider {
        "github" => Provider::Github,
        "gitlab" => Provider::Gitlab,
        "local" => Provider::Local,
        other => return Err(bad("repo_id", format!("unknown provider `{other}` (github, gitlab or local)"))),
    };
    let ok = match provider {
        Provider::Local => (8..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit()),
        _ => (1..=20).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_digit()),
    };
    if !ok {
        let want = if provider == Provider::Local { "8-64 hex digits" } else { "the numeric id" };
        return Err(bad("repo_id", format!("the id after `{provider}:` must be {want}")));
    }
    Ok(provider)
}

/// Checks a commit sha: 40 (SHA-1) or 64 (SHA-256) lower-case hex digits.
pub fn validate_sha(sha: &str) -> Result<(), CommitRefError> {
    if (sha.len() == 40 || sha.len() == 64) && sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(bad("sha", "must be a full commit id: 40 or 64 lower-case hex digits"))
    }
}

/// One message on the `commits` queue: a commit to summarize.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitMessage {
    /// Where the repository lives.
    pub provider: Provider,
    /// `provider:numeric id`, so two tenants' repositories never collide.
    pub repo_id: String,
    /// Human name (`owner/name`, GitLab's `path_with_namespace`, or a local path).
    pub repo: String,
    /// Full commit id.
    pub sha: String,
    /// First line of the commit message, when the sender knew it.
    #[serde(default)]
    pub subject: String,
    /// Commit time (Unix ms), when known; orders a repository's summaries.
    #[serde(default)]
    pub committed_at_ms: u64,
}

impl CommitMessage {
    /// `repo_id:sha`, the commit's idempotency key.
    pub fn key(&self) -> String {
        commit_key(&self.repo_id, &self.sha)
    }

    /// Checks every field; the provider must match the `repo_id` prefix.
    pub fn validate(&self) -> Result<(), CommitRefError> {
        if validate_repo_id(&self.repo_id)? != self.provider {
            return Err(bad("repo_id", format!("does not start with `{}:`", self.provider)));
        }
        validate_sha(&self.sha)?;
        if self.repo.is_empty() || self.repo.len() > 1024 {
            return Err(bad("repo", "must be 1-1024 bytes"));
        }
        Ok(())
    }
}

/// One message on the `commits` queue: a push whose payload did not list all of its commits (GitLab
/// lists 20, GitHub 2,048). The commits worker asks the host for the commits of `base..head` and
/// sends one [`CommitMessage`] per commit not in `listed` (those were sent by the webhook).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushRange {
    /// Where the repository lives.
    pub provider: Provider,
    /// `provider:numeric id`.
    pub repo_id: String,
    /// Human name (`owner/name` or `path_with_namespace`).
    pub repo: String,
    /// What the ref pointed at before the push, or, for a new branch, the default branch (so a new
    /// branch brings its own commits, not the repository's whole history).
    pub base: String,
    /// What the ref points at now.
    pub head: String,
    /// Commits the payload listed (already sent).
    #[serde(default)]
    pub listed: Vec<String>,
}

impl PushRange {
    /// Checks every field: ids are full shas, `base` a sha or a plain branch name.
    pub fn validate(&self) -> Result<(), CommitRefError> {
        if validate_repo_id(&self.repo_id)? != self.provider {
            return Err(bad("repo_id", format!("does not start with `{}:`", self.provider)));
        }
        validate_sha(&self.head)?;
        let branch_ok = !self.base.is_empty()
            && self.base.len() <= 255
            && !self.base.contains("..")
            && self.base.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        if validate_sha(&self.base).is_err() && !branch_ok {
            return Err(bad("base", "must be a full commit id or a branch name"));
        }
        if self.repo.is_empty() || self.repo.len() > 1024 {
            return Err(bad("repo", "must be 1-1024 bytes"));
        }
        Ok(())
    }
}

/// What the `commits` queue carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CommitsMessage {
    /// A push to expand into commits (`{"range": {...}}`).
    Range {
        /// The push.
        range: PushRange,
    },
    /// A commit to summarize.
    Commit(CommitMessage),
}

/// `repo_id:sha`.
pub fn commit_key(repo_id: &str, sha: &str) -> String {
    format!("{repo_id}:{sha}")
}

/// Cache key of a summary in the hot cache.
pub fn summary_cache_key(repo_id: &str, sha: &str) -> String {
    format!("summary:{repo_id}:{sha}")
}

/// First line of a commit message, at most 200 characters.
pub fn subject_of(message: &str) -> String {
    let line = message.lines().next().unwrap_or("").trim();
    match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_owned(),
    }
}

/// How a summary was produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SummarySource {
    /// By the model.
    Llm,
    /// By a rule, without the model: the commit only touched noise (lockfiles, generated, vendored,
    /// binary files) or nothing at all.
    Rule,
}

/// A commit's summary. Immutable once written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CommitSummary {
    /// `provider:numeric id`.
    pub repo_id: String,
    /// Full commit id.
    pub sha: String,
    /// Human repository name.
    pub repo: String,
    /// First line of the commit message.
    pub subject: String,
    /// The summary.
    pub summary: String,
    /// Model that wrote it (or `rule`).
    pub model: String,
    /// How it was produced.
    pub source: SummarySource,
    /// This commit's share of the tokens of the call that summarized it.
    pub tokens: TokenUsage,
    /// Tokens of the diff sent, after the budget.
    pub diff_tokens: u64,
    /// Whether the diff was cut or had noise removed.
    pub diff_cut: bool,
    /// Commit time (Unix ms), 0 when unknown.
    pub committed_at_ms: u64,
    /// When the summary was written (Unix ms).
    pub created_at_ms: u64,
}

impl CommitSummary {
    /// `repo_id:sha`.
    pub fn key(&self) -> String {
        commit_key(&self.repo_id, &self.sha)
    }

    /// Sort key of a repository's listing, newest first when sorted descending: commit time, then
    /// write time, then sha, zero-padded so string order is time order.
    pub fn order_key(&self) -> String {
        let at = if self.committed_at_ms > 0 { self.committed_at_ms } else { self.created_at_ms };
        format!("{at:015}#{}", self.sha)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_and_shas() {
        assert_eq!(validate_repo_id("github:123"), Ok(Provider::Github));
        assert_eq!(validate_repo_id("gitlab:9"), Ok(Provider::Gitlab));
        assert_eq!(validate_repo_id("local:0123abcd"), Ok(Provider::Local));
        for bad_id in ["github", "github:", "github:abc", "bitbucket:1", "local:xyz", "github:1/../2"] {
            let e = validate_repo_id(bad_id).unwrap_err();
            assert_eq!(e.field, "repo_id", "{bad_id}");
        }
        assert!(validate_sha(&"a".repeat(40)).is_ok());
        assert!(validate_sha(&"A".repeat(40)).is_err());
        assert!(validate_sha("abc123").is_err());
        let m = CommitMessage {
            provider: Provider::Gitlab,
            repo_id: "github:1".into(),
            repo: "o/r".into(),
            sha: "a".repeat(40),
            subject: String::new(),
            committed_at_ms: 0,
        };
        assert_eq!(m.validate().unwrap_err().field, "repo_id");
    }

    #[test]
    fn subjects_are_first_lines_and_bounded() {
        assert_eq!(subject_of("Fix it\n\nbody"), "Fix it");
        assert_eq!(subject_of(&"é".repeat(300)).chars().count(), 201);
    }
}
