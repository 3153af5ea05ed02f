//! What AWS does that moto does not emulate, against the loopback stub answering the documented
//! shapes: throttling retried with backoff (and every attempt counted by the SDK interceptor),
//! `BatchGetItem`'s unprocessed keys, and the DLQ redrive through SQS's message move task. moto
//! stays the main integration tier (`aws_adapters`); these cover only what it lacks.
//!
//! The tests read the process-wide request counter, so they take turns (`SERIAL`), and no other
//! test in this binary talks to AWS.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::adapters::AwsClients;
use lanes_core::clock::{SharedClock, SystemClock};
use lanes_core::domain::{TaskMessage, TaskRecord, TaskRequest, TaskStatus};
use lanes_core::metrics::AWS_REQUESTS;
use lanes_core::ports::*;
use lanes_tests::aws_stub::{Answer, AwsStub};
use lanes_tests::now_ms;
use serde_json::json;
use std::sync::Arc;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn counted(service: &str, operation: &str) -> u64 {
    AWS_REQUESTS.with_label_values(&[service, operation]).get()
}

fn record(prompt: &str) -> TaskRecord {
    let req = TaskRequest::from_value(
        json!({"project_id":"p","kind":"refactor","prompt":prompt,"target_files":[]}),
    )
    .unwrap();
    TaskRecord::pending(req.task_id(None), req, now_ms(), 3600)
}

/// SQS's `RequestThrottled` and DynamoDB's `ProvisionedThroughputExceededException` and
/// `ThrottlingException` are retried by the SDK's standard retry (three attempts, backing off), so a
/// short storm costs latency, not a failed write; a storm longer than the attempts is an
/// `Unavailable` the callers already retry. The interceptor counts every attempt, as the stub saw it.
#[tokio::test]
async fn throttling_is_retried_and_every_attempt_is_counted() {
    let _turn = SERIAL.lock().await;
    let stub = AwsStub::start().await;
    let clients = AwsClients::load(&stub.aws_settings()).await;
    let queue = clients.queue_sender(&format!("{}/123456789012/lane", stub.url));
    let store = clients.task_store("lanes");

    let sends = counted("sqs", "SendMessage");
    stub.script("SendMessage", (0..2).map(|_| Answer::sqs_error(400, "RequestThrottled", "Rate exceeded")));
    stub.script(
        "SendMessage",
        [Answer::ok(r#"{"MessageId":"5fea7756-0ea4-451a-a703-a558b933e274","MD5OfMessageBody":"x"}"#)],
    );
    let id = queue.send("{}", Default::default()).await.unwrap();
    assert_eq!(id, "5fea7756-0ea4-451a-a703-a558b933e274");
    assert_eq!(stub.count("SendMessage"), 3);
    assert_eq!(counted("sqs", "SendMessage") - sends, 3, "retries are counted");

    let gets = counted("dynamodb", "GetItem");
    stub.script(
        "GetItem",
        [
            Answer::dynamodb_error(
                400,
                "ProvisionedThroughputExceededException",
                "The level of configured provisioned throughput for the table was exceeded.",
            ),
            Answer::dynamodb_error(
                400,
                "ThrottlingException",
                "Rate of requests exceeds the allowed throughput.",
            ),
            Answer::ok("{}"),
        ],
    );
    assert_eq!(store.get(&"a".repeat(64).parse().unwrap(), now_ms()).await.unwrap(), None);
    assert_eq!(counted("dynamodb", "GetItem") - gets, 3);

    // A storm longer than the attempts: unavailable (retryable), after exactly three attempts.
    let before = stub.count("GetItem");
    stub.script(
        "GetItem",
        (0..5).map(|_| {
            Answer::dynamodb_error(
                400,
                "ThrottlingException",
                "Rate of requests exceeds the allowed throughput.",
            )
        }),
    );
    let err = store.get(&"a".repeat(64).parse().unwrap(), now_ms()).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(ref m) if m.contains("ThrottlingException")), "{err:?}");
    assert_eq!(stub.count("GetItem") - before, 3);
}

/// `BatchGetItem` may answer part of a batch and return the rest as `UnprocessedKeys` (documented
/// under throughput pressure; moto never does): the store asks again for exactly those keys until
/// every record is read.
#[tokio::test]
async fn unprocessed_keys_are_asked_for_again() {
    let _turn = SERIAL.lock().await;
    let stub = AwsStub::start().await;
    let clients = AwsClients::load(&stub.aws_settings()).await;
    let store = clients.task_store("lanes");
    // The items as this store writes them: captured from its own PutItem requests.
    let records = [record("a"), record("b"), record("c")];
    for r in &records {
        store.put_pending(r, now_ms()).await.unwrap();
    }
    let items: Vec<serde_json::Value> =
        stub.bodies("PutItem").into_iter().map(|b| b["Item"].clone()).collect();
    let key = |i: &serde_json::Value| json!({"pk": i["pk"].clone()});
    stub.script(
        "BatchGetItem",
        [
            Answer::ok(
                &json!({
                    "Responses": {"lanes": [items[0].clone()]},
                    "UnprocessedKeys": {"lanes": {"Keys": [key(&items[1]), key(&items[2])], "ConsistentRead": true}}
                })
                .to_string(),
            ),
            Answer::ok(
                &json!({
                    "Responses": {"lanes": [items[1].clone()]},
                    "UnprocessedKeys": {"lanes": {"Keys": [key(&items[2])], "ConsistentRead": true}}
                })
                .to_string(),
            ),
            Answer::ok(&json!({"Responses": {"lanes": [items[2].clone()]}, "UnprocessedKeys": {}}).to_string()),
        ],
    );
    let ids: Vec<lanes_core::domain::TaskId> = records.iter().map(|r| r.task_id.clone()).collect();
    let got = store.get_many(&ids, now_ms()).await.unwrap();
    assert_eq!(got.len(), 3, "every record read");
    let asked: Vec<usize> = stub
        .bodies("BatchGetItem")
        .iter()
        .map(|b| b["RequestItems"]["lanes"]["Keys"].as_array().map_or(0, Vec::len))
        .collect();
    assert_eq!(asked, [3, 2, 1], "each retry asks for the unprocessed keys only");

    // Keys that never get processed end in a bounded, retryable error.
    let endless =
        json!({"Responses": {"lanes": []}, "UnprocessedKeys": {"lanes": {"Keys": [key(&items[0])]}}});
    stub.script("BatchGetItem", (0..20).map(|_| Answer::ok(&endless.to_string())));
    let err = store.get_many(&ids[..1], now_ms()).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
}

/// `lanes dlq redrive --backend aws --move-task`: the failed task's record is reset to `PENDING`,
/// the completed task's message deleted, and then one `StartMessageMoveTask` from the DLQ's ARN to
/// the lane's (both read from the queue's attributes and redrive policy); `ListMessageMoveTasks`
/// answers are read in their documented shape.
#[tokio::test]
async fn the_move_task_redrive_resets_records_then_starts_one_move() {
    let _turn = SERIAL.lock().await;
    let stub = AwsStub::start().await;
    let clients = AwsClients::load(&stub.aws_settings()).await;
    let lane_arn = "arn:aws:sqs:us-east-1:123456789012:lanes-synthesis";
    let dlq_arn = "arn:aws:sqs:us-east-1:123456789012:lanes-synthesis-dlq";
    let policy = json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 10}).to_string();
    stub.script(
        "GetQueueAttributes",
        [Answer::ok(&json!({"Attributes": {"RedrivePolicy": policy, "QueueArn": lane_arn}}).to_string())],
    );
    stub.script(
        "GetQueueUrl",
        [Answer::ok(
            &json!({"QueueUrl": format!("{}/123456789012/lanes-synthesis-dlq", stub.url)}).to_string(),
        )],
    );
    let lane = clients.queue(&format!("{}/123456789012/lanes-synthesis", stub.url)).await.unwrap();
    let dlq = lane.dead_letter_queue().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let store =
        lanes_core::embedded::EmbeddedStore::new(lanes_core::embedded::EmbeddedDb::open(dir.path()).unwrap());
    let clock: SharedClock = Arc::new(SystemClock);
    let (failed, completed) = (record("failed"), record("completed"));
    for (r, end) in
        [(&failed, Completion::Failed("boom".into())), (&completed, Completion::Failed("x".into()))]
    {
        store.put_pending(r, now_ms()).await.unwrap();
        let ClaimOutcome::Claimed(c) = store.claim(&r.task_id, now_ms(), 3600).await.unwrap() else {
            panic!()
        };
        let end = if r.task_id == completed.task_id {
            Completion::Completed(lanes_core::domain::TaskResult {
                text_ref: None,
                text: "t".into(),
                model: "m".into(),
                tokens: Default::default(),
                truncated: false,
                cost_usd: None,
                tier: Default::default(),
                tokens_saved: 0,
            })
        } else {
            end
        };
        store.finish(&r.task_id, c.fence, end, now_ms(), 3600).await.unwrap();
    }
    let message = |n: usize, r: &TaskRecord| {
        let body = serde_json::to_string(&TaskMessage {
            task_id: r.task_id.clone(),
            lane: r.lane,
            kind: r.request.kind,
        })
        .unwrap();
        json!({
            "MessageId": format!("m{n}"), "ReceiptHandle": format!("rh{n}"), "Body": body,
            "MD5OfBody": "x",
            "Attributes": {"SentTimestamp": now_ms().to_string(), "ApproximateReceiveCount": "1"},
        })
    };
    stub.script(
        "ReceiveMessage",
        [Answer::ok(&json!({"Messages": [message(1, &failed), message(2, &completed)]}).to_string())],
    );
    stub.script("StartMessageMoveTask", [Answer::ok(r#"{"TaskHandle":"eyJ0YXNrSWQiOiIxIn0="}"#)]);

    // The DLQ's depth: the two messages, in flight while they are looked at.
    stub.script(
        "GetQueueAttributes",
        [Answer::ok(
            r#"{"Attributes":{"ApproximateNumberOfMessages":"0","ApproximateNumberOfMessagesNotVisible":"2"}}"#,
        )],
    );
    let report = lanes_core::dlq::redrive_by_move(&dlq, &lane, &store, &clock, 3600, 100).await.unwrap();
    assert_eq!((report.redriven, report.already_completed), (1, 1), "{report:?}");
    assert_eq!(report.move_task.as_deref(), Some("eyJ0YXNrSWQiOiIxIn0="));
    assert_eq!(store.get(&failed.task_id, now_ms()).await.unwrap().unwrap().status, TaskStatus::Pending);
    assert_eq!(
        stub.bodies("DeleteMessage"),
        [
            json!({"QueueUrl": format!("{}/123456789012/lanes-synthesis-dlq", stub.url), "ReceiptHandle": "rh2"})
        ]
    );
    let start = stub.bodies("StartMessageMoveTask");
    assert_eq!(start, [json!({"SourceArn": dlq_arn, "DestinationArn": lane_arn})]);
    let released = stub.bodies("ChangeMessageVisibility");
    assert_eq!(released.len(), 1, "the kept message is visible again before the move");
    assert_eq!(released[0]["VisibilityTimeout"], 0);

    stub.script(
        "ListMessageMoveTasks",
        [Answer::ok(
            &json!({"Results": [
                {"TaskHandle": "eyJ0YXNrSWQiOiIxIn0=", "Status": "RUNNING", "SourceArn": dlq_arn,
                 "DestinationArn": lane_arn, "ApproximateNumberOfMessagesMoved": 1,
                 "ApproximateNumberOfMessagesToMove": 4, "StartedTimestamp": 1_700_000_000_000_i64},
                {"Status": "FAILED", "SourceArn": dlq_arn, "FailureReason": "AWS.SimpleQueueService.NonExistentQueue",
                 "ApproximateNumberOfMessagesMoved": 0, "StartedTimestamp": 1_690_000_000_000_i64}
            ]})
            .to_string(),
        )],
    );
    let moves = dlq.move_tasks().await.unwrap();
    assert_eq!(stub.bodies("ListMessageMoveTasks")[0]["SourceArn"], dlq_arn);
    assert_eq!(moves[0].status, "RUNNING");
    assert_eq!((moves[0].moved, moves[0].to_move, moves[0].started_at_ms), (1, Some(4), 1_700_000_000_000));
    assert_eq!(moves[1].failure_reason.as_deref(), Some("AWS.SimpleQueueService.NonExistentQueue"));
    assert_eq!(moves[1].handle, None);

    // A plain lane queue handle is no DLQ: no move is started.
    assert!(matches!(lane.start_move_back().await, Err(QueueError::Rejected(_))));
    assert_eq!(stub.count("StartMessageMoveTask"), 1);

    // The move cannot start (the operator may not): the messages are relayed instead.
    let ClaimOutcome::Claimed(c) = store.claim(&failed.task_id, now_ms(), 3600).await.unwrap() else {
        panic!()
    };
    store.finish(&failed.task_id, c.fence, Completion::Failed("again".into()), now_ms(), 3600).await.unwrap();
    let one = json!({"Messages": [message(3, &failed)]}).to_string();
    stub.script("ReceiveMessage", [Answer::ok(&one), Answer::ok(r#"{}"#), Answer::ok(&one)]);
    stub.script(
        "GetQueueAttributes",
        [Answer::ok(r#"{"Attributes":{"ApproximateNumberOfMessages":"0","ApproximateNumberOfMessagesNotVisible":"1"}}"#)],
    );
    stub.script(
        "StartMessageMoveTask",
        [Answer::sqs_error(400, "AccessDenied", "not authorized to perform sqs:StartMessageMoveTask")],
    );
    stub.script("SendMessage", [Answer::ok(r#"{"MessageId":"m9","MD5OfMessageBody":"x"}"#)]);
    let report = lanes_core::dlq::redrive_by_move(&dlq, &lane, &store, &clock, 3600, 100).await.unwrap();
    assert_eq!(report.move_task, None);
    assert!(report.move_error.as_deref().unwrap_or("").contains("AccessDenied"), "{report:?}");
    assert_eq!(report.redriven, 1, "{report:?}");
    assert_eq!(stub.count("SendMessage"), 1, "relayed to the lane");
    assert_eq!(store.get(&failed.task_id, now_ms()).await.unwrap().unwrap().status, TaskStatus::Pending);
}

/// The trace header travels as SQS's `AWSTraceHeader` system attribute (the only one SQS accepts,
/// and what Lambda joins traces by), never as a message attribute; a received message's
/// `AWSTraceHeader` system attribute is handed to the worker with the others.
#[tokio::test]
async fn the_trace_header_is_an_sqs_system_attribute() {
    let _turn = SERIAL.lock().await;
    let stub = AwsStub::start().await;
    let clients = AwsClients::load(&stub.aws_settings()).await;
    let queue = clients.queue_sender(&format!("{}/123456789012/lane", stub.url));
    let h = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
    let attrs = std::collections::BTreeMap::from([
        ("lane".to_owned(), "interactive".to_owned()),
        (lanes_core::trace::TRACE_HEADER.to_owned(), h.to_owned()),
    ]);
    stub.script("SendMessage", [Answer::ok(r#"{"MessageId":"m1","MD5OfMessageBody":"x"}"#)]);
    queue.send("{}", attrs).await.unwrap();
    let sent = &stub.bodies("SendMessage")[0];
    assert_eq!(
        sent["MessageSystemAttributes"]["AWSTraceHeader"],
        json!({"DataType": "String", "StringValue": h})
    );
    assert!(sent["MessageAttributes"].get("AWSTraceHeader").is_none(), "{sent}");
    assert_eq!(sent["MessageAttributes"]["lane"]["StringValue"], "interactive");

    stub.script(
        "ReceiveMessage",
        [Answer::ok(
            &json!({"Messages": [{"MessageId": "m1", "ReceiptHandle": "rh", "Body": "{}", "MD5OfBody": "x",
                "Attributes": {"SentTimestamp": "1700000000000", "ApproximateReceiveCount": "1", "AWSTraceHeader": h}}]})
            .to_string(),
        )],
    );
    let got = queue.receive(1).await.unwrap();
    assert_eq!(got[0].attributes[lanes_core::trace::TRACE_HEADER], h);
}

/// Renewing many leases at once: ten receipts a `ChangeMessageVisibilityBatch` request (25 leases,
/// 3 requests), each entry SQS fails mapped as the single call's error would be (a lost receipt
/// answered `ReceiptHandleIsInvalid` or `InvalidParameterValue` is a lost lease; others unavailable),
/// and a failed request fails only its own ten.
#[tokio::test]
async fn visibility_renewals_go_ten_a_request() {
    let _turn = SERIAL.lock().await;
    let stub = AwsStub::start().await;
    let clients = AwsClients::load(&stub.aws_settings()).await;
    let queue = clients.queue_sender(&format!("{}/123456789012/lanes-commits", stub.url));
    let receipts: Vec<String> = (0..25).map(|i| format!("rh{i}")).collect();
    stub.script(
        "ChangeMessageVisibilityBatch",
        [
            Answer::ok(
                &json!({
                    "Successful": (0..10).filter(|i| *i != 3 && *i != 7).map(|i| json!({"Id": i.to_string()})).collect::<Vec<_>>(),
                    "Failed": [
                        {"Id": "3", "SenderFault": true, "Code": "ReceiptHandleIsInvalid", "Message": "The input receipt handle is invalid."},
                        {"Id": "7", "SenderFault": false, "Code": "InternalError", "Message": "try again"}
                    ]
                })
                .to_string(),
            )
            .when("/Entries/0/ReceiptHandle", json!("rh0")),
            // An entry SQS lists neither as done nor as failed (rh15) is not taken for renewed.
            Answer::ok(&json!({"Successful": (0..10).filter(|i| *i != 5).map(|i| json!({"Id": i.to_string()})).collect::<Vec<_>>(), "Failed": []}).to_string())
                .when("/Entries/0/ReceiptHandle", json!("rh10")),
            Answer::sqs_error(400, "AccessDenied", "not allowed").when("/Entries/0/ReceiptHandle", json!("rh20")),
        ],
    );
    let before = counted("sqs", "ChangeMessageVisibilityBatch");
    let results = queue.change_visibility_many(&receipts, std::time::Duration::from_secs(15)).await;
    assert_eq!(results.len(), 25);
    assert_eq!(stub.count("ChangeMessageVisibilityBatch"), 3, "25 leases, 3 requests");
    assert_eq!(counted("sqs", "ChangeMessageVisibilityBatch") - before, 3);
    assert!(matches!(results[3], Err(QueueError::ReceiptInvalid)), "{:?}", results[3]);
    assert!(matches!(results[7], Err(QueueError::Unavailable(_))), "{:?}", results[7]);
    assert!(matches!(results[15], Err(QueueError::Unavailable(_))), "{:?}", results[15]);
    assert!(results[..20].iter().enumerate().all(|(i, r)| i == 3 || i == 7 || i == 15 || r.is_ok()));
    assert!(
        results[20..].iter().all(|r| matches!(r, Err(QueueError::Unavailable(_)))),
        "the failed request's five"
    );
    let bodies = stub.bodies("ChangeMessageVisibilityBatch");
    let first = bodies.iter().find(|b| b["Entries"][0]["ReceiptHandle"] == "rh0").unwrap();
    assert_eq!(first["Entries"][3], json!({"Id": "3", "ReceiptHandle": "rh3", "VisibilityTimeout": 15}));
    let last = bodies.iter().find(|b| b["Entries"][0]["ReceiptHandle"] == "rh20").unwrap();
    assert_eq!(last["Entries"].as_array().unwrap().len(), 5);
    assert_eq!(stub.count("ChangeMessageVisibility"), 0);
}
