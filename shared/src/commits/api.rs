//! The summaries read API, served beside the task API (`/v1/*` behind API Gateway; `lanes dev`):
//! `GET /v1/repos/{repo_id}/commits/{sha}/summary` (hot cache, then the store) and
//! `GET /v1/repos/{repo_id}/summaries?limit=&cursor=` (newest first, paginated with an opaque cursor).
//! With tenancy on, a caller reads only the summaries of owners it is mapped to
//! ([`SummaryReaders`]); anything else answers `404`, and a request without a tenant `401`.

use super::readers::SummaryReaders;
use crate::domain::commit::{CommitSummary, summary_cache_key};
use crate::domain::{RepoId, Sha, Tenant};
use crate::ports::{Cache, StoreError, SummaryStore};
use crate::problem::Problem;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use std::sync::Arc;
use tracing::warn;

/// What the read API needs.
#[derive(Clone)]
pub struct SummariesApi {
    /// Durable summaries.
    pub summaries: Arc<dyn SummaryStore>,
    /// Hot cache.
    pub cache: Arc<dyn Cache>,
    /// With tenancy on, who reads which owner's summaries; `None` with tenancy off (one party).
    pub readers: Option<Arc<SummaryReaders>>,
}

/// Who is reading: anyone (tenancy off), or a tenant under the readers table.
enum Reader {
    Anyone,
    Tenant(Arc<SummaryReaders>, Tenant),
}

impl Reader {
    /// The reader of a request, or why it may read nothing: no tenant, or a tenant mapped to no
    /// owner (answered without a lookup).
    fn of(api: &SummariesApi, tenant: Option<Extension<Tenant>>) -> Result<Self, Refused> {
        match (&api.readers, tenant) {
            (None, _) => Ok(Reader::Anyone),
            (Some(_), None) => Err(Refused::NoTenant),
            (Some(r), Some(Extension(t))) if r.reads_any(&t) => Ok(Reader::Tenant(r.clone(), t)),
            (Some(_), Some(_)) => Err(Refused::NotReadable),
        }
    }

    fn may_read(&self, summary: &CommitSummary) -> bool {
        match self {
            Reader::Anyone => true,
            Reader::Tenant(readers, tenant) => readers.may_read(tenant, summary),
        }
    }
}

/// Why a caller may not read a repository's summaries.
#[derive(Debug, Clone, Copy)]
enum Refused {
    /// Tenancy is on and the request carries no tenant: `401`.
    NoTenant,
    /// Not mapped to the repository's owner: `404`, as for a repository without summaries.
    NotReadable,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::NoTenant => Problem::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "No tenant",
                "this deployment serves summaries per tenant and the request carries no authenticated caller",
            ),
            Refused::NotReadable => Problem::new(
                StatusCode::NOT_FOUND,
                "repository-not-found",
                "Repository not found",
                "no summaries of this repository that this caller may read",
            )
            .with_field("repo_id"),
        }
        .into_response()
    }
}

fn repository_not_found() -> Response {
    Refused::NotReadable.into_response()
}

/// The read routes; merge them into the task router.
pub fn router(api: SummariesApi) -> Router {
    Router::new()
        .route("/v1/repos/{repo_id}/commits/{sha}/summary", get(get_summary))
        .route("/v1/repos/{repo_id}/summaries", get(list))
        .with_state(Arc::new(api))
}

fn bad(field: &str, detail: String) -> Response {
    Problem::new(StatusCode::BAD_REQUEST, "invalid-parameter", "Invalid parameter", detail)
        .with_field(field)
        .into_response()
}

fn unavailable(e: &StoreError) -> Response {
    warn!(error = %e, "summary store failed");
    match e {
        StoreError::Unavailable(_) => {
            Problem::unavailable("the summary store is unavailable; retry later", 5).into_response()
        }
        StoreError::Corrupt(_) => Problem::internal().into_response(),
    }
}

/// One commit's summary.
#[utoipa::path(
    get,
    path = "/v1/repos/{repo_id}/commits/{sha}/summary",
    tag = "summaries",
    params(
        ("repo_id" = String, Path, description = "`github:<id>` or `gitlab:<id>` (the host's numeric id), or `local:<hex>`", pattern = "^((github|gitlab):[0-9]{1,20}|local:[0-9A-Fa-f]{8,64})$"),
        ("sha" = String, Path, description = "The full commit id: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits", pattern = "^([0-9a-f]{40}|[0-9a-f]{64})$"),
    ),
    responses(
        (status = 200, description = "The summary", body = CommitSummary),
        (status = 400, description = "Invalid parameter", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No tenant (tenancy on)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No summary yet (it may still be queued), or one this caller may not read (answered alike)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable; retry", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "A stored item could not be read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn get_summary(
    State(api): State<Arc<SummariesApi>>,
    tenant: Option<Extension<Tenant>>,
    Path((repo_id, sha)): Path<(String, String)>,
) -> Response {
    let (repo_id, sha) = match (RepoId::parse(&repo_id), Sha::parse(&sha)) {
        (Ok(repo_id), Ok(sha)) => (repo_id, sha),
        (Err(e), _) | (_, Err(e)) => return bad(e.field, e.reason.into()),
    };
    // A summary this caller may not read answers exactly as one not written yet does.
    let not_found = || {
        Problem::new(
            StatusCode::NOT_FOUND,
            "summary-not-found",
            "Summary not found",
            "no summary for this commit yet (it may still be queued)",
        )
        .with_field("sha")
        .into_response()
    };
    let reader = match Reader::of(&api, tenant) {
        Ok(r) => r,
        Err(Refused::NotReadable) => return not_found(),
        Err(answer) => return answer.into_response(),
    };
    let readable = |s: CommitSummary| if reader.may_read(&s) { Json(s).into_response() } else { not_found() };
    if let Ok(Some(json)) = api.cache.get(&summary_cache_key(&repo_id, &sha)).await
        && let Ok(s) = serde_json::from_str::<CommitSummary>(&json)
    {
        return readable(s);
    }
    match api.summaries.get_summaries(&[(repo_id, sha)]).await {
        Ok(mut found) if !found.is_empty() => readable(found.remove(0)),
        Ok(_) => not_found(),
        Err(e) => unavailable(&e),
    }
}

/// One page of a repository's summaries.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct SummaryPage {
    /// Newest commit first.
    pub items: Vec<CommitSummary>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<String>,
}

pub(crate) struct ListQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

/// A repository's summaries, newest commit first, in pages.
#[utoipa::path(
    get,
    path = "/v1/repos/{repo_id}/summaries",
    tag = "summaries",
    params(
        ("repo_id" = String, Path, description = "`github:<id>` or `gitlab:<id>` (the host's numeric id), or `local:<hex>`", pattern = "^((github|gitlab):[0-9]{1,20}|local:[0-9A-Fa-f]{8,64})$"),
        ("limit" = Option<u32>, Query, description = "Page size, 1 to 100 (default 20); given once", minimum = 1, maximum = 100),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page; one this API did not return for this repository is a 404", pattern = "^[A-Za-z0-9_-]{1,2048}$"),
    ),
    responses(
        (status = 200, description = "One page", body = SummaryPage),
        (status = 400, description = "Invalid parameter", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No tenant (tenancy on)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "With tenancy on: no summaries of the repository that this caller may read (none at all answers alike); or a cursor this API did not return for the repository", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unavailable; retry", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "A stored item could not be read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list(
    State(api): State<Arc<SummariesApi>>,
    tenant: Option<Extension<Tenant>>,
    Path(repo_id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let q = match crate::query::params(query.as_deref(), &["limit", "cursor"]) {
        Ok(mut p) => ListQuery { limit: p.remove("limit"), cursor: p.remove("cursor") },
        Err(problem) => return problem.into_response(),
    };
    let repo_id = match RepoId::parse(&repo_id) {
        Ok(repo_id) => repo_id,
        Err(e) => return bad(e.field, e.reason.into()),
    };
    let reader = match Reader::of(&api, tenant) {
        Ok(r) => r,
        Err(answer) => return answer.into_response(),
    };
    let limit = match q.limit.as_deref() {
        None => 20,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => return bad("limit", format!("`{v}` is not a whole number from 1 to 100")),
        },
    };
    if let Some(c) = &q.cursor
        && (c.is_empty()
            || c.len() > 2048
            || !c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
    {
        return bad("cursor", "not a cursor this API returned".into());
    }
    match api.summaries.list_summaries(&repo_id, limit, q.cursor.as_deref()).await {
        // One repository, one owner: a page with anything this caller may not read is refused whole.
        // To a scoped reader, a repository without summaries answers as one it may not read, so
        // the two cannot be told apart.
        Ok(page) if !page.items.iter().all(|s| reader.may_read(s)) => repository_not_found(),
        Ok(page) if page.items.is_empty() && matches!(reader, Reader::Tenant(..)) => repository_not_found(),
        Ok(page) => Json(SummaryPage { items: page.items, next_cursor: page.next }).into_response(),
        // A well-formed cursor names a page; one that names none of this repository's is not found.
        Err(StoreError::Corrupt(_)) if q.cursor.is_some() => Problem::new(
            StatusCode::NOT_FOUND,
            "page-not-found",
            "No such page",
            "the cursor names no page of this repository's summaries; start again without it",
        )
        .with_field("cursor")
        .into_response(),
        Err(e) => unavailable(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::domain::TokenUsage;
    use crate::domain::commit::SummarySource;
    use crate::embedded::{EmbeddedDb, EmbeddedSummaries, MemoryCache};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get_json(r: &Router, uri: &str) -> (StatusCode, serde_json::Value) {
        let req = axum::http::Request::get(uri).body(axum::body::Body::empty()).unwrap();
        let resp = r.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    #[tokio::test]
    async fn read_one_list_pages_and_reject_bad_parameters() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedSummaries::new(EmbeddedDb::open(dir.path()).unwrap());
        for i in 0..3u64 {
            store
                .put_summary(&CommitSummary {
                    repo_id: "github:7".parse().unwrap(),
                    sha: format!("{i:040x}").parse().unwrap(),
                    repo: "o/r".into(),
                    subject: format!("c{i}"),
                    summary: format!("s{i}"),
                    model: "m".into(),
                    source: SummarySource::Llm,
                    tokens: TokenUsage::default(),
                    diff_tokens: 1,
                    diff_cut: false,
                    committed_at_ms: 1_000 + i,
                    created_at_ms: 0,
                    tier: Default::default(),
                })
                .await
                .unwrap();
        }
        let (summaries, cache) = (Arc::new(store), Arc::new(MemoryCache::new(Arc::new(SystemClock))));
        let scoped = router(SummariesApi {
            summaries: summaries.clone(),
            cache: cache.clone(),
            readers: Some(Arc::new(
                SummaryReaders::parse(r#"{"github:o": ["team-a"], "github:x": ["team-c"]}"#).unwrap(),
            )),
        });
        let r = router(SummariesApi { summaries, cache, readers: None });
        scoped_reads(&scoped).await;
        let sha = format!("{:040x}", 1);
        let (status, v) = get_json(&r, &format!("/v1/repos/github:7/commits/{sha}/summary")).await;
        assert_eq!((status, v["summary"].as_str()), (StatusCode::OK, Some("s1")));
        let (status, v) = get_json(&r, &format!("/v1/repos/github:8/commits/{sha}/summary")).await;
        assert_eq!((status, v["field"].as_str()), (StatusCode::NOT_FOUND, Some("sha")));
        let (status, v) = get_json(&r, "/v1/repos/github:7/commits/xyz/summary").await;
        assert_eq!((status, v["field"].as_str()), (StatusCode::BAD_REQUEST, Some("sha")));
        let (status, v) = get_json(&r, &format!("/v1/repos/nope/commits/{sha}/summary")).await;
        assert_eq!((status, v["field"].as_str()), (StatusCode::BAD_REQUEST, Some("repo_id")));

        let (status, v) = get_json(&r, "/v1/repos/github:7/summaries?limit=2").await;
        assert_eq!(status, StatusCode::OK);
        let subjects: Vec<&str> =
            v["items"].as_array().unwrap().iter().map(|i| i["subject"].as_str().unwrap()).collect();
        assert_eq!(subjects, ["c2", "c1"], "newest first");
        let cursor = v["next_cursor"].as_str().unwrap().to_owned();
        let (_, v) = get_json(&r, &format!("/v1/repos/github:7/summaries?limit=2&cursor={cursor}")).await;
        assert_eq!((v["items"].as_array().unwrap().len(), v["next_cursor"].is_null()), (1, true));
        let (status, v) = get_json(&r, "/v1/repos/github:7/summaries?limit=0").await;
        assert_eq!((status, v["field"].as_str()), (StatusCode::BAD_REQUEST, Some("limit")));
        let (status, v) = get_json(&r, "/v1/repos/github:7/summaries?cursor=%2F%2F").await;
        assert_eq!((status, v["field"].as_str()), (StatusCode::BAD_REQUEST, Some("cursor")));
        // A well-formed cursor of another repository names no page of this one.
        let (status, v) = get_json(&r, &format!("/v1/repos/github:9/summaries?cursor={cursor}")).await;
        assert_eq!((status, v["field"].as_str()), (StatusCode::NOT_FOUND, Some("cursor")));
        let (status, v) = get_json(&r, "/v1/repos/github:7/summaries?limit=1&limit=2").await;
        assert_eq!((status, v["field"].as_str()), (StatusCode::BAD_REQUEST, Some("limit")));
    }

    /// With tenancy on: the mapped tenant reads; another tenant, mapped elsewhere or nowhere, gets
    /// the same 404 as for a repository without summaries; no tenant is a 401.
    async fn scoped_reads(r: &Router) {
        let as_tenant = |t: Option<&'static str>, uri: String| async move {
            let mut req = axum::http::Request::get(uri).body(axum::body::Body::empty()).unwrap();
            if let Some(t) = t {
                req.extensions_mut().insert(Tenant::parse(t).unwrap());
            }
            let resp = r.clone().oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default())
        };
        let one = format!("/v1/repos/github:7/commits/{:040x}/summary", 1);
        let list = "/v1/repos/github:7/summaries".to_owned();
        assert_eq!(as_tenant(Some("team-a"), one.clone()).await.0, StatusCode::OK);
        assert_eq!(as_tenant(Some("team-a"), list.clone()).await.1["items"].as_array().unwrap().len(), 3);
        // Unreadable and absent answer alike, for one summary and for a list.
        let absent =
            as_tenant(Some("team-a"), format!("/v1/repos/github:7/commits/{:040x}/summary", 9)).await;
        let empty = as_tenant(Some("team-a"), "/v1/repos/github:99/summaries".to_owned()).await;
        assert_eq!((absent.0, empty.0), (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND));
        for other in ["team-b", "team-c"] {
            assert_eq!(as_tenant(Some(other), one.clone()).await, absent, "{other}");
            assert_eq!(as_tenant(Some(other), list.clone()).await, empty, "{other}");
        }
        assert_eq!(as_tenant(None, one).await.0, StatusCode::UNAUTHORIZED);
        assert_eq!(as_tenant(None, list).await.0, StatusCode::UNAUTHORIZED);
    }
}
