//! Embedded durable task store: JSON records in the redb file, laid out as [`records`] says. Every
//! write is a row of the transition table carried out by [`lifecycle::apply`] inside one write
//! transaction, so it is atomic and the same row the DynamoDB adapter renders as its condition.

use super::db::EmbeddedDb;
use super::unavailable;
use crate::domain::lifecycle::{self, Command};
use crate::domain::{TaskId, TaskRecord};
use crate::ports::{
    CancelOutcome, ClaimOutcome, Completion, EnqueueMark, FinishOutcome, PutOutcome, StoreError, TaskStore,
};
use async_trait::async_trait;
use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

mod records;

use records::Records;

/// Every record by its expiry (`expires_at`, Unix seconds), then where it is (`created_at_ms`, id),
/// kept in the same transaction as the record, so the TTL sweep reads only what has expired rather
/// than the whole table. Within one second of expiry, entries are in the order their records were
/// created, so the entries one group commit moves (a claim's, a finish's) share leaves, as the
/// records do ([`records`]).
const EXPIRY: TableDefinition<(u64, u64, &str), ()> = TableDefinition::new("task_expiry_by_created");

/// The index of a file written before [`EXPIRY`]: by expiry and id. Dropped by the first sweep,
/// which builds [`EXPIRY`].
const OLD_EXPIRY: TableDefinition<(u64, &str), ()> = TableDefinition::new("task_expiry");

/// The key in [`EXPIRY`] saying its entries cover every record: absent in a file written before
/// the index existed, whose records the first sweep then indexes.
const INDEXED: (u64, u64, &str) = (u64::MAX, u64::MAX, "indexed");

/// A record's key in [`EXPIRY`], without its id.
fn expiry_of(record: &TaskRecord) -> (u64, u64) {
    (record.expires_at, record.created_at_ms)
}

impl From<String> for StoreError {
    fn from(s: String) -> Self {
        StoreError::Unavailable(s)
    }
}

/// The embedded task store.
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    db: EmbeddedDb,
    /// Whether this process has seen the expiry index cover every record ([`index_unindexed`])
    /// and no record left in the legacy layout, so later sweeps skip the check and its turn in
    /// the write queue.
    upgraded: Arc<AtomicBool>,
    /// Whether the file may still hold records in the legacy layout ([`records`]).
    legacy: Arc<AtomicBool>,
}

impl EmbeddedStore {
    /// A store in `db`.
    pub fn new(db: EmbeddedDb) -> Self {
        let legacy = records::has_legacy(&db.db);
        Self { db, upgraded: Arc::new(AtomicBool::new(false)), legacy: Arc::new(AtomicBool::new(legacy)) }
    }

    /// A job of a write transaction that runs `f` on the stored record, expired or not (DynamoDB
    /// keeps an expired item until its TTL sweep, and a replacement keeps its fence); `f` returns
    /// the record to write (or `None` to leave it) and the call's answer. The job answers
    /// `(answer, wrote)`, so a caller may write more in the same transaction. A refusal made before
    /// anything is written (an unreadable record, a record that will not serialize) is the answer
    /// alone; only a failed write is an `Err`, which fails the transaction.
    fn update_job<T, F>(
        &self,
        task_id: &TaskId,
        f: F,
    ) -> impl FnOnce(&WriteTransaction) -> Result<(Result<T, StoreError>, bool), StoreError> + Send + 'static
    where
        T: Send + 'static,
        F: FnOnce(Option<TaskRecord>) -> (Option<TaskRecord>, T) + Send + 'static,
    {
        let (id, legacy) = (task_id.to_owned(), self.legacy.load(Ordering::Relaxed));
        move |txn| {
            // One handle for the read and the write: every open looks the table up again in the
            // transaction's table tree, on the writer thread every write waits for.
            let mut table = Records::open(txn, legacy)?;
            let stored = table.get(&id)?;
            let place = stored.as_ref().map(|s| s.place);
            let current = match stored.map(|s| parse(&id, &s.bytes)).transpose() {
                Ok(c) => c,
                Err(e) => return Ok((Err(e), false)),
            };
            let was_expiring_at = current.as_ref().map(expiry_of);
            let (write, answer) = f(current);
            let Some(record) = write else { return Ok((Ok(answer), false)) };
            let bytes = match serde_json::to_vec(&record) {
                Ok(b) => b,
                Err(e) => return Ok((Err(unavailable(e)), false)),
            };
            table.put(&id, record.created_at_ms, &bytes, place)?;
            let expiring_at = expiry_of(&record);
            if was_expiring_at != Some(expiring_at) {
                let mut expiry = txn.open_table(EXPIRY).map_err(unavailable)?;
                if let Some((at, created)) = was_expiring_at {
                    expiry.remove((at, created, id.as_str())).map_err(unavailable)?;
                }
                expiry.insert((expiring_at.0, expiring_at.1, id.as_str()), ()).map_err(unavailable)?;
            }
            Ok((Ok(answer), true))
        }
    }

    /// [`TaskStore::put_pending`] as a job of a write transaction (see [`Self::update_job`]): it
    /// writes exactly when it creates the record.
    pub(crate) fn put_pending_job(
        &self,
        record: &TaskRecord,
        now_ms: u64,
    ) -> impl FnOnce(&WriteTransaction) -> Result<(Result<PutOutcome, StoreError>, bool), StoreError>
    + Send
    + 'static {
        let submit = Command::Submit(Box::new(record.clone()));
        let job = self.transition_job(&record.task_id, submit, now_ms, 0, |outcome| match outcome {
            Ok(_) => Ok(PutOutcome::Created),
            Err(Some(live)) => Ok(PutOutcome::Exists(Box::new(live))),
            Err(None) => Err(StoreError::Corrupt("a submission was refused where no record lives".into())),
        });
        move |txn| job(txn).map(|(answer, wrote)| (answer.and_then(|a| a), wrote))
    }

    /// A job that carries `command` out on the record as its row of the transition table says
    /// ([`Self::update_job`]); `answer` makes the call's answer of the outcome: the record written,
    /// or the live record (if any) the row refused.
    fn transition_job<A: Send + 'static>(
        &self,
        task_id: &TaskId,
        command: Command,
        now_ms: u64,
        ttl_secs: u64,
        answer: impl FnOnce(Result<&TaskRecord, Option<TaskRecord>>) -> A + Send + 'static,
    ) -> impl FnOnce(&WriteTransaction) -> Result<(Result<A, StoreError>, bool), StoreError> + Send + 'static
    {
        self.update_job(task_id, move |stored| {
            match lifecycle::apply(command, stored.as_ref(), now_ms, ttl_secs) {
                Some(next) => {
                    let answer = answer(Ok(&next));
                    (Some(next), answer)
                }
                None => (None, answer(Err(stored.filter(|r| !r.is_expired(now_ms))))),
            }
        })
    }

    /// Every live record (for tests and the local runner's recovery report).
    pub async fn all(&self, now_ms: u64) -> Result<Vec<TaskRecord>, StoreError> {
        self.db
            .run(move |db| {
                let txn = db.begin_read().map_err(unavailable)?;
                let mut out = Vec::new();
                for bytes in records::read_all(&txn)? {
                    let record: TaskRecord =
                        serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    if !record.is_expired(now_ms) {
                        out.push(record);
                    }
                }
                Ok(out)
            })
            .await
    }
}

/// The fields a sweep reads of a record.
#[derive(serde::Deserialize)]
struct Expiry {
    expires_at: u64,
    created_at_ms: u64,
}

fn expired(value: &[u8], now_ms: u64) -> bool {
    serde_json::from_slice::<Expiry>(value).is_ok_and(|e| e.expires_at.saturating_mul(1000) <= now_ms)
}

/// A record's entry in [`EXPIRY`]: its expiry, its creation, its id.
type ExpiryKey = (u64, u64, String);

/// At most `max` records whose TTL has passed at `now_ms`, by expiry and key, read from the expiry
/// index in a read transaction (writers go on meanwhile: redb's readers see a snapshot).
fn find_expired(db: &redb::Database, now_ms: u64, max: usize) -> Result<Vec<ExpiryKey>, StoreError> {
    let txn = db.begin_read().map_err(unavailable)?;
    let index = match txn.open_table(EXPIRY) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(unavailable(e)),
    };
    let mut gone = Vec::new();
    for entry in
        index.range((0, 0, "")..=(now_ms / 1000, u64::MAX, "\u{10FFFF}")).map_err(unavailable)?.take(max)
    {
        let (k, _) = entry.map_err(unavailable)?;
        let (at, created, id) = k.value();
        gone.push((at, created, id.to_owned()));
    }
    Ok(gone)
}

/// Deletes those of `found` still expired at `now_ms`: one may have been written again since it
/// was found, and its index entry then moved with it.
fn delete_expired(
    txn: &WriteTransaction,
    found: &[ExpiryKey],
    now_ms: u64,
    legacy: bool,
) -> Result<usize, StoreError> {
    let mut table = Records::open(txn, legacy)?;
    let mut index = txn.open_table(EXPIRY).map_err(unavailable)?;
    let mut gone = 0;
    for (at, created, id) in found {
        if index.remove((*at, *created, id.as_str())).map_err(unavailable)?.is_none() {
            continue;
        }
        if let Some(stored) = table.get(id)?
            && expired(&stored.bytes, now_ms)
        {
            table.remove_at(id, stored.place)?;
            gone += 1;
        }
    }
    Ok(gone)
}

/// Indexes every record by its expiry, once per file: one written before the index existed has
/// records it does not cover. Returns whether it had to.
fn index_unindexed(txn: &WriteTransaction, legacy: bool) -> Result<bool, StoreError> {
    let mut index = txn.open_table(EXPIRY).map_err(unavailable)?;
    if index.get(INDEXED).map_err(unavailable)?.is_some() {
        return Ok(false);
    }
    Records::open(txn, legacy)?.each(|id, bytes| {
        // An unreadable record is left out, for an operator to look at.
        if let Ok(e) = serde_json::from_slice::<Expiry>(bytes) {
            index.insert((e.expires_at, e.created_at_ms, id), ()).map_err(unavailable)?;
        }
        Ok(())
    })?;
    index.insert(INDEXED, ()).map_err(unavailable)?;
    Ok(true)
}

/// The one-time work of a file written by an older layout: the expiry index completed (and the
/// older index dropped), then the legacy records moved. Returns whether it wrote anything.
fn upgrade(txn: &WriteTransaction, legacy: bool) -> Result<bool, StoreError> {
    let indexed = index_unindexed(txn, legacy)?;
    let dropped = txn.delete_table(OLD_EXPIRY).map_err(unavailable)?;
    if legacy {
        records::move_legacy(txn, created_at)?;
    }
    Ok(indexed || dropped || legacy)
}

/// The one field the legacy move reads of a record.
fn created_at(bytes: &[u8]) -> Option<u64> {
    serde_json::from_slice::<Expiry>(bytes).ok().map(|e| e.created_at_ms)
}

fn parse(id: &str, bytes: &[u8]) -> Result<TaskRecord, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(format!("task {id}: {e}")))
}

impl EmbeddedStore {
    /// Carries `command` out on the record as its row of the transition table says, in one write
    /// transaction: the record written, or the live record (if any) the row refused.
    async fn transition(
        &self,
        task_id: &TaskId,
        command: Command,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<Result<TaskRecord, Option<TaskRecord>>, StoreError> {
        // The refused record is the answer's `Err`, as the store's callers read it.
        #[allow(clippy::result_large_err)]
        let job = self.transition_job(task_id, command, now_ms, ttl_secs, |outcome| outcome.cloned());
        self.db.submit_maybe(job).wait().await?
    }
}

#[async_trait]
impl TaskStore for EmbeddedStore {
    async fn put_pending(&self, record: &TaskRecord, now_ms: u64) -> Result<PutOutcome, StoreError> {
        self.db.submit_maybe(self.put_pending_job(record, now_ms)).wait().await?
    }

    async fn get(&self, task_id: &TaskId, now_ms: u64) -> Result<Option<TaskRecord>, StoreError> {
        let (id, legacy) = (task_id.to_owned(), self.legacy.load(Ordering::Relaxed));
        self.db
            .run(move |db| {
                let txn = db.begin_read().map_err(unavailable)?;
                let Some(bytes) = records::read(&txn, &id, legacy)? else { return Ok(None) };
                let record = parse(&id, &bytes)?;
                Ok((!record.is_expired(now_ms)).then_some(record))
            })
            .await
    }

    async fn mark_enqueued(
        &self,
        task_id: &TaskId,
        mark: EnqueueMark,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError> {
        Ok(self.transition(task_id, Command::MarkEnqueued(mark), now_ms, ttl_secs).await?.is_ok())
    }

    async fn claim(&self, task_id: &TaskId, now_ms: u64, ttl_secs: u64) -> Result<ClaimOutcome, StoreError> {
        Ok(match self.transition(task_id, Command::Claim, now_ms, ttl_secs).await? {
            Ok(r) => ClaimOutcome::Claimed(Box::new(r)),
            Err(Some(live)) => ClaimOutcome::refused(live),
            Err(None) => ClaimOutcome::Missing,
        })
    }

    async fn park(
        &self,
        task_id: &TaskId,
        fence: u64,
        parked: crate::domain::Parked,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError> {
        Ok(self.transition(task_id, Command::Park { fence, parked }, now_ms, ttl_secs).await?.is_ok())
    }

    async fn unpark(&self, task_id: &TaskId, fence: u64, now_ms: u64) -> Result<bool, StoreError> {
        Ok(self.transition(task_id, Command::Unpark { fence }, now_ms, 0).await?.is_ok())
    }

    async fn checkpoint(
        &self,
        task_id: &TaskId,
        fence: u64,
        text: &str,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let command = Command::Checkpoint { fence, text: text.to_owned() };
        Ok(self.transition(task_id, command, now_ms, 0).await?.is_ok())
    }

    async fn finish(
        &self,
        task_id: &TaskId,
        fence: u64,
        completion: Completion,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<FinishOutcome, StoreError> {
        Ok(match self.transition(task_id, Command::Finish { fence, completion }, now_ms, ttl_secs).await? {
            Ok(r) => FinishOutcome::Written(Box::new(r)),
            Err(_) => FinishOutcome::StaleFence,
        })
    }

    async fn note_attempt(
        &self,
        task_id: &TaskId,
        fence: u64,
        reason: &str,
        now_ms: u64,
    ) -> Result<Option<u32>, StoreError> {
        let command = Command::NoteAttempt { fence, reason: reason.to_owned() };
        Ok(self.transition(task_id, command, now_ms, 0).await?.ok().map(|r| r.attempts))
    }

    async fn cancel(
        &self,
        task_id: &TaskId,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<CancelOutcome, StoreError> {
        Ok(match self.transition(task_id, Command::Cancel, now_ms, ttl_secs).await? {
            Ok(r) => CancelOutcome::Cancelled(Box::new(r)),
            Err(Some(live)) => CancelOutcome::Terminal(Box::new(live)),
            Err(None) => CancelOutcome::Missing,
        })
    }

    async fn sweep_expired(&self, now_ms: u64, max: usize) -> Result<usize, StoreError> {
        if !self.upgraded.load(Ordering::Relaxed) {
            let legacy = self.legacy.load(Ordering::Relaxed);
            self.db.submit_maybe(move |txn| upgrade(txn, legacy).map(|wrote| ((), wrote))).wait().await?;
            // Committed: every record is in the new layout now.
            self.legacy.store(false, Ordering::Relaxed);
            self.upgraded.store(true, Ordering::Relaxed);
        }
        let keys = self.db.run(move |db| find_expired(db, now_ms, max)).await?;
        if keys.is_empty() {
            return Ok(0);
        }
        let legacy = self.legacy.load(Ordering::Relaxed);
        let delete =
            move |txn: &WriteTransaction| delete_expired(txn, &keys, now_ms, legacy).map(|n| (n, n > 0));
        self.db.submit_maybe(delete).wait().await
    }

    async fn fail_unfinished(
        &self,
        task_id: &TaskId,
        reason: &str,
        sent_before_ms: u64,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError> {
        let command = Command::FailUnfinished { reason: reason.to_owned(), sent_before_ms };
        Ok(self.transition(task_id, command, now_ms, ttl_secs).await?.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{TaskRequest, TaskResult};
    use crate::domain::{TaskStatus, TokenUsage};
    use serde_json::json;

    fn record(now: u64) -> TaskRecord {
        let req = TaskRequest::from_value(
            json!({"project_id":"p","kind":"explain","prompt":"x","target_files":["a.rs"]}),
        )
        .unwrap();
        TaskRecord::pending(req.task_id(None), req, now, 3600)
    }

    /// The `i`th of several distinct records, submitted at `now` and kept `ttl_secs`.
    fn numbered(i: usize, now: u64, ttl_secs: u64) -> TaskRecord {
        let req = TaskRequest::from_value(
            json!({"project_id":"p","kind":"explain","prompt":format!("x{i}"),"target_files":[]}),
        )
        .unwrap();
        TaskRecord::pending(req.task_id(None), req, now, ttl_secs)
    }

    fn mark(fence: u64, from_ms: u64, to_ms: u64) -> EnqueueMark {
        EnqueueMark { fence, from_ms, to_ms }
    }

    fn result() -> TaskResult {
        TaskResult {
            text_ref: None,
            text: "t".into(),
            model: "m".into(),
            tokens: TokenUsage { prompt: 1, completion: 2 },
            truncated: false,
            cost_usd: None,
            tier: Default::default(),
            tokens_saved: 0,
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
    async fn records_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let r = record(1_000);
        let id = r.task_id.clone();
        {
            let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap());
            store.put_pending(&r, 1_000).await.unwrap();
            assert!(
                !store.mark_enqueued(&id, mark(3, r.enqueued_at_ms, 70_000), 70_000, 3600).await.unwrap()
            );
            assert!(store.mark_enqueued(&id, mark(0, r.enqueued_at_ms, 70_000), 70_000, 3600).await.unwrap());
        }
        let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap());
        let back = store.get(&id, 70_000).await.unwrap().unwrap();
        assert_eq!(back.enqueued_at_ms, 70_000);
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

    /// The twin of DynamoDB's TTL sweep: expired records go, at most `max` a call, live ones stay.
    #[tokio::test]
    async fn the_sweep_deletes_expired_records_in_bounded_batches() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap());
        for i in 0..5 {
            // Three expire after an hour, two after a day.
            let ttl = if i < 3 { 3600 } else { 86_400 };
            store.put_pending(&numbered(i, 0, ttl), 0).await.unwrap();
        }
        let two_hours = 2 * 3600 * 1000;
        assert_eq!(store.sweep_expired(two_hours, 2).await.unwrap(), 2, "bounded");
        assert_eq!(store.sweep_expired(two_hours, 2).await.unwrap(), 1);
        assert_eq!(store.sweep_expired(two_hours, 2).await.unwrap(), 0);
        assert_eq!(store.all(0).await.unwrap().len(), 2, "the live ones stay");
    }

    /// The sweep finds expired records without holding the writer, so one may be written again
    /// between the finding and the deleting: it is kept.
    #[tokio::test]
    async fn a_record_written_again_after_the_sweep_found_it_stays() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap());
        let old = record(0);
        store.put_pending(&old, 0).await.unwrap();
        let two_hours = 2 * 3600 * 1000;
        let keys = store.db.run(move |db| find_expired(db, two_hours, 10)).await.unwrap();
        assert_eq!(keys, vec![(old.expires_at, old.created_at_ms, old.task_id.to_string())]);
        let again = TaskRecord::pending(old.task_id.clone(), old.request.clone(), two_hours, 3600);
        store.put_pending(&again, two_hours).await.unwrap();
        let deleted = store.db.write(move |txn| delete_expired(txn, &keys, two_hours, false)).await.unwrap();
        assert_eq!(deleted, 0);
        assert!(store.get(&old.task_id, two_hours).await.unwrap().is_some());
        // Its index entry moved with it: the record goes once its new expiry has passed.
        assert_eq!(store.sweep_expired(two_hours + 3_600_000, 10).await.unwrap(), 1);
    }

    /// A file written before the expiry index existed: its first sweep indexes its records, and
    /// the expired ones go.
    #[tokio::test]
    async fn records_of_a_file_without_the_expiry_index_are_swept_too() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::new(EmbeddedDb::open(dir.path()).unwrap());
        for i in 0..3 {
            store.put_pending(&numbered(i, 0, 3600), 0).await.unwrap();
        }
        store.db.write(|txn| txn.delete_table(EXPIRY).map(|_| ()).map_err(unavailable)).await.unwrap();
        let two_hours = 2 * 3600 * 1000;
        assert_eq!(store.sweep_expired(two_hours, 10).await.unwrap(), 3);
        assert!(store.all(0).await.unwrap().is_empty());
    }

    /// A replacement (a failed record submitted again) moves to its own place in the layout:
    /// one record and one locator for the id, never a stale copy beside it.
    #[tokio::test]
    async fn a_replacement_moves_to_its_own_place_and_leaves_nothing_behind() {
        let store = EmbeddedStore::new(EmbeddedDb::in_memory().unwrap());
        let first = record(1_000);
        let id = first.task_id.clone();
        store.put_pending(&first, 1_000).await.unwrap();
        let ClaimOutcome::Claimed(c) = store.claim(&id, 2_000, 3600).await.unwrap() else { panic!() };
        store.finish(&id, c.fence, Completion::Failed("bad".into()), 3_000, 3600).await.unwrap();
        store.put_pending(&record(9_000), 9_000).await.unwrap();
        let counted =
            store.db.run(|db| records::count(&db.begin_read().map_err(unavailable)?)).await.unwrap();
        assert_eq!(counted, (1, 1), "(records, locators)");
        let back = store.get(&id, 9_000).await.unwrap().unwrap();
        assert_eq!((back.created_at_ms, back.status, back.fence), (9_000, TaskStatus::Pending, 1));
    }

    /// A file written with records keyed by id and indexed by expiry and id: they are read where
    /// they are, one written moves, and the first sweep moves the rest, indexes them anew and drops
    /// the old tables; nothing is lost on the way.
    #[tokio::test]
    async fn a_file_of_the_legacy_layout_is_read_then_moved_by_the_first_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let old: Vec<TaskRecord> = (0..3).map(|i| numbered(i, 1_000 + i as u64, 3600)).collect();
        let rows = old.clone();
        db.write(move |txn| {
            let mut legacy =
                txn.open_table(TableDefinition::<&str, &[u8]>::new("tasks")).map_err(unavailable)?;
            let mut index = txn.open_table(OLD_EXPIRY).map_err(unavailable)?;
            for r in &rows {
                let bytes = serde_json::to_vec(r).map_err(unavailable)?;
                legacy.insert(r.task_id.as_str(), bytes.as_slice()).map_err(unavailable)?;
                index.insert((r.expires_at, r.task_id.as_str()), ()).map_err(unavailable)?;
            }
            index.insert((u64::MAX, "indexed"), ()).map_err(unavailable).map(|_| ())
        })
        .await
        .unwrap();
        let store = EmbeddedStore::new(db.clone());
        for r in &old {
            assert_eq!(store.get(&r.task_id, 5_000).await.unwrap().as_ref(), Some(r));
        }
        let ClaimOutcome::Claimed(claimed) = store.claim(&old[0].task_id, 5_000, 3600).await.unwrap() else {
            panic!("a legacy record is claimed where it is")
        };
        assert_eq!(store.get(&old[0].task_id, 5_000).await.unwrap(), Some(*claimed));
        assert_eq!(store.sweep_expired(5_000, 10).await.unwrap(), 0);
        assert!(!records::has_legacy(&db.db), "the old table is dropped");
        let old_index = store
            .db
            .run(|db| {
                Ok::<_, StoreError>(db.begin_read().map_err(unavailable)?.open_table(OLD_EXPIRY).is_ok())
            })
            .await
            .unwrap();
        assert!(!old_index, "so is the old index");
        assert_eq!(store.all(5_000).await.unwrap().len(), 3);
        for r in &old[1..] {
            assert_eq!(store.get(&r.task_id, 5_000).await.unwrap().as_ref(), Some(r));
        }
        let counted =
            store.db.run(|db| records::count(&db.begin_read().map_err(unavailable)?)).await.unwrap();
        assert_eq!(counted, (3, 3));
        // Moved records expire and are swept like any other.
        assert_eq!(store.sweep_expired(2 * 3600 * 1000, 10).await.unwrap(), 3);
        assert!(store.all(0).await.unwrap().is_empty());
    }
}
