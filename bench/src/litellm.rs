//! The interactive-alone runs of [`crate::provider`] against a real LiteLLM proxy rather than the
//! provider emulator: sixty interactive calls at a limit of 30 requests a minute, with the limit
//! configured and learned from the proxy's headers.
//!
//! The proxy enforces the deployment's `rpm` itself (`router_settings.optional_pre_call_checks:
//! ["enforce_model_rate_limits"]`): it counts requests per calendar minute, answers the first
//! request past the limit 429 with `retry-after: 60`, counts that refused request too, and says the
//! limit and what is left of it (`x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`) in
//! every answer, but not when the minute ends. Its upstream is the provider emulator without limits.
//! Its 429s are read from its access log, since the client stack answers them with waits.

use crate::provider::{AloneRun, drive_alone};
use lanes_core::limiter::LimiterConfig;
use lanes_core::llm::{OpenAiClient, RetryPolicy};
use lanes_core::secret::Secret;
use lanes_tests::mock_llm::MockLlm;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The proxy's requests a minute, and the tasks: the two minutes the limit allows.
pub const RPM: f64 = 30.0;
/// See [`RPM`].
pub const TASKS: usize = 60;

/// The key clients present (the proxy refuses to start without one).
const MASTER_KEY: &str = "sk-lanes-bench-0123456789abcdef";

/// A LiteLLM proxy on a loopback port; killed when dropped.
struct Proxy {
    child: Child,
    port: u16,
    log: PathBuf,
    dir: PathBuf,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Proxy {
    /// Starts `bin` (the `litellm` command) in front of `upstream` (an OpenAI-compatible base URL)
    /// with a deployment `bench` limited to `rpm` requests a minute, and waits until it answers.
    async fn start(bin: &Path, upstream: &str, rpm: f64) -> Result<Self, String> {
        let dir = crate::temp_dir().map_err(|e| e.to_string())?;
        let config = dir.join("config.yaml");
        let yaml = format!(
            "model_list:\n  - model_name: bench\n    litellm_params:\n      model: openai/bench\n      \
             api_key: sk-none\n      api_base: {upstream}\n      rpm: {rpm}\n\
             router_settings:\n  optional_pre_call_checks: [\"enforce_model_rate_limits\"]\n"
        );
        std::fs::write(&config, yaml).map_err(|e| e.to_string())?;
        let log = dir.join("proxy.log");
        let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let port = lanes_tests::free_port();
        let child = Command::new(bin)
            .args(["--config", &config.to_string_lossy(), "--host", "127.0.0.1", "--port", &port.to_string()])
            .env("LITELLM_MASTER_KEY", MASTER_KEY)
            // Loopback only: the model price list from the package, not fetched from GitHub.
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let proxy = Proxy { child, port, log, dir };
        proxy.ready().await?;
        Ok(proxy)
    }

    async fn ready(&self) -> Result<(), String> {
        let client = reqwest::Client::new();
        let until = Instant::now() + Duration::from_secs(180);
        let url = format!("http://127.0.0.1:{}/health/liveliness", self.port);
        while Instant::now() < until {
            if client.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
        Err(format!(
            "the LiteLLM proxy did not answer within 180 s; its log ends:\n{}",
            last_lines(&tail, 20)
        ))
    }

    /// Requests the proxy answered 429, from its access log.
    fn throttled(&self) -> u64 {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().filter(|l| l.contains("\" 429")).count() as u64
    }
}

/// The time from `now` to the next whole minute of the clock (the proxy keys its counts by it).
fn until_next_minute(now: std::time::SystemTime) -> Duration {
    let since = now.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Duration::from_secs(60) - Duration::from_nanos((since.as_nanos() % 60_000_000_000) as u64)
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The LiteLLM version beside `bin` (the venv's own Python asked for its package's version).
pub fn version(bin: &Path) -> Option<String> {
    let python = bin.parent()?.join("python");
    let out = Command::new(python)
        .args(["-c", "import importlib.metadata as m; print(m.version('litellm'))"])
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// [`TASKS`] interactive calls from six workers through the real client stack against a LiteLLM
/// proxy (`bin`) allowing [`RPM`] requests a minute, with the limit configured (`known`) or learned
/// from its headers. Retries follow the production policy (the proxy's 60 s hint is waited out);
/// a call waits for budget up to two minutes, so none is put off.
///
/// The calls start a second into one of the proxy's minutes: the worst moment for calls made before
/// the limit is known, since nearly all of that minute is still to come.
pub async fn alone(bin: &Path, known: bool) -> Result<AloneRun, String> {
    let upstream = MockLlm::start().await.map_err(|e| e.to_string())?;
    let proxy = Proxy::start(bin, &format!("{}/v1", upstream.url), RPM).await?;
    tokio::time::sleep(until_next_minute(std::time::SystemTime::now()) + Duration::from_secs(1)).await;
    let url = format!("http://127.0.0.1:{}/v1", proxy.port);
    let provider = OpenAiClient::new(&url, "bench", Some(Secret::fixed(MASTER_KEY)), Duration::from_secs(30));
    let caps = if known { LimiterConfig::new(RPM, 1e9) } else { LimiterConfig::unknown() };
    let answered =
        drive_alone(provider, caps, RetryPolicy::default(), TASKS, Duration::from_secs(120)).await?;
    Ok(AloneRun::of(known, TASKS, RPM, Duration::from_secs(60), &answered, proxy.throttled()))
}
