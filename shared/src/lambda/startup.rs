//! Cold-start assembly of the Lambda functions: logging, which backend a function runs on, the
//! adapters and routers built from the environment (ingress, webhook), tenancy from API Gateway's
//! authorizer, the trace header and EMF metrics around the HTTP functions, and the errors a cold
//! start can end in.

use crate::clock::{SharedClock, SystemClock};
use crate::commits::api::{self, SummariesApi};
use crate::commits::webhook::Webhook;
use crate::config::IngressConfig;
use crate::config::{ConfigError, require_env};
use crate::domain::Lane;
use crate::metrics::Metrics;
use crate::tasks::events::Delivery;
use crate::tasks::ingress::{Ingress, router};
use crate::tasks::tenant::{Tenancy, Tenant};
use crate::wiring::{Adapters, AwsBackendConfig};
use std::sync::Arc;

/// Logs as [`log_settings`] says (JSON with the function's log level in Lambda), with every span's
/// fields (`task_id`, `message_id`, `lane`) on each line, so one task's lines can be found together.
pub fn init_tracing() {
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
    let (filter, json) =
        log_settings(var("AWS_LAMBDA_LOG_LEVEL"), var("RUST_LOG"), var("AWS_LAMBDA_LOG_FORMAT"));
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // With a timestamp: Lambda's level filtering reads `timestamp` and `level` from JSON lines.
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

/// The log filter and whether lines are JSON, from Lambda's logging controls: the function's
/// `LoggingConfig.ApplicationLogLevel` reaches the runtime as `AWS_LAMBDA_LOG_LEVEL` and wins (so
/// an operator changes the level on the function, without a variable), then `RUST_LOG` (a full
/// filter, for local runs), then `info`. `LoggingConfig.LogFormat` arrives as `AWS_LAMBDA_LOG_FORMAT`:
/// `Text` gives plain lines, anything else JSON (what Lambda's level filtering reads). DEBUG and
/// TRACE apply to this crate only (the SDK's own debug lines would print request bodies). Keep
/// `ApplicationLogLevel` at INFO or below: Lambda drops lines under it, and the EMF metric lines,
/// which carry no level, count as INFO.
pub fn log_settings(
    lambda_level: Option<String>,
    rust_log: Option<String>,
    lambda_format: Option<String>,
) -> (String, bool) {
    let level = lambda_level.map(|l| match l.to_ascii_uppercase().as_str() {
        "TRACE" => "info,lanes_core=trace".to_owned(),
        "DEBUG" => "info,lanes_core=debug".to_owned(),
        "WARN" => "warn".to_owned(),
        "ERROR" | "FATAL" => "error".to_owned(),
        _ => "info".to_owned(),
    });
    let filter = level.or(rust_log).unwrap_or_else(|| "info".to_owned());
    let json = !lambda_format.is_some_and(|f| f.eq_ignore_ascii_case("text"));
    (filter, json)
}

/// Which adapters a function runs on, from `LANES_BACKEND`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Embedded adapters in `LANES_DATA_DIR` (default `/tmp/lanes`): for `cargo lambda watch` runs.
    Embedded {
        /// Data dir.
        data_dir: std::path::PathBuf,
    },
    /// SQS, DynamoDB and Redis.
    Aws,
}

impl Backend {
    /// Reads `LANES_BACKEND` (`embedded` or `aws`, default `aws`) and `LANES_DATA_DIR`.
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var("LANES_BACKEND").unwrap_or_else(|_| "aws".into()).as_str() {
            "embedded" => Ok(Backend::Embedded {
                data_dir: std::env::var("LANES_DATA_DIR").unwrap_or_else(|_| "/tmp/lanes".into()).into(),
            }),
            "aws" => Ok(Backend::Aws),
            other => Err(ConfigError::Invalid {
                name: "LANES_BACKEND",
                reason: format!("`{other}`; expected `embedded` or `aws`"),
            }),
        }
    }
}

/// The error a function gives at cold start when it needs something this build does not have yet.
pub fn not_built_yet(function: &str, missing: &str) -> ConfigError {
    ConfigError::Invalid {
        name: "function",
        reason: format!("the {function} function needs {missing}, not built yet"),
    }
}

/// The webhook function's router, from the environment: the `commits` queue and the store of the
/// backend, and the secrets ([`crate::wiring::webhook_config`]). Refuses to start with no secret configured,
/// since it could then accept nothing; a configured one that cannot be read is logged as an error and
/// answers `503` until it can.
pub async fn webhook_from_env() -> Result<axum::Router, ColdStartError> {
    let config = crate::wiring::webhook_config()?;
    if config.github_secret.is_none() && config.gitlab_token.is_none() && config.owner_secrets.is_none() {
        return Err(ConfigError::Missing(
            "LANES_GITHUB_WEBHOOK_SECRET(_ID), LANES_GITLAB_WEBHOOK_TOKEN(_ID) or LANES_WEBHOOK_OWNER_SECRETS(_ID)",
        )
        .into());
    }
    let adapters = adapters_from_env("webhook", &[]).await?;
    let metrics = Metrics::new();
    metrics.enable_emf();
    let router = crate::commits::webhook::router(Webhook {
        queue: adapters.send[Lane::Commits.index()].clone(),
        store: adapters.summaries,
        metrics: metrics.clone(),
        clock: Arc::new(SystemClock),
        config,
    });
    Ok(with_emf(super::deadline::with_deadline(crate::problem::framework_rejections(router)), metrics))
}

/// The CloudWatch namespace of the EMF metrics: `LANES_METRICS_NAMESPACE` (default `Lanes`).
pub fn metrics_namespace() -> String {
    crate::config::optional_env("LANES_METRICS_NAMESPACE").unwrap_or_else(|| "Lanes".into())
}

/// Metrics that flush as EMF after each request (for the HTTP functions).
pub(super) fn with_emf(router: axum::Router, metrics: Metrics) -> axum::Router {
    let namespace = metrics_namespace();
    router.layer(axum::middleware::map_response(move |resp: axum::response::Response| {
        metrics.flush_emf(&namespace);
        async move { resp }
    }))
}

/// Reads the worker's lane from `LANES_LANE`.
pub fn lane_from_env() -> Result<Lane, ConfigError> {
    require_env("LANES_LANE")?.parse().map_err(|reason| ConfigError::Invalid { name: "LANES_LANE", reason })
}

/// Errors at cold start.
#[derive(Debug, thiserror::Error)]
pub enum ColdStartError {
    /// Configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Adapters.
    #[error(transparent)]
    Wiring(#[from] crate::wiring::WiringError),
}

pub(super) async fn adapters_from_env(function: &str, consume: &[Lane]) -> Result<Adapters, ColdStartError> {
    match Backend::from_env()? {
        Backend::Aws => Ok(crate::wiring::aws(&AwsBackendConfig::for_functions()?, consume).await?),
        Backend::Embedded { data_dir } => {
            tracing::info!(function, data_dir = %data_dir.display(), "embedded backend");
            let clock: SharedClock = Arc::new(SystemClock);
            Ok(crate::wiring::embedded(&data_dir, Default::default(), clock).await?.0)
        }
    }
}

/// What an ingress function serves, from `LANES_INGRESS_RESPONSE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressMode {
    /// `buffered` (the default), behind API Gateway's HTTP API, which returns a Lambda's answer
    /// whole: the whole task API, the event stream in buffered parts.
    Api,
    /// `stream`, behind a function URL in `RESPONSE_STREAM` mode: the event stream alone, written
    /// as it comes (docs/ARCHITECTURE.md, Streaming answers).
    Stream,
}

impl IngressMode {
    /// Reads `LANES_INGRESS_RESPONSE`: `buffered` or `stream`.
    pub fn from_env() -> Result<Self, ConfigError> {
        match crate::config::optional_env("LANES_INGRESS_RESPONSE").as_deref() {
            None | Some("buffered") => Ok(Self::Api),
            Some("stream") => Ok(Self::Stream),
            Some(other) => Err(ConfigError::Invalid {
                name: "LANES_INGRESS_RESPONSE",
                reason: format!("`{other}`; expected buffered or stream"),
            }),
        }
    }
}

/// The ingress function's router in `mode`, from the environment (`LANES_BACKEND`, then the
/// backend's variables).
pub async fn ingress_from_env(mode: IngressMode) -> Result<axum::Router, ColdStartError> {
    let adapters = adapters_from_env("ingress", &[]).await?;
    let tenancy = tenancy_from_env()?;
    let metrics = Metrics::new();
    metrics.enable_emf();
    let mut config = IngressConfig { tenancy: tenancy.is_on(), ..IngressConfig::from_env()? };
    // A new task holds USD at its lane's dearest route, priced as the workers price it.
    config.quota = crate::quota::priced_by_routes(config.quota)?;
    let ingress = Ingress {
        store: adapters.store,
        cache: adapters.cache.clone(),
        queues: adapters.send,
        admission: adapters.admission,
        metrics: metrics.clone(),
        clock: Arc::new(SystemClock),
        config,
        objects: adapters.objects,
        events: Some(adapters.events),
    };
    let tasks = match mode {
        IngressMode::Stream => crate::tasks::events::router(ingress, Delivery::Streamed),
        IngressMode::Api => {
            let read = api::router(SummariesApi {
                summaries: adapters.summaries,
                cache: adapters.cache,
                readers: crate::wiring::summary_readers(tenancy.is_on())?,
            });
            let events = crate::tasks::events::router(ingress.clone(), Delivery::Buffered);
            router(ingress).merge(events).merge(crate::openapi::routes()).merge(read)
        }
    };
    let tasks = crate::problem::framework_rejections(tasks);
    Ok(with_emf(super::deadline::with_deadline(with_trace(with_tenancy(tasks, tenancy))), metrics))
}

/// Scopes each request to its invocation's X-Ray trace header (Lambda's `Context.xray_trace_id`,
/// present when the function has `Tracing: Active`), so the tasks it enqueues carry it
/// ([`crate::trace`]).
pub fn with_trace(router: axum::Router) -> axum::Router {
    router.layer(axum::middleware::from_fn(
        |req: axum::extract::Request, next: axum::middleware::Next| async move {
            let header = req.extensions().get::<lambda_http::Context>().and_then(|c| c.xray_trace_id.clone());
            crate::trace::scope(header, next.run(req)).await
        },
    ))
}

/// Tenancy in Lambda: the authorizer's JWT claim `LANES_TENANT_CLAIM` (default `sub`) or the IAM
/// caller, by role or, with `LANES_IAM_TENANT=session`, by session; `LANES_TENANCY=off` turns it
/// off (for an API behind no authorizer, e.g. emulated). Any other `LANES_TENANCY` keeps it on.
pub fn tenancy_from_env() -> Result<Tenancy, ConfigError> {
    if crate::config::optional_env("LANES_TENANCY").as_deref() == Some("off") {
        return Ok(Tenancy::Off);
    }
    let iam_session = match crate::config::optional_env("LANES_IAM_TENANT").as_deref() {
        None | Some("role") => false,
        Some("session") => true,
        Some(other) => {
            let reason = format!("`{other}`; expected role or session");
            return Err(ConfigError::Invalid { name: "LANES_IAM_TENANT", reason });
        }
    };
    let claim = crate::config::optional_env("LANES_TENANT_CLAIM").unwrap_or_else(|| "sub".into());
    Ok(Tenancy::Authorizer { claim, iam_session })
}

/// The task router with the tenant taken from API Gateway's authorizer, when tenancy is on.
pub fn with_tenancy(tasks: axum::Router, tenancy: Tenancy) -> axum::Router {
    match tenancy {
        Tenancy::Authorizer { claim, iam_session } => tasks.layer(axum::middleware::from_fn_with_state(
            (Arc::<str>::from(claim), iam_session),
            tenant_from_authorizer,
        )),
        _ => tasks,
    }
}

/// The caller API Gateway (HTTP API, payload 2.0) authenticated: the JWT claim, else the IAM
/// caller (its role's ARN, or by session: [`Tenant::from_session`]). Nothing else can set the
/// [`Tenant`]: one already in the request is dropped.
pub(super) async fn tenant_from_authorizer(
    axum::extract::State((claim, iam_session)): axum::extract::State<(Arc<str>, bool)>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use lambda_http::request::RequestContext;
    let tenant = match req.extensions().get::<RequestContext>() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.authorizer.as_ref().and_then(|a| {
            let jwt =
                a.jwt.as_ref().and_then(|j| j.claims.get(&*claim)).and_then(|c| Tenant::from_identity(c));
            jwt.or_else(|| {
                let iam = a.iam.as_ref()?;
                let arn = iam.user_arn.as_deref()?;
                if !iam_session {
                    return Tenant::from_principal(arn);
                }
                let cognito = iam.cognito_identity.as_ref();
                let cognito =
                    cognito.and_then(|c| Some((c.identity_pool_id.as_deref()?, c.identity_id.as_deref()?)));
                Tenant::from_session(arn, cognito)
            })
        }),
        _ => None,
    };
    req.extensions_mut().remove::<Tenant>();
    if let Some(t) = tenant {
        req.extensions_mut().insert(t);
    }
    next.run(req).await
}

pub(super) fn parse_env(name: &'static str, default: u64) -> Result<u64, ConfigError> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| ConfigError::Invalid { name, reason: format!("`{v}` is not a whole number") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{SharedClock, SystemClock};
    use crate::config::IngressConfig;
    use crate::domain::Lane;
    use crate::lambda::*;
    use crate::lease::Outcome;
    use crate::metrics::Metrics;
    use crate::tasks::ingress::{Ingress, router};
    use crate::tasks::tenant::Tenancy;
    use aws_lambda_events::event::sqs::SqsMessage;
    use std::sync::Arc;
    use std::time::Duration;

    /// Lambda's invocation context (its X-Ray trace id) becomes the request's trace scope; an SQS
    /// record's `AWSTraceHeader` system attribute reaches the worker's attributes.
    #[tokio::test]
    async fn the_trace_header_goes_from_the_invocation_to_the_queue_and_back() {
        use tower::ServiceExt;
        let h = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let app = with_trace(
            axum::Router::new()
                .route("/", axum::routing::get(|| async { crate::trace::current().unwrap_or_default() })),
        );
        let mut ctx = lambda_http::Context::default();
        ctx.xray_trace_id = Some(h.to_owned());
        let mut req = axum::http::Request::get("/").body(axum::body::Body::empty()).unwrap();
        req.extensions_mut().insert(ctx);
        let resp = app.clone().oneshot(req).await.unwrap();
        let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
        assert_eq!(body, h.as_bytes());

        let mut record: SqsMessage =
            serde_json::from_str(include_str!("../../../events/sqs-interactive.json"))
                .map(|e: aws_lambda_events::event::sqs::SqsEvent| e.records[0].clone())
                .unwrap();
        record.attributes.insert("AWSTraceHeader".into(), h.into());
        let m = received_from_sqs(&record).unwrap();
        assert_eq!(m.attributes[crate::trace::TRACE_HEADER], h);
    }

    #[test]
    fn lambda_logging_controls_win_over_rust_log() {
        let s = |v: &str| Some(v.to_owned());
        assert_eq!(
            log_settings(s("DEBUG"), s("warn"), s("JSON")),
            ("info,lanes_core=debug".to_owned(), true)
        );
        assert_eq!(log_settings(s("FATAL"), None, None), ("error".to_owned(), true));
        assert_eq!(
            log_settings(None, s("lanes_core=trace"), s("Text")),
            ("lanes_core=trace".to_owned(), false)
        );
        assert_eq!(log_settings(None, None, None), ("info".to_owned(), true));
    }

    #[test]
    fn deadline_is_absolute_in_lambda_and_relative_in_the_emulator() {
        let now = 1_796_000_000_000;
        assert_eq!(remaining_time(now + 30_000, now), Duration::from_secs(30));
        assert_eq!(remaining_time(now - 1, now), Duration::ZERO);
        assert_eq!(remaining_time(600_000, now), Duration::from_secs(600));
    }

    /// A task API with tenancy on, over the embedded backend in `dir`, with an in-process event log
    /// when `events`.
    async fn tenant_ingress(dir: &std::path::Path, events: bool) -> Ingress {
        use crate::embedded::{EmbeddedDb, EmbeddedQueues, EmbeddedStore, MemoryCache, MemoryEvents};
        let clock: SharedClock = Arc::new(SystemClock);
        let db = EmbeddedDb::open(dir).unwrap();
        let all = EmbeddedQueues::open(db.clone(), clock.clone(), Default::default()).await.unwrap();
        let store = EmbeddedStore::new(db);
        let queues = Lane::ALL.map(|l| all.queue(l.as_str(), "dlq"));
        Ingress {
            objects: None,
            events: events
                .then(|| Arc::new(MemoryEvents::new(clock.clone())) as Arc<dyn crate::ports::EventLog>),
            admission: Arc::new(crate::embedded::EmbeddedAdmission::new(store.clone(), queues.clone())),
            store: Arc::new(store),
            cache: Arc::new(MemoryCache::new(clock.clone())),
            queues: queues.map(|q| Arc::new(q) as Arc<dyn crate::ports::QueueSend>),
            metrics: Metrics::new(),
            clock,
            config: IngressConfig { tenancy: true, ..Default::default() },
        }
    }

    /// API Gateway HTTP API events (payload 2.0, the documented shape) through lambda_http's own
    /// conversion: the JWT claim, else the IAM principal, is the tenant; a header cannot forge one.
    #[tokio::test]
    async fn the_tenant_is_the_authorizers_caller() {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let tasks = router(tenant_ingress(dir.path(), false).await);
        let app = with_tenancy(tasks, Tenancy::Authorizer { claim: "sub".into(), iam_session: false });
        let event = |method: &str, path: &str, authorizer: serde_json::Value| {
            let mut e: serde_json::Value =
                serde_json::from_str(include_str!("../../../events/api-post-task.json")).unwrap();
            e["routeKey"] = "ANY /v1/{proxy+}".into();
            e["rawPath"] = path.into();
            e["requestContext"]["http"]["method"] = method.into();
            e["requestContext"]["http"]["path"] = path.into();
            e["requestContext"]["authorizer"] = authorizer;
            e["headers"]["x-lanes-tenant"] = "forged".into();
            let req: lambda_http::request::LambdaRequest = serde_json::from_value(e).unwrap();
            let (parts, body) = lambda_http::Request::from(req).into_parts();
            axum::extract::Request::from_parts(parts, axum::body::Body::from(body.to_vec()))
        };
        let jwt = |sub: &str| serde_json::json!({"jwt": {"claims": {"sub": sub, "iss": "https://issuer"}, "scopes": null}});
        let iam = serde_json::json!({"iam": {"accessKey": "AKIA", "accountId": "123456789012", "callerId": "AIDA",
            "principalOrgId": null, "userArn": "arn:aws:iam::123456789012:user/ci", "userId": "AIDA"}});
        let call = |req| async { app.clone().oneshot(req).await.unwrap() };
        let body = |resp: axum::response::Response| async {
            let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        };
        let a = call(event("POST", "/v1/tasks", jwt("user-a"))).await;
        assert_eq!(a.status(), axum::http::StatusCode::ACCEPTED);
        let id = body(a).await["task_id"].as_str().unwrap().to_owned();
        let b = call(event("POST", "/v1/tasks", jwt("user-b"))).await;
        assert_ne!(body(b).await["task_id"].as_str().unwrap(), id);
        let path = format!("/v1/tasks/{id}");
        let mut get = event("GET", &path, jwt("user-a"));
        *get.body_mut() = axum::body::Body::empty();
        assert_eq!(call(get).await.status(), axum::http::StatusCode::ACCEPTED);
        assert_eq!(
            call(event("GET", &path, jwt("user-b"))).await.status(),
            axum::http::StatusCode::NOT_FOUND
        );
        assert_eq!(call(event("GET", &path, iam)).await.status(), axum::http::StatusCode::NOT_FOUND);
        assert_eq!(
            call(event("GET", &path, serde_json::Value::Null)).await.status(),
            axum::http::StatusCode::UNAUTHORIZED
        );
    }

    /// A function URL's IAM caller (`events/function-url-task-events.json`, the documented payload)
    /// is the tenant the task API's IAM authorizer names: the streamed route serves that tenant's
    /// task, and answers another role's call `404` as `GET` does.
    #[tokio::test]
    async fn the_function_urls_iam_caller_is_the_task_apis_tenant() {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().unwrap();
        let ingress = tenant_ingress(dir.path(), true).await;
        let tenancy = Tenancy::Authorizer { claim: "sub".into(), iam_session: false };
        let api = with_tenancy(router(ingress.clone()), tenancy.clone());
        let stream = with_tenancy(crate::tasks::events::router(ingress, Delivery::Streamed), tenancy);
        let request = |e: serde_json::Value| {
            let req: lambda_http::request::LambdaRequest = serde_json::from_value(e).unwrap();
            let (parts, body) = lambda_http::Request::from(req).into_parts();
            axum::extract::Request::from_parts(parts, axum::body::Body::from(body.to_vec()))
        };
        // The task, posted through the HTTP API by another session of the same role.
        let mut post: serde_json::Value =
            serde_json::from_str(include_str!("../../../events/api-post-task.json")).unwrap();
        post["requestContext"]["authorizer"] = serde_json::json!({"iam": {"accessKey": "ASIA",
            "accountId": "123456789012", "callerId": "AROA:other", "principalOrgId": null,
            "userArn": "arn:aws:sts::123456789012:assumed-role/ci/other-session", "userId": "AROA:other"}});
        let accepted = api.oneshot(request(post)).await.unwrap();
        assert_eq!(accepted.status(), axum::http::StatusCode::ACCEPTED);
        let bytes = http_body_util::BodyExt::collect(accepted.into_body()).await.unwrap().to_bytes();
        let id = serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()["task_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let events = |user_arn: &str| {
            let mut e: serde_json::Value =
                serde_json::from_str(include_str!("../../../events/function-url-task-events.json")).unwrap();
            let path = format!("/v1/tasks/{id}/events");
            e["rawPath"] = path.clone().into();
            e["requestContext"]["http"]["path"] = path.into();
            e["requestContext"]["authorizer"]["iam"]["userArn"] = user_arn.into();
            request(e)
        };
        let own =
            stream.clone().oneshot(events("arn:aws:sts::123456789012:assumed-role/ci/ci-session")).await;
        let own = own.unwrap();
        assert_eq!(own.status(), axum::http::StatusCode::OK);
        assert_eq!(own.headers()["content-type"], "text/event-stream");
        let other =
            stream.oneshot(events("arn:aws:sts::123456789012:assumed-role/intruder/s")).await.unwrap();
        assert_eq!(other.status(), axum::http::StatusCode::NOT_FOUND);
    }

    #[test]
    fn queue_age_comes_from_the_records_sent_timestamps() {
        let sample: aws_lambda_events::event::sqs::SqsEvent =
            serde_json::from_str(include_str!("../../../events/sqs-interactive.json")).unwrap();
        let sent: u64 = sample.records[0].attributes["SentTimestamp"].parse().unwrap();
        assert_eq!(oldest_age_ms(&sample.records, sent + 42_000), Some(42_000));
        let mut late = sample.records[0].clone();
        late.attributes.insert("SentTimestamp".into(), (sent + 40_000).to_string());
        assert_eq!(
            oldest_age_ms(&[late, sample.records[0].clone()], sent + 42_000),
            Some(42_000),
            "the oldest"
        );
        assert_eq!(oldest_age_ms(&[SqsMessage::default()], sent), None);
    }

    #[test]
    fn records_and_batch_failures() {
        let mut record = SqsMessage::default();
        assert_eq!(received_from_sqs(&record), Err(RecordError::Missing("messageId")));
        record.message_id = Some("m 1".into());
        assert!(
            matches!(received_from_sqs(&record), Err(RecordError::BadId(_))),
            "an id no response could name"
        );
        record.message_id = Some("m1".into());
        record.receipt_handle = Some("r1".into());
        record.body = Some("{}".into());
        record.attributes.insert("ApproximateReceiveCount".into(), "3".into());
        let m = received_from_sqs(&record).unwrap();
        assert_eq!((m.message_id.as_str(), m.receive_count), ("m1", 3));

        let retry = Outcome::Retry { after: Duration::from_secs(1), reason: "x".into() };
        let outcomes =
            [("a", &Outcome::Acked), ("b", &retry), ("c", &Outcome::LeaseLost), ("", &Outcome::LeaseLost)];
        let resp = batch_response(outcomes);
        let sample: aws_lambda_events::event::sqs::SqsEvent =
            serde_json::from_str(include_str!("../../../events/sqs-interactive.json")).unwrap();
        let m = received_from_sqs(&sample.records[0]).unwrap();
        assert_eq!((m.receive_count, m.attributes["lane"].as_str()), (1, "interactive"));
        assert!(serde_json::from_str::<crate::domain::TaskMessage>(&m.body).is_ok());
        let ids: Vec<&str> = resp.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
    }
}
