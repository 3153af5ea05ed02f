//! `ingress`: the task API behind API Gateway (HTTP API v2). Reads config and builds the adapters once
//! per container, then serves the lanes-core router through lambda_http.

use lanes_core::lambda::{Backend, init_tracing};
use lanes_core::local::{DevOptions, Local};

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    init_tracing();
    let data_dir = Backend::from_env()?.require_embedded("ingress")?;
    let local = Local::build(&DevOptions { data_dir, ..DevOptions::default() }).await?;
    lambda_http::run(local.router).await
}
