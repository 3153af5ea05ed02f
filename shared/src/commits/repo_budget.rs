//! Each repository's daily commit budget (`LANES_REPO_DAILY_COMMITS`): the most commits of one
//! repository (its id, by the owner its name gives: [`crate::domain::commit::PushScope`]) the
//! commits lane fetches and summarizes per UTC day, whichever branches bring them.
//!
//! A push of generated commits, a force-push of a rebased history or a flood of new branches each
//! bring new shas, and each new sha costs a diff fetch and its share of a model call. The budget is
//! a counter per repository id, the owner its push was for, and day (taken before the fetch asks
//! the host what the id names, so a commit claiming another owner's repository counts apart and
//! cannot fill that repository's day), taken in the cache ([`crate::ports::Cache::reserve`], one
//! atomic step, so parallel workers never pass it) for every commit the cache and the store could
//! not answer, before its diff is fetched. A commit over the budget waits for the next UTC day
//! (`lanes_waits_total{lane="commits",why="quota"}`): nothing is dropped. A commit that took the
//! budget and was not summarized in the end (a failed fetch, a throttled call, the deadline) gives
//! it back, so a retry is not counted twice; one handed to a provider batch keeps it, and is not
//! counted again when the batch's collector sends it on. With the cache unreachable the budget is not enforced
//! (counted as degraded), as for the tasks' budgets.

use super::group::{Group, GroupEnd};
use super::worker::{CommitsWorker, LANE};
use crate::domain::quota::{give_back, repo_commit};
use futures::future::join_all;
use tracing::warn;

impl CommitsWorker {
    /// Takes one commit of its repository's day for every commit still open; one over the budget
    /// ends as a wait until the day ends.
    pub(super) async fn take_repo_budget(&self, groups: &mut [Group]) {
        let Some(limit) = self.lease.quota.repo_daily_commits else { return };
        let now = self.clock.now_ms();
        // A commit a batch's collector sent on took its day's budget when first fetched.
        let open: Vec<usize> = Self::open(groups).filter(|&g| groups[g].commit.escalated.is_none()).collect();
        let charges: Vec<_> =
            open.iter().map(|&g| repo_commit(&groups[g].commit.scope(), limit, now)).collect();
        let taken = join_all(charges.iter().map(|(c, _)| self.cache.reserve(std::slice::from_ref(c)))).await;
        for ((&g, (charge, day_left)), taken) in open.iter().zip(charges).zip(taken) {
            match taken {
                Ok(None) => groups[g].budget = Some(charge),
                Ok(Some(_)) => {
                    self.metrics.waits_total.with_label_values(&[LANE, "quota"]).inc();
                    let reason = format!(
                        "repository {} has used its {limit} commits of the day",
                        groups[g].commit.repo_id
                    );
                    groups[g].outcome = Some(GroupEnd::Wait { after: day_left, reason });
                }
                Err(e) => {
                    warn!(error = %e, "cache unavailable; the repository's commit budget is not checked");
                    self.metrics.degraded_operations_total.with_label_values(&["quota"]).inc();
                }
            }
        }
    }

    /// Gives back the budget of every commit that took it and was not summarized (one handed to a
    /// provider batch keeps it: the batch summarizes it).
    pub(super) async fn give_back_repo_budget(&self, groups: &[Group]) {
        let back = groups
            .iter()
            .filter(|g| !matches!(g.outcome, Some(GroupEnd::Done(_) | GroupEnd::Batched)))
            .filter_map(|g| g.budget.as_ref().map(give_back));
        let back: Vec<_> = back.collect();
        for result in join_all(back.iter().map(|c| self.cache.reserve(std::slice::from_ref(c)))).await {
            if let Err(e) = result {
                warn!(error = %e, "cache unavailable; a commit's budget is not given back");
                self.metrics.degraded_operations_total.with_label_values(&["quota"]).inc();
            }
        }
    }
}
