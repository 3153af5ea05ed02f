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
    /// Submission to completion, p50 and p99, ms (upper bounds of the server's histogram buckets).
    pub task_latency_ms: [f64; 2],
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
pub async fn throughput_report(tasks: usize, clients: usize) -> Result<ThroughputReport, String> {
    let mut runs = vec![throughput_run("embedded", &[], &[], tasks, clients).await?];
    if let Some((_moto, _redis, env)) = crate::aws_services() {
        runs.push(
            throughput_run("redis + moto", &["--backend", "aws", "--create"], &env, tasks, clients).await?,
        );
    }
    Ok(ThroughputReport {
        command: format!("lanes bench throughput --tasks {tasks} --clients {clients}"),
        clients,
        runs,
    })
}

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
    for _ in 0..clients {
        let (client, url, next) = (client.clone(), server.url.clone(), next.clone());
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
    let ingress_s = started.elapsed().as_secs_f64();
    let mut ingress_ms: Vec<f64> = submitted.iter().map(|(_, ms)| *ms).collect();
    // Completion by polling; the latency figures come from the server's own histogram.
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
    let done_s = started.elapsed().as_secs_f64();
    let peak = server.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    let metrics = client
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
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
        tasks_per_s: (tasks - pending.len()) as f64 / done_s,
        task_latency_ms: histogram_quantiles(&metrics, "lanes_task_latency_seconds", "interactive"),
        peak_rss_mib: peak,
    })
}

/// p50 and p99 (ms, bucket upper bounds) of a Prometheus histogram for `lane`, from `/metrics` text.
fn histogram_quantiles(text: &str, name: &str, lane: &str) -> [f64; 2] {
    let prefix = format!("{name}_bucket{{lane=\"{lane}\",le=\"");
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    let q = |p: f64| buckets.iter().find(|(_, c)| *c >= total * p).map(|(le, _)| le * 1000.0).unwrap_or(0.0);
    [q(0.5), q(0.99)]
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
