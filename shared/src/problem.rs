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
    let (slug, title, field) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ("body-too-large", "Body too large", "body".to_owned()),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            ("unsupported-media-type", "Unsupported media type", "Content-Type".to_owned())
        }
        StatusCode::METHOD_NOT_ALLOWED => ("method-not-allowed", "Method not allowed", "method".to_owned()),
        StatusCode::NOT_FOUND => ("not-found", "Not found", "path".to_owned()),
        s if s.is_client_error() => {
            let part = if lower.contains("query") {
                ("invalid-query", "Invalid query parameter", named.unwrap_or("query"))
            } else if lower.contains("path") || lower.contains("url") {
                ("invalid-parameter", "Invalid parameter", "path")
            } else {
                ("invalid-request", "The request is invalid", named.unwrap_or("body"))
            };
            (part.0, part.1, part.2.to_owned())
        }
        _ => return Problem::internal(),
    };
    let detail = if text.trim().is_empty() { title.to_ascii_lowercase() } else { text.trim().to_owned() };
    Problem::new(status, slug, title, detail).with_field(&field)
}
