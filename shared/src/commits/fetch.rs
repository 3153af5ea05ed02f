//! What a commits batch reads from the Git host: each remaining commit's diff, fetched and trimmed
//! on its own clock (so one slow host or huge diff is handed back alone), and the commits of an
//! incomplete push's range, listed and sent as one message each.

use super::budget;
use super::group::{Group, GroupEnd};
use super::prompt;
use super::report::Served;
use super::worker::{CommitsWorker, LANE, Pending};
use crate::domain::commit::{PushRange, SummarySource};
use crate::domain::{Sha, TokenUsage};
use crate::lease::{self, Outcome, full_jitter_backoff};
use crate::ports::{DiffError, QueueConsume, ReceivedMessage};
use futures::future::join_all;
use std::sync::Arc;
use tokio::time::Instant;
use tracing::{info, warn};

impl CommitsWorker {
    /// Lists the commits of an incomplete push with the host's API and sends one message per commit
    /// the payload did not list (within the fetch deadline); the range message is acked once they
    /// are all sent. A commit sent twice after a partial failure is summarized once anyway.
    pub(super) async fn expand(
        &self,
        queue: &dyn QueueConsume,
        m: &ReceivedMessage,
        range: &PushRange,
        list_by: Instant,
    ) -> (Outcome, u64) {
        let listed: std::collections::HashSet<&Sha> = range.listed.iter().collect();
        let listing = tokio::time::timeout_at(list_by, self.diffs.commits_between(range)).await;
        let failed = |reason: String| async move {
            warn!(repo_id = %range.repo_id, reason, "push range not expanded");
            if lease::is_last_delivery(queue, m) {
                let reason = format!("gave up after {} attempts: {reason}", m.receive_count);
                lease::dead_letter(&self.metrics, queue, m, reason, LANE, "attempts").await
            } else {
                lease::hand_back(queue, m, full_jitter_backoff(&self.lease, m.receive_count), &reason, LANE)
                    .await
            }
        };
        let commits = match listing {
            Ok(Ok(commits)) => commits,
            Ok(Err(DiffError::Permanent(reason))) => {
                let reason = format!("push range {}..{} not listed: {reason}", range.base, range.head);
                return (lease::dead_letter(&self.metrics, queue, m, reason, LANE, "permanent").await, 0);
            }
            Ok(Err(DiffError::Refused(reason))) => {
                warn!(repo_id = %range.repo_id, reason, "push range refused: not the host's repository");
                let reason = format!("push range {}..{} refused: {reason}", range.base, range.head);
                return (lease::dead_letter(&self.metrics, queue, m, reason, LANE, "identity").await, 0);
            }
            // Reasons read `kind: detail`: the kind is the metrics' `reason` dimension.
            Ok(Err(DiffError::Retryable { message, .. })) => {
                return (failed(format!("range listing: {message}")).await, 0);
            }
            Err(_) => return (failed("range listing: timed out".into()).await, 0),
        };
        let messages: Vec<(String, std::collections::BTreeMap<String, String>)> = commits
            .iter()
            .filter(|c| !listed.contains(&c.sha) && c.validate().is_ok())
            .filter_map(|c| Some((serde_json::to_string(c).ok()?, c.send_attributes())))
            .collect();
        match self.send.send_batch(&messages).await {
            Ok(unsent) if unsent.is_empty() => {
                info!(repo_id = %range.repo_id, sent = messages.len(), "push range expanded");
                (lease::ack(queue, m).await, messages.len() as u64)
            }
            Ok(unsent) => {
                (failed(format!("commits not sent: {} of {}", unsent.len(), messages.len())).await, 0)
            }
            Err(e) => (failed(format!("commits not sent: {e}")).await, 0),
        }
    }

    /// Fetches and trims the remaining diffs; noise-only commits are summarized by rule here.
    pub(super) async fn fetch_and_trim(&self, groups: &mut [Group]) -> Vec<Pending> {
        let open: Vec<usize> = Self::open(groups).collect();
        let slots = Arc::new(tokio::sync::Semaphore::new(self.config.diff_concurrency.max(1)));
        let max_tokens = self.config.diff_tokens;
        let fetched = join_all(open.iter().map(|&g| {
            let (diffs, slots, commit) = (self.diffs.clone(), slots.clone(), groups[g].commit.clone());
            let deadline = self.config.fetch_deadline;
            async move {
                let _slot = slots.acquire_owned().await;
                // Each commit on its own clock (from when it got a slot): one slow host or huge diff
                // is handed back alone while the rest of the batch goes on.
                let work = async {
                    let diff = diffs.diff(&commit).await?;
                    let (sha, subject) = (commit.sha.clone(), commit.subject.clone());
                    let trim = move || {
                        let trimmed = budget::trim(&diff, max_tokens);
                        let section = (!trimmed.noise_only).then(|| {
                            let subject = if subject.is_empty() { "(unknown)" } else { &subject };
                            let section = prompt::section(&sha, subject, &trimmed.text);
                            let tokens = budget::count_tokens(&section);
                            (section, tokens)
                        });
                        (trimmed, section)
                    };
                    // Tokenizing a large diff, and then its prompt section, is CPU work: off the
                    // runtime's threads, which the heartbeat shares. A current-thread runtime (the
                    // simulation's, on a paused clock) runs it in place: blocking threads finish in
                    // wall-clock order, and a seeded history must not depend on it.
                    if tokio::runtime::Handle::current().runtime_flavor()
                        == tokio::runtime::RuntimeFlavor::CurrentThread
                    {
                        return Ok(trim());
                    }
                    tokio::task::spawn_blocking(trim).await.map_err(|e| DiffError::Retryable {
                        message: format!("trim task: {e}"),
                        retry_after: None,
                    })
                };
                let trimmed =
                    tokio::time::timeout(deadline, work).await.map_err(|_| DiffError::Retryable {
                        message: format!("diff not fetched within {} s", deadline.as_secs()),
                        retry_after: None,
                    })??;
                Ok::<_, DiffError>((g, trimmed))
            }
        }))
        .await;
        let mut pending = Vec::new();
        for (r, &g) in fetched.into_iter().zip(&open) {
            let commit = &groups[g].commit;
            match r {
                Ok((_, (trimmed, None))) => {
                    let summary = self.summary(
                        commit,
                        trimmed.rule_summary(),
                        "rule",
                        SummarySource::Rule,
                        TokenUsage::default(),
                        &trimmed,
                    );
                    groups[g].outcome = Some(self.write(&groups[g], summary, Served::Rule).await);
                }
                Ok((_, (trimmed, Some((section, section_tokens))))) => {
                    pending.push(Pending { group: g, trimmed, section, section_tokens });
                }
                Err(e) => groups[g].outcome = Some(self.unfetched(&groups[g], e)),
            }
        }
        pending
    }

    /// How a commit whose diff could not be had ends: dead-lettered when retrying cannot help
    /// (counted as `identity` when its repository is not the host's for its id), else retried.
    fn unfetched(&self, group: &Group, e: DiffError) -> GroupEnd {
        match e {
            DiffError::Permanent(reason) => {
                GroupEnd::DeadLetter(format!("diff unavailable: {reason}"), "permanent")
            }
            DiffError::Refused(reason) => {
                let commit = &group.commit;
                warn!(repo_id = %commit.repo_id, sha = %commit.sha, reason, "commit refused: not the host's repository");
                GroupEnd::DeadLetter(format!("repository identity: {reason}"), "identity")
            }
            DiffError::Retryable { message, retry_after } => GroupEnd::Retry {
                after: full_jitter_backoff(&self.lease, group.receives).max(retry_after.unwrap_or_default()),
                reason: format!("diff source: {message}"),
            },
        }
    }
}
