//! The commits handed to a provider batch. A call the lane would make at tier `batch`
//! ([`crate::domain::tier::choose`], `LANES_TIER_COMMITS=batch`) is not made: the worker's batch
//! calls go into one provider batch, in the order of [`crate::domain::batch`]'s life:
//! record (`Submitting`, with a marker per commit), look the key up at the provider, submit only if
//! nothing carries it, record the provider's id (`Open`), and only then ack the commits' messages.
//!
//! What can go wrong, and what happens:
//! - the record cannot be written: nothing was submitted; the calls are made now, synchronously;
//! - the provider refuses the batch (a 4xx: it made none): the record is deleted and the calls are
//!   made now;
//! - the submission's outcome is unknown (a timeout, a 5xx) or its id cannot be recorded: the
//!   record stays `Submitting` and owns the commits; their messages come back, are found batched
//!   and acked; the collector later adopts the batch it finds under the key, or sends them on.
//!
//! A commit already carried by an unclosed batch is acked as pending, never packed again
//! ([`CommitsWorker::answer_batched`]), unless the collector sent it back (it carries its floor).
//! While the batch's record is still `Submitting` inside its grace, its worker may yet delete it
//! (a refused batch) and call now on its own deliveries: a duplicate waits until the record owns
//! the commit ([`crate::domain::batch::Carrier::owns`]).

pub use super::Batching;
use super::group::{Group, GroupEnd};
use super::worker::{CommitsWorker, Pending};
use crate::domain::Lane;
use crate::domain::batch::{
    BatchCall, BatchPhase, BatchRecord, BatchedCommit, MAX_BATCH_COMMITS, SUBMIT_LIMIT, batch_key, custom_id,
};
use crate::domain::tier::Tier;
use crate::ports::{BatchSubmission, SubmitError};
use tracing::{info, warn};

impl CommitsWorker {
    /// The collector of this worker's batches, when it makes any.
    pub fn collector(&self) -> Option<super::collect::Collector> {
        Some(super::collect::Collector {
            batching: self.batching.clone()?,
            summaries: self.summaries.clone(),
            cache: self.cache.clone(),
            send: self.send.clone(),
            clock: self.clock.clone(),
            metrics: self.metrics.clone(),
            cache_ttl: self.config.cache_ttl,
        })
    }

    /// Acks, as pending, each open commit an unclosed batch carries (a duplicate delivery, or a
    /// message whose batch was recorded before its ack was lost). A batch that sent the commit on
    /// no longer owns it, whatever its record's state: the markers of every batch that sent one of
    /// the group's deliveries back are passed over. Passing over only the first delivery's lost
    /// both copies of a commit two batches carried: each batch's copy found the other's marker.
    pub(super) async fn answer_batched(&self, groups: &mut [Group]) {
        let Some(batching) = &self.batching else { return };
        let open: Vec<usize> = Self::open(groups).collect();
        if open.is_empty() {
            return;
        }
        let keys: Vec<String> = open.iter().map(|&g| groups[g].commit.key()).collect();
        match batching.store.batched(&keys).await {
            Ok(found) => {
                let now = self.clock.now_ms();
                for &g in &open {
                    let group = &groups[g];
                    let Some(carrier) =
                        found.get(&group.commit.key()).filter(|c| !group.sent_back_by.contains(&c.batch))
                    else {
                        continue;
                    };
                    groups[g].outcome = Some(if carrier.owns(now) {
                        self.metrics.duplicates_total.with_label_values(&["commit_batched"]).inc();
                        GroupEnd::Batched
                    } else {
                        // Its worker may still delete the record and call now: asked again once
                        // the record owns the commit, or no worker can still be submitting.
                        let after = carrier.owned_in(now).max(self.lease.backoff_base);
                        GroupEnd::Wait { after, reason: "batch still submitting".into() }
                    });
                }
            }
            Err(e) => {
                warn!(error = %e, "batch records unavailable");
                for &g in &open {
                    let after = crate::lease::full_jitter_backoff(&self.lease, groups[g].receives);
                    groups[g].outcome = Some(GroupEnd::Wait { after, reason: "store unavailable".into() });
                }
            }
        }
    }

    /// Submits the bins the lane would call at `batch` as one provider batch; returns the bins to
    /// call now (the others, and these too where no batch could be made).
    pub(super) async fn submit_batches(
        &self,
        groups: &mut [Group],
        pending: &[Pending],
        bins: Vec<Vec<usize>>,
    ) -> Vec<Vec<usize>> {
        let Some(batching) = &self.batching else { return bins };
        let (mut batched, mut now): (Vec<Vec<usize>>, Vec<Vec<usize>>) = (Vec::new(), Vec::new());
        let (mut carried, mut room) = (0, batching.queue_room().await);
        for bin in bins {
            let items: Vec<&Pending> = bin.iter().map(|&i| &pending[i]).collect();
            let tokens: u64 = items.iter().map(|p| p.section_tokens as u64).sum();
            if self.tier_for(groups, &items) == Tier::Batch
                && carried + bin.len() <= MAX_BATCH_COMMITS
                && tokens <= room
            {
                (carried, room) = (carried + bin.len(), room - tokens);
                batched.push(bin);
            } else {
                now.push(bin);
            }
        }
        if batched.is_empty() {
            return now;
        }
        let (record, submission) = self.batch_of(groups, pending, &batched);
        let commits: Vec<usize> = batched.iter().flatten().map(|&i| pending[i].group).collect();
        match self.submit(batching, record, &submission).await {
            Some(end) => {
                for g in commits {
                    groups[g].outcome = Some(match end {
                        Ok(()) => GroupEnd::Batched,
                        // Owned by the record now: back after a pause, to be found batched.
                        Err(reason) => {
                            GroupEnd::Wait { after: self.lease.backoff_base, reason: reason.into() }
                        }
                    });
                }
            }
            None => now.extend(batched),
        }
        now
    }

    /// The record and the submission of `bins`.
    fn batch_of(
        &self,
        groups: &[Group],
        pending: &[Pending],
        bins: &[Vec<usize>],
    ) -> (BatchRecord, BatchSubmission) {
        let policy = self.lease.lane(Lane::Commits);
        let deadline = policy.deadline.unwrap_or_default().as_millis() as u64;
        let mut calls = Vec::new();
        let mut requests = Vec::new();
        for bin in bins {
            let items: Vec<&Pending> = bin.iter().map(|&i| &pending[i]).collect();
            let commits: Vec<BatchedCommit> = items
                .iter()
                .map(|p| BatchedCommit {
                    commit: groups[p.group].commit.clone(),
                    enqueued_at_ms: groups[p.group].enqueued_at_ms,
                    diff_tokens: p.trimmed.tokens as u64,
                    diff_cut: p.trimmed.cut,
                    section_tokens: p.section_tokens as u64,
                })
                .collect();
            let id = custom_id(&commits);
            requests.push((id.clone(), self.request_for(&items, Tier::Batch)));
            calls.push(BatchCall { custom_id: id, commits });
        }
        let deadline_ms =
            calls.iter().flat_map(|c| &c.commits).map(|c| c.enqueued_at_ms + deadline).min().unwrap_or(0);
        // Commits a batch sent on are keyed apart from it: batched again, they make another key,
        // so a duplicate of what was sent on still finds the new batch's marker.
        let mut froms: Vec<&str> = calls
            .iter()
            .flat_map(|c| &c.commits)
            .filter_map(|c| c.commit.escalated.as_ref()?.from.as_deref())
            .collect();
        froms.sort_unstable();
        froms.dedup();
        let scope = self.batching.as_ref().map_or("", |b| b.scope.as_str());
        let key = batch_key(&format!("{scope}|{}", froms.join(",")), &calls);
        let record = BatchRecord {
            key: key.clone(),
            route: self.batching.as_ref().map(|b| b.api.route().to_owned()).unwrap_or_default(),
            provider_id: None,
            phase: BatchPhase::Submitting,
            calls,
            created_at_ms: self.clock.now_ms(),
            deadline_ms,
            escalated: false,
            task: None,
        };
        (record, BatchSubmission { key, calls: requests })
    }

    /// Records, looks up, submits and records again. `None` when no batch was made and the calls
    /// are to be made now; `Ok` when the batch owns the commits and their messages may be acked;
    /// `Err` (why) when its record owns them but the batch is not known to be made.
    async fn submit(
        &self,
        batching: &Batching,
        mut record: BatchRecord,
        submission: &BatchSubmission,
    ) -> Option<Result<(), &'static str>> {
        match batching.store.create_batch(&record).await {
            Ok(true) => {}
            // Recorded already (an earlier run's record, whose acks were lost, or a race): its
            // messages come back and are found batched, or sent on by its collector.
            Ok(false) => return Some(Err("batch already recorded")),
            Err(e) => {
                warn!(error = %e, "batch record not written; calling now");
                return None;
            }
        }
        // Well inside the collector's grace, so a submission is never looked up while under way.
        let made = tokio::time::timeout(SUBMIT_LIMIT, batching.find_or_submit(&record, submission)).await;
        let id = match made {
            Ok(Ok(id)) => id,
            Ok(Err(SubmitError::NotMade(e))) => {
                warn!(error = %e, "batch not made; calling now");
                crate::metrics::llm_route_event(Lane::Commits, batching.api.route(), "batch_refused");
                return self.forget(batching, &record).await;
            }
            Ok(Err(SubmitError::Unknown(e))) => {
                warn!(error = %e, key = %record.key, "batch submission unanswered; its record owns the commits");
                return Some(Err("batch submission unanswered"));
            }
            Err(_) => return Some(Err("batch submission timed out")),
        };
        record.provider_id = Some(id.clone());
        record.phase = BatchPhase::Open;
        match batching.store.update_batch(&record, BatchPhase::Submitting).await {
            Ok(true) => {
                let commits = record.commits().count();
                info!(key = %record.key, batch = %id, commits, "commits handed to a provider batch");
                crate::metrics::llm_route_event(Lane::Commits, batching.api.route(), "batch_submitted");
                Some(Ok(()))
            }
            Ok(false) => Some(Err("batch record changed under the submission")),
            Err(e) => {
                warn!(error = %e, key = %record.key, "batch id not recorded; the collector will find it");
                Some(Err("batch id not recorded"))
            }
        }
    }

    /// Deletes the record of a batch that was not made; the calls are made now (`None`), or, if
    /// the record stays, left to it.
    async fn forget(&self, batching: &Batching, record: &BatchRecord) -> Option<Result<(), &'static str>> {
        match batching.store.close_batch(record).await {
            Ok(()) => None,
            Err(e) => {
                warn!(error = %e, "batch record not deleted; its collector sends the commits on");
                Some(Err("batch not made"))
            }
        }
    }
}
