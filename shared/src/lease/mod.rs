//! The lease on a delivery, for both flows and the Lambda glue: starting it (one delivery, or a
//! whole batch at once), the heartbeat that renews a batch's leases together, the queue view through
//! which its deliveries are settled (ending their renewals first; in Lambda, leaving deletes to the
//! event source mapping), the ways a delivery ends (ack, hand-back, requeue as a fresh copy,
//! dead-letter) with the backoff of a hand-back, and the release of deliveries nobody will start
//! (a pool's surplus, a DLQ sweep's peek) or the hiding of swept ones. Outside the queue adapters
//! and their twins, this is the only module that changes a message's visibility
//! (`tests/layers.rs` checks it).
//!
//! Why a lease at all: Lambda wants the queue's own visibility timeout at least as long as the
//! function's, so a crashed worker would hide its message for that long. The worker shortens it
//! at receipt to `lease_ttl` (one `ChangeMessageVisibilityBatch` for a Lambda batch, [`start_many`])
//! and the heartbeat extends it every
//! `renew_interval` (a third of the TTL, so two renewals may fail before it runs out). The lock in
//! Redis is renewed on the same beat, beside the visibility and not after it: a lock another worker
//! holds means the work is theirs now, and it is cancelled rather than finished twice. A lock lost
//! in a failover is taken again; a refused receipt under a lock still ours is left to the fence.
//!
//! The heartbeat is [`heartbeat`]'s, and the queue view that settles through it [`queue`]'s.

mod heartbeat;
mod queue;

pub use heartbeat::{AbortOnDrop, CancelProbe, Heartbeat, Leased, Membership, Watch};
pub use queue::{LEAVE_WAIT, LeasedQueue};

use crate::config::WorkerConfig;
use crate::domain::TaskId;
use crate::metrics::Metrics;
use crate::ports::{QueueConsume, QueueError, ReceivedMessage};
use std::time::Duration;
use tracing::warn;

/// What became of one delivery. `Acked`, `Requeued` and `DeadLettered` remove it from its queue (an
/// acked one in Lambda once the invocation returns, see [`LeasedQueue::for_mapping`]); everything else leaves
/// it to come back (a batch item failure in Lambda).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The record is terminal and the message was deleted (in a Lambda batch: left for the event
    /// source mapping to delete, see [`LeasedQueue::for_mapping`]).
    Acked,
    /// Handed back to come again after `after` (a failure worth retrying, or a wait).
    Retry {
        /// The visibility set on the message.
        after: Duration,
        /// Why.
        reason: String,
    },
    /// On its last delivery, put off by a fresh copy of the message (see [`retry_later`]); this
    /// delivery is deleted.
    Requeued {
        /// The copy's delay.
        after: Duration,
        /// Why.
        reason: String,
    },
    /// The lease was lost (or the fence moved): nothing was written, the message is left to its next
    /// delivery.
    LeaseLost,
    /// Moved to the DLQ (undecodable, or out of attempts with the record marked `FAILED`).
    DeadLettered {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// Whether the message stays in its queue (an `SQSBatchItemFailure` in Lambda).
    pub fn is_batch_item_failure(&self) -> bool {
        !matches!(self, Outcome::Acked | Outcome::Requeued { .. } | Outcome::DeadLettered { .. })
    }
}

/// Full-jitter backoff: uniform in `[0, min(max, base * 2^(n - 1))]`, never below 1 ms so a retry is
/// never an immediate redelivery loop. `n` is the count of failures so far (a receive count or an
/// attempt count).
pub fn full_jitter_backoff(config: &WorkerConfig, n: u32) -> Duration {
    let exp = n.saturating_sub(1).min(30);
    let cap = config.backoff_base.saturating_mul(1u32 << exp).min(config.backoff_max);
    let ms = cap.as_millis().max(1) as u64;
    Duration::from_millis(crate::jitter::range(1..=ms))
}

/// When to look again at work whose lock another worker holds for `remaining`: just after that
/// lease would end, jittered so the waiters do not all come back at once.
pub fn after_holder(config: &WorkerConfig, remaining: Duration) -> Duration {
    let jitter = crate::jitter::range(0..=config.lock_jitter_max.as_millis() as u64);
    remaining + Duration::from_millis(jitter)
}

/// The longest visibility SQS accepts (12 h).
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// Starts the lease of a delivery: its visibility becomes `lease_ttl` from now. A queue that does not
/// answer is asked twice more (briefly); if it still fails, the delivery is put off with backoff
/// ([`retry_later`]), so it does not hide for the queue's long default. A delivery received straight into this very
/// lease (the local pool's receives) already has it: no request.
pub async fn start(
    queue: &dyn QueueConsume,
    message: &ReceivedMessage,
    config: &WorkerConfig,
    lane: &str,
) -> Result<(), Outcome> {
    if message.leased_for == Some(config.lease_ttl) {
        return Ok(());
    }
    renew_now(queue, message, config, lane).await
}

/// Lock key of a task's lease (one hash slot per task in Redis Cluster): the workers take it, and
/// the DLQ sweep reads it to leave a run its lock shows live.
pub fn task_lock_key(task_id: &TaskId) -> String {
    format!("lease:{{task:{task_id}}}")
}

/// Confirms that a delivery is still this worker's before a claim ties the task's record to it,
/// when its lease may have lapsed: more than one renewal interval since the lease began (the
/// delivery's own `leased_at` if it came already leased, else `started`, just before [`start`]),
/// or, for a delivery the batch's `heartbeat` renewed while it waited, a last renewal so old that
/// the lease could run out before the next beat. A wait that long
/// (a pool slow to start what it received, a slow lock, a slow lease start) may have let
/// the lease lapse; another consumer may then have received the message and deleted it (its record
/// was terminal then). A record claimed on that dead delivery would stay `PROCESSING` with no
/// message left to finish it, so a refused receipt ends this delivery unclaimed
/// ([`Outcome::LeaseLost`]) and any other failure puts it off like a lease start's. A quick path
/// costs no request.
pub async fn confirm(
    queue: &dyn QueueConsume,
    message: &ReceivedMessage,
    config: &WorkerConfig,
    started: tokio::time::Instant,
    heartbeat: Option<&Heartbeat>,
    lane: &str,
) -> Result<(), Outcome> {
    let began = match message.leased_at {
        Some(at) if message.leased_for == Some(config.lease_ttl) => at.min(started),
        _ => started,
    };
    let fresh = match heartbeat.and_then(|h| h.renewed_at(&message.receipt)).filter(|at| *at > began) {
        // Renewed by a heartbeat that goes on beating: its next renewal comes within an interval,
        // so only a lease that could lapse before then needs confirming.
        Some(at) => at.elapsed() <= config.lease_ttl.saturating_sub(config.renew_interval),
        None => began.elapsed() <= config.renew_interval,
    };
    if fresh {
        return Ok(());
    }
    renew_now(queue, message, config, lane).await
}

/// Sets the delivery's visibility to `lease_ttl` from now, as [`start`] describes.
async fn renew_now(
    queue: &dyn QueueConsume,
    message: &ReceivedMessage,
    config: &WorkerConfig,
    lane: &str,
) -> Result<(), Outcome> {
    let started = ask_thrice(
        || queue.change_visibility(&message.receipt, config.lease_ttl),
        |e| !matches!(e, QueueError::ReceiptInvalid),
    )
    .await;
    let reason = match started {
        Ok(()) => return Ok(()),
        Err(QueueError::ReceiptInvalid) => return Err(Outcome::LeaseLost),
        Err(e) => e.to_string(),
    };
    // The hand-back below logs and counts it; the error's own text is only here.
    tracing::debug!(error = %reason, "could not start the lease");
    // Put off like any wait: on the last delivery a fresh copy, so a queue that briefly refuses
    // visibility changes does not send the message to the DLQ (and its record to FAILED).
    let after = full_jitter_backoff(config, message.receive_count);
    Err(retry_later(queue, message, after, "queue unavailable at lease start", lane).await)
}

/// How many times [`ask_thrice`] makes its call: a service that fails fewer times in a row is a blip
/// the caller rides out; this many failures in a row are an outage it acts on.
pub const ASKS: u32 = 3;

/// Makes `call` up to [`ASKS`] times, briefly apart (jittered, at most 400 ms), while `again` says its
/// error may pass: for a service that blips, before the caller gives up on it (a lease start, a lock
/// whose answer may have been lost).
pub async fn ask_thrice<T, E, Fut>(mut call: impl FnMut() -> Fut, again: impl Fn(&E) -> bool) -> Result<T, E>
where
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut last = call().await;
    for attempt in 1..ASKS {
        if !matches!(&last, Err(e) if again(e)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(crate::jitter::range(20..=100u64 << attempt))).await;
        last = call().await;
    }
    last
}

/// Starts the leases of a whole batch at once (ten a request on SQS) and marks each delivery the
/// queue accepted as leased, so [`start`] asks nothing more for it. One result per message, in
/// order: `ReceiptInvalid` means the delivery is gone; any other error leaves the delivery unmarked,
/// to [`start`]'s own retries.
pub async fn start_many(
    queue: &dyn QueueConsume,
    messages: &mut [ReceivedMessage],
    ttl: Duration,
) -> Vec<Result<(), QueueError>> {
    let receipts: Vec<String> = messages.iter().map(|m| m.receipt.clone()).collect();
    let asked = tokio::time::Instant::now();
    let started = queue.change_visibility_many(&receipts, ttl).await;
    for (m, r) in messages.iter_mut().zip(&started) {
        if r.is_ok() {
            (m.leased_for, m.leased_at) = (Some(ttl), Some(asked));
        }
    }
    started
}

/// Makes deliveries visible again at once, for whoever polls next: received messages a poller will
/// not start, or DLQ messages a sweep only looked at. Per delivery, whether the queue took it (one
/// it refused returns when its visibility ends).
pub async fn release(queue: &dyn QueueConsume, messages: &[ReceivedMessage]) -> Vec<Result<(), QueueError>> {
    let receipts: Vec<String> = messages.iter().map(|m| m.receipt.clone()).collect();
    if receipts.is_empty() {
        return Vec::new();
    }
    queue.change_visibility_many(&receipts, Duration::ZERO).await
}

/// Keeps a delivery hidden for `hide` from now (a DLQ message a sweep settled, so the next sweeps
/// look past it).
pub async fn hide(
    queue: &dyn QueueConsume,
    message: &ReceivedMessage,
    hide: Duration,
) -> Result<(), QueueError> {
    queue.change_visibility(&message.receipt, hide.min(MAX_VISIBILITY)).await
}

/// Receives up to `max` messages (SQS gives at most 10 a call), each leased for `visibility` from the
/// moment it is received, so a poller that dies before its worker starts loses nothing for long.
pub async fn receive_batch(
    queue: &dyn QueueConsume,
    max: usize,
    visibility: Duration,
) -> Result<Vec<ReceivedMessage>, QueueError> {
    let mut out = Vec::new();
    while out.len() < max {
        let got = queue.receive_for((max - out.len()).min(10), Some(visibility)).await?;
        if got.is_empty() {
            break;
        }
        out.extend(got);
    }
    Ok(out)
}

/// Acknowledges a delivery whose work is done (or whose record is terminal).
pub async fn ack(queue: &dyn QueueConsume, message: &ReceivedMessage) -> Outcome {
    match queue.delete(&message.receipt).await {
        Ok(()) => Outcome::Acked,
        // The record is terminal: the next delivery will find it so and ack then.
        Err(e) => {
            // Not a hand-back: the work is done and the next delivery acks it (no lane-less series).
            warn!(error = %e, "delete failed; the message will return and be acked then");
            Outcome::Retry { after: Duration::ZERO, reason: "delete failed".into() }
        }
    }
}

/// Logs (WARN, with the reason) and counts (`lanes_handed_back_total{lane,reason}`, by the reason's
/// kind) one delivery put off: an operator must be able to see why work does not finish.
fn report_put_off(lane: &str, message: &ReceivedMessage, after: Duration, reason: &str, how: &str) {
    let kind = crate::metrics::reason_kind(reason);
    // The tenants' turns are the lane working as designed, hundreds a second under contention: an
    // INFO line, not a warning (the counter below and `lanes_tenant_put_offs_total` count them).
    if DESIGNED_WAITS.contains(&kind.as_str()) {
        tracing::info!(lane, message_id = %message.message_id, after_ms = after.as_millis() as u64, reason, "{how}");
    } else {
        warn!(
            lane,
            message_id = %message.message_id,
            receive_count = message.receive_count,
            after_ms = after.as_millis() as u64,
            reason,
            "{how}"
        );
    }
    crate::metrics::HANDED_BACK.with_label_values(&[lane, &kind]).inc();
}

/// Reason kinds of put-offs that are a tenant waiting its turn, logged at INFO.
const DESIGNED_WAITS: [&str; 2] = ["fairness", "tenant_cap"];

/// Hands a delivery of `lane` back to come again after `after` (at most 12 h, SQS's limit).
pub async fn hand_back(
    queue: &dyn QueueConsume,
    message: &ReceivedMessage,
    after: Duration,
    reason: &str,
    lane: &str,
) -> Outcome {
    let after = after.min(MAX_VISIBILITY);
    report_put_off(lane, message, after, reason, "delivery handed back");
    if let Err(e) = queue.change_visibility(&message.receipt, after).await {
        warn!(error = %e, "could not set the retry delay; the lease TTL applies");
    }
    Outcome::Retry { after, reason: reason.to_owned() }
}

/// Puts a delivery off for `after`. Usually a hand-back; on the last delivery before the redrive, a
/// fresh copy of the message instead, so waiting (throttling, a lock held elsewhere, a deadline)
/// never sends work to the DLQ. `Retry` from here on the last delivery means the copy could not be
/// sent: the caller must settle the record before the redrive does.
pub async fn retry_later(
    queue: &dyn QueueConsume,
    message: &ReceivedMessage,
    after: Duration,
    reason: &str,
    lane: &str,
) -> Outcome {
    if is_last_delivery(queue, message) {
        match queue.requeue(message, after).await {
            Ok(()) => {
                report_put_off(
                    lane,
                    message,
                    after.min(MAX_DELAY),
                    reason,
                    "last delivery requeued as a fresh copy",
                );
                return Outcome::Requeued { after: after.min(MAX_DELAY), reason: reason.to_owned() };
            }
            Err(e) => warn!(error = %e, "could not requeue the last delivery"),
        }
    }
    hand_back(queue, message, after, reason, lane).await
}

/// SQS's longest message delay: a copy comes back after at most this, and is put off again if its
/// wait is longer.
pub const MAX_DELAY: Duration = Duration::from_secs(900);

/// Moves a delivery to the DLQ with `reason`, counted by lane and `why`.
pub async fn dead_letter(
    metrics: &Metrics,
    queue: &dyn QueueConsume,
    message: &ReceivedMessage,
    reason: String,
    lane: &str,
    why: &str,
) -> Outcome {
    warn!(lane, message_id = %message.message_id, receive_count = message.receive_count, why, %reason, "moving message to the DLQ");
    match queue.dead_letter(message, &reason).await {
        Ok(()) => {
            metrics.dead_lettered_total.with_label_values(&[lane, why]).inc();
            Outcome::DeadLettered { reason }
        }
        Err(e) => {
            warn!(error = %e, "dead-lettering failed; redrive will move it after maxReceiveCount");
            crate::metrics::HANDED_BACK.with_label_values(&[lane, "dead_letter_failed"]).inc();
            Outcome::Retry { after: Duration::ZERO, reason }
        }
    }
}

/// Whether this is the last delivery the queue will make before its redrive policy moves the message
/// to the DLQ: what would be a hand-back must then settle the record first.
pub fn is_last_delivery(queue: &dyn QueueConsume, message: &ReceivedMessage) -> bool {
    message.receive_count >= queue.max_receive_count()
}

#[cfg(test)]
mod tests {
    use super::heartbeat::{Locked, beat};
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio_util::sync::CancellationToken;

    #[test]
    fn backoff_is_full_jitter_under_a_growing_cap() {
        let c = WorkerConfig {
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_millis(400),
            ..WorkerConfig::default()
        };
        for n in 1..=10 {
            let cap = (50u64 << (n - 1)).min(400);
            for _ in 0..50 {
                let d = full_jitter_backoff(&c, n).as_millis() as u64;
                assert!((1..=cap).contains(&d), "failure {n}: {d} not in 1..={cap}");
            }
        }
    }

    /// A refused receipt is a lost lease without a lock, not under a lock of ours nor one whose
    /// renewal went unanswered (its key stays ours until a beat hears otherwise).
    #[tokio::test]
    async fn a_refused_receipt_loses_the_lease_only_when_no_lock_of_ours_may_hold_it() {
        let metrics = Metrics::new();
        let within = Duration::from_secs(1);
        for (locked, lost) in [(Locked::Held, false), (Locked::Unknown, false), (Locked::None, true)] {
            let shown = match locked {
                Locked::Held => "held",
                Locked::Unknown => "unanswered",
                _ => "none",
            };
            let entry = Leased::new("r".into(), CancellationToken::new());
            let token = entry.lost.clone();
            beat(Err(QueueError::ReceiptInvalid), locked, None, &metrics, "commits", within, entry).await;
            assert_eq!(token.is_cancelled(), lost, "lock {shown}");
        }
    }

    /// Every delivery under the heartbeat counts as a lease renewal on each beat (one waiting for a
    /// slot, one without a lock), except a settled one kept hidden for the mapping's delete.
    #[tokio::test]
    async fn a_kept_delivery_is_not_counted_as_a_lease_renewal() {
        let metrics = Metrics::new();
        let ttl = Duration::from_secs(1);
        let entries = [
            Leased::new("waiting".into(), CancellationToken::new()),
            Leased { kept: true, ..Leased::new("kept".into(), CancellationToken::new()) },
        ];
        for entry in entries {
            beat(Ok(()), Locked::None, None, &metrics, "commits", ttl, entry).await;
        }
        assert_eq!(metrics.lease_renewals_total.with_label_values(&["commits"]).get(), 1);
    }

    /// An embedded queue whose batched visibility renewals take `slow` from the second on.
    struct Slow {
        inner: crate::embedded::EmbeddedQueue,
        calls: std::sync::atomic::AtomicU32,
        slow: Duration,
    }

    #[async_trait::async_trait]
    impl QueueConsume for Slow {
        async fn receive_for(
            &self,
            max: usize,
            v: Option<Duration>,
        ) -> Result<Vec<ReceivedMessage>, QueueError> {
            self.inner.receive_for(max, v).await
        }
        async fn change_visibility(&self, receipt: &str, timeout: Duration) -> Result<(), QueueError> {
            self.inner.change_visibility(receipt, timeout).await
        }
        async fn change_visibility_many(
            &self,
            receipts: &[String],
            t: Duration,
        ) -> Vec<Result<(), QueueError>> {
            if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 1 {
                tokio::time::sleep(self.slow).await;
            }
            self.inner.change_visibility_many(receipts, t).await
        }
        async fn delete(&self, receipt: &str) -> Result<(), QueueError> {
            self.inner.delete(receipt).await
        }
        async fn requeue(&self, m: &ReceivedMessage, delay: Duration) -> Result<(), QueueError> {
            self.inner.requeue(m, delay).await
        }
        async fn dead_letter(&self, m: &ReceivedMessage, reason: &str) -> Result<(), QueueError> {
            self.inner.dead_letter(m, reason).await
        }
        async fn depth(&self) -> Result<crate::ports::QueueDepth, QueueError> {
            self.inner.depth().await
        }
        fn max_receive_count(&self) -> u32 {
            self.inner.max_receive_count()
        }
    }

    /// A visibility renewal slower than the lock's TTL does not let the lock lapse: the lock is
    /// renewed beside it, and a lock lost in a failover is taken again.
    #[tokio::test]
    async fn a_slow_visibility_renewal_never_lets_the_lock_lapse() {
        use crate::ports::{LeaseLock, QueueSend};
        let clock: crate::clock::SharedClock = Arc::new(crate::clock::SystemClock);
        let db = crate::embedded::EmbeddedDb::in_memory().unwrap();
        let queues =
            crate::embedded::EmbeddedQueues::open(db, clock.clone(), Default::default()).await.unwrap();
        let inner = queues.queue("q", "q-dlq");
        inner.send("m", Default::default()).await.unwrap();
        let m = inner.receive_for(1, Some(Duration::from_secs(60))).await.unwrap().remove(0);
        let queue = Arc::new(Slow { inner, calls: 0.into(), slow: Duration::from_millis(250) });
        let lock = Arc::new(crate::embedded::MemoryLock::new(clock));
        let config = WorkerConfig::default().with_lease(Duration::from_millis(300));
        let crate::ports::Acquire::Acquired(token) = lock.acquire("k", config.lease_ttl).await.unwrap()
        else {
            panic!()
        };
        let beat = Heartbeat::start(queue, lock.clone(), None, Metrics::new(), "interactive", &config);
        let lost = CancellationToken::new();
        let _m = beat
            .join(Leased { lock: Some(("k".into(), token.clone())), ..Leased::new(m.receipt, lost.clone()) });
        tokio::time::sleep(Duration::from_millis(650)).await;
        assert!(!lost.is_cancelled(), "the lock lapsed behind a slow visibility renewal");
        assert!(lock.renew("k", &token, config.lease_ttl).await.unwrap());
        // A failover forgets the key: the next beat takes it again with the same token.
        assert!(lock.release("k", &token).await.unwrap());
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(!lost.is_cancelled());
        assert!(lock.release("k", &token).await.unwrap(), "taken again by the heartbeat");
    }

    /// A queue whose batched visibility renewals wait at a gate (a beat under way), recording every
    /// visibility in the order it lands.
    struct Gated {
        landed: Mutex<Vec<(String, Duration)>>,
        entered: tokio::sync::Notify,
        gate: tokio::sync::Semaphore,
    }

    #[async_trait::async_trait]
    impl QueueConsume for Gated {
        async fn receive_for(
            &self,
            _: usize,
            _: Option<Duration>,
        ) -> Result<Vec<ReceivedMessage>, QueueError> {
            Ok(Vec::new())
        }
        async fn change_visibility(&self, receipt: &str, timeout: Duration) -> Result<(), QueueError> {
            self.landed.lock().unwrap().push((receipt.to_owned(), timeout));
            Ok(())
        }
        async fn change_visibility_many(
            &self,
            receipts: &[String],
            timeout: Duration,
        ) -> Vec<Result<(), QueueError>> {
            self.entered.notify_one();
            drop(self.gate.acquire().await);
            receipts
                .iter()
                .map(|r| self.change_visibility(r, timeout))
                .collect::<futures::future::JoinAll<_>>()
                .await
        }
        async fn delete(&self, _: &str) -> Result<(), QueueError> {
            Ok(())
        }
        async fn requeue(&self, _: &ReceivedMessage, _: Duration) -> Result<(), QueueError> {
            Ok(())
        }
        async fn dead_letter(&self, _: &ReceivedMessage, _: &str) -> Result<(), QueueError> {
            Ok(())
        }
        async fn depth(&self) -> Result<crate::ports::QueueDepth, QueueError> {
            Ok(Default::default())
        }
        fn max_receive_count(&self) -> u32 {
            5
        }
    }

    /// A hand-back made while a beat is renewing the same delivery lands after that beat, so its
    /// delay is what the queue keeps (not cut back to a lease).
    #[tokio::test]
    async fn a_hand_back_lands_after_a_beat_already_under_way() {
        let queue = Arc::new(Gated {
            landed: Mutex::default(),
            entered: tokio::sync::Notify::new(),
            gate: tokio::sync::Semaphore::new(0),
        });
        let config = WorkerConfig {
            lease_ttl: Duration::from_millis(300),
            renew_interval: Duration::from_millis(100),
            ..WorkerConfig::default()
        };
        let lock = Arc::new(crate::embedded::MemoryLock::new(Arc::new(crate::clock::SystemClock)));
        let heartbeat = Heartbeat::start(queue.clone(), lock, None, Metrics::new(), "interactive", &config);
        let batch = Arc::new(LeasedQueue::new(queue.clone(), heartbeat));
        let message = ReceivedMessage {
            message_id: "m".parse().unwrap(),
            receipt: "r".into(),
            body: String::new(),
            receive_count: 1,
            sent_at_ms: 0,
            attributes: Default::default(),
            leased_for: Some(config.lease_ttl),
            leased_at: Some(tokio::time::Instant::now()),
        };
        let _renewed = batch.heartbeat().join(Leased::new("r".into(), CancellationToken::new()));
        queue.entered.notified().await;
        let handing = tokio::spawn({
            let (batch, message) = (batch.clone(), message.clone());
            async move { hand_back(&*batch, &message, Duration::from_secs(10), "test", "interactive").await }
        });
        // Room for the hand-back to land first, which it must not while the beat is under way.
        tokio::time::sleep(Duration::from_millis(50)).await;
        queue.gate.add_permits(1000);
        handing.await.unwrap();
        // Several more beats (every 100 ms): none may renew it after the hand-back.
        tokio::time::sleep(Duration::from_millis(350)).await;
        let landed = queue.landed.lock().unwrap().clone();
        assert_eq!(
            landed,
            vec![("r".to_owned(), config.lease_ttl), ("r".to_owned(), Duration::from_secs(10))],
            "the beat's renewal, then the hand-back, and nothing after it"
        );
    }

    /// A delivery started within one renewal interval of its lease costs no request; one started
    /// later is confirmed first, and one another consumer has since received and deleted ends
    /// unclaimed.
    #[tokio::test]
    async fn a_delivery_started_late_is_confirmed_before_it_is_claimed() {
        use crate::clock::ManualClock;
        use crate::ports::QueueSend;
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let settings = crate::embedded::QueueSettings {
            default_visibility: Duration::from_secs(900),
            max_receive_count: 5,
            ..Default::default()
        };
        let db = crate::embedded::EmbeddedDb::open(dir.path()).unwrap();
        let queues = crate::embedded::EmbeddedQueues::open(db, clock.clone(), settings).await.unwrap();
        let queue = queues.queue("interactive", "interactive-dlq");
        let config = WorkerConfig {
            lease_ttl: Duration::from_millis(300),
            renew_interval: Duration::from_millis(20),
            ..WorkerConfig::default()
        };
        queue.send("{}", Default::default()).await.unwrap();
        let ours = queue.receive_for(1, Some(config.lease_ttl)).await.unwrap().remove(0);
        // A receipt the queue would refuse: asking at all would lose the lease.
        let unasked = ReceivedMessage { receipt: "not-a-receipt".into(), ..ours.clone() };
        let now = tokio::time::Instant::now();
        assert!(confirm(&queue, &unasked, &config, now, None, "interactive").await.is_ok());
        // Started late, and meanwhile the lease lapsed and another consumer took and deleted it.
        tokio::time::sleep(Duration::from_millis(30)).await;
        clock.advance_ms(301);
        let theirs = queue.receive_for(1, Some(config.lease_ttl)).await.unwrap().remove(0);
        queue.delete(&theirs.receipt).await.unwrap();
        let late = tokio::time::Instant::now();
        assert_eq!(confirm(&queue, &ours, &config, late, None, "interactive").await, Err(Outcome::LeaseLost));
        // The same wait on a live delivery renews it and goes on.
        queue.send("{}", Default::default()).await.unwrap();
        let live = queue.receive_for(1, Some(config.lease_ttl)).await.unwrap().remove(0);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(
            confirm(&queue, &live, &config, tokio::time::Instant::now(), None, "interactive").await.is_ok()
        );
    }

    #[test]
    fn a_contended_lock_is_retried_just_after_its_holder() {
        let c = WorkerConfig { lock_jitter_max: Duration::from_millis(10), ..WorkerConfig::default() };
        for _ in 0..50 {
            let d = after_holder(&c, Duration::from_millis(100));
            assert!((Duration::from_millis(100)..=Duration::from_millis(110)).contains(&d), "{d:?}");
        }
    }
}
