//! The task's idempotency key: canonical JSON of the payload, its sha256 as the task id, and the
//! `Idempotency-Key` header's scoping to the project (see docs/ARCHITECTURE.md, Idempotency). Pure.

use crate::domain::request::{MAX_IDEMPOTENCY_KEY_LEN, TaskRequest};
use crate::domain::{FieldError, sha256_hex};
use serde_json::{Map, Value};

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
    pub fn task_id(&self, idempotency_key: Option<&str>) -> String {
        match (idempotency_key, &self.tenant) {
            (None, None) => self.payload_hash(),
            (None, Some(tenant)) => {
                sha256_hex(format!("tenant\n{tenant}\n{}", self.canonical_json()).as_bytes())
            }
            (Some(key), None) => {
                sha256_hex(format!("idempotency-key\n{}\n{}", self.project_id, key).as_bytes())
            }
            (Some(key), Some(tenant)) => sha256_hex(
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

/// Whether a string has the shape of a task id (64 lowercase hex digits).
pub fn is_task_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
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
        assert_eq!(base.task_id(None), sha256_hex(base.canonical_json().as_bytes()));
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
        assert!(is_task_id(&base.task_id(None)));
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
}
