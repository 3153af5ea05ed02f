//! The concurrency controller (see docs/ARCHITECTURE.md, Lanes): every minute it reads each lane's
//! queue depth and running work ([`crate::running`]: invocations the workers registered; the queue's
//! in-flight count when that cannot be read), applies the weighted pool policy
//! ([`crate::pool::allocate`]) to the stack's concurrency budget, and sets each lane's
//! event-source-mapping `ScalingConfig.MaximumConcurrency` (at least 2, Lambda's minimum) only when
//! it changes. The mapping is a port ([`MappingControl`]) with a Lambda adapter
//! (`adapters::lambda`) and an in-memory twin ([`crate::embedded::MemoryMappings`]).

use crate::domain::Lane;
use crate::pool::{DEFAULT_SHARES, allocate};
use crate::ports::{MappingControl, QueueConsume, QueueDepth};
use serde::Serialize;
use std::sync::Arc;

/// Lambda's lower bound for `MaximumConcurrency` on an SQS event source.
pub const MIN_CONCURRENCY: u32 = 2;
/// Lambda's upper bound.
pub const MAX_CONCURRENCY: u32 = 1000;

/// Checks a concurrency budget: every mapping needs Lambda's minimum of 2.
pub fn validate_budget(budget: usize) -> Result<(), crate::config::ConfigError> {
    let least = (MIN_CONCURRENCY as usize) * Lane::ALL.len();
    if budget < least {
        return Err(crate::config::ConfigError::Invalid {
            name: "LANES_CONCURRENCY_BUDGET",
            reason: format!(
                "{budget} is below {least}: each of the {} lanes' mappings needs Lambda's minimum of {MIN_CONCURRENCY}",
                Lane::ALL.len()
            ),
        });
    }
    Ok(())
}

/// What one tick decided for one lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaneDecision {
    /// The lane.
    pub lane: &'static str,
    /// Visible messages.
    pub backlog: u64,
    /// Messages in flight.
    pub in_flight: u64,
    /// Running invocations, as the workers registered them (`None`: unreadable, in-flight used).
    pub running: Option<u64>,
    /// `MaximumConcurrency` before.
    pub current: Option<u32>,
    /// `MaximumConcurrency` wanted.
    pub target: u32,
    /// Whether an update was sent.
    pub changed: bool,
    /// Why the lane was skipped, when it was (depth unreadable, mapping call failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The controller, built once per container.
pub struct Controller {
    /// Depth per lane ([`Lane::index`]).
    pub queues: [Arc<dyn QueueConsume>; 3],
    /// Mapping id (UUID) per lane.
    pub mappings: [String; 3],
    /// The mappings.
    pub control: Arc<dyn MappingControl>,
    /// Concurrent workers shared by the lanes.
    pub budget: usize,
    /// Reservations (interactive, synthesis, commits).
    pub shares: [f64; 3],
    /// The workers' registry of running invocations, when the stack has a cache.
    pub running: Option<crate::running::RunningWork>,
}

impl Controller {
    /// A controller with the default reservations.
    pub fn new(
        queues: [Arc<dyn QueueConsume>; 3],
        mappings: [String; 3],
        control: Arc<dyn MappingControl>,
        budget: usize,
    ) -> Self {
        Self { queues, mappings, control, budget, shares: DEFAULT_SHARES, running: None }
    }

    /// With the workers' registry of running invocations.
    pub fn with_running(mut self, running: crate::running::RunningWork) -> Self {
        self.running = Some(running);
        self
    }

    /// The targets for given depths and running invocations: the pool policy over the budget, raised
    /// to Lambda's minimum of 2 and capped at its maximum. Raising a lane to the minimum never takes
    /// the sum past the budget: the largest targets give the difference back.
    pub fn targets(&self, depths: &[QueueDepth; 3], running: [u64; 3]) -> [u32; 3] {
        let running = running.map(|n| n as usize);
        let backlog = depths.map(|d| d.visible as usize);
        let mut targets = allocate(self.budget, self.shares, running, backlog)
            .map(|n| (n as u32).clamp(MIN_CONCURRENCY, MAX_CONCURRENCY));
        let budget = (self.budget as u32).max(MIN_CONCURRENCY * 3);
        while targets.iter().sum::<u32>() > budget {
            let Some(largest) = (0..3).filter(|&i| targets[i] > MIN_CONCURRENCY).max_by_key(|&i| targets[i])
            else {
                break;
            };
            targets[largest] -= 1;
        }
        targets
    }

    /// One tick: read depths, compute targets, update the mappings that differ. A lane whose depth
    /// cannot be read keeps its setting; one failing lane does not stop the others.
    pub async fn tick(&self) -> Vec<LaneDecision> {
        let mut depths = [QueueDepth::default(); 3];
        let mut unreadable: [Option<String>; 3] = Default::default();
        for lane in Lane::ALL {
            match self.queues[lane.index()].depth().await {
                Ok(d) => depths[lane.index()] = d,
                Err(e) => unreadable[lane.index()] = Some(format!("depth: {e}")),
            }
        }
        let mut registered = [None; 3];
        if let Some(running) = &self.running {
            for lane in Lane::ALL {
                match running.count(lane).await {
                    Ok(n) => registered[lane.index()] = Some(n),
                    Err(e) => {
                        tracing::warn!(lane = %lane, error = %e, "running work unreadable; in-flight used")
                    }
                }
            }
        }
        let running = [0, 1, 2].map(|i| registered[i].unwrap_or(depths[i].in_flight));
        let targets = self.targets(&depths, running);
        let mut out = Vec::with_capacity(3);
        for lane in Lane::ALL {
            let i = lane.index();
            let mut d = LaneDecision {
                lane: lane.as_str(),
                backlog: depths[i].visible,
                in_flight: depths[i].in_flight,
                running: registered[i],
                current: None,
                target: targets[i],
                changed: false,
                error: unreadable[i].take(),
            };
            if d.error.is_none() {
                match self.control.max_concurrency(&self.mappings[i]).await {
                    Ok(current) => {
                        d.current = current;
                        if current != Some(d.target) {
                            match self.control.set_max_concurrency(&self.mappings[i], d.target).await {
                                Ok(()) => d.changed = true,
                                Err(e) => d.error = Some(e.to_string()),
                            }
                        }
                    }
                    Err(e) => d.error = Some(e.to_string()),
                }
            }
            out.push(d);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{SharedClock, SystemClock};
    use crate::embedded::MemoryMappings;
    use crate::embedded::{EmbeddedDb, EmbeddedQueues};
    use crate::ports::QueueSend;

    #[tokio::test]
    async fn targets_follow_the_backlog_and_updates_only_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let clock: SharedClock = Arc::new(SystemClock);
        let queues = EmbeddedQueues::open(EmbeddedDb::open(dir.path()).unwrap(), clock, Default::default())
            .await
            .unwrap();
        let qs = Lane::ALL.map(|l| queues.queue(l.as_str(), &format!("{}-dlq", l.as_str())));
        let control = MemoryMappings::new(&[("i", Some(20)), ("s", Some(6)), ("c", None)]);
        let controller = Controller::new(
            qs.clone().map(|q| Arc::new(q) as Arc<dyn QueueConsume>),
            ["i".into(), "s".into(), "c".into()],
            Arc::new(control.clone()),
            30,
        );
        // Idle: every lane at the minimum.
        let d = controller.tick().await;
        assert_eq!(d.iter().map(|d| d.target).collect::<Vec<_>>(), [2, 2, 2]);
        assert_eq!(control.updates(), 3);
        assert_eq!(controller.tick().await.iter().filter(|d| d.changed).count(), 0, "no change, no update");

        // Both background lanes busy, interactive idle: they borrow its share.
        for i in 0..40 {
            qs[1].send(&format!("s{i}"), Default::default()).await.unwrap();
            qs[2].send(&format!("c{i}"), Default::default()).await.unwrap();
        }
        let d = controller.tick().await;
        assert_eq!(d.iter().map(|d| d.target).collect::<Vec<_>>(), [2, 18, 10], "{d:?}");
        assert!(d.iter().map(|d| d.target).sum::<u32>() <= 30, "never past the budget");
        assert!(!d[0].changed);

        // Interactive arrives: it gets its 70% back as the others' demand allows.
        for i in 0..40 {
            qs[0].send(&format!("i{i}"), Default::default()).await.unwrap();
        }
        let d = controller.tick().await;
        assert_eq!(d.iter().map(|d| d.target).collect::<Vec<_>>(), [21, 6, 3], "{d:?}");
        assert!(d.iter().all(|d| d.error.is_none()));

        // A missing mapping is reported, the other lanes still updated.
        let broken = Controller::new(
            qs.map(|q| Arc::new(q) as Arc<dyn QueueConsume>),
            ["i".into(), "nope".into(), "c".into()],
            Arc::new(control.clone()),
            10,
        );
        let d = broken.tick().await;
        assert!(d[1].error.as_deref().unwrap().contains("no mapping"));
        assert!(d[0].changed && d[2].changed);
        assert!(validate_budget(5).unwrap_err().to_string().contains("LANES_CONCURRENCY_BUDGET"));
        assert!(validate_budget(6).is_ok());
    }

    /// A commits invocation holding 100 messages is one running worker, not 100: counted from the
    /// workers' registry, the interactive lane gets its share; counted from in-flight, it would not.
    /// With the registry unreadable the controller falls back to in-flight.
    #[tokio::test]
    async fn running_work_comes_from_the_workers_registry() {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::clock::ManualClock::new(1_000_000);
        let queues =
            EmbeddedQueues::open(EmbeddedDb::open(dir.path()).unwrap(), clock.clone(), Default::default())
                .await
                .unwrap();
        let qs = Lane::ALL.map(|l| queues.queue(l.as_str(), &format!("{}-dlq", l.as_str())));
        for i in 0..100 {
            qs[2].send(&format!("c{i}"), Default::default()).await.unwrap();
        }
        for i in 0..40 {
            qs[0].send(&format!("i{i}"), Default::default()).await.unwrap();
        }
        assert_eq!(qs[2].receive(100).await.unwrap().len(), 100, "one commits batch in flight");
        let control = MemoryMappings::new(&[("i", None), ("s", None), ("c", None)]);
        let build = || {
            Controller::new(
                qs.clone().map(|q| Arc::new(q) as Arc<dyn QueueConsume>),
                ["i".into(), "s".into(), "c".into()],
                Arc::new(control.clone()),
                30,
            )
        };
        let by_in_flight = build().tick().await;
        let cache = Arc::new(crate::embedded::MemoryCache::new(clock.clone()));
        let running = crate::running::RunningWork::new(cache, clock.clone());
        let entry = running.enter(Lane::Commits, 1_000_000 + 60_000).await.unwrap();
        let by_workers = build().with_running(running.clone()).tick().await;
        let targets = |d: &[LaneDecision]| d.iter().map(|d| d.target).collect::<Vec<_>>();
        eprintln!(
            "targets (interactive, synthesis, commits) with 40 interactive queued and one commits batch of 100 in flight: \
             counting in-flight {:?}, counting the workers' registry {:?}",
            targets(&by_in_flight),
            targets(&by_workers)
        );
        assert_eq!(by_workers[2].running, Some(1));
        assert_eq!(by_in_flight[2].running, None);
        assert!(by_in_flight[0].target < 21, "in-flight starves interactive: {:?}", targets(&by_in_flight));
        assert!(by_workers[0].target >= 21, "its 70% of 30: {:?}", targets(&by_workers));
        assert!(targets(&by_workers).iter().sum::<u32>() <= 30);
        running.leave(entry).await;
        assert_eq!(build().with_running(running).tick().await[2].running, Some(0));
    }
}
