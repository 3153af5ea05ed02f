//! `ingress`: the task API behind API Gateway (HTTP API v2). Reads config and builds the adapters once
//! per container (`LANES_BACKEND`, default `aws`), then serves the lanes-core router via lambda_http.

// One thread: at the template's memory sizes a function has less than one vCPU, so worker threads
// would only add to its cold start.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    lanes_core::lambda::init_tracing();
    let router = lanes_core::lambda::ingress_from_env().await?;
    lambda_http::run(router).await
}
