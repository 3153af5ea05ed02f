//! The commit types both the flow and the ports speak: where a repository lives, a commit to
//! summarize (the `commits` queue's message) and its stored summary, their keys (`repo_id:sha`, with
//! `repo_id = provider:numeric id` so tenants never collide) and validation. Pure.

use crate::domain::TokenUsage;
use crate::domain::fairness;
use crate::domain::ids::{RepoId, Sha};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::domain::ids::Provider;

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

/// Whether `base` of a push names a branch: 1 to 255 bytes of `[A-Za-z0-9-_./]`, no `..`.
fn is_branch_name(base: &str) -> bool {
    !base.is_empty()
        && base.len() <= 255
        && !base.contains("..")
        && base.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
}

/// One message on the `commits` queue: a commit to summarize.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitMessage {
    /// Where the repository lives.
    pub provider: Provider,
    /// `provider:numeric id`, so two tenants' repositories never collide.
    pub repo_id: RepoId,
    /// Human name (`owner/name`, GitLab's `path_with_namespace`, or a local path).
    pub repo: String,
    /// Full commit id.
    pub sha: Sha,
    /// First line of the commit message, when the sender knew it.
    #[serde(default)]
    pub subject: String,
    /// Commit time (Unix ms), when known; orders a repository's summaries.
    #[serde(default)]
    pub committed_at_ms: u64,
    /// Set on a commit a provider batch did not answer in time ([`crate::domain::batch`]), sent
    /// back to the queue by the collector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalated: Option<Escalation>,
}

/// How a commit sent back by a batch's collector is to be asked again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Escalation {
    /// The cheapest tier it may be asked at now (never a batch again).
    pub floor: crate::domain::tier::Tier,
    /// When it was first enqueued (Unix ms): its deadline still counts from there.
    pub enqueued_at_ms: u64,
    /// The key of the batch that sent it on: that batch's marker no longer owns it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// The attributes a message of the `commits` queue is sent with: its lane, and its group (the
/// repository's owner: [`fairness::commit_group`]).
fn send_attributes(provider: Provider, repo: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("lane".to_owned(), "commits".to_owned()),
        (fairness::GROUP_ATTRIBUTE.to_owned(), fairness::commit_group(provider, repo)),
    ])
}

impl CommitMessage {
    /// Whose budget the commit is charged to: its repository id, by the owner its push was for.
    pub fn scope(&self) -> PushScope {
        PushScope::of(&self.repo_id, &self.repo)
    }

    /// The attributes it is sent with ([`send_attributes`]).
    pub fn send_attributes(&self) -> BTreeMap<String, String> {
        send_attributes(self.provider, &self.repo)
    }

    /// `repo_id:sha`, the commit's idempotency key.
    pub fn key(&self) -> String {
        commit_key(&self.repo_id, &self.sha)
    }

    /// Checks what the id types do not: the provider must match the `repo_id` prefix, and the
    /// name must be bounded.
    pub fn validate(&self) -> Result<(), CommitRefError> {
        if self.repo_id.provider() != self.provider {
            return Err(bad("repo_id", format!("does not start with `{}:`", self.provider)));
        }
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
    pub repo_id: RepoId,
    /// Human name (`owner/name` or `path_with_namespace`).
    pub repo: String,
    /// What the ref pointed at before the push, or, for a new branch, the default branch (so a new
    /// branch brings its own commits, not the repository's whole history).
    pub base: String,
    /// What the ref points at now.
    pub head: Sha,
    /// Commits the payload listed (already sent).
    #[serde(default)]
    pub listed: Vec<Sha>,
}

impl PushRange {
    /// The attributes it is sent with ([`send_attributes`]): its commits' group.
    pub fn send_attributes(&self) -> BTreeMap<String, String> {
        send_attributes(self.provider, &self.repo)
    }

    /// Checks what the id types do not: the provider must match the `repo_id` prefix, `base` must be
    /// a sha or a plain branch name, and the name must be bounded.
    pub fn validate(&self) -> Result<(), CommitRefError> {
        if self.repo_id.provider() != self.provider {
            return Err(bad("repo_id", format!("does not start with `{}:`", self.provider)));
        }
        if Sha::parse(&self.base).is_err() && !is_branch_name(&self.base) {
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

/// What a repository's daily commit budget counts pushes by: the repository's id and the owner its
/// name gives (the first segment of `owner/name`, GitLab's top-level group), hashed as its
/// fair-order group. The id alone is only what the push claims: a push that pairs another
/// repository's id with its own owner's name (which the commits worker refuses once the host says
/// what the id names) is counted apart from that repository's, so it cannot use up its day. That
/// holds for every owner with a webhook secret of its own (`LANES_WEBHOOK_OWNER_SECRETS`): only its
/// secret signs a push in its name. Owners served by the shared secret trust each other: any holder
/// of that secret can sign a push in their names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PushScope {
    /// The repository the push claims.
    pub repo_id: RepoId,
    /// [`fairness::commit_group`] of the push's repository name.
    pub owner: String,
}

impl PushScope {
    /// The scope of a push to `repo_id` named `repo` (`owner/name`, or GitLab's
    /// `path_with_namespace`).
    pub fn of(repo_id: &RepoId, repo: &str) -> Self {
        Self { repo_id: repo_id.clone(), owner: fairness::commit_group(repo_id.provider(), repo) }
    }
}

impl std::fmt::Display for PushScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.repo_id, self.owner)
    }
}

/// `repo_id:sha`.
pub fn commit_key(repo_id: &RepoId, sha: &Sha) -> String {
    format!("{repo_id}:{sha}")
}

/// Cache key of a summary in the hot cache.
pub fn summary_cache_key(repo_id: &RepoId, sha: &Sha) -> String {
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
    #[schema(value_type = String, pattern = r"^(github|gitlab):[0-9]{1,20}$|^local:[0-9a-fA-F]{8,64}$")]
    pub repo_id: RepoId,
    /// Full commit id.
    #[schema(value_type = String, pattern = "^([0-9a-f]{40}|[0-9a-f]{64})$")]
    pub sha: Sha,
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
    /// The tier the model served the call at (what its tokens were charged at).
    #[serde(default)]
    pub tier: crate::domain::tier::Tier,
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
    fn a_commit_whose_provider_is_not_its_repo_ids_prefix_is_refused() {
        let sha = |c: &str| Sha::parse(&c.repeat(40));
        let m = CommitMessage {
            provider: Provider::Gitlab,
            repo_id: RepoId::parse("github:1").unwrap(),
            repo: "o/r".into(),
            sha: sha("a").unwrap(),
            subject: String::new(),
            committed_at_ms: 0,
            escalated: Default::default(),
        };
        assert_eq!(m.validate().map_err(|e| e.field), Err("repo_id"));
        let json = r#"{"provider":"github","repo_id":"github:1","repo":"o/r","sha":"HEAD"}"#;
        assert!(serde_json::from_str::<CommitMessage>(json).is_err(), "a short sha is refused at decode");
        let range = PushRange {
            provider: Provider::Github,
            repo_id: RepoId::parse("github:1").unwrap(),
            repo: "o/r".into(),
            base: "main/../x".into(),
            head: sha("b").unwrap(),
            listed: vec![],
        };
        assert_eq!(range.validate().map_err(|e| e.field), Err("base"));
    }

    #[test]
    fn subjects_are_first_lines_and_bounded() {
        assert_eq!(subject_of("Fix it\n\nbody"), "Fix it");
        assert_eq!(subject_of(&"é".repeat(300)).chars().count(), 201);
    }
}
