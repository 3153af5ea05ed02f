//! DynamoDB adapters, in one table: the task store ([`tasks`]), the summary store and webhook
//! delivery markers ([`summaries`]), the provider-batch records ([`batches`]), and the table they
//! share ([`schema`]). This module holds what they share: attribute helpers, gzip of large text
//! attributes, conditional-write outcomes and `BatchGetItem`. Every write of a record is one
//! conditional request (a batch's commit markers, which guard nothing alone, are written in bulk).

pub mod batches;
pub mod schema;
pub mod summaries;
pub mod tasks;
mod transitions;

pub use batches::DynamoBatches;
pub use schema::BY_REPO_INDEX;
pub use summaries::DynamoSummaries;
pub use tasks::DynamoStore;

use crate::ports::StoreError;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, KeySchemaElement, KeyType, KeysAndAttributes};
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

/// DynamoDB's item size limit is 400 KB; this leaves room for the key and the small attributes.
pub const MAX_ITEM_BYTES: usize = 390 * 1024;
/// Text attributes above this size are stored gzip-compressed.
pub(super) const COMPRESS_ABOVE: usize = 32 * 1024;

pub(super) type Item = HashMap<String, AttributeValue>;

pub(super) fn unavailable<E: std::fmt::Debug + ProvideErrorMetadata>(e: &SdkError<E>) -> StoreError {
    match (e.code(), e.message()) {
        (Some(code), message) => StoreError::Unavailable(format!("{code}: {}", message.unwrap_or_default())),
        _ => StoreError::Unavailable(format!("{e:?}")),
    }
}

/// The outcome of a conditional write: `Ok(true)` written, `Ok(false)` the condition failed.
pub(super) fn conditional<T, E: std::fmt::Debug + ProvideErrorMetadata>(
    out: Result<T, SdkError<E>>,
) -> Result<bool, StoreError> {
    match out {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(false),
        Err(e) => Err(unavailable(&e)),
    }
}

pub(super) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(super) fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(super) fn gzip(bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).and_then(|_| enc.finish()).map_err(|e| StoreError::Corrupt(format!("gzip: {e}")))
}

/// Most bytes a compressed attribute may expand to: far past any text the code stores (a result
/// over 300 KB goes to the results store), and a bound on what a crafted item can make a reader hold.
const MAX_GUNZIP_BYTES: u64 = 16 * 1024 * 1024;

pub(super) fn gunzip(bytes: &[u8]) -> Result<String, StoreError> {
    let mut out = String::new();
    GzDecoder::new(bytes)
        .take(MAX_GUNZIP_BYTES + 1)
        .read_to_string(&mut out)
        .map_err(|e| StoreError::Corrupt(format!("gunzip: {e}")))?;
    if out.len() as u64 > MAX_GUNZIP_BYTES {
        return Err(StoreError::Corrupt(format!("gunzip: expands past {MAX_GUNZIP_BYTES} bytes")));
    }
    Ok(out)
}

/// A JSON text attribute, compressed when large: `(name, value, size)` for either `<name>` or `<name>_z`.
pub(super) fn text_attr(name: &str, json: &str) -> Result<(String, AttributeValue, usize), StoreError> {
    if json.len() <= COMPRESS_ABOVE {
        return Ok((name.to_owned(), s(json), json.len()));
    }
    let z = gzip(json.as_bytes())?;
    let len = z.len();
    Ok((format!("{name}_z"), AttributeValue::B(Blob::new(z)), len))
}

pub(super) fn read_text(item: &Item, name: &str) -> Result<Option<String>, StoreError> {
    if let Some(AttributeValue::S(v)) = item.get(name) {
        return Ok(Some(v.clone()));
    }
    match item.get(&format!("{name}_z")) {
        Some(AttributeValue::B(b)) => gunzip(b.as_ref()).map(Some),
        _ => Ok(None),
    }
}

pub(super) fn get_s<'a>(item: &'a Item, k: &str) -> Result<&'a str, StoreError> {
    match item.get(k) {
        Some(AttributeValue::S(v)) => Ok(v),
        _ => Err(StoreError::Corrupt(format!("attribute {k} missing or not a string"))),
    }
}

pub(super) fn get_n(item: &Item, k: &str) -> Result<Option<u64>, StoreError> {
    match item.get(k) {
        Some(AttributeValue::N(v)) => {
            v.parse().map(Some).map_err(|_| StoreError::Corrupt(format!("attribute {k} not a number")))
        }
        None => Ok(None),
        Some(_) => Err(StoreError::Corrupt(format!("attribute {k} not a number"))),
    }
}

pub(super) fn key_element(name: &str, kind: KeyType) -> Result<KeySchemaElement, StoreError> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// `BatchGetItem` over any number of keys: 100 a request, consistent reads, unprocessed keys retried
/// with full-jitter backoff (bounded).
pub(super) async fn batch_get(
    client: &Client,
    table: &str,
    keys: Vec<Item>,
) -> Result<Vec<Item>, StoreError> {
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
                tokio::time::sleep(Duration::from_millis(crate::jitter::range(0..=cap))).await;
            }
        }
    }
    Ok(out)
}

/// Up to `want` items of the [`BY_REPO_INDEX`] partition `partition`, in sort-key order
/// (`forward`) or the reverse, from after `start`; DynamoDB's pages are followed until `want` are
/// in hand or the partition ends.
pub(super) async fn query_index(
    client: &Client,
    table: &str,
    partition: &str,
    want: usize,
    forward: bool,
    start: Option<Item>,
) -> Result<Vec<Item>, StoreError> {
    let mut items: Vec<Item> = Vec::new();
    let mut exclusive = start;
    loop {
        let resp = client
            .query()
            .table_name(table)
            .index_name(BY_REPO_INDEX)
            .key_condition_expression("#r = :r")
            .expression_attribute_names("#r", schema::REPO_PK)
            .expression_attribute_values(":r", s(partition))
            .scan_index_forward(forward)
            .limit((want - items.len()).max(1) as i32)
            .set_exclusive_start_key(exclusive.take())
            .send()
            .await
            .map_err(|e| unavailable(&e))?;
        items.extend(resp.items().iter().cloned());
        match resp.last_evaluated_key() {
            Some(k) if items.len() < want && !k.is_empty() => exclusive = Some(k.clone()),
            _ => return Ok(items),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compressed_attribute_may_not_expand_past_its_bound() {
        let small = gzip(b"hello").unwrap_or_default();
        assert_eq!(gunzip(&small).ok().as_deref(), Some("hello"));
        let bomb = gzip(&vec![b'0'; MAX_GUNZIP_BYTES as usize + 1]).unwrap_or_default();
        assert!(bomb.len() < 64 * 1024, "a bomb is small: {}", bomb.len());
        assert!(matches!(gunzip(&bomb), Err(StoreError::Corrupt(_))));
    }
}
