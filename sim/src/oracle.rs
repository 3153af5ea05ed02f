//! The invariants, and the book each history keeps to check them: what clients were answered, what
//! each task's runs spent, which terminal writes happened, and a trace of the operations.
//!
//! - **I1.** Every id a client was answered 202 or 200 for ends `COMPLETED`, `FAILED` (with a
//!   reason) or `CANCELLED`, and never reads 404.
//! - **I2.** Each run of a task spends at most one model call (answered, or dropped mid-way: the
//!   provider bills both). A call is a justified extra only when the simulation broke the run beyond
//!   what the design survives: a crash or Lambda's deadline with the call in hand, the lock service
//!   unreachable (for a task's lock, all three of the worker's asks failing) or its keys lost, the
//!   final write failing. Those are counted on their own. A run
//!   parked in a provider batch is the batch's to call: the delivery that parked it never calls the
//!   model while the store holds it parked, whatever answers it lost.
//! - **I3.** At most one terminal write per run; a task its client cancelled stays `CANCELLED`
//!   unless the client submits it again (a redrive is not a submission).
//! - **I4.** The cache never answers `COMPLETED` for a task the store does not hold completed.
//! - **I5.** No delivery is acked while the run it carries is unsettled, unless a provider batch's
//!   record owns it (a synthesis task parked in a batch).
//! - **I7.** A duplicate of an accepted task answers that task (same id, 202 or 200), whatever the
//!   quotas and the cache.
//! - **I8.** Ingress sends a run's message once, and again only after winning a re-send claim: at
//!   most once per enqueue grace however many clients poll, at once when its send is known to have
//!   failed.
//! - **I9.** A paid answer is written: a completed final write is refused only by the client's
//!   cancellation, in a run the simulation broke (as in I2), or after a broken claim took the run
//!   over: one made without the lock (the lock service failing: for a task worker, all three of
//!   its asks in a row) or on a key a failover lost.
//! - **I10.** Every `COMPLETED` answer is the model's whole answer to its task, however many runs
//!   it took: a run lost after saving its text is continued by the next from that text, and nothing
//!   is lost, said twice, or left over from a voided attempt or from another run's save.
//!
//! - **I11.** A run is claimed only on a live delivery: when a worker asks to claim a task's
//!   record, the receipt it holds is still its message's current one (not since received by
//!   another consumer, deleted or dead-lettered). A record claimed on a dead delivery has no message
//!   left to finish it, or put it off, if the run fails. The simulation tells a delivery's receipt
//!   by the receipts of the task its process held live when the delivery first asked for the
//!   task's lock (a duplicate's among them can pass a claim it should not).
//!
//! - **I6.** Every commit of a push the webhook accepted is summarized, in at most one paid call
//!   (the same justified extras as I2; a failed summary write justifies one only when one
//!   delivery's tries all failed and none took effect), or sits in the commits DLQ for a reason that
//!   is not a wait. A commit's delivery is acked only once its summary is written, or while a
//!   provider batch's record owns it (submitted, or past the grace in which its worker may still
//!   delete it), or once that batch's collector has sent it on (I5 for commits).
//! - **I5b** (I5's second half). A message reaches a DLQ only after a failure or a crash: one the worker
//!   dead-lettered names a failure, never a wait (throttling, a lock held, a deadline, an outage);
//!   one the queue moved there was held by a process that crashed on at least one delivery.

use lanes_core::domain::{TaskId, TaskRecord, TaskStatus};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

/// The invariants, by name.
pub const INVARIANTS: [&str; 12] =
    ["I1", "I2", "I3", "I4", "I5", "I5b", "I6", "I7", "I8", "I9", "I10", "I11"];

/// One broken invariant.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    /// Which.
    pub invariant: &'static str,
    /// The task (short id).
    pub task: String,
    /// What was seen.
    pub detail: String,
    /// The operations that led to it (this task's, and crashes), oldest first.
    pub trace: Vec<String>,
}

/// What one task went through.
#[derive(Debug, Default, Clone)]
struct Book {
    runs: u32,
    spend: u32,
    justified: u32,
    why: Vec<String>,
    terminal_writes: u32,
    answered: bool,
    last_send_ms: Option<u64>,
    cancelled_by_client: bool,
    /// The fence the client's last cancellation gave the record.
    cancelled_fence: u64,
    /// True time (ms since the epoch) the current run was created.
    run_since_ms: u64,
    /// Ingress sends the run's creation and won re-send claims allow, not yet made.
    sends_allowed: u32,
    /// `justified` when the current run began: I9 looks only at the run's own breaks.
    justified_before_run: u32,
    /// For each fence claimed, `justified_before_run` of the run it claimed (a refused answer is
    /// judged by its own run's breaks, not by those of a resubmission made since), and whether the
    /// claim was broken: made without the lock, or on a key a failover lost.
    run_of_fence: BTreeMap<u64, (u32, bool)>,
    /// A commit of an accepted push (I6).
    accepted_commit: bool,
    /// A commit the Git host pushed (accepted or not yet).
    pushed_commit: bool,
    /// Deliveries a crash used up while a process held them (I5, second half).
    crashed_holding: u32,
    /// Calls a provider batch made for the current run.
    batch_spent: u32,
    /// Times the current run was given back by its batch.
    given_back_run: u32,
    /// Fences whose parked run its batch gave back (to be called again at flex or sync).
    given_back: std::collections::BTreeSet<u64>,
}

/// The book of one history.
#[derive(Debug, Default)]
pub struct Oracle {
    trace: VecDeque<String>,
    tasks: BTreeMap<String, Book>,
    /// Broken invariants, in the order they were seen.
    pub violations: Vec<Violation>,
    /// Invariants this history gave something to check.
    pub exercised: BTreeMap<&'static str, u64>,
    /// Faults injected.
    pub faults: u64,
    /// The enqueue grace, less twice the largest skew (I8's window).
    pub resend_window_ms: u64,
    /// Largest skew between two processes.
    pub skew_ms: u64,
    /// Commits a provider batch's collector sent on to the queue.
    sent_on: std::collections::BTreeSet<String>,
    /// Completed answers that continued a lost run's saved text, and the tokens they did not pay
    /// for again.
    pub continued: (u32, u64),
    digest: u64,
}

const TRACE_KEEP: usize = 20_000;

impl Oracle {
    /// A book for a history whose ingress re-sends after `grace_ms`, with clocks up to `skew_ms` off.
    pub fn new(grace_ms: u64, skew_ms: u64) -> Self {
        Self { resend_window_ms: grace_ms.saturating_sub(2 * skew_ms), skew_ms, ..Default::default() }
    }

    /// Records an operation.
    pub fn trace(&mut self, now_ms: u64, line: String) {
        if line.contains("injected") || line.contains("answer lost") {
            self.faults += 1;
        }
        for b in line.bytes().chain(now_ms.to_le_bytes()) {
            self.digest = (self.digest ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        if self.trace.len() == TRACE_KEEP {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("{:>9.3}s {line}", now_ms as f64 / 1000.0));
    }

    fn book(&mut self, task: &str) -> &mut Book {
        self.tasks.entry(task.to_owned()).or_default()
    }

    fn exercise(&mut self, invariant: &'static str) {
        *self.exercised.entry(invariant).or_default() += 1;
    }

    /// Flags a violation, with this task's part of the trace.
    pub fn violate(&mut self, invariant: &'static str, task: &str, detail: String) {
        let short: String = task.chars().take(8).collect();
        // One report per invariant and task: the first is the one with the story.
        if self.violations.iter().any(|v| v.invariant == invariant && v.task == short) {
            return;
        }
        let trace: Vec<String> = self
            .trace
            .iter()
            .filter(|l| {
                (!short.is_empty() && l.contains(&short)) || l.contains("CRASH") || l.contains("VANISH")
            })
            // A finished task's reads and duplicates say nothing new.
            .filter(|l| !(l.contains(" client ") && l.contains("-> 200")))
            .cloned()
            .collect();
        let trace = trace[trace.len().saturating_sub(50)..].to_vec();
        self.violations.push(Violation { invariant, task: short, detail, trace });
    }

    /// A `PENDING` record was written for a new run; by the admin (a redrive) or by a client. `was`
    /// is the status it replaced.
    pub fn created(&mut self, task: &str, admin: bool, was: Option<TaskStatus>, now_ms: u64) {
        if admin && was == Some(TaskStatus::Cancelled) {
            self.exercise("I3");
            self.violate("I3", task, "a redrive reset a task its client had cancelled".into());
        }
        let b = self.book(task);
        b.runs += 1;
        b.last_send_ms = None;
        b.run_since_ms = now_ms;
        b.sends_allowed += 1;
        b.justified_before_run = b.justified;
        b.batch_spent = 0;
        b.given_back_run = 0;
        if !admin {
            b.cancelled_by_client = false;
        }
    }

    /// Ingress claimed a re-send of `task` (moved its `enqueued_at_ms` from `from_ms` to `to_ms`,
    /// both its clocks' times): I8 holds if the run's last claim is at least the grace older (less
    /// the skew between the two clocks), unless the message was known unsent.
    pub fn resend_claimed(&mut self, task: &str, to_ms: u64, from_ms: u64) {
        let window = self.resend_window_ms;
        self.exercise("I8");
        let b = self.book(task);
        let now_ms = to_ms;
        b.sends_allowed += 1;
        let last = b.last_send_ms.replace(now_ms);
        if from_ms == lanes_core::ports::UNSENT {
            return;
        }
        if let Some(last) = last
            && now_ms.saturating_sub(last) < window
        {
            let gap = now_ms - last;
            self.violate(
                "I8",
                task,
                format!("re-sent {gap} ms after the last re-send (grace less skew: {window} ms)"),
            );
        }
    }

    /// Ingress is sending a message of `task` (I8): a send its run's creation or a won re-send claim
    /// does not back is one more message per poll.
    pub fn ingress_send(&mut self, task: &str) {
        let b = self.book(task);
        if b.sends_allowed > 0 {
            b.sends_allowed -= 1;
            return;
        }
        self.exercise("I8");
        self.violate("I8", task, "ingress sent a message that no creation or re-send claim backs".into());
    }

    /// A model call of `task` ended as spend (answered, or dropped).
    pub fn spent(&mut self, task: &str) {
        self.book(task).spend += 1;
    }

    /// A provider batch's model answered `task`'s parked run (paid at the batch's price). A run
    /// given back (no batch was made, or one would miss the deadline) is called again: its batch
    /// answering it after that give-back, or before, is the one extra call the design pays for the
    /// deadline (I2).
    pub fn batch_spent(&mut self, task: &str) {
        let b = self.book(task);
        b.spend += 1;
        b.batch_spent += 1;
        if b.given_back_run > 0 {
            self.justify(task, "a provider batch answered a run it had given back");
        }
    }

    /// The batch owning `task`'s run of `fence` gave it back (I2, I9).
    pub fn given_back(&mut self, task: &str, fence: u64) {
        let b = self.book(task);
        b.given_back.insert(fence);
        b.given_back_run += 1;
        if b.batch_spent > 0 {
            self.justify(task, "a run its provider batch had answered was given back");
        }
    }

    /// The simulation broke a run of `task` beyond what the design survives.
    pub fn justify(&mut self, task: &str, why: &str) {
        let b = self.book(task);
        b.justified += 1;
        if b.why.len() < 8 {
            b.why.push(why.to_owned());
        }
    }

    /// A delivery of `id` (a task or a commit) was used up: a process crashed holding it, its run
    /// failed (an attempt), or putting it off failed on the queue.
    pub fn attempted(&mut self, id: &str) {
        self.book(id).crashed_holding += 1;
    }

    /// The Git host pushed commit `sha` (its delivery may not be accepted yet, and its commits
    /// enqueued all the same).
    pub fn commit_pushed(&mut self, sha: &str) {
        self.book(sha).pushed_commit = true;
    }

    /// The webhook accepted a push with commit `sha` (I6).
    pub fn commit_accepted(&mut self, sha: &str) {
        self.book(sha).accepted_commit = true;
    }

    /// Lock keys vanished: every commit of an accepted push without a summary yet may be leased
    /// twice (as a task's run may be).
    pub fn justify_open_commits(&mut self, why: &str) {
        let open: Vec<String> = self
            .tasks
            .iter()
            .filter(|(_, b)| b.pushed_commit && b.terminal_writes == 0)
            .map(|(k, _)| k.clone())
            .collect();
        open.iter().for_each(|sha| self.justify(sha, why));
    }

    /// The commits of accepted pushes.
    pub fn accepted_commits(&self) -> Vec<String> {
        self.tasks.iter().filter(|(_, b)| b.accepted_commit).map(|(k, _)| k.clone()).collect()
    }

    /// A summary of `sha` was written.
    pub fn summary_written(&mut self, sha: &str) {
        self.book(sha).terminal_writes += 1;
    }

    /// A batch's collector sent commit `sha` on to the queue (unanswered, escalated, or its batch
    /// never made): a message of it is in the queue again.
    pub fn commit_sent_on(&mut self, sha: &str) {
        self.sent_on.insert(sha.to_owned());
    }

    /// A delivery of commit `sha` is being acked (I5 for commits): its summary must be written, or
    /// a provider batch's record must own it (`batched`), or its collector must have sent it on (a
    /// delivery acked as pending just before its batch ended).
    pub fn commit_acked(&mut self, sha: &str, summarized: bool, batched: bool) {
        self.exercise("I5");
        if !summarized && !batched && !self.sent_on.contains(sha) {
            self.violate(
                "I5",
                sha,
                "a commit's delivery acked with no summary written and no batch owning it".into(),
            );
        }
    }

    /// The worker's reason for dead-lettering names a wait (I5, second half).
    fn is_wait(reason: &str) -> bool {
        const WAITS: [&str; 6] = [
            "store unavailable",
            "queue unavailable",
            "lease held",
            "not reached before the deadline",
            "429",
            "lock unavailable",
        ];
        WAITS.iter().any(|w| reason.contains(w))
    }

    /// I6, and I5's second half for commits, given each accepted commit's end: summarized, and the
    /// commits DLQ's reason when it holds the commit (`Some(None)`: moved there by the queue).
    pub fn finish_commits(&mut self, finals: &BTreeMap<String, (bool, Option<Option<String>>)>) {
        for (sha, (summarized, dlq)) in finals {
            let b = self.tasks.get(sha).cloned().unwrap_or_default();
            self.exercise("I6");
            if let Some(reason) = dlq {
                self.dead_lettered(sha, reason.as_deref());
            }
            if *summarized {
                if b.spend > 1 + b.justified {
                    let why = b.why.join("; ");
                    let detail =
                        format!("summarized in {} paid calls ({} justified: {why})", b.spend, b.justified);
                    self.violate("I6", sha, detail);
                }
            } else if dlq.is_none() {
                self.violate("I6", sha, "accepted, never summarized, and not in the commits DLQ".into());
            }
        }
    }

    /// I5's second half for the task lanes, given the task messages their DLQs hold at the end
    /// (the task, and the worker's reason when it dead-lettered the message itself).
    pub fn finish_task_dlqs(&mut self, held: &[(TaskId, Option<String>)]) {
        for (task, reason) in held {
            self.dead_lettered(task, reason.as_deref());
        }
    }

    /// I5's second half for one message (of a task or a commit) a DLQ holds at the end: `reason` is
    /// the worker's when it dead-lettered the message itself, `None` when the queue moved it there
    /// (its receive count ran out), which only a used-up delivery may explain.
    fn dead_lettered(&mut self, id: &str, reason: Option<&str>) {
        let used_up = self.tasks.get(id).map_or(0, |b| b.crashed_holding);
        self.exercise("I5b");
        match reason {
            Some(r) if Self::is_wait(r) => {
                self.violate("I5b", id, format!("dead-lettered by the worker for a wait: {r}"))
            }
            None if used_up == 0 => self.violate(
                "I5b",
                id,
                "moved to the DLQ by the queue with no crash, failure or failed put-off behind it".into(),
            ),
            _ => {}
        }
    }

    /// A terminal write took effect.
    pub fn terminal_write(&mut self, task: &str, _status: &str) {
        self.book(task).terminal_writes += 1;
    }

    /// A claim gave the current run `fence`; `broken` if its delivery held no lock (degraded) or
    /// one a failover has since lost.
    pub fn claimed(&mut self, task: &str, fence: u64, broken: bool) {
        let b = self.book(task);
        let since = b.justified_before_run;
        b.run_of_fence.insert(fence, (since, broken));
    }

    /// A completed final write with `fence` was refused by the fence; `current` is the record then
    /// (I9).
    pub fn answer_refused(&mut self, task: &str, fence: u64, current: Option<&TaskRecord>) {
        self.exercise("I9");
        let b = self.book(task);
        let since = b.run_of_fence.get(&fence).map_or(b.justified_before_run, |(since, _)| *since);
        // A broken claim since this run's own may have taken over a run that was still live: the
        // fence then refuses the older answer, as designed (only the lock keeps runs single).
        let taken_over = b.run_of_fence.range(fence + 1..).any(|(_, (_, broken))| *broken);
        if b.cancelled_fence > fence || b.justified > since || taken_over || b.given_back.contains(&fence) {
            // Its client cancelled this run, the simulation broke it or its taker, or its batch
            // gave it back before the deadline and a later claim answered it.
            return;
        }
        let detail = match current {
            Some(r) => format!(
                "a paid answer was thrown away: the record was {:?} ({})",
                r.status,
                r.error.clone().unwrap_or_default()
            ),
            None => "a paid answer was thrown away: the record is gone".into(),
        };
        self.violate("I9", task, detail);
    }

    /// A delivery of `task`, sent at `sent_at_ms` (true time since the epoch), is being acked while
    /// the store holds `record` (I5), and `batched` says whether a provider batch's record owns the
    /// run (it is parked, and the record with its marker exists). A message sent before the
    /// current run began carries an earlier run, which may be acked.
    pub fn acked(&mut self, task: &str, record: Option<&TaskRecord>, sent_at_ms: u64, batched: bool) {
        self.exercise("I5");
        let since = self.tasks.get(task).map_or(0, |b| b.run_since_ms);
        if let Some(r) = record
            && !r.status.is_terminal()
            && !batched
            && since <= sent_at_ms
        {
            self.violate("I5", task, format!("acked while the record is {:?}", r.status));
        }
    }

    /// The cache answered `COMPLETED` for `task` while the store holds `stored` (I4).
    pub fn cache_answer(&mut self, task: &str, stored: Option<&TaskRecord>) {
        self.exercise("I4");
        if stored.map(|r| r.status) != Some(TaskStatus::Completed) {
            let st = stored.map_or("nothing".to_owned(), |r| format!("{:?}", r.status));
            self.violate("I4", task, format!("the cache answered COMPLETED, the store holds {st}"));
        }
    }

    /// A claim of `task` was made by a delivery whose receipt was `live` when it asked (I11).
    pub fn claimed_on(&mut self, task: &str, live: bool) {
        self.exercise("I11");
        if !live {
            self.violate(
                "I11",
                task,
                "claimed on a delivery no longer current (received again, deleted or dead-lettered)".into(),
            );
        }
    }

    /// A client was answered 202 or 200 for `task`.
    pub fn answered(&mut self, task: &str) {
        self.book(task).answered = true;
    }

    /// A client read 404 for `task`.
    pub fn read_missing(&mut self, task: &str) {
        if self.tasks.get(task).is_some_and(|b| b.answered) {
            self.exercise("I1");
            self.violate("I1", task, "read 404 after a 202 or 200".into());
        }
    }

    /// A POST of an accepted task was answered `code` (I7); `stored` is the record then, `id` the
    /// id the answer named.
    pub fn duplicate_answer(&mut self, task: &str, code: u16, id: Option<&str>, stored: Option<&TaskRecord>) {
        let Some(b) = self.tasks.get(task) else { return };
        if !b.answered {
            return;
        }
        self.exercise("I7");
        let live = stored.is_some_and(|r| !lanes_core::domain::lifecycle::is_resubmittable(r.status));
        if (code == 200 || code == 202) && id != Some(task) {
            self.violate("I7", task, format!("a duplicate was answered for another id {id:?}"));
        } else if live && (400..500).contains(&code) {
            self.violate("I7", task, format!("a duplicate of an accepted task was answered {code}"));
        }
    }

    /// Its client cancelled `task`, moving the fence to `fence`.
    pub fn cancelled(&mut self, task: &str, fence: u64) {
        let b = self.book(task);
        b.cancelled_by_client = true;
        b.cancelled_fence = b.cancelled_fence.max(fence);
    }

    /// The checks at the end of a history, given each task's final record.
    pub fn finish(&mut self, finals: &BTreeMap<String, Option<TaskRecord>>) -> Vec<u32> {
        let mut per_run = Vec::new();
        let tasks: Vec<(String, Book)> = self.tasks.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (task, b) in tasks {
            let last = finals.get(&task).cloned().flatten();
            if b.answered {
                self.exercise("I1");
                match &last {
                    None => self.violate("I1", &task, "answered 202/200, and the record is gone".into()),
                    Some(r) if !r.status.is_terminal() => self.violate(
                        "I1",
                        &task,
                        format!("answered 202/200, and never finished: {:?}", r.status),
                    ),
                    Some(r)
                        if r.status == TaskStatus::Failed && r.error.as_deref().unwrap_or("").is_empty() =>
                    {
                        self.violate("I1", &task, "FAILED without a reason".into())
                    }
                    _ => {}
                }
            }
            if let Some(r) = last.as_ref().filter(|r| r.status == TaskStatus::Completed) {
                self.whole_answer(&task, r);
            }
            if b.runs > 0 {
                self.exercise("I2");
                per_run.push(b.spend.div_ceil(b.runs.max(1)));
                if b.spend > b.runs + b.justified {
                    let why = b.why.join("; ");
                    self.violate(
                        "I2",
                        &task,
                        format!(
                            "{} model calls for {} runs ({} justified: {why})",
                            b.spend, b.runs, b.justified
                        ),
                    );
                }
                self.exercise("I3");
                if b.terminal_writes > b.runs {
                    self.violate(
                        "I3",
                        &task,
                        format!("{} terminal writes for {} runs", b.terminal_writes, b.runs),
                    );
                }
            }
            if b.cancelled_by_client {
                self.exercise("I3");
                if let Some(r) = &last
                    && r.status != TaskStatus::Cancelled
                {
                    self.violate("I3", &task, format!("cancelled by its client, and ended {:?}", r.status));
                }
            }
        }
        per_run
    }

    /// I10 on a completed record: its text is the sync model's answer to the task, or the batch
    /// model's to its prompt.
    fn whole_answer(&mut self, task: &str, r: &TaskRecord) {
        let Some(result) = &r.result else { return };
        self.exercise("I10");
        let whole = crate::faults::sim_answer(task);
        if result.text != whole
            && result.text != lanes_core::commits::prompt::offline_answer(&r.request.prompt)
        {
            let detail = format!("completed with {:?}; the model's answer is {whole:?}", result.text);
            self.violate("I10", task, detail);
        }
        if result.tokens_saved > 0 {
            self.continued.0 += 1;
            self.continued.1 += result.tokens_saved;
        }
    }

    /// Model calls beyond one per run (one per commit: a commit's summary is its only answer) that
    /// the simulation's breaks justify.
    pub fn justified_extra(&self) -> u32 {
        let extra =
            |b: &Book| b.spend.saturating_sub(if b.pushed_commit { 1 } else { b.runs }).min(b.justified);
        self.tasks.values().map(extra).sum()
    }

    /// The trace kept (the last 20,000 operations).
    pub fn lines(&self) -> Vec<String> {
        self.trace.iter().cloned().collect()
    }

    /// A digest of every traced operation and its time: equal for equal histories.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Runs in this history.
    pub fn runs(&self) -> u32 {
        self.tasks.values().map(|b| b.runs).sum()
    }
}
