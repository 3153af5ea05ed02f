//! The DLQ operations an operator runs, on every lane: the sweep `lanes dev` runs in its own loop,
//! and the admin routes `lanes dlq --server` calls (list, redrive by relay or by move task, the move
//! tasks). The task lanes' DLQs are worked by [`crate::dlq`], the commits lane's by
//! [`crate::commits::dead_letters`]; this module picks one by lane, over a backend's adapters.

use crate::clock::SharedClock;
use crate::commits::dead_letters::CommitsDlq;
use crate::dlq::{DlqEntry, DlqError, RedriveReport, Sweep, SweepReport, redrive, redrive_by_move};
use crate::domain::Lane;
use crate::metrics::Metrics;
use crate::ports::QueueConsume;
use tracing::warn;

/// What the admin routes work on (only `lanes dev` serves them: in Lambda the DLQ is operated with
/// `lanes dlq --backend aws`, under IAM).
#[derive(Clone)]
pub struct Admin {
    /// The backend's adapters.
    pub adapters: crate::wiring::Adapters,
    /// Metrics.
    pub metrics: Metrics,
    /// Time.
    pub clock: SharedClock,
    /// TTL of a `PENDING` record.
    pub pending_ttl_secs: u64,
    /// TTL of a settled record.
    pub record_ttl_secs: u64,
}

impl Admin {
    fn dlq(&self, lane: Lane) -> Result<&std::sync::Arc<dyn QueueConsume>, DlqError> {
        self.adapters.dlq[lane.index()].as_ref().ok_or(DlqError::NoDlq(lane))
    }

    fn commits(&self) -> Result<CommitsDlq<'_>, DlqError> {
        Ok(CommitsDlq { dlq: &**self.dlq(Lane::Commits)?, summaries: &*self.adapters.summaries })
    }

    /// Sweeps every lane's DLQ once (see [`Sweep`] and [`CommitsDlq::sweep`]); a lane that fails
    /// does not stop the others.
    pub async fn sweep_all(&self, max: usize) -> Result<SweepReport, DlqError> {
        let (mut total, mut failure) = (SweepReport::default(), None);
        if self.adapters.dlq[Lane::Commits.index()].is_some() {
            match self.commits()?.sweep(max).await {
                Ok(r) => (total.seen, total.settled) = (r.seen, r.settled),
                Err(e) => failure = Some(e),
            }
        }
        for lane in [Lane::Interactive, Lane::Synthesis] {
            let sweep = Sweep {
                lane,
                dlq: &**self.dlq(lane)?,
                store: &*self.adapters.store,
                lock: Some(&*self.adapters.lock),
                lane_queue: Some(&*self.adapters.send[lane.index()]),
                metrics: &self.metrics,
                clock: &self.clock,
                ttl_secs: self.record_ttl_secs,
            };
            match sweep.run(max).await {
                Ok(r) => {
                    total.seen += r.seen;
                    total.marked_failed += r.marked_failed;
                }
                Err(e) => failure = Some(e),
            }
        }
        failure.map_or(Ok(total), Err)
    }

    /// Lists a lane's DLQ.
    pub async fn list(&self, lane: Lane, max: usize) -> Result<Vec<DlqEntry>, DlqError> {
        if lane == Lane::Commits {
            return self.commits()?.list(max).await;
        }
        crate::dlq::list(&**self.dlq(lane)?, &*self.adapters.store, &self.clock, max).await
    }

    /// One operation as the JSON both the admin routes and `lanes dlq --backend aws` print:
    /// `{lane, messages}`, `{lane, report}` or `{lane, moves}`.
    pub async fn answer(&self, lane: Lane, op: DlqOp) -> Result<serde_json::Value, DlqError> {
        Ok(match op {
            DlqOp::List => serde_json::json!({"lane": lane, "messages": self.list(lane, ADMIN_MAX).await?}),
            DlqOp::Redrive => {
                serde_json::json!({"lane": lane, "report": self.redrive(lane, ADMIN_MAX).await?})
            }
            DlqOp::RedriveByMove if lane == Lane::Commits => {
                let report =
                    self.commits()?.redrive_by_move(&*self.adapters.send[lane.index()], ADMIN_MAX).await?;
                serde_json::json!({"lane": lane, "report": report})
            }
            DlqOp::RedriveByMove => {
                let report = redrive_by_move(
                    &**self.dlq(lane)?,
                    &*self.adapters.send[lane.index()],
                    &*self.adapters.store,
                    &self.clock,
                    self.pending_ttl_secs,
                    ADMIN_MAX,
                )
                .await?;
                serde_json::json!({"lane": lane, "report": report})
            }
            DlqOp::Moves => serde_json::json!({"lane": lane, "moves": self.dlq(lane)?.move_tasks().await?}),
        })
    }

    /// Redrives a lane's DLQ by relay.
    pub async fn redrive(&self, lane: Lane, max: usize) -> Result<RedriveReport, DlqError> {
        if lane == Lane::Commits {
            return self.commits()?.redrive(&*self.adapters.send[lane.index()], max).await;
        }
        let dlq = self.dlq(lane)?;
        redrive(
            &**dlq,
            &*self.adapters.send[lane.index()],
            &*self.adapters.store,
            &self.clock,
            self.pending_ttl_secs,
            max,
        )
        .await
    }
}

/// The DLQ operations of the admin routes and `lanes dlq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DlqOp {
    /// List the messages with their task's status.
    List,
    /// Relay the messages back one by one ([`redrive`]).
    Redrive,
    /// Reset the records, then one move task ([`redrive_by_move`]).
    RedriveByMove,
    /// The DLQ's recent move tasks.
    Moves,
}

/// Most messages one admin call looks at.
pub const ADMIN_MAX: usize = 1000;

/// The lane a route names, or the problem that says which lanes there are.
fn dlq_lane(lane: &str) -> Result<Lane, Box<crate::problem::Problem>> {
    use crate::problem::Problem;
    use axum::http::StatusCode;
    match lane.parse::<Lane>() {
        Ok(l) => Ok(l),
        _ => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid-lane",
            "Invalid lane",
            "the lanes are `interactive`, `synthesis` and `commits`",
        )
        .with_field("lane")
        .into()),
    }
}
/// The answer to a failed DLQ operation: never its internal error text.
fn failure(e: DlqError) -> crate::problem::Problem {
    use crate::problem::Problem;
    use axum::http::StatusCode;
    warn!(error = %e, "DLQ operation failed");
    match e {
        DlqError::NoDlq(_) => {
            Problem::new(StatusCode::NOT_FOUND, "no-dlq", "No DLQ", "this lane has no dead-letter queue")
        }
        DlqError::NotMovable(why) => {
            Problem::new(StatusCode::CONFLICT, "not-movable", "Not redriven by move task", why)
        }
        _ => Problem::unavailable("the queue or the store is unavailable; retry later", 2),
    }
}

/// The header a redrive must carry ([`admin_router`]).
pub const ADMIN_HEADER: &str = "x-lanes-admin";

/// `GET /admin/dlq/{lane}` (list), `POST /admin/dlq/{lane}/redrive[?by=move]` and
/// `GET /admin/dlq/{lane}/moves`, for `lanes dlq --server`. A redrive reruns tasks (and spends on
/// the provider), so it must carry [`ADMIN_HEADER`]: a web page the developer visits can post a
/// form to a loopback address, but cannot add a header of its own without a CORS preflight, which
/// this server never grants.
pub fn admin_router(admin: Admin) -> axum::Router {
    use crate::problem::Problem;
    use axum::extract::{Path, Query, State};
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    type Shared = std::sync::Arc<Admin>;
    #[derive(serde::Deserialize)]
    struct RedriveQuery {
        by: Option<String>,
    }

    async fn answer(a: Shared, lane: String, op: DlqOp) -> axum::response::Response {
        let lane = match dlq_lane(&lane) {
            Ok(l) => l,
            Err(problem) => return problem.into_response(),
        };
        match a.answer(lane, op).await {
            Ok(body) => axum::Json(body).into_response(),
            Err(e) => failure(e).into_response(),
        }
    }
    axum::Router::new()
        .route(
            "/admin/dlq/{lane}",
            get(|State(a): State<Shared>, Path(l): Path<String>| answer(a, l, DlqOp::List)),
        )
        .route(
            "/admin/dlq/{lane}/redrive",
            post(
                |State(a): State<Shared>,
                 Path(l): Path<String>,
                 Query(q): Query<RedriveQuery>,
                 headers: axum::http::HeaderMap| async move {
                    if !headers.contains_key(ADMIN_HEADER) {
                        return Problem::new(
                            StatusCode::FORBIDDEN,
                            "admin-header-required",
                            "Admin header required",
                            "a redrive must carry the X-Lanes-Admin header (as `lanes dlq --server` sends it)",
                        )
                        .with_field("X-Lanes-Admin")
                        .into_response();
                    }
                    let op = match q.by.as_deref() {
                        None | Some("relay") => DlqOp::Redrive,
                        Some("move") => DlqOp::RedriveByMove,
                        Some(_) => {
                            return Problem::new(
                                StatusCode::BAD_REQUEST,
                                "invalid-query",
                                "Invalid query",
                                "`by` is `relay` (the default) or `move`",
                            )
                            .with_field("by")
                            .into_response();
                        }
                    };
                    answer(a, l, op).await
                },
            ),
        )
        .route(
            "/admin/dlq/{lane}/moves",
            get(|State(a): State<Shared>, Path(l): Path<String>| answer(a, l, DlqOp::Moves)),
        )
        .with_state(std::sync::Arc::new(admin))
}
