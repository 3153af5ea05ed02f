//! How an accepted push reaches the commits lane: one message per listed commit, plus the range an
//! incomplete payload leaves for the worker to expand, sent in batches of ten; and, first, each
//! repository's daily commit budget (`LANES_REPO_DAILY_COMMITS`) at the door.
//!
//! The budget is counted where the webhook can reach it, the store (one conditional update per
//! push, so parallel deliveries never pass it), per repository id and owner ([`PushScope`]): the
//! id is only what the push claims until the commits worker asks the host, so a push signed for
//! one owner that claims another's repository counts in a day of its own. A push whose listed
//! commits would take the repository's day past its budget is answered `429` with `Retry-After` to
//! the next UTC day and stores nothing (one that lists more commits than a whole day allows is a
//! `413`: no day would take it): no message, no delivery marker, so the host's redelivery after
//! midnight is accepted. A push whose commits could not all be sent gives its count back before it
//! answers `503`, so the host's redelivery is not counted twice. The commits a range expands to are
//! not known here; the worker counts those against the same budget when it fetches them. With the
//! store unreachable the push is refused (`503`), as its replay check is.

use super::webhook::Webhook;
use crate::domain::commit::{CommitsMessage, PushScope};
use crate::problem::Problem;
use axum::http::StatusCode;
use std::collections::BTreeMap;
use tracing::warn;

const DAY_MS: u64 = 86_400_000;

/// The repository's day and count a push took, to give back if its commits are not all sent.
struct Taken {
    scope: PushScope,
    day: u64,
    commits: i64,
}

impl Webhook {
    /// Sends every message of `push` within its repository's daily commit budget.
    pub(super) async fn enqueue(&self, push: &super::push::Push) -> Result<(), Problem> {
        let taken = self.take_budget(push).await?;
        let sent = self.send_all(push).await;
        if let (Err(_), Some(t)) = (&sent, taken)
            && let Err(e) = self.store.count_pushed(&t.scope, t.day, -t.commits, u64::MAX).await
        {
            warn!(error = %e, "a refused push's commits are not given back to its repository's day");
        }
        sent
    }

    /// Counts the push's listed commits against its repository's day: `None` with no budget set or
    /// nothing listed, the 429 when the day has no room for them all.
    async fn take_budget(&self, push: &super::push::Push) -> Result<Option<Taken>, Problem> {
        let (Some(limit), listed) = (self.config.daily_commits, push.commits.len() as i64) else {
            return Ok(None);
        };
        if listed == 0 {
            return Ok(None);
        }
        if listed as u64 > limit {
            return Err(self.larger_than_a_day(push, listed, limit));
        }
        let now = self.clock.now_ms();
        let day = now / DAY_MS;
        let scope = PushScope::of(&push.repo_id, &push.repo);
        match self.store.count_pushed(&scope, day, listed, limit).await {
            Ok(true) => Ok(Some(Taken { scope, day, commits: listed })),
            Ok(false) => {
                let provider = push.repo_id.provider().as_str();
                self.metrics.webhook_deliveries_total.with_label_values(&[provider, "over_budget"]).inc();
                let detail = format!(
                    "`{}` ({}) has no room for this push's {listed} commits in today's budget of {limit} \
                     (LANES_REPO_DAILY_COMMITS); redeliver after 00:00 UTC",
                    push.repo, push.repo_id
                );
                let title = "Repository over its daily commit budget";
                let mut p = Problem::new(StatusCode::TOO_MANY_REQUESTS, "quota-exceeded", title, detail);
                p.retry_after = Some(((day + 1) * DAY_MS - now).div_ceil(1000));
                Err(p.with_field("repository"))
            }
            Err(e) => {
                warn!(error = %e, "the repository's commit budget is unavailable");
                Err(Problem::unavailable("the store is unavailable; redeliver later", 30))
            }
        }
    }

    /// `413`: the push lists more commits than its repository's whole day allows, so no day would
    /// ever have room for it; a `429` would send the host back tomorrow to be refused again.
    fn larger_than_a_day(&self, push: &super::push::Push, listed: i64, limit: u64) -> Problem {
        let provider = push.repo_id.provider().as_str();
        self.metrics.webhook_deliveries_total.with_label_values(&[provider, "over_budget"]).inc();
        let detail = format!(
            "this push to `{}` ({}) lists {listed} commits, more than the repository's whole daily budget \
             of {limit} (LANES_REPO_DAILY_COMMITS): no day has room for it",
            push.repo, push.repo_id
        );
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "push-over-daily-budget",
            "Push larger than a day's budget",
            detail,
        )
        .with_field("commits")
    }

    /// Sends one message per listed commit, and for an incomplete payload the range the commits
    /// worker expands (with the host's API) into the rest, so no commit of the push is missed.
    async fn send_all(&self, push: &super::push::Push) -> Result<(), Problem> {
        let range = push.range.iter().filter_map(|r| {
            let body = serde_json::to_string(&CommitsMessage::Range { range: r.clone() }).ok()?;
            Some((body, r.send_attributes()))
        });
        let messages: Vec<(String, BTreeMap<String, String>)> = push
            .commits
            .iter()
            .filter_map(|c| Some((serde_json::to_string(c).ok()?, c.send_attributes())))
            .chain(range)
            .collect();
        if messages.is_empty() {
            return Ok(());
        }
        let failed = match self.queue.send_batch(&messages).await {
            Ok(unsent) => unsent.len(),
            Err(_) => messages.len(),
        };
        if failed > 0 {
            warn!(failed, "could not enqueue every commit");
            return Err(Problem::unavailable("the commits queue is unavailable; redeliver later", 30));
        }
        Ok(())
    }
}
