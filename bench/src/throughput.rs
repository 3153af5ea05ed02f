//! `lanes bench throughput`: concurrent clients submitting interactive tasks to `lanes dev` (offline
//! model, no latency) on embedded defaults and on Redis + moto: ingress and end-to-end rates, latency,
//! peak memory.

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
    /// `POST /v1/tasks` answered per second (concurrent clients).
    pub ingress_per_s: f64,
    /// `POST /v1/tasks` latency p50 and p99, ms.
    pub ingress_latency_ms: [f64; 2],
    /// Tasks completed per second, first submission to last completion.
    pub tasks_per_s: f64,
    /// Submission to completion, p50 and p99, ms, from raw samples: one task in [`SAMPLE_EVERY`]
    /// is followed by a long-poll started right after its submission (few enough not to load the
    /// server much), its latency being its submission until that long-poll answered `COMPLETED`.
    pub task_latency_ms: [f64; 2],
    /// Tasks whose latency was sampled.
    pub latency_samples: usize,
    /// Peak resident memory of the server (VmHWM), MiB.
    pub peak_rss_mib: f64,
}

/// What `lanes bench throughput` reports.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputReport {
    /// The command that reproduces it.
    pub command: String,
    /// Concurrent clients.
    pub clients: usize,
    /// One run per backend.
    pub runs: Vec<ThroughputRun>,
}

/// `tasks` interactive tasks from `clients` concurrent clients against `lanes dev` (offline model, no
/// simulated latency): on embedded defaults, then on Redis + moto when `redis-server` and the venv's
/// `moto_server` are there (`make test-deps` installs both). Ingress rate and latency, end-to-end rate
/// and latency, peak memory of the server.
/// `backend`: `embedded` or `aws` alone, both when `None`.
pub async fn throughput_report(
    tasks: usize,
    clients: usize,
    backend: Option<&str>,
) -> Result<ThroughputReport, String> {
    let mut runs = Vec::new();
    if backend != Some("aws") {
        runs.push(throughput_run("embedded", &[], &[], tasks, clients).await?);
    }
    if backend != Some("embedded") {
        match crate::aws_services() {
            Some((_moto, _redis, env)) => runs.push(
                throughput_run("redis + moto", &["--backend", "aws", "--create"], &env, tasks, clients)
                    .await?,
            ),
            None if backend == Some("aws") => {
                return Err("redis-server or moto_server is missing: run scripts/test-deps.sh".into());
            }
            None => {}
        }
    }
    let only = backend.map(|b| format!(" --backend {b}")).unwrap_or_default();
    Ok(ThroughputReport {
        command: format!("lanes bench throughput --tasks {tasks} --clients {clients}{only}"),
        clients,
        runs,
    })
}

/// One task in this many has its latency sampled.
pub const SAMPLE_EVERY: usize = 10;

async fn throughput_run(
    backend: &str,
    extra: &[&str],
    env: &[(String, String)],
    tasks: usize,
    clients: usize,
) -> Result<ThroughputRun, String> {
    let dir = crate::temp_dir().map_err(|e| e.to_string())?;
    let args = [&["--interactive-latency-ms", "0", "--capacity", "16"][..], extra].concat();
    let server = DevServer::start_with_env(&dir, &args, env.to_vec()).await;
    let client = reqwest::Client::new();
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut handles = Vec::new();
    // One submission in SAMPLE_EVERY starts its own waiter at once: a long-poll that answers when
    // the task ends, so those tasks' latencies are real samples, not histogram buckets.
    let waiters = Arc::new(tokio::sync::Mutex::new(tokio::task::JoinSet::new()));
    for _ in 0..clients {
        let (client, url, next, waiters) =
            (client.clone(), server.url.clone(), next.clone(), waiters.clone());
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
                out.push((id.clone(), t.elapsed().as_secs_f64() * 1000.0));
                if i % SAMPLE_EVERY == 0 {
                    let (client, url) = (client.clone(), url.clone());
                    waiters.lock().await.spawn(async move { wait_completed(&client, &url, &id, t).await });
                }
            }
        }));
    }
    let mut submitted = Vec::new();
    for h in handles {
        submitted.extend(h.await.map_err(|e| e.to_string())??);
    }
    let ingress_s = started.elapsed().as_secs_f64();
    let mut ingress_ms: Vec<f64> = submitted.iter().map(|(_, ms)| *ms).collect();
    let mut task_ms = Vec::new();
    let mut waiters = std::mem::take(&mut *waiters.lock().await);
    while let Some(done) = waiters.join_next().await {
        if let Ok(Some(ms)) = done {
            task_ms.push(ms);
        }
    }
    // Every task's completion, for the rate: polled, a round every 20 ms.
    let until = Instant::now() + Duration::from_secs(300);
    let mut pending: Vec<&String> = submitted.iter().map(|(id, _)| id).collect();
    while !pending.is_empty() && Instant::now() < until {
        let mut still = Vec::new();
        for id in pending {
            if crate::status(&client, &server.url, id).await.as_deref() != Some("COMPLETED") {
                still.push(id);
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let completed = tasks - pending.len();
    let done_s = started.elapsed().as_secs_f64();
    let peak = server.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ThroughputRun {
        backend: backend.into(),
        tasks,
        ingress_per_s: tasks as f64 / ingress_s,
        ingress_latency_ms: [
            crate::percentile(&mut ingress_ms, 50.0),
            crate::percentile(&mut ingress_ms, 99.0),
        ],
        tasks_per_s: completed as f64 / done_s,
        latency_samples: task_ms.len(),
        task_latency_ms: [crate::percentile(&mut task_ms, 50.0), crate::percentile(&mut task_ms, 99.0)],
        peak_rss_mib: peak,
    })
}

/// Long-polls task `id` until it is `COMPLETED` (five minutes at most): milliseconds since `since`,
/// `None` when it ends otherwise or never.
async fn wait_completed(client: &reqwest::Client, url: &str, id: &str, since: Instant) -> Option<f64> {
    let until = Instant::now() + Duration::from_secs(300);
    while Instant::now() < until {
        let answer = client.get(format!("{url}/v1/tasks/{id}?wait=20")).send().await;
        let Ok(v) = (match answer {
            Ok(r) => r.json::<serde_json::Value>().await,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        }) else {
            continue;
        };
        match v["status"].as_str() {
            Some("COMPLETED") => return Some(since.elapsed().as_secs_f64() * 1000.0),
            Some("FAILED" | "CANCELLED") => return None,
            _ => {}
        }
    }
    None
}

impl std::fmt::Display for ThroughputReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Throughput, {} clients ({})", self.clients, self.command)?;
        writeln!(
            f,
            "{:<14} {:>7} {:>11} {:>22} {:>9} {:>22} {:>10}",
            "backend", "tasks", "ingress/s", "ingress p50/p99 ms", "tasks/s", "task p50/p99 ms", "peak MiB"
        )?;
        for run in &self.runs {
            writeln!(
                f,
                "{:<14} {:>7} {:>11.0} {:>14.1} / {:>5.1} {:>9.0} {:>14.0} / {:>5.0} {:>10.1}",
                run.backend,
                run.tasks,
                run.ingress_per_s,
                run.ingress_latency_ms[0],
                run.ingress_latency_ms[1],
                run.tasks_per_s,
                run.task_latency_ms[0],
                run.task_latency_ms[1],
                run.peak_rss_mib
            )?;
        }
        Ok(())
    }
}
