//! The durable record of a task, the view a client gets, and the queue message. Its transitions
//! are [`super::lifecycle`]'s table (docs/ARCHITECTURE.md, Task lifecycle). Pure: times are passed
//! in.

use super::request::TaskRequest;
use crate::domain::{Kind, Lane, TaskId, TokenUsage};
use serde::{Deserialize, Serialize};

/// Lifecycle of a task record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskStatus {
    /// Accepted and enqueued; no worker has claimed it.
    Pending,
    /// Claimed by a worker (fence > 0).
    Processing,
    /// Terminal: result stored.
    Completed,
    /// Terminal for this submission: retrying cannot fix it. A new submission may start it again.
    Failed,
    /// Terminal: the client cancelled it. A new submission may start it again.
    Cancelled,
}

impl TaskStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "PENDING",
            TaskStatus::Processing => "PROCESSING",
            TaskStatus::Completed => "COMPLETED",
            TaskStatus::Failed => "FAILED",
            TaskStatus::Cancelled => "CANCELLED",
        }
    }

    /// Whether no worker will touch the record again.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled)
    }
}

/// A model's answer as stored and returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskResult {
    /// The generated text.
    pub text: String,
    /// Which model produced it (the offline provider says so).
    pub model: String,
    /// Prompt plus completion tokens.
    pub tokens: TokenUsage,
    /// The model stopped at its token cap (`finish_reason`/`stop_reason` = length): the text is cut.
    #[serde(default)]
    pub truncated: bool,
    /// What the call cost in USD, from the price table at the tier it was served at (`None` for a
    /// model without a price).
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// The tier the provider served the call at: `flex` is charged at its discount.
    #[serde(default)]
    pub tier: crate::domain::tier::Tier,
    /// Where the text is kept when it is too large for the record (`text` is then empty): the key
    /// of its object in the results store. Never in a client's view, which carries the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub text_ref: Option<String>,
    /// Completion tokens not paid for again: the text an earlier run of the task had given, saved
    /// before that run was lost, which this answer continues (0 for an answer made whole).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_saved: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The durable record of one task (one DynamoDB item / one embedded row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The idempotency key.
    pub task_id: TaskId,
    /// Hash of the canonical payload; differs from `task_id` only under an `Idempotency-Key`.
    pub payload_hash: String,
    /// The validated request.
    pub request: TaskRequest,
    /// Lane, from the kind.
    pub lane: Lane,
    /// Where the record is in its life.
    pub status: TaskStatus,
    /// Incremented by every claim; the final write must carry the current value.
    pub fence: u64,
    /// Provider calls that failed for a reason other than throttling (the lane's attempt budget).
    pub attempts: u32,
    /// Random per submission: lets ingress delete only the record it wrote.
    pub nonce: String,
    /// Unix ms.
    pub created_at_ms: u64,
    /// Unix ms of the last send to the queue.
    pub enqueued_at_ms: u64,
    /// Unix ms of the last claim.
    pub started_at_ms: Option<u64>,
    /// Unix ms of the terminal write.
    pub finished_at_ms: Option<u64>,
    /// Set when `Completed`.
    pub result: Option<TaskResult>,
    /// Set when `Failed`.
    pub error: Option<String>,
    /// Unix seconds after which the record counts as absent (DynamoDB TTL attribute).
    pub expires_at: u64,
    /// Set while a provider batch owns the run (`PROCESSING`, its claim's fence kept): no claim
    /// takes it until the batch answers, or gives it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked: Option<Parked>,
    /// The text the run (or a run before it, lost since) had given when it last saved it under its
    /// fence: a takeover continues from it instead of paying for it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<Partial>,
}

/// A run's text so far, saved under its fence ([`crate::tasks::checkpoint`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// The answer's text so far.
    pub text: String,
    /// The fence of the run that gave it.
    pub run: u64,
}

/// A run handed to a provider batch ([`crate::tasks::batches`]): the record of the batch that owns
/// it, and when its answer is due at the latest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parked {
    /// The batch record's key ([`crate::domain::batch::task_batch_key`]).
    pub batch: String,
    /// The task's deadline (Unix ms): its submission plus its `params.deadline_s`. The collector
    /// sends the run on at flex or sync before it, if the batch has not answered.
    pub due_ms: u64,
}

impl TaskRecord {
    /// A fresh `Pending` record.
    pub fn pending(task_id: TaskId, request: TaskRequest, now_ms: u64, ttl_secs: u64) -> Self {
        Self {
            payload_hash: request.payload_hash(),
            lane: request.lane(),
            task_id,
            request,
            status: TaskStatus::Pending,
            fence: 0,
            attempts: 0,
            nonce: uuid::Uuid::new_v4().to_string(),
            created_at_ms: now_ms,
            enqueued_at_ms: now_ms,
            started_at_ms: None,
            finished_at_ms: None,
            result: None,
            error: None,
            expires_at: now_ms / 1000 + ttl_secs,
            parked: None,
            partial: None,
        }
    }

    /// Whether the TTL has passed (DynamoDB deletes lazily, so reads must check too).
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at.saturating_mul(1000) <= now_ms
    }

    /// The public view of the record.
    pub fn view(&self) -> TaskView {
        TaskView {
            task_id: self.task_id.clone(),
            status: self.status,
            lane: self.lane,
            kind: self.request.kind,
            result: self.result.clone(),
            error: self.error.as_deref().map(crate::domain::failure::TaskError::from_stored),
            attempts: self.attempts,
            created_at_ms: self.created_at_ms,
            finished_at_ms: self.finished_at_ms,
            tier: self.waiting().map(|_| crate::domain::tier::Tier::Batch),
            expected_by_ms: self.waiting().map(|p| p.due_ms),
        }
    }

    /// The batch the run waits on, while it does (a finished record keeps no claim on one).
    pub fn waiting(&self) -> Option<&Parked> {
        self.parked.as_ref().filter(|_| self.status == TaskStatus::Processing)
    }
}

/// The JSON a client sees for a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskView {
    /// The task id.
    #[schema(value_type = String, pattern = "^[0-9a-f]{64}$")]
    pub task_id: TaskId,
    /// Current status.
    pub status: TaskStatus,
    /// Lane.
    pub lane: Lane,
    /// Kind.
    pub kind: Kind,
    /// Result when completed.
    pub result: Option<TaskResult>,
    /// Why it failed (or, while it runs, why its last call failed): a stable code and its message.
    pub error: Option<crate::domain::failure::TaskError>,
    /// Provider calls that failed (throttling excluded).
    #[serde(default)]
    pub attempts: u32,
    /// When the task was accepted, Unix ms.
    #[serde(default)]
    pub created_at_ms: u64,
    /// When it finished (completed, failed or cancelled), Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// While a provider batch answers it: `batch` (half price). A finished task's tier is its
    /// result's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<crate::domain::tier::Tier>,
    /// While a provider batch answers it: when the answer is due at the latest, Unix ms (its
    /// submission plus `params.deadline_s`; what the batch has not answered by then is answered
    /// at flex or sync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_by_ms: Option<u64>,
}

/// The body of a queue message: small on purpose; the worker reads the request from the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskMessage {
    /// Task id.
    pub task_id: TaskId,
    /// Lane it was sent to.
    pub lane: Lane,
    /// Kind.
    pub kind: Kind,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_statuses() {
        use TaskStatus::*;
        assert!(Completed.is_terminal() && Failed.is_terminal() && Cancelled.is_terminal());
        assert!(!Pending.is_terminal() && !Processing.is_terminal());
    }

    #[test]
    fn message_round_trips_and_rejects_garbage() {
        let m = TaskMessage {
            task_id: TaskId::parse(&"a".repeat(64)).unwrap(),
            lane: Lane::Interactive,
            kind: Kind::Explain,
        };
        let s = serde_json::to_string(&m).unwrap_or_default();
        assert_eq!(serde_json::from_str::<TaskMessage>(&s).ok(), Some(m));
        assert!(serde_json::from_str::<TaskMessage>("{\"task_id\":1}").is_err());
    }
}
