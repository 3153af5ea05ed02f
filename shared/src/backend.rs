//! Building the adapters of one backend, once per process: embedded (a redb file, in-process lock
//! and cache) or AWS (SQS, DynamoDB, Redis). Reads and validates the AWS configuration from the
//! environment, naming any missing variable, and can create the queues and the table (`--create`).

use crate::adapters::redis::{RedisCache, RedisLock, RedisSettings, connect};
use crate::adapters::sqs::SqsQueue;
use crate::adapters::{AwsClients, AwsSettings};
use crate::clock::SharedClock;
use crate::config::{ConfigError, require_env};
use crate::domain::Lane;
use crate::embedded::{
    EmbeddedDb, EmbeddedQueue, EmbeddedQueues, EmbeddedStore, EmbeddedSummaries, MemoryCache, MemoryLock,
    QueueSettings,
};
use crate::ports::{Cache, LeaseLock, QueueConsume, QueueSend, SummaryStore, TaskStore};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Errors building a backend. All permanent at start-up: they say what to fix.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Missing or invalid configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The embedded database could not be opened.
    #[error(transparent)]
    Db(#[from] crate::embedded::DbOpenError),
    /// A queue could not be reached or created.
    #[error("queue setup failed: {0}")]
    Queue(#[from] crate::ports::QueueError),
    /// The table could not be reached or created.
    #[error("table setup failed: {0}")]
    Store(#[from] crate::ports::StoreError),
    /// Redis could not be configured.
    #[error(transparent)]
    Redis(#[from] crate::adapters::redis::RedisSetupError),
}

/// The adapters of every port, ready to hand to ingress, workers and the pool.
#[derive(Clone)]
pub struct Adapters {
    /// Durable records.
    pub store: Arc<dyn TaskStore>,
    /// Commit summaries and webhook delivery markers.
    pub summaries: Arc<dyn SummaryStore>,
    /// Lease lock.
    pub lock: Arc<dyn LeaseLock>,
    /// Hot cache.
    pub cache: Arc<dyn Cache>,
    /// Senders per lane ([`Lane::index`]).
    pub send: [Arc<dyn QueueSend>; 3],
    /// Consumers per lane.
    pub consume: [Arc<dyn QueueConsume>; 3],
    /// Each lane's dead-letter queue, where this backend reads it (embedded: always; AWS: for the
    /// lanes consumed, from their redrive policy).
    pub dlq: [Option<Arc<dyn QueueConsume>>; 3],
    /// The Redis connection, on the AWS backend (for the shared LLM limiter).
    pub redis: Option<crate::adapters::redis::RedisConn>,
    /// The key prefix of that connection.
    pub redis_prefix: String,
}

impl Adapters {
    /// The commits worker on these adapters (summaries, cache, lock), with the default budgets.
    pub fn commits_worker(
        &self,
        llm: Arc<dyn crate::ports::LlmClient>,
        diffs: Arc<dyn crate::ports::DiffSource>,
        metrics: crate::metrics::Metrics,
        clock: SharedClock,
        lease: crate::config::WorkerConfig,
    ) -> crate::commits::worker::CommitsWorker {
        crate::commits::worker::CommitsWorker {
            summaries: self.summaries.clone(),
            cache: self.cache.clone(),
            lock: self.lock.clone(),
            llm,
            diffs,
            metrics,
            clock,
            lease,
            config: Default::default(),
        }
    }

    /// The LLM limiter for this backend, when `LANES_LLM_RPM`/`LANES_LLM_TPM` are set: shared in
    /// Redis on the AWS backend, in process otherwise.
    pub fn limiter(
        &self,
        name: &str,
        clock: SharedClock,
    ) -> Result<Option<Arc<dyn crate::limiter::RateLimiter>>, ConfigError> {
        // A real provider is always paced: by the configured caps, or by the limits its headers say.
        let real = crate::config::optional_env("LANES_LLM_PROVIDER").is_some_and(|p| p != "offline");
        let config = match crate::limiter::config_from_env()? {
            Some(config) => config,
            None if real => crate::limiter::LimiterConfig::unknown(),
            None => return Ok(None),
        };
        Ok(Some(match &self.redis {
            Some(conn) => Arc::new(crate::adapters::redis::limiter::RedisLimiter::new(
                conn.clone(),
                &self.redis_prefix,
                name,
                config,
                clock,
            )),
            None => Arc::new(crate::limiter::MemoryLimiter::new(config, clock)),
        }))
    }
}

/// The embedded backend in `data_dir`; also returns the embedded queues for inspection.
pub async fn embedded(
    data_dir: &Path,
    settings: QueueSettings,
    clock: SharedClock,
) -> Result<(Adapters, [EmbeddedQueue; 3]), BackendError> {
    let db = EmbeddedDb::open(data_dir)?;
    let store = EmbeddedStore::new(db.clone());
    let summaries = EmbeddedSummaries::new(db.clone());
    let all = EmbeddedQueues::open(db, clock.clone(), settings).await?;
    let queues = Lane::ALL.map(|l| all.queue(l.as_str(), &format!("{}-dlq", l.as_str())));
    let adapters = Adapters {
        store: Arc::new(store),
        summaries: Arc::new(summaries),
        lock: Arc::new(MemoryLock::new(clock.clone())),
        cache: Arc::new(MemoryCache::new(clock)),
        send: queues.clone().map(|q| Arc::new(q) as Arc<dyn QueueSend>),
        consume: queues.clone().map(|q| Arc::new(q) as Arc<dyn QueueConsume>),
        dlq: queues.clone().map(|q| Some(Arc::new(q.dead_letter_queue()) as Arc<dyn QueueConsume>)),
        redis: None,
        redis_prefix: String::new(),
    };
    Ok((adapters, queues))
}

/// Configuration of the AWS backend.
#[derive(Debug, Clone)]
pub struct AwsBackendConfig {
    /// SDK settings (endpoint from `AWS_ENDPOINT_URL` when unset here).
    pub aws: AwsSettings,
    /// DynamoDB table.
    pub table: String,
    /// Queue URL per lane.
    pub queue_urls: [String; 3],
    /// Redis.
    pub redis: RedisSettings,
}

const QUEUE_URL_VARS: [&str; 3] =
    ["LANES_QUEUE_URL_INTERACTIVE", "LANES_QUEUE_URL_SYNTHESIS", "LANES_QUEUE_URL_COMMITS"];

/// Redis settings from `REDIS_URL`, `LANES_REDIS_CLUSTER` and `LANES_KEY_PREFIX`.
pub fn redis_from_env() -> Result<RedisSettings, ConfigError> {
    let url = require_env("REDIS_URL")?;
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(ConfigError::Invalid {
            name: "REDIS_URL",
            reason: "must start with redis:// or rediss://".into(),
        });
    }
    let cluster = match std::env::var("LANES_REDIS_CLUSTER").unwrap_or_default().as_str() {
        "" | "0" | "false" => false,
        "1" | "true" => true,
        other => {
            return Err(ConfigError::Invalid {
                name: "LANES_REDIS_CLUSTER",
                reason: format!("`{other}`; expected true or false"),
            });
        }
    };
    let prefix = std::env::var("LANES_KEY_PREFIX").unwrap_or_else(|_| "lanes:".into());
    Ok(RedisSettings { url, cluster, prefix, timeout: Duration::from_millis(500) })
}

impl AwsBackendConfig {
    /// Reads `LANES_TABLE`, `LANES_QUEUE_URL_{INTERACTIVE,SYNTHESIS,COMMITS}`, `REDIS_URL`,
    /// `LANES_REDIS_CLUSTER` and `LANES_KEY_PREFIX`.
    pub fn from_env() -> Result<Self, ConfigError> {
        let table = require_env("LANES_TABLE")?;
        let mut urls = Vec::with_capacity(3);
        for var in QUEUE_URL_VARS {
            urls.push(require_env(var)?);
        }
        let queue_urls: [String; 3] =
            urls.try_into().map_err(|_| ConfigError::Missing("LANES_QUEUE_URL_*"))?;
        Ok(Self { aws: AwsSettings::default(), table, queue_urls, redis: redis_from_env()? })
    }
}

/// The AWS backend. `consume_lanes` are the lanes whose queues are read (their redrive policy is
/// fetched now); the others get send-only handles.
pub async fn aws(config: &AwsBackendConfig, consume_lanes: &[Lane]) -> Result<Adapters, BackendError> {
    let aws = AwsClients::load(&config.aws).await;
    let conn = connect(&config.redis).await?;
    let mut consume = Vec::with_capacity(3);
    for lane in Lane::ALL {
        let url = &config.queue_urls[lane.index()];
        let q = if consume_lanes.contains(&lane) { aws.queue(url).await? } else { aws.queue_sender(url) };
        consume.push(q);
    }
    let queues: [SqsQueue; 3] = consume.try_into().map_err(|_| ConfigError::Missing("queues"))?;
    Ok(Adapters {
        store: Arc::new(aws.task_store(&config.table)),
        summaries: Arc::new(aws.summaries(&config.table)),
        lock: Arc::new(RedisLock::new(conn.clone(), &config.redis.prefix)),
        cache: Arc::new(RedisCache::new(conn.clone(), &config.redis.prefix)),
        send: queues.clone().map(|q| Arc::new(q) as Arc<dyn QueueSend>),
        dlq: queues.clone().map(|q| q.dead_letter_queue().map(|d| Arc::new(d) as Arc<dyn QueueConsume>)),
        consume: queues.map(|q| Arc::new(q) as Arc<dyn QueueConsume>),
        redis: Some(conn),
        redis_prefix: config.redis.prefix.clone(),
    })
}

/// Creates the lane queues (`<prefix>-<lane>`, each with a `-dlq` and a redrive policy) and the
/// table, idempotently; returns the queue URLs.
pub async fn create_aws_resources(
    aws: &AwsSettings,
    prefix: &str,
    table: &str,
    settings: QueueSettings,
) -> Result<[String; 3], BackendError> {
    let aws = AwsClients::load(aws).await;
    let mut urls = Vec::with_capacity(3);
    for lane in Lane::ALL {
        let name = format!("{prefix}-{}", lane.as_str());
        urls.push(
            aws.create_queue_with_dlq(&name, settings.default_visibility, settings.max_receive_count).await?,
        );
    }
    aws.create_table(table).await?;
    urls.try_into().map_err(|_| BackendError::Config(ConfigError::Missing("queues")))
}

/// Chooses the provider from the environment, once per process:
/// `LANES_LLM_PROVIDER` = `offline` (default) | `openai` | `anthropic` | `bedrock`; `LANES_LLM_MODEL`
/// (required but for offline; the model id for Bedrock); `LANES_LLM_BASE_URL` (defaults to the
/// vendor's); the key from `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`, or, in Lambda, from the Secrets
/// Manager secret named by `LANES_LLM_API_KEY_SECRET` (fetched once per container);
/// `LANES_LLM_TIMEOUT_MS` (default 120000). Real providers are `Retrying` over `Limited` (the
/// limiter, when there is one, charges each HTTP attempt; a budget wait past `max_wait` puts the task
/// off).
pub async fn llm_from_env(
    offline_latency: std::time::Duration,
    batch_answer: crate::llm::BatchAnswer,
    limiter: Option<std::sync::Arc<dyn crate::limiter::RateLimiter>>,
    max_wait: std::time::Duration,
) -> Result<std::sync::Arc<dyn crate::ports::LlmClient>, crate::config::ConfigError> {
    use crate::config::{ConfigError, require_env};
    use std::sync::Arc;
    let timeout = match std::env::var("LANES_LLM_TIMEOUT_MS") {
        Err(_) => std::time::Duration::from_secs(120),
        Ok(v) => std::time::Duration::from_millis(v.trim().parse().map_err(|_| ConfigError::Invalid {
            name: "LANES_LLM_TIMEOUT_MS",
            reason: format!("`{v}` is not a whole number"),
        })?),
    };
    let base = |default: &str| {
        crate::config::optional_env("LANES_LLM_BASE_URL").unwrap_or_else(|| default.to_owned())
    };
    let invalid = |e: crate::ports::LlmError| ConfigError::Invalid {
        name: "LANES_LLM_PROVIDER",
        reason: e.to_string(),
    };
    let key = |var: &'static str| crate::adapters::secrets::env_or_secret(var, "LANES_LLM_API_KEY_SECRET");
    let paced = |client: Arc<dyn crate::ports::LlmClient>| -> Arc<dyn crate::ports::LlmClient> {
        let limited = crate::limiter::limited(client, limiter.clone(), max_wait);
        Arc::new(crate::llm::Retrying::new(limited, crate::llm::RetryPolicy::default()))
    };
    match crate::config::optional_env("LANES_LLM_PROVIDER").unwrap_or_else(|| "offline".into()).as_str() {
        "offline" => Ok(crate::limiter::limited(
            Arc::new(crate::llm::OfflineProvider::new(|_| offline_latency).answering_batches(batch_answer)),
            limiter.clone(),
            max_wait,
        )),
        "openai" => {
            let client = crate::llm::OpenAiClient::new(
                &base("https://api.openai.com/v1"),
                &require_env("LANES_LLM_MODEL")?,
                key("OPENAI_API_KEY").await?,
                timeout,
            )
            .map_err(invalid)?;
            Ok(paced(Arc::new(client)))
        }
        "anthropic" => {
            let api_key = key("ANTHROPIC_API_KEY").await?.ok_or(ConfigError::Missing("ANTHROPIC_API_KEY"))?;
            let client = crate::llm::AnthropicClient::new(
                &base("https://api.anthropic.com"),
                &require_env("LANES_LLM_MODEL")?,
                api_key,
                timeout,
            )
            .map_err(invalid)?;
            Ok(paced(Arc::new(client)))
        }
        "bedrock" => {
            let aws = crate::adapters::AwsClients::load(&Default::default()).await;
            let client = aws.bedrock(&require_env("LANES_LLM_MODEL")?);
            Ok(paced(Arc::new(client)))
        }
        other => Err(ConfigError::Invalid {
            name: "LANES_LLM_PROVIDER",
            reason: format!("`{other}`; expected offline, openai, anthropic or bedrock"),
        }),
    }
}
