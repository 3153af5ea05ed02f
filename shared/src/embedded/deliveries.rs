//! The webhook's bookkeeping in the embedded file: delivery marks (a delivery's key until it expires,
//! so a replay is dropped) and push counts (commits per repository and UTC day, the daily budget),
//! with the sweep that deletes what has expired, as DynamoDB's TTL does for the AWS tables.
//!
//! # Layout
//!
//! Marks are kept by id, and indexed by `(expiry, id)` in the same transaction, so the sweep reads
//! only what has expired instead of every live mark. Both of the sweep's reads run in a read
//! transaction, beside the writer thread: only its deletes take a place in a group commit, so a
//! sweep never holds the writes of the tasks behind a scan. Until a sentinel entry says the index
//! covers every mark, the first sweep indexes them all, once: a file written before the index has
//! marks it does not cover (a new file pays the same one-off scan of its few marks). A file taken
//! back to a build without the index and forward again is not covered: marks written meanwhile
//! are never swept.
//!
//! Push counts are keyed `<scope>#<day>` ([`crate::domain::commit::PushScope`]: the repository id
//! and its owner's tag, neither with a `#`); the sweep keeps today's and yesterday's (the budget's
//! window, and a clock that lags), so the table holds about two days of repositories and is read
//! whole.

use super::db::EmbeddedDb;
use super::unavailable;
use crate::ports::StoreError;
use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

/// Delivery key ([`crate::idempotency::delivery_key`]) -> expiry (Unix ms).
const DELIVERIES: TableDefinition<&str, u64> = TableDefinition::new("deliveries");
/// Every mark by `(expiry, key)`.
const EXPIRY: TableDefinition<(u64, &str), ()> = TableDefinition::new("delivery_expiry");
/// The key in [`EXPIRY`] saying its entries cover every mark: absent in a file written before the
/// index, whose marks the first sweep then indexes. It sorts after every real expiry.
const INDEXED: (u64, &str) = (u64::MAX, "indexed");
/// Commits pushed per repository and owner and UTC day: [`pushed_key`] -> count.
const PUSHED: TableDefinition<&str, u64> = TableDefinition::new("pushed_per_day");

/// The key of `scope`'s count on `day`.
pub(super) fn pushed_key(scope: &crate::domain::commit::PushScope, day: u64) -> String {
    format!("{scope}#{day}")
}

/// Adds `commits` to the count at `key` if it stays within `limit` (a negative number, a refund,
/// always applies): whether it did. The read and the write in one write transaction, atomic as
/// DynamoDB's conditional update.
pub(super) fn count_pushed(
    txn: &WriteTransaction,
    key: &str,
    commits: i64,
    limit: u64,
) -> Result<bool, StoreError> {
    let mut t = txn.open_table(PUSHED).map_err(unavailable)?;
    let now = t.get(key).map_err(unavailable)?.map_or(0, |v| v.value());
    let next = crate::domain::quota::apply(now, commits);
    let fits = commits <= 0 || next <= limit;
    if fits {
        t.insert(key, next).map_err(unavailable)?;
    }
    Ok(fits)
}

/// Marks `id` until `now_ms + ttl_secs`, unless a live mark has it already (a replay): whether it
/// marked. An expired mark the sweep has not reached yet is replaced, its index entry with it.
pub(super) fn mark(txn: &WriteTransaction, id: &str, now_ms: u64, ttl_secs: u64) -> Result<bool, StoreError> {
    let mut marks = txn.open_table(DELIVERIES).map_err(unavailable)?;
    let was = marks.get(id).map_err(unavailable)?.map(|v| v.value());
    if was.is_some_and(|at| at > now_ms) {
        return Ok(false);
    }
    let at = now_ms.saturating_add(ttl_secs.saturating_mul(1000));
    marks.insert(id, at).map_err(unavailable)?;
    let mut index = txn.open_table(EXPIRY).map_err(unavailable)?;
    if let Some(old) = was {
        index.remove((old, id)).map_err(unavailable)?;
    }
    index.insert((at, id), ()).map_err(unavailable)?;
    Ok(true)
}

/// Whether `id` has a live mark at `now_ms`.
pub(super) fn seen(db: &redb::Database, id: &str, now_ms: u64) -> Result<bool, StoreError> {
    let txn = db.begin_read().map_err(unavailable)?;
    let marks = match txn.open_table(DELIVERIES) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(false),
        Err(e) => return Err(unavailable(e)),
    };
    Ok(marks.get(id).map_err(unavailable)?.is_some_and(|v| v.value() > now_ms))
}

/// What one round of the sweep deletes, found in a read transaction.
#[derive(Debug, Default)]
pub(super) struct Expired {
    marks: Vec<(u64, String)>,
    days: Vec<String>,
}

impl Expired {
    fn is_empty(&self) -> bool {
        self.marks.is_empty() && self.days.is_empty()
    }
}

/// Whether the mark index covers every mark (it does in a file without marks).
pub(super) fn indexed(db: &redb::Database) -> Result<bool, StoreError> {
    let txn = db.begin_read().map_err(unavailable)?;
    match txn.open_table(DELIVERIES) {
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(true),
        Err(e) => return Err(unavailable(e)),
        Ok(_) => {}
    }
    match txn.open_table(EXPIRY) {
        Ok(index) => Ok(index.get(INDEXED).map_err(unavailable)?.is_some()),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
        Err(e) => Err(unavailable(e)),
    }
}

/// Indexes every mark, once per file (see the module's Layout). Whether it wrote.
pub(super) fn index_unindexed(txn: &WriteTransaction) -> Result<bool, StoreError> {
    let mut index = txn.open_table(EXPIRY).map_err(unavailable)?;
    if index.get(INDEXED).map_err(unavailable)?.is_some() {
        return Ok(false);
    }
    let marks = txn.open_table(DELIVERIES).map_err(unavailable)?;
    for entry in marks.iter().map_err(unavailable)? {
        let (id, at) = entry.map_err(unavailable)?;
        index.insert((at.value(), id.value()), ()).map_err(unavailable)?;
    }
    index.insert(INDEXED, ()).map_err(unavailable)?;
    Ok(true)
}

/// At most `max` marks expired at `now_ms` (oldest first), then, within the same `max`, the push
/// counts of days before yesterday.
pub(super) fn find_expired(db: &redb::Database, now_ms: u64, max: usize) -> Result<Expired, StoreError> {
    let txn = db.begin_read().map_err(unavailable)?;
    let mut out = Expired::default();
    match txn.open_table(EXPIRY) {
        Ok(index) => {
            for entry in index.range((0, "")..(now_ms.saturating_add(1), "")).map_err(unavailable)?.take(max)
            {
                let (k, _) = entry.map_err(unavailable)?;
                let (at, id) = k.value();
                out.marks.push((at, id.to_owned()));
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(unavailable(e)),
    }
    let today = now_ms / 86_400_000;
    match txn.open_table(PUSHED) {
        Ok(pushed) => {
            for entry in pushed.iter().map_err(unavailable)? {
                if out.marks.len() + out.days.len() >= max {
                    break;
                }
                let (k, _) = entry.map_err(unavailable)?;
                let day = k.value().rsplit('#').next().and_then(|d| d.parse::<u64>().ok());
                if day.is_some_and(|d| d + 1 < today) {
                    out.days.push(k.value().to_owned());
                }
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(unavailable(e)),
    }
    Ok(out)
}

/// Deletes what `found` holds, each mark only if it is still the one found (a delivery marked
/// again since has a new expiry and a new index entry): how many it deleted, and whether it wrote
/// at all (an index entry whose mark is gone is removed too, and that removal must be committed,
/// or the next round finds it again).
pub(super) fn delete_expired(txn: &WriteTransaction, found: &Expired) -> Result<(usize, bool), StoreError> {
    let (mut gone, mut wrote) = (0, false);
    if !found.marks.is_empty() {
        let mut index = txn.open_table(EXPIRY).map_err(unavailable)?;
        let mut marks = txn.open_table(DELIVERIES).map_err(unavailable)?;
        for (at, id) in &found.marks {
            if index.remove((*at, id.as_str())).map_err(unavailable)?.is_none() {
                continue;
            }
            wrote = true;
            let current = marks.get(id.as_str()).map_err(unavailable)?.map(|v| v.value());
            if current == Some(*at) {
                marks.remove(id.as_str()).map_err(unavailable)?;
                gone += 1;
            }
        }
    }
    if !found.days.is_empty() {
        let mut pushed = txn.open_table(PUSHED).map_err(unavailable)?;
        for key in &found.days {
            gone += usize::from(pushed.remove(key.as_str()).map_err(unavailable)?.is_some());
        }
    }
    Ok((gone, wrote || gone > 0))
}

/// One round of the sweep on `db`: indexes an older file's marks first (once), then reads what has
/// expired and deletes it in one write: how many it deleted.
pub(super) async fn sweep(db: &EmbeddedDb, now_ms: u64, max: usize) -> Result<usize, StoreError> {
    if !db.run(indexed).await? {
        db.submit_maybe(|txn| index_unindexed(txn).map(|wrote| ((), wrote))).wait().await?;
    }
    let found = db.run(move |db| find_expired(db, now_ms, max)).await?;
    if found.is_empty() {
        return Ok(0);
    }
    db.submit_maybe(move |txn| delete_expired(txn, &found)).wait().await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400_000;

    async fn marked(db: &EmbeddedDb, id: &'static str, now_ms: u64, ttl_secs: u64) -> bool {
        db.write(move |txn| mark(txn, id, now_ms, ttl_secs)).await.unwrap()
    }

    async fn live(db: &EmbeddedDb, id: &'static str, now_ms: u64) -> bool {
        db.run(move |db| seen(db, id, now_ms)).await.unwrap()
    }

    /// The sweep deletes expired marks oldest first, at most `max` a round, and only those: a live
    /// mark, and an expired one marked again since, stay.
    #[tokio::test]
    async fn the_sweep_deletes_expired_marks_in_bounded_rounds_and_keeps_a_mark_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        for id in ["a", "b", "c", "d", "e"] {
            assert!(marked(&db, id, DAY, 60).await);
        }
        assert!(marked(&db, "live", DAY, 7 * 86_400).await);
        let later = DAY + 3_600_000;
        // "a" expired, then came again: marked anew, it is live, not a replay.
        assert!(marked(&db, "a", later, 60).await);
        assert!(!marked(&db, "a", later, 60).await, "a replay marks nothing");
        let counts = [sweep(&db, later, 2).await.unwrap(), sweep(&db, later, 2).await.unwrap()];
        assert_eq!(counts, [2, 2], "b, c, d, e: two a round");
        assert_eq!(sweep(&db, later, 2).await.unwrap(), 0);
        assert!(live(&db, "a", later).await && live(&db, "live", later).await);
        assert!(!live(&db, "b", later).await);
        // The renewed mark goes once its own expiry passes; its first entry went with the renewal.
        assert_eq!(sweep(&db, later + 61_000, 10).await.unwrap(), 1);
        assert!(!live(&db, "a", later + 61_000).await);
    }

    /// An index entry whose mark is gone (a mark deleted by a build without the index) is removed,
    /// and its removal committed though nothing else was deleted: the next round does not find it.
    #[tokio::test]
    async fn an_index_entry_without_its_mark_is_removed_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        assert!(marked(&db, "kept", DAY, 7 * 86_400).await);
        db.write(|txn| {
            let mut index = txn.open_table(EXPIRY).map_err(unavailable)?;
            index.insert(INDEXED, ()).map_err(unavailable)?;
            index.insert((DAY, "ghost"), ()).map(|_| ()).map_err(unavailable)
        })
        .await
        .unwrap();
        assert_eq!(sweep(&db, 2 * DAY, 10).await.unwrap(), 0, "nothing of a mark's to delete");
        let left = db.run(|db| find_expired(db, 2 * DAY, 10)).await.unwrap();
        assert!(left.is_empty(), "the ghost entry stays gone: {left:?}");
        assert!(live(&db, "kept", 2 * DAY).await);
    }

    /// A file whose marks were written before the index: the first sweep indexes them (once),
    /// deletes the expired ones and keeps the live ones.
    #[tokio::test]
    async fn a_files_unindexed_marks_are_indexed_once_and_swept() {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        db.write(|txn| {
            let mut marks = txn.open_table(DELIVERIES).map_err(unavailable)?;
            for (id, at) in [("old-1", DAY), ("old-2", DAY + 1), ("young", 9 * DAY)] {
                marks.insert(id, at).map_err(unavailable)?;
            }
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
        assert!(!db.run(indexed).await.unwrap());
        assert_eq!(sweep(&db, 2 * DAY, 100).await.unwrap(), 2);
        assert!(db.run(indexed).await.unwrap());
        assert!(live(&db, "young", 2 * DAY).await && !live(&db, "old-1", 2 * DAY).await);
        let commits = db.commits();
        assert_eq!(sweep(&db, 2 * DAY, 100).await.unwrap(), 0);
        assert_eq!(db.commits(), commits, "indexed once: a sweep with nothing to do writes nothing");
        assert_eq!(sweep(&db, 10 * DAY, 100).await.unwrap(), 1, "the indexed mark expires in turn");
    }
}
