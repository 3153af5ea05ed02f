//! `controller`: on an EventBridge schedule (every minute), sets each lane's event-source-mapping
//! `MaximumConcurrency` from queue depth with the weighted pool policy. Configuration is read once at
//! cold start; each tick is handed to lanes-core.

use aws_lambda_events::event::cloudwatch_events::CloudWatchEvent;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use lanes_core::lambda::{ControllerFunction, init_tracing};

// One thread: at the template's memory sizes a function has less than one vCPU, so worker threads
// would only add to its cold start.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    init_tracing();
    let function = ControllerFunction::from_env().await?;
    let function = &function;
    lambda_runtime::run(service_fn(move |_event: LambdaEvent<CloudWatchEvent>| async move {
        Ok::<_, Error>(serde_json::json!({ "lanes": function.handle().await }))
    }))
    .await
}
