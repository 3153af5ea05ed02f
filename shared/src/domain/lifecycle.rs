//! The task record's transition table: every change a store may make to a task record, written
//! once, as data ([`TRANSITIONS`]), with [`apply`] to carry a row out on a record in memory.
//!
//! A row says which records an event applies to (the statuses of a live record, or none at all),
//! which guards must hold (the caller's fence, the `enqueued_at_ms` it read, the message's send
//! time), the status it leaves, whether the fence moves on, which time it stamps, how long the
//! record lives after it, and whether the run's saved text is kept, written or removed. Both stores derive their writes from the rows: the embedded store runs
//! [`apply`] inside one write transaction, and the DynamoDB adapter renders each row's condition and
//! update expressions from the same row. The contract suite walks the table against each store, so
//! a transition written in one place and not the other fails a test. What an event writes besides
//! (the result, the failure reason, the attempt count, a new submission's fields) is its
//! [`Command`]'s content, not a transition.
//!
//! Pure: times are passed in.

use super::task::{TaskRecord, TaskResult, TaskStatus};

/// Longest failure reason a record keeps (both stores cut it here).
pub const MAX_ERROR_CHARS: usize = 4096;

/// `enqueued_at_ms` of a `PENDING` record whose message is known unsent (its send failed): the
/// next duplicate or read sends it at once.
pub const UNSENT: u64 = 0;

/// What happens to a task record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A client's submission: a new record, or a new run of a finished one.
    Submit,
    /// Ingress claims a (re-)send of the record's message, or marks it unsent.
    MarkEnqueued,
    /// A worker takes the run.
    Claim,
    /// A provider call of the run failed for a reason other than throttling.
    NoteAttempt,
    /// The run's fenced final write, with the model's answer.
    Complete,
    /// The run's fenced final write, with a reason retrying cannot fix.
    Fail,
    /// The client cancels.
    Cancel,
    /// The DLQ sweep settles a run no worker will finish.
    FailUnfinished,
    /// The run's claim hands it to a provider batch: no claim takes it while the batch owns it.
    Park,
    /// The batch's collector gives the run back (no batch was made, or it will miss the deadline),
    /// so a delivery of its message can claim it again.
    Unpark,
    /// The run saves its text so far ([`super::task::Partial`]).
    Checkpoint,
}

/// A condition on the stored record beyond its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// The record's fence is the caller's (the claim it holds, or the record it read).
    Fence,
    /// `enqueued_at_ms` still reads what the caller read (a compare-and-set).
    EnqueuedAt,
    /// The run was submitted no later than the message's send time (plus skew): a resubmission
    /// made since is another run.
    CreatedBefore,
    /// No provider batch owns the run.
    Unparked,
    /// A provider batch owns the run.
    Parked,
}

/// The time a transition writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// None.
    Nothing,
    /// `enqueued_at_ms`, to the caller's value.
    Enqueued,
    /// `started_at_ms`, to now.
    Started,
    /// `finished_at_ms`, to now.
    Finished,
}

/// How long the record lives after the transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Unchanged.
    Keep,
    /// `now + ttl_secs`, the caller's TTL (a new message's retention, a claim's or a finished
    /// record's life). Set, not extended: DynamoDB's update cannot take a maximum, and each
    /// caller's TTL outlives what it follows.
    FromNow,
    /// The submitted record's own.
    Submitted,
}

/// What the fence does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Stays (a new submission keeps it too, past an expiry: a worker still holding a fence from
    /// the earlier run must never finish the new one).
    Keep,
    /// Moves on by one, so no claim still running can write.
    Bump,
}

/// What a transition does to the saved partial text ([`super::task::Partial`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Kept: a takeover's claim continues from it.
    Keep,
    /// Written: the run's text so far.
    Save,
    /// Removed: the run it belongs to has ended, or a new run starts afresh.
    Clear,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The event.
    pub event: Event,
    /// The statuses of a live (unexpired) record it applies to.
    pub from: &'static [TaskStatus],
    /// Whether it also applies where no live record is (never written, or expired).
    pub or_absent: bool,
    /// What must hold besides.
    pub guards: &'static [Guard],
    /// The status it leaves; `None` keeps the record's.
    pub to: Option<TaskStatus>,
    /// The fence rule.
    pub fence: Fence,
    /// The time it writes.
    pub stamp: Stamp,
    /// The record's life after it.
    pub expiry: Expiry,
    /// The saved partial text.
    pub progress: Progress,
}

use TaskStatus::{Cancelled, Completed, Failed, Pending, Processing};

/// Every transition of a task record. `Completed` is final: no row leaves it.
pub const TRANSITIONS: [Transition; 11] = [
    Transition {
        event: Event::Submit,
        from: &[Failed, Cancelled],
        or_absent: true,
        guards: &[],
        to: Some(Pending),
        fence: Fence::Keep,
        stamp: Stamp::Nothing,
        expiry: Expiry::Submitted,
        progress: Progress::Clear,
    },
    Transition {
        event: Event::MarkEnqueued,
        from: &[Pending],
        or_absent: false,
        guards: &[Guard::Fence, Guard::EnqueuedAt],
        to: None,
        fence: Fence::Keep,
        stamp: Stamp::Enqueued,
        expiry: Expiry::FromNow,
        progress: Progress::Keep,
    },
    Transition {
        event: Event::Claim,
        from: &[Pending, Processing],
        or_absent: false,
        guards: &[Guard::Unparked],
        to: Some(Processing),
        fence: Fence::Bump,
        stamp: Stamp::Started,
        expiry: Expiry::FromNow,
        progress: Progress::Keep,
    },
    Transition {
        event: Event::NoteAttempt,
        from: &[Processing],
        or_absent: false,
        guards: &[Guard::Fence],
        to: None,
        fence: Fence::Keep,
        stamp: Stamp::Nothing,
        expiry: Expiry::Keep,
        progress: Progress::Keep,
    },
    Transition {
        event: Event::Complete,
        from: &[Processing],
        or_absent: false,
        guards: &[Guard::Fence],
        to: Some(Completed),
        fence: Fence::Keep,
        stamp: Stamp::Finished,
        expiry: Expiry::FromNow,
        progress: Progress::Clear,
    },
    Transition {
        event: Event::Fail,
        from: &[Processing],
        or_absent: false,
        guards: &[Guard::Fence],
        to: Some(Failed),
        fence: Fence::Keep,
        stamp: Stamp::Finished,
        expiry: Expiry::FromNow,
        progress: Progress::Clear,
    },
    Transition {
        event: Event::Cancel,
        from: &[Pending, Processing],
        or_absent: false,
        guards: &[],
        to: Some(Cancelled),
        fence: Fence::Bump,
        stamp: Stamp::Finished,
        expiry: Expiry::FromNow,
        progress: Progress::Clear,
    },
    Transition {
        event: Event::FailUnfinished,
        from: &[Pending, Processing],
        or_absent: false,
        guards: &[Guard::CreatedBefore],
        to: Some(Failed),
        fence: Fence::Bump,
        stamp: Stamp::Finished,
        expiry: Expiry::FromNow,
        progress: Progress::Clear,
    },
    // The record lives on from the park for the caller's TTL (a claim's, which outlives any
    // deadline a task may ask for), so it outlives the batch.
    Transition {
        event: Event::Park,
        from: &[Processing],
        or_absent: false,
        guards: &[Guard::Fence, Guard::Unparked],
        to: None,
        fence: Fence::Keep,
        stamp: Stamp::Nothing,
        expiry: Expiry::FromNow,
        progress: Progress::Keep,
    },
    Transition {
        event: Event::Unpark,
        from: &[Processing],
        or_absent: false,
        guards: &[Guard::Fence, Guard::Parked],
        to: None,
        fence: Fence::Keep,
        stamp: Stamp::Nothing,
        expiry: Expiry::Keep,
        progress: Progress::Keep,
    },
    // A run that was handed to a provider batch saves nothing: the batch answers whole.
    Transition {
        event: Event::Checkpoint,
        from: &[Processing],
        or_absent: false,
        guards: &[Guard::Fence, Guard::Unparked],
        to: None,
        fence: Fence::Keep,
        stamp: Stamp::Nothing,
        expiry: Expiry::Keep,
        progress: Progress::Save,
    },
];

/// The row of `event`.
pub fn transition(event: Event) -> &'static Transition {
    // Every event has exactly one row (a test says so), so the search always ends in a find.
    TRANSITIONS.iter().find(|t| t.event == event).unwrap_or(&TRANSITIONS[0])
}

impl Transition {
    /// Whether the row applies to what is stored, before its guards: `live` is the record if it
    /// exists and has not expired.
    pub fn admits(&self, live: Option<&TaskRecord>) -> bool {
        match live {
            None => self.or_absent,
            Some(r) => self.from.contains(&r.status),
        }
    }
}

/// A compare-and-set of a `PENDING` record's `enqueued_at_ms` ([`Event::MarkEnqueued`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnqueueMark {
    /// The fence of the record read.
    pub fence: u64,
    /// Its `enqueued_at_ms` as read.
    pub from_ms: u64,
    /// The new value: the time of a send about to be made, or [`UNSENT`].
    pub to_ms: u64,
}

/// How a claimed task ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Completion {
    /// The model answered.
    Completed(TaskResult),
    /// Retrying cannot fix it.
    Failed(String),
}

/// An event with what it carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// A new submission's record.
    Submit(Box<TaskRecord>),
    /// A re-send's compare-and-set.
    MarkEnqueued(EnqueueMark),
    /// A claim.
    Claim,
    /// A failed attempt of the claim holding `fence`.
    NoteAttempt {
        /// The claim's fence.
        fence: u64,
        /// Why it failed.
        reason: String,
    },
    /// The final write of the claim holding `fence`.
    Finish {
        /// The claim's fence.
        fence: u64,
        /// How it ended.
        completion: Completion,
    },
    /// A cancellation.
    Cancel,
    /// The DLQ's settlement of a message sent at `sent_before_ms` (plus skew).
    FailUnfinished {
        /// Why.
        reason: String,
        /// The message's send time plus the clock skew allowed.
        sent_before_ms: u64,
    },
    /// The claim holding `fence` hands the run to a provider batch.
    Park {
        /// The claim's fence.
        fence: u64,
        /// The batch and the deadline.
        parked: super::task::Parked,
    },
    /// The batch owning the run of `fence` gives it back.
    Unpark {
        /// The parked claim's fence.
        fence: u64,
    },
    /// The claim holding `fence` saves its text so far.
    Checkpoint {
        /// The claim's fence.
        fence: u64,
        /// The text.
        text: String,
    },
}

impl Command {
    /// Its event.
    pub fn event(&self) -> Event {
        match self {
            Command::Submit(_) => Event::Submit,
            Command::MarkEnqueued(_) => Event::MarkEnqueued,
            Command::Claim => Event::Claim,
            Command::NoteAttempt { .. } => Event::NoteAttempt,
            Command::Finish { completion: Completion::Completed(_), .. } => Event::Complete,
            Command::Finish { completion: Completion::Failed(_), .. } => Event::Fail,
            Command::Cancel => Event::Cancel,
            Command::FailUnfinished { .. } => Event::FailUnfinished,
            Command::Park { .. } => Event::Park,
            Command::Unpark { .. } => Event::Unpark,
            Command::Checkpoint { .. } => Event::Checkpoint,
        }
    }

    /// The fence the caller holds or read, for [`Guard::Fence`].
    pub fn fence(&self) -> Option<u64> {
        match self {
            Command::MarkEnqueued(m) => Some(m.fence),
            Command::NoteAttempt { fence, .. }
            | Command::Finish { fence, .. }
            | Command::Park { fence, .. }
            | Command::Unpark { fence }
            | Command::Checkpoint { fence, .. } => Some(*fence),
            _ => None,
        }
    }

    /// Whether `guard` holds on `r`.
    pub fn holds(&self, guard: Guard, r: &TaskRecord) -> bool {
        match (guard, self) {
            (Guard::Fence, _) => self.fence() == Some(r.fence),
            (Guard::EnqueuedAt, Command::MarkEnqueued(m)) => r.enqueued_at_ms == m.from_ms,
            (Guard::CreatedBefore, Command::FailUnfinished { sent_before_ms, .. }) => {
                r.created_at_ms <= *sent_before_ms
            }
            (Guard::Unparked, _) => r.parked.is_none(),
            (Guard::Parked, _) => r.parked.is_some(),
            _ => false,
        }
    }
}

/// A failure reason as stored.
pub fn stored_reason(reason: &str) -> String {
    reason.chars().take(MAX_ERROR_CHARS).collect()
}

/// Carries `command` out on `stored` (the record as held, expired or not) at `now_ms`: the record
/// to write, or `None` where its row refuses it. `ttl_secs` is the caller's, for
/// [`Expiry::FromNow`].
pub fn apply(
    command: Command,
    stored: Option<&TaskRecord>,
    now_ms: u64,
    ttl_secs: u64,
) -> Option<TaskRecord> {
    let row = transition(command.event());
    let live = stored.filter(|r| !r.is_expired(now_ms));
    if !row.admits(live) || !live.is_none_or(|r| row.guards.iter().all(|g| command.holds(*g, r))) {
        return None;
    }
    let kept_fence = stored.map_or(0, |r| r.fence);
    let mut next = match (&command, live) {
        (Command::Submit(submitted), _) => (**submitted).clone(),
        (_, Some(r)) => r.clone(),
        (_, None) => return None,
    };
    next.fence = match row.fence {
        Fence::Keep => kept_fence,
        Fence::Bump => kept_fence + 1,
    };
    if let Some(status) = row.to {
        next.status = status;
    }
    match row.stamp {
        Stamp::Nothing => {}
        Stamp::Enqueued => {
            if let Command::MarkEnqueued(m) = &command {
                next.enqueued_at_ms = m.to_ms;
            }
        }
        Stamp::Started => next.started_at_ms = Some(now_ms),
        Stamp::Finished => next.finished_at_ms = Some(now_ms),
    }
    match row.expiry {
        Expiry::Keep | Expiry::Submitted => {}
        Expiry::FromNow => next.expires_at = now_ms / 1000 + ttl_secs,
    }
    if row.progress == Progress::Clear {
        next.partial = None;
    }
    content(command, &mut next);
    Some(next)
}

/// What an event writes besides its transition.
fn content(command: Command, r: &mut TaskRecord) {
    match command {
        Command::NoteAttempt { reason, .. } => {
            r.attempts += 1;
            r.error = Some(stored_reason(&reason));
        }
        Command::Finish { completion: Completion::Completed(result), .. } => {
            r.result = Some(result);
            r.error = None;
        }
        Command::Finish { completion: Completion::Failed(reason), .. }
        | Command::FailUnfinished { reason, .. } => {
            r.error = Some(stored_reason(&reason));
        }
        Command::Park { parked, .. } => r.parked = Some(parked),
        Command::Unpark { .. } => r.parked = None,
        Command::Checkpoint { fence, text } => r.partial = Some(super::task::Partial { text, run: fence }),
        Command::Submit(_) | Command::MarkEnqueued(_) | Command::Claim | Command::Cancel => {}
    }
}

/// Whether a new submission of the same payload replaces a live record in `status` and runs
/// again (the statuses the submission's row leaves).
pub fn is_resubmittable(status: TaskStatus) -> bool {
    transition(Event::Submit).from.contains(&status)
}

/// Whether some row takes a record in `from` to `to` (a row that keeps the status is `from -> from`).
pub fn can_become(from: TaskStatus, to: TaskStatus) -> bool {
    TRANSITIONS.iter().any(|t| t.from.contains(&from) && t.to.unwrap_or(from) == to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TaskRequest;
    use serde_json::json;

    fn pending(now: u64) -> TaskRecord {
        let req = TaskRequest::from_value(
            json!({"project_id":"p","kind":"explain","prompt":"x","target_files":[]}),
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        TaskRecord::pending(req.task_id(None), req, now, 3600)
    }

    #[test]
    fn every_event_has_one_row() {
        use Event::*;
        for e in [
            Submit,
            MarkEnqueued,
            Claim,
            NoteAttempt,
            Complete,
            Fail,
            Cancel,
            FailUnfinished,
            Park,
            Unpark,
            Checkpoint,
        ] {
            assert_eq!(TRANSITIONS.iter().filter(|t| t.event == e).count(), 1, "{e:?}");
            assert_eq!(transition(e).event, e);
        }
    }

    #[test]
    fn a_parked_run_is_claimed_by_no_one_until_given_back_and_keeps_its_fence() {
        let claimed = apply(Command::Claim, Some(&pending(1_000)), 2_000, 3600).unwrap_or_else(|| panic!());
        let parked = super::super::task::Parked { batch: "lanes-t".into(), due_ms: 9_000 };
        let park = |fence| Command::Park { fence, parked: parked.clone() };
        assert_eq!(apply(park(claimed.fence + 1), Some(&claimed), 3_000, 3600), None, "fenced");
        let p = apply(park(claimed.fence), Some(&claimed), 3_000, 3600).unwrap_or_else(|| panic!());
        assert_eq!((p.status, p.fence, p.parked.as_ref()), (Processing, claimed.fence, Some(&parked)));
        assert_eq!(p.view().expected_by_ms, Some(9_000));
        assert_eq!(apply(Command::Claim, Some(&p), 4_000, 3600), None, "no claim takes it");
        assert_eq!(apply(park(p.fence), Some(&p), 4_000, 3600), None, "parked once");
        // The batch's answer is the claim's fenced write; a cancel moves the fence past it.
        let done = Command::Finish { fence: p.fence, completion: Completion::Failed("x".into()) };
        assert!(apply(done.clone(), Some(&p), 4_000, 3600).is_some());
        let cancelled = apply(Command::Cancel, Some(&p), 4_000, 3600).unwrap_or_else(|| panic!());
        assert_eq!((cancelled.view().tier, apply(done, Some(&cancelled), 4_000, 3600)), (None, None));
        let back =
            apply(Command::Unpark { fence: p.fence }, Some(&p), 5_000, 3600).unwrap_or_else(|| panic!());
        assert_eq!((back.parked.as_ref(), back.fence), (None, p.fence));
        assert_eq!(apply(Command::Unpark { fence: p.fence }, Some(&back), 5_000, 3600), None);
        assert_eq!(apply(Command::Claim, Some(&back), 6_000, 3600).map(|r| r.fence), Some(p.fence + 1));
    }

    #[test]
    fn the_state_machine_is_the_tables() {
        let all = [Pending, Processing, Completed, Failed, Cancelled];
        let legal = [
            (Pending, Pending),
            (Pending, Processing),
            (Pending, Failed),
            (Pending, Cancelled),
            (Processing, Processing),
            (Processing, Completed),
            (Processing, Failed),
            (Processing, Cancelled),
            (Failed, Pending),
            (Cancelled, Pending),
        ];
        assert!(is_resubmittable(Failed) && is_resubmittable(Cancelled) && !is_resubmittable(Completed));
        for a in all {
            for b in all {
                assert_eq!(can_become(a, b), legal.contains(&(a, b)), "{a:?} -> {b:?}");
            }
        }
    }

    #[test]
    fn a_claim_moves_the_fence_and_a_stale_write_is_refused() {
        let r = pending(1_000);
        let c = apply(Command::Claim, Some(&r), 2_000, 60).unwrap_or_else(|| panic!("claimable"));
        assert_eq!((c.status, c.fence, c.started_at_ms, c.expires_at), (Processing, 1, Some(2_000), 62));
        let done = Command::Finish { fence: 0, completion: Completion::Failed("x".into()) };
        assert_eq!(apply(done, Some(&c), 3_000, 60), None, "an old fence writes nothing");
        let fail = Command::Finish { fence: 1, completion: Completion::Failed("y".repeat(5000)) };
        let f = apply(fail, Some(&c), 3_000, 60).unwrap_or_else(|| panic!("the fence holds"));
        assert_eq!((f.status, f.error.map(|e| e.len())), (Failed, Some(MAX_ERROR_CHARS)));
    }

    #[test]
    fn a_submission_replaces_only_what_is_gone_or_resubmittable_and_keeps_the_fence() {
        let mut old = pending(1_000);
        old.fence = 4;
        let new = pending(2_000);
        assert_eq!(apply(Command::Submit(Box::new(new.clone())), Some(&old), 2_000, 60), None);
        old.status = Cancelled;
        let again = apply(Command::Submit(Box::new(new.clone())), Some(&old), 2_000, 60);
        assert_eq!(again.map(|r| (r.status, r.fence, r.nonce)), Some((Pending, 4, new.nonce.clone())));
        // Past its expiry a record counts as absent for every event but a submission keeps its fence.
        old.status = Processing;
        let late = 1_000 + 3_601_000;
        assert_eq!(apply(Command::Claim, Some(&old), late, 60), None);
        assert_eq!(apply(Command::Submit(Box::new(new)), Some(&old), late, 60).map(|r| r.fence), Some(4));
    }
}
