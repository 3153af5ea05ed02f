//! GitLab's REST API as a diff source: a commit's diff (`/projects/:id/repository/commits/:sha/diff`,
//! paginated, rebuilt as a unified diff) and a push range's commits, for gitlab.com or
//! self-managed. Paths name the project by its numeric id, after the id's `path_with_namespace`
//! is checked against the message's ([`super::identity`]).

use super::identity::Identities;
use super::{MAX_DIFF_BYTES, MAX_RANGE_COMMITS, read_json_page, send_authed, status_error};
use crate::domain::commit::{CommitMessage, Provider, PushRange, subject_of};
use crate::domain::{RepoId, Sha};
use crate::ports::{DiffError, DiffSource};
use crate::secret::Secret;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// GitLab's REST API (gitlab.com or self-managed).
#[derive(Debug, Clone)]
pub struct GitLabSource {
    timeout: Duration,
    api: String,
    token: Option<Secret>,
    identities: Arc<Identities>,
}

impl GitLabSource {
    /// A source on `base` (e.g. `https://gitlab.com`) with an optional token.
    pub fn new(base: &str, token: Option<Secret>, timeout: Duration) -> Self {
        Self { timeout, api: base.trim_end_matches('/').to_owned(), token, identities: Default::default() }
    }

    /// `{api}/api/v4/projects/{id}`, once GitLab has said that project `repo_id` is `repo`.
    async fn project(&self, repo_id: &RepoId, repo: &str) -> Result<String, DiffError> {
        let id = repo_id.host_id();
        let base = format!("{}/api/v4/projects/{id}", self.api);
        self.identities
            .check(repo_id, repo, || async {
                let (body, _) = self.page(&base).await?;
                let p: GitLabProject = serde_json::from_slice(&body)
                    .map_err(|e| DiffError::Permanent(format!("GitLab answered an unexpected body: {e}")))?;
                Ok((p.id, p.path_with_namespace))
            })
            .await?;
        Ok(base)
    }
}

/// The fields of `GET /projects/:id` that name the project.
#[derive(serde::Deserialize)]
struct GitLabProject {
    id: u64,
    path_with_namespace: String,
}

impl GitLabSource {
    /// One page of a paged GitLab list: its body and `x-next-page`.
    async fn page(&self, url: &str) -> Result<(Vec<u8>, Option<u32>), DiffError> {
        let resp = send_authed(self.token.as_ref(), |http, t| match t {
            Some(t) => http.get(url).timeout(self.timeout).header("private-token", t),
            None => http.get(url).timeout(self.timeout),
        })
        .await?;
        if !resp.status().is_success() {
            return Err(status_error("GitLab", resp).await);
        }
        let next = resp
            .headers()
            .get("x-next-page")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u32>().ok());
        Ok((read_json_page(resp).await?, next))
    }
}

#[derive(serde::Deserialize)]
struct GitLabDiff {
    old_path: String,
    new_path: String,
    #[serde(default)]
    diff: String,
    #[serde(default)]
    new_file: bool,
    #[serde(default)]
    deleted_file: bool,
    #[serde(default)]
    renamed_file: bool,
    #[serde(default)]
    a_mode: Option<String>,
    #[serde(default)]
    b_mode: Option<String>,
}

/// GitLab answers hunks per file; this rebuilds the `diff --git` headers the budget keys on.
fn gitlab_unified(files: &[GitLabDiff]) -> String {
    let mut out = String::new();
    for f in files {
        out.push_str(&format!("diff --git a/{} b/{}\n", f.old_path, f.new_path));
        if f.new_file {
            out.push_str(&format!("new file mode {}\n", f.b_mode.as_deref().unwrap_or("100644")));
        } else if f.deleted_file {
            out.push_str(&format!("deleted file mode {}\n", f.a_mode.as_deref().unwrap_or("100644")));
        } else if f.renamed_file {
            out.push_str(&format!("rename from {}\nrename to {}\n", f.old_path, f.new_path));
        }
        let old = if f.new_file { "/dev/null".to_owned() } else { format!("a/{}", f.old_path) };
        let new = if f.deleted_file { "/dev/null".to_owned() } else { format!("b/{}", f.new_path) };
        if f.diff.is_empty() {
            continue;
        }
        if f.diff.starts_with("Binary files") {
            out.push_str(&f.diff);
        } else {
            out.push_str(&format!("--- {old}\n+++ {new}\n{}", f.diff));
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

#[async_trait]
impl DiffSource for GitLabSource {
    async fn diff(&self, commit: &CommitMessage) -> Result<String, DiffError> {
        let project = self.project(&commit.repo_id, &commit.repo).await?;
        let mut files: Vec<GitLabDiff> = Vec::new();
        let mut page = 1u32;
        let mut bytes = 0usize;
        loop {
            let url = format!("{project}/repository/commits/{}/diff?per_page=100&page={page}", commit.sha);
            let (body, next) = self.page(&url).await?;
            bytes += body.len();
            let chunk: Vec<GitLabDiff> = serde_json::from_slice(&body)
                .map_err(|e| DiffError::Permanent(format!("GitLab answered an unexpected body: {e}")))?;
            files.extend(chunk);
            match next {
                // Past the raw-diff cap the rest could never reach the prompt: stop reading.
                Some(n) if n > page && n < 10_000 && bytes <= MAX_DIFF_BYTES => page = n,
                _ => break,
            }
        }
        Ok(gitlab_unified(&files))
    }

    /// `GET /projects/:id/repository/commits?ref_name=base..head`, paged (`x-next-page`): the
    /// commits reachable from `head` and not from `base`, without the diffs the compare API would
    /// also send. GitLab lists newest first; they are returned oldest first.
    async fn commits_between(&self, range: &PushRange) -> Result<Vec<CommitMessage>, DiffError> {
        let project = self.project(&range.repo_id, &range.repo).await?;
        let revisions = format!("{}..{}", range.base, range.head);
        let mut out = Vec::new();
        let mut page = 1u32;
        loop {
            let url = format!("{project}/repository/commits");
            let mut url = reqwest::Url::parse(&url)
                .map_err(|e| DiffError::Permanent(format!("bad GitLab URL `{url}`: {e}")))?;
            url.query_pairs_mut()
                .append_pair("ref_name", &revisions)
                .append_pair("per_page", "100")
                .append_pair("page", &page.to_string());
            let (body, next) = self.page(url.as_str()).await?;
            let commits: Vec<GitLabListedCommit> = serde_json::from_slice(&body)
                .map_err(|e| DiffError::Permanent(format!("GitLab answered an unexpected body: {e}")))?;
            // A listed commit whose id is not a full sha is left out, as the webhook leaves it out.
            out.extend(commits.into_iter().filter_map(|c| {
                Some(CommitMessage {
                    provider: Provider::Gitlab,
                    repo_id: range.repo_id.clone(),
                    repo: range.repo.clone(),
                    sha: Sha::parse(&c.id).ok()?,
                    subject: if c.title.is_empty() { subject_of(&c.message) } else { subject_of(&c.title) },
                    committed_at_ms: crate::commits::push::rfc3339_ms(&c.committed_date),
                    escalated: Default::default(),
                })
            }));
            match next {
                Some(n) if n > page && out.len() < MAX_RANGE_COMMITS => page = n,
                _ => break,
            }
        }
        out.reverse();
        Ok(out)
    }
}

#[derive(serde::Deserialize)]
struct GitLabListedCommit {
    id: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    committed_date: String,
}
