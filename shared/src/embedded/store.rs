//! Embedded durable task store: one redb table of JSON records, with the same conditional writes the
//! DynamoDB adapter makes (each runs in one write transaction, so it is atomic).

use super::db::EmbeddedDb;
use crate::domain::{TaskRecord, TaskStatus};
use crate::ports::{
    CancelOutcome, ClaimOutcome, Completion, EnqueueMark, FinishOutcome, PutOutcome, StoreError, TaskStore,
};
use async_trait::async_trait;
use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");

impl From<String> for StoreError {
    fn from(s: String) -> Self {
        StoreError::Unavailable(s)
    }
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// The embedded task store.
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    db: EmbeddedDb,
}

impl EmbeddedStore {
    /// A store in `db`.
    pub fn new(db: EmbeddedDb) -> Self {
        Self { db }
    }

    /// Runs `f` on the current live record inside one write transaction; `f` returns the record to
    /// write (or `None` to leave it) and the call's answer.
    async fn update<T, F>(&self, task_id: &str, now_ms: u64, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Option<TaskRecord>) -> (Option<Write>, T) + Send + 'static,
    {
        self.update_stored(task_id, move |stored| f(stored.filter(|r| !r.is_expired(now_ms)))).await
    }

    /// [`Self::update`] on the stored record, expired or not (DynamoDB keeps an expired item until
    /// its TTL sweep, and a replacement keeps its fence).
    async fn update_stored<T, F>(&self, task_id: &str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Option<TaskRecord>) -> (Option<Write>, T) + Send + 'static,
    {
        let id = task_id.to_owned();
        // A refusal made before anything is written (an unreadable record, a record that will not
        // serialize) is this call's answer alone; only a failed write fails the group.
        self.db
            .submit_maybe(move |txn| -> Result<(Result<T, StoreError>, bool), StoreError> {
                let current = match read(txn, &id) {
                    Ok(c) => c,
                    Err(e) => return Ok((Err(e), false)),
                };
                let (write, answer) = f(current);
                let bytes = match &write {
                    Some(Write::Put(record)) => match serde_json::to_vec(record) {
                        Ok(b) => Some(b),
                        Err(e) => return Ok((Err(unavailable(e)), false)),
                    },
                    _ => None,
                };
                let wrote = write.is_some();
                let mut table = txn.open_table(TASKS).map_err(unavailable)?;
                match (write, bytes) {
                    (Some(Write::Put(_)), Some(bytes)) => {
                        table.insert(id.as_str(), bytes.as_slice()).map_err(unavailable)?;
                    }
                    (Some(Write::Delete), _) => {
                        table.remove(id.as_str()).map_err(unavailable)?;
                    }
                    _ => {}
                }
                Ok((Ok(answer), wrote))
            })
            .wait()
            .await?
    }

    /// Every live record (for tests and the local runner's recovery report).
    pub async fn all(&self, now_ms: u64) -> Result<Vec<TaskRecord>, StoreError> {
        self.db
            .run(move |db| {
                let txn = db.begin_read().map_err(unavailable)?;
                let table = match txn.open_table(TASKS) {
                    Ok(t) => t,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(unavailable(e)),
                };
                let mut out = Vec::new();
                for entry in table.iter().map_err(unavailable)? {
                    let (_, v) = entry.map_err(unavailable)?;
                    let record: TaskRecord =
                        serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    if !record.is_expired(now_ms) {
                        out.push(record);
                    }
                }
                Ok(out)
            })
            .await
    }
}

enum Write {
    Put(Box<TaskRecord>),
    Delete,
}

fn read(txn: &WriteTransaction, id: &str) -> Result<Option<TaskRecord>, StoreError> {
    let table = txn.open_table(TASKS).map_err(unavailable)?;
    let Some(v) = table.get(id).map_err(unavailable)? else { return Ok(None) };
    serde_json::from_slice(v.value()).map(Some).map_err(|e| StoreError::Corrupt(format!("task {id}: {e}")))
}

#[async_trait]
impl TaskStore for EmbeddedStore {
    async fn put_pending(&self, record: &TaskRecord, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let mut record = record.clone();
        self.update_stored(&record.task_id.clone(), move |current| match current {
            Some(existing) if !existing.is_expired(now_ms) && !existing.status.is_resubmittable() => {
                (None, PutOutcome::Exists(Box::new(existing)))
            }
            previous => {
                // The fence never goes back, even past an expiry: a worker still holding a fence from
                // the earlier run must not be able to finish the new one.
                record.fence = previous.map_or(0, |p| p.fence);
                (Some(Write::Put(Box::new(record))), PutOutcome::Created)
            }
        })
        .await
    }

    async fn get(&self, task_id: &str, now_ms: u64) -> Result<Option<TaskRecord>, StoreError> {
        let id = task_id.to_owned();
        self.db
            .run(move |db| {
                let txn = db.begin_read().map_err(unavailable)?;
                let table = match txn.open_table(TASKS) {
                    Ok(t) => t,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                    Err(e) => return Err(unavailable(e)),
                };
                let Some(v) = table.get(id.as_str()).map_err(unavailable)? else { return Ok(None) };
                let record: TaskRecord = serde_json::from_slice(v.value())
                    .map_err(|e| StoreError::Corrupt(format!("task {id}: {e}")))?;
                Ok((!record.is_expired(now_ms)).then_some(record))
            })
            .await
    }

    async fn delete_pending(&self, task_id: &str, nonce: &str) -> Result<bool, StoreError> {
        let nonce = nonce.to_owned();
        self.update(task_id, 0, move |current| match current {
            Some(r) if r.status == TaskStatus::Pending && r.nonce == nonce => (Some(Write::Delete), true),
            _ => (None, false),
        })
        .await
    }

    async fn mark_enqueued(
        &self,
        task_id: &str,
        mark: EnqueueMark,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError> {
        self.update(task_id, now_ms, move |current| match current {
            Some(mut r)
                if r.status == TaskStatus::Pending
                    && r.fence == mark.fence
                    && r.enqueued_at_ms == mark.from_ms =>
            {
                r.enqueued_at_ms = mark.to_ms;
                r.expires_at = r.expires_at.max(now_ms / 1000 + ttl_secs);
                (Some(Write::Put(Box::new(r))), true)
            }
            _ => (None, false),
        })
        .await
    }

    async fn claim(&self, task_id: &str, now_ms: u64, ttl_secs: u64) -> Result<ClaimOutcome, StoreError> {
        self.update(task_id, now_ms, move |current| match current {
            None => (None, ClaimOutcome::Missing),
            Some(r) if r.status.is_terminal() => (None, ClaimOutcome::Terminal(Box::new(r))),
            Some(mut r) => {
                r.status = TaskStatus::Processing;
                r.fence += 1;
                r.started_at_ms = Some(now_ms);
                r.expires_at = r.expires_at.max(now_ms / 1000 + ttl_secs);
                (Some(Write::Put(Box::new(r.clone()))), ClaimOutcome::Claimed(Box::new(r)))
            }
        })
        .await
    }

    async fn finish(
        &self,
        task_id: &str,
        fence: u64,
        completion: Completion,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<FinishOutcome, StoreError> {
        self.update(task_id, now_ms, move |current| match current {
            Some(mut r) if r.status == TaskStatus::Processing && r.fence == fence => {
                match completion {
                    Completion::Completed(result) => {
                        r.status = TaskStatus::Completed;
                        r.result = Some(result);
                        r.error = None;
                    }
                    Completion::Failed(reason) => {
                        r.status = TaskStatus::Failed;
                        r.error = Some(reason);
                    }
                }
                r.finished_at_ms = Some(now_ms);
                r.expires_at = now_ms / 1000 + ttl_secs;
                (Some(Write::Put(Box::new(r.clone()))), FinishOutcome::Written(Box::new(r)))
            }
            _ => (None, FinishOutcome::StaleFence),
        })
        .await
    }

    async fn note_attempt(&self, task_id: &str, fence: u64, reason: &str) -> Result<Option<u32>, StoreError> {
        let reason = reason.chars().take(MAX_ERROR_CHARS).collect::<String>();
        self.update(task_id, 0, move |current| match current {
            Some(mut r) if r.status == TaskStatus::Processing && r.fence == fence => {
                r.attempts += 1;
                r.error = Some(reason);
                let n = r.attempts;
                (Some(Write::Put(Box::new(r))), Some(n))
            }
            _ => (None, None),
        })
        .await
    }

    async fn cancel(&self, task_id: &str, now_ms: u64, ttl_secs: u64) -> Result<CancelOutcome, StoreError> {
        self.update(task_id, now_ms, move |current| match current {
            None => (None, CancelOutcome::Missing),
            Some(r) if r.status.is_terminal() => (None, CancelOutcome::Terminal(Box::new(r))),
            Some(mut r) => {
                r.status = TaskStatus::Cancelled;
                r.fence += 1;
                r.finished_at_ms = Some(now_ms);
                r.expires_at = now_ms / 1000 + ttl_secs;
                (Some(Write::Put(Box::new(r.clone()))), CancelOutcome::Cancelled(Box::new(r)))
            }
        })
        .await
    }

    async fn fail_unfinished(
        &self,
        task_id: &str,
        reason: &str,
        sent_before_ms: u64,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError> {
        let reason = reason.chars().take(MAX_ERROR_CHARS).collect::<String>();
        self.update(task_id, now_ms, move |current| match current {
            Some(mut r) if !r.status.is_terminal() && r.created_at_ms <= sent_before_ms => {
                r.status = TaskStatus::Failed;
                r.fence += 1;
                r.error = Some(reason);
                r.finished_at_ms = Some(now_ms);
                r.expires_at = now_ms / 1000 + ttl_secs;
                (Some(Write::Put(Box::new(r))), true)
            }
            _ => (None, false),
        })
        .await
    }
}

/// Longest stored failure reason (as DynamoDB's adapter keeps it).
const MAX_ERROR_CHARS: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TokenUsage;
    use crate::domain::{TaskRequest, TaskResult};
    use serde_json::json;

    fn record(now: u64) -> TaskRecord {
        let req = TaskRequest::from_value(
            json!({"project_id":"p","kind":"explain","prompt":"x","target_files":["a.rs"]}),
        )
        .unwrap();
        TaskRecord::pending(req.task_id(None), req, now, 3600)
    }

    fn mark(fence: u64, from_ms: u64, to_ms: u64) -> EnqueueMark {
        EnqueueMark { fence, from_ms, to_ms }
    }

    fn result() -> TaskResult {
        TaskResult {
            text: "t".into(),
            model: "m".into(),
            tokens: TokenUsage { prompt: 1, completion: 2 },
            truncated: false,
            cost_usd: None,
        }
    }

    #[tokio::test]
    async fn conditional_writes_and_fence() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap());
        let r = record(1_000);
        let id = r.task_id.clone();
        assert_eq!(store.put_pending(&r, 1_000).await.unwrap(), PutOutcome::Created);
        let PutOutcome::Exists(existing) = store.put_pending(&record(2_000), 2_000).await.unwrap() else {
            panic!("second put must see the first")
        };
        assert_eq!(existing.nonce, r.nonce);

        let ClaimOutcome::Claimed(c1) = store.claim(&id, 3_000, 3600).await.unwrap() else { panic!() };
        let ClaimOutcome::Claimed(c2) = store.claim(&id, 4_000, 3600).await.unwrap() else { panic!() };
        assert_eq!((c1.fence, c2.fence, c2.attempts), (1, 2, 0), "a claim is not an attempt");
        // The first claimant lost its lease: its write is rejected and changes nothing.
        let stale = store.finish(&id, c1.fence, Completion::Completed(result()), 5_000, 3600).await.unwrap();
        assert_eq!(stale, FinishOutcome::StaleFence);
        assert_eq!(store.get(&id, 5_000).await.unwrap().unwrap().status, TaskStatus::Processing);
        let ok = store.finish(&id, c2.fence, Completion::Completed(result()), 5_000, 3600).await.unwrap();
        assert!(matches!(ok, FinishOutcome::Written(r) if r.status == TaskStatus::Completed));
        assert!(matches!(store.claim(&id, 6_000, 3600).await.unwrap(), ClaimOutcome::Terminal(_)));
        assert_eq!(
            store.finish(&id, c2.fence, Completion::Failed("late".into()), 6_000, 3600).await.unwrap(),
            FinishOutcome::StaleFence,
            "a terminal record is never rewritten"
        );
    }

    #[tokio::test]
    async fn delete_pending_only_removes_own_unclaimed_record_and_records_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let r = record(1_000);
        let id = r.task_id.clone();
        {
            let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap());
            store.put_pending(&r, 1_000).await.unwrap();
            assert!(!store.delete_pending(&id, "someone else").await.unwrap());
            assert!(store.mark_enqueued(&id, mark(0, r.enqueued_at_ms, 70_000), 70_000, 3600).await.unwrap());
        }
        let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap());
        let back = store.get(&id, 70_000).await.unwrap().unwrap();
        assert_eq!(back.enqueued_at_ms, 70_000);
        assert!(store.delete_pending(&id, &r.nonce).await.unwrap());
        assert_eq!(store.get(&id, 70_000).await.unwrap(), None);
        assert_eq!(store.claim(&id, 70_000, 3600).await.unwrap(), ClaimOutcome::Missing);
    }

    #[tokio::test]
    async fn expired_and_failed_records_can_be_replaced_without_resetting_the_fence() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap());
        let r = record(1_000);
        let id = r.task_id.clone();
        store.put_pending(&r, 1_000).await.unwrap();
        let ClaimOutcome::Claimed(c) = store.claim(&id, 2_000, 3600).await.unwrap() else { panic!() };
        store.finish(&id, c.fence, Completion::Failed("bad".into()), 3_000, 3600).await.unwrap();
        assert_eq!(store.put_pending(&record(4_000), 4_000).await.unwrap(), PutOutcome::Created);
        let again = store.get(&id, 4_000).await.unwrap().unwrap();
        assert_eq!((again.status, again.fence), (TaskStatus::Pending, 1));
        // Past its TTL a record counts as absent.
        assert_eq!(store.get(&id, 4_000 + 3_601_000 + 1_000).await.unwrap(), None);
    }
}
