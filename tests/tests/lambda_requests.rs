//! What one Lambda invocation's batch of tasks costs in requests, against moto (SQS, DynamoDB) and
//! redis-server: the worker's batch handler on ten deliveries received the way the event source
//! mapping receives them (the queue's long visibility). Its own test binary, because the request
//! counter is process-wide and nothing else may run beside it.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use aws_lambda_events::event::sqs::SqsMessage;
use lanes_core::clock::{SharedClock, SystemClock};
use lanes_core::config::WorkerConfig;
use lanes_core::domain::Lane;
use lanes_core::domain::{TaskMessage, TaskRecord, TaskRequest, TaskStatus};
use lanes_core::embedded::QueueSettings;
use lanes_core::lambda::handle_batch;
use lanes_core::llm::OfflineProvider;
use lanes_core::metrics::Metrics;
use lanes_core::tasks::worker::Worker;
use lanes_core::wiring::{AwsBackendConfig, create_aws_resources};
use lanes_tests::{MotoServer, RedisServer, now_ms};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// `lanes_aws_requests_total` as `service operation -> count`.
fn requests() -> BTreeMap<String, f64> {
    lanes_tests::aws_requests_in(&Metrics::new().render())
}

#[tokio::test]
async fn a_lambda_batch_of_ten_tasks_starts_and_renews_its_leases_together_and_deletes_nothing() {
    let moto = MotoServer::start();
    let redis = RedisServer::start();
    let settings = moto.aws_settings();
    let urls =
        create_aws_resources(&settings, "batch", "lanes-batch", QueueSettings::default()).await.unwrap();
    let config = AwsBackendConfig {
        results_bucket: None,
        aws: settings,
        table: "lanes-batch".into(),
        queue_urls: urls,
        redis: redis.settings(false),
        redrive: None,
    };
    let adapters = lanes_core::wiring::aws(&config, &[Lane::Interactive]).await.unwrap();
    let (queue, send) = (adapters.consume[0].clone(), adapters.send[0].clone());
    let mut ids = Vec::new();
    for i in 0..10 {
        let req = TaskRequest::from_value(
            json!({"project_id":"p","kind":"explain","prompt":format!("batch {i}"),"target_files":[]}),
        )
        .unwrap();
        let rec = TaskRecord::pending(req.task_id(None), req, now_ms(), 3600);
        adapters.store.put_pending(&rec, now_ms()).await.unwrap();
        let msg = TaskMessage { task_id: rec.task_id.clone(), lane: rec.lane, kind: rec.request.kind };
        send.send(&serde_json::to_string(&msg).unwrap(), Default::default()).await.unwrap();
        ids.push(rec.task_id);
    }
    // Received as the mapping receives: the queue's own (long) visibility.
    let received = lanes_tests::receive_n(&*queue, 10).await;
    let records: Vec<SqsMessage> = received.iter().map(lanes_tests::sqs_record).collect();
    let clock: SharedClock = Arc::new(SystemClock);
    // Each task runs 1.2 s, under a 1.5 s lease renewed every 0.5 s.
    let worker = Worker {
        objects: None,
        events: None,
        store: adapters.store.clone(),
        lock: adapters.lock.clone(),
        cache: adapters.cache.clone(),
        llm: Arc::new(OfflineProvider::new(|_| Duration::from_millis(1200))),
        metrics: Metrics::new(),
        clock,
        config: WorkerConfig::default().with_lease(Duration::from_millis(1500)),
        batching: Default::default(),
    };

    // Three slots for ten tasks: four rounds, so most deliveries wait longer than a lease for their
    // slot and the first ones stay settled longer than a lease before the invocation returns. A
    // watcher samples the queue all along: no delivery may become visible meanwhile.
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (queue, watching) = (queue.clone(), watching.clone());
        tokio::spawn(async move {
            let mut most = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(queue.depth().await.unwrap().visible);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            most
        })
    };
    let before = requests();
    let started = std::time::Instant::now();
    let response =
        handle_batch(&worker, &queue, Lane::Interactive, &records, Duration::from_secs(30), 3).await;
    let ran = started.elapsed().as_secs_f64();
    let after = requests();
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(watcher.await.unwrap(), 0, "a waiting or settled delivery became visible mid-batch");
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    let spent = lanes_tests::requests_between(&before, &after);
    eprintln!("a Lambda batch of 10 tasks, worker side: {spent:?}");
    let get = |k: &str| spent.get(k).copied().unwrap_or(0.0);
    // Per task: the claim and the fenced finish, the lock, the finished record in the cache.
    assert_eq!(get("dynamodb UpdateItem"), 20.0, "{spent:?}");
    assert_eq!(get("redis EVALSHA acquire"), 10.0, "{spent:?}");
    assert_eq!(get("redis SET"), 10.0, "{spent:?}");
    // Per batch: one lease start and one renewal a beat, ten deliveries a request; nothing one by
    // one, and no delete (the mapping deletes what the answer does not name).
    assert_eq!(get("sqs ChangeMessageVisibility"), 0.0, "{spent:?}");
    assert_eq!(get("sqs DeleteMessage"), 0.0, "{spent:?}");
    let batches = get("sqs ChangeMessageVisibilityBatch");
    let beats = (ran / 0.5).floor();
    assert!(
        batches >= 2.0 && batches <= beats + 2.0,
        "lease start plus a beat per 0.5 s of {ran:.1} s: {spent:?}"
    );
    eprintln!(
        "  per task: {} UpdateItem, no DeleteMessage, {} ChangeMessageVisibilityBatch (the lease start and every beat of {ran:.1} s); ingress adds PutItem and SendMessage",
        get("dynamodb UpdateItem") / 10.0,
        batches / 10.0
    );

    // Everything settled is still hidden, and gone once the mapping deletes it.
    let depth = queue.depth().await.unwrap();
    assert_eq!((depth.visible, depth.in_flight), (0, 10));
    lanes_tests::mapping_deletes(&*queue, &records, &response).await.unwrap();
    let depth = queue.depth().await.unwrap();
    assert_eq!((depth.visible, depth.in_flight), (0, 0));
    for id in &ids {
        assert_eq!(adapters.store.get(id, now_ms()).await.unwrap().unwrap().status, TaskStatus::Completed);
    }
}
