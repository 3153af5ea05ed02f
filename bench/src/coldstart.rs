//! `lanes bench coldstart`: the Lambda functions' package size and init duration, against a
//! hello-world `lambda_runtime` function built the same way (`bench/hello`).
//!
//! - **Size**: every function is built as `sam build` builds it (cargo-lambda, release profile,
//!   arm64), zipped by cargo-lambda; the zip is what is uploaded.
//! - **Init**: the same build for this machine's architecture is started under a local runtime-API
//!   emulator, with the environment the template gives it, pointed at moto and redis-server (a
//!   standalone one: `LANES_REDIS_CLUSTER` is left out; Redis connects lazily anyway), the AWS SDK
//!   trusting Amazon's roots as it does in Lambda, and any other TLS roots read from one bundle file
//!   as in Lambda ([`lambda_like_roots`]). Init is the time from `exec` to the function's first
//!   `GET /runtime/invocation/next`: everything `main` does before it can take an event
//!   (configuration, SDK clients). Each start is an on-demand cold start, as Lambda announces it
//!   (`AWS_LAMBDA_INITIALIZATION_TYPE=on-demand`): its first event is already waiting, so the
//!   functions read their secrets at first use rather than during init. The median of `starts`
//!   starts, the functions taken in turn so that machine noise spreads evenly.
//! - **First response** (the webhook): the emulator answers its first poll with a signed GitHub
//!   `ping` and times the answer, from `exec` again: init, the secret's read and the verification.
//!   It is also measured for an init that reads the secrets ahead (started as
//!   `provisioned-concurrency`, but given its event at its first poll like the others: what reading
//!   ahead costs and buys, not provisioned concurrency's latency), reported apart and not held to
//!   the init goal, since an init that reads ahead is one that runs before any event.

use crate::goals::{Goal, Unit, write_goals};
use crate::percentile;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The goals: every function's init at most this many times the baseline's.
pub const MAX_INIT_RATIO: f64 = 2.0;
/// The goals: every zip at most this size.
pub const MAX_ZIP_BYTES: u64 = 8 * 1024 * 1024;

/// One binary's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Measure {
    /// Median init, ms (exec to the first `invocation/next`).
    pub init_ms: f64,
    /// 90th percentile init, ms.
    pub init_p90_ms: f64,
    /// The arm64 deployment zip, bytes.
    pub zip_bytes: u64,
    /// Median time from exec to the answer to a first event, ms (the webhook's signed ping).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_response_ms: Option<f64>,
}

/// What `lanes bench coldstart` reports.
#[derive(Debug, Clone, Serialize)]
pub struct ColdStartReport {
    /// The command that reproduces it.
    pub command: String,
    /// Architecture the init was measured on (the zips are arm64, as deployed).
    pub init_arch: String,
    /// Starts per function.
    pub starts: usize,
    /// Per function (the worker twice: a task lane, and the commits lane with its tokenizer).
    pub functions: BTreeMap<String, Measure>,
    /// The hello-world function.
    pub baseline: Measure,
    /// Functions whose init reads their secrets ahead (`provisioned-concurrency`): for the cost of
    /// that, not held to the init goal.
    pub read_ahead: BTreeMap<String, Measure>,
    /// Whether every function is within [`MAX_INIT_RATIO`] of the baseline's init and under
    /// [`MAX_ZIP_BYTES`].
    pub within_goals: bool,
    /// The goal lines: the worst function's init over the baseline's, the largest zip.
    pub goals: Vec<Goal>,
}

/// A function as the bench runs it: its name in the report, its binary, its own environment,
/// whether its first poll is answered with a signed ping (timing the first response), and whether
/// its init reads its secrets ahead (reported apart).
struct Function {
    name: &'static str,
    bin: &'static str,
    env: Vec<(String, String)>,
    ping: Option<&'static str>,
    read_ahead: bool,
}

/// Builds everything twice (arm64 zips, then this machine's binaries), then starts each binary
/// `starts` times under the runtime-API emulator.
pub async fn coldstart_report(starts: usize) -> Result<ColdStartReport, String> {
    let starts = starts.max(1);
    if !lanes_tests::services_available() {
        return Err("redis-server or moto_server is missing: run scripts/test-deps.sh".into());
    }
    let work = crate::temp_dir().map_err(|e| format!("temp dir: {e}"))?;
    let bins = ["ingress", "webhook", "worker", "controller", "hello"];
    let zips = work.join("arm64");
    build(&bins, &["--arm64", "--output-format", "zip"], &zips)?;
    let host = work.join("host");
    let host_flag = if std::env::consts::ARCH == "aarch64" { "--arm64" } else { "--x86-64" };
    build(&bins, &[host_flag], &host)?;
    let zip_bytes = |bin: &str| -> Result<u64, String> {
        let path = zips.join(bin).join("bootstrap.zip");
        std::fs::metadata(&path).map(|m| m.len()).map_err(|e| format!("{}: {e}", path.display()))
    };

    let (_moto, _redis, functions) = environments().await?;
    let api = RuntimeApi::start().await?;
    // Per function, in order: its init samples and its first-response samples.
    let mut samples = vec![(Vec::new(), Vec::new()); functions.len()];
    for _ in 0..starts {
        for (f, s) in functions.iter().zip(&mut samples) {
            let (init, first) = api.time_start(&host.join(f.bin).join("bootstrap"), &f.env, f.ping).await?;
            s.0.push(init);
            s.1.extend(first);
        }
    }
    let measure = |f: &Function, (init, first): &mut (Vec<f64>, Vec<f64>)| -> Result<Measure, String> {
        Ok(Measure {
            init_ms: percentile(init, 50.0),
            init_p90_ms: percentile(init, 90.0),
            zip_bytes: zip_bytes(f.bin)?,
            first_response_ms: (!first.is_empty()).then(|| percentile(first, 50.0)),
        })
    };
    let (mut baseline, mut out, mut read_ahead) = (None, BTreeMap::new(), BTreeMap::new());
    for (f, s) in functions.iter().zip(&mut samples) {
        let m = measure(f, s)?;
        match (f.name, f.read_ahead) {
            (BASELINE, _) => baseline = Some(m),
            (name, false) => drop(out.insert(name.to_owned(), m)),
            (name, true) => drop(read_ahead.insert(name.to_owned(), m)),
        }
    }
    let baseline = baseline.ok_or("no baseline")?;
    let worst_init = crate::goals::worst(out.values().map(|m| m.init_ms / baseline.init_ms.max(1e-9)));
    let largest_zip = out.values().map(|m| m.zip_bytes).max().unwrap_or(0) as f64 / 1_048_576.0;
    let goals = vec![
        Goal::new("init_over_baseline", "every function's init / the baseline's, worst", worst_init)
            .at_most(MAX_INIT_RATIO),
        Goal::new("zip_mib", "every function's zip, largest", largest_zip)
            .at_most(MAX_ZIP_BYTES as f64 / 1_048_576.0)
            .shown(Unit::Mib, 1),
    ];
    let within_goals = goals.iter().all(Goal::met);
    let _ = std::fs::remove_dir_all(&work);
    Ok(ColdStartReport {
        command: format!("lanes bench coldstart --starts {starts}"),
        init_arch: std::env::consts::ARCH.to_owned(),
        starts,
        functions: out,
        baseline,
        read_ahead,
        within_goals,
        goals,
    })
}

/// `cargo lambda build --release` of `bins` with `flags`, into `dir/<bin>/`, from the workspace root
/// (cargo-lambda and its zig from the project venv, as `sam build` finds them).
fn build(bins: &[&str], flags: &[&str], dir: &Path) -> Result<(), String> {
    let mut cmd = std::process::Command::new(lanes_tests::venv_bin("cargo-lambda"));
    cmd.args(["lambda", "build", "--release"]).args(flags).arg("--lambda-dir").arg(dir);
    for b in bins {
        cmd.args(["--bin", b]);
    }
    let venv_bin_dir = lanes_tests::venv_bin("cargo-lambda").parent().map(Path::to_path_buf);
    if let Some(d) = venv_bin_dir {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", d.display()));
    }
    eprintln!("lanes bench coldstart: cargo lambda build --release {}", flags.join(" "));
    let status = cmd
        .current_dir(lanes_tests::workspace_root())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cargo lambda: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo lambda build {} failed: {status}", flags.join(" ")))
    }
}

/// moto and redis-server with the template's resources (table, queues with DLQs, webhook secrets),
/// and each function's environment as the template sets it, pointed at them.
async fn environments() -> Result<(lanes_tests::MotoServer, lanes_tests::RedisServer, Vec<Function>), String>
{
    let ((moto, redis, mut common), _) = crate::aws_stack().await?;
    let github = moto.create_secret("lanes/github-webhook", WEBHOOK_SECRET).await?;
    let gitlab = moto.create_secret("lanes/gitlab-webhook", "bench-token").await?;
    // The commits worker's API tokens, as a stack with private repositories configures them (read
    // at first use in an on-demand cold start, like the webhook's secrets).
    let github_token = moto.create_secret("lanes/github-token", "bench-github-token").await?;
    let gitlab_token = moto.create_secret("lanes/gitlab-token", "bench-gitlab-token").await?;
    common.push(("LANES_LLM_PROVIDER".into(), "offline".into()));
    // The roots the SDK trusts as deployed: a function in Lambda with no endpoint override, no
    // proxy and no `SSL_CERT_FILE` trusts Amazon's ([`lanes_core::adapters::trust`]); the moto
    // endpoint above and `lambda_like_roots` below would otherwise pick the system's. moto is plain
    // HTTP, so no handshake depends on it.
    common.push(("LANES_AWS_TLS_ROOTS".into(), "amazon".into()));
    let with = |extra: &[(&str, &str)]| {
        let mut env = common.clone();
        env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        env
    };
    let mapping = "00000000-0000-0000-0000-000000000000";
    let webhook =
        [("LANES_GITHUB_WEBHOOK_SECRET_ID", github.as_str()), ("LANES_GITLAB_WEBHOOK_TOKEN_ID", &gitlab)];
    let mut webhook_ahead = webhook.to_vec();
    webhook_ahead.push(("AWS_LAMBDA_INITIALIZATION_TYPE", "provisioned-concurrency"));
    let plain = |name, bin, env| Function { name, bin, env, ping: None, read_ahead: false };
    let functions = vec![
        plain(BASELINE, "hello", Vec::new()),
        plain("ingress", "ingress", with(&[])),
        Function { ping: Some(WEBHOOK_SECRET), ..plain("webhook", "webhook", with(&webhook)) },
        Function {
            ping: Some(WEBHOOK_SECRET),
            read_ahead: true,
            ..plain("webhook", "webhook", with(&webhook_ahead))
        },
        plain("worker", "worker", with(&[("LANES_LANE", "interactive")])),
        plain(
            "worker (commits)",
            "worker",
            with(&[
                ("LANES_LANE", "commits"),
                ("LANES_GITHUB_TOKEN_SECRET", &github_token),
                ("LANES_GITLAB_API_TOKEN_SECRET", &gitlab_token),
            ]),
        ),
        plain(
            "controller",
            "controller",
            with(&[
                ("LANES_MAPPING_INTERACTIVE", mapping),
                ("LANES_MAPPING_SYNTHESIS", mapping),
                ("LANES_MAPPING_COMMITS", mapping),
            ]),
        ),
    ];
    Ok((moto, redis, functions))
}

/// The hello-world function's name in the measurements.
const BASELINE: &str = "baseline";

/// The GitHub webhook secret the bench stores, and signs its pings with.
const WEBHOOK_SECRET: &str = "bench-secret";

/// What the emulator saw from a starting function.
enum Seen {
    /// Its first `GET /2018-06-01/runtime/invocation/next`, and when.
    Next(Instant),
    /// `POST /2018-06-01/runtime/invocation/{id}/response`, when, and the body.
    Response(Instant, String),
    /// `POST /2018-06-01/runtime/init/error` or `.../invocation/{id}/error`, with the body.
    Error(String),
}

/// A loopback runtime API that records the first poll, answers it with the event it was given for
/// this start (if any) and records the answer; every other poll waits forever. The function is then
/// killed.
struct RuntimeApi {
    addr: std::net::SocketAddr,
    seen: tokio::sync::Mutex<mpsc::UnboundedReceiver<Seen>>,
    event: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
}

impl RuntimeApi {
    async fn start() -> Result<Self, String> {
        use axum::routing::{get, post};
        let (tx, rx) = mpsc::unbounded_channel();
        let event: Arc<std::sync::Mutex<Option<Vec<u8>>>> = Arc::default();
        let (next_tx, answer_tx, pending) = (tx.clone(), tx.clone(), event.clone());
        let app = axum::Router::new()
            .route(
                "/2018-06-01/runtime/invocation/next",
                get(move || {
                    let _ = next_tx.send(Seen::Next(Instant::now()));
                    let event = pending.lock().ok().and_then(|mut e| e.take());
                    async move {
                        match event {
                            Some(body) => invocation(body),
                            // Nothing to give: the function is killed while it waits.
                            None => std::future::pending().await,
                        }
                    }
                }),
            )
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(move |body: String| {
                    let _ = answer_tx.send(Seen::Response(Instant::now(), body));
                    async { axum::http::StatusCode::ACCEPTED }
                }),
            )
            .route(
                "/2018-06-01/runtime/invocation/{id}/error",
                post({
                    let tx = tx.clone();
                    move |body: String| {
                        let _ = tx.send(Seen::Error(body));
                        async { axum::http::StatusCode::ACCEPTED }
                    }
                }),
            )
            .route(
                "/2018-06-01/runtime/init/error",
                post(move |body: String| {
                    let _ = tx.send(Seen::Error(format!("init error: {body}")));
                    async { axum::http::StatusCode::ACCEPTED }
                }),
            );
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("runtime API: {e}"))?;
        let addr = listener.local_addr().map_err(|e| format!("runtime API: {e}"))?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { addr, seen: tokio::sync::Mutex::new(rx), event })
    }

    /// Starts `bootstrap` with the Lambda environment plus `env`: ms from spawn to its first poll,
    /// and, with `ping` (a GitHub webhook secret), ms from spawn to its answer to a ping signed with
    /// it, which must be a `200` `pong`.
    async fn time_start(
        &self,
        bootstrap: &PathBuf,
        env: &[(String, String)],
        ping: Option<&str>,
    ) -> Result<(f64, Option<f64>), String> {
        let mut seen = self.seen.lock().await;
        while seen.try_recv().is_ok() {} // a previous function's late requests
        if let Ok(mut e) = self.event.lock() {
            *e = ping.map(signed_ping);
        }
        let stderr = tempfile_path();
        let err_file = std::fs::File::create(&stderr).map_err(|e| format!("stderr file: {e}"))?;
        let started = Instant::now();
        let mut child = tokio::process::Command::new(bootstrap)
            .env_clear()
            .env("AWS_LAMBDA_RUNTIME_API", self.addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", "bench")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/bench")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
            .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
            .env("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")
            .envs(lambda_like_roots())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err_file)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", bootstrap.display()))?;
        let ms = |at: Instant| at.duration_since(started).as_secs_f64() * 1000.0;
        let outcome = async {
            let init = match seen.recv().await {
                Some(Seen::Next(at)) => ms(at),
                Some(Seen::Response(..)) => return Err("answered before polling".to_owned()),
                Some(Seen::Error(body)) => return Err(body),
                None => return Err("runtime API stopped".to_owned()),
            };
            if ping.is_none() {
                return Ok((init, None));
            }
            loop {
                match seen.recv().await {
                    Some(Seen::Next(_)) => continue,
                    Some(Seen::Response(at, body)) if is_pong(&body) => return Ok((init, Some(ms(at)))),
                    Some(Seen::Response(_, body)) => return Err(format!("the ping was answered {body}")),
                    Some(Seen::Error(body)) => return Err(body),
                    None => return Err("runtime API stopped".to_owned()),
                }
            }
        };
        let outcome = tokio::select! {
            r = outcome => r,
            status = child.wait() => Err(format!("exited before answering: {status:?}")),
            _ = tokio::time::sleep(Duration::from_secs(20)) => Err("no poll or answer within 20 s".to_owned()),
        };
        let _ = child.start_kill();
        let _ = child.wait().await;
        let log = std::fs::read_to_string(&stderr).unwrap_or_default();
        let _ = std::fs::remove_file(&stderr);
        outcome.map_err(|e| format!("{}: {e}\n{log}", bootstrap.display()))
    }
}

/// Whether a function URL response is the webhook's `200` answer to a ping.
fn is_pong(response: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(response) else { return false };
    v["statusCode"] == 200 && v["body"].as_str().is_some_and(|b| b.contains("pong"))
}

/// An answer to `GET /invocation/next` carrying `body` as the invocation's event.
fn invocation(body: Vec<u8>) -> axum::response::Response {
    let deadline = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64 + 30_000);
    axum::response::Response::builder()
        .header("Lambda-Runtime-Aws-Request-Id", uuid::Uuid::new_v4().to_string())
        .header("Lambda-Runtime-Deadline-Ms", deadline.to_string())
        .header("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:000000000000:function:bench")
        .header("Content-Type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap_or_default()
}

/// A function URL event (payload format 2.0) carrying a GitHub `ping` signed with `secret`, as
/// GitHub sends it when a webhook is created; a new delivery id each time.
fn signed_ping(secret: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "zen": "Keep it logically awesome.",
        "hook_id": 1,
        "hook": { "type": "Repository", "events": ["push"] },
        "repository": { "full_name": "octo-org/hello-world" },
    })
    .to_string();
    let signature = lanes_core::commits::webhook::github_signature(secret.as_bytes(), body.as_bytes());
    serde_json::json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": "/",
        "rawQueryString": "",
        "headers": {
            "content-type": "application/json",
            "user-agent": "GitHub-Hookshot/bench",
            "x-github-event": "ping",
            "x-github-delivery": uuid::Uuid::new_v4().to_string(),
            "x-hub-signature-256": signature,
        },
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "bench",
            "domainName": "bench.lambda-url.us-east-1.on.aws",
            "domainPrefix": "bench",
            "http": { "method": "POST", "path": "/", "protocol": "HTTP/1.1", "sourceIp": "192.30.252.1", "userAgent": "GitHub-Hookshot/bench" },
            "requestId": uuid::Uuid::new_v4().to_string(),
            "routeKey": "$default",
            "stage": "$default",
            "time": "01/Dec/2026:00:00:00 +0000",
            "timeEpoch": 1_796_083_200_000u64,
        },
        "body": body,
        "isBase64Encoded": false,
    })
    .to_string()
    .into_bytes()
}

/// Lambda's runtime (Amazon Linux 2023) keeps its TLS roots in one bundle file, which is all that
/// `rustls-native-certs` reads there. A Debian host also has a directory of one file per root, which
/// it reads too and which costs several ms of init. Pointing `SSL_CERT_FILE` at the host's bundle
/// makes the functions read what they read in Lambda.
fn lambda_like_roots() -> Option<(&'static str, &'static str)> {
    ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .map(|p| ("SSL_CERT_FILE", p))
}

fn tempfile_path() -> PathBuf {
    std::env::temp_dir().join(format!("lanes-coldstart-{}.log", uuid::Uuid::new_v4()))
}

impl std::fmt::Display for ColdStartReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Cold start: init on {} (median and p90 of {} starts), arm64 zip as deployed",
            self.init_arch, self.starts
        )?;
        writeln!(
            f,
            "{:<22} {:>9} {:>9} {:>8} {:>10} {:>16}",
            "function", "init ms", "p90 ms", "× base", "zip MiB", "1st response ms"
        )?;
        let row = |f: &mut std::fmt::Formatter<'_>, name: &str, m: &Measure| {
            writeln!(
                f,
                "{:<22} {:>9.1} {:>9.1} {:>8.2} {:>10.2} {:>16}",
                name,
                m.init_ms,
                m.init_p90_ms,
                m.init_ms / self.baseline.init_ms.max(f64::EPSILON),
                m.zip_bytes as f64 / 1_048_576.0,
                m.first_response_ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1}"))
            )
        };
        row(f, "baseline (hello)", &self.baseline)?;
        for (name, m) in &self.functions {
            row(f, name, m)?;
        }
        for (name, m) in &self.read_ahead {
            row(f, &format!("{name} (read ahead)*"), m)?;
        }
        if !self.read_ahead.is_empty() {
            writeln!(
                f,
                "* its init reads the secrets ahead, as where inits run before events: not held to the goal"
            )?;
        }
        write_goals(f, &self.goals)?;
        writeln!(f, "reproduce: {}", self.command)
    }
}
