//! `lanes bench provider`: eight workers (five interactive, three background) calling the provider
//! emulator flat out through the real client stack (retries over the limiter over the OpenAI
//! client), for each way a provider counts its limits (token bucket, fixed calendar window, sliding
//! window), with the limits configured, learned from its headers, or neither (no headers and 429s
//! without a hint, a provider in slow start). Reported per run: 429s as a share of requests, tokens
//! used as a share of the limit, calls that failed (not merely waited), p99 call time, and the
//! interactive share of tokens under saturation.
//!
//! Then interactive work alone against a fixed-window provider, with the limits configured and
//! learned from its headers: a fixed number of tasks, and the time they take against the time the
//! limit allows. The background's reservation is idle there and must be lent whole.

use crate::goals::{Goal, Unit, lowest, worst, write_goals};
use crate::limiter::{MIXED, mixed_request};
use lanes_core::clock::SystemClock;
use lanes_core::domain::Lane;
use lanes_core::limiter::{LimiterConfig, MemoryLimiter, RateLimiter};
use lanes_core::llm::Limited;
use lanes_core::llm::{OpenAiClient, RetryPolicy, Retrying};
use lanes_core::ports::{LlmClient, LlmError};
use lanes_tests::mock_llm::{Discipline, Hint, MockLimits, MockLlm};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One discipline and knowledge of the limits.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderRun {
    /// `token bucket`, `fixed window` or `sliding window`.
    pub discipline: String,
    /// `configured`, `learned from headers` or `unknown (no headers, no hints)`.
    pub limits: String,
    /// HTTP requests the provider saw.
    pub requests: u64,
    /// Of which answered 429.
    pub throttled: u64,
    /// `throttled / requests`.
    pub throttled_share: f64,
    /// Tokens served as a share of what the limit allowed over the run.
    pub tokens_of_limit: f64,
    /// Calls that ended in a failure other than throttling (a worker would count an attempt).
    pub failed: u64,
    /// Calls that ended throttled after their retries (a worker would put the task off, not fail it).
    pub put_off: u64,
    /// p99 of a call's time, retries and limiter waits included, ms.
    pub call_p99_ms: f64,
    /// Interactive's share of the tokens served after the first second.
    pub interactive_share: f64,
}

/// What `lanes bench provider` reports.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderReport {
    /// The command that reproduces it.
    pub command: String,
    /// The provider's limits per one-second window.
    pub rpm: f64,
    /// Tokens per window.
    pub tpm: f64,
    /// Seconds of load per run.
    pub seconds: f64,
    /// The share of each window's limit the limiter holds as its burst: under saturation the rest
    /// is what it admits.
    pub burst: f64,
    /// One run per discipline and knowledge.
    pub runs: Vec<ProviderRun>,
    /// Interactive tasks alone at a low request limit, per knowledge of the limits.
    pub alone: Vec<AloneRun>,
    /// The same against a real LiteLLM proxy at 30 requests a minute ([`crate::litellm`]), when
    /// the bench was given one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub litellm: Vec<AloneRun>,
    /// That proxy's version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub litellm_version: Option<String>,
    /// The goal lines, from the runs.
    pub goals: Vec<Goal>,
}

impl ProviderReport {
    fn judged(mut self) -> Self {
        let runs = &self.runs;
        let figures = |keep: &dyn Fn(&ProviderRun) -> bool, figure: fn(&ProviderRun) -> f64| {
            runs.iter().filter(|r| keep(r)).map(figure).collect::<Vec<f64>>()
        };
        let configured = |r: &ProviderRun| r.limits == "configured";
        let learned = |r: &ProviderRun| r.limits == "learned from headers";
        let saturated = |r: &ProviderRun| configured(r) || learned(r);
        let unknown = |r: &ProviderRun| r.limits.starts_with("unknown");
        let throttled = |r: &ProviderRun| r.throttled_share;
        let mut goals = vec![
            Goal::new(
                "throttled_configured",
                "429s with the limits configured, worst",
                worst(figures(&configured, throttled)),
            )
            .at_most(0.01)
            .shown(Unit::Percent, 2),
            Goal::new(
                "throttled_learned",
                "429s with the limits learned from headers, worst",
                worst(figures(&learned, throttled)),
            )
            .at_most(0.05)
            .shown(Unit::Percent, 2),
            Goal::new(
                "throttled_unknown",
                "429s with the limits unknown, worst",
                worst(figures(&unknown, throttled)),
            )
            .at_most(0.05)
            .shown(Unit::Percent, 2),
            Goal::new("failed", "calls failed", figures(&|_| true, |r| r.failed as f64).iter().sum())
                .at_most(0.0)
                .shown(Unit::Count, 0),
            Goal::new(
                "of_limit",
                "tokens served of the limit, configured or learned, lowest",
                lowest(figures(&saturated, |r| r.tokens_of_limit)),
            )
            .at_least(0.95)
            .shown(Unit::Percent, 1),
            Goal::new(
                "interactive_share",
                "interactive's share under saturation, lowest",
                lowest(figures(&saturated, |r| r.interactive_share)),
            )
            .at_least(0.70)
            .shown(Unit::Percent, 1),
        ];
        let cases = [
            (["alone_used", "alone_missed"], &self.alone, "the emulator"),
            (["litellm_used", "litellm_missed"], &self.litellm, "LiteLLM"),
        ];
        for ([used_key, missed_key], runs, against) in cases {
            if runs.is_empty() {
                continue;
            }
            let what = format!(
                "interactive alone against {against}: of the limit (configured: the whole run; learned: after the first window), lowest"
            );
            goals.push(
                Goal::new(used_key, what, lowest(runs.iter().map(AloneRun::used)))
                    .at_least(0.95)
                    .shown(Unit::Percent, 3),
            );
            let missed = runs.iter().map(|r| (r.throttled + r.unanswered) as f64).sum();
            goals.push(
                Goal::new(
                    missed_key,
                    format!("interactive alone against {against}: 429s and calls unanswered"),
                    missed,
                )
                .at_most(0.0)
                .shown(Unit::Count, 0),
            );
        }
        self.goals = goals;
        self
    }
}

/// Interactive tasks alone against a fixed-window provider.
#[derive(Debug, Clone, Serialize)]
pub struct AloneRun {
    /// `configured` or `learned from headers`.
    pub limits: String,
    /// Tasks (one call each), taken by six interactive workers.
    pub tasks: usize,
    /// The provider's requests per window.
    pub requests_per_window: f64,
    /// The provider's window, seconds.
    pub window_secs: f64,
    /// Seconds from the first call to the last answer.
    pub seconds: f64,
    /// Seconds the limit allows for the tasks: `tasks / requests_per_window` windows.
    pub limit_seconds: f64,
    /// `limit_seconds / seconds`: the share of the limit used.
    pub of_limit: f64,
    /// The share of the limit used from the end of the provider's first window (when the limits
    /// are known in every case) to the last answer.
    pub after_first_window: f64,
    /// Answers 429.
    pub throttled: u64,
    /// Calls that did not end in an answer.
    pub unanswered: u64,
}

impl AloneRun {
    /// The figures of one run: `answered` (from [`drive_alone`]) against a provider allowing `rpw`
    /// requests a `window`, which answered `throttled` calls 429.
    pub fn of(
        known: bool,
        tasks: usize,
        rpw: f64,
        window: Duration,
        answered: &Answered,
        throttled: u64,
    ) -> Self {
        let seconds = answered.iter().map(|(_, at)| *at).fold(0.0, f64::max);
        let unanswered = answered.iter().filter(|(ok, _)| !ok).count() as u64;
        let limit_seconds = tasks as f64 / rpw * window.as_secs_f64();
        // Once the first window is over, the limits are known in every case: the pace from then on.
        let w = window.as_secs_f64();
        let later = answered.iter().filter(|(ok, at)| *ok && *at >= w).count() as f64;
        let after_first_window = (later / rpw * w) / (seconds - w).max(1e-9);
        AloneRun {
            limits: if known { "configured" } else { "learned from headers" }.into(),
            tasks,
            requests_per_window: rpw,
            window_secs: w,
            seconds,
            limit_seconds,
            of_limit: limit_seconds / seconds,
            after_first_window,
            throttled,
            unanswered,
        }
    }

    /// The share of the limit its goal counts: the whole run with the limits configured; from the end
    /// of the first window once they are learned (the first answer cannot tell which calls in flight
    /// the provider already counted, so the first window is paced as if it counted none).
    /// Unrounded: a share a hair under the goal is under it.
    pub fn used(&self) -> f64 {
        if self.limits == "configured" { self.of_limit } else { self.after_first_window }
    }
}

/// Tasks and the request limit of the interactive-alone runs: 60 tasks at 30 a window, the two
/// minutes a provider's 30 requests a minute allow.
pub const ALONE_TASKS: usize = 60;
/// See [`ALONE_TASKS`].
pub const ALONE_RPW: f64 = 30.0;
/// The provider's window in the interactive-alone runs.
pub const ALONE_WINDOW: Duration = Duration::from_secs(5);

/// Runs every discipline with the limits configured and learned, and the slow-start provider; then
/// the interactive-alone runs, against the emulator and, given its `litellm` command, a real LiteLLM
/// proxy.
pub async fn provider_report(
    rpm: f64,
    tpm: f64,
    seconds: f64,
    litellm: Option<&std::path::Path>,
) -> Result<ProviderReport, String> {
    let mut runs = Vec::new();
    let disciplines = [
        (Discipline::TokenBucket, "token bucket"),
        (Discipline::FixedWindow, "fixed window"),
        (Discipline::SlidingWindow, "sliding window"),
    ];
    for (discipline, name) in disciplines {
        for known in [true, false] {
            let limits = MockLimits {
                rpm,
                tpm,
                window: Duration::from_secs(1),
                discipline,
                headers: !known,
                hint: Hint::Both,
            };
            let label = if known { "configured" } else { "learned from headers" };
            runs.push(run(name, label, limits, in_process(&limits, known), seconds).await?);
        }
    }
    let slow_start = MockLimits {
        rpm,
        tpm,
        window: Duration::from_secs(1),
        discipline: Discipline::FixedWindow,
        headers: false,
        hint: Hint::None,
    };
    let limiter = in_process(&slow_start, false);
    runs.push(run("fixed window", "unknown (no headers, no hints)", slow_start, limiter, seconds).await?);
    let mut alone = Vec::new();
    for known in [true, false] {
        alone.push(interactive_alone(known, ALONE_TASKS, ALONE_RPW, ALONE_WINDOW).await?);
    }
    let mut proxied = Vec::new();
    if let Some(bin) = litellm {
        for known in [true, false] {
            proxied.push(crate::litellm::alone(bin, known).await?);
        }
    }
    let proxy = litellm.map_or(String::new(), |p| format!(" --litellm {}", p.display()));
    Ok(ProviderReport {
        command: format!("lanes bench provider --rpm {rpm} --tpm {tpm} --seconds {seconds}{proxy}"),
        rpm,
        tpm,
        seconds,
        burst: LimiterConfig::new(rpm, tpm).burst,
        runs,
        alone,
        litellm: proxied,
        litellm_version: litellm.and_then(crate::litellm::version),
        goals: Vec::new(),
    }
    .judged())
}

/// `tasks` interactive calls from six workers (a pool's interactive slots) against a fixed-window
/// provider allowing `rpw` requests a `window` and tokens without a practical limit.
pub async fn interactive_alone(
    known: bool,
    tasks: usize,
    rpw: f64,
    window: Duration,
) -> Result<AloneRun, String> {
    let limits = MockLimits {
        rpm: rpw,
        tpm: 1e9,
        window,
        discipline: Discipline::FixedWindow,
        headers: !known,
        hint: Hint::Both,
    };
    let mock = MockLlm::start_limited(limits).await.map_err(|e| e.to_string())?;
    let provider = OpenAiClient::new(&format!("{}/v1", mock.url), "bench", None, Duration::from_secs(5));
    let policy = RetryPolicy { max_hint: Duration::from_secs(2), ..RetryPolicy::default() };
    let config = limiter_config(&limits, known);
    let answered = drive_alone(provider, config, policy, tasks, Duration::from_secs(10)).await?;
    Ok(AloneRun::of(known, tasks, rpw, window, &answered, mock.usage().throttled))
}

/// Each call's outcome (answered or not) and when it ended, seconds from the first call.
pub type Answered = Vec<(bool, f64)>;

/// `tasks` interactive calls from six workers through the real client stack (retries by `policy`
/// over the limiter, configured by `config`, over `provider`); a call waits for budget up to
/// `max_wait` before it is put off (and counted unanswered).
pub async fn drive_alone(
    provider: OpenAiClient,
    config: LimiterConfig,
    policy: RetryPolicy,
    tasks: usize,
    max_wait: Duration,
) -> Result<Answered, String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let limiter: Arc<dyn RateLimiter> = Arc::new(MemoryLimiter::new(config, Arc::new(SystemClock)));
    let client: Arc<dyn LlmClient> =
        Arc::new(Retrying::new(Limited::new(provider, limiter, max_wait), policy));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..6 {
        let (client, next) = (client.clone(), next.clone());
        handles.push(tokio::spawn(async move {
            let mut answered = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= tasks {
                    return answered;
                }
                let ok = client.complete(&mixed_request(Lane::Interactive, i)).await.is_ok();
                answered.push((ok, started.elapsed().as_secs_f64()));
            }
        }));
    }
    let mut answered = Vec::new();
    for h in handles {
        answered.extend(h.await.map_err(|e| e.to_string())?);
    }
    Ok(answered)
}

/// The limiter config for an emulator with `limits`: its caps when `known`, else none (learned). The
/// emulator's window is a second, so the limiter's is too (a provider's: a minute).
pub fn limiter_config(limits: &MockLimits, known: bool) -> LimiterConfig {
    let caps = if known { LimiterConfig::new(limits.rpm, limits.tpm) } else { LimiterConfig::unknown() };
    LimiterConfig { window_ms: limits.window.as_secs_f64() * 1000.0, ..caps }
}

fn in_process(limits: &MockLimits, known: bool) -> Arc<dyn RateLimiter> {
    Arc::new(MemoryLimiter::new(limiter_config(limits, known), Arc::new(SystemClock)))
}

/// Eight workers flat out for `seconds` against an emulator with `limits`, through `limiter`.
pub async fn run(
    discipline: &str,
    label: &str,
    limits: MockLimits,
    limiter: Arc<dyn RateLimiter>,
    seconds: f64,
) -> Result<ProviderRun, String> {
    let mock = MockLlm::start_limited(limits).await.map_err(|e| e.to_string())?;
    let provider = OpenAiClient::new(&format!("{}/v1", mock.url), "bench", None, Duration::from_secs(5));
    let policy = RetryPolicy { max_hint: Duration::from_secs(2), ..RetryPolicy::default() };
    let client: Arc<dyn LlmClient> =
        Arc::new(Retrying::new(Limited::new(provider, limiter, Duration::from_secs(2)), policy));
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let mut handles = Vec::new();
    for (w, &lane) in MIXED.iter().enumerate() {
        let client = client.clone();
        handles.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut i = 0;
            while Instant::now() < until {
                let t = Instant::now();
                let r = client.complete(&mixed_request(lane, w * 100_000 + i)).await;
                out.push((lane, t.elapsed(), Instant::now(), r));
                i += 1;
            }
            out
        }));
    }
    let mut calls = Vec::new();
    for h in handles {
        calls.extend(h.await.map_err(|e| e.to_string())?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let usage = mock.usage();
    let requests = usage.served + usage.throttled;
    let failed = calls
        .iter()
        .filter(|c| matches!(c.3, Err(LlmError::Retryable { .. } | LlmError::Permanent(_))))
        .count();
    let put_off = calls.iter().filter(|c| matches!(c.3, Err(LlmError::Throttled { .. }))).count();
    let mut times: Vec<f64> = calls.iter().map(|c| c.1.as_secs_f64() * 1000.0).collect();
    let from = started + Duration::from_secs(1);
    let (mut i_tokens, mut b_tokens) = (0u64, 0u64);
    for (lane, _, at, r) in &calls {
        if let (true, Ok(r)) = (*at >= from, r) {
            let t = r.usage.prompt + r.usage.completion;
            if *lane == Lane::Interactive { i_tokens += t } else { b_tokens += t }
        }
    }
    Ok(ProviderRun {
        discipline: discipline.into(),
        limits: label.into(),
        requests,
        throttled: usage.throttled,
        throttled_share: usage.throttled as f64 / requests.max(1) as f64,
        tokens_of_limit: usage.tokens as f64 / (limits.tpm * elapsed),
        failed: failed as u64,
        put_off: put_off as u64,
        call_p99_ms: crate::percentile(&mut times, 99.0),
        interactive_share: i_tokens as f64 / (i_tokens + b_tokens).max(1) as f64,
    })
}

impl std::fmt::Display for ProviderReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Provider limits {} requests / {} tokens per second, {} s of load per run ({})",
            self.rpm, self.tpm, self.seconds, self.command
        )?;
        writeln!(
            f,
            "{:<15} {:<32} {:>8} {:>6} {:>7} {:>9} {:>7} {:>8} {:>9} {:>12}",
            "discipline",
            "limits",
            "requests",
            "429s",
            "429 %",
            "of limit",
            "failed",
            "put off",
            "p99 ms",
            "interactive"
        )?;
        for r in &self.runs {
            writeln!(
                f,
                "{:<15} {:<32} {:>8} {:>6} {:>6.2}% {:>8.1}% {:>7} {:>8} {:>9.0} {:>11.1}%",
                r.discipline,
                r.limits,
                r.requests,
                r.throttled,
                r.throttled_share * 100.0,
                r.tokens_of_limit * 100.0,
                r.failed,
                r.put_off,
                r.call_p99_ms,
                r.interactive_share * 100.0
            )?;
        }
        writeln!(f, "Interactive alone, fixed window:")?;
        write_alone(f, &self.alone)?;
        if !self.litellm.is_empty() {
            let version = self.litellm_version.as_deref().unwrap_or("version unknown");
            writeln!(f, "Interactive alone, a real LiteLLM proxy ({version}), calendar minutes:")?;
            write_alone(f, &self.litellm)?;
        }
        write_goals(f, &self.goals)
    }
}

fn write_alone(f: &mut std::fmt::Formatter<'_>, runs: &[AloneRun]) -> std::fmt::Result {
    for r in runs {
        writeln!(
            f,
            "  {:<22} {} tasks at {} per {} s: {:.2} s against {:.2} s the limit allows ({:.1}% of the limit, {:.1}% after the first window), {} x 429, {} unanswered",
            r.limits,
            r.tasks,
            r.requests_per_window,
            r.window_secs,
            r.seconds,
            r.limit_seconds,
            r.of_limit * 100.0,
            r.after_first_window * 100.0,
            r.throttled,
            r.unanswered
        )?;
    }
    Ok(())
}
