//! AWS Secrets Manager: API keys and webhook secrets, read once per container at cold start. A secret
//! is a plain string, or JSON with an `api_key` field; an LLM key secret shared by routes of several
//! vendors holds one field per vendor (`openai_api_key`, `anthropic_api_key`), so no vendor is ever
//! sent another's key.

use crate::config::{ConfigError, optional_env};
pub use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::error::ProvideErrorMetadata;

/// Reads an API key from AWS Secrets Manager (a plain string secret, or JSON with an `api_key` field).
pub async fn fetch_secret(client: &Client, secret_id: &str) -> Result<String, ConfigError> {
    fetch_named_secret(client, secret_id, "LANES_LLM_API_KEY_SECRET").await
}

/// For each `(var, secret_var)`: the variable `var`, else the Secrets Manager secret named by
/// `secret_var` (read once, at cold start), else `None`. The secrets among them are read concurrently
/// through one client (one SDK configuration and one connection pool), so a cold start that needs
/// two pays about one round trip, and builds the client only if it reads a secret at all.
pub async fn env_or_secrets<const N: usize>(
    vars: [(&'static str, &'static str); N],
) -> Result<[Option<String>; N], ConfigError> {
    let plain = vars.map(|(var, _)| optional_env(var));
    let named = vars.map(|(_, secret_var)| optional_env(secret_var));
    if plain.iter().zip(&named).all(|(p, n)| p.is_some() || n.is_none()) {
        return Ok(plain);
    }
    let sdk = super::sdk_config(&Default::default()).await;
    let client = super::requests::secrets(&sdk);
    let fetched = futures::future::join_all(vars.iter().zip(plain.iter().zip(&named)).map(
        |((_, secret_var), (plain, named))| {
            let client = &client;
            async move {
                match (plain, named) {
                    (Some(v), _) => Ok(Some(v.clone())),
                    (None, Some(id)) => fetch_named_secret(client, id, secret_var).await.map(Some),
                    (None, None) => Ok(None),
                }
            }
        },
    ))
    .await;
    let values = fetched.into_iter().collect::<Result<Vec<_>, _>>()?;
    values.try_into().map_err(|_| ConfigError::Missing("secrets"))
}

/// [`fetch_secret`], naming `var` in its errors.
pub async fn fetch_named_secret(
    client: &Client,
    secret_id: &str,
    var: &'static str,
) -> Result<String, ConfigError> {
    fetch_secret_field(client, secret_id, var, None).await
}

/// A secret's value: with `vendor_field`, that JSON field (e.g. `openai_api_key`) and nothing else;
/// without, a plain string or the JSON field `api_key`. `var` is named in errors.
pub async fn fetch_secret_field(
    client: &Client,
    secret_id: &str,
    var: &'static str,
    vendor_field: Option<&str>,
) -> Result<String, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid { name: var, reason };
    let out = client.get_secret_value().secret_id(secret_id).send().await.map_err(|e| {
        invalid(format!("{}: {}", e.code().unwrap_or("error"), e.message().unwrap_or_default()))
    })?;
    let raw = out.secret_string().ok_or_else(|| invalid("the secret has no string value".into()))?;
    let json = match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(serde_json::Value::Object(m)) => Some(m),
        _ => None,
    };
    let field = vendor_field.unwrap_or("api_key");
    match (json, vendor_field) {
        (Some(m), _) => m
            .get(field)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .ok_or_else(|| invalid(format!("the JSON secret has no `{field}` string"))),
        (None, None) => Ok(raw.trim().to_owned()),
        (None, Some(field)) => Err(invalid(format!(
            "routes name more than one vendor: the secret must be JSON with a `{field}` field per vendor"
        ))),
    }
}

/// An LLM vendor's key: the variable `var`, else the field `vendor_field` of the secret named by
/// `LANES_LLM_API_KEY_SECRET` when `shared` (routes of several vendors), else that secret as
/// [`env_or_secrets`] reads it.
pub async fn llm_key(
    var: &'static str,
    vendor_field: &str,
    shared: bool,
) -> Result<Option<String>, ConfigError> {
    if let Some(v) = optional_env(var) {
        return Ok(Some(v));
    }
    match optional_env("LANES_LLM_API_KEY_SECRET") {
        None => Ok(None),
        Some(secret) => {
            let sdk = super::sdk_config(&Default::default()).await;
            let client = super::requests::secrets(&sdk);
            let field = shared.then_some(vendor_field);
            Ok(Some(fetch_secret_field(&client, &secret, "LANES_LLM_API_KEY_SECRET", field).await?))
        }
    }
}
