//! `lanes submit` and `lanes status`: thin HTTP clients of a running server. `lanes submit
//! --follow` then follows the task's event stream: its text on stdout as it arrives, its states on
//! stderr, and the task's view at the end.

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
    /// Print the answer as it is written (`GET /v1/tasks/{id}/events`), then the task.
    #[arg(long)]
    follow: bool,
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
        .map_err(|source| CliError::Unreachable { url: url.clone(), source })?;
    if !args.follow || !resp.status().is_success() {
        return print_response(resp).await;
    }
    let view: serde_json::Value =
        resp.json().await.map_err(|source| CliError::Unreachable { url: url.clone(), source })?;
    let id = view["task_id"].as_str().unwrap_or_default();
    follow(&url, id).await
}

/// Follows a task's events to its end: `delta` text to stdout, `status` to stderr, the final
/// view to stdout (`error` is an error).
async fn follow(url: &str, id: &str) -> Result<(), CliError> {
    use eventsource_stream::Eventsource;
    use futures::StreamExt;
    use std::io::Write;
    let unreachable = |source| CliError::Unreachable { url: url.to_owned(), source };
    let resp = reqwest::get(format!("{url}/v1/tasks/{id}/events")).await.map_err(unreachable)?;
    if !resp.status().is_success() {
        return print_response(resp).await;
    }
    let mut events = resp.bytes_stream().eventsource();
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| CliError::Usage(format!("the event stream broke: {e}")))?;
        let data: serde_json::Value = serde_json::from_str(&event.data).unwrap_or_default();
        match event.event.as_str() {
            "delta" => {
                print!("{}", data["text"].as_str().unwrap_or_default());
                let _ = std::io::stdout().flush();
            }
            "status" => eprintln!(
                "[{}] {}",
                data["state"].as_str().unwrap_or("?"),
                data["reason"].as_str().unwrap_or("")
            ),
            "result" => {
                println!("\n{}", event.data);
                return Ok(());
            }
            "error" => {
                println!("\n{}", event.data);
                return Err(CliError::Usage(format!("task {id} did not complete")));
            }
            _ => {}
        }
    }
    Err(CliError::Usage(format!("the event stream of {id} ended before the task; run `lanes status {id}`")))
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
