//! `controller`: every minute, sets each lane's event-source-mapping concurrency from queue depth with
//! the weighted pool policy (`lanes_core::pool::allocate`). Refuses at cold start until the Lambda
//! event-source-mapping adapter exists (the deployable-stack issue).

use lanes_core::lambda::{init_tracing, not_built_yet};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    init_tracing();
    Err(not_built_yet("controller", "the Lambda event-source-mapping adapter").into())
}
