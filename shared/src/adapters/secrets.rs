//! AWS Secrets Manager: API keys and webhook secrets, read once per container at cold start. A secret
//! is a plain string, or JSON with an `api_key` field; an LLM key secret shared by routes of several
//! vendors holds one field per vendor (`openai_api_key`, `anthropic_api_key`), so no vendor is ever
//! sent another's key.

use crate::config::{ConfigError, optional_env};
pub use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::error::ProvideErrorMetadata;

/// For each `(var, secret_var)`: the variable `var`, else the Secrets Manager secret named by
/// `secret_var` (read once, at cold start), else `None`. The secrets among them are read together
/// ([`fetch_named_secrets`]: one `BatchGetSecretValue`, so one round trip and one TLS handshake in a
/// cold start); no client is built when nothing is a secret.
pub async fn env_or_secrets<const N: usize>(
    vars: [(&'static str, &'static str); N],
) -> Result<[Option<String>; N], ConfigError> {
    let plain = vars.map(|(var, _)| optional_env(var));
    let named = vars.map(|(_, secret_var)| optional_env(secret_var));
    let secrets: Vec<(&str, &'static str)> = named
        .iter()
        .zip(&plain)
        .zip(&vars)
        .filter(|((_, p), _)| p.is_none())
        .filter_map(|((n, _), (_, secret_var))| n.as_deref().map(|id| (id, *secret_var)))
        .collect();
    if secrets.is_empty() {
        return Ok(plain);
    }
    let sdk = super::sdk_config(&Default::default()).await;
    let client = super::requests::secrets(&sdk);
    let mut read = fetch_named_secrets(&client, &secrets).await.into_iter();
    // The secrets were read in the order of the slots that name one and have no plain value.
    let mut out = plain;
    for (slot, named) in out.iter_mut().zip(&named) {
        if let (None, Some(_)) = (&slot, named) {
            *slot = read.next().transpose()?;
        }
    }
    Ok(out)
}

/// Reads each `(secret id, variable naming it)`, in order: two or more in one
/// `BatchGetSecretValue`, and any the batch did not answer (an id it answered under another form,
/// a role allowed only `GetSecretValue`) on its own, all of those concurrently.
pub async fn fetch_named_secrets(
    client: &Client,
    secrets: &[(&str, &'static str)],
) -> Vec<Result<String, ConfigError>> {
    let ids: Vec<&str> = secrets.iter().map(|(id, _)| *id).collect();
    let batch = if ids.len() > 1 { batch_read(client, &ids).await } else { Default::default() };
    futures::future::join_all(secrets.iter().map(|(id, var)| {
        let batch = &batch;
        async move {
            match batch.get(*id) {
                Some(Ok(raw)) => secret_field(raw, var, None),
                Some(Err(reason)) => Err(ConfigError::Invalid { name: var, reason: reason.clone() }),
                None => fetch_secret_field(client, id, var, None).await,
            }
        }
    }))
    .await
}

/// Reads up to 20 secrets in one `BatchGetSecretValue`: each answered id (matched by the name or
/// ARN it was asked by) with its string, or why the service refused it. Empty when the call itself
/// fails, so the caller reads each secret on its own instead.
async fn batch_read(
    client: &Client,
    ids: &[&str],
) -> std::collections::HashMap<String, Result<String, String>> {
    let mut out = std::collections::HashMap::new();
    let asked: Vec<String> = ids.iter().take(20).map(|id| (*id).to_owned()).collect();
    let answer = match client.batch_get_secret_value().set_secret_id_list(Some(asked.clone())).send().await {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(error = %e.code().unwrap_or("error"), "batch secret read refused; reading one by one");
            return out;
        }
    };
    for entry in answer.secret_values() {
        let Some(id) =
            asked.iter().find(|id| Some(id.as_str()) == entry.name() || Some(id.as_str()) == entry.arn())
        else {
            continue;
        };
        let value = entry
            .secret_string()
            .map(str::to_owned)
            .ok_or_else(|| "the secret has no string value".to_owned());
        out.insert(id.clone(), value);
    }
    for error in answer.errors() {
        if let Some(id) = error.secret_id().filter(|id| asked.iter().any(|a| a == id)) {
            let reason =
                format!("{}: {}", error.error_code().unwrap_or("error"), error.message().unwrap_or_default());
            out.insert(id.to_owned(), Err(reason));
        }
    }
    out
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
/// the plain string or the JSON field `api_key`. `var` is named in errors.
fn secret_field(raw: &str, var: &'static str, vendor_field: Option<&str>) -> Result<String, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid { name: var, reason };
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
/// [`env_or_secrets`] reads it. The secret is read once per process, however many routes take a
/// key from it.
pub async fn llm_key(
    var: &'static str,
    vendor_field: &str,
    shared: bool,
) -> Result<Option<String>, ConfigError> {
    const SECRET_VAR: &str = "LANES_LLM_API_KEY_SECRET";
    static RAW: tokio::sync::OnceCell<Option<String>> = tokio::sync::OnceCell::const_new();
    if let Some(v) = optional_env(var) {
        return Ok(Some(v));
    }
    let raw = RAW
        .get_or_try_init(|| async {
            let Some(secret) = optional_env(SECRET_VAR) else { return Ok(None) };
            let sdk = super::sdk_config(&Default::default()).await;
            fetch_string(&super::requests::secrets(&sdk), &secret, SECRET_VAR).await.map(Some)
        })
        .await?;
    raw.as_deref().map(|raw| secret_field(raw, SECRET_VAR, shared.then_some(vendor_field))).transpose()
}
