//! `worker`: consumes one lane's SQS queue (`LANES_LANE`). Configuration is validated at cold start and
//! a missing variable or adapter is named in the error.

use lanes_core::lambda::{init_tracing, lane_from_env, needs_aws_adapters};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    init_tracing();
    let lane = lane_from_env()?;
    // The worker core (lanes_core::worker) and the batch response (lanes_core::lambda) are ready; the
    // SQS adapter that ChangeMessageVisibility needs is not, so refuse at cold start instead of
    // pretending to process.
    Err(needs_aws_adapters(&format!("{lane} worker")).into())
}
