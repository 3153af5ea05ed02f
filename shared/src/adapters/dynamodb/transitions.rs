//! The task record's transition table ([`crate::domain::lifecycle`]) as DynamoDB expressions: a
//! row becomes its condition expression (live record, statuses, guards, or no live record at all)
//! and the transition's part of the update expression (status, fence, stamp, expiry). The store
//! adds each command's content (the result, the reason, the attempt count) and sends one
//! conditional request. Only the placeholders an expression uses are sent: DynamoDB refuses
//! unused ones.

use super::{n, s};
use crate::domain::TaskStatus;
use crate::domain::lifecycle::{Command, Expiry, Fence, Guard, Progress, Stamp, transition};
use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::BTreeSet;

/// One conditional write of a task record, being put together.
#[derive(Debug, Default)]
pub(super) struct Write {
    /// The condition expression.
    pub condition: String,
    /// `SET` clauses.
    pub set: Vec<String>,
    /// `ADD` clauses.
    pub add: Vec<String>,
    /// `REMOVE` clauses.
    pub remove: Vec<String>,
    values: Vec<(String, AttributeValue)>,
}

/// A request's update expression, condition expression, values and names.
pub(super) type Bindings = (String, String, Vec<(String, AttributeValue)>, Vec<(&'static str, &'static str)>);

/// Every attribute name the task writes alias (reserved words in DynamoDB).
const NAMES: [(&str, &str); 5] =
    [("#st", "status"), ("#res", "result"), ("#err", "error"), ("#req", "request"), ("#par", "partial")];

fn status_value(status: TaskStatus) -> String {
    format!(":{}", status.as_str().to_ascii_lowercase())
}

impl Write {
    /// The transition of `command`'s row at `now_ms`, the caller's TTL `ttl_secs`.
    pub fn of(command: &Command, now_ms: u64, ttl_secs: u64) -> Self {
        let row = transition(command.event());
        let mut w = Write::default();
        let mut live = vec!["attribute_exists(pk)".to_owned(), "expires_at > :now_s".to_owned()];
        if !row.from.is_empty() {
            let statuses: Vec<String> =
                row.from.iter().map(|st| format!("#st = {}", status_value(*st))).collect();
            live.push(format!("({})", statuses.join(" OR ")));
        }
        for guard in row.guards {
            live.push(
                match guard {
                    Guard::Fence => "fence = :fence",
                    Guard::EnqueuedAt => "enqueued_at_ms = :from",
                    Guard::CreatedBefore => "created_at_ms <= :sent",
                    Guard::Unparked => "attribute_not_exists(parked)",
                    Guard::Parked => "attribute_exists(parked)",
                }
                .to_owned(),
            );
        }
        w.condition = if row.or_absent {
            format!("attribute_not_exists(pk) OR expires_at <= :now_s OR ({})", live.join(" AND "))
        } else {
            live.join(" AND ")
        };
        if let Some(to) = row.to {
            w.set.push("#st = :to".into());
            w.value(":to", s(to.as_str()));
        }
        if row.fence == Fence::Bump {
            w.add.push("fence :one".into());
        }
        match row.stamp {
            Stamp::Nothing => {}
            Stamp::Enqueued => w.set.push("enqueued_at_ms = :to_ms".into()),
            Stamp::Started => w.set.push("started_at_ms = :now".into()),
            Stamp::Finished => w.set.push("finished_at_ms = :now".into()),
        }
        match (row.expiry, command) {
            (Expiry::Keep, _) => {}
            (Expiry::FromNow, _) => {
                w.set.push("expires_at = :exp".into());
                w.value(":exp", n(now_ms / 1000 + ttl_secs));
            }
            (Expiry::Submitted, Command::Submit(r)) => {
                w.set.push("expires_at = :exp".into());
                w.value(":exp", n(r.expires_at));
            }
            (Expiry::Submitted, _) => {}
        }
        if row.progress == Progress::Clear {
            w.remove.extend(["#par", "partial_z"].map(str::to_owned));
        }
        for st in row.from {
            w.value(&status_value(*st), s(st.as_str()));
        }
        w.value(":now_s", n(now_ms / 1000));
        w.value(":now", n(now_ms));
        w.value(":one", n(1));
        if let Some(fence) = command.fence() {
            w.value(":fence", n(fence));
        }
        match command {
            Command::MarkEnqueued(m) => {
                w.value(":from", n(m.from_ms));
                w.value(":to_ms", n(m.to_ms));
            }
            Command::FailUnfinished { sent_before_ms, .. } => w.value(":sent", n(*sent_before_ms)),
            _ => {}
        }
        w
    }

    /// Binds `placeholder` (kept only if an expression uses it).
    pub fn value(&mut self, placeholder: &str, v: AttributeValue) {
        self.values.retain(|(k, _)| k != placeholder);
        self.values.push((placeholder.to_owned(), v));
    }

    /// The update expression.
    pub fn expression(&self) -> String {
        let mut parts = Vec::new();
        for (word, clauses) in [("SET", &self.set), ("ADD", &self.add), ("REMOVE", &self.remove)] {
            if !clauses.is_empty() {
                parts.push(format!("{word} {}", clauses.join(", ")));
            }
        }
        parts.join(" ")
    }

    /// The request's parts: the update and condition expressions and the placeholders and names
    /// they use.
    pub fn bindings(self) -> Bindings {
        let expression = self.expression();
        let used: BTreeSet<&str> = expression
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '#'))
            .chain(
                self.condition
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '#')),
            )
            .filter(|t| t.starts_with(':') || t.starts_with('#'))
            .collect();
        let values = self.values.into_iter().filter(|(k, _)| used.contains(k.as_str())).collect();
        let names = NAMES.into_iter().filter(|(k, _)| used.contains(k)).collect();
        (expression.clone(), self.condition, values, names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lifecycle::{Completion, EnqueueMark};

    #[test]
    fn a_final_write_is_conditional_on_a_live_processing_record_with_the_fence() {
        let mut w =
            Write::of(&Command::Finish { fence: 3, completion: Completion::Failed("x".into()) }, 5_000, 60);
        w.set.push("#err = :err".into());
        w.value(":err", s("x"));
        let (expression, condition, values, names) = w.bindings();
        assert_eq!(
            condition,
            "attribute_exists(pk) AND expires_at > :now_s AND (#st = :processing) AND fence = :fence"
        );
        assert_eq!(
            expression,
            "SET #st = :to, finished_at_ms = :now, expires_at = :exp, #err = :err REMOVE #par, partial_z"
        );
        let keys: Vec<&str> = values.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, [":to", ":exp", ":processing", ":now_s", ":now", ":fence", ":err"]);
        assert_eq!(names, [("#st", "status"), ("#err", "error"), ("#par", "partial")]);
    }

    #[test]
    fn a_re_send_claim_compares_and_sets_and_a_submission_takes_what_is_gone() {
        let mark = EnqueueMark { fence: 0, from_ms: 1, to_ms: 2 };
        let (expression, condition, ..) = Write::of(&Command::MarkEnqueued(mark), 5_000, 60).bindings();
        assert!(
            condition.ends_with("(#st = :pending) AND fence = :fence AND enqueued_at_ms = :from"),
            "{condition}"
        );
        assert_eq!(expression, "SET enqueued_at_ms = :to_ms, expires_at = :exp");
        let claim = Write::of(&Command::Claim, 5_000, 60);
        assert_eq!(
            claim.expression(),
            "SET #st = :to, started_at_ms = :now, expires_at = :exp ADD fence :one"
        );
    }
}
