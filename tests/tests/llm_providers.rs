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
        params: Default::default(),
        tier: Default::default(),
        prefix: None,
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
    let mock = MockLlm::start().await.unwrap();
    let client = OpenAiClient::new(
        &format!("{}/v1", mock.url),
        "gpt-test",
        Some("sk-test".into()),
        Duration::from_secs(5),
    );
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
    let mock = MockLlm::start().await.unwrap();
    let client = AnthropicClient::new(&mock.url, "claude-test", "key".into(), Duration::from_secs(5));
    let r = client.complete(&request()).await.unwrap();
    assert_eq!((r.text.as_str(), r.model.as_str()), ("mock answer", "claude-test"));
    assert!(r.usage.prompt > 5 && r.usage.completion == 2);
    let seen = mock.seen();
    assert_eq!(seen[0].headers["anthropic-version"], "2023-06-01");
    assert!(seen[0].body["system"].as_str().unwrap().starts_with("Explain"));
    // The tier it was served at is the one `usage.service_tier` names: Priority Tier usage is paid
    // under the organisation's commitment, so its per-token cost is unknown here, not the list price.
    use lanes_core::domain::tier::Tier;
    assert_eq!(r.tier, Tier::Sync);
    mock.anthropic_priority(true);
    let r = client.complete(&request()).await.unwrap();
    assert_eq!(r.tier, Tier::Priority);
    assert_eq!(lanes_core::llm::price::prices().cost("claude-sonnet-4", r.usage, r.tier), None);
}

/// A request with sampling parameters and a completion cap of one token.
fn capped_request() -> LlmRequest {
    let params = serde_json::from_value(
        serde_json::json!({"temperature": 0.3, "top_p": 0.9, "stop": ["END"], "seed": 7}),
    )
    .unwrap();
    LlmRequest { max_tokens: 1, params, ..request() }
}

#[tokio::test]
async fn params_reach_the_provider_and_a_cut_answer_is_flagged() {
    let mock = MockLlm::start().await.unwrap();
    let openai = OpenAiClient::new(&format!("{}/v1", mock.url), "m", None, Duration::from_secs(5));
    let r = openai.complete(&capped_request()).await.unwrap();
    assert!(r.truncated, "finish_reason length -> truncated");
    assert!(!openai.complete(&request()).await.unwrap().truncated);
    let body = &mock.seen()[0].body;
    assert_eq!((body["temperature"].as_f64(), body["top_p"].as_f64()), (Some(0.3), Some(0.9)));
    assert_eq!((body["stop"][0].as_str(), body["seed"].as_i64()), (Some("END"), Some(7)));
    assert_eq!(body["max_tokens"], 1, "a compatible server gets max_tokens");
    assert!(body.get("max_completion_tokens").is_none());

    let mock = MockLlm::start().await.unwrap();
    let anthropic = AnthropicClient::new(&mock.url, "c", "k".into(), Duration::from_secs(5));
    let r = anthropic.complete(&capped_request()).await.unwrap();
    assert!(r.truncated, "stop_reason max_tokens -> truncated");
    assert!(!anthropic.complete(&request()).await.unwrap().truncated);
    let body = &mock.seen()[0].body;
    assert_eq!((body["temperature"].as_f64(), body["stop_sequences"][0].as_str()), (Some(0.3), Some("END")));
    assert!(body.get("seed").is_none(), "the Messages API has no seed");
}

#[tokio::test]
async fn throttles_and_server_errors_are_retried_honouring_the_hint() {
    let mock = MockLlm::start().await.unwrap();
    mock.script([
        Scripted::Status(429, vec![("retry-after-ms", "150".into())]),
        Scripted::Status(500, vec![]),
        Scripted::Status(503, vec![("x-ratelimit-reset-requests", "100ms".into())]),
    ]);
    let client = Retrying::new(
        OpenAiClient::new(&format!("{}/v1", mock.url), "m", None, Duration::from_secs(5)),
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
    let mock = MockLlm::start().await.unwrap();
    for code in [400, 401, 403, 404] {
        mock.script([Scripted::Status(code, vec![])]);
    }
    let client = Retrying::new(
        OpenAiClient::new(&format!("{}/v1", mock.url), "m", None, Duration::from_secs(5)),
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
    let mock = MockLlm::start().await.unwrap();
    mock.script((0..10).map(|_| Scripted::Status(529, vec![])));
    let client =
        Retrying::new(AnthropicClient::new(&mock.url, "m", "k".into(), Duration::from_secs(5)), fast());
    assert!(matches!(client.complete(&request()).await, Err(LlmError::Retryable { .. })));
    assert_eq!(mock.seen().len(), 4, "max_attempts");

    let mock = MockLlm::start().await.unwrap();
    let reset = humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(120))
        .to_string();
    mock.script([Scripted::Status(429, vec![("anthropic-ratelimit-tokens-reset", reset)])]);
    let client =
        Retrying::new(AnthropicClient::new(&mock.url, "m", "k".into(), Duration::from_secs(5)), fast());
    let started = Instant::now();
    let Err(LlmError::Throttled { retry_after: Some(after), .. }) = client.complete(&request()).await else {
        panic!("a 429 is a throttle, not a failure")
    };
    assert!(
        after > Duration::from_secs(100) && started.elapsed() < Duration::from_secs(2),
        "no wait in the worker"
    );
    assert_eq!(mock.seen().len(), 1);
}

#[tokio::test]
async fn a_slow_provider_times_out_as_retryable() {
    let mock = MockLlm::start().await.unwrap();
    mock.script([Scripted::Slow(Duration::from_secs(3))]);
    let client = OpenAiClient::new(&format!("{}/v1", mock.url), "m", None, Duration::from_millis(300));
    let e = client.complete(&request()).await.unwrap_err();
    assert!(matches!(&e, LlmError::Retryable { message, .. } if message.contains("timed out")), "{e}");
}

/// The whole flow on production adapters with a real HTTP provider (the mock) behind the shared
/// Redis limiter: answers come from the provider, budget is taken and reconciled in Redis.
#[tokio::test]
async fn lanes_dev_on_aws_with_an_openai_compatible_provider_and_the_shared_limiter() {
    use lanes_tests::{Backend, Stack};
    let mock = MockLlm::start().await.unwrap();
    let env = [
        ("LANES_LLM_PROVIDER", "openai".to_owned()),
        ("LANES_LLM_MODEL", "gpt-test".to_owned()),
        ("LANES_LLM_BASE_URL", format!("{}/v1", mock.url)),
        ("LANES_LLM_RPM", "6000".to_owned()),
        ("LANES_LLM_TPM", "1000000".to_owned()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec();
    mock.script([Scripted::Status(429, vec![("retry-after-ms", "50".into())])]);
    let stack = Stack::start_with_env(Backend::Aws, &[], env).await;
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..10 {
        let body =
            serde_json::json!({"project_id":"p","kind":"explain","prompt":format!("q{i}"),"target_files":[]});
        let v: serde_json::Value = client
            .post(format!("{}/v1/tasks", stack.server.url))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ids.push(v["task_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v: serde_json::Value = reqwest::get(format!("{}/v1/tasks/{id}", stack.server.url))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if v["status"] == "COMPLETED" {
                assert_eq!(
                    (v["result"]["text"].as_str(), v["result"]["model"].as_str()),
                    (Some("mock answer"), Some("gpt-test"))
                );
                break;
            }
            assert!(Instant::now() < deadline, "{v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(mock.seen().len(), 11, "ten answers and one retried 429");
    let limiter_calls = stack
        .server
        .metric("lanes_aws_requests_total{operation=\"EVALSHA limiter\",service=\"redis\"}")
        .await;
    assert!(limiter_calls >= 20.0, "budget taken and reconciled in Redis ({limiter_calls})");
}

/// Routes: the interactive lane's primary answers 429 with a long hint; the shared cooldown (in
/// Redis) sends that request and every later one to the second route, and each answer names the
/// model that produced it.
#[tokio::test]
async fn a_primary_cooling_down_falls_back_and_the_answer_names_the_fallback_model() {
    use lanes_tests::{Backend, Stack};
    let primary = MockLlm::start().await.unwrap();
    let second = MockLlm::start().await.unwrap();
    let routes = format!("openai:light@{}/v1,openai:heavy@{}/v1", primary.url, second.url);
    let env = [("LANES_LLM_ROUTES_INTERACTIVE", routes), ("OPENAI_API_KEY", "k".to_owned())]
        .map(|(k, v)| (k.to_owned(), v))
        .to_vec();
    primary.script([Scripted::Status(429, vec![("retry-after", "60".into())])]);
    let stack = Stack::start_with_env(Backend::Aws, &[], env).await;
    for i in 0..4 {
        let id = lanes_tests::submit(&stack.server.url, "explain", &format!("q{i}")).await;
        // One at a time, so the first one's 429 has started the cooldown before the next call.
        let v: serde_json::Value = reqwest::get(format!("{}/v1/tasks/{id}?wait=20", stack.server.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            (v["status"].as_str(), v["result"]["model"].as_str()),
            (Some("COMPLETED"), Some("heavy")),
            "{v}"
        );
    }
    assert_eq!(
        (primary.seen().len(), second.seen().len()),
        (1, 4),
        "the primary is skipped while it cools down"
    );
    let route = |event: &str| {
        format!(
            "lanes_llm_route_events_total{{event=\"{event}\",lane=\"interactive\",route=\"openai:light\"}}"
        )
    };
    assert_eq!(stack.server.metric(&route("fallback")).await, 4.0);
    assert_eq!(stack.server.metric(&route("throttled")).await, 1.0);
}

/// A flex call goes out with `service_tier: "flex"`; OpenAI's capacity refusal (`429 Resource
/// Unavailable`) is answered at `sync` on the same route at once; a model without flex (a 400 naming
/// `service_tier`) is called at `sync` and the route stops asking; a route configured `+sync` never
/// asks. The answer says the tier that served it, and the price follows it.
#[tokio::test]
async fn flex_is_asked_for_refused_flex_is_answered_at_sync_and_a_model_without_flex_stops_being_asked() {
    use lanes_core::domain::tier::Tier;
    use lanes_core::llm::route::{Fallback, RouteClient};
    use lanes_core::metrics::LLM_ROUTE_EVENTS;
    let mock = MockLlm::start().await.unwrap();
    let openai = std::sync::Arc::new(OpenAiClient::new(
        &format!("{}/v1", mock.url),
        "gpt-4o-flex-test",
        Some("k".into()),
        Duration::from_secs(5),
    ));
    let route = "openai:gpt-4o-flex-test";
    let f = Fallback::new([vec![RouteClient::new(route.into(), openai.clone(), None, true)], vec![], vec![]]);
    let flex = LlmRequest { tier: Tier::Flex, ..request() };
    let asked = |i: usize| mock.seen()[i].body["service_tier"].as_str().map(str::to_owned);
    let events = |e: &str| LLM_ROUTE_EVENTS.with_label_values(&["interactive", route, e]).get();

    mock.script([Scripted::FlexUnavailable]);
    let refused = f.complete(&flex).await.unwrap();
    assert_eq!(refused.tier, Tier::Sync, "answered at sync after the refusal");
    assert_eq!((asked(0).as_deref(), asked(1)), (Some("flex"), None));
    assert_eq!(events("flex_refused"), 1);

    let served = f.complete(&flex).await.unwrap();
    assert_eq!((served.tier, asked(2).as_deref()), (Tier::Flex, Some("flex")));
    let prices = lanes_core::llm::price::prices();
    let (at_flex, at_sync) = (
        prices.cost(&served.model, served.usage, served.tier).unwrap(),
        prices.cost(&served.model, served.usage, Tier::Sync).unwrap(),
    );
    assert!((at_flex * 2.0 - at_sync).abs() < 1e-12, "flex is charged half: {at_flex} vs {at_sync}");

    mock.without_flex("gpt-4o-flex-test");
    let unsupported = f.complete(&flex).await.unwrap();
    assert_eq!(unsupported.tier, Tier::Sync);
    assert_eq!((asked(3).as_deref(), asked(4)), (Some("flex"), None));
    assert_eq!(events("flex_unsupported"), 1);
    f.complete(&flex).await.unwrap();
    assert_eq!((mock.seen().len(), asked(5)), (6, None), "the route no longer asks for flex");

    // A route that does not offer flex is called at sync, and the client alone sends what it is told.
    let plain =
        Fallback::new([vec![RouteClient::new("p".into(), openai.clone(), None, false)], vec![], vec![]]);
    assert_eq!(plain.complete(&flex).await.unwrap().tier, Tier::Sync);
    assert_eq!(asked(6), None);

    // A refusal of a flex call that does not name the tier: asked again at sync, whose refusal is
    // the answer; the route keeps asking for flex.
    let other = Fallback::new([vec![RouteClient::new("o".into(), openai, None, true)], vec![], vec![]]);
    mock.script([Scripted::Status(400, vec![]), Scripted::Status(400, vec![])]);
    assert!(matches!(other.complete(&flex).await, Err(LlmError::Permanent(_))));
    assert_eq!((asked(7).as_deref(), asked(8)), (Some("flex"), None));
    other.complete(&flex).await.unwrap();
    assert_eq!(asked(9).as_deref(), Some("flex"));
}

/// Tier refusals are decided by the client from the answer: a 429 that is a rate limit stays a
/// throttle on a flex call; only a refusal naming the tier says the model has no flex.
#[tokio::test]
async fn on_a_flex_call_only_the_refusals_of_the_tier_are_tier_refusals() {
    use lanes_core::domain::tier::Tier;
    let mock = MockLlm::start().await.unwrap();
    let client =
        OpenAiClient::new(&format!("{}/v1", mock.url), "gpt-4o", Some("k".into()), Duration::from_secs(5));
    let flex = LlmRequest { tier: Tier::Flex, ..request() };
    mock.script([
        Scripted::Status(429, vec![("retry-after", "1".into())]),
        Scripted::Status(400, vec![]),
        Scripted::FlexUnavailable,
    ]);
    assert!(matches!(client.complete(&flex).await, Err(LlmError::Throttled { .. })));
    // A refusal that does not name the tier is asked again at sync (whose answer is final) and does
    // not turn flex off.
    assert!(matches!(client.complete(&flex).await, Err(LlmError::TierRefused { unsupported: false, .. })));
    assert!(matches!(client.complete(&flex).await, Err(LlmError::TierRefused { unsupported: false, .. })));
    // The same refusal on a sync call (which never happens) is an ordinary throttle.
    mock.script([Scripted::FlexUnavailable]);
    assert!(matches!(client.complete(&request()).await, Err(LlmError::Throttled { .. })));
    // What a retry would answer at sync (a 5xx, a timeout) is flex failing, answered at sync at once
    // rather than retried at flex on the task's attempts.
    let impatient = OpenAiClient::new(
        &format!("{}/v1", mock.url),
        "gpt-4o",
        Some("k".into()),
        Duration::from_millis(300),
    );
    mock.script([Scripted::Status(503, vec![]), Scripted::Slow(Duration::from_secs(2))]);
    assert!(matches!(client.complete(&flex).await, Err(LlmError::TierRefused { unsupported: false, .. })));
    assert!(matches!(impatient.complete(&flex).await, Err(LlmError::TierRefused { unsupported: false, .. })));
    mock.script([Scripted::Status(503, vec![])]);
    assert!(matches!(client.complete(&request()).await, Err(LlmError::Retryable { .. })));
}

/// A priority call asks for `service_tier: "priority"` and is charged the tier the answer names,
/// at the model's priority price; a model without a known priority price has an unknown cost, never
/// the list price. Converse takes `serviceTier: priority` the same way.
#[tokio::test]
async fn priority_is_asked_for_and_charged_at_its_premium() {
    use lanes_core::domain::tier::Tier;
    use lanes_core::llm::route::{Fallback, RouteClient};
    let mock = MockLlm::start().await.unwrap();
    let prices = lanes_core::llm::price::prices();
    for (model, known) in [("gpt-5-mini", true), ("gpt-4o", false)] {
        let client =
            OpenAiClient::new(&format!("{}/v1", mock.url), model, Some("k".into()), Duration::from_secs(5));
        let f = Fallback::new([
            vec![RouteClient::new("r".into(), std::sync::Arc::new(client), None, true)],
            vec![],
            vec![],
        ]);
        let r = f.complete(&LlmRequest { tier: Tier::Priority, ..request() }).await.unwrap();
        assert_eq!(r.tier, Tier::Priority);
        assert_eq!(mock.seen().last().unwrap().body["service_tier"], "priority");
        let (at_priority, at_sync) =
            (prices.cost(&r.model, r.usage, r.tier), prices.cost(&r.model, r.usage, Tier::Sync).unwrap());
        match (known, at_priority) {
            (true, Some(p)) => assert!(p > at_sync, "{model}: a premium, {p} against {at_sync}"),
            (false, None) => {}
            other => panic!("{model}: {other:?}"),
        }
    }
}

/// Through `lanes dev`: a synthesis task that gives `params.deadline_s` is called at flex on a flex
/// route and its result says so, at half the price; one refused for capacity is answered at sync
/// with no attempt spent; a task without a deadline is called at sync.
#[tokio::test]
async fn a_task_with_a_deadline_is_served_at_flex_and_a_refusal_costs_it_no_attempt() {
    use lanes_tests::{Backend, Stack};
    let mock = MockLlm::start().await.unwrap();
    let env = [
        ("LANES_LLM_ROUTES_SYNTHESIS", format!("openai:gpt-4o+tiers@{}/v1", mock.url)),
        ("OPENAI_API_KEY", "k".to_owned()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec();
    let stack = Stack::start_with_env(Backend::Embedded, &[], env).await;
    let url = stack.server.url.clone();
    let run = |prompt: &str, params: serde_json::Value| {
        let body = serde_json::json!({"project_id": "p1", "kind": "scaffold", "prompt": prompt,
            "target_files": [], "params": params});
        let url = url.clone();
        async move {
            let (status, _, v) = lanes_tests::post_task(&url, &body.to_string()).await;
            assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{v}");
            let id = v["task_id"].as_str().unwrap().to_owned();
            lanes_tests::wait_status(&url, &id, "COMPLETED", Duration::from_secs(30)).await
        }
    };
    let asked = |i: usize| mock.seen()[i].body["service_tier"].as_str().map(str::to_owned);
    let patient = serde_json::json!({"deadline_s": 3600});
    let flex = run("a module", patient.clone()).await;
    assert_eq!(
        (flex["result"]["tier"].as_str(), asked(0).as_deref()),
        (Some("flex"), Some("flex")),
        "{flex}"
    );
    let sync = run("a module", serde_json::Value::Null).await;
    assert_eq!((sync["result"]["tier"].as_str(), asked(1)), (Some("sync"), None), "{sync}");
    let (at_flex, at_sync) =
        (flex["result"]["cost_usd"].as_f64().unwrap(), sync["result"]["cost_usd"].as_f64().unwrap());
    assert!((at_flex * 2.0 - at_sync).abs() < 1e-12, "flex {at_flex} against sync {at_sync}");
    // Cost is counted by lane, route, model and the tier that served the call.
    let spent = |tier: &str| {
        format!(
            "lanes_llm_cost_usd_total{{lane=\"synthesis\",model=\"gpt-4o\",route=\"openai:gpt-4o\",tier=\"{tier}\"}}"
        )
    };
    let (by_flex, by_sync) =
        (stack.server.metric(&spent("flex")).await, stack.server.metric(&spent("sync")).await);
    assert!((by_flex - at_flex).abs() < 1e-12 && (by_sync - at_sync).abs() < 1e-12, "{by_flex} {by_sync}");
    mock.script([Scripted::FlexUnavailable]);
    let refused = run("another module", patient).await;
    assert_eq!((asked(2).as_deref(), asked(3)), (Some("flex"), None), "refused at flex, asked again at sync");
    assert_eq!(
        (refused["result"]["tier"].as_str(), refused["attempts"].as_u64()),
        (Some("sync"), Some(0)),
        "{refused}"
    );
}

mod bedrock_and_secrets {
    use super::*;
    use lanes_core::adapters::bedrock::BedrockClient;
    use lanes_core::adapters::{AwsSettings, sdk_config};
    use lanes_tests::MotoServer;

    async fn client(mock: &MockLlm) -> BedrockClient {
        let settings = AwsSettings {
            endpoint: Some(mock.url.clone()),
            region: Some("us-east-1".into()),
            static_credentials: Some(("AKIDTEST".into(), "secret".into())),
        };
        BedrockClient::new(&sdk_config(&settings).await, "anthropic.claude-test-v1:0")
    }

    #[tokio::test]
    async fn converse_against_a_recorded_response_on_loopback() {
        let mock = MockLlm::start().await.unwrap();
        let r = client(&mock).await.complete(&request()).await.unwrap();
        assert_eq!(r.text, "main parses the command line, reads the config and starts the HTTP server.");
        assert_eq!((r.usage.prompt, r.usage.completion), (41, 15));
        let seen = mock.seen();
        assert_eq!(seen[0].path, "/converse");
        assert!(
            seen[0].headers["authorization"].to_str().unwrap().starts_with("AWS4-HMAC-SHA256"),
            "SigV4-signed"
        );
        assert_eq!(seen[0].body["inferenceConfig"]["maxTokens"], 64);
        assert!(seen[0].body["system"][0]["text"].as_str().unwrap().starts_with("Explain"));
        assert!(seen[0].body["messages"][0]["content"][0]["text"].as_str().unwrap().contains("src/main.rs"));
    }

    /// A flex call carries Converse's `serviceTier`, and the answer's tier is the one Bedrock says
    /// served it; flex capacity running out (503) is a tier refusal, a throttle stays a throttle.
    #[tokio::test]
    async fn converse_asks_for_flex_and_reads_the_tier_that_served_it() {
        use lanes_core::domain::tier::Tier;
        let mock = MockLlm::start().await.unwrap();
        let c = client(&mock).await;
        let flex = LlmRequest { tier: Tier::Flex, ..request() };
        assert_eq!(c.complete(&flex).await.unwrap().tier, Tier::Flex);
        assert_eq!(mock.seen()[0].body["serviceTier"]["type"], "flex");
        assert_eq!(c.complete(&request()).await.unwrap().tier, Tier::Sync);
        assert!(mock.seen()[1].body.get("serviceTier").is_none());
        let priority = LlmRequest { tier: Tier::Priority, ..request() };
        assert_eq!(c.complete(&priority).await.unwrap().tier, Tier::Priority);
        assert_eq!(mock.seen()[2].body["serviceTier"]["type"], "priority");
        mock.script([Scripted::Status(503, vec![]), Scripted::Status(429, vec![])]);
        assert!(matches!(c.complete(&flex).await, Err(LlmError::TierRefused { unsupported: false, .. })));
        assert!(matches!(c.complete(&flex).await, Err(LlmError::Throttled { .. })));
    }

    /// ConverseStream, framed in the AWS event stream encoding as Bedrock sends it: the text
    /// deltas come to the sink as they arrive and make the answer Converse gives, with its usage,
    /// stop reason and tier from the stream's `messageStop` and `metadata` events.
    #[tokio::test]
    async fn converse_stream_gives_text_deltas_and_the_same_answer_as_converse() {
        use lanes_core::domain::tier::Tier;
        let mock = MockLlm::start().await.unwrap();
        let c = client(&mock).await;
        let sink = Collect::default();
        let flex = LlmRequest { tier: Tier::Flex, ..request() };
        let streamed = c.stream(&flex, &sink).await.unwrap();
        let whole = c.complete(&flex).await.unwrap();
        assert_eq!(streamed, whole, "the same answer as without streaming");
        let pieces = sink.pieces.lock().unwrap().clone();
        assert!(pieces.len() >= 4, "{pieces:?}");
        assert_eq!(pieces.concat(), whole.text);
        assert_eq!((streamed.usage.prompt, streamed.usage.completion, streamed.tier), (41, 15, Tier::Flex));
        let seen = mock.seen();
        assert_eq!(seen[0].path, "/converse-stream");
        assert!(seen[0].headers["authorization"].to_str().unwrap().starts_with("AWS4-HMAC-SHA256"));
        assert_eq!(seen[0].body["serviceTier"]["type"], "flex");
    }

    /// Converse and ConverseStream continue a saved prefix as prefill: the assistant turn ends the
    /// conversation without its trailing space, the cap is what is left, and both give the whole
    /// answer, billed for the rest only.
    #[tokio::test]
    async fn converse_continues_a_saved_prefix_as_prefill_streamed_or_not() {
        let mock = MockLlm::start().await.unwrap();
        let c = lanes_core::llm::Continuing::new(std::sync::Arc::new(client(&mock).await), true);
        let prefix = lanes_core::domain::model_call::Prefix { text: "main parses the ".into(), tokens: 3 };
        let continued = LlmRequest { prefix: Some(prefix), ..request() };
        let whole = "main parses the command line, reads the config and starts the HTTP server.";
        let sink = Collect::default();
        let streamed = c.stream(&continued, &sink).await.unwrap();
        let answered = c.complete(&continued).await.unwrap();
        for r in [&streamed, &answered] {
            assert_eq!((r.text.as_str(), r.continued, r.usage.completion), (whole, 3, 12));
        }
        assert_eq!(sink.pieces.lock().unwrap().concat(), whole);
        for seen in mock.seen() {
            let turn = &seen.body["messages"][1];
            assert_eq!(
                (turn["role"].as_str(), turn["content"][0]["text"].as_str()),
                (Some("assistant"), Some("main parses the"))
            );
            assert_eq!(seen.body["inferenceConfig"]["maxTokens"], 61);
        }
    }

    /// A ConverseStream cut before its `messageStop` is no answer: a retryable failure, and the
    /// retry layer calls again with the text restarted. A throttle before the stream is a throttle.
    #[tokio::test]
    async fn a_cut_converse_stream_is_retried_and_a_throttle_is_a_throttle() {
        let mock = MockLlm::start().await.unwrap();
        let c = client(&mock).await;
        mock.script([Scripted::StreamCut(String::new(), 4)]);
        let bare = Collect::default();
        let e = c.stream(&request(), &bare).await.unwrap_err();
        assert!(matches!(e, LlmError::Retryable { .. }), "{e:?}");
        assert!(!bare.pieces.lock().unwrap().is_empty(), "it had begun");
        mock.script([Scripted::Status(429, vec![])]);
        assert!(matches!(c.stream(&request(), &bare).await, Err(LlmError::Throttled { .. })));

        mock.script([Scripted::StreamCut(String::new(), 4)]);
        let sink = Collect::default();
        let r = Retrying::new(c, fast()).stream(&request(), &sink).await.unwrap();
        assert_eq!(sink.pieces.lock().unwrap().concat(), r.text, "only the second call's text");
        assert_eq!(sink.restarts.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn bedrock_errors_carry_retry_intent_and_are_retried_once_by_us() {
        let mock = MockLlm::start().await.unwrap();
        mock.script([Scripted::Status(429, vec![]), Scripted::Status(400, vec![])]);
        let c = client(&mock).await;
        assert!(
            matches!(c.complete(&request()).await, Err(LlmError::Throttled { message, .. }) if message.contains("ThrottlingException"))
        );
        assert!(
            matches!(c.complete(&request()).await, Err(LlmError::Permanent(m)) if m.contains("ValidationException"))
        );
        assert_eq!(mock.seen().len(), 2, "the SDK's own retries are off: one request per call");
        mock.script([Scripted::Status(503, vec![])]);
        let retrying = Retrying::new(c, fast());
        assert_eq!(retrying.complete(&request()).await.unwrap().usage.completion, 15);
        assert_eq!(mock.seen().len(), 4);
    }

    #[tokio::test]
    async fn api_keys_come_from_secrets_manager() {
        const VAR: &str = "LANES_LLM_API_KEY_SECRET";
        let moto = MotoServer::start();
        let sdk = sdk_config(&moto.aws_settings()).await;
        let sm = aws_sdk_secretsmanager::Client::new(&sdk);
        sm.create_secret().name("lanes/openai").secret_string("sk-plain").send().await.unwrap();
        sm.create_secret()
            .name("lanes/anthropic")
            .secret_string(r#"{"api_key":"sk-json"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(
            lanes_core::adapters::secrets::fetch_secret_field(&sm, "lanes/openai", VAR, None).await.unwrap(),
            "sk-plain"
        );
        assert_eq!(
            lanes_core::adapters::secrets::fetch_secret_field(&sm, "lanes/anthropic", VAR, None)
                .await
                .unwrap(),
            "sk-json"
        );
        // Routes of several vendors: each vendor's key from its own field, never another's.
        use lanes_core::adapters::secrets::fetch_secret_field;
        sm.create_secret()
            .name("lanes/both")
            .secret_string(r#"{"openai_api_key":"sk-o","anthropic_api_key":"sk-a"}"#)
            .send()
            .await
            .unwrap();
        let var = VAR;
        assert_eq!(
            fetch_secret_field(&sm, "lanes/both", var, Some("anthropic_api_key")).await.unwrap(),
            "sk-a"
        );
        assert_eq!(fetch_secret_field(&sm, "lanes/both", var, Some("openai_api_key")).await.unwrap(), "sk-o");
        for (secret, why) in [("lanes/anthropic", "openai_api_key"), ("lanes/openai", "per vendor")] {
            let e =
                fetch_secret_field(&sm, secret, var, Some("openai_api_key")).await.unwrap_err().to_string();
            assert!(e.contains(why), "{secret}: {e}");
        }
        let missing = lanes_core::adapters::secrets::fetch_secret_field(&sm, "lanes/none", VAR, None)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("LANES_LLM_API_KEY_SECRET") && missing.contains("ResourceNotFound"),
            "{missing}"
        );
    }

    /// A secret is read by ARN as by name, and an empty one is refused, named by its variable.
    #[tokio::test]
    async fn a_secret_is_read_by_arn_and_an_empty_one_is_refused() {
        use lanes_core::adapters::secrets::fetch_secret_field;
        let moto = MotoServer::start();
        let sm = lanes_core::adapters::requests::secrets(&sdk_config(&moto.aws_settings()).await);
        let arn = moto.create_secret("hook/github", "gh-secret").await.unwrap();
        assert_eq!(fetch_secret_field(&sm, &arn, "LANES_A", None).await.unwrap(), "gh-secret");
        moto.create_secret("hook/empty", r#"{"api_key":""}"#).await.unwrap();
        let err = fetch_secret_field(&sm, "hook/empty", "LANES_B", None).await.unwrap_err().to_string();
        assert!(err.contains("LANES_B") && err.contains("empty"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_429_and_500_storm_every_call_finishes_with_bounded_jittered_attempts() {
    let mock = MockLlm::start().await.unwrap();
    // Thirty failures spread over ten concurrent calls: 429s with a short hint, bare 500s and 503s.
    mock.script((0..30).map(|i| match i % 3 {
        0 => Scripted::Status(429, vec![("retry-after-ms", "30".into())]),
        1 => Scripted::Status(500, vec![]),
        _ => Scripted::Status(503, vec![]),
    }));
    let policy = RetryPolicy { max_attempts: 10, ..fast() };
    let client = std::sync::Arc::new(Retrying::new(
        OpenAiClient::new(&format!("{}/v1", mock.url), "m", None, Duration::from_secs(5)),
        policy,
    ));
    let mut handles = Vec::new();
    for _ in 0..10 {
        let client = client.clone();
        handles.push(tokio::spawn(async move { client.complete(&request()).await }));
    }
    for h in handles {
        assert_eq!(h.await.unwrap().unwrap().text, "mock answer", "every call finishes");
    }
    assert_eq!(mock.seen().len(), 40, "each failure retried once, no extra requests");
}

/// What a stream gave: its pieces since the last restart, and the restarts.
#[derive(Default)]
struct Collect {
    pieces: std::sync::Mutex<Vec<String>>,
    restarts: std::sync::Mutex<Vec<String>>,
}

impl lanes_core::ports::DeltaSink for Collect {
    fn delta(&self, text: &str) {
        self.pieces.lock().unwrap().push(text.to_owned());
    }
    fn restart(&self, reason: &str) {
        self.pieces.lock().unwrap().clear();
        self.restarts.lock().unwrap().push(reason.to_owned());
    }
}

/// `stream: true` in OpenAI's documented chunk shape: the pieces make the answer, the usage comes
/// from the last chunk (`stream_options.include_usage`), and the request asked for both.
#[tokio::test]
async fn openai_streams_pieces_and_reads_the_usage_from_the_last_chunk() {
    let mock = MockLlm::start().await.unwrap();
    let text = "one two three four five six seven eight nine ten eleven twelve";
    mock.script([Scripted::Answer(text.into())]);
    let client = OpenAiClient::new(&format!("{}/v1", mock.url), "gpt-test", None, Duration::from_secs(5));
    let sink = Collect::default();
    let r = client.stream(&request(), &sink).await.unwrap();
    assert_eq!(r.text, text);
    let pieces = sink.pieces.lock().unwrap().clone();
    assert!(pieces.len() >= 4, "{pieces:?}");
    assert_eq!(pieces.concat(), text);
    assert_eq!((r.usage.prompt, r.usage.completion), (10, 16), "usage from the last chunk");
    let seen = &mock.seen()[0].body;
    assert_eq!(
        (seen["stream"].as_bool(), seen["stream_options"]["include_usage"].as_bool()),
        (Some(true), Some(true))
    );
}

/// A stream cut before its `[DONE]` is never taken as the answer: the retry layer calls again and
/// tells the sink the text restarts, so the pieces after the restart are the whole answer.
#[tokio::test]
async fn a_cut_stream_is_retried_and_its_text_restarts() {
    let mock = MockLlm::start().await.unwrap();
    mock.script([Scripted::StreamCut("half of an answer that never ends".into(), 3)]);
    let client = OpenAiClient::new(&format!("{}/v1", mock.url), "gpt-test", None, Duration::from_secs(5));
    let bare = Collect::default();
    let e = client.stream(&request(), &bare).await.unwrap_err();
    assert!(matches!(e, LlmError::Retryable { .. }), "{e:?}");
    assert!(!bare.pieces.lock().unwrap().is_empty(), "it had begun");

    mock.script([Scripted::StreamCut("half of an answer that never ends".into(), 3)]);
    let retrying = Retrying::new(client, fast());
    let sink = Collect::default();
    let r = retrying.stream(&request(), &sink).await.unwrap();
    assert_eq!(r.text, "mock answer");
    assert_eq!(sink.pieces.lock().unwrap().concat(), "mock answer", "only the second call's text");
    assert_eq!(sink.restarts.lock().unwrap().len(), 1);
    assert!(!sink.restarts.lock().unwrap()[0].contains("never ends"), "no provider text in the reason");
}

/// A stream that stops mid-answer and stays open is a stall, not an end: past the client's stall
/// limit (its timeout, at most 30 s) the call fails as retryable, long before the provider would
/// close it, and the retry layer calls again with the text restarted.
#[tokio::test]
async fn a_stalled_stream_fails_at_the_stall_limit_and_is_retried() {
    let mock = MockLlm::start().await.unwrap();
    let stall = || Scripted::StreamStall("an answer that stops and waits".into(), 3, Duration::from_secs(20));
    mock.script([stall()]);
    let client = OpenAiClient::new(&format!("{}/v1", mock.url), "gpt-test", None, Duration::from_millis(800));
    let bare = Collect::default();
    let started = std::time::Instant::now();
    let e = client.stream(&request(), &bare).await.unwrap_err();
    assert!(matches!(e, LlmError::Retryable { .. }), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "ended at the stall limit, not the provider's close"
    );
    assert!(!bare.pieces.lock().unwrap().is_empty(), "it had begun");

    mock.script([stall()]);
    let sink = Collect::default();
    let r = Retrying::new(client, fast()).stream(&request(), &sink).await.unwrap();
    assert_eq!(r.text, "mock answer");
    assert_eq!(sink.pieces.lock().unwrap().concat(), "mock answer", "only the second call's text");
    assert_eq!(sink.restarts.lock().unwrap().len(), 1);
}

/// A 429 before the first byte of a stream is a wait: the sink hears the retry's reason before any
/// text (the worker's stream says `retrying`, nothing being void), and the retry's stream is the
/// whole answer.
#[tokio::test]
async fn a_429_before_the_first_byte_is_retried_without_a_restart() {
    let mock = MockLlm::start().await.unwrap();
    mock.script([Scripted::Status(429, vec![("retry-after-ms", "30".into())])]);
    let client = OpenAiClient::new(&format!("{}/v1", mock.url), "gpt-test", None, Duration::from_secs(5));
    let sink = Collect::default();
    let r = Retrying::new(client, fast()).stream(&request(), &sink).await.unwrap();
    assert_eq!(r.text, "mock answer");
    assert_eq!(sink.pieces.lock().unwrap().concat(), "mock answer");
    assert_eq!(sink.restarts.lock().unwrap().clone(), ["the provider is rate limiting; calling again"]);
    assert_eq!(mock.seen().len(), 2, "the 429, then the answer");
}

/// The Messages API's documented stream: text from the `content_block_delta`s, the input usage from
/// `message_start` and the output usage and stop reason from `message_delta`.
#[tokio::test]
async fn anthropic_streams_text_deltas_and_reads_the_usage_from_its_events() {
    let mock = MockLlm::start().await.unwrap();
    let client = AnthropicClient::new(&mock.url, "claude-test", "key".into(), Duration::from_secs(5));
    let sink = Collect::default();
    let r = client.stream(&request(), &sink).await.unwrap();
    let whole = client.complete(&request()).await.unwrap();
    assert_eq!(r, whole, "the same answer as without streaming");
    assert_eq!(sink.pieces.lock().unwrap().clone(), ["mock ", "answer"]);
    assert_eq!(mock.seen()[0].body["stream"], true);
}

/// A lost run's saved text, as a takeover sends it: "mock " (a space at its end, as text cut
/// mid-stream often is) of 1 token.
fn continuing() -> LlmRequest {
    let prefix = lanes_core::domain::model_call::Prefix { text: "mock ".into(), tokens: 1 };
    LlmRequest { lane: Lane::Synthesis, kind: Kind::Scaffold, prefix: Some(prefix), ..request() }
}

/// Anthropic continues a prefix as prefill: the assistant turn ends the conversation without its
/// trailing space (which the API refuses), the cap is what is left, the stream gives the prefix
/// and then the rest, and only the rest is billed as completion.
#[tokio::test]
async fn anthropic_continues_a_saved_prefix_as_prefill_and_bills_only_the_rest() {
    let mock = MockLlm::start().await.unwrap();
    let client = AnthropicClient::new(&mock.url, "claude-test", "key".into(), Duration::from_secs(5));
    let client = lanes_core::llm::Continuing::new(std::sync::Arc::new(client), true);
    let sink = Collect::default();
    let r = client.stream(&continuing(), &sink).await.unwrap();
    assert_eq!((r.text.as_str(), r.continued, r.usage.completion), ("mock answer", 1, 1));
    assert_eq!(sink.pieces.lock().unwrap().concat(), "mock answer");
    let body = &mock.seen()[0].body;
    assert_eq!(body["messages"][1], serde_json::json!({"role": "assistant", "content": "mock"}));
    assert_eq!(body["max_tokens"], 63);
}

/// A model that takes no prefill refuses the continued call with a 400: it is made again whole,
/// once, the sink told to restart, and the route is not asked to continue again.
#[tokio::test]
async fn a_model_that_refuses_prefill_answers_whole_and_is_not_asked_again() {
    let mock = MockLlm::start().await.unwrap();
    mock.refuse_prefill(true);
    let client = AnthropicClient::new(&mock.url, "claude-test", "key".into(), Duration::from_secs(5));
    let client = lanes_core::llm::Continuing::new(std::sync::Arc::new(client), true);
    let sink = Collect::default();
    let r = client.stream(&continuing(), &sink).await.unwrap();
    assert_eq!((r.text.as_str(), r.continued, r.usage.completion), ("mock answer", 0, 2));
    assert_eq!(sink.pieces.lock().unwrap().concat(), "mock answer");
    assert_eq!(sink.restarts.lock().unwrap().len(), 1);
    client.complete(&continuing()).await.unwrap();
    let continued: Vec<usize> =
        mock.seen().iter().map(|s| s.body["messages"].as_array().unwrap().len()).collect();
    assert_eq!(continued, [2, 1, 1], "continued once, then whole");
}

/// An OpenAI-compatible server configured to continue (vLLM's `continue_final_message`): the saved
/// text is a final assistant message, continued rather than answered.
#[tokio::test]
async fn an_openai_compatible_server_continues_a_final_assistant_message() {
    let mock = MockLlm::start().await.unwrap();
    let chat = OpenAiClient::new(&format!("{}/v1", mock.url), "qwen", None, Duration::from_secs(5));
    let client = lanes_core::llm::Continuing::new(std::sync::Arc::new(chat), true);
    let r = client.complete(&continuing()).await.unwrap();
    assert_eq!((r.text.as_str(), r.continued, r.usage.completion), ("mock answer", 1, 1));
    let body = &mock.seen()[0].body;
    assert_eq!(body["messages"][2], serde_json::json!({"role": "assistant", "content": "mock"}));
    assert_eq!(
        (body["continue_final_message"].clone(), body["add_generation_prompt"].clone()),
        (true.into(), false.into())
    );
    assert_eq!(body["max_tokens"], 63);
}
