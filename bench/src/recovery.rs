//! `lanes bench recovery`: a synthesis task on SQS (moto) and Redis with two `lanes dev` workers; the
//! one running it is SIGKILLed and the other takes it over: time to takeover with the 15 s lease and
//! with a static 120 s visibility.

use lanes_tests::DevServer;
use serde::Serialize;
use std::time::{Duration, Instant};

/// One configuration's result in `lanes bench recovery`.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryRun {
    /// `lease 15 s + heartbeat` or `static visibility 120 s`.
    pub config: String,
    /// Kill to takeover, real ms (the second worker's start; completion minus the model's latency).
    pub takeover_ms: f64,
    /// The same in workload seconds.
    pub takeover_workload_s: f64,
    /// Upper bound the design promises, workload seconds (lease TTL + renew interval), or the static
    /// visibility's expected 115 s.
    pub bound_workload_s: f64,
}

/// What `lanes bench recovery` reports.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryReport {
    /// The command that reproduces it.
    pub command: String,
    /// Real ms per workload second.
    pub scale_ms: u64,
    /// Lease and static runs.
    pub runs: Vec<RecoveryRun>,
}

/// A synthesis task of 90 workload seconds on SQS (moto) and Redis, two `lanes dev` workers; the one
/// running it is SIGKILLed 5 s in and the other takes it over. With the 15 s lease (renewed every
/// 5 s) and with a static 120 s visibility. SQS counts visibility in whole seconds, hence the default
/// scale of 100 ms per workload second.
pub async fn recovery_report(scale_ms: u64) -> Result<RecoveryReport, String> {
    let client = reqwest::Client::new();
    let scaled = |s: f64| (s * scale_ms as f64).round() as u64;
    let mut runs = Vec::new();
    for (config, lease_s, bound_s) in
        [("lease 15 s + heartbeat", 15.0, 20.0), ("static visibility 120 s", 120.0, 115.0)]
    {
        let Some((_moto, _redis, env)) = crate::aws_services() else {
            return Err("recovery needs moto_server and redis-server (make test-deps)".into());
        };
        let args: Vec<String> = [
            "--backend",
            "aws",
            "--create",
            "--capacity",
            "2",
            "--synthesis-latency-ms",
            &scaled(90.0).to_string(),
            "--lease-ttl-ms",
            &scaled(lease_s).to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let dirs =
            [crate::temp_dir().map_err(|e| e.to_string())?, crate::temp_dir().map_err(|e| e.to_string())?];
        let first = DevServer::start_with_env(&dirs[0], &args, env.clone()).await;
        let id = crate::submit_task(&client, &first.url, "refactor", "recover me").await?;
        let until = Instant::now() + Duration::from_secs(60);
        while crate::status(&client, &first.url, &id).await.as_deref() != Some("PROCESSING") {
            if Instant::now() > until {
                return Err("the task never started".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let running_since = Instant::now();
        // The second worker, ready before the kill.
        let second = DevServer::start_with_env(&dirs[1], &args, env.clone()).await;
        let kill_at = running_since + Duration::from_millis(scaled(5.0));
        tokio::time::sleep_until(kill_at.into()).await;
        drop(first); // SIGKILL: no shutdown path runs, its lease is left to expire
        let killed = Instant::now();
        let until = Instant::now() + Duration::from_secs(600);
        while crate::status(&client, &second.url, &id).await.as_deref() != Some("COMPLETED") {
            if Instant::now() > until {
                return Err("the task was never taken over".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let takeover_ms = (killed.elapsed().as_secs_f64() * 1000.0 - scaled(90.0) as f64).max(0.0);
        drop(second);
        for d in &dirs {
            let _ = std::fs::remove_dir_all(d);
        }
        runs.push(RecoveryRun {
            config: config.into(),
            takeover_ms,
            takeover_workload_s: takeover_ms / scale_ms as f64,
            bound_workload_s: bound_s,
        });
    }
    Ok(RecoveryReport { command: format!("lanes bench recovery --scale-ms {scale_ms}"), scale_ms, runs })
}

impl std::fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Crash recovery, 1 s = {} ms ({})", self.scale_ms, self.command)?;
        writeln!(f, "{:<26} {:>12} {:>20} {:>14}", "config", "takeover ms", "takeover (workload)", "bound")?;
        for run in &self.runs {
            writeln!(
                f,
                "{:<26} {:>12.0} {:>18.1} s {:>12.0} s",
                run.config, run.takeover_ms, run.takeover_workload_s, run.bound_workload_s
            )?;
        }
        Ok(())
    }
}
