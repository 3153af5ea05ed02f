//! How a push is authenticated: the hosts' checks in constant time ([`verify_github`]'s HMAC over
//! the body, [`verify_gitlab`]'s token), and which secret they use ([`OwnerKeys`]): each repository
//! owner's own, else the deployment's one shared secret. Pure.
//!
//! With one secret for every repository, any repository's admin (who must paste it into the
//! webhook's settings) can sign a push for any other. The owner secrets are one JSON object, kept
//! in Secrets Manager (`LANES_WEBHOOK_OWNER_SECRETS_ID`) or given locally
//! (`LANES_WEBHOOK_OWNER_SECRETS`):
//!
//! ```json
//! {"github": {"octo-org": "<secret>"}, "gitlab": {"acme": "<token>"}}
//! ```
//!
//! keyed by the owner (a GitHub user or organisation, a GitLab top-level group; without regard to
//! case). A push is verified with its owner's secret when the owner has one, and then only with it:
//! the shared secret (`LANES_GITHUB_WEBHOOK_SECRET(_ID)`, `LANES_GITLAB_WEBHOOK_TOKEN(_ID)`) is the
//! fallback for owners not listed, never a second key for those listed. The owner is read from the
//! payload before it is verified, which is sound: a payload naming an owner it was not signed for
//! fails that owner's check, and the worker checks the name against the repository's id
//! ([`crate::commits::sources::Identities`]).

use crate::domain::commit::Provider;
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use subtle::ConstantTimeEq;

/// Verifies GitHub's `X-Hub-Signature-256: sha256=<hex>` over the raw body, in constant time.
pub fn verify_github(secret: &[u8], body: &[u8], header: Option<&str>) -> bool {
    let Some(hex_sig) = header.and_then(|h| h.trim().strip_prefix("sha256=")) else { return false };
    let Ok(sig) = hex::decode(hex_sig) else { return false };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else { return false };
    mac.update(body);
    mac.verify_slice(&sig).is_ok()
}

/// Verifies GitLab's `X-Gitlab-Token` in constant time (digests compared, so length leaks nothing).
pub fn verify_gitlab(token: &str, header: Option<&str>) -> bool {
    let Some(given) = header else { return false };
    let a = Sha256::digest(token.as_bytes());
    let b = Sha256::digest(given.as_bytes());
    bool::from(a.as_slice().ct_eq(b.as_slice()))
}

/// Signs `body` as GitHub does (for tests, samples and `lanes` tooling).
pub fn github_signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(m) => m,
        // HMAC takes keys of any length; this arm is unreachable in practice.
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The owners' secrets, per host, owner lower-cased.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OwnerKeys {
    github: HashMap<String, String>,
    gitlab: HashMap<String, String>,
}

/// Why the owner secrets cannot be used (said without any secret in it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the webhook owner secrets are not usable: {0}")]
pub struct OwnerKeysError(String);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    github: HashMap<String, String>,
    #[serde(default)]
    gitlab: HashMap<String, String>,
}

impl OwnerKeys {
    /// Parses the JSON object; an empty owner or secret, or an owner named twice in another case,
    /// is an error (an owner must not end up with a key nobody meant).
    pub fn parse(json: &str) -> Result<Self, OwnerKeysError> {
        let raw: Raw = serde_json::from_str(json).map_err(|e| {
            // serde's message names the line and column, never the value.
            OwnerKeysError(format!(
                "expected {{\"github\": {{owner: secret}}, \"gitlab\": {{group: token}}}}: {e}"
            ))
        })?;
        let lower = |host: &str, m: HashMap<String, String>| {
            let mut out = HashMap::with_capacity(m.len());
            for (owner, secret) in m {
                let key = owner.trim().to_ascii_lowercase();
                if key.is_empty() || key.contains('/') {
                    return Err(OwnerKeysError(format!("{host}: `{owner}` is not an owner")));
                }
                if secret.is_empty() {
                    return Err(OwnerKeysError(format!("{host}: `{owner}` has an empty secret")));
                }
                if out.insert(key, secret).is_some() {
                    return Err(OwnerKeysError(format!("{host}: `{owner}` is listed twice")));
                }
            }
            Ok(out)
        };
        Ok(Self { github: lower("github", raw.github)?, gitlab: lower("gitlab", raw.gitlab)? })
    }

    /// The owner's own secret on `provider`, if it has one.
    pub fn key_for(&self, provider: Provider, owner: &str) -> Option<&str> {
        let owners = match provider {
            Provider::Github => &self.github,
            Provider::Gitlab => &self.gitlab,
            Provider::Local => return None,
        };
        owners.get(&owner.to_ascii_lowercase()).map(String::as_str)
    }
}

/// The owner a push payload names (the first segment of its repository's name, as
/// [`super::push::repository_name`] reads it), lower-cased; `None` when the payload names none.
pub fn claimed_owner(provider: Provider, body: &[u8]) -> Option<String> {
    let name = super::push::repository_name(provider, body)?;
    let owner = name.split('/').next()?.trim();
    (!owner.is_empty()).then(|| owner.to_ascii_lowercase())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_keyed_without_case_and_bad_tables_are_refused_without_their_secrets() {
        let keys = OwnerKeys::parse(r#"{"github": {"Octo-Org": "s1"}, "gitlab": {"acme": "t1"}}"#).unwrap();
        assert_eq!(keys.key_for(Provider::Github, "octo-org"), Some("s1"));
        assert_eq!(keys.key_for(Provider::Github, "OCTO-ORG"), Some("s1"));
        assert_eq!(keys.key_for(Provider::Gitlab, "octo-org"), None, "hosts are apart");
        assert_eq!(keys.key_for(Provider::Gitlab, "acme"), Some("t1"));
        assert_eq!(OwnerKeys::parse("{}").unwrap(), OwnerKeys::default());
        for bad in [
            "not json",
            r#"{"github": {"o": ""}}"#,
            r#"{"github": {"": "s"}}"#,
            r#"{"github": {"o/r": "s"}}"#,
            r#"{"github": {"o": "s", "O": "s2"}}"#,
            r#"{"bitbucket": {}}"#,
            r#"{"github": ["s"]}"#,
        ] {
            let e = OwnerKeys::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("s2") && !e.contains("\"s\""), "a secret in an error: {e}");
        }
    }

    #[test]
    fn the_owner_is_the_first_segment_of_the_payloads_name() {
        let gh = br#"{"repository": {"id": 1, "full_name": "Octo-Org/hello"}}"#;
        assert_eq!(claimed_owner(Provider::Github, gh), Some("octo-org".into()));
        let gl = br#"{"project": {"id": 7, "path_with_namespace": "acme/platform/api"}}"#;
        assert_eq!(claimed_owner(Provider::Gitlab, gl), Some("acme".into()));
        assert_eq!(claimed_owner(Provider::Github, b"{}"), None);
        assert_eq!(claimed_owner(Provider::Github, br#"{"repository": {"full_name": "/x"}}"#), None);
        assert_eq!(claimed_owner(Provider::Gitlab, gh), None);
    }

    /// A payload that also carries the other host's name key is read as its push is: the owner is
    /// the accepted push's, so no second key can hide it and send the payload to the shared secret.
    #[test]
    fn the_owner_is_read_as_the_push_reads_it_whatever_other_keys_the_payload_carries() {
        let gh = br#"{"repository": {"id": 1, "full_name": "victim-org/app", "path_with_namespace": "x"}}"#;
        assert_eq!(claimed_owner(Provider::Github, gh), Some("victim-org".into()));
        let gl = br#"{"project": {"id": 7, "path_with_namespace": "acme/platform/api", "full_name": "x"}}"#;
        assert_eq!(claimed_owner(Provider::Gitlab, gl), Some("acme".into()));
    }
}
