//! The shared LLM rate limiter (see docs/ARCHITECTURE.md, LLM gateway): requests per minute and tokens per minute, with lane
//! reservations. Interactive holds 70% of each budget and the background lanes 30%; a class may
//! borrow from the other's bucket only while that bucket is above a watermark, i.e. while the other
//! class leaves it idle. Tokens are charged with an estimate before the call and reconciled with the
//! provider's reported usage after it.
//!
//! Each class has a token bucket per dimension, refilled continuously at its share of the per-minute
//! limit and holding at most that share of one minute, so the sum never exceeds what a provider's
//! own per-minute bucket allows. [`decide`] is the algorithm; [`MemoryLimiter`] runs it in process
//! and `adapters::redis::limiter::RedisLimiter` runs the same steps as one Lua script shared by every
//! worker.

use crate::clock::SharedClock;
use crate::domain::Lane;
use async_trait::async_trait;
use std::sync::Mutex;
use std::time::Duration;

/// Errors of the limiter store.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    /// Redis unreachable: callers proceed unthrottled and count a degraded operation (the provider's
    /// own 429s, retried with backoff, are the backstop).
    #[error("limiter unavailable: {0}")]
    Unavailable(String),
}

/// Reservation classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The interactive lane.
    Interactive = 0,
    /// Synthesis and commits.
    Background = 1,
}

impl From<Lane> for Class {
    fn from(l: Lane) -> Self {
        if l == Lane::Interactive { Class::Interactive } else { Class::Background }
    }
}

/// Limits and reservations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimiterConfig {
    /// Requests per minute.
    pub rpm: f64,
    /// Tokens per minute.
    pub tpm: f64,
    /// Interactive's reserved share (background gets the rest).
    pub interactive_share: f64,
    /// A bucket lends only what it holds above this fraction of its capacity.
    pub lend_above: f64,
    /// The period the limits are per, in ms: 60000 for providers' per-minute limits; tests shorten it.
    pub window_ms: f64,
}

impl LimiterConfig {
    /// Limits with the default 70/30 reservation.
    pub fn new(rpm: f64, tpm: f64) -> Self {
        Self { rpm, tpm, interactive_share: 0.7, lend_above: 0.5, window_ms: 60_000.0 }
    }

    /// Capacities of the four buckets: requests (interactive, background), tokens (same order).
    fn caps(&self) -> [f64; 4] {
        let s = self.interactive_share.clamp(0.0, 1.0);
        [self.rpm * s, self.rpm * (1.0 - s), self.tpm * s, self.tpm * (1.0 - s)]
    }
}

/// Bucket levels (requests i/b, tokens i/b) and when they were last refilled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketState {
    /// Levels; a level may go below zero after reconciliation (a debt paid by later refills).
    pub levels: [f64; 4],
    /// Unix ms of the last refill.
    pub at_ms: u64,
}

impl BucketState {
    /// Full buckets at `now_ms`.
    pub fn full(config: &LimiterConfig, now_ms: u64) -> Self {
        Self { levels: config.caps(), at_ms: now_ms }
    }
}

/// The answer to a request for budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Taken.
    Granted,
    /// Nothing taken; enough will be there after this long.
    Wait(Duration),
}

fn refill(config: &LimiterConfig, state: &mut BucketState, now_ms: u64) {
    let caps = config.caps();
    let elapsed = now_ms.saturating_sub(state.at_ms) as f64;
    for (level, cap) in state.levels.iter_mut().zip(caps) {
        *level = (*level + elapsed * cap / config.window_ms).min(cap);
    }
    state.at_ms = state.at_ms.max(now_ms);
}

/// Takes one request and `tokens` for `class`, or says how long to wait. All or nothing.
pub fn decide(
    config: &LimiterConfig,
    state: &mut BucketState,
    now_ms: u64,
    class: Class,
    tokens: u64,
) -> Decision {
    refill(config, state, now_ms);
    let caps = config.caps();
    let (own_off, other_off) = match class {
        Class::Interactive => (0, 1),
        Class::Background => (1, 0),
    };
    let mut takes = [0.0f64; 4];
    let mut wait_ms = 0.0f64;
    for (dim, need) in [(0usize, 1.0f64), (2, tokens as f64)] {
        let (own, other) = (dim + own_off, dim + other_off);
        // A request larger than the whole share waits for a full bucket, then runs into debt.
        let need_now = need.min(caps[own]);
        let have = state.levels[own].max(0.0);
        if have >= need_now {
            takes[own] = need;
            continue;
        }
        let lendable = state.levels[other] - config.lend_above * caps[other];
        if lendable >= need_now - have {
            takes[own] = have + (need - need_now);
            takes[other] = need_now - have;
            continue;
        }
        let rate = caps[own] / config.window_ms;
        let missing = need_now - state.levels[own];
        wait_ms = wait_ms.max(if rate > 0.0 { missing / rate } else { config.window_ms });
    }
    if wait_ms > 0.0 {
        return Decision::Wait(Duration::from_millis(wait_ms.ceil() as u64));
    }
    for (level, take) in state.levels.iter_mut().zip(takes) {
        *level -= take;
    }
    Decision::Granted
}

/// Puts back an overestimate, or charges an underestimate, to `class`'s token bucket.
pub fn reconcile(config: &LimiterConfig, state: &mut BucketState, class: Class, estimated: u64, actual: u64) {
    let i = 2 + class as usize;
    let cap = config.caps()[i];
    state.levels[i] = (state.levels[i] + estimated as f64 - actual as f64).min(cap);
}

/// The limiter port: shared by every worker of a deployment.
#[async_trait]
pub trait RateLimiter: Send + Sync {
    /// Tries to take budget for one call of `lane` estimated at `tokens`.
    async fn try_acquire(&self, lane: Lane, tokens: u64) -> Result<Decision, LimiterError>;
    /// Reconciles the estimate with the reported usage.
    async fn reconcile(&self, lane: Lane, estimated: u64, actual: u64) -> Result<(), LimiterError>;
}

/// The in-process limiter (local mode, tests).
#[derive(Debug)]
pub struct MemoryLimiter {
    config: LimiterConfig,
    clock: SharedClock,
    state: Mutex<BucketState>,
}

impl MemoryLimiter {
    /// Full buckets now.
    pub fn new(config: LimiterConfig, clock: SharedClock) -> Self {
        let state = Mutex::new(BucketState::full(&config, clock.now_ms()));
        Self { config, clock, state }
    }
}

#[async_trait]
impl RateLimiter for MemoryLimiter {
    async fn try_acquire(&self, lane: Lane, tokens: u64) -> Result<Decision, LimiterError> {
        let mut s = self.state.lock().map_err(|_| LimiterError::Unavailable("poisoned".into()))?;
        Ok(decide(&self.config, &mut s, self.clock.now_ms(), lane.into(), tokens))
    }

    async fn reconcile(&self, lane: Lane, estimated: u64, actual: u64) -> Result<(), LimiterError> {
        let mut s = self.state.lock().map_err(|_| LimiterError::Unavailable("poisoned".into()))?;
        reconcile(&self.config, &mut s, lane.into(), estimated, actual);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a limiter with two saturated (or one idle) classes on a simulated clock and returns the
    /// tokens each class got over `minutes` windows.
    fn simulate(
        config: LimiterConfig,
        minutes: u64,
        tokens_per_call: [u64; 2],
        active: [bool; 2],
    ) -> [u64; 2] {
        let mut state = BucketState::full(&config, 0);
        let mut now = 0u64;
        let mut got = [0u64; 2];
        let mut next = [0u64; 2];
        let end = (minutes as f64 * config.window_ms) as u64;
        while now < end {
            for (i, class) in [Class::Interactive, Class::Background].into_iter().enumerate() {
                if !active[i] || next[i] > now {
                    continue;
                }
                match decide(&config, &mut state, now, class, tokens_per_call[i]) {
                    Decision::Granted => got[i] += tokens_per_call[i],
                    Decision::Wait(d) => next[i] = now + d.as_millis().max(1) as u64,
                }
            }
            now = next
                .iter()
                .zip(active)
                .filter(|(_, a)| *a)
                .map(|(n, _)| *n)
                .min()
                .unwrap_or(end)
                .max(now + 1);
        }
        got
    }

    #[test]
    fn both_saturated_interactive_keeps_its_reservation() {
        let cfg = LimiterConfig::new(600.0, 100_000.0);
        let got = simulate(cfg, 10, [500, 2_000], [true, true]);
        let share = got[0] as f64 / (got[0] + got[1]) as f64;
        assert!(share >= 0.65, "interactive got {share:.3} of the tokens");
        let total_per_min = (got[0] + got[1]) as f64 / 10.0;
        assert!(total_per_min <= 100_000.0 * 1.1, "never past the limit (plus the first minute's burst)");
    }

    #[test]
    fn an_idle_interactive_lane_lends_to_the_background() {
        let cfg = LimiterConfig::new(600.0, 100_000.0);
        let got = simulate(cfg, 10, [500, 2_000], [false, true]);
        let per_min = got[1] as f64 / 10.0;
        assert!(per_min >= 0.9 * 100_000.0, "background got {per_min} tokens/min");
    }

    #[test]
    fn waits_are_exact_and_reconciliation_refunds() {
        let cfg = LimiterConfig::new(60.0, 6_000.0); // interactive: 42 rpm, 4200 tpm
        let mut s = BucketState::full(&cfg, 0);
        // Background's bucket (1800) is full, so it lends what is above half (900).
        assert_eq!(decide(&cfg, &mut s, 0, Class::Interactive, 5_000), Decision::Granted);
        assert!(matches!(decide(&cfg, &mut s, 0, Class::Interactive, 1_000), Decision::Wait(_)));
        reconcile(&cfg, &mut s, Class::Interactive, 5_000, 1_000);
        assert_eq!(
            decide(&cfg, &mut s, 0, Class::Interactive, 1_000),
            Decision::Granted,
            "the overestimate came back"
        );
        let Decision::Wait(w) = decide(&cfg, &mut s, 0, Class::Interactive, 4_200) else { panic!() };
        // 2200 left, 900 lendable: short by 2000 at 4200 tokens/min = 28.571 s.
        assert_eq!(w, Duration::from_millis(28_572));
    }
}

/// An [`LlmClient`](crate::ports::LlmClient) that takes budget from a [`RateLimiter`] before each
/// call and reconciles it with the reported usage after. It waits for budget up to `max_wait`; a
/// longer wait fails the call as retryable with that hint, so the worker hands the task back to its
/// queue with a visibility delay instead of holding a slot. With the limiter unreachable it calls
/// anyway (the provider's 429s and the retry policy are the backstop) and counts a degraded operation.
pub struct Limited<C> {
    inner: C,
    limiter: std::sync::Arc<dyn RateLimiter>,
    max_wait: Duration,
}

impl<C> Limited<C> {
    /// Wraps `inner`.
    pub fn new(inner: C, limiter: std::sync::Arc<dyn RateLimiter>, max_wait: Duration) -> Self {
        Self { inner, limiter, max_wait }
    }
}

/// Puts the limiter (if any) in front of `llm`. A budget wait longer than `max_wait` hands the task
/// back to its queue.
pub fn limited(
    llm: std::sync::Arc<dyn crate::ports::LlmClient>,
    limiter: Option<std::sync::Arc<dyn crate::limiter::RateLimiter>>,
    max_wait: std::time::Duration,
) -> std::sync::Arc<dyn crate::ports::LlmClient> {
    match limiter {
        Some(limiter) => std::sync::Arc::new(crate::limiter::Limited::new(llm, limiter, max_wait)),
        None => llm,
    }
}

/// The limiter's name for the configured provider and model: one shared budget per model.
pub fn limiter_name() -> String {
    format!(
        "{}:{}",
        crate::config::optional_env("LANES_LLM_PROVIDER").unwrap_or_else(|| "offline".into()),
        std::env::var("LANES_LLM_MODEL").unwrap_or_default()
    )
}

/// Tokens charged before a call: the prompt at four bytes a token plus the completion cap.
pub fn estimate_tokens(request: &crate::ports::LlmRequest) -> u64 {
    crate::llm::user_message(request).len().div_ceil(4) as u64 + 200 + u64::from(request.max_tokens)
}

#[async_trait]
impl<C: crate::ports::LlmClient> crate::ports::LlmClient for Limited<C> {
    async fn complete(
        &self,
        request: &crate::ports::LlmRequest,
    ) -> Result<crate::ports::LlmResponse, crate::ports::LlmError> {
        let estimate = estimate_tokens(request);
        let deadline = tokio::time::Instant::now() + self.max_wait;
        let mut charged = true;
        loop {
            match self.limiter.try_acquire(request.lane, estimate).await {
                Ok(Decision::Granted) => break,
                Ok(Decision::Wait(wait)) => {
                    if tokio::time::Instant::now() + wait > deadline {
                        return Err(crate::ports::LlmError::Throttled {
                            message: "LLM rate budget exhausted for this lane".into(),
                            retry_after: Some(wait),
                        });
                    }
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "limiter unavailable; calling unthrottled");
                    charged = false;
                    break;
                }
            }
        }
        let result = self.inner.complete(request).await;
        if charged {
            let actual = result.as_ref().map(|r| r.usage.prompt + r.usage.completion).unwrap_or(0);
            if let Err(e) = self.limiter.reconcile(request.lane, estimate, actual).await {
                tracing::warn!(error = %e, "limiter reconcile failed");
            }
        }
        result
    }
}

/// Limits from `LANES_LLM_RPM` and `LANES_LLM_TPM` (both or neither); `None` when unset.
pub fn config_from_env() -> Result<Option<LimiterConfig>, crate::config::ConfigError> {
    use crate::config::ConfigError;
    let read = |name: &'static str| -> Result<Option<f64>, ConfigError> {
        match crate::config::optional_env(name) {
            None => Ok(None),
            Some(v) => match v.trim().parse::<f64>() {
                Ok(n) if n > 0.0 => Ok(Some(n)),
                _ => Err(ConfigError::Invalid { name, reason: format!("`{v}` is not a positive number") }),
            },
        }
    };
    match (read("LANES_LLM_RPM")?, read("LANES_LLM_TPM")?) {
        (None, None) => Ok(None),
        (Some(rpm), Some(tpm)) => Ok(Some(LimiterConfig::new(rpm, tpm))),
        (None, Some(_)) => Err(ConfigError::Missing("LANES_LLM_RPM")),
        (Some(_), None) => Err(ConfigError::Missing("LANES_LLM_TPM")),
    }
}

#[cfg(test)]
mod limited_tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::domain::Kind;
    use crate::llm::OfflineProvider;
    use crate::ports::{LlmClient, LlmError, LlmRequest};
    use std::sync::Arc;

    #[tokio::test]
    async fn calls_within_budget_pass_and_the_rest_are_handed_back_with_the_wait() {
        // 6 rpm: interactive holds 4.2 requests, background 1.8 (lends 0.9 above its half).
        let limiter =
            Arc::new(MemoryLimiter::new(LimiterConfig::new(6.0, 1_000_000.0), Arc::new(SystemClock)));
        let provider = Arc::new(OfflineProvider::new(|_| Duration::ZERO));
        let client = Limited::new(provider.clone(), limiter, Duration::from_millis(200));
        let request = LlmRequest {
            lane: Lane::Interactive,
            kind: Kind::Explain,
            prompt: "x".into(),
            target_files: vec![],
            max_tokens: 10,
            params: Default::default(),
        };
        // Four from its own share, a fifth borrowed from the idle background's upper half.
        for _ in 0..5 {
            client.complete(&request).await.unwrap();
        }
        let started = std::time::Instant::now();
        let Err(LlmError::Throttled { retry_after: Some(after), .. }) = client.complete(&request).await
        else {
            panic!("the sixth call must be handed back")
        };
        assert!(started.elapsed() < Duration::from_millis(100), "no wait past max_wait");
        assert!(after > Duration::from_secs(5), "the hint is the real wait: {after:?}");
        assert_eq!(provider.calls(), 5, "the provider never saw the throttled call");
    }
}
