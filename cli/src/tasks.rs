//! `lanes submit` and `lanes status`: thin HTTP clients of a running server.

use crate::CliError;
use clap::Args;

/// `lanes submit`'s flags.
#[derive(Args)]
pub struct SubmitArgs {
    /// Server URL.
    #[arg(long, default_value = "http://127.0.0.1:3000")]
    url: String,
    /// Project id.
    #[arg(long)]
    project: String,
    /// Task kind (explain, refactor, ...).
    #[arg(long)]
    kind: String,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// Target files (repeatable).
    #[arg(long = "file")]
    files: Vec<String>,
}

/// `lanes status`'s arguments.
#[derive(Args)]
pub struct StatusArgs {
    /// Server URL.
    #[arg(long, default_value = "http://127.0.0.1:3000")]
    url: String,
    /// Task id.
    task_id: String,
}

/// Submits a task and prints the answer.
pub async fn submit(args: SubmitArgs) -> Result<(), CliError> {
    let body = serde_json::json!({"project_id": args.project, "kind": args.kind, "prompt": args.prompt,
        "target_files": args.files});
    let url = args.url.trim_end_matches('/').to_owned();
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/tasks"))
        .json(&body)
        .send()
        .await
        .map_err(|source| CliError::Unreachable { url, source })?;
    print_response(resp).await
}

/// Prints a task.
pub async fn status(args: StatusArgs) -> Result<(), CliError> {
    let url = args.url.trim_end_matches('/').to_owned();
    let resp = reqwest::get(format!("{url}/v1/tasks/{}", args.task_id))
        .await
        .map_err(|source| CliError::Unreachable { url, source })?;
    print_response(resp).await
}

async fn print_response(resp: reqwest::Response) -> Result<(), CliError> {
    let status = resp.status();
    let text = resp.text().await.map_err(|source| CliError::Unreachable { url: String::new(), source })?;
    println!("{text}");
    if status.is_client_error() || status.is_server_error() {
        return Err(CliError::Server(status.as_u16()));
    }
    Ok(())
}
