//! The process's one outbound HTTPS client: LLM providers, GitHub and GitLab.
//!
//! Why one: building a `reqwest` client loads the platform's TLS roots, parsing the whole system
//! bundle (about 140 certificates) at every build. A commits worker with a provider route built three
//! at cold start, each paying that again. One client also shares one connection pool. What differs per
//! caller, the timeout, is set on each request instead; a credential read from Secrets Manager is
//! re-read when refused ([`send`]). The client is built at the first request rather than
//! at start-up: a process that never calls out (a batch answered from the cache, the offline model)
//! never loads the roots, and one that does pays once, before its first TLS handshake.
//!
//! Where credentials may go: redirects are followed only within the origin the request was sent
//! to ([`same_origin`]), because `reqwest` strips `Authorization` on a cross-host redirect but not
//! GitLab's `PRIVATE-TOKEN` or Anthropic's `x-api-key`; and an endpoint a credential is sent to must
//! be `https` unless it is on this machine ([`check_endpoint`]).

use crate::secret::Secret;
use std::sync::Mutex;

/// The shared client, built at the first call; concurrent first calls wait for that one build
/// (about half a millisecond) rather than each parse the roots. A build error (a TLS backend that
/// cannot start) is not kept: the next call tries again.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    static CLIENT: Mutex<Option<reqwest::Client>> = Mutex::new(None);
    let mut slot = CLIENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(c) = slot.as_ref() {
        return Ok(c.clone());
    }
    // GitHub refuses API requests without a User-Agent; it names the product to every host.
    let built = reqwest::Client::builder()
        .user_agent("lanes-commit-summaries")
        .redirect(reqwest::redirect::Policy::custom(same_origin))
        .build()?;
    *slot = Some(built.clone());
    Ok(built)
}

/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 10;

/// Follows a redirect only to the scheme, host and port the request was first sent to; any other
/// answers the caller with the 3xx itself (which it maps as an error), so no header, whatever its
/// name, reaches a host it was not meant for, and `https` is never followed down to `http`.
fn same_origin(attempt: reqwest::redirect::Attempt) -> reqwest::redirect::Action {
    let Some(first) = attempt.previous().first() else { return attempt.stop() };
    let same = |u: &reqwest::Url| {
        (u.scheme(), u.host_str(), u.port_or_known_default())
            == (first.scheme(), first.host_str(), first.port_or_known_default())
    };
    if attempt.previous().len() > MAX_REDIRECTS || !same(attempt.url()) {
        tracing::warn!(from = %first, to = %attempt.url(), "redirect not followed: another origin");
        return attempt.stop();
    }
    attempt.follow()
}

/// Checks an endpoint credentials are sent to: a URL whose scheme is `https`, or `http` to a
/// loopback host (`localhost`, 127.0.0.0/8, `::1`: an emulator, a proxy on this machine).
pub fn check_endpoint(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    let host = parsed.host_str().unwrap_or("");
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match parsed.scheme() {
        "https" if !host.is_empty() => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err(format!("`{url}`: plain http is only accepted to this machine; use https")),
        _ => Err(format!("`{url}` is not an https URL")),
    }
}

/// Why [`send`] failed. Every case but [`SendError::Transport`] is mapped by the caller as a
/// retryable error with [`SendError::retry_after`] as its hint; a transport error keeps the caller's
/// own mapping (timeouts and connection failures).
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The shared client could not be built.
    #[error("HTTP client: {0}")]
    Client(reqwest::Error),
    /// The credential could not be read.
    #[error("the credential could not be read: {0}")]
    Credential(crate::config::ConfigError),
    /// The request did not complete (connection, timeout).
    #[error("request failed: {0}")]
    Transport(reqwest::Error),
    /// A credential read from Secrets Manager was refused (401), and no newer one is stored, or the
    /// newer one was refused too: possibly mid-rotation (revoked before its successor was stored).
    #[error("the credential was refused (401) and no newer one is stored yet")]
    Refused,
}

impl SendError {
    /// When trying again can help: not before the secret may be read again (a retry sooner would
    /// send the same refused or unreadable credential).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Refused => Some(crate::secret::MIN_REREAD),
            Self::Credential(_) => Some(crate::secret::FAILED_READ_BACKOFF),
            Self::Client(_) | Self::Transport(_) => None,
        }
    }
}

/// Sends what `build` makes on the shared client with the current `credential`, if any. A 401 to a
/// credential read from Secrets Manager reads it again ([`Secret::reread`]) and, if it was rotated,
/// sends once more with the new one; a 401 to that one too is [`SendError::Refused`] as well. Any
/// other answer, a 401 to a given credential included, is the caller's to map.
pub async fn send(
    credential: Option<&Secret>,
    build: impl Fn(&reqwest::Client, Option<&str>) -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, SendError> {
    let http = client().map_err(SendError::Client)?;
    let send = |value: Option<&str>| build(&http, value).send();
    let Some(secret) = credential else { return send(None).await.map_err(SendError::Transport) };
    let value = secret.current().await.map_err(SendError::Credential)?;
    let resp = send(Some(&value)).await.map_err(SendError::Transport)?;
    let refused = |resp: &reqwest::Response| resp.status() == reqwest::StatusCode::UNAUTHORIZED;
    if !refused(&resp) || !secret.is_read() {
        return Ok(resp);
    }
    let rotated = secret.reread(&value).await.ok_or(SendError::Refused)?;
    let resp = send(Some(&rotated)).await.map_err(SendError::Transport)?;
    if refused(&resp) { Err(SendError::Refused) } else { Ok(resp) }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn credentials_go_over_https_or_to_this_machine_only() {
        for ok in
            ["https://api.openai.com/v1", "http://127.0.0.1:9", "http://localhost:4000", "http://[::1]:8/x"]
        {
            assert_eq!(check_endpoint(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://llm.internal:8000",
            "http://10.0.0.5",
            "ftp://x",
            "not a url",
            "http://127.0.0.1.example.com",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }

    /// A server on 127.0.0.1 that redirects `/same` to itself and `/away` to `localhost` (another
    /// host to an HTTP client, the same machine to the test), and counts what reaches `/landed`
    /// with the credential header.
    async fn redirecting() -> (String, Arc<AtomicUsize>) {
        use axum::routing::get;
        let with_key = Arc::new(AtomicUsize::new(0));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = with_key.clone();
        let app = axum::Router::new()
            .route(
                "/same",
                get(move || async move {
                    axum::response::Redirect::temporary(&format!("http://127.0.0.1:{port}/landed"))
                }),
            )
            .route(
                "/away",
                get(move || async move {
                    axum::response::Redirect::temporary(&format!("http://localhost:{port}/landed"))
                }),
            )
            .route(
                "/landed",
                get(move |h: axum::http::HeaderMap| async move {
                    if h.contains_key("x-api-key") {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                    "landed"
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://127.0.0.1:{port}"), with_key)
    }

    #[tokio::test]
    async fn a_redirect_to_another_host_is_not_followed_with_the_credential() {
        let (base, with_key) = redirecting().await;
        let key: Secret = "sk-test".into();
        let get = |path: &'static str| {
            let (base, key) = (base.clone(), &key);
            async move {
                send(Some(key), |http, k| {
                    http.get(format!("{base}{path}")).header("x-api-key", k.unwrap_or(""))
                })
                .await
                .unwrap()
            }
        };
        let same = get("/same").await;
        assert_eq!(same.status(), reqwest::StatusCode::OK, "a redirect within the origin is followed");
        assert_eq!(with_key.load(Ordering::SeqCst), 1);
        let away = get("/away").await;
        assert_eq!(
            away.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT,
            "answered to the caller, not followed"
        );
        assert_eq!(with_key.load(Ordering::SeqCst), 1, "the key never reached the other host");
    }
}
