//! The twin of the S3 results bucket: one file per key under the data dir (the core's keys start
//! with `results/`, so the files are under `<data dir>/results`), written to a
//! temporary name and renamed, so a reader sees a whole object or none (as S3 never shows a half
//! written one). Keys are the core's own (`results/<task id>/<fence>`), checked to stay inside the
//! directory.

use crate::ports::{ResultObjects, StoreError};
use async_trait::async_trait;
use std::path::{Path, PathBuf};

/// Large results as files.
#[derive(Clone, Debug)]
pub struct FileObjects {
    dir: PathBuf,
}

impl FileObjects {
    /// Objects under `data_dir`, one file per key.
    pub fn new(data_dir: &Path) -> Self {
        Self { dir: data_dir.to_path_buf() }
    }

    /// The file of `key`: under `results/`, each `/`-separated part a plain name (no `..`, no empty
    /// part).
    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        let plain = |p: &&str| !p.is_empty() && *p != "." && *p != ".." && !p.contains('\\');
        // Under `results/` only: the data dir also holds the database.
        if key.starts_with("results/") && key.split('/').all(|p| plain(&p)) {
            Ok(key.split('/').fold(self.dir.clone(), |path, part| path.join(part)))
        } else {
            Err(StoreError::Corrupt(format!("object key {key:?} is not a plain path")))
        }
    }
}

#[async_trait]
impl ResultObjects for FileObjects {
    async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let unavailable =
            |e: std::io::Error| StoreError::Unavailable(format!("write {}: {e}", path.display()));
        if let Some(dir) = path.parent() {
            tokio::fs::create_dir_all(dir).await.map_err(unavailable)?;
        }
        let partial = path.with_extension(format!("partial-{}", uuid::Uuid::new_v4()));
        tokio::fs::write(&partial, bytes).await.map_err(unavailable)?;
        tokio::fs::rename(&partial, &path).await.map_err(unavailable)
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path(key)?;
        match tokio::fs::read(&path).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::Unavailable(format!("read {}: {e}", path.display()))),
        }
    }
}
