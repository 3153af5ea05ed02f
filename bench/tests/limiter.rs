//! The limiter's guarantees against the provider emulator, checked as counts (429s, shares), not
//! timings: the benchmark's building blocks under the acceptance tests. How much of the limit the
//! workers use is a rate, measured by `lanes bench limiter` and checked on a simulated clock by the
//! limiter's own tests, never here against the wall clock.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::domain::Lane;
use std::time::{Duration, Instant};

mod under_provider_limits {
    use super::*;
    use lanes_bench::limiter::{MIXED, limited_setup, run_workers, steady};

    // Limits per one-second window so the run takes seconds, not minutes; the algorithm is the same.
    const RPM: f64 = 400.0;
    const TPM: f64 = 40_000.0;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thousand_mixed_requests_from_eight_workers_get_no_429() {
        let (mock, client) = limited_setup(RPM, TPM).await.unwrap();
        let started = Instant::now();
        let calls = run_workers(client, &MIXED, 125, started + Duration::from_secs(120)).await.unwrap();
        let elapsed = started.elapsed().as_secs_f64();
        let usage = mock.usage();
        assert_eq!(calls.len(), 1000);
        assert_eq!(usage.throttled, 0, "no request over the provider's limits");
        let throughput = usage.tokens as f64 / elapsed;
        eprintln!(
            "1000 requests, 8 workers: {} tokens in {elapsed:.2} s = {throughput:.0}/s against a limit of {TPM}/s ({:.0}%), 0 x 429",
            usage.tokens,
            100.0 * throughput / TPM
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reservations_hold_under_saturation_and_a_class_alone_gets_no_429() {
        let (mock, client) = limited_setup(RPM, TPM).await.unwrap();
        let t0 = Instant::now();
        let calls = run_workers(client, &MIXED, usize::MAX, t0 + Duration::from_secs(4)).await.unwrap();
        let (i, b) = steady(&calls, t0 + Duration::from_secs(1));
        let share = i as f64 / (i + b) as f64;
        assert_eq!(mock.usage().throttled, 0);

        let (mock, client) = limited_setup(RPM, TPM).await.unwrap();
        let t1 = Instant::now();
        let background_only = [Lane::Synthesis, Lane::Synthesis, Lane::Synthesis, Lane::Commits];
        let calls =
            run_workers(client, &background_only, usize::MAX, t1 + Duration::from_secs(4)).await.unwrap();
        let last = calls.iter().map(|c| c.at).max().unwrap();
        let (_, alone) = steady(&calls, t1 + Duration::from_secs(1));
        let rate = alone as f64 / last.duration_since(t1 + Duration::from_secs(1)).as_secs_f64();
        eprintln!(
            "both saturated: interactive {:.1}% of tokens; interactive idle: background {:.1}% of the limit",
            share * 100.0,
            100.0 * rate / TPM
        );
        assert!(share >= 0.65, "interactive share {share:.3}");
        assert_eq!(mock.usage().throttled, 0);
    }
}
