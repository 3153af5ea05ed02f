//! `lanes bench functions`: the memory of each Lambda function through a stream of tasks. The real
//! binaries run under the harness's Lambda emulator with their `template.yaml` settings (`ingress`,
//! and `worker` as the interactive and the synthesis lane's functions), against moto and
//! redis-server; ingress is invoked with API Gateway events, and each worker with the SQS batches its
//! event source mapping would build (its `BatchSize`), the mapping's deletes included. Warm
//! environments are reused, as Lambda reuses them, so a leak shows as resident memory that grows
//! from one tenth of the run to the next.
//!
//! Reported per function and per tenth: the largest resident set (`VmRSS`) of its environments at
//! the end of the tenth, and the peak (`VmHWM`) of any of them over the run.

use crate::goals::{Goal, Unit, write_goals};
use lanes_core::domain::{Lane, TaskStatus};
use lanes_core::ports::{QueueConsume, TaskStore};
use lanes_tests::lambda_emulator::{FunctionSpec, LambdaFunction, Outcome, sqs_event};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// One function through the run.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionMemory {
    /// The function, as the template names it.
    pub function: String,
    /// Invocations over the run.
    pub invocations: u64,
    /// Warm environments at the end.
    pub environments: usize,
    /// The largest resident set of its environments at the end of each tenth, MiB.
    pub rss_mib: Vec<f64>,
    /// The largest peak resident set (`VmHWM`) of any of its environments, MiB.
    pub peak_mib: f64,
    /// The last tenth's resident set over the first's: the growth after the warm-up.
    pub last_over_first: f64,
    /// The growth from the first tenth's end to the last's, per invocation in between, KiB: a leak
    /// of a few hundred bytes a call, which the ratio would hide, shows here.
    pub growth_kib_per_invocation: f64,
}

/// What `lanes bench functions` reports.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionsReport {
    /// The command that reproduces it.
    pub command: String,
    /// Tasks submitted (one in ten to the synthesis lane).
    pub tasks: usize,
    /// Ingress invocations at once.
    pub concurrency: usize,
    /// Wall time of the run, seconds.
    pub seconds: f64,
    /// Each function, in the order of the pipeline.
    pub functions: Vec<FunctionMemory>,
    /// Tasks not `COMPLETED` at the end.
    pub unfinished: usize,
    /// The goal lines, from the figures above.
    pub goals: Vec<Goal>,
}

/// The pieces of the run: the services, the functions and the queues their mappings read.
struct Run {
    _services: (lanes_tests::MotoServer, lanes_tests::RedisServer),
    ingress: Arc<LambdaFunction>,
    workers: Vec<Worker>,
    store: Arc<dyn TaskStore>,
}

/// A worker function: the function, the queue its mapping reads, its `BatchSize` and the queue's ARN.
type Worker = (Arc<LambdaFunction>, Arc<dyn QueueConsume>, usize, String);

/// Streams `tasks` tasks through the functions, `concurrency` ingress invocations at a time.
pub async fn functions_report(tasks: usize, concurrency: usize) -> Result<FunctionsReport, String> {
    let tasks = tasks.max(10);
    let run = start().await?;
    let started = Instant::now();
    let mut ids = Vec::with_capacity(tasks);
    let mut tenths: Vec<Vec<(u64, u64)>> = Vec::new();
    // Invocations per function at the end of the first tenth.
    let mut after_first = Vec::new();
    for k in 0..10 {
        let range = tasks * k / 10..tasks * (k + 1) / 10;
        ids.extend(submit(&run.ingress, range, concurrency).await?);
        drain(&run).await?;
        tenths.push(max_memory(&run));
        if k == 0 {
            after_first = all_functions(&run).iter().map(|f| f.invocations()).collect();
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut unfinished = 0;
    let now = lanes_tests::now_ms();
    for id in &ids {
        let rec =
            run.store.get(&id.parse().map_err(|e| format!("{e}"))?, now).await.map_err(|e| e.to_string())?;
        if rec.map(|r| r.status) != Some(TaskStatus::Completed) {
            unfinished += 1;
        }
    }
    let functions = all_functions(&run)
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let rss_mib: Vec<f64> = tenths.iter().map(|t| t[i].0 as f64 / 1024.0).collect();
            let since = f.invocations().saturating_sub(after_first[i]).max(1) as f64;
            // A function first invoked after the first tenth (a short run's synthesis worker) is
            // measured from the tenth that gave it an environment.
            let first = rss_mib.iter().position(|&m| m > 0.0).unwrap_or(0);
            FunctionMemory {
                function: f.spec().logical_id.clone(),
                invocations: f.invocations(),
                environments: f.memory_kib().len(),
                peak_mib: tenths.iter().map(|t| t[i].1).max().unwrap_or(0) as f64 / 1024.0,
                last_over_first: rss_mib[9] / rss_mib[first].max(1e-9),
                growth_kib_per_invocation: (tenths[9][i].0 as f64 - tenths[first][i].0 as f64) / since,
                rss_mib,
            }
        })
        .collect();
    Ok(FunctionsReport {
        command: format!("lanes bench functions --tasks {tasks} --concurrency {concurrency}"),
        tasks,
        concurrency,
        seconds,
        functions,
        unfinished,
        goals: Vec::new(),
    }
    .judged())
}

/// moto and redis-server with the stack's resources, the functions as the template declares them,
/// and the adapters the mapping and the final check use.
async fn start() -> Result<Run, String> {
    let ((moto, redis, mut vars), urls) = crate::aws_stack().await?;
    vars.push(("LANES_METRICS_NAMESPACE".into(), "Lanes/bench".into()));
    let spec = |logical_id: &str| {
        FunctionSpec::from_template(logical_id)
            .set_all(vars.clone())
            .set("LANES_REDIS_CLUSTER", "false")
            .drop_var("LANES_REDIS_USER", "the bench's redis-server has only the default user")
            .drop_var("LANES_REDIS_PASSWORD_SECRET", "the bench's redis-server asks no password")
    };
    let config = lanes_core::wiring::AwsBackendConfig {
        aws: moto.aws_settings(),
        table: crate::STACK_TABLE.into(),
        queue_urls: urls.clone(),
        redis: redis.settings(false),
        redrive: None,
        results_bucket: None,
    };
    let adapters = lanes_core::wiring::aws(&config, &[Lane::Interactive, Lane::Synthesis])
        .await
        .map_err(|e| e.to_string())?;
    let mut workers = Vec::new();
    for (logical_id, lane) in
        [("InteractiveWorkerFunction", Lane::Interactive), ("SynthesisWorkerFunction", Lane::Synthesis)]
    {
        let worker = spec(logical_id)
            .drop_var("LANES_LLM_API_KEY_SECRET", "the template's default provider, offline, needs no key");
        let batch = worker.mapping.as_ref().map_or(1, |m| m.batch_size);
        let arn = format!("arn:aws:sqs:us-east-1:123456789012:lanes-{}", lane.as_str());
        let queue = adapters.consume[lane.index()].clone();
        workers.push((Arc::new(LambdaFunction::start(worker)), queue, batch, arn));
    }
    Ok(Run {
        ingress: Arc::new(LambdaFunction::start(spec("IngressFunction"))),
        workers,
        store: adapters.store.clone(),
        _services: (moto, redis),
    })
}

/// Posts tasks `range` through ingress, `concurrency` at a time: their ids. One task in ten is a
/// synthesis task.
async fn submit(
    ingress: &Arc<LambdaFunction>,
    range: std::ops::Range<usize>,
    concurrency: usize,
) -> Result<Vec<String>, String> {
    let template = event("api-post-task.json")?;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(range.start));
    let mut handles = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (ingress, next, template, end) = (ingress.clone(), next.clone(), template.clone(), range.end);
        handles.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= end {
                    return Ok::<_, String>(ids);
                }
                let kind = if i % 10 == 9 { "refactor" } else { "explain" };
                let mut e = template.clone();
                e["body"] = serde_json::json!({"project_id": "bench", "kind": kind,
                    "prompt": format!("bench task {i}"), "target_files": []})
                .to_string()
                .into();
                let answer = answered(ingress.invoke(&e).await, "ingress")?;
                let body: Value =
                    serde_json::from_str(answer["body"].as_str().unwrap_or("")).unwrap_or_default();
                match (answer["statusCode"].as_u64(), body["task_id"].as_str()) {
                    (Some(202), Some(id)) => ids.push(id.to_owned()),
                    _ => return Err(format!("ingress did not accept task {i}: {answer}")),
                }
            }
        }));
    }
    let mut ids = Vec::new();
    for h in handles {
        ids.extend(h.await.map_err(|e| e.to_string())??);
    }
    Ok(ids)
}

/// Runs each worker on the batches its mapping would build, until both queues are empty: the
/// mapping deletes what the answer does not name as failed.
async fn drain(run: &Run) -> Result<(), String> {
    loop {
        let mut any = false;
        for (worker, queue, batch, arn) in &run.workers {
            let received = queue.receive(*batch).await.map_err(|e| e.to_string())?;
            if received.is_empty() {
                continue;
            }
            any = true;
            let answer =
                answered(worker.invoke(&sqs_event(&received, arn)).await, &worker.spec().logical_id)?;
            let response = serde_json::from_value(answer.clone()).map_err(|e| format!("{answer}: {e}"))?;
            let records: Vec<_> = received.iter().map(lanes_tests::sqs_record).collect();
            lanes_tests::mapping_deletes(&**queue, &records, &response).await.map_err(|e| e.to_string())?;
        }
        if !any {
            let mut left = 0;
            for (_, queue, _, _) in &run.workers {
                let d = queue.depth().await.map_err(|e| e.to_string())?;
                left += d.visible + d.in_flight;
            }
            if left == 0 {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

/// The functions in the order of the pipeline: ingress, then the workers.
fn all_functions(run: &Run) -> Vec<&Arc<LambdaFunction>> {
    std::iter::once(&run.ingress).chain(run.workers.iter().map(|w| &w.0)).collect()
}

/// Per function (ingress, then the workers): the largest `VmRSS` and `VmHWM` of its environments.
fn max_memory(run: &Run) -> Vec<(u64, u64)> {
    all_functions(run)
        .into_iter()
        .map(|f| {
            let m = f.memory_kib();
            (m.iter().map(|x| x.0).max().unwrap_or(0), m.iter().map(|x| x.1).max().unwrap_or(0))
        })
        .collect()
}

fn answered(outcome: Outcome, function: &str) -> Result<Value, String> {
    match outcome {
        Outcome::Answered(v) => Ok(v),
        other => Err(format!("{function}: {other:?}")),
    }
}

fn event(name: &str) -> Result<Value, String> {
    let path = lanes_tests::workspace_root().join("events").join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

impl FunctionsReport {
    fn judged(mut self) -> Self {
        let worst = crate::goals::worst(self.functions.iter().map(|f| f.last_over_first));
        let what = "every function's RSS, last tenth / first (flat after warm-up), worst";
        self.goals = vec![
            Goal::new("rss_last_over_first", what, worst).at_most(crate::goals::RSS_FLAT),
            Goal::new("unfinished", "tasks unfinished at the end", self.unfinished as f64)
                .at_most(0.0)
                .shown(Unit::Count, 0),
        ];
        self
    }
}

impl std::fmt::Display for FunctionsReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Lambda functions' memory: {} tasks, {} ingress invocations at once, {:.0} s ({})",
            self.tasks, self.concurrency, self.seconds, self.command
        )?;
        writeln!(
            f,
            "{:<28} {:>11} {:>5} {:>9} {:>9} {:>9} {:>12} {:>9}",
            "function", "invocations", "envs", "RSS 1st", "RSS last", "last/1st", "KiB/call", "peak"
        )?;
        for x in &self.functions {
            writeln!(
                f,
                "{:<28} {:>11} {:>5} {:>5.1} MiB {:>5.1} MiB {:>9.2} {:>12.3} {:>5.1} MiB",
                x.function,
                x.invocations,
                x.environments,
                x.rss_mib[0],
                x.rss_mib[9],
                x.last_over_first,
                x.growth_kib_per_invocation,
                x.peak_mib
            )?;
        }
        write_goals(f, &self.goals)
    }
}
