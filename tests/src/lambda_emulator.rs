//! A Lambda that keeps `template.yaml`'s word, for the end-to-end tests: each function runs as the
//! real binary (the one `sam build` packs as `bootstrap`), with the settings its template entry gives
//! it, behind an implementation of the documented Lambda Runtime API
//! (`/2018-06-01/runtime/invocation/next`, `.../{id}/response`, `.../{id}/error`, `/init/error`).
//!
//! What `cargo lambda watch` leaves out, and this enforces:
//! - **`Timeout`.** Each invocation's `Lambda-Runtime-Deadline-Ms` is a real Unix time `Timeout`
//!   ahead, and an invocation still running then is killed (`SIGKILL`, the whole environment, as
//!   Lambda does) and reported as [`Outcome::TimedOut`]; the next invocation cold-starts a new one.
//! - **Environment.** `Globals` merged with the function's own variables; a `!Ref` to a parameter
//!   takes its default, and every other reference (a queue URL, the table) must be given by the
//!   test or dropped with a reason ([`FunctionSpec::set`], [`FunctionSpec::drop_var`]).
//! - **Reserved concurrency.** At most that many environments at once; one more invocation is
//!   [`Outcome::Throttled`], as Lambda answers `429 TooManyRequestsException`.
//! - **Event source settings.** A worker's mapping (`BatchSize`, batching window,
//!   `MaximumConcurrency`), so the test builds the batches Lambda would.

use serde_norway::Value as Yaml;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Lambda's limit on a function's init phase.
const INIT_LIMIT: Duration = Duration::from_secs(10);
/// Environments a function with no reserved concurrency may have here at once.
const UNRESERVED_LIMIT: usize = 10;

/// An SQS event source mapping's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// `BatchSize`.
    pub batch_size: usize,
    /// `MaximumBatchingWindowInSeconds`.
    pub window_secs: u64,
    /// `ScalingConfig.MaximumConcurrency`.
    pub max_concurrency: usize,
}

/// One function as `template.yaml` declares it.
#[derive(Clone, Debug)]
pub struct FunctionSpec {
    /// Its logical id.
    pub logical_id: String,
    /// The workspace binary it runs.
    pub binary: String,
    /// `Timeout` (the function's, else `Globals`').
    pub timeout: Duration,
    /// `MemorySize`.
    pub memory_mb: u64,
    /// `ReservedConcurrentExecutions` (a parameter's default when it is a `!Ref`).
    pub reserved: Option<usize>,
    /// Its SQS event source mapping, if it has one.
    pub mapping: Option<Mapping>,
    env: BTreeMap<String, String>,
    /// Variables the template sets from resources, which the test must give or drop.
    unresolved: Vec<String>,
}

fn template() -> Yaml {
    let path = crate::workspace_root().join("template.yaml");
    serde_norway::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("template: {e}")))
        .unwrap_or_else(|e| panic!("template: {e}"))
}

/// A `!Ref` target, if `v` is one.
fn reference(v: &Yaml) -> Option<&str> {
    match v {
        Yaml::Tagged(t) if t.tag == "!Ref" => t.value.as_str(),
        _ => None,
    }
}

/// A literal, or a parameter's default; None for anything a resource decides.
fn resolve(t: &Yaml, v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        _ => {
            let default = &t["Parameters"][reference(v)?]["Default"];
            if default.is_null() { None } else { resolve(t, default) }
        }
    }
}

impl FunctionSpec {
    /// The function `logical_id` of `template.yaml`.
    pub fn from_template(logical_id: &str) -> Self {
        let t = template();
        let f = &t["Resources"][logical_id];
        assert_eq!(f["Type"], "AWS::Serverless::Function", "{logical_id} is a function");
        let p = &f["Properties"];
        let g = &t["Globals"]["Function"];
        let pick = |k: &str| if p[k].is_null() { g[k].clone() } else { p[k].clone() };
        let number = |v: Yaml| resolve(&t, &v).and_then(|s| s.parse::<u64>().ok());
        let (mut env, mut unresolved) = (BTreeMap::new(), Vec::new());
        for vars in [&g["Environment"]["Variables"], &p["Environment"]["Variables"]] {
            for (k, v) in vars.as_mapping().into_iter().flatten() {
                let k = k.as_str().unwrap_or_default().to_owned();
                match resolve(&t, v) {
                    Some(v) => {
                        unresolved.retain(|u| u != &k);
                        env.insert(k, v);
                    }
                    None => unresolved.push(k),
                }
            }
        }
        let mapping = t["Resources"].as_mapping().into_iter().flatten().find_map(|(_, r)| {
            let m = &r["Properties"];
            (r["Type"] == "AWS::Lambda::EventSourceMapping"
                && reference(&m["FunctionName"]) == Some(logical_id))
            .then(|| Mapping {
                batch_size: number(m["BatchSize"].clone()).unwrap_or(10) as usize,
                window_secs: number(m["MaximumBatchingWindowInSeconds"].clone()).unwrap_or(0),
                max_concurrency: number(m["ScalingConfig"]["MaximumConcurrency"].clone()).unwrap_or(1000)
                    as usize,
            })
        });
        Self {
            logical_id: logical_id.to_owned(),
            binary: f["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap_or_default().to_owned(),
            timeout: Duration::from_secs(number(pick("Timeout")).unwrap_or(3)),
            memory_mb: number(pick("MemorySize")).unwrap_or(128),
            reserved: number(p["ReservedConcurrentExecutions"].clone()).map(|n| n as usize),
            mapping,
            env,
            unresolved,
        }
    }

    /// A function the template does not declare (the emulator's own tests): `binary`, `timeout`, no
    /// variables.
    pub fn bare(binary: &str, timeout: Duration, reserved: Option<usize>) -> Self {
        Self {
            logical_id: binary.to_owned(),
            binary: binary.to_owned(),
            timeout,
            memory_mb: 128,
            reserved,
            mapping: None,
            env: BTreeMap::new(),
            unresolved: Vec::new(),
        }
    }

    /// Gives `name` the value the stack would (a queue URL, the table), or overrides the template's.
    pub fn set(mut self, name: &str, value: impl Into<String>) -> Self {
        self.unresolved.retain(|u| u != name);
        self.env.insert(name.to_owned(), value.into());
        self
    }

    /// Another `Timeout` (a test of how the code behaves under a shorter one).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Gives every pair of `vars`.
    pub fn set_all(self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        vars.into_iter().fold(self, |s, (k, v)| s.set(&k, v))
    }

    /// Leaves out a variable the template sets, saying why the test can do without it.
    pub fn drop_var(mut self, name: &str, why: &str) -> Self {
        assert!(!why.is_empty(), "say why {name} is left out");
        assert!(
            self.env.contains_key(name) || self.unresolved.iter().any(|u| u == name),
            "{name} is not set"
        );
        self.unresolved.retain(|u| u != name);
        self.env.remove(name);
        self
    }

    /// The function's environment as the template gives it, with the test's values.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }
}

/// How an invocation ended.
#[derive(Debug)]
pub enum Outcome {
    /// The function answered.
    Answered(serde_json::Value),
    /// The function reported an error (`/error`).
    Failed(serde_json::Value),
    /// Still running at `Timeout`: its environment was killed.
    TimedOut,
    /// Reserved concurrency reached (Lambda's 429).
    Throttled,
    /// The environment did not start (`/init/error`, an exit, or past the init limit).
    InitFailed(String),
}

impl Outcome {
    /// The answer, or a panic naming what happened instead.
    pub fn answer(self) -> serde_json::Value {
        match self {
            Outcome::Answered(v) => v,
            other => panic!("expected an answer, got {other:?}"),
        }
    }
}

struct Pending {
    id: String,
    payload: serde_json::Value,
    started: oneshot::Sender<()>,
    done: oneshot::Sender<Outcome>,
}

/// The Runtime API of one environment.
struct RuntimeApi {
    next: tokio::sync::Mutex<mpsc::Receiver<Pending>>,
    running: Mutex<HashMap<String, oneshot::Sender<Outcome>>>,
    init_error: Mutex<Option<String>>,
    timeout: Duration,
    function: String,
}

/// One execution environment: a process of the binary and its own Runtime API endpoint.
struct Environment {
    child: Child,
    send: mpsc::Sender<Pending>,
    api: Arc<RuntimeApi>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Environment {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.server.abort();
    }
}

/// A function running under the emulator.
pub struct LambdaFunction {
    spec: FunctionSpec,
    idle: Mutex<Vec<Environment>>,
    busy: Mutex<usize>,
    log_path: PathBuf,
    invocations: std::sync::atomic::AtomicU64,
}

impl LambdaFunction {
    /// Runs `spec`'s function with `base` (the AWS endpoint and credentials) under its own variables.
    /// Panics when a variable the template sets from a resource was neither given nor dropped.
    pub fn start(spec: FunctionSpec) -> Self {
        assert!(spec.unresolved.is_empty(), "{}: give or drop {:?}", spec.logical_id, spec.unresolved);
        let log_path =
            std::env::temp_dir().join(format!("lanes-lambda-{}-{}.log", spec.logical_id, crate::free_port()));
        eprintln!("{} under the Lambda emulator, log in {}", spec.logical_id, log_path.display());
        std::fs::File::create(&log_path).unwrap_or_else(|e| panic!("log: {e}"));
        Self {
            spec,
            idle: Mutex::new(Vec::new()),
            busy: Mutex::new(0),
            log_path,
            invocations: Default::default(),
        }
    }

    /// The settings it runs with.
    pub fn spec(&self) -> &FunctionSpec {
        &self.spec
    }

    /// What its environments printed so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The resident memory of each idle environment, KiB: now (`VmRSS`) and at its peak (`VmHWM`).
    /// Busy ones are left out; between invocations every environment is idle.
    pub fn memory_kib(&self) -> Vec<(u64, u64)> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.iter().filter_map(|env| crate::resident_kib(env.child.id())).collect()
    }

    /// Invocations so far.
    pub fn invocations(&self) -> u64 {
        self.invocations.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Invokes it with `payload` (a synchronous invoke), and says how that ended.
    pub async fn invoke(&self, payload: &serde_json::Value) -> Outcome {
        let env = {
            let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
            let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let limit = self.spec.reserved.unwrap_or(UNRESERVED_LIMIT);
            if idle.is_none() && *busy >= limit {
                return Outcome::Throttled;
            }
            *busy += 1;
            idle
        };
        let outcome = self.run(env, payload).await;
        *self.busy.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        outcome
    }

    async fn run(&self, env: Option<Environment>, payload: &serde_json::Value) -> Outcome {
        let mut env = match env {
            Some(e) => e,
            None => match self.cold_start().await {
                Ok(e) => e,
                Err(why) => return Outcome::InitFailed(why),
            },
        };
        let n = self.invocations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (started, started_rx) = oneshot::channel();
        let (done, done_rx) = oneshot::channel();
        let pending =
            Pending { id: format!("req-{n}-{}", crate::now_ms()), payload: payload.clone(), started, done };
        if env.send.send(pending).await.is_err() {
            return Outcome::InitFailed("the environment is gone".into());
        }
        // The deadline runs from the hand-over (`/next`): a cold start's init has its own limit.
        if tokio::time::timeout(INIT_LIMIT, started_rx).await.is_err() {
            let why = env.api.init_error.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let exited = env.child.try_wait().ok().flatten();
            return Outcome::InitFailed(format!("{why:?}, exit {exited:?}"));
        }
        match tokio::time::timeout(self.spec.timeout, done_rx).await {
            Ok(Ok(outcome)) => {
                self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(env);
                outcome
            }
            // Lambda's words for it, in the function's log; the environment is dropped (killed).
            Ok(Err(_)) => Outcome::InitFailed("the environment exited mid-invocation".into()),
            Err(_) => {
                self.note(&format!("Task timed out after {:.2} seconds", self.spec.timeout.as_secs_f64()));
                Outcome::TimedOut
            }
        }
    }

    fn note(&self, line: &str) {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&self.log_path) {
            let _ = writeln!(f, "[emulator] {}: {line}", self.spec.logical_id);
        }
    }

    async fn cold_start(&self) -> Result<Environment, String> {
        let (send, next) = mpsc::channel(1);
        let api = Arc::new(RuntimeApi {
            next: tokio::sync::Mutex::new(next),
            running: Mutex::new(HashMap::new()),
            init_error: Mutex::new(None),
            timeout: self.spec.timeout,
            function: self.spec.logical_id.clone(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let server = tokio::spawn({
            let router = runtime_api(api.clone());
            async move {
                let _ = axum::serve(listener, router).await;
            }
        });
        let log = std::fs::OpenOptions::new().append(true).open(&self.log_path).map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let s = &self.spec;
        let child = Command::new(crate::workspace_bin(&s.binary))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(&s.env)
            .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", &s.logical_id)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", s.memory_mb.to_string())
            .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{}", s.logical_id))
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "emulated")
            .env("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{}: {e}", s.binary))?;
        Ok(Environment { child, send, api, server })
    }
}

fn header(v: impl AsRef<str>) -> axum::http::HeaderValue {
    axum::http::HeaderValue::from_str(v.as_ref()).unwrap_or(axum::http::HeaderValue::from_static(""))
}

/// The documented Runtime API, for one environment.
fn runtime_api(api: Arc<RuntimeApi>) -> axum::Router {
    use axum::extract::{Path, State};
    use axum::response::IntoResponse;
    let finish = |api: &RuntimeApi, id: &str, outcome: Outcome| {
        if let Some(done) = api.running.lock().unwrap_or_else(|e| e.into_inner()).remove(id) {
            let _ = done.send(outcome);
        }
        axum::http::StatusCode::ACCEPTED
    };
    axum::Router::new()
        .route(
            "/2018-06-01/runtime/invocation/next",
            axum::routing::get(|State(api): State<Arc<RuntimeApi>>| async move {
                let Some(p) = api.next.lock().await.recv().await else {
                    return axum::http::StatusCode::GONE.into_response();
                };
                let deadline = crate::now_ms() + api.timeout.as_millis() as u64;
                api.running.lock().unwrap_or_else(|e| e.into_inner()).insert(p.id.clone(), p.done);
                let _ = p.started.send(());
                let arn = format!("arn:aws:lambda:us-east-1:123456789012:function:{}", api.function);
                let mut resp = axum::Json(p.payload).into_response();
                let h = resp.headers_mut();
                h.insert("lambda-runtime-aws-request-id", header(&p.id));
                h.insert("lambda-runtime-deadline-ms", header(deadline.to_string()));
                h.insert("lambda-runtime-invoked-function-arn", header(arn));
                h.insert("lambda-runtime-trace-id", header(format!("Root=1-{:08x}-{:024x};Sampled=0", deadline / 1000, deadline)));
                resp
            }),
        )
        .route(
            "/2018-06-01/runtime/invocation/{id}/response",
            axum::routing::post(move |State(api): State<Arc<RuntimeApi>>, Path(id): Path<String>, body: axum::body::Bytes| async move {
                let v = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                finish(&api, &id, Outcome::Answered(v))
            }),
        )
        .route(
            "/2018-06-01/runtime/invocation/{id}/error",
            axum::routing::post(move |State(api): State<Arc<RuntimeApi>>, Path(id): Path<String>, body: axum::body::Bytes| async move {
                let v = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                finish(&api, &id, Outcome::Failed(v))
            }),
        )
        .route(
            "/2018-06-01/runtime/init/error",
            axum::routing::post(|State(api): State<Arc<RuntimeApi>>, body: String| async move {
                *api.init_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(body);
                axum::http::StatusCode::ACCEPTED
            }),
        )
        .with_state(api)
}

/// The SQS event Lambda's event source mapping would hand the worker for `received` (at most the
/// mapping's `BatchSize` of them), in the documented record shape.
pub fn sqs_event(received: &[lanes_core::ports::ReceivedMessage], queue_arn: &str) -> serde_json::Value {
    let records: Vec<serde_json::Value> = received
        .iter()
        .map(|m| {
            let attributes: serde_json::Map<String, serde_json::Value> = m
                .attributes
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::json!({"stringValue": v, "dataType": "String"})))
                .collect();
            serde_json::json!({
                "messageId": m.message_id.to_string(),
                "receiptHandle": m.receipt,
                "body": m.body,
                "attributes": {"ApproximateReceiveCount": m.receive_count.to_string(), "SentTimestamp": m.sent_at_ms.to_string()},
                "messageAttributes": attributes,
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": "us-east-1"
            })
        })
        .collect();
    serde_json::json!({ "Records": records })
}
