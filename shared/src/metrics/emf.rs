//! The CloudWatch Embedded Metric Format encoding of [`super::Metrics`]: which labels become
//! dimensions, which gauges are reported, how a series is named, and how a dimension set's metrics
//! are packed into documents within EMF's limits (100 metrics per document, 100 values per metric).

/// The labels that become CloudWatch dimensions in EMF; every other label is part of the metric name.
pub const EMF_DIMENSIONS: [&str; 3] = ["lane", "reason", "tenant"];

/// The gauges EMF reports, each its value at the flush. The pool's queue depth and in-flight
/// gauges are left out: only `lanes dev` sets them (at zero from the start), and in Lambda the
/// controller reports `queue_depth` and `queue_in_flight` itself, from the queues.
pub const EMF_GAUGES: [&str; 2] = ["lanes_queue_oldest_age_seconds", "lanes_tenant_share_ratio"];

/// A gauge's EMF unit, by its name's ending.
pub fn emf_gauge_unit(family: &str) -> &'static str {
    if family.ends_with("_seconds") {
        "Seconds"
    } else if family.ends_with("_ratio") {
        "None"
    } else {
        "Count"
    }
}

/// The EMF documents of one dimension set: at most 100 metrics per document and 100 values per
/// metric, as EMF allows.
pub(super) fn emf_group(
    namespace: &str,
    now_ms: u64,
    dims: &[(String, String)],
    metrics: std::collections::BTreeMap<String, (&'static str, Vec<f64>)>,
) -> Vec<String> {
    let mut docs = Vec::new();
    let mut metrics: Vec<(String, (&str, Vec<f64>))> = metrics.into_iter().collect();
    while !metrics.is_empty() {
        let mut doc = serde_json::Map::new();
        let mut defs = Vec::new();
        let mut rest = Vec::new();
        for (name, (unit, mut values)) in metrics.drain(..) {
            if defs.len() == 100 {
                rest.push((name, (unit, values)));
                continue;
            }
            let tail = if values.len() > 100 { values.split_off(100) } else { Vec::new() };
            defs.push(serde_json::json!({"Name": name, "Unit": unit}));
            let value =
                if values.len() == 1 { serde_json::json!(values[0]) } else { serde_json::json!(values) };
            doc.insert(name.clone(), value);
            if !tail.is_empty() {
                rest.push((name, (unit, tail)));
            }
        }
        metrics = rest;
        let names: Vec<&str> = dims.iter().map(|(n, _)| n.as_str()).collect();
        for (n, v) in dims {
            doc.insert(n.clone(), serde_json::json!(v));
        }
        doc.insert(
            "_aws".into(),
            serde_json::json!({"Timestamp": now_ms, "CloudWatchMetrics": [
                {"Namespace": namespace, "Dimensions": [names], "Metrics": defs}]}),
        );
        docs.push(serde_json::Value::Object(doc).to_string());
    }
    docs
}

/// A counter's EMF metric name: the family without `lanes_` and `_total`, then each non-dimension
/// label value (`lanes_llm_tokens_total{lane,type="prompt"}` → `llm_tokens_prompt`).
pub fn emf_name(family: &str, labels: &[(&str, &str)]) -> String {
    let mut name = family.trim_start_matches("lanes_").trim_end_matches("_total").to_owned();
    for (label, value) in labels {
        if !EMF_DIMENSIONS.contains(label) {
            name.push('_');
            name.push_str(value);
        }
    }
    name
}
