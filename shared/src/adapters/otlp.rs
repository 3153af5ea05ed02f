//! OTLP trace export for local runs (`lanes dev` and the other CLI commands), off by default: with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, every span (the
//! ingress request with its `task_id`, each message's `task` span, …) is also sent to that collector
//! as OTLP over HTTP with protobuf, batched. In Lambda, traces go to X-Ray instead (`Tracing:
//! Active` and the `AWSTraceHeader` that follows a task, see `crate::trace`).
//!
//! Why the exporter is built on a thread of its own: its HTTP client is blocking (the batch
//! processor sends from its own thread, where no async runtime runs), and a blocking client may not
//! be made, or dropped, inside the async runtime the CLI runs in.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// Why OTLP export could not start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OtlpError(String);

/// Keeps the exporter; dropping it flushes what is still batched (off the async runtime).
pub struct Guard(Option<SdkTracerProvider>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            let _ = std::thread::spawn(move || provider.shutdown()).join();
        }
    }
}

/// The tracing layer that exports spans, and its guard, when an OTLP endpoint is configured.
pub fn from_env<S>() -> Result<Option<(impl tracing_subscriber::Layer<S>, Guard)>, OtlpError>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let configured = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|e| !e.is_empty()));
    if !configured {
        return Ok(None);
    }
    let provider = std::thread::spawn(|| {
        // The endpoint, headers and timeout come from the standard OTEL_EXPORTER_OTLP_* variables.
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|e| OtlpError(e.to_string()))?;
        let resource = opentelemetry_sdk::Resource::builder().with_service_name("lanes").build();
        Ok::<_, OtlpError>(
            SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build(),
        )
    })
    .join()
    .map_err(|_| OtlpError("the exporter thread panicked".into()))??;
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("lanes"));
    Ok(Some((layer, Guard(Some(provider)))))
}

/// Human-readable logs for the CLI, level from `RUST_LOG` (default `info`); with the `otlp` feature
/// (the CLI's) and `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, spans
/// are also exported as OTLP traces. Keep the returned guard until exit: dropping
/// it flushes the spans not yet sent.
pub fn init_cli_tracing() -> Option<Guard> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let otlp = match from_env() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("lanes: OTLP export off: {e}");
            None
        }
    };
    let (layer, guard) = match otlp {
        Some((layer, guard)) => (Some(layer), Some(guard)),
        None => (None, None),
    };
    let _ = tracing_subscriber::registry().with(filter).with(fmt).with(layer).try_init();
    guard
}
