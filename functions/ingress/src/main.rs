//! `ingress`: the task API behind API Gateway (HTTP API v2), or with `LANES_INGRESS_RESPONSE=stream`
//! the task event stream behind a function URL in `RESPONSE_STREAM` mode. Reads config and builds the
//! adapters once per container (`LANES_BACKEND`, default `aws`), then serves the lanes-core router via
//! lambda_http, answers returned whole or streamed as they are written.

use lanes_core::lambda::IngressMode;

// One thread: at the template's memory sizes a function has less than one vCPU, so worker threads
// would only add to its cold start.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), lambda_http::Error> {
    lanes_core::lambda::init_tracing();
    let mode = IngressMode::from_env()?;
    let router = lanes_core::lambda::ingress_from_env(mode).await?;
    match mode {
        IngressMode::Api => lambda_http::run(router).await,
        IngressMode::Stream => lambda_http::run_with_streaming_response(router).await,
    }
}
