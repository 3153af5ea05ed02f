//! Glue between Lambda events and the core, shared by `functions/*`: logging setup, SQS record
//! decoding, and the partial-batch response built from worker outcomes.

use crate::config::{ConfigError, require_env};
use crate::domain::Lane;
use crate::ports::ReceivedMessage;
use crate::worker::Outcome;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsMessage};
use std::collections::BTreeMap;

/// JSON logs with the level from `RUST_LOG` (default `info`), as CloudWatch wants them.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().json().with_env_filter(filter).without_time().try_init();
}

/// Which adapters a function runs on, from `LANES_BACKEND`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Embedded adapters in `LANES_DATA_DIR` (default `/tmp/lanes`): for `cargo lambda watch` runs.
    Embedded {
        /// Data dir.
        data_dir: std::path::PathBuf,
    },
    /// SQS, DynamoDB and Redis.
    Aws,
}

impl Backend {
    /// Reads `LANES_BACKEND` (`embedded` or `aws`, default `aws`) and `LANES_DATA_DIR`.
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var("LANES_BACKEND").unwrap_or_else(|_| "aws".into()).as_str() {
            "embedded" => Ok(Backend::Embedded {
                data_dir: std::env::var("LANES_DATA_DIR").unwrap_or_else(|_| "/tmp/lanes".into()).into(),
            }),
            "aws" => Ok(Backend::Aws),
            other => Err(ConfigError::Invalid {
                name: "LANES_BACKEND",
                reason: format!("`{other}`; expected `embedded` or `aws`"),
            }),
        }
    }

    /// Fails for the AWS backend, whose adapters are not in this build yet, naming what is missing.
    pub fn require_embedded(&self, function: &str) -> Result<std::path::PathBuf, ConfigError> {
        match self {
            Backend::Embedded { data_dir } => Ok(data_dir.clone()),
            Backend::Aws => Err(ConfigError::Invalid {
                name: "LANES_BACKEND",
                reason: format!(
                    "the {function} function needs the AWS adapters (SQS, DynamoDB, Redis), which this build does \
                     not include yet; set LANES_BACKEND=embedded for a local run"
                ),
            }),
        }
    }
}

/// The error a function gives at cold start when it needs AWS adapters this build does not have.
pub fn needs_aws_adapters(function: &str) -> ConfigError {
    ConfigError::Invalid {
        name: "LANES_BACKEND",
        reason: format!(
            "the {function} function needs the SQS/DynamoDB/Redis adapters, which this build does not include yet"
        ),
    }
}

/// The webhook function's router until the commits pipeline exists: a 501 problem for every request,
/// so a misrouted delivery is visible to the sender (GitHub shows it and can redeliver).
pub fn webhook_router() -> axum::Router {
    use crate::problem::Problem;
    use axum::http::StatusCode;
    axum::Router::new().fallback(|| async {
        Problem::new(
            StatusCode::NOT_IMPLEMENTED,
            "not-implemented",
            "Webhooks are not handled yet",
            "this deployment does not process push events yet; the delivery was not accepted",
        )
    })
}

/// Reads the worker's lane from `LANES_LANE`.
pub fn lane_from_env() -> Result<Lane, ConfigError> {
    require_env("LANES_LANE")?.parse().map_err(|reason| ConfigError::Invalid { name: "LANES_LANE", reason })
}

/// Why an SQS record could not become a [`ReceivedMessage`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// A field SQS always sets is absent.
    #[error("SQS record without {0}")]
    Missing(&'static str),
}

/// Converts one record of an `SqsEvent`.
pub fn received_from_sqs(record: &SqsMessage) -> Result<ReceivedMessage, RecordError> {
    let message_id =
        record.message_id.clone().filter(|s| !s.is_empty()).ok_or(RecordError::Missing("messageId"))?;
    let receipt = record.receipt_handle.clone().ok_or(RecordError::Missing("receiptHandle"))?;
    let receive_count =
        record.attributes.get("ApproximateReceiveCount").and_then(|v| v.parse().ok()).unwrap_or(1);
    let sent_at_ms = record.attributes.get("SentTimestamp").and_then(|v| v.parse().ok()).unwrap_or(0);
    let attributes: BTreeMap<String, String> = record
        .message_attributes
        .iter()
        .filter_map(|(k, v)| v.string_value.clone().map(|s| (k.clone(), s)))
        .collect();
    Ok(ReceivedMessage {
        message_id,
        receipt,
        body: record.body.clone().unwrap_or_default(),
        receive_count,
        sent_at_ms,
        attributes,
    })
}

/// The partial-batch response: one failure per message that stays in the queue. Never an empty id
/// (Lambda would fail the whole batch).
pub fn batch_response<'a>(outcomes: impl IntoIterator<Item = (&'a str, &'a Outcome)>) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for (id, outcome) in outcomes {
        if outcome.is_batch_item_failure() && !id.is_empty() {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id.to_owned();
            response.batch_item_failures.push(failure);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn records_and_batch_failures() {
        let mut record = SqsMessage::default();
        assert_eq!(received_from_sqs(&record), Err(RecordError::Missing("messageId")));
        record.message_id = Some("m1".into());
        record.receipt_handle = Some("r1".into());
        record.body = Some("{}".into());
        record.attributes.insert("ApproximateReceiveCount".into(), "3".into());
        let m = received_from_sqs(&record).unwrap();
        assert_eq!((m.message_id.as_str(), m.receive_count), ("m1", 3));

        let retry = Outcome::Retry { after: Duration::from_secs(1), reason: "x".into() };
        let outcomes =
            [("a", &Outcome::Acked), ("b", &retry), ("c", &Outcome::LeaseLost), ("", &Outcome::LeaseLost)];
        let resp = batch_response(outcomes);
        let sample: aws_lambda_events::event::sqs::SqsEvent =
            serde_json::from_str(include_str!("../../events/sqs-interactive.json")).unwrap();
        let m = received_from_sqs(&sample.records[0]).unwrap();
        assert_eq!((m.receive_count, m.attributes["lane"].as_str()), (1, "interactive"));
        assert!(serde_json::from_str::<crate::domain::TaskMessage>(&m.body).is_ok());
        let ids: Vec<&str> = resp.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
    }
}
