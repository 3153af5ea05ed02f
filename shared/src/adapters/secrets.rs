//! AWS Secrets Manager: webhook secrets, API tokens and LLM API keys as [`Secret`]s, read in the
//! background from init where an init runs ahead of events ([`reads_ahead`]), else at first use, and
//! again when old or when a check with them fails (a rotated value).
//! A secret is a plain string, or JSON with an `api_key` field; an LLM key secret shared by routes of
//! several vendors holds one field per vendor (`openai_api_key`, `anthropic_api_key`), so no vendor
//! is ever sent another's key.

use crate::clock::{SharedClock, SystemClock};
use crate::config::{ConfigError, optional_env};
use crate::secret::{Fetch, Secret};
pub use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::error::ProvideErrorMetadata;
use std::sync::Arc;

/// For each `(var, secret_var)`: the variable `var` as a given [`Secret`], else the Secrets Manager
/// secret named by `secret_var` as a [`Secret`] read when needed (`GetSecretValue`; again when old
/// or when a check with it fails), else `None`. Nothing waits on the network here: when the
/// process [`reads_ahead`], each named secret starts reading in the background
/// ([`Secret::read_ahead`]); otherwise each is read at its first use.
pub fn env_or_secrets<const N: usize>(vars: [(&'static str, &'static str); N]) -> [Option<Secret>; N] {
    let clock: SharedClock = Arc::new(SystemClock);
    let ahead = reads_ahead(optional_env(INIT_TYPE).as_deref());
    vars.map(|(var, secret_var)| {
        if let Some(v) = optional_env(var) {
            return Some(Secret::fixed(v));
        }
        let secret = Secret::read_by(read_one(optional_env(secret_var)?, secret_var, None), clock.clone());
        if ahead {
            secret.read_ahead();
        }
        Some(secret)
    })
}

/// What of a secret's string is the value (for [`env_or_secret`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The whole string (a JSON document such as the webhook owner secrets).
    Whole,
    /// This JSON field when the string is a JSON object (as Secrets Manager generates a
    /// credential: `{"username": …, "password": …}`), else the whole string.
    Field(&'static str),
}

/// `part` of a secret's string `raw` (`var` is named in errors).
fn part_of(raw: String, var: &'static str, part: Part) -> Result<String, ConfigError> {
    let json = serde_json::from_str::<serde_json::Value>(&raw).is_ok_and(|v| v.is_object());
    match part {
        Part::Field(field) if json => secret_field(&raw, var, Some(field)),
        Part::Field(_) => secret_field(&raw, var, None),
        Part::Whole => Ok(raw),
    }
}

/// As [`env_or_secrets`] for one secret whose value is `part` of its string.
pub fn env_or_secret(var: &'static str, secret_var: &'static str, part: Part) -> Option<Secret> {
    if let Some(v) = optional_env(var) {
        return Some(Secret::fixed(v));
    }
    let id = optional_env(secret_var)?;
    let fetch: Fetch = Arc::new(move || {
        let id = id.clone();
        Box::pin(
            async move { part_of(fetch_string(&client().await, &id, secret_var).await?, secret_var, part) },
        )
    });
    let secret = Secret::read_by(fetch, Arc::new(SystemClock));
    if reads_ahead(optional_env(INIT_TYPE).as_deref()) {
        secret.read_ahead();
    }
    Some(secret)
}

/// Lambda's reserved variable naming how this execution environment was initialised.
const INIT_TYPE: &str = "AWS_LAMBDA_INITIALIZATION_TYPE";

/// Whether secrets are read ahead of their first use, from Lambda's `AWS_LAMBDA_INITIALIZATION_TYPE`.
///
/// An on-demand start (`on-demand`) usually has its first event waiting. Reading ahead there puts
/// the read's CPU (a client, a connector, a signed request) into the init, and whatever it gains on
/// the first answer is only the part of the round trip that overlaps the event's delivery
/// (`lanes bench coldstart` measures both). Such a function keeps its init short and reads each
/// secret at its first use, and only the ones that use needs (a GitHub delivery reads the GitHub
/// secret alone).
///
/// Any other type (provisioned concurrency, managed instances) initialises ahead of events, so the
/// secrets are read during init and the first event finds them ready; so does a process outside
/// Lambda (no variable).
pub fn reads_ahead(init_type: Option<&str>) -> bool {
    init_type != Some("on-demand")
}

/// The process's Secrets Manager client, built at its first use.
async fn client() -> Client {
    static CLIENT: tokio::sync::OnceCell<Client> = tokio::sync::OnceCell::const_new();
    CLIENT
        .get_or_init(|| async { super::requests::secrets(&super::sdk_config(&Default::default()).await) })
        .await
        .clone()
}

/// Reads the secret `id` (named by the variable `var`): its `field`, or as [`fetch_secret_field`]
/// reads it without one.
fn read_one(id: String, var: &'static str, field: Option<&'static str>) -> Fetch {
    Arc::new(move || {
        let id = id.clone();
        Box::pin(async move { fetch_secret_field(&client().await, &id, var, field).await })
    })
}

/// A secret's value: with `vendor_field`, that JSON field (e.g. `openai_api_key`) and nothing else;
/// without, a plain string or the JSON field `api_key`. `var` is named in errors.
pub async fn fetch_secret_field(
    client: &Client,
    secret_id: &str,
    var: &'static str,
    vendor_field: Option<&str>,
) -> Result<String, ConfigError> {
    secret_field(&fetch_string(client, secret_id, var).await?, var, vendor_field)
}

/// A secret's whole string (`GetSecretValue`); `var` is named in errors.
async fn fetch_string(client: &Client, secret_id: &str, var: &'static str) -> Result<String, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid { name: var, reason };
    let out = client.get_secret_value().secret_id(secret_id).send().await.map_err(|e| {
        invalid(format!("{}: {}", e.code().unwrap_or("error"), e.message().unwrap_or_default()))
    })?;
    out.secret_string().map(str::to_owned).ok_or_else(|| invalid("the secret has no string value".into()))
}

/// The value in a secret's string: with `vendor_field`, that JSON field and nothing else; without,
/// the plain string or the JSON field `api_key`. An empty value is an error. `var` is named in errors.
fn secret_field(raw: &str, var: &'static str, vendor_field: Option<&str>) -> Result<String, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid { name: var, reason };
    let json = match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(serde_json::Value::Object(m)) => Some(m),
        _ => None,
    };
    let field = vendor_field.unwrap_or("api_key");
    let value = match (json, vendor_field) {
        (Some(m), _) => m
            .get(field)
            .and_then(|v| v.as_str())
            .map(|v| v.trim().to_owned())
            .ok_or_else(|| invalid(format!("the JSON secret has no `{field}` string"))),
        (None, None) => Ok(raw.trim().to_owned()),
        (None, Some(field)) => Err(invalid(format!(
            "routes name more than one vendor: the secret must be JSON with a `{field}` field per vendor"
        ))),
    }?;
    // An empty key would be sent as is, and an empty webhook secret would sign for anyone.
    if value.is_empty() { Err(invalid("the secret is empty".into())) } else { Ok(value) }
}

/// An LLM vendor's key: the variable `var` (given), else the field `vendor_field` of the secret named
/// by `LANES_LLM_API_KEY_SECRET` when `shared` (routes of several vendors), else that secret as a
/// plain string or its `api_key` field, as a [`Secret`] read from here in the background when the
/// process [`reads_ahead`] (else at its first use), and again when old or refused with 401 (a
/// rotated key). `None` when neither is set. Called once per vendor
/// (`backend::llm_from_env`), so routes of one vendor share one read.
pub fn llm_key(var: &'static str, vendor_field: &'static str, shared: bool) -> Option<Secret> {
    const SECRET_VAR: &str = "LANES_LLM_API_KEY_SECRET";
    if let Some(v) = optional_env(var) {
        return Some(Secret::fixed(v));
    }
    let fetch = read_one(optional_env(SECRET_VAR)?, SECRET_VAR, shared.then_some(vendor_field));
    let secret = Secret::read_by(fetch, Arc::new(SystemClock));
    if reads_ahead(optional_env(INIT_TYPE).as_deref()) {
        secret.read_ahead();
    }
    Some(secret)
}

#[cfg(test)]
mod tests {
    use super::{Part, part_of, reads_ahead, secret_field};

    #[test]
    fn a_generated_credential_gives_its_field_and_a_document_stays_whole() {
        let part = |raw: &str, p| part_of(raw.to_owned(), "V", p).ok();
        let generated = r#"{"username": "lanes", "password": "pw"}"#;
        assert_eq!(part(generated, Part::Field("password")).as_deref(), Some("pw"));
        assert_eq!(part(" plain ", Part::Field("password")).as_deref(), Some("plain"));
        assert_eq!(part(r#"{"username": "lanes"}"#, Part::Field("password")), None, "no such field");
        assert_eq!(part(generated, Part::Whole).as_deref(), Some(generated));
    }

    #[test]
    fn an_empty_secret_is_an_error_not_a_value() {
        assert_eq!(secret_field(" k ", "V", None).ok().as_deref(), Some("k"));
        assert_eq!(secret_field(r#"{"api_key":"k"}"#, "V", None).ok().as_deref(), Some("k"));
        for raw in ["", "  ", r#"{"api_key":" "}"#] {
            let err = secret_field(raw, "V", None).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("empty") && err.contains('V'), "{raw:?}: {err}");
        }
        let err = secret_field(r#"{"openai_api_key":""}"#, "V", Some("openai_api_key")).err();
        assert!(err.is_some_and(|e| e.to_string().contains("empty")));
    }

    #[test]
    fn only_an_on_demand_cold_start_reads_at_first_use() {
        assert!(!reads_ahead(Some("on-demand")));
        for ahead in ["provisioned-concurrency", "lambda-managed-instances"] {
            assert!(reads_ahead(Some(ahead)), "{ahead}");
        }
        assert!(reads_ahead(None), "outside Lambda");
    }
}
