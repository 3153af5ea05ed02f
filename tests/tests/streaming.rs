//! The event stream of a task (`GET /v1/tasks/{id}/events`) through `lanes dev`, as a client meets
//! it: the offline provider's answer arrives in pieces before the task ends, the pieces make the
//! result's text, a late client gets the result at once, `Last-Event-ID` resumes without a missing
//! or repeated character, a cancel ends the stream with the cancelled task, and bad input is a
//! named problem. On both backends: the embedded twin, and Redis Streams.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use eventsource_stream::Eventsource;
use futures::StreamExt;
use lanes_tests::{Backend, Stack, on_both_backends, submit, wait_status, workspace_bin};
use serde_json::Value;
use std::time::{Duration, Instant};

on_both_backends!(text_arrives_before_the_end_and_makes_the_result, a_cancel_ends_the_stream_with_the_task);

/// One received event: its name, id, data and when it came.
struct Got {
    name: String,
    id: String,
    data: Value,
    at: Instant,
}

/// The task's events until its `result` or `error` (or the server ends the stream).
async fn follow(url: &str, id: &str, last: Option<&str>) -> Vec<Got> {
    // One client for every reader: a client's set-up (its TLS roots) costs milliseconds.
    static CLIENT: std::sync::LazyLock<reqwest::Client> = std::sync::LazyLock::new(reqwest::Client::new);
    let mut req = CLIENT.get(format!("{url}/v1/tasks/{id}/events"));
    if let Some(last) = last {
        req = req.header("Last-Event-ID", last);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200, "{url}/v1/tasks/{id}/events");
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut events = resp.bytes_stream().eventsource();
    let mut out = Vec::new();
    let read = async {
        while let Some(e) = events.next().await {
            let e = e.unwrap();
            let end = e.event == "result" || e.event == "error";
            out.push(Got {
                data: serde_json::from_str(&e.data).unwrap(),
                name: e.event,
                id: e.id,
                at: Instant::now(),
            });
            if end {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read).await.expect("the stream ended in time");
    out
}

/// The text the deltas of the last segment say, restarts applied.
fn said(events: &[Got]) -> String {
    let mut text = String::new();
    for e in events {
        match (e.name.as_str(), e.data["state"].as_str()) {
            ("delta", _) => text.push_str(e.data["text"].as_str().unwrap()),
            ("status", Some("running" | "restarting")) => text.clear(),
            _ => {}
        }
    }
    text
}

async fn text_arrives_before_the_end_and_makes_the_result(backend: Backend) -> Stack {
    let stack = Stack::start(backend, &["--interactive-latency-ms", "1600"]).await;
    let url = &stack.server.url;
    let id = submit(url, "explain", "what does the streaming path do?").await;
    let events = follow(url, &id, None).await;
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    let last = events.last().unwrap();
    assert_eq!(last.name, "result", "{names:?}");
    let text = last.data["result"]["text"].as_str().unwrap();
    assert_eq!(said(&events), text, "the deltas make the result: {names:?}");
    let deltas: Vec<&Got> = events.iter().filter(|e| e.name == "delta").collect();
    assert!(deltas.len() >= 4, "the answer came in pieces: {names:?}");
    assert!(
        last.at.duration_since(deltas[0].at) >= Duration::from_millis(800),
        "the first text came well before the end"
    );
    assert!(events.iter().any(|e| e.data["state"] == "running" && e.data["run"] == 1), "{names:?}");
    assert!(deltas.iter().all(|d| d.data["run"] == 1 && !d.id.is_empty()));

    // A late client gets the result at once, and nothing else.
    let late = follow(url, &id, None).await;
    assert_eq!(late.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["result"]);
    assert_eq!(late[0].data, last.data);

    // A reconnect after the third piece gets the rest: no character missed or repeated.
    let third = &deltas[2];
    let rest = follow(url, &id, Some(&third.id)).await;
    let before: String = deltas[..3].iter().map(|d| d.data["text"].as_str().unwrap()).collect();
    let after: String =
        rest.iter().filter(|e| e.name == "delta").map(|e| e.data["text"].as_str().unwrap()).collect();
    assert_eq!(before + &after, text);
    assert_eq!(rest.last().unwrap().name, "result");

    // `lanes submit --follow` prints the text as it comes, then the task.
    let out = tokio::process::Command::new(workspace_bin("lanes"))
        .args([
            "submit",
            "--url",
            url,
            "--project",
            "p1",
            "--kind",
            "explain",
            "--prompt",
            "follow me",
            "--follow",
        ])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (streamed, view) = stdout.trim_end().rsplit_once('\n').unwrap();
    let view: Value = serde_json::from_str(view.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(streamed.trim_end(), view["result"]["text"].as_str().unwrap().trim_end());
    stack
}

async fn a_cancel_ends_the_stream_with_the_task(backend: Backend) -> Stack {
    let flags = ["--interactive-latency-ms", "20000", "--lease-ttl-ms", "1500"];
    let stack = Stack::start(backend, &flags).await;
    let url = stack.server.url.clone();
    let id = submit(&url, "explain", "a long answer to cancel").await;
    let following = tokio::spawn({
        let (url, id) = (url.clone(), id.clone());
        async move { follow(&url, &id, None).await }
    });
    wait_status(&url, &id, "PROCESSING", Duration::from_secs(10)).await;
    let resp = reqwest::Client::new().delete(format!("{url}/v1/tasks/{id}")).send().await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let events = following.await.unwrap();
    let last = events.last().unwrap();
    assert_eq!((last.name.as_str(), last.data["status"].as_str()), ("error", Some("CANCELLED")));
    stack
}

#[tokio::test]
async fn bad_requests_are_named_problems() {
    let stack = Stack::start(Backend::Embedded, &[]).await;
    let url = &stack.server.url;
    let id = submit(url, "explain", "a task to ask about").await;
    let get = |path: String, last: Option<&'static str>| async move {
        let mut req = reqwest::Client::new().get(path);
        if let Some(l) = last {
            req = req.header("Last-Event-ID", l);
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap_or_default())
    };
    let (status, p) = get(format!("{url}/v1/tasks/{id}/events"), Some("yesterday")).await;
    assert_eq!((status, p["field"].as_str()), (400, Some("Last-Event-ID")), "{p}");
    let (status, p) = get(format!("{url}/v1/tasks/{id}/events?from=0"), None).await;
    assert_eq!((status, p["field"].as_str()), (400, Some("from")), "{p}");
    let (status, _) = get(format!("{url}/v1/tasks/{}/events", "0".repeat(64)), None).await;
    assert_eq!(status, 404);
    let (status, _) = get(format!("{url}/v1/tasks/nope/events"), None).await;
    assert_eq!(status, 400);
}

/// Five hundred clients following one task each get the whole answer, the same text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_clients_follow_one_task() {
    let stack = Stack::start(Backend::Embedded, &["--interactive-latency-ms", "2000"]).await;
    let url = stack.server.url.clone();
    let started = Instant::now();
    let id = submit(&url, "explain", "one task, many readers").await;
    let readers = (0..500).map(|_| {
        let (url, id) = (url.clone(), id.clone());
        tokio::spawn(async move { follow(&url, &id, None).await })
    });
    let all = futures::future::join_all(readers).await;
    let mut streamed = 0;
    let mut texts = std::collections::BTreeSet::new();
    for r in all {
        let events = r.unwrap();
        let last = events.last().unwrap();
        assert_eq!(last.name, "result");
        let text = last.data["result"]["text"].as_str().unwrap().to_owned();
        // A reader that connected after the end got the result alone.
        if events.iter().any(|e| e.name == "delta") {
            assert_eq!(said(&events), text);
            streamed += 1;
        }
        texts.insert(text);
    }
    assert_eq!(texts.len(), 1, "one answer for every reader");
    assert!(streamed >= 250, "most readers saw the text as it came: {streamed} in {:?}", started.elapsed());
}

/// A run killed mid-stream (`kill -9`) is taken over after its lease: a client that reconnects with
/// its `Last-Event-ID` sees the new run's segment (`running` with the next `run`), whose text makes
/// the result. On Redis, where the stream outlives the process.
#[tokio::test]
async fn a_takeover_after_a_crash_starts_a_new_segment() {
    let flags = ["--interactive-latency-ms", "4000", "--lease-ttl-ms", "1500"];
    let mut stack = Stack::start(Backend::Aws, &flags).await;
    let url = stack.server.url.clone();
    let id = submit(&url, "explain", "an answer cut by a crash").await;
    // Read up to the first piece of text, and keep its id.
    let resp = reqwest::get(format!("{url}/v1/tasks/{id}/events")).await.unwrap();
    let mut events = resp.bytes_stream().eventsource();
    let mut last = String::new();
    while let Some(e) = events.next().await {
        let e = e.unwrap();
        if e.event == "delta" {
            last = e.id;
            break;
        }
    }
    assert!(!last.is_empty(), "a first piece came");
    drop(events);
    stack.server.restart().await;
    let rest = follow(&url, &id, Some(&last)).await;
    let end = rest.last().unwrap();
    assert_eq!(end.name, "result");
    let runs: Vec<u64> = rest
        .iter()
        .filter(|e| e.data["state"] == "running")
        .map(|e| e.data["run"].as_u64().unwrap())
        .collect();
    assert_eq!(runs, [2], "the takeover is a new segment");
    assert_eq!(said(&rest), end.data["result"]["text"].as_str().unwrap());
}

/// Five hundred tasks streamed at once, a client following each: every one ends with its result,
/// and the text each client was given is its task's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_tasks_stream_at_once() {
    let stack =
        Stack::start(Backend::Embedded, &["--interactive-latency-ms", "1000", "--capacity", "128"]).await;
    let url = stack.server.url.clone();
    let mut readers = Vec::new();
    for i in 0..500 {
        let id = submit(&url, "explain", &format!("task number {i}")).await;
        let url = url.clone();
        readers.push(tokio::spawn(async move { follow(&url, &id, None).await }));
    }
    let mut streamed = 0;
    for r in futures::future::join_all(readers).await {
        let events = r.unwrap();
        let last = events.last().unwrap();
        assert_eq!(last.name, "result");
        if events.iter().any(|e| e.name == "delta") {
            assert_eq!(said(&events), last.data["result"]["text"].as_str().unwrap());
            streamed += 1;
        }
    }
    assert!(streamed >= 250, "most tasks were followed as they ran: {streamed}");
}
