//! Benchmarks behind `lanes bench`, shared with the acceptance tests: concurrent workers calling a
//! provider through the limiter, and the report of `lanes bench limiter` (run against the provider
//! emulator, which enforces its own limits like a provider, so 429s and throughput are real
//! measurements, offline).

use crate::clock::SystemClock;
use crate::domain::{Kind, Lane};
use crate::limiter::{Limited, LimiterConfig, MemoryLimiter, RateLimiter};
use crate::llm::OpenAiClient;
use crate::llm::mock::{MockLimits, MockLlm};
use crate::ports::{LlmClient, LlmError, LlmRequest};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Eight workers: five interactive, three background.
pub const MIXED: [Lane; 8] = [
    Lane::Interactive,
    Lane::Interactive,
    Lane::Interactive,
    Lane::Interactive,
    Lane::Interactive,
    Lane::Synthesis,
    Lane::Synthesis,
    Lane::Commits,
];

/// One finished call.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// Its lane.
    pub lane: Lane,
    /// Tokens the provider reported.
    pub tokens: u64,
    /// When it finished.
    pub at: Instant,
}

/// A call of mixed size (50 to 500 prompt tokens) for worker-local index `i`.
pub fn mixed_request(lane: Lane, i: usize) -> LlmRequest {
    LlmRequest {
        lane,
        kind: if lane == Lane::Interactive { Kind::Explain } else { Kind::Refactor },
        prompt: "x".repeat(200 + (i * 397) % 1800),
        target_files: vec![],
        max_tokens: 16,
        params: Default::default(),
    }
}

/// One worker per entry of `lanes`, each making up to `count` calls until `until`.
pub async fn run_workers(
    client: Arc<dyn LlmClient>,
    lanes: &[Lane],
    count: usize,
    until: Instant,
) -> Result<Vec<Call>, LlmError> {
    let mut handles = Vec::new();
    for (w, &lane) in lanes.iter().enumerate() {
        let client = client.clone();
        handles.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..count {
                if Instant::now() >= until {
                    break;
                }
                let r = client.complete(&mixed_request(lane, w * 1000 + i)).await?;
                out.push(Call { lane, tokens: r.usage.prompt + r.usage.completion, at: Instant::now() });
            }
            Ok::<_, LlmError>(out)
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.map_err(|e| LlmError::Permanent(format!("worker panicked: {e}")))??);
    }
    Ok(all)
}

/// Tokens (interactive, background) of the calls finished at or after `from`.
pub fn steady(calls: &[Call], from: Instant) -> (u64, u64) {
    calls.iter().filter(|c| c.at >= from).fold((0, 0), |(i, b), c| {
        if c.lane == Lane::Interactive { (i + c.tokens, b) } else { (i, b + c.tokens) }
    })
}

/// An emulated provider enforcing `rpm`/`tpm` per one-second window, and a client that goes
/// through an in-process limiter configured with the same limits.
pub async fn limited_setup(rpm: f64, tpm: f64) -> std::io::Result<(MockLlm, Arc<dyn LlmClient>)> {
    let mock = MockLlm::start_limited(MockLimits { rpm, tpm, window: Duration::from_secs(1) }).await?;
    let config = LimiterConfig { window_ms: 1_000.0, ..LimiterConfig::new(rpm, tpm) };
    let limiter: Arc<dyn RateLimiter> = Arc::new(MemoryLimiter::new(config, Arc::new(SystemClock)));
    let provider = OpenAiClient::new(&format!("{}/v1", mock.url), "bench", None, Duration::from_secs(5))
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok((mock, Arc::new(Limited::new(provider, limiter, Duration::from_secs(30)))))
}

/// What `lanes bench limiter` reports.
#[derive(Debug, Clone, Serialize)]
pub struct LimiterReport {
    /// The command that reproduces it.
    pub command: String,
    /// Requests per emulated window (one second).
    pub rpm: f64,
    /// Tokens per emulated window.
    pub tpm: f64,
    /// Requests in the throughput run.
    pub requests: usize,
    /// Workers (five interactive, three background).
    pub workers: usize,
    /// 429s the provider answered over all runs.
    pub throttled: u64,
    /// Tokens per second over the throughput run, as a fraction of the limit (initial buckets included).
    pub throughput_of_limit: f64,
    /// Interactive's share of tokens with both lanes saturated (after the first window).
    pub interactive_share_saturated: f64,
    /// Background tokens per second with interactive idle, as a fraction of the limit.
    pub background_alone_of_limit: f64,
}

/// Runs the three limiter scenarios against the emulator.
pub async fn limiter_report(rpm: f64, tpm: f64, requests: usize) -> Result<LimiterReport, String> {
    let workers = MIXED.len();
    let per_worker = requests.div_ceil(workers);
    let err = |e: &dyn std::fmt::Display| e.to_string();

    let (mock, client) = limited_setup(rpm, tpm).await.map_err(|e| err(&e))?;
    let started = Instant::now();
    run_workers(client, &MIXED, per_worker, started + Duration::from_secs(600)).await.map_err(|e| err(&e))?;
    let seconds = started.elapsed().as_secs_f64();
    let usage = mock.usage();
    let mut throttled = usage.throttled;
    let throughput_of_limit = usage.tokens as f64 / seconds / tpm;

    let (mock, client) = limited_setup(rpm, tpm).await.map_err(|e| err(&e))?;
    let t0 = Instant::now();
    let calls =
        run_workers(client, &MIXED, usize::MAX, t0 + Duration::from_secs(4)).await.map_err(|e| err(&e))?;
    let (i, b) = steady(&calls, t0 + Duration::from_secs(1));
    throttled += mock.usage().throttled;
    let interactive_share_saturated = i as f64 / (i + b).max(1) as f64;

    let (mock, client) = limited_setup(rpm, tpm).await.map_err(|e| err(&e))?;
    let t1 = Instant::now();
    let background = [Lane::Synthesis, Lane::Synthesis, Lane::Synthesis, Lane::Commits];
    let calls = run_workers(client, &background, usize::MAX, t1 + Duration::from_secs(4))
        .await
        .map_err(|e| err(&e))?;
    let from = t1 + Duration::from_secs(1);
    let (_, alone) = steady(&calls, from);
    let last = calls.iter().map(|c| c.at).max().unwrap_or(from);
    throttled += mock.usage().throttled;
    let background_alone_of_limit =
        alone as f64 / last.saturating_duration_since(from).as_secs_f64().max(1e-3) / tpm;

    Ok(LimiterReport {
        command: format!("lanes bench limiter --rpm {rpm} --tpm {tpm} --requests {requests}"),
        rpm,
        tpm,
        requests: per_worker * workers,
        workers,
        throttled,
        throughput_of_limit,
        interactive_share_saturated,
        background_alone_of_limit,
    })
}

// ---------------------------------------------------------------- batching

/// Synthetic commits for the batching benchmark: varied sizes, some lockfile-only, some huge.
struct SyntheticDiffs;

#[async_trait::async_trait]
impl crate::ports::DiffSource for SyntheticDiffs {
    async fn diff(&self, c: &crate::commits::CommitMessage) -> Result<String, crate::ports::DiffError> {
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
}

/// Summarizes `commits` synthetic commits through the real commits worker (embedded adapters) against
/// the provider emulator enforcing `rpm`/`tpm` per second behind the in-process limiter: once
/// micro-batched, once with one call per commit.
pub async fn batching_report(commits: usize, rpm: f64, tpm: f64) -> Result<BatchingReport, String> {
    use crate::commits::worker::{CommitsConfig, CommitsWorker};
    use crate::commits::{CommitMessage, Provider};
    use crate::ports::QueueSend;
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut runs = Vec::new();
    for (mode, per_call) in
        [("micro-batched", crate::commits::prompt::MAX_COMMITS_PER_CALL), ("one call per commit", 1)]
    {
        let dir = tempfile_dir().map_err(|e| err(&e))?;
        let clock: crate::clock::SharedClock = Arc::new(SystemClock);
        let (adapters, queues) =
            crate::backend::embedded(&dir, Default::default(), clock.clone()).await.map_err(|e| err(&e))?;
        let (mock, llm) = limited_setup(rpm, tpm).await.map_err(|e| err(&e))?;
        let worker = CommitsWorker {
            config: CommitsConfig { max_commits_per_call: per_call, ..CommitsConfig::default() },
            ..CommitsWorker::new(
                &adapters,
                llm,
                Arc::new(SyntheticDiffs),
                crate::metrics::Metrics::new(),
                clock,
                crate::config::WorkerConfig::default(),
            )
        };
        let queue = &queues[Lane::Commits.index()];
        let messages: Vec<(String, std::collections::BTreeMap<String, String>)> = (0..commits)
            .map(|i| {
                let c = CommitMessage {
                    provider: Provider::Github,
                    repo_id: "github:1".into(),
                    repo: "bench/repo".into(),
                    sha: format!("{i:040x}"),
                    subject: format!("Change {i}"),
                    committed_at_ms: i as u64,
                };
                (serde_json::to_string(&c).unwrap_or_default(), Default::default())
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
            let batch = crate::commits::summarize::receive_batch(queue, 100, Duration::from_secs(60))
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
        runs,
    })
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("lanes-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

// ---------------------------------------------------------------- duplicates

/// One configuration's result in `lanes bench duplicates`.
#[derive(Debug, Clone, Serialize)]
pub struct DuplicatesRun {
    /// `task` or `commit`.
    pub flow: String,
    /// `lease + heartbeat` or `static visibility`.
    pub config: String,
    /// Deliveries of the one task or commit.
    pub deliveries: usize,
    /// Model calls made for it.
    pub llm_calls: u64,
    /// Final writes rejected by the fence or the write-once condition.
    pub rejected_writes: u64,
    /// Whether every delivery was settled before the time limit (six model latencies).
    pub finished: bool,
    /// Wall time until the queue was empty, seconds.
    pub seconds: f64,
}

/// What `lanes bench duplicates` reports.
#[derive(Debug, Clone, Serialize)]
pub struct DuplicatesReport {
    /// The command that reproduces it.
    pub command: String,
    /// The model's latency, ms (longer than the visibility window).
    pub llm_ms: u64,
    /// Visibility / lease, ms.
    pub visibility_ms: u64,
    /// Concurrent pollers.
    pub pollers: usize,
    /// Task and commit, each with a renewed lease and with a static visibility.
    pub runs: Vec<DuplicatesRun>,
}

/// `deliveries` copies of one task and of one commit, three pollers, a model slower (`llm_ms`) than
/// the visibility window (`visibility_ms`): with the lease renewed by the heartbeat, and with a static
/// visibility (no renewal, the seed's configuration scaled down).
pub async fn duplicates_report(
    deliveries: usize,
    llm_ms: u64,
    visibility_ms: u64,
) -> Result<DuplicatesReport, String> {
    use crate::commits::worker::CommitsWorker;
    use crate::commits::{CommitMessage, Provider};
    use crate::domain::{TaskMessage, TaskRecord, TaskRequest};
    use crate::ports::{QueueConsume, QueueSend};
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let pollers = 3;
    let visibility = Duration::from_millis(visibility_ms);
    let mut runs = Vec::new();
    for flow in ["task", "commit"] {
        for config in ["lease + heartbeat", "static visibility"] {
            let dir = tempfile_dir().map_err(|e| err(&e))?;
            let clock: crate::clock::SharedClock = Arc::new(SystemClock);
            let settings =
                crate::embedded::QueueSettings { default_visibility: visibility, max_receive_count: 1_000 };
            let (adapters, queues) =
                crate::backend::embedded(&dir, settings, clock.clone()).await.map_err(|e| err(&e))?;
            let llm = Arc::new(crate::llm::OfflineProvider::new(|_| Duration::from_millis(llm_ms)));
            let lease = match config {
                "lease + heartbeat" => crate::config::WorkerConfig::default().with_lease(visibility),
                // A fixed timeout: nothing renews it while the model runs.
                _ => crate::config::WorkerConfig {
                    lease_ttl: visibility,
                    renew_interval: Duration::from_secs(3_600),
                    ..crate::config::WorkerConfig::default()
                },
            };
            let metrics = crate::metrics::Metrics::new();
            let lane = if flow == "task" { Lane::Interactive } else { Lane::Commits };
            let queue = queues[lane.index()].clone();
            if flow == "task" {
                let req =
                    TaskRequest::from_value(serde_json::json!({"project_id": "bench", "kind": "explain",
                    "prompt": "explain the duplicate", "target_files": []}))
                    .map_err(|e| format!("{e:?}"))?;
                let rec = TaskRecord::pending(req.task_id(None), req, clock.now_ms(), 3_600);
                adapters.store.put_pending(&rec, clock.now_ms()).await.map_err(|e| err(&e))?;
                let msg = TaskMessage { task_id: rec.task_id.clone(), lane, kind: rec.request.kind };
                let body = serde_json::to_string(&msg).map_err(|e| err(&e))?;
                for _ in 0..deliveries {
                    queue.send(&body, Default::default()).await.map_err(|e| err(&e))?;
                }
            } else {
                let c = CommitMessage {
                    provider: Provider::Github,
                    repo_id: "github:1".into(),
                    repo: "bench/repo".into(),
                    sha: format!("{:040x}", 1),
                    subject: "One commit".into(),
                    committed_at_ms: 1,
                };
                let body = serde_json::to_string(&c).map_err(|e| err(&e))?;
                for _ in 0..deliveries {
                    queue.send(&body, Default::default()).await.map_err(|e| err(&e))?;
                }
            }
            let worker = crate::worker::Worker {
                store: adapters.store.clone(),
                lock: adapters.lock.clone(),
                cache: adapters.cache.clone(),
                llm: llm.clone(),
                metrics: metrics.clone(),
                clock: clock.clone(),
                config: lease,
            };
            let commits = CommitsWorker::new(
                &adapters,
                llm.clone(),
                Arc::new(SyntheticDiffs),
                metrics.clone(),
                clock.clone(),
                lease,
            );
            let started = Instant::now();
            // Long enough for a renewed lease to finish many times over.
            let stop = started + Duration::from_millis(llm_ms * 6).max(Duration::from_secs(3));
            let mut handles = Vec::new();
            for _ in 0..pollers {
                let (queue, worker, commits) = (queue.clone(), worker.clone(), commits.clone());
                handles.push(tokio::spawn(async move {
                    let q: Arc<dyn QueueConsume> = Arc::new(queue.clone());
                    while Instant::now() < stop {
                        let d = queue.depth().await.unwrap_or_default();
                        if d.visible + d.in_flight == 0 {
                            return;
                        }
                        // One delivery per receive, as separate invocations would get them.
                        let got = queue.receive_for(1, Some(visibility)).await.unwrap_or_default();
                        if got.is_empty() {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                        if flow == "task" {
                            for m in got {
                                worker.process(q.clone(), m).await;
                            }
                        } else {
                            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                            commits.process_batch(q.clone(), got, deadline).await;
                        }
                    }
                }));
            }
            for h in handles {
                h.await.map_err(|e| err(&e))?;
            }
            let lane_name = lane.as_str();
            let left = queue.depth().await.map_err(|e| err(&e))?;
            runs.push(DuplicatesRun {
                finished: left.visible + left.in_flight == 0,
                flow: flow.into(),
                config: config.into(),
                deliveries,
                llm_calls: llm.calls(),
                rejected_writes: metrics.stale_writes_rejected_total.with_label_values(&[lane_name]).get(),
                seconds: started.elapsed().as_secs_f64(),
            });
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(DuplicatesReport {
        command: format!(
            "lanes bench duplicates --deliveries {deliveries} --llm-ms {llm_ms} --visibility-ms {visibility_ms}"
        ),
        llm_ms,
        visibility_ms,
        pollers,
        runs,
    })
}

// ---------------------------------------------------------------- head-of-line blocking

/// A model that takes as long as its prompt says (`ms=<n>`): the scaled workload's service times.
struct SleepLlm;

#[async_trait::async_trait]
impl LlmClient for SleepLlm {
    async fn complete(&self, request: &LlmRequest) -> Result<crate::ports::LlmResponse, LlmError> {
        let ms: u64 =
            request.prompt.strip_prefix("ms=").and_then(|s| s.split(' ').next()?.parse().ok()).unwrap_or(1);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(crate::ports::LlmResponse {
            truncated: false,
            text: "done".into(),
            model: "sleep".into(),
            usage: crate::domain::TokenUsage { prompt: 1, completion: 1 },
        })
    }
}

/// Percentile (nearest rank) of `values`, in ms.
fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil().max(1.0) as usize;
    values[rank.min(values.len()) - 1]
}

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
}

/// What `lanes bench hol` reports.
#[derive(Debug, Clone, Serialize)]
pub struct HolReport {
    /// The command that reproduces it.
    pub command: String,
    /// Worker slots.
    pub slots: usize,
    /// Real ms per workload second (the seeds' 1 s becomes this).
    pub scale_ms: u64,
    /// Tasks submitted (interactive, synthesis).
    pub tasks: [usize; 2],
    /// One run per policy.
    pub runs: Vec<HolRun>,
    /// 70/30's interactive p99 latency over its service p99 (target <= 1.2).
    pub interactive_p99_over_service: f64,
    /// FIFO's interactive p99 latency over 70/30's (target >= 10).
    pub fifo_over_weighted: f64,
    /// 70/30's synthesis throughput over FIFO's (target >= 0.95).
    pub synthesis_vs_fifo: f64,
}

/// The seeds' workload time-scaled (1 s -> `scale_ms`): a Poisson stream for `seconds` of real time,
/// 5% synthesis (45-180 s) and 95% interactive (0.5-2 s) at about 85% of `slots`, through the real
/// pool and embedded queues and store, under three policies.
pub async fn hol_report(slots: usize, seconds: f64, scale_ms: u64) -> Result<HolReport, String> {
    use crate::domain::{TaskMessage, TaskRecord, TaskRequest};
    use crate::ports::{QueueConsume, QueueSend};
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
        let dir = tempfile_dir().map_err(|e| err(&e))?;
        let clock: crate::clock::SharedClock = Arc::new(SystemClock);
        let (adapters, queues) =
            crate::backend::embedded(&dir, Default::default(), clock.clone()).await.map_err(|e| err(&e))?;
        let worker = crate::worker::Worker {
            store: adapters.store.clone(),
            lock: adapters.lock.clone(),
            cache: adapters.cache.clone(),
            llm: Arc::new(SleepLlm),
            metrics: crate::metrics::Metrics::new(),
            clock: clock.clone(),
            config: crate::config::WorkerConfig::default(),
        };
        let (shares, lanes): ([f64; 3], Vec<Lane>) = match policy {
            "fifo" => ([1.0, 0.0, 0.0], vec![Lane::Interactive]),
            "static 50:50" => ([0.5, 0.5, 0.0], vec![Lane::Interactive, Lane::Synthesis]),
            _ => ([0.7, 0.3, 0.0], vec![Lane::Interactive, Lane::Synthesis]),
        };
        let consumers: Vec<(Lane, Arc<dyn QueueConsume>)> =
            lanes.iter().map(|&l| (l, adapters.consume[l.index()].clone())).collect();
        // Interactive stays "active" for ten workload seconds after its last task.
        let mut pool = crate::pool::Pool::new(slots, shares, consumers, worker, Duration::from_millis(2))
            .with_idle_grace(Duration::from_millis(10 * scale_ms));
        if policy == "static 50:50" {
            pool = pool.without_borrowing();
        }
        let pool = Arc::new(pool);
        let stop = tokio_util::sync::CancellationToken::new();
        let runner = {
            let (pool, stop) = (pool.clone(), stop.clone());
            tokio::spawn(async move { pool.run(stop).await })
        };
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
        // Drain: every task finished (or a generous cap).
        let cap = Instant::now() + Duration::from_secs(120);
        loop {
            let d0 = queues[0].depth().await.map_err(|e| err(&e))?;
            let d1 = queues[1].depth().await.map_err(|e| err(&e))?;
            if d0.visible + d0.in_flight + d1.visible + d1.in_flight == 0 || Instant::now() > cap {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        let _ = runner.await;
        let mut waits = Vec::new();
        let mut latencies = Vec::new();
        let mut services = Vec::new();
        let (mut first, mut last, mut busy, mut synth_done) = (u64::MAX, 0u64, 0u64, 0usize);
        for (id, synthesis) in &ids {
            let Some(r) = adapters.store.get(id, clock.now_ms()).await.map_err(|e| err(&e))? else {
                continue;
            };
            let (Some(s), Some(f)) = (r.started_at_ms, r.finished_at_ms) else { continue };
            first = first.min(r.created_at_ms);
            last = last.max(f);
            busy += f.saturating_sub(s);
            if *synthesis {
                synth_done += 1;
            } else {
                waits.push(s.saturating_sub(r.created_at_ms) as f64);
                latencies.push(f.saturating_sub(r.created_at_ms) as f64);
                services.push(f.saturating_sub(s) as f64);
            }
        }
        let makespan_s = last.saturating_sub(first) as f64 / 1000.0;
        runs.push(HolRun {
            policy: policy.into(),
            interactive_wait_ms: [percentile(&mut waits, 50.0), percentile(&mut waits, 99.0)],
            interactive_latency_ms: [percentile(&mut latencies, 50.0), percentile(&mut latencies, 99.0)],
            interactive_service_p99_ms: percentile(&mut services, 99.0),
            synthesis_per_s: synth_done as f64 / makespan_s.max(1e-3),
            utilization: busy as f64 / 1000.0 / (slots as f64 * makespan_s.max(1e-3)),
            makespan_s,
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
        runs,
    })
}

// ---------------------------------------------------------------- processes of the real binary

/// A `lanes dev` child process on a free loopback port (killed when dropped).
struct DevProcess {
    child: std::process::Child,
    url: String,
}

impl Drop for DevProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

async fn start_dev(
    lanes: &std::path::Path,
    data_dir: &std::path::Path,
    args: &[String],
    env: &[(String, String)],
) -> Result<DevProcess, String> {
    let port = free_port()?;
    let child = std::process::Command::new(lanes)
        .arg("dev")
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .env("RUST_LOG", "error")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", lanes.display()))?;
    let p = DevProcess { child, url: format!("http://127.0.0.1:{port}") };
    let client = reqwest::Client::new();
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if client.get(format!("{}/healthz", p.url)).send().await.is_ok_and(|r| r.status().is_success()) {
            return Ok(p);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err("lanes dev did not answer /healthz within 60 s".into())
}

async fn submit_task(
    client: &reqwest::Client,
    url: &str,
    kind: &str,
    prompt: &str,
) -> Result<String, String> {
    let body = serde_json::json!({"project_id": "bench", "kind": kind, "prompt": prompt, "target_files": []});
    let resp = client.post(format!("{url}/v1/tasks")).json(&body).send().await.map_err(|e| e.to_string())?;
    let v: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
    v["task_id"].as_str().map(str::to_owned).ok_or_else(|| format!("no task id in {v}"))
}

async fn status(client: &reqwest::Client, url: &str, id: &str) -> Option<String> {
    let v: serde_json::Value =
        client.get(format!("{url}/v1/tasks/{id}")).send().await.ok()?.json().await.ok()?;
    v["status"].as_str().map(str::to_owned)
}

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
pub async fn recovery_report(lanes: &std::path::Path, scale_ms: u64) -> Result<RecoveryReport, String> {
    let client = reqwest::Client::new();
    let scaled = |s: f64| (s * scale_ms as f64).round() as u64;
    let mut runs = Vec::new();
    for (config, lease_s, bound_s) in
        [("lease 15 s + heartbeat", 15.0, 20.0), ("static visibility 120 s", 120.0, 115.0)]
    {
        let Some((_moto, _redis, env)) = aws_services().await? else {
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
        let dirs = [tempfile_dir().map_err(|e| e.to_string())?, tempfile_dir().map_err(|e| e.to_string())?];
        let first = start_dev(lanes, &dirs[0], &args, &env).await?;
        let id = submit_task(&client, &first.url, "refactor", "recover me").await?;
        let until = Instant::now() + Duration::from_secs(60);
        while status(&client, &first.url, &id).await.as_deref() != Some("PROCESSING") {
            if Instant::now() > until {
                return Err("the task never started".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let running_since = Instant::now();
        // The second worker, ready before the kill.
        let second = start_dev(lanes, &dirs[1], &args, &env).await?;
        let kill_at = running_since + Duration::from_millis(scaled(5.0));
        tokio::time::sleep_until(kill_at.into()).await;
        drop(first); // SIGKILL: no shutdown path runs, its lease is left to expire
        let killed = Instant::now();
        let until = Instant::now() + Duration::from_secs(600);
        while status(&client, &second.url, &id).await.as_deref() != Some("COMPLETED") {
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

fn vm_hwm_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// A loopback server process started for the benchmark (killed when dropped).
struct Helper(std::process::Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_port(port: u16) -> bool {
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// `tasks` interactive tasks from `clients` concurrent clients against `lanes dev` (offline model, no
/// simulated latency): on embedded defaults, then on Redis + moto when `redis-server` and the venv's
/// `moto_server` are there (`make test-deps` installs both). Ingress rate and latency, end-to-end rate
/// and latency, peak memory of the server.
pub async fn throughput_report(
    lanes: &std::path::Path,
    tasks: usize,
    clients: usize,
) -> Result<ThroughputReport, String> {
    let mut runs = vec![throughput_run(lanes, "embedded", &[], &[], tasks, clients).await?];
    if let Some((_moto, _redis, env)) = aws_services().await? {
        let args = ["--backend".to_owned(), "aws".to_owned(), "--create".to_owned()];
        runs.push(throughput_run(lanes, "redis + moto", &args, &env, tasks, clients).await?);
    }
    Ok(ThroughputReport {
        command: format!("lanes bench throughput --tasks {tasks} --clients {clients}"),
        clients,
        runs,
    })
}

/// `moto_server` (from the venv, `LANES_VENV` or `.venv`) and `redis-server` on free loopback ports,
/// with the environment `lanes dev --backend aws` needs to reach them; `None` when either is missing.
async fn aws_services() -> Result<Option<(Helper, Helper, Vec<(String, String)>)>, String> {
    let venv = std::env::var("LANES_VENV").map(std::path::PathBuf::from).unwrap_or_else(|_| ".venv".into());
    let moto_bin = venv.join("bin/moto_server");
    let redis_ok = std::process::Command::new("redis-server").arg("--version").output().is_ok();
    if !moto_bin.exists() || !redis_ok {
        return Ok(None);
    }
    let (moto_port, redis_port) = (free_port()?, free_port()?);
    let quiet = std::process::Stdio::null;
    let moto = Helper(
        std::process::Command::new(&moto_bin)
            .args(["-H", "127.0.0.1", "-p", &moto_port.to_string()])
            .stdout(quiet())
            .stderr(quiet())
            .spawn()
            .map_err(|e| e.to_string())?,
    );
    let redis = Helper(
        std::process::Command::new("redis-server")
            .args(["--port", &redis_port.to_string(), "--save", "", "--appendonly", "no"])
            .stdout(quiet())
            .stderr(quiet())
            .spawn()
            .map_err(|e| e.to_string())?,
    );
    if !(wait_port(moto_port).await && wait_port(redis_port).await) {
        return Err("moto_server or redis-server did not start".into());
    }
    let env: Vec<(String, String)> = [
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{moto_port}")),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID", "bench".into()),
        ("AWS_SECRET_ACCESS_KEY", "bench".into()),
        ("REDIS_URL", format!("redis://127.0.0.1:{redis_port}")),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .into();
    Ok(Some((moto, redis, env)))
}

async fn throughput_run(
    lanes: &std::path::Path,
    backend: &str,
    extra: &[String],
    env: &[(String, String)],
    tasks: usize,
    clients: usize,
) -> Result<ThroughputRun, String> {
    let dir = tempfile_dir().map_err(|e| e.to_string())?;
    let mut args: Vec<String> =
        ["--interactive-latency-ms", "0", "--capacity", "16"].iter().map(|s| s.to_string()).collect();
    args.extend(extra.iter().cloned());
    let server = start_dev(lanes, &dir, &args, env).await?;
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
                let id = submit_task(&client, &url, "explain", &format!("throughput task {i}")).await?;
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
            if status(&client, &server.url, id).await.as_deref() != Some("COMPLETED") {
                still.push(id);
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let done_s = started.elapsed().as_secs_f64();
    let peak = vm_hwm_mib(server.child.id());
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
        ingress_latency_ms: [percentile(&mut ingress_ms, 50.0), percentile(&mut ingress_ms, 99.0)],
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
