//! Diff sources behind [`DiffSource`]: GitHub REST (`Accept: application/vnd.github.diff`), GitLab
//! REST (`/projects/:id/repository/commits/:sha/diff`, paginated, rebuilt as a unified diff), and a
//! local repository through the `git` CLI. [`DiffSources`] routes a commit to its provider's source;
//! a provider without one is a permanent error, so a deployment never reads what it was not given.

use crate::domain::commit::{CommitMessage, Provider, PushRange};
use crate::llm::retry::retry_hint;
use crate::ports::{DiffError, DiffSource};
use crate::secret::Secret;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod github;
mod gitlab;
mod identity;

pub use github::{GitHubSource, MAX_RANGE_COMMITS};
pub use gitlab::GitLabSource;
pub use identity::{IDENTITY_TTL, Identities, same_repository};

/// Most bytes of a raw diff read: the rest is not downloaded (the budget keeps a few thousand tokens
/// of any diff, so nothing past this could reach the prompt anyway).
pub const MAX_DIFF_BYTES: usize = 8 * 1024 * 1024;
/// Most bytes of one JSON page (GitLab diffs, GitHub's per-file patches): JSON cannot be cut, so a
/// page over it is an error.
pub const MAX_JSON_PAGE_BYTES: usize = 32 * 1024 * 1024;

/// Sends what `build` makes with the current token ([`crate::http::send`]: a rotated token is read
/// again at its first 401). A token read from Secrets Manager and refused is retryable: the queue's
/// redrive, not this one answer, decides that it is wrong.
async fn send_authed(
    token: Option<&Secret>,
    build: impl Fn(&reqwest::Client, Option<&str>) -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, DiffError> {
    crate::http::send(token, build).await.map_err(|e| match e {
        crate::http::SendError::Transport(e) => transport(&e),
        other => DiffError::Retryable { retry_after: other.retry_after(), message: other.to_string() },
    })
}

fn transport(e: &reqwest::Error) -> DiffError {
    DiffError::Retryable { message: format!("request failed: {e}"), retry_after: None }
}

/// Maps a non-success answer: 429, 5xx and rate-limit 403s are retryable (with the host's reset
/// hint); everything else (401, 404, 422…) is permanent.
async fn status_error(host: &str, resp: reqwest::Response) -> DiffError {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let rate_limited = status == 429
        || (status == 403
            && (headers.get("x-ratelimit-remaining").is_some_and(|v| v.as_bytes() == b"0")
                || headers.contains_key("retry-after")));
    let hint = retry_hint(&headers, SystemTime::now()).or_else(|| {
        // GitHub's primary limit: `x-ratelimit-reset` is an epoch second.
        let reset: u64 = headers.get("x-ratelimit-reset")?.to_str().ok()?.parse().ok()?;
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
        Some(Duration::from_secs(reset.saturating_sub(now)))
    });
    let body = resp.text().await.unwrap_or_default();
    let detail: String = body.chars().take(200).collect();
    if rate_limited || status == 408 || status >= 500 {
        DiffError::Retryable { message: format!("{host} answered {status}"), retry_after: hint }
    } else {
        DiffError::Permanent(format!("{host} answered {status}: {detail}"))
    }
}

/// Reads a body as it streams, at most `cap` bytes: `(bytes, cut)`. Past the cap nothing more is
/// downloaded (the response is dropped), so a huge diff costs neither memory nor time.
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<(Vec<u8>, bool), DiffError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(&e))? {
        if out.len() + chunk.len() > cap {
            out.extend_from_slice(&chunk[..cap - out.len()]);
            return Ok((out, true));
        }
        out.extend_from_slice(&chunk);
    }
    Ok((out, false))
}

/// A raw diff, cut at the cap on a whole line with a marker.
async fn read_diff(resp: reqwest::Response) -> Result<String, DiffError> {
    match read_capped(resp, MAX_DIFF_BYTES).await? {
        (bytes, true) => Ok(cut_diff(bytes)),
        (bytes, false) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

/// The first [`MAX_DIFF_BYTES`] of a diff, ending on a whole line, with a marker.
fn cut_diff(mut bytes: Vec<u8>) -> String {
    let end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    bytes.truncate(end);
    bytes.extend_from_slice(format!("[lanes: the diff was cut at {MAX_DIFF_BYTES} bytes]\n").as_bytes());
    String::from_utf8_lossy(&bytes).into_owned()
}

/// One JSON page, refused past [`MAX_JSON_PAGE_BYTES`].
async fn read_json_page(resp: reqwest::Response) -> Result<Vec<u8>, DiffError> {
    match read_capped(resp, MAX_JSON_PAGE_BYTES).await? {
        (bytes, false) => Ok(bytes),
        (_, true) => Err(DiffError::Permanent(format!("a page larger than {MAX_JSON_PAGE_BYTES} bytes"))),
    }
}

/// A repository on this machine, read with the `git` CLI (`commit.repo` is its path).
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalGit;

#[async_trait]
impl DiffSource for LocalGit {
    async fn diff(&self, commit: &CommitMessage) -> Result<String, DiffError> {
        use tokio::io::AsyncReadExt;
        let mut child = tokio::process::Command::new("git")
            .arg("-C")
            .arg(&commit.repo)
            .args([
                "show",
                "--format=",
                "--no-color",
                "--no-ext-diff",
                "--no-textconv",
                "--diff-merges=first-parent",
            ])
            .arg(commit.sha.as_str())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| DiffError::Permanent(format!("cannot run git: {e}")))?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(DiffError::Permanent("git gave no output streams".into()));
        };
        // Read at most the cap; past it git is stopped, so a huge commit costs neither memory nor
        // time. Its errors are read alongside (a few KiB at most kept), so a chatty git never
        // blocks on a full pipe.
        let errors = tokio::spawn(async move {
            let mut err = Vec::new();
            let _ = stderr.take(64 * 1024).read_to_end(&mut err).await;
            err
        });
        let mut bytes = Vec::new();
        stdout
            .take(MAX_DIFF_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|e| DiffError::Retryable { message: format!("reading git: {e}"), retry_after: None })?;
        if bytes.len() > MAX_DIFF_BYTES {
            let _ = child.kill().await;
            errors.abort();
            bytes.truncate(MAX_DIFF_BYTES);
            return Ok(cut_diff(bytes));
        }
        let status = child.wait().await.map_err(|e| DiffError::Permanent(format!("cannot run git: {e}")))?;
        if !status.success() {
            let err = errors.await.unwrap_or_default();
            let err = String::from_utf8_lossy(&err);
            return Err(DiffError::Permanent(format!("git show {}: {}", commit.sha, err.trim())));
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Routes each commit to its provider's source.
#[derive(Clone, Default)]
pub struct DiffSources {
    /// GitHub, when configured.
    pub github: Option<Arc<dyn DiffSource>>,
    /// GitLab, when configured.
    pub gitlab: Option<Arc<dyn DiffSource>>,
    /// Local repositories (only `lanes dev` and `lanes summarize`).
    pub local: Option<Arc<dyn DiffSource>>,
}

impl DiffSources {
    /// Only local repositories.
    pub fn local_only() -> Self {
        Self { local: Some(Arc::new(LocalGit)), ..Self::default() }
    }
}

impl DiffSources {
    fn source(&self, provider: Provider) -> Result<&Arc<dyn DiffSource>, DiffError> {
        let source = match provider {
            Provider::Github => &self.github,
            Provider::Gitlab => &self.gitlab,
            Provider::Local => &self.local,
        };
        source.as_ref().ok_or_else(|| DiffError::Permanent(format!("no diff source for {provider} here")))
    }
}

#[async_trait]
impl DiffSource for DiffSources {
    async fn diff(&self, commit: &CommitMessage) -> Result<String, DiffError> {
        self.source(commit.provider)?.diff(commit).await
    }

    async fn commits_between(&self, range: &PushRange) -> Result<Vec<CommitMessage>, DiffError> {
        self.source(range.provider)?.commits_between(range).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::{Path, Query};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::get;
    use std::collections::HashMap;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    fn msg(provider: Provider, repo_id: &str, repo: &str) -> CommitMessage {
        CommitMessage {
            provider,
            repo_id: repo_id.parse().unwrap(),
            repo: repo.into(),
            sha: SHA.parse().unwrap(),
            subject: String::new(),
            committed_at_ms: 0,
            escalated: Default::default(),
        }
    }

    async fn serve(router: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{addr}")
    }

    /// GitHub's `GET /repositories/{id}` in its documented shape ("Get a repository"): repository
    /// `n` is `o/n`; 404 for 404.
    fn github_repositories() -> axum::Router {
        axum::Router::new().route(
            "/repositories/{id}",
            get(|Path(id): Path<u64>| async move {
                if id == 404 {
                    return (StatusCode::NOT_FOUND, r#"{"message":"Not Found","documentation_url":"https://docs.github.com/rest","status":"404"}"#).into_response();
                }
                axum::Json(serde_json::json!({"id": id, "node_id": "R_kgDO", "name": id.to_string(),
                    "full_name": format!("o/{id}"), "private": true, "owner": {"login": "o", "id": 1, "type": "Organization"},
                    "default_branch": "main"}))
                .into_response()
            }),
        )
    }

    #[tokio::test]
    async fn github_rest_on_a_fake_server() {
        let router = github_repositories().route(
            "/repositories/{id}/commits/{sha}",
            get(|Path((id, sha)): Path<(String, String)>, headers: HeaderMap| async move {
                let accept = headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or("");
                let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
                match id.as_str() {
                    "1" if accept == "application/vnd.github.diff" && auth == "Bearer t0k" => {
                        format!("diff --git a/x b/x\n@@ -1 +1 @@\n+{sha}\n").into_response()
                    }
                    "2" => (StatusCode::NOT_FOUND, r#"{"message":"Not Found"}"#).into_response(),
                    "3" => {
                        (StatusCode::FORBIDDEN, [("x-ratelimit-remaining", "0"), ("retry-after", "7")], "")
                            .into_response()
                    }
                    _ => (StatusCode::BAD_GATEWAY, "").into_response(),
                }
            }),
        );
        let base = serve(router).await;
        let gh = GitHubSource::new(&base, Some("t0k".into()), Duration::from_secs(5));
        let d = gh.diff(&msg(Provider::Github, "github:1", "o/1")).await.unwrap();
        assert!(d.contains(SHA));
        assert!(matches!(
            gh.diff(&msg(Provider::Github, "github:2", "o/2")).await,
            Err(DiffError::Permanent(_))
        ));
        match gh.diff(&msg(Provider::Github, "github:3", "o/3")).await {
            Err(DiffError::Retryable { retry_after, .. }) => {
                assert_eq!(retry_after, Some(Duration::from_secs(7)))
            }
            other => panic!("{other:?}"),
        }
        assert!(
            gh.diff(&msg(Provider::Github, "github:4", "o/4")).await.unwrap_err().to_string().contains("502")
        );
        assert!(
            gh.diff(&msg(Provider::Github, "github:1", "o/../x"))
                .await
                .unwrap_err()
                .to_string()
                .contains("owner/name")
        );
        // Another repository's id under one's own name: refused before any diff is read.
        match gh.diff(&msg(Provider::Github, "github:1", "attacker/own")).await {
            Err(DiffError::Refused(reason)) => assert!(reason.contains("o/1"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            gh.diff(&msg(Provider::Github, "github:404", "o/404")).await,
            Err(DiffError::Permanent(_))
        ));
    }

    /// A token read from Secrets Manager and refused with 401 (rotated there) is read again and
    /// the request sent once more with the new one; a token that stays refused is retryable (the
    /// redrive limits it) and costs one read per interval, not one per request.
    #[tokio::test]
    async fn a_rotated_token_refused_with_401_is_read_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let router = github_repositories().route(
            "/repositories/{id}/commits/{sha}",
            get(|headers: HeaderMap| async move {
                match headers.get("authorization").and_then(|v| v.to_str().ok()) {
                    Some("Bearer new") => "diff --git a/x b/x\n".into_response(),
                    _ => (StatusCode::UNAUTHORIZED, r#"{"message":"Bad credentials"}"#).into_response(),
                }
            }),
        );
        let base = serve(router).await;
        let (stored, reads) = (Arc::new(std::sync::Mutex::new("old")), Arc::new(AtomicUsize::new(0)));
        let fetch: crate::secret::Fetch = {
            let (stored, reads) = (stored.clone(), reads.clone());
            Arc::new(move || {
                reads.fetch_add(1, Ordering::SeqCst);
                let v = stored.lock().map(|v| v.to_string()).unwrap_or_default();
                Box::pin(async move { Ok(v) })
            })
        };
        let clock = crate::clock::ManualClock::new(0);
        let token = Secret::read_by(fetch, clock.clone());
        let gh = GitHubSource::new(&base, Some(token), Duration::from_secs(5));
        let commit = msg(Provider::Github, "github:1", "o/1");
        let refused = gh.diff(&commit).await;
        assert!(matches!(refused, Err(DiffError::Retryable { .. })), "old token refused, maybe mid-rotation");
        assert_eq!(reads.load(Ordering::SeqCst), 2, "the first read, then one more after the 401");
        for _ in 0..5 {
            assert!(gh.diff(&commit).await.is_err());
        }
        assert_eq!(reads.load(Ordering::SeqCst), 2, "no read per refused request");
        *stored.lock().unwrap() = "new";
        clock.advance_ms(crate::secret::MIN_REREAD.as_millis() as u64);
        assert!(gh.diff(&commit).await.unwrap().starts_with("diff --git"), "rotated token picked up");
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }

    /// GitHub refuses the diff media type for a very large commit (406, as its REST docs say, or
    /// 422); the JSON form's per-file patches, paged, make the diff instead. A raw diff over the cap
    /// is read only up to it.
    #[tokio::test]
    async fn a_diff_too_large_for_githubs_diff_type_comes_from_per_file_patches() {
        let router = github_repositories().route(
            "/repositories/{id}/commits/{sha}",
            get(|Path((id, _sha)): Path<(String, String)>, Query(q): Query<HashMap<String, String>>, headers: HeaderMap| async move {
                let accept = headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                if id == "999" {
                    return format!("diff --git a/a.js b/a.js\n@@ -0,0 +1 @@\n+{}\n", "x".repeat(20 << 20)).into_response();
                }
                if accept == "application/vnd.github.diff" {
                    let status = if id == "406" { StatusCode::NOT_ACCEPTABLE } else { StatusCode::UNPROCESSABLE_ENTITY };
                    let body = r#"{"message":"Sorry, this diff is taking too long to generate.","errors":[{"resource":"Commit","field":"diff","code":"not_available"}],"documentation_url":"https://docs.github.com/rest/commits/commits#get-a-commit","status":"406"}"#;
                    return (status, body).into_response();
                }
                let page: usize = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
                let files: Vec<serde_json::Value> = match page {
                    1 => (0..100).map(|i| serde_json::json!({"sha":"f","filename":format!("src/f{i}.rs"),"status":"modified","additions":1,"deletions":0,"changes":1,"patch":format!("@@ -1 +1,2 @@\n fn f{i}() {{}}\n+// touched {i}")})).collect(),
                    2 => vec![
                        serde_json::json!({"filename":"new.rs","status":"added","additions":1,"deletions":0,"patch":"@@ -0,0 +1 @@\n+fn new() {}"}),
                        serde_json::json!({"filename":"img.png","status":"added","additions":0,"deletions":0}),
                        serde_json::json!({"filename":"b.rs","previous_filename":"a.rs","status":"renamed","additions":0,"deletions":0,"patch":""}),
                    ],
                    _ => vec![],
                };
                axum::Json(serde_json::json!({"sha": "c", "files": files})).into_response()
            }),
        );
        let base = serve(router).await;
        let gh = GitHubSource::new(&base, None, Duration::from_secs(30));
        for id in ["406", "422"] {
            let d =
                gh.diff(&msg(Provider::Github, &format!("github:{id}"), &format!("o/{id}"))).await.unwrap();
            assert_eq!(d.matches("diff --git ").count(), 103, "both pages read");
            assert!(
                d.contains("+// touched 99")
                    && d.contains("--- /dev/null\n+++ b/new.rs\n@@ -0,0 +1 @@\n+fn new() {}")
            );
            assert!(d.contains("rename from a.rs\nrename to b.rs"));
            assert!(d.contains("no patch from GitHub for this file"));
            let t = crate::commits::budget::trim(&d, 4_000);
            assert!(t.files.contains(&"new.rs".to_owned()) && !t.noise_only);
        }
        let d = gh.diff(&msg(Provider::Github, "github:999", "o/999")).await.unwrap();
        assert!(d.len() < MAX_DIFF_BYTES + 100, "read up to the cap only: {}", d.len());
        assert!(d.ends_with("[lanes: the diff was cut at 8388608 bytes]\n"));
    }

    /// GitHub's compare API, paged as documented (`per_page`, `page`): every commit of the range,
    /// oldest first, with its subject and committer date.
    #[tokio::test]
    async fn github_lists_a_push_range_through_compare() {
        let router = github_repositories().route(
            "/repositories/{id}/compare/{basehead}",
            get(|Path((_id, basehead)): Path<(String, String)>, Query(q): Query<HashMap<String, String>>| async move {
                assert_eq!(basehead, format!("main...{}", "e".repeat(40)));
                let page: usize = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
                let commits: Vec<serde_json::Value> = (0..150usize)
                    .skip((page - 1) * 100)
                    .take(100)
                    .map(|i| serde_json::json!({"sha": format!("{i:040x}"), "commit": {"message": format!("Change {i}\n\nwhy"),
                        "author": {"name": "a", "date": "2026-11-30T10:00:00Z"}, "committer": {"name": "c", "date": "2026-11-30T11:00:00Z"}}}))
                    .collect();
                axum::Json(serde_json::json!({"status": "ahead", "ahead_by": 150, "total_commits": 150, "commits": commits}))
            }),
        );
        let base = serve(router).await;
        let gh = GitHubSource::new(&base, None, Duration::from_secs(5));
        let range = PushRange {
            provider: Provider::Github,
            repo_id: "github:1".parse().unwrap(),
            repo: "o/1".into(),
            base: "main".into(),
            head: "e".repeat(40).parse().unwrap(),
            listed: vec![],
        };
        let commits = gh.commits_between(&range).await.unwrap();
        assert_eq!(commits.len(), 150);
        assert_eq!(
            (commits[0].sha.as_str(), commits[0].subject.as_str()),
            (format!("{:040x}", 0).as_str(), "Change 0")
        );
        assert_eq!(commits[149].committed_at_ms, 1_796_036_400_000);
        let forged = PushRange { repo: "attacker/own".into(), ..range.clone() };
        assert!(matches!(gh.commits_between(&forged).await, Err(DiffError::Refused(_))));
        let bad = PushRange { repo: "o/../x".into(), ..range };
        assert!(matches!(gh.commits_between(&bad).await, Err(DiffError::Permanent(_))));
    }

    #[tokio::test]
    async fn gitlab_rest_pages_are_rebuilt_as_one_unified_diff() {
        let router = axum::Router::new()
            .route(
                "/api/v4/projects/{id}",
                // GitLab's "Get a single project", the fields that name it.
                get(|Path(id): Path<u64>| async move {
                    axum::Json(serde_json::json!({"id": id, "name": "p", "path": "p", "path_with_namespace": "g/p",
                        "namespace": {"id": 3, "name": "g", "path": "g", "kind": "group", "full_path": "g"}}))
                }),
            )
            .route(
            "/api/v4/projects/{id}/repository/commits/{sha}/diff",
            get(|Query(q): Query<HashMap<String, String>>, headers: HeaderMap| async move {
                assert_eq!(headers.get("private-token").unwrap(), "glpat");
                let page = q.get("page").cloned().unwrap_or_default();
                let body = if page == "1" {
                    serde_json::json!([{"old_path":"a.rs","new_path":"a.rs","diff":"@@ -1 +1 @@\n-x\n+y\n"}])
                } else {
                    serde_json::json!([{"old_path":"b.rs","new_path":"b.rs","diff":"@@ -0,0 +1 @@\n+z\n","new_file":true,"b_mode":"100644"}])
                };
                let next = if page == "1" { "2" } else { "" };
                ([("x-next-page", next)], axum::Json(body)).into_response()
            }),
        );
        let base = serve(router).await;
        let gl = GitLabSource::new(&base, Some("glpat".into()), Duration::from_secs(5));
        let d = gl.diff(&msg(Provider::Gitlab, "gitlab:42", "g/p")).await.unwrap();
        assert_eq!(
            d,
            "diff --git a/a.rs b/a.rs\n--- a/a.rs\n+++ b/a.rs\n@@ -1 +1 @@\n-x\n+y\n\
             diff --git a/b.rs b/b.rs\nnew file mode 100644\n--- /dev/null\n+++ b/b.rs\n@@ -0,0 +1 @@\n+z\n"
        );
        // An allowed group's path paired with another project's id: refused, nothing read.
        assert!(matches!(
            gl.diff(&msg(Provider::Gitlab, "gitlab:42", "allowed-group/x")).await,
            Err(DiffError::Refused(_))
        ));
    }

    #[tokio::test]
    async fn a_local_repository_through_git() {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let out =
                std::process::Command::new("git").arg("-C").arg(dir.path()).args(args).output().unwrap();
            assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap()
        };
        git(&["init", "-q"]);
        std::fs::write(dir.path().join("a.txt"), "hello\n").unwrap();
        git(&["add", "."]);
        git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first"]);
        std::fs::write(dir.path().join("a.txt"), "hello\nworld\n").unwrap();
        git(&["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "second"]);
        let head = git(&["rev-parse", "HEAD"]).trim().to_owned();
        let root = git(&["rev-parse", "HEAD~1"]).trim().to_owned();
        let mut m = msg(Provider::Local, "local:01234567", dir.path().to_str().unwrap());
        m.sha = head.parse().unwrap();
        let d = LocalGit.diff(&m).await.unwrap();
        assert!(d.starts_with("diff --git a/a.txt b/a.txt") && d.contains("+world"), "{d}");
        m.sha = root.parse().unwrap();
        assert!(LocalGit.diff(&m).await.unwrap().contains("+hello"), "the root commit diffs against nothing");
        m.sha = "f".repeat(40).parse().unwrap();
        assert!(matches!(LocalGit.diff(&m).await, Err(DiffError::Permanent(_))));
        let none = DiffSources::default();
        assert!(none.diff(&m).await.unwrap_err().to_string().contains("no diff source for local"));
    }
}
