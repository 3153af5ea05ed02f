//! Local mode (design §7): the task flow in one process on embedded adapters — the ingress routes plus
//! `/metrics`, the embedded queues and store in `<data dir>/lanes.redb`, in-process lock and cache, the
//! weighted pool, and the offline provider.

use crate::clock::{SharedClock, SystemClock};
use crate::config::{ConfigError, IngressConfig, WorkerConfig};
use crate::domain::Lane;
use crate::embedded::{
    EmbeddedDb, EmbeddedQueue, EmbeddedQueues, EmbeddedStore, MemoryCache, MemoryLock, QueueSettings,
};
use crate::ingress::{Ingress, router};
use crate::llm::OfflineProvider;
use crate::metrics::Metrics;
use crate::pool::{DEFAULT_SHARES, Pool};
use crate::ports::{QueueConsume, QueueSend};
use crate::worker::Worker;
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
    /// The embedded database could not be opened.
    #[error(transparent)]
    Db(#[from] crate::embedded::DbOpenError),
    /// The embedded queues could not be loaded.
    #[error("cannot load the embedded queues: {0}")]
    Queue(#[from] crate::ports::QueueError),
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

/// Settings of `lanes dev`.
#[derive(Debug, Clone)]
pub struct DevOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// Where the redb file lives.
    pub data_dir: PathBuf,
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
}

impl Default for DevOptions {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
            data_dir: PathBuf::from(".lanes"),
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
        }
    }
}

/// The wired local system.
pub struct Local {
    /// Ingress routes plus `/metrics`.
    pub router: Router,
    /// The worker pool.
    pub pool: Arc<Pool>,
    /// The offline provider (its call counter is what tests check).
    pub provider: Arc<OfflineProvider>,
    /// The durable store.
    pub store: EmbeddedStore,
    /// Queue per lane.
    pub queues: [EmbeddedQueue; 3],
    /// Metrics.
    pub metrics: Metrics,
}

impl Local {
    /// Opens the data dir and wires every component.
    pub async fn build(opts: &DevOptions) -> Result<Self, LocalError> {
        opts.worker.validate()?;
        let clock: SharedClock = Arc::new(SystemClock);
        let metrics = Metrics::new();
        let db = EmbeddedDb::open(&opts.data_dir)?;
        let store = EmbeddedStore::new(db.clone());
        let all = EmbeddedQueues::open(db, clock.clone(), opts.queue).await?;
        let queues = Lane::ALL.map(|l| all.queue(l.as_str(), &format!("{}-dlq", l.as_str())));
        let cache = Arc::new(MemoryCache::new(clock.clone()));
        let latency = opts.offline_latency;
        let provider = Arc::new(OfflineProvider::new(|l| latency[l.index()]));
        let worker = Worker {
            store: Arc::new(store.clone()),
            lock: Arc::new(MemoryLock::new(clock.clone())),
            cache: cache.clone(),
            llm: provider.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            config: opts.worker,
        };
        let consumers: Vec<(Lane, Arc<dyn QueueConsume>)> = Lane::ALL
            .iter()
            .map(|&l| (l, Arc::new(queues[l.index()].clone()) as Arc<dyn QueueConsume>))
            .collect();
        let pool = Arc::new(Pool::new(opts.capacity, opts.shares, consumers, worker, opts.poll_interval));
        let ingress = Ingress {
            store: Arc::new(store.clone()),
            cache,
            queues: queues.clone().map(|q| Arc::new(q) as Arc<dyn QueueSend>),
            metrics: metrics.clone(),
            clock,
            config: opts.ingress,
        };
        let m = metrics.clone();
        let router =
            router(ingress).route(
                "/metrics",
                get(move || {
                    let m = m.clone();
                    async move {
                        ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], m.render()).into_response()
                    }
                }),
            );
        Ok(Self { router, pool, provider, store, queues, metrics })
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
