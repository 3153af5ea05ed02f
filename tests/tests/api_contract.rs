//! The API contract as a tool we did not write reads it: Schemathesis generates requests from the
//! OpenAPI document `lanes dev` serves (valid ones, and ones the document forbids), sends them, and
//! checks every answer against the document: no server error, every status and content type
//! documented, bodies that match their schemas, schema-valid requests accepted and invalid ones
//! refused, and a stateful phase that follows the links (create, read, cancel). It must report no
//! failure. Two documented behaviours are told to it (`tests/schemathesis.toml`). The budget is
//! fixed: a seed, 30 examples per operation and phase, at most 150 s. It runs one worker: with two
//! threads, Hypothesis parses Python source in both at once, and CPython 3.11's AST constructor keeps
//! its recursion depth in state the threads share, so a run can fail with "AST constructor
//! recursion depth mismatch" (CPython gh-106905), a failure of neither Lanes nor the document.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_tests::{Backend, Stack, workspace_root};
use std::path::PathBuf;

/// Schemathesis's `st`, from the venv `scripts/test-deps.sh` puts beside the project venv.
fn st() -> PathBuf {
    let venv =
        std::env::var("LANES_VENV").map(PathBuf::from).unwrap_or_else(|_| workspace_root().join(".venv"));
    let mut dir = venv.into_os_string();
    dir.push("-schemathesis");
    let bin = PathBuf::from(dir).join("bin/st");
    assert!(bin.exists(), "{} is missing: run scripts/test-deps.sh (make test does)", bin.display());
    bin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_failure_against_lanes_dev() {
    let stack =
        Stack::start(Backend::Embedded, &["--interactive-latency-ms", "5", "--synthesis-latency-ms", "5"])
            .await;
    let schema = format!("{}/openapi.json", stack.server.url);
    let config = workspace_root().join("tests/schemathesis.toml");
    // Schemathesis keeps a cache of the crashes it saw in `.schemathesis/` under its working
    // directory and replays them: a directory of the run's own keeps every run from the same seed.
    let cache = tempfile::tempdir().unwrap();
    let cwd = cache.path().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(st())
            .current_dir(cwd)
            .arg("--config-file")
            .arg(config)
            .args(["run", &schema, "--checks", "all", "--exclude-checks", "use_after_free"])
            // A long-poll may wait its whole 20 s.
            .args(["--max-response-time", "25", "--request-timeout", "25"])
            .args(["--max-examples", "30", "--seed", "1", "--max-time", "150", "--workers", "1"])
            .args(["--continue-on-failure", "--no-color"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let summary: String = text.lines().skip_while(|l| !l.contains("SUMMARY")).collect::<Vec<_>>().join("\n");
    eprintln!("{summary}");
    assert!(out.status.success(), "schemathesis failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("Test cases:"), "no test cases ran:\n{text}");
}
