//! Which repository a numeric id names, as the Git host says ([`Identities`]).
//!
//! A push names its repository twice: by the host's numeric id (`repo_id`, the key of every summary
//! and of the one-LLM-call-per-repository rule) and by name (`owner/name`, or GitLab's
//! `path_with_namespace`, which the allowlist, the owner's webhook secret and the fair-order group
//! are chosen by). A payload signed by one repository's admin could otherwise pair its own name with
//! another repository's id and have its diffs (and the instructions they carry) summarized beside
//! that repository's commits. So diffs are fetched by id only, and before any of them the host is
//! asked what the id names (`GET /repositories/{id}` on GitHub, `GET /projects/{id}` on GitLab): a
//! message whose name is not that one is refused ([`crate::ports::DiffError::Refused`]) and never
//! summarized.
//!
//! Answers are kept per process for [`IDENTITY_TTL`], so a batch of one repository's commits costs
//! one lookup; a rename is seen once the entry ages out (a push sent under the old name in between is
//! refused and stays in the DLQ for the operator's redrive).

use crate::domain::RepoId;
use crate::ports::DiffError;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the host's answer for an id is kept.
pub const IDENTITY_TTL: Duration = Duration::from_secs(10 * 60);
/// Most ids kept; past it the cache starts over (a bound on memory, not an eviction policy: a
/// worker sees a few repositories at a time).
pub const MAX_IDENTITIES: usize = 10_000;

/// The hosts' names for repository ids, as last read.
#[derive(Debug, Default)]
pub struct Identities {
    names: Mutex<HashMap<RepoId, (Arc<str>, Instant)>>,
}

/// Whether `claimed` is the repository the host calls `actual`. Both hosts treat names without
/// regard to case (`Octo/Repo` and `octo/repo` are one repository).
pub fn same_repository(claimed: &str, actual: &str) -> bool {
    claimed.eq_ignore_ascii_case(actual)
}

impl Identities {
    /// Checks that `repo_id` names `claimed`, asking the host with `resolve` (which answers the
    /// repository it found for the id: its own numeric id and its name) unless a fresh answer is
    /// kept. A host error passes through as it is (a 404 is permanent, a 5xx retryable); an answer
    /// for another id, or a different name, is [`DiffError::Refused`].
    pub async fn check<F, Fut>(&self, repo_id: &RepoId, claimed: &str, resolve: F) -> Result<(), DiffError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(u64, String), DiffError>>,
    {
        let kept = self.names.lock().ok().and_then(|names| {
            names.get(repo_id).filter(|(_, at)| at.elapsed() < IDENTITY_TTL).map(|(n, _)| n.clone())
        });
        let actual = match kept {
            Some(name) => name,
            None => {
                let (id, name) = resolve().await?;
                if id.to_string() != repo_id.host_id() {
                    return Err(DiffError::Refused(format!(
                        "the host answered repository {id} for {repo_id}"
                    )));
                }
                let name: Arc<str> = name.into();
                if let Ok(mut names) = self.names.lock() {
                    if names.len() >= MAX_IDENTITIES {
                        names.clear();
                    }
                    names.insert(repo_id.clone(), (name.clone(), Instant::now()));
                }
                name
            }
        };
        if same_repository(claimed, &actual) {
            Ok(())
        } else {
            Err(DiffError::Refused(format!(
                "{repo_id} is `{actual}` on the host, not `{claimed}` as the push says"
            )))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_name_the_host_does_not_give_the_id_is_refused_and_answers_are_kept() {
        let ids = Identities::default();
        let asked = AtomicUsize::new(0);
        let resolve = || async {
            asked.fetch_add(1, Ordering::SeqCst);
            Ok::<_, DiffError>((7, "Octo/Hello".to_owned()))
        };
        let id: RepoId = "github:7".parse().unwrap();
        ids.check(&id, "octo/hello", resolve).await.unwrap();
        ids.check(&id, "OCTO/HELLO", resolve).await.unwrap();
        let forged = ids.check(&id, "attacker/own", resolve).await.unwrap_err();
        assert!(
            matches!(&forged, DiffError::Refused(r) if r.contains("attacker/own") && r.contains("Octo/Hello"))
        );
        assert_eq!(asked.load(Ordering::SeqCst), 1, "one lookup per id while fresh");
    }

    #[tokio::test]
    async fn a_host_error_is_not_kept_and_passes_through() {
        let ids = Identities::default();
        let id: RepoId = "gitlab:9".parse().unwrap();
        let down = ids
            .check(&id, "g/p", || async {
                Err::<(u64, String), _>(DiffError::Retryable { message: "502".into(), retry_after: None })
            })
            .await;
        assert!(matches!(down, Err(DiffError::Retryable { .. })));
        let other = ids.check(&id, "g/p", || async { Ok((10, "g/p".to_owned())) }).await;
        assert!(matches!(other, Err(DiffError::Refused(_))), "an answer for another id: {other:?}");
        ids.check(&id, "g/p", || async { Ok((9, "g/p".to_owned())) }).await.unwrap();
    }
}
