//! DynamoDB adapter of the summary store, in the task table: a summary is
//! `pk = commit#<repo_id>#<sha>` with the JSON in `summary` and `repo_pk`/`repo_sk` for the
//! [`super::BY_REPO_INDEX`] index; a webhook delivery marker is `pk = delivery#<id>` with
//! `expires_at`.

use super::schema::{REPO_PK, REPO_SK};
use super::{Item, batch_get, conditional, get_s, n, query_index, s, unavailable};
use crate::domain::{RepoId, Sha};
use crate::ports::StoreError;
use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;

/// DynamoDB adapter of the summary store, in the same table as the tasks: a summary is
/// `pk = commit#<repo_id>#<sha>` with the JSON in `summary` and `repo_pk`/`repo_sk` for the
/// [`BY_REPO_INDEX`] index; a delivery marker is `pk = delivery#<id>` with `expires_at`.
#[derive(Debug, Clone)]
pub struct DynamoSummaries {
    client: Client,
    table: String,
}

fn summary_pk(repo_id: &RepoId, sha: &Sha) -> AttributeValue {
    s(format!("commit#{repo_id}#{sha}"))
}

fn summary_of(item: &Item) -> Result<crate::domain::commit::CommitSummary, StoreError> {
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
        keys: &[(RepoId, Sha)],
    ) -> Result<Vec<crate::domain::commit::CommitSummary>, StoreError> {
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
        summary: &crate::domain::commit::CommitSummary,
    ) -> Result<crate::ports::WriteOnce, StoreError> {
        let json = serde_json::to_string(summary).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let out = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", summary_pk(&summary.repo_id, &summary.sha))
            .item(REPO_PK, s(summary.repo_id.as_str()))
            .item(REPO_SK, s(summary.order_key()))
            .item("summary", s(json))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        Ok(if conditional(out)? { crate::ports::WriteOnce::Written } else { crate::ports::WriteOnce::Exists })
    }

    async fn list_summaries(
        &self,
        repo_id: &RepoId,
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
                if c.repo_pk != repo_id.as_str() {
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
        let mut items = query_index(&self.client, &self.table, repo_id.as_str(), want, false, start).await?;
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

    async fn count_pushed(
        &self,
        scope: &crate::domain::commit::PushScope,
        day: u64,
        commits: i64,
        limit: u64,
    ) -> Result<bool, StoreError> {
        // Kept until the end of the next day, then TTL deletes it.
        let expires = (day + 2) * 86_400;
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(format!("pushed#{scope}#{day}")))
            .update_expression("ADD pushed :n SET expires_at = :exp")
            .expression_attribute_values(":n", AttributeValue::N(commits.to_string()))
            .expression_attribute_values(":exp", n(expires));
        let update = if commits > 0 {
            let Some(room) = limit.checked_sub(commits as u64) else { return Ok(false) };
            update
                .condition_expression("attribute_not_exists(pushed) OR pushed <= :room")
                .expression_attribute_values(":room", n(room))
        } else {
            update
        };
        conditional(update.send().await)
    }

    async fn delivery_seen(&self, delivery: &str, now_ms: u64) -> Result<bool, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(format!("delivery#{delivery}")))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        // An expired marker that TTL has not deleted yet counts as absent, as in `mark_delivery`.
        let expires =
            out.item().and_then(|i| i.get("expires_at")).and_then(|v| v.as_n().ok()?.parse::<u64>().ok());
        Ok(expires.is_some_and(|e| e >= now_ms / 1000))
    }
}
