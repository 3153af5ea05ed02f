//! `worker`: consumes one lane's SQS queue (`LANES_LANE`). Configuration is read and validated once at
//! cold start (a missing variable is named); each batch is handed to lanes-core, which answers with
//! the partial batch failures.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, service_fn};
use lanes_core::lambda::{WorkerFunction, init_tracing};

// One thread: at the template's memory sizes a function has less than one vCPU, so worker threads
// would only add to its cold start.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    init_tracing();
    let function = WorkerFunction::from_env().await?;
    let function = &function;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<SqsBatchResponse, Error>(function.handle(&event.payload.records, event.context.deadline).await)
    }))
    .await
}
