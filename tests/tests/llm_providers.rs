//! The OpenAI-compatible and Anthropic clients and the retry policy against a mock provider on
//! loopback: request shapes, usage parsing, which statuses are retried, provider hints, bounds.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use lanes_core::domain::{Kind, Lane};
use lanes_core::llm::{AnthropicClient, OpenAiClient, RetryPolicy, Retrying};
use lanes_core::ports::{LlmClient, LlmError, LlmRequest};
use lanes_tests::mock_llm::{MockLlm, Scripted};
use std::time::{Duration, Instant};

fn request() -> LlmRequest {
    LlmRequest {
        lane: Lane::Interactive,
        kind: Kind::Explain,
        prompt: "what does main do?".into(),
        target_files: vec!["src/main.rs".into()],
        max_tokens: 64,
    }
}

fn fast() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        base: Duration::from_millis(20),
        max_delay: Duration::from_millis(80),
        max_hint: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn openai_shape_usage_and_auth() {
    let mock = MockLlm::start().await;
    let client = OpenAiClient::new(
        &format!("{}/v1", mock.url),
        "gpt-test",
        Some("sk-test".into()),
        Duration::from_secs(5),
    )
    .unwrap();
    let r = client.complete(&request()).await.unwrap();
    assert_eq!((r.text.as_str(), r.model.as_str()), ("mock answer", "gpt-test"));
    assert!(r.usage.prompt > 5 && r.usage.completion == 2);
    let seen = mock.seen();
    assert_eq!(seen[0].headers["authorization"], "Bearer sk-test");
    assert_eq!(seen[0].body["messages"][0]["role"], "system");
    assert!(seen[0].body["messages"][1]["content"].as_str().unwrap().contains("src/main.rs"));
    assert_eq!(seen[0].body["max_tokens"], 64);
}

#[tokio::test]
async fn anthropic_shape_usage_and_headers() {
    let mock = MockLlm::start().await;
    let client =
        AnthropicClient::new(&mock.url, "claude-test", "key".into(), Duration::from_secs(5)).unwrap();
    let r = client.complete(&request()).await.unwrap();
    assert_eq!((r.text.as_str(), r.model.as_str()), ("mock answer", "claude-test"));
    assert!(r.usage.prompt > 5 && r.usage.completion == 2);
    let seen = mock.seen();
    assert_eq!(seen[0].headers["anthropic-version"], "2023-06-01");
    assert!(seen[0].body["system"].as_str().unwrap().starts_with("Explain"));
}

#[tokio::test]
async fn throttles_and_server_errors_are_retried_honouring_the_hint() {
    let mock = MockLlm::start().await;
    mock.script([
        Scripted::Status(429, vec![("retry-after-ms", "150".into())]),
        Scripted::Status(500, vec![]),
        Scripted::Status(503, vec![("x-ratelimit-reset-requests", "100ms".into())]),
    ]);
    let client = Retrying::new(
        OpenAiClient::new(&format!("{}/v1", mock.url), "m", None, Duration::from_secs(5)).unwrap(),
        fast(),
    );
    let started = Instant::now();
    let r = client.complete(&request()).await.unwrap();
    assert_eq!(r.text, "mock answer");
    assert_eq!(mock.seen().len(), 4, "three failures, then the answer");
    assert!(started.elapsed() >= Duration::from_millis(250), "waited at least the provider's hints");
}

#[tokio::test]
async fn client_errors_are_never_retried() {
    let mock = MockLlm::start().await;
    for code in [400, 401, 403, 404] {
        mock.script([Scripted::Status(code, vec![])]);
    }
    let client = Retrying::new(
        OpenAiClient::new(&format!("{}/v1", mock.url), "m", None, Duration::from_secs(5)).unwrap(),
        fast(),
    );
    for code in [400, 401, 403, 404] {
        let e = client.complete(&request()).await.unwrap_err();
        assert!(matches!(&e, LlmError::Permanent(m) if m.contains(&code.to_string())), "{e}");
    }
    assert_eq!(mock.seen().len(), 4, "one request each");
}

#[tokio::test]
async fn a_storm_is_bounded_and_overlong_hints_hand_the_task_back() {
    let mock = MockLlm::start().await;
    mock.script((0..10).map(|_| Scripted::Status(529, vec![])));
    let client = Retrying::new(
        AnthropicClient::new(&mock.url, "m", "k".into(), Duration::from_secs(5)).unwrap(),
        fast(),
    );
    assert!(matches!(client.complete(&request()).await, Err(LlmError::Retryable { .. })));
    assert_eq!(mock.seen().len(), 4, "max_attempts");

    let mock = MockLlm::start().await;
    let reset = humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(120))
        .to_string();
    mock.script([Scripted::Status(429, vec![("anthropic-ratelimit-tokens-reset", reset)])]);
    let client = Retrying::new(
        AnthropicClient::new(&mock.url, "m", "k".into(), Duration::from_secs(5)).unwrap(),
        fast(),
    );
    let started = Instant::now();
    let Err(LlmError::Retryable { retry_after: Some(after), .. }) = client.complete(&request()).await else {
        panic!("retryable")
    };
    assert!(
        after > Duration::from_secs(100) && started.elapsed() < Duration::from_secs(2),
        "no wait in the worker"
    );
    assert_eq!(mock.seen().len(), 1);
}

#[tokio::test]
async fn a_slow_provider_times_out_as_retryable() {
    let mock = MockLlm::start().await;
    mock.script([Scripted::Slow(Duration::from_secs(3))]);
    let client =
        OpenAiClient::new(&format!("{}/v1", mock.url), "m", None, Duration::from_millis(300)).unwrap();
    let e = client.complete(&request()).await.unwrap_err();
    assert!(matches!(&e, LlmError::Retryable { message, .. } if message.contains("timed out")), "{e}");
}
