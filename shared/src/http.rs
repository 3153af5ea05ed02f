//! The process's one outbound HTTPS client: LLM providers, GitHub and GitLab.
//!
//! Why one: building a `reqwest` client loads the platform's TLS roots, parsing the whole system
//! bundle (about 140 certificates) at every build. A commits worker with a provider route built three
//! at cold start, each paying that again. One client also shares one connection pool. What differs per
//! caller, the timeout, is set on each request instead; a credential read from Secrets Manager is
//! re-read when refused ([`send`]). The client is built at the first request rather than
//! at start-up: a process that never calls out (a batch answered from the cache, the offline model)
//! never loads the roots, and one that does pays once, before its first TLS handshake.

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
    let built = reqwest::Client::builder().user_agent("lanes-commit-summaries").build()?;
    *slot = Some(built.clone());
    Ok(built)
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
