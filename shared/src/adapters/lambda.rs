//! Lambda adapter of the controller's port: `GetEventSourceMapping` and `UpdateEventSourceMapping`
//! with `ScalingConfig.MaximumConcurrency`.

use crate::ports::{ControlError, MappingControl};
use async_trait::async_trait;
use aws_sdk_lambda::Client;
use aws_sdk_lambda::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_lambda::types::ScalingConfig;

/// Event source mappings of one account and region.
#[derive(Debug, Clone)]
pub struct LambdaMappings {
    client: Client,
}

impl LambdaMappings {
    /// Mappings through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

fn error<E: std::fmt::Debug + ProvideErrorMetadata>(e: &SdkError<E>) -> ControlError {
    let text = format!("{}: {}", e.code().unwrap_or("error"), e.message().unwrap_or_default());
    match e.code() {
        Some("ResourceNotFoundException" | "AccessDeniedException" | "InvalidParameterValueException") => {
            ControlError::Refused(text)
        }
        Some(_) => ControlError::Unavailable(text),
        None => ControlError::Unavailable(format!("{e:?}")),
    }
}

#[async_trait]
impl MappingControl for LambdaMappings {
    async fn max_concurrency(&self, mapping: &str) -> Result<Option<u32>, ControlError> {
        let out = self.client.get_event_source_mapping().uuid(mapping).send().await.map_err(|e| error(&e))?;
        Ok(out.scaling_config().and_then(|s| s.maximum_concurrency()).map(|n| n.max(0) as u32))
    }

    async fn set_max_concurrency(&self, mapping: &str, value: u32) -> Result<(), ControlError> {
        self.client
            .update_event_source_mapping()
            .uuid(mapping)
            .scaling_config(ScalingConfig::builder().maximum_concurrency(value as i32).build())
            .send()
            .await
            .map_err(|e| error(&e))?;
        Ok(())
    }
}
