//! The embedded twin of a provider's batch endpoint ([`crate::ports::BatchApi`]): batches kept in
//! this process, each run once by the local model (the offline provider) `turnaround` after its
//! submission, on a task of its own (as a provider runs a batch whoever polls it), its requests
//! answered at the batch tier. So `lanes dev` and `lanes summarize --tier batch` run the batch path
//! with no key. A batch this process does not know (made before a restart) reads as expired with
//! no answers: its commits go on at the next tier, as a provider's expired batch's would.

use crate::domain::tier::Tier;
use crate::ports::{
    BatchAnswer, BatchApi, BatchEnd, BatchStatus, BatchSubmission, LlmClient, LlmError, LlmRequest,
    SubmitError,
};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Held {
    key: String,
    cancelled: bool,
    /// Its model is answering it: a cancel then finds it cancelling, and its answers stand.
    running: bool,
    /// Its answers, once it ran.
    answers: Option<Vec<BatchAnswer>>,
}

type Batches = Arc<Mutex<HashMap<String, Held>>>;

/// Batches answered by a local model.
pub struct OfflineBatches {
    model: Arc<dyn LlmClient>,
    turnaround: Duration,
    route: String,
    held: Batches,
}

impl OfflineBatches {
    /// Batches answered by `model` `turnaround` after submission, as the route `route`.
    pub fn new(model: Arc<dyn LlmClient>, turnaround: Duration, route: String) -> Self {
        Self { model, turnaround, route, held: Default::default() }
    }
}

fn lock(held: &Batches) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
    held.lock().unwrap_or_else(|e| e.into_inner())
}

#[async_trait]
impl BatchApi for OfflineBatches {
    fn route(&self) -> &str {
        &self.route
    }

    async fn find(&self, key: &str, _since_ms: u64, _requests: usize) -> Result<Option<String>, LlmError> {
        Ok(lock(&self.held).iter().find(|(_, h)| h.key == key).map(|(id, _)| id.clone()))
    }

    async fn submit(&self, batch: &BatchSubmission) -> Result<String, SubmitError> {
        let id = {
            let mut held = lock(&self.held);
            let id = format!("batch_offline_{}_{}", held.len() + 1, batch.key);
            held.insert(
                id.clone(),
                Held { key: batch.key.clone(), cancelled: false, running: false, answers: None },
            );
            id
        };
        let (model, held, route, turnaround) =
            (self.model.clone(), self.held.clone(), self.route.clone(), self.turnaround);
        let (calls, run) = (batch.calls.clone(), id.clone());
        tokio::spawn(async move {
            tokio::time::sleep(turnaround).await;
            match lock(&held).get_mut(&run) {
                Some(h) if !h.cancelled => h.running = true,
                _ => return,
            }
            let mut answers = Vec::with_capacity(calls.len());
            for (custom_id, request) in calls {
                let asked = LlmRequest { tier: Tier::Batch, ..request };
                let outcome = match model.complete(&asked).await {
                    Ok(a) => Ok(crate::ports::LlmResponse { tier: Tier::Batch, route: route.clone(), ..a }),
                    Err(e) => Err(e.to_string()),
                };
                answers.push(BatchAnswer { custom_id, outcome });
            }
            if let Some(h) = lock(&held).get_mut(&run) {
                (h.answers, h.running) = (Some(answers), false);
            }
        });
        Ok(id)
    }

    async fn status(&self, id: &str) -> Result<BatchStatus, LlmError> {
        let held = lock(&self.held);
        Ok(match held.get(id) {
            None => BatchStatus::Ended(BatchEnd::Expired, Vec::new()),
            Some(Held { answers: Some(a), .. }) => BatchStatus::Ended(BatchEnd::Completed, a.clone()),
            Some(Held { running: true, cancelled: true, .. }) => BatchStatus::Running("cancelling".into()),
            Some(Held { cancelled: true, .. }) => BatchStatus::Ended(BatchEnd::Cancelled, Vec::new()),
            Some(_) => BatchStatus::Running("in_progress".into()),
        })
    }

    async fn cancel(&self, id: &str) -> Result<(), LlmError> {
        if let Some(h) = lock(&self.held).get_mut(id) {
            h.cancelled |= h.answers.is_none();
        }
        Ok(())
    }
}
