//! Replays: the same seed gives the same history, and every seed that once failed replays clean.

use lanes_sim::{Options, history};
use std::time::Duration;

/// CI's histories (as `budget.rs`): five busy minutes, four clients, six payloads.
fn ci() -> Options {
    Options {
        busy: Duration::from_secs(300),
        clients: 4,
        payloads: 6,
        tenant_knobs: false,
        ..Options::default()
    }
}

#[test]
fn a_seed_replays_the_same_history() {
    let a = history::run(42, &ci());
    let b = history::run(42, &ci());
    assert_eq!(a.digest, b.digest);
    assert_eq!((a.faults, a.runs), (b.faults, b.runs));
    assert_ne!(a.digest, history::run(43, &ci()).digest, "another seed, another history");
}

/// Seeds that found a defect (named), replayed with the history they failed in: `true` for CI's
/// short histories, `false` for the default ten-minute ones.
const REGRESSIONS: &[(u64, bool, &str)] = &[
    (5, false, "a failed send deleted a record a duplicate had been answered 202 for"),
    (7, false, "slow visibility renewals delayed the lock's, which lapsed mid-call"),
    (453, false, "a slow claim before the first beat let the lock and the visibility lapse"),
    (174, false, "a run started without the lock stayed unlocked, and a second claim ran beside it"),
    (1_001_439, true, "a resubmission's failed send was not marked unsent (the record kept the old fence)"),
    (1_000_942, true, "slow lock renewals let the lock lapse (a justified extra call)"),
    (
        367,
        false,
        "an old message ran a resubmission whose own send was never made, and crash-looped to the DLQ",
    ),
    (1593, false, "an acquire whose answer was lost sent a worker degraded, and it claimed a live run"),
    (1_001_005, true, "the oracle took the sweep's relay (a DLQ delete after its copy was sent) for an ack"),
    (1, true, "a webhook delivery recorded before its commits were sent was dropped as a replay"),
    (6, true, "a failed summary write threw a paid answer away"),
    (99, true, "a duplicate delivery's refused receipt stopped its group's run mid-call"),
    (296, true, "the oracle took a call cut at the invocation's deadline for a double spend"),
    (1_000_559, true, "the oracle let a crash during a summary write go unjustified"),
    (8755, true, "a crashed process still started a model call"),
    (
        35_796,
        true,
        "the pool started a delivery after its lease lapsed and claimed on it: PROCESSING, no message",
    ),
    (
        25_752,
        true,
        "a delivery claimed after its lease lapsed paid for an answer a resubmission's fence refused",
    ),
    (210_693, true, "the oracle judged an old run's refused answer by a resubmission's breaks"),
    (218_308, true, "the oracle judged an old run's refused answer by a resubmission's breaks"),
    (
        312_108,
        true,
        "a refused receipt under an unanswered lock renewal gave the run up: its key lapsed, a second call",
    ),
    (408_893, true, "the oracle did not see that a claim made without the lock took over a live run"),
    (505_373, true, "the oracle did not see that a claim on a key a failover lost took over a live run"),
];

#[test]
fn seeds_that_once_failed_replay_clean() {
    for (seed, short, finding) in REGRESSIONS {
        // Without the tenants' knobs: each seed replays the history that once failed.
        let options = if *short { ci() } else { Options { tenant_knobs: false, ..Options::default() } };
        let r = history::run(*seed, &options);
        assert!(r.violations.is_empty(), "seed {seed} ({finding}): {:#?}", r.violations);
    }
}

/// Seeds that found a defect (of the code, or of the oracle) in histories with the tenants' knobs
/// on, some of which run provider batches. Each entry holds a seed with its busy phase's length
/// and what it found; knobs drawn differently would give each seed another history.
/// The histories are described in docs/ARCHITECTURE.md, Lifecycle simulation.
const WITH_KNOBS: &[(u64, u64, &str)] = &[
    (1_000_884, 240, "a parked task's delivery was acked on an earlier run's batch marker: left parked"),
    (
        130_301_786,
        300,
        "the oracle took a marker for a commit's owner: another worker's refused batch took the \
         marker and closed it while the batch acked on still carried the commit",
    ),
];

#[test]
fn seeds_that_once_failed_with_the_knobs_replay_clean() {
    for (seed, busy, finding) in WITH_KNOBS {
        let options = Options { busy: Duration::from_secs(*busy), tenant_knobs: true, ..ci() };
        let r = history::run(*seed, &options);
        assert!(r.violations.is_empty(), "seed {seed} ({finding}): {:#?}", r.violations);
    }
}

/// Seeds that found a defect in `lanes sim`'s own histories (ten busy minutes, five clients, eight
/// payloads, the tenants' knobs on), replayed so; each with whether its history continues a saved
/// answer (what it found needs one).
const IN_CLI_HISTORIES: &[(u64, &str, bool)] = &[
    (
        777_108,
        "a takeover's saved prefix was given twice when the route asked again at sync after a flex refusal",
        true,
    ),
    (
        4_400_001_823,
        "a commit two provider batches carried, both sent back, met in one receive and was acked as still batched",
        false,
    ),
    (
        31,
        "the oracle took a dead receipt of an earlier delivery, still held by its process, for the one claiming (I11)",
        false,
    ),
];

#[test]
fn seeds_that_once_failed_in_the_clis_histories_replay_clean() {
    for (seed, finding, continues) in IN_CLI_HISTORIES {
        let r = history::run(*seed, &Options::default());
        assert!(r.violations.is_empty(), "seed {seed} ({finding}): {:#?}", r.violations);
        assert!(!continues || r.continued.0 > 0, "seed {seed} continues a saved answer");
    }
}
