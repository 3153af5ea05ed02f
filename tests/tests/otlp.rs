//! Optional OTLP export from `lanes dev`: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, the ingress span
//! and each task's span reach an OTLP/HTTP receiver as protobuf, decoded here with the
//! OpenTelemetry project's own message definitions (`opentelemetry-proto`), each carrying the task id.

// Test helpers panic on failure by design: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use axum::body::Bytes;
use axum::http::HeaderMap;
use lanes_tests::{DevServer, submit, wait_status};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Received = Arc<Mutex<Vec<(String, Bytes)>>>;

/// A minimal OTLP/HTTP trace receiver: keeps each request's content type and body.
async fn receiver() -> (String, Received) {
    let got: Received = Arc::default();
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let keep = keep.clone();
            async move {
                let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                keep.lock().unwrap().push((ct, body));
                ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

/// `(span name, task_id attribute)` of every span received.
fn spans(got: &Received) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (ct, body) in got.lock().unwrap().iter() {
        assert_eq!(ct, "application/x-protobuf");
        let req = ExportTraceServiceRequest::decode(body.clone()).unwrap();
        for span in req.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans) {
            let task_id = span.attributes.iter().find(|a| a.key == "task_id").and_then(|a| {
                match a.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                }
            });
            out.push((span.name.clone(), task_id));
        }
    }
    out
}

#[tokio::test]
async fn lanes_dev_exports_its_spans_over_otlp_when_asked() {
    let (endpoint, got) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), endpoint),
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
    ];
    let server = DevServer::start_with_env(dir.path(), &[], env).await;
    let id = submit(&server.url, "explain", "trace me").await;
    wait_status(&server.url, &id, "COMPLETED", Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let seen = spans(&got);
        let has = |name: &str| seen.iter().any(|(n, t)| n == name && t.as_deref() == Some(id.as_str()));
        if has("ingress") && has("task") {
            break;
        }
        assert!(Instant::now() < deadline, "spans received: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
