//! Local mode (see docs/ARCHITECTURE.md, Local mode): the task flow in one process — the ingress routes plus `/metrics`, the
//! weighted pool and the offline provider — on embedded adapters (queues and store in
//! `<data dir>/lanes.redb`, in-process lock and cache) or, with `--backend aws`, on SQS, DynamoDB and
//! Redis (moto, LocalStack or a real account).

use crate::adapters::AwsSettings;
use crate::clock::{SharedClock, SystemClock};
use crate::commits::api::{self, SummariesApi};
use crate::commits::webhook::{self, Webhook, WebhookConfig};
use crate::config::{ConfigError, IngressConfig, WorkerConfig};
use crate::domain::Lane;
use crate::embedded::QueueSettings;
use crate::llm::OfflineProvider;
use crate::metrics::Metrics;
use crate::pool::{DEFAULT_SHARES, Pool};
use crate::ports::DiffSource;
use crate::ports::{LlmClient, QueueConsume};
use crate::tasks::ingress::{Ingress, router};
use crate::wiring::{Adapters, AwsBackendConfig, WiringError, create_aws_resources, redis_from_env};
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Errors starting local mode. All permanent: they name what to fix.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The adapters could not be built.
    #[error(transparent)]
    Wiring(#[from] WiringError),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The server stopped with an error.
    #[error("server error: {0}")]
    Serve(std::io::Error),
    /// Bad settings.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Which adapters `lanes dev` runs on.
#[derive(Debug, Clone, Default)]
pub enum DevBackend {
    /// A redb file in the data dir, in-process lock and cache.
    #[default]
    Embedded,
    /// SQS, DynamoDB and Redis. With `create`, the queues (`lanes-<lane>` and DLQs) and the table
    /// (`lanes-tasks`) are created and `REDIS_URL` is the only variable read; otherwise everything
    /// comes from the environment ([`AwsBackendConfig::from_env`]).
    Aws {
        /// Create the queues and the table first.
        create: bool,
        /// SDK settings (endpoint from `AWS_ENDPOINT_URL` when unset).
        aws: AwsSettings,
    },
}

/// The model of local runs: the routes of the environment ([`crate::wiring::llm_from_env`]), the
/// offline provider (with a simulated latency per lane) by default, each behind its limiter (always
/// for a real provider; for the offline one when `LANES_LLM_RPM`/`TPM` are set).
pub async fn local_llm(
    adapters: &Adapters,
    clock: SharedClock,
    offline_latency: [Duration; 3],
) -> Result<Arc<dyn LlmClient>, ConfigError> {
    let offline = OfflineProvider::new(|l| offline_latency[l.index()])
        .answering_batches(crate::commits::prompt::offline_answer);
    crate::wiring::llm_from_env(adapters, clock, Arc::new(offline), Duration::from_secs(30)).await
}

/// The Git side of local mode: webhook secrets and diff sources (GitHub, GitLab and local
/// repositories).
#[derive(Clone)]
pub struct GitConfig {
    /// Webhook secrets.
    pub webhook: WebhookConfig,
    /// Where diffs come from.
    pub diffs: Arc<dyn DiffSource>,
    /// With tenancy on, who reads which owner's summaries.
    pub readers: Option<Arc<crate::commits::readers::SummaryReaders>>,
}

/// Settings of `lanes dev`.
#[derive(Debug, Clone)]
pub struct DevOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// Where the redb file lives.
    pub data_dir: PathBuf,
    /// Which adapters.
    pub backend: DevBackend,
    /// Worker slots in the pool.
    pub capacity: usize,
    /// Reservations per lane (interactive, synthesis, commits).
    pub shares: [f64; 3],
    /// Simulated latency of the offline provider per lane.
    pub offline_latency: [Duration; 3],
    /// Lease settings.
    pub worker: WorkerConfig,
    /// Ingress settings.
    pub ingress: IngressConfig,
    /// Queue settings.
    pub queue: QueueSettings,
    /// How often the pool looks at idle queues.
    pub poll_interval: Duration,
    /// How often the task lanes' DLQs are swept (records behind dead-lettered messages marked
    /// `FAILED`).
    pub dlq_sweep_interval: Duration,
    /// How often the embedded stores delete expired items (see `expiry_sweep`).
    pub expiry_sweep_interval: Duration,
    /// How often the provider batches are collected ([`crate::commits::collect`]), when the
    /// commits lane's tier is `batch`.
    pub batch_collect_interval: Duration,
    /// Where the tenant comes from: off (one tenant), or a header a trusted proxy sets
    /// (`--tenant-header`).
    pub tenancy: crate::tasks::tenant::Tenancy,
}

impl Default for DevOptions {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
            data_dir: PathBuf::from(".lanes"),
            backend: DevBackend::Embedded,
            capacity: 10,
            shares: DEFAULT_SHARES,
            offline_latency: [
                Duration::from_millis(200),
                Duration::from_millis(2_000),
                Duration::from_millis(500),
            ],
            worker: WorkerConfig::default(),
            ingress: IngressConfig::default(),
            queue: QueueSettings::default(),
            poll_interval: Duration::from_millis(50),
            dlq_sweep_interval: Duration::from_secs(30),
            expiry_sweep_interval: Duration::from_secs(60),
            batch_collect_interval: Duration::from_secs(2),
            tenancy: Default::default(),
        }
    }
}

/// The wired local system.
pub struct Local {
    /// Ingress routes plus `/metrics`.
    pub router: Router,
    /// The worker pool.
    pub pool: Arc<Pool>,
    /// The model: the offline provider unless `LANES_LLM_PROVIDER` names another.
    pub llm: Arc<dyn LlmClient>,
    /// The adapters in use.
    pub adapters: Adapters,
    /// Metrics.
    pub metrics: Metrics,
    /// The DLQ sweep and redrive.
    pub dlq: crate::dlq_admin::Admin,
    /// The provider batches' collector, when the commits lane's tier is `batch`.
    pub collector: Option<crate::commits::collect::Collector>,
    /// The synthesis tasks' provider batches' collector, when the lane's route has a batch endpoint.
    pub task_collector: Option<crate::tasks::collect::TaskCollector>,
}

impl Local {
    /// Builds the adapters of `opts.backend` and wires every component.
    pub async fn build(opts: &DevOptions) -> Result<Self, LocalError> {
        opts.worker.validate()?;
        crate::llm::price::load_from_env()?;
        let clock: SharedClock = Arc::new(SystemClock);
        let adapters = match &opts.backend {
            DevBackend::Embedded => {
                crate::wiring::embedded(&opts.data_dir, opts.queue, clock.clone())
                    .await
                    .map_err(LocalError::Wiring)?
                    .0
            }
            DevBackend::Aws { create: true, aws } => {
                let table = "lanes-tasks";
                let queue_urls = create_aws_resources(aws, "lanes", table, opts.queue).await?;
                info!(?queue_urls, table, "created (or found) the queues and the table");
                let config = AwsBackendConfig {
                    aws: aws.clone(),
                    table: table.into(),
                    queue_urls,
                    redis: redis_from_env()?,
                    redrive: None,
                    results_bucket: Some(crate::wiring::RESULTS_BUCKET.into()),
                };
                crate::wiring::aws(&config, &Lane::ALL).await?
            }
            DevBackend::Aws { create: false, aws } => {
                let config = AwsBackendConfig { aws: aws.clone(), ..AwsBackendConfig::from_env()? };
                crate::wiring::aws(&config, &Lane::ALL).await?
            }
        };
        let llm = local_llm(&adapters, clock.clone(), opts.offline_latency).await?;
        // Checked here, where a bad setting can stop the start.
        crate::wiring::batching(adapters.batches.clone(), llm.clone(), opts.worker.lane(Lane::Commits).tier)?;
        let git = GitConfig {
            webhook: crate::wiring::webhook_config()?,
            diffs: Arc::new(crate::wiring::diff_sources(true)?),
            readers: crate::wiring::summary_readers(opts.tenancy.is_on())?,
        };
        Ok(Self::with_adapters(opts, adapters, llm, clock, git))
    }

    /// Wires ingress, the webhook, the read API, workers and the pool over given adapters.
    pub fn with_adapters(
        opts: &DevOptions,
        adapters: Adapters,
        llm: Arc<dyn LlmClient>,
        clock: SharedClock,
        git: GitConfig,
    ) -> Self {
        let metrics = Metrics::new();
        let (worker, task_collector) = task_worker(&adapters, &llm, &metrics, &clock, opts);
        let consumers: Vec<(Lane, Arc<dyn QueueConsume>)> =
            Lane::ALL.iter().map(|&l| (l, adapters.consume[l.index()].clone())).collect();
        let mut commits = adapters.commits_worker(
            llm.clone(),
            git.diffs.clone(),
            metrics.clone(),
            clock.clone(),
            opts.worker,
        );
        let tier = opts.worker.lane(Lane::Commits).tier;
        commits.batching = crate::wiring::batching(adapters.batches.clone(), llm.clone(), tier)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "no provider batches");
                None
            });
        let collector = commits.collector();
        let pool = Arc::new(
            Pool::new(opts.capacity, opts.shares, consumers, worker, opts.poll_interval)
                .with_commits(commits),
        );
        let hooks = webhook::router(Webhook {
            queue: adapters.send[Lane::Commits.index()].clone(),
            store: adapters.summaries.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            config: git.webhook,
        });
        let read = api::router(SummariesApi {
            summaries: adapters.summaries.clone(),
            cache: adapters.cache.clone(),
            readers: git.readers.clone(),
        });
        let dlq = crate::dlq_admin::Admin {
            adapters: adapters.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            pending_ttl_secs: opts.ingress.pending_ttl_secs,
            record_ttl_secs: opts.worker.record_ttl_secs,
        };
        let ingress = Ingress {
            store: adapters.store.clone(),
            cache: adapters.cache.clone(),
            queues: adapters.send.clone(),
            admission: adapters.admission.clone(),
            metrics: metrics.clone(),
            clock,
            config: IngressConfig { tenancy: opts.tenancy.is_on(), ..opts.ingress },
            objects: adapters.objects.clone(),
            events: Some(adapters.events.clone()),
        };
        let events = crate::tasks::events::router(ingress.clone(), crate::tasks::events::Delivery::Streamed);
        let tasks = crate::tasks::tenant::with_header(
            router(ingress).merge(events).merge(crate::openapi::routes()).merge(read),
            &opts.tenancy,
        );
        let m = metrics.clone();
        let router =
            tasks.merge(hooks).merge(crate::dlq_admin::admin_router(dlq.clone())).route(
                "/metrics",
                get(move || {
                    let m = m.clone();
                    async move {
                        ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], m.render()).into_response()
                    }
                }),
            );
        let router = crate::problem::framework_rejections(router);
        let router = if opts.addr.ip().is_loopback() { loopback_hosts_only(router) } else { router };
        Self { router, pool, llm, adapters, metrics, dlq, collector, task_collector }
    }

    /// Serves on `opts.addr` and runs the pool until `shutdown`.
    pub async fn serve(self, opts: &DevOptions, shutdown: CancellationToken) -> Result<(), LocalError> {
        let listener = tokio::net::TcpListener::bind(opts.addr)
            .await
            .map_err(|source| LocalError::Bind { addr: opts.addr, source })?;
        let addr = listener.local_addr().map_err(LocalError::Serve)?;
        info!(%addr, data_dir = %opts.data_dir.display(), capacity = opts.capacity, "lanes dev listening on http://{addr}");
        let pool = self.pool.clone();
        let pool_stop = shutdown.clone();
        let pool_task = tokio::spawn(async move { pool.run(pool_stop).await });
        let (dlq, every, sweep_stop) = (self.dlq.clone(), opts.dlq_sweep_interval, shutdown.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = sweep_stop.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                if let Err(e) = dlq.sweep_all(crate::dlq_admin::ADMIN_MAX).await {
                    tracing::warn!(error = %e, "DLQ sweep failed; next round retries");
                }
            }
        });
        if self.collector.is_some() || self.task_collector.is_some() {
            let (commits, tasks) = (self.collector.clone(), self.task_collector.clone());
            let (every, stop) = (opts.batch_collect_interval, shutdown.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(every) => {}
                    }
                    if let Some(c) = &commits {
                        c.tick().await;
                    }
                    if let Some(t) = &tasks {
                        t.tick().await;
                    }
                }
            });
        }
        let (store, summaries) = (self.adapters.store.clone(), self.adapters.summaries.clone());
        tokio::spawn(expiry_sweep(store, summaries, opts.expiry_sweep_interval, shutdown.clone()));
        let stop = shutdown.clone();
        let served = axum::serve(listener, self.router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .map_err(LocalError::Serve);
        shutdown.cancel();
        let _ = pool_task.await;
        served
    }
}

/// Records, delivery marks and push counts a sweep deletes at most, each, per round.
const EXPIRY_SWEEP_MAX: usize = 1000;

/// The embedded twin of DynamoDB's TTL sweep: every `every` (a minute by default), expired task records, delivery marks
/// and past days' push counts are deleted, in rounds of at most [`EXPIRY_SWEEP_MAX`] of each (one
/// write transaction a round), round after round until one finds fewer, so the sweep keeps up with
/// any rate of writes and the data file holds the live data rather than all there ever was. On the
/// AWS backend the ports answer 0: DynamoDB sweeps itself.
async fn expiry_sweep(
    store: Arc<dyn crate::ports::TaskStore>,
    summaries: Arc<dyn crate::ports::SummaryStore>,
    every: Duration,
    stop: CancellationToken,
) {
    use crate::clock::Clock;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let now = SystemClock.now_ms();
        let (mut records, mut marks) = (0, 0);
        while !stop.is_cancelled() {
            let round = (
                store.sweep_expired(now, EXPIRY_SWEEP_MAX).await,
                summaries.sweep_expired(now, EXPIRY_SWEEP_MAX).await,
            );
            let (Ok(r), Ok(m)) = round else {
                let (r, m) = round;
                tracing::warn!(records = ?r.err(), marks = ?m.err(), "expiry sweep failed; the next round retries");
                break;
            };
            (records, marks) = (records + r, marks + m);
            if r < EXPIRY_SWEEP_MAX && m < EXPIRY_SWEEP_MAX {
                break;
            }
        }
        if records + marks > 0 {
            info!(records, marks, "expired items swept");
        }
    }
}

/// A server on a loopback address answers only requests addressed to loopback (a `Host` of
/// `localhost`, `127.0.0.1` or `[::1]`, any port; none at all from a non-browser client): a web
/// page the developer visits cannot reach the task API, the DLQ admin routes or `/metrics` through
/// a name of its own that resolves to 127.0.0.1 (DNS rebinding). Others get `421`.
fn loopback_hosts_only(router: Router) -> Router {
    router.layer(axum::middleware::from_fn(
        |req: axum::extract::Request, next: axum::middleware::Next| async move {
            match req.headers().get(header::HOST).map(|h| h.to_str().map(is_loopback_host)) {
                None | Some(Ok(true)) => next.run(req).await,
                _ => crate::problem::Problem::new(
                    axum::http::StatusCode::MISDIRECTED_REQUEST,
                    "misdirected-request",
                    "Not addressed to this machine",
                    "lanes dev on a loopback address answers requests to localhost, 127.0.0.1 or [::1] only",
                )
                .with_field("Host")
                .into_response(),
            }
        },
    ))
}

/// Whether a `Host` value names this machine's loopback.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The task worker, with the synthesis lane's provider batches and their collector where its route
/// has a batch endpoint (for the tasks that opt in with `params.deadline_s`).
fn task_worker(
    adapters: &Adapters,
    llm: &Arc<dyn LlmClient>,
    metrics: &Metrics,
    clock: &SharedClock,
    opts: &DevOptions,
) -> (crate::tasks::worker::Worker, Option<crate::tasks::collect::TaskCollector>) {
    let mut worker = adapters.task_worker(llm.clone(), metrics.clone(), clock.clone(), opts.worker);
    worker.events = Some(adapters.events.clone());
    worker.batching = crate::wiring::lane_batching(Lane::Synthesis, adapters.batches.clone(), llm.clone())
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no provider batches for synthesis tasks");
            None
        });
    let collector = worker.batching.clone().map(|batching| crate::tasks::collect::TaskCollector {
        worker: worker.clone(),
        batching,
        send: adapters.send[Lane::Synthesis.index()].clone(),
    });
    (worker, collector)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_are_this_machine() {
        for yes in [
            "localhost",
            "LOCALHOST:3000",
            "127.0.0.1",
            "127.0.0.1:3000",
            "[::1]",
            "[::1]:8080",
            "127.1.2.3:1",
        ] {
            assert!(is_loopback_host(yes), "{yes}");
        }
        for no in
            ["evil.example", "evil.example:3000", "localhost.evil.example", "10.0.0.1:3000", "[::2]:1", ""]
        {
            assert!(!is_loopback_host(no), "{no}");
        }
    }
}
