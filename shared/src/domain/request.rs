//! A task request as a client sends it: the fields, the documented shape of `params`, and the
//! validation that names every bad field. Pure.

use crate::domain::fairness::Priority;
use crate::domain::{FieldError, Kind, Lane, MAX_PARAM_TOKENS, Tenant};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Largest accepted request body, in bytes.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Most `target_files` one task may name.
pub const MAX_TARGET_FILES: usize = 200;
/// Longest accepted `project_id`.
pub const MAX_PROJECT_ID_LEN: usize = 128;
/// Longest accepted `Idempotency-Key` header value.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// What a `prompt` must hold: one character that is not white space as Rust's `str::trim` counts it
/// (Unicode `White_Space`), so the trimmed prompt is not empty. Written as a class, not `\S`, since
/// ECMA-262 and Python count other characters as space.
pub const PROMPT_PATTERN: &str =
    r"[^\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]";

/// A `target_files` entry: no leading `/` or `\`, no drive letter (a second character `:`), no
/// `..` segment, no control character (Unicode `Cc`), 1 to 1024 characters.
pub const TARGET_FILE_PATTERN: &str =
    r"^(?![/\\])(?!.:)(?!(.*[/\\])?\.\.([/\\]|$))[^\u0000-\u001f\u007f-\u009f]{1,1024}$";

/// A validated task request, in canonical form (prompt trimmed, files sorted and deduplicated).
/// Its schema states every rule the validation applies (a generator of requests from the
/// document must see the same ones), and no field beyond these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    /// Tenant-chosen project identifier, `[A-Za-z0-9._-]{1,128}`.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,128}$", min_length = 1, max_length = 128)]
    pub project_id: String,
    /// What to do; decides the lane. The commits lane's kinds come from the webhook only.
    #[schema(schema_with = task_kinds)]
    pub kind: Kind,
    /// The instruction, trimmed; at least one character that is not white space.
    #[schema(schema_with = prompt)]
    pub prompt: String,
    /// Relative paths, sorted and deduplicated; at most 200.
    #[schema(schema_with = target_files)]
    pub target_files: Vec<String>,
    /// Sampling parameters passed to the model (see [`ModelParams`]); `null` when absent.
    #[schema(value_type = Option<ModelParams>)]
    pub params: Value,
    /// The authenticated caller it belongs to (see [`Tenant`]); set by ingress, never by the
    /// client (the body may not name it), `None` with tenancy off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub tenant: Option<Tenant>,
    /// Its place in the lane's fair order among its tenant's tasks: `high`, `normal` (the default)
    /// or `low`, a 30-second offset either way. Not part of the task's identity: the same payload
    /// at another priority is the same task.
    #[serde(default, skip_serializing_if = "Priority::is_normal")]
    #[schema(value_type = Option<Priority>)]
    pub priority: Priority,
}

/// The kinds a client may submit: every task kind but the commits lane's.
fn task_kinds() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    let kinds = Kind::ALL.iter().filter(|k| k.lane() != Lane::Commits).map(|k| k.as_str());
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(kinds))
        .description(Some(
            "What to do; decides the lane. The commits lane's kinds come from the webhook only.",
        ))
        .build()
}

/// `prompt`: at least one character that is not white space ([`PROMPT_PATTERN`]).
fn prompt() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .pattern(Some(PROMPT_PATTERN))
        .description(Some("The instruction, trimmed; at least one character that is not white space."))
        .build()
}

/// `target_files`: at most [`MAX_TARGET_FILES`] relative paths ([`TARGET_FILE_PATTERN`]).
fn target_files() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    let item = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(1024))
        .pattern(Some(TARGET_FILE_PATTERN));
    ArrayBuilder::new()
        .items(item)
        .max_items(Some(MAX_TARGET_FILES))
        .description(Some("Relative paths, sorted and deduplicated; at most 200."))
        .build()
}

/// The documented shape of `params`: every key optional, unknown keys refused (a typo would otherwise
/// be silently ignored by the model and still change the task id).
/// `null` for any key is the key left out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelParams {
    /// Sampling temperature, 0 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    /// Nucleus sampling, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Completion token cap, at most the lane's own cap (which applies when this is absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 128_000)]
    pub max_tokens: Option<u32>,
    /// A stop sequence, or up to four of them; none empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(schema_with = stop_sequences)]
    pub stop: Vec<String>,
    /// Sampling seed, where the provider supports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = -9_223_372_036_854_775_808_i64, maximum = 9_223_372_036_854_775_807_i64)]
    pub seed: Option<i64>,
    /// Seconds after submission by which the answer is wanted: with one, the task is called at the
    /// discounted `flex` tier while at least 15 minutes of it are left (where its route offers flex),
    /// and at `sync` after that. Without one, the lane's tier applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_209_600)]
    pub deadline_s: Option<u64>,
}

/// `stop`: one non-empty string, or an array of at most four, or null.
fn stop_sequences() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    let one = || ObjectBuilder::new().schema_type(Type::String).min_length(Some(1));
    Schema::OneOf(
        OneOfBuilder::new()
            .item(one())
            .item(ArrayBuilder::new().items(one()).max_items(Some(4)))
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .description(Some("A stop sequence, or up to four of them; none empty."))
            .build(),
    )
}

/// Keys `params` may have.
pub const PARAM_KEYS: [&str; 6] = ["deadline_s", "max_tokens", "seed", "stop", "temperature", "top_p"];

/// The longest `params.deadline_s`: the queues' retention, past which no task waits.
pub const MAX_DEADLINE_SECS: u64 = 14 * 24 * 3600;

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
            if value.is_null() && PARAM_KEYS.contains(&key.as_str()) {
                continue;
            }
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
                "max_tokens" => match whole(value) {
                    Some(n) if (1..=i128::from(MAX_PARAM_TOKENS)).contains(&n) => {}
                    _ => errors.push(bad(&format!("expected a whole number from 1 to {MAX_PARAM_TOKENS}"))),
                },
                "deadline_s" => match whole(value) {
                    Some(n) if (1..=i128::from(MAX_DEADLINE_SECS)).contains(&n) => {}
                    _ => errors.push(bad(&format!(
                        "expected a whole number of seconds from 1 to {MAX_DEADLINE_SECS}"
                    ))),
                },
                "seed" => {
                    if whole(value).is_none_or(|n| i64::try_from(n).is_err()) {
                        errors.push(bad("expected a whole number (a signed 64-bit one)"));
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

const ALLOWED_FIELDS: [&str; 6] = ["project_id", "kind", "prompt", "target_files", "params", "priority"];

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
        let kind = take_kind(&mut obj, &mut errors);
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
        let params = take_params(&mut obj, &mut errors);
        let priority = take_priority(&mut obj, &mut errors);
        match (project_id, kind, prompt, target_files, params, priority) {
            (
                Some(project_id),
                Some(kind),
                Some(prompt),
                Some(target_files),
                Some(params),
                Some(priority),
            ) if errors.is_empty() => {
                Ok(Self { project_id, kind, prompt, target_files, params, tenant: None, priority })
            }
            _ => Err(errors),
        }
    }

    /// The lane this request runs in.
    pub fn lane(&self) -> Lane {
        self.kind.lane()
    }
}

/// The `kind`: a task kind (the commits lane's kinds come from the webhook, never from a client).
fn take_kind(obj: &mut Map<String, Value>, errors: &mut Vec<FieldError>) -> Option<Kind> {
    take_string(obj, "kind", errors).and_then(|k| match k.parse::<Kind>() {
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
    })
}

/// The `priority`: absent or null is `normal`.
fn take_priority(obj: &mut Map<String, Value>, errors: &mut Vec<FieldError>) -> Option<Priority> {
    let expected = || Priority::ALL.map(Priority::as_str).join(", ");
    match obj.remove("priority") {
        None | Some(Value::Null) => Some(Priority::Normal),
        Some(Value::String(p)) => Priority::parse(&p).or_else(|| {
            errors.push(FieldError::new(
                "priority",
                format!("unknown priority `{p}`; expected one of: {}", expected()),
            ));
            None
        }),
        Some(_) => {
            errors.push(FieldError::new("priority", format!("expected a string, one of: {}", expected())));
            None
        }
    }
}

/// The `params`, validated and in their canonical form (absent and equal values written one way).
fn take_params(obj: &mut Map<String, Value>, errors: &mut Vec<FieldError>) -> Option<Value> {
    match obj.remove("params") {
        None | Some(Value::Null) => Some(Value::Null),
        Some(Value::Object(mut m)) => {
            let problems = ModelParams::validate(&m);
            if problems.is_empty() {
                // One stop sequence is the same request as a list of one.
                if let Some(Value::String(s)) = m.get("stop").cloned() {
                    m.insert("stop".into(), Value::Array(vec![Value::String(s)]));
                }
                // Equal requests, equal ids: a null or an empty list is an absent parameter,
                // no parameters at all are no params, and 1.0 is the number 1.
                m.retain(|_, v| !(v.is_null() || v.as_array().is_some_and(Vec::is_empty)));
                m.values_mut().for_each(integral);
                Some(if m.is_empty() { Value::Null } else { Value::Object(m) })
            } else {
                errors.extend(problems);
                None
            }
        }
        Some(_) => {
            errors.push(FieldError::new("params", "expected a JSON object or null"));
            None
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
    if path.chars().count() > 1024 {
        return Err("longer than 1024 characters");
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
    if path.chars().nth(1) == Some(':') {
        return Err("must be a relative path (no drive letter)");
    }
    Ok(())
}

/// A JSON number's whole value: an integer, or a float with no fraction (JSON, and JSON Schema's
/// `integer`, do not tell `5.0` from `5`) small enough to be exact (|n| < 2^53, as `integral`
/// writes it back; a larger one was rounded when it was parsed).
fn whole(v: &Value) -> Option<i128> {
    if let Some(n) = v.as_i64() {
        return Some(i128::from(n));
    }
    if let Some(n) = v.as_u64() {
        return Some(i128::from(n));
    }
    v.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| f as i128)
}

/// A float with no fraction, written as the integer it equals (JSON does not tell `1.0` from `1`;
/// serde_json's text does, and the canonical form must not).
fn integral(v: &mut Value) {
    if let Some(f) = v.as_f64().filter(|f| v.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15) {
        *v = if f >= 0.0 { Value::from(f as u64) } else { Value::from(f as i64) };
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A request the test knows is valid.
    pub(crate) fn req(v: Value) -> TaskRequest {
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

    /// What the document states of `params` holds: a whole float is the integer, a null is the key
    /// left out, and a seed past 64 bits (a float once parsed, rounded) is refused.
    #[test]
    fn params_read_as_the_document_states_them() {
        let with = |params: Value| json!({"project_id": "p", "kind": "explain", "prompt": "x", "target_files": [], "params": params});
        assert_eq!(req(with(json!({"max_tokens": 5.0}))).params, req(with(json!({"max_tokens": 5}))).params);
        assert_eq!(req(with(json!({"temperature": null, "stop": null}))).params, Value::Null);
        let max = req(with(json!({"seed": i64::MIN}))).params;
        assert_eq!(ModelParams::from_value(&max).seed, Some(i64::MIN));
        for seed in [json!(-9223372036854775809.0), json!(9223372036854775808_u64), json!(1.5)] {
            assert_eq!(errs(with(json!({"seed": seed})))[0].field, "params.seed", "{seed}");
        }
        assert_eq!(errs(with(json!({"max_tokens": 128_001})))[0].field, "params.max_tokens");
        let patient = req(with(json!({"deadline_s": 3600})));
        assert_eq!(ModelParams::from_value(&patient.params).deadline_s, Some(3600));
        assert_ne!(
            patient.task_id(None),
            req(with(Value::Null)).task_id(None),
            "a deadline is part of the work"
        );
        for bad in [json!(0), json!(-5), json!(1.5), json!("1h"), json!(MAX_DEADLINE_SECS + 1)] {
            let e = errs(with(json!({"deadline_s": bad})));
            assert_eq!((e[0].field.as_str(), e.len()), ("params.deadline_s", 1), "{bad}");
        }
    }

    #[test]
    fn priority_is_optional_validated_and_not_part_of_the_identity() {
        let base = json!({"project_id": "p", "kind": "explain", "prompt": "x", "target_files": []});
        let with = |p: Value| {
            let mut v = base.clone();
            v["priority"] = p;
            v
        };
        assert_eq!(req(base.clone()).priority, Priority::Normal);
        assert_eq!(req(with(Value::Null)).priority, Priority::Normal);
        let high = req(with(json!("high")));
        assert_eq!(high.priority, Priority::High);
        assert_eq!(high.task_id(None), req(base.clone()).task_id(None), "the same work is the same task");
        for bad in [json!("urgent"), json!("HIGH"), json!(1)] {
            let e = errs(with(bad.clone()));
            assert_eq!(e.len(), 1, "{bad}: {e:?}");
            assert_eq!(e[0].field, "priority");
            assert!(
                e[0].reason.contains("high, normal, low"),
                "{bad}: names what is allowed: {}",
                e[0].reason
            );
        }
        // Records written before priorities existed read as normal; normal is not written.
        let stored = serde_json::to_value(req(base)).unwrap_or_default();
        assert!(stored.get("priority").is_none(), "{stored}");
        let back: TaskRequest = serde_json::from_value(stored).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.priority, Priority::Normal);
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
}
