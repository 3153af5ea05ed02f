//! `lanes bench hol`: a time-scaled mixed workload (Poisson arrivals, mostly short interactive tasks,
//! a few long synthesis ones) through the real pool and embedded queues under one FIFO, a static
//! 50:50 split and 70/30 with borrowing.

use crate::goals::{Goal, Unit, write_goals};
use lanes_core::clock::SystemClock;
use lanes_core::domain::Lane;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One policy's result in `lanes bench hol`.
#[derive(Debug, Clone, Serialize)]
pub struct HolRun {
    /// `fifo`, `static 50:50` or `70/30 borrowing`.
    pub policy: String,
    /// Interactive wait (submission to claim), p50 and p99, ms.
    pub interactive_wait_ms: [f64; 2],
    /// Interactive latency (submission to completion), p50 and p99, ms.
    pub interactive_latency_ms: [f64; 2],
    /// Interactive service time (claim to completion), p99, ms.
    pub interactive_service_p99_ms: f64,
    /// Synthesis tasks completed per second of the run (submission of the first to completion of the
    /// last task of any kind).
    pub synthesis_per_s: f64,
    /// Busy slot time over slots x makespan.
    pub utilization: f64,
    /// First submission to last completion, s.
    pub makespan_s: f64,
    /// The interactive tail (latency at or above its p99): how many tasks, and of them how many
    /// arrived with every slot busy (queueing a free slot could not avoid without preemption).
    pub tail: [usize; 2],
    /// The tail's waits, ms, p50 among those that found a free slot (what dispatch costs).
    pub tail_free_wait_p50_ms: f64,
}

/// Splits the interactive tail (latency at or above the p99) by whether every slot was busy when
/// each arrived. `tasks`: (created, started, finished, interactive) ms, every task of the run.
fn tail_causes(tasks: &[(u64, u64, u64, bool)], slots: usize, p99: f64) -> ([usize; 2], f64) {
    let mut free_waits = Vec::new();
    let mut tail = [0usize; 2];
    for &(created, started, finished, interactive) in tasks {
        if !interactive || ((finished - created) as f64) < p99 {
            continue;
        }
        tail[0] += 1;
        let busy = tasks.iter().filter(|t| t.1 <= created && created < t.2).count();
        if busy >= slots {
            tail[1] += 1;
        } else {
            free_waits.push(started.saturating_sub(created) as f64);
        }
    }
    (tail, crate::percentile(&mut free_waits, 50.0))
}

/// What `lanes bench hol` reports.
#[derive(Debug, Clone, Serialize)]
pub struct HolReport {
    /// The command that reproduces it.
    pub command: String,
    /// Worker slots.
    pub slots: usize,
    /// Real ms per workload second (one workload second becomes this).
    pub scale_ms: u64,
    /// Tasks submitted (interactive, synthesis).
    pub tasks: [usize; 2],
    /// One run per policy.
    pub runs: Vec<HolRun>,
    /// 70/30's interactive p99 latency over its service p99.
    pub interactive_p99_over_service: f64,
    /// FIFO's interactive p99 latency over 70/30's.
    pub fifo_over_weighted: f64,
    /// 70/30's synthesis throughput over FIFO's.
    pub synthesis_vs_fifo: f64,
    /// The share of interactive's reservation the 70/30 pool keeps free while interactive has work.
    pub headroom: f64,
    /// The goal lines, from the figures above.
    pub goals: Vec<Goal>,
}

impl HolReport {
    fn judged(mut self) -> Self {
        let p99 = "70/30 interactive p99 / its service p99";
        self.goals = vec![
            Goal::new("p99_over_service", p99, self.interactive_p99_over_service).at_most(1.2),
            Goal::new("fifo_over_weighted", "FIFO / 70/30 interactive p99", self.fifo_over_weighted)
                .at_least(10.0)
                .shown(Unit::Times, 1),
            Goal::new("synthesis_vs_fifo", "70/30 synthesis throughput / FIFO's", self.synthesis_vs_fifo)
                .at_least(0.95),
        ];
        self
    }
}

/// A mixed workload time-scaled (1 s -> `scale_ms`): a Poisson stream for `seconds` of real time,
/// 5% synthesis (45-180 s) and 95% interactive (0.5-2 s) at about 85% of `slots`, through the real
/// pool and embedded queues and store, under three policies.
pub async fn hol_report(slots: usize, seconds: f64, scale_ms: u64) -> Result<HolReport, String> {
    use lanes_core::domain::{TaskMessage, TaskRecord, TaskRequest};
    use lanes_core::ports::{QueueConsume, QueueSend};
    let err = |e: &dyn std::fmt::Display| e.to_string();
    // A fixed pseudo-random stream, so every policy sees the same arrivals.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let mean_service = 0.95 * 1.25 + 0.05 * 112.5; // workload seconds
    let rate = 0.85 * slots as f64 / mean_service; // arrivals per workload second
    let mut arrivals: Vec<(f64, bool, u64)> = Vec::new(); // (real ms offset, synthesis, service ms)
    let mut t = 0.0;
    while t < seconds * 1000.0 {
        t += -(1.0 - rnd()).ln() / rate * scale_ms as f64;
        let synthesis = rnd() < 0.05;
        let service = if synthesis { 45.0 + rnd() * 135.0 } else { 0.5 + rnd() * 1.5 };
        arrivals.push((t, synthesis, (service * scale_ms as f64).round().max(1.0) as u64));
    }
    let counts = [arrivals.iter().filter(|a| !a.1).count(), arrivals.iter().filter(|a| a.1).count()];
    let mut runs = Vec::new();
    for policy in ["fifo", "static 50:50", "70/30 borrowing"] {
        let dir = crate::temp_dir().map_err(|e| err(&e))?;
        let clock: lanes_core::clock::SharedClock = Arc::new(SystemClock);
        let (adapters, queues) = lanes_core::wiring::embedded(&dir, Default::default(), clock.clone())
            .await
            .map_err(|e| err(&e))?;
        let worker = adapters.task_worker(
            Arc::new(crate::SleepLlm),
            lanes_core::metrics::Metrics::new(),
            clock.clone(),
            Default::default(),
        );
        let (shares, lanes): ([f64; 3], Vec<Lane>) = match policy {
            "fifo" => ([1.0, 0.0, 0.0], vec![Lane::Interactive]),
            "static 50:50" => ([0.5, 0.5, 0.0], vec![Lane::Interactive, Lane::Synthesis]),
            _ => ([0.7, 0.3, 0.0], vec![Lane::Interactive, Lane::Synthesis]),
        };
        let consumers: Vec<(Lane, Arc<dyn QueueConsume>)> =
            lanes.iter().map(|&l| (l, adapters.consume[l.index()].clone())).collect();
        // Interactive stays "active" for ten workload seconds after its last task.
        let mut pool =
            lanes_core::pool::Pool::new(slots, shares, consumers, worker, Duration::from_millis(2))
                .with_idle_grace(Duration::from_millis(10 * scale_ms));
        if policy == "static 50:50" {
            pool = pool.without_borrowing();
        }
        let pool = crate::RunningPool::start(pool);
        let started = Instant::now();
        let mut ids = Vec::with_capacity(arrivals.len());
        for (i, &(at, synthesis, ms)) in arrivals.iter().enumerate() {
            let due = started + Duration::from_micros((at * 1000.0) as u64);
            tokio::time::sleep_until(due.into()).await;
            let kind = if synthesis { "refactor" } else { "explain" };
            let req = TaskRequest::from_value(serde_json::json!({"project_id": "hol", "kind": kind,
                "prompt": format!("ms={ms} task {i}"), "target_files": []}))
            .map_err(|e| format!("{e:?}"))?;
            let rec = TaskRecord::pending(req.task_id(None), req, clock.now_ms(), 3_600);
            adapters.store.put_pending(&rec, clock.now_ms()).await.map_err(|e| err(&e))?;
            // FIFO: one queue for every kind.
            let lane = if policy == "fifo" { Lane::Interactive } else { rec.lane };
            let msg = TaskMessage { task_id: rec.task_id.clone(), lane: rec.lane, kind: rec.request.kind };
            queues[lane.index()]
                .send(&serde_json::to_string(&msg).map_err(|e| err(&e))?, Default::default())
                .await
                .map_err(|e| err(&e))?;
            ids.push((rec.task_id, synthesis));
        }
        crate::drain(&queues[..2], Duration::from_secs(120)).await?;
        pool.stop().await;
        let mut waits = Vec::new();
        let mut latencies = Vec::new();
        let mut services = Vec::new();
        let (mut first, mut last, mut busy, mut synth_done) = (u64::MAX, 0u64, 0u64, 0usize);
        let mut all = Vec::new();
        for (id, synthesis) in &ids {
            let Some(r) = adapters.store.get(id, clock.now_ms()).await.map_err(|e| err(&e))? else {
                continue;
            };
            let (Some(s), Some(f)) = (r.started_at_ms, r.finished_at_ms) else { continue };
            first = first.min(r.created_at_ms);
            last = last.max(f);
            busy += f.saturating_sub(s);
            all.push((r.created_at_ms, s, f, !*synthesis));
            if *synthesis {
                synth_done += 1;
            } else {
                waits.push(s.saturating_sub(r.created_at_ms) as f64);
                latencies.push(f.saturating_sub(r.created_at_ms) as f64);
                services.push(f.saturating_sub(s) as f64);
            }
        }
        let makespan_s = last.saturating_sub(first) as f64 / 1000.0;
        let latency_p99 = crate::percentile(&mut latencies.clone(), 99.0);
        let (tail, tail_free_wait_p50_ms) = tail_causes(&all, slots, latency_p99);
        runs.push(HolRun {
            policy: policy.into(),
            interactive_wait_ms: [crate::percentile(&mut waits, 50.0), crate::percentile(&mut waits, 99.0)],
            interactive_latency_ms: [
                crate::percentile(&mut latencies, 50.0),
                crate::percentile(&mut latencies, 99.0),
            ],
            interactive_service_p99_ms: crate::percentile(&mut services, 99.0),
            synthesis_per_s: synth_done as f64 / makespan_s.max(1e-3),
            utilization: busy as f64 / 1000.0 / (slots as f64 * makespan_s.max(1e-3)),
            makespan_s,
            tail,
            tail_free_wait_p50_ms,
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
    let weighted = &runs[2];
    let fifo = &runs[0];
    Ok(HolReport {
        command: format!("lanes bench hol --slots {slots} --seconds {seconds} --scale-ms {scale_ms}"),
        slots,
        scale_ms,
        tasks: counts,
        interactive_p99_over_service: weighted.interactive_latency_ms[1]
            / weighted.interactive_service_p99_ms.max(1e-3),
        fifo_over_weighted: fifo.interactive_latency_ms[1] / weighted.interactive_latency_ms[1].max(1e-3),
        synthesis_vs_fifo: weighted.synthesis_per_s / fifo.synthesis_per_s.max(1e-9),
        headroom: lanes_core::pool::INTERACTIVE_HEADROOM,
        runs,
        goals: Vec::new(),
    }
    .judged())
}

impl std::fmt::Display for HolReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Head-of-line blocking, {} slots, 1 s = {} ms, {} interactive + {} synthesis tasks ({})",
            self.slots, self.scale_ms, self.tasks[0], self.tasks[1], self.command
        )?;
        writeln!(
            f,
            "{:<16} {:>14} {:>17} {:>16} {:>13} {:>11} {:>9}",
            "policy",
            "int. wait p99",
            "int. latency p50",
            "int. latency p99",
            "synthesis/s",
            "utilization",
            "makespan"
        )?;
        for run in &self.runs {
            writeln!(
                f,
                "{:<16} {:>11.0} ms {:>14.0} ms {:>13.0} ms {:>13.2} {:>10.0}% {:>7.1} s   tail {} ({} with every slot busy; free-slot wait p50 {:.0} ms)",
                run.policy,
                run.interactive_wait_ms[1],
                run.interactive_latency_ms[0],
                run.interactive_latency_ms[1],
                run.synthesis_per_s,
                run.utilization * 100.0,
                run.makespan_s,
                run.tail[0],
                run.tail[1],
                run.tail_free_wait_p50_ms
            )?;
        }
        write_goals(f, &self.goals)
    }
}
