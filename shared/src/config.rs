//! Tunables of the core with their defaults (design §3, §4) and the checks that keep them coherent.
//! Binaries build these once at start; tests shrink the durations to milliseconds.

use std::time::Duration;

/// Errors in configuration: always permanent, always naming the setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A required environment variable is absent.
    #[error("missing environment variable {0}")]
    Missing(&'static str),
    /// A value is malformed or out of range.
    #[error("invalid {name}: {reason}")]
    Invalid {
        /// The setting.
        name: &'static str,
        /// Why.
        reason: String,
    },
}

/// Worker lease and retry settings.
#[derive(Debug, Clone, Copy)]
pub struct WorkerConfig {
    /// Visibility and lock TTL set at receipt and by every renewal.
    pub lease_ttl: Duration,
    /// Heartbeat period; must leave room for at least two renewals per TTL.
    pub renew_interval: Duration,
    /// First retry delay cap; doubles per receive.
    pub backoff_base: Duration,
    /// Largest retry delay (SQS allows 12 h).
    pub backoff_max: Duration,
    /// Upper bound of the jitter added to a contended lock's remaining TTL.
    pub lock_jitter_max: Duration,
    /// TTL of terminal records.
    pub record_ttl_secs: u64,
    /// TTL of the hot-cache entry of a completed task.
    pub result_cache_ttl: Duration,
    /// Completion token cap per call.
    pub max_completion_tokens: u32,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(900),
            lock_jitter_max: Duration::from_secs(1),
            record_ttl_secs: 7 * 24 * 3600,
            result_cache_ttl: Duration::from_secs(3600),
            max_completion_tokens: 1024,
        }
    }
}

impl WorkerConfig {
    /// The same settings with a lease of `ttl`, renewed every third of it (two renewals may fail
    /// before the lease runs out).
    pub fn with_lease(self, ttl: Duration) -> Self {
        Self { lease_ttl: ttl, renew_interval: (ttl / 3).max(Duration::from_millis(1)), ..self }
    }

    /// Checks that a heartbeat can keep the lease alive.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.renew_interval.is_zero() || self.renew_interval * 2 > self.lease_ttl {
            return Err(ConfigError::Invalid {
                name: "renew_interval",
                reason: format!(
                    "{:?} must be non-zero and at most half of lease_ttl ({:?})",
                    self.renew_interval, self.lease_ttl
                ),
            });
        }
        if self.backoff_base.is_zero() || self.backoff_base > self.backoff_max {
            return Err(ConfigError::Invalid {
                name: "backoff_base",
                reason: "must be non-zero and at most backoff_max".into(),
            });
        }
        Ok(())
    }
}

/// Ingress settings.
#[derive(Debug, Clone, Copy)]
pub struct IngressConfig {
    /// A `PENDING` record older than this that no worker claimed is sent again.
    pub enqueue_grace: Duration,
    /// TTL of a `PENDING` record (the seed's 1 h).
    pub pending_ttl_secs: u64,
    /// TTL of the hot-cache entry refilled on a duplicate of a completed task.
    pub result_cache_ttl: Duration,
    /// `Retry-After` seconds on a 503.
    pub retry_after_secs: u64,
}

impl Default for IngressConfig {
    fn default() -> Self {
        Self {
            enqueue_grace: Duration::from_secs(60),
            pending_ttl_secs: 3600,
            result_cache_ttl: Duration::from_secs(3600),
            retry_after_secs: 2,
        }
    }
}

/// Reads a required environment variable.
/// An optional variable: unset and empty (CloudFormation's way of leaving a parameter out) are both
/// `None`.
pub fn optional_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A required variable, named in the error when missing or empty.
pub fn require_env(name: &'static str) -> Result<String, ConfigError> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty()).ok_or(ConfigError::Missing(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_heartbeat_is_rejected() {
        assert!(WorkerConfig::default().validate().is_ok());
        let bad = WorkerConfig { renew_interval: Duration::from_secs(10), ..WorkerConfig::default() };
        assert!(matches!(bad.validate(), Err(ConfigError::Invalid { name: "renew_interval", .. })));
    }
}
