//! `lanes bench duplicates`: ten deliveries of one task and of one commit to three pollers, with a
//! model slower than the visibility: LLM calls with the renewed lease vs a static visibility.

use crate::goals::{Goal, Unit, write_goals};
use lanes_core::clock::SystemClock;
use lanes_core::domain::{Lane, RepoId};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One configuration's result in `lanes bench duplicates`.
#[derive(Debug, Clone, Serialize)]
pub struct DuplicatesRun {
    /// `task` or `commit`.
    pub flow: String,
    /// `lease + heartbeat` or `static visibility`.
    pub config: String,
    /// Deliveries of the one task or commit.
    pub deliveries: usize,
    /// Model calls made for it.
    pub llm_calls: u64,
    /// Final writes rejected by the fence or the write-once condition.
    pub rejected_writes: u64,
    /// Whether every delivery was settled before the time limit (six model latencies).
    pub finished: bool,
    /// Wall time until the queue was empty, seconds.
    pub seconds: f64,
}

/// The configuration with a lease renewed by a heartbeat.
const LEASED: &str = "lease + heartbeat";

/// What `lanes bench duplicates` reports.
#[derive(Debug, Clone, Serialize)]
pub struct DuplicatesReport {
    /// The command that reproduces it.
    pub command: String,
    /// The model's latency, ms (longer than the visibility window).
    pub llm_ms: u64,
    /// Visibility / lease, ms.
    pub visibility_ms: u64,
    /// Concurrent pollers.
    pub pollers: usize,
    /// Task and commit, each with a renewed lease and with a static visibility.
    pub runs: Vec<DuplicatesRun>,
    /// The goal lines: exactly one LLM call per flow with the renewed lease.
    pub goals: Vec<Goal>,
}

/// `deliveries` copies of one task and of one commit, three pollers, a model slower (`llm_ms`) than
/// the visibility window (`visibility_ms`): with the lease renewed by the heartbeat, and with a static
/// visibility (no renewal, a static configuration scaled down).
pub async fn duplicates_report(
    deliveries: usize,
    llm_ms: u64,
    visibility_ms: u64,
) -> Result<DuplicatesReport, String> {
    use lanes_core::domain::commit::{CommitMessage, Provider};
    use lanes_core::domain::{TaskMessage, TaskRecord, TaskRequest};
    use lanes_core::ports::{QueueConsume, QueueSend};
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let pollers = 3;
    let visibility = Duration::from_millis(visibility_ms);
    let mut runs = Vec::new();
    for flow in ["task", "commit"] {
        for config in [LEASED, "static visibility"] {
            let dir = crate::temp_dir().map_err(|e| err(&e))?;
            let clock: lanes_core::clock::SharedClock = Arc::new(SystemClock);
            let settings = lanes_core::embedded::QueueSettings {
                default_visibility: visibility,
                max_receive_count: 1_000,
                ..Default::default()
            };
            let (adapters, queues) =
                lanes_core::wiring::embedded(&dir, settings, clock.clone()).await.map_err(|e| err(&e))?;
            let llm = Arc::new(
                lanes_core::llm::OfflineProvider::new(|_| Duration::from_millis(llm_ms))
                    .answering_batches(lanes_core::commits::prompt::offline_answer),
            );
            let lease = match config {
                LEASED => lanes_core::config::WorkerConfig::default().with_lease(visibility),
                // A fixed timeout: nothing renews it while the model runs.
                _ => lanes_core::config::WorkerConfig {
                    lease_ttl: visibility,
                    renew_interval: Duration::from_secs(3_600),
                    ..lanes_core::config::WorkerConfig::default()
                },
            };
            let metrics = lanes_core::metrics::Metrics::new();
            let lane = if flow == "task" { Lane::Interactive } else { Lane::Commits };
            let queue = queues[lane.index()].clone();
            if flow == "task" {
                let req =
                    TaskRequest::from_value(serde_json::json!({"project_id": "bench", "kind": "explain",
                    "prompt": "explain the duplicate", "target_files": []}))
                    .map_err(|e| format!("{e:?}"))?;
                let rec = TaskRecord::pending(req.task_id(None), req, clock.now_ms(), 3_600);
                adapters.store.put_pending(&rec, clock.now_ms()).await.map_err(|e| err(&e))?;
                let msg = TaskMessage { task_id: rec.task_id.clone(), lane, kind: rec.request.kind };
                let body = serde_json::to_string(&msg).map_err(|e| err(&e))?;
                for _ in 0..deliveries {
                    queue.send(&body, Default::default()).await.map_err(|e| err(&e))?;
                }
            } else {
                let c = CommitMessage {
                    provider: Provider::Github,
                    repo_id: RepoId::of(Provider::Github, "1").map_err(|e| err(&e))?,
                    repo: "bench/repo".into(),
                    sha: format!("{:040x}", 1).parse().map_err(|e: lanes_core::domain::IdError| err(&e))?,
                    subject: "One commit".into(),
                    committed_at_ms: 1,
                    escalated: Default::default(),
                };
                let body = serde_json::to_string(&c).map_err(|e| err(&e))?;
                for _ in 0..deliveries {
                    queue.send(&body, Default::default()).await.map_err(|e| err(&e))?;
                }
            }
            let worker = adapters.task_worker(llm.clone(), metrics.clone(), clock.clone(), lease);
            let commits = adapters.commits_worker(
                llm.clone(),
                Arc::new(crate::batching::SyntheticDiffs),
                metrics.clone(),
                clock.clone(),
                lease,
            );
            let started = Instant::now();
            // Long enough for a renewed lease to finish many times over.
            let stop = started + Duration::from_millis(llm_ms * 6).max(Duration::from_secs(3));
            let mut handles = Vec::new();
            for _ in 0..pollers {
                let (queue, worker, commits) = (queue.clone(), worker.clone(), commits.clone());
                handles.push(tokio::spawn(async move {
                    let q: Arc<dyn QueueConsume> = Arc::new(queue.clone());
                    while Instant::now() < stop {
                        let d = queue.depth().await.unwrap_or_default();
                        if d.visible + d.in_flight == 0 {
                            return;
                        }
                        // One delivery per receive, as separate invocations would get them.
                        let got = queue.receive_for(1, Some(visibility)).await.unwrap_or_default();
                        if got.is_empty() {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                        if flow == "task" {
                            for m in got {
                                worker.process(q.clone(), m).await;
                            }
                        } else {
                            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                            commits.process_batch(q.clone(), got, deadline).await;
                        }
                    }
                }));
            }
            for h in handles {
                h.await.map_err(|e| err(&e))?;
            }
            let lane_name = lane.as_str();
            let left = queue.depth().await.map_err(|e| err(&e))?;
            runs.push(DuplicatesRun {
                finished: left.visible + left.in_flight == 0,
                flow: flow.into(),
                config: config.into(),
                deliveries,
                llm_calls: llm.calls(),
                rejected_writes: metrics.stale_writes_rejected_total.with_label_values(&[lane_name]).get(),
                seconds: started.elapsed().as_secs_f64(),
            });
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(DuplicatesReport {
        command: format!(
            "lanes bench duplicates --deliveries {deliveries} --llm-ms {llm_ms} --visibility-ms {visibility_ms}"
        ),
        llm_ms,
        visibility_ms,
        pollers,
        goals: runs
            .iter()
            .filter(|r| r.config == LEASED)
            .map(|r| {
                let what = format!("LLM calls, {} with the renewed lease", r.flow);
                Goal::new(format!("calls_leased_{}", r.flow), what, r.llm_calls as f64)
                    .at_least(1.0)
                    .at_most(1.0)
                    .shown(Unit::Count, 0)
            })
            .collect(),
        runs,
    })
}

// ---------------------------------------------------------------- head-of-line blocking

impl std::fmt::Display for DuplicatesReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Duplicate deliveries, model {} ms, visibility {} ms, {} pollers ({})",
            self.llm_ms, self.visibility_ms, self.pollers, self.command
        )?;
        writeln!(
            f,
            "{:<8} {:<20} {:>10} {:>9} {:>16} {:>8} {:>9}",
            "flow", "config", "deliveries", "LLM calls", "rejected writes", "seconds", "finished"
        )?;
        for run in &self.runs {
            writeln!(
                f,
                "{:<8} {:<20} {:>10} {:>9} {:>16} {:>8.1} {:>9}",
                run.flow,
                run.config,
                run.deliveries,
                run.llm_calls,
                run.rejected_writes,
                run.seconds,
                run.finished
            )?;
        }
        write_goals(f, &self.goals)
    }
}
