//! The concurrency controller (design §2): every minute it reads each lane's queue depth, applies the
//! weighted pool policy ([`crate::pool::allocate`]) to the stack's concurrency budget, and sets each
//! lane's event-source-mapping `ScalingConfig.MaximumConcurrency` (at least 2, Lambda's minimum) only
//! when it changes. The mapping is a port ([`MappingControl`]) with a Lambda adapter
//! ([`crate::adapters::lambda`]) and an in-memory twin.

use crate::domain::Lane;
use crate::pool::{DEFAULT_SHARES, allocate};
use crate::ports::{QueueConsume, QueueDepth, RetryIntent};
use async_trait::async_trait;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Lambda's lower bound for `MaximumConcurrency` on an SQS event source.
pub const MIN_CONCURRENCY: u32 = 2;
/// Lambda's upper bound.
pub const MAX_CONCURRENCY: u32 = 1000;

/// Errors of the mapping port.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Throttled or unreachable: the next tick tries again.
    #[error("event source mapping service unavailable: {0}")]
    Unavailable(String),
    /// The mapping does not exist or the call is not allowed: fix the configuration.
    #[error("event source mapping call refused: {0}")]
    Refused(String),
}

impl RetryIntent for ControlError {
    fn is_retryable(&self) -> bool {
        matches!(self, ControlError::Unavailable(_))
    }
}

/// An event source mapping's concurrency (Lambda `Get`/`UpdateEventSourceMapping`).
#[async_trait]
pub trait MappingControl: Send + Sync {
    /// The mapping's current `ScalingConfig.MaximumConcurrency` (`None` when unset).
    async fn max_concurrency(&self, mapping: &str) -> Result<Option<u32>, ControlError>;
    /// Sets it.
    async fn set_max_concurrency(&self, mapping: &str, value: u32) -> Result<(), ControlError>;
}

/// In-memory mappings, for tests and local runs.
#[derive(Debug, Default, Clone)]
pub struct MemoryMappings {
    values: Arc<Mutex<HashMap<String, Option<u32>>>>,
    updates: Arc<Mutex<u64>>,
}

impl MemoryMappings {
    /// Mappings with the given current values.
    pub fn new(initial: &[(&str, Option<u32>)]) -> Self {
        let values = initial.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        Self { values: Arc::new(Mutex::new(values)), updates: Arc::default() }
    }

    /// Updates made so far.
    pub fn updates(&self) -> u64 {
        self.updates.lock().map(|u| *u).unwrap_or(0)
    }
}

#[async_trait]
impl MappingControl for MemoryMappings {
    async fn max_concurrency(&self, mapping: &str) -> Result<Option<u32>, ControlError> {
        let values = self.values.lock().map_err(|e| ControlError::Unavailable(e.to_string()))?;
        values.get(mapping).copied().ok_or_else(|| ControlError::Refused(format!("no mapping {mapping}")))
    }

    async fn set_max_concurrency(&self, mapping: &str, value: u32) -> Result<(), ControlError> {
        let mut values = self.values.lock().map_err(|e| ControlError::Unavailable(e.to_string()))?;
        let slot =
            values.get_mut(mapping).ok_or_else(|| ControlError::Refused(format!("no mapping {mapping}")))?;
        *slot = Some(value);
        if let Ok(mut u) = self.updates.lock() {
            *u += 1;
        }
        Ok(())
    }
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
    /// raised to Lambda's minimum of 2 and capped at its maximum.
    pub fn targets(&self, depths: &[QueueDepth; 3]) -> [u32; 3] {
        let running = depths.map(|d| d.in_flight as usize);
        let backlog = depths.map(|d| d.visible as usize);
        allocate(self.budget, self.shares, running, backlog)
            .map(|n| (n as u32).clamp(MIN_CONCURRENCY, MAX_CONCURRENCY))
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
        assert_eq!(d.iter().map(|d| d.target).collect::<Vec<_>>(), [2, 20, 10], "{d:?}");
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
    }
}
