//! Wiring: what one process is built from, once, at start. The adapters of its backend (the one
//! thing "backend" names: which adapters serve the ports), embedded (a redb file, in-process lock
//! and cache) or AWS (SQS, DynamoDB, Redis); the LLM client stack over them and the commits lane's
//! batch endpoint (`llm`: [`llm_from_env`], [`batching`]); and the Git hosts' sources. Reads and validates the AWS configuration from the environment,
//! naming any missing variable, and can create the queues and the table (`--create`).

use crate::adapters::redis::{RedisCache, RedisLock, RedisSettings, connect};
use crate::adapters::sqs::SqsQueue;
use crate::adapters::{AwsClients, AwsSettings};
use crate::clock::SharedClock;
use crate::commits::sources::{DiffSources, GitHubSource, GitLabSource, LocalGit};
use crate::commits::webhook::WebhookConfig;
use crate::config::{ConfigError, Redrive, require_env};
use crate::domain::Lane;
use crate::embedded::{
    EmbeddedDb, EmbeddedQueue, EmbeddedQueues, EmbeddedStore, EmbeddedSummaries, MemoryCache, MemoryLock,
    QueueSettings,
};
use crate::ports::{Cache, LeaseLock, QueueConsume, QueueSend, SummaryStore, TaskStore};
mod llm;

pub use llm::{batching, lane_batching, llm_from_env};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Errors building a backend. All permanent at start-up: they say what to fix.
#[derive(Debug, thiserror::Error)]
pub enum WiringError {
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
    /// The records of the commits lane's provider batches.
    pub batches: Arc<dyn crate::ports::BatchStore>,
    /// Lease lock.
    pub lock: Arc<dyn LeaseLock>,
    /// Hot cache.
    pub cache: Arc<dyn Cache>,
    /// Senders per lane ([`Lane::index`]).
    pub send: [Arc<dyn QueueSend>; 3],
    /// A new task's put and send: one write on the embedded backend, two requests on AWS.
    pub admission: Arc<dyn crate::ports::Admission>,
    /// Consumers per lane.
    pub consume: [Arc<dyn QueueConsume>; 3],
    /// Each lane's dead-letter queue, where this backend reads it (embedded: always; AWS: for the
    /// lanes consumed, from their redrive policy).
    pub dlq: [Option<Arc<dyn QueueConsume>>; 3],
    /// The Redis connection, on the AWS backend (for the shared LLM limiter).
    pub redis: Option<crate::adapters::redis::RedisConn>,
    /// The key prefix of that connection.
    pub redis_prefix: String,
    /// Where results too large for a record are kept (files locally, S3 on AWS when configured).
    pub objects: Option<Arc<dyn crate::ports::ResultObjects>>,
    /// The tasks' event streams (in process locally, Redis Streams on AWS).
    pub events: Arc<dyn crate::ports::EventLog>,
}

impl Adapters {
    /// The task worker on these adapters (store, lock, cache).
    pub fn task_worker(
        &self,
        llm: Arc<dyn crate::ports::LlmClient>,
        metrics: crate::metrics::Metrics,
        clock: SharedClock,
        config: crate::config::WorkerConfig,
    ) -> crate::tasks::worker::Worker {
        crate::tasks::worker::Worker {
            store: self.store.clone(),
            lock: self.lock.clone(),
            cache: self.cache.clone(),
            llm,
            metrics,
            clock,
            config,
            objects: self.objects.clone(),
            batching: None,
            events: None,
        }
    }

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
            send: self.send[Lane::Commits.index()].clone(),
            metrics,
            clock,
            lease,
            config: Default::default(),
            batching: Default::default(),
        }
    }

    /// The limiter of one LLM route (one per provider and model): shared in Redis on the AWS
    /// backend, in process otherwise. A real provider is always paced, by the caps
    /// `LANES_LLM_RPM`/`LANES_LLM_TPM` (which apply to every route) or by the limits its headers
    /// say; the offline model only when caps are set.
    pub fn limiter(
        &self,
        route: &crate::llm::route::Route,
        clock: SharedClock,
    ) -> Result<Option<Arc<dyn crate::limiter::RateLimiter>>, ConfigError> {
        let name = &route.name();
        let real = route.is_real();
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
) -> Result<(Adapters, [EmbeddedQueue; 3]), WiringError> {
    let db = EmbeddedDb::open(data_dir)?;
    let store = EmbeddedStore::new(db.clone());
    let summaries = EmbeddedSummaries::new(db.clone());
    let batches = crate::embedded::EmbeddedBatches::new(db.clone());
    let all = EmbeddedQueues::open(db, clock.clone(), settings).await?;
    let queues = Lane::ALL.map(|l| all.queue(l.as_str(), &format!("{}-dlq", l.as_str())));
    let adapters = Adapters {
        admission: Arc::new(crate::embedded::EmbeddedAdmission::new(store.clone(), queues.clone())),
        store: Arc::new(store),
        summaries: Arc::new(summaries),
        batches: Arc::new(batches),
        lock: Arc::new(MemoryLock::new(clock.clone())),
        events: Arc::new(crate::embedded::MemoryEvents::new(clock.clone())),
        cache: Arc::new(MemoryCache::new(clock)),
        send: queues.clone().map(|q| Arc::new(q) as Arc<dyn QueueSend>),
        consume: queues.clone().map(|q| Arc::new(q) as Arc<dyn QueueConsume>),
        dlq: queues.clone().map(|q| Some(Arc::new(q.dead_letter_queue()) as Arc<dyn QueueConsume>)),
        redis: None,
        redis_prefix: String::new(),
        objects: Some(Arc::new(crate::embedded::FileObjects::new(data_dir))),
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
    /// The lane queues' redrive policy, when the deployment states it: the consumers are then built
    /// without asking SQS for it.
    pub redrive: Option<Redrive>,
    /// The S3 bucket of results too large for a record (`LANES_RESULTS_BUCKET`); without one such
    /// a result fails its task `result_too_large`.
    pub results_bucket: Option<String>,
}

const QUEUE_URL_VARS: [&str; 3] =
    ["LANES_QUEUE_URL_INTERACTIVE", "LANES_QUEUE_URL_SYNTHESIS", "LANES_QUEUE_URL_COMMITS"];

pub use crate::adapters::redis::env::redis_from_env;

impl AwsBackendConfig {
    /// Reads `LANES_TABLE`, `LANES_QUEUE_URL_{INTERACTIVE,SYNTHESIS,COMMITS}`, `REDIS_URL`,
    /// `LANES_REDIS_CLUSTER`, `LANES_KEY_PREFIX` and `LANES_RESULTS_BUCKET`, and checks `LANES_AWS_TLS_ROOTS`
    /// ([`crate::adapters::trust`], read again where the SDK configuration is loaded).
    pub fn from_env() -> Result<Self, ConfigError> {
        crate::adapters::trust::AwsRoots::from_env(false)?;
        let table = require_env("LANES_TABLE")?;
        let mut urls = Vec::with_capacity(3);
        for var in QUEUE_URL_VARS {
            urls.push(require_env(var)?);
        }
        let queue_urls: [String; 3] =
            urls.try_into().map_err(|_| ConfigError::Missing("LANES_QUEUE_URL_*"))?;
        Ok(Self {
            aws: AwsSettings::default(),
            table,
            queue_urls,
            redis: redis_from_env()?,
            // Only the functions take the policy as stated ([`AwsBackendConfig::for_functions`]):
            // operator tools ask SQS, which also tells them the queues' ARNs (move tasks need them).
            redrive: None,
            results_bucket: crate::config::optional_env("LANES_RESULTS_BUCKET"),
        })
    }

    /// [`Self::from_env`] plus the [`Redrive`] the template states, for the Lambda functions: their
    /// consumers are built without asking SQS, at the price of not knowing the queues' ARNs, which
    /// only the operator's DLQ move task needs.
    pub fn for_functions() -> Result<Self, ConfigError> {
        Ok(Self { redrive: Redrive::from_env()?, ..Self::from_env()? })
    }
}

/// The AWS backend. `consume_lanes` are the lanes whose queues are read (their redrive policy comes
/// from [`AwsBackendConfig::redrive`], or is fetched now); the others get send-only handles.
pub async fn aws(config: &AwsBackendConfig, consume_lanes: &[Lane]) -> Result<Adapters, WiringError> {
    let aws = AwsClients::load(&config.aws).await;
    let conn = connect(&config.redis).await?;
    let mut consume = Vec::with_capacity(3);
    for lane in Lane::ALL {
        let url = &config.queue_urls[lane.index()];
        let q = if consume_lanes.contains(&lane) {
            aws.consumer(url, lane, config.redrive.as_ref()).await?
        } else {
            aws.queue_sender(url)
        };
        consume.push(q);
    }
    let queues: [SqsQueue; 3] = consume.try_into().map_err(|_| ConfigError::Missing("queues"))?;
    let store: Arc<dyn TaskStore> = Arc::new(aws.task_store(&config.table));
    let send = queues.clone().map(|q| Arc::new(q) as Arc<dyn QueueSend>);
    Ok(Adapters {
        admission: Arc::new(crate::ports::PutThenSend::new(store.clone(), send.clone())),
        store,
        summaries: Arc::new(aws.summaries(&config.table)),
        batches: Arc::new(aws.batches(&config.table)),
        lock: Arc::new(RedisLock::new(conn.clone(), &config.redis.prefix)),
        cache: Arc::new(RedisCache::new(conn.clone(), &config.redis.prefix)),
        events: Arc::new(crate::adapters::redis::events::RedisEvents::new(
            conn.clone(),
            &config.redis.prefix,
        )),
        send,
        dlq: queues.clone().map(|q| q.dead_letter_queue().map(|d| Arc::new(d) as Arc<dyn QueueConsume>)),
        consume: queues.map(|q| Arc::new(q) as Arc<dyn QueueConsume>),
        redis: Some(conn),
        redis_prefix: config.redis.prefix.clone(),
        objects: config
            .results_bucket
            .as_deref()
            .map(|b| Arc::new(aws.result_objects(b)) as Arc<dyn crate::ports::ResultObjects>),
    })
}

/// The results bucket local runs against an emulator create ([`create_aws_resources`]).
pub const RESULTS_BUCKET: &str = "lanes-results";

/// Creates the lane queues (`<prefix>-<lane>`, each with a `-dlq` and a redrive policy), the
/// table and the results bucket ([`RESULTS_BUCKET`]), idempotently; returns the queue URLs.
pub async fn create_aws_resources(
    aws: &AwsSettings,
    prefix: &str,
    table: &str,
    settings: QueueSettings,
) -> Result<[String; 3], WiringError> {
    let aws = AwsClients::load(aws).await;
    let mut urls = Vec::with_capacity(3);
    for lane in Lane::ALL {
        let name = format!("{prefix}-{}", lane.as_str());
        urls.push(
            aws.create_queue_with_dlq(&name, settings.default_visibility, settings.max_receive_count).await?,
        );
    }
    aws.create_table(table).await?;
    aws.create_bucket(RESULTS_BUCKET).await?;
    urls.try_into().map_err(|_| WiringError::Config(ConfigError::Missing("queues")))
}

/// The webhook's settings: `LANES_GITHUB_WEBHOOK_SECRET` / `LANES_GITLAB_WEBHOOK_TOKEN`, or in Lambda the Secrets Manager
/// secrets named by `LANES_GITHUB_WEBHOOK_SECRET_ID` / `LANES_GITLAB_WEBHOOK_TOKEN_ID`; the owners'
/// own secrets, `LANES_WEBHOOK_OWNER_SECRETS` or the secret `LANES_WEBHOOK_OWNER_SECRETS_ID`
/// ([`crate::commits::signatures`]); the optional `LANES_REPO_ALLOWLIST` (comma-separated owners or groups). The secrets are read at
/// first use, or ahead of it where the init runs ahead of events
/// ([`crate::adapters::secrets::reads_ahead`]); a rotated one is read again at the first delivery
/// it fails to verify ([`crate::secret::Secret::check`]).
pub fn webhook_config() -> Result<WebhookConfig, ConfigError> {
    let [github_secret, gitlab_token] = crate::adapters::secrets::env_or_secrets([
        ("LANES_GITHUB_WEBHOOK_SECRET", "LANES_GITHUB_WEBHOOK_SECRET_ID"),
        ("LANES_GITLAB_WEBHOOK_TOKEN", "LANES_GITLAB_WEBHOOK_TOKEN_ID"),
    ]);
    let owner_secrets = crate::adapters::secrets::env_or_secret(
        "LANES_WEBHOOK_OWNER_SECRETS",
        "LANES_WEBHOOK_OWNER_SECRETS_ID",
        crate::adapters::secrets::Part::Whole,
    );
    let allowlist = crate::config::optional_env("LANES_REPO_ALLOWLIST")
        .map(|v| {
            v.split(',').map(|e| e.trim().trim_matches('/').to_owned()).filter(|e| !e.is_empty()).collect()
        })
        .unwrap_or_default();
    let daily_commits = crate::config::env_number("LANES_REPO_DAILY_COMMITS", 1, 100_000_000)?;
    Ok(WebhookConfig { github_secret, gitlab_token, owner_secrets, allowlist, daily_commits })
}

/// Who reads which owner's summaries, from `LANES_SUMMARY_READERS`
/// ([`crate::commits::readers`]): `None` with tenancy off; with it on and no table, nobody reads.
pub fn summary_readers(
    tenancy_on: bool,
) -> Result<Option<Arc<crate::commits::readers::SummaryReaders>>, ConfigError> {
    if !tenancy_on {
        return Ok(None);
    }
    let table = crate::config::optional_env("LANES_SUMMARY_READERS").unwrap_or_else(|| "{}".into());
    let readers = crate::commits::readers::SummaryReaders::parse(&table)
        .map_err(|e| ConfigError::Invalid { name: "LANES_SUMMARY_READERS", reason: e.to_string() })?;
    Ok(Some(Arc::new(readers)))
}

/// The commits flow's Git hosts, GitHub and GitLab, from the environment: `LANES_GITHUB_API_URL` (default
/// `https://api.github.com`), `LANES_GITHUB_TOKEN` or the secret `LANES_GITHUB_TOKEN_SECRET`;
/// `LANES_GITLAB_URL` (default `https://gitlab.com`), `LANES_GITLAB_API_TOKEN` or the secret
/// `LANES_GITLAB_API_TOKEN_SECRET`. With `local`, local repositories too.
pub fn diff_sources(local: bool) -> Result<DiffSources, ConfigError> {
    let timeout = Duration::from_secs(20);
    let endpoint = |name: &'static str, default: &str| {
        let url = crate::config::optional_env(name).unwrap_or_else(|| default.to_owned());
        crate::http::check_endpoint(&url)
            .map(|()| url)
            .map_err(|reason| ConfigError::Invalid { name, reason })
    };
    let github_url = endpoint("LANES_GITHUB_API_URL", "https://api.github.com")?;
    let gitlab_url = endpoint("LANES_GITLAB_URL", "https://gitlab.com")?;
    // Read ahead together where the init runs ahead of events (one Secrets Manager request),
    // else each at its first use; a token refused with 401 is read again (rotation).
    let [github_token, gitlab_token] = crate::adapters::secrets::env_or_secrets([
        ("LANES_GITHUB_TOKEN", "LANES_GITHUB_TOKEN_SECRET"),
        ("LANES_GITLAB_API_TOKEN", "LANES_GITLAB_API_TOKEN_SECRET"),
    ]);
    Ok(DiffSources {
        github: Some(Arc::new(GitHubSource::new(&github_url, github_token, timeout))),
        gitlab: Some(Arc::new(GitLabSource::new(&gitlab_url, gitlab_token, timeout))),
        local: local.then(|| Arc::new(LocalGit) as Arc<dyn crate::ports::DiffSource>),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_redrive_policy_is_all_four_variables_or_none() {
        let urls = || ["i", "s", "c"].map(|u| Some(format!("https://sqs/{u}-dlq")));
        assert_eq!(Redrive::parse(None, [None, None, None]).unwrap(), None);
        let r = Redrive::parse(Some("10".into()), urls()).unwrap().unwrap();
        assert_eq!((r.max_receive_count, r.dlq_urls[2].as_str()), (10, "https://sqs/c-dlq"));
        let missing = Redrive::parse(Some("10".into()), [None, Some("x".into()), Some("y".into())]);
        assert!(matches!(missing, Err(ConfigError::Missing("LANES_DLQ_URL_INTERACTIVE"))), "{missing:?}");
        assert!(matches!(Redrive::parse(None, urls()), Err(ConfigError::Missing("LANES_MAX_RECEIVE_COUNT"))));
        for bad in ["0", "ten", "-1"] {
            let e = Redrive::parse(Some(bad.into()), urls()).unwrap_err();
            assert!(e.to_string().contains("LANES_MAX_RECEIVE_COUNT"), "{e}");
        }
    }
}
