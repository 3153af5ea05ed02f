//! `lanes bench share`: what the token shares cost Redis as a lane's tenants grow. Every step of a
//! lane's shares is one Lua script on the lane's keys, and Redis runs one script at a time, so a
//! script's run is time in which no other client of that Redis (locks, the limiter, the other
//! lanes) is answered. With `n` tenants in one lane, some or all waiting, it times each kind of step
//! through the adapter the workers use (`RedisCache::share`) against a real `redis-server`, and
//! reads Redis's own time per call from `INFO commandstats` (the script's run, not the network's).
//!
//! A submission and a correction read the asking tenant's entry alone, so their cost must not grow
//! with `n`; a start decision reads the entries of the tenants waiting (the others' shares are its
//! question, and only a tenant with work waiting competes), so its cost grows with those, and not
//! with the tenants merely active in the window: a last row has 1,000 tenants with tokens in the
//! window of which 10 wait. Each row also times one sweep: the first decision a window after the
//! last, which reads every tenant once (here none is idle yet, so it drops and rewrites nothing:
//! its cost is the reading).

use crate::goals::{Goal, Unit, write_goals};
use lanes_core::adapters::redis::{RedisCache, RedisSettings, connect};
use lanes_core::clock::Clock;
use lanes_core::domain::token_share::{ShareAsk, ShareSettings, Step};
use lanes_core::ports::Cache;
use serde::Serialize;
use std::time::Duration;

/// Tenants in the lane per row, and of them those waiting.
const TENANTS: [(usize, usize); 4] = [(10, 10), (100, 100), (1_000, 1_000), (1_000, 10)];
/// Calls timed per kind of step and row.
const CALLS: usize = 500;
/// The largest Redis time a task's three steps may take with 1,000 tenants waiting in its lane:
/// one Redis core then still starts 1,000 tasks a second in that lane, while answering its other
/// clients in between.
const TASK_BUDGET_US: f64 = 1_000.0;
/// How far a submission's or a correction's cost may rise from 10 tenants to 1,000: flat, with
/// room for the run-to-run spread of a loaded two-core machine.
const FLAT: f64 = 1.5;

/// One row: the lane with `tenants` tenants, `waiting` of them waiting, Redis's time per call of
/// each step.
#[derive(Debug, Clone, Serialize)]
pub struct ShareCost {
    /// Tenants with tokens in the lane's window.
    pub tenants: usize,
    /// Of them, tenants with tasks waiting.
    pub waiting: usize,
    /// A submission (ingress counts a new task), µs of Redis time per call.
    pub submit_us: f64,
    /// A start decision, µs.
    pub decide_us: f64,
    /// A correction after the answer, µs.
    pub settle_us: f64,
    /// The three together: what one task costs Redis in the lane's shares, µs.
    pub task_us: f64,
    /// One decision that sweeps the lane (at most one a window), µs.
    pub sweep_us: f64,
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
        let all_waiting = || self.rows.iter().filter(|r| r.waiting == r.tenants);
        let first = all_waiting().min_by_key(|r| r.tenants);
        let last = all_waiting().max_by_key(|r| r.tenants);
        let quiet = self.rows.iter().filter(|r| r.waiting < r.tenants).max_by_key(|r| r.tenants);
        let ratio = |to: Option<&ShareCost>, f: fn(&ShareCost) -> f64| match (first, to) {
            (Some(a), Some(b)) => f(b) / f(a),
            _ => f64::NAN,
        };
        let (small, large) = (first.map_or(0, |r| r.tenants), last.map_or(0, |r| r.tenants));
        let flat = |step: &str| format!("a {step}'s Redis time, {large} tenants waiting over {small}");
        self.goals = vec![
            Goal::new("submit_flat", flat("submission"), ratio(last, |r| r.submit_us)).at_most(FLAT),
            Goal::new("settle_flat", flat("correction"), ratio(last, |r| r.settle_us)).at_most(FLAT),
            Goal::new(
                "task_us",
                format!("a task's three steps, Redis time, {large} tenants waiting"),
                last.map_or(f64::NAN, |r| r.task_us),
            )
            .at_most(TASK_BUDGET_US)
            .shown(Unit::Micros, 0),
        ];
        if let Some(q) = quiet {
            let (n, w) = (q.tenants, q.waiting);
            let what = format!(
                "a start decision's Redis time, {n} tenants active of which {w} waiting, over {small} \
                 all waiting"
            );
            self.goals
                .push(Goal::new("decide_quiet_flat", what, ratio(quiet, |r| r.decide_us)).at_most(FLAT));
        }
        self
    }
}

/// Runs the rows against a `redis-server` of its own; an error when none is installed.
pub async fn share_cost_report() -> Result<ShareCostReport, String> {
    share_cost_report_with(&TENANTS, CALLS).await
}

/// [`share_cost_report`] with `tenants` and those waiting per row and `calls` timed per step (a
/// quicker run for tests).
pub async fn share_cost_report_with(
    tenants: &[(usize, usize)],
    calls: usize,
) -> Result<ShareCostReport, String> {
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
    for &(n, waiting) in tenants {
        rows.push(one_row(&cache, &mut raw, (n, waiting), calls).await?);
    }
    Ok(ShareCostReport { command: "lanes bench share".into(), rows, calls, goals: Vec::new() }.judged())
}

/// A lane of its own with `tenants` tenants, the first `waiting` of them each waiting for one task,
/// all but the first with tokens in the window, then `calls` calls of each step by the first, each
/// past the others' patience (so every one waiting competes in each decision timed); then one
/// decision a window later, which sweeps.
async fn one_row(
    cache: &RedisCache,
    raw: &mut redis::aio::MultiplexedConnection,
    (tenants, waiting): (usize, usize),
    calls: usize,
) -> Result<ShareCost, String> {
    let key = format!("fair:{{bench-{tenants}-{waiting}}}");
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
        if g < waiting {
            share(ask(g, Step::Submit, now)).await?;
        }
    }
    // Past the patience again: every tenant waiting competes in each timed decision.
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
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(raw).await.map_err(|e| e.to_string())?;
    share(ask(0, Step::Decide { estimate: 1_000 }, later + settings.window_ms)).await?;
    let sweep_us = script_us_per_call(raw).await?;
    let task_us = submit_us + decide_us + settle_us;
    Ok(ShareCost { tenants, waiting, submit_us, decide_us, settle_us, task_us, sweep_us })
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
        writeln!(
            f,
            "{:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "tenants", "waiting", "submit", "decide", "settle", "a task", "a sweep"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:>8} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                r.tenants, r.waiting, r.submit_us, r.decide_us, r.settle_us, r.task_us, r.sweep_us
            )?;
        }
        write_goals(f, &self.goals)
    }
}
