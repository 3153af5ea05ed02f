//! GitHub's REST API as a diff source: a commit's diff (`Accept: application/vnd.github.diff`, or
//! its files' patches page by page when the diff is too large), and a push range's commits
//! (`compare`), for github.com or Enterprise. Every path names the repository by its numeric id
//! (`/repositories/{id}/…`), after the id's name is checked against the message's
//! ([`super::identity`]).

use super::identity::Identities;
use super::{MAX_DIFF_BYTES, read_diff, read_json_page, send_authed, status_error};
use crate::domain::commit::{CommitMessage, Provider, PushRange, subject_of};
use crate::domain::{RepoId, Sha};
use crate::ports::{DiffError, DiffSource};
use crate::secret::Secret;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// GitHub's REST API (github.com or Enterprise).
#[derive(Debug, Clone)]
pub struct GitHubSource {
    timeout: Duration,
    api: String,
    token: Option<Secret>,
    identities: Arc<Identities>,
}

impl GitHubSource {
    /// A source on `api` (e.g. `https://api.github.com`) with an optional token.
    pub fn new(api: &str, token: Option<Secret>, timeout: Duration) -> Self {
        Self { timeout, api: api.trim_end_matches('/').to_owned(), token, identities: Default::default() }
    }

    /// `{api}/repositories/{id}`, once the host has said that `repo_id` is `repo`.
    async fn repository(&self, repo_id: &RepoId, repo: &str) -> Result<String, DiffError> {
        let id = repo_id.host_id();
        let base = format!("{}/repositories/{id}", self.api);
        self.identities
            .check(repo_id, repo, || async {
                let (r, _): (GitHubRepository, _) = self.json_page(&base).await?;
                Ok((r.id, r.full_name))
            })
            .await?;
        Ok(base)
    }
}

/// The fields of `GET /repositories/{id}` (GitHub's "full repository") that name it.
#[derive(serde::Deserialize)]
struct GitHubRepository {
    id: u64,
    full_name: String,
}

#[async_trait]
impl DiffSource for GitHubSource {
    async fn diff(&self, commit: &CommitMessage) -> Result<String, DiffError> {
        if !valid_github_repo(&commit.repo) {
            return Err(DiffError::Permanent(format!("`{}` is not a GitHub `owner/name`", commit.repo)));
        }
        let url = format!("{}/commits/{}", self.repository(&commit.repo_id, &commit.repo).await?, commit.sha);
        let resp = send_authed(self.token.as_ref(), |http, t| {
            self.get(http, &url, "application/vnd.github.diff", t)
        })
        .await?;
        match resp.status().as_u16() {
            200..=299 => read_diff(resp).await,
            // GitHub refuses the diff media type for a diff too large to render: the JSON form still
            // lists every file's patch (and names the files whose patch it leaves out).
            406 | 422 => {
                tracing::info!(sha = %commit.sha, "diff too large for the diff media type; reading per-file patches");
                self.patches(&url).await
            }
            _ => Err(status_error("GitHub", resp).await),
        }
    }

    async fn commits_between(&self, range: &PushRange) -> Result<Vec<CommitMessage>, DiffError> {
        if !valid_github_repo(&range.repo) {
            return Err(DiffError::Permanent(format!("`{}` is not a GitHub `owner/name`", range.repo)));
        }
        let base = self.repository(&range.repo_id, &range.repo).await?;
        self.compare(&base, range).await
    }
}

/// `owner/name` only: anything else cannot be a GitHub repository's name.
fn valid_github_repo(repo: &str) -> bool {
    repo.split_once('/').is_some_and(|(o, n)| {
        [o, n].iter().all(|p| {
            !p.is_empty() && *p != ".." && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
    })
}

#[derive(serde::Deserialize)]
struct GitHubCommitFiles {
    #[serde(default)]
    files: Vec<GitHubFile>,
}

#[derive(serde::Deserialize)]
struct GitHubFile {
    filename: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    previous_filename: Option<String>,
    #[serde(default)]
    patch: Option<String>,
    #[serde(default)]
    additions: u64,
    #[serde(default)]
    deletions: u64,
}

/// Most commits one push range expands to (a larger push is summarized up to here, newest last).
pub const MAX_RANGE_COMMITS: usize = 10_000;

#[derive(serde::Deserialize)]
struct GitHubCompare {
    #[serde(default)]
    commits: Vec<GitHubCompareCommit>,
}

#[derive(serde::Deserialize)]
struct GitHubCompareCommit {
    sha: String,
    commit: GitHubCommitDetail,
}

#[derive(serde::Deserialize)]
struct GitHubCommitDetail {
    #[serde(default)]
    message: String,
    #[serde(default)]
    committer: Option<GitHubSignature>,
}

#[derive(serde::Deserialize)]
struct GitHubSignature {
    #[serde(default)]
    date: String,
}

/// GitHub's files per page of a commit, and its limit of files listed.
const GITHUB_FILES_PER_PAGE: usize = 100;
const GITHUB_MAX_FILES: usize = 3_000;

impl GitHubSource {
    fn get(
        &self,
        http: &reqwest::Client,
        url: &str,
        accept: &str,
        token: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let req = http
            .get(url)
            .timeout(self.timeout)
            .header("accept", accept)
            .header("x-github-api-version", "2022-11-28");
        match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// One page of GitHub's JSON: the parsed body and its size in bytes.
    async fn json_page<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<(T, usize), DiffError> {
        let resp =
            send_authed(self.token.as_ref(), |http, t| self.get(http, url, "application/vnd.github+json", t))
                .await?;
        if !resp.status().is_success() {
            return Err(status_error("GitHub", resp).await);
        }
        let body = read_json_page(resp).await?;
        let parsed = serde_json::from_slice(&body)
            .map_err(|e| DiffError::Permanent(format!("GitHub answered an unexpected body: {e}")))?;
        Ok((parsed, body.len()))
    }

    /// `GET /repositories/{id}/compare/{base}...{head}`, paged: the commits reachable from `head` and
    /// not from the merge base, oldest first (a force push brings only its new commits).
    async fn compare(&self, repository: &str, range: &PushRange) -> Result<Vec<CommitMessage>, DiffError> {
        let mut out = Vec::new();
        for page in 1..=MAX_RANGE_COMMITS / 100 {
            let url =
                format!("{repository}/compare/{}...{}?per_page=100&page={page}", range.base, range.head);
            let (cmp, _): (GitHubCompare, _) = self.json_page(&url).await?;
            let n = cmp.commits.len();
            // A listed commit whose id is not a full sha is left out, as the webhook leaves it out.
            out.extend(cmp.commits.into_iter().filter_map(|c| {
                Some(CommitMessage {
                    provider: Provider::Github,
                    repo_id: range.repo_id.clone(),
                    repo: range.repo.clone(),
                    sha: Sha::parse(&c.sha).ok()?,
                    subject: subject_of(&c.commit.message),
                    committed_at_ms: c
                        .commit
                        .committer
                        .map_or(0, |s| crate::commits::push::rfc3339_ms(&s.date)),
                    escalated: Default::default(),
                })
            }));
            if n < 100 {
                break;
            }
        }
        Ok(out)
    }

    /// The commit's per-file patches from the JSON form, rebuilt as one unified diff. A file GitHub
    /// gives no patch for (binary, or too large itself) keeps its header and a marker.
    async fn patches(&self, url: &str) -> Result<String, DiffError> {
        let mut out = String::new();
        let mut bytes = 0;
        for page in 1..=GITHUB_MAX_FILES / GITHUB_FILES_PER_PAGE {
            let paged = format!("{url}?per_page={GITHUB_FILES_PER_PAGE}&page={page}");
            let (files, size): (GitHubCommitFiles, _) = self.json_page(&paged).await?;
            for f in &files.files {
                let old = f.previous_filename.as_deref().unwrap_or(&f.filename);
                out.push_str(&format!("diff --git a/{old} b/{}\n", f.filename));
                match f.status.as_str() {
                    "added" => out.push_str("new file mode 100644\n"),
                    "removed" => out.push_str("deleted file mode 100644\n"),
                    "renamed" => out.push_str(&format!("rename from {old}\nrename to {}\n", f.filename)),
                    _ => {}
                }
                match &f.patch {
                    Some(patch) => {
                        let a = if f.status == "added" { "/dev/null".to_owned() } else { format!("a/{old}") };
                        let b = if f.status == "removed" {
                            "/dev/null".to_owned()
                        } else {
                            format!("b/{}", f.filename)
                        };
                        out.push_str(&format!("--- {a}\n+++ {b}\n{patch}\n"));
                    }
                    None => out.push_str(&format!(
                        "[lanes: no patch from GitHub for this file: +{} -{} lines]\n",
                        f.additions, f.deletions
                    )),
                }
            }
            bytes += size;
            if files.files.len() < GITHUB_FILES_PER_PAGE || bytes > MAX_DIFF_BYTES {
                break;
            }
        }
        Ok(out)
    }
}
