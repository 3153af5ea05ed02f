//! Integration tests of every adapter method against real servers: `moto_server` for SQS and
//! DynamoDB, `redis-server` for the lock and the cache. No mocks.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::adapters::dynamodb::DynamoStore;
use lanes_core::adapters::redis::{RedisCache, RedisLock, RedisSettings, connect};
use lanes_core::adapters::sdk_config;
use lanes_core::adapters::sqs::{SqsQueue, create_queue_with_dlq};
use lanes_core::domain::TokenUsage;
use lanes_core::domain::{TaskRecord, TaskRequest, TaskResult, TaskStatus};
use lanes_core::ports::DEAD_LETTER_REASON;
use lanes_core::ports::*;
use lanes_tests::{MotoServer, RedisServer, now_ms};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

async fn redis_conn(redis: &RedisServer, cluster: bool) -> lanes_core::adapters::redis::RedisConn {
    connect(&redis.settings(cluster)).await.unwrap()
}

fn record(prompt: &str) -> TaskRecord {
    let req = TaskRequest::from_value(
        json!({"project_id":"p","kind":"explain","prompt":prompt,"target_files":["a.rs"]}),
    )
    .unwrap();
    TaskRecord::pending(req.task_id(None), req, now_ms(), 3600)
}

fn result(text: String) -> TaskResult {
    TaskResult {
        text_ref: None,
        text,
        model: "m".into(),
        tokens: TokenUsage { prompt: 1, completion: 2 },
        truncated: false,
        cost_usd: None,
        tier: Default::default(),
        tokens_saved: 0,
    }
}

#[tokio::test]
async fn sqs_adapter_against_moto() {
    let moto = MotoServer::start();
    let config = sdk_config(&moto.aws_settings()).await;
    let client = aws_sdk_sqs::Client::new(&config);
    let url = create_queue_with_dlq(&client, "interactive", Duration::from_secs(900), 2).await.unwrap();
    let q = SqsQueue::connect(client.clone(), &url).await.unwrap();
    assert_eq!(q.max_receive_count(), 2, "read from the redrive policy");

    let attrs = BTreeMap::from([
        ("lane".to_owned(), "interactive".to_owned()),
        ("kind".to_owned(), "explain".to_owned()),
    ]);
    q.send("m1", attrs.clone()).await.unwrap();
    let got = q.receive(10).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].body.as_str(), got[0].receive_count), ("m1", 1));
    assert_eq!(got[0].attributes["lane"], "interactive");
    assert!(got[0].sent_at_ms > 0);
    assert_eq!(q.depth().await.unwrap().in_flight, 1);

    // The short lease: hidden for 1 s, then back with a higher receive count.
    q.change_visibility(&got[0].receipt, Duration::from_secs(1)).await.unwrap();
    assert!(q.receive(10).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let again = q.receive(10).await.unwrap();
    assert_eq!(again[0].receive_count, 2);

    // Many leases at once (ChangeMessageVisibilityBatch), as moto answers it: all renewed.
    q.send("m2", attrs.clone()).await.unwrap();
    let second = q.receive(10).await.unwrap();
    let receipts = vec![again[0].receipt.clone(), second[0].receipt.clone()];
    let renewed = q.change_visibility_many(&receipts, Duration::from_secs(30)).await;
    assert!(renewed.iter().all(Result::is_ok), "{renewed:?}");
    assert_eq!(q.depth().await.unwrap().in_flight, 2);
    q.delete(&second[0].receipt).await.unwrap();

    // Dead-lettering with a reason moves it to the DLQ and removes it here.
    q.dead_letter(&again[0], "undecodable message: expected value").await.unwrap();
    let dead = q.dead_letter_queue().unwrap().receive(10).await.unwrap();
    assert_eq!(dead[0].body, "m1");
    assert_eq!(dead[0].attributes[DEAD_LETTER_REASON], "undecodable message: expected value");
    assert_eq!(q.depth().await.unwrap(), QueueDepth::default());

    // Batched sends: 25 messages in three requests, all delivered.
    let batch: Vec<(String, BTreeMap<String, String>)> =
        (0..25).map(|i| (format!("b{i}"), attrs.clone())).collect();
    assert!(q.send_batch(&batch).await.unwrap().is_empty());
    let mut seen = 0;
    while seen < 25 {
        let got = q.receive(10).await.unwrap();
        assert!(!got.is_empty(), "only {seen} of 25 arrived");
        for m in got {
            q.delete(&m.receipt).await.unwrap();
            seen += 1;
        }
    }
    assert_eq!(q.depth().await.unwrap().visible, 0);
}

#[tokio::test]
async fn dynamodb_adapter_against_moto() {
    let moto = MotoServer::start();
    let config = sdk_config(&moto.aws_settings()).await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    DynamoStore::create_table(&client, "lanes").await.unwrap();
    DynamoStore::create_table(&client, "lanes").await.unwrap(); // idempotent
    let store = DynamoStore::new(client, "lanes");
    let now = now_ms();

    let r = record("why");
    let id = r.task_id.clone();
    assert_eq!(store.put_pending(&r, now).await.unwrap(), PutOutcome::Created);
    let PutOutcome::Exists(old) = store.put_pending(&record("why"), now).await.unwrap() else {
        panic!("duplicate")
    };
    assert_eq!((old.nonce.as_str(), old.status), (r.nonce.as_str(), TaskStatus::Pending));
    assert_eq!(store.get(&id, now).await.unwrap().unwrap().request, r.request);

    let resend = lanes_core::ports::EnqueueMark { fence: 0, from_ms: r.enqueued_at_ms, to_ms: now + 61_000 };
    assert!(store.mark_enqueued(&id, resend, now + 61_000, 3600).await.unwrap());
    assert!(!store.mark_enqueued(&id, resend, now + 61_000, 3600).await.unwrap(), "a compare-and-set");
    assert_eq!(store.get(&id, now).await.unwrap().unwrap().enqueued_at_ms, now + 61_000);

    let ClaimOutcome::Claimed(c1) = store.claim(&id, now, 86_400).await.unwrap() else { panic!("claim") };
    let ClaimOutcome::Claimed(c2) = store.claim(&id, now, 86_400).await.unwrap() else { panic!("claim") };
    assert_eq!((c1.fence, c2.fence, c2.attempts, c2.status), (1, 2, 0, TaskStatus::Processing));
    let late = lanes_core::ports::EnqueueMark { fence: 2, from_ms: now + 61_000, to_ms: now };
    assert!(!store.mark_enqueued(&id, late, now, 3600).await.unwrap(), "only PENDING is re-sent");
    let stale =
        store.finish(&id, 1, Completion::Completed(result("late".into())), now, 86_400).await.unwrap();
    assert_eq!(stale, FinishOutcome::StaleFence);
    let ok = store.finish(&id, 2, Completion::Completed(result("done".into())), now, 86_400).await.unwrap();
    assert!(matches!(ok, FinishOutcome::Written(r) if r.status == TaskStatus::Completed));
    let done = store.get(&id, now).await.unwrap().unwrap();
    assert_eq!((done.status, done.result.unwrap().text.as_str()), (TaskStatus::Completed, "done"));
    assert!(matches!(store.claim(&id, now, 86_400).await.unwrap(), ClaimOutcome::Terminal(_)));
    assert_eq!(
        store.claim(&"0".repeat(64).parse().unwrap(), now, 86_400).await.unwrap(),
        ClaimOutcome::Missing
    );

    // A FAILED record may be submitted again; its fence carries over.
    let f = record("fails");
    store.put_pending(&f, now).await.unwrap();
    let ClaimOutcome::Claimed(fc) = store.claim(&f.task_id, now, 86_400).await.unwrap() else { panic!() };
    store.finish(&f.task_id, fc.fence, Completion::Failed("bad".into()), now, 86_400).await.unwrap();
    assert_eq!(store.put_pending(&record("fails"), now).await.unwrap(), PutOutcome::Created);
    let again = store.get(&f.task_id, now).await.unwrap().unwrap();
    assert_eq!((again.status, again.fence, again.error), (TaskStatus::Pending, 1, None));

    // An expired record counts as absent and may be replaced.
    let mut e = record("expired");
    e.expires_at = now / 1000 - 1;
    store.put_pending(&e, now).await.unwrap();
    assert_eq!(store.get(&e.task_id, now).await.unwrap(), None);
    assert_eq!(store.put_pending(&record("expired"), now).await.unwrap(), PutOutcome::Created);

    // A large result is compressed; one that cannot fit fails the task with the reason.
    let big = record("big");
    store.put_pending(&big, now).await.unwrap();
    let ClaimOutcome::Claimed(bc) = store.claim(&big.task_id, now, 86_400).await.unwrap() else { panic!() };
    let text = "fn main() {}\n".repeat(50_000); // 650 KB, compresses well
    store
        .finish(&big.task_id, bc.fence, Completion::Completed(result(text.clone())), now, 86_400)
        .await
        .unwrap();
    assert_eq!(store.get(&big.task_id, now).await.unwrap().unwrap().result.unwrap().text, text);
    let huge = record("huge");
    store.put_pending(&huge, now).await.unwrap();
    let ClaimOutcome::Claimed(hc) = store.claim(&huge.task_id, now, 86_400).await.unwrap() else { panic!() };
    let noise: String = (0..20_000).map(|_| uuid::Uuid::new_v4().simple().to_string()).collect(); // 640 KB of hex
    store.finish(&huge.task_id, hc.fence, Completion::Completed(result(noise)), now, 86_400).await.unwrap();
    let h = store.get(&huge.task_id, now).await.unwrap().unwrap();
    assert_eq!(h.status, TaskStatus::Failed);
    assert!(h.error.unwrap().starts_with("result_too_large: "));

    // BatchGetItem over more than one request.
    let mut ids = Vec::new();
    for i in 0..130 {
        let r = record(&format!("batch {i}"));
        store.put_pending(&r, now).await.unwrap();
        ids.push(r.task_id);
    }
    ids.push("f".repeat(64).parse().unwrap());
    let many = store.get_many(&ids, now).await.unwrap();
    assert_eq!(many.len(), 130);
}

#[tokio::test]
async fn redis_lock_and_cache_against_redis_server() {
    lock_and_cache_against(RedisServer::start()).await;
}

/// The same over TLS (`rediss://`, as ElastiCache Serverless requires), with the test CA named.
#[tokio::test]
async fn redis_lock_and_cache_against_a_tls_redis_server() {
    lock_and_cache_against(RedisServer::start_tls()).await;
}

async fn lock_and_cache_against(mut redis: RedisServer) {
    let conn = redis_conn(&redis, false).await;
    let lock = RedisLock::new(conn.clone(), "lanes:");
    let cache = RedisCache::new(conn.clone(), "lanes:");
    let ttl = Duration::from_millis(300);

    let Acquire::Acquired(token) = lock.acquire("lease:{task:1}", ttl).await.unwrap() else { panic!() };
    let Acquire::Held { remaining } = lock.acquire("lease:{task:1}", ttl).await.unwrap() else { panic!() };
    assert!(remaining <= ttl && remaining > Duration::from_millis(200), "{remaining:?}");
    assert!(lock.renew("lease:{task:1}", &token, Duration::from_secs(5)).await.unwrap());
    assert!(!lock.renew("lease:{task:1}", "other", ttl).await.unwrap());
    assert!(!lock.release("lease:{task:1}", "other").await.unwrap());

    // Scripts are flushed (failover, restart): EVALSHA's NOSCRIPT falls back to EVAL.
    let raw_client = match redis.ca_pem_if_tls() {
        Some(ca) => redis::Client::build_with_tls(
            redis.url(),
            redis::TlsCertificates { client_tls: None, root_cert: Some(ca) },
        ),
        None => redis::Client::open(redis.url()),
    };
    let mut raw = raw_client.unwrap().get_multiplexed_async_connection().await.unwrap();
    redis::cmd("SCRIPT").arg("FLUSH").query_async::<()>(&mut raw).await.unwrap();
    assert!(lock.renew("lease:{task:1}", &token, ttl).await.unwrap());
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut raw).await.unwrap();
    assert_eq!(keys, ["lanes:lease:{task:1}"], "keys are prefixed");
    assert!(lock.release("lease:{task:1}", &token).await.unwrap());
    assert!(matches!(lock.acquire("lease:{task:1}", ttl).await.unwrap(), Acquire::Acquired(_)));

    cache.set("task:x", "v", Duration::from_millis(200)).await.unwrap();
    assert_eq!(cache.get("task:x").await.unwrap().as_deref(), Some("v"));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(cache.get("task:x").await.unwrap(), None);

    // Outage: errors, not hangs; after the restart the same connection works again.
    redis.stop();
    assert!(matches!(lock.acquire("lease:{task:2}", ttl).await, Err(LockError::Unavailable(_))));
    assert!(cache.get("task:x").await.is_err());
    redis.restart();
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(Acquire::Acquired(_)) = lock.acquire("lease:{task:2}", ttl).await {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "the lock recovers without a restart of the process");
}

#[tokio::test]
async fn redis_lock_and_cache_in_cluster_mode() {
    let redis = RedisServer::start_cluster();
    let conn = redis_conn(&redis, true).await;
    let lock = RedisLock::new(conn.clone(), "lanes:");
    let cache = RedisCache::new(conn, "lanes:");
    for i in 0..20 {
        // Keys spread over slots; each script's key is under one hash tag, so scripts run in cluster mode.
        let key = format!("lease:{{task:{i}}}");
        let Acquire::Acquired(token) = lock.acquire(&key, Duration::from_secs(5)).await.unwrap() else {
            panic!()
        };
        assert!(matches!(lock.acquire(&key, Duration::from_secs(5)).await.unwrap(), Acquire::Held { .. }));
        assert!(lock.renew(&key, &token, Duration::from_secs(5)).await.unwrap());
        assert!(lock.release(&key, &token).await.unwrap());
        cache.set(&format!("task:{i}"), "v", Duration::from_secs(5)).await.unwrap();
        assert_eq!(cache.get(&format!("task:{i}")).await.unwrap().as_deref(), Some("v"));
    }
}

/// Cluster mode (what the template deploys) starts with the cluster down, runs degraded, and uses
/// the cluster once it is up, with no restart.
#[tokio::test]
async fn cluster_mode_starts_while_redis_is_down_and_connects_when_it_is_up() {
    let port = lanes_tests::free_port();
    let settings = RedisSettings {
        url: format!("redis://127.0.0.1:{port}"),
        cluster: true,
        prefix: "lanes:".into(),
        timeout: Duration::from_millis(300),
        ca_pem: None,
        auth: None,
    };
    let conn = connect(&settings).await.expect("start-up does not need Redis");
    let cache = RedisCache::new(conn.clone(), "lanes:");
    let lock = RedisLock::new(conn, "lanes:");
    assert!(cache.get("task:x").await.is_err(), "down: the cache says so, callers degrade");
    assert!(lock.acquire("lease:{task:x}", Duration::from_secs(5)).await.is_err());
    let _redis = RedisServer::start_cluster_on(port);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if cache.set("task:x", "v", Duration::from_secs(5)).await.is_ok() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the cluster was never used once up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(cache.get("task:x").await.unwrap().as_deref(), Some("v"));
    assert!(matches!(
        lock.acquire("lease:{task:x}", Duration::from_secs(5)).await.unwrap(),
        Acquire::Acquired(_)
    ));
}

#[tokio::test]
async fn redis_limiter_matches_the_in_process_one() {
    limiter_parity_on(RedisServer::start()).await;
}

/// The same over TLS.
#[tokio::test]
async fn redis_limiter_over_tls_matches_the_in_process_one() {
    limiter_parity_on(RedisServer::start_tls()).await;
}

async fn limiter_parity_on(redis: RedisServer) {
    use lanes_core::adapters::redis::limiter::RedisLimiter;
    use lanes_core::clock::ManualClock;
    use lanes_core::domain::Lane;
    use lanes_core::limiter::{Decision, LimiterConfig, MemoryLimiter, RateLimiter};
    let conn = redis_conn(&redis, false).await;
    let clock = ManualClock::new(1_000_000);
    let config = LimiterConfig::new(60.0, 6_000.0);
    let shared = RedisLimiter::new(conn, "lanes:", "openai:gpt", config, clock.clone());
    let local = MemoryLimiter::new(config, clock.clone());
    // (lane, tokens, ms to advance first, how long the caller would wait for a reservation)
    let script = [
        (Lane::Interactive, 3_000u64, 0u64, 0u64),
        (Lane::Synthesis, 1_000, 0, 0),
        (Lane::Interactive, 2_000, 0, 0),
        (Lane::Commits, 900, 500, 60_000),
        (Lane::Interactive, 1_500, 2_000, 0),
        (Lane::Interactive, 1_500, 0, 60_000),
        (Lane::Synthesis, 700, 10_000, 0),
        (Lane::Interactive, 4_000, 30_000, 0),
        // The background idle and full: its refill spills into interactive's bucket.
        (Lane::Interactive, 1_900, 0, 0),
        (Lane::Interactive, 1_900, 1_000, 0),
        (Lane::Interactive, 1_900, 2_000, 0),
        (Lane::Interactive, 1_900, 6_000, 0),
    ];
    let (mut granted, mut reserved) = (0, 0);
    for (lane, tokens, advance, reserve) in script {
        clock.advance_ms(advance);
        let reserve = Duration::from_millis(reserve);
        let a = shared.try_acquire(lane, tokens, reserve).await.unwrap();
        let b = local.try_acquire(lane, tokens, reserve).await.unwrap();
        match (a, b) {
            (Decision::Granted, Decision::Granted) => granted += 1,
            (Decision::Reserved(x), Decision::Reserved(y)) => {
                assert!(x.abs_diff(y) <= Duration::from_millis(1), "{x:?} vs {y:?}");
                reserved += 1;
            }
            (Decision::Wait(x), Decision::Wait(y)) => {
                assert!(x.abs_diff(y) <= Duration::from_millis(1), "{x:?} vs {y:?}")
            }
            other => panic!("{lane:?} {tokens}: redis and in-process disagree: {other:?}"),
        }
        if a == Decision::Granted {
            shared.reconcile(lane, tokens, tokens + 100).await.unwrap();
            local.reconcile(lane, tokens, tokens + 100).await.unwrap();
        }
    }
    assert!((2..11).contains(&granted), "the script exercises both grants and waits ({granted} granted)");
    assert!(reserved >= 1, "and reservations");
    // An unused reservation given back lands the same in both.
    shared.give_back(Lane::Interactive, 1_500).await.unwrap();
    local.give_back(Lane::Interactive, 1_500).await.unwrap();
    let reserve = Duration::from_secs(60);
    let (a, b) = (
        shared.try_acquire(Lane::Interactive, 1_500, reserve).await.unwrap(),
        local.try_acquire(Lane::Interactive, 1_500, reserve).await.unwrap(),
    );
    match (a, b) {
        (Decision::Granted, Decision::Granted) => {}
        (Decision::Reserved(x), Decision::Reserved(y)) | (Decision::Wait(x), Decision::Wait(y)) => {
            assert!(x.abs_diff(y) <= Duration::from_millis(1), "after a give-back: {x:?} vs {y:?}")
        }
        other => panic!("after a give-back, redis and in-process disagree: {other:?}"),
    }
    // Lined up with a provider's window after a background answer: the debt lands alike.
    let said = lanes_core::limiter::ProviderLimits {
        remaining: [Some(3.0), Some(2_000.0)],
        reset: [Some(Duration::from_secs(20)), Some(Duration::from_secs(20))],
        ..Default::default()
    };
    shared.align(Lane::Commits, &said).await.unwrap();
    local.align(Lane::Commits, &said).await.unwrap();
    for lane in [Lane::Commits, Lane::Interactive, Lane::Synthesis] {
        let (a, b) = (
            shared.try_acquire(lane, 300, Duration::ZERO).await.unwrap(),
            local.try_acquire(lane, 300, Duration::ZERO).await.unwrap(),
        );
        match (a, b) {
            (Decision::Granted, Decision::Granted) => {}
            (Decision::Wait(x), Decision::Wait(y)) => {
                assert!(x.abs_diff(y) <= Duration::from_millis(1), "after an alignment: {x:?} vs {y:?}")
            }
            other => panic!("after an alignment, redis and in-process disagree: {other:?}"),
        }
    }
}

/// A provider that says what is left of its window but not when it ends (LiteLLM's proxy): the
/// script and the in-process limiter both take the window as just begun, decision for decision.
#[tokio::test]
async fn an_alignment_without_a_reset_matches_the_in_process_one() {
    use lanes_core::adapters::redis::limiter::RedisLimiter;
    use lanes_core::clock::{Clock, ManualClock};
    use lanes_core::domain::Lane;
    use lanes_core::limiter::{Decision, LimiterConfig, MemoryLimiter, ProviderLimits, RateLimiter};
    let redis = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let config = LimiterConfig::new(30.0, 1e9);
    let shared =
        RedisLimiter::new(redis_conn(&redis, false).await, "lanes:", "litellm:bench", config, clock.clone());
    let local = MemoryLimiter::new(config, clock.clone());
    let said = ProviderLimits { remaining: [Some(24.0), None], ..Default::default() };
    shared.align(Lane::Interactive, &said).await.unwrap();
    local.align(Lane::Interactive, &said).await.unwrap();
    let (started, mut granted) = (clock.now_ms(), 0);
    while clock.now_ms() < started + 60_000 {
        let a = shared.try_acquire(Lane::Interactive, 1, Duration::ZERO).await.unwrap();
        let b = local.try_acquire(Lane::Interactive, 1, Duration::ZERO).await.unwrap();
        match (a, b) {
            (Decision::Granted, Decision::Granted) => granted += 1,
            (Decision::Wait(x), Decision::Wait(y)) => {
                assert!(x.abs_diff(y) <= Duration::from_millis(1), "{x:?} vs {y:?}");
                clock.advance_ms(x.as_millis().max(1) as u64);
            }
            other => panic!("redis and in-process disagree after {granted} granted: {other:?}"),
        }
    }
    assert!((22..=24).contains(&granted), "{granted} granted in the minute after 24 were said to be left");
}

#[tokio::test]
async fn a_cooldown_is_shared_by_every_limiter_on_the_same_redis() {
    use lanes_core::adapters::redis::limiter::RedisLimiter;
    use lanes_core::clock::SystemClock;
    use lanes_core::domain::Lane;
    use lanes_core::limiter::{Decision, LimiterConfig, ProviderLimits, RateLimiter};
    let redis = RedisServer::start();
    // Two workers' limiters (two processes in production: separate connections, one key).
    let (a, b) = (redis_conn(&redis, false).await, redis_conn(&redis, false).await);
    let config = LimiterConfig::unknown();
    let first = RedisLimiter::new(a, "lanes:", "openai:gpt", config, std::sync::Arc::new(SystemClock));
    let second = RedisLimiter::new(b, "lanes:", "openai:gpt", config, std::sync::Arc::new(SystemClock));
    assert_eq!(
        second.try_acquire(Lane::Synthesis, 10, Duration::ZERO).await.unwrap(),
        Decision::Granted,
        "unknown limits: no pacing"
    );
    first.cool_down(Duration::from_millis(800)).await.unwrap();
    let Decision::Wait(w) = second.try_acquire(Lane::Interactive, 10, Duration::ZERO).await.unwrap() else {
        panic!("the other worker must wait the 429 out")
    };
    assert!(w > Duration::from_millis(600) && w <= Duration::from_millis(800), "{w:?}");
    tokio::time::sleep(w).await;
    assert_eq!(second.try_acquire(Lane::Interactive, 10, Duration::ZERO).await.unwrap(), Decision::Granted);
    // Learned limits pace: a provider saying 60 requests per minute leaves a burst of ~3.
    second.learn(&ProviderLimits { rpm: Some(60.0), ..Default::default() });
    let mut granted = 0;
    for _ in 0..10 {
        if second.try_acquire(Lane::Interactive, 1, Duration::ZERO).await.unwrap() == Decision::Granted {
            granted += 1;
        }
    }
    assert!(granted <= 3, "paced by what the provider said: {granted} of 10 at once");
    // What one worker learned is stored with the buckets: a worker that has had no answer yet
    // paces by it too.
    second.align(Lane::Interactive, &ProviderLimits { rpm: Some(60.0), ..Default::default() }).await.unwrap();
    let mut granted = 0;
    for _ in 0..10 {
        if first.try_acquire(Lane::Interactive, 1, Duration::ZERO).await.unwrap() == Decision::Granted {
            granted += 1;
        }
    }
    assert!(granted <= 3, "the unknowing worker is paced by the stored limits: {granted} of 10");
}

/// Levels go through Redis as text: a full bucket whose cap is not exact in binary (64 rpm: an
/// interactive burst of 2.2399999999999998) must read back full, not as "above its cap" (emptied).
#[tokio::test]
async fn a_full_bucket_reads_back_full_from_redis() {
    use lanes_core::adapters::redis::limiter::RedisLimiter;
    use lanes_core::clock::ManualClock;
    use lanes_core::domain::Lane;
    use lanes_core::limiter::{Decision, LimiterConfig, RateLimiter};
    let redis = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let limiter = RedisLimiter::new(
        redis_conn(&redis, false).await,
        "lanes:",
        "m",
        LimiterConfig::new(64.0, 1e9),
        clock.clone(),
    );
    assert_eq!(limiter.try_acquire(Lane::Interactive, 1, Duration::ZERO).await.unwrap(), Decision::Granted);
    clock.advance_ms(60_000);
    for _ in 0..2 {
        assert_eq!(
            limiter.try_acquire(Lane::Interactive, 1, Duration::ZERO).await.unwrap(),
            Decision::Granted,
            "an idle, full bucket admits its burst"
        );
    }
}

/// What real SQS answers when a lease is lost, and moto does not: a `ChangeMessageVisibility` or
/// `DeleteMessage` on a message no longer in flight is `InvalidParameterValue` ("Message does not
/// exist or is not available for visibility timeout change"), or one of the documented lost-receipt
/// codes. Every one of them reads as a lost receipt; throttling and other refusals stay "unavailable".
#[tokio::test]
async fn every_documented_lost_receipt_answer_of_sqs_is_a_lost_lease() {
    use lanes_tests::aws_stub::{Answer, AwsStub};
    let stub = AwsStub::start().await;
    let config = sdk_config(&stub.aws_settings()).await;
    let q = SqsQueue::connect(aws_sdk_sqs::Client::new(&config), &format!("{}/123456789012/q", stub.url))
        .await
        .unwrap();
    let lost = [
        Answer::sqs_error(
            400,
            "InvalidParameterValue",
            "Value AQEB for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not available for visibility timeout change.",
        ),
        Answer::sqs_error(400, "ReceiptHandleIsInvalid", "The input receipt handle is invalid."),
        Answer::sqs_error(400, "MessageNotInflight", "The message referred to isn't in flight."),
        Answer::sqs_error(
            400,
            "InvalidParameterValue",
            "Value AQEB for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired.",
        ),
    ];
    let n = lost.len();
    stub.script("ChangeMessageVisibility", lost);
    for i in 0..n {
        let r = q.change_visibility("AQEB", Duration::from_secs(30)).await;
        assert!(matches!(r, Err(QueueError::ReceiptInvalid)), "answer {i}: {r:?}");
    }
    stub.script(
        "DeleteMessage",
        [Answer::sqs_error(400, "InvalidParameterValue", "Value AQEB for parameter ReceiptHandle is invalid. Reason: Message does not exist or is not available for visibility timeout change.")],
    );
    assert!(matches!(q.delete("AQEB").await, Err(QueueError::ReceiptInvalid)));
    // Not a lost receipt: another invalid parameter, and throttling (retried by the SDK, then
    // unavailable).
    stub.script(
        "ChangeMessageVisibility",
        [Answer::sqs_error(
            400,
            "InvalidParameterValue",
            "Value 50000 for parameter VisibilityTimeout is invalid.",
        )],
    );
    assert!(matches!(
        q.change_visibility("AQEB", Duration::from_secs(30)).await,
        Err(QueueError::Unavailable(_))
    ));
    stub.script(
        "ChangeMessageVisibility",
        (0..5).map(|_| Answer::sqs_error(400, "RequestThrottled", "Rate exceeded")),
    );
    assert!(matches!(
        q.change_visibility("AQEB", Duration::from_secs(30)).await,
        Err(QueueError::Unavailable(_))
    ));
    let attempts = stub.seen().iter().filter(|(op, _)| op == "ChangeMessageVisibility").count();
    assert!(attempts > n + 2, "throttling is retried by the SDK ({attempts} requests)");
}

/// TLS Redis (`rediss://`, as ElastiCache Serverless requires) against a real TLS redis-server whose
/// certificate chains to a private CA: with the CA named (`LANES_REDIS_CA_FILE`) the cache works;
/// without it the handshake fails against the system roots and the cache fails closed (callers
/// degrade), never talking to an unverified server.
#[tokio::test]
async fn tls_redis_with_a_private_ca() {
    let redis = RedisServer::start_tls();
    let settings = |ca_pem: Option<Vec<u8>>| RedisSettings {
        url: redis.url(),
        cluster: false,
        prefix: "lanes:".into(),
        timeout: Duration::from_millis(1_000),
        ca_pem,
        auth: None,
    };
    let cache = RedisCache::new(connect(&settings(Some(redis.ca_pem()))).await.unwrap(), "lanes:");
    cache.set("task:tls", "v", Duration::from_secs(5)).await.unwrap();
    assert_eq!(cache.get("task:tls").await.unwrap().as_deref(), Some("v"));
    let unverified = RedisCache::new(connect(&settings(None)).await.unwrap(), "lanes:");
    assert!(unverified.get("task:tls").await.is_err(), "no trusted CA, no connection");
}

/// The pinned trust store is the one the SDK's connections use: a client pinned to the test CA
/// reaches moto over TLS, and the same client pinned to Amazon's roots is refused with the issuer
/// named, as an AWS call answered by a certificate Amazon did not issue would be in Lambda.
#[tokio::test]
async fn sdk_clients_trust_only_the_pinned_roots() {
    use lanes_core::adapters::trust::{AMAZON_TRUST_ROOTS, pinned_https_client};
    let moto = MotoServer::start_tls();
    let ca = std::fs::read(moto.tls_dir().unwrap().join("ca.pem")).unwrap();
    let sdk = sdk_config(&moto.aws_settings()).await;
    let sqs = |pem: &[u8]| {
        let http = pinned_https_client(pem);
        aws_sdk_sqs::Client::from_conf(aws_sdk_sqs::config::Builder::from(&sdk).http_client(http).build())
    };
    sqs(&ca).create_queue().queue_name("pinned").send().await.unwrap();
    let refused = sqs(AMAZON_TRUST_ROOTS).list_queues().send().await.unwrap_err();
    let text = aws_sdk_sqs::error::DisplayErrorContext(&refused).to_string();
    assert!(text.contains("UnknownIssuer"), "{text}");
}

/// The reservation script and the embedded cache decide alike: 400 random reservations (several
/// counters each, limits and give-backs mixed) against a real `redis-server` and the twin, every
/// answer and every counter equal.
#[tokio::test]
async fn redis_reservations_match_the_embedded_cache() {
    use lanes_core::clock::SystemClock;
    use lanes_core::embedded::MemoryCache;
    use rand::{RngExt, SeedableRng};
    let redis = RedisServer::start();
    let shared = RedisCache::new(redis_conn(&redis, false).await, "lanes:");
    let local = MemoryCache::new(std::sync::Arc::new(SystemClock));
    let mut rng = rand::rngs::StdRng::seed_from_u64(28);
    let keys: Vec<String> = (0..5).map(|i| format!("quota:{{t-x}}:k{i}")).collect();
    let (mut granted, mut refused) = (0, 0);
    for _ in 0..400 {
        let n = rng.random_range(1..=3);
        let charges: Vec<Charge> = (0..n)
            .map(|_| Charge {
                key: keys[rng.random_range(0..keys.len())].clone(),
                amount: if rng.random_bool(0.2) { -rng.random_range(1..60) } else { rng.random_range(0..60) },
                limit: rng.random_bool(0.8).then(|| rng.random_range(50..400)),
                ttl: Duration::from_secs(600),
            })
            .collect();
        let (a, b) = (shared.reserve(&charges).await.unwrap(), local.reserve(&charges).await.unwrap());
        assert_eq!(a, b, "{charges:?}");
        if a.is_some() {
            refused += 1
        } else {
            granted += 1
        }
        for key in &keys {
            assert_eq!(
                shared.get(key).await.unwrap(),
                local.get(key).await.unwrap(),
                "{key} after {charges:?}"
            );
        }
    }
    assert!(granted > 50 && refused > 50, "both outcomes exercised: {granted} granted, {refused} refused");
}

/// A parallel burst of new tasks from one tenant, each under a new project id, over cluster-mode
/// Redis: exactly the tenant's daily budget is held, never more; released holds give it back once.
#[tokio::test]
async fn a_burst_over_rotating_projects_spends_exactly_the_budget_on_redis_cluster() {
    use lanes_core::config::QuotaConfig;
    use lanes_core::domain::Tenant;
    use lanes_core::domain::quota::{Cost, Limits};
    let redis = RedisServer::start_cluster();
    let conn = redis_conn(&redis, true).await;
    let config = QuotaConfig {
        tenant: Limits { daily_tokens: Some(5_000), rpm: Some(1_000), ..Default::default() },
        project: Limits { tpm: Some(10_000), ..Default::default() },
        ..Default::default()
    };
    let tenant = Tenant::parse("team-a").unwrap();
    // One instant for every call, so no minute or day ends in the middle of the burst.
    let now = now_ms();
    // The cluster connection is made on first use and fails fast for callers that arrive while it
    // is being made; one call from another tenant makes it before the burst.
    let other = lanes_core::quota::scopes(Some(&Tenant::parse("team-b").unwrap()), "warm-up");
    let cost = Cost { tokens: 1, usd_micros: 0 };
    let warm_up = RedisCache::new(conn.clone(), "lanes:");
    assert!(lanes_core::quota::hold(&warm_up, &config, &other, cost, "warm-up", now).await.unwrap().is_ok());
    let calls = (0..200).map(|i| {
        let cache = RedisCache::new(conn.clone(), "lanes:");
        let tenant = tenant.clone();
        async move {
            let scopes = lanes_core::quota::scopes(Some(&tenant), &format!("project-{i}"));
            let cost = Cost { tokens: 100, usd_micros: 0 };
            let nonce = format!("submission-{i}");
            lanes_core::quota::hold(&cache, &config, &scopes, cost, &nonce, now).await.unwrap().is_ok()
        }
    });
    let granted = futures::future::join_all(calls).await.into_iter().filter(|g| *g).count();
    assert_eq!(granted, 50, "5,000 tokens in calls of 100, whatever the project ids");

    // Every task ends: its hold goes back, and a second release of any of them gives back nothing.
    let release_all = || {
        futures::future::join_all((0..200).map(|i| {
            let cache = RedisCache::new(conn.clone(), "lanes:");
            let scopes = lanes_core::quota::scopes(Some(&tenant), &format!("project-{i}"));
            async move {
                lanes_core::quota::release(&cache, &config, &scopes, &format!("submission-{i}"), now)
                    .await
                    .unwrap()
            }
        }))
    };
    release_all().await;
    let cache = RedisCache::new(conn.clone(), "lanes:");
    let scopes = lanes_core::quota::scopes(Some(&tenant), "later");
    let tokens = |n| Cost { tokens: n, usd_micros: 0 };
    assert!(
        lanes_core::quota::hold(&cache, &config, &scopes, tokens(3_000), "kept", now).await.unwrap().is_ok()
    );
    release_all().await;
    assert!(
        lanes_core::quota::hold(&cache, &config, &scopes, tokens(2_001), "x", now).await.unwrap().is_err(),
        "3,000 still held: the second releases gave back nothing"
    );
    assert!(
        lanes_core::quota::hold(&cache, &config, &scopes, tokens(2_000), "y", now).await.unwrap().is_ok()
    );
}

/// A cache that requires an ACL user (as an ElastiCache user group does): a real `redis-server`
/// whose default user is off and whose `lanes` user may touch only `lanes:*` keys. With the user and
/// its password the cache and the lock work; with a wrong password, or none,
/// every call fails as it does while the cache is down (callers degrade) and nothing is written.
#[tokio::test]
async fn an_acl_user_is_required_and_a_wrong_password_degrades_as_an_outage() {
    use lanes_core::adapters::redis::RedisAuth;
    let redis = RedisServer::start();
    let admin = redis::Client::open(redis.url()).unwrap();
    let mut c = admin.get_multiplexed_async_connection().await.unwrap();
    for acl in [
        vec!["SETUSER", "lanes", "on", ">s3cret-pass", "~lanes:*", "&*", "+@all", "-@dangerous"],
        vec!["SETUSER", "default", "off"],
    ] {
        let _: () = redis::cmd("ACL").arg(&acl).query_async(&mut c).await.unwrap();
    }
    let as_user = |password: Option<&str>| RedisSettings {
        auth: password.map(|p| RedisAuth { user: "lanes".into(), password: p.into() }),
        ..redis.settings(false)
    };
    let conn = connect(&as_user(Some("s3cret-pass"))).await.unwrap();
    let cache = RedisCache::new(conn.clone(), "lanes:");
    cache.set("task:acl", "v", Duration::from_secs(5)).await.unwrap();
    assert_eq!(cache.get("task:acl").await.unwrap().as_deref(), Some("v"));
    let lock = RedisLock::new(conn, "lanes:");
    assert!(matches!(
        lock.acquire("lease:{task:acl}", Duration::from_secs(5)).await.unwrap(),
        lanes_core::ports::Acquire::Acquired(_)
    ));
    for wrong in [Some("not-the-password"), None] {
        let cache = RedisCache::new(
            connect(&as_user(wrong)).await.expect("start-up does not need the cache"),
            "lanes:",
        );
        assert!(cache.get("task:acl").await.is_err(), "{wrong:?}: refused, as when the cache is down");
        assert!(cache.set("task:other", "x", Duration::from_secs(5)).await.is_err());
    }
    let mut admin_as_user =
        redis::Client::open(format!("redis://lanes:s3cret-pass@127.0.0.1:{}", redis.port))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
    let outside: redis::RedisResult<()> =
        redis::cmd("SET").arg("other:key").arg("x").query_async(&mut admin_as_user).await;
    assert!(outside.is_err(), "the user is kept to lanes:* keys");
    let other: Option<String> =
        redis::cmd("GET").arg("lanes:task:other").query_async(&mut admin_as_user).await.unwrap();
    assert_eq!(other, None, "nothing written without the password");

    // The password is read at the first command, never at start-up; one that cannot be read yet is
    // an outage, and a later command reads it again and connects.
    let reads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let fetch: lanes_core::secret::Fetch = {
        let reads = reads.clone();
        std::sync::Arc::new(move || {
            let n = reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                match n {
                    0 => Err(lanes_core::config::ConfigError::Missing("LANES_REDIS_PASSWORD_SECRET")),
                    _ => Ok("s3cret-pass".to_owned()),
                }
            })
        })
    };
    let clock = lanes_core::clock::ManualClock::new(0);
    let password = lanes_core::secret::Secret::read_by(fetch, clock.clone());
    let settings =
        RedisSettings { auth: Some(RedisAuth { user: "lanes".into(), password }), ..redis.settings(false) };
    let cache = RedisCache::new(connect(&settings).await.unwrap(), "lanes:");
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing read at start-up");
    assert!(cache.get("task:acl").await.is_err(), "the password could not be read: degraded");
    clock.advance_ms(lanes_core::secret::FAILED_READ_BACKOFF.as_millis() as u64);
    tokio::time::sleep(lanes_core::adapters::redis::RECONNECT_EVERY + Duration::from_millis(50)).await;
    assert_eq!(cache.get("task:acl").await.unwrap().as_deref(), Some("v"), "read again and connected");
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 2);

    // A cold start's first commands come together: they wait for the one connecting (here reading
    // a password that takes 50 ms), and all work.
    let slow: lanes_core::secret::Fetch = std::sync::Arc::new(|| {
        Box::pin(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok("s3cret-pass".to_owned())
        })
    });
    let password = lanes_core::secret::Secret::read_by(slow, clock.clone());
    let settings =
        RedisSettings { auth: Some(RedisAuth { user: "lanes".into(), password }), ..redis.settings(false) };
    let fresh = RedisCache::new(connect(&settings).await.unwrap(), "lanes:");
    let together = futures::future::join_all((0..10).map(|_| fresh.get("task:acl"))).await;
    assert!(together.iter().all(|r| matches!(r, Ok(Some(v)) if v == "v")), "{together:?}");
}

/// The two places the token-share step runs: the script on a fresh redis-server (kept running while
/// the first item is held) and the embedded cache.
async fn share_caches() -> (RedisServer, RedisCache, lanes_core::embedded::MemoryCache) {
    let redis = RedisServer::start();
    let remote = RedisCache::new(connect(&redis.settings(false)).await.unwrap(), "lanes:");
    let local = lanes_core::embedded::MemoryCache::new(std::sync::Arc::new(lanes_core::clock::SystemClock));
    (redis, remote, local)
}

/// A redis-server for the token-share script (kept running while the first item is held), a plain
/// connection to it, and the workers' adapter on it.
async fn share_redis() -> (RedisServer, redis::aio::MultiplexedConnection, RedisCache) {
    let redis = RedisServer::start();
    let raw = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let remote = RedisCache::new(connect(&redis.settings(false)).await.unwrap(), "lanes:");
    (redis, raw, remote)
}

/// A group's entry as the script packs it: the byte 1 and the seven fields (current, previous,
/// window, queued, seen, weight, since) as little-endian doubles.
fn packed(fields: [u64; 7]) -> Vec<u8> {
    std::iter::once(1u8).chain(fields.iter().flat_map(|v| (*v as f64).to_le_bytes())).collect()
}

/// The token-share step is one algorithm in two places: the Redis script and the embedded cache.
/// 4,000 seeded steps of five groups (uneven weights and estimates, submissions, starts and
/// corrections, time jumps past the forget and window limits, gaps either side of the patience)
/// get the same verdict from both, at every step, and leave the same state, read back every 100
/// steps (what the standings are computed from), with the script's waiting groups exactly those with
/// tasks waiting; and the sequence does put tasks off, so the comparison is not of two constant
/// answers.
#[tokio::test]
async fn the_token_share_script_and_the_embedded_cache_decide_alike() {
    use lanes_core::domain::token_share::{ShareSettings, Step};
    let (redis, remote, local) = share_caches().await;
    let mut raw = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let settings = ShareSettings { window_ms: 5_000, forget_ms: 2_000, put_off_ms: 100, patience_ms: 60 };
    let mut seed: u64 = 0x5eed;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let (mut now, mut put_off, mut copies) = (1_796_000_000_000u64, 0, 0);
    for i in 0..4_000 {
        now += match next(100) {
            0 => 6_000,
            1..=3 => 2_500,
            _ => next(200),
        };
        let g = next(5);
        let step = match next(10) {
            0..=3 => Step::Submit,
            4..=8 => Step::Decide { estimate: [100, 1_000, 10_000][g as usize % 3] + next(50) },
            _ => Step::Settle { delta: next(2_000) as i64 - 1_500 },
        };
        let ask = ShareAsk { group: format!("t-{g}"), weight: 1 + g % 3, step, now_ms: now, settings };
        let (a, b) = (
            remote.share("fair:{interactive}", &ask).await.unwrap(),
            local.share("fair:{interactive}", &ask).await.unwrap(),
        );
        assert_eq!(a, b, "step {i}: {ask:?}");
        put_off += usize::from(a == Verdict::PutOff);
        if i % 100 == 99 {
            let (a, b) = (
                remote.share_state("fair:{interactive}").await.unwrap(),
                local.share_state("fair:{interactive}").await.unwrap(),
            );
            assert!(!a.is_empty(), "step {i}: the state read back");
            assert_eq!(a, b, "step {i}");
            // The script's waiting groups, which a decision scans alone, are byte for byte the
            // entries whose stored count of tasks waiting is above 0: every group that can compete.
            let hash = |key: &str| redis::cmd("HGETALL").arg(key).clone();
            let entries: BTreeMap<String, Vec<u8>> =
                hash("lanes:fair:{interactive}").query_async(&mut raw).await.unwrap();
            let waiting: BTreeMap<String, Vec<u8>> =
                hash("lanes:fair:{interactive}:waiting").query_async(&mut raw).await.unwrap();
            let queued: BTreeMap<String, Vec<u8>> =
                entries.into_iter().filter(|(g, _)| a.get(g).is_some_and(|u| u.queued > 0)).collect();
            assert_eq!(waiting, queued, "step {i}");
            copies += waiting.len();
        }
    }
    assert!(put_off > 100, "only {put_off} put-offs: the sequence barely tests the policy");
    assert!(copies > 0, "the waiting groups were never compared with an entry in them");
}

/// An entry stored in the six-number form (no `since`) reads in the script as it does in Rust: a
/// group waiting since the epoch, which competes at once, so a group over its share is put off.
#[tokio::test]
async fn the_token_share_script_reads_an_entry_without_since_as_waiting_long() {
    use lanes_core::domain::token_share::{GroupUse, ShareSettings, Step};
    let (_redis, mut raw, remote) = share_redis().await;
    let settings = ShareSettings { patience_ms: 60_000, ..Default::default() };
    let now = 1_796_000_000_000u64;
    let ask = |group: &str, step| ShareAsk { group: group.into(), weight: 1, step, now_ms: now, settings };
    // Written before the lane's first decision, as an upgrade finds it: that decision's sweep puts
    // it among the waiting groups.
    let old = format!("0 0 {} 2 {now} 1", now / settings.window_ms);
    assert_eq!(GroupUse::decode(&old).map(|u| u.since_ms), Some(0));
    let _: () = redis::cmd("HSET")
        .arg("lanes:fair:{interactive}")
        .arg("old")
        .arg(&old)
        .query_async(&mut raw)
        .await
        .unwrap();
    let big = || ask("big", Step::Decide { estimate: 10_000 });
    assert_eq!(remote.share("fair:{interactive}", &big()).await.unwrap(), Verdict::Go, "no tokens yet");
    let verdict = remote.share("fair:{interactive}", &big()).await.unwrap();
    assert_eq!(verdict, Verdict::PutOff, "the six-number entry competes in spite of a minute's patience");
}

/// The lane's waiting groups, which a decision scans alone, made whole again by a sweep where
/// something other than this script wrote the lane (an earlier version beside it, or data from
/// before they were kept): a packed entry with tasks waiting that they lack comes in and competes,
/// and a copy of an entry that is gone goes.
#[tokio::test]
async fn a_sweep_makes_the_waiting_groups_whole_again() {
    use lanes_core::domain::token_share::{ShareSettings, Step};
    let (_redis, mut raw, remote) = share_redis().await;
    let (settings, now) = (ShareSettings::default(), 1_796_000_000_000u64);
    let ask = |step| ShareAsk { group: "big".into(), weight: 1, step, now_ms: now, settings };
    // big's submission keeps the waiting groups; then two written past them.
    remote.share("fair:{interactive}", &ask(Step::Submit)).await.unwrap();
    // current, previous, window, queued, seen, weight, since: two tasks waiting for a second.
    let fields = [0, 0, now / settings.window_ms, 2, now - 1_000, 1, now - 1_000];
    let packed = packed(fields);
    for (key, group) in [("lanes:fair:{interactive}", "old"), ("lanes:fair:{interactive}:waiting", "gone")] {
        let _: () = redis::cmd("HSET").arg(key).arg(group).arg(&packed).query_async(&mut raw).await.unwrap();
    }
    let decide = || ask(Step::Decide { estimate: 10_000 });
    assert_eq!(remote.share("fair:{interactive}", &decide()).await.unwrap(), Verdict::Go, "no tokens yet");
    let waiting: Vec<String> =
        redis::cmd("HKEYS").arg("lanes:fair:{interactive}:waiting").query_async(&mut raw).await.unwrap();
    assert_eq!(waiting, ["old"], "big has nothing waiting now; gone was a copy of nothing");
    assert_eq!(remote.share("fair:{interactive}", &decide()).await.unwrap(), Verdict::PutOff, "old competes");
}

/// A group alone in its lane is never put off, even when its copy among the waiting groups is stale
/// (an earlier version of the script, running beside this one, wrote its entry alone): the scan
/// passes over the asking group's own copy, whatever its bytes.
#[tokio::test]
async fn a_group_alone_is_not_put_off_by_a_stale_copy_of_its_own_entry() {
    use lanes_core::domain::token_share::{ShareSettings, Step};
    let (_redis, mut raw, remote) = share_redis().await;
    let (settings, now) = (ShareSettings::default(), 1_796_000_000_000u64);
    let ask = |step, now_ms| ShareAsk { group: "g".into(), weight: 1, step, now_ms, settings };
    remote.share("fair:{interactive}", &ask(Step::Submit, now - 1_000)).await.unwrap();
    remote.share("fair:{interactive}", &ask(Step::Submit, now - 1_000)).await.unwrap();
    // As an earlier version's start would leave it: one task started, its tokens charged.
    let fields = [10_000, 0, now / settings.window_ms, 1, now - 500, 1, now - 1_000];
    let packed = packed(fields);
    let _: () = redis::cmd("HSET")
        .arg("lanes:fair:{interactive}")
        .arg("g")
        .arg(packed)
        .query_async(&mut raw)
        .await
        .unwrap();
    let decide = ask(Step::Decide { estimate: 10_000 }, now);
    assert_eq!(remote.share("fair:{interactive}", &decide).await.unwrap(), Verdict::Go, "alone");
}

/// An entry no step can read (here a count of tasks waiting that is not a whole number, which
/// Rust's reading refuses) is left out by the next sweep as Rust leaves it out: dropped from both
/// hashes, so it does not compete.
#[tokio::test]
async fn a_sweep_drops_an_entry_no_step_can_read() {
    use lanes_core::domain::token_share::{ShareSettings, Step};
    let (_redis, mut raw, remote) = share_redis().await;
    let (settings, t) = (ShareSettings::default(), 1_796_000_000_000u64);
    let ask = |step, now_ms| ShareAsk { group: "big".into(), weight: 1, step, now_ms, settings };
    remote.share("fair:{interactive}", &ask(Step::Submit, t)).await.unwrap();
    remote.share("fair:{interactive}", &ask(Step::Decide { estimate: 10_000 }, t)).await.unwrap();
    remote.share("fair:{interactive}", &ask(Step::Submit, t + 1)).await.unwrap();
    let later = t + settings.window_ms + 1;
    let fields = [0.0, 0.0, (t / settings.window_ms) as f64, 0.5, later as f64 - 1.0, 1.0, t as f64];
    let junk: Vec<u8> = std::iter::once(1u8).chain(fields.iter().flat_map(|d| d.to_le_bytes())).collect();
    let (lane, waiting) = ("lanes:fair:{interactive}", "lanes:fair:{interactive}:waiting");
    for key in [lane, waiting] {
        let _: () = redis::cmd("HSET").arg(key).arg("x").arg(&junk).query_async(&mut raw).await.unwrap();
    }
    let verdict = remote.share("fair:{interactive}", &ask(Step::Decide { estimate: 10_000 }, later)).await;
    assert_eq!(verdict.unwrap(), Verdict::Go, "x does not compete");
    for key in [lane, waiting] {
        let kept: bool = redis::cmd("HEXISTS").arg(key).arg("x").query_async(&mut raw).await.unwrap();
        assert!(!kept, "{key}");
    }
}

/// The cases the seeded comparison above seldom makes, through the script and the embedded cache
/// alike: a decision by a group whose entry has the very bytes of another's (the script passes its
/// own value over by equality), and the first decision a window after the last sweep, which drops
/// the groups idle for two windows, while a submission and a correction leave them.
#[tokio::test]
async fn twin_entries_and_idle_groups_step_alike_in_the_script_and_the_embedded_cache() {
    use lanes_core::domain::token_share::{ShareSettings, Step};
    let (_redis, remote, local) = share_caches().await;
    let settings = ShareSettings { window_ms: 5_000, forget_ms: 2_000, put_off_ms: 100, patience_ms: 60 };
    let t = 1_796_000_000_000u64;
    let steps: Vec<(&str, Step, u64)> = vec![
        ("idle-1", Step::Submit, t),
        ("idle-2", Step::Decide { estimate: 700 }, t),
        // Identical entries: the same steps at the same times.
        ("a", Step::Submit, t + 30_000),
        ("b", Step::Submit, t + 30_000),
        ("c", Step::Settle { delta: 5_000 }, t + 30_000), // tokens, without a decision
        ("c", Step::Submit, t + 30_000),
        ("a", Step::Settle { delta: 10 }, t + 30_050), // the idle groups stay
        ("b", Step::Settle { delta: 10 }, t + 30_050),
        ("a", Step::Decide { estimate: 1_000 }, t + 30_100), // a twin of b; drops the idle
        ("c", Step::Decide { estimate: 1_000 }, t + 30_200),
        ("b", Step::Decide { estimate: 1_000 }, t + 30_300),
    ];
    let (key, mut verdicts) = ("fair:{interactive}", Vec::new());
    for (i, (group, step, now_ms)) in steps.into_iter().enumerate() {
        let ask = ShareAsk { group: group.into(), weight: 2, step, now_ms, settings };
        let (a, b) = (remote.share(key, &ask).await.unwrap(), local.share(key, &ask).await.unwrap());
        assert_eq!(a, b, "step {i}: {ask:?}");
        verdicts.push(a);
        let (sa, sb) = (remote.share_state(key).await.unwrap(), local.share_state(key).await.unwrap());
        assert_eq!(sa, sb, "step {i}: {ask:?}");
        if i >= 1 {
            let idle = sa.contains_key("idle-1") && sa.contains_key("idle-2");
            assert_eq!(
                idle,
                i < 8,
                "step {i}: the idle groups go at the first decision a window after the last sweep"
            );
        }
        if i == 7 {
            assert_eq!(sa["a"], sa["b"], "twins before a's decision");
        }
    }
    // c, far over its share while b waits, is put off; the twins are not.
    assert_eq!(verdicts[8..], [Verdict::Go, Verdict::PutOff, Verdict::Go]);
}

/// An entry in the text form (`GroupUse::encode`, seven numbers), which a lane's hash may still hold,
/// is read by the standings' read as it is, and its group's next step stores it packed (the byte 1
/// and seven doubles), holding the same use with the step applied.
#[tokio::test]
async fn a_text_entry_reads_and_its_groups_next_step_stores_it_packed() {
    use lanes_core::domain::token_share::{GroupUse, ShareSettings, Step};
    let (_redis, mut raw, remote) = share_redis().await;
    let (settings, now) = (ShareSettings::default(), 1_796_000_000_000u64);
    let text = GroupUse {
        current: 500,
        previous: 70,
        window: now / settings.window_ms,
        queued: 1,
        seen_ms: now - 10,
        weight: 2,
        since_ms: now - 1_000,
    };
    let field = |cmd: &str| {
        let mut c = redis::cmd(cmd);
        c.arg("lanes:fair:{interactive}").arg("old");
        c
    };
    let _: () = field("HSET").arg(text.encode()).query_async(&mut raw).await.unwrap();
    let state = remote.share_state("fair:{interactive}").await.unwrap();
    assert_eq!(state.get("old"), Some(&text));
    let ask =
        ShareAsk { group: "old".into(), weight: 2, step: Step::Settle { delta: 100 }, now_ms: now, settings };
    assert_eq!(remote.share("fair:{interactive}", &ask).await.unwrap(), Verdict::Go);
    let stored: Vec<u8> = field("HGET").query_async(&mut raw).await.unwrap();
    assert_eq!((stored.len(), stored[0]), (57, 1), "packed: {stored:?}");
    let state = remote.share_state("fair:{interactive}").await.unwrap();
    assert_eq!(state.get("old"), Some(&GroupUse { current: 600, ..text }));
}

/// A result over the record's limit (here 640 KB that does not compress, which fails its task
/// `result_too_large` in DynamoDB alone) completes with the results bucket on moto's S3: the text
/// is put first under the run's key, the fenced write keeps the key, and a read answers it whole.
#[tokio::test]
async fn a_result_past_the_item_limit_completes_through_s3() {
    use lanes_core::tasks::large_results::{key, offload, resolve};
    let moto = MotoServer::start();
    let aws = lanes_core::adapters::AwsClients::load(&moto.aws_settings()).await;
    aws.create_table("lanes-tasks").await.unwrap();
    aws.create_bucket("lanes-results").await.unwrap();
    let (store, objects) = (aws.task_store("lanes-tasks"), aws.result_objects("lanes-results"));
    let now = now_ms();
    let huge = record("huge through s3");
    store.put_pending(&huge, now).await.unwrap();
    let ClaimOutcome::Claimed(c) = store.claim(&huge.task_id, now, 86_400).await.unwrap() else { panic!() };
    let noise: String = (0..20_000).map(|_| uuid::Uuid::new_v4().simple().to_string()).collect();
    let kept = offload(Some(&objects), &huge.task_id, c.fence, result(noise.clone())).await.unwrap();
    assert_eq!(kept.text_ref.as_deref(), Some(key(&huge.task_id, c.fence).as_str()));
    store.finish(&huge.task_id, c.fence, Completion::Completed(kept), now, 86_400).await.unwrap();
    let stored = store.get(&huge.task_id, now).await.unwrap().unwrap();
    assert_eq!(stored.status, TaskStatus::Completed);
    let read = resolve(Some(&objects), stored).await.unwrap();
    assert_eq!(read.view().result.map(|r| r.text == noise), Some(true));
}
