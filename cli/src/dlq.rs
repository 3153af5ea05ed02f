//! `lanes dlq list|redrive --lane L`: a lane's dead-letter queue, through a running `lanes dev`
//! (its admin routes) or straight on AWS with the functions' environment (`--backend aws`).

use clap::{Args, Subcommand, ValueEnum};
use lanes_core::clock::SystemClock;
use lanes_core::config::{IngressConfig, WorkerConfig};
use lanes_core::dlq_admin::{ADMIN_HEADER, Admin, DlqOp};
use lanes_core::domain::Lane;
use std::sync::Arc;

/// `lanes dlq …`.
#[derive(Subcommand)]
pub enum DlqCommand {
    /// List the messages of a lane's DLQ with their task's status, or their commit and whether it
    /// is summarized (the messages stay).
    List(Target),
    /// Send a lane's DLQ messages back to the lane, resetting each task's record so it runs again
    /// (a commit goes back as it is; a summarized one is deleted).
    Redrive {
        #[command(flatten)]
        target: Target,
        /// Reset the records, then move the messages with one SQS message move task
        /// (`StartMessageMoveTask`) instead of relaying them one by one; follow it with `lanes dlq moves`.
        #[arg(long)]
        move_task: bool,
    },
    /// The DLQ's recent message move tasks (`ListMessageMoveTasks`).
    Moves(Target),
}

/// Which DLQ, where.
#[derive(Args)]
pub struct Target {
    /// The lane.
    #[arg(long, value_enum)]
    lane: DlqLane,
    /// A running `lanes dev`.
    #[arg(long, default_value = "http://127.0.0.1:3000", conflicts_with = "backend")]
    server: String,
    /// `aws`: SQS and DynamoDB from the functions' environment (LANES_TABLE, LANES_QUEUE_URL_*,
    /// REDIS_URL, the AWS credentials chain) instead of a server.
    #[arg(long, value_parser = ["aws"])]
    backend: Option<String>,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// The lanes, each with its DLQ.
#[derive(Clone, Copy, ValueEnum)]
enum DlqLane {
    Interactive,
    Synthesis,
    Commits,
}

impl From<DlqLane> for Lane {
    fn from(l: DlqLane) -> Self {
        match l {
            DlqLane::Interactive => Lane::Interactive,
            DlqLane::Synthesis => Lane::Synthesis,
            DlqLane::Commits => Lane::Commits,
        }
    }
}

/// Errors of `lanes dlq`.
#[derive(Debug, thiserror::Error)]
pub enum DlqCliError {
    /// The server could not be reached or answered an error.
    #[error("{0}")]
    Server(String),
    /// Building the AWS adapters failed.
    #[error("AWS backend: {0}")]
    Backend(String),
    /// The operation failed.
    #[error(transparent)]
    Dlq(#[from] lanes_core::dlq::DlqError),
}

/// Runs one `lanes dlq` command and prints its result.
pub async fn run(command: DlqCommand) -> Result<(), DlqCliError> {
    let (op, target) = match command {
        DlqCommand::List(t) => (DlqOp::List, t),
        DlqCommand::Redrive { target, move_task: false } => (DlqOp::Redrive, target),
        DlqCommand::Redrive { target, move_task: true } => (DlqOp::RedriveByMove, target),
        DlqCommand::Moves(t) => (DlqOp::Moves, t),
    };
    let lane: Lane = target.lane.into();
    let answer = match target.backend {
        Some(_) => on_aws(lane, op).await?,
        None => on_server(&target.server, lane, op).await?,
    };
    if target.json {
        println!("{answer}");
    } else if op == DlqOp::Moves {
        let moves = answer["moves"].as_array().cloned().unwrap_or_default();
        println!("{:<10}  {:>8}  {:>8}  {:<20}  failure", "status", "moved", "to move", "started (unix ms)");
        for m in &moves {
            println!(
                "{:<10}  {:>8}  {:>8}  {:<20}  {}",
                m["status"].as_str().unwrap_or(""),
                m["moved"],
                m["to_move"].as_u64().map_or("-".to_owned(), |n| n.to_string()),
                m["started_at_ms"],
                m["failure_reason"].as_str().unwrap_or("")
            );
        }
        println!("{} move task(s) of the {lane} DLQ", moves.len());
    } else if op != DlqOp::List {
        let r = &answer["report"];
        let how = match r["move_task"].as_str() {
            Some(handle) => format!("made runnable and moved by move task {handle}"),
            None => "sent back".to_owned(),
        };
        println!(
            "{lane}: {} message(s) {how}, {} already completed or summarized (deleted), {} left in the DLQ",
            r["redriven"],
            r["already_completed"],
            r["left"].as_array().map_or(0, Vec::len)
        );
        for left in r["left"].as_array().into_iter().flatten() {
            println!("  left {}: {}", left[0].as_str().unwrap_or(""), left[1].as_str().unwrap_or(""));
        }
    } else {
        let messages = answer["messages"].as_array().cloned().unwrap_or_default();
        println!("{:<36}  {:<12}  {:<10}  reason", "message", "task/commit", "status");
        for m in &messages {
            // A task by the first 12 of its id; a commit by `repo_id:sha`.
            let what = match (m["task_id"].as_str(), m["commit"].as_str()) {
                (Some(t), _) => t[..12.min(t.len())].to_owned(),
                (None, Some(c)) => c.to_owned(),
                (None, None) => "-".to_owned(),
            };
            println!(
                "{:<36}  {:<12}  {:<10}  {}",
                m["message_id"].as_str().unwrap_or(""),
                what,
                m["status"].as_str().unwrap_or("-"),
                m["reason"].as_str().unwrap_or("")
            );
        }
        println!("{} message(s) in the {lane} DLQ", messages.len());
    }
    Ok(())
}

async fn on_server(server: &str, lane: Lane, op: DlqOp) -> Result<serde_json::Value, DlqCliError> {
    let base = server.trim_end_matches('/');
    let client = reqwest::Client::new();
    let request = match op {
        DlqOp::List => client.get(format!("{base}/admin/dlq/{lane}")),
        DlqOp::Redrive => client.post(format!("{base}/admin/dlq/{lane}/redrive")).header(ADMIN_HEADER, "1"),
        DlqOp::RedriveByMove => {
            client.post(format!("{base}/admin/dlq/{lane}/redrive?by=move")).header(ADMIN_HEADER, "1")
        }
        DlqOp::Moves => client.get(format!("{base}/admin/dlq/{lane}/moves")),
    };
    let resp = request.send().await.map_err(|e| DlqCliError::Server(format!("cannot reach {base}: {e}")))?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.map_err(|e| DlqCliError::Server(e.to_string()))?;
    if !status.is_success() {
        return Err(DlqCliError::Server(format!("server answered {status}: {body}")));
    }
    Ok(body)
}

async fn on_aws(lane: Lane, op: DlqOp) -> Result<serde_json::Value, DlqCliError> {
    let config =
        lanes_core::wiring::AwsBackendConfig::from_env().map_err(|e| DlqCliError::Backend(e.to_string()))?;
    let adapters =
        lanes_core::wiring::aws(&config, &[lane]).await.map_err(|e| DlqCliError::Backend(e.to_string()))?;
    let admin = Admin {
        adapters,
        metrics: lanes_core::metrics::Metrics::new(),
        clock: Arc::new(SystemClock),
        pending_ttl_secs: IngressConfig::from_env()
            .map_err(|e| DlqCliError::Backend(e.to_string()))?
            .pending_ttl_secs,
        record_ttl_secs: WorkerConfig::default().record_ttl_secs,
    };
    Ok(admin.answer(lane, op).await?)
}
