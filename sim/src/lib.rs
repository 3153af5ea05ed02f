//! # lanes-sim
//!
//! A deterministic simulation of the task lifecycle: the real core (ingress, worker, lease, pool,
//! the Lambda batch glue, the DLQ sweep and redrive) over the embedded twins, every port behind a
//! fault injector, on tokio's paused clock and one thread, so a history is decided by its seed
//! alone and ten simulated minutes run in milliseconds. After each history the invariants are
//! checked; a violation carries its seed and the trace that led to it (docs/ARCHITECTURE.md,
//! Lifecycle simulation).
//!
//! # Layout
//!
//! - [`faults`]: the plan of a history's faults, the processes that crash, the port wrappers.
//! - [`oracle`]: the invariants and the book that checks them.
//! - [`history`]: one history: the world, the actors, the phases.
//! - this file: many histories across threads, and their summary.

pub mod batches;
pub mod commits;
pub mod faults;
pub mod history;
pub mod oracle;

pub use history::{HistoryReport, Options};
use serde::Serialize;
use std::collections::BTreeMap;

/// What a run of many histories found.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Histories run.
    pub histories: u64,
    /// First seed.
    pub first_seed: u64,
    /// Wall time (s).
    pub elapsed_secs: f64,
    /// Histories per minute of wall time.
    pub histories_per_minute: f64,
    /// Mean faults injected per history.
    pub faults_per_history: f64,
    /// Mean simulated seconds per history.
    pub simulated_secs_per_history: f64,
    /// Violations per invariant.
    pub violations: BTreeMap<&'static str, u64>,
    /// Histories that exercised each invariant.
    pub exercised: BTreeMap<&'static str, u64>,
    /// Tasks by model calls per run (0, 1, 2, ...).
    pub calls_per_run: BTreeMap<u32, u64>,
    /// Model calls beyond one per run that the simulation's breaks justify.
    pub justified_extra_calls: u64,
    /// Completed answers that continued a lost run's saved text.
    pub continued_answers: u64,
    /// Completion tokens those answers did not pay for again.
    pub tokens_saved: u64,
    /// Runs of tasks in all.
    pub runs: u64,
    /// The first failing history of each invariant, with its violations.
    pub failures: Vec<HistoryReport>,
    /// Every failing seed, with the invariants it broke: the list to replay.
    pub failing_seeds: BTreeMap<u64, Vec<&'static str>>,
}

impl Summary {
    /// Violations in all.
    pub fn violation_count(&self) -> u64 {
        self.violations.values().sum()
    }
}

/// Wall time after which a history is reported as making no progress. A history is ten simulated
/// minutes that take milliseconds; one that runs this long is spinning without letting the paused
/// clock advance (a loop that never waits), or advancing it without end.
pub const STUCK_AFTER: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs `count` histories from `first_seed` on `threads` threads (each history on its own
/// single-threaded runtime), stopping early after `stop_after` failing histories when set. A
/// watchdog names on stderr, once each, every history (by its seed) that has run longer than
/// [`STUCK_AFTER`], so a run that does not end says which history to replay.
pub fn run_many(
    first_seed: u64,
    count: u64,
    threads: usize,
    options: &Options,
    stop_after: Option<usize>,
) -> Summary {
    use std::sync::atomic::Ordering::Relaxed;
    let started = std::time::Instant::now();
    let next = std::sync::atomic::AtomicU64::new(0);
    let failed = std::sync::atomic::AtomicUsize::new(0);
    let reports = std::sync::Mutex::new(Vec::new());
    let threads = threads.max(1);
    // The seed each thread runs, and since when.
    let running: std::sync::Mutex<Vec<Option<(u64, std::time::Instant)>>> =
        std::sync::Mutex::new(vec![None; threads]);
    let finished = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for slot in 0..threads {
            let (next, failed, reports, running, finished) = (&next, &failed, &reports, &running, &finished);
            s.spawn(move || {
                // Counted done even if a history panics, so the watchdog ends and the panic surfaces.
                let _done = Done(finished);
                loop {
                    if stop_after.is_some_and(|n| failed.load(Relaxed) >= n) {
                        break;
                    }
                    let i = next.fetch_add(1, Relaxed);
                    if i >= count {
                        break;
                    }
                    let seed = first_seed.wrapping_add(i);
                    if let Ok(mut r) = running.lock() {
                        r[slot] = Some((seed, std::time::Instant::now()));
                    }
                    let report = history::run(seed, options);
                    if !report.violations.is_empty() {
                        failed.fetch_add(1, Relaxed);
                    }
                    if let Ok(mut r) = reports.lock() {
                        r.push(report);
                    }
                }
            });
        }
        s.spawn(|| watch(&running, &finished, threads));
    });
    let mut reports = reports.into_inner().unwrap_or_else(|p| p.into_inner());
    reports.sort_by_key(|r| r.seed);
    summarize(first_seed, &reports, started.elapsed().as_secs_f64())
}

/// Counts a thread of [`run_many`] done when it ends, however it ends.
struct Done<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The watchdog of [`run_many`]: until every thread is done, names each history that has run
/// longer than [`STUCK_AFTER`].
fn watch(
    running: &std::sync::Mutex<Vec<Option<(u64, std::time::Instant)>>>,
    finished: &std::sync::atomic::AtomicUsize,
    threads: usize,
) {
    let mut named = std::collections::BTreeSet::new();
    while finished.load(std::sync::atomic::Ordering::Relaxed) < threads {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let Ok(now) = running.lock().map(|r| r.clone()) else { return };
        for (seed, since) in now.into_iter().flatten() {
            if since.elapsed() >= STUCK_AFTER && named.insert(seed) {
                eprintln!(
                    "lanes sim: history {seed} has run {} s of wall time without ending; replay it with \
                     `lanes sim --seed {seed} --histories 1 --trace`",
                    since.elapsed().as_secs()
                );
            }
        }
    }
}

fn summarize(first_seed: u64, reports: &[HistoryReport], elapsed: f64) -> Summary {
    let n = reports.len().max(1) as f64;
    let mut violations: BTreeMap<&'static str, u64> = oracle::INVARIANTS.iter().map(|i| (*i, 0)).collect();
    let mut exercised: BTreeMap<&'static str, u64> = oracle::INVARIANTS.iter().map(|i| (*i, 0)).collect();
    let mut calls_per_run = BTreeMap::new();
    for r in reports {
        for v in &r.violations {
            *violations.entry(v.invariant).or_default() += 1;
        }
        for e in &r.exercised {
            *exercised.entry(e).or_default() += 1;
        }
        for c in &r.calls_per_run {
            *calls_per_run.entry(*c).or_default() += 1;
        }
    }
    Summary {
        histories: reports.len() as u64,
        first_seed,
        elapsed_secs: elapsed,
        histories_per_minute: reports.len() as f64 / (elapsed / 60.0).max(1e-9),
        faults_per_history: reports.iter().map(|r| r.faults as f64).sum::<f64>() / n,
        simulated_secs_per_history: reports.iter().map(|r| r.simulated_secs as f64).sum::<f64>() / n,
        violations,
        exercised,
        calls_per_run,
        justified_extra_calls: reports.iter().map(|r| u64::from(r.justified_extra)).sum(),
        continued_answers: reports.iter().map(|r| u64::from(r.continued.0)).sum(),
        tokens_saved: reports.iter().map(|r| r.continued.1).sum(),
        runs: reports.iter().map(|r| u64::from(r.runs)).sum(),
        failures: first_failures(reports),
        failing_seeds: reports
            .iter()
            .filter(|r| !r.violations.is_empty())
            .map(|r| {
                let mut broke: Vec<&'static str> = r.violations.iter().map(|v| v.invariant).collect();
                broke.sort_unstable();
                broke.dedup();
                (r.seed, broke)
            })
            .collect(),
    }
}

/// The first history that broke each invariant (one history may stand for several).
fn first_failures(reports: &[HistoryReport]) -> Vec<HistoryReport> {
    let mut out: Vec<HistoryReport> = Vec::new();
    for invariant in oracle::INVARIANTS {
        let first = reports.iter().find(|r| r.violations.iter().any(|v| v.invariant == invariant));
        if let Some(r) = first
            && !out.iter().any(|o| o.seed == r.seed)
        {
            out.push(r.clone());
        }
    }
    out
}
