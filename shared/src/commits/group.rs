//! One distinct commit of a commits batch and the deliveries carrying it ([`Group`]), and how its
//! run ends ([`GroupEnd`]): what the worker's steps (lookups, budget, fetch, calls, provider
//! batches) read and decide, each for the whole group, so that two deliveries of one commit are
//! settled alike.

use super::report::Done;
use crate::domain::commit::{CommitMessage, Escalation};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

impl Group {
    /// One of its deliveries was sent back by a batch (`e`): the group keeps the dearest floor
    /// and the first enqueue of every delivery, whichever came first in the receive, so a sent-back
    /// copy that meets a plain duplicate is neither batched again nor given a later deadline (nor
    /// charged to its repository's day again), and the sending batch is passed over.
    pub(super) fn escalated_too(&mut self, e: &Escalation) {
        self.sent_back_by.extend(e.from.clone());
        self.enqueued_at_ms = self.enqueued_at_ms.min(e.enqueued_at_ms);
        let merged = match self.commit.escalated.take() {
            None => e.clone(),
            Some(mine) => Escalation {
                floor: e.floor.at_least(Some(mine.floor)),
                enqueued_at_ms: mine.enqueued_at_ms.min(e.enqueued_at_ms),
                from: mine.from.or_else(|| e.from.clone()),
            },
        };
        self.commit.escalated = Some(merged);
    }
}

/// One distinct commit of the batch and the deliveries carrying it.
pub(super) struct Group {
    pub(super) commit: CommitMessage,
    /// Highest receive count among its deliveries (drives the backoff).
    pub(super) receives: u32,
    pub(super) members: Vec<usize>,
    pub(super) lost: CancellationToken,
    pub(super) lock: Option<(String, String)>,
    pub(super) outcome: Option<GroupEnd>,
    /// The repository's daily commit budget it took ([`super::repo_budget`]), given back unless
    /// the commit is summarized.
    pub(super) budget: Option<crate::domain::quota::Charge>,
    /// When the oldest of its deliveries entered the queue (Unix ms): the lane's deadline counts
    /// from here ([`crate::domain::tier::choose`]).
    pub(super) enqueued_at_ms: u64,
    /// The provider batches that sent one of its deliveries back (each delivery's
    /// `escalated.from`): none of them owns the commit any more, whatever its record says. A commit
    /// two workers batched at once is sent back by both batches, and the two deliveries can meet
    /// in one group.
    pub(super) sent_back_by: Vec<String>,
}

pub(super) enum GroupEnd {
    /// Put off without a failure (a lock held elsewhere, throttling, the deadline): never uses up
    /// the commit's deliveries.
    Wait {
        after: Duration,
        reason: String,
    },
    Done(Box<Done>),
    Retry {
        after: Duration,
        reason: String,
    },
    /// Moved to the DLQ: why, and the reason counted (`permanent`, `identity`).
    DeadLetter(String, &'static str),
    /// Carried by a provider batch, whose record now owns it: acked.
    Batched,
    Lost,
}
