//! The identifiers the flows pass around, one type each, so a task id cannot be handed where a
//! commit sha is wanted and no id is checked twice, and the repository host ([`Provider`]) a
//! repository id names. Each is checked once, where it enters:
//!
//! - [`TaskId`]: in ingress's paths, or made here from a digest ([`TaskId::digest`]);
//! - [`Tenant`]: from the authorizer or the trusted header (`tasks::tenant`);
//! - [`RepoId`] and [`Sha`]: in the webhook's and `lanes summarize`'s parse of a push;
//! - [`MessageId`]: in the Lambda batch decode and the queue adapters' receive.
//!
//! Deserializing goes through the same check ([`serde`]'s `try_from`), so a queue message or a
//! stored record holding a malformed id is refused at its decode, never carried further. On the
//! wire each is its plain string (`#[serde(into = "String")]`). Pure.

use crate::domain::sha256_hex;
use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

/// Why a string is not a valid identifier of its kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct IdError {
    /// The field the identifier came from (`task_id`, `repo_id`, `sha`, `tenant`, `messageId`).
    pub field: &'static str,
    /// Why it was refused, in words a client can act on.
    pub reason: &'static str,
}

/// What every identifier type shares: the checked constructor, the string views, and serde through
/// the check. Each type supplies `fn check(&str) -> Result<(), IdError>`.
macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The identifier, if `raw` is a valid one.
            pub fn parse(raw: &str) -> Result<Self, IdError> {
                Self::check(raw)?;
                Ok(Self(raw.to_owned()))
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(raw: String) -> Result<Self, IdError> {
                Self::check(&raw)?;
                Ok(Self(raw))
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(raw: &str) -> Result<Self, IdError> {
                Self::parse(raw)
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }
    };
}

/// Where a repository lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// github.com or GitHub Enterprise.
    Github,
    /// gitlab.com or a self-managed GitLab.
    Gitlab,
    /// A repository on this machine (`lanes summarize`, `lanes dev`); never enabled in Lambda.
    Local,
}

impl Provider {
    /// Lower-case name, the prefix of a `repo_id`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Github => "github",
            Provider::Gitlab => "gitlab",
            Provider::Local => "local",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

identifier! {
    /// A task's id: the hex sha256 its idempotency key names (64 lower-case hex digits).
    TaskId
}

impl TaskId {
    /// The task id of a key: the hex sha256 of `key`. Valid by construction.
    pub fn digest(key: &[u8]) -> Self {
        Self(sha256_hex(key))
    }

    fn check(raw: &str) -> Result<(), IdError> {
        if raw.len() == 64 && is_lower_hex(raw) {
            Ok(())
        } else {
            Err(IdError { field: "task_id", reason: "must be 64 lower-case hex digits" })
        }
    }
}

identifier! {
    /// A repository's id, `provider:id`: `github:<digits>`, `gitlab:<digits>` or `local:<hex>`. The
    /// host's numeric id, never the name, so a renamed or transferred repository keeps its summaries.
    RepoId
}

impl RepoId {
    /// The provider its prefix names.
    pub fn provider(&self) -> Provider {
        // Valid by construction: the split cannot fail, so the fallback is never taken.
        Self::split(&self.0).map_or(Provider::Local, |(p, _)| p)
    }

    /// The part after the provider: the host's numeric id (or a local repository's digest).
    pub fn host_id(&self) -> &str {
        Self::split(&self.0).map_or("", |(_, id)| id)
    }

    /// The id of a repository on `provider`, from the host's numeric id (or, for a local
    /// repository, a hex digest).
    pub fn of(provider: Provider, id: &str) -> Result<Self, IdError> {
        Self::parse(&format!("{provider}:{id}"))
    }

    fn split(raw: &str) -> Result<(Provider, &str), IdError> {
        let bad = |reason| IdError { field: "repo_id", reason };
        let (provider, id) = raw.split_once(':').ok_or(bad("must be `provider:id`, e.g. `github:123456`"))?;
        let provider = match provider {
            "github" => Provider::Github,
            "gitlab" => Provider::Gitlab,
            "local" => Provider::Local,
            _ => return Err(bad("must start with `github:`, `gitlab:` or `local:`")),
        };
        let ok = match provider {
            Provider::Local => (8..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit()),
            _ => (1..=20).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_digit()),
        };
        match (ok, provider) {
            (true, _) => Ok((provider, id)),
            (false, Provider::Local) => Err(bad("the id after `local:` must be 8-64 hex digits")),
            (false, _) => Err(bad("the id after the provider must be the host's numeric id (1-20 digits)")),
        }
    }

    fn check(raw: &str) -> Result<(), IdError> {
        Self::split(raw).map(|_| ())
    }
}

identifier! {
    /// A full commit id: 40 (SHA-1) or 64 (SHA-256) lower-case hex digits.
    Sha
}

impl Sha {
    fn check(raw: &str) -> Result<(), IdError> {
        if (raw.len() == 40 || raw.len() == 64) && is_lower_hex(raw) {
            Ok(())
        } else {
            Err(IdError { field: "sha", reason: "must be a full commit id: 40 or 64 lower-case hex digits" })
        }
    }
}

/// Longest tenant identifier kept (an IAM role-session ARN fits).
pub const MAX_TENANT_LEN: usize = 512;

identifier! {
    /// The authenticated caller of the task API, never a field the client chooses: 1 to
    /// [`MAX_TENANT_LEN`] bytes, no surrounding space, no control characters.
    Tenant
}

impl Tenant {
    fn check(raw: &str) -> Result<(), IdError> {
        let ok = !raw.is_empty()
            && raw.len() <= MAX_TENANT_LEN
            && raw.trim() == raw
            && !raw.chars().any(char::is_control);
        if ok {
            Ok(())
        } else {
            Err(IdError {
                field: "tenant",
                reason: "must be 1 to 512 bytes without surrounding space or control characters",
            })
        }
    }
}

/// Longest message id accepted (SQS's are UUIDs; the embedded queue's are shorter).
pub const MAX_MESSAGE_ID_LEN: usize = 128;

identifier! {
    /// A queue message's stable id (SQS's `MessageId`, the Lambda record's `messageId`): what a
    /// partial batch response names. 1 to [`MAX_MESSAGE_ID_LEN`] visible ASCII characters.
    MessageId
}

impl MessageId {
    /// A fresh id, as a queue twin gives a message it is sent: a v7 UUID, unique like a v4 one but
    /// ordered by the time it was made (and, within a millisecond, by a counter). The embedded queue
    /// keys its table by id, so new messages land at the table's end and the oldest, which are the
    /// ones received and deleted next, sit together at its start: a commit's sends, receives and
    /// deletes rewrite a few neighbouring pages rather than one page per message.
    pub fn fresh() -> Self {
        Self(uuid::Uuid::now_v7().to_string())
    }

    fn check(raw: &str) -> Result<(), IdError> {
        if !raw.is_empty() && raw.len() <= MAX_MESSAGE_ID_LEN && raw.bytes().all(|b| b.is_ascii_graphic()) {
            Ok(())
        } else {
            Err(IdError { field: "messageId", reason: "must be 1 to 128 visible ASCII characters" })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_64_lower_hex_and_digests_are_task_ids() {
        assert!(TaskId::parse(&"a".repeat(64)).is_ok());
        for bad in ["", "A".repeat(64).as_str(), "a".repeat(63).as_str(), "g".repeat(64).as_str()] {
            assert_eq!(TaskId::parse(bad).map_err(|e| e.field), Err("task_id"), "{bad}");
        }
        let d = TaskId::digest(b"x");
        assert_eq!(TaskId::parse(d.as_str()), Ok(d));
    }

    #[test]
    fn repo_ids_name_their_provider_and_refuse_names() {
        assert_eq!(RepoId::parse("github:123").map(|r| r.provider()), Ok(Provider::Github));
        assert_eq!(RepoId::parse("gitlab:9").map(|r| r.provider()), Ok(Provider::Gitlab));
        assert_eq!(RepoId::parse("local:deadbeef").map(|r| r.provider()), Ok(Provider::Local));
        for bad in [
            "github:octo/repo",
            "github:",
            "bitbucket:1",
            "123",
            "local:xyz12345",
            "github:123456789012345678901",
        ] {
            assert_eq!(RepoId::parse(bad).map_err(|e| e.field), Err("repo_id"), "{bad}");
        }
        assert_eq!(RepoId::of(Provider::Github, "42").map(String::from), Ok("github:42".to_owned()));
    }

    #[test]
    fn shas_are_full_lower_hex() {
        assert!(Sha::parse(&"0".repeat(40)).is_ok() && Sha::parse(&"f".repeat(64)).is_ok());
        for bad in ["abc1234", "A".repeat(40).as_str(), "0".repeat(41).as_str()] {
            assert!(Sha::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tenants_and_message_ids_refuse_empty_control_and_overlong() {
        assert!(Tenant::parse("team-a").is_ok());
        for bad in ["", " team", "a\nb", "x".repeat(MAX_TENANT_LEN + 1).as_str()] {
            assert!(Tenant::parse(bad).is_err(), "{bad:?}");
        }
        assert!(MessageId::parse("0c1b6b8e-1d5e-4c1e-9f3e-8f1a2b3c4d5e").is_ok());
        for bad in ["", "a b", "x".repeat(MAX_MESSAGE_ID_LEN + 1).as_str()] {
            assert!(MessageId::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn serde_is_the_plain_string_and_decoding_checks() {
        let id = TaskId::digest(b"k");
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{id}\""));
        assert_eq!(serde_json::from_str::<TaskId>(&json).ok(), Some(id));
        assert!(serde_json::from_str::<TaskId>("\"nope\"").is_err());
        assert!(serde_json::from_str::<Sha>("\"HEAD\"").is_err());
        assert!(serde_json::from_str::<RepoId>("\"github:octo/x\"").is_err());
    }
}
