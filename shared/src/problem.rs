//! RFC 9457 problem details (`application/problem+json`): every error the HTTP routers return, naming
//! the field at fault and never leaking internal error text.

use crate::domain::FieldError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The media type of problem responses.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem response.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// The problem type: a relative reference `/problems/<slug>` (RFC 9457 allows URI references;
    /// it names the type and is not meant to be fetched). The slugs are listed in the README.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary.
    pub title: String,
    /// HTTP status.
    pub status: u16,
    /// What went wrong with this request.
    pub detail: String,
    /// The first offending field, when one is at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Every field problem found.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// Seconds after which a retry may succeed (also sent as `Retry-After`).
    #[serde(skip)]
    #[schema(ignore)]
    pub retry_after: Option<u64>,
}

impl Problem {
    /// A problem with a status, a type slug, a title and a detail.
    pub fn new(status: StatusCode, slug: &str, title: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: format!("/problems/{slug}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            field: None,
            errors: Vec::new(),
            retry_after: None,
        }
    }

    /// 400 listing every field problem. (An oversized body never gets here: ingress stops reading at the
    /// limit and answers 413 itself.)
    pub fn validation(errors: Vec<FieldError>) -> Self {
        let detail =
            errors.iter().map(|e| format!("{}: {}", e.field, e.reason)).collect::<Vec<_>>().join("; ");
        let status = StatusCode::BAD_REQUEST;
        let mut p = Self::new(status, "invalid-request", "The request is invalid", detail);
        p.field = errors.first().map(|e| e.field.clone());
        p.errors = errors;
        p
    }

    /// 500 without internal details (they go to the log).
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "the request could not be completed",
        )
    }

    /// 503 with `Retry-After`.
    pub fn unavailable(detail: &str, retry_after: u64) -> Self {
        let mut p =
            Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Temporarily unavailable", detail);
        p.retry_after = Some(retry_after);
        p
    }

    /// Names the offending field.
    pub fn with_field(mut self, field: &str) -> Self {
        self.field = Some(field.to_owned());
        self
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_string(&self).unwrap_or_else(|_| "{}".into());
        let mut resp = (status, body).into_response();
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// Longest part of a framework rejection's own text kept as a problem's detail.
const REJECTION_DETAIL_CHARS: usize = 300;

/// Every error answer of `router` as problem+json, the web framework's own rejections included: a
/// 4xx or 5xx whose body is not JSON (axum's plain-text answers to a malformed path, query or body,
/// a body over the limit, a wrong media type) becomes a problem of the same status naming the part
/// of the request at fault, with the rejection's text (which describes only the request) as its
/// detail. Answers the handlers wrote themselves pass unchanged.
pub fn framework_rejections(router: axum::Router) -> axum::Router {
    router.layer(axum::middleware::map_response(|resp: Response| async move {
        let status = resp.status();
        let is_json = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/json") || ct.starts_with(PROBLEM_JSON));
        if !(status.is_client_error() || status.is_server_error()) || is_json {
            return resp;
        }
        let (parts, body) = resp.into_parts();
        let text = match axum::body::to_bytes(body, 64 * 1024).await {
            Ok(b) => String::from_utf8_lossy(&b).chars().take(REJECTION_DETAIL_CHARS).collect::<String>(),
            Err(_) => String::new(),
        };
        let mut answer = rejection(status, &text).into_response();
        for name in [header::ALLOW, header::RETRY_AFTER] {
            if let Some(v) = parts.headers.get(&name) {
                answer.headers_mut().insert(name, v.clone());
            }
        }
        answer
    }))
}

/// The problem for a framework rejection of `status` with text `text`.
fn rejection(status: StatusCode, text: &str) -> Problem {
    let lower = text.to_ascii_lowercase();
    // axum names a query or body field in backticks ("duplicate field `limit`").
    let named = text.split('`').nth(1).filter(|f| !f.is_empty() && f.len() <= 64);
    let detail = |title: &str| {
        if text.trim().is_empty() { title.to_ascii_lowercase() } else { text.trim().to_owned() }
    };
    let (problem, field) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            (Problem::new(status, "body-too-large", "Body too large", detail("Body too large")), "body")
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            let title = "Unsupported media type";
            (Problem::new(status, "unsupported-media-type", title, detail(title)), "Content-Type")
        }
        StatusCode::METHOD_NOT_ALLOWED => {
            let title = "Method not allowed";
            (Problem::new(status, "method-not-allowed", title, detail(title)), "method")
        }
        StatusCode::NOT_FOUND => {
            (Problem::new(status, "not-found", "Not found", detail("Not found")), "path")
        }
        s if s.is_client_error() && lower.contains("query") => {
            let title = "Invalid query parameter";
            (Problem::new(status, "invalid-query", title, detail(title)), named.unwrap_or("query"))
        }
        s if s.is_client_error() && (lower.contains("path") || lower.contains("url")) => {
            let title = "Invalid parameter";
            (Problem::new(status, "invalid-parameter", title, detail(title)), "path")
        }
        s if s.is_client_error() => {
            let title = "The request is invalid";
            (Problem::new(status, "invalid-request", title, detail(title)), named.unwrap_or("body"))
        }
        _ => return Problem::internal(),
    };
    problem.with_field(field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::extract::Query;
    use tower::ServiceExt;

    #[derive(serde::Deserialize)]
    struct Page {
        #[allow(dead_code)]
        limit: Option<u32>,
    }

    /// axum's own plain-text rejections come out as problems naming the part at fault.
    #[tokio::test]
    async fn framework_rejections_are_problems_naming_the_field() {
        let router = framework_rejections(
            axum::Router::new()
                .route("/q", axum::routing::get(|Query(_): Query<Page>| async { "ok" }))
                .route("/j", axum::routing::post(|axum::Json(_): axum::Json<Page>| async { "ok" })),
        );
        let send = |method: &str, uri: &str, body: &'static str| {
            let req = axum::http::Request::builder().method(method).uri(uri);
            let req = req.header(header::CONTENT_TYPE, "application/json").body(Body::from(body));
            router.clone().oneshot(req.unwrap_or_default())
        };
        for (method, uri, body, status, field) in [
            ("GET", "/q?limit=x", "", 400, "query"),
            ("POST", "/j", "{\"limit\": \"x\"}", 422, "body"),
            ("DELETE", "/q", "", 405, "method"),
        ] {
            let resp = send(method, uri, body).await.unwrap_or_default();
            assert_eq!(resp.status().as_u16(), status, "{method} {uri}");
            let ct = resp.headers().get(header::CONTENT_TYPE).cloned();
            assert_eq!(ct.as_ref().and_then(|v| v.to_str().ok()), Some(PROBLEM_JSON), "{method} {uri}");
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap_or_default();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            assert_eq!(v["field"], field, "{method} {uri}: {v}");
            assert_eq!(v["status"], status, "{v}");
        }
        assert_eq!(send("GET", "/q?limit=3", "").await.map(|r| r.status().as_u16()).unwrap_or(0), 200);
    }
}
