//! `lanes bench stream`: what the event stream adds to a provider's own stream, and what its readers
//! cost. `lanes dev` calls the provider emulator as an OpenAI-compatible route; the emulator streams
//! every answer at a fixed rate and stamps each chunk with the time it wrote it
//! ([`lanes_tests::mock_llm::Pace`]), so a client that follows the task over
//! `GET /v1/tasks/{id}/events` knows, for every piece of text it receives, how long the piece took
//! from the provider to it: the worker's read of the provider's stream, the publisher's append to the
//! event log, the reader's wake-up and the SSE write.
//!
//! Reported, per backend (the in-process log, and Redis Streams):
//! - per piece of text, received minus written by the provider: p50, p99, max (goal: p99 ≤ 20 ms);
//! - the first text: from the accepted POST to the first delta, beside the provider's first chunk;
//! - the inter-delta gap p99 at the client beside the provider's own inter-chunk gap p99;
//! - with one task followed alone and with many streaming at once.
//!
//! Memory: the server's resident set with 1, 100 and 500 clients following one answer, for an answer
//! of 100 KiB (400 chunks of 256 bytes, 20 ms apart) and one four times as long at the same pace,
//! on the process's own allocator (jemalloc). Goal, flat in the subscribers: an extra subscriber
//! costs its connection and no more, the same whatever the length of the text it reads (at most 25%
//! more for the four-times answer), so no reader holds a copy of the stream.

use crate::goals::{Goal, Unit, write_goals};
use crate::percentile;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use lanes_tests::DevServer;
use lanes_tests::mock_llm::{MockLlm, Pace};
use serde::Serialize;
use std::time::Duration;

/// The goal on the time a piece of text takes from the provider to the client, p99, ms.
const GOAL_OVERHEAD_MS: f64 = 20.0;
/// The memory goal: an extra subscriber of an answer four times as long costs at most this many
/// times as much.
const GOAL_LONGER_ANSWER_RATIO: f64 = 1.25;

/// One backend and load in `lanes bench stream`.
#[derive(Debug, Clone, Serialize)]
pub struct StreamRun {
    /// `embedded` (the in-process log) or `redis + moto` (Redis Streams).
    pub backend: String,
    /// Tasks streaming at once, each followed by one client.
    pub tasks: usize,
    /// Tasks whose deltas made their result's text exactly.
    pub complete: usize,
    /// Chunks the provider wrote per answer, and deltas the client received per task (the worker
    /// appends what arrived while its last append was under way, so a delta may carry several).
    pub chunks_per_task: usize,
    /// Deltas received per task, mean.
    pub deltas_per_task: f64,
    /// Per chunk: received by the client minus written by the provider, p50, p99 and max, ms.
    pub overhead_ms: [f64; 3],
    /// From the accepted POST to the provider's first chunk, p50 and p99, ms.
    pub provider_first_ms: [f64; 2],
    /// From the accepted POST to the client's first delta, p50 and p99, ms.
    pub first_delta_ms: [f64; 2],
    /// The provider's inter-chunk gap p99, ms.
    pub provider_gap_p99_ms: f64,
    /// The client's inter-delta gap p99, ms.
    pub client_gap_p99_ms: f64,
}

/// The server's memory with this many clients following one answer.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPoint {
    /// Clients following the task.
    pub subscribers: usize,
    /// The server's resident set (`VmRSS`) halfway through the answer, MiB.
    pub rss_mib: f64,
    /// Clients whose deltas made the result's text exactly.
    pub complete: usize,
}

/// What `lanes bench stream` reports.
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    /// The command that reproduces it.
    pub command: String,
    /// The provider's pace: chunks per answer, ms between chunks, bytes per chunk.
    pub chunks: usize,
    /// Ms between chunks.
    pub interval_ms: u64,
    /// Bytes per chunk.
    pub chunk_bytes: usize,
    /// The runs, by backend and load.
    pub runs: Vec<StreamRun>,
    /// The memory runs (embedded backend): an answer, then one four times as long.
    pub memory: Vec<MemoryRun>,
    /// The longer answer's cost per subscriber over the shorter's.
    pub longer_answer_ratio: f64,
    /// The goal lines: the worst run's per-piece p99, and that ratio.
    pub goals: Vec<Goal>,
}

/// The server's memory with ever more clients following one answer.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRun {
    /// The answer's size, KiB.
    pub answer_kib: f64,
    /// By subscribers.
    pub points: Vec<MemoryPoint>,
    /// Extra memory per subscriber from the fewest to the most, KiB.
    pub per_subscriber_kib: f64,
}

/// One followed task's samples.
#[derive(Default)]
struct Followed {
    /// Per chunk, received minus written, ms.
    overhead: Vec<f64>,
    /// Unix µs: the provider's chunks, the client's deltas.
    provider_at: Vec<u64>,
    client_at: Vec<u64>,
    text: String,
    result: String,
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Follows `id` to its end, stamping each delta as it arrives.
async fn follow(client: &reqwest::Client, url: &str, id: &str) -> Result<Followed, String> {
    let resp = client.get(format!("{url}/v1/tasks/{id}/events")).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("events of {id}: {}", resp.status()));
    }
    let mut events = resp.bytes_stream().eventsource();
    let mut f = Followed::default();
    while let Some(e) = events.next().await {
        let e = e.map_err(|e| e.to_string())?;
        let at = now_us();
        let data: serde_json::Value = serde_json::from_str(&e.data).map_err(|e| e.to_string())?;
        match e.event.as_str() {
            "delta" => {
                let text = data["text"].as_str().unwrap_or_default();
                for stamp in Pace::stamps(text) {
                    f.overhead.push(at.saturating_sub(stamp) as f64 / 1000.0);
                    f.provider_at.push(stamp);
                }
                f.client_at.push(at);
                f.text.push_str(text);
            }
            "status" if data["state"] == "restarting" => f.text.clear(),
            "result" => {
                f.result = data["result"]["text"].as_str().unwrap_or_default().to_owned();
                break;
            }
            "error" => return Err(format!("task {id} failed: {data}")),
            _ => {}
        }
    }
    Ok(f)
}

/// Submits a task and follows it with `readers` clients: the POST's answer time (Unix µs) and
/// each reader's samples.
async fn submit_and_follow(
    client: &reqwest::Client,
    url: &str,
    prompt: &str,
    readers: usize,
) -> Result<(u64, Vec<Followed>), String> {
    let id = crate::submit_task(client, url, "explain", prompt).await?;
    let accepted = now_us();
    let handles: Vec<_> = (0..readers)
        .map(|_| {
            let (client, url, id) = (client.clone(), url.to_owned(), id.clone());
            tokio::spawn(async move { follow(&client, &url, &id).await })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.map_err(|e| e.to_string())??);
    }
    Ok((accepted, out))
}

/// Gaps between consecutive stamps, ms.
fn gaps(stamps: &[u64]) -> Vec<f64> {
    stamps.windows(2).map(|w| w[1].saturating_sub(w[0]) as f64 / 1000.0).collect()
}

/// `tasks` tasks at once, one client each, on `server`.
async fn run(backend: &str, url: &str, tasks: usize, pace: Pace) -> Result<StreamRun, String> {
    let client = reqwest::Client::new();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (client, url) = (client.clone(), url.to_owned());
            let prompt = format!("stream bench {backend} {tasks} {i} {}", uuid::Uuid::new_v4());
            tokio::spawn(async move { submit_and_follow(&client, &url, &prompt, 1).await })
        })
        .collect();
    let (mut overhead, mut first, mut provider_first, mut provider_gap, mut client_gap) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut complete, mut deltas) = (0, 0);
    for h in handles {
        let (accepted, followed) = h.await.map_err(|e| e.to_string())??;
        for f in followed {
            complete += usize::from(!f.result.is_empty() && f.text == f.result);
            deltas += f.client_at.len();
            if let (Some(p), Some(c)) = (f.provider_at.first(), f.client_at.first()) {
                provider_first.push(p.saturating_sub(accepted) as f64 / 1000.0);
                first.push(c.saturating_sub(accepted) as f64 / 1000.0);
            }
            provider_gap.extend(gaps(&f.provider_at));
            client_gap.extend(gaps(&f.client_at));
            overhead.extend(f.overhead);
        }
    }
    Ok(StreamRun {
        backend: backend.to_owned(),
        tasks,
        complete,
        chunks_per_task: pace.chunks,
        deltas_per_task: deltas as f64 / tasks.max(1) as f64,
        overhead_ms: [
            percentile(&mut overhead, 50.0),
            percentile(&mut overhead, 99.0),
            percentile(&mut overhead, 100.0),
        ],
        provider_first_ms: [percentile(&mut provider_first, 50.0), percentile(&mut provider_first, 99.0)],
        first_delta_ms: [percentile(&mut first, 50.0), percentile(&mut first, 99.0)],
        provider_gap_p99_ms: percentile(&mut provider_gap, 99.0),
        client_gap_p99_ms: percentile(&mut client_gap, 99.0),
    })
}

/// `lanes dev` on `backend`'s arguments and environment, calling `mock` as its only route.
async fn server(mock: &MockLlm, extra: &[&str], env: &[(String, String)]) -> Result<DevServer, String> {
    let dir = crate::temp_dir().map_err(|e| e.to_string())?;
    let mut env = env.to_vec();
    env.extend(
        [
            ("LANES_LLM_PROVIDER", "openai".to_owned()),
            ("LANES_LLM_MODEL", "paced".to_owned()),
            ("LANES_LLM_BASE_URL", format!("{}/v1", mock.url)),
            ("LANES_LLM_API_KEY", "bench".to_owned()),
            ("LANES_LLM_RPM", "1000000".to_owned()),
            ("LANES_LLM_TPM", "1000000000".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let args = [&["--capacity", "600"][..], extra].concat();
    Ok(DevServer::start_with_env(&dir, &args, env).await)
}

/// The server's memory with 1, 100 and 500 clients following one answer paced `long` each time.
async fn memory(mock: &MockLlm, long: Pace) -> Result<MemoryRun, String> {
    mock.pace(long);
    let dev = server(mock, &[], &[]).await?;
    let pid = dev.pid().ok_or("lanes dev is not running")?;
    let client = reqwest::Client::new();
    let mut points = Vec::new();
    for subscribers in [1, 100, 500] {
        let prompt = format!("stream bench memory {subscribers} {}", uuid::Uuid::new_v4());
        let (url, client2) = (dev.url.clone(), client.clone());
        let following =
            tokio::spawn(async move { submit_and_follow(&client2, &url, &prompt, subscribers).await });
        // Halfway through the answer, every reader attached and reading.
        tokio::time::sleep(long.interval * (long.chunks as u32) / 2).await;
        let rss = lanes_tests::resident_kib(pid).map(|(now, _)| now).unwrap_or(0);
        let (_, followed) = following.await.map_err(|e| e.to_string())??;
        let complete = followed.iter().filter(|f| !f.result.is_empty() && f.text == f.result).count();
        points.push(MemoryPoint { subscribers, rss_mib: rss as f64 / 1024.0, complete });
    }
    let (first, last) = (&points[0], &points[points.len() - 1]);
    let per_subscriber_kib =
        (last.rss_mib - first.rss_mib) * 1024.0 / (last.subscribers - first.subscribers).max(1) as f64;
    let answer_kib = (long.chunks * (long.pad + 18)) as f64 / 1024.0;
    Ok(MemoryRun { answer_kib, points, per_subscriber_kib })
}

/// `lanes bench stream`: `chunks` chunks `interval_ms` apart per answer; one task alone and `many`
/// at once on each backend; then the memory points.
pub async fn stream_report(chunks: usize, interval_ms: u64, many: usize) -> Result<StreamReport, String> {
    let mock = MockLlm::start().await.map_err(|e| e.to_string())?;
    let pace = Pace { chunks, interval: Duration::from_millis(interval_ms), pad: 32 };
    mock.pace(pace);
    let mut runs = Vec::new();
    {
        let dev = server(&mock, &[], &[]).await?;
        for tasks in [1, many] {
            runs.push(run("embedded", &dev.url, tasks, pace).await?);
        }
    }
    if let Some((_moto, _redis, env)) = crate::aws_services() {
        let dev = server(&mock, &["--backend", "aws", "--create"], &env).await?;
        for tasks in [1, many] {
            runs.push(run("redis + moto", &dev.url, tasks, pace).await?);
        }
    }
    // Chunks of 256 bytes 20 ms apart: 400 (100 KiB, 8 s), then 1,600 (400 KiB, 32 s).
    let mut memory_runs = Vec::new();
    for (chunks, every) in [(400, 20), (1600, 20)] {
        let long = Pace { chunks, interval: Duration::from_millis(every), pad: 256 - 18 };
        memory_runs.push(memory(&mock, long).await?);
    }
    let ratio = memory_runs[1].per_subscriber_kib / memory_runs[0].per_subscriber_kib.max(f64::EPSILON);
    let worst_overhead = crate::goals::worst(runs.iter().map(|r| r.overhead_ms[1]));
    Ok(StreamReport {
        command: format!("lanes bench stream --chunks {chunks} --interval-ms {interval_ms} --many {many}"),
        chunks,
        interval_ms,
        chunk_bytes: pace.pad + 18,
        memory: memory_runs,
        longer_answer_ratio: ratio,
        goals: vec![
            Goal::new("overhead_p99", "per-piece p99, the worst run", worst_overhead)
                .at_most(GOAL_OVERHEAD_MS)
                .shown(Unit::Ms, 1),
            Goal::new(
                "longer_answer_ratio",
                "a subscriber of the four-times answer / one of the first",
                ratio,
            )
            .at_most(GOAL_LONGER_ANSWER_RATIO),
        ],
        runs,
    })
}

impl std::fmt::Display for StreamReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "$ {}", self.command)?;
        writeln!(
            f,
            "provider: {} chunks of {} bytes, {} ms apart, each stamped when written\n",
            self.chunks, self.chunk_bytes, self.interval_ms
        )?;
        writeln!(
            f,
            "{:<14} {:>5} {:>9} {:>8} {:>26} {:>20} {:>20} {:>18}",
            "backend",
            "tasks",
            "complete",
            "deltas",
            "per piece p50/p99/max ms",
            "provider first ms",
            "first delta ms",
            "gap p99 ms (prov)"
        )?;
        for r in &self.runs {
            writeln!(
                f,
                "{:<14} {:>5} {:>9} {:>8.1} {:>26} {:>20} {:>20} {:>18}",
                r.backend,
                r.tasks,
                format!("{}/{}", r.complete, r.tasks),
                r.deltas_per_task,
                format!("{:.1} / {:.1} / {:.1}", r.overhead_ms[0], r.overhead_ms[1], r.overhead_ms[2]),
                format!("{:.0} / {:.0}", r.provider_first_ms[0], r.provider_first_ms[1]),
                format!("{:.0} / {:.0}", r.first_delta_ms[0], r.first_delta_ms[1]),
                format!("{:.1} ({:.1})", r.client_gap_p99_ms, r.provider_gap_p99_ms),
            )?;
        }
        for m in &self.memory {
            writeln!(
                f,
                "\nmemory, one answer of {:.0} KiB followed by many clients (embedded):",
                m.answer_kib
            )?;
            for p in &m.points {
                writeln!(
                    f,
                    "  {:>4} subscribers: {:>7.1} MiB ({} complete)",
                    p.subscribers, p.rss_mib, p.complete
                )?;
            }
            writeln!(f, "  an extra subscriber: {:.1} KiB", m.per_subscriber_kib)?;
        }
        write_goals(f, &self.goals)
    }
}
