//! The task lifecycle as a client meets it, on the real `lanes dev` binary over HTTP, on both backends
//! (embedded, and moto + redis-server): a worker SIGKILLed on every delivery until the queue redrives
//! the message, the DLQ sweep answering the client with `FAILED`, `lanes dlq` listing and redriving it;
//! cancellation of a running task; two hundred long-polls on one task.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_tests::{Backend, DevServer, Stack, submit, wait_status, workspace_bin};
use reqwest::StatusCode;
use serde_json::Value;
use std::time::Duration;

use lanes_tests::on_both_backends;

on_both_backends!(
    a_crash_on_every_delivery_ends_failed_and_lanes_dlq_redrives_it,
    a_running_task_cancelled_by_its_client_drops_its_provider_call,
    two_hundred_long_polls_on_one_task_are_woken_by_its_end,
    a_result_too_large_for_a_record_is_answered_whole,
);

/// Two deliveries before the redrive, a 1 s lease, a 2 s queue visibility.
const QUEUE_FLAGS: &[&str] =
    &["--max-receive-count", "2", "--lease-ttl-ms", "1000", "--queue-visibility-secs", "2"];

/// Runs `lanes dlq ARGS --json` against `server`.
fn lanes_dlq(args: &[&str], server: &str) -> Value {
    let out = std::process::Command::new(workspace_bin("lanes"))
        .arg("dlq")
        .args(args)
        .args(["--json", "--server", server])
        .output()
        .unwrap();
    assert!(out.status.success(), "lanes dlq {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs `lanes dlq list --lane synthesis --backend aws --json` with the environment a function has.
async fn lanes_dlq_on_aws(stack: &Stack) -> Value {
    let moto = stack.moto.as_ref().unwrap();
    let sqs = aws_sdk_sqs::Client::new(&lanes_core::adapters::sdk_config(&moto.aws_settings()).await);
    let mut env = stack.env();
    env.push(("LANES_TABLE".into(), "lanes-tasks".into()));
    for lane in ["interactive", "synthesis", "commits"] {
        let url = sqs.get_queue_url().queue_name(format!("lanes-{lane}")).send().await.unwrap();
        env.push((format!("LANES_QUEUE_URL_{}", lane.to_uppercase()), url.queue_url().unwrap().to_owned()));
    }
    let out = std::process::Command::new(workspace_bin("lanes"))
        .args(["dlq", "list", "--lane", "synthesis", "--backend", "aws", "--json"])
        .envs(env)
        .output()
        .unwrap();
    assert!(out.status.success(), "lanes dlq --backend aws: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn status_of(url: &str, id: &str) -> Value {
    reqwest::get(format!("{url}/v1/tasks/{id}")).await.unwrap().json().await.unwrap()
}

async fn a_crash_on_every_delivery_ends_failed_and_lanes_dlq_redrives_it(backend: Backend) {
    // Two deliveries allowed; each one's worker is SIGKILLed mid-call (a poison task that kills its
    // worker), so the queue's own redrive moves the message to the DLQ with the record PROCESSING.
    let slow = [QUEUE_FLAGS, &["--synthesis-latency-ms", "60000", "--dlq-sweep-secs", "1"]].concat();
    let mut stack = Stack::start(backend, &slow).await;
    let id = submit(&stack.server.url, "agent", "crash me").await;
    let claims = "lanes_task_wait_seconds_count{lane=\"synthesis\"}";
    for _delivery in 1..=2 {
        // This process claimed it (the lease of the worker killed before ran out first).
        stack.server.wait_metric(claims, 1.0, Duration::from_secs(20)).await;
        assert_eq!(status_of(&stack.server.url, &id).await["status"], "PROCESSING");
        stack.server.kill9();
        stack.server.restart().await;
    }
    // The third receive finds the message over its count: the queue redrives it, the sweep answers.
    let failed = wait_status(&stack.server.url, &id, "FAILED", Duration::from_secs(30)).await;
    assert_eq!(failed["error"]["code"], "dead_lettered", "{failed}");
    assert_eq!(failed["attempts"], 0, "a crash is not a provider failure");

    if backend == Backend::Aws {
        // Straight on AWS, with the functions' environment instead of a server.
        let listed = lanes_dlq_on_aws(&stack).await;
        assert_eq!(listed["messages"][0]["status"], "FAILED", "{listed}");
    }
    let listed = lanes_dlq(&["list", "--lane", "synthesis"], &stack.server.url);
    let messages = listed["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{listed}");
    assert_eq!(
        (messages[0]["task_id"].as_str(), messages[0]["status"].as_str()),
        (Some(id.as_str()), Some("FAILED"))
    );

    // A worker that does not crash, then the redrive: the task runs again and completes.
    stack.server.kill9();
    // The same queue settings (a peer's `--create` must find the queues it would create).
    let fast = [QUEUE_FLAGS, &["--synthesis-latency-ms", "50"]].concat();
    let server = match backend {
        Backend::Embedded => DevServer::start(stack.server.data_dir(), &fast).await,
        Backend::Aws | Backend::AwsTls => stack.start_peer(&fast).await,
    };
    // Embedded: through the queue's own move task (moto has none; the stub test covers SQS's).
    let by_move = backend == Backend::Embedded;
    let args: &[&str] = if by_move {
        &["redrive", "--lane", "synthesis", "--move-task"]
    } else {
        &["redrive", "--lane", "synthesis"]
    };
    let redriven = lanes_dlq(args, &server.url);
    assert_eq!(redriven["report"]["redriven"], 1, "{redriven}");
    assert_eq!(redriven["report"]["move_task"].is_string(), by_move, "{redriven}");
    if by_move {
        let moves = lanes_dlq(&["moves", "--lane", "synthesis"], &server.url);
        assert_eq!(
            (moves["moves"][0]["status"].as_str(), moves["moves"][0]["moved"].as_u64()),
            (Some("COMPLETED"), Some(1)),
            "{moves}"
        );
    }
    let done = wait_status(&server.url, &id, "COMPLETED", Duration::from_secs(20)).await;
    assert!(done["result"]["text"].is_string());
    let after = lanes_dlq(&["list", "--lane", "synthesis"], &server.url);
    assert_eq!(after["messages"].as_array().unwrap().len(), 0, "{after}");
}

async fn a_running_task_cancelled_by_its_client_drops_its_provider_call(backend: Backend) {
    let stack = Stack::start(backend, &["--lease-ttl-ms", "900", "--synthesis-latency-ms", "60000"]).await;
    let url = &stack.server.url;
    let id = submit(url, "refactor", "cancel me").await;
    wait_status(url, &id, "PROCESSING", Duration::from_secs(15)).await;
    let client = reqwest::Client::new();
    let resp = client.delete(format!("{url}/v1/tasks/{id}")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "CANCELLED");
    let again = client.delete(format!("{url}/v1/tasks/{id}")).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::CONFLICT, "cancelling twice changes nothing");
    // The worker's next heartbeat (every 300 ms) sees it and drops the 60 s call.
    let dropped = "lanes_llm_calls_dropped_total{lane=\"synthesis\",why=\"cancelled\"}";
    stack.server.wait_metric(dropped, 1.0, Duration::from_secs(10)).await;
    assert_eq!(status_of(url, &id).await["status"], "CANCELLED");
    assert_eq!(stack.server.metric("lanes_llm_requests_total{lane=\"synthesis\",status=\"ok\"}").await, 0.0);
}

async fn two_hundred_long_polls_on_one_task_are_woken_by_its_end(backend: Backend) {
    let stack = Stack::start(backend, &["--interactive-latency-ms", "2000"]).await;
    let url = stack.server.url.clone();
    let id = submit(&url, "explain", "wait for me").await;
    let before = stack.server.peak_rss_kib().unwrap();
    let polls: Vec<_> = (0..200)
        .map(|_| {
            let uri = format!("{url}/v1/tasks/{id}?wait=20");
            tokio::spawn(async move { reqwest::get(uri).await.unwrap().json::<Value>().await.unwrap() })
        })
        .collect();
    for p in polls {
        // Each answers with the finished task: woken by its end, not by its own 20 s running out.
        assert_eq!(p.await.unwrap()["status"], "COMPLETED");
    }
    let after = stack.server.peak_rss_kib().unwrap();
    // A parked future per waiter, not a thread: 200 waiters cost little memory.
    assert!(after.saturating_sub(before) < 32 * 1024, "peak RSS grew {} KiB", after - before);
}

/// A provider that throttles (the emulator: 10 requests per one-second window, 429 with a hint past
/// it) under six times that load, with no limits configured, one attempt allowed and three deliveries
/// before the redrive: throttling is waiting, so every task completes and none fails or is
/// dead-lettered.
#[tokio::test]
async fn a_throttling_provider_fails_no_task() {
    use lanes_tests::mock_llm::{MockLimits, MockLlm};
    let mock = MockLlm::start_limited(MockLimits {
        rpm: 10.0,
        tpm: 1e9,
        window: Duration::from_secs(1),
        ..Default::default()
    })
    .await
    .unwrap();
    let env = openai_at(&mock.url, Some(1));
    let stack = Stack::start_with_env(
        Backend::Embedded,
        &["--max-receive-count", "3", "--lease-ttl-ms", "3000"],
        env,
    )
    .await;
    let url = &stack.server.url;
    let mut ids = Vec::new();
    for i in 0..60 {
        ids.push(submit(url, "classify", &format!("is change {i} a bug?")).await);
    }
    for id in &ids {
        let done = wait_status(url, id, "COMPLETED", Duration::from_secs(90)).await;
        assert_eq!(done["attempts"], 0, "{done}");
    }
    let throttled = mock.seen().len() - 60;
    assert!(throttled > 0, "the provider did throttle");
    assert_eq!(
        stack.server.metric("lanes_tasks_finished_total{lane=\"interactive\",status=\"FAILED\"}").await,
        0.0
    );
    let dlq = lanes_dlq(&["list", "--lane", "interactive"], url);
    assert_eq!(dlq["messages"].as_array().unwrap().len(), 0, "{dlq}");
}

/// A provider's own error text never reaches the client (security review L1): a refusal (401) and
/// a provider that keeps failing (503, one attempt allowed) end `FAILED` with a stable code and its
/// fixed message, and the provider's words, here naming an account and an internal host, go to the
/// worker's log with the task id.
#[tokio::test]
async fn a_failed_task_shows_a_stable_code_not_the_providers_words() {
    use lanes_tests::mock_llm::{MockLlm, Scripted};
    let mock = MockLlm::start().await.unwrap();
    let env = openai_at(&mock.url, Some(1));
    let stack = Stack::start_with_env(Backend::Embedded, &[], env).await;
    let url = &stack.server.url;
    let host = mock.url.trim_start_matches("http://").to_owned();
    for (status, code) in [(401, "provider_refused"), (503, "provider_unavailable")] {
        // Enough for every try of the one attempt (the client retries a 5xx in the call, and a 401
        // once with the key re-read); what is left is dropped.
        mock.script(vec![Scripted::Status(status, vec![]); 12]);
        let id = submit(url, "classify", &format!("a task the provider answers {status}")).await;
        let failed = wait_status(url, &id, "FAILED", Duration::from_secs(30)).await;
        mock.clear_script();
        assert_eq!(failed["error"]["code"], code, "{failed}");
        assert!(failed["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{failed}");
        let text = failed.to_string();
        assert!(!text.contains("scripted") && !text.contains(&host), "provider text in the view: {text}");
        let logged = stack.server.log_text();
        let line = logged.lines().find(|l| l.contains("task failed") && l.contains(&id));
        assert!(
            line.is_some_and(|l| l.contains(&format!("scripted {status}"))),
            "the detail is logged: {line:?}"
        );
    }
}

/// A 400 KB answer (past what a DynamoDB item holds) completes and reads back whole: its text is in
/// the results store (files under the data dir; moto's S3 on the AWS backend) and the record keeps
/// only its key.
async fn a_result_too_large_for_a_record_is_answered_whole(backend: Backend) {
    use lanes_tests::mock_llm::{MockLlm, Scripted};
    let mock = MockLlm::start().await.unwrap();
    let env = openai_at(&mock.url, None);
    let stack = Stack::start_with_env(backend, &[], env).await;
    let text: String = (0..400 * 1024 / 64).map(|i| format!("{i:063}\n")).collect();
    mock.script([Scripted::Answer(text.clone())]);
    let id = submit(&stack.server.url, "refactor", "say a great deal").await;
    let done = wait_status(&stack.server.url, &id, "COMPLETED", Duration::from_secs(60)).await;
    assert_eq!(done["result"]["text"].as_str().map(str::len), Some(text.len()));
    assert!(done["result"]["text"] == text.as_str(), "the text comes back whole");
    assert!(done["result"].get("text_ref").is_none(), "the key is not a client's business");
    if backend == Backend::Embedded {
        let dir = stack.server.data_dir().join("results").join(&id);
        assert!(std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()), "{}", dir.display());
    } else {
        use lanes_core::ports::TaskStore;
        let kept =
            stack.dynamo().await.get(&id.parse().unwrap(), lanes_tests::now_ms()).await.unwrap().unwrap();
        let result = kept.result.unwrap();
        assert_eq!(
            (result.text.as_str(), result.text_ref.is_some()),
            ("", true),
            "the item keeps the key only"
        );
    }
}

/// `lanes dev`'s environment for an OpenAI-compatible provider at `url` (the mock), with
/// `attempts` provider attempts per interactive task when given (the lane's default otherwise).
fn openai_at(url: &str, attempts: Option<u32>) -> Vec<(String, String)> {
    let mut env = vec![
        ("LANES_LLM_PROVIDER".to_owned(), "openai".to_owned()),
        ("LANES_LLM_MODEL".to_owned(), "gpt-test".to_owned()),
        ("LANES_LLM_BASE_URL".to_owned(), format!("{url}/v1")),
    ];
    env.extend(attempts.map(|n| ("LANES_ATTEMPTS_INTERACTIVE".to_owned(), n.to_string())));
    env
}
