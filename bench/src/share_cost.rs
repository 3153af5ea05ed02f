//! `lanes bench share`: what the token shares cost Redis as a lane's tenants grow. Every step of a
//! lane's shares is one Lua script on one hash, and Redis runs one script at a time, so a script's
//! run is time in which no other client of that Redis (locks, the limiter, the other lanes) is
//! answered. With `n` tenants waiting in one lane, it times each kind of step through the adapter
//! the workers use (`RedisCache::share`) against a real `redis-server`, and reads Redis's own time
//! per call from `INFO commandstats` (the script's run, not the network's).
//!
//! A submission and a correction read the asking tenant's entry alone, so their cost must not grow
//! with `n`; a start decision reads every tenant's (the others' shares are its question), so its
//! cost does, and the report gives it per tenant and at the largest `n`.

use crate::goals::{Goal, Unit, write_goals};
use lanes_core::adapters::redis::{RedisCache, RedisSettings, connect};
use lanes_core::clock::Clock;
use lanes_core::domain::token_share::{ShareAsk, ShareSettings, Step};
use lanes_core::ports::Cache;
use serde::Serialize;
use std::time::Duration;

/// Tenants in the lane per row.
const TENANTS: [usize; 3] = [10, 100, 1_000];
/// Calls timed per kind of step and row.
const CALLS: usize = 500;
/// The largest Redis time a task's three steps may take with 1,000 tenants waiting in its lane:
/// one Redis core then still starts 1,000 tasks a second in that lane, while answering its other
/// clients in between.
const TASK_BUDGET_US: f64 = 1_000.0;
/// How far a submission's or a correction's cost may rise from 10 tenants to 1,000: flat, with
/// room for the run-to-run spread of a loaded two-core machine.
const FLAT: f64 = 1.5;

/// One row: the lane with `tenants` tenants waiting, Redis's time per call of each step.
#[derive(Debug, Clone, Serialize)]
pub struct ShareCost {
    /// Tenants with tasks waiting in the lane.
    pub tenants: usize,
    /// A submission (ingress counts a new task), µs of Redis time per call.
    pub submit_us: f64,
    /// A start decision, µs.
    pub decide_us: f64,
    /// A correction after the answer, µs.
    pub settle_us: f64,
    /// The three together: what one task costs Redis in the lane's shares, µs.
    pub task_us: f64,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct ShareCostReport {
    /// The command that reproduces it.
    pub command: String,
    /// One row per lane size.
    pub rows: Vec<ShareCost>,
    /// Calls timed per step and row.
    pub calls: usize,
    /// The goals, computed from the rows.
    pub goals: Vec<Goal>,
}

impl ShareCostReport {
    fn judged(mut self) -> Self {
        let (first, last) = (self.rows.first(), self.rows.last());
        let ratio = |f: fn(&ShareCost) -> f64| match (first, last) {
            (Some(a), Some(b)) => f(b) / f(a),
            _ => f64::NAN,
        };
        let (small, large) = (first.map_or(0, |r| r.tenants), last.map_or(0, |r| r.tenants));
        let flat = |step: &str| format!("a {step}'s Redis time, {large} tenants waiting over {small}");
        self.goals = vec![
            Goal::new("submit_flat", flat("submission"), ratio(|r| r.submit_us)).at_most(FLAT),
            Goal::new("settle_flat", flat("correction"), ratio(|r| r.settle_us)).at_most(FLAT),
            Goal::new(
                "task_us",
                format!("a task's three steps, Redis time, {large} tenants waiting"),
                last.map_or(f64::NAN, |r| r.task_us),
            )
            .at_most(TASK_BUDGET_US)
            .shown(Unit::Micros, 0),
        ];
        self
    }
}

/// Runs the rows against a `redis-server` of its own; an error when none is installed.
pub async fn share_cost_report() -> Result<ShareCostReport, String> {
    share_cost_report_with(&TENANTS, CALLS).await
}

/// [`share_cost_report`] with `tenants` per row and `calls` timed per step (a quicker run for tests).
pub async fn share_cost_report_with(tenants: &[usize], calls: usize) -> Result<ShareCostReport, String> {
    if !lanes_tests::redis_available() {
        return Err("redis-server is missing (scripts/test-deps.sh installs it)".into());
    }
    let server = lanes_tests::RedisServer::start();
    let settings = RedisSettings {
        url: server.url(),
        cluster: false,
        prefix: "bench:".into(),
        timeout: Duration::from_secs(5),
        ca_pem: None,
        auth: None,
    };
    let cache = RedisCache::new(connect(&settings).await.map_err(|e| e.to_string())?, &settings.prefix);
    let client = redis::Client::open(server.url()).map_err(|e| e.to_string())?;
    let mut raw = client.get_multiplexed_async_connection().await.map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for &n in tenants {
        rows.push(one_row(&cache, &mut raw, n, calls).await?);
    }
    Ok(ShareCostReport { command: "lanes bench share".into(), rows, calls, goals: Vec::new() }.judged())
}

/// A lane of its own with `tenants` tenants each waiting for one task, the others with tokens in
/// the window, then `calls` calls of each step by the first of them, each past the others'
/// patience (so every one competes in each decision timed).
async fn one_row(
    cache: &RedisCache,
    raw: &mut redis::aio::MultiplexedConnection,
    tenants: usize,
    calls: usize,
) -> Result<ShareCost, String> {
    let key = format!("fair:{{bench-{tenants}}}");
    let settings = ShareSettings::default();
    let start = lanes_core::clock::SystemClock.now_ms();
    let ask = |group: usize, step: Step, now_ms: u64| ShareAsk {
        group: format!("tenant-{group:04}"),
        weight: 1 + (group % 3) as u64,
        step,
        now_ms,
        settings,
    };
    let key = key.as_str();
    let share = |a: ShareAsk| async move { cache.share(key, &a).await.map_err(|e| e.to_string()) };
    for g in 0..tenants {
        share(ask(g, Step::Submit, start)).await?;
    }
    // The others use some of the window, so a decision weighs real shares.
    let now = start + settings.patience_ms + 1;
    for g in 1..tenants {
        share(ask(g, Step::Decide { estimate: 1_000 + g as u64 }, now)).await?;
        share(ask(g, Step::Submit, now)).await?;
    }
    // Past the patience again: every tenant competes in each timed decision.
    let later = now + settings.patience_ms + 1;
    let mut timed = [0.0; 3];
    let steps = [Step::Submit, Step::Decide { estimate: 1_000 }, Step::Settle { delta: -10 }];
    for (slot, step) in timed.iter_mut().zip(steps) {
        let _: () =
            redis::cmd("CONFIG").arg("RESETSTAT").query_async(raw).await.map_err(|e| e.to_string())?;
        for i in 0..calls {
            share(ask(0, step, later + i as u64)).await?;
        }
        *slot = script_us_per_call(raw).await?;
    }
    let [submit_us, decide_us, settle_us] = timed;
    Ok(ShareCost { tenants, submit_us, decide_us, settle_us, task_us: submit_us + decide_us + settle_us })
}

/// Redis's own time per script call since the last `CONFIG RESETSTAT`: `EVALSHA` and, for a
/// script not loaded yet, `EVAL`, from `INFO commandstats` (`cmdstat_evalsha:calls=N,usec=U,…`).
async fn script_us_per_call(raw: &mut redis::aio::MultiplexedConnection) -> Result<f64, String> {
    let info: String =
        redis::cmd("INFO").arg("commandstats").query_async(raw).await.map_err(|e| e.to_string())?;
    let (mut calls, mut usec) = (0.0, 0.0);
    for line in info.lines().filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:")) {
        for field in line.split_once(':').map_or("", |(_, f)| f).split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => calls += v.parse::<f64>().unwrap_or(0.0),
                Some(("usec", v)) => usec += v.parse::<f64>().unwrap_or(0.0),
                _ => {}
            }
        }
    }
    if calls == 0.0 { Err(format!("no script calls in INFO commandstats: {info}")) } else { Ok(usec / calls) }
}

impl std::fmt::Display for ShareCostReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.command)?;
        writeln!(f, "Redis time per call of the token-share script ({} calls each), µs:", self.calls)?;
        writeln!(f, "{:>8} {:>10} {:>10} {:>10} {:>10}", "tenants", "submit", "decide", "settle", "a task")?;
        for r in &self.rows {
            writeln!(
                f,
                "{:>8} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                r.tenants, r.submit_us, r.decide_us, r.settle_us, r.task_us
            )?;
        }
        write_goals(f, &self.goals)
    }
}
