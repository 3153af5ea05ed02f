//! The simulation's fixed budget in `cargo test`: 2,000 histories (short ones: four busy minutes
//! each) on two threads, every invariant exercised and none broken. Alone in its test binary, so
//! the budget has the two cores to itself (the replays are `regressions.rs`).

use lanes_sim::Options;
use std::time::Duration;

/// CI's histories: four busy minutes, four clients, six payloads (what fits 2,000 of them in three
/// minutes of a debug build on two cores).
fn ci() -> Options {
    Options { busy: Duration::from_secs(240), clients: 4, payloads: 6, ..Options::default() }
}

#[test]
fn two_thousand_histories_break_no_invariant() {
    let summary = lanes_sim::run_many(1_000_000, 2_000, 2, &ci(), Some(3));
    for f in &summary.failures {
        for v in &f.violations {
            eprintln!(
                "seed {} broke {} on {}: {}\n  {}",
                f.seed,
                v.invariant,
                v.task,
                v.detail,
                v.trace.join("\n  ")
            );
        }
    }
    assert_eq!(
        summary.violation_count(),
        0,
        "replay with: lanes sim --seed S --histories 1 --busy-secs 240 --clients 4 --payloads 6 --trace"
    );
    assert_eq!(summary.histories, 2_000);
    for (invariant, n) in &summary.exercised {
        assert!(*n > 0, "{invariant} was never exercised");
    }
    assert!(summary.faults_per_history > 10.0, "{summary:?}");
    assert!(summary.continued_answers > 0, "no takeover continued a saved answer: {summary:?}");
}
