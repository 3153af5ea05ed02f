//! End-to-end checks of `lanes dev` as a user meets it: the real binary, over HTTP, on a fresh data dir.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_tests::{Backend, Stack, post_task, wait_for, wait_status};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

const OK_LLM: &str = "lanes_llm_requests_total{lane=\"interactive\",status=\"ok\"}";

use lanes_tests::on_both_backends;

on_both_backends!(
    submit_dedupe_complete_and_replay,
    two_hundred_concurrent_duplicates_make_one_task_and_one_call,
    bad_input_is_a_named_problem_and_stores_nothing,
    kill_9_while_queued_or_running_then_restart_completes_every_task,
    a_project_over_its_daily_token_budget_is_refused_at_ingress,
);

/// The AWS backend with Redis over TLS behind a private CA: the cache answers the replay (the same
/// path as above), and nothing ran degraded.
#[tokio::test]
async fn submit_dedupe_complete_and_replay_over_tls_redis() {
    let stack = submit_dedupe_complete_and_replay(Backend::AwsTls).await;
    let server = &stack.server;
    assert_eq!(
        server.metric("lanes_duplicates_total{stage=\"cache\"}").await,
        1.0,
        "the replay came from Redis"
    );
    let log = server.log_text();
    assert!(!log.contains("degraded"), "no operation ran without Redis:\n{log}");
}

async fn submit_dedupe_complete_and_replay(backend: Backend) -> Stack {
    let stack = Stack::start(backend, &[]).await;
    let server = &stack.server;
    let body = json!({"project_id":"p1","kind":"explain","prompt":"what does main do?","target_files":["src/main.rs","src/lib.rs"]});
    let (s1, loc, v1) = post_task(&server.url, &body.to_string()).await;
    assert_eq!(s1, StatusCode::ACCEPTED);
    let id = v1["task_id"].as_str().unwrap().to_owned();
    assert_eq!(loc.as_deref(), Some(format!("/v1/tasks/{id}").as_str()));
    assert_eq!((v1["lane"].as_str(), v1["status"].as_str()), (Some("interactive"), Some("PENDING")));

    let messy = json!({"project_id":"p1","kind":"explain","prompt":"\n  what does main do?   ","target_files":["src/lib.rs","src/main.rs","src/lib.rs"]});
    let (s2, _, v2) = post_task(&server.url, &messy.to_string()).await;
    assert!(s2 == StatusCode::ACCEPTED || s2 == StatusCode::OK, "{s2}");
    assert_eq!(v2["task_id"], id.as_str());

    let done = wait_status(&server.url, &id, "COMPLETED", Duration::from_secs(10)).await;
    assert!(done["result"]["text"].as_str().unwrap().contains("NOT an LLM"));
    assert!(done["result"]["tokens"]["completion"].as_u64().unwrap() > 0);
    assert_eq!(done["result"]["tier"], "sync", "the interactive lane calls at sync");

    // A task that can wait an hour is called at flex, which the offline model serves (free).
    let patient = json!({"project_id":"p1","kind":"explain","prompt":"what does main do?",
        "target_files":["src/main.rs"],"params":{"deadline_s":3600}});
    let (sp, _, vp) = post_task(&server.url, &patient.to_string()).await;
    assert_eq!(sp, StatusCode::ACCEPTED, "{vp}");
    let pid = vp["task_id"].as_str().unwrap().to_owned();
    let flex = wait_status(&server.url, &pid, "COMPLETED", Duration::from_secs(10)).await;
    assert_eq!(
        (flex["result"]["tier"].as_str(), flex["result"]["cost_usd"].as_f64()),
        (Some("flex"), Some(0.0))
    );

    let (s3, _, v3) = post_task(&server.url, &body.to_string()).await;
    assert_eq!(s3, StatusCode::OK);
    assert_eq!(v3["result"], done["result"]);
    assert_eq!(
        server.metric(OK_LLM).await,
        2.0,
        "one provider call for three submissions, one for the flex task"
    );
    assert!(server.metric("lanes_task_latency_seconds_count{lane=\"interactive\"}").await >= 1.0);

    let other_kind = json!({"project_id":"p1","kind":"refactor","prompt":"what does main do?","target_files":["src/main.rs","src/lib.rs"]});
    let (s4, _, v4) = post_task(&server.url, &other_kind.to_string()).await;
    assert_eq!((s4, v4["lane"].as_str()), (StatusCode::ACCEPTED, Some("synthesis")));
    assert_ne!(v4["task_id"], id.as_str());

    // A synthesis task that can wait an hour goes into the offline model's provider batch: it
    // reads PROCESSING at tier batch with its deadline until the collector writes its answer.
    let batched = json!({"project_id":"p1","kind":"scaffold","prompt":"a CLI that counts lines",
        "target_files":["src/main.rs"],"params":{"deadline_s":3600}});
    let (sb, _, vb) = post_task(&server.url, &batched.to_string()).await;
    assert_eq!(sb, StatusCode::ACCEPTED, "{vb}");
    let bid = vb["task_id"].as_str().unwrap().to_owned();
    let waiting = wait_for(&server.url, &bid, |v| v["tier"] == "batch", Duration::from_secs(10)).await;
    assert_eq!(waiting["status"], "PROCESSING");
    let due = waiting["created_at_ms"].as_u64().unwrap() + 3_600_000;
    assert_eq!(waiting["expected_by_ms"].as_u64(), Some(due));
    let done = wait_status(&server.url, &bid, "COMPLETED", Duration::from_secs(30)).await;
    assert_eq!((done["result"]["tier"].as_str(), done.get("tier")), (Some("batch"), None));
    stack
}

async fn two_hundred_concurrent_duplicates_make_one_task_and_one_call(backend: Backend) {
    let stack = Stack::start(backend, &[]).await;
    let server = &stack.server;
    let body = json!({"project_id":"p1","kind":"classify","prompt":"is this a bug?","target_files":["a.rs"]})
        .to_string();
    let mut handles = Vec::new();
    for _ in 0..200 {
        let (url, body) = (server.url.clone(), body.clone());
        handles.push(tokio::spawn(async move { post_task(&url, &body).await }));
    }
    let mut ids = std::collections::BTreeSet::new();
    for h in handles {
        let (status, _, v) = h.await.unwrap();
        assert!(status == StatusCode::ACCEPTED || status == StatusCode::OK, "{status} {v}");
        ids.insert(v["task_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "one task id in every response");
    let id = ids.into_iter().next().unwrap();
    wait_status(&server.url, &id, "COMPLETED", Duration::from_secs(10)).await;
    // Let any stray duplicate delivery run before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(server.metric(OK_LLM).await, 1.0, "exactly one provider call");
}

async fn bad_input_is_a_named_problem_and_stores_nothing(backend: Backend) {
    let stack = Stack::start(backend, &[]).await;
    let server = &stack.server;
    let client = reqwest::Client::new();
    let big = json!({"project_id":"p","kind":"explain","prompt":"x".repeat(300 * 1024),"target_files":[]})
        .to_string();
    let cases: Vec<(&str, String, &str, u16, &str)> = vec![
        ("malformed JSON", "{\"project_id\":".into(), "application/json", 400, "body"),
        (
            "unknown kind",
            json!({"project_id":"p","kind":"poem","prompt":"x","target_files":[]}).to_string(),
            "application/json",
            400,
            "kind",
        ),
        (
            "missing field",
            json!({"project_id":"p","kind":"explain","target_files":[]}).to_string(),
            "application/json",
            400,
            "prompt",
        ),
        ("300 KiB body", big, "application/json", 413, "body"),
        (
            "path escape",
            json!({"project_id":"p","kind":"explain","prompt":"x","target_files":["../x"]}).to_string(),
            "application/json",
            400,
            "target_files[0]",
        ),
        (
            "absolute path",
            json!({"project_id":"p","kind":"explain","prompt":"x","target_files":["/etc/passwd"]})
                .to_string(),
            "application/json",
            400,
            "target_files[0]",
        ),
        (
            "bad project",
            json!({"project_id":"p/1","kind":"explain","prompt":"x","target_files":[]}).to_string(),
            "application/json",
            400,
            "project_id",
        ),
        (
            "wrong content type",
            json!({"project_id":"p","kind":"explain","prompt":"x","target_files":[]}).to_string(),
            "text/plain",
            415,
            "Content-Type",
        ),
    ];
    for (name, body, ct, status, field) in cases {
        let r = client
            .post(format!("{}/v1/tasks", server.url))
            .header("content-type", ct)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{name}");
        assert_eq!(r.headers()["content-type"], "application/problem+json", "{name}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["field"], field, "{name}: {v}");
        assert_eq!(v["status"], status, "{name}");
        assert!(!v["detail"].as_str().unwrap_or_default().is_empty(), "{name}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for lane in ["interactive", "synthesis", "commits"] {
        assert_eq!(server.metric(&format!("lanes_queue_depth{{lane=\"{lane}\"}}")).await, 0.0);
        assert_eq!(server.metric(&format!("lanes_queue_in_flight{{lane=\"{lane}\"}}")).await, 0.0);
    }
    assert_eq!(server.metric(OK_LLM).await, 0.0, "nothing enqueued, nothing run");
}

async fn kill_9_while_queued_or_running_then_restart_completes_every_task(backend: Backend) {
    // Two slots and slow tasks (slow enough that a loaded machine's slow submissions still leave
    // most of them queued), so that at the kill some run and most wait in the queue. A short lease
    // lets the ones that were running come back quickly after the restart.
    let flags = [
        "--capacity",
        "2",
        "--interactive-latency-ms",
        "800",
        "--synthesis-latency-ms",
        "1200",
        "--lease-ttl-ms",
        "900",
    ];
    let mut stack = Stack::start(backend, &flags).await;
    let server = &mut stack.server;
    let mut ids = Vec::new();
    for i in 0..12 {
        let kind = if i % 3 == 0 { "refactor" } else { "explain" };
        let body =
            json!({"project_id":"p1","kind":kind,"prompt":format!("task {i}"),"target_files":[]}).to_string();
        let (status, _, v) = post_task(&server.url, &body).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        ids.push(v["task_id"].as_str().unwrap().to_owned());
    }
    // Killed once some task runs, not after a guessed delay.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let unfinished = loop {
        let mut statuses = Vec::new();
        for id in &ids {
            let v: Value =
                reqwest::get(format!("{}/v1/tasks/{id}", server.url)).await.unwrap().json().await.unwrap();
            statuses.push(v["status"].as_str().unwrap_or_default().to_owned());
        }
        if statuses.iter().any(|s| s == "PROCESSING") {
            break statuses.iter().filter(|s| *s != "COMPLETED").count();
        }
        assert!(std::time::Instant::now() < deadline, "no task started running: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(unfinished >= 6, "the kill must hit queued and running work, {unfinished} unfinished");
    server.kill9();
    server.restart().await;
    for id in &ids {
        wait_status(&server.url, id, "COMPLETED", Duration::from_secs(60)).await;
    }
}

async fn a_project_over_its_daily_token_budget_is_refused_at_ingress(backend: Backend) {
    let env = vec![("LANES_PROJECT_DAILY_TOKENS".to_owned(), "20".to_owned())];
    let stack = Stack::start_with_env(backend, &[], env).await;
    let server = &stack.server;
    let task = |project: &str, prompt: &str| {
        json!({"project_id":project,"kind":"explain","prompt":prompt,"target_files":[]}).to_string()
    };
    let (s, _, v) = post_task(&server.url, &task("spender", "first")).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let done =
        wait_status(&server.url, v["task_id"].as_str().unwrap(), "COMPLETED", Duration::from_secs(10)).await;
    let used = done["result"]["tokens"]["prompt"].as_u64().unwrap()
        + done["result"]["tokens"]["completion"].as_u64().unwrap();
    assert!(used >= 20, "the first task spends the budget ({used} tokens)");

    let resp = reqwest::Client::new()
        .post(format!("{}/v1/tasks", server.url))
        .header("content-type", "application/json")
        .body(task("spender", "second"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry_after), "until midnight UTC: {retry_after}");
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let problem: Value = resp.json().await.unwrap();
    assert_eq!(problem["status"], 429);
    assert!(problem.to_string().contains("project_id"), "{problem}");
    assert!(problem.get("task_id").is_none());
    assert_eq!(server.metric(OK_LLM).await, 1.0, "nothing stored, nothing run");

    // Other projects, and the finished task's duplicate, are still served.
    let (s, _, _) = post_task(&server.url, &task("other", "first")).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, _, _) = post_task(&server.url, &task("spender", "first")).await;
    assert_eq!(s, StatusCode::OK);
}

/// `lanes dev --tenant-header`: the real binary takes the tenant from the proxy's header.
#[tokio::test]
async fn lanes_dev_serves_each_tenant_its_own_tasks() {
    let stack = Stack::start(Backend::Embedded, &["--tenant-header", "x-tenant"]).await;
    let url = &stack.server.url;
    let client = reqwest::Client::new();
    let body = json!({"project_id":"p1","kind":"explain","prompt":"mine?","target_files":[]}).to_string();
    let post = |tenant: Option<&str>| {
        let mut req = client.post(format!("{url}/v1/tasks")).header("content-type", "application/json");
        if let Some(t) = tenant {
            req = req.header("x-tenant", t);
        }
        req.body(body.clone()).send()
    };
    assert_eq!(post(None).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let v: Value = post(Some("team-a")).await.unwrap().json().await.unwrap();
    let id = v["task_id"].as_str().unwrap().to_owned();
    let get = |tenant: &str| client.get(format!("{url}/v1/tasks/{id}")).header("x-tenant", tenant).send();
    assert_eq!(get("team-b").await.unwrap().status(), StatusCode::NOT_FOUND);
    assert!(get("team-a").await.unwrap().status().is_success());
}

/// `lanes dev` answers only this machine (security review L5): a request addressed to another name
/// (DNS rebinding) is a `421`, and a DLQ redrive without `X-Lanes-Admin` (a cross-site form's) is a
/// `403`; `lanes dlq --server` sends the header.
#[tokio::test]
async fn lanes_dev_answers_only_this_machine_and_redrives_only_with_its_header() {
    let stack = Stack::start(Backend::Embedded, &[]).await;
    let url = &stack.server.url;
    let client = reqwest::Client::new();
    let rebound =
        client.get(format!("{url}/healthz")).header("host", "rebind.example:3000").send().await.unwrap();
    assert_eq!(rebound.status(), StatusCode::MISDIRECTED_REQUEST);
    let problem: Value = rebound.json().await.unwrap();
    assert_eq!(problem["field"], "Host");
    assert_eq!(client.get(format!("{url}/healthz")).send().await.unwrap().status(), StatusCode::OK);
    let localhost = url.replace("127.0.0.1", "localhost");
    let by_name =
        client.get(format!("{url}/healthz")).header("host", localhost.trim_start_matches("http://"));
    assert_eq!(by_name.send().await.unwrap().status(), StatusCode::OK);
    let redrive = format!("{url}/admin/dlq/interactive/redrive");
    let form = client.post(&redrive).header("content-type", "application/x-www-form-urlencoded").body("a=1");
    let refused = form.send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(refused.json::<Value>().await.unwrap()["field"], "X-Lanes-Admin");
    let allowed = client.post(&redrive).header("x-lanes-admin", "1").send().await.unwrap();
    assert_eq!(allowed.status(), StatusCode::OK, "{:?}", allowed.text().await);
}
