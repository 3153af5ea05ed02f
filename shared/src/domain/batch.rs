//! Provider batches of the commits lane: the record that owns a batch's commits from submission
//! to collection, the ids derived from the commits it carries, and the collector's rule for each
//! tick ([`step`]). Pure.
//!
//! A batch's life, each step durable before the next:
//! 1. the worker writes the record in phase [`BatchPhase::Submitting`] (with a marker per commit),
//!    looks its key up at the provider, and submits only if no batch carries it;
//! 2. it records the provider's id ([`BatchPhase::Open`]) and only then acks the commits' messages:
//!    from here the record owns them;
//! 3. the collector polls it, writes each answer once, and sends what was not answered back to the
//!    queue at the next tier; a batch that would miss its deadline is cancelled
//!    ([`BatchPhase::Cancelling`]) and, if still unanswered close to it, escalated at once.
//!
//! A crash between submission and record leaves a `Submitting` record: the collector looks its key
//! up at the provider (a batch carries it in its metadata) and adopts the batch it finds, or sends
//! the commits back when none was made. Nothing is submitted twice, and nothing is dropped.

use super::commit::CommitMessage;
use super::tier::{ESCALATE_BEFORE, FLEX_HEADROOM};
use super::{Kind, Lane, TaskId};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// Most commits one batch carries: its record stays far under DynamoDB's 400 KB item.
pub const MAX_BATCH_COMMITS: usize = 400;

/// How long a worker may take between writing a `Submitting` record and recording the provider's
/// id: a Lambda invocation's longest life. A record still submitting after this was left by a crash.
pub const SUBMIT_GRACE: Duration = Duration::from_secs(15 * 60);

/// The longest a worker's lookup and submission may take: past it the record owns the commits and
/// the collector finds out what became of them. Well inside [`SUBMIT_GRACE`], so the collector
/// never looks a submission up while it is under way.
pub const SUBMIT_LIMIT: Duration = Duration::from_secs(5 * 60);

/// Where a batch is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchPhase {
    /// Recorded before submission; the provider's id is not known yet.
    Submitting,
    /// Submitted; the provider's id is recorded and the commits' messages are acked.
    Open,
    /// Its cancellation was asked for (it would have missed its deadline).
    Cancelling,
}

/// One commit a batch carries, with what its summary record needs from the worker's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchedCommit {
    /// The commit as its message carried it.
    pub commit: CommitMessage,
    /// When it was first enqueued (Unix ms): its deadline counts from here wherever it goes next.
    pub enqueued_at_ms: u64,
    /// Tokens of its (trimmed) diff.
    pub diff_tokens: u64,
    /// Whether the diff was cut to the budget.
    pub diff_cut: bool,
    /// Tokens of its prompt section: its share of the call's prompt tokens.
    pub section_tokens: u64,
}

/// One request of a batch: the commits of one repository, packed as a synchronous call would be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchCall {
    /// The request's id within the batch ([`custom_id`]).
    pub custom_id: String,
    /// The commits it asks about.
    pub commits: Vec<BatchedCommit>,
}

/// The durable record of one provider batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchRecord {
    /// Derived from the calls it carries ([`batch_key`]); also in the provider batch's metadata.
    pub key: String,
    /// The route (`provider:model`) it was submitted to.
    pub route: String,
    /// The provider's batch id, once known.
    pub provider_id: Option<String>,
    /// Where it is.
    pub phase: BatchPhase,
    /// Its requests.
    pub calls: Vec<BatchCall>,
    /// When it was recorded (Unix ms).
    pub created_at_ms: u64,
    /// The earliest deadline of its commits (Unix ms).
    pub deadline_ms: u64,
    /// Whether its unanswered commits were already sent back at the next tier (late answers are
    /// still written, once).
    #[serde(default)]
    pub escalated: bool,
    /// The task run it carries, for a batch of a synthesis task (its one request; `calls` is then
    /// empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<BatchedTask>,
}

/// A task run a batch carries: a synthesis task that opted in with `params.deadline_s`, parked in
/// its record under the claim's fence until the batch answers ([`crate::domain::Parked`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchedTask {
    /// The task.
    pub task_id: TaskId,
    /// The claim's fence: the collector's final write carries it.
    pub fence: u64,
    /// Its lane, whose queue it goes back to if the batch does not answer.
    pub lane: Lane,
    /// Its kind (for the message that sends it back).
    pub kind: Kind,
    /// The request's id within the batch.
    pub custom_id: String,
    /// The prompt tokens its request carries (an estimate): what it holds of the batch queue.
    pub tokens: u64,
}

impl BatchRecord {
    /// Every commit it carries.
    pub fn commits(&self) -> impl Iterator<Item = &BatchedCommit> {
        self.calls.iter().flat_map(|c| &c.commits)
    }

    /// The prompt tokens its requests carry (their commits' sections, or its task's prompt): what
    /// it holds of the provider's batch queue.
    pub fn tokens(&self) -> u64 {
        self.commits().map(|c| c.section_tokens).sum::<u64>() + self.task.as_ref().map_or(0, |t| t.tokens)
    }

    /// The keys of its markers: one per commit (`repo_id:sha`), or its task's ([`task_marker`]).
    pub fn markers(&self) -> Vec<String> {
        let commits = self.commits().map(|c| c.commit.key());
        commits.chain(self.task.as_ref().map(|t| task_marker(&t.task_id))).collect()
    }

    /// How many requests it carries.
    pub fn requests(&self) -> usize {
        self.calls.len() + usize::from(self.task.is_some())
    }
}

/// The unclosed record that carries a commit or a parked run, as a marker lookup finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carrier {
    /// The record's key.
    pub batch: String,
    /// Its phase.
    pub phase: BatchPhase,
    /// When its worker wrote it (Unix ms).
    pub created_at_ms: u64,
}

impl Carrier {
    /// Whether the record owns what it carries now, so that a duplicate delivery may be acked on
    /// it. A record still `Submitting` inside [`SUBMIT_GRACE`] may be its worker's, still deciding:
    /// a batch the provider refuses is deleted and its calls made now, on that worker's own
    /// deliveries. A duplicate acked meanwhile would be left with no owner, so it waits instead.
    pub fn owns(&self, now_ms: u64) -> bool {
        self.owned_in(now_ms).is_zero()
    }

    /// How long until the record owns what it carries (zero once it does): a duplicate waits this
    /// long once, rather than coming back every few seconds of the grace.
    pub fn owned_in(&self, now_ms: u64) -> Duration {
        if self.phase != BatchPhase::Submitting {
            return Duration::ZERO;
        }
        let age = Duration::from_millis(now_ms.saturating_sub(self.created_at_ms));
        SUBMIT_GRACE.saturating_sub(age)
    }
}

/// The marker key of a parked task run: its batch record is found by it
/// ([`crate::ports::BatchStore::batched`]).
pub fn task_marker(task_id: &TaskId) -> String {
    format!("task:{task_id}")
}

/// The batch key of the run of `task_id` claimed at `fence`, in the deployment `scope`: the same
/// for every delivery of that claim (a parked run keeps its fence), another for a later run, so a
/// run sent on and batched again is never taken for the first.
pub fn task_batch_key(scope: &str, task_id: &TaskId, fence: u64) -> String {
    format!("lanes-{}", digest([scope.to_owned(), task_id.to_string(), fence.to_string()]))
}

fn digest(parts: impl IntoIterator<Item = String>) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    hex::encode(&h.finalize()[..12])
}

/// A request's id: derived from its repository and the shas it asks about (in any order), so the
/// same commits always make the same id.
pub fn custom_id(commits: &[BatchedCommit]) -> String {
    let mut keys: Vec<String> = commits.iter().map(|c| c.commit.key()).collect();
    keys.sort();
    format!("c-{}", digest(keys))
}

/// A batch's key: derived from the deployment's `scope` (its table: two deployments sharing a
/// provider account never adopt each other's batches) and its requests' ids (in any order).
pub fn batch_key(scope: &str, calls: &[BatchCall]) -> String {
    let mut ids: Vec<String> = calls.iter().map(|c| c.custom_id.clone()).collect();
    ids.sort();
    format!("lanes-{}", digest(std::iter::once(scope.to_owned()).chain(ids)))
}

/// How long before its deadline whatever a batch has not answered is sent on, cancelled or not:
/// a slow flex call ([`FLEX_HEADROOM`]) and two collector ticks.
pub const ESCALATE_AT: Duration = Duration::from_secs(FLEX_HEADROOM.as_secs() + 2 * 60);

/// What the collector does with a record at `now_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing yet (a submission may still be under way).
    Wait,
    /// Look its key up at the provider: adopt the batch found, or send the commits back.
    LookUp,
    /// Ask the provider how it is, and collect it if it ended.
    Poll,
    /// Ask the provider to cancel it (it would miss its deadline), then poll it.
    Cancel,
    /// Send every commit it has not answered back now, at flex or sync, and keep polling for late
    /// answers.
    Escalate,
}

/// The collector's rule: a batch is cancelled [`ESCALATE_BEFORE`] its deadline, and whatever it
/// has not answered a slow flex call and a tick before the deadline is escalated, cancelled or not.
pub fn step(record: &BatchRecord, now_ms: u64) -> Step {
    let left = Duration::from_millis(record.deadline_ms.saturating_sub(now_ms));
    let escalate_at = ESCALATE_AT;
    match record.phase {
        BatchPhase::Submitting => {
            if now_ms.saturating_sub(record.created_at_ms) >= SUBMIT_GRACE.as_millis() as u64 {
                Step::LookUp
            } else {
                Step::Wait
            }
        }
        // An unsubmitted phase with no id cannot be polled: what became of it is looked up.
        _ if record.provider_id.is_none() => Step::LookUp,
        _ if !record.escalated && left <= escalate_at => Step::Escalate,
        BatchPhase::Open if left <= ESCALATE_BEFORE => Step::Cancel,
        BatchPhase::Open | BatchPhase::Cancelling => Step::Poll,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::commit::Provider;

    fn commit(sha: char) -> BatchedCommit {
        BatchedCommit {
            commit: CommitMessage {
                provider: Provider::Github,
                repo_id: "github:1".parse().unwrap_or_else(|e| panic!("{e}")),
                repo: "o/r".into(),
                sha: sha.to_string().repeat(40).parse().unwrap_or_else(|e| panic!("{e}")),
                subject: String::new(),
                committed_at_ms: 0,
                escalated: None,
            },
            enqueued_at_ms: 0,
            diff_tokens: 1,
            diff_cut: false,
            section_tokens: 1,
        }
    }

    fn record(phase: BatchPhase, created: u64, deadline: u64) -> BatchRecord {
        BatchRecord {
            key: "k".into(),
            route: "openai:m".into(),
            provider_id: (phase != BatchPhase::Submitting).then(|| "batch_1".into()),
            phase,
            calls: Vec::new(),
            created_at_ms: created,
            deadline_ms: deadline,
            escalated: false,
            task: None,
        }
    }

    #[test]
    fn ids_depend_on_the_commits_not_their_order() {
        let (a, b) = (commit('a'), commit('b'));
        assert_eq!(custom_id(&[a.clone(), b.clone()]), custom_id(&[b.clone(), a.clone()]));
        assert_ne!(custom_id(std::slice::from_ref(&a)), custom_id(std::slice::from_ref(&b)));
        let calls = |x: &BatchedCommit, y: &BatchedCommit| {
            vec![
                BatchCall { custom_id: custom_id(std::slice::from_ref(x)), commits: vec![x.clone()] },
                BatchCall { custom_id: custom_id(std::slice::from_ref(y)), commits: vec![y.clone()] },
            ]
        };
        assert_eq!(batch_key("t", &calls(&a, &b)), batch_key("t", &calls(&b, &a)));
        assert_ne!(batch_key("t", &calls(&a, &b)), batch_key("u", &calls(&a, &b)), "scoped");
        assert!(batch_key("t", &calls(&a, &b)).starts_with("lanes-"));
    }

    #[test]
    fn a_batch_is_polled_then_cancelled_then_escalated_as_its_deadline_nears() {
        let min = 60_000;
        let deadline = 600 * min;
        let open = record(BatchPhase::Open, 0, deadline);
        assert_eq!(step(&open, 0), Step::Poll);
        assert_eq!(step(&open, deadline - ESCALATE_BEFORE.as_millis() as u64 - 1), Step::Poll);
        assert_eq!(step(&open, deadline - ESCALATE_BEFORE.as_millis() as u64), Step::Cancel);
        let cancelling = BatchRecord { phase: BatchPhase::Cancelling, ..open.clone() };
        assert_eq!(step(&cancelling, deadline - 20 * min), Step::Poll);
        assert_eq!(step(&cancelling, deadline - 17 * min), Step::Escalate);
        // Escalated once; polled after for the late answers, past the deadline too.
        let escalated = BatchRecord { escalated: true, ..cancelling };
        assert_eq!(step(&escalated, deadline + 60 * min), Step::Poll);
        // An open batch found past its escalation point (a collector down) is escalated at once.
        assert_eq!(step(&open, deadline - min), Step::Escalate);
        // An open record with no id (never so written) is looked up, not polled.
        assert_eq!(step(&BatchRecord { provider_id: None, ..open }, 0), Step::LookUp);
    }

    #[test]
    fn a_submission_is_looked_up_only_once_no_worker_can_still_be_making_it() {
        let r = record(BatchPhase::Submitting, 1_000, u64::MAX);
        assert_eq!(step(&r, 1_000 + SUBMIT_GRACE.as_millis() as u64 - 1), Step::Wait);
        assert_eq!(step(&r, 1_000 + SUBMIT_GRACE.as_millis() as u64), Step::LookUp);
        // Even past its deadline: what happened to it must be known before anything is escalated.
        let late = BatchRecord { deadline_ms: 0, ..r };
        assert_eq!(step(&late, 2_000), Step::Wait);
    }

    #[test]
    fn a_submitting_record_owns_its_commits_only_once_its_worker_is_past_deciding() {
        let at = |phase, created_at_ms| Carrier { batch: "k".into(), phase, created_at_ms };
        let grace = SUBMIT_GRACE.as_millis() as u64;
        assert!(!at(BatchPhase::Submitting, 1_000).owns(1_000 + grace - 1));
        assert!(at(BatchPhase::Submitting, 1_000).owns(1_000 + grace));
        assert!(at(BatchPhase::Open, 1_000).owns(1_000));
        assert!(at(BatchPhase::Cancelling, 1_000).owns(1_000));
        assert_eq!(
            at(BatchPhase::Submitting, 1_000).owned_in(1_000 + grace - 60_000),
            Duration::from_secs(60)
        );
    }
}
