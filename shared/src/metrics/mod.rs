//! Metrics: one Prometheus registry per process with the per-lane series of docs/ARCHITECTURE.md (Metrics), rendered as
//! Prometheus text at `/metrics` locally, and as CloudWatch Embedded Metric Format documents in Lambda
//! ([`Metrics::emf_documents`], printed after each invocation): counters as deltas since the last
//! flush, latencies as the raw observations (so CloudWatch computes p99 itself). The document
//! format itself is [`emf`]'s.

pub mod emf;
pub mod group_commit;
pub mod tenants;

use emf::emf_group;
pub use emf::{EMF_DIMENSIONS, EMF_GAUGES, emf_name};

use prometheus::{
    CounterVec, Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Requests the adapters make to AWS services (SQS, DynamoDB, Lambda, Bedrock, Secrets Manager,
/// ElastiCache Redis), by service and operation. SDK requests are counted per HTTP attempt, retries
/// included, by `adapters::requests::CountRequests`; Redis commands by the Redis adapter.
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

/// Deliveries handed back to their queue to come again (a retryable failure, or a wait: throttling,
/// a lock held elsewhere, the invocation deadline), by lane and reason kind ([`reason_kind`]).
/// Process-wide because the lease module that hands back has no [`Metrics`] of its own.
pub static HANDED_BACK: std::sync::LazyLock<IntCounterVec> = std::sync::LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new("lanes_handed_back_total", "Deliveries handed back to come again, by lane and reason"),
        &["lane", "reason"],
    )
    .unwrap_or_else(|e| panic!("lanes_handed_back_total: {e}"))
});

/// A reason's kind, for a metric dimension: the text before its first colon (`diff source: 502 Bad
/// Gateway` → `diff_source`), lowercased, as `[a-z0-9_]`, at most 40 characters. Reasons are written
/// `kind: detail` so the detail (an error message) never multiplies the series.
pub fn reason_kind(reason: &str) -> String {
    let head = reason.split(':').next().unwrap_or("").trim().to_ascii_lowercase();
    let mut kind: String =
        head.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).take(40).collect();
    while kind.contains("__") {
        kind = kind.replace("__", "_");
    }
    let kind = kind.trim_matches('_').to_owned();
    if kind.is_empty() { "unspecified".into() } else { kind }
}

/// What happened on each LLM route, by lane, route (`provider:model`) and event: `throttled` (the
/// provider answered 429), `cooldown` (a shared pause started), `fallback` (the request went on to
/// the next route), `limiter_wait` (a call waited for budget). Process-wide because the provider
/// clients are built once per process, before any one [`Metrics`].
pub static LLM_ROUTE_EVENTS: std::sync::LazyLock<IntCounterVec> = std::sync::LazyLock::new(|| {
    IntCounterVec::new(
        Opts::new("lanes_llm_route_events_total", "LLM route events by lane, route and event"),
        &["lane", "route", "event"],
    )
    .unwrap_or_else(|e| panic!("lanes_llm_route_events_total: {e}"))
});

/// Seconds LLM calls waited for limiter budget, by lane and route.
pub static LLM_LIMITER_WAIT: std::sync::LazyLock<CounterVec> = std::sync::LazyLock::new(|| {
    CounterVec::new(
        Opts::new("lanes_llm_limiter_wait_seconds_total", "Seconds spent waiting for LLM rate budget"),
        &["lane", "route"],
    )
    .unwrap_or_else(|e| panic!("lanes_llm_limiter_wait_seconds_total: {e}"))
});

/// Counts one LLM route event.
pub fn llm_route_event(lane: crate::domain::Lane, route: &str, event: &str) {
    LLM_ROUTE_EVENTS.with_label_values(&[lane.as_str(), route, event]).inc();
}

/// The latency histograms, for [`Metrics::observe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    /// Submission to claim.
    Wait,
    /// Claim to completion.
    Run,
    /// Submission to completion.
    Total,
    /// A commit's enqueue to its summary written, by the tier that served its call (labelled `tier`,
    /// not `lane`: the commits lane is the only one).
    Summary,
}

impl Latency {
    /// Every latency series.
    pub const ALL: [Latency; 4] = [Latency::Wait, Latency::Run, Latency::Total, Latency::Summary];

    /// The label its series is split by.
    pub fn label(self) -> &'static str {
        match self {
            Latency::Summary => "tier",
            Latency::Wait | Latency::Run | Latency::Total => "lane",
        }
    }

    /// Its name, in Prometheus (with the `lanes_` prefix) and EMF (without).
    pub fn name(self) -> &'static str {
        match self {
            Latency::Wait => "task_wait_seconds",
            Latency::Run => "task_run_seconds",
            Latency::Total => "task_latency_seconds",
            Latency::Summary => "summary_latency_seconds",
        }
    }
}

/// A raw latency kept for EMF: its metric name, its dimensions, its value.
type Observation = (&'static str, Vec<(String, String)>, f64);

#[derive(Default)]
struct EmfState {
    enabled: bool,
    observations: Vec<Observation>,
    last: std::collections::HashMap<String, f64>,
}

/// Every metric the core records.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    emf: std::sync::Arc<std::sync::Mutex<EmfState>>,
    /// Per-tenant series, top tenants by name and the rest as `other` ([`tenants`]).
    pub tenants: tenants::TenantMetrics,
    /// Visible messages per lane.
    pub queue_depth: IntGaugeVec,
    /// Received, not yet acknowledged, per lane.
    pub queue_in_flight: IntGaugeVec,
    /// Age of the oldest message per lane.
    pub queue_oldest_age_seconds: IntGaugeVec,
    /// Submission to completion, per lane.
    pub task_latency_seconds: HistogramVec,
    /// A commit's enqueue to its summary, per tier.
    pub summary_latency_seconds: HistogramVec,
    /// Submission to claim, per lane.
    pub task_wait_seconds: HistogramVec,
    /// Claim to completion, per lane.
    pub task_run_seconds: HistogramVec,
    /// Provider calls by lane and status (`ok`, `throttled`, `retryable`, `permanent`).
    pub llm_requests_total: IntCounterVec,
    /// Tokens by lane and type (`prompt`, `completion`, and `saved`: completion tokens a takeover
    /// continued from a lost run's saved text instead of paying for them again).
    pub llm_tokens_total: IntCounterVec,
    /// Saves of a run's text so far, by lane and outcome (`saved`, `refused`: the run's fence
    /// moved on, `failed`: the store did not answer).
    pub checkpoints_total: IntCounterVec,
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
    /// Messages moved to a DLQ, by lane and reason (`undecodable`, `attempts`, `permanent`, and
    /// `identity` for a commit whose repository name is not the host's for its id).
    pub dead_lettered_total: IntCounterVec,
    /// Webhook deliveries by host and result (`accepted`, `duplicate`, `ping`, `ignored`, `unauthorized`).
    pub webhook_deliveries_total: IntCounterVec,
    /// Operations done without an accelerator (lock or cache unreachable), by component.
    pub degraded_operations_total: IntCounterVec,
    /// Tasks that ended, by lane and terminal status (`COMPLETED`, `FAILED`, `CANCELLED`).
    pub tasks_finished_total: IntCounterVec,
    /// Deliveries acked because no live record was left for them (expired, or removed after a failed
    /// send), by lane. Should stay at zero: a record outlives its message.
    pub tasks_missing_total: IntCounterVec,
    /// Work put off without using an attempt, by lane and why (`throttled`, `lock`, `quota`,
    /// `store`, `queue`); a deadline's hand-back is counted in `lanes_handed_back_total`.
    pub waits_total: IntCounterVec,
    /// Provider calls abandoned before their answer, by lane and why (`cancelled`, `lease`).
    pub llm_calls_dropped_total: IntCounterVec,
    /// Records the DLQ sweep marked `FAILED`, by lane.
    pub dlq_marked_failed_total: IntCounterVec,
    /// Orphaned `PENDING` tasks sent again, by lane.
    pub resends_total: IntCounterVec,
    /// Tasks cancelled by their clients, by lane.
    pub cancellations_total: IntCounterVec,
    /// What the provider calls cost in USD (the price table's), by lane and the model that answered.
    pub llm_cost_usd_total: CounterVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

const LATENCY_BUCKETS: [f64; 14] =
    [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0];

const SUMMARY_HELP: &str = "A commit's enqueue to its summary written, by the tier that served it";

/// Up to a day: a summary's deadline is hours, and flex calls wait for spare capacity.
const SUMMARY_BUCKETS: [f64; 14] =
    [1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14_400.0, 21_600.0, 86_400.0];

const LANE: &[&str] = &["lane"];
const LANE_STATUS: &[&str] = &["lane", "status"];
const LANE_REASON: &[&str] = &["lane", "reason"];
const LANE_WHY: &[&str] = &["lane", "why"];
const LANE_OUTCOME: &[&str] = &["lane", "outcome"];

/// Makes each series and registers it. A name or label set that the registry refuses is a
/// programming error (they are all constants here), so it panics with the name at start-up.
struct Registrar(Registry);

impl Registrar {
    fn add<C: prometheus::core::Collector + Clone + 'static>(
        &self,
        name: &str,
        made: prometheus::Result<C>,
    ) -> C {
        let c = made.unwrap_or_else(|e| panic!("{name}: {e}"));
        self.0.register(Box::new(c.clone())).unwrap_or_else(|e| panic!("{name}: {e}"));
        c
    }

    fn gauge(&self, name: &str, help: &str) -> IntGaugeVec {
        self.add(name, IntGaugeVec::new(Opts::new(name, help), LANE))
    }

    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(name, IntCounterVec::new(Opts::new(name, help), labels))
    }

    /// `lanes_summary_latency_seconds`, by `tier`, in buckets up to a day.
    fn summary_histogram(&self) -> HistogramVec {
        let opts = HistogramOpts::new("lanes_summary_latency_seconds", SUMMARY_HELP)
            .buckets(SUMMARY_BUCKETS.to_vec());
        self.add("lanes_summary_latency_seconds", HistogramVec::new(opts, &["tier"]))
    }

    fn histogram(&self, name: &str, help: &str) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
        self.add(name, HistogramVec::new(opts, LANE))
    }

    /// A float counter.
    fn cost(&self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        self.add(name, CounterVec::new(Opts::new(name, help), labels))
    }
}

impl Metrics {
    /// A fresh registry with every series registered.
    pub fn new() -> Self {
        let r = Registrar(Registry::new());
        let metrics = Self {
            tenants: tenants::TenantMetrics::new(&r),
            queue_depth: r.gauge("lanes_queue_depth", "Visible messages in the lane's queue"),
            queue_in_flight: r.gauge("lanes_queue_in_flight", "Received, unacknowledged messages"),
            queue_oldest_age_seconds: r.gauge("lanes_queue_oldest_age_seconds", "Age of the oldest message"),
            task_latency_seconds: r.histogram("lanes_task_latency_seconds", "Submission to completion"),
            summary_latency_seconds: r.summary_histogram(),
            task_wait_seconds: r.histogram("lanes_task_wait_seconds", "Submission to claim"),
            task_run_seconds: r.histogram("lanes_task_run_seconds", "Claim to completion"),
            llm_requests_total: r.counter("lanes_llm_requests_total", "LLM provider calls", LANE_STATUS),
            llm_tokens_total: r.counter("lanes_llm_tokens_total", "LLM tokens", &["lane", "type"]),
            checkpoints_total: r.counter("lanes_checkpoints_total", "Saves of run text", LANE_OUTCOME),
            webhook_deliveries_total: r.counter(
                "lanes_webhook_deliveries_total",
                "Webhook deliveries by host and result",
                &["provider", "result"],
            ),
            duplicates_total: r.counter("lanes_duplicates_total", "Duplicate submissions", &["stage"]),
            lease_renewals_total: r.counter("lanes_lease_renewals_total", "Heartbeat renewals", LANE),
            leases_lost_total: r.counter("lanes_leases_lost_total", "Leases lost mid-task", LANE),
            stale_writes_rejected_total: r.counter(
                "lanes_stale_writes_rejected_total",
                "Final writes rejected by the fence",
                LANE,
            ),
            lock_contended_total: r.counter(
                "lanes_lock_contended_total",
                "Messages handed back because the lock was held elsewhere",
                LANE,
            ),
            dead_lettered_total: r.counter(
                "lanes_dead_lettered_total",
                "Messages moved to a DLQ",
                LANE_REASON,
            ),
            degraded_operations_total: r.counter(
                "lanes_degraded_operations_total",
                "Operations done without an unreachable accelerator",
                &["component"],
            ),
            tasks_finished_total: r.counter(
                "lanes_tasks_finished_total",
                "Tasks ended, by terminal status",
                LANE_STATUS,
            ),
            tasks_missing_total: r.counter(
                "lanes_tasks_missing_total",
                "Deliveries acked with no live record",
                LANE,
            ),
            waits_total: r.counter("lanes_waits_total", "Work put off without using an attempt", LANE_WHY),
            llm_calls_dropped_total: r.counter(
                "lanes_llm_calls_dropped_total",
                "Provider calls abandoned before their answer",
                LANE_WHY,
            ),
            dlq_marked_failed_total: r.counter(
                "lanes_dlq_marked_failed_total",
                "Records of dead-lettered messages marked FAILED",
                LANE,
            ),
            resends_total: r.counter("lanes_resends_total", "Orphaned PENDING tasks sent again", LANE),
            cancellations_total: r.counter("lanes_cancellations_total", "Tasks cancelled by clients", LANE),
            llm_cost_usd_total: r.cost(
                "lanes_llm_cost_usd_total",
                "Provider calls' cost in USD, by the route that answered and the tier it served at",
                &["lane", "route", "model", "tier"],
            ),
            registry: r.0,
            emf: Default::default(),
        };
        metrics.register_process_wide();
        metrics.zero_every_lane();
        metrics
    }

    /// The process-wide series (recorded where no `Metrics` is at hand) join this registry.
    fn register_process_wide(&self) {
        let process_wide: [(&str, Box<dyn prometheus::core::Collector>); 7] = [
            ("lanes_aws_requests_total", Box::new(AWS_REQUESTS.clone())),
            ("lanes_llm_route_events_total", Box::new(LLM_ROUTE_EVENTS.clone())),
            ("lanes_handed_back_total", Box::new(HANDED_BACK.clone())),
            ("lanes_llm_limiter_wait_seconds_total", Box::new(LLM_LIMITER_WAIT.clone())),
            ("lanes_embedded_group_commits_total", Box::new(group_commit::GROUP_COMMITS.clone())),
            ("lanes_embedded_group_commit_writes_total", Box::new(group_commit::GROUP_COMMIT_WRITES.clone())),
            ("lanes_embedded_group_commit_seconds", Box::new(group_commit::GROUP_COMMIT_SECONDS.clone())),
        ];
        for (name, collector) in process_wide {
            if let Err(e) = self.registry.register(collector) {
                tracing::warn!(error = %e, "could not register {name}");
            }
        }
    }

    /// Every lane's series exists from the start, at zero, so dashboards and alarms see them.
    fn zero_every_lane(&self) {
        for lane in crate::domain::Lane::ALL {
            let l = lane.as_str();
            self.queue_depth.with_label_values(&[l]);
            self.queue_in_flight.with_label_values(&[l]);
            self.task_latency_seconds.with_label_values(&[l]);
            self.tasks_missing_total.with_label_values(&[l]);
            for status in ["ok", "throttled", "retryable", "permanent"] {
                self.llm_requests_total.with_label_values(&[l, status]);
            }
        }
    }

    /// Records a latency (seconds) for `lane` (the tier, for [`Latency::Summary`]); kept raw for EMF too once
    /// [`Metrics::enable_emf`] ran.
    pub fn observe(&self, which: Latency, lane: &str, seconds: f64) {
        let hist = match which {
            Latency::Wait => &self.task_wait_seconds,
            Latency::Run => &self.task_run_seconds,
            Latency::Total => &self.task_latency_seconds,
            Latency::Summary => &self.summary_latency_seconds,
        };
        hist.with_label_values(&[lane]).observe(seconds);
        if let Ok(mut emf) = self.emf.lock()
            && emf.enabled
        {
            let dims =
                if lane.is_empty() { Vec::new() } else { vec![(which.label().to_owned(), lane.to_owned())] };
            emf.observations.push((which.name(), dims, seconds));
        }
    }

    /// Records a run of `group` claimed `seconds` after its submission, per tenant
    /// ([`tenants::TenantMetrics::waited`]), kept raw for EMF as `tenant_wait_seconds` by lane and
    /// tenant.
    pub fn tenant_waited(&self, lane: &str, group: &str, seconds: f64) {
        let tenant = self.tenants.waited(lane, group, seconds);
        if let Ok(mut emf) = self.emf.lock()
            && emf.enabled
        {
            let dims = vec![("lane".to_owned(), lane.to_owned()), ("tenant".to_owned(), tenant)];
            emf.observations.push(("tenant_wait_seconds", dims, seconds));
        }
    }

    /// Starts keeping what [`Metrics::emf_documents`] reports (Lambda only; locally nobody flushes).
    pub fn enable_emf(&self) {
        if let Ok(mut emf) = self.emf.lock() {
            emf.enabled = true;
        }
    }

    /// CloudWatch Embedded Metric Format documents (one JSON line each) for everything since the
    /// last call, in `namespace`: per lane (dimension `lane`) or without dimensions. Counter names
    /// drop `lanes_` and `_total` and append their other labels (`llm_tokens_total{type="prompt"}` ->
    /// `llm_tokens_prompt`); a counter reports what it grew by. A gauge of [`EMF_GAUGES`] that was ever
    /// set reports its value at the call (unit `Seconds` or `None` for a name ending in `_seconds`
    /// or `_ratio`).
    pub fn emf_documents(&self, namespace: &str, now_ms: u64) -> Vec<String> {
        use std::collections::BTreeMap;
        // dimensions (name, value) -> metric -> (unit, values)
        type Dims = Vec<(String, String)>;
        let mut groups: BTreeMap<Dims, BTreeMap<String, (&'static str, Vec<f64>)>> = BTreeMap::new();
        let Ok(mut emf) = self.emf.lock() else { return Vec::new() };
        for (name, dims, v) in emf.observations.drain(..) {
            groups
                .entry(dims)
                .or_default()
                .entry(name.to_owned())
                .or_insert(("Seconds", Vec::new()))
                .1
                .push(v);
        }
        for family in self.registry.gather() {
            let gauge = match family.get_field_type() {
                prometheus::proto::MetricType::COUNTER => false,
                prometheus::proto::MetricType::GAUGE if EMF_GAUGES.contains(&family.name()) => true,
                _ => continue,
            };
            for m in family.get_metric() {
                let labels: Vec<(&str, &str)> = m.get_label().iter().map(|l| (l.name(), l.value())).collect();
                let name = emf_name(family.name(), &labels);
                let dims: Dims = labels
                    .iter()
                    .filter(|(l, _)| EMF_DIMENSIONS.contains(l))
                    .map(|(l, v)| ((*l).to_owned(), (*v).to_owned()))
                    .collect();
                if gauge {
                    // A gauge is its value at the flush: a sample, not a delta.
                    let unit = emf::emf_gauge_unit(family.name());
                    groups.entry(dims).or_default().insert(name, (unit, vec![m.get_gauge().get_value()]));
                    continue;
                }
                let mut key = family.name().to_owned();
                for (l, v) in &labels {
                    key.push_str(&format!(",{l}={v}"));
                }
                let value = m.get_counter().get_value();
                let before = emf.last.insert(key, value).unwrap_or(0.0);
                if value > before {
                    groups.entry(dims).or_default().insert(name, ("Count", vec![value - before]));
                }
            }
        }
        drop(emf);
        groups.into_iter().flat_map(|(dims, metrics)| emf_group(namespace, now_ms, &dims, metrics)).collect()
    }

    /// Prints [`Metrics::emf_documents`] to stdout, where Lambda's log capture picks them up.
    pub fn flush_emf(&self, namespace: &str) {
        let now = crate::clock::Clock::now_ms(&crate::clock::SystemClock);
        for doc in self.emf_documents(namespace, now) {
            println!("{doc}");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_kinds_are_few_and_safe() {
        assert_eq!(reason_kind("diff source: 502 Bad Gateway from https://x"), "diff_source");
        assert_eq!(reason_kind("invocation deadline"), "invocation_deadline");
        assert_eq!(reason_kind("queue unavailable at lease start"), "queue_unavailable_at_lease_start");
        assert_eq!(reason_kind("model: provider temporarily failed: 503"), "model");
        assert_eq!(reason_kind(""), "unspecified");
        assert_eq!(reason_kind("::"), "unspecified");
        assert!(reason_kind(&"x".repeat(500)).len() <= 40);
    }

    #[test]
    fn emf_documents_carry_deltas_and_raw_latencies() {
        let m = Metrics::new();
        m.enable_emf();
        m.observe(Latency::Total, "interactive", 1.5);
        m.observe(Latency::Total, "interactive", 0.5);
        m.llm_tokens_total.with_label_values(&["interactive", "prompt"]).inc_by(120);
        m.duplicates_total.with_label_values(&["cache"]).inc();
        m.dead_lettered_total.with_label_values(&["commits", "attempts"]).inc();
        let docs: Vec<serde_json::Value> =
            m.emf_documents("Lanes/test", 1_000).iter().map(|d| serde_json::from_str(d).unwrap()).collect();
        let lane = docs.iter().find(|d| d["lane"] == "interactive").unwrap();
        assert_eq!(lane["task_latency_seconds"], serde_json::json!([1.5, 0.5]));
        assert_eq!(lane["llm_tokens_prompt"], 120.0);
        let aws = &lane["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(
            (aws["Namespace"].as_str(), aws["Dimensions"][0][0].as_str()),
            (Some("Lanes/test"), Some("lane"))
        );
        assert!(
            aws["Metrics"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["Name"] == "task_latency_seconds" && d["Unit"] == "Seconds")
        );
        let global = docs.iter().find(|d| d.get("lane").is_none()).unwrap();
        assert_eq!(global["duplicates_cache"], 1.0);
        // A `reason` label is a dimension, not part of the name.
        let dead = docs.iter().find(|d| d["reason"] == "attempts").unwrap();
        assert_eq!((dead["lane"].as_str(), dead["dead_lettered"].as_f64()), (Some("commits"), Some(1.0)));
        assert_eq!(
            dead["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            serde_json::json!([["lane", "reason"]])
        );
        // A gauge reports its value at each flush, with its unit.
        m.queue_oldest_age_seconds.with_label_values(&["interactive"]).set(42);
        for at in [1_100, 1_200] {
            let docs: Vec<serde_json::Value> =
                m.emf_documents("Lanes/test", at).iter().map(|d| serde_json::from_str(d).unwrap()).collect();
            let lane = docs.iter().find(|d| d["lane"] == "interactive").unwrap();
            assert_eq!(lane["queue_oldest_age_seconds"], 42.0, "{lane}");
            let defs = lane["_aws"]["CloudWatchMetrics"][0]["Metrics"].as_array().unwrap();
            assert!(defs.iter().any(|d| d["Name"] == "queue_oldest_age_seconds" && d["Unit"] == "Seconds"));
        }
        // Per tenant: the tenant is a dimension, with raw waits and counted put-offs.
        m.tenant_waited("interactive", "t-abc", 0.25);
        m.tenants.put_off("interactive", "t-abc", "fairness");
        let docs: Vec<serde_json::Value> =
            m.emf_documents("Lanes/test", 1_500).iter().map(|d| serde_json::from_str(d).unwrap()).collect();
        let waited = docs.iter().find(|d| d.get("tenant_wait_seconds").is_some()).unwrap();
        assert_eq!(
            (waited["tenant"].as_str(), waited["tenant_wait_seconds"].as_f64()),
            (Some("t-abc"), Some(0.25))
        );
        assert_eq!(
            waited["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            serde_json::json!([["lane", "tenant"]])
        );
        let put_off = docs.iter().find(|d| d.get("tenant_put_offs").is_some()).unwrap();
        assert_eq!(
            (put_off["tenant"].as_str(), put_off["reason"].as_str()),
            (Some("t-abc"), Some("fairness"))
        );
        // Deltas: nothing new, nothing reported.
        m.llm_tokens_total.with_label_values(&["interactive", "prompt"]).inc_by(5);
        let again: Vec<serde_json::Value> =
            m.emf_documents("Lanes/test", 2_000).iter().map(|d| serde_json::from_str(d).unwrap()).collect();
        assert_eq!(again.len(), 1, "{again:?}");
        assert_eq!(again[0]["llm_tokens_prompt"], 5.0);
        assert!(again[0].get("task_latency_seconds").is_none());
        // A tenant's standing: a ratio (unit None) by lane and tenant, the kind in the name.
        let standing =
            crate::domain::token_share::Standing { group: "t-abc".into(), received: 0.75, entitled: 0.5 };
        m.tenants.stood("interactive", &[standing]);
        let docs: Vec<serde_json::Value> =
            m.emf_documents("Lanes/test", 2_500).iter().map(|d| serde_json::from_str(d).unwrap()).collect();
        let share = docs.iter().find(|d| d.get("tenant_share_ratio_received").is_some()).unwrap();
        assert_eq!(
            (share["tenant"].as_str(), share["tenant_share_ratio_received"].as_f64()),
            (Some("t-abc"), Some(0.75))
        );
        assert_eq!(share["tenant_share_ratio_entitled"], 0.5);
        let defs = share["_aws"]["CloudWatchMetrics"][0]["Metrics"].as_array().unwrap();
        assert!(defs.iter().all(|d| d["Unit"] == "None"), "{defs:?}");
    }
}
