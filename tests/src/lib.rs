//! Test harness for Lanes' end-to-end tests: starts the real `lanes` binary on a free loopback port
//! with its own data dir, waits until it answers, and can `kill -9` and restart it on the same data.
//! Later issues add `redis-server`, `moto_server` and `cargo lambda watch` here.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Path of a workspace binary built next to the test executable (`make test` builds them first).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir =
        exe.parent().and_then(Path::parent).unwrap_or_else(|| panic!("odd test path {}", exe.display()));
    let bin = dir.join(name);
    assert!(bin.exists(), "{} is missing: run `cargo build --workspace` (make test does)", bin.display());
    bin
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
    log: PathBuf,
}

impl DevServer {
    /// Starts `lanes dev` on a free port with `data_dir` and extra flags, and waits for `/healthz`.
    pub async fn start(data_dir: &Path, extra: &[&str]) -> Self {
        let port = free_port();
        let mut s = Self {
            child: None,
            url: format!("http://127.0.0.1:{port}"),
            port,
            data_dir: data_dir.to_owned(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
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

    /// Value of a Prometheus sample, e.g. `lanes_llm_requests_total{lane="interactive",status="ok"}`.
    pub async fn metric(&self, sample: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.url))
            .await
            .unwrap_or_else(|e| panic!("metrics: {e}"))
            .text()
            .await
            .unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or(0.0)
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        self.kill9();
    }
}
