//! `lanes bench batching`: synthetic commits (varied sizes, lockfile-only and huge ones) through the
//! real commits worker against the rate-limited provider emulator, micro-batched and then one call per
//! commit: LLM calls, tokens, 429s, time.

use crate::goals::{Goal, Unit, write_goals};
use crate::limiter::limited_setup;
use lanes_core::clock::SystemClock;
use lanes_core::domain::Lane;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Synthetic commits for the batching benchmark: varied sizes, some lockfile-only, some huge.
pub(crate) struct SyntheticDiffs;

#[async_trait::async_trait]
impl lanes_core::ports::DiffSource for SyntheticDiffs {
    async fn diff(
        &self,
        c: &lanes_core::domain::commit::CommitMessage,
    ) -> Result<String, lanes_core::ports::DiffError> {
        let i = usize::from_str_radix(&c.sha[32..], 16).unwrap_or(0);
        if i % 25 == 7 {
            let lock: String =
                (0..20_000).map(|l| format!("+checksum = \"{:064x}\"\n", l * 31 + i)).collect();
            return Ok(format!(
                "diff --git a/Cargo.lock b/Cargo.lock\n--- a/Cargo.lock\n+++ b/Cargo.lock\n@@ -1 +1,20000 @@\n{lock}"
            ));
        }
        let lines = if i % 50 == 13 { 5_000 } else { 5 + (i * 37) % 160 };
        let files = 1 + i % 3;
        let mut d = String::new();
        for f in 0..files {
            d.push_str(&format!(
                "diff --git a/src/m{i}_{f}.rs b/src/m{i}_{f}.rs\n--- a/src/m{i}_{f}.rs\n+++ b/src/m{i}_{f}.rs\n@@ -1,3 +1,{lines} @@\n"
            ));
            for l in 0..lines {
                d.push_str(&format!("+    let value_{l} = compute_{f}({l}, \"commit {i}\");\n"));
            }
        }
        Ok(d)
    }
}

/// One configuration's result in `lanes bench batching`.
#[derive(Debug, Clone, Serialize)]
pub struct BatchingRun {
    /// `micro-batched` or `one call per commit`.
    pub mode: String,
    /// LLM calls.
    pub llm_calls: u64,
    /// Prompt tokens reported by the provider.
    pub prompt_tokens: u64,
    /// Completion tokens reported by the provider.
    pub completion_tokens: u64,
    /// Commits summarized by rule (noise only), no model.
    pub rule_summaries: u64,
    /// 429 answers from the provider.
    pub throttled: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// What `lanes bench batching` reports.
#[derive(Debug, Clone, Serialize)]
pub struct BatchingReport {
    /// The command that reproduces it.
    pub command: String,
    /// Commits summarized per run.
    pub commits: usize,
    /// Provider limits per one-second window.
    pub rpm: f64,
    /// Tokens per window.
    pub tpm: f64,
    /// Micro-batched, then one call per commit.
    pub runs: Vec<BatchingRun>,
    /// The goal lines, from the runs.
    pub goals: Vec<Goal>,
}

/// Summarizes `commits` synthetic commits through the real commits worker (embedded adapters) against
/// the provider emulator enforcing `rpm`/`tpm` per second behind the in-process limiter: once
/// micro-batched, once with one call per commit.
pub async fn batching_report(commits: usize, rpm: f64, tpm: f64) -> Result<BatchingReport, String> {
    use lanes_core::commits::worker::{CommitsConfig, CommitsWorker};
    use lanes_core::domain::commit::{CommitMessage, Provider};
    use lanes_core::ports::QueueSend;
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut runs = Vec::new();
    for (mode, per_call) in
        [("micro-batched", lanes_core::commits::prompt::MAX_COMMITS_PER_CALL), ("one call per commit", 1)]
    {
        let dir = crate::temp_dir().map_err(|e| err(&e))?;
        let clock: lanes_core::clock::SharedClock = Arc::new(SystemClock);
        let (adapters, queues) = lanes_core::wiring::embedded(&dir, Default::default(), clock.clone())
            .await
            .map_err(|e| err(&e))?;
        let (mock, llm) = limited_setup(rpm, tpm).await.map_err(|e| err(&e))?;
        let worker = CommitsWorker {
            config: CommitsConfig { max_commits_per_call: per_call, ..CommitsConfig::default() },
            ..adapters.commits_worker(
                llm,
                Arc::new(SyntheticDiffs),
                lanes_core::metrics::Metrics::new(),
                clock,
                lanes_core::config::WorkerConfig::default(),
            )
        };
        let queue = &queues[Lane::Commits.index()];
        let repo_id = lanes_core::domain::RepoId::of(Provider::Github, "1").map_err(|e| e.to_string())?;
        let messages: Vec<(String, std::collections::BTreeMap<String, String>)> = (0..commits)
            .filter_map(|i| {
                let c = CommitMessage {
                    provider: Provider::Github,
                    repo_id: repo_id.clone(),
                    repo: "bench/repo".into(),
                    sha: format!("{i:040x}").parse().ok()?,
                    subject: format!("Change {i}"),
                    committed_at_ms: i as u64,
                    escalated: Default::default(),
                };
                Some((serde_json::to_string(&c).unwrap_or_default(), Default::default()))
            })
            .collect();
        queue.send_batch(&messages).await.map_err(|e| err(&e))?;
        let started = Instant::now();
        let mut run = BatchingRun {
            mode: mode.into(),
            llm_calls: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            rule_summaries: 0,
            throttled: 0,
            seconds: 0.0,
        };
        loop {
            let batch = lanes_core::lease::receive_batch(queue, 100, Duration::from_secs(60))
                .await
                .map_err(|e| err(&e))?;
            if batch.is_empty() {
                break;
            }
            let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
            let (_, r) = worker.process_batch(Arc::new(queue.clone()), batch, deadline).await;
            run.llm_calls += r.llm_calls;
            run.prompt_tokens += r.prompt_tokens;
            run.completion_tokens += r.completion_tokens;
            run.rule_summaries += r.rule_summaries;
        }
        run.seconds = started.elapsed().as_secs_f64();
        run.throttled = mock.usage().throttled;
        let _ = std::fs::remove_dir_all(&dir);
        runs.push(run);
    }
    Ok(BatchingReport {
        command: format!("lanes bench batching --commits {commits} --rpm {rpm} --tpm {tpm}"),
        commits,
        rpm,
        tpm,
        goals: runs
            .first()
            .map(|micro| {
                let what = format!("429s, {}", micro.mode);
                Goal::new("throttled", what, micro.throttled as f64).at_most(0.0).shown(Unit::Count, 0)
            })
            .into_iter()
            .collect(),
        runs,
    })
}

impl std::fmt::Display for BatchingReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Commit micro-batching against the provider emulator ({})", self.command)?;
        writeln!(
            f,
            "{:<20} {:>9} {:>13} {:>17} {:>8} {:>6} {:>8}",
            "mode", "LLM calls", "prompt tokens", "completion tokens", "by rule", "429s", "seconds"
        )?;
        for run in &self.runs {
            writeln!(
                f,
                "{:<20} {:>9} {:>13} {:>17} {:>8} {:>6} {:>8.1}",
                run.mode,
                run.llm_calls,
                run.prompt_tokens,
                run.completion_tokens,
                run.rule_summaries,
                run.throttled,
                run.seconds
            )?;
        }
        write_goals(f, &self.goals)
    }
}
