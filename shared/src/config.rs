//! Tunables of the core with their defaults (see docs/ARCHITECTURE.md: Lease, fence and ack; Task lifecycle) and the checks that keep them coherent.
//! Binaries build these once at start; tests shrink the durations to milliseconds.

use crate::domain::Lane;
use crate::domain::tier::TierSetting;
use std::time::Duration;

/// Errors in configuration: always permanent, always naming the setting.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
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
    /// TTL of claimed and terminal records (at least a pending record's, see [`pending_ttl_for`]).
    pub record_ttl_secs: u64,
    /// TTL of the hot-cache entry of a completed task.
    pub result_cache_ttl: Duration,
    /// What each lane allows a task, indexed by [`Lane::index`].
    pub lanes: [LanePolicy; 3],
    /// The tenants' and projects' budgets, reserved before each call ([`crate::quota`]).
    pub quota: QuotaConfig,
}

/// What a lane allows one task before it ends `FAILED`. Waiting (throttling, a lock held elsewhere, a
/// deadline hand-back) uses none of it; only provider calls that fail do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LanePolicy {
    /// Failed provider calls allowed (the task fails at this count).
    pub attempt_budget: u32,
    /// Oldest a task may be (from its submission) when a worker starts it; older ones fail unrun.
    pub max_age: Duration,
    /// Completion token cap of one call (a task's `params.max_tokens` may lower it, never raise it).
    pub max_tokens: u32,
    /// The service tier its calls are made at ([`crate::domain::tier`]).
    pub tier: TierSetting,
    /// How long after it was enqueued its work may finish, for [`TierSetting::Auto`].
    pub deadline: Option<Duration>,
    /// How often a run saves its text so far, so a takeover continues it
    /// ([`crate::tasks::checkpoint`]); `None` saves nothing.
    pub checkpoint_every: Option<Duration>,
}

impl LanePolicy {
    /// The documented defaults: interactive 5 attempts / 1 h / 1,024 tokens / `sync`; synthesis 5
    /// attempts / 24 h / 16,384 tokens / `sync`, its text saved every 5 s; commits 5 attempts / 7 days (its calls size their
    /// own token cap) / `auto` with a 6 h deadline.
    pub const fn default_for(lane: Lane) -> Self {
        match lane {
            Lane::Interactive => Self {
                attempt_budget: 5,
                max_age: Duration::from_secs(3600),
                max_tokens: 1024,
                tier: TierSetting::Sync,
                deadline: None,
                checkpoint_every: None,
            },
            Lane::Synthesis => Self {
                attempt_budget: 5,
                max_age: Duration::from_secs(24 * 3600),
                max_tokens: 16_384,
                tier: TierSetting::Sync,
                deadline: None,
                checkpoint_every: Some(Duration::from_secs(5)),
            },
            Lane::Commits => Self {
                attempt_budget: 5,
                max_age: Duration::from_secs(7 * 24 * 3600),
                max_tokens: 4096,
                tier: TierSetting::Auto,
                deadline: Some(Duration::from_secs(6 * 3600)),
                checkpoint_every: None,
            },
        }
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(900),
            lock_jitter_max: Duration::from_secs(1),
            // At least a pending record's TTL: a claim never shortens the life of a record whose
            // message can still come back.
            record_ttl_secs: 15 * 24 * 3600,
            result_cache_ttl: Duration::from_secs(3600),
            lanes: Lane::ALL.map(LanePolicy::default_for),
            quota: Default::default(),
        }
    }
}

impl WorkerConfig {
    /// The policy of `lane`.
    pub fn lane(&self, lane: Lane) -> &LanePolicy {
        &self.lanes[lane.index()]
    }

    /// The same settings with each lane's policy read from `LANES_ATTEMPTS_<LANE>`,
    /// `LANES_MAX_AGE_SECS_<LANE>` and `LANES_MAX_TOKENS_<LANE>` (`<LANE>` = `INTERACTIVE`,
    /// `SYNTHESIS`, `COMMITS`), where set, and the tenants' and projects' budgets
    /// ([`QuotaConfig::from_env`]).
    pub fn lanes_from_env(mut self) -> Result<Self, ConfigError> {
        self.quota = QuotaConfig::from_env()?;
        const NAMES: [[&str; 3]; 3] = [
            ["LANES_ATTEMPTS_INTERACTIVE", "LANES_MAX_AGE_SECS_INTERACTIVE", "LANES_MAX_TOKENS_INTERACTIVE"],
            ["LANES_ATTEMPTS_SYNTHESIS", "LANES_MAX_AGE_SECS_SYNTHESIS", "LANES_MAX_TOKENS_SYNTHESIS"],
            ["LANES_ATTEMPTS_COMMITS", "LANES_MAX_AGE_SECS_COMMITS", "LANES_MAX_TOKENS_COMMITS"],
        ];
        for (policy, [attempts, age, tokens]) in self.lanes.iter_mut().zip(NAMES) {
            if let Some(n) = env_number(attempts, 1, 1000)? {
                policy.attempt_budget = n as u32;
            }
            if let Some(n) = env_number(age, 1, 14 * 24 * 3600)? {
                policy.max_age = Duration::from_secs(n);
            }
            if let Some(n) = env_number(tokens, 1, crate::domain::MAX_PARAM_TOKENS as u64)? {
                policy.max_tokens = n as u32;
            }
        }
        self.quota.completion_caps = self.lanes.map(|l| l.max_tokens);
        self.tiers_from_env()
    }

    /// Each lane's tier and deadline from `LANES_TIER_<LANE>` (`sync`, `flex`, `auto` or `priority`) and
    /// `LANES_DEADLINE_SECS_<LANE>` (0 for none), and how often a synthesis run saves its text from
    /// `LANES_CHECKPOINT_SECS` (0 for never), where set.
    fn tiers_from_env(mut self) -> Result<Self, ConfigError> {
        const DEADLINES: [&str; 3] = [
            "LANES_DEADLINE_SECS_INTERACTIVE",
            "LANES_DEADLINE_SECS_SYNTHESIS",
            "LANES_DEADLINE_SECS_COMMITS",
        ];
        let tiers = lane_tiers_from_env()?;
        for ((policy, tier), deadline) in self.lanes.iter_mut().zip(tiers).zip(DEADLINES) {
            if let Some(tier) = tier {
                policy.tier = tier;
            }
            if let Some(n) = env_number(deadline, 0, 14 * 24 * 3600)? {
                policy.deadline = (n > 0).then(|| Duration::from_secs(n));
            }
        }
        if let Some(n) = env_number("LANES_CHECKPOINT_SECS", 0, 3600)? {
            self.lanes[Lane::Synthesis.index()].checkpoint_every = (n > 0).then(|| Duration::from_secs(n));
        }
        Ok(self)
    }

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
    /// TTL of a `PENDING` record: at least the queues' retention, so a record never expires while
    /// its message can still be delivered.
    pub pending_ttl_secs: u64,
    /// TTL of the hot-cache entry refilled on a duplicate of a completed task.
    pub result_cache_ttl: Duration,
    /// `Retry-After` seconds on a 503.
    pub retry_after_secs: u64,
    /// The tenants' and projects' budgets (a new task holds its share of the day here).
    pub quota: QuotaConfig,
    /// Whether every request must carry an authenticated [`crate::tasks::tenant::Tenant`].
    pub tenancy: bool,
}

impl Default for IngressConfig {
    fn default() -> Self {
        Self {
            enqueue_grace: Duration::from_secs(60),
            pending_ttl_secs: pending_ttl_for(DEFAULT_QUEUE_RETENTION_SECS),
            result_cache_ttl: Duration::from_secs(3600),
            retry_after_secs: 2,
            quota: Default::default(),
            tenancy: false,
        }
    }
}

/// The queues' message retention when `LANES_QUEUE_RETENTION_SECS` is unset: SQS's maximum, 14 days,
/// as the template sets it.
pub const DEFAULT_QUEUE_RETENTION_SECS: u64 = 14 * 24 * 3600;

/// A `PENDING` record outlives its message by an hour: SQS counts retention from the first send.
pub const fn pending_ttl_for(retention_secs: u64) -> u64 {
    retention_secs + 3600
}

impl IngressConfig {
    /// The defaults, with the record TTL from `LANES_QUEUE_RETENTION_SECS` where set.
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut config = Self::default();
        if let Some(retention) = env_number("LANES_QUEUE_RETENTION_SECS", 60, 14 * 24 * 3600)? {
            config.pending_ttl_secs = pending_ttl_for(retention);
        }
        // The lanes' completion caps with the budgets: a new task's hold counts its lane's cap.
        config.quota = WorkerConfig::default().lanes_from_env()?.quota;
        Ok(config)
    }
}

/// An optional whole number within `min..=max`, named in the error.
pub fn env_number(name: &'static str, min: u64, max: u64) -> Result<Option<u64>, ConfigError> {
    let Some(v) = optional_env(name) else { return Ok(None) };
    match v.trim().parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
        _ => Err(ConfigError::Invalid {
            name,
            reason: format!("`{v}` is not a whole number in {min}..={max}"),
        }),
    }
}

/// Each lane's `LANES_TIER_<LANE>`, where set (ingress prices a new task's hold by it).
pub fn lane_tiers_from_env() -> Result<[Option<TierSetting>; 3], ConfigError> {
    const NAMES: [&str; 3] = ["LANES_TIER_INTERACTIVE", "LANES_TIER_SYNTHESIS", "LANES_TIER_COMMITS"];
    let mut tiers = [None; 3];
    for (tier, name) in tiers.iter_mut().zip(NAMES) {
        if let Some(v) = optional_env(name) {
            let setting = TierSetting::parse(&v).ok_or_else(|| ConfigError::Invalid {
                name,
                reason: format!("`{v}`; expected sync, flex, auto, priority or batch"),
            })?;
            // A provider batch is collected by the commits flow's collector; a task's answer is
            // awaited by its worker, so a task lane takes the synchronous tiers only.
            if setting == TierSetting::Batch && name != "LANES_TIER_COMMITS" {
                return Err(ConfigError::Invalid {
                    name,
                    reason: "`batch` is taken by the commits lane only; use flex or auto".into(),
                });
            }
            *tier = Some(setting);
        }
    }
    Ok(tiers)
}

/// An optional variable: unset and empty (CloudFormation's way of leaving a parameter out) are both
/// `None`.
pub fn optional_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A required variable, named in the error when missing or empty.
pub fn require_env(name: &'static str) -> Result<String, ConfigError> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty()).ok_or(ConfigError::Missing(name))
}

/// The budgets of every tenant and of every project inside it ([`crate::quota`]), and what a token
/// may cost on each lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaConfig {
    /// Each tenant's limits (with tenancy off, the one tenant's).
    pub tenant: crate::domain::quota::Limits,
    /// Each project's limits, inside its tenant's.
    pub project: crate::domain::quota::Limits,
    /// Per lane, the dearest price of its routes in micro-dollars per million tokens (the larger of
    /// input and output): what a call's USD is reserved at. Zero where no route has a known price.
    pub usd_per_mtok: [u64; 3],
    /// Commits each repository may have summarized per UTC day (the commits lane's budget).
    pub repo_daily_commits: Option<u64>,
    /// Per lane, the completion cap a task's estimate counts ([`LanePolicy::max_tokens`]).
    pub completion_caps: [u32; 3],
    /// Token-weighted fairness inside the task lanes ([`crate::domain::token_share`]).
    pub share: ShareConfig,
    /// Most tasks of one tenant running at once, per task lane (`LANES_TENANT_CONCURRENCY`).
    pub concurrency: crate::domain::concurrency::Caps,
}

/// Token-weighted fairness: on or off, its windows, and each tenant's weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareConfig {
    /// Whether a group over its token share is put off (`LANES_TOKEN_FAIRNESS=off` turns it off,
    /// leaving the fair queue's task-count order).
    pub on: bool,
    /// The windows.
    pub settings: crate::domain::token_share::ShareSettings,
    /// Weights per tenant, or per project with tenancy off (`LANES_TENANT_WEIGHTS`). Read once per
    /// process and kept for its life.
    pub weights: &'static crate::domain::token_share::Weights,
}

static NO_WEIGHTS: crate::domain::token_share::Weights = crate::domain::token_share::Weights::none();

impl Default for ShareConfig {
    fn default() -> Self {
        Self { on: true, settings: Default::default(), weights: &NO_WEIGHTS }
    }
}

impl ShareConfig {
    /// Reads `LANES_TOKEN_FAIRNESS` (`on`, the default, or `off`) and `LANES_TENANT_WEIGHTS`
    /// (`name=weight,…`, each weight 1 to 1000).
    pub fn from_env() -> Result<Self, ConfigError> {
        let on = match optional_env("LANES_TOKEN_FAIRNESS").as_deref() {
            None | Some("on") => true,
            Some("off") => false,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "LANES_TOKEN_FAIRNESS",
                    reason: format!("`{other}`; expected on or off"),
                });
            }
        };
        let weights = match optional_env("LANES_TENANT_WEIGHTS") {
            None => &NO_WEIGHTS,
            Some(spec) => {
                let w = crate::domain::token_share::Weights::parse(&spec)
                    .map_err(|reason| ConfigError::Invalid { name: "LANES_TENANT_WEIGHTS", reason })?;
                // Configuration lives as long as the process: one small table, leaked once.
                Box::leak(Box::new(w))
            }
        };
        Ok(Self { on, weights, ..Self::default() })
    }
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self {
            tenant: Default::default(),
            project: Default::default(),
            usd_per_mtok: [0; 3],
            repo_daily_commits: None,
            completion_caps: Lane::ALL.map(|l| LanePolicy::default_for(l).max_tokens),
            share: ShareConfig::default(),
            concurrency: crate::domain::concurrency::Caps::default(),
        }
    }
}

impl QuotaConfig {
    /// Reads `LANES_TENANT_{RPM,TPM,DAILY_TOKENS,DAILY_USD}`, the same four `LANES_PROJECT_*`,
    /// `LANES_REPO_DAILY_COMMITS` and `LANES_TENANT_CONCURRENCY` (each optional). The routes' prices are [`crate::quota`]'s to add.
    pub fn from_env() -> Result<Self, ConfigError> {
        Ok(Self {
            tenant: limits_from_env([
                "LANES_TENANT_RPM",
                "LANES_TENANT_TPM",
                "LANES_TENANT_DAILY_TOKENS",
                "LANES_TENANT_DAILY_USD",
            ])?,
            project: limits_from_env([
                "LANES_PROJECT_RPM",
                "LANES_PROJECT_TPM",
                "LANES_PROJECT_DAILY_TOKENS",
                "LANES_PROJECT_DAILY_USD",
            ])?,
            repo_daily_commits: env_number("LANES_REPO_DAILY_COMMITS", 1, 100_000_000)?,
            share: ShareConfig::from_env()?,
            concurrency: match optional_env("LANES_TENANT_CONCURRENCY") {
                None => crate::domain::concurrency::Caps::default(),
                Some(spec) => crate::domain::concurrency::Caps::parse(&spec)
                    .map_err(|reason| ConfigError::Invalid { name: "LANES_TENANT_CONCURRENCY", reason })?,
            },
            ..Self::default()
        })
    }
}

fn limits_from_env(
    [rpm, tpm, tokens, usd]: [&'static str; 4],
) -> Result<crate::domain::quota::Limits, ConfigError> {
    Ok(crate::domain::quota::Limits {
        rpm: env_number(rpm, 1, 1_000_000)?,
        tpm: env_number(tpm, 1, u64::MAX / 4)?,
        daily_tokens: env_number(tokens, 1, u64::MAX / 4)?,
        daily_usd_micros: env_usd(usd)?,
    })
}

/// An optional amount of USD (a decimal, at least a micro-dollar), in micro-dollars.
fn env_usd(name: &'static str) -> Result<Option<u64>, ConfigError> {
    let Some(v) = optional_env(name) else { return Ok(None) };
    match v.trim().parse::<f64>() {
        Ok(usd) if usd.is_finite() && (0.000_001..=1e12).contains(&usd) => {
            Ok(Some((usd * 1e6).round() as u64))
        }
        _ => Err(ConfigError::Invalid {
            name,
            reason: format!("`{v}` is not an amount of USD between 0.000001 and 1e12"),
        }),
    }
}

/// A redrive policy known from the environment (`LANES_MAX_RECEIVE_COUNT` and
/// `LANES_DLQ_URL_{INTERACTIVE,SYNTHESIS,COMMITS}`, set by the template from the same values it
/// gives the queues). Without it, a consumer reads its queue's policy from SQS when it starts: two
/// more requests, and a TLS handshake, in every worker's cold start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redrive {
    /// `maxReceiveCount` of every lane queue.
    pub max_receive_count: u32,
    /// The DLQ URL per lane.
    pub dlq_urls: [String; 3],
}

impl Redrive {
    /// `Some` when all four variables are set, `None` when none is; a partial set is an error that
    /// names what is missing, and a count that is not a positive number one that names it too.
    pub fn from_env() -> Result<Option<Self>, ConfigError> {
        Self::parse(optional_env("LANES_MAX_RECEIVE_COUNT"), DLQ_URL_VARS.map(optional_env))
    }

    /// [`Self::from_env`] on the variables' values.
    pub fn parse(count: Option<String>, dlqs: [Option<String>; 3]) -> Result<Option<Self>, ConfigError> {
        if count.is_none() && dlqs.iter().all(Option::is_none) {
            return Ok(None);
        }
        let count = count.ok_or(ConfigError::Missing("LANES_MAX_RECEIVE_COUNT"))?;
        let max_receive_count =
            count.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| ConfigError::Invalid {
                name: "LANES_MAX_RECEIVE_COUNT",
                reason: format!("{count:?} is not a positive count"),
            })?;
        let mut urls = Vec::with_capacity(3);
        for (var, url) in DLQ_URL_VARS.into_iter().zip(dlqs) {
            urls.push(url.ok_or(ConfigError::Missing(var))?);
        }
        let dlq_urls: [String; 3] = urls.try_into().map_err(|_| ConfigError::Missing("LANES_DLQ_URL_*"))?;
        Ok(Some(Self { max_receive_count, dlq_urls }))
    }
}

const DLQ_URL_VARS: [&str; 3] =
    ["LANES_DLQ_URL_INTERACTIVE", "LANES_DLQ_URL_SYNTHESIS", "LANES_DLQ_URL_COMMITS"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_heartbeat_is_rejected() {
        assert!(WorkerConfig::default().validate().is_ok());
        let bad = WorkerConfig { renew_interval: Duration::from_secs(10), ..WorkerConfig::default() };
        assert!(matches!(bad.validate(), Err(ConfigError::Invalid { name: "renew_interval", .. })));
    }

    #[test]
    fn records_outlive_the_queue_retention() {
        assert!(IngressConfig::default().pending_ttl_secs > DEFAULT_QUEUE_RETENTION_SECS);
        assert!(WorkerConfig::default().record_ttl_secs >= IngressConfig::default().pending_ttl_secs);
        let c = WorkerConfig::default();
        assert_eq!(c.lane(Lane::Synthesis).max_tokens, 16_384);
        assert!(c.lane(Lane::Interactive).max_age < c.lane(Lane::Synthesis).max_age);
    }
}
