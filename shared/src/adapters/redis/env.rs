//! The cache's connection settings from the environment: where it is, whether it is a cluster,
//! the key prefix, a private certificate authority, and the ACL user with its password (plain, or
//! from Secrets Manager).

use super::{RedisAuth, RedisSettings};
use crate::config::{ConfigError, require_env};
use std::time::Duration;

/// Redis settings from `REDIS_URL`, `LANES_REDIS_CLUSTER`, `LANES_KEY_PREFIX`,
/// `LANES_REDIS_CA_FILE` (a PEM certificate authority for `rediss://`, instead of the system roots)
/// and the ACL user `LANES_REDIS_USER` (default `default`) with `LANES_REDIS_PASSWORD` or
/// `LANES_REDIS_PASSWORD_SECRET`.
pub fn redis_from_env() -> Result<RedisSettings, ConfigError> {
    let url = require_env("REDIS_URL")?;
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(ConfigError::Invalid {
            name: "REDIS_URL",
            reason: "must start with redis:// or rediss://".into(),
        });
    }
    let cluster = match std::env::var("LANES_REDIS_CLUSTER").unwrap_or_default().as_str() {
        "" | "0" | "false" => false,
        "1" | "true" => true,
        other => {
            return Err(ConfigError::Invalid {
                name: "LANES_REDIS_CLUSTER",
                reason: format!("`{other}`; expected true or false"),
            });
        }
    };
    let prefix = std::env::var("LANES_KEY_PREFIX").unwrap_or_else(|_| "lanes:".into());
    // A private CA for `rediss://` (self-hosted Valkey, a test CA): a PEM file.
    let ca_pem = match crate::config::optional_env("LANES_REDIS_CA_FILE") {
        None => None,
        Some(path) => Some(std::fs::read(&path).map_err(|e| ConfigError::Invalid {
            name: "LANES_REDIS_CA_FILE",
            reason: format!("cannot read `{path}`: {e}"),
        })?),
    };
    // An ACL user: `LANES_REDIS_USER` with `LANES_REDIS_PASSWORD` or the Secrets Manager secret
    // `LANES_REDIS_PASSWORD_SECRET` (plain, or JSON with a `password` field).
    let password = crate::adapters::secrets::env_or_secret(
        "LANES_REDIS_PASSWORD",
        "LANES_REDIS_PASSWORD_SECRET",
        crate::adapters::secrets::Part::Field("password"),
    );
    let auth = match (crate::config::optional_env("LANES_REDIS_USER"), password) {
        (None, None) => None,
        (user, Some(password)) => {
            Some(RedisAuth { user: user.unwrap_or_else(|| "default".into()), password })
        }
        (Some(_), None) => {
            return Err(ConfigError::Invalid {
                name: "LANES_REDIS_USER",
                reason: "names a user without LANES_REDIS_PASSWORD or LANES_REDIS_PASSWORD_SECRET".into(),
            });
        }
    };
    Ok(RedisSettings { url, cluster, prefix, timeout: Duration::from_millis(500), ca_pem, auth })
}
