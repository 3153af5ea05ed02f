//! Idempotency: what makes two submissions one, in both flows, and what a duplicate is told. Pure:
//! the flows make the calls, in the order this module names, and turn its outcomes into answers.
//!
//! - **Tasks.** The key is the sha256 of the payload's canonical form, scoped by tenant, or of the
//!   project and the `Idempotency-Key` header instead ([`TaskRequest::task_id`]); it is the task id.
//!   Ingress looks it up in this order, each step only when the one before did not answer:
//!   1. the hot cache, where only a `COMPLETED` record answers ([`from_cache`]);
//!   2. (the project's daily budget, over which only a duplicate of a live task is answered:
//!      [`from_record`] on a read of the store);
//!   3. one conditional put of `PENDING` (with the send, [`crate::ports::Admission`]), which hands
//!      back the live record on conflict: the store replaces failed and cancelled records, so that
//!      record is live, and [`judge`] answers it.
//!
//!   Every duplicate is judged by one rule ([`judge`]): the same key with another payload is a
//!   conflict; otherwise the live record answers, as its status says.
//! - **Commits.** The key is `repo_id:sha` ([`commit_key`]); a summary is written once under it.
//!   A webhook delivery is known by the hash of its body ([`delivery_key`]), recorded only once
//!   its commits are all enqueued, so a replay of a recorded one is dropped and any other re-sends.
//!
//! See docs/ARCHITECTURE.md, Idempotency.

use crate::domain::commit::Provider;
use crate::domain::lifecycle;
use crate::domain::request::{MAX_IDEMPOTENCY_KEY_LEN, TaskRequest};
use crate::domain::{FieldError, TaskId, TaskRecord, TaskStatus, sha256_hex};
use serde_json::{Map, Value};

pub use crate::domain::commit::commit_key;

impl TaskRequest {
    /// Canonical JSON of the payload: keys sorted at every depth (serde_json's map is ordered), prompt
    /// trimmed, files sorted and deduplicated. Equal payloads give equal bytes.
    pub fn canonical_json(&self) -> String {
        let mut m = Map::new();
        m.insert("kind".into(), Value::String(self.kind.as_str().into()));
        m.insert("params".into(), self.params.clone());
        m.insert("project_id".into(), Value::String(self.project_id.clone()));
        m.insert("prompt".into(), Value::String(self.prompt.clone()));
        m.insert(
            "target_files".into(),
            Value::Array(self.target_files.iter().cloned().map(Value::String).collect()),
        );
        Value::Object(m).to_string()
    }

    /// Hex sha256 of the canonical payload. Without an `Idempotency-Key` header this is the
    /// task id.
    pub fn payload_hash(&self) -> String {
        sha256_hex(self.canonical_json().as_bytes())
    }

    /// The task id: the payload hash, or, when the client sent an `Idempotency-Key`, a hash scoped to
    /// `project_id` + that key. With a tenant, both are scoped to it too, so tenants never share or
    /// squat on each other's ids.
    pub fn task_id(&self, idempotency_key: Option<&str>) -> TaskId {
        match (idempotency_key, &self.tenant) {
            (None, None) => TaskId::digest(self.canonical_json().as_bytes()),
            (None, Some(tenant)) => {
                TaskId::digest(format!("tenant\n{tenant}\n{}", self.canonical_json()).as_bytes())
            }
            (Some(key), None) => {
                TaskId::digest(format!("idempotency-key\n{}\n{}", self.project_id, key).as_bytes())
            }
            (Some(key), Some(tenant)) => TaskId::digest(
                format!("idempotency-key\ntenant\n{tenant}\n{}\n{}", self.project_id, key).as_bytes(),
            ),
        }
    }
}

/// Validates an `Idempotency-Key` header value: 1 to 255 visible ASCII characters.
pub fn validate_idempotency_key(key: &str) -> Result<(), FieldError> {
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(FieldError::new(
            "Idempotency-Key",
            format!("must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"),
        ));
    }
    Ok(())
}

/// What a submission whose key is already taken is told.
#[derive(Debug, Clone, PartialEq)]
pub enum Duplicate {
    /// The key belongs to another payload (`422`): the same `Idempotency-Key`, sent again with a
    /// different body.
    Conflict,
    /// The task is `COMPLETED`: its result answers (`200`).
    Completed(Box<TaskRecord>),
    /// The task is `PENDING`: `202`, and its message may need sending again (it may be unsent or lost).
    Queued(Box<TaskRecord>),
    /// The task is running, or (only in a race with its replacement) failed or cancelled: `202`.
    Running(Box<TaskRecord>),
}

/// The one rule for a duplicate of `existing`, whose payload hash the submission's is compared with.
pub fn judge(existing: TaskRecord, payload_hash: &str) -> Duplicate {
    if existing.payload_hash != payload_hash {
        return Duplicate::Conflict;
    }
    match existing.status {
        TaskStatus::Completed => Duplicate::Completed(Box::new(existing)),
        TaskStatus::Pending => Duplicate::Queued(Box::new(existing)),
        TaskStatus::Processing | TaskStatus::Failed | TaskStatus::Cancelled => {
            Duplicate::Running(Box::new(existing))
        }
    }
}

/// Step 1: the hot cache's record under the task's key, when there is one. Only a `COMPLETED`
/// record answers (that status is final, so the cache can never contradict the store); an
/// unreadable or unfinished one is no answer, and the lookup goes on.
pub fn from_cache(cached: Option<&str>, payload_hash: &str) -> Option<Duplicate> {
    let record = serde_json::from_str::<TaskRecord>(cached?).ok()?;
    (record.status == TaskStatus::Completed).then(|| judge(record, payload_hash))
}

/// The stored record under the key, read when nothing new may be stored (the budget is spent): a
/// live one is a duplicate; a failed or cancelled one, or none, is not (a resubmission would replace
/// it).
pub fn from_record(stored: Option<TaskRecord>, payload_hash: &str) -> Option<Duplicate> {
    stored.filter(|r| !lifecycle::is_resubmittable(r.status)).map(|r| judge(r, payload_hash))
}

/// The key of a webhook delivery: `provider:` and the sha256 of its body (on GitHub, the bytes its
/// signature covers). A host's redelivery sends the same body, so it is known; the host's delivery
/// id (`X-GitHub-Delivery`, `X-Gitlab-Event-UUID`) is not signed, and keyed by it a captured body
/// re-sent under new ids (or none) would be taken for new deliveries, each charging its
/// repository's daily commits again.
pub fn delivery_key(provider: Provider, body: &[u8]) -> String {
    format!("{provider}:{}", sha256_hex(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::request::tests::req;
    use serde_json::json;

    #[test]
    fn key_vectors() {
        let base = req(
            json!({"project_id":"p1","kind":"explain","prompt":"what does main do?","target_files":["src/main.rs","src/lib.rs"]}),
        );
        // A fixed vector: the canonical form is part of the contract (stored ids depend on it).
        assert_eq!(
            base.canonical_json(),
            r#"{"kind":"explain","params":null,"project_id":"p1","prompt":"what does main do?","target_files":["src/lib.rs","src/main.rs"]}"#
        );
        assert_eq!(base.task_id(None), sha256_hex(base.canonical_json().as_bytes()).as_str());
        let same = req(
            json!({"target_files":["src/lib.rs","src/main.rs","src/lib.rs"],"prompt":"  what does main do?\n","kind":"explain","project_id":"p1"}),
        );
        assert_eq!(base.task_id(None), same.task_id(None));
        let other_kind = req(
            json!({"project_id":"p1","kind":"refactor","prompt":"what does main do?","target_files":["src/main.rs","src/lib.rs"]}),
        );
        assert_ne!(base.task_id(None), other_kind.task_id(None));
        let other_project = req(
            json!({"project_id":"p2","kind":"explain","prompt":"what does main do?","target_files":["src/main.rs","src/lib.rs"]}),
        );
        assert_ne!(base.task_id(None), other_project.task_id(None));
        let params_a = req(
            json!({"project_id":"p1","kind":"explain","prompt":"x","target_files":[],"params":{"top_p":1,"seed":7,"stop":"END"}}),
        );
        let params_b = req(
            json!({"project_id":"p1","kind":"explain","prompt":"x","target_files":[],"params":{"stop":["END"],"seed":7,"top_p":1}}),
        );
        assert_eq!(params_a.task_id(None), params_b.task_id(None));
        // The header scopes the key to the project and ignores the payload.
        assert_eq!(base.task_id(Some("k1")), same.task_id(Some("k1")));
        assert_eq!(base.task_id(Some("k1")), other_kind.task_id(Some("k1")));
        assert_ne!(base.task_id(Some("k1")), other_project.task_id(Some("k1")));
        assert_ne!(base.task_id(Some("k1")), base.task_id(None));
        assert!(TaskId::parse(base.task_id(None).as_str()).is_ok());
    }

    #[test]
    fn idempotency_key_header_rules() {
        assert!(validate_idempotency_key("abc-123").is_ok());
        assert!(validate_idempotency_key("").is_err());
        assert!(validate_idempotency_key("has space").is_err());
        assert!(validate_idempotency_key(&"k".repeat(256)).is_err());
    }

    /// Payloads that differ only in how an absent or equal parameter is written are one task.
    #[test]
    fn equal_params_written_differently_are_one_task() {
        let id = |params: &str| {
            let body =
                format!(r#"{{"project_id":"p","kind":"explain","prompt":"x","target_files":[]{params}}}"#);
            TaskRequest::from_json(body.as_bytes()).unwrap().task_id(None)
        };
        let none = id("");
        for same in [r#","params":null"#, r#","params":{}"#, r#","params":{"stop":[]}"#] {
            assert_eq!(id(same), none, "{same}");
        }
        assert_eq!(id(r#","params":{"temperature":1}"#), id(r#","params":{"temperature":1.0}"#));
        assert_ne!(id(r#","params":{"temperature":1}"#), id(r#","params":{"temperature":0.5}"#));
    }

    fn record(status: TaskStatus, payload_hash: &str) -> TaskRecord {
        let request = req(json!({"project_id":"p","kind":"explain","prompt":"x","target_files":[]}));
        let mut r = TaskRecord::pending(request.task_id(None), request, 1_000, 3_600);
        r.status = status;
        r.payload_hash = payload_hash.to_owned();
        r
    }

    #[test]
    fn a_duplicate_is_answered_as_its_record_says_and_another_payload_is_a_conflict() {
        use TaskStatus::*;
        assert_eq!(judge(record(Completed, "a"), "b"), Duplicate::Conflict);
        assert!(matches!(judge(record(Completed, "a"), "a"), Duplicate::Completed(_)));
        assert!(matches!(judge(record(Pending, "a"), "a"), Duplicate::Queued(_)));
        for s in [Processing, Failed, Cancelled] {
            assert!(matches!(judge(record(s, "a"), "a"), Duplicate::Running(_)), "{s:?}");
        }
    }

    #[test]
    fn only_a_completed_cached_record_answers() {
        let json = |s| serde_json::to_string(&record(s, "a")).unwrap();
        assert!(matches!(from_cache(Some(&json(TaskStatus::Completed)), "a"), Some(Duplicate::Completed(_))));
        assert_eq!(from_cache(Some(&json(TaskStatus::Completed)), "b"), Some(Duplicate::Conflict));
        for s in [TaskStatus::Pending, TaskStatus::Processing, TaskStatus::Failed, TaskStatus::Cancelled] {
            assert_eq!(from_cache(Some(&json(s)), "a"), None, "{s:?}");
        }
        assert_eq!(from_cache(Some("not json"), "a"), None);
        assert_eq!(from_cache(None, "a"), None);
    }

    #[test]
    fn over_the_budget_only_a_live_record_is_a_duplicate() {
        use TaskStatus::*;
        for s in [Pending, Processing, Completed] {
            assert!(from_record(Some(record(s, "a")), "a").is_some(), "{s:?}");
        }
        for s in [Failed, Cancelled] {
            assert_eq!(from_record(Some(record(s, "a")), "a"), None, "{s:?}");
        }
        assert_eq!(from_record(None, "a"), None);
    }

    #[test]
    fn a_live_record_with_the_same_payload_is_a_duplicate_and_with_another_a_conflict() {
        assert!(matches!(judge(record(TaskStatus::Pending, "a"), "a"), Duplicate::Queued(_)));
        assert_eq!(judge(record(TaskStatus::Pending, "a"), "b"), Duplicate::Conflict);
    }

    #[test]
    fn delivery_keys_name_their_host_and_the_signed_body() {
        let body = br#"{"after":"a"}"#;
        let key = delivery_key(Provider::Github, body);
        assert_eq!(key, format!("github:{}", sha256_hex(body)));
        assert_ne!(key, delivery_key(Provider::Gitlab, body), "scoped by host");
        assert_ne!(key, delivery_key(Provider::Github, br#"{"after":"b"}"#));
    }
}
