//! A task's share of its lane in tokens ([`crate::domain::token_share`] decides): ingress counts a
//! new task as waiting in its group (`Ingress::count_waiting`); before its call the worker asks whether the
//! group may start now ([`Worker::take_share`]: a group over its weighted share while another group
//! waits is put off, a wait that uses no attempt), and once the answer is in, corrects the charge to
//! the usage it reports ([`Worker::settle_share`]).
//!
//! Counts err towards starting: a re-sent message is not counted again, a task started twice (a
//! retry) takes one off twice (never below zero), and a call dropped with its lease keeps its charge
//! (the provider may have billed it). A task that never starts (cancelled while queued) stays
//! counted until its group is quiet for [`crate::domain::token_share::ShareSettings::forget_ms`].
//!
//! Every few seconds ([`crate::metrics::tenants::STANDINGS_EVERY_MS`]) a worker that has just
//! decided also reads the lane's whole state and reports each tenant's standing (the share of the
//! lane's recent tokens it received, against the share its weight entitles it to): the state is the
//! lane's across every worker, so the figures are the lane's, not one process's view.
//!
//! The group is the task's fair-order group (its tenant, hashed; with tenancy off its project), and
//! its weight the tenant's (or project's) in `LANES_TENANT_WEIGHTS`. With the cache unreachable
//! nothing is counted and every task starts (counted as degraded): the fair queue's order, by task
//! count, is then what keeps one tenant's burst from the others.

use super::ingress::Ingress;
use super::worker::Worker;
use crate::config::QuotaConfig;
use crate::domain::fairness::task_group;
use crate::domain::token_share::{ShareAsk, Step, Verdict};
use crate::domain::{Lane, TaskRecord, TaskRequest};
use crate::metrics::Metrics;
use std::time::Duration;
use tracing::warn;

/// The cache key of a lane's token shares (one hash tag, one cluster slot).
pub fn share_key(lane: Lane) -> String {
    format!("fair:{{{}}}", lane.as_str())
}

/// A started task's charge on its group's tokens, to correct once the answer is in.
#[derive(Debug, Clone)]
pub(crate) struct ShareHold {
    lane: Lane,
    estimate: u64,
}

/// The question a task of `request` asks its lane's token shares.
pub fn share_ask(quota: &QuotaConfig, request: &TaskRequest, step: Step, now_ms: u64) -> ShareAsk {
    let name = request.tenant.as_ref().map_or(request.project_id.as_str(), |t| t.as_str());
    ShareAsk {
        group: task_group(request.tenant.as_ref(), &request.project_id),
        weight: quota.share.weights.of(name),
        step,
        now_ms,
        settings: quota.share.settings,
    }
}

/// Whether tasks of `lane` are counted: fairness on, and a task lane (commits are batched per
/// repository and stay in the fair queue's order).
fn counted(quota: &QuotaConfig, lane: Lane) -> bool {
    quota.share.on && lane != Lane::Commits
}

fn degraded(metrics: &Metrics, e: &crate::ports::CacheError) {
    warn!(error = %e, "cache unavailable; token shares not counted");
    metrics.degraded_operations_total.with_label_values(&["fairness"]).inc();
}

impl Ingress {
    /// Counts a task this ingress has just queued as waiting in its group.
    pub(super) async fn count_waiting(&self, record: &TaskRecord) {
        let quota = &self.config.quota;
        if !counted(quota, record.lane) {
            return;
        }
        let ask = share_ask(quota, &record.request, Step::Submit, self.clock.now_ms());
        if let Err(e) = self.cache.share(&share_key(record.lane), &ask).await {
            degraded(&self.metrics, &e);
        }
    }
}

impl Worker {
    /// Whether the task may start now: `Ok` with its charge (none when fairness is off or the cache
    /// down), or `Err` with how long to put it off.
    pub(super) async fn take_share(
        &self,
        lane: Lane,
        request: &TaskRequest,
        estimate: u64,
        now_ms: u64,
    ) -> Result<Option<ShareHold>, Duration> {
        let quota = &self.config.quota;
        if !counted(quota, lane) {
            return Ok(None);
        }
        let step = Step::Decide { estimate };
        let decided = self.cache.share(&share_key(lane), &share_ask(quota, request, step, now_ms)).await;
        if decided.is_ok() {
            self.report_standings(lane, now_ms).await;
        }
        match decided {
            Ok(Verdict::Go) => Ok(Some(ShareHold { lane, estimate })),
            Ok(Verdict::PutOff) => {
                let base = quota.share.settings.put_off_ms.max(1);
                Err(Duration::from_millis(base + crate::jitter::range(0..=base / 2)))
            }
            Err(e) => {
                degraded(&self.metrics, &e);
                Ok(None)
            }
        }
    }

    /// Reports the lane's standings ([`crate::domain::token_share::standings`]) when they are due.
    async fn report_standings(&self, lane: Lane, now_ms: u64) {
        let tenants = &self.metrics.tenants;
        if !tenants.standings_due(lane.as_str(), now_ms) {
            return;
        }
        match self.cache.share_state(&share_key(lane)).await {
            Ok(state) => {
                let settings = &self.config.quota.share.settings;
                tenants
                    .stood(lane.as_str(), &crate::domain::token_share::standings(&state, now_ms, settings));
            }
            // Only the report is lost; the next one is due in a few seconds.
            Err(e) => tracing::debug!(error = %e, "token shares unread; standings not reported"),
        }
    }

    /// Corrects a started task's charge to the tokens its call used (zero for a call that failed
    /// or was refused: nothing was spent).
    pub(super) async fn settle_share(&self, hold: Option<&ShareHold>, request: &TaskRequest, used: u64) {
        let Some(hold) = hold else { return };
        let delta = used as i64 - hold.estimate.min(i64::MAX as u64) as i64;
        if delta == 0 {
            return;
        }
        let step = Step::Settle { delta };
        let ask = share_ask(&self.config.quota, request, step, self.clock.now_ms());
        if let Err(e) = self.cache.share(&share_key(hold.lane), &ask).await {
            degraded(&self.metrics, &e);
        }
    }
}
