//! `lanes bench fairness`: four tenants on one lane through the real pool, embedded queues and
//! store. Three send steadily; the fourth has flooded 2,000 interactive and 50 synthesis tasks at
//! once, queued when the pool starts.
//! Each tenant's wait (submission to claim) and latency, alone and under the flood, in FIFO order,
//! in the fair queue's order alone and with the token shares (the default), with the goals computed
//! from the figures, and the least wait any order could have given without preempting a task or
//! holding a slot idle ([`floor_wait`]).

use crate::goals::{Goal, Unit, write_goals};
use lanes_core::clock::{SharedClock, SystemClock};
use lanes_core::config::WorkerConfig;
use lanes_core::domain::{Lane, TaskId, Tenant};
use lanes_core::embedded::{DeliveryOrder, QueueSettings};
use lanes_core::ports::QueueConsume;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One tenant's waits in one run.
#[derive(Debug, Clone, Serialize)]
pub struct TenantWaits {
    /// `steady-1`..`steady-3`, or `flood`.
    pub tenant: String,
    /// Interactive tasks it finished.
    pub tasks: usize,
    /// Interactive wait, submission to claim, p50 and p99, ms.
    pub wait_ms: [f64; 2],
    /// Interactive latency, submission to answer, p50 and p99, ms.
    pub latency_ms: [f64; 2],
    /// Under the flood, for a steady tenant, the p99 of the least wait any order could have given
    /// these tasks without preempting a running task or holding a slot idle: nothing when a slot was
    /// free on arrival, otherwise until the next interactive task of the run finished
    /// ([`floor_wait`]); and the p99 of that wait plus each task's own service time, ms.
    pub floor_ms: Option<[f64; 2]>,
}

/// How a run orders the lane's tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// Oldest first, no token shares: a lane without fairness.
    Fifo,
    /// The fair queue's order alone (token shares off).
    FairOrder,
    /// The fair queue's order and the token shares: what `lanes dev` and the workers run by default.
    FairTokens,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::FairOrder => "fair",
            Policy::FairTokens => "fair+tokens",
        }
    }
}

/// One run: an order, with or without the flood.
#[derive(Debug, Clone, Serialize)]
pub struct FairnessRun {
    /// `fifo`, `fair` (the fair queue's order, token shares off) or `fair+tokens` (the default:
    /// the order and the token shares).
    pub order: String,
    /// Tasks put off for fairness (token shares), all tenants.
    pub put_offs: u64,
    /// Whether the flooding tenant sent its burst.
    pub flood: bool,
    /// Per tenant.
    pub tenants: Vec<TenantWaits>,
    /// While the flood had work queued: the flooding tenant's busy slot time over the slot time the
    /// steady tenants left it (`None` without the flood).
    pub flood_share_of_leftover: Option<f64>,
}

/// What `lanes bench fairness` reports.
#[derive(Debug, Clone, Serialize)]
pub struct FairnessReport {
    /// The command that reproduces it.
    pub command: String,
    /// Worker slots.
    pub slots: usize,
    /// Real ms per workload second.
    pub scale_ms: u64,
    /// Alone and under the flood: FIFO, the fair order alone, the fair order with token shares.
    pub runs: Vec<FairnessRun>,
    /// The worst steady tenant's interactive wait p99 under the flood over its p99 alone, with the
    /// fair order and token shares (goal <= 1.5).
    pub fair_flood_over_alone: f64,
    /// The same with the fair order alone (token shares off).
    pub order_only_flood_over_alone: f64,
    /// The same in FIFO order, for comparison.
    pub fifo_flood_over_alone: f64,
    /// The worst steady tenant's least possible wait p99 under the flood (the first of its
    /// `floor_ms`) over its wait p99 alone: what the ratio would be in the best order that neither preempts nor
    /// holds a slot idle.
    pub fair_floor_over_alone: f64,
    /// The worst steady tenant's interactive latency p99 (submission to answer) under the flood over
    /// alone, with the fair order and token shares.
    pub fair_latency_flood_over_alone: f64,
    /// The same for the latency floor (the floor's wait plus each task's service time).
    pub fair_latency_floor_over_alone: f64,
    /// The flooding tenant's share of the capacity the others leave, with the fair order and token
    /// shares (goal >= 0.95).
    pub fair_flood_share_of_leftover: f64,
    /// Two tenants with backlogs, one's tasks ten times larger in tokens: counted in tasks, then in
    /// tokens ([`crate::token_fairness`]).
    pub token_runs: Vec<crate::token_fairness::TokenRun>,
    /// With token shares on: how far the large tenant's token share is from equal, relative to
    /// equal (the worst run).
    pub token_share_off_equal: f64,
    /// The same for its task share (the closest run): the shares must not be equal in tasks.
    pub task_share_off_equal: f64,
    /// The goal lines, from the figures above.
    pub goals: Vec<Goal>,
}

impl FairnessReport {
    fn judged(mut self) -> Self {
        let wait = "steady tenants' worst interactive wait p99 under the flood / alone, fair+tokens";
        let share = "the flooding tenant's share of the capacity the others leave, fair+tokens";
        let tokens = "token shares on: the large tenant's token share off equal";
        let tasks = "token shares on: its task share off equal (it takes fewer tasks)";
        self.goals = vec![
            Goal::new("flood_over_alone", wait, self.fair_flood_over_alone).at_most(1.5),
            Goal::new("flood_share_of_leftover", share, self.fair_flood_share_of_leftover)
                .at_least(0.95)
                .shown(Unit::Percent, 0),
            Goal::new("token_share_off_equal", tokens, self.token_share_off_equal)
                .at_most(0.10)
                .shown(Unit::Percent, 0),
            Goal::new("task_share_off_equal", tasks, self.task_share_off_equal)
                .at_least(0.20)
                .shown(Unit::Percent, 0),
        ];
        self
    }
}

/// Tasks per tenant queued for the token runs.
const TOKEN_BACKLOG: usize = 300;

const STEADY: usize = 3;
/// Every task's size in tokens (estimate and usage alike): the shares then follow slot time.
const TASK_TOKENS: u64 = 1_000;
const FLOOD_INTERACTIVE: usize = 2_000;
const FLOOD_SYNTHESIS: usize = 50;

/// Runs the six runs: `slots` workers, 1 workload second = `scale_ms` real ms, steady tenants
/// sending for `seconds` of real time at about 30% of the slots between them.
pub async fn fairness_report(slots: usize, seconds: f64, scale_ms: u64) -> Result<FairnessReport, String> {
    let mut runs = Vec::new();
    for policy in [Policy::Fifo, Policy::FairOrder, Policy::FairTokens] {
        for flood in [false, true] {
            runs.push(one_run(policy, flood, slots, seconds, scale_ms).await?);
        }
    }
    let worst = |alone: &FairnessRun, flooded: &FairnessRun, figure: &dyn Fn(&TenantWaits, bool) -> f64| {
        (0..STEADY)
            .map(|t| figure(&flooded.tenants[t], true) / figure(&alone.tenants[t], false).max(1e-3))
            .fold(0.0, f64::max)
    };
    let ratio = |alone: &FairnessRun, flooded: &FairnessRun| worst(alone, flooded, &|t, _| t.wait_ms[1]);
    let token_runs = crate::token_fairness::token_runs(slots, TOKEN_BACKLOG, scale_ms).await?;
    // The worst of the runs with the shares on, in either cache.
    let on: Vec<_> = token_runs.iter().filter(|r| r.token_fairness).collect();
    let off_equal = |share: f64| (share - 0.5).abs() / 0.5;
    let token_share_off_equal = crate::goals::worst(on.iter().map(|r| off_equal(r.large_token_share)));
    let task_share_off_equal = crate::goals::lowest(on.iter().map(|r| off_equal(r.large_task_share)));
    Ok(FairnessReport {
        command: format!("lanes bench fairness --slots {slots} --seconds {seconds} --scale-ms {scale_ms}"),
        token_runs,
        token_share_off_equal,
        task_share_off_equal,
        slots,
        scale_ms,
        fifo_flood_over_alone: ratio(&runs[0], &runs[1]),
        order_only_flood_over_alone: ratio(&runs[2], &runs[3]),
        fair_flood_over_alone: ratio(&runs[4], &runs[5]),
        fair_floor_over_alone: worst(&runs[4], &runs[5], &|t, flooded| {
            if flooded { t.floor_ms.map_or(0.0, |f| f[0]) } else { t.wait_ms[1] }
        }),
        fair_latency_floor_over_alone: worst(&runs[4], &runs[5], &|t, flooded| {
            if flooded { t.floor_ms.map_or(0.0, |f| f[1]) } else { t.latency_ms[1] }
        }),
        fair_latency_flood_over_alone: worst(&runs[4], &runs[5], &|t, _| t.latency_ms[1]),
        fair_flood_share_of_leftover: runs[5].flood_share_of_leftover.unwrap_or(0.0),
        runs,
        goals: Vec::new(),
    }
    .judged())
}

/// The arrivals: `(real ms offset, tenant, synthesis, service ms)`, the same for every run.
fn arrivals(flood: bool, slots: usize, seconds: f64, scale_ms: u64) -> Vec<(f64, usize, bool, u64)> {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let service = |r: f64, synthesis: bool| {
        let s = if synthesis { 45.0 + r * 135.0 } else { 0.5 + r * 1.5 };
        (s * scale_ms as f64).round().max(1.0) as u64
    };
    // 30% of the slots between the steady tenants (mean interactive service 1.25 workload s).
    let rate_per_ms = 0.3 * slots as f64 / (1.25 * scale_ms as f64) / STEADY as f64;
    let mut out = Vec::new();
    for tenant in 0..STEADY {
        let mut t = 0.0;
        while t < seconds * 1000.0 {
            t += -(1.0 - rnd()).ln() / rate_per_ms;
            out.push((t, tenant, false, service(rnd(), false)));
        }
    }
    if flood {
        for i in 0..FLOOD_INTERACTIVE + FLOOD_SYNTHESIS {
            out.push((0.0, STEADY, i >= FLOOD_INTERACTIVE, service(rnd(), i >= FLOOD_INTERACTIVE)));
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

fn tenant_name(t: usize) -> String {
    if t < STEADY { format!("steady-{}", t + 1) } else { "flood".into() }
}

async fn one_run(
    policy: Policy,
    flood: bool,
    slots: usize,
    seconds: f64,
    scale_ms: u64,
) -> Result<FairnessRun, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let dir = crate::temp_dir().map_err(|e| err(&e))?;
    let clock: SharedClock = Arc::new(SystemClock);
    let order = if policy == Policy::Fifo { DeliveryOrder::Fifo } else { DeliveryOrder::Fair };
    let settings = QueueSettings { order, ..Default::default() };
    let (adapters, queues) =
        lanes_core::wiring::embedded(&dir, settings, clock.clone()).await.map_err(|e| err(&e))?;
    let mut config = WorkerConfig::default();
    config.quota.share.on = policy == Policy::FairTokens;
    config.quota.share.settings = crate::token_fairness::scaled_share(scale_ms);
    let metrics = lanes_core::metrics::Metrics::new();
    let worker = adapters.task_worker(Arc::new(crate::SleepLlm), metrics.clone(), clock.clone(), config);
    let consumers: Vec<(Lane, Arc<dyn QueueConsume>)> = [Lane::Interactive, Lane::Synthesis]
        .iter()
        .map(|&l| (l, adapters.consume[l.index()].clone()))
        .collect();
    // The flood is a backlog already queued when the pool starts: what is measured is the order the
    // lane serves it in, not how fast the store takes 2,050 writes at once.
    let tenants: Vec<Tenant> = (0..=STEADY)
        .map(|t| Tenant::parse(&tenant_name(t)).map_err(|e| err(&e)))
        .collect::<Result<_, _>>()?;
    let (backlog, steady): (Vec<_>, Vec<_>) =
        arrivals(flood, slots, seconds, scale_ms).into_iter().enumerate().partition(|(_, a)| a.1 == STEADY);
    let mut submitted = tokio::task::JoinSet::new();
    let spawn = |set: &mut tokio::task::JoinSet<Result<(TaskId, usize, bool), String>>,
                 (i, (at, tenant, synthesis, ms)): (usize, (f64, usize, bool, u64)),
                 from: Option<Instant>| {
        let (adapters, config, clock, who) =
            (adapters.clone(), config, clock.clone(), tenants[tenant].clone());
        set.spawn(async move {
            if let Some(from) = from {
                tokio::time::sleep_until((from + Duration::from_micros((at * 1000.0) as u64)).into()).await;
            }
            let kind = if synthesis { "refactor" } else { "explain" };
            // Every task reports the usage its estimate foresaw, as a real call's roughly does:
            // a run that reports next to nothing would leave only the estimates of running tasks
            // in the token shares, and a steady tenant's two running tasks would count for more
            // than the flood's whole window.
            let req = crate::token_fairness::sized_request(who.as_str(), "fair", kind, i, ms, TASK_TOKENS)?;
            let id = crate::token_fairness::submit(&*adapters.store, &adapters, &config, req, &clock).await?;
            Ok((id, tenant, synthesis))
        });
    };
    for arrival in backlog {
        spawn(&mut submitted, arrival, None);
    }
    let mut ids: Vec<(TaskId, usize, bool)> = Vec::new();
    while let Some(joined) = submitted.join_next().await {
        ids.push(joined.map_err(|e| err(&e))??);
    }
    let pool =
        lanes_core::pool::Pool::new(slots, [0.7, 0.3, 0.0], consumers, worker, Duration::from_millis(2))
            .with_idle_grace(Duration::from_millis(10 * scale_ms));
    let pool = crate::RunningPool::start(pool);
    // Every steady arrival is its own task, on time whatever the others do.
    let started = Instant::now();
    for arrival in steady {
        spawn(&mut submitted, arrival, Some(started));
    }
    while let Some(joined) = submitted.join_next().await {
        ids.push(joined.map_err(|e| err(&e))??);
    }
    crate::drain(&queues[..2], Duration::from_secs(300)).await?;
    pool.stop().await;
    let mut records = Vec::new();
    for (id, tenant, synthesis) in &ids {
        if let Some(r) = adapters.store.get(id, clock.now_ms()).await.map_err(|e| err(&e))?
            && let (Some(s), Some(f)) = (r.started_at_ms, r.finished_at_ms)
        {
            records.push((*tenant, *synthesis, r.created_at_ms, s, f));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let put_offs = [Lane::Interactive, Lane::Synthesis]
        .iter()
        .map(|l| metrics.waits_total.with_label_values(&[l.as_str(), "fairness"]).get())
        .sum();
    Ok(summarize(policy, flood, slots, put_offs, &records))
}

/// The least wait of an interactive task submitted at `at` under any order that neither preempts
/// a running task nor holds a slot idle, given the run's own timeline: none if fewer than `slots`
/// tasks were running then, otherwise until the next interactive task finished. Each arrival is
/// given the first slot to free up as if no other waiting task took it, so the figure is a floor.
fn floor_wait(records: &[(usize, bool, u64, u64, u64)], slots: usize, at: u64) -> f64 {
    let running = records.iter().filter(|r| r.3 <= at && at < r.4).count();
    if running < slots {
        return 0.0;
    }
    records.iter().filter(|r| !r.1 && r.4 > at).map(|r| (r.4 - at) as f64).fold(f64::INFINITY, f64::min)
}

/// The run's figures from `(tenant, synthesis, created, started, finished)` of every finished task.
fn summarize(
    policy: Policy,
    flood: bool,
    slots: usize,
    put_offs: u64,
    records: &[(usize, bool, u64, u64, u64)],
) -> FairnessRun {
    let tenants = (0..=STEADY)
        .filter(|&t| flood || t < STEADY)
        .map(|t| {
            let mine: Vec<_> = records.iter().filter(|r| r.0 == t && !r.1).collect();
            let mut waits: Vec<f64> = mine.iter().map(|r| r.3.saturating_sub(r.2) as f64).collect();
            let mut latencies: Vec<f64> = mine.iter().map(|r| r.4.saturating_sub(r.2) as f64).collect();
            let mut floors: Vec<f64> = mine.iter().map(|r| floor_wait(records, slots, r.2)).collect();
            let mut floor_latencies: Vec<f64> =
                mine.iter().zip(&floors).map(|(r, w)| w + r.4.saturating_sub(r.3) as f64).collect();
            TenantWaits {
                tenant: tenant_name(t),
                tasks: waits.len(),
                wait_ms: [crate::percentile(&mut waits, 50.0), crate::percentile(&mut waits, 99.0)],
                latency_ms: [
                    crate::percentile(&mut latencies, 50.0),
                    crate::percentile(&mut latencies, 99.0),
                ],
                floor_ms: (flood && t < STEADY).then(|| {
                    [crate::percentile(&mut floors, 99.0), crate::percentile(&mut floor_latencies, 99.0)]
                }),
            }
        })
        .collect();
    // The flood's window: from the first start of one of its tasks to the last (it had work queued
    // throughout). Slot time in the window, clipped to it.
    let flood_share_of_leftover = flood.then(|| {
        let mine: Vec<_> = records.iter().filter(|r| r.0 == STEADY).collect();
        let from = mine.iter().map(|r| r.3).min().unwrap_or(0);
        let to = mine.iter().map(|r| r.3).max().unwrap_or(from);
        let busy = |pred: &dyn Fn(usize) -> bool| -> f64 {
            records
                .iter()
                .filter(|r| pred(r.0))
                .map(|r| r.4.min(to).saturating_sub(r.3.max(from)) as f64)
                .sum()
        };
        let leftover = slots as f64 * to.saturating_sub(from) as f64 - busy(&|t| t < STEADY);
        busy(&|t| t == STEADY) / leftover.max(1.0)
    });
    FairnessRun { order: policy.name().into(), put_offs, flood, tenants, flood_share_of_leftover }
}

impl std::fmt::Display for FairnessReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Fairness, {} slots, 1 s = {} ms ({})", self.slots, self.scale_ms, self.command)?;
        writeln!(
            f,
            "{:<11} {:<6} {:<10} {:>6} {:>14} {:>14} {:>14} {:>9}",
            "order", "flood", "tenant", "tasks", "wait p50", "wait p99", "latency p99", "put-offs"
        )?;
        for run in &self.runs {
            for t in &run.tenants {
                writeln!(
                    f,
                    "{:<11} {:<6} {:<10} {:>6} {:>11.1} ms {:>11.1} ms {:>11.1} ms {:>9}",
                    run.order,
                    run.flood,
                    t.tenant,
                    t.tasks,
                    t.wait_ms[0],
                    t.wait_ms[1],
                    t.latency_ms[1],
                    run.put_offs
                )?;
            }
        }
        writeln!(
            f,
            "steady tenants' worst interactive wait p99 under the flood / alone: fair+tokens {:.2}, fair order alone {:.2}, FIFO {:.2}",
            self.fair_flood_over_alone, self.order_only_flood_over_alone, self.fifo_flood_over_alone
        )?;
        writeln!(
            f,
            "  the least any order could give without preempting or idling a slot: {:.2}; latency p99 under the flood / alone: {:.2} (floor {:.2})",
            self.fair_floor_over_alone,
            self.fair_latency_flood_over_alone,
            self.fair_latency_floor_over_alone
        )?;
        writeln!(f, "two backlogged tenants, one's tasks {}x the tokens (same service time):", 10)?;
        for r in &self.token_runs {
            writeln!(
                f,
                "  counted in {:<6} ({:<8}): large tenant {:.2} of the tokens, {:.2} of the tasks ({} + {} tasks, {} put-offs)",
                if r.token_fairness { "tokens" } else { "tasks" },
                r.cache,
                r.large_token_share,
                r.large_task_share,
                r.tasks[0],
                r.tasks[1],
                r.put_offs
            )?;
        }
        write_goals(f, &self.goals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records are `(tenant, synthesis, created, started, finished)`.
    #[test]
    fn the_floor_is_nothing_with_a_slot_free_and_the_next_finish_with_none() {
        let records = [
            (STEADY, false, 0, 0, 100),
            (STEADY, false, 0, 10, 60),
            (STEADY, true, 0, 0, 1_000), // a synthesis task holds a slot but frees none for interactive
            (0, false, 5, 40, 80),
        ];
        assert_eq!(floor_wait(&records, 4, 5), 0.0, "four slots, three busy at 5: one is free");
        assert_eq!(floor_wait(&records, 3, 20), 40.0, "three busy at 20: the interactive one ending at 60");
        assert_eq!(floor_wait(&records, 3, 65), 15.0, "the next interactive end after 65 is 80");
        assert_eq!(
            floor_wait(&records, 1, 5),
            55.0,
            "one slot: the first interactive end, not the earliest start"
        );
    }
}
