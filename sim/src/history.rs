//! One history of the lifecycle simulation (docs/ARCHITECTURE.md, "Lifecycle simulation"): the
//! faults drawn from its seed, the world (the embedded twins in memory, behind the fault
//! injectors), the actors, a busy phase with faults and a calm one without, and the invariants
//! checked at the end.
//!
//! The actors run the real code: clients go through the task API's router (`tasks::ingress`),
//! workers are the local pool (`pool::Pool`) and Lambda invocations (`lambda::handle_batch`, with
//! the event source mapping's receive and delete played here), the DLQs are swept (`dlq::Sweep`)
//! and redriven (`dlq::redrive`, `dlq::redrive_by_move`) as `lanes dlq` and the controller do; the
//! commits flow's actors are in [`crate::commits`].

use crate::faults::*;
use crate::oracle::{Oracle, Violation};
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use lanes_core::clock::{Clock, SharedClock};
use lanes_core::config::{IngressConfig, WorkerConfig};
use lanes_core::domain::Lane;
use lanes_core::domain::{TaskId, TaskRecord, TaskRequest};
use lanes_core::embedded::{
    EmbeddedDb, EmbeddedQueue, EmbeddedQueues, EmbeddedStore, EmbeddedSummaries, QueueSettings,
};
use lanes_core::metrics::Metrics;
use lanes_core::ports::{QueueConsume, QueueSend, ReceivedMessage, TaskStore};
use lanes_core::tasks::worker::Worker;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tower::ServiceExt;

/// What a history runs.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Length of the busy phase (simulated).
    pub busy: Duration,
    /// Longest calm phase after it.
    pub calm: Duration,
    /// Clients.
    pub clients: usize,
    /// Distinct payloads they share.
    pub payloads: usize,
    /// Keep the whole trace in the report (one history's replay).
    pub full_trace: bool,
    /// Tenants' knobs: a concurrency cap in some histories, priorities on some payloads. Off, a
    /// seed replays the history it gave before they existed (what the regression seeds need).
    pub tenant_knobs: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            busy: Duration::from_secs(600),
            calm: Duration::from_secs(3600),
            clients: 5,
            payloads: 8,
            full_trace: false,
            tenant_knobs: true,
        }
    }
}

/// What one history did.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryReport {
    /// Its seed.
    pub seed: u64,
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// Invariants it gave something to check.
    pub exercised: Vec<&'static str>,
    /// Faults injected.
    pub faults: u64,
    /// Runs of tasks.
    pub runs: u32,
    /// Model calls per run, one entry per task.
    pub calls_per_run: Vec<u32>,
    /// Extra calls the simulation's breaks justify.
    pub justified_extra: u32,
    /// Completed answers that continued a lost run's saved text, and the tokens they saved.
    pub continued: (u32, u64),
    /// Simulated time it took (s).
    pub simulated_secs: u64,
    /// A digest of its trace: the same seed gives the same digest.
    pub digest: u64,
    /// The whole trace, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<Vec<String>>,
}

/// Runs the history of `seed` on a fresh single-threaded runtime with a paused clock.
pub fn run(seed: u64, options: &Options) -> HistoryReport {
    lanes_core::jitter::seed_thread(Some(seed));
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build()
    {
        Ok(r) => r,
        Err(e) => panic!("cannot build the simulation runtime: {e}"),
    };
    let report = runtime.block_on(history(seed, *options));
    runtime.shutdown_background();
    lanes_core::jitter::seed_thread(None);
    report
}

fn plan(rng: &mut rand::rngs::StdRng) -> Plan {
    let mut p = Plan::default();
    // The provider's batch port is drawn from the knobs' stream (see `history`), so its plan
    // leaves every earlier seed's draws as they were.
    for port in p.ports.iter_mut().take(5) {
        if rng.random::<f64>() < 0.6 {
            port.p_fail = rng.random_range(0.0..0.08);
            port.p_ambiguous = rng.random_range(0.0..0.04);
            port.p_slow = rng.random_range(0.0..0.3);
            port.slow_ms = rng.random_range(100..14_000);
        }
        for _ in 0..rng.random_range(0..3u32) {
            let from = rng.random_range(0..540_000u64);
            let long = if rng.random::<f64>() < 0.2 { 480_000 } else { 60_000 };
            port.outages.push((from, from + rng.random_range(2_000..long)));
            port.slow_ms = port.slow_ms.max(rng.random_range(100..14_000));
        }
    }
    if rng.random::<f64>() < 0.7 {
        p.llm = LlmPlan {
            p_throttle: rng.random_range(0.0..0.3),
            p_retryable: rng.random_range(0.0..0.2),
            p_permanent: rng.random_range(0.0..0.03),
            p_slow: rng.random_range(0.0..0.1),
        };
    }
    p.crash_per_sec = if rng.random::<f64>() < 0.6 { rng.random_range(0.0..0.01) } else { 0.0 };
    for _ in 0..rng.random_range(0..3u32) {
        p.lock_vanish_at.push(rng.random_range(0..600_000));
    }
    for _ in 0..rng.random_range(0..3u32) {
        p.cache_vanish_at.push(rng.random_range(0..600_000));
    }
    p.p_duplicate_delivery = if rng.random::<f64>() < 0.5 { rng.random_range(0.0..0.3) } else { 0.0 };
    p.max_skew_ms = rng.random_range(0..2_000);
    p
}

/// The world's fixed parts, shared by every actor.
pub(crate) struct World {
    pub(crate) chaos: Arc<Chaos>,
    queues: Arc<EmbeddedQueues>,
    pub(crate) metrics: Metrics,
    pub(crate) worker_config: WorkerConfig,
    /// The summaries (the same as `chaos.summaries`).
    pub(crate) summaries: EmbeddedSummaries,
    /// In a history with provider batches: their records (the same as `chaos.batches`) and the
    /// provider's batch endpoint.
    pub(crate) batches: Option<(lanes_core::embedded::EmbeddedBatches, Arc<lanes_core::llm::OfflineBatches>)>,
    ingress_config: IngressConfig,
    next_process: AtomicU32,
    start: tokio::time::Instant,
    /// Payload bodies, their Idempotency-Key, their task id.
    payloads: Vec<(String, Option<String>, TaskId)>,
}

impl World {
    pub(crate) fn process(&self, kind: &'static str, admin: bool) -> Ctx {
        let id = self.next_process.fetch_add(1, Ordering::Relaxed);
        let skew = self.chaos.plan.max_skew_ms;
        let skew = self.chaos.between(0, 2 * skew as u64) as i64 - skew;
        let clock = SimClock::new(self.start, skew);
        Ctx { chaos: self.chaos.clone(), proc: Process::new(id, kind, clock, admin) }
    }

    pub(crate) fn queue(&self, ctx: &Ctx, lane: Lane) -> Arc<FaultyQueue> {
        Arc::new(FaultyQueue { inner: self.lane_queue(lane), ctx: ctx.clone() })
    }

    pub(crate) fn dlq(&self, ctx: &Ctx, lane: Lane) -> Arc<FaultyQueue> {
        Arc::new(FaultyQueue { inner: self.lane_queue(lane).dead_letter_queue(), ctx: ctx.clone() })
    }

    pub(crate) fn lane_queue(&self, lane: Lane) -> EmbeddedQueue {
        self.queues.queue(lane.as_str(), &format!("{}-dlq", lane.as_str()))
    }

    fn store(&self, ctx: &Ctx) -> Arc<dyn TaskStore> {
        Arc::new(FaultyStore { inner: self.chaos.truth.clone(), ctx: ctx.clone() })
    }

    pub(crate) fn worker(&self, ctx: &Ctx) -> Worker {
        Worker {
            objects: None,
            events: None,
            store: self.store(ctx),
            lock: Arc::new(FaultyLock { ctx: ctx.clone() }),
            cache: Arc::new(FaultyCache { ctx: ctx.clone() }),
            llm: crate::faults::sim_llm(ctx),
            metrics: self.metrics.clone(),
            clock: ctx.proc.clock.clone(),
            config: self.worker_config,
            // Synthesis tasks that opt in with `deadline_s` go to the history's provider batches.
            batching: self.batching(ctx),
        }
    }

    fn ingress(&self, ctx: &Ctx) -> axum::Router {
        let queues = Lane::ALL.map(|l| self.queue(ctx, l) as Arc<dyn QueueSend>);
        let store = self.store(ctx);
        // Two requests, as on AWS: the simulation searches the interleavings between them.
        let admission = Arc::new(lanes_core::ports::PutThenSend::new(store.clone(), queues.clone()));
        lanes_core::tasks::ingress::router(lanes_core::tasks::ingress::Ingress {
            objects: None,
            events: None,
            admission,
            store,
            cache: Arc::new(FaultyCache { ctx: ctx.clone() }),
            queues,
            metrics: self.metrics.clone(),
            clock: ctx.proc.clock.clone(),
            config: self.ingress_config,
        })
    }

    /// When a process of this history should crash, if it should (from now).
    fn crash_after(&self) -> Option<Duration> {
        let rate = self.chaos.plan.crash_per_sec;
        if rate <= 0.0 {
            return None;
        }
        let u = self.chaos.chance().max(1e-9);
        Some(Duration::from_secs_f64((-u.ln() / rate).min(1e6)))
    }

    /// Crashes `ctx`'s process after its drawn time, unless the history has calmed down by then.
    pub(crate) fn arm_crash(self: &Arc<Self>, ctx: &Ctx) {
        if let Some(after) = self.crash_after() {
            let (world, ctx) = (self.clone(), ctx.clone());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                if !world.chaos.is_calm() {
                    ctx.proc.crash(&world.chaos);
                }
            });
        }
    }
}

async fn history(seed: u64, options: Options) -> HistoryReport {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let plan = plan(&mut rng);
    let start = tokio::time::Instant::now();
    let clock = SimClock::new(start, 0);
    let shared: SharedClock = clock.clone();
    let db = match EmbeddedDb::in_memory() {
        Ok(db) => db,
        Err(e) => panic!("in-memory db: {e}"),
    };
    let truth = EmbeddedStore::new(db.clone());
    let summaries = EmbeddedSummaries::new(db.clone());
    let batch_records = lanes_core::embedded::EmbeddedBatches::new(db.clone());
    // Low counts often: last deliveries (and their settling) are where waits and crashes meet.
    let max_receive_count =
        if rng.random::<bool>() { rng.random_range(2..=4) } else { rng.random_range(5..=10) };
    let settings = QueueSettings {
        default_visibility: Duration::from_secs(180),
        max_receive_count,
        ..Default::default()
    };
    let queues = match EmbeddedQueues::open(db, shared.clone(), settings).await {
        Ok(q) => q,
        Err(e) => panic!("embedded queues: {e}"),
    };
    let mut ingress_config = IngressConfig::default();
    let mut worker_config = WorkerConfig::default();
    if rng.random::<f64>() < 0.5 {
        let limits = lanes_core::domain::quota::Limits {
            daily_tokens: Some(rng.random_range(200..3_000)),
            ..Default::default()
        };
        let quota = lanes_core::config::QuotaConfig { project: limits, ..Default::default() };
        ingress_config.quota = quota;
        worker_config.quota = quota;
    }
    // Tenants' knobs from a stream of their own, so adding them left every earlier seed's history
    // (and the regression seeds' replays) as it was: a cap of one or two running tasks per group
    // and lane in some histories, and a priority on some payloads.
    let mut knobs = rand::rngs::StdRng::seed_from_u64(seed ^ 0x7e4a_11c0_ca9f_0001);
    if options.tenant_knobs && knobs.random::<f64>() < 0.3 {
        let cap = knobs.random_range(1..=2u32);
        let spec = format!("interactive={cap},synthesis={cap}");
        worker_config.quota.concurrency = lanes_core::domain::concurrency::Caps::parse(&spec)
            .unwrap_or_else(|e| panic!("a simulation cap is invalid: {e}"));
    }
    let payloads = payloads(&mut rng, options.tenant_knobs.then_some(&mut knobs), options.payloads);
    // Provider batches, from the knobs' stream too (after the payloads' draws): the commits lane at
    // tier `batch` in some histories, with a provider that runs a batch in seconds to minutes and
    // a batch port of its own faults.
    let mut plan = plan;
    let batch_turnaround = (options.tenant_knobs && knobs.random::<f64>() < 0.35).then(|| {
        let port = &mut plan.ports[crate::faults::Port::Provider as usize];
        port.p_fail = knobs.random_range(0.0..0.1);
        port.p_ambiguous = knobs.random_range(0.0..0.1);
        port.p_slow = knobs.random_range(0.0..0.3);
        port.slow_ms = knobs.random_range(100..10_000);
        Duration::from_millis(knobs.random_range(5_000..180_000))
    });
    // A provider that takes hours in a quarter of them (drawn last, so earlier seeds' histories
    // stay as they were): every batch would miss its deadline, so each is cancelled and its work
    // given back before it. The commits lane's deadline is then an hour, like the tasks', so that
    // happens inside the calm phase.
    let batch_turnaround = batch_turnaround.map(|quick| {
        if knobs.random::<f64>() < 0.25 {
            worker_config.lanes[Lane::Commits.index()].deadline = Some(Duration::from_secs(3600));
            Duration::from_millis(knobs.random_range(7_200_000..28_800_000))
        } else {
            quick
        }
    });
    if batch_turnaround.is_some() {
        worker_config.lanes[Lane::Commits.index()].tier = lanes_core::domain::tier::TierSetting::Batch;
    }
    let skew = plan.max_skew_ms as u64;
    let oracle = Oracle::new(ingress_config.enqueue_grace.as_millis() as u64, 2 * skew);
    let mut chaos = Chaos::new(seed, plan, clock, truth, summaries.clone(), oracle);
    chaos.batches = batch_turnaround.map(|_| batch_records.clone());
    chaos.receipts = Some(queues.queue("interactive", "interactive-dlq"));
    chaos.lease_ttl = worker_config.lease_ttl;
    for (body, _, id) in &payloads {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(body)
            && let Some(p) = v["prompt"].as_str()
        {
            chaos.prompts.insert(p.to_owned(), id.to_string());
        }
    }
    let chaos = Arc::new(chaos);
    let batches = batch_turnaround.map(|turnaround| {
        let model = Arc::new(crate::batches::BatchModel { chaos: chaos.clone() });
        (batch_records, Arc::new(lanes_core::llm::OfflineBatches::new(model, turnaround, "sim:batch".into())))
    });
    let world = Arc::new(World {
        chaos,
        batches,
        queues,
        metrics: Metrics::new(),
        worker_config,
        summaries,
        ingress_config,
        next_process: AtomicU32::new(0),
        start,
        payloads,
    });
    let mut actors = tokio::task::JoinSet::new();
    let ingress = Arc::new(IngressFleet::new(&world, 2));
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..options.clients {
        let (world, ingress) = (world.clone(), ingress.clone());
        let client_seed = seed.wrapping_mul(31).wrapping_add(c as u64);
        clients.spawn(client(world, ingress, client_seed, options.busy));
    }
    let consumers = rng.random_range(0..3u32);
    if consumers != 1 {
        actors.spawn(pools(world.clone()));
    }
    if consumers != 0 {
        for lane in [Lane::Interactive, Lane::Synthesis] {
            actors.spawn(mapping(world.clone(), lane));
        }
        actors.spawn(crate::commits::commits_mapping(world.clone()));
    }
    clients.spawn(crate::commits::git_host(world.clone(), seed, options.busy));
    actors.spawn(sweeper(world.clone()));
    if rng.random::<f64>() < 0.5 {
        let at = Duration::from_millis(rng.random_range(60_000..options.busy.as_millis() as u64));
        actors.spawn(redriver(world.clone(), at, rng.random::<bool>()));
    }
    actors.spawn(failovers(world.clone()));
    tokio::time::sleep(options.busy).await;
    world.chaos.calm.store(true, Ordering::Relaxed);
    world.chaos.trace(|| "---- calm: no more faults".into());
    let _ = tokio::time::timeout(options.calm, async {
        while clients.join_next().await.is_some() {}
        // Then until every accepted commit is summarized or dead-lettered.
        while crate::commits::finals(&world).await.values().any(|(done, dlq)| !done && dlq.is_none()) {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    })
    .await;
    finish(seed, &world, start, options.full_trace).await
}

async fn finish(seed: u64, world: &World, start: tokio::time::Instant, full_trace: bool) -> HistoryReport {
    let now = world.chaos.clock.now_ms();
    let mut finals = BTreeMap::new();
    for (_, _, id) in &world.payloads {
        finals.insert(id.to_string(), world.chaos.truth.get(id, now).await.ok().flatten());
    }
    let commits = crate::commits::finals(world).await;
    let mut in_dlqs = Vec::new();
    for lane in [Lane::Interactive, Lane::Synthesis] {
        in_dlqs.extend(held_in_dlq(&world.lane_queue(lane).dead_letter_queue()).await);
    }
    world.chaos.oracle(|o| {
        let calls_per_run = o.finish(&finals);
        o.finish_task_dlqs(&in_dlqs);
        o.finish_commits(&commits);
        let exercised = o.exercised.keys().copied().collect();
        let digest = o.digest();
        HistoryReport {
            seed,
            violations: o.violations.clone(),
            exercised,
            faults: o.faults,
            runs: o.runs(),
            calls_per_run,
            justified_extra: o.justified_extra(),
            continued: o.continued,
            simulated_secs: start.elapsed().as_secs(),
            digest,
            trace: full_trace.then(|| o.lines()),
        }
    })
}

/// The task messages a DLQ holds: the task, and the worker's reason when it dead-lettered the
/// message itself. Looked at, not taken.
async fn held_in_dlq(dlq: &EmbeddedQueue) -> Vec<(TaskId, Option<String>)> {
    let Ok(messages) = dlq.receive_for(1000, Some(Duration::from_secs(1))).await else { return Vec::new() };
    let mut out = Vec::new();
    for m in messages {
        let _ = dlq.change_visibility(&m.receipt, Duration::ZERO).await;
        if let Ok(t) = serde_json::from_str::<lanes_core::domain::TaskMessage>(&m.body) {
            out.push((t.task_id, m.attributes.get(lanes_core::ports::DEAD_LETTER_REASON).cloned()));
        }
    }
    out
}

fn payloads(
    rng: &mut rand::rngs::StdRng,
    mut knobs: Option<&mut rand::rngs::StdRng>,
    n: usize,
) -> Vec<(String, Option<String>, TaskId)> {
    let kinds = ["explain", "autocomplete", "refactor", "explain"];
    (0..n)
        .map(|i| {
            let kind = kinds[rng.random_range(0..kinds.len())];
            let project = format!("p{}", rng.random_range(0..2u32));
            let mut body = serde_json::json!({
                "project_id": project,
                "kind": kind,
                "prompt": format!("task {i}: what does module {i} do?"),
                "target_files": [format!("src/m{i}.rs")],
            });
            if let Some(knobs) = knobs.as_deref_mut() {
                let priority = ["normal", "high", "low"][knobs.random_range(0..3usize)];
                if priority != "normal" {
                    body["priority"] = serde_json::json!(priority);
                }
                // Some tasks can wait an hour: they are called at flex, which may be refused.
                if knobs.random::<f64>() < 0.3 {
                    body["params"] = serde_json::json!({"deadline_s": 3600});
                }
            }
            let body = body.to_string();
            let key = (rng.random::<f64>() < 0.3).then(|| format!("key-{i}"));
            let id = match TaskRequest::from_json(body.as_bytes()) {
                Ok(r) => r.task_id(key.as_deref()),
                Err(e) => panic!("a simulation payload is invalid: {e:?}"),
            };
            (body, key, id)
        })
        .collect()
}

// ---------------------------------------------------------------- ingress and clients

/// The ingress instances: a crashed one is replaced by a fresh one.
struct IngressFleet {
    slots: std::sync::Mutex<Vec<(Ctx, axum::Router)>>,
    world: Arc<World>,
}

impl IngressFleet {
    fn new(world: &Arc<World>, n: usize) -> Self {
        let slots = (0..n).map(|_| Self::instance(world)).collect();
        Self { slots: std::sync::Mutex::new(slots), world: world.clone() }
    }

    fn instance(world: &Arc<World>) -> (Ctx, axum::Router) {
        let ctx = world.process("ingress", false);
        let router = world.ingress(&ctx);
        (ctx, router)
    }

    /// An instance to send a request to (and, with the plan's odds, one that crashes under it).
    fn pick(&self) -> (Ctx, axum::Router) {
        let i = self.world.chaos.between(0, 1) as usize;
        let Ok(mut slots) = self.slots.lock() else { return Self::instance(&self.world) };
        let i = i.min(slots.len() - 1);
        if slots[i].0.proc.dead.is_cancelled() {
            slots[i] = Self::instance(&self.world);
        }
        slots[i].clone()
    }
}

/// One request as a client makes it: given up after 10 s (plus its long-poll).
async fn request(
    world: &Arc<World>,
    fleet: &IngressFleet,
    method: &str,
    uri: &str,
    body: Option<(&str, Option<&str>)>,
    wait_secs: u64,
) -> Option<(u16, serde_json::Value)> {
    let (ctx, router) = fleet.pick();
    let chaos = &world.chaos;
    if !chaos.is_calm() && chaos.chance() < chaos.plan.crash_per_sec * 5.0 {
        let (proc, chaos2) = (ctx.proc.clone(), chaos.clone());
        let after = chaos.between(0, 300);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            proc.crash(&chaos2);
        });
    }
    let mut req = Request::builder().method(method).uri(uri);
    let body = match body {
        Some((b, key)) => {
            req = req.header("content-type", "application/json");
            if let Some(k) = key {
                req = req.header("idempotency-key", k);
            }
            Body::from(b.to_owned())
        }
        None => Body::empty(),
    };
    let req = req.body(body).ok()?;
    let answer = async {
        let resp = router.oneshot(req).await.ok()?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        Some((status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)))
    };
    tokio::time::timeout(Duration::from_secs(10 + wait_secs), answer).await.ok().flatten()
}

/// A client: submits payloads from the shared set (so clients duplicate each other), polls,
/// long-polls, re-posts, cancels and resubmits during the busy phase; then polls every task it
/// was answered for until it ends.
async fn client(world: Arc<World>, fleet: Arc<IngressFleet>, seed: u64, busy: Duration) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let until = tokio::time::Instant::now() + busy;
    let mut mine: Vec<usize> = Vec::new();
    while tokio::time::Instant::now() < until {
        let i = rng.random_range(0..world.payloads.len());
        post(&world, &fleet, i).await;
        if !mine.contains(&i) {
            mine.push(i);
        }
        for _ in 0..rng.random_range(1..7u32) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(200..8_000))).await;
            match rng.random_range(0..10u32) {
                0..=3 => {
                    get(&world, &fleet, i, 0).await;
                }
                4..=5 => {
                    get(&world, &fleet, i, rng.random_range(1..=20)).await;
                }
                6..=7 => post(&world, &fleet, i).await,
                8 => cancel(&world, &fleet, i).await,
                _ => {
                    let j = rng.random_range(0..world.payloads.len());
                    get(&world, &fleet, j, 0).await;
                }
            }
        }
    }
    // Settle: every task this client saw must end (one that was never created reads missing: a
    // client polling it for good would never reach the next).
    for i in mine {
        loop {
            match get(&world, &fleet, i, 20).await {
                Some(true) => break,
                _ => tokio::time::sleep(Duration::from_secs(5)).await,
            }
        }
    }
}

async fn post(world: &Arc<World>, fleet: &IngressFleet, i: usize) {
    let (body, key, id) = &world.payloads[i];
    let Some((code, v)) = request(world, fleet, "POST", "/v1/tasks", Some((body, key.as_deref())), 0).await
    else {
        world.chaos.trace(|| format!("client POST {} -> no answer", short(id)));
        return;
    };
    world.chaos.trace(|| format!("client POST {} -> {code}", short(id)));
    let named = v["task_id"].as_str().map(str::to_owned);
    let stored = world.chaos.truth.get(id, world.chaos.clock.now_ms()).await.ok().flatten();
    world.chaos.oracle(|o| {
        o.duplicate_answer(id, code, named.as_deref(), stored.as_ref());
        if code == 200 || code == 202 {
            o.answered(id);
        }
    });
}

/// A GET (long-poll with `wait`); `Some(true)` once there is nothing left to wait for: the task is
/// terminal, or it reads missing (the oracle judges whether it may: only an id never answered may).
async fn get(world: &Arc<World>, fleet: &IngressFleet, i: usize, wait: u64) -> Option<bool> {
    let id = &world.payloads[i].2;
    let uri = if wait > 0 { format!("/v1/tasks/{id}?wait={wait}") } else { format!("/v1/tasks/{id}") };
    let (code, v) = request(world, fleet, "GET", &uri, None, wait).await?;
    world
        .chaos
        .trace(|| format!("client GET {} -> {code} {}", short(id), v["status"].as_str().unwrap_or("")));
    match code {
        200 | 202 => {
            world.chaos.oracle(|o| o.answered(id));
            Some(code == 200)
        }
        404 => {
            world.chaos.oracle(|o| o.read_missing(id));
            Some(true)
        }
        _ => Some(false),
    }
}

async fn cancel(world: &Arc<World>, fleet: &IngressFleet, i: usize) {
    let id = &world.payloads[i].2;
    let Some((code, _)) = request(world, fleet, "DELETE", &format!("/v1/tasks/{id}"), None, 0).await else {
        return;
    };
    world.chaos.trace(|| format!("client DELETE {} -> {code}", short(id)));
}

// ---------------------------------------------------------------- workers

/// The local pool, as `lanes dev` runs it: restarted a while after each crash.
async fn pools(world: Arc<World>) {
    loop {
        let ctx = world.process("pool", false);
        let queues: Vec<(Lane, Arc<dyn QueueConsume>)> =
            Lane::ALL.into_iter().map(|l| (l, world.queue(&ctx, l) as Arc<dyn QueueConsume>)).collect();
        let pool = lanes_core::pool::Pool::new(
            4,
            [0.7, 0.15, 0.15],
            queues,
            world.worker(&ctx),
            Duration::from_millis(250),
        )
        .with_commits(world.commits_worker(&ctx));
        world.arm_crash(&ctx);
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::select! {
            biased;
            _ = pool.run(stop.clone()) => {}
            _ = ctx.proc.dead.cancelled() => {}
        }
        tokio::time::sleep(Duration::from_millis(world.chaos.between(1_000, 20_000))).await;
    }
}

/// Lambda's event source mapping for `lane`: receives batches with the queue's visibility, invokes
/// the function (a fresh process, up to two at once), deletes what it did not report as failed.
async fn mapping(world: Arc<World>, lane: Lane) {
    let sqs = world.process("sqs-mapping", false);
    let queue = world.queue(&sqs, lane);
    let slots = Arc::new(tokio::sync::Semaphore::new(2));
    let batch = if lane == Lane::Interactive { 10 } else { 1 };
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let got = match queue.receive_for(batch, None).await {
            Ok(g) if !g.is_empty() => g,
            _ => {
                drop(slot);
                tokio::time::sleep(Duration::from_millis(1_000)).await;
                continue;
            }
        };
        let (world, queue) = (world.clone(), queue.clone());
        tokio::spawn(async move {
            invoke(&world, lane, &queue, got).await;
            drop(slot);
        });
    }
}

pub(crate) fn to_sqs(m: &ReceivedMessage) -> aws_lambda_events::event::sqs::SqsMessage {
    let mut r = aws_lambda_events::event::sqs::SqsMessage::default();
    r.message_id = Some(m.message_id.to_string());
    r.receipt_handle = Some(m.receipt.clone());
    r.body = Some(m.body.clone());
    r.attributes.insert("ApproximateReceiveCount".into(), m.receive_count.to_string());
    r.attributes.insert("SentTimestamp".into(), m.sent_at_ms.to_string());
    for (k, v) in &m.attributes {
        let mut a = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
        a.string_value = Some(v.clone());
        a.data_type = Some("String".into());
        r.message_attributes.insert(k.clone(), a);
    }
    r
}

async fn invoke(world: &Arc<World>, lane: Lane, mapping_queue: &FaultyQueue, got: Vec<ReceivedMessage>) {
    let ctx = world.process("lambda", false);
    ctx.hold(&got);
    world.arm_crash(&ctx);
    let worker = world.worker(&ctx);
    let queue: Arc<dyn QueueConsume> = world.queue(&ctx, lane);
    let records: Vec<_> = got.iter().map(to_sqs).collect();
    let timeout = if lane == Lane::Interactive { Duration::from_secs(60) } else { Duration::from_secs(900) };
    let budget = timeout - Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let run = lanes_core::lambda::handle_batch(&worker, &queue, lane, &records, budget, 3);
    match tokio::time::timeout(timeout, run).await {
        Ok(response) => {
            if started.elapsed() >= budget {
                world.justify_in_hand(&ctx, "invocation deadline");
            }
            let failed: Vec<String> =
                response.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
            for m in got.iter().filter(|m| !failed.iter().any(|f| *f == m.message_id.as_str())) {
                let _ = mapping_queue.delete(&m.receipt).await;
            }
        }
        Err(_) => {
            // Killed by Lambda (or crashed): the mapping deletes nothing.
            world.justify_in_hand(&ctx, "invocation killed");
            ctx.proc.crash(&world.chaos);
        }
    }
}

impl World {
    /// The simulation broke the runs whose model calls `ctx` has in hand.
    pub(crate) fn justify_in_hand(&self, ctx: &Ctx, why: &str) {
        let held: Vec<String> =
            ctx.proc.in_hand.lock().map(|h| h.iter().cloned().collect()).unwrap_or_default();
        self.chaos.oracle(|o| held.iter().for_each(|t| o.justify(t, why)));
    }
}

// ---------------------------------------------------------------- admin

/// The controller's DLQ sweep, every minute, both task lanes.
async fn sweeper(world: Arc<World>) {
    let ctx = world.process("controller", true);
    loop {
        tokio::time::sleep(Duration::from_secs(60)).await;
        crate::commits::sweep_commits(&world, &ctx).await;
        crate::batches::collect(&world, &ctx).await;
        for lane in [Lane::Interactive, Lane::Synthesis] {
            let (dlq, store, lane_queue) =
                (world.dlq(&ctx, lane), world.store(&ctx), world.queue(&ctx, lane));
            let lock = FaultyLock { ctx: ctx.clone() };
            let clock = ctx.proc.clock.clone();
            let sweep = lanes_core::dlq::Sweep {
                lane,
                dlq: &*dlq,
                store: &*store,
                lock: Some(&lock),
                lane_queue: Some(&*lane_queue),
                metrics: &world.metrics,
                clock: &clock,
                ttl_secs: world.worker_config.record_ttl_secs,
            };
            let r = sweep.run(100).await;
            if let Ok(r) = r
                && r.seen > 0
            {
                world.chaos.trace(|| {
                    format!("sweep {}: {} seen, {} failed", lane.as_str(), r.seen, r.marked_failed)
                });
            }
        }
    }
}

/// An operator's `lanes dlq redrive` (by relay, or by the queue's move task) at `at`, both lanes.
async fn redriver(world: Arc<World>, at: Duration, by_move: bool) {
    tokio::time::sleep(at).await;
    let ctx = world.process("lanes-dlq", true);
    for lane in [Lane::Interactive, Lane::Synthesis] {
        let (dlq, queue, store) = (world.dlq(&ctx, lane), world.queue(&ctx, lane), world.store(&ctx));
        let clock = ctx.proc.clock.clone();
        let ttl = world.ingress_config.pending_ttl_secs;
        let r = if by_move {
            lanes_core::dlq::redrive_by_move(&*dlq, &*queue, &*store, &clock, ttl, 1000).await
        } else {
            lanes_core::dlq::redrive(&*dlq, &*queue, &*store, &clock, ttl, 1000).await
        };
        world
            .chaos
            .trace(|| format!("redrive {} (move: {by_move}) -> {:?}", lane.as_str(), r.map(|r| r.redriven)));
    }
    crate::commits::redrive_commits(&world, &ctx, by_move).await;
}

/// The plan's failovers: lock keys and cache entries that vanish.
async fn failovers(world: Arc<World>) {
    let mut events: Vec<(u64, bool)> = world.chaos.plan.lock_vanish_at.iter().map(|t| (*t, true)).collect();
    events.extend(world.chaos.plan.cache_vanish_at.iter().map(|t| (*t, false)));
    events.sort();
    let shared: SharedClock = world.chaos.clock.clone();
    for (at, lock) in events {
        let now = world.chaos.now();
        tokio::time::sleep(Duration::from_millis(at.saturating_sub(now))).await;
        if lock {
            if let Ok(mut l) = world.chaos.lock.lock() {
                *l = Arc::new(lanes_core::embedded::MemoryLock::new(shared.clone()));
            }
            let open: Vec<TaskRecord> =
                world.chaos.truth.all(world.chaos.clock.now_ms()).await.unwrap_or_default();
            world.chaos.oracle(|o| {
                for r in open.iter().filter(|r| !r.status.is_terminal()) {
                    o.justify(&r.task_id, "lock keys vanished");
                }
                o.justify_open_commits("lock keys vanished");
            });
            world.chaos.trace(|| "LOCK KEYS VANISH".into());
        } else {
            if let Ok(mut c) = world.chaos.cache.lock() {
                *c = Arc::new(lanes_core::embedded::MemoryCache::new(shared.clone()));
            }
            world.chaos.trace(|| "CACHE ENTRIES VANISH".into());
        }
    }
}
