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

/// Loads the SDK configuration once per process.
pub async fn sdk_config(settings: &AwsSettings) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
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
