//! Production adapters of the ports: SQS, DynamoDB, Redis/Valkey (ElastiCache) and Lambda event source
//! mappings. Only this module
//! touches an SDK; each adapter has an embedded twin in `crate::embedded`.

pub mod dynamodb;
pub mod lambda;
pub mod redis;
pub mod sqs;

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
/// An attempt (one HTTP request; every call here is short: receives do not long-poll) gets 5 s, the
/// whole operation with the SDK's retries 15 s; connecting gets 3 s.
pub fn timeouts() -> aws_config::timeout::TimeoutConfig {
    aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(std::time::Duration::from_secs(3))
        .operation_attempt_timeout(std::time::Duration::from_secs(5))
        .operation_timeout(std::time::Duration::from_secs(15))
        .build()
}

/// Loads the SDK configuration once per process, with [`timeouts`].
pub async fn sdk_config(settings: &AwsSettings) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).timeout_config(timeouts());
    if let Some(endpoint) = &settings.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some(region) = &settings.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some((id, secret)) = &settings.static_credentials {
        loader = loader
            .credentials_provider(aws_sdk_sqs::config::Credentials::new(id, secret, None, None, "static"));
    }
    loader.load().await
}
