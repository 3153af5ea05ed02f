//! The queue as the deliveries under one heartbeat see it ([`LeasedQueue`]): each settle first
//! ends the delivery's renewals, and in Lambda an ack leaves the delete to the event source mapping.

use super::{Heartbeat, MAX_DELAY, Outcome};
use crate::ports::{QueueConsume, QueueError, ReceivedMessage};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long settling a delivery waits for a beat already under way ([`Heartbeat::leave_all`]). A
/// beat's renewals are answered in milliseconds; one still out after this is failing and being
/// retried, and waiting on would eat into a Lambda invocation's 2 s deadline margin. Past it the
/// settle goes ahead: at worst that beat, landing later, puts the delivery off by one lease.
pub const LEAVE_WAIT: Duration = Duration::from_secs(1);

/// Where an acked delivery's delete goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deletes {
    /// To the queue, at once.
    Queue,
    /// To Lambda's event source mapping, once the invocation returns.
    Mapping,
}

/// The queue as the deliveries under one [`Heartbeat`] see it: settling a delivery through it (a
/// hand-back, a requeue, a dead letter; an ack outside Lambda) first ends its renewals and waits out
/// a beat already under way ([`Heartbeat::leave_all`]), so no beat can cut a hand-back's delay back
/// to a lease. Every worker settles through one: its own around its own heartbeat ([`Self::new`]),
/// or a Lambda invocation's ([`Self::for_mapping`]), whose acks stay renewed instead (below).
///
/// In Lambda a delete is left to the event source mapping, which deletes every message the
/// invocation does not report as a batch item failure once it returns (`ReportBatchItemFailures`).
/// Until then the invocation's heartbeat keeps each acked delivery hidden ([`Heartbeat::keep`]), so
/// it is not delivered again meanwhile. An ack costs no `DeleteMessage` (a commits batch of 100
/// saves 100 requests). If the invocation dies before it returns, the mapping deletes nothing: the
/// acked deliveries come back after their lease, find their work done (a terminal record, a stored
/// summary) and are settled again. That costs requests (a push's range message lists the push
/// again), never an LLM call.
pub struct LeasedQueue {
    queue: Arc<dyn QueueConsume>,
    heartbeat: Heartbeat,
    deletes: Deletes,
    settled: Mutex<std::collections::HashMap<String, Outcome>>,
}

impl LeasedQueue {
    /// Settles through `queue` (the real one, which `heartbeat` renews through too).
    pub fn new(queue: Arc<dyn QueueConsume>, heartbeat: Heartbeat) -> Self {
        Self { queue, heartbeat, deletes: Deletes::Queue, settled: Mutex::default() }
    }

    /// One Lambda invocation's batch: like [`Self::new`], with each ack's delete left to the event
    /// source mapping.
    pub fn for_mapping(queue: Arc<dyn QueueConsume>, heartbeat: Heartbeat) -> Self {
        Self { deletes: Deletes::Mapping, ..Self::new(queue, heartbeat) }
    }

    /// The heartbeat its deliveries join while they wait and run.
    pub fn heartbeat(&self) -> &Heartbeat {
        &self.heartbeat
    }

    /// How the delivery with `receipt` was settled, if it was: acked, handed back, requeued or
    /// dead-lettered. A worker stopped by the deadline after that point has nothing left to hand
    /// back (and must not hand it back again, which would replace the delay set).
    pub fn settled(&self, receipt: &str) -> Option<Outcome> {
        self.settled.lock().ok().and_then(|s| s.get(receipt).cloned())
    }

    fn settle(&self, receipt: &str, outcome: Option<Outcome>) {
        if let Ok(mut s) = self.settled.lock() {
            match outcome {
                Some(o) => s.insert(receipt.to_owned(), o),
                None => s.remove(receipt),
            };
        }
    }
}

#[async_trait::async_trait]
impl QueueConsume for LeasedQueue {
    async fn receive_for(
        &self,
        max: usize,
        visibility: Option<Duration>,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        self.queue.receive_for(max, visibility).await
    }
    async fn receive_waiting(
        &self,
        max: usize,
        visibility: Option<Duration>,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        self.queue.receive_waiting(max, visibility, wait).await
    }
    /// A visibility other than the lease's is a hand-back: the heartbeat stops renewing that
    /// delivery and a beat already under way lands first, or it would cut the hand-back's delay to a
    /// lease. (A lease start, or a hand-back whose delay is the lease to the millisecond, stays
    /// renewed until its worker returns: no harm, it is only put off later.)
    async fn change_visibility(&self, receipt: &str, timeout: Duration) -> Result<(), QueueError> {
        if timeout == self.heartbeat.ttl {
            return self.queue.change_visibility(receipt, timeout).await;
        }
        self.heartbeat.leave(receipt).await;
        let set = self.queue.change_visibility(receipt, timeout).await;
        self.settle(receipt, Some(Outcome::Retry { after: timeout, reason: "handed back".into() }));
        set
    }
    async fn change_visibility_many(
        &self,
        receipts: &[String],
        timeout: Duration,
    ) -> Vec<Result<(), QueueError>> {
        if timeout == self.heartbeat.ttl {
            return self.queue.change_visibility_many(receipts, timeout).await;
        }
        self.heartbeat.leave_all(&receipts.iter().map(String::as_str).collect::<Vec<_>>()).await;
        let set = self.queue.change_visibility_many(receipts, timeout).await;
        for r in receipts {
            self.settle(r, Some(Outcome::Retry { after: timeout, reason: "handed back".into() }));
        }
        set
    }
    async fn delete(&self, receipt: &str) -> Result<(), QueueError> {
        match self.deletes {
            Deletes::Mapping => self.heartbeat.keep(receipt),
            Deletes::Queue => {
                self.heartbeat.leave(receipt).await;
                self.queue.delete(receipt).await?;
            }
        }
        self.settle(receipt, Some(Outcome::Acked));
        Ok(())
    }
    async fn requeue(&self, message: &ReceivedMessage, delay: Duration) -> Result<(), QueueError> {
        self.heartbeat.leave(&message.receipt).await;
        self.queue.requeue(message, delay).await?;
        let reason = "requeued before the deadline".to_owned();
        self.settle(&message.receipt, Some(Outcome::Requeued { after: delay.min(MAX_DELAY), reason }));
        Ok(())
    }
    async fn dead_letter(&self, message: &ReceivedMessage, reason: &str) -> Result<(), QueueError> {
        self.heartbeat.leave(&message.receipt).await;
        self.queue.dead_letter(message, reason).await?;
        self.settle(&message.receipt, Some(Outcome::DeadLettered { reason: reason.to_owned() }));
        Ok(())
    }
    async fn depth(&self) -> Result<crate::ports::QueueDepth, QueueError> {
        self.queue.depth().await
    }
    fn max_receive_count(&self) -> u32 {
        self.queue.max_receive_count()
    }
}
