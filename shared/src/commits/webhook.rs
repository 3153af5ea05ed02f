//! Git push webhooks (see docs/ARCHITECTURE.md: Flows; Idempotency): GitHub (`X-Hub-Signature-256`, HMAC-SHA256 over the raw body)
//! and GitLab (`X-Gitlab-Token`), both checked in constant time before the body is parsed; `ping`
//! answered, other events ignored, deleted refs and non-distinct commits skipped, replayed deliveries
//! dropped for 7 days; one message per new commit sent to the `commits` queue in batches of 10. The
//! same router serves `lanes dev` (`/webhooks/github`, `/webhooks/gitlab`) and the function URL, which
//! tells the hosts apart by header.

use super::push::parse_push;
use super::signatures::{OwnerKeys, claimed_owner};
pub use super::signatures::{github_signature, verify_github, verify_gitlab};
use crate::clock::SharedClock;
use crate::domain::commit::Provider;
use crate::metrics::Metrics;
use crate::ports::{QueueSend, SummaryStore};
use crate::problem::Problem;
use crate::secret::Secret;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use std::sync::Arc;
use tracing::{info, warn};

/// Largest accepted delivery (a Lambda function URL's own limit is 6 MB).
pub const MAX_WEBHOOK_BYTES: usize = 6 * 1024 * 1024;
/// How long a delivery is remembered (by its body's hash, [`crate::idempotency::delivery_key`]).
pub const DELIVERY_TTL_SECS: u64 = 7 * 24 * 3600;

/// Webhook secrets; a host without one is refused.
#[derive(Clone, Default)]
pub struct WebhookConfig {
    /// GitHub's webhook secret.
    pub github_secret: Option<Secret>,
    /// GitLab's secret token.
    pub gitlab_token: Option<Secret>,
    /// The owners' own secrets (a JSON object, [`OwnerKeys`]): an owner listed there is verified
    /// with its own only; the two above serve the others.
    pub owner_secrets: Option<Secret>,
    /// Owners (GitHub users or organisations) and groups (GitLab, any depth) whose pushes are
    /// accepted; empty accepts every repository the secrets authenticate.
    pub allowlist: Vec<String>,
    /// Commits one repository may push per UTC day (`LANES_REPO_DAILY_COMMITS`; see
    /// `commits/enqueue.rs`).
    pub daily_commits: Option<u64>,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("github_secret", &self.github_secret.as_ref().map(|_| "<set>"))
            .field("gitlab_token", &self.gitlab_token.as_ref().map(|_| "<set>"))
            .field("owner_secrets", &self.owner_secrets.as_ref().map(|_| "<set>"))
            .field("allowlist", &self.allowlist)
            .field("daily_commits", &self.daily_commits)
            .finish()
    }
}

impl WebhookConfig {
    /// Whether pushes to `repo` (`owner/name`, or GitLab's `group/sub/project`) are accepted: with an
    /// allowlist, its owner or one of its enclosing groups must be listed (case-insensitively).
    pub fn allows(&self, repo: &str) -> bool {
        self.allowlist.is_empty()
            || self.allowlist.iter().any(|owner| {
                repo.len() > owner.len()
                    && repo.as_bytes()[owner.len()] == b'/'
                    && repo[..owner.len()].eq_ignore_ascii_case(owner)
            })
    }
}

/// Whether `accepts` holds for `secret`, read again once if it does not (a rotated secret). An
/// empty secret accepts nothing (an HMAC under an empty key is anyone's); one that cannot be read
/// at all is a 503, so the host's redelivery can succeed later.
async fn verified(
    w: &Webhook,
    provider: Provider,
    secret: &Secret,
    accepts: impl Fn(&str) -> bool,
) -> Result<bool, Problem> {
    secret.check(|v| !v.is_empty() && accepts(v)).await.map_err(|e| {
        tracing::error!(error = %e, "webhook secret unavailable");
        w.metrics
            .webhook_deliveries_total
            .with_label_values(&[provider.as_str(), "secret_unavailable"])
            .inc();
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "secret-unavailable",
            "Webhook secret unavailable",
            "the secret to verify this delivery could not be read; redeliver it later",
        )
    })
}

/// What the webhook needs.
#[derive(Clone)]
pub struct Webhook {
    /// The `commits` queue.
    pub queue: Arc<dyn QueueSend>,
    /// Delivery markers.
    pub store: Arc<dyn SummaryStore>,
    /// Metrics.
    pub metrics: Metrics,
    /// Time.
    pub clock: SharedClock,
    /// Secrets.
    pub config: WebhookConfig,
}

/// The webhook routes: `POST /webhooks/github`, `POST /webhooks/gitlab`, and `POST /` (the function
/// URL) choosing the host by its event header.
pub fn router(webhook: Webhook) -> Router {
    Router::new()
        .route("/webhooks/github", post(github))
        .route("/webhooks/gitlab", post(gitlab))
        .route("/", post(function_url))
        .with_state(Arc::new(webhook))
}

/// What a delivery got: `accepted` (with what was enqueued), `duplicate` (a replayed delivery),
/// `ignored` (another event), `pong` (GitHub's ping).
#[derive(Debug, Default, serde::Serialize, utoipa::ToSchema)]
pub struct WebhookAnswer {
    /// `accepted`, `duplicate`, `ignored` or `pong`.
    pub status: &'static str,
    /// The repository (`github:<id>`, `gitlab:<id>`), when accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repo_id: Option<String>,
    /// Commits enqueued for summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enqueued: Option<usize>,
    /// Commits not summarized (merges, not distinct).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<usize>,
    /// The push deleted its ref.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ref_deleted: Option<bool>,
    /// Commits of the push the payload did not list (fetched from the host's API by the worker).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_listed: Option<usize>,
    /// `base..head` of a push listed only in part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<String>,
    /// The event ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// The replayed delivery's key (`provider:` and its body's sha256).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
}

/// A GitHub push (`X-Hub-Signature-256` over the body with the webhook secret).
#[utoipa::path(
    post,
    path = "/webhooks/github",
    tag = "webhooks",
    request_body(content = Object, content_type = "application/json", description = "GitHub's push event payload"),
    params(
        ("X-Hub-Signature-256" = String, Header, description = "`sha256=<hex HMAC of the body>`"),
        ("X-GitHub-Event" = String, Header, description = "`push` (`ping` answers `pong`; others are ignored)"),
        ("X-GitHub-Delivery" = Option<String>, Header, description = "Delivery id (not signed, so not the replay key: a replay is the same body, dropped whatever its id)"),
    ),
    responses(
        (status = 200, description = "Ping or replayed delivery", body = WebhookAnswer),
        (status = 202, description = "Accepted or ignored", body = WebhookAnswer),
        (status = 400, description = "Unreadable payload", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Bad signature", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Repository not in the allowlist", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large, or a push listing more commits than its repository's whole daily budget (`field` `commits`: it can never fit)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The repository's daily commit budget has no room for the push's commits (`field` `repository`); nothing is stored, redeliver after 00:00 UTC", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds until 00:00 UTC"))),
        (status = 503, description = "Store or queue unavailable; redeliver", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn github(s: State<Arc<Webhook>>, h: HeaderMap, b: Body) -> Response {
    handle(s, h, b, Some(Provider::Github)).await
}

/// A GitLab push (`X-Gitlab-Token` is the webhook's secret token).
#[utoipa::path(
    post,
    path = "/webhooks/gitlab",
    tag = "webhooks",
    request_body(content = Object, content_type = "application/json", description = "GitLab's push hook payload"),
    params(
        ("X-Gitlab-Token" = String, Header, description = "The webhook's secret token"),
        ("X-Gitlab-Event" = String, Header, description = "`Push Hook` (others are ignored)"),
        ("X-Gitlab-Event-UUID" = Option<String>, Header, description = "Delivery id (not signed, so not the replay key: a replay is the same body, dropped whatever its id)"),
    ),
    responses(
        (status = 200, description = "Replayed delivery", body = WebhookAnswer),
        (status = 202, description = "Accepted or ignored", body = WebhookAnswer),
        (status = 400, description = "Unreadable payload", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Bad token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Repository not in the allowlist", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large, or a push listing more commits than its repository's whole daily budget (`field` `commits`: it can never fit)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The repository's daily commit budget has no room for the push's commits (`field` `repository`); nothing is stored, redeliver after 00:00 UTC", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds until 00:00 UTC"))),
        (status = 503, description = "Store or queue unavailable; redeliver", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn gitlab(s: State<Arc<Webhook>>, h: HeaderMap, b: Body) -> Response {
    handle(s, h, b, Some(Provider::Gitlab)).await
}

/// The function URL: either host, told apart by its event header (`X-GitHub-Event` or
/// `X-Gitlab-Event`); the same answers as the two routes above. A request with neither header
/// carries no credential this route could check: `401`, like a bad signature.
#[utoipa::path(
    post,
    path = "/",
    tag = "webhooks",
    request_body(content = Object, content_type = "application/json", description = "A GitHub or GitLab push payload"),
    params(
        ("X-GitHub-Event" = Option<String>, Header, description = "A GitHub delivery's event (`push`; `ping` answers `pong`); with `X-Hub-Signature-256`. One of this and `X-Gitlab-Event` is required"),
        ("X-Hub-Signature-256" = Option<String>, Header, description = "With `X-GitHub-Event`: `sha256=<hex HMAC of the body>`"),
        ("X-GitHub-Delivery" = Option<String>, Header, description = "With `X-GitHub-Event`: the delivery id (a replay is the same body, dropped whatever its id)"),
        ("X-Gitlab-Event" = Option<String>, Header, description = "A GitLab delivery's event (`Push Hook`); with `X-Gitlab-Token`. One of this and `X-GitHub-Event` is required"),
        ("X-Gitlab-Token" = Option<String>, Header, description = "With `X-Gitlab-Event`: the webhook's secret token"),
        ("X-Gitlab-Event-UUID" = Option<String>, Header, description = "With `X-Gitlab-Event`: the delivery id (a replay is the same body, dropped whatever its id)"),
    ),
    responses(
        (status = 200, description = "Ping or replayed delivery", body = WebhookAnswer),
        (status = 202, description = "Accepted or ignored", body = WebhookAnswer),
        (status = 400, description = "Unreadable payload", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Neither sender's event header, or a bad signature or token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Repository not in the allowlist", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large, or a push listing more commits than its repository's whole daily budget (`field` `commits`: it can never fit)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The repository's daily commit budget has no room for the push's commits (`field` `repository`); nothing is stored, redeliver after 00:00 UTC", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds until 00:00 UTC"))),
        (status = 503, description = "Store or queue unavailable; redeliver", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn function_url(s: State<Arc<Webhook>>, h: HeaderMap, b: Body) -> Response {
    handle(s, h, b, None).await
}

async fn handle(
    State(w): State<Arc<Webhook>>,
    headers: HeaderMap,
    body: Body,
    provider: Option<Provider>,
) -> Response {
    match accept(&w, &headers, body, provider).await {
        Ok(r) => r,
        Err(p) => p.into_response(),
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn json(status: StatusCode, answer: WebhookAnswer) -> Response {
    (status, axum::Json(answer)).into_response()
}

async fn accept(
    w: &Webhook,
    headers: &HeaderMap,
    body: Body,
    provider: Option<Provider>,
) -> Result<Response, Problem> {
    let provider = match provider {
        Some(p) => p,
        None if headers.contains_key("x-github-event") => Provider::Github,
        None if headers.contains_key("x-gitlab-event") => Provider::Gitlab,
        None => {
            return Err(Problem::new(
                StatusCode::UNAUTHORIZED,
                "unknown-sender",
                "Unknown webhook sender",
                "expected a GitHub (X-GitHub-Event) or GitLab (X-Gitlab-Event) delivery",
            )
            .with_field("X-GitHub-Event"));
        }
    };
    let bytes = authenticated(w, provider, headers, body).await?;
    if let Some(answer) = not_a_push(w, provider, headers) {
        return Ok(answer);
    }
    let push = parse_push(provider, &bytes)?;
    if !w.config.allows(&push.repo) {
        w.metrics.webhook_deliveries_total.with_label_values(&[provider.as_str(), "forbidden"]).inc();
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "repository-not-allowed",
            "Repository not allowed",
            format!("pushes to `{}` are not accepted: its owner is not in LANES_REPO_ALLOWLIST", push.repo),
        )
        .with_field("repository"));
    }
    let delivery = crate::idempotency::delivery_key(provider, &bytes);
    // Enqueued first, recorded after: a delivery is recorded only once its commits are all in the
    // queue, so a failure or a crash anywhere before leaves the host's redelivery to enqueue them
    // (commits sent twice are summarized once). A replay of a recorded delivery is answered as such.
    if let Some(answer) = replayed(w, provider, &delivery).await? {
        return Ok(answer);
    }
    w.enqueue(&push).await?;
    if let Err(e) = w.store.mark_delivery(&delivery, w.clock.now_ms(), DELIVERY_TTL_SECS).await {
        warn!(error = %e, "delivery not recorded; a replay of it enqueues its commits again");
    }
    w.metrics.webhook_deliveries_total.with_label_values(&[provider.as_str(), "accepted"]).inc();
    Ok(json(
        StatusCode::ACCEPTED,
        WebhookAnswer {
            status: "accepted",
            repo_id: Some(push.repo_id.to_string()),
            enqueued: Some(push.commits.len()),
            skipped: Some(push.skipped),
            ref_deleted: Some(push.deleted),
            not_listed: Some(push.not_listed),
            range: push.range.as_ref().map(|r| format!("{}..{}", r.base, r.head)),
            ..Default::default()
        },
    ))
}

/// The answer to an authenticated delivery that is not a push (GitHub's ping, any other event), or
/// None for a push.
fn not_a_push(w: &Webhook, provider: Provider, headers: &HeaderMap) -> Option<Response> {
    let event = match provider {
        Provider::Gitlab => header(headers, "x-gitlab-event").unwrap_or(""),
        _ => header(headers, "x-github-event").unwrap_or(""),
    };
    match (provider, event) {
        (Provider::Github, "ping") => {
            w.metrics.webhook_deliveries_total.with_label_values(&[provider.as_str(), "ping"]).inc();
            Some(json(StatusCode::OK, WebhookAnswer { status: "pong", ..Default::default() }))
        }
        (Provider::Github, "push") | (Provider::Gitlab, "Push Hook") => None,
        _ => {
            w.metrics.webhook_deliveries_total.with_label_values(&[provider.as_str(), "ignored"]).inc();
            Some(json(
                StatusCode::ACCEPTED,
                WebhookAnswer { status: "ignored", event: Some(event.to_owned()), ..Default::default() },
            ))
        }
    }
}

/// The `401` of a delivery whose `h` (a `what`) is missing or wrong: counted, and logged with who
/// sent it (a function URL puts the caller's address first in `X-Forwarded-For`).
fn not_authenticated(w: &Webhook, provider: Provider, headers: &HeaderMap, h: &str, what: &str) -> Problem {
    let source = header(headers, "x-forwarded-for").and_then(|f| f.split(',').next()).unwrap_or("-");
    let source: String = source.trim().chars().take(64).collect();
    warn!(%provider, source = %source, "webhook delivery not authenticated");
    w.metrics.webhook_deliveries_total.with_label_values(&[provider.as_str(), "unauthorized"]).inc();
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "bad-signature",
        "Delivery not authenticated",
        format!(
            "the {h} {what} is missing or does not match the secret configured for this repository's owner"
        ),
    )
    .with_field(h)
}

/// The delivery's body, once its sender is authenticated with the key [`key_of`] chooses: GitHub's
/// HMAC over the (size-capped) body, checked before anything but [`claimed_owner`] reads it;
/// GitLab's token header, checked before the body is read unless owner secrets are configured
/// (the owner is then read from the body first).
async fn authenticated(
    w: &Webhook,
    provider: Provider,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, Problem> {
    let (h, what) = match provider {
        Provider::Gitlab => ("X-Gitlab-Token", "token"),
        _ => ("X-Hub-Signature-256", "signature"),
    };
    let unauthorized = || not_authenticated(w, provider, headers, h, what);
    let shared = match provider {
        Provider::Github => w.config.github_secret.as_ref(),
        Provider::Gitlab => w.config.gitlab_token.as_ref(),
        Provider::Local => None,
    };
    if shared.is_none() && (w.config.owner_secrets.is_none() || provider == Provider::Local) {
        return Err(Problem::new(
            StatusCode::UNAUTHORIZED,
            "not-configured",
            "Webhooks from this host are not enabled",
            format!("no {provider} webhook secret is configured on this deployment"),
        ));
    }
    let given = header(headers, &h.to_ascii_lowercase()).map(str::to_owned);
    let read = |body: Body| async move {
        axum::body::to_bytes(body, MAX_WEBHOOK_BYTES).await.map_err(|_| {
            Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too-large",
                "Delivery too large",
                format!("the body must be at most {MAX_WEBHOOK_BYTES} bytes"),
            )
        })
    };
    // GitLab's token is a header: with no owner secrets there is no owner to read from the body, so
    // the token is checked before the body is read at all.
    if let (Provider::Gitlab, None, Some(token)) = (provider, &w.config.owner_secrets, shared) {
        let given = given.ok_or_else(unauthorized)?;
        if !verified(w, provider, token, |t| verify_gitlab(t, Some(&given))).await? {
            return Err(unauthorized());
        }
        return read(body).await;
    }
    let bytes = read(body).await?;
    let given = given.ok_or_else(unauthorized)?;
    let accepts = |key: &str| match provider {
        Provider::Gitlab => verify_gitlab(key, Some(&given)),
        _ => verify_github(key.as_bytes(), &bytes, Some(&given)),
    };
    let ok = match (key_of(w, provider, &bytes).await?, &w.config.owner_secrets, shared) {
        (Some(owner), Some(table), _) => {
            let owners_key = |json: &str| {
                OwnerKeys::parse(json)
                    .ok()
                    .and_then(|k| k.key_for(provider, &owner).map(&accepts))
                    .unwrap_or(false)
            };
            verified(w, provider, table, owners_key).await?
        }
        (_, _, Some(secret)) => verified(w, provider, secret, &accepts).await?,
        _ => false,
    };
    if !ok {
        // The repository it claims, unverified: which one a forger aims at.
        warn!(claimed_owner = ?claimed_owner(provider, &bytes), "the unauthenticated delivery's claimed owner");
        return Err(unauthorized());
    }
    Ok(bytes)
}

/// The owner whose own secret must verify this payload, or `None` for the shared secret: the
/// payload's owner ([`claimed_owner`]) when the owner secrets list it. A table that cannot be read
/// or parsed is a 503 (an operator's fix, and the host's redelivery then succeeds), never a fall
/// back to the shared secret, which would let that secret's holders sign for a listed owner.
async fn key_of(w: &Webhook, provider: Provider, body: &[u8]) -> Result<Option<String>, Problem> {
    let (Some(table), Some(owner)) = (&w.config.owner_secrets, claimed_owner(provider, body)) else {
        return Ok(None);
    };
    let unusable = |reason: String| {
        tracing::error!(reason, "webhook owner secrets unusable");
        w.metrics
            .webhook_deliveries_total
            .with_label_values(&[provider.as_str(), "secret_unavailable"])
            .inc();
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "secret-unavailable",
            "Webhook secret unavailable",
            "the secret to verify this delivery could not be read; redeliver it later",
        )
    };
    let json = table.current().await.map_err(|e| unusable(e.to_string()))?;
    let keys = OwnerKeys::parse(&json).map_err(|e| unusable(e.to_string()))?;
    Ok(keys.key_for(provider, &owner).is_some().then_some(owner))
}

/// The answer to a replay of a recorded delivery, if `d` is one.
async fn replayed(w: &Webhook, provider: Provider, d: &str) -> Result<Option<Response>, Problem> {
    match w.store.delivery_seen(d, w.clock.now_ms()).await {
        Ok(false) => Ok(None),
        Ok(true) => {
            info!(delivery = %d, "replayed delivery dropped");
            w.metrics.duplicates_total.with_label_values(&["webhook_delivery"]).inc();
            w.metrics.webhook_deliveries_total.with_label_values(&[provider.as_str(), "duplicate"]).inc();
            Ok(Some(json(
                StatusCode::OK,
                WebhookAnswer { status: "duplicate", delivery: Some(d.to_owned()), ..Default::default() },
            )))
        }
        Err(e) => {
            warn!(error = %e, "delivery markers unavailable");
            Err(Problem::unavailable("the store is unavailable; redeliver later", 30))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::commits::push::{GITHUB_MAX_LISTED, ZERO_SHA, rfc3339_ms};
    use crate::domain::commit::CommitMessage;
    use crate::embedded::{EmbeddedDb, EmbeddedQueues, EmbeddedSummaries};
    use crate::ports::QueueConsume;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    #[test]
    fn githubs_documented_example_verifies_and_one_byte_breaks_it() {
        // https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
        let secret = b"It's a Secret to Everybody";
        let body = b"Hello, World!";
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert!(verify_github(secret, body, Some(sig)));
        assert_eq!(github_signature(secret, body), sig);
        assert!(!verify_github(secret, b"Hello, World?", Some(sig)), "one byte of body");
        assert!(!verify_github(b"It's a Secret to Everybodz", body, Some(sig)), "one byte of secret");
        assert!(!verify_github(secret, body, None));
        assert!(!verify_github(secret, body, Some("sha1=757107ea")));
        assert!(!verify_github(secret, body, Some("sha256=zz")));
        assert!(verify_gitlab("tok", Some("tok")));
        assert!(!verify_gitlab("tok", Some("tok2")) && !verify_gitlab("tok", None));
    }

    /// Incomplete payloads carry the range to expand: `before..after`, or for a new branch (`before`
    /// all zeros) `default_branch..after`; a complete payload carries none.
    #[test]
    fn incomplete_pushes_carry_their_range() {
        let (before, after) = ("b".repeat(40), "c".repeat(40));
        let gitlab = |before: &str, total: usize| {
            serde_json::json!({"before": before, "after": after, "total_commits_count": total,
                "project": {"id": 7, "path_with_namespace": "g/p", "default_branch": "main"},
                "commits": [{"id": after, "message": "m", "timestamp": "2026-11-30T10:00:00Z"}]})
            .to_string()
        };
        let p = parse_push(Provider::Gitlab, gitlab(&before, 25).as_bytes()).unwrap();
        let r = p.range.unwrap();
        assert_eq!(
            (r.base.as_str(), r.head.as_str(), r.listed.clone()),
            (before.as_str(), after.as_str(), vec![after.parse::<crate::domain::Sha>().unwrap()])
        );
        let p = parse_push(Provider::Gitlab, gitlab(ZERO_SHA, 25).as_bytes()).unwrap();
        assert_eq!(p.range.unwrap().base, "main", "a new branch brings its own commits only");
        assert!(parse_push(Provider::Gitlab, gitlab(&before, 1).as_bytes()).unwrap().range.is_none());

        let shas: Vec<String> = (0..GITHUB_MAX_LISTED).map(|i| format!("{i:040x}")).collect();
        let listed: Vec<(&str, bool)> = shas.iter().map(|s| (s.as_str(), true)).collect();
        let p =
            parse_push(Provider::Github, github_push(9, &shas[GITHUB_MAX_LISTED - 1], &listed).as_bytes())
                .unwrap();
        let r = p.range.unwrap();
        assert_eq!((r.repo.as_str(), r.listed.len()), ("octo/repo", GITHUB_MAX_LISTED));
        let few = github_push(9, &shas[1], &listed[..2]);
        assert!(parse_push(Provider::Github, few.as_bytes()).unwrap().range.is_none());
    }

    /// A secret that cannot be read is a 503 the host can redeliver after, naming no internal
    /// error; an empty secret verifies nothing, not even a signature made with the empty key.
    #[tokio::test]
    async fn an_unreadable_secret_is_a_503_and_an_empty_one_accepts_nothing() {
        let unreadable = crate::secret::Secret::read_by(
            Arc::new(|| {
                Box::pin(async {
                    Err(crate::config::ConfigError::Invalid {
                        name: "X",
                        reason: "AccessDenied: internal".into(),
                    })
                })
            }),
            Arc::new(SystemClock),
        );
        let body = github_push(1, &"a".repeat(40), &[]);
        let sig = github_signature(b"", body.as_bytes());
        for (secret, status) in
            [(unreadable, StatusCode::SERVICE_UNAVAILABLE), ("".into(), StatusCode::UNAUTHORIZED)]
        {
            let r = rig_with(WebhookConfig { github_secret: Some(secret), ..Default::default() }).await;
            let resp = deliver(
                &r,
                "/webhooks/github",
                &[("x-github-event", "push"), ("x-hub-signature-256", &sig)],
                &body,
            )
            .await;
            assert_eq!(resp.0, status);
            assert!(!resp.1.to_string().contains("AccessDenied"), "{}", resp.1);
        }
    }

    #[test]
    fn the_allowlist_matches_owners_and_enclosing_groups_only() {
        let c =
            WebhookConfig { allowlist: vec!["octo".into(), "Acme/platform".into()], ..Default::default() };
        for ok in ["octo/repo", "OCTO/x", "acme/platform/api", "acme/platform/sub/deep"] {
            assert!(c.allows(ok), "{ok}");
        }
        for no in ["octopus/repo", "acme/other", "acme/platformer/x", "octo", "evil/octo"] {
            assert!(!c.allows(no), "{no}");
        }
        assert!(WebhookConfig::default().allows("anyone/anything"));
    }

    #[test]
    fn times_with_offsets() {
        assert_eq!(rfc3339_ms("2015-05-05T19:40:15Z"), 1_430_854_815_000);
        assert_eq!(rfc3339_ms("2015-05-05T15:40:15-04:00"), 1_430_854_815_000);
        assert_eq!(rfc3339_ms("2015-05-05T21:40:15+02:00"), 1_430_854_815_000);
        assert_eq!(rfc3339_ms("yesterday"), 0);
    }

    pub(crate) fn github_push(repo_id: u64, after: &str, shas: &[(&str, bool)]) -> String {
        let commits: Vec<serde_json::Value> = shas
            .iter()
            .map(|(id, distinct)| {
                serde_json::json!({"id": id, "distinct": distinct, "message": format!("Change {}\n\nbody", &id[..7]),
                    "timestamp": "2026-11-30T10:00:00+01:00"})
            })
            .collect();
        serde_json::json!({"ref": "refs/heads/main", "before": "1".repeat(40), "after": after, "deleted": false,
            "repository": {"id": repo_id, "full_name": "octo/repo"}, "commits": commits})
        .to_string()
    }

    struct Rig {
        _dir: tempfile::TempDir,
        router: Router,
        queue: crate::embedded::EmbeddedQueue,
    }

    async fn rig() -> Rig {
        rig_with(WebhookConfig {
            github_secret: Some("s3cret".into()),
            gitlab_token: Some("gl".into()),
            ..Default::default()
        })
        .await
    }

    /// With owner secrets, a listed owner's push verifies with its own secret only (the shared
    /// secret, which every other repository's admin holds, is refused for it); an unlisted owner
    /// falls back to the shared secret; an unreadable table is a 503, never the fallback.
    #[tokio::test]
    async fn a_listed_owner_is_verified_with_its_own_secret_only() {
        let table = r#"{"github": {"Victim-Org": "victim-own"}, "gitlab": {"acme": "acme-own"}}"#;
        let r = rig_with(WebhookConfig {
            github_secret: Some("shared".into()),
            gitlab_token: Some("gl-shared".into()),
            owner_secrets: Some(table.into()),
            ..Default::default()
        })
        .await;
        let a = "a".repeat(40);
        let push_of = |name: &str| github_push(42, &a, &[(&a, true)]).replace("octo/repo", name);
        let gh = |body: &str, key: &[u8]| {
            let sig = github_signature(key, body.as_bytes());
            [("x-github-event".to_owned(), "push".to_owned()), ("x-hub-signature-256".to_owned(), sig)]
        };
        let send = |h: [(String, String); 2], body: String| {
            let r = &r;
            async move {
                let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                deliver(r, "/webhooks/github", &h, &body).await.0
            }
        };
        let victim = push_of("victim-org/app");
        assert_eq!(send(gh(&victim, b"shared"), victim.clone()).await, StatusCode::UNAUTHORIZED);
        assert_eq!(send(gh(&victim, b"victim-own"), victim.clone()).await, StatusCode::ACCEPTED);
        // The other host's name key beside the real one does not hide the owner from the check.
        let two_names = push_of("victim-org/app").replace(
            r#""full_name":"victim-org/app""#,
            r#""full_name":"victim-org/app","path_with_namespace":"x""#,
        );
        assert_ne!(two_names, victim, "the payload carries both keys");
        assert_eq!(send(gh(&two_names, b"shared"), two_names.clone()).await, StatusCode::UNAUTHORIZED);
        let other = push_of("someone/else");
        assert_eq!(send(gh(&other, b"shared"), other.clone()).await, StatusCode::ACCEPTED);
        assert_eq!(send(gh(&other, b"victim-own"), other.clone()).await, StatusCode::UNAUTHORIZED);
        let gitlab = |token: &'static str, path: &str| {
            let body = format!(
                r#"{{"before":"{z}","after":"{a}","project":{{"id":7,"path_with_namespace":"{path}"}},"commits":[]}}"#,
                z = "0".repeat(40)
            );
            let r = &r;
            async move {
                let h = [("x-gitlab-event", "Push Hook"), ("x-gitlab-token", token)];
                deliver(r, "/webhooks/gitlab", &h, &body).await.0
            }
        };
        assert_eq!(gitlab("gl-shared", "acme/platform/api").await, StatusCode::UNAUTHORIZED);
        assert_eq!(gitlab("acme-own", "acme/platform/api").await, StatusCode::ACCEPTED);
        assert_eq!(gitlab("gl-shared", "other/p").await, StatusCode::ACCEPTED);

        let broken = rig_with(WebhookConfig {
            github_secret: Some("shared".into()),
            owner_secrets: Some("{not json".into()),
            ..Default::default()
        })
        .await;
        let h = gh(&other, b"shared");
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (status, v) = deliver(&broken, "/webhooks/github", &h, &other).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
        assert!(!v.to_string().contains("not json"), "no secret text in the answer: {v}");
    }

    async fn rig_with(config: WebhookConfig) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let clock: SharedClock = Arc::new(SystemClock);
        let queues = EmbeddedQueues::open(db.clone(), clock.clone(), Default::default()).await.unwrap();
        let queue = queues.queue("commits", "commits-dlq");
        let router = router(Webhook {
            queue: Arc::new(queue.clone()),
            store: Arc::new(EmbeddedSummaries::new(db)),
            metrics: Metrics::new(),
            clock,
            config,
        });
        Rig { _dir: dir, router, queue }
    }

    async fn deliver(
        r: &Rig,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (StatusCode, serde_json::Value) {
        let mut req = axum::http::Request::post(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = r.router.clone().oneshot(req.body(Body::from(body.to_owned())).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    /// A repository's daily commit budget at the door: a push with no room left is a 429 that
    /// stores nothing (no message, no delivery marker); other repositories are not affected; a
    /// push larger than a whole day is a 413 that takes none of it.
    #[tokio::test]
    async fn a_push_past_its_repositorys_daily_commits_is_a_429_that_stores_nothing() {
        let config = WebhookConfig {
            github_secret: Some("s3cret".into()),
            daily_commits: Some(3),
            ..Default::default()
        };
        let r = rig_with(config).await;
        let push = |repo: u64, delivery: &'static str, shas: &[&str]| {
            let shas: Vec<String> = shas.iter().map(|c| c.repeat(40)).collect();
            let listed: Vec<(&str, bool)> = shas.iter().map(|s| (s.as_str(), true)).collect();
            let body = github_push(repo, &shas[0], &listed);
            let sig = github_signature(b"s3cret", body.as_bytes());
            let req = axum::http::Request::post("/webhooks/github")
                .header("x-github-event", "push")
                .header("x-github-delivery", delivery)
                .header("x-hub-signature-256", sig)
                .body(Body::from(body))
                .unwrap();
            let router = r.router.clone();
            async move {
                let resp = router.oneshot(req).await.unwrap();
                let retry =
                    resp.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                let status = resp.status();
                let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                (status, retry, serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default())
            }
        };
        assert_eq!(push(42, "d-1", &["a", "b"]).await.0, StatusCode::ACCEPTED);
        // The same signed body under another delivery id (which the signature does not cover) is a
        // replay: answered as one, and charged nothing (the day's last commit still fits below).
        let (status, _, v) = push(42, "d-1-again", &["a", "b"]).await;
        assert_eq!((status, v["status"].as_str()), (StatusCode::OK, Some("duplicate")), "{v}");
        let (status, retry, v) = push(42, "d-2", &["c", "d"]).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
        assert_eq!(
            (v["type"].as_str(), v["field"].as_str()),
            (Some("/problems/quota-exceeded"), Some("repository"))
        );
        assert!(retry.is_some_and(|s| (1..=86_400).contains(&s)), "until the next UTC day: {retry:?}");
        assert_eq!(r.queue.depth().await.unwrap().visible, 2, "nothing of the refused push was sent");
        assert_eq!(push(42, "d-2", &["c", "d"]).await.0, StatusCode::TOO_MANY_REQUESTS, "not marked as seen");
        assert_eq!(push(43, "d-3", &["c", "d"]).await.0, StatusCode::ACCEPTED, "another repository's day");
        assert_eq!(push(42, "d-4", &["e"]).await.0, StatusCode::ACCEPTED, "the day's last commit fits");
        assert_eq!(r.queue.depth().await.unwrap().visible, 5);
        // More commits than a whole day allows: no later day would take it either.
        let (status, retry, v) = push(44, "d-5", &["1", "2", "3", "4"]).await;
        assert_eq!((status, retry), (StatusCode::PAYLOAD_TOO_LARGE, None), "{v}");
        assert_eq!(
            (v["type"].as_str(), v["field"].as_str()),
            (Some("/problems/push-over-daily-budget"), Some("commits"))
        );
        assert_eq!(
            push(44, "d-6", &["1", "2", "3"]).await.0,
            StatusCode::ACCEPTED,
            "it took none of the day"
        );
    }

    /// The budget counts a repository's pushes by the owner they were signed for: a push signed
    /// for one owner that claims another repository's id (the forgery the commits worker refuses
    /// once the host names the id) fills a day of its own, and the repository's own pushes still
    /// fit in theirs.
    #[tokio::test]
    async fn a_push_claiming_another_repositorys_id_does_not_use_up_its_day() {
        let config = WebhookConfig {
            github_secret: Some("shared".into()),
            owner_secrets: Some(r#"{"github": {"victim-org": "victim-own"}}"#.into()),
            daily_commits: Some(2),
            ..Default::default()
        };
        let r = rig_with(config).await;
        let push = |name: &str, key: &'static [u8], delivery: &'static str, shas: [&str; 2]| {
            let shas = shas.map(|c| c.repeat(40));
            let body =
                github_push(42, &shas[0], &[(&shas[0], true), (&shas[1], true)]).replace("octo/repo", name);
            let sig = github_signature(key, body.as_bytes());
            let r = &r;
            async move {
                let h = [
                    ("x-github-event", "push"),
                    ("x-github-delivery", delivery),
                    ("x-hub-signature-256", &sig),
                ];
                deliver(r, "/webhooks/github", &h, &body).await.0
            }
        };
        assert_eq!(push("mallory/app", b"shared", "d-1", ["a", "b"]).await, StatusCode::ACCEPTED);
        assert_eq!(push("mallory/app", b"shared", "d-2", ["c", "d"]).await, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(push("victim-org/app", b"victim-own", "d-3", ["e", "f"]).await, StatusCode::ACCEPTED);
        assert_eq!(
            push("Victim-Org/app", b"victim-own", "d-4", ["2", "3"]).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }

    #[tokio::test]
    async fn github_push_ping_replay_and_bad_signatures() {
        let r = rig().await;
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let body = github_push(42, &b, &[(&a, true), (&b, true), (&"c".repeat(40), false)]);
        let sig = github_signature(b"s3cret", body.as_bytes());
        let h =
            [("x-github-event", "push"), ("x-github-delivery", "d-1"), ("x-hub-signature-256", sig.as_str())];
        let (status, v) = deliver(&r, "/webhooks/github", &h, &body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        assert_eq!(
            (v["enqueued"].as_u64(), v["skipped"].as_u64(), v["repo_id"].as_str()),
            (Some(2), Some(1), Some("github:42"))
        );
        let got = r.queue.receive(10).await.unwrap();
        assert_eq!(got.len(), 2);
        let m: CommitMessage = serde_json::from_str(&got[0].body).unwrap();
        assert_eq!(
            (m.repo_id.as_str(), m.repo.as_str(), m.subject.as_str()),
            ("github:42", "octo/repo", "Change aaaaaaa")
        );
        assert_eq!(m.committed_at_ms, 1_796_029_200_000);
        // Each commit goes in its repository owner's group, the same for every repository of `octo`.
        let owner = crate::domain::fairness::commit_group(Provider::Github, "octo/other");
        assert!(
            got.iter().all(|g| g.attributes.get(crate::domain::fairness::GROUP_ATTRIBUTE) == Some(&owner))
        );

        // Replay: the function URL path, told apart by header.
        let (status, v) = deliver(&r, "/", &h, &body).await;
        assert_eq!((status, v["status"].as_str()), (StatusCode::OK, Some("duplicate")));
        assert_eq!(r.queue.depth().await.unwrap().visible, 0);

        let (status, v) = deliver(
            &r,
            "/webhooks/github",
            &[
                ("x-github-event", "ping"),
                ("x-hub-signature-256", github_signature(b"s3cret", b"{}").as_str()),
            ],
            "{}",
        )
        .await;
        assert_eq!((status, v["status"].as_str()), (StatusCode::OK, Some("pong")));
        let (status, v) = deliver(
            &r,
            "/webhooks/github",
            &[
                ("x-github-event", "issues"),
                ("x-hub-signature-256", github_signature(b"s3cret", b"{}").as_str()),
            ],
            "{}",
        )
        .await;
        assert_eq!((status, v["status"].as_str()), (StatusCode::ACCEPTED, Some("ignored")));

        // Wrong and missing signatures: 401 before the body is even parsed (it is not JSON here).
        let bad = github_signature(b"s3cres", b"not json");
        let (status, v) = deliver(
            &r,
            "/webhooks/github",
            &[("x-github-event", "push"), ("x-hub-signature-256", bad.as_str())],
            "not json",
        )
        .await;
        assert_eq!((status, v["field"].as_str()), (StatusCode::UNAUTHORIZED, Some("X-Hub-Signature-256")));
        let (status, _) = deliver(&r, "/webhooks/github", &[("x-github-event", "push")], "not json").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        // Signed but malformed: 400 naming the field.
        let body = r#"{"after":"x","commits":[]}"#;
        let sig = github_signature(b"s3cret", body.as_bytes());
        let (status, v) = deliver(
            &r,
            "/webhooks/github",
            &[("x-github-event", "push"), ("x-hub-signature-256", sig.as_str())],
            body,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(v["detail"].as_str().unwrap().contains("repository"), "{v}");
        // Neither sender's header on the function URL: no credential to check.
        let (status, v) = deliver(&r, "/", &[], "{}").await;
        assert_eq!((status, v["field"].as_str()), (StatusCode::UNAUTHORIZED, Some("X-GitHub-Event")));
    }

    #[tokio::test]
    async fn deleted_refs_gitlab_and_size_limit() {
        let r = rig().await;
        let body = github_push(1, ZERO_SHA, &[(&"a".repeat(40), true)]);
        let sig = github_signature(b"s3cret", body.as_bytes());
        let (status, v) = deliver(
            &r,
            "/webhooks/github",
            &[("x-github-event", "push"), ("x-hub-signature-256", sig.as_str())],
            &body,
        )
        .await;
        assert_eq!(
            (status, v["enqueued"].as_u64(), v["ref_deleted"].as_bool()),
            (StatusCode::ACCEPTED, Some(0), Some(true))
        );

        let gl = serde_json::json!({"object_kind": "push", "after": "d".repeat(40), "project_id": 7,
            "total_commits_count": 25,
            "project": {"id": 7, "path_with_namespace": "grp/proj"},
            "commits": [{"id": "d".repeat(40), "message": "GitLab change", "timestamp": "2026-11-30T10:00:00Z"}]})
        .to_string();
        let h = [("x-gitlab-event", "Push Hook"), ("x-gitlab-token", "gl"), ("x-gitlab-event-uuid", "u-1")];
        let (status, v) = deliver(&r, "/", &h, &gl).await;
        assert_eq!(
            (status, v["repo_id"].as_str(), v["enqueued"].as_u64()),
            (StatusCode::ACCEPTED, Some("gitlab:7"), Some(1))
        );
        let (status, _) = deliver(&r, "/webhooks/gitlab", &h, &gl).await;
        assert_eq!(status, StatusCode::OK, "replayed event UUID");
        let (status, _) = deliver(
            &r,
            "/webhooks/gitlab",
            &[("x-gitlab-event", "Push Hook"), ("x-gitlab-token", "nope")],
            &gl,
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);

        let huge = "x".repeat(MAX_WEBHOOK_BYTES + 1);
        let (status, _) = deliver(&r, "/webhooks/github", &[("x-github-event", "push")], &huge).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        // GitLab's token is checked before the body is read: an oversized body with a wrong token is
        // refused as unauthenticated, never read.
        let h = [("x-gitlab-event", "Push Hook"), ("x-gitlab-token", "nope")];
        let (status, v) = deliver(&r, "/webhooks/gitlab", &h, &huge).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    }
}
