//! `lanes bench throughput`: concurrent clients submitting interactive tasks to `lanes dev` (offline
//! model, no latency) on embedded defaults and on Redis + moto: ingress and end-to-end rates, latency,
//! peak memory, and the embedded file's group commits. On embedded, the same load also comes on a
//! fixed schedule below the measured limit (open loop), for latencies the client count does not set.

use crate::goals::{Goal, Unit, write_goals};
use lanes_tests::DevServer;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One backend's result in `lanes bench throughput`.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputRun {
    /// `embedded` or `redis + moto`.
    pub backend: String,
    /// Tasks submitted.
    pub tasks: usize,
    /// The open-loop rate offered, tasks a second; `None` for the closed-loop run (as fast as its
    /// clients are answered).
    pub offered_per_s: Option<f64>,
    /// Open loop: the p99 of how late after its scheduled time a POST left, ms (the schedule's
    /// timer ticks every millisecond); `None` for the closed loop.
    pub late_p99_ms: Option<f64>,
    /// `POST /v1/tasks` answered per second (concurrent clients).
    pub ingress_per_s: f64,
    /// `POST /v1/tasks` latency p50 and p99, ms, from the moment each POST left.
    pub ingress_latency_ms: [f64; 2],
    /// Tasks completed per second, first submission to last completion.
    pub tasks_per_s: f64,
    /// Acceptance to completion, p50 and p99, ms, over every completed task: the server's own
    /// timestamps (`created_at_ms`, `finished_at_ms` of each task), so raw samples, not buckets.
    pub task_latency_ms: [f64; 2],
    /// Tasks whose latency was counted (the completed ones).
    pub latency_samples: usize,
    /// Peak resident memory of the server (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// The server's CPU time (user and system, every thread) from its start to the last task's
    /// completion, per task, ms.
    pub server_cpu_ms_per_task: f64,
    /// What the server caused to be written to storage over the same span (`write_bytes` of
    /// `/proc/<pid>/io`), per task, KiB.
    pub disk_kib_per_task: f64,
    /// The bench's own CPU time while its clients submit (HTTP, JSON), per task, ms: what the load
    /// takes of the cores the server shares.
    pub client_cpu_ms_per_task: f64,
    /// The embedded file's group commits over the same span, from the server's `/metrics`; `None`
    /// on Redis + moto, which has no such file.
    pub group_commits: Option<GroupCommits>,
}

/// What the embedded writer's group commits did in a run (`lanes_embedded_group_commit*`).
#[derive(Debug, Clone, Serialize)]
pub struct GroupCommits {
    /// Group commits per task submitted.
    pub per_task: f64,
    /// Writes a group commit carried, on average.
    pub writes_per_commit: f64,
    /// A group's mean time, its writes run and committed, ms.
    pub mean_ms: f64,
    /// The upper bound of the histogram bucket holding the 99th percentile group time, ms.
    pub p99_bucket_ms: f64,
}

impl GroupCommits {
    /// Read from a Prometheus text exposition; `None` when it has no group commits.
    pub fn parse(text: &str, tasks: usize) -> Option<Self> {
        let value = |name: &str| lanes_tests::sample_value(text, name);
        let commits = value("lanes_embedded_group_commits_total").filter(|c| *c > 0.0)?;
        let writes = value("lanes_embedded_group_commit_writes_total")?;
        let sum = value("lanes_embedded_group_commit_seconds_sum")?;
        // Buckets are cumulative: the first whose count reaches 99% of the commits holds the p99.
        let p99_bucket_ms = text
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("lanes_embedded_group_commit_seconds_bucket{le=\"")?;
                let (le, count) = rest.split_once("\"}")?;
                Some((le.parse::<f64>().ok()?, count.trim().parse::<f64>().ok()?))
            })
            .find(|(_, count)| *count >= 0.99 * commits)
            .map_or(f64::INFINITY, |(le, _)| le * 1000.0);
        Some(Self {
            per_task: commits / tasks.max(1) as f64,
            writes_per_commit: writes / commits,
            mean_ms: sum / commits * 1000.0,
            p99_bucket_ms,
        })
    }
}

/// What `lanes bench throughput` reports.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputReport {
    /// The command that reproduces it.
    pub command: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Worker slots of the server.
    pub capacity: usize,
    /// CPUs the machine offers (`available_parallelism`): the bench's clients and the server share
    /// them.
    pub cores: usize,
    /// One closed-loop run per backend.
    pub runs: Vec<ThroughputRun>,
    /// Embedded, open loop: tasks offered at each of [`OPEN_LOOP_SHARES`] of the closed-loop run's
    /// tasks/s, so the latencies are those of a server below its limit rather than of a queue the
    /// bench's own client count sets.
    pub open_loop: Vec<ThroughputRun>,
    /// The goal lines, on the embedded runs (none without them).
    pub goals: Vec<Goal>,
}

/// The embedded end-to-end rate the goal asks for, tasks/s.
pub const GOAL_TASKS_PER_S: f64 = 10_000.0;

/// The ingress p99 the goal allows, ms.
pub const GOAL_INGRESS_P99_MS: f64 = 5.0;

impl ThroughputReport {
    fn judged(mut self) -> Self {
        let Some(emb) = self.runs.iter().find(|r| r.backend == "embedded") else { return self };
        let cores = self.cores;
        let mut goals = vec![
            Goal::new("tasks_per_s", format!("embedded tasks/s on {cores} cores"), emb.tasks_per_s)
                .at_least(GOAL_TASKS_PER_S)
                .shown(Unit::PerSecond, 0),
            Goal::new(
                "ingress_p99_closed",
                format!("embedded ingress p99, {} closed-loop clients", self.clients),
                emb.ingress_latency_ms[1],
            )
            .at_most(GOAL_INGRESS_P99_MS)
            .shown(Unit::Ms, 1),
        ];
        goals.extend(self.open_loop.iter().map(|o| {
            let offered = o.offered_per_s.unwrap_or(0.0);
            let share = 100.0 * offered / emb.tasks_per_s.max(1e-9);
            let what = format!(
                "embedded ingress p99, open loop at {offered:.0} tasks/s ({share:.0}% of the closed loop's)"
            );
            Goal::new(format!("ingress_p99_open_{share:.0}"), what, o.ingress_latency_ms[1])
                .at_most(GOAL_INGRESS_P99_MS)
                .shown(Unit::Ms, 1)
        }));
        self.goals = goals;
        self
    }
}

/// The shares of the embedded closed-loop run's tasks/s that the open-loop runs offer.
pub const OPEN_LOOP_SHARES: [f64; 2] = [0.5, 0.8];

/// `tasks` interactive tasks from `clients` concurrent clients against `lanes dev` (offline model, no
/// simulated latency): on embedded defaults, then on Redis + moto when `redis-server` and the venv's
/// `moto_server` are there (`make test-deps` installs both). Ingress rate and latency, end-to-end rate
/// and latency, peak memory of the server. On embedded, then, `tasks` more at each of
/// [`OPEN_LOOP_SHARES`] of the closed loop's tasks/s, each on a fresh server.
/// `backend`: `embedded` or `aws` alone, both when `None`. `aws_tasks`: the task count on Redis +
/// moto, when it differs (moto answers one request at a time, so a run long enough to steady the
/// embedded figures would take it an hour).
pub async fn throughput_report(
    tasks: usize,
    aws_tasks: Option<usize>,
    clients: usize,
    capacity: usize,
    backend: Option<&str>,
) -> Result<ThroughputReport, String> {
    let (mut runs, mut open_loop) = (Vec::new(), Vec::new());
    if backend != Some("aws") {
        let closed = throughput_run("embedded", &[], &[], tasks, Load::Closed { clients }, capacity).await?;
        for share in OPEN_LOOP_SHARES {
            let load = Load::Open { per_s: (share * closed.tasks_per_s).round().max(1.0) };
            open_loop.push(throughput_run("embedded", &[], &[], tasks, load, capacity).await?);
        }
        runs.push(closed);
    }
    if backend != Some("embedded") {
        match crate::aws_services() {
            Some((_moto, _redis, env)) => runs.push(
                throughput_run(
                    "redis + moto",
                    &["--backend", "aws", "--create"],
                    &env,
                    aws_tasks.unwrap_or(tasks),
                    Load::Closed { clients },
                    capacity,
                )
                .await?,
            ),
            None if backend == Some("aws") => {
                return Err("redis-server or moto_server is missing: run scripts/test-deps.sh".into());
            }
            None => {}
        }
    }
    let only = backend.map(|b| format!(" --backend {b}")).unwrap_or_default();
    let aws = aws_tasks.map(|n| format!(" --aws-tasks {n}")).unwrap_or_default();
    Ok(ThroughputReport {
        command: format!(
            "lanes bench throughput --tasks {tasks}{aws} --clients {clients} --capacity {capacity}{only}"
        ),
        clients,
        capacity,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        runs,
        open_loop,
        goals: Vec::new(),
    }
    .judged())
}

/// How the bench's clients offer their tasks.
#[derive(Debug, Clone, Copy)]
enum Load {
    /// `clients` clients, each submitting its next task as soon as its last is answered: the rate
    /// is whatever the server sustains, and by Little's law the mean latency is `clients` over it.
    Closed { clients: usize },
    /// One submission every `1 / per_s` seconds on a fixed schedule, whatever the answers: a server
    /// that falls behind does not slow the submissions down, so every wait it causes is measured (no
    /// coordinated omission).
    Open { per_s: f64 },
}

async fn throughput_run(
    backend: &str,
    extra: &[&str],
    env: &[(String, String)],
    tasks: usize,
    load: Load,
    capacity: usize,
) -> Result<ThroughputRun, String> {
    let dir = crate::temp_dir().map_err(|e| e.to_string())?;
    let capacity = capacity.to_string();
    let args = [&["--interactive-latency-ms", "0", "--capacity", &capacity][..], extra].concat();
    let server = DevServer::start_with_env(&dir, &args, env.to_vec()).await;
    let client = reqwest::Client::new();
    let started = Instant::now();
    let started_ms = lanes_tests::now_ms();
    let client_cpu_before = cpu_ms(Some(std::process::id()));
    let (submitted, late_p99_ms) = match load {
        Load::Closed { clients } => (submit_closed(&client, &server.url, tasks, clients).await?, None),
        Load::Open { per_s } => {
            let (submitted, late) = submit_open(&client, &server.url, tasks, per_s).await?;
            (submitted, Some(late))
        }
    };
    let ingress_s = started.elapsed().as_secs_f64();
    let client_cpu_ms =
        cpu_ms(Some(std::process::id())).zip(client_cpu_before).map_or(0.0, |(after, before)| after - before);
    let mut ingress_ms: Vec<f64> = submitted.iter().map(|(_, ms)| *ms).collect();
    // The submissions that may still be running: a closed loop's last round, or an open loop's
    // last few.
    let last = match load {
        Load::Closed { clients } => clients,
        Load::Open { .. } => 32,
    };
    let Completions { done, cpu_ms, written, group_commits } =
        await_completions(&client, &server, backend, &submitted, last).await?;
    let last_ms = done.iter().map(|(_, finished)| *finished).max().unwrap_or(started_ms);
    let mut task_ms: Vec<f64> = done.iter().map(|(c, f)| f.saturating_sub(*c) as f64).collect();
    let peak = server.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ThroughputRun {
        backend: backend.into(),
        tasks,
        offered_per_s: match load {
            Load::Closed { .. } => None,
            Load::Open { per_s } => Some(per_s),
        },
        late_p99_ms,
        ingress_per_s: tasks as f64 / ingress_s,
        ingress_latency_ms: [
            crate::percentile(&mut ingress_ms, 50.0),
            crate::percentile(&mut ingress_ms, 99.0),
        ],
        // First submission to the last completion, by the server's clock (the same machine's).
        tasks_per_s: done.len() as f64 / (last_ms.saturating_sub(started_ms).max(1) as f64 / 1000.0),
        latency_samples: task_ms.len(),
        task_latency_ms: [crate::percentile(&mut task_ms, 50.0), crate::percentile(&mut task_ms, 99.0)],
        peak_rss_mib: peak,
        server_cpu_ms_per_task: cpu_ms / tasks.max(1) as f64,
        disk_kib_per_task: written as f64 / 1024.0 / tasks.max(1) as f64,
        client_cpu_ms_per_task: client_cpu_ms / tasks.max(1) as f64,
        group_commits,
    })
}

/// `tasks` submissions from `clients` closed-loop clients: each task's id and its POST's latency, ms.
async fn submit_closed(
    client: &reqwest::Client,
    url: &str,
    tasks: usize,
    clients: usize,
) -> Result<Vec<(String, f64)>, String> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (client, url, next) = (client.clone(), url.to_owned(), next.clone());
        handles.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= tasks {
                    return Ok::<_, String>(out);
                }
                let t = Instant::now();
                let id =
                    crate::submit_task(&client, &url, "explain", &format!("throughput task {i}")).await?;
                out.push((id, t.elapsed().as_secs_f64() * 1000.0));
            }
        }));
    }
    let mut submitted = Vec::new();
    for h in handles {
        submitted.extend(h.await.map_err(|e| e.to_string())??);
    }
    Ok(submitted)
}

/// `tasks` submissions on a fixed schedule of `per_s` a second, each sent at its time whether or not
/// the earlier ones were answered: each task's id and its POST's latency from the moment it left,
/// ms, and the p99 of how late after its scheduled time a POST left, ms. The schedule's timer ticks
/// every millisecond, so a POST leaves up to a tick late; that wait is the bench's, not the
/// server's, and is reported apart rather than counted. A server that stalls does not hold the
/// schedule back (nothing waits for an answer), so its stall is in the latencies of the POSTs sent
/// during it.
async fn submit_open(
    client: &reqwest::Client,
    url: &str,
    tasks: usize,
    per_s: f64,
) -> Result<(Vec<(String, f64)>, f64), String> {
    let start = tokio::time::Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let at = start + Duration::from_secs_f64(i as f64 / per_s);
        tokio::time::sleep_until(at).await;
        let (client, url) = (client.clone(), url.to_owned());
        handles.push(tokio::spawn(async move {
            let left = tokio::time::Instant::now();
            let id = crate::submit_task(&client, &url, "explain", &format!("open-loop task {i}")).await?;
            let late_ms = left.duration_since(at).as_secs_f64() * 1000.0;
            Ok::<_, String>(((id, left.elapsed().as_secs_f64() * 1000.0), late_ms))
        }));
    }
    let (mut submitted, mut late) = (Vec::with_capacity(tasks), Vec::with_capacity(tasks));
    for h in handles {
        let (answered, late_ms) = h.await.map_err(|e| e.to_string())??;
        submitted.push(answered);
        late.push(late_ms);
    }
    Ok((submitted, crate::percentile(&mut late, 99.0)))
}

/// Waits for every submitted task to end (the last `last` submitted first), then reads each once:
/// the completed ones' timestamps, and the server's counters up to the last completion.
async fn await_completions(
    client: &reqwest::Client,
    server: &DevServer,
    backend: &str,
    submitted: &[(String, f64)],
    last: usize,
) -> Result<Completions, String> {
    // The last submissions are the last to run: wait for those first (a light load on the server
    // while it works), then read every task once for its timestamps.
    // Ten minutes: moto, one request at a time, needs about five for 3,000 tasks.
    let until = Instant::now() + Duration::from_secs(600);
    for (id, _) in submitted.iter().rev().take(last) {
        while Instant::now() < until && timestamps(client, &server.url, id).await.is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Before the reads below, which are the bench's and not the work's.
    let (cpu_ms, written) = (cpu_ms(server.pid()).unwrap_or(0.0), written_bytes(server.pid()).unwrap_or(0));
    let metrics =
        async { client.get(format!("{}/metrics", server.url)).send().await.ok()?.text().await.ok() };
    let group_commits = metrics.await.and_then(|text| GroupCommits::parse(&text, submitted.len()));
    let mut done = Vec::with_capacity(submitted.len());
    let mut pending: Vec<&String> = submitted.iter().map(|(id, _)| id).collect();
    while !pending.is_empty() && Instant::now() < until {
        let mut still = Vec::new();
        for id in pending {
            match timestamps(client, &server.url, id).await {
                Some(Ended::Completed(created, finished)) => done.push((created, finished)),
                Some(Ended::Otherwise) => {} // finished but not completed: not counted
                None => still.push(id),
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    if !pending.is_empty() {
        // A rate over the tasks that happened to finish would flatter the backend: no figure.
        let n = submitted.len();
        return Err(format!("{backend}: {} of {n} tasks not finished within 10 minutes", pending.len()));
    }
    Ok(Completions { done, cpu_ms, written, group_commits })
}

/// What [`await_completions`] read once every task ended.
struct Completions {
    /// The completed tasks' (created, finished) timestamps, ms.
    done: Vec<(u64, u64)>,
    /// The server's CPU time to the last completion, ms.
    cpu_ms: f64,
    /// Bytes the server caused to be written to the same point.
    written: u64,
    /// The embedded file's group commits to the same point.
    group_commits: Option<GroupCommits>,
}

/// User and system CPU time of process `pid` and all its threads, ms (`/proc/<pid>/stat` counts
/// in `USER_HZ`, 100 on every Linux the bench runs on).
fn cpu_ms(pid: Option<u32>) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    // The command name is in parentheses and may hold spaces: fields count from after it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 * 10.0)
}

/// Bytes process `pid` caused to be written to storage (`write_bytes` of `/proc/<pid>/io`).
fn written_bytes(pid: Option<u32>) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{}/io", pid?)).ok()?;
    io.lines().find_map(|l| l.strip_prefix("write_bytes:")?.trim().parse().ok())
}

/// How a task ended, as the bench counts it.
enum Ended {
    /// Completed: its `created_at_ms` and `finished_at_ms`.
    Completed(u64, u64),
    /// Failed or cancelled: not counted.
    Otherwise,
}

/// How task `id` ended; `None` while it runs (or the server does not answer).
async fn timestamps(client: &reqwest::Client, url: &str, id: &str) -> Option<Ended> {
    let v: serde_json::Value =
        client.get(format!("{url}/v1/tasks/{id}")).send().await.ok()?.json().await.ok()?;
    match v["status"].as_str()? {
        "COMPLETED" => Some(Ended::Completed(v["created_at_ms"].as_u64()?, v["finished_at_ms"].as_u64()?)),
        "FAILED" | "CANCELLED" => Some(Ended::Otherwise),
        _ => None,
    }
}

impl std::fmt::Display for ThroughputReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Throughput, {} clients ({})", self.clients, self.command)?;
        writeln!(
            f,
            "{:<14} {:>7} {:>11} {:>22} {:>9} {:>22} {:>10} {:>10} {:>10} {:>12}",
            "backend",
            "tasks",
            "ingress/s",
            "ingress p50/p99 ms",
            "tasks/s",
            "task p50/p99 ms",
            "peak MiB",
            "CPU ms/t",
            "disk KiB/t",
            "client ms/t"
        )?;
        for run in &self.runs {
            writeln!(
                f,
                "{:<14} {:>7} {:>11.0} {:>14.1} / {:>5.1} {:>9.0} {:>14.0} / {:>5.0} {:>10.1} {:>10.3} {:>10.1} {:>12.3}",
                run.backend,
                run.tasks,
                run.ingress_per_s,
                run.ingress_latency_ms[0],
                run.ingress_latency_ms[1],
                run.tasks_per_s,
                run.task_latency_ms[0],
                run.task_latency_ms[1],
                run.peak_rss_mib,
                run.server_cpu_ms_per_task,
                run.disk_kib_per_task,
                run.client_cpu_ms_per_task
            )?;
        }
        for run in self.runs.iter().chain(&self.open_loop) {
            if let Some(g) = &run.group_commits {
                let load =
                    run.offered_per_s.map_or("closed loop".to_owned(), |r| format!("open loop at {r:.0}/s"));
                writeln!(
                    f,
                    "{}, {load}: {:.3} group commits a task, {:.1} writes each, {:.2} ms each on average, p99 <= {} ms",
                    run.backend, g.per_task, g.writes_per_commit, g.mean_ms, g.p99_bucket_ms
                )?;
            }
        }
        for run in &self.open_loop {
            writeln!(
                f,
                "embedded, open loop at {:.0} tasks/s (POSTs left p99 {:.2} ms late): ingress p50/p99 {:.1} / {:.1} ms, tasks/s {:.0}, task p50/p99 {:.0} / {:.0} ms, CPU ms/t {:.3}",
                run.offered_per_s.unwrap_or(0.0),
                run.late_p99_ms.unwrap_or(0.0),
                run.ingress_latency_ms[0],
                run.ingress_latency_ms[1],
                run.tasks_per_s,
                run.task_latency_ms[0],
                run.task_latency_ms[1],
                run.server_cpu_ms_per_task
            )?;
        }
        write_goals(f, &self.goals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text the server's Prometheus encoder writes for the group-commit series.
    const EXPOSITION: &str = "\
# TYPE lanes_embedded_group_commit_seconds histogram
lanes_embedded_group_commit_seconds_bucket{le=\"0.0002\"} 0
lanes_embedded_group_commit_seconds_bucket{le=\"0.0005\"} 10
lanes_embedded_group_commit_seconds_bucket{le=\"0.001\"} 150
lanes_embedded_group_commit_seconds_bucket{le=\"0.002\"} 199
lanes_embedded_group_commit_seconds_bucket{le=\"0.005\"} 200
lanes_embedded_group_commit_seconds_bucket{le=\"+Inf\"} 200
lanes_embedded_group_commit_seconds_sum 0.16
lanes_embedded_group_commit_seconds_count 200
# TYPE lanes_embedded_group_commit_writes_total counter
lanes_embedded_group_commit_writes_total 3000
# TYPE lanes_embedded_group_commits_total counter
lanes_embedded_group_commits_total 200
";

    #[test]
    fn group_commits_are_read_from_the_exposition() {
        let g = GroupCommits::parse(EXPOSITION, 400).unwrap_or_else(|| panic!("parsed"));
        assert_eq!((g.per_task, g.writes_per_commit), (0.5, 15.0));
        assert!((g.mean_ms - 0.8).abs() < 1e-9, "{g:?}");
        assert_eq!(g.p99_bucket_ms, 2.0, "199 of 200 commits are within 2 ms");
        let none = EXPOSITION
            .replace("lanes_embedded_group_commits_total 200", "lanes_embedded_group_commits_total 0");
        assert!(GroupCommits::parse(&none, 400).is_none(), "no commits, no figures");
    }
}
