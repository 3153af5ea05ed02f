//! The embedded file's group commits, process-wide because the writer thread that makes them has
//! no [`super::Metrics`] of its own: how many commits, how many writes they carried, and how long
//! each group took (its writes run, its pages written and flushed). A write waits for the group
//! under way and then for its own, so these explain local mode's write latency. Only local mode
//! commits; in Lambda the series stay at zero, and zero counters are never sent as EMF.

use prometheus::{Histogram, HistogramOpts, IntCounter};
use std::sync::LazyLock;

/// Group commits made.
pub static GROUP_COMMITS: LazyLock<IntCounter> = LazyLock::new(|| {
    IntCounter::new("lanes_embedded_group_commits_total", "Group commits of the embedded file")
        .unwrap_or_else(|e| panic!("lanes_embedded_group_commits_total: {e}"))
});

/// Writes (queue and store operations) the group commits carried.
pub static GROUP_COMMIT_WRITES: LazyLock<IntCounter> = LazyLock::new(|| {
    IntCounter::new(
        "lanes_embedded_group_commit_writes_total",
        "Writes carried by the embedded file's group commits",
    )
    .unwrap_or_else(|e| panic!("lanes_embedded_group_commit_writes_total: {e}"))
});

/// Seconds each group took from its transaction's start to its commit's end (its writes run, its
/// pages written and flushed); fine buckets, since a flush alone takes about a millisecond.
pub static GROUP_COMMIT_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    let buckets = vec![0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0];
    Histogram::with_opts(
        HistogramOpts::new(
            "lanes_embedded_group_commit_seconds",
            "Seconds each embedded group commit took, its writes run and flushed",
        )
        .buckets(buckets),
    )
    .unwrap_or_else(|e| panic!("lanes_embedded_group_commit_seconds: {e}"))
});

/// Counts one group commit of `writes` writes that took `seconds`.
pub fn observe(writes: usize, seconds: f64) {
    GROUP_COMMITS.inc();
    GROUP_COMMIT_WRITES.inc_by(writes as u64);
    GROUP_COMMIT_SECONDS.observe(seconds);
}
