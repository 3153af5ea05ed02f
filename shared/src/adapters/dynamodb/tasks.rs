//! DynamoDB adapter of the task store: partition key `pk` = `task#<id>`, TTL attribute `expires_at`.
//! Every write is one conditional request whose condition and transition are rendered from the
//! transition table (`transitions.rs`): the `PENDING` put returns the old item on conflict
//! (`ReturnValuesOnConditionCheckFailure`; replacing an expired, `FAILED` or `CANCELLED` record takes a
//! second, conditional update that keeps the fence), the claim increments and returns the fence, and
//! the final write is conditional on it. Large requests and results are gzip-compressed; a result that
//! still does not fit an item ends the task `FAILED` with that reason, never truncated.

use super::transitions::Write;
use super::{Item, MAX_ITEM_BYTES, batch_get, get_n, get_s, n, read_text, s, text_attr, unavailable};
use crate::domain::Lane;
use crate::domain::lifecycle::{Command, Event, stored_reason, transition};
use crate::domain::{TaskId, TaskRecord, TaskRequest, TaskResult, TaskStatus};
use crate::ports::{
    CancelOutcome, ClaimOutcome, Completion, EnqueueMark, FinishOutcome, PutOutcome, StoreError, TaskStore,
};
use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use std::collections::HashMap;

fn parse_status(v: &str) -> Result<TaskStatus, StoreError> {
    serde_json::from_value(serde_json::Value::String(v.to_owned()))
        .map_err(|_| StoreError::Corrupt(format!("status {v}")))
}

/// Decodes an item into a record.
fn record(item: &Item) -> Result<TaskRecord, StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    let pk = get_s(item, "pk")?;
    let task_id = pk
        .strip_prefix("task#")
        .and_then(|id| TaskId::parse(id).ok())
        .ok_or_else(|| StoreError::Corrupt(format!("pk {pk}")))?;
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
        parked: match item.get("parked") {
            Some(AttributeValue::S(p)) => Some(serde_json::from_str(p).map_err(corrupt)?),
            _ => None,
        },
        partial: match read_text(item, "partial")? {
            Some(json) => Some(serde_json::from_str(&json).map_err(corrupt)?),
            None => None,
        },
    })
}

/// The DynamoDB task store.
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
}

fn key(task_id: &TaskId) -> AttributeValue {
    s(format!("task#{task_id}"))
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
        ids: &[TaskId],
        now_ms: u64,
    ) -> Result<HashMap<TaskId, TaskRecord>, StoreError> {
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

    /// Creates the table (see [`super::schema`]) if it does not exist.
    pub async fn create_table(client: &Client, table: &str) -> Result<(), StoreError> {
        super::schema::create_table(client, table).await
    }

    /// Sends one conditional `UpdateItem`: the new item, or the old one (if any) when the
    /// condition failed.
    async fn write(&self, task_id: &TaskId, write: Write) -> Result<Result<Item, Option<Item>>, StoreError> {
        let (expression, condition, values, names) = write.bindings();
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
            req = req.expression_attribute_names(k, v);
        }
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

/// The update that replaces an expired, `FAILED` or `CANCELLED` record with the submitted one in
/// place: the submission's row of the table, plus every field of the new run (its request in
/// `req_name`, `request` or the compressed `request_z`), the fence left as it was.
fn replacement(rec: &TaskRecord, req_name: &str, req_value: AttributeValue, now_ms: u64) -> Write {
    let (set_req, remove_req) =
        if req_name == "request" { ("#req", "request_z") } else { ("request_z", "#req") };
    let mut write = Write::of(&Command::Submit(Box::new(rec.clone())), now_ms, 0);
    write.set.extend(
        [
            "fence = if_not_exists(fence, :zero)",
            "attempts = :zero",
            "nonce = :nonce",
            "payload_hash = :ph",
            "lane = :lane",
            "created_at_ms = :created",
            "enqueued_at_ms = :created",
            &format!("{set_req} = :req"),
        ]
        .map(str::to_owned),
    );
    write.remove.extend(
        ["started_at_ms", "finished_at_ms", "#res", "result_z", "#err", "parked", remove_req]
            .map(str::to_owned),
    );
    write.value(":zero", n(0));
    write.value(":nonce", s(&rec.nonce));
    write.value(":ph", s(&rec.payload_hash));
    write.value(":lane", s(rec.lane.as_str()));
    write.value(":created", n(rec.created_at_ms));
    write.value(":req", req_value);
    write
}

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
        let live = old.filter(|o| !o.is_expired(now_ms));
        if let Some(live) = live.filter(|l| !transition(Event::Submit).admits(Some(l))) {
            return Ok(PutOutcome::Exists(Box::new(live)));
        }

        // Expired, FAILED or CANCELLED: replace it in place. UpdateItem rather than PutItem: the fence must carry
        // over, so a worker still holding a fence from the old run can never finish the new one.
        let write = replacement(rec, &req_name, req_value, now_ms);
        let outcome = self.write(&rec.task_id, write).await?;
        match outcome {
            Ok(_) => Ok(PutOutcome::Created),
            // Someone else replaced it first: theirs is the live record.
            Err(_) => match self.get(&rec.task_id, now_ms).await? {
                Some(live) => Ok(PutOutcome::Exists(Box::new(live))),
                None => Err(StoreError::Unavailable("conditional replace lost a race; retry".into())),
            },
        }
    }

    async fn get(&self, task_id: &TaskId, now_ms: u64) -> Result<Option<TaskRecord>, StoreError> {
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

    async fn mark_enqueued(
        &self,
        task_id: &TaskId,
        mark: EnqueueMark,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError> {
        let write = Write::of(&Command::MarkEnqueued(mark), now_ms, ttl_secs);
        Ok(self.write(task_id, write).await?.is_ok())
    }

    async fn claim(&self, task_id: &TaskId, now_ms: u64, ttl_secs: u64) -> Result<ClaimOutcome, StoreError> {
        let out = self.write(task_id, Write::of(&Command::Claim, now_ms, ttl_secs)).await?;
        match out {
            Ok(item) => Ok(ClaimOutcome::Claimed(Box::new(record(&item)?))),
            Err(Some(old)) => {
                let rec = record(&old)?;
                Ok(if rec.is_expired(now_ms) { ClaimOutcome::Missing } else { ClaimOutcome::refused(rec) })
            }
            Err(None) => Ok(ClaimOutcome::Missing),
        }
    }

    async fn finish(
        &self,
        task_id: &TaskId,
        fence: u64,
        completion: Completion,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<FinishOutcome, StoreError> {
        // A result too large for an item ends the task FAILED with that reason, never truncated.
        let (completion, stored) = match completion {
            Completion::Completed(result) => {
                let json = serde_json::to_string(&result).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                let (name, value, size) = text_attr("result", &json)?;
                if size > MAX_ITEM_BYTES / 2 {
                    let reason = crate::domain::failure::FailureCode::ResultTooLarge
                        .reason(format_args!("{} bytes, {size} bytes compressed", json.len()));
                    (Completion::Failed(reason), None)
                } else {
                    (Completion::Completed(result), Some((name, value)))
                }
            }
            failed => (failed, None),
        };
        let command = Command::Finish { fence, completion };
        let mut write = Write::of(&command, now_ms, ttl_secs);
        match (command, stored) {
            (_, Some((name, value))) => {
                let target = if name == "result" { "#res" } else { "result_z" };
                write.set.push(format!("{target} = :res"));
                write.value(":res", value);
                write.remove.push("#err".into());
            }
            (Command::Finish { completion: Completion::Failed(reason), .. }, None) => {
                write.set.push("#err = :err".into());
                write.value(":err", s(stored_reason(&reason)));
            }
            _ => {}
        }
        Ok(match self.write(task_id, write).await? {
            Ok(item) => FinishOutcome::Written(Box::new(record(&item)?)),
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
        let mut write = Write::of(&Command::NoteAttempt { fence, reason: reason.to_owned() }, now_ms, 0);
        write.set.push("#err = :err".into());
        write.add.push("attempts :one".into());
        write.value(":err", s(stored_reason(reason)));
        match self.write(task_id, write).await? {
            Ok(item) => Ok(Some(get_n(&item, "attempts")?.unwrap_or(1) as u32)),
            Err(_) => Ok(None),
        }
    }

    async fn cancel(
        &self,
        task_id: &TaskId,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<CancelOutcome, StoreError> {
        let out = self.write(task_id, Write::of(&Command::Cancel, now_ms, ttl_secs)).await?;
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

    async fn park(
        &self,
        task_id: &TaskId,
        fence: u64,
        parked: crate::domain::Parked,
        now_ms: u64,
        ttl_secs: u64,
    ) -> Result<bool, StoreError> {
        let json = serde_json::to_string(&parked).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let mut write = Write::of(&Command::Park { fence, parked }, now_ms, ttl_secs);
        write.set.push("parked = :parked".into());
        write.value(":parked", s(json));
        Ok(self.write(task_id, write).await?.is_ok())
    }

    async fn unpark(&self, task_id: &TaskId, fence: u64, now_ms: u64) -> Result<bool, StoreError> {
        let mut write = Write::of(&Command::Unpark { fence }, now_ms, 0);
        write.remove.push("parked".into());
        Ok(self.write(task_id, write).await?.is_ok())
    }

    async fn checkpoint(
        &self,
        task_id: &TaskId,
        fence: u64,
        text: &str,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let partial = crate::domain::Partial { text: text.to_owned(), run: fence };
        let json = serde_json::to_string(&partial).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let (name, value, _) = text_attr("partial", &json)?;
        let mut write = Write::of(&Command::Checkpoint { fence, text: text.to_owned() }, now_ms, 0);
        // One of the two names holds it: the other goes (a checkpoint may outgrow compression's line).
        // `partial` is a reserved word: it goes by its alias.
        let (set, other) = if name == "partial" { ("#par", "partial_z") } else { ("partial_z", "#par") };
        write.set.push(format!("{set} = :partial"));
        write.remove.push(other.to_owned());
        write.value(":partial", value);
        Ok(self.write(task_id, write).await?.is_ok())
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
        let mut write = Write::of(&command, now_ms, ttl_secs);
        write.set.push("#err = :err".into());
        write.value(":err", s(stored_reason(reason)));
        Ok(self.write(task_id, write).await?.is_ok())
    }
}
