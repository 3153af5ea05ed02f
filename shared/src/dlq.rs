//! The task lanes' dead-letter queues: the sweep that settles the record of every task message found
//! there, the listing and the redrive.
//!
//! Workers settle a task's record before they dead-letter its message, and put waits off with a
//! fresh copy instead of letting them reach the redrive, so a message reaches a DLQ with its record
//! unsettled only when a worker crashed on the last delivery or the message is poison. The sweep
//! closes that gap: each record found `PENDING` or `PROCESSING` behind a dead-lettered message ends
//! `FAILED` with the DLQ's reason, so its client sees an answer and may resubmit.
//!
//! Why a sweep that leaves the messages where they are, rather than a consumer that deletes them:
//! the DLQ is what operators look at (its alarm, `lanes dlq list`) and what they redrive from. The
//! sweep peeks (receives with a short visibility, then makes each message visible again) and only
//! writes records; `FAILED` records are not written again (the write is conditional), so sweeping
//! the same message twice costs one conditional write and changes nothing. In Lambda the controller
//! runs it every minute; `lanes dev` runs it in its own loop.

use crate::clock::SharedClock;
use crate::domain::{Lane, MessageId, TaskId};
use crate::domain::{TaskMessage, TaskRecord, TaskStatus};
use crate::metrics::Metrics;
use crate::ports::DEAD_LETTER_REASON;
use crate::ports::{
    LeaseLock, PutOutcome, QueueConsume, QueueError, QueueSend, ReceivedMessage, StoreError, TaskStore,
};
use serde::Serialize;
use std::time::Duration;
use tracing::{info, warn};

/// How far the queue's clock (a message's send time) and the writer's clock (a record's creation time)
/// may disagree: a record created later than its message's send time by more than this is a later run.
pub const CLOCK_SKEW_MS: u64 = 5_000;

/// How long a peeked message stays hidden while it is looked at (made visible again right after).
const PEEK_VISIBILITY: Duration = Duration::from_secs(30);

/// Errors of a DLQ operation.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    /// The queue failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The lane has no DLQ here (a queue without a redrive policy).
    #[error("the {0} lane has no dead-letter queue")]
    NoDlq(Lane),
    /// A redrive by move task would lose messages; nothing was changed.
    #[error("not redriven by move task: {0}")]
    NotMovable(String),
}

/// One message of a DLQ, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlqEntry {
    /// The message id.
    pub message_id: MessageId,
    /// The task it carries, when the body decodes as a task message.
    pub task_id: Option<TaskId>,
    /// The commit (`repo_id:sha`) it carries, on the commits lane.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Why it is there.
    pub reason: String,
    /// The task record's status now, when there is one.
    pub status: Option<String>,
    /// Unix ms when the message was sent to the DLQ.
    pub sent_at_ms: u64,
}

/// Why a message is in the DLQ: the worker's recorded reason, or the queue's own redrive.
pub fn reason_of(message: &ReceivedMessage) -> String {
    message.attributes.get(DEAD_LETTER_REASON).cloned().unwrap_or_else(|| {
        "redriven by the queue after maxReceiveCount deliveries (a crashed worker or a poison message)".into()
    })
}

/// Receives up to `max` distinct messages of `dlq`, each hidden only while it is looked at. Call
/// [`release`] with them when done.
async fn peek(dlq: &dyn QueueConsume, max: usize) -> Result<Vec<ReceivedMessage>, QueueError> {
    crate::lease::receive_batch(dlq, max, PEEK_VISIBILITY).await
}

/// Makes peeked messages visible again.
pub(crate) async fn release(dlq: &dyn QueueConsume, messages: &[ReceivedMessage]) {
    for r in crate::lease::release(dlq, messages).await {
        if let Err(e) = r {
            warn!(error = %e, "peeked DLQ message stays hidden until its visibility ends");
        }
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Messages looked at.
    pub seen: usize,
    /// Records marked `FAILED` now.
    pub marked_failed: usize,
    /// Commit messages deleted because their commit is summarized (the commits lane).
    pub settled: usize,
}

/// What a sweep of one task lane's DLQ works with.
pub struct Sweep<'a> {
    /// The lane.
    pub lane: Lane,
    /// Its DLQ.
    pub dlq: &'a dyn QueueConsume,
    /// The task records.
    pub store: &'a dyn TaskStore,
    /// The lease lock, where the deployment has one: a task whose lock is held has a live worker
    /// that settles its run, and is left to it (a later sweep looks again).
    pub lock: Option<&'a dyn LeaseLock>,
    /// The lane's queue, where the sweep may send to it: a message older than the run it finds
    /// unsettled is relayed there (see [`Sweep::run`]).
    pub lane_queue: Option<&'a dyn QueueSend>,
    /// Metrics.
    pub metrics: &'a Metrics,
    /// Time.
    pub clock: &'a SharedClock,
    /// TTL of a settled record.
    pub ttl_secs: u64,
}

/// How long a swept message whose record is settled stays hidden when the DLQ holds more than one
/// sweep looks at: later sweeps look at the messages behind it rather than at the same first `max`
/// again, so a DLQ of any size is covered, `max` a tick. `lanes dlq` sees it again after this.
pub const SETTLED_HIDE: Duration = Duration::from_secs(600);

impl Sweep<'_> {
    /// Marks `FAILED` (with the DLQ's reason) the record of each task message in the DLQ that is
    /// still `PENDING` or `PROCESSING` and whose lock no worker holds; looks at up to `max` messages.
    /// The messages stay in the DLQ, visible again at once; when the sweep saw `max` of them (the
    /// DLQ may hold more), the settled ones stay hidden for [`SETTLED_HIDE`]. A message older than the unsettled run it names is another run's:
    /// that run is a resubmission the old message went on to run and crash on, and its own message
    /// may never have been sent (its submission's put answered an error). With a `lane_queue` such a
    /// message is relayed to its lane, so the run gets a message of its own age; without one it is
    /// left.
    pub async fn run(&self, max: usize) -> Result<SweepReport, DlqError> {
        let messages = peek(self.dlq, max).await?;
        // A DLQ larger than one look: what is settled stays hidden, so the next sweeps look further.
        // A smaller one is all seen each time, and stays visible for operators.
        let hide = messages.len() >= max;
        let mut report = SweepReport { seen: messages.len(), ..Default::default() };
        let (mut failure, mut visible) = (None, Vec::new());
        for m in messages {
            let settled = match self.settle(&m).await {
                Ok(Some(marked)) => {
                    report.marked_failed += usize::from(marked);
                    true
                }
                Ok(None) => false,
                Err(e) => {
                    failure = Some(e);
                    false
                }
            };
            if settled && hide {
                if let Err(e) = crate::lease::hide(self.dlq, &m, SETTLED_HIDE).await {
                    warn!(error = %e, "a swept DLQ message is visible again after its peek");
                }
            } else {
                visible.push(m);
            }
        }
        release(self.dlq, &visible).await;
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(report),
        }
    }

    /// Settles the record behind one message: `Some(true)` marked `FAILED` now, `Some(false)`
    /// settled already, `None` not settled (left to a live lock holder, or not a task message).
    async fn settle(&self, m: &ReceivedMessage) -> Result<Option<bool>, StoreError> {
        let Ok(task) = serde_json::from_str::<TaskMessage>(&m.body) else { return Ok(None) };
        if let Some(lock) = self.lock {
            let key = crate::lease::task_lock_key(&task.task_id);
            match lock.acquire(&key, PEEK_VISIBILITY).await {
                Ok(crate::ports::Acquire::Acquired(token)) => {
                    // Held while the record is settled, so no worker starts it meanwhile.
                    let settled = self.fail_unfinished(m, &task).await;
                    let _ = lock.release(&key, &token).await;
                    return settled.map(Some);
                }
                Ok(crate::ports::Acquire::Held { .. }) => return Ok(None),
                Err(e) => {
                    warn!(error = %e, "lock unavailable; leaving the record to a later sweep");
                    return Ok(None);
                }
            }
        }
        self.fail_unfinished(m, &task).await.map(Some)
    }

    async fn fail_unfinished(&self, m: &ReceivedMessage, task: &TaskMessage) -> Result<bool, StoreError> {
        let reason = crate::domain::failure::FailureCode::DeadLettered.reason(reason_of(m));
        let sent_before = m.sent_at_ms.saturating_add(CLOCK_SKEW_MS);
        let now = self.clock.now_ms();
        let failed =
            self.store.fail_unfinished(&task.task_id, &reason, sent_before, now, self.ttl_secs).await?;
        if failed {
            info!(task_id = %task.task_id, %reason, "record of a dead-lettered task marked FAILED");
            self.metrics.dlq_marked_failed_total.with_label_values(&[self.lane.as_str()]).inc();
            self.metrics.tasks_finished_total.with_label_values(&[self.lane.as_str(), "FAILED"]).inc();
        }
        // Not failed: settled, gone, or a run newer than the message. Only the last is read for.
        if !failed && let Some(lane_queue) = self.lane_queue {
            let current = self.store.get(&task.task_id, now).await?;
            if current.is_some_and(|r| !r.status.is_terminal() && r.created_at_ms > sent_before)
                && lane_queue.send(&m.body, routing(m)).await.is_ok()
            {
                info!(task_id = %task.task_id, "a DLQ message older than its task's run relayed to run it");
                if let Err(e) = self.dlq.delete(&m.receipt).await {
                    warn!(error = %e, "a relayed DLQ message stays until a later sweep");
                }
            }
        }
        Ok(failed)
    }
}

/// Lists up to `max` messages of `dlq` with their task's status; the messages stay.
pub async fn list(
    dlq: &dyn QueueConsume,
    store: &dyn TaskStore,
    clock: &SharedClock,
    max: usize,
) -> Result<Vec<DlqEntry>, DlqError> {
    let messages = peek(dlq, max).await?;
    let mut out = Vec::with_capacity(messages.len());
    for m in &messages {
        let task_id = serde_json::from_str::<TaskMessage>(&m.body).ok().map(|t| t.task_id);
        let status = match &task_id {
            Some(id) => store.get(id, clock.now_ms()).await?.map(|r| r.status.as_str().to_owned()),
            None => None,
        };
        out.push(DlqEntry {
            message_id: m.message_id.clone(),
            task_id,
            commit: None,
            reason: reason_of(m),
            status,
            sent_at_ms: m.sent_at_ms,
        });
    }
    release(dlq, &messages).await;
    Ok(out)
}

/// What one redrive did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RedriveReport {
    /// Tasks sent back to their lane with their record reset to `PENDING`.
    pub redriven: usize,
    /// Messages of tasks already `COMPLETED` (or `CANCELLED` by their client), deleted without
    /// running again.
    pub already_completed: usize,
    /// Messages left in the DLQ (undecodable, or no record to run), with why. A move task moves
    /// them too; the worker dead-letters them again.
    pub left: Vec<(MessageId, String)>,
    /// The move task's handle, when the redrive went through one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub move_task: Option<String>,
    /// Why the move task could not start, when the messages were relayed instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub move_error: Option<String>,
}

/// What a message of the DLQ needs before it may run again (read only; see [`make_runnable`]).
enum Readiness {
    /// Runnable once its record is: `Some` is a `FAILED` record to reset, `None` a
    /// `PENDING`/`PROCESSING` one that runs as it is.
    Run(Option<Box<TaskRecord>>),
    /// Its task is `COMPLETED` or `CANCELLED`: delete it.
    Settled,
    /// Leave it in the DLQ, with why; `dropped` when its worker would drop it if it were sent back
    /// (no live record), rather than dead-letter it again (undecodable).
    Leave { why: String, dropped: bool },
}

/// Reads what `m` needs before it may run again; writes nothing.
async fn assess(
    m: &ReceivedMessage,
    store: &dyn TaskStore,
    clock: &SharedClock,
) -> Result<Readiness, DlqError> {
    let Ok(task) = serde_json::from_str::<TaskMessage>(&m.body) else {
        return Ok(Readiness::Leave { why: "undecodable message".into(), dropped: false });
    };
    let Some(record) = store.get(&task.task_id, clock.now_ms()).await? else {
        return Ok(Readiness::Leave { why: "no live record for the task".into(), dropped: true });
    };
    Ok(match record.status {
        // A cancelled task is its client's decision: a redrive never runs it again.
        TaskStatus::Completed | TaskStatus::Cancelled => Readiness::Settled,
        s if crate::domain::lifecycle::is_resubmittable(s) => Readiness::Run(Some(Box::new(record))),
        _ => Readiness::Run(None),
    })
}

/// Replaces a `FAILED` record with a fresh `PENDING` one (the fence carries over).
/// `false`: its client resubmitted it meanwhile, and that submission's own message runs it.
async fn make_runnable(
    record: &TaskRecord,
    store: &dyn TaskStore,
    clock: &SharedClock,
    pending_ttl_secs: u64,
) -> Result<bool, DlqError> {
    let now = clock.now_ms();
    let fresh = TaskRecord::pending(record.task_id.clone(), record.request.clone(), now, pending_ttl_secs);
    Ok(matches!(store.put_pending(&fresh, now).await?, PutOutcome::Created))
}

/// The step both redrives take for a message whose task may run again: its record reset when it is
/// settled (see [`make_runnable`]); `false`, with the message deleted, when its client resubmitted
/// the task meanwhile (that submission's own message runs it).
async fn runnable_or_dropped(
    dlq: &dyn QueueConsume,
    m: &ReceivedMessage,
    reset: Option<Box<TaskRecord>>,
    store: &dyn TaskStore,
    clock: &SharedClock,
    pending_ttl_secs: u64,
) -> Result<bool, DlqError> {
    if let Some(record) = reset
        && !make_runnable(&record, store, clock, pending_ttl_secs).await?
    {
        dlq.delete(&m.receipt).await?;
        return Ok(false);
    }
    Ok(true)
}

/// A DLQ message's attributes that travel back to its lane: only the routing ones (lane, kind, the
/// fairness group and the priority), never the DLQ's own (reason, source).
pub(crate) fn routing(m: &ReceivedMessage) -> std::collections::BTreeMap<String, String> {
    m.attributes
        .iter()
        .filter(|(k, _)| {
            use crate::domain::fairness::{GROUP_ATTRIBUTE, PRIORITY_ATTRIBUTE};
            matches!(k.as_str(), "lane" | "kind" | GROUP_ATTRIBUTE | PRIORITY_ATTRIBUTE)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Moves up to `max` task messages from `dlq` back to `lane_queue`, resetting each record so the task
/// runs again: a `FAILED` or `CANCELLED` record becomes a fresh `PENDING` one (the fence carries
/// over); a `PENDING` or `PROCESSING` one is simply sent again. Each message is deleted from the DLQ
/// only after its copy was sent.
pub async fn redrive(
    dlq: &dyn QueueConsume,
    lane_queue: &dyn QueueSend,
    store: &dyn TaskStore,
    clock: &SharedClock,
    pending_ttl_secs: u64,
    max: usize,
) -> Result<RedriveReport, DlqError> {
    let messages = peek(dlq, max).await?;
    let mut report = RedriveReport::default();
    let mut keep = Vec::new();
    for m in messages {
        match assess(&m, store, clock).await? {
            Readiness::Leave { why, .. } => {
                report.left.push((m.message_id.clone(), why));
                keep.push(m);
            }
            Readiness::Settled => {
                dlq.delete(&m.receipt).await?;
                report.already_completed += 1;
            }
            Readiness::Run(reset) => {
                if !runnable_or_dropped(dlq, &m, reset, store, clock, pending_ttl_secs).await? {
                    continue;
                }
                lane_queue.send(&m.body, routing(&m)).await?;
                dlq.delete(&m.receipt).await?;
                report.redriven += 1;
            }
        }
    }
    release(dlq, &keep).await;
    Ok(report)
}

/// Whether the peeked `messages` may all be moved back, with each one's readiness; or why not: the
/// DLQ holds more than this redrive could look at (a move takes every message), or one has no
/// live record (its worker would drop it).
async fn movable(
    dlq: &dyn QueueConsume,
    store: &dyn TaskStore,
    clock: &SharedClock,
    messages: &[ReceivedMessage],
) -> Result<Result<Vec<Readiness>, String>, DlqError> {
    let depth = match dlq.depth().await {
        Ok(d) => d,
        Err(e) => return Ok(Err(format!("the DLQ's depth is unreadable: {e}"))),
    };
    let held = depth.visible + depth.in_flight;
    if held > messages.len() as u64 {
        return Ok(Err(format!(
            "the DLQ holds about {held} messages and this redrive could look at {}: a move would take messages whose records were not made runnable; redrive by relay (repeatedly) instead, or again once the messages a sweep settled are visible ({} s after it)",
            messages.len(),
            SETTLED_HIDE.as_secs()
        )));
    }
    let mut assessed = Vec::with_capacity(messages.len());
    for m in messages {
        assessed.push(assess(m, store, clock).await?);
    }
    if let Some((m, _)) =
        messages.iter().zip(&assessed).find(|(_, r)| matches!(r, Readiness::Leave { dropped: true, .. }))
    {
        return Ok(Err(format!(
            "message {} has no live task record, so its worker would drop it; redrive by relay, which leaves it in the DLQ",
            m.message_id
        )));
    }
    Ok(Ok(assessed))
}

/// The redrive through the queue service's own move task (SQS `StartMessageMoveTask`), for DLQs too
/// large to relay message by message: every record behind the DLQ's messages is made runnable and
/// the messages of completed tasks deleted, then one move task sends everything left back to the
/// lane at the service's pace. `report.move_task` is its handle; [`QueueConsume::move_tasks`]
/// follows it.
///
/// A move takes the whole DLQ, and a worker acknowledges without running a message whose record is
/// settled or gone, so a message moved without its record made runnable would be lost. Hence it
/// refuses ([`DlqError::NotMovable`], nothing changed) when the DLQ holds more than it looked at
/// (more than `max`, or messages hidden by someone else) or a message has no live record. If the
/// move cannot start (no permission, one already running), the messages are relayed instead
/// ([`redrive`]) and `report.move_error` says why. A message dead-lettered between the resets and
/// the move still moves with its record settled: run the redrive again for those.
pub async fn redrive_by_move(
    dlq: &dyn QueueConsume,
    lane_queue: &dyn QueueSend,
    store: &dyn TaskStore,
    clock: &SharedClock,
    pending_ttl_secs: u64,
    max: usize,
) -> Result<RedriveReport, DlqError> {
    let messages = peek(dlq, max).await?;
    let assessed = match movable(dlq, store, clock, &messages).await? {
        Ok(assessed) => assessed,
        Err(why) => {
            release(dlq, &messages).await;
            return Err(DlqError::NotMovable(why));
        }
    };
    let mut report = RedriveReport::default();
    let mut keep = Vec::new();
    for (m, readiness) in messages.into_iter().zip(assessed) {
        match readiness {
            Readiness::Settled => {
                dlq.delete(&m.receipt).await?;
                report.already_completed += 1;
            }
            Readiness::Leave { why, .. } => {
                // Moved with the rest; its worker dead-letters it again.
                report.left.push((m.message_id.clone(), why));
                keep.push(m);
            }
            Readiness::Run(reset) => {
                if !runnable_or_dropped(dlq, &m, reset, store, clock, pending_ttl_secs).await? {
                    continue;
                }
                report.redriven += 1;
                keep.push(m);
            }
        }
    }
    // Visible again before the move starts: a move task only takes visible messages.
    release(dlq, &keep).await;
    match dlq.start_move_back().await {
        Ok(handle) => report.move_task = Some(handle),
        Err(e) => {
            warn!(error = %e, "the move task could not start; relaying the messages instead");
            let relayed = redrive(dlq, lane_queue, store, clock, pending_ttl_secs, max).await?;
            report.redriven = relayed.redriven;
            report.left = relayed.left;
            report.move_error = Some(e.to_string());
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::domain::TaskRequest;
    use crate::domain::fairness::GROUP_ATTRIBUTE;
    use crate::embedded::{EmbeddedDb, EmbeddedQueues, EmbeddedStore, QueueSettings};
    use crate::ports::{ClaimOutcome, Completion};
    use serde_json::json;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    /// Three tasks whose messages reached the synthesis DLQ (0 COMPLETED anyway, 1 crashed while
    /// PROCESSING, 2 never ran) and one poison message, swept once.
    struct DeadLettered {
        _dir: tempfile::TempDir,
        clock: SharedClock,
        manual: Arc<crate::clock::ManualClock>,
        store: EmbeddedStore,
        queue: crate::embedded::EmbeddedQueue,
        dlq: crate::embedded::EmbeddedQueue,
        ids: Vec<TaskId>,
    }

    /// The attributes task `i`'s message is sent with: its lane, its tenant's fairness group, a
    /// priority.
    fn sent_attributes(i: usize) -> BTreeMap<String, String> {
        use crate::domain::fairness::{GROUP_ATTRIBUTE, PRIORITY_ATTRIBUTE};
        BTreeMap::from([
            ("lane".to_owned(), "synthesis".to_owned()),
            (GROUP_ATTRIBUTE.to_owned(), format!("t-tenant{i}")),
            (PRIORITY_ATTRIBUTE.to_owned(), "low".to_owned()),
        ])
    }

    async fn dead_lettered() -> DeadLettered {
        let dir = tempfile::tempdir().unwrap();
        let manual = crate::clock::ManualClock::new(crate::clock::Clock::now_ms(&SystemClock));
        let clock: SharedClock = manual.clone();
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let store = EmbeddedStore::new(db.clone());
        let settings = QueueSettings {
            default_visibility: Duration::from_millis(1),
            max_receive_count: 1,
            ..Default::default()
        };
        let queue = EmbeddedQueues::open(db, clock.clone(), settings)
            .await
            .unwrap()
            .queue("synthesis", "synthesis-dlq");
        let mut ids = Vec::new();
        for i in 0..3 {
            let req = TaskRequest::from_value(
                json!({"project_id":"p","kind":"refactor","prompt":format!("{i}"),"target_files":[]}),
            )
            .unwrap();
            let rec = TaskRecord::pending(req.task_id(None), req, clock.now_ms(), 3600);
            store.put_pending(&rec, clock.now_ms()).await.unwrap();
            let body = serde_json::to_string(&TaskMessage {
                task_id: rec.task_id.clone(),
                lane: rec.lane,
                kind: rec.request.kind,
            })
            .unwrap();
            queue.send(&body, sent_attributes(i)).await.unwrap();
            ids.push(rec.task_id);
        }
        queue.send("poison", BTreeMap::new()).await.unwrap();
        // Task 0 ran to COMPLETED before its message was redriven anyway; 1 crashed mid-run; 2 never ran.
        let ClaimOutcome::Claimed(c) = store.claim(&ids[0], clock.now_ms(), 3600).await.unwrap() else {
            panic!()
        };
        let done = crate::domain::TaskResult {
            text_ref: None,
            text: "t".into(),
            model: "m".into(),
            tokens: Default::default(),
            truncated: false,
            cost_usd: None,
            tier: Default::default(),
            tokens_saved: 0,
        };
        store.finish(&ids[0], c.fence, Completion::Completed(done), clock.now_ms(), 3600).await.unwrap();
        store.claim(&ids[1], clock.now_ms(), 3600).await.unwrap();
        // One receive each (a crashed worker), then the queue's redrive moves all four.
        assert_eq!(queue.receive(10).await.unwrap().len(), 4);
        manual.advance_ms(5);
        assert!(queue.receive(10).await.unwrap().is_empty());
        let dlq = queue.dead_letter_queue();
        assert_eq!(dlq.peek_all().await.len(), 4);

        let dlq = queue.dead_letter_queue();
        DeadLettered { _dir: dir, clock, manual, store, queue, dlq, ids }
    }

    #[tokio::test]
    async fn the_sweep_fails_unsettled_records_and_the_redrive_runs_them_again() {
        let DeadLettered { _dir, clock, manual: _, store, queue, dlq, ids } = dead_lettered().await;
        assert_eq!(dlq.peek_all().await.len(), 4);
        let metrics = Metrics::new();
        let report = sweep(Lane::Synthesis, &dlq, &store, &metrics, &clock, 3600, 100).await.unwrap();
        assert_eq!(report, SweepReport { seen: 4, marked_failed: 2, settled: 0 });
        for (id, want) in ids.iter().zip([TaskStatus::Completed, TaskStatus::Failed, TaskStatus::Failed]) {
            let rec = store.get(id, clock.now_ms()).await.unwrap().unwrap();
            assert_eq!(rec.status, want, "every task behind a DLQ message has an answer");
        }
        let rec = store.get(&ids[2], clock.now_ms()).await.unwrap().unwrap();
        assert!(rec.error.unwrap().contains("maxReceiveCount"), "the reason is the DLQ's");
        let again = sweep(Lane::Synthesis, &dlq, &store, &metrics, &clock, 3600, 100).await.unwrap();
        assert_eq!(
            (again.seen, again.marked_failed),
            (4, 0),
            "a second sweep changes nothing, and a small DLQ stays visible"
        );

        let listed = list(&dlq, &store, &clock, 100).await.unwrap();
        assert_eq!(listed.len(), 4, "the sweep and the listing leave the messages in place");
        assert_eq!(listed.iter().filter(|e| e.status.as_deref() == Some("FAILED")).count(), 2);

        let report = redrive(&dlq, &queue, &store, &clock, 3600, 100).await.unwrap();
        assert_eq!((report.redriven, report.already_completed, report.left.len()), (2, 1, 1), "{report:?}");
        for id in &ids[1..] {
            assert_eq!(store.get(id, clock.now_ms()).await.unwrap().unwrap().status, TaskStatus::Pending);
        }
        assert_eq!(queue.peek_all().await.len(), 2, "back in their lane");
        assert_eq!(dlq.peek_all().await.len(), 1, "the poison message stays");
        // Each goes back with its routing (the fair order's group, its priority) and without the
        // DLQ's own attributes (why it was dead-lettered, from where). The send time is the queue's.
        let mut back: Vec<BTreeMap<String, String>> =
            queue.peek_all().await.into_iter().map(|(_, a)| a).collect();
        back.iter_mut().for_each(|a| drop(a.remove("SentTimestamp")));
        back.sort_by(|a, b| a.get(GROUP_ATTRIBUTE).cmp(&b.get(GROUP_ATTRIBUTE)));
        assert_eq!(back, [sent_attributes(1), sent_attributes(2)]);
    }

    /// The sweep as the controller runs it, with no lock service.
    async fn sweep(
        lane: Lane,
        dlq: &dyn QueueConsume,
        store: &dyn TaskStore,
        metrics: &Metrics,
        clock: &SharedClock,
        ttl_secs: u64,
        max: usize,
    ) -> Result<SweepReport, DlqError> {
        Sweep { lane, dlq, store, lock: None, lane_queue: None, metrics, clock, ttl_secs }.run(max).await
    }

    /// A sweep of `max` hides what it settled, so the next looks at the messages behind them.
    /// A record whose lock is held is left to its holder.
    #[tokio::test]
    async fn sweeps_of_two_cover_three_and_leave_a_locked_run_to_its_holder() {
        let DeadLettered { _dir, clock, manual: _, store, queue: _, dlq, ids } = dead_lettered().await;
        let lock = crate::embedded::MemoryLock::new(clock.clone());
        let key = crate::lease::task_lock_key(&ids[1]);
        let crate::ports::Acquire::Acquired(token) =
            lock.acquire(&key, Duration::from_secs(60)).await.unwrap()
        else {
            panic!()
        };
        let metrics = Metrics::new();
        let sweep = |max| {
            let s = Sweep {
                lane: Lane::Synthesis,
                dlq: &dlq,
                store: &store,
                lock: Some(&lock),
                lane_queue: None,
                metrics: &metrics,
                clock: &clock,
                ttl_secs: 3600,
            };
            async move { s.run(max).await.unwrap() }
        };
        for _ in 0..4 {
            sweep(2).await;
        }
        let status = |i: usize| {
            let (store, id, now) = (&store, ids[i].clone(), clock.now_ms());
            async move { store.get(&id, now).await.unwrap().unwrap().status }
        };
        assert_eq!((status(1).await, status(2).await), (TaskStatus::Processing, TaskStatus::Failed));
        lock.release(&key, &token).await.unwrap();
        sweep(2).await;
        assert_eq!(status(1).await, TaskStatus::Failed, "settled once its holder is gone");
    }

    /// A redrive never runs a task its client cancelled; a moved message is enqueued anew.
    #[tokio::test]
    async fn a_redrive_leaves_cancelled_tasks_cancelled_and_moved_messages_are_new() {
        let DeadLettered { _dir, clock, manual: _, store, queue, dlq, ids } = dead_lettered().await;
        store.cancel(&ids[2], clock.now_ms(), 3600).await.unwrap();
        let report = redrive(&dlq, &queue, &store, &clock, 3600, 100).await.unwrap();
        assert_eq!((report.redriven, report.already_completed), (1, 2), "{report:?}");
        let rec = store.get(&ids[2], clock.now_ms()).await.unwrap().unwrap();
        assert_eq!(rec.status, TaskStatus::Cancelled);
        let again = dead_lettered().await;
        let before = again.clock.now_ms();
        again.manual.advance_ms(10_000);
        again.dlq.start_move_back().await.unwrap();
        let moved = again.queue.receive(10).await.unwrap();
        assert_eq!(moved.len(), 4);
        assert!(moved.iter().all(|m| m.sent_at_ms >= before + 10_000), "a moved message is sent anew");
    }

    /// Makes every peeked message of `dlq` visible again (the receives above hid them).
    async fn clock_settle(dlq: &crate::embedded::EmbeddedQueue) {
        for m in dlq.receive(100).await.unwrap() {
            dlq.change_visibility(&m.receipt, Duration::ZERO).await.unwrap();
        }
    }

    /// The move-task redrive: records are made runnable first, finished tasks' messages deleted,
    /// then one move takes every message left (the poison one too) back to the lane, where the
    /// tasks run again; the move is listed.
    #[tokio::test]
    async fn the_redrive_by_move_task_resets_records_before_the_move() {
        let DeadLettered { _dir, clock, manual, store, queue, dlq, ids } = dead_lettered().await;
        let metrics = Metrics::new();
        sweep(Lane::Synthesis, &dlq, &store, &metrics, &clock, 3600, 100).await.unwrap();
        manual.advance_ms(SETTLED_HIDE.as_millis() as u64);
        assert!(matches!(queue.start_move_back().await, Err(QueueError::Rejected(_))), "not a DLQ");
        // A message whose task has no live record would be dropped by its worker: refused, nothing changed.
        let lost = TaskMessage {
            task_id: "0".repeat(64).parse().unwrap(),
            lane: Lane::Synthesis,
            kind: crate::domain::Kind::Refactor,
        };
        queue.send(&serde_json::to_string(&lost).unwrap(), BTreeMap::new()).await.unwrap();
        let m = queue.receive(1).await.unwrap().remove(0);
        queue.dead_letter(&m, "test").await.unwrap();
        let refused = redrive_by_move(&dlq, &queue, &store, &clock, 3600, 100).await.unwrap_err();
        assert!(
            matches!(refused, DlqError::NotMovable(ref why) if why.contains("no live task record")),
            "{refused}"
        );
        assert_eq!(dlq.peek_all().await.len(), 5, "nothing moved");
        assert_eq!(
            store.get(&ids[1], clock.now_ms()).await.unwrap().unwrap().status,
            TaskStatus::Failed,
            "nothing reset"
        );
        // More messages than it may look at: refused too.
        let refused = redrive_by_move(&dlq, &queue, &store, &clock, 3600, 2).await.unwrap_err();
        assert!(
            matches!(refused, DlqError::NotMovable(ref why) if why.contains("holds about 5")),
            "{refused}"
        );
        let m =
            dlq.receive(10).await.unwrap().into_iter().find(|m| m.body.contains(&"0".repeat(64))).unwrap();
        dlq.delete(&m.receipt).await.unwrap();
        manual.advance_ms(5);
        clock_settle(&dlq).await;

        let report = redrive_by_move(&dlq, &queue, &store, &clock, 3600, 100).await.unwrap();
        assert_eq!((report.redriven, report.already_completed, report.left.len()), (2, 1, 1), "{report:?}");
        assert!(report.move_task.is_some());
        for id in &ids[1..] {
            assert_eq!(store.get(id, clock.now_ms()).await.unwrap().unwrap().status, TaskStatus::Pending);
        }
        assert!(dlq.peek_all().await.is_empty(), "the move took everything left");
        let back = queue.receive(10).await.unwrap();
        assert_eq!(back.len(), 3, "two tasks and the poison message");
        assert!(back.iter().all(|m| m.receive_count == 1), "moved messages are fresh deliveries");
        let moves = dlq.move_tasks().await.unwrap();
        assert_eq!((moves.len(), moves[0].status.as_str(), moves[0].moved), (1, "COMPLETED", 3));
    }
}
