//! Retries that respect the provider: only 408/409/429/5xx and connection errors are retried, with
//! exponential backoff and full jitter, never sooner than the provider asked (`Retry-After`,
//! `retry-after-ms`, `x-ratelimit-reset-*`, `anthropic-ratelimit-*-reset`), for a bounded number of
//! attempts. Dropping the future (the lease's cancellation) aborts the request in flight.

use crate::ports::{DeltaSink, LlmClient, LlmError, LlmRequest, LlmResponse};
use async_trait::async_trait;
use reqwest::header::HeaderMap;
use std::time::{Duration, SystemTime};

/// How retries are spaced and bounded.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Cap of the first retry's delay; doubles per attempt.
    pub base: Duration,
    /// Largest backoff.
    pub max_delay: Duration,
    /// Largest wait a provider hint may impose (a longer one fails the attempt so the task is handed
    /// back to the queue instead of holding a worker).
    pub max_hint: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_hint: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// Full jitter: uniform in `[0, min(max_delay, base * 2^(attempt - 1))]`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let cap = self.base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20)).min(self.max_delay);
        Duration::from_millis(crate::jitter::range(0..=cap.as_millis() as u64))
    }
}

/// Whether an HTTP status is worth retrying: timeouts, conflicts, throttles and server errors.
/// Never 400/401/403/404.
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || (500..=599).contains(&status)
}

/// Parses a Go-style duration as OpenAI sends it in `x-ratelimit-reset-*`: `20ms`, `1s`, `6m0s`,
/// `1h2m3.5s`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let factor = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return None,
        };
        total += value * factor;
        rest = &rest[unit_end..];
    }
    seconds(total)
}

/// The longest hint taken from a header: a provider's reset is minutes at most, and a day bounds a
/// mistaken or hostile value (`inf`, `1e20`) without refusing the rest of the answer.
pub const MAX_HINT: Duration = Duration::from_secs(24 * 3600);

/// Seconds as a duration, clamped to `0..=MAX_HINT`; `None` for NaN. Never panics.
pub fn seconds(secs: f64) -> Option<Duration> {
    if secs.is_nan() {
        return None;
    }
    Some(Duration::try_from_secs_f64(secs.clamp(0.0, MAX_HINT.as_secs_f64())).unwrap_or(MAX_HINT))
}

/// The provider's own "not before" hint, the latest of every header it sent, relative to `now`:
/// `retry-after` (seconds or an HTTP date), `retry-after-ms`, the same under any vendor prefix
/// (`x-litellm-retry-after`, `x-ratelimit-retry-after-ms`, ...), OpenAI's `x-ratelimit-reset-*` and
/// Anthropic's `anthropic-ratelimit-*-reset`. Values that do not parse are ignored; none panics.
pub fn retry_hint(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let until = |t: SystemTime| t.duration_since(now).unwrap_or(Duration::ZERO);
    let mut hints = Vec::new();
    for (name, value) in headers {
        let (name, Ok(v)) = (name.as_str(), value.to_str().map(str::trim)) else { continue };
        let hint = if name.ends_with("retry-after-ms") {
            v.parse::<f64>().ok().and_then(|ms| seconds(ms / 1000.0))
        } else if name.ends_with("retry-after") {
            match v.parse::<f64>() {
                Ok(secs) => seconds(secs),
                Err(_) => httpdate::parse_http_date(v).ok().map(until),
            }
        } else if name.starts_with("x-ratelimit-reset-") {
            parse_go_duration(v)
        } else if name.starts_with("anthropic-ratelimit-") && name.ends_with("-reset") {
            humantime::parse_rfc3339_weak(v).ok().map(until)
        } else {
            None
        };
        hints.extend(hint);
    }
    hints.into_iter().max().map(|d| d.min(MAX_HINT))
}

/// What the provider's rate-limit headers say: its limits (OpenAI's `x-ratelimit-limit-*`,
/// Anthropic's `anthropic-ratelimit-*-limit`) and, when a `remaining-*` is 0, how long until its
/// `reset-*`. Values that do not parse are ignored.
pub fn rate_limits(headers: &HeaderMap, now: SystemTime) -> crate::ports::ProviderLimits {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let num =
        |name: &str| get(name).and_then(|v| v.parse::<f64>().ok()).filter(|v| v.is_finite() && *v >= 0.0);
    let until = |t: SystemTime| t.duration_since(now).unwrap_or(Duration::ZERO);
    let rpm = num("x-ratelimit-limit-requests").or_else(|| num("anthropic-ratelimit-requests-limit"));
    let tpm = num("x-ratelimit-limit-tokens")
        .or_else(|| num("anthropic-ratelimit-tokens-limit"))
        .or_else(|| num("anthropic-ratelimit-input-tokens-limit"));
    let mut exhausted = Vec::new();
    let (mut remaining, mut reset) = ([None; 2], [None; 2]);
    for (i, dim) in ["requests", "tokens"].into_iter().enumerate() {
        let openai = (
            num(&format!("x-ratelimit-remaining-{dim}")),
            get(&format!("x-ratelimit-reset-{dim}")).and_then(parse_go_duration),
        );
        let anthropic = (
            num(&format!("anthropic-ratelimit-{dim}-remaining")),
            get(&format!("anthropic-ratelimit-{dim}-reset"))
                .and_then(|v| humantime::parse_rfc3339_weak(v).ok())
                .map(until),
        );
        let (left, resets) = if openai.0.is_some() { openai } else { anthropic };
        if left == Some(0.0) {
            exhausted.extend(resets);
        }
        remaining[i] = left;
        reset[i] = resets.map(|d| d.min(MAX_HINT));
    }
    crate::ports::ProviderLimits {
        rpm: rpm.filter(|v| *v > 0.0),
        tpm: tpm.filter(|v| *v > 0.0),
        exhausted_for: exhausted.into_iter().max().map(|d| d.min(MAX_HINT)),
        remaining,
        reset,
    }
}

/// A client with retries.
pub struct Retrying<C> {
    inner: C,
    policy: RetryPolicy,
}

impl<C> Retrying<C> {
    /// Wraps `inner`.
    pub fn new(inner: C, policy: RetryPolicy) -> Self {
        Self { inner, policy }
    }
}

#[async_trait]
impl<C: LlmClient> LlmClient for Retrying<C> {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        self.with_retries(request, None).await
    }
    async fn stream(&self, request: &LlmRequest, sink: &dyn DeltaSink) -> Result<LlmResponse, LlmError> {
        self.with_retries(request, Some(sink)).await
    }
}

impl<C: LlmClient> Retrying<C> {
    /// The call, streamed to `sink` when there is one, made again after a retryable failure while
    /// attempts are left; a stream cut part-way is told to restart before the next attempt.
    async fn with_retries(
        &self,
        request: &LlmRequest,
        sink: Option<&dyn DeltaSink>,
    ) -> Result<LlmResponse, LlmError> {
        let mut attempt = 1;
        loop {
            match self.inner.call(request, sink).await {
                Err(e @ (LlmError::Retryable { .. } | LlmError::Throttled { .. }))
                    if attempt < self.policy.max_attempts =>
                {
                    let hint = e.retry_after().unwrap_or_default();
                    if hint > self.policy.max_hint {
                        // Waiting here would hold a worker: let the queue bring the task back later.
                        return Err(e);
                    }
                    let wait = self.policy.backoff(attempt).max(hint);
                    tracing::warn!(attempt, wait_ms = wait.as_millis() as u64, error = %e, "provider failed; retrying");
                    if let Some(sink) = sink {
                        sink.restart(e.client_reason());
                    }
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn statuses() {
        for s in [408, 409, 429, 500, 502, 503, 529] {
            assert!(is_retryable_status(s), "{s}");
        }
        for s in [200, 400, 401, 403, 404, 422] {
            assert!(!is_retryable_status(s), "{s}");
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(parse_go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_go_duration("1h2m3.5s"), Some(Duration::from_millis(3_723_500)));
        assert_eq!(parse_go_duration("soon"), None);
        assert_eq!(parse_go_duration(""), None);
    }

    #[test]
    fn hints_from_every_provider_header() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        let h = |pairs: &[(&'static str, String)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_str(v).unwrap());
            }
            m
        };
        assert_eq!(retry_hint(&h(&[("retry-after", "7".into())]), now), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_hint(&h(&[("retry-after-ms", "250".into())]), now),
            Some(Duration::from_millis(250))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(retry_hint(&h(&[("retry-after", date)]), now), Some(Duration::from_secs(30)));
        let openai =
            h(&[("x-ratelimit-reset-requests", "1s".into()), ("x-ratelimit-reset-tokens", "6m0s".into())]);
        assert_eq!(retry_hint(&openai, now), Some(Duration::from_secs(360)), "the latest reset wins");
        let reset = humantime::format_rfc3339_seconds(now + Duration::from_secs(12)).to_string();
        assert_eq!(
            retry_hint(&h(&[("anthropic-ratelimit-tokens-reset", reset)]), now),
            Some(Duration::from_secs(12))
        );
        assert_eq!(retry_hint(&HeaderMap::new(), now), None);
    }

    #[test]
    fn vendor_prefixed_hints_are_read_and_no_value_panics() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        let one = |k: &'static str, v: &str| {
            let mut m = HeaderMap::new();
            m.insert(k, HeaderValue::from_str(v).unwrap());
            retry_hint(&m, now)
        };
        assert_eq!(one("x-litellm-retry-after", "3"), Some(Duration::from_secs(3)));
        assert_eq!(one("x-ratelimit-retry-after-ms", "1500"), Some(Duration::from_millis(1500)));
        assert_eq!(one("retry-after", "inf"), Some(MAX_HINT), "clamped, not a panic");
        assert_eq!(one("retry-after", "1e20"), Some(MAX_HINT));
        assert_eq!(one("retry-after", "-5"), Some(Duration::ZERO));
        assert_eq!(one("retry-after", "NaN"), None);
        assert_eq!(one("x-ratelimit-reset-requests", "99999999999h"), Some(MAX_HINT));
        // Every printable value under every hint header: no panic.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 24) as usize;
            let value: String = (0..len)
                .map(|i| {
                    let b = ((state >> ((i % 8) * 8)) as u8 % 95) + 32;
                    char::from(b)
                })
                .collect();
            for name in [
                "retry-after",
                "retry-after-ms",
                "x-ratelimit-reset-tokens",
                "anthropic-ratelimit-requests-reset",
                "x-vendor-retry-after",
            ] {
                if let Ok(v) = HeaderValue::from_str(&value) {
                    let mut m = HeaderMap::new();
                    m.insert(name, v);
                    let _ = retry_hint(&m, now);
                }
            }
            let _ = parse_go_duration(&value);
        }
    }

    #[test]
    fn limits_and_spent_budgets_from_both_vendors_headers() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        let mut m = HeaderMap::new();
        for (k, v) in [
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1.5s"),
            ("x-ratelimit-remaining-tokens", "12"),
            ("x-ratelimit-reset-tokens", "9s"),
        ] {
            m.insert(k, HeaderValue::from_static(v));
        }
        let l = rate_limits(&m, now);
        assert_eq!(
            (l.rpm, l.tpm, l.exhausted_for),
            (Some(500.0), Some(30000.0), Some(Duration::from_millis(1500)))
        );
        let mut a = HeaderMap::new();
        let reset = humantime::format_rfc3339_seconds(now + Duration::from_secs(4)).to_string();
        a.insert("anthropic-ratelimit-requests-limit", HeaderValue::from_static("50"));
        a.insert("anthropic-ratelimit-tokens-limit", HeaderValue::from_static("40000"));
        a.insert("anthropic-ratelimit-tokens-remaining", HeaderValue::from_static("0"));
        a.insert("anthropic-ratelimit-tokens-reset", HeaderValue::from_str(&reset).unwrap());
        let l = rate_limits(&a, now);
        assert_eq!(
            (l.rpm, l.tpm, l.exhausted_for),
            (Some(50.0), Some(40000.0), Some(Duration::from_secs(4)))
        );
        assert_eq!(rate_limits(&HeaderMap::new(), now), Default::default());
    }

    #[test]
    fn backoff_is_full_jitter_under_the_cap() {
        let p = RetryPolicy {
            base: Duration::from_millis(100),
            max_delay: Duration::from_millis(350),
            ..RetryPolicy::default()
        };
        for attempt in 1..=6 {
            let cap = (100u64 << (attempt - 1)).min(350);
            for _ in 0..50 {
                assert!(p.backoff(attempt).as_millis() as u64 <= cap);
            }
        }
    }
}
