//! `webhook`: the Git push endpoint behind a Lambda function URL. Until the commits pipeline lands it
//! answers every request with a 501 problem, so a misrouted delivery is visible rather than lost.

use lanes_core::lambda::init_tracing;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    init_tracing();
    lambda_http::run(lanes_core::lambda::webhook_router()).await
}
