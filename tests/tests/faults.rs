//! Fault tests of the task flow on its production adapters (moto for SQS and DynamoDB, a real
//! redis-server): a worker killed mid-task (and late in its answer, continued from its saved text), an LLM slower than the queue's visibility, Redis lost and
//! back, a poison message in a batch, and SQS unreachable at ingress (the record kept, unsent).

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use aws_lambda_events::event::sqs::SqsMessage;
use lanes_core::adapters::dynamodb::DynamoStore;
use lanes_core::adapters::sdk_config;
use lanes_core::adapters::sqs::{SqsQueue, create_queue_with_dlq};
use lanes_core::clock::SystemClock;
use lanes_core::config::{IngressConfig, WorkerConfig};
use lanes_core::domain::{TaskMessage, TaskRecord, TaskRequest, TaskStatus};
use lanes_core::embedded::{MemoryCache, MemoryLock};
use lanes_core::lambda::handle_batch;
use lanes_core::llm::OfflineProvider;
use lanes_core::metrics::Metrics;
use lanes_core::ports::DEAD_LETTER_REASON;
use lanes_core::ports::{PutThenSend, QueueConsume, QueueSend, TaskStore};
use lanes_core::tasks::ingress::{Ingress, router};
use lanes_core::tasks::worker::Worker;
use lanes_tests::{Backend, DevServer, MotoServer, Stack, now_ms, submit, wait_status};
use reqwest::StatusCode;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test]
async fn worker_killed_mid_task_comes_back_within_the_lease_and_completes_once() {
    // Lease 2 s; the queue's own visibility is 900 s, so only the lease can bring the message back.
    let flags = ["--synthesis-latency-ms", "3000", "--lease-ttl-ms", "2000"];
    let mut stack = Stack::start(Backend::Aws, &flags).await;
    let id = submit(&stack.server.url, "refactor", "split main").await;
    wait_status(&stack.server.url, &id, "PROCESSING", Duration::from_secs(10)).await;
    stack.server.kill9();
    let killed_at = now_ms();
    let peer = stack.start_peer(&flags).await;
    wait_status(&peer.url, &id, "COMPLETED", Duration::from_secs(20)).await;
    let rec = stack.dynamo().await.get(&id.parse().unwrap(), now_ms()).await.unwrap().unwrap();
    let reclaimed_after = rec.started_at_ms.unwrap() - killed_at;
    // Lease TTL, plus SQS's one-second granularity and the poll interval.
    assert!(reclaimed_after <= 3_500, "visible again {reclaimed_after} ms after the kill");
    // Two claims (the fence), no failed provider attempt: a crash is not the provider's failure.
    assert_eq!((rec.status, rec.fence, rec.attempts), (TaskStatus::Completed, 2, 0));
    assert!(rec.result.is_some());
    assert_eq!(peer.metric("lanes_stale_writes_rejected_total{lane=\"synthesis\"}").await, 0.0);
    assert_eq!(peer.metric("lanes_llm_requests_total{lane=\"synthesis\",status=\"ok\"}").await, 1.0);
}

/// A worker killed two thirds of the way through a synthesis answer, its text saved every 200 ms in
/// DynamoDB (moto): the peer that takes the task over continues the saved text rather than paying
/// for it again, and the answer is the model's whole one.
#[tokio::test]
async fn a_worker_killed_late_is_continued_from_its_saved_text_by_its_peer() {
    let flags = ["--synthesis-latency-ms", "3000", "--lease-ttl-ms", "2000", "--checkpoint-ms", "200"];
    let mut stack = Stack::start(Backend::Aws, &flags).await;
    let id = submit(&stack.server.url, "refactor", "split main late").await;
    wait_status(&stack.server.url, &id, "PROCESSING", Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    stack.server.kill9();
    let task_id = id.parse().unwrap();
    let saved = stack.dynamo().await.get(&task_id, now_ms()).await.unwrap().unwrap();
    let partial = saved.partial.clone().expect("the run saved its text before the kill");
    assert_eq!((partial.run, saved.fence), (1, 1), "saved under the killed run's fence");
    let peer = stack.start_peer(&flags).await;
    wait_status(&peer.url, &id, "COMPLETED", Duration::from_secs(20)).await;
    let rec = stack.dynamo().await.get(&task_id, now_ms()).await.unwrap().unwrap();
    let result = rec.result.clone().unwrap();
    let whole = OfflineProvider::new(|_| Duration::ZERO);
    let whole = lanes_core::ports::LlmClient::complete(
        &whole,
        &lanes_core::ports::LlmRequest::for_task(&rec.request, 16_384),
    )
    .await
    .unwrap();
    assert_eq!(result.text, whole.text, "the saved text and the rest, nothing lost or doubled");
    assert!(result.text.starts_with(partial.text.trim_end()));
    assert!(result.tokens_saved > 0 && result.tokens.completion < whole.usage.completion, "{result:?}");
    assert_eq!(rec.partial, None, "the final write removed the saved text");
    let saved_metric = "lanes_llm_tokens_total{lane=\"synthesis\",type=\"saved\"}";
    assert_eq!(peer.metric(saved_metric).await, result.tokens_saved as f64);
}

#[tokio::test]
async fn llm_slower_than_the_queue_visibility_is_held_by_heartbeats_with_one_call() {
    // Queue visibility 2 s, lease 1 s renewed every 333 ms, LLM 5 s, two worker processes.
    let flags = ["--synthesis-latency-ms", "5000", "--lease-ttl-ms", "1000", "--queue-visibility-secs", "2"];
    let stack = Stack::start(Backend::Aws, &flags).await;
    let peer = stack.start_peer(&flags).await;
    let id = submit(&stack.server.url, "agent", "do the thing").await;
    wait_status(&stack.server.url, &id, "COMPLETED", Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let calls = |s: &DevServer| {
        let s = s.url.clone();
        async move {
            let text = reqwest::get(format!("{s}/metrics")).await.unwrap().text().await.unwrap();
            text.lines()
                .filter(|l| l.starts_with("lanes_llm_requests_total{lane=\"synthesis\""))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        }
    };
    assert_eq!(calls(&stack.server).await + calls(&peer).await, 1.0, "exactly one LLM call");
    let renewals = stack.server.metric("lanes_lease_renewals_total{lane=\"synthesis\"}").await
        + peer.metric("lanes_lease_renewals_total{lane=\"synthesis\"}").await;
    assert!(renewals >= 10.0, "heartbeats held the lease ({renewals} renewals)");
    let rec = stack.dynamo().await.get(&id.parse().unwrap(), now_ms()).await.unwrap().unwrap();
    assert_eq!((rec.fence, rec.attempts), (1, 0));
}

#[tokio::test]
async fn redis_lost_and_back_every_task_completes_with_one_write() {
    let flags = ["--interactive-latency-ms", "150", "--capacity", "4"];
    let mut stack = Stack::start(Backend::Aws, &flags).await;
    let mut ids = Vec::new();
    for i in 0..12 {
        ids.push(submit(&stack.server.url, "explain", &format!("before {i}")).await);
    }
    stack.redis.as_mut().unwrap().stop();
    // Ingress and workers keep going on DynamoDB, SQS and the fence.
    for i in 0..12 {
        ids.push(submit(&stack.server.url, "explain", &format!("during {i}")).await);
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    stack.redis.as_mut().unwrap().restart();
    for i in 0..6 {
        ids.push(submit(&stack.server.url, "explain", &format!("after {i}")).await);
    }
    for id in &ids {
        wait_status(&stack.server.url, id, "COMPLETED", Duration::from_secs(60)).await;
    }
    assert!(
        stack.server.metric("lanes_degraded_operations_total{component=\"lock\"}").await > 0.0,
        "the outage was felt"
    );
    let store = stack.dynamo().await;
    for id in &ids {
        let rec = store.get(&id.parse().unwrap(), now_ms()).await.unwrap().unwrap();
        assert_eq!(rec.status, TaskStatus::Completed);
        assert!(rec.finished_at_ms.is_some());
    }
    // Every completion that lost its fence was rejected, never written twice.
    let ok = stack.server.metric("lanes_llm_requests_total{lane=\"interactive\",status=\"ok\"}").await;
    let stale = stack.server.metric("lanes_stale_writes_rejected_total{lane=\"interactive\"}").await;
    assert_eq!(ok - stale, ids.len() as f64, "one accepted write per task");
    // Recovered without a restart: the cache answers again.
    let again = submit(&stack.server.url, "explain", "before 0").await;
    assert_eq!(again, ids[0]);
}

/// The deployed configuration (cluster mode) with the cluster down when `lanes dev` starts: it
/// starts, tasks complete degraded, and once the cluster is up its cache answers, with no restart.
#[tokio::test]
async fn cluster_redis_down_at_start_up_runs_degraded_and_is_used_once_up() {
    let port = lanes_tests::free_port();
    let env = vec![
        ("REDIS_URL".to_owned(), format!("redis://127.0.0.1:{port}")),
        ("LANES_REDIS_CLUSTER".to_owned(), "true".to_owned()),
    ];
    let stack = Stack::start_with_env(Backend::Aws, &[], env).await;
    let url = &stack.server.url;
    let first = submit(url, "explain", "while down").await;
    wait_status(url, &first, "COMPLETED", Duration::from_secs(30)).await;
    assert!(stack.server.metric("lanes_degraded_operations_total{component=\"lock\"}").await > 0.0);

    let _cluster = lanes_tests::RedisServer::start_cluster_on(port);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    // Each new task's completion fills the cache once Redis is reachable; its duplicate is then
    // answered from the cache.
    loop {
        n += 1;
        let id = submit(url, "explain", &format!("after {n}")).await;
        wait_status(url, &id, "COMPLETED", Duration::from_secs(30)).await;
        assert_eq!(submit(url, "explain", &format!("after {n}")).await, id);
        if stack.server.metric("lanes_duplicates_total{stage=\"cache\"}").await > 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the cache was never used after the cluster came up");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn an_undecodable_message_goes_to_the_dlq_and_the_rest_of_the_batch_succeeds() {
    let moto = MotoServer::start();
    let config = sdk_config(&moto.aws_settings()).await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let dynamo = aws_sdk_dynamodb::Client::new(&config);
    let url = create_queue_with_dlq(&sqs, "interactive", Duration::from_secs(900), 3).await.unwrap();
    DynamoStore::create_table(&dynamo, "lanes-tasks").await.unwrap();
    let store = DynamoStore::new(dynamo, "lanes-tasks");
    let queue = SqsQueue::connect(sqs.clone(), &url).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..3 {
        let req = TaskRequest::from_value(
            json!({"project_id":"p","kind":"explain","prompt":format!("q{i}"),"target_files":[]}),
        )
        .unwrap();
        let rec = TaskRecord::pending(req.task_id(None), req, now_ms(), 3600);
        store.put_pending(&rec, now_ms()).await.unwrap();
        let msg = TaskMessage { task_id: rec.task_id.clone(), lane: rec.lane, kind: rec.request.kind };
        queue.send(&serde_json::to_string(&msg).unwrap(), Default::default()).await.unwrap();
        ids.push(rec.task_id);
    }
    queue.send("{\"task_id\": 42", Default::default()).await.unwrap();
    let received = lanes_tests::receive_n(&queue, 4).await;
    let clock: lanes_core::clock::SharedClock = Arc::new(SystemClock);
    let worker = Worker {
        objects: None,
        events: None,
        store: Arc::new(store.clone()),
        lock: Arc::new(MemoryLock::new(clock.clone())),
        cache: Arc::new(MemoryCache::new(clock.clone())),
        llm: Arc::new(OfflineProvider::new(|_| Duration::ZERO)),
        metrics: Metrics::new(),
        clock,
        config: WorkerConfig::default(),
        batching: Default::default(),
    };
    let records: Vec<SqsMessage> = received.iter().map(lanes_tests::sqs_record).collect();
    let consume: Arc<dyn QueueConsume> = Arc::new(queue.clone());
    let response = handle_batch(
        &worker,
        &consume,
        lanes_core::domain::Lane::Interactive,
        &records,
        Duration::from_secs(20),
        4,
    )
    .await;
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    for id in &ids {
        assert_eq!(store.get(id, now_ms()).await.unwrap().unwrap().status, TaskStatus::Completed);
    }
    let dead = queue.dead_letter_queue().unwrap().receive(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body, "{\"task_id\": 42");
    assert!(dead[0].attributes[DEAD_LETTER_REASON].starts_with("undecodable message"));
    // The three completed deliveries are left for the event source mapping to delete, and hidden
    // until it does; the undecodable one is gone already.
    let depth = queue.depth().await.unwrap();
    assert_eq!((depth.visible, depth.in_flight), (0, 3));
    lanes_tests::mapping_deletes(&queue, &records, &response).await.unwrap();
    assert_eq!(queue.depth().await.unwrap().visible + queue.depth().await.unwrap().in_flight, 0);
}

#[tokio::test]
async fn sqs_unreachable_at_ingress_is_503_and_leaves_the_record_marked_unsent() {
    let dynamo_server = MotoServer::start();
    let sqs_server = MotoServer::start();
    let dconf = sdk_config(&dynamo_server.aws_settings()).await;
    let sconf = sdk_config(&sqs_server.aws_settings()).await;
    let dynamo = aws_sdk_dynamodb::Client::new(&dconf);
    DynamoStore::create_table(&dynamo, "lanes-tasks").await.unwrap();
    let store = DynamoStore::new(dynamo, "lanes-tasks");
    let sqs = aws_sdk_sqs::Client::new(&sconf);
    let url = create_queue_with_dlq(&sqs, "interactive", Duration::from_secs(900), 3).await.unwrap();
    let sender: Arc<dyn QueueSend> = Arc::new(SqsQueue::sender(sqs, &url));
    let clock: lanes_core::clock::SharedClock = Arc::new(SystemClock);
    let app = router(Ingress {
        objects: None,
        events: None,
        store: Arc::new(store.clone()),
        cache: Arc::new(MemoryCache::new(clock.clone())),
        admission: Arc::new(PutThenSend::new(
            Arc::new(store.clone()),
            [sender.clone(), sender.clone(), sender.clone()],
        )),
        queues: [sender.clone(), sender.clone(), sender],
        metrics: Metrics::new(),
        clock,
        config: IngressConfig::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    drop(sqs_server); // SQS goes away

    let body = json!({"project_id":"p1","kind":"explain","prompt":"what does main do?","target_files":["src/main.rs"]});
    let r = reqwest::Client::new().post(format!("http://{addr}/v1/tasks")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let id = TaskRequest::from_value(body).unwrap().task_id(None);
    // Not deleted (a duplicate may have been answered 202 for it): marked unsent, for the retry or
    // the next read to send at once.
    let left = store.get(&id, now_ms()).await.unwrap().unwrap();
    assert_eq!((left.status, left.enqueued_at_ms), (TaskStatus::Pending, lanes_core::ports::UNSENT));
}

/// Reads `lanes_aws_requests_total` as `service operation -> count`.
async fn aws_requests(server: &DevServer) -> std::collections::BTreeMap<String, f64> {
    let text = reqwest::get(format!("{}/metrics", server.url)).await.unwrap().text().await.unwrap();
    lanes_tests::aws_requests_in(&text)
}

/// Counts the requests one task costs on the AWS backend and prints them (quoted in the closing note).
/// The local runner's polling (ReceiveMessage, GetQueueAttributes) is left out: in Lambda the event
/// source mapping polls. So is the provider batches' collector, whose reads of the open batches
/// come on a timer whatever the tasks do (on AWS the controller's schedule runs it): its interval
/// is set past the test's length. Completion is watched through DynamoDB directly so the test's own
/// reads do not count.
#[tokio::test]
async fn aws_requests_per_task_are_counted() {
    let flags =
        ["--interactive-latency-ms", "100", "--synthesis-latency-ms", "2000", "--batch-collect-secs", "3600"];
    let stack = Stack::start(Backend::Aws, &flags).await;
    let (s, store) = (&stack.server, stack.dynamo().await);
    let wait_done = |id: String| {
        let store = store.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let rec = store.get(&id.parse().unwrap(), now_ms()).await.unwrap();
                if rec.is_some_and(|r| r.status == TaskStatus::Completed) {
                    return;
                }
                assert!(Instant::now() < deadline, "{id} not completed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    // Ingress for a new task, measured alone (nothing else is running yet).
    let t0 = aws_requests(s).await;
    let first = submit(&s.url, "agent", "long one").await;
    let t1 = aws_requests(s).await;
    // A duplicate while it runs (its worker is past its start-up requests and before any renewal).
    tokio::time::sleep(Duration::from_millis(600)).await;
    let t2 = aws_requests(s).await;
    submit(&s.url, "agent", "long one").await;
    let t3 = aws_requests(s).await;
    wait_done(first).await;
    // The whole life of ten new tasks, divided by ten.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t4 = aws_requests(s).await;
    let ten_began = Instant::now();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(submit(&s.url, "explain", &format!("count {i}")).await);
    }
    for id in &ids {
        wait_done(id.clone()).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t5 = aws_requests(s).await;
    let ten_took = ten_began.elapsed();
    // A duplicate of a completed task.
    submit(&s.url, "explain", "count 0").await;
    let t6 = aws_requests(s).await;

    let new = lanes_tests::requests_between(&t0, &t1);
    let inflight = lanes_tests::requests_between(&t2, &t3);
    let per_task: std::collections::BTreeMap<String, f64> =
        lanes_tests::requests_between(&t4, &t5).into_iter().map(|(k, v)| (k, v / 10.0)).collect();
    let done = lanes_tests::requests_between(&t5, &t6);
    eprintln!("AWS requests (SQS, DynamoDB, ElastiCache Redis), local poller excluded:");
    eprintln!("  ingress, new task:            {new:?}");
    eprintln!("  ingress, duplicate in flight: {inflight:?}");
    eprintln!("  ingress, duplicate completed: {done:?}");
    eprintln!("  whole task (ingress + worker), mean of 10: {per_task:?}");
    // The pool may already have picked the task up (its lease start shows here): check ingress's own.
    assert_eq!((new.get("sqs SendMessage"), new.get("redis GET")), (Some(&1.0), Some(&1.0)));
    assert_eq!(
        inflight,
        [("dynamodb PutItem", 1.0), ("redis GET", 1.0)].map(|(k, v)| (k.to_owned(), v)).into()
    );
    assert_eq!(done, [("redis GET".to_owned(), 1.0)].into(), "a completed duplicate is one cache read");
    let want = [
        ("dynamodb PutItem", 1.0),      // conditional put of PENDING
        ("dynamodb UpdateItem", 2.0),   // claim (fence + 1), fenced finish
        ("redis EVALSHA acquire", 1.0), // the lock; a completed task's is left to expire
        // Token shares: counted waiting at ingress, the start decision, the usage correction.
        ("redis EVALSHA share", 3.0),
        ("redis GET", 1.0), // ingress's hot-cache check
        ("redis SET", 1.0), // the finished record: cached, and wakes long-polls
        ("sqs DeleteMessage", 1.0),
        ("sqs SendMessage", 1.0),
        // No ChangeMessageVisibility: the local runner receives straight into the lease. A Lambda
        // batch adds one ChangeMessageVisibilityBatch per ten deliveries (they come with the
        // queue's long visibility) and leaves the DeleteMessage to the mapping (`lambda_requests`).
    ];
    // The run's event stream: one XADD pipeline per append, `running` and then the offline model's
    // pieces (eight, 25 ms apart here), merged when they come faster than an append: at most nine.
    let mut per_task = per_task;
    let appends = per_task.remove("redis XADD").unwrap_or_default();
    assert!((1.0..=9.0).contains(&appends), "{appends} appends a task");
    // The lane's standings (the tenants' shares, for the metrics): one read of its token-share
    // state after a decision, at most every five seconds, however many tasks start meanwhile.
    let reads = 10.0 * per_task.remove("redis HGETALL share").unwrap_or_default();
    let most = (ten_took.as_secs_f64() / 5.0).floor() + 1.0;
    assert!(reads <= most, "{reads} reads of the lane's shares in {ten_took:?}: at most {most}");
    assert_eq!(per_task, want.map(|(k, v)| (k.to_owned(), v)).into());
    // The exact counts above: 5 SQS/DynamoDB requests and 6 Redis commands per task locally, and
    // the event stream's appends (a Lambda batch, which keeps no events: `lambda_requests`).
}

/// Heartbeat cost: each renewal is one ChangeMessageVisibility and one Redis renew script, every
/// `renew_interval` (a third of the lease TTL) for as long as the task runs.
#[tokio::test]
async fn heartbeat_requests_per_minute_are_counted() {
    let stack =
        Stack::start(Backend::Aws, &["--synthesis-latency-ms", "3000", "--lease-ttl-ms", "1500"]).await;
    let (s, store) = (&stack.server, stack.dynamo().await);
    let t0 = aws_requests(s).await;
    let id = submit(&s.url, "refactor", "heartbeat me").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let rec = loop {
        let rec = store.get(&id.parse().unwrap(), now_ms()).await.unwrap().unwrap();
        if rec.status == TaskStatus::Completed {
            break rec;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let d = lanes_tests::requests_between(&t0, &aws_requests(s).await);
    let renewals = d.get("redis EVALSHA renew").copied().unwrap_or(0.0);
    let run_secs = (rec.finished_at_ms.unwrap() - rec.started_at_ms.unwrap()) as f64 / 1000.0;
    let per_minute = renewals / run_secs * 60.0;
    eprintln!(
        "heartbeat: {renewals} renewals in {run_secs:.1} s at a 0.5 s interval = {per_minute:.0}/min, each one SQS ChangeMessageVisibility + one Redis renew: {d:?}"
    );
    // One renewal per 0.5 s of run time (the first after 0.5 s), whatever the machine's speed.
    let expected = (run_secs / 0.5).floor();
    assert!(renewals >= 4.0 && (renewals - expected).abs() <= 2.0, "{renewals} renewals in {run_secs} s");
    // One per renewal (the local runner receives straight into the lease, so there is no lease
    // start); the counter sees every attempt, so an SDK retry on a loaded machine adds one.
    let cmv = d.get("sqs ChangeMessageVisibility").copied().unwrap_or(0.0);
    assert!(
        (renewals..=renewals + 2.0).contains(&cmv),
        "{cmv} ChangeMessageVisibility for {renewals} renewals"
    );
}

/// An idle local runner waits on SQS long polls, not on a loop of queue-depth reads: over three idle
/// seconds it asks for no depth and receives at most once per lane (each receive waits up to 20 s).
/// A task sent meanwhile is taken by the waiting receive as it arrives, not after the wait ends.
#[tokio::test]
async fn an_idle_runner_long_polls_instead_of_reading_queue_depths() {
    let stack = Stack::start(Backend::Aws, &["--interactive-latency-ms", "0"]).await;
    let s = &stack.server;
    let count = |m: &std::collections::BTreeMap<String, f64>, op: &str| m.get(op).copied().unwrap_or(0.0);
    // Past start-up: once every lane's long poll is out (one ReceiveMessage each), however slow the
    // machine, the pool is idle.
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&aws_requests(s).await, "sqs ReceiveMessage") < 3.0 {
        assert!(Instant::now() < deadline, "the idle pool never long-polled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t0 = aws_requests(s).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t1 = aws_requests(s).await;
    let (depths, receives) = (
        count(&t1, "sqs GetQueueAttributes") - count(&t0, "sqs GetQueueAttributes"),
        count(&t1, "sqs ReceiveMessage") - count(&t0, "sqs ReceiveMessage"),
    );
    eprintln!("idle for 3 s: {depths} GetQueueAttributes, {receives} ReceiveMessage");
    // Polling the depth of three lanes every 50 ms would be 180 of them.
    assert!(depths == 0.0 && receives <= 3.0, "{depths} depth reads, {receives} receives");
    let sent = Instant::now();
    let id = submit(&s.url, "explain", "wake the idle pool").await;
    wait_status(&s.url, &id, "COMPLETED", Duration::from_secs(10)).await;
    eprintln!("taken and completed {} ms after submission", sent.elapsed().as_millis());
}
