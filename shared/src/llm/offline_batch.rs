//! The embedded twin of a provider's batch endpoint ([`crate::ports::BatchApi`]): batches kept in
//! this process, each ended `turnaround` after submission (on the injected clock), its requests
//! answered then by the local model (the offline provider) at the batch tier. So `lanes dev` and
//! `lanes summarize --tier batch` run the batch path with no key. A batch this process does not
//! know (made before a restart) reads as expired with no answers: its commits go on at the next
//! tier, as a provider's expired batch's would.

use crate::clock::SharedClock;
use crate::domain::tier::Tier;
use crate::ports::{
    BatchAnswer, BatchApi, BatchEnd, BatchStatus, BatchSubmission, LlmClient, LlmError, LlmRequest,
};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Held {
    key: String,
    submitted_ms: u64,
    calls: Vec<(String, LlmRequest)>,
    cancelled: bool,
}

/// Batches answered by a local model.
pub struct OfflineBatches {
    model: Arc<dyn LlmClient>,
    clock: SharedClock,
    turnaround: Duration,
    route: String,
    held: Mutex<HashMap<String, Held>>,
}

impl OfflineBatches {
    /// Batches answered by `model` `turnaround` after submission, as the route `route`.
    pub fn new(model: Arc<dyn LlmClient>, clock: SharedClock, turnaround: Duration, route: String) -> Self {
        Self { model, clock, turnaround, route, held: Mutex::new(HashMap::new()) }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl BatchApi for OfflineBatches {
    fn route(&self) -> &str {
        &self.route
    }

    async fn find(&self, key: &str) -> Result<Option<String>, LlmError> {
        Ok(self.held().iter().find(|(_, h)| h.key == key).map(|(id, _)| id.clone()))
    }

    async fn submit(&self, batch: &BatchSubmission) -> Result<String, LlmError> {
        let mut held = self.held();
        let id = format!("batch_offline_{}_{}", held.len() + 1, batch.key);
        let h = Held {
            key: batch.key.clone(),
            submitted_ms: self.clock.now_ms(),
            calls: batch.calls.clone(),
            cancelled: false,
        };
        held.insert(id.clone(), h);
        Ok(id)
    }

    async fn status(&self, id: &str) -> Result<BatchStatus, LlmError> {
        let now = self.clock.now_ms();
        let calls = {
            let held = self.held();
            let Some(h) = held.get(id) else { return Ok(BatchStatus::Ended(BatchEnd::Expired, Vec::new())) };
            if h.cancelled {
                return Ok(BatchStatus::Ended(BatchEnd::Cancelled, Vec::new()));
            }
            if now < h.submitted_ms + self.turnaround.as_millis() as u64 {
                return Ok(BatchStatus::Running("in_progress".into()));
            }
            h.calls.clone()
        };
        let mut answers = Vec::with_capacity(calls.len());
        for (custom_id, request) in calls {
            let asked = LlmRequest { tier: Tier::Batch, ..request };
            let outcome = match self.model.complete(&asked).await {
                Ok(a) => Ok(crate::ports::LlmResponse { tier: Tier::Batch, route: self.route.clone(), ..a }),
                Err(e) => Err(e.to_string()),
            };
            answers.push(BatchAnswer { custom_id, outcome });
        }
        Ok(BatchStatus::Ended(BatchEnd::Completed, answers))
    }

    async fn cancel(&self, id: &str) -> Result<(), LlmError> {
        if let Some(h) = self.held().get_mut(id) {
            h.cancelled = true;
        }
        Ok(())
    }
}
