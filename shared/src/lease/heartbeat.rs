//! The heartbeat: one background task that renews every joined delivery's lease together (one
//! `ChangeMessageVisibilityBatch` a beat, and each delivery's lock beside it), and cancels the work
//! of a delivery whose receipt is refused, whose lock another worker holds, or whose client
//! cancelled it. Deliveries join and leave it ([`Membership`]); an acked one in Lambda is kept
//! hidden on it until the invocation returns ([`Heartbeat::keep`]).

use super::LEAVE_WAIT;
use crate::config::WorkerConfig;
use crate::domain::TaskId;
use crate::metrics::Metrics;
use crate::ports::{LeaseLock, QueueConsume, QueueError};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Aborts a background task on every exit path (success, error, panic, cancellation).
pub struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Asks, on each beat, whether the work under a lease was cancelled by its client.
#[async_trait::async_trait]
pub trait CancelProbe: Send + Sync {
    /// True once the work named `id`, claimed with `fence`, is cancelled (a cancellation of an earlier
    /// run of the same id does not count).
    async fn is_cancelled(&self, id: &TaskId, fence: u64) -> bool;
}

/// Work under a lease that its client may cancel.
#[derive(Clone)]
pub struct Watch {
    /// What to ask the [`CancelProbe`] about.
    pub id: TaskId,
    /// The claim's fence.
    pub fence: u64,
    /// Cancelled when the probe says yes.
    pub cancelled: CancellationToken,
}

/// One delivery under the heartbeat.
#[derive(Clone)]
pub struct Leased {
    /// The delivery's receipt handle.
    pub receipt: String,
    /// The lock carried with it (`key`, `token`), once taken.
    pub lock: Option<(String, String)>,
    /// Cancelled when the queue or the lock says the lease is gone.
    pub lost: CancellationToken,
    /// Work its client may cancel, asked about on every beat.
    pub watch: Option<Watch>,
    /// Settled, and only kept hidden for the mapping's delete ([`Heartbeat::keep`]): not a lease
    /// renewal in the metrics.
    pub kept: bool,
}

impl Leased {
    /// A delivery with no lock yet and nothing watched.
    pub fn new(receipt: String, lost: CancellationToken) -> Self {
        Self { receipt, lock: None, lost, watch: None, kept: false }
    }
}

/// The leases a heartbeat renews, each under the id of whoever added it.
type Entries = Arc<Mutex<Vec<(u64, Leased)>>>;

/// The heartbeat of a set of leases: every beat renews each live delivery's visibility and lock
/// together and asks the probe about watched work. Stops when dropped.
///
/// One heartbeat serves a whole batch: the commits worker's deliveries, or every task of a Lambda
/// invocation ([`Heartbeat::join`]), so ten deliveries cost one `ChangeMessageVisibilityBatch` a
/// beat, not ten `ChangeMessageVisibility`.
pub struct Heartbeat {
    leases: Entries,
    /// When each delivery's visibility was last renewed (the beat's request, not its answer), so a
    /// delivery that waited under the heartbeat needs no [`confirm`] of its own.
    renewed: Arc<Mutex<std::collections::HashMap<String, tokio::time::Instant>>>,
    /// Held by a beat from the moment it reads the entries until its visibility renewals are
    /// answered: [`Self::leave`] takes it once, so a beat already under way when a delivery is
    /// settled has landed before the settle's own visibility change goes out.
    round: Arc<tokio::sync::Mutex<()>>,
    next: std::sync::atomic::AtomicU64,
    pub(super) ttl: Duration,
    _task: AbortOnDrop,
}

/// A delivery's place in a [`Heartbeat`], renewed while this lives. Dropping it ends the renewals
/// (unless someone else has since taken the delivery's place).
pub struct Membership {
    leases: Entries,
    id: u64,
}

impl Drop for Membership {
    fn drop(&mut self) {
        if let Ok(mut l) = self.leases.lock() {
            l.retain(|(id, _)| *id != self.id);
        }
    }
}

impl Heartbeat {
    /// Starts beating every `renew_interval` (the first beat one interval from now), for the
    /// deliveries that [`Self::join`] it.
    pub fn start(
        queue: Arc<dyn QueueConsume>,
        lock: Arc<dyn LeaseLock>,
        probe: Option<Arc<dyn CancelProbe>>,
        metrics: Metrics,
        lane: &'static str,
        config: &WorkerConfig,
    ) -> Self {
        let leases: Entries = Arc::new(Mutex::new(Vec::new()));
        let renewed = Arc::new(Mutex::new(std::collections::HashMap::new()));
        let round = Arc::new(tokio::sync::Mutex::new(()));
        let (shared, beating, stamps) = (leases.clone(), round.clone(), renewed.clone());
        let (ttl, every) = (config.lease_ttl, config.renew_interval);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let in_round = beating.lock().await;
                let live: Vec<Leased> = match shared.lock() {
                    Ok(l) => l.iter().map(|(_, e)| e).filter(|e| !e.lost.is_cancelled()).cloned().collect(),
                    Err(_) => return,
                };
                // Every visibility in one call (ten a request on SQS): a commits batch of 100 costs
                // 10 requests a beat, not 100. Beside it, not after it, each delivery's lock: each is
                // cut at one interval, so a slow queue cannot let a lock lapse nor a slow lock the
                // visibility, and no beat runs into the next.
                let receipts: Vec<String> = live.iter().map(|e| e.receipt.clone()).collect();
                let asked = tokio::time::Instant::now();
                let visibility = async {
                    let renewed =
                        tokio::time::timeout(every, queue.change_visibility_many(&receipts, ttl)).await;
                    drop(in_round);
                    renewed.unwrap_or_else(|_| {
                        receipts
                            .iter()
                            .map(|_| Err(QueueError::Unavailable("renewal timed out".into())))
                            .collect()
                    })
                };
                let locks = futures::future::join_all(live.iter().map(|e| renew_lock(&*lock, e, ttl, every)));
                let (renewed, locked) = tokio::join!(visibility, locks);
                if let Ok(mut stamps) = stamps.lock() {
                    for (receipt, _) in receipts.iter().zip(&renewed).filter(|(_, r)| r.is_ok()) {
                        stamps.insert(receipt.clone(), asked);
                    }
                }
                futures::future::join_all(live.into_iter().zip(renewed).zip(locked).map(
                    |((entry, visibility), locked)| {
                        let (metrics, probe) = (metrics.clone(), probe.clone());
                        async move {
                            beat(visibility, locked, probe.as_deref(), &metrics, lane, every, entry).await
                        }
                    },
                ))
                .await;
            }
        });
        Self { leases, renewed, round, next: 0.into(), ttl, _task: AbortOnDrop(task) }
    }

    /// Adds a delivery, renewed from the next beat on for as long as the returned membership lives.
    /// It takes the place of any entry with the same receipt (a delivery that waited for a slot
    /// under the same heartbeat, then runs with its lock and watch).
    pub fn join(&self, leased: Leased) -> Membership {
        Membership { leases: self.leases.clone(), id: self.add(leased) }
    }

    /// Keeps an acked delivery hidden until the heartbeat stops: its visibility only, no lock, no
    /// watch. For deliveries whose delete is left to Lambda's event source mapping
    /// ([`LeasedQueue::for_mapping`]).
    pub fn keep(&self, receipt: &str) {
        self.add(Leased { kept: true, ..Leased::new(receipt.to_owned(), CancellationToken::new()) });
    }

    /// Puts `leased` in the place of any entry with its receipt; returns its id.
    fn add(&self, leased: Leased) -> u64 {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut l) = self.leases.lock() {
            l.retain(|(_, e)| e.receipt != leased.receipt);
            l.push((id, leased));
        }
        id
    }

    /// Ends the renewals of the delivery with `receipt`, whoever added it ([`Self::leave_all`]).
    pub async fn leave(&self, receipt: &str) {
        self.leave_all(&[receipt]).await;
    }

    /// Ends the renewals of the deliveries with these receipts, whoever added them, and returns once
    /// a beat already under way has landed (waiting at most [`LEAVE_WAIT`]): no renewal of them
    /// reaches the queue after this. Leaving a whole batch at once waits for one beat, not one each.
    pub async fn leave_all(&self, receipts: &[&str]) {
        if let Ok(mut l) = self.leases.lock() {
            l.retain(|(_, e)| !receipts.contains(&e.receipt.as_str()));
        }
        if let Ok(mut stamps) = self.renewed.lock() {
            stamps.retain(|r, _| !receipts.contains(&r.as_str()));
        }
        if tokio::time::timeout(LEAVE_WAIT, self.round.lock()).await.is_err() {
            warn!("a lease renewal is still under way; settling without waiting for it");
        }
    }

    /// When the delivery with `receipt` last had its visibility renewed by this heartbeat.
    pub fn renewed_at(&self, receipt: &str) -> Option<tokio::time::Instant> {
        self.renewed.lock().ok()?.get(receipt).copied()
    }

    /// Records the lock taken for the delivery with `receipt`, so the next beats renew it too.
    pub fn set_lock(&self, receipt: &str, key: String, token: String) {
        if let Ok(mut l) = self.leases.lock()
            && let Some((_, entry)) = l.iter_mut().find(|(_, e)| e.receipt == receipt)
        {
            entry.lock = Some((key, token));
        }
    }
}

/// What a beat's lock renewal said.
pub(super) enum Locked {
    /// No lock to renew (none taken, or the lock service was unreachable at the start).
    None,
    /// Still ours (renewed, or taken again after a failover lost the key).
    Held,
    /// Another token holds it: another worker owns the work now.
    Refused,
    /// The lock service did not answer in time.
    Unknown,
}

/// Renews `entry`'s lock, if it has one, within `within`.
async fn renew_lock(lock: &dyn LeaseLock, entry: &Leased, ttl: Duration, within: Duration) -> Locked {
    let Some((key, token)) = &entry.lock else { return Locked::None };
    match tokio::time::timeout(within, lock.renew(key, token, ttl)).await {
        Ok(Ok(true)) => Locked::Held,
        Ok(Ok(false)) => {
            warn!(%key, "lock renewal refused: another worker holds it");
            Locked::Refused
        }
        Ok(Err(e)) => {
            warn!(error = %e, "lock renewal failed; running degraded");
            Locked::Unknown
        }
        Err(_) => {
            warn!(%key, "lock renewal timed out; running degraded");
            Locked::Unknown
        }
    }
}

/// One delivery's beat, given its visibility and lock renewals: the lease is lost when the lock
/// is another's, or, without a lock, when the queue refuses the receipt. A refused receipt under a
/// lock we hold is not a loss (another consumer was handed the message, refused by the lock, and
/// gave it back): the run goes on and its fenced write decides. Nor is it under a lock whose renewal
/// went unanswered: the key is ours until a beat hears otherwise, and dropping the run there would
/// stop renewing a key still held, let it lapse, and hand a paid call in progress to a second run.
/// Then whether its client cancelled it, asked within one interval.
pub(super) async fn beat(
    visibility: Result<(), QueueError>,
    locked: Locked,
    probe: Option<&dyn CancelProbe>,
    metrics: &Metrics,
    lane: &'static str,
    within: Duration,
    entry: Leased,
) {
    if matches!(locked, Locked::Refused) {
        entry.lost.cancel();
        return;
    }
    if matches!(locked, Locked::Unknown) {
        metrics.degraded_operations_total.with_label_values(&["lock"]).inc();
    }
    match visibility {
        Ok(()) => {}
        Err(QueueError::ReceiptInvalid) if matches!(locked, Locked::Held | Locked::Unknown) => {
            warn!("visibility renewal refused while the lock is ours: the fence decides the write");
        }
        Err(QueueError::ReceiptInvalid) => {
            warn!("visibility renewal refused: lease lost");
            entry.lost.cancel();
            return;
        }
        Err(e) => warn!(error = %e, "visibility renewal failed; retrying next beat"),
    }
    if !entry.kept {
        metrics.lease_renewals_total.with_label_values(&[lane]).inc();
    }
    if let (Some(probe), Some(watch)) = (probe, &entry.watch)
        && !watch.cancelled.is_cancelled()
        && tokio::time::timeout(within, probe.is_cancelled(&watch.id, watch.fence)).await == Ok(true)
    {
        watch.cancelled.cancel();
    }
}
