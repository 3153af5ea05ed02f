//! Results too large for a record (a DynamoDB item holds 400 KB): the text goes to the results
//! store ([`ResultObjects`]: S3, or files locally) before the fenced final write, under a key
//! derived from the task id and the run's fence, and the record keeps the key. Every read that
//! answers a client puts the text back, so a view is the same whichever store holds it.
//!
//! Why the order holds: the object is written first, so a record that names a key always finds
//! its object. A run whose fenced write then loses leaves an object no record names; the bucket's
//! lifecycle rule (the record TTL) removes it. A retry of the same run writes the same key again.

use crate::domain::{TaskId, TaskRecord, TaskResult};
use crate::ports::{ResultObjects, StoreError};

/// Text longer than this goes to the results store (the rest of the record, request included,
/// stays well within an item).
pub const LARGE_RESULT_BYTES: usize = 300 * 1024;

/// The key of the result of `task_id`'s run under `fence`.
pub fn key(task_id: &TaskId, fence: u64) -> String {
    format!("results/{task_id}/{fence}")
}

/// `result` as the record keeps it: whole when its text is small, else with the text put under
/// [`key`] first and the key in its place. Without a results store a large result stays whole
/// (and a store that cannot hold it fails the task `result_too_large`).
pub async fn offload(
    objects: Option<&dyn ResultObjects>,
    task_id: &TaskId,
    fence: u64,
    result: TaskResult,
) -> Result<TaskResult, StoreError> {
    let Some(objects) = objects.filter(|_| result.text.len() > LARGE_RESULT_BYTES) else {
        return Ok(result);
    };
    let key = key(task_id, fence);
    objects.put(&key, result.text.into_bytes()).await?;
    Ok(TaskResult { text: String::new(), text_ref: Some(key), ..result })
}

/// `record` with its result's text read back, when the record keeps only its key. An object that
/// is gone, or a deployment with no results store, is an error, never an empty answer.
pub async fn resolve(
    objects: Option<&dyn ResultObjects>,
    mut record: TaskRecord,
) -> Result<TaskRecord, StoreError> {
    let Some(result) = record.result.as_mut().filter(|r| r.text_ref.is_some()) else {
        return Ok(record);
    };
    let key = result.text_ref.take().unwrap_or_default();
    let objects =
        objects.ok_or_else(|| StoreError::Unavailable(format!("{key}: no results store configured")))?;
    let bytes = objects
        .get(&key)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("result object {key} is missing")))?;
    result.text = String::from_utf8(bytes)
        .map_err(|_| StoreError::Corrupt(format!("result object {key} is not UTF-8")))?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TaskStatus;

    fn result(text: String) -> TaskResult {
        TaskResult {
            text,
            model: "m".into(),
            tokens: Default::default(),
            truncated: false,
            cost_usd: None,
            text_ref: None,
            tier: Default::default(),
            tokens_saved: 0,
        }
    }

    #[tokio::test]
    async fn a_large_text_leaves_the_record_and_comes_back_whole() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let objects = crate::embedded::FileObjects::new(dir.path());
        let id = TaskId::digest(b"t");
        let small =
            offload(Some(&objects), &id, 1, result("short".into())).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((small.text.as_str(), small.text_ref.as_deref()), ("short", None));
        let big = "x".repeat(400 * 1024);
        let kept =
            offload(Some(&objects), &id, 3, result(big.clone())).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((kept.text.as_str(), kept.text_ref.as_deref()), ("", Some(key(&id, 3).as_str())));
        let mut record = crate::domain::TaskRecord::pending(
            id.clone(),
            crate::domain::request::tests::req(serde_json::json!(
            {"project_id": "p", "kind": "explain", "prompt": "x", "target_files": []})),
            0,
            60,
        );
        record.status = TaskStatus::Completed;
        record.result = Some(kept);
        let read = resolve(Some(&objects), record.clone()).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            read.result.as_ref().map(|r| (r.text.len(), r.text_ref.is_none())),
            Some((big.len(), true))
        );
        // Without the object, or without a results store, a read fails rather than answer empty.
        let mut gone = record.clone();
        if let Some(r) = gone.result.as_mut() {
            r.text_ref = Some(key(&id, 9));
        }
        assert!(matches!(resolve(Some(&objects), gone).await, Err(StoreError::Corrupt(_))));
        assert!(matches!(resolve(None, record).await, Err(StoreError::Unavailable(_))));
    }
}
