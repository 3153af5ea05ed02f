//! End-to-end of the real Lambda binaries under `cargo lambda watch`: `ingress` invoked with
//! `events/api-post-task.json`, `worker` invoked with the SQS batch built from what ingress really
//! sent, against moto and redis-server.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::adapters::dynamodb::DynamoStore;
use lanes_core::adapters::sdk_config;
use lanes_core::adapters::sqs::SqsQueue;
use lanes_core::backend::create_aws_resources;
use lanes_core::domain::TaskStatus;
use lanes_core::embedded::QueueSettings;
use lanes_core::ports::{QueueConsume, TaskStore};
use lanes_tests::{LambdaWatch, MotoServer, RedisServer, workspace_root};
use serde_json::{Value, json};

#[tokio::test]
async fn ingress_and_worker_binaries_under_cargo_lambda_watch() {
    let moto = MotoServer::start();
    let redis = RedisServer::start();
    let settings = moto.aws_settings();
    let urls =
        create_aws_resources(&settings, "lanes", "lanes-tasks", QueueSettings::default()).await.unwrap();
    let mut env = moto.env();
    env.extend(
        [
            ("LANES_BACKEND", "aws".to_owned()),
            ("LANES_TABLE", "lanes-tasks".to_owned()),
            ("LANES_QUEUE_URL_INTERACTIVE", urls[0].clone()),
            ("LANES_QUEUE_URL_SYNTHESIS", urls[1].clone()),
            ("LANES_QUEUE_URL_COMMITS", urls[2].clone()),
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

    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), "lanes-tasks");
    let now = lanes_tests::now_ms();
    let rec = store.get(&task_id, now).await.unwrap().unwrap();
    assert_eq!((rec.status, rec.fence), (TaskStatus::Completed, 1));
    assert_eq!(queue.depth().await.unwrap().visible + queue.depth().await.unwrap().in_flight, 0, "acked");

    let again = watch.invoke("ingress", &event).await;
    assert_eq!(again["statusCode"], 200, "{again}");
    let done: Value = serde_json::from_str(again["body"].as_str().unwrap()).unwrap();
    assert_eq!(done["status"], "COMPLETED");
    assert!(done["result"]["text"].as_str().unwrap().contains("NOT an LLM"));
}
