//! The token half of `lanes bench fairness`: two tenants with backlogs on one interactive lane, whose
//! tasks take the same time but one tenant's report ten times the tokens. Counting tasks, the fair
//! queue gives each half the tasks, so the large tenant takes about ten elevenths of the tokens;
//! counting tokens ([`lanes_core::domain::token_share`]), each should get about half the tokens and
//! the small tenant about ten times the tasks. Every run goes through the real pool, embedded queue,
//! store and worker, with the token shares off, on in the embedded cache, and on in a real
//! `redis-server` (the Lua script the Lambda workers run), when one is installed.

use lanes_core::clock::{SharedClock, SystemClock};
use lanes_core::config::WorkerConfig;
use lanes_core::domain::fairness::{GROUP_ATTRIBUTE, task_group};
use lanes_core::domain::token_share::{ShareSettings, Step};
use lanes_core::domain::{Lane, TaskId, TaskMessage, TaskRecord, TaskRequest, Tenant};
use lanes_core::ports::{QueueConsume, TaskStore};
use lanes_core::tasks::share::{share_ask, share_key};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Tokens a small task reports; a large one reports [`LARGE_FACTOR`] times as many. Each task's
/// prompt and `max_tokens` are sized so that its estimate (prompt / 4 + 200 + `max_tokens`) is what
/// it reports: the run measures the policy, not how far an estimate is from the usage (which the
/// correction after each answer takes care of, one task late).
const SMALL_TOKENS: u64 = 300;
/// How many times larger the large tenant's tasks are, in tokens.
const LARGE_FACTOR: u64 = 10;

/// One run with the token shares on or off.
#[derive(Debug, Clone, Serialize)]
pub struct TokenRun {
    /// Whether token-weighted fairness was on.
    pub token_fairness: bool,
    /// Where the shares were kept: `embedded` (the in-process twin) or `redis` (redis-server).
    pub cache: String,
    /// Tasks started while both tenants had a backlog: small, large.
    pub tasks: [u64; 2],
    /// Their tokens: small, large.
    pub tokens: [u64; 2],
    /// The large tenant's share of the tokens (equal is 0.5).
    pub large_token_share: f64,
    /// The large tenant's share of the tasks.
    pub large_task_share: f64,
    /// Tasks put off for fairness.
    pub put_offs: u64,
}

/// The runs: `slots` workers, `backlog` tasks per tenant queued when the pool starts, each task
/// one workload second (`scale_ms` real ms). The Redis run is left out, and said so on stderr,
/// where `redis-server` is not installed.
pub async fn token_runs(slots: usize, backlog: usize, scale_ms: u64) -> Result<Vec<TokenRun>, String> {
    let mut out = Vec::new();
    for on in [false, true] {
        out.push(one_run(on, None, slots, backlog, scale_ms).await?);
    }
    if lanes_tests::services_available() {
        let server = lanes_tests::RedisServer::start();
        out.push(one_run(true, Some(&server.url()), slots, backlog, scale_ms).await?);
    } else {
        eprintln!(
            "token fairness on Redis skipped: redis-server is missing (scripts/test-deps.sh installs it)"
        );
    }
    Ok(out)
}

async fn one_run(
    on: bool,
    redis: Option<&str>,
    slots: usize,
    backlog: usize,
    scale_ms: u64,
) -> Result<TokenRun, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let dir = crate::temp_dir().map_err(|e| err(&e))?;
    let clock: SharedClock = Arc::new(SystemClock);
    let (mut adapters, queues) =
        lanes_core::wiring::embedded(&dir, Default::default(), clock.clone()).await.map_err(|e| err(&e))?;
    if let Some(url) = redis {
        use lanes_core::adapters::redis::{RedisCache, RedisSettings, connect};
        let settings = RedisSettings {
            url: url.to_owned(),
            cluster: false,
            prefix: format!("bench-{}:", uuid::Uuid::new_v4()),
            timeout: Duration::from_secs(2),
            ca_pem: None,
            auth: None,
        };
        let conn = connect(&settings).await.map_err(|e| err(&e))?;
        adapters.cache = Arc::new(RedisCache::new(conn, &settings.prefix));
    }
    let mut config = WorkerConfig::default();
    config.quota.share.on = on;
    config.quota.share.settings = scaled_share(scale_ms);
    let metrics = lanes_core::metrics::Metrics::new();
    let worker = adapters.task_worker(Arc::new(crate::SleepLlm), metrics.clone(), clock.clone(), config);
    let mut ids: Vec<(TaskId, usize)> = Vec::new();
    for i in 0..backlog {
        for tenant in 0..2 {
            let tokens = SMALL_TOKENS * if tenant == 1 { LARGE_FACTOR } else { 1 };
            let name = if tenant == 1 { "large" } else { "small" };
            let req = request(name, i, scale_ms, tokens)?;
            let id = submit(&*adapters.store, &adapters, &config, req, &clock).await?;
            ids.push((id, tenant));
        }
    }
    let consumers: Vec<(Lane, Arc<dyn QueueConsume>)> =
        vec![(Lane::Interactive, adapters.consume[0].clone())];
    let pool =
        lanes_core::pool::Pool::new(slots, [1.0, 0.0, 0.0], consumers, worker, Duration::from_millis(2))
            .with_idle_grace(Duration::from_millis(10 * scale_ms));
    let pool = crate::RunningPool::start(pool);
    crate::drain(&queues[..1], Duration::from_secs(600)).await?;
    pool.stop().await;
    let mut started: Vec<(u64, usize, u64)> = Vec::new();
    for (id, tenant) in &ids {
        if let Some(r) = adapters.store.get(id, clock.now_ms()).await.map_err(|e| err(&e))?
            && let (Some(s), Some(result)) = (r.started_at_ms, r.result.as_ref())
        {
            started.push((s, *tenant, result.tokens.prompt + result.tokens.completion));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let put_offs = metrics.waits_total.with_label_values(&["interactive", "fairness"]).get();
    Ok(summarize(on, if redis.is_some() { "redis" } else { "embedded" }, &started, put_offs))
}

/// The figures over the span in which both tenants still had tasks to start: up to the earlier of
/// their last starts.
fn summarize(on: bool, cache: &str, started: &[(u64, usize, u64)], put_offs: u64) -> TokenRun {
    let last = |t: usize| started.iter().filter(|s| s.1 == t).map(|s| s.0).max().unwrap_or(0);
    let until = last(0).min(last(1));
    let (mut tasks, mut tokens) = ([0u64; 2], [0u64; 2]);
    for &(_, tenant, used) in started.iter().filter(|s| s.0 <= until) {
        tasks[tenant] += 1;
        tokens[tenant] += used;
    }
    let share = |v: [u64; 2]| v[1] as f64 / (v[0] + v[1]).max(1) as f64;
    TokenRun {
        token_fairness: on,
        cache: cache.to_owned(),
        tasks,
        tokens,
        large_token_share: share(tokens),
        large_task_share: share(tasks),
        put_offs,
    }
}

fn request(tenant: &str, i: usize, scale_ms: u64, tokens: u64) -> Result<TaskRequest, String> {
    sized_request(tenant, "tokens", "explain", i, scale_ms, tokens)
}

/// Task `i` of `tenant` in `project`, of `kind`, that runs `ms` and is `tokens` in size: its
/// estimate (prompt / 4 + 200 + `max_tokens`) is `tokens` (at least 202), and so is the usage the
/// bench's model reports for it ([`crate::SleepLlm`]).
pub(crate) fn sized_request(
    tenant: &str,
    project: &str,
    kind: &str,
    i: usize,
    ms: u64,
    tokens: u64,
) -> Result<TaskRequest, String> {
    // After the estimate's fixed 200: up to half as the completion cap (within the interactive
    // lane's 1,024), the rest in the prompt (4 bytes a token).
    let tokens = tokens.max(202);
    let cap = ((tokens - 200) / 2).min(1_000);
    let head = format!("ms={ms} tokens={tokens} task {i} ");
    let prompt_bytes = ((tokens - 200 - cap) * 4) as usize;
    let prompt = format!("{head}{}", "x".repeat(prompt_bytes.saturating_sub(head.len())));
    let mut req = TaskRequest::from_value(serde_json::json!({"project_id": project, "kind": kind,
        "prompt": prompt, "target_files": [], "params": {"max_tokens": cap}}))
    .map_err(|e| format!("{e:?}"))?;
    req.tenant = Some(Tenant::parse(tenant).map_err(|e| e.to_string())?);
    Ok(req)
}

/// The token shares' windows at a workload's scale (1 workload second = `scale_ms` real ms): a
/// 30-second window, forgotten after 15, a put-off and a patience of a quarter second.
pub(crate) fn scaled_share(scale_ms: u64) -> ShareSettings {
    let quarter = (scale_ms / 4).max(1);
    ShareSettings {
        window_ms: 30 * scale_ms,
        forget_ms: 15 * scale_ms,
        put_off_ms: quarter,
        patience_ms: quarter,
    }
}

/// Stores and sends one task, and counts it as waiting as ingress does (with the shares on).
pub(crate) async fn submit(
    store: &dyn TaskStore,
    adapters: &lanes_core::wiring::Adapters,
    config: &WorkerConfig,
    req: TaskRequest,
    clock: &SharedClock,
) -> Result<TaskId, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let rec = TaskRecord::pending(req.task_id(None), req, clock.now_ms(), 3_600);
    store.put_pending(&rec, clock.now_ms()).await.map_err(|e| err(&e))?;
    let msg = TaskMessage { task_id: rec.task_id.clone(), lane: rec.lane, kind: rec.request.kind };
    let group = task_group(rec.request.tenant.as_ref(), &rec.request.project_id);
    let body = serde_json::to_string(&msg).map_err(|e| err(&e))?;
    adapters.send[rec.lane.index()]
        .send(&body, BTreeMap::from([(GROUP_ATTRIBUTE.to_owned(), group)]))
        .await
        .map_err(|e| err(&e))?;
    if config.quota.share.on {
        let ask = share_ask(&config.quota, &rec.request, Step::Submit, clock.now_ms());
        adapters.cache.share(&share_key(rec.lane), &ask).await.map_err(|e| err(&e))?;
    }
    Ok(rec.task_id)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// What a sized task is charged before its call and what the bench's model reports after it
    /// agree (within the few tokens the kind's instructions add), for every size the benches use
    /// and both lanes' kinds.
    #[test]
    fn a_sized_task_reports_the_tokens_its_estimate_foresaw() {
        for (kind, tokens) in [("explain", 300), ("explain", 1_000), ("explain", 3_000), ("refactor", 1_000)]
        {
            let req = sized_request("t", "p", kind, 7, 40, tokens).unwrap();
            let estimate =
                lanes_core::llm::estimate_tokens(&lanes_core::ports::LlmRequest::for_task(&req, 1_024));
            let usage = crate::usage_in(&req.prompt);
            assert_eq!(usage.prompt + usage.completion, tokens, "{kind} {tokens}");
            assert!(estimate.abs_diff(tokens) * 20 <= tokens, "{kind} {tokens}: estimate {estimate}");
        }
    }
}
