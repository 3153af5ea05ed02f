//! The commits flow against real services: webhook deliveries -> SQS (moto) -> the commits worker
//! with Redis (redis-server) for the lock and cache, DynamoDB (moto) for the summaries, a fake GitHub
//! REST API and the provider emulator on loopback for diffs and the model. Counts every LLM summary.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use axum::http::StatusCode;
use lanes_core::clock::{SharedClock, SystemClock};
use lanes_core::commits::sources::{DiffSources, GitHubSource, GitLabSource};
use lanes_core::commits::webhook::{Webhook, WebhookConfig, github_signature};
use lanes_core::commits::worker::{CommitsConfig, CommitsWorker};
use lanes_core::config::WorkerConfig;
use lanes_core::domain::Lane;
use lanes_core::domain::{RepoId, Sha};
use lanes_core::embedded::QueueSettings;
use lanes_core::lease::receive_batch;
use lanes_core::llm::OpenAiClient;
use lanes_core::metrics::Metrics;
use lanes_core::wiring::{Adapters, AwsBackendConfig, create_aws_resources};
use lanes_tests::mock_llm::MockLlm;
use lanes_tests::{MotoServer, RedisServer, fake_github};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

const SECRET: &str = "lanes-local-webhook-secret";

fn sha(c: char) -> String {
    c.to_string().repeat(40)
}

fn push(repo_id: u64, full_name: &str, shas: &[String]) -> String {
    let commits: Vec<serde_json::Value> = shas
        .iter()
        .map(|s| {
            serde_json::json!({"id": s, "distinct": true, "message": format!("Commit {}", &s[..7]),
                "timestamp": "2026-11-30T09:00:00Z"})
        })
        .collect();
    let after = shas.last().cloned().unwrap_or_default();
    serde_json::json!({"ref": "refs/heads/main", "before": "0".repeat(39) + "1", "after": after,
        "repository": {"id": repo_id, "full_name": full_name}, "commits": commits})
    .to_string()
}

const GITLAB_TOKEN: &str = "lanes-local-gitlab-token";

/// The 30 commits of the fake GitLab project 7's `main`, oldest first.
fn gitlab_history() -> Vec<String> {
    (0..30).map(|i| format!("{:040x}", 0xa000 + i)).collect()
}

/// A fake GitLab REST API (v4) for project 7, from the documented shapes: the commit list of a
/// revision range (`ref_name=from..to`, newest first, paged with `x-next-page`) and a commit's diff.
async fn fake_gitlab() -> String {
    use axum::extract::{Path, Query};
    use axum::response::IntoResponse;
    let router = axum::Router::new()
        .route(
            "/api/v4/projects/7",
            axum::routing::get(|| async {
                axum::Json(serde_json::json!({"id": 7, "name": "p", "path": "p", "path_with_namespace": "g/p",
                    "default_branch": "main", "namespace": {"id": 3, "path": "g", "kind": "group", "full_path": "g"}}))
            }),
        )
        .route(
            "/api/v4/projects/7/repository/commits",
            axum::routing::get(|Query(q): Query<HashMap<String, String>>| async move {
                let history = gitlab_history();
                let range = q.get("ref_name").cloned().unwrap_or_default();
                let Some((from, to)) = range.split_once("..") else {
                    return (StatusCode::BAD_REQUEST, "ref_name must be a range").into_response();
                };
                let start = history.iter().position(|s| s == from).map_or(0, |i| i + 1);
                let Some(end) = history.iter().position(|s| s == to) else {
                    return (StatusCode::NOT_FOUND, r#"{"message":"404 Commit Not Found"}"#).into_response();
                };
                let mut listed: Vec<&String> = history[start..=end].iter().rev().collect();
                let per_page: usize = q.get("per_page").and_then(|v| v.parse().ok()).unwrap_or(20).min(8);
                let page: usize = q.get("page").and_then(|v| v.parse().ok()).unwrap_or(1);
                let total = listed.len();
                listed = listed.into_iter().skip((page - 1) * per_page).take(per_page).collect();
                let body: Vec<serde_json::Value> = listed
                    .iter()
                    .map(|id| serde_json::json!({"id": id, "short_id": &id[..8], "title": format!("Change {}", &id[36..]),
                        "message": format!("Change {}\n\nbody", &id[36..]), "author_name": "Dev",
                        "committed_date": "2026-11-30T10:00:00.000+01:00", "created_at": "2026-11-30T10:00:00.000+01:00",
                        "parent_ids": [], "web_url": format!("https://gitlab.example/g/p/-/commit/{id}")}))
                    .collect();
                let next = if page * per_page < total { (page + 1).to_string() } else { String::new() };
                ([("x-next-page", next), ("x-total", total.to_string())], axum::Json(body)).into_response()
            }),
        )
        .route(
            "/api/v4/projects/7/repository/commits/{sha}/diff",
            axum::routing::get(|Path(sha): Path<String>| async move {
                axum::Json(serde_json::json!([{"diff": format!("@@ -0,0 +1 @@\n+// {sha}\n"), "new_path": "src/lib.rs",
                    "old_path": "src/lib.rs", "a_mode": "100644", "b_mode": "100644", "new_file": false,
                    "renamed_file": false, "deleted_file": false}]))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

struct Rig {
    _moto: MotoServer,
    _redis: RedisServer,
    mock: MockLlm,
    adapters: Adapters,
    webhook: axum::Router,
    worker: CommitsWorker,
    fetches: Arc<Mutex<HashMap<String, u64>>>,
}

async fn rig() -> Rig {
    let moto = MotoServer::start();
    let redis = RedisServer::start();
    let aws = moto.aws_settings();
    let settings = QueueSettings {
        default_visibility: Duration::from_secs(60),
        max_receive_count: 5,
        ..Default::default()
    };
    let queue_urls = create_aws_resources(&aws, "c", "lanes-commits-test", settings).await.unwrap();
    let config = AwsBackendConfig {
        results_bucket: None,
        aws,
        table: "lanes-commits-test".into(),
        queue_urls,
        redis: redis.settings(false),
        redrive: None,
    };
    let adapters = lanes_core::wiring::aws(&config, &[Lane::Commits]).await.unwrap();
    let fetches = Arc::new(Mutex::new(HashMap::new()));
    let github = fake_github(fetches.clone()).await;
    let gitlab = fake_gitlab().await;
    let mock = MockLlm::start().await.unwrap();
    let llm = OpenAiClient::new(&format!("{}/v1", mock.url), "m", None, Duration::from_secs(10));
    let clock: SharedClock = Arc::new(SystemClock);
    let webhook = lanes_core::commits::webhook::router(Webhook {
        queue: adapters.send[Lane::Commits.index()].clone(),
        store: adapters.summaries.clone(),
        metrics: Metrics::new(),
        clock: clock.clone(),
        config: WebhookConfig {
            github_secret: Some(SECRET.into()),
            gitlab_token: Some(GITLAB_TOKEN.into()),
            ..Default::default()
        },
    });
    let worker = CommitsWorker {
        summaries: adapters.summaries.clone(),
        cache: adapters.cache.clone(),
        lock: adapters.lock.clone(),
        llm: Arc::new(llm),
        diffs: Arc::new(DiffSources {
            github: Some(Arc::new(GitHubSource::new(&github, Some("t".into()), Duration::from_secs(5)))),
            gitlab: Some(Arc::new(GitLabSource::new(&gitlab, Some("glpat".into()), Duration::from_secs(5)))),
            ..DiffSources::default()
        }),
        send: adapters.send[Lane::Commits.index()].clone(),
        metrics: Metrics::new(),
        clock,
        lease: WorkerConfig::default().with_lease(Duration::from_secs(3)),
        config: CommitsConfig::default(),
        batching: Default::default(),
    };
    Rig { _moto: moto, _redis: redis, mock, adapters, webhook, worker, fetches }
}

async fn deliver(r: &Rig, delivery: &str, body: &str) -> (StatusCode, serde_json::Value) {
    let req = axum::http::Request::post("/")
        .header("x-github-event", "push")
        .header("x-github-delivery", delivery)
        .header("x-hub-signature-256", github_signature(SECRET.as_bytes(), body.as_bytes()))
        .body(axum::body::Body::from(body.to_owned()))
        .unwrap();
    let resp = r.webhook.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

/// Runs `workers` commits workers at once until the queue is empty.
async fn drain(r: &Rig, workers: usize) {
    let queue = r.adapters.consume[Lane::Commits.index()].clone();
    for _ in 0..60 {
        let runs = (0..workers).map(|_| {
            let (queue, worker) = (queue.clone(), r.worker.clone());
            async move {
                let batch = receive_batch(&*queue, 3, Duration::from_secs(3)).await.unwrap();
                if !batch.is_empty() {
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                    worker.process_batch(queue, batch, deadline).await;
                }
            }
        });
        futures::future::join_all(runs).await;
        let d = queue.depth().await.unwrap();
        if d.visible + d.in_flight == 0 {
            return;
        }
        // Handed-back commits (lock held elsewhere) come back after the holder's lease.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("the commits queue did not drain");
}

/// Every commit section the model was sent, by sha.
fn sections(mock: &MockLlm) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for seen in mock.seen() {
        for m in seen.body["messages"].as_array().unwrap() {
            for line in m["content"].as_str().unwrap_or("").lines() {
                if let Some(s) = line.strip_prefix("=== commit ") {
                    *out.entry(s.to_owned()).or_default() += 1;
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn each_distinct_commit_gets_exactly_one_llm_summary() {
    let r = rig().await;
    let (a, b, c, d) = (sha('a'), sha('b'), sha('c'), sha('d'));
    let p1 = push(101, "octo/one", &[a.clone(), b.clone(), c.clone()]);

    // The same push three times: a replay of one delivery id, and a re-send of its signed body
    // under a new id (the id is not signed: the body is what was delivered).
    let (status, v) = deliver(&r, "d-1", &p1).await;
    assert_eq!((status, v["enqueued"].as_u64()), (StatusCode::ACCEPTED, Some(3)), "{v}");
    let (status, v) = deliver(&r, "d-1", &p1).await;
    assert_eq!((status, v["status"].as_str()), (StatusCode::OK, Some("duplicate")));
    let (status, v) = deliver(&r, "d-2", &p1).await;
    assert_eq!((status, v["status"].as_str()), (StatusCode::OK, Some("duplicate")), "the same body");
    drain(&r, 2).await;

    // The same commits in a second branch's push, plus a new one (a new body: enqueued, and the
    // worker dedupes the commits it re-lists); then the same sha in a fork.
    let p2 = push(101, "octo/one", &[a.clone(), b.clone(), d.clone()]);
    let (status, _) = deliver(&r, "d-3", &p2).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let fork = push(202, "fork/two", std::slice::from_ref(&a));
    deliver(&r, "d-5", &fork).await;
    drain(&r, 2).await;

    let sent = sections(&r.mock);
    assert_eq!(sent.get(&a), Some(&2), "a: once per repository; all sent: {sent:?}");
    for s in [&b, &c, &d] {
        assert_eq!(sent.get(s), Some(&1), "{}: exactly one summary; all sent: {sent:?}", &s[..7]);
    }
    let fetched = r.fetches.lock().unwrap().clone();
    assert_eq!(fetched.len(), 5, "{fetched:?}");
    assert!(fetched.values().all(|&n| n == 1), "each diff fetched once: {fetched:?}");

    let keys: Vec<(RepoId, Sha)> =
        [("github:101", &a), ("github:101", &b), ("github:101", &c), ("github:101", &d), ("github:202", &a)]
            .iter()
            .map(|(r, s)| (r.parse().unwrap(), s.parse().unwrap()))
            .collect();
    let stored = r.adapters.summaries.get_summaries(&keys).await.unwrap();
    assert_eq!(stored.len(), 5);
    let one_a = stored.iter().find(|s| s.repo_id == "github:101" && s.sha == a).unwrap();
    let two_a = stored.iter().find(|s| s.repo_id == "github:202" && s.sha == a).unwrap();
    assert!(one_a.summary.contains("touches src/one.rs") && two_a.summary.contains("touches src/two.rs"));
    assert!(stored.iter().all(|s| s.tokens.prompt > 0 && s.tokens.completion > 0), "tokens apportioned");

    // Read back through the API, newest first, paginated (DynamoDB index on moto).
    let page = r.adapters.summaries.list_summaries(&"github:101".parse().unwrap(), 3, None).await.unwrap();
    assert_eq!(page.items.len(), 3);
    let rest = r
        .adapters
        .summaries
        .list_summaries(&"github:101".parse().unwrap(), 3, page.next.as_deref())
        .await
        .unwrap();
    assert_eq!((rest.items.len(), rest.next), (1, None));
    let api = lanes_core::commits::api::router(lanes_core::commits::api::SummariesApi {
        summaries: r.adapters.summaries.clone(),
        cache: r.adapters.cache.clone(),
        readers: None,
    });
    let req = axum::http::Request::get(format!("/v1/repos/github:202/commits/{a}/summary"))
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = api.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn concurrent_workers_on_the_same_new_commits_spend_once() {
    let r = rig().await;
    let shas: Vec<String> = "ef1234".chars().map(sha).collect();
    let p = push(303, "octo/three", &shas);
    // The same commits pushed to four branches: 24 messages for 6 commits.
    for d in ["x-1", "x-2", "x-3", "x-4"] {
        let (status, v) = deliver(&r, d, &p.replace("refs/heads/main", &format!("refs/heads/{d}"))).await;
        assert_eq!((status, v["enqueued"].as_u64()), (StatusCode::ACCEPTED, Some(6)), "{v}");
    }
    let llm_requests = AtomicU64::new(r.mock.seen().len() as u64);
    drain(&r, 4).await;
    let sent = sections(&r.mock);
    for s in &shas {
        assert_eq!(sent.get(s), Some(&1), "{}: {sent:?}", &s[..7]);
    }
    assert!(r.mock.seen().len() as u64 > llm_requests.load(Ordering::SeqCst));
}

/// A GitLab push of 30 commits whose payload lists 20 (as GitLab does): the commits worker lists
/// the rest with GitLab's API, and all 30 are summarized, each once.
#[tokio::test]
async fn a_thirty_commit_gitlab_push_listing_twenty_is_summarized_whole() {
    let r = rig().await;
    let history = gitlab_history();
    let listed: Vec<serde_json::Value> = history[10..]
        .iter()
        .map(
            |id| serde_json::json!({"id": id, "message": "listed", "timestamp": "2026-11-30T10:00:00+01:00"}),
        )
        .collect();
    let before = "f".repeat(40);
    // `before` is not in this fake's history: the range is everything up to `after`.
    let body = serde_json::json!({"object_kind": "push", "before": before, "after": history[29],
        "ref": "refs/heads/main", "total_commits_count": 30,
        "project": {"id": 7, "path_with_namespace": "g/p", "default_branch": "main"}, "commits": listed})
    .to_string();
    let req = axum::http::Request::post("/webhooks/gitlab")
        .header("x-gitlab-event", "Push Hook")
        .header("x-gitlab-token", GITLAB_TOKEN)
        .header("x-gitlab-event-uuid", "gl-30")
        .body(axum::body::Body::from(body))
        .unwrap();
    let resp = r.webhook.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!((v["enqueued"].as_u64(), v["not_listed"].as_u64()), (Some(20), Some(10)), "{v}");
    drain(&r, 2).await;
    let seen = sections(&r.mock);
    for id in &history {
        assert_eq!(seen.get(id), Some(&1), "{id} summarized once: {seen:?}");
    }
    let keys: Vec<(RepoId, Sha)> =
        history.iter().map(|id| ("gitlab:7".parse().unwrap(), id.parse().unwrap())).collect();
    assert_eq!(r.adapters.summaries.get_summaries(&keys).await.unwrap().len(), 30, "all 30 stored");
}

/// A push signed with the shared secret that pairs another repository's id (octo/one's 101) with
/// the sender's own name: the webhook cannot tell, but the worker asks GitHub what 101 is, refuses
/// the forged commits (dead-lettered as `identity`, never fetched, never in a prompt, no summary
/// under the victim's id), while the victim's own commit in the same batch is summarized.
#[tokio::test]
async fn a_push_that_claims_another_repositorys_id_is_refused_by_the_worker() {
    let r = rig().await;
    let (victim, forged) = (sha('1'), sha('2'));
    deliver(&r, "v-1", &push(101, "octo/one", std::slice::from_ref(&victim))).await;
    let (status, _) = deliver(&r, "f-1", &push(101, "attacker/own", std::slice::from_ref(&forged))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "the signature is good; the webhook has no host to ask");
    drain(&r, 1).await;
    let sent = sections(&r.mock);
    assert_eq!(sent.get(&victim), Some(&1), "{sent:?}");
    assert_eq!(sent.get(&forged), None, "the forged commit reached a prompt: {sent:?}");
    let fetched = r.fetches.lock().unwrap().clone();
    assert_eq!(fetched.keys().cloned().collect::<Vec<_>>(), vec![format!("octo/one@{victim}")]);
    let keys: Vec<(RepoId, Sha)> =
        [&victim, &forged].iter().map(|s| ("github:101".parse().unwrap(), s.parse().unwrap())).collect();
    let stored = r.adapters.summaries.get_summaries(&keys).await.unwrap();
    assert_eq!(stored.iter().map(|s| s.sha.to_string()).collect::<Vec<_>>(), vec![victim.clone()]);
    let dlq = r.adapters.dlq[Lane::Commits.index()].clone().unwrap();
    let dead = receive_batch(&*dlq, 10, Duration::from_secs(2)).await.unwrap();
    assert_eq!(dead.len(), 1, "the forged commit waits in the DLQ for the operator");
    assert!(dead[0].body.contains(&forged) && dead[0].body.contains("attacker/own"));
    let text = r.worker.metrics.render();
    assert!(
        text.lines().any(|l| l.starts_with("lanes_dead_lettered_total{")
            && l.contains("reason=\"identity\"")
            && l.ends_with(" 1")),
        "counted: {text}"
    );
}

/// The batch path on the AWS adapters: four deliveries of one push (24 messages, 6 commits) taken
/// by four workers at once over SQS (moto) with the lock and cache in Redis, handed to provider
/// batches (the Files and Batch API emulator) whose record and markers live in DynamoDB
/// (moto), then collected as the controller does: each commit summarized once, at tier `batch`,
/// and every record closed.
#[tokio::test]
async fn concurrent_workers_at_tier_batch_make_one_batch_through_dynamodb_and_sqs() {
    use lanes_tests::mock_batches::{BatchTiming, MockBatches};
    let mut r = rig().await;
    let timing = BatchTiming {
        validating: Duration::from_millis(200),
        per_request: Duration::from_millis(20),
        ..Default::default()
    };
    let batches = MockBatches::start(Arc::new(SystemClock), timing).await.unwrap();
    let api = lanes_core::llm::OpenAiBatches::new(
        OpenAiClient::new(&batches.url, "gpt-4o-mini", None, Duration::from_secs(10)),
        "openai:gpt-4o-mini".into(),
    );
    r.worker.lease.lanes[Lane::Commits.index()].tier = lanes_core::domain::tier::TierSetting::Batch;
    r.worker.batching = Some(lanes_core::commits::Batching {
        api: Arc::new(api),
        store: r.adapters.batches.clone(),
        queue_tokens: None,
        scope: "lanes-commits-test".into(),
    });
    let shas: Vec<String> = "012345".chars().map(sha).collect();
    let p = push(202, "fork/two", &shas);
    for d in ["b-1", "b-2", "b-3", "b-4"] {
        let (status, _) = deliver(&r, d, &p.replace("refs/heads/main", &format!("refs/heads/{d}"))).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    drain(&r, 4).await;
    assert!(r.mock.seen().is_empty(), "no synchronous call");
    // Each worker batches the commits it locked: as many batches as workers that won a lock.
    assert!((1..=4).contains(&batches.batches()), "{}", batches.batches());
    let collector = r.worker.collector().unwrap();
    let mut written = 0;
    for _ in 0..50 {
        written += collector.tick().await.written;
        if written == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(written, 6);
    let keys: Vec<(RepoId, Sha)> =
        shas.iter().map(|s| (RepoId::parse("github:202").unwrap(), Sha::parse(s).unwrap())).collect();
    let found = r.adapters.summaries.get_summaries(&keys).await.unwrap();
    assert_eq!(found.len(), 6);
    assert!(found.iter().all(|s| s.tier == lanes_core::domain::tier::Tier::Batch), "{found:?}");
    assert!(batches.answered().values().all(|n| *n == 1) && batches.answered().len() == 6);
    assert!(r.adapters.batches.open_batches(10).await.unwrap().is_empty(), "every record closed");
}
