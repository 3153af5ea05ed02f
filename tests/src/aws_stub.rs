//! A loopback stub of the AWS JSON protocols (SQS's `AmazonSQS.*`, DynamoDB's `DynamoDB_20120810.*`)
//! for the behaviours moto does not emulate: documented error shapes (a lost receipt answered as
//! `InvalidParameterValue`, throttling) and partial results. It answers each operation from a script
//! (used once, in order) and then with a default, and records every request it got. moto stays the
//! main integration tier; this covers only what moto lacks.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// One scripted answer: status, JSON body, extra headers.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// JSON body.
    pub body: String,
    /// Extra headers (e.g. `x-amzn-query-error`).
    pub headers: Vec<(&'static str, String)>,
    /// Only for a request whose JSON at this pointer equals this value (concurrent requests of one
    /// operation arrive in any order).
    pub when: Option<(String, serde_json::Value)>,
}

impl Answer {
    /// A success with this JSON body.
    pub fn ok(body: &str) -> Self {
        Self { status: 200, body: body.to_owned(), headers: Vec::new(), when: None }
    }

    /// This answer only for a request whose JSON at `pointer` (RFC 6901) is `value`.
    pub fn when(mut self, pointer: &str, value: serde_json::Value) -> Self {
        self.when = Some((pointer.to_owned(), value));
        self
    }

    /// An SQS error as the JSON protocol documents it: `__type` with the service's namespace and the
    /// query-compatible code header the SDKs read.
    pub fn sqs_error(status: u16, code: &str, message: &str) -> Self {
        Self {
            status,
            body: serde_json::json!({"__type": format!("com.amazonaws.sqs#{code}"), "message": message})
                .to_string(),
            headers: vec![("x-amzn-query-error", format!("{code};Sender"))],
            when: None,
        }
    }
}

impl Answer {
    /// A DynamoDB error as JSON 1.0 documents it: `__type` with the API version's namespace.
    pub fn dynamodb_error(status: u16, code: &str, message: &str) -> Self {
        Self {
            status,
            body: serde_json::json!({"__type": format!("com.amazonaws.dynamodb.v20120810#{code}"), "message": message})
                .to_string(),
            headers: Vec::new(),
            when: None,
        }
    }
}

#[derive(Default)]
struct StubState {
    scripts: HashMap<String, VecDeque<Answer>>,
    seen: Vec<(String, serde_json::Value)>,
}

/// The running stub.
pub struct AwsStub {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    state: Arc<Mutex<StubState>>,
    task: tokio::task::JoinHandle<()>,
}

impl AwsStub {
    /// Starts on a free loopback port.
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(StubState::default()));
        let app = axum::Router::new().route("/", axum::routing::post(answer)).with_state(state.clone());
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
        let url = format!("http://{}", listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}")));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, state, task }
    }

    /// Settings for the SDK clients to reach the stub.
    pub fn aws_settings(&self) -> lanes_core::adapters::AwsSettings {
        lanes_core::adapters::AwsSettings {
            endpoint: Some(self.url.clone()),
            region: Some("us-east-1".into()),
            static_credentials: Some(("testing".into(), "testing".into())),
        }
    }

    /// Queues answers for `operation` (e.g. `ChangeMessageVisibility`), used once each, in order.
    pub fn script(&self, operation: &str, answers: impl IntoIterator<Item = Answer>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.scripts.entry(operation.to_owned()).or_default().extend(answers);
    }

    /// The operations received, in order, with their JSON bodies.
    pub fn seen(&self) -> Vec<(String, serde_json::Value)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).seen.clone()
    }

    /// How many requests for `operation` arrived.
    pub fn count(&self, operation: &str) -> usize {
        self.seen().iter().filter(|(op, _)| op == operation).count()
    }

    /// The JSON bodies of the requests for `operation`, in order.
    pub fn bodies(&self, operation: &str) -> Vec<serde_json::Value> {
        self.seen().into_iter().filter(|(op, _)| op == operation).map(|(_, b)| b).collect()
    }
}

impl Drop for AwsStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(state): State<Arc<Mutex<StubState>>>, headers: HeaderMap, body: Bytes) -> Response {
    let target = headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or("");
    let operation = target.rsplit('.').next().unwrap_or("").to_owned();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    let scripted = {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        let answer = s.scripts.get_mut(&operation).and_then(|q| {
            let i = q.iter().position(|a| match &a.when {
                None => true,
                Some((pointer, value)) => json.pointer(pointer) == Some(value),
            })?;
            q.remove(i)
        });
        s.seen.push((operation.clone(), json));
        answer
    };
    let a = scripted.unwrap_or_else(|| match operation.as_str() {
        "GetQueueAttributes" => Answer::ok(r#"{"Attributes":{}}"#),
        _ => Answer::ok("{}"),
    });
    let mut resp = (
        StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [("content-type", "application/x-amz-json-1.0")],
        a.body,
    )
        .into_response();
    for (k, v) in a.headers {
        if let Ok(v) = v.parse() {
            resp.headers_mut().insert(k, v);
        }
    }
    resp
}
