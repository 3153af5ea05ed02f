//! The fault injectors: one wrapper per port (store, queue, lock, cache, LLM) around the embedded
//! twins, driven by the history's seeded generator, and the processes whose crash freezes them.
//!
//! A call through a wrapper may be delayed, may fail before it reaches the twin, or may fail
//! *after* it took effect (the answer was lost: the ambiguous error). Its process may crash at any
//! of these points: a crashed process's calls never return (its futures are parked for good, as if
//! the process had died), and a call in flight when it crashed may or may not have taken effect.
//! What the wrappers see on the way through (a record created, a message sent or acked, a model
//! answer) is reported to the [`Oracle`](crate::oracle::Oracle), which checks the invariants.

use crate::oracle::Oracle;
use async_trait::async_trait;
use lanes_core::clock::{Clock, SharedClock};
use lanes_core::domain::{MessageId, TaskId, TaskRecord};
use lanes_core::embedded::{EmbeddedQueue, EmbeddedStore, MemoryCache, MemoryLock};
use lanes_core::ports::*;
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Wall time of the simulation's epoch (Unix ms).
pub const EPOCH_MS: u64 = 1_800_000_000_000;

/// Simulated wall time: tokio's (paused) clock since the history began, plus this process's skew.
#[derive(Debug)]
pub struct SimClock {
    start: tokio::time::Instant,
    skew_ms: i64,
}

impl SimClock {
    /// A clock `skew_ms` off the true simulated time.
    pub fn new(start: tokio::time::Instant, skew_ms: i64) -> Arc<Self> {
        Arc::new(Self { start, skew_ms })
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        let t = EPOCH_MS + self.start.elapsed().as_millis() as u64;
        t.saturating_add_signed(self.skew_ms)
    }
}

/// Which port a call goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Port {
    /// The task store.
    Store,
    /// The lane queues and their DLQs.
    Queue,
    /// The lease lock.
    Lock,
    /// The hot cache.
    Cache,
    /// The Git host's diff API.
    Git,
    /// The provider's batch endpoint (its plan drawn only in histories with batches, from a stream
    /// of its own, so the others replay as before).
    Provider,
}

/// How one port misbehaves in a history.
#[derive(Debug, Clone, Default)]
pub struct PortPlan {
    /// Chance that a call fails before it takes effect.
    pub p_fail: f64,
    /// Chance that a call takes effect and then reports a failure.
    pub p_ambiguous: f64,
    /// Chance that a call is slow, and how slow (ms).
    pub p_slow: f64,
    /// Upper bound of a slow call (ms).
    pub slow_ms: u64,
    /// Outages: from, to (ms since the epoch); every call in one is slow, then fails (some after
    /// taking effect).
    pub outages: Vec<(u64, u64)>,
}

/// How the provider misbehaves.
#[derive(Debug, Clone, Default)]
pub struct LlmPlan {
    /// Chance of a 429.
    pub p_throttle: f64,
    /// Chance of a 5xx or a timeout.
    pub p_retryable: f64,
    /// Chance of a permanent refusal.
    pub p_permanent: f64,
    /// Chance of a slow answer (ten times the usual latency).
    pub p_slow: f64,
}

/// What can go wrong in one history, drawn from its seed.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Per port, indexed by `Port as usize`.
    pub ports: [PortPlan; 6],
    /// The provider.
    pub llm: LlmPlan,
    /// Chance that a worker or ingress process crashes, per second it lives.
    pub crash_per_sec: f64,
    /// Times (ms since the epoch) at which every lock key vanishes (a failover without persistence).
    pub lock_vanish_at: Vec<u64>,
    /// Times at which every cache entry vanishes.
    pub cache_vanish_at: Vec<u64>,
    /// Chance that a send is delivered twice (SQS is at-least-once).
    pub p_duplicate_delivery: f64,
    /// Largest clock skew of a process (ms, either way).
    pub max_skew_ms: i64,
}

/// What the wrappers of one history share: the generator, the plan, the oracle.
pub struct Chaos {
    rng: Mutex<rand::rngs::StdRng>,
    /// The plan.
    pub plan: Plan,
    /// Set once the history calms down: no more faults, so every task can finish.
    pub calm: std::sync::atomic::AtomicBool,
    /// Invariants and the trace.
    pub oracle: Mutex<Oracle>,
    /// The true simulated clock.
    pub clock: Arc<SimClock>,
    /// The shared lock service (replaced when its keys vanish).
    pub lock: Mutex<Arc<MemoryLock>>,
    /// The shared cache (replaced when its entries vanish).
    pub cache: Mutex<Arc<MemoryCache>>,
    /// The store as it really is (no faults), for the oracle's checks.
    pub truth: EmbeddedStore,
    /// The summaries as they are (the commits flow's truth).
    pub summaries: lanes_core::embedded::EmbeddedSummaries,
    /// Which task each prompt belongs to (prompts are unique per task id).
    pub prompts: BTreeMap<String, String>,
    /// The provider-batch records as they are, in histories with batches.
    pub batches: Option<lanes_core::embedded::EmbeddedBatches>,
    /// For each delivery (the tokio task that runs it) and lock key, the lock service it last took
    /// that key from, or `None` when the acquire failed (for a task worker, all its asks in a row:
    /// the run went on degraded). A claim made
    /// from a key since lost to a failover, or with none, is a broken claim: it may take over a live
    /// run, whose paid answer its fence then refuses (I9).
    pub holders: Mutex<Holders>,
    /// For each task, the fence its run was last parked under and the delivery (tokio task) that
    /// parked it: that delivery calls the model directly only once its park is undone (I2).
    pub parkers: Mutex<std::collections::HashMap<String, (u64, Option<tokio::task::Id>)>>,
    /// A handle on the queues' receipts (any lane's: they share them), to tell whether a receipt a
    /// process holds is still its message's current one (I11).
    pub receipts: Option<EmbeddedQueue>,
    /// For each delivery (its tokio task) and task, the receipts of the task its process held, live,
    /// when the delivery first asked for the task's lock: the delivery's own is among them (I11).
    pub asked_with: Mutex<std::collections::HashMap<(tokio::task::Id, String), Vec<String>>>,
    /// Summary writes failed in a row, per delivery and commit (I6).
    pub summary_tries: InARow,
    /// Task lock asks failed in a row, per delivery and lock key (I2, I9).
    pub lock_asks: InARow,
    /// The workers' lease: a visibility change to exactly this long is a renewal, which keeps the
    /// delivery held; any other hands it back.
    pub lease_ttl: Duration,
}

/// The asks a worker makes of a service before it acts on its failure (the product's
/// [`lanes_core::lease::ASKS`]): a task worker's for its lease lock before it runs without it, a commits
/// worker's summary writes before it puts a paid answer off. A service that fails fewer times in a
/// row is a blip the design survives, not a break that justifies a second call or a claim over a
/// live run.
pub use lanes_core::lease::ASKS;

/// Failures in a row of one kind of ask, per delivery (its tokio task) and key: the count a worker
/// keeps itself in [`lanes_core::lease::ask_thrice`], seen from outside.
#[derive(Default)]
pub struct InARow(Mutex<std::collections::HashMap<(Option<tokio::task::Id>, String), u32>>);

impl InARow {
    /// Counts the current delivery's ask of `key`: a failure adds one, an answer ends the count.
    /// True at the [`ASKS`]th failure in a row, when the worker gives up (and the count starts
    /// over); also true if the count cannot be read, so a poisoned lock excuses rather than flags.
    pub fn gave_up(&self, key: &str, failed: bool) -> bool {
        let Ok(mut m) = self.0.lock() else { return failed };
        let k = (tokio::task::try_id(), key.to_owned());
        if !failed {
            m.remove(&k);
            return false;
        }
        let n = m.entry(k.clone()).or_default();
        *n += 1;
        let gave_up = *n >= ASKS;
        if gave_up {
            m.remove(&k);
        }
        gave_up
    }
}

/// Per delivery (its tokio task) and lock key: the lock service the key was taken from, if any.
pub type Holders = std::collections::HashMap<(tokio::task::Id, String), Option<Arc<MemoryLock>>>;

impl Chaos {
    /// The chaos of one history.
    pub fn new(
        seed: u64,
        plan: Plan,
        clock: Arc<SimClock>,
        truth: EmbeddedStore,
        summaries: lanes_core::embedded::EmbeddedSummaries,
        oracle: Oracle,
    ) -> Self {
        let shared: SharedClock = clock.clone();
        Self {
            rng: Mutex::new(rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed)),
            plan,
            calm: false.into(),
            oracle: Mutex::new(oracle),
            clock,
            lock: Mutex::new(Arc::new(MemoryLock::new(shared.clone()))),
            cache: Mutex::new(Arc::new(MemoryCache::new(shared))),
            truth,
            summaries,
            prompts: BTreeMap::new(),
            batches: None,
            holders: Mutex::default(),
            parkers: Mutex::default(),
            receipts: None,
            asked_with: Mutex::default(),
            summary_tries: InARow::default(),
            lock_asks: InARow::default(),
            lease_ttl: lanes_core::config::WorkerConfig::default().lease_ttl,
        }
    }

    /// The current delivery's acquire of `key` ended with `on` (the lock service it took the key
    /// from) or with no key (`None`).
    fn took(&self, key: &str, on: Option<Arc<MemoryLock>>) {
        if let (Some(id), Ok(mut h)) = (tokio::task::try_id(), self.holders.lock()) {
            h.insert((id, key.to_owned()), on);
        }
    }

    /// Whether the current delivery claims `task_id` without the lock (degraded), or on a key a
    /// failover has since lost.
    fn claims_broken(&self, task_id: &TaskId) -> bool {
        let key = lanes_core::lease::task_lock_key(task_id);
        let Some(id) = tokio::task::try_id() else { return false };
        let taken = match self.holders.lock() {
            Ok(h) => h.get(&(id, key)).cloned(),
            Err(_) => None,
        };
        let current = match self.lock.lock() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        };
        match taken {
            None => false,
            Some(None) => true,
            Some(Some(on)) => !Arc::ptr_eq(&on, &current),
        }
    }

    /// Milliseconds since the epoch, true time.
    pub fn now(&self) -> u64 {
        self.clock.now_ms() - EPOCH_MS
    }

    /// A uniform draw in `[0, 1)`.
    pub fn chance(&self) -> f64 {
        self.rng.lock().map(|mut r| r.random::<f64>()).unwrap_or(0.0)
    }

    /// A uniform draw in `lo..=hi`.
    pub fn between(&self, lo: u64, hi: u64) -> u64 {
        if lo >= hi {
            return lo;
        }
        self.rng.lock().map(|mut r| r.random_range(lo..=hi)).unwrap_or(lo)
    }

    /// Whether faults are off.
    pub fn is_calm(&self) -> bool {
        self.calm.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `f` on the oracle.
    pub fn oracle<T>(&self, f: impl FnOnce(&mut Oracle) -> T) -> T {
        let mut o = match self.oracle.lock() {
            Ok(o) => o,
            Err(p) => p.into_inner(),
        };
        f(&mut o)
    }

    /// Adds a line to the trace.
    pub fn trace(&self, line: impl FnOnce() -> String) {
        let now = self.now();
        self.oracle(|o| o.trace(now, line()));
    }

    /// What happens to the next call to `port`.
    fn decide(&self, port: Port) -> Decision {
        let base = self.between(0, 8);
        if self.is_calm() {
            return Decision { delay_ms: base, fail: None };
        }
        let plan = &self.plan.ports[port as usize];
        let now = self.now();
        if plan.outages.iter().any(|(a, b)| (*a..*b).contains(&now)) {
            let ambiguous = self.chance() < 0.3;
            return Decision { delay_ms: self.between(0, plan.slow_ms.max(1)), fail: Some(ambiguous) };
        }
        let mut delay_ms = base;
        if self.chance() < plan.p_slow {
            delay_ms += self.between(0, plan.slow_ms);
        }
        let roll = self.chance();
        let fail = if roll < plan.p_fail {
            Some(false)
        } else if roll < plan.p_fail + plan.p_ambiguous {
            Some(true)
        } else {
            None
        };
        Decision { delay_ms, fail }
    }
}

/// One call's fate: its delay, and whether it fails (`Some(true)`: after taking effect).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decision {
    pub(crate) delay_ms: u64,
    pub(crate) fail: Option<bool>,
}

/// A simulated process (a pool worker, a Lambda invocation, an ingress instance, the admin): its
/// clock and whether it has crashed.
pub struct Process {
    /// Its number, for the trace.
    pub id: u32,
    /// What it is.
    pub kind: &'static str,
    /// Cancelled when it crashes.
    pub dead: CancellationToken,
    /// Its clock (skewed).
    pub clock: SharedClock,
    /// Tasks whose model call it has started and not yet written: a crash loses that spend.
    pub in_hand: Mutex<BTreeSet<String>>,
    /// The messages it received and has not settled (receipt, then the task or commit they carry):
    /// a crash holding one uses up one of its deliveries.
    pub holding: Mutex<BTreeMap<String, String>>,
    /// The admin (`lanes dlq`): its record resets are redrives, not client submissions.
    pub admin: bool,
}

impl Process {
    /// A live process.
    pub fn new(id: u32, kind: &'static str, clock: SharedClock, admin: bool) -> Arc<Self> {
        Arc::new(Self {
            id,
            kind,
            dead: CancellationToken::new(),
            clock,
            in_hand: Mutex::default(),
            holding: Mutex::default(),
            admin,
        })
    }

    /// Crashes it: every call of its from now on never returns.
    pub fn crash(&self, chaos: &Chaos) {
        if self.dead.is_cancelled() {
            return;
        }
        self.dead.cancel();
        let lost: Vec<String> = self.in_hand.lock().map(|s| s.iter().cloned().collect()).unwrap_or_default();
        chaos.trace(|| format!("p{} {} CRASH (in hand: {})", self.id, self.kind, lost.len()));
        let held: Vec<String> =
            self.holding.lock().map(|h| h.values().cloned().collect()).unwrap_or_default();
        chaos.oracle(|o| {
            for t in &lost {
                o.justify(t, "crash with a model call in hand");
            }
            for t in &held {
                o.attempted(t);
            }
        });
    }

    /// Parks for good if it has crashed.
    pub async fn alive(&self) {
        if self.dead.is_cancelled() {
            std::future::pending::<()>().await;
        }
    }

    /// Sleeps `ms`, or parks for good if it crashes meanwhile.
    pub async fn sleep(&self, ms: u64) {
        if ms > 0 {
            tokio::select! {
                biased;
                _ = self.dead.cancelled() => std::future::pending::<()>().await,
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
            }
        }
        self.alive().await;
    }
}

/// An error a wrapper can inject.
pub trait Injected {
    /// The port's retryable failure; `ambiguous` when the call took effect.
    fn injected(ambiguous: bool) -> Self;
}

fn what(ambiguous: bool) -> String {
    if ambiguous { "injected: took effect, answer lost".into() } else { "injected: failed".into() }
}

impl Injected for StoreError {
    fn injected(a: bool) -> Self {
        StoreError::Unavailable(what(a))
    }
}
impl Injected for QueueError {
    fn injected(a: bool) -> Self {
        QueueError::Unavailable(what(a))
    }
}
impl Injected for LockError {
    fn injected(a: bool) -> Self {
        LockError::Unavailable(what(a))
    }
}
impl Injected for DiffError {
    fn injected(a: bool) -> Self {
        DiffError::Retryable { message: what(a), retry_after: None }
    }
}
impl Injected for LlmError {
    fn injected(a: bool) -> Self {
        LlmError::Retryable { message: what(a), retry_after: None }
    }
}
impl Injected for CacheError {
    fn injected(a: bool) -> Self {
        CacheError::Unavailable(what(a))
    }
}

/// What every wrapper holds.
#[derive(Clone)]
pub struct Ctx {
    /// The history's chaos.
    pub chaos: Arc<Chaos>,
    /// The process making the calls.
    pub proc: Arc<Process>,
}

impl Ctx {
    /// Before a call: its delay, and a failure that comes before it takes effect.
    pub(crate) async fn pre<E: Injected>(&self, port: Port, op: &str, key: &str) -> Result<Decision, E> {
        self.proc.alive().await;
        let d = self.chaos.decide(port);
        self.proc.sleep(d.delay_ms).await;
        if d.fail == Some(false) {
            self.chaos.trace(|| format!("p{} {op} {} -> injected failure", self.proc.id, short(key)));
            return Err(E::injected(false));
        }
        Ok(d)
    }

    /// After a call: parks if the process crashed meanwhile (the effect may stand), or loses the
    /// answer.
    pub(crate) async fn post<T, E: Injected>(
        &self,
        d: Decision,
        op: &str,
        key: &str,
        r: Result<T, E>,
    ) -> Result<T, E> {
        if self.proc.dead.is_cancelled() {
            self.proc.alive().await;
        }
        if d.fail == Some(true) {
            self.chaos.trace(|| format!("p{} {op} {} -> took effect, answer lost", self.proc.id, short(key)));
            return Err(E::injected(true));
        }
        r
    }

    /// The model call of `id` has ended (its answer is being written, or its failure noted).
    pub(crate) fn release_hand(&self, id: &str) {
        if let Ok(mut h) = self.proc.in_hand.lock() {
            h.remove(id);
        }
    }

    /// This process holds `messages` (received for it by someone else: Lambda's mapping).
    pub fn hold(&self, messages: &[ReceivedMessage]) {
        if let Ok(mut h) = self.proc.holding.lock() {
            for m in messages {
                h.insert(m.receipt.clone(), id_of_body(&m.body).unwrap_or_default());
            }
        }
    }

    /// Which of `receipts` are still their messages' current ones.
    async fn live(&self, receipts: impl IntoIterator<Item = String>) -> Vec<String> {
        let Some(queue) = self.chaos.receipts.as_ref() else { return Vec::new() };
        let mut live = Vec::new();
        for r in receipts {
            if queue.peek_receipt(&r).await.is_some() {
                live.push(r);
            }
        }
        live
    }

    /// The current delivery asks for `task`'s lock: the first time, notes the receipts of the task
    /// its process holds live now (a process may still hold a dead one of an earlier delivery).
    async fn asking_for_lock(&self, task: &str) {
        let Some(id) = tokio::task::try_id() else { return };
        let key = (id, task.to_owned());
        if self.chaos.asked_with.lock().map_or(true, |m| m.contains_key(&key)) {
            return;
        }
        let held: Vec<String> = match self.proc.holding.lock() {
            Ok(h) => h.iter().filter(|(_, t)| t.as_str() == task).map(|(r, _)| r.clone()).collect(),
            Err(_) => return,
        };
        let live = self.live(held).await;
        if let Ok(mut m) = self.chaos.asked_with.lock() {
            m.insert(key, live);
        }
    }

    /// Whether the current delivery, claiming `task`, still holds a live receipt of it: one of those
    /// it held live when it first asked for the lock. `None` when that cannot be told (no lock
    /// asked for, or no receipt held then).
    async fn claims_live(&self, task: &str) -> Option<bool> {
        let id = tokio::task::try_id()?;
        let held = self.chaos.asked_with.lock().ok()?.remove(&(id, task.to_owned()))?;
        if held.is_empty() {
            return None;
        }
        Some(!self.live(held).await.is_empty())
    }

    fn settled(&self, receipt: &str) {
        if let Ok(mut h) = self.proc.holding.lock() {
            h.remove(receipt);
        }
    }

    pub(crate) fn note(&self, line: impl FnOnce() -> String) {
        self.chaos.trace(|| format!("p{} {}", self.proc.id, line()));
    }
}

/// A task id as the trace shows it.
pub fn short(key: &str) -> String {
    let id = if key.starts_with("lease:{") { id_of_lock_key(key) } else { key.to_owned() };
    id.chars().take(8).collect()
}

fn task_of_body(body: &str) -> Option<TaskId> {
    serde_json::from_str::<serde_json::Value>(body).ok()?.get("task_id")?.as_str()?.parse().ok()
}

/// The task or the commit (its sha) a message carries.
pub fn id_of_body(body: &str) -> Option<String> {
    let v = serde_json::from_str::<serde_json::Value>(body).ok()?;
    v.get("task_id").or_else(|| v.get("sha"))?.as_str().map(str::to_owned)
}

/// The task or the commit (its sha) a lock key names.
fn id_of_lock_key(key: &str) -> String {
    let inner = key.trim_start_matches("lease:{").trim_end_matches('}');
    match inner.strip_prefix("task:") {
        Some(task) => task.to_owned(),
        None => inner.rsplit(':').next().unwrap_or(inner).to_owned(),
    }
}

// ---------------------------------------------------------------- store

/// The task store with faults.
pub struct FaultyStore {
    /// The twin.
    pub inner: EmbeddedStore,
    /// Chaos and process.
    pub ctx: Ctx,
}

#[async_trait]
impl TaskStore for FaultyStore {
    async fn put_pending(&self, record: &TaskRecord, now_ms: u64) -> Result<PutOutcome, StoreError> {
        let id = &record.task_id;
        let d = self.ctx.pre::<StoreError>(Port::Store, "put_pending", id).await?;
        let before = self.inner.get(id, now_ms).await.ok().flatten();
        let r = self.inner.put_pending(record, now_ms).await;
        if let Ok(PutOutcome::Created) = &r {
            let admin = self.ctx.proc.admin;
            let (was, now) = (before.map(|b| b.status), self.ctx.chaos.now());
            self.ctx.chaos.oracle(|o| o.created(id, admin, was, now));
            self.ctx.note(|| format!("put_pending {} -> Created (admin: {admin})", short(id)));
        }
        self.ctx.post(d, "put_pending", id, r).await
    }
    async fn get(&self, task_id: &TaskId, now_ms: u64) -> Result<Option<TaskRecord>, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "get", task_id).await?;
        let r = self.inner.get(task_id, now_ms).await;
        if let Ok(Some(rec)) = &r {
            let (st, f, e) = (rec.status, rec.fence, rec.enqueued_at_ms);
            self.ctx.note(|| format!("get {} -> {st:?} fence {f} enqueued {e}", short(task_id)));
        }
        self.ctx.post(d, "get", task_id, r).await
    }
    async fn mark_enqueued(
        &self,
        task_id: &TaskId,
        mark: EnqueueMark,
        now_ms: u64,
        ttl: u64,
    ) -> Result<bool, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "mark_enqueued", task_id).await?;
        let r = self.inner.mark_enqueued(task_id, mark, now_ms, ttl).await;
        if let Ok(done) = &r {
            let done = *done;
            self.ctx.note(|| format!("mark_enqueued {} {mark:?} -> {done}", short(task_id)));
            if done && mark.to_ms != UNSENT {
                self.ctx.chaos.oracle(|o| o.resend_claimed(task_id, mark.to_ms, mark.from_ms));
            }
        }
        self.ctx.post(d, "mark_enqueued", task_id, r).await
    }
    async fn claim(&self, task_id: &TaskId, now_ms: u64, ttl: u64) -> Result<ClaimOutcome, StoreError> {
        // Judged when asked: a claim slowed on its way lands when it lands, which no worker decides.
        let live = self.ctx.claims_live(task_id).await;
        let d = self.ctx.pre::<StoreError>(Port::Store, "claim", task_id).await?;
        let r = self.inner.claim(task_id, now_ms, ttl).await;
        if let Ok(ClaimOutcome::Claimed(rec)) = &r {
            let broken = self.ctx.chaos.claims_broken(task_id);
            let how = if broken { " (lock lost or never held)" } else { "" };
            self.ctx.note(|| format!("claim {} -> fence {}{how}", short(task_id), rec.fence));
            self.ctx.chaos.oracle(|o| {
                o.claimed(task_id, rec.fence, broken);
                if let Some(live) = live {
                    o.claimed_on(task_id, live);
                }
            });
        }
        self.ctx.post(d, "claim", task_id, r).await
    }
    async fn note_attempt(
        &self,
        task_id: &TaskId,
        fence: u64,
        reason: &str,
        now_ms: u64,
    ) -> Result<Option<u32>, StoreError> {
        self.release_hand(task_id);
        // A failure: its delivery is an attempt, handed back (I5's second half).
        self.ctx.chaos.oracle(|o| o.attempted(task_id));
        let d = self.ctx.pre::<StoreError>(Port::Store, "note_attempt", task_id).await?;
        let r = self.inner.note_attempt(task_id, fence, reason, now_ms).await;
        self.ctx.post(d, "note_attempt", task_id, r).await
    }
    async fn cancel(&self, task_id: &TaskId, now_ms: u64, ttl: u64) -> Result<CancelOutcome, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "cancel", task_id).await?;
        let r = self.inner.cancel(task_id, now_ms, ttl).await;
        if let Ok(CancelOutcome::Cancelled(rec)) = &r {
            self.ctx.chaos.oracle(|o| {
                o.terminal_write(task_id, "CANCELLED");
                o.cancelled(task_id, rec.fence);
            });
            self.ctx.note(|| format!("cancel {} -> CANCELLED fence {}", short(task_id), rec.fence));
        }
        self.ctx.post(d, "cancel", task_id, r).await
    }
    async fn fail_unfinished(
        &self,
        task_id: &TaskId,
        reason: &str,
        sent_before_ms: u64,
        now_ms: u64,
        ttl: u64,
    ) -> Result<bool, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "fail_unfinished", task_id).await?;
        let r = self.inner.fail_unfinished(task_id, reason, sent_before_ms, now_ms, ttl).await;
        if let Ok(true) = r {
            self.ctx.chaos.oracle(|o| o.terminal_write(task_id, "FAILED"));
            self.ctx.note(|| format!("fail_unfinished {} -> FAILED ({reason})", short(task_id)));
        }
        self.ctx.post(d, "fail_unfinished", task_id, r).await
    }
    async fn park(
        &self,
        task_id: &TaskId,
        fence: u64,
        parked: lanes_core::domain::Parked,
        now_ms: u64,
        ttl: u64,
    ) -> Result<bool, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "park", task_id).await?;
        let batch = parked.batch.clone();
        let r = self.inner.park(task_id, fence, parked, now_ms, ttl).await;
        if let Ok(done) = &r {
            let done = *done;
            // Noted before its answer may be lost: the park took effect either way.
            if let (true, Ok(mut p)) = (done, self.ctx.chaos.parkers.lock()) {
                p.insert(task_id.to_string(), (fence, tokio::task::try_id()));
            }
            self.ctx.note(|| format!("park {} fence {fence} in {batch} -> {done}", short(task_id)));
        }
        self.ctx.post(d, "park", task_id, r).await
    }
    async fn unpark(&self, task_id: &TaskId, fence: u64, now_ms: u64) -> Result<bool, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "unpark", task_id).await?;
        let r = self.inner.unpark(task_id, fence, now_ms).await;
        if let Ok(done) = &r {
            let done = *done;
            self.ctx.note(|| format!("unpark {} fence {fence} -> {done}", short(task_id)));
            if done {
                self.ctx.chaos.oracle(|o| o.given_back(task_id, fence));
            }
        }
        self.ctx.post(d, "unpark", task_id, r).await
    }
    async fn checkpoint(
        &self,
        task_id: &TaskId,
        fence: u64,
        text: &str,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "checkpoint", task_id).await?;
        let r = self.inner.checkpoint(task_id, fence, text, now_ms).await;
        if let Ok(done) = &r {
            let (done, chars) = (*done, text.chars().count());
            self.ctx.note(|| format!("checkpoint {} fence {fence} {chars} chars -> {done}", short(task_id)));
        }
        self.ctx.post(d, "checkpoint", task_id, r).await
    }
    async fn finish(
        &self,
        task_id: &TaskId,
        fence: u64,
        completion: Completion,
        now_ms: u64,
        ttl: u64,
    ) -> Result<FinishOutcome, StoreError> {
        let d = match self.ctx.pre::<StoreError>(Port::Store, "finish", task_id).await {
            Ok(d) => d,
            Err(e) => {
                self.ctx.chaos.oracle(|o| o.justify(task_id, "final write failed"));
                return Err(e);
            }
        };
        let answered = matches!(completion, Completion::Completed(_));
        let r = self.inner.finish(task_id, fence, completion, now_ms, ttl).await;
        match &r {
            Ok(FinishOutcome::Written(rec)) => {
                let status = rec.status.as_str();
                self.ctx.chaos.oracle(|o| o.terminal_write(task_id, status));
                self.ctx.note(|| format!("finish {} fence {fence} -> {status}", short(task_id)));
            }
            Ok(FinishOutcome::StaleFence) if answered => {
                let now = self.ctx.chaos.clock.now_ms();
                let current = self.inner.get(task_id, now).await.ok().flatten();
                let (id, current) = (task_id.to_owned(), current);
                self.ctx.note(|| {
                    let st = current
                        .as_ref()
                        .map_or("gone".into(), |c| format!("{:?} fence {}", c.status, c.fence));
                    format!("finish {} fence {fence} -> StaleFence (record {st})", short(&id))
                });
                self.ctx.chaos.oracle(|o| o.answer_refused(task_id, fence, current.as_ref()));
            }
            _ => {}
        }
        self.release_hand(task_id);
        if d.fail == Some(true) {
            self.ctx.chaos.oracle(|o| o.justify(task_id, "final write's answer lost"));
        }
        self.ctx.post(d, "finish", task_id, r).await
    }
}

impl FaultyStore {
    fn release_hand(&self, task_id: &str) {
        self.ctx.release_hand(task_id);
    }
}

// ---------------------------------------------------------------- queue

/// A lane queue (or DLQ) with faults.
pub struct FaultyQueue {
    /// The twin.
    pub inner: EmbeddedQueue,
    /// Chaos and process.
    pub ctx: Ctx,
}

#[async_trait]
impl QueueSend for FaultyQueue {
    async fn send(&self, body: &str, attributes: BTreeMap<String, String>) -> Result<MessageId, QueueError> {
        let task = id_of_body(body).unwrap_or_default();
        if self.ctx.proc.kind == "ingress" {
            self.ctx.chaos.oracle(|o| o.ingress_send(&task));
        }
        let d = self.ctx.pre::<QueueError>(Port::Queue, "send", &task).await?;
        let r = self.inner.send(body, attributes.clone()).await;
        if r.is_ok()
            && let Ok(c) = serde_json::from_str::<lanes_core::domain::commit::CommitMessage>(body)
            && c.escalated.is_some()
        {
            // A batch's collector sent the commit on (it is in the queue): the batch no longer
            // owns it.
            self.ctx.chaos.oracle(|o| o.commit_sent_on(&c.sha));
        }
        if r.is_ok()
            && !self.ctx.chaos.is_calm()
            && self.ctx.chaos.chance() < self.ctx.chaos.plan.p_duplicate_delivery
        {
            let _ = self.inner.send(body, attributes).await;
            self.ctx.note(|| format!("send {} delivered twice", short(&task)));
        }
        let r = self.ctx.post(d, "send", &task, r).await;
        if r.is_ok() {
            self.ctx.note(|| format!("send {} ok to {}", short(&task), self.inner.name()));
        }
        r
    }
}

#[async_trait]
impl QueueConsume for FaultyQueue {
    async fn receive_for(
        &self,
        max: usize,
        vis: Option<Duration>,
    ) -> Result<Vec<ReceivedMessage>, QueueError> {
        let d = self.ctx.pre::<QueueError>(Port::Queue, "receive", "").await?;
        let r = self.inner.receive_for(max, vis).await;
        if let Ok(got) = &r {
            // The mapping receives for the invocations it starts: they hold the messages.
            if self.ctx.proc.kind != "sqs-mapping" {
                self.ctx.hold(got);
            }
            for m in got {
                let t = id_of_body(&m.body).unwrap_or_default();
                self.ctx.note(|| {
                    format!("receive {} from {} (#{})", short(&t), self.inner.name(), m.receive_count)
                });
            }
        }
        self.ctx.post(d, "receive", "", r).await
    }
    async fn change_visibility(&self, receipt: &str, timeout: Duration) -> Result<(), QueueError> {
        let d = self.ctx.pre::<QueueError>(Port::Queue, "change_visibility", "").await?;
        let r = self.inner.change_visibility(receipt, timeout).await;
        // A renewal (a lease's start, or its confirmation before a claim) keeps the delivery held.
        if r.is_ok() && timeout != self.ctx.chaos.lease_ttl {
            self.ctx.settled(receipt);
        }
        self.ctx.post(d, "change_visibility", "", r).await
    }
    async fn change_visibility_many(
        &self,
        receipts: &[String],
        timeout: Duration,
    ) -> Vec<Result<(), QueueError>> {
        let d = match self.ctx.pre::<QueueError>(Port::Queue, "change_visibility_many", "").await {
            Ok(d) => d,
            Err(_) => return receipts.iter().map(|_| Err(QueueError::injected(false))).collect(),
        };
        let r = self.inner.change_visibility_many(receipts, timeout).await;
        match self.ctx.post::<_, QueueError>(d, "change_visibility_many", "", Ok(r)).await {
            Ok(r) => r,
            Err(_) => receipts.iter().map(|_| Err(QueueError::injected(true))).collect(),
        }
    }
    async fn delete(&self, receipt: &str) -> Result<(), QueueError> {
        let d = self.ctx.pre::<QueueError>(Port::Queue, "delete", "").await?;
        // A DLQ's deletes are not acks: a redrive or the sweep's relay deletes a message there only
        // after sending its copy to the lane.
        if !self.inner.name().ends_with("-dlq") {
            check_ack(&self.ctx.chaos, &self.inner, receipt).await;
        }
        let r = self.inner.delete(receipt).await;
        if r.is_ok() {
            self.ctx.settled(receipt);
        }
        self.ctx.post(d, "delete", "", r).await
    }
    async fn requeue(&self, message: &ReceivedMessage, delay: Duration) -> Result<(), QueueError> {
        let task = id_of_body(&message.body).unwrap_or_default();
        let r = async {
            let d = self.ctx.pre::<QueueError>(Port::Queue, "requeue", &task).await?;
            let r = self.inner.requeue(message, delay).await;
            if r.is_ok() {
                self.ctx.settled(&message.receipt);
            }
            self.ctx.post(d, "requeue", &task, r).await
        }
        .await;
        // A put-off whose fresh copy failed leaves the last delivery to the queue's redrive.
        if r.is_err() {
            self.ctx.chaos.oracle(|o| o.attempted(&task));
        }
        r
    }
    async fn dead_letter(&self, message: &ReceivedMessage, reason: &str) -> Result<(), QueueError> {
        let task = id_of_body(&message.body).unwrap_or_default();
        let r = async {
            let d = self.ctx.pre::<QueueError>(Port::Queue, "dead_letter", &task).await?;
            let r = self.inner.dead_letter(message, reason).await;
            if r.is_ok() {
                self.ctx.settled(&message.receipt);
            }
            self.ctx.post(d, "dead_letter", &task, r).await
        }
        .await;
        // A failed dead-letter leaves the message to the queue's redrive, without its reason.
        if r.is_err() {
            self.ctx.chaos.oracle(|o| o.attempted(&task));
        }
        r
    }
    async fn depth(&self) -> Result<QueueDepth, QueueError> {
        let d = self.ctx.pre::<QueueError>(Port::Queue, "depth", "").await?;
        let r = self.inner.depth().await;
        self.ctx.post(d, "depth", "", r).await
    }
    fn max_receive_count(&self) -> u32 {
        self.inner.max_receive_count()
    }
    async fn start_move_back(&self) -> Result<String, QueueError> {
        let d = self.ctx.pre::<QueueError>(Port::Queue, "start_move_back", "").await?;
        let r = self.inner.start_move_back().await;
        self.ctx.post(d, "start_move_back", "", r).await
    }
    async fn move_tasks(&self) -> Result<Vec<MoveTask>, QueueError> {
        self.inner.move_tasks().await
    }
}

/// I5: a delivery is acked only once its record is settled. The message's task is read from the
/// twin's own view of the receipt (peeked before the delete), the record from the true store.
pub async fn check_ack(chaos: &Chaos, queue: &EmbeddedQueue, receipt: &str) {
    let Some((body, sent_at_ms)) = queue.peek_receipt(receipt).await else { return };
    if let Ok(c) = serde_json::from_str::<lanes_core::domain::commit::CommitMessage>(&body) {
        // A commit's delivery is acked once its summary is written, or while a provider batch's
        // record owns the commit (the oracle also takes one its collector has sent on).
        let found = chaos.summaries.get_summaries(&[(c.repo_id.clone(), c.sha.clone())]).await;
        let summarized = found.is_ok_and(|v| !v.is_empty());
        // Owned by an unclosed record (other than the one that sent this delivery on) that carries
        // it: the records are the truth, the markers only their index.
        let from = c.escalated.as_ref().and_then(|e| e.from.clone());
        let batched = match &chaos.batches {
            Some(b) => b.open_batches(usize::MAX).await.is_ok_and(|open| {
                open.iter().any(|r| {
                    Some(&r.key) != from.as_ref()
                        && owns_now(chaos, r.phase, r.created_at_ms)
                        && r.commits().any(|x| x.commit.key() == c.key())
                })
            }),
            None => false,
        };
        chaos.oracle(|o| o.commit_acked(&c.sha, summarized, batched));
        return;
    }
    let Some(task) = task_of_body(&body) else { return };
    let sent_at_ms = sent_at_ms.saturating_sub(EPOCH_MS);
    let record = chaos.truth.get(&task, chaos.clock.now_ms()).await.ok().flatten();
    // A parked run is owned by its batch's record while the record and its marker exist, once the
    // record owns what it carries.
    let batched = match (&chaos.batches, record.as_ref().and_then(|r| r.waiting())) {
        (Some(b), Some(parked)) => {
            let marker = lanes_core::domain::batch::task_marker(&task);
            b.batched(std::slice::from_ref(&marker)).await.is_ok_and(|k| {
                k.get(&marker)
                    .is_some_and(|c| c.batch == parked.batch && owns_now(chaos, c.phase, c.created_at_ms))
            })
        }
        _ => false,
    };
    chaos.oracle(|o| o.acked(&task, record.as_ref(), sent_at_ms, batched));
}

/// Whether a batch record in `phase`, written at `created_at_ms` by its worker's clock, owns what it
/// carries: once submitted, or once no worker can still be submitting it. Until then its worker
/// may find the batch refused, delete the record and make the calls on its own deliveries, so a
/// duplicate acked on it would leave them nothing to come back on. The oracle's skew, the largest
/// between two processes, is more than the acking worker's clock can run ahead of the true time.
fn owns_now(chaos: &Chaos, phase: lanes_core::domain::batch::BatchPhase, created_at_ms: u64) -> bool {
    let grace = lanes_core::domain::batch::SUBMIT_GRACE.as_millis() as u64;
    let skew = chaos.oracle(|o| o.skew_ms);
    let age = chaos.clock.now_ms().saturating_add(skew).saturating_sub(created_at_ms);
    phase != lanes_core::domain::batch::BatchPhase::Submitting || age >= grace
}

// ---------------------------------------------------------------- lock

/// The lease lock with faults; its keys vanish on the plan's failovers.
pub struct FaultyLock {
    /// Chaos and process.
    pub ctx: Ctx,
}

impl FaultyLock {
    fn inner(&self) -> Arc<MemoryLock> {
        match self.ctx.chaos.lock.lock() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// A call made on `inner` that landed after the keys vanished (it was sent before the failover)
    /// took or renewed a key that is gone: its task may be leased twice, as any open run is then.
    fn landed_on_lost_keys(&self, inner: &Arc<MemoryLock>, key: &str) {
        if !Arc::ptr_eq(inner, &self.inner()) {
            let task = id_of_lock_key(key);
            self.ctx.chaos.oracle(|o| o.justify(&task, "a lock call landed on keys that then vanished"));
        }
    }

    async fn guarded<T>(
        &self,
        op: &str,
        key: &str,
        f: impl std::future::Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        self.guarded_as(op, key, f, true).await
    }

    /// [`Self::guarded`]; a failure (before or after the call took effect) justifies its task's
    /// extra calls only when `excuse` is set: a task's acquire is asked three times, and only the
    /// third failure in a row sends its run on without the lock ([`InARow::gave_up`]).
    async fn guarded_as<T>(
        &self,
        op: &str,
        key: &str,
        f: impl std::future::Future<Output = Result<T, LockError>>,
        excuse: bool,
    ) -> Result<T, LockError> {
        let task = id_of_lock_key(key);
        // A lock call its caller gives up on (the heartbeat cuts each at one interval) is the lock
        // service not answering: as unavailable as an error.
        let asked_calm = self.ctx.chaos.is_calm();
        let mut cut =
            Unanswered { chaos: self.ctx.chaos.clone(), task: task.clone(), armed: true, asked_calm };
        let d = match self.ctx.pre::<LockError>(Port::Lock, op, key).await {
            Ok(d) => d,
            Err(e) => {
                if excuse {
                    self.ctx.chaos.oracle(|o| o.justify(&task, "lock unavailable"));
                }
                return Err(e);
            }
        };
        let r = f.await;
        cut.armed = false;
        if d.fail == Some(true) && excuse {
            self.ctx.chaos.oracle(|o| o.justify(&task, "lock answer lost"));
        }
        self.ctx.post(d, op, key, r).await
    }
}

/// Justifies its task's extra calls if dropped while armed (the call was given up on).
struct Unanswered {
    chaos: Arc<Chaos>,
    task: String,
    armed: bool,
    /// The history was calm when the call was asked (no fault slowed it).
    asked_calm: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        // Judged by when it was asked: a call slowed before the history calmed is cut after it.
        if self.armed && !self.asked_calm {
            let task = std::mem::take(&mut self.task);
            self.chaos.trace(|| format!("lock call of {} cut unanswered", short(&task)));
            self.chaos.oracle(|o| o.justify(&task, "lock call unanswered in time"));
        }
    }
}

#[async_trait]
impl LeaseLock for FaultyLock {
    async fn acquire(&self, key: &str, ttl: Duration) -> Result<Acquire, LockError> {
        let task_key = key.starts_with("lease:{task:");
        if task_key {
            self.ctx.asking_for_lock(&id_of_lock_key(key)).await;
        }
        // A task worker's asks are counted; the DLQ sweep's (asked once, by one long-lived task)
        // and the commits worker's (asked once) excuse on any failure, as every other lock call.
        let counted = task_key && matches!(self.ctx.proc.kind, "pool" | "lambda");
        let inner = self.inner();
        let r = self.guarded_as("lock.acquire", key, inner.acquire(key, ttl), !counted).await;
        self.landed_on_lost_keys(&inner, key);
        match &r {
            Ok(Acquire::Acquired(_)) => self.ctx.chaos.took(key, Some(inner.clone())),
            Ok(Acquire::Held { .. }) => {}
            Err(_) if !counted => self.ctx.chaos.took(key, None),
            Err(_) => {}
        }
        if counted && self.ctx.chaos.lock_asks.gave_up(key, r.is_err()) {
            // The worker's every ask failed: its run goes on without the lock. One excuse per ask,
            // as before the count: a degraded run may cost more than one extra call (its own call,
            // dropped when its first beat finds a live holder, and the holder's refused answer).
            self.ctx.chaos.took(key, None);
            let task = id_of_lock_key(key);
            for _ in 0..ASKS {
                self.ctx.chaos.oracle(|o| o.justify(&task, "lock unavailable on every ask"));
            }
        }
        if let Ok(a) = &r {
            let got = matches!(a, Acquire::Acquired(_));
            self.ctx
                .note(|| format!("lock.acquire {} -> {}", short(key), if got { "acquired" } else { "held" }));
        }
        r
    }
    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, LockError> {
        let inner = self.inner();
        let r = self.guarded("lock.renew", key, inner.renew(key, token, ttl)).await;
        self.landed_on_lost_keys(&inner, key);
        match &r {
            Ok(false) => self.ctx.note(|| format!("lock.renew {} -> refused", short(key))),
            Ok(true) => self.ctx.note(|| format!("lock.renew {} -> ok", short(key))),
            Err(_) => {}
        }
        r
    }
    async fn release(&self, key: &str, token: &str) -> Result<bool, LockError> {
        let inner = self.inner();
        self.guarded("lock.release", key, inner.release(key, token)).await
    }
}

// ---------------------------------------------------------------- cache

/// The hot cache with faults; its entries vanish on the plan's failovers.
pub struct FaultyCache {
    /// Chaos and process.
    pub ctx: Ctx,
}

impl FaultyCache {
    fn inner(&self) -> Arc<MemoryCache> {
        match self.ctx.chaos.cache.lock() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

#[async_trait]
impl Cache for FaultyCache {
    async fn get(&self, key: &str) -> Result<Option<String>, CacheError> {
        let d = self.ctx.pre::<CacheError>(Port::Cache, "cache.get", key).await?;
        let r = self.inner().get(key).await;
        // I4: a completed record in the cache is one the store holds completed.
        if let Ok(Some(json)) = &r
            && let Some(id) = key.strip_prefix("task:").and_then(|id| TaskId::parse(id).ok())
            && let Ok(rec) = serde_json::from_str::<TaskRecord>(json)
            && rec.status == lanes_core::domain::TaskStatus::Completed
        {
            let stored = self.ctx.chaos.truth.get(&id, self.ctx.chaos.clock.now_ms()).await.ok().flatten();
            self.ctx.chaos.oracle(|o| o.cache_answer(&id, stored.as_ref()));
        }
        self.ctx.post(d, "cache.get", key, r).await
    }
    async fn set(&self, key: &str, value: &str, ttl: Duration) -> Result<(), CacheError> {
        let d = self.ctx.pre::<CacheError>(Port::Cache, "cache.set", key).await?;
        let r = self.inner().set(key, value, ttl).await;
        self.ctx.post(d, "cache.set", key, r).await
    }
    async fn add(&self, key: &str, by: u64, ttl: Duration) -> Result<u64, CacheError> {
        let d = self.ctx.pre::<CacheError>(Port::Cache, "cache.add", key).await?;
        let r = self.inner().add(key, by, ttl).await;
        self.ctx.post(d, "cache.add", key, r).await
    }
    async fn leave(&self, key: &str, member: &str) -> Result<(), CacheError> {
        let d = self.ctx.pre::<CacheError>(Port::Cache, "cache.leave", key).await?;
        let r = self.inner().leave(key, member).await;
        self.ctx.post(d, "cache.leave", key, r).await
    }
    async fn enter_within(
        &self,
        key: &str,
        member: &str,
        now_ms: u64,
        until_ms: u64,
        max: u64,
    ) -> Result<bool, CacheError> {
        let d = self.ctx.pre::<CacheError>(Port::Cache, "cache.enter_within", key).await?;
        let r = self.inner().enter_within(key, member, now_ms, until_ms, max).await;
        self.ctx.post(d, "cache.enter_within", key, r).await
    }
    async fn count_live(&self, key: &str, now_ms: u64) -> Result<u64, CacheError> {
        let d = self.ctx.pre::<CacheError>(Port::Cache, "cache.count_live", key).await?;
        let r = self.inner().count_live(key, now_ms).await;
        self.ctx.post(d, "cache.count_live", key, r).await
    }
    async fn reserve(&self, charges: &[Charge]) -> Result<Option<usize>, CacheError> {
        let key = charges.first().map_or("", |c| c.key.as_str());
        let d = self.ctx.pre::<CacheError>(Port::Cache, "cache.reserve", key).await?;
        let r = self.inner().reserve(charges).await;
        self.ctx.post(d, "cache.reserve", key, r).await
    }
    async fn share(
        &self,
        key: &str,
        ask: &lanes_core::ports::ShareAsk,
    ) -> Result<lanes_core::ports::Verdict, CacheError> {
        let d = self.ctx.pre::<CacheError>(Port::Cache, "cache.share", key).await?;
        let r = self.inner().share(key, ask).await;
        self.ctx.post(d, "cache.share", key, r).await
    }
    async fn share_state(&self, key: &str) -> Result<lanes_core::ports::ShareState, CacheError> {
        // A read for the metrics alone (the lane's standings): nothing in the lifecycle depends on
        // it, so no fault is drawn for it. A draw would move the chaos stream, and with it every
        // pinned seed's history.
        self.inner().share_state(key).await
    }
}

// ---------------------------------------------------------------- provider

/// The provider: answers after a lane-sized latency, or throttles, fails, refuses, is slow. Every
/// call that is not refused by an injected error is spend, answered or dropped mid-way.
pub struct SimLlm {
    /// Chaos and process.
    pub ctx: Ctx,
}

/// Counts one call's spend when it ends, however it ends, unless the provider refused it: for
/// each task or commit the call carries.
struct Spend {
    chaos: Arc<Chaos>,
    ids: Vec<String>,
    refused: bool,
}

impl Drop for Spend {
    fn drop(&mut self) {
        if !self.refused {
            let ids = std::mem::take(&mut self.ids);
            self.chaos.oracle(|o| ids.iter().for_each(|id| o.spent(id)));
        }
    }
}

#[async_trait]
impl LlmClient for SimLlm {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        self.call(request, None).await
    }

    async fn stream(&self, request: &LlmRequest, sink: &dyn DeltaSink) -> Result<LlmResponse, LlmError> {
        self.call(request, Some(sink)).await
    }
}

/// A run parked in a provider batch is the batch's to call: the delivery that parked it calls the
/// model directly only after its park is undone (given back), never while the store still holds the
/// run parked under that delivery's fence, whatever answers it lost on the way (I2).
async fn parked_run_called(chaos: &Chaos, task: &str) {
    let parker = chaos.parkers.lock().ok().and_then(|p| p.get(task).copied());
    let Some((fence, Some(by))) = parker else { return };
    if tokio::task::try_id() != Some(by) {
        return;
    }
    let Ok(id) = task.parse::<TaskId>() else { return };
    let record = chaos.truth.get(&id, chaos.clock.now_ms()).await.ok().flatten();
    if record.is_some_and(|r| r.fence == fence && r.waiting().is_some()) {
        let detail =
            format!("the delivery that parked the run (fence {fence}) called the model while it was parked");
        chaos.oracle(|o| o.violate("I2", task, detail));
    }
}

/// A task's whole answer from the simulated model: long enough that a run lost mid-way has said
/// part of it (I10 holds every completed answer to it).
pub fn sim_answer(task: &str) -> String {
    format!("answer to {}:{}", short(task), (0..24).map(|i| format!(" part{i}")).collect::<String>())
}

/// Pieces a streamed answer comes in.
const PIECES: usize = 6;

impl SimLlm {
    /// One call, its text to `sink` as it comes when there is one. A task's answer continues the
    /// request's prefix: the rest of the answer where the prefix is its start, else the whole answer
    /// after it (which I10 catches). A streamed call that fails as retryable is cut after a third
    /// of its text.
    async fn call(
        &self,
        request: &LlmRequest,
        sink: Option<&dyn DeltaSink>,
    ) -> Result<LlmResponse, LlmError> {
        // A crashed process makes no call (its calls never return, as at every other port).
        self.ctx.proc.alive().await;
        let chaos = &self.ctx.chaos;
        let commits = request.lane == lanes_core::domain::Lane::Commits;
        // A commit call carries each commit between `=== commit <sha>` lines.
        let ids: Vec<String> = if commits {
            request.prompt.lines().filter_map(|l| l.strip_prefix("=== commit ")).map(str::to_owned).collect()
        } else {
            vec![chaos.prompts.get(&request.prompt).cloned().unwrap_or_default()]
        };
        let task = ids.first().cloned().unwrap_or_default();
        if !commits {
            parked_run_called(chaos, &task).await;
        }
        if let Ok(mut h) = self.ctx.proc.in_hand.lock() {
            h.extend(ids.iter().cloned());
        }
        self.ctx.note(|| format!("llm.call {} starts ({} in the call)", short(&task), ids.len()));
        let mut spend = Spend { chaos: chaos.clone(), ids: ids.clone(), refused: false };
        let plan = &chaos.plan.llm;
        let mut latency = match request.lane {
            lanes_core::domain::Lane::Interactive => chaos.between(100, 3_000),
            _ => chaos.between(2_000, 40_000),
        };
        let roll = if chaos.is_calm() { 1.0 } else { chaos.chance() };
        // A flex call may find no spare capacity: refused before any work, never charged; the
        // route asks again at sync (`llm::route`), which this provider then answers as any call.
        if request.tier == lanes_core::domain::tier::Tier::Flex && !chaos.is_calm() && chaos.chance() < 0.2 {
            spend.refused = true;
            self.ctx.proc.sleep(latency / 10).await;
            ids.iter().for_each(|id| self.ctx.release_hand(id));
            self.ctx.note(|| format!("llm.call {} refused at flex", short(&task)));
            return Err(LlmError::TierRefused {
                message: "429 Resource Unavailable".into(),
                unsupported: false,
            });
        }
        if !chaos.is_calm() && chaos.chance() < plan.p_slow {
            latency *= 10;
        }
        let (p1, p2, p3) = (
            plan.p_throttle,
            plan.p_throttle + plan.p_retryable,
            plan.p_throttle + plan.p_retryable + plan.p_permanent,
        );
        let text = if commits {
            lanes_core::commits::prompt::offline_answer(&request.prompt)
        } else {
            let whole = sim_answer(&task);
            match request.continuation() {
                None => whole,
                Some((prefix, _)) => {
                    whole.strip_prefix(prefix).map_or_else(|| format!(" {whole}"), str::to_owned)
                }
            }
        };
        if roll < p3 {
            spend.refused = true;
            let cut = sink.filter(|_| (p1..p2).contains(&roll));
            self.speak(&text, latency / 4, cut, PIECES / 3).await;
            ids.iter().for_each(|id| self.ctx.release_hand(id));
            self.ctx.note(|| format!("llm.call {} refused", short(&task)));
            return Err(if roll < p1 {
                LlmError::Throttled {
                    message: "429".into(),
                    retry_after: Some(Duration::from_secs(chaos.between(1, 20))),
                }
            } else if roll < p2 {
                LlmError::Retryable { message: "503 or timeout".into(), retry_after: None }
            } else {
                LlmError::Permanent("400 the model refused the request".into())
            });
        }
        self.speak(&text, latency, sink, PIECES).await;
        self.ctx.note(|| format!("llm.call {} answered", short(&task)));
        let prompt = (request.prompt.len() / 4) as u64 + 20;
        Ok(LlmResponse {
            text,
            model: "sim-model".into(),
            usage: lanes_core::domain::TokenUsage { prompt, completion: 80 },
            truncated: false,
            limits: ProviderLimits::default(),
            tier: request.tier,
            route: Default::default(),
            continued: 0,
        })
    }

    /// The first `said` of `text`'s [`PIECES`] pieces to `sink` over `latency` (the whole of it
    /// taken, whatever is said); without a sink, the wait alone.
    async fn speak(&self, text: &str, latency: u64, sink: Option<&dyn DeltaSink>, said: usize) {
        let Some(sink) = sink else { return self.ctx.proc.sleep(latency).await };
        let chars: Vec<char> = text.chars().collect();
        let per = chars.len().div_ceil(PIECES).max(1);
        for (i, piece) in chars.chunks(per).enumerate() {
            self.ctx.proc.sleep(latency / PIECES as u64).await;
            if i < said {
                sink.delta(&piece.iter().collect::<String>());
            }
        }
    }
}

/// The simulated provider behind one route that offers flex, as the deployed stack wires it: a
/// refused flex call is asked again at sync there.
pub fn sim_llm(ctx: &Ctx) -> Arc<dyn LlmClient> {
    use lanes_core::llm::route::{Fallback, RouteClient};
    // Continuing where it can, as every deployed route does.
    let model = || Arc::new(lanes_core::llm::Continuing::new(Arc::new(SimLlm { ctx: ctx.clone() }), true));
    let route = || RouteClient::new("sim:model".into(), model(), None, true);
    Arc::new(Fallback::new([vec![route()], vec![route()], vec![route()]]))
}
