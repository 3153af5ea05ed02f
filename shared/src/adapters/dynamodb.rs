//! DynamoDB adapter of the task store: one table, partition key `pk` = `task#<id>`, TTL attribute
//! `expires_at`. Every write is one conditional request: the `PENDING` put returns the old item on
//! conflict (`ReturnValuesOnConditionCheckFailure`; replacing an expired or `FAILED` record takes a
//! second, conditional update that keeps the fence), the claim increments and returns the fence, and
//! the final write is conditional on it. Large requests and results are gzip-compressed; a result that
//! still does not fit an item ends the task `FAILED` with that reason, never truncated.

use crate::domain::{Lane, TaskRecord, TaskRequest, TaskResult, TaskStatus};
use crate::ports::{
    CancelOutcome, ClaimOutcome, Completion, FinishOutcome, PutOutcome, StoreError, TaskStore,
};
use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
    KeysAndAttributes, Projection, ProjectionType, ReturnValue, ReturnValuesOnConditionCheckFailure,
    ScalarAttributeType, TimeToLiveSpecification,
};
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

/// DynamoDB's item size limit is 400 KB; this leaves room for the key and the small attributes.
pub const MAX_ITEM_BYTES: usize = 390 * 1024;
/// Text attributes above this size are stored gzip-compressed.
const COMPRESS_ABOVE: usize = 32 * 1024;

type Item = HashMap<String, AttributeValue>;

fn unavailable<E: std::fmt::Debug + ProvideErrorMetadata>(e: &SdkError<E>) -> StoreError {
    match (e.code(), e.message()) {
        (Some(code), message) => StoreError::Unavailable(format!("{code}: {}", message.unwrap_or_default())),
        _ => StoreError::Unavailable(format!("{e:?}")),
    }
}

/// The outcome of a conditional write: `Ok(true)` written, `Ok(false)` the condition failed.
fn conditional<T, E: std::fmt::Debug + ProvideErrorMetadata>(
    out: Result<T, SdkError<E>>,
) -> Result<bool, StoreError> {
    match out {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(false),
        Err(e) => Err(unavailable(&e)),
    }
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).and_then(|_| enc.finish()).map_err(|e| StoreError::Corrupt(format!("gzip: {e}")))
}

fn gunzip(bytes: &[u8]) -> Result<String, StoreError> {
    let mut out = String::new();
    GzDecoder::new(bytes)
        .read_to_string(&mut out)
        .map_err(|e| StoreError::Corrupt(format!("gunzip: {e}")))?;
    Ok(out)
}

/// A JSON text attribute, compressed when large: `(name, value, size)` for either `<name>` or `<name>_z`.
fn text_attr(name: &str, json: &str) -> Result<(String, AttributeValue, usize), StoreError> {
    if json.len() <= COMPRESS_ABOVE {
        return Ok((name.to_owned(), s(json), json.len()));
    }
    let z = gzip(json.as_bytes())?;
    let len = z.len();
    Ok((format!("{name}_z"), AttributeValue::B(Blob::new(z)), len))
}

fn read_text(item: &Item, name: &str) -> Result<Option<String>, StoreError> {
    if let Some(AttributeValue::S(v)) = item.get(name) {
        return Ok(Some(v.clone()));
    }
    match item.get(&format!("{name}_z")) {
        Some(AttributeValue::B(b)) => gunzip(b.as_ref()).map(Some),
        _ => Ok(None),
    }
}

fn get_s<'a>(item: &'a Item, k: &str) -> Result<&'a str, StoreError> {
    match item.get(k) {
        Some(AttributeValue::S(v)) => Ok(v),
        _ => Err(StoreError::Corrupt(format!("attribute {k} missing or not a string"))),
    }
}

fn get_n(item: &Item, k: &str) -> Result<Option<u64>, StoreError> {
    match item.get(k) {
        Some(AttributeValue::N(v)) => {
            v.parse().map(Some).map_err(|_| StoreError::Corrupt(format!("attribute {k} not a number")))
        }
        None => Ok(None),
        Some(_) => Err(StoreError::Corrupt(format!("attribute {k} not a number"))),
    }
}

fn parse_status(v: &str) -> Result<TaskStatus, StoreError> {
    serde_json::from_value(serde_json::Value::String(v.to_owned()))
        .map_err(|_| StoreError::Corrupt(format!("status {v}")))
}

/// Decodes an item into a record.
fn record(item: &Item) -> Result<TaskRecord, StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    let pk = get_s(item, "pk")?;
    let task_id = pk.strip_prefix("task#").ok_or_else(|| StoreError::Corrupt(format!("pk {pk}")))?.to_owned();
    let request: TaskRequest = serde_json::from_str(
        &read_text(item, "request")?.ok_or_else(|| StoreError::Corrupt("no request".into()))?,
    )
    .map_err(corrupt)?;
    let result: Option<TaskResult> = match read_text(item, "result")? {
        Some(json) => Some(serde_json::from_str(&json).map_err(corrupt)?),
        None => None,
    };
    let lane: Lane = get_s(item, "lane")?.parse().map_err(StoreError::Corrupt)?;
    Ok(TaskRecord {
        task_id,
        payload_hash: get_s(item, "payload_hash")?.to_owned(),
        request,
        lane,
        status: parse_status(get_s(item, "status")?)?,
        fence: get_n(item, "fence")?.unwrap_or(0),
        attempts: get_n(item, "attempts")?.unwrap_or(0) as u32,
        nonce: get_s(item, "nonce")?.to_owned(),
        created_at_ms: get_n(item, "created_at_ms")?.unwrap_or(0),
        enqueued_at_ms: get_n(item, "enqueued_at_ms")?.unwrap_or(0),
        started_at_ms: get_n(item, "started_at_ms")?,
        finished_at_ms: get_n(item, "finished_at_ms")?,
        result,
        error: match item.get("error") {
            Some(AttributeValue::S(e)) => Some(e.clone()),
            _ => None,
        },
        expires_at: get_n(item, "expires_at")?.unwrap_or(u64::MAX / 2000),
    })
}

/// The DynamoDB task store.
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
}

fn key_element(name: &str, kind: KeyType) -> Result<KeySchemaElement, StoreError> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn key(task_id: &str) -> AttributeValue {
    s(format!("task#{task_id}"))
}

/// `BatchGetItem` over any number of keys: 100 a request, consistent reads, unprocessed keys retried
/// with full-jitter backoff (bounded).
async fn batch_get(client: &Client, table: &str, keys: Vec<Item>) -> Result<Vec<Item>, StoreError> {
    let mut out = Vec::new();
    for chunk in keys.chunks(100) {
        let mut request = Some(
            KeysAndAttributes::builder()
                .set_keys(Some(chunk.to_vec()))
                .consistent_read(true)
                .build()
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        );
        let mut attempt = 0u32;
        while let Some(keys) = request.take() {
            crate::metrics::aws_request("dynamodb", "BatchGetItem");
            let resp = client
                .batch_get_item()
                .request_items(table, keys)
                .send()
                .await
                .map_err(|e| unavailable(&e))?;
            out.extend(resp.responses().and_then(|r| r.get(table)).into_iter().flatten().cloned());
            request =
                resp.unprocessed_keys().and_then(|u| u.get(table)).filter(|k| !k.keys().is_empty()).cloned();
            if request.is_some() {
                attempt += 1;
                if attempt > 8 {
                    return Err(StoreError::Unavailable(
                        "BatchGetItem kept returning unprocessed keys".into(),
                    ));
                }
                let cap = 50u64 << attempt.min(6);
                tokio::time::sleep(Duration::from_millis(rand::random_range(0..=cap))).await;
            }
        }
    }
    Ok(out)
}

impl DynamoStore {
    /// A store on `table`.
    pub fn new(client: Client, table: &str) -> Self {
        Self { client, table: table.to_owned() }
    }

    /// Reads many records with `BatchGetItem` (100 keys a request), retrying unprocessed keys with
    /// backoff. Missing and expired ids are absent from the answer.
    pub async fn get_many(
        &self,
        ids: &[String],
        now_ms: u64,
    ) -> Result<HashMap<String, TaskRecord>, StoreError> {
        let keys = ids.iter().map(|id| HashMap::from([("pk".to_owned(), key(id))])).collect();
        let mut out = HashMap::new();
        for item in batch_get(&self.client, &self.table, keys).await? {
            let rec = record(&item)?;
            if !rec.is_expired(now_ms) {
                out.insert(rec.task_id.clone(), rec);
            }
        }
        Ok(out)
    }

    /// Creates the table (on-demand, TTL on `expires_at`) if it does not exist.
    pub async fn create_table(client: &Client, table: &str) -> Result<(), StoreError> {
        let created = client
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::PayPerRequest)
            .set_attribute_definitions(Some(
                ["pk", REPO_PK, REPO_SK]
                    .iter()
                    .map(|a| {
                        AttributeDefinition::builder()
                            .attribute_name(*a)
                            .attribute_type(ScalarAttributeType::S)
                            .build()
                            .map_err(|e| StoreError::Corrupt(e.to_string()))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ))
            .key_schema(key_element("pk", KeyType::Hash)?)
            .global_secondary_indexes(
                GlobalSecondaryIndex::builder()
                    .index_name(BY_REPO_INDEX)
                    .key_schema(key_element(REPO_PK, KeyType::Hash)?)
                    .key_schema(key_element(REPO_SK, KeyType::Range)?)
                    .projection(Projection::builder().projection_type(ProjectionType::All).build())
                    .build()
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            )
            .send()
            .await;
        match created {
            Ok(_) => {}
            Err(e) if e.code() == Some("ResourceInUseException") => return Ok(()),
            Err(e) => return Err(unavailable(&e)),
        }
        client
            .update_time_to_live()
            .table_name(table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name("expires_at")
                    .enabled(true)
                    .build()
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            )
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(())
    }

    async fn update(
        &self,
        task_id: &str,
        expression: String,
        condition: &str,
        values: Vec<(&str, AttributeValue)>,
        names: &[(&str, &str)],
    ) -> Result<Result<Item, Option<Item>>, StoreError> {
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", key(task_id))
            .update_expression(expression)
            .condition_expression(condition)
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        for (k, v) in values {
            req = req.expression_attribute_values(k, v);
        }
        for (k, v) in names {
            req = req.expression_attribute_names(*k, *v);
        }
        crate::metrics::aws_request("dynamodb", "UpdateItem");
        match req.send().await {
            Ok(out) => Ok(Ok(out.attributes().cloned().unwrap_or_default())),
            Err(e) => match e.as_service_error() {
                Some(aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c)) => {
                    Ok(Err(c.item().cloned()))
                }
                _ => Err(unavailable(&e)),
            },
        }
    }
}

const NAMES: [(&str, &str); 4] =
    [("#st", "status"), ("#res", "result"), ("#err", "error"), ("#req", "request")];

#[async_trait]
impl TaskStore for DynamoStore {
    async fn put_pending(&self, rec: &TaskRecord, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let request_json =
            serde_json::to_string(&rec.request).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let (req_name, req_value, _) = text_attr("request", &request_json)?;

        // The common paths cost one request: a new key is put whole; a live duplicate comes back as
        // the old item of the failed condition.
        let item: Item = HashMap::from([
            ("pk".to_owned(), key(&rec.task_id)),
            ("status".to_owned(), s("PENDING")),
            ("fence".to_owned(), n(0)),
            ("attempts".to_owned(), n(0)),
            ("nonce".to_owned(), s(&rec.nonce)),
            ("payload_hash".to_owned(), s(&rec.payload_hash)),
            ("lane".to_owned(), s(rec.lane.as_str())),
            ("created_at_ms".to_owned(), n(rec.created_at_ms)),
            ("enqueued_at_ms".to_owned(), n(rec.created_at_ms)),
            ("expires_at".to_owned(), n(rec.expires_at)),
            (req_name.clone(), req_value.clone()),
        ]);
        crate::metrics::aws_request("dynamodb", "PutItem");
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let old = match put {
            Ok(_) => return Ok(PutOutcome::Created),
            Err(e) => match e.as_service_error() {
                Some(
                    aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c),
                ) => c.item().cloned(),
                _ => return Err(unavailable(&e)),
            },
        };
        let old = match old.map(|o| record(&o)) {
            Some(Ok(old)) => Some(old),
            // Real DynamoDB returns the whole old item; an emulator racing with the writer may not.
            _ => self.get(&rec.task_id, 0).await?,
        };
        if let Some(old) = old.filter(|o| !o.is_expired(now_ms) && !o.status.is_resubmittable()) {
            return Ok(PutOutcome::Exists(Box::new(old)));
        }

        // Expired, FAILED or CANCELLED: replace it in place. UpdateItem rather than PutItem: the fence must carry
        // over, so a worker still holding a fence from the old run can never finish the new one.
        let (set_req, remove_req) =
            if req_name == "request" { ("#req", "request_z") } else { ("request_z", "#req") };
        let expression = format!(
            "SET #st = :pending, fence = if_not_exists(fence, :zero), attempts = :zero, nonce = :nonce, \
             payload_hash = :ph, lane = :lane, created_at_ms = :now, enqueued_at_ms = :now, expires_at = :exp, \
             {set_req} = :req REMOVE started_at_ms, finished_at_ms, #res, result_z, #err, {remove_req}"
        );
        let outcome = self
            .update(
                &rec.task_id,
                expression,
                "attribute_not_exists(pk) OR expires_at <= :now_s OR #st = :failed OR #st = :cancelled",
                vec![
                    (":pending", s("PENDING")),
                    (":failed", s("FAILED")),
                    (":cancelled", s("CANCELLED")),
                    (":zero", n(0)),
                    (":nonce", s(&rec.nonce)),
                    (":ph", s(&rec.payload_hash)),
                    (":lane", s(rec.lane.as_str())),
                    (":now", n(rec.created_at_ms)),
                    (":exp", n(rec.expires_at)),
                    (":now_s", n(now_ms / 1000)),
                    (":req", req_value),
                ],
                &NAMES,
            )
            .await?;
        match outcome {
            Ok(_) => Ok(PutOutcome::Created),
            // Someone else replaced it first: theirs is the live record.
            Err(_) => match self.get(&rec.task_id, now_ms).await? {
                Some(live) => Ok(PutOutcome::Exists(Box::new(live))),
                None => Err(StoreError::Unavailable("conditional replace lost a race; retry".into())),
            },
        }
    }

    async fn get(&self, task_id: &str, now_ms: u64) -> Result<Option<TaskRecord>, StoreError> {
        crate::metrics::aws_request("dynamodb", "GetItem");
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", key(task_id))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        match out.item() {
            None => Ok(None),
            Some(item) => {
                let rec = record(item)?;
                Ok((!rec.is_expired(now_ms)).then_some(rec))
            }
        }
    }

    async fn delete_pending(&self, task_id: &str, nonce: &str) -> Result<bool, StoreError> {
        crate::metrics::aws_request("dynamodb", "DeleteItem");
        let out = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key("pk", key(task_id))
            .condition_expression("#st = :pending AND nonce = :nonce")
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":pending", s("PENDING"))
            .expression_attribute_values(":nonce", s(nonce))
            .send()
            .await;
        conditional(out)
    }

    async fn mark_enqueued(
        &self,
        task_id: &str,
        fence: u64,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError> {
        // The new message's retention starts now: the record must live at least as long. (A pending
        // record's TTL is never longer than `now + ttl_secs`, so no max() is needed.)
        let out = self
            .update(
                task_id,
                "SET enqueued_at_ms = :now, expires_at = :exp".into(),
                "#st = :pending AND fence = :fence AND expires_at > :now_s",
                vec![
                    (":now", n(now_ms)),
                    (":exp", n(now_ms / 1000 + ttl_secs)),
                    (":pending", s("PENDING")),
                    (":fence", n(fence)),
                    (":now_s", n(now_ms / 1000)),
                ],
                &NAMES[..1],
            )
            .await?;
        Ok(out.is_ok())
    }

    async fn claim(&self, task_id: &str, now_ms: u64, ttl_secs: u64) -> Result<ClaimOutcome, StoreError> {
        let out = self
            .update(
                task_id,
                "SET #st = :processing, started_at_ms = :now, expires_at = :exp ADD fence :one".into(),
                "attribute_exists(pk) AND expires_at > :now_s AND (#st = :pending OR #st = :processing)",
                vec![
                    (":processing", s("PROCESSING")),
                    (":pending", s("PENDING")),
                    (":now", n(now_ms)),
                    (":exp", n(now_ms / 1000 + ttl_secs)),
                    (":one", n(1)),
                    (":now_s", n(now_ms / 1000)),
                ],
                &NAMES[..1],
            )
            .await?;
        match out {
            Ok(item) => Ok(ClaimOutcome::Claimed(Box::new(record(&item)?))),
            Err(Some(old)) => {
                let rec = record(&old)?;
                Ok(if rec.is_expired(now_ms) {
                    ClaimOutcome::Missing
                } else {
                    ClaimOutcome::Terminal(Box::new(rec))
                })
            }
            Err(None) => Ok(ClaimOutcome::Missing),
        }
    }

    async fn finish(
        &self,
        task_id: &str,
        fence: u64,
        completion: Completion,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<FinishOutcome, StoreError> {
        let mut values = vec![
            (":processing", s("PROCESSING")),
            (":fence", n(fence)),
            (":now", n(now_ms)),
            (":exp", n(now_ms / 1000 + ttl_secs)),
        ];
        let expression = match completion {
            Completion::Completed(result) => {
                let json = serde_json::to_string(&result).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                let (name, value, size) = text_attr("result", &json)?;
                if size > MAX_ITEM_BYTES / 2 {
                    values.push((":st", s("FAILED")));
                    values.push((
                        ":err",
                        s(format!(
                            "result too large to store: {} bytes, {size} bytes compressed",
                            json.len()
                        )),
                    ));
                    "SET #st = :st, #err = :err, finished_at_ms = :now, expires_at = :exp".to_owned()
                } else {
                    values.push((":st", s("COMPLETED")));
                    values.push((":res", value));
                    let target = if name == "result" { "#res" } else { "result_z" };
                    format!(
                        "SET #st = :st, {target} = :res, finished_at_ms = :now, expires_at = :exp REMOVE #err"
                    )
                }
            }
            Completion::Failed(reason) => {
                values.push((":st", s("FAILED")));
                values.push((":err", s(reason.chars().take(4096).collect::<String>())));
                "SET #st = :st, #err = :err, finished_at_ms = :now, expires_at = :exp".to_owned()
            }
        };
        let names: Vec<(&str, &str)> = NAMES
            .iter()
            .copied()
            .filter(|(k, _)| *k != "#req" && (expression.contains(k) || *k == "#st"))
            .collect();
        let out =
            self.update(task_id, expression, "#st = :processing AND fence = :fence", values, &names).await?;
        Ok(match out {
            Ok(item) => FinishOutcome::Written(Box::new(record(&item)?)),
            Err(_) => FinishOutcome::StaleFence,
        })
    }

    async fn note_attempt(&self, task_id: &str, fence: u64, reason: &str) -> Result<Option<u32>, StoreError> {
        let out = self
            .update(
                task_id,
                "SET #err = :err ADD attempts :one".into(),
                "#st = :processing AND fence = :fence",
                vec![
                    (":err", s(reason.chars().take(4096).collect::<String>())),
                    (":one", n(1)),
                    (":processing", s("PROCESSING")),
                    (":fence", n(fence)),
                ],
                &[NAMES[0], NAMES[2]],
            )
            .await?;
        match out {
            Ok(item) => Ok(Some(get_n(&item, "attempts")?.unwrap_or(1) as u32)),
            Err(_) => Ok(None),
        }
    }

    async fn cancel(&self, task_id: &str, now_ms: u64, ttl_secs: u64) -> Result<CancelOutcome, StoreError> {
        let out = self.settle(task_id, "CANCELLED", None, now_ms, ttl_secs).await?;
        Ok(match out {
            Ok(item) => CancelOutcome::Cancelled(Box::new(record(&item)?)),
            Err(Some(old)) => {
                let rec = record(&old)?;
                if rec.is_expired(now_ms) {
                    CancelOutcome::Missing
                } else {
                    CancelOutcome::Terminal(Box::new(rec))
                }
            }
            Err(None) => CancelOutcome::Missing,
        })
    }

    async fn fail_unfinished(
        &self,
        task_id: &str,
        reason: &str,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError> {
        Ok(self.settle(task_id, "FAILED", Some(reason), now_ms, ttl_secs).await?.is_ok())
    }
}

impl DynamoStore {
    /// `PENDING|PROCESSING -> status` (with `reason` as the error) whatever the fence, moving the fence
    /// on so no claim still running can finish it. One conditional update.
    async fn settle(
        &self,
        task_id: &str,
        status: &str,
        reason: Option<&str>,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<Result<Item, Option<Item>>, StoreError> {
        let mut values = vec![
            (":st", s(status)),
            (":pending", s("PENDING")),
            (":processing", s("PROCESSING")),
            (":now", n(now_ms)),
            (":now_s", n(now_ms / 1000)),
            (":exp", n(now_ms / 1000 + ttl_secs)),
            (":one", n(1)),
        ];
        let mut expression = "SET #st = :st, finished_at_ms = :now, expires_at = :exp".to_owned();
        if let Some(reason) = reason {
            values.push((":err", s(reason.chars().take(4096).collect::<String>())));
            expression.push_str(", #err = :err");
        }
        expression.push_str(" ADD fence :one");
        let names: Vec<(&str, &str)> =
            if reason.is_some() { vec![NAMES[0], NAMES[2]] } else { vec![NAMES[0]] };
        self.update(
            task_id,
            expression,
            "attribute_exists(pk) AND expires_at > :now_s AND (#st = :pending OR #st = :processing)",
            values,
            &names,
        )
        .await
    }
}

// ---------------------------------------------------------------- commit summaries

/// Index listing a repository's summaries newest first.
pub const BY_REPO_INDEX: &str = "by_repo";
const REPO_PK: &str = "repo_pk";
const REPO_SK: &str = "repo_sk";

/// DynamoDB adapter of the summary store, in the same table as the tasks: a summary is
/// `pk = commit#<repo_id>#<sha>` with the JSON in `summary` and `repo_pk`/`repo_sk` for the
/// [`BY_REPO_INDEX`] index; a delivery marker is `pk = delivery#<id>` with `expires_at`.
#[derive(Debug, Clone)]
pub struct DynamoSummaries {
    client: Client,
    table: String,
}

fn summary_pk(repo_id: &str, sha: &str) -> AttributeValue {
    s(format!("commit#{repo_id}#{sha}"))
}

fn summary_of(item: &Item) -> Result<crate::commits::CommitSummary, StoreError> {
    serde_json::from_str(get_s(item, "summary")?).map_err(|e| StoreError::Corrupt(format!("summary: {e}")))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Cursor {
    pk: String,
    repo_pk: String,
    repo_sk: String,
}

impl DynamoSummaries {
    /// A store on `table` (created by [`DynamoStore::create_table`], which adds the index).
    pub fn new(client: Client, table: &str) -> Self {
        Self { client, table: table.to_owned() }
    }
}

#[async_trait]
impl crate::ports::SummaryStore for DynamoSummaries {
    async fn get_summaries(
        &self,
        keys: &[(String, String)],
    ) -> Result<Vec<crate::commits::CommitSummary>, StoreError> {
        let mut seen = std::collections::HashSet::new();
        let items: Vec<Item> = keys
            .iter()
            .filter(|k| seen.insert((*k).clone()))
            .map(|(r, sha)| HashMap::from([("pk".to_owned(), summary_pk(r, sha))]))
            .collect();
        batch_get(&self.client, &self.table, items).await?.iter().map(summary_of).collect()
    }

    async fn put_summary(
        &self,
        summary: &crate::commits::CommitSummary,
    ) -> Result<crate::ports::WriteOnce, StoreError> {
        let json = serde_json::to_string(summary).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        crate::metrics::aws_request("dynamodb", "PutItem");
        let out = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", summary_pk(&summary.repo_id, &summary.sha))
            .item(REPO_PK, s(&summary.repo_id))
            .item(REPO_SK, s(summary.order_key()))
            .item("summary", s(json))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        Ok(if conditional(out)? { crate::ports::WriteOnce::Written } else { crate::ports::WriteOnce::Exists })
    }

    async fn list_summaries(
        &self,
        repo_id: &str,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<crate::ports::SummaryPage, StoreError> {
        use base64::Engine;
        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let start = match cursor {
            None => None,
            Some(c) => {
                let bytes = engine.decode(c).map_err(|_| StoreError::Corrupt("cursor".into()))?;
                let c: Cursor =
                    serde_json::from_slice(&bytes).map_err(|_| StoreError::Corrupt("cursor".into()))?;
                if c.repo_pk != repo_id {
                    return Err(StoreError::Corrupt("cursor of another repository".into()));
                }
                Some(HashMap::from([
                    ("pk".to_owned(), s(c.pk)),
                    (REPO_PK.to_owned(), s(c.repo_pk)),
                    (REPO_SK.to_owned(), s(c.repo_sk)),
                ]))
            }
        };
        // One more than asked, so a next cursor is only given when there is a next item.
        let want = limit + 1;
        let mut items: Vec<Item> = Vec::new();
        let mut exclusive = start;
        loop {
            crate::metrics::aws_request("dynamodb", "Query");
            let resp = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(BY_REPO_INDEX)
                .key_condition_expression("#r = :r")
                .expression_attribute_names("#r", REPO_PK)
                .expression_attribute_values(":r", s(repo_id))
                .scan_index_forward(false)
                .limit((want - items.len()) as i32)
                .set_exclusive_start_key(exclusive.take())
                .send()
                .await
                .map_err(|e| unavailable(&e))?;
            items.extend(resp.items().iter().cloned());
            match resp.last_evaluated_key() {
                Some(k) if items.len() < want && !k.is_empty() => exclusive = Some(k.clone()),
                _ => break,
            }
        }
        let more = items.len() > limit;
        items.truncate(limit);
        let next = match items.last() {
            Some(last) if more => {
                let c = Cursor {
                    pk: get_s(last, "pk")?.to_owned(),
                    repo_pk: get_s(last, REPO_PK)?.to_owned(),
                    repo_sk: get_s(last, REPO_SK)?.to_owned(),
                };
                Some(engine.encode(serde_json::to_vec(&c).map_err(|e| StoreError::Corrupt(e.to_string()))?))
            }
            _ => None,
        };
        let items = items.iter().map(summary_of).collect::<Result<Vec<_>, _>>()?;
        Ok(crate::ports::SummaryPage { items, next })
    }

    async fn mark_delivery(&self, delivery: &str, now_ms: u64, ttl_secs: u64) -> Result<bool, StoreError> {
        crate::metrics::aws_request("dynamodb", "PutItem");
        let now = now_ms / 1000;
        let out = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(format!("delivery#{delivery}")))
            .item("expires_at", n(now + ttl_secs))
            // DynamoDB's TTL deletes lazily: an expired marker still present counts as absent.
            .condition_expression("attribute_not_exists(pk) OR expires_at < :now")
            .expression_attribute_values(":now", n(now))
            .send()
            .await;
        conditional(out)
    }

    async fn unmark_delivery(&self, delivery: &str) -> Result<(), StoreError> {
        crate::metrics::aws_request("dynamodb", "DeleteItem");
        self.client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(format!("delivery#{delivery}")))
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(())
    }
}
