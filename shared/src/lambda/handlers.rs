//! The state the controller and worker functions build once per container, and their handlers:
//! the controller's tick (mapping concurrency, DLQ sweeps) and the worker's invocation (the
//! running-work register around [`super::batch`]).

use super::batch::*;
use super::startup::*;
use crate::clock::{Clock, SharedClock, SystemClock};
use crate::commits::worker::CommitsWorker;
use crate::config::WorkerConfig;
use crate::config::{ConfigError, require_env};
use crate::domain::Lane;
use crate::metrics::Metrics;
use crate::ports::QueueConsume;
use crate::tasks::worker::Worker;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsMessage};
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// The controller function's state, built once per container.
pub struct ControllerFunction {
    /// The controller core.
    pub controller: crate::controller::Controller,
    /// The lanes' DLQs, the store and the summaries, for the sweep.
    pub sweep: Option<DlqSweep>,
    /// The commits lane's provider batches' collector, when its tier is `batch`.
    pub collector: Option<crate::commits::collect::Collector>,
    /// The synthesis tasks' provider batches' collector, when the lane's route has a batch
    /// endpoint.
    pub tasks: Option<crate::tasks::collect::TaskCollector>,
}

/// A task lane, its DLQ, and its queue (to relay to).
pub(super) type TaskDlq = (Lane, Arc<dyn QueueConsume>, Arc<dyn crate::ports::QueueSend>);

/// What the controller needs to sweep the lanes' DLQs each tick.
pub struct DlqSweep {
    /// The task lanes' DLQs, each with its lane's queue (where a message older than the run it names
    /// is relayed, see [`crate::dlq::Sweep::run`]).
    dlqs: Vec<TaskDlq>,
    store: Arc<dyn crate::ports::TaskStore>,
    /// The commits lane's DLQ and the summaries: summarized commits are swept out.
    commits: Option<(Arc<dyn QueueConsume>, Arc<dyn crate::ports::SummaryStore>)>,
    /// The workers' lease lock (with Redis): a run its lock shows live is left to its worker.
    lock: Option<Arc<dyn crate::ports::LeaseLock>>,
    metrics: Metrics,
}

/// Messages a DLQ sweep looks at per lane and tick (the settled ones then stay hidden for
/// [`crate::dlq::SETTLED_HIDE`], so the next ticks look further).
pub(super) const SWEEP_MAX: usize = 1000;

impl ControllerFunction {
    /// Reads `LANES_QUEUE_URL_{INTERACTIVE,SYNTHESIS,COMMITS}`, `LANES_MAPPING_{INTERACTIVE,SYNTHESIS,COMMITS}`
    /// (event source mapping UUIDs) and `LANES_CONCURRENCY_BUDGET` (default 30).
    pub async fn from_env() -> Result<Self, ColdStartError> {
        crate::adapters::trust::AwsRoots::from_env(false)?;
        let budget = parse_env("LANES_CONCURRENCY_BUDGET", 30)? as usize;
        crate::controller::validate_budget(budget)?;
        let mut urls = Vec::with_capacity(3);
        let mut mappings = Vec::with_capacity(3);
        for (q, m) in [
            ("LANES_QUEUE_URL_INTERACTIVE", "LANES_MAPPING_INTERACTIVE"),
            ("LANES_QUEUE_URL_SYNTHESIS", "LANES_MAPPING_SYNTHESIS"),
            ("LANES_QUEUE_URL_COMMITS", "LANES_MAPPING_COMMITS"),
        ] {
            urls.push(require_env(q)?);
            mappings.push(require_env(m)?);
        }
        let aws = crate::adapters::AwsClients::load(&Default::default()).await;
        let queues: Vec<Arc<dyn QueueConsume>> =
            urls.iter().map(|u| Arc::new(aws.queue_sender(u)) as Arc<dyn QueueConsume>).collect();
        let queues: [Arc<dyn QueueConsume>; 3] =
            queues.try_into().map_err(|_| ConfigError::Missing("LANES_QUEUE_URL_*"))?;
        let mappings: [String; 3] =
            mappings.try_into().map_err(|_| ConfigError::Missing("LANES_MAPPING_*"))?;
        let control = Arc::new(aws.mappings());
        // The sweep needs the table; without LANES_TABLE the controller only sets concurrency.
        let sweep = match crate::config::optional_env("LANES_TABLE") {
            None => None,
            Some(table) => {
                let (mut dlqs, mut commits) = (Vec::new(), None);
                let redrive = crate::config::Redrive::from_env()?;
                for lane in Lane::ALL {
                    let q = aws
                        .consumer(&urls[lane.index()], lane, redrive.as_ref())
                        .await
                        .map_err(crate::wiring::WiringError::Queue)?;
                    let Some(dlq) = q.dead_letter_queue() else { continue };
                    let dlq = Arc::new(dlq) as Arc<dyn QueueConsume>;
                    if lane == Lane::Commits {
                        commits = Some((dlq, Arc::new(aws.summaries(&table)) as _));
                    } else {
                        dlqs.push((lane, dlq, Arc::new(aws.queue_sender(&urls[lane.index()])) as _));
                    }
                }
                let store = Arc::new(aws.task_store(&table));
                Some(DlqSweep { dlqs, store, commits, lock: None, metrics: Metrics::new() })
            }
        };
        let mut controller = crate::controller::Controller::new(queues, mappings, control, budget.max(6));
        // Running work as the workers register it, when the stack has Redis (in-flight otherwise);
        // and the workers' locks for the sweep.
        let mut sweep = sweep;
        if crate::config::optional_env("REDIS_URL").is_some() {
            let redis = crate::wiring::redis_from_env()?;
            let conn =
                crate::adapters::redis::connect(&redis).await.map_err(crate::wiring::WiringError::from)?;
            let cache = Arc::new(crate::adapters::redis::RedisCache::new(conn.clone(), &redis.prefix));
            controller =
                controller.with_running(crate::running::RunningWork::new(cache, Arc::new(SystemClock)));
            if let Some(s) = sweep.as_mut() {
                s.lock = Some(Arc::new(crate::adapters::redis::RedisLock::new(conn, &redis.prefix)));
            }
        }
        let (collector, tasks) = match crate::config::optional_env("LANES_TABLE") {
            Some(table) => {
                (collector(&aws, &table, &urls[Lane::Commits.index()]).await?, task_collector().await?)
            }
            None => (None, None),
        };
        Ok(Self { controller, sweep, collector, tasks })
    }

    /// One scheduled tick: the decisions, logged and emitted as metrics.
    pub async fn handle(&self) -> Vec<crate::controller::LaneDecision> {
        let decisions = self.controller.tick().await;
        let now = SystemClock.now_ms();
        for d in &decisions {
            // One EMF document per lane: what the controller saw and set.
            let doc = serde_json::json!({
                "_aws": {"Timestamp": now, "CloudWatchMetrics": [{"Namespace": metrics_namespace(),
                    "Dimensions": [["lane"]], "Metrics": [
                        {"Name": "queue_depth", "Unit": "Count"},
                        {"Name": "queue_in_flight", "Unit": "Count"},
                        {"Name": "max_concurrency", "Unit": "Count"},
                        {"Name": "running", "Unit": "Count"}]}]},
                "lane": d.lane, "queue_depth": d.backlog, "queue_in_flight": d.in_flight,
                "max_concurrency": d.target, "running": d.running.unwrap_or(d.in_flight),
            });
            println!("{doc}");
            match &d.error {
                None => {
                    tracing::info!(lane = d.lane, backlog = d.backlog, in_flight = d.in_flight, running = ?d.running, current = ?d.current, target = d.target, changed = d.changed, "lane concurrency")
                }
                Some(e) => warn!(lane = d.lane, error = %e, "lane skipped this tick"),
            }
        }
        if let Some(sweep) = &self.sweep {
            let clock: SharedClock = Arc::new(SystemClock);
            let ttl = WorkerConfig::default().record_ttl_secs;
            if let Some((dlq, summaries)) = &sweep.commits {
                let run = crate::commits::dead_letters::CommitsDlq { dlq: &**dlq, summaries: &**summaries };
                match run.sweep(SWEEP_MAX).await {
                    Ok(r) => {
                        tracing::info!(lane = "commits", seen = r.seen, settled = r.settled, "DLQ swept")
                    }
                    Err(e) => warn!(lane = "commits", error = %e, "DLQ sweep failed; the next tick retries"),
                }
            }
            for (lane, dlq, lane_queue) in &sweep.dlqs {
                let run = crate::dlq::Sweep {
                    lane: *lane,
                    dlq: &**dlq,
                    store: &*sweep.store,
                    lock: sweep.lock.as_deref(),
                    lane_queue: Some(&**lane_queue),
                    metrics: &sweep.metrics,
                    clock: &clock,
                    ttl_secs: ttl,
                };
                match run.run(SWEEP_MAX).await {
                    Ok(r) => {
                        tracing::info!(lane = %lane, seen = r.seen, marked_failed = r.marked_failed, "DLQ swept")
                    }
                    Err(e) => warn!(lane = %lane, error = %e, "DLQ sweep failed; the next tick retries"),
                }
            }
            sweep.metrics.flush_emf(&metrics_namespace());
        }
        if let Some(collector) = &self.collector {
            let collected = collector.tick().await;
            tracing::info!(?collected, "provider batches collected");
            collector.metrics.flush_emf(&metrics_namespace());
        }
        if let Some(tasks) = &self.tasks {
            let collected = tasks.tick().await;
            tracing::info!(?collected, "synthesis tasks' provider batches collected");
            tasks.worker.metrics.flush_emf(&metrics_namespace());
        }
        decisions
    }
}

/// The controller's collector of the commits lane's provider batches, whenever the lane's route
/// has a batch endpoint, whatever its tier now (batches made before a change of tier still end,
/// and their commits are owned by nobody else): the records in `table`, the commits sent back to
/// `commits_url`, and the routes' keys as the workers read them.
async fn collector(
    aws: &crate::adapters::AwsClients,
    table: &str,
    commits_url: &str,
) -> Result<Option<crate::commits::collect::Collector>, ColdStartError> {
    crate::llm::price::load_from_env()?;
    let clock: SharedClock = Arc::new(SystemClock);
    let offline = crate::llm::OfflineProvider::new(|_| Duration::ZERO)
        .answering_batches(crate::commits::prompt::offline_answer);
    let store = Arc::new(aws.batches(table));
    let batch = crate::domain::tier::TierSetting::Batch;
    let Some(batching) = crate::wiring::batching(store, Arc::new(offline), batch)? else {
        return Ok(None);
    };
    Ok(Some(crate::commits::collect::Collector {
        batching,
        summaries: Arc::new(aws.summaries(table)),
        // A cache of this container's own: the workers read the store on a miss.
        cache: Arc::new(crate::embedded::MemoryCache::new(clock.clone())),
        send: Arc::new(aws.queue_sender(commits_url)),
        clock,
        metrics: Metrics::new(),
        cache_ttl: crate::commits::CommitsConfig::default().cache_ttl,
    }))
}

/// The controller's collector of the synthesis tasks' provider batches, whenever the lane's route
/// has a batch endpoint: the task worker's store, cache (the day's holds are given back there) and
/// results bucket, the runs given back sent to the synthesis queue.
async fn task_collector() -> Result<Option<crate::tasks::collect::TaskCollector>, ColdStartError> {
    let offline = crate::llm::OfflineProvider::new(|_| Duration::ZERO)
        .answering_batches(crate::commits::prompt::offline_answer);
    let llm: Arc<dyn crate::ports::LlmClient> = Arc::new(offline);
    let adapters = adapters_from_env("controller", &[]).await?;
    let Some(batching) =
        crate::wiring::lane_batching(Lane::Synthesis, adapters.batches.clone(), llm.clone())?
    else {
        return Ok(None);
    };
    let mut config = WorkerConfig::default().lanes_from_env()?;
    config.quota = crate::quota::priced_by_routes(config.quota)?;
    let worker = crate::tasks::worker::Worker {
        batching: Some(batching.clone()),
        ..adapters.task_worker(llm, Metrics::new(), Arc::new(SystemClock), config)
    };
    let send = adapters.send[Lane::Synthesis.index()].clone();
    Ok(Some(crate::tasks::collect::TaskCollector { worker, batching, send }))
}

/// What the worker function builds once per container.
pub struct WorkerFunction {
    /// The worker core.
    pub worker: Worker,
    /// This lane's queue.
    pub queue: Arc<dyn QueueConsume>,
    /// Messages processed at once.
    pub concurrency: usize,
    /// The batch worker, when this is the commits lane.
    pub commits: Option<CommitsWorker>,
    /// The lane consumed.
    pub lane: Lane,
    /// Where each invocation registers while it runs (read by the controller).
    pub running: crate::running::RunningWork,
}

impl WorkerFunction {
    /// Reads `LANES_LANE`, `LANES_WORKER_CONCURRENCY` (default 10), `LANES_LEASE_TTL_MS` (default
    /// 15000; the heartbeat renews at a third), and the backend's variables.
    pub async fn from_env() -> Result<Self, ColdStartError> {
        let lane = lane_from_env()?;
        let concurrency = parse_env("LANES_WORKER_CONCURRENCY", 10)? as usize;
        let lease_ms = parse_env("LANES_LEASE_TTL_MS", 15_000)?;
        let mut config =
            WorkerConfig::default().with_lease(Duration::from_millis(lease_ms)).lanes_from_env()?;
        config.validate()?;
        config.quota = crate::quota::priced_by_routes(config.quota)?;
        let adapters = adapters_from_env("worker", &[lane]).await?;
        let latency = Duration::from_millis(parse_env("LANES_OFFLINE_LATENCY_MS", 0)?);
        // A budget wait is bounded well inside the lease; longer ones go back to the queue.
        let offline = crate::llm::OfflineProvider::new(|_| latency)
            .answering_batches(crate::commits::prompt::offline_answer);
        let clock = Arc::new(SystemClock);
        let llm =
            crate::wiring::llm_from_env(&adapters, clock, Arc::new(offline), Duration::from_secs(20)).await?;
        let metrics = Metrics::new();
        metrics.enable_emf();
        let commits = match lane {
            Lane::Commits => Some(crate::commits::worker::CommitsWorker {
                batching: crate::wiring::batching(
                    adapters.batches.clone(),
                    llm.clone(),
                    config.lane(Lane::Commits).tier,
                )?,
                ..adapters.commits_worker(
                    llm.clone(),
                    Arc::new(crate::wiring::diff_sources(false)?),
                    metrics.clone(),
                    Arc::new(SystemClock),
                    config,
                )
            }),
            _ => None,
        };
        let running = crate::running::RunningWork::new(adapters.cache.clone(), Arc::new(SystemClock));
        let mut worker = adapters.task_worker(llm.clone(), metrics, Arc::new(SystemClock), config);
        // Each run's events go to the cache's streams, where the ingress function's readers follow them.
        worker.events = Some(adapters.events.clone());
        if lane == Lane::Synthesis {
            // Its tasks that opt in with `params.deadline_s` go to the route's provider batches.
            worker.batching = crate::wiring::lane_batching(lane, adapters.batches.clone(), llm)?;
        }
        let queue = adapters.consume[lane.index()].clone();
        Ok(Self { worker, queue, concurrency: concurrency.max(1), commits, lane, running })
    }

    /// Handles one SQS batch before `deadline_ms` (Unix ms, from the invocation context).
    pub async fn handle(&self, records: &[SqsMessage], deadline_ms: u64) -> SqsBatchResponse {
        let now = SystemClock.now_ms();
        let remaining = remaining_time(deadline_ms, now);
        // Stop early enough to hand unfinished messages back before Lambda kills the invocation.
        let budget = remaining.saturating_sub((remaining / 10).min(Duration::from_secs(2)));
        tracing::info!(records = records.len(), budget_ms = budget.as_millis() as u64, "batch received");
        if let Some(age) = oldest_age_ms(records, now) {
            self.worker
                .metrics
                .queue_oldest_age_seconds
                .with_label_values(&[self.lane.as_str()])
                .set((age / 1000) as i64);
        }
        // Registering for the controller runs beside the work, never before it: with the cache slow
        // or down, the batch must not wait for it.
        let (running, lane) = (self.running.clone(), self.lane);
        let until = now.saturating_add(remaining.as_millis() as u64);
        let entering = tokio::spawn(async move { running.enter(lane, until).await });
        let response = match &self.commits {
            Some(commits) => {
                // The vocabulary loads beside this batch's reads, from the first batch on.
                crate::commits::budget::warm();
                handle_commit_batch(commits, &self.queue, records, budget).await
            }
            None => {
                handle_batch(&self.worker, &self.queue, self.lane, records, budget, self.concurrency).await
            }
        };
        // Leaving is bounded too: a missed leave only counts this invocation until its deadline.
        if let Ok(Ok(Some(entry))) = tokio::time::timeout(Duration::from_millis(200), entering).await {
            let _ = tokio::time::timeout(Duration::from_millis(200), self.running.leave(entry)).await;
        }
        self.worker.metrics.flush_emf(&metrics_namespace());
        response
    }
}
