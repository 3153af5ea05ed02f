//! `lanes summarize --repo PATH`: a local repository's commits through the real commits pipeline on
//! embedded defaults: one message per commit onto the embedded `commits` queue, drained by
//! the commits worker in batches of up to 100, summaries written to the redb store under the data dir.
//! A second run answers from the store and makes no LLM call.

use crate::clock::SharedClock;
use crate::commits::sources::DiffSources;
use crate::commits::worker::{BatchReport, Served};
use crate::config::{LanePolicy, WorkerConfig};
use crate::domain::commit::{CommitMessage, Provider, commit_key};
use crate::domain::{Lane, MessageId, RepoId, Sha};
use crate::lease::Outcome;
use crate::metrics::Metrics;
use crate::ports::LlmClient;
use crate::wiring::Adapters;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Errors of `lanes summarize`, each saying what to fix.
#[derive(Debug, thiserror::Error)]
pub enum SummarizeError {
    /// `git` failed or the path is not a repository.
    #[error("{0}")]
    Git(String),
    /// The queue or store failed.
    #[error("{0}")]
    Pipeline(String),
}

/// Which commits.
#[derive(Debug, Clone)]
pub enum Range {
    /// The newest N commits reachable from HEAD.
    Last(usize),
    /// Commits reachable from HEAD and not from REV.
    Since(String),
}

async fn git(repo: &Path, args: &[&str]) -> Result<String, SummarizeError> {
    let out = tokio::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .await
        .map_err(|e| SummarizeError::Git(format!("cannot run git: {e}")))?;
    if !out.status.success() {
        return Err(SummarizeError::Git(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The repository's identity: `local:` + the first 16 hex digits of its oldest root commit, so two
/// clones of one repository share summaries and two repositories never do.
pub async fn repo_id(repo: &Path) -> Result<RepoId, SummarizeError> {
    let roots = git(repo, &["rev-list", "--max-parents=0", "HEAD"]).await?;
    let mut roots: Vec<&str> = roots.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    roots.sort_unstable();
    let root = roots.first().ok_or_else(|| SummarizeError::Git("the repository has no commits".into()))?;
    let id = root.get(..16).unwrap_or(root);
    RepoId::of(Provider::Local, id).map_err(|e| SummarizeError::Git(format!("root commit `{root}`: {e}")))
}

/// The commits of `range`, newest first, as queue messages.
pub async fn list_commits(repo: &Path, range: &Range) -> Result<Vec<CommitMessage>, SummarizeError> {
    let top = git(repo, &["rev-parse", "--show-toplevel"]).await?;
    let top = PathBuf::from(top.trim());
    let repo_id = repo_id(&top).await?;
    let mut args = vec!["log".to_owned(), "--format=%H%x1f%ct%x1f%s".to_owned()];
    match range {
        Range::Last(n) => args.push(format!("--max-count={n}")),
        Range::Since(rev) => {
            if rev.starts_with('-') {
                return Err(SummarizeError::Git(format!("`{rev}` is not a revision")));
            }
            args.push(format!("{rev}..HEAD"));
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let log = git(&top, &args).await?;
    let repo = top.display().to_string();
    Ok(log
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, '\u{1f}');
            let (sha, at, subject) = (parts.next()?, parts.next()?, parts.next().unwrap_or(""));
            Some(CommitMessage {
                provider: Provider::Local,
                repo_id: repo_id.clone(),
                repo: repo.clone(),
                sha: Sha::parse(sha).ok()?,
                subject: crate::domain::commit::subject_of(subject),
                committed_at_ms: at.parse::<u64>().unwrap_or(0) * 1000,
                escalated: Default::default(),
            })
        })
        .collect())
}

/// One row of the result.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Commit id.
    pub sha: Sha,
    /// First line of its message.
    pub subject: String,
    /// The summary (or why there is none).
    pub summary: String,
    /// Tokens this commit cost (its share of its call), 0 when answered from cache.
    pub tokens: u64,
    /// `llm`, `rule`, `cache`, or `failed`.
    pub source: &'static str,
    /// The tier the summary's call was served at (what its tokens cost).
    pub tier: crate::domain::tier::Tier,
    /// When the summary was written (Unix ms; 0 for a commit that failed).
    pub written_at_ms: u64,
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Repository path.
    pub repo: String,
    /// Its `repo_id`.
    pub repo_id: String,
    /// Commits asked for.
    pub commits: usize,
    /// Model calls made.
    pub llm_calls: u64,
    /// Commits answered from the cache or the store.
    pub cache_hits: u64,
    /// Commits summarized by rule (noise only), without the model.
    pub rule_summaries: u64,
    /// Prompt tokens reported by the model.
    pub prompt_tokens: u64,
    /// Completion tokens reported by the model.
    pub completion_tokens: u64,
    /// Prompt-token budget of one call.
    pub batch_tokens: usize,
    /// Commits that could not be summarized (moved to the DLQ).
    pub failed: usize,
    /// What the model calls cost in USD, from the price table (0 for the offline provider and for
    /// models without a price).
    pub cost_usd: f64,
    /// One row per commit, newest first.
    pub summaries: Vec<Row>,
}

/// Runs the pipeline over `commits` on `adapters` with the commits lane's `policy` (its tier and
/// deadline among it), calling `progress(done, total)` as commits finish. At tier `batch` its
/// batches go to the first commits route's batch endpoint ([`crate::wiring::batching`]).
pub async fn run(
    commits: Vec<CommitMessage>,
    adapters: &Adapters,
    (llm, policy): (Arc<dyn LlmClient>, LanePolicy),
    clock: SharedClock,
    progress: impl Fn(usize, usize),
) -> Result<Report, SummarizeError> {
    let batching = crate::wiring::batching(adapters.batches.clone(), llm.clone(), policy.tier)
        .map_err(|e| SummarizeError::Pipeline(e.to_string()))?;
    run_batching(commits, adapters, (llm, policy, batching), clock, progress).await
}

/// [`run`], with the batch endpoint given (none: calls asked at `batch` are made at flex).
pub async fn run_batching(
    commits: Vec<CommitMessage>,
    adapters: &Adapters,
    (llm, policy, batching): (Arc<dyn LlmClient>, LanePolicy, Option<crate::commits::batches::Batching>),
    clock: SharedClock,
    progress: impl Fn(usize, usize),
) -> Result<Report, SummarizeError> {
    let queue = adapters.consume[Lane::Commits.index()].clone();
    let mut lease = WorkerConfig::default();
    lease.lanes[Lane::Commits.index()] = policy;
    let worker = crate::commits::worker::CommitsWorker {
        batching,
        ..adapters.commits_worker(llm, Arc::new(DiffSources::local_only()), Metrics::new(), clock, lease)
    };
    let collector = worker.collector();
    let mut report = Report {
        commits: commits.len(),
        batch_tokens: worker.config.batch_tokens,
        repo: commits.first().map(|c| c.repo.clone()).unwrap_or_default(),
        repo_id: commits.first().map(|c| c.repo_id.to_string()).unwrap_or_default(),
        ..Report::default()
    };
    let messages: Vec<(String, BTreeMap<String, String>)> =
        commits.iter().filter_map(|c| Some((serde_json::to_string(c).ok()?, c.send_attributes()))).collect();
    let unsent = adapters.send[Lane::Commits.index()]
        .send_batch(&messages)
        .await
        .map_err(|e| SummarizeError::Pipeline(e.to_string()))?;
    if !unsent.is_empty() {
        return Err(SummarizeError::Pipeline(format!("{} commits could not be queued", unsent.len())));
    }
    let wanted: HashSet<String> = commits.iter().map(CommitMessage::key).collect();
    let mut rows: HashMap<String, Row> = HashMap::new();
    let total = wanted.len();
    progress(0, total);
    while rows.len() < total {
        let batch = crate::lease::receive_batch(&*queue, 100, lease.lease_ttl)
            .await
            .map_err(|e| SummarizeError::Pipeline(e.to_string()))?;
        if batch.is_empty() {
            // Handed-back commits (a throttled model) come back after their delay; batched ones
            // once their batch is collected.
            let collected = match &collector {
                Some(c) => c.tick().await,
                None => Default::default(),
            };
            report.llm_calls += collected.calls as u64;
            if collected.written > 0 {
                from_batches(adapters, &mut report, &mut rows, &wanted, &commits).await?;
                progress(rows.len(), total);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let bodies: HashMap<MessageId, String> =
            batch.iter().map(|m| (m.message_id.clone(), m.body.clone())).collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
        let (outcomes, r) = worker.process_batch(queue.clone(), batch, deadline).await;
        tally(&mut report, &mut rows, &wanted, r, &bodies, outcomes);
        progress(rows.len(), total);
    }
    report.summaries = commits.iter().filter_map(|c| rows.remove(&commit_key(&c.repo_id, &c.sha))).collect();
    Ok(report)
}

/// Adds a row for each wanted commit a provider batch summarized (written by the collector, so
/// read back from the store), with its tokens and cost.
async fn from_batches(
    adapters: &Adapters,
    report: &mut Report,
    rows: &mut HashMap<String, Row>,
    wanted: &HashSet<String>,
    commits: &[CommitMessage],
) -> Result<(), SummarizeError> {
    let keys: Vec<(RepoId, Sha)> = commits
        .iter()
        .filter(|c| wanted.contains(&c.key()) && !rows.contains_key(&c.key()))
        .map(|c| (c.repo_id.clone(), c.sha.clone()))
        .collect();
    let found =
        adapters.summaries.get_summaries(&keys).await.map_err(|e| SummarizeError::Pipeline(e.to_string()))?;
    for summary in found.into_iter().filter(|s| s.tier == crate::domain::tier::Tier::Batch) {
        report.prompt_tokens += summary.tokens.prompt;
        report.completion_tokens += summary.tokens.completion;
        report.cost_usd +=
            crate::llm::price::prices().cost(&summary.model, summary.tokens, summary.tier).unwrap_or(0.0);
        let row = Row {
            sha: summary.sha.clone(),
            subject: summary.subject.clone(),
            tokens: summary.tokens.prompt + summary.tokens.completion,
            source: "llm",
            tier: summary.tier,
            written_at_ms: summary.created_at_ms,
            summary: summary.summary.clone(),
        };
        rows.insert(summary.key(), row);
    }
    Ok(())
}

/// Adds one batch to the report: its calls, tokens and cost, and a row for each wanted commit it
/// summarized or dead-lettered first.
fn tally(
    report: &mut Report,
    rows: &mut HashMap<String, Row>,
    wanted: &HashSet<String>,
    r: BatchReport,
    bodies: &HashMap<MessageId, String>,
    outcomes: Vec<(MessageId, Outcome)>,
) {
    report.llm_calls += r.llm_calls;
    report.prompt_tokens += r.prompt_tokens;
    report.completion_tokens += r.completion_tokens;
    // Each summary carries its share of its call's tokens, so the shares add up to the calls.
    report.cost_usd += r
        .done
        .iter()
        .filter(|d| d.served == Served::Llm)
        .filter_map(|d| crate::llm::price::prices().cost(&d.summary.model, d.summary.tokens, d.summary.tier))
        .sum::<f64>();
    for done in r.done {
        let key = done.summary.key();
        if !wanted.contains(&key) || rows.contains_key(&key) {
            continue;
        }
        let (source, tokens) = match done.served {
            Served::Llm => ("llm", done.summary.tokens.prompt + done.summary.tokens.completion),
            Served::Rule => {
                report.rule_summaries += 1;
                ("rule", 0)
            }
            Served::Cache | Served::Store => {
                report.cache_hits += 1;
                ("cache", 0)
            }
        };
        let summary = done.summary;
        rows.insert(
            key,
            Row {
                sha: summary.sha,
                subject: summary.subject,
                summary: summary.summary,
                tokens,
                source,
                tier: summary.tier,
                written_at_ms: summary.created_at_ms,
            },
        );
    }
    for (id, outcome) in outcomes {
        if let Outcome::DeadLettered { reason } = outcome
            && let Some(c) = bodies.get(&id).and_then(|b| serde_json::from_str::<CommitMessage>(b).ok())
            && wanted.contains(&c.key())
            && !rows.contains_key(&c.key())
        {
            report.failed += 1;
            rows.insert(
                c.key(),
                Row {
                    sha: c.sha,
                    subject: c.subject,
                    summary: reason,
                    tokens: 0,
                    source: "failed",
                    tier: Default::default(),
                    written_at_ms: 0,
                },
            );
        }
    }
}

/// `lanes summarize`: lists the commits of `range` in `repo`, opens the embedded backend in
/// `data_dir`, and runs the pipeline with the local model ([`crate::local::local_llm`]).
pub async fn run_local(
    repo: &Path,
    range: &Range,
    (data_dir, policy): (&Path, LanePolicy),
    progress: impl Fn(usize, usize),
) -> Result<Report, SummarizeError> {
    let commits = list_commits(repo, range).await?;
    let clock: SharedClock = Arc::new(crate::clock::SystemClock);
    let (adapters, _) = crate::wiring::embedded(data_dir, Default::default(), clock.clone())
        .await
        .map_err(|e| SummarizeError::Pipeline(e.to_string()))?;
    let llm = crate::local::local_llm(&adapters, clock.clone(), [Duration::ZERO; 3])
        .await
        .map_err(|e| SummarizeError::Pipeline(e.to_string()))?;
    let mut report = run(commits, &adapters, (llm, policy), clock, progress).await?;
    if report.repo.is_empty() {
        report.repo = repo.display().to_string();
    }
    Ok(report)
}
