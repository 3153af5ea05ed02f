//! The commits flow in a history: a Git host whose pushes (to two GitHub repositories and a GitLab
//! project; sharing commits, replayed, redelivered after an error or no answer) go through the real
//! webhook router (`commits::webhook`), signed or tokened as each provider does; commits
//! workers on the local pool and on Lambda's mapping (`lambda::handle_commit_batch`); the
//! summaries and the diff source behind fault injectors; the commits DLQ swept and redriven
//! (`commits::dead_letters`). What it checks (I6, and I5 for commits): docs/ARCHITECTURE.md,
//! Lifecycle simulation.

use crate::faults::*;
use crate::history::World;
use async_trait::async_trait;
use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use lanes_core::commits::webhook::{Webhook, WebhookConfig, github_signature};
use lanes_core::commits::worker::CommitsWorker;
use lanes_core::domain::commit::{CommitMessage, CommitSummary, PushRange};
use lanes_core::domain::{Lane, RepoId, Sha};
use lanes_core::embedded::EmbeddedSummaries;
use lanes_core::ports::*;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

/// The webhook secret the host signs with (GitHub) or sends as its token (GitLab).
const SECRET: &str = "sim-webhook-secret";

/// The repositories pushed to: two on GitHub, one project on GitLab.
const REPOS: [(Provider, u64); 3] =
    [(Provider::Github, 101), (Provider::Github, 102), (Provider::Gitlab, 201)];

/// The two providers' webhooks.
#[derive(Clone, Copy)]
enum Provider {
    Github,
    Gitlab,
}

// ---------------------------------------------------------------- summaries

impl FaultySummaries {
    /// A write of `summary` failed as its writer saw it (before or after it took effect). The
    /// [`ASKS`]th in a row by one delivery is the store failing the worker's every try: its paid
    /// answer is put off and may be paid again (justified), unless one of the tries took effect, so
    /// that the next delivery finds the summary written.
    async fn failed_try(&self, summary: &CommitSummary) {
        let gave_up = self.ctx.chaos.summary_tries.gave_up(&summary.sha, true);
        if !gave_up {
            return;
        }
        let keys = [(summary.repo_id.clone(), summary.sha.clone())];
        let stored = self.inner.get_summaries(&keys).await.is_ok_and(|v| !v.is_empty());
        if !stored {
            let sha = summary.sha.to_string();
            self.ctx.chaos.oracle(|o| o.justify(&sha, "summary writes failed on every try"));
        }
    }
}

/// The summaries store (and the webhook's delivery markers) behind the store's faults.
pub struct FaultySummaries {
    /// The twin.
    pub inner: EmbeddedSummaries,
    /// Chaos and process.
    pub ctx: Ctx,
}

#[async_trait]
impl SummaryStore for FaultySummaries {
    async fn get_summaries(&self, keys: &[(RepoId, Sha)]) -> Result<Vec<CommitSummary>, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "get_summaries", "").await?;
        let r = self.inner.get_summaries(keys).await;
        self.ctx.post(d, "get_summaries", "", r).await
    }
    async fn put_summary(&self, summary: &CommitSummary) -> Result<WriteOnce, StoreError> {
        let sha = summary.sha.clone();
        let d = match self.ctx.pre::<StoreError>(Port::Store, "put_summary", &sha).await {
            Ok(d) => d,
            Err(e) => {
                self.failed_try(summary).await;
                return Err(e);
            }
        };
        let r = self.inner.put_summary(summary).await;
        // The answer is out of hand once written (a crash before this point loses it, as a task's).
        self.ctx.release_hand(&sha);
        if let Ok(WriteOnce::Written) = r {
            self.ctx.chaos.oracle(|o| o.summary_written(&sha));
            self.ctx.note(|| format!("put_summary {} -> Written", short(&sha)));
        }
        // A lost answer is a failure to the worker, which asks again and then reads `Exists`.
        if d.fail == Some(true) {
            self.failed_try(summary).await;
        } else {
            self.ctx.chaos.summary_tries.gave_up(&sha, false);
        }
        self.ctx.post(d, "put_summary", &sha, r).await
    }
    async fn list_summaries(
        &self,
        repo_id: &RepoId,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<SummaryPage, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "list_summaries", "").await?;
        let r = self.inner.list_summaries(repo_id, limit, cursor).await;
        self.ctx.post(d, "list_summaries", "", r).await
    }
    async fn mark_delivery(&self, delivery: &str, now_ms: u64, ttl_secs: u64) -> Result<bool, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "mark_delivery", delivery).await?;
        let r = self.inner.mark_delivery(delivery, now_ms, ttl_secs).await;
        self.ctx.post(d, "mark_delivery", delivery, r).await
    }
    async fn delivery_seen(&self, delivery: &str, now_ms: u64) -> Result<bool, StoreError> {
        let d = self.ctx.pre::<StoreError>(Port::Store, "delivery_seen", delivery).await?;
        let r = self.inner.delivery_seen(delivery, now_ms).await;
        self.ctx.post(d, "delivery_seen", delivery, r).await
    }
    async fn count_pushed(
        &self,
        scope: &lanes_core::domain::commit::PushScope,
        day: u64,
        commits: i64,
        limit: u64,
    ) -> Result<bool, StoreError> {
        let key = scope.to_string();
        let d = self.ctx.pre::<StoreError>(Port::Store, "count_pushed", &key).await?;
        let r = self.inner.count_pushed(scope, day, commits, limit).await;
        self.ctx.post(d, "count_pushed", &key, r).await
    }
}

// ---------------------------------------------------------------- diffs

/// The host's diff API: latency, and the Git port's faults as retryable errors.
pub struct SimDiffs {
    /// Chaos and process.
    pub ctx: Ctx,
}

#[async_trait]
impl DiffSource for SimDiffs {
    async fn diff(&self, commit: &CommitMessage) -> Result<String, DiffError> {
        let d = self.ctx.pre::<DiffError>(Port::Git, "diff", &commit.sha).await?;
        let n = &commit.sha[..6];
        let diff = format!(
            "diff --git a/src/m{n}.rs b/src/m{n}.rs\n--- a/src/m{n}.rs\n+++ b/src/m{n}.rs\n@@ -0,0 +1,2 @@\n+pub fn f{n}() {{}}\n+// {}\n",
            commit.subject
        );
        self.ctx.post(d, "diff", &commit.sha, Ok(diff)).await
    }
    async fn commits_between(&self, _range: &PushRange) -> Result<Vec<CommitMessage>, DiffError> {
        Err(DiffError::Permanent("the simulated host sends complete pushes only".into()))
    }
}

// ---------------------------------------------------------------- the world's commit parts

impl World {
    pub(crate) fn summaries(&self, ctx: &Ctx) -> Arc<dyn SummaryStore> {
        Arc::new(FaultySummaries { inner: self.summaries.clone(), ctx: ctx.clone() })
    }

    pub(crate) fn commits_worker(&self, ctx: &Ctx) -> CommitsWorker {
        CommitsWorker {
            summaries: self.summaries(ctx),
            cache: Arc::new(FaultyCache { ctx: ctx.clone() }),
            lock: Arc::new(FaultyLock { ctx: ctx.clone() }),
            llm: crate::faults::sim_llm(ctx),
            diffs: Arc::new(SimDiffs { ctx: ctx.clone() }),
            send: self.queue(ctx, Lane::Commits),
            metrics: self.metrics.clone(),
            clock: ctx.proc.clock.clone(),
            lease: self.worker_config,
            config: Default::default(),
            batching: self.batching(ctx),
        }
    }

    fn webhook(&self, ctx: &Ctx) -> axum::Router {
        let config = WebhookConfig {
            github_secret: Some(lanes_core::secret::Secret::fixed(SECRET)),
            gitlab_token: Some(lanes_core::secret::Secret::fixed(SECRET)),
            ..Default::default()
        };
        lanes_core::commits::webhook::router(Webhook {
            queue: self.queue(ctx, Lane::Commits),
            store: self.summaries(ctx),
            metrics: self.metrics.clone(),
            clock: ctx.proc.clock.clone(),
            config,
        })
    }
}

// ---------------------------------------------------------------- the Git host

/// A commit's sha in the history: repository `repo`, `n`th commit.
fn sha(seed: u64, repo: u64, n: usize) -> String {
    let h = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (repo << 32) ^ n as u64;
    format!("{:016x}{:08x}{:016x}", h.wrapping_mul(0x2545_f491_4f6c_dd1d), repo as u32, n as u64)
}

/// A push payload in the provider's documented shape (GitHub's `push` event, GitLab's Push Hook).
fn push_body(provider: Provider, repo: u64, shas: &[String]) -> String {
    let commits: Vec<serde_json::Value> = shas
        .iter()
        .map(|s| {
            serde_json::json!({"id": s, "distinct": true, "message": format!("change {}", &s[..8]),
                "timestamp": "2026-11-30T10:00:00Z"})
        })
        .collect();
    let (before, after) = ("1".repeat(40), shas.last().cloned().unwrap_or_default());
    match provider {
        Provider::Github => serde_json::json!({"ref": "refs/heads/main", "before": before, "after": after,
            "deleted": false,
            "repository": {"id": repo, "full_name": format!("org/r{repo}"), "default_branch": "main"},
            "commits": commits}),
        Provider::Gitlab => serde_json::json!({"object_kind": "push", "event_name": "push",
            "ref": "refs/heads/main", "before": before, "after": after, "total_commits_count": shas.len(),
            "project": {"id": repo, "path_with_namespace": format!("group/sub/r{repo}"), "default_branch": "main"},
            "commits": commits}),
    }
    .to_string()
}

/// One delivery.
struct Delivery {
    provider: Provider,
    id: String,
    body: String,
    shas: Vec<String>,
    accepted: bool,
}

/// The Git host: pushes to three repositories (some re-listing commits an earlier push had, as a
/// force-push or a second branch does), replays of delivered ones, and redelivery of every delivery
/// not answered with a 2xx, until each is accepted.
pub(crate) async fn git_host(world: Arc<World>, seed: u64, busy: Duration) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x617_4057);
    let until = tokio::time::Instant::now() + busy;
    let mut heads = [0usize; REPOS.len()];
    let mut deliveries: Vec<Delivery> = Vec::new();
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..25_000))).await;
        let roll = rng.random_range(0..10u32);
        if roll < 6 || deliveries.is_empty() {
            let r = rng.random_range(0..REPOS.len());
            let back = if rng.random_range(0..4u32) == 0 { rng.random_range(1..=3usize) } else { 0 };
            let from = heads[r].saturating_sub(back);
            heads[r] += rng.random_range(1..=4usize);
            let (provider, repo) = REPOS[r];
            let shas: Vec<String> = (from..heads[r]).map(|n| sha(seed, repo, n)).collect();
            let body = push_body(provider, repo, &shas);
            world.chaos.oracle(|o| shas.iter().for_each(|s| o.commit_pushed(s)));
            let id = format!("d-{}", deliveries.len());
            deliveries.push(Delivery { provider, id, body, shas, accepted: false });
            let i = deliveries.len() - 1;
            deliver(&world, &mut deliveries[i]).await;
        } else if roll < 8 {
            let i = rng.random_range(0..deliveries.len());
            deliver(&world, &mut deliveries[i]).await;
        } else {
            for d in deliveries.iter_mut().filter(|d| !d.accepted) {
                deliver(&world, d).await;
            }
        }
    }
    // Calm: every delivery gets through in the end.
    while deliveries.iter().any(|d| !d.accepted) {
        for d in deliveries.iter_mut().filter(|d| !d.accepted) {
            deliver(&world, d).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// POSTs one delivery to a fresh webhook instance (which may crash under it); a 202 `accepted` or
/// a 200 `duplicate` (a replay of one accepted before) means the host is done with it.
async fn deliver(world: &Arc<World>, d: &mut Delivery) {
    let ctx = world.process("webhook", false);
    let chaos = &world.chaos;
    if !chaos.is_calm() && chaos.chance() < chaos.plan.crash_per_sec * 5.0 {
        let (proc, chaos2) = (ctx.proc.clone(), chaos.clone());
        let after = chaos.between(0, 300);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            proc.crash(&chaos2);
        });
    }
    let request = Request::builder().method("POST").header("content-type", "application/json");
    let request = match d.provider {
        Provider::Github => request
            .uri("/webhooks/github")
            .header("x-github-event", "push")
            .header("x-github-delivery", &d.id)
            .header("x-hub-signature-256", github_signature(SECRET.as_bytes(), d.body.as_bytes())),
        Provider::Gitlab => request
            .uri("/webhooks/gitlab")
            .header("x-gitlab-event", "Push Hook")
            .header("x-gitlab-event-uuid", &d.id)
            .header("x-gitlab-token", SECRET),
    };
    let Ok(req) = request.body(Body::from(d.body.clone())) else {
        return;
    };
    let router = world.webhook(&ctx);
    let answer = async {
        let resp = router.oneshot(req).await.ok()?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        Some((status, v["status"].as_str().unwrap_or("").to_owned()))
    };
    // GitHub gives a delivery 10 s (GitLab's default is the same).
    let got = tokio::time::timeout(Duration::from_secs(10), answer).await.ok().flatten();
    let id = d.id.clone();
    let via = match d.provider {
        Provider::Github => "github",
        Provider::Gitlab => "gitlab",
    };
    chaos.trace(|| format!("host delivery {id} ({} commits, {via}) -> {got:?}", d.shas.len()));
    if let Some((code, status)) = got
        && ((code == 202 && status == "accepted") || (code == 200 && status == "duplicate"))
    {
        d.accepted = true;
        chaos.oracle(|o| d.shas.iter().for_each(|s| o.commit_accepted(s)));
    }
}

// ---------------------------------------------------------------- workers

/// Lambda's mapping for the commits lane: batches of up to 100, one invocation at a time per slot.
pub(crate) async fn commits_mapping(world: Arc<World>) {
    let sqs = world.process("sqs-mapping", false);
    let queue = world.queue(&sqs, Lane::Commits);
    let slots = Arc::new(tokio::sync::Semaphore::new(2));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let got = match queue.receive_for(100, None).await {
            Ok(g) if !g.is_empty() => g,
            _ => {
                drop(slot);
                tokio::time::sleep(Duration::from_millis(2_000)).await;
                continue;
            }
        };
        let (world, queue) = (world.clone(), queue.clone());
        tokio::spawn(async move {
            invoke(&world, &queue, got).await;
            drop(slot);
        });
    }
}

async fn invoke(world: &Arc<World>, mapping_queue: &FaultyQueue, got: Vec<ReceivedMessage>) {
    let ctx = world.process("lambda", false);
    ctx.hold(&got);
    world.arm_crash(&ctx);
    let worker = world.commits_worker(&ctx);
    let queue: Arc<dyn QueueConsume> = world.queue(&ctx, Lane::Commits);
    let records: Vec<_> = got.iter().map(crate::history::to_sqs).collect();
    let timeout = Duration::from_secs(300);
    let budget = timeout - Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let run = lanes_core::lambda::handle_commit_batch(&worker, &queue, &records, budget);
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
            world.justify_in_hand(&ctx, "invocation killed");
            ctx.proc.crash(&world.chaos);
        }
    }
}

/// The controller's sweep of the commits DLQ.
pub(crate) async fn sweep_commits(world: &World, ctx: &Ctx) {
    let dlq = world.dlq(ctx, Lane::Commits);
    let summaries = world.summaries(ctx);
    let sweep = lanes_core::commits::dead_letters::CommitsDlq { dlq: &*dlq, summaries: &*summaries };
    if let Ok(r) = sweep.sweep(100).await
        && r.seen > 0
    {
        world.chaos.trace(|| format!("sweep commits: {} seen, {} settled", r.seen, r.settled));
    }
}

/// `lanes dlq redrive --lane commits`.
pub(crate) async fn redrive_commits(world: &World, ctx: &Ctx, by_move: bool) {
    let (dlq, queue, summaries) =
        (world.dlq(ctx, Lane::Commits), world.queue(ctx, Lane::Commits), world.summaries(ctx));
    let ops = lanes_core::commits::dead_letters::CommitsDlq { dlq: &*dlq, summaries: &*summaries };
    let r = if by_move { ops.redrive_by_move(&*queue, 1000).await } else { ops.redrive(&*queue, 1000).await };
    world.chaos.trace(|| format!("redrive commits (move: {by_move}) -> {:?}", r.map(|r| r.redriven)));
}

/// What became of every commit at the end: summarized, and the DLQ's reason for those it holds
/// (`None` inside: moved there by the queue's own redrive).
pub(crate) async fn finals(world: &World) -> BTreeMap<String, (bool, Option<Option<String>>)> {
    let mut out = BTreeMap::new();
    let dlq = world.lane_queue(Lane::Commits).dead_letter_queue();
    let mut in_dlq: BTreeMap<String, Option<String>> = BTreeMap::new();
    if let Ok(messages) = dlq.receive_for(1000, Some(Duration::from_secs(1))).await {
        for m in messages {
            // Looked at, not taken: visible again at once for the next look.
            let _ = dlq.change_visibility(&m.receipt, Duration::ZERO).await;
            if let Ok(c) = serde_json::from_str::<CommitMessage>(&m.body) {
                in_dlq.insert(c.sha.into(), m.attributes.get(DEAD_LETTER_REASON).cloned());
            }
        }
    }
    let accepted: Vec<String> = world.chaos.oracle(|o| o.accepted_commits());
    for sha in accepted {
        // The repository's id is the sha's middle eight hex digits (see `sha`).
        let number = u64::from_str_radix(&sha[16..24], 16).unwrap_or(0);
        let host = match REPOS.iter().find(|(_, n)| *n == number) {
            Some((Provider::Gitlab, _)) => "gitlab",
            _ => "github",
        };
        let key = (RepoId::parse(&format!("{host}:{number}")), Sha::parse(&sha));
        let found = match key {
            (Ok(repo), Ok(commit)) => {
                world.summaries.get_summaries(&[(repo, commit)]).await.map(|v| !v.is_empty())
            }
            _ => Ok(false),
        };
        out.insert(sha.clone(), (found.unwrap_or(false), in_dlq.get(&sha).cloned()));
    }
    out
}
