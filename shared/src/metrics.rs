//! Metrics: one Prometheus registry per process with the per-lane series of design §6, rendered as
//! Prometheus text at `/metrics` locally.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Requests the adapters make to AWS services (SQS, DynamoDB, ElastiCache Redis), by service and
/// operation; SDK-internal retries are not included.
/// Process-wide because the adapters are built before, and outlive, any one [`Metrics`].
pub static AWS_REQUESTS: std::sync::LazyLock<IntCounterVec> = std::sync::LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new("lanes_aws_requests_total", "AWS requests by service and operation"),
        &["service", "operation"],
    )
    .unwrap_or_else(|e| panic!("lanes_aws_requests_total: {e}"))
});

/// Counts one AWS request.
pub fn aws_request(service: &str, operation: &str) {
    AWS_REQUESTS.with_label_values(&[service, operation]).inc();
}

/// Every metric the core records.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Visible messages per lane.
    pub queue_depth: IntGaugeVec,
    /// Received, not yet acknowledged, per lane.
    pub queue_in_flight: IntGaugeVec,
    /// Age of the oldest message per lane.
    pub queue_oldest_age_seconds: IntGaugeVec,
    /// Submission to completion, per lane.
    pub task_latency_seconds: HistogramVec,
    /// Submission to claim, per lane.
    pub task_wait_seconds: HistogramVec,
    /// Claim to completion, per lane.
    pub task_run_seconds: HistogramVec,
    /// Provider calls by lane and status (`ok`, `retryable`, `permanent`).
    pub llm_requests_total: IntCounterVec,
    /// Tokens by lane and type (`prompt`, `completion`).
    pub llm_tokens_total: IntCounterVec,
    /// Duplicate submissions answered without new work, by stage (`cache`, `store`).
    pub duplicates_total: IntCounterVec,
    /// Heartbeat renewals, by lane.
    pub lease_renewals_total: IntCounterVec,
    /// Leases lost while working, by lane.
    pub leases_lost_total: IntCounterVec,
    /// Final writes rejected by the fence, by lane.
    pub stale_writes_rejected_total: IntCounterVec,
    /// Messages handed back because another worker held the lock, by lane.
    pub lock_contended_total: IntCounterVec,
    /// Messages moved to a DLQ, by lane and reason (`undecodable`, `attempts`).
    pub dead_lettered_total: IntCounterVec,
    /// Webhook deliveries by host and result (`accepted`, `duplicate`, `ping`, `ignored`, `unauthorized`).
    pub webhook_deliveries_total: IntCounterVec,
    /// Operations done without an accelerator (lock or cache unreachable), by component.
    pub degraded_operations_total: IntCounterVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

const LATENCY_BUCKETS: [f64; 14] =
    [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0];

impl Metrics {
    /// A fresh registry with every series registered.
    pub fn new() -> Self {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| {
            let g =
                IntGaugeVec::new(Opts::new(name, help), &["lane"]).unwrap_or_else(|e| panic!("{name}: {e}"));
            registry.register(Box::new(g.clone())).unwrap_or_else(|e| panic!("{name}: {e}"));
            g
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c =
                IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| panic!("{name}: {e}"));
            registry.register(Box::new(c.clone())).unwrap_or_else(|e| panic!("{name}: {e}"));
            c
        };
        let histogram = |name: &str, help: &str| {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
                &["lane"],
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            registry.register(Box::new(h.clone())).unwrap_or_else(|e| panic!("{name}: {e}"));
            h
        };
        let metrics = Self {
            queue_depth: gauge("lanes_queue_depth", "Visible messages in the lane's queue"),
            queue_in_flight: gauge("lanes_queue_in_flight", "Received, unacknowledged messages"),
            queue_oldest_age_seconds: gauge("lanes_queue_oldest_age_seconds", "Age of the oldest message"),
            task_latency_seconds: histogram("lanes_task_latency_seconds", "Submission to completion"),
            task_wait_seconds: histogram("lanes_task_wait_seconds", "Submission to claim"),
            task_run_seconds: histogram("lanes_task_run_seconds", "Claim to completion"),
            llm_requests_total: counter(
                "lanes_llm_requests_total",
                "LLM provider calls",
                &["lane", "status"],
            ),
            llm_tokens_total: counter("lanes_llm_tokens_total", "LLM tokens", &["lane", "type"]),
            webhook_deliveries_total: counter(
                "lanes_webhook_deliveries_total",
                "Webhook deliveries by host and result",
                &["provider", "result"],
            ),
            duplicates_total: counter("lanes_duplicates_total", "Duplicate submissions", &["stage"]),
            lease_renewals_total: counter("lanes_lease_renewals_total", "Heartbeat renewals", &["lane"]),
            leases_lost_total: counter("lanes_leases_lost_total", "Leases lost mid-task", &["lane"]),
            stale_writes_rejected_total: counter(
                "lanes_stale_writes_rejected_total",
                "Final writes rejected by the fence",
                &["lane"],
            ),
            lock_contended_total: counter(
                "lanes_lock_contended_total",
                "Messages handed back because the lock was held elsewhere",
                &["lane"],
            ),
            dead_lettered_total: counter(
                "lanes_dead_lettered_total",
                "Messages moved to a DLQ",
                &["lane", "reason"],
            ),
            degraded_operations_total: counter(
                "lanes_degraded_operations_total",
                "Operations done without an unreachable accelerator",
                &["component"],
            ),
            registry,
        };
        if let Err(e) = metrics.registry.register(Box::new(AWS_REQUESTS.clone())) {
            tracing::warn!(error = %e, "could not register lanes_aws_requests_total");
        }
        // Every lane's series exists from the start, at zero, so dashboards and alarms see them.
        for lane in crate::domain::Lane::ALL {
            let l = lane.as_str();
            metrics.queue_depth.with_label_values(&[l]);
            metrics.queue_in_flight.with_label_values(&[l]);
            metrics.task_latency_seconds.with_label_values(&[l]);
            for status in ["ok", "retryable", "permanent"] {
                metrics.llm_requests_total.with_label_values(&[l, status]);
            }
        }
        metrics
    }

    /// Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "metrics encoding failed");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
