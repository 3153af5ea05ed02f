//! Contract tests of the ports: one function per port, run against every implementation of it (the
//! embedded twin and the AWS adapter on moto) by `tests/contracts.rs`, so the twins cannot drift.

// Contract checks panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::domain::TokenUsage;
use lanes_core::domain::commit::{CommitSummary, PushScope, SummarySource};
use lanes_core::domain::fairness::GROUP_ATTRIBUTE;
use lanes_core::domain::lifecycle::{self, Command, Event, Guard, TRANSITIONS};
use lanes_core::domain::{RepoId, Sha, TaskId, TaskRecord, TaskRequest, TaskResult, TaskStatus};
use lanes_core::ports::{
    Acquire, Admission, Admitted, Cache, CancelOutcome, Charge, ClaimOutcome, Completion, DEAD_LETTER_REASON,
    EnqueueMark, FinishOutcome, LeaseLock, PutOutcome, QueueConsume, QueueSend, SummaryStore, TaskStore,
    WriteOnce,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn record(prompt: &str, now_ms: u64) -> TaskRecord {
    let body = serde_json::json!({"project_id":"p","kind":"explain","prompt":prompt,"target_files":[]});
    let req = TaskRequest::from_value(body).unwrap_or_else(|e| panic!("{e:?}"));
    TaskRecord::pending(req.task_id(None), req, now_ms, 3600)
}

fn result() -> TaskResult {
    TaskResult {
        text_ref: None,
        text: "t".into(),
        model: "m".into(),
        tokens: Default::default(),
        truncated: true,
        cost_usd: Some(0.25),
        tier: Default::default(),
        tokens_saved: 0,
    }
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
    let get = |id: TaskId| async move { store.get(&id, now).await.unwrap_or_else(|e| panic!("{e}")) };

    // Claims and attempts.
    let r = record("attempts", now);
    assert_eq!(store.put_pending(&r, now).await.unwrap(), PutOutcome::Created);
    let c1 = claimed(store.claim(&r.task_id, now, 7200).await.unwrap());
    assert_eq!((c1.fence, c1.attempts), (1, 0), "a claim is not an attempt");
    assert!(c1.expires_at >= now / 1000 + 7200, "a claim extends the TTL");
    assert_eq!(store.note_attempt(&r.task_id, 1, "502", now).await.unwrap(), Some(1));
    assert_eq!(store.note_attempt(&r.task_id, 1, "503", now).await.unwrap(), Some(2));
    let c2 = claimed(store.claim(&r.task_id, now, 7200).await.unwrap());
    assert_eq!((c2.fence, c2.attempts), (2, 2), "attempts survive a re-claim");
    assert_eq!(
        store.note_attempt(&r.task_id, 1, "late", now).await.unwrap(),
        None,
        "an old fence counts nothing"
    );
    let done = store.finish(&r.task_id, 2, Completion::Completed(result()), now, 7200).await.unwrap();
    let FinishOutcome::Written(done) = done else { panic!("the current fence writes") };
    assert_eq!((done.status, done.attempts), (TaskStatus::Completed, 2));
    assert!(done.result.unwrap().truncated, "the stored result keeps its truncation flag");
    assert_eq!(
        store.note_attempt(&r.task_id, 2, "after", now).await.unwrap(),
        None,
        "terminal records are final"
    );

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
    assert_eq!(
        store.cancel(&"0".repeat(64).parse().unwrap(), now, 7200).await.unwrap(),
        CancelOutcome::Missing
    );

    // A cancelled task submitted again runs again, with its fence carried over.
    assert_eq!(store.put_pending(&record("cancel running", now), now).await.unwrap(), PutOutcome::Created);
    let again = get(run.task_id.clone()).await.unwrap();
    assert_eq!((again.status, again.fence, again.attempts), (TaskStatus::Pending, cr.fence, 0));

    // The DLQ's settlement: PENDING or PROCESSING -> FAILED whatever the fence, once.
    let d = record("dead-lettered", now);
    store.put_pending(&d, now).await.unwrap();
    let dc = claimed(store.claim(&d.task_id, now, 7200).await.unwrap());
    assert!(
        !store.fail_unfinished(&d.task_id, "an older message", now - 60_000, now, 7200).await.unwrap(),
        "a message sent before this run was submitted does not fail it"
    );
    assert!(store.fail_unfinished(&d.task_id, "dead-lettered: crash", now, now, 7200).await.unwrap());
    assert!(!store.fail_unfinished(&d.task_id, "again", now, now, 7200).await.unwrap(), "settled once");
    let failed = get(d.task_id.clone()).await.unwrap();
    assert_eq!((failed.status, failed.error.as_deref()), (TaskStatus::Failed, Some("dead-lettered: crash")));
    assert!(failed.fence > dc.fence);
    assert_eq!(store.put_pending(&record("dead-lettered", now), now).await.unwrap(), PutOutcome::Created);
    assert!(
        !store.fail_unfinished(&done.task_id, "x", now, now, 7200).await.unwrap(),
        "COMPLETED is never failed"
    );

    // An expired record is replaced, and its fence carries over too.
    let x = record("expired and replaced", now);
    store.put_pending(&x, now).await.unwrap();
    let xc = claimed(store.claim(&x.task_id, now, 7200).await.unwrap());
    let later = now + 7_201_000;
    assert_eq!(
        store.put_pending(&record("expired and replaced", later), later).await.unwrap(),
        PutOutcome::Created
    );
    let replaced = store.get(&x.task_id, later).await.unwrap().unwrap();
    assert_eq!((replaced.status, replaced.fence), (TaskStatus::Pending, xc.fence));

    // A re-send extends the life of a pending record to the new message's retention.
    let e = record("re-sent", now);
    store.put_pending(&e, now).await.unwrap();
    let resend = EnqueueMark { fence: 0, from_ms: e.enqueued_at_ms, to_ms: now + 1_000 };
    assert!(store.mark_enqueued(&e.task_id, resend, now + 1_000, 90_000).await.unwrap());
    let extended = get(e.task_id.clone()).await.unwrap();
    assert_eq!(extended.enqueued_at_ms, now + 1_000);
    assert!(extended.expires_at >= (now + 1_000) / 1000 + 90_000);
    // It is a compare-and-set: of two readers that saw the same value, one re-sends.
    assert!(!store.mark_enqueued(&e.task_id, resend, now + 1_000, 90_000).await.unwrap());
    let unsent = EnqueueMark { fence: 0, from_ms: now + 1_000, to_ms: lanes_core::ports::UNSENT };
    assert!(store.mark_enqueued(&e.task_id, unsent, now + 1_000, 90_000).await.unwrap());
    assert_eq!(get(e.task_id.clone()).await.unwrap().enqueued_at_ms, lanes_core::ports::UNSENT);
}

/// Where a record is before a transition of the table is tried on it.
#[derive(Debug, Clone, Copy)]
enum Prior {
    Absent,
    /// Claimed, then past its TTL: the store still holds it, with its fence.
    Expired,
    /// Claimed, then handed to a provider batch.
    Parked,
    Is(TaskStatus),
}

/// The batch a parked run waits on.
fn parked() -> lanes_core::domain::Parked {
    lanes_core::domain::Parked { batch: "lanes-0123456789abcdef01234567".into(), due_ms: 9_000_000 }
}

/// Puts the record of `name` where `prior` says, through the port, and returns it as stored.
async fn arrange(store: &dyn TaskStore, name: &str, prior: Prior, now: u64) -> Option<TaskRecord> {
    let earlier = now - 10_000;
    let (at, ttl) = match prior {
        Prior::Expired => (now - 7_200_000, 3600),
        _ => (earlier, 7200),
    };
    let id = record(name, at).task_id;
    if !matches!(prior, Prior::Absent) {
        assert_eq!(store.put_pending(&record(name, at), at).await.unwrap(), PutOutcome::Created, "{name}");
    }
    let finish = |completion| async move {
        let c = claimed(store.claim(&id, at, ttl).await.unwrap());
        match store.finish(&c.task_id, c.fence, completion, at, ttl).await.unwrap() {
            FinishOutcome::Written(r) => Some(*r),
            FinishOutcome::StaleFence => panic!("the arrangement's own fence"),
        }
    };
    let id = record(name, at).task_id;
    match prior {
        Prior::Absent => None,
        Prior::Is(TaskStatus::Pending) => store.get(&id, at).await.unwrap(),
        Prior::Expired => Some(claimed(store.claim(&id, at, ttl).await.unwrap())),
        Prior::Is(TaskStatus::Processing) => {
            // A failed attempt and a saved text first, so the record carries a reason and a
            // partial answer that a final write must clear and a takeover's claim must keep.
            let c = claimed(store.claim(&id, at, ttl).await.unwrap());
            assert_eq!(store.note_attempt(&id, c.fence, "503", at).await.unwrap(), Some(1));
            assert!(store.checkpoint(&id, c.fence, "the answer so f", at).await.unwrap(), "{name}");
            store.get(&id, at).await.unwrap()
        }
        Prior::Parked => {
            let c = claimed(store.claim(&id, at, ttl).await.unwrap());
            assert!(store.park(&id, c.fence, parked(), at, ttl).await.unwrap(), "{name}");
            store.get(&id, at).await.unwrap()
        }
        Prior::Is(TaskStatus::Completed) => finish(Completion::Completed(result())).await,
        Prior::Is(TaskStatus::Failed) => finish(Completion::Failed("bad".into())).await,
        Prior::Is(TaskStatus::Cancelled) => match store.cancel(&id, at, ttl).await.unwrap() {
            CancelOutcome::Cancelled(r) => Some(*r),
            other => panic!("{name}: {other:?}"),
        },
    }
}

/// The command of `event` a caller holding `stored` would send, with `broken` made false.
fn command(
    event: Event,
    stored: Option<&TaskRecord>,
    broken: Option<Guard>,
    name: &str,
    now: u64,
) -> Command {
    let fence = stored.map_or(0, |r| r.fence) + if broken == Some(Guard::Fence) { 7 } else { 0 };
    match event {
        Event::Submit => Command::Submit(Box::new(record(name, now))),
        Event::MarkEnqueued => {
            let from_ms =
                stored.map_or(0, |r| r.enqueued_at_ms) + u64::from(broken == Some(Guard::EnqueuedAt));
            Command::MarkEnqueued(EnqueueMark { fence, from_ms, to_ms: now })
        }
        Event::Claim => Command::Claim,
        Event::NoteAttempt => Command::NoteAttempt { fence, reason: "502".into() },
        Event::Complete => Command::Finish { fence, completion: Completion::Completed(result()) },
        Event::Fail => Command::Finish { fence, completion: Completion::Failed("bad".into()) },
        Event::Cancel => Command::Cancel,
        Event::FailUnfinished => {
            let created = stored.map_or(now, |r| r.created_at_ms);
            let sent_before_ms = if broken == Some(Guard::CreatedBefore) { created - 1 } else { created };
            Command::FailUnfinished { reason: "dead-lettered".into(), sent_before_ms }
        }
        // Whether it is parked is the record's state, not the command's: the parked prior breaks
        // `Unparked`, every other prior `Parked`.
        Event::Park => Command::Park { fence, parked: parked() },
        Event::Unpark => Command::Unpark { fence },
        Event::Checkpoint => Command::Checkpoint { fence, text: "the answer so far".into() },
    }
}

/// Sends `command` through the port; whether the store took it.
async fn carry_out(store: &dyn TaskStore, id: &TaskId, command: Command, now: u64, ttl: u64) -> bool {
    match command {
        Command::Submit(r) => store.put_pending(&r, now).await.unwrap() == PutOutcome::Created,
        Command::MarkEnqueued(m) => store.mark_enqueued(id, m, now, ttl).await.unwrap(),
        Command::Claim => matches!(store.claim(id, now, ttl).await.unwrap(), ClaimOutcome::Claimed(_)),
        Command::NoteAttempt { fence, reason } => {
            store.note_attempt(id, fence, &reason, now).await.unwrap().is_some()
        }
        Command::Finish { fence, completion } => {
            matches!(store.finish(id, fence, completion, now, ttl).await.unwrap(), FinishOutcome::Written(_))
        }
        Command::Cancel => matches!(store.cancel(id, now, ttl).await.unwrap(), CancelOutcome::Cancelled(_)),
        Command::FailUnfinished { reason, sent_before_ms } => {
            store.fail_unfinished(id, &reason, sent_before_ms, now, ttl).await.unwrap()
        }
        Command::Park { fence, parked } => store.park(id, fence, parked, now, ttl).await.unwrap(),
        Command::Unpark { fence } => store.unpark(id, fence, now).await.unwrap(),
        Command::Checkpoint { fence, text } => store.checkpoint(id, fence, &text, now).await.unwrap(),
    }
}

/// Every row of the transition table, on a record in every state (none, expired, each status),
/// with its guards held and with each broken: the store takes exactly what the row admits and
/// leaves the record as [`lifecycle::apply`] computes it, field for field. A transition one
/// store makes and the table does not (or the other way round) fails here.
pub async fn task_transitions(store: &dyn TaskStore, now: u64) {
    use TaskStatus::*;
    let priors = [Prior::Absent, Prior::Expired, Prior::Is(Pending), Prior::Is(Processing), Prior::Parked]
        .into_iter()
        .chain([Completed, Failed, Cancelled].map(Prior::Is));
    let mut tried = 0;
    for prior in priors {
        for row in &TRANSITIONS {
            for broken in std::iter::once(None).chain(row.guards.iter().copied().map(Some)) {
                let name = format!("{:?} on {prior:?}, breaking {broken:?}", row.event);
                let stored = arrange(store, &name, prior, now).await;
                let id = record(&name, now).task_id;
                let cmd = command(row.event, stored.as_ref(), broken, &name, now);
                let expected = lifecycle::apply(cmd.clone(), stored.as_ref(), now, 7200);
                let took = carry_out(store, &id, cmd, now, 7200).await;
                assert_eq!(took, expected.is_some(), "{name}: taken by the store, by the table");
                let after = store.get(&id, now).await.unwrap();
                let unchanged = stored.filter(|r| !r.is_expired(now));
                assert_eq!(after, expected.or(unchanged), "{name}: the record after it");
                tried += 1;
            }
        }
    }
    assert!(tried >= 8 * TRANSITIONS.len());
}

/// A run's saved text: kept whole at any size the worker saves (compressed past 32 KiB on
/// DynamoDB), replaced by the next save whatever its size, handed to a takeover's claim with the
/// fence of the run that saved it, refused to a run whose fence moved on, and gone with the final
/// write.
pub async fn task_checkpoints(store: &dyn TaskStore, now: u64) {
    let rec = record("checkpoints", now);
    let id = rec.task_id.clone();
    assert_eq!(store.put_pending(&rec, now).await.unwrap(), PutOutcome::Created);
    let first = claimed(store.claim(&id, now, 3600).await.unwrap());
    let long: String = (0..6000).map(|i| format!("w{i} é ")).collect();
    assert!(long.len() > 48 * 1024);
    assert!(store.checkpoint(&id, first.fence, &long, now).await.unwrap());
    let saved = store.get(&id, now).await.unwrap().unwrap().partial.unwrap();
    assert_eq!((saved.text == long, saved.run), (true, first.fence), "the long text, whole");
    assert!(store.checkpoint(&id, first.fence, "short", now).await.unwrap());
    let saved = store.get(&id, now).await.unwrap().unwrap().partial.unwrap();
    assert_eq!(saved.text, "short", "a shorter save replaces a compressed one");
    let second = claimed(store.claim(&id, now, 3600).await.unwrap());
    let kept = second.partial.clone().unwrap();
    assert_eq!((kept.text.as_str(), kept.run < second.fence), ("short", true), "the takeover reads it");
    assert!(!store.checkpoint(&id, first.fence, "stale", now).await.unwrap(), "the lost run's save");
    assert!(store.checkpoint(&id, second.fence, "short and more", now).await.unwrap());
    let done = store.finish(&id, second.fence, Completion::Completed(result()), now, 3600).await.unwrap();
    assert!(matches!(done, FinishOutcome::Written(ref r) if r.partial.is_none()), "{done:?}");
    assert_eq!(store.get(&id, now).await.unwrap().unwrap().partial, None);
    assert!(!store.checkpoint(&id, second.fence, "after the end", now).await.unwrap());
}

/// A requeue puts a fresh copy of a delivery (receive count 1, after its delay) in place of it,
/// with its attributes and its fairness group.
pub async fn queue_requeue<Q: QueueConsume + QueueSend>(queue: &Q) {
    let attributes = BTreeMap::from([
        ("lane".to_owned(), "interactive".to_owned()),
        (GROUP_ATTRIBUTE.to_owned(), "t-0123456789abcdef".to_owned()),
    ]);
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
    assert_eq!(copy.attributes.get(GROUP_ATTRIBUTE).map(String::as_str), Some("t-0123456789abcdef"));
    assert!(
        queue.change_visibility(&last.receipt, Duration::ZERO).await.is_err(),
        "the old delivery is gone"
    );
    queue.delete(&copy.receipt).await.unwrap();
}

/// A queue with a DLQ: attributes, the fairness group and receive counts travel, a received message
/// hides for its visibility and comes back with a higher count, a delete removes it, a dead-letter
/// moves it with its reason and its group, and the depth counts what is visible and what is in
/// flight.
pub async fn queue<Q: QueueConsume + QueueSend>(queue: &Q, dlq: &dyn QueueConsume) {
    let attributes = BTreeMap::from([
        ("lane".to_owned(), "interactive".to_owned()),
        (GROUP_ATTRIBUTE.to_owned(), "o-team".to_owned()),
    ]);
    queue.send("m1", attributes.clone()).await.unwrap();
    let got = queue.receive_for(10, Some(Duration::from_secs(1))).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].body.as_str(), got[0].receive_count), ("m1", 1));
    assert_eq!(got[0].attributes["lane"], "interactive");
    assert_eq!(got[0].attributes.get(GROUP_ATTRIBUTE).map(String::as_str), Some("o-team"), "the group");
    assert!(got[0].sent_at_ms > 0);
    let depth = queue.depth().await.unwrap();
    assert_eq!((depth.visible, depth.in_flight), (0, 1));
    assert!(queue.receive_for(10, Some(Duration::from_secs(1))).await.unwrap().is_empty(), "hidden");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let again = queue.receive_for(10, Some(Duration::from_secs(30))).await.unwrap();
    assert_eq!(again[0].receive_count, 2, "back after its visibility, counted");
    queue.dead_letter(&again[0], "undecodable message: expected value").await.unwrap();
    let dead = dlq.receive_for(10, Some(Duration::from_secs(30))).await.unwrap();
    assert_eq!((dead.len(), dead[0].body.as_str()), (1, "m1"));
    assert_eq!(dead[0].attributes[DEAD_LETTER_REASON], "undecodable message: expected value");
    assert_eq!(
        dead[0].attributes.get(GROUP_ATTRIBUTE).map(String::as_str),
        Some("o-team"),
        "kept in the DLQ"
    );
    dlq.delete(&dead[0].receipt).await.unwrap();
    queue.send("m2", attributes).await.unwrap();
    let m2 = queue.receive_for(1, Some(Duration::ZERO)).await.unwrap().pop().unwrap();
    queue.change_visibility(&m2.receipt, Duration::from_secs(30)).await.unwrap();
    queue.delete(&m2.receipt).await.unwrap();
    let depth = queue.depth().await.unwrap();
    assert_eq!((depth.visible, depth.in_flight), (0, 0), "deleted");
    // A waiting receive: empty after its wait on an empty queue; a message sent during the wait is
    // answered when it arrives (well before the wait's end), received into the lease asked for.
    let waited = Instant::now();
    assert!(
        queue
            .receive_waiting(1, Some(Duration::from_secs(5)), Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(waited.elapsed() >= Duration::from_millis(900), "it waited");
    let started = Instant::now();
    let (got, ()) = tokio::join!(
        queue.receive_waiting(1, Some(Duration::from_secs(5)), Duration::from_secs(10)),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            queue.send("m3", BTreeMap::new()).await.unwrap();
        }
    );
    let got = got.unwrap();
    assert_eq!((got.len(), got[0].body.as_str()), (1, "m3"));
    assert_eq!(got[0].leased_for, Some(Duration::from_secs(5)));
    assert!(started.elapsed() < Duration::from_secs(9), "answered on arrival, not at the wait's end");
    queue.delete(&got[0].receipt).await.unwrap();
}

/// A lease lock: one holder at a time, the holder's remaining TTL told to the others, renew and
/// release only by the holder's token, a lease that lapses can be taken, and a holder's renewal
/// takes its key again while no one else has it.
pub async fn lease_lock(lock: &dyn LeaseLock) {
    let ttl = Duration::from_millis(300);
    let key = "lease:{task:contract}";
    let Acquire::Acquired(token) = lock.acquire(key, ttl).await.unwrap() else { panic!("free lock") };
    let Acquire::Held { remaining } = lock.acquire(key, ttl).await.unwrap() else { panic!("held") };
    assert!(remaining <= ttl && remaining > Duration::from_millis(100), "{remaining:?}");
    assert!(lock.renew(key, &token, ttl).await.unwrap());
    assert!(!lock.renew(key, "not the token", ttl).await.unwrap());
    assert!(!lock.release(key, "not the token").await.unwrap());
    // A lease whose key is gone (lapsed, or lost in a failover) is taken again by its holder's
    // renewal while no one else holds it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(lock.renew(key, &token, ttl).await.unwrap(), "a free key is taken again by its holder");
    assert!(matches!(lock.acquire(key, ttl).await.unwrap(), Acquire::Held { .. }));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let Acquire::Acquired(next) = lock.acquire(key, ttl).await.unwrap() else { panic!("lapsed lease") };
    assert!(!lock.renew(key, &token, ttl).await.unwrap(), "another holder's lease is not renewed");
    assert!(!lock.release(key, &token).await.unwrap(), "an old token cannot release the new lease");
    assert!(lock.release(key, &next).await.unwrap());
    assert!(matches!(lock.acquire(key, ttl).await.unwrap(), Acquire::Acquired(_)));
}

/// A TTL cache: an entry reads back until its TTL passes; counters; sets of expiring members.
pub async fn cache(cache: &dyn Cache) {
    cache.set("contract:x", "v", Duration::from_millis(200)).await.unwrap();
    assert_eq!(cache.get("contract:x").await.unwrap().as_deref(), Some("v"));
    assert_eq!(cache.get("contract:missing").await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cache.get("contract:x").await.unwrap(), None, "expired");
    // Counters: atomic adds from zero, one TTL from the first add, never extended.
    assert_eq!(cache.add("contract:n", 5, Duration::from_millis(300)).await.unwrap(), 5);
    let adds = (0..10).map(|_| cache.add("contract:n", 1, Duration::from_secs(60)));
    let mut seen: Vec<u64> = futures::future::join_all(adds).await.into_iter().map(|r| r.unwrap()).collect();
    seen.sort_unstable();
    assert_eq!(seen, (6..=15).collect::<Vec<_>>(), "every add sees its own value");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        cache.add("contract:n", 2, Duration::from_secs(60)).await.unwrap(),
        2,
        "expired with its first TTL"
    );
    // Sets of expiring members, timed by the caller's clock.
    let now = 1_000_000_000_000u64;
    cache.enter("contract:set", "a", now, now + 1_000).await.unwrap();
    cache.enter("contract:set", "b", now, now + 5_000).await.unwrap();
    cache.enter("contract:set", "b", now, now + 3_000).await.unwrap();
    assert_eq!(cache.count_live("contract:set", now).await.unwrap(), 2, "a member counts once");
    assert_eq!(cache.count_live("contract:set", now + 1_000).await.unwrap(), 1, "a's time is over");
    assert_eq!(cache.count_live("contract:set", now + 3_000).await.unwrap(), 0, "b's time was replaced");
    cache.leave("contract:set", "a").await.unwrap();
    cache.leave("contract:set", "never").await.unwrap();
    assert_eq!(cache.count_live("contract:set", now).await.unwrap(), 1, "only b left");
    cache.enter("contract:set", "c", now + 4_000, now + 9_000).await.unwrap();
    assert_eq!(
        cache.count_live("contract:set", now).await.unwrap(),
        1,
        "b, ended by then, was dropped as c entered"
    );
    assert_eq!(cache.count_live("contract:missing-set", now).await.unwrap(), 0);
    capped_sets(cache, now).await;
    reservations(cache).await;
}

/// A capped set: at most `max` members within their time; one already in renews whatever the count.
async fn capped_sets(cache: &dyn Cache, now: u64) {
    let key = "contract:{t}:capped";
    assert!(cache.enter_within(key, "a", now, now + 1_000, 2).await.unwrap());
    assert!(cache.enter_within(key, "b", now, now + 5_000, 2).await.unwrap());
    assert!(!cache.enter_within(key, "c", now, now + 5_000, 2).await.unwrap(), "full");
    assert!(cache.enter_within(key, "a", now + 500, now + 2_000, 2).await.unwrap(), "a renews while full");
    assert!(
        !cache.enter_within(key, "c", now + 1_500, now + 5_000, 2).await.unwrap(),
        "a's renewed time holds"
    );
    assert!(
        cache.enter_within(key, "c", now + 2_000, now + 5_000, 2).await.unwrap(),
        "a's time is over: room"
    );
    cache.leave(key, "b").await.unwrap();
    assert!(
        cache.enter_within(key, "d", now + 2_000, now + 5_000, 2).await.unwrap(),
        "b gave its place back"
    );
    assert_eq!(cache.count_live(key, now + 2_000).await.unwrap(), 2);
    // A parallel burst for the last places: exactly `max` get in.
    let burst = "contract:{t}:burst";
    let tries = (0..20).map(|i| {
        let member = format!("m{i}");
        async move { cache.enter_within(burst, &member, now, now + 5_000, 3).await.unwrap() }
    });
    let ins = futures::future::join_all(tries).await.into_iter().filter(|i| *i).count();
    assert_eq!(ins, 3, "never more than the cap");
}

/// Reservations: every charge or none, each limit checked against the counter before it.
async fn reservations(cache: &dyn Cache) {
    let charge = |key: &str, amount: i64, limit: Option<u64>| Charge {
        key: format!("contract:{{r}}:{key}"),
        amount,
        limit,
        ttl: Duration::from_millis(300),
    };
    let value = |key: &'static str| async move {
        cache.get(&format!("contract:{{r}}:{key}")).await.unwrap().map(|v| v.parse::<u64>().unwrap())
    };
    assert_eq!(cache.reserve(&[charge("a", 60, Some(100)), charge("b", 1, Some(2))]).await.unwrap(), None);
    assert_eq!(cache.reserve(&[charge("a", 40, Some(100)), charge("b", 1, Some(2))]).await.unwrap(), None);
    assert_eq!((value("a").await, value("b").await), (Some(100), Some(2)), "exactly the limits");
    assert_eq!(
        cache.reserve(&[charge("c", 5, None), charge("a", 1, Some(100))]).await.unwrap(),
        Some(1),
        "the second refused"
    );
    assert_eq!(value("c").await, None, "and nothing applied, not even the first");
    assert_eq!(cache.reserve(&[charge("a", -30, Some(100))]).await.unwrap(), None, "giving back");
    assert_eq!(cache.reserve(&[charge("b", -9, None)]).await.unwrap(), None);
    assert_eq!((value("a").await, value("b").await), (Some(70), Some(0)), "floored at zero");
    assert_eq!(cache.reserve(&[charge("d", 500, Some(100))]).await.unwrap(), None, "a first charge fits");
    assert_eq!(cache.reserve(&[charge("d", 1, Some(100))]).await.unwrap(), Some(0));
    // Concurrent reservations never both take the last room.
    let one = [charge("e", 10, Some(75))];
    let burst = (0..20).map(|_| cache.reserve(&one));
    let granted =
        futures::future::join_all(burst).await.into_iter().filter(|r| r.as_ref().unwrap().is_none());
    assert_eq!(granted.count(), 7, "7 of 10 fit in 75");
    // The first charge's TTL holds, and later charges keep it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(value("a").await, None, "expired with its first TTL");
    assert_eq!(cache.reserve(&[charge("a", 100, Some(100))]).await.unwrap(), None, "a new window");
}

fn summary(repo: &str, sha: &str, at: u64) -> CommitSummary {
    CommitSummary {
        repo_id: repo.parse().unwrap(),
        sha: sha.parse().unwrap(),
        repo: "o/r".into(),
        subject: "s".into(),
        summary: format!("summary of {sha}"),
        model: "m".into(),
        source: SummarySource::Llm,
        tokens: TokenUsage { prompt: 10, completion: 2 },
        diff_tokens: 8,
        diff_cut: false,
        committed_at_ms: at,
        created_at_ms: 1,
        tier: Default::default(),
    }
}

/// Summaries are written once and read back by key; a repository's list pages newest first with an
/// opaque cursor; a webhook delivery's key is marked once until its TTL passes or it is forgotten.
pub async fn summary_store(s: &dyn SummaryStore) {
    let shas: Vec<String> = (0..5).map(|i| format!("{i:040x}")).collect();
    for (i, sha) in shas.iter().enumerate() {
        assert_eq!(
            s.put_summary(&summary("github:1", sha, 1000 + i as u64)).await.unwrap(),
            WriteOnce::Written
        );
    }
    let mut other = summary("github:1", &shas[0], 5);
    other.summary = "changed".into();
    assert_eq!(s.put_summary(&other).await.unwrap(), WriteOnce::Exists);
    s.put_summary(&summary("github:2", &shas[0], 1)).await.unwrap();

    let keys: [(RepoId, Sha); 2] = [
        ("github:1".parse().unwrap(), shas[0].parse().unwrap()),
        ("github:9".parse().unwrap(), shas[0].parse().unwrap()),
    ];
    let got = s.get_summaries(&keys).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].summary, format!("summary of {}", shas[0]), "immutable");

    let p1 = s.list_summaries(&"github:1".parse().unwrap(), 2, None).await.unwrap();
    assert_eq!(p1.items.iter().map(|x| x.sha.as_str()).collect::<Vec<_>>(), [&shas[4], &shas[3]]);
    let p2 = s.list_summaries(&"github:1".parse().unwrap(), 2, p1.next.as_deref()).await.unwrap();
    assert_eq!(p2.items.iter().map(|x| x.sha.as_str()).collect::<Vec<_>>(), [&shas[2], &shas[1]]);
    let p3 = s.list_summaries(&"github:1".parse().unwrap(), 2, p2.next.as_deref()).await.unwrap();
    assert_eq!((p3.items.len(), p3.next), (1, None));

    assert!(!s.delivery_seen("github:d1", 1_000).await.unwrap(), "never marked");
    assert!(s.mark_delivery("github:d1", 1_000, 60).await.unwrap());
    assert!(s.delivery_seen("github:d1", 2_000).await.unwrap(), "marked");
    assert!(!s.delivery_seen("github:d2", 2_000).await.unwrap(), "another id");
    assert!(!s.mark_delivery("github:d1", 2_000, 60).await.unwrap(), "replay");
    assert!(!s.delivery_seen("github:d1", 62_000).await.unwrap(), "expired");
    assert!(s.mark_delivery("github:d1", 62_000, 60).await.unwrap(), "expired");
    // Commits pushed per repository and day: all of a push or none, within the limit; give-backs.
    let scope = |id: &str, repo: &str| PushScope::of(&RepoId::parse(id).unwrap(), repo);
    let repo = scope("github:77", "octo/app");
    assert!(s.count_pushed(&repo, 20_000, 2, 3).await.unwrap());
    assert!(!s.count_pushed(&repo, 20_000, 2, 3).await.unwrap(), "2 + 2 > 3: none of them");
    assert!(s.count_pushed(&repo, 20_001, 3, 3).await.unwrap(), "a new day");
    assert!(s.count_pushed(&repo, 20_000, -2, u64::MAX).await.unwrap(), "a give-back");
    assert!(s.count_pushed(&repo, 20_000, 3, 3).await.unwrap(), "the room given back is taken");
    assert!(!s.count_pushed(&repo, 20_000, 1, 3).await.unwrap());
    assert!(!s.count_pushed(&scope("github:78", "octo/app"), 20_000, 4, 3).await.unwrap(), "over alone");
    // The same id signed for another owner (a push pairing this id with its own owner's name) is
    // counted apart: it neither finds the day full nor fills it.
    assert!(s.count_pushed(&scope("github:77", "mallory/app"), 20_000, 3, 3).await.unwrap(), "another owner");
    assert!(
        !s.count_pushed(&scope("github:77", "OCTO/other"), 20_000, 1, 3).await.unwrap(),
        "one owner, any case"
    );
}

/// The results store: an object reads back byte for byte, a key never written reads as none, and
/// a second put under a key replaces the first (the same run writing again).
pub async fn result_objects(objects: &dyn lanes_core::ports::ResultObjects) {
    let big: Vec<u8> = (0..400 * 1024).map(|i| (i % 251) as u8).collect();
    objects.put("results/abc/1", big.clone()).await.unwrap();
    assert_eq!(objects.get("results/abc/1").await.unwrap(), Some(big));
    assert_eq!(objects.get("results/abc/2").await.unwrap(), None);
    objects.put("results/abc/1", b"again".to_vec()).await.unwrap();
    assert_eq!(objects.get("results/abc/1").await.unwrap().as_deref(), Some(&b"again"[..]));
}

/// A batch record's commit, `repo_id` and `sha` as given.
fn batched_commit(repo_id: &str, sha: &str) -> lanes_core::domain::batch::BatchedCommit {
    let repo_id = RepoId::parse(repo_id).unwrap();
    lanes_core::domain::batch::BatchedCommit {
        commit: lanes_core::domain::commit::CommitMessage {
            provider: repo_id.provider(),
            repo_id,
            repo: "o/r".into(),
            sha: sha.parse().unwrap(),
            subject: String::new(),
            committed_at_ms: 0,
            escalated: None,
        },
        enqueued_at_ms: 1_000,
        diff_tokens: 10,
        diff_cut: false,
        section_tokens: 20,
    }
}

/// Batch records: written once by key (markers with them), replaced only from the phase expected,
/// listed oldest first while unclosed; a commit reads as batched while its record is unclosed, and
/// a closed record's commits do not, while another record's still do.
pub async fn batch_store(s: &dyn lanes_core::ports::BatchStore) {
    use lanes_core::domain::batch::{BatchCall, BatchPhase, BatchRecord, batch_key, custom_id};
    let record = |created: u64, shas: &[&str]| {
        let commits: Vec<_> = shas.iter().map(|sha| batched_commit("github:5", sha)).collect();
        let calls = vec![BatchCall { custom_id: custom_id(&commits), commits }];
        BatchRecord {
            key: batch_key("contract", &calls),
            route: "openai:gpt-4o-mini".into(),
            provider_id: None,
            phase: BatchPhase::Submitting,
            calls,
            created_at_ms: created,
            deadline_ms: 3_600_000,
            escalated: false,
            task: None,
        }
    };
    let (a, b, c) = ("a".repeat(40), "b".repeat(40), "c".repeat(40));
    let first = record(2_000, &[&a, &b]);
    let second = record(1_000, &[&c]);
    assert!(s.create_batch(&first).await.unwrap());
    assert!(!s.create_batch(&first).await.unwrap(), "a key is written once");
    assert!(s.create_batch(&second).await.unwrap());
    let listed = s.open_batches(10).await.unwrap();
    assert_eq!(listed.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), [&second.key, &first.key]);
    assert_eq!(listed[1], first, "read back as written");
    assert_eq!(s.open_batches(1).await.unwrap().len(), 1);

    let open = BatchRecord { provider_id: Some("batch_1".into()), phase: BatchPhase::Open, ..first.clone() };
    assert!(s.update_batch(&open, BatchPhase::Submitting).await.unwrap());
    assert!(!s.update_batch(&open, BatchPhase::Submitting).await.unwrap(), "no longer submitting");
    let got = s.open_batches(10).await.unwrap();
    assert_eq!(got.iter().find(|r| r.key == first.key).unwrap().provider_id.as_deref(), Some("batch_1"));

    let key = |sha: &str| format!("github:5:{sha}");
    let asked = [key(&a), key(&b), key(&c), key(&"d".repeat(40))];
    let batched = s.batched(&asked).await.unwrap();
    assert_eq!(batched.len(), 3, "{batched:?}");
    assert_eq!(
        (batched[&key(&a)].batch.as_str(), batched[&key(&c)].batch.as_str()),
        (first.key.as_str(), second.key.as_str())
    );
    // Each with its record's phase and creation: a duplicate is acked on it only once it owns.
    assert_eq!((batched[&key(&a)].phase, batched[&key(&a)].created_at_ms), (BatchPhase::Open, 2_000));
    assert_eq!((batched[&key(&c)].phase, batched[&key(&c)].created_at_ms), (BatchPhase::Submitting, 1_000));
    // A third record carries `a` again (sent on by the first's collector, batched anew): closing
    // the first leaves the third's marker of it.
    let third = record(3_000, &[&a]);
    assert!(s.create_batch(&third).await.unwrap());
    s.close_batch(&open).await.unwrap();
    let batched = s.batched(&asked).await.unwrap();
    let mut left: Vec<(String, String)> = batched.into_iter().map(|(k, c)| (k, c.batch)).collect();
    left.sort();
    assert_eq!(
        left,
        [(key(&a), third.key.clone()), (key(&c), second.key.clone())],
        "only the unclosed records' commits"
    );
    s.close_batch(&third).await.unwrap();
    assert_eq!(s.open_batches(10).await.unwrap().len(), 1);
    s.close_batch(&second).await.unwrap();
    assert!(s.batched(&asked).await.unwrap().is_empty());
    assert!(s.open_batches(10).await.unwrap().is_empty());

    // A task's record: its marker is the task's, and it reads back with the run it carries.
    let id = lanes_core::domain::TaskId::parse(&"e".repeat(64)).unwrap();
    let task = lanes_core::domain::batch::BatchedTask {
        task_id: id.clone(),
        fence: 3,
        lane: lanes_core::domain::Lane::Synthesis,
        kind: lanes_core::domain::Kind::Scaffold,
        custom_id: "t-1".into(),
        tokens: 40,
    };
    let key = lanes_core::domain::batch::task_batch_key("contract", &id, 3);
    let parked = BatchRecord { key: key.clone(), calls: Vec::new(), task: Some(task), ..record(4_000, &[]) };
    assert!(s.create_batch(&parked).await.unwrap());
    assert_eq!(s.open_batches(10).await.unwrap(), std::slice::from_ref(&parked));
    let marker = lanes_core::domain::batch::task_marker(&id);
    let found = s.batched(std::slice::from_ref(&marker)).await.unwrap();
    assert_eq!(found.get(&marker).map(|c| c.batch.as_str()), Some(key.as_str()));
    s.close_batch(&parked).await.unwrap();
    assert!(s.batched(&[marker]).await.unwrap().is_empty());
}

/// A task's event stream: appended in order with increasing ids, read from the start or after an
/// id, a page at a time, each task's apart; a reader waiting for the next event is answered by the
/// append, and one with nothing to read answers after its wait.
pub async fn event_log(log: &dyn lanes_core::ports::EventLog) {
    use lanes_core::domain::events::RunEvent;
    // Ids of this run only: a server shared by runs keeps streams for an hour.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let task = TaskId::parse(&format!("{:064x}", nanos * 2)).unwrap();
    let other = TaskId::parse(&format!("{:064x}", nanos * 2 + 1)).unwrap();
    let started = std::time::Instant::now();
    assert!(log.read(&task, None, 10, Duration::from_millis(300)).await.unwrap().is_empty());
    assert!(started.elapsed() >= Duration::from_millis(250), "waited for an event");
    let run = |text: &str| RunEvent::Delta { run: 1, text: text.into() };
    let first = log.append(&task, &[RunEvent::Running { run: 1 }, run("a")]).await.unwrap();
    let last = log.append(&task, &[run("b"), run("c")]).await.unwrap();
    assert!(last > first);
    log.append(&other, &[run("elsewhere")]).await.unwrap();
    let all = log.read(&task, None, 10, Duration::ZERO).await.unwrap();
    let events: Vec<&RunEvent> = all.iter().map(|(_, e)| e).collect();
    assert_eq!(events, [&RunEvent::Running { run: 1 }, &run("a"), &run("b"), &run("c")]);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "ids increase: {all:?}");
    assert_eq!((all[1].0, all[3].0), (first, last), "append answers its last event's id");
    let after = log.read(&task, Some(first), 10, Duration::ZERO).await.unwrap();
    assert_eq!(after.iter().map(|(_, e)| e).collect::<Vec<_>>(), [&run("b"), &run("c")]);
    assert_eq!(log.read(&task, None, 2, Duration::ZERO).await.unwrap().len(), 2, "a page");
    assert!(log.read(&task, Some(last), 10, Duration::ZERO).await.unwrap().is_empty());
    // A waiting reader gets the next append well before its wait ends.
    let reader = async {
        let started = std::time::Instant::now();
        let got = log.read(&task, Some(last), 10, Duration::from_secs(10)).await.unwrap();
        (got, started.elapsed())
    };
    let writer = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        log.append(&task, &[run("d")]).await.unwrap()
    };
    let ((got, took), id) = tokio::join!(reader, writer);
    assert_eq!(got, [(id, run("d"))]);
    assert!(took < Duration::from_secs(2), "woken by the append, not its wait: {took:?}");
}

/// A new task's put and send: a created record is `PENDING` with exactly one message, the one
/// given, under the id the admission answered; a duplicate is handed the live record and sends
/// nothing.
pub async fn admission(admission: &dyn Admission, store: &dyn TaskStore, queue: &dyn QueueConsume, now: u64) {
    let first = record("admit me", now);
    let attributes = BTreeMap::from([
        ("lane".to_owned(), "interactive".to_owned()),
        (GROUP_ATTRIBUTE.to_owned(), "t-0123456789abcdef".to_owned()),
    ]);
    let message =
        |run: &str| (format!("{{\"task_id\":\"{}\",\"run\":\"{run}\"}}", first.task_id), attributes.clone());
    let Admitted::Sent(id) = admission.admit(&first, now, message("first")).await.unwrap() else {
        panic!("a new record is created and sent")
    };
    let stored = store.get(&first.task_id, now).await.unwrap().unwrap_or_else(|| panic!("stored"));
    assert_eq!((stored.status, stored.nonce.as_str()), (TaskStatus::Pending, first.nonce.as_str()));
    let got = queue.receive_for(10, Some(Duration::from_secs(30))).await.unwrap();
    assert_eq!(got.len(), 1, "one message");
    assert_eq!((&got[0].message_id, got[0].body.as_str()), (&id, message("first").0.as_str()));
    assert_eq!(got[0].attributes.get(GROUP_ATTRIBUTE).map(String::as_str), Some("t-0123456789abcdef"));

    let again = record("admit me", now);
    assert_ne!(again.nonce, first.nonce);
    match admission.admit(&again, now, message("again")).await.unwrap() {
        Admitted::Exists(live) => assert_eq!(live.nonce, first.nonce, "the live record is the first"),
        other => panic!("a duplicate is handed the live record, got {other:?}"),
    }
    assert!(queue.receive_for(10, Some(Duration::from_secs(30))).await.unwrap().is_empty(), "nothing sent");
    queue.delete(&got[0].receipt).await.unwrap();
}
