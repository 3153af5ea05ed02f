//! Budgets per tenant and per project, reserved before each provider call and corrected after it.
//!
//! The limits (all optional; [`QuotaConfig::from_env`]) are per **authenticated tenant**
//! (`LANES_TENANT_*`; with tenancy off every caller is one tenant) and, inside it, per project
//! (`LANES_PROJECT_*`): requests and estimated tokens per calendar minute, tokens and USD per UTC
//! day. The counters and the fitting rule are [`crate::domain::quota`]'s.
//!
//! - **Before a call** a worker reserves the call's estimate (prompt plus completion cap, and USD at
//!   the dearest price of the lane's routes) in every counter in one atomic step
//!   ([`Cache::reserve`]: a Lua script on Redis, one lock in process). A parallel burst therefore
//!   sees its own reservations, and rotating `project_id`s still draws from the tenant's counters:
//!   no budget is passed by more than one call's estimate. Over a budget, the task is put off to the
//!   window's end as a wait, never an attempt.
//! - **After it** the answer's usage corrects the tokens and USD ([`settle`]); a call that failed
//!   gives its tokens back, and keeps its request.
//! - **At ingress** a new task of a tenant or project whose day is spent is refused `429` and stores
//!   nothing ([`check_daily`]); a duplicate of an accepted task is still answered.
//!
//! The counters live in the cache (Redis on AWS, shared by every worker; in process locally). With
//! the cache unreachable budgets are not enforced (counted as degraded): a budget protects spend but
//! must not stop the service.

use crate::config::{ConfigError, QuotaConfig};
use crate::domain::quota::{Budget, Cost, Owner, Planned, Scopes, corrections, plan};
use crate::domain::{Lane, Tenant};
use crate::ports::{Cache, CacheError};
use std::time::Duration;

/// Why a budget refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverQuota {
    /// When the window that is full ends.
    pub retry_after: Duration,
    /// Whose budget it is.
    pub owner: Owner,
    /// Which budget.
    pub budget: Budget,
}

impl OverQuota {
    /// The refusal in words, naming the project where it is the project's budget.
    pub fn describe(&self, project_id: &str) -> String {
        match self.owner {
            Owner::Tenant => format!("the tenant is over its {}", self.budget.describe()),
            Owner::Project => format!("project `{project_id}` is over its {}", self.budget.describe()),
        }
    }
}

/// The scopes of a task: its tenant's and its project's counters.
pub fn scopes(tenant: Option<&Tenant>, project_id: &str) -> Scopes {
    Scopes::of(tenant, project_id)
}

/// What a call estimated at `tokens` on `lane` reserves: the tokens, and micro-dollars at the
/// dearest price of the lane's routes, rounded up.
pub fn estimate(config: &QuotaConfig, lane: Lane, tokens: u64) -> Cost {
    Cost { tokens, usd_micros: micros(config.usd_per_mtok[lane.index()], tokens) }
}

/// Micro-dollars of `tokens` at `per_mtok` micro-dollars per million tokens, rounded up.
fn micros(per_mtok: u64, tokens: u64) -> u64 {
    (u128::from(per_mtok) * u128::from(tokens)).div_ceil(1_000_000).min(u128::from(u64::MAX)) as u64
}

/// What a call used: its tokens, and its cost when its model's price is known (else the estimate's
/// USD stands).
pub fn used(tokens: u64, cost_usd: Option<f64>, reserved: Cost) -> Cost {
    let usd_micros = cost_usd.map_or(reserved.usd_micros, |usd| (usd * 1e6).ceil().max(0.0) as u64);
    Cost { tokens, usd_micros }
}

/// `config` with each lane's [`QuotaConfig::usd_per_mtok`]: the dearest price, input or output, of
/// the lane's routes (`LANES_ROUTES_<LANE>`) in the price table (`LANES_LLM_PRICES`). A route whose
/// model has no price reserves no USD.
pub fn priced_by_routes(mut config: QuotaConfig) -> Result<QuotaConfig, ConfigError> {
    let routes = crate::llm::route::routes_from_env()?;
    // The table first, so `LANES_LLM_PRICES` is read before anything prices with the defaults.
    crate::llm::price::load_from_env()?;
    let table = crate::llm::price::prices();
    for lane in Lane::ALL {
        let dearest = routes[lane.index()].iter().filter_map(|r| table.price(&r.model));
        config.usd_per_mtok[lane.index()] =
            dearest.map(|p| (p.input.max(p.output) * 1e6).ceil() as u64).max().unwrap_or(0);
    }
    Ok(config)
}

/// Ingress: whether the tenant or the project has spent a day's budget (then: whose, and until
/// when). Reads only; the worker's reservation is what holds the budget under concurrency. Errors
/// mean the cache is unreachable; the caller proceeds.
pub async fn check_daily(
    cache: &dyn Cache,
    config: &QuotaConfig,
    scopes: &Scopes,
    now_ms: u64,
) -> Result<Result<(), OverQuota>, CacheError> {
    for p in plan(&config.tenant, &config.project, scopes, Cost::default(), now_ms) {
        let Some(limit) = p.charge.limit.filter(|_| p.budget.is_daily()) else { continue };
        let used = cache.get(&p.charge.key).await?.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        if used >= limit {
            return Ok(Err(OverQuota { retry_after: p.window_left, owner: p.owner, budget: p.budget }));
        }
    }
    Ok(Ok(()))
}

/// One call's reservation, to be [`settle`]d once the call has answered or failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    planned: Vec<Planned>,
    cost: Cost,
}

impl Reservation {
    /// What was reserved.
    pub fn cost(&self) -> Cost {
        self.cost
    }
}

/// Worker, before a provider call: reserves `cost` in every counter of `scopes`, or in none and says
/// which budget refused and until when.
pub async fn reserve(
    cache: &dyn Cache,
    config: &QuotaConfig,
    scopes: &Scopes,
    cost: Cost,
    now_ms: u64,
) -> Result<Result<Reservation, OverQuota>, CacheError> {
    let planned = plan(&config.tenant, &config.project, scopes, cost, now_ms);
    if planned.is_empty() {
        return Ok(Ok(Reservation { planned, cost }));
    }
    let charges: Vec<_> = planned.iter().map(|p| p.charge.clone()).collect();
    Ok(match cache.reserve(&charges).await? {
        None => Ok(Reservation { planned, cost }),
        Some(i) => {
            let p = &planned[i];
            Err(OverQuota { retry_after: p.window_left, owner: p.owner, budget: p.budget })
        }
    })
}

/// Worker, after the call: corrects the reservation to what the call `used` (nothing, for a call
/// that failed).
pub async fn settle(cache: &dyn Cache, reservation: &Reservation, used: Cost) -> Result<(), CacheError> {
    let fixes = corrections(&reservation.planned, reservation.cost, used);
    if fixes.is_empty() {
        return Ok(());
    }
    cache.reserve(&fixes).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::domain::quota::Limits;
    use crate::embedded::MemoryCache;
    use std::sync::Arc;

    // 2026-11-30 23:00:30 UTC.
    const NOW: u64 = 1_796_079_630_000;

    fn tenant(s: &str) -> Tenant {
        Tenant::parse(s).unwrap()
    }

    #[tokio::test]
    async fn a_spent_day_refuses_until_midnight_and_only_its_scope() {
        let cache = MemoryCache::new(ManualClock::new(NOW));
        let config = QuotaConfig {
            tenant: Limits { daily_tokens: Some(1000), ..Default::default() },
            ..Default::default()
        };
        let a = scopes(Some(&tenant("a")), "p");
        assert_eq!(check_daily(&cache, &config, &a, NOW).await.unwrap(), Ok(()));
        let r =
            reserve(&cache, &config, &a, Cost { tokens: 1000, usd_micros: 0 }, NOW).await.unwrap().unwrap();
        let over = check_daily(&cache, &config, &a, NOW).await.unwrap().unwrap_err();
        assert_eq!((over.owner, over.budget), (Owner::Tenant, Budget::DailyTokens));
        assert_eq!(over.retry_after, Duration::from_secs(3570));
        assert!(check_daily(&cache, &config, &scopes(Some(&tenant("a")), "q"), NOW).await.unwrap().is_err());
        assert_eq!(
            check_daily(&cache, &config, &scopes(Some(&tenant("b")), "p"), NOW).await.unwrap(),
            Ok(())
        );
        // The answer used less: the day has room again.
        settle(&cache, &r, Cost { tokens: 400, usd_micros: 0 }).await.unwrap();
        assert_eq!(check_daily(&cache, &config, &a, NOW).await.unwrap(), Ok(()));
        assert_eq!(check_daily(&cache, &config, &a, NOW + 3_600_000).await.unwrap(), Ok(()), "a new day");
    }

    #[tokio::test]
    async fn minute_caps_put_calls_off_to_the_next_minute() {
        let cache = MemoryCache::new(ManualClock::new(NOW));
        let config = QuotaConfig {
            project: Limits { rpm: Some(2), tpm: Some(1000), ..Default::default() },
            ..Default::default()
        };
        let cost = |tokens| Cost { tokens, usd_micros: 0 };
        let s = |p| scopes(None, p);
        assert!(reserve(&cache, &config, &s("a"), cost(100), NOW).await.unwrap().is_ok());
        assert!(reserve(&cache, &config, &s("a"), cost(100), NOW).await.unwrap().is_ok());
        let over = reserve(&cache, &config, &s("a"), cost(100), NOW).await.unwrap().unwrap_err();
        assert_eq!((over.retry_after, over.budget), (Duration::from_secs(30), Budget::Rpm));
        assert!(reserve(&cache, &config, &s("b"), cost(900), NOW).await.unwrap().is_ok());
        let over = reserve(&cache, &config, &s("b"), cost(200), NOW).await.unwrap().unwrap_err();
        assert_eq!((over.owner, over.budget), (Owner::Project, Budget::Tpm));
        // Refused means nothing was charged: b's request count is still 1.
        assert!(reserve(&cache, &config, &s("b"), cost(100), NOW).await.unwrap().is_ok());
        assert!(reserve(&cache, &config, &s("a"), cost(100), NOW + 30_000).await.unwrap().is_ok());
        // A call estimated above the cap runs as the first of its minute.
        assert!(reserve(&cache, &config, &s("c"), cost(5_000), NOW).await.unwrap().is_ok());
        assert!(reserve(&cache, &config, &s("c"), cost(1), NOW).await.unwrap().is_err());
    }

    /// A parallel burst of calls, each from a new project id, spends exactly the tenant's budget.
    #[tokio::test]
    async fn a_burst_over_rotating_projects_spends_exactly_the_tenants_budget() {
        let cache = Arc::new(MemoryCache::new(ManualClock::new(NOW)));
        let config = QuotaConfig {
            tenant: Limits {
                daily_tokens: Some(1_000),
                daily_usd_micros: Some(10_000),
                ..Default::default()
            },
            project: Limits { rpm: Some(100), ..Default::default() },
            usd_per_mtok: [2_000_000; 3],
        };
        let cost = estimate(&config, Lane::Interactive, 100);
        assert_eq!(cost.usd_micros, 200, "100 tokens at $2 per million");
        let calls = (0..50).map(|i| {
            let cache = cache.clone();
            async move {
                let s = scopes(Some(&tenant("a")), &format!("project-{i}"));
                reserve(&*cache, &config, &s, cost, NOW).await.unwrap().is_ok()
            }
        });
        let granted = futures::future::join_all(calls).await.into_iter().filter(|g| *g).count();
        assert_eq!(granted, 10, "1,000 tokens in calls of 100");
    }

    #[test]
    fn usage_is_priced_or_keeps_the_estimate() {
        let reserved = Cost { tokens: 100, usd_micros: 50 };
        assert_eq!(used(30, Some(0.000_012_3), reserved), Cost { tokens: 30, usd_micros: 13 });
        assert_eq!(used(30, None, reserved), Cost { tokens: 30, usd_micros: 50 });
        assert_eq!(micros(15_000_000, 1), 15, "$15 per million is 15 micro-dollars a token");
        assert_eq!(micros(1, 1), 1, "rounded up");
    }
}
