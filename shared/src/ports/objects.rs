//! Results too large for a record: objects put once under a key and read back by it (S3 on AWS,
//! files under the data dir locally). Errors are [`StoreError`]s: unreachable is retryable, an
//! object that cannot be read back as written is corrupt.

use super::StoreError;
use async_trait::async_trait;

/// Where large results are kept.
#[async_trait]
pub trait ResultObjects: Send + Sync {
    /// Writes `bytes` under `key`, replacing what was there (a key names one run's result, so a
    /// replacement is that same run writing again).
    async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError>;
    /// The bytes under `key`; `None` when there are none (expired, or never written).
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
}
