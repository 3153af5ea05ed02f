//! `lanes bench NAME [--json]`: dispatches to `lanes-bench`; each report prints itself as a table or
//! as one JSON object, with the command that reproduces it.

use crate::CliError;
use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Crash recovery: a 90 s synthesis task (time-scaled) on SQS (moto) and Redis with two workers;
    /// the one running it is killed 5 s in: time until the other takes it over, with the 15 s lease
    /// and with a static 120 s visibility, then with the lease at real time (a 30 s task, about a
    /// minute more).
    Recovery {
        /// Real ms per workload second (SQS visibility is whole seconds: keep it >= 100).
        #[arg(long, default_value_t = 100)]
        scale_ms: u64,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Memory of each Lambda function: the real binaries under the Lambda emulator with their
    /// template settings (ingress, the interactive and synthesis workers), against moto and Redis,
    /// through a stream of tasks: each function's resident memory per tenth of the run.
    Functions {
        /// Tasks (one in ten to the synthesis lane).
        #[arg(long, default_value_t = 1000)]
        tasks: usize,
        /// Ingress invocations at once (the emulator gives a function without reserved
        /// concurrency at most 10 environments).
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Streaming: `lanes dev` calling the provider emulator, which streams each answer at a fixed
    /// rate and stamps every chunk: per piece of text, the time from the provider to a client
    /// following `GET /v1/tasks/{id}/events`, one task alone and many at once, on the in-process log
    /// and on Redis Streams; then the server's memory with 1, 100 and 500 clients on one answer.
    Stream {
        /// Chunks per answer.
        #[arg(long, default_value_t = 100)]
        chunks: usize,
        /// Ms between the provider's chunks.
        #[arg(long, default_value_t = 20)]
        interval_ms: u64,
        /// Tasks streaming at once in the loaded run.
        #[arg(long, default_value_t = 100)]
        many: usize,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Throughput: concurrent clients submitting interactive tasks to `lanes dev` (offline model, no
    /// latency) on embedded defaults and on Redis + moto: ingress and end-to-end rates, latency, memory.
    Throughput {
        /// Tasks per backend.
        #[arg(long, default_value_t = 2000)]
        tasks: usize,
        /// Tasks on Redis + moto instead (moto answers one request at a time: a run long enough to
        /// steady the embedded figures would take it an hour).
        #[arg(long)]
        aws_tasks: Option<usize>,
        /// Concurrent clients.
        #[arg(long, default_value_t = 32)]
        clients: usize,
        /// Worker slots of the server (`lanes dev --capacity`). With an instant model a slot is held
        /// only by the task's own writes, so at 16 the slots, not the CPU, bound the rate.
        #[arg(long, default_value_t = 64)]
        capacity: usize,
        /// One backend alone (`embedded`, or `aws`: Redis + moto); both when absent.
        #[arg(long, value_parser = ["embedded", "aws"])]
        backend: Option<String>,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Cold start: every function built as `sam build` builds it (arm64 zip) and for this machine,
    /// started under a local runtime-API emulator against moto and redis-server: init (exec to the
    /// first `invocation/next`, median of `starts`) and zip size, against a hello-world function.
    Coldstart {
        /// Starts per function.
        #[arg(long, default_value_t = 20)]
        starts: usize,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Head-of-line blocking: a mixed workload (95% short interactive, 5% long synthesis) time-scaled through the real pool and embedded queues,
    /// under one FIFO, a static 50:50 split and 70/30 with borrowing.
    Hol {
        /// Worker slots.
        #[arg(long, default_value_t = 10)]
        slots: usize,
        /// Seconds of arrivals (real time).
        #[arg(long, default_value_t = 40.0)]
        seconds: f64,
        /// Real ms per workload second: at 100, the few ms each task spends in durable writes
        /// (submission, send, claim) are a small part of a 50-200 ms interactive task.
        #[arg(long, default_value_t = 100)]
        scale_ms: u64,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Fairness: four tenants on one lane through the real pool and embedded queues; three steady,
    /// one flooding 2,000 interactive and 50 synthesis tasks at once. Each tenant's wait alone and
    /// under the flood, in FIFO order and in the fair order.
    Fairness {
        /// Worker slots.
        #[arg(long, default_value_t = 8)]
        slots: usize,
        /// Seconds of steady arrivals (real time); the flood is queued before they start. 20 s gives
        /// each steady tenant about 340 tasks, so its p99 rests on its three or four slowest, and ends
        /// before the flood's interactive backlog drains.
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
        /// Real ms per workload second.
        #[arg(long, default_value_t = 40)]
        scale_ms: u64,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Duplicate spend: N deliveries of one task and of one commit, three pollers, a model slower than
    /// the visibility window: LLM calls with the renewed lease and with a static visibility.
    Duplicates {
        /// Deliveries of each.
        #[arg(long, default_value_t = 10)]
        deliveries: usize,
        /// Model latency, ms.
        #[arg(long, default_value_t = 1_500)]
        llm_ms: u64,
        /// Visibility window (and lease), ms.
        #[arg(long, default_value_t = 400)]
        visibility_ms: u64,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Micro-batching: synthetic commits through the real commits worker against the provider emulator
    /// (its limits per one-second window, 429 past them) behind the limiter, micro-batched and then one
    /// call per commit: LLM calls, tokens, 429s, time.
    Batching {
        /// Commits per run.
        #[arg(long, default_value_t = 500)]
        commits: usize,
        /// Requests per (one-second) window.
        #[arg(long, default_value_t = 50.0)]
        rpm: f64,
        /// Tokens per (one-second) window.
        #[arg(long, default_value_t = 200_000.0)]
        tpm: f64,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The RPM/TPM limiter against the provider emulator on loopback, which enforces the same limits
    /// per one-second window and answers 429 past them: 429s, throughput, and the 70/30 reservation.
    Limiter {
        /// Requests per (one-second) window.
        #[arg(long, default_value_t = 400.0)]
        rpm: f64,
        /// Tokens per (one-second) window.
        #[arg(long, default_value_t = 40_000.0)]
        tpm: f64,
        /// Requests in the throughput run (eight workers).
        #[arg(long, default_value_t = 1000)]
        requests: usize,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// `lanes dev` under a long stream of tasks whose records expire, swept as it runs: tasks/s per
    /// tenth (the last against the first), memory per tenth, and the data file against its live data.
    Soak {
        /// Tasks to submit.
        #[arg(long, default_value_t = 1_000_000)]
        tasks: usize,
        /// Concurrent clients.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// How long the server keeps a task record.
        #[arg(long, default_value_t = 30)]
        record_ttl_secs: u64,
        /// How often the server sweeps expired records.
        #[arg(long, default_value_t = 5)]
        sweep_secs: u64,
        /// The server's worker slots (`lanes dev --capacity`), as `throughput` gives it.
        #[arg(long, default_value_t = 64)]
        capacity: usize,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The limiter against a provider emulator that counts its limits by token bucket, fixed or
    /// sliding window, with the limits configured, learned from its headers, or unknown (slow start):
    /// 429s, use of the limit, failures, p99 call time, interactive share.
    Provider {
        /// Requests per (one-second) window.
        #[arg(long, default_value_t = 200.0)]
        rpm: f64,
        /// Tokens per (one-second) window.
        #[arg(long, default_value_t = 20_000.0)]
        tpm: f64,
        /// Seconds of load per run: ten one-second windows stand for a provider's ten minutes.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// A LiteLLM proxy's `litellm` command: the interactive-alone runs are also made against a
        /// real proxy at 30 requests a minute (five to seven minutes: each run starts a second into
        /// the proxy's next minute).
        #[arg(long)]
        litellm: Option<std::path::PathBuf>,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The token shares' cost to Redis as a lane's tenants grow: Redis's own time per call of each
    /// step (submission, start decision, correction) with 10, 100 and 1,000 tenants waiting in one
    /// lane, against a redis-server of its own.
    Share {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A repository's commits through the commits pipeline at each service tier policy against the
    /// provider emulator: cost, calls, flex refusals, time to summary, deadlines missed, duplicates.
    Cost {
        /// The repository whose history is summarized.
        #[arg(long, default_value = ".")]
        repo: std::path::PathBuf,
        /// Its newest N commits.
        #[arg(long, default_value_t = 300)]
        commits: usize,
        /// What the emulator adds to each flex call (spare capacity is slower), ms.
        #[arg(long, default_value_t = 50)]
        flex_latency_ms: u64,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one benchmark and prints its report.
pub async fn run(what: BenchCommand) -> Result<(), CliError> {
    use lanes_bench as b;
    match what {
        BenchCommand::Recovery { scale_ms, json } => show(b::recovery::recovery_report(scale_ms).await, json),
        BenchCommand::Functions { tasks, concurrency, json } => {
            show(b::functions::functions_report(tasks, concurrency).await, json)
        }
        BenchCommand::Throughput { tasks, aws_tasks, clients, capacity, backend, json } => {
            let backend = backend.as_deref();
            show(b::throughput::throughput_report(tasks, aws_tasks, clients, capacity, backend).await, json)
        }
        BenchCommand::Stream { chunks, interval_ms, many, json } => {
            show(b::stream::stream_report(chunks, interval_ms, many).await, json)
        }
        BenchCommand::Coldstart { starts, json } => show(b::coldstart::coldstart_report(starts).await, json),
        BenchCommand::Hol { slots, seconds, scale_ms, json } => {
            show(b::hol::hol_report(slots, seconds, scale_ms).await, json)
        }
        BenchCommand::Fairness { slots, seconds, scale_ms, json } => {
            show(b::fairness::fairness_report(slots, seconds, scale_ms).await, json)
        }
        BenchCommand::Share { json } => show(b::share_cost::share_cost_report().await, json),
        BenchCommand::Duplicates { deliveries, llm_ms, visibility_ms, json } => {
            show(b::duplicates::duplicates_report(deliveries, llm_ms, visibility_ms).await, json)
        }
        BenchCommand::Batching { commits, rpm, tpm, json } => {
            show(b::batching::batching_report(commits, rpm, tpm).await, json)
        }
        BenchCommand::Limiter { rpm, tpm, requests, json } => {
            show(b::limiter::limiter_report(rpm, tpm, requests).await, json)
        }
        BenchCommand::Soak { tasks, clients, record_ttl_secs, sweep_secs, capacity, json } => {
            show(b::soak::soak_report(tasks, clients, record_ttl_secs, sweep_secs, capacity).await, json)
        }
        BenchCommand::Provider { rpm, tpm, seconds, litellm, json } => {
            show(b::provider::provider_report(rpm, tpm, seconds, litellm.as_deref()).await, json)
        }
        BenchCommand::Cost { repo, commits, flex_latency_ms, json } => {
            show(b::cost::cost_report(&repo, commits, flex_latency_ms).await, json)
        }
    }
}

fn show<R: std::fmt::Display + serde::Serialize>(
    report: Result<R, String>,
    json: bool,
) -> Result<(), CliError> {
    let report = report.map_err(CliError::Bench)?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{report}");
    }
    Ok(())
}
