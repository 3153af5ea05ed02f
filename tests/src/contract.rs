//! Contract tests of the ports: one function per port, run against every implementation of it (the
//! embedded twin and the AWS adapter on moto) by `tests/contracts.rs`, so the twins cannot drift.

// Contract checks panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::domain::{TaskRecord, TaskRequest, TaskResult, TaskStatus};
use lanes_core::ports::{
    CancelOutcome, ClaimOutcome, Completion, FinishOutcome, PutOutcome, QueueConsume, QueueSend, TaskStore,
};
use std::collections::BTreeMap;
use std::time::Duration;

fn record(prompt: &str, now_ms: u64) -> TaskRecord {
    let body = serde_json::json!({"project_id":"p","kind":"explain","prompt":prompt,"target_files":[]});
    let req = TaskRequest::from_value(body).unwrap_or_else(|e| panic!("{e:?}"));
    TaskRecord::pending(req.task_id(None), req, now_ms, 3600)
}

fn result() -> TaskResult {
    TaskResult { text: "t".into(), model: "m".into(), tokens: Default::default(), truncated: true }
}

fn claimed(outcome: ClaimOutcome) -> TaskRecord {
    match outcome {
        ClaimOutcome::Claimed(r) => *r,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// The task record's lifecycle: claims are not attempts, failed attempts are counted under the fence,
/// cancellation and the DLQ's settlement move the fence on, and `FAILED`/`CANCELLED` records are
/// replaced by a new submission that keeps the fence.
pub async fn task_store(store: &dyn TaskStore, now: u64) {
    let get = |id: String| async move { store.get(&id, now).await.unwrap_or_else(|e| panic!("{e}")) };

    // Claims and attempts.
    let r = record("attempts", now);
    assert_eq!(store.put_pending(&r, now).await.unwrap(), PutOutcome::Created);
    let c1 = claimed(store.claim(&r.task_id, now, 7200).await.unwrap());
    assert_eq!((c1.fence, c1.attempts), (1, 0), "a claim is not an attempt");
    assert!(c1.expires_at >= now / 1000 + 7200, "a claim extends the TTL");
    assert_eq!(store.note_attempt(&r.task_id, 1, "502").await.unwrap(), Some(1));
    assert_eq!(store.note_attempt(&r.task_id, 1, "503").await.unwrap(), Some(2));
    let c2 = claimed(store.claim(&r.task_id, now, 7200).await.unwrap());
    assert_eq!((c2.fence, c2.attempts), (2, 2), "attempts survive a re-claim");
    assert_eq!(store.note_attempt(&r.task_id, 1, "late").await.unwrap(), None, "an old fence counts nothing");
    let done = store.finish(&r.task_id, 2, Completion::Completed(result()), now, 7200).await.unwrap();
    let FinishOutcome::Written(done) = done else { panic!("the current fence writes") };
    assert_eq!((done.status, done.attempts), (TaskStatus::Completed, 2));
    assert!(done.result.unwrap().truncated, "the stored result keeps its truncation flag");
    assert_eq!(store.note_attempt(&r.task_id, 2, "after").await.unwrap(), None, "terminal records are final");

    // Cancellation of a pending task, then of a running one; a third is a conflict.
    let p = record("cancel pending", now);
    store.put_pending(&p, now).await.unwrap();
    let CancelOutcome::Cancelled(cp) = store.cancel(&p.task_id, now, 7200).await.unwrap() else { panic!() };
    assert_eq!((cp.status, cp.fence), (TaskStatus::Cancelled, 1));
    assert!(matches!(store.claim(&p.task_id, now, 7200).await.unwrap(), ClaimOutcome::Terminal(_)));
    let run = record("cancel running", now);
    store.put_pending(&run, now).await.unwrap();
    let rc = claimed(store.claim(&run.task_id, now, 7200).await.unwrap());
    let CancelOutcome::Cancelled(cr) = store.cancel(&run.task_id, now, 7200).await.unwrap() else { panic!() };
    assert_eq!(cr.fence, rc.fence + 1, "cancelling moves the fence on");
    let late =
        store.finish(&run.task_id, rc.fence, Completion::Completed(result()), now, 7200).await.unwrap();
    assert_eq!(late, FinishOutcome::StaleFence, "the running worker can write nothing after it");
    assert!(matches!(store.cancel(&run.task_id, now, 7200).await.unwrap(), CancelOutcome::Terminal(_)));
    assert_eq!(store.cancel(&"0".repeat(64), now, 7200).await.unwrap(), CancelOutcome::Missing);

    // A cancelled task submitted again runs again, with its fence carried over.
    assert_eq!(store.put_pending(&record("cancel running", now), now).await.unwrap(), PutOutcome::Created);
    let again = get(run.task_id.clone()).await.unwrap();
    assert_eq!((again.status, again.fence, again.attempts), (TaskStatus::Pending, cr.fence, 0));

    // The DLQ's settlement: PENDING or PROCESSING -> FAILED whatever the fence, once.
    let d = record("dead-lettered", now);
    store.put_pending(&d, now).await.unwrap();
    let dc = claimed(store.claim(&d.task_id, now, 7200).await.unwrap());
    assert!(store.fail_unfinished(&d.task_id, "dead-lettered: crash", now, 7200).await.unwrap());
    assert!(!store.fail_unfinished(&d.task_id, "again", now, 7200).await.unwrap(), "settled once");
    let failed = get(d.task_id.clone()).await.unwrap();
    assert_eq!((failed.status, failed.error.as_deref()), (TaskStatus::Failed, Some("dead-lettered: crash")));
    assert!(failed.fence > dc.fence);
    assert_eq!(store.put_pending(&record("dead-lettered", now), now).await.unwrap(), PutOutcome::Created);
    assert!(
        !store.fail_unfinished(&done.task_id, "x", now, 7200).await.unwrap(),
        "COMPLETED is never failed"
    );

    // A re-send extends the life of a pending record to the new message's retention.
    let e = record("re-sent", now);
    store.put_pending(&e, now).await.unwrap();
    assert!(store.mark_enqueued(&e.task_id, 0, now + 1_000, 90_000).await.unwrap());
    let extended = get(e.task_id.clone()).await.unwrap();
    assert_eq!(extended.enqueued_at_ms, now + 1_000);
    assert!(extended.expires_at >= (now + 1_000) / 1000 + 90_000);
}

/// A requeue puts a fresh copy of a delivery (receive count 1, after its delay) in place of it.
pub async fn queue_requeue<Q: QueueConsume + QueueSend>(queue: &Q) {
    let attributes = BTreeMap::from([("lane".to_owned(), "interactive".to_owned())]);
    queue.send("requeue me", attributes).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got = queue.receive_for(1, Some(Duration::ZERO)).await.unwrap();
        if got.first().is_some_and(|m| m.receive_count >= 2) {
            break;
        }
    }
    let last = got.pop().unwrap_or_else(|| panic!("the message came back"));
    assert!(last.receive_count >= 2, "received twice");
    queue.requeue(&last, Duration::from_secs(1)).await.unwrap();
    assert!(queue.receive_for(1, Some(Duration::from_secs(5))).await.unwrap().is_empty(), "delayed");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let copy = queue
        .receive_for(1, Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .pop()
        .unwrap_or_else(|| panic!("copy"));
    assert_eq!((copy.body.as_str(), copy.receive_count), ("requeue me", 1));
    assert_eq!(copy.attributes.get("lane").map(String::as_str), Some("interactive"));
    assert!(
        queue.change_visibility(&last.receipt, Duration::ZERO).await.is_err(),
        "the old delivery is gone"
    );
    queue.delete(&copy.receipt).await.unwrap();
}
