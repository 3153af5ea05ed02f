//! The commits lane's dead-letter queue: what the sweep, `lanes dlq list` and the redrive do with
//! commit messages (the task lanes' are [`crate::dlq`]'s).
//!
//! A commit has no record to settle: its summary, written once, is its answer. So where a task's
//! sweep marks a record `FAILED`, a commit's sweep looks its summary up: a dead-lettered commit
//! whose summary is in the store (another delivery of it was summarized) is settled, and deleted, so
//! the DLQ and its alarm hold only commits still without a summary. Those stay for the operator,
//! whose redrive sends each back to the lane as it is: the worker takes a commit's lock before it
//! looks its summary up, so a commit redriven beside a live delivery is still summarized once.
//! Range messages (a push to expand) go back the same way.

use crate::dlq::{DlqEntry, DlqError, RedriveReport, SweepReport, reason_of};
use crate::domain::commit::{CommitMessage, CommitsMessage};
use crate::domain::{RepoId, Sha};
use crate::ports::{QueueConsume, QueueSend, ReceivedMessage, SummaryStore};
use std::collections::HashSet;
use std::time::Duration;
use tracing::{info, warn};

/// How long a peeked message stays hidden while it is looked at.
const PEEK_VISIBILITY: Duration = Duration::from_secs(30);

/// The commits DLQ and what its operations work with.
pub struct CommitsDlq<'a> {
    /// The commits lane's DLQ.
    pub dlq: &'a dyn QueueConsume,
    /// The summaries.
    pub summaries: &'a dyn SummaryStore,
}

/// The commit a message carries, when it carries one (not a range, not undecodable).
fn commit_of(m: &ReceivedMessage) -> Option<CommitMessage> {
    match serde_json::from_str::<CommitsMessage>(&m.body) {
        Ok(CommitsMessage::Commit(c)) => Some(c),
        _ => None,
    }
}

impl CommitsDlq<'_> {
    /// Up to `max` messages, and the keys (`repo_id:sha`) among their commits that are summarized.
    async fn look(&self, max: usize) -> Result<(Vec<ReceivedMessage>, HashSet<String>), DlqError> {
        let messages = crate::lease::receive_batch(self.dlq, max, PEEK_VISIBILITY).await?;
        let keys: Vec<(RepoId, Sha)> =
            messages.iter().filter_map(commit_of).map(|c| (c.repo_id, c.sha)).collect();
        let mut summarized = HashSet::new();
        // BatchGetItem reads at most 100 keys a call.
        for chunk in keys.chunks(100) {
            match self.summaries.get_summaries(chunk).await {
                Ok(found) => summarized.extend(found.iter().map(|s| s.key())),
                Err(e) => {
                    self.release(&messages).await;
                    return Err(e.into());
                }
            }
        }
        Ok((messages, summarized))
    }

    async fn release(&self, messages: &[ReceivedMessage]) {
        crate::dlq::release(self.dlq, messages).await;
    }

    fn is_summarized(m: &ReceivedMessage, summarized: &HashSet<String>) -> bool {
        commit_of(m).is_some_and(|c| summarized.contains(&c.key()))
    }

    /// Deletes the messages of commits that are summarized; looks at up to `max`. The rest stay,
    /// visible again at once.
    pub async fn sweep(&self, max: usize) -> Result<SweepReport, DlqError> {
        let (messages, summarized) = self.look(max).await?;
        let mut report = SweepReport { seen: messages.len(), ..Default::default() };
        let mut keep = Vec::new();
        for m in messages {
            if Self::is_summarized(&m, &summarized) {
                match self.dlq.delete(&m.receipt).await {
                    Ok(()) => report.settled += 1,
                    Err(e) => {
                        warn!(error = %e, "a summarized commit stays in the DLQ until a later sweep");
                        keep.push(m);
                    }
                }
            } else {
                keep.push(m);
            }
        }
        if report.settled > 0 {
            info!(settled = report.settled, "summarized commits deleted from the commits DLQ");
        }
        self.release(&keep).await;
        Ok(report)
    }

    /// Lists up to `max` messages: the commit each carries, and `SUMMARIZED` for those that are.
    pub async fn list(&self, max: usize) -> Result<Vec<DlqEntry>, DlqError> {
        let (messages, summarized) = self.look(max).await?;
        let out = messages
            .iter()
            .map(|m| DlqEntry {
                message_id: m.message_id.clone(),
                task_id: None,
                commit: commit_of(m).map(|c| c.key()),
                reason: reason_of(m),
                status: Self::is_summarized(m, &summarized).then(|| "SUMMARIZED".to_owned()),
                sent_at_ms: m.sent_at_ms,
            })
            .collect();
        self.release(&messages).await;
        Ok(out)
    }

    /// Sends up to `max` messages back to `lane` (summarized commits are deleted instead); each is
    /// deleted from the DLQ only after its copy was sent. Undecodable messages stay.
    pub async fn redrive(&self, lane: &dyn QueueSend, max: usize) -> Result<RedriveReport, DlqError> {
        let (messages, summarized) = self.look(max).await?;
        let mut report = RedriveReport::default();
        let mut keep = Vec::new();
        let mut failure = None;
        for m in messages {
            if failure.is_some() {
                keep.push(m);
            } else if Self::is_summarized(&m, &summarized) {
                match self.dlq.delete(&m.receipt).await {
                    Ok(()) => report.already_completed += 1,
                    Err(e) => {
                        failure = Some(e);
                        keep.push(m);
                    }
                }
            } else if serde_json::from_str::<CommitsMessage>(&m.body).is_err() {
                report.left.push((m.message_id.clone(), "undecodable message".into()));
                keep.push(m);
            } else {
                let mut routing = crate::dlq::routing(&m);
                routing.insert("lane".to_owned(), "commits".to_owned());
                match lane.send(&m.body, routing).await {
                    Ok(_) => {
                        report.redriven += 1;
                        if let Err(e) = self.dlq.delete(&m.receipt).await {
                            // Sent twice at worst: the worker summarizes a commit once.
                            warn!(error = %e, "a redriven commit stays in the DLQ too");
                        }
                    }
                    Err(e) => {
                        failure = Some(e);
                        keep.push(m);
                    }
                }
            }
        }
        self.release(&keep).await;
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(report),
        }
    }

    /// The redrive through the queue's own move task: the summarized commits are deleted first, then
    /// one move task sends everything left back (nothing needs resetting, so a DLQ of any size may
    /// move). If the move cannot start, the messages are relayed instead ([`Self::redrive`]).
    pub async fn redrive_by_move(&self, lane: &dyn QueueSend, max: usize) -> Result<RedriveReport, DlqError> {
        let swept = self.sweep(max).await?;
        let mut report = RedriveReport { already_completed: swept.settled, ..Default::default() };
        match self.dlq.start_move_back().await {
            Ok(handle) => report.move_task = Some(handle),
            Err(e) => {
                warn!(error = %e, "the move task could not start; relaying the messages instead");
                let relayed = self.redrive(lane, max).await?;
                report.redriven = relayed.redriven;
                report.already_completed += relayed.already_completed;
                report.left = relayed.left;
                report.move_error = Some(e.to_string());
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{SharedClock, SystemClock};
    use crate::domain::TokenUsage;
    use crate::domain::commit::{CommitSummary, Provider, SummarySource};
    use crate::embedded::{EmbeddedDb, EmbeddedQueues, EmbeddedSummaries};
    use std::sync::Arc;

    fn commit(sha: char) -> CommitMessage {
        CommitMessage {
            provider: Provider::Github,
            repo_id: "github:7".parse().unwrap(),
            repo: "o/r".into(),
            sha: sha.to_string().repeat(40).parse().unwrap(),
            subject: "s".into(),
            committed_at_ms: 1,
            escalated: Default::default(),
        }
    }

    /// Three dead-lettered commits, one of them summarized meanwhile, and one undecodable message:
    /// the sweep deletes only the summarized one; the list names each commit; the redrive sends the
    /// other two commits back (no more) and leaves the undecodable one.
    #[tokio::test]
    async fn the_sweep_deletes_summarized_commits_and_the_redrive_sends_the_rest_back() {
        let dir = tempfile::tempdir().unwrap();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let clock: SharedClock = Arc::new(SystemClock);
        let queue = EmbeddedQueues::open(db.clone(), clock, Default::default())
            .await
            .unwrap()
            .queue("commits", "commits-dlq");
        let dlq = queue.dead_letter_queue();
        let summaries = EmbeddedSummaries::new(db);
        for body in ['a', 'b', 'c']
            .map(|c| serde_json::to_string(&commit(c)).unwrap())
            .into_iter()
            .chain(["{".into()])
        {
            queue.send(&body, Default::default()).await.unwrap();
        }
        for m in crate::lease::receive_batch(&queue, 10, Duration::from_secs(30)).await.unwrap() {
            queue.dead_letter(&m, "gave up after 3 attempts: diff source: 502").await.unwrap();
        }
        let b = commit('b');
        let summary = CommitSummary {
            repo_id: b.repo_id.clone(),
            sha: b.sha.clone(),
            repo: b.repo.clone(),
            subject: b.subject.clone(),
            summary: "done elsewhere".into(),
            model: "m".into(),
            source: SummarySource::Llm,
            tokens: TokenUsage::default(),
            diff_tokens: 1,
            diff_cut: false,
            committed_at_ms: 1,
            created_at_ms: 1,
            tier: Default::default(),
        };
        summaries.put_summary(&summary).await.unwrap();
        let ops = CommitsDlq { dlq: &dlq, summaries: &summaries };

        let listed = ops.list(10).await.unwrap();
        assert_eq!(listed.len(), 4);
        let summarized: Vec<_> =
            listed.iter().filter(|e| e.status.as_deref() == Some("SUMMARIZED")).collect();
        assert_eq!(summarized.len(), 1);
        assert_eq!(summarized[0].commit.as_deref(), Some(b.key().as_str()));
        assert!(listed.iter().all(|e| e.reason.contains("diff source: 502")));

        let swept = ops.sweep(10).await.unwrap();
        assert_eq!((swept.seen, swept.settled, swept.marked_failed), (4, 1, 0));
        assert_eq!(ops.list(10).await.unwrap().len(), 3, "the summarized one is gone, the rest visible");

        let report = ops.redrive(&queue, 10).await.unwrap();
        assert_eq!((report.redriven, report.already_completed, report.left.len()), (2, 0, 1));
        let back = crate::lease::receive_batch(&queue, 10, Duration::from_secs(30)).await.unwrap();
        let mut shas: Vec<String> = back
            .iter()
            .map(|m| serde_json::from_str::<CommitMessage>(&m.body).unwrap().sha[..1].to_owned())
            .collect();
        shas.sort();
        assert_eq!(shas, ["a", "c"]);
        assert!(back.iter().all(|m| m.attributes.get("lane").map(String::as_str) == Some("commits")));
        assert_eq!(ops.list(10).await.unwrap().len(), 1, "the undecodable message stays");
    }
}
