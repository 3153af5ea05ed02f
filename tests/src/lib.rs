//! Test harness for Lanes' end-to-end tests: starts the real `lanes` binary on a free loopback port
//! with its own data dir, waits until it answers, and can `kill -9` and restart it on the same data.
//! It also runs real `redis-server` and `moto_server` (SQS and DynamoDB emulation) on free loopback
//! ports, each stopped when its handle drops. `make test` installs both first (`scripts/test-deps.sh`).

pub mod aws_stub;
pub mod contract;
pub mod lambda_emulator;
pub mod mock_batches;

/// Runs each named `async fn(Backend)` as two tests, `embedded::NAME` and `aws::NAME`: the embedded
/// default and `--backend aws --create` against moto and redis-server.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(#[tokio::test] async fn $name() { let _ = super::$name($crate::Backend::Embedded).await; })*
        }
        mod aws {
            $(#[tokio::test] async fn $name() { let _ = super::$name($crate::Backend::Aws).await; })*
        }
    };
}
pub mod mock_llm;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Path of a workspace binary built next to the test executable (`make test` builds them first).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    // A test runs from target/<profile>/deps/<test>, `lanes bench` from target/<profile>/lanes: the
    // binaries are beside the latter and one level up from the former.
    let here = exe.parent().unwrap_or_else(|| panic!("odd path {}", exe.display()));
    let dir = if here.join(name).exists() { here } else { here.parent().unwrap_or(here) };
    let bin = dir.join(name);
    assert!(bin.exists(), "{} is missing: run `cargo build --workspace` (make test does)", bin.display());
    bin
}

/// Resident memory of process `pid`, KiB, from `/proc/<pid>/status`: now (`VmRSS`) and at its peak
/// (`VmHWM`). `None` once the process is gone.
pub fn resident_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status.lines().find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Wall-clock Unix milliseconds, as the servers under test read them.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `POST /v1/tasks` with a raw JSON body: status, `Location`, and the JSON answer.
pub async fn post_task(url: &str, body: &str) -> (reqwest::StatusCode, Option<String>, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/tasks"))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap_or_else(|e| panic!("post: {e}"));
    let status = r.status();
    let location = r.headers().get("location").map(|v| v.to_str().unwrap_or_default().to_owned());
    (status, location, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// Submits a task of `kind` for project `p1` and returns its id (a 202 or a 200 is expected).
pub async fn submit(url: &str, kind: &str, prompt: &str) -> String {
    let body = serde_json::json!({"project_id":"p1","kind":kind,"prompt":prompt,"target_files":[]});
    let (status, _, v) = post_task(url, &body.to_string()).await;
    assert!(status == reqwest::StatusCode::ACCEPTED || status == reqwest::StatusCode::OK, "{status} {v}");
    v["task_id"].as_str().unwrap_or_else(|| panic!("no task_id in {v}")).to_owned()
}

/// Polls `GET /v1/tasks/{id}` until its status is `want`; returns the task.
pub async fn wait_status(url: &str, id: &str, want: &str, within: Duration) -> serde_json::Value {
    wait_for(url, id, |v| v["status"] == want, within).await
}

/// Polls the task until its view satisfies `done`, and returns that view.
pub async fn wait_for(
    url: &str,
    id: &str,
    done: impl Fn(&serde_json::Value) -> bool,
    within: Duration,
) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        let v: serde_json::Value = match reqwest::get(format!("{url}/v1/tasks/{id}")).await {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(e) => panic!("get {id}: {e}"),
        };
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "task {id} never got there: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A free loopback port (bound, then released for the child to take).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    l.local_addr().unwrap_or_else(|e| panic!("local_addr: {e}")).port()
}

/// A running `lanes dev`.
pub struct DevServer {
    child: Option<Child>,
    /// Base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    port: u16,
    data_dir: PathBuf,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
}

impl DevServer {
    /// Starts `lanes dev` on a free port with `data_dir` and extra flags, and waits for `/healthz`.
    pub async fn start(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_with_env(data_dir, extra, Vec::new()).await
    }

    /// Like [`DevServer::start`], with extra environment variables (endpoints, `REDIS_URL`).
    pub async fn start_with_env(data_dir: &Path, extra: &[&str], env: Vec<(String, String)>) -> Self {
        let port = free_port();
        let mut s = Self {
            child: None,
            url: format!("http://127.0.0.1:{port}"),
            port,
            data_dir: data_dir.to_owned(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env,
            log: data_dir.with_extension("log"),
        };
        s.spawn().await;
        s
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("log file: {e}"));
        let err = log.try_clone().unwrap_or_else(|e| panic!("log file: {e}"));
        let child = Command::new(workspace_bin("lanes"))
            .arg("dev")
            .arg("--addr")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.extra)
            .env("RUST_LOG", "warn,lanes_core=info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn lanes: {e}"));
        self.child = Some(child);
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = client.get(format!("{}/healthz", self.url)).send().await
                && r.status().is_success()
            {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("lanes dev exited with {status}: {}", self.log_text());
            }
            assert!(Instant::now() < deadline, "lanes dev did not answer /healthz: {}", self.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The data dir it was started on.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Peak resident memory (`VmHWM`) of the process, in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        resident_kib(self.pid()?).map(|(_, peak)| peak)
    }

    /// Resident memory (`VmRSS`) of the process now, in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        resident_kib(self.pid()?).map(|(now, _)| now)
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same port and data dir.
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn().await;
    }

    /// Polls `/metrics` until `sample` is at least `at_least`.
    pub async fn wait_metric(&self, sample: &str, at_least: f64, within: Duration) {
        let deadline = Instant::now() + within;
        while self.metric(sample).await < at_least {
            assert!(Instant::now() < deadline, "{sample} never reached {at_least}: {}", self.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Value of a Prometheus sample, e.g. `lanes_llm_requests_total{lane="interactive",status="ok"}`.
    pub async fn metric(&self, sample: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.url))
            .await
            .unwrap_or_else(|e| panic!("metrics: {e}"))
            .text()
            .await
            .unwrap_or_default();
        sample_value(&text, sample).unwrap_or(0.0)
    }
}

/// Value of a Prometheus sample (`name` or `name{labels}`) in a text exposition; `None` when the
/// text has no such sample.
pub fn sample_value(text: &str, sample: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.trim().parse().ok()))
}

impl Drop for DevServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs `git` in `dir` as a fixed test identity, and answers its output; panics if it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=Lanes Test", "-c", "user.email=test@lanes.invalid"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run git: {e}"));
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A fresh repository under `dir` with `n` commits, each adding a module of `lines` lines. The same
/// arguments always make the same diffs, so what a run over them costs does not change with this
/// repository's own history.
pub fn repository_of_modules(dir: &Path, n: usize, lines: usize) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir(&repo).unwrap_or_else(|e| panic!("create {}: {e}", repo.display()));
    git(&repo, &["init", "-q", "-b", "main"]);
    for i in 0..n {
        let src: String = (0..lines).map(|l| format!("fn f{i}_{l}() -> u32 {{ {l} }}\n")).collect();
        let path = repo.join(format!("m{i}.rs"));
        std::fs::write(&path, src).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-qm", &format!("Add module {i}")]);
    }
    repo
}

/// The workspace root (parent of `tests/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_owned).unwrap_or_default()
}

/// A program from the project venv (`.venv`, or `LANES_VENV`), where `scripts/test-deps.sh` puts it.
pub fn venv_bin(name: &str) -> PathBuf {
    let venv =
        std::env::var("LANES_VENV").map(PathBuf::from).unwrap_or_else(|_| workspace_root().join(".venv"));
    let bin = venv.join("bin").join(name);
    assert!(bin.exists(), "{} is missing: run scripts/test-deps.sh (make test does)", bin.display());
    bin
}

/// Whether `redis-server` and the venv's `moto_server` are installed (what [`RedisServer`] and
/// [`MotoServer`] start), so a caller that can do without them can say so instead of panicking.
pub fn services_available() -> bool {
    let venv =
        std::env::var("LANES_VENV").map(PathBuf::from).unwrap_or_else(|_| workspace_root().join(".venv"));
    venv.join("bin/moto_server").exists() && redis_available()
}

/// Whether `redis-server` is installed (what [`RedisServer`] starts), for a caller that needs it
/// alone.
pub fn redis_available() -> bool {
    Command::new("redis-server").arg("--version").stdout(Stdio::null()).status().is_ok()
}

fn wait_for_port(port: u16, what: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited with {status}");
        }
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(30));
    }
}

/// A real `redis-server` on a loopback port, without persistence.
pub struct RedisServer {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
    cluster_dir: Option<tempfile::TempDir>,
    /// With TLS: the directory of its certificate authority, certificate and key.
    tls_dir: Option<tempfile::TempDir>,
}

impl RedisServer {
    /// The adapter's settings for this server: prefix `lanes:`, a 500 ms bound, its CA when TLS.
    pub fn settings(&self, cluster: bool) -> lanes_core::adapters::redis::RedisSettings {
        lanes_core::adapters::redis::RedisSettings {
            url: self.url(),
            cluster,
            prefix: "lanes:".into(),
            timeout: Duration::from_millis(500),
            ca_pem: self.ca_pem_if_tls(),
            auth: None,
        }
    }

    /// Starts one on a free port.
    pub fn start() -> Self {
        let mut s = Self { child: None, port: free_port(), cluster_dir: None, tls_dir: None };
        s.spawn();
        s
    }

    /// Starts one speaking TLS only, with a certificate for 127.0.0.1 signed by a fresh test CA
    /// ([`write_test_pki`]): what a self-hosted Valkey behind a private CA looks like.
    pub fn start_tls() -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        write_test_pki(dir.path());
        let mut s = Self { child: None, port: free_port(), cluster_dir: None, tls_dir: Some(dir) };
        s.spawn();
        s
    }

    /// The test CA's certificate file when this server speaks TLS.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls_dir.as_ref().map(|d| d.path().join("ca.pem"))
    }

    /// The test CA's certificate (PEM) when this server speaks TLS.
    pub fn ca_pem_if_tls(&self) -> Option<Vec<u8>> {
        self.tls_dir.as_ref().map(|_| self.ca_pem())
    }

    /// The test CA's certificate (PEM), with TLS.
    pub fn ca_pem(&self) -> Vec<u8> {
        let dir = self.tls_dir.as_ref().unwrap_or_else(|| panic!("not a TLS server"));
        std::fs::read(dir.path().join("ca.pem")).unwrap_or_else(|e| panic!("ca.pem: {e}"))
    }

    /// Starts a one-node Redis Cluster owning every slot (the protocol ElastiCache Serverless speaks).
    pub fn start_cluster() -> Self {
        Self::start_cluster_on(free_port())
    }

    /// [`RedisServer::start_cluster`] on a given port (one a client was already pointed at).
    pub fn start_cluster_on(port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let mut s = Self { child: None, port, cluster_dir: Some(dir), tls_dir: None };
        s.spawn();
        let port = s.port.to_string();
        let cli = |args: &[&str]| {
            let out = Command::new("redis-cli")
                .args(["-p", &port])
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("redis-cli: {e}"));
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        cli(&["cluster", "addslotsrange", "0", "16383"]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cli(&["cluster", "info"]).contains("cluster_state:ok") {
            assert!(Instant::now() < deadline, "cluster never became ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    fn spawn(&mut self) {
        let mut args: Vec<String> =
            ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"].map(String::from).to_vec();
        match &self.tls_dir {
            None => args.extend(["--port".to_owned(), self.port.to_string()]),
            Some(dir) => {
                let file = |f: &str| dir.path().join(f).display().to_string();
                args.extend([
                    "--port".to_owned(),
                    "0".to_owned(),
                    "--tls-port".to_owned(),
                    self.port.to_string(),
                ]);
                args.extend([
                    "--tls-cert-file".to_owned(),
                    file("srv.pem"),
                    "--tls-key-file".to_owned(),
                    file("srv.key"),
                ]);
                args.extend([
                    "--tls-ca-cert-file".to_owned(),
                    file("ca.pem"),
                    "--tls-auth-clients".to_owned(),
                    "no".to_owned(),
                ]);
            }
        }
        if let Some(dir) = &self.cluster_dir {
            args.extend([
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-config-file".to_owned(),
            ]);
            args.push(dir.path().join("nodes.conf").display().to_string());
            // The cluster bus listens 10,000 above the port unless told otherwise, and redis-server
            // refuses to start when that is past 65535 (a free port above 55535, about one in five
            // of the ephemeral range): its own free port instead.
            args.extend(["--cluster-port".to_owned(), free_port().to_string()]);
        }
        let mut child = Command::new("redis-server")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-server: {e} (run scripts/test-deps.sh)"));
        wait_for_port(self.port, "redis-server", &mut child);
        self.child = Some(child);
    }

    /// `redis://127.0.0.1:PORT` (`rediss://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls_dir.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Stops it (SIGKILL): every key and loaded script is gone.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes a fresh test CA (`ca.pem`) and a server certificate for 127.0.0.1 and `localhost` signed by
/// it (`srv.pem`, key `srv.key`) into `dir`, with the `openssl` CLI: the private CA a self-hosted
/// server, an emulator or a TLS-inspecting proxy would present.
fn write_test_pki(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let ok = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("openssl: {e}"));
        assert!(ok.success(), "openssl {args:?}");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=lanes-test-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "srv.key",
        "-out",
        "srv.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        .unwrap_or_else(|e| panic!("ext.cnf: {e}"));
    run(&[
        "x509",
        "-req",
        "-in",
        "srv.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "srv.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

/// A real `moto_server` on a loopback port.
pub struct MotoServer {
    child: Child,
    /// Its port.
    pub port: u16,
    tls_dir: Option<tempfile::TempDir>,
}

impl MotoServer {
    /// Starts one on a free port.
    pub fn start() -> Self {
        Self::spawn(&[])
    }

    /// Starts one that serves HTTPS only, with a certificate signed by a fresh test CA
    /// ([`write_test_pki`], whose `ca.pem` is in [`Self::tls_dir`]).
    pub fn start_tls() -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        write_test_pki(dir.path());
        let (cert, key) = (dir.path().join("srv.pem"), dir.path().join("srv.key"));
        let mut s =
            Self::spawn(&["--ssl-cert", &cert.to_string_lossy(), "--ssl-key", &key.to_string_lossy()]);
        s.tls_dir = Some(dir);
        s
    }

    /// The directory of the test CA's files, for [`Self::start_tls`].
    pub fn tls_dir(&self) -> Option<&std::path::Path> {
        self.tls_dir.as_ref().map(|d| d.path())
    }

    fn spawn(extra: &[&str]) -> Self {
        let port = free_port();
        let mut child = Command::new(venv_bin("moto_server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("moto_server: {e}"));
        wait_for_port(port, "moto_server", &mut child);
        Self { child, port, tls_dir: None }
    }

    /// `http://127.0.0.1:PORT` (`https` for [`Self::start_tls`]).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls_dir.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Settings that point the SDK at this server with dummy credentials.
    pub fn aws_settings(&self) -> lanes_core::adapters::AwsSettings {
        lanes_core::adapters::AwsSettings {
            endpoint: Some(self.endpoint()),
            region: Some("us-east-1".into()),
            static_credentials: Some(("testing".into(), "testing".into())),
        }
    }

    /// Creates a Secrets Manager secret holding `value`; its ARN.
    pub async fn create_secret(&self, name: &str, value: &str) -> Result<String, String> {
        let config = lanes_core::adapters::sdk_config(&self.aws_settings()).await;
        let out = aws_sdk_secretsmanager::Client::new(&config)
            .create_secret()
            .name(name)
            .secret_string(value)
            .send()
            .await
            .map_err(|e| format!("create secret {name}: {e}"))?;
        out.arn().map(str::to_owned).ok_or_else(|| format!("secret {name}: no ARN"))
    }

    /// Environment for a child process (the `lanes` binary, a Lambda function) to reach this server.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ENDPOINT_URL".into(), self.endpoint()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID".into(), "testing".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "testing".into()),
        ]
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `lanes dev` on one backend, with the servers that backend needs.
pub struct Stack {
    /// The server (public so tests can kill and restart it).
    pub server: DevServer,
    /// `moto_server`, on the AWS backend.
    pub moto: Option<MotoServer>,
    /// `redis-server`, on the AWS backend.
    pub redis: Option<RedisServer>,
    _dir: tempfile::TempDir,
}

impl Stack {
    /// Environment that points a process at this stack's servers (empty on the embedded backend).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = self.moto.as_ref().map(MotoServer::env).unwrap_or_default();
        if let Some(r) = &self.redis {
            env.push(("REDIS_URL".into(), r.url()));
            if let Some(ca) = r.ca_file() {
                env.push(("LANES_REDIS_CA_FILE".into(), ca.display().to_string()));
            }
        }
        env
    }

    /// A second `lanes dev` on the same AWS servers (another worker process on the same queues).
    pub async fn start_peer(&self, flags: &[&str]) -> DevServer {
        let mut args = vec!["--backend", "aws", "--create"];
        args.extend_from_slice(flags);
        let data = self._dir.path().join(format!("peer-{}", free_port()));
        DevServer::start_with_env(&data, &args, self.env()).await
    }

    /// The task table on moto (AWS backend only).
    pub async fn dynamo(&self) -> lanes_core::adapters::dynamodb::DynamoStore {
        let moto = self.moto.as_ref().unwrap_or_else(|| panic!("dynamo() needs the AWS backend"));
        let config = lanes_core::adapters::sdk_config(&moto.aws_settings()).await;
        lanes_core::adapters::dynamodb::DynamoStore::new(
            aws_sdk_dynamodb::Client::new(&config),
            "lanes-tasks",
        )
    }
}

/// Which adapters a [`Stack`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// redb file, in-process lock and cache.
    Embedded,
    /// moto (SQS, DynamoDB) and redis-server, queues and table created by `--create`.
    Aws,
    /// Like `Aws`, with Redis over TLS only (`rediss://`) behind a private test CA named by
    /// `LANES_REDIS_CA_FILE`, as a self-hosted Valkey would be.
    AwsTls,
}

impl Stack {
    /// Starts the servers and `lanes dev` with `flags`.
    pub async fn start(backend: Backend, flags: &[&str]) -> Self {
        Self::start_with_env(backend, flags, Vec::new()).await
    }

    /// Like [`Stack::start`], with extra environment for `lanes dev` (an LLM provider, limits).
    pub async fn start_with_env(backend: Backend, flags: &[&str], extra_env: Vec<(String, String)>) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let data = dir.path().join("data");
        match backend {
            Backend::Embedded => {
                let server = DevServer::start_with_env(&data, flags, extra_env).await;
                Self { server, moto: None, redis: None, _dir: dir }
            }
            Backend::Aws | Backend::AwsTls => {
                let moto = MotoServer::start();
                let redis =
                    if backend == Backend::AwsTls { RedisServer::start_tls() } else { RedisServer::start() };
                let mut redis_env = vec![("REDIS_URL".into(), redis.url())];
                if let Some(ca) = redis.ca_file() {
                    redis_env.push(("LANES_REDIS_CA_FILE".into(), ca.display().to_string()));
                }
                let env = [moto.env(), redis_env, extra_env].concat();
                let mut args = vec!["--backend", "aws", "--create"];
                args.extend_from_slice(flags);
                let server = DevServer::start_with_env(&data, &args, env).await;
                Self { server, moto: Some(moto), redis: Some(redis), _dir: dir }
            }
        }
    }
}

/// `cargo lambda watch` (from the project venv) serving the workspace's real Lambda binaries on a
/// loopback port, with the given environment. Stopped, with its function processes, on drop.
pub struct LambdaWatch {
    child: Child,
    /// Its port.
    pub port: u16,
    _env_file: tempfile::NamedTempFile,
    log_path: PathBuf,
}

impl LambdaWatch {
    /// Starts the emulator; functions compile on their first invocation. Each starts as Lambda
    /// announces an on-demand cold start (cargo-lambda leaves `AWS_LAMBDA_INITIALIZATION_TYPE`
    /// unset), so the tests run the path a deployed function takes, secrets read at first use.
    pub fn start(env: &[(String, String)]) -> Self {
        use std::io::Write;
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let mut env_file = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("env file: {e}"));
        let on_demand = ("AWS_LAMBDA_INITIALIZATION_TYPE".to_owned(), "on-demand".to_owned());
        for (k, v) in std::iter::once(&on_demand).chain(env) {
            writeln!(env_file, "{k}={v}").unwrap_or_else(|e| panic!("env file: {e}"));
        }
        let log_path = std::env::temp_dir().join(format!("lanes-lambda-watch-{port}.log"));
        let log = std::fs::File::create(&log_path).unwrap_or_else(|e| panic!("watch log: {e}"));
        let err = log.try_clone().unwrap_or_else(|e| panic!("watch log: {e}"));
        eprintln!("cargo lambda watch on port {port}, log in {}", log_path.display());
        let mut child = Command::new(venv_bin("cargo-lambda"))
            .args(["lambda", "watch", "--ignore-changes", "-A", "127.0.0.1", "-P", &port.to_string()])
            .arg("--env-file")
            .arg(env_file.path())
            .current_dir(workspace_root())
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cargo lambda watch: {e}"));
        wait_for_port(port, "cargo lambda watch", &mut child);
        Self { child, port, _env_file: env_file, log_path }
    }

    /// What the emulator and the functions printed so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Invokes `function` with `payload` through the Lambda invoke API, as `cargo lambda invoke` does.
    pub async fn invoke(&self, function: &str, payload: &serde_json::Value) -> serde_json::Value {
        let url = format!("http://127.0.0.1:{}/2015-03-31/functions/{function}/invocations", self.port);
        let resp = reqwest::Client::new()
            .post(url)
            .timeout(Duration::from_secs(300)) // the first call compiles the function
            .json(payload)
            .send()
            .await
            .unwrap_or_else(|e| panic!("invoke {function}: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "invoke {function}: {status} {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("invoke {function}: {e}: {text}"))
    }
}

impl Drop for LambdaWatch {
    fn drop(&mut self) {
        // The emulator runs each function as `cargo run`: end the whole process group.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-s", "KILL", "--", &group]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Diff fetches per `owner/name@sha`, as the fake GitHub counted them.
pub type Fetches = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>;

/// The repositories the fake GitHub knows, `(numeric id, full_name)`: the documented push example's
/// and the test pushes'.
pub const GITHUB_REPOSITORIES: &[(u64, &str)] =
    &[(1_296_269, "octo-org/hello-world"), (101, "octo/one"), (202, "fork/two"), (303, "octo/three")];

/// A fake GitHub REST API on loopback, by numeric id as the commits worker asks it: a repository
/// (`GET /repositories/{id}`, the documented fields that name it; 404 for an id it does not know) and
/// a distinct diff per repository and commit (`/repositories/{id}/commits/{sha}`), counting fetches
/// by `owner/name@sha`.
pub async fn fake_github(fetches: Fetches) -> String {
    use axum::extract::{Path, State};
    use axum::response::IntoResponse;
    fn name_of(id: u64) -> Option<&'static str> {
        GITHUB_REPOSITORIES.iter().find(|(i, _)| *i == id).map(|(_, n)| *n)
    }
    let not_found = || {
        (
            axum::http::StatusCode::NOT_FOUND,
            r#"{"message":"Not Found","documentation_url":"https://docs.github.com/rest","status":"404"}"#,
        )
            .into_response()
    };
    let router = axum::Router::new()
        .route(
            "/repositories/{id}",
            axum::routing::get(move |Path(id): Path<u64>| async move {
                let Some(full_name) = name_of(id) else { return not_found() };
                let (owner, name) = full_name.split_once('/').unwrap_or((full_name, ""));
                axum::Json(serde_json::json!({"id": id, "node_id": "R_kgDO", "name": name, "full_name": full_name,
                    "private": false, "owner": {"login": owner, "id": 1, "type": "Organization"},
                    "default_branch": "main"}))
                .into_response()
            }),
        )
        .route(
            "/repositories/{id}/commits/{sha}",
            axum::routing::get(move |State(f): State<Fetches>, Path((id, sha)): Path<(u64, String)>| async move {
                let Some(full_name) = name_of(id) else { return not_found() };
                if let Ok(mut f) = f.lock() {
                    *f.entry(format!("{full_name}@{sha}")).or_default() += 1;
                }
                let name = full_name.split('/').nth(1).unwrap_or(full_name);
                let body: String =
                    (0..30).map(|i| format!("+    let v{i} = \"{full_name} {}\";\n", &sha[..7])).collect();
                format!(
                    "diff --git a/src/{name}.rs b/src/{name}.rs\n--- a/src/{name}.rs\n+++ b/src/{name}.rs\n@@ -0,0 +1,30 @@\n{body}"
                )
                .into_response()
            }),
        )
        .with_state(fetches);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

/// What Lambda's event source mapping does when a function answers with a partial-batch response
/// (`ReportBatchItemFailures`): deletes every record the answer does not name as a failure. The
/// functions leave that delete to the mapping, so a test or bench that plays the mapping must do it
/// too.
pub async fn mapping_deletes(
    queue: &dyn lanes_core::ports::QueueConsume,
    records: &[aws_lambda_events::event::sqs::SqsMessage],
    response: &aws_lambda_events::event::sqs::SqsBatchResponse,
) -> Result<(), lanes_core::ports::QueueError> {
    for record in records {
        let failed = response
            .batch_item_failures
            .iter()
            .any(|f| Some(f.item_identifier.as_str()) == record.message_id.as_deref());
        if let (false, Some(receipt)) = (failed, record.receipt_handle.as_deref()) {
            queue.delete(receipt).await?;
        }
    }
    Ok(())
}

/// `lanes_aws_requests_total` in a Prometheus text exposition, as `service operation -> count`.
pub fn aws_requests_in(metrics_text: &str) -> std::collections::BTreeMap<String, f64> {
    metrics_text
        .lines()
        .filter_map(|l| l.strip_prefix("lanes_aws_requests_total{"))
        .filter_map(|l| {
            let (labels, value) = l.split_once("} ")?;
            let op = labels.split("operation=\"").nth(1)?.split('"').next()?;
            let service = labels.split("service=\"").nth(1)?.split('"').next()?;
            Some((format!("{service} {op}"), value.trim().parse().ok()?))
        })
        .collect()
}

/// A received message as the event source mapping hands it to a function (the fields the workers
/// read).
pub fn sqs_record(m: &lanes_core::ports::ReceivedMessage) -> aws_lambda_events::event::sqs::SqsMessage {
    let mut s = aws_lambda_events::event::sqs::SqsMessage::default();
    s.message_id = Some(m.message_id.to_string());
    s.receipt_handle = Some(m.receipt.clone());
    s.body = Some(m.body.clone());
    s.attributes.insert("ApproximateReceiveCount".into(), m.receive_count.to_string());
    s
}

/// What was asked between two readings of [`aws_requests_in`], without the pollers' receives and
/// depth reads (in Lambda the event source mapping polls).
pub fn requests_between(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> std::collections::BTreeMap<String, f64> {
    after
        .iter()
        .filter(|(k, _)| !k.contains("ReceiveMessage") && !k.contains("GetQueueAttributes"))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Receives until `n` messages have come (each with the queue's default visibility), failing after
/// 20 s rather than hanging on a lost one.
pub async fn receive_n(
    queue: &dyn lanes_core::ports::QueueConsume,
    n: usize,
) -> Vec<lanes_core::ports::ReceivedMessage> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut received = Vec::new();
    while received.len() < n {
        assert!(Instant::now() < deadline, "only {} of {n} messages came", received.len());
        received.extend(queue.receive(10).await.unwrap_or_else(|e| panic!("receive: {e}")));
    }
    received
}

/// The environment the template gives every function for the AWS backend: its table, the lane
/// queues and their redrive policy (the DLQs as `create_aws_resources` names them, the queues'
/// `maxReceiveCount`), so a function asks SQS nothing about them at start.
pub fn stack_env(table: &str, queue_urls: &[String; 3]) -> Vec<(String, String)> {
    let max_receive_count = lanes_core::embedded::QueueSettings::default().max_receive_count;
    let mut env = vec![
        ("LANES_BACKEND".to_owned(), "aws".to_owned()),
        ("LANES_TABLE".to_owned(), table.to_owned()),
        ("LANES_MAX_RECEIVE_COUNT".to_owned(), max_receive_count.to_string()),
        ("LANES_RESULTS_BUCKET".to_owned(), lanes_core::wiring::RESULTS_BUCKET.to_owned()),
    ];
    for (lane, url) in ["INTERACTIVE", "SYNTHESIS", "COMMITS"].iter().zip(queue_urls) {
        env.push((format!("LANES_QUEUE_URL_{lane}"), url.clone()));
        env.push((format!("LANES_DLQ_URL_{lane}"), format!("{url}-dlq")));
    }
    env
}
