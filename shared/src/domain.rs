//! The task domain: kinds and their lanes, request validation, the canonical idempotency key, and the
//! task record with its state machine. Pure code: no I/O, no clock reads (times are passed in).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// Largest accepted request body, in bytes.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Most `target_files` one task may name.
pub const MAX_TARGET_FILES: usize = 200;
/// Longest accepted `project_id`.
pub const MAX_PROJECT_ID_LEN: usize = 128;
/// Longest accepted `Idempotency-Key` header value.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// A queue lane. The kind of a task decides its lane (design §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    /// Short, latency-sensitive tasks (SLA < 3 s).
    Interactive,
    /// Long generation tasks (45–180 s); one per invocation.
    Synthesis,
    /// Commit summaries, batched.
    Commits,
}

impl Lane {
    /// Every lane, in priority order.
    pub const ALL: [Lane; 3] = [Lane::Interactive, Lane::Synthesis, Lane::Commits];

    /// Position in [`Lane::ALL`], for per-lane arrays.
    pub fn index(self) -> usize {
        match self {
            Lane::Interactive => 0,
            Lane::Synthesis => 1,
            Lane::Commits => 2,
        }
    }

    /// The lane's name as used in queue names, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Interactive => "interactive",
            Lane::Synthesis => "synthesis",
            Lane::Commits => "commits",
        }
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Lane {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Lane::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| format!("unknown lane `{s}` (expected interactive, synthesis or commits)"))
    }
}

/// A task kind. Unknown kinds are rejected, never guessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Inline completion.
    Autocomplete,
    /// Explain code.
    Explain,
    /// Propose a lint fix.
    LintPatch,
    /// Classify a change or a file.
    Classify,
    /// Propose a test.
    TestPatch,
    /// Scaffold a project or module.
    Scaffold,
    /// Edit several files.
    MultiFile,
    /// Refactor.
    Refactor,
    /// Multi-step agent run.
    Agent,
    /// Summary of one Git commit.
    CommitSummary,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 10] = [
        Kind::Autocomplete,
        Kind::Explain,
        Kind::LintPatch,
        Kind::Classify,
        Kind::TestPatch,
        Kind::Scaffold,
        Kind::MultiFile,
        Kind::Refactor,
        Kind::Agent,
        Kind::CommitSummary,
    ];

    /// The lane this kind runs in (design §2).
    pub fn lane(self) -> Lane {
        match self {
            Kind::Autocomplete | Kind::Explain | Kind::LintPatch | Kind::Classify | Kind::TestPatch => {
                Lane::Interactive
            }
            Kind::Scaffold | Kind::MultiFile | Kind::Refactor | Kind::Agent => Lane::Synthesis,
            Kind::CommitSummary => Lane::Commits,
        }
    }

    /// Whether `POST /v1/tasks` accepts this kind (kinds of the commits lane come from the webhook).
    pub fn is_task(self) -> bool {
        self.lane() != Lane::Commits
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Autocomplete => "autocomplete",
            Kind::Explain => "explain",
            Kind::LintPatch => "lint_patch",
            Kind::Classify => "classify",
            Kind::TestPatch => "test_patch",
            Kind::Scaffold => "scaffold",
            Kind::MultiFile => "multi_file",
            Kind::Refactor => "refactor",
            Kind::Agent => "agent",
            Kind::CommitSummary => "commit_summary",
        }
    }
}

impl FromStr for Kind {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s).ok_or(())
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem with a request, naming the field it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// JSON pointer-ish name of the field (`target_files[3]`), or `body`.
    pub field: String,
    /// Why it was rejected, in words a client can act on.
    pub reason: String,
}

impl FieldError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { field: field.into(), reason: reason.into() }
    }
}

/// A validated task request, in canonical form (prompt trimmed, files sorted and deduplicated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRequest {
    /// Tenant-chosen project identifier, `[A-Za-z0-9._-]{1,128}`.
    pub project_id: String,
    /// What to do; decides the lane.
    pub kind: Kind,
    /// The instruction, trimmed.
    pub prompt: String,
    /// Relative paths, sorted and deduplicated.
    pub target_files: Vec<String>,
    /// Sampling parameters passed to the model (see [`ModelParams`]); `null` when absent.
    pub params: Value,
}

/// The documented shape of `params`: every key optional, unknown keys refused (a typo would otherwise
/// be silently ignored by the model and still change the task id).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelParams {
    /// Sampling temperature, 0 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Completion token cap, at most the lane's own cap (which applies when this is absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Up to four stop sequences.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Sampling seed, where the provider supports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
}

/// Keys `params` may have.
pub const PARAM_KEYS: [&str; 5] = ["max_tokens", "seed", "stop", "temperature", "top_p"];

impl ModelParams {
    /// Reads validated `params` (`null` is the empty set). Validation happened at ingress, so a value
    /// that does not decode (an old record) counts as no parameters rather than failing the task.
    pub fn from_value(v: &Value) -> Self {
        serde_json::from_value(v.clone()).unwrap_or_default()
    }

    /// Checks `params`, one error per bad key, each naming `params.<key>`.
    pub fn validate(obj: &Map<String, Value>) -> Vec<FieldError> {
        let mut errors = Vec::new();
        for (key, value) in obj {
            let field = format!("params.{key}");
            let bad = |reason: &str| FieldError::new(field.clone(), reason);
            match key.as_str() {
                "temperature" => match value.as_f64() {
                    Some(t) if (0.0..=2.0).contains(&t) => {}
                    _ => errors.push(bad("expected a number from 0 to 2")),
                },
                "top_p" => match value.as_f64() {
                    Some(t) if (0.0..=1.0).contains(&t) => {}
                    _ => errors.push(bad("expected a number from 0 to 1")),
                },
                "max_tokens" => match value.as_u64() {
                    Some(n) if (1..=MAX_PARAM_TOKENS as u64).contains(&n) => {}
                    _ => errors.push(bad(&format!("expected a whole number from 1 to {MAX_PARAM_TOKENS}"))),
                },
                "seed" => {
                    if value.as_i64().is_none() {
                        errors.push(bad("expected a whole number"));
                    }
                }
                "stop" => match value {
                    Value::String(s) if !s.is_empty() => {}
                    Value::Array(items)
                        if items.len() <= 4
                            && items.iter().all(|i| i.as_str().is_some_and(|s| !s.is_empty())) => {}
                    _ => errors.push(bad("expected a non-empty string or an array of at most 4 of them")),
                },
                _ => errors
                    .push(bad(&format!("unknown parameter; expected one of: {}", PARAM_KEYS.join(", ")))),
            }
        }
        errors
    }
}

/// Largest `params.max_tokens` accepted (a lane's own cap may be lower; the lower one applies).
pub const MAX_PARAM_TOKENS: u32 = 128_000;

const ALLOWED_FIELDS: [&str; 5] = ["project_id", "kind", "prompt", "target_files", "params"];

impl TaskRequest {
    /// Parses and validates a JSON body. Every problem found is reported, each naming its field.
    pub fn from_json(body: &[u8]) -> Result<Self, Vec<FieldError>> {
        if body.len() > MAX_BODY_BYTES {
            return Err(vec![FieldError::new(
                "body",
                format!("body is {} bytes; the limit is {MAX_BODY_BYTES}", body.len()),
            )]);
        }
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| vec![FieldError::new("body", format!("malformed JSON: {e}"))])?;
        Self::from_value(value)
    }

    /// Validates an already parsed JSON value.
    pub fn from_value(value: Value) -> Result<Self, Vec<FieldError>> {
        let Value::Object(mut obj) = value else {
            return Err(vec![FieldError::new("body", "expected a JSON object")]);
        };
        let mut errors = Vec::new();
        for key in obj.keys() {
            if !ALLOWED_FIELDS.contains(&key.as_str()) {
                errors.push(FieldError::new(key.clone(), "unknown field"));
            }
        }
        let project_id =
            take_string(&mut obj, "project_id", &mut errors).and_then(|p| match validate_project_id(&p) {
                Ok(()) => Some(p),
                Err(reason) => {
                    errors.push(FieldError::new("project_id", reason));
                    None
                }
            });
        let kind = take_string(&mut obj, "kind", &mut errors).and_then(|k| match k.parse::<Kind>() {
            Ok(kind) if kind.lane() == Lane::Commits => {
                errors.push(FieldError::new(
                    "kind",
                    format!(
                        "`{k}` runs in the commits lane, fed by the Git webhook; it cannot be submitted \
                         as a task"
                    ),
                ));
                None
            }
            Ok(kind) => Some(kind),
            Err(()) => {
                let known: Vec<&str> = Kind::ALL.iter().filter(|k| k.is_task()).map(|k| k.as_str()).collect();
                errors.push(FieldError::new(
                    "kind",
                    format!("unknown kind `{k}`; expected one of: {}", known.join(", ")),
                ));
                None
            }
        });
        let prompt = take_string(&mut obj, "prompt", &mut errors).and_then(|p| {
            let trimmed = p.trim();
            if trimmed.is_empty() {
                errors.push(FieldError::new("prompt", "must not be empty"));
                None
            } else {
                Some(trimmed.to_owned())
            }
        });
        let target_files = match obj.remove("target_files") {
            None => {
                errors.push(FieldError::new("target_files", "missing field"));
                None
            }
            Some(Value::Array(items)) => validate_target_files(items, &mut errors),
            Some(_) => {
                errors.push(FieldError::new("target_files", "expected an array of strings"));
                None
            }
        };
        let params = match obj.remove("params") {
            None | Some(Value::Null) => Some(Value::Null),
            Some(Value::Object(mut m)) => {
                let problems = ModelParams::validate(&m);
                if problems.is_empty() {
                    // One stop sequence is the same request as a list of one.
                    if let Some(Value::String(s)) = m.get("stop").cloned() {
                        m.insert("stop".into(), Value::Array(vec![Value::String(s)]));
                    }
                    Some(Value::Object(m))
                } else {
                    errors.extend(problems);
                    None
                }
            }
            Some(_) => {
                errors.push(FieldError::new("params", "expected a JSON object or null"));
                None
            }
        };
        match (project_id, kind, prompt, target_files, params) {
            (Some(project_id), Some(kind), Some(prompt), Some(target_files), Some(params))
                if errors.is_empty() =>
            {
                Ok(Self { project_id, kind, prompt, target_files, params })
            }
            _ => Err(errors),
        }
    }

    /// The lane this request runs in.
    pub fn lane(&self) -> Lane {
        self.kind.lane()
    }

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

    /// Hex sha256 of the canonical payload (design §4). Without an `Idempotency-Key` header this is the
    /// task id.
    pub fn payload_hash(&self) -> String {
        sha256_hex(self.canonical_json().as_bytes())
    }

    /// The task id: the payload hash, or, when the client sent an `Idempotency-Key`, a hash scoped to
    /// `project_id` + that key.
    pub fn task_id(&self, idempotency_key: Option<&str>) -> String {
        match idempotency_key {
            None => self.payload_hash(),
            Some(key) => {
                let scoped = format!("idempotency-key\n{}\n{}", self.project_id, key);
                sha256_hex(scoped.as_bytes())
            }
        }
    }
}

fn take_string(obj: &mut Map<String, Value>, field: &str, errors: &mut Vec<FieldError>) -> Option<String> {
    match obj.remove(field) {
        None => {
            errors.push(FieldError::new(field, "missing field"));
            None
        }
        Some(Value::String(s)) => Some(s),
        Some(_) => {
            errors.push(FieldError::new(field, "expected a string"));
            None
        }
    }
}

fn validate_project_id(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > MAX_PROJECT_ID_LEN {
        return Err(format!("must be 1 to {MAX_PROJECT_ID_LEN} characters"));
    }
    if !p.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err("may only contain A-Z, a-z, 0-9, '.', '_' and '-'".into());
    }
    Ok(())
}

fn validate_target_files(items: Vec<Value>, errors: &mut Vec<FieldError>) -> Option<Vec<String>> {
    if items.len() > MAX_TARGET_FILES {
        errors.push(FieldError::new(
            "target_files",
            format!("{} entries; at most {MAX_TARGET_FILES} are allowed", items.len()),
        ));
        return None;
    }
    let before = errors.len();
    let mut files = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let field = format!("target_files[{i}]");
        match item {
            Value::String(path) => match validate_relative_path(&path) {
                Ok(()) => files.push(path),
                Err(reason) => errors.push(FieldError::new(field, reason)),
            },
            _ => errors.push(FieldError::new(field, "expected a string")),
        }
    }
    if errors.len() > before {
        return None;
    }
    files.sort();
    files.dedup();
    Some(files)
}

fn validate_relative_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("must not be empty");
    }
    if path.len() > 1024 {
        return Err("longer than 1024 bytes");
    }
    if path.starts_with('/') || path.starts_with('\\') {
        return Err("must be a relative path (no leading '/')");
    }
    if path.chars().any(|c| c.is_control()) {
        return Err("must not contain control characters");
    }
    if path.split(['/', '\\']).any(|seg| seg == "..") {
        return Err("must not contain '..' segments");
    }
    if path.len() >= 2 && path.as_bytes()[1] == b':' {
        return Err("must be a relative path (no drive letter)");
    }
    Ok(())
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

/// Hex-encoded sha256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Lifecycle of a task record (design §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskStatus {
    /// Accepted and enqueued; no worker has claimed it.
    Pending,
    /// Claimed by a worker (fence > 0).
    Processing,
    /// Terminal: result stored.
    Completed,
    /// Terminal for this submission: retrying cannot fix it. A new submission may start it again.
    Failed,
    /// Terminal: the client cancelled it. A new submission may start it again.
    Cancelled,
}

impl TaskStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "PENDING",
            TaskStatus::Processing => "PROCESSING",
            TaskStatus::Completed => "COMPLETED",
            TaskStatus::Failed => "FAILED",
            TaskStatus::Cancelled => "CANCELLED",
        }
    }

    /// Whether no worker will touch the record again.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled)
    }

    /// Whether a new submission of the same payload replaces the record and runs again.
    pub fn is_resubmittable(self) -> bool {
        matches!(self, TaskStatus::Failed | TaskStatus::Cancelled)
    }

    /// The legal transitions. `Processing -> Processing` is a re-claim after a lost lease (the fence
    /// grows); `Pending -> Failed` is the DLQ sweep or the age limit failing a task no worker finished;
    /// `Failed|Cancelled -> Pending` is a new submission; `Completed` is final.
    pub fn can_become(self, next: TaskStatus) -> bool {
        use TaskStatus::*;
        matches!(
            (self, next),
            (Pending, Processing)
                | (Pending, Failed)
                | (Pending, Cancelled)
                | (Processing, Processing)
                | (Processing, Completed)
                | (Processing, Failed)
                | (Processing, Cancelled)
                | (Failed, Pending)
                | (Cancelled, Pending)
        )
    }
}

/// A model's answer as stored and returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskResult {
    /// The generated text.
    pub text: String,
    /// Which model produced it (the offline provider says so).
    pub model: String,
    /// Prompt plus completion tokens.
    pub tokens: TokenUsage,
    /// The model stopped at its token cap (`finish_reason`/`stop_reason` = length): the text is cut.
    #[serde(default)]
    pub truncated: bool,
}

/// Tokens spent on one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Completion tokens.
    pub completion: u64,
}

/// The durable record of one task (one DynamoDB item / one embedded row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The idempotency key.
    pub task_id: String,
    /// Hash of the canonical payload; differs from `task_id` only under an `Idempotency-Key`.
    pub payload_hash: String,
    /// The validated request.
    pub request: TaskRequest,
    /// Lane, from the kind.
    pub lane: Lane,
    /// Where the record is in its life.
    pub status: TaskStatus,
    /// Incremented by every claim; the final write must carry the current value.
    pub fence: u64,
    /// Provider calls that failed for a reason other than throttling (the lane's attempt budget).
    pub attempts: u32,
    /// Random per submission: lets ingress delete only the record it wrote.
    pub nonce: String,
    /// Unix ms.
    pub created_at_ms: u64,
    /// Unix ms of the last send to the queue.
    pub enqueued_at_ms: u64,
    /// Unix ms of the last claim.
    pub started_at_ms: Option<u64>,
    /// Unix ms of the terminal write.
    pub finished_at_ms: Option<u64>,
    /// Set when `Completed`.
    pub result: Option<TaskResult>,
    /// Set when `Failed`.
    pub error: Option<String>,
    /// Unix seconds after which the record counts as absent (DynamoDB TTL attribute).
    pub expires_at: u64,
}

impl TaskRecord {
    /// A fresh `Pending` record.
    pub fn pending(task_id: String, request: TaskRequest, now_ms: u64, ttl_secs: u64) -> Self {
        Self {
            payload_hash: request.payload_hash(),
            lane: request.lane(),
            task_id,
            request,
            status: TaskStatus::Pending,
            fence: 0,
            attempts: 0,
            nonce: uuid::Uuid::new_v4().to_string(),
            created_at_ms: now_ms,
            enqueued_at_ms: now_ms,
            started_at_ms: None,
            finished_at_ms: None,
            result: None,
            error: None,
            expires_at: now_ms / 1000 + ttl_secs,
        }
    }

    /// Whether the TTL has passed (DynamoDB deletes lazily, so reads must check too).
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at.saturating_mul(1000) <= now_ms
    }

    /// The public view of the record.
    pub fn view(&self) -> TaskView {
        TaskView {
            task_id: self.task_id.clone(),
            status: self.status,
            lane: self.lane,
            kind: self.request.kind,
            result: self.result.clone(),
            error: self.error.clone(),
            attempts: self.attempts,
        }
    }
}

/// The JSON a client sees for a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskView {
    /// The task id.
    pub task_id: String,
    /// Current status.
    pub status: TaskStatus,
    /// Lane.
    pub lane: Lane,
    /// Kind.
    pub kind: Kind,
    /// Result when completed.
    pub result: Option<TaskResult>,
    /// Reason when failed.
    pub error: Option<String>,
    /// Provider calls that failed (throttling excluded).
    #[serde(default)]
    pub attempts: u32,
}

/// The body of a queue message: small on purpose; the worker reads the request from the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskMessage {
    /// Task id.
    pub task_id: String,
    /// Lane it was sent to.
    pub lane: Lane,
    /// Kind.
    pub kind: Kind,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(v: Value) -> TaskRequest {
        match TaskRequest::from_value(v) {
            Ok(r) => r,
            Err(e) => panic!("unexpected validation error: {e:?}"),
        }
    }

    fn errs(v: Value) -> Vec<FieldError> {
        match TaskRequest::from_value(v) {
            Ok(r) => panic!("expected an error, got {r:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn kinds_map_to_lanes() {
        assert_eq!(Kind::Explain.lane(), Lane::Interactive);
        assert_eq!(Kind::Autocomplete.lane(), Lane::Interactive);
        assert_eq!(Kind::Refactor.lane(), Lane::Synthesis);
        assert_eq!(Kind::Agent.lane(), Lane::Synthesis);
        assert_eq!(Kind::CommitSummary.lane(), Lane::Commits);
        for k in Kind::ALL {
            assert_eq!(k.as_str().parse::<Kind>(), Ok(k));
        }
    }

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
    fn validation_names_fields() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({"kind":"explain","prompt":"x","target_files":[]}), "project_id"),
            (json!({"project_id":"p 1","kind":"explain","prompt":"x","target_files":[]}), "project_id"),
            (
                json!({"project_id":"a".repeat(129),"kind":"explain","prompt":"x","target_files":[]}),
                "project_id",
            ),
            (json!({"project_id":"p","kind":"poem","prompt":"x","target_files":[]}), "kind"),
            (json!({"project_id":"p","kind":"commit_summary","prompt":"x","target_files":[]}), "kind"),
            (
                json!({"project_id":"p","kind":"explain","prompt":"x","target_files":[],"params":{"temperature":3}}),
                "params.temperature",
            ),
            (
                json!({"project_id":"p","kind":"explain","prompt":"x","target_files":[],"params":{"max_tokens":0}}),
                "params.max_tokens",
            ),
            (
                json!({"project_id":"p","kind":"explain","prompt":"x","target_files":[],"params":{"stop":["a","b","c","d","e"]}}),
                "params.stop",
            ),
            (
                json!({"project_id":"p","kind":"explain","prompt":"x","target_files":[],"params":{"temprature":1}}),
                "params.temprature",
            ),
            (json!({"project_id":"p","kind":"explain","prompt":"   ","target_files":[]}), "prompt"),
            (json!({"project_id":"p","kind":"explain","prompt":7,"target_files":[]}), "prompt"),
            (json!({"project_id":"p","kind":"explain","prompt":"x"}), "target_files"),
            (
                json!({"project_id":"p","kind":"explain","prompt":"x","target_files":["../x"]}),
                "target_files[0]",
            ),
            (
                json!({"project_id":"p","kind":"explain","prompt":"x","target_files":["a","/etc/passwd"]}),
                "target_files[1]",
            ),
            (
                json!({"project_id":"p","kind":"explain","prompt":"x","target_files":["a/../../b"]}),
                "target_files[0]",
            ),
            (json!({"project_id":"p","kind":"explain","prompt":"x","target_files":[1]}), "target_files[0]"),
            (
                json!({"project_id":"p","kind":"explain","prompt":"x","target_files":[],"params":[1]}),
                "params",
            ),
            (json!({"project_id":"p","kind":"explain","prompt":"x","target_files":[],"extra":1}), "extra"),
            (json!([1, 2]), "body"),
        ];
        for (input, field) in cases {
            let e = errs(input.clone());
            assert!(e.iter().any(|fe| fe.field == field), "{input} -> {e:?}, expected field {field}");
        }
        let many: Vec<String> = (0..201).map(|i| format!("f{i}.rs")).collect();
        let e = errs(json!({"project_id":"p","kind":"explain","prompt":"x","target_files":many}));
        assert_eq!(e[0].field, "target_files");
        let ok: Vec<String> = (0..200).map(|i| format!("f{i}.rs")).collect();
        req(json!({"project_id":"p","kind":"explain","prompt":"x","target_files":ok}));
    }

    #[test]
    fn body_limits_and_malformed_json() {
        let big = vec![b' '; MAX_BODY_BYTES + 1];
        assert_eq!(TaskRequest::from_json(&big).err().map(|e| e[0].field.clone()).as_deref(), Some("body"));
        let e = TaskRequest::from_json(b"{\"project_id\":").err().unwrap_or_default();
        assert_eq!(e[0].field, "body");
        assert!(e[0].reason.contains("malformed JSON"));
    }

    #[test]
    fn idempotency_key_header_rules() {
        assert!(validate_idempotency_key("abc-123").is_ok());
        assert!(validate_idempotency_key("").is_err());
        assert!(validate_idempotency_key("has space").is_err());
        assert!(validate_idempotency_key(&"k".repeat(256)).is_err());
    }

    #[test]
    fn state_machine_allows_only_legal_transitions() {
        use TaskStatus::*;
        let all = [Pending, Processing, Completed, Failed, Cancelled];
        let legal = [
            (Pending, Processing),
            (Pending, Failed),
            (Pending, Cancelled),
            (Processing, Processing),
            (Processing, Completed),
            (Processing, Failed),
            (Processing, Cancelled),
            (Failed, Pending),
            (Cancelled, Pending),
        ];
        for from in all {
            for to in all {
                assert_eq!(from.can_become(to), legal.contains(&(from, to)), "{from:?} -> {to:?}");
            }
        }
        assert!(Completed.is_terminal() && Failed.is_terminal() && Cancelled.is_terminal());
        assert!(Failed.is_resubmittable() && Cancelled.is_resubmittable() && !Completed.is_resubmittable());
        assert!(!Pending.is_terminal() && !Processing.is_terminal());
    }

    #[test]
    fn message_round_trips_and_rejects_garbage() {
        let m = TaskMessage { task_id: "a".repeat(64), lane: Lane::Interactive, kind: Kind::Explain };
        let s = serde_json::to_string(&m).unwrap_or_default();
        assert_eq!(serde_json::from_str::<TaskMessage>(&s).ok(), Some(m));
        assert!(serde_json::from_str::<TaskMessage>("{\"task_id\":1}").is_err());
    }
}
