//! `lanes`: the command-line entry point. `dev` runs the whole task flow in one process on embedded
//! defaults; `submit` and `status` are thin HTTP clients of a running server.

mod dlq;

use clap::{Parser, Subcommand};
use lanes_core::CancellationToken;
use lanes_core::local::{DevBackend, DevOptions, Local};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "lanes", version, about = "AI code-generation and commit-summary lanes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run ingress, queues, store, pool and the offline provider in one process.
    Dev {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:3000")]
        addr: SocketAddr,
        /// Directory of the embedded database.
        #[arg(long, default_value = ".lanes")]
        data_dir: PathBuf,
        /// Worker slots shared by the lanes (70% interactive, 30% background).
        #[arg(long, default_value_t = 10)]
        capacity: usize,
        /// Simulated offline-provider latency for interactive tasks, in ms.
        #[arg(long, default_value_t = 200)]
        interactive_latency_ms: u64,
        /// Simulated offline-provider latency for synthesis tasks, in ms.
        #[arg(long, default_value_t = 2000)]
        synthesis_latency_ms: u64,
        /// Lease TTL in ms (visibility and lock); the heartbeat renews at a third of it.
        #[arg(long, default_value_t = 15_000)]
        lease_ttl_ms: u64,
        /// `embedded` (a file in the data dir) or `aws` (SQS, DynamoDB, Redis; endpoint from
        /// AWS_ENDPOINT_URL, Redis from REDIS_URL).
        #[arg(long, default_value = "embedded", value_parser = ["embedded", "aws"])]
        backend: String,
        /// With `--backend aws`: create the queues (lanes-<lane>, with DLQs) and the table (lanes-tasks).
        #[arg(long)]
        create: bool,
        /// The queues' maxReceiveCount (embedded, or with `--backend aws --create`). Receives are not
        /// attempts: only crash loops and poison reach the DLQ.
        #[arg(long, default_value_t = 10)]
        max_receive_count: u32,
        /// The queues' own (default) visibility timeout in seconds, when created. Kept long, as Lambda
        /// requires; the worker's lease is what makes redelivery fast.
        #[arg(long, default_value_t = 900)]
        queue_visibility_secs: u64,
        /// How often the task lanes' DLQs are swept (records of dead-lettered tasks marked FAILED).
        #[arg(long, default_value_t = 30)]
        dlq_sweep_secs: u64,
    },
    /// Submit a task to a running server.
    Submit {
        /// Server URL.
        #[arg(long, default_value = "http://127.0.0.1:3000")]
        url: String,
        /// Project id.
        #[arg(long)]
        project: String,
        /// Task kind (explain, refactor, ...).
        #[arg(long)]
        kind: String,
        /// The prompt.
        #[arg(long)]
        prompt: String,
        /// Target files (repeatable).
        #[arg(long = "file")]
        files: Vec<String>,
    },
    /// Benchmarks that print a report with the command that reproduces it.
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
    /// Summarize a local repository's commits through the commits pipeline (embedded defaults; the
    /// offline provider unless LANES_LLM_PROVIDER is set). A second run answers from the store.
    Summarize {
        /// The repository.
        #[arg(long, default_value = ".")]
        repo: PathBuf,
        /// The newest N commits.
        #[arg(long, conflicts_with = "since")]
        last: Option<usize>,
        /// Commits after REV (REV..HEAD).
        #[arg(long)]
        since: Option<String>,
        /// Directory of the embedded database.
        #[arg(long, default_value = ".lanes")]
        data_dir: PathBuf,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A task lane's dead-letter queue: list it, or redrive it.
    Dlq {
        #[command(subcommand)]
        what: dlq::DlqCommand,
    },
    /// Show a task.
    Status {
        /// Server URL.
        #[arg(long, default_value = "http://127.0.0.1:3000")]
        url: String,
        /// Task id.
        task_id: String,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Crash recovery: a 90 s synthesis task (time-scaled) on SQS (moto) and Redis with two workers;
    /// the one running it is killed 5 s in: time until the other takes it over, with the 15 s lease
    /// and with a static 120 s visibility.
    Recovery {
        /// Real ms per workload second (SQS visibility is whole seconds: keep it >= 100).
        #[arg(long, default_value_t = 100)]
        scale_ms: u64,
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
        /// Concurrent clients.
        #[arg(long, default_value_t = 32)]
        clients: usize,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Head-of-line blocking: the seeds' workload time-scaled through the real pool and embedded queues,
    /// under one FIFO, a static 50:50 split and 70/30 with borrowing.
    Hol {
        /// Worker slots.
        #[arg(long, default_value_t = 10)]
        slots: usize,
        /// Seconds of arrivals (real time).
        #[arg(long, default_value_t = 8.0)]
        seconds: f64,
        /// Real ms per workload second.
        #[arg(long, default_value_t = 20)]
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
}

#[tokio::main]
async fn main() -> ExitCode {
    lanes_core::init_cli_tracing();
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lanes: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Dev {
            addr,
            data_dir,
            capacity,
            interactive_latency_ms,
            synthesis_latency_ms,
            lease_ttl_ms,
            backend,
            create,
            max_receive_count,
            queue_visibility_secs,
            dlq_sweep_secs,
        } => {
            let backend = match backend.as_str() {
                "aws" => DevBackend::Aws { create, aws: Default::default() },
                _ if create => return Err("--create needs --backend aws".into()),
                _ => DevBackend::Embedded,
            };
            let mut opts = DevOptions { addr, data_dir, capacity, backend, ..DevOptions::default() };
            opts.queue.max_receive_count = max_receive_count;
            opts.queue.default_visibility = Duration::from_secs(queue_visibility_secs);
            opts.offline_latency[0] = Duration::from_millis(interactive_latency_ms);
            opts.offline_latency[1] = Duration::from_millis(synthesis_latency_ms);
            opts.worker = opts
                .worker
                .with_lease(Duration::from_millis(lease_ttl_ms))
                .lanes_from_env()
                .map_err(|e| e.to_string())?;
            opts.ingress = lanes_core::config::IngressConfig::from_env().map_err(|e| e.to_string())?;
            opts.dlq_sweep_interval = Duration::from_secs(dlq_sweep_secs.max(1));
            let local = Local::build(&opts).await.map_err(|e| e.to_string())?;
            let shutdown = CancellationToken::new();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    stop.cancel();
                }
            });
            local.serve(&opts, shutdown).await.map_err(|e| e.to_string())
        }
        Command::Submit { url, project, kind, prompt, files } => {
            let body = serde_json::json!({"project_id": project, "kind": kind, "prompt": prompt, "target_files": files});
            let resp = reqwest::Client::new()
                .post(format!("{}/v1/tasks", url.trim_end_matches('/')))
                .json(&body)
                .send()
                .await
                .map_err(|e| format!("cannot reach {url}: {e}"))?;
            print_response(resp).await
        }
        Command::Bench { what: Bench::Recovery { scale_ms, json } } => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let r = lanes_core::bench::recovery_report(&exe, scale_ms).await?;
            if json {
                println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
                return Ok(());
            }
            println!("Crash recovery, 1 s = {} ms ({})", r.scale_ms, r.command);
            println!("{:<26} {:>12} {:>20} {:>14}", "config", "takeover ms", "takeover (workload)", "bound");
            for run in &r.runs {
                println!(
                    "{:<26} {:>12.0} {:>18.1} s {:>12.0} s",
                    run.config, run.takeover_ms, run.takeover_workload_s, run.bound_workload_s
                );
            }
            Ok(())
        }
        Command::Bench { what: Bench::Throughput { tasks, clients, json } } => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let r = lanes_core::bench::throughput_report(&exe, tasks, clients).await?;
            if json {
                println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
                return Ok(());
            }
            println!("Throughput, {} clients ({})", r.clients, r.command);
            println!(
                "{:<14} {:>7} {:>11} {:>22} {:>9} {:>22} {:>10}",
                "backend",
                "tasks",
                "ingress/s",
                "ingress p50/p99 ms",
                "tasks/s",
                "task p50/p99 ms",
                "peak MiB"
            );
            for run in &r.runs {
                println!(
                    "{:<14} {:>7} {:>11.0} {:>14.1} / {:>5.1} {:>9.0} {:>14.0} / {:>5.0} {:>10.1}",
                    run.backend,
                    run.tasks,
                    run.ingress_per_s,
                    run.ingress_latency_ms[0],
                    run.ingress_latency_ms[1],
                    run.tasks_per_s,
                    run.task_latency_ms[0],
                    run.task_latency_ms[1],
                    run.peak_rss_mib
                );
            }
            Ok(())
        }
        Command::Bench { what: Bench::Hol { slots, seconds, scale_ms, json } } => {
            let r = lanes_core::bench::hol_report(slots, seconds, scale_ms).await?;
            if json {
                println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
                return Ok(());
            }
            println!(
                "Head-of-line blocking, {} slots, 1 s = {} ms, {} interactive + {} synthesis tasks ({})",
                r.slots, r.scale_ms, r.tasks[0], r.tasks[1], r.command
            );
            println!(
                "{:<16} {:>14} {:>17} {:>16} {:>13} {:>11} {:>9}",
                "policy",
                "int. wait p99",
                "int. latency p50",
                "int. latency p99",
                "synthesis/s",
                "utilization",
                "makespan"
            );
            for run in &r.runs {
                println!(
                    "{:<16} {:>11.0} ms {:>14.0} ms {:>13.0} ms {:>13.2} {:>10.0}% {:>7.1} s",
                    run.policy,
                    run.interactive_wait_ms[1],
                    run.interactive_latency_ms[0],
                    run.interactive_latency_ms[1],
                    run.synthesis_per_s,
                    run.utilization * 100.0,
                    run.makespan_s
                );
            }
            println!(
                "70/30 interactive p99 / its service p99: {:.2} (target <= 1.2); FIFO / 70/30 p99: {:.1} (target >= 10); \
                 70/30 synthesis throughput / FIFO's: {:.2} (target >= 0.95)",
                r.interactive_p99_over_service, r.fifo_over_weighted, r.synthesis_vs_fifo
            );
            Ok(())
        }
        Command::Bench { what: Bench::Duplicates { deliveries, llm_ms, visibility_ms, json } } => {
            let r = lanes_core::bench::duplicates_report(deliveries, llm_ms, visibility_ms).await?;
            if json {
                println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
                return Ok(());
            }
            println!(
                "Duplicate deliveries, model {} ms, visibility {} ms, {} pollers ({})",
                r.llm_ms, r.visibility_ms, r.pollers, r.command
            );
            println!(
                "{:<8} {:<20} {:>10} {:>9} {:>16} {:>8} {:>9}",
                "flow", "config", "deliveries", "LLM calls", "rejected writes", "seconds", "finished"
            );
            for run in &r.runs {
                println!(
                    "{:<8} {:<20} {:>10} {:>9} {:>16} {:>8.1} {:>9}",
                    run.flow,
                    run.config,
                    run.deliveries,
                    run.llm_calls,
                    run.rejected_writes,
                    run.seconds,
                    run.finished
                );
            }
            Ok(())
        }
        Command::Bench { what: Bench::Batching { commits, rpm, tpm, json } } => {
            let r = lanes_core::bench::batching_report(commits, rpm, tpm).await?;
            if json {
                println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
                return Ok(());
            }
            println!("Commit micro-batching against the provider emulator ({})", r.command);
            println!(
                "{:<20} {:>9} {:>13} {:>17} {:>8} {:>6} {:>8}",
                "mode", "LLM calls", "prompt tokens", "completion tokens", "by rule", "429s", "seconds"
            );
            for run in &r.runs {
                println!(
                    "{:<20} {:>9} {:>13} {:>17} {:>8} {:>6} {:>8.1}",
                    run.mode,
                    run.llm_calls,
                    run.prompt_tokens,
                    run.completion_tokens,
                    run.rule_summaries,
                    run.throttled,
                    run.seconds
                );
            }
            Ok(())
        }
        Command::Bench { what: Bench::Limiter { rpm, tpm, requests, json } } => {
            let r = lanes_core::bench::limiter_report(rpm, tpm, requests).await?;
            if json {
                println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
            } else {
                println!("LLM limiter against the provider emulator ({})", r.command);
                println!("{:<58} {:>10}", "measure", "value");
                println!(
                    "{:<58} {:>10}",
                    format!("{} requests from {} workers: 429 answers", r.requests, r.workers),
                    r.throttled
                );
                println!(
                    "{:<58} {:>9.1}%",
                    "token throughput, of the limit (initial buckets included)",
                    r.throughput_of_limit * 100.0
                );
                println!(
                    "{:<58} {:>9.1}%",
                    "both lanes saturated: interactive share (reserved 70%)",
                    r.interactive_share_saturated * 100.0
                );
                println!(
                    "{:<58} {:>9.1}%",
                    "interactive idle: background throughput, of the limit",
                    r.background_alone_of_limit * 100.0
                );
            }
            Ok(())
        }
        Command::Summarize { repo, last, since, data_dir, json } => {
            let range = match since {
                Some(rev) => lanes_core::commits::summarize::Range::Since(rev),
                None => lanes_core::commits::summarize::Range::Last(last.unwrap_or(20)),
            };
            summarize(&repo, &range, &data_dir, json).await
        }
        Command::Dlq { what } => dlq::run(what).await.map_err(|e| e.to_string()),
        Command::Status { url, task_id } => {
            let resp = reqwest::get(format!("{}/v1/tasks/{task_id}", url.trim_end_matches('/')))
                .await
                .map_err(|e| format!("cannot reach {url}: {e}"))?;
            print_response(resp).await
        }
    }
}

async fn print_response(resp: reqwest::Response) -> Result<(), String> {
    let status = resp.status();
    let text = resp.text().await.map_err(|e| e.to_string())?;
    println!("{text}");
    if status.is_client_error() || status.is_server_error() {
        return Err(format!("server answered {status}"));
    }
    Ok(())
}

async fn summarize(
    repo: &std::path::Path,
    range: &lanes_core::commits::summarize::Range,
    data_dir: &std::path::Path,
    json: bool,
) -> Result<(), String> {
    use std::io::IsTerminal;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} summarizing [{bar:30}] {pos}/{len} commits {elapsed}",
        )
        .map_err(|e| e.to_string())?
        .progress_chars("=> "),
    );
    // Only on a terminal: a pipe or a log file gets the result alone.
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let report = lanes_core::commits::summarize::run_local(repo, range, data_dir, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .await
    .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!("{:<10}  {:<40}  {:>6}  {:<6}  summary", "sha", "subject", "tokens", "source");
    for row in &report.summaries {
        println!(
            "{:<10}  {:<40}  {:>6}  {:<6}  {}",
            &row.sha[..10.min(row.sha.len())],
            clip(&row.subject, 40),
            row.tokens,
            row.source,
            clip(&row.summary, 100)
        );
    }
    println!(
        "\n{} commits: {} LLM call(s), {} from cache, {} by rule, {} failed; {} prompt + {} completion tokens",
        report.commits,
        report.llm_calls,
        report.cache_hits,
        report.rule_summaries,
        report.failed,
        report.prompt_tokens,
        report.completion_tokens
    );
    Ok(())
}

fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n.saturating_sub(1)) {
        Some((i, _)) if s.chars().count() > n => format!("{}…", &s[..i]),
        _ => s.to_owned(),
    }
}
