//! `lanes`: the command-line entry point, one module per subcommand (dev, submit/status, summarize,
//! dlq, bench, sim), each failing with [`CliError`].

mod allocator;
mod bench;
mod dev;
mod dlq;
mod error;
mod sim;
mod summarize;
mod tasks;

use clap::{Parser, Subcommand};
pub use error::CliError;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "lanes", version, about = "AI code-generation and commit-summary lanes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run ingress, queues, store, pool and the offline provider in one process.
    Dev(dev::DevArgs),
    /// Submit a task to a running server.
    Submit(tasks::SubmitArgs),
    /// Show a task.
    Status(tasks::StatusArgs),
    /// Summarize a local repository's commits (embedded defaults; a second run answers from the store).
    Summarize(summarize::SummarizeArgs),
    /// A task lane's dead-letter queue: list it, or redrive it.
    Dlq {
        #[command(subcommand)]
        what: dlq::DlqCommand,
    },
    /// Benchmarks that print a report with the command that reproduces it.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCommand,
    },
    /// The deterministic lifecycle simulation: histories from seeds, invariants checked.
    Sim(sim::SimArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let _telemetry = lanes_core::adapters::otlp::init_cli_tracing();
    error::exit(match Cli::parse().command {
        Command::Dev(args) => dev::run(args).await,
        Command::Submit(args) => tasks::submit(args).await,
        Command::Status(args) => tasks::status(args).await,
        Command::Summarize(args) => summarize::run(args).await,
        Command::Dlq { what } => dlq::run(what).await.map_err(CliError::from),
        Command::Bench { what } => bench::run(what).await,
        Command::Sim(args) => sim::run(args),
    })
}
