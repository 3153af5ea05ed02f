//! `lanes bench soak`: `lanes dev` on embedded defaults (offline model, no latency) under a long
//! stream of interactive tasks whose records expire after `--record-ttl-secs`, with the expiry sweep
//! running every few seconds: whether the cost stays flat as the work grows. Reported: tasks/s per
//! tenth of the run (the first against the last), the server's resident memory and data file per
//! tenth, and the data file's size at the end against the pages in use in it and the live data in it
//! (the file compacted).

use crate::goals::{Goal, write_goals};
use lanes_tests::DevServer;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One tenth of the submissions.
#[derive(Debug, Clone, Serialize)]
pub struct SoakTenth {
    /// `POST /v1/tasks` answered per second in this tenth.
    pub tasks_per_s: f64,
    /// The server's resident memory (VmRSS) at the end of this tenth, MiB.
    pub rss_mib: f64,
    /// Interactive messages queued or in flight at the end of this tenth (the server's
    /// `lanes_queue_depth` plus `lanes_queue_in_flight`): whether the workers keep up.
    pub backlog: u64,
    /// The data file's size at the end of this tenth, MiB: whether it still grows.
    pub file_mib: f64,
}

/// What `lanes bench soak` reports.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// The command that reproduces it.
    pub command: String,
    /// Tasks submitted.
    pub tasks: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// The records' TTL given to the server.
    pub record_ttl_secs: u64,
    /// The expiry sweep's period given to the server.
    pub sweep_secs: u64,
    /// The server's worker slots.
    pub capacity: usize,
    /// Tasks submitted before the first tenth, while the records of the first ones live out their
    /// TTL and are swept (`record_ttl_secs` plus two sweeps): the tenths then measure a data file
    /// at its steady size, not one growing from empty.
    pub warmup_tasks: usize,
    /// `POST /v1/tasks` answered per second during the warm-up.
    pub warmup_tasks_per_s: f64,
    /// The data file's size at the end of the warm-up, MiB.
    pub warmup_file_mib: f64,
    /// Each tenth of the run, in order.
    pub tenths: Vec<SoakTenth>,
    /// The last tenth's rate over the first's.
    pub last_over_first: f64,
    /// The data file's size at the end, bytes.
    pub file_bytes: u64,
    /// The pages in use in the file at the end (redb's allocated pages), bytes: the file less its
    /// free pages.
    pub in_use_bytes: u64,
    /// The same file compacted (only what is live in it), bytes.
    pub live_bytes: u64,
    /// `file_bytes / live_bytes`.
    pub file_over_live: f64,
    /// Peak resident memory of the server (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// Tasks not completed (or expired) by the end: the workers fell behind.
    pub unfinished: usize,
    /// RSS in the last tenth over the first, of the tenths where it was read.
    pub rss_last_over_first: f64,
    /// The goal lines, from the figures above.
    pub goals: Vec<Goal>,
}

impl SoakReport {
    fn judged(mut self) -> Self {
        let read: Vec<f64> = self.tenths.iter().map(|t| t.rss_mib).filter(|r| *r > 0.0).collect();
        self.rss_last_over_first = match (read.first(), read.last()) {
            (Some(first), Some(last)) => last / first,
            _ => f64::NAN,
        };
        let file = "data file / live data (a compacted copy)";
        self.goals = vec![
            Goal::new("last_over_first", "tasks/s, last tenth / first", self.last_over_first).at_least(0.9),
            Goal::new("file_over_live", file, self.file_over_live).at_most(2.0),
            Goal::new(
                "rss_last_over_first",
                "RSS, last tenth / first (flat after warm-up)",
                self.rss_last_over_first,
            )
            .at_most(crate::goals::RSS_FLAT),
        ];
        self
    }
}

/// Streams `tasks` interactive tasks from `clients` clients at a `lanes dev` whose records expire
/// after `ttl_secs`, swept every `sweep_secs`.
pub async fn soak_report(
    tasks: usize,
    clients: usize,
    ttl_secs: u64,
    sweep_secs: u64,
    capacity: usize,
) -> Result<SoakReport, String> {
    let dir = crate::temp_dir().map_err(|e| e.to_string())?;
    let (ttl, sweep, slots) = (ttl_secs.to_string(), sweep_secs.to_string(), capacity.to_string());
    let args = [
        "--interactive-latency-ms",
        "0",
        "--record-ttl-secs",
        &ttl,
        "--expiry-sweep-secs",
        &sweep,
        "--capacity",
        &slots,
    ];
    let mut server = DevServer::start(&dir, &args).await;
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    // Unbounded through the warm-up; then `tasks` more.
    let limit = Arc::new(AtomicUsize::new(usize::MAX));
    let handles = spawn_clients(clients, &client, &server.url, [&next, &done, &limit]);
    let warmup = Duration::from_secs(ttl_secs + 2 * sweep_secs);
    tokio::time::sleep(warmup).await;
    let warmup_tasks = done.load(Ordering::Relaxed);
    let file = dir.join("lanes.redb");
    let file_mib = || std::fs::metadata(&file).map_or(0.0, |m| m.len() as f64 / 1048576.0);
    let warmup_file_mib = file_mib();
    let start = next.load(Ordering::Relaxed);
    limit.store(start + tasks, Ordering::Relaxed);
    // A tenth ends when a tenth more tasks were answered: its rate, and the server's memory then.
    let mut tenths = Vec::new();
    let mut at = Instant::now();
    for k in 1..=10 {
        while done.load(Ordering::Relaxed) < start + tasks * k / 10
            && !handles.iter().all(|h| h.is_finished())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rss = server.rss_kib().unwrap_or(0) as f64 / 1024.0;
        let tasks_per_s = (tasks / 10) as f64 / at.elapsed().as_secs_f64();
        let backlog = backlog(&client, &server.url).await.unwrap_or(0);
        tenths.push(SoakTenth { tasks_per_s, rss_mib: rss, backlog, file_mib: file_mib() });
        at = Instant::now();
    }
    let mut lasts = Vec::new();
    for h in handles {
        lasts.push(h.await.map_err(|e| e.to_string())??);
    }
    let unfinished = unfinished(&client, &server.url, &lasts).await;
    let peak_rss_mib = server.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    server.kill9();
    let (file_bytes, in_use_bytes, live_bytes) = sizes(&file)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(SoakReport {
        command: format!(
            "lanes bench soak --tasks {tasks} --clients {clients} --record-ttl-secs {ttl_secs} --sweep-secs {sweep_secs} --capacity {capacity}"
        ),
        tasks,
        clients,
        record_ttl_secs: ttl_secs,
        sweep_secs,
        capacity,
        warmup_tasks,
        warmup_tasks_per_s: warmup_tasks as f64 / warmup.as_secs_f64(),
        warmup_file_mib,
        last_over_first: tenths[9].tasks_per_s / tenths[0].tasks_per_s.max(1e-9),
        tenths,
        file_bytes,
        in_use_bytes,
        live_bytes,
        file_over_live: file_bytes as f64 / live_bytes.max(1) as f64,
        peak_rss_mib,
        unfinished,
        rss_last_over_first: f64::NAN,
        goals: Vec::new(),
    }
    .judged())
}

/// `clients` clients, each submitting the next task (the `next` counter) until `limit` is reached,
/// counting the answered ones in `done`; each answers the id of its last task.
fn spawn_clients(
    clients: usize,
    client: &reqwest::Client,
    url: &str,
    [next, done, limit]: [&Arc<AtomicUsize>; 3],
) -> Vec<tokio::task::JoinHandle<Result<String, String>>> {
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (client, url) = (client.clone(), url.to_owned());
        let (next, done, limit) = (next.clone(), done.clone(), limit.clone());
        handles.push(tokio::spawn(async move {
            let mut last = String::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= limit.load(Ordering::Relaxed) {
                    break;
                }
                last = crate::submit_task(&client, &url, "explain", &format!("soak task {i}")).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, String>(last)
        }));
    }
    handles
}

/// Of each client's last task, those not completed (nor expired) within two minutes.
async fn unfinished(client: &reqwest::Client, url: &str, lasts: &[String]) -> usize {
    let until = Instant::now() + Duration::from_secs(120);
    let mut unfinished = lasts.len();
    while unfinished > 0 && Instant::now() < until {
        unfinished = 0;
        for id in lasts {
            if !matches!(crate::status(client, url, id).await.as_deref(), Some("COMPLETED") | None) {
                unfinished += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unfinished
}

/// The data file's size, the pages in use in it, and the size of a compacted copy of it (what is
/// live in it). The pages are counted on the copy, once redb has repaired it (the server was killed).
fn sizes(path: &std::path::Path) -> Result<(u64, u64, u64), String> {
    let file_bytes = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    let copy = path.with_extension("compacted");
    std::fs::copy(path, &copy).map_err(|e| e.to_string())?;
    let mut db = redb::Database::open(&copy).map_err(|e| e.to_string())?;
    let txn = db.begin_write().map_err(|e| e.to_string())?;
    let stats = txn.stats().map_err(|e| e.to_string())?;
    let in_use_bytes = stats.allocated_pages() * stats.page_size() as u64;
    txn.abort().map_err(|e| e.to_string())?;
    while db.compact().map_err(|e| e.to_string())? {}
    drop(db);
    let live_bytes = std::fs::metadata(&copy).map_err(|e| e.to_string())?.len();
    Ok((file_bytes, in_use_bytes, live_bytes))
}

/// The interactive lane's messages queued and in flight, from the server's `/metrics`.
async fn backlog(client: &reqwest::Client, url: &str) -> Option<u64> {
    let text = client.get(format!("{url}/metrics")).send().await.ok()?.text().await.ok()?;
    let gauge = |name: &str| lanes_tests::sample_value(&text, &format!("{name}{{lane=\"interactive\"}}"));
    Some((gauge("lanes_queue_depth")? + gauge("lanes_queue_in_flight")?) as u64)
}

impl std::fmt::Display for SoakReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Soak: {} tasks from {} clients, records kept {} s, swept every {} s ({})",
            self.tasks, self.clients, self.record_ttl_secs, self.sweep_secs, self.command
        )?;
        writeln!(
            f,
            "  warm-up: {} tasks at {:.0} tasks/s, until the first records had expired and been swept; \
             data file {:.1} MiB",
            self.warmup_tasks, self.warmup_tasks_per_s, self.warmup_file_mib
        )?;
        for (k, t) in self.tenths.iter().enumerate() {
            writeln!(
                f,
                "  tenth {:>2}: {:>8.0} tasks/s, RSS {:>6.1} MiB, backlog {:>7}, data file {:>6.1} MiB",
                k + 1,
                t.tasks_per_s,
                t.rss_mib,
                t.backlog,
                t.file_mib
            )?;
        }
        writeln!(
            f,
            "data file {:.1} MiB, in use {:.1} MiB, live data {:.1} MiB",
            self.file_bytes as f64 / 1048576.0,
            self.in_use_bytes as f64 / 1048576.0,
            self.live_bytes as f64 / 1048576.0,
        )?;
        writeln!(f, "peak RSS {:.1} MiB; unfinished at the end: {}", self.peak_rss_mib, self.unfinished)?;
        write_goals(f, &self.goals)
    }
}
