//! The redb file shared by the embedded queue and store, and the blocking-call bridge to it.

use redb::Database;
use std::path::Path;
use std::sync::Arc;

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
}

impl std::fmt::Debug for EmbeddedDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EmbeddedDb")
    }
}

impl EmbeddedDb {
    /// Opens or creates the database in `data_dir`. After a crash redb repairs the file on open.
    pub fn open(data_dir: &Path) -> Result<Self, DbOpenError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|source| DbOpenError::DataDir { path: data_dir.display().to_string(), source })?;
        let path = data_dir.join("lanes.redb");
        let db = Database::create(&path)
            .map_err(|source| DbOpenError::Open { path: path.display().to_string(), source })?;
        Ok(Self { db: Arc::new(db) })
    }

    /// Runs a blocking closure against the database off the async workers.
    pub(crate) async fn run<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static + From<String>,
        F: FnOnce(&Database) -> Result<T, E> + Send + 'static,
    {
        let db = self.db.clone();
        match tokio::task::spawn_blocking(move || f(&db)).await {
            Ok(r) => r,
            Err(e) => Err(E::from(format!("embedded db task failed: {e}"))),
        }
    }
}
