//! `lambda-sleeper`: a Lambda function for the emulator's own tests
//! (`lanes_tests::lambda_emulator`). It sleeps the event's `sleep_ms` and answers its process id, so
//! a test can see a timeout kill the environment and the next invocation start a new one.

use lambda_http::lambda_runtime::{self, LambdaEvent, service_fn};
use serde_json::{Value, json};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| async move {
        let ms = event.payload["sleep_ms"].as_u64().unwrap_or(0);
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        Ok::<_, lambda_runtime::Error>(json!({"pid": std::process::id(), "deadline": event.context.deadline}))
    }))
    .await
}
