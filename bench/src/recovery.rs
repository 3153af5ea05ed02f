//! `lanes bench recovery`: a synthesis task on SQS (moto) and Redis with two `lanes dev` workers; the
//! one running it is SIGKILLed and the other takes it over: time to takeover with the 15 s lease and
//! with a static 120 s visibility, at a scaled time, then with the lease at real time; then, killed
//! two thirds of the way through its answer, what the takeover pays for with the run's text saved
//! every 10 s and without.

use crate::goals::{Goal, Unit, write_goals};
use lanes_tests::DevServer;
use serde::Serialize;
use std::time::{Duration, Instant};

/// One configuration's result in `lanes bench recovery`.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryRun {
    /// `lease 15 s + heartbeat`, `static visibility 120 s` or the lease at real time.
    pub config: String,
    /// Real ms per workload second in this run.
    pub scale_ms: u64,
    /// Kill to takeover, real ms (the second worker's start; completion minus the model's latency).
    pub takeover_ms: f64,
    /// The same in workload seconds.
    pub takeover_workload_s: f64,
    /// Upper bound the design promises, workload seconds (lease TTL + renew interval), or the static
    /// visibility's expected 115 s.
    pub bound_workload_s: f64,
}

/// A task killed late in its answer, with its text saved or not.
#[derive(Debug, Clone, Serialize)]
pub struct LateKill {
    /// Workload seconds between the run's saves; `None` saves nothing.
    pub save_every_s: Option<f64>,
    /// Workload seconds into the run at which its worker was killed.
    pub killed_at_s: f64,
    /// Kill to answer, workload seconds.
    pub answer_after_kill_s: f64,
    /// Completion tokens the takeover paid for (the result's usage).
    pub paid_tokens: u64,
    /// Completion tokens it did not pay for again (the result's `tokens_saved`).
    pub saved_tokens: u64,
    /// Completion tokens of the whole answer, as the offline model counts them.
    pub whole_tokens: u64,
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
    /// Late kills, saved and not.
    pub late_kills: Vec<LateKill>,
    /// The goal lines, from the runs.
    pub goals: Vec<Goal>,
}

impl RecoveryReport {
    /// The lease's takeover at real time within its bound (the lease's TTL plus its renew
    /// interval); the takeover with saves pays at most 60% of what it pays without (killed two
    /// thirds in, saving every ninth of the answer).
    fn judged(mut self) -> Self {
        if let Some(lease) = self.runs.iter().find(|r| r.config == REAL_TIME.config) {
            let what = format!("takeover with the lease, s ({})", lease.config);
            self.goals.push(
                Goal::new("takeover_s", what, lease.takeover_workload_s)
                    .at_most(lease.bound_workload_s)
                    .shown(Unit::Count, 1),
            );
        }
        let saved = self.late_kills.iter().find(|k| k.save_every_s.is_some());
        let unsaved = self.late_kills.iter().find(|k| k.save_every_s.is_none());
        if let (Some(s), Some(u)) = (saved, unsaved) {
            let share = s.paid_tokens as f64 / u.paid_tokens.max(1) as f64;
            let what = "completion tokens the takeover pays with saves / without";
            self.goals.push(Goal::new("paid_with_saves", what, share).at_most(0.6).shown(Unit::Percent, 0));
        }
        self
    }
}

/// The lease run measured at real time, where SQS's whole seconds and moto's once-a-second look at
/// expired visibility are small against the 15 s lease: at 1 s = 100 ms they are up to 20 of the
/// figure's 27-29 workload seconds. Its task answers in 30 s (the takeover subtracts it), so the
/// run takes about a minute, not the two a 90 s task would.
pub const REAL_TIME: Takeover =
    Takeover { config: "lease 15 s + heartbeat, real time", lease_s: 15.0, bound_s: 20.0, task_s: 30.0 };

/// One takeover configuration: the lease (or static visibility) and the bound it promises.
#[derive(Debug, Clone, Copy)]
pub struct Takeover {
    /// Its name in the report.
    pub config: &'static str,
    /// The lease's TTL, workload seconds (renewed every third of it).
    pub lease_s: f64,
    /// The bound the design promises, workload seconds.
    pub bound_s: f64,
    /// The task's answer time, workload seconds.
    pub task_s: f64,
}

/// A synthesis task of 90 workload seconds (30 in the real-time run) on SQS (moto) and Redis, two
/// `lanes dev` workers; the one running it is SIGKILLed 5 s in and the other takes it over. With the
/// 15 s lease (renewed every
/// 5 s) and with a static 120 s visibility, at `scale_ms` per workload second (SQS counts visibility
/// in whole seconds, hence the default of 100), then the lease again at real time ([`REAL_TIME`]),
/// whose figure carries the goal.
pub async fn recovery_report(scale_ms: u64) -> Result<RecoveryReport, String> {
    let client = reqwest::Client::new();
    let scaled = [
        Takeover { config: "lease 15 s + heartbeat", lease_s: 15.0, bound_s: 20.0, task_s: 90.0 },
        Takeover { config: "static visibility 120 s", lease_s: 120.0, bound_s: 115.0, task_s: 90.0 },
    ];
    let mut runs = Vec::new();
    for run in scaled {
        runs.push(takeover(&client, run, scale_ms).await?);
    }
    runs.push(takeover(&client, REAL_TIME, 1000).await?);
    let mut late_kills = Vec::new();
    for save_every_s in [Some(10.0), None] {
        late_kills.push(late_kill(&client, scale_ms, save_every_s).await?);
    }
    Ok(RecoveryReport {
        command: format!("lanes bench recovery --scale-ms {scale_ms}"),
        scale_ms,
        runs,
        late_kills,
        goals: Vec::new(),
    }
    .judged())
}

/// One takeover: the task's worker SIGKILLed 5 workload seconds into its run, and the time until
/// the other worker has taken it over (its completion minus the task's answer time).
async fn takeover(client: &reqwest::Client, run: Takeover, scale_ms: u64) -> Result<RecoveryRun, String> {
    let scaled = |s: f64| (s * scale_ms as f64).round() as u64;
    let Some((_moto, _redis, env)) = crate::aws_services() else {
        return Err("recovery needs moto_server and redis-server (make test-deps)".into());
    };
    let (latency, lease) = (scaled(run.task_s).to_string(), scaled(run.lease_s).to_string());
    let args = ["--backend", "aws", "--create", "--capacity", "2", "--synthesis-latency-ms", &latency];
    // No saves of the run's text: the takeover then answers in the task's whole time, which the
    // figure subtracts (a takeover continuing a save would answer sooner and read as a faster one).
    let args: Vec<&str> =
        args.into_iter().chain(["--lease-ttl-ms", &lease, "--checkpoint-ms", "0"]).collect();
    let (second, id, killed, dirs) =
        kill_while_running(client, &args, env, "recover me", scaled(5.0)).await?;
    let until = Instant::now() + Duration::from_secs(600);
    while crate::status(client, &second.url, &id).await.as_deref() != Some("COMPLETED") {
        if Instant::now() > until {
            return Err("the task was never taken over".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let takeover_ms = (killed.elapsed().as_secs_f64() * 1000.0 - scaled(run.task_s) as f64).max(0.0);
    drop(second);
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(RecoveryRun {
        config: run.config.into(),
        scale_ms,
        takeover_ms,
        takeover_workload_s: takeover_ms / scale_ms as f64,
        bound_workload_s: run.bound_s,
    })
}

/// The offline model's 90 s answer, its worker SIGKILLed 60 s in (two thirds of its text said) and
/// taken over by a second worker, with the run's text saved every `save_every_s` or never.
async fn late_kill(
    client: &reqwest::Client,
    scale_ms: u64,
    save_every_s: Option<f64>,
) -> Result<LateKill, String> {
    let scaled = |s: f64| (s * scale_ms as f64).round() as u64;
    let Some((_moto, _redis, env)) = crate::aws_services() else {
        return Err("recovery needs moto_server and redis-server (make test-deps)".into());
    };
    let (latency, killed_at_s) = (scaled(90.0).to_string(), 60.0);
    let (every, lease) = (save_every_s.map_or(0, scaled).to_string(), scaled(15.0).to_string());
    let args = ["--backend", "aws", "--create", "--capacity", "2", "--synthesis-latency-ms", &latency];
    let args: Vec<&str> =
        args.into_iter().chain(["--checkpoint-ms", &every, "--lease-ttl-ms", &lease]).collect();
    let kill_at = scaled(killed_at_s);
    let (second, id, killed, dirs) =
        kill_while_running(client, &args, env, "recover me late", kill_at).await?;
    let until = Instant::now() + Duration::from_secs(600);
    let task = loop {
        let v: serde_json::Value = match client.get(format!("{}/v1/tasks/{id}", second.url)).send().await {
            Ok(resp) => resp.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        if v["status"] == "COMPLETED" {
            break v;
        }
        if Instant::now() > until {
            return Err("the task was never taken over".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let answer_after_kill_s = killed.elapsed().as_secs_f64() * 1000.0 / scale_ms as f64;
    drop(second);
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    let result = &task["result"];
    let text = result["text"].as_str().unwrap_or_default();
    Ok(LateKill {
        save_every_s,
        killed_at_s,
        answer_after_kill_s,
        paid_tokens: result["tokens"]["completion"].as_u64().unwrap_or(0),
        saved_tokens: result["tokens_saved"].as_u64().unwrap_or(0),
        // The offline model's own count: four bytes a token.
        whole_tokens: text.len().div_ceil(4) as u64,
    })
}

/// Two `lanes dev` workers with `args` and `env` (each in a data dir of its own, returned for
/// removal), a synthesis task submitted to the first, and the first SIGKILLed `kill_after_ms` after
/// the task was seen running; the second (started before the kill), the task's id and the kill's
/// time.
async fn kill_while_running(
    client: &reqwest::Client,
    args: &[&str],
    env: Vec<(String, String)>,
    text: &str,
    kill_after_ms: u64,
) -> Result<(DevServer, String, Instant, [std::path::PathBuf; 2]), String> {
    let dirs = [crate::temp_dir().map_err(|e| e.to_string())?, crate::temp_dir().map_err(|e| e.to_string())?];
    let first = DevServer::start_with_env(&dirs[0], args, env.clone()).await;
    let id = crate::submit_task(client, &first.url, "refactor", text).await?;
    let until = Instant::now() + Duration::from_secs(60);
    while crate::status(client, &first.url, &id).await.as_deref() != Some("PROCESSING") {
        if Instant::now() > until {
            return Err("the task never started".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let running_since = Instant::now();
    // The second worker, ready before the kill.
    let second = DevServer::start_with_env(&dirs[1], args, env).await;
    tokio::time::sleep_until((running_since + Duration::from_millis(kill_after_ms)).into()).await;
    drop(first); // SIGKILL: no shutdown path runs, its lease is left to expire
    Ok((second, id, Instant::now(), dirs))
}

impl std::fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Crash recovery, 1 s = {} ms ({})", self.scale_ms, self.command)?;
        writeln!(
            f,
            "{:<36} {:>9} {:>12} {:>20} {:>14}",
            "config", "1 s =", "takeover ms", "takeover (workload)", "bound"
        )?;
        for run in &self.runs {
            writeln!(
                f,
                "{:<36} {:>6} ms {:>12.0} {:>18.1} s {:>12.0} s",
                run.config, run.scale_ms, run.takeover_ms, run.takeover_workload_s, run.bound_workload_s
            )?;
        }
        writeln!(f, "Killed late: what the takeover pays for")?;
        writeln!(
            f,
            "{:<18} {:>10} {:>18} {:>6} {:>7} {:>7}",
            "saves", "killed at", "answer after kill", "paid", "saved", "whole"
        )?;
        for k in &self.late_kills {
            let saves = k.save_every_s.map_or("never".to_owned(), |s| format!("every {s:.0} s"));
            writeln!(
                f,
                "{:<18} {:>8.0} s {:>16.1} s {:>6} {:>7} {:>7}",
                saves, k.killed_at_s, k.answer_after_kill_s, k.paid_tokens, k.saved_tokens, k.whole_tokens
            )?;
        }
        write_goals(f, &self.goals)
    }
}
