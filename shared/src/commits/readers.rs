//! Who may read a repository's summaries ([`SummaryReaders`]): the tenants mapped to the
//! repository's owner. Pure.
//!
//! A summary tells what a private repository's commits do, so with tenancy on (several parties
//! behind one API) it is read only by the tenants mapped to its owner (a GitHub user or
//! organisation, a GitLab top-level group), from `LANES_SUMMARY_READERS`:
//!
//! ```json
//! {"github:octo-org": ["team-a", "arn:aws:iam::123456789012:role/ci"], "gitlab:acme": ["*"]}
//! ```
//!
//! Keys are `provider:owner` (`local` for repositories on this machine), without regard to case;
//! values are tenants as the API knows them (the JWT claim, or the IAM principal), or `*` for every
//! authenticated tenant. Everyone else gets `404`, as for a repository with no summaries, so ids
//! cannot be walked to learn which exist. With no table, no tenant reads any summary. With tenancy
//! off (one party), there is no one to keep out and the table is not used.
//!
//! The owner comes from the summary's `repo`, which the commits worker checked against the host's
//! name for the repository's id before writing it ([`crate::commits::sources::Identities`]).

use crate::domain::Tenant;
use crate::domain::commit::{CommitSummary, Provider};
use std::collections::{HashMap, HashSet};

/// Owner (`provider:owner`, lower-cased) to the tenants that may read its repositories' summaries.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SummaryReaders {
    owners: HashMap<String, Readers>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Readers {
    any: bool,
    tenants: HashSet<String>,
}

/// Why the table was refused: which entry, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReadersError(String);

impl SummaryReaders {
    /// Parses the JSON table (see the module docs).
    pub fn parse(json: &str) -> Result<Self, ReadersError> {
        let raw: HashMap<String, Vec<String>> = serde_json::from_str(json).map_err(|e| {
            ReadersError(format!("expected {{\"provider:owner\": [tenant, …]}}, e.g. {{\"github:octo-org\": [\"team-a\"]}}: {e}"))
        })?;
        let mut owners = HashMap::with_capacity(raw.len());
        for (key, tenants) in raw {
            let owner = Self::owner_key(&key)?;
            let mut readers = Readers::default();
            for t in tenants {
                match t.trim() {
                    "*" => readers.any = true,
                    t => {
                        let tenant = Tenant::parse(t)
                            .map_err(|e| ReadersError(format!("`{key}`: the tenant `{t}` {}", e.reason)))?;
                        readers.tenants.insert(tenant.as_str().to_owned());
                    }
                }
            }
            if owners.insert(owner, readers).is_some() {
                return Err(ReadersError(format!("`{key}` is listed twice")));
            }
        }
        Ok(Self { owners })
    }

    fn owner_key(key: &str) -> Result<String, ReadersError> {
        let bad = || ReadersError(format!("`{key}` is not `github:<owner>`, `gitlab:<group>` or `local`"));
        let key = key.trim().to_ascii_lowercase();
        if key == "local" {
            return Ok(key);
        }
        match key.split_once(':') {
            Some(("github" | "gitlab", owner)) if !owner.is_empty() && !owner.contains('/') => Ok(key),
            _ => Err(bad()),
        }
    }

    /// The key of the owner of `summary`'s repository.
    fn owner_of(summary: &CommitSummary) -> String {
        match summary.repo_id.provider() {
            Provider::Local => "local".into(),
            p => format!("{p}:{}", summary.repo.split('/').next().unwrap_or("").to_ascii_lowercase()),
        }
    }

    /// Whether `tenant` may read `summary`.
    pub fn may_read(&self, tenant: &Tenant, summary: &CommitSummary) -> bool {
        self.owners
            .get(&Self::owner_of(summary))
            .is_some_and(|r| r.any || r.tenants.contains(tenant.as_str()))
    }

    /// Whether `tenant` may read anything at all (else every read is a 404 without a lookup).
    pub fn reads_any(&self, tenant: &Tenant) -> bool {
        self.owners.values().any(|r| r.any || r.tenants.contains(tenant.as_str()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::domain::TokenUsage;
    use crate::domain::commit::SummarySource;

    fn summary(repo_id: &str, repo: &str) -> CommitSummary {
        CommitSummary {
            repo_id: repo_id.parse().unwrap(),
            sha: "a".repeat(40).parse().unwrap(),
            repo: repo.into(),
            subject: String::new(),
            summary: String::new(),
            model: String::new(),
            source: SummarySource::Llm,
            tokens: TokenUsage::default(),
            diff_tokens: 0,
            diff_cut: false,
            committed_at_ms: 0,
            created_at_ms: 0,
            tier: Default::default(),
        }
    }

    #[test]
    fn only_tenants_mapped_to_the_owner_read_its_summaries() {
        let r = SummaryReaders::parse(
            r#"{"github:Octo-Org": ["team-a"], "gitlab:acme": ["*"], "local": ["dev"]}"#,
        )
        .unwrap();
        let (a, b) = (Tenant::parse("team-a").unwrap(), Tenant::parse("team-b").unwrap());
        let octo = summary("github:1", "octo-org/app");
        assert!(r.may_read(&a, &octo) && !r.may_read(&b, &octo));
        assert!(!r.may_read(&a, &summary("github:2", "other/app")), "an owner nobody is mapped to");
        assert!(!r.may_read(&a, &summary("gitlab:1", "octo-org/app")), "hosts are apart");
        let acme = summary("gitlab:3", "acme/platform/api");
        assert!(r.may_read(&a, &acme) && r.may_read(&b, &acme), "`*` is every tenant");
        assert!(r.may_read(&Tenant::parse("dev").unwrap(), &summary("local:0123abcd", "/home/x/repo")));
        assert!(r.reads_any(&b));
        let none = SummaryReaders::default();
        assert!(!none.reads_any(&a) && !none.may_read(&a, &octo), "no table: nobody reads");
    }

    #[test]
    fn a_malformed_table_names_its_bad_entry() {
        for (bad, names) in [
            ("[]", "expected"),
            (r#"{"octo-org": ["a"]}"#, "octo-org"),
            (r#"{"github:o/r": ["a"]}"#, "github:o/r"),
            (r#"{"bitbucket:x": ["a"]}"#, "bitbucket:x"),
            (r#"{"github:o": ["a\nb"]}"#, "github:o"),
            (r#"{"github:o": "a"}"#, "expected"),
            (r#"{"github:o": ["a"], "GitHub:O": ["b"]}"#, "listed twice"),
        ] {
            let e = SummaryReaders::parse(bad).unwrap_err().to_string();
            assert!(e.contains(names), "{bad}: {e}");
        }
    }
}
