//! Why a task failed, as a client may see it: a stable [`FailureCode`] and a fixed message per code.
//! A stored reason is `<code>: <detail>`; the detail (a provider's or AWS's own text, which can name
//! accounts, roles, internal hosts or a masked key) stays in the record and the logs for operators,
//! and a view shows only the code and its message ([`TaskError::from_stored`]). A reason without a
//! known code reads as `internal`, so no new failure path can leak text by forgetting one.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The stable code of a failure. New codes may be added; existing ones keep their meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureCode {
    /// The provider refused the request (a 4xx other than 429): retrying the same task will not help.
    ProviderRefused,
    /// The provider kept failing (5xx, timeouts, connection errors) until the lane's attempt budget
    /// was spent.
    ProviderUnavailable,
    /// The last provider call failed and the task will be tried again (on a task still running).
    ProviderRetrying,
    /// No worker started the task within its lane's maximum task age.
    Expired,
    /// A budget of the tenant or project renews only after the lane's maximum task age.
    OverBudget,
    /// The queue could not hold the task for a later attempt at its last delivery.
    NotScheduled,
    /// The task's message failed its deliveries and went to the dead-letter queue.
    DeadLettered,
    /// The result is larger than the store can hold.
    ResultTooLarge,
    /// Anything else.
    Internal,
}

impl FailureCode {
    const ALL: [FailureCode; 9] = [
        Self::ProviderRefused,
        Self::ProviderUnavailable,
        Self::ProviderRetrying,
        Self::Expired,
        Self::OverBudget,
        Self::NotScheduled,
        Self::DeadLettered,
        Self::ResultTooLarge,
        Self::Internal,
    ];

    /// The code as written, `snake_case`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProviderRefused => "provider_refused",
            Self::ProviderUnavailable => "provider_unavailable",
            Self::ProviderRetrying => "provider_retrying",
            Self::Expired => "expired",
            Self::OverBudget => "over_budget",
            Self::NotScheduled => "not_scheduled",
            Self::DeadLettered => "dead_lettered",
            Self::ResultTooLarge => "result_too_large",
            Self::Internal => "internal",
        }
    }

    /// What a client is told.
    pub fn message(self) -> &'static str {
        match self {
            Self::ProviderRefused => {
                "The model provider refused the request; submitting it again will not help."
            }
            Self::ProviderUnavailable => {
                "The model provider kept failing; the task gave up after its lane's attempts."
            }
            Self::ProviderRetrying => "The last model call failed; the task will be tried again.",
            Self::Expired => "The task was not started within its lane's maximum task age.",
            Self::OverBudget => {
                "A budget of the tenant or project renews only after the lane's maximum task age."
            }
            Self::NotScheduled => "The task could not be scheduled for another attempt.",
            Self::DeadLettered => "The task's deliveries kept failing.",
            Self::ResultTooLarge => "The result is larger than the service can store.",
            Self::Internal => "The task failed; the service's logs hold the detail.",
        }
    }

    /// A reason to store: the code, then the detail for operators.
    pub fn reason(self, detail: impl fmt::Display) -> String {
        format!("{}: {detail}", self.as_str())
    }

    /// The code a stored reason starts with; [`FailureCode::Internal`] for any other text.
    pub fn of(stored: &str) -> Self {
        let head = stored.split(':').next().unwrap_or("");
        Self::ALL.into_iter().find(|c| c.as_str() == head).unwrap_or(Self::Internal)
    }
}

impl fmt::Display for FailureCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure as a task's view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskError {
    /// The stable code.
    pub code: FailureCode,
    /// A fixed message for the code (never the provider's or the store's own text).
    pub message: String,
}

impl TaskError {
    /// The view of a stored reason.
    pub fn from_stored(stored: &str) -> Self {
        let code = FailureCode::of(stored);
        Self { code, message: code.message().to_owned() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_shows_the_code_and_its_message_never_the_detail() {
        let stored = FailureCode::ProviderRefused
            .reason("bedrock: AccessDeniedException: User arn:aws:sts::123456789012:assumed-role/lanes-worker is not authorized");
        let view = TaskError::from_stored(&stored);
        assert_eq!(view.code, FailureCode::ProviderRefused);
        let json = serde_json::to_string(&view).unwrap_or_default();
        assert!(json.contains("\"provider_refused\""), "{json}");
        assert!(!json.contains("123456789012") && !json.contains("arn:"), "{json}");
        for code in FailureCode::ALL {
            assert_eq!(FailureCode::of(&code.reason("x: y")), code, "{code}");
        }
        // Text without a known code, an old record's or a new path's, reads as internal.
        for other in ["connection failed: http://10.0.0.7:8000/v1", "", "provider_refusedx: y"] {
            assert_eq!(TaskError::from_stored(other).code, FailureCode::Internal, "{other}");
        }
    }
}
