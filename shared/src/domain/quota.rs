//! Budgets as counters: what a quota charges, which counters a call touches, and the one rule that
//! decides whether a reservation fits. Pure; [`crate::quota`] runs it against the cache, and both
//! the Redis script and the embedded cache apply [`refuses`] and [`apply`] unchanged.
//!
//! A budget is a counter per scope and window, with a limit:
//! - **scopes**: the authenticated tenant (with tenancy off, every caller is one tenant), and inside
//!   it the project, so rotating `project_id`s never escapes the tenant's limits;
//! - **windows**: the calendar minute (requests and estimated tokens) and the UTC day (tokens and
//!   USD, the latter in micro-dollars so every counter is a whole number).
//!
//! A call reserves its estimate in every counter at once, or in none; the answer's usage corrects
//! it afterwards. So a parallel burst sees each other's reservations, and a budget is exceeded by at
//! most one call: a counter at zero always takes its first charge, or a call estimated above the
//! whole budget could never run.

use super::commit::PushScope;
use super::{Tenant, hashed_tag};
use std::time::Duration;

/// One minute, in milliseconds.
pub const MINUTE_MS: u64 = 60 * 1000;
/// One day, in milliseconds.
pub const DAY_MS: u64 = 24 * 3600 * 1000;

/// One counter of a reservation: add `amount` to the counter at `key` (a negative amount gives
/// back, and a counter never goes below zero); with a `limit`, only if the counter fits it. A new
/// counter lives for `ttl`; charging never extends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The counter.
    pub key: String,
    /// What to add.
    pub amount: i64,
    /// The most the counter may hold after a charge, unless it held nothing before.
    pub limit: Option<u64>,
    /// The life of a counter this charge creates.
    pub ttl: Duration,
}

/// Whether a counter at `current` refuses `charge`: only a positive charge with a limit can be
/// refused, and only by a counter that already holds something and would pass the limit.
pub fn refuses(current: u64, charge: &Charge) -> bool {
    match charge.limit {
        Some(limit) if charge.amount > 0 => {
            current > 0 && current.saturating_add(charge.amount as u64) > limit
        }
        _ => false,
    }
}

/// The counter at `current` after `amount`: added, floored at zero.
pub fn apply(current: u64, amount: i64) -> u64 {
    if amount >= 0 {
        current.saturating_add(amount as u64)
    } else {
        current.saturating_sub(amount.unsigned_abs())
    }
}

/// The first charge of `charges` that `current` (the counters' values, in the same order) refuses.
pub fn first_refused(current: &[u64], charges: &[Charge]) -> Option<usize> {
    charges.iter().zip(current).position(|(c, v)| refuses(*v, c))
}

/// The limits of one scope; `None` = no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Provider calls per calendar minute.
    pub rpm: Option<u64>,
    /// Estimated tokens per calendar minute.
    pub tpm: Option<u64>,
    /// Tokens (prompt + completion) per UTC day.
    pub daily_tokens: Option<u64>,
    /// Micro-dollars per UTC day.
    pub daily_usd_micros: Option<u64>,
}

impl Limits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.rpm.is_some()
            || self.tpm.is_some()
            || self.daily_tokens.is_some()
            || self.daily_usd_micros.is_some()
    }
}

/// The counters a task is charged to: its tenant's and its project's inside the tenant. All of them
/// share the tenant's hash tag, so one script touches one cluster slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scopes {
    tag: String,
    project: String,
}

impl Scopes {
    /// The scopes of a task of `tenant` (none: tenancy is off, and every caller is one tenant) and
    /// `project_id`, hashed so no subject or project name reaches the cache's keys.
    pub fn of(tenant: Option<&Tenant>, project_id: &str) -> Self {
        let tag = match tenant {
            Some(t) => hashed_tag("t-", t.as_bytes()),
            None => "t-".to_owned(),
        };
        Self { project: hashed_tag("p-", project_id.as_bytes()), tag }
    }

    fn key(&self, project: bool, what: &str, window: u64) -> String {
        match project {
            false => format!("quota:{{{}}}:{what}:{window}", self.tag),
            true => format!("quota:{{{}}}:{}:{what}:{window}", self.tag, self.project),
        }
    }
}

/// What a new task holds on its day's budgets, kept beside the counters (same hash tag) so it is
/// given back exactly, and once: the tokens and micro-dollars held, and the marker a release sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldKeys {
    /// Tokens held.
    pub tokens: String,
    /// Micro-dollars held.
    pub usd: String,
    /// Set by the one release that gives the hold back.
    pub released: String,
}

impl Scopes {
    /// The keys of the hold of the submission `nonce` (random per submission, so a duplicate's
    /// hold never meets the accepted task's).
    pub fn hold_keys(&self, nonce: &str) -> HoldKeys {
        let id = hashed_tag("", nonce.as_bytes());
        let key = |what: &str| format!("quota:{{{}}}:hold:{id}:{what}", self.tag);
        HoldKeys { tokens: key("tokens"), usd: key("usd"), released: key("released") }
    }
}

/// Which budget a refusal came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// Calls per minute.
    Rpm,
    /// Estimated tokens per minute.
    Tpm,
    /// Tokens per day.
    DailyTokens,
    /// USD per day.
    DailyUsd,
}

impl Budget {
    /// Whether the budget's window is the day (a refusal lasts until midnight UTC).
    pub fn is_daily(self) -> bool {
        matches!(self, Budget::DailyTokens | Budget::DailyUsd)
    }

    /// How it is named in a refusal.
    pub fn describe(self) -> &'static str {
        match self {
            Budget::Rpm => "requests per minute",
            Budget::Tpm => "tokens per minute",
            Budget::DailyTokens => "daily token budget",
            Budget::DailyUsd => "daily USD budget",
        }
    }
}

/// Who a refused budget belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The tenant's own budget.
    Tenant,
    /// The project's, inside the tenant.
    Project,
}

/// One planned charge, with what refuses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// The charge.
    pub charge: Charge,
    /// Whose budget it counts.
    pub owner: Owner,
    /// Which budget.
    pub budget: Budget,
    /// When its window ends.
    pub window_left: Duration,
}

/// What one call is estimated to cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    /// Tokens, prompt plus completion.
    pub tokens: u64,
    /// Micro-dollars.
    pub usd_micros: u64,
}

/// The window of `len_ms` that `now_ms` falls in, and how long until it ends.
pub fn window(now_ms: u64, len_ms: u64) -> (u64, Duration) {
    (now_ms / len_ms, Duration::from_millis(len_ms - now_ms % len_ms))
}

/// The reservation of a call of `cost` at `now_ms`: one charge for every limit set in `tenant` and
/// `project`. The minute counters outlive their minute a little, so a late worker still sees them; a
/// day's counters live an hour past midnight.
pub fn plan(tenant: &Limits, project: &Limits, scopes: &Scopes, cost: Cost, now_ms: u64) -> Vec<Planned> {
    let (minute, minute_left) = window(now_ms, MINUTE_MS);
    let (day, day_left) = window(now_ms, DAY_MS);
    let minute_ttl = Duration::from_millis(2 * MINUTE_MS);
    let day_ttl = day_left + Duration::from_secs(3600);
    let mut planned = Vec::new();
    for (owner, limits) in [(Owner::Tenant, tenant), (Owner::Project, project)] {
        let in_project = owner == Owner::Project;
        let rows = [
            (Budget::Rpm, limits.rpm, "rpm", minute, 1, minute_ttl, minute_left),
            (Budget::Tpm, limits.tpm, "tpm", minute, cost.tokens, minute_ttl, minute_left),
            (Budget::DailyTokens, limits.daily_tokens, "day-tokens", day, cost.tokens, day_ttl, day_left),
            (Budget::DailyUsd, limits.daily_usd_micros, "day-usd", day, cost.usd_micros, day_ttl, day_left),
        ];
        for (budget, limit, what, window, amount, ttl, window_left) in rows {
            let Some(limit) = limit else { continue };
            let charge = Charge {
                key: scopes.key(in_project, what, window),
                amount: clamp(amount),
                limit: Some(limit),
                ttl,
            };
            planned.push(Planned { charge, owner, budget, window_left });
        }
    }
    planned
}

/// The corrections after a call reserved `reserved` and used `used`: each of the day's counters and
/// the minute's token counter moves by the difference. Unlimited: a correction is never refused.
pub fn corrections(reservation: &[Planned], reserved: Cost, used: Cost) -> Vec<Charge> {
    reservation
        .iter()
        .filter_map(|p| {
            let delta = match p.budget {
                Budget::Rpm => return None,
                Budget::Tpm | Budget::DailyTokens => clamp(used.tokens) - clamp(reserved.tokens),
                Budget::DailyUsd => clamp(used.usd_micros) - clamp(reserved.usd_micros),
            };
            (delta != 0).then(|| Charge { limit: None, amount: delta, ..p.charge.clone() })
        })
        .collect()
}

/// A repository's commits summarized on one UTC day: the charge of one more commit (at most
/// `limit` a day), and how long until the day ends. Keyed by the repository's id and the owner its
/// commits were pushed for ([`PushScope`]: taken before the host has said what the id names, so a
/// commit that claims another owner's repository is charged apart), hashed, under its own hash
/// tag. [`give_back`] undoes it for a commit that was not summarized.
pub fn repo_commit(scope: &PushScope, limit: u64, now_ms: u64) -> (Charge, Duration) {
    let (day, day_left) = window(now_ms, DAY_MS);
    let tag = hashed_tag("", scope.to_string().as_bytes());
    let charge = Charge {
        key: format!("quota:{{r-{tag}}}:day-commits:{day}"),
        amount: 1,
        limit: Some(limit),
        ttl: day_left + Duration::from_secs(3600),
    };
    (charge, day_left)
}

/// The charge that gives back what `charge` took: never refused.
pub fn give_back(charge: &Charge) -> Charge {
    Charge { amount: -charge.amount, limit: None, ..charge.clone() }
}

fn clamp(n: u64) -> i64 {
    n.min(i64::MAX as u64 / 2) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository's day is counted per owner its commits were pushed for: a commit claiming
    /// another owner's repository id is charged apart; the owner's case does not matter.
    #[test]
    fn a_repositorys_commit_budget_is_keyed_by_its_id_and_owner() {
        use crate::domain::commit::PushScope;
        let id: crate::domain::RepoId = "github:42".parse().unwrap_or_else(|e| panic!("{e:?}"));
        let key = |repo: &str| repo_commit(&PushScope::of(&id, repo), 10, 0).0.key;
        assert_eq!(key("victim-org/app"), key("Victim-Org/other"));
        assert_ne!(key("victim-org/app"), key("mallory/app"));
    }

    fn charge(amount: i64, limit: Option<u64>) -> Charge {
        Charge { key: "k".into(), amount, limit, ttl: Duration::from_secs(1) }
    }

    #[test]
    fn a_charge_fits_up_to_its_limit_and_a_first_charge_always_fits() {
        assert!(!refuses(9, &charge(1, Some(10))));
        assert!(refuses(10, &charge(1, Some(10))));
        assert!(!refuses(0, &charge(50, Some(10))), "the first charge of a window always fits");
        assert!(refuses(1, &charge(50, Some(10))));
        assert!(!refuses(100, &charge(-5, Some(10))), "giving back is never refused");
        assert!(!refuses(100, &charge(5, None)), "no limit, no refusal");
        assert_eq!(apply(3, -5), 0, "floored at zero");
        assert_eq!(apply(3, 4), 7);
        assert_eq!(first_refused(&[0, 10], &[charge(1, Some(10)), charge(1, Some(10))]), Some(1));
    }

    #[test]
    fn a_tenants_counters_are_the_same_for_every_project_and_share_one_tag() {
        let t = Tenant::parse("team-a").unwrap();
        let limits = Limits { rpm: Some(5), daily_tokens: Some(100), ..Default::default() };
        let project = Limits { tpm: Some(50), ..Default::default() };
        let cost = Cost { tokens: 10, usd_micros: 3 };
        let a = plan(&limits, &project, &Scopes::of(Some(&t), "p1"), cost, 90_000);
        let b = plan(&limits, &project, &Scopes::of(Some(&t), "p2"), cost, 90_000);
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].charge.key, b[0].charge.key, "the tenant's rpm is shared by its projects");
        assert_eq!(a[1].charge.key, b[1].charge.key, "and its day");
        assert_ne!(a[2].charge.key, b[2].charge.key, "the projects' counters are their own");
        assert_eq!((a[2].owner, a[2].budget), (Owner::Project, Budget::Tpm));
        let tag = |k: &str| k.split('{').nth(1).and_then(|s| s.split('}').next()).unwrap().to_owned();
        assert!(a.iter().all(|p| tag(&p.charge.key) == tag(&a[0].charge.key)), "one hash tag");
        let other =
            plan(&limits, &project, &Scopes::of(Some(&Tenant::parse("team-b").unwrap()), "p1"), cost, 0);
        assert_ne!(tag(&other[0].charge.key), tag(&a[0].charge.key));
        assert!(!a[0].charge.key.contains("team-a") && !a[2].charge.key.contains("p1"), "hashed");
        assert_eq!(a[0].window_left, Duration::from_secs(30));
    }

    #[test]
    fn corrections_move_the_token_and_usd_counters_by_the_difference() {
        let limits =
            Limits { rpm: Some(5), tpm: Some(100), daily_usd_micros: Some(10), ..Default::default() };
        let reserved = Cost { tokens: 100, usd_micros: 9 };
        let planned = plan(&limits, &Limits::default(), &Scopes::of(None, "p"), reserved, 0);
        let fixes = corrections(&planned, reserved, Cost { tokens: 30, usd_micros: 2 });
        let amounts: Vec<_> = fixes.iter().map(|c| (c.amount, c.limit)).collect();
        assert_eq!(amounts, vec![(-70, None), (-7, None)], "rpm stays; tpm and usd give back");
        assert!(corrections(&planned, reserved, reserved).is_empty());
    }
}
