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

/// Why [`send`] failed.
#[derive(Debug)]
pub enum SendError {
    /// The shared client could not be built.
    Client(reqwest::Error),
    /// The credential could not be read.
    Credential(crate::config::ConfigError),
    /// The request did not complete (connection, timeout).
    Transport(reqwest::Error),
    /// A credential read from Secrets Manager was refused (401) and no newer one is stored yet:
    /// possibly mid-rotation (revoked before its successor was stored), so worth retrying later.
    Refused,
}

/// Sends what `build` makes on the shared client with the current `credential`, if any. A 401 to a
/// credential read from Secrets Manager reads it again ([`Secret::reread`]) and, if it was rotated,
/// sends once more with the new one. Any other answer, a 401 to a given credential included, is the
/// caller's to map.
pub async fn send(
    credential: Option<&Secret>,
    build: impl Fn(&reqwest::Client, Option<&str>) -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, SendError> {
    let http = client().map_err(SendError::Client)?;
    let send = |value: Option<&str>| build(&http, value).send();
    let Some(secret) = credential else { return send(None).await.map_err(SendError::Transport) };
    let value = secret.current().await.map_err(SendError::Credential)?;
    let resp = send(Some(&value)).await.map_err(SendError::Transport)?;
    if resp.status() != reqwest::StatusCode::UNAUTHORIZED || !secret.is_read() {
        return Ok(resp);
    }
    match secret.reread(&value).await {
        Some(rotated) => send(Some(&rotated)).await.map_err(SendError::Transport),
        None => Err(SendError::Refused),
    }
}
