//! Glue between Lambda events and the core, shared by `functions/*`: logging setup, SQS record
//! decoding, and the partial-batch response built from worker outcomes.

use crate::backend::{Adapters, AwsBackendConfig};
use crate::clock::{Clock, SharedClock, SystemClock};
use crate::commits::api::{self, SummariesApi};
use crate::commits::webhook::Webhook;
use crate::commits::worker::CommitsWorker;
use crate::config::{ConfigError, require_env};
use crate::config::{IngressConfig, WorkerConfig};
use crate::domain::Lane;
use crate::lease::{self, Outcome};
use crate::metrics::Metrics;
use crate::ports::{QueueConsume, ReceivedMessage};
use crate::tasks::ingress::{Ingress, router};
use crate::tasks::tenant::{Tenancy, Tenant};
use crate::tasks::worker::Worker;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsMessage};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::warn;

/// Logs as [`log_settings`] says (JSON with the function's log level in Lambda), with every span's
/// fields (`task_id`, `message_id`, `lane`) on each line, so one task's lines can be found together.
pub fn init_tracing() {
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
    let (filter, json) =
        log_settings(var("AWS_LAMBDA_LOG_LEVEL"), var("RUST_LOG"), var("AWS_LAMBDA_LOG_FORMAT"));
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // With a timestamp: Lambda's level filtering reads `timestamp` and `level` from JSON lines.
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

/// The log filter and whether lines are JSON, from Lambda's logging controls: the function's
/// `LoggingConfig.ApplicationLogLevel` reaches the runtime as `AWS_LAMBDA_LOG_LEVEL` and wins (so
/// an operator changes the level on the function, without a variable), then `RUST_LOG` (a full
/// filter, for local runs), then `info`. `LoggingConfig.LogFormat` arrives as `AWS_LAMBDA_LOG_FORMAT`:
/// `Text` gives plain lines, anything else JSON (what Lambda's level filtering reads). DEBUG and
/// TRACE apply to this crate only (the SDK's own debug lines would print request bodies). Keep
/// `ApplicationLogLevel` at INFO or below: Lambda drops lines under it, and the EMF metric lines,
/// which carry no level, count as INFO.
pub fn log_settings(
    lambda_level: Option<String>,
    rust_log: Option<String>,
    lambda_format: Option<String>,
) -> (String, bool) {
    let level = lambda_level.map(|l| match l.to_ascii_uppercase().as_str() {
        "TRACE" => "info,lanes_core=trace".to_owned(),
        "DEBUG" => "info,lanes_core=debug".to_owned(),
        "WARN" => "warn".to_owned(),
        "ERROR" | "FATAL" => "error".to_owned(),
        _ => "info".to_owned(),
    });
    let filter = level.or(rust_log).unwrap_or_else(|| "info".to_owned());
    let json = !lambda_format.is_some_and(|f| f.eq_ignore_ascii_case("text"));
    (filter, json)
}

/// Which adapters a function runs on, from `LANES_BACKEND`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Embedded adapters in `LANES_DATA_DIR` (default `/tmp/lanes`): for `cargo lambda watch` runs.
    Embedded {
        /// Data dir.
        data_dir: std::path::PathBuf,
    },
    /// SQS, DynamoDB and Redis.
    Aws,
}

impl Backend {
    /// Reads `LANES_BACKEND` (`embedded` or `aws`, default `aws`) and `LANES_DATA_DIR`.
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var("LANES_BACKEND").unwrap_or_else(|_| "aws".into()).as_str() {
            "embedded" => Ok(Backend::Embedded {
                data_dir: std::env::var("LANES_DATA_DIR").unwrap_or_else(|_| "/tmp/lanes".into()).into(),
            }),
            "aws" => Ok(Backend::Aws),
            other => Err(ConfigError::Invalid {
                name: "LANES_BACKEND",
                reason: format!("`{other}`; expected `embedded` or `aws`"),
            }),
        }
    }
}

/// The error a function gives at cold start when it needs something this build does not have yet.
pub fn not_built_yet(function: &str, missing: &str) -> ConfigError {
    ConfigError::Invalid {
        name: "function",
        reason: format!("the {function} function needs {missing}, not built yet"),
    }
}

/// The webhook function's router, from the environment: the `commits` queue and the store of the
/// backend, and the secrets ([`crate::backend::webhook_config`]). Refuses to start with no secret configured,
/// since it could then accept nothing; a configured one that cannot be read is logged as an error and
/// answers `503` until it can.
pub async fn webhook_from_env() -> Result<axum::Router, ColdStartError> {
    let config = crate::backend::webhook_config();
    if config.github_secret.is_none() && config.gitlab_token.is_none() {
        return Err(ConfigError::Missing(
            "LANES_GITHUB_WEBHOOK_SECRET(_ID) or LANES_GITLAB_WEBHOOK_TOKEN(_ID)",
        )
        .into());
    }
    let adapters = adapters_from_env("webhook", &[]).await?;
    let metrics = Metrics::new();
    metrics.enable_emf();
    let router = crate::commits::webhook::router(Webhook {
        queue: adapters.send[Lane::Commits.index()].clone(),
        store: adapters.summaries,
        metrics: metrics.clone(),
        clock: Arc::new(SystemClock),
        config,
    });
    Ok(with_emf(router, metrics))
}

/// The controller function's state, built once per container.
pub struct ControllerFunction {
    /// The controller core.
    pub controller: crate::controller::Controller,
    /// The lanes' DLQs, the store and the summaries, for the sweep.
    pub sweep: Option<DlqSweep>,
}

/// A task lane, its DLQ, and its queue (to relay to).
type TaskDlq = (Lane, Arc<dyn QueueConsume>, Arc<dyn crate::ports::QueueSend>);

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
const SWEEP_MAX: usize = 1000;

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
                        .map_err(crate::backend::BackendError::Queue)?;
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
            let redis = crate::backend::redis_from_env()?;
            let conn =
                crate::adapters::redis::connect(&redis).await.map_err(crate::backend::BackendError::from)?;
            let cache = Arc::new(crate::adapters::redis::RedisCache::new(conn.clone(), &redis.prefix));
            controller =
                controller.with_running(crate::running::RunningWork::new(cache, Arc::new(SystemClock)));
            if let Some(s) = sweep.as_mut() {
                s.lock = Some(Arc::new(crate::adapters::redis::RedisLock::new(conn, &redis.prefix)));
            }
        }
        Ok(Self { controller, sweep })
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
        decisions
    }
}

/// The CloudWatch namespace of the EMF metrics: `LANES_METRICS_NAMESPACE` (default `Lanes`).
pub fn metrics_namespace() -> String {
    crate::config::optional_env("LANES_METRICS_NAMESPACE").unwrap_or_else(|| "Lanes".into())
}

/// Metrics that flush as EMF after each request (for the HTTP functions).
fn with_emf(router: axum::Router, metrics: Metrics) -> axum::Router {
    let namespace = metrics_namespace();
    router.layer(axum::middleware::map_response(move |resp: axum::response::Response| {
        metrics.flush_emf(&namespace);
        async move { resp }
    }))
}

/// Reads the worker's lane from `LANES_LANE`.
pub fn lane_from_env() -> Result<Lane, ConfigError> {
    require_env("LANES_LANE")?.parse().map_err(|reason| ConfigError::Invalid { name: "LANES_LANE", reason })
}

/// Errors at cold start.
#[derive(Debug, thiserror::Error)]
pub enum ColdStartError {
    /// Configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Adapters.
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
}

async fn adapters_from_env(function: &str, consume: &[Lane]) -> Result<Adapters, ColdStartError> {
    match Backend::from_env()? {
        Backend::Aws => Ok(crate::backend::aws(&AwsBackendConfig::for_functions()?, consume).await?),
        Backend::Embedded { data_dir } => {
            tracing::info!(function, data_dir = %data_dir.display(), "embedded backend");
            let clock: SharedClock = Arc::new(SystemClock);
            Ok(crate::backend::embedded(&data_dir, Default::default(), clock).await?.0)
        }
    }
}

/// The ingress function's router, from the environment (`LANES_BACKEND`, then the backend's variables).
pub async fn ingress_from_env() -> Result<axum::Router, ColdStartError> {
    let adapters = adapters_from_env("ingress", &[]).await?;
    let read =
        api::router(SummariesApi { summaries: adapters.summaries.clone(), cache: adapters.cache.clone() });
    let metrics = Metrics::new();
    metrics.enable_emf();
    let tenancy = tenancy_from_env();
    let config = IngressConfig { tenancy: tenancy.is_on(), ..IngressConfig::from_env()? };
    let tasks = router(Ingress {
        store: adapters.store,
        cache: adapters.cache,
        queues: adapters.send,
        metrics: metrics.clone(),
        clock: Arc::new(SystemClock),
        config,
    });
    let tasks = tasks.merge(crate::openapi::routes());
    Ok(with_emf(with_trace(with_tenancy(tasks, tenancy)).merge(read), metrics))
}

/// Scopes each request to its invocation's X-Ray trace header (Lambda's `Context.xray_trace_id`,
/// present when the function has `Tracing: Active`), so the tasks it enqueues carry it
/// ([`crate::trace`]).
pub fn with_trace(router: axum::Router) -> axum::Router {
    router.layer(axum::middleware::from_fn(
        |req: axum::extract::Request, next: axum::middleware::Next| async move {
            let header = req.extensions().get::<lambda_http::Context>().and_then(|c| c.xray_trace_id.clone());
            crate::trace::scope(header, next.run(req)).await
        },
    ))
}

/// Tenancy in Lambda: the authorizer's JWT claim `LANES_TENANT_CLAIM` (default `sub`) or the IAM
/// principal; `LANES_TENANCY=off` turns it off (for an API behind no authorizer, e.g. emulated).
pub fn tenancy_from_env() -> Tenancy {
    match crate::config::optional_env("LANES_TENANCY").as_deref() {
        Some("off") => Tenancy::Off,
        _ => Tenancy::Authorizer {
            claim: crate::config::optional_env("LANES_TENANT_CLAIM").unwrap_or_else(|| "sub".into()),
        },
    }
}

/// The task router with the tenant taken from API Gateway's authorizer, when tenancy is on.
pub fn with_tenancy(tasks: axum::Router, tenancy: Tenancy) -> axum::Router {
    match tenancy {
        Tenancy::Authorizer { claim } => {
            tasks.layer(axum::middleware::from_fn_with_state(Arc::<str>::from(claim), tenant_from_authorizer))
        }
        _ => tasks,
    }
}

/// The caller API Gateway (HTTP API, payload 2.0) authenticated: the JWT claim, else the IAM
/// principal's ARN. Nothing else can set the [`Tenant`]: one already in the request is dropped.
async fn tenant_from_authorizer(
    axum::extract::State(claim): axum::extract::State<Arc<str>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use lambda_http::request::RequestContext;
    let tenant = match req.extensions().get::<RequestContext>() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.authorizer.as_ref().and_then(|a| {
            let jwt = a.jwt.as_ref().and_then(|j| j.claims.get(&*claim)).and_then(|c| Tenant::parse(c));
            jwt.or_else(|| {
                a.iam.as_ref().and_then(|i| i.user_arn.as_deref()).and_then(Tenant::from_principal)
            })
        }),
        _ => None,
    };
    req.extensions_mut().remove::<Tenant>();
    if let Some(t) = tenant {
        req.extensions_mut().insert(t);
    }
    next.run(req).await
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
        let config = WorkerConfig::default().with_lease(Duration::from_millis(lease_ms)).lanes_from_env()?;
        config.validate()?;
        crate::llm::price::load_from_env()?;
        let adapters = adapters_from_env("worker", &[lane]).await?;
        let latency = Duration::from_millis(parse_env("LANES_OFFLINE_LATENCY_MS", 0)?);
        // A budget wait is bounded well inside the lease; longer ones go back to the queue.
        let offline = crate::llm::OfflineProvider::new(|_| latency)
            .answering_batches(crate::commits::prompt::offline_answer);
        let clock = Arc::new(SystemClock);
        let llm = crate::backend::llm_from_env(&adapters, clock, Arc::new(offline), Duration::from_secs(20))
            .await?;
        let metrics = Metrics::new();
        metrics.enable_emf();
        let commits = match lane {
            Lane::Commits => Some(adapters.commits_worker(
                llm.clone(),
                Arc::new(crate::backend::diff_sources(false)),
                metrics.clone(),
                Arc::new(SystemClock),
                config,
            )),
            _ => None,
        };
        let running = crate::running::RunningWork::new(adapters.cache.clone(), Arc::new(SystemClock));
        let worker = Worker {
            store: adapters.store,
            lock: adapters.lock,
            cache: adapters.cache,
            llm,
            metrics,
            clock: Arc::new(SystemClock),
            config,
        };
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

/// How long the oldest record of a batch waited in its queue (`now - SentTimestamp`): SQS has no
/// queue attribute for it (`ApproximateAgeOfOldestMessage` is a CloudWatch metric), so each worker
/// reports the age of what it receives: a lower bound of the queue's oldest, exact when the queue is
/// drained in order.
pub fn oldest_age_ms(records: &[SqsMessage], now_ms: u64) -> Option<u64> {
    records
        .iter()
        .filter_map(|r| r.attributes.get("SentTimestamp")?.parse::<u64>().ok())
        .map(|sent| now_ms.saturating_sub(sent))
        .max()
}

/// Time left before the invocation deadline. Lambda sends Unix ms; `cargo lambda watch` sends the
/// timeout itself (e.g. `600000`), so a value too small to be a date is taken as a duration.
pub fn remaining_time(deadline_ms: u64, now_ms: u64) -> Duration {
    const YEAR_2001_MS: u64 = 978_307_200_000;
    if deadline_ms < YEAR_2001_MS {
        Duration::from_millis(deadline_ms)
    } else {
        Duration::from_millis(deadline_ms.saturating_sub(now_ms))
    }
}

fn parse_env(name: &'static str, default: u64) -> Result<u64, ConfigError> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| ConfigError::Invalid { name, reason: format!("`{v}` is not a whole number") }),
    }
}

/// Processes a batch concurrently (at most `concurrency` at a time) within `budget`. Every message's
/// lease starts at receipt, all in one go, also for those waiting for a slot, and one heartbeat
/// renews them all; what is unfinished when the budget runs out is made visible again and reported
/// as a failure, so nothing waits for a dead invocation. What is acked is left for the event
/// source mapping to delete ([`lease::LeasedQueue::for_mapping`]).
pub async fn handle_batch(
    worker: &Worker,
    queue: &Arc<dyn QueueConsume>,
    lane: Lane,
    records: &[SqsMessage],
    budget: Duration,
    concurrency: usize,
) -> SqsBatchResponse {
    let deadline = tokio::time::Instant::now() + budget;
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut set = JoinSet::new();
    let mut outcomes: Vec<(String, Outcome)> = Vec::new();
    let mut messages = Vec::with_capacity(records.len());
    for record in records {
        match received_from_sqs(record) {
            Ok(m) => messages.push(m),
            Err(e) => outcomes.extend(unusable(record, &e, lane.as_str())),
        }
    }
    // The mapping received them with the queue's long visibility: one lease start for the batch
    // (ten a request), then one heartbeat for every delivery, waiting or running.
    let started = lease::start_many(&**queue, &mut messages, worker.config.lease_ttl).await;
    let batch =
        Arc::new(lease::LeasedQueue::for_mapping(queue.clone(), worker.heartbeat(queue.clone(), lane)));
    for (message, start) in messages.into_iter().zip(started) {
        if let Err(crate::ports::QueueError::ReceiptInvalid) = start {
            outcomes.push((message.message_id, Outcome::LeaseLost));
            continue;
        }
        let (worker, batch, slots) = (worker.clone(), batch.clone(), slots.clone());
        set.spawn(async move {
            let id = message.message_id.clone();
            let delivery = message.clone();
            let settling = batch.clone();
            let run = async move {
                // Renewed from now on, while it waits for a slot too; the worker's own entry (with its
                // lock and watch) takes this one's place when it runs.
                let lost = tokio_util::sync::CancellationToken::new();
                let _waiting =
                    batch.heartbeat().join(lease::Leased::new(message.receipt.clone(), lost.clone()));
                let _slot = slots.acquire_owned().await;
                if lost.is_cancelled() {
                    // The queue refused a renewal while it waited: another delivery has it now.
                    return Outcome::LeaseLost;
                }
                worker.process_in(batch, message).await
            };
            match tokio::time::timeout_at(deadline, run).await {
                Ok(outcome) => {
                    tracing::info!(message_id = %id, ?outcome, "message done");
                    (id, outcome)
                }
                Err(_) => {
                    // Stopped after it was settled (while releasing its lock, say): nothing to hand back.
                    if let Some(outcome) = settling.settled(&delivery.receipt) {
                        return (id, outcome);
                    }
                    // Not a failure: put off at once (a fresh copy on its last delivery), so the
                    // deadline never uses up the message's receives.
                    let outcome = lease::retry_later(
                        &*settling,
                        &delivery,
                        Duration::ZERO,
                        "invocation deadline",
                        lane.as_str(),
                    )
                    .await;
                    (id, outcome)
                }
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(pair) => outcomes.push(pair),
            Err(e) => warn!(error = %e, "message task panicked; its lease expires and it is redelivered"),
        }
    }
    // A panicked task left no outcome: report every record without one as a failure.
    for record in records {
        if let Some(id) = record.message_id.as_deref().filter(|s| !s.is_empty())
            && !outcomes.iter().any(|(i, _)| i == id)
        {
            outcomes.push((id.to_owned(), Outcome::LeaseLost));
        }
    }
    batch_response(outcomes.iter().map(|(id, o)| (id.as_str(), o)))
}

/// Processes a commits batch as one unit within `budget`: the worker hands back at the deadline
/// whatever it has not finished.
pub async fn handle_commit_batch(
    worker: &CommitsWorker,
    queue: &Arc<dyn QueueConsume>,
    records: &[SqsMessage],
    budget: Duration,
) -> SqsBatchResponse {
    let mut outcomes: Vec<(String, Outcome)> = Vec::new();
    let mut messages = Vec::with_capacity(records.len());
    for record in records {
        match received_from_sqs(record) {
            Ok(m) => messages.push(m),
            Err(e) => outcomes.extend(unusable(record, &e, Lane::Commits.as_str())),
        }
    }
    let deadline = tokio::time::Instant::now() + budget;
    // Acked deliveries are left for the mapping to delete: no DeleteMessage for a whole batch. One
    // heartbeat renews the batch's leases and keeps what was acked hidden until then.
    let batch = Arc::new(lease::LeasedQueue::for_mapping(queue.clone(), worker.heartbeat(queue.clone())));
    let (done, report) = worker.process_batch_in(batch.clone(), messages, deadline).await;
    tracing::info!(
        commits = report.commits,
        llm_calls = report.llm_calls,
        cache_hits = report.cache_hits,
        store_hits = report.store_hits,
        prompt_tokens = report.prompt_tokens,
        "commit batch done"
    );
    outcomes.extend(done);
    batch_response(outcomes.iter().map(|(id, o)| (id.as_str(), o)))
}

/// Why an SQS record could not become a [`ReceivedMessage`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// A field SQS always sets is absent.
    #[error("SQS record without {0}")]
    Missing(&'static str),
}

/// Converts one record of an `SqsEvent`.
pub fn received_from_sqs(record: &SqsMessage) -> Result<ReceivedMessage, RecordError> {
    let message_id =
        record.message_id.clone().filter(|s| !s.is_empty()).ok_or(RecordError::Missing("messageId"))?;
    let receipt = record.receipt_handle.clone().ok_or(RecordError::Missing("receiptHandle"))?;
    let receive_count =
        record.attributes.get("ApproximateReceiveCount").and_then(|v| v.parse().ok()).unwrap_or(1);
    let sent_at_ms = record.attributes.get("SentTimestamp").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut attributes: BTreeMap<String, String> = record
        .message_attributes
        .iter()
        .filter_map(|(k, v)| v.string_value.clone().map(|s| (k.clone(), s)))
        .collect();
    // The trace context arrives as a system attribute; the worker reads it with the others.
    if let Some(h) = record.attributes.get(crate::trace::TRACE_HEADER).filter(|h| crate::trace::is_valid(h)) {
        attributes.insert(crate::trace::TRACE_HEADER.to_owned(), h.clone());
    }
    Ok(ReceivedMessage {
        message_id,
        receipt,
        body: record.body.clone().unwrap_or_default(),
        receive_count,
        sent_at_ms,
        attributes,
        leased_for: None, // the mapping received it with the queue's long visibility
        leased_at: None,
    })
}

/// A record the batch handler cannot read (no receipt, say): logged, counted as a hand-back, and
/// reported as a batch item failure so the queue redelivers it (`None` without a message id to name).
fn unusable(record: &SqsMessage, e: &RecordError, lane: &str) -> Option<(String, Outcome)> {
    warn!(error = %e, lane, "unusable SQS record");
    let id = record.message_id.clone().filter(|s| !s.is_empty())?;
    crate::metrics::HANDED_BACK.with_label_values(&[lane, "unusable_record"]).inc();
    Some((id, Outcome::Retry { after: Duration::ZERO, reason: e.to_string() }))
}

/// The partial-batch response: one failure per message that stays in the queue. Never an empty id
/// (Lambda would fail the whole batch).
pub fn batch_response<'a>(outcomes: impl IntoIterator<Item = (&'a str, &'a Outcome)>) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for (id, outcome) in outcomes {
        if outcome.is_batch_item_failure() && !id.is_empty() {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id.to_owned();
            response.batch_item_failures.push(failure);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Lambda's invocation context (its X-Ray trace id) becomes the request's trace scope; an SQS
    /// record's `AWSTraceHeader` system attribute reaches the worker's attributes.
    #[tokio::test]
    async fn the_trace_header_goes_from_the_invocation_to_the_queue_and_back() {
        use tower::ServiceExt;
        let h = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let app = with_trace(
            axum::Router::new()
                .route("/", axum::routing::get(|| async { crate::trace::current().unwrap_or_default() })),
        );
        let mut ctx = lambda_http::Context::default();
        ctx.xray_trace_id = Some(h.to_owned());
        let mut req = axum::http::Request::get("/").body(axum::body::Body::empty()).unwrap();
        req.extensions_mut().insert(ctx);
        let resp = app.clone().oneshot(req).await.unwrap();
        let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
        assert_eq!(body, h.as_bytes());

        let mut record: SqsMessage = serde_json::from_str(include_str!("../../events/sqs-interactive.json"))
            .map(|e: aws_lambda_events::event::sqs::SqsEvent| e.records[0].clone())
            .unwrap();
        record.attributes.insert("AWSTraceHeader".into(), h.into());
        let m = received_from_sqs(&record).unwrap();
        assert_eq!(m.attributes[crate::trace::TRACE_HEADER], h);
    }

    #[test]
    fn lambda_logging_controls_win_over_rust_log() {
        let s = |v: &str| Some(v.to_owned());
        assert_eq!(
            log_settings(s("DEBUG"), s("warn"), s("JSON")),
            ("info,lanes_core=debug".to_owned(), true)
        );
        assert_eq!(log_settings(s("FATAL"), None, None), ("error".to_owned(), true));
        assert_eq!(
            log_settings(None, s("lanes_core=trace"), s("Text")),
            ("lanes_core=trace".to_owned(), false)
        );
        assert_eq!(log_settings(None, None, None), ("info".to_owned(), true));
    }

    #[test]
    fn deadline_is_absolute_in_lambda_and_relative_in_the_emulator() {
        let now = 1_796_000_000_000;
        assert_eq!(remaining_time(now + 30_000, now), Duration::from_secs(30));
        assert_eq!(remaining_time(now - 1, now), Duration::ZERO);
        assert_eq!(remaining_time(600_000, now), Duration::from_secs(600));
    }

    /// API Gateway HTTP API events (payload 2.0, the documented shape) through lambda_http's own
    /// conversion: the JWT claim, else the IAM principal, is the tenant; a header cannot forge one.
    #[tokio::test]
    async fn the_tenant_is_the_authorizers_caller() {
        use crate::embedded::{EmbeddedDb, EmbeddedQueues, EmbeddedStore, MemoryCache};
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let clock: SharedClock = Arc::new(SystemClock);
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let all = EmbeddedQueues::open(db.clone(), clock.clone(), Default::default()).await.unwrap();
        let tasks = router(Ingress {
            store: Arc::new(EmbeddedStore::new(db)),
            cache: Arc::new(MemoryCache::new(clock.clone())),
            queues: Lane::ALL
                .map(|l| Arc::new(all.queue(l.as_str(), "dlq")) as Arc<dyn crate::ports::QueueSend>),
            metrics: Metrics::new(),
            clock,
            config: IngressConfig { tenancy: true, ..Default::default() },
        });
        let app = with_tenancy(tasks, Tenancy::Authorizer { claim: "sub".into() });
        let event = |method: &str, path: &str, authorizer: serde_json::Value| {
            let mut e: serde_json::Value =
                serde_json::from_str(include_str!("../../events/api-post-task.json")).unwrap();
            e["routeKey"] = "ANY /v1/{proxy+}".into();
            e["rawPath"] = path.into();
            e["requestContext"]["http"]["method"] = method.into();
            e["requestContext"]["http"]["path"] = path.into();
            e["requestContext"]["authorizer"] = authorizer;
            e["headers"]["x-lanes-tenant"] = "forged".into();
            let req: lambda_http::request::LambdaRequest = serde_json::from_value(e).unwrap();
            let (parts, body) = lambda_http::Request::from(req).into_parts();
            axum::extract::Request::from_parts(parts, axum::body::Body::from(body.to_vec()))
        };
        let jwt = |sub: &str| serde_json::json!({"jwt": {"claims": {"sub": sub, "iss": "https://issuer"}, "scopes": null}});
        let iam = serde_json::json!({"iam": {"accessKey": "AKIA", "accountId": "123456789012", "callerId": "AIDA",
            "principalOrgId": null, "userArn": "arn:aws:iam::123456789012:user/ci", "userId": "AIDA"}});
        let call = |req| async { app.clone().oneshot(req).await.unwrap() };
        let body = |resp: axum::response::Response| async {
            let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        };
        let a = call(event("POST", "/v1/tasks", jwt("user-a"))).await;
        assert_eq!(a.status(), axum::http::StatusCode::ACCEPTED);
        let id = body(a).await["task_id"].as_str().unwrap().to_owned();
        let b = call(event("POST", "/v1/tasks", jwt("user-b"))).await;
        assert_ne!(body(b).await["task_id"].as_str().unwrap(), id);
        let path = format!("/v1/tasks/{id}");
        let mut get = event("GET", &path, jwt("user-a"));
        *get.body_mut() = axum::body::Body::empty();
        assert_eq!(call(get).await.status(), axum::http::StatusCode::ACCEPTED);
        assert_eq!(
            call(event("GET", &path, jwt("user-b"))).await.status(),
            axum::http::StatusCode::NOT_FOUND
        );
        assert_eq!(call(event("GET", &path, iam)).await.status(), axum::http::StatusCode::NOT_FOUND);
        assert_eq!(
            call(event("GET", &path, serde_json::Value::Null)).await.status(),
            axum::http::StatusCode::UNAUTHORIZED
        );
    }

    #[test]
    fn queue_age_comes_from_the_records_sent_timestamps() {
        let sample: aws_lambda_events::event::sqs::SqsEvent =
            serde_json::from_str(include_str!("../../events/sqs-interactive.json")).unwrap();
        let sent: u64 = sample.records[0].attributes["SentTimestamp"].parse().unwrap();
        assert_eq!(oldest_age_ms(&sample.records, sent + 42_000), Some(42_000));
        let mut late = sample.records[0].clone();
        late.attributes.insert("SentTimestamp".into(), (sent + 40_000).to_string());
        assert_eq!(
            oldest_age_ms(&[late, sample.records[0].clone()], sent + 42_000),
            Some(42_000),
            "the oldest"
        );
        assert_eq!(oldest_age_ms(&[SqsMessage::default()], sent), None);
    }

    #[test]
    fn records_and_batch_failures() {
        let mut record = SqsMessage::default();
        assert_eq!(received_from_sqs(&record), Err(RecordError::Missing("messageId")));
        record.message_id = Some("m1".into());
        record.receipt_handle = Some("r1".into());
        record.body = Some("{}".into());
        record.attributes.insert("ApproximateReceiveCount".into(), "3".into());
        let m = received_from_sqs(&record).unwrap();
        assert_eq!((m.message_id.as_str(), m.receive_count), ("m1", 3));

        let retry = Outcome::Retry { after: Duration::from_secs(1), reason: "x".into() };
        let outcomes =
            [("a", &Outcome::Acked), ("b", &retry), ("c", &Outcome::LeaseLost), ("", &Outcome::LeaseLost)];
        let resp = batch_response(outcomes);
        let sample: aws_lambda_events::event::sqs::SqsEvent =
            serde_json::from_str(include_str!("../../events/sqs-interactive.json")).unwrap();
        let m = received_from_sqs(&sample.records[0]).unwrap();
        assert_eq!((m.receive_count, m.attributes["lane"].as_str()), (1, "interactive"));
        assert!(serde_json::from_str::<crate::domain::TaskMessage>(&m.body).is_ok());
        let ids: Vec<&str> = resp.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use crate::domain::{TaskMessage, TaskRecord, TaskRequest, TaskStatus};
    use crate::llm::OfflineProvider;
    use crate::ports::QueueSend;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};

    async fn setup(
        latency: Duration,
    ) -> (tempfile::TempDir, Worker, Arc<dyn QueueConsume>, Vec<SqsMessage>, Adapters) {
        let dir = tempfile::tempdir().unwrap();
        let clock: SharedClock = Arc::new(SystemClock);
        let (adapters, queues) =
            crate::backend::embedded(dir.path(), Default::default(), clock.clone()).await.unwrap();
        for i in 0..3 {
            let req = TaskRequest::from_value(
                json!({"project_id":"p","kind":"explain","prompt":format!("{i}"),"target_files":[]}),
            )
            .unwrap();
            let rec = TaskRecord::pending(req.task_id(None), req, clock.now_ms(), 3600);
            adapters.store.put_pending(&rec, clock.now_ms()).await.unwrap();
            let msg = TaskMessage { task_id: rec.task_id.clone(), lane: rec.lane, kind: rec.request.kind };
            queues[0].send(&serde_json::to_string(&msg).unwrap(), Default::default()).await.unwrap();
        }
        let received = queues[0].receive(10).await.unwrap();
        let records = received
            .iter()
            .map(|m| {
                let mut s = SqsMessage::default();
                s.message_id = Some(m.message_id.clone());
                s.receipt_handle = Some(m.receipt.clone());
                s.body = Some(m.body.clone());
                s
            })
            .collect();
        let worker = Worker {
            store: adapters.store.clone(),
            lock: adapters.lock.clone(),
            cache: adapters.cache.clone(),
            llm: Arc::new(OfflineProvider::new(move |_| latency)),
            metrics: Metrics::new(),
            clock,
            config: WorkerConfig {
                lease_ttl: Duration::from_millis(300),
                renew_interval: Duration::from_millis(100),
                ..WorkerConfig::default()
            },
        };
        let queue = adapters.consume[0].clone();
        (dir, worker, queue, records, adapters)
    }

    #[tokio::test]
    async fn a_batch_completes_within_its_budget() {
        let (_dir, worker, queue, records, _) = setup(Duration::from_millis(20)).await;
        let resp =
            handle_batch(&worker, &queue, Lane::Interactive, &records, Duration::from_secs(5), 2).await;
        assert!(resp.batch_item_failures.is_empty());
        let depth = queue.depth().await.unwrap();
        assert_eq!((depth.visible, depth.in_flight), (0, 3), "settled, left for the mapping to delete");
        // What the event source mapping then does.
        for r in &records {
            queue.delete(r.receipt_handle.as_deref().unwrap()).await.unwrap();
        }
        assert_eq!(queue.depth().await.unwrap().in_flight, 0);
    }

    /// In an invocation, an acked delivery stays hidden until the invocation returns, and a handed-back
    /// one keeps its delay: the heartbeat stops renewing it even while its worker still holds its
    /// place.
    #[tokio::test]
    async fn an_acked_delivery_stays_hidden_and_a_hand_back_keeps_its_delay() {
        let (_dir, worker, queue, records, _) = setup(Duration::from_millis(0)).await;
        let mut messages: Vec<ReceivedMessage> =
            records.iter().map(|r| received_from_sqs(r).unwrap()).collect();
        lease::start_many(&*queue, &mut messages, worker.config.lease_ttl).await;
        let batch = lease::LeasedQueue::for_mapping(
            queue.clone(),
            worker.heartbeat(queue.clone(), Lane::Interactive),
        );
        let places: Vec<_> = messages
            .iter()
            .map(|m| {
                batch
                    .heartbeat()
                    .join(lease::Leased::new(m.receipt.clone(), tokio_util::sync::CancellationToken::new()))
            })
            .collect();
        let (acked, handed_back) = (&messages[0], &messages[1]);
        assert_eq!(lease::ack(&batch, acked).await, Outcome::Acked);
        assert_eq!(batch.settled(&acked.receipt), Some(Outcome::Acked));
        lease::hand_back(&batch, handed_back, Duration::from_secs(10), "test", "interactive").await;
        assert!(
            matches!(batch.settled(&handed_back.receipt), Some(Outcome::Retry { after, .. }) if after == Duration::from_secs(10)),
            "a deadline after the hand-back must not hand it back again"
        );
        // Twice the lease (300 ms) with every place still held: only the third is renewed as work.
        tokio::time::sleep(Duration::from_millis(600)).await;
        drop(places);
        // The third, no longer renewed, comes back within about a lease; the ack is still hidden
        // (kept), the hand-back too (its 10 s delay, not cut to a lease by a beat).
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        let back = loop {
            let back = queue.receive(10).await.unwrap();
            if !back.is_empty() || std::time::Instant::now() > deadline {
                break back;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            back.iter().map(|m| m.message_id.as_str()).collect::<Vec<_>>(),
            [messages[2].message_id.as_str()]
        );
        let depth = queue.depth().await.unwrap();
        assert_eq!((depth.visible, depth.in_flight), (0, 3), "the ack and the hand-back stay hidden");
    }

    /// Counts what a batch asks of its queue, by kind of request.
    #[derive(Default)]
    struct Asked {
        single: AtomicUsize,
        many: AtomicUsize,
        deletes: AtomicUsize,
    }

    struct Counting(Arc<dyn QueueConsume>, Arc<Asked>);

    #[async_trait::async_trait]
    impl QueueConsume for Counting {
        async fn receive_for(
            &self,
            max: usize,
            visibility: Option<Duration>,
        ) -> Result<Vec<ReceivedMessage>, crate::ports::QueueError> {
            self.0.receive_for(max, visibility).await
        }
        async fn change_visibility(
            &self,
            receipt: &str,
            t: Duration,
        ) -> Result<(), crate::ports::QueueError> {
            self.1.single.fetch_add(1, Ordering::Relaxed);
            self.0.change_visibility(receipt, t).await
        }
        async fn change_visibility_many(
            &self,
            receipts: &[String],
            t: Duration,
        ) -> Vec<Result<(), crate::ports::QueueError>> {
            self.1.many.fetch_add(1, Ordering::Relaxed);
            self.0.change_visibility_many(receipts, t).await
        }
        async fn delete(&self, receipt: &str) -> Result<(), crate::ports::QueueError> {
            self.1.deletes.fetch_add(1, Ordering::Relaxed);
            self.0.delete(receipt).await
        }
        async fn requeue(&self, m: &ReceivedMessage, d: Duration) -> Result<(), crate::ports::QueueError> {
            self.0.requeue(m, d).await
        }
        async fn dead_letter(&self, m: &ReceivedMessage, r: &str) -> Result<(), crate::ports::QueueError> {
            self.0.dead_letter(m, r).await
        }
        async fn depth(&self) -> Result<crate::ports::QueueDepth, crate::ports::QueueError> {
            self.0.depth().await
        }
        fn max_receive_count(&self) -> u32 {
            self.0.max_receive_count()
        }
    }

    /// Three deliveries run one after the other (one slot), each longer than a third of the lease,
    /// so the last waits longer than a whole lease: one lease start and one heartbeat serve them
    /// all (no per-delivery `ChangeMessageVisibility`, no `DeleteMessage`), and none comes back
    /// while it waits or after it is settled.
    #[tokio::test]
    async fn one_lease_start_and_one_heartbeat_serve_the_whole_batch() {
        let (_dir, worker, queue, records, adapters) = setup(Duration::from_millis(200)).await;
        let asked = Arc::new(Asked::default());
        let counting: Arc<dyn QueueConsume> = Arc::new(Counting(queue.clone(), asked.clone()));
        let started = std::time::Instant::now();
        let resp =
            handle_batch(&worker, &counting, Lane::Interactive, &records, Duration::from_secs(5), 1).await;
        let took = started.elapsed();
        assert!(resp.batch_item_failures.is_empty(), "{:?}", resp.batch_item_failures);
        assert!(took > worker.config.lease_ttl, "the batch outlasted a lease ({took:?})");
        let depth = queue.depth().await.unwrap();
        assert_eq!((depth.visible, depth.in_flight), (0, 3), "still hidden when the invocation returns");
        assert_eq!(asked.single.load(Ordering::Relaxed), 0, "no lease start or renewal one by one");
        assert_eq!(asked.deletes.load(Ordering::Relaxed), 0, "deletes left to the mapping");
        // The batch's lease start, then one renewal a beat (every 100 ms) for all of them together.
        let many = asked.many.load(Ordering::Relaxed);
        let beats = (took.as_millis() / 100) as usize;
        assert!((2..=beats + 2).contains(&many), "{many} batch calls in {took:?}");
        for r in &records {
            let msg: TaskMessage = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
            let rec = adapters.store.get(&msg.task_id, SystemClock.now_ms()).await.unwrap().unwrap();
            assert_eq!((rec.status, rec.fence), (TaskStatus::Completed, 1), "claimed once");
        }
    }

    #[tokio::test]
    async fn unfinished_messages_are_handed_back_before_the_deadline() {
        let (_dir, worker, queue, records, adapters) = setup(Duration::from_secs(5)).await;
        let started = std::time::Instant::now();
        let resp =
            handle_batch(&worker, &queue, Lane::Interactive, &records, Duration::from_millis(200), 1).await;
        assert!(started.elapsed() < Duration::from_secs(2), "returned before the deadline");
        assert_eq!(resp.batch_item_failures.len(), 3, "every unfinished message is a batch item failure");
        assert_eq!(queue.depth().await.unwrap().visible, 3, "and visible again at once");
        for r in &records {
            let msg: TaskMessage = serde_json::from_str(r.body.as_deref().unwrap()).unwrap();
            let rec = adapters.store.get(&msg.task_id, SystemClock.now_ms()).await.unwrap().unwrap();
            assert_ne!(rec.status, TaskStatus::Completed, "nothing written");
        }
    }
}
