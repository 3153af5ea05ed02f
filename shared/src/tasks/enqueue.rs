//! How a task's message gets to its lane: a new task's put and send (it is then counted as waiting
//! in its group, [`crate::tasks::share`]), the mark of a record whose send failed, and the re-send
//! of an unsent or orphaned `PENDING` record, claimed in the store first so that one reader sends
//! it.

use super::ingress::Ingress;
use crate::domain::fairness::{GROUP_ATTRIBUTE, PRIORITY_ATTRIBUTE, task_group};
use crate::domain::{TaskId, TaskMessage, TaskRecord, TaskStatus};
use crate::ports::{Admitted, EnqueueMark, StoreError, UNSENT};
use std::collections::BTreeMap;
use tracing::warn;

impl Ingress {
    /// Re-sends a `PENDING` record whose message is known unsent (its send failed) or may be lost (no
    /// worker claimed it within the enqueue grace, then within twice its age at the last re-send: a
    /// crash between the put and the send, a purge).
    /// The re-send is claimed in the store first (a compare-and-set of `enqueued_at_ms`), so however
    /// many readers see the same record, one sends, at most once a grace. Workers are idempotent, so
    /// a second message is harmless and a lost one is not.
    pub(super) async fn resend_if_orphaned(&self, record: &TaskRecord, now: u64) {
        // The wait doubles with every re-send (it is the record's age at the last one), so a backlog
        // longer than the grace costs a message per doubling, not one per grace and poll.
        let grace = self.config.enqueue_grace.as_millis() as u64;
        let wait = grace.max(record.enqueued_at_ms.saturating_sub(record.created_at_ms));
        let unsent = record.enqueued_at_ms == UNSENT;
        if record.status != TaskStatus::Pending
            || (!unsent && now.saturating_sub(record.enqueued_at_ms) < wait)
        {
            return;
        }
        // The send's time is read now, not at the request's start: slow reads before it must not
        // make the next grace start early.
        let sent_at = self.clock.now_ms().max(now).max(1);
        let claim = EnqueueMark { fence: record.fence, from_ms: record.enqueued_at_ms, to_ms: sent_at };
        if !self.mark(&record.task_id, claim, now).await {
            return; // another reader re-sends it, or it changed
        }
        match self.resend(record).await {
            Ok(_) => self.metrics.resends_total.with_label_values(&[record.lane.as_str()]).inc(),
            Err(e) => {
                warn!(error = %e, "re-send of a PENDING task failed; it stays marked unsent");
                let back = EnqueueMark { fence: record.fence, from_ms: claim.to_ms, to_ms: UNSENT };
                self.mark(&record.task_id, back, now).await;
            }
        }
    }

    /// Marks the record ingress just wrote as unsent. The stored record carries the fence of the run it
    /// replaced, so it is read first, and marked only while it is still this submission's (its nonce)
    /// and unclaimed; should the read fail, the enqueue grace re-sends it.
    pub(super) async fn mark_unsent(&self, ours: &TaskRecord, now: u64) {
        match self.store.get(&ours.task_id, now).await {
            Ok(Some(r)) if r.nonce == ours.nonce && r.status == TaskStatus::Pending => {
                let unsent = EnqueueMark { fence: r.fence, from_ms: r.enqueued_at_ms, to_ms: UNSENT };
                self.mark(&r.task_id, unsent, now).await;
            }
            Ok(_) => {} // claimed or replaced meanwhile: no longer this submission's to mark
            Err(e) => warn!(error = %e, "could not read the record to mark it unsent; the grace re-sends it"),
        }
    }

    /// [`TaskStore::mark_enqueued`], logged when it fails; whether it took effect.
    async fn mark(&self, task_id: &TaskId, mark: EnqueueMark, now: u64) -> bool {
        match self.store.mark_enqueued(task_id, mark, now, self.config.pending_ttl_secs).await {
            Ok(done) => done,
            Err(e) => {
                warn!(error = %e, "could not record the send; the enqueue grace re-sends it");
                false
            }
        }
    }

    /// Puts a new task's record and sends its message ([`crate::ports::Admission`]); a sent one is
    /// counted as waiting in its group. A message that will not encode is refused before the put.
    pub(super) async fn admit(&self, record: &TaskRecord, now: u64) -> Result<Admitted, StoreError> {
        let message = message(record, self.clock.now_ms()).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let admitted = self.admission.admit(record, now, message).await?;
        if matches!(admitted, Admitted::Sent(_)) {
            self.count_waiting(record).await;
        }
        Ok(admitted)
    }

    /// Sends `record`'s message again.
    async fn resend(
        &self,
        record: &TaskRecord,
    ) -> Result<crate::domain::MessageId, crate::ports::QueueError> {
        let (body, attributes) = message(record, self.clock.now_ms())?;
        self.queues[record.lane.index()].send(&body, attributes).await
    }
}

/// The message of `record`'s run, sent at `now_ms`: its body and attributes (lane, kind, fairness
/// group and priority, the trace).
pub(crate) fn message(
    record: &TaskRecord,
    now_ms: u64,
) -> Result<(String, BTreeMap<String, String>), crate::ports::QueueError> {
    let message =
        TaskMessage { task_id: record.task_id.clone(), lane: record.lane, kind: record.request.kind };
    let body =
        serde_json::to_string(&message).map_err(|e| crate::ports::QueueError::Rejected(e.to_string()))?;
    let mut attributes = BTreeMap::from([
        ("lane".to_owned(), record.lane.as_str().to_owned()),
        ("kind".to_owned(), record.request.kind.as_str().to_owned()),
        ("enqueued_at_ms".to_owned(), now_ms.to_string()),
        (GROUP_ATTRIBUTE.to_owned(), task_group(record.request.tenant.as_ref(), &record.request.project_id)),
    ]);
    if !record.request.priority.is_normal() {
        attributes.insert(PRIORITY_ATTRIBUTE.to_owned(), record.request.priority.as_str().to_owned());
    }
    if let Some(header) = crate::trace::current() {
        attributes.insert(crate::trace::TRACE_HEADER.to_owned(), header);
    }
    Ok((body, attributes))
}
