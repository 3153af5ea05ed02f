//! A task's hold on its tenant's and project's day ([`crate::quota::hold`]): taken by ingress when
//! a submission is new, given back when it turns out a duplicate or stores nothing, and when the task
//! ends (the worker's final write, the client's cancellation). The release is once however many
//! runs see the end, so each path may give it back without asking the others.
//!
//! With the cache unreachable nothing is held and nothing refused (counted as degraded): a budget
//! protects spend but must not stop the service. A hold that cannot be given back stays until the
//! day's counters expire, which errs on the side of spending less.

use crate::config::QuotaConfig;
use crate::domain::TaskRecord;
use crate::metrics::Metrics;
use crate::ports::Cache;
use crate::quota::OverQuota;
use tracing::warn;

/// Holds the new task's estimate on its day; `Err` when a day's budget cannot hold it.
pub(crate) async fn take(
    cache: &dyn Cache,
    quota: &QuotaConfig,
    metrics: &Metrics,
    record: &TaskRecord,
) -> Result<(), OverQuota> {
    let scopes = crate::quota::task_scopes(record);
    let cost = crate::quota::task_estimate(quota, &record.request);
    match crate::quota::hold(cache, quota, &scopes, cost, &record.nonce, record.created_at_ms).await {
        Ok(held) => held,
        Err(e) => {
            warn!(error = %e, "cache unavailable; the daily budgets are not held");
            metrics.degraded_operations_total.with_label_values(&["quota"]).inc();
            Ok(())
        }
    }
}

/// Gives back the hold of `record`'s submission, if it still has one.
pub(crate) async fn give_back(
    cache: &dyn Cache,
    quota: &QuotaConfig,
    metrics: &Metrics,
    record: &TaskRecord,
) {
    if let Err(e) = crate::quota::release_task(cache, quota, record).await {
        warn!(error = %e, "cache unavailable; a task's budget hold is not given back");
        metrics.degraded_operations_total.with_label_values(&["quota"]).inc();
    }
}
