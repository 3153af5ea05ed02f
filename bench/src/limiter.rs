//! `lanes bench limiter`: concurrent workers calling the provider emulator (which enforces its own
//! limits per window and answers 429 past them) through the limiter: 429s, token throughput, and the
//! interactive share when both lanes are saturated. Also the building blocks the acceptance tests use.

use lanes_core::clock::SystemClock;
use lanes_core::domain::{Kind, Lane};
use lanes_core::limiter::{LimiterConfig, MemoryLimiter, RateLimiter};
use lanes_core::llm::Limited;
use lanes_core::llm::OpenAiClient;
use lanes_core::ports::{LlmClient, LlmError, LlmRequest};
use lanes_tests::mock_llm::{MockLimits, MockLlm};
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
        tier: Default::default(),
        prefix: None,
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
    let mock =
        MockLlm::start_limited(MockLimits { rpm, tpm, window: Duration::from_secs(1), ..Default::default() })
            .await?;
    let config = LimiterConfig { window_ms: 1_000.0, ..LimiterConfig::new(rpm, tpm) };
    let limiter: Arc<dyn RateLimiter> = Arc::new(MemoryLimiter::new(config, Arc::new(SystemClock)));
    let provider = OpenAiClient::new(&format!("{}/v1", mock.url), "bench", None, Duration::from_secs(5));
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

impl std::fmt::Display for LimiterReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "LLM limiter against the provider emulator ({})", self.command)?;
        writeln!(f, "{:<58} {:>10}", "measure", "value")?;
        writeln!(
            f,
            "{:<58} {:>10}",
            format!("{} requests from {} workers: 429 answers", self.requests, self.workers),
            self.throttled
        )?;
        writeln!(
            f,
            "{:<58} {:>9.1}%",
            "token throughput, of the limit (initial buckets included)",
            self.throughput_of_limit * 100.0
        )?;
        writeln!(
            f,
            "{:<58} {:>9.1}%",
            "both lanes saturated: interactive share (reserved 70%)",
            self.interactive_share_saturated * 100.0
        )?;
        writeln!(
            f,
            "{:<58} {:>9.1}%",
            "interactive idle: background throughput, of the limit",
            self.background_alone_of_limit * 100.0
        )?;
        Ok(())
    }
}
