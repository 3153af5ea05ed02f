//! The benchmarks' own checks (their figures are reported by `lanes bench`, not asserted as timings):
//! micro-batching makes far fewer LLM calls than one call per commit, spends fewer prompt tokens, and
//! draws no 429 from a rate-limited provider behind the limiter; the cost bench's tiers; the
//! throughput and soak benches read the counters their reports are made of; and the token shares'
//! cost is read from Redis's own counters.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

#[tokio::test]
async fn micro_batching_spends_fewer_calls_and_tokens_and_no_429() {
    let r = lanes_bench::batching::batching_report(120, 40.0, 150_000.0).await.unwrap();
    let (batched, single) = (&r.runs[0], &r.runs[1]);
    assert_eq!(batched.mode, "micro-batched");
    assert_eq!((batched.throttled, single.throttled), (0, 0), "{r:?}");
    assert!(batched.llm_calls * 5 <= single.llm_calls, "{r:?}");
    assert!(batched.prompt_tokens < single.prompt_tokens, "{r:?}");
    assert_eq!(batched.rule_summaries, single.rule_summaries, "noise-only commits never reach the model");
    assert_eq!(single.llm_calls as usize + single.rule_summaries as usize, 120, "{r:?}");
}

/// The commits the cost test summarizes.
const COST_COMMITS: usize = 120;

/// Fixed commits at each tier policy: flex serves every call at half the price, a
/// refused flex call is made again at sync with no commit lost or asked twice, a deadline too
/// short for flex calls at sync, a batch answers every commit at half the price, and a batch whose
/// window passes half-done has the rest answered at flex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_bench_serves_flex_and_batch_at_half_price_and_loses_nothing() {
    // A repository of fixed commits, so the calls they come to do not change with this repository's
    // history; enough of them for over ten flex calls, so the run that refuses one in ten refuses some.
    let dir = tempfile::tempdir().unwrap();
    let repo = lanes_tests::repository_of_modules(dir.path(), COST_COMMITS, 200);
    let r = lanes_bench::cost::cost_report(&repo, COST_COMMITS, 10).await.unwrap();
    let [sync, flex, refused, short, batch, expired] = &r.runs[..] else { panic!("six runs: {r:?}") };
    assert!(sync.llm_calls > 10, "{sync:?}");
    for run in &r.runs {
        assert_eq!((run.summaries, run.failed, run.duplicates), (sync.summaries, 0, 0), "{run:?}");
    }
    assert!(sync.cost_usd > 0.0 && sync.flex_asked == 0, "{sync:?}");
    assert!(
        flex.flex_asked == flex.llm_calls && flex.served_at_flex > 0,
        "every call asks for flex: {flex:?}"
    );
    assert!((flex.cost_usd * 2.0 - sync.cost_usd).abs() < 1e-9, "{flex:?} against {sync:?}");
    assert!(
        refused.flex_refused >= 1 && refused.requests as u64 == refused.llm_calls + refused.flex_refused,
        "{refused:?}"
    );
    assert!(refused.cost_usd > flex.cost_usd && refused.cost_usd < sync.cost_usd, "{refused:?}");
    assert_eq!((short.flex_asked, short.cost_usd), (0, sync.cost_usd), "{short:?}");
    assert!(batch.served_at_batch > 0 && batch.flex_asked == 0, "{batch:?}");
    assert!((batch.cost_usd * 2.0 - sync.cost_usd).abs() < 1e-9, "{batch:?} against {sync:?}");
    assert!(
        expired.served_at_batch > 0 && expired.served_at_flex > 0,
        "half by batch, half at flex: {expired:?}"
    );
    // The commits left when the window passes are packed into flex calls afresh, so the calls'
    // fixed instructions come to a little more or less than sync's: half the price within 1%.
    assert!((expired.cost_usd / sync.cost_usd - 0.5).abs() < 0.005, "{expired:?} against {sync:?}");
}

#[tokio::test]
async fn a_renewed_lease_makes_one_llm_call_for_ten_deliveries() {
    let r = lanes_bench::duplicates::duplicates_report(10, 900, 300).await.unwrap();
    for run in &r.runs {
        if run.config == "lease + heartbeat" {
            assert_eq!((run.llm_calls, run.finished), (1, true), "{run:?}");
        } else {
            assert!(run.llm_calls > 1, "a static visibility shorter than the model pays again: {run:?}");
        }
    }
}

/// `lanes bench functions` drives the real binaries under the Lambda emulator end to end: every task
/// it posts completes through the batches the mappings build, each function is invoked as its
/// template says (ingress per task, the synthesis worker one message per batch), and the memory of
/// each one is read.
#[tokio::test]
async fn the_functions_bench_completes_every_task_through_the_real_binaries() {
    let r = lanes_bench::functions::functions_report(100, 4).await.unwrap();
    assert_eq!(r.unfinished, 0, "{r:?}");
    let calls: Vec<u64> = r.functions.iter().map(|f| f.invocations).collect();
    assert_eq!((calls[0], calls[2]), (100, 10), "{r:?}");
    assert!(
        (10..=90).contains(&calls[1]),
        "90 interactive tasks in batches of at most 10, each tenth apart: {r:?}"
    );
    assert!(r.functions.iter().all(|f| f.rss_mib.iter().all(|&m| m > 1.0)), "{r:?}");
}

/// The throughput bench on the embedded backend: every task is counted as completed, and the
/// server's CPU, its writes to disk and the bench's own CPU are read (a counter it cannot read
/// comes out as 0). The open-loop runs offer their shares of the closed-loop rate on a schedule:
/// they are never answered faster than it sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_throughput_bench_counts_the_servers_cost_and_its_own() {
    let r = lanes_bench::throughput::throughput_report(1000, None, 8, 16, Some("embedded")).await.unwrap();
    let [run] = &r.runs[..] else { panic!("one run: {r:?}") };
    assert_eq!((run.backend.as_str(), run.latency_samples), ("embedded", 1000), "{run:?}");
    assert!(run.server_cpu_ms_per_task > 0.0 && run.client_cpu_ms_per_task > 0.0, "{run:?}");
    assert!(run.disk_kib_per_task > 0.0, "{run:?}");
    // Every task's admission, claim and final write went through a group commit.
    let g = run.group_commits.as_ref().unwrap();
    assert!(g.per_task > 0.0 && g.per_task * g.writes_per_commit >= 3.0 && g.mean_ms > 0.0, "{g:?}");
    assert_eq!(r.open_loop.len(), lanes_bench::throughput::OPEN_LOOP_SHARES.len(), "{r:?}");
    for (open, share) in r.open_loop.iter().zip(lanes_bench::throughput::OPEN_LOOP_SHARES) {
        let offered = open.offered_per_s.unwrap();
        assert!((offered - share * run.tasks_per_s).abs() <= 1.0, "{open:?}");
        assert_eq!(open.latency_samples, 1000, "{open:?}");
        // The last POST leaves at (n - 1) / rate: the ingress rate is at most the schedule's.
        assert!(open.ingress_per_s <= offered * 1000.0 / 999.0, "{open:?}");
    }
}

/// A short soak (records kept 1 s, swept every second): every task finishes, the data file is
/// sampled at the warm-up's end and every tenth, and the pages in use at the end are counted and
/// fit in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soak_bench_samples_the_file_and_counts_its_pages_in_use() {
    let r = lanes_bench::soak::soak_report(2000, 4, 1, 1, 16).await.unwrap();
    assert_eq!((r.unfinished, r.tenths.len()), (0, 10), "{r:?}");
    assert!(r.warmup_file_mib > 0.0 && r.tenths.iter().all(|t| t.file_mib > 0.0), "{r:?}");
    assert!(r.in_use_bytes > 0 && r.in_use_bytes <= r.file_bytes, "{r:?}");
    assert!(r.live_bytes > 0 && r.live_bytes <= r.file_bytes, "{r:?}");
}

/// `lanes bench share` reads Redis's own time per call from `INFO commandstats` for every step and
/// row (a parse that found no script calls is an error, not a zero), and judges its three goals from
/// the rows.
#[tokio::test]
async fn the_share_bench_reads_redis_time_for_every_step() {
    let r = lanes_bench::share_cost::share_cost_report_with(&[(5, 5), (50, 50), (50, 5)], 40).await.unwrap();
    let rows: Vec<(usize, usize)> = r.rows.iter().map(|row| (row.tenants, row.waiting)).collect();
    assert_eq!(rows, [(5, 5), (50, 50), (50, 5)], "{r:?}");
    for row in &r.rows {
        let steps = [row.submit_us, row.decide_us, row.settle_us, row.sweep_us];
        assert!(steps.iter().all(|us| us.is_finite() && *us > 0.0), "{row:?}");
        assert_eq!(row.task_us, steps[..3].iter().sum::<f64>(), "{row:?}");
    }
    let keys: Vec<&str> = r.goals.iter().map(|g| g.key.as_str()).collect();
    assert_eq!(keys, ["submit_flat", "settle_flat", "task_us", "decide_quiet_flat"]);
    assert_eq!(r.goals[2].value, r.rows[1].task_us, "the task goal is the largest row all waiting");
    assert_eq!(r.goals[3].value, r.rows[2].decide_us / r.rows[0].decide_us, "the quiet row's decision");
}
