//! Budgets per tenant and per project: a day's share held when a task is accepted, the minute's
//! reserved before each provider call, and both corrected to what the calls used.
//!
//! The limits (all optional; [`QuotaConfig::from_env`]) are per **authenticated tenant**
//! (`LANES_TENANT_*`; with tenancy off every caller is one tenant) and, inside it, per project
//! (`LANES_PROJECT_*`): requests and estimated tokens per calendar minute, tokens and USD per UTC
//! day. The counters and the fitting rule are [`crate::domain::quota`]'s. Every step is one atomic
//! [`Cache::reserve`] (a Lua script on Redis, one lock in process), so a parallel burst sees its
//! own charges, and rotating `project_id`s still draws from the tenant's counters.
//!
//! - **At ingress** a new task holds its estimate (prompt plus completion cap; USD at the dearest
//!   price of the lane's routes) on the day's budgets ([`hold`]), or is refused `429` and stores
//!   nothing: no submission passes a day's budget by more than one task's estimate. (What tasks
//!   then use beyond their estimates, such as a dropped call's charge below, is counted, not
//!   refused: an accepted task runs.) A duplicate of an accepted task is still answered, and its
//!   own hold given back.
//! - **Before each call** the worker reserves the call in the minute's budgets ([`reserve`]); over
//!   one, the task waits for the next minute, never using an attempt. The day is not asked again:
//!   an accepted task runs.
//! - **After each call** its usage corrects the minute and is added to the day the task was
//!   accepted on ([`settle`]); a call that failed gives its tokens back, and keeps its request. A
//!   provider batch's answer, which reserved no minute, is added to that day too ([`day_only`]). A
//!   call dropped mid-way (its client cancelled the task, or its lease was lost) adds its estimate:
//!   the provider may have billed it.
//! - **When the task ends** its hold is given back, once ([`release`]): the day then counts what
//!   was used. A hold that is never released (a worker that crashed after the final write, or
//!   a record the DLQ sweep ends `FAILED`) stays until the day's counters expire, which errs on the
//!   side of spending less.
//!
//! The counters live in the cache (Redis on AWS, shared by every worker; in process locally). With
//! the cache unreachable budgets are not enforced (counted as degraded): a budget protects spend but
//! must not stop the service.

use crate::config::{ConfigError, QuotaConfig};
use crate::domain::quota::{Budget, Charge, Cost, Owner, Planned, Scopes, corrections, plan};
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

/// The [`scopes`] of `record`'s task.
pub fn task_scopes(record: &crate::domain::TaskRecord) -> Scopes {
    scopes(record.request.tenant.as_ref(), &record.request.project_id)
}

/// What a call estimated at `tokens` on `lane` reserves: the tokens, and micro-dollars at the
/// dearest price of the lane's routes, rounded up.
pub fn estimate(config: &QuotaConfig, lane: Lane, tokens: u64) -> Cost {
    Cost { tokens, usd_micros: micros(config.usd_per_mtok[lane.index()], tokens) }
}

/// What a new task holds on the day: the estimate of its call ([`crate::llm::estimate_tokens`]),
/// its completion at its lane's cap.
pub fn task_estimate(config: &QuotaConfig, request: &crate::domain::TaskRequest) -> Cost {
    let lane = request.lane();
    let call = crate::domain::model_call::LlmRequest::for_task(request, config.completion_caps[lane.index()]);
    estimate(config, lane, crate::llm::estimate_tokens(&call))
}

/// Micro-dollars of `tokens` at `per_mtok` micro-dollars per million tokens, rounded up.
fn micros(per_mtok: u64, tokens: u64) -> u64 {
    (u128::from(per_mtok) * u128::from(tokens)).div_ceil(1_000_000).min(u128::from(u64::MAX)) as u64
}

/// What an answered call used: its tokens, and its cost when its model's price is known (else the
/// estimate's USD stands). An answer that reported no usage ([`crate::domain::TokenUsage::reported`]
/// is `None`) is charged as reserved, since settling it at zero would hand the whole reservation
/// back and leave every budget unenforced behind such a provider.
pub fn used(tokens: Option<u64>, cost_usd: Option<f64>, reserved: Cost) -> Cost {
    let Some(tokens) = tokens else {
        return reserved;
    };
    let usd_micros = cost_usd.map_or(reserved.usd_micros, |usd| (usd * 1e6).ceil().max(0.0) as u64);
    Cost { tokens, usd_micros }
}

/// `config` with each lane's [`QuotaConfig::usd_per_mtok`]: the dearest price, input or output, of
/// the lane's routes (`LANES_ROUTES_<LANE>`) in the price table (`LANES_LLM_PRICES`), at the lane's
/// priority price where it calls at `priority` (`LANES_TIER_<LANE>`) and one is known. A route
/// whose model has no price reserves no USD.
pub fn priced_by_routes(mut config: QuotaConfig) -> Result<QuotaConfig, ConfigError> {
    let routes = crate::llm::route::routes_from_env()?;
    let tiers = crate::config::lane_tiers_from_env()?;
    // The table first, so `LANES_LLM_PRICES` is read before anything prices with the defaults.
    crate::llm::price::load_from_env()?;
    let table = crate::llm::price::prices();
    for lane in Lane::ALL {
        let priority = tiers[lane.index()] == Some(crate::domain::tier::TierSetting::Priority);
        config.usd_per_mtok[lane.index()] = dearest(&routes[lane.index()], table, priority);
    }
    Ok(config)
}

/// The dearest price of `routes`, input or output, in micro-USD per million tokens: at `priority`
/// where a route's model has a known priority price.
fn dearest(
    routes: &[crate::llm::route::Route],
    table: &crate::llm::price::PriceTable,
    priority: bool,
) -> u64 {
    let each = routes.iter().filter_map(|r| table.price(&r.model)).map(|p| {
        let (input, output) = p.priority.filter(|_| priority).unwrap_or((p.input, p.output));
        (input.max(output) * 1e6).ceil() as u64
    });
    each.max().unwrap_or(0)
}

/// Ingress, for a new task: holds its estimate on every day's budget of its tenant and project in
/// one atomic step, or holds nothing and says which budget refused and until when. The hold is
/// recorded beside the counters under the submission's `nonce`, for [`release`]. Errors mean the
/// cache is unreachable; the caller proceeds without a hold.
pub async fn hold(
    cache: &dyn Cache,
    config: &QuotaConfig,
    scopes: &Scopes,
    cost: Cost,
    nonce: &str,
    now_ms: u64,
) -> Result<Result<(), OverQuota>, CacheError> {
    let day = daily(plan(&config.tenant, &config.project, scopes, cost, now_ms));
    let Some(first) = day.first() else { return Ok(Ok(())) };
    let keys = scopes.hold_keys(nonce);
    let ttl = first.charge.ttl;
    let record = |key: String, amount: u64| Charge { key, amount: clamp(amount), limit: None, ttl };
    let mut charges: Vec<Charge> = day.iter().map(|p| p.charge.clone()).collect();
    charges.extend([record(keys.tokens, cost.tokens), record(keys.usd, cost.usd_micros)]);
    Ok(match cache.reserve(&charges).await? {
        None => Ok(()),
        // Only the day's charges have limits, and they come first.
        Some(i) => Err(over(&day[i.min(day.len() - 1)])),
    })
}

/// Gives back the hold of the submission `nonce`, made at `held_at_ms` (the record's creation):
/// once a task has ended, or when its submission turned out a duplicate. A second release finds
/// the marker the first one set and changes nothing; a hold whose day has passed is gone already.
pub async fn release(
    cache: &dyn Cache,
    config: &QuotaConfig,
    scopes: &Scopes,
    nonce: &str,
    held_at_ms: u64,
) -> Result<(), CacheError> {
    // No day's budget set: nothing was held, and nothing is asked of the cache.
    if daily(plan(&config.tenant, &config.project, scopes, Cost::default(), held_at_ms)).is_empty() {
        return Ok(());
    }
    let keys = scopes.hold_keys(nonce);
    let amount = |v: Option<String>| v.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let held = Cost {
        tokens: amount(cache.get(&keys.tokens).await?),
        usd_micros: amount(cache.get(&keys.usd).await?),
    };
    if held == Cost::default() {
        return Ok(());
    }
    let day = daily(plan(&config.tenant, &config.project, scopes, held, held_at_ms));
    let Some(first) = day.first() else { return Ok(()) };
    let ttl = first.charge.ttl;
    let back = |key: String, amount: u64| Charge { key, amount: -clamp(amount), limit: None, ttl };
    // The marker first: it refuses a second release (a counter at 1 with a limit of 1), and then
    // nothing is applied.
    let mut charges = vec![Charge { key: keys.released, amount: 1, limit: Some(1), ttl }];
    charges.extend([back(keys.tokens, held.tokens), back(keys.usd, held.usd_micros)]);
    charges.extend(day.iter().map(|p| Charge { amount: -p.charge.amount, limit: None, ..p.charge.clone() }));
    cache.reserve(&charges).await.map(|_| ())
}

/// [`release`] of the hold of `record`'s submission.
pub async fn release_task(
    cache: &dyn Cache,
    config: &QuotaConfig,
    record: &crate::domain::TaskRecord,
) -> Result<(), CacheError> {
    let scopes = task_scopes(record);
    release(cache, config, &scopes, &record.nonce, record.created_at_ms).await
}

/// One call's reservation, to be [`settle`]d once the call has answered or failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The minute's charges, reserved before the call.
    minute: Vec<Planned>,
    /// The day's counters, charged with what the call used once it answered.
    day: Vec<Planned>,
    cost: Cost,
}

impl Reservation {
    /// What was reserved.
    pub fn cost(&self) -> Cost {
        self.cost
    }
}

/// Worker, before a provider call: reserves `cost` in every minute counter of `scopes`, or in none
/// and says which budget refused and until when. The day's budgets are not asked again: an
/// accepted task holds its share of them from ingress ([`hold`]), so it always runs. What the call
/// uses is added to the day the task was accepted on (`accepted_at_ms`, its hold's day), which had
/// room for it: a task accepted before midnight and run after it is not charged to a day that never
/// admitted it. The cost: what such a task spends beyond its hold (retries, an answer over its
/// estimate) lands on a day that admits nothing more, so the next day's budget never sees it.
pub async fn reserve(
    cache: &dyn Cache,
    config: &QuotaConfig,
    scopes: &Scopes,
    cost: Cost,
    now_ms: u64,
    accepted_at_ms: u64,
) -> Result<Result<Reservation, OverQuota>, CacheError> {
    let minute: Vec<_> = plan(&config.tenant, &config.project, scopes, cost, now_ms)
        .into_iter()
        .filter(|p| !p.budget.is_daily())
        .collect();
    let reservation = |minute| Reservation { minute, ..day_only(config, scopes, cost, accepted_at_ms) };
    if minute.is_empty() {
        return Ok(Ok(reservation(minute)));
    }
    let charges: Vec<_> = minute.iter().map(|p| p.charge.clone()).collect();
    Ok(match cache.reserve(&charges).await? {
        None => Ok(reservation(minute)),
        Some(i) => Err(over(&minute[i])),
    })
}

/// The reservation of a call that reserves no minute: a provider batch's request, paced by the
/// batch API rather than by the minute's budgets. Settling it adds what the call used to the day
/// the task was accepted on; an answer that reports no usage is charged the `estimate`.
pub fn day_only(config: &QuotaConfig, scopes: &Scopes, estimate: Cost, accepted_at_ms: u64) -> Reservation {
    let day = daily(plan(&config.tenant, &config.project, scopes, estimate, accepted_at_ms));
    Reservation { minute: Vec::new(), day, cost: estimate }
}

/// Worker, after the call: corrects the minute's reservation to what the call `used`, and adds it
/// to the day's counters (nothing, for a call that failed).
pub async fn settle(cache: &dyn Cache, reservation: &Reservation, used: Cost) -> Result<(), CacheError> {
    let mut fixes = corrections(&reservation.minute, reservation.cost, used);
    fixes.extend(corrections(&reservation.day, Cost::default(), used));
    if fixes.is_empty() {
        return Ok(());
    }
    cache.reserve(&fixes).await.map(|_| ())
}

fn daily(planned: Vec<Planned>) -> Vec<Planned> {
    planned.into_iter().filter(|p| p.budget.is_daily()).collect()
}

fn over(p: &Planned) -> OverQuota {
    OverQuota { retry_after: p.window_left, owner: p.owner, budget: p.budget }
}

fn clamp(n: u64) -> i64 {
    n.min(i64::MAX as u64 / 2) as i64
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_priority_lane_holds_at_the_priority_price_where_one_is_known() {
        let routes = crate::llm::route::parse_routes("V", "openai:gpt-5-mini,openai:gpt-4o").unwrap();
        let table = crate::llm::price::PriceTable::defaults();
        // gpt-4o's list output (10) is the dearest at sync; gpt-5-mini's priority output (3.6) is
        // below it, and gpt-4o has no priority price, so its list price stands.
        assert_eq!(dearest(&routes, &table, false), 10_000_000);
        assert_eq!(dearest(&routes, &table, true), 10_000_000);
        let mini = crate::llm::route::parse_routes("V", "openai:gpt-5-mini").unwrap();
        assert_eq!((dearest(&mini, &table, false), dearest(&mini, &table, true)), (2_000_000, 3_600_000));
    }
    use super::*;
    use crate::clock::ManualClock;
    use crate::domain::quota::Limits;
    use crate::embedded::MemoryCache;
    use std::sync::Arc;

    #[test]
    fn an_answer_that_reports_no_usage_is_charged_as_reserved() {
        let reserved = Cost { tokens: 1_500, usd_micros: 300 };
        let unreported = crate::domain::TokenUsage::default().reported();
        assert_eq!(used(unreported, Some(0.0), reserved), reserved, "unknown usage is not free");
        assert_eq!(used(Some(400), Some(0.0001), reserved), Cost { tokens: 400, usd_micros: 100 });
        assert_eq!(used(Some(400), None, reserved), Cost { tokens: 400, usd_micros: 300 });
    }

    // 2026-11-30 23:00:30 UTC.
    const NOW: u64 = 1_796_079_630_000;

    fn tenant(s: &str) -> Tenant {
        Tenant::parse(s).unwrap()
    }

    /// An empty cache at [`NOW`], a config whose projects have a day of `daily` tokens, and the
    /// scopes of project `p` (no tenant).
    fn project_day(daily: u64) -> (MemoryCache, QuotaConfig, Scopes) {
        let project = Limits { daily_tokens: Some(daily), ..Default::default() };
        (
            MemoryCache::new(ManualClock::new(NOW)),
            QuotaConfig { project, ..Default::default() },
            scopes(None, "p"),
        )
    }

    fn tokens(n: u64) -> Cost {
        Cost { tokens: n, usd_micros: 0 }
    }

    #[tokio::test]
    async fn a_hold_spends_the_day_until_midnight_only_in_its_scope_and_goes_back_once() {
        let cache = MemoryCache::new(ManualClock::new(NOW));
        let config = QuotaConfig {
            tenant: Limits { daily_tokens: Some(1000), ..Default::default() },
            ..Default::default()
        };
        let a = scopes(Some(&tenant("a")), "p");
        assert_eq!(hold(&cache, &config, &a, tokens(1000), "n1", NOW).await.unwrap(), Ok(()));
        let over = hold(&cache, &config, &a, tokens(1), "n2", NOW).await.unwrap().unwrap_err();
        assert_eq!((over.owner, over.budget), (Owner::Tenant, Budget::DailyTokens));
        assert_eq!(over.retry_after, Duration::from_secs(3570), "until midnight UTC");
        let q = scopes(Some(&tenant("a")), "q");
        assert!(hold(&cache, &config, &q, tokens(1), "n3", NOW).await.unwrap().is_err(), "any project");
        let b = scopes(Some(&tenant("b")), "p");
        assert_eq!(hold(&cache, &config, &b, tokens(1), "n4", NOW).await.unwrap(), Ok(()));
        assert_eq!(
            hold(&cache, &config, &a, tokens(1), "n5", NOW + 3_600_000).await.unwrap(),
            Ok(()),
            "a new day"
        );

        // The task ends: its hold goes back, and a second release (another run seeing the end)
        // gives back nothing more.
        release(&cache, &config, &a, "n1", NOW).await.unwrap();
        assert_eq!(hold(&cache, &config, &a, tokens(900), "n6", NOW).await.unwrap(), Ok(()));
        release(&cache, &config, &a, "n1", NOW).await.unwrap();
        assert!(hold(&cache, &config, &a, tokens(200), "n7", NOW).await.unwrap().is_err(), "900 still held");
        // Releasing what was never held (a refused submission) changes nothing.
        release(&cache, &config, &a, "n2", NOW).await.unwrap();
        assert!(hold(&cache, &config, &a, tokens(200), "n8", NOW).await.unwrap().is_err());
    }

    #[tokio::test]
    async fn a_calls_usage_counts_on_the_day_and_the_day_never_refuses_a_call() {
        let (cache, config, p) = project_day(1000);
        assert_eq!(hold(&cache, &config, &p, tokens(1000), "n1", NOW).await.unwrap(), Ok(()));
        // The accepted task's call: the day is full, yet it is not refused.
        let r = reserve(&cache, &config, &p, tokens(1000), NOW, NOW).await.unwrap().unwrap();
        settle(&cache, &r, tokens(400)).await.unwrap();
        release(&cache, &config, &p, "n1", NOW).await.unwrap();
        // The day now counts the 400 used: 600 more fit, 601 do not.
        assert!(hold(&cache, &config, &p, tokens(601), "n2", NOW).await.unwrap().is_err());
        assert_eq!(hold(&cache, &config, &p, tokens(600), "n3", NOW).await.unwrap(), Ok(()));
        // A failed call adds nothing.
        let r = reserve(&cache, &config, &p, tokens(50), NOW, NOW).await.unwrap().unwrap();
        settle(&cache, &r, Cost::default()).await.unwrap();
        release(&cache, &config, &p, "n3", NOW).await.unwrap();
        assert_eq!(hold(&cache, &config, &p, tokens(600), "n4", NOW).await.unwrap(), Ok(()));
    }

    /// Tasks accepted just before midnight and run just after it are charged to the day that
    /// accepted them: the next day, which admitted its own, counts only its own.
    #[tokio::test]
    async fn a_call_after_midnight_counts_on_the_day_its_task_was_accepted() {
        let (cache, config, p) = project_day(1000);
        let (late, next) = (NOW + 3_569_000, NOW + 3_571_000); // 23:59:59 and 00:00:01
        let mut accepted = Vec::new();
        for (at, day) in [(late, "d"), (next, "e")] {
            for i in 0..10 {
                let nonce = format!("{day}{i}");
                assert_eq!(hold(&cache, &config, &p, tokens(100), &nonce, at).await.unwrap(), Ok(()));
                accepted.push((nonce, at));
            }
            assert!(
                hold(&cache, &config, &p, tokens(1), "full", at).await.unwrap().is_err(),
                "{day} is full"
            );
        }
        // All twenty run after midnight, each using 50 of its 100.
        for (nonce, at) in &accepted {
            let r = reserve(&cache, &config, &p, tokens(100), next, *at).await.unwrap().unwrap();
            settle(&cache, &r, tokens(50)).await.unwrap();
            release(&cache, &config, &p, nonce, *at).await.unwrap();
        }
        // The new day counts its own ten's 500: 500 more fit, 501 do not.
        assert!(hold(&cache, &config, &p, tokens(501), "over", next).await.unwrap().is_err());
        assert_eq!(hold(&cache, &config, &p, tokens(500), "fits", next).await.unwrap(), Ok(()));
    }

    /// A provider batch's answer reserves no minute, yet counts on the day, at the estimate when
    /// it reports no usage.
    #[tokio::test]
    async fn a_batch_answer_counts_on_the_day() {
        let (cache, mut config, p) = project_day(1000);
        config.project.tpm = Some(10);
        assert_eq!(hold(&cache, &config, &p, tokens(600), "n1", NOW).await.unwrap(), Ok(()));
        let r = day_only(&config, &p, tokens(600), NOW);
        settle(&cache, &r, used(Some(400), None, r.cost())).await.unwrap();
        release(&cache, &config, &p, "n1", NOW).await.unwrap();
        assert!(hold(&cache, &config, &p, tokens(601), "n2", NOW).await.unwrap().is_err(), "400 used");
        assert_eq!(hold(&cache, &config, &p, tokens(600), "n3", NOW).await.unwrap(), Ok(()));
        let r = day_only(&config, &p, tokens(600), NOW);
        settle(&cache, &r, used(None, None, r.cost())).await.unwrap();
        release(&cache, &config, &p, "n3", NOW).await.unwrap();
        assert!(hold(&cache, &config, &p, tokens(1), "n4", NOW).await.unwrap().is_err(), "unreported: 600");
        // The minute's budget was never asked.
        assert!(reserve(&cache, &config, &p, tokens(10), NOW, NOW).await.unwrap().is_ok());
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
        assert!(reserve(&cache, &config, &s("a"), cost(100), NOW, NOW).await.unwrap().is_ok());
        assert!(reserve(&cache, &config, &s("a"), cost(100), NOW, NOW).await.unwrap().is_ok());
        let over = reserve(&cache, &config, &s("a"), cost(100), NOW, NOW).await.unwrap().unwrap_err();
        assert_eq!((over.retry_after, over.budget), (Duration::from_secs(30), Budget::Rpm));
        assert!(reserve(&cache, &config, &s("b"), cost(900), NOW, NOW).await.unwrap().is_ok());
        let over = reserve(&cache, &config, &s("b"), cost(200), NOW, NOW).await.unwrap().unwrap_err();
        assert_eq!((over.owner, over.budget), (Owner::Project, Budget::Tpm));
        // Refused means nothing was charged: b's request count is still 1.
        assert!(reserve(&cache, &config, &s("b"), cost(100), NOW, NOW).await.unwrap().is_ok());
        assert!(
            reserve(&cache, &config, &s("a"), cost(100), NOW + 30_000, NOW + 30_000).await.unwrap().is_ok()
        );
        // A call estimated above the cap runs as the first of its minute.
        assert!(reserve(&cache, &config, &s("c"), cost(5_000), NOW, NOW).await.unwrap().is_ok());
        assert!(reserve(&cache, &config, &s("c"), cost(1), NOW, NOW).await.unwrap().is_err());
    }

    /// A parallel burst of new tasks, each under a new project id, holds exactly the tenant's day.
    #[tokio::test]
    async fn a_burst_of_new_tasks_over_rotating_projects_holds_exactly_the_tenants_budget() {
        let cache = Arc::new(MemoryCache::new(ManualClock::new(NOW)));
        let config = QuotaConfig {
            tenant: Limits {
                daily_tokens: Some(1_000),
                daily_usd_micros: Some(10_000),
                ..Default::default()
            },
            project: Limits { rpm: Some(100), ..Default::default() },
            usd_per_mtok: [2_000_000; 3],
            ..Default::default()
        };
        let cost = estimate(&config, Lane::Interactive, 100);
        assert_eq!(cost.usd_micros, 200, "100 tokens at $2 per million");
        let calls = (0..50).map(|i| {
            let cache = cache.clone();
            async move {
                let s = scopes(Some(&tenant("a")), &format!("project-{i}"));
                hold(&*cache, &config, &s, cost, &format!("n{i}"), NOW).await.unwrap().is_ok()
            }
        });
        let granted = futures::future::join_all(calls).await.into_iter().filter(|g| *g).count();
        assert_eq!(granted, 10, "1,000 tokens in calls of 100");
    }

    #[test]
    fn usage_is_priced_or_keeps_the_estimate() {
        let reserved = Cost { tokens: 100, usd_micros: 50 };
        assert_eq!(used(Some(30), Some(0.000_012_3), reserved), Cost { tokens: 30, usd_micros: 13 });
        assert_eq!(used(Some(30), None, reserved), Cost { tokens: 30, usd_micros: 50 });
        assert_eq!(micros(15_000_000, 1), 15, "$15 per million is 15 micro-dollars a token");
        assert_eq!(micros(1, 1), 1, "rounded up");
    }
}
