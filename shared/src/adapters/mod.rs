//! Production adapters of the ports: SQS, DynamoDB, S3 (large results), Redis/Valkey (ElastiCache),
//! Lambda event source mappings, Bedrock and Secrets Manager; the SDK interceptor that counts every AWS request
//! ([`requests`]), the roots the SDK clients trust ([`trust`]) and, for the CLI, the OTLP trace
//! exporter (`otlp`, feature `otlp`). Only this module names an SDK crate (`aws_sdk_*`,
//! `aws_config`, `redis`): the rest of the core sees the ports, and builds adapters through
//! [`AwsClients`]. Each adapter has an embedded twin in `crate::embedded`.

pub mod bedrock;
pub mod dynamodb;
pub mod lambda;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod redis;
pub mod requests;
pub mod s3;
pub mod secrets;
pub mod sqs;
pub mod trust;

/// One process's AWS clients, built once from one SDK configuration, and the adapters over them.
#[derive(Clone)]
pub struct AwsClients {
    sdk: aws_config::SdkConfig,
    sqs: aws_sdk_sqs::Client,
    dynamodb: aws_sdk_dynamodb::Client,
}

impl AwsClients {
    /// Loads the configuration (region, credentials, endpoint, [`timeouts`]) and builds the clients.
    pub async fn load(settings: &AwsSettings) -> Self {
        let sdk = sdk_config(settings).await;
        Self { sqs: requests::sqs(&sdk), dynamodb: requests::dynamodb(&sdk), sdk }
    }

    /// A send-only handle on the queue at `url` (no I/O).
    pub fn queue_sender(&self, url: &str) -> sqs::SqsQueue {
        sqs::SqsQueue::sender(self.sqs.clone(), url)
    }

    /// A consumer of lane `lane`'s queue at `url`: built from `redrive` when the deployment states
    /// it (no I/O, but no ARN either, so no DLQ move task from it), else with the policy read from
    /// SQS once ([`Self::queue`]).
    pub async fn consumer(
        &self,
        url: &str,
        lane: crate::domain::Lane,
        redrive: Option<&crate::config::Redrive>,
    ) -> Result<sqs::SqsQueue, crate::ports::QueueError> {
        match redrive {
            Some(r) => Ok(sqs::SqsQueue::known(
                self.sqs.clone(),
                url,
                &r.dlq_urls[lane.index()],
                r.max_receive_count,
            )),
            None => self.queue(url).await,
        }
    }

    /// A consumer of the queue at `url`, with its redrive policy read once.
    pub async fn queue(&self, url: &str) -> Result<sqs::SqsQueue, crate::ports::QueueError> {
        sqs::SqsQueue::connect(self.sqs.clone(), url).await
    }

    /// Creates `name` with its `-dlq` and a redrive policy, idempotently; returns its URL.
    pub async fn create_queue_with_dlq(
        &self,
        name: &str,
        visibility: std::time::Duration,
        max_receive_count: u32,
    ) -> Result<String, crate::ports::QueueError> {
        sqs::create_queue_with_dlq(&self.sqs, name, visibility, max_receive_count).await
    }

    /// The task store in `table`.
    pub fn task_store(&self, table: &str) -> dynamodb::DynamoStore {
        dynamodb::DynamoStore::new(self.dynamodb.clone(), table)
    }

    /// The summary store in `table`.
    pub fn summaries(&self, table: &str) -> dynamodb::DynamoSummaries {
        dynamodb::DynamoSummaries::new(self.dynamodb.clone(), table)
    }

    /// The provider-batch records in `table`.
    pub fn batches(&self, table: &str) -> dynamodb::DynamoBatches {
        dynamodb::DynamoBatches::new(self.dynamodb.clone(), table)
    }

    /// Creates `table` (with its TTL and index), idempotently.
    pub async fn create_table(&self, table: &str) -> Result<(), crate::ports::StoreError> {
        dynamodb::DynamoStore::create_table(&self.dynamodb, table).await
    }

    /// The results bucket `bucket`, for results too large for a record.
    pub fn result_objects(&self, bucket: &str) -> s3::S3Objects {
        s3::S3Objects::new(requests::s3(&self.sdk), bucket)
    }

    /// Creates `bucket`, idempotently (local runs against an emulator).
    pub async fn create_bucket(&self, bucket: &str) -> Result<(), crate::ports::StoreError> {
        s3::S3Objects::create_bucket(&requests::s3(&self.sdk), bucket).await
    }

    /// The event source mappings, for the controller.
    pub fn mappings(&self) -> lambda::LambdaMappings {
        lambda::LambdaMappings::new(requests::lambda(&self.sdk))
    }
}

/// Where and how to reach AWS (or an emulator).
#[derive(Debug, Clone, Default)]
pub struct AwsSettings {
    /// Endpoint override (moto, LocalStack); `AWS_ENDPOINT_URL` is honoured when this is `None`.
    pub endpoint: Option<String>,
    /// Region override.
    pub region: Option<String>,
    /// Static credentials (access key id, secret) for emulators; the default chain otherwise.
    pub static_credentials: Option<(String, String)>,
}

/// Timeouts of every AWS call the adapters make. Without them a call to an endpoint that stopped
/// answering hangs until the Lambda deadline, with a task's record written and its message unsent.
/// An attempt (one HTTP request) gets 5 s, the whole operation with the SDK's retries 15 s;
/// connecting gets 3 s. A long-poll receive raises its own call's timeouts past its wait.
pub fn timeouts() -> aws_config::timeout::TimeoutConfig {
    aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(std::time::Duration::from_secs(3))
        .operation_attempt_timeout(std::time::Duration::from_secs(5))
        .operation_timeout(std::time::Duration::from_secs(15))
        .build()
}

/// Loads the SDK configuration (once per process for the environment's default settings; settings
/// that name an endpoint, region or keys load their own), with [`timeouts`] and the standard retry mode
/// stated rather than inherited: three attempts with exponential backoff and full jitter for
/// throttling (`RequestThrottled`, `ThrottlingException`, `ProvisionedThroughputExceededException`),
/// 5xx and timeouts. Longer storms surface as `Unavailable`, which every caller already retries on
/// its own schedule (a task message's visibility, a webhook's redelivery).
pub async fn sdk_config(settings: &AwsSettings) -> aws_config::SdkConfig {
    let from_environment =
        settings.endpoint.is_none() && settings.region.is_none() && settings.static_credentials.is_none();
    if !from_environment {
        return load_sdk_config(settings).await;
    }
    // The environment's configuration is loaded once per process: a cold start builds several
    // clients (stores, queues, secrets, Bedrock), and they share one credentials provider instead
    // of each resolving its own.
    static FROM_ENVIRONMENT: tokio::sync::OnceCell<aws_config::SdkConfig> =
        tokio::sync::OnceCell::const_new();
    FROM_ENVIRONMENT.get_or_init(|| load_sdk_config(settings)).await.clone()
}

async fn load_sdk_config(settings: &AwsSettings) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .timeout_config(timeouts())
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(3));
    if let Some(endpoint) = &settings.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some(region) = &settings.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some((id, secret)) = &settings.static_credentials {
        loader = loader
            .credentials_provider(aws_sdk_sqs::config::Credentials::new(id, secret, None, None, "static"));
    } else if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
        // Keys in the environment are what the default chain would pick first anyway (Lambda puts
        // the function's role there). Naming that provider skips building the rest of the chain
        // (its STS, SSO and IMDS clients), which is most of a function's init after the TLS roots.
        loader = loader
            .credentials_provider(aws_config::environment::EnvironmentVariableCredentialsProvider::new());
    }
    // Amazon's roots in Lambda, the system's otherwise ([`trust`]). The functions refuse a bad value
    // at cold start (`AwsBackendConfig::from_env`, the controller's); other paths fall back here.
    let roots = trust::AwsRoots::from_env(settings.endpoint.is_some()).unwrap_or_else(|e| {
        tracing::error!(error = %e, "keeping the system's TLS roots");
        trust::AwsRoots::System
    });
    tracing::info!(roots = ?roots, "AWS SDK TLS roots");
    if let Some(client) = roots.http_client() {
        loader = loader.http_client(client);
    }
    if settings.region.is_none()
        && let Some(region) = std::env::var("AWS_REGION").ok().filter(|r| !r.is_empty())
    {
        // Likewise for the region: the environment first, without building the chain's IMDS client.
        loader = loader.region(aws_config::Region::new(region));
    }
    loader.load().await
}
