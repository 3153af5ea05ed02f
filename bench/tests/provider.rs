//! The limiter against providers that count their limits differently, through the shared Redis
//! limiter with eight workers: the emulator's counts (429s, failures, the interactive share), not
//! timings, are asserted.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_bench::provider::{limiter_config, run};
use lanes_core::adapters::redis::limiter::RedisLimiter;
use lanes_core::adapters::redis::{RedisSettings, connect};
use lanes_core::clock::SystemClock;
use lanes_tests::RedisServer;
use lanes_tests::mock_llm::{Discipline, Hint, MockLimits};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_discipline_or_hint_style_fails_a_call_and_429s_stay_rare() {
    let redis = RedisServer::start();
    let settings = RedisSettings { prefix: "bench:".into(), ..redis.settings(false) };
    let conn = connect(&settings).await.unwrap();
    let cases = [
        (Discipline::TokenBucket, Hint::Both, true),
        (Discipline::FixedWindow, Hint::RetryAfter, false),
        (Discipline::SlidingWindow, Hint::Vendor, false),
        (Discipline::FixedWindow, Hint::RetryAfterMs, true),
    ];
    for (i, (discipline, hint, known)) in cases.into_iter().enumerate() {
        let limits = MockLimits {
            rpm: 100.0,
            tpm: 10_000.0,
            window: Duration::from_secs(1),
            discipline,
            headers: !known,
            hint,
        };
        let limiter = Arc::new(RedisLimiter::new(
            conn.clone(),
            "bench:",
            &format!("case{i}"),
            limiter_config(&limits, known),
            Arc::new(SystemClock),
        ));
        let r = run(&format!("{discipline:?}"), &format!("{hint:?}"), limits, limiter, 3.0).await.unwrap();
        eprintln!("{r:?}");
        assert_eq!(r.failed, 0, "throttling is never a failure: {r:?}");
        let bound = if known { 0.01 } else { 0.05 };
        // One 429 is always allowed: a saturated run makes about 100 requests, so 1% of 99 would
        // forbid any, and whether the run made 99 requests or 100 would decide the test.
        let allowed = (bound * r.requests as f64).max(1.0);
        assert!(r.throttled as f64 <= allowed, "429s {:.3} over {bound}: {r:?}", r.throttled_share);
        assert!(r.interactive_share >= 0.6, "interactive keeps its reservation: {r:?}");
        assert!(r.requests > 50, "the run was saturated: {r:?}");
    }
}
