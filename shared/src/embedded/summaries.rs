//! Embedded summary store: immutable commit summaries in the same redb file as the queues, with
//! the DynamoDB adapter's semantics (write once, newest-first pages); the webhook's delivery marks
//! and push counts it answers for are [`super::deliveries`]'s.

use super::db::EmbeddedDb;
use super::deliveries;
use super::unavailable;
use crate::domain::commit::CommitSummary;
use crate::domain::{RepoId, Sha};
use crate::ports::{StoreError, SummaryPage, SummaryStore, WriteOnce};
use async_trait::async_trait;
use base64::Engine;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

/// Key `repo_id \0 order_key` -> summary JSON, so one range scan lists a repository in time order.
const BY_REPO: TableDefinition<&str, &[u8]> = TableDefinition::new("summaries_by_repo");
/// Key `repo_id:sha` -> `order_key`.
const BY_KEY: TableDefinition<&str, &str> = TableDefinition::new("summaries");

/// The embedded summary store.
#[derive(Debug, Clone)]
pub struct EmbeddedSummaries {
    db: EmbeddedDb,
}

impl EmbeddedSummaries {
    /// A store in `db`.
    pub fn new(db: EmbeddedDb) -> Self {
        Self { db }
    }
}

fn repo_key(repo_id: &RepoId, order: &str) -> String {
    format!("{repo_id}\u{0}{order}")
}

#[async_trait]
impl SummaryStore for EmbeddedSummaries {
    async fn get_summaries(&self, keys: &[(RepoId, Sha)]) -> Result<Vec<CommitSummary>, StoreError> {
        let keys = keys.to_vec();
        self.db
            .run(move |db| {
                let txn = db.begin_read().map_err(unavailable)?;
                let (by_key, by_repo) = match (txn.open_table(BY_KEY), txn.open_table(BY_REPO)) {
                    (Ok(a), Ok(b)) => (a, b),
                    (Err(redb::TableError::TableDoesNotExist(_)), _) => return Ok(Vec::new()),
                    (Err(e), _) | (_, Err(e)) => return Err(unavailable(e)),
                };
                let mut out = Vec::new();
                for (repo_id, sha) in keys {
                    let Some(order) = by_key
                        .get(crate::domain::commit::commit_key(&repo_id, &sha).as_str())
                        .map_err(unavailable)?
                    else {
                        continue;
                    };
                    let order = order.value().to_owned();
                    if let Some(bytes) =
                        by_repo.get(repo_key(&repo_id, &order).as_str()).map_err(unavailable)?
                    {
                        out.push(
                            serde_json::from_slice(bytes.value())
                                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                        );
                    }
                }
                Ok(out)
            })
            .await
    }

    async fn put_summary(&self, summary: &CommitSummary) -> Result<WriteOnce, StoreError> {
        let summary = summary.clone();
        // An existing summary writes nothing: a group of only those costs no flush.
        self.db
            .submit_maybe(move |txn| {
                let key = summary.key();
                let order = summary.order_key();
                {
                    let mut by_key = txn.open_table(BY_KEY).map_err(unavailable)?;
                    if by_key.get(key.as_str()).map_err(unavailable)?.is_some() {
                        return Ok((WriteOnce::Exists, false));
                    }
                    by_key.insert(key.as_str(), order.as_str()).map_err(unavailable)?;
                    let mut by_repo = txn.open_table(BY_REPO).map_err(unavailable)?;
                    let bytes = serde_json::to_vec(&summary).map_err(unavailable)?;
                    by_repo
                        .insert(repo_key(&summary.repo_id, &order).as_str(), bytes.as_slice())
                        .map_err(unavailable)?;
                }
                Ok((WriteOnce::Written, true))
            })
            .wait()
            .await
    }

    async fn list_summaries(
        &self,
        repo_id: &RepoId,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<SummaryPage, StoreError> {
        let upper = match cursor {
            Some(c) => {
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(c)
                    .map_err(|_| StoreError::Corrupt("cursor".into()))?;
                String::from_utf8(bytes).map_err(|_| StoreError::Corrupt("cursor".into()))?
            }
            None => repo_key(repo_id, "\u{10FFFF}"),
        };
        let lower = repo_key(repo_id, "");
        if !upper.starts_with(&lower) {
            return Err(StoreError::Corrupt("cursor of another repository".into()));
        }
        self.db
            .run(move |db| {
                let txn = db.begin_read().map_err(unavailable)?;
                let table = match txn.open_table(BY_REPO) {
                    Ok(t) => t,
                    Err(redb::TableError::TableDoesNotExist(_)) => {
                        return Ok(SummaryPage { items: Vec::new(), next: None });
                    }
                    Err(e) => return Err(unavailable(e)),
                };
                let mut items = Vec::new();
                let mut last = None;
                let mut more = false;
                for entry in table.range(lower.as_str()..upper.as_str()).map_err(unavailable)?.rev() {
                    let (k, v) = entry.map_err(unavailable)?;
                    if items.len() == limit {
                        more = true;
                        break;
                    }
                    items.push(
                        serde_json::from_slice::<CommitSummary>(v.value())
                            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                    );
                    last = Some(k.value().to_owned());
                }
                let next = last
                    .filter(|_| more)
                    .map(|k| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(k.as_bytes()));
                Ok(SummaryPage { items, next })
            })
            .await
    }

    async fn mark_delivery(&self, delivery: &str, now_ms: u64, ttl_secs: u64) -> Result<bool, StoreError> {
        let id = delivery.to_owned();
        // A replay (the delivery still marked) writes nothing.
        self.db
            .submit_maybe(move |txn| {
                deliveries::mark(txn, &id, now_ms, ttl_secs).map(|marked| (marked, marked))
            })
            .wait()
            .await
    }

    async fn count_pushed(
        &self,
        scope: &crate::domain::commit::PushScope,
        day: u64,
        commits: i64,
        limit: u64,
    ) -> Result<bool, StoreError> {
        let key = deliveries::pushed_key(scope, day);
        self.db
            .submit_maybe(move |txn| {
                deliveries::count_pushed(txn, &key, commits, limit).map(|fits| (fits, fits))
            })
            .wait()
            .await
    }

    async fn sweep_expired(&self, now_ms: u64, max: usize) -> Result<usize, StoreError> {
        deliveries::sweep(&self.db, now_ms, max).await
    }

    async fn delivery_seen(&self, delivery: &str, now_ms: u64) -> Result<bool, StoreError> {
        let id = delivery.to_owned();
        self.db.run(move |db| deliveries::seen(db, &id, now_ms)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::RepoId;

    /// Expired delivery marks and past days' push counts go; live ones stay.
    #[tokio::test]
    async fn the_sweep_deletes_expired_marks_and_past_days() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = EmbeddedSummaries::new(EmbeddedDb::open(dir.path()).unwrap_or_else(|e| panic!("{e}")));
        let day = 86_400_000;
        let repo = crate::domain::commit::PushScope::of(
            &RepoId::parse("github:1").unwrap_or_else(|e| panic!("{e:?}")),
            "octo/repo",
        );
        for (id, ttl) in [("old", 60), ("new", 7 * 86_400)] {
            assert!(store.mark_delivery(id, 10 * day, ttl).await.unwrap_or(false));
        }
        for d in [7, 9, 10] {
            assert!(store.count_pushed(&repo, d, 1, 100).await.unwrap_or(false));
        }
        // Day 10, later: the 60 s mark and day 7's count go; day 9's (yesterday) and 10's stay.
        assert_eq!(store.sweep_expired(10 * day + 3_600_000, 100).await.unwrap_or(0), 2);
        assert!(!store.delivery_seen("old", 10 * day + 3_600_000).await.unwrap_or(true));
        assert!(store.delivery_seen("new", 10 * day + 3_600_000).await.unwrap_or(false));
        assert!(!store.count_pushed(&repo, 9, 100, 100).await.unwrap_or(true), "day 9's count is still 1");
    }
}
