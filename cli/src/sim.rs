//! `lanes sim [--seed S] [--histories N] [--json]`: the lifecycle simulation (`lanes-sim`). Runs N
//! histories from seed S (one replays a seed), prints per invariant how many histories exercised it
//! and how many broke it, and each failing seed with the trace that led to it. Fails when any
//! invariant broke.

use crate::CliError;
use clap::Args;

/// The simulation's arguments.
#[derive(Args)]
pub struct SimArgs {
    /// First seed (a history's seed decides all of it: the same seed replays it).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Histories to run, seeds `seed`, `seed + 1`, ...
    #[arg(long, default_value_t = 1000)]
    histories: u64,
    /// Threads (each runs histories one at a time); the machine's cores when absent.
    #[arg(long)]
    threads: Option<usize>,
    /// Stop after this many failing histories.
    #[arg(long)]
    stop_after: Option<usize>,
    /// Simulated seconds of a history's busy phase (faults on); a calm phase follows.
    #[arg(long, default_value_t = 600)]
    busy_secs: u64,
    /// Clients per history.
    #[arg(long, default_value_t = 5)]
    clients: usize,
    /// Distinct payloads the clients share.
    #[arg(long, default_value_t = 8)]
    payloads: usize,
    /// Print the first history's whole trace (for replaying one seed).
    #[arg(long)]
    trace: bool,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs it.
pub fn run(args: SimArgs) -> Result<(), CliError> {
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let options = lanes_sim::Options {
        busy: std::time::Duration::from_secs(args.busy_secs),
        clients: args.clients,
        payloads: args.payloads,
        full_trace: args.trace,
        ..Default::default()
    };
    if args.trace {
        // Its own thread: a history runs on a runtime of its own, not inside the CLI's.
        let seed = args.seed;
        let replay = std::thread::spawn(move || lanes_sim::history::run(seed, &options)).join();
        for line in replay.ok().and_then(|r| r.trace).unwrap_or_default() {
            println!("{line}");
        }
    }
    let summary = lanes_sim::run_many(args.seed, args.histories, threads, &options, args.stop_after);
    let command = format!(
        "lanes sim --seed {} --histories {} --busy-secs {} --clients {} --payloads {}",
        args.seed, args.histories, args.busy_secs, args.clients, args.payloads
    );
    if args.json {
        let mut v = serde_json::to_value(&summary)?;
        v["command"] = serde_json::Value::String(format!("{command} --json"));
        // The rate depends on it: the report says which build ran.
        v["build"] = serde_json::Value::from(if cfg!(debug_assertions) { "debug" } else { "release" });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_table(&summary, &command);
    }
    match summary.violation_count() {
        0 => Ok(()),
        n => Err(CliError::Bench(format!("{n} invariant violations; replay with --seed S --histories 1"))),
    }
}

fn print_table(s: &lanes_sim::Summary, command: &str) {
    println!("# {command}");
    println!(
        "{} histories in {:.1} s ({:.0} a minute), {:.1} faults and {:.0} simulated s each, {} runs",
        s.histories,
        s.elapsed_secs,
        s.histories_per_minute,
        s.faults_per_history,
        s.simulated_secs_per_history,
        s.runs
    );
    println!("{:<10} {:>10} {:>11}", "invariant", "exercised", "violations");
    for (name, exercised) in &s.exercised {
        println!("{:<10} {:>10} {:>11}", name, exercised, s.violations.get(name).copied().unwrap_or(0));
    }
    let dist: Vec<String> = s.calls_per_run.iter().map(|(c, n)| format!("{c}: {n}")).collect();
    println!(
        "model calls per run (calls: tasks): {}; justified extra calls: {}",
        dist.join(", "),
        s.justified_extra_calls
    );
    println!(
        "answers continued from a lost run's saved text: {} ({} completion tokens not paid for again)",
        s.continued_answers, s.tokens_saved
    );
    for f in &s.failures {
        for v in &f.violations {
            println!("\nseed {} broke {} on task {}: {}", f.seed, v.invariant, v.task, v.detail);
            for line in &v.trace {
                println!("    {line}");
            }
        }
    }
}
