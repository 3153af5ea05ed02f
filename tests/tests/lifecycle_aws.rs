//! The lifecycle's two promises on the AWS backend (DynamoDB and SQS on moto, a real redis-server),
//! in the cases that broke them: a duplicate POST answered 202 while SQS's `SendMessage` stalls and
//! fails (through a TCP proxy in front of moto) still gets its task run; and a retry of an accepted
//! task gets that task back although its project's daily budget is spent.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::adapters::dynamodb::DynamoStore;
use lanes_core::adapters::redis::{RedisCache, RedisLock, connect};
use lanes_core::adapters::sdk_config;
use lanes_core::adapters::sqs::{SqsQueue, create_queue_with_dlq};
use lanes_core::clock::{SharedClock, SystemClock};
use lanes_core::config::{IngressConfig, WorkerConfig};
use lanes_core::domain::{TaskRequest, TaskStatus};
use lanes_core::llm::OfflineProvider;
use lanes_core::metrics::Metrics;
use lanes_core::ports::{Cache, PutThenSend, QueueConsume, QueueSend, TaskStore, UNSENT};
use lanes_core::tasks::ingress::{Ingress, router};
use lanes_core::tasks::worker::{Outcome, Worker};
use lanes_tests::{MotoServer, RedisServer, now_ms};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A TCP proxy to `upstream` on a free loopback port; while `stall` is set, every connection it
/// accepts is held for 4 s and then closed, as an endpoint in a brown-out does.
async fn proxy(upstream: u16, stall: Arc<AtomicBool>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let stall = stall.clone();
            tokio::spawn(async move {
                if stall.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    return;
                }
                if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    port
}

struct Rig {
    url: String,
    store: DynamoStore,
    worker: Worker,
    queue: Arc<SqsQueue>,
    cache: Arc<RedisCache>,
    stall: Arc<AtomicBool>,
    _moto: MotoServer,
    _redis: RedisServer,
}

async fn rig(config: IngressConfig) -> Rig {
    let moto = MotoServer::start();
    let redis = RedisServer::start();
    let conf = sdk_config(&moto.aws_settings()).await;
    let dynamo = aws_sdk_dynamodb::Client::new(&conf);
    DynamoStore::create_table(&dynamo, "lanes-tasks").await.unwrap();
    let store = DynamoStore::new(dynamo, "lanes-tasks");
    let sqs = aws_sdk_sqs::Client::new(&conf);
    let url = create_queue_with_dlq(&sqs, "interactive", Duration::from_secs(900), 5).await.unwrap();
    let queue = Arc::new(SqsQueue::connect(sqs, &url).await.unwrap());
    // Ingress sends through the proxy; the worker receives from moto directly.
    let stall = Arc::new(AtomicBool::new(false));
    let port: u16 = moto.endpoint().rsplit(':').next().unwrap().parse().unwrap();
    let proxied = lanes_core::adapters::AwsSettings {
        endpoint: Some(format!("http://127.0.0.1:{}", proxy(port, stall.clone()).await)),
        ..moto.aws_settings()
    };
    let sender: Arc<dyn QueueSend> =
        Arc::new(SqsQueue::sender(aws_sdk_sqs::Client::new(&sdk_config(&proxied).await), &url));
    let conn = connect(&redis.settings(false)).await.unwrap();
    let cache = Arc::new(RedisCache::new(conn.clone(), "lanes:"));
    let clock: SharedClock = Arc::new(SystemClock);
    let app = router(Ingress {
        objects: None,
        events: None,
        store: Arc::new(store.clone()),
        cache: cache.clone(),
        admission: Arc::new(PutThenSend::new(
            Arc::new(store.clone()),
            [sender.clone(), sender.clone(), sender.clone()],
        )),
        queues: [sender.clone(), sender.clone(), sender],
        metrics: Metrics::new(),
        clock: clock.clone(),
        config,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let worker = Worker {
        objects: None,
        events: None,
        store: Arc::new(store.clone()),
        lock: Arc::new(RedisLock::new(conn, "lanes:")),
        cache: cache.clone(),
        llm: Arc::new(OfflineProvider::new(|_| Duration::ZERO)),
        metrics: Metrics::new(),
        clock,
        config: WorkerConfig { quota: config.quota, ..WorkerConfig::default() },
        batching: Default::default(),
    };
    Rig { url: format!("http://{addr}"), store, worker, queue, cache, stall, _moto: moto, _redis: redis }
}

const BODY: &str =
    r#"{"project_id":"p1","kind":"explain","prompt":"what does main do?","target_files":["src/main.rs"]}"#;

async fn post(url: &str) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/tasks"))
        .header("content-type", "application/json")
        .body(BODY)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(serde_json::Value::Null))
}

async fn get(url: &str, id: &str) -> (u16, serde_json::Value) {
    let r = reqwest::get(format!("{url}/v1/tasks/{id}")).await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(serde_json::Value::Null))
}

/// Runs every message the worker finds until none is left.
async fn drain(r: &Rig) {
    let queue: Arc<dyn QueueConsume> = r.queue.clone();
    for m in lanes_tests::receive_n(&*r.queue, 1).await {
        assert_eq!(r.worker.process(queue.clone(), m).await, Outcome::Acked);
    }
}

#[tokio::test]
async fn a_duplicate_answered_while_sqs_stalls_and_fails_gets_its_task_run() {
    let r = rig(IngressConfig::default()).await;
    let id = TaskRequest::from_json(BODY.as_bytes()).unwrap().task_id(None);
    r.stall.store(true, Ordering::SeqCst);
    let first = tokio::spawn({
        let url = r.url.clone();
        async move { post(&url).await.0 }
    });
    // The first send is stalling: the record is there, the duplicate is answered with it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while r.store.get(&id, now_ms()).await.unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "the first POST wrote no record");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, dup) = post(&r.url).await;
    assert_eq!((status, dup["task_id"].as_str()), (202, Some(id.as_str())), "{dup}");
    assert_eq!(first.await.unwrap(), 503, "the first POST's send failed after the SDK's retries");
    let left = r.store.get(&id, now_ms()).await.unwrap().unwrap();
    assert_eq!((left.status, left.enqueued_at_ms), (TaskStatus::Pending, UNSENT), "kept, marked unsent");
    r.stall.store(false, Ordering::SeqCst);
    // The duplicate's client polls: never 404, and its read sends the message.
    let (status, view) = get(&r.url, &id).await;
    assert_eq!((status, view["status"].as_str()), (202, Some("PENDING")), "{view}");
    drain(&r).await;
    let (status, view) = get(&r.url, &id).await;
    assert_eq!((status, view["status"].as_str()), (200, Some("COMPLETED")), "{view}");
}

#[tokio::test]
async fn a_retry_of_an_accepted_task_gets_its_task_over_the_daily_budget() {
    let limits = lanes_core::domain::quota::Limits { daily_tokens: Some(50), ..Default::default() };
    let quota = lanes_core::config::QuotaConfig { project: limits, ..Default::default() };
    let r = rig(IngressConfig { quota, ..IngressConfig::default() }).await;
    let (status, first) = post(&r.url).await;
    assert_eq!(status, 202, "{first}");
    let id = first["task_id"].as_str().unwrap().to_owned();
    // The accepted task holds its estimate (prompt plus the lane's completion cap, far above 50
    // tokens) while it waits: the day is spent.
    let (status, again) = post(&r.url).await;
    assert_eq!((status, again["task_id"].as_str()), (202, Some(id.as_str())), "{again}");
    drain(&r).await;
    // Completed, and its cache entry gone (expired, or a Redis failover): the store answers.
    r.cache
        .set(&lanes_core::tasks::cache::cache_key(&id.parse().unwrap()), "", Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, done) = post(&r.url).await;
    assert_eq!((status, done["status"].as_str()), (200, Some("COMPLETED")), "{done}");
    // Its hold went back when it ended, and the day counts what it used; another task of the
    // project spends what is left (refused when nothing is).
    let scopes = lanes_core::quota::scopes(None, "p1");
    let rest = lanes_core::domain::quota::Cost { tokens: 50, usd_micros: 0 };
    let _ = lanes_core::quota::hold(&*r.cache, &quota, &scopes, rest, "another", now_ms()).await.unwrap();
    let other = BODY.replace("main", "lib");
    let r2 = reqwest::Client::new()
        .post(format!("{}/v1/tasks", r.url))
        .header("content-type", "application/json")
        .body(other)
        .send()
        .await
        .unwrap();
    assert_eq!(r2.status().as_u16(), 429, "a new task of the project is refused");
}
