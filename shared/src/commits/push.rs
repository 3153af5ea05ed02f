//! A push, as the Git hosts send it: GitHub's and GitLab's documented push payloads parsed into the
//! commits to summarize, the ones left out and why, and for a payload that does not list every
//! commit the range the commits worker expands with the host's API. Pure.

use crate::domain::commit::{CommitMessage, Provider, PushRange, subject_of};
use crate::domain::{IdError, RepoId, Sha};
use crate::problem::Problem;
use axum::http::StatusCode;
use serde::Deserialize;
use tracing::warn;

/// A parsed push: the commits to summarize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Push {
    /// `provider:numeric id`.
    pub repo_id: RepoId,
    /// `owner/name` or `path_with_namespace`.
    pub repo: String,
    /// One message per new commit.
    pub commits: Vec<CommitMessage>,
    /// Commits left out (not distinct, or unusable ids).
    pub skipped: usize,
    /// The push deleted its ref.
    pub deleted: bool,
    /// Commits the push had but its payload did not list (GitLab lists at most 20; GitHub says no
    /// count, so its full list of 2,048 counts as incomplete).
    pub not_listed: usize,
    /// When the payload did not list every commit: the range for the commits worker to expand.
    pub range: Option<PushRange>,
}

/// Most commits a GitHub push payload lists.
pub const GITHUB_MAX_LISTED: usize = 2_048;

/// The range of a push whose payload is incomplete: `before..after`, or for a new branch (`before`
/// all zeros) `default_branch..after`, so the branch brings its own commits and not the history it
/// shares with the default branch.
fn push_range(
    provider: Provider,
    repo_id: &RepoId,
    repo: &str,
    before: &str,
    after: &str,
    default_branch: &str,
    listed: &[CommitMessage],
) -> Option<PushRange> {
    let base = if before.trim_start_matches('0').is_empty() { default_branch } else { before };
    let head = match Sha::parse(after) {
        Ok(head) => head,
        Err(e) => {
            warn!(%repo_id, error = %e, "an incomplete push whose range cannot be expanded");
            return None;
        }
    };
    let range = PushRange {
        provider,
        repo_id: repo_id.clone(),
        repo: repo.to_owned(),
        base: base.to_owned(),
        head,
        listed: listed.iter().map(|c| c.sha.clone()).collect(),
    };
    match range.validate() {
        Ok(()) => Some(range),
        Err(e) => {
            warn!(%repo_id, error = %e, "an incomplete push whose range cannot be expanded");
            None
        }
    }
}

/// The repository a push payload names (`repository.full_name` on GitHub, `project.path_with_namespace`
/// on GitLab), read with the very structs [`parse_push`] reads it with: the owner whose secret must
/// sign a payload is then the owner of the push that is accepted, whatever other keys the payload
/// carries. `None` when the payload names none.
pub fn repository_name(provider: Provider, body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct OnGitHub {
        repository: GitHubRepo,
    }
    #[derive(Deserialize)]
    struct OnGitLab {
        project: GitLabProject,
    }
    match provider {
        Provider::Github => serde_json::from_slice::<OnGitHub>(body).ok().map(|p| p.repository.full_name),
        Provider::Gitlab => {
            serde_json::from_slice::<OnGitLab>(body).ok().map(|p| p.project.path_with_namespace)
        }
        Provider::Local => None,
    }
}

#[derive(Deserialize)]
struct GitHubPush {
    #[serde(default)]
    before: String,
    after: String,
    #[serde(default)]
    deleted: bool,
    repository: GitHubRepo,
    #[serde(default)]
    commits: Vec<GitHubCommit>,
}

#[derive(Deserialize)]
struct GitHubRepo {
    id: u64,
    full_name: String,
    #[serde(default)]
    default_branch: String,
}

#[derive(Deserialize)]
struct GitHubCommit {
    id: String,
    #[serde(default = "yes")]
    distinct: bool,
    #[serde(default)]
    message: String,
    #[serde(default)]
    timestamp: String,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct GitLabPush {
    #[serde(default)]
    before: String,
    after: String,
    #[serde(default)]
    total_commits_count: usize,
    project: GitLabProject,
    #[serde(default)]
    commits: Vec<GitLabCommit>,
}

#[derive(Deserialize)]
struct GitLabProject {
    id: u64,
    path_with_namespace: String,
    #[serde(default)]
    default_branch: String,
}

#[derive(Deserialize)]
struct GitLabCommit {
    id: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    timestamp: String,
}

/// Why a push payload was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PushError(String);

impl From<PushError> for Problem {
    fn from(e: PushError) -> Self {
        Problem::new(StatusCode::BAD_REQUEST, "bad-payload", "Push payload not understood", e.0)
    }
}

fn bad_id(e: IdError) -> PushError {
    PushError(format!("the repository's id: {}", e.reason))
}

fn bad_payload(e: serde_json::Error) -> PushError {
    // serde's message names the missing or mistyped field and where; it says nothing internal.
    PushError(e.to_string())
}

/// Unix ms of an RFC 3339 time with `Z` or a numeric offset; 0 when unparseable.
pub fn rfc3339_ms(s: &str) -> u64 {
    let s = s.trim();
    let (base, offset_secs): (String, i64) =
        match s.len().checked_sub(6).and_then(|i| s.get(i..).map(|t| (i, t))) {
            Some((i, tail))
                if (tail.starts_with('+') || tail.starts_with('-'))
                    && tail.as_bytes().get(3) == Some(&b':') =>
            {
                let h: i64 = tail[1..3].parse().unwrap_or(0);
                let m: i64 = tail[4..6].parse().unwrap_or(0);
                let sign = if tail.starts_with('-') { -1 } else { 1 };
                (format!("{}Z", &s[..i]), sign * (h * 3600 + m * 60))
            }
            _ => (s.to_owned(), 0),
        };
    let Ok(t) = humantime::parse_rfc3339_weak(&base) else { return 0 };
    let Ok(d) = t.duration_since(std::time::UNIX_EPOCH) else { return 0 };
    (d.as_millis() as i64 - offset_secs * 1000).max(0) as u64
}

pub(crate) const ZERO_SHA: &str = "0000000000000000000000000000000000000000";

/// Parses a push event into commit messages.
pub fn parse_push(provider: Provider, body: &[u8]) -> Result<Push, PushError> {
    let mut skipped = 0;
    let mut commits = Vec::new();
    let mut add = |repo_id: &RepoId, repo: &str, id: &str, message: &str, timestamp: &str| {
        let Ok(sha) = Sha::parse(id) else {
            return false;
        };
        commits.push(CommitMessage {
            provider,
            repo_id: repo_id.clone(),
            repo: repo.to_owned(),
            sha,
            subject: subject_of(message),
            committed_at_ms: rfc3339_ms(timestamp),
            escalated: Default::default(),
        });
        true
    };
    let mut not_listed = 0;
    // (repo_id, deleted, the range inputs when the payload is incomplete)
    let (repo_id, repo, deleted, incomplete) = match provider {
        Provider::Github => {
            let p: GitHubPush = serde_json::from_slice(body).map_err(bad_payload)?;
            let repo_id = RepoId::of(provider, &p.repository.id.to_string()).map_err(bad_id)?;
            let deleted = p.deleted || p.after.trim_start_matches('0').is_empty();
            if !deleted {
                for c in &p.commits {
                    if !(c.distinct
                        && add(&repo_id, &p.repository.full_name, &c.id, &c.message, &c.timestamp))
                    {
                        skipped += 1;
                    }
                }
            }
            let incomplete = (!deleted && p.commits.len() >= GITHUB_MAX_LISTED).then(|| {
                (
                    p.repository.full_name.clone(),
                    p.before.clone(),
                    p.after.clone(),
                    p.repository.default_branch.clone(),
                )
            });
            (repo_id, p.repository.full_name, deleted, incomplete)
        }
        Provider::Gitlab => {
            let p: GitLabPush = serde_json::from_slice(body).map_err(bad_payload)?;
            let repo_id = RepoId::of(provider, &p.project.id.to_string()).map_err(bad_id)?;
            let deleted = p.after == ZERO_SHA || p.after.trim_start_matches('0').is_empty();
            not_listed = p.total_commits_count.saturating_sub(p.commits.len());
            if !deleted {
                for c in &p.commits {
                    if !add(&repo_id, &p.project.path_with_namespace, &c.id, &c.message, &c.timestamp) {
                        skipped += 1;
                    }
                }
            }
            let incomplete = (!deleted && not_listed > 0).then(|| {
                (
                    p.project.path_with_namespace.clone(),
                    p.before.clone(),
                    p.after.clone(),
                    p.project.default_branch.clone(),
                )
            });
            (repo_id, p.project.path_with_namespace, deleted, incomplete)
        }
        Provider::Local => {
            return Err(PushError("pushes from local repositories are not webhooks".into()));
        }
    };
    let range = incomplete.and_then(|(name, before, after, default_branch)| {
        push_range(provider, &repo_id, &name, &before, &after, &default_branch, &commits)
    });
    Ok(Push { repo_id, repo, commits, skipped, deleted, not_listed, range })
}
