//! The rate limiter in front of an LLM client ([`Limited`]): budget is taken from the route's
//! [`RateLimiter`] before each HTTP attempt and settled after it, with the provider's answers
//! teaching the limiter its limits and its 429s starting the shared cooldown. The budget decision
//! itself is [`crate::limiter`]'s.

use crate::domain::limits::{Decision, UNKNOWN};
use crate::ports::ProviderLimits;
use crate::ports::RateLimiter;
use async_trait::async_trait;
use std::sync::Mutex;
use std::time::Duration;

/// An [`LlmClient`](crate::ports::LlmClient) that takes budget from a [`RateLimiter`] before each
/// HTTP attempt (it sits inside the retry loop, so a retried call is charged per attempt) and settles
/// it after:
///
/// - an answer is reconciled with the reported usage, and its rate-limit headers teach the limiter
///   the provider's limits (and start a cooldown when they say the budget is spent);
/// - a 429 starts the shared cooldown for its hint (a second without one) and gives the tokens back:
///   the provider refused the request, it did not run it;
/// - a 5xx or a timeout keeps the charge: the provider may have counted it;
/// - a refusal (400 and the like) gives the tokens back.
///
/// It waits for budget up to `max_wait`; a longer wait ends the call `Throttled` with that hint, so
/// the worker puts the task off instead of holding a slot. With the limiter unreachable it calls
/// anyway (the provider's 429s are the backstop) and counts a degraded operation.
pub struct Limited<C> {
    inner: C,
    limiter: std::sync::Arc<dyn RateLimiter>,
    max_wait: Duration,
    /// Hintless 429s in a row and when the last pause they started ends: each one after that pause
    /// doubles the next (a provider in slow start says nothing about when it will have room; several
    /// workers refused at once count as one).
    blind: Mutex<(u32, Option<tokio::time::Instant>)>,
    /// The route's name in metrics (`provider:model`).
    route: String,
    /// Calls of this process the provider has not answered yet, and their estimated tokens.
    in_flight: [std::sync::atomic::AtomicU64; 2],
    /// This process's answers of the last window (when, tokens): what got through, from which a
    /// provider that says nothing about its limits has them inferred at its first 429.
    served: Mutex<std::collections::VecDeque<(tokio::time::Instant, u64)>>,
    /// Limits this process inferred from 429s (requests, tokens per window) and when.
    inferred: Mutex<Option<((f64, f64), tokio::time::Instant)>>,
}

impl<C> Limited<C> {
    /// Wraps `inner`.
    pub fn new(inner: C, limiter: std::sync::Arc<dyn RateLimiter>, max_wait: Duration) -> Self {
        Self {
            inner,
            limiter,
            max_wait,
            blind: Mutex::new((0, None)),
            route: String::new(),
            in_flight: Default::default(),
            served: Default::default(),
            inferred: Mutex::new(None),
        }
    }

    /// Names the route in the metrics of its waits, 429s and cooldowns.
    pub fn for_route(mut self, route: &str) -> Self {
        self.route = route.to_owned();
        self
    }
}

/// Puts the limiter (if any) in front of `llm`. A budget wait longer than `max_wait` hands the task
/// back to its queue. For a provider with retries, put the limiter inside them
/// ([`crate::llm::Retrying`] over [`Limited`]) so each HTTP attempt is charged.
pub fn limited(
    llm: std::sync::Arc<dyn crate::ports::LlmClient>,
    limiter: Option<std::sync::Arc<dyn RateLimiter>>,
    max_wait: std::time::Duration,
) -> std::sync::Arc<dyn crate::ports::LlmClient> {
    match limiter {
        Some(limiter) => std::sync::Arc::new(Limited::new(llm, limiter, max_wait)),
        None => llm,
    }
}

/// Tokens charged before a call: the prompt at four bytes a token plus the completion cap.
pub fn estimate_tokens(request: &crate::ports::LlmRequest) -> u64 {
    request.user_message().len().div_ceil(4) as u64 + 200 + u64::from(request.max_tokens)
}

#[async_trait]
impl<C: crate::ports::LlmClient> crate::ports::LlmClient for Limited<C> {
    async fn complete(
        &self,
        request: &crate::ports::LlmRequest,
    ) -> Result<crate::ports::LlmResponse, crate::ports::LlmError> {
        self.paced(request, None).await
    }
    async fn stream(
        &self,
        request: &crate::ports::LlmRequest,
        sink: &dyn crate::ports::DeltaSink,
    ) -> Result<crate::ports::LlmResponse, crate::ports::LlmError> {
        self.paced(request, Some(sink)).await
    }
}

impl<C: crate::ports::LlmClient> Limited<C> {
    /// The call once the limiter admits it (streamed to `sink` when there is one), settled with
    /// what it used.
    async fn paced(
        &self,
        request: &crate::ports::LlmRequest,
        sink: Option<&dyn crate::ports::DeltaSink>,
    ) -> Result<crate::ports::LlmResponse, crate::ports::LlmError> {
        let estimate = estimate_tokens(request);
        let charged = self.admit(request, estimate).await?;
        use std::sync::atomic::Ordering::Relaxed;
        self.in_flight[0].fetch_add(1, Relaxed);
        self.in_flight[1].fetch_add(estimate, Relaxed);
        let result = self.inner.call(request, sink).await;
        self.in_flight[0].fetch_sub(1, Relaxed);
        self.in_flight[1].fetch_sub(estimate, Relaxed);
        if charged {
            self.settle(request, estimate, &result).await;
        }
        result
    }

    /// Waits for the limiter's grant of the call (or a share of a cooldown), at most `max_wait`:
    /// whether the call was charged (not when the limiter could not be reached).
    async fn admit(
        &self,
        request: &crate::ports::LlmRequest,
        estimate: u64,
    ) -> Result<bool, crate::ports::LlmError> {
        let deadline = tokio::time::Instant::now() + self.max_wait;
        let mut charged = true;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.limiter.try_acquire(request.lane, estimate, left).await {
                Ok(Decision::Granted) => break,
                Ok(Decision::Reserved(wait)) => {
                    crate::metrics::llm_route_event(request.lane, &self.route, "limiter_wait");
                    crate::metrics::LLM_LIMITER_WAIT
                        .with_label_values(&[request.lane.as_str(), &self.route])
                        .inc_by(wait.as_secs_f64());
                    tokio::time::sleep(wait).await;
                    // A 429 while this call waited paused everyone. Its reservation was made for the
                    // time now paused: firing it after the pause, with every other reservation, would
                    // be a burst. It gives its tokens back and queues again once the pause is over.
                    if let Ok(Some(pause)) = self.limiter.cooling_for().await {
                        if let Err(e) = self.limiter.give_back(request.lane, estimate).await {
                            tracing::warn!(error = %e, "limiter give-back failed");
                        }
                        if tokio::time::Instant::now() + pause > deadline {
                            return Err(crate::ports::LlmError::Throttled {
                                message: "provider cooling down".into(),
                                retry_after: Some(pause),
                            });
                        }
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                    break;
                }
                Ok(Decision::Wait(wait)) => {
                    if tokio::time::Instant::now() + wait > deadline {
                        return Err(crate::ports::LlmError::Throttled {
                            message: "LLM rate budget exhausted for this lane".into(),
                            retry_after: Some(wait),
                        });
                    }
                    crate::metrics::llm_route_event(request.lane, &self.route, "limiter_wait");
                    crate::metrics::LLM_LIMITER_WAIT
                        .with_label_values(&[request.lane.as_str(), &self.route])
                        .inc_by(wait.as_secs_f64());
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "limiter unavailable; calling unthrottled");
                    charged = false;
                    break;
                }
            }
        }
        Ok(charged)
    }
}

/// A 429 without a hint pauses everyone this long, doubling with each hintless 429 in a row up to
/// [`MAX_BLIND_COOLDOWN`].
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(1);
/// The longest pause a run of hintless 429s grows to.
pub const MAX_BLIND_COOLDOWN: Duration = Duration::from_secs(30);

impl<C> Limited<C> {
    fn reset_blind(&self) {
        if let Ok(mut b) = self.blind.lock() {
            *b = (0, None);
        }
    }

    /// Keeps `tokens` of an answer in the window's log.
    fn log_served(&self, tokens: u64) {
        let window = Duration::from_millis(self.limiter.limits().window_ms as u64);
        let now = tokio::time::Instant::now();
        if let Ok(mut log) = self.served.lock() {
            while log.front().is_some_and(|(t, _)| now.duration_since(*t) > window) {
                log.pop_front();
            }
            log.push_back((now, tokens));
        }
    }

    /// A hintless 429 from a provider whose limits are unknown (no caps, no headers): what got
    /// through in the last window is about its limit, so the limiter paces at nine tenths of it. A
    /// hintless 429 under inferred limits lowers them by 30%, at most once per tenth of a window
    /// (several workers refused at once count once). A 429 with a hint needs no inference: its pause
    /// says when to come back. The provider's own headers, should they come, replace the inference.
    async fn infer_limits(&self, lane: crate::domain::Lane) {
        let limits = self.limiter.limits();
        let window = Duration::from_millis(limits.window_ms as u64);
        let now = tokio::time::Instant::now();
        let inferred = {
            let Ok(mut inferred) = self.inferred.lock() else { return };
            let known = limits.rpm < UNKNOWN || limits.tpm < UNKNOWN;
            match *inferred {
                // Caps or headers are in force: nothing to infer.
                None if known => return,
                Some((_, at)) if now.duration_since(at) < window / 10 => return,
                Some(((rpm, tpm), _)) => {
                    let lowered = ((rpm * 0.7).max(1.0), (tpm * 0.7).max(1.0));
                    *inferred = Some((lowered, now));
                    lowered
                }
                None => {
                    let Ok(log) = self.served.lock() else { return };
                    let recent: Vec<&(tokio::time::Instant, u64)> =
                        log.iter().filter(|(t, _)| now.duration_since(*t) <= window).collect();
                    if recent.is_empty() {
                        return;
                    }
                    // A provider lets a window's worth through before its first refusal (a fixed or
                    // sliding window fills, a token bucket empties its window-sized store), so what
                    // got through is the limit, however short the time it took.
                    let (requests, tokens) =
                        recent.iter().fold((0.0f64, 0.0f64), |(r, k), (_, t)| (r + 1.0, k + *t as f64));
                    let rates = ((requests * 0.9).max(1.0), (tokens * 0.9).max(1.0));
                    *inferred = Some((rates, now));
                    rates
                }
            }
        };
        tracing::info!(route = %self.route, rpm = inferred.0, tpm = inferred.1, "provider limits inferred from its 429s");
        let said = ProviderLimits { rpm: Some(inferred.0), tpm: Some(inferred.1), ..Default::default() };
        self.limiter.learn(&said);
        // Shared with every worker of the limiter (nothing to line up: no remaining is known).
        if let Err(e) = self.limiter.align(lane, &said).await {
            tracing::warn!(error = %e, "limiter could not share the inferred limits");
        }
    }

    /// The pause after a hintless 429: a second, doubled for each such 429 after the last pause ended.
    fn blind_pause(&self) -> Duration {
        let now = tokio::time::Instant::now();
        let Ok(mut b) = self.blind.lock() else { return DEFAULT_COOLDOWN };
        if b.1.is_none_or(|until| now >= until) {
            b.0 = (b.0 + 1).min(10);
        }
        let pause = DEFAULT_COOLDOWN.saturating_mul(1 << (b.0 - 1)).min(MAX_BLIND_COOLDOWN);
        b.1 = Some(now + pause);
        pause
    }

    async fn settle(
        &self,
        request: &crate::ports::LlmRequest,
        estimate: u64,
        result: &Result<crate::ports::LlmResponse, crate::ports::LlmError>,
    ) {
        use crate::ports::LlmError;
        let lane = request.lane;
        let actual = match result {
            Ok(r) => {
                self.reset_blind();
                if self.limiter.learn(&r.limits) {
                    // This answer's `remaining-*` may not count the calls still in flight (made
                    // unpaced, before the limits were known): count them as spent.
                    use std::sync::atomic::Ordering::Relaxed;
                    let mut limits = r.limits;
                    for (left, in_flight) in limits.remaining.iter_mut().zip(&self.in_flight) {
                        *left = left.map(|l| (l - in_flight.load(Relaxed) as f64).max(0.0));
                    }
                    if let Err(e) = self.limiter.align(lane, &limits).await {
                        tracing::warn!(error = %e, "limiter alignment failed");
                    }
                }
                if let Some(spent) = r.limits.exhausted_for {
                    crate::metrics::llm_route_event(lane, &self.route, "cooldown");
                    if let Err(e) = self.limiter.cool_down(spent).await {
                        tracing::warn!(error = %e, "limiter cooldown failed");
                    }
                }
                self.log_served(r.usage.prompt + r.usage.completion);
                // An answer reporting no usage keeps its charge: a proxy that leaves usage out
                // would otherwise be paced as if free.
                r.usage.reported()
            }
            Err(LlmError::Throttled { retry_after, .. }) => {
                if retry_after.is_none() {
                    self.infer_limits(lane).await;
                }
                let pause = match retry_after {
                    Some(hint) => {
                        self.reset_blind();
                        *hint
                    }
                    None => self.blind_pause(),
                };
                tracing::info!(lane = %lane, route = %self.route, pause_ms = pause.as_millis() as u64, "provider throttled; pausing every worker");
                crate::metrics::llm_route_event(lane, &self.route, "throttled");
                crate::metrics::llm_route_event(lane, &self.route, "cooldown");
                if let Err(e) = self.limiter.cool_down(pause).await {
                    tracing::warn!(error = %e, "limiter cooldown failed");
                }
                Some(0)
            }
            Err(LlmError::Retryable { .. }) => None,
            // Refused before any work (not charged): the request is spent, its tokens are not.
            Err(LlmError::Permanent(_) | LlmError::TierRefused { .. }) => Some(0),
        };
        if let Some(actual) = actual
            && let Err(e) = self.limiter.reconcile(lane, estimate, actual).await
        {
            tracing::warn!(error = %e, "limiter reconcile failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::domain::{Kind, Lane};
    use crate::limiter::{LimiterConfig, MemoryLimiter};
    use crate::llm::OfflineProvider;
    use crate::ports::{LlmClient, LlmError, LlmRequest};
    use std::sync::Arc;

    /// An interactive call of one prompt byte and a 10-token cap: an estimate of 211 tokens.
    fn small_request() -> LlmRequest {
        LlmRequest {
            lane: Lane::Interactive,
            kind: Kind::Explain,
            prompt: "x".into(),
            target_files: vec![],
            max_tokens: 10,
            params: Default::default(),
            tier: Default::default(),
            prefix: None,
        }
    }

    #[tokio::test]
    async fn calls_within_budget_pass_and_the_rest_are_handed_back_with_the_wait() {
        // 6 rpm with a whole window as the burst (and so no refill): interactive holds 4.2 requests,
        // background 1.8.
        let config = LimiterConfig { burst: 1.0, ..LimiterConfig::new(6.0, 1_000_000.0) };
        let limiter = Arc::new(MemoryLimiter::new(config, Arc::new(SystemClock)));
        let provider = Arc::new(OfflineProvider::new(|_| Duration::ZERO));
        let client = Limited::new(provider.clone(), limiter, Duration::from_millis(200));
        let request = small_request();
        // Four from its own share. The idle background lends its refill (none here), never its burst:
        // that stays for its own first call.
        for _ in 0..4 {
            client.complete(&request).await.unwrap();
        }
        let started = std::time::Instant::now();
        let Err(LlmError::Throttled { retry_after: Some(after), .. }) = client.complete(&request).await
        else {
            panic!("the sixth call must be handed back")
        };
        assert!(started.elapsed() < Duration::from_millis(100), "no wait past max_wait");
        assert!(after > Duration::from_secs(5), "the hint is the real wait: {after:?}");
        assert_eq!(provider.calls(), 4, "the provider never saw the throttled call");
    }

    /// The offline model with its usage left out, as some proxies answer.
    struct NoUsage(OfflineProvider);

    #[async_trait]
    impl LlmClient for NoUsage {
        async fn complete(&self, request: &LlmRequest) -> Result<crate::ports::LlmResponse, LlmError> {
            let mut r = self.0.complete(request).await?;
            r.usage = Default::default();
            Ok(r)
        }
    }

    #[tokio::test]
    async fn an_answer_without_usage_keeps_its_charge_and_one_with_usage_is_reconciled() {
        let request = small_request();
        // Interactive holds 70% of 760 tokens, with no refill: two estimates (211 each), not three.
        let config = LimiterConfig { burst: 1.0, ..LimiterConfig::new(1_000.0, 760.0) };
        let offline = || OfflineProvider::new(|_| Duration::ZERO);
        let limiter = || Arc::new(MemoryLimiter::new(config, Arc::new(SystemClock)));
        let reported = Limited::new(offline(), limiter(), Duration::from_millis(50));
        let unreported = Limited::new(NoUsage(offline()), limiter(), Duration::from_millis(50));
        for _ in 0..3 {
            reported.complete(&request).await.expect("reconciled to what the answers used");
        }
        for _ in 0..2 {
            unreported.complete(&request).await.unwrap();
        }
        assert!(
            matches!(unreported.complete(&request).await, Err(LlmError::Throttled { .. })),
            "two unreported answers keep their estimates, so a third does not fit"
        );
    }

    #[test]
    fn hintless_429s_double_the_pause_once_per_pause() {
        let limiter = Arc::new(MemoryLimiter::new(LimiterConfig::unknown(), Arc::new(SystemClock)));
        let client = Limited::new(OfflineProvider::new(|_| Duration::ZERO), limiter, Duration::from_secs(1));
        assert_eq!(client.blind_pause(), Duration::from_secs(1));
        assert_eq!(client.blind_pause(), Duration::from_secs(1), "workers refused together count once");
        let expire = |c: &Limited<OfflineProvider>| {
            c.blind.lock().unwrap().1 = Some(tokio::time::Instant::now() - Duration::from_millis(1));
        };
        expire(&client);
        assert_eq!(client.blind_pause(), Duration::from_secs(2));
        expire(&client);
        assert_eq!(client.blind_pause(), Duration::from_secs(4));
        for _ in 0..10 {
            expire(&client);
            client.blind_pause();
        }
        assert_eq!(client.blind_pause(), MAX_BLIND_COOLDOWN, "bounded");
        client.reset_blind();
        assert_eq!(client.blind_pause(), Duration::from_secs(1), "an answer starts over");
    }
}
