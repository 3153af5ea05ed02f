//! The concurrency controller (see docs/ARCHITECTURE.md, Lanes): every minute it reads each lane's
//! queue depth, applies the weighted pool policy ([`crate::pool::allocate`]) to the stack's concurrency budget, and sets each
//! lane's event-source-mapping `ScalingConfig.MaximumConcurrency` (at least 2, Lambda's minimum) only
//! when it changes. The mapping is a port ([`MappingControl`]) with a Lambda adapter
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
    /// Messages in flight (an upper bound of the running workers).
    pub in_flight: u64,
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
}

impl Controller {
    /// A controller with the default reservations.
    pub fn new(
        queues: [Arc<dyn QueueConsume>; 3],
        mappings: [String; 3],
        control: Arc<dyn MappingControl>,
        budget: usize,
    ) -> Self {
        Self { queues, mappings, control, budget, shares: DEFAULT_SHARES }
    }

    /// The targets for given depths: the pool policy over the budget, in flight counted as running,
    /// raised to Lambda's minimum of 2 and capped at its maximum. Raising a lane to the minimum never
    /// takes the sum past the budget: the largest targets give the difference back.
    pub fn targets(&self, depths: &[QueueDepth; 3]) -> [u32; 3] {
        let running = depths.map(|d| d.in_flight as usize);
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
        let targets = self.targets(&depths);
        let mut out = Vec::with_capacity(3);
        for lane in Lane::ALL {
            let i = lane.index();
            let mut d = LaneDecision {
                lane: lane.as_str(),
                backlog: depths[i].visible,
                in_flight: depths[i].in_flight,
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
}
