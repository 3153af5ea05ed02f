//! The worker's side of the per-tenant concurrency cap ([`crate::domain::concurrency`]): a claimed
//! run takes a place in its group's set before its call, renews it on the lease's cadence while it
//! runs, and gives it back on every way out. A group at its cap is put off (a wait, never an
//! attempt), as a group over its token share is. With the cache down the cap is not enforced: the
//! task runs, counted as degraded, because failing work for an accelerator's outage would turn a
//! cache blip into lost tasks.

use super::share::ShareHold;
use super::worker::{Run, Settle, Worker};
use crate::domain::Lane;
use crate::domain::concurrency::{place_member, running_key};
use crate::lease::Outcome;
use crate::ports::Cache;
use std::sync::Arc;
use std::time::Duration;

/// A run's place in its group's set, renewed while this lives and given back when it is dropped.
pub(super) struct Place {
    renewals: tokio::task::JoinHandle<()>,
    cache: Arc<dyn Cache>,
    key: String,
    member: String,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.renewals.abort();
        // Dropping cannot wait; the place's end time frees it anyway if this never runs.
        let (cache, key, member) =
            (self.cache.clone(), std::mem::take(&mut self.key), std::mem::take(&mut self.member));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = cache.leave(&key, &member).await;
            });
        }
    }
}

impl Worker {
    /// The tenant's two gates before a claimed run's call, in order: a place under its concurrency
    /// cap, then its token share. Either one refusing puts the run off (a wait, no attempt); a
    /// place already taken is given back by the drop. `group` is the run's
    /// ([`task_group`](crate::domain::fairness::task_group)).
    pub(super) async fn take_turn(
        &self,
        run: Run<'_>,
        group: &str,
        estimate: u64,
        now_ms: u64,
    ) -> Result<(Option<Place>, Option<ShareHold>), Outcome> {
        let (lane, request) = (run.task.lane, &run.record.request);
        let put_off = |after, why, reason| {
            self.metrics.tenants.put_off(lane.as_str(), group, why);
            self.wait(
                &**run.queue,
                run.message,
                run.task,
                Settle::Fenced(run.record),
                after,
                Some(why),
                reason,
            )
        };
        let member = place_member(&run.task.task_id, run.record.fence);
        let place = match self.take_place(lane, group, member, now_ms).await {
            Ok(place) => place,
            Err(after) => {
                return Err(put_off(
                    after,
                    "tenant_cap",
                    "tenant cap: its tenant's runs fill this lane's cap",
                )
                .await);
            }
        };
        match self.take_share(lane, request, estimate, now_ms).await {
            Ok(share) => Ok((place, share)),
            Err(after) => {
                let why = "fairness: over its share of the lane's tokens while other tenants wait";
                Err(put_off(after, "fairness", why).await)
            }
        }
    }

    /// Takes a place for the run `member` ([`place_member`]) among `group`'s running tasks in `lane`:
    /// `Ok(None)` where the lane has no cap (or the cache is down), `Err(after)` when the group is at
    /// its cap.
    async fn take_place(
        &self,
        lane: Lane,
        group: &str,
        member: String,
        now_ms: u64,
    ) -> Result<Option<Place>, Duration> {
        let Some(cap) = self.config.quota.concurrency.of(lane) else { return Ok(None) };
        let key = running_key(lane, group);
        let ttl = self.config.lease_ttl;
        let until = move |now: u64| now.saturating_add(ttl.as_millis() as u64);
        match self.cache.enter_within(&key, &member, now_ms, until(now_ms), cap.into()).await {
            Ok(true) => {
                let (cache, clock, every) =
                    (self.cache.clone(), self.clock.clone(), self.config.renew_interval);
                let (k, m) = (key.clone(), member.clone());
                let renewals = tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(every).await;
                        let now = clock.now_ms();
                        // A member renews whatever the count.
                        let _ = cache.enter(&k, &m, now, until(now)).await;
                    }
                });
                Ok(Some(Place { renewals, cache: self.cache.clone(), key, member }))
            }
            Ok(false) => {
                // A place frees when one of the group's runs ends, usually well before its end time.
                let base = self.config.quota.share.settings.put_off_ms.max(1);
                Err(Duration::from_millis(base + crate::jitter::range(0..=base / 2)))
            }
            Err(e) => {
                tracing::warn!(error = %e, "tenant concurrency unavailable; running uncapped");
                self.metrics.degraded_operations_total.with_label_values(&["tenant_concurrency"]).inc();
                Ok(None)
            }
        }
    }
}
