//! End-to-end of the real Lambda binaries under `cargo lambda watch`: `ingress` invoked with
//! `events/api-post-task.json`, `worker` invoked with the SQS batch built from what ingress really
//! sent, against moto and redis-server.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::adapters::dynamodb::DynamoStore;
use lanes_core::adapters::sdk_config;
use lanes_core::adapters::sqs::SqsQueue;
use lanes_core::domain::TaskStatus;
use lanes_core::embedded::QueueSettings;
use lanes_core::ports::{QueueConsume, TaskStore};
use lanes_core::wiring::create_aws_resources;
use lanes_tests::{LambdaWatch, MotoServer, RedisServer, workspace_root};
use serde_json::{Value, json};

#[tokio::test]
async fn ingress_and_worker_binaries_under_cargo_lambda_watch() {
    let moto = MotoServer::start();
    let redis = RedisServer::start();
    let settings = moto.aws_settings();
    let urls =
        create_aws_resources(&settings, "lanes", "lanes-tasks", QueueSettings::default()).await.unwrap();
    // The template's environment, redrive policy included: the worker asks SQS nothing at start.
    let mut env = moto.env();
    env.extend(lanes_tests::stack_env("lanes-tasks", &urls));
    env.extend(
        [
            ("REDIS_URL", redis.url()),
            ("LANES_LANE", "interactive".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let watch = LambdaWatch::start(&env);

    let event: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("events/api-post-task.json")).unwrap(),
    )
    .unwrap();
    let first = watch.invoke("ingress", &event).await;
    assert_eq!(first["statusCode"], 202, "{first}");
    let body: Value = serde_json::from_str(first["body"].as_str().unwrap()).unwrap();
    let task_id = body["task_id"].as_str().unwrap().to_owned();
    assert_eq!(first["headers"]["location"], format!("/v1/tasks/{task_id}"));

    // The SQS batch exactly as Lambda's event source mapping would deliver what ingress sent.
    let config = sdk_config(&settings).await;
    let queue = SqsQueue::connect(aws_sdk_sqs::Client::new(&config), &urls[0]).await.unwrap();
    let received = queue.receive(10).await.unwrap();
    assert_eq!(received.len(), 1, "ingress sent one message");
    let m = &received[0];
    assert_eq!((m.attributes["lane"].as_str(), m.attributes["kind"].as_str()), ("interactive", "explain"));
    let batch = json!({"Records": [{
        "messageId": m.message_id,
        "receiptHandle": m.receipt,
        "body": m.body,
        "attributes": {"ApproximateReceiveCount": m.receive_count.to_string(), "SentTimestamp": m.sent_at_ms.to_string()},
        "messageAttributes": m.attributes.iter().map(|(k, v)| (k.clone(), json!({"stringValue": v, "dataType": "String"}))).collect::<serde_json::Map<_, _>>(),
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:lanes-interactive",
        "awsRegion": "us-east-1"
    }]});
    let answer = watch.invoke("worker", &batch).await;
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
    // The worker left the delete to the mapping: the message is still hidden, until the mapping
    // deletes what the answer does not name.
    let depth = queue.depth().await.unwrap();
    assert_eq!((depth.visible, depth.in_flight), (0, 1), "left for the mapping");
    let response: aws_lambda_events::event::sqs::SqsBatchResponse =
        serde_json::from_value(answer.clone()).unwrap();
    let records: Vec<aws_lambda_events::event::sqs::SqsMessage> =
        serde_json::from_value(batch["Records"].clone()).unwrap();
    lanes_tests::mapping_deletes(&queue, &records, &response).await.unwrap();

    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), "lanes-tasks");
    let now = lanes_tests::now_ms();
    let rec = store.get(&task_id.parse().unwrap(), now).await.unwrap().unwrap();
    assert_eq!((rec.status, rec.fence), (TaskStatus::Completed, 1));
    let depth = queue.depth().await.unwrap();
    assert_eq!((depth.visible, depth.in_flight), (0, 0), "deleted by the mapping, no copy left");

    // Both functions printed CloudWatch EMF documents: the worker's latency per lane, raw.
    let emf: Vec<Value> = watch
        .log_text()
        .lines()
        .filter_map(|l| l.find("{\"_aws\"").map(|i| &l[i..]))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        emf.iter().any(|d| d["lane"] == "interactive" && d["task_latency_seconds"].is_number()),
        "no EMF latency in the log: {emf:?}"
    );
    let again = watch.invoke("ingress", &event).await;
    assert_eq!(again["statusCode"], 200, "{again}");
    let done: Value = serde_json::from_str(again["body"].as_str().unwrap()).unwrap();
    assert_eq!(done["status"], "COMPLETED");
    assert!(done["result"]["text"].as_str().unwrap().contains("NOT an LLM"));
}

/// The `webhook` binary with `events/webhook-*.json` (signed with the README's local secrets; the
/// GitHub one read from Secrets Manager, as deployed, then rotated there), then the `worker` binary on
/// the commits lane with the SQS batch built from what the webhook sent; diffs from a fake GitHub
/// API on loopback, the offline model.
#[tokio::test]
async fn webhook_and_commits_worker_binaries_under_cargo_lambda_watch() {
    let moto = MotoServer::start();
    let github_secret = moto.create_secret("hooks/github", "lanes-local-webhook-secret").await.unwrap();
    let redis = RedisServer::start();
    let settings = moto.aws_settings();
    let urls =
        create_aws_resources(&settings, "hooks", "lanes-hooks", QueueSettings::default()).await.unwrap();
    let fetches = lanes_tests::Fetches::default();
    let github = lanes_tests::fake_github(fetches.clone()).await;
    let mut env = moto.env();
    env.extend(lanes_tests::stack_env("lanes-hooks", &urls));
    env.extend(
        [
            ("REDIS_URL", redis.url()),
            ("LANES_LANE", "commits".to_owned()),
            ("LANES_GITHUB_WEBHOOK_SECRET_ID", github_secret.clone()),
            ("LANES_GITLAB_WEBHOOK_TOKEN", "lanes-local-gitlab-token".to_owned()),
            ("LANES_GITHUB_API_URL", github),
            // A closed loopback port: GitLab is down for this test (and no test leaves the machine).
            ("LANES_GITLAB_URL", "http://127.0.0.1:9".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let watch = LambdaWatch::start(&env);
    let read = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(workspace_root().join("events").join(name)).unwrap())
            .unwrap()
    };
    let push = read("webhook-github-push.json");
    let first = watch.invoke("webhook", &push).await;
    assert_eq!(first["statusCode"], 202, "{first}");
    let body: Value = serde_json::from_str(first["body"].as_str().unwrap()).unwrap();
    assert_eq!((body["enqueued"].as_u64(), body["repo_id"].as_str()), (Some(2), Some("github:1296269")));
    let replay = watch.invoke("webhook", &push).await;
    assert_eq!(replay["statusCode"], 200, "replayed delivery: {replay}");
    let gitlab = watch.invoke("webhook", &read("webhook-gitlab-push.json")).await;
    assert_eq!(gitlab["statusCode"], 202, "{gitlab}");

    // The secret is rotated in Secrets Manager: the first delivery signed with the new value makes
    // the running function read it again (a replay of the same delivery, so 200), and the old value
    // is refused from then on. (A forged delivery in the 30 s before would delay that read.)
    let config = sdk_config(&settings).await;
    aws_sdk_secretsmanager::Client::new(&config)
        .put_secret_value()
        .secret_id(&github_secret)
        .secret_string("rotated-webhook-secret")
        .send()
        .await
        .unwrap();
    let mut rotated = push.clone();
    let signature = lanes_core::commits::webhook::github_signature(
        b"rotated-webhook-secret",
        rotated["body"].as_str().unwrap().as_bytes(),
    );
    rotated["headers"]["x-hub-signature-256"] = Value::String(signature);
    let after = watch.invoke("webhook", &rotated).await;
    assert_eq!(after["statusCode"], 200, "signed with the rotated secret: {after}");
    let stale = watch.invoke("webhook", &push).await;
    assert_eq!(stale["statusCode"], 401, "signed with the secret before rotation: {stale}");

    let mut forged = push.clone();
    forged["body"] = Value::String(forged["body"].as_str().unwrap().replace("French", "German"));
    let forged = watch.invoke("webhook", &forged).await;
    assert_eq!(forged["statusCode"], 401, "{forged}");

    let queue = SqsQueue::connect(aws_sdk_sqs::Client::new(&config), &urls[2]).await.unwrap();
    let received =
        lanes_core::lease::receive_batch(&queue, 100, std::time::Duration::from_secs(60)).await.unwrap();
    assert_eq!(received.len(), 3, "two GitHub commits and one GitLab commit");
    let arn = "arn:aws:sqs:us-east-1:123456789012:lanes-commits";
    let answer = watch.invoke("worker", &lanes_tests::lambda_emulator::sqs_event(&received, arn)).await;
    // GitLab is unreachable: its commit is a retryable failure, handed back (a batch item failure);
    // the two GitHub commits are summarized and acked.
    let failures = answer["batchItemFailures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{answer}");
    let summaries = lanes_core::adapters::dynamodb::DynamoSummaries::new(
        aws_sdk_dynamodb::Client::new(&config),
        "lanes-hooks",
    );
    use lanes_core::ports::SummaryStore;
    let page = summaries.list_summaries(&"github:1296269".parse().unwrap(), 10, None).await.unwrap();
    assert_eq!(page.items.len(), 2, "{page:?}");
    assert!(page.items.iter().all(|s| s.summary.contains("not an LLM")), "offline model, labelled");
    assert_eq!(fetches.lock().unwrap().len(), 2);
}

/// The commits lane at tier `batch` in the real binaries: the `worker` binary hands the SQS batch's
/// commits to a provider batch (the emulator of OpenAI's Files and Batch APIs) and acks them, its
/// record in DynamoDB; the `controller` binary's scheduled tick collects the ended batch and writes
/// each summary at tier `batch`.
#[tokio::test]
async fn commits_worker_batches_and_the_controller_collects_under_cargo_lambda_watch() {
    use lanes_tests::mock_batches::{BatchTiming, MockBatches};
    let moto = MotoServer::start();
    let redis = RedisServer::start();
    let settings = moto.aws_settings();
    let urls =
        create_aws_resources(&settings, "batch", "lanes-batch", QueueSettings::default()).await.unwrap();
    let timing = BatchTiming {
        validating: std::time::Duration::from_millis(100),
        per_request: std::time::Duration::from_millis(10),
        ..Default::default()
    };
    let batches =
        MockBatches::start(std::sync::Arc::new(lanes_core::clock::SystemClock), timing).await.unwrap();
    let fetches = lanes_tests::Fetches::default();
    let github = lanes_tests::fake_github(fetches.clone()).await;
    let mut env = moto.env();
    env.extend(lanes_tests::stack_env("lanes-batch", &urls));
    env.extend(
        [
            ("REDIS_URL", redis.url()),
            ("LANES_LANE", "commits".to_owned()),
            ("LANES_TIER_COMMITS", "batch".to_owned()),
            ("LANES_LLM_ROUTES_COMMITS", format!("openai:gpt-4o-mini+batch@{}", batches.url)),
            ("OPENAI_API_KEY", "k".to_owned()),
            ("LANES_GITHUB_API_URL", github),
            ("RUST_LOG", "info".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    env.extend(controller_mappings());
    let watch = LambdaWatch::start(&env);
    let shas = ["3f786850e387550fdab836ed7e6dc881de23001b", "89e6c98d92887913cadf06b2adb97f26cde4849b"];
    let config = sdk_config(&settings).await;
    let queue = SqsQueue::connect(aws_sdk_sqs::Client::new(&config), &urls[2]).await.unwrap();
    for (i, sha) in shas.iter().enumerate() {
        let body = json!({"provider": "github", "repo_id": "github:1296269", "repo": "octo-org/hello-world",
            "sha": sha, "subject": format!("Change {i}")});
        let lane = std::collections::BTreeMap::from([("lane".to_owned(), "commits".to_owned())]);
        lanes_core::ports::QueueSend::send(&queue, &body.to_string(), lane).await.unwrap();
    }
    let received =
        lanes_core::lease::receive_batch(&queue, 10, std::time::Duration::from_secs(60)).await.unwrap();
    assert_eq!(received.len(), 2);
    let arn = "arn:aws:sqs:us-east-1:123456789012:lanes-commits";
    let answer = watch.invoke("worker", &lanes_tests::lambda_emulator::sqs_event(&received, arn)).await;
    assert_eq!(answer["batchItemFailures"].as_array().map(Vec::len), Some(0), "acked: {answer}");
    assert_eq!(batches.batches(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    watch.invoke("controller", &scheduled_tick()).await;
    let summaries = lanes_core::adapters::dynamodb::DynamoSummaries::new(
        aws_sdk_dynamodb::Client::new(&config),
        "lanes-batch",
    );
    use lanes_core::ports::SummaryStore;
    let page = summaries.list_summaries(&"github:1296269".parse().unwrap(), 10, None).await.unwrap();
    assert_eq!(page.items.len(), 2, "{page:?}");
    assert!(page.items.iter().all(|s| s.tier == lanes_core::domain::tier::Tier::Batch), "{page:?}");
    assert_eq!(batches.answered().len(), 2);
}

/// A synthesis task that opts in with `params.deadline_s`, in the real binaries: `ingress` accepts
/// it, the synthesis `worker` parks it in a provider batch (the emulator of OpenAI's Files and
/// Batch APIs) and acks its message, the task reads `PROCESSING` at tier `batch`; the
/// `controller`'s scheduled tick reads the ended batch and writes the answer with the parked
/// claim's fenced final write, at tier `batch`.
#[tokio::test]
async fn a_synthesis_task_batched_by_the_worker_is_finished_by_the_controller_under_cargo_lambda_watch() {
    use lanes_tests::mock_batches::{BatchTiming, MockBatches};
    let moto = MotoServer::start();
    let redis = RedisServer::start();
    let settings = moto.aws_settings();
    let urls =
        create_aws_resources(&settings, "tbatch", "lanes-tbatch", QueueSettings::default()).await.unwrap();
    let timing = BatchTiming {
        validating: std::time::Duration::from_millis(100),
        per_request: std::time::Duration::from_millis(10),
        ..Default::default()
    };
    let batches =
        MockBatches::start(std::sync::Arc::new(lanes_core::clock::SystemClock), timing).await.unwrap();
    let mut env = moto.env();
    env.extend(lanes_tests::stack_env("lanes-tbatch", &urls));
    env.extend(
        [
            ("REDIS_URL", redis.url()),
            ("LANES_LANE", "synthesis".to_owned()),
            ("LANES_LLM_ROUTES_SYNTHESIS", format!("openai:gpt-4o-mini+batch@{}", batches.url)),
            ("OPENAI_API_KEY", "k".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    env.extend(controller_mappings());
    let watch = LambdaWatch::start(&env);
    let mut event: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("events/api-post-task.json")).unwrap(),
    )
    .unwrap();
    event["body"] = json!({"project_id": "p1", "kind": "scaffold", "prompt": "a CLI that counts lines",
        "target_files": ["src/main.rs"], "params": {"deadline_s": 7200}})
    .to_string()
    .into();
    let accepted = watch.invoke("ingress", &event).await;
    assert_eq!(accepted["statusCode"], 202, "{accepted}");
    let body: Value = serde_json::from_str(accepted["body"].as_str().unwrap()).unwrap();
    let id = lanes_core::domain::TaskId::parse(body["task_id"].as_str().unwrap()).unwrap();

    let config = sdk_config(&settings).await;
    let queue = SqsQueue::connect(aws_sdk_sqs::Client::new(&config), &urls[1]).await.unwrap();
    let received =
        lanes_core::lease::receive_batch(&queue, 10, std::time::Duration::from_secs(60)).await.unwrap();
    assert_eq!(received.len(), 1);
    let arn = "arn:aws:sqs:us-east-1:123456789012:lanes-synthesis";
    let answer = watch.invoke("worker", &lanes_tests::lambda_emulator::sqs_event(&received, arn)).await;
    assert_eq!(answer["batchItemFailures"].as_array().map(Vec::len), Some(0), "acked: {answer}");
    assert_eq!(batches.batches(), 1);
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), "lanes-tbatch");
    let now = lanes_core::clock::Clock::now_ms(&lanes_core::clock::SystemClock);
    let parked = store.get(&id, now).await.unwrap().unwrap().view();
    assert_eq!(
        (parked.status, parked.tier),
        (TaskStatus::Processing, Some(lanes_core::domain::tier::Tier::Batch))
    );

    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    watch.invoke("controller", &scheduled_tick()).await;
    let now = lanes_core::clock::Clock::now_ms(&lanes_core::clock::SystemClock);
    let done = store.get(&id, now).await.unwrap().unwrap();
    assert_eq!(done.status, TaskStatus::Completed, "{done:?}");
    let result = done.result.unwrap();
    assert_eq!((result.tier, done.fence), (lanes_core::domain::tier::Tier::Batch, 1));
    assert!(result.cost_usd.is_some_and(|c| c > 0.0), "{:?}", result.cost_usd);
}

/// The controller's mappings: none exist in moto, so each lane is skipped and said so.
fn controller_mappings() -> Vec<(String, String)> {
    ["INTERACTIVE", "SYNTHESIS", "COMMITS"]
        .iter()
        .enumerate()
        .map(|(i, lane)| {
            (format!("LANES_MAPPING_{lane}"), format!("00000000-0000-0000-0000-00000000000{}", i + 1))
        })
        .collect()
}

/// The EventBridge event of the controller's one-minute schedule.
fn scheduled_tick() -> Value {
    json!({"version": "0", "id": "t", "detail-type": "Scheduled Event", "source": "aws.events",
        "account": "123456789012", "time": "2026-12-05T00:00:00Z", "region": "us-east-1", "resources": [], "detail": {}})
}

/// A task's events from the real `ingress` binary both ways it is deployed: streamed as it runs
/// through the function URL path (`LANES_INGRESS_RESPONSE=stream`, `lambda_http`'s streaming
/// response, under `cargo lambda watch`'s function URL emulation), and in buffered parts through
/// the HTTP API event, resumed with `Last-Event-ID`. The `worker` binary writes the run's events to
/// Redis Streams as the offline model's pieces come.
#[tokio::test]
async fn a_task_streams_through_the_ingress_binarys_function_url_under_cargo_lambda_watch() {
    use eventsource_stream::Eventsource;
    use futures::StreamExt;
    let moto = MotoServer::start();
    let redis = RedisServer::start();
    let settings = moto.aws_settings();
    let urls =
        create_aws_resources(&settings, "streams", "lanes-streams", QueueSettings::default()).await.unwrap();
    let mut env = moto.env();
    env.extend(lanes_tests::stack_env("lanes-streams", &urls));
    env.extend(
        [
            ("REDIS_URL", redis.url()),
            ("LANES_LANE", "interactive".to_owned()),
            // The offline model's answer comes in pieces over two seconds.
            ("LANES_OFFLINE_LATENCY_MS", "2000".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let api = LambdaWatch::start(&env);
    let post: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("events/api-post-task.json")).unwrap(),
    )
    .unwrap();
    let accepted = api.invoke("ingress", &post).await;
    assert_eq!(accepted["statusCode"], 202, "{accepted}");
    let id = serde_json::from_str::<Value>(accepted["body"].as_str().unwrap()).unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The streamed route, behind a function URL: no authorizer here, so tenancy is off.
    env.extend(
        [("LANES_INGRESS_RESPONSE", "stream"), ("LANES_TENANCY", "off")]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    let stream = LambdaWatch::start(&env);
    let url =
        |task: &str| format!("http://127.0.0.1:{}/lambda-url/ingress/v1/tasks/{task}/events", stream.port);
    let client = reqwest::Client::new();
    // The first request builds the function; an unknown task is a 404 there as in the API.
    let unknown =
        client.get(url(&"0".repeat(64))).timeout(std::time::Duration::from_secs(300)).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    // Streamed, the headers come at once; a buffered answer would hold them until the task ends.
    let resp = tokio::time::timeout(std::time::Duration::from_secs(30), client.get(url(&id)).send())
        .await
        .expect("the stream's headers come before the task runs")
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let reader = tokio::spawn(async move {
        let mut events = resp.bytes_stream().eventsource();
        let mut got = Vec::new();
        while let Some(e) = events.next().await {
            let e = e.unwrap();
            let end = e.event == "result" || e.event == "error";
            got.push((
                e.event,
                e.id,
                serde_json::from_str::<Value>(&e.data).unwrap(),
                std::time::Instant::now(),
            ));
            if end {
                break;
            }
        }
        got
    });

    let config = sdk_config(&settings).await;
    let queue = SqsQueue::connect(aws_sdk_sqs::Client::new(&config), &urls[0]).await.unwrap();
    let received = queue.receive(10).await.unwrap();
    let arn = "arn:aws:sqs:us-east-1:123456789012:lanes-interactive";
    let answer = api.invoke("worker", &lanes_tests::lambda_emulator::sqs_event(&received, arn)).await;
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
    let got = tokio::time::timeout(std::time::Duration::from_secs(60), reader).await.unwrap().unwrap();
    let names: Vec<&str> = got.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names.first(), Some(&"status"), "{names:?}");
    let (last, deltas): (_, Vec<_>) = (got.last().unwrap(), got.iter().filter(|e| e.0 == "delta").collect());
    assert_eq!(last.0, "result", "{names:?}");
    let text: String = deltas.iter().map(|d| d.2["text"].as_str().unwrap()).collect();
    assert_eq!(text, last.2["result"]["text"].as_str().unwrap(), "the deltas make the result");
    assert!(deltas.len() >= 4, "in pieces: {names:?}");
    // Streamed, not buffered: the first text came well before the end.
    assert!(last.3.duration_since(deltas[0].3) >= std::time::Duration::from_millis(800), "{names:?}");

    // The HTTP API's route, buffered: after the second piece, the rest and the result.
    let mut get: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("events/api-get-task.json")).unwrap(),
    )
    .unwrap();
    let path = format!("/v1/tasks/{id}/events");
    get["rawPath"] = path.clone().into();
    get["requestContext"]["http"]["path"] = path.into();
    get["pathParameters"]["proxy"] = format!("tasks/{id}/events").into();
    get["headers"]["last-event-id"] = deltas[1].1.clone().into();
    let part = api.invoke("ingress", &get).await;
    assert_eq!(part["statusCode"], 200, "{part}");
    let body = part["body"].as_str().unwrap();
    let rest: String = body
        .split("\n\n")
        .filter(|b| b.contains("event: delta") || b.contains("event:delta"))
        .filter_map(|b| b.lines().find_map(|l| l.strip_prefix("data:")))
        .map(|d| serde_json::from_str::<Value>(d.trim()).unwrap()["text"].as_str().unwrap().to_owned())
        .collect();
    let first_two: String = deltas[..2].iter().map(|d| d.2["text"].as_str().unwrap()).collect();
    assert_eq!(first_two + &rest, text, "{body}");
    assert!(body.contains("event: result") || body.contains("event:result"), "{body}");
}
