//! `webhook`: the Git push endpoint behind a Lambda function URL. Configuration (the commits queue,
//! the store, which secrets to read) is read once at cold start, the secrets from Secrets Manager at
//! their first use (ahead of it where the init runs before any event); each delivery is handed to
//! the lanes-core webhook router, which verifies it before reading it.

use lanes_core::lambda::{init_tracing, webhook_from_env};

// One thread: at the template's memory sizes a function has less than one vCPU, so worker threads
// would only add to its cold start.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    init_tracing();
    let router = webhook_from_env().await?;
    lambda_http::run(router).await
}
