//! The redb file shared by the embedded queue and store: reads on the blocking pool, and every write
//! through one writer thread that commits them in groups.
//!
//! # Group commit
//!
//! redb has one write transaction at a time and each commit is made durable (fsync) before it
//! returns. One commit per queue or store operation therefore serializes every operation of the
//! process behind a disk flush. Instead, writes are jobs on a channel to the writer thread, which
//! takes every job waiting, runs them in arrival order inside one transaction and commits once; each
//! caller gets its answer only after that commit, so an acknowledged write is exactly as durable as
//! before. While one group is being flushed the next one gathers, so the group grows with the load
//! and a lone write waits for nothing.
//!
//! A job sees the writes of the jobs before it (the order is that of the channel). A job answers a
//! refused condition with an `Ok` value; an `Err` means the transaction can no longer be trusted, so
//! the whole group is abandoned and every job in it gets an error (all of them retryable).

use redb::{Database, WriteTransaction};
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use tokio::sync::oneshot;

/// Jobs taken into one transaction at most: bounds the latency a very long queue of writes adds.
const MAX_GROUP: usize = 512;

/// The answer of a write that never ran: its group failed before it, or the writer is gone.
const NOT_MADE: &str = "embedded db: the write was not made (its group failed or the writer stopped)";

/// What a job hands back after running in the group's transaction: whether it succeeded, and the
/// completion that answers its caller with the group's outcome.
type Done = Box<dyn FnOnce(Result<(), String>) + Send>;
type Job = Box<dyn FnOnce(&WriteTransaction) -> Ran + Send>;

/// How a job ran: whether it succeeded and whether it wrote anything, and its completion.
struct Ran {
    ok: bool,
    wrote: bool,
    done: Done,
}

/// Errors opening the embedded database.
#[derive(Debug, thiserror::Error)]
pub enum DbOpenError {
    /// The data dir could not be created.
    #[error("cannot create data dir {path}: {source}")]
    DataDir {
        /// The directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// redb refused the file (locked by another process, corrupt, unreadable).
    #[error("cannot open {path}: {source}")]
    Open {
        /// The file.
        path: String,
        /// Why.
        source: redb::DatabaseError,
    },
}

/// A handle to the embedded database file (`<data dir>/lanes.redb`).
#[derive(Clone)]
pub struct EmbeddedDb {
    pub(crate) db: Arc<Database>,
    writer: Arc<Writer>,
}

/// The writer thread and its channel. Dropped with the last handle: the channel closes, the thread
/// finishes what it holds and is joined, so the file is closed when the last handle is gone (a
/// reopen in the same process then succeeds).
struct Writer {
    /// `None` in the inline mode ([`EmbeddedDb::in_memory`]): jobs run in their caller.
    jobs: Option<mpsc::Sender<Job>>,
    inline: bool,
    thread: Option<std::thread::JoinHandle<()>>,
    commits: Arc<std::sync::atomic::AtomicU64>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

/// A write submitted to the writer thread; [`Pending::wait`] answers after its group commits.
pub(crate) struct Pending<T, E> {
    rx: oneshot::Receiver<Result<T, E>>,
}

impl<T, E: From<String>> Pending<T, E> {
    /// The job's answer once its group is durable, or why it is not.
    pub(crate) async fn wait(self) -> Result<T, E> {
        // A job dropped unrun (its group failed first, or the writer is gone) drops its sender.
        self.rx.await.unwrap_or_else(|_| Err(E::from(NOT_MADE.to_owned())))
    }
}

impl std::fmt::Debug for EmbeddedDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EmbeddedDb")
    }
}

/// redb's page cache. Its default, 1 GiB, fills as the file is touched, so a long-running
/// `lanes dev` grew to that much resident memory with a working set far smaller: the live records
/// (their TTL's worth) and the queue's backlog.
const CACHE_BYTES: usize = 64 * 1024 * 1024;

impl EmbeddedDb {
    /// Opens or creates the database in `data_dir`. After a crash redb repairs the file on open.
    pub fn open(data_dir: &Path) -> Result<Self, DbOpenError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|source| DbOpenError::DataDir { path: data_dir.display().to_string(), source })?;
        let path = data_dir.join("lanes.redb");
        let db = Arc::new(
            Database::builder()
                .set_cache_size(CACHE_BYTES)
                .create(&path)
                .map_err(|source| DbOpenError::Open { path: path.display().to_string(), source })?,
        );
        let (jobs, rx) = mpsc::channel();
        let (thread_db, commits) = (db.clone(), Arc::new(std::sync::atomic::AtomicU64::new(0)));
        let counted = commits.clone();
        let thread = std::thread::Builder::new()
            .name("lanes-db-writer".into())
            .spawn(move || write_groups(&thread_db, &rx, &counted))
            .map_err(|source| DbOpenError::DataDir { path: data_dir.display().to_string(), source })?;
        Ok(Self {
            db,
            writer: Arc::new(Writer { jobs: Some(jobs), inline: false, thread: Some(thread), commits }),
        })
    }

    /// A database in memory whose every read and write runs in its caller, at the call, one
    /// transaction each: no writer thread and no blocking pool, so nothing happens outside the
    /// runtime that polls the caller. The lifecycle simulation runs on it: with tokio's paused clock
    /// and one thread, its seed then decides every interleaving. Nothing survives the process.
    pub fn in_memory() -> Result<Self, DbOpenError> {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|source| DbOpenError::Open { path: "(memory)".into(), source })?;
        let writer = Writer {
            jobs: None,
            inline: true,
            thread: None,
            commits: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        };
        Ok(Self { db: Arc::new(db), writer: Arc::new(writer) })
    }

    /// Transactions committed so far by this handle's writer (each one a flush to disk).
    pub fn commits(&self) -> u64 {
        self.writer.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Queues `f` for the writer thread, in call order; await [`Pending::wait`] for its answer. The
    /// queueing itself never blocks, so it can be done under a lock whose order must match the
    /// order of the writes.
    pub(crate) fn submit<T, E, F>(&self, f: F) -> Pending<T, E>
    where
        T: Send + 'static,
        E: Send + 'static + From<String>,
        F: FnOnce(&WriteTransaction) -> Result<T, E> + Send + 'static,
    {
        self.submit_maybe(move |txn| f(txn).map(|v| (v, true)))
    }

    /// [`Self::submit`] for a job that may decide to write nothing (a refused condition): it answers
    /// `(answer, wrote)`. A group in which no job wrote is abandoned rather than committed, so a
    /// refusal costs no flush.
    pub(crate) fn submit_maybe<T, E, F>(&self, f: F) -> Pending<T, E>
    where
        T: Send + 'static,
        E: Send + 'static + From<String>,
        F: FnOnce(&WriteTransaction) -> Result<(T, bool), E> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |txn| {
            let out = f(txn);
            let (ok, wrote) = match &out {
                Ok((_, wrote)) => (true, *wrote),
                Err(_) => (false, false),
            };
            let done: Done = Box::new(move |group: Result<(), String>| {
                let answer = match (group, out) {
                    (Ok(()), out) | (Err(_), out @ Err(_)) => out.map(|(v, _)| v),
                    (Err(e), Ok(_)) => Err(E::from(e)),
                };
                let _ = tx.send(answer);
            });
            Ran { ok, wrote, done }
        });
        if self.writer.inline {
            write_groups_of(&self.db, vec![job], &self.writer.commits);
        } else if let Some(jobs) = &self.writer.jobs {
            let _ = jobs.send(job); // refused only when the writer is gone: the job, and its sender, drop
        }
        Pending { rx }
    }

    /// An answer that needs no write (nothing to persist), in the shape of a submitted one.
    pub(crate) fn answered<T, E>(value: Result<T, E>) -> Pending<T, E> {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(value);
        Pending { rx }
    }

    /// [`Self::submit`] and wait: `f`'s answer once it is committed.
    #[cfg(test)]
    pub(crate) async fn write<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static + From<String>,
        F: FnOnce(&WriteTransaction) -> Result<T, E> + Send + 'static,
    {
        self.submit(f).wait().await
    }

    /// Runs a blocking read against the database off the async workers.
    pub(crate) async fn run<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static + From<String>,
        F: FnOnce(&Database) -> Result<T, E> + Send + 'static,
    {
        let db = self.db.clone();
        if self.writer.inline {
            return f(&db);
        }
        match tokio::task::spawn_blocking(move || f(&db)).await {
            Ok(r) => r,
            Err(e) => Err(E::from(format!("embedded db task failed: {e}"))),
        }
    }
}

/// The writer thread: one transaction per group of waiting jobs, until every handle is gone.
fn write_groups(db: &Database, rx: &mpsc::Receiver<Job>, commits: &std::sync::atomic::AtomicU64) {
    while let Ok(first) = rx.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        write_groups_of(db, group, commits);
    }
}

/// Runs one group of jobs in one transaction and answers each (see the module's Group commit).
fn write_groups_of(db: &Database, group: Vec<Job>, commits: &std::sync::atomic::AtomicU64) {
    {
        let began = std::time::Instant::now();
        let txn = match db.begin_write() {
            Ok(t) => t,
            Err(e) => {
                // Dropping the jobs unanswered tells their callers the write was not made.
                tracing::error!(error = %e, "embedded db: cannot begin a write transaction");
                drop(group);
                return;
            }
        };
        let mut done = Vec::with_capacity(group.len());
        let mut jobs = group.into_iter();
        let (mut failed, mut wrote) = (false, false);
        for job in jobs.by_ref() {
            // A job that panics fails its group like one that errs; the writer carries on, since
            // every later write of the process depends on it. Its caller hears "not made".
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&txn))) {
                Ok(ran) => {
                    wrote |= ran.wrote;
                    done.push(ran.done);
                    if !ran.ok {
                        failed = true;
                        break;
                    }
                }
                Err(_) => {
                    tracing::error!("embedded db: a write job panicked; its group is abandoned");
                    failed = true;
                    break;
                }
            }
        }
        let outcome = if failed {
            let _ = txn.abort();
            Err("embedded db: a write in the same group failed; nothing was written".to_owned())
        } else if !wrote {
            // Only refusals: nothing to make durable.
            txn.abort().map_err(|e| format!("embedded db: abort failed: {e}"))
        } else {
            let committed = txn.commit().map_err(|e| format!("embedded db: commit failed: {e}"));
            if committed.is_ok() {
                commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                crate::metrics::group_commit::observe(done.len(), began.elapsed().as_secs_f64());
            }
            committed
        };
        drop(jobs); // the ones after a failure, unrun: their callers hear the write was not made
        for d in done {
            d(outcome.clone());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, TableDefinition};

    const T: TableDefinition<&str, u64> = TableDefinition::new("t");

    fn insert(key: String, value: u64) -> impl FnOnce(&WriteTransaction) -> Result<(), String> + Send {
        move |txn| {
            txn.open_table(T)
                .map_err(|e| e.to_string())?
                .insert(key.as_str(), value)
                .map_err(|e| e.to_string())?;
            Ok(())
        }
    }

    async fn read(db: &EmbeddedDb, key: &'static str) -> Option<u64> {
        db.run(move |db| {
            let txn = db.begin_read().map_err(|e| e.to_string())?;
            let Ok(t) = txn.open_table(T) else { return Ok::<_, String>(None) };
            Ok(t.get(key).map_err(|e| e.to_string())?.map(|v| v.value()))
        })
        .await
        .unwrap()
    }

    /// Holds the writer inside a job until the returned sender is dropped, so that everything
    /// submitted meanwhile waits in the channel: the next group is then exactly those writes.
    fn hold_writer(db: &EmbeddedDb) -> (std::sync::mpsc::Sender<()>, Pending<(), String>) {
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let held = db.submit(move |_txn| {
            let _ = entered_tx.send(());
            let _ = gate.recv();
            Ok::<_, String>(())
        });
        entered.recv().unwrap();
        (open, held)
    }

    /// Also: each group commit is counted on the process-wide series `/metrics` shows, with the
    /// writes it carried and its time. Other tests commit in parallel, so those counts grow by at
    /// least as much; without the counting they would not grow at all.
    #[tokio::test]
    async fn writes_waiting_together_share_one_commit_and_each_is_answered_after_it() {
        use crate::metrics::group_commit::{GROUP_COMMIT_SECONDS, GROUP_COMMIT_WRITES, GROUP_COMMITS};
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let before =
            (GROUP_COMMITS.get(), GROUP_COMMIT_WRITES.get(), GROUP_COMMIT_SECONDS.get_sample_count());
        let (open, held) = hold_writer(&db);
        let pending: Vec<_> = (0..200u64).map(|i| db.submit(insert(format!("k{i}"), i))).collect();
        drop(open);
        held.wait().await.unwrap();
        for p in pending {
            p.wait().await.unwrap();
        }
        // The held job's own commit, then one for the 200 that waited behind it.
        assert_eq!(db.commits(), 2);
        assert!(GROUP_COMMITS.get() >= before.0 + 2 && GROUP_COMMIT_WRITES.get() >= before.1 + 200);
        assert!(GROUP_COMMIT_SECONDS.get_sample_count() >= before.2 + 2);
        let text = crate::metrics::Metrics::new().render();
        assert!(text.contains("lanes_embedded_group_commit_writes_total"), "{text}");
        assert_eq!(read(&db, "k199").await, Some(199));
        // Durable on return: a fresh handle on the file sees them.
        drop(db);
        let db = EmbeddedDb::open(dir.path()).unwrap();
        assert_eq!(read(&db, "k0").await, Some(0));
    }

    #[tokio::test]
    async fn refusals_flush_nothing_and_a_panicking_write_does_not_stop_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let refused: Result<u8, String> = db.submit_maybe(|_txn| Ok((7, false))).wait().await;
        assert_eq!((refused, db.commits()), (Ok(7), 0));
        let panicked: Result<(), String> = db.submit(|_txn| panic!("a bug in a job")).wait().await;
        assert!(panicked.unwrap_err().contains("not made"));
        db.write(insert("after".into(), 1)).await.unwrap();
        assert_eq!((read(&db, "after").await, db.commits()), (Some(1), 1));
    }

    #[tokio::test]
    async fn a_failed_write_abandons_its_group_and_the_next_group_is_unaffected() {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let (open, held) = hold_writer(&db);
        let before = db.submit(insert("before".into(), 1));
        let failing = db.submit(|_txn: &WriteTransaction| Err::<(), String>("disk on fire".into()));
        let after = db.submit(insert("after".into(), 3));
        drop(open);
        held.wait().await.unwrap();
        assert!(before.wait().await.unwrap_err().contains("group failed"));
        assert_eq!(failing.wait().await.unwrap_err(), "disk on fire");
        assert!(after.wait().await.unwrap_err().contains("not made"));
        assert_eq!((read(&db, "before").await, read(&db, "after").await), (None, None));
        db.write(insert("later".into(), 4)).await.unwrap();
        assert_eq!(read(&db, "later").await, Some(4));
    }
}
