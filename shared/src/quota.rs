//! Per-project quotas: a daily token budget, and requests and tokens per minute, for each
//! `project_id`, all optional and the same for every project.
//!
//! - **Daily tokens** (`LANES_PROJECT_DAILY_TOKENS`): the tokens a project's calls used today (UTC)
//!   are added up in a counter that expires with the day. Ingress refuses a new task of a project at
//!   or over its budget with `429` and `Retry-After` (until midnight UTC) and stores nothing. Tasks
//!   already accepted still run: every accepted task gets an answer.
//! - **Per minute** (`LANES_PROJECT_RPM`, `LANES_PROJECT_TPM`): before each provider call, a worker
//!   counts one request and the call's token estimate in the project's counters of the current
//!   calendar minute; over either cap, the task is put off to the next minute without using an
//!   attempt, so one project cannot take the whole provider budget of its lane.
//!
//! The counters live in the [`Cache`] (Redis on AWS, shared by every worker; in process locally):
//! with the cache unreachable the quotas are not enforced (counted as degraded), because a quota
//! protects spend but must not stop the service.

use crate::config::QuotaConfig;
use crate::domain::Tenant;
use crate::ports::{Cache, CacheError};
use std::time::Duration;

const DAY_MS: u64 = 24 * 3600 * 1000;
const MINUTE_MS: u64 = 60 * 1000;

/// The counters' name for a project: the `project_id` alone, or with tenancy the pair (hashed), so
/// one tenant's `project_id` can neither spend nor reveal another tenant's budget.
pub fn scope(tenant: Option<&Tenant>, project: &str) -> String {
    match tenant {
        None => project.to_owned(),
        Some(t) => crate::domain::sha256_hex(format!("{t}\n{project}").as_bytes())[..32].to_owned(),
    }
}

/// The window of `len_ms` that `now_ms` falls in, and how long until it ends.
fn window(now_ms: u64, len_ms: u64) -> (u64, Duration) {
    (now_ms / len_ms, Duration::from_millis(len_ms - now_ms % len_ms))
}

fn day_key(project: &str, day: u64) -> String {
    format!("quota:{{{project}}}:day:{day}")
}

/// Why a quota refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverQuota {
    /// When the window that is full ends.
    pub retry_after: Duration,
}

/// Ingress: whether `project` has used its daily budget (then: until when). Errors mean the cache is
/// unreachable; the caller proceeds.
pub async fn check_daily(
    cache: &dyn Cache,
    config: &QuotaConfig,
    project: &str,
    now_ms: u64,
) -> Result<Result<(), OverQuota>, CacheError> {
    let Some(budget) = config.daily_tokens else { return Ok(Ok(())) };
    let (day, left) = window(now_ms, DAY_MS);
    let used = cache.get(&day_key(project, day)).await?.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok(if used >= budget { Err(OverQuota { retry_after: left }) } else { Ok(()) })
}

/// Worker, before a provider call: counts one request and `tokens` in the project's minute; over a
/// cap, says until when to put the task off.
pub async fn admit(
    cache: &dyn Cache,
    config: &QuotaConfig,
    project: &str,
    tokens: u64,
    now_ms: u64,
) -> Result<Result<(), OverQuota>, CacheError> {
    let (minute, left) = window(now_ms, MINUTE_MS);
    // The counters outlive their minute a little, so a late worker still sees them.
    let ttl = Duration::from_millis(2 * MINUTE_MS);
    if let Some(rpm) = config.rpm
        && cache.add(&format!("quota:{{{project}}}:rpm:{minute}"), 1, ttl).await? > rpm
    {
        return Ok(Err(OverQuota { retry_after: left }));
    }
    if let Some(tpm) = config.tpm {
        let used = cache.add(&format!("quota:{{{project}}}:tpm:{minute}"), tokens, ttl).await?;
        // The first call of a minute always goes: a call estimated above the cap would otherwise
        // never run.
        if used > tpm && used > tokens {
            return Ok(Err(OverQuota { retry_after: left }));
        }
    }
    Ok(Ok(()))
}

/// Worker, after an answer: adds the tokens it used to the project's day.
pub async fn charge(
    cache: &dyn Cache,
    config: &QuotaConfig,
    project: &str,
    tokens: u64,
    now_ms: u64,
) -> Result<(), CacheError> {
    if config.daily_tokens.is_none() {
        return Ok(());
    }
    let (day, left) = window(now_ms, DAY_MS);
    cache.add(&day_key(project, day), tokens, left + Duration::from_secs(3600)).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::embedded::MemoryCache;

    #[tokio::test]
    async fn the_daily_budget_refuses_until_midnight_and_only_its_project() {
        // 2026-11-30 23:00 UTC.
        let now = 1_796_079_600_000;
        let cache = MemoryCache::new(ManualClock::new(now));
        let config = QuotaConfig { daily_tokens: Some(1000), ..Default::default() };
        assert_eq!(check_daily(&cache, &config, "a", now).await.unwrap(), Ok(()));
        charge(&cache, &config, "a", 600, now).await.unwrap();
        assert_eq!(check_daily(&cache, &config, "a", now).await.unwrap(), Ok(()));
        charge(&cache, &config, "a", 400, now).await.unwrap();
        let over = check_daily(&cache, &config, "a", now).await.unwrap().unwrap_err();
        assert_eq!(over.retry_after, Duration::from_secs(3600));
        assert_eq!(check_daily(&cache, &config, "b", now).await.unwrap(), Ok(()));
        // A new day starts from zero.
        assert_eq!(check_daily(&cache, &config, "a", now + 3_600_000).await.unwrap(), Ok(()));
        // No budget, no refusal.
        assert_eq!(check_daily(&cache, &QuotaConfig::default(), "a", now).await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn minute_caps_put_calls_off_to_the_next_minute() {
        let now = 1_796_079_630_000; // 30 s into a minute
        let cache = MemoryCache::new(ManualClock::new(now));
        let config = QuotaConfig { rpm: Some(2), tpm: Some(1000), ..Default::default() };
        assert_eq!(admit(&cache, &config, "a", 100, now).await.unwrap(), Ok(()));
        assert_eq!(admit(&cache, &config, "a", 100, now).await.unwrap(), Ok(()));
        let over = admit(&cache, &config, "a", 100, now).await.unwrap().unwrap_err();
        assert_eq!(over.retry_after, Duration::from_secs(30));
        assert_eq!(admit(&cache, &config, "b", 900, now).await.unwrap(), Ok(()));
        assert!(admit(&cache, &config, "b", 200, now).await.unwrap().is_err(), "tokens cap");
        assert_eq!(admit(&cache, &config, "a", 100, now + 30_000).await.unwrap(), Ok(()));
        // A call estimated above the cap runs as the first of its minute.
        assert_eq!(admit(&cache, &config, "c", 5_000, now).await.unwrap(), Ok(()));
        assert!(admit(&cache, &config, "c", 1, now).await.unwrap().is_err());
        // Tenants' counters are apart, even for the same project_id.
        let t = |s: &str| Tenant::parse(s).unwrap();
        assert_ne!(scope(Some(&t("team-a")), "p"), scope(Some(&t("team-b")), "p"));
        assert_eq!(scope(None, "p"), "p");
    }
}
