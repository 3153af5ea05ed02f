//! `controller`: every minute, sets each lane's event-source-mapping concurrency from queue depth with
//! the weighted pool policy (`lanes_core::pool::allocate`). Refuses at cold start until the SQS and
//! Lambda adapters exist.

use lanes_core::lambda::{init_tracing, needs_aws_adapters};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    init_tracing();
    Err(needs_aws_adapters("controller").into())
}
