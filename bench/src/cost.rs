//! `lanes bench cost`: a real repository's commits (this one's history) through the real commits
//! pipeline (`lanes summarize`'s, on embedded adapters) and the real route stack (retries, the
//! route's flex refusal handling, the OpenAI client) against the provider emulator, once per tier
//! policy: all at `sync`; `auto` with the commits lane's six-hour deadline (flex); the same with the
//! emulator refusing one flex call in ten for capacity; and `auto` with a deadline too short for a
//! flex call (sync at once); and tier `batch` through the emulator of OpenAI's Files and Batch APIs
//! (the commits handed to one provider batch and collected as the collector does), once completing
//! and once with the provider's window passing half-done (the rest summarized at flex). The batch
//! emulator runs at a scaled time: 200 ms to validate and 5 ms a request, where OpenAI's take
//! minutes to hours. Each run reports what the calls cost at the tier that served them, the
//! calls and the refusals, the time from enqueue to summary, the summaries written and any commit
//! the provider answered twice; the goal lines are computed from these figures.

use crate::goals::{Goal, Unit, write_goals};
use lanes_core::config::LanePolicy;
use lanes_core::domain::Lane;
use lanes_core::domain::tier::TierSetting;
use lanes_core::llm::route::{Fallback, RouteClient};
use lanes_core::llm::{OpenAiClient, RetryPolicy, Retrying};
use lanes_core::ports::LlmClient;
use lanes_tests::mock_batches::{BatchTiming, MockBatches};
use lanes_tests::mock_llm::{FlexCapacity, MockLlm};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// The model the runs name: a published list price and OpenAI's flex price (half of it).
const MODEL: &str = "gpt-4o-mini";

/// One tier policy's run.
#[derive(Debug, Clone, Serialize)]
pub struct CostRun {
    /// What ran: the policy and the emulator's flex capacity.
    pub mode: String,
    /// Commits asked for.
    pub commits: usize,
    /// Summaries written (by the model or by rule).
    pub summaries: usize,
    /// Commits that ended without a summary.
    pub failed: usize,
    /// USD the calls cost at the tier that served each.
    pub cost_usd: f64,
    /// Model calls the pipeline made (a refused flex call and its sync call are one).
    pub llm_calls: u64,
    /// Requests the provider received, refusals included.
    pub requests: usize,
    /// Flex calls asked for, and refused for capacity.
    pub flex_asked: u64,
    /// Flex calls the provider refused.
    pub flex_refused: u64,
    /// Summaries whose call was served at flex.
    pub served_at_flex: usize,
    /// Summaries answered by a provider batch.
    pub served_at_batch: usize,
    /// Enqueue to summary, ms.
    pub summary_p50_ms: f64,
    /// Enqueue to summary, ms.
    pub summary_p99_ms: f64,
    /// Summaries written after the run's deadline.
    pub deadlines_missed: usize,
    /// Commits the provider answered in more than one call (each extra answer counted).
    pub duplicates: u64,
}

/// What `lanes bench cost` reports.
#[derive(Debug, Clone, Serialize)]
pub struct CostReport {
    /// The command that reproduces it.
    pub command: String,
    /// The repository's name.
    pub repo: String,
    /// The model priced.
    pub model: String,
    /// The emulator's added latency of a flex call, ms.
    pub flex_latency_ms: u64,
    /// One run per policy.
    pub runs: Vec<CostRun>,
    /// The goal lines, from the runs.
    pub goals: Vec<Goal>,
}

/// How a run's provider batches behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batches {
    /// No batch endpoint.
    None,
    /// Every batch completes.
    Complete,
    /// The provider's window passes when half of the requests are answered.
    HalfExpire,
}

/// The runs: (name, lane setting, deadline, one flex call in N refused, batches).
fn modes() -> [(&'static str, TierSetting, Option<Duration>, u64, Batches); 6] {
    let six_hours = Some(Duration::from_secs(6 * 3600));
    [
        ("sync", TierSetting::Sync, six_hours, 0, Batches::None),
        ("auto, 6 h deadline (flex)", TierSetting::Auto, six_hours, 0, Batches::None),
        ("auto, 6 h deadline, 1 flex call in 10 refused", TierSetting::Auto, six_hours, 10, Batches::None),
        (
            "auto, 10 min deadline (too short for flex)",
            TierSetting::Auto,
            Some(Duration::from_secs(600)),
            0,
            Batches::None,
        ),
        ("batch, 6 h deadline", TierSetting::Batch, six_hours, 0, Batches::Complete),
        (
            "batch, 6 h deadline, window passes half-done",
            TierSetting::Batch,
            six_hours,
            0,
            Batches::HalfExpire,
        ),
    ]
}

/// The batch emulator's pace (a scaled time).
const VALIDATING: Duration = Duration::from_millis(200);
const PER_REQUEST: Duration = Duration::from_millis(5);

/// Runs `commits` of the repository at `repo` through each policy.
pub async fn cost_report(
    repo: &std::path::Path,
    commits: usize,
    flex_latency_ms: u64,
) -> Result<CostReport, String> {
    let list = lanes_core::summarize::list_commits(repo, &lanes_core::summarize::Range::Last(commits))
        .await
        .map_err(|e| e.to_string())?;
    let mut runs: Vec<CostRun> = Vec::new();
    for (mode, tier, deadline, refuse_every, batches) in modes() {
        let mock = MockLlm::start().await.map_err(|e| e.to_string())?;
        let latency = Duration::from_millis(flex_latency_ms);
        mock.flex_capacity(FlexCapacity { refuse_every, latency, ..Default::default() });
        let window_share = (batches == Batches::HalfExpire).then_some(0.5);
        let timing = BatchTiming {
            validating: VALIDATING,
            per_request: PER_REQUEST,
            window_share,
            ..Default::default()
        };
        let clock: lanes_core::clock::SharedClock = Arc::new(lanes_core::clock::SystemClock);
        let emulator = match batches {
            Batches::None => None,
            _ => Some(MockBatches::start(clock, timing).await.map_err(|e| e.to_string())?),
        };
        let policy = LanePolicy { tier, deadline, ..LanePolicy::default_for(Lane::Commits) };
        runs.push(one_run(mode, &list, (&mock, emulator.as_ref()), policy).await?);
    }
    Ok(CostReport {
        command: format!("lanes bench cost --commits {commits} --flex-latency-ms {flex_latency_ms}"),
        repo: list.first().map(|c| c.repo.clone()).unwrap_or_default(),
        model: MODEL.into(),
        flex_latency_ms,
        runs,
        goals: Vec::new(),
    }
    .judged())
}

/// The commits lane's route stack against `mock`: retries over the fallback over one OpenAI route
/// that offers flex (as OpenAI's own API does).
fn route_stack(mock: &MockLlm) -> Arc<dyn LlmClient> {
    let client =
        Arc::new(OpenAiClient::new(&format!("{}/v1", mock.url), MODEL, None, Duration::from_secs(30)));
    let route = RouteClient::new(format!("openai:{MODEL}"), client, None, true);
    let fallback = Arc::new(Fallback::new([vec![], vec![], vec![route]]));
    Arc::new(Retrying::new(fallback, RetryPolicy::default()))
}

async fn one_run(
    mode: &str,
    commits: &[lanes_core::domain::commit::CommitMessage],
    (mock, emulator): (&MockLlm, Option<&MockBatches>),
    policy: LanePolicy,
) -> Result<CostRun, String> {
    let dir = crate::temp_dir().map_err(|e| e.to_string())?;
    let clock: lanes_core::clock::SharedClock = Arc::new(lanes_core::clock::SystemClock);
    let (adapters, _) = lanes_core::wiring::embedded(&dir, Default::default(), clock.clone())
        .await
        .map_err(|e| e.to_string())?;
    let started = clock.now_ms();
    let batching = emulator.map(|e| {
        let chat = OpenAiClient::new(&e.url, MODEL, None, Duration::from_secs(30));
        let api = lanes_core::llm::OpenAiBatches::new(chat, format!("openai:{MODEL}"));
        lanes_core::commits::batches::Batching {
            api: Arc::new(api),
            store: adapters.batches.clone(),
            queue_tokens: None,
            scope: "bench".into(),
        }
    });
    let report = lanes_core::summarize::run_batching(
        commits.to_vec(),
        &adapters,
        (route_stack(mock), policy, batching),
        clock,
        |_, _| {},
    )
    .await
    .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    let written: Vec<&lanes_core::summarize::Row> =
        report.summaries.iter().filter(|r| r.source != "failed").collect();
    let mut waits: Vec<f64> =
        written.iter().map(|r| r.written_at_ms.saturating_sub(started) as f64).collect();
    let deadline_ms = policy.deadline.map_or(u64::MAX, |d| d.as_millis() as u64);
    let (flex_asked, flex_refused) = mock.flex_counts();
    Ok(CostRun {
        mode: mode.into(),
        commits: commits.len(),
        summaries: written.len(),
        failed: report.failed,
        cost_usd: report.cost_usd,
        llm_calls: report.llm_calls,
        requests: mock.seen().len() + emulator.map_or(0, |e| e.requests()),
        flex_asked,
        flex_refused,
        served_at_flex: written.iter().filter(|r| r.tier == lanes_core::domain::tier::Tier::Flex).count(),
        summary_p50_ms: crate::percentile(&mut waits, 50.0),
        summary_p99_ms: crate::percentile(&mut waits, 99.0),
        deadlines_missed: written
            .iter()
            .filter(|r| r.written_at_ms.saturating_sub(started) > deadline_ms)
            .count(),
        served_at_batch: written.iter().filter(|r| r.tier == lanes_core::domain::tier::Tier::Batch).count(),
        duplicates: answered_twice(mock, emulator),
    })
}

/// Extra answers of a commit, over the chat emulator and the batch emulator together.
fn answered_twice(mock: &MockLlm, emulator: Option<&MockBatches>) -> u64 {
    let mut answered = mock.answered_commits();
    for (sha, n) in emulator.map(|e| e.answered()).unwrap_or_default() {
        *answered.entry(sha).or_default() += n;
    }
    answered.values().map(|n| u64::from(n.saturating_sub(1))).sum()
}

impl CostReport {
    /// The goal lines, from the runs: flex and batch at most 55% of sync's cost, no deadline
    /// missed, no commit answered twice, and every run writing as many summaries as sync.
    fn judged(mut self) -> Self {
        let Some(sync) = self.runs.first() else { return self };
        let of_sync = |r: Option<&CostRun>| r.map_or(f64::NAN, |r| r.cost_usd / sync.cost_usd);
        let flex = of_sync(self.runs.get(1));
        let batch = of_sync(self.runs.iter().find(|r| r.mode.starts_with("batch")));
        let missed: usize = self.runs.iter().map(|r| r.deadlines_missed).sum();
        let dup: u64 = self.runs.iter().map(|r| r.duplicates).sum();
        let short = self.runs.iter().filter(|r| r.summaries != sync.summaries || r.failed > 0).count();
        self.goals = vec![
            Goal::new("flex_over_sync", "flex cost / sync cost", flex).at_most(0.55).shown(Unit::Times, 3),
            Goal::new("batch_over_sync", "batch cost / sync cost", batch).at_most(0.55).shown(Unit::Times, 3),
            Goal::new("deadlines_missed", "deadlines missed", missed as f64)
                .at_most(0.0)
                .shown(Unit::Count, 0),
            Goal::new("answered_twice", "commits the provider answered twice", dup as f64)
                .at_most(0.0)
                .shown(Unit::Count, 0),
            Goal::new(
                "runs_short",
                format!("runs that did not write sync's {} summaries, or failed one", sync.summaries),
                short as f64,
            )
            .at_most(0.0)
            .shown(Unit::Count, 0),
        ];
        self
    }
}

impl std::fmt::Display for CostReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Cost by tier ({}), {} of {}, flex calls {} ms slower, batches at a scaled time (200 ms to validate, 5 ms a request)",
            self.command, self.model, self.repo, self.flex_latency_ms
        )?;
        writeln!(
            f,
            "{:<48} {:>7} {:>9} {:>6} {:>8} {:>10} {:>8} {:>8} {:>8} {:>10} {:>10} {:>6} {:>4}",
            "mode",
            "commits",
            "summaries",
            "calls",
            "requests",
            "flex asked",
            "refused",
            "at flex",
            "at batch",
            "p50 ms",
            "p99 ms",
            "missed",
            "dup"
        )?;
        for r in &self.runs {
            writeln!(
                f,
                "{:<48} {:>7} {:>9} {:>6} {:>8} {:>10} {:>8} {:>8} {:>8} {:>10.0} {:>10.0} {:>6} {:>4}  ${:.6}",
                r.mode,
                r.commits,
                r.summaries,
                r.llm_calls,
                r.requests,
                r.flex_asked,
                r.flex_refused,
                r.served_at_flex,
                r.served_at_batch,
                r.summary_p50_ms,
                r.summary_p99_ms,
                r.deadlines_missed,
                r.duplicates,
                r.cost_usd
            )?;
        }
        if let Some(sync) = self.runs.first().filter(|s| s.cost_usd > 0.0) {
            for r in &self.runs[1..] {
                writeln!(f, "{}: cost {:.1}% of sync", r.mode, 100.0 * r.cost_usd / sync.cost_usd)?;
            }
        }
        write_goals(f, &self.goals)
    }
}
