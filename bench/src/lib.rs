//! `lanes bench`: the benchmarks, one module per scenario, each with a report that prints as a table
//! (`Display`) or as JSON (`Serialize`) and names the command that reproduces it. They drive the real
//! core (pool, workers, limiter, the `lanes dev` binary) against test services from the harness
//! (`lanes-tests`: redis-server, moto_server, the provider emulator); none of this ships in a Lambda
//! function.
//!
//! - [`limiter`]: the RPM/TPM limiter against the provider emulator: 429s, throughput, the 70/30 split.
//! - [`provider`]: the limiter against providers that count by token bucket, fixed or sliding
//!   window, with limits configured, learned from headers, or unknown: 429s, use of the limit.
//! - [`litellm`]: the provider bench's interactive-alone runs against a real LiteLLM proxy.
//! - [`batching`]: commit micro-batching vs one call per commit: calls, tokens, 429s.
//! - [`duplicates`]: repeated deliveries with a renewed lease vs a static visibility: LLM calls.
//! - [`hol`]: head-of-line blocking under FIFO, a static split and 70/30 with borrowing.
//! - [`recovery`]: takeover after a SIGKILLed worker, with the lease vs a static visibility.
//! - [`throughput`]: ingress and end-to-end rates, latency and memory of `lanes dev`.
//! - [`soak`]: `lanes dev` under a long stream with expiring records: rate, memory, file size.
//! - [`stream`]: the event stream against a provider streaming at a fixed rate: time per piece of
//!   text from the provider to the client, and memory per subscriber.
//! - [`coldstart`]: the Lambda functions' init duration and zip size against a hello-world function.
//! - [`cost`]: a repository's commits at each service tier policy: cost, flex refusals, deadlines.
//! - [`share_cost`]: what the token shares' script costs Redis as a lane's tenants grow.
//!
//! Each report carries its goal lines ([`goals`]) in its JSON: the bound, the figure, how to show it.

pub mod batching;
pub mod coldstart;
pub mod cost;
pub mod duplicates;
pub mod fairness;
pub mod functions;
pub mod goals;
pub mod hol;
pub mod limiter;
pub mod litellm;
pub mod provider;
pub mod recovery;
pub mod share_cost;
pub mod soak;
pub mod stream;
pub mod throughput;
pub mod token_fairness;

/// A fresh directory under the system's temp dir for one run's data.
fn temp_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("lanes-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Percentile (nearest rank) of `values`, in ms.
fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil().max(1.0) as usize;
    values[rank.min(values.len()) - 1]
}

/// Submits one task to a running server; its id.
async fn submit_task(
    client: &reqwest::Client,
    url: &str,
    kind: &str,
    prompt: &str,
) -> Result<String, String> {
    let body = serde_json::json!({"project_id": "bench", "kind": kind, "prompt": prompt, "target_files": []});
    let resp = client.post(format!("{url}/v1/tasks")).json(&body).send().await.map_err(|e| e.to_string())?;
    let v: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
    v["task_id"].as_str().map(str::to_owned).ok_or_else(|| format!("no task id in {v}"))
}

/// A task's status on a running server, if it answers.
async fn status(client: &reqwest::Client, url: &str, id: &str) -> Option<String> {
    let v: serde_json::Value =
        client.get(format!("{url}/v1/tasks/{id}")).send().await.ok()?.json().await.ok()?;
    v["status"].as_str().map(str::to_owned)
}

/// moto_server and redis-server, stopped when dropped, and the environment that reaches them.
type AwsServices = (lanes_tests::MotoServer, lanes_tests::RedisServer, Vec<(String, String)>);

/// moto_server and redis-server from the harness, with the environment `lanes dev --backend aws`
/// needs to reach them; `None` when they are not installed (`make test-deps` installs both).
fn aws_services() -> Option<AwsServices> {
    if !lanes_tests::services_available() {
        return None;
    }
    let (moto, redis) = (lanes_tests::MotoServer::start(), lanes_tests::RedisServer::start());
    let mut env = moto.env();
    env.push(("REDIS_URL".into(), redis.url()));
    Some((moto, redis, env))
}

/// The table that [`aws_stack`] creates.
const STACK_TABLE: &str = "lanes-tasks";

/// [`aws_services`] with the stack's resources made ([`lanes_core::wiring::create_aws_resources`]:
/// the table, the lane queues with their DLQs, the results bucket): the services, the lanes' queue
/// URLs, and the environment the template gives every function, pointed at them.
async fn aws_stack() -> Result<(AwsServices, [String; 3]), String> {
    let (moto, redis, mut env) =
        aws_services().ok_or("redis-server or moto_server is missing: run scripts/test-deps.sh")?;
    let urls = lanes_core::wiring::create_aws_resources(
        &moto.aws_settings(),
        "lanes",
        STACK_TABLE,
        Default::default(),
    )
    .await
    .map_err(|e| format!("moto resources: {e}"))?;
    env.extend(lanes_tests::stack_env(STACK_TABLE, &urls));
    Ok(((moto, redis, env), urls))
}

/// The usage a [`SleepLlm`] prompt asks to report: `tokens=<n>` anywhere in it (half prompt, half
/// completion), else one of each.
pub(crate) fn usage_in(prompt: &str) -> lanes_core::domain::TokenUsage {
    let n: u64 = prompt.split(' ').find_map(|w| w.strip_prefix("tokens=")?.parse().ok()).unwrap_or(2);
    lanes_core::domain::TokenUsage { prompt: n / 2, completion: n - n / 2 }
}

/// A model that takes as long as its prompt says (`ms=<n>`), and reports the usage it says
/// (`tokens=<n>`): a scaled workload's service times and sizes.
pub(crate) struct SleepLlm;

#[async_trait::async_trait]
impl lanes_core::ports::LlmClient for SleepLlm {
    async fn complete(
        &self,
        request: &lanes_core::ports::LlmRequest,
    ) -> Result<lanes_core::ports::LlmResponse, lanes_core::ports::LlmError> {
        let ms: u64 =
            request.prompt.strip_prefix("ms=").and_then(|s| s.split(' ').next()?.parse().ok()).unwrap_or(1);
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        Ok(lanes_core::ports::LlmResponse {
            truncated: false,
            limits: Default::default(),
            text: "done".into(),
            model: "sleep".into(),
            usage: usage_in(&request.prompt),
            tier: Default::default(),
            route: Default::default(),
            continued: 0,
        })
    }
}

/// A pool running in the background until [`RunningPool::stop`].
pub(crate) struct RunningPool {
    stop: lanes_core::CancellationToken,
    runner: tokio::task::JoinHandle<()>,
}

impl RunningPool {
    /// Starts `pool`.
    pub(crate) fn start(pool: lanes_core::pool::Pool) -> Self {
        let (pool, stop) = (std::sync::Arc::new(pool), lanes_core::CancellationToken::new());
        let runner = {
            let stop = stop.clone();
            tokio::spawn(async move { pool.run(stop).await })
        };
        Self { stop, runner }
    }

    /// Stops it and waits for its slots to hand back what they hold.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        let _ = self.runner.await;
    }
}

/// Waits until `queues` hold nothing, visible or in flight: every task finished (or `cap` passed).
pub(crate) async fn drain(
    queues: &[lanes_core::embedded::EmbeddedQueue],
    cap: std::time::Duration,
) -> Result<(), String> {
    use lanes_core::ports::QueueConsume;
    let until = std::time::Instant::now() + cap;
    loop {
        let mut left = 0;
        for q in queues {
            let d = q.depth().await.map_err(|e| e.to_string())?;
            left += d.visible + d.in_flight;
        }
        if left == 0 || std::time::Instant::now() > until {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
