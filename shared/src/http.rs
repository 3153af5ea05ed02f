//! The process's one outbound HTTPS client: LLM providers, GitHub and GitLab.
//!
//! Why one: building a `reqwest` client loads the platform's TLS roots, parsing the whole system
//! bundle (about 140 certificates) at every build. A commits worker with a provider route built three
//! at cold start, each paying that again. One client also shares one connection pool. What differs per
//! caller, the timeout, is set on each request instead. It is built at the first request rather than
//! at start-up: a process that never calls out (a batch answered from the cache, the offline model)
//! never loads the roots, and one that does pays once, before its first TLS handshake.

use std::sync::OnceLock;

/// The shared client, built at the first call. Its errors (a TLS backend that cannot start) are not
/// kept: the next call tries again.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    // GitHub refuses API requests without a User-Agent; it names the product to every host.
    let built = reqwest::Client::builder().user_agent("lanes-commit-summaries").build()?;
    Ok(CLIENT.get_or_init(|| built).clone())
}
