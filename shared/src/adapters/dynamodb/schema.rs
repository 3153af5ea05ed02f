//! The table: partition key `pk` (`task#<id>`, `commit#<repo_id>#<sha>`, `delivery#<id>`), TTL on
//! `expires_at`, on-demand billing, and the index [`BY_REPO_INDEX`] listing a repository's summaries
//! newest first. The template creates it in AWS; `lanes dev --create` and the tests through here.

use super::{key_element, unavailable};
use crate::ports::StoreError;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeyType, Projection, ProjectionType,
    ScalarAttributeType, TimeToLiveSpecification,
};

/// Index listing a repository's summaries newest first.
pub const BY_REPO_INDEX: &str = "by_repo";
/// The index's partition key: the `repo_id`.
pub(super) const REPO_PK: &str = "repo_pk";
/// The index's sort key: zero-padded commit time, then the sha.
pub(super) const REPO_SK: &str = "repo_sk";

/// Creates the table (on-demand, TTL on `expires_at`, the index) if it does not exist.
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
