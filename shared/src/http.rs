//! The process's one outbound HTTPS client: LLM providers, GitHub and GitLab.
//!
//! Why one: building a `reqwest` client loads the platform's TLS roots, parsing the whole system
//! bundle (about 140 certificates) at every build. A commits worker with a provider route built three
//! at cold start, each paying that again. One client also shares one connection pool. What differs per
//! caller, the timeout, is set on each request instead. It is built at the first request rather than
//! at start-up: a process that never calls out (a batch answered from the cache, the offline model)
//! never loads the roots, and one that does pays once, before its first TLS handshake.

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
