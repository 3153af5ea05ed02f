//! The error of every `lanes` subcommand, printed as `lanes: <error>` with exit code 1.

use crate::dlq;

/// Why a `lanes` command failed; printed as `lanes: <error>`, exit code 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The arguments do not fit together.
    #[error("{0}")]
    Usage(String),
    /// A setting is missing or invalid.
    #[error(transparent)]
    Config(#[from] lanes_core::config::ConfigError),
    /// `lanes dev` could not start or serve.
    #[error(transparent)]
    Local(#[from] lanes_core::local::LocalError),
    /// The server could not be reached.
    #[error("cannot reach {url}: {source}")]
    Unreachable {
        /// Its URL.
        url: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The server answered an error status (its problem document is printed).
    #[error("server answered {0}")]
    Server(u16),
    /// `lanes summarize` failed.
    #[error("summarize: {0}")]
    Summarize(String),
    /// `lanes dlq` failed.
    #[error(transparent)]
    Dlq(#[from] dlq::DlqCliError),
    /// A benchmark failed.
    #[error("benchmark: {0}")]
    Bench(String),
    /// A report could not be written as JSON.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The process's exit: success, or the error printed as `lanes: <error>` and exit code 1.
pub fn exit(result: Result<(), CliError>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lanes: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
