//! The weighted dynamic pool (see docs/ARCHITECTURE.md, Lanes): a pure policy that says how many slots each lane may use
//! now, and an in-process pool of N slots that runs workers with it. Interactive holds 70%, the
//! background lanes 30%; a lane borrows what another leaves idle and gives it back as its tasks finish
//! (no preemption).

use crate::commits::worker::CommitsWorker;
use crate::domain::Lane;
use crate::metrics::Metrics;
use crate::ports::{QueueConsume, ReceivedMessage};
use crate::tasks::worker::Worker;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Commits one slot of the commits lane takes at once (Lambda's batch size for that lane).
const COMMIT_BATCH: usize = 100;

/// Default reservations: interactive 0.7; synthesis and commits share the background 0.3.
pub const DEFAULT_SHARES: [f64; 3] = [0.7, 0.2, 0.1];

/// Slots each lane is guaranteed, by largest remainder so they add up to `capacity` exactly.
pub fn reserved(capacity: usize, shares: [f64; 3]) -> [usize; 3] {
    let total: f64 = shares.iter().map(|s| s.max(0.0)).sum();
    if total <= 0.0 || capacity == 0 {
        return [0; 3];
    }
    let exact = shares.map(|s| s.max(0.0) / total * capacity as f64);
    let mut out = exact.map(|e| e.floor() as usize);
    let mut left = capacity - out.iter().sum::<usize>();
    let mut order: Vec<usize> = (0..3).collect();
    // Largest fractional part first; ties go to the higher-priority lane.
    order.sort_by(|&a, &b| {
        (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b))
    });
    for i in order {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// Lane groups: the reservation is 70% interactive, 30% background; the background lanes (synthesis,
/// commits) lend their idle share to each other before anyone else.
const GROUP: [usize; 3] = [0, 1, 1];

/// How many slots each lane may occupy now. Each lane gets its demand (running + backlog) up to its
/// reservation; an idle share goes first to lanes of its own group, then to any lane with unmet
/// demand, slot by slot, the lane furthest below its weight first, except that an interactive lane with
/// work keeps [`INTERACTIVE_HEADROOM`] of its reservation free for its next burst. A lane already running more than
/// its allowance keeps its tasks (no preemption) but starts no new one until it is back under.
pub fn allocate(capacity: usize, shares: [f64; 3], running: [usize; 3], backlog: [usize; 3]) -> [usize; 3] {
    let reserve = reserved(capacity, shares);
    let demand: [usize; 3] = std::array::from_fn(|i| running[i] + backlog[i]);
    let mut allowed: [usize; 3] = std::array::from_fn(|i| demand[i].min(reserve[i]));
    for group in 0..2 {
        let idle: usize = (0..3).filter(|&i| GROUP[i] == group).map(|i| reserve[i] - allowed[i]).sum();
        water_fill(&mut allowed, idle, demand, shares, |i| GROUP[i] == group);
    }
    // An active interactive lane keeps headroom for its next burst: without preemption, a slot lent
    // to a 45-180 s synthesis task is gone for that long. A truly idle lane (no demand) lends all.
    let headroom = if demand[0] > 0 {
        // Rounded down: a small pool (reservation 1-3) keeps no headroom rather than starve the others.
        ((reserve[0] as f64 * INTERACTIVE_HEADROOM).floor() as usize).min(reserve[0] - allowed[0])
    } else {
        0
    };
    let spare = capacity.saturating_sub(allowed.iter().sum::<usize>() + headroom);
    water_fill(&mut allowed, spare, demand, shares, |_| true);
    allowed
}

/// Share of interactive's reservation it does not lend while it has work (see [`allocate`]): 3 of a
/// 10-slot pool's 7. Measured with `lanes bench hol` (85% load, synthesis most of the work): with 2
/// the interactive tail arrives to every slot busy and its p99 is about 1.2x its service time; with 3
/// it is about 1.1x for 4% of synthesis throughput; 4 and more cost synthesis 8% and over for nothing.
pub const INTERACTIVE_HEADROOM: f64 = 0.45;

/// Gives up to `slots` slots, one at a time, to eligible lanes with unmet demand, lowest
/// allowed/weight first (ties to the higher-priority lane).
fn water_fill(
    allowed: &mut [usize; 3],
    slots: usize,
    demand: [usize; 3],
    shares: [f64; 3],
    eligible: impl Fn(usize) -> bool,
) {
    for _ in 0..slots {
        let next = (0..3).filter(|&i| eligible(i) && allowed[i] < demand[i]).min_by(|&a, &b| {
            let load = |i: usize| (allowed[i] + 1) as f64 / shares[i].max(1e-9);
            load(a).total_cmp(&load(b)).then(a.cmp(&b))
        });
        let Some(i) = next else { return };
        allowed[i] += 1;
    }
}

/// How long an idle pool's receive waits for a message (SQS's longest long poll).
const IDLE_WAIT: Duration = Duration::from_secs(20);

/// An in-process pool of `capacity` worker slots over one queue per lane.
pub struct Pool {
    capacity: usize,
    shares: [f64; 3],
    queues: Vec<(Lane, Arc<dyn QueueConsume>)>,
    worker: Worker,
    metrics: Metrics,
    running: Arc<[AtomicUsize; 3]>,
    wake: Arc<Notify>,
    poll_interval: Duration,
    commits: Option<CommitsWorker>,
    borrow: bool,
    idle_grace: Duration,
    interactive_seen: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("capacity", &self.capacity).field("shares", &self.shares).finish()
    }
}

impl Pool {
    /// A pool of `capacity` slots over `queues`.
    pub fn new(
        capacity: usize,
        shares: [f64; 3],
        queues: Vec<(Lane, Arc<dyn QueueConsume>)>,
        worker: Worker,
        poll_interval: Duration,
    ) -> Self {
        let metrics = worker.metrics.clone();
        Self {
            capacity: capacity.max(1),
            shares,
            queues,
            worker,
            metrics,
            running: Arc::new(Default::default()),
            wake: Arc::new(Notify::new()),
            poll_interval,
            commits: None,
            borrow: true,
            idle_grace: Duration::from_secs(10),
            interactive_seen: std::sync::Mutex::new(None),
        }
    }

    /// How long interactive counts as active after its last task, keeping its headroom (default
    /// 10 s): a gap between two requests is not idleness, and a slot lent to synthesis is gone for
    /// minutes.
    pub fn with_idle_grace(mut self, grace: Duration) -> Self {
        self.idle_grace = grace;
        self
    }

    /// A static split instead: each lane keeps to its reservation even when others are idle (the
    /// baseline `lanes bench hol` compares against).
    pub fn without_borrowing(mut self) -> Self {
        self.borrow = false;
        self
    }

    /// Runs the commits lane with the batch worker: one slot takes up to 100 commits at once.
    pub fn with_commits(mut self, worker: CommitsWorker) -> Self {
        self.commits = Some(worker);
        self
    }

    /// Tasks running per lane now.
    pub fn running(&self) -> [usize; 3] {
        std::array::from_fn(|i| self.running[i].load(Ordering::SeqCst))
    }

    /// Runs until `shutdown` is cancelled; in-flight tasks are left to finish or to their leases.
    ///
    /// While there is work, each round reads every lane's depth and starts what the policy allows,
    /// again when a slot frees up or every `poll_interval`. Once the pool is idle (nothing running,
    /// nothing visible), it stops asking for depths: one long-poll receive per lane waits for the
    /// next message (SQS answers the moment one arrives, or empty after 20 s). What it brings is
    /// started if the policy has room for it then (the pool may have become busy meanwhile), and
    /// handed straight back to its queue otherwise.
    pub async fn run(&self, shutdown: CancellationToken) {
        let (found_tx, mut found_rx) = tokio::sync::mpsc::unbounded_channel();
        let polling: Arc<[std::sync::atomic::AtomicBool; 3]> = Arc::new(Default::default());
        let mut polls = tokio::task::JoinSet::new();
        loop {
            let idle = self.dispatch().await;
            if idle {
                for (lane, queue) in &self.queues {
                    let i = lane.index();
                    if polling[i].swap(true, Ordering::SeqCst) {
                        continue; // one long-poll per lane at a time
                    }
                    let (queue, lane, tx, polling) =
                        (queue.clone(), *lane, found_tx.clone(), polling.clone());
                    let lease = self.lease_for(lane);
                    polls.spawn(async move {
                        let got = queue.receive_waiting(1, Some(lease), IDLE_WAIT).await;
                        polling[lane.index()].store(false, Ordering::SeqCst);
                        let _ = tx.send((lane, got));
                    });
                }
            }
            while polls.try_join_next().is_some() {}
            // Biased (in the order written): every branch is cheap and the loop comes back at once,
            // so none starves, and a seeded simulation decides the order instead of tokio's RNG.
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    // Whatever a long poll brought and nobody started goes back at once. A poll
                    // still waiting is dropped; should SQS have answered it meanwhile, that
                    // message is back when its lease ends.
                    polls.abort_all();
                    while let Ok((lane, Ok(messages))) = found_rx.try_recv() {
                        self.hand_back(lane, messages).await;
                    }
                    return;
                }
                _ = self.wake.notified() => {}
                Some((lane, got)) = found_rx.recv() => match got {
                    Ok(messages) => self.start_received(lane, messages).await,
                    Err(e) => {
                        warn!(lane = %lane, error = %e, "receive failed");
                        tokio::time::sleep(self.poll_interval).await;
                    }
                },
                _ = tokio::time::sleep(self.poll_interval), if !idle => {}
            }
        }
    }

    /// What each lane may run now, given what runs and what waits. A recently active interactive
    /// lane is treated as having work, so it keeps its headroom for the idle grace.
    fn allowance(&self, running: [usize; 3], backlog: [usize; 3]) -> [usize; 3] {
        if !self.borrow {
            return reserved(self.capacity, self.shares);
        }
        let active = match self.interactive_seen.lock() {
            Ok(mut seen) => {
                if running[0] + backlog[0] > 0 {
                    *seen = Some(tokio::time::Instant::now());
                }
                seen.is_some_and(|t| t.elapsed() < self.idle_grace)
            }
            Err(_) => false,
        };
        let mut demand = backlog;
        if active && running[0] + backlog[0] == 0 {
            demand[0] = 1;
        }
        allocate(self.capacity, self.shares, running, demand)
    }

    /// The visibility a lane's messages are received with: the lease they start under.
    fn lease_for(&self, lane: Lane) -> Duration {
        match (&self.commits, lane) {
            (Some(commits), Lane::Commits) => commits.lease.lease_ttl,
            _ => self.worker.config.lease_ttl,
        }
    }

    /// Starts messages a long-poll received, as far as the policy has room for them now: a commits
    /// batch (topped up to a full one), or one task each. The rest go straight back.
    async fn start_received(&self, lane: Lane, mut messages: Vec<ReceivedMessage>) {
        let Some((_, queue)) = self.queues.iter().find(|(l, _)| *l == lane) else { return };
        if messages.is_empty() {
            return;
        }
        let running = self.running();
        let mut backlog = [0usize; 3];
        backlog[lane.index()] = messages.len();
        let allowed = self.allowance(running, backlog);
        let room = room(allowed, running, lane.index(), self.capacity, running.iter().sum());
        let slots = if lane == Lane::Commits && self.commits.is_some() { room.min(1) } else { room };
        if slots == 0 {
            self.hand_back(lane, messages).await;
            return;
        }
        if lane != Lane::Commits || self.commits.is_none() {
            let over = messages.split_off(slots.min(messages.len()));
            self.hand_back(lane, over).await;
        }
        if lane == Lane::Commits && self.commits.is_some() {
            match crate::lease::receive_batch(&**queue, COMMIT_BATCH - messages.len(), self.lease_for(lane))
                .await
            {
                Ok(more) => messages.extend(more),
                Err(e) => warn!(lane = %lane, error = %e, "receive failed"),
            }
            self.spawn_commits(lane, queue, messages);
        } else {
            self.spawn_tasks(lane, queue, messages);
        }
    }

    /// Makes received messages visible again at once, for whoever polls next.
    async fn hand_back(&self, lane: Lane, messages: Vec<ReceivedMessage>) {
        let Some((_, queue)) = self.queues.iter().find(|(l, _)| *l == lane) else { return };
        if messages.is_empty() {
            return;
        }
        for r in crate::lease::release(&**queue, &messages).await {
            if let Err(e) = r {
                warn!(lane = %lane, error = %e, "could not hand a received message back; it returns with its lease");
            }
        }
    }

    /// One slot runs a commits batch.
    fn spawn_commits(&self, lane: Lane, queue: &Arc<dyn QueueConsume>, batch: Vec<ReceivedMessage>) {
        let Some(commits) = &self.commits else { return };
        let i = lane.index();
        self.running[i].fetch_add(1, Ordering::SeqCst);
        let (worker, queue, running, wake) =
            (commits.clone(), queue.clone(), self.running.clone(), self.wake.clone());
        tokio::spawn(async move {
            let _slot = SlotGuard { running, lane: i, wake };
            let deadline = tokio::time::Instant::now() + Duration::from_secs(900);
            worker.process_batch(queue, batch, deadline).await;
        });
    }

    /// One slot per task message.
    fn spawn_tasks(&self, lane: Lane, queue: &Arc<dyn QueueConsume>, messages: Vec<ReceivedMessage>) {
        let i = lane.index();
        for message in messages {
            self.running[i].fetch_add(1, Ordering::SeqCst);
            let (worker, queue, running, wake) =
                (self.worker.clone(), queue.clone(), self.running.clone(), self.wake.clone());
            tokio::spawn(async move {
                // Gives the slot back on every path, panics included.
                let _slot = SlotGuard { running, lane: i, wake };
                worker.process(queue, message).await;
            });
        }
    }

    /// One round: read backlogs, compute allowances, start what may start. `true` when the pool is
    /// idle: nothing running and nothing visible in any lane.
    async fn dispatch(&self) -> bool {
        let mut backlog = [0usize; 3];
        for (lane, queue) in &self.queues {
            match queue.depth().await {
                Ok(d) => {
                    backlog[lane.index()] = d.visible as usize;
                    self.metrics.queue_depth.with_label_values(&[lane.as_str()]).set(d.visible as i64);
                    self.metrics.queue_in_flight.with_label_values(&[lane.as_str()]).set(d.in_flight as i64);
                    self.metrics
                        .queue_oldest_age_seconds
                        .with_label_values(&[lane.as_str()])
                        .set((d.oldest_age_ms / 1000) as i64);
                }
                Err(e) => {
                    warn!(lane = %lane, error = %e, "queue depth unavailable");
                    backlog[lane.index()] = usize::MAX; // unknown: not idle, keep polling
                }
            }
        }
        let running = self.running();
        if running.iter().sum::<usize>() == 0 && backlog.iter().all(|b| *b == 0) {
            return true;
        }
        let backlog = backlog.map(|b| if b == usize::MAX { 0 } else { b });
        let allowed = self.allowance(running, backlog);
        let mut total: usize = running.iter().sum();
        for (lane, queue) in &self.queues {
            let i = lane.index();
            let room = room(allowed, running, i, self.capacity, total);
            if room == 0 || backlog[i] == 0 {
                continue;
            }
            if *lane == Lane::Commits && self.commits.is_some() {
                // One slot, one batch: commits share an LLM call, so they travel together.
                let batch =
                    match crate::lease::receive_batch(&**queue, COMMIT_BATCH, self.lease_for(*lane)).await {
                        Ok(b) if !b.is_empty() => b,
                        Ok(_) => continue,
                        Err(e) => {
                            warn!(lane = %lane, error = %e, "receive failed");
                            continue;
                        }
                    };
                total += 1;
                self.spawn_commits(*lane, queue, batch);
                continue;
            }
            // Received straight into a lease: if this process dies before the worker's heartbeat
            // starts, the message is back within a lease, not the queue's long default.
            let messages = match queue.receive_for(room, Some(self.lease_for(*lane))).await {
                Ok(m) => m,
                Err(e) => {
                    warn!(lane = %lane, error = %e, "receive failed");
                    continue;
                }
            };
            total += messages.len();
            self.spawn_tasks(*lane, queue, messages);
        }
        false
    }
}

/// Slots lane `i` may still take: its allowance less what it runs, within the pool's free capacity
/// (`total` slots in use).
fn room(allowed: [usize; 3], running: [usize; 3], i: usize, capacity: usize, total: usize) -> usize {
    allowed[i].saturating_sub(running[i]).min(capacity.saturating_sub(total))
}

struct SlotGuard {
    running: Arc<[AtomicUsize; 3]>,
    lane: usize,
    wake: Arc<Notify>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.running[self.lane].fetch_sub(1, Ordering::SeqCst);
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_add_up() {
        let cases: &[(usize, [usize; 3])] = &[
            (10, [7, 2, 1]),
            (1, [1, 0, 0]),
            (2, [2, 0, 0]),
            (3, [2, 1, 0]),
            (4, [3, 1, 0]),
            (0, [0, 0, 0]),
        ];
        for &(cap, want) in cases {
            assert_eq!(reserved(cap, DEFAULT_SHARES), want, "capacity {cap}");
        }
    }

    #[test]
    fn allocation_table() {
        struct Case {
            name: &'static str,
            cap: usize,
            running: [usize; 3],
            backlog: [usize; 3],
            want: [usize; 3],
        }
        let cases = [
            Case {
                name: "all saturated: 70/20/10",
                cap: 10,
                running: [0; 3],
                backlog: [50, 50, 50],
                want: [7, 2, 1],
            },
            Case {
                name: "commits idle: its share stays in the background group",
                cap: 10,
                running: [0; 3],
                backlog: [50, 50, 0],
                want: [7, 3, 0],
            },
            Case { name: "all idle", cap: 10, running: [0; 3], backlog: [0; 3], want: [0, 0, 0] },
            Case {
                name: "interactive idle: background borrows all",
                cap: 10,
                running: [0; 3],
                backlog: [0, 50, 0],
                want: [0, 10, 0],
            },
            Case {
                name: "background idle: interactive borrows all",
                cap: 10,
                running: [0; 3],
                backlog: [50, 0, 0],
                want: [10, 0, 0],
            },
            Case {
                name: "light interactive: the rest is lent but its headroom (3 of 7)",
                cap: 10,
                running: [1, 0, 0],
                backlog: [2, 50, 50],
                want: [3, 3, 1],
            },
            Case {
                name: "interactive bursting past its reservation: no headroom kept",
                cap: 10,
                running: [7, 0, 0],
                backlog: [5, 50, 0],
                want: [7, 3, 0],
            },
            Case {
                name: "spare goes by weight",
                cap: 10,
                running: [0; 3],
                backlog: [0, 50, 50],
                want: [0, 7, 3],
            },
            Case {
                name: "borrowed slots come back: interactive gets its reservation back as synthesis finishes",
                cap: 10,
                running: [0, 8, 0],
                backlog: [20, 5, 0],
                want: [7, 3, 0],
            },
            Case {
                name: "demand below reservation is not padded",
                cap: 10,
                running: [2, 1, 0],
                backlog: [0, 0, 0],
                want: [2, 1, 0],
            },
            Case {
                name: "one slot: interactive first",
                cap: 1,
                running: [0; 3],
                backlog: [5, 5, 5],
                want: [1, 0, 0],
            },
            Case {
                name: "one slot, interactive idle",
                cap: 1,
                running: [0; 3],
                backlog: [0, 0, 5],
                want: [0, 0, 1],
            },
        ];
        for c in cases {
            assert_eq!(allocate(c.cap, DEFAULT_SHARES, c.running, c.backlog), c.want, "{}", c.name);
            assert!(allocate(c.cap, DEFAULT_SHARES, c.running, c.backlog).iter().sum::<usize>() <= c.cap);
        }
    }

    #[tokio::test]
    async fn pool_reserves_70_30_and_lends_idle_capacity() {
        use crate::clock::SystemClock;
        use crate::domain::{TaskMessage, TaskRecord, TaskRequest};
        use crate::embedded::{
            EmbeddedDb, EmbeddedQueues, EmbeddedStore, MemoryCache, MemoryLock, QueueSettings,
        };
        use crate::llm::OfflineProvider;
        use crate::ports::{QueueSend, TaskStore};
        use serde_json::json;

        let dir = tempfile::tempdir().unwrap();
        let clock: crate::clock::SharedClock = Arc::new(SystemClock);
        let db = EmbeddedDb::open(dir.path()).unwrap();
        let store = EmbeddedStore::new(db.clone());
        let all = EmbeddedQueues::open(db, clock.clone(), QueueSettings::default()).await.unwrap();
        let queues = Lane::ALL.map(|l| all.queue(l.as_str(), "dlq"));
        for (kind, n) in [("explain", 30), ("refactor", 60)] {
            for i in 0..n {
                let req = TaskRequest::from_value(
                    json!({"project_id":"p","kind":kind,"prompt":format!("{i}"),"target_files":[]}),
                )
                .unwrap();
                let rec = TaskRecord::pending(req.task_id(None), req, clock.now_ms(), 3600);
                store.put_pending(&rec, clock.now_ms()).await.unwrap();
                let msg =
                    TaskMessage { task_id: rec.task_id.clone(), lane: rec.lane, kind: rec.request.kind };
                queues[rec.lane.index()]
                    .send(&serde_json::to_string(&msg).unwrap(), Default::default())
                    .await
                    .unwrap();
            }
        }
        let provider = Arc::new(OfflineProvider::new(|_| Duration::from_millis(60)));
        let worker = Worker {
            objects: None,
            events: None,
            store: Arc::new(store),
            lock: Arc::new(MemoryLock::new(clock.clone())),
            cache: Arc::new(MemoryCache::new(clock.clone())),
            llm: provider.clone(),
            metrics: Metrics::new(),
            clock: clock.clone(),
            config: crate::config::WorkerConfig::default(),
            batching: Default::default(),
        };
        let consumers = Lane::ALL
            .iter()
            .map(|&l| (l, Arc::new(queues[l.index()].clone()) as Arc<dyn QueueConsume>))
            .collect();
        // A short grace: this test is about lending once interactive is really idle.
        let pool = Arc::new(
            Pool::new(10, DEFAULT_SHARES, consumers, worker, Duration::from_millis(5))
                .with_idle_grace(Duration::from_millis(50)),
        );
        let stop = CancellationToken::new();
        let runner = {
            let (pool, stop) = (pool.clone(), stop.clone());
            tokio::spawn(async move { pool.run(stop).await })
        };
        let (mut max_bg_while_interactive_waits, mut max_interactive, mut max_bg) = (0, 0, 0);
        while provider.calls() < 90 {
            // Read the slots first: if fewer than 20 interactive calls had started after the read, at
            // least 3 interactive tasks were still queued when it was taken.
            let running = pool.running();
            if provider.calls_for(Lane::Interactive) < 20 {
                max_bg_while_interactive_waits = max_bg_while_interactive_waits.max(running[1] + running[2]);
            }
            max_interactive = max_interactive.max(running[0]);
            max_bg = max_bg.max(running[1]);
            assert!(running.iter().sum::<usize>() <= 10);
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        stop.cancel();
        runner.await.unwrap();
        assert_eq!(max_interactive, 7, "interactive holds its 70%");
        assert_eq!(max_bg_while_interactive_waits, 3, "background keeps its 30% under interactive load");
        assert_eq!(max_bg, 10, "an idle interactive share is lent to the background");
    }
}
