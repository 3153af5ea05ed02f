//! The commits flow through the real `lanes` binary: `lanes summarize` over a real temporary
//! repository (twice: the second run makes no LLM call), and `lanes dev` taking a signed GitHub push
//! at `/webhooks/github` and serving the summaries at `/v1/repos/...` (diffs from a fake GitHub API).

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::commits::webhook::github_signature;
use lanes_tests::{DevServer, Fetches, fake_github, git, repository_of_modules, workspace_bin};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn summarize(repo: &Path, data: &Path) -> Value {
    let out = Command::new(workspace_bin("lanes"))
        .args(["summarize", "--json", "--last", "50", "--repo"])
        .arg(repo)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "warn")
        .env_remove("LANES_LLM_PROVIDER")
        .output()
        .unwrap();
    assert!(out.status.success(), "lanes summarize: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn lanes_summarize_twice_over_a_real_repository() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repository_of_modules(dir.path(), 6, 20);
    // A commit that only rewrites a 5 MB lockfile, and one with a huge source diff.
    let lock: String = (0..80_000)
        .map(|i| format!("[[package]]\nname = \"crate-{i}\"\nchecksum = \"{i:064x}\"\n"))
        .collect();
    assert!(lock.len() > 5_000_000);
    std::fs::write(repo.join("Cargo.lock"), lock).unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "Update the lockfile"]);
    let huge: String =
        (0..30_000).map(|l| format!("pub const C{l}: &str = \"value number {l}\";\n")).collect();
    std::fs::write(repo.join("consts.rs"), huge).unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "Add generated-looking constants by hand"]);

    let data = dir.path().join("data");
    let first = summarize(&repo, &data);
    assert_eq!(first["commits"], 8, "{first}");
    let rows = first["summaries"].as_array().unwrap();
    assert_eq!(rows.len(), 8);
    let lockfile = rows.iter().find(|r| r["subject"] == "Update the lockfile").unwrap();
    assert_eq!(
        (lockfile["source"].as_str(), lockfile["tokens"].as_u64()),
        (Some("rule"), Some(0)),
        "{lockfile}"
    );
    let huge = rows.iter().find(|r| r["subject"] == "Add generated-looking constants by hand").unwrap();
    assert_eq!(huge["source"], "llm");
    assert!(
        rows.iter()
            .filter(|r| r["source"] == "llm")
            .all(|r| r["summary"].as_str().unwrap().contains("not an LLM"))
    );
    let (calls, prompt, budget) = (
        first["llm_calls"].as_u64().unwrap(),
        first["prompt_tokens"].as_u64().unwrap(),
        first["batch_tokens"].as_u64().unwrap(),
    );
    assert!(calls >= 1 && calls <= prompt.div_ceil(budget) + 2, "{calls} calls for {prompt} prompt tokens");
    // The huge diff was cut to its 4,000-token budget: the whole prompt stays near 7 x small + 4,000.
    assert!(prompt < 9_000, "prompt tokens {prompt}");
    assert!(first["completion_tokens"].as_u64().unwrap() > 0);

    let second = summarize(&repo, &data);
    assert_eq!((second["llm_calls"].as_u64(), second["cache_hits"].as_u64()), (Some(0), Some(8)), "{second}");
    assert_eq!(second["rule_summaries"], 0);
    assert!(second["summaries"].as_array().unwrap().iter().all(|r| r["source"] == "cache"));
}

/// `lanes summarize --tier`: the commits lane's calls ask a flex route for `service_tier: "flex"`, each
/// row says the tier that served it, and the run costs half what the same commits cost at sync; a
/// tier that does not exist is refused naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_summarize_at_flex_costs_half_of_sync_through_a_flex_route() {
    let mock = lanes_tests::mock_llm::MockLlm::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let repo = repository_of_modules(dir.path(), 4, 20);
    let route = format!("openai:gpt-4o-mini+tiers@{}/v1", mock.url);
    let run = |tier: &str, data: &str| {
        Command::new(workspace_bin("lanes"))
            .args(["summarize", "--json", "--last", "4", "--tier", tier, "--repo"])
            .arg(&repo)
            .arg("--data-dir")
            .arg(dir.path().join(data))
            .env("RUST_LOG", "warn")
            .env("LANES_LLM_ROUTES_COMMITS", &route)
            .env("OPENAI_API_KEY", "k")
            .output()
            .unwrap()
    };
    let report = |tier: &str, data: &str| -> Value {
        let out = run(tier, data);
        assert!(
            out.status.success(),
            "lanes summarize --tier {tier}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let flex = report("flex", "a");
    let asked: Vec<Value> = mock.seen().iter().map(|s| s.body["service_tier"].clone()).collect();
    assert!(!asked.is_empty() && asked.iter().all(|t| t == "flex"), "{asked:?}");
    let rows = flex["summaries"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["source"] == "llm" && r["tier"] == "flex"), "{flex}");
    let seen = mock.seen().len();
    let sync = report("sync", "b");
    assert!(mock.seen()[seen..].iter().all(|s| s.body.get("service_tier").is_none()));
    assert!(sync["summaries"].as_array().unwrap().iter().all(|r| r["tier"] == "sync"));
    let (at_flex, at_sync) = (flex["cost_usd"].as_f64().unwrap(), sync["cost_usd"].as_f64().unwrap());
    assert_eq!(flex["prompt_tokens"], sync["prompt_tokens"], "the same calls");
    assert!(at_sync > 0.0 && (at_flex * 2.0 - at_sync).abs() < 1e-9, "flex {at_flex} against sync {at_sync}");
    let refused = run("fast", "c");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--tier"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// `lanes summarize --tier batch --deadline 1h`: the commits go into one provider batch through
/// OpenAI's Files and Batch APIs (the emulator, at a scaled time), the run waits for its collector,
/// and every row is answered by the batch at half the list price.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_summarize_at_batch_runs_the_batch_path_and_costs_half() {
    use lanes_tests::mock_batches::{BatchTiming, MockBatches};
    let timing = BatchTiming {
        validating: std::time::Duration::from_millis(100),
        per_request: std::time::Duration::from_millis(10),
        ..Default::default()
    };
    let batches =
        MockBatches::start(std::sync::Arc::new(lanes_core::clock::SystemClock), timing).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let repo = repository_of_modules(dir.path(), 4, 20);
    let out = Command::new(workspace_bin("lanes"))
        .args(["summarize", "--json", "--last", "4", "--tier", "batch", "--deadline", "1h", "--repo"])
        .arg(&repo)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "warn")
        .env("LANES_LLM_ROUTES_COMMITS", format!("openai:gpt-4o-mini+batch@{}", batches.url))
        .env("OPENAI_API_KEY", "k")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["summaries"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{report}");
    assert!(rows.iter().all(|r| r["source"] == "llm" && r["tier"] == "batch"), "{report}");
    assert_eq!(batches.batches(), 1);
    let tokens = lanes_core::domain::TokenUsage {
        prompt: report["prompt_tokens"].as_u64().unwrap(),
        completion: report["completion_tokens"].as_u64().unwrap(),
    };
    let list = lanes_core::llm::price::prices()
        .cost("gpt-4o-mini", tokens, lanes_core::domain::tier::Tier::Sync)
        .unwrap();
    let paid = report["cost_usd"].as_f64().unwrap();
    assert!(paid > 0.0 && (paid * 2.0 - list).abs() < 1e-9, "paid {paid} against a list price of {list}");
}

#[tokio::test]
async fn lanes_dev_takes_a_signed_push_and_serves_the_summaries() {
    let fetches = Fetches::default();
    let github = fake_github(fetches.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let env = vec![
        ("LANES_GITHUB_WEBHOOK_SECRET".to_owned(), "lanes-local-webhook-secret".to_owned()),
        ("LANES_GITHUB_API_URL".to_owned(), github),
    ];
    let server = DevServer::start_with_env(&dir.path().join("data"), &[], env).await;
    let event: Value = serde_json::from_str(
        &std::fs::read_to_string(lanes_tests::workspace_root().join("events/webhook-github-push.json"))
            .unwrap(),
    )
    .unwrap();
    let body = event["body"].as_str().unwrap().to_owned();
    let client = reqwest::Client::new();
    let post = |sig: String| {
        client
            .post(format!("{}/webhooks/github", server.url))
            .header("x-github-event", "push")
            .header("x-github-delivery", "dev-1")
            .header("x-hub-signature-256", sig)
            .body(body.clone())
            .send()
    };
    let resp = post("sha256=00".into()).await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = post(github_signature(b"lanes-local-webhook-secret", body.as_bytes())).await.unwrap();
    assert_eq!(resp.status(), 202);
    let sha = "3f786850e387550fdab836ed7e6dc881de23001b";
    let url = format!("{}/v1/repos/github:1296269/commits/{sha}/summary", server.url);
    let started = Instant::now();
    let summary: Value = loop {
        let resp = client.get(&url).send().await.unwrap();
        if resp.status() == 200 {
            break resp.json().await.unwrap();
        }
        assert_eq!(resp.status(), 404);
        assert!(started.elapsed() < Duration::from_secs(30), "no summary: {}", server.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(summary["subject"], "Add the greeting module");
    assert!(summary["summary"].as_str().unwrap().contains("touches src/hello-world.rs"), "{summary}");
    let list: Value = loop {
        let list: Value = client
            .get(format!("{}/v1/repos/github:1296269/summaries?limit=1", server.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if !list["next_cursor"].is_null() || started.elapsed() > Duration::from_secs(30) {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(list["items"][0]["subject"], "Greet in French too", "newest first: {list}");
    assert!(
        server.metric("lanes_webhook_deliveries_total{provider=\"github\",result=\"accepted\"}").await >= 1.0
    );
}

/// `lanes dev` with the commits lane at tier `batch`: a signed push's commits go into a batch of
/// the offline twin, the dev collector's timer reads it, and the summary is served at tier `batch`.
#[tokio::test]
async fn lanes_dev_at_tier_batch_summarizes_a_push_through_its_collector() {
    let github = fake_github(Fetches::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let env = vec![
        ("LANES_GITHUB_WEBHOOK_SECRET".to_owned(), "lanes-local-webhook-secret".to_owned()),
        ("LANES_GITHUB_API_URL".to_owned(), github),
        ("LANES_TIER_COMMITS".to_owned(), "batch".to_owned()),
        ("LANES_BATCH_TURNAROUND_MS".to_owned(), "300".to_owned()),
    ];
    let server = DevServer::start_with_env(&dir.path().join("data"), &[], env).await;
    let event: Value = serde_json::from_str(
        &std::fs::read_to_string(lanes_tests::workspace_root().join("events/webhook-github-push.json"))
            .unwrap(),
    )
    .unwrap();
    let body = event["body"].as_str().unwrap().to_owned();
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{}/webhooks/github", server.url))
        .header("x-github-event", "push")
        .header("x-github-delivery", "dev-batch-1")
        .header("x-hub-signature-256", github_signature(b"lanes-local-webhook-secret", body.as_bytes()))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let url = format!(
        "{}/v1/repos/github:1296269/commits/3f786850e387550fdab836ed7e6dc881de23001b/summary",
        server.url
    );
    let started = Instant::now();
    let summary: Value = loop {
        let resp = client.get(&url).send().await.unwrap();
        if resp.status() == 200 {
            break resp.json().await.unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no summary: {}", server.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(summary["tier"], "batch", "{summary}");
    let submitted =
        "lanes_llm_route_events_total{event=\"batch_submitted\",lane=\"commits\",route=\"offline:\"}";
    assert!(server.metric(submitted).await >= 1.0, "{}", server.log_text());
}
