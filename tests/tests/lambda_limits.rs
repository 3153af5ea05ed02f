//! The real Lambda binaries under the limits `template.yaml` gives them (`Timeout`, environment,
//! reserved concurrency, event source settings), enforced as Lambda enforces them
//! ([`lanes_tests::lambda_emulator`]), against moto and redis-server: a long-poll answers inside the
//! ingress function's `Timeout` whatever `wait` asks; a request that cannot finish in time answers
//! `503` rather than being killed; and the emulator itself kills, throttles and cold-starts.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::adapters::sdk_config;
use lanes_core::adapters::sqs::SqsQueue;
use lanes_core::embedded::QueueSettings;
use lanes_core::ports::QueueConsume;
use lanes_core::wiring::create_aws_resources;
use lanes_tests::lambda_emulator::{FunctionSpec, LambdaFunction, Outcome, sqs_event};
use lanes_tests::{MotoServer, RedisServer, workspace_root};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The stack's resources on moto and redis-server, as the variables the template sets from them.
struct Stack {
    moto: MotoServer,
    _redis: RedisServer,
    urls: [String; 3],
    vars: Vec<(String, String)>,
}

async fn stack() -> Stack {
    let moto = MotoServer::start();
    let redis = RedisServer::start();
    let urls = create_aws_resources(&moto.aws_settings(), "lanes", "lanes-tasks", QueueSettings::default())
        .await
        .unwrap();
    let mut vars = moto.env();
    vars.extend(lanes_tests::stack_env("lanes-tasks", &urls));
    vars.push(("REDIS_URL".into(), redis.url()));
    vars.push(("LANES_METRICS_NAMESPACE".into(), "Lanes/test".into()));
    Stack { moto, _redis: redis, urls, vars }
}

/// `logical_id` as the template declares it, on the test's stack: the single redis-server has no
/// cluster mode and no ACL user.
fn function(s: &Stack, logical_id: &str) -> FunctionSpec {
    FunctionSpec::from_template(logical_id)
        .set_all(s.vars.clone())
        .set("LANES_REDIS_CLUSTER", "false")
        .drop_var("LANES_REDIS_USER", "the test's redis-server has only the default user")
        .drop_var("LANES_REDIS_PASSWORD_SECRET", "the test's redis-server asks no password")
}

fn event(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(workspace_root().join("events").join(name)).unwrap())
        .unwrap()
}

/// The documented GET event, for `id` with `query`.
fn get_event(id: &str, query: &str) -> Value {
    let mut e = event("api-get-task.json");
    let path = format!("/v1/tasks/{id}");
    e["rawPath"] = path.clone().into();
    e["requestContext"]["http"]["path"] = path.into();
    e["pathParameters"]["proxy"] = format!("tasks/{id}").into();
    e["rawQueryString"] = query.into();
    e
}

fn body(answer: &Value) -> Value {
    serde_json::from_str(answer["body"].as_str().unwrap()).unwrap()
}

/// `?wait=20` is documented, and used to outlast the ingress function's 10 s `Timeout`: Lambda
/// killed the invocation and API Gateway answered 5xx. Now the wait is cut to the invocation's
/// time left: at the template's `Timeout`, and at a shorter one, the GET answers the task's state
/// in time. Then a worker batch of the mapping's size runs the tasks within its own `Timeout`, and
/// a long-poll answers COMPLETED.
#[tokio::test]
async fn a_long_poll_answers_inside_the_ingress_timeout() {
    let s = stack().await;
    let spec = function(&s, "IngressFunction");
    let template_timeout = spec.timeout;
    let ingress = LambdaFunction::start(spec.clone());
    let posted = ingress.invoke(&event("api-post-task.json")).await.answer();
    assert_eq!(posted["statusCode"], 202, "{posted}");
    let id = body(&posted)["task_id"].as_str().unwrap().to_owned();

    // No worker runs: the task stays pending for the whole wait the invocation allows.
    for (timeout, ingress) in [
        (template_timeout, ingress),
        (Duration::from_secs(10), LambdaFunction::start(spec.with_timeout(Duration::from_secs(10)))),
    ] {
        let started = Instant::now();
        let outcome = ingress.invoke(&get_event(&id, "wait=20")).await;
        let took = started.elapsed();
        let answer = match outcome {
            Outcome::Answered(a) => a,
            other => panic!("wait=20 under a {timeout:?} Timeout: {other:?}\n{}", ingress.log_text()),
        };
        assert_eq!(answer["statusCode"], 202, "not finished yet: {answer}");
        assert_eq!(body(&answer)["status"], "PENDING");
        let waited = Duration::from_secs(20).min(timeout.saturating_sub(Duration::from_secs(3)));
        assert!(took >= waited && took < timeout, "answered after {took:?} under a {timeout:?} Timeout");
    }

    let worker_spec = function(&s, "InteractiveWorkerFunction")
        .drop_var("LANES_LLM_API_KEY_SECRET", "the template's default provider, offline, needs no key");
    let mapping = worker_spec.mapping.clone().unwrap();
    assert_eq!(worker_spec.env()["LANES_LANE"], "interactive");
    let worker = LambdaFunction::start(worker_spec);
    let config = sdk_config(&s.moto.aws_settings()).await;
    let queue = SqsQueue::connect(aws_sdk_sqs::Client::new(&config), &s.urls[0]).await.unwrap();
    let received = queue.receive(mapping.batch_size).await.unwrap();
    assert_eq!(received.len(), 1);
    let answer =
        worker.invoke(&sqs_event(&received, "arn:aws:sqs:us-east-1:123456789012:lanes-interactive")).await;
    assert_eq!(answer.answer()["batchItemFailures"], serde_json::json!([]), "{}", worker.log_text());
    // The gauge of the oldest record's age leaves Lambda in the invocation's EMF document.
    let emf = worker
        .log_text()
        .lines()
        .find(|l| l.contains("\"CloudWatchMetrics\"") && l.contains("queue_oldest_age_seconds"))
        .map(str::to_owned);
    let emf: Value = serde_json::from_str(&emf.expect("an EMF line with the gauge")).unwrap();
    assert_eq!(emf["lane"], "interactive");
    assert!(emf["queue_oldest_age_seconds"].is_number(), "{emf}");
    let ingress = LambdaFunction::start(function(&s, "IngressFunction"));
    let answer = ingress.invoke(&get_event(&id, "wait=20")).await.answer();
    assert_eq!(
        (answer["statusCode"].as_u64(), &body(&answer)["status"]),
        (Some(200), &"COMPLETED".into()),
        "{answer}"
    );
}

/// The emulator keeps Lambda's `Timeout`: the deadline it hands the function is a real time that
/// far ahead, an invocation still running then is killed with its environment (its log says so,
/// in Lambda's words), and the next invocation cold-starts a new process.
#[tokio::test]
async fn the_emulator_kills_an_invocation_at_its_timeout() {
    let f = LambdaFunction::start(FunctionSpec::bare("lambda-sleeper", Duration::from_secs(2), None));
    let first = f.invoke(&serde_json::json!({"sleep_ms": 0})).await.answer();
    let deadline = first["deadline"].as_u64().unwrap();
    let ahead = deadline.saturating_sub(lanes_tests::now_ms());
    assert!((1_000..=2_000).contains(&ahead), "deadline {ahead} ms ahead of a 2 s Timeout");
    let started = Instant::now();
    let outcome = f.invoke(&serde_json::json!({"sleep_ms": 10_000})).await;
    assert!(matches!(outcome, Outcome::TimedOut), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(4), "killed at the Timeout: {:?}", started.elapsed());
    assert!(f.log_text().contains("Task timed out after 2.00 seconds"), "{}", f.log_text());
    let pid = first["pid"].as_u64().unwrap();
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the timed-out environment is gone");
    let next = f.invoke(&serde_json::json!({"sleep_ms": 0})).await.answer();
    assert_ne!(next["pid"], first["pid"], "a cold start after the kill");
    let warm = f.invoke(&serde_json::json!({"sleep_ms": 0})).await.answer();
    assert_eq!(warm["pid"], next["pid"], "a warm environment is reused");
}

/// Reserved concurrency is the most environments at once: one more concurrent invocation is
/// throttled. The template's webhook has it, from its parameter's default.
#[tokio::test]
async fn the_emulator_throttles_past_reserved_concurrency() {
    let webhook = FunctionSpec::from_template("WebhookFunction");
    assert!(
        webhook.reserved.is_some_and(|n| n >= 1),
        "the webhook's reserved concurrency: {:?}",
        webhook.reserved
    );
    let f = LambdaFunction::start(FunctionSpec::bare("lambda-sleeper", Duration::from_secs(5), Some(2)));
    let slow = serde_json::json!({"sleep_ms": 1_000});
    let (a, b, c) = tokio::join!(f.invoke(&slow), f.invoke(&slow), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        f.invoke(&slow).await
    });
    assert!(matches!(c, Outcome::Throttled), "a third at once is throttled: {c:?}");
    a.answer();
    b.answer();
    f.invoke(&slow).await.answer();
}

/// A request that would outlast the invocation (here every AWS call hangs: the endpoint accepts
/// connections and never answers, and the SDK's own timeouts are longer than the function's) is
/// cut a margin before the deadline and answered `503` with `Retry-After`, instead of being killed
/// into API Gateway's bare 5xx.
#[tokio::test]
async fn a_request_that_cannot_finish_in_time_answers_503() {
    let s = stack().await;
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let held =
        std::thread::spawn(move || silent.incoming().take(64).filter_map(Result::ok).collect::<Vec<_>>());
    let spec = function(&s, "IngressFunction")
        .set("AWS_ENDPOINT_URL", endpoint)
        .with_timeout(Duration::from_secs(4));
    let ingress = LambdaFunction::start(spec);
    let started = Instant::now();
    let outcome = ingress.invoke(&event("api-post-task.json")).await;
    let answer = match outcome {
        Outcome::Answered(a) => a,
        other => panic!("{other:?}\n{}", ingress.log_text()),
    };
    assert_eq!(answer["statusCode"], 503, "{answer}");
    assert_eq!(answer["headers"]["retry-after"], "1");
    assert_eq!(body(&answer)["type"].as_str().map(|t| t.ends_with("/unavailable")), Some(true), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert!(ingress.log_text().contains("request cut at the invocation's deadline"));
    drop(held);
}
