//! Embedded batch records ([`crate::ports::BatchStore`]) in the redb file: one table of records
//! by key, one of markers (commit key -> batch key), each write one transaction, with the DynamoDB
//! adapter's semantics (a commit is batched while its marker and its record both exist).

use super::db::EmbeddedDb;
use super::unavailable;
use crate::domain::batch::{BatchPhase, BatchRecord, Carrier};
use crate::ports::{BatchStore, StoreError};
use async_trait::async_trait;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::HashMap;

/// Batch key -> record JSON.
const BATCHES: TableDefinition<&str, &[u8]> = TableDefinition::new("batches");
/// Commit key (`repo_id:sha`) -> the key of the batch carrying it.
const BATCHED: TableDefinition<&str, &str> = TableDefinition::new("batched_commits");

fn decode(bytes: &[u8]) -> Result<BatchRecord, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(format!("batch record: {e}")))
}

/// The embedded batch store.
#[derive(Debug, Clone)]
pub struct EmbeddedBatches {
    db: EmbeddedDb,
}

impl EmbeddedBatches {
    /// A store in `db`.
    pub fn new(db: EmbeddedDb) -> Self {
        Self { db }
    }
}

#[async_trait]
impl BatchStore for EmbeddedBatches {
    async fn create_batch(&self, record: &BatchRecord) -> Result<bool, StoreError> {
        let json = serde_json::to_vec(record).map_err(unavailable)?;
        let record = record.clone();
        self.db
            .submit_maybe(move |txn| {
                let mut t = txn.open_table(BATCHES).map_err(unavailable)?;
                if t.get(record.key.as_str()).map_err(unavailable)?.is_some() {
                    return Ok((false, false));
                }
                t.insert(record.key.as_str(), json.as_slice()).map_err(unavailable)?;
                let mut m = txn.open_table(BATCHED).map_err(unavailable)?;
                for key in record.markers() {
                    m.insert(key.as_str(), record.key.as_str()).map_err(unavailable)?;
                }
                Ok((true, true))
            })
            .wait()
            .await
    }

    async fn update_batch(&self, record: &BatchRecord, expect: BatchPhase) -> Result<bool, StoreError> {
        let json = serde_json::to_vec(record).map_err(unavailable)?;
        let key = record.key.clone();
        self.db
            .submit_maybe(move |txn| {
                let mut t = txn.open_table(BATCHES).map_err(unavailable)?;
                let now = match t.get(key.as_str()).map_err(unavailable)? {
                    Some(v) => decode(v.value())?.phase,
                    None => return Ok((false, false)),
                };
                if now != expect {
                    return Ok((false, false));
                }
                t.insert(key.as_str(), json.as_slice()).map_err(unavailable)?;
                Ok((true, true))
            })
            .wait()
            .await
    }

    async fn open_batches(&self, limit: usize) -> Result<Vec<BatchRecord>, StoreError> {
        self.db
            .run(move |db| {
                let txn = db.begin_read().map_err(unavailable)?;
                let t = match txn.open_table(BATCHES) {
                    Ok(t) => t,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(unavailable(e)),
                };
                let mut all = Vec::new();
                for entry in t.iter().map_err(unavailable)? {
                    let (_, v) = entry.map_err(unavailable)?;
                    all.push(decode(v.value())?);
                }
                all.sort_by_key(|r| (r.created_at_ms, r.key.clone()));
                all.truncate(limit);
                Ok(all)
            })
            .await
    }

    async fn batched(&self, keys: &[String]) -> Result<HashMap<String, Carrier>, StoreError> {
        let keys = keys.to_vec();
        self.db
            .run(move |db| {
                let txn = db.begin_read().map_err(unavailable)?;
                let (m, t) = match (txn.open_table(BATCHED), txn.open_table(BATCHES)) {
                    (Ok(m), Ok(t)) => (m, t),
                    (Err(redb::TableError::TableDoesNotExist(_)), _)
                    | (_, Err(redb::TableError::TableDoesNotExist(_))) => return Ok(HashMap::new()),
                    (Err(e), _) | (_, Err(e)) => return Err(unavailable(e)),
                };
                let mut out = HashMap::new();
                for k in keys {
                    let Some(batch) = m.get(k.as_str()).map_err(unavailable)? else { continue };
                    let batch = batch.value().to_owned();
                    if let Some(record) = t.get(batch.as_str()).map_err(unavailable)? {
                        let record = decode(record.value())?;
                        out.insert(
                            k,
                            Carrier { batch, phase: record.phase, created_at_ms: record.created_at_ms },
                        );
                    }
                }
                Ok(out)
            })
            .await
    }

    async fn close_batch(&self, record: &BatchRecord) -> Result<(), StoreError> {
        let record = record.clone();
        self.db
            .submit_maybe(move |txn| {
                let mut t = txn.open_table(BATCHES).map_err(unavailable)?;
                let existed = t.remove(record.key.as_str()).map_err(unavailable)?.is_some();
                let mut m = txn.open_table(BATCHED).map_err(unavailable)?;
                for key in record.markers() {
                    // Only this batch's markers: a later batch may carry the commit again.
                    let ours =
                        m.get(key.as_str()).map_err(unavailable)?.is_some_and(|b| b.value() == record.key);
                    if ours {
                        m.remove(key.as_str()).map_err(unavailable)?;
                    }
                }
                Ok(((), existed))
            })
            .wait()
            .await
    }
}
