//! DynamoDB adapter of the batch records, in the task table: a record is `pk = batch#<key>` with
//! the JSON in `record`, its `phase` for conditional replaces, and `repo_pk = batches` /
//! `repo_sk = <created>#<key>` so the [`super::BY_REPO_INDEX`] index lists the unclosed ones
//! oldest first (no repository id is `batches`: those are `provider:id`). A commit's marker is
//! `pk = batched#<repo_id:sha>` naming its batch. Both expire two days past the batch's deadline.

use super::schema::{REPO_PK, REPO_SK};
use super::{Item, batch_get, conditional, get_s, n, query_index, s, unavailable};
use crate::domain::batch::{BatchPhase, BatchRecord, Carrier};
use crate::ports::{BatchStore, StoreError};
use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
use futures::stream::{self, StreamExt, TryStreamExt};
use std::collections::{HashMap, HashSet};

/// The index partition of the batch records.
const PARTITION: &str = "batches";

/// DynamoDB adapter of [`BatchStore`].
#[derive(Debug, Clone)]
pub struct DynamoBatches {
    client: Client,
    table: String,
}

impl DynamoBatches {
    /// A store on `table` (the task table, with its index).
    pub fn new(client: Client, table: &str) -> Self {
        Self { client, table: table.to_owned() }
    }

    /// Puts or deletes items 25 at a time (`BatchWriteItem`), asking again for what DynamoDB left
    /// unprocessed.
    async fn write_all(&self, requests: Vec<WriteRequest>) -> Result<(), StoreError> {
        for chunk in requests.chunks(25) {
            let mut left = chunk.to_vec();
            for attempt in 0..8u32 {
                if left.is_empty() {
                    break;
                }
                let out = self
                    .client
                    .batch_write_item()
                    .request_items(&self.table, left.clone())
                    .send()
                    .await
                    .map_err(|e| unavailable(&e))?;
                left = out.unprocessed_items().and_then(|u| u.get(&self.table)).cloned().unwrap_or_default();
                if !left.is_empty() {
                    tokio::time::sleep(std::time::Duration::from_millis(20 << attempt)).await;
                }
            }
            if !left.is_empty() {
                return Err(StoreError::Unavailable("batch write left items unprocessed".into()));
            }
        }
        Ok(())
    }

    fn record_item(record: &BatchRecord) -> Result<Item, StoreError> {
        let json = serde_json::to_string(record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(HashMap::from([
            ("pk".to_owned(), s(format!("batch#{}", record.key))),
            (REPO_PK.to_owned(), s(PARTITION)),
            (REPO_SK.to_owned(), s(format!("{:020}#{}", record.created_at_ms, record.key))),
            ("phase".to_owned(), s(phase(record.phase))),
            ("record".to_owned(), s(json)),
            ("expires_at".to_owned(), n(expires(record))),
        ]))
    }
}

fn phase(p: BatchPhase) -> &'static str {
    match p {
        BatchPhase::Submitting => "submitting",
        BatchPhase::Open => "open",
        BatchPhase::Cancelling => "cancelling",
    }
}

fn expires(record: &BatchRecord) -> u64 {
    record.deadline_ms / 1000 + 2 * 86_400
}

fn record_of(item: &Item) -> Result<BatchRecord, StoreError> {
    serde_json::from_str(get_s(item, "record")?)
        .map_err(|e| StoreError::Corrupt(format!("batch record: {e}")))
}

/// The key, phase and creation of a record, from its attributes (its JSON is not decoded).
fn carrier_of(item: &Item) -> Result<Carrier, StoreError> {
    let batch = get_s(item, "pk")?.trim_start_matches("batch#").to_owned();
    let phase = match get_s(item, "phase")? {
        "submitting" => BatchPhase::Submitting,
        "open" => BatchPhase::Open,
        "cancelling" => BatchPhase::Cancelling,
        other => return Err(StoreError::Corrupt(format!("batch phase {other:?}"))),
    };
    let created_at_ms = get_s(item, REPO_SK)?
        .split_once('#')
        .and_then(|(ms, _)| ms.parse().ok())
        .ok_or_else(|| StoreError::Corrupt("batch record without its creation".into()))?;
    Ok(Carrier { batch, phase, created_at_ms })
}

fn marker_pk(commit_key: &str) -> String {
    format!("batched#{commit_key}")
}

#[async_trait]
impl BatchStore for DynamoBatches {
    async fn create_batch(&self, record: &BatchRecord) -> Result<bool, StoreError> {
        // Markers first: a marker without its record counts for nothing, a record without its
        // markers would let a duplicate delivery be batched again.
        let markers = record
            .markers()
            .into_iter()
            .map(|key| {
                let item = HashMap::from([
                    ("pk".to_owned(), s(marker_pk(&key))),
                    ("batch".to_owned(), s(record.key.clone())),
                    ("expires_at".to_owned(), n(expires(record))),
                ]);
                PutRequest::builder()
                    .set_item(Some(item))
                    .build()
                    .map(|p| WriteRequest::builder().put_request(p).build())
                    .map_err(|e| StoreError::Corrupt(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.write_all(markers).await?;
        let out = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(Self::record_item(record)?))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        conditional(out)
    }

    async fn update_batch(&self, record: &BatchRecord, expect: BatchPhase) -> Result<bool, StoreError> {
        let out = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(Self::record_item(record)?))
            .condition_expression("phase = :expect")
            .expression_attribute_values(":expect", s(phase(expect)))
            .send()
            .await;
        conditional(out)
    }

    async fn open_batches(&self, limit: usize) -> Result<Vec<BatchRecord>, StoreError> {
        let mut items = query_index(&self.client, &self.table, PARTITION, limit, true, None).await?;
        items.truncate(limit);
        items.iter().map(record_of).collect()
    }

    async fn batched(&self, keys: &[String]) -> Result<HashMap<String, Carrier>, StoreError> {
        let unique: HashSet<&String> = keys.iter().collect();
        let wanted = unique.iter().map(|k| HashMap::from([("pk".to_owned(), s(marker_pk(k)))])).collect();
        let markers = batch_get(&self.client, &self.table, wanted).await?;
        let mut by_batch: HashMap<String, Vec<String>> = HashMap::new();
        for m in &markers {
            let commit = get_s(m, "pk")?.trim_start_matches("batched#").to_owned();
            by_batch.entry(get_s(m, "batch")?.to_owned()).or_default().push(commit);
        }
        let records =
            by_batch.keys().map(|b| HashMap::from([("pk".to_owned(), s(format!("batch#{b}")))])).collect();
        let mut out = HashMap::new();
        for r in batch_get(&self.client, &self.table, records).await? {
            let carrier = carrier_of(&r)?;
            for commit in by_batch.remove(&carrier.batch).unwrap_or_default() {
                out.insert(commit, carrier.clone());
            }
        }
        Ok(out)
    }

    async fn close_batch(&self, record: &BatchRecord) -> Result<(), StoreError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(format!("batch#{}", record.key)))
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        // Each marker only while it names this batch (a commit sent on and batched again names
        // the later one): one conditional delete each, as `BatchWriteItem` takes no condition. A
        // marker left by a failure here names a closed batch, which counts for nothing; TTL
        // deletes it.
        let keys: Vec<String> = record.markers().iter().map(|key| marker_pk(key)).collect();
        stream::iter(keys)
            .map(|pk| async move {
                let out = self
                    .client
                    .delete_item()
                    .table_name(&self.table)
                    .key("pk", s(pk))
                    .condition_expression("#b = :key")
                    .expression_attribute_names("#b", "batch")
                    .expression_attribute_values(":key", s(record.key.clone()))
                    .send()
                    .await;
                conditional(out).map(|_| ())
            })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }
}
