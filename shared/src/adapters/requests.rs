//! Counting AWS requests where they leave the process: an SDK interceptor set once on every client
//! this crate builds (the constructors below are the only place clients are made), so each HTTP
//! attempt is counted by service and operation, SDK retries and new call sites included, with no
//! counting call beside each request. Redis commands have no SDK pipeline to hook; the Redis adapter
//! counts them itself.

use crate::metrics::aws_request;
use aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_sqs::error::BoxError;
use aws_smithy_runtime_api::client::orchestrator::Metadata;

/// Counts one request per transmitted attempt in `lanes_aws_requests_total{service,operation}`.
///
/// Why `read_before_transmit`: the orchestrator runs it once per attempt, right before the request
/// is handed to the HTTP client, after signing, so an attempt that never leaves (a build error) is not
/// counted and each retry is.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountRequests;

impl Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "CountRequests"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // Every generated operation stores its `Metadata` (operation and service name) in the bag.
        if let Some(m) = cfg.load::<Metadata>() {
            aws_request(&service_label(m.service()), m.name());
        }
        Ok(())
    }
}

/// The metric's service label: the SDK's service name lowercased without spaces (`SQS` → `sqs`,
/// `Secrets Manager` → `secretsmanager`), the names the dashboards and tests use.
pub fn service_label(service: &str) -> String {
    service.chars().filter(|c| !c.is_whitespace()).flat_map(char::to_lowercase).collect()
}

/// An SQS client that counts its requests.
pub fn sqs(sdk: &aws_config::SdkConfig) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::from_conf(aws_sdk_sqs::config::Builder::from(sdk).interceptor(CountRequests).build())
}

/// A DynamoDB client that counts its requests.
pub fn dynamodb(sdk: &aws_config::SdkConfig) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(sdk).interceptor(CountRequests).build(),
    )
}

/// An S3 client that counts its requests. Path-style addressing where an endpoint is set (an
/// emulator on loopback has no bucket subdomains).
pub fn s3(sdk: &aws_config::SdkConfig) -> aws_sdk_s3::Client {
    aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(sdk)
            .force_path_style(sdk.endpoint_url().is_some())
            .interceptor(CountRequests)
            .build(),
    )
}

/// A Lambda client that counts its requests.
pub fn lambda(sdk: &aws_config::SdkConfig) -> aws_sdk_lambda::Client {
    aws_sdk_lambda::Client::from_conf(
        aws_sdk_lambda::config::Builder::from(sdk).interceptor(CountRequests).build(),
    )
}

/// A Secrets Manager client that counts its requests.
pub fn secrets(sdk: &aws_config::SdkConfig) -> aws_sdk_secretsmanager::Client {
    aws_sdk_secretsmanager::Client::from_conf(
        aws_sdk_secretsmanager::config::Builder::from(sdk).interceptor(CountRequests).build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_labels_match_the_dashboards() {
        assert_eq!(service_label("SQS"), "sqs");
        assert_eq!(service_label("DynamoDB"), "dynamodb");
        assert_eq!(service_label("Secrets Manager"), "secretsmanager");
        assert_eq!(service_label("Bedrock Runtime"), "bedrockruntime");
    }
}
